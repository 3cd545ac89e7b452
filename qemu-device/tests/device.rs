//! The device model driven through its register interface, as a driver
//! would: queues, packets, MMU, faults, interrupts, resets.

mod common;

use std::time::Duration;

use common::*;
use rbln_hw::cmd::{Encoder, SEM_COND_EQ, SEM_COND_GE, SEM_OP_ADD, SEM_OP_SET};
use rbln_hw::mmu::Target;
use rbln_hw::ops::{self, GemmDesc, Unary};
use rbln_hw::regs::{self, qctl};
use rbln_hw::ring::{FaultCode, QueueState};
use rbln_hw::HW_VERSION;

const T: Duration = Duration::from_secs(10);

fn cmds() -> Encoder<Vec<u8>> {
    Encoder::new(Vec::new())
}

fn fault_code(rig: &Rig, q: &Queue) -> Option<FaultCode> {
    FaultCode::from_u8(rig.reg32(regs::queue_reg(q.index, regs::Q_FAULT_CODE)) as u8)
}

#[test]
fn identity_registers() {
    let rig = Rig::new();
    assert_eq!(rig.reg32(regs::ID), regs::ID_VALUE);
    assert_eq!(rig.reg32(regs::VERSION), HW_VERSION);
    assert_eq!(rig.reg32(regs::NUM_QUEUES), 16);
    assert_eq!(rig.reg64(regs::DRAM_SIZE_64), 16 << 20);
    assert_eq!(rig.reg32(regs::CAPS), regs::caps::ALL);
    assert_eq!(rig.reg32(regs::NUM_MSIX_VECTORS), regs::MSIX_VECTORS);
    let t0 = rig.reg64(regs::TIMESTAMP_64);
    std::thread::sleep(Duration::from_millis(2));
    assert!(rig.reg64(regs::TIMESTAMP_64) > t0, "device clock advances");
    rig.set32(regs::SCRATCH, 0x1234_5678);
    assert_eq!(rig.reg32(regs::SCRATCH), 0x1234_5678);
    rig.set32(regs::ID, 0);
    assert_eq!(rig.reg32(regs::ID), regs::ID_VALUE, "read-only");
}

