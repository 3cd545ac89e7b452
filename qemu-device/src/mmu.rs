//! Device-MMU translation and VA-level memory access for one context.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use rbln_hw::mmu::{self, PteError, Target};
use rbln_hw::ring::{Access, FaultCode};
use rbln_hw::PAGE_SIZE;

use crate::memory::{Dram, HostMemory, Mapping};

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

fn read_pte(host: &HostMemory, table: u64, index: usize, va: u64, access: Access) -> Result<u64, Fault> {
    host.read_u64(table + index as u64 * 8).map_err(|_| Fault::new(FaultCode::BusError, access, va))
}

fn pte_fault(e: PteError, access: Access, va: u64) -> Fault {
    let code = match e {
        PteError::NotValid => FaultCode::Unmapped,
        PteError::Reserved => FaultCode::BadPte,
    };
    Fault::new(code, access, va)
}

/// Walk the upper two levels: the level-0 table covering `va`'s 2 MiB region.
fn walk_to_l0(host: &HostMemory, root: u64, va: u64, access: Access) -> Result<u64, Fault> {
    let e2 = read_pte(host, root, mmu::va_index(va, 2), va, access)?;
    let l1 = mmu::decode_table(e2).map_err(|e| pte_fault(e, access, va))?;
    let e1 = read_pte(host, l1, mmu::va_index(va, 1), va, access)?;
    mmu::decode_table(e1).map_err(|e| pte_fault(e, access, va))
}

/// Decode a leaf entry for `access` and place `va` in its page.
fn leaf_phys(e0: u64, va: u64, access: Access) -> Result<Phys, Fault> {
    let leaf = mmu::decode_leaf(e0).map_err(|e| pte_fault(e, access, va))?;
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

impl<'a> AddressSpace<'a> {
    pub fn new(host: &'a HostMemory, dram: &'a Dram, root: u64, inval: &'a Invalidation) -> Self {
        Self { host, dram, root, inval, epoch: inval.epoch.load(Ordering::SeqCst), cached_l0: None }
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
                let l0 = walk_to_l0(self.host, self.root, va, access)?;
                self.cached_l0 = Some((region, l0));
                l0
            }
        };
        let e0 = read_pte(self.host, l0, mmu::va_index(va, 0), va, access)?;
        leaf_phys(e0, va, access)
    }

    /// Hold this context's translations still and resolve ranges for
    /// in-place access (see [`Pinned`]).
    pub fn pin(&mut self) -> Pinned<'_, 'a> {
        let guard = self.inval.lock.read().unwrap_or_else(|e| e.into_inner());
        Pinned {
            host: self.host,
            dram: self.dram,
            root: self.root,
            _guard: guard,
            keep: RefCell::new(Vec::new()),
            cached_l0: Cell::new(None),
            _space: PhantomData,
        }
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

    /// Read `len` bytes into a new vector. The range is translated before
    /// anything is allocated, so a hostile length cannot exhaust memory.
    pub fn read_vec(&mut self, va: u64, len: usize) -> Result<Vec<u8>, Fault> {
        self.check(va, len as u64, Access::Read)?;
        let mut v = vec![0u8; len];
        self.read(va, &mut v)?;
        Ok(v)
    }
}

/// One physically contiguous piece of a translated range.
#[derive(Clone, Copy, Debug)]
pub struct Piece {
    pub ptr: *mut u8,
    pub len: usize,
}

/// A VA range translated for one access: its physically contiguous
/// pieces in VA order. Ranges inside one buffer object in device DRAM are
/// one piece; host memory is as scattered as the guest's pages.
pub enum Span {
    One(Piece),
    Many(Vec<Piece>),
}

impl Span {
    pub fn pieces(&self) -> &[Piece] {
        match self {
            Span::One(p) => std::slice::from_ref(p),
            Span::Many(v) => v,
        }
    }

    /// The single piece, if the range is physically contiguous.
    pub fn contiguous(&self) -> Option<Piece> {
        match self {
            Span::One(p) => Some(*p),
            Span::Many(_) => None,
        }
    }
}

