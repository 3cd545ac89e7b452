//! A long command buffer of tiny ops (the shape of a small model's program:
//! per-op costs dominate). Every op runs and its result is right; the time
//! per op is printed (`-- --nocapture`; `OPS=20000` for a longer run), never
//! asserted: it is what the device adds to each op beyond the kernel.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rbln_hw::cmd::Encoder;
use rbln_hw::mmu::Target;
use rbln_hw::ops::*;
use rbln_hw::regs;
use rbln_hw::ring::QueueState;
use rbln_kernels::{conv2d, Conv2dParams, Padding2d};

/// A queue that runs `out = a + out` over 16 floats (one op's result
/// counts the ops that ran): `bus` are the host buffers at VAs 0x100_0000
/// (a, ones), 0x110_0000 (out, zeros) and 0x120_0000 (spare), `desc` the
/// op's descriptor, stored at VA `dva`.
struct TinyAdd {
    rig: Rig,
    ctx: Ctx,
    q: Queue,
    bus: Vec<u64>,
    dva: u64,
    desc: Vec<u8>,
}

fn tiny_add() -> TinyAdd {
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    let q = rig.queue(0, &ctx, 64);
    let va = |i: u64| 0x100_0000 + i * 0x10_0000;
    let bus: Vec<u64> = (0..3).map(|i| rig.host_buffer(&ctx, va(i), 4096)).collect();
    rig.write_f32s(bus[0], &[1.0; 16]);
    rig.write_f32s(bus[1], &[0.0; 16]);
    let desc = BinaryDesc { kind: Binary::Add as u32, rank: 2, a_dims: [1, 16, 0, 0, 0, 0], b_dims: [1, 16, 0, 0, 0, 0], a_va: va(0), b_va: va(1), out_va: va(1), ..Default::default() }
        .with_header()
        .to_bytes();
    let dva = 0x80_0000;
    let dbus = rig.host_buffer(&ctx, dva, 4096);
    rig.write(dbus, &desc);
    TinyAdd { rig, ctx, q, bus, dva, desc: desc.to_vec() }
}

#[test]
fn a_long_command_buffer_of_tiny_ops() {
    let TinyAdd { mut rig, ctx, mut q, bus, dva, desc } = tiny_add();
    let n: u64 = std::env::var("OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(4000);
    let mut e = Encoder::new(Vec::new());
    for _ in 0..n {
        e.compute(dva, desc.len() as u32);
    }
    let cva = 0x200_0000;
    let cbus = rig.host_buffer(&ctx, cva, e.buf.len() as u64);
    rig.write(cbus, &e.buf);
    let ops0 = rig.reg64(regs::CNT_COMPUTE_OPS_64);
    let busy0: u64 = (0..2).map(|c| rig.reg64(regs::CNT_CORE_BUSY_NS_64 + 8 * c)).sum();
    let qbusy0 = rig.reg64(regs::queue_reg(q.index, regs::Q_BUSY_NS_64));
    let t0 = Instant::now();
    rig.submit(&mut q, cva, e.buf.len() as u32);
    rig.wait_idle(&q, Duration::from_secs(60));
    let dt = t0.elapsed();
    assert_eq!(rig.state(&q), QueueState::Idle);
    assert_eq!(rig.reg64(regs::CNT_COMPUTE_OPS_64) - ops0, n);
    assert_eq!(rig.read_f32s(bus[1], 16), vec![n as f32; 16]);
    // The cores' and the queue's busy time grew by about the time taken.
    let busy: u64 = (0..2).map(|c| rig.reg64(regs::CNT_CORE_BUSY_NS_64 + 8 * c)).sum::<u64>() - busy0;
    let qbusy = rig.reg64(regs::queue_reg(q.index, regs::Q_BUSY_NS_64)) - qbusy0;
    println!("core busy {busy} ns, queue busy {qbusy} ns, wall {} ns", dt.as_nanos());
    assert!(busy > 0 && busy as u128 <= dt.as_nanos(), "core busy {busy} ns in {dt:?}");
    assert!(qbusy >= busy && qbusy as u128 <= dt.as_nanos(), "queue busy {qbusy} ns, cores {busy} ns, in {dt:?}");
    println!("{n} ops of Add[1x16] in {dt:?}: {:.2} us per op", dt.as_secs_f64() * 1e6 / n as f64);
}

/// The first op of a command buffer that arrives after the core went idle
/// (its helper threads asleep, as between a guest's inferences) against the
/// ops after it, from TIMESTAMP packets around each op. Printed, not
/// asserted; the ops must run and the timestamps must not go backwards.
#[test]
fn the_first_op_after_idle() {
    let TinyAdd { mut rig, ctx, mut q, bus, dva, desc } = tiny_add();
    let va = |i: u64| 0x100_0000 + i * 0x10_0000;
    const OPS: u64 = 4;
    let mut e = Encoder::new(Vec::new());
    for i in 0..OPS {
        e.timestamp(va(2) + 8 * i);
        e.compute(dva, desc.len() as u32);
    }
    e.timestamp(va(2) + 8 * OPS);
    let cva = 0x200_0000;
    let cbus = rig.host_buffer(&ctx, cva, e.buf.len() as u64);
    rig.write(cbus, &e.buf);
    let rounds: u64 = 20;
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        std::thread::sleep(Duration::from_millis(3)); // past the helpers' spin
        rig.submit(&mut q, cva, e.buf.len() as u32);
        rig.wait_idle(&q, Duration::from_secs(10));
        assert_eq!(rig.state(&q), QueueState::Idle);
        let ts: Vec<u64> = (0..=OPS).map(|i| rig.read_u64(bus[2] + 8 * i)).collect();
        assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");
        first.push(ts[1] - ts[0]);
        rest.extend(ts[1..].windows(2).map(|w| w[1] - w[0]));
    }
    assert_eq!(rig.read_f32s(bus[1], 16), vec![(rounds * OPS) as f32; 16]);
    first.sort_unstable();
    rest.sort_unstable();
    println!("first op after 3 ms idle: median {} ns; the ops after it: median {} ns", first[first.len() / 2], rest[rest.len() / 2]);
}

