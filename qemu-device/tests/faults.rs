//! Fault injection in the device model (docs/reliability.md): each plan
//! misbehaves exactly as documented, only for the events it selects, and
//! the device stays healthy (no panic, other queues unaffected).

mod common;

use std::time::{Duration, Instant};

use common::*;
use rbln_hw::cmd::{Encoder, SEM_COND_EQ};
use rbln_hw::pci::BAR_REGS;
use rbln_hw::regs;
use rbln_hw::ring::{FaultCode, QueueState};
use rbln_npu::faults::Plan;

const T: Duration = Duration::from_secs(10);

/// A command buffer written by `f`.
fn cmds(f: impl FnOnce(&mut Encoder<Vec<u8>>)) -> Vec<u8> {
    let mut e = Encoder::new(Vec::new());
    f(&mut e);
    e.buf
}

fn plan(s: &str) -> Plan {
    s.parse().unwrap()
}

/// A rig with every interrupt unmasked, one context and queue 2 on it.
fn rig() -> (Rig, Ctx, Queue) {
    let mut rig = Rig::new();
    rig.set32(regs::IRQ_QUEUE_MASK, 0);
    rig.set32(regs::IRQ_ERROR_MASK, 0);
    let ctx = rig.context(1);
    let q = rig.queue(2, &ctx, 16);
    (rig, ctx, q)
}

