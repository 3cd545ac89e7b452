//! int8 lowering of quantised (QDQ) models.
//!
//! onnxruntime's `quantize_static` and other QDQ exporters write every
//! quantised Conv, MatMul and Gemm as `DequantizeLinear(x) →
//! op(·, DequantizeLinear(W), DequantizeLinear(bias)) → QuantizeLinear`.
//! After import that is a QUANT (dequantise) op, an f32 Conv/GEMM whose
//! weights are dequantised constants, and a QUANT (quantise) op. This pass
//! turns such a Conv or GEMM into one QCONV / QGEMM op: the u8/i8 input
//! as it is, the integer weights packed once for the cores, int32
//! accumulation, the bias as int32 at scale `sx·sw[j]`, and the
//! requantisation `sx·sw[j]/sy` fused (a fused ReLU becomes the clamp at
//! the output zero point). Without a QuantizeLinear after it the op
//! dequantises its own result (an f32 output feeding a float island).
//!
//! An element-wise Add or Mul (with its fused ReLU) of two per-tensor
//! dequantised values of one shape whose only reader is a QuantizeLinear
//! becomes one QBINARY op, bit for bit the float island it replaces (the
//! residual adds of ResNets and MobileNets).
//!
//! A MaxPool between a per-tensor DequantizeLinear and a QuantizeLinear of
//! the same type, scale and zero point pools the bytes themselves (max
//! commutes with the dequantisation, and the requantisation gives each
//! maximum back exactly): ResNets' stem pool, in QDQ models and in
//! QOperator ones (whose 8-bit MaxPool is imported through unit-scale
//! conversions).
//!
//! Everything else stays as imported: the float ops between QUANT ops are
//! the float islands, exact to the quantised values they read.

use rbln_format::DType;
use rbln_hw::ops::{pack_qgemm_b, qgemm_packed_b_len, Binary, Unary};

use crate::import::quant::range;
use crate::ir::{Act, Const, Data, Graph, Kind, QInfo, QOut, QParam, ValueId};

/// What the lowering did (for the compile report).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Int8Stats {
    pub conv: usize,
    pub gemm: usize,
    /// Of those, the ones whose output stays int8 (a QuantizeLinear
    /// consumed).
    pub int8_out: usize,
    /// Element-wise Add / Mul on int8 values (QBINARY).
    pub eltwise: usize,
    /// Of the convolutions, those whose weights are in channel quads.
    pub conv_quads: usize,
    /// Of the convolutions, those whose weights are in the tile layout.
    pub conv_tiles: usize,
    /// MaxPools on int8 values.
    pub max_pool: usize,
}

/// Lowers every eligible Conv and GEMM, then drops what no one reads.
pub fn run(g: &mut Graph) -> Int8Stats {
    let mut st = Int8Stats::default();
    while let Some((conv, int8_out)) = lower_one(g) {
        if conv {
            st.conv += 1;
        } else {
            st.gemm += 1;
        }
        st.int8_out += int8_out as usize;
    }
    st.conv_quads = g.ops.iter().filter(|o| matches!(o.kind, Kind::QConv { quads: true, .. })).count();
    st.conv_tiles = g.ops.iter().filter(|o| matches!(o.kind, Kind::QConv { tiles: true, .. })).count();
    let mut i = 0;
    while i < g.ops.len() {
        st.eltwise += lower_binary(g, i) as usize;
        st.max_pool += lower_max_pool(g, i) as usize;
        i += 1;
    }
    st
}

/// The per-tensor QuantizeLinear that is the only reader of `v`:
/// (its op index, output parameters).
fn requantizer(g: &Graph, v: ValueId) -> Option<(usize, QParam)> {
    let r = sole_reader(g, v)?;
    match &g.ops[r].kind {
        Kind::Quant { dequantize: false, qtype, channels: 1, scale, zero, .. } => {
            let scale = g.konst(*scale)?.floats()[0];
            let zero = g.konst(*zero)?.ints()[0] as i32;
            Some((r, QParam { dtype: *qtype, scale, zero }))
        }
        _ => None,
    }
}

