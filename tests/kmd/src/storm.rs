//! The ioctl fuzzer at scale (`make fuzz`): several processes issue random
//! ioctls (blind and structure-aware: real handles, ids and VAs among the
//! garbage), mmap random offsets of their files, open and close files,
//! submit garbage command buffers and wait on them; the parent kills and
//! respawns workers at random. Afterwards nothing may be left allocated
//! and the device must still work. `RBLN_FUZZ_CALLS` (default 20000) is
//! the total number of calls; `RBLN_FUZZ_PROCS` (default 4) the workers.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rbln_uapi as uapi;

use crate::{open, Res};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// xorshift64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What a worker learned from its successful calls, reused as arguments.
#[derive(Default)]
struct Seen {
    handles: Vec<u32>,
    vas: Vec<u64>,
    queues: Vec<u32>,
    fences: Vec<u64>,
}

/// One call: an ioctl, an mmap, or a file opened or closed.
fn one_call(r: &mut Rng, files: &mut Vec<File>, seen: &mut Seen) {
    if files.is_empty() || (files.len() < 3 && r.below(64) == 0) {
        if let Ok(f) = open(0) {
            files.push(f);
        }
        return;
    }
    let fi = r.below(files.len() as u64) as usize;
    match r.below(100) {
        0 => {
            files.swap_remove(fi);
            *seen = Seen::default();
        }
        1..=4 => {
            // A whole job: a host BO mapped into the context, random
            // packets (valid headers, hostile fields) written into it,
            // submitted on a queue, sometimes waited for.
            let f = &files[fi];
            let Ok(bo) = crate::bo_create(f, 4096, uapi::BO_HOST) else { return };
            seen.handles.push(bo);
            let Ok(va) = crate::vm_map(f, bo, 0, uapi::VM_READ | uapi::VM_WRITE) else { return };
            seen.vas.push(va);
            let q = match seen.queues.last() {
                Some(&q) if r.below(4) != 0 => q,
                _ => match crate::queue_create(f) {
                    Ok(q) => {
                        seen.queues.push(q);
                        q
                    }
                    Err(_) => return,
                },
            };
            let Ok(m) = crate::Mapped::new(f, bo, 4096) else { return };
            let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
            for _ in 0..1 + r.below(6) {
                let addr = [va, va + 2048, r.next() & 0xffff_fffc, 0x4000_0000][r.below(4) as usize];
                let n = [4u64, 64, 2048, r.next() & 0xfffc][r.below(4) as usize];
                match r.below(6) {
                    0 => e.fill(addr, n, r.next() as u32),
                    1 => e.dma_copy(addr, va + 1024, n.min(1024)),
                    2 => e.sem_signal(va + 8, 1, rbln_hw::cmd::SEM_OP_ADD),
                    3 => e.fence(r.next(), if r.below(2) == 0 { 0 } else { addr & !7 }, r.below(2) == 0),
                    4 => e.timestamp(addr & !7),
                    _ => e.nop(),
                };
            }
            if e.buf.len() <= 2048 {
                m.write(2048, &e.buf);
                if let Ok(fence) = crate::submit(f, q, va + 2048, e.buf.len() as u32) {
                    seen.fences.push(fence);
                    if r.below(2) == 0 {
                        let _ = crate::wait(f, q, fence, 20_000_000);
                    }
                }
            }
        }
        5..=8 => {
            // mmap a random kind/id/length, sometimes a real one.
            let kind = 1 + r.below(5);
            let id = match (kind, r.below(2)) {
                (1, 0) => seen.handles.last().copied().unwrap_or(1),
                (2..=4, 0) => seen.queues.last().copied().unwrap_or(1),
                _ => r.below(64) as u32,
            };
            let len = [4096usize, 8192, 1 << 20, 3][r.below(4) as usize];
            let prot = [libc::PROT_READ, libc::PROT_READ | libc::PROT_WRITE][r.below(2) as usize];
            let off = uapi::mmap_offset(kind, id) + if r.below(8) == 0 { r.below(1 << 20) & !0xfff } else { 0 };
            // SAFETY: a fresh mapping of our own file (the driver validates
            // everything); unmapped right away after touching one byte.
            unsafe {
                let p = libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, files[fi].as_raw_fd(), off as libc::off_t);
                if p != libc::MAP_FAILED {
                    let _ = std::ptr::read_volatile(p as *const u8);
                    libc::munmap(p, len);
                }
            }
        }
        _ => {
            let f = &files[fi];
            // Structure-aware half the time: real arguments for the
            // commands that build state.
            let nr = r.below(12) as u32;
            let sizes = [0usize, 8, 16, 24, 32, 48, 56, 64, 80, 128];
            let size = if r.below(2) == 0 { uapi_size(nr) } else { sizes[r.below(sizes.len() as u64) as usize] };
            let mut buf = vec![0u8; size.max(8)];
            for (i, b) in buf.iter_mut().enumerate() {
                *b = match r.below(4) {
                    0 => 0,
                    1 => r.below(4) as u8,
                    2 if i % 8 == 1 => 0x10,
                    _ => r.next() as u8,
                };
            }
            let put = |buf: &mut Vec<u8>, at: usize, v: u64, n: usize| {
                if at + n <= buf.len() {
                    buf[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
                }
            };
            if r.below(2) == 0 {
                if let Some(&h) = seen.handles.get(r.below(seen.handles.len() as u64 + 1) as usize) {
                    put(&mut buf, 0, h as u64, 4);
                }
                if let Some(&q) = seen.queues.get(r.below(seen.queues.len() as u64 + 1) as usize) {
                    put(&mut buf, 0, q as u64, 4);
                }
                if let Some(&va) = seen.vas.get(r.below(seen.vas.len() as u64 + 1) as usize) {
                    put(&mut buf, 8, va, 8);
                }
                if let Some(&fe) = seen.fences.last() {
                    put(&mut buf, 8, fe, 8);
                }
            }
            if nr == 0x09 && buf.len() >= 24 {
                // FENCE_WAIT: short timeouts keep the run bounded.
                let t = r.below(2_000_000);
                put(&mut buf, 16, t, 8);
            }
            let cmd = uapi::ioc(3, nr, size);
            // SAFETY: `buf` is at least `size` bytes and lives across the call.
            let rc = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, buf.as_mut_ptr()) };
            if rc >= 0 {
                learn(nr, size, &buf, seen);
            }
        }
    }
}

