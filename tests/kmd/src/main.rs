//! `rbln-kmd-tests [TEST...]`: exercises /dev/rbln* from inside the guest.
//! Each test prints "ok - name" or "FAIL - name: why"; the exit status is
//! the number of failures (capped at 100).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;

use rbln_uapi as uapi;

mod faults;
mod hotplug;
mod storm;

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
    if i.hw_version >> 16 != rbln_hw::HW_VERSION_MAJOR || i.num_queues < 16 || i.dram_size != 2048 << 20 || i.minor_index != 0 {
        return Err(format!("unexpected info {i:?}"));
    }
    println!("# info: {i:?}");
    Ok(())
}

/// The size rule: at least the first version's struct (EINVAL below), a
/// longer one must have zero tail bytes (E2BIG otherwise); only _IOWR.
fn info_sizes() -> Res {
    let f = open(0)?;
    let mut small = [0u8; 8];
    expect_err(ioctl(&f, uapi::ioc(3, 0x00, small.len()), &mut small), Errno::EINVAL, "INFO smaller than version 1")?;
    expect_err(ioctl(&f, uapi::ioc(2, 0x00, 80), &mut [0u8; 80]), Errno::ENOTTY, "INFO as _IOR")?;
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

/// Typed ioctl wrappers returning errno on failure.
fn bo_create(f: &File, size: u64, flags: u32) -> Result<u32, nix::errno::Errno> {
    let mut a = uapi::BoCreate { size, flags, ..Default::default() };
    ioctl(f, uapi::RBLN_IOCTL_BO_CREATE, &mut a)?;
    Ok(a.handle)
}

fn vm_map(f: &File, handle: u32, va: u64, flags: u32) -> Result<u64, nix::errno::Errno> {
    let mut a = uapi::VmMap { handle, flags, va, ..Default::default() };
    ioctl(f, uapi::RBLN_IOCTL_VM_MAP, &mut a)?;
    Ok(a.va)
}

fn queue_create(f: &File) -> Result<u32, nix::errno::Errno> {
    let mut a = uapi::QueueCreate::default();
    ioctl(f, uapi::RBLN_IOCTL_QUEUE_CREATE, &mut a)?;
    Ok(a.queue_id)
}

fn submit(f: &File, queue_id: u32, va: u64, size: u32) -> Result<u64, nix::errno::Errno> {
    let mut a = uapi::Submit { queue_id, cmdbuf_va: va, cmdbuf_size: size, ..Default::default() };
    ioctl(f, uapi::RBLN_IOCTL_SUBMIT, &mut a)?;
    Ok(a.fence)
}

fn wait(f: &File, queue_id: u32, value: u64, timeout_ns: u64) -> Result<(), nix::errno::Errno> {
    let mut a = uapi::FenceWait { queue_id, value, timeout_ns, ..Default::default() };
    ioctl(f, uapi::RBLN_IOCTL_FENCE_WAIT, &mut a).map(|_| ())
}

/// A host BO mapped into this process.
struct Mapped {
    ptr: *mut u8,
    len: usize,
}

impl Mapped {
    fn new(f: &File, handle: u32, len: usize) -> Result<Self, String> {
        let mut info = uapi::BoInfo { handle, ..Default::default() };
        ioctl(f, uapi::RBLN_IOCTL_BO_INFO, &mut info).map_err(|e| format!("BO_INFO: {e}"))?;
        // SAFETY: mapping a BO of this file at the offset the driver gave.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), info.mmap_offset as libc::off_t)
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap BO: {}", std::io::Error::last_os_error()));
        }
        Ok(Self { ptr: p.cast(), len })
    }

    fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: in bounds of the live mapping.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) }
    }

    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.len);
        // SAFETY: in bounds of the live mapping; the device may write it, so volatile.
        (0..len).map(|i| unsafe { self.ptr.add(off + i).read_volatile() }).collect()
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

use nix::errno::Errno;

/// The setup most tests start from: a context with one host page mapped
/// read-write into its VA space (and into this process), and a queue.
struct Env {
    f: File,
    va: u64,
    m: Mapped,
    q: u32,
}

impl Env {
    fn new() -> Result<Self, String> {
        let f = open(0)?;
        let host = bo_create(&f, 4096, uapi::BO_HOST).map_err(|e| format!("BO: {e}"))?;
        let va = vm_map(&f, host, 0, uapi::VM_READ | uapi::VM_WRITE).map_err(|e| format!("map: {e}"))?;
        let m = Mapped::new(&f, host, 4096)?;
        let q = queue_create(&f).map_err(|e| format!("queue: {e}"))?;
        Ok(Self { f, va, m, q })
    }

    /// Write `cmds` at byte `off` of the page and submit them.
    fn run(&self, off: usize, cmds: &[u8]) -> Result<u64, String> {
        self.m.write(off, cmds);
        submit(&self.f, self.q, self.va + off as u64, cmds.len() as u32).map_err(|e| format!("submit: {e}"))
    }

    /// Submit a job that blocks until the u64 at byte 2048 of the page is 1.
    fn run_blocked(&self) -> Result<u64, String> {
        let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
        e.sem_wait(self.va + 2048, 1, rbln_hw::cmd::SEM_COND_EQ);
        self.run(0, &e.buf)
    }

    /// Let the job of `run_blocked` finish.
    fn release(&self) {
        self.m.write(2048, &1u64.to_le_bytes());
    }
}