/// One queue runs NOP, FILL, DMA, COMPUTE, SEM_SIGNAL/SEM_WAIT, TIMESTAMP
/// and FENCE in order, and the results land where they should.
#[test]
fn queue_runs_every_packet_in_order() {
    let mut rig = Rig::new();
    let ctx = rig.context(1);
    let mut q = rig.queue(0, &ctx, 16);
    rig.set32(regs::IRQ_QUEUE_MASK, 0);

    // Device DRAM at VA 0x10_0000 (64 KiB), host scratch at VA 0x20_0000.
    rig.map(&ctx, 0x10_0000, Target::Dram, 0, 64 << 10, true, true);
    let host = rig.host_buffer(&ctx, 0x20_0000, 64 << 10);

    // GEMM operands in host memory: A [3x4], B [4x5], bias [5].
    let (m, n, k) = (3usize, 5usize, 4usize);
    let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 2.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| 1.0 - i as f32 * 0.25).collect();
    let bias: Vec<f32> = (0..n).map(|i| i as f32 - 2.0).collect();
    rig.write_f32s(host + 0x1000, &a);
    rig.write_f32s(host + 0x2000, &b);
    rig.write_f32s(host + 0x3000, &bias);
    let desc = GemmDesc {
        m: m as u32,
        n: n as u32,
        k: k as u32,
        batch: 1,
        flags: ops::GEMM_BIAS,
        activation: Unary::Relu as u32,
        a_va: 0x10_1000, // operands DMA'd into DRAM first
        b_va: 0x10_2000,
        bias_va: 0x20_3000,
        c_va: 0x10_3000,
        ..Default::default()
    }
    .with_header();
    rig.write(host + 0x4000, &desc.to_bytes());

    let mut e = cmds();
    e.nop()
        .fill(0x10_0000, 256, 0xAABB_CCDD)
        .dma_copy(0x10_0000, 0x20_5000, 256) // DRAM -> host
        .dma_copy(0x20_1000, 0x10_1000, (m * k * 4) as u64)
        .dma_copy(0x20_2000, 0x10_2000, (k * n * 4) as u64)
        .compute(0x20_4000, GemmDesc::SIZE as u32)
        .dma_copy(0x10_3000, 0x20_6000, (m * n * 4) as u64)
        .sem_signal(0x20_7000, 5, SEM_OP_SET)
        .sem_signal(0x20_7000, 2, SEM_OP_ADD)
        .sem_wait(0x20_7000, 7, SEM_COND_EQ)
        .timestamp(0x20_7008)
        .timestamp(0x20_7010)
        .fence(42, 0x20_7018, true);
    rig.run(&ctx, &mut q, 0x30_0000, &e.buf);
    let st = rig.wait_idle(&q, T);
    assert_eq!(rig.state(&q), QueueState::Idle, "fault: {:?}", fault_code(&rig, &q));
    assert_eq!(st.fence, 42);
    assert_eq!(st.head, 1);
    assert_eq!(st.packets, 13);
    assert!(rig.reg64(regs::queue_reg(q.index, regs::Q_BUSY_NS_64)) > 0, "the queue's busy time counts its packets");

    // FILL then DMA to host.
    let filled = rig.read(host + 0x5000, 256);
    assert!(filled.chunks(4).all(|c| c == 0xAABB_CCDDu32.to_le_bytes()));
    assert_eq!(rig.dram_read(0, 4), 0xAABB_CCDDu32.to_le_bytes());
    // GEMM + bias + ReLU against a CPU reference.
    let got = rig.read_f32s(host + 0x6000, m * n);
    for i in 0..m {
        for j in 0..n {
            let dot: f32 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            let want = (dot + bias[j]).max(0.0);
            assert!((got[i * n + j] - want).abs() < 1e-4, "C[{i},{j}] = {} want {want}", got[i * n + j]);
        }
    }
    // Semaphore, timestamps, fence write.
    assert_eq!(rig.read_u64(host + 0x7000), 7);
    let (t1, t2) = (rig.read_u64(host + 0x7008), rig.read_u64(host + 0x7010));
    assert!(t1 > 0 && t2 >= t1, "timestamps {t1} {t2}");
    assert_eq!(rig.read_u64(host + 0x7018), 42);
    assert_eq!(rig.reg64(regs::queue_reg(0, regs::Q_FENCE_64)), 42);
    // Fence interrupt on queue 0's vector, status bit set.
    assert_eq!(rig.irqs.get(regs::queue_vector(0)), 1);
    assert_eq!(rig.reg32(regs::IRQ_QUEUE_STATUS) & 1, 1);
    rig.set32(regs::IRQ_QUEUE_STATUS, 1);
    assert_eq!(rig.reg32(regs::IRQ_QUEUE_STATUS) & 1, 0, "write-1-to-clear");
    // Counters.
    assert_eq!(rig.reg64(regs::CNT_PACKETS_64), 13);
    assert_eq!(rig.reg64(regs::CNT_COMPUTE_OPS_64), 1);
    assert_eq!(rig.reg64(regs::CNT_COMPUTE_FLOPS_64), (2 * m * n * k) as u64);
    assert!(rig.reg64(regs::CNT_DMA_BYTES_64) >= 256 * 2);
}

