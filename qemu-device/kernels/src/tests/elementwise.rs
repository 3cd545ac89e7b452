//! binary, unary, softmax, layer_norm and reduce against naive references.

use super::{assert_close, strides_of, unravel, Rng};
use crate::*;

/// A random shape of the given rank whose volume stays small.
pub(crate) fn random_shape(rng: &mut Rng, rank: usize, max_volume: usize) -> Vec<usize> {
    loop {
        let s: Vec<usize> = (0..rank).map(|_| rng.pick(&[1, 2, 3, 4, 5, 7, 9, 17, 33])).collect();
        if s.iter().product::<usize>() <= max_volume {
            return s;
        }
    }
}

/// Derives an operand shape broadcastable to `out`: drop some leading dims,
/// set some to 1.
pub(crate) fn operand_shape(rng: &mut Rng, out: &[usize]) -> Vec<usize> {
    let drop = rng.below(out.len() + 1);
    out[drop..].iter().map(|&d| if rng.below(3) == 0 { 1 } else { d }).collect()
}

pub(crate) fn binary_ref(op: BinaryOp, a: &[f32], ash: &[usize], b: &[f32], bsh: &[usize], out_shape: &[usize]) -> Vec<f64> {
    let vol: usize = out_shape.iter().product();
    let index = |idx: &[usize], sh: &[usize]| -> usize {
        let off = idx.len() - sh.len();
        let st = strides_of(sh);
        (0..sh.len()).map(|d| if sh[d] == 1 { 0 } else { idx[off + d] * st[d] }).sum()
    };
    (0..vol)
        .map(|i| {
            let idx = unravel(i, out_shape);
            let (x, y) = (a[index(&idx, ash)] as f64, b[index(&idx, bsh)] as f64);
            match op {
                BinaryOp::Add => x + y,
                BinaryOp::Sub => x - y,
                BinaryOp::Mul => x * y,
                BinaryOp::Div => x / y,
                BinaryOp::Max => x.max(y),
                BinaryOp::Min => x.min(y),
                BinaryOp::Pow => x.powf(y),
                BinaryOp::Equal => cmp_ref(x == y),
                BinaryOp::Less => cmp_ref(x < y),
                BinaryOp::Greater => cmp_ref(x > y),
                BinaryOp::LessOrEqual => cmp_ref(x <= y),
                BinaryOp::GreaterOrEqual => cmp_ref(x >= y),
                // f64's `%` is exact on f32 operands, like f32's.
                BinaryOp::Mod => {
                    let r = x % y;
                    if r != 0.0 && (r < 0.0) != (y < 0.0) {
                        r + y
                    } else {
                        r
                    }
                }
                BinaryOp::FMod => x % y,
            }
        })
        .collect()
}

fn cmp_ref(holds: bool) -> f64 {
    if holds {
        1.0
    } else {
        0.0
    }
}

/// Every binary op.
pub(crate) const BINOPS: &[BinaryOp] = &[
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Max,
    BinaryOp::Min,
    BinaryOp::Pow,
    BinaryOp::Equal,
    BinaryOp::Less,
    BinaryOp::Greater,
    BinaryOp::LessOrEqual,
    BinaryOp::GreaterOrEqual,
    BinaryOp::Mod,
    BinaryOp::FMod,
];

