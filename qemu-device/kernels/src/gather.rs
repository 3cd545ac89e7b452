//! ONNX Gather.

use crate::error::{KernelError, Result};
use crate::util::{check_len, check_rank, mul, normalize_axis, rows_per_task, split_axis, volume};
use rayon::prelude::*;

/// An integer type usable as a gather index (`i32` or `i64`).
pub trait GatherIndex: Copy + Send + Sync {
    fn to_i64(self) -> i64;
}
impl GatherIndex for i32 {
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
}
impl GatherIndex for i64 {
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self
    }
}

/// Resolves an index against an axis of `size`: negative indices count from
/// the end; anything outside `-size..size` is `None`.
#[inline(always)]
fn resolve(i: i64, size: usize) -> Option<usize> {
    let size = i64::try_from(size).ok()?;
    let j = if i < 0 { i.checked_add(size)? } else { i };
    (0..size).contains(&j).then_some(j as usize)
}

/// Output shape of [`gather`]:
/// `shape[..axis] ++ indices_shape ++ shape[axis+1..]`.
pub fn gather_output_shape(shape: &[usize], axis: isize, indices_shape: &[usize]) -> Result<Vec<usize>> {
    check_rank("gather data shape", shape)?;
    check_rank("gather indices shape", indices_shape)?;
    let axis = normalize_axis(axis, shape.len())?;
    let mut out = shape[..axis].to_vec();
    out.extend_from_slice(indices_shape);
    out.extend_from_slice(&shape[axis + 1..]);
    volume("gather output", &out)?;
    Ok(out)
}

/// ONNX Gather: `out[o, t, i] = data[o, indices[t], i]` where `o` ranges over
/// the dimensions before `axis`, `t` over `indices_shape`, and `i` over the
/// dimensions after `axis` (output shape per [`gather_output_shape`]).
///
/// Ranks ≤ 6 for `shape` and `indices_shape`. Negative indices wrap once
/// (ONNX); all indices are checked before anything is written, and any
/// outside `-size..size` is an error. Parallel.
pub fn gather<I: GatherIndex>(
    data: &[f32],
    shape: &[usize],
    axis: isize,
    indices: &[I],
    indices_shape: &[usize],
    out: &mut [f32],
) -> Result<()> {
    gather_output_shape(shape, axis, indices_shape)?;
    let axis = normalize_axis(axis, shape.len())?;
    check_len("gather data", data.len(), volume("gather data", shape)?)?;
    let n_idx = volume("gather indices", indices_shape)?;
    check_len("gather indices", indices.len(), n_idx)?;
    let (outer, size, inner) = split_axis("gather data shape", shape, axis)?;
    check_len("gather output", out.len(), volume("gather output", &[outer, n_idx, inner])?)?;
    if let Some((position, &index)) = indices.iter().enumerate().find(|(_, i)| resolve(i.to_i64(), size).is_none()) {
        return Err(KernelError::IndexOutOfRange {
            index: index.to_i64(),
            position,
            size,
        });
    }
    if out.is_empty() {
        return Ok(());
    }
    let rows = rows_per_task(inner);
    let block = mul("gather output", rows, inner)?;
    out.par_chunks_mut(block).enumerate().for_each(|(task, chunk)| {
        for (r, dst) in chunk.chunks_exact_mut(inner).enumerate() {
            let row = task * rows + r;
            let (o, t) = (row / n_idx, row % n_idx);
            // Validated above.
            let j = resolve(indices[t].to_i64(), size).unwrap_or(0);
            dst.copy_from_slice(&data[(o * size + j) * inner..][..inner]);
        }
    });
    Ok(())
}