/// Queue 0 blocks on a semaphore that queue 1 signals: the queues run
/// concurrently, and the cross-queue dependency holds.
#[test]
fn two_queues_run_concurrently_with_semaphores() {
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    let host = rig.host_buffer(&ctx, 0x10_0000, 4096);
    let mut q0 = rig.queue(0, &ctx, 8);
    let mut q1 = rig.queue(1, &ctx, 8);

    let mut waiter = cmds();
    waiter.sem_wait(0x10_0000, 1, SEM_COND_GE).fill(0x10_0010, 8, 0x1111_1111).fence(1, 0, false);
    rig.run(&ctx, &mut q0, 0x20_0000, &waiter.buf);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.state(&q0), QueueState::Waiting, "queue 0 waits for the semaphore");

    let mut signaller = cmds();
    signaller.fill(0x10_0020, 8, 0x2222_2222).sem_signal(0x10_0000, 1, SEM_OP_SET).fence(9, 0, false);
    rig.run(&ctx, &mut q1, 0x30_0000, &signaller.buf);
    assert_eq!(rig.wait_idle(&q1, T).fence, 9);
    assert_eq!(rig.wait_idle(&q0, T).fence, 1);
    assert_eq!(rig.read(host + 0x10, 4), 0x1111_1111u32.to_le_bytes());
    assert_eq!(rig.read(host + 0x20, 4), 0x2222_2222u32.to_le_bytes());
}

/// A command touching an unmapped address faults its queue only: the
/// error record names the address, the error interrupt fires, and another
/// context's queue keeps working. A queue reset brings it back.
#[test]
fn fault_stops_only_the_faulting_queue() {
    let mut rig = Rig::new();
    rig.set32(regs::IRQ_ERROR_MASK, 0);
    let bad_ctx = rig.context(1);
    let good_ctx = rig.context(2);
    let mut bad_q = rig.queue(3, &bad_ctx, 8);
    let mut good_q = rig.queue(4, &good_ctx, 8);
    rig.host_buffer(&bad_ctx, 0x10_0000, 4096);
    let good_host = rig.host_buffer(&good_ctx, 0x10_0000, 4096);

    let mut e = cmds();
    e.fill(0x10_0000, 16, 1).fill(0xdead_0000, 16, 2).fence(5, 0, false);
    rig.run(&bad_ctx, &mut bad_q, 0x20_0000, &e.buf);
    rig.wait_idle(&bad_q, T);
    assert_eq!(rig.state(&bad_q), QueueState::Faulted);
    assert_eq!(fault_code(&rig, &bad_q), Some(FaultCode::Unmapped));
    assert_eq!(rig.reg64(regs::queue_reg(3, regs::Q_FAULT_ADDR_64)), 0xdead_0000);
    assert_eq!(rig.reg32(regs::queue_reg(3, regs::Q_FAULT_CODE)) >> 8 & 0xFF, 2, "write access");
    assert_eq!(rig.status(&bad_q).fence, 0, "the fence after the fault never ran");
    assert_eq!(rig.irqs.get(regs::MSIX_ERROR_VECTOR), 1);
    assert_eq!(rig.reg32(regs::IRQ_ERROR_STATUS), 1 << 3);
    assert_eq!(rig.reg32(regs::ERROR_COUNT), 1);

    // The other context is unaffected, and the same VA is its own memory.
    let mut g = cmds();
    g.fill(0x10_0000, 16, 0x7777_7777).fence(11, 0, false);
    rig.run(&good_ctx, &mut good_q, 0x20_0000, &g.buf);
    assert_eq!(rig.wait_idle(&good_q, T).fence, 11);
    assert_eq!(rig.read(good_host, 4), 0x7777_7777u32.to_le_bytes());

    // Further doorbells on the faulted queue do nothing until a reset.
    rig.run(&bad_ctx, &mut bad_q, 0x30_0000, &cmds().fence(6, 0, false).buf);
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(rig.state(&bad_q), QueueState::Faulted);

    rig.reset_queue(&mut bad_q);
    assert_eq!(rig.state(&bad_q), QueueState::Disabled);
    assert_eq!(fault_code(&rig, &bad_q), Some(FaultCode::None));
    assert_eq!(rig.reg32(regs::IRQ_ERROR_STATUS), 0);
    rig.set32(regs::queue_reg(3, regs::Q_CONTROL), qctl::ENABLE);
    rig.run(&bad_ctx, &mut bad_q, 0x40_0000, &cmds().fence(7, 0, false).buf);
    assert_eq!(rig.wait_idle(&bad_q, T).fence, 7);
    assert_eq!(rig.state(&bad_q), QueueState::Idle);
}

