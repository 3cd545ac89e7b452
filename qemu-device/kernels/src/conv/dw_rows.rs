//! Stride-1 depthwise planes on AVX-512, read straight from the input
//! plane: no padded copy, no transposes.
//!
//! An output row is cut into 16-pixel vectors. Tap (ky, kx) of the vector
//! at column x0 is input row iy = oy + ky − pad_top read at columns
//! x0 + kx − pad_left …: one unaligned load whose lanes outside the input
//! row (the zero padding) and past the output row are masked off (masked
//! lanes are neither read nor faulted on); a row above or below the input
//! adds nothing. Blocks of 8 output rows share each vector column: eight
//! independent chains of multiply-adds.
//!
//! 3×3 and 5×5 windows go input-row major ([`block_k`]): each input row
//! under a block is loaded once per column tap and feeds every output row
//! it lies under, a third (a fifth) of a load per tap; other windows load
//! per tap ([`block`]). The phase-plane path instead copies every row in
//! and out of a padded plane (on small maps more time than the taps
//! take), and the channel-blocked path transposes.

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;

/// Largest window width of the fast path (one mask per column tap).
pub(super) const MAX_KW: usize = 16;

/// One plane's geometry (stride 1, dilation 1).
#[derive(Clone, Copy)]
pub(super) struct RowPlane {
    pub in_h: usize,
    pub in_w: usize,
    pub out_h: usize,
    pub out_w: usize,
    pub kh: usize,
    pub kw: usize,
    pub pad_top: usize,
    pub pad_left: usize,
}

/// A vector column's loads: per column tap kx, the lanes that read input
/// (`masks`) and the input column of lane 0 (`offs`).
type Columns<'a> = (&'a [__mmask16; MAX_KW], &'a [isize; MAX_KW]);

/// Lanes `lo..hi` (clamped to 0..16) set.
#[inline(always)]
fn lanes(lo: isize, hi: isize) -> __mmask16 {
    let (lo, hi) = (lo.clamp(0, 16), hi.clamp(0, 16));
    if hi <= lo {
        return 0;
    }
    (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as __mmask16
}

/// `out = bias + Σ taps` for one plane (`out_h·out_w` floats).
///
/// # Safety
/// AVX-512 F; `inp` readable for `in_h·in_w` floats, `out` writable for
/// `out_h·out_w`; `wts` holds `kh·kw` weights, `kw ≤ MAX_KW`, and the
/// geometry is a valid stride-1 window (`out = in + pads − k + 1` on both
/// axes).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn plane(g: &RowPlane, inp: *const f32, wts: &[f32], bias: f32, out: *mut f32) {
    let (ow, w) = (g.out_w as isize, g.in_w as isize);
    let mut x0 = 0isize;
    while x0 < ow {
        // Lane l of column tap kx reads input column x0 + l + kx − pad_left.
        let mut masks = [0 as __mmask16; MAX_KW];
        let mut offs = [0isize; MAX_KW];
        for kx in 0..g.kw {
            let s = x0 + kx as isize - g.pad_left as isize;
            masks[kx] = lanes(-s, (w - s).min(ow - x0));
            offs[kx] = s;
        }
        let cols = (&masks, &offs);
        let store = lanes(0, ow - x0);
        // SAFETY: per the function contract.
        unsafe {
            match (g.kh, g.kw) {
                (3, 3) => rows_k::<3, 3, 9, 10, 6, 4, 3>(g, inp, wts, bias, cols, store, x0, out),
                (5, 5) => rows_k::<5, 5, 25, 12, 8, 6, 5>(g, inp, wts, bias, cols, store, x0, out),
                _ => {
                    let mut oy = 0;
                    while oy + 8 <= g.out_h {
                        block::<8>(g, inp, wts, bias, cols, store, x0, oy, out);
                        oy += 8;
                    }
                    if oy + 4 <= g.out_h {
                        block::<4>(g, inp, wts, bias, cols, store, x0, oy, out);
                        oy += 4;
                    }
                    if oy + 2 <= g.out_h {
                        block::<2>(g, inp, wts, bias, cols, store, x0, oy, out);
                        oy += 2;
                    }
                    if oy < g.out_h {
                        block::<1>(g, inp, wts, bias, cols, store, x0, oy, out);
                    }
                }
            }
        }
        x0 += 16;
    }
}

