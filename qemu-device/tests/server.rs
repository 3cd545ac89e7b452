//! The rbln-npu binary: command-line validation and clean shutdown.

use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_rbln-npu");

#[test]
fn rejects_bad_configuration_with_a_clear_message() {
    let dir = std::env::temp_dir().join(format!("rbln-npu-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (args, needle) in [
        (vec!["--dram-mib", "3"], "power of two"),
        (vec!["--queues", "4"], "queue count"),
        (vec!["--cores", "0"], "compute core count"),
    ] {
        let out = Command::new(BIN).arg("--socket").arg(dir.join("x.sock")).args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sigterm_shuts_down_cleanly_and_removes_the_socket() {
    let dir = std::env::temp_dir().join(format!("rbln-npu-sig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("npu.sock");
    let mut child = Command::new(BIN).arg("--socket").arg(&sock).spawn().unwrap();
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "socket never appeared");
        std::thread::sleep(Duration::from_millis(10));
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(!sock.exists(), "socket removed");
    std::fs::remove_dir_all(&dir).unwrap();
}