#[test]
fn binary_broadcast_random() {
    let mut rng = Rng::new(10);
    for it in 0..600 {
        let rank = rng.range(0, 6);
        let out = random_shape(&mut rng, rank, 40_000);
        let (mut ash, mut bsh) = (operand_shape(&mut rng, &out), operand_shape(&mut rng, &out));
        if it % 5 == 0 {
            ash = out.clone();
        }
        if it % 7 == 0 {
            bsh = out.clone();
        }
        if rng.bool() {
            std::mem::swap(&mut ash, &mut bsh);
        }
        let op = BINOPS[it % BINOPS.len()];
        let a = rng.vec_in(ash.iter().product(), 0.1, 2.0);
        let b = rng.vec_in(bsh.iter().product(), -2.0, 2.0);
        let want_shape = broadcast_shape(&ash, &bsh).unwrap();
        // The broadcast of two shapes derived from `out` is `out` minus
        // leading dims that both dropped, or with dims that both set to 1.
        assert!(want_shape.len() <= out.len());
        let mut y = vec![f32::NAN; want_shape.iter().product()];
        binary(op, &a, &ash, &b, &bsh, &mut y).unwrap();
        let want = binary_ref(op, &a, &ash, &b, &bsh, &want_shape);
        assert_close(&format!("{op:?} {ash:?} {bsh:?}"), &y, &want, None, 1e-5);
    }
}

#[test]
fn binary_shapes_and_large() {
    assert_eq!(broadcast_shape(&[2, 1, 3], &[4, 1]).unwrap().as_slice(), [2, 4, 3]);
    assert_eq!(broadcast_shape(&[], &[5]).unwrap().as_slice(), [5]);
    assert_eq!(broadcast_shape(&[0, 1], &[1, 3]).unwrap().as_slice(), [0, 3]);
    assert!(matches!(broadcast_shape(&[2, 3], &[3, 2]), Err(KernelError::Broadcast { .. })));
    // Zero-volume output.
    binary(BinaryOp::Add, &[], &[0, 1], &[1.0, 2.0, 3.0], &[1, 3], &mut []).unwrap();
    // Large enough for several parallel tasks in each code path.
    let mut rng = Rng::new(11);
    for (ash, bsh) in [
        (vec![300, 257], vec![300, 257]),
        (vec![300, 257], vec![257]),
        (vec![300, 1], vec![1, 257]),
        (vec![1], vec![70_001]),
        (vec![64, 3, 2, 100], vec![64, 1, 2, 1]),
    ] {
        let a = rng.vec(ash.iter().product());
        let b = rng.vec(bsh.iter().product());
        let shape = broadcast_shape(&ash, &bsh).unwrap();
        let mut y = vec![0.0; shape.iter().product()];
        binary(BinaryOp::Mul, &a, &ash, &b, &bsh, &mut y).unwrap();
        let want = binary_ref(BinaryOp::Mul, &a, &ash, &b, &bsh, &shape);
        assert_close("binary large", &y, &want, None, 1e-6);
    }
}

/// Outputs past the streaming-store threshold (x86-64: non-temporal
/// stores) give bit for bit what the cached path gives on the same rows:
/// same shape or a broadcast operand, an output slice starting off a
/// 16-byte boundary (the unaligned head) and odd lengths (the tail), NaNs
/// through no activation, ReLU and Clip.
#[test]
fn binary_streaming_stores_match_cached_path() {
    let rows = 4;
    let cols = (3 << 20) + 5; // 4 x 12 MiB per operand: past STREAM_MIN_BYTES
    let n = rows * cols;
    let mut rng = Rng::new(5);
    let mut a = rng.vec(n);
    let b = rng.vec(n);
    let bcol = rng.vec(cols);
    for i in (0..n).step_by(100_003) {
        a[i] = f32::NAN;
    }
    // One spare element in front: the output starts 4 bytes past the
    // allocation's alignment.
    let mut buf = vec![0.0f32; n + 1];
    for act in [Activation::None, Activation::Relu, Activation::Clip { min: -0.5, max: 0.25 }] {
        for (op, bshape, bdata) in [(BinaryOp::Add, vec![rows, cols], &b), (BinaryOp::Sub, vec![cols], &bcol)] {
            let out = &mut buf[1..];
            binary_act(op, &a, &[rows, cols], bdata, &bshape, act, out).unwrap();
            // The reference: each row on its own, far below the threshold.
            for r in 0..rows {
                let mut want = vec![0.0f32; cols];
                let brow = if bshape.len() == 2 { &bdata[r * cols..][..cols] } else { &bdata[..] };
                for (c0, w) in (0..cols).step_by(4096).zip(want.chunks_mut(4096)) {
                    let len = w.len();
                    binary_act(op, &a[r * cols + c0..][..len], &[len], &brow[c0..][..len], &[len], act, w).unwrap();
                }
                let got = &out[r * cols..][..cols];
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(g.to_bits() == w.to_bits(), "{op:?} {act:?} row {r} col {i}: {g} != {w}");
                }
            }
        }
    }
}

