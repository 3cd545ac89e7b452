//! Element-wise binary operations with numpy-style broadcasting.

use crate::error::{KernelError, Result};
use crate::util::{check_len, check_rank, rows_per_task, volume, PAR_CHUNK};
use crate::MAX_RANK;
use rayon::prelude::*;

/// Element-wise binary operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// IEEE division (`x/0` is `±inf` or `NaN`).
    Div,
    /// `f32::max` (a NaN operand yields the other operand).
    Max,
    /// `f32::min` (a NaN operand yields the other operand).
    Min,
    /// `f32::powf`.
    Pow,
}

/// The numpy broadcast of two shapes (right-aligned; each dimension pair
/// must be equal or contain a 1). Ranks up to [`MAX_RANK`].
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    check_rank("binary lhs shape", a)?;
    check_rank("binary rhs shape", b)?;
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i < rank - a.len() { 1 } else { a[i - (rank - a.len())] };
        let db = if i < rank - b.len() { 1 } else { b[i - (rank - b.len())] };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(KernelError::Broadcast {
                a: a.to_vec(),
                b: b.to_vec(),
            });
        };
    }
    Ok(out)
}

/// `out = op(a, b)` with broadcasting; `out` has the element count of
/// [`broadcast_shape`]`(a_shape, b_shape)` (row-major). Parallel.
pub fn binary(op: BinaryOp, a: &[f32], a_shape: &[usize], b: &[f32], b_shape: &[usize], out: &mut [f32]) -> Result<()> {
    let out_shape = broadcast_shape(a_shape, b_shape)?;
    let out_len = volume("binary output", &out_shape)?;
    check_len("binary lhs", a.len(), volume("binary lhs", a_shape)?)?;
    check_len("binary rhs", b.len(), volume("binary rhs", b_shape)?)?;
    check_len("binary output", out.len(), out_len)?;
    match op {
        BinaryOp::Add => run(|x, y| x + y, a, a_shape, b, b_shape, &out_shape, out),
        BinaryOp::Sub => run(|x, y| x - y, a, a_shape, b, b_shape, &out_shape, out),
        BinaryOp::Mul => run(|x, y| x * y, a, a_shape, b, b_shape, &out_shape, out),
        BinaryOp::Div => run(|x, y| x / y, a, a_shape, b, b_shape, &out_shape, out),
        BinaryOp::Max => run(f32::max, a, a_shape, b, b_shape, &out_shape, out),
        BinaryOp::Min => run(f32::min, a, a_shape, b, b_shape, &out_shape, out),
        BinaryOp::Pow => run(f32::powf, a, a_shape, b, b_shape, &out_shape, out),
    }
    Ok(())
}

/// One coalesced dimension: size and element strides in a and b.
#[derive(Clone, Copy, Debug)]
struct Dim {
    size: usize,
    sa: usize,
    sb: usize,
}

/// Row kernel: `out[j] = f(a[j·sa], b[j·sb])` with sa, sb ∈ {0, 1}.
#[inline(always)]
fn row<F: Fn(f32, f32) -> f32>(f: &F, a: &[f32], sa: usize, b: &[f32], sb: usize, out: &mut [f32]) {
    let n = out.len();
    match (sa, sb) {
        (1, 1) => {
            for ((o, &x), &y) in out.iter_mut().zip(&a[..n]).zip(&b[..n]) {
                *o = f(x, y);
            }
        }
        (1, _) => {
            let y = b[0];
            for (o, &x) in out.iter_mut().zip(&a[..n]) {
                *o = f(x, y);
            }
        }
        (_, 1) => {
            let x = a[0];
            for (o, &y) in out.iter_mut().zip(&b[..n]) {
                *o = f(x, y);
            }
        }
        _ => out.fill(f(a[0], b[0])),
    }
}

#[allow(clippy::too_many_arguments)]
fn run<F: Fn(f32, f32) -> f32 + Sync>(
    f: F,
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
    out_shape: &[usize],
    out: &mut [f32],
) {
    if out.is_empty() {
        return;
    }
    // Strides of a and b aligned to the output's dims (0 where broadcast),
    // coalesced from the innermost dimension outwards.
    let rank = out_shape.len();
    let mut dims: Vec<Dim> = Vec::with_capacity(MAX_RANK);
    let (mut stride_a, mut stride_b) = (1usize, 1usize);
    for i in (0..rank).rev() {
        let size = out_shape[i];
        let da = if i + a_shape.len() >= rank { a_shape[i + a_shape.len() - rank] } else { 1 };
        let db = if i + b_shape.len() >= rank { b_shape[i + b_shape.len() - rank] } else { 1 };
        let sa = if da == 1 { 0 } else { stride_a };
        let sb = if db == 1 { 0 } else { stride_b };
        stride_a *= da;
        stride_b *= db;
        if size == 1 {
            continue;
        }
        match dims.last_mut() {
            Some(last) if sa == last.sa * last.size && sb == last.sb * last.size => last.size *= size,
            _ => dims.push(Dim { size, sa, sb }),
        }
    }
    if dims.is_empty() {
        dims.push(Dim { size: 1, sa: 0, sb: 0 });
    }
    // dims[0] is innermost.
    let inner = dims[0];
    let outer = &dims[1..];
    let rows = rows_per_task(inner.size);
    let task = rows * inner.size;
    if outer.is_empty() {
        out.par_chunks_mut(PAR_CHUNK).enumerate().for_each(|(t, o)| {
            let j0 = t * PAR_CHUNK;
            row(&f, &a[j0 * inner.sa..], inner.sa, &b[j0 * inner.sb..], inner.sb, o);
        });
        return;
    }
    out.par_chunks_mut(task).enumerate().for_each(|(t, chunk)| {
        for (r, o) in chunk.chunks_exact_mut(inner.size).enumerate() {
            let mut idx = t * rows + r;
            let (mut oa, mut ob) = (0, 0);
            for d in outer {
                let i = idx % d.size;
                idx /= d.size;
                oa += i * d.sa;
                ob += i * d.sb;
            }
            row(&f, &a[oa..], inner.sa, &b[ob..], inner.sb, o);
        }
    });
}
