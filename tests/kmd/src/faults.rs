//! The driver against a device that misbehaves on purpose: each test arms
//! one fault-injection plan in the device model through the harness's
//! debug control (scripts/vm.sh, docs/reliability.md) and checks that the
//! driver recovers as promised. Run by name, on /dev/rbln0, in a guest
//! whose rbln.ko has hang_ms=500 (tests/vm/faults.sh).

use std::time::{Duration, Instant};

use nix::errno::Errno;

use crate::{expect_err, queue_create, submit, wait, Env, Res};

const SECOND: u64 = 1_000_000_000;

/// Ask the VM harness (scripts/vm.sh) for `cmd` through its request
/// channel `channel` (`ctl-npu0`: the device model's debug control;
/// `hotplug-npu0`: QEMU hot-plug); its `ok ...` reply within `timeout`.
pub(crate) fn harness(channel: &str, cmd: &str, timeout: Duration) -> Result<String, String> {
    let (req, reply) = (format!("/run/rbln/{channel}.req"), format!("/run/rbln/{channel}.reply"));
    let _ = std::fs::remove_file(&reply);
    std::fs::write(format!("{req}.tmp"), cmd).map_err(|e| format!("writing the request: {e}"))?;
    std::fs::rename(format!("{req}.tmp"), &req).map_err(|e| format!("posting the request: {e}"))?;
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if let Ok(text) = std::fs::read_to_string(&reply) {
            let _ = std::fs::remove_file(&reply);
            let text = text.trim().to_string();
            return if text.starts_with("ok") { Ok(text) } else { Err(format!("{channel} '{cmd}': {text}")) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("{channel} '{cmd}': no reply from the harness within {timeout:?}"))
}

/// Send `cmd` to device model 0's debug control; its `ok ...` reply.
fn npu_ctl(cmd: &str) -> Result<String, String> {
    harness("ctl-npu0", cmd, Duration::from_secs(10))
}

/// How many events of `kind` the device model says fired.
fn fired(kind: &str) -> Result<u64, String> {
    let status = npu_ctl("status")?;
    status
        .split_whitespace()
        .find_map(|w| w.strip_prefix(kind)?.strip_prefix('=')?.parse().ok())
        .ok_or_else(|| format!("no count for {kind} in '{status}'"))
}

/// A number from the driver's debugfs `state` (`key: value`).
pub(crate) fn debugfs(key: &str) -> Result<u64, String> {
    let path = "/sys/kernel/debug/rbln0/state";
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(": "))
        .ok_or_else(|| format!("{path} has no '{key}'"))?;
    let value = value.trim();
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    parsed.map_err(|e| format!("{key}: '{value}': {e}"))
}

/// A job of a fresh context completes: the device and driver still serve
/// other users.
fn others_unaffected() -> Res {
    let env = Env::new()?;
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.fill(env.va + 1024, 64, 0x5EED).nop();
    let fence = env.run(0, &e.buf)?;
    wait(&env.f, env.q, fence, 5 * SECOND).map_err(|e| format!("a new context's job: {e}"))?;
    if env.m.read(1024, 4) != 0x5EEDu32.to_le_bytes() {
        return Err("a new context's FILL did not land".into());
    }
    Ok(())
}

/// Run a job that blocks until released; release it after `after` while
/// this thread waits on its fence (so the completion comes during the
/// wait); the wait's outcome and duration.
fn wait_through_release(env: &Env, after: Duration, timeout_ns: u64) -> Result<(Result<(), Errno>, Duration), String> {
    let fence = env.run_blocked()?;
    let t0 = Instant::now();
    // The semaphore `release` writes, as an address a thread can take.
    let semaphore = env.m.ptr as usize + 2048;
    std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(after);
            // SAFETY: the u64 at byte 2048 of the mapped page `env` keeps
            // alive past this scope; what `Env::release` writes.
            unsafe { (semaphore as *mut u64).write_volatile(1) };
        });
        let r = wait(&env.f, env.q, fence, timeout_ns);
        Ok((r, t0.elapsed()))
    })
}

