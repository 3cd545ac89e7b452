//! Queues (kernel-submitted or user-mode) and fences.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use rbln_hw::ring::{QueueState, QueueStatus, RingEntry, MAX_CMDBUF_SIZE};
use rbln_uapi as uapi;

use crate::buffer::{Buffer, Perms, Placement};
use crate::cmdbuf::CommandBuffer;
use crate::device::{Device, DeviceInner};
use crate::error::{Error, FaultInfo, Op, Result};
use crate::sys::{self, Mapping, Prot};

/// Ring size used when 0 is asked for: one page of ring, the most the
/// driver accepts.
pub const DEFAULT_RING_ENTRIES: u32 = 128;

/// What fences and both kinds of queue share: the queue's identity, its
/// status block (mapped read-only) and whether it still exists.
#[derive(Debug)]
pub(crate) struct QueueShared {
    pub(crate) dev: Arc<DeviceInner>,
    pub(crate) id: u32,
    pub(crate) hw: u32,
    status: Mapping,
    destroyed: AtomicBool,
    /// The last error record seen in the status block (the kernel resets a
    /// faulted queue at once, which clears the record, so it is kept here).
    fault: Mutex<Option<FaultInfo>>,
    /// Ring entries: a status head at or beyond is impossible.
    entries: u32,
    /// The latest fence handed out on this queue: a status block showing a
    /// later one is corrupt.
    issued: AtomicU64,
}

impl QueueShared {
    /// A snapshot of the status block (field by field; fields written by
    /// one device update may mix with the next one's).
    pub(crate) fn status(&self) -> QueueStatus {
        let mut b = [0u8; QueueStatus::SIZE];
        self.status.copy_out(0, &mut b);
        let s = QueueStatus::read_from(&b).unwrap_or_default();
        if s.state == QueueState::Faulted as u32 {
            if let Some(f) = FaultInfo::from_status(&s) {
                *self.fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
            }
        }
        s
    }

    /// Whether a status block snapshot is possible: a known state, a head
    /// inside the ring, a fence no later than the last one handed out. A
    /// device that writes back garbage is not believed; callers ask the
    /// kernel instead, which reads the queue's registers
    /// (docs/reliability.md).
    fn plausible(&self, s: &QueueStatus) -> bool {
        QueueState::from_u32(s.state).is_some() && s.head < self.entries && s.fence <= self.issued.load(Ordering::Acquire)
    }

    /// Record a fence handed out (before the device can reach it, for
    /// user-mode submissions).
    fn issue(&self, fence: u64) {
        self.issued.fetch_max(fence, Ordering::AcqRel);
    }

    /// Whether the status block shows fence `value` signalled; `None` when
    /// the block is implausible (ask the kernel).
    fn signalled(&self, value: u64) -> Option<bool> {
        let s = self.status();
        self.plausible(&s).then_some(s.fence >= value)
    }

    fn fault_info(&self) -> Option<FaultInfo> {
        let _ = self.status();
        *self.fault.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The queue stopped: Faulted, or Disabled after the kernel reset it
    /// (fault or hang). A live queue of ours is never Disabled.
    fn stopped(s: &QueueStatus) -> bool {
        s.state == QueueState::Faulted as u32 || s.state == QueueState::Disabled as u32
    }

    fn faulted(&self) -> Error {
        self.dev.poison();
        Error::Faulted { queue: self.id, fault: self.fault_info() }
    }

    /// RBLN_IOCTL_FENCE_WAIT.
    fn fence_wait(&self, value: u64, timeout: Duration) -> Result<()> {
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let mut a = uapi::FenceWait { queue_id: self.id, value, timeout_ns, ..Default::default() };
        match sys::ioctl(&self.dev.file, &mut a) {
            Ok(()) => Ok(()),
            Err(Errno::ETIMEDOUT) => Err(Error::Timeout { queue: self.id, value, timeout }),
            Err(Errno::EIO) => Err(self.faulted()),
            Err(e) => Err(Error::from_errno(Op::FenceWait, e)),
        }
    }
}

/// A point on a queue's timeline: signalled when everything submitted
/// before it on that queue has completed. Cheap to clone; `Send + Sync`.
#[derive(Clone, Debug)]
pub struct Fence {
    q: Arc<QueueShared>,
    value: u64,
    /// The FENCE packet raises the fence interrupt (kernel submissions
    /// always; user-mode queues unless switched off).
    irq: bool,
}

impl Fence {
    pub(crate) fn from_parts(q: Arc<QueueShared>, value: u64, irq: bool) -> Fence {
        Fence { q, value, irq }
    }

