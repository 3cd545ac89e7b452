//! int8 GEMM, convolution and (de)quantisation, exact in int32.
//!
//! Products are formed with the cores' 8-bit multiply-add (`maddubs`:
//! u8 × i8 pairs summed into i16, **saturating**), then widened to i32.
//! A (activations) is mapped to u8 (i8 values + 128, zero point + 128);
//! B (weights) is i8 in the packed layout of `rbln_hw::ops::pack_qgemm_b`.
//! Each packed micro-panel of A (4 rows × all of k) picks, at run time,
//! a way of forming its products that cannot saturate:
//! 1. **plain** `maddubs(a, b)` when its `a ≤ 127`, or B is 7-bit (all
//!    `|b| ≤ 64`, from one scan of B per call): pair sums stay within
//!    127·128·2 = 32512 or 255·64·2 = 32640; also when all `a ≥ 128`, on
//!    `a − 128` (plus `128·colsum(B)`);
//! 2. **sign** (any B): `a' = a − 128`, `maddubs(|a'|, b ^ m)` with `m`
//!    the byte mask of `a' < 0` (`!b = −b − 1`, so a per-row `Σ |a'|` over
//!    the negative `a'` is added back), plus `128·colsum(B)`: products lie
//!    in `−128·128 ..= 127·128`, pair sums in `−32768 ..= 32512`.
//!
//! All integer arithmetic wraps (int32). Zero points are folded in after
//! the raw product: `Σ (a − za)(b − zb) = Σ ab − za·colsum_b −
//! zb·rowsum_a + k·za·zb`. Without AVX2 a portable scalar path computes `Σ ab`
//! directly (the same results, bit for bit).
//!
//! Tasks are (image, row block, column block); each packs its row block
//! of A once (im2col for convolutions), then runs 4 × 16 micro-tiles whose
//! requantising epilogue is applied while they are in registers.
//! Convolutions on AVX-512 VNNI take [`vnni`]'s layout instead: 16 output
//! positions per micro-panel, in the lanes of one register; with weights
//! in the tile layout (`rbln_hw::ops::pack_qconv_tiles`) on a host with
//! AMX, [`amx`] multiplies 16 channels × 16 positions per instruction on
//! the same layout.

#[cfg(target_arch = "x86_64")]
mod amx;
mod conv;
pub(crate) mod kernel;
mod quant;
#[cfg(target_arch = "x86_64")]
mod vnni;

pub use conv::{qconv2d, qconv2d_output_shape, QConvParams};
#[cfg(test)]
pub(crate) use conv::qconv2d_impl as conv_impl;
pub use quant::{dequantize, qbinary, quantize, QBinaryKind, QOperand};

use crate::error::{KernelError, Result};
use crate::util::{check_len, for_each_task, mul, plan_threads, sequential, sized_bytes, with_bytes, with_local, SendPtr};
use kernel::{BStats, Cols, OutKind, PanelInfo, TileVals, GROUP_A, MR, NR, PANEL};

/// Largest `k` (reduction length) of [`qgemm`] and [`qconv2d`]: bounds the
/// per-thread packing buffers (a few MiB).
pub const QGEMM_MAX_K: usize = 1 << 20;

/// A tensor of 8-bit integers: bytes plus signedness.
#[derive(Clone, Copy, Debug)]
pub struct QTensor<'a> {
    pub data: &'a [u8],
    /// i8 (two's complement bytes) rather than u8.
    pub signed: bool,
}

/// The output of [`qgemm`] / [`qconv2d`].
pub enum QDst<'a> {
    /// u8 (signed = false) or i8 output bytes:
    /// `clamp(round_half_even(acc·scale[j]) + zero, min, max)` (in f32).
    Int { out: &'a mut [u8], signed: bool, zero: i32, min: i32, max: i32 },
    /// `acc·scale[j]`, `max(0, ·)` with `relu`.
    F32 { out: &'a mut [f32], relu: bool },
}

/// Parameters of [`qgemm`].
pub struct QGemmParams<'a> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Zero point of A, in A's range.
    pub a_zero: i32,
    /// Packed int8 B (`rbln_hw::ops::pack_qgemm_b` layout), bytes:
    /// `qgemm_packed_b_len(k, n)` of them.
    pub b: &'a [u8],
    /// Per-column zero points of B (n entries, each in −128..=127); none = 0.
    pub b_zero: Option<&'a [i32]>,
    /// Per-column int32 bias (n entries).
    pub bias: Option<&'a [i32]>,
    /// Per-column finite scale (n entries).
    pub scale: &'a [f32],
}

/// How B's bytes are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BLayout {
    /// `rbln_hw::ops::pack_qgemm_b`: panels of 8 columns, a group (4 `k`
    /// of the 8 columns) 32 bytes.
    Panels,
    /// `rbln_hw::ops::pack_qconv_tiles` with `taps` taps: blocks of 16
    /// columns, each column's quads of one tap in rows of up to 64 bytes.
    Tiles { taps: usize },
}

