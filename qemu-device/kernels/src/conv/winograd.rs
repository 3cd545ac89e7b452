//! 3×3 stride-1 convolutions by Winograd's minimal filtering F(2×2, 3×3):
//! each 2×2 output tile is `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A` over the 4×4 input
//! tile `d` under it, so the multiply-adds per tile and channel pair drop
//! from 36 to 16 (the transforms are additions). Summed over the input
//! channels, the element-wise products become 16 independent GEMMs
//! `M[ξ] = U[ξ] · V[ξ]` of `[out_ch × in_ch] · [in_ch × tiles]`, run on the
//! microkernel.
//!
//! The filters `U = G g Gᵀ` come transformed ([`conv2d_winograd`]: the
//! hardware contract's `CONV_WINOGRAD` layout, written by the compiler with
//! `rbln_hw::ops::winograd_weights`), or are transformed per call into
//! that layout ([`conv`], the path `conv2d` takes on hosts without the
//! AVX-512 microkernel).
//!
//! A task is (image, block of [`BLOCK`] consecutive tiles, block of output
//! channels): it transforms its tiles' inputs straight from the NCHW
//! planes into the 16 `V[ξ]` (`in_ch × BLOCK`, in L2), runs the 16 GEMMs
//! into `M` and transforms `M` back into its output rows, adding the bias
//! on the way and the residual and activation while the rows are in
//! cache. The input rows are split into even and odd columns first, so
//! that both transforms are element-wise operations on contiguous rows
//! (vectorised), and only the split and the final interleave of output
//! columns shuffle. F(2×2, 3×3)'s transforms use only ±1 and ½
//! coefficients, so its rounding error stays within a few ulps of direct
//! summation's.

use super::{Conv2dParams, Geometry};
use crate::activation::{epilogue, Activation, Bias};
use crate::error::{KernelError, Result};
use crate::microkernel::{gemm_packed, MatA, MatB, MR, NR};
use crate::util::{check_len, for_each_task, plan_threads, sequential, volume, with_local, with_op_scratch, with_scratch, SendPtr};
use rbln_hw::ops::WINOGRAD_POINTS as XI;

/// `len` rounded up to a multiple of 4 KiB plus one cache line (floats).
fn skewed(len: usize) -> usize {
    len.next_multiple_of(1024) + 16
}

/// Tiles per task: the four-panel microkernel's width, so a task's GEMMs
/// run on whole 6×64 register tiles.
const BLOCK: usize = 4 * NR;
/// Fewest output channels a task takes when a conv's tiles make too few
/// tasks for the threads (late stages: 49 tiles at 14×14).
const MIN_MB: usize = 4 * MR;

/// Whether `conv2d` (plain weights) takes this path: a shape it suits
/// ([`suits`]) on a host whose GEMM microkernel is AVX2's. On AVX-512
/// hosts the compiler chooses it instead, with the filters transformed
/// once (`CONV_WINOGRAD`); transforming them per call costs as much as it
/// saves there.
pub(crate) fn applies(p: &Conv2dParams, g: &Geometry) -> bool {
    suits(p, g) && (!crate::microkernel::has_wide() || forced())
}

/// 3×3, stride 1, undilated, one group, enough channels for the GEMMs to
/// run well and enough output tiles for the per-op filter transform to
/// pay for itself.
pub(crate) fn suits(p: &Conv2dParams, g: &Geometry) -> bool {
    let tiles = g.h.output.div_ceil(2) * g.w.output.div_ceil(2);
    geometry_ok(p)
        && planes_fit(p, g.h.output, g.w.output)
        && g.cg >= 16
        && g.og >= 16
        && tiles >= 100
        // The per-call transform writes all of U (16·og·cg floats).
        && XI * g.og * g.cg <= 1 << 20
}

/// Whether the split planes (the padded input) stay within a few times
/// the input and output tensors: a hostile padding, not a model, breaks
/// this, and the conv's own data then bounds the memory it takes.
fn planes_fit(p: &Conv2dParams, oh: usize, ow: usize) -> bool {
    let planes = [p.batch, p.in_channels, 2 * oh.div_ceil(2) + 2, 2 * ow.div_ceil(2) + 2].iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let vol = |dims: [usize; 4]| dims.iter().fold(1usize, |a, &d| a.saturating_mul(d));
    let data = vol([p.batch, p.in_channels, p.in_h, p.in_w]).saturating_add(vol([p.batch, p.out_channels, oh, ow]));
    planes.is_some_and(|n| n <= data.saturating_mul(4).saturating_add(1 << 20))
}

/// The geometry F(2×2, 3×3) computes: 3×3, stride 1, undilated, one group
/// (any padding).
fn geometry_ok(p: &Conv2dParams) -> bool {
    p.kernel == [3, 3] && p.stride == [1, 1] && p.dilation == [1, 1] && p.groups == 1
}

/// `output = act(conv3x3(input) + bias + residual)` with the filters in
/// the Winograd domain: `u` holds `U[ξ][co][ci]` (16 matrices
/// `[out_channels × in_channels]`, `rbln_hw::ops::winograd_weights`'
/// layout). `p` must be 3×3, stride 1, undilated, one group; the other
/// operands as [`super::conv2d_residual`]'s.
pub fn conv2d_winograd(
    p: &Conv2dParams,
    input: &[f32],
    u: &[f32],
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    output: &mut [f32],
) -> Result<()> {
    let g = super::geometry(p)?;
    if !geometry_ok(p) {
        return Err(KernelError::invalid(
            "conv2d winograd",
            format!("needs a 3x3 kernel, stride 1, dilation 1 and one group, got {p:?}"),
        ));
    }
    check_len("conv2d winograd weight", u.len(), volume("conv2d winograd weight", &[XI, p.out_channels, p.in_channels])?)?;
    super::check_operands(p, &g, input, bias, residual, output)?;
    if !planes_fit(p, g.h.output, g.w.output) {
        return Err(KernelError::invalid(
            "conv2d winograd",
            format!("padding {:?} makes the padded input much larger than the input and output", p.padding),
        ));
    }
    if !output.is_empty() {
        run(p, &g, input, u, bias, residual, output);
    }
    Ok(())
}

