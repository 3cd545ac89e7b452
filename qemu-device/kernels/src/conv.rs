//! 2-D convolution (NCHW) with fused bias and activation.

use crate::activation::{epilogue, Activation, Bias};
use crate::error::{KernelError, Result};
use crate::fastmath::{madd, simd_dispatch};
use crate::microkernel::{gemm_packed, pack_b, packed_len, MatA, NR};
use crate::util::{add, check_len, mul, valid_range, volume, with_scratch, SendPtr};
use rayon::prelude::*;

/// Explicit padding of the two spatial dimensions, in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Padding2d {
    pub top: usize,
    pub left: usize,
    pub bottom: usize,
    pub right: usize,
}

impl Padding2d {
    /// The same padding on all four sides.
    pub fn uniform(p: usize) -> Self {
        Padding2d {
            top: p,
            left: p,
            bottom: p,
            right: p,
        }
    }
}

/// Parameters of [`conv2d`].
///
/// Shapes: input `[batch, in_channels, in_h, in_w]`, weight
/// `[out_channels, in_channels / groups, kernel[0], kernel[1]]`, bias
/// `[out_channels]`, output `[batch, out_channels, out_h, out_w]` with
/// `out = (in + pad_before + pad_after - dilation·(kernel-1) - 1) / stride + 1`
/// (floor). `[h, w]` order for all pairs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conv2dParams {
    pub batch: usize,
    pub in_channels: usize,
    pub in_h: usize,
    pub in_w: usize,
    pub out_channels: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: Padding2d,
    pub dilation: [usize; 2],
    /// Must divide both channel counts (`groups = in_channels = out_channels`
    /// is depthwise).
    pub groups: usize,
    pub activation: Activation,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams {
            batch: 1,
            in_channels: 1,
            in_h: 1,
            in_w: 1,
            out_channels: 1,
            kernel: [1, 1],
            stride: [1, 1],
            padding: Padding2d::default(),
            dilation: [1, 1],
            groups: 1,
            activation: Activation::None,
        }
    }
}

/// One spatial dimension's window geometry, validated.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Axis {
    pub input: usize,
    pub pad_before: usize,
    pub kernel: usize,
    pub stride: usize,
    pub dilation: usize,
    pub output: usize,
}

impl Axis {
    /// Validates a window geometry. The whole padded extent must fit in
    /// `isize` so that all window arithmetic below is overflow-free.
    pub(crate) fn new(
        what: &'static str,
        input: usize,
        pad_before: usize,
        pad_after: usize,
        kernel: usize,
        stride: usize,
        dilation: usize,
    ) -> Result<Axis> {
        if kernel == 0 {
            return Err(KernelError::invalid(what, "kernel size is zero"));
        }
        if stride == 0 {
            return Err(KernelError::invalid(what, "stride is zero"));
        }
        if dilation == 0 {
            return Err(KernelError::invalid(what, "dilation is zero"));
        }
        let padded = add(what, add(what, input, pad_before)?, pad_after)?;
        if padded > isize::MAX as usize {
            return Err(KernelError::Overflow { what });
        }
        let extent = add(what, mul(what, dilation, kernel - 1)?, 1)?;
        if extent > padded {
            return Err(KernelError::invalid(
                what,
                format!("window extent {extent} exceeds padded input size {padded}"),
            ));
        }
        Ok(Axis {
            input,
            pad_before,
            kernel,
            stride,
            dilation,
            output: (padded - extent) / stride + 1,
        })
    }

    /// Input coordinate of tap 0 of output position `o`, minus padding.
    #[inline(always)]
    pub(crate) fn base(&self, o: usize) -> isize {
        (o * self.stride) as isize - self.pad_before as isize
    }

    /// Range of output positions `o` for which tap `t` reads a real input.
    #[inline(always)]
    pub(crate) fn valid_outputs(&self, t: usize) -> core::ops::Range<usize> {
        let base = (t * self.dilation) as isize - self.pad_before as isize;
        valid_range(base, self.stride, self.output, self.input)
    }

    /// Input index of tap `t` of output `o` (only meaningful when valid).
    #[inline(always)]
    pub(crate) fn input_index(&self, o: usize, t: usize) -> isize {
        self.base(o) + (t * self.dilation) as isize
    }
}

/// Validated conv geometry.
struct Geometry {
    h: Axis,
    w: Axis,
    cg: usize,
    og: usize,
    in_plane: usize,
    out_plane: usize,
    kdim: usize,
}

