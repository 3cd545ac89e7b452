//! Depthwise planes at strides 1 and 2 on AVX-512, read straight from
//! the input plane (at a horizontal stride of 2, from its rows split into
//! even and odd columns): no padded copy, no transposes.
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

/// One plane's geometry (strides 1 or 2, dilation 1).
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
    /// `[vertical, horizontal]`, each 1 or 2.
    pub stride: [usize; 2],
}

impl RowPlane {
    /// The plane geometry of convolution `p` (checked geometry `g`).
    pub(super) fn new(p: &super::Conv2dParams, g: &super::Geometry) -> RowPlane {
        RowPlane {
            in_h: g.h.input,
            in_w: g.w.input,
            out_h: g.h.output,
            out_w: g.w.output,
            kh: p.kernel[0],
            kw: p.kernel[1],
            pad_top: g.h.pad_before,
            pad_left: g.w.pad_before,
            stride: p.stride,
        }
    }

    /// Floats of one column phase of a row: input columns
    /// ph, ph + sx, … at a horizontal stride sx of 2 (one phase, the row
    /// itself, at stride 1).
    fn phase_len(&self) -> usize {
        // (A shift, not a division: this runs per plane.)
        (self.in_w + self.stride[1] - 1) >> self.stride[1].trailing_zeros()
    }

    /// Floats of the scratch a plane at a horizontal stride of 2 needs:
    /// every input row split into its column phases ([`split_phases`]).
    pub(super) fn scratch_len(&self) -> usize {
        if self.stride[1] == 1 {
            0
        } else {
            self.in_h * self.stride[1] * self.phase_len()
        }
    }

    /// The rows the taps read and their length: the input plane's, or at
    /// a horizontal stride of 2 its rows split into column phases in
    /// `scratch` (each tap of a vector then reads consecutive floats).
    ///
    /// # Safety
    /// AVX-512 F; `inp` readable for `in_h·in_w` floats, `scratch`
    /// writable for [`RowPlane::scratch_len`].
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn rows(&self, inp: *const f32, scratch: *mut f32) -> (*const f32, usize) {
        if self.stride[1] == 1 {
            return (inp, self.in_w);
        }
        // SAFETY: per the function contract.
        unsafe { split_phases(self, inp, scratch) };
        (scratch.cast_const(), self.stride[1] * self.phase_len())
    }

    /// The loads of the vector of outputs at column `x0` of a row: per
    /// column tap kx, the lanes that read input and where lane 0 reads
    /// in a row of [`RowPlane::rows`].
    #[inline(always)]
    pub(super) fn columns(&self, x0: isize) -> ([__mmask16; MAX_KW], [isize; MAX_KW]) {
        let (sx, ow) = (self.stride[1], self.out_w as isize);
        // (sx is 1 or 2: shifts and masks, not divisions, which would cost
        // more than a small plane's taps.)
        let (shift, phase_len) = (sx.trailing_zeros(), self.phase_len());
        let mut masks = [0 as __mmask16; MAX_KW];
        let mut offs = [0isize; MAX_KW];
        for kx in 0..self.kw.min(MAX_KW) {
            // Lane l of column tap kx is input column sx·(x0 + l) + kx −
            // pad_left: of phase ph = (kx − pad_left) mod sx, element
            // x0 + l + q with q = (kx − pad_left) div sx.
            let c = kx as isize - self.pad_left as isize;
            let (ph, q) = (c & (sx as isize - 1), c >> shift);
            // Input columns in phase ph: ph, ph + sx, … < in_w.
            let len = (self.in_w as isize - ph + sx as isize - 1) >> shift;
            masks[kx] = lanes(-(x0 + q), (len - x0 - q).min(ow - x0));
            offs[kx] = ph * phase_len as isize + x0 + q;
        }
        (masks, offs)
    }
}

/// A vector column's loads: per column tap kx, the lanes that read input
/// (`masks`) and the input column of lane 0 (`offs`).
pub(super) type Columns<'a> = (&'a [__mmask16; MAX_KW], &'a [isize; MAX_KW]);

