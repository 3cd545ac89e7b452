//! `rbln-runtime`: loads compiled `.rbln` models (crate `rbln-format`,
//! docs/rbln-format.md) and runs them on the NPU through `librbln_umd`.
//!
//! [`Runtime::new`] allocates the model's device arena (DRAM) and host
//! staging buffer, uploads descriptors and command streams with every
//! relocation applied, and runs the weight upload once. [`Runtime::run`]
//! checks the inputs against the model (count, names, shapes, dtypes),
//! writes them to staging, submits the input-transfer, run and
//! output-transfer streams, waits, and reads the outputs back.

use std::time::Duration;

use rbln_format::{DType, Model, Placement as Region, RelocBases, StreamRole};
use rbln_umd::{Buffer, Device, Perms, Placement, Queue};

/// Fine-grained wall-clock intervals (shared with the UMD's tools).
pub use rbln_umd::clock;
pub mod batch;
pub mod examples;
pub mod generate;
mod pipeline;
mod state;
pub use pipeline::{AsyncRuntime, RunFuture, RunHandle};
pub mod npy;
pub mod stats;

/// Longest one stream may run before the runtime gives up.
pub(crate) const STREAM_TIMEOUT: Duration = Duration::from_secs(60);
/// Alignment of uploaded program pieces (descriptors, streams).
const PROGRAM_ALIGN: u64 = 64;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot load the model: {0}")]
    Format(#[from] rbln_format::FormatError),
    #[error("{0}")]
    Device(#[from] rbln_umd::Error),
    #[error("the model needs hardware version {need}.{need_minor} or a later minor, but the device is {have_major}.{have_minor}")]
    HardwareVersion { need: u32, need_minor: u32, have_major: u32, have_minor: u32 },
    #[error("the model has {expected} input(s) ({names}), got {got}")]
    InputCount { expected: usize, got: usize, names: String },
    #[error("input '{name}': expected shape {expected:?}, got {got:?}")]
    InputShape { name: String, expected: Vec<u64>, got: Vec<u64> },
    #[error("input '{name}': expected dtype {expected}, got {got}")]
    InputDType { name: String, expected: &'static str, got: &'static str },
    #[error("input '{name}': element {index:?} is {value}, outside the range {lo}..{hi} the model accepts (e.g. the rows of the table it indexes)")]
    InputValue { name: String, index: Vec<u64>, value: i64, lo: i64, hi: i64 },
    #[error("input '{name}': {got} values for shape {shape:?} ({expected} expected)")]
    InputLength { name: String, shape: Vec<u64>, expected: u64, got: usize },
    #[error("model input/output '{name}' is not in the staging buffer (placement {region}); the runtime cannot move it")]
    NotStaged { name: String, region: &'static str },
    #[error("model input/output '{name}' has dtype {dtype}; the runtime passes f32, i32, i64, i8, u8 and bool tensors")]
    EdgeDType { name: String, dtype: &'static str },
    #[error("the model's {what} does not fit ({size} bytes)")]
    TooLarge { what: &'static str, size: u64 },
    /// The model's arena (weights and activations) is larger than the
    /// device's DRAM.
    #[error("the model needs {} of device DRAM ({} of weights, the rest activations), more than the device's {} in all (the device model's --dram-mib sets it)", mib(*.need), mib(*.weights), mib(*.dram))]
    DramTooSmall { need: u64, weights: u64, dram: u64 },
    /// The arena fits the DRAM, but not what other users left free.
    #[error("the model needs {} of device DRAM ({} of weights, the rest activations); the device has {} in all, but not that much free now: other models or processes hold the rest (rbln-smi lists them)", mib(*.need), mib(*.weights), mib(*.dram))]
    DramBusy { need: u64, weights: u64, dram: u64 },
    #[error("parallel must be 1 or 2, not {0}")]
    Parallel(usize),
    #[error("profile runs must be 1 ..= {max}, not {0}", max = MAX_PROFILE_RUNS)]
    ProfileRuns(u32),
    #[error("the request's result was lost (its slot failed)")]
    Lost,
    #[error("the model has no entry point '{name}' (it has: {have})")]
    NoEntry { name: String, have: String },
    #[error("the model has no per-inference command stream")]
    EmptyProgram,
    /// Device-resident state ([`Runtime::bind_state`]) misused.
    #[error("state: {0}")]
    State(String),
    /// A decoder's programs or a generation request do not fit together
    /// ([`generate`]).
    #[error("{0}")]
    Generate(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// `bytes` in MiB, for messages.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// The elements of a tensor, row-major, in one of the dtypes a model's
/// inputs and outputs may have.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    Bool(Vec<bool>),
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::I8(v) => v.len(),
            Data::U8(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::I32(_) => DType::I32,
            Data::I64(_) => DType::I64,
            Data::I8(_) => DType::I8,
            Data::U8(_) => DType::U8,
            Data::Bool(_) => DType::Bool,
        }
    }

    /// The elements borrowed.
    pub fn view(&self) -> DataRef<'_> {
        match self {
            Data::F32(v) => DataRef::F32(v),
            Data::I32(v) => DataRef::I32(v),
            Data::I64(v) => DataRef::I64(v),
            Data::I8(v) => DataRef::I8(v),
            Data::U8(v) => DataRef::U8(v),
            Data::Bool(v) => DataRef::Bool(v),
        }
    }

    /// The elements as f64 (bool as 0/1), for comparisons.
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I8(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U8(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
        }
    }

}

/// The elements of a tensor, borrowed: what the runtime reads inputs
/// from ([`TensorView`]), so callers holding them elsewhere (a NumPy
/// array, a memory map) are copied once, into the device's staging.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DataRef<'a> {
    F32(&'a [f32]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    I8(&'a [i8]),
    U8(&'a [u8]),
    Bool(&'a [bool]),
}

impl DataRef<'_> {
    pub fn len(&self) -> usize {
        match self {
            DataRef::F32(v) => v.len(),
            DataRef::I32(v) => v.len(),
            DataRef::I64(v) => v.len(),
            DataRef::I8(v) => v.len(),
            DataRef::U8(v) => v.len(),
            DataRef::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> DType {
        match self {
            DataRef::F32(_) => DType::F32,
            DataRef::I32(_) => DType::I32,
            DataRef::I64(_) => DType::I64,
            DataRef::I8(_) => DType::I8,
            DataRef::U8(_) => DType::U8,
            DataRef::Bool(_) => DType::Bool,
        }
    }

    /// The bytes the device sees (little-endian; i8, u8 and bool as one
    /// byte, bool 0/1).
    fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        use std::borrow::Cow;
        match *self {
            DataRef::F32(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            DataRef::I32(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            DataRef::I64(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            DataRef::I8(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            DataRef::U8(v) => Cow::Borrowed(v),
            DataRef::Bool(v) => Cow::Owned(v.iter().map(|&b| b as u8).collect()),
        }
    }

    /// Element `i` as an integer (integer dtypes only).
    fn int(&self, i: usize) -> Option<i64> {
        match *self {
            DataRef::I32(v) => v.get(i).map(|&x| x as i64),
            DataRef::I64(v) => v.get(i).copied(),
            DataRef::I8(v) => v.get(i).map(|&x| x as i64),
            DataRef::U8(v) => v.get(i).map(|&x| x as i64),
            _ => None,
        }
    }
}

impl From<Vec<f32>> for Data {
    fn from(v: Vec<f32>) -> Self {
        Data::F32(v)
    }
}
impl From<Vec<i32>> for Data {
    fn from(v: Vec<i32>) -> Self {
        Data::I32(v)
    }
}
impl From<Vec<i64>> for Data {
    fn from(v: Vec<i64>) -> Self {
        Data::I64(v)
    }
}
impl From<Vec<i8>> for Data {
    fn from(v: Vec<i8>) -> Self {
        Data::I8(v)
    }
}
impl From<Vec<u8>> for Data {
    fn from(v: Vec<u8>) -> Self {
        Data::U8(v)
    }
}
impl From<Vec<bool>> for Data {
    fn from(v: Vec<bool>) -> Self {
        Data::Bool(v)
    }
}

/// A tensor by value.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<u64>,
    pub data: Data,
}

impl Tensor {
    /// A tensor of any supported dtype: `Tensor::new(&[2], vec![1.0f32, 2.0])`,
    /// `Tensor::new(&[1, 8], token_ids_i64)`.
    pub fn new(shape: &[u64], data: impl Into<Data>) -> Self {
        Self { shape: shape.to_vec(), data: data.into() }
    }

    /// An f32 tensor of zeros.
    pub fn zeros(shape: &[u64]) -> Self {
        let n = shape.iter().product::<u64>() as usize;
        Self::new(shape, vec![0.0f32; n])
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The elements if the tensor is f32.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The elements if the tensor is f32, mutably.
    pub fn as_f32_mut(&mut self) -> Option<&mut Vec<f32>> {
        match &mut self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Element count the shape asks for.
    pub fn elements(shape: &[u64]) -> u64 {
        shape.iter().product()
    }

    /// The tensor borrowed, for [`Runtime::run_views`].
    pub fn view(&self) -> TensorView<'_> {
        TensorView { shape: &self.shape, data: self.data.view() }
    }
}

/// A tensor's shape and elements, borrowed ([`Runtime::run_views`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorView<'a> {
    pub shape: &'a [u64],
    pub data: DataRef<'a>,
}

impl TensorView<'_> {
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// A copy that owns its elements.
    pub fn to_tensor(&self) -> Tensor {
        let data = match self.data {
            DataRef::F32(v) => Data::F32(v.to_vec()),
            DataRef::I32(v) => Data::I32(v.to_vec()),
            DataRef::I64(v) => Data::I64(v.to_vec()),
            DataRef::I8(v) => Data::I8(v.to_vec()),
            DataRef::U8(v) => Data::U8(v.to_vec()),
            DataRef::Bool(v) => Data::Bool(v.to_vec()),
        };
        Tensor { shape: self.shape.to_vec(), data }
    }
}

fn views(tensors: &[Tensor]) -> Vec<TensorView<'_>> {
    tensors.iter().map(Tensor::view).collect()
}

/// Row-major multi-index of flat element `i` of `shape`.
fn multi_index(shape: &[u64], mut i: u64) -> Vec<u64> {
    let mut idx = vec![0; shape.len()];
    for (k, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            idx[k] = i % d;
            i /= d;
        }
    }
    idx
}

/// A model input or output as the model declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct IoInfo {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    /// Values an integer input may hold (`lo..hi`), if the model says.
    pub range: Option<(i64, i64)>,
}

/// What `inspect` reports.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub name: String,
    pub producer: String,
    /// The program described (its entry name; `main` in a file of one
    /// program) and every entry point of the model.
    pub entry: String,
    pub entries: Vec<String>,
    pub inputs: Vec<IoInfo>,
    pub outputs: Vec<IoInfo>,
    /// Device arena (activations + weights) and host staging sizes.
    pub arena_bytes: u64,
    pub staging_bytes: u64,
    /// The weights section (shared by every entry point), and the bytes
    /// of it this program reads.
    pub weight_bytes: u64,
    pub weights_used_bytes: u64,
    /// (op, count) for every op kind in the graph.
    pub ops: Vec<(String, u32)>,
    /// (input, output) pairs kept on the device ([`Runtime::bind_state`]);
    /// they are not in `inputs` / `outputs`.
    pub state: Vec<(String, String)>,
}

fn io_info(b: &rbln_format::IoBinding) -> IoInfo {
    IoInfo { name: b.name.clone(), dtype: b.dtype.name(), shape: b.shape.clone(), range: b.range.map(|r| (r.lo, r.hi)) }
}

/// Metadata of a model's main program (no device needed).
pub fn inspect(model: &Model) -> ModelInfo {
    inspect_entry(model, model.main())
}

/// Metadata of one program of `model` ([`Model::entry_points`]).
pub fn inspect_entry(model: &Model, e: rbln_format::EntryRef<'_>) -> ModelInfo {
    let m = e.meta;
    ModelInfo {
        name: model.meta.name.clone(),
        producer: m.producer.clone(),
        entry: e.name.to_string(),
        entries: model.entry_points().iter().map(|e| e.name.to_string()).collect(),
        inputs: m.inputs.iter().map(io_info).collect(),
        outputs: m.outputs.iter().map(io_info).collect(),
        arena_bytes: m.arena_size,
        staging_bytes: m.staging_size,
        weight_bytes: model.weights.len() as u64,
        weights_used_bytes: e.weight_bytes_used(),
        ops: m.ops.iter().map(|o| (o.op.clone(), o.count)).collect(),
        state: Vec::new(),
    }
}

/// One timed span of a profiled inference (device clock, nanoseconds).
#[derive(Clone, Debug)]
pub struct ProfileEvent {
    pub name: String,
    pub cat: &'static str,
    pub start_ns: u64,
    pub dur_ns: u64,
}

/// Device timestamps of one inference.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// The events of the last inference of the profiled submission.
    pub events: Vec<ProfileEvent>,
    /// The span (first event start to last event end) of every run, in
    /// order: the first started on a device that had been idle, the others
    /// right after the run before them.
    pub run_spans_ns: Vec<u64>,
}

/// Most inferences one profiled submission may run back to back.
pub const MAX_PROFILE_RUNS: u32 = 100;

/// Span of `events`: first start to last end (0 for none).
fn span_ns(events: &[ProfileEvent]) -> u64 {
    let start = events.iter().map(|e| e.start_ns).min().unwrap_or(0);
    let end = events.iter().map(|e| e.start_ns.saturating_add(e.dur_ns)).max().unwrap_or(0);
    end.saturating_sub(start)
}

impl Profile {
    /// Inferences the profiled submission ran back to back
    /// ([`Runtime::profile_runs`]): one per recorded span, at least one.
    pub fn runs(&self) -> usize {
        self.run_spans_ns.len().max(1)
    }

    /// Chrome trace-event JSON (opens in Perfetto and chrome://tracing):
    /// complete events ("ph":"X") in microseconds from the first event.
    pub fn to_chrome_trace(&self, model: &str) -> String {
        let t0 = self.events.iter().map(|e| e.start_ns).min().unwrap_or(0);
        let events: Vec<serde_json::Value> = self
            .events
            .iter()
            .map(|e| {
                serde_json::json!({
                    "name": e.name, "cat": e.cat, "ph": "X", "pid": 1, "tid": 1,
                    "ts": (e.start_ns - t0) as f64 / 1e3, "dur": e.dur_ns as f64 / 1e3,
                })
            })
            .collect();
        serde_json::json!({
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": {
                "model": model, "clock": "rbln device timestamp", "runs": self.runs(),
                "run_spans_us": self.run_spans_ns.iter().map(|&n| n as f64 / 1e3).collect::<Vec<_>>(),
            },
        })
        .to_string()
    }
}