const COMPARISONS: [BinaryOp; 5] =
    [BinaryOp::Equal, BinaryOp::Less, BinaryOp::Greater, BinaryOp::LessOrEqual, BinaryOp::GreaterOrEqual];

/// Every comparison of every pair of special values (a column of values
/// against a row of them, so with broadcasting), against a reference
/// written with `partial_cmp`: NaN compares false, `-0 == +0`.
#[test]
fn binary_comparisons_special_values() {
    use std::cmp::Ordering;
    let v = [f32::NEG_INFINITY, -1.5, -0.0, 0.0, 1e-38, 1.5, f32::INFINITY, f32::NAN];
    let n = v.len();
    for op in COMPARISONS {
        let mut y = vec![-7.0; n * n];
        binary(op, &v, &[n, 1], &v, &[1, n], &mut y).unwrap();
        for i in 0..n {
            for j in 0..n {
                let ord = v[i].partial_cmp(&v[j]);
                let holds = match (op, ord) {
                    (_, None) => false,
                    (BinaryOp::Equal, Some(o)) => o == Ordering::Equal,
                    (BinaryOp::Less, Some(o)) => o == Ordering::Less,
                    (BinaryOp::Greater, Some(o)) => o == Ordering::Greater,
                    (BinaryOp::LessOrEqual, Some(o)) => o != Ordering::Greater,
                    (_, Some(o)) => o != Ordering::Less,
                };
                let want: f32 = if holds { 1.0 } else { 0.0 };
                assert_eq!(y[i * n + j].to_bits(), want.to_bits(), "{op:?}({}, {})", v[i], v[j]);
            }
        }
    }
    // Spot checks of the rules themselves.
    let mut y = [9.0; 4];
    binary(BinaryOp::Equal, &[-0.0, f32::NAN, f32::INFINITY, 2.0], &[4], &[0.0, f32::NAN, f32::INFINITY, 3.0], &[4], &mut y)
        .unwrap();
    assert_eq!(y, [1.0, 0.0, 1.0, 0.0]);
    binary(BinaryOp::GreaterOrEqual, &[f32::NAN, 1.0, 1.0, -1.0], &[4], &[1.0], &[], &mut y).unwrap();
    assert_eq!(y, [0.0, 1.0, 1.0, 0.0]);
    binary(BinaryOp::LessOrEqual, &[2.0], &[1], &[1.0, 2.0, 3.0, f32::NAN], &[4], &mut y).unwrap();
    assert_eq!(y, [0.0, 1.0, 1.0, 0.0]);
}

/// Mod takes the divisor's sign, FMod the dividend's; both are exact
/// (no rounding of a/b), and a zero divisor gives NaN.
#[test]
fn remainders_follow_their_signs() {
    let a = [7.0f32, -7.0, 7.0, -7.0, 5.5, 1e30, 3.0, 0.0];
    let b = [3.0f32, 3.0, -3.0, -3.0, 2.0, 7.0, 0.0, -2.0];
    let mut y = [0.0f32; 8];
    binary(BinaryOp::Mod, &a, &[8], &b, &[8], &mut y).unwrap();
    assert_eq!(&y[..6], &[1.0, 2.0, -2.0, -1.0, 1.5, 1e30f32 % 7.0]);
    assert!(y[6].is_nan());
    assert_eq!(y[7].to_bits(), 0.0f32.to_bits());
    binary(BinaryOp::FMod, &a, &[8], &b, &[8], &mut y).unwrap();
    assert_eq!(&y[..6], &[1.0, -1.0, 1.0, -1.0, 1.5, 1e30f32 % 7.0]);
    assert!(y[6].is_nan());
}

