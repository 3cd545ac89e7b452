//! Softmax and layer normalization.

use crate::error::{KernelError, Result};
use crate::fastmath::{self, simd_dispatch};
use crate::util::{check_len, check_rank, max_f32, normalize_axis, rows_per_task, split_axis, sum_f32, volume};
use rayon::prelude::*;

/// Numerically stable softmax of `x` (shape `shape`, rank ≤ 6) along `axis`
/// (negative counts from the end), written to `y` (same shape). Parallel
/// over the slices outside the axis.
pub fn softmax(shape: &[usize], axis: isize, x: &[f32], y: &mut [f32]) -> Result<()> {
    softmax_or_log(shape, axis, false, x, y)
}

/// Log-softmax along `axis`, as [`softmax`] takes it: `(x − m) − ln Σ
/// exp(x − m)` with `m` the maximum along the axis (the result of the
/// ReduceMax, Sub, Exp, ReduceSum, Log, Sub chain, in one pass).
pub fn log_softmax(shape: &[usize], axis: isize, x: &[f32], y: &mut [f32]) -> Result<()> {
    softmax_or_log(shape, axis, true, x, y)
}

fn softmax_or_log(shape: &[usize], axis: isize, log: bool, x: &[f32], y: &mut [f32]) -> Result<()> {
    check_rank("softmax shape", shape)?;
    let axis = normalize_axis(axis, shape.len())?;
    let total = volume("softmax shape", shape)?;
    check_len("softmax input", x.len(), total)?;
    check_len("softmax output", y.len(), total)?;
    let (_outer, len, inner) = split_axis("softmax shape", shape, axis)?;
    if total == 0 {
        return Ok(());
    }
    if inner == 1 {
        let rows = rows_per_task(len);
        y.par_chunks_mut(rows * len)
            .zip(x.par_chunks(rows * len))
            .for_each(|(yc, xc)| {
                for (yr, xr) in yc.chunks_exact_mut(len).zip(xc.chunks_exact(len)) {
                    softmax_row(xr, yr, log);
                }
            });
    } else {
        let block = len * inner;
        y.par_chunks_mut(block)
            .zip(x.par_chunks(block))
            .for_each(|(yb, xb)| {
                let mut m = vec![f32::NEG_INFINITY; inner];
                for xr in xb.chunks_exact(inner) {
                    for (m, &v) in m.iter_mut().zip(xr) {
                        *m = m.max(v);
                    }
                }
                let mut s = vec![0.0f32; inner];
                for (yr, xr) in yb.chunks_exact_mut(inner).zip(xb.chunks_exact(inner)) {
                    exp_diff_accumulate(xr, &m, yr, &mut s);
                }
                if log {
                    for s in s.iter_mut() {
                        *s = s.ln();
                    }
                    for (yr, xr) in yb.chunks_exact_mut(inner).zip(xb.chunks_exact(inner)) {
                        for (((o, &v), &m), &ls) in yr.iter_mut().zip(xr).zip(&m).zip(&s) {
                            *o = (v - m) - ls;
                        }
                    }
                    return;
                }
                for s in s.iter_mut() {
                    *s = 1.0 / *s;
                }
                for yr in yb.chunks_exact_mut(inner) {
                    for (o, &s) in yr.iter_mut().zip(&s) {
                        *o *= s;
                    }
                }
            });
    }
    Ok(())
}

/// Layer normalization over consecutive groups of `norm_size` elements:
/// `y = (x - mean) / sqrt(var + eps) · gamma + beta` (biased variance).
///
/// `x.len()` must be a multiple of `norm_size` (> 0); `gamma` and `beta`,
/// when given, have `norm_size` elements; `eps` must be finite and ≥ 0.
/// Parallel over groups.
pub fn layer_norm(x: &[f32], norm_size: usize, gamma: Option<&[f32]>, beta: Option<&[f32]>, eps: f32, y: &mut [f32]) -> Result<()> {
    normalize(x, norm_size, gamma, beta, eps, true, y)
}

/// Root-mean-square normalization (LLaMA's and T5's RMSNorm): as
/// [`layer_norm`] without subtracting the mean,
/// `y = x / sqrt(mean(x²) + eps) · gamma + beta`.
pub fn rms_norm(x: &[f32], norm_size: usize, gamma: Option<&[f32]>, beta: Option<&[f32]>, eps: f32, y: &mut [f32]) -> Result<()> {
    normalize(x, norm_size, gamma, beta, eps, false, y)
}