impl BLayout {
    /// Bytes of B for `n` columns of `kg` groups.
    pub(crate) fn len(self, kg: usize, n: usize) -> usize {
        match self {
            BLayout::Panels => n.div_ceil(PANEL) * kg * 32,
            BLayout::Tiles { .. } => n.div_ceil(rbln_hw::ops::QTILE_COLS) * kg * 64,
        }
    }
}

/// The range of an 8-bit type.
pub(crate) fn qrange(signed: bool) -> (i32, i32) {
    if signed {
        (-128, 127)
    } else {
        (0, 255)
    }
}

fn check_zero(what: &'static str, z: i32, signed: bool) -> Result<()> {
    let (lo, hi) = qrange(signed);
    if z < lo || z > hi {
        return Err(KernelError::invalid(what, format!("zero point {z} outside {lo}..={hi}")));
    }
    Ok(())
}

/// Validated output: its kind, and the destination pointer.
pub(crate) enum OutPtr {
    U8(SendPtr<u8>),
    F32(SendPtr<f32>),
}

/// Validates `dst` for `len` elements.
fn check_dst(what: &'static str, dst: &mut QDst<'_>, len: usize) -> Result<(OutKind, OutPtr)> {
    match dst {
        QDst::Int { out, signed, zero, min, max } => {
            check_len(what, out.len(), len)?;
            check_zero("qgemm output zero point", *zero, *signed)?;
            let (lo, hi) = qrange(*signed);
            if *min < lo || *max > hi || *min > *max {
                return Err(KernelError::invalid("qgemm output clamp", format!("[{min}, {max}] is not a range within {lo}..={hi}")));
            }
            Ok((OutKind::Int { zero: *zero, min: *min, max: *max }, OutPtr::U8(SendPtr(out.as_mut_ptr()))))
        }
        QDst::F32 { out, relu } => {
            check_len(what, out.len(), len)?;
            Ok((OutKind::F32 { relu: *relu }, OutPtr::F32(SendPtr(out.as_mut_ptr()))))
        }
    }
}

/// Checks the per-column vectors of `n` entries.
fn check_cols(what: &'static str, n: usize, b_zero: Option<&[i32]>, bias: Option<&[i32]>, scale: &[f32]) -> Result<()> {
    check_len(what, scale.len(), n)?;
    if let Some(s) = scale.iter().find(|s| !s.is_finite()) {
        return Err(KernelError::invalid(what, format!("scale {s} is not finite")));
    }
    if let Some(z) = b_zero {
        check_len("qgemm B zero points", z.len(), n)?;
        if let Some(z) = z.iter().find(|z| !(-128..=127).contains(*z)) {
            return Err(KernelError::invalid("qgemm B zero point", format!("{z} outside -128..=127")));
        }
    }
    if let Some(b) = bias {
        check_len("qgemm bias", b.len(), n)?;
    }
    Ok(())
}

/// Bytes of one packed B (`k × n`), checked.
pub(crate) fn packed_b_len(k: usize, n: usize) -> Result<usize> {
    rbln_hw::ops::qgemm_packed_b_len(k as u64, n as u64)
        .and_then(|l| usize::try_from(l).ok())
        .ok_or(KernelError::Overflow { what: "qgemm B size" })
}

/// The per-column epilogue terms of one B (`n` columns, padded to `NR`).
pub(crate) struct ColData {
    pub colsum: Vec<i32>,
    pub cconst: Vec<i32>,
    pub zb: Vec<i32>,
    pub scale: Vec<f32>,
}

impl ColData {
    fn cols(&self) -> Cols<'_> {
        Cols { colsum: &self.colsum, cconst: &self.cconst, zb: &self.zb, scale: &self.scale }
    }
}

/// Scans one packed B (`k × n`, in `layout`) and builds its epilogue
/// terms for A zero point `az` (u8 domain). Returns also its (min, max).
/// The VNNI and AMX cores (the only ones reading tiles) need neither the
/// range nor, for `az = 0`, the column sums: B is then not scanned (read
/// in full, megabytes for a late layer) and the range returned is the
/// full one.
#[allow(clippy::too_many_arguments)]
pub(crate) fn col_data(b: &[u8], k: usize, n: usize, az: i32, b_zero: Option<&[i32]>, bias: Option<&[i32]>, scale: &[f32], isa: kernel::Isa, layout: BLayout) -> (ColData, i8, i8) {
    let np = n.div_ceil(NR) * NR;
    let kg = k.div_ceil(4);
    let mut colsum = vec![0i32; np];
    let (lo, hi) = match layout {
        // The VNNI cores' micro-panels are all plain (no range needed) and
        // a zero point of 0 needs no column sums: B is not read.
        BLayout::Panels if isa.vnni() && az == 0 => (i8::MIN, i8::MAX),
        BLayout::Panels => scan_b_parallel(b, kg, &mut colsum[..n.div_ceil(PANEL) * PANEL], isa.simd()),
        BLayout::Tiles { taps } => {
            if az != 0 {
                scan_tiles(b, kg, taps, &mut colsum[..n]);
            }
            (i8::MIN, i8::MAX)
        }
    };
    let mut zb = vec![0i32; np];
    let mut sc = vec![0f32; np];
    let mut cconst = vec![0i32; np];
    for j in 0..n {
        zb[j] = b_zero.map_or(0, |z| z[j]);
        sc[j] = scale[j];
        cconst[j] = bias
            .map_or(0, |b| b[j])
            .wrapping_add((k as i32).wrapping_mul(az).wrapping_mul(zb[j]))
            .wrapping_sub(az.wrapping_mul(colsum[j]));
    }
    (ColData { colsum, cconst, zb, scale: sc }, lo, hi)
}

