//! `rbln-exporter [--listen 127.0.0.1:9400]`: the figures of `rbln-smi` as
//! Prometheus metrics on `GET /metrics`, read at every scrape. Busy times
//! and traffic are counters (take `rate()` for utilisation); memory,
//! clients and health are gauges. docs/smi.md lists the metrics.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use clap::Parser;
use prometheus::{Encoder, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};
use rbln_smi::{gather, Report, Samples};

#[derive(Parser)]
#[command(name = "rbln-exporter", version, about = "Prometheus metrics of the rbln NPUs and the processes using them")]
struct Args {
    /// Address to serve /metrics on.
    #[arg(long, default_value = "127.0.0.1:9400")]
    listen: SocketAddr,
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(g.clone())).expect("registered once");
    g
}

fn int_gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(g.clone())).expect("registered once");
    g
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    r.register(Box::new(c.clone())).expect("registered once");
    c
}

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The report in the Prometheus text format.
fn render(rep: &Report) -> String {
    let r = Registry::new();
    let info = int_gauge(&r, "rbln_device_info", "Constant 1, labelled with the device's identity", &["device", "path", "hw_version", "driver_version"]);
    let health = int_gauge(&r, "rbln_device_health", "1 for the device's current health state (ok, faulted, hung, lost, error)", &["device", "state"]);
    let dram_total = int_gauge(&r, "rbln_device_dram_total_bytes", "Device DRAM", &["device"]);
    let dram_used = int_gauge(&r, "rbln_device_dram_used_bytes", "Device DRAM allocated to buffers", &["device"]);
    let host = int_gauge(&r, "rbln_device_host_buffer_bytes", "Host-memory buffers of the device's visible clients", &["device"]);
    let clients = int_gauge(&r, "rbln_device_clients", "Open files (contexts) of the device seen in /proc", &["device"]);
    let queues = int_gauge(&r, "rbln_device_queues", "Hardware queues in use", &["device"]);
    let faulted = int_gauge(&r, "rbln_device_faulted_queues", "Queues faulted or hung and not yet destroyed", &["device"]);
    let core_busy = gauge(&r, "rbln_device_core_busy_seconds_total", "Busy time of each compute core since the device's last reset", &["device", "core"]);
    let dma_busy = gauge(&r, "rbln_device_dma_busy_seconds_total", "Busy time of each DMA engine since the device's last reset", &["device", "engine"]);
    let packets = counter(&r, "rbln_device_packets_total", "Command packets executed", &["device"]);
    let dma_bytes = counter(&r, "rbln_device_dma_bytes_total", "Bytes written by DMA", &["device"]);
    let ops = counter(&r, "rbln_device_compute_ops_total", "Compute descriptors executed", &["device"]);
    let flops = counter(&r, "rbln_device_compute_flops_total", "Nominal floating-point operations executed", &["device"]);
    let faults = counter(&r, "rbln_device_faults_total", "Error records raised by the device", &["device"]);
    let resets = counter(&r, "rbln_device_resets_total", "Privileged resets since the driver bound the device", &["device"]);
    let p_dram = int_gauge(&r, "rbln_process_dram_bytes", "Device DRAM buffers of a process", &["device", "pid", "process"]);
    let p_host = int_gauge(&r, "rbln_process_host_buffer_bytes", "Host-memory buffers of a process", &["device", "pid", "process"]);
    let p_queues = int_gauge(&r, "rbln_process_queues", "Queues of a process", &["device", "pid", "process"]);
    let p_engine = gauge(&r, "rbln_process_engine_seconds_total", "Device time the process's queues spent executing (fdinfo drm-engine-npu)", &["device", "pid", "process"]);
    for d in &rep.devices {
        let dev = d.index.to_string();
        info.with_label_values(&[dev.as_str(), &d.path, d.hw_version.as_deref().unwrap_or(""), rep.driver_version.as_deref().unwrap_or("")]).set(1);
        let state = if ["ok", "faulted", "hung", "lost"].contains(&d.health.as_str()) { d.health.as_str() } else { "error" };
        health.with_label_values(&[dev.as_str(), state]).set(1);
        if let Some(t) = d.dram_total_bytes {
            dram_total.with_label_values(&[dev.as_str()]).set(as_i64(t));
        }
        if let Some(u) = d.dram_used_bytes {
            dram_used.with_label_values(&[dev.as_str()]).set(as_i64(u));
        }
        host.with_label_values(&[dev.as_str()]).set(as_i64(d.host_bytes));
        clients.with_label_values(&[dev.as_str()]).set(as_i64(d.clients));
        let Some(s) = &d.stats else { continue };
        queues.with_label_values(&[dev.as_str()]).set(i64::from(s.queues));
        faulted.with_label_values(&[dev.as_str()]).set(i64::from(s.faulted_queues));
        for (c, ns) in s.core_busy_ns.iter().enumerate().take(d.cores.unwrap_or(0) as usize) {
            core_busy.with_label_values(&[dev.as_str(), &c.to_string()]).set(*ns as f64 / 1e9);
        }
        for (e, ns) in s.dma_busy_ns.iter().enumerate().take(d.dma_engines.unwrap_or(0) as usize) {
            dma_busy.with_label_values(&[dev.as_str(), &e.to_string()]).set(*ns as f64 / 1e9);
        }
        packets.with_label_values(&[dev.as_str()]).inc_by(s.packets);
        dma_bytes.with_label_values(&[dev.as_str()]).inc_by(s.dma_bytes);
        ops.with_label_values(&[dev.as_str()]).inc_by(s.compute_ops);
        flops.with_label_values(&[dev.as_str()]).inc_by(s.compute_flops);
        faults.with_label_values(&[dev.as_str()]).inc_by(s.faults);
        resets.with_label_values(&[dev.as_str()]).inc_by(s.resets);
    }
    for p in &rep.processes {
        let l = [p.device.to_string(), p.pid.to_string(), p.name.clone()];
        let l: Vec<&str> = l.iter().map(String::as_str).collect();
        p_dram.with_label_values(&l).set(as_i64(p.dram_bytes));
        p_host.with_label_values(&l).set(as_i64(p.host_bytes));
        p_queues.with_label_values(&l).set(as_i64(p.queues));
        p_engine.with_label_values(&l).set(p.engine_ns as f64 / 1e9);
    }
    let mut buf = Vec::new();
    let _ = TextEncoder::new().encode(&r.gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let samples = Arc::new(Mutex::new(Samples::new()));
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let samples = samples.clone();
            async move {
                // Opening devices and reading /proc block: off the executor.
                let text = tokio::task::spawn_blocking(move || {
                    let mut s = samples.lock().unwrap_or_else(|e| e.into_inner());
                    render(&gather(&mut s))
                })
                .await;
                match text {
                    Ok(t) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], t).into_response(),
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("gathering failed: {e}\n")).into_response(),
                }
            }
        }),
    );
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rbln-exporter: cannot listen on {}: {e}", args.listen);
            return std::process::ExitCode::from(1);
        }
    };
    eprintln!("rbln-exporter: serving http://{}/metrics", args.listen);
    let stop = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    match axum::serve(listener, app).with_graceful_shutdown(stop).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rbln-exporter: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rbln_smi::clients::ProcessUse;
    use rbln_smi::DeviceReport;

    #[test]
    fn renders_devices_counters_and_processes() {
        let mut stats = rbln_umd::uapi::DeviceStats { packets: 12, faults: 1, resets: 2, queues: 3, ..Default::default() };
        stats.core_busy_ns[1] = 1_500_000_000;
        let dev = DeviceReport {
            index: 0,
            path: "/dev/rbln0".into(),
            health: "ok".into(),
            hw_version: Some("1.4".into()),
            dram_total_bytes: Some(512 << 20),
            dram_used_bytes: Some(1 << 20),
            core_utilization: None,
            dma_utilization: None,
            faults: Some(1),
            stats: Some(stats),
            host_bytes: 4096,
            cores: Some(2),
            queues: Some(16),
            dma_engines: Some(2),
            clients: 1,
        };
        let lost = DeviceReport { index: 1, path: "/dev/rbln1".into(), health: "open /dev/rbln1: EACCES".into(), stats: None, ..dev.clone() };
        let p = ProcessUse { pid: 42, name: "serve".into(), device: 0, clients: 1, host_bytes: 4096, dram_bytes: 1 << 20, buffers: 2, queues: 1, submits: 5, engine_ns: 2_500_000_000 };
        let text = render(&Report { driver_version: Some("0.2.0".into()), devices: vec![dev, lost], processes: vec![p] });
        for want in [
            r#"rbln_device_info{device="0",driver_version="0.2.0",hw_version="1.4",path="/dev/rbln0"} 1"#,
            r#"rbln_device_health{device="0",state="ok"} 1"#,
            r#"rbln_device_health{device="1",state="error"} 1"#,
            r#"rbln_device_dram_used_bytes{device="0"} 1048576"#,
            r#"rbln_device_core_busy_seconds_total{core="1",device="0"} 1.5"#,
            r#"rbln_process_engine_seconds_total{device="0",pid="42",process="serve"} 2.5"#,
            r#"rbln_device_packets_total{device="0"} 12"#,
            r#"rbln_device_faults_total{device="0"} 1"#,
            r#"rbln_device_resets_total{device="0"} 2"#,
            r#"rbln_device_queues{device="0"} 3"#,
            r#"rbln_process_dram_bytes{device="0",pid="42",process="serve"} 1048576"#,
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
        assert!(!text.contains(r#"rbln_device_packets_total{device="1"}"#), "no counters without STATS");
    }
}
