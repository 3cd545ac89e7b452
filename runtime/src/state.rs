//! Device-resident state: a model output fed back, on the device, as a
//! model input of the next run (a decoder's KV cache, a recurrent state).
//!
//! [`Runtime::bind_state`] pairs an input with an output of the same dtype
//! and shape. From then on the pair never crosses to the host: each pair
//! has a buffer in device DRAM; the input transfer copies it (instead of
//! the staged input) into the input's arena tensor, and the output
//! transfer copies the output's arena tensor into it (instead of into
//! staging). The two copies go through the buffer because the memory plan
//! may put the output where the input was once the input is read. The
//! caller passes (and gets back) only the other inputs and outputs. The
//! state starts as zeros; [`Runtime::reset_state`],
//! [`Runtime::set_state`] and [`Runtime::state`] clear, write and read it.
//!
//! The rewritten per-inference streams are made from the model's own
//! relocated packets (each transfer node's byte range), so nothing about
//! the model changes but which transfers run.

use rbln_format::{NodeKind, Placement as Region, StreamRole};
use rbln_umd::Placement;

use crate::{align, alloc_mapped, Error, Result, Runtime, Tensor, TensorView, PROGRAM_ALIGN, STREAM_TIMEOUT};

/// One bound pair.
#[derive(Clone, Debug)]
pub(crate) struct StatePair {
    /// Indices into the model's inputs and outputs.
    pub input: usize,
    pub output: usize,
    /// Device VAs of their arena tensors and of the pair's state buffer,
    /// and their size in bytes.
    pub in_va: u64,
    pub out_va: u64,
    pub state_va: u64,
    pub bytes: u64,
}

fn state_err(msg: String) -> Error {
    Error::State(msg)
}

impl Runtime {
    /// Keep each `(input, output)` pair on the device (see the module
    /// docs). Once per runtime; the state starts as zeros.
    pub fn bind_state(&mut self, pairs: &[(String, String)]) -> Result<()> {
        if !self.state.is_empty() {
            return Err(state_err("the runtime's state is already bound".into()));
        }
        let meta = &self.model.meta;
        let graph = &self.model.graph;
        let arena_va = |t: u32| -> Option<u64> {
            match graph.tensors.get(t as usize)?.placement {
                Region::Arena { offset, .. } => Some(self.bases.arena + offset),
                _ => None,
            }
        };
        let mut bound = Vec::new();
        for (i_name, o_name) in pairs {
            let input = meta.inputs.iter().position(|b| &b.name == i_name).ok_or_else(|| state_err(format!("'{i_name}' is not an input of the model")))?;
            let output = meta.outputs.iter().position(|b| &b.name == o_name).ok_or_else(|| state_err(format!("'{o_name}' is not an output of the model")))?;
            if bound.iter().any(|p: &StatePair| p.input == input || p.output == output) {
                return Err(state_err(format!("'{i_name}' or '{o_name}' is in two state pairs")));
            }
            let (bi, bo) = (&meta.inputs[input], &meta.outputs[output]);
            if bi.dtype != bo.dtype || bi.shape != bo.shape {
                return Err(state_err(format!(
                    "input '{i_name}' ({} {:?}) and output '{o_name}' ({} {:?}) differ",
                    bi.dtype.name(),
                    bi.shape,
                    bo.dtype.name(),
                    bo.shape
                )));
            }
            // The transfer nodes: staging -> arena for the input, arena ->
            // staging for the output.
            let up = graph.nodes.iter().find(|n| n.kind == NodeKind::HostToDevice && n.inputs.first() == Some(&bi.tensor));
            let down = graph.nodes.iter().find(|n| n.kind == NodeKind::DeviceToHost && n.outputs.first() == Some(&bo.tensor));
            let (Some(up), Some(down)) = (up, down) else {
                return Err(state_err(format!("the model has no transfer nodes for '{i_name}' / '{o_name}'")));
            };
            let in_va = up.outputs.first().and_then(|&t| arena_va(t));
            let out_va = down.inputs.first().and_then(|&t| arena_va(t));
            let (Some(in_va), Some(out_va)) = (in_va, out_va) else {
                return Err(state_err(format!("'{i_name}' / '{o_name}' have no arena tensors")));
            };
            let bytes = bi.placement.size();
            bound.push(StatePair { input, output, in_va, out_va, state_va: 0, bytes });
        }
        // The state buffers, in device DRAM.
        let total: u64 = bound.iter().map(|p| align(p.bytes, PROGRAM_ALIGN)).sum();
        let (state_buf, state_base) = alloc_mapped(&self.dev, total.max(PROGRAM_ALIGN), Placement::Dram)?;
        let mut at = state_base;
        for p in &mut bound {
            p.state_va = at;
            at += align(p.bytes, PROGRAM_ALIGN);
        }
        // The model's packets, relocated as they were uploaded.
        let relocated = self.model.relocate(&self.bases)?;
        let skip = |role: StreamRole, stream: usize| -> Vec<(u64, u64)> {
            let mut r: Vec<(u64, u64)> = graph
                .nodes
                .iter()
                .filter(|n| match n.kind {
                    NodeKind::HostToDevice => role == StreamRole::InputTransfer && bound.iter().any(|p| n.inputs.first() == Some(&meta.inputs[p.input].tensor)),
                    NodeKind::DeviceToHost => role == StreamRole::OutputTransfer && bound.iter().any(|p| n.outputs.first() == Some(&meta.outputs[p.output].tensor)),
                    _ => false,
                })
                .filter_map(|n| n.commands.filter(|c| c.stream as usize == stream).map(|c| (c.offset, c.offset + c.len)))
                .collect();
            r.sort_unstable();
            r
        };
        let keep = |bytes: &[u8], cut: &[(u64, u64)]| -> Vec<u8> {
            let mut out = Vec::with_capacity(bytes.len());
            let mut at = 0usize;
            for &(s, e) in cut {
                out.extend_from_slice(&bytes[at..(s as usize).max(at).min(bytes.len())]);
                at = (e as usize).min(bytes.len()).max(at);
            }
            out.extend_from_slice(&bytes[at..]);
            out
        };
        // The per-inference streams, rewritten: the state copied in
        // before the other inputs, the run as it is, the state copied out
        // before the other outputs.
        let mut load = rbln_hw::cmd::Encoder::new(Vec::new());
        let mut save = rbln_hw::cmd::Encoder::new(Vec::new());
        for p in &bound {
            load.dma_copy(p.state_va, p.in_va, p.bytes);
            save.dma_copy(p.out_va, p.state_va, p.bytes);
        }
        let mut streams: Vec<Vec<u8>> = Vec::new();
        let mut roles = Vec::new();
        for role in [StreamRole::InputTransfer, StreamRole::Run, StreamRole::OutputTransfer] {
            for (i, _) in self.model.program.streams.iter().enumerate().filter(|(_, s)| s.role == role) {
                let mut bytes = keep(&relocated.streams[i], &skip(role, i));
                let first = !roles.contains(&role);
                let prefix = match role {
                    StreamRole::InputTransfer if first => load.buf.as_slice(),
                    StreamRole::OutputTransfer if first => save.buf.as_slice(),
                    _ => &[],
                };
                bytes.splice(0..0, prefix.iter().copied());
                streams.push(bytes);
                roles.push(role);
            }
        }
        // A model without an input (output) transfer stream gets one.
        if !roles.contains(&StreamRole::InputTransfer) {
            streams.insert(0, load.buf.clone());
        }
        if !roles.contains(&StreamRole::OutputTransfer) {
            streams.push(save.buf.clone());
        }
        let total: u64 = streams.iter().map(|s| align(s.len() as u64, PROGRAM_ALIGN)).sum();
        let (buf, va) = alloc_mapped(&self.dev, total.max(PROGRAM_ALIGN), Placement::Host)?;
        let mut per_inference = Vec::new();
        let mut off = 0u64;
        for s in &streams {
            if s.is_empty() {
                continue;
            }
            buf.write_slice(off, s)?;
            per_inference.push((va + off, s.len() as u32));
            off = align(off + s.len() as u64, PROGRAM_ALIGN);
        }
        self.per_inference = per_inference;
        self._state_program = Some((buf, state_buf));
        self.state = bound;
        self.reset_state()
    }

