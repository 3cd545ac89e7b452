//! Convolutions with several input channels per group, as GEMMs on the
//! microkernel: `out[co][pos] = Σ_r w[co][r] · x_r[pos]` over the
//! reduction rows r = (ci, ky, kx), the weights read as stored.
//!
//! The rows x_r reach the microkernel in one of these ways:
//! - **pointwise** (1×1, stride 1, no padding): x_r is input channel r,
//!   packed into panels tile by tile;
//! - **indirect** (the rest, stride-1 undilated ones among them): the
//!   input is split once into
//!   zero-padded stride-phase planes ([`PhaseGeometry`]) in which every row
//!   x_r is a contiguous window at a fixed offset, read in place through a
//!   table of offsets, with no im2col. The output grid is computed with the
//!   phase planes' row length (a few garbage columns per row, dropped when
//!   the tile is copied out);
//! - **tap-major im2col** (strong dilations on small maps, DeepLab's ASPP,
//!   where the phase planes' rows are mostly padding and so would be the
//!   computed grid; and geometries whose phase planes would be much
//!   larger than the data, e.g. hostile dilations): rows gathered into
//!   packed panels tap by tap, a tap skipped for the output tiles it reads
//!   only padding for;
//! - **im2col**: rows gathered into packed panels in their stored order,
//!   `KCHUNK` at a time. Strided or dilated convs with many input and
//!   output channels ([`packing_pays`]: ResNet's stride-2 convs), where
//!   a tile's rows lie in several phase planes and the copy is shared by
//!   many output channels; and the geometries without phase planes with
//!   few input channels per group, where a tap's rows make too short a
//!   GEMM.
//!
//! Tasks are (image, group, tile of output positions), each a
//! single-threaded GEMM whose tile stays in cache while its epilogue (bias,
//! residual, activation) is applied.

use super::phases::PhaseGeometry;
use super::{gather_strided, Axis, Conv2dParams, Geometry, Padding2d};
use crate::activation::{epilogue, Activation, Bias};
use crate::microkernel::{gemm_packed, pack_b, packed_len, MatA, MatB, Post, MR, NR};
use crate::gemm::raw_gemm;
use crate::util::{for_each_task, plan_threads, sequential, with_op_scratch, with_scratch, SendPtr};
use rayon::prelude::*;

/// Target size of one task's output tile (and im2col chunk), in elements
/// (256 KiB: both stay in L2 while the GEMM runs); output positions are
/// tiled to fit.
const TILE_BUDGET: usize = 1 << 16;
/// Reduction rows per im2col chunk: bounds a task's buffer to
/// `KCHUNK × tile` whatever the kernel size.
const KCHUNK: usize = 512;
/// Largest tile of output positions of the im2col path.
const MAX_TILE: usize = TILE_BUDGET / KCHUNK;
/// Largest tile of the other paths.
const MAX_TILE_DIRECT: usize = 1024;

pub(super) fn conv_gemm(
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
    let pointwise = p.kernel == [1, 1] && p.stride == [1, 1] && p.padding == Padding2d::default();
    let epi = Epilogue { p, bias, residual };
    if g.out_plane <= FEW_WINDOWS && !pointwise {
        few_positions(p, g, input, weight, &epi, output);
    } else if pointwise {
        pointwise_gemm(p, g, input, weight, &epi, output);
    } else if let Some(ph) = PhaseGeometry::new(&g.h, &g.w, g.in_plane, g.out_plane) {
        if taps_pay(p, g, &ph) {
            tap_gemm(p, g, input, weight, &epi, output);
        } else if packing_pays(p, g) {
            im2col_gemm(p, g, input, weight, &epi, output);
        } else {
            indirect_gemm(p, g, &ph, input, weight, &epi, output);
        }
    } else if g.cg >= 64 {
        tap_gemm(p, g, input, weight, &epi, output);
    } else {
        im2col_gemm(p, g, input, weight, &epi, output);
    }
}

/// Bias, residual and activation of a conv's output.
struct Epilogue<'a> {
    p: &'a Conv2dParams,
    bias: Option<&'a [f32]>,
    residual: Option<&'a [f32]>,
}

impl Epilogue<'_> {
    fn any(&self) -> bool {
        self.bias.is_some() || self.residual.is_some() || self.p.activation != Activation::None
    }

    /// The part the microkernel applies as it stores a tile of channels
    /// `co0 .. co0 + rows` (absolute): their bias and an activation that is
    /// a clamp; and the activation left for a pass over the tile.
    fn split(&self, co0: usize, rows: usize) -> (Post<'_>, Activation) {
        let (clamp, rest) = self.p.activation.as_clamp();
        (Post { row_bias: self.bias.map(|b| &b[co0..co0 + rows]), clamp, ..Post::default() }, rest)
    }

    /// Applies it to output elements `off .. off + row.len()` (within one
    /// plane) of output channel `co` (absolute).
    fn apply(&self, row: &mut [f32], co: usize, off: usize) {
        let b = self.bias.map_or(Bias::None, |b| Bias::Scalar(b[co]));
        epilogue(row, b, self.residual.map(|r| &r[off..off + row.len()]), self.p.activation);
    }
}