/// A context's memory held for in-place access by one command.
///
/// While it lives, the context's shoot-down lock is held shared, so an
/// MMU_INVALIDATE waits for the command to finish (as hardware drains
/// in-flight accesses) and the pages it resolved stay what they were;
/// host mappings it resolved are kept alive even if QEMU unmaps them.
/// It borrows the [`AddressSpace`] mutably, so nothing can take the lock
/// again (recursively) on this thread while it is held.
pub struct Pinned<'s, 'a> {
    host: &'a HostMemory,
    dram: &'a Dram,
    root: u64,
    _guard: RwLockReadGuard<'a, ()>,
    keep: RefCell<Vec<Arc<Mapping>>>,
    cached_l0: Cell<Option<(u64, u64)>>,
    _space: PhantomData<&'s mut AddressSpace<'a>>,
}

impl Pinned<'_, '_> {
    /// Translate and permission-check all of [va, va+len) for `access`,
    /// returning where it lives. Faults name the first bad page's VA.
    pub fn resolve(&self, va: u64, len: u64, access: Access) -> Result<Span, Fault> {
        if len == 0 {
            let ptr = std::ptr::NonNull::<u64>::dangling().as_ptr().cast();
            return Ok(Span::One(Piece { ptr, len: 0 }));
        }
        if va.checked_add(len).is_none_or(|end| end > mmu::VA_LIMIT) {
            return Err(Fault::new(FaultCode::Unmapped, access, va));
        }
        // Physically contiguous runs (VA of start, where, length).
        let mut first: Option<(u64, Phys, u64)> = None;
        let mut rest: Vec<(u64, Phys, u64)> = Vec::new();
        // Up to 64 entries per read: zeroing a whole table's worth (4 KiB)
        // per call cost more than a small op's translation.
        let mut ptes = [0u8; 64 * 8];
        let mut cur = va;
        let end = va + len;
        while cur < end {
            // One level-0 table at a time: its entries for this range are
            // read 64 at a time.
            let region = cur >> 21;
            let l0 = match self.cached_l0.get() {
                Some((r, t)) if r == region => t,
                _ => {
                    let t = walk_to_l0(self.host, self.root, cur, access)?;
                    self.cached_l0.set(Some((region, t)));
                    t
                }
            };
            let region_end = ((region + 1) << 21).min(end);
            let (i0, i1) = (mmu::va_index(cur, 0), mmu::va_index(region_end - 1, 0));
            let raw = &mut ptes[..(i1 - i0 + 1).min(64) * 8];
            self.host.read(l0 + i0 as u64 * 8, raw).map_err(|_| Fault::new(FaultCode::BusError, access, cur))?;
            for e in raw.chunks_exact(8) {
                let e0 = u64::from_le_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]);
                let phys = leaf_phys(e0, cur, access)?;
                let chunk = (PAGE_SIZE - (cur & (PAGE_SIZE - 1))).min(end - cur);
                let last = if rest.is_empty() { first.as_mut() } else { rest.last_mut() };
                match last {
                    Some((_, p, n)) if follows(*p, *n, phys) => *n += chunk,
                    Some(_) => rest.push((cur, phys, chunk)),
                    None => first = Some((cur, phys, chunk)),
                }
                cur += chunk;
            }
        }
        let piece = |(at, phys, n): (u64, Phys, u64)| -> Result<Piece, Fault> {
            let bus = Fault::new(FaultCode::BusError, access, at);
            let ptr = match phys {
                Phys::Dram(a) => self.dram.ptr(a, n).map_err(|_| bus)?,
                Phys::Host(a) => {
                    let (map, ptr) = self.host.pin(a, n).map_err(|_| bus)?;
                    self.keep.borrow_mut().push(map);
                    ptr
                }
            };
            Ok(Piece { ptr, len: n as usize })
        };
        let first = piece(first.ok_or(Fault::new(FaultCode::Unmapped, access, va))?)?;
        if rest.is_empty() {
            return Ok(Span::One(first));
        }
        let mut pieces = Vec::with_capacity(rest.len() + 1);
        pieces.push(first);
        for r in rest {
            pieces.push(piece(r)?);
        }
        Ok(Span::Many(pieces))
    }
}

/// Whether `next` continues a run of `len` bytes starting at `start`.
fn follows(start: Phys, len: u64, next: Phys) -> bool {
    match (start, next) {
        (Phys::Dram(a), Phys::Dram(b)) | (Phys::Host(a), Phys::Host(b)) => a.checked_add(len) == Some(b),
        _ => false,
    }
}
