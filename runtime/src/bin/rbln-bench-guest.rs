//! `rbln-bench-guest`: the guest-side micro-benchmarks of `make bench`
//! (tests/bench/guest.sh runs it in the VM; scripts/bench.sh aggregates).
//!
//!     rbln-bench-guest dma --size 16777216 --size 1048576 [--reps 7] [--stream 4]
//!     rbln-bench-guest latency [--runs 200] [--warmup 20]
//!
//! `dma`: DMA_COPY host memory -> device DRAM and back, timed with TIMESTAMP
//! packets around each copy (device clock): per repetition one submission
//! of `--stream` copies each way back to back; the medians are of the
//! streaming copies, the first copy of a submission (an idle device
//! starting) reported apart.
//! `latency`: NOP submit -> fence round trips on a kernel queue
//! (RBLN_IOCTL_SUBMIT + FENCE_WAIT, interrupt-driven) and on a user-mode
//! queue (ring + doorbell written from user space, spin on the status
//! block), timed in the guest.
//!
//! One JSON object on stdout; progress and errors on stderr.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use rbln_runtime::clock;
use rbln_umd::{CommandBuffer, Device, Perms, Placement, Submit};
use serde_json::json;

#[derive(Parser)]
#[command(about = "Guest-side micro-benchmarks of make bench (DMA bandwidth, submit latency)")]
struct Args {
    /// Device index (/dev/rblnN).
    #[arg(long, default_value_t = 0, global = true)]
    device: u32,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// DMA host -> DRAM and DRAM -> host, device-timestamped.
    Dma {
        /// Bytes per copy (repeatable).
        #[arg(long = "size", required = true)]
        sizes: Vec<u64>,
        /// Timed submissions per size (after one warm-up).
        #[arg(long, default_value_t = 7)]
        reps: usize,
        /// Copies each way per submission, back to back: all but the
        /// first host -> DRAM copy are timed as the engine streaming.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
        stream: u64,
    },
    /// NOP submit -> fence latency, kernel and user-mode submission.
    Latency {
        /// Timed round trips per path.
        #[arg(long, default_value_t = 200)]
        runs: usize,
        /// Untimed round trips per path first.
        #[arg(long, default_value_t = 20)]
        warmup: usize,
    },
}

const WAIT: Duration = Duration::from_secs(60);

