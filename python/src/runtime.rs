//! `rbln.Runtime`: one model on one device, synchronous runs.

use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use rbln_runtime::ModelInfo;

use crate::errors::Failure;
use crate::model::{model_from, properties};
use crate::tensors::{gather_inputs, info_dict, outputs_to_py, to_input, to_inputs, write_out, Input, TensorType};

/// A compiled model loaded on an NPU, ready to run.
///
/// `Runtime(model, *, entry=None, device=0, tensor_type="np",
/// activate_profiler=False, state=None)`: `model` is a .rbln path or an
/// `rbln.CompiledModel`; a model with several entry points has them all
/// loaded over one copy of the weights, `entry` (default: the main
/// program) or `select(name)` choosing the one that runs. `run(*inputs,
/// **named)` (also `rt(*inputs)`) returns one array for a single-output
/// model, a list otherwise; `out=` writes into pre-allocated arrays. The
/// GIL is released while the device works; a Runtime may be shared between
/// threads (runs are serialized). `close()` frees the device memory and
/// queue at once; a Runtime is also a context manager.
#[pyclass(module = "rbln._rbln", name = "Runtime", frozen)]
pub struct Runtime {
    inner: Mutex<Option<rbln_runtime::Runtime>>,
    /// What runs of the selected entry take and give (without the bound
    /// state).
    info: Mutex<Arc<ModelInfo>>,
    /// Every entry point's inputs (the state inputs' types).
    all_inputs: Vec<rbln_runtime::IoInfo>,
    properties: Vec<(String, String)>,
    tensor_type: TensorType,
    profiler: bool,
    device: u32,
    /// Chrome trace of the last profiled run (activate_profiler=True).
    trace: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[pymethods]
impl Runtime {
    #[new]
    #[pyo3(signature = (model, *, entry = None, device = 0, tensor_type = "np", activate_profiler = false, state = None))]
    fn py_new(
        model: &Bound<'_, PyAny>,
        entry: Option<String>,
        device: u32,
        tensor_type: &str,
        activate_profiler: bool,
        state: Option<Vec<(String, String)>>,
    ) -> PyResult<Self> {
        let py = model.py();
        let tensor_type = TensorType::parse(py, tensor_type)?;
        let model = model_from(model)?;
        let all_inputs = model.entry_points().into_iter().flat_map(|e| rbln_runtime::inspect_entry(&model, e).inputs).collect();
        let properties = properties(&model);
        let pairs = state.unwrap_or_default();
        let rt = py
            .detach(|| -> Result<_, Failure> {
                let dev = rbln_umd::Device::open(device)?;
                let mut rt = rbln_runtime::Runtime::new(&dev, model)?;
                if let Some(e) = &entry {
                    rt.select(e)?;
                }
                if !pairs.is_empty() {
                    rt.bind_state(&pairs)?;
                }
                Ok(rt)
            })
            .map_err(PyErr::from)?;
        let info = Mutex::new(Arc::new(rt.info()));
        Ok(Self {
            inner: Mutex::new(Some(rt)),
            info,
            all_inputs,
            properties,
            tensor_type,
            profiler: activate_profiler,
            device,
            trace: Mutex::new(None),
        })
    }

    /// Run one inference: inputs by position and/or by name.
    #[pyo3(signature = (*args, out = None, **kwargs))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        out: Option<&Bound<'py, PyAny>>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let info = self.info();
        let inputs = gather_inputs(&info, args, kwargs)?;
        let inputs = to_inputs(&info, &inputs)?;
        let views: Vec<_> = inputs.iter().map(Input::view).collect();
        // Without the GIL, the arrays are read while staging them: another
        // thread writing them meanwhile races as it would with NumPy's own
        // GIL-free operations.
        let outs = py
            .detach(|| -> Result<_, Failure> {
                let mut g = lock(&self.inner);
                let rt = g.as_mut().ok_or_else(|| Failure::closed("runtime"))?;
                if self.profiler {
                    let (outs, profile) = rt.profile_views(&views)?;
                    *lock(&self.trace) = Some(profile.to_chrome_trace(&info.name));
                    Ok(outs)
                } else {
                    Ok(rt.run_views(&views)?)
                }
            })
            .map_err(PyErr::from)?;
        // Release the read borrows: `out` may be one of the inputs.
        drop(views);
        drop(inputs);
        match out {
            Some(o) => write_out(o, outs, &info),
            None => outputs_to_py(py, outs, self.tensor_type),
        }
    }

    /// The entry points' names (the main program first).
    #[getter]
    fn entries(&self) -> Vec<String> {
        self.info().entries.clone()
    }

    /// The selected entry point.
    #[getter]
    fn entry(&self) -> String {
        self.info().entry.clone()
    }

