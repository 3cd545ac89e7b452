//! Constant folding: ops whose inputs are all known at compile time are
//! evaluated here, on the host, instead of becoming device work. This is
//! what turns exporters' shape arithmetic (Shape -> Gather -> Concat ->
//! Reshape) into static shapes.

use crate::ir::{Const, Data};
use crate::shape::{self, R};

/// The elements of `c` at flat indices `idx`, as a tensor of `shape`.
pub fn pick(c: &Const, idx: &[usize], shape: &[u64]) -> Const {
    let data = match &c.data {
        Data::F(v) => Data::F(idx.iter().map(|&i| v[i]).collect()),
        Data::I(v) => Data::I(idx.iter().map(|&i| v[i]).collect()),
    };
    Const { shape: shape.to_vec(), data }
}

fn broadcast_to(c: &Const, out: &[u64]) -> Vec<usize> {
    shape::box_indices(out, &shape::broadcast_strides(&c.shape, out), 0)
}

/// Element-wise binary op with numpy broadcasting. Integer inputs stay
/// integers (comparisons give 0/1 integers).
pub fn binary(op: &str, a: &Const, b: &Const) -> R<Const> {
    let out = shape::broadcast(&a.shape, &b.shape)?;
    shape::fold_limit(&out)?;
    let (ia, ib) = (broadcast_to(a, &out), broadcast_to(b, &out));
    let cmp = matches!(op, "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual");
    if !a.is_float() && !b.is_float() {
        let (x, y) = (a.ints(), b.ints());
        let mut v = Vec::with_capacity(ia.len());
        for (&i, &j) in ia.iter().zip(&ib) {
            let (p, q) = (x[i], y[j]);
            v.push(match op {
                "Add" => p.wrapping_add(q),
                "Sub" => p.wrapping_sub(q),
                "Mul" => p.wrapping_mul(q),
                "Div" if q == 0 => return Err("integer division by zero".into()),
                "Div" => p.wrapping_div(q),
                "Max" => p.max(q),
                "Min" => p.min(q),
                "Pow" => p.wrapping_pow(q.clamp(0, 63) as u32),
                "Equal" => (p == q) as i64,
                "Less" => (p < q) as i64,
                "Greater" => (p > q) as i64,
                "LessOrEqual" => (p <= q) as i64,
                "GreaterOrEqual" => (p >= q) as i64,
                _ => return Err(format!("{op} cannot be folded")),
            });
        }
        return Ok(Const::i64(&out, v));
    }
    let (x, y) = (a.floats(), b.floats());
    let mut v = Vec::with_capacity(ia.len());
    for (&i, &j) in ia.iter().zip(&ib) {
        let (p, q) = (x[i], y[j]);
        v.push(match op {
            "Add" => p + q,
            "Sub" => p - q,
            "Mul" => p * q,
            "Div" => p / q,
            "Max" | "Min" if p.is_nan() || q.is_nan() => f32::NAN,
            "Max" => p.max(q),
            "Min" => p.min(q),
            "Pow" => p.powf(q),
            "Equal" => (p == q) as i32 as f32,
            "Less" => (p < q) as i32 as f32,
            "Greater" => (p > q) as i32 as f32,
            "LessOrEqual" => (p <= q) as i32 as f32,
            "GreaterOrEqual" => (p >= q) as i32 as f32,
            _ => return Err(format!("{op} cannot be folded")),
        });
    }
    if cmp {
        return Ok(Const::i64(&out, v.iter().map(|&x| x as i64).collect()));
    }
    Ok(Const::f32(&out, v))
}

/// Element-wise unary op, or None when it is left to the device. Not and
/// IsNaN give 0/1 integers; Floor, Ceil and Round leave integers as they
/// are; Round rounds half to even; Sign is 0 for ±0 and NaN for NaN.
pub fn unary(op: &str, c: &Const) -> Option<Const> {
    match op {
        "Not" => return Some(bools(&c.shape, truth(c).into_iter().map(|t| !t))),
        "IsNaN" => {
            let v: Vec<bool> = match &c.data {
                Data::F(v) => v.iter().map(|x| x.is_nan()).collect(),
                Data::I(v) => vec![false; v.len()],
            };
            return Some(bools(&c.shape, v.into_iter()));
        }
        _ => {}
    }
    if let Data::I(v) = &c.data {
        let v = match op {
            "Neg" => v.iter().map(|x| x.wrapping_neg()).collect(),
            "Abs" => v.iter().map(|x| x.wrapping_abs()).collect(),
            "Sign" => v.iter().map(|x| x.signum()).collect(),
            "Identity" | "Floor" | "Ceil" | "Round" => v.clone(),
            _ => return None,
        };
        return Some(Const::i64(&c.shape, v));
    }
    let f: fn(f32) -> f32 = match op {
        "Neg" => |x| -x,
        "Abs" => f32::abs,
        "Sqrt" => f32::sqrt,
        "Exp" => f32::exp,
        "Log" => f32::ln,
        "Reciprocal" => |x| 1.0 / x,
        "Sin" => f32::sin,
        "Cos" => f32::cos,
        "Relu" => |x| x.max(0.0),
        "Sigmoid" => |x| 1.0 / (1.0 + (-x).exp()),
        "Tanh" => f32::tanh,
        "Floor" => f32::floor,
        "Ceil" => f32::ceil,
        "Round" => f32::round_ties_even,
        "Sign" => |x| if x > 0.0 { 1.0 } else if x < 0.0 { -1.0 } else if x.is_nan() { x } else { 0.0 },
        "Identity" => |x| x,
        _ => return None,
    };
    Some(Const::f32(&c.shape, c.floats().into_iter().map(f).collect()))
}

pub fn where_(cond: &Const, a: &Const, b: &Const) -> R<Const> {
    let out = shape::broadcast(&shape::broadcast(&cond.shape, &a.shape)?, &b.shape)?;
    shape::fold_limit(&out)?;
    let (ic, ia, ib) = (broadcast_to(cond, &out), broadcast_to(a, &out), broadcast_to(b, &out));
    let c = cond.ints();
    if a.is_float() || b.is_float() {
        let (x, y) = (a.floats(), b.floats());
        Ok(Const::f32(&out, ic.iter().zip(ia.iter().zip(&ib)).map(|(&k, (&i, &j))| if c[k] != 0 { x[i] } else { y[j] }).collect()))
    } else {
        let (x, y) = (a.ints(), b.ints());
        Ok(Const::i64(&out, ic.iter().zip(ia.iter().zip(&ib)).map(|(&k, (&i, &j))| if c[k] != 0 { x[i] } else { y[j] }).collect()))
    }
}

