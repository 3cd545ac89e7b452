// SPDX-License-Identifier: GPL-2.0

//! PCI binding: probe, the device-wide state shared with open files, and
//! teardown.

use core::ptr::NonNull;

use kernel::{
    bindings,
    device::Core,
    irq::{self, IrqReturn, ThreadedHandler, ThreadedRegistration},
    miscdevice::{MiscDeviceOptions, MiscDeviceRegistration},
    new_condvar, new_mutex, pci,
    prelude::*,
    sync::{aref::ARef, Arc, CondVar, Mutex},
};

use crate::file::RblnFile;
use crate::hw::{self, regs};
use crate::uapi;

/// BAR0 (registers) is 64 KiB.
pub(crate) const REGS_SIZE: usize = hw::pci::BAR_REGS_SIZE as usize;
type RegsBar = pci::DevresBar<REGS_SIZE>;

/// Most devices one system may have (/dev/rbln0 ../dev/rbln7).
const MAX_DEVICES: usize = 8;
static DEVICE_NAMES: [&CStr; MAX_DEVICES] =
    [c"rbln0", c"rbln1", c"rbln2", c"rbln3", c"rbln4", c"rbln5", c"rbln6", c"rbln7"];

/// Minor indices in use (bit i: /dev/rbln{i}).
static INDICES: kernel::sync::atomic::Atomic<u32> = kernel::sync::atomic::Atomic::new(0);

fn take_index() -> Result<usize> {
    use kernel::sync::atomic::{Acquire, Relaxed};
    loop {
        let used = INDICES.load(Relaxed);
        let free = (!used).trailing_zeros() as usize;
        if free >= MAX_DEVICES {
            return Err(ENOSPC);
        }
        if INDICES.cmpxchg(used, used | (1 << free), Acquire).is_ok() {
            return Ok(free);
        }
    }
}

fn put_index(i: usize) {
    use kernel::sync::atomic::{Relaxed, Release};
    loop {
        let used = INDICES.load(Relaxed);
        if INDICES.cmpxchg(used, used & !(1u32 << i), Release).is_ok() {
            return;
        }
    }
}

/// What probe learned from the hardware's identity registers.
#[derive(Clone, Copy)]
pub(crate) struct HwInfo {
    pub(crate) version: u32,
    pub(crate) caps: u32,
    pub(crate) num_queues: u32,
    pub(crate) num_cores: u32,
    pub(crate) num_dma_engines: u32,
    pub(crate) dram_size: u64,
}

/// Fault messages logged per window (`Npu::log_fault_ok`).
const LOG_BURST: u32 = 20;
const LOG_WINDOW_MS: i64 = 5000;

/// What the interrupt handlers have seen; protected by `Npu::events`.
#[derive(Default)]
pub(crate) struct Events {
    /// Interrupts serviced (any vector).
    pub(crate) irqs: u64,
    /// Queues whose error interrupt fired (or that hung) and that nobody
    /// has released yet. Their fences fail with EIO.
    pub(crate) faulted: u32,
    /// Contexts one of whose queues faulted or hung: every later
    /// submission of theirs fails with EIO (reopen the device to recover).
    pub(crate) poisoned: u64,
    /// The subset of `faulted` that hung (no progress for `hang_ms`).
    pub(crate) hung: u32,
    /// Resets asked for through sysfs since the driver bound the device.
    pub(crate) resets: u64,
    /// Error interrupts that found nothing pending (spurious, or a record
    /// a waiter's own check already took): ignored. (Queue vectors read
    /// no register, so nothing tells a spurious one apart: their waiters
    /// find their fences unchanged and sleep again.)
    pub(crate) spurious: u64,
    /// Fence waits completed by the waiter's periodic check after a nap
    /// that no interrupt ended (the fence's interrupt lost or late).
    pub(crate) polled_fences: u64,
    /// Faults found by a waiter (the queue Faulted at two checks in a
    /// row) whose error interrupt never came.
    pub(crate) missed_faults: u64,
    /// Status-block reads refused as corrupt (an impossible head, state
    /// or fence): the registers were read instead.
    pub(crate) status_refused: u64,
}

/// Device-wide state, shared (by `Arc`) by the PCI binding and every open
/// file. Hardware access goes through revocable BAR mappings: after the
/// device is unbound, file operations get `ENODEV` instead of touching
/// unmapped registers.
#[pin_data]
pub(crate) struct Npu {
    pub(crate) index: usize,
    pub(crate) pdev: ARef<pci::Device>,
    pub(crate) regs: RegsBar,
    pub(crate) doorbells: pci::DevresBar,
    pub(crate) hw: HwInfo,
    /// Interrupt bookkeeping; waiters sleep on `event_cv` with it held, and
    /// the interrupt thread notifies with it held, so no wake-up is lost.
    #[pin]
    pub(crate) events: Mutex<Events>,
    #[pin]
    pub(crate) event_cv: CondVar,
    /// Hardware resources handed out to contexts.
    #[pin]
    alloc: Mutex<Resources>,
    /// True while the driver is bound; cleared (under the lock) at the
    /// start of unbind. See `with_bound`.
    #[pin]
    bound: Mutex<bool>,
    /// Set at the start of unbind, readable without locks: file operations
    /// fail with ENODEV and waiters wake up.
    gone: kernel::sync::atomic::Atomic<bool>,
    /// Set once the device stopped answering (its identity register reads
    /// all ones: surprise removal). Final until the driver is rebound;
    /// file operations fail with ENODEV as after unbind.
    lost: kernel::sync::atomic::Atomic<bool>,
    /// When the driver bound the device: STATS timestamps count from it.
    bound_at: kernel::time::Instant<kernel::time::Monotonic>,
    /// Fault messages in the current log window (see `log_fault_ok`) and
    /// when that window began (ms since `bound_at`).
    log_count: kernel::sync::atomic::Atomic<u32>,
    log_window: kernel::sync::atomic::Atomic<i64>,
    /// The last sample of sysfs `utilization`.
    #[pin]
    util: Mutex<UtilSample>,
    /// The driver's own queue (DRAM scrubbing); set up at probe.
    #[pin]
    engine: Mutex<Option<crate::engine::KernelEngine>>,
}

