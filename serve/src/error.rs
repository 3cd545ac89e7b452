//! Errors of a request, each with the HTTP status and gRPC code the
//! protocol gives it. The REST body is the protocol's `{"error": "..."}`.

use std::fmt;

/// What kind of failure: decides the HTTP status and the gRPC code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Malformed request, wrong tensor name, datatype, shape or data.
    BadRequest,
    /// Unknown model, version or route.
    NotFound,
    /// The model exists but is not loaded (or is loading or failed).
    NotReady,
    /// The model's queue is full.
    QueueFull,
    /// The request waited or ran longer than the model's timeout.
    Timeout,
    /// The body is larger than `--max-body-bytes`.
    TooLarge,
    /// The device or runtime failed while running the request.
    Internal,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeError {
    pub kind: Kind,
    pub msg: String,
}

pub type Result<T> = std::result::Result<T, ServeError>;

impl ServeError {
    pub fn new(kind: Kind, msg: impl Into<String>) -> Self {
        Self { kind, msg: msg.into() }
    }
    pub fn bad(msg: impl Into<String>) -> Self {
        Self::new(Kind::BadRequest, msg)
    }
    pub fn not_found(msg: impl Into<String>) -> Self {
        Self::new(Kind::NotFound, msg)
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(Kind::Internal, msg)
    }

    /// The HTTP status of this error.
    pub fn http_status(&self) -> u16 {
        match self.kind {
            Kind::BadRequest => 400,
            Kind::NotFound => 404,
            Kind::TooLarge => 413,
            Kind::Internal => 500,
            Kind::NotReady | Kind::QueueFull => 503,
            Kind::Timeout => 504,
        }
    }

    /// The gRPC status code of this error.
    pub fn grpc_code(&self) -> tonic::Code {
        match self.kind {
            Kind::BadRequest => tonic::Code::InvalidArgument,
            Kind::NotFound => tonic::Code::NotFound,
            Kind::NotReady => tonic::Code::Unavailable,
            Kind::QueueFull | Kind::TooLarge => tonic::Code::ResourceExhausted,
            Kind::Timeout => tonic::Code::DeadlineExceeded,
            Kind::Internal => tonic::Code::Internal,
        }
    }

    /// The `outcome` label of the request counter.
    pub fn outcome(&self) -> &'static str {
        match self.kind {
            Kind::BadRequest => "bad_request",
            Kind::NotFound => "not_found",
            Kind::NotReady => "not_ready",
            Kind::QueueFull => "queue_full",
            Kind::Timeout => "timeout",
            Kind::TooLarge => "too_large",
            Kind::Internal => "error",
        }
    }

    /// The protocol's error body: `{"error": "..."}`.
    pub fn json(&self) -> String {
        serde_json::json!({ "error": self.msg }).to_string()
    }
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for ServeError {}

impl From<ServeError> for tonic::Status {
    fn from(e: ServeError) -> Self {
        tonic::Status::new(e.grpc_code(), e.msg)
    }
}