/// `f(tap, run, offset in the block, length in quads)` for the runs of
/// one block of the tile layout (`kg` groups, `taps` taps), in order, from
/// `rbln_hw::ops::qconv_tile_run`. Nested loops around a closure, not an
/// iterator: `flat_map`'s `next` was not inlined into the VNNI tile's
/// reduction loop and cost 6 % of a 3×3 int8 conv.
#[inline(always)]
pub(crate) fn for_each_tile_run(kg: usize, taps: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
    let runs = (kg / taps).div_ceil(rbln_hw::ops::QTILE_GROUPS);
    for s in 0..taps {
        for r in 0..runs {
            let (off, len) = rbln_hw::ops::qconv_tile_run(kg, taps, s, r);
            f(s, r, off, len);
        }
    }
}

/// The column sums of B in the tile layout (`kg` groups, `taps` taps;
/// `colsum.len()` columns), in parallel over blocks of columns for large
/// B (the scan reads all of it, as [`scan_b_parallel`]).
fn scan_tiles(b: &[u8], kg: usize, taps: usize, colsum: &mut [i32]) {
    let cols = rbln_hw::ops::QTILE_COLS;
    let blocks = colsum.len().div_ceil(cols);
    let seq = sequential(b.len().saturating_mul(8));
    let per = if seq { blocks } else { blocks.div_ceil(2 * plan_threads(seq)).max(1) };
    let cp = SendPtr(colsum.as_mut_ptr());
    let n = colsum.len();
    for_each_task(blocks.div_ceil(per.max(1)), seq, |t| {
        let (b0, b1) = (t * per, ((t + 1) * per).min(blocks));
        let (j0, j1) = (b0 * cols, (b1 * cols).min(n));
        // SAFETY: columns j0..j1 of colsum belong to this task only.
        let cs = unsafe { core::slice::from_raw_parts_mut(cp.get().add(j0), j1 - j0) };
        for (i, cs) in cs.chunks_mut(cols).enumerate() {
            let block = &b[(b0 + i) * 64 * kg..][..64 * kg];
            scan_tile_block(block, kg, taps, cs);
        }
    });
}

/// One block of the tile layout's column sums (`cs.len() ≤ 16` columns).
fn scan_tile_block(block: &[u8], kg: usize, taps: usize, cs: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if vnni::available() {
        // SAFETY: AVX-512 F/BW and VNNI (checked).
        unsafe { scan_tile_block_vnni(block, kg, taps, cs) };
        return;
    }
    cs.fill(0);
    for_each_tile_run(kg, taps, |_, _, off, len| {
        let run = &block[off..][..64 * len];
        for (c, sum) in cs.iter_mut().enumerate() {
            let row = &run[4 * len * c..][..4 * len];
            *sum = sum.wrapping_add(row.iter().map(|&v| v as i8 as i32).sum::<i32>());
        }
    });
}

/// [`scan_tile_block`] with `vpdpbusd` against ones: each row's bytes
/// summed in 16 lanes, one reduction per column at the end.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn scan_tile_block_vnni(block: &[u8], kg: usize, taps: usize, cs: &mut [i32]) {
    use core::arch::x86_64::*;
    let ones = _mm512_set1_epi8(1);
    let mut acc = [_mm512_setzero_si512(); 16];
    for_each_tile_run(kg, taps, |_, _, off, len| {
        let run = &block[off..][..64 * len];
        let mask = if len == 16 { !0u64 } else { (1u64 << (4 * len)) - 1 };
        for (c, acc) in acc.iter_mut().enumerate() {
            // SAFETY: the row's 4·len bytes lie in `run`; the mask reads
            // no others.
            let row = unsafe { _mm512_maskz_loadu_epi8(mask, run[4 * len * c..].as_ptr() as *const i8) };
            *acc = _mm512_dpbusd_epi32(*acc, ones, row);
        }
    });
    for (sum, acc) in cs.iter_mut().zip(acc) {
        *sum = _mm512_reduce_add_epi32(acc);
    }
}

