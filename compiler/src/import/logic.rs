//! Comparisons, logic and select (Equal, Less, Greater, LessOrEqual,
//! GreaterOrEqual, Not, And, Or, Xor, Where): folded when every input is a
//! constant, on the device otherwise. At run time booleans are f32 0/1
//! (what the BINARY comparison kinds write, and what a bool input becomes
//! through its CAST): Not is `x == 0`, And a product, Or a maximum, Xor
//! `|a − b|`, and Where one WHERE descriptor. IsNaN is `(x == x) == 0`
//! (a comparison with NaN is false), IsInf `|x| == inf` (or `x == ±inf`
//! for one sign).

use super::*;

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &[
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Where", "IsNaN", "IsInf",
];

impl Importer {
    pub(super) fn lower_logic(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let input = |i: usize| -> Result<ValueId> {
            ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")))
        };
        let op = cx.n.op_type.as_str();
        let arity = match op {
            "Not" | "IsNaN" | "IsInf" => 1,
            "Where" => 3,
            _ => 2,
        };
        let xs = (0..arity).map(input).collect::<Result<Vec<_>>>()?;
        if xs.iter().all(|&x| self.konst(x).is_some()) {
            let k: Vec<Const> = xs.iter().map(|&x| self.konst(x).cloned().unwrap_or_else(|| Const::f32(&[], vec![0.0]))).collect();
            let c = match op {
                "Not" | "IsNaN" => fold::unary(op, &k[0]).ok_or_else(|| cx.err("cannot fold"))?,
                "IsInf" => fold::is_inf(&k[0], cx.int("detect_negative", 1) != 0, cx.int("detect_positive", 1) != 0),
                "And" | "Or" | "Xor" => cx.shape(fold::logical(op, &k[0], &k[1]))?,
                "Where" => cx.shape(fold::where_(&k[0], &k[1], &k[2]))?,
                _ => cx.shape(fold::binary(op, &k[0], &k[1]))?,
            };
            return Ok(vec![self.constant(&Self::out_name(cx, 0), c)]);
        }
        let v = match op {
            "Equal" => self.elementwise(cx, Binary::Equal, xs[0], xs[1], None)?,
            "Less" => self.elementwise(cx, Binary::Less, xs[0], xs[1], None)?,
            "Greater" => self.elementwise(cx, Binary::Greater, xs[0], xs[1], None)?,
            "LessOrEqual" => self.elementwise(cx, Binary::LessOrEqual, xs[0], xs[1], None)?,
            "GreaterOrEqual" => self.elementwise(cx, Binary::GreaterOrEqual, xs[0], xs[1], None)?,
            "Not" => {
                let zero = self.scalar(cx, "zero", 0.0);
                self.elementwise(cx, Binary::Equal, xs[0], zero, None)?
            }
            "IsNaN" => {
                let same = self.elementwise(cx, Binary::Equal, xs[0], xs[0], Some("self_equal"))?;
                let zero = self.scalar(cx, "zero", 0.0);
                self.elementwise(cx, Binary::Equal, same, zero, None)?
            }
            "IsInf" => {
                let (neg, pos) = (cx.int("detect_negative", 1) != 0, cx.int("detect_positive", 1) != 0);
                match (neg, pos) {
                    (true, true) => {
                        let s = self.shape(xs[0]);
                        let a = self.device_tmp(cx, Kind::Unary { kind: Unary::Abs, x: xs[0], p0: 0.0, p1: 0.0 }, s, "abs");
                        let inf = self.scalar(cx, "inf", f32::INFINITY);
                        self.elementwise(cx, Binary::Equal, a, inf, None)?
                    }
                    (false, false) => {
                        // Neither sign: all false (nothing equals NaN).
                        let nan = self.scalar(cx, "nan", f32::NAN);
                        self.elementwise(cx, Binary::Equal, xs[0], nan, None)?
                    }
                    (n, _) => {
                        let inf = self.scalar(cx, "inf", if n { f32::NEG_INFINITY } else { f32::INFINITY });
                        self.elementwise(cx, Binary::Equal, xs[0], inf, None)?
                    }
                }
            }
            "And" => self.elementwise(cx, Binary::Mul, xs[0], xs[1], None)?,
            "Or" => self.elementwise(cx, Binary::Max, xs[0], xs[1], None)?,
            "Xor" => {
                let d = self.elementwise(cx, Binary::Sub, xs[0], xs[1], Some("difference"))?;
                self.unary(cx, Unary::Abs, d, 0.0, 0.0)?
            }
            "Where" => self.where_select(cx, xs[0], xs[1], xs[2], None)?,
            _ => return Err(cx.err(format!("internal error: '{op}' is not a logic op"))),
        };
        Ok(vec![v])
    }

    /// `cond ≠ 0 ? a : b`; `tag` names an intermediate (None: the output).
    pub(super) fn where_select(&mut self, cx: &Cx, cond: ValueId, a: ValueId, b: ValueId, tag: Option<&str>) -> Result<ValueId> {
        let (sc, sa, sb) = (self.shape(cond), self.shape(a), self.shape(b));
        let out = cx.shape(shape::broadcast(&cx.shape(shape::broadcast(&sc, &sa))?, &sb))?;
        rank_ok(cx, &out, "the result")?;
        let r = out.len();
        let kind = Kind::Where {
            cond,
            a,
            b,
            cond_dims: shape::pad_rank(&sc, r),
            a_dims: shape::pad_rank(&sa, r),
            b_dims: shape::pad_rank(&sb, r),
        };
        Ok(self.result(cx, tag, kind, out))
    }
}