/// `output = act(conv3x3(input) + bias + residual)` for a geometry
/// [`applies`] accepted, the filters transformed for this call.
pub(crate) fn conv(p: &Conv2dParams, g: &Geometry, input: &[f32], weight: &[f32], bias: Option<&[f32]>, residual: Option<&[f32]>, output: &mut [f32]) {
    with_op_scratch(XI * g.og * g.cg, |u| {
        rbln_hw::ops::winograd_weights(weight, g.og, g.cg, u);
        run(p, g, input, u, bias, residual, output);
    });
}

/// The convolution, tasks as the module describes.
fn run(p: &Conv2dParams, g: &Geometry, input: &[f32], u: &[f32], bias: Option<&[f32]>, residual: Option<&[f32]>, output: &mut [f32]) {
    let (cin, og) = (g.cg, g.og);
    let (th, tw) = (g.h.output.div_ceil(2), g.w.output.div_ceil(2));
    let tiles = th * tw;
    let seq = sequential(2 * XI * og * cin * tiles * p.batch);
    let threads = plan_threads(seq);
    let blocks = tiles.div_ceil(BLOCK);
    // Split the output channels where the tiles alone make too few tasks
    // (a task's GEMMs then read only its rows of U).
    let want = if seq { 1 } else { 3 * threads };
    let (mut mb, mut nmb) = (og.max(1), 1);
    if p.batch * blocks < want && og >= 2 * MIN_MB {
        nmb = want.div_ceil(p.batch * blocks).min(og / MIN_MB);
        mb = og.div_ceil(nmb);
        nmb = og.div_ceil(mb);
    }
    // Row stride of a task's V and M rows: whole panels.
    let ld = BLOCK.min(tiles).next_multiple_of(NR);
    let offs: Vec<isize> = (0..cin).map(|ci| (ci * ld) as isize).collect();
    let split = SplitPlanes::new(p, g);
    // Floats between consecutive points' matrices of V and M: skewed, so
    // that the 16 streams the transforms write and read do not share
    // cache sets.
    let (vs, ms) = (skewed(cin * ld), skewed(mb * ld));
    let (v_len, m_len) = (XI * vs, XI * ms);
    let (clamp, rest) = p.activation.as_clamp();
    let out_ptr = SendPtr(output.as_mut_ptr());
    with_op_scratch(p.batch * cin * split.plane, |planes| {
        split.fill(input, planes, seq);
        let planes = &*planes;
        for_each_task(p.batch * blocks * nmb, seq, |task| {
            let (rest_t, mi) = (task / nmb, task % nmb);
            let (b, blk) = (rest_t / blocks, rest_t % blocks);
            let (t0, co0) = (blk * BLOCK, mi * mb);
            let (nb, mbi) = (BLOCK.min(tiles - t0), mb.min(og - co0));
            with_scratch(v_len + m_len, |buf| {
                let (v, m) = buf.split_at_mut(v_len);
                transform_inputs(&split, &planes[b * cin * split.plane..][..cin * split.plane], cin, t0, nb, ld, vs, v);
                for xi in 0..XI {
                    let a = MatA { ptr: u[(xi * og + co0) * cin..].as_ptr(), rs: cin as isize, cs: 1 };
                    let b_rows = MatB::Rows { base: v[xi * vs..].as_ptr(), offs: &offs };
                    // SAFETY: A is U[ξ]'s rows co0..co0+mbi, [mbi × cin]
                    // row-major inside `u`; B row ci is V[ξ] row ci, `ld`
                    // (≥ nb rounded up to the panel width) readable floats
                    // inside `v`; C is [mbi × nb] with row stride ld inside
                    // `m`, which aliases neither.
                    unsafe { gemm_packed(mbi, nb, cin, a, b_rows, m[xi * ms..].as_mut_ptr(), ld, false, None) };
                }
                let out_base = (b * og + co0) * g.out_plane;
                let post = Post {
                    bias: bias.map(|bs| &bs[co0..co0 + mbi]),
                    res: residual.map(|r| &r[out_base..][..mbi * g.out_plane]),
                    clamp,
                    rest,
                };
                // SAFETY: planes co0..co0+mbi of image b lie inside
                // `output`; tasks partition (image, tiles, channels), so
                // this task's positions of them are its own.
                unsafe { transform_outputs(g, m, mbi, ld, ms, t0, nb, &post, out_ptr.get().add(out_base)) };
            })
        });
    });
}

/// The input planes zero-padded to the tiles' windows (`2·th + 2` rows of
/// `2·tw + 2`), each row stored as its even columns then its odd ones
/// (`half = tw + 1` each): tap column `c` of every tile of a row is then
/// one contiguous run, `c / 2` into half `c % 2`.
struct SplitPlanes {
    half: usize,
    rows: usize,
    plane: usize,
    top: usize,
    left: usize,
    in_h: usize,
    in_w: usize,
    in_plane: usize,
}

