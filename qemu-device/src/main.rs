//! `rbln-npu`: the rbln virtual NPU, served to QEMU over vfio-user.
//!
//!     rbln-npu --socket /tmp/rbln0.sock --dram-mib 256 --queues 16 --cores 2
//!
//! QEMU side:
//!     -device '{"driver":"vfio-user-pci","socket":{"path":"/tmp/rbln0.sock","type":"unix"}}'
//! with guest RAM in a shared memfd backend.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use rbln_npu::{vfio, Config, Device};

#[derive(Parser)]
#[command(version, about = "The rbln virtual NPU (vfio-user server)")]
struct Args {
    /// UNIX socket to listen on (must not exist).
    #[arg(long)]
    socket: PathBuf,
    /// Device DRAM size in MiB (a power of two).
    #[arg(long, default_value_t = 256)]
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
    /// Log level: error, warn, info, debug, trace.
    #[arg(long, default_value = "warn")]
    log_level: log::LevelFilter,
}

extern "C" fn on_signal(_: libc::c_int) {
    // Nothing to do: the signal interrupts the server's blocking socket
    // call (no SA_RESTART), which ends the loop and shuts down cleanly.
}

fn install_signal_handlers() -> nix::Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(SigHandler::Handler(on_signal), SaFlags::empty(), SigSet::empty());
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler is async-signal-safe (it does nothing).
        unsafe { sigaction(sig, &action) }?;
    }
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
    };
    let device = match Device::new(cfg) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            eprintln!("rbln-npu: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = install_signal_handlers() {
        eprintln!("rbln-npu: cannot install signal handlers: {e}");
        return ExitCode::from(1);
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
        Err(e) if is_interrupted(&e) => {
            log::info!("signal received; shutting down");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rbln-npu: {e}");
            ExitCode::from(1)
        }
    }
}

fn is_interrupted(e: &vfio_user::Error) -> bool {
    let s = format!("{e:?}");
    s.contains("Interrupted") || s.contains("EINTR")
}
