// SPDX-License-Identifier: GPL-2.0

//! Memory the device reaches: DMA-mapped host pages, device page tables,
//! and allocators for device DRAM and device virtual addresses.

use core::ptr::NonNull;

use kernel::{
    alloc::VVec,
    bindings,
    device::{Bound, Device},
    dma::DataDirection,
    mm::virt::VmaNew,
    page::BorrowedPage,
    prelude::*,
    scatterlist::{Owned, SGTable},
};

use crate::hw::{mmu, PAGE_SIZE};

/// Zeroed host memory (vmalloc'd, page aligned) DMA-mapped for the device
/// through a scatter-gather table. The mapping is device-managed: it is
/// torn down on unbind even if this object lives on in an open file.
pub(crate) struct HostMem {
    _sgt: Pin<KBox<SGTable<Owned<VVec<u8>>>>>,
    /// CPU address of the buffer: owned by `_sgt`, which never moves or
    /// frees it before it is dropped.
    cpu: NonNull<u8>,
    pages: usize,
    /// Bus address of each 4 KiB page.
    dma: KVec<u64>,
}

// SAFETY: `cpu` points into memory owned by `_sgt` (Send + Sync); all CPU
// accesses through it are bounds-checked copies.
unsafe impl Send for HostMem {}
// SAFETY: as above.
unsafe impl Sync for HostMem {}

impl HostMem {
    /// `pages` zeroed pages for `dev`, which must be bound (see
    /// `Npu::with_bound`).
    pub(crate) fn new(dev: &Device<Bound>, pages: usize) -> Result<Self> {
        let len = pages.checked_mul(PAGE_SIZE as usize).ok_or(EINVAL)?;
        let mut buf = VVec::<u8>::from_elem(0, len, GFP_KERNEL)?;
        let cpu = NonNull::new(buf.as_mut_ptr()).ok_or(ENOMEM)?;
        let sgt = KBox::pin_init(SGTable::new(dev, buf, DataDirection::Bidirectional, GFP_KERNEL), GFP_KERNEL)?;
        let mut dma = KVec::with_capacity(pages, GFP_KERNEL)?;
        for entry in sgt.iter() {
            let (addr, len) = (entry.dma_address(), entry.dma_len() as u64);
            let mut off = 0;
            while off < len && dma.len() < pages {
                dma.push(addr + off, GFP_KERNEL)?;
                off += PAGE_SIZE;
            }
        }
        if dma.len() != pages {
            return Err(EIO);
        }
        Ok(Self { _sgt: sgt, cpu, pages, dma })
    }

    /// Bus address of page `i`.
    pub(crate) fn dma(&self, i: usize) -> u64 {
        self.dma.get(i).copied().unwrap_or(0)
    }

    fn check(&self, off: usize, len: usize) -> Result {
        match off.checked_add(len) {
            Some(end) if end <= self.pages * PAGE_SIZE as usize => Ok(()),
            _ => Err(EINVAL),
        }
    }

    /// Copy `data` in at `off`. The device may be using other bytes of the
    /// buffer; callers only write bytes it is not using (ring slots outside
    /// head..tail, fence slots not yet submitted, PTEs of VAs not in use).
    pub(crate) fn write(&self, off: usize, data: &[u8]) -> Result {
        self.check(off, data.len())?;
        // SAFETY: in bounds (checked); `cpu` is valid while `_sgt` lives; no
        // access races with these bytes by the rule above.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), self.cpu.as_ptr().add(off), data.len()) };
        Ok(())
    }

    /// One naturally aligned 64-bit volatile load at `off` (a multiple of 8).
    pub(crate) fn read_u64(&self, off: usize) -> Result<u64> {
        if off % 8 != 0 {
            return Err(EINVAL);
        }
        self.check(off, 8)?;
        // SAFETY: in bounds and 8-byte aligned (the buffer is page aligned);
        // a single load is never torn against the device's aligned store.
        Ok(unsafe { self.cpu.as_ptr().add(off).cast::<u64>().read_volatile() })
    }

    /// Insert the buffer's pages into a user mapping of `len` bytes.
    pub(crate) fn mmap(&self, vma: &VmaNew, len: usize) -> Result {
        if len > self.pages * PAGE_SIZE as usize {
            return Err(EINVAL);
        }
        vma.set_dontexpand();
        let map = vma.set_mixedmap();
        for i in 0..len / PAGE_SIZE as usize {
            // SAFETY: the address is inside this vmalloc'd buffer (checked
            // above), which stays allocated while `self` lives.
            let page = unsafe { bindings::vmalloc_to_page(self.cpu.as_ptr().add(i * PAGE_SIZE as usize).cast()) };
            let page = NonNull::new(page).ok_or(EINVAL)?;
            // SAFETY: `page` is a valid page of this buffer for the duration
            // of the call (vm_insert_page takes its own reference).
            let page = unsafe { BorrowedPage::from_raw(page) };
            if let Err(e) = map.vm_insert_page(vma.start() + i * PAGE_SIZE as usize, &page) {
                // A page table could not be allocated: take back the pages
                // already inserted, so that the failed mmap leaves nothing.
                map.zap_vma_range(vma.start(), i * PAGE_SIZE as usize);
                return Err(e);
            }
        }
        Ok(())
    }
}

