//! `rbln-npu`: the rbln virtual NPU, served to QEMU over vfio-user.
//!
//!     rbln-npu --socket /tmp/rbln0.sock --dram-mib 2048 --queues 16 --cores 2
//!
//! QEMU side:
//!     -device '{"driver":"vfio-user-pci","socket":{"path":"/tmp/rbln0.sock","type":"unix"}}'
//! with guest RAM in a shared memfd backend.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use clap::Parser;
use rbln_npu::{vfio, Config, Device};

#[derive(Parser)]
#[command(version, about = "The rbln virtual NPU (vfio-user server)")]
struct Args {
    /// UNIX socket to listen on (must not exist).
    #[arg(long)]
    socket: PathBuf,
    /// Device DRAM size in MiB (a power of two).
    #[arg(long, default_value_t = rbln_npu::device::DEFAULT_DRAM_MIB)]
    dram_mib: u64,
    /// Number of hardware queues (16..=32).
    #[arg(long, default_value_t = 16)]
    queues: u32,
    /// Number of compute cores (1..=8).
    #[arg(long, default_value_t = 2)]
    cores: u32,
    /// Number of DMA engines (1..=4).
    #[arg(long, default_value_t = 2)]
    dma_engines: u32,
    /// Value the VERSION register reports (testing drivers against
    /// hardware they do not know; default: the real version).
    #[arg(long, value_parser = parse_u32, default_value_t = rbln_hw::HW_VERSION, hide_default_value = true)]
    report_version: u32,
    /// Microseconds a compute core's helper threads spin waiting for the
    /// next op before they sleep (0: never spin).
    #[arg(long, default_value_t = rbln_npu::workers::DEFAULT_SPIN.as_micros() as u64)]
    spin_us: u64,
    /// Offer BAR2 (device DRAM) as a mappable region: guest CPU accesses
    /// to it stop trapping, but QEMU then makes every MMIO write of the
    /// device (doorbells too) wait for the server's answer.
    #[arg(long)]
    dram_bar_mmap: bool,
    /// Arm a fault-injection plan from the start (repeatable; see
    /// docs/reliability.md): KIND[:after=N,count=N,queue=Q,ms=M].
    #[arg(long = "inject", value_name = "PLAN")]
    inject: Vec<rbln_npu::faults::Plan>,
    /// UNIX socket for the harness's debug control (fault injection; not
    /// reachable from the guest): `rbln-npu-ctl PATH COMMAND`.
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// Log level: error, warn, info, debug, trace.
    #[arg(long, default_value = "warn")]
    log_level: log::LevelFilter,
}

/// SIGTERM/SIGINT end the process cleanly: they are blocked in every
/// thread and taken by a dedicated thread with sigwait (a handler would not
/// do: std retries the server's blocking accept/recv on EINTR). That
/// thread removes the socket and exits; the device has no state that
/// outlives the process.
///
/// SIGUSR1 makes the device fall off the bus (`Device::fall_off_bus`): the
/// test harness's surprise removal. Killing the process instead takes the
/// whole VM down (QEMU's vfio-user client aborts when its peer vanishes).
fn install_signal_thread(socket: PathBuf, device: Arc<OnceLock<Arc<Device>>>) -> nix::Result<()> {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.add(Signal::SIGUSR1);
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
    std::thread::Builder::new()
        .name("rbln-signals".into())
        .spawn(move || {
            loop {
                match set.wait() {
                    Ok(Signal::SIGUSR1) => match device.get() {
                        Some(d) => d.fall_off_bus(),
                        None => log::warn!("SIGUSR1 before the device exists: ignored"),
                    },
                    Ok(sig) => {
                        log::info!("{sig:?} received; shutting down");
                        break;
                    }
                    Err(_) => break,
                }
            }
            let _ = std::fs::remove_file(&socket);
            std::process::exit(0);
        })
        .map_err(|_| nix::errno::Errno::EAGAIN)?;
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    env_logger::Builder::new().filter_level(args.log_level).format_timestamp_millis().init();
    let cfg = Config {
        dram_size: args.dram_mib.saturating_mul(1 << 20),
        num_queues: args.queues,
        num_cores: args.cores,
        num_dma_engines: args.dma_engines,
        reported_version: args.report_version,
        spin: std::time::Duration::from_micros(args.spin_us),
        dram_bar_mmap: args.dram_bar_mmap,
    };
    // Before any other thread exists, so that all inherit the signal mask.
    let for_signals = Arc::new(OnceLock::new());
    if let Err(e) = install_signal_thread(args.socket.clone(), for_signals.clone()) {
        eprintln!("rbln-npu: cannot set up signal handling: {e}");
        return ExitCode::from(1);
    }
    let device = match Device::new(cfg) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            eprintln!("rbln-npu: {e}");
            return ExitCode::from(2);
        }
    };
    let _ = for_signals.set(device.clone());
    for plan in args.inject {
        device.inject(plan);
    }
    if let Some(path) = &args.control {
        if let Err(e) = serve_control(device.clone(), path) {
            eprintln!("rbln-npu: control socket {}: {e}", path.display());
            return ExitCode::from(1);
        }
    }
    log::info!("listening on {}", args.socket.display());
    let result = vfio::serve(device, &args.socket);
    // The socket file is removed by the server's Drop; the device's
    // command processors stop when the last reference goes.
    match result {
        Ok(()) => {
            log::info!("client disconnected; shutting down");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rbln-npu: {e}");
            ExitCode::from(1)
        }
    }
}

/// The debug control: one command per line, one reply line each
/// (`ok ...` or `error: ...`):
///
///     inject PLAN   arm a fault-injection plan (docs/reliability.md)
///     clear         disarm every plan
///     status        how many events of each kind fired, the plans armed
fn serve_control(device: Arc<Device>, path: &std::path::Path) -> std::io::Result<()> {
    use std::io::{BufRead, BufReader, Write};
    let _ = std::fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::thread::Builder::new().name("rbln-control".into()).spawn(move || {
        for conn in listener.incoming().flatten() {
            let Ok(mut out) = conn.try_clone() else { continue };
            for line in BufReader::new(conn).lines().map_while(Result::ok) {
                let reply = control_command(&device, line.trim());
                if writeln!(out, "{reply}").is_err() {
                    break;
                }
            }
        }
    })?;
    Ok(())
}

fn control_command(device: &Device, line: &str) -> String {
    let (cmd, arg) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    match (cmd, arg.trim()) {
        ("inject", plan) => match plan.parse::<rbln_npu::faults::Plan>() {
            Ok(p) => {
                let armed = p.to_string();
                device.inject(p);
                format!("ok armed {armed}")
            }
            Err(e) => format!("error: {e}"),
        },
        ("clear", "") => {
            device.faults().clear();
            "ok cleared".into()
        }
        ("status", "") => format!("ok {}", device.faults().report()),
        _ => format!("error: unknown command '{line}' (inject PLAN, clear, status)"),
    }
}

/// Decimal or 0x-prefixed hexadecimal.
fn parse_u32(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s}: {e}"))
}