/// How a conv's output is cut into tasks: per image (and group), tiles of
/// `tile` output positions (a multiple of `NR`) times blocks of `mb` output
/// channels (a multiple of `MR`).
#[derive(Clone, Copy)]
struct Split {
    tile: usize,
    ntiles: usize,
    mb: usize,
    nmb: usize,
}

impl Split {
    /// A tile stays in cache (about `TILE_BUDGET / min(og, 256)` positions,
    /// at most `max`); enough tasks for every thread. Few positions and
    /// many output channels (late CNN stages) split the channels instead,
    /// so that each task streams only its slice of the weights.
    fn new(images: usize, npos: usize, og: usize, kdim: usize, max: usize, seq: bool) -> Split {
        let threads = plan_threads(seq);
        // One thread: no split of the channels (it would re-pack the input).
        let want = if seq { 1 } else { 8 * threads };
        let round = |t: usize| t.div_ceil(NR) * NR;
        let mut tile = round((TILE_BUDGET / og.clamp(1, 256)).max(1)).min(round(npos)).min(max);
        let mut ntiles = npos.div_ceil(tile);
        let (mut mb, mut nmb) = (og.max(1), 1);
        let tasks = images.saturating_mul(ntiles);
        if tasks < want && og >= 4 * MIN_MB {
            // Split the channels: blocks of at least MIN_MB rows, all tasks
            // a multiple of the threads when there are enough (equal tasks
            // handed out one at a time: 5 of them on 2 threads keep one
            // thread busy for a sixth).
            nmb = want.div_ceil(tasks).min(og / MIN_MB).max(1);
            if tasks * nmb > threads {
                nmb = (tasks * nmb / threads * threads).div_ceil(tasks).max(1);
            }
            mb = og.div_ceil(nmb).div_ceil(MR) * MR;
            nmb = og.div_ceil(mb);
        } else if tasks < want {
            // Few tasks: smaller tiles (down to MIN_TILE positions and
            // MIN_TASK_FLOPS of work), as many as the threads want and a
            // multiple of their count, so that a helper that starts late
            // (the host is shared) still gets its share instead of leaving
            // the caller a second tile.
            let per_pos = og.saturating_mul(kdim).saturating_mul(2).max(1);
            let min_tile = MIN_TILE.max(MIN_TASK_FLOPS / per_pos);
            let most = images.saturating_mul(npos.div_ceil(min_tile)).max(tasks);
            let target = want.min(most).div_ceil(threads) * threads;
            ntiles = target.div_ceil(images).min(npos.div_ceil(NR));
            tile = round(npos.div_ceil(ntiles)).min(max);
            ntiles = npos.div_ceil(tile);
        }
        Split { tile, ntiles, mb, nmb }
    }

    fn tasks(&self, images: usize) -> usize {
        images * self.ntiles * self.nmb
    }

    /// (image, tile index, first channel, channels) of task `task`.
    fn task(&self, task: usize, og: usize) -> (usize, usize, usize, usize) {
        let (rest, m) = (task / self.nmb, task % self.nmb);
        let m0 = m * self.mb;
        (rest / self.ntiles, rest % self.ntiles, m0, self.mb.min(og - m0))
    }
}

/// Multiply-adds ×2 of a convolution lowered to GEMMs (saturating).
fn conv_flops(images: usize, og: usize, npos: usize, kdim: usize) -> usize {
    images.saturating_mul(og).saturating_mul(npos).saturating_mul(kdim).saturating_mul(2)
}

/// Smallest block of output channels a task takes when splitting them.
const MIN_MB: usize = 48;
/// Smallest tile of output positions a task takes when splitting the
/// positions further for load balance (8 of the wide microkernel's
/// panels: its per-tile costs stay small).
const MIN_TILE: usize = 256;
/// Nor less work than this (a stem conv's positions are cheap: 3 input
/// channels).
const MIN_TASK_FLOPS: usize = 4 << 20;

/// 1×1 stride-1 unpadded: out = W · X per image and group, X packed by
/// tile, or read in place when the planes are whole panels wide
/// ([`pointwise_rows`]).
fn pointwise_gemm(p: &Conv2dParams, g: &Geometry, input: &[f32], weight: &[f32], epi: &Epilogue<'_>, output: &mut [f32]) {
    let in_plane = g.in_plane;
    if g.out_plane < FEW_POSITIONS {
        return few_positions(p, g, input, weight, epi, output);
    }
    if g.out_plane.is_multiple_of(NR) {
        return pointwise_rows(p, g, input, weight, epi, output);
    }
    let chunks = |_, _, each: &mut dyn FnMut(Chunk)| stored_chunks(g.kdim, each);
    packed_gemm(p, g, input, weight, epi, output, MAX_TILE_DIRECT, true, chunks, |panels, group_input, ch, t0, nt| {
        // SAFETY: rows r0..r0+kc (input channels of this group), columns
        // t0..t0+nt < in_plane = npos, inside `group_input`.
        unsafe { pack_b(panels, group_input[ch.r0 * in_plane + t0..].as_ptr(), in_plane as isize, 1, ch.kc, nt) };
    });
}

