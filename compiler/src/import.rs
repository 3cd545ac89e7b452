//! ONNX graph -> compiler graph: resolves static shapes, folds what is
//! known at compile time and lowers every other node to device ops.
//!
//! Invariant: every value that is not a constant is an f32 tensor (model
//! inputs must be float; a run-time cast to an integer type is refused),
//! so integer tensors only ever exist at compile time.

use std::collections::HashMap;

use rbln_format::DType;
use rbln_hw::ops::{Binary, Unary, MAX_RANK, REDUCE_MAX, REDUCE_MEAN, REDUCE_MIN, REDUCE_SUM};

use crate::error::{CompileError, Result};
use crate::fold;
use crate::ir::{Act, Const, CopyPart, Data, Graph, Kind, Op, ValueId};
use crate::onnx::{self, elem, AttributeProto, ModelProto, NodeProto, ValueInfoProto};
use crate::shape::{self, strides, volume};

/// Options that change how a model is read.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Static shapes for inputs (overriding or completing the file's).
    pub input_shapes: Vec<(String, Vec<u64>)>,
}

/// Oldest default-domain opset the importer knows the semantics of.
pub const MIN_OPSET: i64 = 7;
/// Newest default-domain opset the importer was written against.
pub const MAX_OPSET: i64 = 22;

/// The ONNX op types rbln-compile handles (folded or on the device).
pub const SUPPORTED_OPS: &[&str] = &[
    "Abs", "Add", "And", "AveragePool", "BatchNormalization", "Cast", "Ceil", "Clip", "Concat", "Constant", "ConstantOfShape",
    "Conv", "CumSum", "Div", "Dropout", "Equal", "Erf", "Exp", "Expand", "Flatten", "Floor", "Gather", "GatherElements",
    "Gelu", "Gemm", "GlobalAveragePool", "GlobalMaxPool", "Greater", "GreaterOrEqual", "HardSigmoid", "HardSwish",
    "Identity", "IsInf", "IsNaN", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "MatMul", "Max",
    "MaxPool", "Min", "Mod", "Mul", "Neg", "NonZero", "Not", "Or", "Pad", "Pow", "PRelu", "Range", "Reciprocal",
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd",
    "ReduceSum", "ReduceSumSquare", "Relu", "Reshape", "Round", "ScatterElements", "ScatterND", "Shape", "Sigmoid", "Sign",
    "Size", "Slice", "Softmax", "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Tile", "Transpose", "Trilu", "Unsqueeze",
    "Where", "Xor",
];

/// Ops computed only at compile time: every input they read must be a
/// constant (the Reduce* ops without a device form are here; ReduceSum,
/// ReduceMean, ReduceMax and ReduceMin fold on constants and run on the
/// device otherwise).
pub const COMPILE_TIME_OPS: &[&str] = &[
    "And", "Ceil", "ConstantOfShape", "CumSum", "Equal", "Floor", "GatherElements", "Greater", "GreaterOrEqual", "IsInf",
    "IsNaN", "Less", "LessOrEqual", "Mod", "NonZero", "Not", "Or", "Range", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceProd", "ReduceSumSquare", "Round", "ScatterElements", "ScatterND", "Sign", "Tile", "Trilu",
    "Where", "Xor",
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
                    "output '{}' is {} in the model but computed as {} (outputs are float32, int32, int64 or bool)",
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
    Ok(im.g)
}

