//! `ModelBuilder`: assemble a model piece by piece (tensors, weights,
//! descriptors, command streams with relocations, nodes, inputs and
//! outputs), then `build()` a validated `.rbln` file.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use rbln_hw::cmd::{self, Encoder};

use crate::error::{FormatError, Result};
use crate::model::*;

pub type TensorId = u32;
pub type NodeId = u32;
pub type StreamId = u32;

/// A device VA operand of a packet the builder emits: an absolute value,
/// or a base the runtime supplies plus an offset (emitted as a relocation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Va {
    Abs(u64),
    Rel(RelocKind, u64),
}

impl Va {
    pub fn arena(offset: u64) -> Self {
        Va::Rel(RelocKind::Arena, offset)
    }
    pub fn staging(offset: u64) -> Self {
        Va::Rel(RelocKind::Staging, offset)
    }
    fn value(self) -> u64 {
        match self {
            Va::Abs(v) | Va::Rel(_, v) => v,
        }
    }
}

/// Weight data is placed at this alignment inside `.rbln.weights`.
pub const WEIGHT_ALIGN: u64 = 64;
/// Descriptors are placed at this alignment inside `.rbln.desc`.
pub const DESC_ALIGN: u64 = 8;
/// Default arena / staging sizes are rounded up to this.
pub const SIZE_ROUND: u64 = rbln_hw::PAGE_SIZE;

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to).saturating_mul(to)
}

/// The bytes of `.rbln.weights` being assembled, each distinct byte string
/// stored once: a weight whose bytes are already there (in this model, or
/// in the pool of the programs compiled with it) points at them.
#[derive(Clone, Debug, Default)]
pub struct WeightPool {
    bytes: Vec<u8>,
    /// Content hash -> offsets of the stored byte strings with that hash.
    index: HashMap<u64, Vec<(u64, u64)>>,
}

impl WeightPool {
    /// Offset of `data` in the pool, appending it (at a [`WEIGHT_ALIGN`]
    /// boundary) unless identical bytes are already stored.
    pub fn add(&mut self, data: &[u8]) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        data.hash(&mut h);
        let key = h.finish();
        if !data.is_empty() {
            let stored = self.index.get(&key).into_iter().flatten();
            if let Some(&(at, _)) = stored.into_iter().find(|&&(at, len)| self.bytes.get(at as usize..(at + len) as usize) == Some(data)) {
                return at;
            }
        }
        let at = round_up(self.bytes.len() as u64, WEIGHT_ALIGN);
        self.bytes.resize(at as usize, 0);
        self.bytes.extend_from_slice(data);
        self.index.entry(key).or_default().push((at, data.len() as u64));
        at
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// Assembles a model. Every method records what it is given; mistakes
/// (unknown ids, overlapping tensors, ...) are reported by [`Self::build`]
/// with the same errors the reader gives.
#[derive(Clone, Debug)]
pub struct ModelBuilder {
    name: String,
    producer: String,
    hw_version: u32,
    properties: Vec<Property>,
    arena_size: Option<u64>,
    staging_size: Option<u64>,
    weights_offset: u64,
    tensors: Vec<Tensor>,
    nodes: Vec<Node>,
    streams: Vec<CommandStream>,
    descriptors: Vec<u8>,
    relocations: Vec<Relocation>,
    weights: WeightPool,
    inputs: Vec<(String, TensorId)>,
    ranges: Vec<(String, ValueRange)>,
    outputs: Vec<(String, TensorId)>,
    profile: Vec<NodeProfile>,
    error: Option<String>,
}

impl ModelBuilder {
    pub fn new(name: &str) -> Self {
        ModelBuilder {
            name: name.into(),
            producer: format!("rbln-format {}", env!("CARGO_PKG_VERSION")),
            hw_version: rbln_hw::HW_VERSION,
            properties: Vec::new(),
            arena_size: None,
            staging_size: None,
            weights_offset: 0,
            tensors: Vec::new(),
            nodes: Vec::new(),
            streams: Vec::new(),
            descriptors: Vec::new(),
            relocations: Vec::new(),
            weights: WeightPool::default(),
            inputs: Vec::new(),
            ranges: Vec::new(),
            outputs: Vec::new(),
            profile: Vec::new(),
            error: None,
        }
    }

