//! `rbln-smi`: the NPUs of this machine (hardware, memory, clients) and the
//! processes using them, as a table or JSON, once or every few seconds.
//!
//! Devices are the `/dev/rblnN` nodes, asked for their identity with the
//! INFO ioctl (through `rbln_umd`); memory in use and the processes come
//! from the driver's per-file statistics (`clients`). docs/smi.md.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rbln_smi::{gather, Report, Samples};

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
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Reset an NPU (root): every process using it loses its work (their
    /// calls fail; they reopen the device), and a faulted or hung device is
    /// healthy again. A lost device cannot be reset.
    Reset {
        /// The NPU: N of /dev/rblnN.
        #[arg(short = 'd', long)]
        device: u32,
    },
}

/// `rbln-smi reset -d N`.
fn reset(node: u32) -> ExitCode {
    match rbln_umd::reset_device(node) {
        Ok(()) => {
            println!("rbln{node}: reset; health {}", rbln_umd::read_sysfs(node, rbln_umd::uapi::sysfs::HEALTH).unwrap_or_else(|e| e.to_string()));
            ExitCode::SUCCESS
        }
        Err(e) => {
            let why = match e.raw_os_error() {
                Some(libc::EACCES | libc::EPERM) => "permission denied: resetting an NPU needs root".to_string(),
                Some(libc::ENODEV) => "the device is lost (it stopped answering); it cannot be reset, only removed and re-added".to_string(),
                Some(libc::ENOENT) => format!("there is no /dev/rbln{node} (or rbln.ko is too old for reset)"),
                _ => e.to_string(),
            };
            eprintln!("rbln-smi: reset of rbln{node}: {why}");
            ExitCode::from(1)
        }
    }
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
                format!("{:.3} s", p.engine_ns as f64 / 1e9),
            ]
        })
        .collect();
    if rows.is_empty() {
        out += "No processes are using an NPU.\n";
    } else {
        out += &table(&["NPU", "PID", "Process", "DRAM", "Host buffers", "Buffers", "Queues", "Submits", "NPU time"], &rows);
    }
    out
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Reset { device }) = args.command {
        return reset(device);
    }
    if rbln_umd::present_nodes().is_empty() {
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
        let r = gather(&mut samples);
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
