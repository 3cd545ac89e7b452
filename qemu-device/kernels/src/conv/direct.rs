//! Direct convolution for short reductions on AVX-512: stems (3 input
//! channels) and small convolutions, where lowering to a GEMM spends more
//! time gathering windows than multiplying.
//!
//! A task is one image's block of 8 output channels. Its output rows are
//! cut into 16-pixel vectors read from the input rows as the depthwise
//! row path reads them ([`super::dw_rows::RowPlane`]: masked loads stand
//! in for the padding; at a horizontal stride of 2 from the rows split
//! into even and odd columns). A block of `R` output rows × 8 channels
//! stays in `8·R` accumulators over the whole reduction (input channel,
//! ky, kx, in that order): per tap, `R` loads of input and 8 weight
//! broadcasts feed `8·R` multiply-adds. The bias starts each sum and the
//! residual and activation follow once per task over its planes.

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;

use super::dw_rows::{lanes, Columns, RowPlane, MAX_KW};
use super::{Conv2dParams, Geometry};
use crate::activation::{epilogue, Bias};
use crate::util::{for_each_task, sequential, with_local, SendPtr};

/// Output channels per task.
const OCB: usize = 8;

/// Longest reduction (input channels × window) taken: longer ones amortize
/// a GEMM's packing (kernels_bench: 3×3 64→64 @56, 576 rows, took
/// 1.15× the GEMM path's time).
const MAX_KDIM: usize = 320;

/// Whether [`conv`] runs `p`: AVX-512, one group, no dilation, strides of
/// 1 or 2, windows larger than 1×1 (1×1 ones read their input in place as
/// a GEMM), reductions of up to [`MAX_KDIM`] rows, output rows whose
/// vectors are at least 3/4 used (12 to 16 outputs, 24 to 32, …), and
/// either a stem's few input channels or a small map, where the GEMM's
/// gathering and packing weigh most. kernels_bench, 2 threads, best of
/// 30-40, 4 alternated rounds, time against the GEMM path: 3×3 16→16 @16
/// 0.42-0.54, 3→16 @32 0.70, MobileNetV3's stem (3×3 s2 3→16 @224) 0.88,
/// EfficientNet's (3→32) 0.96-0.99, ResNet's (7×7 s2 3→64) 1.00; not
/// taken: rows of 20 (16→32 @16×20 1.2-1.5), 16→32 and 32→64 @112 (1.05),
/// rows of 8 (32→32 @8 0.95-0.97: too little to matter).
pub(super) fn applies(p: &Conv2dParams, g: &Geometry) -> bool {
    let ow = g.w.output;
    crate::fastmath::has_avx512()
        && p.groups == 1
        && p.dilation == [1, 1]
        && p.stride.iter().all(|s| (1..=2).contains(s))
        && p.kernel[1] <= MAX_KW
        && p.kernel[0] * p.kernel[1] > 1
        && g.kdim <= MAX_KDIM
        && ow >= 12
        && 4 * ow >= 3 * ow.next_multiple_of(16)
        && (p.in_channels <= 4 || g.out_plane <= 1024)
}

