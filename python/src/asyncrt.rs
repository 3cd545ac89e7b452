//! `rbln.AsyncRuntime`: many requests in flight on `parallel` model
//! instances (`rbln_runtime::AsyncRuntime`), without blocking the caller.
//!
//! A call converts and checks the inputs, then hands the request to the
//! runtime's submitter thread (a channel send): it never waits for the
//! device, so asyncio's event loop is never blocked. The submitter thread
//! owns the Rust `AsyncRuntime` and submits requests in call order (its
//! `run` waits when both instances are busy). The Rust runtime's slot
//! threads complete each request's [`Task`] (`RunHandle::on_complete`):
//! waiters of `Task.wait` are woken, and either a registered callback is
//! called (taking the GIL) or, for asyncio, the task's token is queued
//! on a [`CompletionQueue`] whose descriptor the event loop watches: the
//! loop collects every finished request in one wake-up, and the threads
//! completing them never take the GIL. A request whose waiter went away
//! (a cancelled asyncio task) still runs to completion in its turn, so no
//! other request is lost or reordered.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use rbln_runtime::{ModelInfo, Tensor, TensorView};

use crate::errors::Failure;
use crate::model::{model_from, properties};
use crate::tensors::{gather_inputs, info_dict, outputs_to_py, to_inputs, to_tensors, Input, TensorType};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A finished request on its way to its asyncio future.
struct Delivery {
    future: Py<PyAny>,
    result: Result<Vec<Tensor>, Failure>,
    tensor_type: TensorType,
}

/// The sending side of a [`CompletionQueue`], shared with the threads
/// that complete requests.
struct QueueSender {
    ready: Mutex<Vec<Delivery>>,
    wake: UnixStream,
}

impl QueueSender {
    /// Queue a finished request; the first after a delivery writes one
    /// byte, which makes the queue's descriptor readable.
    fn push(&self, d: Delivery) {
        let was_empty = {
            let mut r = lock(&self.ready);
            r.push(d);
            r.len() == 1
        };
        if was_empty {
            // Non-blocking: a full socket buffer already means "readable".
            let _ = (&self.wake).write(&[1]);
        }
    }
}

/// Finished requests for one asyncio event loop. `AsyncRuntime._run_into`
/// queues each finished request here with its future (no GIL needed) and
/// makes `fileno()` readable; the loop watches the descriptor
/// (`loop.add_reader`) and calls `deliver()`, which sets the futures of
/// every request finished since the last call: one wake-up of the loop
/// for several requests under load, and no Python frame per request.
#[pyclass(module = "rbln._rbln", name = "CompletionQueue", frozen)]
pub struct CompletionQueue {
    sender: Arc<QueueSender>,
    wakeups: UnixStream,
}

#[pymethods]
impl CompletionQueue {
    #[new]
    fn py_new() -> PyResult<Self> {
        let failed = |e: std::io::Error| Failure::new("RBLNRuntimeError", format!("cannot create a completion queue: {e}"));
        let (wakeups, wake) = UnixStream::pair().map_err(failed)?;
        wakeups.set_nonblocking(true).map_err(failed)?;
        wake.set_nonblocking(true).map_err(failed)?;
        Ok(Self { sender: Arc::new(QueueSender { ready: Mutex::new(Vec::new()), wake }), wakeups })
    }

    /// The descriptor that is readable while finished requests wait.
    fn fileno(&self) -> RawFd {
        self.wakeups.as_raw_fd()
    }

    /// On the loop's thread: set the result (or exception) of the future
    /// of every request finished since the last call, in the order they
    /// finished; futures already done (cancelled) are skipped. Returns how
    /// many requests were taken.
    fn deliver(&self, py: Python<'_>) -> usize {
        // Empty the socket first: a request queued after this read but
        // before the take below is delivered now, and its byte only causes
        // one empty call later; none is ever left without a byte.
        let mut buf = [0u8; 256];
        while matches!((&self.wakeups).read(&mut buf), Ok(n) if n > 0) {}
        let ready = std::mem::take(&mut *lock(&self.sender.ready));
        let n = ready.len();
        for d in ready {
            let fut = d.future.bind(py);
            // A failure to set one future must not lose the others.
            if let Err(e) = set_future(fut, d.result, d.tensor_type) {
                e.write_unraisable(py, Some(fut));
            }
        }
        n
    }
}