    /// The fence value (the queue's timeline position).
    pub fn value(&self) -> u64 {
        self.value
    }

    /// The queue's id (as the driver numbers it).
    pub fn queue_id(&self) -> u32 {
        self.q.id
    }

    /// Sleep until the fence signals, at most `timeout`
    /// (RBLN_IOCTL_FENCE_WAIT, woken by the fence interrupt; works for both
    /// kinds of queue). `Duration::ZERO` polls. Errors: [`Error::Timeout`],
    /// [`Error::Faulted`] (the queue faulted or hung before reaching the
    /// fence), [`Error::Interrupted`] (a signal; retry),
    /// [`Error::NotFound`] (the queue was destroyed).
    ///
    /// Fences of a user-mode queue whose fence interrupts are off
    /// ([`UserQueue::set_fence_interrupts`]) raise no interrupt to sleep
    /// on: for them this polls the status block, spinning briefly and then
    /// sleeping between polls (50 µs growing to 1 ms).
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        if self.q.signalled(self.value) == Some(true) {
            return Ok(());
        }
        if self.irq {
            return self.q.fence_wait(self.value, timeout);
        }
        let t0 = Instant::now();
        let mut nap = Duration::from_micros(50);
        loop {
            if self.poll()? {
                return Ok(());
            }
            let spent = t0.elapsed();
            if spent >= timeout {
                return Err(Error::Timeout { queue: self.q.id, value: self.value, timeout });
            }
            if spent < Duration::from_micros(100) {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(nap.min(timeout - spent));
                nap = (nap * 2).min(Duration::from_millis(1));
            }
        }
    }

