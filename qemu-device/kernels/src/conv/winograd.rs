//! 3×3 stride-1 convolutions by Winograd's minimal filtering F(2×2, 3×3):
//! each 2×2 output tile is `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A` over the 4×4 input
//! tile `d` under it, so the multiply-adds per tile and channel pair drop
//! from 36 to 16 (the transforms are additions). Summed over the input
//! channels, the element-wise products become 16 independent GEMMs
//! `M[ξ] = U[ξ] · V[ξ]` of `[out_ch × in_ch] · [in_ch × tiles]`, run on the
//! microkernel.
//!
//! Per op the filters are transformed once (`U`, 16·out·in floats) and the
//! input planes copied zero-padded; tasks are (image, block of whole tile
//! rows): transform the block's input tiles straight into the rows of
//! the 16 GEMMs' B matrices, 16 GEMMs into a cache-sized buffer, then the
//! output transform with bias, residual and activation into the output
//! rows. F(2×2, 3×3)'s
//! transforms use only ±1 and ½ coefficients, so its rounding error stays
//! within a few ulps of direct summation's.

use super::{Conv2dParams, Geometry};
use crate::activation::{epilogue, Bias};
use crate::microkernel::{gemm_packed, MatA, MatB, NR};
use crate::fastmath::simd_dispatch;
use crate::util::{for_each_task, plan_threads, sequential, with_local, with_op_scratch, with_scratch, SendPtr};
use rayon::prelude::*;

/// Winograd's transformed-tile size (4×4 = 16 GEMMs).
const XI: usize = 16;
/// Aim for blocks of about this many tiles (a multiple of the panel width
/// keeps the GEMMs' last panel full).
const BLOCK_TILES: usize = 64;

/// Whether `conv2d` takes this path: a shape it suits ([`suits`]) on a
/// host whose GEMM microkernel is AVX2's. Against the AVX-512 microkernel
/// (twice the vector width) the direct path's GEMM was as fast at 56×56
/// and faster at 28×28 (kernels_bench on a Xeon with AVX-512, three runs
/// each, ms: 3×3 128→128 @28 1.67-1.79 direct vs 2.45-2.56 Winograd,
/// 128→32 @28 0.52 vs 0.92-0.95, 64→64 @56 1.53-2.03 vs 1.63-1.79).
pub(crate) fn applies(p: &Conv2dParams, g: &Geometry) -> bool {
    suits(p, g) && (!crate::microkernel::has_wide() || forced())
}

/// 3×3, stride 1, undilated, one group, enough channels for the GEMMs to
/// run well and enough output tiles for the per-op filter transform to
/// pay for itself.
pub(crate) fn suits(p: &Conv2dParams, g: &Geometry) -> bool {
    let tiles = g.h.output.div_ceil(2) * g.w.output.div_ceil(2);
    p.kernel == [3, 3]
        && p.stride == [1, 1]
        && p.dilation == [1, 1]
        && p.groups == 1
        && g.cg >= 16
        && g.og >= 16
        && tiles >= 100
        // Every task reads all of U (16·og·cg floats): keep it in cache.
        && XI * g.og * g.cg <= 1 << 20
}