/// Lost fence interrupts: every wait still completes, found by the
/// waiter's periodic check (at most a tick, 100 ms, late).
pub(crate) fn inject_irq_drop() -> Res {
    let (dropped0, polled0) = (fired("irq-drop")?, debugfs("fences_found_by_polling")?);
    npu_ctl("inject irq-drop:count=3")?;
    for round in 0..3 {
        let env = Env::new()?;
        let (r, took) = wait_through_release(&env, Duration::from_millis(200), 5 * SECOND)?;
        r.map_err(|e| format!("round {round}: the wait whose interrupt was dropped: {e}"))?;
        println!("# round {round}: completed {took:?} after submission (released at 200 ms)");
        if took > Duration::from_secs(2) {
            return Err(format!("round {round}: the completion was found only after {took:?}"));
        }
    }
    let (dropped, polled) = (fired("irq-drop")? - dropped0, debugfs("fences_found_by_polling")? - polled0);
    println!("# interrupts dropped by the device: {dropped}; fences found by polling: {polled}");
    if dropped != 3 || polled < 3 {
        return Err(format!("{dropped} interrupts dropped (want 3), {polled} fences found by polling (want >= 3)"));
    }
    others_unaffected()
}

/// A late fence interrupt: the wait completes (by polling or by the late
/// interrupt), and the interrupt arriving after everything is done is
/// harmless.
pub(crate) fn inject_irq_delay() -> Res {
    let delayed0 = fired("irq-delay")?;
    npu_ctl("inject irq-delay:ms=400,count=1")?;
    let env = Env::new()?;
    let (r, took) = wait_through_release(&env, Duration::from_millis(100), 5 * SECOND)?;
    r.map_err(|e| format!("the wait whose interrupt came late: {e}"))?;
    println!("# completed {took:?} after submission (released at 100 ms, interrupt 400 ms late)");
    if fired("irq-delay")? - delayed0 != 1 {
        return Err("the device did not delay the interrupt".into());
    }
    std::thread::sleep(Duration::from_millis(500)); // the late interrupt lands
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.nop();
    for i in 0..20 {
        let f = env.run(512, &e.buf)?;
        wait(&env.f, env.q, f, 5 * SECOND).map_err(|e| format!("job {i} after the late interrupt: {e}"))?;
    }
    if debugfs("faulted_queues")? != 0 || debugfs("poisoned_contexts")? != 0 {
        return Err("a late interrupt left a queue faulted or a context poisoned".into());
    }
    Ok(())
}