/// A pointwise conv whose planes are whole microkernel panels wide (56×56,
/// 28×28, 8×8 maps: `out_plane` a multiple of `NR`): the GEMM reads its B
/// rows, the input channels' planes, in place (`MatB::Rows`) instead of
/// packing them into panels first, and stores straight into the output.
/// Measured in the guest, five rounds of alternated device builds:
/// ResNet-50 75.5 -> 68.4 ms (median; lower in every round), MobileNetV2
/// 9.8 -> 8.8 ms (4 of 5).
fn pointwise_rows(p: &Conv2dParams, g: &Geometry, input: &[f32], weight: &[f32], epi: &Epilogue<'_>, output: &mut [f32]) {
    let npos = g.out_plane;
    let kdim = g.kdim;
    let images = p.batch * p.groups;
    let seq = sequential(conv_flops(images, g.og, npos, kdim));
    let sp = Split::new(images, npos, g.og, kdim, MAX_TILE_DIRECT, seq);
    // Tiles are whole panels (`Split` rounds them to NR, the cap too).
    const { assert!(MAX_TILE_DIRECT.is_multiple_of(NR)) };
    debug_assert!(sp.tile.is_multiple_of(NR));
    // B row r (input channel r of the group) starts a plane further on.
    let offs: Vec<isize> = (0..kdim).map(|r| (r * g.in_plane) as isize).collect();
    let out_ptr = SendPtr(output.as_mut_ptr());
    #[cfg(test)]
    POINTWISE_ROWS_RUNS.with(|n| n.set(n.get() + 1));
    for_each_task(sp.tasks(images), seq, |task| {
        let (image, t, m0, mb) = sp.task(task, g.og);
        let (b, grp) = (image / p.groups, image % p.groups);
        let (t0, nt) = (t * sp.tile, sp.tile.min(npos - t * sp.tile));
        let x = &input[(b * p.in_channels + grp * g.cg) * g.in_plane..][..g.cg * g.in_plane];
        let out_base = (b * p.out_channels + grp * g.og + m0) * npos;
        let w_group = &weight[(grp * g.og + m0) * kdim..][..mb * kdim];
        let a = MatA { ptr: w_group.as_ptr(), rs: kdim as isize, cs: 1 };
        let rows = MatB::Rows { base: x[t0..].as_ptr(), offs: &offs };
        // The bias, a clamp and the residual (laid out as the output) go
        // with the microkernel's stores; another activation after.
        let (mut post, rest) = epi.split(grp * g.og + m0, mb);
        post.residual = epi.residual.map(|r| (r[out_base + t0..].as_ptr(), npos));
        // SAFETY: A is [mb × kdim] row-major inside `weight`. B row r,
        // columns t0 .. t0 + nt rounded up to NR, lies in plane r of `x`:
        // t0 is a multiple of the tile, itself of NR (`Split`), and
        // in_plane = npos a multiple of NR, so the rounding stays inside
        // the plane. C rows co < mb at out_base + co·npos + t0 .. + nt
        // (ldc npos) lie in `output` and only this task writes them; the
        // residual has the output's length and layout.
        unsafe { gemm_packed(mb, nt, kdim, a, rows, out_ptr.get().add(out_base + t0), npos, false, Some(&post)) };
        if rest != Activation::None {
            for co in 0..mb {
                // SAFETY: this task's row co, as above; no other
                // reference to it lives.
                let row = unsafe { core::slice::from_raw_parts_mut(out_ptr.get().add(out_base + co * npos + t0), nt) };
                epilogue(row, Bias::None, None, rest);
            }
        }
    });
}

