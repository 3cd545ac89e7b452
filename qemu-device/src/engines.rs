//! Shared execution resources (DMA engines, compute cores) and counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

/// A pool of identical engines. A command holds one for its duration, so
/// at most `n` DMAs (or compute ops) run at once across all queues, while
/// DMA and compute never wait for each other.
pub struct EnginePool {
    free: Mutex<Free>,
    cv: Condvar,
    busy_ns: Vec<AtomicU64>,
}

/// The free engines (a bit each) and how many commands wait for one: a
/// release wakes a waiter only when there is one (a wake is a syscall,
/// paid per op otherwise).
struct Free {
    mask: u32,
    waiters: u32,
}

/// A held engine. Its busy time is what the holder reports with
/// [`EngineGuard::finish`] (the command processor already reads the clock
/// once per command; a guard reading it again would double that cost for
/// tiny ops). A guard dropped without it (a faulting command) adds none.
pub struct EngineGuard<'a> {
    pool: &'a EnginePool,
    index: usize,
    /// The engine had to be waited for.
    pub waited: bool,
    busy_ns: u64,
}

impl EnginePool {
    pub fn new(n: u32) -> Self {
        assert!((1..=32).contains(&n), "engine count is validated by Config");
        let free = if n == 32 { u32::MAX } else { (1u32 << n) - 1 };
        Self { free: Mutex::new(Free { mask: free, waiters: 0 }), cv: Condvar::new(), busy_ns: (0..n).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Take a free engine, waiting at most `timeout` for one.
    pub fn acquire_timeout(&self, timeout: std::time::Duration) -> Option<EngineGuard<'_>> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let waited = free.mask == 0;
        if waited {
            free.waiters += 1;
            free = self.cv.wait_timeout(free, timeout).unwrap_or_else(|e| e.into_inner()).0;
            free.waiters -= 1;
            if free.mask == 0 {
                return None;
            }
        }
        let index = free.mask.trailing_zeros() as usize;
        free.mask &= !(1 << index);
        Some(EngineGuard { pool: self, index, waited, busy_ns: 0 })
    }

    pub fn busy_ns(&self, i: usize) -> u64 {
        self.busy_ns.get(i).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    pub fn reset_counters(&self) {
        for c in &self.busy_ns {
            c.store(0, Ordering::Relaxed);
        }
    }
}

impl EngineGuard<'_> {
    /// Release the engine after `busy_ns` of work.
    pub fn finish(mut self, busy_ns: u64) {
        self.busy_ns = busy_ns;
    }
}

impl Drop for EngineGuard<'_> {
    fn drop(&mut self) {
        self.pool.busy_ns[self.index].fetch_add(self.busy_ns, Ordering::Relaxed);
        let mut free = self.pool.free.lock().unwrap_or_else(|e| e.into_inner());
        free.mask |= 1 << self.index;
        if free.waiters > 0 {
            self.pool.cv.notify_one();
        }
    }
}

/// Device-wide counters (BAR0 0x100..).
#[derive(Default)]
pub struct Counters {
    pub packets: AtomicU64,
    pub dma_bytes: AtomicU64,
    pub compute_ops: AtomicU64,
    pub compute_flops: AtomicU64,
    pub faults: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, v: u64) {
        c.fetch_add(v, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    pub fn reset(&self) {
        for c in [&self.packets, &self.dma_bytes, &self.compute_ops, &self.compute_flops, &self.faults] {
            c.store(0, Ordering::Relaxed);
        }
    }
}
