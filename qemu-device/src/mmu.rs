//! Device-MMU translation and VA-level memory access for one context.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use rbln_hw::mmu::{self, PteError, Target};
use rbln_hw::ring::{Access, FaultCode};
use rbln_hw::PAGE_SIZE;

use crate::memory::{Dram, HostMemory};

/// A fault raised by a command: becomes the queue's error record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub code: FaultCode,
    pub access: Access,
    /// Faulting VA (translation faults) or packet/descriptor VA.
    pub addr: u64,
}

impl Fault {
    pub fn new(code: FaultCode, access: Access, addr: u64) -> Self {
        Self { code, access, addr }
    }
}

/// A context's TLB shoot-down state (register MMU_INVALIDATE).
///
/// Every page access holds `lock` shared while it translates and copies;
/// `invalidate` bumps the epoch (dropping cached walks) and then takes the
/// lock exclusively once, so when it returns no access that used an older
/// translation is still in flight. That is what lets a driver free page
/// tables and pages after unmapping them.
#[derive(Default)]
pub struct Invalidation {
    epoch: AtomicU64,
    lock: RwLock<()>,
}

impl Invalidation {
    pub fn invalidate(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        drop(self.lock.write().unwrap_or_else(|e| e.into_inner()));
    }
}

/// One context's view of memory, through its page table. Caches the
/// level-0 table of the last 2 MiB region it translated (commands walk VAs
/// sequentially, so this removes two of the three table reads) until the
/// context is invalidated.
pub struct AddressSpace<'a> {
    host: &'a HostMemory,
    dram: &'a Dram,
    root: u64,
    inval: &'a Invalidation,
    epoch: u64,
    cached_l0: Option<(u64, u64)>,
}

/// Where a translated page lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phys {
    Host(u64),
    Dram(u64),
}

impl<'a> AddressSpace<'a> {
    pub fn new(host: &'a HostMemory, dram: &'a Dram, root: u64, inval: &'a Invalidation) -> Self {
        Self { host, dram, root, inval, epoch: inval.epoch.load(Ordering::SeqCst), cached_l0: None }
    }

    fn read_pte(&self, table: u64, index: usize, va: u64, access: Access) -> Result<u64, Fault> {
        self.host
            .read_u64(table + index as u64 * 8)
            .map_err(|_| Fault::new(FaultCode::BusError, access, va))
    }

    fn pte_fault(e: PteError, access: Access, va: u64) -> Fault {
        let code = match e {
            PteError::NotValid => FaultCode::Unmapped,
            PteError::Reserved => FaultCode::BadPte,
        };
        Fault::new(code, access, va)
    }

    /// Translate the page holding `va` for `access`.
    fn translate(&mut self, va: u64, access: Access) -> Result<Phys, Fault> {
        if va >= mmu::VA_LIMIT {
            return Err(Fault::new(FaultCode::Unmapped, access, va));
        }
        let region = va >> 21;
        let l0 = match self.cached_l0 {
            Some((r, t)) if r == region => t,
            _ => {
                let e2 = self.read_pte(self.root, mmu::va_index(va, 2), va, access)?;
                let l1 = mmu::decode_table(e2).map_err(|e| Self::pte_fault(e, access, va))?;
                let e1 = self.read_pte(l1, mmu::va_index(va, 1), va, access)?;
                let l0 = mmu::decode_table(e1).map_err(|e| Self::pte_fault(e, access, va))?;
                self.cached_l0 = Some((region, l0));
                l0
            }
        };
        let e0 = self.read_pte(l0, mmu::va_index(va, 0), va, access)?;
        let leaf = mmu::decode_leaf(e0).map_err(|e| Self::pte_fault(e, access, va))?;
        let allowed = match access {
            Access::Read => leaf.read,
            Access::Write => leaf.write,
            Access::None => true,
        };
        if !allowed {
            return Err(Fault::new(FaultCode::Permission, access, va));
        }
        let addr = leaf.addr + (va & (PAGE_SIZE - 1));
        Ok(match leaf.target {
            Target::Host => Phys::Host(addr),
            Target::Dram => Phys::Dram(addr),
        })
    }

