//! The int8 convolution core on AVX-512 VNNI: output positions in the
//! vector lanes.
//!
//! A micro-panel holds [`MR`] = 16 rows (output positions) of A, mapped to
//! u8 as in [`super::kernel`], for all `kg = ⌈k/4⌉` groups of 4 `k`: group
//! `g` is 64 bytes, row `i` at bytes `4i .. 4i+4`, so one load is the 16
//! rows' quadruples. A packed B panel's group (8 columns × 4 `k`, 32
//! bytes) gives 8 broadcasts, one per column. A micro-tile is up to three
//! micro-panels (48 rows) × one panel (8 columns): 24 accumulators, and per
//! group 3 loads of A and 8 broadcasts of B for 24 `vpdpbusd` (the
//! instruction's two ports, not the loads, are the limit). The 4 × 16
//! tile of [`super::kernel`] needed 6 loads (and a shuffle joining two
//! panels) per 4 `vpdpbusd`.
//!
//! `vpdpbusd` is exact for any u8 × i8 (sums of four products in i32), so
//! every micro-panel is plain: no modes, no rewriting. The rows' sums of A
//! (for weights with zero points) come from one more `vpdpbusd` against
//! ones per load of A. Each column's 16 results are consecutive in an NCHW
//! output (rows are positions): one 16-byte (or 64-byte) store each, no
//! transpose.
//!
//! [`Core::tiles`] takes its vectors of A anywhere: the packed
//! micro-panels of [`super::drive`] (group g of vector v at `v·pl + 64g`)
//! or, for weights in channel quads, a convolution's rewritten stage
//! (`super::conv`'s implicit path: group g at a per-group offset, vectors
//! 64 bytes apart), each vector's results stored as up to four runs of
//! output positions ([`Seg`]).

use core::arch::x86_64::*;

use super::kernel::{Cols, OutKind, PanelInfo, PANEL};
use super::{BLayout, BlockCore, OutPtr};

/// Rows per micro-panel: one zmm of u8 quadruples.
pub(crate) const MR: usize = super::kernel::VNNI_MR;
/// Bytes of one group (4 `k`) of a micro-panel.
pub(crate) const GROUP: usize = MR * 4;
/// Micro-panels per micro-tile at most.
const TILE_PANELS: usize = 3;

/// Whether this CPU runs the VNNI core (AVX-512 F/BW/VL and VNNI, and
/// AVX-512 allowed; see `fastmath::has_avx512`).
pub(crate) fn available() -> bool {
    crate::fastmath::has_avx512() && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// One image's (or group's) B and epilogue terms.
#[derive(Clone, Copy)]
pub(crate) struct Core<'a> {
    pub kg: usize,
    /// Some column has a non-zero zero point: the epilogue subtracts
    /// `zb[j]·rowsum[i]`.
    pub zero_points: bool,
    pub kind: OutKind,
    /// B of this image's columns, in `layout`.
    pub b: &'a [u8],
    pub layout: BLayout,
    /// Run [`super::amx`]'s core where it applies (weights in tiles).
    pub amx: bool,
    pub cols: Cols<'a>,
}

/// Columns per block of the tile layout.
pub(crate) const TILE_COLS: usize = rbln_hw::ops::QTILE_COLS;
/// Quads per run of the tile layout.
pub(crate) const TILE_RUN: usize = rbln_hw::ops::QTILE_GROUPS;

impl BlockCore for Core<'_> {
    const MR: usize = MR;

    fn panel_len(kg: usize) -> usize {
        kg * GROUP
    }

    fn prepare(&self, _block: &mut [u8], _rows: usize, _infos: &mut [PanelInfo]) {}

    unsafe fn compute(&self, block: &[u8], _infos: &[PanelInfo], rows: usize, c0: usize, nc: usize, out: &OutPtr, out0: usize, rs: usize, cs: usize) {
        let kg = self.kg;
        let pl = kg * GROUP;
        let nmp = rows.div_ceil(MR);
        // Rows are output positions of an NCHW convolution: consecutive.
        assert!(rs == 1 && block.len() >= nmp * pl);
        // Micro-panel v's rows r0 .. r0+16 (the real ones) at out0 + r0.
        let segs: smallvec::SmallVec<[Seg; 64]> = (0..nmp).map(|v| Seg::run(v * MR, (rows - v * MR).min(MR))).collect();
        let at = |g: usize| g * GROUP;
        let taps = match self.layout {
            BLayout::Tiles { taps } => taps,
            BLayout::Panels => 1,
        };
        // SAFETY: micro-panel v, group g at block + v·pl + g·64, inside
        // `block` (asserted); a tap's consecutive quads are `taps` groups
        // apart; the rest is the caller's contract.
        unsafe { self.tiles(block.as_ptr(), pl, nmp, &at, taps * GROUP, &segs, c0, nc, out, out0, cs) }
    }
}

