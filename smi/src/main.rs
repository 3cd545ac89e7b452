//! `rbln-smi`: the NPUs of this machine (hardware, memory, clients) and the
//! processes using them, as a table or JSON, once or every few seconds.
//!
//! Devices are the `/dev/rblnN` nodes, asked for their identity with the
//! INFO ioctl (through `rbln_umd`); memory in use and the processes come
//! from the driver's per-file statistics (`clients`). docs/smi.md.

mod clients;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;

#[derive(Parser)]
#[command(name = "rbln-smi", version, about = "The rbln NPUs of this machine, their memory and the processes using them")]
struct Args {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Print again every SECONDS (watch mode) until interrupted.
    #[arg(short = 'l', long = "loop", value_name = "SECONDS")]
    interval: Option<f64>,
    /// With --loop: stop after this many reports.
    #[arg(long)]
    count: Option<u64>,
}

#[derive(Serialize)]
struct DeviceReport {
    index: u32,
    path: String,
    /// "ok", "faulted" (a queue faulted or hung and was not yet destroyed),
    /// "lost" (the device stopped answering), or why it could not be
    /// opened or asked.
    health: String,
    hw_version: Option<String>,
    dram_total_bytes: Option<u64>,
    /// Device DRAM allocated to buffers (all clients).
    dram_used_bytes: Option<u64>,
    /// Busy share of the compute cores (0 to 1) and of the DMA engines over
    /// the sampling window.
    core_utilization: Option<f64>,
    dma_utilization: Option<f64>,
    /// Error records the device raised since its last reset.
    faults: Option<u64>,
    host_bytes: u64,
    cores: Option<u32>,
    queues: Option<u32>,
    dma_engines: Option<u32>,
    clients: u64,
}

#[derive(Serialize)]
struct Report {
    driver_version: Option<String>,
    devices: Vec<DeviceReport>,
    processes: Vec<clients::ProcessUse>,
}

/// Busy share over two reads: the busy times' growth over the elapsed time
/// of `units` units.
fn utilization(a: &[u64], b: &[u64], units: u32, dt_ns: u64) -> Option<f64> {
    if dt_ns == 0 || units == 0 {
        return None;
    }
    let busy: u64 = a.iter().zip(b).take(units as usize).map(|(x, y)| y.saturating_sub(*x)).sum();
    Some((busy as f64 / (dt_ns as f64 * units as f64)).min(1.0))
}

/// Counters of each device from the previous report (watch mode), or
/// from a first read `SAMPLE` before this one.
type Samples = std::collections::HashMap<u32, rbln_umd::uapi::DeviceStats>;

/// Sampling window of a single report.
const SAMPLE: Duration = Duration::from_millis(200);