fn bo_errors() -> Res {
    let f = open(0)?;
    expect_err(bo_create(&f, 0, uapi::BO_HOST), Errno::EINVAL, "zero size")?;
    expect_err(bo_create(&f, uapi::MAX_BO_SIZE + 1, uapi::BO_HOST), Errno::EINVAL, "oversize")?;
    expect_err(bo_create(&f, 4096, 0), Errno::EINVAL, "no placement")?;
    expect_err(bo_create(&f, 4096, uapi::BO_HOST | uapi::BO_DRAM), Errno::EINVAL, "two placements")?;
    expect_err(bo_create(&f, 4096, 1 << 7), Errno::EINVAL, "unknown flag")?;
    let mut a = uapi::BoCreate { size: 4096, flags: uapi::BO_HOST, reserved: [0, 1], ..Default::default() };
    expect_err(ioctl(&f, uapi::RBLN_IOCTL_BO_CREATE, &mut a), Errno::EINVAL, "non-zero reserved")?;
    dram_exhausted(&f)?;
    let h = bo_create(&f, 5000, uapi::BO_DRAM).map_err(|e| format!("DRAM BO: {e}"))?;
    let mut info = uapi::BoInfo { handle: h, ..Default::default() };
    ioctl(&f, uapi::RBLN_IOCTL_BO_INFO, &mut info).map_err(|e| format!("BO_INFO: {e}"))?;
    if info.size != 8192 || info.flags != uapi::BO_DRAM {
        return Err(format!("BO_INFO {info:?}"));
    }
    let mut d = uapi::BoDestroy { handle: h, ..Default::default() };
    ioctl(&f, uapi::RBLN_IOCTL_BO_DESTROY, &mut d).map_err(|e| format!("destroy: {e}"))?;
    expect_err(ioctl(&f, uapi::RBLN_IOCTL_BO_DESTROY, &mut d), Errno::ENOENT, "stale handle")?;
    let mut info = uapi::BoInfo { handle: 999, ..Default::default() };
    expect_err(ioctl(&f, uapi::RBLN_IOCTL_BO_INFO, &mut info), Errno::ENOENT, "unknown handle")?;
    // Handles are per file: another open file does not see this one's BOs.
    let h = bo_create(&f, 4096, uapi::BO_HOST).map_err(|e| format!("host BO: {e}"))?;
    let g = open(0)?;
    let mut info = uapi::BoInfo { handle: h, ..Default::default() };
    expect_err(ioctl(&g, uapi::RBLN_IOCTL_BO_INFO, &mut info), Errno::ENOENT, "foreign handle")?;
    Ok(())
}

/// BOs of the largest size fill the DRAM; the one that no longer fits
/// fails with ENOSPC, and freeing them gives the DRAM back.
fn dram_exhausted(f: &File) -> Res {
    let mut info = uapi::DeviceInfo::default();
    ioctl(f, uapi::RBLN_IOCTL_INFO, &mut info).map_err(|e| format!("INFO: {e}"))?;
    let fit = info.dram_size / uapi::MAX_BO_SIZE;
    let mut held = Vec::new();
    let result = loop {
        match bo_create(f, uapi::MAX_BO_SIZE, uapi::BO_DRAM) {
            Ok(h) if (held.len() as u64) < fit => held.push(h),
            Ok(_) => break Err(format!("{} DRAM BOs of {} bytes created on {} bytes of DRAM", held.len() + 1, uapi::MAX_BO_SIZE, info.dram_size)),
            Err(e) => break expect_err(Err::<(), _>(e), Errno::ENOSPC, "more DRAM than is left"),
        }
    };
    for h in held {
        let mut d = uapi::BoDestroy { handle: h, ..Default::default() };
        ioctl(f, uapi::RBLN_IOCTL_BO_DESTROY, &mut d).map_err(|e| format!("destroy: {e}"))?;
    }
    result
}

fn vm_errors() -> Res {
    let f = open(0)?;
    let h = bo_create(&f, 8192, uapi::BO_HOST).map_err(|e| format!("BO: {e}"))?;
    expect_err(vm_map(&f, h, 0x20_0001, uapi::VM_READ), Errno::EINVAL, "unaligned VA")?;
    expect_err(vm_map(&f, h, 0, 0), Errno::EINVAL, "no permission")?;
    expect_err(vm_map(&f, h, 0, 1 << 5), Errno::EINVAL, "unknown permission bit")?;
    expect_err(vm_map(&f, h, 0x1000, uapi::VM_READ), Errno::EINVAL, "VA below the user range")?;
    expect_err(vm_map(&f, h, !0xfffu64, uapi::VM_READ), Errno::EINVAL, "VA overflow")?;
    let mut a = uapi::VmMap { handle: h, flags: uapi::VM_READ, offset: 4096, size: 8192, ..Default::default() };
    expect_err(ioctl(&f, uapi::RBLN_IOCTL_VM_MAP, &mut a), Errno::EINVAL, "range past the BO")?;
    expect_err(vm_map(&f, 77, 0, uapi::VM_READ), Errno::ENOENT, "unknown BO")?;
    let va = vm_map(&f, h, 0x40_0000, uapi::VM_READ).map_err(|e| format!("map: {e}"))?;
    expect_err(vm_map(&f, h, 0x40_1000, uapi::VM_READ), Errno::EBUSY, "overlapping VA")?;
    let mut d = uapi::BoDestroy { handle: h, ..Default::default() };
    expect_err(ioctl(&f, uapi::RBLN_IOCTL_BO_DESTROY, &mut d), Errno::EBUSY, "destroy while mapped")?;
    let mut u = uapi::VmUnmap { va: va + 4096, ..Default::default() };
    expect_err(ioctl(&f, uapi::RBLN_IOCTL_VM_UNMAP, &mut u), Errno::ENOENT, "unmap of a non-start VA")?;
    u.va = va;
    ioctl(&f, uapi::RBLN_IOCTL_VM_UNMAP, &mut u).map_err(|e| format!("unmap: {e}"))?;
    ioctl(&f, uapi::RBLN_IOCTL_BO_DESTROY, &mut d).map_err(|e| format!("destroy after unmap: {e}"))?;
    Ok(())
}

