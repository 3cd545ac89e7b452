//! Stride-1 depthwise planes on AVX-512, read straight from the input
//! plane: no padded copy, no transposes.
//!
//! An output row is cut into 16-pixel vectors. Tap (ky, kx) of the vector
//! at column x0 is the input row iy = oy + ky − pad_top read at columns
//! x0 + kx − pad_left …, one unaligned load whose lanes outside the input
//! row (the zero padding) and past the output row are masked off (masked
//! lanes are neither read nor faulted on). A row above or below the input
//! reads a row of zeros instead. Eight output rows share each vector
//! column, eight independent chains of multiply-adds.
//!
//! Per 3×3 tap and 16 outputs that is one load and one multiply-add, where
//! the phase-plane path copies every row in and out of a padded plane
//! (small maps: more time in the copies than in the taps) and the
//! channel-blocked path transposes.

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

impl RowPlane {
    /// Floats of the zero row that stands in for rows outside the input
    /// (the masks let through input columns only).
    pub(super) fn zeros_len(&self) -> usize {
        self.in_w
    }
}

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
/// AVX-512 F; `inp` readable for `in_h·in_w` floats, `zeros` for
/// [`RowPlane::zeros_len`] zero floats, `out` writable for `out_h·out_w`;
/// `wts` holds `kh·kw` weights, `kw ≤ MAX_KW`, and the geometry is a
/// valid stride-1 window (`out = in + pads − k + 1` on both axes).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn plane(g: &RowPlane, inp: *const f32, zeros: *const f32, wts: &[f32], bias: f32, out: *mut f32) {
    let (ow, w) = (g.out_w as isize, g.in_w as isize);
    let mut x0 = 0isize;
    while x0 < ow {
        // Lane l of tap column kx reads input column x0 + l + kx − pad_left.
        let mut masks = [0 as __mmask16; MAX_KW];
        let mut offs = [0isize; MAX_KW];
        for kx in 0..g.kw {
            let s = x0 + kx as isize - g.pad_left as isize;
            masks[kx] = lanes(-s, (w - s).min(ow - x0));
            offs[kx] = s;
        }
        let store = lanes(0, ow - x0);
        let mut oy = 0;
        // SAFETY: per the function contract, for every block below.
        unsafe {
            while oy + 8 <= g.out_h {
                block::<8>(g, inp, zeros, wts, bias, x0, (&masks, &offs), store, oy, out);
                oy += 8;
            }
            while oy + 4 <= g.out_h {
                block::<4>(g, inp, zeros, wts, bias, x0, (&masks, &offs), store, oy, out);
                oy += 4;
            }
            if oy + 2 <= g.out_h {
                block::<2>(g, inp, zeros, wts, bias, x0, (&masks, &offs), store, oy, out);
                oy += 2;
            }
            if oy < g.out_h {
                block::<1>(g, inp, zeros, wts, bias, x0, (&masks, &offs), store, oy, out);
            }
        }
        x0 += 16;
    }
}

/// Output rows `oy .. oy + R`, the vector at column `x0`.
///
/// # Safety
/// As [`plane`], `oy + R ≤ out_h`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn block<const R: usize>(
    g: &RowPlane,
    inp: *const f32,
    zeros: *const f32,
    wts: &[f32],
    bias: f32,
    x0: isize,
    (masks, offs): (&[__mmask16; MAX_KW], &[isize; MAX_KW]),
    store: __mmask16,
    oy: usize,
    out: *mut f32,
) {
    let mut acc = [_mm512_set1_ps(bias); R];
    for ky in 0..g.kh {
        // Input row of each output row for this tap row, or the zero row.
        let mut rows = [zeros; R];
        for (r, row) in rows.iter_mut().enumerate() {
            // Input row oy + r + ky − pad_top, if there is one.
            let iy = (oy + r + ky).wrapping_sub(g.pad_top);
            if iy < g.in_h {
                *row = inp.wrapping_add(iy * g.in_w);
            }
        }
        for kx in 0..g.kw {
            let wv = _mm512_set1_ps(wts[ky * g.kw + kx]);
            let (m, off) = (masks[kx], offs[kx]);
            for r in 0..R {
                // SAFETY: the lanes `m` lets through are input columns
                // 0..in_w of a real row (or of the zero row, as long); the
                // others are not accessed.
                let v = unsafe { _mm512_maskz_loadu_ps(m, rows[r].wrapping_offset(off)) };
                acc[r] = _mm512_fmadd_ps(wv, v, acc[r]);
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: the stored lanes are columns x0.. < out_w of row oy + r.
        unsafe { _mm512_mask_storeu_ps(out.wrapping_add((oy + r) * g.out_w).wrapping_offset(x0), store, *a) };
    }
}
