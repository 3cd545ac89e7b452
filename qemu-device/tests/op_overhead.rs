//! A long command buffer of tiny ops (the shape of a small model's program:
//! per-op costs dominate). Every op runs and its result is right; the time
//! per op is printed (`-- --nocapture`; `OPS=20000` for a longer run), never
//! asserted: it is what the device adds to each op beyond the kernel.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rbln_hw::cmd::Encoder;
use rbln_hw::ops::*;
use rbln_hw::regs;
use rbln_hw::ring::QueueState;

#[test]
fn a_long_command_buffer_of_tiny_ops() {
    let mut rig = Rig::new();
    let ctx = rig.context(0);
    let mut q = rig.queue(0, &ctx, 64);
    let va = |i: u64| 0x100_0000 + i * 0x10_0000;
    let bus: Vec<u64> = (0..3).map(|i| rig.host_buffer(&ctx, va(i), 4096)).collect();
    let n: u64 = std::env::var("OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(4000);
    // out = a + out, n times: the result counts the ops that ran.
    rig.write_f32s(bus[0], &[1.0; 16]);
    rig.write_f32s(bus[1], &[0.0; 16]);
    let desc = BinaryDesc { kind: Binary::Add as u32, rank: 2, a_dims: [1, 16, 0, 0, 0, 0], b_dims: [1, 16, 0, 0, 0, 0], a_va: va(0), b_va: va(1), out_va: va(1), ..Default::default() }
        .with_header()
        .to_bytes();
    let dva = 0x80_0000;
    let dbus = rig.host_buffer(&ctx, dva, 4096);
    rig.write(dbus, &desc);
    let mut e = Encoder::new(Vec::new());
    for _ in 0..n {
        e.compute(dva, desc.len() as u32);
    }
    let cva = 0x200_0000;
    let cbus = rig.host_buffer(&ctx, cva, e.buf.len() as u64);
    rig.write(cbus, &e.buf);
    let ops0 = rig.reg64(regs::CNT_COMPUTE_OPS_64);
    let t0 = Instant::now();
    rig.submit(&mut q, cva, e.buf.len() as u32);
    rig.wait_idle(&q, Duration::from_secs(60));
    let dt = t0.elapsed();
    assert_eq!(rig.state(&q), QueueState::Idle);
    assert_eq!(rig.reg64(regs::CNT_COMPUTE_OPS_64) - ops0, n);
    assert_eq!(rig.read_f32s(bus[1], 16), vec![n as f32; 16]);
    println!("{n} ops of Add[1x16] in {dt:?}: {:.2} us per op", dt.as_secs_f64() * 1e6 / n as f64);
}
