//! `rbln-umd-tests [TEST...]`: the UMD's Rust API end to end against
//! /dev/rbln0, inside the guest (tests/vm/umd.sh). Each test prints
//! "ok - name" or "FAIL - name: why"; measurements are "# ..." lines; the
//! exit status is the number of failures (capped at 100). Intervals are
//! timed with `rbln_umd::clock` (fine-grained even on a jiffies clock).

use std::time::{Duration, Instant};

use rbln_umd::{
    clock, Buffer, CommandBuffer, Device, Error, Fence, Perms, Placement, Queue, SemCond, SemOp, Submit, UserQueue,
};

type Res = Result<(), String>;

const WAIT: Duration = Duration::from_secs(10);

/// `?` for the UMD's errors inside tests: "what: message".
trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T> Ctx<T> for rbln_umd::Result<T> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

fn open() -> Result<Device, String> {
    Device::open(0).ctx("open /dev/rbln0")
}

fn expect<T: std::fmt::Debug>(r: rbln_umd::Result<T>, what: &str, ok: impl Fn(&Error) -> bool) -> Result<Error, String> {
    match r {
        Err(e) if ok(&e) => Ok(e),
        other => Err(format!("{what}: unexpected {other:?}")),
    }
}

/// Deterministic pseudo-random numbers (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

fn info() -> Res {
    let d = open()?;
    let i = d.info();
    if i.vendor_id != rbln_umd::hw::pci::VENDOR_ID || i.device_id != rbln_umd::hw::pci::DEVICE_ID {
        return Err(format!("unexpected identity {i:?}"));
    }
    if i.hw_version.0 != rbln_umd::hw::HW_VERSION_MAJOR || i.num_queues < 16 || i.dram_size == 0 || i.index != 0 {
        return Err(format!("unexpected info {i:?}"));
    }
    if d.query_info().ctx("query_info")? != i {
        return Err("INFO changed between calls".into());
    }
    println!("# info: {i:?}");
    let e = expect(Device::open(9), "open /dev/rbln9", |e| matches!(e, Error::NoDevice { .. }))?;
    if !e.to_string().contains("is rbln.ko loaded?") {
        return Err(format!("unhelpful message: {e}"));
    }
    expect(Device::open_path("/dev/null"), "open /dev/null", |e| matches!(e, Error::NotAnNpu { .. }))?;
    Ok(())
}

fn buffers() -> Res {
    let d = open()?;
    let h = d.alloc(10_000, Placement::Host).ctx("alloc host")?;
    if h.size() != 10_000 || h.placement() != Placement::Host {
        return Err("size/placement".into());
    }
    // Unaligned offsets and lengths go through the word-wise copy's edges.
    let data: Vec<u8> = (0..777u32).map(|i| (i * 7 + 3) as u8).collect();
    h.write_slice(3, &data).ctx("write")?;
    if h.read_vec::<u8>(3, data.len()).ctx("read")? != data {
        return Err("bytes did not read back".into());
    }
    h.write(8192, 0x1122_3344_5566_7788u64).ctx("write u64")?;
    if h.read::<u64>(8192).ctx("read u64")? != 0x1122_3344_5566_7788 {
        return Err("u64 did not read back".into());
    }
    let floats = [1.5f32, -2.25, 3.0];
    h.write_slice(4000, &floats).ctx("write f32")?;
    if h.read_vec::<f32>(4000, 3).ctx("read f32")? != floats {
        return Err("f32 did not read back".into());
    }
    expect(h.write_slice(9_999, &[0u8; 2]), "write past the end", |e| matches!(e, Error::OutOfBounds { .. }))?;
    expect(h.device_va(), "VA of an unmapped buffer", |e| matches!(e, Error::NotMapped { .. }))?;
    let va1 = h.map(Perms::RW).ctx("map rw")?;
    let va2 = h.map(Perms::READ).ctx("map ro")?;
    if va1 == va2 || h.device_va().ctx("device_va")? != va1 {
        return Err(format!("mappings {va1:#x} {va2:#x}"));
    }
    h.unmap(va2).ctx("unmap")?;
    expect(h.unmap(va2), "unmap twice", |e| matches!(e, Error::NotFound { .. }))?;
    let dram = d.alloc(5000, Placement::Dram).ctx("alloc DRAM")?;
    expect(dram.write_slice(0, &[1u32]), "CPU write to DRAM", |e| matches!(e, Error::NotHostVisible))?;
    dram.map(Perms::RW).ctx("map DRAM")?;
    expect(d.alloc(0, Placement::Host), "zero-size buffer", |e| matches!(e, Error::InvalidArgument { .. }))?;
    let e = expect(d.alloc(d.info().dram_size + 4096, Placement::Dram), "more DRAM than exists", |e| {
        matches!(e, Error::NoSpace { .. } | Error::InvalidArgument { .. })
    })?;
    println!("# too much DRAM: {e}");
    expect(Perms::from_bits(4).ok_or(Error::InvalidInput("x".into())), "bad perms", |_| true)?;
    // Dropping frees: many rounds of alloc+map do not run out.
    for _ in 0..200 {
        let b = d.alloc(1 << 20, Placement::Dram).ctx("churn alloc")?;
        b.map(Perms::RW).ctx("churn map")?;
    }
    Ok(())
}

