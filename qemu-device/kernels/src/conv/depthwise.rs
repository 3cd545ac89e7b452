//! Depthwise convolution (one input channel per group): each output plane
//! is a weighted sum of shifted views of one input plane.

use super::phases::PhaseGeometry;
use super::{Axis, Conv2dParams, Geometry};
use crate::activation::{epilogue, Bias};
use crate::fastmath::{madd, simd_dispatch};
use crate::util::{for_each_task, with_local, SendPtr};

/// One input channel per group: each output plane is a weighted sum of
/// shifted views of one input plane.
///
/// With AVX-512, windows of up to 9 taps or 5×5 at strides 1 and 2 with
/// output rows of 14 or more run per plane straight from the input rows
/// ([`rows_pay`], [`super::dw_rows`]), channel multipliers included.
/// Otherwise depthwise proper (one output channel per input channel) runs
/// channel-blocked ([`Blocked`]): a vector's worth of channels side by
/// side in the lanes (8, 16 with AVX-512), so that every tap is one vector
/// multiply-add per output pixel whatever the plane's size. With AVX-512,
/// the remaining windows of up to 9 taps at stride 1 on maps of 14×14
/// outputs or more run per plane instead ([`planes_pay`]), as do channel
/// multipliers (several outputs per input channel) and hostile geometries:
/// the (zero-padded) input plane is split into its stride phases, so that
/// every tap reads a contiguous shifted window of one phase plane; the
/// output is computed over the flattened phase-plane grid (a few garbage
/// columns per row, dropped afterwards) in register-blocked chunks that
/// sum all taps before storing. Geometries whose phase planes would be
/// much larger than the input and output take the generic per-tap loop.
pub(super) fn direct(
    p: &Conv2dParams,
    g: &Geometry,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    output: &mut [f32],
) {
    let (kh, kw) = (p.kernel[0], p.kernel[1]);
    let (ha, wa) = (g.h, g.w);
    #[cfg(target_arch = "x86_64")]
    if rows_pay(p, g) {
        let rp = super::dw_rows::RowPlane::new(p, g);
        per_plane(p, g, output, residual, |plane_idx, out| {
            let (b, co) = (plane_idx / p.out_channels, plane_idx % p.out_channels);
            let inp = &input[(b * p.in_channels + co / g.og) * g.in_plane..][..g.in_plane];
            let wts = &weight[co * kh * kw..][..kh * kw];
            let bv = bias.map_or(0.0, |b| b[co]);
            // SAFETY (both): AVX-512 F is present (rows_pay); the input
            // and output planes and the scratch have the lengths `plane`
            // asks for; the geometry was validated by `Axis`, with strides
            // of 1 or 2 and no dilation (rows_pay).
            if rp.scratch_len() == 0 {
                unsafe { super::dw_rows::plane(&rp, inp.as_ptr(), core::ptr::null_mut(), wts, bv, out.as_mut_ptr()) };
                return;
            }
            with_local(&DW_ROWS_SCRATCH, |scratch| {
                if scratch.len() < rp.scratch_len() {
                    scratch.resize(rp.scratch_len(), 0.0);
                }
                unsafe { super::dw_rows::plane(&rp, inp.as_ptr(), scratch.as_mut_ptr(), wts, bv, out.as_mut_ptr()) };
            });
        });
        return;
    }
    if g.og == 1 && !planes_pay(p, g.out_plane) {
        if let Some(b) = Blocked::new(&ha, &wa) {
            if Blocked::wide(p, g) {
                b.conv::<16>(p, g, input, weight, bias, residual, output);
            } else {
                b.conv::<8>(p, g, input, weight, bias, residual, output);
            }
            return;
        }
    }
    let phased = PhaseGeometry::new(&ha, &wa, g.in_plane, g.out_plane);
    per_plane(
        p,
        g,
        output,
        residual,
        |plane_idx, out| {
            let b = plane_idx / p.out_channels;
            let co = plane_idx % p.out_channels;
            let ci = co / g.og; // group index == input channel within group 0
            let inp = &input[(b * p.in_channels + ci) * g.in_plane..][..g.in_plane];
            let wts = &weight[co * kh * kw..][..kh * kw];
            let bv = bias.map_or(0.0, |b| b[co]);
            with_local(&DW_SCRATCH, |bufs| match &phased {
                Some(ph) => {
                    ph.prepare(bufs);
                    ph.depthwise_plane(inp, wts, bv, &ha, &wa, bufs, out)
                }
                None => {
                    out.fill(bv);
                    depthwise_plane(inp, wts, kh, kw, &ha, &wa, out);
                }
            })
        },
    );
}

