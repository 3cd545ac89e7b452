//! The tile engine: runs a verified tile program ([`rbln_hw::tile`]) over
//! its grid.
//!
//! Each program instance interprets the program's straight-line code one
//! whole tile at a time: registers are vectors, element-wise ops are
//! loops over them, DOT is the GEMM kernel, loads and stores are
//! bounds-checked gathers and scatters. Instances are independent (as in
//! Triton) and run as tasks on the current rayon pool. A register's
//! vector is dropped after its last use, so an unrolled loop's live set,
//! not its length, sets the memory an instance uses.
//!
//! Buffers the program only reads are plain slices. Buffers it stores to
//! are the caller's staging, shared by all instances as atomics (relaxed:
//! instances are unordered, as Triton's programs are, and a store must not
//! be a data race when two instances write one element). The caller copies
//! them out only when the launch succeeds, so a faulting launch writes
//! nothing.

mod exec;

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};

use rbln_hw::tile::{TileInfo, TileProgram};

pub use exec::run_instance;

/// One buffer of a launch, as the program's element type.
pub enum TileMem<'a> {
    F32(&'a [f32]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    /// Booleans as bytes (0 / non-zero).
    I1(&'a [u8]),
    /// Written buffers (staging): f32 bits or i32.
    W32(&'a [AtomicU32]),
    /// Written i64 buffer.
    W64(&'a [AtomicU64]),
    /// Written i1 buffer.
    W8(&'a [AtomicU8]),
}

impl TileMem<'_> {
    pub fn len(&self) -> usize {
        match self {
            TileMem::F32(s) => s.len(),
            TileMem::I32(s) => s.len(),
            TileMem::I64(s) => s.len(),
            TileMem::I1(s) => s.len(),
            TileMem::W32(s) => s.len(),
            TileMem::W64(s) => s.len(),
            TileMem::W8(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A launch: the verified program, its grid, parameters and buffers.
pub struct TileLaunch<'a> {
    pub program: TileProgram<'a>,
    pub info: TileInfo,
    pub grid: [u32; 3],
    pub params: [u64; 16],
    pub bufs: &'a [TileMem<'a>],
}

/// Why a launch stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TileFault {
    /// An active lane of a load (`write` false) or store reached element
    /// `offset` of buffer `slot`, outside `[0, len)`.
    #[error("tile {} of buffer {slot} at element {offset}, outside the buffer", if *write { "store" } else { "load" })]
    OutOfBounds { slot: usize, offset: i64, write: bool },
    /// The launch does not fit the program (buffer kinds or lengths): a
    /// caller's error, refused before any instance runs.
    #[error("tile launch: {0}")]
    Launch(&'static str),
}

/// Run every instance of the launch (in an unspecified order, possibly
/// concurrently). On a fault, the reported one is that of the lowest
/// faulting instance (x fastest, then y, then z); instances above it may
/// or may not have run.
pub fn run_tile(l: &TileLaunch<'_>) -> Result<(), TileFault> {
    let h = &l.program.header;
    if l.bufs.len() != h.nbufs as usize {
        return Err(TileFault::Launch("buffer count differs from the program's"));
    }
    for (i, b) in l.bufs.iter().enumerate() {
        let stored = l.info.stores & (1 << i) != 0;
        let ok = match (h.buf_types[i], b) {
            (1, TileMem::F32(_)) | (2, TileMem::I32(_)) | (3, TileMem::I64(_)) | (4, TileMem::I1(_)) => !stored,
            (1 | 2, TileMem::W32(_)) | (3, TileMem::W64(_)) | (4, TileMem::W8(_)) => true,
            _ => false,
        };
        if !ok {
            return Err(TileFault::Launch("a buffer's kind does not match the program's type or use"));
        }
    }
    let [gx, gy, gz] = l.grid.map(|g| g as usize);
    let n = gx * gy * gz;
    if n == 0 {
        return Ok(());
    }
    let plan = exec::Plan::new(&l.program);
    // Lowest faulting instance so far (usize::MAX: none) and its fault.
    let first = std::sync::atomic::AtomicUsize::new(usize::MAX);
    let fault = std::sync::Mutex::new(None);
    crate::util::parallel_tasks(n, |t| {
        if t > first.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let pid = [(t % gx) as u32, ((t / gx) % gy) as u32, (t / (gx * gy)) as u32];
        if let Err(e) = run_instance(l, &plan, pid) {
            let mut f = fault.lock().unwrap_or_else(|p| p.into_inner());
            if t < first.load(std::sync::atomic::Ordering::Relaxed) {
                first.store(t, std::sync::atomic::Ordering::Relaxed);
                *f = Some(e);
            }
        }
    });
    match fault.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