/// Host -> DRAM -> host round trip through `q`, with a fill first.
fn round_trip(d: &Device, q: &mut dyn Submit, rounds: u32) -> Res {
    let host = d.alloc(3 * 4096, Placement::Host).ctx("host")?;
    let dram = d.alloc(4096, Placement::Dram).ctx("dram")?;
    host.map(Perms::RW).ctx("map host")?;
    dram.map(Perms::RW).ctx("map dram")?;
    let mut cb = CommandBuffer::new(d).ctx("cmdbuf")?;
    for i in 0..rounds {
        let pattern: Vec<u32> = (0..256).map(|j| i.wrapping_mul(1000) + j).collect();
        host.write_slice(0, &pattern).ctx("stage")?;
        cb.reset();
        cb.fill(&host, 8192, 1024, 0xdead_beef)
            .ctx("fill")?
            .copy(&host, 0, &dram, 0, 1024)
            .ctx("copy in")?
            .copy(&dram, 0, &host, 4096, 1024)
            .ctx("copy out")?;
        let f = q.submit(&mut cb).ctx("submit")?;
        f.wait(WAIT).ctx("wait")?;
        if host.read_vec::<u32>(4096, 256).ctx("read")? != pattern {
            return Err(format!("round {i}: data came back wrong"));
        }
        if host.read_vec::<u32>(8192, 256).ctx("read fill")?.iter().any(|&v| v != 0xdead_beef) {
            return Err(format!("round {i}: fill missing"));
        }
    }
    Ok(())
}

fn dma_ioctl() -> Res {
    let d = open()?;
    let mut q = d.create_queue(0).ctx("queue")?;
    round_trip(&d, &mut q, 20)
}

fn dma_user() -> Res {
    let d = open()?;
    let mut q = d.create_user_queue(16).ctx("user queue")?;
    round_trip(&d, &mut q, 20)?;
    // Without fence interrupts, Fence::wait polls the status block.
    let mut q = d.create_user_queue(16).ctx("user queue")?;
    q.set_fence_interrupts(false);
    round_trip(&d, &mut q, 20)
}