/// [`kernel::scan_b`] over chunks of panels on the pool's threads: the
/// scan reads all of B (megabytes for a late layer's weights, from memory
/// rather than cache in a model's inference) before the GEMM can start.
fn scan_b_parallel(b: &[u8], kg: usize, colsum: &mut [i32], simd: bool) -> (i8, i8) {
    /// Panels per task (`CHUNK·kg·32` bytes of B).
    const CHUNK: usize = 8;
    let panels = colsum.len() / PANEL;
    let seq = sequential(b.len().saturating_mul(8));
    if seq || panels <= CHUNK || kg == 0 {
        return kernel::scan_b(b, kg, colsum, simd);
    }
    let tasks = panels.div_ceil(CHUNK);
    let mut ranges = vec![(i8::MAX, i8::MIN); tasks];
    let (cp, rp) = (SendPtr(colsum.as_mut_ptr()), SendPtr(ranges.as_mut_ptr()));
    let pb = kg * 32;
    for_each_task(tasks, seq, |t| {
        let (p0, p1) = (t * CHUNK, ((t + 1) * CHUNK).min(panels));
        // SAFETY: panels p0..p1 of colsum and slot t of ranges belong to
        // this task only.
        let (cs, r) = unsafe { (core::slice::from_raw_parts_mut(cp.get().add(p0 * PANEL), (p1 - p0) * PANEL), &mut *rp.get().add(t)) };
        *r = kernel::scan_b(&b[p0 * pb..p1 * pb], kg, cs, simd);
    });
    ranges.iter().fold((i8::MAX, i8::MIN), |(lo, hi), &(l, h)| (lo.min(l), hi.max(h)))
}

/// How the rows and columns of a problem are cut into tasks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Split {
    /// Rows per block (a multiple of MR) and blocks per image.
    pub mc: usize,
    pub nrb: usize,
    /// Columns per block (a multiple of NR) and blocks.
    pub cb: usize,
    pub ncb: usize,
}

/// Bytes of packed A (plain part) a row block holds at most (the kernel
/// walks it k-block by k-block, so it need not fit a cache).
const A_BLOCK: usize = 512 << 10;
/// Most rows per block ([`Core::compute`] keeps per-panel state on the stack).
const MC_MAX: usize = 256;

impl Split {
    /// For micro-panels of `mr` rows (4 or 16, dividing [`MC_MAX`] and 64).
    pub(crate) fn new(images: usize, rows: usize, n: usize, kp: usize, mr: usize, seq: bool) -> Split {
        let threads = plan_threads(seq);
        let want = if seq { 1 } else { 6 * threads };
        let rows_r = rows.div_ceil(mr).max(1) * mr;
        let mut mc = ((A_BLOCK / kp.max(1)).clamp(mr, MC_MAX) / mr * mr).min(rows_r);
        let mut nrb = rows.div_ceil(mc).max(1);
        let npp = n.div_ceil(NR).max(1);
        let mut ncb = 1;
        let tasks = images.saturating_mul(nrb);
        if tasks < want {
            // More blocks of rows first (down to 64 rows), then columns.
            let more = want.div_ceil(tasks);
            let mc2 = (rows.div_ceil(nrb * more).div_ceil(mr) * mr).max(64).min(mc);
            mc = mc2;
            nrb = rows.div_ceil(mc).max(1);
            let tasks = images.saturating_mul(nrb);
            if tasks < want {
                ncb = want.div_ceil(tasks).min(npp);
            }
        }
        let cb = npp.div_ceil(ncb) * NR;
        Split { mc, nrb, cb, ncb: npp.div_ceil(cb / NR) }
    }
}

std::thread_local! {
    static QSCRATCH2: core::cell::RefCell<Vec<u8>> = const { core::cell::RefCell::new(Vec::new()) };
    static QACC: core::cell::RefCell<Vec<[[i32; NR]; MR]>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// A second per-thread byte buffer (for the packing routines' own scratch).
pub(crate) fn with_bytes2<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    with_local(&QSCRATCH2, |buf: &mut Vec<u8>| sized_bytes(buf, len, f))
}

/// What [`drive`] runs on the blocks of packed rows of one image: the
/// micro-panel layout and the kernels that use it.
pub(crate) trait BlockCore: Sync {
    /// Rows per micro-panel (divides 64 and [`MC_MAX`]).
    const MR: usize;
    /// Bytes of one packed micro-panel of `kg` groups of 4 `k`.
    fn panel_len(kg: usize) -> usize;
    /// Finishes the `⌈rows/MR⌉` packed micro-panels of `block` (see
    /// [`Core::prepare`]).
    fn prepare(&self, block: &mut [u8], rows: usize, infos: &mut [PanelInfo]);
    /// Computes rows `0..rows` × columns `c0 .. c0+nc` of a finished
    /// block (see [`Core::compute`]).
    ///
    /// # Safety
    /// As [`Core::compute`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn compute(&self, block: &[u8], infos: &[PanelInfo], rows: usize, c0: usize, nc: usize, out: &OutPtr, out0: usize, rs: usize, cs: usize);
}