/// The lanes of one vector of results that are stored, as runs of
/// consecutive output elements: `mask` (bit i: lane i) and the element
/// offset of lane 0 (`lane i → base + i`; the base of a run that starts
/// at a later lane may lie before the destination's start, lanes outside
/// the mask are never touched). At most four runs (a vector of 16 virtual
/// positions over rows of at least 5).
#[derive(Clone, Copy, Default)]
pub(crate) struct Seg {
    runs: [(u16, isize); 4],
    n: u8,
}

impl Seg {
    /// Lanes `0..len` to elements `base ..`.
    fn run(base: usize, len: usize) -> Seg {
        let mut s = Seg::default();
        if len > 0 {
            s.runs[0] = (if len >= MR { !0 } else { (1u16 << len) - 1 }, base as isize);
            s.n = 1;
        }
        s
    }

    /// Adds a run: lanes of `mask` to elements `base + lane`.
    pub(crate) fn push(&mut self, mask: u16, base: isize) {
        let n = self.n as usize;
        assert!(n < self.runs.len(), "a vector spans at most four runs");
        self.runs[n] = (mask, base);
        self.n += 1;
    }

    fn runs(&self) -> &[(u16, isize)] {
        &self.runs[..self.n as usize]
    }
}

impl Core<'_> {
    /// Runs the micro-tiles of `nvec` vectors of 16 rows: vector v of
    /// reduction group g is the 64 bytes at `a + v·vstride + at(g)`; its
    /// results go to `out0 + (j − c0)·cs + segs[v]` for the columns `c0 ..
    /// c0+nc` (`c0` a multiple of [`PANEL`]). With weights in tiles, quad
    /// `q` and `q + 1` of a tap lie `quad_stride` bytes apart in every
    /// vector (`at(g + taps) = at(g) + quad_stride`), which [`super::amx`]
    /// needs (it loads a run of 16 quads as one tile).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL and VNNI available ([`available`]), AMX too with
    /// `self.amx` ([`super::amx::available`]); every vector's 64 bytes for
    /// every group are readable; the stored elements lie in the
    /// destination and no other task writes them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn tiles(&self, a: *const u8, vstride: usize, nvec: usize, at: &impl Fn(usize) -> usize, quad_stride: usize, segs: &[Seg], c0: usize, nc: usize, out: &OutPtr, out0: usize, cs: usize) {
        let kg = self.kg;
        assert!(c0.is_multiple_of(PANEL) && segs.len() >= nvec);
        assert!(self.b.len() >= self.layout.len(kg, c0 + nc) && self.cols.scale.len() >= c0 + nc);
        let dst = Dst { out, out0, cs };
        if let BLayout::Tiles { taps } = self.layout {
            assert!(taps > 0 && kg.is_multiple_of(taps));
            if self.amx && !self.zero_points && kg / taps >= TILE_RUN && c0.is_multiple_of(TILE_COLS) {
                // SAFETY: the caller's contract, AMX's conditions checked.
                unsafe { super::amx::tiles(self, taps, a, vstride, nvec, at, quad_stride, segs, c0, nc, &dst) };
                return;
            }
        }
        // Panel by panel (8 columns; half a block of the tile layout): its
        // B (kg·32 bytes) stays in L1 while the block's vectors stream
        // past it.
        for p in c0 / PANEL..(c0 + nc).div_ceil(PANEL) {
            let j0 = p * PANEL;
            let cols = (c0 + nc - j0).min(PANEL);
            let b = match self.layout {
                BLayout::Panels => self.b[p * kg * 32..].as_ptr(),
                BLayout::Tiles { .. } => self.b[j0 / TILE_COLS * kg * 64..].as_ptr(),
            };
            let mut v = 0;
            while v < nvec {
                let nv = (nvec - v).min(TILE_PANELS);
                let t = Tile { a: a.wrapping_add(v * vstride), vstride, b, half: j0 % TILE_COLS / PANEL, kg, j0, jl: j0 - c0, cols };
                let segs = &segs[v..v + nv];
                // SAFETY: the caller's contract; panel p of B lies in `b`
                // (asserted above).
                unsafe {
                    match (nv, self.zero_points) {
                        (3, false) => tile::<3, false>(&t, at, segs, self, &dst),
                        (3, true) => tile::<3, true>(&t, at, segs, self, &dst),
                        (2, false) => tile::<2, false>(&t, at, segs, self, &dst),
                        (2, true) => tile::<2, true>(&t, at, segs, self, &dst),
                        (_, false) => tile::<1, false>(&t, at, segs, self, &dst),
                        (_, true) => tile::<1, true>(&t, at, segs, self, &dst),
                    }
                }
                v += nv;
            }
        }
    }
}