impl SplitPlanes {
    fn new(p: &Conv2dParams, g: &Geometry) -> SplitPlanes {
        let (th, tw) = (g.h.output.div_ceil(2), g.w.output.div_ceil(2));
        let (half, rows) = (tw + 1, 2 * th + 2);
        SplitPlanes { half, rows, plane: rows * 2 * half, top: g.h.pad_before, left: g.w.pad_before, in_h: p.in_h, in_w: p.in_w, in_plane: g.in_plane }
    }

    /// Splits every input plane of `input` into `planes`.
    fn fill(&self, input: &[f32], planes: &mut [f32], seq: bool) {
        let n = planes.len() / self.plane.max(1);
        let ptr = SendPtr(planes.as_mut_ptr());
        let per_task = (PLANE_TASK / self.plane.max(1)).max(1);
        for_each_task(n.div_ceil(per_task), seq, |t| {
            with_local(&ROW, |stage| {
                stage.resize(2 * self.half, 0.0);
                for i in t * per_task..((t + 1) * per_task).min(n) {
                    // SAFETY: plane i lies inside `planes`; tasks split
                    // disjoint plane ranges.
                    let dst = unsafe { core::slice::from_raw_parts_mut(ptr.get().add(i * self.plane), self.plane) };
                    let src = &input[i * self.in_plane..][..self.in_plane];
                    self.split(src, dst, stage);
                }
            })
        });
    }

    fn split(&self, src: &[f32], dst: &mut [f32], stage: &mut [f32]) {
        let h = self.half;
        for (r, row) in dst.chunks_exact_mut(2 * h).enumerate() {
            let y = r as isize - self.top as isize;
            if y < 0 || y >= self.in_h as isize {
                row.fill(0.0);
                continue;
            }
            // The padded row (2·tw + 2 ≥ left + in_w + right wide).
            stage.fill(0.0);
            stage[self.left..self.left + self.in_w].copy_from_slice(&src[y as usize * self.in_w..][..self.in_w]);
            let (e, o) = row.split_at_mut(h);
            deinterleave(stage, e, o);
        }
        debug_assert_eq!(dst.len() / (2 * h), self.rows);
    }
}

/// Floats of split planes one task of [`SplitPlanes::fill`] writes.
const PLANE_TASK: usize = 1 << 15;

std::thread_local! {
    static ROW: core::cell::RefCell<Vec<f32>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// The tile rows `ty` a block of tiles `t0 .. t0 + nb` touches, each with
/// its range of tile columns and the block-local index of its first tile.
fn segments(t0: usize, nb: usize, tw: usize) -> impl Iterator<Item = (usize, core::ops::Range<usize>, usize)> {
    (t0 / tw..(t0 + nb).div_ceil(tw)).map(move |ty| {
        let (a, b) = (t0.max(ty * tw) - ty * tw, (t0 + nb).min((ty + 1) * tw) - ty * tw);
        (ty, a..b, ty * tw + a - t0)
    })
}

/// `V[ξ][ci][t] = (Bᵀ d B)[ξ]` for the block's tiles `t` (block-local,
/// at `v[ξ·stride + ci·ld + t]`, columns `nb..ld` zeroed) of every input channel `ci`
/// of `planes` (one image's split planes), with
/// Bᵀ = [[1,0,−1,0],[0,1,1,0],[0,−1,1,0],[0,1,0,−1]].
#[allow(clippy::too_many_arguments)]
fn transform_inputs(sp: &SplitPlanes, planes: &[f32], cin: usize, t0: usize, nb: usize, ld: usize, stride: usize, v: &mut [f32]) {
    let tw = sp.half - 1;
    for ci in 0..cin {
        let plane = &planes[ci * sp.plane..][..sp.plane];
        for (ty, cols, at) in segments(t0, nb, tw) {
            let d = &plane[2 * ty * 2 * sp.half..][..4 * 2 * sp.half];
            input_tiles(d, sp.half, cols.start, cols.len(), &mut v[ci * ld + at..], stride);
        }
        if nb < ld {
            for xi in 0..XI {
                v[xi * stride + ci * ld + nb..][..ld - nb].fill(0.0);
            }
        }
    }
}

/// One tile row segment's input transform: `d` holds padded rows 0..4
/// under the row, each as `half` even then `half` odd columns; tile
/// `cols0 + k` (k < n) of point ξ goes to `v[ξ·stride + k]`.
fn input_tiles(d: &[f32], half: usize, cols0: usize, n: usize, v: &mut [f32], stride: usize) {
    assert!(d.len() >= 4 * 2 * half && cols0 + n < half && v.len() >= (XI - 1) * stride + n);
    #[cfg(target_arch = "x86_64")]
    match isa() {
        // SAFETY: the CPU has AVX-512F; the bounds just checked are the
        // helper's contract.
        Isa::Avx512 => return unsafe { avx512::input_tiles(d.as_ptr(), half, cols0, n, v.as_mut_ptr(), stride) },
        // SAFETY: the CPU has AVX2; the same contract.
        Isa::Avx2 => return unsafe { avx2::input_tiles(d.as_ptr(), half, cols0, n, v.as_mut_ptr(), stride) },
        Isa::Portable => {}
    }
    input_tiles_portable(d, half, cols0, n, v, stride);
}

/// [`input_tiles`] without SIMD intrinsics (after its bounds check).
#[allow(clippy::needless_range_loop)] // 16 output and 16 input streams
fn input_tiles_portable(d: &[f32], half: usize, cols0: usize, n: usize, v: &mut [f32], stride: usize) {
    // Columns 2tx .. 2tx+3 of padded row r, as slices over tx = cols0 ..
    // cols0 + n.
    let col = |r: usize, c: usize| -> &[f32] { &d[r * 2 * half + (c % 2) * half + cols0 + c / 2..][..n] };
    let outs = rows_mut::<XI>(v, stride, n);
    for k in 0..n {
        // t[i][c] = (Bᵀ d)[i][c], then V[4i + c] = (t B)[i][c].
        let mut t = [[0.0f32; 4]; 4];
        for c in 0..4 {
            let (d0, d1, d2, d3) = (col(0, c)[k], col(1, c)[k], col(2, c)[k], col(3, c)[k]);
            t[0][c] = d0 - d2;
            t[1][c] = d1 + d2;
            t[2][c] = d2 - d1;
            t[3][c] = d1 - d3;
        }
        for (i, [a, b, c, e]) in t.into_iter().enumerate() {
            outs[4 * i][k] = a - c;
            outs[4 * i + 1][k] = b + c;
            outs[4 * i + 2][k] = c - b;
            outs[4 * i + 3][k] = b - e;
        }
    }
}

/// Rows `0, stride, 2·stride, …` (`R` of them) of `s`, `n` values each.
#[inline(always)]
fn rows_mut<const R: usize>(s: &mut [f32], stride: usize, n: usize) -> [&mut [f32]; R] {
    let mut rest = s;
    core::array::from_fn(|_| {
        let r = core::mem::take(&mut rest);
        let (row, tail) = r.split_at_mut(stride.min(r.len()));
        rest = tail;
        &mut row[..n]
    })
}

/// What follows the output transform: the bias (added to the tiles), the
/// residual (planes laid out as the output's), a clamp and any other
/// activation, in [`epilogue`]'s order.
struct Post<'a> {
    bias: Option<&'a [f32]>,
    res: Option<&'a [f32]>,
    clamp: Option<(f32, f32)>,
    rest: Activation,
}

