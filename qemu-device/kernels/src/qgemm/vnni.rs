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
use super::{BlockCore, OutPtr};

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
    /// Packed B (`rbln_hw::ops::pack_qgemm_b` layout) of this image's columns.
    pub b: &'a [u8],
    pub cols: Cols<'a>,
}

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
        // SAFETY: micro-panel v, group g at block + v·pl + g·64, inside
        // `block` (asserted); the rest is the caller's contract.
        unsafe { self.tiles(block.as_ptr(), pl, nmp, &at, &segs, c0, nc, out, out0, cs) }
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
    /// c0+nc` (`c0` a multiple of [`PANEL`]).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL and VNNI available ([`available`]); every vector's
    /// 64 bytes for every group are readable; the stored elements lie in
    /// the destination and no other task writes them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn tiles(&self, a: *const u8, vstride: usize, nvec: usize, at: &impl Fn(usize) -> usize, segs: &[Seg], c0: usize, nc: usize, out: &OutPtr, out0: usize, cs: usize) {
        let kg = self.kg;
        assert!(c0.is_multiple_of(PANEL) && segs.len() >= nvec);
        let pbytes = kg * 32;
        assert!(self.b.len() >= (c0 + nc).div_ceil(PANEL) * pbytes && self.cols.scale.len() >= c0 + nc);
        let dst = Dst { out, out0, cs };
        // Panel by panel: one panel of B (kg·32 bytes) stays in L1 while
        // the block's vectors stream past it.
        for p in c0 / PANEL..(c0 + nc).div_ceil(PANEL) {
            let j0 = p * PANEL;
            let cols = (c0 + nc - j0).min(PANEL);
            let b = self.b[p * pbytes..].as_ptr();
            let mut v = 0;
            while v < nvec {
                let nv = (nvec - v).min(TILE_PANELS);
                let t = Tile { a: a.wrapping_add(v * vstride), vstride, b, kg, j0, jl: j0 - c0, cols };
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
struct Dst<'a> {
    out: &'a OutPtr,
    out0: usize,
    cs: usize,
}

/// One micro-tile: vectors at `a` (`vstride` bytes apart), B panel at `b`
/// (columns `j0 .. j0+cols` of the image, `jl ..` of the block).
struct Tile {
    a: *const u8,
    vstride: usize,
    b: *const u8,
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
    for g in 0..t.kg {
        let ag = t.a.wrapping_add(at(g));
        // SAFETY: group g of vector v (caller).
        let av: [__m512i; NV] = core::array::from_fn(|v| unsafe { _mm512_loadu_si512(ag.wrapping_add(v * t.vstride) as *const __m512i) });
        if ZP {
            for v in 0..NV {
                rsum[v] = _mm512_dpbusd_epi32(rsum[v], av[v], ones);
            }
        }
        // SAFETY: group g of the B panel (caller).
        let bg = unsafe { t.b.add(g * 32) } as *const i32;
        for (c, acc) in acc.iter_mut().enumerate() {
            // SAFETY: as above (column c's 4 bytes of the group).
            let bc = _mm512_set1_epi32(unsafe { bg.add(c).read_unaligned() });
            for v in 0..NV {
                acc[v] = _mm512_dpbusd_epi32(acc[v], av[v], bc);
            }
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
    // The epilogue of `kernel::epilogue` on each column's vectors of rows
    // (plain micro-panels: no offset, no row corrections), in the same
    // order of operations, so the results are bit-identical.
    let cols = &core.cols;
    for (c, sums) in sums.iter().enumerate().take(t.cols) {
        let j = t.j0 + c;
        let cc = _mm512_set1_epi32(cols.cconst[j]);
        let zb = _mm512_set1_epi32(cols.zb[j]);
        let sc = _mm512_set1_ps(cols.scale[j]);
        let col = (d.out0 + (t.jl + c) * d.cs) as isize;
        for (v, seg) in segs.iter().enumerate().take(NV) {
            if seg.n == 0 {
                continue;
            }
            // SAFETY: 16 i32 each.
            let (acc, rsum) = unsafe { (_mm512_loadu_si512(sums[v].as_ptr() as *const __m512i), _mm512_loadu_si512(rsums[v].as_ptr() as *const __m512i)) };
            let mut x = _mm512_add_epi32(acc, cc);
            if ZP {
                x = _mm512_sub_epi32(x, _mm512_mullo_epi32(zb, rsum));
            }
            let f = _mm512_mul_ps(_mm512_cvtepi32_ps(x), sc);
            match (core.kind, d.out) {
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
    }
}