/// A model loaded on a device, ready to run. A model with several entry
/// points (docs/rbln-format.md §16) has all its programs loaded over one
/// arena and one copy of the weights; [`Runtime::select`] picks the one
/// that `run` (and everything else per inference) uses.
#[derive(Debug)]
pub struct Runtime {
    model: Model,
    dev: Device,
    queue: Queue,
    staging: Buffer,
    /// Every program, in [`Model::entry_points`] order.
    programs: Vec<Loaded>,
    /// The selected program.
    cur: usize,
    /// Device-resident state shared by the programs (state.rs).
    state: Vec<state::StateSlot>,
    // Kept alive while the runtime exists (mapped into the device).
    _arena: Option<Buffer>,
    _program: Buffer,
    /// The state buffers (state.rs).
    _state_buf: Option<Buffer>,
    /// A pre-encoded stream zeroing them ([`Runtime::reset_state`]), its
    /// buffer and (VA, size).
    state_reset: Option<(Buffer, u64, u32)>,
}

/// One program of the model as loaded.
#[derive(Debug)]
struct Loaded {
    /// Every stream's device VA and size, in `Program::streams` order.
    streams: Vec<(u64, u32)>,
    /// What one inference submits: the per-inference streams (input
    /// transfer, run, output transfer) chained ([`Inference`]).
    inference: Inference,
    /// Where the program's buffers are mapped (to relocate its packets
    /// again: [`Runtime::bind_state`]).
    bases: RelocBases,
    /// Its inputs and outputs kept on the device (state.rs).
    state: Vec<state::StatePair>,
    /// The per-inference streams rewritten for the state (state.rs).
    _state_program: Option<Buffer>,
}

