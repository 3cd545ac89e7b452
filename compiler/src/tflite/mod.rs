//! TFLite front end: a float32 `.tflite` model (flatbuffer, identifier
//! "TFL3") translated into the compiler's in-memory ONNX structures, which
//! then go through the same import, fusion and emission as an ONNX file.
//!
//! - [`schema`]: typed, verified accessors for the TFLite schema tables.
//! - this module: reads the model (tensors, constants from buffers, the
//!   operator list of subgraph 0), checks what the translation needs
//!   (float32 / int32 / int64 / bool tensors, int8 / uint8 ones with affine
//!   quantisation; no sparsity, variables or external buffers), and drives
//!   [`ops`].
//!
//! Quantised models (int8 or uint8 tensors with scales and zero points, as
//! the TFLite converter writes them from a representative dataset) become
//! QDQ graphs: each quantised tensor is held as its 8-bit value, and the
//! ops read it through a DequantizeLinear and write it through a
//! QuantizeLinear, exactly as onnxruntime's QDQ format. The compiler's
//! int8 lowering then runs each quantised convolution and fully connected
//! layer on the integer kernels with the requantisation fused; the other
//! ops compute in f32 on the dequantised values (float islands).
//! - [`ops`]: one ONNX node sequence per TFLite operator.
//!
//! Layout: TFLite activations are NHWC; the translated graph holds every
//! 4-D activation in NCHW form when that is what its producer computes
//! (convolutions, pools, resizes and the element-wise ops between them),
//! and converts with one Transpose only where an op depends on the memory
//! order (RESHAPE, FULLY_CONNECTED, BATCH_MATMUL, ...) or at the model's
//! 4-D inputs and outputs, whose interface stays NHWC exactly as in the
//! TFLite file. Constants are re-laid-out at compile time.

pub mod ops;
pub mod schema;

use std::collections::HashMap;

use crate::error::{CompileError, Result};
use crate::ir::{Const, Data};
use crate::onnx::{
    elem, AttributeProto, Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto,
    TypeProto, TypeProtoTensor, ValueInfoProto,
};

/// What quantised tensors rbln-compile takes (said when refusing one).
pub const QUANTIZED: &str =
    "rbln-compile takes int8 and uint8 tensors with per-tensor quantisation (per-channel for constants) and int32 constants quantised as biases";

/// The ONNX opset the translation writes.
pub const OPSET: i64 = 17;

/// `TensorType` codes of the schema.
pub mod ty {
    pub const FLOAT32: i8 = 0;
    pub const FLOAT16: i8 = 1;
    pub const INT32: i8 = 2;
    pub const UINT8: i8 = 3;
    pub const INT64: i8 = 4;
    pub const BOOL: i8 = 6;
    pub const INT16: i8 = 7;
    pub const INT8: i8 = 9;

    pub fn name(t: i8) -> &'static str {
        const NAMES: [&str; 23] = [
            "float32", "float16", "int32", "uint8", "int64", "string", "bool", "int16", "complex64", "int8", "float64",
            "complex128", "uint64", "resource", "variant", "uint32", "uint16", "int4", "bfloat16", "int2", "uint4",
            "float8_e4m3fn", "float8_e5m2",
        ];
        usize::try_from(t).ok().and_then(|i| NAMES.get(i).copied()).unwrap_or("unknown")
    }

    /// The ONNX element type of a TFLite type the translation keeps.
    pub fn onnx(t: i8) -> Option<i32> {
        use crate::onnx::elem;
        match t {
            FLOAT32 => Some(elem::FLOAT),
            INT32 => Some(elem::INT32),
            INT64 => Some(elem::INT64),
            BOOL => Some(elem::BOOL),
            _ => None,
        }
    }

    pub fn is_quantized(t: i8) -> bool {
        matches!(t, UINT8 | INT8 | INT16) || t == 17 || t == 19 || t == 20
    }

    /// The ONNX element type of a tensor carried quantised (its 8-bit
    /// value, or an int32 bias).
    pub fn onnx_quantized(t: i8) -> Option<i32> {
        use crate::onnx::elem;
        match t {
            INT8 => Some(elem::INT8),
            UINT8 => Some(elem::UINT8),
            INT32 => Some(elem::INT32),
            _ => None,
        }
    }
}

