//! `rbln-kmd-tests [TEST...]`: exercises /dev/rbln* from inside the guest.
//! Each test prints "ok - name" or "FAIL - name: why"; the exit status is
//! the number of failures (capped at 100).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;

use rbln_uapi as uapi;

type Res = Result<(), String>;

fn open(n: u32) -> Result<File, String> {
    OpenOptions::new().read(true).write(true).open(format!("/dev/rbln{n}")).map_err(|e| format!("open /dev/rbln{n}: {e}"))
}

/// Issue `cmd` with `arg`; Err(errno) on failure.
fn ioctl<T>(f: &File, cmd: u32, arg: &mut T) -> Result<i32, nix::errno::Errno> {
    // SAFETY: `arg` is a live, exclusively borrowed struct of the size the
    // command encodes (or deliberately not, in the size tests, where the
    // driver must still only touch the encoded size).
    let r = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, arg as *mut T) };
    if r < 0 { Err(nix::errno::Errno::last()) } else { Ok(r) }
}

fn expect_err<T: std::fmt::Debug>(r: Result<T, nix::errno::Errno>, want: nix::errno::Errno, what: &str) -> Res {
    match r {
        Err(e) if e == want => Ok(()),
        other => Err(format!("{what}: expected {want}, got {other:?}")),
    }
}

fn info() -> Res {
    let f = open(0)?;
    let mut i = uapi::DeviceInfo::default();
    ioctl(&f, uapi::RBLN_IOCTL_INFO, &mut i).map_err(|e| format!("INFO: {e}"))?;
    if i.uapi_version != uapi::UAPI_VERSION || i.vendor_id != rbln_hw::pci::VENDOR_ID || i.device_id != rbln_hw::pci::DEVICE_ID {
        return Err(format!("unexpected identity {i:?}"));
    }
    if i.hw_version >> 16 != rbln_hw::HW_VERSION_MAJOR || i.num_queues < 16 || i.dram_size != 256 << 20 || i.minor_index != 0 {
        return Err(format!("unexpected info {i:?}"));
    }
    println!("# info: {i:?}");
    Ok(())
}

/// The size rule: a shorter (older) struct gets a prefix, a longer one
/// must have zero tail bytes (E2BIG otherwise).
fn info_sizes() -> Res {
    let f = open(0)?;
    let mut small = [0u8; 8];
    let cmd = uapi::ioc(3, 0x00, small.len());
    ioctl(&f, cmd, &mut small).map_err(|e| format!("short INFO: {e}"))?;
    if u32::from_le_bytes(small[..4].try_into().unwrap()) != uapi::UAPI_VERSION {
        return Err("short INFO did not return the prefix".into());
    }
    let mut big = [0u8; 128];
    ioctl(&f, uapi::ioc(3, 0x00, big.len()), &mut big).map_err(|e| format!("long INFO with zero tail: {e}"))?;
    let mut bad = [0u8; 128];
    bad[100] = 1;
    expect_err(ioctl(&f, uapi::ioc(3, 0x00, bad.len()), &mut bad), nix::errno::Errno::E2BIG, "long INFO with non-zero tail")
}

fn unknown_ioctls() -> Res {
    let f = open(0)?;
    let mut x = [0u64; 8];
    expect_err(ioctl(&f, uapi::iowr(0x7f, 64), &mut x), nix::errno::Errno::ENOTTY, "unknown nr")?;
    // SAFETY: TCGETS on a non-tty; the driver must answer ENOTTY.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TCGETS, x.as_mut_ptr()) };
    if r != -1 || nix::errno::Errno::last() != nix::errno::Errno::ENOTTY {
        return Err("foreign ioctl type accepted".into());
    }
    // A bad user pointer is EFAULT, not a crash.
    // SAFETY: the address is deliberately invalid; the kernel must check it.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), uapi::RBLN_IOCTL_INFO as _, 8usize as *mut u8) };
    if r != -1 || nix::errno::Errno::last() != nix::errno::Errno::EFAULT {
        return Err(format!("INFO to a bad pointer: {r} {}", nix::errno::Errno::last()));
    }
    Ok(())
}

fn two_devices() -> Res {
    for n in 0..2 {
        let f = open(n)?;
        let mut i = uapi::DeviceInfo::default();
        ioctl(&f, uapi::RBLN_IOCTL_INFO, &mut i).map_err(|e| format!("INFO on rbln{n}: {e}"))?;
        if i.minor_index != n {
            return Err(format!("rbln{n} reports index {}", i.minor_index));
        }
    }
    Ok(())
}

const TESTS: &[(&str, fn() -> Res)] = &[
    ("info", info),
    ("info_sizes", info_sizes),
    ("unknown_ioctls", unknown_ioctls),
    ("two_devices", two_devices),
];

fn main() {
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    let mut failures = 0;
    for (name, test) in TESTS {
        if !wanted.is_empty() && !wanted.iter().any(|w| w == name) {
            continue;
        }
        match test() {
            Ok(()) => println!("ok - {name}"),
            Err(e) => {
                println!("FAIL - {name}: {e}");
                failures += 1;
            }
        }
    }
    std::process::exit(failures.min(100));
}
