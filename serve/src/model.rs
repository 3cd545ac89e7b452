//! A loaded model: its signature, a bounded queue and the backend that
//! runs it. The device backend is one thread per model that owns an
//! `rbln_runtime::AsyncRuntime` (1 or 2 instances on `/dev/rblnN`): it
//! submits each request and the runtime's completion thread answers it
//! through `RunHandle::on_complete`, so no tokio worker ever blocks on the
//! device.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rbln_runtime::Tensor;
use serde::Deserialize;
use tokio::sync::oneshot;

use crate::error::{Kind, Result, ServeError};
use crate::metrics::Metrics;
use crate::tensor::ModelSpec;

/// `DIR/<name>/config.json`: every field optional.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Model instances on the device (AsyncRuntime `parallel`): 1 or 2.
    #[serde(default = "default_instances")]
    pub instances: usize,
    /// Requests queued or running at once; beyond it: 503 / RESOURCE_EXHAUSTED.
    #[serde(default)]
    pub max_queue: Option<usize>,
    /// Longest a request may wait and run, in milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Serve this version instead of the highest one.
    #[serde(default)]
    pub version: Option<u64>,
    /// Devices (N of /dev/rblnN) to put `instances` instances on, each;
    /// default: every `--device` of the server.
    #[serde(default)]
    pub devices: Option<Vec<u32>>,
    /// Dynamic batching: the model was compiled with a leading batch
    /// dimension of at least this size; requests of fewer rows are gathered
    /// into one run of up to this many rows (see [`crate::batch`]).
    #[serde(default)]
    pub max_batch_size: Option<usize>,
    /// How long the first request of a batch waits for others, in
    /// microseconds (default 0: a batch takes what is queued when the
    /// device can take it).
    #[serde(default)]
    pub max_batch_delay_us: Option<u64>,
}

fn default_instances() -> usize {
    2
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self { instances: default_instances(), max_queue: None, timeout_ms: None, version: None, devices: None, max_batch_size: None, max_batch_delay_us: None }
    }
}

impl ModelConfig {
    /// Read `config.json` of a model directory (absent: the defaults).
    pub fn read(model_dir: &Path) -> std::result::Result<Self, String> {
        let p = model_dir.join("config.json");
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(format!("cannot read config.json: {e}")),
        };
        let c: Self = serde_json::from_str(&text).map_err(|e| format!("config.json: {e}"))?;
        if !(1..=2).contains(&c.instances) {
            return Err(format!("config.json: instances must be 1 or 2, not {}", c.instances));
        }
        if c.max_queue == Some(0) {
            return Err("config.json: max_queue must be at least 1".into());
        }
        if c.max_batch_size == Some(0) {
            return Err("config.json: max_batch_size must be at least 1".into());
        }
        if c.max_batch_delay_us.is_some() && c.max_batch_size.is_none() {
            return Err("config.json: max_batch_delay_us needs max_batch_size".into());
        }
        if c.max_batch_delay_us.is_some_and(|d| d > crate::batch::MAX_DELAY_US) {
            return Err(format!("config.json: max_batch_delay_us must be at most {} (10 s)", crate::batch::MAX_DELAY_US));
        }
        if let Some(d) = &c.devices {
            if d.is_empty() {
                return Err("config.json: devices must name at least one device".into());
            }
            if (1..d.len()).any(|i| d[..i].contains(&d[i])) {
                return Err(format!("config.json: devices {d:?} names a device twice"));
            }
        }
        Ok(c)
    }
}

/// What a backend answers with.
pub type Outcome = std::result::Result<Vec<Tensor>, String>;

/// Released when a request leaves the model (answered or dropped):
/// frees its place in the queue.
pub struct QueueSlot {
    /// The model's count of requests queued or running, and its gauge
    /// (none for a batch: its requests hold their own places).
    queue: Option<(Arc<AtomicUsize>, prometheus::IntGauge)>,
    /// The load count of the device the request went to (several devices).
    device: Option<Arc<AtomicUsize>>,
}