/// A command buffer in a mapped host BO: FILL, DMA to a DRAM BO and back,
/// submitted through the kernel and waited for by interrupt.
fn submit_and_wait() -> Res {
    let f = open(0)?;
    let host = bo_create(&f, 3 * 4096, uapi::BO_HOST).map_err(|e| format!("host BO: {e}"))?;
    let dram = bo_create(&f, 4096, uapi::BO_DRAM).map_err(|e| format!("DRAM BO: {e}"))?;
    let hva = vm_map(&f, host, 0, uapi::VM_READ | uapi::VM_WRITE).map_err(|e| format!("map host: {e}"))?;
    let dva = vm_map(&f, dram, 0, uapi::VM_READ | uapi::VM_WRITE).map_err(|e| format!("map DRAM: {e}"))?;
    let m = Mapped::new(&f, host, 3 * 4096)?;
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.fill(hva + 4096, 256, 0xC0FF_EE00).dma_copy(hva + 4096, dva, 256).dma_copy(dva, hva + 8192, 256);
    m.write(0, &e.buf);
    let q = queue_create(&f).map_err(|e| format!("queue: {e}"))?;
    let fence = submit(&f, q, hva, e.buf.len() as u32).map_err(|e| format!("submit: {e}"))?;
    wait(&f, q, fence, 5_000_000_000).map_err(|e| format!("wait: {e}"))?;
    let back = m.read(8192, 256);
    if !back.chunks(4).all(|c| c == 0xC0FF_EE00u32.to_le_bytes()) {
        return Err(format!("data came back wrong: {:x?}", &back[..16]));
    }
    // Many round trips lose no fence.
    let mut last = fence;
    for _ in 0..200 {
        let f2 = submit(&f, q, hva, e.buf.len() as u32).map_err(|e| format!("submit: {e}"))?;
        if f2 != last + 1 {
            return Err(format!("fence {f2} after {last}"));
        }
        wait(&f, q, f2, 5_000_000_000).map_err(|e| format!("wait {f2}: {e}"))?;
        last = f2;
    }
    expect_err(wait(&f, q, last + 10, 1000), Errno::EINVAL, "waiting for a fence never submitted")?;
    expect_err(wait(&f, 99, 1, 1000), Errno::ENOENT, "unknown queue")?;
    expect_err(submit(&f, q, hva + 2, 8), Errno::EINVAL, "unaligned command buffer")?;
    expect_err(submit(&f, q, hva, 0), Errno::EINVAL, "empty command buffer")?;
    Ok(())
}

/// A job blocked on a semaphore times out; a job touching an unmapped
/// address fails its fence with EIO and the queue refuses more work, while
/// another file's queue keeps working.
fn timeout_and_fault() -> Res {
    let env = Env::new()?;
    let (f, q, va) = (&env.f, env.q, env.va);
    let fence = env.run_blocked()?;
    expect_err(wait(f, q, fence, 50_000_000), Errno::ETIMEDOUT, "wait on a blocked job")?;
    expect_err(wait(f, q, fence, 0), Errno::ETIMEDOUT, "poll on a blocked job")?;
    env.release();
    wait(f, q, fence, 5_000_000_000).map_err(|e| format!("wait after release: {e}"))?;

    let mut bad = rbln_hw::cmd::Encoder::new(Vec::new());
    bad.fill(0x7000_0000, 4, 1);
    let fence = env.run(512, &bad.buf)?;
    expect_err(wait(f, q, fence, 5_000_000_000), Errno::EIO, "fence of a faulting job")?;
    expect_err(submit(f, q, va, 8).map(|_| ()), Errno::EIO, "submit after a fault")?;
    // Another context is unaffected.
    let mut nop = rbln_hw::cmd::Encoder::new(Vec::new());
    nop.nop();
    let other = Env::new()?;
    let of = other.run(0, &nop.buf)?;
    wait(&other.f, other.q, of, 5_000_000_000).map_err(|e| format!("other wait: {e}"))?;
    // The context is poisoned: even a new queue refuses work, while a new
    // file (context) works.
    expect_err(queue_create(f).map(|_| ()), Errno::EIO, "new queue in a poisoned context")?;
    expect_err(submit(f, q, va, 4).map(|_| ()), Errno::EIO, "submit in a poisoned context")?;
    // The faulted queue's error record stays readable until it is destroyed.
    let mut d = uapi::QueueDestroy { queue_id: q, ..Default::default() };
    ioctl(f, uapi::RBLN_IOCTL_QUEUE_DESTROY, &mut d).map_err(|e| format!("destroy faulted queue: {e}"))?;
    let fresh = Env::new()?;
    let ff = fresh.run(0, &nop.buf)?;
    wait(&fresh.f, fresh.q, ff, 5_000_000_000).map_err(|e| format!("new wait: {e}"))?;
    Ok(())
}

/// With hang_ms set low: a job that never finishes is reset, its fence
/// fails with EIO well before the wait's own timeout, and the context is
/// poisoned.
fn hang() -> Res {
    let env = Env::new()?;
    let (f, q, va) = (&env.f, env.q, env.va);
    let fence = env.run_blocked()?;
    let t0 = std::time::Instant::now();
    expect_err(wait(f, q, fence, 20_000_000_000), Errno::EIO, "wait on a hung job")?;
    let took = t0.elapsed();
    if took > std::time::Duration::from_secs(10) {
        return Err(format!("hang detected only after {took:?}"));
    }
    println!("# hang detected after {took:?}");
    expect_err(submit(f, q, va, 4).map(|_| ()), Errno::EIO, "submit after a hang")?;
    Ok(())
}

fn mmap_raw(f: &File, off: u64, len: usize, prot: i32) -> Result<*mut u8, Errno> {
    // SAFETY: mapping this file at a driver-provided offset.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, f.as_raw_fd(), off as libc::off_t) };
    if p == libc::MAP_FAILED { Err(Errno::last()) } else { Ok(p.cast()) }
}