/// C = A * B on the NPU (staged host -> DRAM, computed in DRAM, copied
/// back), checked against the CPU.
fn gemm_on(d: &Device, q: &mut dyn Submit, m: u32, n: u32, k: u32, seed: u64) -> Result<(f32, Duration, u64), String> {
    let mut rng = Rng(seed);
    let a: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
    let b: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
    let (sa, sb, sc) = (a.len() as u64 * 4, b.len() as u64 * 4, (m * n) as u64 * 4);
    let (oa, ob, oc) = (0, sa.div_ceil(4096) * 4096, (sa.div_ceil(4096) + sb.div_ceil(4096)) * 4096);
    let total = oc + sc.div_ceil(4096) * 4096;
    let host = d.alloc(total + 4096, Placement::Host).ctx("host")?;
    let dram = d.alloc(total, Placement::Dram).ctx("dram")?;
    host.map(Perms::RW).ctx("map host")?;
    dram.map(Perms::RW).ctx("map dram")?;
    host.write_slice(oa, &a).ctx("write A")?;
    host.write_slice(ob, &b).ctx("write B")?;
    let ts = total;
    let mut cb = CommandBuffer::new(d).ctx("cmdbuf")?;
    cb.copy(&host, oa, &dram, oa, sa)
        .ctx("upload A")?
        .copy(&host, ob, &dram, ob, sb)
        .ctx("upload B")?
        .timestamp(&host, ts)
        .ctx("ts0")?
        .gemm(m, n, k, (&dram, oa), (&dram, ob), (&dram, oc))
        .ctx("gemm")?
        .timestamp(&host, ts + 8)
        .ctx("ts1")?
        .copy(&dram, oc, &host, oc, sc)
        .ctx("download C")?;
    let t0 = clock::now();
    let f = q.submit(&mut cb).ctx("submit")?;
    f.wait(WAIT).ctx("wait")?;
    let wall = t0.elapsed();
    let c = host.read_vec::<f32>(oc, (m * n) as usize).ctx("read C")?;
    let mut max_err = 0f32;
    for i in 0..m as usize {
        for j in 0..n as usize {
            let want: f32 = (0..k as usize).map(|l| a[i * k as usize + l] * b[l * n as usize + j]).sum();
            max_err = max_err.max((c[i * n as usize + j] - want).abs());
        }
    }
    let (t_0, t_1) = (host.read::<u64>(ts).ctx("ts0")?, host.read::<u64>(ts + 8).ctx("ts1")?);
    if t_1 < t_0 || t_0 == 0 {
        return Err(format!("timestamps {t_0} {t_1}"));
    }
    Ok((max_err, wall, t_1 - t_0))
}

fn gemm() -> Res {
    let d = open()?;
    let mut kq = d.create_queue(0).ctx("queue")?;
    let mut uq = d.create_user_queue(0).ctx("user queue")?;
    for (name, q, seed) in [("ioctl", &mut kq as &mut dyn Submit, 1), ("user-mode", &mut uq as &mut dyn Submit, 2)] {
        let (err, wall, dev_ns) = gemm_on(&d, q, 64, 80, 48, seed)?;
        println!("# gemm 64x48 * 48x80 ({name} queue): max abs error {err:e}, submit->fence {wall:?}, GEMM on device {dev_ns} ns");
        if err.is_nan() || err > 1e-3 {
            return Err(format!("{name}: max abs error {err}"));
        }
    }
    // A larger one, odd sizes.
    let (err, wall, dev_ns) = gemm_on(&d, &mut uq, 129, 67, 255, 3)?;
    println!("# gemm 129x255 * 255x67: max abs error {err:e}, submit->fence {wall:?}, GEMM on device {dev_ns} ns");
    if err > 1e-3 {
        return Err(format!("129x255x67: max abs error {err}"));
    }
    Ok(())
}

/// A command buffer that blocks the queue until the u64 at `sem` in `buf`
/// is 1.
fn blocker(d: &Device, buf: &Buffer, sem: u64) -> Result<CommandBuffer, String> {
    let mut cb = CommandBuffer::new(d).ctx("cmdbuf")?;
    cb.sem_wait(buf, sem, 1, SemCond::Eq).ctx("sem_wait")?;
    Ok(cb)
}

extern "C" fn on_alarm(_: libc::c_int) {}