std::thread_local! {
    /// A thread's column phases for [`super::dw_rows`] at stride 2.
    static DW_ROWS_SCRATCH: core::cell::RefCell<Vec<f32>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// Runs `plane(index, output plane)` over all output planes in tasks of
/// whole planes, then each task's residual and activation.
fn per_plane(
    p: &Conv2dParams,
    g: &Geometry,
    output: &mut [f32],
    residual: Option<&[f32]>,
    plane: impl Fn(usize, &mut [f32]) + Sync,
) {
    let planes = output.len() / g.out_plane.max(1);
    // Small convolutions as one task, on the calling thread. Depthwise
    // work runs at about an eighth of a GEMM's flop rate, hence the weight.
    let flops = output.len().saturating_mul(2 * p.kernel[0] * p.kernel[1]).saturating_mul(8);
    let seq = crate::util::sequential(flops);
    // Tasks of whole planes, about 16 K outputs each, and enough of them
    // for the threads to share.
    let threads = crate::util::plan_threads(seq);
    let per_task = if seq { planes.max(1) } else { (16_384 / g.out_plane.max(1)).min(planes.div_ceil(8 * threads)).max(1) };
    let out_ptr = SendPtr(output.as_mut_ptr());
    for_each_task(planes.div_ceil(per_task), seq, |t| {
        let first = t * per_task;
        let last = ((t + 1) * per_task).min(planes);
        // SAFETY: planes `first..last` of `output` (planes·out_plane =
        // output.len()); tasks cover disjoint planes.
        let outs = unsafe { core::slice::from_raw_parts_mut(out_ptr.get().add(first * g.out_plane), (last - first) * g.out_plane) };
        for (plane_idx, out) in (first..last).zip(outs.chunks_exact_mut(g.out_plane.max(1))) {
            plane(plane_idx, out);
        }
        // The residual and activation once over the task's planes (they
        // are contiguous): one pass, not a call per small plane.
        let res = residual.map(|r| &r[first * g.out_plane..last * g.out_plane]);
        epilogue(outs, Bias::None, res, p.activation);
    });
}

/// Whether planes run straight from the input rows ([`super::dw_rows`]):
/// AVX-512, strides 1 or 2, no dilation, up to 9 taps or 5×5, output
/// rows of 14 or more (a vector's lanes mostly used). kernels_bench, 2
/// threads, best of 40, 4-5 alternated rounds, time against the paths
/// before (per plane / channel-blocked): stride 1: 3×3 576@14 0.43,
/// 480@14 0.49, 88@28 0.50, 64@56 0.63, 32@112 0.68; 5×5 240@28 0.62,
/// 240@14 0.65, 672@14 0.71; stride 2: 3×3 144@56 0.61, 72@56 0.66,
/// 96@112 0.83, 16@112 0.88; 5×5 144@56 0.57, 96@28 0.79. 7×7 output
/// maps stay channel-blocked (a vector's lanes half used: 3×3 960@7
/// 0.88-1.26, 5×5 576@7 1.16-1.78 in the first, per-tap version).
#[cfg(target_arch = "x86_64")]
fn rows_pay(p: &Conv2dParams, g: &Geometry) -> bool {
    crate::fastmath::has_avx512()
        && p.stride.iter().all(|s| (1..=2).contains(s))
        && p.dilation == [1, 1]
        && (p.kernel[0] * p.kernel[1] <= 9 || p.kernel == [5, 5])
        && g.w.output >= 14
        && g.out_plane >= 14 * 14
}


/// Whether depthwise proper runs per plane rather than channel-blocked:
/// with AVX-512, for windows of up to 9 taps at stride 1 on maps of 14×14
/// outputs or more, where the blocked path's transposes cost more than its
/// taps (kernels_bench, 2 threads, 4 alternated rounds of best of 40, time
/// against the 8-lane blocked path before, per plane / 16-lane blocked:
/// 3×3 s1 32@112 0.78 / 1.04, 64@56 0.81 / 0.89, 88@28 0.70 / 1.16,
/// 576@14 0.65 / 0.76). Stride 2 stays blocked (per plane 0.77-1.15 in
/// kernels_bench but slower in a model: MobileNetV3's first two
/// depthwise convs took 1.1-1.3× the time), and so do 5×5 windows and 7×7
/// maps (5×5 s1 576@7 1.04 / 0.49, s2 288@14 1.57 / 0.46).
fn planes_pay(p: &Conv2dParams, out_plane: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::fastmath::has_avx512() {
        return p.kernel[0] * p.kernel[1] <= 9 && p.stride == [1, 1] && out_plane >= 14 * 14;
    }
    let _ = (p, out_plane);
    false
}

/// A depthwise thread's buffers: phase planes, accumulators, taps, and the
/// layout key of the phase planes' padding ([`PhaseGeometry::layout_key`]).
type DwScratch = (Vec<f32>, Vec<f32>, Vec<(f32, usize)>, Vec<usize>);

std::thread_local! {
    static DW_SCRATCH: core::cell::RefCell<DwScratch> =
        const { core::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new())) };
}


/// Output elements per register block of [`depthwise_taps`].
const DW_BLOCK: usize = 64;
/// Vector width of its tail blocks.
const DW_VEC: usize = 8;

