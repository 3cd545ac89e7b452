//! The part of the ONNX protobuf schema (onnx.proto, IR version 3..10)
//! the compiler reads. Field numbers are the schema's; fields not declared
//! here are skipped by the decoder, and the fields that would change the
//! meaning of a model if ignored (external data, sparse initializers,
//! subgraphs) are checked for and rejected by the importer.

use prost::Message;

use crate::error::{CompileError, Result};
use crate::ir::{Const, Data};

#[derive(Clone, PartialEq, Message)]
pub struct ModelProto {
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    #[prost(string, tag = "2")]
    pub producer_name: String,
    #[prost(string, tag = "3")]
    pub producer_version: String,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// Model-local functions: the importer refuses nodes that would call one.
    #[prost(bytes = "vec", repeated, tag = "25")]
    pub functions: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
pub struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(int64, tag = "2")]
    pub version: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    /// Sparse initializers are not supported; only their count is needed.
    #[prost(bytes = "vec", repeated, tag = "15")]
    pub sparse_initializer: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub op_type: String,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    #[prost(string, tag = "7")]
    pub domain: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct AttributeProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(float, tag = "2")]
    pub f: f32,
    #[prost(int64, tag = "3")]
    pub i: i64,
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    /// A subgraph (If/Loop/Scan bodies): only its presence matters.
    #[prost(bytes = "vec", optional, tag = "6")]
    pub g: Option<Vec<u8>>,
    #[prost(float, repeated, tag = "7")]
    pub floats: Vec<f32>,
    #[prost(int64, repeated, tag = "8")]
    pub ints: Vec<i64>,
    /// Lists of strings (a recurrent layer's `activations`).
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
    #[prost(int32, tag = "20")]
    pub r#type: i32,
    /// Set in function bodies: the attribute refers to a caller's one.
    #[prost(string, tag = "21")]
    pub ref_attr_name: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueInfoProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// `TypeProto`; of its `value` oneof only `tensor_type` (field 1) is read.
