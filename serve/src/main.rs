//! `rbln-serve`: serve the models of a model repository on the rbln NPU
//! with the Open Inference Protocol (KServe v2) over HTTP/REST and gRPC,
//! and Prometheus metrics. See docs/serve.md.
//!
//!     rbln-serve --model-repository DIR [--http-port 8000] [--grpc-port 8001]
//!                [--metrics-port 8002] [--host 0.0.0.0] [--device N]
//!                [--max-body-bytes N] [--max-queue N] [--timeout-ms N]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use rbln_serve::metrics::Metrics;
use rbln_serve::model::{Defaults, DeviceLoader};
use rbln_serve::repo::{check_dir, Repository};
use rbln_serve::App;

#[derive(Parser)]
#[command(version, about = "Serve .rbln models with the Open Inference Protocol (KServe v2) over REST and gRPC")]
struct Args {
    /// The model repository: DIR/<name>/<version>/model.rbln and an
    /// optional DIR/<name>/config.json.
    #[arg(long)]
    model_repository: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    host: std::net::IpAddr,
    #[arg(long, default_value_t = 8000)]
    http_port: u16,
    #[arg(long, default_value_t = 8001)]
    grpc_port: u16,
    #[arg(long, default_value_t = 8002)]
    metrics_port: u16,
    /// Device index (/dev/rblnN); repeat it to name several (config.json:
    /// devices). Default: every /dev/rbln* this process may open, and each
    /// model's instances spread over all of them.
    #[arg(long = "device")]
    devices: Vec<u32>,
    /// Largest REST request body / gRPC message accepted (bytes).
    #[arg(long, default_value_t = 64 << 20)]
    max_body_bytes: usize,
    /// Default bound of each model's queue (config.json: max_queue).
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// Default per-request timeout in ms (config.json: timeout_ms).
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
    /// Threads running the HTTP and gRPC front ends (default: one per CPU).
    #[arg(long)]
    workers: Option<usize>,
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = check_dir(&args.model_repository) {
        eprintln!("rbln-serve: {e}");
        return ExitCode::from(2);
    }
    if args.max_queue == 0 {
        eprintln!("rbln-serve: --max-queue must be at least 1");
        return ExitCode::from(2);
    }
    // Latencies use the TSC when the kernel's clock is coarse (TCG guests).
    rbln_runtime::clock::init();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.workers {
        builder.worker_threads(n.max(1));
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rbln-serve: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rbln-serve: {e}");
            ExitCode::from(1)
        }
    }
}

async fn serve(mut args: Args) -> Result<(), String> {
    if args.devices.is_empty() {
        args.devices = rbln_umd::usable_device_indices();
        if args.devices.is_empty() {
            let present = rbln_umd::device_indices();
            return Err(if present.is_empty() {
                "no NPU: there is no /dev/rbln* (is rbln.ko loaded?); --device N names one".into()
            } else {
                format!("no NPU this process may use: /dev/rbln{{{}}} are not readable and writable by it", present.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(","))
            });
        }
    }
    let metrics = Arc::new(Metrics::new());
    let defaults = Defaults { max_queue: args.max_queue, timeout_ms: args.timeout_ms };
    let repo = Arc::new(Repository::new(args.model_repository.clone(), Box::new(DeviceLoader { devices: args.devices.clone() }), defaults, metrics));
    let app = App::new(repo.clone(), args.max_body_bytes);

    let bind = |port: u16| SocketAddr::new(args.host, port);
    let http = tokio::net::TcpListener::bind(bind(args.http_port)).await.map_err(|e| format!("HTTP port {}: {e}", args.http_port))?;
    let metrics_l = tokio::net::TcpListener::bind(bind(args.metrics_port)).await.map_err(|e| format!("metrics port {}: {e}", args.metrics_port))?;
    let grpc_l = tokio::net::TcpListener::bind(bind(args.grpc_port)).await.map_err(|e| format!("gRPC port {}: {e}", args.grpc_port))?;
    eprintln!(
        "rbln-serve: HTTP on {}, gRPC on {}, metrics on {} (devices {}, repository {})",
        bind(args.http_port),
        bind(args.grpc_port),
        bind(args.metrics_port),
        args.devices.iter().map(|d| format!("/dev/rbln{d}")).collect::<Vec<_>>().join(" "),
        args.model_repository.display()
    );

    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let stopped = |tx: &tokio::sync::broadcast::Sender<()>| {
        let mut rx = tx.subscribe();
        async move {
            let _ = rx.recv().await;
        }
    };
    // TCP_NODELAY everywhere: a response written in pieces must not wait
    // for the client's delayed ACK (40 ms a request otherwise).
    use axum::serve::ListenerExt;
    let http = http.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let http_srv = axum::serve(http, rbln_serve::http::router(app.clone())).with_graceful_shutdown(stopped(&stop_tx));
    let metrics_srv = axum::serve(metrics_l, rbln_serve::http::metrics_router(app.clone())).with_graceful_shutdown(stopped(&stop_tx));
    // HTTP/2 flow control: with the default 64 KiB windows a request of a
    // few hundred KiB (an image) waits for several WINDOW_UPDATE round trips.
    let grpc_srv = tonic::transport::Server::builder()
        .initial_stream_window_size(Some(GRPC_STREAM_WINDOW))
        .initial_connection_window_size(Some(GRPC_CONNECTION_WINDOW))
        .add_service(rbln_serve::grpc::service(app.clone()))
        .serve_with_incoming_shutdown(tokio_stream_listener(grpc_l), stopped(&stop_tx));

    // Load the repository while the servers already answer liveness (and
    // "not ready").
    let loader = {
        let app = app.clone();
        tokio::task::spawn_blocking(move || {
            app.repo.load_all();
            app.set_ready();
            eprintln!("rbln-serve: ready");
        })
    };
    let stop = {
        let tx = stop_tx.clone();
        let app = app.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            let n = app.inflight.load(std::sync::atomic::Ordering::Acquire);
            eprintln!("rbln-serve: shutting down: {n} inference request(s) in flight, finishing them; no new connections");
            let _ = tx.send(());
        })
    };
    let (h, m, g) = tokio::join!(
        async { http_srv.await.map_err(|e| format!("HTTP server: {e}")) },
        async { metrics_srv.await.map_err(|e| format!("metrics server: {e}")) },
        async { grpc_srv.await.map_err(|e| format!("gRPC server: {e}")) }
    );
    stop.abort();
    let _ = loader.await;
    eprintln!("rbln-serve: stopped ({} inference request(s) left unanswered)", app.inflight.load(std::sync::atomic::Ordering::Acquire));
    h.and(m).and(g)
}

/// HTTP/2 receive windows of the gRPC server (bytes): a whole typical
/// request in flight per stream, several streams per connection.
const GRPC_STREAM_WINDOW: u32 = 4 << 20;
const GRPC_CONNECTION_WINDOW: u32 = 16 << 20;

/// The gRPC server's connections from a bound listener.
fn tokio_stream_listener(l: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(l).with_nodelay(Some(true))
}