/// A sample of the cores' busy time, for sysfs `utilization`.
#[derive(Default)]
pub(crate) struct UtilSample {
    at_ns: u64,
    busy_ns: u64,
    percent: u32,
}

/// Contexts, queues and DRAM in use.
pub(crate) struct Resources {
    /// Bit i: context id i is in use. The last id belongs to the driver.
    contexts: u64,
    /// Bit q: hardware queue q is in use. The last queue belongs to the driver.
    queues: u32,
    /// Context owning each hardware queue.
    owner: [u32; regs::MAX_QUEUES as usize],
    dram: crate::mem::RangeAllocator,
    /// Live buffer objects and the host memory they hold (leak checks).
    pub(crate) bos: u64,
    pub(crate) host_bo_bytes: u64,
}

impl Npu {
    /// Threaded part of every vector: wake all waiters (they re-check
    /// their own condition); the error vector first acknowledges and
    /// handles the faults the device reports.
    ///
    /// A queue vector reads no register. Fences live in the queues' status
    /// blocks in host memory, which every waiter reads itself, and the
    /// device raises a queue vector for every fence whether or not its
    /// IRQ_QUEUE_STATUS bit is still set, so that bit need not be cleared.
    /// Each register access is a round trip to the device (on the virtual
    /// NPU a message to the device model that stalls the CPU until
    /// answered, 40-100 us): reading and clearing both status registers
    /// made a fence interrupt three round trips.
    fn service_interrupts(&self, vector: u32) -> IrqReturn {
        if vector != regs::MSIX_ERROR_VECTOR {
            let mut ev = self.events.lock();
            ev.irqs = ev.irqs.wrapping_add(1);
            self.event_cv.notify_all();
            return IrqReturn::Handled;
        }
        let status = self.with_regs(|r| {
            let e = r.r32(regs::IRQ_ERROR_STATUS)?;
            // Write-1-to-clear exactly what was seen; nothing to clear is
            // no write.
            if e != 0 {
                r.w32(regs::IRQ_ERROR_STATUS, e)?;
            }
            Ok(e)
        });
        let Ok(e) = status else { return IrqReturn::None };
        // A device that fell off the bus reads all ones: not a fault of
        // every queue.
        if e == u32::MAX && !self.check_alive() {
            return IrqReturn::Handled;
        }
        let mut poison = 0u64;
        if e != 0 {
            let owner = self.alloc.lock().owner;
            for q in (0..self.hw.num_queues).filter(|q| e & (1 << q) != 0) {
                self.report_fault(q, owner[q as usize]);
                poison |= 1 << owner[q as usize];
            }
            // The device stopped the faulted queue and keeps its error
            // record (status block, registers) until the queue is destroyed.
            // Every other queue of a poisoned context is disabled.
            self.disable_context_queues(poison, e);
        }
        let mut ev = self.events.lock();
        ev.irqs = ev.irqs.wrapping_add(1);
        // Nothing pending is not an error (an error interrupt whose record
        // a waiter's own check already took). Still IRQ_HANDLED: IRQ_NONE
        // would let the core's spurious-interrupt detector disable a
        // healthy vector.
        if e == 0 {
            ev.spurious = ev.spurious.wrapping_add(1);
        }
        ev.faulted |= e;
        ev.poisoned |= poison;
        self.event_cv.notify_all();
        IrqReturn::Handled
    }

    /// Run `f` with the device as a bound device (for DMA allocations from
    /// file operations), or fail with ENODEV once unbinding started.
    pub(crate) fn with_bound<R>(&self, f: impl FnOnce(&kernel::device::Device<kernel::device::Bound>) -> Result<R>) -> Result<R> {
        let bound = self.bound.lock();
        if !*bound {
            return Err(ENODEV);
        }
        let dev: &kernel::device::Device = self.pdev.as_ref();
        // SAFETY: `bound` is held and true. Unbind clears it under this lock
        // before the driver lets go of the device (`RblnData::drop`), so the
        // device stays bound for the whole of `f`.
        f(unsafe { dev.as_bound() })
    }

    /// Zero [offset, offset+size) of DRAM with the driver's queue, so that a
    /// new buffer object never shows a previous owner's data.
    pub(crate) fn zero_dram(&self, offset: u64, size: u64) -> Result {
        let mut guard = self.engine.lock();
        let engine: &mut Option<crate::engine::KernelEngine> = &mut guard;
        engine.as_mut().ok_or(ENODEV)?.zero_dram(self, offset, size)
    }

    /// Q_BUSY_NS_64 of hardware queue `q` (0 once the device is gone).
    pub(crate) fn queue_busy_ns(&self, q: u32) -> u64 {
        if self.is_gone() {
            return 0;
        }
        self.with_regs(|r| r.r64(regs::queue_reg(q, regs::Q_BUSY_NS_64))).unwrap_or(0)
    }