#[test]
fn write_to_read_only_page_is_a_permission_fault() {
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    let bus = rig.alloc(4096);
    rig.map(&ctx, 0x10_0000, Target::Host, bus, 4096, true, false);
    let mut q = rig.queue(0, &ctx, 4);
    rig.run(&ctx, &mut q, 0x20_0000, &cmds().fill(0x10_0000, 4, 9).buf);
    rig.wait_idle(&q, T);
    assert_eq!(fault_code(&rig, &q), Some(FaultCode::Permission));
    assert_eq!(rig.read(bus, 4), [0; 4], "nothing was written");
}

#[test]
fn malformed_input_faults_with_a_precise_code() {
    let cases: Vec<(Vec<u8>, FaultCode)> = vec![
        (vec![0xff, 0, 1, 0], FaultCode::BadPacket),          // unknown opcode
        (cmds().indirect(0x20_0000, 16).buf.clone(), FaultCode::Nesting), // calls itself
        ({
            let mut e = cmds();
            e.compute(0x20_0000, 16);
            e.buf
        }, FaultCode::BadDescriptor), // the packet itself is no descriptor
    ];
    for (buf, want) in cases {
        let mut rig = Rig::new();
        let ctx = rig.context(0);
        let mut q = rig.queue(0, &ctx, 4);
        rig.run(&ctx, &mut q, 0x20_0000, &buf);
        rig.wait_idle(&q, T);
        assert_eq!(fault_code(&rig, &q), Some(want), "for {buf:x?}");
        assert!(rig.dev.healthy());
    }
    // A doorbell past the ring's end.
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    let q = rig.queue(0, &ctx, 4);
    rig.doorbell(0, 4);
    assert_eq!(fault_code(&rig, &q), Some(FaultCode::BadDoorbell));
    // A queue enabled with a bad ring size.
    rig.set32(regs::queue_reg(1, regs::Q_RING_SIZE), 3);
    rig.set32(regs::queue_reg(1, regs::Q_CONTROL), qctl::ENABLE);
    assert_eq!(FaultCode::from_u8(rig.reg32(regs::queue_reg(1, regs::Q_FAULT_CODE)) as u8), Some(FaultCode::BadQueueConfig));
    // A queue bound to an invalid context.
    let mut q2 = rig.queue(2, &ctx, 4);
    rig.set32(regs::ctx_reg(0, regs::CTX_CONTROL), 0);
    rig.run(&ctx, &mut q2, 0x20_0000, &cmds().nop().buf);
    rig.wait_idle(&q2, T);
    assert_eq!(fault_code(&rig, &q2), Some(FaultCode::ContextInvalid));
}