#[cfg(test)]
std::thread_local! {
    /// Pointwise convs this thread ran through [`pointwise_rows`], for the
    /// tests (per thread: other tests run convs concurrently).
    pub(crate) static POINTWISE_ROWS_RUNS: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// Below this many output positions a pointwise conv is a matrix-vector
/// product (squeeze-excite FCs on a 1×1 map), which the microkernel's
/// `NR`-wide tiles would mostly spend on padding columns.
const FEW_POSITIONS: usize = NR / 2;

/// Other convs with at most this many output positions (SegFormer's patch
/// embeddings and spatial-reduction convs down to 2×2 or 4×4 maps) take
/// [`few_positions`] too: one microkernel tile would hold all their
/// positions, mostly padding columns, and the phase planes would cost
/// more than the GEMM.
const FEW_WINDOWS: usize = NR;

/// A conv with few output positions: per image and group, one
/// `[og × kdim]·[kdim × npos]` product by the `gemm` crate's
/// matrix-vector kernels on the input itself (pointwise) or on an im2col
/// of the windows (`kdim × npos` floats, small), then the epilogue row by
/// row.
fn few_positions(p: &Conv2dParams, g: &Geometry, input: &[f32], weight: &[f32], epi: &Epilogue<'_>, output: &mut [f32]) {
    let (npos, kdim) = (g.out_plane, g.kdim);
    let images = p.batch * p.groups;
    let parallel = !sequential(conv_flops(images, g.og, npos, kdim));
    let pointwise = p.kernel == [1, 1] && p.stride == [1, 1] && p.padding == Padding2d::default();
    with_op_scratch(if pointwise { 0 } else { kdim * npos }, |col| {
        for image in 0..images {
            let (b, grp) = (image / p.groups, image % p.groups);
            let in_base = (b * p.in_channels + grp * g.cg) * g.in_plane;
            let out_base = (b * p.out_channels + grp * g.og) * npos;
            let w_group = &weight[grp * g.og * kdim..][..g.og * kdim];
            let x = &input[in_base..][..g.cg * g.in_plane];
            let out = &mut output[out_base..][..g.og * npos];
            let (xs, x_rs) = if pointwise {
                (x, g.in_plane)
            } else {
                im2col_windows(p, g, x, col);
                (&col[..], npos)
            };
            // SAFETY: W is [og × kdim] row-major in `w_group`, X is [kdim ×
            // npos] with row stride x_rs in `xs` (the input when pointwise:
            // in_plane = npos; else the im2col), C is [og × npos] row-major in
            // `out`; the Rust borrows keep them apart.
            unsafe {
                raw_gemm(g.og, npos, kdim, out.as_mut_ptr(), npos, false, w_group.as_ptr(), kdim as isize, 1, xs.as_ptr(), x_rs as isize, 1, parallel);
            }
            if !epi.any() {
                continue;
            }
            if npos == 1 {
                // One output per channel: the bias is a row, one pass for all.
                let bias = epi.bias.map_or(Bias::None, |b| Bias::Row(&b[grp * g.og..][..g.og]));
                epilogue(out, bias, epi.residual.map(|r| &r[out_base..][..g.og]), p.activation);
            } else {
                for (co, row) in out.chunks_exact_mut(npos).enumerate() {
                    epi.apply(row, grp * g.og + co, out_base + co * npos);
                }
            }
        }
    });
}

/// `col[r·npos + pos]` = the input under reduction row `r = (ci, ky, kx)`
/// of output position `pos = (oy, ox)`, zero in the padding: the im2col
/// of one image and group (`x` its `cg` input planes).
fn im2col_windows(p: &Conv2dParams, g: &Geometry, x: &[f32], col: &mut [f32]) {
    let (ha, wa) = (&g.h, &g.w);
    let (kh, kw) = (p.kernel[0], p.kernel[1]);
    let npos = g.out_plane;
    for (r, dst) in col.chunks_exact_mut(npos).enumerate() {
        let (ci, ky, kx) = (r / (kh * kw), r / kw % kh, r % kw);
        let plane = &x[ci * g.in_plane..][..g.in_plane];
        for (oy, row) in dst.chunks_exact_mut(wa.output).enumerate() {
            let iy = ha.input_index(oy, ky);
            if iy < 0 || iy as usize >= ha.input {
                row.fill(0.0);
                continue;
            }
            let src = &plane[iy as usize * wa.input..][..wa.input];
            for (ox, v) in row.iter_mut().enumerate() {
                let ix = wa.input_index(ox, kx);
                *v = if ix < 0 || ix as usize >= wa.input { 0.0 } else { src[ix as usize] };
            }
        }
    }
}

/// The im2col path; see the module docs.
fn im2col_gemm(p: &Conv2dParams, g: &Geometry, input: &[f32], weight: &[f32], epi: &Epilogue<'_>, output: &mut [f32]) {
    #[cfg(test)]
    IM2COL_RUNS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    let (kh, kw) = (p.kernel[0], p.kernel[1]);
    let (ha, wa) = (g.h, g.w);
    let chunks = |_, _, each: &mut dyn FnMut(Chunk)| stored_chunks(g.kdim, each);
    packed_gemm(p, g, input, weight, epi, output, MAX_TILE, true, chunks, |panels, group_input, ch, t0, nt| {
        fill_panels(panels, nt, |rr| {
            let r = ch.r0 + rr;
            let (ci, tap) = (r / (kh * kw), r % (kh * kw));
            (&group_input[ci * g.in_plane..][..g.in_plane], tap / kw, tap % kw)
        }, &ha, &wa, ch.kc, t0);
    });
}

/// The tap-major im2col path: reduction rows ordered (ky, kx, ci), and a
/// tap's rows skipped for a tile of output positions whose rows all read
/// padding through it. For strongly dilated convs on small maps (DeepLab's
/// ASPP) most taps miss most output rows, and the phase planes would be
/// mostly padding.
fn tap_gemm(p: &Conv2dParams, g: &Geometry, input: &[f32], weight: &[f32], epi: &Epilogue<'_>, output: &mut [f32]) {
    #[cfg(test)]
    TAP_GEMM_RUNS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    let (kh, kw) = (p.kernel[0], p.kernel[1]);
    let (ha, wa) = (g.h, g.w);
    let (taps, cg) = (kh * kw, g.cg);
    let chunks = |t0: usize, nt: usize, each: &mut dyn FnMut(Chunk)| {
        for tap in (0..taps).filter(|&tap| tap_reaches(&ha, &wa, tap / kw, tap % kw, t0, nt)) {
            let mut c0 = 0;
            while c0 < cg {
                let kc = KCHUNK.min(cg - c0);
                each(Chunk { a_off: tap * cg + c0, kc, r0: c0, tap });
                c0 += kc;
            }
        }
    };
    // The weights reordered (co, tap, ci) once per op: each chunk's A is
    // then contiguous in its rows (read in place with stride kh·kw, a chunk
    // of a large conv touched every cache line of several MB per tile).
    with_op_scratch(weight.len(), |wt| {
        let reorder = |(w, t): (&[f32], &mut [f32])| {
            for (ci, taps_of_ci) in w.chunks_exact(taps).enumerate() {
                for (tap, &v) in taps_of_ci.iter().enumerate() {
                    t[tap * cg + ci] = v;
                }
            }
        };
        let kdim = g.kdim;
        if sequential(weight.len() * 64) {
            weight.chunks_exact(kdim).zip(wt.chunks_exact_mut(kdim)).for_each(reorder);
        } else {
            weight.par_chunks_exact(kdim).zip(wt.par_chunks_exact_mut(kdim)).for_each(reorder);
        }
        packed_gemm(p, g, input, wt, epi, output, MAX_TILE, false, chunks, |panels, group_input, ch, t0, nt| {
            let (ky, kx) = (ch.tap / kw, ch.tap % kw);
            fill_panels(panels, nt, |rr| (&group_input[(ch.r0 + rr) * g.in_plane..][..g.in_plane], ky, kx), &ha, &wa, ch.kc, t0);
        });
    });
}

/// Whether tap (ky, kx) reads the input for some output position in
/// `t0..t0+nt` (row-major): some of their rows, and some column, are in its
/// valid ranges.
fn tap_reaches(ha: &Axis, wa: &Axis, ky: usize, kx: usize, t0: usize, nt: usize) -> bool {
    let ow = wa.output;
    let (oy, rows) = (ha.valid_outputs(ky), t0 / ow..(t0 + nt - 1) / ow + 1);
    !wa.valid_outputs(kx).is_empty() && oy.start.max(rows.start) < oy.end.min(rows.end)
}

/// Runs of [`im2col_gemm`], for the tests.
#[cfg(test)]
pub(crate) static IM2COL_RUNS: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// Convolutions that took the tap-major path, for the tests.
#[cfg(test)]
pub(crate) static TAP_GEMM_RUNS: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// Whether the tap-major path pays: it gathers its rows and reorders the
/// weights (the phase-plane path reads both in place), and it skips a tap
/// only for whole tiles of output positions, but the phase-plane path
/// computes `phase row length / ow` times the outputs. Taken when it does
/// under half the multiply-adds, counted per tile of [`MAX_TILE`]
/// positions: strongly dilated convs on small maps (DeepLab's ASPP, 3×3
/// dilated 12 on 32×32: 0.43). Not for ordinary padding on small maps
/// (3×3 on 7×7: 0.78 — measured slower, the weight reorder alone costs
/// as much as a large part of such a conv), nor dilation 4 on 32×32
/// (0.73, measured 1.4× faster on its own but not worth the risk at the
/// margin). Both need enough channels per tap for the GEMMs to stay
/// efficient.
fn taps_pay(p: &Conv2dParams, g: &Geometry, ph: &PhaseGeometry) -> bool {
    let (kh, kw) = (p.kernel[0], p.kernel[1]);
    let (ha, wa) = (&g.h, &g.w);
    if g.cg < 64 || wa.output == 0 {
        return false;
    }
    let indirect = (kh * kw * ha.output * ph.cols) as u128;
    let npos = g.out_plane;
    let mut taps = 0u128;
    for t0 in (0..npos).step_by(MAX_TILE) {
        let nt = MAX_TILE.min(npos - t0);
        let live = (0..kh * kw).filter(|&tap| tap_reaches(ha, wa, tap / kw, tap % kw, t0, nt)).count();
        taps += (nt * live) as u128;
    }
    2 * taps < indirect
}

/// Whether a strided or dilated conv with many input channels runs
/// faster on packed im2col panels than on its phase planes in place:
/// there the reduction rows of a tile are spread over several phase
/// planes (or far apart in one), and with enough output channels to
/// share each packed panel the copy is cheap against the GEMM.
/// kernels_bench, 2 threads, median of 5 alternated runs, in place ->
/// packed: ResNet's 1x1 s2 projections 256->512 @56 89 -> 103 GFLOP/s and
/// 1024->2048 @14 87 -> 105, its 3x3 s2 128->128 @56 87 -> 95, DeepLab's
/// 3x3 dilation-4 512->512 @32 103 -> 137; stride-1 undilated convs
/// (3x3 256->256 @14, 512->512 @7) were as fast or faster in place.
fn packing_pays(p: &Conv2dParams, g: &Geometry) -> bool {
    g.cg >= 64 && g.og >= 64 && (p.stride != [1, 1] || p.dilation != [1, 1])
}

/// One GEMM of a task: `kc` reduction rows whose weights start at
/// `a_off` in each row of the (image, group, channel block)'s weights (and
/// are contiguous); `r0` and `tap` say which rows they are (for the fill).
#[derive(Clone, Copy)]
struct Chunk {
    a_off: usize,
    kc: usize,
    r0: usize,
    tap: usize,
}

/// The chunks of `kdim` reduction rows in their stored order: `KCHUNK` at a
/// time.
fn stored_chunks(kdim: usize, each: &mut dyn FnMut(Chunk)) {
    let mut k0 = 0;
    while k0 < kdim {
        let kc = KCHUNK.min(kdim - k0);
        each(Chunk { a_off: k0, kc, r0: k0, tap: 0 });
        k0 += kc;
    }
}

/// The tasks of the pointwise, im2col and tap-major paths: for each chunk
/// of reduction rows that `chunks(t0, nt, each)` lists for output
/// positions `t0..t0+nt`, `fill(panels, group_input, chunk, t0, nt)`
/// writes the rows' packed panels, then the microkernel GEMM accumulates
/// them into the task's output tile (zero if no chunk is listed).
///
/// When the output channels are split into several blocks, every block's
/// task would pack the same panels: with `fixed_chunks` (the chunk list
/// does not depend on the tile: `chunks` lists each reduction row once, in
/// order, `r0` = the chunk's first row) and [`SHARED_PANELS_MAX`] room,
/// each (image, tile)'s panels are packed once for all blocks instead
/// (ResNet-50's 1×1 256→1024 @14 packed its input 16 times).
#[allow(clippy::too_many_arguments)]
fn packed_gemm(
    p: &Conv2dParams,
    g: &Geometry,
    input: &[f32],
    weight: &[f32],
    epi: &Epilogue<'_>,
    output: &mut [f32],
    max_tile: usize,
    fixed_chunks: bool,
    chunks: impl Fn(usize, usize, &mut dyn FnMut(Chunk)) + Sync,
    fill: impl Fn(&mut [f32], &[f32], Chunk, usize, usize) + Sync,
) {
    let npos = g.out_plane;
    let kdim = g.kdim;
    let images = p.batch * p.groups;
    let seq = sequential(conv_flops(images, g.og, npos, kdim));
    let sp = Split::new(images, npos, g.og, kdim, max_tile, seq);
    let out_ptr = SendPtr(output.as_mut_ptr());
    let col_len = packed_len(KCHUNK.min(kdim), sp.tile);
    // One (image, tile)'s panels, all reduction rows: the largest tile's.
    let per_tile = packed_len(kdim, sp.tile);
    let tiles = images * sp.ntiles;
    let group_input = |image: usize| {
        let (b, grp) = (image / p.groups, image % p.groups);
        &input[(b * p.in_channels + grp * g.cg) * g.in_plane..][..g.cg * g.in_plane]
    };
    let tile_of = |t: usize| (t * sp.tile, sp.tile.min(npos - t * sp.tile));
    // One task: `shared`, if any, holds every (image, tile)'s panels at
    // `per_tile` strides.
    let task = |task: usize, col: &mut [f32], shared: Option<&[f32]>| {
        let (image, t, m0, mb) = sp.task(task, g.og);
        let (b, grp) = (image / p.groups, image % p.groups);
        let (t0, nt) = tile_of(t);
        let out_base = (b * p.out_channels + grp * g.og + m0) * npos;
        let w_group = &weight[(grp * g.og + m0) * kdim..][..mb * kdim];
        let group_input = group_input(image);
        // The bias, residual and a clamp go with the last chunk's
        // stores: each chunk runs when the next is listed (or the list
        // ends), after the panels it filled.
        let (mut post, rest) = epi.split(grp * g.og + m0, mb);
        // The residual has the output's layout: this task's rows are at
        // the same offsets.
        post.residual = epi.residual.map(|r| (r[out_base + t0..].as_ptr(), npos));
        let mut first = true;
        let mut multiply = |ch: Chunk, panels: &[f32], post: Option<&Post<'_>>| {
            let a = MatA { ptr: w_group[ch.a_off..].as_ptr(), rs: kdim as isize, cs: 1 };
            // SAFETY: rows co < mb at out_base + co·npos + t0 .. + nt lie
            // in `output` (length checked by the caller) and are
            // written by this task only; A is [mb × kc] with row stride
            // kdim inside `weight` (the chunk's rows are reduction rows
            // of the group); the bias has the mb channels and the
            // residual the output's length. `output` aliases none.
            unsafe { gemm_packed(mb, nt, ch.kc, a, MatB::Packed(&panels[..packed_len(ch.kc, nt)]), out_ptr.get().add(out_base + t0), npos, !first, post) };
            first = false;
        };
        let mut pending = None;
        // A chunk's panels: in `shared` (rows r0.. of this tile's), or
        // packed into `col` now.
        let tile_panels = shared.map(|s| &s[(image * sp.ntiles + t) * per_tile..][..packed_len(kdim, nt)]);
        let ntp = packed_len(1, nt);
        fn panels_of<'a>(tile_panels: Option<&'a [f32]>, col: &'a [f32], ch: Chunk, ntp: usize) -> &'a [f32] {
            tile_panels.map_or(col, |tp| &tp[ch.r0 * ntp..])
        }
        chunks(t0, nt, &mut |ch| {
            if let Some(prev) = pending.take() {
                multiply(prev, panels_of(tile_panels, col, prev, ntp), None);
            }
            if tile_panels.is_none() {
                fill(&mut col[..packed_len(ch.kc, nt)], group_input, ch, t0, nt);
            }
            pending = Some(ch);
        });
        let fused = pending.is_some();
        if let Some(last) = pending {
            multiply(last, panels_of(tile_panels, col, last, ntp), Some(&post));
        }
        if fused && rest != Activation::None && nt == npos {
            // Whole planes: the task's rows are one contiguous span, and
            // one pass over it beats a call per short row (a 7×7 map's
            // rows are 49 floats: three vectors and a masked tail each).
            // SAFETY: this task's rows, as above; no other reference to them lives.
            let span = unsafe { core::slice::from_raw_parts_mut(out_ptr.get().add(out_base), mb * npos) };
            epilogue(span, Bias::None, None, rest);
            return;
        }
        for co in 0..mb {
            let off = out_base + co * npos + t0;
            // SAFETY: this task's rows, as above; no other reference to them lives.
            let row = unsafe { core::slice::from_raw_parts_mut(out_ptr.get().add(off), nt) };
            if !fused {
                // Every reduction row reads padding here.
                row.fill(0.0);
                if epi.any() {
                    epi.apply(row, grp * g.og + m0 + co, off);
                }
            } else if rest != Activation::None {
                epilogue(row, Bias::None, None, rest);
            }
        }
    };
    let share = fixed_chunks && sp.nmb > 1 && tiles.checked_mul(per_tile).is_some_and(|n| n <= SHARED_PANELS_MAX);
    if !share {
        for_each_task(sp.tasks(images), seq, |t| with_scratch(col_len, |col| task(t, col, None)));
        return;
    }
    #[cfg(test)]
    SHARED_PANEL_RUNS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    with_op_scratch(tiles * per_tile, |shared| {
        let sh = SendPtr(shared.as_mut_ptr());
        // Tasks of one chunk's rows for FILL_PANELS panels each, so that
        // every thread packs: a chunk's panels are stored panel after
        // panel, and packing columns t0'..t0'+n' of its rows writes
        // exactly those panels. (The chunk list is the same for every tile.)
        let mut list = Vec::new();
        chunks(0, sp.tile.min(npos), &mut |ch| list.push(ch));
        let groups = sp.tile.div_ceil(NR).div_ceil(FILL_PANELS);
        let per_tile_tasks = list.len() * groups;
        for_each_task(tiles * per_tile_tasks, seq, |task| {
            let (it, rest) = (task / per_tile_tasks, task % per_tile_tasks);
            let (ch, pg) = (list[rest / groups], rest % groups);
            let (t0, nt) = tile_of(it % sp.ntiles);
            let c0 = pg * FILL_PANELS * NR;
            if c0 >= nt {
                return;
            }
            let cols = (FILL_PANELS * NR).min(nt - c0);
            let ntp = packed_len(1, nt);
            // SAFETY: panels c0/NR.. of chunk `ch` of (image, tile) `it`:
            // inside its own `per_tile` floats of `shared` (the chunk's
            // block at r0·ntp, its panels kc·NR floats each, all within
            // packed_len(kdim, nt) ≤ per_tile); tasks write disjoint ranges.
            let dst = unsafe { core::slice::from_raw_parts_mut(sh.get().add(it * per_tile + ch.r0 * ntp + c0 * ch.kc), packed_len(ch.kc, cols)) };
            fill(dst, group_input(it / sp.ntiles), ch, t0 + c0, cols);
        });
        let shared = &*shared;
        for_each_task(sp.tasks(images), seq, |t| task(t, &mut [], Some(shared)));
    });
}