pub fn concat(parts: &[&Const], axis: usize, out: &[u64]) -> Const {
    let outer: u64 = out[..axis].iter().product();
    let inner: u64 = out[axis + 1..].iter().product();
    let float = parts.iter().any(|p| p.is_float());
    // Each part's values converted once (not per outer index: that made
    // large folded concats quadratic).
    let (fs, is): (Vec<Vec<f32>>, Vec<Vec<i64>>) = if float { (parts.iter().map(|p| p.floats()).collect(), vec![]) } else { (vec![], parts.iter().map(|p| p.ints()).collect()) };
    let mut f = Vec::new();
    let mut i = Vec::new();
    for o in 0..outer {
        for (k, p) in parts.iter().enumerate() {
            let chunk = (p.shape[axis] * inner) as usize;
            let at = o as usize * chunk;
            if float {
                f.extend_from_slice(&fs[k][at..at + chunk]);
            } else {
                i.extend_from_slice(&is[k][at..at + chunk]);
            }
        }
    }
    if float {
        Const::f32(out, f)
    } else {
        Const::i64(out, i)
    }
}

pub fn transpose(c: &Const, perm: &[usize]) -> Const {
    let st = shape::strides(&c.shape);
    let out: Vec<u64> = perm.iter().map(|&p| c.shape[p]).collect();
    let src: Vec<u64> = perm.iter().map(|&p| st[p]).collect();
    pick(c, &shape::box_indices(&out, &src, 0), &out)
}

/// Cast to ONNX element type `to`. Floating-point types are held as f32,
/// integer types as i64 with the target's width: floats truncate toward
/// zero, and integers wrap to the width (as a C cast does); bool is 0/1.
pub fn cast(c: &Const, to: i32) -> R<Const> {
    use crate::onnx::elem::*;
    // float16 and bfloat16 are held at f32 precision.
    if matches!(to, FLOAT | DOUBLE | 10 | 16) {
        return Ok(Const::f32(&c.shape, c.floats()));
    }
    let wrap: fn(i64) -> i64 = match to {
        BOOL => return Ok(bools(&c.shape, truth(c).into_iter())),
        INT64 | UINT64 => |v| v,
        INT32 => |v| v as i32 as i64,
        UINT32 => |v| v as u32 as i64,
        INT16 => |v| v as i16 as i64,
        UINT16 => |v| v as u16 as i64,
        INT8 => |v| v as i8 as i64,
        UINT8 => |v| v as u8 as i64,
        other => return Err(format!("a cast to {} ({other}) cannot be folded", crate::onnx::elem::name(other))),
    };
    Ok(Const::i64(&c.shape, c.ints().into_iter().map(wrap).collect()))
}

pub fn range(start: &Const, limit: &Const, delta: &Const) -> R<Const> {
    if start.is_float() {
        let (s, l, d) = (start.floats()[0], limit.floats()[0], delta.floats()[0]);
        if d == 0.0 {
            return Err("Range with delta 0".into());
        }
        let n = ((l - s) / d).ceil().max(0.0) as u64;
        if n > 1 << 24 {
            return Err(format!("Range of {n} elements"));
        }
        Ok(Const::f32(&[n], (0..n).map(|i| s + i as f32 * d).collect()))
    } else {
        let (s, l, d) = (start.ints()[0], limit.ints()[0], delta.ints()[0]);
        if d == 0 {
            return Err("Range with delta 0".into());
        }
        // In i128: limits and deltas near the i64 bounds must not overflow.
        let (s128, l128, d128) = (s as i128, l as i128, d as i128);
        let n = ((l128 - s128 + d128 - d128.signum()) / d128).clamp(0, 1 << 25) as u64;
        if n > 1 << 24 {
            return Err(format!("Range of {n} elements"));
        }
        Ok(Const::i64(&[n], (0..n as i64).map(|i| s + i * d).collect()))
    }
}

// ---------------------------------------------------------------------------
// The rest of what exporters put in shape and mask subgraphs: compile-time
// only (the importer requires constant inputs for these).

/// Element types the data-moving folds (scatter, cumsum) work on.
trait Num: Copy + PartialOrd {
    const ZERO: Self;
    fn plus(self, o: Self) -> Self;
    fn times(self, o: Self) -> Self;
}

impl Num for f32 {
    const ZERO: Self = 0.0;
    fn plus(self, o: Self) -> Self {
        self + o
    }
    fn times(self, o: Self) -> Self {
        self * o
    }
}