fn geometry(p: &Conv2dParams) -> Result<Geometry> {
    let pad = p.padding;
    let h = Axis::new("conv2d height", p.in_h, pad.top, pad.bottom, p.kernel[0], p.stride[0], p.dilation[0])?;
    let w = Axis::new("conv2d width", p.in_w, pad.left, pad.right, p.kernel[1], p.stride[1], p.dilation[1])?;
    if p.groups == 0 {
        return Err(KernelError::invalid("conv2d groups", "groups is zero"));
    }
    if !p.in_channels.is_multiple_of(p.groups) || !p.out_channels.is_multiple_of(p.groups) {
        return Err(KernelError::invalid(
            "conv2d groups",
            format!(
                "groups {} does not divide in_channels {} and out_channels {}",
                p.groups, p.in_channels, p.out_channels
            ),
        ));
    }
    let cg = p.in_channels / p.groups;
    let kdim = volume("conv2d weight", &[cg, p.kernel[0], p.kernel[1]])?;
    Ok(Geometry {
        h,
        w,
        cg,
        og: p.out_channels / p.groups,
        in_plane: mul("conv2d input", p.in_h, p.in_w)?,
        out_plane: mul("conv2d output", h.output, w.output)?,
        kdim,
    })
}

/// Output shape `[batch, out_channels, out_h, out_w]` of `p`, validating it.
pub fn conv2d_output_shape(p: &Conv2dParams) -> Result<[usize; 4]> {
    let g = geometry(p)?;
    Ok([p.batch, p.out_channels, g.h.output, g.w.output])
}

/// Target size of one task's output tile (and im2col chunk), in elements
/// (256 KiB: both stay in L2 while the GEMM runs); output positions are
/// tiled to fit.
const TILE_BUDGET: usize = 1 << 16;
/// Reduction rows per im2col chunk: bounds a task's buffer to
/// `KCHUNK × tile` whatever the kernel size.
const KCHUNK: usize = 512;
/// Largest tile of output positions (`TILE_BUDGET / KCHUNK`).
const MAX_TILE: usize = TILE_BUDGET / KCHUNK;

/// `output = act(conv(input, weight) + bias)`; see [`Conv2dParams`] for shapes.
///
/// Convolutions with more than one input channel per group run as parallel
/// tasks of (image, group, tile of output positions), each an im2col into a
/// cache-sized buffer plus a GEMM (1×1 stride-1 unpadded ones skip
/// im2col); those with one input channel per group (depthwise) use a direct
/// SIMD loop parallel over output planes. Runs on the current rayon pool.
pub fn conv2d(p: &Conv2dParams, input: &[f32], weight: &[f32], bias: Option<&[f32]>, output: &mut [f32]) -> Result<()> {
    conv2d_residual(p, input, weight, bias, None, output)
}

/// `output = act(conv(input, weight) + bias + residual)`: [`conv2d`] with a
/// residual (skip connection) of the output's shape (NCHW, same layout)
/// added in the same pass as the bias, before the activation, while each
/// output tile is still in cache.
pub fn conv2d_residual(
    p: &Conv2dParams,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    output: &mut [f32],
) -> Result<()> {
    let g = geometry(p)?;
    check_len("conv2d input", input.len(), volume("conv2d input", &[p.batch, p.in_channels, g.in_plane])?)?;
    check_len("conv2d weight", weight.len(), mul("conv2d weight", p.out_channels, g.kdim)?)?;
    check_len("conv2d output", output.len(), volume("conv2d output", &[p.batch, p.out_channels, g.out_plane])?)?;
    if let Some(b) = bias {
        check_len("conv2d bias", b.len(), p.out_channels)?;
    }
    if let Some(r) = residual {
        check_len("conv2d residual", r.len(), output.len())?;
    }
    if output.is_empty() {
        return Ok(());
    }
    if g.cg == 1 {
        direct(p, &g, input, weight, bias, residual, output);
    } else {
        im2col_gemm(p, &g, input, weight, bias, residual, output);
    }
    Ok(())
}

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
fn direct(
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
    let planes_per_task = (16_384 / g.out_plane.max(1)).max(1);
    output
        .par_chunks_mut(g.out_plane)
        .with_min_len(planes_per_task)
        .enumerate()
        .for_each_init(
            || (Vec::new(), Vec::new(), Vec::new()),
            |(scratch, acc, taps): &mut (Vec<f32>, Vec<f32>, Vec<(f32, usize)>), (plane_idx, out)| {
                let b = plane_idx / p.out_channels;
                let co = plane_idx % p.out_channels;
                let ci = co / g.og; // group index == input channel within group 0
                let inp = &input[(b * p.in_channels + ci) * g.in_plane..][..g.in_plane];
                let wts = &weight[co * kh * kw..][..kh * kw];
                let bv = bias.map_or(0.0, |b| b[co]);
                match &phased {
                    Some(ph) => ph.plane(inp, wts, bv, &ha, &wa, scratch, acc, taps, out),
                    None => {
                        out.fill(bv);
                        depthwise_plane(inp, wts, kh, kw, &ha, &wa, out);
                    }
                }
                let res = residual.map(|r| &r[plane_idx * g.out_plane..][..g.out_plane]);
                epilogue(out, Bias::None, res, p.activation);
            },
        );
}