/// One page-table page (512 little-endian u64 entries).
struct Table(HostMem);

impl Table {
    fn new(dev: &Device<Bound>) -> Result<Self> {
        Ok(Self(HostMem::new(dev, 1)?))
    }

    /// Entries are written only while the device cannot be walking them
    /// (before the VA is handed out, or before MMU_INVALIDATE on unmap).
    fn set(&self, i: usize, v: u64) -> Result {
        self.0.write(i * 8, &v.to_le_bytes())
    }
}

/// A context's device page tables (three levels, see docs/hardware.md).
pub(crate) struct PageTables {
    root: Table,
    /// Level-1 tables by level-2 index; level-0 tables by (l2, l1) index.
    l1: KVec<(usize, Table)>,
    l0: KVec<(usize, usize, Table)>,
}

impl PageTables {
    pub(crate) fn new(dev: &Device<Bound>) -> Result<Self> {
        Ok(Self { root: Table::new(dev)?, l1: KVec::new(), l0: KVec::new() })
    }

    pub(crate) fn root(&self) -> u64 {
        self.root.0.dma(0)
    }

    /// Point the page at `va` to `pte` (a leaf entry, or 0 to unmap),
    /// creating and linking missing tables for a mapping.
    pub(crate) fn set(&mut self, dev: &Device<Bound>, va: u64, pte: u64) -> Result {
        let (i2, i1, i0) = (mmu::va_index(va, 2), mmu::va_index(va, 1), mmu::va_index(va, 0));
        if !self.l1.iter().any(|(i, _)| *i == i2) {
            if pte == 0 {
                return Ok(());
            }
            let t = Table::new(dev)?;
            self.l1.reserve(1, GFP_KERNEL)?;
            self.root.set(i2, mmu::table_pte(t.0.dma(0)))?;
            self.l1.push_within_capacity((i2, t)).map_err(|_| ENOMEM)?;
        }
        if !self.l0.iter().any(|(a, b, _)| *a == i2 && *b == i1) {
            if pte == 0 {
                return Ok(());
            }
            let t = Table::new(dev)?;
            self.l0.reserve(1, GFP_KERNEL)?;
            let l1 = self.l1.iter().find(|(i, _)| *i == i2).map(|(_, t)| t).ok_or(EINVAL)?;
            l1.set(i1, mmu::table_pte(t.0.dma(0)))?;
            self.l0.push_within_capacity((i2, i1, t)).map_err(|_| ENOMEM)?;
        }
        let l0 = self.l0.iter().find(|(a, b, _)| *a == i2 && *b == i1).map(|(_, _, t)| t).ok_or(EINVAL)?;
        l0.set(i0, pte)
    }
}

/// First-fit allocator over page-aligned ranges, with coalescing frees
/// (used for device DRAM and for each context's VA space).
pub(crate) struct RangeAllocator {
    /// Free ranges (start, len), sorted by start, never adjacent.
    free: KVec<(u64, u64)>,
}

impl RangeAllocator {
    pub(crate) fn new(start: u64, len: u64) -> Result<Self> {
        let mut free = KVec::new();
        free.push((start, len), GFP_KERNEL)?;
        Ok(Self { free })
    }

    /// Take `len` bytes (page multiple), best fit to limit fragmentation.
    pub(crate) fn alloc(&mut self, len: u64) -> Result<u64> {
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, (_, l))| *l >= len)
            .min_by_key(|(_, (_, l))| *l)
            .map(|(i, _)| i)
            .ok_or(ENOSPC)?;
        let (start, l) = self.free[best];
        if l == len {
            self.free.remove(best).map_err(|_| EINVAL)?;
        } else {
            self.free[best] = (start + len, l - len);
        }
        Ok(start)
    }

    /// Take exactly [start, start+len) if it is free.
    pub(crate) fn alloc_at(&mut self, start: u64, len: u64) -> Result {
        let end = start.checked_add(len).ok_or(EINVAL)?;
        let i = self.free.iter().position(|&(s, l)| s <= start && end <= s + l).ok_or(EBUSY)?;
        self.free.reserve(2, GFP_KERNEL)?;
        let (s, l) = self.free[i];
        self.free.remove(i).map_err(|_| EINVAL)?;
        if end < s + l {
            self.free.insert_within_capacity(i, (end, s + l - end)).map_err(|_| ENOMEM)?;
        }
        if s < start {
            self.free.insert_within_capacity(i, (s, start - s)).map_err(|_| ENOMEM)?;
        }
        Ok(())
    }

    /// Give [start, start+len) back, merging with its neighbours.
    pub(crate) fn free(&mut self, start: u64, len: u64) -> Result {
        let i = self.free.iter().position(|&(s, _)| s > start).unwrap_or(self.free.len());
        self.free.reserve(1, GFP_KERNEL)?;
        self.free.insert_within_capacity(i, (start, len)).map_err(|_| ENOMEM)?;
        // Merge with the next, then with the previous range.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1).map_err(|_| EINVAL)?;
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i).map_err(|_| EINVAL)?;
        }
        Ok(())
    }

    /// Bytes free.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free.iter().map(|&(_, l)| l).sum()
    }
}
