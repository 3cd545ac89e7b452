//! Compiler errors. Anything about a particular ONNX node names the node,
//! its op type and the reason, so the message alone says what to change.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CompileError {
    #[error("not an ONNX model: protobuf decoding failed: {0}")]
    Decode(String),
    #[error("invalid model: {0}")]
    Invalid(String),
    #[error("tensor '{name}': {reason}")]
    BadTensor { name: String, reason: String },
    #[error("node '{node}' ({op}): {reason}")]
    Unsupported { node: String, op: String, reason: String },
    #[error(
        "input '{input}' has a dynamic dimension '{dim}' (axis {axis}); give static shapes with --input-shape {input}=<d0>x<d1>x..."
    )]
    DynamicShape { input: String, dim: String, axis: usize },
    #[error("--input-shape {0}")]
    BadInputShape(String),
    #[error("building the .rbln file failed: {0}")]
    Format(#[from] rbln_format::FormatError),
}

pub type Result<T> = std::result::Result<T, CompileError>;
