//! Tensors of the protocol: datatypes, the model's input/output
//! signature, and turning request inputs (JSON `data`, binary extension
//! bytes, gRPC raw or typed contents) into runtime tensors checked against
//! the model, and runtime outputs back into response tensors.

use rbln_runtime::{Data, Tensor};
use serde_json::Value;

use crate::error::{Result, ServeError};

/// The protocol datatypes this server passes (the runtime's f32, i32,
/// i64, i8, u8 and bool tensors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    Fp32,
    Int32,
    Int64,
    Int8,
    Uint8,
    Bool,
}

/// Datatype names of the protocol that this server knows but no model
/// here can take (so the error can say "unsupported", not "unknown").
const OTHER_DATATYPES: &[&str] = &["BYTES", "UINT16", "UINT32", "UINT64", "INT16", "FP16", "BF16", "FP64"];

impl DataType {
    /// The protocol's name: FP32, INT32, INT64, INT8, UINT8, BOOL.
    pub fn name(self) -> &'static str {
        match self {
            DataType::Fp32 => "FP32",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Int8 => "INT8",
            DataType::Uint8 => "UINT8",
            DataType::Bool => "BOOL",
        }
    }

    /// Parse a protocol datatype name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "FP32" => DataType::Fp32,
            "INT32" => DataType::Int32,
            "INT64" => DataType::Int64,
            "INT8" => DataType::Int8,
            "UINT8" => DataType::Uint8,
            "BOOL" => DataType::Bool,
            _ => return None,
        })
    }

    /// The datatype of a model tensor (`rbln_format::DType::name`).
    pub fn from_model(dtype: &str) -> Option<Self> {
        Some(match dtype {
            "f32" => DataType::Fp32,
            "i32" => DataType::Int32,
            "i64" => DataType::Int64,
            "i8" => DataType::Int8,
            "u8" => DataType::Uint8,
            "bool" => DataType::Bool,
            _ => return None,
        })
    }

    /// Bytes of one element in the binary (raw) encoding.
    pub fn size(self) -> usize {
        match self {
            DataType::Fp32 | DataType::Int32 => 4,
            DataType::Int64 => 8,
            DataType::Int8 | DataType::Uint8 | DataType::Bool => 1,
        }
    }

    pub fn of(data: &Data) -> Self {
        match data {
            Data::F32(_) => DataType::Fp32,
            Data::I32(_) => DataType::Int32,
            Data::I64(_) => DataType::Int64,
            Data::I8(_) => DataType::Int8,
            Data::U8(_) => DataType::Uint8,
            Data::Bool(_) => DataType::Bool,
        }
    }
}

/// One input or output of a model as the protocol describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
    /// Values an integer input may hold (`lo..hi`), if the model says.
    pub range: Option<(i64, i64)>,
}

impl TensorSpec {
    pub fn elements(&self) -> usize {
        self.shape.iter().map(|&d| d.max(0) as usize).product()
    }

    pub fn metadata_json(&self) -> Value {
        serde_json::json!({ "name": self.name, "datatype": self.datatype.name(), "shape": self.shape })
    }
}

/// A model's signature.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    /// Dynamic batching: every input's and output's leading dimension is
    /// then -1 here (any of 1 to `max_rows` rows per request).
    pub batching: Option<Batching>,
}

/// A batched model's row counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batching {
    /// Most rows a request, or a run, carries (config `max_batch_size`).
    pub max_rows: usize,
    /// The leading dimension the model was compiled with (a run is padded
    /// to it).
    pub compiled_rows: usize,
}

impl ModelSpec {
    /// From the runtime's model description; fails for tensors of a dtype
    /// the runtime cannot pass.
    pub fn from_info(info: &rbln_runtime::ModelInfo) -> std::result::Result<Self, String> {
        let conv = |io: &rbln_runtime::IoInfo| -> std::result::Result<TensorSpec, String> {
            let datatype = DataType::from_model(io.dtype).ok_or_else(|| format!("tensor '{}' has dtype {}, which the server cannot pass", io.name, io.dtype))?;
            let shape = io.shape.iter().map(|&d| i64::try_from(d).map_err(|_| format!("tensor '{}' has a dimension too large", io.name))).collect::<std::result::Result<_, _>>()?;
            Ok(TensorSpec { name: io.name.clone(), datatype, shape, range: io.range })
        };
        Ok(Self {
            inputs: info.inputs.iter().map(conv).collect::<std::result::Result<_, _>>()?,
            outputs: info.outputs.iter().map(conv).collect::<std::result::Result<_, _>>()?,
            batching: None,
        })
    }

