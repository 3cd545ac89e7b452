//! The in-memory model: what a `.rbln` file holds, section by section.

/// Format version of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u16,
    pub minor: u16,
}

impl Version {
    /// The version this crate writes.
    pub const CURRENT: Version = Version { major: crate::FORMAT_MAJOR, minor: crate::FORMAT_MINOR };
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    F32 = 1,
    F16 = 2,
    BF16 = 3,
    I8 = 4,
    U8 = 5,
    I32 = 6,
    I64 = 7,
    Bool = 8,
}

impl DType {
    pub fn from_u8(v: u8) -> Option<Self> {
        use DType::*;
        Some(match v {
            1 => F32,
            2 => F16,
            3 => BF16,
            4 => I8,
            5 => U8,
            6 => I32,
            7 => I64,
            8 => Bool,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        use DType::*;
        match self {
            F32 | I32 => 4,
            F16 | BF16 => 2,
            I8 | U8 | Bool => 1,
            I64 => 8,
        }
    }

    pub fn name(self) -> &'static str {
        use DType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            BF16 => "bf16",
            I8 => "i8",
            U8 => "u8",
            I32 => "i32",
            I64 => "i64",
            Bool => "bool",
        }
    }
}

/// Bytes of a dense tensor of `dtype` and `shape`; `None` on overflow.
pub fn tensor_bytes(dtype: DType, shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
}

/// Where a tensor lives. Offsets are relative to the base of the region;
/// the runtime adds the region's device VA (see [`RelocKind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// In the device arena (activations and device copies of inputs and
    /// outputs). The memory plan may reuse arena bytes for tensors whose
    /// lifetimes do not overlap.
    Arena { offset: u64, size: u64 },
    /// In the device arena, inside the weights region: uploaded once from
    /// `.rbln.weights`, never written.
    Weight { offset: u64, size: u64 },
    /// In the host staging buffer (host side of inputs and outputs).
    Staging { offset: u64, size: u64 },
}

impl Placement {
    pub fn code(&self) -> u8 {
        match self {
            Placement::Arena { .. } => 0,
            Placement::Weight { .. } => 1,
            Placement::Staging { .. } => 2,
        }
    }
    pub fn from_code(code: u8, offset: u64, size: u64) -> Option<Self> {
        Some(match code {
            0 => Placement::Arena { offset, size },
            1 => Placement::Weight { offset, size },
            2 => Placement::Staging { offset, size },
            _ => return None,
        })
    }
    pub fn offset(&self) -> u64 {
        match *self {
            Placement::Arena { offset, .. } | Placement::Weight { offset, .. } | Placement::Staging { offset, .. } => {
                offset
            }
        }
    }
    pub fn size(&self) -> u64 {
        match *self {
            Placement::Arena { size, .. } | Placement::Weight { size, .. } | Placement::Staging { size, .. } => size,
        }
    }
    /// Human name of the region.
    pub fn region(&self) -> &'static str {
        match self {
            Placement::Arena { .. } => "arena",
            Placement::Weight { .. } => "weights region",
            Placement::Staging { .. } => "staging buffer",
        }
    }
}

/// A tensor of the graph. Its id is its index in [`Graph::tensors`].
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub placement: Placement,
}

/// What a node does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NodeKind {
    /// A compute op (`op` names it, e.g. "Gemm"): arena/weight inputs,
    /// arena outputs, runs commands (usually COMPUTE packets).
    Compute = 0,
    /// DMA of one staging tensor into one arena tensor.
    HostToDevice = 1,
    /// DMA of one arena tensor into one staging tensor.
    DeviceToHost = 2,
    /// No commands. One input: a free reinterpretation (reshape,
    /// flatten), the output occupies exactly the input's bytes. Several:
    /// the output is the inputs side by side (a concatenation whose
    /// inputs their producers wrote in place).
    View = 3,
}

impl NodeKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => NodeKind::Compute,
            1 => NodeKind::HostToDevice,
            2 => NodeKind::DeviceToHost,
            3 => NodeKind::View,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            NodeKind::Compute => "compute",
            NodeKind::HostToDevice => "host-to-device",
            NodeKind::DeviceToHost => "device-to-host",
            NodeKind::View => "view",
        }
    }
}

