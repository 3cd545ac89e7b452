//! Validation and parallel helpers shared by the kernels.

use crate::error::{KernelError, Result};
use crate::MAX_RANK;
use core::ops::Range;

/// Elements per parallel task for cheap element-wise loops.
pub(crate) const PAR_CHUNK: usize = 1 << 14;

/// Memory-bound element-wise loops over at most this many elements run on
/// the calling thread: waking the pool costs more than it gains.
pub(crate) const SEQ_MAX: usize = 1 << 15;
/// Smallest parallel task of a memory-bound loop, in elements.
const MIN_TASK: usize = 1 << 14;

/// Compute-bound kernels (GEMM, convolution) of fewer floating-point
/// operations run on the calling thread (about 30 µs of work): below it,
/// handing out tasks costs more than a second thread gains. Larger ones
/// share their tasks with the helpers ([`for_each_task`]), which never
/// makes the caller wait for a helper to wake. Measured in the VM
/// (device span of 9 models against onnxruntime, geometric mean of the
/// ratios): 2.53 with a 32 MFLOP threshold and rayon's split-in-halves,
/// 2.02 with this one, dynamic tasks and helpers kept spinning between
/// the ops of a command buffer (`rbln_npu::workers`).
pub(crate) const SEQ_MAX_FLOPS: usize = 1 << 20;

/// Whether a compute-bound kernel of `flops` runs on the calling thread.
pub(crate) fn sequential(flops: usize) -> bool {
    flops < SEQ_MAX_FLOPS
}

/// The threads a kernel plans its tasks for: 1 when `seq`.
pub(crate) fn plan_threads(seq: bool) -> usize {
    if seq {
        1
    } else {
        rayon::current_num_threads().max(1)
    }
}

/// `f(t)` for every task `t < n`: on the calling thread if `seq`, else
/// shared with the pool's other threads.
///
/// The tasks are handed out one at a time from a counter, and the calling
/// thread starts on them at once: a helper that takes long to wake (on a
/// virtualised host, ~100 µs, as long as a small op) only joins in for
/// what is left, and the caller never waits for a helper to *start* on a
/// share set aside for it (as it does when rayon splits a range in halves
/// and the half it pushed is stolen late). At the end the caller waits only
/// for tasks already running, spinning: they are short.
pub(crate) fn for_each_task(n: usize, seq: bool, f: impl Fn(usize) + Sync + Send) {
    use core::sync::atomic::{AtomicUsize, Ordering};
    let helpers = rayon::current_num_threads().saturating_sub(1).min(n.saturating_sub(1));
    if seq || helpers == 0 {
        (0..n).for_each(f);
        return;
    }
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    /// Counts a task as finished even if it panics (rayon re-raises the
    /// panic when the scope ends; the caller must not spin forever first).
    struct Finished<'a>(&'a AtomicUsize);
    impl Drop for Finished<'_> {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Release);
        }
    }
    let work = || loop {
        let t = next.fetch_add(1, Ordering::Relaxed);
        if t >= n {
            break;
        }
        let _done = Finished(&finished);
        f(t);
    };
    rayon::scope(|s| {
        for _ in 0..helpers {
            s.spawn(|_| work());
        }
        work();
        while finished.load(Ordering::Acquire) < n {
            core::hint::spin_loop();
        }
    });
}

/// `f(t)` for every task `t < n`, shared with the calling thread's pool as
/// [`for_each_task`] shares a kernel's tasks (for work outside the kernels,
/// such as the device's large DMA copies).
pub fn parallel_tasks(n: usize, f: impl Fn(usize) + Sync + Send) {
    for_each_task(n, n < 2, f)
}

