//! Matrix multiplication with fused bias and activation.

use crate::activation::{epilogue, Activation, Bias};
use crate::error::KernelError;
use crate::error::Result;
use crate::fastmath::{madd, simd_dispatch};
use crate::microkernel::{gemm_packed, pack_b, packed_len, MatA, MatB, Post, MR, NR};
use crate::util::{check_len, for_each_task, mul, plan_threads, rows_per_task, sequential, with_scratch, SendPtr};
use rayon::prelude::*;

/// Parameters of [`gemm()`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GemmParams {
    /// Rows of `op(A)` and of `C`.
    pub m: usize,
    /// Columns of `op(B)` and of `C`.
    pub n: usize,
    /// Columns of `op(A)` = rows of `op(B)`.
    pub k: usize,
    /// `A` is stored as `[k × m]` (row-major) and used transposed.
    pub trans_a: bool,
    /// `B` is stored as `[n × k]` (row-major) and used transposed.
    pub trans_b: bool,
    /// Add the product to the existing contents of `C` (beta = 1) instead of
    /// overwriting it (beta = 0; `C`'s old contents are never read, so they
    /// may be garbage or NaN).
    pub accumulate: bool,
    /// Activation applied last.
    pub activation: Activation,
    /// `B` is stored in the packed panel layout of
    /// `rbln_hw::ops::pack_gemm_b` (`gemm_packed_b_len(k, n)` elements)
    /// and streamed as it lies; excludes `trans_b`.
    pub b_packed: bool,
}

/// `C = act(op(A)·op(B) + bias + (accumulate ? C : 0))`, all row-major.
///
/// `a` has `m·k` elements (`[m×k]`, or `[k×m]` with `trans_a`), `b` has
/// `k·n` (`[k×n]`, or `[n×k]` with `trans_b`), `bias` (broadcast over rows)
/// has `n`, and `c` has `m·n`. `k = 0` yields `act(bias + C?)`.
///
/// Runs on the current rayon pool (see the crate docs).
pub fn gemm(p: &GemmParams, a: &[f32], b: &[f32], bias: Option<&[f32]>, c: &mut [f32]) -> Result<()> {
    gemm_residual(p, a, b, bias, None, c)
}

