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
/// Fast path: the (zero-padded) input plane is split into its stride
/// phases, so that every tap reads a contiguous shifted window of one phase
/// plane; the output is computed over the flattened phase-plane grid (a few
/// garbage columns per row, dropped afterwards) in register-blocked chunks
/// that sum all taps before storing. Geometries whose phase planes would be
/// much larger than the input and output (hostile dilations / paddings)
/// take the generic per-tap loop.
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
    let phased = PhaseGeometry::new(&ha, &wa, g.in_plane, g.out_plane);
    let planes = output.len() / g.out_plane.max(1);
    // Small convolutions as one task, on the calling thread. Depthwise
    // work runs at about an eighth of a GEMM's flop rate, hence the weight.
    let flops = output.len().saturating_mul(2 * kh * kw).saturating_mul(8);
    let seq = crate::util::sequential(flops);
    // Tasks of whole planes, about 16 K outputs each, and enough of them
    // for the threads to share.
    let threads = crate::util::plan_threads(seq);
    let per_task = if seq { planes.max(1) } else { (16_384 / g.out_plane.max(1)).min(planes.div_ceil(8 * threads)).max(1) };
    let out_ptr = SendPtr(output.as_mut_ptr());
    for_each_task(planes.div_ceil(per_task), seq, |t| {
        with_local(&DW_SCRATCH, |bufs| {
            for plane_idx in t * per_task..((t + 1) * per_task).min(planes) {
                // SAFETY: plane `plane_idx` of `output` (planes·out_plane =
                // output.len()); tasks cover disjoint planes.
                let out = unsafe { core::slice::from_raw_parts_mut(out_ptr.get().add(plane_idx * g.out_plane), g.out_plane) };
                let b = plane_idx / p.out_channels;
                let co = plane_idx % p.out_channels;
                let ci = co / g.og; // group index == input channel within group 0
                let inp = &input[(b * p.in_channels + ci) * g.in_plane..][..g.in_plane];
                let wts = &weight[co * kh * kw..][..kh * kw];
                let bv = bias.map_or(0.0, |b| b[co]);
                match &phased {
                    Some(ph) => ph.depthwise_plane(inp, wts, bv, &ha, &wa, bufs, out),
                    None => {
                        out.fill(bv);
                        depthwise_plane(inp, wts, kh, kw, &ha, &wa, out);
                    }
                }
                let res = residual.map(|r| &r[plane_idx * g.out_plane..][..g.out_plane]);
                epilogue(out, Bias::None, res, p.activation);
            }
        })
    });
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
    /// Computes one output plane (`bias` + the taps, no activation).
    #[allow(clippy::too_many_arguments)]
    fn depthwise_plane(
        &self,
        inp: &[f32],
        wts: &[f32],
        bias: f32,
        ha: &Axis,
        wa: &Axis,
        (scratch, acc, taps, layout): &mut DwScratch,
        out: &mut [f32],
    ) {
        let cols = self.cols;
        // Every plane of a layout writes the same (in-bounds) positions, so
        // the zeros of the padding only need writing when the buffer last
        // held another layout (another op's, or none): not per plane, nor
        // per task.
        if scratch.len() != self.len() || !self.has_layout(layout) {
            scratch.clear();
            scratch.resize(self.len(), 0.0);
            self.layout_key(layout);
        }
        self.fill(inp, ha, wa, scratch, false);
        taps.clear();
        taps.extend(wts.iter().copied().zip(self.tap_offsets.iter().copied()));
        // Whole vectors (garbage past the last output; see `plane`).
        acc.resize((ha.output * cols).next_multiple_of(DW_VEC), 0.0);
        depthwise_taps(scratch, taps, bias, acc);
        for (oy, o) in out.chunks_exact_mut(wa.output).enumerate() {
            o.copy_from_slice(&acc[oy * cols..][..wa.output]);
        }
    }
}