/// User-mode submission: the process writes its ring and rings its own
/// doorbell page, no syscall; the status block shows the fence.
fn user_mode_submission() -> Res {
    let f = open(0)?;
    let host = bo_create(&f, 4096, uapi::BO_HOST).map_err(|e| format!("BO: {e}"))?;
    let va = vm_map(&f, host, 0, uapi::VM_READ | uapi::VM_WRITE).map_err(|e| format!("map: {e}"))?;
    let m = Mapped::new(&f, host, 4096)?;
    let mut qa = uapi::QueueCreate { ring_entries: 16, ..Default::default() };
    ioctl(&f, uapi::RBLN_IOCTL_QUEUE_CREATE, &mut qa).map_err(|e| format!("queue: {e}"))?;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    expect_err(mmap_raw(&f, qa.status_mmap_offset, 4096, rw).map(|_| ()), Errno::EACCES, "writable status mapping")?;
    expect_err(mmap_raw(&f, qa.doorbell_mmap_offset, 8192, rw).map(|_| ()), Errno::EINVAL, "two-page doorbell mapping")?;
    expect_err(mmap_raw(&f, uapi::mmap_offset(uapi::MMAP_KIND_DOORBELL, 99), 4096, rw).map(|_| ()), Errno::ENOENT, "doorbell of a queue not ours")?;
    expect_err(mmap_raw(&f, uapi::mmap_offset(9, 1), 4096, rw).map(|_| ()), Errno::EINVAL, "unknown mapping kind")?;
    let ring = mmap_raw(&f, qa.ring_mmap_offset, 4096, rw).map_err(|e| format!("mmap ring: {e}"))?;
    let status = mmap_raw(&f, qa.status_mmap_offset, 4096, libc::PROT_READ).map_err(|e| format!("mmap status: {e}"))?;
    let doorbell = mmap_raw(&f, qa.doorbell_mmap_offset, 4096, libc::PROT_WRITE).map_err(|e| format!("mmap doorbell: {e}"))?;
    // SAFETY (block): the three mappings are live for the rest of the
    // function; offsets are within their pages.
    let status_fence = || unsafe { (status.add(8) as *const u64).read_volatile() };
    let base = status_fence();
    let mut lat = Vec::new();
    for i in 0..64u32 {
        let value = base + 1 + i as u64;
        let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
        e.fill(va + 2048, 8, i).fence(value, 0, false);
        m.write(0, &e.buf);
        let entry = rbln_hw::ring::RingEntry { cmdbuf_va: va, cmdbuf_size: e.buf.len() as u32, ..Default::default() };
        let slot = (i % 16) as usize;
        let t0 = std::time::Instant::now();
        unsafe {
            std::ptr::copy_nonoverlapping(entry.to_bytes().as_ptr(), ring.add(slot * 32), 32);
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            (doorbell as *mut u32).write_volatile((i + 1) % 16);
        }
        while status_fence() < value {
            if t0.elapsed() > std::time::Duration::from_secs(5) {
                return Err(format!("user-mode fence {value} never came"));
            }
            std::hint::spin_loop();
        }
        lat.push(t0.elapsed());
        if m.read(2048, 4) != i.to_le_bytes() {
            return Err("user-mode job did not run".into());
        }
    }
    lat.sort();
    println!("# user-mode submit->fence round trip: p50 {:?} p99 {:?}", lat[lat.len() / 2], lat[lat.len() * 99 / 100]);
    wait(&f, qa.queue_id, base + 64, 1_000_000_000).map_err(|e| format!("FENCE_WAIT on a user-mode queue: {e}"))?;
    expect_err(submit(&f, qa.queue_id, va, 4).map(|_| ()), Errno::EBUSY, "kernel SUBMIT on a user-mode queue")?;
    Ok(())
}

/// One worker of `stress`: `n` submit/wait cycles on its own context and
/// queue, each fence exactly one more than the last.
fn stress_worker(n: u32) -> Res {
    let env = Env::new()?;
    let (f, q, va, m) = (&env.f, env.q, env.va, &env.m);
    let mut last = None;
    for i in 0..n {
        let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
        e.fill(va + 1024, 4, i);
        let fence = env.run(0, &e.buf).map_err(|e| format!("cycle {i}: {e}"))?;
        if let Some(l) = last {
            if fence != l + 1 {
                return Err(format!("fence {fence} after {l}"));
            }
        }
        wait(f, q, fence, 10_000_000_000).map_err(|e| format!("wait {fence}: {e}"))?;
        if m.read(1024, 4) != i.to_le_bytes() {
            return Err(format!("cycle {i}: result missing"));
        }
        last = Some(fence);
    }
    Ok(())
}

/// 4 processes x 1000 submit/wait cycles at once: no fence lost.
fn stress() -> Res {
    let mut children = Vec::new();
    for _ in 0..4 {
        // SAFETY: the child only runs `stress_worker` and exits.
        match unsafe { libc::fork() } {
            0 => std::process::exit(match stress_worker(1000) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("stress worker: {e}");
                    1
                }
            }),
            -1 => return Err("fork failed".into()),
            pid => children.push(pid),
        }
    }
    let mut failed = 0;
    for pid in children {
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        if !(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0) {
            failed += 1;
        }
    }
    if failed > 0 { Err(format!("{failed} of 4 workers failed")) } else { Ok(()) }
}

/// Allocate everything there is to allocate, start a job that never ends,
/// then block in FENCE_WAIT until killed (used by the leak test).
fn hold() -> Res {
    let f = open(0)?;
    let host = bo_create(&f, 64 * 4096, uapi::BO_HOST).map_err(|e| format!("BO: {e}"))?;
    let _dram = bo_create(&f, 1 << 20, uapi::BO_DRAM).map_err(|e| format!("DRAM BO: {e}"))?;
    let va = vm_map(&f, host, 0, uapi::VM_READ | uapi::VM_WRITE).map_err(|e| format!("map: {e}"))?;
    let m = Mapped::new(&f, host, 4096)?;
    let q = queue_create(&f).map_err(|e| format!("queue: {e}"))?;
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.sem_wait(va + 2048, 1, rbln_hw::cmd::SEM_COND_EQ);
    m.write(0, &e.buf);
    let fence = submit(&f, q, va, e.buf.len() as u32).map_err(|e| format!("submit: {e}"))?;
    println!("# holding");
    let _ = wait(&f, q, fence, 600_000_000_000);
    Err("hold returned".into())
}

extern "C" fn on_alarm(_: libc::c_int) {}

