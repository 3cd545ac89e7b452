//! `CompiledModel` and the compiler entry points.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use rbln_format::Model;

use crate::errors::Failure;
use crate::tensors::info_dict;

/// A compiled model (.rbln) in memory: from `rbln.compile_from_onnx`,
/// `rbln.compile_from_torch`, or loaded with `rbln.CompiledModel(path)`.
#[pyclass(module = "rbln._rbln", name = "CompiledModel", frozen)]
pub struct CompiledModel {
    pub model: Model,
    /// The compiler's report, when this model was compiled here.
    report: Option<Report>,
}

#[derive(Clone)]
struct Report {
    format: &'static str,
    source_nodes: usize,
    device_ops: Vec<(String, usize)>,
    views: usize,
    memory: rbln_compile::MemoryPlan,
}

/// `(key, value)` properties of a model's metadata.
pub fn properties(model: &Model) -> Vec<(String, String)> {
    model.meta.properties.iter().map(|p| (p.key.clone(), p.value.clone())).collect()
}

/// The model a Runtime is made from: a `CompiledModel`, or the path of a
/// `.rbln` file (str or os.PathLike).
pub fn model_from(obj: &Bound<'_, PyAny>) -> PyResult<Model> {
    if let Ok(c) = obj.cast::<CompiledModel>() {
        return Ok(c.get().model.clone());
    }
    let path: PathBuf = obj.extract().map_err(|_| {
        Failure::new(
            "RBLNTypeError",
            format!("model must be a .rbln path or an rbln.CompiledModel, not {}", type_name(obj)),
        )
    })?;
    open(obj.py(), path)
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

fn open(py: Python<'_>, path: PathBuf) -> PyResult<Model> {
    py.detach(|| {
        Model::open(&path).map_err(|e| {
            let f = Failure::from(e);
            // rbln-run's form: "PATH: what is wrong" (I/O errors name the
            // path already).
            if f.message.contains(&*path.to_string_lossy()) {
                f
            } else {
                Failure::new(f.class, format!("{}: {}", path.display(), f.message))
            }
        })
    })
    .map_err(PyErr::from)
}

#[pymethods]
impl CompiledModel {
    /// Load a compiled model from a .rbln file.
    #[new]
    fn py_new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        Ok(Self { model: open(py, path)?, report: None })
    }

    /// Write the model as a .rbln file.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| {
            let bytes = self.model.to_bytes().map_err(Failure::from)?;
            std::fs::write(&path, bytes).map_err(|e| Failure::new("RBLNOSError", format!("{}: {e}", path.display())))
        })
        .map_err(PyErr::from)
    }

    /// The .rbln file's bytes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = py.detach(|| self.model.to_bytes()).map_err(Failure::from)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// The model's name.
    #[getter]
    fn name(&self) -> String {
        self.model.meta.name.clone()
    }

    /// Inputs, outputs, memory, ops and properties (no device needed).
    fn inspect<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = info_dict(py, &rbln_runtime::inspect(&self.model), &properties(&self.model))?;
        if let Some(r) = &self.report {
            let rep = PyDict::new(py);
            rep.set_item("format", r.format)?;
            rep.set_item("source_nodes", r.source_nodes)?;
            let ops = PyDict::new(py);
            for (op, n) in &r.device_ops {
                ops.set_item(op, n)?;
            }
            rep.set_item("device_ops", ops)?;
            rep.set_item("views", r.views)?;
            rep.set_item("weights_bytes", r.memory.weights_bytes)?;
            rep.set_item("activations_naive_bytes", r.memory.naive_bytes)?;
            rep.set_item("activations_planned_bytes", r.memory.planned_bytes)?;
            d.set_item("compile_report", rep)?;
        }
        Ok(d)
    }

    /// `rbln.Runtime(self, **kwargs)`.
    #[pyo3(signature = (**kwargs))]
    fn create_runtime<'py>(slf: &Bound<'py, Self>, kwargs: Option<&Bound<'py, PyDict>>) -> PyResult<Bound<'py, PyAny>> {
        let cls = slf.py().import("rbln")?.getattr("Runtime")?;
        cls.call(PyTuple::new(slf.py(), [slf])?, kwargs)
    }

    /// `rbln.AsyncRuntime(self, **kwargs)` (e.g. `parallel=2`).
    #[pyo3(signature = (**kwargs))]
    fn create_async_runtime<'py>(slf: &Bound<'py, Self>, kwargs: Option<&Bound<'py, PyDict>>) -> PyResult<Bound<'py, PyAny>> {
        let cls = slf.py().import("rbln")?.getattr("AsyncRuntime")?;
        cls.call(PyTuple::new(slf.py(), [slf])?, kwargs)
    }

    fn __repr__(&self) -> String {
        let m = &self.model.meta;
        let io = |v: &[rbln_format::IoBinding]| {
            v.iter().map(|b| format!("{}: {}{:?}", b.name, b.dtype.name(), b.shape)).collect::<Vec<_>>().join(", ")
        };
        format!("<rbln.CompiledModel '{}' inputs=({}) outputs=({})>", m.name, io(&m.inputs), io(&m.outputs))
    }
}