#[derive(Clone, PartialEq, Message)]
pub struct TypeProto {
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TypeProtoTensor>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TypeProtoTensor {
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// `TensorShapeProto.Dimension`: the `value` oneof is either field.
#[derive(Clone, PartialEq, Message)]
pub struct Dimension {
    #[prost(int64, optional, tag = "1")]
    pub dim_value: Option<i64>,
    #[prost(string, optional, tag = "2")]
    pub dim_param: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    #[prost(string, tag = "8")]
    pub name: String,
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    #[prost(uint64, repeated, tag = "11")]
    pub uint64_data: Vec<u64>,
    /// `external_data` entries: weights kept in other files.
    #[prost(bytes = "vec", repeated, tag = "13")]
    pub external_data: Vec<Vec<u8>>,
    /// 1 = EXTERNAL.
    #[prost(int32, tag = "14")]
    pub data_location: i32,
}

/// `TensorProto.DataType` codes.
pub mod elem {
    pub const FLOAT: i32 = 1;
    pub const UINT8: i32 = 2;
    pub const INT8: i32 = 3;
    pub const UINT16: i32 = 4;
    pub const INT16: i32 = 5;
    pub const INT32: i32 = 6;
    pub const INT64: i32 = 7;
    pub const BOOL: i32 = 9;
    pub const FLOAT16: i32 = 10;
    pub const DOUBLE: i32 = 11;
    pub const UINT32: i32 = 12;
    pub const UINT64: i32 = 13;
    pub const BFLOAT16: i32 = 16;

    pub fn name(t: i32) -> &'static str {
        match t {
            1 => "float",
            2 => "uint8",
            3 => "int8",
            4 => "uint16",
            5 => "int16",
            6 => "int32",
            7 => "int64",
            8 => "string",
            9 => "bool",
            10 => "float16",
            11 => "double",
            12 => "uint32",
            13 => "uint64",
            14 => "complex64",
            15 => "complex128",
            16 => "bfloat16",
            _ => "unknown",
        }
    }

    /// Integer-like types the constant folder keeps as i64.
    pub fn is_int(t: i32) -> bool {
        matches!(t, UINT8 | INT8 | UINT16 | INT16 | INT32 | INT64 | BOOL | UINT32 | UINT64)
    }
}

pub fn decode(bytes: &[u8]) -> Result<ModelProto> {
    ModelProto::decode(bytes).map_err(|e| CompileError::Decode(e.to_string()))
}

/// Values of a tensor proto as a compile-time constant (f32 or i64).
pub fn tensor_const(t: &TensorProto, what: &str) -> Result<Const> {
    let bad = |reason: String| CompileError::BadTensor { name: what.to_string(), reason };
    if t.data_location == 1 || !t.external_data.is_empty() {
        return Err(bad("its data is stored in an external file, which rbln-compile does not read".into()));
    }
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        shape.push(u64::try_from(d).map_err(|_| bad(format!("negative dimension {d}")))?);
    }
    let count = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).ok_or_else(|| bad("too many elements".into()))?;
    // Never allocate more than the file can hold: every element costs at
    // least one byte of raw data or of a packed repeated field.
    let total_len = t.raw_data.len() + 8 * (t.float_data.len() + t.int32_data.len() + t.int64_data.len())
        + 8 * (t.double_data.len() + t.uint64_data.len());
    if count > total_len as u64 && count > 0 {
        return Err(bad(format!("{count} elements declared but only {total_len} bytes of data")));
    }
    let n = count as usize;
    let raw = !t.raw_data.is_empty();
    let check_len = |have: usize| {
        if have == n {
            Ok(())
        } else {
            Err(bad(format!("{n} elements declared, {have} stored")))
        }
    };
    let from_raw = |width: usize| -> Result<Vec<&[u8]>> {
        if t.raw_data.len() != n * width {
            return Err(bad(format!("raw data is {} bytes, {n} elements need {}", t.raw_data.len(), n * width)));
        }
        Ok(t.raw_data.chunks_exact(width).collect())
    };
    use elem::*;
    let data = match t.data_type {
        FLOAT if raw => Data::F(from_raw(4)?.iter().map(|c| f32::from_le_bytes(c[..4].try_into().unwrap_or([0; 4]))).collect()),
        FLOAT => {
            check_len(t.float_data.len())?;
            Data::F(t.float_data.clone())
        }
        DOUBLE if raw => Data::F(from_raw(8)?.iter().map(|c| f64::from_le_bytes(c[..8].try_into().unwrap_or([0; 8])) as f32).collect()),
        DOUBLE => {
            check_len(t.double_data.len())?;
            Data::F(t.double_data.iter().map(|&v| v as f32).collect())
        }
        INT64 if raw => Data::I(from_raw(8)?.iter().map(|c| i64::from_le_bytes(c[..8].try_into().unwrap_or([0; 8]))).collect()),
        INT64 => {
            check_len(t.int64_data.len())?;
            Data::I(t.int64_data.clone())
        }
        INT32 if raw => Data::I(from_raw(4)?.iter().map(|c| i32::from_le_bytes(c[..4].try_into().unwrap_or([0; 4])) as i64).collect()),
        UINT32 if raw => Data::I(from_raw(4)?.iter().map(|c| u32::from_le_bytes(c[..4].try_into().unwrap_or([0; 4])) as i64).collect()),
        INT16 if raw => Data::I(from_raw(2)?.iter().map(|c| i16::from_le_bytes([c[0], c[1]]) as i64).collect()),
        UINT16 if raw => Data::I(from_raw(2)?.iter().map(|c| u16::from_le_bytes([c[0], c[1]]) as i64).collect()),
        INT8 if raw => Data::I(from_raw(1)?.iter().map(|c| c[0] as i8 as i64).collect()),
        UINT8 | BOOL if raw => Data::I(from_raw(1)?.iter().map(|c| c[0] as i64).collect()),
        INT32 | INT16 | UINT16 | INT8 | UINT8 | BOOL => {
            check_len(t.int32_data.len())?;
            Data::I(t.int32_data.iter().map(|&v| v as i64).collect())
        }
        UINT32 | UINT64 if !raw => {
            check_len(t.uint64_data.len())?;
            Data::I(t.uint64_data.iter().map(|&v| v as i64).collect())
        }
        other => return Err(bad(format!("element type {} is not supported", elem::name(other)))),
    };
    Ok(Const { shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_raw_and_typed_tensors() {
        let t = TensorProto { dims: vec![2], data_type: elem::FLOAT, raw_data: [1f32, -2.5].iter().flat_map(|v| v.to_le_bytes()).collect(), ..Default::default() };
        assert_eq!(tensor_const(&t, "t").unwrap().data, Data::F(vec![1.0, -2.5]));
        let t = TensorProto { dims: vec![3], data_type: elem::INT64, int64_data: vec![1, -1, 7], ..Default::default() };
        assert_eq!(tensor_const(&t, "t").unwrap().data, Data::I(vec![1, -1, 7]));
        // A huge claimed size with no data is refused before allocating.
        let t = TensorProto { dims: vec![1 << 40], data_type: elem::FLOAT, ..Default::default() };
        assert!(matches!(tensor_const(&t, "t"), Err(CompileError::BadTensor { .. })));
        let t = TensorProto { dims: vec![2], data_type: elem::FLOAT, raw_data: vec![0; 7], ..Default::default() };
        assert!(tensor_const(&t, "t").unwrap_err().to_string().contains("raw data is 7 bytes"));
    }

    #[test]
    fn garbage_is_a_decode_error() {
        assert!(matches!(decode(&[0xff, 0xff, 0xff]), Err(CompileError::Decode(_))));
    }
}