/// A signal interrupts a fence wait: EINTR (the handler has no SA_RESTART).
fn signal_interrupts_wait() -> Res {
    let env = Env::new()?;
    let (f, q) = (&env.f, env.q);
    let fence = env.run_blocked()?;
    // SAFETY: installing a do-nothing handler, then arming a 200 ms timer.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as extern "C" fn(libc::c_int) as usize;
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
        let t = libc::itimerval { it_interval: libc::timeval { tv_sec: 0, tv_usec: 0 }, it_value: libc::timeval { tv_sec: 0, tv_usec: 200_000 } };
        libc::setitimer(libc::ITIMER_REAL, &t, std::ptr::null_mut());
    }
    let t0 = std::time::Instant::now();
    expect_err(wait(f, q, fence, 8_000_000_000), Errno::EINTR, "wait interrupted by a signal")?;
    if t0.elapsed() > std::time::Duration::from_secs(4) {
        return Err(format!("the signal took {:?} to interrupt the wait", t0.elapsed()));
    }
    env.release();
    wait(f, q, fence, 5_000_000_000).map_err(|e| format!("wait after the signal: {e}"))
}

/// DRAM churn: many BOs of mixed sizes created and destroyed in a shuffled
/// order, after which all of DRAM is still one allocatable block.
fn dram_churn() -> Res {
    let f = open(0)?;
    let mut info = uapi::DeviceInfo::default();
    ioctl(&f, uapi::RBLN_IOCTL_INFO, &mut info).map_err(|e| format!("INFO: {e}"))?;
    let mut seed = 0x9E37_79B9u32;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    let mut live: Vec<u32> = Vec::new();
    for _ in 0..2000 {
        if live.len() > 40 || (!live.is_empty() && rnd() % 3 == 0) {
            let h = live.swap_remove(rnd() as usize % live.len());
            let mut d = uapi::BoDestroy { handle: h, ..Default::default() };
            ioctl(&f, uapi::RBLN_IOCTL_BO_DESTROY, &mut d).map_err(|e| format!("destroy: {e}"))?;
        } else {
            let size = 4096 * (1 + (rnd() % 256) as u64);
            live.push(bo_create(&f, size, uapi::BO_DRAM).map_err(|e| format!("create {size}: {e}"))?);
        }
    }
    for h in live.drain(..) {
        let mut d = uapi::BoDestroy { handle: h, ..Default::default() };
        ioctl(&f, uapi::RBLN_IOCTL_BO_DESTROY, &mut d).map_err(|e| format!("destroy: {e}"))?;
    }
    // No fragmentation left behind: the largest possible BO fits.
    let all = info.dram_size.min(uapi::MAX_BO_SIZE);
    let h = bo_create(&f, all, uapi::BO_DRAM).map_err(|e| format!("whole-DRAM BO after churn: {e}"))?;
    let mut d = uapi::BoDestroy { handle: h, ..Default::default() };
    ioctl(&f, uapi::RBLN_IOCTL_BO_DESTROY, &mut d).map_err(|e| format!("destroy: {e}"))?;
    Ok(())
}

/// Random ioctl numbers, sizes and argument bytes (biased towards valid
/// handles and small values) from two files: the driver must answer each
/// with a result or an error and keep working.
fn ioctl_fuzz() -> Res {
    let files = [open(0)?, open(0)?];
    let mut seed = 0x1234_5678_9ABC_DEF1u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let sizes = [0usize, 4, 8, 16, 24, 32, 48, 56, 64, 80, 128, 1024];
    let mut calls = 0u32;
    for _ in 0..20000 {
        let f = &files[(rnd() % 2) as usize];
        let nr = (rnd() % 12) as u32;
        let size = sizes[(rnd() % sizes.len() as u64) as usize];
        let mut buf = vec![0u8; size.max(8)];
        for (i, b) in buf.iter_mut().enumerate() {
            *b = match rnd() % 4 {
                0 => 0,
                1 => (rnd() % 4) as u8, // small handles, ids, flags
                2 if i % 8 == 1 => 0x10, // page-ish offsets
                _ => rnd() as u8,
            };
        }
        if nr == 0x09 && size >= 24 {
            // FENCE_WAIT: keep timeouts short so the run stays bounded.
            buf[16..24].copy_from_slice(&(rnd() % 1_000_000).to_le_bytes());
        }
        let cmd = uapi::ioc(3, nr, size);
        // SAFETY: `buf` is at least `size` bytes and lives across the call.
        unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, buf.as_mut_ptr()) };
        calls += 1;
    }
    println!("# {calls} random ioctls");
    drop(files);
    // Still working afterwards.
    submit_and_wait()
}

fn queue_errors() -> Res {
    let f = open(0)?;
    for (entries, flags, what) in [(3u32, 0u32, "ring size not a power of two"), (256, 0, "ring larger than a page"), (1, 0, "ring of one entry"), (16, 1, "unknown flag")] {
        let mut a = uapi::QueueCreate { ring_entries: entries, flags, ..Default::default() };
        expect_err(ioctl(&f, uapi::RBLN_IOCTL_QUEUE_CREATE, &mut a), Errno::EINVAL, what)?;
    }
    let mut a = uapi::QueueCreate { reserved: [1, 0], ..Default::default() };
    expect_err(ioctl(&f, uapi::RBLN_IOCTL_QUEUE_CREATE, &mut a), Errno::EINVAL, "non-zero reserved")?;
    let mut d = uapi::QueueDestroy { queue_id: 5, ..Default::default() };
    expect_err(ioctl(&f, uapi::RBLN_IOCTL_QUEUE_DESTROY, &mut d), Errno::ENOENT, "destroy of an unknown queue")?;
    let q = queue_create(&f).map_err(|e| format!("queue: {e}"))?;
    let mut s = uapi::Submit { queue_id: q, cmdbuf_va: 0x20_0000, cmdbuf_size: 8, flags: 2, ..Default::default() };
    expect_err(ioctl(&f, uapi::RBLN_IOCTL_SUBMIT, &mut s), Errno::EINVAL, "submit with unknown flags")?;
    s.flags = 0;
    s.cmdbuf_size = 17 << 20;
    expect_err(ioctl(&f, uapi::RBLN_IOCTL_SUBMIT, &mut s), Errno::EINVAL, "command buffer over 16 MiB")?;
    let mut w = uapi::FenceWait { queue_id: q, flags: 1, ..Default::default() };
    expect_err(ioctl(&f, uapi::RBLN_IOCTL_FENCE_WAIT, &mut w), Errno::EINVAL, "wait with unknown flags")?;
    // Every queue but the driver's own can be taken, then EBUSY.
    let mut taken = vec![q];
    loop {
        match queue_create(&f) {
            Ok(id) => taken.push(id),
            Err(Errno::EBUSY) => break,
            Err(e) => return Err(format!("queue {}: {e}", taken.len())),
        }
    }
    if taken.len() != 15 {
        return Err(format!("{} queues available, expected 15", taken.len()));
    }
    d.queue_id = q;
    ioctl(&f, uapi::RBLN_IOCTL_QUEUE_DESTROY, &mut d).map_err(|e| format!("destroy: {e}"))?;
    expect_err(ioctl(&f, uapi::RBLN_IOCTL_QUEUE_DESTROY, &mut d), Errno::ENOENT, "double destroy")?;
    queue_create(&f).map(|_| ()).map_err(|e| format!("queue after a destroy: {e}"))
}