/// A job blocked forever (a hang) is cut short by a queue reset, and a
/// device reset returns every register to its reset value.
#[test]
fn resets_stop_hung_work_and_restore_reset_values() {
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    rig.host_buffer(&ctx, 0x10_0000, 4096);
    let mut q = rig.queue(5, &ctx, 4);
    rig.run(&ctx, &mut q, 0x20_0000, &cmds().sem_wait(0x10_0000, 1, SEM_COND_EQ).buf);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.state(&q), QueueState::Waiting);
    let t0 = std::time::Instant::now();
    rig.reset_queue(&mut q);
    assert!(t0.elapsed() < Duration::from_secs(1), "reset is prompt");
    assert_eq!(rig.state(&q), QueueState::Disabled);
    assert_eq!(rig.reg32(regs::queue_reg(5, regs::Q_HEAD)), 0);
    assert_eq!(rig.reg64(regs::queue_reg(5, regs::Q_FENCE_64)), 0, "a reset queue starts a new fence timeline");
    assert_eq!(rig.reg64(regs::queue_reg(5, regs::Q_BUSY_NS_64)), 0);

    // Device reset.
    rig.set32(regs::SCRATCH, 7);
    rig.set32(regs::IRQ_QUEUE_MASK, 0);
    rig.set32(regs::DEVICE_RESET, 0x1234); // wrong magic: ignored
    assert_eq!(rig.reg32(regs::SCRATCH), 7);
    rig.set32(regs::DEVICE_RESET, regs::RESET_MAGIC);
    assert_eq!(rig.reg32(regs::SCRATCH), 0);
    assert_eq!(rig.reg32(regs::IRQ_QUEUE_MASK), u32::MAX);
    assert_eq!(rig.reg32(regs::ctx_reg(0, regs::CTX_CONTROL)), 0);
    assert_eq!(rig.reg64(regs::CNT_PACKETS_64), 0);
    assert_eq!(rig.reg32(regs::queue_reg(5, regs::Q_RING_SIZE)), 0);
    assert!(rig.dev.healthy());
}

#[test]
fn masked_interrupts_are_delivered_on_unmask() {
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    let mut q = rig.queue(9, &ctx, 4);
    rig.run(&ctx, &mut q, 0x20_0000, &cmds().fence(1, 0, true).buf);
    rig.wait_idle(&q, T);
    assert_eq!(rig.irqs.get(regs::queue_vector(9)), 0, "masked at reset");
    rig.set32(regs::IRQ_QUEUE_MASK, !(1 << 9));
    assert_eq!(rig.irqs.get(regs::queue_vector(9)), 1);
}

/// A bad doorbell written while an entry runs still faults the queue.
#[test]
fn bad_doorbell_during_a_running_entry_is_not_lost() {
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    rig.host_buffer(&ctx, 0x10_0000, 4096);
    let mut q = rig.queue(0, &ctx, 4);
    rig.run(&ctx, &mut q, 0x20_0000, &cmds().sem_wait(0x10_0000, 1, SEM_COND_EQ).buf);
    std::thread::sleep(Duration::from_millis(10));
    rig.doorbell(0, 9);
    // Let the blocked entry finish: signal the semaphore from the CPU side.
    let bus = rig_bus_of(&rig, &ctx, 0x10_0000);
    rig.write(bus, &1u64.to_le_bytes());
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.state(&q), QueueState::Faulted);
    assert_eq!(fault_code(&rig, &q), Some(FaultCode::BadDoorbell));
}

/// Bus address behind a VA of `ctx`, by walking the rig's page tables.
fn rig_bus_of(rig: &Rig, ctx: &Ctx, va: u64) -> u64 {
    use rbln_hw::mmu;
    let mut table = ctx.root;
    for level in [2, 1] {
        table = mmu::decode_table(rig.read_u64(table + mmu::va_index(va, level) as u64 * 8)).unwrap();
    }
    mmu::decode_leaf(rig.read_u64(table + mmu::va_index(va, 0) as u64 * 8)).unwrap().addr + (va & 0xfff)
}

/// A DMA whose destination runs into an unmapped page writes nothing.
#[test]
fn faulting_dma_writes_nothing() {
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    let src = rig.host_buffer(&ctx, 0x10_0000, 8192);
    let dst = rig.host_buffer(&ctx, 0x20_0000, 4096); // 0x20_1000 is unmapped
    rig.write(src, &[0xAB; 8192]);
    let mut q = rig.queue(0, &ctx, 4);
    rig.run(&ctx, &mut q, 0x30_0000, &cmds().dma_copy(0x10_0000, 0x20_0000, 8192).buf);
    rig.wait_idle(&q, T);
    assert_eq!(fault_code(&rig, &q), Some(FaultCode::Unmapped));
    assert_eq!(rig.reg64(regs::queue_reg(0, regs::Q_FAULT_ADDR_64)), 0x20_1000);
    assert!(rig.read(dst, 4096).iter().all(|&b| b == 0), "no partial DMA");
}