/// `map_err` helper: "what: error".
fn e(what: &'static str) -> impl Fn(rbln_umd::Error) -> String {
    move |err| format!("{what}: {err}")
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn dma(dev: &Device, sizes: &[u64], reps: usize, stream: usize) -> Result<serde_json::Value, String> {
    let queue = dev.create_queue(0).map_err(e("create queue"))?;
    let mut rows = Vec::new();
    for &size in sizes {
        let ts = size.div_ceil(4096) * 4096;
        let nts = 2 * stream as u64 + 1;
        let host = dev.alloc(ts + 8 * nts, Placement::Host).map_err(e("alloc host"))?;
        let dram = dev.alloc(size, Placement::Dram).map_err(e("alloc DRAM"))?;
        host.map(Perms::RW).map_err(e("map host"))?;
        dram.map(Perms::RW).map_err(e("map DRAM"))?;
        let pattern: Vec<u32> = (0..size / 4).map(|i| (i as u32).wrapping_mul(2_654_435_761)).collect();
        host.write_slice(0, &pattern).map_err(e("write host"))?;
        let mut cb = CommandBuffer::new(dev).map_err(e("command buffer"))?;
        // One submission per repetition: `stream` copies host -> DRAM back
        // to back, then as many DRAM -> host, a TIMESTAMP before the first
        // and after each. The first host -> DRAM copy starts an idle
        // device (its threads asleep since the last submission); the
        // others are the engine streaming, as a model's transfers run.
        let (mut h2d, mut d2h, mut first) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..=reps {
            cb.reset();
            let mut c = cb.timestamp(&host, ts).map_err(e("encode"))?;
            for i in 0..2 * stream as u64 {
                let (from, to) = if i < stream as u64 { (&host, &dram) } else { (&dram, &host) };
                c = c.copy(from, 0, to, 0, size).and_then(|c| c.timestamp(&host, ts + 8 * (i + 1))).map_err(e("encode"))?;
            }
            queue.submit_ioctl(&mut cb).map_err(e("submit"))?.wait(WAIT).map_err(e("wait"))?;
            let t: Vec<u64> = host.read_vec(ts, nts as usize).map_err(e("read timestamps"))?;
            if rep > 0 {
                let span = |i: usize| t[i + 1].saturating_sub(t[i]) as f64;
                first.push(span(0));
                h2d.extend((1..stream).map(span));
                d2h.extend((stream..2 * stream).map(span));
            }
        }
        // The round trips must not have changed the data.
        let back: Vec<u32> = host.read_vec(0, pattern.len()).map_err(e("read back"))?;
        if back != pattern {
            return Err(format!("DMA round trip of {size} bytes changed the data"));
        }
        if h2d.is_empty() {
            h2d = first.clone();
        }
        let (h, d, f) = (median(&mut h2d), median(&mut d2h), median(&mut first));
        eprintln!(
            "dma {size} B: host->DRAM {:.3} ms ({:.2} GB/s; first of a submission {:.3} ms), DRAM->host {:.3} ms",
            h / 1e6,
            size as f64 / h,
            f / 1e6,
            d / 1e6
        );
        rows.push(json!({
            "bytes": size, "reps": reps, "stream": stream,
            "h2d_median_ns": h, "h2d_gbps": size as f64 / h.max(1.0),
            "h2d_first_median_ns": f, "h2d_first_gbps": size as f64 / f.max(1.0),
            "d2h_median_ns": d, "d2h_gbps": size as f64 / d.max(1.0),
            "h2d_ns": h2d, "d2h_ns": d2h, "h2d_first_ns": first,
        }));
    }
    Ok(json!({"dma": rows}))
}

fn latency(dev: &Device, runs: usize, warmup: usize) -> Result<serde_json::Value, String> {
    clock::init_with_device(dev); // before anything is timed
    let desc = clock::describe();
    let mut kq = dev.create_queue(0).map_err(e("create queue"))?;
    let mut uq = dev.create_user_queue(0).map_err(e("create user queue"))?;
    let mut nop = CommandBuffer::new(dev).map_err(e("command buffer"))?;
    nop.nop();
    let mut measure = |q: &mut dyn Submit, spin: bool| -> Result<serde_json::Value, String> {
        let mut v = Vec::with_capacity(runs);
        for i in 0..warmup + runs.max(1) {
            let t0 = clock::now();
            let f = q.submit(&mut nop).map_err(e("submit"))?;
            if spin { f.spin_wait(WAIT) } else { f.wait(WAIT) }.map_err(e("wait"))?;
            if i >= warmup {
                v.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        v.sort_by(f64::total_cmp);
        let pct = |p: usize| v[(v.len() * p / 100).min(v.len() - 1)];
        Ok(json!({"runs": v.len(), "p50_us": pct(50), "p90_us": pct(90), "p99_us": pct(99),
                  "mean_us": v.iter().sum::<f64>() / v.len() as f64, "min_us": v[0]}))
    };
    let ioctl = measure(&mut kq, false)?;
    let user = measure(&mut uq, true)?;
    eprintln!("latency: ioctl SUBMIT + FENCE_WAIT p50 {} us, user-mode + spin p50 {} us", ioctl["p50_us"], user["p50_us"]);
    Ok(json!({"clock": desc, "ioctl_submit_fence_wait": ioctl, "user_submit_spin": user}))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let dev = match Device::open(args.device) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("rbln-bench-guest: {e}");
            return ExitCode::from(4);
        }
    };
    let r = match args.cmd {
        Cmd::Dma { sizes, reps, stream } => dma(&dev, &sizes, reps, stream as usize),
        Cmd::Latency { runs, warmup } => latency(&dev, runs, warmup),
    };
    match r {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rbln-bench-guest: {e}");
            ExitCode::from(1)
        }
    }
}
