// SPDX-License-Identifier: GPL-2.0

//! A context: one open file's device address space, buffer objects and
//! queues, and the ioctls that manage them.

use kernel::{
    new_mutex,
    prelude::*,
    sync::{
        atomic::{Acquire, Atomic, Relaxed, Release},
        Arc, Mutex,
    },
    time::{msecs_to_jiffies, Instant, Jiffies, Monotonic},
};

use crate::hw::{
    cmd::{self, Opcode},
    mmu::{self, Target},
    regs::{self, qctl},
    ring::{QueueState, QueueStatus, RingEntry, MAX_CMDBUF_SIZE},
    PAGE_SIZE,
};
use crate::mem::{HostMem, PageTables, RangeAllocator};
use crate::npu::Npu;
use crate::uapi;

/// Where a BO's memory lives.
enum Backing {
    Host(HostMem),
    Dram { offset: u64 },
}

struct Bo {
    size: u64,
    backing: Backing,
    /// Device VA mappings of this BO (it cannot be destroyed while mapped).
    maps: u32,
    first_va: u64,
}

struct VaMapping {
    va: u64,
    size: u64,
    handle: u32,
}

/// Longest a waiter sleeps between checks that the device still answers.
pub(crate) const LIVENESS_MS: u32 = 100;

/// The driver's own command page per queue: FENCE packets it appends to
/// kernel submissions, mapped read-only at `kva` in the context.
const FENCE_SLOTS: u32 = (PAGE_SIZE as u32) / cmd::Fence::SIZE as u32;
/// VA of queue slot `i`'s fence page: above every user VA.
fn kernel_va(i: usize) -> u64 {
    uapi::VA_USER_END + i as u64 * PAGE_SIZE
}

/// Ring entries per queue: one page of ring, which the device needs
/// physically contiguous.
const MAX_RING: u32 = (PAGE_SIZE as usize / RingEntry::SIZE) as u32;

/// What fence waiters need, shared so that they can sleep without holding
/// the context lock (the interrupt path takes `Npu::events` only).
struct QueueShared {
    status: HostMem,
    destroyed: Atomic<bool>,
    /// Ring entries: a head at or beyond is impossible.
    entries: u32,
    /// The last fence handed out on this queue (a status block showing a
    /// later one is corrupt); `u64::MAX` once user space submits by
    /// itself, choosing its own values.
    issued: Atomic<u64>,
    /// A corrupt status block was reported for this queue (once).
    warned: Atomic<bool>,
}

impl QueueShared {
    /// The status block's head and state (adjacent u32s: one aligned
    /// 64-bit load), if they are possible values.
    fn head_state(&self) -> Option<u32> {
        let v = self.status.read_u64(core::mem::offset_of!(QueueStatus, head)).ok()?;
        let (head, state) = (v as u32, (v >> 32) as u32);
        (head < self.entries && QueueState::from_u32(state).is_some()).then_some(head)
    }

    /// Fence value the device last wrote (one aligned 64-bit load: never
    /// torn against the device's write), unless the status block is
    /// corrupt (an impossible head or state, or a fence never handed out):
    /// then `None`, and the caller reads the register instead.
    fn fence(&self) -> Option<u64> {
        self.head_state()?;
        let fence = self.status.read_u64(core::mem::offset_of!(QueueStatus, fence)).ok()?;
        (fence <= self.issued.load(Acquire)).then_some(fence)
    }

    /// Ring index the device will consume next (`None`: corrupt block).
    fn head(&self) -> Option<u32> {
        self.head_state()
    }
}

struct Queue {
    hw: u32,
    entries: u32,
    ring: HostMem,
    shared: Arc<QueueShared>,
    fences: HostMem,
    kva: u64,
    tail: u32,
    next_fence: u64,
    /// User space mapped the ring or the doorbell: it submits by itself
    /// (user-mode submission), so SUBMIT refuses this queue (the two would
    /// fight over the tail).
    user_mode: bool,
}

impl Queue {
    fn write_entry(&self, slot: u32, e: &RingEntry) -> Result {
        self.ring.write(slot as usize * RingEntry::SIZE, &e.to_bytes())
    }
}