/// Compile an ONNX or TFLite model from its bytes. `input_shapes` gives
/// static shapes for inputs (needed for dynamic dimensions).
#[pyfunction]
#[pyo3(signature = (data, name, input_shapes))]
pub fn _compile(py: Python<'_>, data: &[u8], name: &str, input_shapes: Vec<(String, Vec<u64>)>) -> PyResult<CompiledModel> {
    let opts = rbln_compile::Options { input_shapes, ..Default::default() };
    let compiled = py.detach(|| rbln_compile::compile(data, name, &opts)).map_err(Failure::from)?;
    Ok(from_compiled(compiled))
}

/// Compile several ONNX or TFLite models into one model whose programs
/// are entry points over one copy of the weights (`entries`: (entry name,
/// bytes), the first the main program; `rbln_compile::compile_entries`).
#[pyfunction]
#[pyo3(signature = (entries, name, input_shapes))]
pub fn _compile_entries(py: Python<'_>, entries: Vec<(String, Vec<u8>)>, name: &str, input_shapes: Vec<(String, Vec<u64>)>) -> PyResult<CompiledModel> {
    let opts = rbln_compile::Options { input_shapes, ..Default::default() };
    let sources: Vec<(&str, &[u8])> = entries.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
    let compiled = py.detach(|| rbln_compile::compile_entries(&sources, name, &opts)).map_err(Failure::from)?;
    Ok(from_compiled(compiled))
}

/// Compile one launch of a Triton kernel from its TTIR (see
/// `rbln_compile::compile_kernel`). `bindings`, one per kernel argument:
/// `("tensor", name, shape)`, `("int", value)` or `("float", value)`.
#[pyfunction]
#[pyo3(signature = (ttir, kernel, grid, bindings))]
pub fn _compile_kernel(py: Python<'_>, ttir: &str, kernel: Option<String>, grid: (u32, u32, u32), bindings: Vec<Bound<'_, PyTuple>>) -> PyResult<CompiledModel> {
    use rbln_compile::ttir::{Binding, Scalar};
    let mut binds = Vec::with_capacity(bindings.len());
    for b in &bindings {
        let kind: String = b.get_item(0)?.extract()?;
        binds.push(match kind.as_str() {
            "tensor" => Binding::Tensor { name: b.get_item(1)?.extract()?, shape: b.get_item(2)?.extract()? },
            "int" => Binding::Scalar(Scalar::Int(b.get_item(1)?.extract()?)),
            "float" => Binding::Scalar(Scalar::Float(b.get_item(1)?.extract()?)),
            other => return Err(pyo3::exceptions::PyValueError::new_err(format!("unknown binding kind {other:?}"))),
        });
    }
    let grid = [grid.0, grid.1, grid.2];
    let compiled = py.detach(|| rbln_compile::compile_kernel(ttir, kernel.as_deref(), grid, &binds)).map_err(Failure::from)?;
    Ok(from_compiled(compiled))
}

/// A CompiledModel with the compiler's report.
fn from_compiled(compiled: rbln_compile::Compiled) -> CompiledModel {
    let r = compiled.report;
    CompiledModel {
        model: compiled.model,
        report: Some(Report {
            format: r.format.name(),
            source_nodes: r.onnx_nodes,
            device_ops: r.device_ops.into_iter().collect(),
            views: r.views,
            memory: r.memory,
        }),
    }
}