/// Lanes `lo..hi` (clamped to 0..16) set.
#[inline(always)]
pub(crate) fn lanes(lo: isize, hi: isize) -> __mmask16 {
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
/// `out_h·out_w`, `scratch` for [`RowPlane::scratch_len`]; `wts` holds
/// `kh·kw` weights, `kw ≤ MAX_KW`, and the geometry is a valid window
/// (`out = (in + pads − k) / stride + 1` on both axes) with strides of 1
/// or 2.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn plane(g: &RowPlane, inp: *const f32, scratch: *mut f32, wts: &[f32], bias: f32, out: *mut f32) {
    let ow = g.out_w as isize;
    // SAFETY: per the function contract.
    let (src, row_len) = unsafe { g.rows(inp, scratch) };
    let mut x0 = 0isize;
    while x0 < ow {
        let (masks, offs) = g.columns(x0);
        let cols = (&masks, &offs);
        let store = lanes(0, ow - x0);
        // SAFETY: per the function contract.
        unsafe {
            match (g.kh, g.kw, g.stride[0]) {
                (3, 3, 1) => rows_k::<3, 3, 9, 1, 10, 6, 4, 3>(g, src, row_len, wts, bias, cols, store, x0, out),
                (5, 5, 1) => rows_k::<5, 5, 25, 1, 12, 8, 6, 5>(g, src, row_len, wts, bias, cols, store, x0, out),
                (3, 3, 2) => rows_k::<3, 3, 9, 2, 17, 9, 5, 3>(g, src, row_len, wts, bias, cols, store, x0, out),
                (5, 5, 2) => rows_k::<5, 5, 25, 2, 19, 11, 7, 5>(g, src, row_len, wts, bias, cols, store, x0, out),
                _ => {
                    let mut oy = 0;
                    while oy + 8 <= g.out_h {
                        block::<8>(g, src, row_len, wts, bias, cols, store, x0, oy, out);
                        oy += 8;
                    }
                    if oy + 4 <= g.out_h {
                        block::<4>(g, src, row_len, wts, bias, cols, store, x0, oy, out);
                        oy += 4;
                    }
                    if oy + 2 <= g.out_h {
                        block::<2>(g, src, row_len, wts, bias, cols, store, x0, oy, out);
                        oy += 2;
                    }
                    if oy < g.out_h {
                        block::<1>(g, src, row_len, wts, bias, cols, store, x0, oy, out);
                    }
                }
            }
        }
        x0 += 16;
    }
}

/// Splits each input row into its two column phases (even columns, then
/// odd ones, each `phase_len` floats): `scratch[iy·2·pl + ph·pl + k] =
/// inp[iy·in_w + 2k + ph]`.
///
/// # Safety
/// As [`plane`], `stride[1] = 2`.
#[target_feature(enable = "avx512f")]
unsafe fn split_phases(g: &RowPlane, inp: *const f32, scratch: *mut f32) {
    let pl = g.phase_len();
    let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for iy in 0..g.in_h {
        let row = inp.wrapping_add(iy * g.in_w);
        let dst = scratch.wrapping_add(iy * 2 * pl);
        let mut k = 0;
        while k < pl {
            // Input columns 2k .. 2k + 32 (masked at the row's end) give
            // phase elements k .. k + 16.
            let c = 2 * k as isize;
            let left = g.in_w as isize - c;
            // SAFETY: the lanes read are columns < in_w of row iy; the
            // lanes stored are elements < phase length of each phase,
            // inside the row's 2·pl floats of scratch.
            unsafe {
                let a = _mm512_maskz_loadu_ps(lanes(0, left), row.wrapping_add(2 * k));
                let b = _mm512_maskz_loadu_ps(lanes(0, left - 16), row.wrapping_add(2 * k + 16));
                let n_even = (pl - k).min(16) as isize;
                let n_odd = ((g.in_w / 2) as isize - k as isize).clamp(0, 16);
                _mm512_mask_storeu_ps(dst.wrapping_add(k), lanes(0, n_even), _mm512_permutex2var_ps(a, even, b));
                _mm512_mask_storeu_ps(dst.wrapping_add(pl + k), lanes(0, n_odd), _mm512_permutex2var_ps(a, odd, b));
            }
            k += 16;
        }
    }
}

