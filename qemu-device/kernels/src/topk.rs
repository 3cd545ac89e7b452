//! TopK: the k largest or smallest elements of every line along an axis,
//! sorted, with their indices.

use std::cmp::Ordering;

use crate::error::{KernelError, Result};
use crate::util::{check_len, mul};
use rayon::prelude::*;

/// Order of the selection: `a` before `b` when it is larger (`largest`)
/// or smaller; NaN counts as above +inf; equal values by ascending index.
fn order(largest: bool, (va, ia): (f32, u32), (vb, ib): (f32, u32)) -> Ordering {
    let by_value = match (va.is_nan(), vb.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => va.partial_cmp(&vb).unwrap_or(Ordering::Equal),
    };
    let by_value = if largest { by_value.reverse() } else { by_value };
    by_value.then(ia.cmp(&ib))
}

/// For every line `(o, i)` of `x` viewed as `[outer, len, inner]`, writes
/// the `k` selected values to `values[o, 0..k, i]` and their positions
/// along the axis (as f32) to `indices` likewise. Parallel over lines.
#[allow(clippy::too_many_arguments)]
pub fn top_k(largest: bool, outer: usize, len: usize, inner: usize, k: usize, x: &[f32], values: &mut [f32], indices: &mut [f32]) -> Result<()> {
    if k > len {
        return Err(KernelError::invalid("topk", format!("k {k} is larger than the axis ({len})")));
    }
    if len > 1 << 24 {
        return Err(KernelError::invalid("topk", format!("an axis of {len} elements; indices are exact below 2^24")));
    }
    check_len("topk input", x.len(), mul("topk input", mul("topk input", outer, len)?, inner)?)?;
    let n_out = mul("topk output", mul("topk output", outer, k)?, inner)?;
    check_len("topk values", values.len(), n_out)?;
    check_len("topk indices", indices.len(), n_out)?;
    if n_out == 0 {
        return Ok(());
    }
    // One task per outer slab: its inner lines share the same rows.
    let slab = k * inner;
    values.par_chunks_mut(slab).zip(indices.par_chunks_mut(slab)).enumerate().for_each(|(o, (vs, is))| {
        let mut line: Vec<(f32, u32)> = Vec::with_capacity(len);
        for i in 0..inner {
            line.clear();
            line.extend((0..len).map(|l| (x[(o * len + l) * inner + i], l as u32)));
            let cmp = |a: &(f32, u32), b: &(f32, u32)| order(largest, *a, *b);
            if k < len {
                line.select_nth_unstable_by(k, cmp);
            }
            line[..k].sort_unstable_by(cmp);
            for (r, &(v, at)) in line[..k].iter().enumerate() {
                vs[r * inner + i] = v;
                is[r * inner + i] = at as f32;
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a full stable sort of each line.
    #[test]
    fn matches_a_full_sort_with_ties_and_nan() {
        let (outer, len, inner) = (3, 17, 4);
        let x: Vec<f32> = (0..outer * len * inner)
            .map(|i| match i % 23 {
                5 => f32::NAN,
                7 => f32::INFINITY,
                11 => f32::NEG_INFINITY,
                j => ((j * 7) % 5) as f32 * 0.5 - 1.0, // many ties
            })
            .collect();
        for largest in [true, false] {
            for k in [0, 1, 3, 16, 17] {
                let mut v = vec![0.0; outer * k * inner];
                let mut ix = vec![0.0; outer * k * inner];
                top_k(largest, outer, len, inner, k, &x, &mut v, &mut ix).unwrap();
                for o in 0..outer {
                    for i in 0..inner {
                        let mut line: Vec<(f32, u32)> = (0..len).map(|l| (x[(o * len + l) * inner + i], l as u32)).collect();
                        line.sort_by(|a, b| order(largest, *a, *b));
                        for r in 0..k {
                            let (want_v, want_i) = line[r];
                            let (got_v, got_i) = (v[(o * k + r) * inner + i], ix[(o * k + r) * inner + i]);
                            assert_eq!((got_v.to_bits(), got_i), (want_v.to_bits(), want_i as f32), "largest {largest} k {k} line ({o}, {i}) rank {r}");
                        }
                    }
                }
            }
        }
        // The order itself: NaN first for largest, +inf then the rest;
        // ties by index.
        let mut v = [0.0; 4];
        let mut ix = [0.0; 4];
        top_k(true, 1, 5, 1, 4, &[1.0, f32::NAN, 2.0, f32::INFINITY, 2.0], &mut v, &mut ix).unwrap();
        assert!(v[0].is_nan());
        assert_eq!((&v[1..], ix), (&[f32::INFINITY, 2.0, 2.0][..], [1.0, 3.0, 2.0, 4.0]));
        top_k(false, 1, 5, 1, 4, &[1.0, f32::NAN, 2.0, f32::INFINITY, 2.0], &mut v, &mut ix).unwrap();
        assert_eq!((v, ix), ([1.0, 2.0, 2.0, f32::INFINITY], [0.0, 2.0, 4.0, 3.0]));
    }

    #[test]
    fn bad_parameters_write_nothing() {
        let mut v = [7.0; 4];
        let mut ix = [7.0; 4];
        assert!(top_k(true, 1, 3, 1, 4, &[1.0; 3], &mut v, &mut ix).is_err());
        assert!(top_k(true, 1, 4, 1, 4, &[1.0; 3], &mut v, &mut ix).is_err());
        assert!(top_k(true, 1, 4, 1, 3, &[1.0; 4], &mut v, &mut ix).is_err());
        assert_eq!((v, ix), ([7.0; 4], [7.0; 4]));
    }
}