/// Output channels `0..mb` (of the task's block) at its tiles: `Y = Aᵀ
/// M A` per tile (`M[ξ][co][t]` at `m[ξ·stride + co·ld + t]`), with
/// Aᵀ = [[1,1,1,0],[0,1,−1,−1]], then `post`; `out` (and `post.res`)
/// point at the block's first output plane. Tiles hanging over the last
/// row or column write only the outputs that exist.
///
/// # Safety
/// `out` is valid for `mb` output planes, and the block's positions of
/// them are this call's alone (no other reference to them lives).
#[allow(clippy::too_many_arguments)]
unsafe fn transform_outputs(g: &Geometry, m: &[f32], mb: usize, ld: usize, stride: usize, t0: usize, nb: usize, post: &Post<'_>, out: *mut f32) {
    let (oh, ow, tw) = (g.h.output, g.w.output, g.w.output.div_ceil(2));
    for co in 0..mb {
        let bias = post.bias.map_or(0.0, |b| b[co]);
        for (ty, cols, at) in segments(t0, nb, tw) {
            let (x0, x1) = (2 * cols.start, (2 * cols.end).min(ow));
            let y = 2 * ty;
            let rows = if y + 1 < oh { 2 } else { 1 };
            let off = co * g.out_plane + y * ow + x0;
            let res = post.res.map(|r| &r[off..off + (rows - 1) * ow + (x1 - x0)]);
            // SAFETY: rows y and y + 1 (if it exists), columns x0..x1 of
            // plane co: the block's own positions (contract).
            unsafe { output_tiles(&m[co * ld + at..], stride, cols.len(), bias, ow, x1 - x0, rows, res, post.clamp, out.add(off)) };
            if post.rest != Activation::None {
                for r in 0..rows {
                    // SAFETY: as above, one row's columns x0..x1.
                    let row = unsafe { core::slice::from_raw_parts_mut(out.add(off + r * ow), x1 - x0) };
                    epilogue(row, Bias::None, None, post.rest);
                }
            }
        }
    }
}

/// One tile row segment's output transform: tile k's `q[ξ]` is
/// `m[ξ·stride + k]` (k < n); output row r (< `rows`) of the segment,
/// `width` columns, at `dst[r·ow ..]` gets `Y[r][c] + bias` at column
/// `2k + c`, then the residual (`res`, laid out as `dst`) and the clamp.
/// Only those `rows × width` outputs are written.
///
/// # Safety
/// They are writable at `dst` and no reference to them lives.
#[allow(clippy::too_many_arguments)]
unsafe fn output_tiles(m: &[f32], stride: usize, n: usize, bias: f32, ow: usize, width: usize, rows: usize, res: Option<&[f32]>, clamp: Option<(f32, f32)>, dst: *mut f32) {
    let len = (rows - 1) * ow + width;
    assert!(width <= 2 * n && width + 1 >= 2 * n && (1..=2).contains(&rows) && width <= ow && res.is_none_or(|r| r.len() == len));
    assert!(n == 0 || m.len() >= (XI - 1) * stride + n);
    #[cfg(target_arch = "x86_64")]
    {
        let rp = res.map_or(core::ptr::null(), |r| r.as_ptr());
        match isa() {
            // SAFETY: the CPU has AVX-512F; the bounds just checked are
            // the helper's contract.
            Isa::Avx512 => return unsafe { avx512::output_tiles(m.as_ptr(), stride, n, bias, ow, width, rows, rp, clamp, dst) },
            // SAFETY: the CPU has AVX2; the same contract.
            Isa::Avx2 => return unsafe { avx2::output_tiles(m.as_ptr(), stride, n, bias, ow, width, rows, rp, clamp, dst) },
            Isa::Portable => {}
        }
    }
    // SAFETY: the caller's contract, bounds checked above.
    unsafe { output_tiles_portable(m, stride, n, bias, ow, width, rows, res, clamp, dst) }
}