    /// The signature served with dynamic batching of up to `max_rows` rows:
    /// every input and output must have the same leading (batch)
    /// dimension, at least `max_rows`.
    pub fn batched(mut self, max_rows: usize) -> std::result::Result<Self, String> {
        let mut compiled = None;
        for t in self.inputs.iter().chain(&self.outputs) {
            let Some(&d) = t.shape.first() else {
                return Err(format!("tensor '{}' is a scalar: a batched model's inputs and outputs need a leading batch dimension", t.name));
            };
            match compiled {
                None => compiled = Some(d),
                Some(c) if c != d => {
                    return Err(format!("tensor '{}' has leading dimension {d}, not the batch dimension {c} of the model's first input", t.name));
                }
                Some(_) => {}
            }
        }
        let compiled = compiled.ok_or("the model has no inputs or outputs")?;
        let compiled_rows = usize::try_from(compiled).map_err(|_| format!("leading dimension {compiled}"))?;
        if max_rows == 0 || max_rows > compiled_rows {
            return Err(format!("the model was compiled for batches of {compiled_rows}: max_batch_size must be 1 to {compiled_rows}"));
        }
        for t in self.inputs.iter_mut().chain(self.outputs.iter_mut()) {
            t.shape[0] = -1;
        }
        self.batching = Some(Batching { max_rows, compiled_rows });
        Ok(self)
    }
}

/// The data of one request input, as it arrived.
#[derive(Debug)]
pub enum InputData<'a> {
    /// JSON `data`: a flat or nested array of elements, row-major.
    Json(&'a Value),
    /// Little-endian bytes (binary extension, gRPC raw_input_contents).
    Raw(&'a [u8]),
    /// Typed values (gRPC `contents`), already in the request's datatype.
    Typed(Data),
    /// Nothing given.
    Missing,
}

/// One input of a request.
#[derive(Debug)]
pub struct InputTensor<'a> {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
    pub data: InputData<'a>,
}

fn shape_str(s: &[i64]) -> String {
    format!("{s:?}")
}

/// Check a request's inputs against the model and turn them into the
/// runtime's tensors, in the model's input order.
pub fn to_runtime_inputs(spec: &ModelSpec, inputs: Vec<InputTensor<'_>>) -> Result<Vec<Tensor>> {
    let mut slots: Vec<Option<Tensor>> = vec![None; spec.inputs.len()];
    for inp in inputs {
        let Some(idx) = spec.inputs.iter().position(|s| s.name == inp.name) else {
            let names: Vec<&str> = spec.inputs.iter().map(|s| s.name.as_str()).collect();
            return Err(ServeError::bad(format!("unexpected input '{}': the model's inputs are {names:?}", inp.name)));
        };
        if slots[idx].is_some() {
            return Err(ServeError::bad(format!("input '{}' is given more than once", inp.name)));
        }
        slots[idx] = Some(convert_input(&spec.inputs[idx], spec.batching, inp)?);
    }
    let missing: Vec<&str> = spec.inputs.iter().zip(&slots).filter(|(_, t)| t.is_none()).map(|(s, _)| s.name.as_str()).collect();
    if !missing.is_empty() {
        return Err(ServeError::bad(format!("missing input(s) {missing:?}: the model needs {} input(s)", spec.inputs.len())));
    }
    let tensors: Vec<Tensor> = slots.into_iter().flatten().collect();
    if spec.batching.is_some() {
        // One request, one batch size: the rows of its outputs are its own.
        let rows = |t: &Tensor| t.shape.first().copied().unwrap_or(0);
        if let Some((i, t)) = tensors.iter().enumerate().find(|(_, t)| rows(t) != rows(&tensors[0])) {
            return Err(ServeError::bad(format!(
                "input '{}' has {} row(s) but input '{}' has {}: every input of a request must have the same batch size",
                spec.inputs[i].name,
                rows(t),
                spec.inputs[0].name,
                rows(&tensors[0])
            )));
        }
    }
    Ok(tensors)
}

