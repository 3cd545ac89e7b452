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
            // SAFETY: q is an integer in lo..=hi (within -128..=255): the
            // conversion is exact (a saturating `as` keeps the loop scalar).
            *o = unsafe { q.to_int_unchecked::<i32>() } as u8;
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
            // (wrapping_sub: a byte less an in-range zero point never
            // overflows, and the unchecked form vectorises.)
            if q.signed {
                for (d, &v) in dst.iter_mut().zip(src) {
                    *d = (v as i8 as i32).wrapping_sub(z) as f32 * s;
                }
            } else {
                for (d, &v) in dst.iter_mut().zip(src) {
                    *d = (v as i32).wrapping_sub(z) as f32 * s;
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
    // An i8 value v is the u8 (v ^ 0x80) less 128: one formula for both.
    let side = |o: &QOperand<'_>| if o.q.signed { (0x80u8, o.zero + 128, o.scale) } else { (0, o.zero, o.scale) };
    let p = QBinArgs { a: side(&a), b: side(&b), mul: kind == QBinaryKind::Mul, relu, out_scale, out_zero, lo, hi };
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::arch::is_x86_feature_detected!("avx2");
    #[cfg(target_arch = "x86_64")]
    let avx512 = crate::fastmath::has_avx512() && (1.0 / out_scale).is_normal();
    chunked(out, |start, o| {
        let (qa, qb) = (&a.q.data[start..][..o.len()], &b.q.data[start..][..o.len()]);
        #[allow(unused_mut)]
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // SAFETY: the CPU has AVX-512 F/BW/VL/DQ (checked above), and
            // 1 / out_scale is a normal number.
            done = unsafe { qbinary_avx512(qa, qb, o, p) };
        } else if avx2 {
            // SAFETY: the CPU has AVX2 (detected above).
            done = unsafe { qbinary_avx2(qa, qb, o, p) };
        }
        let (o, qa, qb) = (&mut o[done..], &qa[done..], &qb[done..]);
        for ((o, qa), qb) in o.chunks_mut(QBIN_CHUNK).zip(qa.chunks(QBIN_CHUNK)).zip(qb.chunks(QBIN_CHUNK)) {
            qbinary_run(qa, qb, o, p);
        }
    });
    Ok(())
}

/// [`qbinary_run`]'s arithmetic on whole 32-element steps in AVX2
/// registers, the same operations in the same order (bit for bit the same
/// bytes: no fused multiply-add, the division kept), with the 32 results
/// packed to bytes in registers (the portable loop spent a third of its
/// time narrowing eight lanes at a time). Returns the elements done (a
/// multiple of 32; the caller finishes the rest).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn qbinary_avx2(qa: &[u8], qb: &[u8], out: &mut [u8], p: QBinArgs) -> usize {
    // (`target_feature` on every function, no closures: the intrinsics of
    // a function without it are out-of-line calls.)
    #[target_feature(enable = "avx2")]
    unsafe fn steps<const MUL: bool, const RELU: bool>(qa: &[u8], qb: &[u8], out: &mut [u8], p: &QBinArgs) -> usize {
        use core::arch::x86_64::*;
        let n = out.len().min(qa.len()).min(qb.len()) / 32 * 32;
        let ((xa, za, sa), (xb, zb, sb)) = (p.a, p.b);
        // SAFETY (whole block): AVX2 is enabled on the caller; every load
        // reads 8 bytes at i + 8k < n of `qa` / `qb`, every store writes 32
        // bytes at i < n of `out`.
        unsafe {
            let (xa, xb) = (_mm_set1_epi8(xa as i8), _mm_set1_epi8(xb as i8));
            let (za, zb) = (_mm256_set1_epi32(za), _mm256_set1_epi32(zb));
            let (sa, sb) = (_mm256_set1_ps(sa), _mm256_set1_ps(sb));
            let (os, oz) = (_mm256_set1_ps(p.out_scale), _mm256_set1_ps(p.out_zero as f32));
            let (lo, hi) = (_mm256_set1_ps(p.lo as f32), _mm256_set1_ps(p.hi as f32));
            let zero = _mm256_setzero_ps();
            let low = _mm256_set1_epi32(0xff);
            // `eight!(at)`: the dequantised operands, the op, the ReLU
            // (`max(v, 0)` maps NaN to 0 as `f32::max` does), the
            // quantisation (NaN to the zero point), as integers.
            macro_rules! eight {
                ($at:expr) => {{
                    let at = $at;
                    let ea = _mm256_cvtepu8_epi32(_mm_xor_si128(_mm_loadl_epi64(qa.as_ptr().add(at).cast()), xa));
                    let eb = _mm256_cvtepu8_epi32(_mm_xor_si128(_mm_loadl_epi64(qb.as_ptr().add(at).cast()), xb));
                    let x = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(ea, za)), sa);
                    let z = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(eb, zb)), sb);
                    let v = if MUL { _mm256_mul_ps(x, z) } else { _mm256_add_ps(x, z) };
                    let v = if RELU { _mm256_max_ps(v, zero) } else { v };
                    let q = _mm256_add_ps(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_div_ps(v, os)), oz);
                    let clamped = _mm256_min_ps(_mm256_max_ps(q, lo), hi);
                    let q = _mm256_blendv_ps(clamped, oz, _mm256_cmp_ps::<_CMP_UNORD_Q>(q, q));
                    _mm256_and_si256(_mm256_cvttps_epi32(q), low)
                }};
            }
            let mut i = 0;
            while i < n {
                let (a, b, c, d) = (eight!(i), eight!(i + 8), eight!(i + 16), eight!(i + 24));
                // Low bytes, exactly (masked above): per 128-bit lane
                // [a b c d] quarters, then the quarters back in order.
                let bytes = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
                let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                _mm256_storeu_si256(out.as_mut_ptr().add(i).cast(), bytes);
                i += 32;
            }
        }
        n
    }
    // SAFETY: the caller's contract (AVX2).
    unsafe {
        match (p.mul, p.relu) {
            (false, false) => steps::<false, false>(qa, qb, out, &p),
            (false, true) => steps::<false, true>(qa, qb, out, &p),
            (true, false) => steps::<true, false>(qa, qb, out, &p),
            (true, true) => steps::<true, true>(qa, qb, out, &p),
        }
    }
}

