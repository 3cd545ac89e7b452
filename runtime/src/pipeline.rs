//! `AsyncRuntime`: many requests in flight, `parallel` = 1 or 2 model
//! instances ("slots") on separate queues. With two slots, request i+1's
//! input is written and transferred while request i computes and its
//! outputs are read back: the slots' queues run concurrently on the device
//! (DMA engines and compute cores are separate resources), and each slot
//! has a completion thread that waits for its fence and copies the outputs
//! out of staging, so that copy overlaps the caller writing the next
//! request's input (on another CPU). Results are delivered per request; a
//! request whose handle is dropped still completes before its slot is
//! reused, so nothing is lost or overwritten.

use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

use rbln_format::Model;
use rbln_umd::{Device, Fence};

use crate::{Result, Runtime, Tensor};

/// Called with a request's outcome by the slot's completion thread
/// ([`RunHandle::on_complete`]).
type Callback = Box<dyn FnOnce(Result<Vec<Tensor>>) + Send>;

#[derive(Default)]
struct CellState {
    /// Set once the request finished (success or error), even after
    /// `result` was taken.
    done: bool,
    result: Option<Result<Vec<Tensor>>>,
    waker: Option<Waker>,
    callback: Option<Callback>,
}

/// Where a request's outputs end up.
#[derive(Default)]
struct Cell {
    state: Mutex<CellState>,
    cv: Condvar,
}

impl Cell {
    fn lock(&self) -> std::sync::MutexGuard<'_, CellState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn complete(&self, r: Result<Vec<Tensor>>) {
        let mut g = self.lock();
        g.done = true;
        // A callback takes the outcome; otherwise it waits for `wait`/`poll`.
        let call = match g.callback.take() {
            Some(f) => Some((f, r)),
            None => {
                g.result = Some(r);
                None
            }
        };
        if let Some(w) = g.waker.take() {
            w.wake();
        }
        drop(g);
        self.cv.notify_all();
        if let Some((f, r)) = call {
            f(r);
        }
    }

    /// Block until the request finished.
    fn wait_done(&self) -> std::sync::MutexGuard<'_, CellState> {
        let mut g = self.lock();
        while !g.done {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g
    }
}

/// One model instance and the thread that completes its requests.
struct Slot {
    rt: Arc<Mutex<Runtime>>,
    jobs: Option<Sender<(Fence, Arc<Cell>)>>,
    worker: Option<JoinHandle<()>>,
    /// The request last submitted here: staging is reused only after it.
    last: Option<Arc<Cell>>,
}

impl Slot {
    fn new(rt: Runtime) -> Self {
        let rt = Arc::new(Mutex::new(rt));
        let (tx, rx) = channel::<(Fence, Arc<Cell>)>();
        let worker_rt = rt.clone();
        let worker = std::thread::Builder::new()
            .name("rbln-complete".into())
            .spawn(move || {
                for (fence, cell) in rx {
                    let r = fence.wait(crate::STREAM_TIMEOUT).map_err(crate::Error::from).and_then(|()| {
                        worker_rt.lock().unwrap_or_else(|e| e.into_inner()).read_outputs()
                    });
                    cell.complete(r);
                }
            })
            .ok();
        Self { rt, jobs: Some(tx), worker, last: None }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Closing the channel ends the worker once it has completed what
        // was submitted.
        self.jobs.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// Pipelined execution over `parallel` model instances.
pub struct AsyncRuntime {
    slots: Vec<Slot>,
    next: usize,
}

/// A request in flight; [`RunHandle::wait`] blocks for its outputs.
pub struct RunHandle {
    cell: Arc<Cell>,
}

impl RunHandle {
    /// Wait for this request's outputs.
    pub fn wait(self) -> Result<Vec<Tensor>> {
        let mut g = self.cell.wait_done();
        g.result.take().unwrap_or(Err(crate::Error::Lost))
    }

    /// Have the slot's completion thread call `f` with this request's
    /// outcome (at once, on this thread, if it already finished): no
    /// thread of the caller's has to wait. `f` runs while the slot's next
    /// request waits for its completion, so it should be quick.
    pub fn on_complete(self, f: impl FnOnce(Result<Vec<Tensor>>) + Send + 'static) {
        let mut g = self.cell.lock();
        if g.done {
            let r = g.result.take().unwrap_or(Err(crate::Error::Lost));
            drop(g);
            f(r);
        } else {
            g.callback = Some(Box::new(f));
        }
    }
}

/// A request in flight as a `Future` (for async callers): the slot's
/// completion thread wakes it, so polling never blocks the executor.
pub struct RunFuture {
    cell: Arc<Cell>,
}

impl Future for RunFuture {
    type Output = Result<Vec<Tensor>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut g = self.cell.lock();
        if g.done {
            return Poll::Ready(g.result.take().unwrap_or(Err(crate::Error::Lost)));
        }
        g.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl AsyncRuntime {
    /// Load `model` `parallel` (1 or 2) times onto `dev`.
    pub fn new(dev: &Device, model: Model, parallel: usize) -> Result<Self> {
        let main = model.main_entry_name().to_string();
        Self::with_entry(dev, model, parallel, &main)
    }

    /// [`AsyncRuntime::new`] running the model's entry point `entry`.
    pub fn with_entry(dev: &Device, model: Model, parallel: usize, entry: &str) -> Result<Self> {
        if !(1..=2).contains(&parallel) {
            return Err(crate::Error::Parallel(parallel));
        }
        let mut slots = Vec::new();
        for _ in 0..parallel {
            let mut rt = Runtime::new(dev, model.clone())?;
            rt.select(entry)?;
            slots.push(Slot::new(rt));
        }
        Ok(Self { slots, next: 0 })
    }

    pub fn parallel(&self) -> usize {
        self.slots.len()
    }

    /// Whether [`AsyncRuntime::run`] would start at once: the instance the
    /// next request goes to has finished its previous request.
    pub fn ready(&self) -> bool {
        self.slots[self.next].last.as_ref().is_none_or(|c| c.lock().done)
    }

    /// Submit one inference; returns once its input is on its way, with a
    /// handle for the outputs.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<RunHandle> {
        self.run_views(&crate::views(inputs))
    }

    /// [`AsyncRuntime::run`] on borrowed inputs (copied into staging
    /// before this returns).
    pub fn run_views(&mut self, inputs: &[crate::TensorView<'_>]) -> Result<RunHandle> {
        let slot = &mut self.slots[self.next];
        // The slot's previous request completes (its outputs are copied
        // out) before its staging is reused.
        if let Some(prev) = slot.last.take() {
            drop(prev.wait_done());
        }
        let fence = slot.rt.lock().unwrap_or_else(|e| e.into_inner()).submit(inputs)?;
        let cell = Arc::new(Cell::default());
        let sent = slot.jobs.as_ref().is_some_and(|tx| tx.send((fence, cell.clone())).is_ok()) && slot.worker.is_some();
        if !sent {
            return Err(crate::Error::Lost);
        }
        slot.last = Some(cell.clone());
        self.next = (self.next + 1) % self.slots.len();
        Ok(RunHandle { cell })
    }

    /// Submit one inference; the future resolves to its outputs.
    pub fn async_run(&mut self, inputs: &[Tensor]) -> Result<RunFuture> {
        Ok(RunFuture { cell: self.run(inputs)?.cell })
    }
}