/// A signal (handler without SA_RESTART) interrupts a fence wait:
/// Error::Interrupted, and waiting again works.
fn signal_interrupts_wait() -> Res {
    let d = open()?;
    let host = d.alloc(4096, Placement::Host).ctx("host")?;
    host.map(Perms::RW).ctx("map")?;
    host.write(0, 0u64).ctx("clear")?;
    let q = d.create_queue(0).ctx("queue")?;
    let mut cb = blocker(&d, &host, 0)?;
    let f = q.submit_ioctl(&mut cb).ctx("submit")?;
    // SAFETY: installs a handler that does nothing (async-signal-safe) for
    // SIGALRM, then arms a one-shot 100 ms timer; both calls only take
    // pointers to live locals.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as extern "C" fn(libc::c_int) as usize;
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
        let t = libc::itimerval {
            it_interval: libc::timeval { tv_sec: 0, tv_usec: 0 },
            it_value: libc::timeval { tv_sec: 0, tv_usec: 100_000 },
        };
        libc::setitimer(libc::ITIMER_REAL, &t, std::ptr::null_mut());
    }
    let t0 = Instant::now();
    let e = expect(f.wait(Duration::from_secs(8)), "wait interrupted by a signal", |e| matches!(e, Error::Interrupted { .. }))?;
    if t0.elapsed() > Duration::from_secs(4) || !e.to_string().contains("retry") {
        return Err(format!("after {:?}: {e}", t0.elapsed()));
    }
    host.write(0, 1u64).ctx("release")?;
    f.wait(WAIT).ctx("wait after the signal")
}

/// Timeouts, polling and release, on both kinds of queue.
fn fences() -> Res {
    let d = open()?;
    let host = d.alloc(4096, Placement::Host).ctx("host")?;
    host.map(Perms::RW).ctx("map")?;
    let kq = d.create_queue(0).ctx("queue")?;
    let mut uq = d.create_user_queue(0).ctx("user queue")?;
    for (i, name) in ["ioctl", "user-mode"].into_iter().enumerate() {
        let sem = 64 * i as u64;
        host.write(sem, 0u64).ctx("clear sem")?;
        let mut cb = blocker(&d, &host, sem)?;
        let f = if i == 0 { kq.submit_ioctl(&mut cb) } else { uq.submit(&mut cb) }.ctx("submit")?;
        let t0 = Instant::now();
        let e = expect(f.wait(Duration::from_millis(50)), "wait on a blocked job", |e| matches!(e, Error::Timeout { .. }))?;
        if t0.elapsed() < Duration::from_millis(40) {
            return Err(format!("{name}: timed out after only {:?}", t0.elapsed()));
        }
        if !e.to_string().contains("did not signal within 50ms") {
            return Err(format!("message: {e}"));
        }
        expect(f.wait(Duration::ZERO), "zero-timeout wait", |e| matches!(e, Error::Timeout { .. }))?;
        expect(f.spin_wait(Duration::from_millis(20)), "spin on a blocked job", |e| matches!(e, Error::Timeout { .. }))?;
        if f.poll().ctx("poll")? {
            return Err(format!("{name}: a blocked job's fence polled as signalled"));
        }
        // The command buffer is still executing: changing it is refused.
        cb.nop();
        let again = if i == 0 { kq.submit_ioctl(&mut cb) } else { uq.submit(&mut cb) };
        expect(again, "resubmitting a changed, running command buffer", |e| matches!(e, Error::CommandBufferBusy { .. }))?;
        host.write(sem, 1u64).ctx("release")?;
        f.wait(WAIT).ctx("wait after release")?;
        if !f.poll().ctx("poll after")? {
            return Err(format!("{name}: signalled fence polls as pending"));
        }
        f.spin_wait(WAIT).ctx("spin after")?;
        // Now the change is accepted.
        let f2 = if i == 0 { kq.submit_ioctl(&mut cb) } else { uq.submit(&mut cb) }.ctx("resubmit")?;
        f2.wait(WAIT).ctx("wait resubmitted")?;
        if f2.value() != f.value() + 1 || f2.queue_id() != f.queue_id() {
            return Err(format!("{name}: fence {} after {}", f2.value(), f.value()));
        }
    }
    Ok(())
}

