//! ONNX graph -> compiler graph: resolves static shapes, folds what is
//! known at compile time and lowers every other node to device ops.
//!
//! Run-time values are f32 tensors, except model inputs and outputs of
//! integer or bool type, run-time Gather indices and Cast results; an op
//! that computes in f32 reads such a value through an inserted Cast.
//!
//! This module holds what every op shares (the node walk, constants,
//! casts, the family dispatch); each op family lives in its own module
//! with its import, shape rule and lowering.

use std::collections::HashMap;

use rbln_format::DType;
use rbln_hw::ops::{
    Binary, Unary, MAX_RANK, REDUCE_ARGMAX, REDUCE_ARGMAX_LAST, REDUCE_ARGMIN, REDUCE_ARGMIN_LAST, REDUCE_MAX, REDUCE_MEAN,
    REDUCE_MIN, REDUCE_SUM, RESIZE_CEIL, RESIZE_FLOOR, RESIZE_ROUND_PREFER_CEIL, GRID_CUBIC, GRID_LINEAR, GRID_NEAREST,
    GRID_PAD_BORDER, GRID_PAD_REFLECTION, GRID_PAD_ZEROS, TOPK_MAX_LEN,
    RESIZE_ROUND_PREFER_FLOOR,
};

use crate::error::{CompileError, Result};
use crate::fold;
use crate::ir::{Act, Const, CopyPart, Data, Graph, Kind, Op, Sampling, ValueId};
use crate::onnx::{self, elem, AttributeProto, ModelProto, NodeProto, ValueInfoProto};
use crate::shape::{self, strides, volume};

mod constant;
mod conv;
mod elementwise;
mod gather;
mod layout;
mod logic;
mod matmul;
mod norm;
mod pool;
pub(crate) mod quant;
mod recurrent;
mod resize;
mod triton;

/// Lowers the nodes of one op family.
type Lower = fn(&mut Importer, &Cx, &[Option<ValueId>]) -> Result<Vec<ValueId>>;

/// Every op family: the ONNX op types it takes and its lowering. An op
/// type belongs to exactly one family (checked by a test).
const FAMILIES: [(&[&str], Lower); 13] = [
    (constant::OPS, Importer::lower_constant),
    (layout::OPS, Importer::lower_layout),
    (elementwise::OPS, Importer::lower_elementwise),
    (matmul::OPS, Importer::lower_matmul),
    (conv::OPS, Importer::lower_conv),
    (pool::OPS, Importer::lower_pool),
    (norm::OPS, Importer::lower_norm),
    (gather::OPS, Importer::lower_gather),
    (resize::OPS, Importer::lower_resize),
    (recurrent::OPS, Importer::lower_recurrent),
    (logic::OPS, Importer::lower_logic),
    (quant::OPS, Importer::lower_quant),
    (quant::QOPERATOR_OPS, Importer::lower_qoperator),
];

/// Options that change how a model is read.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Static shapes for inputs (overriding or completing the file's).
    pub input_shapes: Vec<(String, Vec<u64>)>,
    /// Intermediate tensors (by ONNX name) to make outputs too, after the
    /// model's own: what a calibration run reads (rbln-quantize).
    pub extra_outputs: Vec<String>,
    /// Keep element-wise ops as separate device ops instead of fusing
    /// their chains into ELTWISE programs ([`crate::eltwise`]): to look
    /// at a chain op by op, and for tests of the other rewrites.
    pub unfused_elementwise: bool,
}

/// Oldest default-domain opset the importer knows the semantics of.
pub const MIN_OPSET: i64 = 7;
/// Newest default-domain opset the importer was written against.
pub const MAX_OPSET: i64 = 22;