    /// Make entry point `name` the one that runs (its inputs, outputs and
    /// `inspect()` from now on).
    fn select(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let info = py
            .detach(|| -> Result<_, Failure> {
                let mut g = lock(&self.inner);
                let rt = g.as_mut().ok_or_else(|| Failure::closed("runtime"))?;
                rt.select(name)?;
                Ok(rt.info())
            })
            .map_err(PyErr::from)?;
        *lock(&self.info) = Arc::new(info);
        Ok(())
    }

    /// For `make bench` (tests/bench/python_bench.py): the latencies (ns)
    /// of `n` runs of the Rust `Runtime` looped in Rust on these inputs,
    /// the reference `run`'s own overhead is measured against, in the
    /// same process, interleaved with Python calls.
    #[pyo3(signature = (*args, n))]
    fn _time_rust<'py>(&self, py: Python<'py>, args: &Bound<'py, PyTuple>, n: usize) -> PyResult<Vec<u64>> {
        let info = self.info();
        let inputs = gather_inputs(&info, args, None)?;
        let inputs = to_inputs(&info, &inputs)?;
        let views: Vec<_> = inputs.iter().map(Input::view).collect();
        py.detach(|| -> Result<_, Failure> {
            let mut g = lock(&self.inner);
            let rt = g.as_mut().ok_or_else(|| Failure::closed("runtime"))?;
            let mut lat = Vec::with_capacity(n);
            for _ in 0..n {
                let t = rbln_umd::clock::now();
                rt.run_views(&views)?;
                lat.push(t.elapsed().as_nanos() as u64);
            }
            Ok(lat)
        })
        .map_err(PyErr::from)
    }

    /// `rt(*inputs)` is `rt.run(*inputs)`.
    #[pyo3(signature = (*args, out = None, **kwargs))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        out: Option<&Bound<'py, PyAny>>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.run(py, args, out, kwargs)
    }

    /// Inputs, outputs, memory (arena, staging, weights), ops, properties.
    fn inspect<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        info_dict(py, &self.info(), &self.properties)
    }

    /// The (input, output) pairs kept on the device (`state=`).
    #[getter(state)]
    fn bound_state(&self) -> Vec<(String, String)> {
        self.info().state.clone()
    }

    /// Zero every state tensor (a new sequence).
    fn reset_state(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| -> Result<(), Failure> {
            let mut g = lock(&self.inner);
            Ok(g.as_mut().ok_or_else(|| Failure::closed("runtime"))?.reset_state()?)
        })
        .map_err(PyErr::from)
    }

    /// Write the state input `name` (e.g. a prefill's KV cache).
    fn set_state(&self, py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let want = self.all_inputs.iter().find(|i| i.name == name).ok_or_else(|| {
            PyErr::from(Failure::from(rbln_runtime::Error::State(format!("'{name}' is not a bound state input (bound: {:?})", self.info().state))))
        })?;
        let input = to_input(value, want)?;
        let view = input.view();
        py.detach(|| -> Result<(), Failure> {
            let mut g = lock(&self.inner);
            Ok(g.as_mut().ok_or_else(|| Failure::closed("runtime"))?.set_state(name, view)?)
        })
        .map_err(PyErr::from)
    }

    /// The state input `name` as the next run will read it.
    fn get_state<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let t = py
            .detach(|| -> Result<_, Failure> {
                let mut g = lock(&self.inner);
                Ok(g.as_mut().ok_or_else(|| Failure::closed("runtime"))?.state(name)?)
            })
            .map_err(PyErr::from)?;
        outputs_to_py(py, vec![t], self.tensor_type)
    }

    /// Device time (ns) of the last completed run, from the device
    /// timestamps around every inference (no profiler needed); None before
    /// the first run or after a failed one.
    fn last_device_time_ns(&self) -> PyResult<Option<u64>> {
        let g = lock(&self.inner);
        let rt = g.as_ref().ok_or_else(|| PyErr::from(Failure::closed("runtime")))?;
        Ok(rt.last_device_time().map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)))
    }

    /// The Chrome trace (JSON text) of the last run, when the runtime was
    /// made with `activate_profiler=True`; None before the first run.
    fn profile_trace(&self) -> Option<String> {
        lock(&self.trace).clone()
    }

    /// Free the model's device memory and queue; later runs raise
    /// `rbln.RBLNClosedError`. Closing twice is allowed.
    fn close(&self, py: Python<'_>) {
        let rt = py.detach(|| lock(&self.inner).take());
        drop(rt);
    }

    #[getter]
    fn closed(&self) -> bool {
        lock(&self.inner).is_none()
    }

    #[getter]
    fn device(&self) -> u32 {
        self.device
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { " closed" } else { "" };
        let info = self.info();
        let entry = if info.entries.len() > 1 { format!(" entry='{}'", info.entry) } else { String::new() };
        format!("<rbln.Runtime '{}'{entry} device={}{state}>", info.name, self.device)
    }
}

impl Runtime {
    fn info(&self) -> Arc<ModelInfo> {
        lock(&self.info).clone()
    }
}