/// The packets that execute a node: bytes `offset..offset+len` of command
/// stream `stream` (whole packets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdRange {
    pub stream: u32,
    pub offset: u64,
    pub len: u64,
}

/// A byte range of `.rbln.desc` holding one or more whole descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescRange {
    pub offset: u64,
    pub len: u64,
}

/// A node of the graph. Nodes are stored in topological order; a node's id
/// is its index in [`Graph::nodes`].
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub kind: NodeKind,
    /// Op name for compute nodes ("Gemm", "Conv", ...); empty otherwise.
    pub op: String,
    pub inputs: Vec<u32>,
    pub outputs: Vec<u32>,
    pub commands: Option<CmdRange>,
    pub descriptors: Option<DescRange>,
}

impl Node {
    /// A compute node without commands or descriptors yet.
    pub fn compute(name: &str, op: &str, inputs: &[u32], outputs: &[u32]) -> Self {
        Self::new(name, NodeKind::Compute, op, inputs, outputs)
    }
    /// A host-to-device transfer of `src` (staging) into `dst` (arena).
    pub fn host_to_device(name: &str, src: u32, dst: u32) -> Self {
        Self::new(name, NodeKind::HostToDevice, "", &[src], &[dst])
    }
    /// A device-to-host transfer of `src` (arena) into `dst` (staging).
    pub fn device_to_host(name: &str, src: u32, dst: u32) -> Self {
        Self::new(name, NodeKind::DeviceToHost, "", &[src], &[dst])
    }
    /// A view (`dst` reinterprets the bytes of `src`).
    pub fn view(name: &str, src: u32, dst: u32) -> Self {
        Self::new(name, NodeKind::View, "", &[src], &[dst])
    }
    /// A concatenation view: `dst` is the bytes of `srcs` side by side.
    pub fn concat_view(name: &str, srcs: &[u32], dst: u32) -> Self {
        Self::new(name, NodeKind::View, "", srcs, &[dst])
    }
    fn new(name: &str, kind: NodeKind, op: &str, inputs: &[u32], outputs: &[u32]) -> Self {
        Node {
            name: name.into(),
            kind,
            op: op.into(),
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            commands: None,
            descriptors: None,
        }
    }
    pub fn with_commands(mut self, stream: u32, offset: u64, len: u64) -> Self {
        self.commands = Some(CmdRange { stream, offset, len });
        self
    }
    pub fn with_descriptors(mut self, offset: u64, len: u64) -> Self {
        self.descriptors = Some(DescRange { offset, len });
        self
    }
}

/// Tensors and nodes (`.rbln.graph`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    pub tensors: Vec<Tensor>,
    pub nodes: Vec<Node>,
}

/// A model input or output (`.rbln.meta`). It repeats the tensor's dtype,
/// shape and placement so that tools can show the interface from
/// `.rbln.meta` alone; the reader checks that both agree.
#[derive(Clone, Debug, PartialEq)]
pub struct IoBinding {
    pub name: String,
    pub tensor: u32,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub placement: Placement,
    /// The values an integer input may hold (format minor 1), e.g. the
    /// vocabulary of the embedding its token ids index: the runtime
    /// refuses other values before anything reaches the device.
    pub range: Option<ValueRange>,
}

/// Half-open range `lo..hi` of integer values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueRange {
    pub lo: i64,
    pub hi: i64,
}

impl ValueRange {
    pub fn contains(&self, v: i64) -> bool {
        self.lo <= v && v < self.hi
    }
}

/// How many compute nodes run an op (`.rbln.meta`, for inspection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpCount {
    pub op: String,
    pub count: u32,
}

/// A free-form key/value pair (`.rbln.meta`), e.g. the source model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Property {
    pub key: String,
    pub value: String,
}

