//! QuantizeLinear and DequantizeLinear: 8-bit integer tensors.
//!
//! At run time an int8 value is a u8 or i8 tensor; QuantizeLinear and
//! DequantizeLinear on one become QUANT ops (float islands around ops
//! without an integer form). On constants they fold: a quantised weight
//! dequantises to an f32 constant at compile time. Every dequantised value
//! records where it came from ([`QInfo`]), which is what the int8 lowering
//! ([`crate::int8`]) needs to run `DequantizeLinear → Conv/MatMul/Gemm →
//! QuantizeLinear` as one integer op.
//!
//! Scales are f32 (finite, > 0), one per tensor or one per index of
//! `axis`; zero points are u8/i8 (and 0 for an int32 DequantizeLinear, the
//! form quantised biases take). Blocked quantisation (opset 21
//! `block_size`) and 4- and 16-bit and float8 types are refused.

use rbln_format::DType;

use super::{Cx, Importer};
use crate::error::Result;
use crate::ir::{Const, Data, Kind, QInfo, ValueId};
use crate::onnx::{elem, AttributeProto, NodeProto};
use crate::shape::volume;

pub(super) const OPS: &[&str] = &["QuantizeLinear", "DequantizeLinear"];

/// The dtype a constant of ONNX element type `t` keeps in the graph: the
/// 8-bit types are remembered (a zero point's type is the quantised
/// type); everything else reads as f32 or i64 data.
pub(super) fn const_dtype(t: i32) -> DType {
    match t {
        elem::INT8 => DType::I8,
        elem::UINT8 => DType::U8,
        elem::INT32 => DType::I32,
        _ => DType::F32,
    }
}

/// The representable range of an integer type.
pub(crate) fn range(t: DType) -> (i64, i64) {
    match t {
        DType::U8 => (0, 255),
        DType::I8 => (-128, 127),
        _ => (i32::MIN as i64, i32::MAX as i64),
    }
}

/// ONNX QuantizeLinear on one value: `x / scale`, rounded half to even,
/// plus the zero point, saturated (NaN gives the zero point).
pub(crate) fn quantize_one(x: f32, scale: f32, zero: i64, t: DType) -> i64 {
    let (lo, hi) = range(t);
    let q = (x / scale).round_ties_even();
    if q.is_nan() {
        return zero.clamp(lo, hi);
    }
    (q as i64).saturating_add(zero).clamp(lo, hi)
}

impl Importer {
    pub(super) fn lower_quant(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let quantize = cx.n.op_type == "QuantizeLinear";
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let sv = ins.get(1).copied().flatten().ok_or_else(|| cx.err("the scale (input 1) is missing"))?;
        let zv = ins.get(2).copied().flatten();
        if cx.int("block_size", 0) != 0 {
            return Err(cx.err("blocked quantization (block_size) is not supported"));
        }
        let scale_c = self.need_const(cx, sv, 1)?;
        let scale = scale_c.floats();
        if scale.is_empty() || scale_c.shape.len() > 1 {
            return Err(cx.err(format!("the scale has shape {:?}; a scalar or a 1-D tensor per channel is supported", scale_c.shape)));
        }
        if let Some(bad) = scale.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(cx.err(format!("scale {bad} is not a finite positive number")));
        }
        let zero_c = match zv {
            Some(z) => Some(self.need_const(cx, z, 2)?),
            None => None,
        };
        let zero: Vec<i64> = match &zero_c {
            Some(z) => z.ints(),
            None => vec![0; scale.len()],
        };
        if zero.len() != scale.len() {
            return Err(cx.err(format!("{} zero points for {} scales", zero.len(), scale.len())));
        }
        // The quantised type: the zero point's, else the input's (for
        // DequantizeLinear), else QuantizeLinear's `output_dtype` or u8.
        let x_dtype = self.g.values[x].dtype;
        let qtype = match zv.map(|z| self.g.values[z].dtype) {
            Some(t @ (DType::U8 | DType::I8 | DType::I32)) => t,
            Some(_) => return Err(cx.err("the zero point is not uint8, int8 or int32 (4-, 16-bit and float8 types are not supported)")),
            None if !quantize => x_dtype,
            None => match cx.int("output_dtype", 0) {
                0 => DType::U8,
                t if const_dtype(t as i32) == DType::U8 || const_dtype(t as i32) == DType::I8 => const_dtype(t as i32),
                t => return Err(cx.err(format!("output_dtype {} is not supported (uint8 and int8 are)", elem::name(t as i32)))),
            },
        };
        if quantize && qtype == DType::I32 || !matches!(qtype, DType::U8 | DType::I8 | DType::I32) {
            return Err(cx.err(format!("quantized type {} is not supported (uint8 and int8 are; int32 for dequantized biases)", qtype.name())));
        }
        if !quantize && x_dtype != qtype && self.konst(x).is_none() {
            return Err(cx.err(format!("the input is {} but the zero point is {}", x_dtype.name(), qtype.name())));
        }
        let (lo, hi) = range(qtype);
        if let Some(z) = zero.iter().find(|z| !(lo..=hi).contains(*z)) {
            return Err(cx.err(format!("zero point {z} is outside the range of {}", qtype.name())));
        }
        if qtype == DType::I32 && zero.iter().any(|&z| z != 0) {
            return Err(cx.err("an int32 DequantizeLinear must have zero point 0"));
        }
        let shape = self.shape(x);
        // A 1-D scale of one entry is per-tensor in effect.
        let axis = if scale.len() > 1 {
            let r = shape.len() as i64;
            let a = cx.int("axis", 1);
            let a = if a < 0 { a + r } else { a };
            if !(0..r).contains(&a) || shape[a as usize] != scale.len() as u64 {
                return Err(cx.err(format!("{} scales do not match axis {} of the input's shape {shape:?}", scale.len(), cx.int("axis", 1))));
            }
            Some(a as usize)
        } else {
            None
        };
        let (outer, channels, inner) = match axis {
            Some(a) => (volume(&shape[..a]), shape[a], volume(&shape[a + 1..])),
            None => (1, 1, volume(&shape)),
        };
        let channel_of = |i: usize| if axis.is_some() { (i / inner as usize) % channels as usize } else { 0 };

