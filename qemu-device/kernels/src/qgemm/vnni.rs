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
        assert!(block.len() >= nmp * pl && c0.is_multiple_of(PANEL));
        let pbytes = kg * 32;
        assert!(self.b.len() >= (c0 + nc).div_ceil(PANEL) * pbytes && self.cols.scale.len() >= c0 + nc);
        let dst = Dst { out, out0, rs, cs, rows };
        // Panel by panel: one panel of B (kg·32 bytes) stays in L1 while
        // the block's micro-panels stream past it.
        for p in c0 / PANEL..(c0 + nc).div_ceil(PANEL) {
            let j0 = p * PANEL;
            let cols = (c0 + nc - j0).min(PANEL);
            let b = self.b[p * pbytes..].as_ptr();
            let mut mp = 0;
            while mp < nmp {
                let nv = (nmp - mp).min(TILE_PANELS);
                let a = block[mp * pl..].as_ptr();
                let t = Tile { a, pl, b, kg, mp, j0, jl: j0 - c0, cols };
                // SAFETY: AVX-512 F/BW/VL and VNNI (`available`, checked by
                // the caller that built this core); micro-panels mp .. mp+nv
                // (nv·pl bytes from `a`) lie in `block` and panel p of B in
                // `b` (asserted above); the stores are the caller's contract.
                unsafe {
                    match (nv, self.zero_points) {
                        (3, false) => tile::<3, false>(&t, self, &dst),
                        (3, true) => tile::<3, true>(&t, self, &dst),
                        (2, false) => tile::<2, false>(&t, self, &dst),
                        (2, true) => tile::<2, true>(&t, self, &dst),
                        (_, false) => tile::<1, false>(&t, self, &dst),
                        (_, true) => tile::<1, true>(&t, self, &dst),
                    }
                }
                mp += nv;
            }
        }
    }
}

/// Where a block's results go: element (row i, column j) at
/// `out0 + i·rs + (j − c0)·cs`, rows `< rows`.
struct Dst<'a> {
    out: &'a OutPtr,
    out0: usize,
    rs: usize,
    cs: usize,
    rows: usize,
}

/// One micro-tile: micro-panels `mp ..` at `a` (`pl` bytes apart), B panel
/// at `b` (columns `j0 .. j0+cols` of the image, `jl ..` of the block).
struct Tile {
    a: *const u8,
    pl: usize,
    b: *const u8,
    kg: usize,
    mp: usize,
    j0: usize,
    jl: usize,
    cols: usize,
}

/// Computes and stores one micro-tile of `NV` micro-panels; `ZP`: with
/// the rows' sums of A.
///
/// # Safety
/// AVX-512 F/BW/VL and VNNI available; `NV` micro-panels of `t.kg` groups
/// readable at `t.a` (`t.pl` apart) and `t.kg·32` bytes at `t.b`; the
/// elements stored lie in the destination and no other task writes them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const NV: usize, const ZP: bool>(t: &Tile, core: &Core<'_>, d: &Dst<'_>) {
    let mut acc = [[_mm512_setzero_si512(); NV]; PANEL];
    let mut rsum = [_mm512_setzero_si512(); NV];
    let ones = _mm512_set1_epi8(1);
    for g in 0..t.kg {
        // SAFETY: group g of micro-panel v, and of the B panel (caller).
        let av: [__m512i; NV] = core::array::from_fn(|v| unsafe { _mm512_loadu_si512(t.a.add(v * t.pl + g * GROUP) as *const __m512i) });
        if ZP {
            for v in 0..NV {
                rsum[v] = _mm512_dpbusd_epi32(rsum[v], av[v], ones);
            }
        }
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
        for v in 0..NV {
            let r0 = (t.mp + v) * MR;
            if r0 >= d.rows {
                break;
            }
            let nr = (d.rows - r0).min(MR);
            let mask: __mmask16 = if nr == MR { !0 } else { (1u16 << nr) - 1 };
            // SAFETY: 16 i32 each.
            let (acc, rsum) = unsafe { (_mm512_loadu_si512(sums[v].as_ptr() as *const __m512i), _mm512_loadu_si512(rsums[v].as_ptr() as *const __m512i)) };
            let mut x = _mm512_add_epi32(acc, cc);
            if ZP {
                x = _mm512_sub_epi32(x, _mm512_mullo_epi32(zb, rsum));
            }
            let f = _mm512_mul_ps(_mm512_cvtepi32_ps(x), sc);
            let at = d.out0 + r0 * d.rs + (t.jl + c) * d.cs;
            match (core.kind, d.out) {
                (OutKind::Int { zero, min, max }, OutPtr::U8(p)) => {
                    let f = _mm512_add_ps(_mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(f), _mm512_set1_ps(zero as f32));
                    let f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(min as f32)), _mm512_set1_ps(max as f32));
                    // The low bytes (`x as u8`; the values are in range).
                    let bytes = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(f));
                    if d.rs == 1 {
                        // SAFETY: elements at .. at + nr (the caller's contract).
                        unsafe { _mm_mask_storeu_epi8(p.get().add(at) as *mut i8, mask, bytes) };
                    } else {
                        let mut tmp = [0u8; MR];
                        // SAFETY: 16 bytes.
                        unsafe { _mm_storeu_si128(tmp.as_mut_ptr() as *mut __m128i, bytes) };
                        for (i, &b) in tmp.iter().enumerate().take(nr) {
                            // SAFETY: the caller's contract.
                            unsafe { *p.get().add(at + i * d.rs) = b };
                        }
                    }
                }
                (OutKind::F32 { relu }, OutPtr::F32(p)) => {
                    // max(x, 0) returns 0 for NaN, as `kernel::to_f32`.
                    let f = if relu { _mm512_max_ps(f, _mm512_setzero_ps()) } else { f };
                    if d.rs == 1 {
                        // SAFETY: elements at .. at + nr (the caller's contract).
                        unsafe { _mm512_mask_storeu_ps(p.get().add(at), mask, f) };
                    } else {
                        let mut tmp = [0f32; MR];
                        // SAFETY: 16 f32.
                        unsafe { _mm512_storeu_ps(tmp.as_mut_ptr(), f) };
                        for (i, &x) in tmp.iter().enumerate().take(nr) {
                            // SAFETY: the caller's contract.
                            unsafe { *p.get().add(at + i * d.rs) = x };
                        }
                    }
                }
                _ => unreachable!("the core's output kind is the destination's"),
            }
        }
    }
}