fn fence_job(value: u64) -> Vec<u8> {
    cmds(|e| {
        e.fence(value, 0, true);
    })
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < T, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn dropped_and_delayed_interrupts() {
    let (mut rig, ctx, mut q) = rig();
    let v = regs::queue_vector(2);
    rig.dev.inject(plan("irq-drop:after=1,count=2"));
    for i in 1..=4 {
        rig.run(&ctx, &mut q, 0x10_0000 * i, &fence_job(i));
        assert_eq!(rig.wait_idle(&q, T).fence, i);
    }
    // The first passes, the next two are dropped, the fourth passes; the
    // status bits are set regardless (a driver that polls finds them).
    until("the fourth interrupt", || rig.irqs.get(v) == 2);
    assert_eq!(rig.reg32(regs::IRQ_QUEUE_STATUS), 1 << 2);

    rig.dev.inject(plan("irq-delay:ms=300"));
    rig.run(&ctx, &mut q, 0x50_0000, &fence_job(5));
    assert_eq!(rig.wait_idle(&q, T).fence, 5);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(rig.irqs.get(v), 2, "the delayed interrupt is not there yet");
    until("the delayed interrupt", || rig.irqs.get(v) == 3);
    assert!(t0.elapsed() >= Duration::from_millis(150), "delivered after {:?}", t0.elapsed());
    assert!(rig.dev.faults().report().starts_with("irq-drop=2 irq-delay=1 "), "{}", rig.dev.faults().report());
    assert!(rig.dev.healthy());
}

#[test]
fn spurious_interrupts_fire_at_once_with_nothing_pending() {
    let (rig, _, _) = rig();
    rig.dev.inject(plan("irq-spurious:count=18"));
    let total: u32 = (0..regs::MSIX_VECTORS).map(|v| rig.irqs.get(v)).sum();
    assert_eq!(total, 18);
    assert!((0..regs::MSIX_VECTORS).all(|v| rig.irqs.get(v) == 2), "spread over every vector");
    assert_eq!(rig.reg32(regs::IRQ_QUEUE_STATUS), 0);
    assert_eq!(rig.reg32(regs::IRQ_ERROR_STATUS), 0);
    rig.dev.inject(plan("irq-spurious:count=3,queue=5"));
    assert_eq!(rig.irqs.get(regs::queue_vector(5)), 2 + 3);
}

#[test]
fn a_stalled_queue_makes_no_progress_until_reset() {
    let (mut rig, ctx, mut q) = rig();
    let other_ctx = rig.context(3);
    let mut other = rig.queue(4, &other_ctx, 16);
    rig.dev.inject(plan("queue-stall:queue=2"));
    rig.run(&ctx, &mut q, 0x10_0000, &fence_job(1));
    rig.run(&other_ctx, &mut other, 0x10_0000, &fence_job(9));
    assert_eq!(rig.wait_idle(&other, T).fence, 9, "another queue is not stalled");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(rig.state(&q), QueueState::Running);
    assert_eq!(rig.reg64(regs::queue_reg(2, regs::Q_PACKETS_64)), 0);
    assert_eq!(rig.status(&q).fence, 0);
    rig.reset_queue(&mut q);
    assert_eq!(rig.state(&q), QueueState::Disabled);
    rig.set32(regs::queue_reg(2, regs::Q_CONTROL), regs::qctl::ENABLE);
    rig.run(&ctx, &mut q, 0x20_0000, &fence_job(2));
    assert_eq!(rig.wait_idle(&q, T).fence, 2, "after the reset the queue runs again");
}

#[test]
fn a_failed_transfer_faults_and_writes_nothing() {
    let (mut rig, ctx, mut q) = rig();
    let buf = rig.host_buffer(&ctx, 0x40_0000, 4096);
    rig.write(buf, &[0xAB; 64]);
    rig.dev.inject(plan("dma-fail:after=1"));
    // The first FILL passes, the DMA_COPY after it fails.
    let job = cmds(|e| {
        e.fill(0x40_0000, 16, 0x1111_1111).dma_copy(0x40_0000, 0x40_0100, 16).fence(1, 0, true);
    });
    rig.run(&ctx, &mut q, 0x10_0000, &job);
    assert_eq!(rig.wait_idle(&q, T).fence, 0);
    assert_eq!(rig.state(&q), QueueState::Faulted);
    let code = rig.reg32(regs::queue_reg(2, regs::Q_FAULT_CODE));
    assert_eq!(FaultCode::from_u8(code as u8), Some(FaultCode::TransferError));
    assert_eq!(code >> 8 & 0xff, 2, "write access");
    assert_eq!(rig.reg64(regs::queue_reg(2, regs::Q_FAULT_ADDR_64)), 0x40_0100);
    assert_eq!(rig.read(buf, 16), 0x1111_1111u32.to_le_bytes().repeat(4), "the FILL before it ran");
    assert_eq!(rig.read(buf + 0x100, 16), [0u8; 16], "the failed copy wrote nothing");
    assert_eq!(rig.irqs.get(regs::MSIX_ERROR_VECTOR), 1);
}

#[test]
fn a_corrupt_status_write_back_then_correct_ones() {
    let (mut rig, ctx, mut q) = rig();
    let host = rig.host_buffer(&ctx, 0x40_0000, 4096);
    rig.dev.inject(plan("status-corrupt:queue=2"));
    let job = cmds(|e| {
        e.sem_wait(0x40_0000, 1, SEM_COND_EQ).fence(7, 0, true);
    });
    rig.run(&ctx, &mut q, 0x10_0000, &job);
    // The move to Waiting writes the (corrupt) block.
    until("the corrupt block", || rig.status(&q).head == 0xDEAD_BEEF);
    let s = rig.status(&q);
    assert_eq!(s.state, 0xBAD);
    assert!(s.fence > 1 << 40, "an impossible fence: {:#x}", s.fence);
    // The registers tell the truth throughout.
    assert_eq!(rig.reg64(regs::queue_reg(2, regs::Q_FENCE_64)), 0);
    assert_eq!(rig.reg32(regs::queue_reg(2, regs::Q_HEAD)), 0);
    rig.write(host, &1u64.to_le_bytes());
    let s = rig.wait_idle(&q, T);
    assert_eq!((s.head, s.fence, s.state), (1, 7, QueueState::Idle as u32), "later write-backs are correct");
}

#[test]
fn dying_mid_job_takes_the_device_off_the_bus() {
    let (mut rig, ctx, mut q) = rig();
    rig.dev.inject(plan("die:after=2"));
    // Packets 1 and 2 run; the device dies as the third starts.
    let host = rig.host_buffer(&ctx, 0x40_0000, 4096);
    let job = cmds(|e| {
        e.fill(0x40_0000, 4, 1).fill(0x40_0004, 4, 2).fill(0x40_0008, 4, 3);
    });
    rig.run(&ctx, &mut q, 0x10_0000, &job);
    until("the device to fall off the bus", || rig.dev.is_off_bus());
    let mut id = [0u8; 4];
    rig.dev.bar_read(BAR_REGS, regs::ID, &mut id);
    assert_eq!(id, [0xff; 4], "reads return all ones");
    assert_eq!(rig.read(host, 12), [1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    assert!(rig.dev.healthy(), "the command processors survive");
}