/// The ONNX op types rbln-compile handles (folded or on the device).
pub const SUPPORTED_OPS: &[&str] = &[
    "Abs", "Add", "And", "ArgMax", "ArgMin", "AveragePool", "BatchNormalization", "Cast", "Ceil", "Celu", "Clip", "Concat", "Constant", "ConstantOfShape",
    "Conv", "ConvTranspose", "CumSum", "DepthToSpace", "DequantizeLinear", "Div", "Dropout", "Einsum", "Elu", "Equal", "Erf", "Exp", "Expand", "Flatten", "Floor", "Gather", "GatherElements",
    "Gelu", "Gemm", "GlobalAveragePool", "GlobalMaxPool", "Greater", "GridSample", "GreaterOrEqual", "GroupNormalization", "GRU", "Hardmax", "HardSigmoid", "HardSwish",
    "Identity", "InstanceNormalization", "IsInf", "IsNaN", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "LogSoftmax", "LSTM", "MatMul", "Max",
    "MaxPool", "Mean", "Min", "Mish", "Mod", "Mul", "Neg", "NonZero", "Not", "OneHot", "Or", "Pad", "Pow", "PRelu", "QGemm", "QLinearAdd", "QLinearConcat", "QLinearConv", "QLinearGlobalAveragePool", "QLinearMatMul", "QLinearMul", "QLinearSoftmax", "QuantizeLinear", "Range", "Reciprocal",
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd",
    "ReduceSum", "ReduceSumSquare", "Relu", "Reshape", "Resize", "RNN", "Round", "ScatterElements", "ScatterND", "Shape", "Sigmoid", "Sign", "Sin", "Cos",
    "Selu", "Size", "Slice", "Softmax", "Softplus", "Softsign", "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh", "ThresholdedRelu", "Tile", "TopK", "Transpose", "Trilu", "Unsqueeze", "Upsample",
    "Where", "Xor",
];

/// Ops computed only at compile time: every input they read must be a
/// constant (the Reduce* ops without a device form are here; the other
/// Reduce* ops fold on constants and run on the device otherwise).
pub const COMPILE_TIME_OPS: &[&str] = &[
    "ConstantOfShape", "NonZero", "Range", "ReduceLogSumExp", "ReduceProd", "Trilu",
];

/// The ONNX node being lowered.
struct Cx<'a> {
    n: &'a NodeProto,
    name: String,
}

impl Cx<'_> {
    fn err(&self, reason: impl Into<String>) -> CompileError {
        CompileError::Unsupported { node: self.name.clone(), op: self.n.op_type.clone(), reason: reason.into() }
    }
    fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.n.attribute.iter().find(|a| a.name == name)
    }
    fn int(&self, name: &str, default: i64) -> i64 {
        self.attr(name).map_or(default, |a| a.i)
    }
    fn float(&self, name: &str, default: f32) -> f32 {
        self.attr(name).map_or(default, |a| a.f)
    }
    fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.attr(name).map(|a| a.ints.clone())
    }
    fn string(&self, name: &str) -> Option<String> {
        self.attr(name).map(|a| String::from_utf8_lossy(&a.s).into_owned())
    }
    fn shape<T>(&self, r: std::result::Result<T, String>) -> Result<T> {
        r.map_err(|e| self.err(e))
    }
}

struct Importer {
    g: Graph,
    names: HashMap<String, ValueId>,
    /// Outputs of nodes that the importer does not produce, with why.
    missing: HashMap<String, String>,
    opset: i64,
    /// Run-time integer values converted to f32, by source value.
    as_f32: HashMap<ValueId, ValueId>,
}