    /// Unbinding, or lost: nothing can reach the device any more.
    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(kernel::sync::atomic::Relaxed) || self.lost.load(kernel::sync::atomic::Relaxed)
    }

    /// Read the identity register; a device that no longer returns "RBLN"
    /// there (all ones once it fell off the bus) is marked lost, every
    /// waiter is woken and fails with ENODEV. False once lost.
    pub(crate) fn check_alive(&self) -> bool {
        if self.lost.load(kernel::sync::atomic::Relaxed) {
            return false;
        }
        match self.with_regs(|r| r.r32(regs::ID)) {
            Ok(id) if id == regs::ID_VALUE => true,
            Ok(id) => {
                self.mark_lost(id);
                false
            }
            // Unbinding (the BAR is revoked): not lost, but not alive.
            Err(_) => false,
        }
    }

    fn mark_lost(&self, id: u32) {
        use kernel::sync::atomic::Relaxed;
        if self.lost.xchg(true, Relaxed) {
            return;
        }
        dev_err!(self.pdev, "rbln{}: device lost: identity register reads {:#x}; every wait and call now fails with ENODEV\n", self.index, id);
        // Without the events lock: callers may hold it (waiters check
        // liveness between naps). A waiter that misses this wake-up finds
        // the device lost at its next check, at most LIVENESS_MS later.
        self.event_cv.notify_all();
    }

    pub(crate) fn take_context(&self) -> Result<u32> {
        let mut a = self.alloc.lock();
        let free = (!a.contexts).trailing_zeros();
        if free >= regs::MAX_CONTEXTS - 1 {
            return Err(EBUSY);
        }
        a.contexts |= 1 << free;
        Ok(free)
    }

    pub(crate) fn put_context(&self, id: u32) {
        self.alloc.lock().contexts &= !(1u64 << id);
        self.events.lock().poisoned &= !(1u64 << id);
    }

    pub(crate) fn take_queue(&self, ctx: u32) -> Result<u32> {
        let mut a = self.alloc.lock();
        let free = (!a.queues).trailing_zeros();
        if free >= self.hw.num_queues - 1 {
            return Err(EBUSY);
        }
        a.queues |= 1 << free;
        a.owner[free as usize] = ctx;
        Ok(free)
    }

    pub(crate) fn put_queue(&self, q: u32) {
        self.alloc.lock().queues &= !(1u32 << q);
        self.clear_fault(q);
    }

    pub(crate) fn dram_alloc(&self, size: u64) -> Result<u64> {
        self.alloc.lock().dram.alloc(size).map_err(|_| ENOSPC)
    }

    pub(crate) fn dram_free(&self, offset: u64, size: u64) {
        let _ = self.alloc.lock().dram.free(offset, size);
    }

    /// Account a BO coming (`sign` > 0) or going, for the leak counters.
    pub(crate) fn account_bo(&self, host_bytes: u64, coming: bool) {
        let mut a = self.alloc.lock();
        if coming {
            a.bos += 1;
            a.host_bo_bytes += host_bytes;
        } else {
            a.bos = a.bos.saturating_sub(1);
            a.host_bo_bytes = a.host_bo_bytes.saturating_sub(host_bytes);
        }
    }

    /// Context and queue masks without the driver's own (the last of each).
    fn users_only(&self, contexts: u64, queues: u32) -> (u64, u32) {
        (contexts & !(1u64 << (regs::MAX_CONTEXTS - 1)), queues & !(1u32 << (self.hw.num_queues - 1)))
    }

    /// `RBLN_IOCTL_STATS`: counters and state at one moment. A device whose
    /// registers can no longer be read is reported lost, with zero counters.
    pub(crate) fn stats(&self) -> uapi::DeviceStats {
        let (contexts, queues, dram_free) = {
            let a = self.alloc.lock();
            (a.contexts, a.queues, a.dram.free_bytes())
        };
        let (faulted, hung, resets) = {
            let ev = self.events.lock();
            (ev.faulted, ev.hung, ev.resets)
        };
        // The driver's own context and queue are not counted.
        let (contexts, queues) = self.users_only(contexts, queues);
        let mut st = uapi::DeviceStats {
            timestamp_ns: self.bound_at.elapsed().as_nanos().max(0) as u64,
            contexts: contexts.count_ones(),
            queues: queues.count_ones(),
            faulted_queues: faulted.count_ones(),
            dram_free,
            resets,
            ..Default::default()
        };
        let read = self.with_regs(|r| {
            st.packets = r.r64(regs::CNT_PACKETS_64)?;
            st.dma_bytes = r.r64(regs::CNT_DMA_BYTES_64)?;
            st.compute_ops = r.r64(regs::CNT_COMPUTE_OPS_64)?;
            st.compute_flops = r.r64(regs::CNT_COMPUTE_FLOPS_64)?;
            st.faults = r.r64(regs::CNT_FAULTS_64)?;
            for (c, v) in st.core_busy_ns.iter_mut().enumerate().take(self.hw.num_cores as usize) {
                *v = r.r64(regs::CNT_CORE_BUSY_NS_64 + 8 * c as u64)?;
            }
            for (e, v) in st.dma_busy_ns.iter_mut().enumerate().take(self.hw.num_dma_engines as usize) {
                *v = r.r64(regs::CNT_DMA_BUSY_NS_64 + 8 * e as u64)?;
            }
            Ok(())
        });
        st.health = if !self.check_alive() || self.is_gone() || read.is_err() {
            st.packets = 0;
            st.dma_bytes = 0;
            st.compute_ops = 0;
            st.compute_flops = 0;
            st.faults = 0;
            st.core_busy_ns = [0; 8];
            st.dma_busy_ns = [0; 4];
            uapi::HEALTH_LOST
        } else if hung != 0 {
            uapi::HEALTH_HUNG
        } else if faulted != 0 {
            uapi::HEALTH_FAULTED
        } else {
            uapi::HEALTH_OK
        };
        st
    }

    /// Percent of the cores' time spent busy between the previous sample
    /// and now; a read takes a new sample when the previous one is at
    /// least 100 ms old and otherwise repeats the last figure.
    pub(crate) fn utilization(&self) -> u32 {
        let st = self.stats();
        if st.health == uapi::HEALTH_LOST {
            return 0;
        }
        // Saturating: the counters come from the device, and a sum that
        // overflowed would be an overflow panic on a sysfs read.
        let busy = st.core_busy_ns.iter().fold(0u64, |a, &b| a.saturating_add(b));
        let mut w = self.util.lock();
        let dt = st.timestamp_ns.saturating_sub(w.at_ns);
        if dt >= 100_000_000 {
            let cores = u64::from(self.hw.num_cores.max(1));
            let used = busy.saturating_sub(w.busy_ns);
            w.percent = used.saturating_mul(100).checked_div(dt.saturating_mul(cores)).unwrap_or(0).min(100) as u32;
            w.at_ns = st.timestamp_ns;
            w.busy_ns = busy;
        }
        w.percent
    }

    /// The debugfs `state` file: resources, interrupts, queues, counters.
    fn show_state(&self, f: &mut kernel::fmt::Formatter<'_>) -> kernel::fmt::Result {
        let (queues, owner, bos, host) = {
            let a = self.alloc.lock();
            (a.queues, a.owner, a.bos, a.host_bo_bytes)
        };
        let (irqs, faulted, poisoned, spurious, polled, missed, refused) = {
            let e = self.events.lock();
            (e.irqs, e.faulted, e.poisoned, e.spurious, e.polled_fences, e.missed_faults, e.status_refused)
        };
        let st = self.stats();
        writeln!(f, "device: rbln{} hw {}.{}", self.index, self.hw.version >> 16, self.hw.version & 0xffff)?;
        writeln!(f, "contexts_open: {}", st.contexts)?;
        writeln!(f, "queues_in_use: {}", st.queues)?;
        writeln!(f, "bos: {}", bos)?;
        writeln!(f, "host_bo_bytes: {}", host)?;
        writeln!(f, "dram_total_bytes: {}", self.hw.dram_size)?;
        writeln!(f, "dram_free_bytes: {}", st.dram_free)?;
        writeln!(f, "interrupts: {}", irqs)?;
        writeln!(f, "interrupts_spurious: {}", spurious)?;
        writeln!(f, "fences_found_by_polling: {}", polled)?;
        writeln!(f, "faults_found_by_polling: {}", missed)?;
        writeln!(f, "status_blocks_refused: {}", refused)?;
        writeln!(f, "faulted_queues: {:#x}", faulted)?;
        writeln!(f, "poisoned_contexts: {:#x}", poisoned)?;
        if st.health != uapi::HEALTH_LOST {
            writeln!(
                f,
                "hw_packets: {}\nhw_dma_bytes: {}\nhw_compute_ops: {}\nhw_compute_flops: {}\nhw_faults: {}",
                st.packets, st.dma_bytes, st.compute_ops, st.compute_flops, st.faults
            )?;
        }
        for q in (0..self.hw.num_queues).filter(|q| queues & (1 << q) != 0 && *q != self.hw.num_queues - 1) {
            let st = self.with_regs(|r| {
                Ok((
                    r.r32(regs::queue_reg(q, regs::Q_STATE))?,
                    r.r32(regs::queue_reg(q, regs::Q_HEAD))?,
                    r.r32(regs::queue_reg(q, regs::Q_TAIL))?,
                    r.r64(regs::queue_reg(q, regs::Q_FENCE_64))?,
                    r.r64(regs::queue_reg(q, regs::Q_PACKETS_64))?,
                ))
            });
            if let Ok((state, head, tail, fence, packets)) = st {
                let name = match hw::ring::QueueState::from_u32(state) {
                    Some(hw::ring::QueueState::Disabled) => "disabled",
                    Some(hw::ring::QueueState::Idle) => "idle",
                    Some(hw::ring::QueueState::Running) => "running",
                    Some(hw::ring::QueueState::Waiting) => "waiting",
                    Some(hw::ring::QueueState::Faulted) => "faulted",
                    None => "?",
                };
                writeln!(f, "queue {}: context {} {} head {} tail {} fence {} packets {}", q, owner[q as usize], name, head, tail, fence, packets)?;
            }
        }
        Ok(())
    }

    pub(crate) fn is_faulted(&self, q: u32) -> bool {
        self.events.lock().faulted & (1 << q) != 0
    }

    pub(crate) fn clear_fault(&self, q: u32) {
        let mut ev = self.events.lock();
        ev.faulted &= !(1u32 << q);
        ev.hung &= !(1u32 << q);
    }

    /// The privileged reset (sysfs `reset`): every user queue is reset and
    /// every open context poisoned (their waits and submissions fail with
    /// EIO; processes reopen the device), fault and hang records are
    /// cleared, and the device is healthy again for new contexts. The
    /// driver's own queue and DRAM contents are left alone. A lost device
    /// cannot be reset (ENODEV).
    pub(crate) fn reset(&self) -> Result {
        if !self.check_alive() {
            return Err(ENODEV);
        }
        let (contexts, queues) = {
            let a = self.alloc.lock();
            self.users_only(a.contexts, a.queues)
        };
        let mut ev = self.events.lock();
        for q in (0..self.hw.num_queues).filter(|q| queues & (1 << q) != 0) {
            self.with_regs(|r| r.w32(regs::queue_reg(q, regs::Q_CONTROL), regs::qctl::RESET))?;
        }
        ev.poisoned |= contexts;
        ev.faulted = 0;
        ev.hung = 0;
        ev.resets += 1;
        self.event_cv.notify_all();
        dev_warn!(self.pdev, "rbln{}: reset by an administrator: {} context(s) poisoned\n", self.index, contexts.count_ones());
        Ok(())
    }

    /// Wake every waiter so it re-checks its condition.
    pub(crate) fn wake_all(&self) {
        let _ev = self.events.lock();
        self.event_cv.notify_all();
    }

    /// Whether one more fault message may go to the kernel log: at most
    /// `LOG_BURST` per `LOG_WINDOW_MS`, the rest counted and summarised
    /// when the next window opens, so that a process faulting in a loop
    /// cannot flood the log (the faults themselves are all handled).
    fn log_fault_ok(&self) -> bool {
        use kernel::sync::atomic::Relaxed;
        let now = self.bound_at.elapsed().as_millis();
        let start = self.log_window.load(Relaxed);
        if now - start >= LOG_WINDOW_MS && self.log_window.cmpxchg(start, now, Relaxed).is_ok() {
            let n = self.log_count.xchg(0, Relaxed);
            if n > LOG_BURST {
                dev_warn!(self.pdev, "rbln{}: {} fault messages suppressed\n", self.index, n - LOG_BURST);
            }
        }
        self.log_count.fetch_add(1, Relaxed) < LOG_BURST
    }

    /// Log a queue's error record.
    fn report_fault(&self, q: u32, ctx: u32) {
        if !self.log_fault_ok() {
            return;
        }
        let rec = self.with_regs(|r| {
            Ok((r.r32(regs::queue_reg(q, regs::Q_FAULT_CODE))?, r.r64(regs::queue_reg(q, regs::Q_FAULT_ADDR_64))?))
        });
        if let Ok((code, addr)) = rec {
            let what = hw::ring::FaultCode::from_u8(code as u8).map_or("unknown fault", |c| c.name());
            let access = match (code >> 8) & 0xff {
                1 => "read",
                2 => "write",
                _ => "-",
            };
            dev_warn!(self.pdev, "rbln{}: queue {} (context {}): {} at {:#x} ({})\n", self.index, q, ctx, what, addr, access);
        }
    }

    /// A job on queue `q` of context `ctx` made no progress for the hang
    /// limit: stop it, fail its fences and poison the context.
    pub(crate) fn declare_hang(&self, ev: &mut Events, q: u32, ctx: u32, ms: u32) {
        dev_warn!(self.pdev, "rbln{}: queue {} (context {}) made no progress for {} ms: reset\n", self.index, q, ctx, ms);
        let _ = self.with_regs(|r| r.w32(regs::queue_reg(q, regs::Q_CONTROL), regs::qctl::RESET));
        ev.faulted |= 1 << q;
        ev.hung |= 1 << q;
        ev.poisoned |= 1 << ctx;
        self.disable_context_queues(1 << ctx, 1 << q);
        self.event_cv.notify_all();
    }

    /// A waiter found queue `q` (of context `ctx`) Faulted twice with no
    /// error interrupt for it: handle the fault as that interrupt would
    /// have (its status bit is acknowledged so it is not reported again).
    pub(crate) fn missed_fault(&self, ev: &mut Events, q: u32, ctx: u32) {
        dev_warn!(self.pdev, "rbln{}: queue {} faulted without an error interrupt (found by its waiter)\n", self.index, q);
        self.report_fault(q, ctx);
        let _ = self.with_regs(|r| r.w32(regs::IRQ_ERROR_STATUS, 1 << q));
        ev.missed_faults = ev.missed_faults.wrapping_add(1);
        ev.faulted |= 1 << q;
        ev.poisoned |= 1 << ctx;
        self.disable_context_queues(1 << ctx, 1 << q);
        self.event_cv.notify_all();
    }

    /// Queue `q`'s status block was refused as corrupt (reported once per
    /// queue; the registers stand in for it).
    pub(crate) fn warn_corrupt_status(&self, q: u32) {
        dev_warn!(self.pdev, "rbln{}: queue {}: corrupt status block write-back refused; reading the registers instead\n", self.index, q);
    }

    /// Disable every queue of the contexts in `poison` except those in
    /// `skip`, so that user-mode submission on them stops too.
    fn disable_context_queues(&self, poison: u64, skip: u32) {
        let (owner, in_use) = {
            let a = self.alloc.lock();
            (a.owner, a.queues)
        };
        for q in (0..self.hw.num_queues).filter(|q| in_use & (1 << q) != 0 && poison & (1 << owner[*q as usize]) != 0) {
            if skip & (1 << q) == 0 {
                let _ = self.with_regs(|r| r.w32(regs::queue_reg(q, regs::Q_CONTROL), 0));
            }
        }
    }

    pub(crate) fn is_poisoned(&self, ctx: u32) -> bool {
        self.events.lock().poisoned & (1 << ctx) != 0
    }

    /// Map hardware queue `q`'s doorbell page (only that page) into `vma`,
    /// uncached.
    pub(crate) fn mmap_doorbell(&self, q: u32, vma: &kernel::mm::virt::VmaNew) -> Result {
        // Held bound for the whole call (a mutex, so remap may sleep): the
        // BAR's physical range is ours to hand out only while bound.
        self.with_bound(|_| self.mmap_doorbell_bound(q, vma))
    }

    fn mmap_doorbell_bound(&self, q: u32, vma: &kernel::mm::virt::VmaNew) -> Result {
        let start = self.pdev.resource_start(hw::pci::BAR_DOORBELL)?;
        let phys = start + hw::pci::doorbell_page_offset(q);
        vma.set_io();
        vma.set_dontexpand();
        vma.set_dontcopy();
        vma.set_dontdump();
        let raw = vma.as_ptr();
        // SAFETY: `raw` is the VMA being set up by this mmap call. The
        // doorbell page is MMIO: map it uncached (x86 PCD|PWT bits).
        let prot = unsafe {
            let mut p = (*raw).vm_page_prot;
            p.pgprot |= (1 << 4) | (1 << 3);
            p
        };
        // SAFETY: `raw` is valid (above); the range is exactly one page of
        // BAR4 belonging to queue `q`, which the caller owns; the VMA is
        // one page long (checked by the caller) and marked VM_IO.
        kernel::error::to_result(unsafe {
            bindings::remap_pfn_range(raw, vma.start() as _, (phys >> hw::PAGE_SHIFT) as _, hw::PAGE_SIZE as _, prot)
        })
    }

    /// Ring queue `q`'s doorbell with the new tail.
    pub(crate) fn ring_doorbell(&self, q: u32, tail: u32) -> Result {
        use kernel::io::Io;
        let bar = self.doorbells.try_access().ok_or(ENODEV)?;
        bar.try_write32(tail, hw::pci::doorbell_page_offset(q) as usize)
    }

    /// Run `f` with the register BAR, or fail with ENODEV once unbound.
    pub(crate) fn with_regs<R>(&self, f: impl FnOnce(&Regs<'_>) -> Result<R>) -> Result<R> {
        let bar = self.regs.try_access().ok_or(ENODEV)?;
        f(&Regs(&bar))
    }
}

