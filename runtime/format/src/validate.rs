//! Semantic validation of a whole model: everything docs/rbln-format.md
//! ("Validation rules") requires beyond the byte layout. Used by the reader
//! after decoding and by the writer before encoding, so a checked write can
//! never produce a file the reader rejects.
//!
//! All arithmetic on file-supplied values is checked; all allocations are
//! proportional to data already decoded.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashSet};

use rbln_hw::cmd::Packet;
use rbln_hw::ops::{Desc, OpHeader};

use crate::error::{FormatError, Result};
use crate::limits::*;
use crate::model::*;
use crate::names;

const NONE: u32 = u32::MAX;

/// A whole model: the main program, the entry table, then each entry
/// point (its errors wrapped in [`FormatError::InEntry`]).
pub(crate) fn validate_model(m: &Model) -> Result<()> {
    validate(&m.main())?;
    entry_table(m)?;
    for e in m.entry_points().iter().skip(1) {
        validate(e).map_err(|source| FormatError::InEntry { entry: e.name.into(), source: Box::new(source) })?;
    }
    Ok(())
}

/// Whether `name` may name an entry point or a stream (it becomes part of
/// a section name).
pub(crate) fn is_section_word(name: &str, max: u64) -> bool {
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    !name.is_empty() && name.len() as u64 <= max && name.chars().all(valid)
}

/// The entry table (docs/rbln-format.md, "Entry points").
fn entry_table(m: &Model) -> Result<()> {
    let bad = |problem: String| FormatError::BadEntries { problem };
    if m.main_entry.is_none() && m.entries.is_empty() {
        return Ok(());
    }
    if m.meta.version < (Version { major: 1, minor: 2 }) {
        return Err(bad(format!("entry points need format version 1.2 or later; the model says {}", m.meta.version)));
    }
    limit(names::ENTRIES, "entries count", m.entries.len() as u64, MAX_ENTRIES)?;
    let mut seen = HashSet::new();
    for e in m.entry_points() {
        if !is_section_word(e.name, MAX_STREAM_NAME_LEN) {
            return Err(bad(format!("entry name '{}' is not 1 to {MAX_STREAM_NAME_LEN} characters from [A-Za-z0-9_.-]", e.name)));
        }
        if !seen.insert(e.name) {
            return Err(FormatError::DuplicateName { kind: "entry point", name: e.name.into() });
        }
        if e.meta.version != m.meta.version {
            return Err(bad(format!("entry '{}' says format version {}, the file {}", e.name, e.meta.version, m.meta.version)));
        }
        if e.meta.weights_offset != m.meta.weights_offset {
            return Err(bad(format!(
                "entry '{}' places the weights at arena offset {}, the main program at {} (entries share one weights region)",
                e.name, e.meta.weights_offset, m.meta.weights_offset
            )));
        }
    }
    Ok(())
}

pub(crate) fn validate(m: &EntryRef<'_>) -> Result<()> {
    meta(m)?;
    let boundaries = streams(m)?;
    tensors(m)?;
    let inputs = io_ids(m)?;
    let producer = graph(m, &inputs, &boundaries)?;
    io(m, &producer)?;
    liveness(m, &producer)?;
    op_summary(m)?;
    relocations(m)?;
    profile(m)?;
    Ok(())
}

fn limit(section: &str, field: impl Into<String>, found: u64, limit: u64) -> Result<()> {
    if found > limit {
        return Err(FormatError::LimitExceeded { section: section.into(), field: field.into(), found, limit });
    }
    Ok(())
}

fn bad(section: &str, field: impl Into<String>, expected: impl Into<String>, found: impl ToString) -> FormatError {
    FormatError::BadField {
        section: section.into(),
        field: field.into(),
        expected: expected.into(),
        found: found.to_string(),
    }
}

