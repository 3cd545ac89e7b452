//! `rbln.AsyncRuntime`: many requests in flight on `parallel` model
//! instances (`rbln_runtime::AsyncRuntime`), without blocking the caller.
//!
//! A call converts and checks the inputs, then hands the request to the
//! runtime's submitter thread (a channel send): it never waits for the
//! device, so asyncio's event loop is never blocked. The submitter thread
//! owns the Rust `AsyncRuntime` and submits requests in call order (its
//! `run` waits when both instances are busy); a completer thread waits for
//! them in the same order and completes each request's [`Task`]: waiters
//! of `Task.wait` are woken, and a registered callback (asyncio: hands the
//! result to the loop with `loop.call_soon_threadsafe`) is called. A
//! request whose waiter went away (a cancelled asyncio task) still runs to
//! completion in its turn, so no other request is lost or reordered.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use rbln_runtime::{ModelInfo, Tensor};

use crate::errors::Failure;
use crate::model::{model_from, properties};
use crate::tensors::{gather_inputs, info_dict, outputs_to_py, to_tensors, TensorType};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Default)]
struct TaskInner {
    done: bool,
    result: Option<Result<Vec<Tensor>, Failure>>,
    callback: Option<Py<PyAny>>,
}

/// Shared between a [`Task`] and the threads completing it.
#[derive(Default)]
struct TaskState {
    inner: Mutex<TaskInner>,
    cv: Condvar,
}

impl TaskState {
    /// Record the outcome, wake waiters, call the callback (taking the
    /// GIL: never called with the GIL held by this thread).
    fn complete(&self, r: Result<Vec<Tensor>, Failure>) {
        let cb = {
            let mut g = lock(&self.inner);
            g.result = Some(r);
            g.done = true;
            g.callback.take()
        };
        self.cv.notify_all();
        if let Some(cb) = cb {
            // At interpreter exit there is nobody left to tell.
            let _ = Python::try_attach(|py| {
                if let Err(e) = cb.call0(py) {
                    e.write_unraisable(py, None);
                }
            });
        }
    }
}

/// A request in flight (from `AsyncRuntime.run`): `wait(timeout=None)`
/// returns its outputs, `done()` says whether it finished.
#[pyclass(module = "rbln._rbln", name = "Task", frozen)]
pub struct Task {
    state: Arc<TaskState>,
    tensor_type: TensorType,
    /// The outputs as Python objects, once converted (later calls return
    /// the same objects).
    value: Mutex<Option<Py<PyAny>>>,
}

impl Task {
    /// The outcome of a finished request as Python values or an exception.
    fn outcome<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(v) = lock(&self.value).as_ref() {
            return Ok(v.bind(py).clone());
        }
        let r = {
            let mut g = lock(&self.state.inner);
            match g.result.take() {
                Some(Ok(outs)) => Ok(outs),
                Some(Err(f)) => {
                    g.result = Some(Err(f.clone()));
                    Err(f)
                }
                None if g.done => Err(Failure::new("RBLNRuntimeError", "the request's result was already taken")),
                None => Err(Failure::new("RBLNRuntimeError", "the request has not finished")),
            }
        };
        let v = outputs_to_py(py, r?, self.tensor_type)?;
        *lock(&self.value) = Some(v.clone().unbind());
        Ok(v)
    }
}

#[pymethods]
impl Task {
    /// Whether the request finished (successfully or not).
    fn done(&self) -> bool {
        lock(&self.state.inner).done
    }

    /// Block until the request finished (at most `timeout` seconds; then
    /// `TimeoutError`) and return its outputs or raise its error. The GIL
    /// is released while waiting.
    #[pyo3(signature = (timeout = None))]
    fn wait<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let deadline = match timeout {
            Some(t) if !t.is_finite() || t < 0.0 => {
                return Err(Failure::new("RBLNValueError", format!("timeout must be a non-negative number of seconds, not {t}")).into())
            }
            Some(t) => Some(Instant::now() + Duration::from_secs_f64(t)),
            None => None,
        };
        let finished = py.detach(|| {
            let mut g = lock(&self.state.inner);
            while !g.done {
                match deadline {
                    None => g = self.state.cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                    Some(d) => {
                        let now = Instant::now();
                        if now >= d {
                            return false;
                        }
                        g = self.state.cv.wait_timeout(g, d - now).unwrap_or_else(|e| e.into_inner()).0;
                    }
                }
            }
            true
        });
        if !finished {
            return Err(pyo3::exceptions::PyTimeoutError::new_err(format!(
                "the request did not finish within {} s",
                timeout.unwrap_or_default()
            )));
        }
        self.outcome(py)
    }

    /// The outputs of a finished request (raises its error; raises
    /// `rbln.RBLNRuntimeError` if it has not finished: use `wait`).
    fn result<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.outcome(py)
    }

    /// Call `fn()` (no arguments) once the request finished, from the
    /// runtime's completion thread, or at once if it already has.
    fn add_done_callback(&self, py: Python<'_>, callback: Py<PyAny>) -> PyResult<()> {
        let now = {
            let mut g = lock(&self.state.inner);
            if g.done {
                true
            } else {
                g.callback = Some(callback.clone_ref(py));
                false
            }
        };
        if now {
            callback.call0(py)?;
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("<rbln.Task {}>", if self.done() { "done" } else { "pending" })
    }
}

struct Job {
    inputs: Vec<Tensor>,
    state: Arc<TaskState>,
}