/// Where a block's results go: column j's element at `out0 + (j − c0)·cs`
/// plus its vector's [`Seg`] offsets.
pub(crate) struct Dst<'a> {
    out: &'a OutPtr,
    out0: usize,
    cs: usize,
}

/// One micro-tile: vectors at `a` (`vstride` bytes apart), B panel at `b`
/// (columns `j0 .. j0+cols` of the image, `jl ..` of the block; with
/// weights in tiles `b` is the block and `half` which 8 of its columns).
struct Tile {
    a: *const u8,
    vstride: usize,
    b: *const u8,
    half: usize,
    kg: usize,
    j0: usize,
    jl: usize,
    cols: usize,
}

/// Computes and stores one micro-tile of `NV` vectors; `ZP`: with the
/// rows' sums of A.
///
/// # Safety
/// AVX-512 F/BW/VL and VNNI available; for every group g, `NV` vectors of
/// 64 bytes readable at `t.a + at(g)` (`t.vstride` apart), and `t.kg·32`
/// bytes at `t.b`; the elements stored lie in the destination and no other
/// task writes them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const NV: usize, const ZP: bool>(t: &Tile, at: &impl Fn(usize) -> usize, segs: &[Seg], core: &Core<'_>, d: &Dst<'_>) {
    let mut acc = [[_mm512_setzero_si512(); NV]; PANEL];
    let mut rsum = [_mm512_setzero_si512(); NV];
    let ones = _mm512_set1_epi8(1);
    // One group: vectors at `ag`, column c's 4 bytes at `bg + c·cstr`.
    macro_rules! group {
        ($ag:expr, $bg:expr, $cstr:expr) => {{
            let ag: *const u8 = $ag;
            // SAFETY: the group's vectors (caller).
            let av: [__m512i; NV] = core::array::from_fn(|v| unsafe { _mm512_loadu_si512(ag.wrapping_add(v * t.vstride) as *const __m512i) });
            if ZP {
                for v in 0..NV {
                    rsum[v] = _mm512_dpbusd_epi32(rsum[v], av[v], ones);
                }
            }
            for (c, acc) in acc.iter_mut().enumerate() {
                // SAFETY: column c's 4 bytes of the group: panel p's group
                // g, or this half's row c of the run (caller).
                let bc = _mm512_set1_epi32(unsafe { ($bg as *const u8).add(c * $cstr).cast::<i32>().read_unaligned() });
                for v in 0..NV {
                    acc[v] = _mm512_dpbusd_epi32(acc[v], av[v], bc);
                }
            }
        }};
    }
    match core.layout {
        BLayout::Panels => {
            for g in 0..t.kg {
                group!(t.a.wrapping_add(at(g)), t.b.wrapping_add(g * 32), 4);
            }
        }
        BLayout::Tiles { taps } => {
            // Tap by tap, run by run: quad q of tap s is group q·taps + s;
            // a run's rows are 4·len bytes, this half's 8 rows after the
            // other's.
            super::for_each_tile_run(t.kg, taps, |s, r, off, len| {
                let cstr = 4 * len;
                let run = t.b.wrapping_add(off + PANEL * t.half * cstr);
                for i in 0..len {
                    let g = (r * TILE_RUN + i) * taps + s;
                    group!(t.a.wrapping_add(at(g)), run.wrapping_add(4 * i), cstr);
                }
            });
        }
    }
    // The accumulators leave their registers through memory: indexed by
    // a run-time column count below, they would otherwise be kept in
    // memory inside the loop above too (measured: 9 stores per group).
    let mut sums = [[[0i32; MR]; NV]; PANEL];
    let mut rsums = [[0i32; MR]; NV];
    for (acc, sums) in acc.iter().zip(sums.iter_mut()) {
        for v in 0..NV {
            // SAFETY: 16 i32.
            unsafe { _mm512_storeu_si512(sums[v].as_mut_ptr() as *mut __m512i, acc[v]) };
        }
    }
    for v in 0..NV {
        // SAFETY: 16 i32.
        unsafe { _mm512_storeu_si512(rsums[v].as_mut_ptr() as *mut __m512i, rsum[v]) };
    }
    let cols = &core.cols;
    for (c, sums) in sums.iter().enumerate().take(t.cols) {
        for (v, seg) in segs.iter().enumerate().take(NV) {
            // SAFETY: 16 i32 each.
            let (acc, rsum) = unsafe { (_mm512_loadu_si512(sums[v].as_ptr() as *const __m512i), _mm512_loadu_si512(rsums[v].as_ptr() as *const __m512i)) };
            // SAFETY: the caller's contract.
            unsafe { store_column(acc, ZP.then_some(rsum), cols, t.j0 + c, t.jl + c, seg, core.kind, d) };
        }
    }
}