/// The shape a request's input must have: the model's, or for a batched
/// model (leading -1) the request's own row count of 1 to `max_rows`.
fn expected_shape(want: &TensorSpec, batching: Option<Batching>, given: &[i64]) -> Result<Vec<i64>> {
    let mismatch = || {
        let rows = batching.map(|b| format!(" (a batch of 1 to {} rows)", b.max_rows)).unwrap_or_default();
        ServeError::bad(format!("input '{}': shape {} does not match the model's {}{rows}", want.name, shape_str(given), shape_str(&want.shape)))
    };
    match batching {
        Some(b) if want.shape.first() == Some(&-1) => {
            let rows_ok = given.first().is_some_and(|&r| r >= 1 && r as u64 <= b.max_rows as u64);
            if given.len() != want.shape.len() || !rows_ok || given[1..] != want.shape[1..] {
                return Err(mismatch());
            }
            Ok(given.to_vec())
        }
        _ if given == want.shape.as_slice() => Ok(want.shape.clone()),
        _ => Err(mismatch()),
    }
}

fn convert_input(want: &TensorSpec, batching: Option<Batching>, inp: InputTensor<'_>) -> Result<Tensor> {
    let name = &want.name;
    let dt = match DataType::parse(&inp.datatype) {
        Some(d) => d,
        None if OTHER_DATATYPES.contains(&inp.datatype.as_str()) => {
            return Err(ServeError::bad(format!("input '{name}': datatype {} is not supported by this model (it takes {})", inp.datatype, want.datatype.name())));
        }
        None => return Err(ServeError::bad(format!("input '{name}': unknown datatype '{}' (the model takes {})", inp.datatype, want.datatype.name()))),
    };
    if dt != want.datatype {
        return Err(ServeError::bad(format!("input '{name}': datatype {} does not match the model's {}", dt.name(), want.datatype.name())));
    }
    let shape = expected_shape(want, batching, &inp.shape)?;
    let n: usize = shape.iter().map(|&d| d as usize).product();
    let data = match inp.data {
        InputData::Missing => return Err(ServeError::bad(format!("input '{name}' has no data (neither 'data' nor binary data)"))),
        InputData::Raw(bytes) => from_raw(name, dt, n, &shape, bytes)?,
        InputData::Json(v) => from_json(name, dt, n, &shape, v)?,
        InputData::Typed(d) => {
            if d.len() != n {
                return Err(ServeError::bad(format!("input '{name}': {} values for shape {} ({n} expected)", d.len(), shape_str(&shape))));
            }
            d
        }
    };
    if let Some((lo, hi)) = want.range {
        let bad = match &data {
            Data::I32(v) => v.iter().position(|&x| (x as i64) < lo || (x as i64) >= hi).map(|i| (i, v[i] as i64)),
            Data::I64(v) => v.iter().position(|&x| x < lo || x >= hi).map(|i| (i, v[i])),
            Data::I8(v) => v.iter().position(|&x| (x as i64) < lo || (x as i64) >= hi).map(|i| (i, v[i] as i64)),
            Data::U8(v) => v.iter().position(|&x| (x as i64) < lo || (x as i64) >= hi).map(|i| (i, v[i] as i64)),
            _ => None,
        };
        if let Some((i, x)) = bad {
            return Err(ServeError::bad(format!("input '{name}': element {i} is {x}, outside the range {lo}..{hi} the model accepts")));
        }
    }
    let shape = shape.iter().map(|&d| d as u64).collect();
    Ok(Tensor { shape, data })
}

fn from_raw(name: &str, dt: DataType, n: usize, shape: &[i64], bytes: &[u8]) -> Result<Data> {
    let need = n * dt.size();
    if bytes.len() != need {
        return Err(ServeError::bad(format!(
            "input '{name}': binary data has {} bytes, but shape {} of {} needs {need}",
            bytes.len(),
            shape_str(shape),
            dt.name()
        )));
    }
    Ok(match dt {
        DataType::Fp32 => Data::F32(from_le(bytes, f32::from_le_bytes)),
        DataType::Int32 => Data::I32(from_le(bytes, i32::from_le_bytes)),
        DataType::Int64 => Data::I64(from_le(bytes, i64::from_le_bytes)),
        DataType::Int8 => Data::I8(bytemuck::cast_slice(bytes).to_vec()),
        DataType::Uint8 => Data::U8(bytes.to_vec()),
        DataType::Bool => {
            if let Some(i) = bytes.iter().position(|&b| b > 1) {
                return Err(ServeError::bad(format!("input '{name}': BOOL element {i} is byte {}, not 0 or 1", bytes[i])));
            }
            Data::Bool(bytes.iter().map(|&b| b == 1).collect())
        }
    })
}