    fn fail(&mut self, msg: String) {
        self.error.get_or_insert(msg);
    }

    pub fn producer(&mut self, producer: &str) -> &mut Self {
        self.producer = producer.into();
        self
    }

    /// Required hardware version (`major << 16 | minor`); default
    /// `rbln_hw::HW_VERSION`.
    pub fn hw_version(&mut self, v: u32) -> &mut Self {
        self.hw_version = v;
        self
    }

    pub fn property(&mut self, key: &str, value: &str) -> &mut Self {
        self.properties.push(Property { key: key.into(), value: value.into() });
        self
    }

    /// Arena size; default: the end of the last arena byte used, rounded
    /// up to a page.
    pub fn arena_size(&mut self, size: u64) -> &mut Self {
        self.arena_size = Some(size);
        self
    }

    /// Staging buffer size; default: the end of the last staging byte
    /// used, rounded up to a page.
    pub fn staging_size(&mut self, size: u64) -> &mut Self {
        self.staging_size = Some(size);
        self
    }

    /// Arena offset of the weights region (default 0). Must be set before
    /// the first weight is added: weight offsets are final once returned.
    pub fn weights_offset(&mut self, offset: u64) -> &mut Self {
        if !self.weights.is_empty() {
            self.fail("weights_offset set after weights were added".into());
        }
        self.weights_offset = offset;
        self
    }

    // ---- tensors ---------------------------------------------------------

    pub fn add_tensor(&mut self, name: &str, dtype: DType, shape: &[u64], placement: Placement) -> TensorId {
        self.tensors.push(Tensor { name: name.into(), dtype, shape: shape.to_vec(), placement });
        (self.tensors.len() - 1) as TensorId
    }

    fn bytes(dtype: DType, shape: &[u64]) -> u64 {
        tensor_bytes(dtype, shape).unwrap_or(u64::MAX)
    }

    /// A tensor at `offset` in the arena.
    pub fn arena_tensor(&mut self, name: &str, dtype: DType, shape: &[u64], offset: u64) -> TensorId {
        let size = Self::bytes(dtype, shape);
        self.add_tensor(name, dtype, shape, Placement::Arena { offset, size })
    }

    /// A tensor at `offset` in the host staging buffer.
    pub fn staging_tensor(&mut self, name: &str, dtype: DType, shape: &[u64], offset: u64) -> TensorId {
        let size = Self::bytes(dtype, shape);
        self.add_tensor(name, dtype, shape, Placement::Staging { offset, size })
    }

    /// Start from `pool` instead of empty weights: programs compiled
    /// together as entry points of one file each start from the pool of
    /// all of them, so their weight tensors land at the same offsets and
    /// their `.rbln.weights` are identical.
    pub fn weight_pool(&mut self, pool: WeightPool) -> &mut Self {
        if !self.weights.is_empty() {
            self.fail("weight_pool set after weights were added".into());
        }
        self.weights = pool;
        self
    }

    /// The weights added so far.
    pub fn weights(&self) -> &WeightPool {
        &self.weights
    }

    /// Add a weight tensor holding `data`, appended to the weights (at a
    /// [`WEIGHT_ALIGN`] boundary) unless identical bytes are already there
    /// ([`WeightPool`]). Its arena offset is final: [`Self::placement`]
    /// tells it.
    pub fn add_weight(&mut self, name: &str, dtype: DType, shape: &[u64], data: &[u8]) -> TensorId {
        let at = self.weights.add(data);
        let offset = self.weights_offset.saturating_add(at);
        self.add_tensor(name, dtype, shape, Placement::Weight { offset, size: data.len() as u64 })
    }

