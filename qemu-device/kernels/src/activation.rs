//! Element-wise unary operations and the activations that other kernels fuse.

use crate::error::Result;
use crate::util::{check_len, elementwise_chunk};
use rayon::prelude::*;

/// Activation fused into the epilogue of `gemm` / `conv2d`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Activation {
    /// Identity.
    #[default]
    None,
    /// `max(x, 0)`.
    Relu,
    /// Exact GELU: `0.5·x·(1 + erf(x/√2))` (erf to an absolute 5e-7).
    Gelu,
    /// Tanh-approximated GELU: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    GeluTanh,
    /// `x·sigmoid(x)`.
    Silu,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `tanh(x)`.
    Tanh,
    /// `min(max(x, min), max)` (ONNX Clip; if `min > max` the result is `max`).
    Clip { min: f32, max: f32 },
    /// `clamp(alpha·x + beta, 0, 1)` (ONNX HardSigmoid).
    HardSigmoid { alpha: f32, beta: f32 },
    /// `x·clamp(x/6 + 1/2, 0, 1)` (ONNX HardSwish).
    HardSwish,
}

impl Activation {
    /// This activation as a clamp `min(max(x, lo), hi)` that a GEMM
    /// microkernel applies in registers (ReLU, Clip with real bounds), and
    /// what is left for a separate pass (the activation itself otherwise).
    pub(crate) fn as_clamp(self) -> (Option<(f32, f32)>, Activation) {
        match self {
            Activation::None => (None, Activation::None),
            Activation::Relu => (Some((0.0, f32::INFINITY)), Activation::None),
            Activation::Clip { min, max } if !min.is_nan() && !max.is_nan() => (Some((min, max)), Activation::None),
            other => (None, other),
        }
    }
}

/// Element-wise unary operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UnaryOp {
    /// `max(x, 0)`.
    Relu,
    /// Exact (erf-based) GELU.
    Gelu,
    /// Tanh-approximated GELU.
    GeluTanh,
    /// `x·sigmoid(x)`.
    Silu,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `tanh(x)`.
    Tanh,
    /// `e^x`.
    Exp,
    /// Natural logarithm (`NaN` for negative, `-inf` for zero).
    Log,
    /// Square root (`NaN` for negative).
    Sqrt,
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// Error function (absolute error < 5e-7).
    Erf,
    /// `min(max(x, min), max)`.
    Clip { min: f32, max: f32 },
    /// `1 / x` (IEEE: `±inf` for `±0`).
    Reciprocal,
    /// `clamp(alpha·x + beta, 0, 1)`.
    HardSigmoid { alpha: f32, beta: f32 },
    /// `x·clamp(x/6 + 1/2, 0, 1)`.
    HardSwish,
    /// `sin(x)` (the C library's, correctly rounded in practice).
    Sin,
    /// `cos(x)`.
    Cos,
    /// Rounding to an integral value: down, up, and to nearest with
    /// halves to even (ONNX Round).
    Floor,
    Ceil,
    Round,
    /// `-1`, `0` or `1` by the sign of `x` (`±0` stays `±0`, NaN stays NaN).
    Sign,
}

impl Activation {
    /// The equivalent unary op, `None` for the identity.
    pub fn as_unary(self) -> Option<UnaryOp> {
        Some(match self {
            Activation::None => return None,
            Activation::Relu => UnaryOp::Relu,
            Activation::Gelu => UnaryOp::Gelu,
            Activation::GeluTanh => UnaryOp::GeluTanh,
            Activation::Silu => UnaryOp::Silu,
            Activation::Sigmoid => UnaryOp::Sigmoid,
            Activation::Tanh => UnaryOp::Tanh,
            Activation::Clip { min, max } => UnaryOp::Clip { min, max },
            Activation::HardSigmoid { alpha, beta } => UnaryOp::HardSigmoid { alpha, beta },
            Activation::HardSwish => UnaryOp::HardSwish,
        })
    }
}

use crate::fastmath::{self, simd_dispatch};

impl UnaryOp {
    /// Applies the operation to one value (bit-identical to the slice kernels).
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        let mut v = [x];
        apply_slice(self, &mut v);
        v[0]
    }
}

#[inline(always)]
fn map<F: Fn(f32) -> f32>(xs: &mut [f32], f: F) {
    for x in xs {
        *x = f(*x);
    }
}

/// Applies `op` in place (the op is matched once, outside the loop). Inlined
/// into SIMD-dispatched callers so that it is compiled for their features.
#[inline(always)]
// `max(..).min(..)` rather than `clamp`: a NaN input maps to the lower
// bound (the kernels' established Clip semantics), and no panic paths.
#[allow(clippy::manual_clamp)]
pub(crate) fn apply_inline<const FMA: bool>(op: UnaryOp, xs: &mut [f32]) {
    match op {
        UnaryOp::Relu => map(xs, |x| x.max(0.0)),
        UnaryOp::Gelu => map(xs, fastmath::gelu::<FMA>),
        UnaryOp::GeluTanh => map(xs, fastmath::gelu_tanh::<FMA>),
        UnaryOp::Silu => map(xs, fastmath::silu::<FMA>),
        UnaryOp::Sigmoid => map(xs, fastmath::sigmoid::<FMA>),
        UnaryOp::Tanh => map(xs, fastmath::tanh::<FMA>),
        UnaryOp::Exp => map(xs, fastmath::exp::<FMA>),
        UnaryOp::Log => map(xs, f32::ln),
        UnaryOp::Sqrt => map(xs, f32::sqrt),
        UnaryOp::Neg => map(xs, |x| -x),
        UnaryOp::Abs => map(xs, f32::abs),
        UnaryOp::Erf => map(xs, fastmath::erf::<FMA>),
        UnaryOp::Clip { min, max } => map(xs, |x| x.max(min).min(max)),
        UnaryOp::Reciprocal => map(xs, |x| 1.0 / x),
        UnaryOp::HardSigmoid { alpha, beta } => map(xs, |x| (alpha * x + beta).max(0.0).min(1.0)),
        UnaryOp::HardSwish => map(xs, |x| x * (x * (1.0 / 6.0) + 0.5).max(0.0).min(1.0)),
        UnaryOp::Sin | UnaryOp::Cos => trig(op, xs),
        UnaryOp::Floor => map(xs, f32::floor),
        UnaryOp::Ceil => map(xs, f32::ceil),
        UnaryOp::Round => map(xs, f32::round_ties_even),
        UnaryOp::Sign => map(xs, |x| if x > 0.0 { 1.0 } else if x < 0.0 { -1.0 } else { x }),
    }
}