fn meta(m: &EntryRef<'_>) -> Result<()> {
    let mt = &m.meta;
    let s = names::META;
    if mt.version.major != crate::FORMAT_MAJOR {
        return Err(FormatError::UnsupportedVersion {
            major: mt.version.major,
            minor: mt.version.minor,
            supported: crate::FORMAT_MAJOR,
        });
    }
    let (req_major, req_minor) = ((mt.hw_version >> 16) as u16, mt.hw_version as u16);
    if req_major as u32 != rbln_hw::HW_VERSION_MAJOR || req_minor as u32 > rbln_hw::HW_VERSION_MINOR {
        return Err(FormatError::HwVersion {
            required_major: req_major,
            required_minor: req_minor,
            supported_major: rbln_hw::HW_VERSION_MAJOR as u16,
            supported_minor: rbln_hw::HW_VERSION_MINOR as u16,
        });
    }
    limit(s, "name length", mt.name.len() as u64, MAX_NAME_LEN)?;
    limit(s, "producer length", mt.producer.len() as u64, MAX_NAME_LEN)?;
    limit(s, "arena_size", mt.arena_size, MAX_ARENA_SIZE)?;
    limit(s, "staging_size", mt.staging_size, MAX_STAGING_SIZE)?;
    limit(s, "inputs count", mt.inputs.len() as u64, MAX_IO)?;
    limit(s, "outputs count", mt.outputs.len() as u64, MAX_IO)?;
    limit(s, "properties count", mt.properties.len() as u64, MAX_PROPERTIES)?;
    limit(s, "ops count", mt.ops.len() as u64, MAX_NODES)?;
    if !mt.weights_offset.is_multiple_of(crate::TENSOR_ALIGN) {
        return Err(bad(s, "weights_offset", format!("a multiple of {}", crate::TENSOR_ALIGN), mt.weights_offset));
    }
    let wsize = m.weights.len() as u64;
    if mt.weights_offset.checked_add(wsize).is_none_or(|end| end > mt.arena_size) {
        return Err(FormatError::WeightsOutOfArena {
            offset: mt.weights_offset,
            size: wsize,
            arena_size: mt.arena_size,
        });
    }
    let mut keys = HashSet::with_capacity(mt.properties.len());
    for (i, p) in mt.properties.iter().enumerate() {
        if p.key.is_empty() {
            return Err(bad(s, format!("properties[{i}].key"), "a non-empty key", "\"\""));
        }
        limit(s, format!("properties[{i}].key length"), p.key.len() as u64, MAX_NAME_LEN)?;
        limit(s, format!("properties[{i}].value length"), p.value.len() as u64, MAX_VALUE_LEN)?;
        if !keys.insert(p.key.as_str()) {
            return Err(FormatError::DuplicateName { kind: "property", name: p.key.clone() });
        }
    }
    Ok(())
}

/// Checks the stream table and every stream's packets; returns each
/// stream's packet start offsets.
fn streams(m: &EntryRef<'_>) -> Result<Vec<Vec<u64>>> {
    let st = &m.program.streams;
    limit(names::META, "streams count", st.len() as u64, MAX_STREAMS)?;
    limit(names::DESC, "size", m.program.descriptors.len() as u64, MAX_DESC_SIZE)?;
    let mut seen = HashSet::with_capacity(st.len());
    let mut roles = [0u32; 5];
    let mut out = Vec::with_capacity(st.len());
    for (i, s) in st.iter().enumerate() {
        let err = |problem: String| FormatError::BadStream { stream: i as u32, name: s.name.clone(), problem };
        if !is_section_word(&s.name, MAX_STREAM_NAME_LEN) {
            return Err(err(format!("name must be 1 to {MAX_STREAM_NAME_LEN} characters from [A-Za-z0-9_.-]")));
        }
        if !seen.insert(s.name.as_str()) {
            return Err(FormatError::DuplicateName { kind: "command stream", name: s.name.clone() });
        }
        roles[s.role as usize] += 1;
        if s.role != StreamRole::Aux && roles[s.role as usize] > 1 {
            return Err(err(format!("a second stream with role {}", s.role.name())));
        }
        let sec = format!("{}{}", names::CMD_PREFIX, s.name);
        limit(&sec, "size", s.bytes.len() as u64, MAX_STREAM_SIZE)?;
        if !s.bytes.len().is_multiple_of(4) {
            return Err(err(format!("size {} is not a whole number of dwords", s.bytes.len())));
        }
        let mut starts = Vec::new();
        let mut off = 0usize;
        while off < s.bytes.len() {
            match Packet::decode(&s.bytes[off..]) {
                Ok((_, n)) => {
                    starts.push(off as u64);
                    off += n;
                }
                Err(e) => {
                    return Err(FormatError::BadPacket {
                        stream: s.name.clone(),
                        offset: off as u64,
                        problem: format!("{e:?}"),
                    })
                }
            }
        }
        out.push(starts);
    }
    if roles[StreamRole::Run as usize] != 1 {
        return Err(FormatError::BadField {
            section: names::META.into(),
            field: "streams".into(),
            expected: "exactly one stream with role run".into(),
            found: roles[StreamRole::Run as usize].to_string(),
        });
    }
    Ok(out)
}