/// `BuiltinOperator` names, by code (0..=209); `None` for gaps.
pub fn op_name(code: i32) -> Option<&'static str> {
    const NAMES: &[&str] = &[
        "ADD", "AVERAGE_POOL_2D", "CONCATENATION", "CONV_2D", "DEPTHWISE_CONV_2D", "DEPTH_TO_SPACE", "DEQUANTIZE", "EMBEDDING_LOOKUP",
        "FLOOR", "FULLY_CONNECTED", "HASHTABLE_LOOKUP", "L2_NORMALIZATION", "L2_POOL_2D", "LOCAL_RESPONSE_NORMALIZATION", "LOGISTIC",
        "LSH_PROJECTION", "LSTM", "MAX_POOL_2D", "MUL", "RELU", "RELU_N1_TO_1", "RELU6", "RESHAPE", "RESIZE_BILINEAR", "RNN", "SOFTMAX",
        "SPACE_TO_DEPTH", "SVDF", "TANH", "CONCAT_EMBEDDINGS", "SKIP_GRAM", "CALL", "CUSTOM", "EMBEDDING_LOOKUP_SPARSE", "PAD",
        "UNIDIRECTIONAL_SEQUENCE_RNN", "GATHER", "BATCH_TO_SPACE_ND", "SPACE_TO_BATCH_ND", "TRANSPOSE", "MEAN", "SUB", "DIV", "SQUEEZE",
        "UNIDIRECTIONAL_SEQUENCE_LSTM", "STRIDED_SLICE", "BIDIRECTIONAL_SEQUENCE_RNN", "EXP", "TOPK_V2", "SPLIT", "LOG_SOFTMAX",
        "DELEGATE", "BIDIRECTIONAL_SEQUENCE_LSTM", "CAST", "PRELU", "MAXIMUM", "ARG_MAX", "MINIMUM", "LESS", "NEG", "PADV2", "GREATER",
        "GREATER_EQUAL", "LESS_EQUAL", "SELECT", "SLICE", "SIN", "TRANSPOSE_CONV", "SPARSE_TO_DENSE", "TILE", "EXPAND_DIMS", "EQUAL",
        "NOT_EQUAL", "LOG", "SUM", "SQRT", "RSQRT", "SHAPE", "POW", "ARG_MIN", "FAKE_QUANT", "REDUCE_PROD", "REDUCE_MAX", "PACK",
        "LOGICAL_OR", "ONE_HOT", "LOGICAL_AND", "LOGICAL_NOT", "UNPACK", "REDUCE_MIN", "FLOOR_DIV", "REDUCE_ANY", "SQUARE", "ZEROS_LIKE",
        "FILL", "FLOOR_MOD", "RANGE", "RESIZE_NEAREST_NEIGHBOR", "LEAKY_RELU", "SQUARED_DIFFERENCE", "MIRROR_PAD", "ABS", "SPLIT_V",
        "UNIQUE", "CEIL", "REVERSE_V2", "ADD_N", "GATHER_ND", "COS", "WHERE", "RANK", "ELU", "REVERSE_SEQUENCE", "MATRIX_DIAG",
        "QUANTIZE", "MATRIX_SET_DIAG", "ROUND", "HARD_SWISH", "IF", "WHILE", "NON_MAX_SUPPRESSION_V4", "NON_MAX_SUPPRESSION_V5",
        "SCATTER_ND", "SELECT_V2", "DENSIFY", "SEGMENT_SUM", "BATCH_MATMUL", "PLACEHOLDER_FOR_GREATER_OP_CODES", "CUMSUM", "CALL_ONCE",
        "BROADCAST_TO", "RFFT2D", "CONV_3D", "IMAG", "REAL", "COMPLEX_ABS", "HASHTABLE", "HASHTABLE_FIND", "HASHTABLE_IMPORT",
        "HASHTABLE_SIZE", "REDUCE_ALL", "CONV_3D_TRANSPOSE", "VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "BROADCAST_ARGS",
        "RANDOM_STANDARD_NORMAL", "BUCKETIZE", "RANDOM_UNIFORM", "MULTINOMIAL", "GELU", "DYNAMIC_UPDATE_SLICE", "RELU_0_TO_1",
        "UNSORTED_SEGMENT_PROD", "UNSORTED_SEGMENT_MAX", "UNSORTED_SEGMENT_SUM", "ATAN2", "UNSORTED_SEGMENT_MIN", "SIGN", "BITCAST",
        "BITWISE_XOR", "RIGHT_SHIFT",
    ];
    if (162..=209).contains(&code) {
        return Some("STABLEHLO_*");
    }
    usize::try_from(code).ok().and_then(|i| NAMES.get(i).copied())
}

