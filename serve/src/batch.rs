//! Dynamic batching for models compiled with a leading batch dimension
//! (config.json `max_batch_size`, `max_batch_delay_us`).
//!
//! A [`Batcher`] stands in front of a model's backend. Its thread keeps as
//! many batches in flight as the backend runs at once
//! ([`Backend::concurrency`]: instances on all devices); while they run,
//! requests queue up, and the next batch takes queued requests, oldest
//! first, until it holds `max_rows` rows (a request that would overflow
//! the batch starts the next one). A batch is formed at once when the
//! backend has room, unless `max_batch_delay_us` asks the first request to
//! wait that long for company. The rows are concatenated along dimension
//! 0 and padded to the compiled batch by repeating the last row (a valid
//! input, unlike zeros for a model with an index range); the outputs are
//! cut back into each request's rows, and the padding rows dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rbln_runtime::{Data, Tensor};

use crate::model::{Backend, Job, Outcome, QueueSlot, Reply};
use crate::tensor::Batching;

/// Longest `max_batch_delay_us` accepted (10 s).
pub const MAX_DELAY_US: u64 = 10_000_000;

/// Rows of a request (the leading dimension of its first input).
fn rows(job: &Job) -> usize {
    job.inputs.first().and_then(|t| t.shape.first()).map_or(1, |&r| r as usize)
}

/// Batches in flight, bounded by the backend's concurrency.
struct InFlight {
    count: Mutex<usize>,
    freed: Condvar,
}

impl InFlight {
    fn acquire(&self, limit: usize, stop: &AtomicBool) -> bool {
        let mut n = self.count.lock().unwrap_or_else(|e| e.into_inner());
        while *n >= limit {
            if stop.load(Ordering::Acquire) {
                return false;
            }
            n = self.freed.wait_timeout(n, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
        }
        *n += 1;
        true
    }

    fn release(&self) {
        let mut n = self.count.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        self.freed.notify_one();
    }
}

/// The requests of one batched run; answering it answers each with its
/// own rows. Dropped unanswered (the backend gave up on the run), each
/// request's caller sees its instance stop.
pub struct Members {
    jobs: Vec<(Job, usize)>,
    inflight: Arc<InFlight>,
}

impl Members {
    /// Every request's caller gave up.
    pub fn abandoned(&self) -> bool {
        self.jobs.iter().all(|(j, _)| j.abandoned())
    }

    pub fn answer(mut self, outcome: Outcome) {
        let jobs = std::mem::take(&mut self.jobs);
        match outcome.and_then(|outs| split(outs, &jobs.iter().map(|(_, r)| *r).collect::<Vec<_>>())) {
            Ok(parts) => {
                for ((job, _), outs) in jobs.into_iter().zip(parts) {
                    job.answer(Ok(outs));
                }
            }
            Err(e) => {
                for (job, _) in jobs {
                    job.answer(Err(e.clone()));
                }
            }
        }
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        self.inflight.release();
    }
}

/// A model's backend behind a dynamic batcher.
pub struct Batcher {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The backend the thread feeds (for `healthy`).
    inner: Arc<dyn Backend>,
}

impl Batcher {
    /// Starts the batching thread in front of `backend`. `sizes` records
    /// the rows of every run.
    pub fn start(name: &str, backend: Box<dyn Backend>, batching: Batching, delay: Duration, sizes: prometheus::Histogram) -> Self {
        let backend: Arc<dyn Backend> = Arc::from(backend);
        let inner = backend.clone();
        let (tx, rx) = mpsc::channel::<Job>();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("rbln-batch:{name}"))
            .spawn(move || run(rx, backend, batching, delay, sizes, &stop2))
            .ok();
        if thread.is_none() {
            eprintln!("rbln-serve: model '{name}': cannot start its batching thread; its requests will fail");
        }
        Self { jobs: Mutex::new(thread.is_some().then_some(tx)), stop, thread, inner }
    }
}

impl Backend for Batcher {
    fn healthy(&self) -> bool {
        self.inner.healthy()
    }

    fn submit(&self, job: Job) {
        if let Some(tx) = self.jobs.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            // A send error drops the job: its caller sees "stopped".
            let _ = tx.send(job);
        }
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A batch being formed.
struct Forming {
    jobs: Vec<Job>,
    rows: usize,
    max: usize,
}

impl Forming {
    fn full(&self) -> bool {
        self.rows >= self.max
    }