/// Pipelined execution: `AsyncRuntime(model, *, device=0, parallel=1,
/// tensor_type="np")`. `run(*inputs)` returns an `rbln.Task` at once;
/// `rbln.AsyncRuntime.async_run` awaits a request on asyncio.
#[pyclass(module = "rbln._rbln", name = "AsyncRuntime", frozen, subclass)]
pub struct AsyncRuntime {
    jobs: Mutex<Option<Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    info: ModelInfo,
    properties: Vec<(String, String)>,
    tensor_type: TensorType,
    parallel: usize,
    device: u32,
}

#[pymethods]
impl AsyncRuntime {
    #[new]
    #[pyo3(signature = (model, *, device = 0, parallel = 1, tensor_type = "np"))]
    fn py_new(model: &Bound<'_, PyAny>, device: u32, parallel: usize, tensor_type: &str) -> PyResult<Self> {
        let py = model.py();
        let tensor_type = TensorType::parse(tensor_type)?;
        let model = model_from(model)?;
        let info = rbln_runtime::inspect(&model);
        let properties = properties(&model);
        let mut rt = py
            .detach(|| -> Result<_, Failure> {
                let dev = rbln_umd::Device::open(device)?;
                Ok(rbln_runtime::AsyncRuntime::new(&dev, model, parallel)?)
            })
            .map_err(PyErr::from)?;

        let (jobs_tx, jobs_rx) = channel::<Job>();
        let (done_tx, done_rx) = channel::<(rbln_runtime::RunHandle, Arc<TaskState>)>();
        let spawn_failed = |e: std::io::Error| Failure::new("RBLNRuntimeError", format!("cannot start a runtime thread: {e}"));
        let submitter = std::thread::Builder::new()
            .name("rbln-py-submit".into())
            .spawn(move || {
                for job in jobs_rx {
                    match rt.run(&job.inputs) {
                        Ok(h) => {
                            if let Err(std::sync::mpsc::SendError((_, state))) = done_tx.send((h, job.state)) {
                                state.complete(Err(Failure::new("RBLNRuntimeError", "the runtime's completion thread is gone")));
                            }
                        }
                        Err(e) => job.state.complete(Err(e.into())),
                    }
                }
                // Closing: `rt` is dropped here, after its requests
                // completed (their slots finish them first).
            })
            .map_err(spawn_failed)?;
        let completer = std::thread::Builder::new()
            .name("rbln-py-complete".into())
            .spawn(move || {
                for (h, state) in done_rx {
                    state.complete(h.wait().map_err(Failure::from));
                }
            })
            .map_err(spawn_failed)?;
        Ok(Self {
            jobs: Mutex::new(Some(jobs_tx)),
            threads: Mutex::new(vec![submitter, completer]),
            info,
            properties,
            tensor_type,
            parallel,
            device,
        })
    }

    /// Submit one inference; returns an `rbln.Task` at once (inputs are
    /// copied first, so the arrays may be reused right away). Wrong
    /// inputs (count, dtype, shape) raise here; device errors and value
    /// range errors are raised by the task.
    #[pyo3(signature = (*args, **kwargs))]
    fn run<'py>(&self, args: &Bound<'py, PyTuple>, kwargs: Option<&Bound<'py, PyDict>>) -> PyResult<Task> {
        let inputs = gather_inputs(&self.info, args, kwargs)?;
        let tensors = to_tensors(&self.info, &inputs)?;
        precheck(&self.info, &tensors)?;
        let state = Arc::new(TaskState::default());
        let job = Job { inputs: tensors, state: state.clone() };
        let sent = lock(&self.jobs).as_ref().map(|tx| tx.send(job).is_ok());
        match sent {
            Some(true) => Ok(Task { state, tensor_type: self.tensor_type, value: Mutex::new(None) }),
            Some(false) => Err(Failure::new("RBLNRuntimeError", "the runtime's submission thread is gone").into()),
            None => Err(Failure::closed("runtime").into()),
        }
    }

    /// Inputs, outputs, memory, ops, properties.
    fn inspect<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        info_dict(py, &self.info, &self.properties)
    }

    #[getter]
    fn parallel(&self) -> usize {
        self.parallel
    }

    #[getter]
    fn device(&self) -> u32 {
        self.device
    }

    #[getter]
    fn closed(&self) -> bool {
        lock(&self.jobs).is_none()
    }

    /// Stop taking requests, let those submitted finish (their tasks
    /// complete), and free the device resources. Closing twice is allowed.
    fn close(&self, py: Python<'_>) {
        let tx = lock(&self.jobs).take();
        drop(tx);
        let threads = std::mem::take(&mut *lock(&self.threads));
        // The completer may need the GIL to call callbacks: wait without it.
        py.detach(|| {
            for t in threads {
                let _ = t.join();
            }
        });
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
        format!("<rbln.AsyncRuntime '{}' device={} parallel={}{state}>", self.info.name, self.device, self.parallel)
    }
}

impl Drop for AsyncRuntime {
    fn drop(&mut self) {
        // Dropped by the garbage collector (GIL held): do not join (the
        // completer may need the GIL); closing the channel lets both
        // threads finish what was submitted and exit on their own.
        lock(&self.jobs).take();
    }
}

/// The runtime's own checks (count, dtype, shape), done at submission so
/// that wrong inputs raise at the call, with the runtime's messages.
fn precheck(info: &ModelInfo, tensors: &[Tensor]) -> Result<(), Failure> {
    use rbln_runtime::Error as E;
    for (t, b) in tensors.iter().zip(&info.inputs) {
        if t.dtype().name() != b.dtype {
            return Err(E::InputDType { name: b.name.clone(), expected: b.dtype, got: t.dtype().name() }.into());
        }
        if t.shape != b.shape {
            return Err(E::InputShape { name: b.name.clone(), expected: b.shape.clone(), got: t.shape.clone() }.into());
        }
    }
    Ok(())
}