/// One TFLite tensor as the translation sees it.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// The file's name (may be empty or repeated).
    pub name: String,
    /// A unique ONNX value name for its plain (TFLite-layout) form.
    pub uname: String,
    pub shape: Vec<i64>,
    pub ty: i8,
    /// Data from its buffer (float16 widened to f32; integers as i64).
    pub konst: Option<Const>,
    /// A quantized tensor (int8 etc.) or one with quantization scales.
    pub quantized: bool,
    /// Its affine quantisation, when the translation carries it as QDQ.
    pub q: Option<QParams>,
}

/// Affine quantisation of a tensor: `real = scale·(q − zero)`, per tensor
/// (one entry) or along axis `dim` (one entry per index).
#[derive(Clone, Debug, PartialEq)]
pub struct QParams {
    pub scale: Vec<f32>,
    pub zero: Vec<i64>,
    pub dim: usize,
}

/// The quantisation parameters of a tensor, checked; `Ok(None)` when it
/// has none or is of a type not carried as QDQ (refused later, where used).
fn read_qparams(t: &schema::Tensor<'_>, shape: &[i64]) -> std::result::Result<Option<QParams>, String> {
    let Some(qp) = t.quantization() else { return Ok(None) };
    let scale: Vec<f32> = qp.scale().map(|s| s.iter().collect()).unwrap_or_default();
    if scale.is_empty() {
        return Ok(None);
    }
    if qp.details_type() != 0 {
        return Err(format!("uses a custom quantisation scheme (details type {})", qp.details_type()));
    }
    let Some(et) = ty::onnx_quantized(t.tensor_type()) else { return Ok(None) };
    if let Some(s) = scale.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        return Err(format!("has quantisation scale {s}; scales must be finite and positive"));
    }
    let mut zero: Vec<i64> = qp.zero_point().map(|z| z.iter().collect()).unwrap_or_default();
    if zero.is_empty() {
        zero = vec![0; scale.len()];
    }
    if zero.len() != scale.len() {
        return Err(format!("has {} quantisation scales but {} zero points", scale.len(), zero.len()));
    }
    let (lo, hi) = match et {
        crate::onnx::elem::INT8 => (-128, 127),
        crate::onnx::elem::UINT8 => (0, 255),
        _ => (0, 0), // int32 biases: zero point 0
    };
    if let Some(z) = zero.iter().find(|&&z| z < lo || z > hi) {
        return Err(format!("has zero point {z}, outside {lo}..={hi} of {}", ty::name(t.tensor_type())));
    }
    let dim = usize::try_from(qp.quantized_dimension()).map_err(|_| format!("has quantized_dimension {}", qp.quantized_dimension()))?;
    if scale.len() > 1 && shape.get(dim) != Some(&(scale.len() as i64)) {
        return Err(format!("has {} quantisation scales along axis {dim}, but its shape is {shape:?}", scale.len()));
    }
    Ok(Some(QParams { scale, zero, dim }))
}

impl TensorInfo {
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// The declared shape as u64 (negative dims are refused at read time
    /// for every tensor the translation uses).
    pub fn dims(&self) -> Vec<u64> {
        self.shape.iter().map(|&d| d.max(0) as u64).collect()
    }
}

/// One operator of subgraph 0.
#[derive(Clone, Debug)]
pub struct OpInfo {
    pub index: usize,
    pub code: i32,
    /// The builtin name, or `CUSTOM 'code'`.
    pub name: String,
    /// Input tensor indices; `None` for an omitted optional input (-1).
    pub inputs: Vec<Option<usize>>,
    pub outputs: Vec<usize>,
    /// Its builtin options (schema defaults when absent).
    pub opts: ops::OptionsRef,
}

/// The translated model and what maps its nodes back to TFLite operators.
pub struct Translated {
    pub model: ModelProto,
    /// Operators in subgraph 0.
    pub operators: usize,
    pub version: u32,
    pub description: String,
    /// ONNX node name -> (operator index, first output name, op name).
    node_ops: ops::NodeOps,
}

impl Translated {
    /// An import error about a translated node, restated as an error about
    /// the TFLite operator it came from.
    pub fn map_error(&self, e: CompileError) -> CompileError {
        match e {
            CompileError::Unsupported { node, op, reason } => match self.node_ops.get(&node) {
                Some((index, name, tfl_op)) => CompileError::TfliteOp {
                    index: *index,
                    name: name.clone(),
                    op: tfl_op.clone(),
                    reason: format!("{reason} (in its ONNX {op} form)"),
                },
                None => CompileError::Unsupported { node, op, reason },
            },
            other => other,
        }
    }
}

