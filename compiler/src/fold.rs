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

/// Element-wise unary op, or None when it is left to the device.
pub fn unary(op: &str, c: &Const) -> Option<Const> {
    if let Data::I(v) = &c.data {
        let v = match op {
            "Neg" => v.iter().map(|x| x.wrapping_neg()).collect(),
            "Abs" => v.iter().map(|x| x.wrapping_abs()).collect(),
            "Not" => v.iter().map(|&x| (x == 0) as i64).collect(),
            "Identity" => v.clone(),
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
        "Relu" => |x| x.max(0.0),
        "Sigmoid" => |x| 1.0 / (1.0 + (-x).exp()),
        "Tanh" => f32::tanh,
        "Floor" => f32::floor,
        "Ceil" => f32::ceil,
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
    let mut f = Vec::new();
    let mut i = Vec::new();
    for o in 0..outer {
        for p in parts {
            let chunk = (p.shape[axis] * inner) as usize;
            let at = o as usize * chunk;
            if float {
                f.extend_from_slice(&p.floats()[at..at + chunk]);
            } else {
                i.extend_from_slice(&p.ints()[at..at + chunk]);
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

/// Cast to an ONNX element type: floats stay f32, integers become i64.
pub fn cast(c: &Const, to_float: bool) -> Const {
    if to_float {
        Const::f32(&c.shape, c.floats())
    } else {
        // Float -> int truncates toward zero, as ONNX Cast does.
        Const::i64(&c.shape, c.ints())
    }
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
        let n = (l - s + d - d.signum()).checked_div(d).unwrap_or(0).max(0) as u64;
        if n > 1 << 24 {
            return Err(format!("Range of {n} elements"));
        }
        Ok(Const::i64(&[n], (0..n as i64).map(|i| s + i * d).collect()))
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
}
