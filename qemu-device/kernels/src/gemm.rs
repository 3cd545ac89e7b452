//! Matrix multiplication with fused bias and activation.

use crate::activation::{epilogue, Activation, Bias};
use crate::error::Result;
use crate::microkernel::{gemm_packed, pack_b, packed_len, MatA, MatB, MR, NR};
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
    check_len("gemm B", b.len(), mul("gemm B size", k, n)?)?;
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
            let rows = rows_per_task(n);
            c.par_chunks_mut(rows * n).enumerate().for_each(|(t, chunk)| {
                for (r, row) in chunk.chunks_exact_mut(n).enumerate() {
                    let off = (t * rows + r) * n;
                    epilogue(row, bias, residual.map(|res| &res[off..off + n]), p.activation);
                }
            });
        }
        return Ok(());
    }
    // Tasks: chunks of B's column panels (each task packs its own chunk,
    // sized to stay in L2) times blocks of A's rows when the chunks alone
    // are too few for the threads. Each task applies the epilogue to its
    // tile of C while it is in cache.
    let threads = plan_threads(sequential);
    let panels = n.div_ceil(NR);
    let chunk = (B_CHUNK / (k * NR)).clamp(1, panels);
    let mut nchunks = panels.div_ceil(chunk);
    let chunk = panels.div_ceil(nchunks);
    nchunks = panels.div_ceil(chunk);
    // Several tasks per thread for balance; one thread packs each chunk once.
    let want = if sequential { 1 } else { 4 * threads };
    let mblocks = if nchunks >= want { 1 } else { want.div_ceil(nchunks).min(m.div_ceil(4 * MR)).max(1) };
    let mb = m.div_ceil(mblocks).div_ceil(MR) * MR;
    let mblocks = m.div_ceil(mb);
    let c_ptr = SendPtr(c.as_mut_ptr());
    let task = |task: usize| {
        let (jc, ib) = (task / mblocks, task % mblocks);
        let j0 = jc * chunk * NR;
        let nc = (chunk * NR).min(n - j0);
        let i0 = ib * mb;
        let mc = mb.min(m - i0);
        with_scratch(packed_len(k, nc), |bp| {
            // SAFETY: columns j0..j0+nc < n, rows < k of B (lengths checked).
            unsafe { pack_b(bp, b.as_ptr().offset(j0 as isize * b_cs), b_rs, b_cs, k, nc) };
            // SAFETY: rows i0..i0+mc of A; C's block (i0.., j0..) of mc × nc
            // with row stride n is written by this task only.
            unsafe {
                let a_blk = MatA { ptr: a.as_ptr().offset(i0 as isize * a_rs), rs: a_rs, cs: a_cs };
                gemm_packed(mc, nc, k, a_blk, MatB::Packed(bp), c_ptr.get().add(i0 * n + j0), n, p.accumulate);
            }
            if has_epilogue {
                for i in i0..i0 + mc {
                    let off = i * n + j0;
                    // SAFETY: this task's part of row i, as above.
                    let row = unsafe { core::slice::from_raw_parts_mut(c_ptr.get().add(off), nc) };
                    let bias = match bias {
                        Bias::Row(b) => Bias::Row(&b[j0..j0 + nc]),
                        other => other,
                    };
                    epilogue(row, bias, residual.map(|r| &r[off..off + nc]), p.activation);
                }
            }
        })
    };
    for_each_task(nchunks * mblocks, sequential, task);
    Ok(())
}

/// Floats of B one task packs (256 KiB: stays in L2).
const B_CHUNK: usize = 1 << 16;

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