/// Typed access to BAR0 at runtime-computed offsets (bounds-checked).
///
/// Writes return once they have taken effect. MMIO writes are posted (on
/// PCIe, and by QEMU's vfio-user client: hardware.md 15.3): the CPU
/// moves on while the write is still on its way, so a queue reset or an
/// MMU invalidation could otherwise still be pending when the memory the
/// queue or the translation used is freed, and the device would write its
/// status block into a page the kernel has handed to someone else. Each
/// write is therefore followed by a read of `ID`, which the device
/// answers only after every earlier write (the PCI flush idiom; the
/// device handles BAR accesses in order, a stop completing before the
/// next access). Doorbells (BAR4, `Npu::ring_doorbell`) stay posted.
pub(crate) struct Regs<'a>(&'a pci::Bar<'a, REGS_SIZE>);

impl Regs<'_> {
    pub(crate) fn r32(&self, off: u64) -> Result<u32> {
        use kernel::io::Io;
        self.0.try_read32(off as usize)
    }

    pub(crate) fn w32(&self, off: u64, v: u32) -> Result {
        use kernel::io::Io;
        self.0.try_write32(v, off as usize)?;
        self.flush()
    }

    pub(crate) fn r64(&self, off: u64) -> Result<u64> {
        use kernel::io::Io;
        self.0.try_read64(off as usize)
    }

    pub(crate) fn w64(&self, off: u64, v: u64) -> Result {
        use kernel::io::Io;
        self.0.try_write64(v, off as usize)?;
        self.flush()
    }

    /// Waits until every earlier write has reached the device and taken
    /// effect (a read cannot pass posted writes).
    fn flush(&self) -> Result {
        use kernel::io::Io;
        self.0.try_read32(regs::ID as usize).map(|_| ())
    }
}