fn tensors(m: &EntryRef<'_>) -> Result<()> {
    let g = &m.graph;
    let s = names::GRAPH;
    limit(s, "tensors count", g.tensors.len() as u64, MAX_TENSORS)?;
    let w_lo = m.meta.weights_offset;
    let w_hi = w_lo.saturating_add(m.weights.len() as u64);
    let mut seen = HashSet::with_capacity(g.tensors.len());
    for (i, t) in g.tensors.iter().enumerate() {
        let id = i as u32;
        if t.name.is_empty() {
            return Err(bad(s, format!("tensors[{i}].name"), "a non-empty name", "\"\""));
        }
        limit(s, format!("tensors[{i}].name length"), t.name.len() as u64, MAX_NAME_LEN)?;
        if !seen.insert(t.name.as_str()) {
            return Err(FormatError::DuplicateName { kind: "tensor", name: t.name.clone() });
        }
        limit(s, format!("tensors[{i}].shape rank"), t.shape.len() as u64, MAX_RANK)?;
        let (offset, size) = (t.placement.offset(), t.placement.size());
        match tensor_bytes(t.dtype, &t.shape) {
            Some(b) if b == size => {}
            b => {
                return Err(FormatError::TensorSize {
                    tensor: id,
                    name: t.name.clone(),
                    expected: b.map_or("more than 2^64 bytes".into(), |b| b.to_string()),
                    found: size,
                })
            }
        }
        if !offset.is_multiple_of(crate::TENSOR_ALIGN) {
            return Err(FormatError::TensorMisaligned {
                tensor: id,
                name: t.name.clone(),
                offset,
                align: crate::TENSOR_ALIGN,
            });
        }
        let end = offset.checked_add(size);
        let oob = |region: String, limit: u64| FormatError::TensorOutOfBounds {
            tensor: id,
            name: t.name.clone(),
            region,
            offset,
            size,
            limit,
        };
        match t.placement {
            Placement::Arena { .. } => {
                if end.is_none_or(|e| e > m.meta.arena_size) {
                    return Err(oob("arena".into(), m.meta.arena_size));
                }
                if size > 0 && offset < w_hi && w_lo < offset + size {
                    return Err(oob(
                        format!("arena outside the weights region (arena bytes {w_lo}..{w_hi})"),
                        m.meta.arena_size,
                    ));
                }
            }
            Placement::Weight { .. } => {
                if offset < w_lo || end.is_none_or(|e| e > w_hi) {
                    return Err(oob(format!("weights region (arena bytes {w_lo}..{w_hi})"), w_hi - w_lo));
                }
            }
            Placement::Staging { .. } => {
                if end.is_none_or(|e| e > m.meta.staging_size) {
                    return Err(oob("staging buffer".into(), m.meta.staging_size));
                }
            }
        }
    }
    Ok(())
}

/// Range-checks the io tensor ids; returns the set of input tensors.
fn io_ids(m: &EntryRef<'_>) -> Result<HashSet<u32>> {
    let count = m.graph.tensors.len();
    let mut inputs = HashSet::with_capacity(m.meta.inputs.len());
    for (what, list) in [("input", &m.meta.inputs), ("output", &m.meta.outputs)] {
        let mut names = HashSet::with_capacity(list.len());
        let mut ids = HashSet::with_capacity(list.len());
        for (i, b) in list.iter().enumerate() {
            let err = |problem: String| FormatError::BadIo { io: what, index: i as u32, name: b.name.clone(), problem };
            if b.name.is_empty() || b.name.len() as u64 > MAX_NAME_LEN {
                return Err(err(format!("name must be 1 to {MAX_NAME_LEN} bytes")));
            }
            if !names.insert(b.name.as_str()) {
                return Err(FormatError::DuplicateName { kind: what, name: b.name.clone() });
            }
            if b.tensor as usize >= count {
                return Err(err(format!("tensor {} does not exist (the graph has {count} tensors)", b.tensor)));
            }
            if !ids.insert(b.tensor) {
                return Err(err(format!("tensor {} is already bound to another {what}", b.tensor)));
            }
            if what == "input" {
                inputs.insert(b.tensor);
            }
        }
    }
    Ok(inputs)
}

fn is_boundary(starts: &[u64], stream_len: u64, off: u64) -> bool {
    off == stream_len || starts.binary_search(&off).is_ok()
}