/// Little-endian elements from bytes (whole elements: the caller checked
/// the length). One memcpy on little-endian machines.
fn from_le<T: bytemuck::Pod, const N: usize>(bytes: &[u8], conv: fn([u8; N]) -> T) -> Vec<T> {
    if cfg!(target_endian = "little") {
        bytemuck::pod_collect_to_vec(bytes)
    } else {
        bytes.chunks_exact(N).map(|c| conv(c.try_into().unwrap_or([0; N]))).collect()
    }
}

/// Flatten a (possibly nested) JSON array, row-major. Nesting deeper than
/// the shape's rank + 1 is refused (so a hostile body cannot recurse deep).
fn flatten<'v>(name: &str, v: &'v Value, depth: usize, max_depth: usize, out: &mut Vec<&'v Value>) -> Result<()> {
    match v {
        Value::Array(items) => {
            if depth > max_depth {
                return Err(ServeError::bad(format!("input '{name}': 'data' is nested deeper than the shape's {} dimension(s)", max_depth)));
            }
            for it in items {
                flatten(name, it, depth + 1, max_depth, out)?;
            }
            Ok(())
        }
        other => {
            out.push(other);
            Ok(())
        }
    }
}

fn from_json(name: &str, dt: DataType, n: usize, shape: &[i64], v: &Value) -> Result<Data> {
    if !v.is_array() {
        return Err(ServeError::bad(format!("input '{name}': 'data' must be an array, not {}", json_kind(v))));
    }
    let mut flat = Vec::with_capacity(n);
    flatten(name, v, 0, shape.len().max(1), &mut flat)?;
    if flat.len() != n {
        return Err(ServeError::bad(format!("input '{name}': 'data' has {} elements, but shape {} needs {n}", flat.len(), shape_str(shape))));
    }
    let elem_err = |i: usize, x: &Value| ServeError::bad(format!("input '{name}': element {i} is {}, not a valid {} value", short(x), dt.name()));
    Ok(match dt {
        DataType::Fp32 => Data::F32(flat.iter().enumerate().map(|(i, x)| x.as_f64().map(|f| f as f32).ok_or_else(|| elem_err(i, x))).collect::<Result<_>>()?),
        DataType::Int32 => Data::I32(flat.iter().enumerate().map(|(i, x)| x.as_i64().and_then(|v| i32::try_from(v).ok()).ok_or_else(|| elem_err(i, x))).collect::<Result<_>>()?),
        DataType::Int64 => Data::I64(flat.iter().enumerate().map(|(i, x)| x.as_i64().ok_or_else(|| elem_err(i, x))).collect::<Result<_>>()?),
        DataType::Int8 => Data::I8(flat.iter().enumerate().map(|(i, x)| x.as_i64().and_then(|v| i8::try_from(v).ok()).ok_or_else(|| elem_err(i, x))).collect::<Result<_>>()?),
        DataType::Uint8 => Data::U8(flat.iter().enumerate().map(|(i, x)| x.as_i64().and_then(|v| u8::try_from(v).ok()).ok_or_else(|| elem_err(i, x))).collect::<Result<_>>()?),
        DataType::Bool => Data::Bool(flat.iter().enumerate().map(|(i, x)| x.as_bool().ok_or_else(|| elem_err(i, x))).collect::<Result<_>>()?),
    })
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A JSON value for an error message, cut short.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 40 {
        format!("{}...", &s[..s.char_indices().nth(37).map_or(s.len(), |(i, _)| i)])
    } else {
        s
    }
}