/// Interrupts with nothing pending, on every vector, while jobs run: they
/// are counted and ignored; no job or context is disturbed.
pub(crate) fn inject_irq_spurious() -> Res {
    let spurious0 = debugfs("interrupts_spurious")?;
    let env = Env::new()?;
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.nop();
    npu_ctl("inject irq-spurious:count=90")?;
    for i in 0..30 {
        let f = env.run(512, &e.buf)?;
        wait(&env.f, env.q, f, 5 * SECOND).map_err(|e| format!("job {i} among spurious interrupts: {e}"))?;
        if i == 10 {
            npu_ctl("inject irq-spurious:count=90")?;
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let seen = debugfs("interrupts_spurious")? - spurious0;
    println!("# spurious interrupts raised: 180; serviced with nothing pending: {seen}");
    if seen == 0 {
        return Err("the driver saw none of the spurious interrupts".into());
    }
    if debugfs("faulted_queues")? != 0 || debugfs("poisoned_contexts")? != 0 {
        return Err("spurious interrupts left a queue faulted or a context poisoned".into());
    }
    others_unaffected()
}

/// A fault whose error interrupt is lost: the waiter finds the Faulted
/// queue itself and fails the fence with EIO; the context is poisoned,
/// other contexts work.
pub(crate) fn inject_missed_fault() -> Res {
    let missed0 = debugfs("faults_found_by_polling")?;
    npu_ctl("inject irq-drop:count=1")?;
    let env = Env::new()?;
    let mut bad = rbln_hw::cmd::Encoder::new(Vec::new());
    bad.fill(0x7000_0000, 4, 1);
    let fence = env.run(512, &bad.buf)?;
    let t0 = Instant::now();
    expect_err(wait(&env.f, env.q, fence, 20 * SECOND), Errno::EIO, "the fence of a fault whose interrupt was lost")?;
    let took = t0.elapsed();
    println!("# the lost fault was found after {took:?}");
    if took > Duration::from_secs(3) {
        return Err(format!("the lost fault was found only after {took:?}"));
    }
    if debugfs("faults_found_by_polling")? - missed0 != 1 {
        return Err("faults_found_by_polling did not count it".into());
    }
    expect_err(submit(&env.f, env.q, env.va, 4).map(|_| ()), Errno::EIO, "submit in the faulted context")?;
    expect_err(queue_create(&env.f).map(|_| ()), Errno::EIO, "a new queue in the poisoned context")?;
    others_unaffected()
}

/// A corrupt status write-back (impossible head, state and fence) while
/// a job is blocked: the driver does not believe it — the wait does not
/// complete early, a submission still finds ring space — and the real
/// completion is seen.
pub(crate) fn inject_status_corrupt() -> Res {
    let refused0 = debugfs("status_blocks_refused")?;
    let env = Env::new()?;
    // Armed after the queue was enabled (which writes a status block too).
    npu_ctl("inject status-corrupt:count=1")?;
    let fence = env.run_blocked()?;
    // The job's move to Waiting writes the corrupt block.
    expect_err(wait(&env.f, env.q, fence, SECOND / 2), Errno::ETIMEDOUT, "a wait on a blocked job behind a corrupt status block")?;
    if fired("status-corrupt")? == 0 {
        return Err("the device wrote no corrupt status block".into());
    }
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.nop();
    let second = env.run(512, &e.buf).map_err(|e| format!("a submission behind a corrupt status block: {e}"))?;
    env.release();
    wait(&env.f, env.q, fence, 5 * SECOND).map_err(|e| format!("the released job: {e}"))?;
    wait(&env.f, env.q, second, 5 * SECOND).map_err(|e| format!("the job after it: {e}"))?;
    let refused = debugfs("status_blocks_refused")? - refused0;
    println!("# status block reads refused: {refused}");
    if refused == 0 {
        return Err("the corrupt status block was never refused".into());
    }
    others_unaffected()
}

/// A DMA transfer failure: the job fails with EIO, the FILL wrote
/// nothing, the context is poisoned, other contexts work.
pub(crate) fn inject_dma_fail() -> Res {
    npu_ctl("inject dma-fail:count=1")?;
    let env = Env::new()?;
    env.m.write(1024, &[0xAB; 64]);
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.fill(env.va + 1024, 64, 0);
    let fence = env.run(0, &e.buf)?;
    expect_err(wait(&env.f, env.q, fence, 5 * SECOND), Errno::EIO, "the job whose DMA failed")?;
    if env.m.read(1024, 64) != [0xAB; 64] {
        return Err("the failed FILL wrote memory".into());
    }
    if fired("dma-fail")? != 1 {
        return Err("the device failed no transfer".into());
    }
    expect_err(submit(&env.f, env.q, env.va, 4).map(|_| ()), Errno::EIO, "submit after the failed transfer")?;
    others_unaffected()
}

/// A queue that stops making progress: the waiter declares it hung after
/// hang_ms, resets it and fails the fence with EIO; others work.
pub(crate) fn inject_queue_stall() -> Res {
    npu_ctl("inject queue-stall:count=1")?;
    let env = Env::new()?;
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.nop();
    let fence = env.run(512, &e.buf)?;
    let t0 = Instant::now();
    expect_err(wait(&env.f, env.q, fence, 30 * SECOND), Errno::EIO, "the stalled job")?;
    println!("# the stall was declared a hang after {:?}", t0.elapsed());
    if fired("queue-stall")? != 1 {
        return Err("the device stalled no queue".into());
    }
    others_unaffected()
}

/// The device dies in the middle of a job (falls off the bus): the waiter
/// fails with ENODEV within a liveness tick, later calls too. Last: the
/// device is gone afterwards.
pub(crate) fn inject_die() -> Res {
    let env = Env::new()?;
    npu_ctl("inject die:count=1")?;
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.nop();
    let fence = env.run(512, &e.buf)?;
    let t0 = Instant::now();
    expect_err(wait(&env.f, env.q, fence, 30 * SECOND), Errno::ENODEV, "the job the device died in")?;
    let took = t0.elapsed();
    println!("# the dead device was noticed after {took:?}");
    if took > Duration::from_secs(2) {
        return Err(format!("the dead device was noticed only after {took:?}"));
    }
    expect_err(submit(&env.f, env.q, env.va, 4).map(|_| ()), Errno::ENODEV, "submit on the dead device")?;
    if crate::sysfs("health")? != "lost" {
        return Err(format!("health is {}, not lost", crate::sysfs("health")?));
    }
    Ok(())
}