impl BlockCore for Core<'_> {
    const MR: usize = MR;
    fn panel_len(kg: usize) -> usize {
        panel_len(kg)
    }
    fn prepare(&self, block: &mut [u8], rows: usize, infos: &mut [PanelInfo]) {
        Core::prepare(self, block, rows, infos)
    }
    unsafe fn compute(&self, block: &[u8], infos: &[PanelInfo], rows: usize, c0: usize, nc: usize, out: &OutPtr, out0: usize, rs: usize, cs: usize) {
        // SAFETY: the caller's contract.
        unsafe { Core::compute(self, block, infos, rows, c0, nc, out, out0, rs, cs) }
    }
}

/// The shared part of a GEMM block run.
#[derive(Clone, Copy)]
pub(crate) struct Core<'a> {
    pub k: usize,
    pub kg: usize,
    pub stats: BStats,
    pub isa: kernel::Isa,
    pub kind: OutKind,
    /// Packed B of this image / group (`n` columns).
    pub b: &'a [u8],
    pub cols: Cols<'a>,
}

/// Bytes of one packed micro-panel (both parts).
pub(crate) fn panel_len(kg: usize) -> usize {
    2 * kg * GROUP_A
}

/// Groups of 4 `k` per k-block: one B micro-tile slice (2 panels ×
/// KB·32 bytes = 8 KiB) stays in L1 while every micro-panel of the block
/// uses it.
const KB: usize = 128;
/// Micro-tiles of raw accumulators a block keeps (64 KiB).
const ACC_TILES: usize = 256;

const INFO0: PanelInfo = PanelInfo { mode: kernel::Mode::Plain, off: 0, rowsum: [0; MR], rowadd: [0; MR] };

impl Core<'_> {
    /// Finishes the `⌈rows/MR⌉` micro-panels of `block` (plain parts
    /// filled, `panel_len(kg)` apart): picks their modes, rewrites them,
    /// and records their [`PanelInfo`]s in `infos`.
    pub(crate) fn prepare(&self, block: &mut [u8], rows: usize, infos: &mut [PanelInfo]) {
        let pl = panel_len(self.kg);
        for (mp, info) in infos.iter_mut().enumerate().take(rows.div_ceil(MR)) {
            let r = (rows - mp * MR).min(MR);
            *info = kernel::finish_panel(&mut block[mp * pl..][..pl], self.kg, self.k, r, self.stats, self.isa);
        }
    }

    /// Computes rows `0..rows` × columns `c0 .. c0+nc` (`c0` a multiple of
    /// NR) of one block of finished micro-panels (`block`, `infos`; see
    /// [`Core::prepare`]), writing element (i, j) at `out + i·rs + j·cs`
    /// (`out` is element (0, 0)).
    ///
    /// # Safety
    /// Every written element lies in the destination and no other task
    /// writes it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn compute(&self, block: &[u8], infos: &[PanelInfo], rows: usize, c0: usize, nc: usize, out: &OutPtr, out0: usize, rs: usize, cs: usize) {
        let kg = self.kg;
        let pl = panel_len(kg);
        let nmp = rows.div_ceil(MR);
        assert!(block.len() >= nmp * pl && infos.len() >= nmp && nmp <= ACC_TILES);
        let panel_bytes = kg * 32;
        let npanels_total = self.b.len() / panel_bytes.max(1);
        let ntiles = nc.div_ceil(NR);
        // Column chunks whose raw accumulators fit ACC_TILES.
        let ct = (ACC_TILES / nmp).max(1);
        let nkb = kg.div_ceil(KB).max(1);
        with_local(&QACC, |accs: &mut Vec<[[i32; NR]; MR]>| {
            if accs.len() < ACC_TILES {
                accs.resize(ACC_TILES, [[0; NR]; MR]);
            }
            let mut t0 = 0;
            while t0 < ntiles {
                let t1 = (t0 + ct).min(ntiles);
                for kb in 0..nkb {
                    let g0 = kb * KB;
                    let gn = KB.min(kg - g0.min(kg));
                    for t in t0..t1 {
                        let j = c0 + t * NR;
                        let p = j / PANEL;
                        let np = if kg == 0 { 1 } else { (npanels_total - p).min(2) };
                        let bptr = self.b[(p * panel_bytes + g0 * 32).min(self.b.len())..].as_ptr();
                        for (mp, info) in infos.iter().enumerate().take(nmp) {
                            let a = &block[mp * pl..][..pl];
                            let acc = &mut accs[(t - t0) * nmp + mp];
                            // SAFETY: groups g0 .. g0+gn of both parts of the
                            // micro-panel lie in `a`; those groups of panels p
                            // and p+1 (if np = 2) of B lie in `b`.
                            unsafe { kernel::micro(a[g0 * GROUP_A..].as_ptr(), a[(kg + g0) * GROUP_A..].as_ptr(), bptr, panel_bytes, np, gn, info.mode, self.isa, kb == 0, acc) };
                        }
                    }
                }
                for t in t0..t1 {
                    let j = c0 + t * NR;
                    let ncols = (c0 + nc - j).min(NR);
                    for (mp, info) in infos.iter().enumerate().take(nmp) {
                        let vals = kernel::epilogue(&accs[(t - t0) * nmp + mp], info, &self.cols, j, self.kind, self.isa.simd());
                        let r = (rows - mp * MR).min(MR);
                        let base = out0 + mp * MR * rs + (j - c0) * cs;
                        // SAFETY: the caller's contract.
                        unsafe { store(&vals, out, base, r, ncols, rs, cs) };
                    }
                }
                t0 = t1;
            }
        })
    }
}