/// Import a decoded ONNX model.
pub fn import(m: &ModelProto, opts: &Options) -> Result<Graph> {
    let graph = m.graph.as_ref().ok_or_else(|| CompileError::Invalid("the model has no graph".into()))?;
    let opset = m
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .ok_or_else(|| CompileError::Invalid("the model imports no default-domain (ai.onnx) opset".into()))?;
    if !(MIN_OPSET..=MAX_OPSET).contains(&opset) {
        return Err(CompileError::Invalid(format!(
            "opset {opset} is not supported (rbln-compile reads opsets {MIN_OPSET} to {MAX_OPSET})"
        )));
    }
    if !graph.sparse_initializer.is_empty() {
        return Err(CompileError::Invalid("sparse initializers are not supported".into()));
    }
    let mut im = Importer { g: Graph::default(), names: HashMap::new(), missing: HashMap::new(), opset, as_f32: HashMap::new() };
    for t in &graph.initializer {
        let c = onnx::tensor_const(t, &t.name)?;
        let id = im.g.add_value(&t.name, c.shape.clone(), Some(c));
        im.g.values[id].dtype = quant::const_dtype(t.data_type);
        im.names.insert(t.name.clone(), id);
    }
    for (name, _) in &opts.input_shapes {
        if !graph.input.iter().any(|i| &i.name == name && !im.names.contains_key(name)) {
            let all: Vec<&str> =
                graph.input.iter().filter(|i| !im.names.contains_key(&i.name)).map(|i| i.name.as_str()).collect();
            return Err(CompileError::BadInputShape(format!("'{name}' is not an input of the model (inputs: {})", all.join(", "))));
        }
    }
    for vi in &graph.input {
        if im.names.contains_key(&vi.name) {
            continue; // an initializer listed as an input (IR < 4): a constant
        }
        let given = opts.input_shapes.iter().find(|(n, _)| n == &vi.name).map(|(_, s)| s.as_slice());
        let (shape, dtype) = input_shape(vi, given)?;
        if shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).is_none_or(|n| n > shape::MAX_ELEMS) {
            return Err(CompileError::Invalid(format!("input '{}' of shape {shape:?} is too large (limit {} elements)", vi.name, shape::MAX_ELEMS)));
        }
        let id = im.g.add_value(&vi.name, shape, None);
        im.g.values[id].dtype = dtype;
        im.names.insert(vi.name.clone(), id);
        im.g.inputs.push((vi.name.clone(), id));
    }
    if im.g.inputs.is_empty() {
        return Err(CompileError::Invalid("the model has no run-time inputs".into()));
    }
    for (i, n) in graph.node.iter().enumerate() {
        im.node(n, i)?;
    }
    for vi in &graph.output {
        let id = im.lookup(&vi.name, "the graph output")?;
        if im.g.konst(id).is_some() {
            return Err(CompileError::Invalid(format!(
                "output '{}' is a constant (it does not depend on any input); nothing to run",
                vi.name
            )));
        }
        if let Some(tt) = vi.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()) {
            let have = im.g.values[id].dtype;
            if tt.elem_type != 0 && run_time_dtype(tt.elem_type) != Some(have) {
                return Err(CompileError::Invalid(format!(
                    "output '{}' is {} in the model but computed as {} (outputs are float32, int32, int64, bool, int8 or uint8)",
                    vi.name,
                    elem::name(tt.elem_type),
                    have.name()
                )));
            }
            if let Some(s) = &tt.shape {
                let got = &im.g.values[id].shape;
                let agrees = s.dim.len() == got.len()
                    && s.dim.iter().zip(got).all(|(d, &g)| d.dim_value.is_none_or(|v| v <= 0 || v as u64 == g));
                if !agrees {
                    let want: Vec<String> =
                        s.dim.iter().map(|d| d.dim_value.map_or_else(|| d.dim_param.clone().unwrap_or("?".into()), |v| v.to_string())).collect();
                    return Err(CompileError::Invalid(format!(
                        "output '{}': shape inference gives {got:?} but the model declares [{}]",
                        vi.name,
                        want.join(", ")
                    )));
                }
            }
        }
        im.g.outputs.push((vi.name.clone(), id));
    }
    for name in &opts.extra_outputs {
        let id = im.lookup(name, "--extra-output")?;
        if im.g.konst(id).is_some() {
            return Err(CompileError::Invalid(format!("extra output '{name}' is a constant")));
        }
        if im.g.values[id].dtype != DType::F32 {
            return Err(CompileError::Invalid(format!("extra output '{name}' is {}; extra outputs are float32", im.g.values[id].dtype.name())));
        }
        if !im.g.outputs.iter().any(|(n, _)| n == name) {
            im.g.outputs.push((name.clone(), id));
        }
    }
    Ok(im.g)
}

