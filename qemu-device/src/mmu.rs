//! Device-MMU translation and VA-level memory access for one context.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use rbln_hw::mmu::{self, PteError, Target};
use rbln_hw::ring::{Access, FaultCode};
use rbln_hw::{PAGE_SHIFT, PAGE_SIZE};

use crate::memory::{BusError, Dram, HostMemory, Mapping};

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

/// One context's view of memory, through its page table, for one ring
/// entry (a command processor makes a new one per entry).
///
/// It caches what it translated, as a device's IOTLB does, until the
/// context is invalidated (MMU_INVALIDATE; checked under the shoot-down
/// lock before every access, see [`Invalidation`]): the level-0 table of
/// the last 2 MiB region walked and the leaf entries of recent pages
/// ([`Tlb`]). A model's ops touch the same few pages op after op, so most
/// translations read no page table at all. Only valid leaf entries are
/// cached: a page the driver maps later is seen without an invalidation.
/// It also keeps the guest-RAM region it last reached, until QEMU changes
/// the regions ([`HostMemory::generation`]).
pub struct AddressSpace<'a> {
    host: &'a HostMemory,
    dram: &'a Dram,
    root: u64,
    inval: &'a Invalidation,
    epoch: u64,
    cached_l0: Option<(u64, u64)>,
    tlb: Box<Tlb>,
    host_gen: u64,
    /// (first bus address, mapping) of the guest-RAM region last used.
    host_region: Option<(u64, Arc<Mapping>)>,
}

/// Leaf page-table entries of recently translated pages, direct-mapped by
/// virtual page number.
struct Tlb {
    /// (VPN, raw leaf entry); VPN `u64::MAX` is an empty slot (no VA has it).
    slots: [(u64, u64); TLB_SLOTS],
}

/// A power of two.
const TLB_SLOTS: usize = 512;

impl Tlb {
    fn new() -> Box<Self> {
        Box::new(Tlb { slots: [(u64::MAX, 0); TLB_SLOTS] })
    }