/// True when the bytes carry the TFLite file identifier.
pub fn is_tflite(bytes: &[u8]) -> bool {
    bytes.get(4..8) == Some(schema::IDENTIFIER.as_slice())
}

fn decode_err(msg: impl Into<String>) -> CompileError {
    CompileError::TfliteDecode(msg.into())
}

/// Read and translate a TFLite file.
pub fn translate(bytes: &[u8]) -> Result<Translated> {
    if bytes.len() < 8 {
        return Err(decode_err(format!("the file is {} bytes long, too short for a flatbuffer", bytes.len())));
    }
    if !is_tflite(bytes) {
        return Err(decode_err(format!(
            "no \"TFL3\" file identifier at bytes 4..8 (found {:02x?})",
            &bytes[4..8]
        )));
    }
    let model = schema::root(bytes)
        .map_err(|e| decode_err(format!("the flatbuffer does not verify: {}", e.to_string().replace(".\n\t", "; ").replace("\n\t", "; ").trim_end())))?;
    let subgraphs = model.subgraphs().ok_or_else(|| decode_err("the model has no subgraphs"))?;
    if subgraphs.is_empty() {
        return Err(decode_err("the model has no subgraphs"));
    }
    let sg = subgraphs.get(0);
    let buffers = model.buffers();
    let codes = model.operator_codes();

    // Tensors, with constants read from their buffers.
    let ts = sg.tensors().ok_or_else(|| decode_err("subgraph 0 has no tensor list"))?;
    let mut tensors = Vec::with_capacity(ts.len());
    let mut used_names: HashMap<String, usize> = HashMap::new();
    for (i, t) in ts.iter().enumerate() {
        let name = t.name().unwrap_or("").to_string();
        let base = if name.is_empty() { format!("tensor{i}") } else { name.clone() };
        let n = used_names.entry(base.clone()).or_insert(0);
        *n += 1;
        let uname = if *n == 1 { base } else { format!("{base}#t{i}") };
        let shape: Vec<i64> = t.shape().map(|s| s.iter().map(i64::from).collect()).unwrap_or_default();
        let quant = t.quantization().is_some_and(|q| q.scale().is_some_and(|s| !s.is_empty()));
        let q = read_qparams(&t, &shape).map_err(|reason| CompileError::BadTensor { name: name.clone(), reason })?;
        let mut info = TensorInfo { name, uname, shape, ty: t.tensor_type(), konst: None, quantized: ty::is_quantized(t.tensor_type()) || quant, q };
        let bad = |reason: String| CompileError::BadTensor { name: info.name.clone(), reason };
        if t.sparsity().is_some() {
            return Err(bad("is sparse (TFLite sparsity parameters); rbln-compile reads dense tensors only".into()));
        }
        if t.external_buffer() != 0 {
            return Err(bad("its data is in an external buffer group, which rbln-compile does not read".into()));
        }
        if t.is_variable() {
            return Err(bad("is a variable tensor (stateful models are not supported)".into()));
        }
        let b = t.buffer() as usize;
        if b != 0 {
            let buffers = buffers.ok_or_else(|| bad(format!("refers to buffer {b} but the model has no buffer list")))?;
            if b >= buffers.len() {
                return Err(bad(format!("refers to buffer {b}, out of range (the model has {})", buffers.len())));
            }
            let buf = buffers.get(b);
            let data: &[u8] = if buf.offset() > 1 {
                let start = usize::try_from(buf.offset()).map_err(|_| bad("buffer offset does not fit in memory".into()))?;
                let size = usize::try_from(buf.size()).map_err(|_| bad("buffer size does not fit in memory".into()))?;
                start
                    .checked_add(size)
                    .and_then(|end| bytes.get(start..end))
                    .ok_or_else(|| bad(format!("buffer {b} (offset {start}, size {size}) lies outside the {}-byte file", bytes.len())))?
            } else {
                buf.data().map(|d| d.bytes()).unwrap_or(&[])
            };
            if !data.is_empty() {
                info.konst = Some(read_const(&info, data).map_err(bad)?);
            }
        }
        tensors.push(info);
    }

    // Operators.
    let op_list = sg.operators().map(|o| o.iter().collect::<Vec<_>>()).unwrap_or_default();
    let tensor_index = |v: i32, what: &str| -> Result<usize> {
        usize::try_from(v).ok().filter(|&i| i < tensors.len()).ok_or_else(|| {
            decode_err(format!("{what} refers to tensor {v}, out of range (subgraph 0 has {} tensors)", tensors.len()))
        })
    };
    let mut op_infos = Vec::with_capacity(op_list.len());
    for (index, o) in op_list.iter().enumerate() {
        let ci = o.opcode_index() as usize;
        let oc = codes
            .filter(|c| ci < c.len())
            .map(|c| c.get(ci))
            .ok_or_else(|| decode_err(format!("operator {index} uses operator code {ci}, out of range")))?;
        let code = i32::from(oc.deprecated_builtin_code()).max(oc.builtin_code());
        let name = if code == 32 {
            format!("CUSTOM '{}'", oc.custom_code().unwrap_or(""))
        } else {
            op_name(code).map_or_else(|| format!("BUILTIN_{code}"), str::to_string)
        };
        let mut inputs = Vec::new();
        for (k, v) in o.inputs().iter().flat_map(|v| v.iter()).enumerate() {
            inputs.push(if v < 0 { None } else { Some(tensor_index(v, &format!("operator {index} ({name}) input {k}"))?) });
        }
        let mut outputs = Vec::new();
        for (k, v) in o.outputs().iter().flat_map(|v| v.iter()).enumerate() {
            outputs.push(tensor_index(v, &format!("operator {index} ({name}) output {k}"))?);
        }
        if outputs.is_empty() {
            return Err(decode_err(format!("operator {index} ({name}) has no outputs")));
        }
        let opts = ops::OptionsRef::read(o, code);
        op_infos.push(OpInfo { index, code, name, inputs, outputs, opts });
    }

    let mut graph_inputs = Vec::new();
    for v in sg.inputs().iter().flat_map(|v| v.iter()) {
        graph_inputs.push(tensor_index(v, "subgraph 0's input list")?);
    }
    let mut graph_outputs = Vec::new();
    for v in sg.outputs().iter().flat_map(|v| v.iter()) {
        graph_outputs.push(tensor_index(v, "subgraph 0's output list")?);
    }

    let mut lw = ops::Lowering::new(tensors);
    let mut inputs_vi = Vec::new();
    for &t in &graph_inputs {
        let info = &lw.tensors[t];
        if info.konst.is_some() {
            continue;
        }
        let what = if info.name.is_empty() { format!("input {t}") } else { format!("input '{}'", info.name) };
        let quantized_input = info.q.as_ref().filter(|q| q.scale.len() == 1 && matches!(info.ty, ty::INT8 | ty::UINT8));
        if info.quantized && quantized_input.is_none() {
            return Err(CompileError::Invalid(format!("{what} is {} (quantized) without per-tensor parameters: {QUANTIZED}", ty::name(info.ty))));
        }
        let Some(et) = ty::onnx(info.ty).or(quantized_input.and_then(|_| ty::onnx_quantized(info.ty))) else {
            return Err(CompileError::Invalid(format!(
                "{what} is {}; rbln-compile takes float32, int32, int64 or bool inputs",
                ty::name(info.ty)
            )));
        };
        if let Some(&d) = info.shape.iter().find(|&&d| d <= 0) {
            return Err(CompileError::Invalid(format!("{what} has dimension {d} in shape {:?}; static positive dims are needed", info.shape)));
        }
        inputs_vi.push(value_info(&info.uname, et, &info.shape));
        lw.set_input(t);
    }
    for op in &op_infos {
        lw.lower_op(op)?;
    }
    let mut outputs_vi = Vec::new();
    for &t in &graph_outputs {
        let info = lw.tensors[t].clone();
        let et = match &info.q {
            Some(q) if q.scale.len() == 1 && info.konst.is_none() && matches!(info.ty, ty::INT8 | ty::UINT8) => ty::onnx_quantized(info.ty),
            _ => ty::onnx(info.ty),
        };
        let et = et.ok_or_else(|| {
            CompileError::Invalid(format!("output '{}' is {}; outputs must be float32, int32, int64, bool or quantised int8/uint8", info.name, ty::name(info.ty)))
        })?;
        let name = lw.plain_output(t)?;
        outputs_vi.push(value_info(&name, et, &info.shape));
    }
    let (nodes, initializers, node_ops) = lw.finish();
    let graph = GraphProto {
        node: nodes,
        name: sg.name().unwrap_or("main").to_string(),
        initializer: initializers,
        input: inputs_vi,
        output: outputs_vi,
        sparse_initializer: vec![],
    };
    let model_proto = ModelProto {
        ir_version: 8,
        producer_name: "tflite".into(),
        producer_version: String::new(),
        graph: Some(graph),
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: OPSET }],
        functions: vec![],
    };
    Ok(Translated {
        model: model_proto,
        operators: op_infos.len(),
        version: model.version(),
        description: model.description().unwrap_or("").to_string(),
        node_ops,
    })
}