/// Checks the nodes; returns each tensor's producing node (NONE if none).
fn graph(m: &EntryRef<'_>, inputs: &HashSet<u32>, boundaries: &[Vec<u64>]) -> Result<Vec<u32>> {
    let g = &m.graph;
    let s = names::GRAPH;
    limit(s, "nodes count", g.nodes.len() as u64, MAX_NODES)?;
    let count = g.tensors.len() as u32;
    let mut producer = vec![NONE; g.tensors.len()];

    // Ids, arity, producers.
    for (i, n) in g.nodes.iter().enumerate() {
        let node = i as u32;
        limit(s, format!("nodes[{i}].name length"), n.name.len() as u64, MAX_NAME_LEN)?;
        limit(s, format!("nodes[{i}].op length"), n.op.len() as u64, MAX_NAME_LEN)?;
        limit(s, format!("nodes[{i}].inputs count"), n.inputs.len() as u64, MAX_NODE_ARITY)?;
        limit(s, format!("nodes[{i}].outputs count"), n.outputs.len() as u64, MAX_NODE_ARITY)?;
        for (role, list) in [("input", &n.inputs), ("output", &n.outputs)] {
            for (slot, &t) in list.iter().enumerate() {
                if t >= count {
                    return Err(FormatError::UnknownTensor {
                        node,
                        name: n.name.clone(),
                        role,
                        slot: slot as u32,
                        tensor: t,
                        count,
                    });
                }
            }
        }
        for &t in &n.outputs {
            let p = &mut producer[t as usize];
            if *p != NONE {
                return Err(FormatError::MultipleProducers {
                    tensor: t,
                    name: g.tensors[t as usize].name.clone(),
                    first: *p,
                    second: node,
                });
            }
            *p = node;
        }
    }

    for (i, n) in g.nodes.iter().enumerate() {
        let node = i as u32;
        let kind = n.kind.name();
        let bad_node = |problem: String| FormatError::BadNode { node, name: n.name.clone(), kind, problem };

        // Topological order and initialisation.
        for &t in &n.inputs {
            let tensor = &g.tensors[t as usize];
            let p = producer[t as usize];
            if p != NONE && p >= node {
                return Err(FormatError::NotTopological {
                    node,
                    name: n.name.clone(),
                    tensor: t,
                    tensor_name: tensor.name.clone(),
                    producer: p,
                });
            }
            if p == NONE && !inputs.contains(&t) && !matches!(tensor.placement, Placement::Weight { .. }) {
                return Err(FormatError::UninitializedRead {
                    node,
                    name: n.name.clone(),
                    tensor: t,
                    tensor_name: tensor.name.clone(),
                });
            }
        }

        // Kind-specific shape of the node.
        let arity = |ins: usize, outs: usize| -> Result<()> {
            if n.inputs.len() != ins || n.outputs.len() != outs {
                return Err(bad_node(format!(
                    "has {} inputs and {} outputs, expected {ins} and {outs}",
                    n.inputs.len(),
                    n.outputs.len()
                )));
            }
            Ok(())
        };
        let place = |role: &'static str, t: u32, ok: &[u8], expected: &'static str| -> Result<()> {
            let tensor = &g.tensors[t as usize];
            if !ok.contains(&tensor.placement.code()) {
                return Err(FormatError::BadPlacement {
                    node,
                    name: n.name.clone(),
                    kind,
                    role,
                    tensor: t,
                    tensor_name: tensor.name.clone(),
                    expected,
                    found: tensor.placement.region(),
                });
            }
            Ok(())
        };
        const ARENA: u8 = 0;
        const WEIGHT: u8 = 1;
        const STAGING: u8 = 2;
        match n.kind {
            NodeKind::Compute => {
                if n.op.is_empty() {
                    return Err(bad_node("compute node without an op name".into()));
                }
                if n.outputs.is_empty() {
                    return Err(bad_node("compute node without outputs".into()));
                }
                for &t in &n.inputs {
                    place("input", t, &[ARENA, WEIGHT], "arena or weights region")?;
                }
                for &t in &n.outputs {
                    place("output", t, &[ARENA], "arena")?;
                }
            }
            NodeKind::HostToDevice | NodeKind::DeviceToHost => {
                arity(1, 1)?;
                let (from, to) = if n.kind == NodeKind::HostToDevice {
                    ((STAGING, "staging buffer"), (ARENA, "arena"))
                } else {
                    ((ARENA, "arena"), (STAGING, "staging buffer"))
                };
                place("input", n.inputs[0], &[from.0], from.1)?;
                place("output", n.outputs[0], &[to.0], to.1)?;
            }
            NodeKind::View if n.inputs.len() <= 1 => {
                // A reshape (the same bytes) or a slice (a contiguous part
                // of them).
                arity(1, 1)?;
                let (a, b) = (&g.tensors[n.inputs[0] as usize], &g.tensors[n.outputs[0] as usize]);
                let (pa, pb) = (a.placement, b.placement);
                let inside = pa.code() == pb.code()
                    && pb.offset() >= pa.offset()
                    && pb.offset().saturating_add(pb.size()) <= pa.offset().saturating_add(pa.size());
                if pa != pb && !inside {
                    return Err(bad_node(format!(
                        "output '{}' must occupy the input's bytes or a part of them ({:?}), found {:?}",
                        b.name, pa, pb
                    )));
                }
            }
            NodeKind::View => {
                // A concatenation view: the inputs lie side by side, in
                // order, over exactly the output's bytes.
                arity(n.inputs.len(), 1)?;
                let out = &g.tensors[n.outputs[0] as usize];
                place("output", n.outputs[0], &[ARENA], "arena")?;
                let mut at = out.placement.offset();
                for &t in &n.inputs {
                    place("input", t, &[ARENA], "arena")?;
                    let p = g.tensors[t as usize].placement;
                    if p.offset() != at || p.size() == 0 {
                        return Err(bad_node(format!(
                            "input '{}' ({:?}) must be non-empty and start at arena offset {at}, where the previous input ends \
                             (the output '{}' is {:?})",
                            g.tensors[t as usize].name, p, out.name, out.placement
                        )));
                    }
                    at = at.saturating_add(p.size());
                }
                if at != out.placement.offset() + out.placement.size() {
                    return Err(bad_node(format!(
                        "the inputs cover {} bytes, the output '{}' {:?}",
                        at - out.placement.offset(),
                        out.name,
                        out.placement
                    )));
                }
            }
        }
        if n.kind != NodeKind::Compute && !n.op.is_empty() {
            return Err(bad_node(format!("op must be empty for {kind} nodes, found '{}'", n.op)));
        }
        if matches!(n.kind, NodeKind::HostToDevice | NodeKind::DeviceToHost) {
            let (a, b) = (&g.tensors[n.inputs[0] as usize], &g.tensors[n.outputs[0] as usize]);
            if a.placement.size() != b.placement.size() {
                return Err(bad_node(format!(
                    "copies {} bytes ('{}') into {} bytes ('{}')",
                    a.placement.size(),
                    a.name,
                    b.placement.size(),
                    b.name
                )));
            }
        }

        // Commands and descriptors.
        let range_err = |what: &str, offset: u64, len: u64, problem: String| FormatError::NodeRange {
            node,
            name: n.name.clone(),
            what: what.into(),
            offset,
            len,
            problem,
        };
        match (n.kind, n.commands) {
            (NodeKind::View, Some(_)) => return Err(bad_node("a view runs no commands".into())),
            (NodeKind::View, None) => {}
            (_, None) => return Err(bad_node("no command range".into())),
            (_, Some(c)) => {
                let Some(stream) = m.program.streams.get(c.stream as usize) else {
                    return Err(range_err(
                        "command",
                        c.offset,
                        c.len,
                        format!("names stream {}, but there are {}", c.stream, m.program.streams.len()),
                    ));
                };
                let what = format!("command (stream '{}')", stream.name);
                let slen = stream.bytes.len() as u64;
                if c.len == 0 {
                    return Err(range_err(&what, c.offset, c.len, "is empty".into()));
                }
                if c.offset.checked_add(c.len).is_none_or(|e| e > slen) {
                    return Err(range_err(&what, c.offset, c.len, format!("exceeds the {slen}-byte stream")));
                }
                let starts = boundaries.get(c.stream as usize).map(Vec::as_slice).unwrap_or_default();
                if !is_boundary(starts, slen, c.offset) || !is_boundary(starts, slen, c.offset + c.len) {
                    return Err(range_err(
                        &what,
                        c.offset,
                        c.len,
                        "does not start and end on packet boundaries".into(),
                    ));
                }
            }
        }
        if let Some(d) = n.descriptors {
            if n.kind != NodeKind::Compute {
                return Err(bad_node("only compute nodes have descriptors".into()));
            }
            desc_range(m, node, &n.name, d)?;
        }
    }

    // Every packet and every descriptor belongs to at most one node. This
    // also bounds the descriptor walk below by the size of .rbln.desc.
    let mut cmd: Vec<(u32, u64, u64, u32)> = Vec::new();
    let mut desc: Vec<(u64, u64, u32)> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if let Some(c) = n.commands {
            cmd.push((c.stream, c.offset, c.offset + c.len, i as u32)); // end checked above
        }
        if let Some(d) = n.descriptors {
            desc.push((d.offset, d.offset.saturating_add(d.len), i as u32));
        }
    }
    cmd.sort_unstable();
    for w in cmd.windows(2) {
        let ((sa, _, ea, na), (sb, ob, eb, nb)) = (w[0], w[1]);
        if sa == sb && ob < ea {
            let n = &g.nodes[nb as usize];
            return Err(FormatError::NodeRange {
                node: nb,
                name: n.name.clone(),
                what: format!("command (stream '{}')", m.program.streams[sb as usize].name),
                offset: ob,
                len: eb - ob,
                problem: format!("overlaps the command range of node {na}"),
            });
        }
    }
    desc.sort_unstable();
    for w in desc.windows(2) {
        let ((_, ea, na), (ob, eb, nb)) = (w[0], w[1]);
        if ob < ea {
            return Err(FormatError::NodeRange {
                node: nb,
                name: g.nodes[nb as usize].name.clone(),
                what: "descriptor".into(),
                offset: ob,
                len: eb - ob,
                problem: format!("overlaps the descriptor range of node {na}"),
            });
        }
    }
    for (i, n) in g.nodes.iter().enumerate() {
        if let Some(d) = n.descriptors {
            descriptors(m, i as u32, &n.name, d)?;
        }
    }
    Ok(producer)
}