simd_dispatch! {
    /// `acc[q] = bias + Σ_taps w · src[off + q]`, all taps of a block of
    /// outputs summed in registers. `acc.len()` is a multiple of `DW_VEC`
    /// and every `off + acc.len()` is within `src`.
    fn depthwise_taps(src: &[f32], taps: &[(f32, usize)], bias: f32, acc: &mut [f32]) {
        let mut blocks = acc.chunks_exact_mut(DW_BLOCK);
        let mut q = 0;
        for blk in &mut blocks {
            let mut r = [bias; DW_BLOCK];
            for &(w, off) in taps {
                let s = &src[off + q..][..DW_BLOCK];
                for i in 0..DW_BLOCK {
                    r[i] = madd::<FMA>(w, s[i], r[i]);
                }
            }
            blk.copy_from_slice(&r);
            q += DW_BLOCK;
        }
        for blk in blocks.into_remainder().chunks_exact_mut(DW_VEC) {
            let mut r = [bias; DW_VEC];
            for &(w, off) in taps {
                let s = &src[off + q..][..DW_VEC];
                for i in 0..DW_VEC {
                    r[i] = madd::<FMA>(w, s[i], r[i]);
                }
            }
            blk.copy_from_slice(&r);
            q += DW_VEC;
        }
    }
}


/// Outputs per block of [`plane_taps`] on AVX-512: eight vectors, eight
/// independent chains of multiply-adds (a chain of one tap after another
/// is bound by the multiply-add's latency).
const TAPS_BLOCK: usize = 128;

/// [`depthwise_taps`], on AVX-512 in blocks of [`TAPS_BLOCK`] outputs, the
/// last one moved back to end at the last output (it recomputes some of
/// the previous block's, identically) rather than in narrow tail blocks;
/// then `acc.len() ≥ TAPS_BLOCK`. Every `off + acc.len() ≤ src.len()`.
fn plane_taps(src: &[f32], taps: &[(f32, usize)], bias: f32, acc: &mut [f32]) {
    let n = acc.len();
    #[cfg(target_arch = "x86_64")]
    if crate::fastmath::has_avx512() && n >= TAPS_BLOCK && taps.iter().all(|&(_, off)| off + n <= src.len()) {
        let mut q = 0;
        loop {
            let q0 = q.min(n - TAPS_BLOCK);
            // SAFETY: AVX-512 F is present; reads src[q0 + off..][..128]
            // and writes acc[q0..][..128], inside both (checked above,
            // q0 + 128 ≤ n).
            unsafe { taps_block_avx512(src.as_ptr().add(q0), taps, bias, acc.as_mut_ptr().add(q0)) };
            q += TAPS_BLOCK;
            if q >= n {
                return;
            }
        }
    }
    depthwise_taps(src, taps, bias, acc)
}

/// `acc[q] = bias + Σ_taps w · src[off + q]` for `q < TAPS_BLOCK`.
///
/// # Safety
/// AVX-512 F; `src` readable at `off .. off + TAPS_BLOCK` for every tap,
/// `acc` writable for `TAPS_BLOCK` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn taps_block_avx512(src: *const f32, taps: &[(f32, usize)], bias: f32, acc: *mut f32) {
    use core::arch::x86_64::*;
    // SAFETY: per the function contract.
    unsafe {
        let mut r = [_mm512_set1_ps(bias); TAPS_BLOCK / 16];
        for &(w, off) in taps {
            let wv = _mm512_set1_ps(w);
            let x = src.add(off);
            for (i, ri) in r.iter_mut().enumerate() {
                *ri = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x.add(16 * i)), *ri);
            }
        }
        for (i, ri) in r.iter().enumerate() {
            _mm512_storeu_ps(acc.add(16 * i), *ri);
        }
    }
}

simd_dispatch! {
    /// `out += Σ_taps w[tap] · shifted(inp)` for one plane.
    fn depthwise_plane(inp: &[f32], wts: &[f32], kh: usize, kw: usize, ha: &Axis, wa: &Axis, out: &mut [f32]) {
        for ky in 0..kh {
            let oy_range = ha.valid_outputs(ky);
            for kx in 0..kw {
                let wv = wts[ky * kw + kx];
                let ox_range = wa.valid_outputs(kx);
                if ox_range.is_empty() {
                    continue;
                }
                let n = ox_range.len();
                for oy in oy_range.clone() {
                    let iy = ha.input_index(oy, ky) as usize;
                    let row = &inp[iy * wa.input..][..wa.input];
                    let ix0 = wa.input_index(ox_range.start, kx) as usize;
                    let dst = &mut out[oy * wa.output + ox_range.start..][..n];
                    if wa.stride == 1 {
                        for (o, &x) in dst.iter_mut().zip(&row[ix0..ix0 + n]) {
                            *o += wv * x;
                        }
                    } else {
                        for (j, o) in dst.iter_mut().enumerate() {
                            *o += wv * row[ix0 + j * wa.stride];
                        }
                    }
                }
            }
        }
    }
}