/// SEM_SIGNAL ADD from several queues at once loses no update.
#[test]
fn concurrent_semaphore_adds_are_atomic() {
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    let host = rig.host_buffer(&ctx, 0x10_0000, 4096);
    let mut e = cmds();
    for _ in 0..500 {
        e.sem_signal(0x10_0000, 1, SEM_OP_ADD);
    }
    let mut qs: Vec<Queue> = (0..4).map(|i| rig.queue(i, &ctx, 4)).collect();
    for (i, q) in qs.iter_mut().enumerate() {
        rig.run(&ctx, q, 0x20_0000 + i as u64 * 0x10_0000, &e.buf);
    }
    for q in &qs {
        rig.wait_idle(q, T);
        assert_eq!(rig.state(q), QueueState::Idle);
    }
    assert_eq!(rig.read_u64(host), 2000);
}

/// After a page is unmapped and the context invalidated, the device no
/// longer reaches it, even within one long-running command buffer.
#[test]
fn mmu_invalidate_drops_cached_translations() {
    let mut rig = Rig::new();
    let ctx = rig.context(4);
    let host = rig.host_buffer(&ctx, 0x10_0000, 4096);
    rig.host_buffer(&ctx, 0x11_0000, 4096);
    let mut q = rig.queue(0, &ctx, 4);
    // Fill, wait for the CPU's go, fill the same page again.
    let mut e = cmds();
    e.fill(0x10_0000, 8, 1).sem_wait(0x11_0000, 1, SEM_COND_EQ).fill(0x10_0000, 8, 2);
    rig.run(&ctx, &mut q, 0x20_0000, &e.buf);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.read(host, 4), 1u32.to_le_bytes());
    // Unmap the 2 MiB region by pointing its level-1 entry at a fresh,
    // empty level-0 table (the old table, which the device has cached,
    // still maps the page), invalidate, then release the wait. The
    // semaphore page moves to the new table so the wait can still end.
    let sem = rig_bus_of(&rig, &ctx, 0x11_0000);
    let l1 = rbln_hw::mmu::decode_table(rig.read_u64(ctx.root)).unwrap();
    let fresh = rig.alloc(4096);
    rig.write(fresh + rbln_hw::mmu::va_index(0x11_0000, 0) as u64 * 8,
        &rbln_hw::mmu::leaf_pte(sem & !0xfff, Target::Host, true, true).to_le_bytes());
    rig.write(l1, &rbln_hw::mmu::table_pte(fresh).to_le_bytes());
    rig.set32(regs::MMU_INVALIDATE, 4);
    rig.write(sem, &1u64.to_le_bytes());
    rig.wait_idle(&q, T);
    assert_eq!(fault_code(&rig, &q), Some(FaultCode::Unmapped));
    assert_eq!(rig.read(host, 4), 1u32.to_le_bytes(), "the unmapped page was not written");
}

#[test]
fn rewriting_a_mask_does_not_redeliver() {
    let mut rig = Rig::new();
    rig.set32(regs::IRQ_QUEUE_MASK, 0);
    let ctx = rig.context(0);
    let mut q = rig.queue(1, &ctx, 4);
    rig.run(&ctx, &mut q, 0x20_0000, &cmds().fence(1, 0, true).buf);
    rig.wait_idle(&q, T);
    assert_eq!(rig.irqs.get(regs::queue_vector(1)), 1);
    rig.set32(regs::IRQ_QUEUE_MASK, 0);
    assert_eq!(rig.irqs.get(regs::queue_vector(1)), 1);
}