/// A node's descriptor range: non-empty, aligned, inside `.rbln.desc`.
fn desc_range(m: &EntryRef<'_>, node: u32, name: &str, d: DescRange) -> Result<()> {
    let blob = &m.program.descriptors;
    let range_err = |problem: String| FormatError::NodeRange {
        node,
        name: name.into(),
        what: "descriptor".into(),
        offset: d.offset,
        len: d.len,
        problem,
    };
    if d.len == 0 {
        return Err(range_err("is empty (a node without descriptors has none)".into()));
    }
    if !d.offset.is_multiple_of(crate::RELOC_ALIGN) {
        return Err(range_err(format!("offset is not a multiple of {}", crate::RELOC_ALIGN)));
    }
    match d.offset.checked_add(d.len) {
        Some(e) if e <= blob.len() as u64 => Ok(()),
        _ => Err(range_err(format!("exceeds the {}-byte .rbln.desc", blob.len()))),
    }
}

/// The descriptors in a (checked) range: whole, valid descriptors.
fn descriptors(m: &EntryRef<'_>, node: u32, name: &str, d: DescRange) -> Result<()> {
    let blob = &m.program.descriptors;
    let end = (d.offset + d.len) as usize;
    let mut p = d.offset as usize;
    while p < end {
        let bad = |problem: String| FormatError::BadDescriptor { node, name: name.into(), offset: p as u64, problem };
        let Some(h) = blob.get(p..end).and_then(OpHeader::read_from) else {
            return Err(bad(format!("{} bytes left in the range, a descriptor header needs 8", end - p)));
        };
        let size = h.size as usize;
        if !(OpHeader::SIZE..=rbln_hw::ops::MAX_DESC_SIZE).contains(&size) || !size.is_multiple_of(4) || size > end - p
        {
            return Err(bad(format!(
                "header size {size} is not a multiple of 4 in 8..={} within the range",
                rbln_hw::ops::MAX_DESC_SIZE
            )));
        }
        if let Err(e) = Desc::decode(&blob[p..p + size]) {
            return Err(bad(format!("{e:?}")));
        }
        p += size;
    }
    Ok(())
}