/// A constant's data from its buffer bytes: the size must match its shape
/// and type exactly.
fn read_const(info: &TensorInfo, data: &[u8]) -> std::result::Result<Const, String> {
    let mut shape = Vec::with_capacity(info.shape.len());
    for &d in &info.shape {
        shape.push(u64::try_from(d).map_err(|_| format!("constant with negative dimension {d} in shape {:?}", info.shape))?);
    }
    let count = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).ok_or("too many elements")?;
    let width: u64 = match info.ty {
        ty::FLOAT32 | ty::INT32 => 4,
        ty::INT64 => 8,
        ty::FLOAT16 | ty::INT16 => 2,
        ty::BOOL | ty::INT8 | ty::UINT8 => 1,
        t => return Err(format!("constant of type {} is not supported", ty::name(t))),
    };
    if count.checked_mul(width) != Some(data.len() as u64) {
        return Err(format!(
            "its buffer holds {} bytes but shape {:?} of {} needs {}",
            data.len(),
            info.shape,
            ty::name(info.ty),
            count.saturating_mul(width)
        ));
    }
    let le4 = |c: &[u8]| [c[0], c[1], c[2], c[3]];
    let d = match info.ty {
        ty::FLOAT32 => Data::F(data.chunks_exact(4).map(|c| f32::from_le_bytes(le4(c))).collect()),
        ty::FLOAT16 => Data::F(data.chunks_exact(2).map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect()),
        ty::INT32 => Data::I(data.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes(le4(c)))).collect()),
        ty::INT64 => Data::I(data.chunks_exact(8).map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect()),
        ty::INT16 => Data::I(data.chunks_exact(2).map(|c| i64::from(i16::from_le_bytes([c[0], c[1]]))).collect()),
        ty::INT8 => Data::I(data.iter().map(|&b| i64::from(b as i8)).collect()),
        _ => Data::I(data.iter().map(|&b| i64::from(b)).collect()),
    };
    Ok(Const { shape, data: d })
}

