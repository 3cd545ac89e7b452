//! GEMM / conv throughput of rbln-kernels against the raw `gemm` crate.
//!
//! `cargo run -p rbln-kernels --release --example gemm_bench`
//! (set RAYON_NUM_THREADS to change the thread count).

use rbln_kernels::{conv2d, gemm, Activation, Conv2dParams, GemmParams, Padding2d};
use std::hint::black_box;
use std::time::Instant;

const REPS: usize = 20;

/// Best wall time of `REPS` runs (after one warm-up), in seconds.
fn best_of(mut f: impl FnMut()) -> f64 {
    f();
    (0..REPS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
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

fn main() {
    let threads = rayon::current_num_threads();
    println!("rbln-kernels benchmark: {threads} rayon threads, best of {REPS}");

    let (m, n, k) = (1024usize, 1024usize, 1024usize);
    let a = data(m * k, 1);
    let b = data(k * n, 2);
    let bias = data(n, 3);
    let mut c = vec![0.0f32; m * n];
    let flops = 2.0 * (m * n * k) as f64;

    let raw = best_of(|| unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
        black_box(&c);
    });
    let plain = GemmParams { m, n, k, ..Default::default() };
    let ours = best_of(|| {
        gemm(&plain, &a, &b, None, &mut c).unwrap();
        black_box(&c);
    });
    let fused = GemmParams { activation: Activation::Relu, ..plain };
    let ours_fused = best_of(|| {
        gemm(&fused, &a, &b, Some(&bias), &mut c).unwrap();
        black_box(&c);
    });
    let gelu = GemmParams { activation: Activation::Gelu, ..plain };
    let ours_gelu = best_of(|| {
        gemm(&gelu, &a, &b, Some(&bias), &mut c).unwrap();
        black_box(&c);
    });
    let g = |t: f64| flops / t / 1e9;
    println!("gemm 1024x1024x1024 raw gemm crate     : {:7.1} GFLOP/s ({:.2} ms)", g(raw), raw * 1e3);
    println!(
        "gemm 1024x1024x1024 rbln gemm          : {:7.1} GFLOP/s ({:.2} ms)  ratio {:.3}",
        g(ours),
        ours * 1e3,
        raw / ours
    );
    println!(
        "gemm 1024x1024x1024 rbln + bias + relu : {:7.1} GFLOP/s ({:.2} ms)  ratio {:.3}",
        g(ours_fused),
        ours_fused * 1e3,
        raw / ours_fused
    );
    println!(
        "gemm 1024x1024x1024 rbln + bias + gelu : {:7.1} GFLOP/s ({:.2} ms)  ratio {:.3}",
        g(ours_gelu),
        ours_gelu * 1e3,
        raw / ours_gelu
    );

    let convs = [
        ("conv 3x3 pad1 N1 C64 56x56 -> 64 ", Conv2dParams {
            batch: 1,
            in_channels: 64,
            in_h: 56,
            in_w: 56,
            out_channels: 64,
            kernel: [3, 3],
            padding: Padding2d::uniform(1),
            activation: Activation::Relu,
            ..Default::default()
        }),
        ("conv 1x1 N1 C256 56x56 -> 64     ", Conv2dParams {
            batch: 1,
            in_channels: 256,
            in_h: 56,
            in_w: 56,
            out_channels: 64,
            activation: Activation::Relu,
            ..Default::default()
        }),
        ("dwconv 3x3 pad1 N1 C256 56x56    ", Conv2dParams {
            batch: 1,
            in_channels: 256,
            in_h: 56,
            in_w: 56,
            out_channels: 256,
            kernel: [3, 3],
            padding: Padding2d::uniform(1),
            groups: 256,
            activation: Activation::Relu,
            ..Default::default()
        }),
    ];
    for (name, p) in convs {
        let [bn, co, oh, ow] = rbln_kernels::conv2d_output_shape(&p).unwrap();
        let x = data(p.batch * p.in_channels * p.in_h * p.in_w, 4);
        let w = data(co * (p.in_channels / p.groups) * p.kernel[0] * p.kernel[1], 5);
        let bias = data(co, 6);
        let mut y = vec![0.0f32; bn * co * oh * ow];
        let t = best_of(|| {
            conv2d(&p, &x, &w, Some(&bias), &mut y).unwrap();
            black_box(&y);
        });
        let flops = 2.0 * (bn * co * oh * ow * (p.in_channels / p.groups) * p.kernel[0] * p.kernel[1]) as f64;
        println!("{name}: {:7.1} GFLOP/s ({:.3} ms)", flops / t / 1e9, t * 1e3);
    }
}