/// Sin and Cos call the C library per element: kept out of line and cold,
/// so that the calls do not shape the register allocation of the hot
/// epilogues `apply_inline` is inlined into (measured: inline calls here
/// slowed every convolution by up to 2x).
#[cold]
#[inline(never)]
fn trig(op: UnaryOp, xs: &mut [f32]) {
    if op == UnaryOp::Sin {
        map(xs, f32::sin)
    } else {
        map(xs, f32::cos)
    }
}

simd_dispatch! {
    /// Applies `op` in place, sequentially.
    fn apply_slice(op: UnaryOp, xs: &mut [f32]) {
        apply_inline::<FMA>(op, xs)
    }
}

simd_dispatch! {
    /// `y = op(x)`, sequentially (`x` and `y` have the same length).
    fn apply_copy(op: UnaryOp, x: &[f32], y: &mut [f32]) {
        // Blocks small enough to stay in L1 between the copy and the op.
        for (d, s) in y.chunks_mut(EPI_BLOCK).zip(x.chunks(EPI_BLOCK)) {
            match op {
                UnaryOp::Relu => {
                    for (d, &s) in d.iter_mut().zip(s) {
                        *d = s.max(0.0);
                    }
                }
                UnaryOp::Clip { min, max } => {
                    for (d, &s) in d.iter_mut().zip(s) {
                        *d = s.max(min).min(max);
                    }
                }
                UnaryOp::Neg => {
                    for (d, &s) in d.iter_mut().zip(s) {
                        *d = -s;
                    }
                }
                _ => {
                    d.copy_from_slice(s);
                    apply_inline::<FMA>(op, d);
                }
            }
        }
    }
}

/// Elements per block of the fused epilogue: the adds and the activation
/// run on one block while it is in L1.
pub(crate) const EPI_BLOCK: usize = 512;

/// `x = act(x + bias + residual)` in one pass over `xs`, sequentially
/// (the inlinable body; see [`epilogue`]).
#[inline(always)]
pub(crate) fn epilogue_inline<const FMA: bool>(xs: &mut [f32], bias: Bias<'_>, residual: Option<&[f32]>, act: Activation) {
    let op = act.as_unary();
    if matches!(bias, Bias::None) && residual.is_none() && op.is_none() {
        return;
    }
    let mut i = 0;
    while i < xs.len() {
        let e = (i + EPI_BLOCK).min(xs.len());
        let blk = &mut xs[i..e];
        match bias {
            Bias::None => {}
            Bias::Scalar(b) => {
                for x in blk.iter_mut() {
                    *x += b;
                }
            }
            Bias::Row(b) => {
                for (x, &b) in blk.iter_mut().zip(&b[i..e]) {
                    *x += b;
                }
            }
        }
        if let Some(r) = residual {
            for (x, &r) in blk.iter_mut().zip(&r[i..e]) {
                *x += r;
            }
        }
        if let Some(op) = op {
            apply_inline::<FMA>(op, blk);
        }
        i = e;
    }
}

simd_dispatch! {
    /// `x = act(x + bias + residual)` in one pass, sequentially. `Bias::Row`
    /// and `residual` have `xs.len()` elements.
    fn epilogue(xs: &mut [f32], bias: Bias<'_>, residual: Option<&[f32]>, act: Activation) {
        epilogue_inline::<FMA>(xs, bias, residual, act)
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Bias<'a> {
    None,
    Scalar(f32),
    Row(&'a [f32]),
}

/// `x[i] = op(x[i])` for every element, in parallel.
pub fn unary_inplace(op: UnaryOp, x: &mut [f32]) -> Result<()> {
    let chunk = elementwise_chunk(x.len());
    if chunk >= x.len() {
        apply_slice(op, x);
    } else {
        x.par_chunks_mut(chunk).for_each(|c| apply_slice(op, c));
    }
    Ok(())
}

/// `y[i] = op(x[i])` for every element, in parallel; `x` and `y` must have
/// the same length.
pub fn unary(op: UnaryOp, x: &[f32], y: &mut [f32]) -> Result<()> {
    check_len("unary output", y.len(), x.len())?;
    let chunk = elementwise_chunk(x.len());
    if chunk >= x.len() {
        apply_copy(op, x, y);
    } else {
        y.par_chunks_mut(chunk)
            .zip(x.par_chunks(chunk))
            .for_each(|(d, s)| apply_copy(op, s, d));
    }
    Ok(())
}

/// Applies a fused activation in place (a no-op for [`Activation::None`]).
pub fn activation_inplace(act: Activation, x: &mut [f32]) -> Result<()> {
    match act.as_unary() {
        Some(op) => unary_inplace(op, x),
        None => Ok(()),
    }
}