/// IEEE binary16 to f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // subnormal: m * 2^-24
            let v = m as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

fn value_info(name: &str, elem_type: i32, shape: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type,
                shape: Some(TensorShapeProto { dim: shape.iter().map(|&d| Dimension { dim_value: Some(d), dim_param: None }).collect() }),
            }),
        }),
    }
}

/// ONNX attribute builders.
pub fn attr_i(name: &str, i: i64) -> AttributeProto {
    AttributeProto { name: name.into(), i, r#type: 2, ..Default::default() }
}
pub fn attr_f(name: &str, f: f32) -> AttributeProto {
    AttributeProto { name: name.into(), f, r#type: 1, ..Default::default() }
}
pub fn attr_ints(name: &str, ints: Vec<i64>) -> AttributeProto {
    AttributeProto { name: name.into(), ints, r#type: 7, ..Default::default() }
}
pub fn attr_s(name: &str, s: &str) -> AttributeProto {
    AttributeProto { name: name.into(), s: s.as_bytes().to_vec(), r#type: 3, ..Default::default() }
}

/// An ONNX initializer from a constant (`elem_type` FLOAT, INT32, INT64,
/// BOOL, INT8 or UINT8).
pub fn initializer(name: &str, c: &Const, elem_type: i32) -> TensorProto {
    let dims = c.shape.iter().map(|&d| d as i64).collect();
    let mut t = TensorProto { name: name.to_string(), dims, data_type: elem_type, ..Default::default() };
    match elem_type {
        elem::FLOAT => t.float_data = c.floats(),
        elem::INT64 => t.int64_data = c.ints(),
        _ => t.int32_data = c.ints().iter().map(|&v| v as i32).collect(),
    }
    t
}

/// A node with its attributes.
pub fn node(op: &str, name: &str, inputs: Vec<String>, outputs: Vec<String>, attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto { input: inputs, output: outputs, name: name.into(), op_type: op.into(), attribute: attrs, domain: String::new() }
}

#[cfg(test)]
mod tests;