/// A process whose job touches an unmapped address gets EIO while a second
/// process on another queue completes all its work.
fn fault_isolation() -> Res {
    // SAFETY: the child only runs `stress_worker` and exits.
    let child = match unsafe { libc::fork() } {
        0 => std::process::exit(if stress_worker(300).is_ok() { 0 } else { 1 }),
        -1 => return Err("fork failed".into()),
        pid => pid,
    };
    let env = Env::new()?;
    let mut bad = rbln_hw::cmd::Encoder::new(Vec::new());
    bad.dma_copy(env.va, 0x6660_0000, 64);
    let fence = env.run(0, &bad.buf)?;
    let faulted = wait(&env.f, env.q, fence, 5_000_000_000);
    let mut st = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(child, &mut st, 0) };
    expect_err(faulted, Errno::EIO, "the faulting process's fence")?;
    if !(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0) {
        return Err("the other process did not complete its 300 jobs".into());
    }
    Ok(())
}

/// A DRAM BO never shows a previous owner's data: another context fills
/// DRAM, frees it, and the next BO over the same memory reads as zeros.
fn dram_scrubbed() -> Res {
    let size = 64 * 4096u64;
    {
        let env = Env::new()?;
        let dram = bo_create(&env.f, size, uapi::BO_DRAM).map_err(|e| format!("DRAM BO: {e}"))?;
        let dva = vm_map(&env.f, dram, 0, uapi::VM_READ | uapi::VM_WRITE).map_err(|e| format!("map: {e}"))?;
        let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
        e.fill(dva, size, 0x5EC2_E7AA);
        let fence = env.run(0, &e.buf)?;
        wait(&env.f, env.q, fence, 5_000_000_000).map_err(|e| format!("fill: {e}"))?;
    } // context closed: its DRAM goes back to the pool
    let f = open(0)?;
    let dram = bo_create(&f, size, uapi::BO_DRAM).map_err(|e| format!("second DRAM BO: {e}"))?;
    let host = bo_create(&f, size, uapi::BO_HOST).map_err(|e| format!("host BO: {e}"))?;
    let dva = vm_map(&f, dram, 0, uapi::VM_READ).map_err(|e| format!("map: {e}"))?;
    let hva = vm_map(&f, host, 0, uapi::VM_READ | uapi::VM_WRITE).map_err(|e| format!("map: {e}"))?;
    let m = Mapped::new(&f, host, size as usize)?;
    let q = queue_create(&f).map_err(|e| format!("queue: {e}"))?;
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.dma_copy(dva, hva + 4096, size - 4096);
    m.write(0, &e.buf);
    let fence = submit(&f, q, hva, e.buf.len() as u32).map_err(|e| format!("submit: {e}"))?;
    wait(&f, q, fence, 5_000_000_000).map_err(|e| format!("copy: {e}"))?;
    if m.read(4096, (size - 4096) as usize).iter().any(|&b| b != 0) {
        return Err("a new DRAM BO shows earlier data".into());
    }
    Ok(())
}

/// `/proc/self/fdinfo/<fd>` of an rbln file: the DRM/accel usage-stat
/// keys with this file's memory, and rbln's own counts; another file gets
/// another client id.
fn fdinfo() -> Res {
    use std::os::fd::AsRawFd;
    let read = |f: &File| -> Result<std::collections::HashMap<String, String>, String> {
        let path = format!("/proc/self/fdinfo/{}", f.as_raw_fd());
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        println!("# {path}:\n{}", text.lines().map(|l| format!("#   {l}")).collect::<Vec<_>>().join("\n"));
        Ok(text.lines().filter_map(|l| l.split_once(':')).map(|(k, v)| (k.to_string(), v.trim().to_string())).collect())
    };
    let f = open(0)?;
    let host = bo_create(&f, 64 << 10, uapi::BO_HOST).map_err(|e| format!("host BO: {e}"))?;
    bo_create(&f, 1 << 20, uapi::BO_DRAM).map_err(|e| format!("DRAM BO: {e}"))?;
    let hva = vm_map(&f, host, 0, uapi::VM_READ | uapi::VM_WRITE).map_err(|e| format!("map: {e}"))?;
    let m = Mapped::new(&f, host, 64 << 10)?;
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.fill(hva + 4096, 60 << 10, 7);
    m.write(0, &e.buf);
    let q = queue_create(&f).map_err(|e| format!("queue: {e}"))?;
    for _ in 0..3 {
        let fence = submit(&f, q, hva, e.buf.len() as u32).map_err(|e| format!("submit: {e}"))?;
        wait(&f, q, fence, 5_000_000_000).map_err(|e| format!("wait: {e}"))?;
    }
    let kv = read(&f)?;
    let want = [
        ("drm-driver", "rbln"),
        ("drm-total-host", "64 KiB"),
        ("drm-resident-host", "64 KiB"),
        ("drm-total-dram", "1024 KiB"),
        ("drm-resident-dram", "1024 KiB"),
        ("rbln-device", "0"),
        ("rbln-buffers", "2"),
        ("rbln-queues", "1"),
        ("rbln-submits", "3"),
    ];
    for (k, v) in want {
        if kv.get(k).map(String::as_str) != Some(v) {
            return Err(format!("fdinfo {k}: {:?}, expected {v:?}", kv.get(k)));
        }
    }
    // Engine time: "<n> ns", grown by the FILLs, kept when the queue goes.
    let engine = |kv: &std::collections::HashMap<String, String>| -> Result<u64, String> {
        kv.get("drm-engine-npu").and_then(|v| v.strip_suffix(" ns")).and_then(|v| v.parse().ok()).ok_or(format!("drm-engine-npu: {:?}", kv.get("drm-engine-npu")))
    };
    let busy = engine(&kv)?;
    if busy == 0 {
        return Err("drm-engine-npu is 0 after three 60 KiB FILLs".into());
    }
    let mut d = uapi::QueueDestroy { queue_id: q, ..Default::default() };
    ioctl(&f, uapi::RBLN_IOCTL_QUEUE_DESTROY, &mut d).map_err(|e| format!("QUEUE_DESTROY: {e}"))?;
    let after = engine(&read(&f)?)?;
    if after < busy {
        return Err(format!("drm-engine-npu went from {busy} to {after} ns when the queue was destroyed"));
    }
    let id: u64 = kv.get("drm-client-id").and_then(|v| v.parse().ok()).ok_or("no numeric drm-client-id")?;
    let other = read(&open(0)?)?;
    if engine(&other)? != 0 {
        return Err(format!("a new file has engine time {:?}", other.get("drm-engine-npu")));
    }
    let id2: u64 = other.get("drm-client-id").and_then(|v| v.parse().ok()).ok_or("no numeric drm-client-id")?;
    if id2 == id || other.get("drm-total-host").map(String::as_str) != Some("0 KiB") {
        return Err(format!("a second file: client id {id2} (first {id}), host {:?}", other.get("drm-total-host")));
    }
    Ok(())
}