/// Layout of the stride-phase planes of the depthwise fast path; all the
/// index arithmetic is done once per call, not per plane.
struct PhaseGeometry {
    /// Columns of a phase plane.
    cols: usize,
    /// Elements per phase plane (with one spare row of zeros).
    plane: usize,
    /// How each phase plane is filled from the input plane.
    fills: Vec<PhaseFill>,
    /// Scratch offset of each tap's window, in (ky, kx) order.
    tap_offsets: Vec<usize>,
}

/// Rows `rows` of a phase plane (at scratch offset `base`) take, at columns
/// `cols`, input row `iy0 + (i - rows.start)·sh` from column `ix0` with step `sw`.
struct PhaseFill {
    base: usize,
    rows: core::ops::Range<usize>,
    cols: core::ops::Range<usize>,
    iy0: usize,
    ix0: usize,
}

impl PhaseGeometry {
    fn new(ha: &Axis, wa: &Axis, in_plane: usize, out_plane: usize) -> Option<PhaseGeometry> {
        // Tap t reads phase (t·d) % s at offset (t·d) / s. t·d ≤ the padded
        // extent, which fits in isize (see `Axis::new`).
        let off_y = (ha.kernel - 1) * ha.dilation / ha.stride;
        let off_x = (wa.kernel - 1) * wa.dilation / wa.stride;
        let rows = ha.output.checked_add(off_y)?;
        let cols = wa.output.checked_add(off_x)?;
        // One spare row plus DW_VEC elements: reads of the garbage outputs
        // that round the flattened grid up to whole vectors stay in the plane.
        let plane = rows.checked_add(1)?.checked_mul(cols)?.checked_add(DW_VEC)?;
        // The kernel area is bounded by the (validated) weight length.
        let mut phases: Vec<(usize, usize)> = Vec::new();
        let mut tap_phase = Vec::with_capacity(ha.kernel * wa.kernel);
        for ky in 0..ha.kernel {
            for kx in 0..wa.kernel {
                let (ty, tx) = (ky * ha.dilation, kx * wa.dilation);
                let ph = (ty % ha.stride, tx % wa.stride);
                let pi = match phases.iter().position(|&q| q == ph) {
                    Some(pi) => pi,
                    None if phases.len() == 16 => return None,
                    None => {
                        phases.push(ph);
                        phases.len() - 1
                    }
                };
                tap_phase.push((pi, ty / ha.stride, tx / wa.stride));
            }
        }
        let total = plane.checked_mul(phases.len())?;
        // Only when the scratch stays comparable to the real data.
        let limit = in_plane.saturating_add(out_plane).saturating_mul(4).max(1 << 12);
        if total > limit {
            return None;
        }
        let tap_offsets = tap_phase.iter().map(|&(pi, oy, ox)| pi * plane + oy * cols + ox).collect();
        let fills = phases
            .iter()
            .enumerate()
            .map(|(pi, &(py, px))| {
                // Phase-plane row i is padded row i·sh + py, column j padded
                // column j·sw + px; only the in-bounds ones are non-zero.
                let iv = valid_range(py as isize - ha.pad_before as isize, ha.stride, rows, ha.input);
                let jv = valid_range(px as isize - wa.pad_before as isize, wa.stride, cols, wa.input);
                // For a non-empty range the first row / column is a real
                // input index (so the arithmetic cannot overflow); an empty
                // one is never read.
                let first = |r: &core::ops::Range<usize>, a: &Axis, ph: usize| {
                    if r.is_empty() {
                        0
                    } else {
                        r.start * a.stride + ph - a.pad_before
                    }
                };
                PhaseFill {
                    base: pi * plane,
                    iy0: first(&iv, ha, py),
                    ix0: first(&jv, wa, px),
                    rows: iv,
                    cols: jv,
                }
            })
            .collect();
        Some(PhaseGeometry {
            cols,
            plane,
            fills,
            tap_offsets,
        })
    }