/// A user-mode ring of 8 entries holds 3 submissions; the 4th is refused
/// until one completes, and 500 submissions wrap the ring many times.
fn ring_full_and_wrap() -> Res {
    let d = open()?;
    let host = d.alloc(4096, Placement::Host).ctx("host")?;
    host.map(Perms::RW).ctx("map")?;
    let mut q = d.create_user_queue(8).ctx("user queue")?;
    host.write(0, 0u64).ctx("clear")?;
    let mut block = blocker(&d, &host, 0)?;
    let mut nop = CommandBuffer::new(&d).ctx("cmdbuf")?;
    nop.nop();
    let first = q.submit(&mut block).ctx("submit 1")?;
    q.submit(&mut nop).ctx("submit 2")?;
    let third = q.submit(&mut nop).ctx("submit 3")?;
    let e = expect(q.submit(&mut nop), "4th submission into a full ring", |e| matches!(e, Error::Busy { .. }))?;
    println!("# full ring: {e}");
    host.write(0, 1u64).ctx("release")?;
    third.wait(WAIT).ctx("wait 3")?;
    if !first.poll().ctx("poll 1")? {
        return Err("earlier fence not signalled after a later one".into());
    }
    let mut cb = CommandBuffer::new(&d).ctx("cmdbuf")?;
    let mut inflight: std::collections::VecDeque<Fence> = Default::default();
    let mut last = third.value();
    for i in 0..500u32 {
        cb.reset();
        cb.fill(&host, 1024 + 4 * (i as u64 % 64), 4, i).ctx("fill")?;
        // Keep the ring busy: up to 3 in flight.
        if inflight.len() == 3 {
            inflight.pop_front().unwrap().wait(WAIT).ctx("wait oldest")?;
        }
        // The command buffer changes every round; wait for its last run.
        if let Some(f) = cb.last_fence() {
            f.wait(WAIT).ctx("wait cmdbuf")?;
        }
        let f = q.submit(&mut cb).ctx("submit")?;
        if f.value() != last + 1 {
            return Err(format!("fence {} after {last}", f.value()));
        }
        last = f.value();
        inflight.push_back(f);
    }
    for f in inflight {
        f.wait(WAIT).ctx("drain")?;
    }
    let vals = host.read_vec::<u32>(1024, 64).ctx("read")?;
    for (j, v) in vals.iter().enumerate() {
        let want = 499 - ((499 - j as u32) % 64);
        if *v != want {
            return Err(format!("slot {j}: {v}, want {want}"));
        }
    }
    Ok(())
}

/// Timestamps around a 1 MiB DMA; command buffers calling others.
fn timestamps_and_indirect() -> Res {
    let d = open()?;
    let host = d.alloc(4 << 20, Placement::Host).ctx("host")?;
    let dram = d.alloc(2 << 20, Placement::Dram).ctx("dram")?;
    host.map(Perms::RW).ctx("map")?;
    dram.map(Perms::RW).ctx("map dram")?;
    let mut q = d.create_user_queue(0).ctx("queue")?;
    let mut cb = CommandBuffer::new(&d).ctx("cmdbuf")?;
    let ts = 3 << 20;
    cb.timestamp(&host, ts)
        .ctx("ts")?
        .copy(&host, 0, &dram, 0, 1 << 20)
        .ctx("copy")?
        .timestamp(&host, ts + 8)
        .ctx("ts")?
        .copy(&dram, 0, &host, 1 << 20, 1 << 20)
        .ctx("copy back")?
        .timestamp(&host, ts + 16)
        .ctx("ts")?;
    q.submit(&mut cb).ctx("submit")?.wait(WAIT).ctx("wait")?;
    let t: Vec<u64> = host.read_vec(ts, 3).ctx("read ts")?;
    if !(t[0] > 0 && t[0] <= t[1] && t[1] <= t[2]) {
        return Err(format!("timestamps not monotonic: {t:?}"));
    }
    let mib_s = |ns: u64| (1u64 << 20) as f64 / (ns.max(1) as f64 / 1e9) / (1 << 20) as f64;
    println!(
        "# DMA 1 MiB host->DRAM {} ns ({:.0} MiB/s), DRAM->host {} ns ({:.0} MiB/s)",
        t[1] - t[0],
        mib_s(t[1] - t[0]),
        t[2] - t[1],
        mib_s(t[2] - t[1])
    );
    // INDIRECT: the outer buffer calls an inner one twice.
    let mut inner = CommandBuffer::new(&d).ctx("inner")?;
    inner.sem_signal(&host, ts + 64, 5, SemOp::Add).ctx("signal")?;
    let mut outer = CommandBuffer::new(&d).ctx("outer")?;
    host.write(ts + 64, 0u64).ctx("clear")?;
    outer.call(&mut inner).ctx("call")?.nop().call(&mut inner).ctx("call 2")?;
    q.submit(&mut outer).ctx("submit outer")?.wait(WAIT).ctx("wait outer")?;
    let v = host.read::<u64>(ts + 64).ctx("read sem")?;
    if v != 10 {
        return Err(format!("inner buffer ran {} times, not 2", v / 5));
    }
    Ok(())
}