        if let Some(c) = self.konst(x).cloned() {
            let out = if quantize {
                let v: Vec<i64> = c.floats().iter().enumerate().map(|(i, &f)| quantize_one(f, scale[channel_of(i)], zero[channel_of(i)], qtype)).collect();
                let id = self.constant(&Self::out_name(cx, 0), Const { shape: shape.clone(), data: Data::I(v) });
                self.g.values[id].dtype = qtype;
                id
            } else {
                let (lo, hi) = range(qtype);
                let ints = c.ints();
                if let Some(q) = ints.iter().find(|q| !(lo..=hi).contains(*q)) {
                    return Err(cx.err(format!("constant input value {q} is outside the range of {}", qtype.name())));
                }
                let v: Vec<f32> = ints.iter().enumerate().map(|(i, &q)| ((q - zero[channel_of(i)]) as f32) * scale[channel_of(i)]).collect();
                let id = self.constant(&Self::out_name(cx, 0), Const::f32(&shape, v));
                self.g.dequantized.insert(id, QInfo { q: x, qtype, scale: scale.clone(), zero: zero.clone(), axis });
                id
            };
            return Ok(vec![out]);
        }
        if qtype == DType::I32 {
            return Err(cx.err("an int32 DequantizeLinear is supported on constants (quantized biases) only"));
        }
        let (s, z) = self.quant_params(cx, &scale, &zero);
        let kind = Kind::Quant { x, dequantize: !quantize, qtype, outer, channels, inner, scale: s, zero: z };
        let out = self.device(cx, kind, shape);
        if !quantize {
            self.g.dequantized.insert(out, QInfo { q: x, qtype, scale, zero, axis });
        }
        Ok(vec![out])
    }

    /// The scale (f32) and zero-point (i32) constants of a QUANT op.
    fn quant_params(&mut self, cx: &Cx, scale: &[f32], zero: &[i64]) -> (ValueId, ValueId) {
        let n = scale.len() as u64;
        let s = self.constant(&format!("{}.scale", cx.name), Const::f32(&[n], scale.to_vec()));
        let z = self.constant(&format!("{}.zero", cx.name), Const::i64(&[n], zero.to_vec()));
        self.g.values[z].dtype = DType::I32;
        (s, z)
    }

    /// Scale 1 and zero point 0 (QUANT's operands) for converting `x`.
    fn unit_params(&mut self, x: ValueId) -> (ValueId, ValueId) {
        let name = self.g.values[x].name.clone();
        let s = self.constant(&format!("{name}.unit_scale"), Const::f32(&[1], vec![1.0]));
        let z = self.constant(&format!("{name}.zero"), Const::i64(&[1], vec![0]));
        self.g.values[z].dtype = DType::I32;
        (s, z)
    }

    /// `x` (f32 holding integers of `qtype`'s range) back to `qtype`: a
    /// quantise with scale 1 and zero point 0, exact.
    pub(super) fn f32_to_int8(&mut self, cx: &Cx, x: ValueId, qtype: DType) -> ValueId {
        let (scale, zero) = self.unit_params(x);
        let kind = Kind::Quant { x, dequantize: false, qtype, outer: 1, channels: 1, inner: self.g.values[x].elems(), scale, zero };
        let shape = self.shape(x);
        self.device_tmp(cx, kind, shape, qtype.name())
    }

    /// A dequantise with scale 1 and zero point 0: the exact conversion of
    /// a u8 / i8 value to f32.
    pub(super) fn int8_to_f32(&mut self, x: ValueId, qtype: DType) -> Kind {
        let (s, z) = self.unit_params(x);
        Kind::Quant { x, dequantize: true, qtype, outer: 1, channels: 1, inner: self.g.values[x].elems(), scale: s, zero: z }
    }
}