    /// The bound `(input, output)` names.
    pub fn state_pairs(&self) -> Vec<(String, String)> {
        let m = &self.model.meta;
        self.state.iter().map(|p| (m.inputs[p.input].name.clone(), m.outputs[p.output].name.clone())).collect()
    }

    /// Zero every bound state tensor.
    pub fn reset_state(&mut self) -> Result<()> {
        if self.state.is_empty() {
            return Ok(());
        }
        let mut cb = rbln_umd::CommandBuffer::new(&self.dev)?;
        for p in &self.state {
            cb.fill_va(p.state_va, align(p.bytes, 4), 0);
        }
        self.queue.submit_ioctl(&mut cb)?.wait(STREAM_TIMEOUT)?;
        Ok(())
    }

    fn pair_of(&self, name: &str) -> Result<StatePair> {
        let m = &self.model.meta;
        self.state
            .iter()
            .find(|p| m.inputs[p.input].name == name)
            .cloned()
            .ok_or_else(|| state_err(format!("'{name}' is not a bound state input (bound: {:?})", self.state_pairs())))
    }

    /// Write the state input `name` (through its staging region).
    pub fn set_state(&mut self, name: &str, t: TensorView<'_>) -> Result<()> {
        let p = self.pair_of(name)?;
        let b = &self.model.meta.inputs[p.input];
        if b.dtype != t.dtype() || t.shape != b.shape || t.data.len() as u64 != Tensor::elements(&b.shape) {
            return Err(state_err(format!("state '{name}' is {} {:?}, got {} {:?}", b.dtype.name(), b.shape, t.dtype().name(), t.shape)));
        }
        self.staging.write_slice(b.placement.offset(), &t.data.bytes())?;
        let mut cb = rbln_umd::CommandBuffer::new(&self.dev)?;
        cb.dma_copy_va(self.bases.staging + b.placement.offset(), p.state_va, p.bytes);
        self.queue.submit_ioctl(&mut cb)?.wait(STREAM_TIMEOUT)?;
        Ok(())
    }

    /// Read the state input `name` (the value the next run will read).
    pub fn state(&mut self, name: &str) -> Result<Tensor> {
        let p = self.pair_of(name)?;
        let b = self.model.meta.inputs[p.input].clone();
        let mut cb = rbln_umd::CommandBuffer::new(&self.dev)?;
        cb.dma_copy_va(p.state_va, self.bases.staging + b.placement.offset(), p.bytes);
        self.queue.submit_ioctl(&mut cb)?.wait(STREAM_TIMEOUT)?;
        self.read_binding(&b)
    }
}
