//! The threads a compute core's kernels run on.
//!
//! Each command-processor thread is the first worker of its own rayon pool
//! (`RAYON_NUM_THREADS` threads, default one per host CPU). An op's kernel
//! starts at once on the thread that decoded it, and the other workers
//! join in by stealing its split-off halves. On a virtualised host a
//! sleeping thread takes on the order of 100 µs to wake, as long as a
//! small op takes; two things keep that latency off the critical path:
//!
//! - the kernel never waits for a worker to *start* it (it would, were it
//!   handed to a pool from outside), and hands its tasks out one at a time
//!   (`rbln_kernels`' task loop), so a helper that wakes late only takes
//!   what is left and an op too small to be worth the helpers runs as if
//!   sequential;
//! - while a command buffer's ops follow each other, the helpers spin in
//!   the gaps between ops (during an op they take its tasks from rayon's
//!   own loop), and go back to sleep once no op has run for a while
//!   ([`DEFAULT_SPIN`], `rbln-npu --spin-us`). A model's chain of small
//!   ops thus runs on all threads.
//!
//! Waking a sleeping helper is itself a syscall of several microseconds on
//! a virtualised host (measured: the first tiny op after the core went
//! idle took 17 µs when it woke the helpers, 8 µs when it did not; the
//! ones after it 1.2 µs). So the helpers are set spinning only for work
//! worth sharing: after an op of at least [`WAKE_WORK`] nominal FLOPs (or
//! a large DMA; [`Workers::shareable`]), and when a ring entry arrives if
//! the previous one had such work ([`Workers::job_start`], before its
//! first packet, so the helpers wake while the entry starts). A program of
//! tiny ops never pays for a wake. (Work, not elapsed time: a tiny op
//! that was preempted must not set helpers spinning against the guest's
//! vCPU threads on a small host.)
//! (An op that splits its work wakes a sleeping helper through rayon
//! anyway, but a helper woken that late joins after ~100 µs.)
//!
//! Several queues computing at once each bring their own pool; the host
//! scheduler shares the CPUs between them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rbln_kernels::rayon;

/// How long helpers keep spinning after the last op ended, by default.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(1000);

/// An op of at least this many nominal FLOPs (a few microseconds of
/// work or more) sets sleeping helpers spinning for the ops after it.
pub const WAKE_WORK: u64 = 1 << 18;

/// State shared between the command processor and its spinning helpers.
struct Hot {
    epoch: Instant,
    /// An op is running.
    busy: AtomicBool,
    /// When the last op ended (ns since `epoch`).
    last_end_ns: AtomicU64,
    /// Helpers currently spinning.
    spinners: AtomicUsize,
    /// Spin this long after the last op (ns).
    spin_ns: u64,
}

impl Hot {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A spinner returns once an op runs (its helper then takes the op's
    /// tasks from rayon's own loop) or the spin window has passed. Never
    /// spinning while an op runs is what makes a spinner safe to run
    /// nested: a helper that waits inside a stolen task of the op may pick
    /// up a spinner from its broadcast queue, and a spinner that waited for
    /// the op to end there would wait for itself.
    fn stop_spinning(&self) -> bool {
        self.busy.load(Ordering::Acquire) || self.now_ns().saturating_sub(self.last_end_ns.load(Ordering::Acquire)) > self.spin_ns
    }
}

/// One command processor's kernel worker pool.
pub struct Workers {
    pool: Option<rayon::ThreadPool>,
    hot: Arc<Hot>,
    /// This ring entry keeps the helpers spinning between its ops.
    warm: AtomicBool,
    /// This ring entry had work worth sharing (read at the next one's start).
    shared_work: AtomicBool,
}

impl Workers {
    /// Makes the calling thread the first worker of a new pool, until the
    /// returned value is dropped (on the same thread). If that fails the
    /// kernels run on rayon's global pool.
    pub fn join(spin: Duration) -> Self {
        let built = rayon::ThreadPoolBuilder::new()
            .use_current_thread()
            .thread_name(|i| format!("rbln-core-w{i}"))
            .build();
        let pool = match built {
            Ok(pool) => Some(pool),
            Err(e) => {
                log::warn!("kernel worker pool: {e}; using the global pool");
                None
            }
        };
        let hot = Hot {
            epoch: Instant::now(),
            busy: AtomicBool::new(false),
            last_end_ns: AtomicU64::new(0),
            spinners: AtomicUsize::new(0),
            spin_ns: u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX),
        };
        Workers { pool, hot: Arc::new(hot), warm: AtomicBool::new(false), shared_work: AtomicBool::new(false) }
    }

    /// Runs one op's kernel `f` on this (the calling) thread. Returns `f`'s
    /// result and when it ended ([`Workers::now_ns`]).
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> (T, u64) {
        self.hot.busy.store(true, Ordering::Release);
        let r = f();
        let end = self.hot.now_ns();
        self.hot.last_end_ns.store(end, Ordering::Release);
        self.hot.busy.store(false, Ordering::Release);
        // The op ended any spinner: start one for the gap to the next op.
        if self.warm.load(Ordering::Relaxed) {
            self.wake_if_asleep();
        }
        (r, end)
    }

    /// Work worth sharing ran (or is about to): helpers spin from now on,
    /// and are woken when the next ring entry arrives.
    pub fn shareable(&self) {
        self.shared_work.store(true, Ordering::Relaxed);
        self.warm.store(true, Ordering::Relaxed);
        self.wake_if_asleep();
    }

    /// Called when a ring entry starts: sets the helpers spinning if the
    /// previous entry had work worth sharing.
    pub fn job_start(&self) {
        let warm = self.shared_work.swap(false, Ordering::Relaxed);
        self.warm.store(warm, Ordering::Relaxed);
        if warm {
            // Counts as activity: the helpers spin from now on.
            self.hot.last_end_ns.store(self.hot.now_ns(), Ordering::Release);
            self.wake_if_asleep();
        }
    }

    fn wake_if_asleep(&self) {
        let Some(pool) = &self.pool else { return };
        if self.hot.spin_ns > 0 && pool.current_num_threads() > 1 && self.hot.spinners.load(Ordering::Acquire) == 0 {
            self.wake(pool);
        }
    }

    /// Nanoseconds on this pool's clock (the one [`Workers::run`] takes).
    pub fn now_ns(&self) -> u64 {
        self.hot.now_ns()
    }

    /// Starts one spinner per helper, as ordinary jobs of the pool: the
    /// idle helpers take them at once. (Broadcast jobs would also post a
    /// copy to this thread, which runs pool jobs only while it waits inside
    /// an op: one copy per wake would pile up there between big ops.) A
    /// spinner this thread happens to take inside an op returns at once.
    fn wake(&self, pool: &rayon::ThreadPool) {
        let helpers = pool.current_num_threads() - 1;
        self.hot.spinners.fetch_add(helpers, Ordering::AcqRel);
        for _ in 0..helpers {
            let hot = self.hot.clone();
            pool.spawn(move || {
                while !hot.stop_spinning() {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
                hot.spinners.fetch_sub(1, Ordering::AcqRel);
            });
        }
    }
}
