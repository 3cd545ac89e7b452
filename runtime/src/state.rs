//! Device-resident state: a model output fed back, on the device, as a
//! model input of the next run (a decoder's KV cache, a recurrent state).
//!
//! [`Runtime::bind_state`] pairs an input with an output of the same dtype
//! and shape, across every program of the model (entry points share the
//! state: a prefill's cache output is its decode step's cache input). From then on the pair never crosses to the host: each pair
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

use rbln_format::{IoBinding, NodeKind, Placement as Region, StreamRole};
use rbln_umd::Placement;

use crate::{align, alloc_mapped, Error, Result, Runtime, Tensor, TensorView, PROGRAM_ALIGN, STREAM_TIMEOUT};

/// One bound pair and its buffer in device DRAM, shared by every program
/// of the model (a decoder's prefill writes the cache its decode step
/// reads).
#[derive(Clone, Debug)]
pub(crate) struct StateSlot {
    pub input: String,
    pub output: String,
    pub state_va: u64,
    pub bytes: u64,
}

/// One program's part in a slot: the input it reads the state into
/// and/or the output it writes the state from (indices into its inputs
/// and outputs), with their arena tensors' device VAs.
#[derive(Clone, Debug)]
pub(crate) struct StatePair {
    pub slot: usize,
    pub input: Option<usize>,
    pub output: Option<usize>,
    in_va: u64,
    out_va: u64,
}

fn state_err(msg: String) -> Error {
    Error::State(msg)
}

fn shape_of(b: &IoBinding) -> String {
    format!("{} {:?}", b.dtype.name(), b.shape)
}

