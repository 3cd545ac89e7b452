//! `rbln-serve-load`: a bounded load test of a running rbln-serve over
//! gRPC (ModelInfer with raw_input_contents): a fixed number of requests
//! at a fixed concurrency; prints throughput, p50/p99 and the error count
//! (one JSON line with --json). Exit 1 if any request failed or, with
//! --expected, any output differs from the reference.
//!
//!     rbln-serve-load MODEL --input x.npy [--input ...] [--requests 100]
//!                     [--concurrency 4] [--addr http://127.0.0.1:8001]
//!                     [--expected y.npy --tol 1e-4] [--json]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rbln_runtime::clock;

use clap::Parser;
use rbln_runtime::{npy, stats::LatencyStats};
use rbln_serve::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use rbln_serve::pb::{model_infer_request::InferInputTensor, ModelInferRequest, ModelMetadataRequest};
use rbln_serve::tensor::{raw_bytes, DataType};

#[derive(Parser)]
#[command(about = "Bounded gRPC load test of a running rbln-serve")]
struct Args {
    /// Model name in the server's repository.
    model: String,
    /// Input tensors (.npy) in the model's input order.
    #[arg(long = "input", short = 'i', required = true)]
    inputs: Vec<PathBuf>,
    #[arg(long, default_value_t = 100)]
    requests: usize,
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    #[arg(long, default_value = "http://127.0.0.1:8001")]
    addr: String,
    /// Reference of the first output: every answer is compared with it.
    #[arg(long)]
    expected: Option<PathBuf>,
    #[arg(long, default_value_t = 1e-4)]
    tol: f64,
    #[arg(long)]
    json: bool,
    /// Client threads (default: one per CPU).
    #[arg(long)]
    workers: Option<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Latencies with the TSC when the kernel's clock is coarse (TCG guests).
    clock::init();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.workers {
        builder.worker_threads(n.max(1));
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rbln-serve-load: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("rbln-serve-load: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> Result<bool, String> {
    // Windows as large as the server's: big responses need no round trips.
    let endpoint = tonic::transport::Endpoint::from_shared(args.addr.clone())
        .map_err(|e| format!("{}: {e}", args.addr))?
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .tcp_nodelay(true);
    let channel = endpoint.connect().await.map_err(|e| format!("{}: {e}", args.addr))?;
    let mut client = GrpcInferenceServiceClient::new(channel).max_decoding_message_size(usize::MAX);
    let md = client.model_metadata(ModelMetadataRequest { name: args.model.clone(), version: String::new() }).await.map_err(|e| e.message().to_string())?.into_inner();
    if md.inputs.len() != args.inputs.len() {
        return Err(format!("model '{}' has {} inputs, {} --input given", args.model, md.inputs.len(), args.inputs.len()));
    }
    let mut req = ModelInferRequest { model_name: args.model.clone(), ..Default::default() };
    for (meta, path) in md.inputs.iter().zip(&args.inputs) {
        let t = npy::read(path)?;
        req.inputs.push(InferInputTensor {
            name: meta.name.clone(),
            datatype: DataType::of(&t.data).name().into(),
            shape: t.shape.iter().map(|&d| d as i64).collect(),
            ..Default::default()
        });
        req.raw_input_contents.push(raw_bytes(&t.data).into());
    }
    let expected = match &args.expected {
        Some(p) => Some(npy::read(p)?.data.to_f64()),
        None => None,
    };
    let req = Arc::new(req);
    let expected = Arc::new(expected);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = clock::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let (mut c, req, expected, next, n, tol) = (client.clone(), req.clone(), expected.clone(), next.clone(), args.requests, args.tol);
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors, mut wrong, mut first_err, mut codes) = (Vec::new(), 0usize, 0usize, None, std::collections::BTreeMap::<String, usize>::new());
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                let t0 = clock::now();
                match c.model_infer((*req).clone()).await {
                    Ok(r) => {
                        lat.push(t0.elapsed());
                        if let Some(exp) = expected.as_ref() {
                            let r = r.into_inner();
                            let datatype = r.outputs.first().map_or("FP32", |o| o.datatype.as_str());
                            let got: Vec<f64> = r.raw_output_contents.first().map(|b| raw_f64(datatype, b)).unwrap_or_default();
                            if got.len() != exp.len() || got.iter().zip(exp.iter()).any(|(a, b)| (a - b).abs() > tol + tol * b.abs()) {
                                wrong += 1;
                            }
                        }
                    }
                    Err(s) => {
                        errors += 1;
                        // A status the server sent carries no source; one
                        // the client made from a failed connection (an h2
                        // reset as the server closes at shutdown, say) does:
                        // counted as "Transport", whatever code it maps to.
                        let code = if std::error::Error::source(&s).is_some() { "Transport".to_string() } else { format!("{:?}", s.code()) };
                        *codes.entry(code).or_default() += 1;
                        first_err.get_or_insert_with(|| format!("{:?}: {}", s.code(), s.message()));
                    }
                }
            }
            (lat, errors, wrong, first_err, codes)
        }));
    }
    let (mut lat, mut errors, mut wrong, mut first_err): (Vec<Duration>, usize, usize, Option<String>) = (Vec::new(), 0, 0, None);
    let mut codes = std::collections::BTreeMap::<String, usize>::new();
    for t in tasks {
        let (l, e, w, f, c) = t.await.map_err(|e| e.to_string())?;
        for (k, v) in c {
            *codes.entry(k).or_default() += v;
        }
        lat.extend(l);
        errors += e;
        wrong += w;
        if first_err.is_none() {
            first_err = f;
        }
    }
    let wall = start.elapsed();
    let st = LatencyStats::new(&lat, wall);
    let (tp, p50, p99) = st.as_ref().map_or((0.0, 0.0, 0.0), |s| (lat.len() as f64 / wall.as_secs_f64(), s.p50.as_secs_f64() * 1e3, s.p99.as_secs_f64() * 1e3));
    if args.json {
        println!(
            "{}",
            serde_json::json!({"model": args.model, "requests": args.requests, "concurrency": args.concurrency, "ok": lat.len(), "errors": errors, "error_codes": codes, "wrong": wrong,
                "throughput_per_s": tp, "p50_ms": p50, "p99_ms": p99, "wall_s": wall.as_secs_f64()})
        );
    } else {
        println!(
            "{}: {} requests at concurrency {}: {} ok, {errors} errors, {wrong} wrong; {tp:.1}/s, p50 {p50:.2} ms, p99 {p99:.2} ms",
            args.model, args.requests, args.concurrency, lat.len()
        );
    }
    if let Some(e) = first_err {
        eprintln!("rbln-serve-load: first error: {e}");
    }
    Ok(errors == 0 && wrong == 0)
}

/// The elements of a raw (little-endian) output of `datatype` as f64.
fn raw_f64(datatype: &str, b: &[u8]) -> Vec<f64> {
    match DataType::parse(datatype) {
        Some(DataType::Int32) => b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
        Some(DataType::Int64) => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64).collect(),
        Some(DataType::Int8) => b.iter().map(|&x| x as i8 as f64).collect(),
        Some(DataType::Uint8 | DataType::Bool) => b.iter().map(|&x| x as f64).collect(),
        Some(DataType::Fp32) | None => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
    }
}
