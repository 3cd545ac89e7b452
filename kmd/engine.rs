// SPDX-License-Identifier: GPL-2.0

//! The driver's own queue and context ("kernel engine"): all of device DRAM
//! mapped, used to zero DRAM buffer objects before they are handed out (no
//! data leaks between contexts) and, at probe, as the self-test that proves
//! DMA, the device MMU, the doorbell and MSI-X delivery work.

use kernel::{
    device::{Bound, Device},
    prelude::*,
    time::{msecs_to_jiffies, Instant, Monotonic},
};

use crate::hw::{
    cmd::{self, Opcode},
    mmu::{self, Target},
    regs::{self, qctl},
    ring::{QueueStatus, RingEntry},
    PAGE_SIZE,
};
use crate::mem::{HostMem, PageTables};
use crate::npu::Npu;

/// Device DRAM is mapped at this VA in the engine's context.
const DRAM_VA: u64 = 1 << 32;
/// Command buffers are built in one page at this VA.
const CMDS_VA: u64 = 1 << 30;
/// One job: FILL (24 bytes) + FENCE (24 bytes), or NOP + FENCE.
const JOB_SIZE: usize = 48;
const RING_ENTRIES: u32 = 128;
/// Longest a job may take: a 1 GiB FILL takes well under a second.
const TIMEOUT_MS: u32 = 10_000;

pub(crate) struct KernelEngine {
    ctx: u32,
    hw: u32,
    _tables: PageTables,
    ring: HostMem,
    status: HostMem,
    cmds: HostMem,
    tail: u32,
    next_fence: u64,
}

impl KernelEngine {
    /// Map all of DRAM, program the driver's context (the last id) and
    /// queue (the last one), and enable the queue.
    pub(crate) fn new(dev: &Device<Bound>, npu: &Npu) -> Result<Self> {
        let (ctx, hw) = (regs::MAX_CONTEXTS - 1, npu.hw.num_queues - 1);
        let mut tables = PageTables::new(dev)?;
        let (ring, status, cmds) = (HostMem::new(dev, 1)?, HostMem::new(dev, 1)?, HostMem::new(dev, 1)?);
        tables.set(dev, CMDS_VA, mmu::leaf_pte(cmds.dma(0), Target::Host, true, false))?;
        let mut off = 0;
        while off < npu.hw.dram_size {
            tables.set(dev, DRAM_VA + off, mmu::leaf_pte(off, Target::Dram, true, true))?;
            off += PAGE_SIZE;
        }
        let (root, ring_base, status_addr) = (tables.root(), ring.dma(0), status.dma(0));
        npu.with_regs(|r| {
            r.w64(regs::ctx_reg(ctx, regs::CTX_PT_ROOT_64), root)?;
            r.w32(regs::ctx_reg(ctx, regs::CTX_CONTROL), regs::CTX_CONTROL_VALID)?;
            r.w32(regs::queue_reg(hw, regs::Q_CONTROL), qctl::RESET)?;
            r.w64(regs::queue_reg(hw, regs::Q_RING_BASE_64), ring_base)?;
            r.w32(regs::queue_reg(hw, regs::Q_RING_SIZE), RING_ENTRIES)?;
            r.w32(regs::queue_reg(hw, regs::Q_CTX_ID), ctx)?;
            r.w64(regs::queue_reg(hw, regs::Q_STATUS_ADDR_64), status_addr)?;
            r.w32(regs::queue_reg(hw, regs::Q_CONTROL), qctl::ENABLE)
        })?;
        Ok(Self { ctx, hw, _tables: tables, ring, status, cmds, tail: 0, next_fence: 1 })
    }