/// Holds the misc device next to the state its `open` needs: `open` finds
/// this struct from the registration it is given (see `file.rs`).
#[pin_data]
pub(crate) struct MiscHolder {
    #[pin]
    pub(crate) reg: MiscDeviceRegistration<RblnFile>,
    pub(crate) npu: Arc<Npu>,
}

/// An interrupt vector's handler.
pub(crate) struct Irq {
    npu: Arc<Npu>,
    /// The MSI-X vector (0: errors; 1..: queue fences).
    vector: u32,
}

impl ThreadedHandler for Irq {
    fn handle_threaded(&self) -> IrqReturn {
        self.npu.service_interrupts(self.vector)
    }
}

/// The MSI-X vector allocation, boxed so that the handlers registered on
/// its vectors can borrow it for the device's bound lifetime.
struct Vectors<'bound>(NonNull<pci::IrqVectorRegistration<'bound>>);

// SAFETY: the registration holds a `&Device<Bound>` (Sync) and a length;
// moving that between threads is fine.
unsafe impl Send for Vectors<'_> {}

/// debugfs: `<debugfs>/rblnN/state` (see `Npu::show_state`). The file
/// goes before its directory.
struct Debugfs {
    _state: Pin<KBox<kernel::debugfs::File<Arc<Npu>>>>,
    _dir: kernel::debugfs::Dir,
}