struct Inner {
    tables: PageTables,
    va: RangeAllocator,
    bos: KVec<Option<Bo>>,
    maps: KVec<VaMapping>,
    queues: KVec<Option<Queue>>,
    /// Hardware queues of destroyed user-mode queues. User space may still
    /// have their doorbell mapped (mappings outlive QUEUE_DESTROY), so they
    /// go back to the device's pool only when the file is released, which
    /// happens after every mapping of it is gone.
    retired: KVec<u32>,
    /// Command buffers submitted through SUBMIT (fdinfo).
    submits: u64,
    /// Q_BUSY_NS_64 of this context's queues already torn down (fdinfo).
    retired_busy_ns: u64,
}

/// What one context holds and has done, for its file's fdinfo.
pub(crate) struct Usage {
    pub(crate) host_bytes: u64,
    pub(crate) dram_bytes: u64,
    pub(crate) bos: usize,
    pub(crate) queues: usize,
    pub(crate) submits: u64,
    /// Device time the context's queues spent executing packets.
    pub(crate) busy_ns: u64,
}

/// One open file's context.
#[pin_data(PinnedDrop)]
pub(crate) struct Context {
    npu: Arc<Npu>,
    id: u32,
    #[pin]
    inner: Mutex<Inner>,
}

impl Context {
    pub(crate) fn new(npu: Arc<Npu>) -> Result<Pin<KBox<Self>>> {
        let id = npu.take_context()?;
        let made = (|| {
            let tables = npu.with_bound(PageTables::new)?;
            let va = RangeAllocator::new(uapi::VA_USER_START, uapi::VA_USER_END - uapi::VA_USER_START)?;
            let root = tables.root();
            npu.with_regs(|r| {
                r.w64(regs::ctx_reg(id, regs::CTX_PT_ROOT_64), root)?;
                r.w32(regs::ctx_reg(id, regs::CTX_CONTROL), regs::CTX_CONTROL_VALID)
            })?;
            let inner = Inner { tables, va, bos: KVec::new(), maps: KVec::new(), queues: KVec::new(), retired: KVec::new(), submits: 0, retired_busy_ns: 0 };
            let owner = npu.clone();
            KBox::pin_init(try_pin_init!(Context { npu: owner, id, inner <- new_mutex!(inner) }), GFP_KERNEL)
        })();
        if made.is_err() {
            npu.put_context(id);
        }
        made
    }

    /// The device context's number.
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// Memory, queues and submissions of this context.
    pub(crate) fn usage(&self) -> Usage {
        let inner = self.inner.lock();
        let mut u = Usage { host_bytes: 0, dram_bytes: 0, bos: 0, queues: 0, submits: inner.submits, busy_ns: inner.retired_busy_ns };
        for bo in inner.bos.iter().flatten() {
            match bo.backing {
                Backing::Host(_) => u.host_bytes += bo.size,
                Backing::Dram { .. } => u.dram_bytes += bo.size,
            }
            u.bos += 1;
        }
        u.queues = inner.queues.iter().flatten().count();
        for q in inner.queues.iter().flatten() {
            u.busy_ns += self.npu.queue_busy_ns(q.hw);
        }
        u
    }

    fn invalidate(&self) -> Result {
        self.npu.with_regs(|r| r.w32(regs::MMU_INVALIDATE, self.id))
    }