    /// Visit [va, va+len) page by page: f(phys, offset in range, chunk len).
    fn for_pages(
        &mut self,
        va: u64,
        len: u64,
        access: Access,
        mut f: impl FnMut(Phys, u64, u64) -> Result<(), ()>,
    ) -> Result<(), Fault> {
        if len == 0 {
            return Ok(()); // an empty range touches nothing, wherever it is
        }
        if va.checked_add(len).is_none_or(|end| end > mmu::VA_LIMIT) {
            return Err(Fault::new(FaultCode::Unmapped, access, va));
        }
        let mut done = 0u64;
        while done < len {
            let cur = va + done;
            let chunk = (PAGE_SIZE - (cur & (PAGE_SIZE - 1))).min(len - done);
            let _shared = self.inval.lock.read().unwrap_or_else(|e| e.into_inner());
            let epoch = self.inval.epoch.load(Ordering::SeqCst);
            if epoch != self.epoch {
                self.epoch = epoch;
                self.cached_l0 = None;
            }
            let phys = self.translate(cur, access)?;
            f(phys, done, chunk).map_err(|_| Fault::new(FaultCode::BusError, access, cur))?;
            done += chunk;
        }
        Ok(())
    }

    pub fn read(&mut self, va: u64, buf: &mut [u8]) -> Result<(), Fault> {
        let (host, dram) = (self.host, self.dram);
        self.for_pages(va, buf.len() as u64, Access::Read, |p, off, n| {
            let dst = &mut buf[off as usize..(off + n) as usize];
            match p {
                Phys::Host(a) => host.read(a, dst),
                Phys::Dram(a) => dram.read(a, dst),
            }
            .map_err(|_| ())
        })
    }

    pub fn write(&mut self, va: u64, buf: &[u8]) -> Result<(), Fault> {
        let (host, dram) = (self.host, self.dram);
        self.for_pages(va, buf.len() as u64, Access::Write, |p, off, n| {
            let src = &buf[off as usize..(off + n) as usize];
            match p {
                Phys::Host(a) => host.write(a, src),
                Phys::Dram(a) => dram.write(a, src),
            }
            .map_err(|_| ())
        })
    }

    pub fn fill(&mut self, va: u64, len: u64, pattern: u32) -> Result<(), Fault> {
        let (host, dram) = (self.host, self.dram);
        self.for_pages(va, len, Access::Write, |p, _, n| {
            match p {
                Phys::Host(a) => host.fill(a, n, pattern),
                Phys::Dram(a) => dram.fill(a, n, pattern),
            }
            .map_err(|_| ())
        })
    }

    /// Check that [va, va+len) translates for `access`, touching nothing.
    /// Commands check their whole destination first so that a faulting
    /// command writes nothing.
    pub fn check(&mut self, va: u64, len: u64, access: Access) -> Result<(), Fault> {
        self.for_pages(va, len, access, |_, _, _| Ok(()))
    }

    pub fn read_u64(&mut self, va: u64) -> Result<u64, Fault> {
        let mut b = [0u8; 8];
        self.read(va, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    pub fn write_u64(&mut self, va: u64, v: u64) -> Result<(), Fault> {
        self.write(va, &v.to_le_bytes())
    }

    /// Read `count` f32 values at `va`.
    pub fn read_f32s(&mut self, va: u64, count: usize) -> Result<Vec<f32>, Fault> {
        let bytes = self.read_vec(va, count.checked_mul(4).ok_or(Fault::new(FaultCode::BadDescriptor, Access::Read, va))?)?;
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    pub fn write_f32s(&mut self, va: u64, data: &[f32]) -> Result<(), Fault> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write(va, &bytes)
    }

    /// Read `len` bytes into a new vector. The range is translated before
    /// anything is allocated, so a hostile length cannot exhaust memory.
    pub fn read_vec(&mut self, va: u64, len: usize) -> Result<Vec<u8>, Fault> {
        self.check(va, len as u64, Access::Read)?;
        let mut v = vec![0u8; len];
        self.read(va, &mut v)?;
        Ok(v)
    }
}