fn show_state(npu: &Arc<Npu>, f: &mut kernel::fmt::Formatter<'_>) -> kernel::fmt::Result {
    npu.show_state(f)
}

/// Per-bound-device driver data. Dropped on unbind: IRQ handlers first,
/// then the vectors they used, then the hardware is quiesced.
pub(crate) struct RblnData<'bound> {
    _debugfs: Debugfs,
    npu: Arc<Npu>,
    misc: Option<Pin<KBox<MiscHolder>>>,
    irqs: KVec<Pin<KBox<ThreadedRegistration<'bound, Irq>>>>,
    vectors: Vectors<'bound>,
}

pub(crate) struct RblnDriver;

// QEMU's vendor ID 0x1234 has no named constant in the kernel, so the table
// matches the class (processing accelerator) and probe checks the IDs
// before touching anything.
kernel::pci_device_table!(
    PCI_TABLE,
    <RblnDriver as pci::Driver>::IdInfo,
    [(pci::DeviceId::from_class(hw::pci::CLASS_CODE, 0xffffff), ())]
);

/// Check identity and version, then reset the device.
fn init_hw(pdev: &pci::Device<Core<'_>>, r: &Regs<'_>) -> Result<HwInfo> {
    let id = r.r32(regs::ID)?;
    if id != regs::ID_VALUE {
        dev_err!(pdev, "identity register reads {:#x}, not \"RBLN\"; refusing the device\n", id);
        return Err(ENODEV);
    }
    let version = r.r32(regs::VERSION)?;
    if version >> 16 != hw::HW_VERSION_MAJOR {
        dev_err!(
            pdev,
            "hardware version {}.{} is not supported (driver speaks {}.x); refusing the device\n",
            version >> 16,
            version & 0xffff,
            hw::HW_VERSION_MAJOR
        );
        return Err(ENODEV);
    }
    r.w32(regs::DEVICE_RESET, regs::RESET_MAGIC)?;
    if r.r32(regs::STATUS)? & regs::status::READY == 0 {
        dev_err!(pdev, "device not ready after reset\n");
        return Err(EIO);
    }
    let info = HwInfo {
        version,
        caps: r.r32(regs::CAPS)?,
        num_queues: r.r32(regs::NUM_QUEUES)?,
        num_cores: r.r32(regs::NUM_CORES)?,
        num_dma_engines: r.r32(regs::NUM_DMA_ENGINES)?,
        dram_size: r.r64(regs::DRAM_SIZE_64)?,
    };
    if info.num_queues == 0 || info.num_queues > regs::MAX_QUEUES {
        dev_err!(pdev, "implausible queue count {}\n", info.num_queues);
        return Err(ENODEV);
    }
    Ok(info)
}