fn io(m: &EntryRef<'_>, producer: &[u32]) -> Result<()> {
    let g = &m.graph;
    let inputs: HashSet<u32> = m.meta.inputs.iter().map(|b| b.tensor).collect();
    for (what, list) in [("input", &m.meta.inputs), ("output", &m.meta.outputs)] {
        for (i, b) in list.iter().enumerate() {
            let index = i as u32;
            let t = &g.tensors[b.tensor as usize];
            let mismatch = |field: &'static str, expected: String, found: String| FormatError::IoMismatch {
                io: what,
                index,
                name: b.name.clone(),
                tensor: b.tensor,
                field,
                expected,
                found,
            };
            if b.dtype != t.dtype {
                return Err(mismatch("dtype", t.dtype.name().into(), b.dtype.name().into()));
            }
            if b.shape != t.shape {
                return Err(mismatch("shape", format!("{:?}", t.shape), format!("{:?}", b.shape)));
            }
            if b.placement != t.placement {
                return Err(mismatch("placement", format!("{:?}", t.placement), format!("{:?}", b.placement)));
            }
            let err = |problem: String| FormatError::BadIo { io: what, index, name: b.name.clone(), problem };
            if let Placement::Weight { .. } = t.placement {
                return Err(err(format!("tensor {} ('{}') is a weight", b.tensor, t.name)));
            }
            if let Some(r) = b.range {
                if !matches!(b.dtype, DType::I32 | DType::I64) {
                    return Err(err(format!("a value range on a {} tensor (only integer inputs have one)", b.dtype.name())));
                }
                if r.lo >= r.hi {
                    return Err(err(format!("empty value range {}..{}", r.lo, r.hi)));
                }
            }
            let p = producer[b.tensor as usize];
            if what == "input" && p != NONE {
                return Err(err(format!("tensor {} ('{}') is produced by node {p}", b.tensor, t.name)));
            }
            if what == "output" && p == NONE && !inputs.contains(&b.tensor) {
                return Err(err(format!("no node produces tensor {} ('{}')", b.tensor, t.name)));
            }
        }
    }
    Ok(())
}