impl Runtime {
    /// Keep each `(input, output)` pair on the device (see the module
    /// docs), in every program of the model that has the input, the
    /// output or both. Once per runtime; the state starts as zeros.
    pub fn bind_state(&mut self, pairs: &[(String, String)]) -> Result<()> {
        if !self.state.is_empty() {
            return Err(state_err("the runtime's state is already bound".into()));
        }
        let entries = self.model.entry_points();
        let mut slots: Vec<StateSlot> = Vec::new();
        let mut parts: Vec<Vec<StatePair>> = vec![Vec::new(); entries.len()];
        for (i_name, o_name) in pairs {
            if slots.iter().any(|s| &s.input == i_name || &s.output == o_name) {
                return Err(state_err(format!("'{i_name}' or '{o_name}' is in two state pairs")));
            }
            if !entries.iter().any(|e| e.meta.inputs.iter().any(|b| &b.name == i_name)) {
                return Err(state_err(format!("'{i_name}' is not an input of the model")));
            }
            if !entries.iter().any(|e| e.meta.outputs.iter().any(|b| &b.name == o_name)) {
                return Err(state_err(format!("'{o_name}' is not an output of the model")));
            }
            let slot = slots.len();
            let mut first: Option<&IoBinding> = None;
            for (k, e) in entries.iter().enumerate() {
                let input = e.meta.inputs.iter().position(|b| &b.name == i_name);
                let output = e.meta.outputs.iter().position(|b| &b.name == o_name);
                if input.is_none() && output.is_none() {
                    continue;
                }
                for b in input.map(|i| &e.meta.inputs[i]).into_iter().chain(output.map(|o| &e.meta.outputs[o])) {
                    let f = *first.get_or_insert(b);
                    if f.dtype != b.dtype || f.shape != b.shape {
                        return Err(state_err(format!(
                            "'{i_name}' / '{o_name}' are {} in one place and {} in another ('{}' of entry '{}')",
                            shape_of(f),
                            shape_of(b),
                            b.name,
                            e.name
                        )));
                    }
                }
                let arena_va = |t: u32| -> Option<u64> {
                    match e.graph.tensors.get(t as usize)?.placement {
                        Region::Arena { offset, .. } => Some(self.programs[k].bases.arena + offset),
                        _ => None,
                    }
                };
                // The transfer nodes: staging -> arena for the input, arena
                // -> staging for the output.
                let mut in_va = 0;
                if let Some(i) = input {
                    let t = e.meta.inputs[i].tensor;
                    let up = e.graph.nodes.iter().find(|n| n.kind == NodeKind::HostToDevice && n.inputs.first() == Some(&t));
                    in_va = up.and_then(|n| n.outputs.first()).and_then(|&t| arena_va(t)).ok_or_else(|| {
                        state_err(format!("entry '{}' has no transfer of '{i_name}' into the arena", e.name))
                    })?;
                }
                let mut out_va = 0;
                if let Some(o) = output {
                    let t = e.meta.outputs[o].tensor;
                    let down = e.graph.nodes.iter().find(|n| n.kind == NodeKind::DeviceToHost && n.outputs.first() == Some(&t));
                    out_va = down.and_then(|n| n.inputs.first()).and_then(|&t| arena_va(t)).ok_or_else(|| {
                        state_err(format!("entry '{}' has no transfer of '{o_name}' out of the arena", e.name))
                    })?;
                }
                parts[k].push(StatePair { slot, input, output, in_va, out_va });
            }
            let bytes = first.map_or(0, |b| b.placement.size());
            slots.push(StateSlot { input: i_name.clone(), output: o_name.clone(), state_va: 0, bytes });
        }
        // The state buffers, in device DRAM.
        let total: u64 = slots.iter().map(|p| align(p.bytes, PROGRAM_ALIGN)).sum();
        let (state_buf, state_base) = alloc_mapped(&self.dev, total.max(PROGRAM_ALIGN), Placement::Dram)?;
        let mut at = state_base;
        for s in &mut slots {
            s.state_va = at;
            at += align(s.bytes, PROGRAM_ALIGN);
        }
        // Each program's per-inference streams, rewritten around its part.
        let mut rewritten = Vec::with_capacity(entries.len());
        for (k, e) in entries.iter().enumerate() {
            if parts[k].is_empty() {
                rewritten.push(None);
                continue;
            }
            rewritten.push(Some(self.rewrite_streams(e, k, &parts[k], &slots)?));
        }
        drop(entries);
        for (k, (r, part)) in rewritten.into_iter().zip(parts).enumerate() {
            let p = &mut self.programs[k];
            if let Some((buf, per_inference)) = r {
                p.inference = crate::Inference::new(&self.dev, &per_inference)?;
                p._state_program = Some(buf);
            }
            p.state = part;
        }
        // Zeroing the state is a stream of its own, encoded once: a new
        // sequence then costs one submission.
        let mut zero = rbln_hw::cmd::Encoder::new(Vec::new());
        for s in &slots {
            zero.fill(s.state_va, align(s.bytes, 4), 0);
        }
        let (buf, va) = alloc_mapped(&self.dev, zero.buf.len() as u64, Placement::Host)?;
        buf.write_slice(0, &zero.buf)?;
        self.state_reset = Some((buf, va, zero.buf.len() as u32));
        self._state_buf = Some(state_buf);
        self.state = slots;
        self.reset_state()
    }