/// `C = act(op(A)·op(B) + bias + residual + (accumulate ? C : 0))`: [`gemm()`]
/// with a residual (skip connection) of `C`'s shape (`m·n` elements,
/// row-major) added in the same pass as the bias, before the activation.
pub fn gemm_residual(
    p: &GemmParams,
    a: &[f32],
    b: &[f32],
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    c: &mut [f32],
) -> Result<()> {
    let (m, n, k) = (p.m, p.n, p.k);
    check_len("gemm A", a.len(), mul("gemm A size", m, k)?)?;
    if p.b_packed {
        if p.trans_b {
            return Err(KernelError::invalid("gemm B", "a packed B cannot also be transposed"));
        }
        let len = rbln_hw::ops::gemm_packed_b_len(k as u64, n as u64).and_then(|l| usize::try_from(l).ok());
        check_len("gemm B (packed)", b.len(), len.ok_or(KernelError::Overflow { what: "gemm B size" })?)?;
    } else {
        check_len("gemm B", b.len(), mul("gemm B size", k, n)?)?;
    }
    let mn = mul("gemm C size", m, n)?;
    check_len("gemm C", c.len(), mn)?;
    if let Some(bias) = bias {
        check_len("gemm bias", bias.len(), n)?;
    }
    if let Some(r) = residual {
        check_len("gemm residual", r.len(), mn)?;
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (a_rs, a_cs) = if p.trans_a { (1, m as isize) } else { (k as isize, 1) };
    let (b_rs, b_cs) = if p.trans_b { (1, k as isize) } else { (n as isize, 1) };
    let bias = match bias {
        Some(b) => Bias::Row(b),
        None => Bias::None,
    };
    let has_epilogue = !matches!(bias, Bias::None) || residual.is_some() || p.activation != Activation::None;
    let sequential = sequential(m.saturating_mul(n).saturating_mul(k).saturating_mul(2));
    let epilogue_rows = |c: &mut [f32]| {
        let rows = rows_per_task(n);
        c.par_chunks_mut(rows * n).enumerate().for_each(|(t, chunk)| {
            for (r, row) in chunk.chunks_exact_mut(n).enumerate() {
                let off = (t * rows + r) * n;
                epilogue(row, bias, residual.map(|res| &res[off..off + n]), p.activation);
            }
        });
    };
    if p.b_packed && (m < 2 * MR || k == 0) {
        // Few rows: stream each panel once for all of them.
        let panels = n.div_ceil(NR);
        let per_task = if sequential { panels } else { panels.div_ceil(4 * plan_threads(false)).max(1) };
        let c_ptr = SendPtr(c.as_mut_ptr());
        for_each_task(panels.div_ceil(per_task), sequential, |t| {
            let (p0, p1) = (t * per_task, ((t + 1) * per_task).min(panels));
            // SAFETY: columns p0·NR .. min(p1·NR, n) of every row of C are
            // this task's only; `b` holds every panel (length checked).
            unsafe { few_rows_packed(m, n, k, a, a_rs, a_cs, b, p0, p1, c_ptr, p.accumulate) };
        });
        if has_epilogue {
            epilogue_rows(c);
        }
        return Ok(());
    }
    if m < 2 * MR || k == 0 {
        // Matrix-vector shapes: the 6-row microkernel would mostly compute
        // padding rows; the gemm crate has kernels for them.
        // SAFETY: the lengths were checked above: every (i, l) with i < m,
        // l < k maps to an element of `a` under (a_rs, a_cs), likewise for
        // `b` and `c`.
        unsafe {
            raw_gemm(m, n, k, c.as_mut_ptr(), n, p.accumulate, a.as_ptr(), a_rs, a_cs, b.as_ptr(), b_rs, b_cs, !sequential);
        }
        if has_epilogue {
            epilogue_rows(c);
        }
        return Ok(());
    }
    // Tasks: chunks of B's column panels (each task packs its own chunk,
    // sized to stay in L2) times blocks of A's rows when the chunks alone
    // are too few for the threads. Each task applies the epilogue to its
    // tile of C while it is in cache.
    let threads = plan_threads(sequential);
    // Several tasks per thread for balance.
    let want = if sequential { 1 } else { 4 * threads };
    let panels = n.div_ceil(NR);
    // Packed or not, chunks are sized for L2 before rows are split: a
    // packed B split into more column chunks than that (one per task)
    // made each task stream all of A for a few columns, with its epilogue
    // on rows that narrow (ConvNeXt's 3136x384x96 +GELU: 1.45x the time
    // of the unpacked path on two threads).
    let chunk = (B_CHUNK / (k * NR)).clamp(1, panels);
    let mut nchunks = panels.div_ceil(chunk);
    let chunk = panels.div_ceil(nchunks);
    nchunks = panels.div_ceil(chunk);
    // Unpacked B: one thread packs each chunk once.
    let mblocks = if nchunks >= want { 1 } else { want.div_ceil(nchunks).min(m.div_ceil(4 * MR)).max(1) };
    let mb = m.div_ceil(mblocks).div_ceil(MR) * MR;
    let mblocks = m.div_ceil(mb);
    let c_ptr = SendPtr(c.as_mut_ptr());
    let (clamp, rest) = p.activation.as_clamp();
    let task = |task: usize| {
        let (jc, ib) = (task / mblocks, task % mblocks);
        let j0 = jc * chunk * NR;
        let nc = (chunk * NR).min(n - j0);
        let i0 = ib * mb;
        let mc = mb.min(m - i0);
        // The bias, residual and a clamp go with the microkernel's stores.
        let post = Post {
            col_bias: match bias {
                Bias::Row(b) => Some(&b[j0..j0 + nc]),
                _ => None,
            },
            residual: residual.map(|r| (r[i0 * n + j0..].as_ptr(), n)),
            clamp,
            ..Post::default()
        };
        let multiply = |bp: &[f32]| {
            // SAFETY: rows i0..i0+mc of A; C's block (i0.., j0..) of mc × nc
            // with row stride n is written by this task only; the bias has
            // its nc columns, the residual (C's shape) its block.
            unsafe {
                let a_blk = MatA { ptr: a.as_ptr().offset(i0 as isize * a_rs), rs: a_rs, cs: a_cs };
                gemm_packed(mc, nc, k, a_blk, MatB::Packed(bp), c_ptr.get().add(i0 * n + j0), n, p.accumulate, Some(&post));
            }
        };
        if p.b_packed {
            // Panels j0/NR .. are contiguous: this chunk is one slice.
            multiply(&b[j0 * k..][..packed_len(k, nc)]);
        } else {
            with_scratch(packed_len(k, nc), |bp| {
                // SAFETY: columns j0..j0+nc < n, rows < k of B (lengths checked).
                unsafe { pack_b(bp, b.as_ptr().offset(j0 as isize * b_cs), b_rs, b_cs, k, nc) };
                multiply(bp);
            });
        }
        if rest != Activation::None {
            for i in i0..i0 + mc {
                // SAFETY: this task's part of row i, as above.
                let row = unsafe { core::slice::from_raw_parts_mut(c_ptr.get().add(i * n + j0), nc) };
                epilogue(row, Bias::None, None, rest);
            }
        }
    };
    for_each_task(nchunks * mblocks, sequential, task);
    Ok(())
}

/// Floats of B one task packs (256 KiB: stays in L2).
const B_CHUNK: usize = 1 << 16;

/// Rows of A [`few_rows_packed`] multiplies per pass over a panel.
const FEW_ROWS: usize = 4;

/// `C[:, p0·NR .. min(p1·NR, n)] (+)= A · B` for a packed B and few rows
/// of A (matrix-vector shapes): each panel is streamed once per
/// [`FEW_ROWS`] rows, with every column of the panel in registers.
///
/// # Safety
/// A is `m × k` under (a_rs, a_cs) inside `a`; `b` holds the packed panels
/// `p0..p1` (`k·NR` floats each); C (`m × n`, row stride n) is writable in
/// those columns and nothing else accesses them meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn few_rows_packed(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    a_rs: isize,
    a_cs: isize,
    b: &[f32],
    p0: usize,
    p1: usize,
    c: SendPtr<f32>,
    acc: bool,
) {
    with_scratch(FEW_ROWS * k, |arows| {
        let mut i0 = 0;
        while i0 < m {
            let rows = FEW_ROWS.min(m - i0);
            // The rows of A, contiguous ([FEW_ROWS × k], missing rows 0).
            arows.fill(0.0);
            for r in 0..rows {
                for l in 0..k {
                    arows[r * k + l] = a[((i0 + r) as isize * a_rs + l as isize * a_cs) as usize];
                }
            }
            for p in p0..p1 {
                let mut out = [[0.0f32; NR]; FEW_ROWS];
                let panel = &b[p * k * NR..][..k * NR];
                if rows == 1 {
                    panel_row(&mut out[0], &arows[..k], panel);
                } else {
                    panel_rows(&mut out, arows, k, panel);
                }
                let j0 = p * NR;
                let w = NR.min(n - j0);
                for (r, o) in out.iter().enumerate().take(rows) {
                    // SAFETY: row i0 + r < m, columns j0..j0+w < n of C:
                    // this task's (contract).
                    let dst = unsafe { core::slice::from_raw_parts_mut(c.get().add((i0 + r) * n + j0), w) };
                    if acc {
                        for (d, &v) in dst.iter_mut().zip(o) {
                            *d += v;
                        }
                    } else {
                        dst.copy_from_slice(&o[..w]);
                    }
                }
            }
            i0 += rows;
        }
    })
}

