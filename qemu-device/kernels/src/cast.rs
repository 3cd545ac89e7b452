//! Element-wise conversion between f32, i32, i64 and bool (ONNX Cast).
//!
//! Semantics (those of the device's CAST descriptor):
//! - integers → f32: round to nearest, ties to even;
//! - f32 → integers: truncate toward zero, saturating at the type's range;
//!   NaN becomes 0;
//! - i64 → i32: the low 32 bits (wrapping); i32 → i64: sign extension;
//! - anything → bool: `x != 0` (so NaN is true and −0.0 false), written as
//!   the byte 1 or 0;
//! - bool → anything: a nonzero byte is 1 (true), zero is 0 (false);
//! - f32 → f32 copies bits unchanged (NaN payloads and −0.0 included);
//!   bool → bool normalises every nonzero byte to 1.
//!
//! Bool tensors are bytes (`u8`), so any byte pattern the guest left in
//! memory is a valid input.

use crate::error::Result;
use crate::util::{check_len, elementwise_chunk};
use rayon::prelude::*;

/// A typed source tensor of [`cast`]. `Bool` elements are bytes.
#[derive(Debug, Clone, Copy)]
pub enum CastSrc<'a> {
    F32(&'a [f32]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    Bool(&'a [u8]),
}

/// A typed destination tensor of [`cast`]. `Bool` elements are written as
/// bytes 0 or 1.
#[derive(Debug)]
pub enum CastDst<'a> {
    F32(&'a mut [f32]),
    I32(&'a mut [i32]),
    I64(&'a mut [i64]),
    Bool(&'a mut [u8]),
}

impl CastSrc<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            CastSrc::F32(s) => s.len(),
            CastSrc::I32(s) => s.len(),
            CastSrc::I64(s) => s.len(),
            CastSrc::Bool(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl CastDst<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            CastDst::F32(s) => s.len(),
            CastDst::I32(s) => s.len(),
            CastDst::I64(s) => s.len(),
            CastDst::Bool(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One source element type's conversions to every destination type.
trait Convert: Copy + Send + Sync {
    fn to_f32(self) -> f32;
    fn to_i32(self) -> i32;
    fn to_i64(self) -> i64;
    fn to_bool(self) -> u8;
}

// Rust's `as` is exactly the specified semantics: int → float rounds to
// nearest (ties to even); float → int truncates toward zero, saturates and
// maps NaN to 0; int → narrower int keeps the low bits; int → wider int
// sign-extends.
impl Convert for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn to_i32(self) -> i32 {
        self as i32
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline(always)]
    fn to_bool(self) -> u8 {
        // NaN != 0 is true; -0.0 == 0.
        u8::from(self != 0.0)
    }
}

impl Convert for i32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn to_i32(self) -> i32 {
        self
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
    #[inline(always)]
    fn to_bool(self) -> u8 {
        u8::from(self != 0)
    }
}

impl Convert for i64 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn to_i32(self) -> i32 {
        self as i32
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self
    }
    #[inline(always)]
    fn to_bool(self) -> u8 {
        u8::from(self != 0)
    }
}

/// A bool byte: nonzero is true (1).
impl Convert for u8 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from(u8::from(self != 0))
    }
    #[inline(always)]
    fn to_i32(self) -> i32 {
        i32::from(self != 0)
    }
    #[inline(always)]
    fn to_i64(self) -> i64 {
        i64::from(self != 0)
    }
    #[inline(always)]
    fn to_bool(self) -> u8 {
        u8::from(self != 0)
    }
}

/// `dst[i] = f(src[i])`, in parallel for large tensors. Lengths are checked
/// by the caller.
fn map<S: Copy + Sync, D: Send>(src: &[S], dst: &mut [D], f: impl Fn(S) -> D + Sync) {
    let apply = |s: &[S], d: &mut [D]| {
        for (d, &s) in d.iter_mut().zip(s) {
            *d = f(s);
        }
    };
    let chunk = elementwise_chunk(src.len());
    if chunk >= src.len() {
        apply(src, dst);
    } else {
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| apply(s, d));
    }
}

fn convert_into<S: Convert>(src: &[S], dst: CastDst<'_>) {
    match dst {
        CastDst::F32(d) => map(src, d, S::to_f32),
        CastDst::I32(d) => map(src, d, S::to_i32),
        CastDst::I64(d) => map(src, d, S::to_i64),
        CastDst::Bool(d) => map(src, d, S::to_bool),
    }
}