/// The run-time dtype of an ONNX element type, if the NPU has it.
fn run_time_dtype(t: i32) -> Option<DType> {
    match t {
        elem::FLOAT => Some(DType::F32),
        elem::INT32 => Some(DType::I32),
        elem::INT64 => Some(DType::I64),
        elem::BOOL => Some(DType::Bool),
        elem::INT8 => Some(DType::I8),
        elem::UINT8 => Some(DType::U8),
        _ => None,
    }
}

/// Static shape and dtype of a graph input from the file and `--input-shape`.
fn input_shape(vi: &ValueInfoProto, given: Option<&[u64]>) -> Result<(Vec<u64>, DType)> {
    let tt = vi.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()).ok_or_else(|| {
        CompileError::Invalid(format!("input '{}' is not a tensor (sequences, maps and optionals are not supported)", vi.name))
    })?;
    let dtype = run_time_dtype(tt.elem_type).ok_or_else(|| {
        CompileError::Invalid(format!(
            "input '{}' is {}; model inputs are float32, int32, int64, bool, int8 or uint8 (convert it outside the model)",
            vi.name,
            elem::name(tt.elem_type)
        ))
    })?;
    let dims = tt.shape.as_ref().map(|s| s.dim.as_slice());
    if let Some(g) = given {
        if let Some(d) = dims {
            if d.len() != g.len() {
                return Err(CompileError::BadInputShape(format!("{}: the model's input has rank {}, {} dims given", vi.name, d.len(), g.len())));
            }
            for (axis, (dim, &v)) in d.iter().zip(g).enumerate() {
                if let Some(fixed) = dim.dim_value.filter(|&x| x > 0) {
                    if fixed as u64 != v {
                        return Err(CompileError::BadInputShape(format!("{}: axis {axis} is fixed to {fixed} in the model, {v} given", vi.name)));
                    }
                }
            }
        }
        if g.contains(&0) {
            return Err(CompileError::BadInputShape(format!("{}: dimensions must be positive", vi.name)));
        }
        if g.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).is_none_or(|n| n > shape::MAX_ELEMS) {
            return Err(CompileError::BadInputShape(format!("{}: {g:?} is too large (limit {} elements)", vi.name, shape::MAX_ELEMS)));
        }
        return Ok((g.to_vec(), dtype));
    }
    let d = dims.ok_or_else(|| CompileError::DynamicShape { input: vi.name.clone(), dim: "<unknown rank>".into(), axis: 0 })?;
    let shape = d
        .iter()
        .enumerate()
        .map(|(axis, dim)| match dim.dim_value {
            Some(v) if v > 0 => Ok(v as u64),
            _ => Err(CompileError::DynamicShape { input: vi.name.clone(), dim: dim.dim_param.clone().unwrap_or_else(|| "?".into()), axis }),
        })
        .collect::<Result<Vec<u64>>>()?;
    Ok((shape, dtype))
}

fn rank_ok(cx: &Cx, shape: &[u64], what: &str) -> Result<()> {
    if shape.len() > MAX_RANK {
        return Err(cx.err(format!("{what} has rank {}; the device handles up to {MAX_RANK}", shape.len())));
    }
    Ok(())
}

impl Importer {
    fn lookup(&self, name: &str, who: &str) -> Result<ValueId> {
        if let Some(&v) = self.names.get(name) {
            return Ok(v);
        }
        Err(match self.missing.get(name) {
            Some(why) => CompileError::Invalid(format!("{who} reads '{name}', {why}")),
            None => CompileError::Invalid(format!(
                "{who} reads '{name}', which no earlier node, input or initializer defines (nodes must be in topological order)"
            )),
        })
    }

    fn shape(&self, v: ValueId) -> Vec<u64> {
        self.g.values[v].shape.clone()
    }

    fn konst(&self, v: ValueId) -> Option<&Const> {
        self.g.konst(v)
    }