/// Elements per task of a memory-bound element-wise loop over `len`
/// elements: everything below [`SEQ_MAX`], otherwise many equal tasks per
/// thread (for load balance) of at least [`MIN_TASK`], a multiple of 64.
pub(crate) fn elementwise_chunk(len: usize) -> usize {
    if len <= SEQ_MAX {
        return len.max(1);
    }
    // Many tasks per thread: a thread that gets descheduled (the host is
    // shared) leaves its queue to be stolen.
    let threads = rayon::current_num_threads().max(1);
    let per = len.div_ceil(threads * 16).max(MIN_TASK);
    per.div_ceil(64).saturating_mul(64)
}

/// An op that moves at least this many bytes (inputs + output) writes its
/// output with streaming (non-temporal) stores: its data cannot stay in a
/// last-level cache of this size anyway, and a normal store first reads the
/// line it overwrites (a fourth stream for a binary op; measured +20-30 %
/// for a 16 MiB Add on two threads). Smaller outputs are better left in
/// cache for the op that reads them next.
pub(crate) const STREAM_MIN_BYTES: usize = 32 << 20;

/// `out[j] = f(a[j], b[j])` written with streaming stores where the target
/// has them (x86-64: SSE `movntps`, part of the baseline), the results of
/// each 8-element step going straight from registers to memory. (Computing
/// a block into a buffer and streaming it out afterwards measured no faster
/// than normal stores: the stores must interleave with the loads.) Call
/// [`stream_fence`] on the same thread before the data is handed on.
#[inline(always)]
pub(crate) fn stream_zip(out: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    let n = out.len();
    let (a, b) = (&a[..n], &b[..n]);
    #[cfg(target_arch = "x86_64")]
    if crate::fastmath::has_avx512() {
        // SAFETY: the CPU has AVX-512F (`has_avx512`).
        unsafe { stream_zip_avx512(out, a, b, f) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    stream_steps::<8>(out, a, b, &f, |o, t| {
        use core::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        // SAFETY: `o` holds eight f32 and starts 32-byte aligned
        // (`stream_steps`); `t` holds eight f32.
        unsafe {
            _mm_stream_ps(o.as_mut_ptr(), _mm_loadu_ps(t.as_ptr()));
            _mm_stream_ps(o.as_mut_ptr().add(4), _mm_loadu_ps(t.as_ptr().add(4)));
        }
    });
    #[cfg(not(target_arch = "x86_64"))]
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

/// [`stream_zip`] in 64-byte steps: one streaming store fills a whole
/// cache line (with 16-byte stores the write-combining buffer waits for
/// four), and 16 lanes per instruction. Measured on two threads, a 16 MiB
/// Add: 1.1-1.35 ms with the 16-byte stores, 0.86-0.98 ms in C with these.
///
/// # Safety
/// The CPU has AVX-512F; `a` and `b` are at least `out.len()` long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_zip_avx512(out: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    stream_steps::<16>(out, a, b, &f, |o, t| {
        use core::arch::x86_64::{_mm512_loadu_ps, _mm512_stream_ps};
        // SAFETY: `o` holds sixteen f32 and starts 64-byte aligned
        // (`stream_steps`); `t` holds sixteen f32.
        unsafe { _mm512_stream_ps(o.as_mut_ptr(), _mm512_loadu_ps(t.as_ptr())) };
    });
}

/// The loop of [`stream_zip`]'s variants: normal stores up to a `4·W`-byte
/// boundary of `out` and for the tail; between them steps of `W` results,
/// each computed into an array and handed to `store` with its destination
/// (`W` elements, `4·W`-byte aligned).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn stream_steps<const W: usize>(out: &mut [f32], a: &[f32], b: &[f32], f: &impl Fn(f32, f32) -> f32, store: impl Fn(&mut [f32], &[f32; W])) {
    let n = out.len();
    let head = out.as_ptr().align_offset(4 * W).min(n);
    let body = (n - head) / W * W;
    for j in (0..head).chain(head + body..n) {
        out[j] = f(a[j], b[j]);
    }
    let steps = out[head..head + body]
        .chunks_exact_mut(W)
        .zip(a[head..head + body].chunks_exact(W))
        .zip(b[head..head + body].chunks_exact(W));
    for ((o, x), y) in steps {
        let mut t = [0.0f32; W];
        for i in 0..W {
            t[i] = f(x[i], y[i]);
        }
        store(o, &t);
    }
}