    pub fn add_weight_f32(&mut self, name: &str, shape: &[u64], values: &[f32]) -> TensorId {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_weight(name, DType::F32, shape, &data)
    }

    /// Bytes of weights so far (the size of `.rbln.weights`).
    pub fn weights_len(&self) -> u64 {
        self.weights.len()
    }

    pub fn tensor(&self, id: TensorId) -> Option<&Tensor> {
        self.tensors.get(id as usize)
    }

    pub fn placement(&self, id: TensorId) -> Option<Placement> {
        self.tensor(id).map(|t| t.placement)
    }

    /// Arena (or staging) offset of a tensor as a VA operand.
    pub fn va_of(&self, id: TensorId) -> Va {
        match self.placement(id) {
            Some(Placement::Arena { offset, .. } | Placement::Weight { offset, .. }) => Va::arena(offset),
            Some(Placement::Staging { offset, .. }) => Va::staging(offset),
            None => Va::Abs(0),
        }
    }

    // ---- descriptors -----------------------------------------------------

    /// Append a descriptor (at a [`DESC_ALIGN`] boundary) with relocations
    /// `(byte offset within the descriptor, kind, addend)`; the addends are
    /// written into the fields. Returns its offset in `.rbln.desc`.
    pub fn add_descriptor(&mut self, bytes: &[u8], relocs: &[(u64, RelocKind, u64)]) -> u64 {
        let at = round_up(self.descriptors.len() as u64, DESC_ALIGN);
        self.descriptors.resize(at as usize, 0);
        self.descriptors.extend_from_slice(bytes);
        for &(off, kind, addend) in relocs {
            self.reloc(RelocTarget::Descriptors, at.saturating_add(off), kind, addend);
        }
        at
    }

    pub fn descriptors_len(&self) -> u64 {
        self.descriptors.len() as u64
    }

    // ---- command streams ---------------------------------------------------

    pub fn add_stream(&mut self, name: &str, role: StreamRole) -> StreamId {
        self.streams.push(CommandStream { name: name.into(), role, bytes: Vec::new() });
        (self.streams.len() - 1) as StreamId
    }

    /// Current length of a stream (the offset of the next packet).
    pub fn stream_len(&self, stream: StreamId) -> u64 {
        self.streams.get(stream as usize).map_or(0, |s| s.bytes.len() as u64)
    }

    /// Append raw packets to a stream; returns their offset.
    pub fn append_commands(&mut self, stream: StreamId, bytes: &[u8]) -> u64 {
        match self.streams.get_mut(stream as usize) {
            Some(s) => {
                let at = s.bytes.len() as u64;
                s.bytes.extend_from_slice(bytes);
                at
            }
            None => {
                self.fail(format!("append_commands: stream {stream} does not exist"));
                0
            }
        }
    }

    /// Record a relocation and write its addend into the field (if the
    /// field exists; otherwise [`Self::build`] reports it).
    pub fn reloc(&mut self, target: RelocTarget, offset: u64, kind: RelocKind, addend: u64) -> &mut Self {
        let bytes = match target {
            RelocTarget::Descriptors => Some(&mut self.descriptors),
            RelocTarget::Stream(n) => self.streams.get_mut(n as usize).map(|s| &mut s.bytes),
        };
        if let Some(f) = bytes.and_then(|b| b.get_mut(offset as usize..(offset as usize).checked_add(8)?)) {
            f.copy_from_slice(&addend.to_le_bytes());
        }
        self.relocations.push(Relocation { target, offset, kind, addend });
        self
    }