/// No two arena (or staging) tensors may share bytes while both are live.
/// Time 0 is before the first node, node i runs at time i + 1, time N + 1
/// is after the last node. A tensor is live from its producer (+1) to its
/// last reader (+1); model inputs and outputs are live for the whole run
/// (0..=N+1), so the runtime may fill and read them at any time. Views
/// join tensors into one storage (the tensors a chain of view nodes
/// connects): its bytes are the span of theirs, its lifetime the union of
/// theirs, and its tensors that a view does not produce (those something
/// writes) share no byte.
fn liveness(m: &EntryRef<'_>, producer: &[u32]) -> Result<()> {
    let g = &m.graph;
    let n = g.nodes.len() as u64;
    // Storage classes: union-find over the view nodes' tensors.
    let mut parent: Vec<u32> = (0..g.tensors.len() as u32).collect();
    fn find(parent: &mut [u32], mut t: u32) -> u32 {
        while parent[t as usize] != t {
            let up = parent[parent[t as usize] as usize];
            parent[t as usize] = up;
            t = up;
        }
        t
    }
    for node in g.nodes.iter().filter(|n| n.kind == NodeKind::View) {
        for &t in node.inputs.iter().chain(&node.outputs) {
            // The lowest id names the storage (in messages).
            let (a, b) = (find(&mut parent, t), find(&mut parent, node.outputs[0]));
            parent[a.max(b) as usize] = a.min(b);
        }
    }
    let root: Vec<u32> = (0..g.tensors.len() as u32).map(|t| find(&mut parent, t)).collect();
    let by_view = |t: usize| producer[t] != NONE && g.nodes[producer[t] as usize].kind == NodeKind::View;
    // Within a storage, the written tensors are disjoint (weights, never
    // written at run time, may overlap).
    let mut written: Vec<(u32, u64, u64, u32)> = (0..g.tensors.len())
        .filter(|&t| !by_view(t) && g.tensors[t].placement.size() > 0 && g.tensors[t].placement.code() != 1)
        .map(|t| (root[t], g.tensors[t].placement.offset(), g.tensors[t].placement.size(), t as u32))
        .collect();
    written.sort_unstable();
    // (root, end of the bytes seen so far in it, the tensor reaching there)
    let mut reach: Option<(u32, u64, u32)> = None;
    for &(r, off, size, t) in &written {
        match reach {
            Some((rr, end, who)) if rr == r && end > off => {
                let (a, b) = (who.min(t), who.max(t));
                return Err(FormatError::TensorOverlap {
                    a,
                    a_name: g.tensors[a as usize].name.clone(),
                    b,
                    b_name: g.tensors[b as usize].name.clone(),
                    region: "storage of views",
                });
            }
            Some((rr, end, _)) if rr == r && end >= off + size => {}
            _ => reach = Some((r, off + size, t)),
        }
    }
    // Each storage's span (offset, end) and region.
    let mut span: Vec<Option<(u64, u64)>> = vec![None; g.tensors.len()];
    for (t, tensor) in g.tensors.iter().enumerate() {
        let (o, e) = (tensor.placement.offset(), tensor.placement.offset() + tensor.placement.size());
        let s = &mut span[root[t] as usize];
        *s = Some(match *s {
            None => (o, e),
            Some((a, b)) => (a.min(o), b.max(e)),
        });
    }
    // Live interval per root: (start, end), inclusive; None if never live.
    let mut live: Vec<Option<(u64, u64)>> = vec![None; g.tensors.len()];
    let mut touch = |t: u32, time: u64| {
        let r = &mut live[root[t as usize] as usize];
        *r = Some(match *r {
            None => (time, time),
            Some((a, b)) => (a.min(time), b.max(time)),
        });
    };
    for b in m.meta.inputs.iter().chain(&m.meta.outputs) {
        touch(b.tensor, 0);
        touch(b.tensor, n + 1);
    }
    for (t, &p) in producer.iter().enumerate() {
        if p != NONE {
            touch(t as u32, p as u64 + 1);
        }
    }
    for (i, node) in g.nodes.iter().enumerate() {
        for &t in &node.inputs {
            touch(t, i as u64 + 1);
        }
    }

    for (region, code) in [("arena", 0u8), ("staging buffer", 2u8)] {
        // (start, end, offset, size, id) of each live root in the region.
        let mut items: Vec<(u64, u64, u64, u64, u32)> = live
            .iter()
            .enumerate()
            .filter_map(|(t, l)| {
                let tensor = &g.tensors[t];
                let (s, e) = (*l)?;
                let (lo, hi) = span[t]?;
                (root[t] as usize == t && tensor.placement.code() == code && hi > lo).then_some((s, e, lo, hi - lo, t as u32))
            })
            .collect();
        items.sort_unstable();
        // Active roots: offset -> (end offset, id); expiry heap by end time.
        let mut active: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
        let mut expiry: BinaryHeap<Reverse<(u64, u64, u32)>> = BinaryHeap::new();
        for &(start, end, off, size, id) in &items {
            while let Some(&Reverse((e, o, who))) = expiry.peek() {
                if e >= start {
                    break;
                }
                expiry.pop();
                if active.get(&o).is_some_and(|&(_, w)| w == who) {
                    active.remove(&o);
                }
            }
            let hi = off + size; // in bounds: checked by tensors()
            let conflict = active
                .range(..=off)
                .next_back()
                .filter(|(_, &(e, _))| e > off)
                .or_else(|| active.range(off..hi).next())
                .map(|(_, &(_, w))| w);
            if let Some(other) = conflict {
                let (a, b) = (other.min(id), other.max(id));
                return Err(FormatError::TensorOverlap {
                    a,
                    a_name: g.tensors[a as usize].name.clone(),
                    b,
                    b_name: g.tensors[b as usize].name.clone(),
                    region,
                });
            }
            active.insert(off, (hi, id));
            expiry.push(Reverse((end, off, id)));
        }
    }
    Ok(())
}

fn op_summary(m: &EntryRef<'_>) -> Result<()> {
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for n in &m.graph.nodes {
        if n.kind == NodeKind::Compute {
            *counts.entry(n.op.as_str()).or_default() += 1;
        }
    }
    let listed = &m.meta.ops;
    for w in listed.windows(2) {
        if w[0].op.as_bytes() >= w[1].op.as_bytes() {
            return Err(FormatError::OpSummary {
                detail: format!("'{}' listed before '{}' (entries must be sorted and unique)", w[0].op, w[1].op),
            });
        }
    }
    for o in listed {
        match counts.get(o.op.as_str()) {
            Some(&c) if c == o.count as u64 => {}
            Some(&c) => {
                return Err(FormatError::OpSummary {
                    detail: format!("'{}' is listed {} times, the graph has {c}", o.op, o.count),
                })
            }
            None => {
                return Err(FormatError::OpSummary {
                    detail: format!("'{}' is listed but no compute node uses it", o.op),
                })
            }
        }
    }
    if listed.len() != counts.len() {
        let missing = counts.keys().find(|k| !listed.iter().any(|o| o.op == **k)).copied().unwrap_or_default();
        return Err(FormatError::OpSummary { detail: format!("'{missing}' is used by the graph but not listed") });
    }
    Ok(())
}

fn target_name(m: &EntryRef<'_>, t: RelocTarget) -> String {
    match t {
        RelocTarget::Descriptors => names::DESC.into(),
        RelocTarget::Stream(n) => match m.program.streams.get(n as usize) {
            Some(s) => format!("{}{}", names::CMD_PREFIX, s.name),
            None => format!("stream {n}"),
        },
    }
}

fn target_bytes<'a>(m: &EntryRef<'a>, t: RelocTarget) -> Option<&'a [u8]> {
    match t {
        RelocTarget::Descriptors => Some(&m.program.descriptors),
        RelocTarget::Stream(n) => m.program.streams.get(n as usize).map(|s| s.bytes.as_slice()),
    }
}