/// A semaphore orders work across queues of different kinds.
fn semaphores_across_queues() -> Res {
    let d = open()?;
    let host = d.alloc(4096, Placement::Host).ctx("host")?;
    host.map(Perms::RW).ctx("map")?;
    host.write(0, 0u64).ctx("clear")?;
    host.write(8, 0u32).ctx("clear")?;
    let mut waiter = d.create_user_queue(0).ctx("user queue")?;
    let signaller = d.create_queue(0).ctx("queue")?;
    let mut a = CommandBuffer::new(&d).ctx("cmdbuf")?;
    a.sem_wait(&host, 0, 7, SemCond::Ge).ctx("wait")?.fill(&host, 8, 4, 42).ctx("fill")?;
    let fa = waiter.submit(&mut a).ctx("submit a")?;
    std::thread::sleep(Duration::from_millis(20));
    if fa.poll().ctx("poll")? || host.read::<u32>(8).ctx("read")? != 0 {
        return Err("the waiting queue ran ahead of its semaphore".into());
    }
    let mut b = CommandBuffer::new(&d).ctx("cmdbuf")?;
    b.sem_signal(&host, 0, 7, SemOp::Set).ctx("signal")?;
    signaller.submit_ioctl(&mut b).ctx("submit b")?.wait(WAIT).ctx("wait b")?;
    fa.wait(WAIT).ctx("wait a")?;
    if host.read::<u32>(8).ctx("read")? != 42 {
        return Err("work after the semaphore did not run".into());
    }
    Ok(())
}

/// One Device, 4 threads, each with its own queue (two of each kind).
fn threads() -> Res {
    let d = open()?;
    let results: Vec<Res> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let d = &d;
                s.spawn(move || -> Res {
                    if t % 2 == 0 {
                        let mut q: UserQueue = d.create_user_queue(0).ctx("user queue")?;
                        round_trip(d, &mut q, 50)
                    } else {
                        let mut q: Queue = d.create_queue(0).ctx("queue")?;
                        round_trip(d, &mut q, 50)
                    }
                    .map_err(|e| format!("thread {t}: {e}"))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into()))).collect()
    });
    results.into_iter().collect::<Result<Vec<()>, String>>()?;
    // A Device clone moved into threads works the same.
    let d2 = d.clone();
    std::thread::spawn(move || -> Res {
        let mut q = d2.create_user_queue(0).ctx("queue")?;
        round_trip(&d2, &mut q, 5)
    })
    .join()
    .map_err(|_| "thread panicked".to_string())??;
    Ok(())
}

/// Hardware queues run out: a clear EBUSY error, and they come back.
fn queue_exhaustion() -> Res {
    let d = open()?;
    let mut qs = Vec::new();
    let e = loop {
        match d.create_queue(4) {
            Ok(q) => qs.push(q),
            Err(e) => break e,
        }
        if qs.len() > 64 {
            return Err("more than 64 queues".into());
        }
    };
    if !matches!(e, Error::Busy { .. }) || !e.to_string().contains("every hardware queue is in use") {
        return Err(format!("after {} queues: {e}", qs.len()));
    }
    println!("# {} queues, then: {e}", qs.len());
    qs.pop();
    d.create_queue(4).ctx("a queue after one was freed")?;
    Ok(())
}