impl QueueSlot {
    /// A slot that holds no place in a model's queue (a batch's).
    pub fn unqueued() -> Self {
        Self { queue: None, device: None }
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        if let Some((pending, gauge)) = &self.queue {
            pending.fetch_sub(1, Ordering::AcqRel);
            gauge.dec();
        }
        if let Some(d) = &self.device {
            d.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Where a job's outcome goes.
pub enum Reply {
    /// The request's handler, awaiting it.
    Caller(oneshot::Sender<Outcome>),
    /// The requests gathered into this (batched) run.
    Batch(crate::batch::Members),
}

/// One inference for a backend.
pub struct Job {
    pub inputs: Vec<Tensor>,
    pub reply: Reply,
    pub slot: QueueSlot,
    /// When the request was queued.
    pub queued: Instant,
}

impl Job {
    /// The caller gave up (timeout, client gone): no need to run it.
    pub fn abandoned(&self) -> bool {
        match &self.reply {
            Reply::Caller(tx) => tx.is_closed(),
            Reply::Batch(m) => m.abandoned(),
        }
    }

    /// Answer; the queue place is freed first, so a caller that saw the
    /// answer never finds its own request still counted.
    pub fn answer(self, r: Outcome) {
        drop(self.slot);
        match self.reply {
            Reply::Caller(tx) => {
                let _ = tx.send(r);
            }
            Reply::Batch(m) => m.answer(r),
        }
    }
}

/// Runs inferences. `submit` must not block for long: it hands the job
/// over and answers through `Job::answer` later.
pub trait Backend: Send + Sync {
    fn submit(&self, job: Job);

    /// Jobs it runs at once (instances on all its devices): a batcher
    /// keeps this many batches in flight and gathers the rest.
    fn concurrency(&self) -> usize {
        1
    }

    /// False once it can no longer run anything (every device it runs on
    /// is lost): the model is then not ready.
    fn healthy(&self) -> bool {
        true
    }
}

/// Loads a model version into a backend (the device, or a stand-in in tests).
pub trait Loader: Send + Sync {
    fn load(&self, name: &str, path: &Path, config: &ModelConfig) -> std::result::Result<(ModelSpec, Box<dyn Backend>), String>;
}

/// A model being served.
pub struct LoadedModel {
    pub name: String,
    pub version: u64,
    pub path: PathBuf,
    pub spec: ModelSpec,
    pub max_queue: usize,
    pub timeout: Duration,
    pub instances: usize,
    /// The model's own `devices` (config.json), if any.
    pub devices: Option<Vec<u32>>,
    backend: Box<dyn Backend>,
    pending: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

impl LoadedModel {
    #[allow(clippy::too_many_arguments)]
    pub fn new(name: &str, version: u64, path: PathBuf, spec: ModelSpec, backend: Box<dyn Backend>, config: &ModelConfig, defaults: &Defaults, metrics: Arc<Metrics>) -> Self {
        let max_queue = config.max_queue.unwrap_or(defaults.max_queue);
        let backend = match spec.batching {
            Some(b) => {
                let delay = Duration::from_micros(config.max_batch_delay_us.unwrap_or(0));
                let sizes = metrics.batch_rows.with_label_values(&[name]);
                Box::new(crate::batch::Batcher::start(name, backend, b, delay, sizes))
            }
            None => backend,
        };
        metrics.queue_capacity.with_label_values(&[name]).set(max_queue as i64);
        metrics.queue_depth.with_label_values(&[name]).set(0);
        Self {
            name: name.to_string(),
            version,
            path,
            spec,
            max_queue,
            timeout: Duration::from_millis(config.timeout_ms.unwrap_or(defaults.timeout_ms)),
            instances: config.instances,
            devices: config.devices.clone(),
            backend,
            pending: Arc::new(AtomicUsize::new(0)),
            metrics,
        }
    }

    /// Whether any device of the model still answers.
    pub fn healthy(&self) -> bool {
        self.backend.healthy()
    }

    /// Requests queued or running.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Run one inference (inputs already checked against `spec`).
    pub async fn infer(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let prev = self.pending.fetch_add(1, Ordering::AcqRel);
        let gauge = self.metrics.queue_depth.with_label_values(&[&self.name]);
        gauge.inc();
        let slot = QueueSlot { queue: Some((self.pending.clone(), gauge)), device: None };
        if prev >= self.max_queue {
            drop(slot);
            return Err(ServeError::new(
                Kind::QueueFull,
                format!("model '{}' is busy: its queue of {} request(s) is full, retry later", self.name, self.max_queue),
            ));
        }
        let (tx, rx) = oneshot::channel();
        self.backend.submit(Job { inputs, reply: Reply::Caller(tx), slot, queued: Instant::now() });
        match tokio::time::timeout(self.timeout, rx).await {
            Err(_) => Err(ServeError::new(Kind::Timeout, format!("model '{}': the request timed out after {} ms", self.name, self.timeout.as_millis()))),
            Ok(Err(_)) => Err(ServeError::internal(format!("model '{}': its instance stopped before answering", self.name))),
            Ok(Ok(Err(e))) => Err(ServeError::internal(format!("model '{}': inference failed: {e}", self.name))),
            Ok(Ok(Ok(outs))) => Ok(outs),
        }
    }
}

/// Server-wide defaults a model's config.json may override.
#[derive(Clone, Debug)]
pub struct Defaults {
    pub max_queue: usize,
    pub timeout_ms: u64,
}

/// Loads models onto `/dev/rbln{device}` for each of `devices` (or the
/// model's own `devices`).
pub struct DeviceLoader {
    pub devices: Vec<u32>,
}

impl Loader for DeviceLoader {
    fn load(&self, name: &str, path: &Path, config: &ModelConfig) -> std::result::Result<(ModelSpec, Box<dyn Backend>), String> {
        let model = rbln_format::Model::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let spec = ModelSpec::from_info(&rbln_runtime::inspect(&model))?;
        let devices = config.devices.as_ref().unwrap_or(&self.devices);
        let mut backends = Vec::with_capacity(devices.len());
        for &d in devices {
            backends.push(DeviceBackend::start(name, d, model.clone(), config.instances).map_err(|e| format!("/dev/rbln{d}: {e}"))?);
        }
        if backends.len() == 1 {
            if let Some(b) = backends.pop() {
                return Ok((spec, Box::new(b)));
            }
        }
        Ok((spec, Box::new(Spread::new(backends.into_iter().map(|b| Box::new(b) as Box<dyn Backend>).collect()))))
    }
}

/// A model on several devices: each request goes to the device with the
/// fewest requests queued or running (the first of them on a tie).
pub struct Spread {
    backends: Vec<(Box<dyn Backend>, Arc<AtomicUsize>)>,
}

impl Spread {
    pub fn new(backends: Vec<Box<dyn Backend>>) -> Self {
        Self { backends: backends.into_iter().map(|b| (b, Arc::new(AtomicUsize::new(0)))).collect() }
    }
}

impl Backend for Spread {
    fn concurrency(&self) -> usize {
        self.backends.iter().map(|(b, _)| b.concurrency()).sum()
    }

    fn healthy(&self) -> bool {
        self.backends.iter().any(|(b, _)| b.healthy())
    }

    /// To the least loaded healthy device (any device when none is: the
    /// job then fails with the device's error).
    fn submit(&self, mut job: Job) {
        let pick = |healthy_only: bool| {
            self.backends.iter().filter(|(b, _)| !healthy_only || b.healthy()).min_by_key(|(_, l)| l.load(Ordering::Acquire))
        };
        let Some((b, load)) = pick(true).or_else(|| pick(false)) else {
            return;
        };
        load.fetch_add(1, Ordering::AcqRel);
        job.slot.device = Some(load.clone());
        b.submit(job);
    }
}

/// Whether `e` means the device is lost (it stopped answering: ENODEV).
fn device_lost(e: &rbln_runtime::Error) -> bool {
    matches!(e, rbln_runtime::Error::Device(rbln_umd::Error::DeviceGone { .. }))
}

/// A thread that owns the model's device, AsyncRuntime and instances.
pub struct DeviceBackend {
    parallel: usize,
    /// Set once a request failed because the device is lost; from then on
    /// requests are routed to the model's other devices.
    lost: Arc<std::sync::atomic::AtomicBool>,
    jobs: std::sync::Mutex<Option<mpsc::Sender<Job>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DeviceBackend {
    fn start(name: &str, device: u32, model: rbln_format::Model, parallel: usize) -> std::result::Result<Self, String> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<std::result::Result<(), String>>();
        let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let lost2 = lost.clone();
        let label = name.to_string();
        let thread = std::thread::Builder::new()
            .name(format!("rbln-serve:{name}"))
            .spawn(move || {
                let dev = match rbln_umd::Device::open(device) {
                    Ok(d) => d,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let mut rt = match rbln_runtime::AsyncRuntime::new(&dev, model, parallel) {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let path = dev.path().display().to_string();
                let mark_lost = move |lost: &std::sync::atomic::AtomicBool, e: &rbln_runtime::Error| {
                    if device_lost(e) && !lost.swap(true, Ordering::AcqRel) {
                        eprintln!("rbln-serve: model '{label}': {path} is lost ({e}); its requests go to the model's other devices, if it has any");
                    }
                };
                for mut job in rx {
                    if job.abandoned() {
                        continue;
                    }
                    if lost2.load(Ordering::Acquire) {
                        job.answer(Err(format!("{} is lost (the NPU stopped answering)", dev.path().display())));
                        continue;
                    }
                    let inputs = std::mem::take(&mut job.inputs);
                    // Blocks only while this instance's previous request
                    // still holds its staging buffer.
                    match rt.run(&inputs) {
                        Ok(handle) => {
                            let (lost, mark_lost) = (lost2.clone(), mark_lost.clone());
                            handle.on_complete(move |r| {
                                if let Err(e) = &r {
                                    mark_lost(&lost, e);
                                }
                                job.answer(r.map_err(|e| e.to_string()))
                            })
                        }
                        Err(e) => {
                            mark_lost(&lost2, &e);
                            job.answer(Err(e.to_string()))
                        }
                    }
                }
                // Dropping rt waits for what is in flight.
            })
            .map_err(|e| format!("cannot start the model's thread: {e}"))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self { parallel, lost, jobs: std::sync::Mutex::new(Some(tx)), thread: Some(thread) }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err("the model's thread ended while loading".into())
            }
        }
    }
}

impl Backend for DeviceBackend {
    fn concurrency(&self) -> usize {
        self.parallel
    }

    fn healthy(&self) -> bool {
        !self.lost.load(Ordering::Acquire)
    }

    fn submit(&self, job: Job) {
        let g = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = g.as_ref() {
            // A send error drops the job: its caller sees "stopped".
            let _ = tx.send(job);
        }
    }
}

impl Drop for DeviceBackend {
    fn drop(&mut self) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