    fn out_name(cx: &Cx, i: usize) -> String {
        cx.n.output.get(i).cloned().unwrap_or_else(|| format!("{}:{i}", cx.name))
    }

    fn constant(&mut self, name: &str, c: Const) -> ValueId {
        self.g.add_value(name, c.shape.clone(), Some(c))
    }

    /// A device op computing output `i` of the node.
    fn device_out(&mut self, cx: &Cx, i: usize, kind: Kind, shape: Vec<u64>) -> ValueId {
        let dtype = self.result_dtype(&kind);
        let out = self.g.add_value(&Self::out_name(cx, i), shape, None);
        self.g.values[out].dtype = dtype;
        self.g.ops.push(Op { name: cx.name.clone(), op: cx.n.op_type.clone(), kind, out });
        out
    }

    fn device(&mut self, cx: &Cx, kind: Kind, shape: Vec<u64>) -> ValueId {
        self.device_out(cx, 0, kind, shape)
    }

    /// The dtype of what `kind` computes: a view keeps its input's, a
    /// cast has its target's, everything else is f32.
    fn result_dtype(&self, kind: &Kind) -> DType {
        match kind {
            Kind::View { x } => self.g.values[*x].dtype,
            Kind::Cast { to, .. } => *to,
            Kind::Quant { dequantize: false, qtype, .. } => *qtype,
            Kind::QGemm { out, .. } | Kind::QConv { out, .. } => out.dtype,
            Kind::QBinary { out_q, .. } => out_q.dtype,
            _ => DType::F32,
        }
    }

    /// A device op computing an intermediate value of the node.
    fn device_tmp(&mut self, cx: &Cx, kind: Kind, shape: Vec<u64>, tag: &str) -> ValueId {
        let dtype = self.result_dtype(&kind);
        let out = self.g.add_value(&format!("{}.{tag}", Self::out_name(cx, 0)), shape, None);
        self.g.values[out].dtype = dtype;
        self.g.ops.push(Op { name: format!("{}.{tag}", cx.name), op: cx.n.op_type.clone(), kind, out });
        out
    }

    fn node(&mut self, n: &NodeProto, idx: usize) -> Result<()> {
        let name = if n.name.is_empty() { format!("{}_{idx}", n.op_type) } else { n.name.clone() };
        let cx = Cx { n, name };
        let contrib = n.domain == "com.microsoft" && quant::CONTRIB_OPS.contains(&n.op_type.as_str());
        if !(n.domain.is_empty() || n.domain == "ai.onnx" || contrib || n.domain == triton::DOMAIN) {
            return Err(cx.err(format!(
                "operator domain '{}' is not supported (only the default ONNX domain, {} of com.microsoft, and {} custom kernels)",
                n.domain,
                quant::CONTRIB_OPS.join(", "),
                triton::DOMAIN
            )));
        }
        for a in &n.attribute {
            if a.g.is_some() {
                return Err(cx.err(format!("attribute '{}' is a subgraph; control flow (If/Loop/Scan) is not supported", a.name)));
            }
        }
        let mut ins = Vec::with_capacity(n.input.len());
        for i in &n.input {
            ins.push(if i.is_empty() { None } else { Some(self.lookup(i, &format!("node '{}' ({})", cx.name, n.op_type))?) });
        }
        if n.domain == triton::DOMAIN {
            // A custom kernel takes its operands as they are.
            let outs = self.lower_triton(&cx, &ins)?;
            return self.name_outputs(&cx, &outs);
        }
        // Device ops compute in f32: a run-time integer or bool operand
        // (a mask, say) is converted first; exact for |values| < 2^24.
        // Views, casts and Gather's indices keep their type.
        let keeps_type: &[usize] = match n.op_type.as_str() {
            "Identity" | "Dropout" | "Cast" | "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Shape" | "Size" => &[0, 1, 2],
            "Gather" => &[1],
            "DequantizeLinear" => &[0],
            "QLinearConv" | "QLinearMatMul" | "QGemm" | "QLinearAdd" | "QLinearMul" | "QLinearGlobalAveragePool" | "QLinearSoftmax" => &[0, 3],
            "QLinearConcat" => &[2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 44, 47],
            _ => &[],
        };
        // An element-moving op on an 8-bit value gives an 8-bit value.
        let int8_in = match ins.first().copied().flatten() {
            Some(x) if quant::INT8_PASSTHROUGH.contains(&n.op_type.as_str()) => Some(self.g.values[x].dtype).filter(|t| matches!(t, DType::U8 | DType::I8)),
            _ => None,
        };
        let compile_time = COMPILE_TIME_OPS.contains(&n.op_type.as_str());
        for (k, v) in ins.iter_mut().enumerate() {
            if let Some(x) = *v {
                if !compile_time && !keeps_type.contains(&k) && self.konst(x).is_none() && self.g.values[x].dtype != DType::F32 {
                    *v = Some(self.as_f32(&cx, x));
                }
            }
        }
        let mut outs = self.lower(&cx, &ins)?;
        if let Some(t) = int8_in {
            for v in outs.iter_mut() {
                if self.konst(*v).is_none() && self.g.values[*v].dtype == DType::F32 {
                    *v = self.f32_to_int8(&cx, *v, t);
                }
            }
        }
        self.name_outputs(&cx, &outs)
    }