/// Most floats of panels [`packed_gemm`] packs once for all channel blocks
/// (16 MiB).
const SHARED_PANELS_MAX: usize = 1 << 22;
/// Panels per task packing shared panels.
const FILL_PANELS: usize = 4;

/// Convolutions whose channel blocks shared their packed panels, for the
/// tests.
#[cfg(test)]
pub(crate) static SHARED_PANEL_RUNS: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// The phase-plane ("indirect") convolution; see the module docs.
fn indirect_gemm(
    p: &Conv2dParams,
    g: &Geometry,
    ph: &PhaseGeometry,
    input: &[f32],
    weight: &[f32],
    epi: &Epilogue<'_>,
    output: &mut [f32],
) {
    let (kh, kw) = (p.kernel[0], p.kernel[1]);
    let (ha, wa) = (&g.h, &g.w);
    let set = ph.len();
    let cols = ph.cols;
    let (oh, ow) = (ha.output, wa.output);
    // Flattened positions per image: whole phase rows, garbage included.
    let qn = oh * cols;
    let images = p.batch * p.groups;
    let kdim = g.kdim;
    let chans = p.batch * p.in_channels;
    let seq = sequential(conv_flops(images, g.og, qn, kdim));
    with_op_scratch(chans * set, |phases| {
        let fill = |(c, dst): (usize, &mut [f32])| ph.fill(&input[c * g.in_plane..][..g.in_plane], ha, wa, dst, true);
        if seq {
            phases.chunks_mut(set).enumerate().for_each(fill);
        } else {
            phases.par_chunks_mut(set).enumerate().for_each(fill);
        }
        // Row r = (ci·kh + ky)·kw + kx of the GEMM: tap (ky, kx) of channel
        // ci's phase set.
        let offs: Vec<isize> = (0..kdim)
            .map(|r| ((r / (kh * kw)) * set + ph.tap_offsets[r % (kh * kw)]) as isize)
            .collect();
        let sp = Split::new(images, qn, g.og, kdim, MAX_TILE_DIRECT, seq);
        let tile = sp.tile;
        let out_ptr = SendPtr(output.as_mut_ptr());
        let phases = &*phases;
        for_each_task(sp.tasks(images), seq, |task| {
            with_scratch(sp.mb * tile, |stage| {
                let (image, t, m0, mb) = sp.task(task, g.og);
                let (b, grp) = (image / p.groups, image % p.groups);
                let q0 = t * tile;
                let nq = tile.min(qn - q0);
                let src = &phases[(b * p.in_channels + grp * g.cg) * set..][..g.cg * set];
                let w_group = &weight[(grp * g.og + m0) * kdim..][..mb * kdim];
                let a = MatA { ptr: w_group.as_ptr(), rs: kdim as isize, cs: 1 };
                let rows = MatB::Rows { base: src[q0..].as_ptr(), offs: &offs };
                // Without a residual (laid out like the output, not the
                // stage) the epilogue runs on the stage: the bias and a
                // clamp as the microkernel stores it, another activation
                // on each stage row at once, garbage columns included,
                // instead of once per output row.
                let per_row_epilogue = epi.residual.is_some();
                let (post, rest) = epi.split(grp * g.og + m0, mb);
                let post = (!per_row_epilogue).then_some(post);
                // SAFETY: A is [mb × kdim] inside `weight`. B row r, column
                // j < nq rounded up to NR, is src[q0 + offs[r] + j] with
                // q0 + j < qn + NR, which `PhaseGeometry` keeps inside the
                // channel's phase set (spare row and tail). The stage is
                // mb × tile floats, ldc = tile ≥ nq; the bias has mb rows.
                unsafe { gemm_packed(mb, nq, kdim, a, rows, stage.as_mut_ptr(), tile, false, post.as_ref()) };
                // Copy the real output columns out.
                let out_base = (b * p.out_channels + grp * g.og + m0) * g.out_plane;
                if !per_row_epilogue && rest != Activation::None {
                    for co in 0..mb {
                        epilogue(&mut stage[co * tile..][..nq], Bias::None, None, rest);
                    }
                }
                // The tile's real positions, in the order of q, are the
                // consecutive output positions `span` of each plane.
                let mut span: Option<(usize, usize)> = None;
                let mut q = q0;
                while q < q0 + nq {
                    let (oy, ox0) = (q / cols, q % cols);
                    let run_end = (q - ox0 + cols).min(q0 + nq);
                    if ox0 < ow {
                        let ox1 = (run_end - (q - ox0)).min(ow);
                        let n = ox1 - ox0;
                        let at = oy * ow + ox0;
                        span = Some((span.map_or(at, |s| s.0), at + n));
                        for co in 0..mb {
                            let off = out_base + co * g.out_plane + at;
                            // SAFETY: output row oy, columns ox0..ox1 of plane
                            // co of this (image, group): inside `output` and
                            // written by this task only (tiles partition q).
                            let dst = unsafe { core::slice::from_raw_parts_mut(out_ptr.get().add(off), n) };
                            dst.copy_from_slice(&stage[co * tile + (q - q0)..][..n]);
                        }
                    }
                    q = run_end;
                }
                // The bias, residual and activation in one pass per channel
                // over its span (per output row instead, an 8×8 map's
                // epilogue took 17 % of a 3×3 32→32 conv: 8-element calls).
                if let (true, Some((lo, hi))) = (per_row_epilogue, span) {
                    for co in 0..mb {
                        let off = out_base + co * g.out_plane + lo;
                        // SAFETY: positions lo..hi of plane co, the ones
                        // copied above: this task's only.
                        let dst = unsafe { core::slice::from_raw_parts_mut(out_ptr.get().add(off), hi - lo) };
                        epi.apply(dst, grp * g.og + m0 + co, off);
                    }
                }
            })
        });
    });
}

/// im2col of `kc` reduction rows for output positions `t0..t0+nt` (`nt ≤
/// MAX_TILE`), written as packed GEMM panels (see [`pack_b`]): row `rr`
/// (`row(rr)` = its input plane and tap (ky, kx)) holds the input under the
/// tap for each output position (zero in the padding and in the panel's
/// columns past `nt`). Each row is gathered in long runs (one per output
/// row) into an L1 buffer, then split into the panels.
fn fill_panels<'a>(col: &mut [f32], nt: usize, row: impl Fn(usize) -> (&'a [f32], usize, usize), ha: &Axis, wa: &Axis, kc: usize, t0: usize) {
    let ow = wa.output;
    let panel_len = kc * NR;
    let mut buf = [0.0f32; MAX_TILE];
    let padded = nt.div_ceil(NR) * NR;
    for rr in 0..kc {
        let (plane, ky, kx) = row(rr);
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