/// A job touching an unmapped VA faults its queue: the fence fails with
/// a fault error, and the context refuses later work (kernel queue).
fn fault_ioctl() -> Res {
    let d = open()?;
    let q = d.create_queue(0).ctx("queue")?;
    let mut cb = CommandBuffer::new(&d).ctx("cmdbuf")?;
    cb.fill_va(0x7000_0000, 4, 1);
    let f = q.submit_ioctl(&mut cb).ctx("submit")?;
    let e = expect(f.wait(WAIT), "fence of a faulting job", |e| matches!(e, Error::Faulted { .. }))?;
    println!("# {e}");
    let m = e.to_string();
    if !m.contains(&format!("queue {} faulted", q.id())) || !m.contains("reopen the device") {
        return Err(format!("message: {m}"));
    }
    if !d.is_poisoned() {
        return Err("the device is not marked poisoned".into());
    }
    let mut nop = CommandBuffer::new(&d).ctx("cmdbuf")?;
    nop.nop();
    expect(q.submit_ioctl(&mut nop), "submit after a fault", |e| matches!(e, Error::Poisoned { .. }))?;
    expect(d.create_queue(0), "a new queue in a poisoned context", |e| matches!(e, Error::Poisoned { .. }))?;
    expect(q.submit_va(nop.device_va(), 4), "raw submit in a poisoned context", |e| matches!(e, Error::Poisoned { .. }))?;
    // A new Device (context) works.
    let d2 = open()?;
    let mut q3 = d2.create_queue(0).ctx("queue in a new context")?;
    round_trip(&d2, &mut q3, 1)
}

/// The same on a user-mode queue, noticed by spinning on the status block.
fn fault_user() -> Res {
    let d = open()?;
    let mut q = d.create_user_queue(0).ctx("user queue")?;
    let mut cb = CommandBuffer::new(&d).ctx("cmdbuf")?;
    cb.dma_copy_va(0x6000_0000, 0x6100_0000, 64);
    let f = q.submit(&mut cb).ctx("submit")?;
    let e = expect(f.spin_wait(WAIT), "spin on a faulting job", |e| matches!(e, Error::Faulted { .. }))?;
    println!("# {e}");
    if let Error::Faulted { fault: Some(info), .. } = &e {
        if ![0x6000_0000, 0x6100_0000].contains(&info.addr) || !info.is_memory_fault() {
            return Err(format!("fault record {info:?}"));
        }
    }
    expect(f.wait(WAIT), "wait on the faulted fence", |e| matches!(e, Error::Faulted { .. }))?;
    let mut nop = CommandBuffer::new(&d).ctx("cmdbuf")?;
    nop.nop();
    expect(q.submit(&mut nop), "user-mode submit after a fault", |e| matches!(e, Error::Poisoned { .. }))?;
    Ok(())
}