/// Lowers op `i` to QBINARY if it is an Add / Mul (ReLU or no activation)
/// of two same-shaped dequantised values followed by a QuantizeLinear.
fn lower_binary(g: &mut Graph, i: usize) -> bool {
    let Kind::Binary { kind, a, b, a_dims, b_dims, act } = g.ops[i].kind.clone() else { return false };
    if !matches!(kind, Binary::Add | Binary::Mul) || a_dims != b_dims || !(act == Act::NONE || act.kind == Unary::Relu) {
        return false;
    }
    let (Some((qa, ta, sa, za)), Some((qb, tb, sb, zb))) = (dequantized_input(g, a), dequantized_input(g, b)) else { return false };
    let Some((r, out_q)) = requantizer(g, g.ops[i].out) else { return false };
    let count = g.values[g.ops[i].out].elems();
    if g.values[qa].elems() != count || g.values[qb].elems() != count {
        return false;
    }
    let label = format!("int8:{}+QuantizeLinear", g.ops[i].op);
    g.ops[i].kind = Kind::QBinary {
        kind,
        a: qa,
        a_q: QParam { dtype: ta, scale: sa, zero: za },
        b: qb,
        b_q: QParam { dtype: tb, scale: sb, zero: zb },
        out_q,
        relu: act.kind == Unary::Relu,
        count,
    };
    g.ops[i].op = label;
    g.ops[i].out = g.ops[r].out;
    g.ops.remove(r);
    true
}

/// Lowers op `i` to an 8-bit MaxPool if it is a MaxPool of a per-tensor
/// dequantised value whose sole reader quantises with the same type,
/// scale and zero point. (For a normal scale `s` with `256·s` finite,
/// `round((q − z)·s / s) = q − z` exactly, so the composite returns the
/// largest byte of each window.)
fn lower_max_pool(g: &mut Graph, i: usize) -> bool {
    let Kind::Pool { x, max: true, int8: None, .. } = g.ops[i].kind else { return false };
    let Some((q, qtype, scale, zero)) = dequantized_input(g, x).or_else(|| dequantized_by_op(g, x)) else { return false };
    let Some((r, out_q)) = requantizer(g, g.ops[i].out) else { return false };
    if out_q.dtype != qtype || out_q.scale.to_bits() != scale.to_bits() || out_q.zero != zero || !scale.is_normal() || !(scale * 256.0).is_finite() {
        return false;
    }
    if let Kind::Pool { x, int8, .. } = &mut g.ops[i].kind {
        *x = q;
        *int8 = Some(qtype == DType::I8);
    }
    g.ops[i].op = format!("int8:{}", g.ops[i].op);
    g.ops[i].out = g.ops[r].out;
    g.ops.remove(r);
    true
}

/// The input of a per-tensor QUANT op dequantising `v` with constant
/// parameters: (q, type, scale, zero). (The exact conversion of an 8-bit
/// value that an element-moving op such as a QOperator model's MaxPool
/// computes through, scale 1 and zero point 0.)
fn dequantized_by_op(g: &Graph, v: ValueId) -> Option<(ValueId, DType, f32, i32)> {
    let op = g.ops.iter().find(|o| o.out == v)?;
    let Kind::Quant { x, dequantize: true, qtype, channels: 1, scale, zero, .. } = &op.kind else { return None };
    if !matches!(qtype, DType::U8 | DType::I8) {
        return None;
    }
    let (s, z) = (g.konst(*scale)?.floats(), g.konst(*zero)?.ints());
    Some((*x, *qtype, *s.first()?, *z.first()? as i32))
}

/// The quantised input of a per-tensor dequantise, seen through views
/// (which keep the bytes): (q, type, scale, zero).
fn dequantized_input(g: &Graph, mut v: ValueId) -> Option<(ValueId, DType, f32, i32)> {
    while !g.dequantized.contains_key(&v) {
        match g.ops.iter().find(|o| o.out == v).map(|o| &o.kind) {
            Some(Kind::View { x }) => v = *x,
            _ => return None,
        }
    }
    let QInfo { q, qtype, scale, zero, axis: None } = g.dequantized.get(&v)? else { return None };
    if g.konst(v).is_some() || !matches!(qtype, DType::U8 | DType::I8) {
        return None;
    }
    Some((*q, *qtype, scale[0], zero[0] as i32))
}

/// Integer weights of a dequantised constant `w` whose per-channel axis
/// (if any) is `col_axis`: (values, scales per column, B's i8 offset
/// and zero points per column) for `cols` columns.
struct QWeights {
    q: Vec<i64>,
    scale: Vec<f32>,
    zero: Vec<i64>,
}

fn weights(g: &Graph, w: ValueId, col_axis: usize, cols: usize) -> Option<QWeights> {
    let info = g.dequantized.get(&w)?;
    let c = g.konst(info.q)?;
    if !matches!(info.qtype, DType::U8 | DType::I8) || info.axis.is_some_and(|a| a != col_axis) {
        return None;
    }
    let per = |v: &[f32]| if v.len() == 1 { vec![v[0]; cols] } else { v.to_vec() };
    let (scale, zero) = (per(&info.scale), if info.zero.len() == 1 { vec![info.zero[0]; cols] } else { info.zero.clone() });
    if scale.len() != cols || zero.len() != cols {
        return None;
    }
    // u8 weights move to i8 (values and zero points by −128; the
    // differences q − zero the arithmetic uses are unchanged).
    let shift = if info.qtype == DType::U8 { -128 } else { 0 };
    let q: Vec<i64> = c.ints().iter().map(|&x| x + shift).collect();
    if q.is_empty() || !q.len().is_multiple_of(cols) {
        return None;
    }
    Some(QWeights { q, scale, zero: zero.iter().map(|&z| z + shift).collect() })
}