impl PhaseGeometry {
    /// Readies a thread's buffers for [`PhaseGeometry::depthwise_plane`]
    /// (once per task). Every plane of a layout writes the same (in-bounds)
    /// positions, so the zeros of the padding only need writing when the
    /// buffer last held another layout (another op's, or none): not per
    /// plane, nor per task. (Zeros past the phase planes: the last block
    /// of taps may read up to a block past the outputs' last window.)
    fn prepare(&self, (scratch, _, _, layout): &mut DwScratch) {
        if scratch.len() != self.len() + TAPS_BLOCK || !self.has_layout(layout) {
            scratch.clear();
            scratch.resize(self.len() + TAPS_BLOCK, 0.0);
            self.layout_key(layout);
        }
    }

    /// Computes one output plane (`bias` + the taps, no activation), the
    /// buffers readied by [`PhaseGeometry::prepare`].
    #[allow(clippy::too_many_arguments)]
    fn depthwise_plane(
        &self,
        inp: &[f32],
        wts: &[f32],
        bias: f32,
        ha: &Axis,
        wa: &Axis,
        (scratch, acc, taps, _): &mut DwScratch,
        out: &mut [f32],
    ) {
        let cols = self.cols;
        self.fill(inp, ha, wa, scratch, false);
        taps.clear();
        taps.extend(wts.iter().copied().zip(self.tap_offsets.iter().copied()));
        // Whole vectors (garbage past the last output; see `plane`), and
        // with AVX-512 at least one block of `plane_taps`.
        #[cfg(target_arch = "x86_64")]
        let least = if crate::fastmath::has_avx512() { TAPS_BLOCK } else { DW_VEC };
        #[cfg(not(target_arch = "x86_64"))]
        let least = DW_VEC;
        acc.resize((ha.output * cols).next_multiple_of(DW_VEC).max(least), 0.0);
        plane_taps(scratch, taps, bias, acc);
        for (oy, o) in out.chunks_exact_mut(wa.output).enumerate() {
            super::copy_row(o, &acc[oy * cols..]);
        }
    }
}


/// Output pixels per register block of the channel-blocked path.
const PX: usize = 8;
/// Packed input of one band, in floats (48 KB: stays in L2).
const BAND_FLOATS: usize = 12 * 1024;
/// A task's results go out every this many pixels or more (whole rows):
/// the `[pixel][lane]` buffer stays in L1, and small maps' rows leave
/// together, in whole transposes.
const FLUSH_PX: usize = 64;

/// The channel-blocked depthwise path.
///
/// A task takes one image's block of `L` channels (one vector: 8 lanes, 16
/// with AVX-512) and a band of output rows. It packs the input rows the
/// band reads into `[row][column][lane]` order, zero-padded (8×8 register
/// transposes), with the block's weights as `[tap][lane]` vectors; then
/// every output pixel is `bias + Σ_taps w[tap] · x[row + ky·dh][col +
/// kx·dw]`, one vector multiply-add per tap, [`PX`] pixels summed in
/// registers at a time, into the band's `[pixel][lane]` results (the
/// activation applied there when there is no residual); these are
/// transposed back into the channels' rows, where the band is contiguous,
/// and a residual and the activation after it are added per channel while
/// they are in cache. Stride and dilation only change which packed pixels
/// a tap reads, so every geometry runs at the same rate.
struct Blocked {
    /// Pixels per packed row: the padded input columns that the taps of
    /// whole `PX`-pixel blocks read.
    wp: usize,
    /// Offset of each tap from a pixel's first tap, in pixels, (ky, kx)
    /// order.
    tap_offsets: Vec<usize>,
}

impl Blocked {
    /// `None` for geometries whose padded rows would be much larger than
    /// the input and output (hostile paddings and dilations).
    fn new(ha: &Axis, wa: &Axis) -> Option<Blocked> {
        let blocks = wa.output.div_ceil(PX);
        let wp = (blocks * PX - 1).checked_mul(wa.stride)?.checked_add((wa.kernel - 1).checked_mul(wa.dilation)?)? + 1;
        let bound = |a: &Axis| a.input.saturating_add(a.output).saturating_mul(4).saturating_add(64);
        let one = (ha.kernel - 1).checked_mul(ha.dilation)?.checked_add(1)?;
        if wp > bound(wa) || one > bound(ha) || one.saturating_mul(wp * LANES_MAX) > 1 << 20 {
            return None;
        }
        let tap_offsets = (0..ha.kernel)
            .flat_map(|ky| (0..wa.kernel).map(move |kx| ky * ha.dilation * wp + kx * wa.dilation))
            .collect();
        Some(Blocked { wp, tap_offsets })
    }

    /// Output rows per band at `lanes` lanes: the packed rows they read fit
    /// in [`BAND_FLOATS`].
    fn band(&self, ha: &Axis, lanes: usize) -> usize {
        // (Saturating: hostile strides; `new` bounded the rest.)
        let one = (ha.kernel - 1).saturating_mul(ha.dilation).saturating_add(1);
        let fits = |band: usize| (band - 1).saturating_mul(ha.stride).saturating_add(one).saturating_mul(self.wp * lanes) <= BAND_FLOATS;
        let mut band = 1;
        while band < ha.output && fits(band + 1) {
            band += 1;
        }
        band
    }