    /// Adds `job` unless its caller gave up; a job that would overflow the
    /// batch is handed back (it starts the next one).
    fn offer(&mut self, job: Job) -> Option<Job> {
        if job.abandoned() {
            return None;
        }
        let r = rows(&job);
        if self.rows + r > self.max {
            return Some(job);
        }
        self.rows += r;
        self.jobs.push(job);
        None
    }
}

/// The batching thread: until the model is unloaded (its sender dropped),
/// form batches and hand them to the backend. Dropping the backend at the
/// end waits for the runs in flight.
fn run(rx: mpsc::Receiver<Job>, backend: Arc<dyn Backend>, batching: Batching, delay: Duration, sizes: prometheus::Histogram, stop: &AtomicBool) {
    let inflight = Arc::new(InFlight { count: Mutex::new(0), freed: Condvar::new() });
    let limit = backend.concurrency().max(1);
    let mut carry: Option<Job> = None;
    loop {
        let first = match carry.take() {
            Some(j) => j,
            None => match rx.recv() {
                Ok(j) => j,
                Err(_) => break,
            },
        };
        if first.abandoned() {
            continue;
        }
        let deadline = first.queued + delay;
        let mut batch = Forming { rows: rows(&first), jobs: vec![first], max: batching.max_rows };
        // Take what comes until the batch is full or its first request has
        // waited `delay` and the backend has room.
        while !batch.full() {
            let now = Instant::now();
            let next = if now < deadline {
                rx.recv_timeout(deadline - now).ok()
            } else {
                rx.try_recv().ok()
            };
            let Some(job) = next else { break };
            carry = batch.offer(job);
            if carry.is_some() {
                break;
            }
        }
        if !inflight.acquire(limit, stop) {
            break;
        }
        // Requests that arrived while every run was busy join this batch.
        while carry.is_none() && !batch.full() {
            let Ok(job) = rx.try_recv() else { break };
            carry = batch.offer(job);
        }
        let Forming { mut jobs, rows: total, .. } = batch;
        jobs.retain(|j| !j.abandoned());
        if jobs.is_empty() {
            inflight.release();
            continue;
        }
        sizes.observe(total as f64);
        let row_counts: Vec<usize> = jobs.iter().map(rows).collect();
        let parts: Vec<Vec<Tensor>> = jobs.iter_mut().map(|j| std::mem::take(&mut j.inputs)).collect();
        let queued = jobs[0].queued;
        let members = Members { jobs: jobs.into_iter().zip(row_counts).collect(), inflight: inflight.clone() };
        match concat(&parts, batching.compiled_rows) {
            Ok(inputs) => backend.submit(Job { inputs, reply: Reply::Batch(members), slot: QueueSlot::unqueued(), queued }),
            Err(e) => members.answer(Err(e)),
        }
    }
}

/// The requests' inputs (each a list in the model's input order, same
/// trailing shapes) concatenated along dimension 0 and padded to `rows`
/// rows by repeating the last row.
pub fn concat(parts: &[Vec<Tensor>], rows: usize) -> Result<Vec<Tensor>, String> {
    let Some(first) = parts.first() else { return Err("an empty batch".into()) };
    let mut out = Vec::with_capacity(first.len());
    for i in 0..first.len() {
        let tensors: Vec<&Tensor> = parts.iter().map(|p| p.get(i).ok_or("requests of a batch differ in their inputs")).collect::<Result<_, _>>()?;
        let inner = &tensors[0].shape.get(1..).ok_or("a batched input is a scalar")?;
        if tensors.iter().any(|t| t.shape.get(1..) != Some(inner) || t.data.dtype() != tensors[0].data.dtype()) {
            return Err("requests of a batch differ in an input's shape or datatype".into());
        }
        let given: usize = tensors.iter().map(|t| t.shape[0] as usize).sum();
        if given == 0 || given > rows {
            return Err(format!("a batch of {given} rows for a model compiled for {rows}"));
        }
        let mut shape = tensors[0].shape.clone();
        shape[0] = rows as u64;
        let data = match tensors[0].data {
            Data::F32(_) => Data::F32(gather_rows(&tensors, rows, |d| if let Data::F32(v) = d { Some(v) } else { None })?),
            Data::I32(_) => Data::I32(gather_rows(&tensors, rows, |d| if let Data::I32(v) = d { Some(v) } else { None })?),
            Data::I64(_) => Data::I64(gather_rows(&tensors, rows, |d| if let Data::I64(v) = d { Some(v) } else { None })?),
            Data::I8(_) => Data::I8(gather_rows(&tensors, rows, |d| if let Data::I8(v) = d { Some(v) } else { None })?),
            Data::U8(_) => Data::U8(gather_rows(&tensors, rows, |d| if let Data::U8(v) = d { Some(v) } else { None })?),
            Data::Bool(_) => Data::Bool(gather_rows(&tensors, rows, |d| if let Data::Bool(v) = d { Some(v) } else { None })?),
        };
        out.push(Tensor { shape, data });
    }
    Ok(out)
}

fn gather_rows<T: Copy>(tensors: &[&Tensor], rows: usize, view: impl Fn(&Data) -> Option<&Vec<T>>) -> Result<Vec<T>, String> {
    let row_len: usize = tensors[0].shape[1..].iter().map(|&d| d as usize).product();
    let mut v = Vec::with_capacity(rows * row_len);
    for t in tensors {
        let d = view(&t.data).ok_or("requests of a batch differ in an input's datatype")?;
        if d.len() != t.shape[0] as usize * row_len {
            return Err("a request's input does not hold its shape's elements".into());
        }
        v.extend_from_slice(d);
    }
    let last = v.len() - row_len;
    while v.len() < rows * row_len {
        v.extend_from_within(last..last + row_len);
    }
    Ok(v)
}

/// The run's outputs cut into consecutive row ranges of `sizes` rows (the
/// rest, padding, dropped).
pub fn split(outputs: Vec<Tensor>, sizes: &[usize]) -> Result<Vec<Vec<Tensor>>, String> {
    let need: usize = sizes.iter().sum();
    let mut parts: Vec<Vec<Tensor>> = sizes.iter().map(|_| Vec::with_capacity(outputs.len())).collect();
    for t in outputs {
        let rows = t.shape.first().copied().unwrap_or(0) as usize;
        if rows < need {
            return Err(format!("the batched run returned {rows} rows, {need} expected"));
        }
        let row_len = t.data.len() / rows;
        let mut start = 0;
        for (part, &n) in parts.iter_mut().zip(sizes) {
            let mut shape = t.shape.clone();
            shape[0] = n as u64;
            let r = start * row_len..(start + n) * row_len;
            let data = match &t.data {
                Data::F32(v) => Data::F32(v[r].to_vec()),
                Data::I32(v) => Data::I32(v[r].to_vec()),
                Data::I64(v) => Data::I64(v[r].to_vec()),
                Data::I8(v) => Data::I8(v[r].to_vec()),
                Data::U8(v) => Data::U8(v[r].to_vec()),
                Data::Bool(v) => Data::Bool(v[r].to_vec()),
            };
            part.push(Tensor { shape, data });
            start += n;
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[u64], v: Vec<f32>) -> Tensor {
        Tensor { shape: shape.to_vec(), data: Data::F32(v) }
    }

    #[test]
    fn concat_pads_with_the_last_row_and_split_cuts_it_off() {
        let a = vec![t(&[1, 2], vec![1.0, 2.0]), Tensor { shape: vec![1], data: Data::I64(vec![7]) }];
        let b = vec![t(&[2, 2], vec![3.0, 4.0, 5.0, 6.0]), Tensor { shape: vec![2], data: Data::I64(vec![8, 9]) }];
        let c = concat(&[a, b], 4).unwrap();
        assert_eq!(c[0].shape, vec![4, 2]);
        assert_eq!(c[0].data, Data::F32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 5.0, 6.0]));
        assert_eq!(c[1].data, Data::I64(vec![7, 8, 9, 9]));
        let parts = split(c, &[1, 2]).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0][0].shape, vec![1, 2]);
        assert_eq!(parts[0][0].data, Data::F32(vec![1.0, 2.0]));
        assert_eq!(parts[1][0].data, Data::F32(vec![3.0, 4.0, 5.0, 6.0]));
        assert_eq!(parts[1][1].shape, vec![2]);
        assert_eq!(parts[1][1].data, Data::I64(vec![8, 9]));
    }

    #[test]
    fn concat_and_split_int8_and_uint8() {
        let a = vec![Tensor::new(&[1, 2], vec![-128i8, 1]), Tensor::new(&[1], vec![255u8])];
        let b = vec![Tensor::new(&[1, 2], vec![2i8, 127]), Tensor::new(&[1], vec![0u8])];
        let c = concat(&[a, b.clone()], 3).unwrap();
        assert_eq!(c[0].data, Data::I8(vec![-128, 1, 2, 127, 2, 127]));
        assert_eq!(c[1].data, Data::U8(vec![255, 0, 0]));
        let parts = split(c, &[1, 1]).unwrap();
        assert_eq!(parts[1], b);
        let i8_vs_u8 = vec![Tensor::new(&[1, 2], vec![1u8, 2]), Tensor::new(&[1], vec![0u8])];
        assert!(concat(&[parts[0].clone(), i8_vs_u8], 2).unwrap_err().contains("differ"));
    }

    #[test]
    fn concat_refuses_mismatched_requests() {
        let a = vec![t(&[1, 2], vec![1.0, 2.0])];
        let b = vec![t(&[1, 3], vec![1.0, 2.0, 3.0])];
        assert!(concat(&[a.clone(), b], 4).unwrap_err().contains("differ"));
        assert!(concat(&[a.clone(), a.clone(), a], 2).unwrap_err().contains("3 rows"));
        assert!(split(vec![t(&[2, 1], vec![1.0, 2.0])], &[2, 1]).unwrap_err().contains("2 rows, 3 expected"));
    }
}