fn report(prev: &mut Samples) -> Report {
    let proc_root = Path::new("/proc");
    let me = std::process::id();
    let mut driver_version = None;
    let mut devices = Vec::new();
    // Opening a device makes this process a client of it: its own files
    // are left out of the scan below.
    let opened: Vec<_> = rbln_umd::device_indices().into_iter().map(|i| (i, rbln_umd::Device::open(i))).collect();
    if opened.iter().any(|(i, d)| d.is_ok() && !prev.contains_key(i)) {
        for (i, d) in &opened {
            if let Some(s) = d.as_ref().ok().and_then(|d| d.stats().ok()) {
                prev.insert(*i, s);
            }
        }
        std::thread::sleep(SAMPLE);
    }
    let all = clients::scan(proc_root, me);
    for (index, dev) in &opened {
        let mine: Vec<_> = all.iter().filter(|c| c.device == *index).collect();
        let mut d = DeviceReport {
            index: *index,
            path: format!("/dev/rbln{index}"),
            health: "-".into(),
            hw_version: None,
            dram_total_bytes: None,
            dram_used_bytes: None,
            core_utilization: None,
            dma_utilization: None,
            faults: None,
            host_bytes: mine.iter().map(|c| c.host_bytes).sum(),
            cores: None,
            queues: None,
            dma_engines: None,
            clients: mine.len() as u64,
        };
        match dev {
            Ok(dev) => {
                let i = dev.info();
                driver_version.get_or_insert_with(|| format!("{}.{}.{}", i.driver_version.0, i.driver_version.1, i.driver_version.2));
                d.hw_version = Some(format!("{}.{}", i.hw_version.0, i.hw_version.1));
                d.dram_total_bytes = Some(i.dram_size);
                d.cores = Some(i.num_cores);
                d.queues = Some(i.num_queues);
                d.dma_engines = Some(i.num_dma_engines);
                match dev.stats() {
                    Ok(now) => {
                        d.health = match now.health {
                            rbln_umd::uapi::HEALTH_OK => "ok",
                            rbln_umd::uapi::HEALTH_FAULTED => "faulted",
                            rbln_umd::uapi::HEALTH_LOST => "lost",
                            _ => "unknown",
                        }
                        .into();
                        d.dram_used_bytes = Some(i.dram_size.saturating_sub(now.dram_free));
                        d.faults = Some(now.faults);
                        if let Some(before) = prev.get(index) {
                            let dt = now.timestamp_ns.saturating_sub(before.timestamp_ns);
                            d.core_utilization = utilization(&before.core_busy_ns, &now.core_busy_ns, i.num_cores, dt);
                            d.dma_utilization = utilization(&before.dma_busy_ns, &now.dma_busy_ns, i.num_dma_engines, dt);
                        }
                        prev.insert(*index, now);
                    }
                    Err(e) => d.health = e.to_string(),
                }
            }
            Err(e) => d.health = e.to_string(),
        }
        devices.push(d);
    }
    let processes = clients::by_process(&all, proc_root);
    Report { driver_version, devices, processes }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.0}%", v * 100.0))
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// Rows as a table with columns padded to their widest cell.
fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = String>| -> String {
        let parts: Vec<String> = cells.enumerate().map(|(i, c)| format!(" {c:<width$} ", width = w[i])).collect();
        format!("|{}|\n", parts.join("|"))
    };
    let rule = format!("+{}+\n", w.iter().map(|n| "-".repeat(n + 2)).collect::<Vec<_>>().join("+"));
    let mut out = rule.clone();
    out += &line(&mut head.iter().map(|h| h.to_string()));
    out += &rule;
    for r in rows {
        out += &line(&mut r.iter().cloned());
    }
    out + &rule
}

fn text(r: &Report) -> String {
    let mut out = format!("rbln-smi {}    driver {}\n", env!("CARGO_PKG_VERSION"), opt(r.driver_version.clone()));
    let rows: Vec<Vec<String>> = r
        .devices
        .iter()
        .map(|d| {
            vec![
                d.index.to_string(),
                d.path.clone(),
                opt(d.hw_version.clone()),
                format!("{} / {}", d.dram_used_bytes.map_or("-".into(), mib), d.dram_total_bytes.map_or("-".into(), mib)),
                mib(d.host_bytes),
                format!("{} / {}", pct(d.core_utilization), pct(d.dma_utilization)),
                format!("{} / {} / {}", opt(d.cores), opt(d.queues), opt(d.dma_engines)),
                d.clients.to_string(),
                d.health.clone(),
            ]
        })
        .collect();
    out += &table(&["NPU", "Device", "HW", "DRAM used / total", "Host buffers", "Util cores / DMA", "Cores / queues / DMA", "Clients", "Health"], &rows);
    let rows: Vec<Vec<String>> = r
        .processes
        .iter()
        .map(|p| {
            vec![
                p.device.to_string(),
                p.pid.to_string(),
                p.name.clone(),
                mib(p.dram_bytes),
                mib(p.host_bytes),
                p.buffers.to_string(),
                p.queues.to_string(),
                p.submits.to_string(),
            ]
        })
        .collect();
    if rows.is_empty() {
        out += "No processes are using an NPU.\n";
    } else {
        out += &table(&["NPU", "PID", "Process", "DRAM", "Host buffers", "Buffers", "Queues", "Submits"], &rows);
    }
    out
}

fn main() -> ExitCode {
    let args = Args::parse();
    if rbln_umd::device_indices().is_empty() {
        eprintln!("rbln-smi: no NPU: there is no /dev/rbln* (is rbln.ko loaded?)");
        return ExitCode::from(1);
    }
    if args.interval.is_some_and(|s| !(s > 0.0 && s.is_finite())) {
        eprintln!("rbln-smi: --loop needs a positive number of seconds");
        return ExitCode::from(2);
    }
    let mut n = 0u64;
    let mut samples = Samples::new();
    loop {
        let r = report(&mut samples);
        if args.json {
            println!("{}", serde_json::to_string(&r).unwrap_or_default());
        } else {
            print!("{}", text(&r));
        }
        n += 1;
        match args.interval {
            Some(s) if args.count.is_none_or(|c| n < c) => {
                std::thread::sleep(Duration::from_secs_f64(s));
                if !args.json {
                    println!();
                }
            }
            _ => return ExitCode::SUCCESS,
        }
    }
}