/// The epilogue of `kernel::epilogue` on one column's vector of 16 rows
/// (plain micro-panels: no offset, no row corrections; `rsum` the rows'
/// sums of A when some column has a zero point), in the same order of
/// operations, so the results are bit-identical; stores the lanes of
/// `seg` to column `jl` of the block (image column `j`).
///
/// # Safety
/// AVX-512 F/BW/VL; the stored elements lie in the destination and no
/// other task writes them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn store_column(acc: __m512i, rsum: Option<__m512i>, cols: &Cols<'_>, j: usize, jl: usize, seg: &Seg, kind: OutKind, d: &Dst<'_>) {
    if seg.n == 0 {
        return;
    }
    let col = (d.out0 + jl * d.cs) as isize;
    let mut x = _mm512_add_epi32(acc, _mm512_set1_epi32(cols.cconst[j]));
    if let Some(rsum) = rsum {
        x = _mm512_sub_epi32(x, _mm512_mullo_epi32(_mm512_set1_epi32(cols.zb[j]), rsum));
    }
    let f = _mm512_mul_ps(_mm512_cvtepi32_ps(x), _mm512_set1_ps(cols.scale[j]));
    match (kind, d.out) {
        (OutKind::Int { zero, min, max }, OutPtr::U8(p)) => {
            let f = _mm512_add_ps(_mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(f), _mm512_set1_ps(zero as f32));
            let f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(min as f32)), _mm512_set1_ps(max as f32));
            // The low bytes (`x as u8`; the values are in range).
            let bytes = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(f));
            for &(mask, base) in seg.runs() {
                // SAFETY: the masked lanes' elements (the caller's
                // contract); no other lane is accessed.
                unsafe { _mm_mask_storeu_epi8(p.get().wrapping_offset(col + base) as *mut i8, mask, bytes) };
            }
        }
        (OutKind::F32 { relu }, OutPtr::F32(p)) => {
            // max(x, 0) returns 0 for NaN, as `kernel::to_f32`.
            let f = if relu { _mm512_max_ps(f, _mm512_setzero_ps()) } else { f };
            for &(mask, base) in seg.runs() {
                // SAFETY: as above.
                unsafe { _mm512_mask_storeu_ps(p.get().wrapping_offset(col + base), mask, f) };
            }
        }
        _ => unreachable!("the core's output kind is the destination's"),
    }
}