/// Big ops (split over the kernel workers, which then spin between ops)
/// alternating with tiny ones, in ring entries that each start after the
/// spin window: every entry completes. (A spinner that waited for an op
/// to end could be picked up by a helper waiting inside one of that op's
/// own tasks, and then waited for itself; CI hit that once in the guest.
/// This test is the scenario, not a reliable reproducer of that race.)
#[test]
fn big_and_tiny_ops_alternating_complete() {
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    let mut q = rig.queue(0, &ctx, 64);
    const BIG: u64 = 1 << 18; // elements: above the workers' sharing threshold
    let va = |i: u64| 0x100_0000 + i * 0x40_0000;
    let bus: Vec<u64> = (0..3).map(|i| rig.host_buffer(&ctx, va(i), BIG * 4)).collect();
    rig.write_f32s(bus[0], &vec![1.0; BIG as usize]);
    rig.write_f32s(bus[1], &vec![0.0; BIG as usize]);
    let add = |n: u64, out: u64| {
        BinaryDesc { kind: Binary::Add as u32, rank: 1, a_dims: [n as u32, 0, 0, 0, 0, 0], b_dims: [n as u32, 0, 0, 0, 0, 0], a_va: va(0), b_va: va(1), out_va: out, ..Default::default() }
            .with_header()
            .to_bytes()
    };
    let (big, tiny) = (add(BIG, va(2)), add(16, va(2)));
    let dva = 0x80_0000;
    let dbus = rig.host_buffer(&ctx, dva, 4096);
    rig.write(dbus, &big);
    rig.write(dbus + 2048, &tiny);
    let mut e = Encoder::new(Vec::new());
    for i in 0..40 {
        e.compute(dva, big.len() as u32);
        for _ in 0..i % 4 {
            e.compute(dva + 2048, tiny.len() as u32);
        }
    }
    let cva = 0x200_0000;
    let cbus = rig.host_buffer(&ctx, cva, e.buf.len() as u64);
    rig.write(cbus, &e.buf);
    for round in 0..40 {
        // Past the spin window: the entry starts by waking the helpers,
        // and its first op is a big one.
        std::thread::sleep(Duration::from_millis(2));
        rig.submit(&mut q, cva, e.buf.len() as u32);
        let s = rig.wait_idle(&q, Duration::from_secs(60));
        assert_eq!(rig.state(&q), QueueState::Idle, "round {round}: {s:?}");
    }
    assert_eq!(rig.read_f32s(bus[2], 4), vec![1.0; 4]);
}