/// [`layer_norm`] (`centre`) or [`rms_norm`].
fn normalize(
    x: &[f32],
    norm_size: usize,
    gamma: Option<&[f32]>,
    beta: Option<&[f32]>,
    eps: f32,
    centre: bool,
    y: &mut [f32],
) -> Result<()> {
    if norm_size == 0 {
        return Err(KernelError::invalid("layer_norm norm_size", "norm_size is zero"));
    }
    if !x.len().is_multiple_of(norm_size) {
        return Err(KernelError::invalid(
            "layer_norm norm_size",
            format!("input length {} is not a multiple of norm_size {norm_size}", x.len()),
        ));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(KernelError::invalid("layer_norm epsilon", format!("{eps} is not finite and non-negative")));
    }
    check_len("layer_norm output", y.len(), x.len())?;
    if let Some(g) = gamma {
        check_len("layer_norm gamma", g.len(), norm_size)?;
    }
    if let Some(b) = beta {
        check_len("layer_norm beta", b.len(), norm_size)?;
    }
    let rows = rows_per_task(norm_size);
    if x.len() <= rows * norm_size {
        layer_norm_rows(x, y, norm_size, gamma, beta, eps, centre);
    } else {
        y.par_chunks_mut(rows * norm_size)
            .zip(x.par_chunks(rows * norm_size))
            .for_each(|(yc, xc)| layer_norm_rows(xc, yc, norm_size, gamma, beta, eps, centre));
    }
    Ok(())
}

simd_dispatch! {
    /// Layer norm (RMS norm without `centre`) of consecutive rows of
    /// `norm_size`.
    fn layer_norm_rows(xc: &[f32], yc: &mut [f32], norm_size: usize, gamma: Option<&[f32]>, beta: Option<&[f32]>, eps: f32, centre: bool) {
        let inv_n = 1.0 / norm_size as f32;
        for (yr, xr) in yc.chunks_exact_mut(norm_size).zip(xc.chunks_exact(norm_size)) {
            // x − 0 is x exactly: the RMS path shares the loops below.
            let mean = if centre { sum_f32(xr) * inv_n } else { 0.0 };
            for (o, &v) in yr.iter_mut().zip(xr) {
                *o = v - mean;
            }
            let mut sq = [0.0f32; 8];
            let ch = yr.chunks_exact(8);
            let rem = ch.remainder();
            for c in ch {
                for i in 0..8 {
                    sq[i] += c[i] * c[i];
                }
            }
            let var = (sq.iter().sum::<f32>() + rem.iter().map(|v| v * v).sum::<f32>()) * inv_n;
            let r = 1.0 / (var + eps).sqrt();
            match (gamma, beta) {
                (Some(g), Some(b)) => {
                    for ((o, &g), &b) in yr.iter_mut().zip(g).zip(b) {
                        *o = *o * r * g + b;
                    }
                }
                (Some(g), None) => {
                    for (o, &g) in yr.iter_mut().zip(g) {
                        *o = *o * r * g;
                    }
                }
                (None, Some(b)) => {
                    for (o, &b) in yr.iter_mut().zip(b) {
                        *o = *o * r + b;
                    }
                }
                (None, None) => {
                    for o in yr.iter_mut() {
                        *o *= r;
                    }
                }
            }
        }
    }
}

simd_dispatch! {
    /// Softmax of one contiguous row.
    fn softmax_row(xr: &[f32], yr: &mut [f32], log: bool) {
        let m = max_f32(xr);
        for (o, &v) in yr.iter_mut().zip(xr) {
            *o = fastmath::exp_logistic::<FMA>(v - m);
        }
        if log {
            let ls = sum_f32(yr).ln();
            for (o, &v) in yr.iter_mut().zip(xr) {
                *o = (v - m) - ls;
            }
            return;
        }
        let s = 1.0 / sum_f32(yr);
        for o in yr.iter_mut() {
            *o *= s;
        }
    }
}

simd_dispatch! {
    /// `y = exp(x - m)`, `s += y`, element-wise.
    fn exp_diff_accumulate(xr: &[f32], m: &[f32], yr: &mut [f32], s: &mut [f32]) {
        for (((o, &v), &m), s) in yr.iter_mut().zip(xr).zip(m).zip(s.iter_mut()) {
            *o = fastmath::exp_logistic::<FMA>(v - m);
            *s += *o;
        }
    }
}