/// Stores rows `< r`, columns `< c` of a tile at `base + i·rs + j·cs`.
///
/// # Safety
/// Those elements lie in the destination (see [`Core::compute`]).
#[inline]
#[allow(clippy::needless_range_loop)] // columns index four rows at once
unsafe fn store(vals: &TileVals, out: &OutPtr, base: usize, r: usize, c: usize, rs: usize, cs: usize) {
    match (vals, out) {
        (TileVals::Int(v), OutPtr::U8(p)) => {
            if rs == 1 && r == MR {
                // Column-major (NCHW): 4 consecutive rows of a column.
                let cols = column_bytes(v);
                for (j, &x) in cols.iter().enumerate().take(c) {
                    // SAFETY: the caller's contract (elements base + j·cs + 0..4).
                    unsafe { (p.get().add(base + j * cs) as *mut u32).write_unaligned(x) };
                }
            } else if cs == 1 && c == NR {
                for (i, row) in v.iter().enumerate().take(r) {
                    let x: [u8; NR] = core::array::from_fn(|j| row[j] as u8);
                    // SAFETY: the caller's contract (elements base + i·rs + 0..16).
                    unsafe { core::ptr::copy_nonoverlapping(x.as_ptr(), p.get().add(base + i * rs), NR) };
                }
            } else {
                for (i, row) in v.iter().enumerate().take(r) {
                    for (j, &x) in row.iter().enumerate().take(c) {
                        // SAFETY: the caller's contract.
                        unsafe { *p.get().add(base + i * rs + j * cs) = x as u8 };
                    }
                }
            }
        }
        (TileVals::F32(v), OutPtr::F32(p)) => {
            if rs == 1 && r == MR {
                for j in 0..c {
                    let x = [v[0][j], v[1][j], v[2][j], v[3][j]];
                    // SAFETY: the caller's contract (elements base + j·cs + 0..4).
                    unsafe { core::ptr::copy_nonoverlapping(x.as_ptr(), p.get().add(base + j * cs), MR) };
                }
            } else {
                for (i, row) in v.iter().enumerate().take(r) {
                    for (j, &x) in row.iter().enumerate().take(c) {
                        // SAFETY: the caller's contract.
                        unsafe { *p.get().add(base + i * rs + j * cs) = x };
                    }
                }
            }
        }
        _ => unreachable!("the tile kind follows the output kind"),
    }
}

/// The low bytes of a tile's values (`x as u8`), column by column: the
/// four rows' bytes of column `j` as one little-endian `u32` (row 0 in the
/// lowest byte). On x86-64 a byte transpose in SSE2 registers (baseline):
/// the scalar form, four loads and shifts per column, took 13 % of a 1×1
/// int8 conv with a 64-long reduction.
#[inline(always)]
fn column_bytes(v: &[[i32; NR]; MR]) -> [u32; NR] {
    const { assert!(MR == 4 && NR == 16) };
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::*;
        let mut out = [0u32; NR];
        // SAFETY: SSE2 is part of the x86-64 baseline; every load reads 16
        // bytes inside a row of `v` (4 × 4 i32 of 16), every store writes
        // 16 bytes inside `out` (4 × 4 u32 of 16).
        unsafe {
            let low = _mm_set1_epi32(0xff);
            // A row's 16 low bytes: masked, so that the saturating packs
            // are exact.
            let row = |i: usize| {
                let p = v[i].as_ptr().cast::<__m128i>();
                let q = |k: usize| _mm_and_si128(_mm_loadu_si128(p.add(k)), low);
                _mm_packus_epi16(_mm_packs_epi32(q(0), q(1)), _mm_packs_epi32(q(2), q(3)))
            };
            let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
            // (r0[j], r1[j]) and (r2[j], r3[j]) byte pairs, then pairs of pairs.
            let (lo01, hi01) = (_mm_unpacklo_epi8(r0, r1), _mm_unpackhi_epi8(r0, r1));
            let (lo23, hi23) = (_mm_unpacklo_epi8(r2, r3), _mm_unpackhi_epi8(r2, r3));
            let o = out.as_mut_ptr().cast::<__m128i>();
            _mm_storeu_si128(o, _mm_unpacklo_epi16(lo01, lo23));
            _mm_storeu_si128(o.add(1), _mm_unpackhi_epi16(lo01, lo23));
            _mm_storeu_si128(o.add(2), _mm_unpacklo_epi16(hi01, hi23));
            _mm_storeu_si128(o.add(3), _mm_unpackhi_epi16(hi01, hi23));
        }
        out
    }
    #[cfg(not(target_arch = "x86_64"))]
    core::array::from_fn(|j| u32::from_le_bytes([v[0][j] as u8, v[1][j] as u8, v[2][j] as u8, v[3][j] as u8]))
}

