//! Throughput of rbln-kernels against reference implementations on the
//! shapes of real models (ResNet-50, MobileNetV3, EfficientNet-B0,
//! ConvNeXt, BERT-base).
//!
//! `cargo run -p rbln-kernels --release --example kernels_bench [filter...]`
//!
//! Compute-bound kernels (gemm, conv) are compared with the raw `gemm` crate
//! on the equivalent (im2col) GEMM shape, with the same parallelism
//! (`Parallelism::Rayon` on the current pool; the im2col matrix is built
//! beforehand and not timed). Memory-bound kernels are compared with a
//! `copy_from_slice` of the same byte count (reads + writes of the kernel
//! = 2 × the bytes copied). Ours and the reference are timed alternately,
//! best of `REPS` each, so that the ratio is meaningful on a noisy machine.
//! Set RAYON_NUM_THREADS to change the thread count; pass substrings to run
//! only the matching benchmarks. On a machine shared with other work,
//! `BENCH_CLOCK=cpu RAYON_NUM_THREADS=1` times with the process CPU clock
//! (Linux), which ignores the time the process is descheduled.

use rbln_kernels::*;
use std::hint::black_box;
use std::time::Instant;

fn reps() -> usize {
    std::env::var("BENCH_REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(15)
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// Seconds on the process CPU clock (all threads).
fn cpu_seconds() -> f64 {
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec (64-bit Linux layout).
    unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn time(f: &mut impl FnMut()) -> f64 {
    if std::env::var("BENCH_CLOCK").is_ok_and(|v| v == "cpu") {
        let t = cpu_seconds();
        f();
        cpu_seconds() - t
    } else {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    }
}

/// Best times of `ours` and `reference`, timed alternately.
fn race(mut ours: impl FnMut(), mut reference: impl FnMut()) -> (f64, f64) {
    // BENCH_NO_REF=1: ours only (profiling a kernel; the ratios are void).
    if std::env::var("BENCH_NO_REF").is_ok_and(|v| v == "1") {
        ours();
        let to = (0..reps()).map(|_| time(&mut ours)).fold(f64::INFINITY, f64::min);
        return (to, f64::NAN);
    }
    ours();
    reference();
    let (mut to, mut tr) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..reps() {
        tr = tr.min(time(&mut reference));
        to = to.min(time(&mut ours));
    }
    (to, tr)
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

/// `dst[m×n] = lhs[m×k]·rhs[k×n]`, all row-major, through the raw gemm crate.
fn raw_gemm(m: usize, n: usize, k: usize, lhs: &[f32], rhs: &[f32], dst: &mut [f32]) {
    assert!(lhs.len() >= m * k && rhs.len() >= k * n && dst.len() >= m * n);
    // SAFETY: the slices hold the matrices (asserted above).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            lhs.as_ptr(),
            1,
            k as isize,
            rhs.as_ptr(),
            1,
            n as isize,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
    black_box(dst);
}

struct Bench {
    filters: Vec<String>,
    ratios: Vec<(String, f64)>,
}

impl Bench {
    fn wants(&self, name: &str) -> bool {
        // A filter ending in `$` matches names that end with the rest.
        self.filters.is_empty() || self.filters.iter().any(|f| f.strip_suffix('$').map_or_else(|| name.contains(f.as_str()), |end| name.ends_with(end)))
    }

    fn report_flops(&mut self, name: &str, flops: f64, (to, tr): (f64, f64)) {
        let g = |t: f64| flops / t / 1e9;
        println!(
            "{name:<44} ours {:7.1} GFLOP/s {:8.3} ms | gemm crate {:7.1} GFLOP/s {:8.3} ms | ratio {:5.2}",
            g(to),
            to * 1e3,
            g(tr),
            tr * 1e3,
            tr / to
        );
        self.ratios.push((name.to_string(), tr / to));
    }

    fn report_bytes(&mut self, name: &str, bytes: f64, (to, tr): (f64, f64)) {
        let g = |t: f64| bytes / t / 1e9;
        println!(
            "{name:<44} ours {:7.1} GB/s    {:8.3} ms | memcpy     {:7.1} GB/s    {:8.3} ms | ratio {:5.2}",
            g(to),
            to * 1e3,
            g(tr),
            tr * 1e3,
            tr / to
        );
        self.ratios.push((name.to_string(), tr / to));
    }

    /// Memory-bound kernel moving `bytes` (reads + writes) against a memcpy
    /// of `bytes / 2`.
    ///
    /// Source and destination share one allocation, 2 KiB apart modulo
    /// 4 KiB: two separate vectors would put the destination 16 bytes past
    /// the source modulo 4 KiB (the allocator's header), where the C
    /// library's memcpy is ~15x slower on this host's CPUs (see
    /// `rbln_kernels::copy_bytes`) and made a poor reference.
    fn mem(&mut self, name: &str, bytes: usize, ours: impl FnMut()) {
        let n = (bytes / 2 / 4).max(1);
        let gap = n.next_multiple_of(1024) + 512 - n;
        let mut buf = data(2 * n + gap, 99);
        let (src, rest) = buf.split_at_mut(n);
        let dst = &mut rest[gap..];
        let r = race(ours, || {
            dst.copy_from_slice(src);
            black_box(&mut *dst);
        });
        self.report_bytes(name, bytes as f64, r);
    }

    /// A copy of `len` bytes whose destination lies `distance` bytes past
    /// the source modulo 4 KiB: `copy_bytes` against the C library's memcpy.
    fn copy_at_distance(&mut self, name: &str, len: usize, distance: usize) {
        if !self.wants(name) {
            return;
        }
        let mut buf = vec![1u8; 2 * len + 8192];
        let base = buf.as_ptr().align_offset(4096);
        let dst = base + len.next_multiple_of(4096) + distance;
        let (lo, hi) = buf.split_at_mut(dst);
        let (src, dst) = (&lo[base..base + len], &mut hi[..len]);
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        let r = race(
            // SAFETY: `s` and `d` are `len` bytes of `buf`, in disjoint halves.
            || unsafe { copy_bytes(black_box(s), d, len) },
            || {
                // SAFETY: as above.
                unsafe { core::ptr::copy_nonoverlapping(black_box(s), d, len) };
            },
        );
        self.report_bytes(name, 2.0 * len as f64, r);
    }
}

fn conv_params(cin: usize, cout: usize, hw: usize, k: usize, s: usize, groups: usize, act: Activation) -> Conv2dParams {
    Conv2dParams {
        batch: 1,
        in_channels: cin,
        in_h: hw,
        in_w: hw,
        out_channels: cout,
        kernel: [k, k],
        stride: [s, s],
        padding: Padding2d::uniform(k / 2),
        dilation: [1, 1],
        groups,
        activation: act,
    }
}

fn bench_conv(b: &mut Bench, name: &str, p: Conv2dParams, residual: bool) {
    if !b.wants(name) {
        return;
    }
    let [bn, co, oh, ow] = conv2d_output_shape(&p).unwrap();
    let cg = p.in_channels / p.groups;
    let kdim = cg * p.kernel[0] * p.kernel[1];
    let x = data(p.batch * p.in_channels * p.in_h * p.in_w, 4);
    let w = data(co * kdim, 5);
    let bias = data(co, 6);
    let res = data(bn * co * oh * ow, 7);
    let mut y = vec![0.0f32; bn * co * oh * ow];
    let npos = oh * ow;
    // Direct-sum FLOPs (a Winograd row's GFLOP/s are comparable with the
    // direct row's).
    let flops = 2.0 * (bn * co * npos * kdim) as f64;
    // "... winograd": the filters in CONV_WINOGRAD's layout, as the
    // compiler stores them.
    let u = name.ends_with(" winograd").then(|| {
        let mut u = vec![0.0f32; rbln_hw::ops::WINOGRAD_POINTS * co * cg];
        rbln_hw::ops::winograd_weights(&w, co, cg, &mut u);
        u
    });
    if cg > 1 {
        // Reference: per image and group, one GEMM [co/groups × kdim]·
        // [kdim × npos] on a prebuilt im2col.
        let col = data(kdim * npos, 8);
        let mut dst = vec![0.0f32; co * npos];
        let r = race(
            || {
                if let Some(u) = &u {
                    conv2d_winograd(&p, &x, u, Some(&bias), residual.then_some(&res[..]), &mut y).unwrap();
                } else if residual {
                    conv2d_residual(&p, &x, &w, Some(&bias), Some(&res), &mut y).unwrap();
                } else {
                    conv2d(&p, &x, &w, Some(&bias), &mut y).unwrap();
                }
                black_box(&mut y);
            },
            || {
                let og = co / p.groups;
                for _ in 0..p.batch * p.groups {
                    raw_gemm(og, npos, kdim, &w[..og * kdim], &col, &mut dst[..og * npos]);
                }
            },
        );
        b.report_flops(name, flops, r);
    } else {
        // Depthwise: memory-bound; reads input (+ residual), writes output.
        let mut bytes = 4 * (x.len() + y.len());
        if residual {
            bytes += 4 * res.len();
        }
        b.mem(name, bytes, || {
            if residual {
                conv2d_residual(&p, &x, &w, Some(&bias), Some(&res), &mut y).unwrap();
            } else {
                conv2d(&p, &x, &w, Some(&bias), &mut y).unwrap();
            }
            black_box(&mut y);
        });
    }
}

fn bench_gemm(b: &mut Bench, name: &str, m: usize, n: usize, k: usize, act: Activation, residual: bool) {
    bench_gemm_t(b, name, m, n, k, act, residual, false);
    bench_gemm_t(b, &format!("{name} packedB"), m, n, k, act, residual, false);
}

/// `trans_b`: B stored `[n×k]` (ONNX Gemm transB=1 / PyTorch Linear); the
/// reference multiplies the same untransposed shape.
#[allow(clippy::too_many_arguments)]
fn bench_gemm_t(b: &mut Bench, name: &str, m: usize, n: usize, k: usize, act: Activation, residual: bool, trans_b: bool) {
    if !b.wants(name) {
        return;
    }
    let packed_b = name.ends_with("packedB");
    let a = data(m * k, 1);
    let bm = data(k * n, 2);
    let bias = data(n, 3);
    let res = data(m * n, 4);
    let mut c = vec![0.0f32; m * n];
    let mut d = vec![0.0f32; m * n];
    let p = GemmParams {
        m,
        n,
        k,
        trans_b,
        activation: act,
        ..Default::default()
    };
    // B as the compiler stores constant weights: packed once, streamed.
    let mut packed = vec![0.0f32; rbln_hw::ops::gemm_packed_b_len(k as u64, n as u64).unwrap() as usize];
    rbln_hw::ops::pack_gemm_b(&bm, k, n, trans_b, &mut packed);
    let (bm, p) = if packed_b { (&packed, GemmParams { trans_b: false, b_packed: true, ..p }) } else { (&bm, p) };
    let r = race(
        || {
            if residual {
                gemm_residual(&p, &a, bm, Some(&bias), Some(&res), &mut c).unwrap();
            } else {
                gemm(&p, &a, bm, Some(&bias), &mut c).unwrap();
            }
            black_box(&mut c);
        },
        || raw_gemm(m, n, k, &a, bm, &mut d),
    );
    b.report_flops(name, 2.0 * (m * n * k) as f64, r);
}

/// int8 data: `lo..=hi` (as bytes).
fn qdata(n: usize, seed: u32, lo: i32, hi: i32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (lo + ((s >> 8) % (hi - lo + 1) as u32) as i32) as u8
        })
        .collect()
}

/// int8 weights `lo..=hi`, packed (`rbln_hw::ops::pack_qgemm_b`).
fn qweights(k: usize, n: usize, seed: u32, lo: i32, hi: i32) -> Vec<u8> {
    let w: Vec<i8> = qdata(k * n, seed, lo, hi).into_iter().map(|v| v as i8).collect();
    let mut packed = vec![0i8; rbln_hw::ops::qgemm_packed_b_len(k as u64, n as u64).unwrap() as usize];
    rbln_hw::ops::pack_qgemm_b(&w, k, n, false, &mut packed);
    packed.into_iter().map(|v| v as u8).collect()
}

/// The int8 cases: (label, activations u8 lo..=hi, weights lo..=hi).
const QCASES: [(&str, i32, i32, i32, i32); 3] = [
    ("u8 0..255 w -127..127 (sign)", 0, 255, -127, 127),
    ("u8 0..127 (plain)", 0, 127, -128, 127),
    ("u8 0..255 w7bit (plain)", 0, 255, -64, 64),
];

impl Bench {
    fn report_int8(&mut self, name: &str, macs: f64, (to, tr): (f64, f64)) {
        let g = |t: f64| macs / t / 1e9;
        println!(
            "{name:<58} int8 {:7.1} GMAC/s {:8.3} ms | f32 (ours) {:7.1} GMAC/s {:8.3} ms | int8/f32 {:5.2}",
            g(to),
            to * 1e3,
            g(tr),
            tr * 1e3,
            tr / to
        );
        self.ratios.push((name.to_string(), tr / to));
    }
}

/// int8 [`qgemm`] (u8 output, per-column scale, bias) against our f32
/// [`gemm`] with packed B at the same shape.
/// A recurrent layer's steps (RECURRENT) against the gemm crate doing only
/// the per-step products `[batch, H]·[H, G·H]`, one call per step (the
/// unrolled lowering's GEMMs, without its gate ops).
fn bench_recurrent(b: &mut Bench, name: &str, cell: RecCell, seq: usize, batch: usize, hidden: usize) {
    if !b.wants(name) {
        return;
    }
    let w = cell.gates() * hidden;
    let (x, r, rb) = (data(seq * batch * w, 1), data(w * hidden, 2), data(hidden, 3));
    let lbr = cell == (RecCell::Gru { linear_before_reset: true });
    let p = RecurrentParams { cell, seq, batch, hidden, reverse: false };
    let mut y = vec![0.0f32; seq * batch * hidden];
    let mut c = vec![0.0f32; batch * hidden];
    let lstm = cell == RecCell::Lstm;
    let (h, mut g) = (data(batch * hidden, 4), vec![0.0f32; batch * w]);
    let r_t = data(hidden * w, 5);
    let res = race(
        || {
            let ins = RecurrentInputs { x: &x, r: &r, rb: lbr.then_some(&rb[..]), h0: None, c0: None };
            recurrent(&p, &ins, &mut y, lstm.then_some(&mut c[..])).unwrap();
            black_box(&mut y);
        },
        || {
            for _ in 0..seq {
                raw_gemm(batch, w, hidden, &h, &r_t, &mut g);
            }
        },
    );
    b.report_flops(name, (2 * seq * batch * w * hidden) as f64, res);
}

fn bench_qgemm(b: &mut Bench, name: &str, m: usize, n: usize, k: usize) {
    for (label, alo, ahi, wlo, whi) in QCASES {
        let name = format!("int8 {name} {label}");
        if !b.wants(&name) {
            continue;
        }
        let a = qdata(m * k, 1, alo, ahi);
        let bq = qweights(k, n, 2, wlo, whi);
        let bias: Vec<i32> = (0..n as i32).collect();
        let scale = vec![1e-4f32; n];
        let mut out = vec![0u8; m * n];
        let p = QGemmParams { m, n, k, a_zero: 3, b: &bq, b_zero: None, bias: Some(&bias), scale: &scale };
        let af = data(m * k, 1);
        let mut bf = vec![0.0f32; rbln_hw::ops::gemm_packed_b_len(k as u64, n as u64).unwrap() as usize];
        rbln_hw::ops::pack_gemm_b(&data(k * n, 2), k, n, false, &mut bf);
        let biasf = data(n, 3);
        let mut c = vec![0.0f32; m * n];
        let pf = GemmParams { m, n, k, b_packed: true, ..Default::default() };
        let r = race(
            || {
                qgemm(QTensor { data: &a, signed: false }, &p, QDst::Int { out: &mut out, signed: false, zero: 128, min: 0, max: 255 }).unwrap();
                black_box(&mut out);
            },
            || {
                gemm(&pf, &af, &bf, Some(&biasf), &mut c).unwrap();
                black_box(&mut c);
            },
        );
        b.report_int8(&name, (m * n * k) as f64, r);
    }
}

/// int8 [`qconv2d`] against our f32 [`conv2d`] (bias + relu) on the same geometry.
fn bench_qconv(b: &mut Bench, name: &str, p: Conv2dParams) {
    for (label, alo, ahi, wlo, whi) in QCASES {
        let name = format!("int8 {name} {label}");
        if !b.wants(&name) {
            continue;
        }
        // BENCH_QUADS=1: weights in channel quads, as rbln-compile lays
        // out windows over whole quads of channels (the implicit VNNI
        // path); the same names, so two runs compare with kernels-ab.sh.
        // BENCH_QUADS_1X1=1 besides: 1×1 convolutions too (which
        // rbln-compile does not do: measured 1.26-2.2× the direct path).
        let cg = p.in_channels / p.groups;
        let quads = std::env::var("BENCH_QUADS").is_ok_and(|v| v == "1") && (p.kernel[0] * p.kernel[1] > 1 || std::env::var("BENCH_QUADS_1X1").is_ok()) && cg.is_multiple_of(4);
        // BENCH_TILES=1: weights in the tile layout (the AMX core, as
        // rbln-compile lays out convolutions over 64-channel multiples).
        let tiles = std::env::var("BENCH_TILES").is_ok_and(|v| v == "1");
        let qp = QConvParams { channel_quads: quads, weight_tiles: tiles, ..QConvParams::from(&p) };
        let [bn, co, oh, ow] = conv2d_output_shape(&p).unwrap();
        let kdim = cg * p.kernel[0] * p.kernel[1];
        let og = co / p.groups;
        let x = qdata(p.batch * p.in_channels * p.in_h * p.in_w, 4, alo, ahi);
        let mut wq = Vec::new();
        for g in 0..p.groups {
            // Random weights: the quad order only needs their count.
            let kq = rbln_hw::ops::qconv_k(cg as u64, p.kernel[0] as u64, p.kernel[1] as u64, if quads { rbln_hw::ops::QCONV_CHANNEL_QUADS } else { 0 }).unwrap() as usize;
            if tiles {
                let taps = if quads { p.kernel[0] * p.kernel[1] } else { 1 };
                let w: Vec<i8> = qdata(kq * og, 5 + g as u32, wlo, whi).into_iter().map(|v| v as i8).collect();
                let mut t = vec![0i8; rbln_hw::ops::qconv_tiled_len(kq as u64, og as u64).unwrap() as usize];
                rbln_hw::ops::pack_qconv_tiles(&w, kq, og, taps, &mut t);
                wq.extend(t.into_iter().map(|v| v as u8));
            } else {
                wq.extend(qweights(kq, og, 5 + g as u32, wlo, whi));
            }
        }
        let bias: Vec<i32> = (0..co as i32).collect();
        let scale = vec![1e-4f32; co];
        let mut out = vec![0u8; bn * co * oh * ow];
        let xf = data(x.len(), 4);
        let wf = data(co * kdim, 5);
        let biasf = data(co, 6);
        let mut y = vec![0.0f32; out.len()];
        let r = race(
            || {
                qconv2d(QTensor { data: &x, signed: false }, 3, &wq, None, Some(&bias), &scale, &qp, QDst::Int { out: &mut out, signed: false, zero: 0, min: 0, max: 255 }).unwrap();
                black_box(&mut out);
            },
            || {
                conv2d(&p, &xf, &wf, Some(&biasf), &mut y).unwrap();
                black_box(&mut y);
            },
        );
        b.report_int8(&name, (bn * co * oh * ow * kdim) as f64, r);
    }
}

fn main() {
    // The device runs every kernel on a thread of its own pool (the
    // command processor is the pool's first worker): do the same, so that
    // a kernel's parallel loops start inline instead of being injected
    // into the pool from outside (two context switches per call).
    let pool = rayon::ThreadPoolBuilder::new().build().expect("rayon pool");
    // BENCH_SPIN=1: the other workers spin between kernels, as the
    // device's do between a command buffer's ops (rbln-npu --spin-us),
    // instead of sleeping: no wake-up (~100 µs on a virtualised host) in
    // the timings.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if std::env::var("BENCH_SPIN").is_ok_and(|v| v == "1") {
        for _ in 1..pool.current_num_threads() {
            let stop = stop.clone();
            pool.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
    }
    pool.install(run);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn run() {
    let filters: Vec<String> = std::env::args().skip(1).collect();
    let mut b = Bench {
        filters,
        ratios: Vec::new(),
    };
    let threads = rayon::current_num_threads();
    println!("rbln-kernels benchmark: {threads} rayon threads, best of {}", reps());

    // ---- GEMM (MatMul / Gemm nodes), bias + activation fused.
    use Activation::*;
    bench_gemm(&mut b, "gemm 1024x1024x1024 +bias", 1024, 1024, 1024, None, false);
    bench_gemm(&mut b, "gemm convnext 3136x384x96 +bias+gelu", 3136, 384, 96, Gelu, false);
    bench_gemm(&mut b, "gemm convnext 3136x96x384 +bias+res", 3136, 96, 384, None, true);
    bench_gemm(&mut b, "gemm bert 128x3072x768 +bias+gelu", 128, 3072, 768, Gelu, false);
    bench_gemm(&mut b, "gemm bert 128x768x3072 +bias+res", 128, 768, 3072, None, true);
    bench_gemm(&mut b, "gemm bert 128x768x768 +bias", 128, 768, 768, None, false);
    bench_gemm(&mut b, "gemm bert 128x2304x768 +bias (qkv)", 128, 2304, 768, None, false);
    // Small decoders (the llama/gpt2 exports: 64 tokens, hidden 128).
    bench_gemm(&mut b, "gemm small-llm 64x128x128", 64, 128, 128, None, false);
    bench_gemm(&mut b, "gemm small-llm 64x256x128", 64, 256, 128, None, false);
    bench_gemm(&mut b, "gemm small-llm 64x128x256", 64, 128, 256, None, false);
    bench_gemm(&mut b, "gemm small-llm 64x1000x128 (lm head)", 64, 1000, 128, None, false);
    bench_gemm(&mut b, "gemm small-llm 64x3072x768 (gpt2 fc)", 64, 3072, 768, None, false);
    bench_gemm(&mut b, "gemm classifier 1x1000x1280", 1, 1000, 1280, None, false);
    bench_gemm(&mut b, "gemm classifier 4x1000x1280", 4, 1000, 1280, None, false);
    bench_gemm_t(&mut b, "gemm bert 128x768x768 +bias transB", 128, 768, 768, None, false, true);
    bench_gemm_t(&mut b, "gemm bert 128x3072x768 +bias+gelu transB", 128, 3072, 768, Gelu, false, true);

    // ---- Recurrent layers (the exports' LSTM tagger and CRNN, a larger one).
    bench_recurrent(&mut b, "recurrent lstm seq12 b2 h24 (tagger)", RecCell::Lstm, 12, 2, 24);
    bench_recurrent(&mut b, "recurrent gru seq12 b2 h16 (tagger)", RecCell::Gru { linear_before_reset: true }, 12, 2, 16);
    bench_recurrent(&mut b, "recurrent lstm seq10 b2 h32 (crnn)", RecCell::Lstm, 10, 2, 32);
    bench_recurrent(&mut b, "recurrent lstm seq32 b1 h256", RecCell::Lstm, 32, 1, 256);
    bench_recurrent(&mut b, "recurrent lstm seq16 b4 h512", RecCell::Lstm, 16, 4, 512);

    // ---- int8 (QGEMM / QCONV) against the f32 kernels at the same shapes.
    bench_qgemm(&mut b, "qgemm 1024x1024x1024", 1024, 1024, 1024);
    bench_qgemm(&mut b, "qgemm resnet 3136x64x576", 3136, 64, 576);
    bench_qgemm(&mut b, "qgemm resnet 784x128x1152", 784, 128, 1152);
    bench_qgemm(&mut b, "qgemm resnet 196x256x2304", 196, 256, 2304);
    bench_qgemm(&mut b, "qgemm resnet 49x512x4608", 49, 512, 4608);
    bench_qgemm(&mut b, "qgemm bert 128x768x768", 128, 768, 768);
    bench_qconv(&mut b, "qconv 3x3 s1 64->64 @56", conv_params(64, 64, 56, 3, 1, 1, Relu));
    bench_qconv(&mut b, "qconv 3x3 s1 256->256 @14", conv_params(256, 256, 14, 3, 1, 1, Relu));
    bench_qconv(&mut b, "qconv 1x1 256->64 @56", conv_params(256, 64, 56, 1, 1, 1, Relu));
    // ResNet-50's expansions: a short reduction (64) and many outputs.
    bench_qconv(&mut b, "qconv r50 1x1 64->256 @56 (expand)", conv_params(64, 256, 56, 1, 1, 1, Relu));
    // ResNet-18 layers (int8, quantize_static).
    bench_qconv(&mut b, "qconv r18 3x3 s1 128->128 @28", conv_params(128, 128, 28, 3, 1, 1, Relu));
    bench_qconv(&mut b, "qconv r18 3x3 s1 512->512 @7", conv_params(512, 512, 7, 3, 1, 1, Relu));
    bench_qconv(&mut b, "qconv r18 7x7 s2 3->64 @224 (stem)", conv_params(3, 64, 224, 7, 2, 1, Relu));
    // ResNet-50's strided convs: a stride-2 3x3 and a projection.
    bench_qconv(&mut b, "qconv r50 3x3 s2 128->128 @56", conv_params(128, 128, 56, 3, 2, 1, Relu));
    bench_qconv(&mut b, "qconv r50 1x1 s2 256->512 @56 (proj)", conv_params(256, 512, 56, 1, 2, 1, Relu));
    // MobileNetV2's projections: reductions of 24 and 36 channel quads
    // (with tiles: one or two whole runs and a tail), few outputs.
    bench_qconv(&mut b, "qconv mbv2 1x1 96->24 @56", conv_params(96, 24, 56, 1, 1, 1, Relu));
    bench_qconv(&mut b, "qconv mbv2 1x1 144->32 @28", conv_params(144, 32, 28, 1, 1, 1, Relu));
    bench_qconv(&mut b, "qconv mbv2 1x1 576->160 @7", conv_params(576, 160, 7, 1, 1, 1, Relu));

    // ---- ResNet-50 convolutions (bias + relu fused, as the compiler emits).
    // A batch of 2 small images (the test suite's CIFAR-sized ResNet):
    // per-call costs and thin reductions, not FLOPs, decide these.
    let b2 = |p: Conv2dParams| Conv2dParams { batch: 2, ..p };
    let resnet = [
        ("conv 3x3 s1 3->16 @32 b2 (small)", b2(conv_params(3, 16, 32, 3, 1, 1, Relu)), false),
        ("conv 3x3 s1 16->16 @16 b2 (small)", b2(conv_params(16, 16, 16, 3, 1, 1, Relu)), true),
        ("conv 3x3 s2 16->32 @16 b2 (small)", b2(conv_params(16, 32, 16, 3, 2, 1, Relu)), false),
        ("conv 3x3 s1 32->32 @8 b2 (small)", b2(conv_params(32, 32, 8, 3, 1, 1, Relu)), true),
        ("conv 3x3 s1 64->64 @56", conv_params(64, 64, 56, 3, 1, 1, Relu), false),
        ("conv 3x3 s1 128->128 @28", conv_params(128, 128, 28, 3, 1, 1, Relu), false),
        ("conv 3x3 s1 256->256 @14", conv_params(256, 256, 14, 3, 1, 1, Relu), false),
        ("conv 3x3 s1 512->512 @7", conv_params(512, 512, 7, 3, 1, 1, Relu), false),
        ("conv 1x1 64->256 @56 +res+relu", conv_params(64, 256, 56, 1, 1, 1, Relu), true),
        ("conv 1x1 256->64 @56", conv_params(256, 64, 56, 1, 1, 1, Relu), false),
        ("conv 1x1 1024->256 @14", conv_params(1024, 256, 14, 1, 1, 1, Relu), false),
        ("conv 1x1 2048->512 @7", conv_params(2048, 512, 7, 1, 1, 1, Relu), false),
        // ResNet-50's other bottleneck 1x1s (no residual: comparable with
        // onnxruntime's Conv+Relu on the shape).
        ("conv 1x1 64->256 @56", conv_params(64, 256, 56, 1, 1, 1, Relu), false),
        ("conv 1x1 512->128 @28", conv_params(512, 128, 28, 1, 1, 1, Relu), false),
        ("conv 1x1 128->512 @28", conv_params(128, 512, 28, 1, 1, 1, Relu), false),
        ("conv 1x1 256->1024 @14", conv_params(256, 1024, 14, 1, 1, 1, Relu), false),
        ("conv 1x1 512->2048 @7 +res+relu", conv_params(512, 2048, 7, 1, 1, 1, Relu), true),
        ("conv 3x3 s2 128->128 @56", conv_params(128, 128, 56, 3, 2, 1, Relu), false),
        ("conv 3x3 s2 256->256 @28", conv_params(256, 256, 28, 3, 2, 1, Relu), false),
        ("conv 3x3 s2 512->512 @14", conv_params(512, 512, 14, 3, 2, 1, Relu), false),
        ("conv 1x1 s2 256->512 @56 (proj)", conv_params(256, 512, 56, 1, 2, 1, None), false),
        ("conv 1x1 s2 1024->2048 @14 (proj)", conv_params(1024, 2048, 14, 1, 2, 1, None), false),
        ("conv 7x7 s2 3->64 @224 (stem)", conv_params(3, 64, 224, 7, 2, 1, Relu), false),
        // MobileNet / EfficientNet pointwise.
        ("conv 1x1 16->64 @112 (mbv3)", conv_params(16, 64, 112, 1, 1, 1, Relu), false),
        ("conv 1x1 240->40 @28 (effnet)", conv_params(240, 40, 28, 1, 1, 1, None), false),
        ("conv 1x1 16->96 @112 (effnet)", conv_params(16, 96, 112, 1, 1, 1, Silu), false),
        ("conv 1x1 16->96 @112 noact (effnet)", conv_params(16, 96, 112, 1, 1, 1, None), false),
        ("conv 1x1 320->1280 @7 (effnet head)", conv_params(320, 1280, 7, 1, 1, 1, Silu), false),
        ("conv 3x3 s2 3->32 @224 (effnet stem)", conv_params(3, 32, 224, 3, 2, 1, Silu), false),
        ("conv 3x3 s2 3->16 @224 (mbv3 stem)", conv_params(3, 16, 224, 3, 2, 1, Relu), false),
        // Squeeze-excite FCs: 1x1 convs on a 1x1 map (matrix-vector).
        ("conv 1x1 576->144 @1 (mbv3 SE)", conv_params(576, 144, 1, 1, 1, 1, Relu), false),
        ("conv 1x1 144->576 @1 (mbv3 SE)", conv_params(144, 576, 1, 1, 1, 1, None), false),
        ("conv 1x1 1152->48 @1 (effnet SE)", conv_params(1152, 48, 1, 1, 1, 1, Silu), false),
        // Small feature maps (the test suite's CNNs): fixed costs dominate.
        ("conv 3x3 s1 16->16 @16 (small)", conv_params(16, 16, 16, 3, 1, 1, Relu), false),
        ("conv 3x3 s1 32->32 @8 (small)", conv_params(32, 32, 8, 3, 1, 1, Relu), false),
        ("conv 3x3 s1 3->16 @32 (small stem)", conv_params(3, 16, 32, 3, 1, 1, Relu), false),
        ("conv 3x3 s1 16->32 @16x20 b2 (small crnn)", Conv2dParams { batch: 2, in_w: 20, ..conv_params(16, 32, 16, 3, 1, 1, Relu) }, false),
        // Few channels on large maps (UNet's and YOLO's first stages).
        ("conv 3x3 s1 16->32 @112 (unet)", conv_params(16, 32, 112, 3, 1, 1, Relu), false),
        ("conv 3x3 s1 32->64 @112 (unet)", conv_params(32, 64, 112, 3, 1, 1, Relu), false),
        ("conv 3x3 s2 32->64 @160 (yolo)", conv_params(32, 64, 160, 3, 2, 1, Silu), false),
        ("conv 3x3 s1 128->128 @20 (yolo)", conv_params(128, 128, 20, 3, 1, 1, Silu), false),
        ("conv 1x1 256->128 @20 (yolo)", conv_params(256, 128, 20, 1, 1, 1, Silu), false),
        // RegNetY-400MF's first stage: narrow 1x1s, a strided projection and
        // grouped 3x3s of group width 8.
        ("conv 1x1 32->48 @112 (regnet)", conv_params(32, 48, 112, 1, 1, 1, Relu), false),
        ("conv 1x1 s2 32->48 @112 (regnet proj)", conv_params(32, 48, 112, 1, 2, 1, None), false),
        ("conv 3x3 s2 g6 48->48 @112 (regnet)", conv_params(48, 48, 112, 3, 2, 6, Relu), false),
        ("conv 3x3 s1 g13 104->104 @28 (regnet)", conv_params(104, 104, 28, 3, 1, 13, Relu), false),
        // MobileNetV2's pointwise convs (ReLU6).
        ("conv 1x1 96->576 @14 (mbv2)", conv_params(96, 576, 14, 1, 1, 1, Clip { min: 0.0, max: 6.0 }), false),
        ("conv 1x1 32->192 @28 (mbv2)", conv_params(32, 192, 28, 1, 1, 1, Clip { min: 0.0, max: 6.0 }), false),
        ("conv 1x1 960->160 @7 (mbv2)", conv_params(960, 160, 7, 1, 1, 1, None), false),
        // MobileNetV3-small's late expansions and final conv (HardSwish):
        // few positions, a short reduction.
        ("conv 1x1 96->576 @7 (mbv3s)", conv_params(96, 576, 7, 1, 1, 1, HardSwish), false),
        ("conv 1x1 48->288 @7 (mbv3s)", conv_params(48, 288, 7, 1, 1, 1, HardSwish), false),
        // DenseNet-121: 3x3 convs to 32 channels (growth rate) and 1x1s
        // from the growing concatenation to 128.
        ("conv 3x3 s1 128->32 @56 (densenet)", conv_params(128, 32, 56, 3, 1, 1, None), false),
        ("conv 3x3 s1 128->32 @28 (densenet)", conv_params(128, 32, 28, 3, 1, 1, None), false),
        ("conv 3x3 s1 128->32 @14 (densenet)", conv_params(128, 32, 14, 3, 1, 1, None), false),
        ("conv 1x1 224->128 @56 (densenet)", conv_params(224, 128, 56, 1, 1, 1, Relu), false),
        ("conv 1x1 256->128 @56 (densenet transition)", conv_params(256, 128, 56, 1, 1, 1, None), false),
        ("conv 1x1 768->128 @14 (densenet)", conv_params(768, 128, 14, 1, 1, 1, Relu), false),
        ("conv 1x1 768->128 @7 (densenet)", conv_params(768, 128, 7, 1, 1, 1, Relu), false),
    ];
    for (name, p, res) in resnet {
        bench_conv(&mut b, name, p, res);
    }
    // The stride-1 3×3 ones again with the filters in Winograd's domain
    // (CONV_WINOGRAD), where the compiler chooses it.
    for (name, p, res) in resnet.iter().filter(|(_, p, _)| p.kernel == [3, 3] && p.stride == [1, 1] && p.groups == 1) {
        bench_conv(&mut b, &format!("{name} winograd"), *p, *res);
    }
    // Few output positions, long reductions: SegFormer's patch embeddings
    // (3×3 s2 down to 2×2 and 4×4) and its attention's spatial-reduction
    // convs (kernel = stride, unpadded, to a 2×2 map).
    let unpadded = |p: Conv2dParams| Conv2dParams { padding: Padding2d::default(), ..p };
    let few = [
        ("conv 3x3 s2 160->256 @4 (segformer)", conv_params(160, 256, 4, 3, 2, 1, None)),
        ("conv 3x3 s2 64->160 @8 (segformer)", conv_params(64, 160, 8, 3, 2, 1, None)),
        ("conv 8x8 s8 32->32 @16 (segformer sr)", unpadded(conv_params(32, 32, 16, 8, 8, 1, None))),
        ("conv 2x2 s2 160->160 @4 (segformer sr)", unpadded(conv_params(160, 160, 4, 2, 2, 1, None))),
        // Patchify stems (kernel = stride, unpadded): ViT/DINOv2 and Swin.
        ("conv 14x14 s14 3->128 @98x126 (dinov2 patch)", Conv2dParams { in_w: 126, ..unpadded(conv_params(3, 128, 98, 14, 14, 1, None)) }),
        ("conv 4x4 s4 3->96 @224 (swin patch)", unpadded(conv_params(3, 96, 224, 4, 4, 1, None))),
    ];
    for (name, p) in few {
        bench_conv(&mut b, name, p, false);
    }
    // DeepLabV3's ASPP: 3×3 convs dilated 12 and 24 on a 32×32 map (and
    // with a quarter of its 2048 input channels).
    for (d, c) in [(12, 512), (24, 512), (12, 2048)] {
        let p = Conv2dParams { padding: Padding2d::uniform(d), dilation: [d, d], ..conv_params(c, 256, 32, 3, 1, 1, Relu) };
        bench_conv(&mut b, &format!("conv 3x3 dil {d} {c}->256 @32 (aspp)"), p, false);
    }
    // Its backbone's dilated stages (output stride 8).
    for (d, c) in [(2, 256), (4, 512)] {
        let p = Conv2dParams { padding: Padding2d::uniform(d), dilation: [d, d], ..conv_params(c, c, 32, 3, 1, 1, Relu) };
        bench_conv(&mut b, &format!("conv 3x3 dil {d} {c}->{c} @32 (deeplab)"), p, false);
    }
    // ---- Depthwise (MobileNetV3 / EfficientNet-B0).
    let hs = Clip { min: 0.0, max: 6.0 };
    let dw = [
        ("dw 3x3 s1 32 @112", conv_params(32, 32, 112, 3, 1, 32, Silu)),
        ("dw 3x3 s2 96 @112", conv_params(96, 96, 112, 3, 2, 96, Silu)),
        ("dw 3x3 s1 64 @56 (mbv3)", conv_params(64, 64, 56, 3, 1, 64, Relu)),
        ("dw 5x5 s2 144 @56", conv_params(144, 144, 56, 5, 2, 144, Silu)),
        ("dw 5x5 s1 240 @28", conv_params(240, 240, 28, 5, 1, 240, Silu)),
        ("dw 3x3 s1 480 @14", conv_params(480, 480, 14, 3, 1, 480, Silu)),
        ("dw 5x5 s1 672 @14", conv_params(672, 672, 14, 5, 1, 672, hs)),
        ("dw 5x5 s1 1152 @7", conv_params(1152, 1152, 7, 5, 1, 1152, Silu)),
        // MobileNetV2's (ReLU6).
        ("dw 3x3 s2 144 @56 (mbv2)", conv_params(144, 144, 56, 3, 2, 144, hs)),
        ("dw 3x3 s1 576 @14 (mbv2)", conv_params(576, 576, 14, 3, 1, 576, hs)),
        ("dw 3x3 s1 960 @7 (mbv2)", conv_params(960, 960, 7, 3, 1, 960, hs)),
        // MobileNetV3-small's (ReLU, then HardSwish).
        ("dw 3x3 s2 16 @112 (mbv3s)", conv_params(16, 16, 112, 3, 2, 16, Relu)),
        ("dw 3x3 s2 72 @56 (mbv3s)", conv_params(72, 72, 56, 3, 2, 72, Relu)),
        ("dw 3x3 s1 88 @28 (mbv3s)", conv_params(88, 88, 28, 3, 1, 88, Relu)),
        ("dw 5x5 s2 96 @28 (mbv3s)", conv_params(96, 96, 28, 5, 2, 96, HardSwish)),
        ("dw 5x5 s1 240 @14 (mbv3s)", conv_params(240, 240, 14, 5, 1, 240, HardSwish)),
        ("dw 5x5 s2 288 @14 (mbv3s)", conv_params(288, 288, 14, 5, 2, 288, HardSwish)),
        ("dw 5x5 s1 576 @7 (mbv3s)", conv_params(576, 576, 7, 5, 1, 576, HardSwish)),
    ];
    for (name, p) in dw {
        bench_conv(&mut b, name, p, false);
    }

    // ---- Activations in place on an L2-resident block (as conv epilogues
    // run them): the cost per element of the math, against a copy.
    let n = 32 * 1024;
    for (label, op) in [("relu", UnaryOp::Relu), ("silu", UnaryOp::Silu), ("sigmoid", UnaryOp::Sigmoid), ("gelu", UnaryOp::Gelu), ("tanh", UnaryOp::Tanh)] {
        let name = format!("{label} in place 128KB");
        if b.wants(&name) {
            let mut x = data(n, 3);
            b.mem(&name, 8 * n, || {
                unary_inplace(op, &mut x).unwrap();
                black_box(&mut x);
            });
        }
    }

    // ---- Copies whose destination is a few bytes past the source modulo
    // 4 KiB (the rows of a concatenation or a slice can be).
    b.copy_at_distance("copy 64 KiB, +16 B mod 4 KiB", 64 << 10, 16);
    b.copy_at_distance("copy 64 KiB, +2 KiB mod 4 KiB", 64 << 10, 2048);

    // ---- Memory-bound element-wise kernels.
    let mid = 256 * 56 * 56; // 3.2 MB: ResNet stage-1 residual
    let big = 4 << 20; // 16 MiB
    let small = 50 * 1024; // 200 KB
    for (label, n) in [("200KB", small), ("3.2MB", mid), ("16MiB", big)] {
        let a = data(n, 1);
        let bb = data(n, 2);
        let mut out = vec![0.0f32; n];
        let name = format!("add {label}");
        if b.wants(&name) {
            b.mem(&name, 12 * n, || {
                binary(BinaryOp::Add, &a, &[n], &bb, &[n], &mut out).unwrap();
                black_box(&mut out);
            });
        }
        // The int8 residual add (QBINARY) over as many elements (3 bytes an
        // element moved).
        let name = format!("int8 add+relu (qbinary) {label} elements");
        if b.wants(&name) {
            let (qa, qb) = (qdata(n, 5, 0, 255), qdata(n, 6, -128, 127));
            let mut qo = vec![0u8; n];
            b.mem(&name, 3 * n, || {
                let a = QOperand { q: QTensor { data: &qa, signed: false }, scale: 0.03, zero: 3 };
                let c = QOperand { q: QTensor { data: &qb, signed: true }, scale: 0.05, zero: -2 };
                qbinary(QBinaryKind::Add, a, c, true, &mut qo, false, 0.04, 0).unwrap();
                black_box(&mut qo);
            });
        }
        // Scales as calibration picks them (no simple ratios between
        // them: rounding ties are rare, unlike 0.03 + 0.05 over 0.04).
        let name = format!("int8 add+relu (qbinary, calibrated scales) {label} elements");
        if b.wants(&name) {
            let (qa, qb) = (qdata(n, 5, 0, 255), qdata(n, 6, -128, 127));
            let mut qo = vec![0u8; n];
            b.mem(&name, 3 * n, || {
                let a = QOperand { q: QTensor { data: &qa, signed: false }, scale: 0.031_73, zero: 3 };
                let c = QOperand { q: QTensor { data: &qb, signed: true }, scale: 0.052_91, zero: -2 };
                qbinary(QBinaryKind::Add, a, c, true, &mut qo, false, 0.041_17, 0).unwrap();
                black_box(&mut qo);
            });
        }
        let name = format!("add+relu fused {label}");
        if b.wants(&name) {
            b.mem(&name, 12 * n, || {
                binary_act(BinaryOp::Add, &a, &[n], &bb, &[n], Relu, &mut out).unwrap();
                black_box(&mut out);
            });
        }
        for (opname, op) in [
            ("relu", UnaryOp::Relu),
            ("sigmoid", UnaryOp::Sigmoid),
            ("silu", UnaryOp::Silu),
            ("gelu", UnaryOp::Gelu),
            ("clip", UnaryOp::Clip { min: 0.0, max: 6.0 }),
        ] {
            let name = format!("{opname} {label}");
            if b.wants(&name) {
                b.mem(&name, 8 * n, || {
                    unary(op, &a, &mut out).unwrap();
                    black_box(&mut out);
                });
            }
            let name = format!("{opname} inplace {label}");
            if opname == "relu" && b.wants(&name) {
                let mut x = a.clone();
                b.mem(&name, 8 * n, || {
                    unary_inplace(op, &mut x).unwrap();
                    black_box(&mut x);
                });
            }
        }
    }
    // Squeeze-excite channel scale and BN-style per-channel ops.
    for (c, hw) in [(96usize, 112usize), (240, 28), (1152, 7)] {
        let name = format!("mul bcast [1,{c},{hw},{hw}]x[1,{c},1,1]");
        if b.wants(&name) {
            let n = c * hw * hw;
            let a = data(n, 1);
            let s = data(c, 2);
            let mut out = vec![0.0f32; n];
            b.mem(&name, 8 * n, || {
                binary(BinaryOp::Mul, &a, &[1, c, hw, hw], &s, &[1, c, 1, 1], &mut out).unwrap();
                black_box(&mut out);
            });
        }
    }
    // Pre-activation BatchNorm + ReLU (DenseNet) as the compiler fuses it:
    // one ELTWISE program x·scale[c] + shift[c], relu.
    for (c, hw) in [(256usize, 56usize), (512, 28), (864, 7)] {
        let name = format!("eltwise bn+relu [1,{c},{hw},{hw}]");
        if b.wants(&name) {
            let n = c * hw * hw;
            let (x, sc, sh) = (data(n, 1), data(c, 2), data(c, 3));
            let mut out = vec![0.0f32; n];
            let steps = [
                EltStep::Binary { op: BinaryOp::Mul, dst: 0, a: EltOperand::Reg(0), b: EltOperand::Reg(1) },
                EltStep::Binary { op: BinaryOp::Add, dst: 0, a: EltOperand::Reg(0), b: EltOperand::Reg(2) },
                EltStep::Unary { op: UnaryOp::Relu, dst: 0, a: 0 },
            ];
            let (xs, cs) = ([c * hw * hw, hw * hw, hw, 1], [0, 1, 0, 0]);
            b.mem(&name, 8 * n, || {
                eltwise(&steps, 0, &[(&x, &xs), (&sc, &cs), (&sh, &cs)], &[1, c, hw, hw], &mut out).unwrap();
                black_box(&mut out);
            });
        }
    }
    // Concatenations that cannot be done in place (rows > 1): one CONCAT,
    // and the STRIDED_COPY per input it replaced. YOLOv8's detection head
    // (three maps' channels along the positions), then many short rows.
    for (rows, cols) in [(64usize, vec![6400usize, 1600, 400]), (2, vec![8; 13])] {
        let out_cols: usize = cols.iter().sum();
        let srcs: Vec<Vec<f32>> = cols.iter().enumerate().map(|(i, &c)| data(rows * c, i as u32)).collect();
        let mut out = vec![0.0f32; rows * out_cols];
        let bytes = 8 * rows * out_cols;
        let name = format!("concat rows {rows} x {cols:?}");
        if b.wants(&name) {
            b.mem(&name, bytes, || {
                let mut at = 0;
                let parts: Vec<ConcatPart<'_>> = srcs.iter().zip(&cols).map(|(s, &c)| { at += c; ConcatPart { src: s, col: at - c, cols: c } }).collect();
                concat_rows(rows, out_cols, &parts, &mut out).unwrap();
                black_box(&mut out);
            });
        }
        let name = format!("strided copies rows {rows} x {cols:?}");
        if b.wants(&name) {
            b.mem(&name, bytes, || {
                let mut at = 0;
                for (s, &c) in srcs.iter().zip(&cols) {
                    let (ss, ds) = ([c as isize, 1], [out_cols as isize, 1]);
                    let p = StridedCopy { sizes: &[rows, c], src_offset: 0, src_strides: &ss, dst_offset: at, dst_strides: &ds };
                    strided_copy(&p, s, &mut out).unwrap();
                    at += c;
                }
                black_box(&mut out);
            });
        }
    }
    // Pooling.
    let pools = [
        ("maxpool 3x3 s2 64@112 (stem)", Pool2dParams {
            channels: 64,
            in_h: 112,
            in_w: 112,
            kernel: [3, 3],
            stride: [2, 2],
            padding: Padding2d::uniform(1),
            ..Default::default()
        }),
        // The test CNN's (batch 2).
        ("maxpool 3x3 s2 16@32 b2 (small)", Pool2dParams {
            batch: 2,
            channels: 16,
            in_h: 32,
            in_w: 32,
            kernel: [3, 3],
            stride: [2, 2],
            padding: Padding2d::uniform(1),
            ..Default::default()
        }),
        // The CRNN export's pools (batch 2): 2x2, then 2x1.
        ("maxpool 2x2 s2 16@32x40 b2 (crnn)", Pool2dParams {
            batch: 2,
            channels: 16,
            in_h: 32,
            in_w: 40,
            kernel: [2, 2],
            stride: [2, 2],
            ..Default::default()
        }),
        // GoogLeNet's inception branch pool (stride 1) and a downsampling
        // one (ceil mode: one more row and column of padding).
        ("maxpool 3x3 s1 512@14 (googlenet)", Pool2dParams {
            channels: 512,
            in_h: 14,
            in_w: 14,
            kernel: [3, 3],
            padding: Padding2d::uniform(1),
            ..Default::default()
        }),
        ("maxpool 3x3 s2 ceil 480@28 (googlenet)", Pool2dParams {
            channels: 480,
            in_h: 28,
            in_w: 28,
            kernel: [3, 3],
            stride: [2, 2],
            padding: Padding2d { top: 0, left: 0, bottom: 1, right: 1 },
            ..Default::default()
        }),
        ("maxpool 2x1 s2x1 32@16x20 b2 (crnn)", Pool2dParams {
            batch: 2,
            channels: 32,
            in_h: 16,
            in_w: 20,
            kernel: [2, 1],
            stride: [2, 1],
            ..Default::default()
        }),
        ("gap 2048@7", Pool2dParams {
            channels: 2048,
            in_h: 7,
            in_w: 7,
            kernel: [7, 7],
            kind: PoolKind::Avg { count_include_pad: false },
            ..Default::default()
        }),
        ("gap 1280@7", Pool2dParams {
            channels: 1280,
            in_h: 7,
            in_w: 7,
            kernel: [7, 7],
            kind: PoolKind::Avg { count_include_pad: false },
            ..Default::default()
        }),
        ("gap 672@14 (se)", Pool2dParams {
            channels: 672,
            in_h: 14,
            in_w: 14,
            kernel: [14, 14],
            kind: PoolKind::Avg { count_include_pad: false },
            ..Default::default()
        }),
    ];
    for (name, p) in pools {
        if !b.wants(name) {
            continue;
        }
        let [_, c, oh, ow] = pool2d_output_shape(&p).unwrap();
        let x = data(p.batch * p.channels * p.in_h * p.in_w, 1);
        let mut y = vec![0.0f32; p.batch * c * oh * ow];
        b.mem(name, 4 * (x.len() + y.len()), || {
            pool2d(&p, &x, &mut y).unwrap();
            black_box(&mut y);
        });
    }
    // The int8 ResNets' stem pool on bytes (QDQ MaxPool lowered by the
    // compiler).
    let name = "int8 maxpool 3x3 s2 64@112 (stem)";
    if b.wants(name) {
        let p = Pool2dParams { channels: 64, in_h: 112, in_w: 112, kernel: [3, 3], stride: [2, 2], padding: Padding2d::uniform(1), ..Default::default() };
        let x = qdata(64 * 112 * 112, 3, 0, 255);
        let mut y = vec![0u8; 64 * 56 * 56];
        b.mem(name, x.len() + y.len(), || {
            pool2d_int8(&p, &x, false, &mut y).unwrap();
            black_box(&mut y);
        });
    }
    // Softmax / layer norm (BERT-base, seq 128).
    {
        let name = "softmax [12,128,128] axis -1";
        if b.wants(name) {
            let n = 12 * 128 * 128;
            let x = data(n, 1);
            let mut y = vec![0.0f32; n];
            b.mem(name, 8 * n, || {
                softmax(&[12, 128, 128], -1, &x, &mut y).unwrap();
                black_box(&mut y);
            });
        }
        let name = "layer_norm [128,768]";
        if b.wants(name) {
            let n = 128 * 768;
            let x = data(n, 1);
            let g = data(768, 2);
            let be = data(768, 3);
            let mut y = vec![0.0f32; n];
            b.mem(name, 8 * n, || {
                layer_norm(&x, 768, Some(&g), Some(&be), 1e-5, &mut y).unwrap();
                black_box(&mut y);
            });
        }
        let name = "layer_norm [3136,96] (convnext)";
        if b.wants(name) {
            let n = 3136 * 96;
            let x = data(n, 1);
            let g = data(96, 2);
            let be = data(96, 3);
            let mut y = vec![0.0f32; n];
            b.mem(name, 8 * n, || {
                layer_norm(&x, 96, Some(&g), Some(&be), 1e-6, &mut y).unwrap();
                black_box(&mut y);
            });
        }
    }
    // Copies.
    {
        let name = "permute [1,12,128,64]->[1,128,12,64]";
        if b.wants(name) {
            let n = 12 * 128 * 64;
            let x = data(n, 1);
            let mut y = vec![0.0f32; n];
            b.mem(name, 8 * n, || {
                permute(&[1, 12, 128, 64], &[0, 2, 1, 3], &x, &mut y).unwrap();
                black_box(&mut y);
            });
        }
        let name = "permute NCHW->NHWC [1,96,56,56]";
        if b.wants(name) {
            let n = 96 * 56 * 56;
            let x = data(n, 1);
            let mut y = vec![0.0f32; n];
            b.mem(name, 8 * n, || {
                permute(&[1, 96, 56, 56], &[0, 2, 3, 1], &x, &mut y).unwrap();
                black_box(&mut y);
            });
        }
        let name = "strided_copy slice [256,56,56]->[256,28,56]";
        if b.wants(name) {
            let n = 256 * 56 * 56;
            let x = data(n, 1);
            let mut y = vec![0.0f32; n / 2];
            let sizes = [256usize, 28, 56];
            let ss = [56 * 56isize, 56, 1];
            let ds = [28 * 56isize, 56, 1];
            b.mem(name, 4 * n, || {
                strided_copy(
                    &StridedCopy {
                        sizes: &sizes,
                        src_offset: 0,
                        src_strides: &ss,
                        dst_offset: 0,
                        dst_strides: &ds,
                    },
                    &x,
                    &mut y,
                )
                .unwrap();
                black_box(&mut y);
            });
        }
    }

    if b.ratios.len() > 1 {
        let geo = (b.ratios.iter().map(|(_, r)| r.ln()).sum::<f64>() / b.ratios.len() as f64).exp();
        println!("geometric mean ratio over {} benchmarks: {geo:.3}", b.ratios.len());
    }
}