    pub(crate) fn bo_create(&self, a: &mut uapi::BoCreate) -> Result {
        if a.reserved != [0; 2] || a.handle != 0 {
            return Err(EINVAL);
        }
        if a.size == 0 || a.size > uapi::MAX_BO_SIZE {
            return Err(EINVAL);
        }
        if self.npu.is_gone() {
            return Err(ENODEV);
        }
        let size = a.size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let backing = match a.flags {
            uapi::BO_HOST => Backing::Host(self.npu.with_bound(|d| HostMem::new(d, (size / PAGE_SIZE) as usize))?),
            uapi::BO_DRAM => {
                let offset = self.npu.dram_alloc(size)?;
                // Zeroed by the device before anyone can see it.
                if let Err(e) = self.npu.zero_dram(offset, size) {
                    self.npu.dram_free(offset, size);
                    return Err(e);
                }
                Backing::Dram { offset }
            }
            _ => return Err(EINVAL),
        };
        let host_bytes = if let Backing::Host(_) = backing { size } else { 0 };
        let bo = Bo { size, backing, maps: 0, first_va: 0 };
        self.npu.account_bo(host_bytes, true);
        let mut inner = self.inner.lock();
        let slot = match inner.bos.iter().position(|b| b.is_none()) {
            Some(i) => {
                inner.bos[i] = Some(bo);
                i
            }
            None => {
                if let Err(e) = inner.bos.reserve(1, GFP_KERNEL) {
                    drop(inner);
                    self.free_bo(bo);
                    return Err(e.into());
                }
                inner.bos.push_within_capacity(Some(bo)).map_err(|_| ENOMEM)?;
                inner.bos.len() - 1
            }
        };
        a.handle = slot as u32 + 1;
        Ok(())
    }

    fn bo_index(inner: &Inner, handle: u32) -> Result<usize> {
        let i = (handle as usize).checked_sub(1).ok_or(ENOENT)?;
        match inner.bos.get(i) {
            Some(Some(_)) => Ok(i),
            _ => Err(ENOENT),
        }
    }

    pub(crate) fn bo_info(&self, a: &mut uapi::BoInfo) -> Result {
        if a.reserved != [0; 2] {
            return Err(EINVAL);
        }
        let inner = self.inner.lock();
        let i = Self::bo_index(&inner, a.handle)?;
        let bo = inner.bos[i].as_ref().ok_or(ENOENT)?;
        a.size = bo.size;
        a.flags = match bo.backing {
            Backing::Host(_) => uapi::BO_HOST,
            Backing::Dram { .. } => uapi::BO_DRAM,
        };
        a.mmap_offset = match bo.backing {
            Backing::Host(_) => uapi::mmap_offset(uapi::MMAP_KIND_BO, a.handle),
            Backing::Dram { .. } => 0,
        };
        a.device_va = bo.first_va;
        Ok(())
    }

    pub(crate) fn bo_destroy(&self, a: &uapi::BoDestroy) -> Result {
        if a.pad != 0 || a.reserved != [0; 1] {
            return Err(EINVAL);
        }
        let mut inner = self.inner.lock();
        let i = Self::bo_index(&inner, a.handle)?;
        if inner.bos[i].as_ref().is_some_and(|b| b.maps > 0) {
            return Err(EBUSY);
        }
        if let Some(bo) = inner.bos[i].take() {
            self.free_bo(bo);
        }
        Ok(())
    }

    fn free_bo(&self, bo: Bo) {
        match bo.backing {
            Backing::Dram { offset } => {
                self.npu.dram_free(offset, bo.size);
                self.npu.account_bo(0, false);
            }
            Backing::Host(_) => self.npu.account_bo(bo.size, false),
        }
    }