std::thread_local! {
    /// A thread's column phases of one image's input channels (stride 2).
    static PHASES: core::cell::RefCell<Vec<f32>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// The convolution (checked geometry `g`, [`applies`]).
pub(super) fn conv(
    p: &Conv2dParams,
    g: &Geometry,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    output: &mut [f32],
) {
    let rp = RowPlane::new(p, g);
    let blocks = p.out_channels.div_ceil(OCB);
    let seq = sequential(output.len().saturating_mul(2 * g.kdim));
    let out_ptr = SendPtr(output.as_mut_ptr());
    for_each_task(p.batch * blocks, seq, |t| {
        let (b, oc0) = (t / blocks, (t % blocks) * OCB);
        let nb = OCB.min(p.out_channels - oc0);
        let inp = &input[b * p.in_channels * g.in_plane..][..p.in_channels * g.in_plane];
        let first = (b * p.out_channels + oc0) * g.out_plane;
        // SAFETY: planes oc0..oc0 + nb of image b: inside `output`, and
        // tasks cover disjoint planes.
        let outs = unsafe { core::slice::from_raw_parts_mut(out_ptr.get().add(first), nb * g.out_plane) };
        // Weight rows of the block's channels; a missing channel (the last
        // block's) repeats the first, its sums computed and not stored.
        let w: [*const f32; OCB] = core::array::from_fn(|o| weight[(oc0 + if o < nb { o } else { 0 }) * g.kdim..][..g.kdim].as_ptr());
        let bv: [f32; OCB] = core::array::from_fn(|o| bias.map_or(0.0, |bs| bs[oc0 + if o < nb { o } else { 0 }]));
        with_local(&PHASES, |scratch| {
            let per = rp.scratch_len();
            if scratch.len() < per * p.in_channels {
                scratch.resize(per * p.in_channels, 0.0);
            }
            // SAFETY: AVX-512 F (applies); the input planes, scratch,
            // weight rows and output planes have the sizes `block_task`
            // asks for.
            unsafe { block_task(&rp, p.in_channels, g.in_plane, inp.as_ptr(), scratch.as_mut_ptr(), &w, &bv, nb, outs.as_mut_ptr()) };
        });
        let res = residual.map(|r| &r[first..first + nb * g.out_plane]);
        epilogue(outs, Bias::None, res, p.activation);
    });
}

/// One task: `nb` output planes (of `OCB` computed) from `cin` input
/// planes.
///
/// # Safety
/// AVX-512 F; `inp` readable for `cin·in_plane` floats, `scratch`
/// writable for `cin·scratch_len`, each `w[o]` points at `cin·kh·kw`
/// weights (`cin ≤ MAX_KDIM`),
/// `out` writable for `nb·out_h·out_w`; the geometry as
/// [`super::dw_rows::plane`]'s.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_task(
    g: &RowPlane,
    cin: usize,
    in_plane: usize,
    inp: *const f32,
    scratch: *mut f32,
    w: &[*const f32; OCB],
    bias: &[f32; OCB],
    nb: usize,
    out: *mut f32,
) {
    // The rows of every input channel (split into column phases once).
    let mut rows = [(inp, 0usize); MAX_KDIM];
    for (c, row) in rows.iter_mut().enumerate().take(cin) {
        // SAFETY: per the function contract.
        *row = unsafe { g.rows(inp.wrapping_add(c * in_plane), scratch.wrapping_add(c * g.scratch_len())) };
    }
    let rows = &rows[..cin];
    let ow = g.out_w as isize;
    let mut x0 = 0isize;
    while x0 < ow {
        let (masks, offs) = g.columns(x0);
        let cols = (&masks, &offs);
        let store = lanes(0, ow - x0);
        let mut oy = 0;
        // SAFETY: per the function contract, for every block.
        unsafe {
            while oy + 3 <= g.out_h {
                rows_block::<3>(g, rows, w, bias, cols, store, nb, x0, oy, out);
                oy += 3;
            }
            if oy + 2 <= g.out_h {
                rows_block::<2>(g, rows, w, bias, cols, store, nb, x0, oy, out);
                oy += 2;
            }
            if oy < g.out_h {
                rows_block::<1>(g, rows, w, bias, cols, store, nb, x0, oy, out);
            }
        }
        x0 += 16;
    }
}

/// Output rows `oy .. oy + R` of the vector column at `x0`, all `OCB`
/// channels, summed over every input channel and tap.
///
/// # Safety
/// As [`block_task`], `oy + R ≤ out_h`; `rows` from [`RowPlane::rows`].
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn rows_block<const R: usize>(
    g: &RowPlane,
    rows: &[(*const f32, usize)],
    w: &[*const f32; OCB],
    bias: &[f32; OCB],
    (masks, offs): Columns<'_>,
    store: __mmask16,
    nb: usize,
    x0: isize,
    oy: usize,
    out: *mut f32,
) {
    let mut acc = [[_mm512_setzero_ps(); R]; OCB];
    let taps = g.kh * g.kw;
    for (c, &(src, row_len)) in rows.iter().enumerate() {
        for ky in 0..g.kh {
            // Input row sy·(oy + r) + ky − pad_top of each output row, or
            // no lanes where there is none.
            let mut at = [src; R];
            let mut live = [0 as __mmask16; R];
            for r in 0..R {
                let iy = (g.stride[0] * (oy + r) + ky).wrapping_sub(g.pad_top);
                if iy < g.in_h {
                    at[r] = src.wrapping_add(iy * row_len);
                    live[r] = !0;
                }
            }
            let k0 = c * taps + ky * g.kw;
            for kx in 0..g.kw {
                // SAFETY: the lanes let through are elements of a real row
                // (its input columns, or its phases'); the others are not
                // accessed.
                let v: [__m512; R] = core::array::from_fn(|r| unsafe { _mm512_maskz_loadu_ps(masks[kx] & live[r], at[r].wrapping_offset(offs[kx])) });
                for (o, acc_o) in acc.iter_mut().enumerate() {
                    // SAFETY: k0 + kx < cin·kh·kw, the length of row w[o].
                    let wv = _mm512_set1_ps(unsafe { *w[o].add(k0 + kx) });
                    for r in 0..R {
                        acc_o[r] = _mm512_fmadd_ps(wv, v[r], acc_o[r]);
                    }
                }
            }
        }
    }
    let plane = g.out_h * g.out_w;
    for (o, acc_o) in acc.iter().enumerate().take(nb) {
        let b = _mm512_set1_ps(bias[o]);
        for (r, a) in acc_o.iter().enumerate() {
            // SAFETY: the stored lanes are columns x0.. < out_w of row
            // oy + r of output plane o.
            unsafe { _mm512_mask_storeu_ps(out.wrapping_add(o * plane + (oy + r) * g.out_w).wrapping_offset(x0), store, _mm512_add_ps(*a, b)) };
        }
    }
}