/// Output rows `oy .. oy + R` of the vector column at `x0`, one load per
/// tap and output row, from rows of `row_len` floats at `src`.
///
/// # Safety
/// As [`plane`], `oy + R ≤ out_h`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn block<const R: usize>(
    g: &RowPlane,
    src: *const f32,
    row_len: usize,
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
        // Input row sy·(oy + r) + ky − pad_top of each output row, or no
        // lanes at all where there is none.
        let mut rows = [src; R];
        let mut live = [0 as __mmask16; R];
        for r in 0..R {
            let iy = (g.stride[0] * (oy + r) + ky).wrapping_sub(g.pad_top);
            if iy < g.in_h {
                rows[r] = src.wrapping_add(iy * row_len);
                live[r] = !0;
            }
        }
        for kx in 0..g.kw {
            let wv = _mm512_set1_ps(wts[ky * g.kw + kx]);
            for r in 0..R {
                // SAFETY: the lanes let through are elements of a real row
                // (its input columns, or its phases'); the others are not
                // accessed.
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
/// (`N = KH·KW` taps) at vertical stride `SY`, in blocks of 8, 4, 2 and 1
/// rows ([`block_k`]; `J8 = SY·7 + KH` and so on: the input rows under
/// each block).
///
/// # Safety
/// As [`plane`], `kh = KH`, `kw = KW`, `stride[0] = SY`, `N = KH·KW`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn rows_k<const KH: usize, const KW: usize, const N: usize, const SY: usize, const J8: usize, const J4: usize, const J2: usize, const J1: usize>(
    g: &RowPlane,
    src: *const f32,
    row_len: usize,
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
            block_k::<8, J8, KH, KW, N, SY>(g, src, row_len, &wv, bias, cols, store, x0, oy, out);
            oy += 8;
        }
        if oy + 4 <= g.out_h {
            block_k::<4, J4, KH, KW, N, SY>(g, src, row_len, &wv, bias, cols, store, x0, oy, out);
            oy += 4;
        }
        if oy + 2 <= g.out_h {
            block_k::<2, J2, KH, KW, N, SY>(g, src, row_len, &wv, bias, cols, store, x0, oy, out);
            oy += 2;
        }
        if oy < g.out_h {
            block_k::<1, J1, KH, KW, N, SY>(g, src, row_len, &wv, bias, cols, store, x0, oy, out);
        }
    }
}

/// [`block`] for `KH×KW` windows at vertical stride `SY`, input-row
/// major: each of the `J = SY·(R − 1) + KH` input rows under the block is
/// loaded once per column tap and feeds the output rows it lies under
/// (up to `KH / SY`), so that a tap costs a fraction of a load (the loads,
/// not the multiply-adds, bound [`block`]). Rows outside the input add
/// nothing and are skipped. The loops have constant bounds: unrolled,
/// `acc` stays in registers.
///
/// # Safety
/// As [`plane`], `kh = KH`, `kw = KW ≤ MAX_KW`, `stride[0] = SY`,
/// `oy + R ≤ out_h`, `J = SY·(R − 1) + KH`, `N = KH·KW`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn block_k<const R: usize, const J: usize, const KH: usize, const KW: usize, const N: usize, const SY: usize>(
    g: &RowPlane,
    src: *const f32,
    row_len: usize,
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
        // Input row SY·oy + j − pad_top, under output rows oy + (j − ky) / SY.
        let iy = (SY * oy + j).wrapping_sub(g.pad_top);
        if iy >= g.in_h {
            continue;
        }
        let row = src.wrapping_add(iy * row_len);
        // SAFETY: the lanes each mask lets through are elements of row iy
        // (its input columns, or its phases'); the others are not accessed.
        let v: [__m512; KW] = core::array::from_fn(|kx| unsafe { _mm512_maskz_loadu_ps(masks[kx], row.wrapping_offset(offs[kx])) });
        for ky in 0..KH {
            if j >= ky && (j - ky) % SY == 0 && (j - ky) / SY < R {
                let r = (j - ky) / SY;
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