    pub(crate) fn vm_map(&self, a: &mut uapi::VmMap) -> Result {
        if a.reserved != [0; 2] || a.flags == 0 || a.flags & !(uapi::VM_READ | uapi::VM_WRITE) != 0 {
            return Err(EINVAL);
        }
        if a.offset % PAGE_SIZE != 0 || a.size % PAGE_SIZE != 0 || a.va % PAGE_SIZE != 0 {
            return Err(EINVAL);
        }
        let mut inner = self.inner.lock();
        let i = Self::bo_index(&inner, a.handle)?;
        let bo_size = inner.bos[i].as_ref().ok_or(ENOENT)?.size;
        let size = if a.size == 0 { bo_size.checked_sub(a.offset).ok_or(EINVAL)? } else { a.size };
        if size == 0 || a.offset.checked_add(size).is_none_or(|end| end > bo_size) {
            return Err(EINVAL);
        }
        inner.maps.reserve(1, GFP_KERNEL)?;
        let va = if a.va == 0 {
            inner.va.alloc(size)?
        } else {
            if a.va < uapi::VA_USER_START || a.va.checked_add(size).is_none_or(|e| e > uapi::VA_USER_END) {
                return Err(EINVAL);
            }
            inner.va.alloc_at(a.va, size)?;
            a.va
        };
        let (read, write) = (a.flags & uapi::VM_READ != 0, a.flags & uapi::VM_WRITE != 0);
        let mut done = 0;
        let result = self.npu.with_bound(|d| {
            let Inner { tables, bos, .. } = &mut *inner;
            let bo = bos[i].as_ref().ok_or(ENOENT)?;
            while done < size {
                let off = a.offset + done;
                let pte = match &bo.backing {
                    Backing::Host(mem) => mmu::leaf_pte(mem.dma((off / PAGE_SIZE) as usize), Target::Host, read, write),
                    Backing::Dram { offset } => mmu::leaf_pte(offset + off, Target::Dram, read, write),
                };
                tables.set(d, va + done, pte)?;
                done += PAGE_SIZE;
            }
            Ok(())
        });
        if let Err(e) = result {
            let _ = self.npu.with_bound(|d| {
                for off in (0..done).step_by(PAGE_SIZE as usize) {
                    inner.tables.set(d, va + off, 0)?;
                }
                Ok(())
            });
            let _ = inner.va.free(va, size);
            return Err(e);
        }
        inner.maps.push_within_capacity(VaMapping { va, size, handle: a.handle }).map_err(|_| ENOMEM)?;
        if let Some(bo) = inner.bos[i].as_mut() {
            bo.maps += 1;
            if bo.first_va == 0 {
                bo.first_va = va;
            }
        }
        a.va = va;
        Ok(())
    }

