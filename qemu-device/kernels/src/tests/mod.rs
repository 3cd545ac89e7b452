//! Randomized tests against naive f64 reference implementations, plus
//! hostile-parameter tests.

mod dense;
mod elementwise;
mod eltwise;
mod fused;
mod hostile;
mod select;
mod qgemm;
mod recurrent;
mod shape_ops;
mod tile;

use crate::Activation;

/// xorshift64* — small, seeded, deterministic.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub(crate) fn range(&mut self, lo: usize, hi_incl: usize) -> usize {
        lo + self.below(hi_incl - lo + 1)
    }
    pub(crate) fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    pub(crate) fn bool(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
    /// Uniform in `[lo, hi)`.
    pub(crate) fn f32_in(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    pub(crate) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32_in(-1.0, 1.0)).collect()
    }
    pub(crate) fn vec_in(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32_in(lo, hi)).collect()
    }
}

/// Odd and awkward sizes.
pub(crate) const SIZES: &[usize] = &[1, 2, 3, 4, 7, 8, 16, 17, 33, 65];

/// Asserts `|got - want| <= tol · max(scale, |want|, floor)` element-wise.
#[track_caller]
pub(crate) fn assert_close(ctx: &str, got: &[f32], want: &[f64], scale: Option<&[f64]>, tol: f64) {
    assert_eq!(got.len(), want.len(), "{ctx}: length");
    for i in 0..got.len() {
        let (g, w) = (got[i] as f64, want[i]);
        if g == w || (g.is_nan() && w.is_nan()) {
            continue;
        }
        let s = scale.map_or(0.0, |s| s[i]).max(w.abs()).max(1e-3);
        assert!(
            (g - w).abs() <= tol * s,
            "{ctx}: element {i}: got {g}, want {w} (scale {s}, tol {tol})"
        );
    }
}

pub(crate) fn act_ref(act: Activation, x: f64) -> f64 {
    match act {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::Gelu => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
        Activation::GeluTanh => {
            0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        }
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Activation::Tanh => x.tanh(),
        Activation::Clip { min, max } => x.max(min as f64).min(max as f64),
        // In f32 like the kernels (cancellation near the clamp's zero).
        Activation::HardSigmoid { alpha, beta } => (alpha * x as f32 + beta).clamp(0.0, 1.0) as f64,
        Activation::HardSwish => x * (x as f32 * (1.0 / 6.0) + 0.5).clamp(0.0, 1.0) as f64,
    }
}

pub(crate) const ACTS: &[Activation] = &[
    Activation::None,
    Activation::Relu,
    Activation::Gelu,
    Activation::GeluTanh,
    Activation::Silu,
    Activation::Sigmoid,
    Activation::Tanh,
    Activation::Clip { min: -0.5, max: 0.75 },
];

/// Row-major strides of `shape`.
pub(crate) fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Multi-index of flat index `i` in `shape`.
pub(crate) fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

#[test]
fn rng_is_deterministic_and_spread() {
    let mut a = Rng::new(7);
    let mut b = Rng::new(7);
    let va: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
    let vb: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
    assert_eq!(va, vb);
    let mut hits = [0usize; 8];
    for _ in 0..8000 {
        hits[a.below(8)] += 1;
    }
    assert!(hits.iter().all(|&h| h > 800), "{hits:?}");
}
