//! Element-wise unary operations and the activations that other kernels fuse.

use crate::error::Result;
use crate::util::{check_len, PAR_CHUNK};
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
        })
    }
}

use crate::fastmath::{self, simd_dispatch};

impl UnaryOp {
    /// Applies the operation to one value.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::Gelu => fastmath::gelu(x),
            UnaryOp::GeluTanh => fastmath::gelu_tanh(x),
            UnaryOp::Silu => fastmath::silu(x),
            UnaryOp::Sigmoid => fastmath::sigmoid(x),
            UnaryOp::Tanh => fastmath::tanh(x),
            UnaryOp::Exp => fastmath::exp(x),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Erf => fastmath::erf(x),
            UnaryOp::Clip { min, max } => x.max(min).min(max),
            UnaryOp::Reciprocal => 1.0 / x,
        }
    }
}

#[inline(always)]
fn map<F: Fn(f32) -> f32>(xs: &mut [f32], f: F) {
    for x in xs {
        *x = f(*x);
    }
}

simd_dispatch! {
    /// Applies `op` in place, sequentially (the op is matched once, outside the loop).
    fn apply_slice(op: UnaryOp, xs: &mut [f32]) {
        match op {
            UnaryOp::Relu => map(xs, |x| x.max(0.0)),
            UnaryOp::Gelu => map(xs, fastmath::gelu),
            UnaryOp::GeluTanh => map(xs, fastmath::gelu_tanh),
            UnaryOp::Silu => map(xs, fastmath::silu),
            UnaryOp::Sigmoid => map(xs, fastmath::sigmoid),
            UnaryOp::Tanh => map(xs, fastmath::tanh),
            UnaryOp::Exp => map(xs, fastmath::exp),
            UnaryOp::Log => map(xs, f32::ln),
            UnaryOp::Sqrt => map(xs, f32::sqrt),
            UnaryOp::Neg => map(xs, |x| -x),
            UnaryOp::Abs => map(xs, f32::abs),
            UnaryOp::Erf => map(xs, fastmath::erf),
            UnaryOp::Clip { min, max } => map(xs, |x| x.max(min).min(max)),
            UnaryOp::Reciprocal => map(xs, |x| 1.0 / x),
        }
    }
}

/// Adds `bias` (a scalar or a per-element slice) and applies `act`, in place.
#[inline]
pub(crate) fn bias_act_slice(xs: &mut [f32], bias: Bias<'_>, act: Activation) {
    match bias {
        Bias::None => {}
        Bias::Scalar(b) => {
            for x in xs.iter_mut() {
                *x += b;
            }
        }
        Bias::Row(b) => {
            for (x, &b) in xs.iter_mut().zip(b) {
                *x += b;
            }
        }
    }
    if let Some(op) = act.as_unary() {
        apply_slice(op, xs);
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
    x.par_chunks_mut(PAR_CHUNK).for_each(|c| apply_slice(op, c));
    Ok(())
}

/// `y[i] = op(x[i])` for every element, in parallel; `x` and `y` must have
/// the same length.
pub fn unary(op: UnaryOp, x: &[f32], y: &mut [f32]) -> Result<()> {
    check_len("unary output", y.len(), x.len())?;
    y.par_chunks_mut(PAR_CHUNK)
        .zip(x.par_chunks(PAR_CHUNK))
        .for_each(|(d, s)| {
            d.copy_from_slice(s);
            apply_slice(op, d);
        });
    Ok(())
}

/// Applies a fused activation in place (a no-op for [`Activation::None`]).
pub fn activation_inplace(act: Activation, x: &mut [f32]) -> Result<()> {
    match act.as_unary() {
        Some(op) => unary_inplace(op, x),
        None => Ok(()),
    }
}