/// `output = act(conv3x3(input) + bias + residual)` for a geometry
/// [`applies`] accepted.
pub(super) fn conv(p: &Conv2dParams, g: &Geometry, input: &[f32], weight: &[f32], bias: Option<&[f32]>, residual: Option<&[f32]>, output: &mut [f32]) {
    let (cin, og) = (g.cg, g.og);
    let (oh, ow) = (g.h.output, g.w.output);
    let (th, tw) = (oh.div_ceil(2), ow.div_ceil(2));
    // Padded planes: every tile's 4×4 window lies inside.
    let (ph, pw) = (2 * th + 2, 2 * tw + 2);
    let plane = ph * pw;
    let planes = p.batch * cin;
    let us = u_stride(og * cin);
    let u_len = XI * us;
    let seq = sequential(2 * XI * og * cin * th * tw * p.batch);
    with_op_scratch(u_len + planes * plane, |scratch| {
        let (u, padded) = scratch.split_at_mut(u_len);
        transform_filters(weight, og * cin, u, seq);
        let (top, left) = (g.h.pad_before, g.w.pad_before);
        let fill = |(i, dst): (usize, &mut [f32])| {
            dst.fill(0.0);
            let src = &input[i * g.in_plane..][..g.in_plane];
            for (y, row) in src.chunks_exact(p.in_w).enumerate() {
                dst[(y + top) * pw + left..][..p.in_w].copy_from_slice(row);
            }
        };
        if seq {
            padded.chunks_mut(plane).enumerate().for_each(fill);
        } else {
            padded.par_chunks_mut(plane).enumerate().for_each(fill);
        }
        let (u, padded) = (&*u, &*padded);
        // Blocks of whole tile rows, about BLOCK_TILES tiles, and enough
        // of them for every thread (a late helper still gets its share).
        let threads = plan_threads(seq);
        let want = if seq { 1 } else { (4 * threads).div_ceil(p.batch) };
        let rows_per_block = BLOCK_TILES.div_ceil(tw).min(th.div_ceil(want)).clamp(1, th);
        let blocks = th.div_ceil(rows_per_block);
        let max_tiles = rows_per_block * tw;
        // Row stride of the B matrices: whole panels of the largest block.
        let ld = max_tiles.next_multiple_of(NR);
        let offs: Vec<isize> = (0..cin).map(|ci| (ci * ld) as isize).collect();
        let v_len = XI * cin * ld;
        let m_len = XI * og * max_tiles;
        let out_ptr = SendPtr(output.as_mut_ptr());
        for_each_task(p.batch * blocks, seq, |task| {
            with_scratch(v_len + m_len, |buf| {
                let (v, m) = buf.split_at_mut(v_len);
                let (b, blk) = (task / blocks, task % blocks);
                let ty0 = blk * rows_per_block;
                let ty1 = (ty0 + rows_per_block).min(th);
                let nt = (ty1 - ty0) * tw;
                let src = &padded[b * cin * plane..][..cin * plane];
                transform_inputs(src, cin, pw, plane, ty0, ty1, tw, ld, v);
                for xi in 0..XI {
                    let a = MatA { ptr: u[xi * us..].as_ptr(), rs: cin as isize, cs: 1 };
                    let rows = MatB::Rows { base: v[xi * cin * ld..][..cin * ld].as_ptr(), offs: &offs };
                    // SAFETY: A is U[ξ], [og × cin] row-major inside `u`;
                    // B row ci is V[ξ] row ci, `ld` (≥ nt rounded up to
                    // the panel width) readable floats inside `v`; C is
                    // [og × nt] with row stride nt inside `m`, which
                    // aliases neither.
                    unsafe { gemm_packed(og, nt, cin, a, rows, m[xi * og * nt..].as_mut_ptr(), nt, false, None) };
                }
                let (y0, y1) = (2 * ty0, (2 * ty1).min(oh));
                for co in 0..og {
                    let off = (b * og + co) * g.out_plane + y0 * ow;
                    // SAFETY: output rows y0..y1 of plane (b, co): inside
                    // `output` and written by this task only (blocks
                    // partition the tile rows).
                    let out = unsafe { core::slice::from_raw_parts_mut(out_ptr.get().add(off), (y1 - y0) * ow) };
                    let bv = bias.map_or(0.0, |bs| bs[co]);
                    transform_outputs(&m[..XI * og * nt], og, nt, co, tw, ow, y1 - y0, bv, out);
                    epilogue(out, Bias::None, residual.map(|r| &r[off..off + out.len()]), p.activation);
                }
            })
        });
    });
}

/// Floats between consecutive ξ's matrices in U: padded past a multiple
/// of 4 KiB, so that the 16 streams the filter transform writes do not
/// all map to the same cache sets.
fn u_stride(filters: usize) -> usize {
    filters.next_multiple_of(1024) + 16
}

/// `U[ξ][co][ci] = (G g Gᵀ)[ξ]` for every filter `g` (3×3 at
/// `weight[(co·cin + ci)·9]`), with G = [[1,0,0],[½,½,½],[½,-½,½],[0,0,1]].
fn transform_filters(weight: &[f32], filters: usize, u: &mut [f32], seq: bool) {
    let us = u_stride(filters);
    debug_assert!(u.len() >= XI * us);
    const CHUNK: usize = 2048;
    let u_ptr = SendPtr(u.as_mut_ptr());
    for_each_task(filters.div_ceil(CHUNK), seq, |t| {
        let f0 = t * CHUNK;
        for (f, g) in weight[f0 * 9..].chunks_exact(9).take(CHUNK.min(filters - f0)).enumerate() {
            let f = f0 + f;
            // t = G g (4×3), then t Gᵀ (4×4), each value stored to its ξ's
            // matrix (16 sequential streams).
            let cols: [[f32; 4]; 3] = core::array::from_fn(|c| g_times(g[c], g[3 + c], g[6 + c]));
            for (r, ((&t0, &t1), &t2)) in cols[0].iter().zip(&cols[1]).zip(&cols[2]).enumerate() {
                for (c, v) in g_times(t0, t1, t2).into_iter().enumerate() {
                    // SAFETY: (4r + c)·us + f < XI·us ≤ u.len(); tasks
                    // write disjoint filter ranges f of every row.
                    unsafe { *u_ptr.get().add((4 * r + c) * us + f) = v };
                }
            }
        }
    });
}