    /// Whether blocks are 16 lanes wide: with AVX-512, on maps of up to
    /// 14×14 outputs, where a task's fixed costs (packing, transposes)
    /// weigh most; on larger maps few channels would make too few tasks,
    /// and 8 lanes measured as fast (kernels_bench, 16 / 8 lanes against
    /// the 8-lane path before: 5×5 s1 576@7 0.49 / 0.60, s2 288@14 0.46 /
    /// 0.67, 3×3 s1 960@7 0.48 / 0.61; 3×3 s2 16@112 1.08 / 0.97, 72@56
    /// 0.87 / 0.78).
    fn wide(p: &Conv2dParams, g: &Geometry) -> bool {
        #[cfg(target_arch = "x86_64")]
        if crate::fastmath::has_avx512() {
            return p.out_channels >= 16 && g.out_plane <= 14 * 14;
        }
        let _ = (p, g);
        false
    }

    #[allow(clippy::too_many_arguments)]
    fn conv<const L: usize>(
        &self,
        p: &Conv2dParams,
        g: &Geometry,
        input: &[f32],
        weight: &[f32],
        bias: Option<&[f32]>,
        residual: Option<&[f32]>,
        output: &mut [f32],
    ) {
        let (ha, wa) = (g.h, g.w);
        let channels = p.out_channels;
        let taps = p.kernel[0] * p.kernel[1];
        let cblocks = channels.div_ceil(L);
        // Small ops on the calling thread. This path runs at about a
        // quarter of a GEMM's flop rate (packing and transposes, one
        // multiply-add per tap and pixel), hence the weight.
        let seq = crate::util::sequential(output.len().saturating_mul(2 * taps).saturating_mul(4));
        let threads = crate::util::plan_threads(seq);
        // Bands small enough that every thread gets several tasks.
        let mut band = self.band(&ha, L);
        let min_tasks = 4 * threads;
        if !seq && p.batch * cblocks * ha.output.div_ceil(band) < min_tasks {
            band = band.min(ha.output.div_ceil(min_tasks.div_ceil(p.batch * cblocks))).max(1);
        }
        let bands = ha.output.div_ceil(band);
        #[cfg(target_arch = "x86_64")]
        let avx = std::arch::is_x86_feature_detected!("avx");
        #[cfg(not(target_arch = "x86_64"))]
        let avx = false;
        let out_ptr = SendPtr(output.as_mut_ptr());
        let (ow, out_plane) = (wa.output, g.out_plane);
        crate::util::for_each_task(p.batch * cblocks * bands, seq, |t| {
            let (img, rest) = (t / (cblocks * bands), t % (cblocks * bands));
            let (cb, oy0) = (rest / bands, (rest % bands) * band);
            let (c0, l0, nl) = block_lanes::<L>(cb, channels);
            let nc = l0 + nl;
            let oy1 = (oy0 + band).min(ha.output);
            let rows = (oy1 - oy0 - 1) * ha.stride + (ha.kernel - 1) * ha.dilation + 1;
            with_local(&CB_SCRATCH, |(x, acc, w)| {
                // Packed by each task (in parallel, a few hundred
                // nanoseconds): an op's weights are read once per band.
                let w = pack_weights::<L>(weight, bias, c0, nc, taps, avx, w);
                let planes = &input[(img * channels + c0) * g.in_plane..][..nc * g.in_plane];
                // Vector-aligned, so that no pixel's vector straddles two
                // cache lines.
                let n = rows * self.wp * L;
                x.resize(n + L, 0.0);
                let a = x.as_ptr().align_offset(4 * L).min(L);
                let x = &mut x[a..a + n];
                pack_rows::<L>(planes, nc, p.in_h, p.in_w, g.in_plane, oy0 * ha.stride, ha.pad_before, wa.pad_before, self.wp, avx, x);
                // Rows of results, one after another without gaps
                // ([pixel][lane]), flushed to the output every
                // `FLUSH_PX` pixels or more: a row's whole PX-pixel blocks
                // run past its end into the next row's first pixels, which
                // that row then overwrites (the last row's spill has room
                // at the end). Consecutive rows are contiguous in each
                // channel's plane, so small maps leave in whole PX-pixel
                // transposes too.
                let blocks = ow.div_ceil(PX);
                acc.resize((FLUSH_PX + ow + PX) * L, 0.0);
                let (mut q0, mut n) = (oy0 * ow, 0);
                for oy in oy0..oy1 {
                    let row = &x[(oy - oy0) * ha.stride * self.wp * L..];
                    dw_row::<L>(row, &w[..taps], &self.tap_offsets, &w[taps], wa.stride, &mut acc[n * L..(n + blocks * PX) * L]);
                    n += ow;
                    if n < FLUSH_PX && oy + 1 < oy1 {
                        continue;
                    }
                    // Without a residual (in the channels' layout) the
                    // activation runs here, on all lanes in one pass.
                    if residual.is_none() {
                        epilogue(&mut acc[..n * L], Bias::None, None, p.activation);
                    }
                    for q in (0..n).step_by(PX) {
                        // SAFETY: pixels q0 + q .. q0 + q + np of planes
                        // (img, c0 + l0 + l), l < nl, in rows oy0..oy1:
                        // inside `output`, and in this task's channels and
                        // rows only (tasks cover disjoint (image, channel
                        // block, band) triples).
                        unsafe {
                            let dst = out_ptr.get().add((img * channels + c0 + l0) * out_plane + q0 + q);
                            store_block::<L>(&acc[q * L..][..PX * L], l0, nl, PX.min(n - q), out_plane, avx, dst);
                        }
                    }
                    if let Some(residual) = residual {
                        for l in l0..nc {
                            let at = (img * channels + c0 + l) * out_plane + q0;
                            // SAFETY: as above; no other reference to
                            // these elements is live.
                            let out = unsafe { core::slice::from_raw_parts_mut(out_ptr.get().add(at), n) };
                            epilogue(out, Bias::None, Some(&residual[at..at + n]), p.activation);
                        }
                    }
                    q0 += n;
                    n = 0;
                }
            })
        });
    }
}