    /// The slot of `vpn`: Fibonacci hashing, since buffers start at
    /// aligned VAs whose low VPN bits are all alike.
    fn slot(vpn: u64) -> usize {
        (vpn.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - TLB_SLOTS.trailing_zeros())) as usize
    }

    fn get(&self, vpn: u64) -> Option<u64> {
        let (v, e) = self.slots[Self::slot(vpn)];
        (v == vpn).then_some(e)
    }

    fn insert(&mut self, vpn: u64, e0: u64) {
        if mmu::decode_leaf(e0).is_ok() {
            self.slots[Self::slot(vpn)] = (vpn, e0);
        }
    }

    fn clear(&mut self) {
        self.slots.fill((u64::MAX, 0));
    }
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
        Self {
            host,
            dram,
            root,
            inval,
            epoch: inval.epoch.load(Ordering::SeqCst),
            cached_l0: None,
            tlb: Tlb::new(),
            host_gen: host.generation(),
            host_region: None,
        }
    }

    /// Drop cached translations if the context was invalidated, and the
    /// kept guest-RAM region if QEMU changed the regions. Called with the
    /// shoot-down lock held shared, before translating.
    fn sync(&mut self) {
        let epoch = self.inval.epoch.load(Ordering::SeqCst);
        if epoch != self.epoch {
            self.epoch = epoch;
            self.cached_l0 = None;
            self.tlb.clear();
        }
        let generation = self.host.generation();
        if generation != self.host_gen {
            self.host_gen = generation;
            self.host_region = None;
        }
    }

    /// The level-0 table covering `va`.
    fn l0_table(&mut self, va: u64, access: Access) -> Result<u64, Fault> {
        let region = va >> 21;
        match self.cached_l0 {
            Some((r, t)) if r == region => Ok(t),
            _ => {
                let l0 = walk_to_l0(self.host, self.root, va, access)?;
                self.cached_l0 = Some((region, l0));
                Ok(l0)
            }
        }
    }

    /// Translate the page holding `va` for `access`.
    fn translate(&mut self, va: u64, access: Access) -> Result<Phys, Fault> {
        if va >= mmu::VA_LIMIT {
            return Err(Fault::new(FaultCode::Unmapped, access, va));
        }
        let vpn = va >> PAGE_SHIFT;
        let e0 = match self.tlb.get(vpn) {
            Some(e0) => e0,
            None => {
                let l0 = self.l0_table(va, access)?;
                let e0 = read_pte(self.host, l0, mmu::va_index(va, 0), va, access)?;
                self.tlb.insert(vpn, e0);
                e0
            }
        };
        leaf_phys(e0, va, access)
    }

    /// A pointer to [a, a+n) of guest RAM, from the kept region if it
    /// holds the range. A region it replaces goes to `keep` (pointers into
    /// it may still be in use), or is dropped without one.
    fn host_ptr(&mut self, a: u64, n: u64, keep: Option<&mut Vec<Arc<Mapping>>>) -> Result<*mut u8, BusError> {
        if let Some((base, map)) = &self.host_region {
            if a >= *base && a.checked_add(n).is_some_and(|end| end <= base + map.len()) {
                return map.ptr(a - base, n);
            }
        }
        let (base, map) = self.host.region(a, n)?;
        let ptr = map.ptr(a - base, n)?;
        if let (Some(old), Some(keep)) = (self.host_region.replace((base, map)), keep) {
            keep.push(old.1);
        }
        Ok(ptr)
    }

    /// Hold this context's translations still and resolve ranges for
    /// in-place access (see [`Pinned`]).
    pub fn pin(&mut self) -> Pinned<'_, 'a> {
        let guard = self.inval.lock.read().unwrap_or_else(|e| e.into_inner());
        self.sync();
        Pinned { space: RefCell::new(self), _guard: guard, keep: RefCell::new(Vec::new()) }
    }

    /// Visit [va, va+len) page by page: f(pointer, offset in range, chunk
    /// len); the pointer is valid during the call.
    fn for_pages(&mut self, va: u64, len: u64, access: Access, mut f: impl FnMut(*mut u8, u64, u64)) -> Result<(), Fault> {
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
            self.sync();
            let ptr = match self.translate(cur, access)? {
                Phys::Host(a) => self.host_ptr(a, chunk, None),
                Phys::Dram(a) => self.dram.ptr(a, chunk),
            }
            .map_err(|_| Fault::new(FaultCode::BusError, access, cur))?;
            f(ptr, done, chunk);
            done += chunk;
        }
        Ok(())
    }

    pub fn read(&mut self, va: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.for_pages(va, buf.len() as u64, Access::Read, |p, off, n| {
            let dst = &mut buf[off as usize..(off + n) as usize];
            // SAFETY: `p` points at `n` readable bytes of device-reachable
            // memory, mapped during this call; `dst` is a Rust buffer, so
            // the ranges do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) };
        })
    }

    pub fn write(&mut self, va: u64, buf: &[u8]) -> Result<(), Fault> {
        self.for_pages(va, buf.len() as u64, Access::Write, |p, off, n| {
            let src = &buf[off as usize..(off + n) as usize];
            // SAFETY: as in `read`, for `n` writable bytes.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
        })
    }

    /// Check that [va, va+len) translates for `access`, touching nothing.
    /// Commands check their whole destination first so that a faulting
    /// command writes nothing.
    pub fn check(&mut self, va: u64, len: u64, access: Access) -> Result<(), Fault> {
        self.for_pages(va, len, access, |_, _, _| {})
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
    space: RefCell<&'s mut AddressSpace<'a>>,
    _guard: RwLockReadGuard<'a, ()>,
    /// Guest-RAM regions the address space stopped keeping while this
    /// command may still use pointers into them.
    keep: RefCell<Vec<Arc<Mapping>>>,
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
        let mut space = self.space.borrow_mut();
        let space = &mut **space;
        // Physically contiguous runs (VA of start, where, length).
        let mut first: Option<(u64, Phys, u64)> = None;
        let mut rest: Vec<(u64, Phys, u64)> = Vec::new();
        let end = va + len;
        let mut add_page = |cur: u64, e0: u64| -> Result<u64, Fault> {
            let phys = leaf_phys(e0, cur, access)?;
            let chunk = (PAGE_SIZE - (cur & (PAGE_SIZE - 1))).min(end - cur);
            let last = if rest.is_empty() { first.as_mut() } else { rest.last_mut() };
            match last {
                Some((_, p, n)) if follows(*p, *n, phys) => *n += chunk,
                Some(_) => rest.push((cur, phys, chunk)),
                None => first = Some((cur, phys, chunk)),
            }
            Ok(chunk)
        };
        // Up to 64 entries per page-table read: zeroing a whole table's
        // worth (4 KiB) per call cost more than a small op's translation.
        let mut ptes = [0u8; 64 * 8];
        let mut cur = va;
        while cur < end {
            if let Some(e0) = space.tlb.get(cur >> PAGE_SHIFT) {
                cur += add_page(cur, e0)?;
                continue;
            }
            // A miss: this level-0 table's entries for the range, up to 64.
            let l0 = space.l0_table(cur, access)?;
            let region_end = (((cur >> 21) + 1) << 21).min(end);
            let (i0, i1) = (mmu::va_index(cur, 0), mmu::va_index(region_end - 1, 0));
            let raw = &mut ptes[..(i1 - i0 + 1).min(64) * 8];
            space.host.read(l0 + i0 as u64 * 8, raw).map_err(|_| Fault::new(FaultCode::BusError, access, cur))?;
            for e in raw.chunks_exact(8) {
                let e0 = u64::from_le_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]);
                space.tlb.insert(cur >> PAGE_SHIFT, e0);
                cur += add_page(cur, e0)?;
            }
        }
        let mut piece = |(at, phys, n): (u64, Phys, u64)| -> Result<Piece, Fault> {
            let bus = Fault::new(FaultCode::BusError, access, at);
            let ptr = match phys {
                Phys::Dram(a) => space.dram.ptr(a, n),
                Phys::Host(a) => space.host_ptr(a, n, Some(&mut self.keep.borrow_mut())),
            }
            .map_err(|_| bus)?;
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