/// One convolution run `N` times through the device (operands in guest
/// RAM, descriptor and command buffer too) and `N` times by calling the
/// kernel on a pool of as many threads: the results must agree; the
/// best time per op of each is printed (what the device adds beyond the
/// kernel), never asserted.
fn conv_through_device_and_kernel(name: &str, cin: u32, cout: u32, hw: u32, k: u32, s: u32, g: u32) {
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    let mut q = rig.queue(0, &ctx, 64);
    let oh = (hw + 2 * (k / 2) - k) / s + 1;
    let (xn, wn, yn) = ((cin * hw * hw) as u64, (cout * cin / g * k * k) as u64, (cout * oh * oh) as u64);
    let va = |i: u64| 0x100_0000 + i * 0x100_0000;
    let xb = rig.host_buffer(&ctx, va(0), xn * 4);
    let wb = rig.host_buffer(&ctx, va(1), wn * 4);
    let yb = rig.host_buffer(&ctx, va(2), yn * 4);
    let x: Vec<f32> = (0..xn).map(|i| ((i * 7919 % 1000) as f32) / 1000.0 - 0.5).collect();
    let w: Vec<f32> = (0..wn).map(|i| ((i * 104729 % 1000) as f32) / 1000.0 - 0.5).collect();
    rig.write_f32s(xb, &x);
    rig.write_f32s(wb, &w);
    let desc = Conv2dDesc { n: 1, c_in: cin, h: hw, w: hw, c_out: cout, kh: k, kw: k, groups: g, stride_h: s, stride_w: s, dil_h: 1, dil_w: 1,
        pad_top: k / 2, pad_left: k / 2, pad_bottom: k / 2, pad_right: k / 2, activation: Unary::Relu as u32, input_va: va(0), weight_va: va(1), output_va: va(2), ..Default::default() }
        .with_header().to_bytes();
    let dva = 0x80_0000;
    let dbus = rig.host_buffer(&ctx, dva, 4096);
    rig.write(dbus, &desc);
    const N: usize = 10;
    let mut e = Encoder::new(Vec::new());
    for _ in 0..N { e.compute(dva, desc.len() as u32); }
    let cva = 0x80_1000;
    let cbus = rig.host_buffer(&ctx, cva, e.buf.len() as u64);
    rig.write(cbus, &e.buf);
    let mut best_dev = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        rig.submit(&mut q, cva, e.buf.len() as u32);
        rig.wait_idle(&q, Duration::from_secs(60));
        best_dev = best_dev.min(t0.elapsed().as_secs_f64() / N as f64);
        assert_eq!(rig.state(&q), QueueState::Idle);
    }
    let p = Conv2dParams { batch: 1, in_channels: cin as usize, in_h: hw as usize, in_w: hw as usize, out_channels: cout as usize, kernel: [k as usize; 2], stride: [s as usize; 2],
        padding: Padding2d::uniform((k / 2) as usize), dilation: [1, 1], groups: g as usize, activation: rbln_kernels::Activation::Relu };
    let mut y = vec![0f32; yn as usize];
    let threads = std::env::var("RAYON_NUM_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let pool = rbln_kernels::rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let mut best_k = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        pool.install(|| for _ in 0..N { conv2d(&p, &x, &w, None, &mut y).unwrap(); });
        best_k = best_k.min(t0.elapsed().as_secs_f64() / N as f64);
    }
    let dev_y = rig.read_f32s(yb, yn as usize);
    for (i, (d, k)) in dev_y.iter().zip(&y).enumerate() {
        assert!((d - k).abs() <= 1e-5 * (1.0 + k.abs()), "{name}: output {i}: device {d}, kernel {k}");
    }
    println!("{name}: device {:.3} ms, kernel {:.3} ms, ratio {:.2}", best_dev * 1e3, best_k * 1e3, best_dev / best_k);
}