/// Pow by a constant 2 or 3 multiplies (the fast path) and agrees with
/// powf to rounding, special values included; other exponents and
/// per-element exponents still take powf.
#[test]
fn pow_constant_exponents() {
    let mut rng = Rng::new(31);
    let mut x: Vec<f32> = (0..5000).map(|_| rng.f32_in(-8.0, 8.0)).collect();
    x.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e20, -1e-20, 3.0e12]);
    for e in [2.0f32, 3.0, 0.5, -1.0, 2.5] {
        let mut y = vec![0.0; x.len()];
        binary(BinaryOp::Pow, &x, &[x.len()], &[e], &[1], &mut y).unwrap();
        for (i, (&a, &g)) in x.iter().zip(&y).enumerate() {
            let w = a.powf(e);
            let same = g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= 2.0 * f32::EPSILON * w.abs();
            assert!(same, "{a}^{e} (element {i}): got {g}, powf {w}");
        }
    }
    // A per-element exponent of 3s is not the scalar fast path.
    let mut y = vec![0.0; 3];
    binary(BinaryOp::Pow, &[-2.0, 1.5, 4.0], &[3], &[3.0, 3.0, 0.5], &[3], &mut y).unwrap();
    assert_eq!(y, [-8.0, 3.375, 2.0]);
}

/// Comparisons of small integers (so ties are frequent) with random
/// broadcasts, including the parallel paths, and fused activations of
/// the 0/1 result.
#[test]
fn binary_comparisons_random_broadcast_and_fused() {
    let mut rng = Rng::new(12);
    let int_vec = |rng: &mut Rng, n: usize| -> Vec<f32> { (0..n).map(|_| rng.range(0, 4) as f32 - 2.0).collect() };
    for it in 0..400 {
        let rank = rng.range(0, 5);
        let out = random_shape(&mut rng, rank, 20_000);
        let (ash, bsh) = (operand_shape(&mut rng, &out), operand_shape(&mut rng, &out));
        let op = COMPARISONS[it % COMPARISONS.len()];
        let (a, b) = (int_vec(&mut rng, ash.iter().product()), int_vec(&mut rng, bsh.iter().product()));
        let shape = broadcast_shape(&ash, &bsh).unwrap();
        let mut y = vec![f32::NAN; shape.iter().product()];
        binary(op, &a, &ash, &b, &bsh, &mut y).unwrap();
        let want = binary_ref(op, &a, &ash, &b, &bsh, &shape);
        assert!(y.iter().zip(&want).all(|(&g, &w)| g as f64 == w), "{op:?} {ash:?} {bsh:?}");
    }
    for (ash, bsh) in [(vec![300, 257], vec![257]), (vec![300, 1], vec![1, 257]), (vec![70_001], vec![70_001])] {
        let a = int_vec(&mut rng, ash.iter().product());
        let b = int_vec(&mut rng, bsh.iter().product());
        let shape = broadcast_shape(&ash, &bsh).unwrap();
        let mut y = vec![f32::NAN; shape.iter().product()];
        for op in COMPARISONS {
            binary(op, &a, &ash, &b, &bsh, &mut y).unwrap();
            let want = binary_ref(op, &a, &ash, &b, &bsh, &shape);
            assert!(y.iter().zip(&want).all(|(&g, &w)| g as f64 == w), "{op:?} {ash:?} {bsh:?}");
            // Both outcomes occur.
            assert!(y.contains(&0.0) && y.contains(&1.0));
        }
        // The activation applies to the 0/1 result: Clip(-0.5, 0.75) maps
        // it to {0, 0.75}, Sigmoid to {0.5, σ(1)}.
        let clip = Activation::Clip { min: -0.5, max: 0.75 };
        binary_act(BinaryOp::Less, &a, &ash, &b, &bsh, clip, &mut y).unwrap();
        let want = binary_ref(BinaryOp::Less, &a, &ash, &b, &bsh, &shape);
        assert!(y.iter().zip(&want).all(|(&g, &w)| g == if w == 1.0 { 0.75 } else { 0.0 }));
        binary_act(BinaryOp::Greater, &a, &ash, &b, &bsh, Activation::Sigmoid, &mut y).unwrap();
        let want = binary_ref(BinaryOp::Greater, &a, &ash, &b, &bsh, &shape);
        let want: Vec<f64> = want.iter().map(|&w| super::act_ref(Activation::Sigmoid, w)).collect();
        assert_close("greater + sigmoid", &y, &want, None, 1e-6);
    }
}