/// The run-time dtype of an ONNX element type, if the NPU has it.
fn run_time_dtype(t: i32) -> Option<DType> {
    match t {
        elem::FLOAT => Some(DType::F32),
        elem::INT32 => Some(DType::I32),
        elem::INT64 => Some(DType::I64),
        elem::BOOL => Some(DType::Bool),
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
            "input '{}' is {}; model inputs are float32, int32, int64 or bool (convert it outside the model)",
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
        let dtype = match &kind {
            Kind::View { x } => self.g.values[*x].dtype,
            Kind::Cast { to, .. } => *to,
            _ => DType::F32,
        };
        let out = self.g.add_value(&Self::out_name(cx, i), shape, None);
        self.g.values[out].dtype = dtype;
        self.g.ops.push(Op { name: cx.name.clone(), op: cx.n.op_type.clone(), kind, out });
        out
    }

    fn device(&mut self, cx: &Cx, kind: Kind, shape: Vec<u64>) -> ValueId {
        self.device_out(cx, 0, kind, shape)
    }

    /// A device op computing an intermediate value of the node.
    fn device_tmp(&mut self, cx: &Cx, kind: Kind, shape: Vec<u64>, tag: &str) -> ValueId {
        let out = self.g.add_value(&format!("{}.{tag}", Self::out_name(cx, 0)), shape, None);
        self.g.ops.push(Op { name: format!("{}.{tag}", cx.name), op: cx.n.op_type.clone(), kind, out });
        out
    }

    fn node(&mut self, n: &NodeProto, idx: usize) -> Result<()> {
        let name = if n.name.is_empty() { format!("{}_{idx}", n.op_type) } else { n.name.clone() };
        let cx = Cx { n, name };
        if !(n.domain.is_empty() || n.domain == "ai.onnx") {
            return Err(cx.err(format!("operator domain '{}' is not supported (only the default ONNX domain)", n.domain)));
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
        // Device ops compute in f32: a run-time integer or bool operand
        // (a mask, say) is converted first; exact for |values| < 2^24.
        // Views, casts and Gather's indices keep their type.
        let keeps_type: &[usize] = match n.op_type.as_str() {
            "Identity" | "Dropout" | "Cast" | "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Shape" | "Size" => &[0, 1, 2],
            "Gather" => &[1],
            _ => &[],
        };
        let compile_time = COMPILE_TIME_OPS.contains(&n.op_type.as_str());
        for (k, v) in ins.iter_mut().enumerate() {
            if let Some(x) = *v {
                if !compile_time && !keeps_type.contains(&k) && self.konst(x).is_none() && self.g.values[x].dtype != DType::F32 {
                    *v = Some(self.as_f32(&cx, x));
                }
            }
        }
        let outs = self.lower(&cx, &ins)?;
        for &v in &outs {
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

    fn lower(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
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
                self.constant(&Self::out_name(cx, 0), c)
            }
            "Identity" | "Dropout" | "Cast" | "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => self.view_op(cx, ins)?,
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
            "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => {
                let (a, b) = (self.need_const(cx, input(0)?, 0)?, self.need_const(cx, input(1)?, 1)?);
                let c = cx.shape(fold::binary(op, &a, &b))?;
                self.constant(&Self::out_name(cx, 0), c)
            }
            "Not" | "Floor" | "Ceil" | "Round" | "Sign" | "IsNaN" => {
                let a = self.need_const(cx, input(0)?, 0)?;
                let c = fold::unary(op, &a).ok_or_else(|| cx.err("cannot fold"))?;
                self.constant(&Self::out_name(cx, 0), c)
            }
            "IsInf" => {
                let a = self.need_const(cx, input(0)?, 0)?;
                let c = fold::is_inf(&a, cx.int("detect_negative", 1) != 0, cx.int("detect_positive", 1) != 0);
                self.constant(&Self::out_name(cx, 0), c)
            }
            "Mod" => {
                let (a, b) = (self.need_const(cx, input(0)?, 0)?, self.need_const(cx, input(1)?, 1)?);
                let fmod = match cx.int("fmod", 0) {
                    0 => false,
                    1 => true,
                    f => return Err(cx.err(format!("fmod={f}; it must be 0 or 1"))),
                };
                let c = cx.shape(fold::modulo(&a, &b, fmod))?;
                self.constant(&Self::out_name(cx, 0), c)
            }
            "And" | "Or" | "Xor" => {
                let (a, b) = (self.need_const(cx, input(0)?, 0)?, self.need_const(cx, input(1)?, 1)?);
                let c = cx.shape(fold::logical(op, &a, &b))?;
                self.constant(&Self::out_name(cx, 0), c)
            }
            "GatherElements" => {
                let (d, i) = (self.need_const(cx, input(0)?, 0)?, self.need_const(cx, input(1)?, 1)?);
                let c = cx.shape(fold::gather_elements(&d, &i, cx.int("axis", 0)))?;
                self.constant(&Self::out_name(cx, 0), c)
            }
            "ScatterND" | "ScatterElements" => {
                let (d, i, u) = (self.need_const(cx, input(0)?, 0)?, self.need_const(cx, input(1)?, 1)?, self.need_const(cx, input(2)?, 2)?);
                let r = cx.shape(fold::Reduction::parse(cx.string("reduction").as_deref().unwrap_or("none")))?;
                let c = if op == "ScatterND" {
                    cx.shape(fold::scatter_nd(&d, &i, &u, r))?
                } else {
                    cx.shape(fold::scatter_elements(&d, &i, &u, cx.int("axis", 0), r))?
                };
                self.constant(&Self::out_name(cx, 0), c)
            }
            "Tile" => {
                let (x, reps) = (self.need_const(cx, input(0)?, 0)?, self.need_const(cx, input(1)?, 1)?);
                let c = cx.shape(fold::tile(&x, &reps))?;
                self.constant(&Self::out_name(cx, 0), c)
            }
            "CumSum" => {
                let (x, axis) = (self.need_const(cx, input(0)?, 0)?, self.need_const(cx, input(1)?, 1)?);
                let axis = cx.shape(fold::int_scalar(&axis, "axis (input 1)"))?;
                let c = cx.shape(fold::cumsum(&x, axis, cx.int("exclusive", 0) != 0, cx.int("reverse", 0) != 0))?;
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
            "Where" => {
                let (c, a, b) = (self.need_const(cx, input(0)?, 0)?, self.need_const(cx, input(1)?, 1)?, self.need_const(cx, input(2)?, 2)?);
                let c = cx.shape(fold::where_(&c, &a, &b))?;
                self.constant(&Self::out_name(cx, 0), c)
            }
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Max" | "Min" => {
                let kind = match op {
                    "Add" => Binary::Add,
                    "Sub" => Binary::Sub,
                    "Mul" => Binary::Mul,
                    "Div" => Binary::Div,
                    "Pow" => Binary::Pow,
                    "Max" => Binary::Max,
                    _ => Binary::Min,
                };
                let xs: Vec<ValueId> = ins.iter().flatten().copied().collect();
                match xs.len() {
                    0 => return Err(cx.err("no inputs")),
                    1 => self.alias(cx, xs[0]),
                    _ => {
                        let mut acc = xs[0];
                        for (i, &x) in xs[1..].iter().enumerate() {
                            let last = i + 2 == xs.len();
                            acc = self.binary(cx, kind, acc, x, last)?;
                        }
                        acc
                    }
                }
            }
            "Relu" | "Sigmoid" | "Tanh" | "Exp" | "Log" | "Sqrt" | "Neg" | "Abs" | "Erf" | "Reciprocal" | "Gelu" => {
                let x = input(0)?;
                let kind = match op {
                    "Relu" => Unary::Relu,
                    "Sigmoid" => Unary::Sigmoid,
                    "Tanh" => Unary::Tanh,
                    "Exp" => Unary::Exp,
                    "Log" => Unary::Log,
                    "Sqrt" => Unary::Sqrt,
                    "Neg" => Unary::Neg,
                    "Abs" => Unary::Abs,
                    "Erf" => Unary::Erf,
                    "Reciprocal" => Unary::Reciprocal,
                    _ => match cx.string("approximate").as_deref() {
                        None | Some("none") => Unary::Gelu,
                        Some("tanh") => Unary::GeluTanh,
                        Some(o) => return Err(cx.err(format!("approximate='{o}' is not supported"))),
                    },
                };
                self.unary(cx, kind, x, 0.0, 0.0)?
            }
            "Clip" => {
                let x = input(0)?;
                let (lo, hi) = if self.opset < 11 {
                    (cx.float("min", f32::NEG_INFINITY), cx.float("max", f32::INFINITY))
                } else {
                    let bound = |s: &Self, i: usize, d: f32| -> Result<f32> {
                        match opt(i) {
                            None => Ok(d),
                            Some(v) => s
                                .konst(v)
                                .and_then(Const::scalar)
                                .ok_or_else(|| cx.err(format!("input {i} (a bound) must be a one-element constant"))),
                        }
                    };
                    (bound(self, 1, f32::NEG_INFINITY)?, bound(self, 2, f32::INFINITY)?)
                };
                if lo == 0.0 && hi == f32::INFINITY {
                    self.unary(cx, Unary::Relu, x, 0.0, 0.0)?
                } else {
                    self.unary(cx, Unary::Clip, x, lo, hi)?
                }
            }
            "LeakyRelu" => {
                let (x, alpha) = (input(0)?, cx.float("alpha", 0.01));
                let s = self.shape(x);
                if (0.0..=1.0).contains(&alpha) {
                    // max(x, alpha * x)
                    let a = self.scalar(cx, "alpha", alpha);
                    let ax = self.elementwise(cx, Binary::Mul, x, a, Some("scaled"))?;
                    self.elementwise(cx, Binary::Max, x, ax, None)?
                } else {
                    let a = self.scalar(cx, "alpha", alpha);
                    self.relu_plus_scaled_negative(cx, x, a, s)?
                }
            }
            "PRelu" => {
                let (x, slope) = (input(0)?, input(1)?);
                let s = self.shape(x);
                if cx.shape(shape::broadcast(&s, &self.shape(slope)))? != s {
                    return Err(cx.err(format!("slope {:?} does not broadcast to the input {s:?}", self.shape(slope))));
                }
                self.relu_plus_scaled_negative(cx, x, slope, s)?
            }
            "HardSigmoid" => {
                let x = input(0)?;
                self.unary(cx, Unary::HardSigmoid, x, cx.float("alpha", 0.2), cx.float("beta", 0.5))?
            }
            "HardSwish" => self.unary(cx, Unary::HardSwish, input(0)?, 0.0, 0.0)?,
            "Pad" => self.pad(cx, ins)?,
            "Gemm" => self.gemm(cx, input(0)?, input(1)?, opt(2))?,
            "MatMul" => self.matmul(cx, input(0)?, input(1)?)?,
            "Conv" => self.conv(cx, input(0)?, input(1)?, opt(2))?,
            // MaxPool's Indices output is not produced: a node reading it
            // fails with "output 1 of node ... which rbln-compile does not
            // produce".
            "MaxPool" | "AveragePool" => self.pool(cx, input(0)?, op == "MaxPool")?,
            "GlobalAveragePool" | "GlobalMaxPool" => {
                let x = input(0)?;
                let s = self.shape(x);
                if s.len() < 3 {
                    return Err(cx.err(format!("input has shape {s:?}; N, C and spatial dims expected")));
                }
                let nc = s[0] * s[1];
                let sp = volume(&s[2..]);
                let mut out = s[..2].to_vec();
                out.extend(std::iter::repeat_n(1, s.len() - 2));
                let kind = if op == "GlobalMaxPool" { REDUCE_MAX } else { REDUCE_MEAN };
                self.device(cx, Kind::Reduce { kind, x, dims: vec![nc, sp, 1], axis: 1 }, out)
            }
            "BatchNormalization" => self.batch_norm(cx, ins)?,
            "Softmax" => {
                let x = input(0)?;
                let s = self.shape(x);
                let legacy = self.opset < 13;
                let a = cx.shape(shape::axis(cx.int("axis", if legacy { 1 } else { -1 }), s.len(), false))?;
                let dims = if legacy {
                    vec![volume(&s[..a]), volume(&s[a..]), 1]
                } else {
                    vec![volume(&s[..a]), s[a], volume(&s[a + 1..])]
                };
                self.device(cx, Kind::Softmax { x, dims, axis: 1 }, s)
            }
            "LayerNormalization" => {
                let x = input(0)?;
                let s = self.shape(x);
                let a = cx.shape(shape::axis(cx.int("axis", -1), s.len(), false))?;
                let (rows, cols) = (volume(&s[..a]), volume(&s[a..]));
                let gamma = input(1)?;
                let beta = opt(2);
                for (i, p) in [(1, Some(gamma)), (2, beta)] {
                    if let Some(p) = p {
                        if volume(&self.shape(p)) != cols {
                            return Err(cx.err(format!("input {i} has shape {:?}; {cols} elements (the normalised dims {:?}) expected", self.shape(p), &s[a..])));
                        }
                    }
                }
                self.device(cx, Kind::LayerNorm { x, gamma: Some(gamma), beta, rows, cols, eps: cx.float("epsilon", 1e-5) }, s)
            }
            "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare"
            | "ReduceLogSum" | "ReduceLogSumExp" => self.reduce(cx, ins)?,
            "Transpose" => {
                let x = input(0)?;
                let s = self.shape(x);
                let perm: Vec<usize> = match cx.ints("perm") {
                    Some(p) => p.iter().map(|&a| cx.shape(shape::axis(a, s.len(), false))).collect::<Result<_>>()?,
                    None => (0..s.len()).rev().collect(),
                };
                let mut seen = perm.clone();
                seen.sort_unstable();
                if seen != (0..s.len()).collect::<Vec<_>>() {
                    return Err(cx.err(format!("perm {perm:?} is not a permutation of the {} axes", s.len())));
                }
                let out: Vec<u64> = perm.iter().map(|&p| s[p]).collect();
                if let Some(c) = self.konst(x) {
                    let c = fold::transpose(c, &perm);
                    self.constant(&Self::out_name(cx, 0), c)
                } else if moves_only_unit_dims(&s, &perm) {
                    self.device(cx, Kind::View { x }, out)
                } else {
                    rank_ok(cx, &s, "the input")?;
                    self.device(cx, Kind::Transpose { x, dims: s, perm: perm.iter().map(|&p| p as u64).collect() }, out)
                }
            }
            "Concat" => self.concat(cx, ins)?,
            "Slice" => {
                let x = input(0)?;
                let s = self.shape(x);
                let (starts, ends, axes, steps) = if self.opset < 10 {
                    (cx.ints("starts").unwrap_or_default(), cx.ints("ends").unwrap_or_default(), cx.ints("axes"), None)
                } else {
                    let get = |me: &Self, i: usize| -> Result<Option<Vec<i64>>> { opt(i).map(|v| me.const_ints(cx, v, i)).transpose() };
                    (get(self, 1)?.unwrap_or_default(), get(self, 2)?.unwrap_or_default(), get(self, 3)?, get(self, 4)?)
                };
                let b = cx.shape(shape::slice(&s, &starts, &ends, axes.as_deref(), steps.as_deref()))?;
                self.slice_out(cx, 0, x, &b.out, &b.start, &b.step)?
            }
            "Split" => return self.split(cx, ins),
            "Gather" => self.gather(cx, input(0)?, input(1)?)?,
            "Expand" => {
                let x = input(0)?;
                let s = self.shape(x);
                let spec = self.const_ints(cx, input(1)?, 1)?;
                let spec: Vec<u64> = spec.iter().map(|&d| d.max(0) as u64).collect();
                let out = cx.shape(shape::broadcast(&s, &spec))?;
                let src_strides = shape::broadcast_strides(&s, &out);
                if let Some(c) = self.konst(x) {
                    cx.shape(shape::fold_limit(&out))?;
                    let c = fold::pick(c, &shape::box_indices(&out, &src_strides, 0), &out);
                    self.constant(&Self::out_name(cx, 0), c)
                } else if out == s {
                    self.device(cx, Kind::View { x }, out)
                } else {
                    rank_ok(cx, &out, "the output")?;
                    let part = CopyPart { src: x, src_offset: 0, dst_offset: 0, dst_strides: strides(&out), sizes: out.clone(), src_strides };
                    self.device(cx, Kind::Copy { parts: vec![part] }, out)
                }
            }
            _ => {
                return Err(cx.err(format!(
                    "op type '{op}' is not supported by rbln-compile (supported: {})",
                    SUPPORTED_OPS.join(", ")
                )))
            }
        };
        Ok(vec![v])
    }

    /// A constant operand that must be known at compile time.
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
        let out = self.g.add_value(&name, self.shape(x), None);
        self.g.ops.push(Op { name: format!("{}.cast", cx.name), op: "Cast".into(), kind: Kind::Cast { x, from, to: DType::F32 }, out });
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

    /// Output 0 is the same value as `x` (a constant keeps its data).
    fn alias(&mut self, cx: &Cx, x: ValueId) -> ValueId {
        let s = self.shape(x);
        match self.konst(x).cloned() {
            Some(c) => self.constant(&Self::out_name(cx, 0), c),
            None => self.device(cx, Kind::View { x }, s),
        }
    }

    /// Ops that only reinterpret (or, for constants, convert) a tensor.
    fn view_op(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<ValueId> {
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let s = self.shape(x);
        let op = cx.n.op_type.as_str();
        let axes = |me: &Self| -> Result<Option<Vec<i64>>> {
            if me.opset < 13 {
                Ok(cx.ints("axes"))
            } else {
                ins.get(1).copied().flatten().map(|v| me.const_ints(cx, v, 1)).transpose()
            }
        };
        let out = match op {
            "Identity" => s.clone(),
            "Dropout" => {
                if let Some(t) = ins.get(2).copied().flatten() {
                    if self.konst(t).is_none_or(|c| c.ints().iter().any(|&b| b != 0)) {
                        return Err(cx.err("training_mode must be a constant false"));
                    }
                }
                s.clone()
            }
            "Cast" => {
                let to = cx.int("to", elem::FLOAT as i64) as i32;
                if let Some(c) = self.konst(x) {
                    let c = cx.shape(fold::cast(c, to))?;
                    return Ok(self.constant(&Self::out_name(cx, 0), c));
                }
                let to = run_time_dtype(to).ok_or_else(|| {
                    cx.err(format!("casts a run-time tensor to {}; run-time tensors are float32, int32, int64 or bool", elem::name(to)))
                })?;
                let from = self.g.values[x].dtype;
                if from != to {
                    return Ok(self.device(cx, Kind::Cast { x, from, to }, s));
                }
                s.clone()
            }
            "Reshape" => {
                let spec = if self.opset < 5 { cx.ints("shape").unwrap_or_default() } else {
                    let v = ins.get(1).copied().flatten().ok_or_else(|| cx.err("input 1 (shape) is missing"))?;
                    self.const_ints(cx, v, 1)?
                };
                cx.shape(shape::reshape(&s, &spec, cx.int("allowzero", 0) != 0))?
            }
            "Flatten" => {
                let a = cx.shape(shape::axis(cx.int("axis", 1), s.len(), true))?;
                vec![volume(&s[..a]), volume(&s[a..])]
            }
            "Squeeze" => match axes(self)? {
                None => s.iter().copied().filter(|&d| d != 1).collect(),
                Some(ax) => {
                    let mut drop = vec![false; s.len()];
                    for a in ax {
                        let a = cx.shape(shape::axis(a, s.len(), false))?;
                        if s[a] != 1 {
                            return Err(cx.err(format!("axis {a} has size {}, not 1", s[a])));
                        }
                        drop[a] = true;
                    }
                    s.iter().zip(&drop).filter(|(_, &d)| !d).map(|(&v, _)| v).collect()
                }
            },
            _ => {
                // Unsqueeze
                let ax = axes(self)?.ok_or_else(|| cx.err("axes are missing"))?;
                let r = s.len() + ax.len();
                let mut at = vec![false; r];
                for a in ax {
                    let a = cx.shape(shape::axis(a, r, false))?;
                    if at[a] {
                        return Err(cx.err(format!("axis {a} is repeated")));
                    }
                    at[a] = true;
                }
                let mut it = s.iter();
                at.iter().map(|&one| if one { 1 } else { *it.next().unwrap_or(&1) }).collect()
            }
        };
        Ok(match self.konst(x).cloned() {
            Some(mut c) => {
                c.shape = out;
                self.constant(&Self::out_name(cx, 0), c)
            }
            None => self.device(cx, Kind::View { x }, out),
        })
    }

    /// `a (kind) b`, folded when both are constants; `last` names the
    /// result after the node's output, otherwise it is an intermediate.
    fn binary(&mut self, cx: &Cx, kind: Binary, a: ValueId, b: ValueId, last: bool) -> Result<ValueId> {
        let (sa, sb) = (self.shape(a), self.shape(b));
        let out = cx.shape(shape::broadcast(&sa, &sb))?;
        if let (Some(ca), Some(cb)) = (self.konst(a), self.konst(b)) {
            let c = cx.shape(fold::binary(&cx.n.op_type, ca, cb))?;
            let name = if last { Self::out_name(cx, 0) } else { format!("{}.{}", Self::out_name(cx, 0), self.g.values.len()) };
            return Ok(self.constant(&name, c));
        }
        rank_ok(cx, &out, "the result")?;
        let r = out.len();
        let k = Kind::Binary { kind, a, b, a_dims: shape::pad_rank(&sa, r), b_dims: shape::pad_rank(&sb, r), act: Act::NONE };
        Ok(if last { self.device(cx, k, out) } else { self.device_tmp(cx, k, out, "partial") })
    }

    fn scalar(&mut self, cx: &Cx, tag: &str, v: f32) -> ValueId {
        self.constant(&format!("{}.{tag}", cx.name), Const::f32(&[], vec![v]))
    }

    /// One element-wise device op of a multi-op lowering (never folded):
    /// an intermediate named by `tag`, or the node's output when None.
    fn elementwise(&mut self, cx: &Cx, kind: Binary, a: ValueId, b: ValueId, tag: Option<&str>) -> Result<ValueId> {
        let (sa, sb) = (self.shape(a), self.shape(b));
        let out = cx.shape(shape::broadcast(&sa, &sb))?;
        rank_ok(cx, &out, "the result")?;
        let r = out.len();
        let k = Kind::Binary { kind, a, b, a_dims: shape::pad_rank(&sa, r), b_dims: shape::pad_rank(&sb, r), act: Act::NONE };
        Ok(match tag {
            Some(t) => self.device_tmp(cx, k, out, t),
            None => self.device(cx, k, out),
        })
    }

    /// relu(x) + slope * min(x, 0): LeakyRelu with alpha > 1, PRelu.
    fn relu_plus_scaled_negative(&mut self, cx: &Cx, x: ValueId, slope: ValueId, s: Vec<u64>) -> Result<ValueId> {
        let pos = self.device_tmp(cx, Kind::Unary { kind: Unary::Relu, x, p0: 0.0, p1: 0.0 }, s, "positive");
        let zero = self.scalar(cx, "zero", 0.0);
        let neg = self.elementwise(cx, Binary::Min, x, zero, Some("negative"))?;
        let scaled = self.elementwise(cx, Binary::Mul, neg, slope, Some("scaled"))?;
        self.elementwise(cx, Binary::Add, pos, scaled, None)
    }

    /// clip(alpha * x + beta, 0, 1); the node's output when `last`.
    fn pad(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<ValueId> {
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let s = self.shape(x);
        let r = s.len();
        let mode = cx.string("mode").unwrap_or_else(|| "constant".into());
        if mode != "constant" {
            return Err(cx.err(format!("mode '{mode}' is not supported (only constant padding)")));
        }
        let (pads, value, axes) = if self.opset < 11 {
            (cx.ints("pads").ok_or_else(|| cx.err("pads are missing"))?, cx.float("value", 0.0), None)
        } else {
            let pads = self.const_ints(cx, ins.get(1).copied().flatten().ok_or_else(|| cx.err("input 1 (pads) is missing"))?, 1)?;
            let value = match ins.get(2).copied().flatten() {
                Some(v) => self.konst(v).and_then(Const::scalar).ok_or_else(|| cx.err("constant_value must be a one-element constant"))?,
                None => 0.0,
            };
            let axes = ins.get(3).copied().flatten().map(|v| self.const_ints(cx, v, 3)).transpose()?;
            (pads, value, axes)
        };
        let axes: Vec<usize> = match axes {
            Some(a) => a.iter().map(|&v| cx.shape(shape::axis(v, r, false))).collect::<Result<_>>()?,
            None => (0..r).collect(),
        };
        if pads.len() != 2 * axes.len() {
            return Err(cx.err(format!("{} pads for {} axes", pads.len(), axes.len())));
        }
        if pads.iter().any(|&p| p < 0) {
            return Err(cx.err(format!("negative pads {pads:?} (cropping) are not supported")));
        }
        let (mut begin, mut end) = (vec![0u64; r], vec![0u64; r]);
        for (i, &a) in axes.iter().enumerate() {
            begin[a] = pads[i] as u64;
            end[a] = pads[i + axes.len()] as u64;
        }
        let out: Vec<u64> = (0..r).map(|i| s[i].saturating_add(begin[i]).saturating_add(end[i])).collect();
        if let Some(c) = self.konst(x) {
            cx.shape(shape::fold_limit(&out))?;
            let st = strides(&out);
            let at: u64 = begin.iter().zip(&st).map(|(b, s)| b * s).sum();
            let mut v = vec![value; volume(&out) as usize];
            for (src, dst) in c.floats().into_iter().zip(shape::box_indices(&s, &st, at)) {
                v[dst] = src;
            }
            return Ok(self.constant(&Self::out_name(cx, 0), Const::f32(&out, v)));
        }
        if out == s {
            return Ok(self.device(cx, Kind::View { x }, s));
        }
        rank_ok(cx, &out, "the output")?;
        Ok(self.device(cx, Kind::Pad { x, value, dims: s, begin, end }, out))
    }

    fn unary(&mut self, cx: &Cx, kind: Unary, x: ValueId, p0: f32, p1: f32) -> Result<ValueId> {
        let s = self.shape(x);
        if let Some(c) = self.konst(x) {
            let name = match kind {
                Unary::Relu => Some("Relu"),
                Unary::Sigmoid => Some("Sigmoid"),
                Unary::Tanh => Some("Tanh"),
                Unary::Exp => Some("Exp"),
                Unary::Log => Some("Log"),
                Unary::Sqrt => Some("Sqrt"),
                Unary::Neg => Some("Neg"),
                Unary::Abs => Some("Abs"),
                Unary::Reciprocal => Some("Reciprocal"),
                _ => None,
            };
            if let Some(f) = name.and_then(|n| fold::unary(n, c)) {
                return Ok(self.constant(&Self::out_name(cx, 0), f));
            }
            let f: Option<fn(f32, f32, f32) -> f32> = match kind {
                Unary::Clip => Some(|x, lo, hi| x.max(lo).min(hi)),
                Unary::HardSigmoid => Some(|x, a, b| (a * x + b).clamp(0.0, 1.0)),
                Unary::HardSwish => Some(|x, _, _| x * (x * (1.0 / 6.0) + 0.5).clamp(0.0, 1.0)),
                _ => None,
            };
            if let Some(f) = f {
                let v = c.floats().iter().map(|&x| f(x, p0, p1)).collect();
                return Ok(self.constant(&Self::out_name(cx, 0), Const::f32(&s, v)));
            }
        }
        Ok(self.device(cx, Kind::Unary { kind, x, p0, p1 }, s))
    }

    fn dims_u64(&self, cx: &Cx, v: ValueId, rank: usize, what: &str) -> Result<Vec<u64>> {
        let s = self.shape(v);
        if s.len() != rank {
            return Err(cx.err(format!("{what} has shape {s:?}; rank {rank} expected")));
        }
        Ok(s)
    }

    fn gemm(&mut self, cx: &Cx, a: ValueId, b: ValueId, c: Option<ValueId>) -> Result<ValueId> {
        let (sa, sb) = (self.dims_u64(cx, a, 2, "A")?, self.dims_u64(cx, b, 2, "B")?);
        let (ta, tb) = (cx.int("transA", 0) != 0, cx.int("transB", 0) != 0);
        let (m, k) = if ta { (sa[1], sa[0]) } else { (sa[0], sa[1]) };
        let (kb, n) = if tb { (sb[1], sb[0]) } else { (sb[0], sb[1]) };
        if k != kb {
            return Err(cx.err(format!("A {sa:?} and B {sb:?} do not multiply (transA={ta}, transB={tb})")));
        }
        let (alpha, beta) = (cx.float("alpha", 1.0), cx.float("beta", 1.0));
        let (mut a, mut b) = (a, b);
        if alpha != 1.0 {
            if let Some(cb) = self.konst(b).cloned() {
                b = self.constant(&format!("{}.alpha_B", cx.name), Const::f32(&cb.shape, cb.floats().iter().map(|v| v * alpha).collect()));
            } else if let Some(ca) = self.konst(a).cloned() {
                a = self.constant(&format!("{}.alpha_A", cx.name), Const::f32(&ca.shape, ca.floats().iter().map(|v| v * alpha).collect()));
            } else {
                return Err(cx.err(format!("alpha={alpha} with neither A nor B constant")));
            }
        }
        let mut c = c.filter(|_| beta != 0.0);
        if let Some(cv) = c {
            if beta != 1.0 {
                let cc = self.konst(cv).cloned().ok_or_else(|| cx.err(format!("beta={beta} with a run-time C")))?;
                c = Some(self.constant(&format!("{}.beta_C", cx.name), Const::f32(&cc.shape, cc.floats().iter().map(|v| v * beta).collect())));
            }
        }
        let out = vec![m, n];
        let bias_like = |s: &[u64]| volume(s) == n && (s.len() == 1 || s.len() == 2 && s[0] == 1);
        let bias = c.filter(|&cv| bias_like(&self.shape(cv)));
        let kind = Kind::Gemm { a, b, bias, m, n, k, batch: 1, strides: [0; 3], trans_a: ta, trans_b: tb, residual: None, act: Act::NONE };
        match c {
            Some(cv) if bias.is_none() => {
                let sc = self.shape(cv);
                cx.shape(shape::broadcast(&sc, &out).and_then(|o| if o == out { Ok(o) } else { Err(format!("C {sc:?} does not broadcast to {out:?}")) }))?;
                let t = self.device_tmp(cx, kind, out.clone(), "product");
                let k = Kind::Binary { kind: Binary::Add, a: t, b: cv, a_dims: out.clone(), b_dims: shape::pad_rank(&sc, 2), act: Act::NONE };
                Ok(self.device(cx, k, out))
            }
            _ => Ok(self.device(cx, kind, out)),
        }
    }

    fn matmul(&mut self, cx: &Cx, a: ValueId, b: ValueId) -> Result<ValueId> {
        let (sa, sb) = (self.shape(a), self.shape(b));
        if sa.is_empty() || sb.is_empty() {
            return Err(cx.err("scalar operands are not allowed"));
        }
        let a2: Vec<u64> = if sa.len() == 1 { vec![1, sa[0]] } else { sa.clone() };
        let b2: Vec<u64> = if sb.len() == 1 { vec![sb[0], 1] } else { sb.clone() };
        let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
        let (kb, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
        if k != kb {
            return Err(cx.err(format!("A {sa:?} and B {sb:?} do not multiply ({k} != {kb})")));
        }
        let (ab, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
        let batch_shape = cx.shape(shape::broadcast(ab, bb))?;
        let mut out = batch_shape.clone();
        if sa.len() > 1 {
            out.push(m);
        }
        if sb.len() > 1 {
            out.push(n);
        }
        let (va, vb) = (volume(ab), volume(bb));
        let kind = |m: u64, batch: u64, strides: [u64; 3]| Kind::Gemm {
            a, b, bias: None, m, n, k, batch, strides, trans_a: false, trans_b: false, residual: None, act: Act::NONE,
        };
        let kind = if vb == 1 {
            // B is one matrix: A's batch folds into its rows.
            kind(va * m, 1, [0; 3])
        } else if va == 1 {
            kind(m, vb, [0, k * n, m * n])
        } else if shape::pad_rank(ab, batch_shape.len()) == shape::pad_rank(bb, batch_shape.len()) {
            kind(m, va, [m * k, k * n, m * n])
        } else {
            return Err(cx.err(format!("batch dims {ab:?} and {bb:?} broadcast partially; only equal or single batches are supported")));
        };
        Ok(self.device(cx, kind, out))
    }

    /// (pad_begin, pad_end) per spatial axis from pads/auto_pad.
    fn pads(&self, cx: &Cx, input: &[u64], kernel: &[u64], stride: &[u64], dil: &[u64]) -> Result<Vec<(u64, u64)>> {
        let sp = input.len();
        match cx.string("auto_pad").as_deref().unwrap_or("NOTSET") {
            "NOTSET" => {
                let p = cx.ints("pads").unwrap_or_else(|| vec![0; 2 * sp]);
                if p.len() != 2 * sp || p.iter().any(|&v| v < 0) {
                    return Err(cx.err(format!("pads {p:?}: {} non-negative values expected", 2 * sp)));
                }
                Ok((0..sp).map(|i| (p[i] as u64, p[i + sp] as u64)).collect())
            }
            "VALID" => Ok(vec![(0, 0); sp]),
            mode @ ("SAME_UPPER" | "SAME_LOWER") => Ok((0..sp)
                .map(|i| {
                    let out = input[i].div_ceil(stride[i]);
                    let need = ((out - 1) * stride[i] + (kernel[i] - 1) * dil[i] + 1).saturating_sub(input[i]);
                    let small = need / 2;
                    if mode == "SAME_UPPER" { (small, need - small) } else { (need - small, small) }
                })
                .collect()),
            other => Err(cx.err(format!("auto_pad '{other}' is not supported"))),
        }
    }

    fn spatial_attr(&self, cx: &Cx, name: &str, sp: usize) -> Result<Vec<u64>> {
        match cx.ints(name) {
            None => Ok(vec![1; sp]),
            Some(v) if v.len() == sp && v.iter().all(|&x| x > 0) => Ok(v.iter().map(|&x| x as u64).collect()),
            Some(v) => Err(cx.err(format!("{name} {v:?}: {sp} positive values expected"))),
        }
    }

/// Spatial geometry of a 1-D or 2-D sliding window, lifted to 2-D (a 1-D
    /// window is a 2-D one of height 1: the bytes are the same).
    fn window(&self, cx: &Cx, input: &[u64], kernel: &[u64]) -> Result<Window> {
        let sp = input.len();
        let stride = self.spatial_attr(cx, "strides", sp)?;
        let dil = self.spatial_attr(cx, "dilations", sp)?;
        let pads = self.pads(cx, input, kernel, &stride, &dil)?;
        let lift = |v: &[u64], one: u64| -> [u64; 2] { if sp == 1 { [one, v[0]] } else { [v[0], v[1]] } };
        Ok(Window {
            input: lift(input, 1),
            kernel: lift(kernel, 1),
            stride: lift(&stride, 1),
            dilation: lift(&dil, 1),
            pads: if sp == 1 { [(0, 0), pads[0]] } else { [pads[0], pads[1]] },
        })
    }

    fn conv(&mut self, cx: &Cx, x: ValueId, w: ValueId, bias: Option<ValueId>) -> Result<ValueId> {
        let sx = self.shape(x);
        let sw = self.shape(w);
        if !(sx.len() == 3 || sx.len() == 4) || sw.len() != sx.len() {
            return Err(cx.err(format!("input {sx:?} / weights {sw:?}: only 1-D and 2-D convolution (NCL / NCHW) is supported")));
        }
        let g = cx.int("group", 1).max(1) as u64;
        let (n, c, o) = (sx[0], sx[1], sw[0]);
        if c % g != 0 || o % g != 0 || sw[1] * g != c {
            return Err(cx.err(format!("weights {sw:?} do not fit {c} input channels in {g} groups")));
        }
        if let Some(ks) = cx.ints("kernel_shape") {
            if ks.iter().map(|&k| k as u64).ne(sw[2..].iter().copied()) {
                return Err(cx.err(format!("kernel_shape {ks:?} differs from the weights' {:?}", &sw[2..])));
            }
        }
        if let Some(bv) = bias {
            if self.shape(bv) != [o] {
                return Err(cx.err(format!("bias has shape {:?}; [{o}] expected", self.shape(bv))));
            }
        }
        let win = self.window(cx, &sx[2..], &sw[2..])?;
        let out_sp = win.output(cx)?;
        let kind = Kind::Conv {
            x, w, bias,
            dims: [n, c, win.input[0], win.input[1], o, win.kernel[0], win.kernel[1], g],
            stride: win.stride,
            dilation: win.dilation,
            pads: win.pad4(),
            residual: None,
            act: Act::NONE,
        };
        let mut out = vec![n, o];
        out.extend(&out_sp[2 - (sx.len() - 2)..]);
        Ok(self.device(cx, kind, out))
    }

    fn pool(&mut self, cx: &Cx, x: ValueId, max: bool) -> Result<ValueId> {
        let s = self.shape(x);
        if !(s.len() == 3 || s.len() == 4) {
            return Err(cx.err(format!("input {s:?}: only 1-D and 2-D pooling (NCL / NCHW) is supported")));
        }
        if cx.int("storage_order", 0) != 0 {
            return Err(cx.err("storage_order=1 is not supported"));
        }
        let sp = s.len() - 2;
        let k = self.spatial_attr(cx, "kernel_shape", sp)?;
        if cx.ints("kernel_shape").is_none() {
            return Err(cx.err("kernel_shape is missing"));
        }
        let mut win = self.window(cx, &s[2..], &k)?;
        let include_pad = !max && cx.int("count_include_pad", 0) != 0;
        if cx.int("ceil_mode", 0) != 0 {
            // Ceil mode = extra padding at the end, so the last window fits;
            // windows that would start in the end padding are dropped.
            for i in 0..2 {
                let (inp, st, p) = (win.input[i], win.stride[i], &mut win.pads[i]);
                let span = inp + p.0 + p.1;
                let eff = win.dilation[i] * (win.kernel[i] - 1) + 1;
                if span < eff {
                    return Err(cx.err("the kernel is larger than the padded input"));
                }
                let mut out = (span - eff).div_ceil(st) + 1;
                if (out - 1) * st >= inp + p.0 {
                    out -= 1;
                }
                let extra = ((out - 1) * st + eff).saturating_sub(span);
                if extra > 0 && include_pad {
                    return Err(cx.err("ceil_mode=1 with count_include_pad=1 is not supported"));
                }
                p.1 += extra;
            }
        }
        let out_sp = win.output(cx)?;
        let kind = Kind::Pool {
            x, max, count_include_pad: include_pad,
            dims: [s[0], s[1], win.input[0], win.input[1]],
            kernel: win.kernel,
            stride: win.stride,
            dilation: win.dilation,
            pads: win.pad4(),
        };
        let mut out = vec![s[0], s[1]];
        out.extend(&out_sp[2 - sp..]);
        Ok(self.device(cx, kind, out))
    }

    fn batch_norm(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<ValueId> {
        if cx.int("training_mode", 0) != 0 {
            return Err(cx.err("training_mode=1 is not supported (inference only)"));
        }
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let s = self.shape(x);
        if s.len() < 2 {
            return Err(cx.err(format!("input {s:?} has no channel axis")));
        }
        let c = s[1];
        let mut p = Vec::new();
        for i in 1..5 {
            let v = ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")))?;
            let k = self.need_const(cx, v, i)?;
            if k.len() as u64 != c {
                return Err(cx.err(format!("input {i} has {} values for {c} channels", k.len())));
            }
            p.push(k.floats());
        }
        let eps = cx.float("epsilon", 1e-5);
        // y = x * s + t with s = scale / sqrt(var + eps), t = bias - mean * s.
        let sc: Vec<f32> = (0..c as usize).map(|i| p[0][i] / (p[3][i] + eps).sqrt()).collect();
        let sh: Vec<f32> = (0..c as usize).map(|i| p[1][i] - p[2][i] * sc[i]).collect();
        let mut cshape = vec![c];
        cshape.extend(std::iter::repeat_n(1, s.len() - 2));
        let (sv, tv) = (
            self.constant(&format!("{}.scale", cx.name), Const::f32(&cshape, sc)),
            self.constant(&format!("{}.shift", cx.name), Const::f32(&cshape, sh)),
        );
        rank_ok(cx, &s, "the input")?;
        let padded = shape::pad_rank(&cshape, s.len());
        let t = self.device_tmp(cx, Kind::Binary { kind: Binary::Mul, a: x, b: sv, a_dims: s.clone(), b_dims: padded.clone(), act: Act::NONE }, s.clone(), "scaled");
        Ok(self.device(cx, Kind::Binary { kind: Binary::Add, a: t, b: tv, a_dims: s.clone(), b_dims: padded, act: Act::NONE }, s))
    }

    fn reduce(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<ValueId> {
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let s = self.shape(x);
        let op = cx.n.op_type.as_str();
        let axes_from_input = self.opset >= 18 || (op == "ReduceSum" && self.opset >= 13);
        let axes = if axes_from_input {
            match ins.get(1).copied().flatten() {
                Some(v) => Some(self.const_ints(cx, v, 1)?),
                None => None,
            }
        } else {
            cx.ints("axes")
        };
        let keep = cx.int("keepdims", 1) != 0;
        let device = matches!(op, "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin");
        let mut axes: Vec<usize> = match axes {
            Some(a) if !a.is_empty() => a.iter().map(|&v| cx.shape(shape::axis(v, s.len(), false))).collect::<Result<_>>()?,
            // No reduction. On constants each element is reduced alone
            // (ReduceSumSquare squares it, as onnxruntime does).
            _ if cx.int("noop_with_empty_axes", 0) != 0 => {
                if device && self.konst(x).is_none() {
                    return Ok(self.alias(cx, x));
                }
                let c = self.need_const(cx, x, 0)?;
                let c = cx.shape(fold::reduce(op, &c, &[], true))?;
                return Ok(self.constant(&Self::out_name(cx, 0), c));
            }
            _ => (0..s.len()).collect(),
        };
        axes.sort_unstable();
        axes.dedup();
        if !device || self.konst(x).is_some() {
            let c = self.need_const(cx, x, 0)?;
            let c = cx.shape(fold::reduce(op, &c, &axes, keep))?;
            return Ok(self.constant(&Self::out_name(cx, 0), c));
        }
        let out: Vec<u64> = if keep {
            s.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect()
        } else {
            s.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect()
        };
        let kind = match op {
            "ReduceMean" => REDUCE_MEAN,
            "ReduceSum" => REDUCE_SUM,
            "ReduceMax" => REDUCE_MAX,
            _ => REDUCE_MIN,
        };
        // Runs of adjacent axes reduce in one op ([outer, run, inner]),
        // last run first so the earlier axes keep their positions.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for &a in &axes {
            match runs.last_mut() {
                Some(r) if r.1 + 1 == a => r.1 = a,
                _ => runs.push((a, a)),
            }
        }
        let mut cur = s.clone();
        let mut v = x;
        for (i, &(a0, a1)) in runs.iter().enumerate().rev() {
            let dims = vec![volume(&cur[..a0]), volume(&cur[a0..=a1]), volume(&cur[a1 + 1..])];
            cur.drain(a0..=a1);
            let k = Kind::Reduce { kind, x: v, dims, axis: 1 };
            v = if i == 0 { self.device(cx, k, out.clone()) } else { self.device_tmp(cx, k, cur.clone(), &format!("axis{a0}")) };
        }
        Ok(v)
    }

    fn concat(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<ValueId> {
        let xs: Vec<ValueId> = ins.iter().flatten().copied().collect();
        let first = *xs.first().ok_or_else(|| cx.err("no inputs"))?;
        let s0 = self.shape(first);
        let a = cx.shape(shape::axis(cx.int("axis", 0), s0.len(), false))?;
        let mut out = s0.clone();
        out[a] = 0;
        for &x in &xs {
            let s = self.shape(x);
            if s.len() != s0.len() || s.iter().enumerate().any(|(i, &d)| i != a && d != s0[i]) {
                return Err(cx.err(format!("input shapes {s0:?} and {s:?} do not concatenate on axis {a}")));
            }
            out[a] += s[a];
        }
        if xs.iter().all(|&x| self.konst(x).is_some()) {
            let cs: Vec<&Const> = xs.iter().map(|&x| self.konst(x).expect("checked")).collect();
            let c = fold::concat(&cs, a, &out);
            return Ok(self.constant(&Self::out_name(cx, 0), c));
        }
        let (outer, inner) = (volume(&out[..a]), volume(&out[a + 1..]));
        let mut parts = Vec::new();
        let mut at = 0;
        for &x in &xs {
            let len = self.shape(x)[a];
            if len > 0 {
                parts.push(CopyPart {
                    src: x,
                    src_offset: 0,
                    dst_offset: at * inner,
                    sizes: vec![outer, len * inner],
                    src_strides: vec![len * inner, 1],
                    dst_strides: vec![out[a] * inner, 1],
                });
            }
            at += len;
        }
        Ok(self.device(cx, Kind::Copy { parts }, out))
    }

    /// Output `i` is the box (start, step, shape `out`) of `x`.
    fn slice_out(&mut self, cx: &Cx, i: usize, x: ValueId, out: &[u64], start: &[u64], step: &[u64]) -> Result<ValueId> {
        let s = self.shape(x);
        let st = strides(&s);
        let src_strides: Vec<u64> = st.iter().zip(step).map(|(a, b)| a * b).collect();
        let offset: u64 = st.iter().zip(start).map(|(a, b)| a * b).sum();
        if let Some(c) = self.konst(x) {
            let c = fold::pick(c, &shape::box_indices(out, &src_strides, offset), out);
            return Ok(self.constant(&Self::out_name(cx, i), c));
        }
        if out == s.as_slice() {
            return Ok(self.device_out(cx, i, Kind::View { x }, s));
        }
        rank_ok(cx, &s, "the input")?;
        let part = CopyPart { src: x, src_offset: offset, dst_offset: 0, sizes: out.to_vec(), src_strides, dst_strides: strides(out) };
        Ok(self.device_out(cx, i, Kind::Copy { parts: vec![part] }, out.to_vec()))
    }

    fn split(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let s = self.shape(x);
        let a = cx.shape(shape::axis(cx.int("axis", 0), s.len(), false))?;
        let outs = cx.n.output.len() as u64;
        let sizes: Vec<u64> = match (ins.get(1).copied().flatten(), cx.ints("split")) {
            (Some(v), _) => self.const_ints(cx, v, 1)?.iter().map(|&d| d.max(0) as u64).collect(),
            (None, Some(sp)) => sp.iter().map(|&d| d.max(0) as u64).collect(),
            (None, None) => {
                let parts = cx.int("num_outputs", outs as i64).max(1) as u64;
                let each = s[a].div_ceil(parts);
                (0..parts).map(|i| each.min(s[a].saturating_sub(i * each))).collect()
            }
        };
        if sizes.iter().sum::<u64>() != s[a] || sizes.len() as u64 != outs {
            return Err(cx.err(format!("split sizes {sizes:?} do not cover axis {a} of {s:?} with {outs} outputs")));
        }
        let mut res = Vec::new();
        let mut at = 0;
        for (i, &len) in sizes.iter().enumerate() {
            let mut out = s.clone();
            out[a] = len;
            let mut start = vec![0; s.len()];
            start[a] = at;
            res.push(self.slice_out(cx, i, x, &out, &start, &vec![1; s.len()])?);
            at += len;
        }
        Ok(res)
    }

    fn gather(&mut self, cx: &Cx, data: ValueId, indices: ValueId) -> Result<ValueId> {
        let s = self.shape(data);
        let a = cx.shape(shape::axis(cx.int("axis", 0), s.len(), false))?;
        let Some(idx) = self.konst(indices).cloned() else {
            return self.gather_run_time(cx, data, indices, s, a);
        };
        if idx.is_float() {
            return Err(cx.err("indices must be integers"));
        }
        let d = s[a] as i64;
        let mut norm = Vec::with_capacity(idx.len());
        for &i in &idx.ints() {
            if i < -d || i >= d {
                return Err(cx.err(format!("index {i} is out of range for axis {a} of size {d}")));
            }
            norm.push(if i < 0 { i + d } else { i });
        }
        let mut out: Vec<u64> = s[..a].to_vec();
        out.extend(&idx.shape);
        out.extend(&s[a + 1..]);
        if let Some(c) = self.konst(data) {
            let (outer, inner) = (volume(&s[..a]), volume(&s[a + 1..]));
            let mut pick = Vec::new();
            for o in 0..outer {
                for &i in &norm {
                    for k in 0..inner {
                        pick.push(((o * s[a] + i as u64) * inner + k) as usize);
                    }
                }
            }
            let c = fold::pick(c, &pick, &out);
            return Ok(self.constant(&Self::out_name(cx, 0), c));
        }
        rank_ok(cx, &s, "the data")?;
        let iv = self.constant(&format!("{}.indices", cx.name), Const::i64(&idx.shape, norm));
        let kind = Kind::Gather { data, indices: iv, dims: s, axis: a as u64, count: idx.len() as u64 };
        Ok(self.device(cx, kind, out))
    }
}

impl Importer {
    /// Gather with indices known only at run time (token ids): the device
    /// bounds-checks every index; a model input used as indices also gets
    /// the value range the runtime checks before submitting.
    fn gather_run_time(&mut self, cx: &Cx, data: ValueId, indices: ValueId, s: Vec<u64>, a: usize) -> Result<ValueId> {
        let it = self.g.values[indices].dtype;
        if !matches!(it, DType::I32 | DType::I64) {
            return Err(cx.err(format!(
                "indices '{}' are {} at run time; run-time indices must be int32 or int64 (a model input or a cast of one)",
                self.g.values[indices].name,
                it.name()
            )));
        }
        rank_ok(cx, &s, "the data")?;
        let ishape = self.shape(indices);
        let mut out: Vec<u64> = s[..a].to_vec();
        out.extend(&ishape);
        out.extend(&s[a + 1..]);
        rank_ok(cx, &out, "the output")?;
        if let Some(input) = self.input_behind(indices) {
            let d = s[a] as i64;
            self.g.restrict_range(input, -d, d);
        }
        let count = volume(&ishape);
        let kind = Kind::Gather { data, indices, dims: s, axis: a as u64, count };
        Ok(self.device(cx, kind, out))
    }
}

/// A sliding window in 2-D (see `Importer::window`).
struct Window {
    input: [u64; 2],
    kernel: [u64; 2],
    stride: [u64; 2],
    dilation: [u64; 2],
    /// (begin, end) per spatial axis.
    pads: [(u64, u64); 2],
}

impl Window {
    /// Output height and width.
    fn output(&self, cx: &Cx) -> Result<[u64; 2]> {
        let mut o = [0; 2];
        for (i, v) in o.iter_mut().enumerate() {
            *v = out_len(self.input[i], self.kernel[i], self.stride[i], self.dilation[i], self.pads[i])
                .ok_or_else(|| cx.err("the kernel is larger than the padded input"))?;
        }
        Ok(o)
    }
    /// Pads as the descriptors order them: top, left, bottom, right.
    fn pad4(&self) -> [u64; 4] {
        [self.pads[0].0, self.pads[1].0, self.pads[0].1, self.pads[1].1]
    }
}

/// Output length of a sliding window; None when the window does not fit.
fn out_len(input: u64, k: u64, stride: u64, dil: u64, (pb, pe): (u64, u64)) -> Option<u64> {
    let span = input + pb + pe;
    let eff = dil * (k.checked_sub(1)?) + 1;
    Some(span.checked_sub(eff)? / stride + 1)
}

/// Whether a permutation keeps every dim larger than 1 in order, so the
/// bytes do not move.
fn moves_only_unit_dims(shape: &[u64], perm: &[usize]) -> bool {
    let order: Vec<usize> = perm.iter().copied().filter(|&p| shape[p] != 1).collect();
    order.windows(2).all(|w| w[0] < w[1])
}