/// RBLN_IOCTL_STATS: a 4 MiB FILL of DRAM shows in the DMA counters and
/// busy time; the timestamp advances; health is ok with this context and
/// queue counted; a short argument is refused.
fn stats() -> Res {
    let read = |f: &File| -> Result<uapi::DeviceStats, String> {
        let mut s = uapi::DeviceStats::default();
        ioctl(f, uapi::RBLN_IOCTL_STATS, &mut s).map_err(|e| format!("STATS: {e}"))?;
        Ok(s)
    };
    let env = Env::new()?;
    let size = 4u64 << 20;
    let dram = bo_create(&env.f, size, uapi::BO_DRAM).map_err(|e| format!("DRAM BO: {e}"))?;
    let dva = vm_map(&env.f, dram, 0, uapi::VM_READ | uapi::VM_WRITE).map_err(|e| format!("map: {e}"))?;
    let a = read(&env.f)?;
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.fill(dva, size, 7);
    let fence = env.run(0, &e.buf)?;
    wait(&env.f, env.q, fence, 5_000_000_000).map_err(|e| format!("fill: {e}"))?;
    let b = read(&env.f)?;
    println!("# stats before {a:?}\n# stats after {b:?}");
    // Timestamps may be equal: a guest without a calibrated TSC has a
    // clock of jiffies resolution (seen under the debug kernel).
    if b.timestamp_ns < a.timestamp_ns || b.dma_bytes < a.dma_bytes + size || b.packets <= a.packets {
        return Err(format!("counters did not grow: before {a:?}, after {b:?}"));
    }
    let busy = |s: &uapi::DeviceStats| s.dma_busy_ns.iter().sum::<u64>();
    if busy(&b) <= busy(&a) {
        return Err(format!("DMA busy time did not grow: {:?} -> {:?}", a.dma_busy_ns, b.dma_busy_ns));
    }
    if b.health != uapi::HEALTH_OK || b.contexts < 1 || b.queues < 1 || b.faulted_queues != 0 {
        return Err(format!("state: {b:?}"));
    }
    let mut short = [0u64; 4];
    expect_err(ioctl(&env.f, uapi::iowr(0x0a, 32), &mut short), nix::errno::Errno::EINVAL, "STATS with a 32-byte argument")?;
    Ok(())
}

/// sysfs attribute `name` of /dev/rbln0, trimmed.
fn sysfs(name: &str) -> Result<String, String> {
    let path = format!("/sys/class/misc/rbln0/{name}");
    std::fs::read_to_string(&path).map(|s| s.trim().to_string()).map_err(|e| format!("{path}: {e}"))
}

/// Write `value` to /dev/rbln0's sysfs `reset`.
fn sysfs_reset(value: &str) -> Result<(), Errno> {
    std::fs::write("/sys/class/misc/rbln0/reset", value).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0)))
}

/// Fault a job on /dev/rbln0, say "# faulted" and keep the context (and
/// so the device's `faulted` health) until killed: the device plugin test.
fn fault_hold() -> Res {
    let env = Env::new()?;
    let mut bad = rbln_hw::cmd::Encoder::new(Vec::new());
    bad.dma_copy(env.va, 0x6660_0000, 64);
    let fence = env.run(0, &bad.buf)?;
    expect_err(wait(&env.f, env.q, fence, 5_000_000_000), Errno::EIO, "the faulting job")?;
    println!("# faulted");
    std::thread::sleep(std::time::Duration::from_secs(600));
    Err("fault_hold returned".into())
}