/// Little-endian bytes of a tensor (binary extension, raw_output_contents).
pub fn raw_bytes(data: &Data) -> Vec<u8> {
    fn le<T: bytemuck::Pod, const N: usize>(v: &[T], conv: fn(&T) -> [u8; N]) -> Vec<u8> {
        if cfg!(target_endian = "little") {
            bytemuck::cast_slice(v).to_vec()
        } else {
            v.iter().flat_map(conv).collect()
        }
    }
    match data {
        Data::F32(v) => le(v, |x| x.to_le_bytes()),
        Data::I32(v) => le(v, |x| x.to_le_bytes()),
        Data::I64(v) => le(v, |x| x.to_le_bytes()),
        Data::I8(v) => bytemuck::cast_slice(v).to_vec(),
        Data::U8(v) => v.clone(),
        Data::Bool(v) => v.iter().map(|&b| b as u8).collect(),
    }
}

/// A tensor's elements as a flat JSON array.
pub fn json_data(data: &Data) -> Value {
    match data {
        Data::F32(v) => Value::Array(v.iter().map(|&x| serde_json::Number::from_f64(x as f64).map_or(Value::Null, Value::Number)).collect()),
        Data::I32(v) => Value::Array(v.iter().map(|&x| Value::from(x)).collect()),
        Data::I64(v) => Value::Array(v.iter().map(|&x| Value::from(x)).collect()),
        Data::I8(v) => Value::Array(v.iter().map(|&x| Value::from(x)).collect()),
        Data::U8(v) => Value::Array(v.iter().map(|&x| Value::from(x)).collect()),
        Data::Bool(v) => Value::Array(v.iter().map(|&x| Value::from(x)).collect()),
    }
}

/// Which outputs a request wants, and whether each goes back as binary
/// (the binary extension) or JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputChoice {
    /// Index into the model's outputs.
    pub index: usize,
    pub binary: bool,
}

