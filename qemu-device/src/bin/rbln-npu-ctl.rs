//! `rbln-npu-ctl SOCKET COMMAND...`: send one command to a device model's
//! debug control socket (`rbln-npu --control SOCKET`) and print the reply.
//! Exits 0 for an `ok` reply, 1 for an error.
//!
//!     rbln-npu-ctl /run/npu0.ctl inject irq-drop:count=3
//!     rbln-npu-ctl /run/npu0.ctl status

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [socket, command @ ..] = args.as_slice() else {
        eprintln!("usage: rbln-npu-ctl SOCKET COMMAND...");
        return ExitCode::from(2);
    };
    if command.is_empty() {
        eprintln!("usage: rbln-npu-ctl SOCKET COMMAND...");
        return ExitCode::from(2);
    }
    let reply = (|| -> std::io::Result<String> {
        let mut s = UnixStream::connect(socket)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        writeln!(s, "{}", command.join(" "))?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line)?;
        Ok(line.trim_end().to_string())
    })();
    match reply {
        Ok(r) => {
            println!("{r}");
            if r.starts_with("ok") { ExitCode::SUCCESS } else { ExitCode::from(1) }
        }
        Err(e) => {
            eprintln!("rbln-npu-ctl: {socket}: {e}");
            ExitCode::from(1)
        }
    }
}