fn unary_ref(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Gelu => super::act_ref(Activation::Gelu, x),
        UnaryOp::GeluTanh => super::act_ref(Activation::GeluTanh, x),
        UnaryOp::Silu => super::act_ref(Activation::Silu, x),
        UnaryOp::Sigmoid => super::act_ref(Activation::Sigmoid, x),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Erf => libm::erf(x),
        UnaryOp::Clip { min, max } => x.max(min as f64).min(max as f64),
        UnaryOp::Reciprocal => 1.0 / x,
        // In f32 like the kernel: `alpha·x + beta` cancels near the clamp's
        // zero, where an f64 reference would differ by more than the tolerance.
        UnaryOp::HardSigmoid { alpha, beta } => (alpha * x as f32 + beta).clamp(0.0, 1.0) as f64,
        UnaryOp::HardSwish => x * (x as f32 * (1.0 / 6.0) + 0.5).clamp(0.0, 1.0) as f64,
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Sign => x.signum() * (x != 0.0) as u8 as f64,
    }
}

#[test]
fn unary_all_ops() {
    let mut rng = Rng::new(12);
    let ops = [
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Erf,
        UnaryOp::Clip { min: -1.5, max: 0.25 },
        UnaryOp::Reciprocal,
        UnaryOp::HardSigmoid { alpha: 0.2, beta: 0.5 },
        UnaryOp::HardSwish,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Sign,
    ];
    for op in ops {
        for n in [0, 1, 7, 33, 40_000] {
            let x = match op {
                UnaryOp::Log | UnaryOp::Sqrt => rng.vec_in(n, 1e-3, 50.0),
                UnaryOp::Reciprocal => rng.vec_in(n, 0.05, 20.0).into_iter().map(|v| if rng.bool() { v } else { -v }).collect(),
                UnaryOp::Exp => rng.vec_in(n, -20.0, 20.0),
                _ => rng.vec_in(n, -8.0, 8.0),
            };
            let want: Vec<f64> = x.iter().map(|&v| unary_ref(op, v as f64)).collect();
            // erf is accurate to an absolute 5e-7, which GELU scales by |x|/2.
            let scale: Vec<f64> = match op {
                UnaryOp::Gelu | UnaryOp::Erf => x.iter().map(|&v| 0.05 * (v.abs() as f64).max(1.0)).collect(),
                _ => vec![0.0; n],
            };
            let mut y = vec![f32::NAN; n];
            unary(op, &x, &mut y).unwrap();
            assert_close(&format!("{op:?} n={n}"), &y, &want, Some(&scale), 1e-5);
            let mut z = x.clone();
            unary_inplace(op, &mut z).unwrap();
            assert_eq!(y, z, "{op:?} in place");
            assert_eq!(op.apply(x.first().copied().unwrap_or(1.0)), {
                let mut t = [x.first().copied().unwrap_or(1.0)];
                unary_inplace(op, &mut t).unwrap();
                t[0]
            });
        }
    }
    // Extreme inputs stay finite where they should.
    let mut t = [-100.0f32, 100.0];
    unary_inplace(UnaryOp::Sigmoid, &mut t).unwrap();
    assert_eq!(t, [0.0, 1.0]);
    let mut t = [-100.0f32, 100.0];
    unary_inplace(UnaryOp::Silu, &mut t).unwrap();
    assert_eq!(t, [-0.0, 100.0]);
    assert!(matches!(unary(UnaryOp::Neg, &[1.0], &mut []), Err(KernelError::LengthMismatch { .. })));
}

fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product())
}

/// Softmax (or log-softmax) of `x` along `axis`, in f64.
fn softmax_ref(x: &[f32], shape: &[usize], axis: usize, log: bool) -> Vec<f64> {
    let (outer, len, inner) = split(shape, axis);
    let mut want = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |a: usize| (o * len + a) * inner + i;
            let m = (0..len).map(|a| x[at(a)] as f64).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..len).map(|a| (x[at(a)] as f64 - m).exp()).sum();
            for a in 0..len {
                let d = x[at(a)] as f64 - m;
                want[at(a)] = if log { d - s.ln() } else { d.exp() / s };
            }
        }
    }
    want
}

#[test]
fn softmax_random() {
    let mut rng = Rng::new(13);
    for it in 0..200 {
        let rank = rng.range(1, 6);
        let shape = random_shape(&mut rng, rank, 30_000);
        let axis = rng.below(rank);
        let x: Vec<f32> = rng.vec_in(shape.iter().product(), -30.0, 30.0);
        let mut y = vec![f32::NAN; x.len()];
        let ax = if it % 2 == 0 { axis as isize } else { axis as isize - rank as isize };
        softmax(&shape, ax, &x, &mut y).unwrap();
        let want = softmax_ref(&x, &shape, axis, false);
        // Softmax outputs are ≤ 1: compare against 1 as the magnitude.
        let ones = vec![1.0; x.len()];
        assert_close(&format!("softmax {shape:?} axis {axis}"), &y, &want, Some(&ones), 1e-5);
    }
    // Huge inputs do not overflow.
    let mut y = [0.0; 3];
    softmax(&[3], 0, &[1000.0, 1000.0, -1000.0], &mut y).unwrap();
    assert_eq!(y, [0.5, 0.5, 0.0]);
}

#[test]
fn log_softmax_random() {
    let mut rng = Rng::new(14);
    for _ in 0..100 {
        let rank = rng.range(1, 6);
        let shape = random_shape(&mut rng, rank, 30_000);
        let axis = rng.below(rank);
        let x: Vec<f32> = rng.vec_in(shape.iter().product(), -30.0, 30.0);
        let mut y = vec![f32::NAN; x.len()];
        log_softmax(&shape, axis as isize, &x, &mut y).unwrap();
        let want = softmax_ref(&x, &shape, axis, true);
        // Errors scale with the inputs' range (|x − m| ≤ 60).
        let scale = vec![60.0; x.len()];
        assert_close(&format!("log_softmax {shape:?} axis {axis}"), &y, &want, Some(&scale), 1e-6);
    }
    // Huge inputs neither overflow nor lose the small terms.
    let mut y = [0.0; 3];
    log_softmax(&[3], 0, &[1000.0, 1000.0, -1000.0], &mut y).unwrap();
    assert!((y[0] + std::f32::consts::LN_2).abs() < 1e-6 && y[0] == y[1] && y[2] < -1999.0, "{y:?}");
}

#[test]
fn layer_norm_random() {
    check_norm_random(true);
}

/// RMS norm: no mean subtracted (a mean far from 0 would show).
#[test]
fn rms_norm_random() {
    check_norm_random(false);
}

