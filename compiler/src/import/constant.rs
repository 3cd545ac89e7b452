//! Ops computed at compile time: constants, shapes, and the shape and mask
//! arithmetic exporters emit (Range, Trilu, NonZero, … on constants). Every input they read must be a constant; the
//! values come from `fold`.

use super::*;

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &[
    "Constant", "Shape", "Size", "ConstantOfShape", "Range", "Trilu", "NonZero",
];

impl Importer {
    pub(super) fn lower_constant(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let input = |i: usize| -> Result<ValueId> {
            ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")))
        };
        let opt = |i: usize| ins.get(i).copied().flatten();
        let op = cx.n.op_type.as_str();
        let v = match op {
            "Constant" => {
                let c = if let Some(t) = cx.attr("value").and_then(|a| a.t.as_ref()) {
                    onnx::tensor_const(t, &Self::out_name(cx, 0))?
                } else if let Some(a) = cx.attr("value_float") {
                    Const::f32(&[], vec![a.f])
                } else if let Some(a) = cx.attr("value_floats") {
                    Const::f32(&[a.floats.len() as u64], a.floats.clone())
                } else if let Some(a) = cx.attr("value_int") {
                    Const::i64(&[], vec![a.i])
                } else if let Some(a) = cx.attr("value_ints") {
                    Const::i64(&[a.ints.len() as u64], a.ints.clone())
                } else {
                    return Err(cx.err("no supported value attribute (value, value_float(s), value_int(s))"));
                };
                let v = self.constant(&Self::out_name(cx, 0), c);
                if let Some(t) = cx.attr("value").and_then(|a| a.t.as_ref()) {
                    self.g.values[v].dtype = super::quant::const_dtype(t.data_type);
                }
                v
            }
            "Shape" => {
                let s = self.shape(input(0)?);
                let r = s.len() as i64;
                let norm = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                let (a, b) = (norm(cx.int("start", 0)), norm(cx.int("end", r)));
                let dims: Vec<i64> = s[a..b.max(a)].iter().map(|&d| d as i64).collect();
                self.constant(&Self::out_name(cx, 0), Const::i64(&[dims.len() as u64], dims))
            }
            "Size" => {
                let n = volume(&self.shape(input(0)?)) as i64;
                self.constant(&Self::out_name(cx, 0), Const::i64(&[], vec![n]))
            }
            "ConstantOfShape" => {
                let dims = self.const_ints(cx, input(0)?, 0)?;
                let shape: Vec<u64> = dims.iter().map(|&d| d.max(0) as u64).collect();
                let n = volume(&shape);
                if n > 1 << 26 {
                    return Err(cx.err(format!("{n} elements is too large a constant")));
                }
                let fill = match cx.attr("value").and_then(|a| a.t.as_ref()) {
                    Some(t) => onnx::tensor_const(t, &cx.name)?,
                    None => Const::f32(&[1], vec![0.0]),
                };
                let c = match fill.data {
                    Data::F(v) => Const::f32(&shape, vec![v.first().copied().unwrap_or(0.0); n as usize]),
                    Data::I(v) => Const::i64(&shape, vec![v.first().copied().unwrap_or(0); n as usize]),
                };
                self.constant(&Self::out_name(cx, 0), c)
            }
            "Range" => {
                let (s, l, d) = (self.need_const(cx, input(0)?, 0)?, self.need_const(cx, input(1)?, 1)?, self.need_const(cx, input(2)?, 2)?);
                let c = cx.shape(fold::range(&s, &l, &d))?;
                self.constant(&Self::out_name(cx, 0), c)
            }
            "Trilu" => {
                let x = self.need_const(cx, input(0)?, 0)?;
                let k = match opt(1) {
                    Some(v) => cx.shape(fold::int_scalar(&self.need_const(cx, v, 1)?, "k (input 1)"))?,
                    None => 0,
                };
                let c = cx.shape(fold::trilu(&x, k, cx.int("upper", 1) != 0))?;
                self.constant(&Self::out_name(cx, 0), c)
            }
            "NonZero" => {
                let x = self.need_const(cx, input(0)?, 0)?;
                self.constant(&Self::out_name(cx, 0), fold::nonzero(&x))
            }
            _ => return Err(cx.err(format!("internal error: '{op}' is not a constant op"))),
        };
        Ok(vec![v])
    }


}