    /// Append one packet encoded by `f`, with relocations for the VA
    /// operands at the given byte offsets within the packet.
    fn emit(&mut self, stream: StreamId, vas: &[(u64, Va)], f: impl FnOnce(&mut Encoder<Vec<u8>>)) -> u64 {
        let mut e = Encoder::new(Vec::new());
        f(&mut e);
        let at = self.append_commands(stream, &e.buf);
        for &(off, va) in vas {
            if let Va::Rel(kind, addend) = va {
                self.reloc(RelocTarget::Stream(stream), at + off, kind, addend);
            }
        }
        at
    }

    /// DMA_COPY; returns the packet's offset in the stream.
    pub fn dma_copy(&mut self, stream: StreamId, src: Va, dst: Va, size: u64) -> u64 {
        self.emit(stream, &[(8, src), (16, dst)], |e| {
            e.dma_copy(src.value(), dst.value(), size);
        })
    }

    /// FILL.
    pub fn fill(&mut self, stream: StreamId, dst: Va, size: u64, value: u32) -> u64 {
        self.emit(stream, &[(8, dst)], |e| {
            e.fill(dst.value(), size, value);
        })
    }

    /// COMPUTE of the descriptor at `desc_offset` in `.rbln.desc`.
    pub fn compute(&mut self, stream: StreamId, desc_offset: u64, desc_size: u32) -> u64 {
        let va = Va::Rel(RelocKind::Descriptors, desc_offset);
        self.emit(stream, &[(8, va)], |e| {
            e.compute(desc_offset, desc_size);
        })
    }

    /// TIMESTAMP.
    pub fn timestamp(&mut self, stream: StreamId, addr: Va) -> u64 {
        self.emit(stream, &[(8, addr)], |e| {
            e.timestamp(addr.value());
        })
    }

    /// FENCE.
    pub fn fence(&mut self, stream: StreamId, value: u64, addr: Va, irq: bool) -> u64 {
        self.emit(stream, &[(16, addr)], |e| {
            e.fence(value, addr.value(), irq);
        })
    }

    /// INDIRECT to all of stream `callee` (its current length).
    pub fn indirect(&mut self, stream: StreamId, callee: StreamId) -> u64 {
        let size = self.stream_len(callee) as u32;
        let va = Va::Rel(RelocKind::Stream(callee), 0);
        self.emit(stream, &[(8, va)], |e| {
            e.indirect(0, size);
        })
    }

    /// NOP (one dword).
    pub fn nop(&mut self, stream: StreamId) -> u64 {
        self.emit(stream, &[], |e| {
            e.nop();
        })
    }

    // ---- graph -------------------------------------------------------------

    pub fn add_node(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        (self.nodes.len() - 1) as NodeId
    }

    pub fn input(&mut self, name: &str, tensor: TensorId) -> &mut Self {
        self.inputs.push((name.into(), tensor));
        self
    }

    /// Declares the values integer input `name` may hold (see
    /// [`IoBinding::range`]).
    pub fn input_range(&mut self, name: &str, range: ValueRange) -> &mut Self {
        self.ranges.push((name.into(), range));
        self
    }

    pub fn output(&mut self, name: &str, tensor: TensorId) -> &mut Self {
        self.outputs.push((name.into(), tensor));
        self
    }

    /// Cost estimate of a node (`.rbln.profile`).
    pub fn node_profile(&mut self, node: NodeId, flops: u64, bytes: u64) -> &mut Self {
        self.profile.push(NodeProfile { node, flops, bytes });
        self
    }

    // ---- output ------------------------------------------------------------

