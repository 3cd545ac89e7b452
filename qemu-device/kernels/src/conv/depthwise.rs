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
/// Depthwise proper (one output channel per input channel) runs
/// channel-blocked ([`Blocked`]): eight channels side by side in the
/// vector lanes, so that every tap is one vector multiply-add per output
/// pixel whatever the plane's size. Channel multipliers (several outputs
/// per input channel) and hostile geometries take the per-plane paths:
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
    if g.og == 1 {
        if let Some(b) = Blocked::new(&ha, &wa) {
            b.conv(p, g, input, weight, bias, residual, output);
            return;
        }
    }
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


/// Channels per block of the channel-blocked path: one AVX2 vector.
const CB: usize = 8;
/// Output pixels per register block of the channel-blocked path.
const PX: usize = 8;
/// Packed input of one band, in floats (48 KB: stays in L2).
const BAND_FLOATS: usize = 12 * 1024;

/// The channel-blocked depthwise path.
///
/// A task takes one image's block of [`CB`] channels and a band of output
/// rows. It packs the input rows the band reads into `[row][column][lane]`
/// order, zero-padded (8×8 register transposes), with the block's weights
/// as `[tap][lane]` vectors; then every output pixel is
/// `bias + Σ_taps w[tap] · x[row + ky·dh][col + kx·dw]`, one vector
/// multiply-add per tap, [`PX`] pixels summed in registers at a time; the
/// `[pixel][lane]` results are transposed back into the channels' rows,
/// and the epilogue (residual, activation) runs on each channel's rows of
/// the band while they are in cache. Stride and dilation only change which
/// packed pixels a tap reads, so every geometry runs at the same rate.
struct Blocked {
    /// Pixels per packed row: the padded input columns that the taps of
    /// whole `PX`-pixel blocks read.
    wp: usize,
    /// Output rows per band.
    band: usize,
    /// Offset of each tap from a pixel's first tap, in floats, (ky, kx)
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
        if wp > bound(wa) || one > bound(ha) || one.saturating_mul(wp * CB) > 1 << 20 {
            return None;
        }
        // Packed floats of a band of `band` output rows.
        let floats = |band: usize| (band - 1).saturating_mul(ha.stride).saturating_add(one).saturating_mul(wp * CB);
        let mut band = 1;
        while band < ha.output && floats(band + 1) <= BAND_FLOATS {
            band += 1;
        }
        let tap_offsets = (0..ha.kernel)
            .flat_map(|ky| (0..wa.kernel).map(move |kx| (ky * ha.dilation * wp + kx * wa.dilation) * CB))
            .collect();
        Some(Blocked { wp, band, tap_offsets })
    }

    #[allow(clippy::too_many_arguments)]
    fn conv(
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
        let cblocks = channels.div_ceil(CB);
        // Small ops on the calling thread. This path runs at about a
        // quarter of a GEMM's flop rate (packing and transposes, one
        // multiply-add per tap and pixel), hence the weight.
        let seq = crate::util::sequential(output.len().saturating_mul(2 * taps).saturating_mul(4));
        let threads = crate::util::plan_threads(seq);
        // Bands small enough that every thread gets several tasks.
        let mut band = self.band;
        let min_tasks = 4 * threads;
        if !seq && p.batch * cblocks * ha.output.div_ceil(band) < min_tasks {
            band = band.min(ha.output.div_ceil(min_tasks.div_ceil(p.batch * cblocks))).max(1);
        }
        let bands = ha.output.div_ceil(band);
        #[cfg(target_arch = "x86_64")]
        let avx = std::arch::is_x86_feature_detected!("avx");
        #[cfg(not(target_arch = "x86_64"))]
        let avx = false;
        // [block][tap][lane] weights, each block's bias vector after its
        // taps; lanes past the last channel are zero and never stored.
        let mut packed_buf = with_local(&CB_WEIGHTS, core::mem::take);
        packed_buf.clear();
        packed_buf.resize(cblocks * (taps + 1), [0.0; CB]);
        for (cb, blk) in packed_buf.chunks_exact_mut(taps + 1).enumerate() {
            let (c0, l0, nc) = block_lanes(cb, channels);
            let nc = l0 + nc;
            let mut t0 = 0;
            #[cfg(target_arch = "x86_64")]
            if avx && nc == CB {
                while t0 + 8 <= taps {
                    // SAFETY: AVX was detected; reads taps t0..t0+8 of the
                    // block's 8 channels (inside `weight`: its length was
                    // checked as out_channels·taps) and writes taps
                    // t0..t0+8 of `blk` (taps + 1 vectors of 8).
                    unsafe {
                        crate::copy::transpose8x8(
                            weight.as_ptr().add(c0 * taps + t0),
                            taps as isize,
                            blk.as_mut_ptr().add(t0).cast::<f32>(),
                            CB as isize,
                        );
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
        }
        let packed = &packed_buf;
        let out_ptr = SendPtr(output.as_mut_ptr());
        let (ow, out_plane) = (wa.output, g.out_plane);
        crate::util::for_each_task(p.batch * cblocks * bands, seq, |t| {
            let (img, rest) = (t / (cblocks * bands), t % (cblocks * bands));
            let (cb, oy0) = (rest / bands, (rest % bands) * band);
            let (c0, l0, nl) = block_lanes(cb, channels);
            let nc = l0 + nl;
            let oy1 = (oy0 + band).min(ha.output);
            let rows = (oy1 - oy0 - 1) * ha.stride + (ha.kernel - 1) * ha.dilation + 1;
            let w = &packed[cb * (taps + 1)..][..taps + 1];
            with_local(&CB_SCRATCH, |(x, acc)| {
                let planes = &input[(img * channels + c0) * g.in_plane..][..nc * g.in_plane];
                // 32-byte aligned, so that no pixel's vector straddles two
                // cache lines.
                let n = rows * self.wp * CB;
                x.resize(n + CB, 0.0);
                let a = x.as_ptr().align_offset(32).min(CB);
                let x = &mut x[a..a + n];
                pack_rows(planes, nc, p.in_h, p.in_w, g.in_plane, oy0 * ha.stride, ha.pad_before, wa.pad_before, self.wp, avx, x);
                let blocks = ow.div_ceil(PX);
                acc.resize(blocks * PX * CB, 0.0);
                for oy in oy0..oy1 {
                    let row = &x[(oy - oy0) * ha.stride * self.wp * CB..];
                    dw_row(row, &w[..taps], &self.tap_offsets, &w[taps], wa.stride * CB, acc);
                    for bk in 0..blocks {
                        let ox0 = bk * PX;
                        let blk = &acc[bk * PX * CB..][..PX * CB];
                        // SAFETY: output element (img, c0 + l, oy, ox) with
                        // l < nc, ox < ow: inside `output`, and in this
                        // task's channels and rows only (tasks cover
                        // disjoint (image, channel block, band) triples).
                        unsafe {
                            let dst = out_ptr.get().add((img * channels + c0 + l0) * out_plane + oy * ow + ox0);
                            store_block(blk, l0, nl, PX.min(ow - ox0), out_plane, avx, dst);
                        }
                    }
                }
                for l in l0..nc {
                    let at = (img * channels + c0 + l) * out_plane + oy0 * ow;
                    let n = (oy1 - oy0) * ow;
                    // SAFETY: rows oy0..oy1 of plane (img, c0 + l): inside
                    // `output` and this task's alone (see above); no other
                    // reference to them is live.
                    let out = unsafe { core::slice::from_raw_parts_mut(out_ptr.get().add(at), n) };
                    epilogue(out, Bias::None, residual.map(|r| &r[at..at + n]), p.activation);
                }
            })
        });
        with_local(&CB_WEIGHTS, |v| *v = packed_buf);
    }
}

/// Channel block `cb` of `channels`: the first channel its lanes hold, the
/// first lane it stores and how many. With 8 channels or more, the last
/// block is shifted back to end at the last channel (its first lanes
/// recompute the previous block's channels and are not stored), so that
/// every block packs and computes whole vectors.
fn block_lanes(cb: usize, channels: usize) -> (usize, usize, usize) {
    let c0 = cb * CB;
    let nc = CB.min(channels - c0);
    if nc < CB && channels >= CB {
        (channels - CB, CB - nc, nc)
    } else {
        (c0, 0, nc)
    }
}

/// A channel-blocked task's buffers: packed input rows, one output row's
/// `[pixel][lane]` results.
type CbScratch = (Vec<f32>, Vec<f32>);

std::thread_local! {
    static CB_SCRATCH: core::cell::RefCell<CbScratch> = const { core::cell::RefCell::new((Vec::new(), Vec::new())) };
    /// The op's packed weights, kept by the thread that ran the last op.
    static CB_WEIGHTS: core::cell::RefCell<Vec<[f32; CB]>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// Packs `rows` padded rows, from padded row `r0` on, of the `nc ≤ CB`
/// input planes at the start of `planes` into `x` as `[row][wp][CB]`:
/// zeros in the padding and in lanes past `nc`.
#[allow(clippy::too_many_arguments)]
fn pack_rows(planes: &[f32], nc: usize, in_h: usize, in_w: usize, in_plane: usize, r0: usize, pad_top: usize, pad_left: usize, wp: usize, avx: bool, x: &mut [f32]) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = avx;
    let left = pad_left.min(wp);
    let ncols = in_w.min(wp - left);
    for (r, dst) in x.chunks_exact_mut(wp * CB).enumerate() {
        let iy = (r0 + r).wrapping_sub(pad_top);
        if r0 + r < pad_top || iy >= in_h {
            dst.fill(0.0);
            continue;
        }
        dst[..left * CB].fill(0.0);
        let mut j = 0;
        #[cfg(target_arch = "x86_64")]
        if avx && nc == CB {
            // Whole 8×8 transposes, the last one possibly past the row's
            // end (into the next row, or the zero padding written below)
            // when source and destination allow.
            while j < ncols && (CB - 1) * in_plane + iy * in_w + j + 8 <= planes.len() && (left + j + 8) * CB <= dst.len() {
                // SAFETY: AVX was detected; reads columns j..j+8 from row
                // iy of the 8 planes and writes packed pixels
                // left+j..left+j+8, both bounds checked just above.
                unsafe {
                    crate::copy::transpose8x8(
                        planes.as_ptr().add(iy * in_w + j),
                        in_plane as isize,
                        dst.as_mut_ptr().add((left + j) * CB),
                        CB as isize,
                    );
                }
                j += 8;
            }
        }
        if j < ncols {
            for l in 0..nc {
                let src = &planes[l * in_plane + iy * in_w + j..][..ncols - j];
                for (px, &v) in dst[(left + j) * CB..].chunks_exact_mut(CB).zip(src) {
                    px[l] = v;
                }
            }
            if nc < CB {
                for px in dst[(left + j) * CB..(left + ncols) * CB].chunks_exact_mut(CB) {
                    px[nc..].fill(0.0);
                }
            }
        }
        dst[(left + ncols) * CB..].fill(0.0);
    }
}

simd_dispatch! {
    /// One output row of a channel block: `acc[pixel][lane] = bias +
    /// Σ_taps w[tap] · row[pixel·step + offset[tap]]`, `PX` pixels summed
    /// in registers at a time (`acc.len()` is a multiple of `PX · CB`).
    fn dw_row(row: &[f32], w: &[[f32; CB]], offsets: &[usize], bias: &[f32; CB], step: usize, acc: &mut [f32]) {
        // A constant pixel step lets every tap's loads be checked once.
        match step {
            CB => dw_row_step::<FMA, CB>(row, w, offsets, bias, acc),
            S2 => dw_row_step::<FMA, S2>(row, w, offsets, bias, acc),
            _ => {
                for (bk, out) in acc.chunks_exact_mut(PX * CB).enumerate() {
                    let base = bk * PX * step;
                    let mut r = [*bias; PX];
                    for (wt, &off) in w.iter().zip(offsets) {
                        let xs = &row[base + off..];
                        for (p, rp) in r.iter_mut().enumerate() {
                            let v = &xs[p * step..][..CB];
                            for l in 0..CB {
                                rp[l] = madd::<FMA>(wt[l], v[l], rp[l]);
                            }
                        }
                    }
                    for (o, rp) in out.chunks_exact_mut(CB).zip(&r) {
                        o.copy_from_slice(rp);
                    }
                }
            }
        }
    }
}

/// Pixel step of stride 2.
const S2: usize = 2 * CB;

/// [`dw_row`] for a pixel step of `STEP` floats.
#[inline(always)]
fn dw_row_step<const FMA: bool, const STEP: usize>(row: &[f32], w: &[[f32; CB]], offsets: &[usize], bias: &[f32; CB], acc: &mut [f32]) {
    for (bk, out) in acc.chunks_exact_mut(PX * CB).enumerate() {
        let base = bk * PX * STEP;
        let mut r = [*bias; PX];
        for (wt, &off) in w.iter().zip(offsets) {
            let xs = &row[base + off..][..(PX - 1) * STEP + CB];
            for (p, rp) in r.iter_mut().enumerate() {
                for l in 0..CB {
                    rp[l] = madd::<FMA>(wt[l], xs[p * STEP + l], rp[l]);
                }
            }
        }
        for (o, rp) in out.chunks_exact_mut(CB).zip(&r) {
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
unsafe fn store_block(blk: &[f32], l0: usize, nc: usize, np: usize, plane: usize, avx: bool, dst: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    if avx {
        if l0 == 0 && nc == CB && np == PX {
            // SAFETY: AVX was detected; `blk` holds PX·CB = 64 elements and
            // the 8 destination rows of 8 are writable per the contract.
            unsafe { crate::copy::transpose8x8(blk.as_ptr(), CB as isize, dst, plane as isize) };
            return;
        }
        let mut t = [0.0f32; PX * CB];
        // SAFETY: AVX was detected; both hold 64 elements.
        unsafe { crate::copy::transpose8x8(blk.as_ptr(), CB as isize, t.as_mut_ptr(), PX as isize) };
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
            unsafe { *dst.add(l * plane + p) = blk[p * CB + l0 + l] };
        }
    }
}
