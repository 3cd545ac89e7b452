//! Reductions along one axis.

use crate::error::Result;
use crate::util::{check_len, check_rank, max_f32, min_f32, normalize_axis, rows_per_task, split_axis, sum_f32, volume, PAR_CHUNK};
use rayon::prelude::*;

/// Reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum (0 over an empty axis).
    Sum,
    /// Arithmetic mean (NaN over an empty axis).
    Mean,
    /// Maximum, ignoring NaN like `f32::max` (`-inf` over an empty axis).
    Max,
    /// Minimum, ignoring NaN like `f32::min` (`+inf` over an empty axis).
    Min,
}

impl ReduceOp {
    fn identity(self) -> f32 {
        match self {
            ReduceOp::Sum | ReduceOp::Mean => 0.0,
            ReduceOp::Max => f32::NEG_INFINITY,
            ReduceOp::Min => f32::INFINITY,
        }
    }
}

/// Reduces `x` (shape `shape`, rank ≤ 6) along `axis` (negative counts from
/// the end). `y` has the input's shape with that axis removed — equivalently
/// set to 1 (keepdims): the element count is the same. To reduce several
/// axes, chain calls. Parallel.
pub fn reduce(op: ReduceOp, shape: &[usize], axis: isize, x: &[f32], y: &mut [f32]) -> Result<()> {
    check_rank("reduce shape", shape)?;
    let axis = normalize_axis(axis, shape.len())?;
    check_len("reduce input", x.len(), volume("reduce input", shape)?)?;
    let (outer, len, inner) = split_axis("reduce shape", shape, axis)?;
    check_len("reduce output", y.len(), crate::util::mul("reduce output", outer, inner)?)?;
    if y.is_empty() {
        return Ok(());
    }
    if len == 0 {
        let v = match op {
            ReduceOp::Mean => f32::NAN,
            _ => op.identity(),
        };
        y.fill(v);
        return Ok(());
    }
    let scale = 1.0 / len as f32;
    if inner == 1 {
        // Each output reduces one contiguous row of `len`.
        let rows = rows_per_task(len);
        y.par_chunks_mut(rows)
            .zip(x.par_chunks(rows * len))
            .for_each(|(yc, xc)| {
                for (o, xr) in yc.iter_mut().zip(xc.chunks_exact(len)) {
                    *o = match op {
                        ReduceOp::Sum => sum_f32(xr),
                        ReduceOp::Mean => sum_f32(xr) * scale,
                        ReduceOp::Max => max_f32(xr),
                        ReduceOp::Min => min_f32(xr),
                    };
                }
            });
        return Ok(());
    }
    // Output block o (length inner) accumulates `len` rows of `inner`.
    if inner >= PAR_CHUNK {
        // Few, wide blocks: split each into column chunks.
        y.par_chunks_mut(inner).enumerate().for_each(|(o, yb)| {
            let xb = &x[o * len * inner..][..len * inner];
            yb.par_chunks_mut(PAR_CHUNK).enumerate().for_each(|(c, yc)| {
                reduce_columns(op, xb, inner, c * PAR_CHUNK, yc, scale);
            });
        });
    } else {
        let blocks = rows_per_task(len * inner);
        y.par_chunks_mut(blocks * inner)
            .zip(x.par_chunks(blocks * len * inner))
            .for_each(|(yc, xc)| {
                for (yb, xb) in yc.chunks_exact_mut(inner).zip(xc.chunks_exact(len * inner)) {
                    reduce_columns(op, xb, inner, 0, yb, scale);
                }
            });
    }
    Ok(())
}

/// `yc[j] = op over rows r of xb[r·inner + j0 + j]`.
fn reduce_columns(op: ReduceOp, xb: &[f32], inner: usize, j0: usize, yc: &mut [f32], scale: f32) {
    yc.fill(op.identity());
    for xr in xb.chunks_exact(inner) {
        let xs = &xr[j0..j0 + yc.len()];
        match op {
            ReduceOp::Sum | ReduceOp::Mean => {
                for (a, &v) in yc.iter_mut().zip(xs) {
                    *a += v;
                }
            }
            ReduceOp::Max => {
                for (a, &v) in yc.iter_mut().zip(xs) {
                    *a = a.max(v);
                }
            }
            ReduceOp::Min => {
                for (a, &v) in yc.iter_mut().zip(xs) {
                    *a = a.min(v);
                }
            }
        }
    }
    if op == ReduceOp::Mean {
        for a in yc.iter_mut() {
            *a *= scale;
        }
    }
}

/// Index, as f32, of the maximum (`max`) or minimum of every line along
/// `axis` of `x` (shape `shape`) into `y` (the shape without `axis`): the
/// first such element, or the last with `last`. NaN never wins; a line of
/// only NaN (or an empty axis) gives 0.
pub fn arg_reduce(max: bool, last: bool, shape: &[usize], axis: isize, x: &[f32], y: &mut [f32]) -> Result<()> {
    check_rank("argmax shape", shape)?;
    let axis = normalize_axis(axis, shape.len())?;
    check_len("argmax input", x.len(), volume("argmax input", shape)?)?;
    let (outer, len, inner) = split_axis("argmax shape", shape, axis)?;
    check_len("argmax output", y.len(), crate::util::mul("argmax output", outer, inner)?)?;
    let better = |v: f32, best: f32| if max { v > best || (last && v == best) } else { v < best || (last && v == best) };
    let rows = rows_per_task(len.max(1));
    y.par_chunks_mut(rows).enumerate().for_each(|(t, yc)| {
        for (r, o) in yc.iter_mut().enumerate() {
            let q = t * rows + r;
            let (b, i) = (q / inner.max(1), q % inner.max(1));
            let mut best = f32::NAN;
            let mut at = 0usize;
            for l in 0..len {
                let v = x[(b * len + l) * inner + i];
                if v.is_nan() {
                    continue;
                }
                if best.is_nan() || better(v, best) {
                    best = v;
                    at = l;
                }
            }
            *o = at as f32;
        }
    });
    Ok(())
}

#[cfg(test)]
mod arg_tests {
    use super::*;

    #[test]
    fn first_and_last_extremes_along_any_axis() {
        // [2, 3, 2]: along axis 1.
        let x = [1.0, 5.0, 3.0, 5.0, 3.0, f32::NAN, 0.0, -1.0, 0.0, 7.0, f32::NAN, 7.0];
        let mut y = [9.0; 4];
        arg_reduce(true, false, &[2, 3, 2], 1, &x, &mut y).unwrap();
        assert_eq!(y, [1.0, 0.0, 0.0, 1.0]);
        arg_reduce(true, true, &[2, 3, 2], 1, &x, &mut y).unwrap();
        assert_eq!(y, [2.0, 1.0, 1.0, 2.0]);
        arg_reduce(false, false, &[2, 3, 2], -2, &x, &mut y).unwrap();
        assert_eq!(y, [0.0, 0.0, 0.0, 0.0]);
        arg_reduce(false, true, &[2, 3, 2], 1, &x, &mut y).unwrap();
        assert_eq!(y, [0.0, 1.0, 1.0, 0.0]);
        // Along the last axis; a line of NaN and a number picks the number.
        let mut z = [9.0; 6];
        arg_reduce(true, false, &[2, 3, 2], 2, &x, &mut z).unwrap();
        assert_eq!(z, [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
        assert!(arg_reduce(true, false, &[2, 3, 2], 3, &x, &mut y).is_err());
        assert!(arg_reduce(true, false, &[2, 3, 2], 1, &x[..11], &mut y).is_err());
    }
}