    /// Check the node's outputs and give them their ONNX names.
    fn name_outputs(&mut self, cx: &Cx, outs: &[ValueId]) -> Result<()> {
        let n = cx.n;
        for &v in outs {
            let s = &self.g.values[v].shape;
            if s.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).is_none_or(|n| n > shape::MAX_ELEMS) {
                return Err(cx.err(format!("its output shape {s:?} is too large (limit {} elements)", shape::MAX_ELEMS)));
            }
        }
        for (i, o) in n.output.iter().enumerate() {
            if o.is_empty() {
                continue;
            }
            match outs.get(i) {
                Some(&v) => {
                    self.names.insert(o.clone(), v);
                }
                None => {
                    self.missing.insert(
                        o.clone(),
                        format!("output {i} of node '{}' ({}), which rbln-compile does not produce", cx.name, n.op_type),
                    );
                }
            }
        }
        Ok(())
    }

    /// A constant operand that must be known at compile time.
    /// Lowers one node through the module of its op family.
    fn lower(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let op = cx.n.op_type.as_str();
        for (ops, lower) in FAMILIES {
            if ops.contains(&op) {
                return lower(self, cx, ins);
            }
        }
        Err(cx.err(format!("op type '{op}' is not supported by rbln-compile (supported: {})", SUPPORTED_OPS.join(", "))))
    }

    fn need_const(&self, cx: &Cx, v: ValueId, i: usize) -> Result<Const> {
        self.konst(v).cloned().ok_or_else(|| {
            cx.err(format!(
                "input {i} ('{}') is computed at run time; this op is only supported on compile-time constants",
                self.g.values[v].name
            ))
        })
    }

    fn const_ints(&self, cx: &Cx, v: ValueId, i: usize) -> Result<Vec<i64>> {
        Ok(self.need_const(cx, v, i)?.ints())
    }

    /// `x` (a run-time integer or bool value) converted to f32 on the
    /// device, once per value.
    fn as_f32(&mut self, cx: &Cx, x: ValueId) -> ValueId {
        if let Some(&v) = self.as_f32.get(&x) {
            return v;
        }
        let from = self.g.values[x].dtype;
        let name = format!("{}.f32", self.g.values[x].name);
        let kind = match from {
            // 8-bit integers convert exactly through a dequantise with
            // scale 1 and zero point 0 (CAST has no 8-bit types).
            DType::U8 | DType::I8 => self.int8_to_f32(x, from),
            _ => Kind::Cast { x, from, to: DType::F32 },
        };
        let out = self.g.add_value(&name, self.shape(x), None);
        self.g.ops.push(Op { name: format!("{}.cast", cx.name), op: "Cast".into(), kind, out });
        self.as_f32.insert(x, out);
        out
    }

    /// The model input `v` is a view of, if any.
    fn input_behind(&self, mut v: ValueId) -> Option<ValueId> {
        loop {
            if self.g.inputs.iter().any(|(_, i)| *i == v) {
                return Some(v);
            }
            match self.g.ops.iter().find(|o| o.out == v).map(|o| &o.kind) {
                Some(Kind::View { x }) => v = *x,
                _ => return None,
            }
        }
    }

    /// A result of the node: its output (`tag` None) or an intermediate
    /// value named `tag`; computed by `kind` on the device, or the
    /// constant `c` when known.
    fn result(&mut self, cx: &Cx, tag: Option<&str>, kind: Kind, shape: Vec<u64>) -> ValueId {
        match tag {
            Some(t) => self.device_tmp(cx, kind, shape, t),
            None => self.device(cx, kind, shape),
        }
    }

    fn result_const(&mut self, cx: &Cx, tag: Option<&str>, c: Const) -> ValueId {
        match tag {
            Some(t) => self.constant(&format!("{}.{t}", cx.name), c),
            None => self.constant(&Self::out_name(cx, 0), c),
        }
    }

    /// `x` with its axes permuted by `perm` (a permutation of its rank):
    /// folded on a constant, a view when only size-1 dims move, else one
    /// TRANSPOSE. An intermediate identity permutation is `x` itself.
    pub(super) fn permuted(&mut self, cx: &Cx, x: ValueId, perm: &[usize], tag: Option<&str>) -> Result<ValueId> {
        if tag.is_some() && perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        let s = self.shape(x);
        let out: Vec<u64> = perm.iter().map(|&p| s[p]).collect();
        if let Some(c) = self.konst(x) {
            let c = fold::transpose(c, perm);
            return Ok(self.result_const(cx, tag, c));
        }
        if moves_only_unit_dims(&s, perm) {
            return Ok(self.result(cx, tag, Kind::View { x }, out));
        }
        rank_ok(cx, &s, "the input")?;
        Ok(self.result(cx, tag, Kind::Transpose { x, dims: s, perm: perm.iter().map(|&p| p as u64).collect() }, out))
    }

    /// `x` with shape `to` (same element count): a view.
    pub(super) fn reshaped(&mut self, cx: &Cx, x: ValueId, to: Vec<u64>, tag: Option<&str>) -> ValueId {
        match self.konst(x).cloned() {
            Some(c) => self.result_const(cx, tag, Const { shape: to, data: c.data }),
            None => self.result(cx, tag, Kind::View { x }, to),
        }
    }

    /// Output 0 is the same value as `x` (a constant keeps its data).
    fn alias(&mut self, cx: &Cx, x: ValueId) -> ValueId {
        let s = self.shape(x);
        match self.konst(x).cloned() {
            Some(c) => self.constant(&Self::out_name(cx, 0), c),
            None => self.device(cx, Kind::View { x }, s),
        }
    }
}


/// Whether a permutation keeps every dim larger than 1 in order, so the
/// bytes do not move.
fn moves_only_unit_dims(shape: &[u64], perm: &[usize]) -> bool {
    let order: Vec<usize> = perm.iter().copied().filter(|&p| shape[p] != 1).collect();
    order.windows(2).all(|w| w[0] < w[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_supported_op_has_exactly_one_family() {
        let mut all: Vec<&str> = FAMILIES.iter().flat_map(|(ops, _)| ops.iter().copied()).collect();
        all.sort_unstable();
        let n = all.len();
        all.dedup();
        assert_eq!(all.len(), n, "an op type is in two families");
        let mut supported = SUPPORTED_OPS.to_vec();
        supported.sort_unstable();
        assert_eq!(all, supported);
        for op in COMPILE_TIME_OPS {
            assert!(constant::OPS.contains(op) || norm::OPS.contains(op), "{op}");
        }
    }
}