/// Most bytes of packed A held at once between the two phases of
/// [`drive`] (packing, then the column blocks that share it).
const WAVE: usize = 8 << 20;

static SHARED_A: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

/// Runs a problem of `images` independent products of `rows` rows × `n`
/// columns over `kg` groups of k: `pack(img, r0, rows, block)` fills the
/// plain parts of the `⌈rows/C::MR⌉` micro-panels of `block`
/// (`C::panel_len(kg)` apart) with rows `r0 .. r0+rows` of image `img`;
/// `core(img)` is its [`BlockCore`]; element (row i, column j) of image
/// `img` goes to `place(img) + i·rs + j·cs`.
///
/// # Safety
/// Those elements lie in the destination and are distinct.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn drive<C: BlockCore>(
    images: usize,
    rows: usize,
    n: usize,
    kg: usize,
    seq: bool,
    pack: impl Fn(usize, usize, usize, &mut [u8]) + Sync,
    core: impl Fn(usize) -> C + Sync,
    out: &OutPtr,
    place: impl Fn(usize) -> usize + Sync,
    rs: usize,
    cs: usize,
) {
    let mr = C::MR;
    const { assert!(MC_MAX.is_multiple_of(64)) };
    let sp = Split::new(images, rows, n, kg * 4, mr, seq);
    let pl = C::panel_len(kg);
    let nblocks = images * sp.nrb;
    // (image, first row, rows) of row block `rb`.
    let blk = |rb: usize| {
        let (img, rbi) = (rb / sp.nrb, rb % sp.nrb);
        let r0 = rbi * sp.mc;
        (img, r0, sp.mc.min(rows - r0))
    };
    if sp.ncb == 1 {
        // Pack and use each block in one task (it stays in cache).
        for_each_task(nblocks, seq, |rb| {
            let (img, r0, rows) = blk(rb);
            let nmp = rows.div_ceil(mr);
            with_bytes(nmp * pl, |block| {
                pack(img, r0, rows, block);
                let c = core(img);
                let mut infos = [INFO0; MC_MAX / MR];
                c.prepare(block, rows, &mut infos);
                // SAFETY: the caller's contract; tasks partition the rows.
                unsafe { c.compute(block, &infos, rows, 0, n, out, place(img) + r0 * rs, rs, cs) };
            })
        });
        return;
    }
    // Pack a wave of blocks once, then share each among its column blocks.
    let bbytes = sp.mc.div_ceil(mr) * pl;
    let per_wave = (WAVE / bbytes.max(1)).clamp(1, nblocks);
    let mut shared = core::mem::take(&mut *SHARED_A.lock().unwrap_or_else(|e| e.into_inner()));
    if shared.len() < per_wave * bbytes {
        shared = vec![0u8; per_wave * bbytes];
    }
    let mut infos = vec![INFO0; per_wave * (MC_MAX / MR)];
    let mut w0 = 0;
    while w0 < nblocks {
        let w1 = (w0 + per_wave).min(nblocks);
        let bufp = SendPtr(shared.as_mut_ptr());
        let infp = SendPtr(infos.as_mut_ptr());
        // Fewer blocks than threads (a late layer's few positions: one
        // block): each block is packed in parts of whole micro-panels, so
        // that no thread waits while one packs.
        let parts = if seq { 1 } else { plan_threads(seq).div_ceil(w1 - w0).min(sp.mc / mr).max(1) };
        let part_mp = (sp.mc / mr).div_ceil(parts);
        for_each_task((w1 - w0) * parts, seq, |t| {
            let (i, part) = (t / parts, t % parts);
            let (img, r0, rows) = blk(w0 + i);
            let mp0 = part * part_mp;
            if mp0 * mr >= rows {
                return;
            }
            let sub = (part_mp * mr).min(rows - mp0 * mr);
            let nmp = sub.div_ceil(mr);
            // SAFETY: micro-panels mp0 .. mp0 + nmp of block i (inside it:
            // mp0 + nmp ≤ ⌈rows/MR⌉ ≤ mc/MR) and their infos; the parts
            // of a block cover disjoint micro-panels, blocks are disjoint.
            let (block, inf) = unsafe {
                (
                    core::slice::from_raw_parts_mut(bufp.get().add(i * bbytes + mp0 * pl), nmp * pl),
                    core::slice::from_raw_parts_mut(infp.get().add(i * (MC_MAX / MR) + mp0), nmp),
                )
            };
            pack(img, r0 + mp0 * mr, sub, block);
            core(img).prepare(block, sub, inf);
        });
        let (shared, infos) = (&shared, &infos);
        for_each_task((w1 - w0) * sp.ncb, seq, |t| {
            let (i, cbi) = (t / sp.ncb, t % sp.ncb);
            let (img, r0, rows) = blk(w0 + i);
            let c0 = cbi * sp.cb;
            let nc = sp.cb.min(n - c0);
            let block = &shared[i * bbytes..][..bbytes];
            let inf = &infos[i * (MC_MAX / MR)..][..MC_MAX / MR];
            // SAFETY: the caller's contract; tasks partition rows × columns.
            unsafe { core(img).compute(block, inf, rows, c0, nc, out, place(img) + r0 * rs + c0 * cs, rs, cs) };
        });
        w0 = w1;
    }
    if shared.len() <= WAVE {
        *SHARED_A.lock().unwrap_or_else(|e| e.into_inner()) = shared;
    }
}