/// [`output_tiles`] without SIMD intrinsics (after its bounds check).
///
/// # Safety
/// As [`output_tiles`].
#[allow(clippy::too_many_arguments)]
unsafe fn output_tiles_portable(m: &[f32], stride: usize, n: usize, bias: f32, ow: usize, width: usize, rows: usize, res: Option<&[f32]>, clamp: Option<(f32, f32)>, dst: *mut f32) {
    let q = |xi: usize, x: usize| m[xi * stride + x];
    for x in 0..n {
        // s = Aᵀ q (rows of 4), then Y = s A.
        let s0: [f32; 4] = core::array::from_fn(|c| q(c, x) + q(4 + c, x) + q(8 + c, x));
        let s1: [f32; 4] = core::array::from_fn(|c| q(4 + c, x) - q(8 + c, x) - q(12 + c, x));
        let y = [
            [s0[0] + s0[1] + s0[2] + bias, s0[1] - s0[2] - s0[3] + bias],
            [s1[0] + s1[1] + s1[2] + bias, s1[1] - s1[2] - s1[3] + bias],
        ];
        for (r, yr) in y.iter().enumerate().take(rows) {
            for (c, &v) in yr.iter().enumerate() {
                let col = 2 * x + c;
                if col < width {
                    let i = r * ow + col;
                    let mut v = v + res.map_or(0.0, |rs| rs[i]);
                    if let Some((lo, hi)) = clamp {
                        v = crate::microkernel::clamp_ps(v, lo, hi);
                    }
                    // SAFETY: output (r, col), r < rows, col < width
                    // (contract).
                    unsafe { *dst.add(i) = v };
                }
            }
        }
    }
}

/// `e[x] = row[2x]`, `o[x] = row[2x + 1]` (`row` holds `2·e.len()`).
fn deinterleave(row: &[f32], e: &mut [f32], o: &mut [f32]) {
    let n = e.len();
    debug_assert!(o.len() == n && row.len() == 2 * n);
    let mut x = 0;
    #[cfg(target_arch = "x86_64")]
    match isa() {
        // SAFETY: the CPU has AVX-512F; the helper stays inside the slices.
        Isa::Avx512 => x = unsafe { avx512::deinterleave(row, e, o) },
        // SAFETY: the CPU has AVX2; the helper stays inside the slices.
        Isa::Avx2 => x = unsafe { avx2::deinterleave(row, e, o) },
        Isa::Portable => {}
    }
    for x in x..n {
        e[x] = row[2 * x];
        o[x] = row[2 * x + 1];
    }
}

/// Which build of the transforms runs: AVX-512's 16 tiles per step,
/// AVX2's 8, or the portable loops. All compute the same operations in
/// the same order, so their results are bit-identical.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Isa {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    Portable,
}

#[cfg(test)]
std::thread_local! {
    /// A test's choice of build ([`with_isa`]).
    static ISA_OVERRIDE: core::cell::Cell<Option<Isa>> = const { core::cell::Cell::new(None) };
}

