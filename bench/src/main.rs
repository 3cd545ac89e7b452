//! `rbln-bench-host`: the host-side references of `make bench`
//! (scripts/bench.sh), measured on the host the device model runs on.
//!
//!     rbln-bench-host --threads 2 --gemm 1024 --copy 16777216 --copy 1048576
//!
//! - GEMM `m = n = k` with the `gemm` crate (the engine of the device
//!   model's kernels) on a rayon pool of `--threads` threads, as the device
//!   calls it (`Parallelism::Rayon(0)` inside the pool): GFLOP/s.
//! - Copy bandwidth of `--copy` bytes: one thread (`memcpy`, the reference
//!   of one DMA engine) and `--threads` threads (the rayon pool splitting
//!   the copy, the reference of a data-parallel element-wise kernel).
//!
//! Every figure is the median of `--reps` timed runs after a warm-up; the
//! best run is reported too. One JSON object on stdout.

use std::hint::black_box;
use std::time::Instant;

use clap::Parser;
use rayon::prelude::*;
use serde_json::json;

#[derive(Parser)]
#[command(about = "Host references for make bench: gemm-crate GEMM and copy bandwidth")]
struct Args {
    /// Threads of the rayon pool (the device model's compute threads).
    #[arg(long)]
    threads: usize,
    /// GEMM size: m = n = k (0 skips the GEMM).
    #[arg(long, default_value_t = 1024)]
    gemm: usize,
    /// Copy sizes in bytes (repeatable).
    #[arg(long)]
    copy: Vec<usize>,
    /// Timed runs per measurement (after one warm-up run).
    #[arg(long, default_value_t = 15)]
    reps: usize,
}

/// Median and best of `reps` timed runs of `f` after one warm-up, in seconds.
fn time(reps: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let mut t: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], t[0])
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

fn gemm_bench(n: usize, reps: usize) -> serde_json::Value {
    let a = data(n * n, 1);
    let b = data(n * n, 2);
    let mut c = vec![0.0f32; n * n];
    let (med, best) = time(reps, || {
        // SAFETY: a, b, c are n x n row-major (row stride n, column stride
        // 1) and c does not alias a or b.
        unsafe {
            gemm::gemm(
                n,
                n,
                n,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                n as isize,
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
        }
        black_box(&c);
    });
    let flop = 2.0 * (n as f64).powi(3);
    json!({"m": n, "n": n, "k": n, "median_ms": med * 1e3, "best_ms": best * 1e3,
           "gflops": flop / med / 1e9, "best_gflops": flop / best / 1e9})
}

fn copy_bench(bytes: usize, threads: usize, reps: usize) -> serde_json::Value {
    let src: Vec<u8> = (0..bytes).map(|i| (i * 31 + 7) as u8).collect();
    let mut dst = vec![0u8; bytes];
    let (med1, best1) = time(reps, || {
        dst.copy_from_slice(black_box(&src));
        black_box(&dst);
    });
    let chunk = bytes.div_ceil(threads.max(1)).max(1);
    let (medn, bestn) = time(reps, || {
        dst.par_chunks_mut(chunk).zip(src.par_chunks(chunk)).for_each(|(d, s)| d.copy_from_slice(s));
        black_box(&dst);
    });
    let gb = |t: f64| bytes as f64 / t / 1e9;
    json!({
        "bytes": bytes,
        "memcpy_1t": {"median_ms": med1 * 1e3, "best_ms": best1 * 1e3,
                      "gbps": gb(med1), "gbps_read_write": 2.0 * gb(med1)},
        "copy_nt": {"threads": threads, "median_ms": medn * 1e3, "best_ms": bestn * 1e3,
                    "gbps": gb(medn), "gbps_read_write": 2.0 * gb(medn)},
    })
}

fn main() {
    let args = Args::parse();
    let pool = match rayon::ThreadPoolBuilder::new().num_threads(args.threads).build() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rbln-bench-host: cannot build a pool of {} threads: {e}", args.threads);
            std::process::exit(1);
        }
    };
    let out = pool.install(|| {
        let gemm = (args.gemm > 0).then(|| gemm_bench(args.gemm, args.reps));
        let copies: Vec<_> = args.copy.iter().map(|&b| copy_bench(b, args.threads, args.reps)).collect();
        json!({"threads": rayon::current_num_threads(), "reps": args.reps, "gemm": gemm, "copy": copies,
               "kernels_isa": rbln_kernels::isa_summary()})
    });
    println!("{out}");
}
