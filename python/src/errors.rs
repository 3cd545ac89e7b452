//! Rust errors as the `rbln` exception hierarchy (`rbln/_errors.py`).
//!
//! Errors are classified where they happen (possibly without the GIL) into
//! a [`Failure`]: the name of the exception class and the message, which
//! is the Display text of the Rust error, the same text `rbln-run` and
//! `rbln-compile` print. The class object is looked up only when the
//! exception is raised.

use pyo3::prelude::*;
use pyo3::types::PyType;

/// An error on its way to Python: exception class (in `rbln._errors`)
/// and message.
#[derive(Clone, Debug)]
pub struct Failure {
    pub class: &'static str,
    pub message: String,
}

impl Failure {
    pub fn new(class: &'static str, message: impl Into<String>) -> Self {
        Self { class, message: message.into() }
    }

    pub fn closed(what: &str) -> Self {
        Self::new("RBLNClosedError", format!("the {what} is closed"))
    }

    pub fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let class = py
            .import("rbln._errors")
            .and_then(|m| m.getattr(self.class))
            .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
        match class {
            Ok(c) => PyErr::from_type(c, self.message),
            // The package is broken (rbln._errors missing): still raise,
            // with the message.
            Err(_) => pyo3::exceptions::PyRuntimeError::new_err(self.message),
        }
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        Python::attach(|py| f.into_pyerr(py))
    }
}

/// The exception class of a UMD (device) error.
fn umd_class(e: &rbln_umd::Error) -> &'static str {
    use rbln_umd::Error as E;
    match e {
        E::NoDevice { .. } | E::PermissionDenied { .. } | E::NoContext { .. } | E::NotAnNpu { .. } | E::Open { .. } => {
            "RBLNDeviceError"
        }
        E::DeviceGone { .. } | E::Faulted { .. } | E::Poisoned { .. } => "RBLNDeviceLostError",
        E::Timeout { .. } => "RBLNTimeoutError",
        _ => "RBLNRuntimeError",
    }
}

impl From<rbln_umd::Error> for Failure {
    fn from(e: rbln_umd::Error) -> Self {
        Failure::new(umd_class(&e), e.to_string())
    }
}

impl From<rbln_runtime::Error> for Failure {
    fn from(e: rbln_runtime::Error) -> Self {
        use rbln_runtime::Error as E;
        let class = match &e {
            E::Device(d) => umd_class(d),
            E::Format(f) => return format_failure(f, e.to_string()),
            E::InputDType { .. } => "RBLNInputTypeError",
            E::InputCount { .. } | E::InputShape { .. } | E::InputValue { .. } | E::InputLength { .. } | E::Parallel(_) => {
                "RBLNInputError"
            }
            E::HardwareVersion { .. }
            | E::NotStaged { .. }
            | E::EdgeDType { .. }
            | E::TooLarge { .. }
            | E::DramTooSmall { .. }
            | E::EmptyProgram => "RBLNModelError",
            E::State(_) | E::Generate(_) => "RBLNValueError",
            _ => "RBLNRuntimeError",
        };
        Failure::new(class, e.to_string())
    }
}

/// A model file that cannot be read at all is a missing file; anything
/// else wrong with it is a bad model.
fn format_failure(f: &rbln_format::FormatError, message: String) -> Failure {
    match f {
        rbln_format::FormatError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Failure::new("RBLNModelNotFoundError", message)
        }
        _ => Failure::new("RBLNModelError", message),
    }
}

impl From<rbln_format::FormatError> for Failure {
    fn from(f: rbln_format::FormatError) -> Self {
        let message = f.to_string();
        format_failure(&f, message)
    }
}

impl From<rbln_compile::CompileError> for Failure {
    fn from(e: rbln_compile::CompileError) -> Self {
        Failure::new("RBLNCompileError", e.to_string())
    }
}