fn isa() -> Isa {
    #[cfg(test)]
    if let Some(i) = ISA_OVERRIDE.with(|o| o.get()) {
        return i;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if crate::fastmath::has_avx512() {
            return Isa::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// Runs `f` with the transforms' build `i` on this thread (tests; `i`
/// must be one the CPU supports).
#[cfg(test)]
fn with_isa<R>(i: Isa, f: impl FnOnce() -> R) -> R {
    ISA_OVERRIDE.with(|o| o.set(Some(i)));
    let r = f();
    ISA_OVERRIDE.with(|o| o.set(None));
    r
}

/// AVX2 bodies of the transforms and of [`deinterleave`]: the AVX-512
/// ones on 8 lanes (the last, partial step through `vmaskmovps`, whose
/// masked lanes are neither read nor written), and the output's columns
/// interleaved with unpack + lane permutes. Hosts whose GEMM microkernel is
/// the AVX2 one run every 3×3 convolution this path suits through
/// Winograd, where the portable transforms took about as long as the 16
/// GEMMs (measured, 64→64 @56 on one thread: 38 % of the time).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::XI;
    use core::arch::x86_64::*;

    /// Mask of the first `min(left, 8)` lanes.
    #[inline(always)]
    unsafe fn lanes(left: usize) -> __m256i {
        // SAFETY: AVX2 (the callers' target features).
        unsafe { _mm256_cmpgt_epi32(_mm256_set1_epi32(left.min(8) as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) }
    }

    /// [`super::input_tiles`].
    ///
    /// # Safety
    /// The CPU supports AVX2; `d` is readable for `8·half` floats,
    /// `cols0 + n < half`, `v` writable at `ξ·stride + k` (ξ < 16, k < n).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn input_tiles(d: *const f32, half: usize, cols0: usize, n: usize, v: *mut f32, stride: usize) {
        let mut k = 0;
        while k < n {
            // SAFETY (whole step): masked lanes k .. min(k + 8, n) of
            // columns ≤ cols0 + n < half of rows < 4, and of V's rows
            // (contract).
            unsafe {
                let full = n - k >= 8;
                let m = lanes(n - k);
                macro_rules! load {
                    ($p:expr) => {
                        if full {
                            _mm256_loadu_ps($p)
                        } else {
                            _mm256_maskload_ps($p, m)
                        }
                    };
                }
                // Tap column c of row r: even half at +0/+1 (c = 0, 2),
                // odd half at +half/+half+1 (c = 1, 3).
                let at = [0, half, 1, half + 1];
                let mut t = [[_mm256_setzero_ps(); 4]; 4];
                for c in 0..4 {
                    let p = d.add(cols0 + k + at[c]);
                    let (d0, d1, d2, d3) = (load!(p), load!(p.add(2 * half)), load!(p.add(4 * half)), load!(p.add(6 * half)));
                    t[0][c] = _mm256_sub_ps(d0, d2);
                    t[1][c] = _mm256_add_ps(d1, d2);
                    t[2][c] = _mm256_sub_ps(d2, d1);
                    t[3][c] = _mm256_sub_ps(d1, d3);
                }
                let mut dst = v.add(k);
                for ti in t {
                    let vs = [_mm256_sub_ps(ti[0], ti[2]), _mm256_add_ps(ti[1], ti[2]), _mm256_sub_ps(ti[2], ti[1]), _mm256_sub_ps(ti[1], ti[3])];
                    for x in vs {
                        if full {
                            _mm256_storeu_ps(dst, x);
                        } else {
                            _mm256_maskstore_ps(dst, m, x);
                        }
                        dst = dst.wrapping_add(stride);
                    }
                }
            }
            k += 8;
        }
    }

    /// [`super::output_tiles`].
    ///
    /// # Safety
    /// The CPU supports AVX2; `m` readable at `ξ·stride + k` (ξ < 16,
    /// k < n); `dst` writable (and `res`, unless null, readable) at
    /// `r·ow + c` for r < rows, c < width; `width ≤ 2n`.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    pub(super) unsafe fn output_tiles(m: *const f32, stride: usize, n: usize, bias: f32, ow: usize, width: usize, rows: usize, res: *const f32, clamp: Option<(f32, f32)>, dst: *mut f32) {
        let bv = _mm256_set1_ps(bias);
        let (lo, hi) = clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
        let (lo, hi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
        let mut k = 0;
        while k < n {
            // SAFETY (whole step): masked lanes k .. min(k + 8, n) of M's
            // 16 rows; masked columns < width of dst's and res's rows
            // (contract).
            unsafe {
                let mk = lanes(n - k);
                // Output columns 2k .. 2k + 16 of the segment, in two halves.
                let (n0, n1) = (width.saturating_sub(2 * k), width.saturating_sub(2 * k + 8));
                let (m0, m1) = (lanes(n0), lanes(n1));
                let full = n - k >= 8;
                let mut q = [_mm256_setzero_ps(); XI];
                let mut src = m.add(k);
                for x in q.iter_mut() {
                    *x = if full { _mm256_loadu_ps(src) } else { _mm256_maskload_ps(src, mk) };
                    src = src.wrapping_add(stride);
                }
                let mut s0 = [_mm256_setzero_ps(); 4];
                let mut s1 = [_mm256_setzero_ps(); 4];
                for c in 0..4 {
                    s0[c] = _mm256_add_ps(_mm256_add_ps(q[c], q[4 + c]), q[8 + c]);
                    s1[c] = _mm256_sub_ps(_mm256_sub_ps(q[4 + c], q[8 + c]), q[12 + c]);
                }
                let y = [
                    [
                        _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s0[0], s0[1]), s0[2]), bv),
                        _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(s0[1], s0[2]), s0[3]), bv),
                    ],
                    [
                        _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s1[0], s1[1]), s1[2]), bv),
                        _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(s1[1], s1[2]), s1[3]), bv),
                    ],
                ];
                for r in 0..rows {
                    let [ye, yo] = y[r];
                    let at = r * ow + 2 * k;
                    // [e0 o0 e1 o1 | e4 o4 e5 o5] and [e2 o2 e3 o3 | e6 o6 e7 o7]
                    // -> columns 2k .. 2k + 8 and 2k + 8 .. 2k + 16.
                    let (l, h) = (_mm256_unpacklo_ps(ye, yo), _mm256_unpackhi_ps(ye, yo));
                    let (mut a, mut b) = (_mm256_permute2f128_ps(l, h, 0x20), _mm256_permute2f128_ps(l, h, 0x31));
                    if !res.is_null() {
                        a = _mm256_add_ps(a, if n0 >= 8 { _mm256_loadu_ps(res.add(at)) } else { _mm256_maskload_ps(res.add(at), m0) });
                        if n1 > 0 {
                            let rb = res.wrapping_add(at + 8);
                            b = _mm256_add_ps(b, if n1 >= 8 { _mm256_loadu_ps(rb) } else { _mm256_maskload_ps(rb, m1) });
                        }
                    }
                    if clamp.is_some() {
                        a = _mm256_min_ps(_mm256_max_ps(a, lo), hi);
                        b = _mm256_min_ps(_mm256_max_ps(b, lo), hi);
                    }
                    if n0 >= 8 {
                        _mm256_storeu_ps(dst.add(at), a);
                    } else {
                        _mm256_maskstore_ps(dst.add(at), m0, a);
                    }
                    if n1 >= 8 {
                        _mm256_storeu_ps(dst.wrapping_add(at + 8), b);
                    } else if n1 > 0 {
                        _mm256_maskstore_ps(dst.wrapping_add(at + 8), m1, b);
                    }
                }
            }
            k += 8;
        }
    }

    /// # Safety
    /// The CPU supports AVX2; `row.len() ≥ 2·e.len()`, `o.len() ≥ e.len()`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn deinterleave(row: &[f32], e: &mut [f32], o: &mut [f32]) -> usize {
        let steps = e.len().min(o.len()).min(row.len() / 2) / 8;
        // SAFETY (whole body): step s reads row[16s .. 16s + 16] and
        // writes e, o [8s .. 8s + 8], inside the slices (steps).
        unsafe {
            for s in 0..steps {
                let a = _mm256_loadu_ps(row.as_ptr().add(16 * s));
                let b = _mm256_loadu_ps(row.as_ptr().add(16 * s + 8));
                // [a0 a2 b0 b2 | a4 a6 b4 b6]: 64-bit lanes 0, 2, 1, 3 put
                // them in order.
                let ev = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
                let od = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
                _mm256_storeu_ps(e.as_mut_ptr().add(8 * s), ev);
                _mm256_storeu_ps(o.as_mut_ptr().add(8 * s), od);
            }
        }
        8 * steps
    }
}