/// The size the uAPI defines for command `nr` (0 if none).
fn uapi_size(nr: u32) -> usize {
    use std::mem::size_of;
    match nr {
        0x00 => size_of::<uapi::DeviceInfo>(),
        0x01 => size_of::<uapi::BoCreate>(),
        0x02 => size_of::<uapi::BoDestroy>(),
        0x03 => size_of::<uapi::BoInfo>(),
        0x04 => size_of::<uapi::VmMap>(),
        0x05 => size_of::<uapi::VmUnmap>(),
        0x06 => size_of::<uapi::QueueCreate>(),
        0x07 => size_of::<uapi::QueueDestroy>(),
        0x08 => size_of::<uapi::Submit>(),
        0x09 => size_of::<uapi::FenceWait>(),
        0x0a => size_of::<uapi::DeviceStats>(),
        _ => 16,
    }
}

/// Remember what a successful call handed out.
fn learn(nr: u32, size: usize, buf: &[u8], seen: &mut Seen) {
    let u32_at = |at: usize| buf.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4])));
    let u64_at = |at: usize| buf.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    fn keep<T>(v: &mut Vec<T>, x: T) {
        if v.len() >= 16 {
            v.remove(0);
        }
        v.push(x);
    }
    if size != uapi_size(nr) {
        return;
    }
    match nr {
        0x01 => {
            if let Some(h) = u32_at(std::mem::offset_of!(uapi::BoCreate, handle)) {
                keep(&mut seen.handles, h);
            }
        }
        0x04 => {
            if let Some(va) = u64_at(std::mem::offset_of!(uapi::VmMap, va)) {
                keep(&mut seen.vas, va);
            }
        }
        0x06 => {
            if let Some(q) = u32_at(std::mem::offset_of!(uapi::QueueCreate, queue_id)) {
                keep(&mut seen.queues, q);
            }
        }
        0x08 => {
            if let Some(f) = u64_at(std::mem::offset_of!(uapi::Submit, fence)) {
                keep(&mut seen.fences, f);
            }
        }
        _ => {}
    }
}

/// A worker: calls until `budget` is spent, counting into `done`.
fn worker(seed: u64, budget: u64, done: &AtomicU64) -> ! {
    let mut r = Rng(seed | 1);
    let mut files = Vec::new();
    let mut seen = Seen::default();
    for _ in 0..budget {
        one_call(&mut r, &mut files, &mut seen);
        done.fetch_add(1, Ordering::Relaxed);
    }
    std::process::exit(0)
}