/// Identity, requirements and memory plan (`.rbln.meta`). The command
/// stream table is also stored there; in memory it lives in
/// [`Program::streams`].
#[derive(Clone, Debug, PartialEq)]
pub struct Meta {
    /// The file's format version (the writer always writes
    /// [`Version::CURRENT`]).
    pub version: Version,
    pub name: String,
    pub producer: String,
    /// Required hardware version, `major << 16 | minor`
    /// (`rbln_hw::HW_VERSION`).
    pub hw_version: u32,
    /// Bytes of the device arena the runtime allocates (one DRAM buffer).
    pub arena_size: u64,
    /// Bytes of the host staging buffer the runtime allocates.
    pub staging_size: u64,
    /// Arena offset where `.rbln.weights` lands.
    pub weights_offset: u64,
    pub inputs: Vec<IoBinding>,
    pub outputs: Vec<IoBinding>,
    /// Compute ops used, sorted by op name (bytewise), with counts.
    pub ops: Vec<OpCount>,
    pub properties: Vec<Property>,
}

/// What the runtime does with a command stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum StreamRole {
    /// Only reached through INDIRECT packets of other streams.
    Aux = 0,
    /// Run once after loading (uploads the weights).
    UploadWeights = 1,
    /// Run per inference, before `Run` (staging → arena).
    InputTransfer = 2,
    /// Run per inference: the compute.
    Run = 3,
    /// Run per inference, after `Run` (arena → staging).
    OutputTransfer = 4,
}

impl StreamRole {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => StreamRole::Aux,
            1 => StreamRole::UploadWeights,
            2 => StreamRole::InputTransfer,
            3 => StreamRole::Run,
            4 => StreamRole::OutputTransfer,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            StreamRole::Aux => "aux",
            StreamRole::UploadWeights => "upload-weights",
            StreamRole::InputTransfer => "input-transfer",
            StreamRole::Run => "run",
            StreamRole::OutputTransfer => "output-transfer",
        }
    }
}

/// One pre-encoded command stream, stored in section `.rbln.cmd.<name>`.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandStream {
    pub name: String,
    pub role: StreamRole,
    pub bytes: Vec<u8>,
}

/// The section a relocation patches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RelocTarget {
    /// `.rbln.desc`.
    Descriptors,
    /// Command stream `n` (index into [`Program::streams`]).
    Stream(u32),
}

impl RelocTarget {
    /// On-disk encoding: 0 = descriptors, n + 1 = stream n.
    pub fn code(self) -> u32 {
        match self {
            RelocTarget::Descriptors => 0,
            RelocTarget::Stream(n) => n.saturating_add(1),
        }
    }
    pub fn from_code(v: u32) -> Self {
        match v {
            0 => RelocTarget::Descriptors,
            n => RelocTarget::Stream(n - 1),
        }
    }
}

/// Which base address a relocation adds to its addend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelocKind {
    /// Device VA of the arena.
    Arena,
    /// Device VA of the host staging buffer.
    Staging,
    /// Device VA where `.rbln.desc` was uploaded.
    Descriptors,
    /// Device VA where command stream `n` was uploaded (for INDIRECT).
    Stream(u32),
    /// Device VA of a buffer holding the bytes of `.rbln.weights` (the
    /// source of the weight upload).
    WeightsSource,
}

impl RelocKind {
    /// On-disk (kind, index) pair.
    pub fn code(self) -> (u32, u32) {
        match self {
            RelocKind::Arena => (1, 0),
            RelocKind::Staging => (2, 0),
            RelocKind::Descriptors => (3, 0),
            RelocKind::Stream(n) => (4, n),
            RelocKind::WeightsSource => (5, 0),
        }
    }
    pub fn from_code(kind: u32, index: u32) -> Option<Self> {
        Some(match kind {
            1 => RelocKind::Arena,
            2 => RelocKind::Staging,
            3 => RelocKind::Descriptors,
            4 => RelocKind::Stream(index),
            5 => RelocKind::WeightsSource,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            RelocKind::Arena => "arena",
            RelocKind::Staging => "staging",
            RelocKind::Descriptors => "descriptors",
            RelocKind::Stream(_) => "stream",
            RelocKind::WeightsSource => "weights-source",
        }
    }
}

/// Write the u64 `base(kind) + addend` at byte `offset` of `target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Relocation {
    pub target: RelocTarget,
    pub offset: u64,
    pub kind: RelocKind,
    pub addend: u64,
}

