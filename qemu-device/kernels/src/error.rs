//! The error every kernel returns instead of panicking.

/// Why a kernel refused its parameters.
///
/// Kernels validate all shapes, strides, lengths and indices before touching
/// any data; on error the output slice is left unmodified (except where noted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// A slice does not have the number of elements its shape implies.
    #[error("{what}: shape implies {expected} elements but the slice has {actual}")]
    LengthMismatch {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    /// A size, offset or element count computed from the parameters overflows.
    #[error("{what}: size computation overflows")]
    Overflow { what: &'static str },
    /// A parameter has an invalid value (zero stride, groups not dividing
    /// channels, non-permutation, ...).
    #[error("invalid {what}: {reason}")]
    InvalidParam { what: &'static str, reason: String },
    /// A shape has more dimensions than the kernels support.
    #[error("{what}: rank {rank} exceeds the maximum of {max}")]
    RankTooLarge {
        what: &'static str,
        rank: usize,
        max: usize,
    },
    /// An axis is outside `-rank..rank`.
    #[error("axis {axis} is out of range for a tensor of rank {rank}")]
    AxisOutOfRange { axis: isize, rank: usize },
    /// Two shapes are not broadcast-compatible (numpy rules).
    #[error("shapes {a:?} and {b:?} cannot be broadcast together")]
    Broadcast { a: Vec<usize>, b: Vec<usize> },
    /// A gather index is outside `-size..size`.
    #[error("index {index} (at position {position}) is out of range for an axis of size {size}")]
    IndexOutOfRange {
        index: i64,
        position: usize,
        size: usize,
    },
    /// A strided access would fall outside its slice.
    #[error("{what}: access at element {index} falls outside the slice of length {len}")]
    OutOfBounds {
        what: &'static str,
        index: i128,
        len: usize,
    },
    /// Building a rayon thread pool failed.
    #[error("failed to build thread pool: {0}")]
    ThreadPool(String),
}

/// Result alias used by every kernel.
pub type Result<T, E = KernelError> = core::result::Result<T, E>;

impl KernelError {
    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        KernelError::InvalidParam {
            what,
            reason: reason.into(),
        }
    }
}