/// [`qbinary_run`]'s results on whole 16-element steps in AVX-512
/// registers, without its division: the quotient is `v · (1/out_scale)`,
/// within 3 units in the last place of the divided one (both roundings
/// of a normal reciprocal and of the product), so it rounds to the same
/// integer unless it lies within `|t|·2⁻²⁰` of a half-integer (a tie of
/// the rounding); the vectors with such a lane (rare: about one value in
/// 10⁵ for arbitrary scales, more for scales that make exact ties) divide
/// those lanes; a power-of-two scale has an exact reciprocal, and its
/// quotients need no check. Everything else is `qbinary_avx2`'s
/// sequence, so the bytes are the composite's bit for bit. Returns the elements done (a
/// multiple of 16; the caller finishes the rest).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/DQ, and `1 / p.out_scale` is normal.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn qbinary_avx512(qa: &[u8], qb: &[u8], out: &mut [u8], p: QBinArgs) -> usize {
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    unsafe fn steps<const MUL: bool, const RELU: bool, const EXACT: bool>(qa: &[u8], qb: &[u8], out: &mut [u8], p: &QBinArgs) -> usize {
        use core::arch::x86_64::*;
        const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        let n = out.len().min(qa.len()).min(qb.len()) / 16 * 16;
        let ((xa, za, sa), (xb, zb, sb)) = (p.a, p.b);
        // SAFETY (whole block): AVX-512 is enabled on the caller; every
        // load reads 16 bytes at i < n of `qa` / `qb`, every store writes
        // 16 bytes at i < n of `out`.
        unsafe {
            let (xa, xb) = (_mm_set1_epi8(xa as i8), _mm_set1_epi8(xb as i8));
            let (za, zb) = (_mm512_set1_epi32(za), _mm512_set1_epi32(zb));
            let (sa, sb) = (_mm512_set1_ps(sa), _mm512_set1_ps(sb));
            let os = _mm512_set1_ps(p.out_scale);
            let inv = _mm512_set1_ps(1.0 / p.out_scale);
            let (oz, lo, hi) = (_mm512_set1_ps(p.out_zero as f32), _mm512_set1_ps(p.lo as f32), _mm512_set1_ps(p.hi as f32));
            let (zero, half, rel) = (_mm512_setzero_ps(), _mm512_set1_ps(0.5), _mm512_set1_ps(1.0 / (1u32 << 20) as f32));
            let mut i = 0;
            while i < n {
                let ea = _mm512_cvtepu8_epi32(_mm_xor_si128(_mm_loadu_si128(qa.as_ptr().add(i).cast()), xa));
                let eb = _mm512_cvtepu8_epi32(_mm_xor_si128(_mm_loadu_si128(qb.as_ptr().add(i).cast()), xb));
                let x = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(ea, za)), sa);
                let z = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(eb, zb)), sb);
                let v = if MUL { _mm512_mul_ps(x, z) } else { _mm512_add_ps(x, z) };
                // `max(v, 0)` maps NaN to 0, as `f32::max` does.
                let v = if RELU { _mm512_max_ps(v, zero) } else { v };
                let t = _mm512_mul_ps(v, inv);
                let mut r = _mm512_roundscale_ps::<NEAREST>(t);
                if !EXACT {
                    // Lanes whose quotient lies near a half-integer:
                    // |t − r| + |t|·2⁻²⁰ ≥ ½ (|t − r| ≤ ½ always; NaN and
                    // infinite t compare false: they quantise alike).
                    let off = _mm512_fmadd_ps(_mm512_abs_ps(t), rel, _mm512_abs_ps(_mm512_sub_ps(t, r)));
                    let near = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(off, half);
                    if near != 0 {
                        r = _mm512_mask_roundscale_ps::<NEAREST>(r, near, _mm512_div_ps(v, os));
                    }
                }
                let q = _mm512_add_ps(r, oz);
                let q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
                // NaN quantises to the zero point (`max`/`min` above
                // return their second operand for a NaN first one: `hi`).
                let q = _mm512_mask_mov_ps(q, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(r, r), oz);
                // Integers in lo..=hi: the low byte is the u8 or i8 value.
                _mm_storeu_si128(out.as_mut_ptr().add(i).cast(), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(q)));
                i += 16;
            }
        }
        n
    }
    // A power of two (no mantissa bits) has an exact normal reciprocal.
    let exact = p.out_scale.to_bits() & 0x007f_ffff == 0;
    // SAFETY: the caller's contract (AVX-512).
    unsafe {
        match (p.mul, p.relu, exact) {
            (false, false, false) => steps::<false, false, false>(qa, qb, out, &p),
            (false, true, false) => steps::<false, true, false>(qa, qb, out, &p),
            (true, false, false) => steps::<true, false, false>(qa, qb, out, &p),
            (true, true, false) => steps::<true, true, false>(qa, qb, out, &p),
            (false, false, true) => steps::<false, false, true>(qa, qb, out, &p),
            (false, true, true) => steps::<false, true, true>(qa, qb, out, &p),
            (true, false, true) => steps::<true, false, true>(qa, qb, out, &p),
            (true, true, true) => steps::<true, true, true>(qa, qb, out, &p),
        }
    }
}

