//! Hot-unplug through QEMU (device_del) while jobs run, then hot-add of a
//! new device without reloading the module. Needs the VM harness's
//! hot-plug support (VM_HOTPLUG=1, tests/vm/hotplug.sh).

use std::time::{Duration, Instant};

use nix::errno::Errno;

use crate::faults::harness;
use crate::{expect_err, submit, wait, Env, Res};

const SECOND: u64 = 1_000_000_000;

/// The /dev/rbln* nodes present.
fn nodes() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev")
        .map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).filter(|n| n.starts_with("rbln")).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Run jobs back to back in a fresh context until one fails; how many
/// completed and the error.
fn stream_jobs() -> Result<(u64, Errno), String> {
    let env = Env::new()?;
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.fill(env.va + 1024, 256, 7).nop();
    env.m.write(0, &e.buf);
    let mut done = 0;
    loop {
        let r = submit(&env.f, env.q, env.va, e.buf.len() as u32).and_then(|f| wait(&env.f, env.q, f, 30 * SECOND));
        match r {
            Ok(()) => done += 1,
            Err(err) => return Ok((done, err)),
        }
    }
}

pub(crate) fn hotplug() -> Res {
    if nodes() != ["rbln0"] {
        return Err(format!("expected one NPU, found {:?}", nodes()));
    }
    let env = Env::new()?;
    let fence = env.run_blocked()?;
    let (f, q) = (env.f.try_clone().map_err(|e| format!("dup: {e}"))?, env.q);
    let waiter = std::thread::spawn(move || wait(&f, q, fence, 120 * SECOND));
    let streamer = std::thread::spawn(stream_jobs);
    std::thread::sleep(Duration::from_millis(500));

    // device_del: the guest's PCIe hot-plug driver asks ours to let go
    // (after the slot's 5 s attention-button grace period).
    let t0 = Instant::now();
    let reply = harness("hotplug-npu0", "del", Duration::from_secs(90))?;
    println!("# device_del completed after {:?}: {reply}", t0.elapsed());
    let r = waiter.join().map_err(|_| "the waiter panicked")?;
    expect_err(r, Errno::ENODEV, "the wait on a job of the removed device")?;
    let (done, err) = streamer.join().map_err(|_| "the streamer panicked")??;
    println!("# the job stream ran {done} jobs, then: {err}");
    if done == 0 || err != Errno::ENODEV {
        return Err(format!("the job stream: {done} jobs, then {err} (want some jobs, then ENODEV)"));
    }
    expect_err(submit(&env.f, env.q, env.va, 4).map(|_| ()), Errno::ENODEV, "submit on the removed device")?;
    if !nodes().is_empty() {
        return Err(format!("device nodes left after the removal: {:?}", nodes()));
    }
    drop(env);

    // device_add of a new device model in the same slot: the driver, still
    // loaded, binds it.
    let reply = harness("hotplug-npu0", "add", Duration::from_secs(60))?;
    println!("# device_add: {reply}");
    let t0 = Instant::now();
    while nodes().is_empty() {
        if t0.elapsed() > Duration::from_secs(60) {
            return Err("no /dev/rbln* within 60 s of device_add".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("# {:?} appeared {:?} after device_add", nodes(), t0.elapsed());
    if nodes() != ["rbln0"] {
        return Err(format!("the new device is {:?}, not rbln0 (the old index was not released)", nodes()));
    }
    let env = Env::new()?;
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.fill(env.va + 1024, 64, 0x0ADD_ED00);
    let fence = env.run(0, &e.buf)?;
    wait(&env.f, env.q, fence, 10 * SECOND).map_err(|e| format!("a job on the hot-added device: {e}"))?;
    if env.m.read(1024, 4) != 0x0ADD_ED00u32.to_le_bytes() {
        return Err("the hot-added device's FILL did not land".into());
    }
    Ok(())
}
