//! f32 ↔ int8 (QuantizeLinear / DequantizeLinear), per tensor or per
//! channel of a tensor viewed as `[outer, channels, inner]`.

use super::{qrange, QTensor};
use crate::error::{KernelError, Result};
use crate::fastmath::simd_dispatch;
use crate::util::{check_len, elementwise_chunk, volume, SEQ_MAX};
use rayon::prelude::*;

#[allow(clippy::too_many_arguments)]
fn check_params(what: &'static str, len: usize, outer: usize, channels: usize, inner: usize, scale: &[f32], zero: &[i32], signed: bool) -> Result<()> {
    check_len(what, len, volume(what, &[outer, channels, inner])?)?;
    check_len("quantization scale", scale.len(), channels)?;
    check_len("quantization zero point", zero.len(), channels)?;
    if let Some(s) = scale.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        return Err(KernelError::invalid("quantization scale", format!("{s} is not finite and > 0")));
    }
    let (lo, hi) = qrange(signed);
    if let Some(z) = zero.iter().find(|z| !(lo..=hi).contains(*z)) {
        return Err(KernelError::invalid("quantization zero point", format!("{z} outside {lo}..={hi}")));
    }
    Ok(())
}

/// Runs `f(start, chunk)` over `len`-element chunks, in parallel when large.
fn chunked<T: Send>(out: &mut [T], f: impl Fn(usize, &mut [T]) + Sync + Send) {
    if out.len() <= SEQ_MAX {
        f(0, out);
        return;
    }
    let chunk = elementwise_chunk(out.len());
    out.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i * chunk, c));
}

/// Calls `f(channel, offset in chunk, len)` for the runs of one channel
/// within elements `start .. start + len` of an `[outer, channels, inner]` tensor.
fn runs(start: usize, len: usize, channels: usize, inner: usize, mut f: impl FnMut(usize, usize, usize)) {
    let mut i = 0;
    while i < len {
        let f0 = start + i;
        let c = (f0 / inner) % channels;
        let n = (inner - f0 % inner).min(len - i);
        f(c, i, n);
        i += n;
    }
}

/// `out = clamp(round_half_even(x / scale[c]) + zero[c])` as u8 (or i8
/// with `signed`) over `x` viewed as `[outer, channels, inner]`; NaN
/// becomes the zero point. `scale` finite and > 0, `zero` in the type's
/// range, `channels` entries each.
#[allow(clippy::too_many_arguments)]
pub fn quantize(x: &[f32], out: &mut [u8], signed: bool, outer: usize, channels: usize, inner: usize, scale: &[f32], zero: &[i32]) -> Result<()> {
    check_params("quantize input", x.len(), outer, channels, inner, scale, zero, signed)?;
    check_len("quantize output", out.len(), x.len())?;
    let (lo, hi) = qrange(signed);
    chunked(out, |start, o| {
        runs(start, o.len(), channels, inner, |c, i, n| {
            quant_run(&x[start + i..][..n], &mut o[i..i + n], scale[c], zero[c], lo, hi);
        });
    });
    Ok(())
}

simd_dispatch! {
    /// One channel's run of [`quantize`].
    fn quant_run(x: &[f32], out: &mut [u8], scale: f32, zero: i32, lo: i32, hi: i32) {
        let (z, lo, hi) = (zero as f32, lo as f32, hi as f32);
        for (o, &v) in out.iter_mut().zip(x) {
            let q = (v / scale).round_ties_even() + z;
            // NaN fails both comparisons: the zero point.
            let q = if q.is_nan() { z } else { q.max(lo).min(hi) };
            *o = q as i32 as u8;
        }
    }
}

/// `out = (q − zero[c])·scale[c]` over `q` viewed as `[outer, channels,
/// inner]`; `scale` finite and > 0, `zero` in `q`'s range.
pub fn dequantize(q: QTensor<'_>, out: &mut [f32], outer: usize, channels: usize, inner: usize, scale: &[f32], zero: &[i32]) -> Result<()> {
    check_params("dequantize input", q.data.len(), outer, channels, inner, scale, zero, q.signed)?;
    check_len("dequantize output", out.len(), q.data.len())?;
    chunked(out, |start, o| {
        runs(start, o.len(), channels, inner, |c, i, n| {
            let (src, dst) = (&q.data[start + i..][..n], &mut o[i..i + n]);
            let (s, z) = (scale[c], zero[c]);
            if q.signed {
                for (d, &v) in dst.iter_mut().zip(src) {
                    *d = (v as i8 as i32 - z) as f32 * s;
                }
            } else {
                for (d, &v) in dst.iter_mut().zip(src) {
                    *d = (v as i32 - z) as f32 * s;
                }
            }
        });
    });
    Ok(())
}