/// `G·[g0, g1, g2]ᵀ` with G = [[1,0,0],[½,½,½],[½,-½,½],[0,0,1]].
#[inline(always)]
fn g_times(g0: f32, g1: f32, g2: f32) -> [f32; 4] {
    [g0, 0.5 * (g0 + g1 + g2), 0.5 * (g0 - g1 + g2), g2]
}

/// `V[ξ] = (Bᵀ d B)[ξ]` for the 4×4 input tile `d` of every channel and
/// every tile of tile rows `ty0..ty1`: row `ci` of ξ's matrix (row stride
/// `ld`, a multiple of the panel width) holds the block's tiles, with
/// Bᵀ = [[1,0,-1,0],[0,1,1,0],[0,-1,1,0],[0,1,0,-1]].
///
/// A tile row at a time: the four padded input rows under it are split
/// into even and odd columns, so that tap column `c` of every tile in the
/// row is one contiguous slice and the transform runs as vector
/// operations along the row, stored straight into the matrices.
#[allow(clippy::too_many_arguments)]
fn transform_inputs(src: &[f32], cin: usize, pw: usize, plane: usize, ty0: usize, ty1: usize, tw: usize, ld: usize, v: &mut [f32]) {
    let nt = (ty1 - ty0) * tw;
    let half = pw / 2;
    with_local(&ROWS, |buf| {
        buf.resize(8 * half + XI * tw, 0.0);
        let (eo, t) = buf.split_at_mut(8 * half);
        for ci in 0..cin {
            let pl = &src[ci * plane..][..plane];
            for ty in ty0..ty1 {
                for r in 0..4 {
                    let row = &pl[(2 * ty + r) * pw..][..pw];
                    let (e, o) = eo[2 * r * half..][..2 * half].split_at_mut(half);
                    deinterleave(row, e, o);
                }
                input_row(eo, half, tw, t, v, cin * ld, ci * ld + (ty - ty0) * tw);
            }
            // The GEMMs read whole panels: zero the columns past the block.
            for xi in 0..XI {
                v[(xi * cin + ci) * ld + nt..][..ld - nt].fill(0.0);
            }
        }
    });
}