/// The widest block of the channel-blocked path, in lanes.
const LANES_MAX: usize = 16;

/// Channel block `cb` of `channels` at `L` lanes: the first channel its
/// lanes hold, the first lane it stores and how many. With `L` channels or
/// more, the last block is shifted back to end at the last channel (its
/// first lanes recompute the previous block's channels and are not
/// stored), so that every block packs and computes whole vectors.
fn block_lanes<const L: usize>(cb: usize, channels: usize) -> (usize, usize, usize) {
    let c0 = cb * L;
    let nc = L.min(channels - c0);
    if nc < L && channels >= L {
        (channels - L, L - nc, nc)
    } else {
        (c0, 0, nc)
    }
}

/// A channel-blocked task's buffers: packed input rows, the band's
/// `[pixel][lane]` results, the block's packed weights (room for 16
/// lanes' vectors).
type CbScratch = (Vec<f32>, Vec<f32>, Vec<[f32; LANES_MAX]>);

std::thread_local! {
    static CB_SCRATCH: core::cell::RefCell<CbScratch> = const { core::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// The weights of channels `c0 .. c0 + nc` (`nc ≤ L`) as `[tap][lane]`
/// vectors, their bias vector after the taps, in `buf`; lanes past `nc`
/// zero (never stored).
#[allow(clippy::too_many_arguments)]
fn pack_weights<'a, const L: usize>(
    weight: &[f32],
    bias: Option<&[f32]>,
    c0: usize,
    nc: usize,
    taps: usize,
    avx: bool,
    buf: &'a mut Vec<[f32; LANES_MAX]>,
) -> &'a [[f32; L]] {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = avx;
    // (taps + 1)·L floats in whole 16-float elements.
    buf.clear();
    buf.resize(((taps + 1) * L).div_ceil(LANES_MAX), [0.0; LANES_MAX]);
    let blk: &mut [[f32; L]] = as_vectors_mut(buf.as_flattened_mut(), taps + 1);
    let mut t0 = 0;
    #[cfg(target_arch = "x86_64")]
    if avx && nc == L {
        while t0 + 8 <= taps {
            for h in 0..L / 8 {
                // SAFETY: AVX was detected; reads taps t0..t0+8 of the 8
                // channels from c0 + 8h (inside `weight`: its length was
                // checked as out_channels·taps, and c0 + L ≤ channels) and
                // writes lanes 8h..8h+8 of taps t0..t0+8 of `blk` (taps + 1
                // vectors of L).
                unsafe {
                    crate::copy::transpose8x8(
                        weight.as_ptr().add((c0 + 8 * h) * taps + t0),
                        taps as isize,
                        blk.as_mut_ptr().add(t0).cast::<f32>().add(8 * h),
                        L as isize,
                    );
                }
            }
            t0 += 8;
        }
    }
    for l in 0..nc {
        for (dst, &v) in blk[t0..taps].iter_mut().zip(&weight[(c0 + l) * taps + t0..(c0 + l + 1) * taps]) {
            dst[l] = v;
        }
        blk[taps][l] = bias.map_or(0.0, |b| b[c0 + l]);
    }
    blk
}

/// The first `n` `L`-float vectors of `xs`.
fn as_vectors_mut<const L: usize>(xs: &mut [f32], n: usize) -> &mut [[f32; L]] {
    let (v, _) = xs[..n * L].as_chunks_mut::<L>();
    v
}

