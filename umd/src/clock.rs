//! Wall-clock intervals that stay fine-grained when the kernel's clock is
//! not. Under TCG the guest kernel cannot calibrate the TSC and has no HPET
//! or PM timer, so it runs on `refined-jiffies`: `Instant` moves in 4 ms
//! steps, and under host load ticks get lost, so it also runs slow. Then
//! intervals are measured with the TSC (under TCG it counts at the host's
//! TSC rate), calibrated once per process:
//!
//! - [`init_with_device`]: against the NPU's own clock (TIMESTAMP packets:
//!   the device model's monotonic clock), over about 200 ms, each reading
//!   bracketed by the TSC; accurate to a few parts per thousand;
//! - [`init`] (or the first use): against `Instant`, between two of its
//!   ticks over about 200 ms: as good as the kernel's ticks.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// TSC ticks per nanosecond when the TSC is used, None when `Instant` is
/// fine-grained (or on targets without a TSC).
static TSC_PER_NS: OnceLock<Option<f64>> = OnceLock::new();

/// Steps of `Instant` coarser than this switch to the TSC.
const FINE: Duration = Duration::from_micros(100);
const CALIBRATION: Duration = Duration::from_millis(200);

#[cfg(target_arch = "x86_64")]
fn tsc() -> Option<u64> {
    // SAFETY: RDTSC has no preconditions on x86-64.
    Some(unsafe { core::arch::x86_64::_rdtsc() })
}

#[cfg(not(target_arch = "x86_64"))]
fn tsc() -> Option<u64> {
    None
}

/// Smallest step of `Instant`, over a few samples.
pub fn resolution() -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let a = Instant::now();
        let mut b = Instant::now();
        while b == a {
            b = Instant::now();
        }
        best = best.min(b - a);
    }
    best
}

/// The first `Instant` after the clock's next step, and the TSC there.
fn next_tick() -> (Instant, u64) {
    let a = Instant::now();
    loop {
        let b = Instant::now();
        if b != a {
            return (b, tsc().unwrap_or(0));
        }
    }
}

fn tsc_per_ns() -> Option<f64> {
    *TSC_PER_NS.get_or_init(|| {
        tsc()?;
        if resolution() <= FINE {
            return None;
        }
        let (t0, c0) = next_tick();
        while t0.elapsed() < CALIBRATION {
            std::hint::spin_loop();
        }
        let (t1, c1) = next_tick();
        let _ = METHOD.set("the kernel clock");
        Some((c1 - c0) as f64 / (t1 - t0).as_nanos() as f64)
    })
}

/// How the TSC was calibrated, for [`describe`].
static METHOD: OnceLock<&'static str> = OnceLock::new();

/// Calibrate now (if needed), so that it does not happen inside a timed
/// interval.
pub fn init() {
    let _ = tsc_per_ns();
}

/// Calibrate now (if needed) against the clock of `dev` (falls back to
/// [`init`]'s way if the device cannot be used).
pub fn init_with_device(dev: &crate::Device) {
    if TSC_PER_NS.get().is_some() || tsc().is_none() || resolution() <= FINE {
        init();
        return;
    }
    match device_rate(dev) {
        Some(r) if r.is_finite() && r > 0.0 => {
            if TSC_PER_NS.set(Some(r)).is_ok() {
                let _ = METHOD.set("the device clock");
            }
        }
        _ => init(),
    }
}

/// TSC ticks per device nanosecond: two device TIMESTAMPs ~200 ms apart,
/// each the best-bracketed of a few round trips (its TSC midpoint).
fn device_rate(dev: &crate::Device) -> Option<f64> {
    use crate::{CommandBuffer, Perms, Placement};
    let buf = dev.alloc(4096, Placement::Host).ok()?;
    buf.map(Perms::RW).ok()?;
    let queue = dev.create_queue(0).ok()?;
    let mut cb = CommandBuffer::new(dev).ok()?;
    cb.timestamp(&buf, 0).ok()?;
    let mut sample = || -> Option<(f64, u64)> {
        let mut best: Option<(u64, f64, u64)> = None; // (span, midpoint, device ns)
        for _ in 0..5 {
            let a = tsc()?;
            queue.submit_ioctl(&mut cb).ok()?.wait(Duration::from_secs(5)).ok()?;
            let b = tsc()?;
            let ns = buf.read::<u64>(0).ok()?;
            let mid = a as f64 + (b - a) as f64 / 2.0;
            if best.is_none_or(|(span, _, _)| b - a < span) {
                best = Some((b - a, mid, ns));
            }
        }
        best.map(|(_, mid, ns)| (mid, ns))
    };
    let (c0, d0) = sample()?;
    std::thread::sleep(CALIBRATION);
    let (c1, d1) = sample()?;
    (d1 > d0).then(|| (c1 - c0) / (d1 - d0) as f64)
}

/// How intervals are measured, e.g. "clocksource tsc, resolution 1µs" or
/// "clocksource refined-jiffies has 4ms steps: TSC at 2.873 GHz".
pub fn describe() -> String {
    let src = std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .unwrap_or_default();
    let src = src.trim();
    match tsc_per_ns() {
        None => format!("clocksource {src}, resolution {:?}", resolution()),
        Some(r) => format!(
            "clocksource {src} has {:?} steps: TSC at {r:.3} GHz (calibrated against {})",
            resolution(),
            METHOD.get().copied().unwrap_or("?")
        ),
    }
}

/// A point in time.
#[derive(Clone, Copy, Debug)]
pub struct Stamp(Instant, u64);

pub fn now() -> Stamp {
    Stamp(Instant::now(), tsc().unwrap_or(0))
}

impl Stamp {
    pub fn elapsed(&self) -> Duration {
        match (tsc_per_ns(), tsc()) {
            (Some(r), Some(now)) => Duration::from_nanos((now.wrapping_sub(self.1) as f64 / r) as u64),
            _ => self.0.elapsed(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn intervals_are_measured() {
        super::init();
        let t = super::now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let e = t.elapsed();
        assert!(e >= std::time::Duration::from_millis(15) && e < std::time::Duration::from_secs(5), "{e:?}");
        assert!(super::describe().contains("clocksource"));
    }
}