pub(crate) fn ioctl_storm() -> Res {
    let total = env_u64("RBLN_FUZZ_CALLS", 20_000);
    let procs = env_u64("RBLN_FUZZ_PROCS", 4).clamp(1, 16);
    let base = crate::faults::debugfs("contexts_open")?;
    // Call counters shared with the workers (they may be killed any time).
    // SAFETY: an anonymous shared mapping of one page, unmapped at the end.
    let page = unsafe {
        libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0)
    };
    if page == libc::MAP_FAILED {
        return Err("mmap of the counters failed".into());
    }
    // SAFETY: the page is zeroed, aligned and big enough for 16 counters.
    let counters: &[AtomicU64] = unsafe { std::slice::from_raw_parts(page as *const AtomicU64, 16) };
    let count = || counters.iter().map(|c| c.load(Ordering::Relaxed)).sum::<u64>();
    let spawn = |slot: usize, seed: u64| -> Result<i32, String> {
        // SAFETY: the child only runs `worker`, which exits.
        match unsafe { libc::fork() } {
            0 => worker(seed, total, &counters[slot]),
            -1 => Err("fork failed".into()),
            pid => Ok(pid),
        }
    };
    let mut r = Rng(0x5707_3a11_d00d_f00d);
    let mut pids: Vec<i32> = (0..procs as usize).map(|i| spawn(i, r.next())).collect::<Result<_, _>>()?;
    let (mut kills, mut respawns) = (0, 0);
    let t0 = Instant::now();
    while count() < total {
        std::thread::sleep(Duration::from_millis(50 + r.below(200)));
        let i = r.below(procs) as usize;
        let mut st = 0;
        // SAFETY: our own children.
        let exited = unsafe { libc::waitpid(pids[i], &mut st, libc::WNOHANG) } == pids[i];
        if !exited && r.below(3) == 0 {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pids[i], libc::SIGKILL);
                libc::waitpid(pids[i], &mut st, 0);
            }
            kills += 1;
        } else if !exited {
            continue;
        } else if libc::WIFSIGNALED(st) || libc::WEXITSTATUS(st) != 0 {
            return Err(format!("a worker died by itself (status {st:#x}): a crash"));
        }
        pids[i] = spawn(i, r.next())?;
        respawns += 1;
        if t0.elapsed() > Duration::from_secs(3600) {
            return Err(format!("only {} calls in an hour", count()));
        }
    }
    for &pid in &pids {
        let mut st = 0;
        // SAFETY: our own children.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, &mut st, 0);
        }
    }
    let calls = count();
    // SAFETY: unmapping the counter page mapped above.
    unsafe { libc::munmap(page, 4096) };
    println!(
        "# {calls} calls from {procs} processes in {:.1} s ({kills} killed mid-run, {respawns} respawned)",
        t0.elapsed().as_secs_f64()
    );
    // Everything the killed processes held comes back.
    let t1 = Instant::now();
    while crate::faults::debugfs("contexts_open")? != base {
        if t1.elapsed() > Duration::from_secs(10) {
            return Err(format!("{} contexts still open after every worker exited", crate::faults::debugfs("contexts_open")?));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if crate::faults::debugfs("bos")? != 0 {
        return Err(format!("{} buffer objects left after every worker exited", crate::faults::debugfs("bos")?));
    }
    crate::submit_and_wait()
}

/// The soak's latency probe (`make soak`): NOP jobs submitted and waited
/// for back to back on a fresh context for `RBLN_SOAK_SECONDS`, with
/// per-minute submit-to-fence latency printed (the mean, from the jobs
/// done in the minute: the guest's clock under TCG is too coarse for
/// single jobs; and the p99); any failed wait fails it (a lost fence).
/// The last line compares the last minute's mean with the first's.
pub(crate) fn latency_probe() -> Res {
    let seconds = env_u64("RBLN_SOAK_SECONDS", 60);
    let env = crate::Env::new()?;
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.nop();
    env.m.write(512, &e.buf);
    let t0 = Instant::now();
    let mut minute = 0;
    let mut window: Vec<u64> = Vec::new();
    let mut p50s = Vec::new();
    let mut total = 0u64;
    let mut window_start = Instant::now();
    let mut report = |minute: u64, w: &mut Vec<u64>, means: &mut Vec<u64>| {
        if w.is_empty() {
            return;
        }
        w.sort_unstable();
        let mean = window_start.elapsed().as_micros() as u64 / w.len() as u64;
        let p99 = w[(w.len() * 99 / 100).min(w.len() - 1)];
        println!("# minute {minute}: {} jobs, mean {mean} us, p99 {p99} us", w.len());
        means.push(mean);
        w.clear();
        window_start = Instant::now();
    };
    while t0.elapsed() < Duration::from_secs(seconds) {
        let t = Instant::now();
        let fence = crate::submit(&env.f, env.q, env.va + 512, e.buf.len() as u32).map_err(|e| format!("job {total}: submit: {e}"))?;
        crate::wait(&env.f, env.q, fence, 10_000_000_000).map_err(|e| format!("job {total}: the fence was lost: {e}"))?;
        window.push(t.elapsed().as_micros() as u64);
        total += 1;
        let m = t0.elapsed().as_secs() / 60;
        if m != minute {
            report(minute, &mut window, &mut p50s);
            minute = m;
        }
    }
    report(minute, &mut window, &mut p50s);
    let (first, last) = (p50s.first().copied().unwrap_or(0), p50s.last().copied().unwrap_or(0));
    println!("# {total} jobs, 0 lost; mean latency first minute {first} us, last minute {last} us");
    Ok(())
}