fn relocations(m: &EntryRef<'_>) -> Result<()> {
    let p = &m.program;
    limit(names::RELOC, "relocations count", p.relocations.len() as u64, MAX_RELOCS)?;
    let mut prev: Option<(RelocTarget, u64)> = None;
    for (i, r) in p.relocations.iter().enumerate() {
        let index = i as u64;
        let target = target_name(m, r.target);
        let Some(bytes) = target_bytes(m, r.target) else {
            return Err(FormatError::BadRelocation {
                index,
                problem: format!("target {target} does not exist (there are {} streams)", p.streams.len()),
            });
        };
        if !r.offset.is_multiple_of(crate::RELOC_ALIGN) {
            return Err(FormatError::RelocMisaligned { index, target, offset: r.offset, align: crate::RELOC_ALIGN });
        }
        let size = bytes.len() as u64;
        if r.offset.checked_add(8).is_none_or(|e| e > size) {
            return Err(FormatError::RelocOutOfBounds { index, target, offset: r.offset, size });
        }
        if let Some((pt, po)) = prev {
            if r.target < pt || (r.target == pt && r.offset < po + 8) {
                return Err(FormatError::RelocOrder { index, target, offset: r.offset });
            }
        }
        prev = Some((r.target, r.offset));
        let limit = match r.kind {
            RelocKind::Arena => m.meta.arena_size,
            RelocKind::Staging => m.meta.staging_size,
            RelocKind::Descriptors => p.descriptors.len() as u64,
            RelocKind::WeightsSource => m.weights.len() as u64,
            RelocKind::Stream(n) => match p.streams.get(n as usize) {
                Some(s) => s.bytes.len() as u64,
                None => {
                    return Err(FormatError::BadRelocation {
                        index,
                        problem: format!("refers to stream {n}, but there are {} streams", p.streams.len()),
                    })
                }
            },
        };
        if r.addend > limit {
            return Err(FormatError::RelocAddend {
                index,
                target,
                offset: r.offset,
                kind: r.kind.name(),
                addend: r.addend,
                limit,
            });
        }
        let o = r.offset as usize;
        let mut field = [0u8; 8];
        field.copy_from_slice(&bytes[o..o + 8]);
        let stored = u64::from_le_bytes(field);
        if stored != r.addend {
            return Err(FormatError::RelocStoredValue { index, target, offset: r.offset, stored, addend: r.addend });
        }
    }
    Ok(())
}

fn profile(m: &EntryRef<'_>) -> Result<()> {
    let Some(p) = &m.profile else { return Ok(()) };
    let nodes = m.graph.nodes.len() as u64;
    let mut prev: Option<u32> = None;
    for (i, e) in p.iter().enumerate() {
        let index = i as u64;
        if e.node as u64 >= nodes {
            return Err(FormatError::BadProfile {
                index,
                problem: format!("node {} does not exist (the graph has {nodes} nodes)", e.node),
            });
        }
        if prev.is_some_and(|pn| e.node <= pn) {
            return Err(FormatError::BadProfile {
                index,
                problem: format!(
                    "node {} is not after the previous entry's node (entries must be sorted, one per node)",
                    e.node
                ),
            });
        }
        prev = Some(e.node);
    }
    Ok(())
}

/// Apply every relocation of a (valid) model.
pub(crate) fn relocate(m: &EntryRef<'_>, bases: &RelocBases) -> Result<Relocated> {
    let p = &m.program;
    if bases.streams.len() != p.streams.len() {
        return Err(FormatError::Relocate {
            problem: format!("{} stream bases given for {} streams", bases.streams.len(), p.streams.len()),
        });
    }
    let mut descriptors = p.descriptors.clone();
    let mut streams: Vec<Vec<u8>> = p.streams.iter().map(|s| s.bytes.clone()).collect();
    for (i, r) in p.relocations.iter().enumerate() {
        let base = match r.kind {
            RelocKind::Arena => bases.arena,
            RelocKind::Staging => bases.staging,
            RelocKind::Descriptors => bases.descriptors,
            RelocKind::WeightsSource => bases.weights_source,
            RelocKind::Stream(n) => *bases.streams.get(n as usize).ok_or_else(|| FormatError::Relocate {
                problem: format!("relocation {i} refers to stream {n}, which does not exist"),
            })?,
        };
        let value = base.checked_add(r.addend).ok_or_else(|| FormatError::Relocate {
            problem: format!("relocation {i}: base {base:#x} + addend {:#x} overflows", r.addend),
        })?;
        let target = match r.target {
            RelocTarget::Descriptors => Some(&mut descriptors),
            RelocTarget::Stream(n) => streams.get_mut(n as usize),
        };
        let field = target
            .and_then(|t| t.get_mut(r.offset as usize..(r.offset as usize).checked_add(8)?))
            .ok_or_else(|| FormatError::Relocate { problem: format!("relocation {i} lies outside its target") })?;
        field.copy_from_slice(&value.to_le_bytes());
    }
    Ok(Relocated { descriptors, streams })
}