std::thread_local! {
    static ROWS: core::cell::RefCell<Vec<f32>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// `e[x] = row[2x]`, `o[x] = row[2x + 1]`.
fn deinterleave(row: &[f32], e: &mut [f32], o: &mut [f32]) {
    for ((pair, e), o) in row.chunks_exact(2).zip(e.iter_mut()).zip(o.iter_mut()) {
        *e = pair[0];
        *o = pair[1];
    }
}

simd_dispatch! {
    /// One tile row's input transform: `eo` holds rows 0..4 as (even, odd)
    /// column pairs of `half` values each; `t` is room for 16·tw values;
    /// V[ξ] of tile tx goes to `v[ξ·stride + at + tx]`.
    fn input_row(eo: &[f32], half: usize, tw: usize, t: &mut [f32], v: &mut [f32], stride: usize, at: usize) {
        // d[r][c] of tile tx = column 2tx + c of row r.
        let col = |r: usize, c: usize| -> &[f32] {
            let base = 2 * r * half + (c % 2) * half + c / 2;
            &eo[base..base + tw]
        };
        // t[i][c] = (Bᵀ d)[i][c], row i at t[(4i + c)·tw..].
        for c in 0..4 {
            bt_rows([col(0, c), col(1, c), col(2, c), col(3, c)], four_rows(&mut t[c * tw..], 4 * tw, tw));
        }
        // V[4i + c] = (t B)[i][c].
        for i in 0..4 {
            let ti = &t[4 * i * tw..][..4 * tw];
            let rows: [&[f32]; 4] = core::array::from_fn(|c| &ti[c * tw..][..tw]);
            bt_rows(rows, four_rows(&mut v[4 * i * stride + at..], stride, tw));
        }
    }
}

/// `out = Bᵀ·[d0, d1, d2, d3]` element-wise along the rows, with
/// Bᵀ = [[1,0,-1,0],[0,1,1,0],[0,-1,1,0],[0,1,0,-1]].
#[inline(always)]
fn bt_rows([d0, d1, d2, d3]: [&[f32]; 4], [o0, o1, o2, o3]: [&mut [f32]; 4]) {
    for x in 0..o0.len() {
        o0[x] = d0[x] - d2[x];
        o1[x] = d1[x] + d2[x];
        o2[x] = d2[x] - d1[x];
        o3[x] = d1[x] - d3[x];
    }
}

/// Rows `0, stride, 2·stride, 3·stride` of `s`, `len` values each.
#[inline(always)]
fn four_rows(s: &mut [f32], stride: usize, len: usize) -> [&mut [f32]; 4] {
    let (r0, rest) = s.split_at_mut(stride);
    let (r1, rest) = rest.split_at_mut(stride);
    let (r2, r3) = rest.split_at_mut(stride);
    [&mut r0[..len], &mut r1[..len], &mut r2[..len], &mut r3[..len]]
}

/// Output channel `co`'s rows of a block: `Y = Aᵀ m A + bias` per tile
/// (`m[ξ]` = `M[ξ][co][tile]`), with Aᵀ = [[1,1,1,0],[0,1,-1,-1]]; tiles
/// hanging over the output's last row or column write only what exists.
#[allow(clippy::too_many_arguments)]
fn transform_outputs(m: &[f32], og: usize, nt: usize, co: usize, tw: usize, ow: usize, rows: usize, bias: f32, out: &mut [f32]) {
    with_local(&ROWS, |buf| {
        buf.resize(4 * tw, 0.0);
        for ty in 0..nt / tw {
            output_row(m, og * nt, co * nt + ty * tw, tw, bias, buf);
            for r in 0..2 {
                let y = 2 * ty + r;
                if y >= rows {
                    continue;
                }
                let dst = &mut out[y * ow..][..ow];
                let (y0, y1) = (&buf[2 * r * tw..][..tw], &buf[(2 * r + 1) * tw..][..tw]);
                for (x, pair) in dst.chunks_mut(2).enumerate() {
                    pair[0] = y0[x];
                    if pair.len() == 2 {
                        pair[1] = y1[x];
                    }
                }
            }
        }
    });
}

simd_dispatch! {
    /// One tile row's output transform: tile tx's `q[ξ]` is
    /// `m[ξ·stride + at + tx]`; `ys[(2r + c)·tw + tx]` gets Y[r][c] + bias.
    fn output_row(m: &[f32], stride: usize, at: usize, tw: usize, bias: f32, ys: &mut [f32]) {
        let q = |xi: usize| &m[xi * stride + at..][..tw];
        let (y00, rest) = ys.split_at_mut(tw);
        let (y01, rest) = rest.split_at_mut(tw);
        let (y10, y11) = rest.split_at_mut(tw);
        let (y00, y01, y10, y11) = (&mut y00[..tw], &mut y01[..tw], &mut y10[..tw], &mut y11[..tw]);
        // s = Aᵀ q: s0 = q0 + q1 + q2, s1 = q1 - q2 - q3 (rows of 4).
        let (q0, q1, q2, q3) = (q(0), q(1), q(2), q(3));
        let (q4, q5, q6, q7) = (q(4), q(5), q(6), q(7));
        let (q8, q9, q10, q11) = (q(8), q(9), q(10), q(11));
        let (q12, q13, q14, q15) = (q(12), q(13), q(14), q(15));
        for x in 0..tw {
            let s00 = q0[x] + q4[x] + q8[x];
            let s01 = q1[x] + q5[x] + q9[x];
            let s02 = q2[x] + q6[x] + q10[x];
            let s03 = q3[x] + q7[x] + q11[x];
            let s10 = q4[x] - q8[x] - q12[x];
            let s11 = q5[x] - q9[x] - q13[x];
            let s12 = q6[x] - q10[x] - q14[x];
            let s13 = q7[x] - q11[x] - q15[x];
            y00[x] = s00 + s01 + s02 + bias;
            y01[x] = s01 - s02 - s03 + bias;
            y10[x] = s10 + s11 + s12 + bias;
            y11[x] = s11 - s12 - s13 + bias;
        }
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