/// Packs `rows` padded rows, from padded row `r0` on, of the `nc ≤ L`
/// input planes at the start of `planes` into `x` as `[row][wp][L]`:
/// zeros in the padding and in lanes past `nc`.
#[allow(clippy::too_many_arguments)]
fn pack_rows<const L: usize>(planes: &[f32], nc: usize, in_h: usize, in_w: usize, in_plane: usize, r0: usize, pad_top: usize, pad_left: usize, wp: usize, avx: bool, x: &mut [f32]) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = avx;
    let left = pad_left.min(wp);
    let ncols = in_w.min(wp - left);
    for (r, dst) in x.chunks_exact_mut(wp * L).enumerate() {
        let iy = (r0 + r).wrapping_sub(pad_top);
        if r0 + r < pad_top || iy >= in_h {
            dst.fill(0.0);
            continue;
        }
        dst[..left * L].fill(0.0);
        let mut j = 0;
        #[cfg(target_arch = "x86_64")]
        if avx && nc == L {
            // Whole 8×8 transposes (L / 8 per 8 columns), the last one
            // possibly past the row's end (into the next row, or the zero
            // padding written below) when source and destination allow.
            while j < ncols && (L - 1) * in_plane + iy * in_w + j + 8 <= planes.len() && (left + j + 8) * L <= dst.len() {
                for h in 0..L / 8 {
                    // SAFETY: AVX was detected; reads columns j..j+8 from
                    // row iy of planes 8h..8h+8 and writes lanes 8h..8h+8 of
                    // packed pixels left+j..left+j+8, both bounds checked
                    // just above.
                    unsafe {
                        crate::copy::transpose8x8(
                            planes.as_ptr().add(8 * h * in_plane + iy * in_w + j),
                            in_plane as isize,
                            dst.as_mut_ptr().add((left + j) * L + 8 * h),
                            L as isize,
                        );
                    }
                }
                j += 8;
            }
        }
        if j < ncols {
            for l in 0..nc {
                let src = &planes[l * in_plane + iy * in_w + j..][..ncols - j];
                for (px, &v) in dst[(left + j) * L..].chunks_exact_mut(L).zip(src) {
                    px[l] = v;
                }
            }
            if nc < L {
                for px in dst[(left + j) * L..(left + ncols) * L].chunks_exact_mut(L) {
                    px[nc..].fill(0.0);
                }
            }
        }
        dst[(left + ncols) * L..].fill(0.0);
    }
}

/// One output row of a channel block: `acc[pixel][lane] = bias +
/// Σ_taps w[tap] · row[(pixel·stride + offset[tap])·L + lane]`, `PX`
/// pixels summed in registers at a time (`acc.len()` is a multiple of
/// `PX · L`).
fn dw_row<const L: usize>(row: &[f32], w: &[[f32; L]], offsets: &[usize], bias: &[f32; L], stride: usize, acc: &mut [f32]) {
    // One compiled body per lane count (the casts are identities).
    match L {
        8 => dw_row8(row, as_lanes::<L, 8>(w), offsets, &as_lanes::<L, 8>(core::slice::from_ref(bias))[0], stride, acc),
        _ => dw_row16(row, as_lanes::<L, 16>(w), offsets, &as_lanes::<L, 16>(core::slice::from_ref(bias))[0], stride, acc),
    }
}

/// `xs` as vectors of `M` lanes: `L == M` (checked).
fn as_lanes<const L: usize, const M: usize>(xs: &[[f32; L]]) -> &[[f32; M]] {
    assert_eq!(L, M, "lane counts differ");
    let (v, _) = xs.as_flattened().as_chunks::<M>();
    v
}

simd_dispatch! {
    /// [`dw_row`] at 8 lanes.
    fn dw_row8(row: &[f32], w: &[[f32; 8]], offsets: &[usize], bias: &[f32; 8], stride: usize, acc: &mut [f32]) {
        dw_row_lanes::<FMA, 8>(row, w, offsets, bias, stride, acc)
    }
}

/// [`dw_row`] at 16 lanes: AVX-512 only (the only ISA that runs 16-lane
/// blocks), written with intrinsics (LLVM vectorizes the generic body
/// across pixels, with gathers).
fn dw_row16(row: &[f32], w: &[[f32; 16]], offsets: &[usize], bias: &[f32; 16], stride: usize, acc: &mut [f32]) {
    let blocks = acc.len() / (PX * 16);
    // Every pixel vector read: ((block·PX + p)·stride + offset)·16 + 16.
    let max_off = offsets.iter().copied().max().unwrap_or(0);
    let end = (blocks * PX).saturating_sub(1).saturating_mul(stride).saturating_add(max_off).saturating_add(1).saturating_mul(16);
    #[cfg(target_arch = "x86_64")]
    if crate::fastmath::has_avx512() && w.len() == offsets.len() && end <= row.len() {
        // SAFETY: AVX-512 F is present; every read lies in `row` (checked
        // just above), `w` has one vector per offset, and the stores are
        // the `blocks` whole PX·16 blocks of `acc`.
        unsafe { dw_row16_avx512(row.as_ptr(), w, offsets, bias, stride, acc.as_mut_ptr(), blocks) };
        return;
    }
    // Not reached (16-lane blocks run with AVX-512 only, and every
    // window lies in its packed rows); fused as the path above.
    dw_row_lanes::<true, 16>(row, w, offsets, bias, stride, acc)
}