/// Output rows `oy .. oy + R` of the vector column at `x0`, one load per
/// tap and output row.
///
/// # Safety
/// As [`plane`], `oy + R ≤ out_h`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn block<const R: usize>(
    g: &RowPlane,
    inp: *const f32,
    wts: &[f32],
    bias: f32,
    (masks, offs): Columns<'_>,
    store: __mmask16,
    x0: isize,
    oy: usize,
    out: *mut f32,
) {
    let mut acc = [_mm512_set1_ps(bias); R];
    for ky in 0..g.kh {
        // Input row oy + r + ky − pad_top of each output row, or no lanes
        // at all where there is none.
        let mut rows = [inp; R];
        let mut live = [0 as __mmask16; R];
        for r in 0..R {
            let iy = (oy + r + ky).wrapping_sub(g.pad_top);
            if iy < g.in_h {
                rows[r] = inp.wrapping_add(iy * g.in_w);
                live[r] = !0;
            }
        }
        for kx in 0..g.kw {
            let wv = _mm512_set1_ps(wts[ky * g.kw + kx]);
            for r in 0..R {
                // SAFETY: the lanes let through are input columns 0..in_w
                // of a real row; the others are not accessed.
                let v = unsafe { _mm512_maskz_loadu_ps(masks[kx] & live[r], rows[r].wrapping_offset(offs[kx])) };
                acc[r] = _mm512_fmadd_ps(wv, v, acc[r]);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: the stored lanes are columns x0.. < out_w of row oy + r.
        unsafe { _mm512_mask_storeu_ps(out.wrapping_add((oy + r) * g.out_w).wrapping_offset(x0), store, *a) };
    }
}

/// All output rows of the vector column at `x0` for `KH×KW` windows
/// (`N = KH·KW` taps), in blocks of 8, 4, 2 and 1 rows ([`block_k`];
/// `J8 = 8 + KH − 1` and so on: the input rows under each block).
///
/// # Safety
/// As [`plane`], `kh = KH`, `kw = KW`, `N = KH·KW`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn rows_k<const KH: usize, const KW: usize, const N: usize, const J8: usize, const J4: usize, const J2: usize, const J1: usize>(
    g: &RowPlane,
    inp: *const f32,
    wts: &[f32],
    bias: f32,
    cols: Columns<'_>,
    store: __mmask16,
    x0: isize,
    out: *mut f32,
) {
    // The weights broadcast once per column.
    let wv: [__m512; N] = core::array::from_fn(|i| _mm512_set1_ps(wts[i]));
    let mut oy = 0;
    // SAFETY: per the function contract, for every block.
    unsafe {
        while oy + 8 <= g.out_h {
            block_k::<8, J8, KH, KW, N>(g, inp, &wv, bias, cols, store, x0, oy, out);
            oy += 8;
        }
        if oy + 4 <= g.out_h {
            block_k::<4, J4, KH, KW, N>(g, inp, &wv, bias, cols, store, x0, oy, out);
            oy += 4;
        }
        if oy + 2 <= g.out_h {
            block_k::<2, J2, KH, KW, N>(g, inp, &wv, bias, cols, store, x0, oy, out);
            oy += 2;
        }
        if oy < g.out_h {
            block_k::<1, J1, KH, KW, N>(g, inp, &wv, bias, cols, store, x0, oy, out);
        }
    }
}

/// [`block`] for `KH×KW` windows, input-row major: each of the
/// `J = R + KH − 1` input rows under the block is loaded once per column
/// tap and feeds the up to `KH` output rows it lies under, so that a tap
/// costs `1/KH` of a load (the loads, not the multiply-adds, bound
/// [`block`]). Rows outside the input add nothing and are skipped. The
/// loops have constant bounds: unrolled, `acc` stays in registers.
///
/// # Safety
/// As [`plane`], `kh = KH`, `kw = KW ≤ MAX_KW`, `oy + R ≤ out_h`,
/// `J = R + KH − 1`, `N = KH·KW`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn block_k<const R: usize, const J: usize, const KH: usize, const KW: usize, const N: usize>(
    g: &RowPlane,
    inp: *const f32,
    wv: &[__m512; N],
    bias: f32,
    (masks, offs): Columns<'_>,
    store: __mmask16,
    x0: isize,
    oy: usize,
    out: *mut f32,
) {
    let mut acc = [_mm512_set1_ps(bias); R];
    for j in 0..J {
        // Input row oy + j − pad_top, under output rows oy + j − ky.
        let iy = (oy + j).wrapping_sub(g.pad_top);
        if iy >= g.in_h {
            continue;
        }
        let row = inp.wrapping_add(iy * g.in_w);
        // SAFETY: the lanes each mask lets through are input columns
        // 0..in_w of row iy; the others are not accessed.
        let v: [__m512; KW] = core::array::from_fn(|kx| unsafe { _mm512_maskz_loadu_ps(masks[kx], row.wrapping_offset(offs[kx])) });
        for ky in 0..KH {
            if j >= ky && j - ky < R {
                let r = j - ky;
                for (kx, vx) in v.iter().enumerate() {
                    acc[r] = _mm512_fmadd_ps(wv[KW * ky + kx], *vx, acc[r]);
                }
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: the stored lanes are columns x0.. < out_w of row oy + r.
        unsafe { _mm512_mask_storeu_ps(out.wrapping_add((oy + r) * g.out_w).wrapping_offset(x0), store, *a) };
    }
}