    /// Run `first` followed by a FENCE with interrupt and wait for it;
    /// returns the microseconds from doorbell to the serviced interrupt.
    fn run(&mut self, npu: &Npu, first: &[u8]) -> Result<i64> {
        let fence = self.next_fence;
        let pkt = cmd::Fence {
            header: cmd::header(Opcode::Fence, cmd::FENCE_FLAG_IRQ, (cmd::Fence::SIZE / 4) as u16),
            reserved: 0,
            value: fence,
            addr_va: 0,
        }
        .to_bytes();
        let slot = self.tail as usize % (PAGE_SIZE as usize / JOB_SIZE);
        self.cmds.write(slot * JOB_SIZE, first)?;
        self.cmds.write(slot * JOB_SIZE + first.len(), &pkt)?;
        let entry = RingEntry {
            cmdbuf_va: CMDS_VA + (slot * JOB_SIZE) as u64,
            cmdbuf_size: (first.len() + pkt.len()) as u32,
            ..Default::default()
        };
        self.ring.write(self.tail as usize * RingEntry::SIZE, &entry.to_bytes())?;
        self.tail = (self.tail + 1) % RING_ENTRIES;
        self.next_fence = self.next_fence.wrapping_add(1);
        let irqs_before = npu.events.lock().irqs;
        let start = Instant::<Monotonic>::now();
        npu.ring_doorbell(self.hw, self.tail)?;
        let done = || self.status.read_u64(core::mem::offset_of!(QueueStatus, fence)).unwrap_or(0) >= fence;
        let mut ev = npu.events.lock();
        let mut left = msecs_to_jiffies(TIMEOUT_MS);
        loop {
            // Done once the fence landed and its interrupt was serviced.
            if done() && ev.irqs != irqs_before {
                return Ok(start.elapsed().as_micros_ceil());
            }
            if npu.is_gone() || !npu.check_alive() {
                return Err(ENODEV);
            }
            if ev.faulted & (1 << self.hw) != 0 {
                return Err(EIO);
            }
            if left == 0 {
                let state = npu.with_regs(|r| r.r32(regs::queue_reg(self.hw, regs::Q_STATE))).unwrap_or(u32::MAX);
                dev_err!(npu.pdev, "rbln{}: driver job {} timed out (queue state {})\n", npu.index, fence, state);
                return Err(ETIMEDOUT);
            }
            // Uninterruptible in effect: a signal must not leave a BO half
            // zeroed, so keep waiting (bounded by TIMEOUT_MS).
            // In naps, so that a lost device is noticed (check_alive above).
            let nap = left.min(msecs_to_jiffies(crate::ctx::LIVENESS_MS));
            match npu.event_cv.wait_interruptible_timeout(&mut ev, nap) {
                kernel::sync::CondVarTimeoutResult::Timeout => left = left.saturating_sub(nap),
                kernel::sync::CondVarTimeoutResult::Woken { jiffies }
                | kernel::sync::CondVarTimeoutResult::Signal { jiffies } => left = left.saturating_sub(nap.saturating_sub(jiffies)),
            }
        }
    }

    /// A NOP job: the probe self-test.
    pub(crate) fn self_test(&mut self, npu: &Npu) -> Result<i64> {
        let mut nop = [0u8; JOB_SIZE / 2];
        nop[..4].copy_from_slice(&cmd::header(Opcode::Nop, 0, (JOB_SIZE / 2 / 4) as u16).to_le_bytes());
        self.run(npu, &nop)
    }

    /// Fill [offset, offset+size) of DRAM with zeros.
    pub(crate) fn zero_dram(&mut self, npu: &Npu, offset: u64, size: u64) -> Result {
        let fill = cmd::Fill {
            header: cmd::header(Opcode::Fill, 0, (cmd::Fill::SIZE / 4) as u16),
            value: 0,
            dst_va: DRAM_VA + offset,
            size,
        }
        .to_bytes();
        self.run(npu, &fill).map(|_| ())
    }

    /// Stop the queue and retire the context (before the memory goes).
    pub(crate) fn stop(&self, npu: &Npu) {
        let _ = npu.with_regs(|r| {
            r.w32(regs::queue_reg(self.hw, regs::Q_CONTROL), qctl::RESET)?;
            r.w32(regs::ctx_reg(self.ctx, regs::CTX_CONTROL), 0)?;
            r.w32(regs::MMU_INVALIDATE, self.ctx)
        });
    }
}