/// Orders this thread's streaming stores before its later stores (x86's
/// non-temporal stores are weakly ordered: without it another thread could
/// see a task finished before its output lands).
#[inline]
pub(crate) fn stream_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no operands and no preconditions.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
}

/// Checked product of `shape`.
pub(crate) fn volume(what: &'static str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or(KernelError::Overflow { what })
}

pub(crate) fn mul(what: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or(KernelError::Overflow { what })
}

pub(crate) fn add(what: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_add(b).ok_or(KernelError::Overflow { what })
}

pub(crate) fn check_len(what: &'static str, actual: usize, expected: usize) -> Result<()> {
    if actual == expected {
        Ok(())
    } else {
        Err(KernelError::LengthMismatch {
            what,
            expected,
            actual,
        })
    }
}

pub(crate) fn check_rank(what: &'static str, shape: &[usize]) -> Result<()> {
    if shape.len() > MAX_RANK {
        Err(KernelError::RankTooLarge {
            what,
            rank: shape.len(),
            max: MAX_RANK,
        })
    } else {
        Ok(())
    }
}

/// ONNX-style axis: `-rank..rank`, negative counts from the end.
pub(crate) fn normalize_axis(axis: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    let a = if axis < 0 { axis.checked_add(r) } else { Some(axis) };
    match a {
        Some(a) if a >= 0 && a < r => Ok(a as usize),
        _ => Err(KernelError::AxisOutOfRange { axis, rank }),
    }
}

/// Splits `shape` around `axis` into (outer, axis length, inner) volumes.
pub(crate) fn split_axis(what: &'static str, shape: &[usize], axis: usize) -> Result<(usize, usize, usize)> {
    Ok((volume(what, &shape[..axis])?, shape[axis], volume(what, &shape[axis + 1..])?))
}

/// Rows per parallel task so that a task covers about `PAR_CHUNK` elements.
pub(crate) fn rows_per_task(row_len: usize) -> usize {
    (PAR_CHUNK / row_len.max(1)).max(1)
}

/// The `t` in `0..count` for which `0 <= base + t * step < limit`.
///
/// Callers guarantee `step >= 1` and that `limit - base` fits in `isize`.
#[inline]
pub(crate) fn valid_range(base: isize, step: usize, count: usize, limit: usize) -> Range<usize> {
    let lo = if base >= 0 {
        0
    } else {
        base.unsigned_abs().div_ceil(step)
    };
    let room = limit as isize - base;
    let hi = if room <= 0 {
        0
    } else {
        (room as usize).div_ceil(step).min(count)
    };
    lo.min(hi)..hi
}

/// Largest scratch buffer kept alive per thread between calls, in elements
/// (4 MiB; conv im2col tiles are ~1 MiB).
const SCRATCH_KEEP: usize = 1 << 20;

std::thread_local! {
    static SCRATCH: core::cell::RefCell<Vec<f32>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's buffer in `key` (kept between calls: no
/// allocation per op), or on a new one if a caller up the stack holds it.
pub(crate) fn with_local<T: Default, R>(key: &'static std::thread::LocalKey<core::cell::RefCell<T>>, f: impl FnOnce(&mut T) -> R) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => f(&mut v),
        Err(_) => f(&mut T::default()),
    })
}