simd_dispatch! {
    /// `out[j] = Σ_l arow[l] · panel[l·NR + j]`, two steps of `l` at a
    /// time into separate sums (two dependency chains per register).
    fn panel_row(out: &mut [f32; NR], arow: &[f32], panel: &[f32]) {
        let mut s = [[0.0f32; NR]; 2];
        let pairs = panel.chunks_exact(2 * NR);
        let tail = pairs.remainder();
        for (l2, pr) in pairs.enumerate() {
            let (a0, a1) = (arow[2 * l2], arow[2 * l2 + 1]);
            for j in 0..NR {
                s[0][j] = madd::<FMA>(a0, pr[j], s[0][j]);
                s[1][j] = madd::<FMA>(a1, pr[NR + j], s[1][j]);
            }
        }
        if !tail.is_empty() {
            let av = arow[arow.len() - 1];
            for j in 0..NR {
                s[0][j] = madd::<FMA>(av, tail[j], s[0][j]);
            }
        }
        for j in 0..NR {
            out[j] = s[0][j] + s[1][j];
        }
    }
}

simd_dispatch! {
    /// `out[r][j] = Σ_l arows[r·k + l] · panel[l·NR + j]` for all
    /// [`FEW_ROWS`] rows (the caller zero-fills rows it does not use).
    fn panel_rows(out: &mut [[f32; NR]; FEW_ROWS], arows: &[f32], k: usize, panel: &[f32]) {
        let mut s = [[0.0f32; NR]; FEW_ROWS];
        for (l, prow) in panel.chunks_exact(NR).enumerate() {
            for (r, sr) in s.iter_mut().enumerate() {
                let av = arows[r * k + l];
                for j in 0..NR {
                    sr[j] = madd::<FMA>(av, prow[j], sr[j]);
                }
            }
        }
        *out = s;
    }
}

/// `dst[m×n] (row stride dst_rs, column stride 1) = lhs·rhs (+ dst if read_dst)`
/// through the `gemm` crate, on the current rayon pool if `parallel`.
///
/// # Safety
/// Every `dst + i·dst_rs + j` (i < m, j < n) must be valid for writes (and
/// reads if `read_dst`), every `lhs + i·lhs_rs + l·lhs_cs` and
/// `rhs + l·rhs_rs + j·rhs_cs` (l < k) valid for reads, and the regions must
/// not overlap `dst`'s.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn raw_gemm(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    read_dst: bool,
    lhs: *const f32,
    lhs_rs: isize,
    lhs_cs: isize,
    rhs: *const f32,
    rhs_rs: isize,
    rhs_cs: isize,
    parallel: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_rs as isize,
        read_dst,
        lhs,
        lhs_cs,
        lhs_rs,
        rhs,
        rhs_cs,
        rhs_rs,
        1.0f32,
        1.0f32,
        false,
        false,
        false,
        if parallel {
            gemm::Parallelism::Rayon(0)
        } else {
            gemm::Parallelism::None
        },
    );
}