/// Allocate the MSI-X vectors and register a handler on each.
fn setup_irqs<'bound>(
    pdev: &'bound pci::Device<Core<'_>>,
    npu: &Arc<Npu>,
) -> Result<(Vectors<'bound>, KVec<Pin<KBox<ThreadedRegistration<'bound, Irq>>>>)> {
    let n = regs::MSIX_VECTORS;
    let types = pci::IrqTypes::default().with(pci::IrqType::MsiX);
    let vectors = KBox::new(pdev.alloc_irq_vectors(n, n, types)?, GFP_KERNEL)?;
    let raw = NonNull::from(KBox::leak(vectors));
    // SAFETY: `raw` comes from `KBox::leak` just above and is only freed by
    // `RblnData::drop`, after every handler borrowing it was dropped; the
    // data is dropped within the device's bound lifetime.
    let vref: &'bound pci::IrqVectorRegistration<'bound> = unsafe { raw.as_ref() };
    let mut irqs = KVec::new();
    for i in 0..n as usize {
        let registration = vref.index(i).and_then(|vector| {
            let handler = Irq { npu: npu.clone(), vector: i as u32 };
            // SAFETY: the registration is kept in `irqs` and dropped in
            // `RblnData::drop`; it is never forgotten.
            let init = unsafe { ThreadedRegistration::new(vector.into(), irq::Flags::ONESHOT, c"rbln", Ok::<_, Error>(handler)) };
            KBox::pin_init(init, GFP_KERNEL)
        });
        match registration.and_then(|r| irqs.push(r, GFP_KERNEL).map_err(Error::from)) {
            Ok(()) => {}
            Err(e) => {
                drop(irqs);
                // SAFETY: as above; no handler borrows the vectors any more.
                drop(unsafe { KBox::from_raw(raw.as_ptr()) });
                return Err(e);
            }
        }
    }
    Ok((Vectors(raw), irqs))
}

impl pci::Driver for RblnDriver {
    type IdInfo = ();
    type Data<'bound> = RblnData<'bound>;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        if pdev.vendor_id().as_raw() != hw::pci::VENDOR_ID || pdev.device_id() != hw::pci::DEVICE_ID {
            return Err(ENODEV);
        }
        pdev.enable_device_mem()?;
        pdev.set_master();