std::thread_local! {
    static BYTES: core::cell::RefCell<Vec<u8>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// `f` on the first `len` bytes of `buf`, grown if needed (and dropped
/// after use when above 16 MiB).
pub(crate) fn sized_bytes<R>(buf: &mut Vec<u8>, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    if buf.len() < len {
        buf.resize(len, 0);
    }
    let r = f(&mut buf[..len]);
    if buf.len() > 16 << 20 {
        *buf = Vec::new();
    }
    r
}

/// Runs `f` on a per-thread byte buffer of `len` bytes (contents
/// unspecified; a nested call gets a temporary one).
pub(crate) fn with_bytes<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    with_local(&BYTES, |buf: &mut Vec<u8>| sized_bytes(buf, len, f))
}

/// Runs `f` on a scratch slice of `len` elements with unspecified contents,
/// reusing a per-thread buffer: no allocation or page faults per task.
/// (A nested call on the same thread, or a request above `SCRATCH_KEEP`,
/// gets a temporary buffer.)
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    if len > SCRATCH_KEEP {
        return f(&mut huge_page_vec(len));
    }
    with_local(&SCRATCH, |buf| sized(buf, len, f))
}

/// `f` on the first `len` elements of `buf`, grown if needed.
fn sized<R>(buf: &mut Vec<f32>, len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    if buf.len() < len {
        *buf = huge_page_vec(len);
    }
    f(&mut buf[..len])
}

/// A zeroed vector of `len` floats whose whole 2 MiB pages are backed by
/// transparent huge pages where the host allows them (asked for before
/// the first touch): the kernels stream megabytes of scratch per op, and
/// every 4 KiB page is otherwise a TLB miss.
pub(crate) fn huge_page_vec(len: usize) -> Vec<f32> {
    const HUGE: usize = 2 << 20;
    let mut v: Vec<f32> = Vec::with_capacity(len);
    #[cfg(target_os = "linux")]
    if len * 4 >= HUGE {
        let start = v.as_mut_ptr() as usize;
        let (lo, hi) = (start.next_multiple_of(HUGE), (start + len * 4) / HUGE * HUGE);
        if hi > lo {
            // SAFETY: [lo, hi) lies inside the allocation just made (and
            // not yet touched); MADV_HUGEPAGE only changes how its pages
            // are backed, never their contents. A refusal (no THP) keeps
            // 4 KiB pages.
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
        }
    }
    v.resize(len, 0.0);
    v
}

/// Largest op-level scratch buffer kept alive per thread (64 MiB).
const OP_SCRATCH_KEEP: usize = 1 << 24;

std::thread_local! {
    static OP_SCRATCH: core::cell::RefCell<Vec<f32>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// [`with_scratch`] for a buffer that a whole op shares between its tasks
/// (e.g. a conv's phase planes), separate from the per-task one so that
/// the tasks this thread runs meanwhile keep theirs.
pub(crate) fn with_op_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    if len > OP_SCRATCH_KEEP {
        return f(&mut huge_page_vec(len));
    }
    with_local(&OP_SCRATCH, |buf| sized(buf, len, f))
}

/// A raw pointer that may be shared between rayon tasks which write
/// provably disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub *mut T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    #[inline(always)]
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

/// Sum with 8 independent accumulators (vectorizes, and is more accurate
/// than a single running sum).
#[inline]
pub(crate) fn sum_f32(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = xs.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] += c[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &r in rem {
        s += r;
    }
    s
}

/// Maximum (NaN-ignoring like `f32::max`), `-inf` for an empty slice.
#[inline]
pub(crate) fn max_f32(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 8];
    let chunks = xs.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] = acc[i].max(c[i]);
        }
    }
    let mut m = acc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for &r in rem {
        m = m.max(r);
    }
    m
}

/// Minimum (NaN-ignoring like `f32::min`), `+inf` for an empty slice.
#[inline]
pub(crate) fn min_f32(xs: &[f32]) -> f32 {
    let mut acc = [f32::INFINITY; 8];
    let chunks = xs.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] = acc[i].min(c[i]);
        }
    }
    let mut m = acc.iter().copied().fold(f32::INFINITY, f32::min);
    for &r in rem {
        m = m.min(r);
    }
    m
}