/// The per-inference streams of a program as one submission: a stream of
/// INDIRECT packets calling each in order. One ring entry per inference
/// instead of one per stream: each submission costs a doorbell and, when
/// waited for, an interrupt — in a guest far more than the device's work
/// on a small model (a decoder's step: ~0.4 ms of device time, ~0.5 ms
/// per submission round trip).
#[derive(Debug)]
struct Inference {
    /// (device VA, size) to submit; None for a program without
    /// per-inference streams.
    stream: Option<(u64, u32)>,
    /// The two device times the chain writes (at [`Inference::STAMPS`]),
    /// then the chain (TIMESTAMP, an INDIRECT per stream, TIMESTAMP) at
    /// [`Inference::PACKETS`].
    chain: Option<Buffer>,
}

impl Inference {
    /// Offset of the (start, end) device times in the chain buffer.
    const STAMPS: u64 = 0;
    /// Offset of the chain's packets, after the two times.
    const PACKETS: u64 = Self::STAMPS + 16;

    fn new(dev: &Device, streams: &[(u64, u32)]) -> Result<Inference> {
        if streams.is_empty() {
            return Ok(Inference { stream: None, chain: None });
        }
        // Every inference is bracketed by device timestamps (two packets,
        // about a microsecond): its device time is known without the
        // profiler, from the same runs whose wall time the caller sees.
        let encode = |va: u64| {
            let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
            e.timestamp(va + Self::STAMPS);
            for &(sva, len) in streams {
                e.indirect(sva, len);
            }
            e.timestamp(va + Self::STAMPS + 8);
            e.buf
        };
        // The packets' size does not depend on the VA they point at.
        let len = encode(0).len() as u64;
        let (buf, va) = alloc_mapped(dev, Self::PACKETS + len, Placement::Host)?;
        let packets = encode(va);
        buf.write_slice(Self::STAMPS, &[0u64; 2])?;
        buf.write_slice(Self::PACKETS, &packets)?;
        Ok(Inference { stream: Some((va + Self::PACKETS, packets.len() as u32)), chain: Some(buf) })
    }