    /// Whether the fence has signalled, without blocking: reads the status
    /// block, asking the kernel (FENCE_WAIT with timeout 0) only when the
    /// queue stopped, to report why.
    pub fn poll(&self) -> Result<bool> {
        let s = self.q.status();
        let plausible = self.q.plausible(&s);
        if plausible && s.fence >= self.value {
            return Ok(true);
        }
        if plausible && !QueueShared::stopped(&s) && !self.q.destroyed.load(Ordering::Relaxed) {
            return Ok(false);
        }
        match self.q.fence_wait(self.value, Duration::ZERO) {
            Ok(()) => Ok(true),
            Err(Error::Timeout { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Busy-poll the status block until the fence signals, at most
    /// `timeout`: the lowest latency, at the cost of a CPU spinning. Use
    /// [`wait`](Self::wait) unless latency matters more than the CPU.
    pub fn spin_wait(&self, timeout: Duration) -> Result<()> {
        let t0 = Instant::now();
        let mut n = 0u32;
        loop {
            if self.q.signalled(self.value) == Some(true) {
                return Ok(());
            }
            n = n.wrapping_add(1);
            // Every so often look at the state and the clock.
            if n.is_multiple_of(64) {
                if self.poll()? {
                    return Ok(());
                }
                if t0.elapsed() >= timeout {
                    return Err(Error::Timeout { queue: self.q.id, value: self.value, timeout });
                }
            }
            std::hint::spin_loop();
        }
    }
}

/// Owns a hardware queue: destroys it when dropped.
#[derive(Debug)]
struct HwQueue {
    q: Arc<QueueShared>,
}

impl Drop for HwQueue {
    fn drop(&mut self) {
        self.q.destroyed.store(true, Ordering::Relaxed);
        let _ = self.q.dev.ioctl(&mut uapi::QueueDestroy { queue_id: self.q.id, ..Default::default() });
    }
}

/// Submitting command buffers, whichever way the queue does it.
pub trait Submit {
    /// Put `cb` on the queue; the returned fence signals when it completed.
    fn submit(&mut self, cb: &mut CommandBuffer) -> Result<Fence>;
    /// The queue's id.
    fn queue_id(&self) -> u32;
}

/// A queue the kernel submits to (RBLN_IOCTL_SUBMIT): each submission is
/// one system call; the kernel appends the fence.
///
/// A queue is used by one thread at a time (`Send`, not `Sync`); create one
/// per thread. Turn it into a [`UserQueue`] with
/// [`into_user_mode`](Self::into_user_mode).
#[derive(Debug)]
pub struct Queue {
    hw: HwQueue,
    entries: u32,
    create: uapi::QueueCreate,
    /// Not `Sync`: one thread submits at a time.
    _not_sync: std::marker::PhantomData<std::cell::Cell<()>>,
}

impl Device {
    /// Create a queue of `entries` ring entries (a power of two, 4..=128;
    /// 0 means [`DEFAULT_RING_ENTRIES`]). Each submission takes two entries
    /// (the command buffer and its fence), so `entries / 2 - 1` can be in
    /// flight.
    pub fn create_queue(&self, entries: u32) -> Result<Queue> {
        let entries = if entries == 0 { DEFAULT_RING_ENTRIES } else { entries };
        if !entries.is_power_of_two() || entries < 4 {
            return Err(Error::InvalidInput(format!(
                "a queue needs a power-of-two ring of at least 4 entries (two per submission), not {entries}"
            )));
        }
        if self.inner.is_poisoned() {
            return Err(Error::Poisoned { op: Op::QueueCreate });
        }
        let mut a = uapi::QueueCreate { ring_entries: entries, ..Default::default() };
        match sys::ioctl(&self.inner.file, &mut a) {
            Ok(()) => {}
            // The driver refuses new queues in a poisoned context.
            Err(Errno::EIO) => {
                self.inner.poison();
                return Err(Error::Poisoned { op: Op::QueueCreate });
            }
            Err(e) => return Err(Error::from_errno(Op::QueueCreate, e)),
        }
        let status = match Mapping::new(&self.inner.file, a.status_mmap_offset, rbln_hw::PAGE_SIZE as usize, Prot::Read) {
            Ok(m) => m,
            Err(e) => {
                let _ = self.inner.ioctl(&mut uapi::QueueDestroy { queue_id: a.queue_id, ..Default::default() });
                return Err(Error::from_errno(Op::MmapStatus, e));
            }
        };
        let hw = HwQueue {
            q: Arc::new(QueueShared {
                dev: self.inner.clone(),
                id: a.queue_id,
                hw: a.hw_queue,
                status,
                destroyed: AtomicBool::new(false),
                fault: Mutex::new(None),
                entries,
                issued: AtomicU64::new(0),
            }),
        };
        // The timeline starts where the hardware queue's stands.
        let start = hw.q.status().fence;
        hw.q.issue(start);
        Ok(Queue { hw, entries, create: a, _not_sync: Default::default() })
    }

    /// Create a queue and switch it to user-mode submission at once.
    pub fn create_user_queue(&self, entries: u32) -> Result<UserQueue> {
        self.create_queue(entries)?.into_user_mode()
    }
}

impl Queue {
    pub(crate) fn shared(&self) -> &Arc<QueueShared> {
        &self.hw.q
    }

    /// The queue id the driver gave.
    pub fn id(&self) -> u32 {
        self.hw.q.id
    }

    /// The hardware queue (doorbell page) it runs on.
    pub fn hw_queue(&self) -> u32 {
        self.hw.q.hw
    }

    /// Ring size in entries.
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// Submit `cb` through the kernel (RBLN_IOCTL_SUBMIT). Uploads the
    /// command buffer's bytes if they changed since its last submission.
    pub fn submit_ioctl(&self, cb: &mut CommandBuffer) -> Result<Fence> {
        cb.check_device(&self.hw.q.dev)?;
        let (va, size) = cb.prepare()?;
        let fence = self.submit_va(va, size)?;
        cb.submitted(fence.clone());
        Ok(fence)
    }

    /// Submit a command buffer that is already in device memory at `va`
    /// (`size` bytes), e.g. a pre-encoded command stream.
    pub fn submit_va(&self, va: u64, size: u32) -> Result<Fence> {
        let q = &self.hw.q;
        if q.dev.is_poisoned() {
            return Err(Error::Poisoned { op: Op::Submit });
        }
        let mut a = uapi::Submit { queue_id: q.id, cmdbuf_va: va, cmdbuf_size: size, ..Default::default() };
        match sys::ioctl(&q.dev.file, &mut a) {
            Ok(()) => {
                q.issue(a.fence);
                Ok(Fence { q: q.clone(), value: a.fence, irq: true })
            }
            Err(Errno::EIO) => {
                q.dev.poison();
                Err(Error::Poisoned { op: Op::Submit })
            }
            Err(e) => Err(Error::from_errno(Op::Submit, e)),
        }
    }

    /// Switch to user-mode submission: map the ring (read-write), the
    /// doorbell page (write) and keep the status block (read-only). From
    /// then on the kernel refuses RBLN_IOCTL_SUBMIT on this queue, which is
    /// why this consumes the `Queue`. On error the queue is destroyed.
    pub fn into_user_mode(self) -> Result<UserQueue> {
        UserQueue::new(self)
    }
}

impl Submit for Queue {
    fn submit(&mut self, cb: &mut CommandBuffer) -> Result<Fence> {
        self.submit_ioctl(cb)
    }
    fn queue_id(&self) -> u32 {
        self.id()
    }
}

/// A queue this process submits to by itself: it writes ring entries into
/// the mapped ring and rings its own doorbell page, with no system call.
/// The UMD appends a FENCE packet of its own (as a second ring entry) to
/// every submission, numbering fences from the status block's fence + 1.
/// Waiting still works through the kernel ([`Fence::wait`], woken by the
/// fence interrupt) or by polling ([`Fence::spin_wait`]).
///
/// The device MMU confines what the queue's commands can touch to this
/// context's mappings, which is what makes this safe.
///
/// The driver keeps the hardware queue of a dropped user-mode queue
/// reserved until the device file is closed (the process might still hold
/// its doorbell mapping), so create user-mode queues once and reuse them
/// rather than one per job.
#[derive(Debug)]
pub struct UserQueue {
    // Field order is drop order: unmap the ring and doorbell, destroy the
    // queue (stopping the device), and only then free the fence packets it
    // may be reading.
    ring: Mapping,
    doorbell: Mapping,
    hw: HwQueue,
    fences: Buffer,
    fences_va: u64,
    entries: u32,
    tail: u32,
    next_fence: u64,
    slot: u32,
    slots: u32,
    fence_irq: bool,
    _not_sync: std::marker::PhantomData<std::cell::Cell<()>>,
}

const FENCE_BYTES: u64 = rbln_hw::cmd::Fence::SIZE as u64;

impl UserQueue {
    fn new(queue: Queue) -> Result<UserQueue> {
        let Queue { hw, entries, create, .. } = queue;
        let q = hw.q.clone();
        let status = q.status();
        if QueueShared::stopped(&status) {
            return Err(q.faulted());
        }
        if status.state != QueueState::Idle as u32 {
            return Err(Error::Busy {
                op: Op::MmapRing,
                hint: "the queue still runs kernel submissions: wait for their fences before switching it to user mode",
            });
        }
        // At most (entries - 1) / 2 submissions are in flight; one more
        // slot than that means a slot is rewritten only after its previous
        // submission left the ring.
        let slots = entries / 2 + 1;
        let fences = Buffer::new(&q.dev, slots as u64 * FENCE_BYTES, Placement::Host)?;
        let fences_va = fences.map(Perms::READ)?;
        let ring_len = sys::page_round(entries as u64 * RingEntry::SIZE as u64) as usize;
        let ring = Mapping::new(&q.dev.file, create.ring_mmap_offset, ring_len, Prot::ReadWrite)
            .map_err(|e| Error::from_errno(Op::MmapRing, e))?;
        let doorbell = Mapping::new(&q.dev.file, create.doorbell_mmap_offset, rbln_hw::PAGE_SIZE as usize, Prot::Write)
            .map_err(|e| Error::from_errno(Op::MmapDoorbell, e))?;
        Ok(UserQueue {
            ring,
            doorbell,
            hw,
            fences,
            fences_va,
            entries,
            tail: status.head,
            next_fence: status.fence.wrapping_add(1),
            slot: 0,
            slots,
            fence_irq: true,
            _not_sync: Default::default(),
        })
    }

    pub(crate) fn shared(&self) -> &Arc<QueueShared> {
        &self.hw.q
    }

    /// The queue id the driver gave.
    pub fn id(&self) -> u32 {
        self.hw.q.id
    }

    /// The hardware queue (doorbell page) it runs on.
    pub fn hw_queue(&self) -> u32 {
        self.hw.q.hw
    }

    /// Ring size in entries.
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// Whether the UMD's fence packets raise the fence interrupt (default
    /// yes, so that [`Fence::wait`] sleeps in the kernel until woken).
    ///
    /// Off, no interrupt is taken per submission: the lowest-latency mode
    /// with [`Fence::spin_wait`] (the interrupt's handler otherwise runs,
    /// at high priority, just when the fence lands, and delays a spinning
    /// waiter on the same CPU). [`Fence::wait`] then polls the status block
    /// instead of sleeping in the kernel.
    pub fn set_fence_interrupts(&mut self, on: bool) {
        self.fence_irq = on;
    }

    /// See [`set_fence_interrupts`](Self::set_fence_interrupts).
    pub fn fence_interrupts(&self) -> bool {
        self.fence_irq
    }

    /// Submit `cb` by writing the ring and the doorbell (no system call).
    /// Uploads the command buffer's bytes if they changed. Fails with
    /// [`Error::Busy`] when the ring is full (wait for an earlier fence).
    pub fn submit(&mut self, cb: &mut CommandBuffer) -> Result<Fence> {
        cb.check_device(&self.hw.q.dev)?;
        let (va, size) = cb.prepare()?;
        let fence = self.submit_va(va, size)?;
        cb.submitted(fence.clone());
        Ok(fence)
    }

    /// Submit a command buffer already in device memory at `va`.
    pub fn submit_va(&mut self, va: u64, size: u32) -> Result<Fence> {
        let q = self.hw.q.clone();
        if q.dev.is_poisoned() {
            return Err(Error::Poisoned { op: Op::UserSubmit });
        }
        if !va.is_multiple_of(4) {
            return Err(Error::Misaligned { what: "a command buffer's device VA", value: va, align: 4 });
        }
        if size == 0 || !size.is_multiple_of(4) || size > MAX_CMDBUF_SIZE {
            return Err(Error::InvalidInput(format!(
                "a command buffer must be a multiple of 4 bytes in 4 ..= {MAX_CMDBUF_SIZE}, not {size}"
            )));
        }
        self.make_room()?;
        let value = self.next_fence;
        q.issue(value);
        let mut enc = rbln_hw::cmd::Encoder::new(Vec::with_capacity(FENCE_BYTES as usize));
        enc.fence(value, 0, self.fence_irq);
        let fence_off = self.slot as u64 * FENCE_BYTES;
        self.fences.write_slice(fence_off, &enc.buf)?;
        let mask = self.entries - 1;
        let user = RingEntry { cmdbuf_va: va, cmdbuf_size: size, tag: value, ..Default::default() };
        let ours = RingEntry {
            cmdbuf_va: self.fences_va + fence_off,
            cmdbuf_size: FENCE_BYTES as u32,
            tag: value,
            ..Default::default()
        };
        self.ring.copy_in(self.tail as usize * RingEntry::SIZE, &user.to_bytes());
        self.ring.copy_in(((self.tail + 1) & mask) as usize * RingEntry::SIZE, &ours.to_bytes());
        self.tail = (self.tail + 2) & mask;
        // A full fence first: the command buffer, fence packet and ring
        // entries are visible to the device before it sees the new tail.
        self.doorbell.mmio_write_u32(0, self.tail);
        self.next_fence = value.wrapping_add(1);
        self.slot = (self.slot + 1) % self.slots;
        Ok(Fence { q, value, irq: self.fence_irq })
    }

    /// Make sure two ring entries are free.
    fn make_room(&self) -> Result<()> {
        let q = &self.hw.q;
        let mask = self.entries - 1;
        let t0 = Instant::now();
        loop {
            let s = q.status();
            if !q.plausible(&s) {
                // A corrupt write-back: no ring space can be trusted
                // until the device writes a sane block again.
                if t0.elapsed() > Duration::from_millis(100) {
                    return Err(Error::Busy { op: Op::UserSubmit, hint: "the queue's status block is corrupt (a device fault): wait for a fence and retry" });
                }
                std::hint::spin_loop();
                continue;
            }
            if QueueShared::stopped(&s) {
                return Err(q.faulted());
            }
            let used = self.tail.wrapping_sub(s.head) & mask;
            if self.entries - 1 - used >= 2 {
                return Ok(());
            }
            // Full. If the oldest submission's fence already signalled, its
            // entries leave the ring in a moment (head moves after the
            // entry completes): spin for that. Otherwise the caller must
            // wait for a fence.
            let oldest = self.next_fence.wrapping_sub((used as u64).div_ceil(2));
            if s.fence < oldest || t0.elapsed() > Duration::from_millis(100) {
                return Err(Error::Busy {
                    op: Op::UserSubmit,
                    hint: "the ring is full (too many submissions in flight): wait for an earlier fence and retry",
                });
            }
            std::hint::spin_loop();
        }
    }
}

impl Submit for UserQueue {
    fn submit(&mut self, cb: &mut CommandBuffer) -> Result<Fence> {
        UserQueue::submit(self, cb)
    }
    fn queue_id(&self) -> u32 {
        self.id()
    }
}