/// Converts every element of `src` into `dst` (same element count; see
/// the module documentation for the rules). On a length mismatch nothing
/// is written. Parallel for large tensors.
pub fn cast(src: CastSrc<'_>, dst: CastDst<'_>) -> Result<()> {
    check_len("cast output", dst.len(), src.len())?;
    match src {
        CastSrc::F32(s) => convert_into(s, dst),
        CastSrc::I32(s) => convert_into(s, dst),
        CastSrc::I64(s) => convert_into(s, dst),
        CastSrc::Bool(s) => convert_into(s, dst),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KernelError;

    fn f32_to_i32(x: &[f32]) -> Vec<i32> {
        let mut y = vec![7; x.len()];
        cast(CastSrc::F32(x), CastDst::I32(&mut y)).unwrap();
        y
    }

    fn f32_to_i64(x: &[f32]) -> Vec<i64> {
        let mut y = vec![7; x.len()];
        cast(CastSrc::F32(x), CastDst::I64(&mut y)).unwrap();
        y
    }

    fn to_bool(src: CastSrc<'_>) -> Vec<u8> {
        let mut y = vec![7; src.len()];
        cast(src, CastDst::Bool(&mut y)).unwrap();
        y
    }

    #[test]
    fn f32_to_integers_truncate_saturate_and_zero_nan() {
        let x = [
            0.0,
            -0.0,
            1.9,
            -1.9,
            0.5,
            -0.5,
            2_147_483_520.0, // largest f32 below 2^31
            2_147_483_648.0, // 2^31: saturates
            -2_147_483_648.0,
            -3e9,
            1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MIN_POSITIVE,
        ];
        assert_eq!(
            f32_to_i32(&x),
            [
                0,
                0,
                1,
                -1,
                0,
                0,
                2_147_483_520,
                i32::MAX,
                i32::MIN,
                i32::MIN,
                i32::MAX,
                i32::MAX,
                i32::MIN,
                0,
                0,
                0
            ]
        );
        assert_eq!(
            f32_to_i64(&x),
            [
                0,
                0,
                1,
                -1,
                0,
                0,
                2_147_483_520,
                2_147_483_648,
                -2_147_483_648,
                -3_000_000_000,
                i64::MAX,
                i64::MAX,
                i64::MIN,
                0,
                0,
                0
            ]
        );
        // Saturation at i64's own range.
        // 2^62 and -2^63 are exact; 2^63 is just past i64::MAX.
        let (p62, p63) = (2f32.powi(62), 2f32.powi(63));
        assert_eq!(
            f32_to_i64(&[p62, -p63, p63, 9.3e18, -9.3e18]),
            [1 << 62, i64::MIN, i64::MAX, i64::MAX, i64::MIN]
        );
    }

    #[test]
    fn integers_to_f32_round_to_nearest_even() {
        let x = [
            0,
            1,
            -1,
            16_777_216,
            16_777_217,
            16_777_219,
            i32::MAX,
            i32::MIN,
        ];
        let mut y = [0f32; 8];
        cast(CastSrc::I32(&x), CastDst::F32(&mut y)).unwrap();
        // 2^24 + 1 is a tie between 2^24 and 2^24 + 2: even wins (2^24);
        // 2^24 + 3 ties between +2 and +4: +4.
        assert_eq!(
            y,
            [
                0.0,
                1.0,
                -1.0,
                16_777_216.0,
                16_777_216.0,
                16_777_220.0,
                2_147_483_648.0,
                -2_147_483_648.0
            ]
        );
        assert!(y[0].is_sign_positive());
        let x = [
            0i64,
            -5,
            (1 << 53) + 1,
            i64::MAX,
            i64::MIN,
            (1 << 40) + (1 << 16) + 1,
        ];
        let mut y = [0f32; 6];
        cast(CastSrc::I64(&x), CastDst::F32(&mut y)).unwrap();
        assert_eq!(
            y,
            [
                0.0,
                -5.0,
                9_007_199_254_740_992.0,
                9_223_372_036_854_775_808.0,
                -9_223_372_036_854_775_808.0,
                1_099_511_758_848.0
            ]
        );
    }

    #[test]
    fn i64_to_i32_wraps_and_i32_to_i64_sign_extends() {
        let x = [
            0i64,
            -1,
            1 << 32,
            (1 << 32) + 5,
            0x8000_0000,
            -0x8000_0001,
            i64::MAX,
            i64::MIN,
        ];
        let mut y = [9i32; 8];
        cast(CastSrc::I64(&x), CastDst::I32(&mut y)).unwrap();
        assert_eq!(y, [0, -1, 0, 5, i32::MIN, i32::MAX, -1, 0]);
        let x = [0i32, -1, i32::MIN, i32::MAX, 123];
        let mut y = [9i64; 5];
        cast(CastSrc::I32(&x), CastDst::I64(&mut y)).unwrap();
        assert_eq!(y, [0, -1, -2_147_483_648, 2_147_483_647, 123]);
    }

    #[test]
    fn anything_to_bool_is_nonzero_test() {
        assert_eq!(
            to_bool(CastSrc::F32(&[
                0.0,
                -0.0,
                1.0,
                -2.5,
                f32::NAN,
                f32::INFINITY,
                1e-45
            ])),
            [0, 0, 1, 1, 1, 1, 1]
        );
        assert_eq!(
            to_bool(CastSrc::I32(&[0, 1, -1, i32::MIN, 256])),
            [0, 1, 1, 1, 1]
        );
        // A nonzero value with a zero low byte or low word is still true.
        assert_eq!(
            to_bool(CastSrc::I64(&[0, 1 << 32, 256, i64::MIN, -1])),
            [0, 1, 1, 1, 1]
        );
        // bool -> bool normalises any nonzero byte to 1.
        assert_eq!(
            to_bool(CastSrc::Bool(&[0, 1, 2, 0x80, 0xff])),
            [0, 1, 1, 1, 1]
        );
    }

    #[test]
    fn bool_to_numbers_treats_nonzero_bytes_as_one() {
        let b = [0u8, 1, 2, 0xff, 0x80];
        let mut f = [9f32; 5];
        cast(CastSrc::Bool(&b), CastDst::F32(&mut f)).unwrap();
        assert_eq!(f, [0.0, 1.0, 1.0, 1.0, 1.0]);
        assert!(f[0].is_sign_positive());
        let mut i = [9i32; 5];
        cast(CastSrc::Bool(&b), CastDst::I32(&mut i)).unwrap();
        assert_eq!(i, [0, 1, 1, 1, 1]);
        let mut l = [9i64; 5];
        cast(CastSrc::Bool(&b), CastDst::I64(&mut l)).unwrap();
        assert_eq!(l, [0, 1, 1, 1, 1]);
    }

    #[test]
    fn same_type_casts_copy_exactly() {
        let x = [-0.0f32, f32::from_bits(0x7fc0_1234), 1.5, f32::NEG_INFINITY];
        let mut y = [0f32; 4];
        cast(CastSrc::F32(&x), CastDst::F32(&mut y)).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&y), bits(&x), "bit-exact, NaN payload and -0.0 kept");
        let x = [i32::MIN, -1, 0, i32::MAX];
        let mut y = [5i32; 4];
        cast(CastSrc::I32(&x), CastDst::I32(&mut y)).unwrap();
        assert_eq!(y, x);
        let x = [i64::MIN, -1, 0, i64::MAX];
        let mut y = [5i64; 4];
        cast(CastSrc::I64(&x), CastDst::I64(&mut y)).unwrap();
        assert_eq!(y, x);
    }

    #[test]
    fn negative_zero_converts_to_zero_everywhere() {
        assert_eq!(f32_to_i32(&[-0.0, -0.99]), [0, 0]);
        assert_eq!(f32_to_i64(&[-0.0, -0.99]), [0, 0]);
        assert_eq!(to_bool(CastSrc::F32(&[-0.0])), [0]);
    }

    #[test]
    fn length_mismatch_writes_nothing() {
        let mut y = [7i32; 3];
        let r = cast(CastSrc::F32(&[1.0, 2.0]), CastDst::I32(&mut y));
        assert!(
            matches!(
                r,
                Err(KernelError::LengthMismatch {
                    what: "cast output",
                    expected: 2,
                    actual: 3
                })
            ),
            "{r:?}"
        );
        assert_eq!(y, [7; 3]);
        let mut b: [u8; 0] = [];
        assert!(cast(CastSrc::Bool(&[1]), CastDst::Bool(&mut b)).is_err());
        cast(CastSrc::I64(&[]), CastDst::F32(&mut [])).unwrap();
    }

    #[test]
    fn large_tensors_take_the_parallel_path() {
        // Above the sequential limit, with a ragged last chunk.
        let n = (1 << 17) + 13;
        let x: Vec<i64> = (0..n as i64).map(|i| (i - 1000) * 0x1_0000_0001).collect();
        let mut y = vec![0i32; n];
        cast(CastSrc::I64(&x), CastDst::I32(&mut y)).unwrap();
        assert!(y.iter().zip(&x).all(|(&a, &b)| a == b as i32));
        let mut f = vec![0f32; n];
        cast(CastSrc::I32(&y), CastDst::F32(&mut f)).unwrap();
        assert!(f.iter().zip(&y).all(|(&a, &b)| a == b as f32));
        let mut bools = vec![9u8; n];
        cast(CastSrc::F32(&f), CastDst::Bool(&mut bools)).unwrap();
        assert!(bools.iter().zip(&f).all(|(&a, &b)| a == u8::from(b != 0.0)));
        assert_eq!(
            bools.iter().filter(|&&b| b == 0).count(),
            1,
            "only i = 1000 is zero"
        );
    }
}