    pub(crate) fn vm_unmap(&self, a: &uapi::VmUnmap) -> Result {
        if a.reserved != [0; 1] {
            return Err(EINVAL);
        }
        let mut inner = self.inner.lock();
        let m = inner.maps.iter().position(|m| m.va == a.va).ok_or(ENOENT)?;
        let VaMapping { va, size, handle } = inner.maps.remove(m).map_err(|_| EINVAL)?;
        // Once the device is gone there is nothing left to unmap from.
        if !self.npu.is_gone() {
            self.npu.with_bound(|d| {
                for off in (0..size).step_by(PAGE_SIZE as usize) {
                    inner.tables.set(d, va + off, 0)?;
                }
                Ok(())
            })?;
            // The device must drop its cached walks before the VA is reused.
            self.invalidate()?;
        }
        inner.va.free(va, size)?;
        let next_va = inner.maps.iter().find(|m| m.handle == handle).map_or(0, |m| m.va);
        if let Ok(i) = Self::bo_index(&inner, handle) {
            if let Some(bo) = inner.bos[i].as_mut() {
                bo.maps = bo.maps.saturating_sub(1);
                if bo.first_va == va {
                    bo.first_va = next_va;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn queue_create(&self, a: &mut uapi::QueueCreate) -> Result {
        if a.flags != 0 || a.reserved != [0; 2] {
            return Err(EINVAL);
        }
        // One page of ring: 128 entries; a SUBMIT takes two and one stays
        // free, so entries/2 - 1 submissions can be in flight.
        let entries = if a.ring_entries == 0 { MAX_RING } else { a.ring_entries };
        if !entries.is_power_of_two() || !(4..=MAX_RING).contains(&entries) {
            return Err(EINVAL);
        }
        if self.npu.is_gone() {
            return Err(ENODEV);
        }
        if self.npu.is_poisoned(self.id) {
            return Err(EIO);
        }
        let hw = self.npu.take_queue(self.id)?;
        let made = self.setup_queue(hw, entries);
        let (slot, q) = match made {
            Ok(v) => v,
            Err(e) => {
                // The queue may have been enabled: reset it before it goes back.
                let _ = self.npu.with_regs(|r| r.w32(regs::queue_reg(hw, regs::Q_CONTROL), qctl::RESET));
                self.npu.put_queue(hw);
                return Err(e);
            }
        };
        a.queue_id = slot as u32 + 1;
        a.hw_queue = q;
        a.ring_mmap_offset = uapi::mmap_offset(uapi::MMAP_KIND_RING, a.queue_id);
        a.status_mmap_offset = uapi::mmap_offset(uapi::MMAP_KIND_STATUS, a.queue_id);
        a.doorbell_mmap_offset = uapi::mmap_offset(uapi::MMAP_KIND_DOORBELL, a.queue_id);
        Ok(())
    }

    fn setup_queue(&self, hw: u32, entries: u32) -> Result<(usize, u32)> {
        let (ring, status, fences) =
            self.npu.with_bound(|d| Ok((HostMem::new(d, 1)?, HostMem::new(d, 1)?, HostMem::new(d, 1)?)))?;
        self.npu.clear_fault(hw);
        let mut inner = self.inner.lock();
        let slot = match inner.queues.iter().position(|q| q.is_none()) {
            Some(i) => i,
            None => {
                inner.queues.push(None, GFP_KERNEL)?;
                inner.queues.len() - 1
            }
        };
        let kva = kernel_va(slot);
        let fences_dma = fences.dma(0);
        self.npu.with_bound(|d| inner.tables.set(d, kva, mmu::leaf_pte(fences_dma, Target::Host, true, false)))?;
        // From here on a failure must not leave the PTE pointing at `fences`.
        let undo_pte = |inner: &mut Inner| {
            let _ = self.npu.with_bound(|d| inner.tables.set(d, kva, 0));
            let _ = self.invalidate();
        };
        let (ring_base, status_addr) = (ring.dma(0), status.dma(0));
        // The fence timeline starts where the hardware queue's stands: 0,
        // since a queue reset clears it (read back rather than assumed).
        let base = match self.npu.with_regs(|r| {
            r.w64(regs::queue_reg(hw, regs::Q_RING_BASE_64), ring_base)?;
            r.w32(regs::queue_reg(hw, regs::Q_RING_SIZE), entries)?;
            r.w32(regs::queue_reg(hw, regs::Q_CTX_ID), self.id)?;
            r.w64(regs::queue_reg(hw, regs::Q_STATUS_ADDR_64), status_addr)?;
            r.w32(regs::queue_reg(hw, regs::Q_CONTROL), qctl::ENABLE)?;
            if r.r32(regs::queue_reg(hw, regs::Q_STATE))? != QueueState::Idle as u32 {
                return Err(EIO);
            }
            r.r64(regs::queue_reg(hw, regs::Q_FENCE_64))
        }) {
            Ok(b) => b,
            Err(e) => {
                undo_pte(&mut inner);
                return Err(e);
            }
        };
        let shared = QueueShared { status, destroyed: Atomic::new(false), entries, issued: Atomic::new(base), warned: Atomic::new(false) };
        let shared = match Arc::new(shared, GFP_KERNEL) {
            Ok(s) => s,
            Err(e) => {
                undo_pte(&mut inner);
                return Err(e.into());
            }
        };
        inner.queues[slot] = Some(Queue { hw, entries, ring, shared, fences, kva, tail: 0, next_fence: base.wrapping_add(1), user_mode: false });
        Ok((slot, hw))
    }

    fn queue_index(inner: &Inner, id: u32) -> Result<usize> {
        let i = (id as usize).checked_sub(1).ok_or(ENOENT)?;
        match inner.queues.get(i) {
            Some(Some(_)) => Ok(i),
            _ => Err(ENOENT),
        }
    }

    /// Stop a queue on the device and release it.
    fn teardown_queue(&self, inner: &mut Inner, i: usize) {
        if let Some(q) = inner.queues[i].take() {
            q.shared.destroyed.store(true, Relaxed);
            // The reset below clears the counter: keep what it counted.
            inner.retired_busy_ns += self.npu.queue_busy_ns(q.hw);
            let _ = self.npu.with_regs(|r| r.w32(regs::queue_reg(q.hw, regs::Q_CONTROL), qctl::RESET));
            let _ = self.npu.with_bound(|d| inner.tables.set(d, q.kva, 0));
            let _ = self.invalidate();
            if q.user_mode && inner.retired.push(q.hw, GFP_KERNEL).is_ok() {
                // Kept (disabled) until release: see `Inner::retired`.
            } else {
                self.npu.put_queue(q.hw);
            }
            // Wake waiters of this queue: their queue is gone.
            self.npu.wake_all();
        }
    }

    pub(crate) fn queue_destroy(&self, a: &uapi::QueueDestroy) -> Result {
        if a.pad != 0 || a.reserved != [0; 1] {
            return Err(EINVAL);
        }
        let mut inner = self.inner.lock();
        let i = Self::queue_index(&inner, a.queue_id)?;
        self.teardown_queue(&mut inner, i);
        Ok(())
    }

    pub(crate) fn submit(&self, a: &mut uapi::Submit) -> Result {
        if a.flags != 0 || a.pad != 0 || a.reserved != [0; 2] {
            return Err(EINVAL);
        }
        if a.cmdbuf_size == 0 || a.cmdbuf_size % 4 != 0 || a.cmdbuf_size > MAX_CMDBUF_SIZE || a.cmdbuf_va % 4 != 0 {
            return Err(EINVAL);
        }
        if self.npu.is_gone() {
            return Err(ENODEV);
        }
        let inner = self.inner.lock();
        let i = Self::queue_index(&inner, a.queue_id)?;
        let hw = inner.queues[i].as_ref().ok_or(ENOENT)?.hw;
        drop(inner);
        // The fault flag lives under `Npu::events`; checked before taking
        // the context lock again (lock order: context, then events).
        if self.npu.is_faulted(hw) || self.npu.is_poisoned(self.id) {
            return Err(EIO);
        }
        let mut inner = self.inner.lock();
        let q = inner.queues.get_mut(i).and_then(|q| q.as_mut()).filter(|q| q.hw == hw).ok_or(ENOENT)?;
        if q.user_mode {
            return Err(EBUSY);
        }
        // Two ring slots per submission: the caller's buffer, our fence.
        // A corrupt status block is not believed: the register is.
        let head = match q.shared.head() {
            Some(h) => h,
            None => self.npu.with_regs(|r| r.r32(regs::queue_reg(q.hw, regs::Q_HEAD)))? & (q.entries - 1),
        };
        let used = q.tail.wrapping_sub(head) & (q.entries - 1);
        if q.entries - 1 - used < 2 {
            return Err(EBUSY);
        }
        let fence = q.next_fence;
        // Before the device can see the submission, so that its fence
        // write-back is never beyond `issued`.
        q.shared.issued.store(fence, Release);
        let fslot = (q.tail / 2) % FENCE_SLOTS;
        let pkt = cmd::Fence {
            header: cmd::header(Opcode::Fence, cmd::FENCE_FLAG_IRQ, (cmd::Fence::SIZE / 4) as u16),
            reserved: 0,
            value: fence,
            addr_va: 0,
        };
        q.fences.write(fslot as usize * cmd::Fence::SIZE, &pkt.to_bytes())?;
        let user = RingEntry { cmdbuf_va: a.cmdbuf_va, cmdbuf_size: a.cmdbuf_size, tag: fence, ..Default::default() };
        let ours = RingEntry {
            cmdbuf_va: q.kva + fslot as u64 * cmd::Fence::SIZE as u64,
            cmdbuf_size: cmd::Fence::SIZE as u32,
            tag: fence,
            ..Default::default()
        };
        q.write_entry(q.tail, &user)?;
        q.write_entry((q.tail + 1) & (q.entries - 1), &ours)?;
        q.tail = (q.tail + 2) & (q.entries - 1);
        q.next_fence = q.next_fence.wrapping_add(1);
        self.npu.ring_doorbell(q.hw, q.tail)?;
        inner.submits = inner.submits.wrapping_add(1);
        a.fence = fence;
        Ok(())
    }

    pub(crate) fn fence_wait(&self, a: &uapi::FenceWait) -> Result {
        if a.flags != 0 || a.reserved != [0; 1] {
            return Err(EINVAL);
        }
        let (hw, shared) = {
            let inner = self.inner.lock();
            let i = Self::queue_index(&inner, a.queue_id)?;
            let q = inner.queues[i].as_ref().ok_or(ENOENT)?;
            // On a kernel-submitted queue a fence never handed out would
            // never come; user-mode queues choose their own values.
            if !q.user_mode && a.value >= q.next_fence {
                return Err(EINVAL);
            }
            (q.hw, q.shared.clone())
        };
        // Round the timeout up to whole jiffies (at least one when non-zero).
        let ms = a.timeout_ns.div_ceil(1_000_000).min(u32::MAX as u64) as u32;
        let mut left: Jiffies = if a.timeout_ns == 0 { 0 } else { msecs_to_jiffies(ms).max(1) };
        // Hang detection runs while someone waits: no progress (packets
        // executed) for `hang_ms` while the fence is pending is a hang.
        let hang_ms = crate::module_parameters::hang_ms.value();
        // Every tick the waiter also checks that the device still answers,
        // so that a lost device fails the wait within a tenth of a second.
        let tick_ms = if hang_ms == 0 { LIVENESS_MS } else { (hang_ms / 4).clamp(10, LIVENESS_MS) };
        let tick = msecs_to_jiffies(tick_ms);
        // (packets executed, queue busy, Q_STATE read all ones). An idle
        // queue is never hung (its user may simply not have submitted the
        // awaited work yet). All ones means the device may be lost, which
        // `check_alive` then confirms: the state read anyway spares the
        // waiter a liveness read per wake-up.
        let progress = || {
            self.npu
                .with_regs(|r| {
                    let st = r.r32(regs::queue_reg(hw, regs::Q_STATE))?;
                    let busy = st == QueueState::Running as u32 || st == QueueState::Waiting as u32;
                    let faulted = st == QueueState::Faulted as u32;
                    Ok((r.r64(regs::queue_reg(hw, regs::Q_PACKETS_64))?, busy, st == u32::MAX, faulted))
                })
                .unwrap_or((0, false, false, false))
        };
        // The fence as the status block says, or, when the block is
        // corrupt, as the register says (counted and reported once).
        let fence_now = |ev: &mut crate::npu::Events| match shared.fence() {
            Some(f) => f,
            None => {
                ev.status_refused = ev.status_refused.wrapping_add(1);
                if !shared.warned.xchg(true, Relaxed) {
                    self.npu.warn_corrupt_status(hw);
                }
                self.npu.with_regs(|r| r.r64(regs::queue_reg(hw, regs::Q_FENCE_64))).unwrap_or(0)
            }
        };
        // The registers are read once per tick while the fence is pending,
        // never per wake-up or for a fence already passed: every interrupt
        // of the device wakes every waiter, and each register read is a
        // round trip to the device (on the virtual NPU a message to the
        // device model that stalls the CPU until answered). The first
        // check takes the baseline of the hang detection.
        let mut last_packets: Option<u64> = None;
        let mut stalled_since = Instant::<Monotonic>::now();
        let mut checked_at = stalled_since;
        // The last nap ended by its timeout, not by an interrupt.
        let mut timed_out = false;
        // Q_STATE read Faulted at the previous check with no error
        // interrupt seen: a second sighting means that interrupt was lost.
        let mut fault_pending = false;
        let mut ev = self.npu.events.lock();
        loop {
            if fence_now(&mut ev) >= a.value {
                if timed_out {
                    // Found by this check rather than announced by an
                    // interrupt (one lost or late).
                    ev.polled_fences = ev.polled_fences.wrapping_add(1);
                }
                return Ok(());
            }
            if self.npu.is_gone() {
                return Err(ENODEV);
            }
            if shared.destroyed.load(Relaxed) {
                return Err(ENOENT);
            }
            // A fault or hang anywhere in the context fails every wait in it:
            // its other queues were disabled and will not get further.
            if ev.faulted & (1 << hw) != 0 || ev.poisoned & (1 << self.id) != 0 {
                return Err(EIO);
            }
            if left == 0 {
                return Err(ETIMEDOUT);
            }
            if checked_at.elapsed().as_millis() >= tick_ms as i64 {
                checked_at = Instant::<Monotonic>::now();
                let (p, busy, all_ones, faulted) = progress();
                if all_ones && !self.npu.check_alive() {
                    return Err(ENODEV);
                }
                if faulted && ev.faulted & (1 << hw) == 0 {
                    if fault_pending {
                        self.npu.missed_fault(&mut ev, hw, self.id);
                        continue;
                    }
                    fault_pending = true;
                }
                if last_packets != Some(p) || !busy {
                    last_packets = Some(p);
                    stalled_since = checked_at;
                } else if hang_ms > 0 && stalled_since.elapsed().as_millis() >= hang_ms as i64 {
                    self.npu.declare_hang(&mut ev, hw, self.id, hang_ms);
                    return Err(EIO);
                }
            }
            let nap = left.min(tick);
            timed_out = false;
            match self.npu.event_cv.wait_interruptible_timeout(&mut ev, nap) {
                kernel::sync::CondVarTimeoutResult::Timeout => {
                    left = left.saturating_sub(nap);
                    timed_out = true;
                }
                kernel::sync::CondVarTimeoutResult::Woken { jiffies } => left = left.saturating_sub(nap.saturating_sub(jiffies)),
                // EINTR, not ERESTARTSYS: a restarted call would wait the
                // whole relative timeout again.
                kernel::sync::CondVarTimeoutResult::Signal { .. } => return Err(EINTR),
            }
        }
    }

    /// mmap of a queue's ring (read-write), status block (read-only) or
    /// doorbell page (this queue's page of BAR4, nothing else).
    pub(crate) fn mmap_queue(&self, kind: u64, id: u32, vma: &kernel::mm::virt::VmaNew) -> Result {
        let len = vma.end() - vma.start();
        let mut inner = self.inner.lock();
        let i = Self::queue_index(&inner, id)?;
        let q = inner.queues[i].as_mut().ok_or(ENOENT)?;
        match kind {
            uapi::MMAP_KIND_RING => {
                q.ring.mmap(vma, len)?;
                q.user_mode = true;
                q.shared.issued.store(u64::MAX, Release);
            }
            uapi::MMAP_KIND_STATUS => {
                if vma.writable() {
                    return Err(EACCES);
                }
                vma.try_clear_maywrite()?;
                q.shared.status.mmap(vma, len)?;
            }
            uapi::MMAP_KIND_DOORBELL => {
                if len != PAGE_SIZE as usize {
                    return Err(EINVAL);
                }
                self.npu.mmap_doorbell(q.hw, vma)?;
                q.user_mode = true;
                q.shared.issued.store(u64::MAX, Release);
            }
            _ => return Err(EINVAL),
        }
        Ok(())
    }

    /// The memory of host BO `handle`, for mmap.
    pub(crate) fn with_bo_mem<R>(&self, handle: u32, f: impl FnOnce(&HostMem) -> Result<R>) -> Result<R> {
        let inner = self.inner.lock();
        let i = Self::bo_index(&inner, handle)?;
        match &inner.bos[i].as_ref().ok_or(ENOENT)?.backing {
            Backing::Host(mem) => f(mem),
            Backing::Dram { .. } => Err(EINVAL),
        }
    }
}

#[pinned_drop]
impl PinnedDrop for Context {
    fn drop(self: Pin<&mut Self>) {
        // Stop every queue before any memory it may touch is freed, then
        // retire the context on the device.
        let mut inner = self.inner.lock();
        for i in 0..inner.queues.len() {
            self.teardown_queue(&mut inner, i);
        }
        let _ = self.npu.with_regs(|r| {
            r.w32(regs::ctx_reg(self.id, regs::CTX_CONTROL), 0)?;
            r.w32(regs::MMU_INVALIDATE, self.id)
        });
        for hw in core::mem::take(&mut inner.retired) {
            self.npu.put_queue(hw);
        }
        let bos = core::mem::take(&mut inner.bos);
        drop(inner);
        for bo in bos.into_iter().flatten() {
            self.free_bo(bo);
        }
        self.npu.put_context(self.id);
    }
}