/// Dropping a queue abandons its work: its fences report the queue gone.
fn queue_drop() -> Res {
    let d = open()?;
    let host = d.alloc(4096, Placement::Host).ctx("host")?;
    host.map(Perms::RW).ctx("map")?;
    host.write(0, 0u64).ctx("clear")?;
    let mut cb = blocker(&d, &host, 0)?;
    let q = d.create_user_queue(0).ctx("queue")?;
    let mut q = q;
    let f = q.submit(&mut cb).ctx("submit")?;
    drop(q);
    expect(f.wait(WAIT), "fence of a destroyed queue", |e| matches!(e, Error::NotFound { .. }))?;
    expect(f.poll(), "poll of a destroyed queue", |e| matches!(e, Error::NotFound { .. }))?;
    // The command buffer's drop waits for its fence: it returns at once
    // (the queue is gone), and the device context keeps working.
    drop(cb);
    let mut q2 = d.create_queue(0).ctx("queue")?;
    round_trip(&d, &mut q2, 1)
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

/// NOP submit -> fence round trips, each path measured in this run.
fn latency() -> Res {
    const N: usize = 300;
    const WARMUP: usize = 30;
    let d = open()?;
    let mut kq = d.create_queue(0).ctx("queue")?;
    let mut uq = d.create_user_queue(0).ctx("user queue")?;
    let mut uq_noirq = d.create_user_queue(0).ctx("user queue")?;
    uq_noirq.set_fence_interrupts(false);
    let mut nop = CommandBuffer::new(&d).ctx("cmdbuf")?;
    nop.nop();
    #[derive(Clone, Copy)]
    enum Wait {
        Sleep,
        Spin,
    }
    let mut measure = |q: &mut dyn Submit, w: Wait| -> Result<(Duration, Duration, Duration), String> {
        let mut v = Vec::with_capacity(N);
        for i in 0..WARMUP + N {
            let t0 = clock::now();
            let f = q.submit(&mut nop).ctx("submit")?;
            match w {
                Wait::Sleep => f.wait(WAIT),
                Wait::Spin => f.spin_wait(WAIT),
            }
            .ctx("wait")?;
            if i >= WARMUP {
                v.push(t0.elapsed());
            }
        }
        v.sort();
        let mean = v.iter().sum::<Duration>() / v.len() as u32;
        Ok((percentile(&v, 50), percentile(&v, 99), mean))
    };
    let rows = [
        ("user-mode submit + spin on status block", measure(&mut uq, Wait::Spin)?),
        ("user-mode submit (no fence irq) + spin", measure(&mut uq_noirq, Wait::Spin)?),
        ("user-mode submit + FENCE_WAIT ioctl", measure(&mut uq, Wait::Sleep)?),
        ("ioctl SUBMIT + FENCE_WAIT ioctl", measure(&mut kq, Wait::Sleep)?),
        ("ioctl SUBMIT + spin on status block", measure(&mut kq, Wait::Spin)?),
    ];
    println!("# latency: NOP submit->fence round trip, {N} runs each after {WARMUP} warm-up, same boot:");
    for (name, (p50, p99, mean)) in rows {
        println!("#   {name:<42} p50 {:>9.1} us  p99 {:>9.1} us  mean {:>9.1} us", us(p50), us(p99), us(mean));
    }
    let ioctl = rows[3].1;
    for (name, user) in [("user-mode (no fence irq) + spin", rows[1].1), ("user-mode + spin", rows[0].1)] {
        println!(
            "# latency: {name} vs ioctl SUBMIT + FENCE_WAIT: p50 {:.2}x, p99 {:.2}x faster",
            us(ioctl.0) / us(user.0).max(1e-3),
            us(ioctl.1) / us(user.1).max(1e-3)
        );
    }
    Ok(())
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

type Test = fn() -> Res;

const TESTS: &[(&str, Test)] = &[
    ("info", info),
    ("buffers", buffers),
    ("dma_ioctl", dma_ioctl),
    ("dma_user", dma_user),
    ("gemm", gemm),
    ("fences", fences),
    ("signal_interrupts_wait", signal_interrupts_wait),
    ("ring_full_and_wrap", ring_full_and_wrap),
    ("timestamps_and_indirect", timestamps_and_indirect),
    ("semaphores_across_queues", semaphores_across_queues),
    ("threads", threads),
    ("queue_exhaustion", queue_exhaustion),
    ("queue_drop", queue_drop),
    ("fault_ioctl", fault_ioctl),
    ("fault_user", fault_user),
    ("latency", latency),
];

fn main() {
    // Calibrate before anything is timed.
    clock::init();
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    if let Some(w) = wanted.iter().find(|w| !TESTS.iter().any(|(n, _)| n == w)) {
        eprintln!("unknown test {w}; tests: {}", TESTS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(" "));
        std::process::exit(100);
    }
    // Calibrate (if needed) before anything is timed.
    println!("# clock: {}", clock::describe());
    let mut failures = 0;
    for (name, test) in TESTS {
        if !wanted.is_empty() && !wanted.iter().any(|w| w == name) {
            continue;
        }
        let t0 = Instant::now();
        match test() {
            Ok(()) => println!("ok - {name} ({:.2} s)", t0.elapsed().as_secs_f64()),
            Err(e) => {
                println!("FAIL - {name}: {e}");
                failures += 1;
            }
        }
    }
    std::process::exit(failures.min(100));
}
