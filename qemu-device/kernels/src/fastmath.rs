//! Branch-free f32 transcendental functions that auto-vectorize, and
//! runtime dispatch of slice loops to AVX2 where available.
//!
//! Accuracy (checked by the tests against f64 references): `exp` and `tanh`
//! are within a few ulp; `erf` has an absolute error below 5e-7 (and a
//! relative one below 1e-6 near 0).
//!
//! Every function takes `const FMA: bool`: with `true` (only inside code
//! compiled for the `fma` target feature, see [`simd_dispatch`]) the
//! polynomials use fused multiply-adds, which is faster and at least as
//! accurate; with `false`, separate multiplies and adds.

// Polynomial coefficients are kept as published.
#![allow(clippy::excessive_precision)]

/// `a·b + c`, fused when `FMA`.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Range reduction of `e^x` (`xc` already clamped): `e^x = 2^n · p` with
/// `n = round(x·log2 e)` and `p = e^r` by polynomial, `|r| ≤ ln 2 / 2`.
#[inline(always)]
fn exp_split<const FMA: bool>(xc: f32) -> (i32, f32) {
    const LOG2E: f32 = core::f32::consts::LOG2_E;
    const C1: f32 = 0.693_359_4; // ln 2, high part
    const C2: f32 = -2.121_944_4e-4; // ln 2, low part
    // 1.5·2^23: adding it rounds to an integer (ties to even).
    const MAGIC: f32 = 12_582_912.0;
    let y = madd::<FMA>(xc, LOG2E, MAGIC);
    let n = (y.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let fx = y - MAGIC;
    let r = madd::<FMA>(-fx, C2, madd::<FMA>(-fx, C1, xc));
    let r2 = r * r;
    let mut p = 1.987_569_1e-4;
    p = madd::<FMA>(p, r, 1.398_199_9e-3);
    p = madd::<FMA>(p, r, 8.333_452e-3);
    p = madd::<FMA>(p, r, 4.166_579_6e-2);
    p = madd::<FMA>(p, r, 1.666_666_5e-1);
    p = madd::<FMA>(p, r, 5.000_000_1e-1);
    (n, madd::<FMA>(p, r2, r + 1.0))
}

/// `e^x`. Cephes-style range reduction and polynomial; overflows to `inf`
/// above ~88.72, flushes to 0 below ~-104, NaN in gives NaN out.
#[inline(always)]
pub(crate) fn exp<const FMA: bool>(x: f32) -> f32 {
    let (n, p) = exp_split::<FMA>(x.clamp(-104.0, 89.0));
    // 2^n in two normal-range steps so that n ∈ [-150, 129] stays exact.
    // (Wrapping ops: no overflow-check branches in the vectorized loop; the
    // values are in range except for NaN input, whose result is replaced.)
    let n1 = n >> 1;
    let n2 = n.wrapping_sub(n1);
    let s1 = f32::from_bits((n1.wrapping_add(127) as u32) << 23);
    let s2 = f32::from_bits((n2.wrapping_add(127) as u32) << 23);
    let v = p * s1 * s2;
    if x.is_nan() {
        x
    } else {
        v
    }
}

/// `tanh(x)`: odd polynomial for |x| < 0.625, `1 - 2/(e^{2|x|} + 1)` above.
#[inline(always)]
pub(crate) fn tanh<const FMA: bool>(x: f32) -> f32 {
    let a = x.abs();
    let z = x * x;
    let mut p = -5.704_988_7e-3;
    p = madd::<FMA>(p, z, 2.063_908_9e-2);
    p = madd::<FMA>(p, z, -5.373_971_6e-2);
    p = madd::<FMA>(p, z, 1.333_144_2e-1);
    p = madd::<FMA>(p, z, -3.333_328_2e-1);
    let small = madd::<FMA>(p * z, x, x);
    let big = 1.0 - 2.0 / (exp::<FMA>(2.0 * a) + 1.0);
    let big = if x < 0.0 { -big } else { big };
    if a < 0.625 {
        small
    } else {
        big
    }
}

/// `erf(x)`: rational approximation on [-4, 4] (±1 outside); absolute
/// error < 5e-7.
#[inline(always)]
pub(crate) fn erf<const FMA: bool>(x: f32) -> f32 {
    let x = if x.is_nan() { x } else { x.clamp(-4.0, 4.0) };
    let x2 = x * x;
    let mut p = -2.726_142_3e-10;
    p = madd::<FMA>(p, x2, 2.770_681_4e-8);
    p = madd::<FMA>(p, x2, -2.101_024e-6);
    p = madd::<FMA>(p, x2, -5.692_506_4e-5);
    p = madd::<FMA>(p, x2, -7.349_906_3e-4);
    p = madd::<FMA>(p, x2, -2.954_600_1e-3);
    p = madd::<FMA>(p, x2, -1.609_603_3e-2);
    let p = p * x;
    let mut q = -1.456_607_2e-5;
    q = madd::<FMA>(q, x2, -2.133_740_6e-4);
    q = madd::<FMA>(q, x2, -1.682_827e-3);
    q = madd::<FMA>(q, x2, -7.373_329e-3);
    q = madd::<FMA>(q, x2, -1.426_473_9e-2);
    let v = p / q;
    // |erf| rounds to 1 beyond ~3.9 and the rational drifts there.
    if x.abs() >= 3.9 {
        1.0f32.copysign(x)
    } else {
        v
    }
}

/// `e^x` for the logistic functions, where only `1 + e^x` matters, and for
/// softmax (arguments ≤ 0, relative to a sum ≥ 1): as [`exp`] in the normal range, but `+inf` from ~88.4 up (instead of ~88.72)
/// and 0 below ~-87.7 (instead of denormals), which lets `2^n` be a single
/// exponent insertion. NaN in gives NaN out.
#[inline(always)]
pub(crate) fn exp_logistic<const FMA: bool>(x: f32) -> f32 {
    // n = round(x·log2 e) ∈ [-127, 128]: 2^n's biased exponent is in
    // [0, 255], 0 giving 0.0 and 255 giving +inf.
    let (n, p) = exp_split::<FMA>(x.clamp(-88.0, 88.5));
    p * f32::from_bits((n.wrapping_add(127) as u32) << 23)
}

/// `1 / (1 + e^-x)`.
#[inline(always)]
pub(crate) fn sigmoid<const FMA: bool>(x: f32) -> f32 {
    1.0 / (1.0 + exp_logistic::<FMA>(-x))
}

/// `x·sigmoid(x)`.
#[inline(always)]
pub(crate) fn silu<const FMA: bool>(x: f32) -> f32 {
    x / (1.0 + exp_logistic::<FMA>(-x))
}

/// Exact (erf) GELU.
#[inline(always)]
pub(crate) fn gelu<const FMA: bool>(x: f32) -> f32 {
    0.5 * x * (1.0 + erf::<FMA>(x * core::f32::consts::FRAC_1_SQRT_2))
}

/// Tanh-approximated GELU, as `x·sigmoid(2z)` (= `0.5·x·(1 + tanh z)`),
/// which does not cancel for z < 0.
#[inline(always)]
pub(crate) fn gelu_tanh<const FMA: bool>(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_56;
    let z = SQRT_2_OVER_PI * madd::<FMA>(0.044_715 * x * x, x, x);
    x / (1.0 + exp_logistic::<FMA>(-2.0 * z))
}

/// Runs `$body` (a loop over slices built from `#[inline(always)]` element
/// functions) compiled for AVX-512 (512-bit vectors, FMA) or AVX2+FMA when
/// the CPU has them, otherwise for the baseline target. Inside `$body`, the
/// const `FMA` says which: pass it on to the [`fastmath`](self) functions
/// (`exp::<FMA>(x)`), which then use fused multiply-adds (results may
/// differ from the baseline in the last bits; every kernel picks the path
/// once per call, consistently). The AVX-512 and AVX2 builds compute the
/// same operations per element (only the vector width differs), so their
/// results are identical.
macro_rules! simd_dispatch {
    ($(#[$m:meta])* fn $name:ident($($arg:ident : $ty:ty),*) $body:block) => {
        $(#[$m])*
        pub(crate) fn $name($($arg: $ty),*) {
            #[inline(always)]
            #[allow(clippy::extra_unused_type_parameters, clippy::too_many_arguments)]
            fn generic<const FMA: bool>($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx512($($arg: $ty),*) {
                    generic::<true>($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn avx2($($arg: $ty),*) {
                    generic::<true>($($arg),*)
                }
                if $crate::fastmath::has_avx512() {
                    // SAFETY: the CPU supports the enabled features.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU supports the enabled features.
                    return unsafe { avx2($($arg),*) };
                }
            }
            generic::<false>($($arg),*)
        }
    };
}
pub(crate) use simd_dispatch;

/// Whether any kernel may use AVX-512: `RBLN_NO_AVX512` is unset (read
/// once). Set, the kernels run as on an AVX2 host (the f32 GEMM's wide
/// microkernel and the int8 kernels' VNNI too), so one machine measures
/// both; the references (onnxruntime, the gemm crate) are not affected.
pub(crate) fn avx512_allowed() -> bool {
    use std::sync::OnceLock;
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| std::env::var_os("RBLN_NO_AVX512").is_none())
}

/// Whether [`simd_dispatch`] kernels take their AVX-512 build: the CPU has
/// AVX-512 F/VL/BW/DQ and FMA, and [`avx512_allowed`] (tests and A/B
/// measurements compare the two builds in one process by running it
/// twice).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        avx512_allowed()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("fma")
    })
}

#[cfg(test)]
mod tests {
    /// Dense sweep of each function against f64, reporting worst errors.
    fn sweep(lo: f32, hi: f32, n: usize, f: impl Fn(f32) -> f32, r: impl Fn(f64) -> f64) -> (f64, f64) {
        let (mut max_rel, mut max_abs) = (0.0f64, 0.0f64);
        for i in 0..=n {
            let x = lo + (hi - lo) * (i as f32 / n as f32);
            let (g, w) = (f(x) as f64, r(x as f64));
            if w.is_infinite() || w.abs() < f32::MIN_POSITIVE as f64 {
                continue;
            }
            max_abs = max_abs.max((g - w).abs());
            max_rel = max_rel.max((g - w).abs() / w.abs());
        }
        (max_rel, max_abs)
    }

    #[test]
    fn accuracy() {
        accuracy_of::<false>();
        accuracy_of::<true>();
    }

    fn accuracy_of<const F: bool>() {
        let (rel, _) = sweep(-87.0, 88.7, 2_000_000, super::exp::<F>, f64::exp);
        assert!(rel < 3e-7, "exp rel {rel}");
        let (rel, _) = sweep(-10.0, 10.0, 2_000_000, super::tanh::<F>, f64::tanh);
        assert!(rel < 3e-7, "tanh rel {rel}");
        let (rel, _) = sweep(-1e-3, 1e-3, 100_000, super::tanh::<F>, f64::tanh);
        assert!(rel < 3e-7, "tanh small rel {rel}");
        let (_, abs) = sweep(-6.0, 6.0, 2_000_000, super::erf::<F>, libm::erf);
        assert!(abs < 5e-7, "erf abs {abs}");
        let (rel, _) = sweep(-0.5, 0.5, 200_000, super::erf::<F>, libm::erf);
        assert!(rel < 1e-6, "erf small rel {rel}");
        let (rel, _) = sweep(-20.0, 20.0, 1_000_000, super::sigmoid::<F>, |x| 1.0 / (1.0 + (-x).exp()));
        assert!(rel < 5e-7, "sigmoid rel {rel}");
        // Far tails: the logistic exp saturates early, harmlessly.
        let (_, abs) = sweep(-120.0, 120.0, 1_000_000, super::sigmoid::<F>, |x| 1.0 / (1.0 + (-x).exp()));
        assert!(abs < 1e-7, "sigmoid abs {abs}");
        let (rel, _) = sweep(-80.0, 80.0, 1_000_000, super::silu::<F>, |x| x / (1.0 + (-x).exp()));
        assert!(rel < 1e-6, "silu rel {rel}");
        assert_eq!(super::sigmoid::<F>(f32::NEG_INFINITY), 0.0);
        assert_eq!(super::sigmoid::<F>(f32::INFINITY), 1.0);
        assert!(super::sigmoid::<F>(f32::NAN).is_nan());
        assert!(super::silu::<F>(f32::NAN).is_nan());
        // Special values.
        assert!(super::exp::<false>(f32::NAN).is_nan());
        assert_eq!(super::exp::<false>(f32::INFINITY), f32::INFINITY);
        assert_eq!(super::exp::<false>(f32::NEG_INFINITY), 0.0);
        assert_eq!(super::exp::<false>(0.0), 1.0);
        assert_eq!(super::exp::<false>(100.0), f32::INFINITY);
        assert!(super::tanh::<false>(f32::NAN).is_nan());
        assert_eq!(super::tanh::<false>(f32::INFINITY), 1.0);
        assert_eq!(super::tanh::<false>(f32::NEG_INFINITY), -1.0);
        assert!(super::erf::<false>(f32::NAN).is_nan());
        assert_eq!(super::erf::<false>(f32::INFINITY), 1.0);
        assert_eq!(super::erf::<false>(f32::NEG_INFINITY), -1.0);
    }
}