        let regs = pdev.iomap_region_sized::<REGS_SIZE>(hw::pci::BAR_REGS, c"rbln-regs")?.into_devres()?;
        let hw_info = {
            let bar = regs.access(pdev.as_ref())?;
            init_hw(pdev, &Regs(bar))?
        };
        let doorbells = pdev.iomap_region(hw::pci::BAR_DOORBELL, c"rbln-doorbells")?.into_devres()?;
        // The device takes 64-bit bus addresses: no bounce buffering.
        // SAFETY: probe runs before any DMA mapping of this device exists.
        unsafe { kernel::dma::Device::dma_set_mask_and_coherent(pdev, kernel::dma::DmaMask::new::<64>()) }?;
        let dram = crate::mem::RangeAllocator::new(0, hw_info.dram_size)?;
        let index = take_index()?;
        let npu = Arc::pin_init(
            try_pin_init!(Npu {
                index,
                pdev: ARef::from(&**pdev),
                regs,
                doorbells,
                hw: hw_info,
                events <- new_mutex!(Events::default()),
                event_cv <- new_condvar!(),
                alloc <- new_mutex!(Resources {
                    contexts: 1 << (regs::MAX_CONTEXTS - 1),
                    queues: 1 << (hw_info.num_queues - 1),
                    // The driver's queue belongs to the driver's context.
                    owner: {
                        let mut o = [0; regs::MAX_QUEUES as usize];
                        o[(hw_info.num_queues - 1) as usize] = regs::MAX_CONTEXTS - 1;
                        o
                    },
                    dram,
                    bos: 0,
                    host_bo_bytes: 0,
                }),
                bound <- new_mutex!(true),
                gone: kernel::sync::atomic::Atomic::new(false),
                lost: kernel::sync::atomic::Atomic::new(false),
                bound_at: kernel::time::Instant::now(),
                log_count: kernel::sync::atomic::Atomic::new(0),
                log_window: kernel::sync::atomic::Atomic::new(0),
                util <- new_mutex!(UtilSample::default()),
                engine <- new_mutex!(None),
            }),
            GFP_KERNEL,
        );
        let npu = match npu {
            Ok(n) => n,
            Err(e) => {
                put_index(index);
                return Err(e);
            }
        };
        let (vectors, irqs) = match setup_irqs(pdev, &npu) {
            Ok(v) => v,
            Err(e) => {
                dev_err!(pdev, "cannot set up MSI-X interrupts: {:?}\n", e);
                put_index(index);
                return Err(e);
            }
        };
        // Interrupts on from here on; the self-test proves they arrive.
        let unmask = npu.with_regs(|r| {
            r.w32(regs::IRQ_QUEUE_MASK, 0)?;
            r.w32(regs::IRQ_ERROR_MASK, 0)
        });
        let tested = unmask.and_then(|()| {
            let mut engine = crate::engine::KernelEngine::new(pdev.as_ref(), &npu)?;
            let us = engine.self_test(&npu);
            *npu.engine.lock() = Some(engine);
            us
        });
        match tested {
            Ok(us) => dev_info!(pdev, "rbln{}: self-test passed: fence interrupt after {} us\n", index, us),
            Err(e) => {
                dev_err!(pdev, "rbln{}: self-test failed ({:?}); refusing the device\n", index, e);
                if let Some(engine) = npu.engine.lock().take() {
                    engine.stop(&npu);
                }
                drop(irqs);
                // SAFETY: the vectors were leaked by `setup_irqs`; their
                // handlers are gone.
                drop(unsafe { KBox::from_raw(vectors.0.as_ptr()) });
                put_index(index);
                return Err(e);
            }
        }
        let for_files = npu.clone();
        let misc = KBox::pin_init(
            try_pin_init!(MiscHolder {
                reg <- MiscDeviceRegistration::register(MiscDeviceOptions { name: DEVICE_NAMES[index] }),
                npu: for_files,
            }),
            GFP_KERNEL,
        );
        let misc = match misc {
            Ok(m) => {
                crate::sysfs::create(&m.reg, &npu);
                m
            }
            Err(e) => {
                drop(irqs);
                // SAFETY: as above.
                drop(unsafe { KBox::from_raw(vectors.0.as_ptr()) });
                put_index(index);
                return Err(e);
            }
        };
        dev_info!(
            pdev,
            "rbln{}: NPU hw {}.{}, {} MiB DRAM, {} queues, {} cores, {} DMA engines\n",
            index,
            hw_info.version >> 16,
            hw_info.version & 0xffff,
            hw_info.dram_size >> 20,
            hw_info.num_queues,
            hw_info.num_cores,
            hw_info.num_dma_engines
        );
        let dir = kernel::debugfs::Dir::new(DEVICE_NAMES[index]);
        let for_debugfs = npu.clone();
        let state = KBox::pin_init(dir.read_callback_file(c"state", for_debugfs, &show_state), GFP_KERNEL);
        let debugfs = match state {
            Ok(state) => Debugfs { _state: state, _dir: dir },
            Err(e) => {
                drop(irqs);
                // SAFETY: as above.
                drop(unsafe { KBox::from_raw(vectors.0.as_ptr()) });
                put_index(index);
                return Err(e);
            }
        };
        Ok(RblnData { _debugfs: debugfs, npu, misc: Some(misc), irqs, vectors })
    }
}

impl Drop for RblnData<'_> {
    fn drop(&mut self) {
        // Open files lose the bound device first (`Npu::with_bound`), and
        // sleeping waiters learn about it.
        self.npu.gone.store(true, kernel::sync::atomic::Relaxed);
        *self.npu.bound.lock() = false;
        self.npu.wake_all();
        if let Some(engine) = self.npu.engine.lock().take() {
            engine.stop(&self.npu);
        }
        // Quiesce the hardware while the BAR is still mapped, then free the
        // interrupt handlers before the vectors they borrow.
        let _ = self.npu.with_regs(|r| r.w32(regs::DEVICE_RESET, regs::RESET_MAGIC));
        self.irqs.clear();
        // SAFETY: `vectors` was leaked by `setup_irqs`; no handler borrows it
        // any more (cleared just above) and it is freed exactly once here.
        drop(unsafe { KBox::from_raw(self.vectors.0.as_ptr()) });
        // The name rblnN is free again only once its node is gone.
        drop(self.misc.take());
        put_index(self.npu.index);
        dev_info!(self.npu.pdev, "rbln{}: removed\n", self.npu.index);
    }
}
