//! `AsyncRuntime`: many requests in flight, `parallel` = 1 or 2 model
//! instances ("slots") on separate queues. With two slots, request i+1's
//! input is written and transferred while request i computes: the slots'
//! queues run concurrently on the device (DMA engines and compute cores
//! are separate resources). Results are delivered per request, in
//! submission order; a request whose handle is dropped still completes
//! before its slot is reused, so nothing is lost or overwritten.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};

use rbln_format::Model;
use rbln_umd::Device;

use crate::{Result, Runtime, Tensor};

/// Where a request's outputs end up.
#[derive(Default)]
struct Cell {
    result: Mutex<(Option<Result<Vec<Tensor>>>, Option<Waker>)>,
    done: Condvar,
}

impl Cell {
    fn complete(&self, r: Result<Vec<Tensor>>) {
        let mut g = self.result.lock().unwrap_or_else(|e| e.into_inner());
        g.0 = Some(r);
        if let Some(w) = g.1.take() {
            w.wake();
        }
        self.done.notify_all();
    }
}

/// One model instance and the request it is working on.
struct Slot {
    rt: Runtime,
    in_flight: Option<(rbln_umd::Fence, Arc<Cell>)>,
}

impl Slot {
    /// Finish the request in flight (if any): wait, read outputs, deliver.
    fn finish(&mut self) {
        if let Some((fence, cell)) = self.in_flight.take() {
            let r = fence.wait(crate::STREAM_TIMEOUT).map_err(crate::Error::from).and_then(|()| self.rt.read_outputs());
            cell.complete(r);
        }
    }
}

pub struct AsyncRuntime {
    slots: Vec<Arc<Mutex<Slot>>>,
    next: usize,
}

/// A submitted request.
pub struct RunHandle {
    slot: Arc<Mutex<Slot>>,
    cell: Arc<Cell>,
}

impl RunHandle {
    /// Block until the outputs are ready.
    pub fn wait(self) -> Result<Vec<Tensor>> {
        {
            let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
            let mine = slot.in_flight.as_ref().is_some_and(|(_, c)| Arc::ptr_eq(c, &self.cell));
            if mine {
                slot.finish();
            }
        }
        let mut g = self.cell.result.lock().unwrap_or_else(|e| e.into_inner());
        while g.0.is_none() {
            g = self.cell.done.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g.0.take().unwrap_or_else(|| Err(crate::Error::Lost))
    }
}

/// The `Future` of [`AsyncRuntime::async_run`]: usable from any executor
/// (a helper thread waits for the device and wakes the task).
pub struct RunFuture {
    handle: Option<RunHandle>,
    cell: Arc<Cell>,
}

impl Future for RunFuture {
    type Output = Result<Vec<Tensor>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        {
            let mut g = self.cell.result.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(r) = g.0.take() {
                return Poll::Ready(r);
            }
            g.1 = Some(cx.waker().clone());
        }
        if let Some(h) = self.handle.take() {
            // The waiting thread re-delivers through the cell.
            let cell = self.cell.clone();
            std::thread::spawn(move || {
                let r = h.wait();
                cell.complete(r);
            });
        }
        Poll::Pending
    }
}

impl AsyncRuntime {
    /// `parallel` instances of `model` on `dev` (1 or 2).
    pub fn new(dev: &Device, model: Model, parallel: usize) -> Result<Self> {
        if !(1..=2).contains(&parallel) {
            return Err(crate::Error::Parallel(parallel));
        }
        let mut slots = Vec::new();
        for _ in 0..parallel {
            let rt = Runtime::new(dev, model.clone())?;
            slots.push(Arc::new(Mutex::new(Slot { rt, in_flight: None })));
        }
        Ok(Self { slots, next: 0 })
    }

    pub fn parallel(&self) -> usize {
        self.slots.len()
    }

    /// Submit one inference; returns at once with a handle.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<RunHandle> {
        let slot = self.slots[self.next].clone();
        self.next = (self.next + 1) % self.slots.len();
        let cell = Arc::new(Cell::default());
        {
            let mut s = slot.lock().unwrap_or_else(|e| e.into_inner());
            // The slot's previous request completes before its staging is reused.
            s.finish();
            let fence = s.rt.submit(inputs)?;
            s.in_flight = Some((fence, cell.clone()));
        }
        Ok(RunHandle { slot, cell })
    }

    /// Submit one inference; the future resolves to its outputs.
    pub fn async_run(&mut self, inputs: &[Tensor]) -> Result<RunFuture> {
        let h = self.run(inputs)?;
        let cell = h.cell.clone();
        Ok(RunFuture { handle: Some(h), cell })
    }
}