/// Large DMA copies are shared among the compute threads: the bytes land
/// exactly, in VA order, from host pages scattered in reverse order into
/// DRAM and back; a large copy whose ranges overlap keeps memmove's
/// meaning (it is copied as one stream).
#[test]
fn large_dma_copies_are_exact_over_scattered_pages_and_overlaps() {
    const PAGE: u64 = 4096;
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    let size = (1 << 20) + 2 * PAGE + 4;
    let pages = size.div_ceil(PAGE);
    let pool = rig.alloc(pages * PAGE);
    for i in 0..pages {
        rig.map(&ctx, 0x100_0000 + i * PAGE, Target::Host, pool + (pages - 1 - i) * PAGE, PAGE, true, true);
    }
    rig.map(&ctx, 0x400_0000, Target::Dram, 0, pages * PAGE, true, true);
    let back = rig.host_buffer(&ctx, 0x800_0000, size);
    // The source in VA order: word i = i * odd constant.
    let want: Vec<u8> = (0..size / 4).flat_map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()).collect();
    for i in 0..pages {
        let chunk = &want[(i * PAGE) as usize..((i + 1) * PAGE).min(size) as usize];
        rig.write(pool + (pages - 1 - i) * PAGE, chunk);
    }
    let mut q = rig.queue(0, &ctx, 4);
    let mut e = cmds();
    e.dma_copy(0x100_0000, 0x400_0000, size).dma_copy(0x400_0000, 0x800_0000, size);
    rig.run(&ctx, &mut q, 0x900_0000, &e.buf);
    rig.wait_idle(&q, T);
    assert_eq!(rig.state(&q), QueueState::Idle);
    assert!(rig.dram_read(0, size as usize) == want, "host -> DRAM");
    assert!(rig.read(back, size as usize) == want, "DRAM -> host");

    // Overlapping ranges, 512 KiB moved 4 bytes up within one buffer.
    let n = 512 << 10;
    let buf = rig.host_buffer(&ctx, 0xa00_0000, n + PAGE);
    rig.write(buf, &want[..n as usize]);
    rig.run(&ctx, &mut q, 0x900_0000, &cmds().dma_copy(0xa00_0000, 0xa00_0004, n).buf);
    rig.wait_idle(&q, T);
    assert_eq!(rig.state(&q), QueueState::Idle);
    let got = rig.read(buf, n as usize + 4);
    assert!(got[4..] == want[..n as usize], "memmove semantics");
}

/// Surprise removal: a device that fell off the bus stops its work, raises
/// no interrupt, reads all ones everywhere and ignores writes, for good.
#[test]
fn a_device_off_the_bus_reads_all_ones_and_does_nothing() {
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    rig.host_buffer(&ctx, 0x10_0000, 4096);
    rig.set32(regs::IRQ_QUEUE_MASK, 0);
    let mut q = rig.queue(3, &ctx, 4);
    // A job waiting on a semaphore that never comes: in flight at removal.
    rig.run(&ctx, &mut q, 0x20_0000, &cmds().sem_wait(0x10_0000, 1, SEM_COND_EQ).fence(1, 0, true).buf);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.state(&q), QueueState::Waiting);
    rig.dev.fall_off_bus();
    assert!(rig.dev.is_off_bus());
    assert_eq!(rig.reg32(regs::ID), u32::MAX);
    assert_eq!(rig.reg64(regs::CNT_PACKETS_64), u64::MAX);
    assert_eq!(rig.reg32(regs::queue_reg(3, regs::Q_STATE)), u32::MAX);
    rig.set32(regs::SCRATCH, 5);
    rig.set32(regs::DEVICE_RESET, regs::RESET_MAGIC);
    rig.dev.reset();
    assert_eq!(rig.reg32(regs::SCRATCH), u32::MAX, "no way back");
    // The semaphore is released: nothing runs, no fence, no interrupt.
    rig.write(rig_bus_of(&rig, &ctx, 0x10_0000), &1u64.to_le_bytes());
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(rig.irqs.get(regs::queue_vector(3)), 0);
    assert!(rig.dev.healthy());
}