/// Resolve requested outputs (name, per-output `binary_data`) against the
/// model; none requested means all, with `binary_default`.
pub fn choose_outputs(spec: &ModelSpec, requested: &[(String, Option<bool>)], binary_default: bool) -> Result<Vec<OutputChoice>> {
    if requested.is_empty() {
        return Ok((0..spec.outputs.len()).map(|index| OutputChoice { index, binary: binary_default }).collect());
    }
    let mut out = Vec::new();
    for (name, binary) in requested {
        let Some(index) = spec.outputs.iter().position(|s| &s.name == name) else {
            let names: Vec<&str> = spec.outputs.iter().map(|s| s.name.as_str()).collect();
            return Err(ServeError::bad(format!("unknown output '{name}' requested: the model's outputs are {names:?}")));
        };
        if out.iter().any(|o: &OutputChoice| o.index == index) {
            return Err(ServeError::bad(format!("output '{name}' is requested more than once")));
        }
        out.push(OutputChoice { index, binary: binary.unwrap_or(binary_default) });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> ModelSpec {
        ModelSpec {
            inputs: vec![
                TensorSpec { name: "a".into(), datatype: DataType::Fp32, shape: vec![2, 2], range: None },
                TensorSpec { name: "m".into(), datatype: DataType::Bool, shape: vec![3], range: None },
                TensorSpec { name: "k".into(), datatype: DataType::Int32, shape: vec![2], range: Some((-5, 5)) },
            ],
            outputs: vec![TensorSpec { name: "o".into(), datatype: DataType::Fp32, shape: vec![2], range: None }],
            batching: None,
        }
    }

    fn inp<'a>(name: &str, dt: &str, shape: &[i64], data: InputData<'a>) -> InputTensor<'a> {
        InputTensor { name: name.into(), datatype: dt.into(), shape: shape.to_vec(), data }
    }

    #[test]
    fn datatype_names_round_trip() {
        for d in [DataType::Fp32, DataType::Int32, DataType::Int64, DataType::Int8, DataType::Uint8, DataType::Bool] {
            assert_eq!(DataType::parse(d.name()), Some(d));
        }
        assert_eq!(DataType::from_model("f32"), Some(DataType::Fp32));
        assert_eq!(DataType::from_model("i8"), Some(DataType::Int8));
        assert_eq!(DataType::from_model("u8"), Some(DataType::Uint8));
        assert_eq!((DataType::of(&Data::I8(vec![])), DataType::of(&Data::U8(vec![]))), (DataType::Int8, DataType::Uint8));
        assert_eq!(DataType::from_model("f16"), None);
        assert_eq!(DataType::parse("fp32"), None, "names are case-sensitive");
    }

    #[test]
    fn raw_and_json_inputs_in_model_order() {
        let a = json!([[1.5, 2], [3, 4]]);
        let m: Vec<u8> = vec![1, 0, 1];
        let k: Vec<u8> = [-5i32, 4].iter().flat_map(|x| x.to_le_bytes()).collect();
        let ts = to_runtime_inputs(
            &spec(),
            vec![inp("k", "INT32", &[2], InputData::Raw(&k)), inp("m", "BOOL", &[3], InputData::Raw(&m)), inp("a", "FP32", &[2, 2], InputData::Json(&a))],
        )
        .unwrap();
        assert_eq!(ts[0].data, Data::F32(vec![1.5, 2.0, 3.0, 4.0]));
        assert_eq!(ts[0].shape, vec![2, 2]);
        assert_eq!(ts[1].data, Data::Bool(vec![true, false, true]));
        assert_eq!(ts[2].data, Data::I32(vec![-5, 4]));
        assert_eq!(raw_bytes(&ts[2].data), k);
        assert_eq!(raw_bytes(&ts[1].data), m);
        assert_eq!(json_data(&ts[0].data), json!([1.5, 2.0, 3.0, 4.0]));
    }

    #[test]
    fn element_errors() {
        let a = json!([1, 2, 3, 4]);
        let err = |m: InputData<'_>, k: InputData<'_>| {
            to_runtime_inputs(&spec(), vec![inp("a", "FP32", &[2, 2], InputData::Json(&a)), inp("m", "BOOL", &[3], m), inp("k", "INT32", &[2], k)]).unwrap_err().msg
        };
        let ok_k: Vec<u8> = vec![0; 8];
        assert_eq!(err(InputData::Raw(&[0, 2, 1]), InputData::Raw(&ok_k)), "input 'm': BOOL element 1 is byte 2, not 0 or 1");
        let big = json!([1, 3_000_000_000i64]);
        assert_eq!(err(InputData::Raw(&[0, 1, 1]), InputData::Json(&big)), "input 'k': element 1 is 3000000000, not a valid INT32 value");
        let out = json!([1, 5]);
        assert_eq!(err(InputData::Raw(&[0, 1, 1]), InputData::Json(&out)), "input 'k': element 1 is 5, outside the range -5..5 the model accepts");
        let bools = json!([true, 1, false]);
        assert_eq!(err(InputData::Json(&bools), InputData::Raw(&ok_k)), "input 'm': element 1 is 1, not a valid BOOL value");
        assert_eq!(err(InputData::Typed(Data::Bool(vec![true])), InputData::Raw(&ok_k)), "input 'm': 1 values for shape [3] (3 expected)");
        let long = json!(["a very long string that goes on and on and on and on", 1]);
        assert!(err(InputData::Raw(&[0, 1, 1]), InputData::Json(&long)).contains("element 0 is \"a very long string that goes on and ..., not a valid INT32 value"));
    }

    fn spec8() -> ModelSpec {
        ModelSpec {
            inputs: vec![
                TensorSpec { name: "q".into(), datatype: DataType::Int8, shape: vec![2, 2], range: None },
                TensorSpec { name: "u".into(), datatype: DataType::Uint8, shape: vec![3], range: None },
            ],
            outputs: vec![TensorSpec { name: "o".into(), datatype: DataType::Int8, shape: vec![2], range: None }],
            batching: None,
        }
    }

    #[test]
    fn int8_and_uint8_inputs_and_outputs() {
        let q = json!([[-128, -1], [0, 127]]);
        let u: Vec<u8> = vec![0, 128, 255];
        let ts = to_runtime_inputs(&spec8(), vec![inp("u", "UINT8", &[3], InputData::Raw(&u)), inp("q", "INT8", &[2, 2], InputData::Json(&q))]).unwrap();
        assert_eq!(ts[0], Tensor::new(&[2, 2], vec![-128i8, -1, 0, 127]));
        assert_eq!(ts[1], Tensor::new(&[3], vec![0u8, 128, 255]));
        assert_eq!(raw_bytes(&ts[0].data), vec![0x80, 0xff, 0, 0x7f]);
        assert_eq!(raw_bytes(&ts[1].data), u);
        assert_eq!(json_data(&ts[0].data), json!([-128, -1, 0, 127]));
        assert_eq!(json_data(&ts[1].data), json!([0, 128, 255]));
        // Raw INT8 is two's complement, one byte an element.
        let q_raw: Vec<u8> = vec![0x80, 0xff, 0, 0x7f];
        let u_json = json!([0, 128, 255]);
        let ts = to_runtime_inputs(&spec8(), vec![inp("q", "INT8", &[2, 2], InputData::Raw(&q_raw)), inp("u", "UINT8", &[3], InputData::Json(&u_json))]).unwrap();
        assert_eq!(ts[0].data, Data::I8(vec![-128, -1, 0, 127]));
        assert_eq!(ts[1].data, Data::U8(vec![0, 128, 255]));

        let err = |q: InputData<'_>, u: InputData<'_>| to_runtime_inputs(&spec8(), vec![inp("q", "INT8", &[2, 2], q), inp("u", "UINT8", &[3], u)]).unwrap_err().msg;
        let ok_q = json!([1, 2, 3, 4]);
        let ok_u: Vec<u8> = vec![1, 2, 3];
        assert_eq!(err(InputData::Json(&json!([1, 2, 128, 4])), InputData::Raw(&ok_u)), "input 'q': element 2 is 128, not a valid INT8 value");
        assert_eq!(err(InputData::Json(&json!([1, -129, 3, 4])), InputData::Raw(&ok_u)), "input 'q': element 1 is -129, not a valid INT8 value");
        assert_eq!(err(InputData::Json(&ok_q), InputData::Json(&json!([1, -1, 3]))), "input 'u': element 1 is -1, not a valid UINT8 value");
        assert_eq!(err(InputData::Json(&ok_q), InputData::Json(&json!([1, 2, 256]))), "input 'u': element 2 is 256, not a valid UINT8 value");
        assert_eq!(err(InputData::Json(&ok_q), InputData::Json(&json!([1, 2.5, 3]))), "input 'u': element 1 is 2.5, not a valid UINT8 value");
        assert_eq!(err(InputData::Raw(&[1, 2, 3]), InputData::Raw(&ok_u)), "input 'q': binary data has 3 bytes, but shape [2, 2] of INT8 needs 4");
        assert_eq!(err(InputData::Json(&ok_q), InputData::Typed(Data::U8(vec![1]))), "input 'u': 1 values for shape [3] (3 expected)");
        let wrong_type = to_runtime_inputs(&spec8(), vec![inp("q", "UINT8", &[2, 2], InputData::Raw(&[0; 4])), inp("u", "UINT8", &[3], InputData::Raw(&ok_u))]).unwrap_err().msg;
        assert_eq!(wrong_type, "input 'q': datatype UINT8 does not match the model's INT8");
        let int16 = to_runtime_inputs(&spec8(), vec![inp("q", "INT16", &[2, 2], InputData::Raw(&[0; 8]))]).unwrap_err().msg;
        assert_eq!(int16, "input 'q': datatype INT16 is not supported by this model (it takes INT8)");
        // A model range applies to them as to other integers.
        let mut ranged = spec8();
        ranged.inputs[1].range = Some((0, 200));
        let e = to_runtime_inputs(&ranged, vec![inp("q", "INT8", &[2, 2], InputData::Json(&ok_q)), inp("u", "UINT8", &[3], InputData::Raw(&[0, 200, 1]))]).unwrap_err().msg;
        assert_eq!(e, "input 'u': element 1 is 200, outside the range 0..200 the model accepts");
    }

    #[test]
    fn outputs_chosen() {
        let s = spec();
        assert_eq!(choose_outputs(&s, &[], true).unwrap(), vec![OutputChoice { index: 0, binary: true }]);
        assert_eq!(choose_outputs(&s, &[("o".into(), Some(false))], true).unwrap(), vec![OutputChoice { index: 0, binary: false }]);
        assert_eq!(choose_outputs(&s, &[("o".into(), None), ("o".into(), None)], false).unwrap_err().msg, "output 'o' is requested more than once");
    }
}