/// The QOperator forms (onnxruntime's `QuantFormat.QOperator`): one node
/// that stands for DequantizeLinear on its quantised inputs, the float op
/// and QuantizeLinear on its result. QLinearAdd and
/// QLinearGlobalAveragePool are onnxruntime's contrib ops (domain
/// `com.microsoft`).
pub(super) const QOPERATOR_OPS: &[&str] =
    &["QLinearConv", "QLinearMatMul", "QGemm", "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QLinearSoftmax", "QLinearConcat"];

/// Ops of the `com.microsoft` domain rbln-compile reads.
pub(super) const CONTRIB_OPS: &[&str] = &["QGemm", "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QLinearSoftmax", "QLinearConcat"];

/// Ops that move or select elements without arithmetic: on a u8 / i8
/// value they compute in f32 on the exact conversion and convert back
/// (exactly: the values are integers in range), so the result keeps the
/// 8-bit type.
pub(super) const INT8_PASSTHROUGH: &[&str] = &["MaxPool", "Transpose", "Gather", "Slice", "Concat", "Split"];

impl Importer {
    /// A QOperator node, expanded into its QDQ form (which the int8
    /// lowering then runs as one integer op where it can).
    pub(super) fn lower_qoperator(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let at = |i: usize| ins.get(i).copied().flatten();
        let need = |i: usize| at(i).ok_or_else(|| cx.err(format!("input {i} is missing")));
        let out = Self::out_name(cx, 0);
        // One step of the expansion: the node `op` named after this one.
        let step = |im: &mut Importer, op: &str, tag: &str, ins: &[Option<ValueId>], attribute: Vec<AttributeProto>| -> Result<ValueId> {
            let n = NodeProto { op_type: op.into(), name: format!("{}.{tag}", cx.name), output: vec![format!("{out}.{tag}")], attribute, ..Default::default() };
            let sub = Cx { n: &n, name: n.name.clone() };
            im.lower(&sub, ins)?.first().copied().ok_or_else(|| cx.err(format!("its {op} step produced nothing")))
        };
        let axis = |a: i64| vec![AttributeProto { name: "axis".into(), i: a, r#type: 2, ..Default::default() }];
        let y = match cx.n.op_type.as_str() {
            "QLinearConv" => {
                let (x, xs, w, ws) = (need(0)?, need(1)?, need(3)?, need(4)?);
                let xd = step(self, "DequantizeLinear", "x", &[Some(x), Some(xs), at(2)], vec![])?;
                let wd = step(self, "DequantizeLinear", "w", &[Some(w), Some(ws), at(5)], axis(0))?;
                // The int32 bias is at scale x_scale·w_scale (per channel).
                let bd = match at(8) {
                    Some(b) => {
                        let sx = self.need_const(cx, xs, 1)?.floats();
                        let sw = self.need_const(cx, ws, 4)?.floats();
                        let s: Vec<f32> = sw.iter().map(|&w| w * sx.first().copied().unwrap_or(1.0)).collect();
                        let sv = self.constant(&format!("{}.bias_scale", cx.name), Const::f32(&[s.len() as u64], s));
                        Some(step(self, "DequantizeLinear", "b", &[Some(b), Some(sv)], axis(0))?)
                    }
                    None => None,
                };
                let c = step(self, "Conv", "conv", &[Some(xd), Some(wd), bd], cx.n.attribute.clone())?;
                step(self, "QuantizeLinear", "y", &[Some(c), need(6).ok(), at(7)], vec![])?
            }
            "QLinearMatMul" => {
                let ad = step(self, "DequantizeLinear", "a", &[Some(need(0)?), Some(need(1)?), at(2)], vec![])?;
                // Per-column B scales run along B's last axis.
                let bd = step(self, "DequantizeLinear", "b", &[Some(need(3)?), Some(need(4)?), at(5)], axis(-1))?;
                let c = step(self, "MatMul", "matmul", &[Some(ad), Some(bd)], vec![])?;
                step(self, "QuantizeLinear", "y", &[Some(c), need(6).ok(), at(7)], vec![])?
            }
            "QGemm" => {
                // A, a_scale, a_zero, B, b_scale, b_zero, C (int32 at
                // scale a·b), y_scale, y_zero; without y_scale the
                // output is f32.
                let trans_b = cx.int("transB", 0) != 0;
                let (bs, a_s) = (need(4)?, need(1)?);
                let ad = step(self, "DequantizeLinear", "a", &[Some(need(0)?), Some(a_s), at(2)], vec![])?;
                let bd = step(self, "DequantizeLinear", "b", &[Some(need(3)?), Some(bs), at(5)], axis(if trans_b { 0 } else { 1 }))?;
                let cd = match at(6) {
                    Some(c) => {
                        let sa = self.need_const(cx, a_s, 1)?.floats();
                        let sb = self.need_const(cx, bs, 4)?.floats();
                        let s: Vec<f32> = sb.iter().map(|&b| b * sa.first().copied().unwrap_or(1.0)).collect();
                        let sv = self.constant(&format!("{}.bias_scale", cx.name), Const::f32(&[s.len() as u64], s));
                        Some(step(self, "DequantizeLinear", "c", &[Some(c), Some(sv)], axis(0))?)
                    }
                    None => None,
                };
                let attrs = cx.n.attribute.iter().filter(|a| a.name != "domain").cloned().collect();
                let g = step(self, "Gemm", "gemm", &[Some(ad), Some(bd), cd], attrs)?;
                match at(7) {
                    Some(ys) => step(self, "QuantizeLinear", "y", &[Some(g), Some(ys), at(8)], vec![])?,
                    None => g,
                }
            }
            "QLinearAdd" | "QLinearMul" => {
                let ad = step(self, "DequantizeLinear", "a", &[Some(need(0)?), Some(need(1)?), at(2)], vec![])?;
                let bd = step(self, "DequantizeLinear", "b", &[Some(need(3)?), Some(need(4)?), at(5)], vec![])?;
                let op = if cx.n.op_type == "QLinearAdd" { "Add" } else { "Mul" };
                let c = step(self, op, "op", &[Some(ad), Some(bd)], vec![])?;
                step(self, "QuantizeLinear", "y", &[Some(c), need(6).ok(), at(7)], vec![])?
            }
            "QLinearSoftmax" => {
                // onnxruntime's contrib op: X, x_scale, x_zero, y_scale,
                // y_zero; `axis` with the semantics of Softmax at `opset`.
                let xd = step(self, "DequantizeLinear", "x", &[Some(need(0)?), Some(need(1)?), at(2)], vec![])?;
                let attrs = cx.n.attribute.iter().filter(|a| a.name == "axis").cloned().collect();
                if cx.int("opset", 13) < 13 {
                    return Err(cx.err("QLinearSoftmax with the opset < 13 (coerced 2-D) semantics is not supported"));
                }
                let p = step(self, "Softmax", "softmax", &[Some(xd)], attrs)?;
                step(self, "QuantizeLinear", "y", &[Some(p), need(3).ok(), at(4)], vec![])?
            }
            "QLinearConcat" => {
                // Y_scale, Y_zero, then (X, x_scale, x_zero) per input.
                if ins.len() < 5 || !(ins.len() - 2).is_multiple_of(3) {
                    return Err(cx.err(format!("{} inputs; QLinearConcat takes Y_scale, Y_zero_point and triples (X, X_scale, X_zero_point)", ins.len())));
                }
                let mut parts = Vec::new();
                for (t, i) in (2..ins.len()).step_by(3).enumerate() {
                    parts.push(Some(step(self, "DequantizeLinear", &format!("x{t}"), &[Some(need(i)?), Some(need(i + 1)?), at(i + 2)], vec![])?));
                }
                let attrs = cx.n.attribute.iter().filter(|a| a.name == "axis").cloned().collect();
                let c = step(self, "Concat", "concat", &parts, attrs)?;
                step(self, "QuantizeLinear", "y", &[Some(c), need(0).ok(), at(1)], vec![])?
            }
            _ => {
                if cx.int("channels_last", 0) != 0 {
                    return Err(cx.err("channels_last = 1 is not supported"));
                }
                let xd = step(self, "DequantizeLinear", "x", &[Some(need(0)?), Some(need(1)?), at(2)], vec![])?;
                let p = step(self, "GlobalAveragePool", "pool", &[Some(xd)], vec![])?;
                step(self, "QuantizeLinear", "y", &[Some(p), need(3).ok(), at(4)], vec![])?
            }
        };
        Ok(vec![y])
    }
}