/// AVX-512 bodies of the transforms, 16 tiles per step (the same
/// operations in the same order as the portable loops: identical
/// results; the output's columns interleaved with two-source permutes),
/// and of [`deinterleave`] (16 pairs per step; returns how many it did,
/// the caller finishes the rest).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::XI;
    use core::arch::x86_64::*;

    /// Mask of the first `min(left, 16)` lanes.
    #[inline(always)]
    fn lanes(left: usize) -> __mmask16 {
        if left >= 16 {
            0xffff
        } else {
            ((1u32 << left) - 1) as __mmask16
        }
    }

    /// [`super::input_tiles`].
    ///
    /// # Safety
    /// The CPU supports AVX-512F; `d` is readable for `8·half` floats,
    /// `cols0 + n < half`, `v` writable at `ξ·stride + k` (ξ < 16, k < n).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn input_tiles(d: *const f32, half: usize, cols0: usize, n: usize, v: *mut f32, stride: usize) {
        let mut k = 0;
        while k < n {
            let m = lanes(n - k);
            // SAFETY (whole step): masked lanes k .. min(k + 16, n) of
            // columns ≤ cols0 + n < half of rows < 4, and of V's rows
            // (contract).
            unsafe {
                // Tap column c of row r: even half at +0/+1 (c = 0, 2),
                // odd half at +half/+half+1 (c = 1, 3).
                let at = [0, half, 1, half + 1];
                let mut t = [[_mm512_setzero_ps(); 4]; 4];
                for c in 0..4 {
                    let p = d.add(cols0 + k + at[c]);
                    let d0 = _mm512_maskz_loadu_ps(m, p);
                    let d1 = _mm512_maskz_loadu_ps(m, p.add(2 * half));
                    let d2 = _mm512_maskz_loadu_ps(m, p.add(4 * half));
                    let d3 = _mm512_maskz_loadu_ps(m, p.add(6 * half));
                    t[0][c] = _mm512_sub_ps(d0, d2);
                    t[1][c] = _mm512_add_ps(d1, d2);
                    t[2][c] = _mm512_sub_ps(d2, d1);
                    t[3][c] = _mm512_sub_ps(d1, d3);
                }
                let mut dst = v.add(k);
                for ti in t {
                    let vs = [_mm512_sub_ps(ti[0], ti[2]), _mm512_add_ps(ti[1], ti[2]), _mm512_sub_ps(ti[2], ti[1]), _mm512_sub_ps(ti[1], ti[3])];
                    for x in vs {
                        _mm512_mask_storeu_ps(dst, m, x);
                        dst = dst.wrapping_add(stride);
                    }
                }
            }
            k += 16;
        }
    }

    /// [`super::output_tiles`].
    ///
    /// # Safety
    /// The CPU supports AVX-512F; `m` readable at `ξ·stride + k` (ξ < 16,
    /// k < n); `dst` writable (and `res`, unless null, readable) at
    /// `r·ow + c` for r < rows, c < width; `width ≤ 2n`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    pub(super) unsafe fn output_tiles(m: *const f32, stride: usize, n: usize, bias: f32, ow: usize, width: usize, rows: usize, res: *const f32, clamp: Option<(f32, f32)>, dst: *mut f32) {
        let bv = _mm512_set1_ps(bias);
        let (lo, hi) = clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
        let (lo, hi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
        // SAFETY: constant tables.
        let (il, ih) = unsafe { (_mm512_loadu_si512(LO.as_ptr().cast()), _mm512_loadu_si512(HI.as_ptr().cast())) };
        let mut k = 0;
        while k < n {
            let mk = lanes(n - k);
            // Output columns 2k .. 2k + 32 of the segment, in two halves.
            let (m0, m1) = (lanes(width.saturating_sub(2 * k)), lanes(width.saturating_sub(2 * k + 16)));
            // SAFETY (whole step): masked lanes k .. min(k + 16, n) of M's
            // 16 rows; masked columns < width of dst's and res's rows
            // (contract).
            unsafe {
                let mut q = [_mm512_setzero_ps(); XI];
                let mut src = m.add(k);
                for x in q.iter_mut() {
                    *x = _mm512_maskz_loadu_ps(mk, src);
                    src = src.wrapping_add(stride);
                }
                let mut s0 = [_mm512_setzero_ps(); 4];
                let mut s1 = [_mm512_setzero_ps(); 4];
                for c in 0..4 {
                    s0[c] = _mm512_add_ps(_mm512_add_ps(q[c], q[4 + c]), q[8 + c]);
                    s1[c] = _mm512_sub_ps(_mm512_sub_ps(q[4 + c], q[8 + c]), q[12 + c]);
                }
                let y = [
                    [
                        _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s0[0], s0[1]), s0[2]), bv),
                        _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(s0[1], s0[2]), s0[3]), bv),
                    ],
                    [
                        _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s1[0], s1[1]), s1[2]), bv),
                        _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(s1[1], s1[2]), s1[3]), bv),
                    ],
                ];
                for r in 0..rows {
                    let [ye, yo] = y[r];
                    let at = r * ow + 2 * k;
                    let (mut a, mut b) = (_mm512_permutex2var_ps(ye, il, yo), _mm512_permutex2var_ps(ye, ih, yo));
                    if !res.is_null() {
                        a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(m0, res.add(at)));
                        b = _mm512_add_ps(b, _mm512_maskz_loadu_ps(m1, res.wrapping_add(at + 16)));
                    }
                    if clamp.is_some() {
                        a = _mm512_min_ps(_mm512_max_ps(a, lo), hi);
                        b = _mm512_min_ps(_mm512_max_ps(b, lo), hi);
                    }
                    _mm512_mask_storeu_ps(dst.add(at), m0, a);
                    _mm512_mask_storeu_ps(dst.wrapping_add(at + 16), m1, b);
                }
            }
            k += 16;
        }
    }

    const EVEN: [i32; 16] = [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30];
    const ODD: [i32; 16] = [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31];
    const LO: [i32; 16] = [0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23];
    const HI: [i32; 16] = [8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31];

    /// # Safety
    /// The CPU supports AVX-512F; `row.len() ≥ 2·e.len()`, `o.len() ≥ e.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn deinterleave(row: &[f32], e: &mut [f32], o: &mut [f32]) -> usize {
        let steps = e.len().min(o.len()).min(row.len() / 2) / 16;
        // SAFETY (whole body): step s reads row[32s .. 32s + 32] and
        // writes e, o [16s .. 16s + 16], inside the slices (steps).
        unsafe {
            let (ie, io) = (_mm512_loadu_si512(EVEN.as_ptr().cast()), _mm512_loadu_si512(ODD.as_ptr().cast()));
            for s in 0..steps {
                let a = _mm512_loadu_ps(row.as_ptr().add(32 * s));
                let b = _mm512_loadu_ps(row.as_ptr().add(32 * s + 16));
                _mm512_storeu_ps(e.as_mut_ptr().add(16 * s), _mm512_permutex2var_ps(a, ie, b));
                _mm512_storeu_ps(o.as_mut_ptr().add(16 * s), _mm512_permutex2var_ps(a, io, b));
            }
        }
        16 * steps
    }

}