fn check_norm_random(centre: bool) {
    let mut rng = Rng::new(if centre { 14 } else { 15 });
    let norm_fn = if centre { layer_norm } else { rms_norm };
    for it in 0..60 {
        let norm = rng.pick(&[1, 2, 3, 7, 17, 64, 65, 768, 1000]);
        let rows = rng.pick(&[0, 1, 3, 33, 100]);
        let x: Vec<f32> = rng.vec(rows * norm).into_iter().map(|v| v * 3.0 + 2.0).collect();
        let gamma = rng.vec(norm);
        let beta = rng.vec(norm);
        let g = (it % 2 == 0).then_some(&gamma[..]);
        let b = (it % 3 != 0).then_some(&beta[..]);
        let eps = 1e-5;
        let mut y = vec![f32::NAN; x.len()];
        norm_fn(&x, norm, g, b, eps, &mut y).unwrap();
        let mut want = vec![0.0; x.len()];
        for r in 0..rows {
            let xr = &x[r * norm..][..norm];
            let mean = if centre { xr.iter().map(|&v| v as f64).sum::<f64>() / norm as f64 } else { 0.0 };
            let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / norm as f64;
            for j in 0..norm {
                let mut v = (xr[j] as f64 - mean) / (var + eps as f64).sqrt();
                if let Some(g) = g {
                    v *= g[j] as f64;
                }
                if let Some(b) = b {
                    v += b[j] as f64;
                }
                want[r * norm + j] = v;
            }
        }
        // Normalized values are O(1): compare against 1 as the magnitude.
        let ones = vec![1.0; want.len()];
        assert_close(&format!("norm centre={centre} norm={norm} rows={rows}"), &y, &want, Some(&ones), 1e-4);
    }
}

#[test]
fn reduce_random() {
    let mut rng = Rng::new(15);
    let ops = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min];
    for it in 0..300 {
        let rank = rng.range(1, 6);
        let mut shape = random_shape(&mut rng, rank, 30_000);
        if it == 0 {
            shape = vec![3, 70_000];
        } else if it == 1 {
            shape = vec![2, 5, 20_000];
        }
        let axis = if it < 2 { 1 } else { rng.below(shape.len()) };
        let op = ops[it % ops.len()];
        let x = rng.vec(shape.iter().product());
        let (outer, len, inner) = split(&shape, axis);
        let mut y = vec![f32::NAN; outer * inner];
        reduce(op, &shape, axis as isize, &x, &mut y).unwrap();
        let mut want = vec![0.0; outer * inner];
        let mut scale = vec![0.0; outer * inner];
        for o in 0..outer {
            for i in 0..inner {
                let vals: Vec<f64> = (0..len).map(|a| x[(o * len + a) * inner + i] as f64).collect();
                let abs: f64 = vals.iter().map(|v| v.abs()).sum();
                want[o * inner + i] = match op {
                    ReduceOp::Sum => vals.iter().sum(),
                    ReduceOp::Mean => vals.iter().sum::<f64>() / len as f64,
                    ReduceOp::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    ReduceOp::Min => vals.iter().copied().fold(f64::INFINITY, f64::min),
                };
                scale[o * inner + i] = if op == ReduceOp::Mean { abs / len as f64 } else { abs };
            }
        }
        assert_close(&format!("{op:?} {shape:?} axis {axis}"), &y, &want, Some(&scale), 1e-5);
    }
    // Empty reduction axis: identities.
    for (op, v) in [(ReduceOp::Sum, 0.0), (ReduceOp::Max, f32::NEG_INFINITY), (ReduceOp::Min, f32::INFINITY)] {
        let mut y = [7.0; 2];
        reduce(op, &[2, 0], -1, &[], &mut y).unwrap();
        assert_eq!(y, [v, v]);
    }
    let mut y = [7.0; 2];
    reduce(ReduceOp::Mean, &[2, 0], 1, &[], &mut y).unwrap();
    assert!(y.iter().all(|v| v.is_nan()));
}
