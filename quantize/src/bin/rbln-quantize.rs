//! rbln-quantize: a float ONNX model to a QDQ int8 model rbln-compile
//! runs on the NPU's integer kernels, calibrated on the NPU over the
//! user's samples, with a per-layer error report.
//!
//! Exit codes: 0 done, 1 the model cannot be quantised, 2 usage or bad
//! calibration data, 4 device error.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use prost::Message;
use rbln_quantize::{calibrate, fold_batchnorm, plan, read_npz, report, rewrite, Method, QuantOptions};

#[derive(Parser)]
#[command(about = "Quantise a float ONNX model to int8 (QDQ), calibrated on the rbln NPU")]
struct Args {
    /// The float model (.onnx).
    model: PathBuf,
    /// Calibration samples: a .npz with one float32 array per model input,
    /// named as the input, shaped [N, ...] (N samples) or as the input.
    #[arg(long)]
    calibration: PathBuf,
    /// Where to write the quantised model.
    #[arg(short, long)]
    output: PathBuf,
    /// Activation ranges: minmax, or percentile (clip at --percentile).
    #[arg(long, default_value = "minmax", value_parser = ["minmax", "percentile"])]
    method: String,
    /// Percentile kept on each side with --method percentile.
    #[arg(long, default_value_t = 99.99)]
    percentile: f64,
    /// 7-bit weights (±64): the NPU's fastest exact int8 path.
    #[arg(long)]
    reduce_range: bool,
    /// Device index (after RBLN_VISIBLE_DEVICES).
    #[arg(short, long, default_value_t = 0)]
    device: u32,
    /// Skip the per-layer error report (two more device runs).
    #[arg(long)]
    no_report: bool,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let fail = |code: u8, msg: String| {
        eprintln!("rbln-quantize: error: {msg}");
        ExitCode::from(code)
    };
    let bytes = match std::fs::read(&a.model) {
        Ok(b) => b,
        Err(e) => return fail(2, format!("{}: {e}", a.model.display())),
    };
    let mut m = match rbln_compile::onnx::decode(&bytes) {
        Ok(m) => m,
        Err(e) => return fail(1, format!("{}: {e}", a.model.display())),
    };
    // BatchNormalization folded into its Conv first: the model calibrated,
    // quantised and compared is that one.
    let folded = match fold_batchnorm(&mut m) {
        Ok(n) => n,
        Err(e) => return fail(1, format!("{}: {e}", a.model.display())),
    };
    let bytes = if folded > 0 { m.encode_to_vec() } else { bytes };
    let p = match plan(&m) {
        Ok(p) => p,
        Err(e) => return fail(1, format!("{}: {e}", a.model.display())),
    };
    let samples = match read_npz(&a.calibration, &m) {
        Ok(s) => s,
        Err(e) => return fail(2, e),
    };
    let dev = match rbln_umd::Device::open(a.device) {
        Ok(d) => d,
        Err(e) => return fail(4, format!("device {}: {e}", a.device)),
    };
    let method = if a.method == "percentile" { Method::Percentile(a.percentile) } else { Method::MinMax };
    let t0 = std::time::Instant::now();
    let ranges = match calibrate(&dev, &bytes, &p, &samples, method) {
        Ok(r) => r,
        Err(e) => return fail(4, e),
    };
    eprintln!(
        "calibrated {} tensors of {} layers over {} samples ({:?}) in {:.1} s",
        p.tensors.len(),
        p.targets.len(),
        samples.len(),
        method,
        t0.elapsed().as_secs_f64()
    );
    let q = match rewrite(&m, &p, &ranges, QuantOptions { reduce_range: a.reduce_range }) {
        Ok(q) => q,
        Err(e) => return fail(1, e),
    };
    let qbytes = q.encode_to_vec();
    if let Err(e) = std::fs::write(&a.output, &qbytes) {
        return fail(2, format!("{}: {e}", a.output.display()));
    }
    println!(
        "{} -> {}: {} layers quantised (int8 weights per channel{}, u8 activations); {folded} BatchNormalization folded into convolutions",
        a.model.display(),
        a.output.display(),
        p.targets.len(),
        if a.reduce_range { ", 7-bit" } else { "" }
    );
    if !a.no_report {
        match report(&dev, &bytes, &qbytes, &p, &samples) {
            Ok(rows) => {
                let w = rows.iter().map(|r| r.target.len()).max().unwrap_or(5).max(5);
                println!("{:w$}  {:>8}  {:>9}  tensor", "layer", "cosine", "max err");
                for r in &rows {
                    println!("{:w$}  {:>8.5}  {:>8.2}%  {}", r.target, r.cosine, r.max_rel * 100.0, r.tensor);
                }
                let worst = rows.iter().filter(|r| r.target != "<output>").min_by(|a, b| a.cosine.total_cmp(&b.cosine));
                if let Some(r) = worst {
                    println!("lowest layer cosine similarity: {:.5} ({})", r.cosine, r.target);
                }
            }
            Err(e) => return fail(4, format!("report: {e}")),
        }
    }
    ExitCode::SUCCESS
}