    /// The model as given, without validation (for producing invalid files
    /// on purpose). Derived fields (sizes, io descriptions, op summary) are
    /// filled in; relocations and profile entries are sorted.
    pub fn build_model_unchecked(&self) -> Model {
        let w_end = self.weights_offset.saturating_add(self.weights.len());
        let mut arena_end = if self.weights.is_empty() { 0 } else { w_end };
        let mut staging_end = 0;
        for t in &self.tensors {
            let end = t.placement.offset().saturating_add(t.placement.size());
            match t.placement {
                Placement::Arena { .. } | Placement::Weight { .. } => arena_end = arena_end.max(end),
                Placement::Staging { .. } => staging_end = staging_end.max(end),
            }
        }
        let bind = |list: &[(String, TensorId)], ranged: bool| -> Vec<IoBinding> {
            list.iter()
                .map(|(name, t)| match self.tensors.get(*t as usize) {
                    Some(x) => IoBinding {
                        name: name.clone(),
                        tensor: *t,
                        dtype: x.dtype,
                        shape: x.shape.clone(),
                        placement: x.placement,
                        range: if ranged { self.ranges.iter().find(|(n, _)| n == name).map(|&(_, r)| r) } else { None },
                    },
                    None => IoBinding {
                        name: name.clone(),
                        tensor: *t,
                        dtype: DType::F32,
                        shape: Vec::new(),
                        placement: Placement::Arena { offset: 0, size: 0 },
                        range: None,
                    },
                })
                .collect()
        };
        let mut ops: std::collections::BTreeMap<&str, u32> = Default::default();
        for n in &self.nodes {
            if n.kind == NodeKind::Compute {
                *ops.entry(n.op.as_str()).or_default() += 1;
            }
        }
        let mut relocations = self.relocations.clone();
        relocations.sort_by_key(|r| (r.target, r.offset));
        let mut profile = self.profile.clone();
        profile.sort_by_key(|p| p.node);
        Model {
            meta: Meta {
                version: Version::CURRENT,
                name: self.name.clone(),
                producer: self.producer.clone(),
                hw_version: self.hw_version,
                arena_size: self.arena_size.unwrap_or(round_up(arena_end, SIZE_ROUND)),
                staging_size: self.staging_size.unwrap_or(round_up(staging_end, SIZE_ROUND)),
                weights_offset: self.weights_offset,
                inputs: bind(&self.inputs, true),
                outputs: bind(&self.outputs, false),
                ops: ops.into_iter().map(|(op, count)| OpCount { op: op.into(), count }).collect(),
                properties: self.properties.clone(),
            },
            graph: Graph { tensors: self.tensors.clone(), nodes: self.nodes.clone() },
            program: Program { descriptors: self.descriptors.clone(), streams: self.streams.clone(), relocations },
            weights: self.weights.bytes.clone(),
            profile: if self.profile.is_empty() { None } else { Some(profile) },
            main_entry: None,
            entries: Vec::new(),
        }
    }

    /// The validated model.
    pub fn build_model(&self) -> Result<Model> {
        if let Some(e) = &self.error {
            return Err(FormatError::Builder(e.clone()));
        }
        for (what, list) in [("input", &self.inputs), ("output", &self.outputs)] {
            for (name, t) in list.iter() {
                if *t as usize >= self.tensors.len() {
                    return Err(FormatError::Builder(format!(
                        "{what} '{name}' names tensor {t}, but there are {} tensors",
                        self.tensors.len()
                    )));
                }
            }
        }
        let m = self.build_model_unchecked();
        m.validate()?;
        Ok(m)
    }

    /// The validated `.rbln` file.
    pub fn build(&self) -> Result<Vec<u8>> {
        self.build_model()?.to_bytes_unchecked()
    }
}

// Packet field offsets used by the emitters above, pinned to the contract.
const _: () = {
    assert!(std::mem::offset_of!(cmd::DmaCopy, src_va) == 8);
    assert!(std::mem::offset_of!(cmd::DmaCopy, dst_va) == 16);
    assert!(std::mem::offset_of!(cmd::Fill, dst_va) == 8);
    assert!(std::mem::offset_of!(cmd::Compute, desc_va) == 8);
    assert!(std::mem::offset_of!(cmd::Timestamp, addr_va) == 8);
    assert!(std::mem::offset_of!(cmd::Fence, addr_va) == 16);
    assert!(std::mem::offset_of!(cmd::Indirect, va) == 8);
};