impl Num for i64 {
    const ZERO: Self = 0;
    fn plus(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    fn times(self, o: Self) -> Self {
        self.wrapping_mul(o)
    }
}

/// The position an ONNX index in `-d..d` names.
fn norm_index(i: i64, d: u64, what: &str) -> R<u64> {
    let (w, n) = (i as i128, d as i128);
    if w < -n || w >= n {
        return Err(format!("index {i} is out of range for {what} of size {d}"));
    }
    Ok((if w < 0 { w + n } else { w }) as u64)
}

/// The values of an index tensor, which must be integers.
fn index_values(c: &Const, what: &str) -> R<Vec<i64>> {
    match &c.data {
        Data::I(v) => Ok(v.clone()),
        Data::F(_) => Err(format!("{what} must be integers, not floats")),
    }
}

/// The value of a one-element integer constant (an axis or a count given
/// as an input).
pub fn int_scalar(c: &Const, what: &str) -> R<i64> {
    if c.len() != 1 || c.shape.len() > 1 {
        return Err(format!("{what} must be a scalar or have one element (it has shape {:?})", c.shape));
    }
    Ok(index_values(c, what)?[0])
}

/// Truth of every element: non-zero (NaN included) is true.
fn truth(c: &Const) -> Vec<bool> {
    match &c.data {
        Data::F(v) => v.iter().map(|&x| x != 0.0).collect(),
        Data::I(v) => v.iter().map(|&x| x != 0).collect(),
    }
}

fn bools(shape: &[u64], v: impl Iterator<Item = bool>) -> Const {
    Const::i64(shape, v.map(i64::from).collect())
}

/// The multi-index of flat position `p` in a tensor of `shape`.
fn coords(mut p: u64, shape: &[u64]) -> Vec<u64> {
    let mut c = vec![0; shape.len()];
    for k in (0..shape.len()).rev() {
        if shape[k] > 0 {
            c[k] = p % shape[k];
            p /= shape[k];
        }
    }
    c
}

/// ONNX Mod with broadcasting. Integers: the result takes the divisor's
/// sign (Python's `%`), or with `fmod` the dividend's (C's `fmod`); a zero
/// divisor is an error. Floats: only `fmod=1` is defined (C's `fmod`).
pub fn modulo(a: &Const, b: &Const, fmod: bool) -> R<Const> {
    let out = shape::broadcast(&a.shape, &b.shape)?;
    shape::fold_limit(&out)?;
    let (ia, ib) = (broadcast_to(a, &out), broadcast_to(b, &out));
    if a.is_float() || b.is_float() {
        if !fmod {
            return Err("fmod=0 on floating-point inputs; ONNX defines only fmod=1 for them".into());
        }
        let (x, y) = (a.floats(), b.floats());
        return Ok(Const::f32(&out, ia.iter().zip(&ib).map(|(&i, &j)| x[i] % y[j]).collect()));
    }
    let (x, y) = (a.ints(), b.ints());
    let mut v = Vec::with_capacity(ia.len());
    for (&i, &j) in ia.iter().zip(&ib) {
        let (p, q) = (x[i], y[j]);
        if q == 0 {
            return Err(format!("integer Mod of {p} by zero"));
        }
        let r = p.wrapping_rem(q);
        v.push(if !fmod && r != 0 && (r < 0) != (q < 0) { r + q } else { r });
    }
    Ok(Const::i64(&out, v))
}

/// And, Or, Xor with broadcasting: non-zero is true, the result is 0/1.
pub fn logical(op: &str, a: &Const, b: &Const) -> R<Const> {
    let f: fn(bool, bool) -> bool = match op {
        "And" => |p, q| p && q,
        "Or" => |p, q| p || q,
        "Xor" => |p, q| p != q,
        _ => return Err(format!("{op} is not a logical op")),
    };
    let out = shape::broadcast(&a.shape, &b.shape)?;
    shape::fold_limit(&out)?;
    let (ia, ib) = (broadcast_to(a, &out), broadcast_to(b, &out));
    let (x, y) = (truth(a), truth(b));
    Ok(bools(&out, ia.iter().zip(&ib).map(|(&i, &j)| f(x[i], y[j]))))
}

/// IsInf: which elements are +inf (when `positive`) or -inf (when
/// `negative`), as 0/1.
pub fn is_inf(c: &Const, negative: bool, positive: bool) -> Const {
    match &c.data {
        Data::F(v) => bools(&c.shape, v.iter().map(|&x| x.is_infinite() && if x > 0.0 { positive } else { negative })),
        Data::I(v) => bools(&c.shape, v.iter().map(|_| false)),
    }
}

/// Flat positions in `data` that the elements of `indices` (same rank)
/// address along `axis`, the other coordinates being their own.
fn along_axis(ds: &[u64], indices: &Const, axis: i64) -> R<Vec<usize>> {
    let is = &indices.shape;
    if ds.is_empty() || ds.len() != is.len() {
        return Err(format!("data {ds:?} and indices {is:?} must have the same rank, at least 1"));
    }
    let a = shape::axis(axis, ds.len(), false)?;
    if let Some(k) = (0..ds.len()).find(|&k| k != a && is[k] > ds[k]) {
        return Err(format!("indices {is:?} are larger than data {ds:?} on axis {k}"));
    }
    shape::fold_limit(is)?;
    let idx = index_values(indices, "indices")?;
    let st = shape::strides(ds);
    let mut base = st.clone();
    base[a] = 0;
    let mut at = shape::box_indices(is, &base, 0);
    for (p, &i) in at.iter_mut().zip(&idx) {
        *p += (norm_index(i, ds[a], &format!("axis {a}"))? * st[a]) as usize;
    }
    Ok(at)
}

/// GatherElements: `out[p] = data[p with p[axis] = indices[p]]`, shaped
/// like the indices; negative indices count from the end.
pub fn gather_elements(data: &Const, indices: &Const, axis: i64) -> R<Const> {
    let at = along_axis(&data.shape, indices, axis)?;
    Ok(pick(data, &at, &indices.shape))
}

/// The `reduction` attribute of ScatterND and ScatterElements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

impl Reduction {
    pub fn parse(s: &str) -> R<Self> {
        Ok(match s {
            "none" => Self::None,
            "add" => Self::Add,
            "mul" => Self::Mul,
            "max" => Self::Max,
            "min" => Self::Min,
            o => return Err(format!("reduction '{o}' is not one of none, add, mul, max, min")),
        })
    }

