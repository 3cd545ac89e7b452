// SPDX-License-Identifier: GPL-2.0

//! Probe-time self-test: run a NOP + FENCE(IRQ) job through a kernel-owned
//! context and queue, and wait for the fence interrupt. Proves that DMA
//! into kernel memory, the device MMU, the doorbell and MSI-X delivery all
//! work before the device is offered to user space.

use kernel::{
    dma::Coherent,
    pci,
    prelude::*,
    sync::Arc,
    time::{msecs_to_jiffies, Instant, Monotonic},
};

use crate::hw::{
    cmd::{self, Opcode},
    mmu::{self, Target},
    regs::{self, qctl},
    ring::RingEntry,
    PAGE_SIZE,
};
use crate::npu::Npu;

// Pages of the test's coherent buffer.
const L2: usize = 0;
const L1: usize = 1;
const L0: usize = 2;
const CMDS: usize = 3;
const RING: usize = 4;
const STATUS: usize = 5;
const PAGES: usize = 6;
/// Where the command buffer sits in the test context.
const VA: u64 = 1 << 30;
const FENCE_VALUE: u64 = 0x5e1f_7e57;
const TIMEOUT_MS: u32 = 5000;

/// Write `bytes` at byte `off` of page `page` of `mem`.
fn put(mem: &Coherent<[u64]>, page: usize, off: usize, bytes: &[u8]) -> Result {
    let start = page * PAGE_SIZE as usize + off;
    if start + bytes.len() > mem.size() {
        return Err(EINVAL);
    }
    // SAFETY: the range is inside the allocation (checked above), and the
    // device does not access this memory before the doorbell is rung.
    unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), mem.as_mut_ptr().cast::<u8>().add(start), bytes.len()) };
    Ok(())
}

/// Run the self-test on the last queue and context; returns the
/// microseconds from doorbell to fence interrupt.
pub(crate) fn run(pdev: &pci::Device<kernel::device::Core<'_>>, npu: &Arc<Npu>) -> Result<i64> {
    let mem = Coherent::<u64>::zeroed_slice(pdev.as_ref(), PAGES * 512, GFP_KERNEL)?;
    let base = mem.dma_address();
    let page = |i: usize| base + (i as u64) * PAGE_SIZE;

    // Page tables: VA -> the command page, read-only.
    put(&mem, L2, mmu::va_index(VA, 2) * 8, &mmu::table_pte(page(L1)).to_le_bytes())?;
    put(&mem, L1, mmu::va_index(VA, 1) * 8, &mmu::table_pte(page(L0)).to_le_bytes())?;
    put(&mem, L0, mmu::va_index(VA, 0) * 8, &mmu::leaf_pte(page(CMDS), Target::Host, true, false).to_le_bytes())?;

    // NOP, then FENCE with interrupt.
    let nop = cmd::header(Opcode::Nop, 0, 1).to_le_bytes();
    let fence = cmd::Fence {
        header: cmd::header(Opcode::Fence, cmd::FENCE_FLAG_IRQ, (cmd::Fence::SIZE / 4) as u16),
        reserved: 0,
        value: FENCE_VALUE,
        addr_va: 0,
    }
    .to_bytes();
    put(&mem, CMDS, 0, &nop)?;
    put(&mem, CMDS, nop.len(), &fence)?;
    let entry = RingEntry { cmdbuf_va: VA, cmdbuf_size: (nop.len() + fence.len()) as u32, ..Default::default() };
    put(&mem, RING, 0, &entry.to_bytes())?;

    let ctx = regs::MAX_CONTEXTS - 1;
    let q = npu.hw.num_queues - 1;
    let irqs_before = npu.events.lock().irqs;
    npu.with_regs(|r| {
        r.w64(regs::ctx_reg(ctx, regs::CTX_PT_ROOT_64), page(L2))?;
        r.w32(regs::ctx_reg(ctx, regs::CTX_CONTROL), regs::CTX_CONTROL_VALID)?;
        r.w64(regs::queue_reg(q, regs::Q_RING_BASE_64), page(RING))?;
        r.w32(regs::queue_reg(q, regs::Q_RING_SIZE), 2)?;
        r.w32(regs::queue_reg(q, regs::Q_CTX_ID), ctx)?;
        r.w64(regs::queue_reg(q, regs::Q_STATUS_ADDR_64), page(STATUS))?;
        r.w32(regs::queue_reg(q, regs::Q_CONTROL), qctl::ENABLE)
    })?;

    let start = Instant::<Monotonic>::now();
    npu.ring_doorbell(q, 1)?;
    let fence_of = || npu.with_regs(|r| r.r64(regs::queue_reg(q, regs::Q_FENCE_64)));
    let mut result = Err(ETIMEDOUT);
    {
        let mut ev = npu.events.lock();
        let mut left = msecs_to_jiffies(TIMEOUT_MS);
        loop {
            // Done once the fence landed *and* its interrupt was serviced.
            if fence_of()? == FENCE_VALUE && ev.irqs > irqs_before {
                result = Ok(start.elapsed().as_micros_ceil());
                break;
            }
            if left == 0 {
                break;
            }
            match npu.event_cv.wait_interruptible_timeout(&mut ev, left) {
                kernel::sync::CondVarTimeoutResult::Timeout => left = 0,
                kernel::sync::CondVarTimeoutResult::Woken { jiffies } => left = jiffies,
                kernel::sync::CondVarTimeoutResult::Signal { .. } => {
                    result = Err(ERESTARTSYS);
                    break;
                }
            }
        }
    }
    if result.is_err() {
        let fence = fence_of().unwrap_or(0);
        let state = npu.with_regs(|r| r.r32(regs::queue_reg(q, regs::Q_STATE))).unwrap_or(u32::MAX);
        dev_err!(pdev, "self-test: fence {:#x} (want {:#x}), queue state {}, no interrupt within {} ms\n", fence, FENCE_VALUE, state, TIMEOUT_MS);
    }
    // Tear down: the queue stops and forgets the ring before `mem` is freed.
    npu.with_regs(|r| {
        r.w32(regs::queue_reg(q, regs::Q_CONTROL), qctl::RESET)?;
        r.w32(regs::ctx_reg(ctx, regs::CTX_CONTROL), 0)?;
        r.w32(regs::MMU_INVALIDATE, ctx)
    })?;
    drop(mem);
    result
}