#[cfg(test)]
std::thread_local! {
    static FORCED: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Whether a test on this thread forces the path ([`force`]).
#[inline]
fn forced() -> bool {
    #[cfg(test)]
    return FORCED.with(|f| f.get());
    #[cfg(not(test))]
    false
}

/// Runs `f` with this path forced wherever it [`suits`] on this thread
/// (tests on a host with the AVX-512 microkernel).
#[cfg(test)]
pub(crate) fn force<R>(f: impl FnOnce() -> R) -> R {
    FORCED.with(|x| x.set(true));
    let r = f();
    FORCED.with(|x| x.set(false));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The builds this CPU can run, the portable one first.
    fn builds() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                v.push(Isa::Avx2);
            }
            if crate::fastmath::has_avx512() {
                v.push(Isa::Avx512);
            }
        }
        v
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 250.0 - 4.0
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every build's transforms give the portable loops' bits, for tile
    /// counts around the vector widths (partial last steps), offset
    /// segments, one or two output rows, odd widths, residual and clamp;
    /// and write nothing outside their outputs.
    #[test]
    fn transforms_bit_identical_across_builds() {
        let builds = builds();
        for n in [1, 2, 7, 8, 9, 15, 16, 17, 24, 31, 33, 64] {
            for cols0 in [0, 3] {
                let half = cols0 + n + 1 + 2;
                let d = data(8 * half, n as u32 + 7);
                let stride = n + 5;
                let run_in = |i: Isa| {
                    let mut v = vec![f32::NAN; 16 * stride];
                    with_isa(i, || input_tiles(&d, half, cols0, n, &mut v, stride));
                    bits(&v)
                };
                let want = run_in(Isa::Portable);
                for &i in &builds[1..] {
                    assert_eq!(run_in(i), want, "input_tiles {i:?} n {n} cols0 {cols0}");
                }
            }
            let stride = n + 3;
            let m = data(16 * stride, n as u32);
            for (width, rows, with_res, clamp) in [(2 * n, 2, false, None), (2 * n - 1, 2, true, Some((-1.5, 2.0))), (2 * n, 1, true, None), (2 * n - 1, 1, false, Some((0.0, f32::INFINITY)))] {
                let ow = width + 5;
                let len = (rows - 1) * ow + width;
                let res = data(len, 99);
                let run_out = |i: Isa| {
                    let mut dst = vec![f32::NAN; rows * ow + 16];
                    let r = with_res.then_some(&res[..]);
                    // SAFETY: dst holds rows·ow ≥ len floats.
                    with_isa(i, || unsafe { output_tiles(&m, stride, n, 0.25, ow, width, rows, r, clamp, dst.as_mut_ptr()) });
                    bits(&dst)
                };
                let want = run_out(Isa::Portable);
                for &i in &builds[1..] {
                    assert_eq!(run_out(i), want, "output_tiles {i:?} n {n} width {width} rows {rows} res {with_res} clamp {clamp:?}");
                }
            }
            let row = data(2 * n, 5);
            let run_de = |i: Isa| {
                let (mut e, mut o) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                with_isa(i, || deinterleave(&row, &mut e, &mut o));
                (bits(&e), bits(&o))
            };
            let want = run_de(Isa::Portable);
            assert_eq!(want.0, bits(&row.iter().step_by(2).copied().collect::<Vec<_>>()));
            for &i in &builds[1..] {
                assert_eq!(run_de(i), want, "deinterleave {i:?} n {n}");
            }
        }
    }
}