/// B statistics for the mode choice.
pub(crate) fn bstats(lo: i8, hi: i8, zero_points: Option<&[i32]>) -> BStats {
    BStats { seven_bit: lo >= -64 && hi <= 64, zero_points: zero_points.is_some_and(|z| z.iter().any(|&z| z != 0)) }
}

/// `out = requant(Σ_l (A[i,l] − a_zero)·(B[l,j] − b_zero[j]) + bias[j])`:
/// int8 GEMM, A `[m × k]` row-major u8 / i8, B packed; see [`QGemmParams`]
/// and [`QDst`]. `out` is `[m × n]` row-major. Runs on the current rayon
/// pool; exact (wrapping int32) on every path.
pub fn qgemm(a: QTensor<'_>, p: &QGemmParams<'_>, mut dst: QDst<'_>) -> Result<()> {
    qgemm_impl(a, p, &mut dst, kernel::Isa::best())
}

pub(crate) fn qgemm_impl(a: QTensor<'_>, p: &QGemmParams<'_>, dst: &mut QDst<'_>, isa: kernel::Isa) -> Result<()> {
    let (m, n, k) = (p.m, p.n, p.k);
    check_len("qgemm A", a.data.len(), mul("qgemm A size", m, k)?)?;
    check_zero("qgemm A zero point", p.a_zero, a.signed)?;
    if k > QGEMM_MAX_K {
        return Err(KernelError::invalid("qgemm k", format!("{k} exceeds the maximum of {QGEMM_MAX_K}")));
    }
    check_len("qgemm B (packed)", p.b.len(), packed_b_len(k, n)?)?;
    check_cols("qgemm scale", n, p.b_zero, p.bias, p.scale)?;
    let (kind, out) = check_dst("qgemm output", dst, mul("qgemm output size", m, n)?)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let xor = if a.signed { 0x80u8 } else { 0 };
    let az = if a.signed { p.a_zero + 128 } else { p.a_zero };
    let (cd, lo, hi) = col_data(p.b, k, n, az, p.b_zero, p.bias, p.scale, isa, BLayout::Panels);
    let kg = k.div_ceil(4);
    let core = Core { k, kg, stats: bstats(lo, hi, p.b_zero), isa, kind, b: p.b, cols: cd.cols() };
    let seq = sequential(m.saturating_mul(n).saturating_mul(k).saturating_mul(2));
    let pack = |_img: usize, r0: usize, rows: usize, block: &mut [u8]| {
        let pl = panel_len(kg);
        for mp in 0..rows.div_ceil(MR) {
            let plain = &mut block[mp * pl..][..kg * GROUP_A];
            for i in 0..MR {
                let r = r0 + mp * MR + i;
                if r < r0 + rows {
                    pack_row(plain, i, &a.data[r * k..][..k], xor);
                } else {
                    for g in plain.chunks_exact_mut(GROUP_A) {
                        g[i * 4..i * 4 + 4].fill(0);
                    }
                }
            }
        }
    };
    // SAFETY: rows × columns of the [m × n] output (length checked).
    unsafe { drive(1, m, n, kg, seq, pack, |_| core, &out, |_| 0, n, 1) };
    Ok(())
}

/// Writes row `src` (`k` bytes, `^ xor`) as row `i` of a micro-panel's
/// plain part, zero-padded to whole groups.
fn pack_row(plain: &mut [u8], i: usize, src: &[u8], xor: u8) {
    let mut chunks = src.chunks_exact(4);
    let x4 = u32::from_ne_bytes([xor; 4]);
    let mut groups = plain.chunks_exact_mut(GROUP_A);
    for (c, g) in (&mut chunks).zip(&mut groups) {
        let v = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]) ^ x4;
        g[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
    }
    let rem = chunks.remainder();
    if let Some(g) = groups.next() {
        let d = &mut g[i * 4..i * 4 + 4];
        d.fill(0);
        for (d, &s) in d.iter_mut().zip(rem) {
            *d = s ^ xor;
        }
    }
}