/// The privileged reset: a faulted device reads `faulted` in sysfs until
/// root writes 1 to `reset`; then it is `ok`, `reset_count` counts it,
/// every context open at the time is poisoned (a job blocked in another
/// context fails with EIO at once, later submissions too) and a new
/// context works. Anything but "1" is refused. Needs a device nobody
/// else uses (run by name).
fn reset() -> Res {
    expect_err(sysfs_reset("2"), Errno::EINVAL, "reset with 2")?;
    let resets0: u64 = sysfs("reset_count")?.parse().map_err(|e| format!("reset_count: {e}"))?;
    if sysfs("health")? != "ok" {
        return Err(format!("health before the fault: {}", sysfs("health")?));
    }
    let bystander = Env::new()?;
    let blocked = bystander.run_blocked()?;
    let env = Env::new()?;
    let mut bad = rbln_hw::cmd::Encoder::new(Vec::new());
    bad.dma_copy(env.va, 0x6660_0000, 64);
    let fence = env.run(0, &bad.buf)?;
    expect_err(wait(&env.f, env.q, fence, 5_000_000_000), Errno::EIO, "the faulting job")?;
    if sysfs("health")? != "faulted" {
        return Err(format!("health after a fault: {}", sysfs("health")?));
    }
    let (f, q) = (bystander.f.try_clone().map_err(|e| format!("dup: {e}"))?, bystander.q);
    let waiter = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        let r = wait(&f, q, blocked, 20_000_000_000);
        (r, t0.elapsed())
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    sysfs_reset("1").map_err(|e| format!("reset: {e}"))?;
    let (r, took) = waiter.join().map_err(|_| "waiter panicked")?;
    expect_err(r, Errno::EIO, "a wait in a context open across the reset")?;
    if took > std::time::Duration::from_secs(5) {
        return Err(format!("the blocked wait ended {took:?} after it began"));
    }
    expect_err(submit(&bystander.f, bystander.q, bystander.va, 4).map(|_| ()), Errno::EIO, "submit in a context open across the reset")?;
    if sysfs("health")? != "ok" || sysfs("reset_count")? != (resets0 + 1).to_string() {
        return Err(format!("after the reset: health {}, reset_count {}", sysfs("health")?, sysfs("reset_count")?));
    }
    drop((env, bystander));
    let fresh = Env::new()?;
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.nop();
    let fence = fresh.run(0, &e.buf)?;
    wait(&fresh.f, fresh.q, fence, 5_000_000_000).map_err(|e| format!("a new context after the reset: {e}"))
}

/// Surprise removal: while a job waits, the device falls off the bus
/// (the harness's /run/rbln/unplug-npu0, see scripts/vm.sh). The waiter
/// fails with ENODEV within a second, and so does every later call; STATS
/// and sysfs say `lost`. The device is gone for good: run by name, last.
fn lost() -> Res {
    let env = Env::new()?;
    let fence = env.run_blocked()?;
    let (f, q) = (env.f.try_clone().map_err(|e| format!("dup: {e}"))?, env.q);
    let waiter = std::thread::spawn(move || {
        let r = wait(&f, q, fence, 60_000_000_000);
        (r, std::time::Instant::now())
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    let t0 = std::time::Instant::now();
    std::fs::write("/run/rbln/unplug-npu0", b"").map_err(|e| format!("asking the harness to unplug: {e}"))?;
    let (r, ended) = waiter.join().map_err(|_| "waiter panicked")?;
    expect_err(r, Errno::ENODEV, "the wait on a lost device")?;
    let took = ended.saturating_duration_since(t0);
    println!("# the waiter failed {took:?} after the unplug request");
    if took > std::time::Duration::from_secs(1) {
        return Err(format!("the lost device was noticed only after {took:?}"));
    }
    expect_err(submit(&env.f, env.q, env.va, 4).map(|_| ()), Errno::ENODEV, "submit on a lost device")?;
    expect_err(bo_create(&env.f, 4096, uapi::BO_HOST).map(|_| ()), Errno::ENODEV, "BO_CREATE on a lost device")?;
    let mut st = uapi::DeviceStats::default();
    ioctl(&env.f, uapi::RBLN_IOCTL_STATS, &mut st).map_err(|e| format!("STATS: {e}"))?;
    if st.health != uapi::HEALTH_LOST || sysfs("health")? != "lost" {
        return Err(format!("health: STATS {}, sysfs {}", st.health, sysfs("health")?));
    }
    expect_err(sysfs_reset("1"), Errno::ENODEV, "reset of a lost device")?;
    Ok(())
}

/// A named test.
type Test = (&'static str, fn() -> Res);

const TESTS: &[Test] = &[
    ("dram_scrubbed", dram_scrubbed),
    ("queue_errors", queue_errors),
    ("fault_isolation", fault_isolation),
    ("ioctl_fuzz", ioctl_fuzz),
    ("signal_interrupts_wait", signal_interrupts_wait),
    ("dram_churn", dram_churn),
    ("stress", stress),
    ("hold", hold),
    ("user_mode_submission", user_mode_submission),
    ("bo_errors", bo_errors),
    ("vm_errors", vm_errors),
    ("submit_and_wait", submit_and_wait),
    ("timeout_and_fault", timeout_and_fault),
    ("hang", hang),
    ("info", info),
    ("info_sizes", info_sizes),
    ("unknown_ioctls", unknown_ioctls),
    ("two_devices", two_devices),
    ("fdinfo", fdinfo),
    ("stats", stats),
    ("reset", reset),
    ("fault_hold", fault_hold),
    ("lost", lost),
    ("inject_irq_drop", faults::inject_irq_drop),
    ("inject_irq_delay", faults::inject_irq_delay),
    ("inject_irq_spurious", faults::inject_irq_spurious),
    ("inject_missed_fault", faults::inject_missed_fault),
    ("inject_status_corrupt", faults::inject_status_corrupt),
    ("inject_dma_fail", faults::inject_dma_fail),
    ("inject_queue_stall", faults::inject_queue_stall),
    ("inject_die", faults::inject_die),
    ("hotplug", hotplug::hotplug),
    ("ioctl_storm", storm::ioctl_storm),
    ("latency_probe", storm::latency_probe),
];

/// Tests that need a special setup and run only when named.
const ONLY_BY_NAME: &[&str] = &[
    "hold",
    "hang",
    "two_devices",
    "reset",
    "lost",
    "fault_hold",
    "inject_irq_drop",
    "inject_irq_delay",
    "inject_irq_spurious",
    "inject_missed_fault",
    "inject_status_corrupt",
    "inject_dma_fail",
    "inject_queue_stall",
    "inject_die",
    "hotplug",
    "ioctl_storm",
    "latency_probe",
];

fn main() {
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    if let Some(bad) = wanted.iter().find(|w| !TESTS.iter().any(|(n, _)| n == w)) {
        eprintln!("rbln-kmd-tests: no test named {bad}");
        std::process::exit(100);
    }
    let mut failures = 0;
    for (name, test) in TESTS {
        let run = if wanted.is_empty() { !ONLY_BY_NAME.contains(name) } else { wanted.iter().any(|w| w == name) };
        if !run {
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