    /// Program `k`'s per-inference streams with its bound inputs loaded
    /// from (outputs saved to) their state buffers instead of staging:
    /// made from its own relocated packets (each transfer node's byte
    /// range), so nothing about the program changes but which transfers
    /// run. Returns their buffer and (VA, size) list.
    fn rewrite_streams(&self, e: &rbln_format::EntryRef<'_>, k: usize, part: &[StatePair], slots: &[StateSlot]) -> Result<(rbln_umd::Buffer, Vec<(u64, u32)>)> {
        let meta = e.meta;
        let relocated = e.relocate(&self.programs[k].bases)?;
        let bound_in = |t: u32| part.iter().any(|p| p.input.is_some_and(|i| meta.inputs[i].tensor == t));
        let bound_out = |t: u32| part.iter().any(|p| p.output.is_some_and(|o| meta.outputs[o].tensor == t));
        let skip = |role: StreamRole, stream: usize| -> Vec<(u64, u64)> {
            let mut r: Vec<(u64, u64)> = e
                .graph
                .nodes
                .iter()
                .filter(|n| match n.kind {
                    NodeKind::HostToDevice => role == StreamRole::InputTransfer && n.inputs.first().is_some_and(|&t| bound_in(t)),
                    NodeKind::DeviceToHost => role == StreamRole::OutputTransfer && n.outputs.first().is_some_and(|&t| bound_out(t)),
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
        // The state copied in before the other inputs, the run as it is,
        // the state copied out before the other outputs. The copies go
        // through the buffer because the memory plan may put the output
        // where the input was once the input is read.
        let mut load = rbln_hw::cmd::Encoder::new(Vec::new());
        let mut save = rbln_hw::cmd::Encoder::new(Vec::new());
        for p in part {
            let s = &slots[p.slot];
            if p.input.is_some() {
                load.dma_copy(s.state_va, p.in_va, s.bytes);
            }
            if p.output.is_some() {
                save.dma_copy(p.out_va, s.state_va, s.bytes);
            }
        }
        let mut streams: Vec<Vec<u8>> = Vec::new();
        let mut roles = Vec::new();
        for role in [StreamRole::InputTransfer, StreamRole::Run, StreamRole::OutputTransfer] {
            for (i, _) in e.program.streams.iter().enumerate().filter(|(_, s)| s.role == role) {
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
        // A program without an input (output) transfer stream gets one.
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
        Ok((buf, per_inference))
    }

    /// The bound `(input, output)` names.
    pub fn state_pairs(&self) -> Vec<(String, String)> {
        self.state.iter().map(|s| (s.input.clone(), s.output.clone())).collect()
    }

    /// Zero every bound state tensor.
    pub fn reset_state(&mut self) -> Result<()> {
        if let Some((_, va, len)) = &self.state_reset {
            self.queue.submit_va(*va, *len)?.wait(STREAM_TIMEOUT)?;
        }
        Ok(())
    }

    /// The slot of state input `name` and a binding of it (the input of
    /// some program), whose staging bytes carry it to and from the host.
    fn slot_of(&self, name: &str) -> Result<(StateSlot, IoBinding)> {
        let slot = self
            .state
            .iter()
            .find(|s| s.input == name)
            .cloned()
            .ok_or_else(|| state_err(format!("'{name}' is not a bound state input (bound: {:?})", self.state_pairs())))?;
        let b = self
            .model
            .entry_points()
            .iter()
            .find_map(|e| e.meta.inputs.iter().find(|b| b.name == name).cloned())
            .ok_or_else(|| state_err(format!("no program has the input '{name}'")))?;
        Ok((slot, b))
    }

    /// Write the state input `name` (through its staging region).
    pub fn set_state(&mut self, name: &str, t: TensorView<'_>) -> Result<()> {
        let (s, b) = self.slot_of(name)?;
        if b.dtype != t.dtype() || t.shape != b.shape || t.data.len() as u64 != Tensor::elements(&b.shape) {
            return Err(state_err(format!("state '{name}' is {}, got {} {:?}", shape_of(&b), t.dtype().name(), t.shape)));
        }
        self.staging.write_slice(b.placement.offset(), &t.data.bytes())?;
        let mut cb = rbln_umd::CommandBuffer::new(&self.dev)?;
        cb.dma_copy_va(self.loaded().bases.staging + b.placement.offset(), s.state_va, s.bytes);
        self.queue.submit_ioctl(&mut cb)?.wait(STREAM_TIMEOUT)?;
        Ok(())
    }

    /// Read the state input `name` (the value the next run will read).
    pub fn state(&mut self, name: &str) -> Result<Tensor> {
        let (s, b) = self.slot_of(name)?;
        let mut cb = rbln_umd::CommandBuffer::new(&self.dev)?;
        cb.dma_copy_va(s.state_va, self.loaded().bases.staging + b.placement.offset(), s.bytes);
        self.queue.submit_ioctl(&mut cb)?.wait(STREAM_TIMEOUT)?;
        self.read_binding(&b)
    }
}