    /// Computes one output plane (`bias` + the taps, no activation).
    #[allow(clippy::too_many_arguments)]
    fn plane(
        &self,
        inp: &[f32],
        wts: &[f32],
        bias: f32,
        ha: &Axis,
        wa: &Axis,
        scratch: &mut Vec<f32>,
        acc: &mut Vec<f32>,
        taps: &mut Vec<(f32, usize)>,
        out: &mut [f32],
    ) {
        let cols = self.cols;
        // Every plane writes the same (in-bounds) positions below, so the
        // zeros of the padding only need writing when the buffer is new.
        let len = self.plane * self.fills.len();
        if scratch.len() != len {
            scratch.clear();
            scratch.resize(len, 0.0);
        }
        for f in &self.fills {
            let n = f.cols.len();
            if n == 0 {
                continue;
            }
            for (r, i) in f.rows.clone().enumerate() {
                let iy = f.iy0 + r * ha.stride;
                let src = &inp[iy * wa.input + f.ix0..];
                let d = &mut scratch[f.base + i * cols + f.cols.start..][..n];
                gather_strided(d, src, wa.stride);
            }
        }
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

fn im2col_gemm(
    p: &Conv2dParams,
    g: &Geometry,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    output: &mut [f32],
) {
    if g.kdim == 0 {
        // No input channels: the convolution sum is empty.
        output
            .par_chunks_mut(g.out_plane)
            .enumerate()
            .for_each(|(i, plane)| {
                plane.fill(bias.map_or(0.0, |b| b[i % p.out_channels]));
                let res = residual.map(|r| &r[i * g.out_plane..][..g.out_plane]);
                epilogue(plane, Bias::None, res, p.activation);
            });
        return;
    }
    let has_epilogue = bias.is_some() || residual.is_some() || p.activation != Activation::None;
    let (kh, kw) = (p.kernel[0], p.kernel[1]);
    let (ha, wa) = (g.h, g.w);
    let npos = g.out_plane;
    let pointwise = kh == 1
        && kw == 1
        && ha.stride == 1
        && wa.stride == 1
        && p.padding == Padding2d::default();
    // Work is split into independent tasks (image, group, tile of output
    // positions). A task walks the reduction dimension in chunks of
    // `KCHUNK` rows: im2col of the chunk straight into packed GEMM panels
    // (a buffer that stays in cache, however large the kernel), then the
    // microkernel GEMM accumulating into the task's output tile.
    let threads = rayon::current_num_threads().max(1);
    let kdim = g.kdim;
    let images = p.batch * p.groups;
    let round = |t: usize| t.div_ceil(NR) * NR;
    let mut tile = round((TILE_BUDGET / g.og.max(KCHUNK)).max(1)).min(round(npos)).min(MAX_TILE);
    let mut ntiles = npos.div_ceil(tile);
    if images.saturating_mul(ntiles) < 8 * threads {
        // Few tasks: make their count a multiple of the thread count.
        let total = images * ntiles;
        let want = total.div_ceil(threads) * threads;
        ntiles = want.div_ceil(images).min(npos.div_ceil(NR));
        tile = round(npos.div_ceil(ntiles)).min(MAX_TILE);
        ntiles = npos.div_ceil(tile);
    }
    let out_ptr = SendPtr(output.as_mut_ptr());
    let tasks = images * ntiles;
    let col_len = packed_len(KCHUNK.min(kdim), tile);
    (0..tasks).into_par_iter().for_each(|task| with_scratch(col_len, |col| {
        let (image, t) = (task / ntiles, task % ntiles);
        let (b, grp) = (image / p.groups, image % p.groups);
        let t0 = t * tile;
        let nt = tile.min(npos - t0);
        let in_base = (b * p.in_channels + grp * g.cg) * g.in_plane;
        let out_base = (b * p.out_channels + grp * g.og) * npos;
        let w_group = &weight[grp * g.og * kdim..][..g.og * kdim];
        let group_input = &input[in_base..][..g.cg * g.in_plane];
        let mut k0 = 0;
        while k0 < kdim {
            let kc = KCHUNK.min(kdim - k0);
            let panels = &mut col[..packed_len(kc, nt)];
            if pointwise {
                // SAFETY: rows k0..k0+kc (input channels) of this group's
                // input, columns t0..t0+nt < in_plane = npos.
                unsafe { pack_b(panels, group_input[k0 * g.in_plane + t0..].as_ptr(), g.in_plane as isize, 1, kc, nt) };
            } else {
                fill_panels(panels, group_input, kh, kw, &ha, &wa, k0, kc, t0, nt);
            }
            let a = MatA { ptr: w_group[k0..].as_ptr(), rs: kdim as isize, cs: 1 };
            // SAFETY: dst rows co < og at out_base + co·npos + t0 .. + nt lie
            // in `output` (length checked) and are written by this task
            // only; A is [og × kc] with row stride kdim inside `weight`;
            // `panels` holds kc × nt packed. `output` aliases neither.
            unsafe { gemm_packed(g.og, nt, kc, a, panels, out_ptr.get().add(out_base + t0), npos, k0 > 0) };
            k0 += kc;
        }
        if has_epilogue {
            for co in 0..g.og {
                let off = out_base + co * npos + t0;
                // SAFETY: this task's rows, as above; no other reference to them lives.
                let row = unsafe { core::slice::from_raw_parts_mut(out_ptr.get().add(off), nt) };
                let b = bias.map_or(Bias::None, |b| Bias::Scalar(b[grp * g.og + co]));
                epilogue(row, b, residual.map(|r| &r[off..off + nt]), p.activation);
            }
        }
    }));
}

/// im2col of reduction rows `k0..k0+kc` for output positions `t0..t0+nt`
/// (`nt ≤ MAX_TILE`), written as packed GEMM panels (see [`pack_b`]): row
/// `r` = (ci·kh + ky)·kw + kx holds the input under tap (ky, kx) of channel
/// ci for each output position (zero in the padding and in the panel's
/// columns past `nt`). Each row is gathered in long runs (one per output
/// row) into an L1 buffer, then split into the panels.
#[allow(clippy::too_many_arguments)]
fn fill_panels(col: &mut [f32], input: &[f32], kh: usize, kw: usize, ha: &Axis, wa: &Axis, k0: usize, kc: usize, t0: usize, nt: usize) {
    let in_plane = ha.input * wa.input;
    let ow = wa.output;
    let panel_len = kc * NR;
    let mut buf = [0.0f32; MAX_TILE];
    let padded = nt.div_ceil(NR) * NR;
    for rr in 0..kc {
        let r = k0 + rr;
        let kx = r % kw;
        let ky = (r / kw) % kh;
        let ci = r / (kw * kh);
        let plane = &input[ci * in_plane..][..in_plane];
        let oy_valid = ha.valid_outputs(ky);
        let ox_valid = wa.valid_outputs(kx);
        let (mut oy, mut ox0) = (t0 / ow, t0 % ow);
        let mut j = 0;
        while j < nt {
            // The run of positions within one output row.
            let seg = (ow - ox0).min(nt - j);
            let d = &mut buf[j..j + seg];
            if !oy_valid.contains(&oy) {
                d.fill(0.0);
            } else {
                let iy = ha.input_index(oy, ky) as usize;
                let row = &plane[iy * wa.input..][..wa.input];
                // Valid ox within [ox0, ox0+seg).
                let lo = ox_valid.start.max(ox0).min(ox0 + seg);
                let hi = ox_valid.end.min(ox0 + seg).max(lo);
                d[..lo - ox0].fill(0.0);
                d[hi - ox0..].fill(0.0);
                if hi > lo {
                    let ix0 = wa.input_index(lo, kx) as usize;
                    gather_strided(&mut d[lo - ox0..hi - ox0], &row[ix0..], wa.stride);
                }
            }
            j += seg;
            ox0 = 0;
            oy += 1;
        }
        buf[nt..padded].fill(0.0);
        for (p, chunk) in buf[..padded].chunks_exact(NR).enumerate() {
            col[p * panel_len + rr * NR..][..NR].copy_from_slice(chunk);
        }
    }
}

/// `dst[j] = src[j·stride]` (`src` holds at least `(dst.len() - 1)·stride + 1`
/// elements; `stride ≥ 1`).
#[inline]
pub(crate) fn gather_strided(dst: &mut [f32], src: &[f32], stride: usize) {
    let n = dst.len();
    if n == 0 {
        return;
    }
    if stride == 1 {
        dst.copy_from_slice(&src[..n]);
        return;
    }
    gather_strided_simd(dst, src, stride);
}

simd_dispatch! {
    /// [`gather_strided`] for `stride ≥ 2`, `dst` non-empty: whole
    /// `stride`-element chunks, which vectorize as interleaved loads.
    fn gather_strided_simd(dst: &mut [f32], src: &[f32], stride: usize) {
        let n = dst.len();
        let (body, last) = dst.split_at_mut(n - 1);
        let full = &src[..(n - 1) * stride];
        if stride == 2 {
            for (v, c) in body.iter_mut().zip(full.chunks_exact(2)) {
                *v = c[0];
            }
        } else {
            for (v, c) in body.iter_mut().zip(full.chunks_exact(stride)) {
                *v = c[0];
            }
        }
        last[0] = src[(n - 1) * stride];
    }
}
