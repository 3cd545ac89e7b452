//! f32 ↔ int8 (QuantizeLinear / DequantizeLinear), per tensor or per
//! channel of a tensor viewed as `[outer, channels, inner]`, and the int8
//! element-wise add / multiply computed as their QDQ definition.

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

/// One int8 operand of [`qbinary`]: values, scale and zero point.
#[derive(Clone, Copy, Debug)]
pub struct QOperand<'a> {
    pub q: QTensor<'a>,
    pub scale: f32,
    pub zero: i32,
}

/// The element-wise operation of [`qbinary`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QBinaryKind {
    Add,
    Mul,
}

/// int8 `a (kind) b` element-wise, as its QDQ definition in f32:
/// `(a − za)·sa (kind) (b − zb)·sb`, `max(0, ·)` with `relu`, then
/// quantised with `out_scale` / `out_zero` exactly as [`quantize`] (the
/// same results, bit for bit, as the dequantise, f32 op, quantise ops it
/// replaces). Scales finite and > 0, zero points in their types' ranges.
#[allow(clippy::too_many_arguments)]
pub fn qbinary(kind: QBinaryKind, a: QOperand<'_>, b: QOperand<'_>, relu: bool, out: &mut [u8], out_signed: bool, out_scale: f32, out_zero: i32) -> Result<()> {
    for (what, o) in [("qbinary a", &a), ("qbinary b", &b)] {
        check_params(what, o.q.data.len(), 1, 1, out.len(), &[o.scale], &[o.zero], o.q.signed)?;
    }
    check_params("qbinary output", out.len(), 1, 1, out.len(), &[out_scale], &[out_zero], out_signed)?;
    let (lo, hi) = qrange(out_signed);
    let real = |o: &QOperand<'_>, v: u8| (if o.q.signed { v as i8 as i32 } else { v as i32 } - o.zero) as f32 * o.scale;
    chunked(out, |start, o| {
        let (qa, qb) = (&a.q.data[start..][..o.len()], &b.q.data[start..][..o.len()]);
        let mut y = [0f32; 256];
        for ((o, qa), qb) in o.chunks_mut(256).zip(qa.chunks(256)).zip(qb.chunks(256)) {
            let y = &mut y[..o.len()];
            for ((y, &va), &vb) in y.iter_mut().zip(qa).zip(qb) {
                let (x, z) = (real(&a, va), real(&b, vb));
                let v = match kind {
                    QBinaryKind::Add => x + z,
                    QBinaryKind::Mul => x * z,
                };
                *y = if relu { v.max(0.0) } else { v };
            }
            quant_run(y, o, out_scale, out_zero, lo, hi);
        }
    });
    Ok(())
}