/// The op reading `v`, if exactly one does and `v` is not a model output.
fn sole_reader(g: &Graph, v: ValueId) -> Option<usize> {
    if g.outputs.iter().any(|(_, o)| *o == v) {
        return None;
    }
    let mut readers = g.ops.iter().enumerate().filter(|(_, o)| o.kind.inputs().contains(&v)).map(|(i, _)| i);
    let first = readers.next()?;
    readers.next().is_none().then_some(first)
}

/// Finds and lowers one Conv / GEMM; returns (was a conv, int8 output).
fn lower_one(g: &mut Graph) -> Option<(bool, bool)> {
    for i in 0..g.ops.len() {
        if let Some(r) = try_lower(g, i) {
            return Some(r);
        }
    }
    None
}

fn try_lower(g: &mut Graph, i: usize) -> Option<(bool, bool)> {
    let op = g.ops[i].clone();
    let (x, w, bias, act, cols, conv) = match &op.kind {
        Kind::Conv { x, w, bias, residual: None, act, dims, .. } => (*x, *w, *bias, *act, dims[4] as usize, true),
        Kind::Gemm { a, b, bias, residual: None, act, trans_a: false, b_packed: false, batch, strides, m, n, k, .. } => {
            // Several matrices of A against one B are one taller A.
            if *batch > 1 && (strides[0] != m * k || strides[1] != 0 || strides[2] != m * n) {
                return None;
            }
            (*a, *b, *bias, *act, *n as usize, false)
        }
        _ => return None,
    };
    // ReLU, and Clip (ReLU6) when the output is int8: both are clamps in
    // the output's integer domain.
    if !(act == Act::NONE || act.kind == Unary::Relu || act.kind == Unary::Clip) {
        return None;
    }
    let (xq, x_type, sx, zx) = dequantized_input(g, x)?;
    let col_axis = match &op.kind {
        Kind::Gemm { trans_b: true, .. } | Kind::Conv { .. } => 0,
        _ => 1,
    };
    let qw = weights(g, w, col_axis, cols)?;
    // The bias in int32 at scale sx·sw[j] (exact when it was quantised
    // that way, as quantize_static does).
    let bias_q: Option<Vec<i64>> = match bias {
        None => None,
        Some(b) => {
            let c = g.konst(b)?.floats();
            if c.len() != cols {
                return None;
            }
            Some(c.iter().zip(&qw.scale).map(|(&v, &s)| ((v as f64 / (sx as f64 * s as f64)).round_ties_even() as i64).clamp(i32::MIN as i64, i32::MAX as i64)).collect())
        }
    };
    // A per-tensor QuantizeLinear as the only reader makes the output int8.
    let requant = requantizer(g, op.out).map(|(r, q)| (r, q.dtype, q.scale, q.zero));
    let relu = act.kind == Unary::Relu;
    if act.kind == Unary::Clip && requant.is_none() {
        return None;
    }
    let (out, out_value, scales, reader) = match requant {
        Some((r, qtype, sy, zy)) => {
            let (lo, hi) = range(qtype);
            let (mut min, mut max) = (lo, hi);
            if relu {
                min = (zy as i64).max(lo);
            }
            if act.kind == Unary::Clip {
                // clamp(y, p0, p1) then quantise = quantise then clamp to
                // the quantised bounds (quantisation is monotonic).
                min = crate::import::quant::quantize_one(act.p0, sy, zy as i64, qtype).max(lo);
                max = crate::import::quant::quantize_one(act.p1, sy, zy as i64, qtype).min(hi);
            }
            let out = QOut { dtype: qtype, zero: zy, min: min as i32, max: max as i32, relu: false };
            let scales: Vec<f32> = qw.scale.iter().map(|&s| ((sx as f64 * s as f64) / sy as f64) as f32).collect();
            (out, g.ops[r].out, scales, Some(r))
        }
        None => {
            let out = QOut { dtype: DType::F32, zero: 0, min: 0, max: 0, relu };
            (out, op.out, qw.scale.iter().map(|&s| ((sx as f64) * (s as f64)) as f32).collect(), None)
        }
    };
    let name = g.values[w].name.clone();
    let konst = |g: &mut Graph, tag: &str, c: Const, dtype: DType| {
        let v = g.add_value(&format!("{name}.{tag}"), c.shape.clone(), Some(c));
        g.values[v].dtype = dtype;
        v
    };
    let n = cols as u64;
    let b_zero = qw.zero.iter().any(|&z| z != 0).then(|| konst(g, "zero_q", Const::i64(&[n], qw.zero.clone()), DType::I32));
    let bias_v = bias_q.map(|b| konst(g, "bias_q", Const::i64(&[n], b), DType::I32));
    let scale_v = konst(g, "requant_scale", Const::f32(&[n], scales), DType::F32);
    let i8s: Vec<i8> = qw.q.iter().map(|&v| v as i8).collect();
    let kind = match op.kind {
        Kind::Conv { dims, stride, dilation, pads, .. } => {
            let groups = dims[7].max(1) as usize;
            let (ng, kg) = (cols / groups, i8s.len() / cols);
            let (cin_g, kh, kw) = (dims[1] as usize / groups, dims[5] as usize, dims[6] as usize);
            // Windows over whole channel quads take the quad order: the
            // device then reads the input's 4 channels of a tap side by
            // side instead of building im2col rows (docs/hardware.md,
            // QCONV). Not for 1×1 (the two orders coincide) nor for
            // channel counts it would pad (a depthwise conv's 1 → 4).
            let quads = kh * kw > 1 && cin_g.is_multiple_of(4) && cin_g * kh * kw == kg;
            // The tile layout (blocks of 16 output channels, each tap's
            // channel quads in rows of 16 quads) where the rows are whole
            // (a multiple of 64 input channels, or a 1×1 reduction of a
            // multiple of 64): the device multiplies those tiles on a
            // matrix unit (docs/hardware.md, QCONV). With a partial row per
            // tap (the stem's 37 quads, MobileNet's 24 or 36) it measured
            // no faster.
            let taps = if quads { kh * kw } else { 1 };
            let qn = kg.div_ceil(4) / taps;
            let tiles = kg.is_multiple_of(4) && qn > 0 && qn.is_multiple_of(rbln_hw::ops::QTILE_GROUPS);
            let per = if tiles { rbln_hw::ops::qconv_tiled_len(kg as u64, ng as u64)? } else { qgemm_packed_b_len(kg as u64, ng as u64)? } as usize;
            let mut packed = vec![0i8; per * groups];
            let mut reordered = vec![0i8; if quads { ng * kg } else { 0 }];
            for (gi, dst) in packed.chunks_exact_mut(per).enumerate() {
                // W is [c_out, k]: group gi's B is its rows, transposed.
                let mut rows = &i8s[gi * ng * kg..(gi + 1) * ng * kg];
                if quads {
                    let zero: Vec<i8> = qw.zero[gi * ng..(gi + 1) * ng].iter().map(|&z| z as i8).collect();
                    rbln_hw::ops::qconv_quad_order(rows, ng, cin_g, kh, kw, &zero, &mut reordered);
                    rows = &reordered;
                }
                if tiles {
                    rbln_hw::ops::pack_qconv_tiles(rows, kg, ng, taps, dst);
                } else {
                    pack_qgemm_b(rows, kg, ng, true, dst);
                }
            }
            let len = packed.len() as u64;
            let wv = konst(g, "packed_q", Const { shape: vec![len], data: Data::I(packed.iter().map(|&v| v as i64).collect()) }, DType::I8);
            Kind::QConv { quads, tiles, x: xq, x_type, x_zero: zx, w: wv, w_zero: b_zero, bias: bias_v, scale: scale_v, dims, stride, dilation, pads, out }
        }
        Kind::Gemm { m, n, k, batch, trans_b, .. } => {
            if i8s.len() as u64 != k * n {
                return None;
            }
            let per = qgemm_packed_b_len(k, n)? as usize;
            let mut packed = vec![0i8; per];
            pack_qgemm_b(&i8s, k as usize, n as usize, trans_b, &mut packed);
            let len = packed.len() as u64;
            let wv = konst(g, "packed_q", Const { shape: vec![len], data: Data::I(packed.iter().map(|&v| v as i64).collect()) }, DType::I8);
            Kind::QGemm { a: xq, a_type: x_type, a_zero: zx, b: wv, b_zero, bias: bias_v, scale: scale_v, m: m * batch.max(1), n, k, out }
        }
        _ => return None,
    };
    let label = match reader {
        Some(_) => format!("{}+QuantizeLinear", g.ops[i].op),
        None => g.ops[i].op.clone(),
    };
    g.ops[i].kind = kind;
    g.ops[i].op = format!("int8:{label}");
    g.ops[i].out = out_value;
    if let Some(r) = reader {
        g.ops.remove(r);
    }
    Some((conv, requant.is_some()))
}