/// # Safety
/// AVX-512 F; `row` readable at every `((bk·PX + p)·stride + offset)·16 ..
/// + 16` for `bk < blocks`, `p < PX`; `acc` writable for `blocks·PX·16`
/// floats; `w.len() == offsets.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dw_row16_avx512(row: *const f32, w: &[[f32; 16]], offsets: &[usize], bias: &[f32; 16], stride: usize, acc: *mut f32, blocks: usize) {
    use core::arch::x86_64::*;
    let step = stride * 16;
    // SAFETY: per the function contract.
    unsafe {
        let b = _mm512_loadu_ps(bias.as_ptr());
        for bk in 0..blocks {
            let base = row.add(bk * PX * step);
            let mut r = [b; PX];
            for (wt, &off) in w.iter().zip(offsets) {
                let wv = _mm512_loadu_ps(wt.as_ptr());
                let x = base.add(off * 16);
                for (p, rp) in r.iter_mut().enumerate() {
                    *rp = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x.add(p * step)), *rp);
                }
            }
            for (p, rp) in r.iter().enumerate() {
                _mm512_storeu_ps(acc.add((bk * PX + p) * 16), *rp);
            }
        }
    }
}

#[inline(always)]
fn dw_row_lanes<const FMA: bool, const L: usize>(row: &[f32], w: &[[f32; L]], offsets: &[usize], bias: &[f32; L], stride: usize, acc: &mut [f32]) {
    // A constant pixel step lets every tap's loads be checked once.
    match stride {
        1 => dw_row_step::<FMA, L, 1>(row, w, offsets, bias, acc),
        2 => dw_row_step::<FMA, L, 2>(row, w, offsets, bias, acc),
        _ => {
            for (bk, out) in acc.chunks_exact_mut(PX * L).enumerate() {
                let base = bk * PX * stride;
                let mut r = [*bias; PX];
                for (wt, &off) in w.iter().zip(offsets) {
                    for (p, rp) in r.iter_mut().enumerate() {
                        let v = &row[(base + off + p * stride) * L..][..L];
                        for l in 0..L {
                            rp[l] = madd::<FMA>(wt[l], v[l], rp[l]);
                        }
                    }
                }
                for (o, rp) in out.chunks_exact_mut(L).zip(&r) {
                    o.copy_from_slice(rp);
                }
            }
        }
    }
}

/// [`dw_row`] for a pixel stride of `S`.
#[inline(always)]
fn dw_row_step<const FMA: bool, const L: usize, const S: usize>(row: &[f32], w: &[[f32; L]], offsets: &[usize], bias: &[f32; L], acc: &mut [f32]) {
    for (bk, out) in acc.chunks_exact_mut(PX * L).enumerate() {
        let base = bk * PX * S;
        let mut r = [*bias; PX];
        for (wt, &off) in w.iter().zip(offsets) {
            let xs = &row[(base + off) * L..][..((PX - 1) * S + 1) * L];
            for (p, rp) in r.iter_mut().enumerate() {
                for l in 0..L {
                    rp[l] = madd::<FMA>(wt[l], xs[p * S * L + l], rp[l]);
                }
            }
        }
        for (o, rp) in out.chunks_exact_mut(L).zip(&r) {
            o.copy_from_slice(rp);
        }
    }
}

/// Writes lanes `l0..l0 + nc` of a `[pixel][lane]` block's first `np`
/// pixels to the channels' rows at `dst` (lane `l0 + l`, pixel `p` at
/// `dst + l·plane + p`).
///
/// # Safety
/// Those `nc × np` destination elements must be writable, and not
/// accessed by anyone else meanwhile.
unsafe fn store_block<const L: usize>(blk: &[f32], l0: usize, nc: usize, np: usize, plane: usize, avx: bool, dst: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    if avx {
        if l0 == 0 && nc == L && np == PX {
            for h in 0..L / 8 {
                // SAFETY: AVX was detected; `blk` holds PX·L elements (lanes
                // 8h..8h+8 of each pixel read) and the 8 destination rows
                // of 8 from channel 8h are writable per the contract.
                unsafe { crate::copy::transpose8x8(blk.as_ptr().add(8 * h), L as isize, dst.add(8 * h * plane), plane as isize) };
            }
            return;
        }
        let mut t = [0.0f32; PX * LANES_MAX];
        for h in 0..L / 8 {
            // SAFETY: AVX was detected; reads lanes 8h..8h+8 of PX pixels
            // of `blk`, writes rows 8h..8h+8 of PX elements of `t` (PX·16
            // elements).
            unsafe { crate::copy::transpose8x8(blk.as_ptr().add(8 * h), L as isize, t.as_mut_ptr().add(8 * h * PX), PX as isize) };
        }
        for (l, row) in t.chunks_exact(PX).skip(l0).take(nc).enumerate() {
            for (p, &v) in row[..np].iter().enumerate() {
                // SAFETY: per the contract (lane l < nc, pixel p < np).
                unsafe { *dst.add(l * plane + p) = v };
            }
        }
        return;
    }
    let _ = avx;
    for l in 0..nc {
        for p in 0..np {
            // SAFETY: per the contract (l < nc, p < np).
            unsafe { *dst.add(l * plane + p) = blk[p * L + l0 + l] };
        }
    }
}
