//! Compiler errors. Anything about a particular ONNX node names the node,
//! its op type and the reason (a TFLite operator: its index, first output
//! tensor and builtin op), so the message alone says what to change.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CompileError {
    #[error("not an ONNX model: protobuf decoding failed: {0}")]
    Decode(String),
    #[error("not a valid TFLite model: {0}")]
    TfliteDecode(String),
    #[error("invalid model: {0}")]
    Invalid(String),
    #[error("tensor '{name}': {reason}")]
    BadTensor { name: String, reason: String },
    #[error("node '{node}' ({op}): {reason}")]
    Unsupported { node: String, op: String, reason: String },
    /// A TFLite operator: its index in the subgraph, the name of its first
    /// output tensor and its builtin op name.
    #[error("operator {index} '{name}' ({op}): {reason}")]
    TfliteOp { index: usize, name: String, op: String, reason: String },
    #[error(
        "input '{input}' has a dynamic dimension '{dim}' (axis {axis}); give static shapes with --input-shape {input}=<d0>x<d1>x..."
    )]
    DynamicShape { input: String, dim: String, axis: usize },
    #[error("--input-shape {0}")]
    BadInputShape(String),
    /// One program of a multi-entry compilation ([`crate::compile_entries`]).
    #[error("entry point '{entry}': {source}")]
    Entry {
        entry: String,
        #[source]
        source: Box<CompileError>,
    },
    #[error("building the .rbln file failed: {0}")]
    Format(#[from] rbln_format::FormatError),
}

pub type Result<T> = std::result::Result<T, CompileError>;