/// Elements [`qbinary_run`] handles at once (its f32 scratch on the stack).
const QBIN_CHUNK: usize = 512;

/// The constants of one [`qbinary`]: per operand (xor, zero after the
/// xor, scale).
#[derive(Clone, Copy)]
pub(crate) struct QBinArgs {
    a: (u8, i32, f32),
    b: (u8, i32, f32),
    mul: bool,
    relu: bool,
    out_scale: f32,
    out_zero: i32,
    lo: i32,
    hi: i32,
}

simd_dispatch! {
    /// Up to [`QBIN_CHUNK`] elements of [`qbinary`]: the dequantised
    /// operands, the op and ReLU in f32, then [`quant_run`]'s rounding.
    fn qbinary_run(qa: &[u8], qb: &[u8], out: &mut [u8], p: QBinArgs) {
        let mut y = [0f32; QBIN_CHUNK];
        let y = &mut y[..out.len()];
        // The op and the ReLU as constants, so that each loop vectorises.
        #[inline(always)]
        fn dequant_op<const MUL: bool, const RELU: bool>(y: &mut [f32], qa: &[u8], qb: &[u8], p: &QBinArgs) {
            let ((xa, za, sa), (xb, zb, sb)) = (p.a, p.b);
            for ((y, &va), &vb) in y.iter_mut().zip(qa).zip(qb) {
                // Byte less a zero point in -128..=255: never overflows; the
                // wrapping form keeps the overflow check (on in release
                // builds) out of the vector loop.
                let x = ((va ^ xa) as i32).wrapping_sub(za) as f32 * sa;
                let z = ((vb ^ xb) as i32).wrapping_sub(zb) as f32 * sb;
                let v = if MUL { x * z } else { x + z };
                *y = if RELU { v.max(0.0) } else { v };
            }
        }
        match (p.mul, p.relu) {
            (false, false) => dequant_op::<false, false>(y, qa, qb, &p),
            (false, true) => dequant_op::<false, true>(y, qa, qb, &p),
            (true, false) => dequant_op::<true, false>(y, qa, qb, &p),
            (true, true) => dequant_op::<true, true>(y, qa, qb, &p),
        }
        let (z, lo, hi) = (p.out_zero as f32, p.lo as f32, p.hi as f32);
        for (o, &v) in out.iter_mut().zip(y.iter()) {
            let q = (v / p.out_scale).round_ties_even() + z;
            let q = if q.is_nan() { z } else { q.max(lo).min(hi) };
            // SAFETY: as in `quant_run`: an integer in lo..=hi.
            *o = unsafe { q.to_int_unchecked::<i32>() } as u8;
        }
    }
}
