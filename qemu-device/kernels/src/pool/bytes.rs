//! Max pooling of 8-bit elements (the int8 models' MaxPool on quantised
//! values), row by row on the bytes themselves.
//!
//! i8 values are mapped to u8 by flipping their sign bit (`x ^ 0x80`
//! keeps their order), so one u8 maximum serves both; the padding is the
//! least value, 0 after the flip. Each output row's window rows are
//! reduced column-wise into a padded row, then each output takes the
//! maximum of its taps along that row (loops the compiler vectorises:
//! byte maxima, and pairs of bytes for the usual stride 2).

use super::{planes, PoolKind, Pool2dParams};
use crate::conv::Axis;
use crate::error::{KernelError, Result};
use crate::fastmath::simd_dispatch;
use crate::util::{for_each_task, valid_range, with_bytes, SendPtr, SEQ_MAX};

/// Max pooling of 8-bit elements, u8 or (`signed`) i8, with the window
/// geometry of `p` (whose kind must be `Max`); a window without a real
/// tap gives the type's least value (0, −128). This is also the QDQ form
/// `quantize(maxpool(dequantize(x)))` with one scale and zero point: the
/// maximum commutes with a dequantisation.
pub fn pool2d_int8(p: &Pool2dParams, input: &[u8], signed: bool, output: &mut [u8]) -> Result<()> {
    if p.kind != PoolKind::Max {
        return Err(KernelError::invalid("pool2d_int8 kind", "8-bit elements are max-pooled only"));
    }
    let (ha, wa, in_plane, out_plane) = planes(p, input.len(), output.len())?;
    // (Fits: the lengths were checked against its multiples.)
    let nplanes = p.batch * p.channels;
    if output.is_empty() {
        return Ok(());
    }
    let xor = if signed { 0x80u8 } else { 0 };
    // The padded row: every tap's column and the input's, plus a stride
    // of slack (`taps` reads whole pairs).
    let span = (wa.output - 1) * wa.stride + (wa.kernel - 1) * wa.dilation + 1;
    let padded = span.max(wa.pad_before + wa.input) + wa.stride;
    let per = (65_536 / in_plane.max(out_plane).max(1)).max(1);
    let dst = SendPtr(output.as_mut_ptr());
    for_each_task(nplanes.div_ceil(per), input.len() <= 4 * SEQ_MAX, |t| {
        with_bytes(padded, |row| {
            for plane in t * per..((t + 1) * per).min(nplanes) {
                // SAFETY: plane `plane` of the output (length checked
                // above), written by this task only.
                let out = unsafe { core::slice::from_raw_parts_mut(dst.get().add(plane * out_plane), out_plane) };
                max_plane(&ha, &wa, &input[plane * in_plane..][..in_plane], xor, row, out);
            }
        })
    });
    Ok(())
}

simd_dispatch! {
    /// One plane: `x` (`ha.input × wa.input` bytes) to `out`, through the
    /// padded row `hp` (its padding stays 0).
    fn max_plane(ha: &Axis, wa: &Axis, x: &[u8], xor: u8, hp: &mut [u8], out: &mut [u8]) {
        let (iw, ow, pb) = (wa.input, wa.output, wa.pad_before);
        hp.fill(0);
        for (oy, o) in out.chunks_exact_mut(ow).enumerate() {
            let mut ys = valid_range(ha.base(oy), ha.dilation, ha.kernel, ha.input);
            let Some(ky0) = ys.next() else {
                // Padding only: the least value.
                o.fill(xor);
                continue;
            };
            let row = |ky: usize| &x[ha.input_index(oy, ky) as usize * iw..][..iw];
            let h = &mut hp[pb..pb + iw];
            for (d, &s) in h.iter_mut().zip(row(ky0)) {
                *d = s ^ xor;
            }
            for ky in ys {
                for (d, &s) in h.iter_mut().zip(row(ky)) {
                    *d = (*d).max(s ^ xor);
                }
            }
            taps(wa, hp, o, xor);
        }
    }
}

/// `o[ox] = max over taps kx of hp[ox·stride + kx·dilation]`, `^ xor`.
#[inline(always)]
fn taps(wa: &Axis, hp: &[u8], o: &mut [u8], xor: u8) {
    let ow = o.len();
    match (wa.stride, wa.kernel, wa.dilation) {
        (2, 3, 1) => {
            // Pairs (2ox, 2ox + 1), and 2ox + 2 from the next pair.
            let (pairs, next) = (&hp[..2 * ow], &hp[2..2 + 2 * ow]);
            for ((o, p), q) in o.iter_mut().zip(pairs.chunks_exact(2)).zip(next.chunks_exact(2)) {
                *o = p[0].max(p[1]).max(q[0]) ^ xor;
            }
        }
        (2, 2, 1) => {
            for (o, p) in o.iter_mut().zip(hp[..2 * ow].chunks_exact(2)) {
                *o = p[0].max(p[1]) ^ xor;
            }
        }
        (s, k, d) => {
            for (ox, o) in o.iter_mut().enumerate() {
                let mut m = 0u8;
                for kx in 0..k {
                    m = m.max(hp[ox * s + kx * d]);
                }
                *o = m ^ xor;
            }
        }
    }
}