/// Convolutions of the shapes where the device was measured furthest from
/// its kernel (RegNet's narrow 1x1, strided projection and grouped 3x3, a
/// ResNet 3x3), run through the device and directly.
#[test]
fn conv_through_the_device_matches_the_kernel() {
    conv_through_device_and_kernel("1x1 32->48 @112", 32, 48, 112, 1, 1, 1);
    conv_through_device_and_kernel("1x1 s2 32->48 @112", 32, 48, 112, 1, 2, 1);
    conv_through_device_and_kernel("3x3 s2 g6 48->48 @112", 48, 48, 112, 3, 2, 6);
    conv_through_device_and_kernel("3x3 64->64 @56", 64, 64, 56, 3, 1, 1);
    // The test suite's small CNNs: fixed costs dominate.
    conv_through_device_and_kernel("3x3 16->16 @16", 16, 16, 16, 3, 1, 1);
    conv_through_device_and_kernel("3x3 32->32 @8", 32, 32, 8, 3, 1, 1);
}

/// DMA_COPY of 1 MiB from guest pages scattered in RAM (4 KiB pieces, as
/// a guest kernel's allocator hands them out) to device DRAM, the way the
/// guest bench times it (one submission after the engine went idle,
/// TIMESTAMPs around the copy) and back to back in one submission, against
/// a host memcpy of the same size on one thread. The copy must be exact;
/// the times are printed, never asserted.
#[test]
fn dma_copy_of_scattered_pages_against_memcpy() {
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    let mut q = rig.queue(0, &ctx, 64);
    const SIZE: u64 = 1 << 20;
    const PAGE: u64 = rbln_hw::PAGE_SIZE;
    let pages = SIZE / PAGE;
    // Every other page of a region twice the size, in a shuffled order.
    let region = rig.alloc(2 * SIZE);
    let (hva, dva, tva) = (0x100_0000u64, 0x200_0000u64, 0x300_0000u64);
    let order: Vec<u64> = (0..pages).map(|i| (i * 37) % pages).collect();
    for (i, &p) in order.iter().enumerate() {
        rig.map(&ctx, hva + i as u64 * PAGE, Target::Host, region + 2 * p * PAGE, PAGE, true, true);
    }
    rig.map(&ctx, dva, Target::Dram, 0, SIZE, true, true);
    let tbus = rig.host_buffer(&ctx, tva, 4096);
    let data: Vec<u8> = (0..SIZE).map(|i| (i * 2_654_435_761 >> 13) as u8).collect();
    for (i, &p) in order.iter().enumerate() {
        let i = i as u64;
        rig.write(region + 2 * p * PAGE, &data[(i * PAGE) as usize..((i + 1) * PAGE) as usize]);
    }
    let timed = |reps: u64| {
        let mut e = Encoder::new(Vec::new());
        for r in 0..reps {
            e.timestamp(tva + 16 * r);
            e.dma_copy(hva, dva, SIZE);
            e.timestamp(tva + 16 * r + 8);
        }
        e.buf
    };
    let (one, many) = (timed(1), timed(16));
    let cva = 0x400_0000;
    let cbus = rig.host_buffer(&ctx, cva, many.len() as u64);
    let mut run = |cmds: &[u8], reps: u64| -> Vec<u64> {
        rig.write(cbus, cmds);
        rig.submit(&mut q, cva, cmds.len() as u32);
        rig.wait_idle(&q, Duration::from_secs(10));
        assert_eq!(rig.state(&q), QueueState::Idle);
        (0..reps).map(|r| rig.read_u64(tbus + 16 * r + 8) - rig.read_u64(tbus + 16 * r)).collect()
    };
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let mut after_idle = Vec::new();
    for _ in 0..rounds {
        std::thread::sleep(Duration::from_millis(3)); // past the helpers' spin
        after_idle.extend(run(&one, 1));
    }
    let mut back_to_back = Vec::new();
    for _ in 0..rounds / 5 {
        back_to_back.extend(run(&many, 16).into_iter().skip(1));
    }
    assert_eq!(rig.dram_read(0, SIZE as usize), data);
    let (src, mut dst) = (data.clone(), vec![0u8; SIZE as usize]);
    let mut host = Vec::new();
    for _ in 0..200 {
        let t0 = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        host.push(t0.elapsed().as_nanos() as u64);
    }
    assert_eq!(dst, src);
    let med = |mut v: Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let gbps = |ns: u64| SIZE as f64 / ns as f64;
    let (a, b, h) = (med(after_idle), med(back_to_back), med(host));
    println!(
        "DMA 1 MiB scattered host -> DRAM: after idle {a} ns ({:.1} GB/s), back to back {b} ns ({:.1} GB/s); memcpy 1 thread {h} ns ({:.1} GB/s)",
        gbps(a), gbps(b), gbps(h)
    );
}