fn set_future(fut: &Bound<'_, PyAny>, result: Result<Vec<Tensor>, Failure>, tt: TensorType) -> PyResult<()> {
    let py = fut.py();
    if fut.call_method0(intern!(py, "done"))?.is_truthy()? {
        return Ok(()); // cancelled by its awaiter
    }
    match result.map_err(PyErr::from).and_then(|outs| outputs_to_py(py, outs, tt)) {
        Ok(v) => fut.call_method1(intern!(py, "set_result"), (v,))?,
        Err(e) => fut.call_method1(intern!(py, "set_exception"), (e.value(py),))?,
    };
    Ok(())
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

/// Where a request's outcome goes.
enum Completion {
    /// An `rbln.Task` (`AsyncRuntime.run`).
    Task(Arc<TaskState>),
    /// An asyncio future, through its loop's queue (`async_run`).
    Future(Arc<QueueSender>, Delivery),
}

impl Completion {
    fn complete(self, r: Result<Vec<Tensor>, Failure>) {
        match self {
            Completion::Task(state) => state.complete(r),
            Completion::Future(q, d) => q.push(Delivery { result: r, ..d }),
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

/// A request waiting for a free model instance.
struct Job {
    inputs: Vec<Tensor>,
    done: Completion,
}

/// The state of one `AsyncRuntime`'s requests, behind [`Dispatcher::state`].
struct Dispatch {
    /// The Rust runtime; taken by `close` once every request finished.
    rt: Option<rbln_runtime::AsyncRuntime>,
    /// Requests in call order that found the next instance busy.
    waiting: VecDeque<Job>,
    /// Requests started and not yet finished.
    in_flight: usize,
    /// `close` was called: no new requests.
    closing: bool,
}

/// Starts requests on the Rust `AsyncRuntime` without a thread of its own:
/// the caller's thread starts a request when the instance it goes to is
/// free (staging its inputs straight from the caller's arrays); otherwise
/// the request waits, copied, and the slot thread that finishes a request
/// starts the next waiting one at once (it is awake anyway: no thread
/// wake-up between requests, no idle gap on the device). Never holds its
/// lock while taking the GIL: outcomes are delivered after unlocking.
struct Dispatcher {
    state: Mutex<Dispatch>,
    /// Signalled when nothing is in flight or waiting (for `close`).
    idle: Condvar,
}

/// A started request, to hook up once the lock is released (`on_complete`
/// may call back at once, and the callback takes the lock).
type Started = (Result<rbln_runtime::RunHandle, rbln_runtime::Error>, Completion);

impl Dispatcher {
    /// Start waiting requests while the next instance is free (lock held).
    fn pump(d: &mut Dispatch, started: &mut Vec<Started>) {
        while let Some(rt) = d.rt.as_mut() {
            if d.waiting.is_empty() || !rt.ready() {
                break;
            }
            let Some(job) = d.waiting.pop_front() else { break };
            let r = rt.run(&job.inputs);
            d.in_flight += r.is_ok() as usize;
            started.push((r, job.done));
        }
    }

    /// Hook started requests up to their completion (lock not held).
    fn hook(self: &Arc<Self>, started: Vec<Started>) {
        for (r, done) in started {
            match r {
                Ok(h) => {
                    let me = self.clone();
                    h.on_complete(move |r| me.finished(r, done));
                }
                Err(e) => done.complete(Err(e.into())),
            }
        }
    }

    /// On the slot thread that finished a request: start the next waiting
    /// ones first (the device is idle meanwhile), then deliver.
    fn finished(self: &Arc<Self>, r: rbln_runtime::Result<Vec<Tensor>>, done: Completion) {
        let mut started = Vec::new();
        {
            let mut d = lock(&self.state);
            d.in_flight -= 1;
            Self::pump(&mut d, &mut started);
            if d.in_flight == 0 && d.waiting.is_empty() {
                self.idle.notify_all();
            }
        }
        self.hook(started);
        done.complete(r.map_err(Failure::from));
    }

    /// Start `inputs` now if the next instance is free and nothing waits,
    /// else queue a copy. Without the GIL.
    fn submit(self: &Arc<Self>, inputs: &[TensorView<'_>], done: Completion) -> Result<(), (Failure, Completion)> {
        let mut started = Vec::new();
        {
            let mut guard = lock(&self.state);
            let d = &mut *guard;
            let closing = d.closing;
            let Some(rt) = d.rt.as_mut().filter(|_| !closing) else {
                return Err((Failure::closed("runtime"), done));
            };
            if d.waiting.is_empty() && rt.ready() {
                let r = rt.run_views(inputs);
                d.in_flight += r.is_ok() as usize;
                started.push((r, done));
            } else {
                d.waiting.push_back(Job { inputs: inputs.iter().map(TensorView::to_tensor).collect(), done });
            }
        }
        self.hook(started);
        Ok(())
    }

    /// Stop taking requests, wait until every request finished, and hand
    /// the runtime back (to be dropped off the slot threads).
    fn drain(&self) -> Option<rbln_runtime::AsyncRuntime> {
        let mut d = lock(&self.state);
        d.closing = true;
        while d.in_flight > 0 || !d.waiting.is_empty() {
            d = self.idle.wait(d).unwrap_or_else(|e| e.into_inner());
        }
        d.rt.take()
    }
}

/// Pipelined execution: `AsyncRuntime(model, *, device=0, parallel=1,
/// tensor_type="np")`. `run(*inputs)` returns an `rbln.Task` at once;
/// `rbln.AsyncRuntime.async_run` awaits a request on asyncio.
#[pyclass(module = "rbln._rbln", name = "AsyncRuntime", frozen, subclass)]
pub struct AsyncRuntime {
    dispatch: Arc<Dispatcher>,
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
        let tensor_type = TensorType::parse(py, tensor_type)?;
        let model = model_from(model)?;
        let info = rbln_runtime::inspect(&model);
        let properties = properties(&model);
        let rt = py
            .detach(|| -> Result<_, Failure> {
                let dev = rbln_umd::Device::open(device)?;
                Ok(rbln_runtime::AsyncRuntime::new(&dev, model, parallel)?)
            })
            .map_err(PyErr::from)?;
        let dispatch = Arc::new(Dispatcher {
            state: Mutex::new(Dispatch { rt: Some(rt), waiting: VecDeque::new(), in_flight: 0, closing: false }),
            idle: Condvar::new(),
        });
        Ok(Self { dispatch, info, properties, tensor_type, parallel, device })
    }

    /// Submit one inference; returns an `rbln.Task` at once (inputs are
    /// copied first, so the arrays may be reused right away). Wrong
    /// inputs (count, dtype, shape) raise here; device errors and value
    /// range errors are raised by the task.
    #[pyo3(signature = (*args, **kwargs))]
    fn run<'py>(&self, args: &Bound<'py, PyTuple>, kwargs: Option<&Bound<'py, PyDict>>) -> PyResult<Task> {
        let state = Arc::new(TaskState::default());
        self.submit(args, kwargs, Completion::Task(state.clone()))?;
        Ok(Task { state, tensor_type: self.tensor_type, value: Mutex::new(None) })
    }

    /// `async_run`'s submission (rbln/__init__.py): like `run`, but the
    /// outcome goes to the asyncio `future` through `queue`, the
    /// `CompletionQueue` its loop watches.
    fn _run_into<'py>(
        &self,
        queue: &CompletionQueue,
        future: Py<PyAny>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<()> {
        let d = Delivery { future, result: Ok(Vec::new()), tensor_type: self.tensor_type };
        self.submit(args, kwargs, Completion::Future(queue.sender.clone(), d))
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
        lock(&self.dispatch.state).closing
    }

    /// Stop taking requests, let those submitted finish (their tasks
    /// complete), and free the device resources. Closing twice is allowed.
    fn close(&self, py: Python<'_>) {
        // Without the GIL: finishing requests may call Python callbacks,
        // and dropping the runtime joins its slot threads.
        py.detach(|| drop(self.dispatch.drain()));
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

impl AsyncRuntime {
    fn submit(&self, args: &Bound<'_, PyTuple>, kwargs: Option<&Bound<'_, PyDict>>, done: Completion) -> PyResult<()> {
        let py = args.py();
        let inputs = gather_inputs(&self.info, args, kwargs)?;
        let inputs = to_inputs(&self.info, &inputs)?;
        let views: Vec<_> = inputs.iter().map(Input::view).collect();
        precheck(&self.info, &views)?;
        let dispatch = &self.dispatch;
        match py.detach(|| dispatch.submit(&views, done)) {
            Ok(()) => Ok(()),
            // `done` (which may hold a Python future) is dropped here,
            // with the GIL.
            Err((e, _done)) => Err(e.into()),
        }
    }
}

impl Drop for AsyncRuntime {
    fn drop(&mut self) {
        // Dropped by the garbage collector (GIL held): do not wait here
        // (finishing requests may need the GIL). A thread waits for them
        // and drops the runtime; its slot threads must not drop it
        // themselves (a thread cannot join itself).
        let dispatch = self.dispatch.clone();
        lock(&dispatch.state).closing = true;
        let reaper = std::thread::Builder::new().name("rbln-py-close".into()).spawn(move || drop(dispatch.drain()));
        if reaper.is_err() {
            // No thread to spare: the runtime outlives its Python object
            // (its device resources return when the process exits).
            std::mem::forget(self.dispatch.clone());
        }
    }
}

/// For `make bench` (tests/bench/python_bench.py): `n` requests through a
/// Rust `AsyncRuntime` with `parallel` instances, `parallel` in flight, as
/// `rbln-run --async` drives it (after `warmup` requests); returns the
/// wall time in ns. The
/// reference `async_run` under asyncio is measured against, interleaved,
/// in the same process.
#[pyfunction]
#[pyo3(signature = (model, *args, n, warmup = 0, parallel = 2, device = 0))]
pub fn _time_rust_async(
    py: Python<'_>,
    model: &Bound<'_, PyAny>,
    args: &Bound<'_, PyTuple>,
    n: usize,
    warmup: usize,
    parallel: usize,
    device: u32,
) -> PyResult<u64> {
    let model = model_from(model)?;
    let info = rbln_runtime::inspect(&model);
    let inputs = gather_inputs(&info, args, None)?;
    let tensors = to_tensors(&info, &inputs)?;
    py.detach(|| -> Result<u64, Failure> {
        let dev = rbln_umd::Device::open(device)?;
        let mut rt = rbln_runtime::AsyncRuntime::new(&dev, model, parallel)?;
        for _ in 0..warmup {
            rt.run(&tensors)?.wait()?;
        }
        let mut window = std::collections::VecDeque::new();
        let t = rbln_umd::clock::now();
        for _ in 0..n {
            window.push_back(rt.run(&tensors)?);
            if window.len() >= parallel {
                if let Some(h) = window.pop_front() {
                    h.wait()?;
                }
            }
        }
        for h in window {
            h.wait()?;
        }
        Ok(t.elapsed().as_nanos() as u64)
    })
    .map_err(PyErr::from)
}

/// The runtime's own checks (count, dtype, shape), done at submission so
/// that wrong inputs raise at the call, with the runtime's messages.
fn precheck(info: &ModelInfo, tensors: &[TensorView<'_>]) -> Result<(), Failure> {
    use rbln_runtime::Error as E;
    for (t, b) in tensors.iter().zip(&info.inputs) {
        if t.dtype().name() != b.dtype {
            return Err(E::InputDType { name: b.name.clone(), expected: b.dtype, got: t.dtype().name() }.into());
        }
        if t.shape != b.shape {
            return Err(E::InputShape { name: b.name.clone(), expected: b.shape.clone(), got: t.shape.to_vec() }.into());
        }
    }
    Ok(())
}