/// Descriptors, command streams and relocations.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    pub descriptors: Vec<u8>,
    pub streams: Vec<CommandStream>,
    /// Sorted by (target, offset); fields do not overlap.
    pub relocations: Vec<Relocation>,
}

/// Estimated cost of one node (`.rbln.profile`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeProfile {
    pub node: u32,
    pub flops: u64,
    /// Bytes read plus bytes written.
    pub bytes: u64,
}

/// A whole `.rbln` model: its main program and, from format minor 2, more
/// entry points over the same weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub meta: Meta,
    pub graph: Graph,
    pub program: Program,
    /// `.rbln.weights`: lands at arena offset `meta.weights_offset`.
    pub weights: Vec<u8>,
    /// `.rbln.profile`, if present (sorted by node).
    pub profile: Option<Vec<NodeProfile>>,
    /// The main program's name as an entry point (`.rbln.entries`);
    /// `None` in a file without that section, where it is [`MAIN_ENTRY`].
    pub main_entry: Option<String>,
    /// More programs (entry points) sharing `weights` and the arena's
    /// weights region, e.g. a decoder's prefill and decode steps.
    pub entries: Vec<Entry>,
}

/// The main program's entry name in a file that names none.
pub const MAIN_ENTRY: &str = "main";

/// An entry point besides the main program: a complete program (its own
/// metadata, graph, descriptors, streams, relocations and profile) whose
/// weight tensors point into the model's shared weights region. Its
/// `meta.name` is the entry's name.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub meta: Meta,
    pub graph: Graph,
    pub program: Program,
    pub profile: Option<Vec<NodeProfile>>,
}

/// One program of a model with the weights it reads: what validation,
/// relocation and a runtime work on.
#[derive(Clone, Copy, Debug)]
pub struct EntryRef<'a> {
    /// The entry's name (the main program's: [`Model::main_entry_name`]).
    pub name: &'a str,
    pub meta: &'a Meta,
    pub graph: &'a Graph,
    pub program: &'a Program,
    pub weights: &'a [u8],
    pub profile: Option<&'a [NodeProfile]>,
}

impl EntryRef<'_> {
    /// Index of the stream with `role` (the first one for `Aux`).
    pub fn stream_by_role(&self, role: StreamRole) -> Option<u32> {
        self.program.streams.iter().position(|s| s.role == role).map(|i| i as u32)
    }

    /// Apply every relocation for the given bases.
    pub fn relocate(&self, bases: &RelocBases) -> Result<Relocated, crate::FormatError> {
        crate::validate::relocate(self, bases)
    }

    /// Bytes of the weights region this program reads: the union of its
    /// weight tensors' byte ranges.
    pub fn weight_bytes_used(&self) -> u64 {
        let mut r: Vec<(u64, u64)> = self
            .graph
            .tensors
            .iter()
            .filter_map(|t| match t.placement {
                Placement::Weight { offset, size } if size > 0 => Some((offset, offset.saturating_add(size))),
                _ => None,
            })
            .collect();
        r.sort_unstable();
        let (mut total, mut end) = (0u64, 0u64);
        for (s, e) in r {
            let s = s.max(end);
            if e > s {
                total += e - s;
                end = e;
            }
        }
        total
    }
}

/// Device VAs the runtime chose, for [`Model::relocate`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelocBases {
    pub arena: u64,
    pub staging: u64,
    pub descriptors: u64,
    /// One per command stream, in [`Program::streams`] order.
    pub streams: Vec<u64>,
    pub weights_source: u64,
}

/// `.rbln.desc` and the command streams with every relocation applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relocated {
    pub descriptors: Vec<u8>,
    pub streams: Vec<Vec<u8>>,
}

impl Model {
    /// Parse and fully validate a `.rbln` file.
    pub fn from_bytes(bytes: &[u8]) -> Result<Model, crate::FormatError> {
        crate::decode::model_from_bytes(bytes)
    }