    fn apply<T: Num>(self, old: T, new: T) -> T {
        match self {
            Self::None => new,
            Self::Add => old.plus(new),
            Self::Mul => old.times(new),
            Self::Max if new > old => new,
            Self::Min if new < old => new,
            Self::Max | Self::Min => old,
        }
    }
}

/// A copy of `data` with `updates[src]` written into (or, per `r`,
/// combined with) flat position `dst`, for each (dst, src) in order, so
/// a later duplicate index wins.
fn scatter(data: &Const, updates: &Const, moves: &[(usize, usize)], r: Reduction) -> R<Const> {
    fn go<T: Num>(d: &[T], u: &[T], moves: &[(usize, usize)], r: Reduction) -> Vec<T> {
        let mut out = d.to_vec();
        for &(dst, src) in moves {
            out[dst] = r.apply(out[dst], u[src]);
        }
        out
    }
    shape::fold_limit(&data.shape)?;
    let v = match (&data.data, &updates.data) {
        (Data::F(d), Data::F(u)) => Data::F(go(d, u, moves, r)),
        (Data::I(d), Data::I(u)) => Data::I(go(d, u, moves, r)),
        _ => return Err("data and updates have different element types".into()),
    };
    Ok(Const { shape: data.shape.clone(), data: v })
}

/// ScatterElements: `out[p with p[axis] = indices[p]] = updates[p]`
/// (combined per `r`), the rest a copy of `data`.
pub fn scatter_elements(data: &Const, indices: &Const, updates: &Const, axis: i64, r: Reduction) -> R<Const> {
    if indices.shape != updates.shape {
        return Err(format!("indices {:?} and updates {:?} must have the same shape", indices.shape, updates.shape));
    }
    let at = along_axis(&data.shape, indices, axis)?;
    let moves: Vec<(usize, usize)> = at.into_iter().enumerate().map(|(s, d)| (d, s)).collect();
    scatter(data, updates, &moves, r)
}

/// ScatterND: each row of the last indices axis (k long) addresses a
/// slice `data[i0, .., ik-1]`, replaced by (or combined per `r` with) the
/// matching slice of `updates`, whose shape must be
/// `indices.shape[..-1] ++ data.shape[k..]`.
pub fn scatter_nd(data: &Const, indices: &Const, updates: &Const, r: Reduction) -> R<Const> {
    let (ds, is) = (&data.shape, &indices.shape);
    let Some((&k, lead)) = is.split_last() else {
        return Err("indices must have rank at least 1".into());
    };
    if ds.is_empty() || k > ds.len() as u64 {
        return Err(format!("indices {is:?} address {k} axes of data {ds:?}"));
    }
    let k = k as usize;
    let want: Vec<u64> = lead.iter().chain(&ds[k..]).copied().collect();
    if updates.shape != want {
        return Err(format!("updates have shape {:?}; indices {is:?} on data {ds:?} need {want:?}", updates.shape));
    }
    shape::fold_limit(&want)?;
    let idx = index_values(indices, "indices")?;
    let st = shape::strides(ds);
    let (rows, slice) = (shape::volume(lead) as usize, shape::volume(&ds[k..]) as usize);
    let mut moves = Vec::with_capacity(rows * slice);
    for t in 0..rows {
        let mut at = 0;
        for j in 0..k {
            at += norm_index(idx[t * k + j], ds[j], &format!("axis {j}"))? * st[j];
        }
        moves.extend((0..slice).map(|e| (at as usize + e, t * slice + e)));
    }
    scatter(data, updates, &moves, r)
}

/// Tile: `repeats` (one non-negative count per axis) copies along each axis.
pub fn tile(c: &Const, repeats: &Const) -> R<Const> {
    let reps = index_values(repeats, "repeats")?;
    let s = &c.shape;
    if reps.len() != s.len() {
        return Err(format!("{} repeats for an input of rank {}", reps.len(), s.len()));
    }
    let mut out = Vec::with_capacity(s.len());
    for (&d, &r) in s.iter().zip(&reps) {
        if r < 0 {
            return Err(format!("repeats {reps:?} has a negative count"));
        }
        out.push(d.checked_mul(r as u64).ok_or_else(|| format!("repeats {reps:?} overflow the shape {s:?}"))?);
    }
    shape::fold_limit(&out)?;
    let st = shape::strides(s);
    let n = shape::volume(&out);
    let mut at = Vec::with_capacity(n as usize);
    let mut idx = vec![0u64; s.len()];
    for _ in 0..n {
        at.push(idx.iter().zip(s).zip(&st).map(|((&i, &d), &w)| (i % d) * w).sum::<u64>() as usize);
        for k in (0..out.len()).rev() {
            idx[k] += 1;
            if idx[k] < out[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    Ok(pick(c, &at, &out))
}

/// CumSum along `axis`; `exclusive` leaves out the element itself,
/// `reverse` sums from the end.
pub fn cumsum(c: &Const, axis: i64, exclusive: bool, reverse: bool) -> R<Const> {
    fn go<T: Num>(v: &[T], outer: usize, n: usize, inner: usize, exclusive: bool, reverse: bool) -> Vec<T> {
        let mut out = vec![T::ZERO; v.len()];
        for o in 0..outer {
            for i in 0..inner {
                let mut acc = T::ZERO;
                for step in 0..n {
                    let k = if reverse { n - 1 - step } else { step };
                    let at = (o * n + k) * inner + i;
                    if exclusive {
                        out[at] = acc;
                        acc = acc.plus(v[at]);
                    } else {
                        acc = acc.plus(v[at]);
                        out[at] = acc;
                    }
                }
            }
        }
        out
    }
    let s = &c.shape;
    if s.is_empty() {
        return Err("the input must have rank at least 1".into());
    }
    let a = shape::axis(axis, s.len(), false)?;
    let (outer, n, inner) = (shape::volume(&s[..a]) as usize, s[a] as usize, shape::volume(&s[a + 1..]) as usize);
    let data = match &c.data {
        Data::F(v) => Data::F(go(v, outer, n, inner, exclusive, reverse)),
        Data::I(v) => Data::I(go(v, outer, n, inner, exclusive, reverse)),
    };
    Ok(Const { shape: s.clone(), data })
}

/// Trilu: keeps the upper (`upper`: column − row ≥ k) or lower (column −
/// row ≤ k) triangle of each matrix in the last two axes, zeroes the rest.
pub fn trilu(c: &Const, k: i64, upper: bool) -> R<Const> {
    let s = &c.shape;
    if s.len() < 2 {
        return Err(format!("the input {s:?} must have rank at least 2"));
    }
    let (rows, cols) = (s[s.len() - 2], s[s.len() - 1]);
    let keep = |p: usize| -> bool {
        let p = p as u64;
        let (i, j) = ((p / cols) % rows, p % cols);
        let d = j as i128 - i as i128;
        if upper {
            d >= k as i128
        } else {
            d <= k as i128
        }
    };
    let data = match &c.data {
        Data::F(v) => Data::F(v.iter().enumerate().map(|(p, &x)| if keep(p) { x } else { 0.0 }).collect()),
        Data::I(v) => Data::I(v.iter().enumerate().map(|(p, &x)| if keep(p) { x } else { 0 }).collect()),
    };
    Ok(Const { shape: s.clone(), data })
}

/// NonZero: the coordinates of the non-zero elements in row-major order,
/// as [rank, count] (a scalar counts as rank 1).
pub fn nonzero(c: &Const) -> Const {
    let s = &c.shape;
    let hits: Vec<u64> = truth(c).iter().enumerate().filter(|(_, &t)| t).map(|(p, _)| p as u64).collect();
    let rank = s.len().max(1);
    let mut v = vec![0i64; rank * hits.len()];
    for (n, &p) in hits.iter().enumerate() {
        for (a, x) in coords(p, s).into_iter().enumerate() {
            v[a * hits.len() + n] = x as i64;
        }
    }
    Const::i64(&[rank as u64, hits.len() as u64], v)
}

/// A float reduction of the elements `x(i)`, element i going to group
/// `group[i]` of `n` elements each, accumulated in f64.
fn reduce_f64(op: &str, x: impl Fn(usize) -> f64, group: &[usize], groups: usize, n: u64) -> R<Vec<f64>> {
    Ok(match op {
        "ReduceMax" | "ReduceMin" => {
            // As onnxruntime: start from the first element, replace on a
            // strict comparison (so a NaN is kept only when it comes first).
            let max = op == "ReduceMax";
            let mut acc: Vec<Option<f64>> = vec![None; groups];
            for (i, &g) in group.iter().enumerate() {
                let b = x(i);
                acc[g] = Some(match acc[g] {
                    Some(a) if !(if max { b > a } else { b < a }) => a,
                    _ => b,
                });
            }
            acc.into_iter().map(|a| a.unwrap_or(if max { f64::NEG_INFINITY } else { f64::INFINITY })).collect()
        }
        "ReduceLogSumExp" => {
            let mut m = vec![f64::NEG_INFINITY; groups];
            for (i, &g) in group.iter().enumerate() {
                m[g] = m[g].max(x(i));
            }
            let mut acc = vec![0.0; groups];
            for (i, &g) in group.iter().enumerate() {
                acc[g] += (x(i) - m[g]).exp();
            }
            acc.iter().zip(&m).map(|(&a, &m)| if m.is_infinite() { m } else { a.ln() + m }).collect()
        }
        _ => {
            let (init, term): (f64, fn(f64, f64) -> f64) = match op {
                "ReduceSum" | "ReduceMean" | "ReduceLogSum" => (0.0, |a, b| a + b),
                "ReduceProd" => (1.0, |a, b| a * b),
                "ReduceL1" => (0.0, |a, b| a + b.abs()),
                "ReduceL2" | "ReduceSumSquare" => (0.0, |a, b| a + b * b),
                _ => return Err(format!("{op} cannot be folded")),
            };
            let mut acc = vec![init; groups];
            for (i, &g) in group.iter().enumerate() {
                acc[g] = term(acc[g], x(i));
            }
            match op {
                // onnxruntime's mean of nothing is 0.
                "ReduceMean" if n == 0 => vec![0.0; groups],
                "ReduceMean" => acc.iter().map(|a| a / n as f64).collect(),
                "ReduceL2" => acc.iter().map(|a| a.sqrt()).collect(),
                "ReduceLogSum" => acc.iter().map(|a| a.ln()).collect(),
                _ => acc,
            }
        }
    })
}

/// The Reduce* ops over `axes` (distinct, in range; no axes reduces every
/// element alone, as `noop_with_empty_axes` does in onnxruntime: x² for
/// SumSquare, |x| for L1 and L2). Floats accumulate in f64. Integers
/// accumulate in i64 (wrapping; the mean truncates), except L2 and
/// LogSum, computed in f64 and truncated, and LogSumExp, which truncates
/// every exp term too, as onnxruntime does. An empty set sums to 0,
/// multiplies to 1 and has max −inf and min +inf; for integers an empty
/// max or min is an error (its value depends on the width).
pub fn reduce(op: &str, c: &Const, axes: &[usize], keepdims: bool) -> R<Const> {
    let s = &c.shape;
    if let Some(&a) = axes.iter().find(|&&a| a >= s.len()) {
        return Err(format!("axis {a} is out of range for rank {}", s.len()));
    }
    let kept: Vec<u64> = s.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect();
    let out: Vec<u64> =
        if keepdims { kept.clone() } else { s.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect() };
    let mut ost = shape::strides(&kept);
    for &a in axes {
        ost[a] = 0;
    }
    let group = shape::box_indices(s, &ost, 0);
    let groups = shape::volume(&kept) as usize;
    let n: u64 = axes.iter().map(|&a| s[a]).product();
    match &c.data {
        Data::F(v) => {
            let r = reduce_f64(op, |i| v[i] as f64, &group, groups, n)?;
            Ok(Const::f32(&out, r.into_iter().map(|r| r as f32).collect()))
        }
        Data::I(v) if op == "ReduceLogSumExp" => {
            let mut m = vec![i64::MIN; groups];
            for (i, &g) in group.iter().enumerate() {
                m[g] = m[g].max(v[i]);
            }
            let mut acc = vec![0i64; groups];
            for (i, &g) in group.iter().enumerate() {
                acc[g] = acc[g].wrapping_add((v[i].wrapping_sub(m[g]) as f64).exp() as i64);
            }
            Ok(Const::i64(&out, acc.iter().zip(&m).map(|(&a, &m)| ((a as f64).ln() as i64).wrapping_add(m)).collect()))
        }
        Data::I(v) if matches!(op, "ReduceL2" | "ReduceLogSum") => {
            let r = reduce_f64(op, |i| v[i] as f64, &group, groups, n)?;
            Ok(Const::i64(&out, r.into_iter().map(|r| r as i64).collect()))
        }
        Data::I(v) => {
            if n == 0 && matches!(op, "ReduceMax" | "ReduceMin") {
                return Err(format!("{op} of an empty set of integers (its value depends on the integer type)"));
            }
            let (init, term): (i64, fn(i64, i64) -> i64) = match op {
                "ReduceSum" | "ReduceMean" => (0, |a, b| a.wrapping_add(b)),
                "ReduceProd" => (1, |a, b| a.wrapping_mul(b)),
                "ReduceMax" => (i64::MIN, |a, b| a.max(b)),
                "ReduceMin" => (i64::MAX, |a, b| a.min(b)),
                "ReduceL1" => (0, |a, b| a.wrapping_add(b.wrapping_abs())),
                "ReduceSumSquare" => (0, |a, b| a.wrapping_add(b.wrapping_mul(b))),
                _ => return Err(format!("{op} cannot be folded")),
            };
            let mut acc = vec![init; groups];
            for (i, &g) in group.iter().enumerate() {
                acc[g] = term(acc[g], v[i]);
            }
            if op == "ReduceMean" {
                let n = n as i64;
                acc.iter_mut().for_each(|a| *a = if n == 0 { 0 } else { a.wrapping_div(n) });
            }
            Ok(Const::i64(&out, acc))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds() {
        let a = Const::i64(&[2], vec![2, 16]);
        let b = Const::i64(&[1], vec![3]);
        assert_eq!(binary("Mul", &a, &b).unwrap(), Const::i64(&[2], vec![6, 48]));
        let x = Const::f32(&[2, 3], vec![0., 1., 2., 3., 4., 5.]);
        assert_eq!(transpose(&x, &[1, 0]).data, Data::F(vec![0., 3., 1., 4., 2., 5.]));
        let c = concat(&[&Const::i64(&[1], vec![2]), &Const::i64(&[2], vec![16, 2])], 0, &[3]);
        assert_eq!(c.data, Data::I(vec![2, 16, 2]));
        assert_eq!(range(&Const::i64(&[], vec![0]), &Const::i64(&[], vec![5]), &Const::i64(&[], vec![2])).unwrap().data, Data::I(vec![0, 2, 4]));
        let w = where_(&Const::i64(&[2], vec![1, 0]), &Const::i64(&[2], vec![7, 7]), &Const::i64(&[], vec![-1])).unwrap();
        assert_eq!(w.data, Data::I(vec![7, -1]));
        assert!(binary("Div", &a, &Const::i64(&[], vec![0])).is_err());
    }

    fn ints(c: &Const) -> Vec<i64> {
        match &c.data {
            Data::I(v) => v.clone(),
            Data::F(v) => panic!("expected integers, got floats {v:?}"),
        }
    }

    fn floats(c: &Const) -> Vec<f32> {
        match &c.data {
            Data::F(v) => v.clone(),
            Data::I(v) => panic!("expected floats, got integers {v:?}"),
        }
    }

    // Expected values below are onnxruntime 1.32's for the same inputs.

    #[test]
    fn mod_sign_rules() {
        let a = Const::i64(&[4], vec![5, -5, 5, -5]);
        let b = Const::i64(&[4], vec![3, 3, -3, -3]);
        assert_eq!(ints(&modulo(&a, &b, false).unwrap()), [2, 1, -1, -2]); // divisor's sign
        assert_eq!(ints(&modulo(&a, &b, true).unwrap()), [2, -2, 2, -2]); // dividend's sign
        let fa = Const::f32(&[4], vec![5.5, -5.5, 5.5, -5.5]);
        let fb = Const::f32(&[4], vec![2.0, 2.0, -2.0, -2.0]);
        assert_eq!(floats(&modulo(&fa, &fb, true).unwrap()), [1.5, -1.5, 1.5, -1.5]);
        assert!(modulo(&fa, &fb, false).unwrap_err().contains("fmod=0"));
        assert!(modulo(&a, &Const::i64(&[], vec![0]), false).unwrap_err().contains("by zero"));
        // Broadcast, and no overflow trap on MIN % -1.
        let m = modulo(&Const::i64(&[2, 1], vec![i64::MIN, 7]), &Const::i64(&[2], vec![-1, 4]), false).unwrap();
        assert_eq!((m.shape.clone(), ints(&m)), (vec![2, 2], vec![0, 0, 0, 3]));
    }

    #[test]
    fn logic_predicates_rounding_and_sign() {
        let a = Const::i64(&[1, 3], vec![1, 0, 1]);
        let b = Const::i64(&[2, 1], vec![1, 0]);
        assert_eq!(ints(&logical("And", &a, &b).unwrap()), [1, 0, 1, 0, 0, 0]);
        assert_eq!(ints(&logical("Or", &a, &b).unwrap()), [1, 1, 1, 1, 0, 1]);
        assert_eq!(ints(&logical("Xor", &a, &b).unwrap()), [0, 1, 0, 1, 0, 1]);
        assert_eq!(ints(&unary("Not", &a).unwrap()), [0, 1, 0]);
        let v = Const::f32(&[6], vec![0.5, 1.5, 2.5, -0.5, -1.5, 2.4999]);
        assert_eq!(floats(&unary("Round", &v).unwrap()), [0.0, 2.0, 2.0, -0.0, -2.0, 2.0]); // half to even
        assert_eq!(floats(&unary("Floor", &v).unwrap()), [0.0, 1.0, 2.0, -1.0, -2.0, 2.0]);
        assert_eq!(floats(&unary("Ceil", &v).unwrap()), [1.0, 2.0, 3.0, -0.0, -1.0, 3.0]);
        let s = floats(&unary("Sign", &Const::f32(&[5], vec![f32::NAN, -0.0, 0.0, -2.0, 3.0])).unwrap());
        assert!(s[0].is_nan());
        assert_eq!(&s[1..], [0.0, 0.0, -1.0, 1.0]);
        assert_eq!(ints(&unary("Sign", &Const::i64(&[3], vec![-7, 0, 9])).unwrap()), [-1, 0, 1]);
        assert_eq!(ints(&unary("Round", &Const::i64(&[2], vec![-7, 9])).unwrap()), [-7, 9]);
        let x = Const::f32(&[4], vec![f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.0]);
        assert_eq!(ints(&unary("IsNaN", &x).unwrap()), [0, 0, 1, 0]);
        assert_eq!(ints(&is_inf(&x, true, true)), [1, 1, 0, 0]);
        assert_eq!(ints(&is_inf(&x, false, true)), [1, 0, 0, 0]);
        assert_eq!(ints(&is_inf(&x, true, false)), [0, 1, 0, 0]);
        // Max and Min propagate NaN.
        let m = floats(&binary("Max", &Const::f32(&[2], vec![f32::NAN, 1.0]), &Const::f32(&[2], vec![1.0, f32::NAN])).unwrap());
        assert!(m.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn gather_and_scatter() {
        let d = Const::f32(&[2, 3], vec![0., 1., 2., 3., 4., 5.]);
        let g = gather_elements(&d, &Const::i64(&[2, 2], vec![-1, 0, 1, -3]), 1).unwrap();
        assert_eq!((g.shape.clone(), floats(&g)), (vec![2, 2], vec![2., 0., 4., 3.]));
        // The indices may be longer than the data on the gathered axis.
        let g = gather_elements(&d, &Const::i64(&[1, 4], vec![0, 1, 2, 0]), 1).unwrap();
        assert_eq!(floats(&g), [0., 1., 2., 0.]);
        assert!(gather_elements(&d, &Const::i64(&[1, 1], vec![3]), 1).unwrap_err().contains("index 3 is out of range"));
        assert!(gather_elements(&d, &Const::i64(&[3, 1], vec![0, 0, 0]), 1).unwrap_err().contains("larger than data"));
        assert!(gather_elements(&d, &Const::f32(&[1, 1], vec![0.0]), 1).unwrap_err().contains("integers"));

        let v = Const::f32(&[4], vec![0., 1., 2., 3.]);
        let nd = |i: Vec<i64>, u: Vec<f32>, r| scatter_nd(&v, &Const::i64(&[i.len() as u64, 1], i), &Const::f32(&[u.len() as u64], u), r);
        assert_eq!(floats(&nd(vec![-1], vec![9.], Reduction::None).unwrap()), [0., 1., 2., 9.]);
        assert_eq!(floats(&nd(vec![1, 1], vec![9., 10.], Reduction::Add).unwrap()), [0., 20., 2., 3.]);
        assert_eq!(floats(&nd(vec![1, 1], vec![9., 10.], Reduction::None).unwrap()), [0., 10., 2., 3.]); // last wins
        assert_eq!(floats(&nd(vec![2, 2], vec![5., 0.5], Reduction::Mul).unwrap()), [0., 1., 5., 3.]);
        assert_eq!(floats(&nd(vec![1, 3], vec![-1., 7.], Reduction::Max).unwrap()), [0., 1., 2., 7.]);
        assert_eq!(floats(&nd(vec![1, 3], vec![-1., 7.], Reduction::Min).unwrap()), [0., -1., 2., 3.]);
        assert!(nd(vec![4], vec![9.], Reduction::None).unwrap_err().contains("index 4 is out of range"));
        // Slices: a [2,4] data indexed by rows.
        let m = Const::i64(&[2, 4], (0..8).collect());
        let r = scatter_nd(&m, &Const::i64(&[1, 1], vec![-2]), &Const::i64(&[1, 4], vec![9, 9, 9, 9]), Reduction::Add).unwrap();
        assert_eq!(ints(&r), [9, 10, 11, 12, 4, 5, 6, 7]);
        assert!(scatter_nd(&m, &Const::i64(&[1, 1], vec![0]), &Const::i64(&[1, 3], vec![0; 3]), Reduction::None)
            .unwrap_err()
            .contains("need [1, 4]"));
        assert!(scatter_nd(&m, &Const::i64(&[1, 3], vec![0; 3]), &Const::i64(&[1], vec![0]), Reduction::None).is_err());
        assert!(scatter_nd(&v, &Const::i64(&[1, 1], vec![0]), &Const::i64(&[1], vec![1]), Reduction::None)
            .unwrap_err()
            .contains("different element types"));

        let z = Const::f32(&[2, 3], vec![0.; 6]);
        let r = scatter_elements(&z, &Const::i64(&[1, 2], vec![-1, 0]), &Const::f32(&[1, 2], vec![5., 6.]), 1, Reduction::Max).unwrap();
        assert_eq!(floats(&r), [6., 0., 5., 0., 0., 0.]);
        let r = scatter_elements(&z, &Const::i64(&[1, 2], vec![1, 0]), &Const::f32(&[1, 2], vec![5., 6.]), 0, Reduction::None).unwrap();
        assert_eq!(floats(&r), [0., 6., 0., 5., 0., 0.]);
        assert!(scatter_elements(&z, &Const::i64(&[1, 2], vec![0, 3]), &Const::f32(&[1, 2], vec![1., 1.]), 1, Reduction::None).is_err());
        assert!(scatter_elements(&z, &Const::i64(&[1, 2], vec![0, 0]), &Const::f32(&[2, 1], vec![1., 1.]), 1, Reduction::None).is_err());
        assert_eq!(Reduction::parse("max").unwrap(), Reduction::Max);
        assert!(Reduction::parse("mean").unwrap_err().contains("'mean'"));
    }

    #[test]
    fn tile_cumsum_trilu_nonzero() {
        let t = tile(&Const::i64(&[1, 2], vec![1, 2]), &Const::i64(&[2], vec![2, 2])).unwrap();
        assert_eq!((t.shape.clone(), ints(&t)), (vec![2, 4], vec![1, 2, 1, 2, 1, 2, 1, 2]));
        assert_eq!(tile(&Const::i64(&[2], vec![1, 2]), &Const::i64(&[1], vec![0])).unwrap().shape, [0]);
        assert!(tile(&Const::i64(&[2], vec![1, 2]), &Const::i64(&[1], vec![-1])).unwrap_err().contains("negative"));
        assert!(tile(&Const::i64(&[2], vec![1, 2]), &Const::i64(&[2], vec![1, 1])).unwrap_err().contains("rank 1"));
        assert!(tile(&Const::i64(&[2], vec![1, 2]), &Const::i64(&[1], vec![1 << 40])).unwrap_err().contains("too large"));

        let x = Const::i64(&[4], vec![1, 2, 3, 4]);
        assert_eq!(ints(&cumsum(&x, 0, false, false).unwrap()), [1, 3, 6, 10]);
        assert_eq!(ints(&cumsum(&x, -1, true, false).unwrap()), [0, 1, 3, 6]);
        assert_eq!(ints(&cumsum(&x, 0, false, true).unwrap()), [10, 9, 7, 4]);
        assert_eq!(ints(&cumsum(&x, 0, true, true).unwrap()), [9, 7, 4, 0]);
        let m = Const::f32(&[2, 2], vec![1., 2., 3., 4.]);
        assert_eq!(floats(&cumsum(&m, 0, false, false).unwrap()), [1., 2., 4., 6.]);
        assert!(cumsum(&x, 1, false, false).unwrap_err().contains("out of range"));

        let a = Const::f32(&[3, 4], (0..12).map(|v| v as f32).collect());
        assert_eq!(floats(&trilu(&a, 1, false).unwrap()), [0., 1., 0., 0., 4., 5., 6., 0., 8., 9., 10., 11.]);
        assert_eq!(floats(&trilu(&a, -1, true).unwrap()), [0., 1., 2., 3., 4., 5., 6., 7., 0., 9., 10., 11.]);
        assert_eq!(floats(&trilu(&a, 0, true).unwrap()), [0., 1., 2., 3., 0., 5., 6., 7., 0., 0., 10., 11.]);
        assert_eq!(floats(&trilu(&a, i64::MIN, false).unwrap()), [0.; 12]);
        assert!(trilu(&Const::f32(&[3], vec![1.; 3]), 0, true).unwrap_err().contains("rank at least 2"));

        let n = nonzero(&Const::i64(&[2, 3], vec![1, 0, 3, 0, 0, 2]));
        assert_eq!((n.shape.clone(), ints(&n)), (vec![2, 3], vec![0, 0, 1, 0, 2, 2]));
        assert_eq!(ints(&nonzero(&Const::f32(&[3], vec![0.0, f32::NAN, -1.0]))), [1, 2]);
        let n = nonzero(&Const::i64(&[], vec![3]));
        assert_eq!((n.shape.clone(), ints(&n)), (vec![1, 1], vec![0]));
        assert_eq!(nonzero(&Const::i64(&[], vec![0])).shape, [1, 0]);
    }

    #[test]
    fn reductions() {
        let p = Const::i64(&[2, 2], vec![1, 2, 3, 4]);
        let r = reduce("ReduceProd", &p, &[1], true).unwrap();
        assert_eq!((r.shape.clone(), ints(&r)), (vec![2, 1], vec![2, 12]));
        assert_eq!(ints(&reduce("ReduceProd", &p, &[0, 1], false).unwrap()), [24]);
        assert_eq!(reduce("ReduceProd", &p, &[0, 1], false).unwrap().shape, Vec::<u64>::new());
        assert_eq!(ints(&reduce("ReduceMean", &Const::i64(&[2], vec![-1, -2]), &[0], false).unwrap()), [-1]); // truncates
        assert_eq!(ints(&reduce("ReduceL2", &Const::i64(&[4], vec![1, 2, 2, 1]), &[0], false).unwrap()), [3]);
        assert_eq!(ints(&reduce("ReduceLogSumExp", &Const::i64(&[4], vec![3, 3, 3, 1]), &[0], false).unwrap()), [4]);
        assert_eq!(ints(&reduce("ReduceSumSquare", &p, &[], true).unwrap()), [1, 4, 9, 16]); // each alone
        let f = Const::f32(&[2, 2], vec![1., -2., 3., 4.]);
        assert_eq!(floats(&reduce("ReduceL1", &f, &[0], false).unwrap()), [4., 6.]);
        assert_eq!(floats(&reduce("ReduceSumSquare", &f, &[1], false).unwrap()), [5., 25.]);
        assert_eq!(floats(&reduce("ReduceL2", &f, &[1], false).unwrap()), [5f32.sqrt(), 5.]);
        assert_eq!(floats(&reduce("ReduceMin", &f, &[0, 1], false).unwrap()), [-2.]);
        let lse = floats(&reduce("ReduceLogSumExp", &Const::f32(&[2], vec![1000., 1000.]), &[0], false).unwrap());
        assert!((lse[0] - 1000.6931).abs() < 1e-3, "{lse:?}");
        assert!((floats(&reduce("ReduceLogSum", &f, &[1], false).unwrap())[1] - 7f32.ln()).abs() < 1e-6);
        // Empty sets.
        let e = Const::f32(&[0, 3], vec![]);
        assert_eq!(floats(&reduce("ReduceMax", &e, &[0], false).unwrap()), [f32::NEG_INFINITY; 3]);
        assert_eq!(floats(&reduce("ReduceProd", &e, &[0], false).unwrap()), [1.; 3]);
        assert_eq!(floats(&reduce("ReduceMean", &e, &[0], false).unwrap()), [0.; 3]);
        assert!(reduce("ReduceMax", &Const::i64(&[0], vec![]), &[0], false).unwrap_err().contains("empty"));
        // NaN: kept only when first (onnxruntime's order).
        let r = |op, v: Vec<f32>| floats(&reduce(op, &Const::f32(&[3], v), &[0], false).unwrap())[0];
        assert_eq!(r("ReduceMax", vec![1., f32::NAN, 3.]), 3.);
        assert!(r("ReduceMin", vec![f32::NAN, 1., 3.]).is_nan());
        assert!(reduce("ReduceMedian", &p, &[0], false).is_err());
        assert!(reduce("ReduceSum", &p, &[2], false).unwrap_err().contains("out of range"));
    }

    #[test]
    fn casts_wrap_to_the_target_width() {
        let f = Const::f32(&[4], vec![0.5, 0.0, -2.0, 300.7]);
        assert_eq!(ints(&cast(&f, crate::onnx::elem::BOOL).unwrap()), [1, 0, 1, 1]);
        assert_eq!(ints(&cast(&f, crate::onnx::elem::UINT8).unwrap()), [0, 0, 254, 44]);
        assert_eq!(ints(&cast(&f, crate::onnx::elem::INT8).unwrap()), [0, 0, -2, 44]);
        let i = Const::i64(&[3], vec![(1 << 31) + 5, -1, 65537]);
        assert_eq!(ints(&cast(&i, crate::onnx::elem::INT32).unwrap()), [-2147483643, -1, 65537]);
        assert_eq!(ints(&cast(&i, crate::onnx::elem::UINT16).unwrap()), [5, 65535, 1]);
        assert_eq!(floats(&cast(&i, crate::onnx::elem::DOUBLE).unwrap()), [2147483653.0, -1.0, 65537.0]);
        assert!(cast(&i, 8).unwrap_err().contains("string"));
    }
}