    /// Device time from the start of the last completed inference to its
    /// end; None before the first, while one runs, or after one that
    /// stopped early.
    fn device_time(&self) -> Option<Duration> {
        let stamps: Vec<u64> = self.chain.as_ref()?.read_vec(Self::STAMPS, 2).ok()?;
        (stamps[0] != 0 && stamps[1] >= stamps[0]).then(|| Duration::from_nanos(stamps[1] - stamps[0]))
    }
}

fn align(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

fn alloc_mapped(dev: &Device, size: u64, placement: Placement) -> Result<(Buffer, u64)> {
    let b = dev.alloc(size.max(4096), placement)?;
    let va = b.map(Perms::RW)?;
    Ok((b, va))
}

impl Runtime {
    /// Load `model` onto `dev`: allocate, upload, relocate, upload weights.
    /// Every entry point is loaded; the main program is selected.
    pub fn new(dev: &Device, model: Model) -> Result<Self> {
        let info = dev.info();
        let entries = model.entry_points();
        for e in &entries {
            let (need, need_minor) = (e.meta.hw_version >> 16, e.meta.hw_version & 0xffff);
            if need != info.hw_version.0 || need_minor > info.hw_version.1 {
                return Err(Error::HardwareVersion { need, need_minor, have_major: info.hw_version.0, have_minor: info.hw_version.1 });
            }
            for b in e.meta.inputs.iter().chain(&e.meta.outputs) {
                if !matches!(b.dtype, DType::F32 | DType::I32 | DType::I64 | DType::I8 | DType::U8 | DType::Bool) {
                    return Err(Error::EdgeDType { name: b.name.clone(), dtype: b.dtype.name() });
                }
                if !matches!(b.placement, Region::Staging { .. }) {
                    return Err(Error::NotStaged { name: b.name.clone(), region: b.placement.region() });
                }
            }
        }
        // One arena and one staging buffer, as large as the largest
        // program needs: programs run one at a time.
        let arena_size = entries.iter().map(|e| e.meta.arena_size).max().unwrap_or(0);
        let staging_size = entries.iter().map(|e| e.meta.staging_size).max().unwrap_or(0);
        let weights = model.weights.len() as u64;
        if arena_size > info.dram_size {
            return Err(Error::DramTooSmall { need: arena_size, weights, dram: info.dram_size });
        }
        let arena = match arena_size {
            0 => None,
            _ => Some(alloc_mapped(dev, arena_size, Placement::Dram).map_err(|e| match e {
                Error::Device(rbln_umd::Error::NoSpace { .. }) => Error::DramBusy { need: arena_size, weights, dram: info.dram_size },
                e => e,
            })?),
        };
        let (staging, staging_va) = alloc_mapped(dev, staging_size, Placement::Host)?;

        // Program buffer: each program's descriptors and streams, then the
        // weights once (the source of the weight upload).
        let mut off = 0u64;
        let mut layout = Vec::with_capacity(entries.len());
        for e in &entries {
            let desc = off;
            off = align(off + e.program.descriptors.len() as u64, PROGRAM_ALIGN);
            let mut stream_offs = Vec::with_capacity(e.program.streams.len());
            for s in &e.program.streams {
                stream_offs.push(off);
                off = align(off + s.bytes.len() as u64, PROGRAM_ALIGN);
            }
            layout.push((desc, stream_offs));
        }
        let weights_off = off;
        let total = weights_off + model.weights.len() as u64;
        if total > 1 << 30 {
            return Err(Error::TooLarge { what: "program and weights", size: total });
        }
        let (program, program_va) = alloc_mapped(dev, total, Placement::Host)?;
        program.write_slice(weights_off, &model.weights)?;
        let queue = dev.create_queue(0)?;
        let mut programs = Vec::with_capacity(entries.len());
        for (i, (e, (desc, stream_offs))) in entries.iter().zip(&layout).enumerate() {
            let bases = RelocBases {
                arena: arena.as_ref().map_or(0, |a| a.1),
                staging: staging_va,
                descriptors: program_va + desc,
                streams: stream_offs.iter().map(|o| program_va + o).collect(),
                weights_source: program_va + weights_off,
            };
            let relocated = e.relocate(&bases)?;
            program.write_slice(*desc, &relocated.descriptors)?;
            for (s, o) in relocated.streams.iter().zip(stream_offs) {
                program.write_slice(*o, s)?;
            }
            let va_of = |i: usize| (bases.streams[i], relocated.streams[i].len() as u32);
            // Weights go up once, now, by the main program: the entries
            // share its weights region.
            if i == 0 {
                for (i, s) in e.program.streams.iter().enumerate() {
                    if s.role == StreamRole::UploadWeights && !s.bytes.is_empty() {
                        let (va, len) = va_of(i);
                        queue.submit_va(va, len)?.wait(STREAM_TIMEOUT)?;
                    }
                }
            }
            let mut per_inference = Vec::new();
            for role in [StreamRole::InputTransfer, StreamRole::Run, StreamRole::OutputTransfer] {
                for (i, s) in e.program.streams.iter().enumerate() {
                    if s.role == role && !s.bytes.is_empty() {
                        per_inference.push(va_of(i));
                    }
                }
            }
            let streams = (0..e.program.streams.len()).map(va_of).collect();
            let inference = Inference::new(dev, &per_inference)?;
            programs.push(Loaded { streams, inference, bases, state: Vec::new(), _state_program: None });
        }
        drop(entries);
        Ok(Self {
            model,
            dev: dev.clone(),
            queue,
            staging,
            programs,
            cur: 0,
            state: Vec::new(),
            _arena: arena.map(|a| a.0),
            _program: program,
            _state_buf: None,
            state_reset: None,
        })
    }

    /// The selected program.
    fn entry(&self) -> rbln_format::EntryRef<'_> {
        match self.model.entry_point_at(self.cur) {
            Some(e) => e,
            None => self.model.main(),
        }
    }

    fn loaded(&self) -> &Loaded {
        &self.programs[self.cur]
    }

    /// The names of the model's entry points (the main program first).
    pub fn entries(&self) -> Vec<String> {
        self.model.entry_points().iter().map(|e| e.name.to_string()).collect()
    }

    /// The selected entry point's name.
    pub fn selected(&self) -> &str {
        self.entry().name
    }

    /// Make `name` the program that runs (and that `info`, `profile` and
    /// the state calls refer to).
    pub fn select(&mut self, name: &str) -> Result<()> {
        let entries = self.model.entry_points();
        match entries.iter().position(|e| e.name == name) {
            Some(i) => {
                self.cur = i;
                Ok(())
            }
            None => Err(Error::NoEntry { name: name.into(), have: entries.iter().map(|e| e.name).collect::<Vec<_>>().join(", ") }),
        }
    }

    /// Select `name` and run one inference of it.
    pub fn run_entry(&mut self, name: &str, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.select(name)?;
        self.run(inputs)
    }

    /// The model's interface as runs see it: bound state inputs and
    /// outputs are left out (and listed in `state`).
    pub fn info(&self) -> ModelInfo {
        let mut i = inspect_entry(&self.model, self.entry());
        if !self.state.is_empty() {
            i.inputs = self.live_inputs().map(|(_, b)| io_info(b)).collect();
            i.outputs = self.live_outputs().map(|(_, b)| io_info(b)).collect();
            i.state = self.state_pairs();
        }
        i
    }

    /// The model inputs a run takes (all but the bound state), with their
    /// indices.
    fn live_inputs(&self) -> impl Iterator<Item = (usize, &rbln_format::IoBinding)> {
        let bound = &self.loaded().state;
        self.entry().meta.inputs.iter().enumerate().filter(|(i, _)| !bound.iter().any(|p| p.input == Some(*i)))
    }

    fn live_outputs(&self) -> impl Iterator<Item = (usize, &rbln_format::IoBinding)> {
        let bound = &self.loaded().state;
        self.entry().meta.outputs.iter().enumerate().filter(|(i, _)| !bound.iter().any(|p| p.output == Some(*i)))
    }

    /// Check `inputs` against the model: count, shapes, lengths.
    fn check_inputs(&self, inputs: &[TensorView<'_>]) -> Result<()> {
        let want: Vec<&rbln_format::IoBinding> = self.live_inputs().map(|(_, b)| b).collect();
        if inputs.len() != want.len() {
            let names = want.iter().map(|b| b.name.as_str()).collect::<Vec<_>>().join(", ");
            return Err(Error::InputCount { expected: want.len(), got: inputs.len(), names });
        }
        for (t, b) in inputs.iter().zip(want) {
            if b.dtype != t.dtype() {
                return Err(Error::InputDType { name: b.name.clone(), expected: b.dtype.name(), got: t.dtype().name() });
            }
            if t.shape != b.shape {
                return Err(Error::InputShape { name: b.name.clone(), expected: b.shape.clone(), got: t.shape.to_vec() });
            }
            let n = Tensor::elements(&b.shape);
            if t.data.len() as u64 != n {
                return Err(Error::InputLength { name: b.name.clone(), shape: b.shape.clone(), expected: n, got: t.data.len() });
            }
            // Values the device would refuse with a fault (which poisons
            // the context) are refused here, naming the input.
            if let Some(r) = b.range {
                let bad = (0..t.data.len()).find_map(|i| t.data.int(i).filter(|&v| !r.contains(v)).map(|v| (i, v)));
                if let Some((i, value)) = bad {
                    return Err(Error::InputValue {
                        name: b.name.clone(),
                        index: multi_index(&b.shape, i as u64),
                        value,
                        lo: r.lo,
                        hi: r.hi,
                    });
                }
            }
        }
        Ok(())
    }

    /// Run one inference.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        self.run_views(&views(inputs))
    }

    /// Device time of the last completed inference of the selected entry
    /// point (run, run_views or through an AsyncRuntime), from device
    /// timestamps around each inference's packets: what the profiler's
    /// span measures, without the per-node timestamps. None before the
    /// first inference, while one runs, or after one that failed.
    pub fn last_device_time(&self) -> Option<Duration> {
        self.programs[self.cur].inference.device_time()
    }

    /// Run one inference on borrowed inputs (copied once, into staging).
    pub fn run_views(&mut self, inputs: &[TensorView<'_>]) -> Result<Vec<Tensor>> {
        self.submit(inputs)?.wait(STREAM_TIMEOUT)?;
        self.read_outputs()
    }

    /// Check `inputs` and copy them into staging.
    fn stage(&mut self, inputs: &[TensorView<'_>]) -> Result<()> {
        self.check_inputs(inputs)?;
        let offsets: Vec<u64> = self.live_inputs().map(|(_, b)| b.placement.offset()).collect();
        for (t, at) in inputs.iter().zip(offsets) {
            self.staging.write_slice(at, &t.data.bytes())?;
        }
        Ok(())
    }

    /// Check and stage `inputs` and submit the inference (one ring
    /// entry); returns its fence.
    pub(crate) fn submit(&mut self, inputs: &[TensorView<'_>]) -> Result<rbln_umd::Fence> {
        self.stage(inputs)?;
        let (va, len) = self.programs[self.cur].inference.stream.ok_or(Error::EmptyProgram)?;
        Ok(self.queue.submit_va(va, len)?)
    }

    /// Run one inference with a device timestamp before and after every
    /// node (or every stream whose packets are not all assigned to nodes),
    /// each executed through an INDIRECT call of its pre-encoded packets.
    pub fn profile(&mut self, inputs: &[Tensor]) -> Result<(Vec<Tensor>, Profile)> {
        self.profile_views(&views(inputs))
    }

    /// [`Runtime::profile`] on borrowed inputs.
    pub fn profile_views(&mut self, inputs: &[TensorView<'_>]) -> Result<(Vec<Tensor>, Profile)> {
        self.profile_runs(inputs, 1)
    }

    /// [`Runtime::profile_views`], the profiled inference run `runs` times
    /// back to back in one submission (1 ..= [`MAX_PROFILE_RUNS`]); the
    /// profile holds the last run's events and every run's span. The
    /// last run shows the device in the steady state of a loop of
    /// inferences: its caches and worker threads warm, and (on the virtual
    /// NPU, whose compute shares the host's CPUs with the emulated guest)
    /// the guest asleep in its fence wait. The first shows an inference
    /// after the device sat idle.
    pub fn profile_runs(&mut self, inputs: &[TensorView<'_>], runs: u32) -> Result<(Vec<Tensor>, Profile)> {
        if !(1..=MAX_PROFILE_RUNS).contains(&runs) {
            return Err(Error::ProfileRuns(runs));
        }
        if !self.state.is_empty() {
            return Err(Error::State("profiling a runtime with bound state is not supported".into()));
        }
        self.stage(inputs)?;
        let e = self.entry();
        let p = e.program;
        let mut spans: Vec<(String, &'static str, u64, u32)> = Vec::new();
        for role in [StreamRole::InputTransfer, StreamRole::Run, StreamRole::OutputTransfer] {
            for (i, s) in p.streams.iter().enumerate().filter(|(_, s)| s.role == role && !s.bytes.is_empty()) {
                let (va, len) = self.programs[self.cur].streams[i];
                let mut nodes: Vec<_> = e
                    .graph
                    .nodes
                    .iter()
                    .filter_map(|n| n.commands.filter(|c| c.stream as usize == i).map(|c| (c, n)))
                    .collect();
                nodes.sort_by_key(|(c, _)| c.offset);
                let covered = nodes.iter().map(|(c, _)| c.len).sum::<u64>() == s.bytes.len() as u64
                    && nodes.windows(2).all(|w| w[0].0.offset + w[0].0.len <= w[1].0.offset);
                if covered {
                    for (c, n) in nodes {
                        spans.push((n.name.clone(), n.kind.name(), va + c.offset, c.len as u32));
                    }
                } else {
                    spans.push((s.name.clone(), role.name(), va, len));
                }
            }
        }
        // The same spans once per run (a run reads only the staged inputs
        // and writes the outputs and its own activations: runs repeat it
        // exactly).
        let per_run = spans.len();
        let spans: Vec<_> = (0..runs).flat_map(|_| spans.iter().cloned()).collect();
        let ts = self.dev.alloc((spans.len() as u64 * 16).max(16), Placement::Host)?;
        let ts_va = ts.map(Perms::RW)?;
        // Two timestamps and an INDIRECT per span (an unrolled LSTM has
        // hundreds), plus room for the submission's fence.
        use rbln_hw::cmd::{Indirect, Timestamp};
        let per_span = (2 * Timestamp::SIZE + Indirect::SIZE) as u64;
        let command_bytes = (spans.len() as u64 * per_span + 4096).max(rbln_umd::DEFAULT_COMMAND_BYTES);
        let mut cb = rbln_umd::CommandBuffer::with_capacity(&self.dev, command_bytes, rbln_umd::DEFAULT_DESCRIPTOR_BYTES)?;
        for (i, (_, _, va, len)) in spans.iter().enumerate() {
            cb.timestamp_va(ts_va + 16 * i as u64).indirect_va(*va, *len).timestamp_va(ts_va + 16 * i as u64 + 8);
        }
        // Each run is an inference's worth of work.
        self.queue.submit_ioctl(&mut cb)?.wait(STREAM_TIMEOUT.saturating_mul(runs))?;
        let stamps: Vec<u64> = ts.read_vec(0, spans.len() * 2)?;
        let mut events: Vec<ProfileEvent> = spans
            .into_iter()
            .enumerate()
            .map(|(i, (name, cat, _, _))| ProfileEvent { name, cat, start_ns: stamps[2 * i], dur_ns: stamps[2 * i + 1].saturating_sub(stamps[2 * i]) })
            .collect();
        let run_spans_ns = if per_run == 0 { Vec::new() } else { events.chunks(per_run).map(span_ns).collect() };
        let events = events.split_off(events.len() - per_run);
        Ok((self.read_outputs()?, Profile { events, run_spans_ns }))
    }

    /// The outputs of the last completed inference, from staging.
    pub(crate) fn read_outputs(&self) -> Result<Vec<Tensor>> {
        self.live_outputs().map(|(_, b)| self.read_binding(b)).collect()
    }

    /// The tensor in staging at `b`'s region.
    pub(crate) fn read_binding(&self, b: &rbln_format::IoBinding) -> Result<Tensor> {
        let n = Tensor::elements(&b.shape) as usize;
        let at = b.placement.offset();
        let data = match b.dtype {
            DType::I32 => Data::I32(self.staging.read_vec::<i32>(at, n)?),
            DType::I64 => Data::I64(self.staging.read_vec::<i64>(at, n)?),
            DType::I8 => Data::I8(self.staging.read_vec::<i8>(at, n)?),
            DType::U8 => Data::U8(self.staging.read_vec::<u8>(at, n)?),
            DType::Bool => Data::Bool(self.staging.read_vec::<u8>(at, n)?.into_iter().map(|x| x != 0).collect()),
            // Load refuses models with other dtypes at their edges.
            _ => Data::F32(self.staging.read_vec::<f32>(at, n)?),
        };
        Ok(Tensor { shape: b.shape.clone(), data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_and_uint8_data() {
        let i = Tensor::new(&[2, 2], vec![-128i8, -1, 0, 127]);
        let u = Tensor::new(&[4], vec![0u8, 1, 128, 255]);
        assert_eq!((i.dtype(), u.dtype()), (DType::I8, DType::U8));
        assert_eq!((i.data.len(), u.data.len()), (4, 4));
        assert_eq!(i.view().data, DataRef::I8(&[-128, -1, 0, 127]));
        assert_eq!(u.view().dtype(), DType::U8);
        // The bytes the device sees: one per element, two's complement for i8.
        assert_eq!(&*i.view().data.bytes(), &[0x80, 0xff, 0, 0x7f]);
        assert_eq!(&*u.view().data.bytes(), &[0, 1, 128, 255]);
        assert_eq!(i.view().to_tensor(), i);
        assert_eq!(u.view().to_tensor(), u);
        assert_eq!(i.data.to_f64(), vec![-128.0, -1.0, 0.0, 127.0]);
        assert_eq!(u.data.to_f64(), vec![0.0, 1.0, 128.0, 255.0]);
        // Range checks see them as integers.
        assert_eq!((i.view().data.int(0), u.view().data.int(3)), (Some(-128), Some(255)));
        assert_eq!(Tensor::new(&[1], vec![true]).view().data.int(0), None);
        assert_eq!(i.as_f32(), None);
    }
}