    /// Read and parse a `.rbln` file (at most [`crate::limits::MAX_FILE_SIZE`]).
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Model, crate::FormatError> {
        let path = path.as_ref();
        let io = |source| crate::FormatError::Io { path: path.to_path_buf(), source };
        let size = std::fs::metadata(path).map_err(io)?.len();
        if size > crate::limits::MAX_FILE_SIZE {
            return Err(crate::FormatError::FileTooLarge { size, limit: crate::limits::MAX_FILE_SIZE });
        }
        let bytes = std::fs::read(path).map_err(io)?;
        Self::from_bytes(&bytes)
    }

    /// Check everything the reader checks, without encoding.
    pub fn validate(&self) -> Result<(), crate::FormatError> {
        crate::validate::validate_model(self)
    }

    /// Validate, then encode as a `.rbln` file.
    pub fn to_bytes(&self) -> Result<Vec<u8>, crate::FormatError> {
        self.validate()?;
        self.to_bytes_unchecked()
    }

    /// Encode without validating (with correct checksums). Meant for tools
    /// and tests that need to produce invalid files on purpose; fails only
    /// if the ELF writer does.
    pub fn to_bytes_unchecked(&self) -> Result<Vec<u8>, crate::FormatError> {
        crate::encode::model_to_bytes(self)
    }

    /// Write the file (validated) to `path`.
    pub fn save(&self, path: impl AsRef<std::path::Path>) -> Result<(), crate::FormatError> {
        let path = path.as_ref();
        let bytes = self.to_bytes()?;
        std::fs::write(path, bytes).map_err(|source| crate::FormatError::Io { path: path.to_path_buf(), source })
    }

    /// Index of the main program's stream with `role` (the first one for
    /// `Aux`).
    pub fn stream_by_role(&self, role: StreamRole) -> Option<u32> {
        self.main().stream_by_role(role)
    }

    /// Apply every relocation of the main program for the given bases.
    pub fn relocate(&self, bases: &RelocBases) -> Result<Relocated, crate::FormatError> {
        self.main().relocate(bases)
    }

    /// The main program's entry name.
    pub fn main_entry_name(&self) -> &str {
        self.main_entry.as_deref().unwrap_or(MAIN_ENTRY)
    }

    /// The main program.
    pub fn main(&self) -> EntryRef<'_> {
        EntryRef {
            name: self.main_entry_name(),
            meta: &self.meta,
            graph: &self.graph,
            program: &self.program,
            weights: &self.weights,
            profile: self.profile.as_deref(),
        }
    }

    /// Every program: the main one first, then the entries in file order.
    pub fn entry_points(&self) -> Vec<EntryRef<'_>> {
        (0..=self.entries.len()).filter_map(|i| self.entry_point_at(i)).collect()
    }

    /// Program `i` of [`Model::entry_points`] (0: the main one).
    pub fn entry_point_at(&self, i: usize) -> Option<EntryRef<'_>> {
        if i == 0 {
            return Some(self.main());
        }
        let e = self.entries.get(i - 1)?;
        Some(EntryRef {
            name: &e.meta.name,
            meta: &e.meta,
            graph: &e.graph,
            program: &e.program,
            weights: &self.weights,
            profile: e.profile.as_deref(),
        })
    }

    /// The program called `name`.
    pub fn entry_point(&self, name: &str) -> Option<EntryRef<'_>> {
        self.entry_points().into_iter().find(|e| e.name == name)
    }

    /// Combine models compiled over one weights blob into one model:
    /// `main` (named `main_name`) plus each of `others` as an entry named
    /// by its `meta.name`. Every model must carry the same weights at the
    /// same arena offset (checked here; the rest by validation).
    pub fn with_entries(mut main: Model, main_name: &str, others: Vec<Model>) -> Result<Model, crate::FormatError> {
        for o in others {
            if o.weights != main.weights || o.meta.weights_offset != main.meta.weights_offset {
                return Err(crate::FormatError::Builder(format!(
                    "entry '{}' does not carry the main program's weights at its offset",
                    o.meta.name
                )));
            }
            main.entries.push(Entry { meta: o.meta, graph: o.graph, program: o.program, profile: o.profile });
        }
        main.main_entry = Some(main_name.to_string());
        Ok(main)
    }
}
