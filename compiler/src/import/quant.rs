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
use crate::onnx::elem;
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

    /// A dequantise with scale 1 and zero point 0: the exact conversion of
    /// a u8 / i8 value to f32.
    pub(super) fn int8_to_f32(&mut self, x: ValueId, qtype: DType) -> Kind {
        let name = self.g.values[x].name.clone();
        let s = self.constant(&format!("{name}.unit_scale"), Const::f32(&[1], vec![1.0]));
        let z = self.constant(&format!("{name}.zero"), Const::i64(&[1], vec![0]));
        self.g.values[z].dtype = DType::I32;
        Kind::Quant { x, dequantize: true, qtype, outer: 1, channels: 1, inner: self.g.values[x].elems(), scale: s, zero: z }
    }
}
