//! ELF file → sections → Model, then full validation. The inverse of
//! `encode.rs`; every read is bounds-checked (see `codec.rs`).

use crate::codec::{field, Dec};
use crate::container::{self, Container};
use crate::encode::NO_STREAM;
use crate::error::{FormatError, Result};
use crate::limits::*;
use crate::model::*;
use crate::names;

pub(crate) fn model_from_bytes(bytes: &[u8]) -> Result<Model> {
    let c = container::read(bytes)?;
    let meta_data = section(&c, names::META)?;

    // Identification and version first: they decide how to read the rest.
    let mut d = Dec::new(names::META, meta_data);
    let magic: [u8; 8] = match d.bytes(field!("magic")) {
        Ok(m) => m,
        Err(_) => return Err(FormatError::NotRbln { found: meta_data.iter().take(8).copied().collect() }),
    };
    if magic != crate::META_MAGIC {
        return Err(FormatError::NotRbln { found: magic.to_vec() });
    }
    let version = Version { major: d.u16(field!("format major"))?, minor: d.u16(field!("format minor"))? };
    if version.major != crate::FORMAT_MAJOR {
        return Err(FormatError::UnsupportedVersion {
            major: version.major,
            minor: version.minor,
            supported: crate::FORMAT_MAJOR,
        });
    }

    let (meta, streams, weights_size) = decode_meta(&mut d, version)?;

    // The section set: required sections, one per stream, nothing unknown
    // (unless written by a newer minor version).
    // Unique names before copying anything: two table entries naming one
    // section must not make us copy it twice.
    for (i, (_, name)) in streams.iter().enumerate() {
        if streams[..i].iter().any(|(_, n)| n == name) {
            return Err(FormatError::DuplicateName { kind: "command stream", name: name.clone() });
        }
    }
    let mut cmd_sections = Vec::with_capacity(streams.len());
    for (role, name) in &streams {
        let sname = format!("{}{}", names::CMD_PREFIX, name);
        let data = c.get(&sname).map(|s| s.data).ok_or(FormatError::MissingSection { name: sname.clone() })?;
        if data.len() as u64 > MAX_STREAM_SIZE {
            return Err(FormatError::LimitExceeded {
                section: sname,
                field: "size".into(),
                found: data.len() as u64,
                limit: MAX_STREAM_SIZE,
            });
        }
        cmd_sections.push(CommandStream { name: name.clone(), role: *role, bytes: data.to_vec() });
    }
    for s in &c.sections {
        let known = matches!(
            s.name,
            names::META | names::GRAPH | names::DESC | names::RELOC | names::WEIGHTS | names::PROFILE | names::CHECK
        );
        let is_cmd = s.name.strip_prefix(names::CMD_PREFIX).is_some_and(|n| streams.iter().any(|(_, sn)| sn == n));
        if !s.name.starts_with(names::PREFIX) || known || is_cmd {
            continue;
        }
        // A newer minor version may add sections; an unlisted command
        // stream is never valid.
        if version.minor > crate::FORMAT_MINOR && !s.name.starts_with(names::CMD_PREFIX) {
            continue;
        }
        return Err(FormatError::UnknownSection { name: s.name.into(), major: version.major, minor: version.minor });
    }

    let graph = decode_graph(section(&c, names::GRAPH)?)?;
    let descriptors = section(&c, names::DESC)?;
    if descriptors.len() as u64 > MAX_DESC_SIZE {
        return Err(FormatError::LimitExceeded {
            section: names::DESC.into(),
            field: "size".into(),
            found: descriptors.len() as u64,
            limit: MAX_DESC_SIZE,
        });
    }
    let relocations = decode_relocs(section(&c, names::RELOC)?)?;
    let weights = section(&c, names::WEIGHTS)?;
    if weights.len() as u64 != weights_size {
        return Err(FormatError::BadField {
            section: names::META.into(),
            field: "weights_size".into(),
            expected: format!("{} (the size of {})", weights.len(), names::WEIGHTS),
            found: weights_size.to_string(),
        });
    }
    let profile = match c.get(names::PROFILE) {
        Some(s) => Some(decode_profile(s.data)?),
        None => None,
    };

    let model = Model {
        meta,
        graph,
        program: Program { descriptors: descriptors.to_vec(), streams: cmd_sections, relocations },
        weights: weights.to_vec(),
        profile,
    };
    model.validate()?;
    Ok(model)
}

fn section<'a>(c: &Container<'a>, name: &str) -> Result<&'a [u8]> {
    c.get(name).map(|s| s.data).ok_or_else(|| FormatError::MissingSection { name: name.into() })
}

fn placement(d: &Dec, code: u8, offset: u64, size: u64, f: crate::codec::Field) -> Result<Placement> {
    Placement::from_code(code, offset, size).ok_or_else(|| d.unknown(f, code as u64))
}

fn dtype(d: &Dec, v: u8, f: crate::codec::Field) -> Result<DType> {
    DType::from_u8(v).ok_or_else(|| d.unknown(f, v as u64))
}

// Smallest encodings of list elements, used to bound claimed counts.
const MIN_STREAM: u64 = 1 + 4;
const MIN_IO: u64 = 4 + 4 + 1 + 1 + 4 + 8 + 8;
const MIN_OP: u64 = 4 + 4;
const MIN_PROPERTY: u64 = 4 + 4;
const MIN_TENSOR: u64 = 4 + 1 + 1 + 4 + 8 + 8;
const MIN_NODE: u64 = 4 + 1 + 4 + 4 + 4 + 4 + 8 * 4;
pub(crate) const RELOC_SIZE: u64 = 32;
pub(crate) const PROFILE_SIZE: u64 = 24;

fn decode_io(d: &mut Dec, what: &str, i: usize) -> Result<IoBinding> {
    let name = d.str(MAX_NAME_LEN, field!("{what}[{i}].name"))?;
    let tensor = d.u32(field!("{what}[{i}].tensor"))?;
    let dt = d.u8(field!("{what}[{i}].dtype"))?;
    let dt = dtype(d, dt, field!("{what}[{i}].dtype"))?;
    let pl = d.u8(field!("{what}[{i}].placement"))?;
    let shape = d.shape(field!("{what}[{i}].shape"))?;
    let offset = d.u64(field!("{what}[{i}].offset"))?;
    let size = d.u64(field!("{what}[{i}].size"))?;
    let placement = placement(d, pl, offset, size, field!("{what}[{i}].placement"))?;
    Ok(IoBinding { name, tensor, dtype: dt, shape, placement, range: None })
}

type Streams = Vec<(StreamRole, String)>;

fn decode_meta(d: &mut Dec, version: Version) -> Result<(Meta, Streams, u64)> {
    let hw_version = d.u32(field!("hw_version"))?;
    d.reserved(4, field!("flags"))?;
    let name = d.str(MAX_NAME_LEN, field!("name"))?;
    let producer = d.str(MAX_NAME_LEN, field!("producer"))?;
    let arena_size = d.u64_max(MAX_ARENA_SIZE, field!("arena_size"))?;
    let staging_size = d.u64_max(MAX_STAGING_SIZE, field!("staging_size"))?;
    let weights_offset = d.u64(field!("weights_offset"))?;
    let weights_size = d.u64(field!("weights_size"))?;

    let n = d.count(MIN_STREAM, MAX_STREAMS, field!("streams"))?;
    let mut streams = Vec::with_capacity(n);
    for i in 0..n {
        let r = d.u8(field!("streams[{i}].role"))?;
        let role = StreamRole::from_u8(r).ok_or_else(|| d.unknown(field!("streams[{i}].role"), r as u64))?;
        let name = d.str(MAX_STREAM_NAME_LEN, field!("streams[{i}].name"))?;
        streams.push((role, name));
    }
    let n = d.count(MIN_IO, MAX_IO, field!("inputs"))?;
    let mut inputs = Vec::with_capacity(n);
    for i in 0..n {
        inputs.push(decode_io(d, "inputs", i)?);
    }
    let n = d.count(MIN_IO, MAX_IO, field!("outputs"))?;
    let mut outputs = Vec::with_capacity(n);
    for i in 0..n {
        outputs.push(decode_io(d, "outputs", i)?);
    }
    let n = d.count(MIN_OP, MAX_NODES, field!("ops"))?;
    let mut ops = Vec::with_capacity(n);
    for i in 0..n {
        let op = d.str(MAX_NAME_LEN, field!("ops[{i}].op"))?;
        let count = d.u32(field!("ops[{i}].count"))?;
        ops.push(OpCount { op, count });
    }
    let n = d.count(MIN_PROPERTY, MAX_PROPERTIES, field!("properties"))?;
    let mut properties = Vec::with_capacity(n);
    for i in 0..n {
        let key = d.str(MAX_NAME_LEN, field!("properties[{i}].key"))?;
        let value = d.str(MAX_VALUE_LEN, field!("properties[{i}].value"))?;
        properties.push(Property { key, value });
    }
    if version.minor >= 1 {
        let n = d.count(0, MAX_IO, field!("input_ranges"))?;
        for k in 0..n {
            let i = d.u32(field!("input_ranges[{k}].input"))?;
            let lo = d.u64(field!("input_ranges[{k}].lo"))? as i64;
            let hi = d.u64(field!("input_ranges[{k}].hi"))? as i64;
            let b = inputs.get_mut(i as usize).ok_or_else(|| d.unknown(field!("input_ranges[{k}].input"), i as u64))?;
            if b.range.is_some() {
                return Err(d.unknown(field!("input_ranges[{k}].input (listed twice)"), i as u64));
            }
            b.range = Some(ValueRange { lo, hi });
        }
    }
    // A newer minor version may append fields this reader does not know.
    if version.minor <= crate::FORMAT_MINOR {
        d.finish()?;
    }
    let meta = Meta {
        version,
        name,
        producer,
        hw_version,
        arena_size,
        staging_size,
        weights_offset,
        inputs,
        outputs,
        ops,
        properties,
    };
    Ok((meta, streams, weights_size))
}

fn decode_ids(d: &mut Dec, what: &str, i: usize) -> Result<Vec<u32>> {
    let n = d.count(4, MAX_NODE_ARITY, field!("nodes[{i}].{what}"))?;
    let mut v = Vec::with_capacity(n);
    for k in 0..n {
        v.push(d.u32(field!("nodes[{i}].{what}[{k}]"))?);
    }
    Ok(v)
}

pub(crate) fn decode_graph(data: &[u8]) -> Result<Graph> {
    let mut d = Dec::new(names::GRAPH, data);
    let n = d.count(MIN_TENSOR, MAX_TENSORS, field!("tensors"))?;
    let mut tensors = Vec::with_capacity(n);
    for i in 0..n {
        let name = d.str(MAX_NAME_LEN, field!("tensors[{i}].name"))?;
        let dt = d.u8(field!("tensors[{i}].dtype"))?;
        let dt = dtype(&d, dt, field!("tensors[{i}].dtype"))?;
        let pl = d.u8(field!("tensors[{i}].placement"))?;
        let shape = d.shape(field!("tensors[{i}].shape"))?;
        let offset = d.u64(field!("tensors[{i}].offset"))?;
        let size = d.u64(field!("tensors[{i}].size"))?;
        let placement = placement(&d, pl, offset, size, field!("tensors[{i}].placement"))?;
        tensors.push(Tensor { name, dtype: dt, shape, placement });
    }
    let n = d.count(MIN_NODE, MAX_NODES, field!("nodes"))?;
    let mut nodes = Vec::with_capacity(n);
    for i in 0..n {
        let name = d.str(MAX_NAME_LEN, field!("nodes[{i}].name"))?;
        let k = d.u8(field!("nodes[{i}].kind"))?;
        let kind = NodeKind::from_u8(k).ok_or_else(|| d.unknown(field!("nodes[{i}].kind"), k as u64))?;
        let op = d.str(MAX_NAME_LEN, field!("nodes[{i}].op"))?;
        let inputs = decode_ids(&mut d, "inputs", i)?;
        let outputs = decode_ids(&mut d, "outputs", i)?;
        let stream = d.u32(field!("nodes[{i}].stream"))?;
        let cmd_offset = d.u64(field!("nodes[{i}].cmd_offset"))?;
        let cmd_len = d.u64(field!("nodes[{i}].cmd_len"))?;
        let desc_offset = d.u64(field!("nodes[{i}].desc_offset"))?;
        let desc_len = d.u64(field!("nodes[{i}].desc_len"))?;
        let commands = if stream == NO_STREAM {
            if cmd_offset != 0 || cmd_len != 0 {
                return Err(d.bad(
                    field!("nodes[{i}].cmd_offset/cmd_len"),
                    "0/0 (the node has no command stream)",
                    format!("{cmd_offset}/{cmd_len}"),
                ));
            }
            None
        } else {
            Some(CmdRange { stream, offset: cmd_offset, len: cmd_len })
        };
        let descriptors = if desc_len == 0 {
            if desc_offset != 0 {
                return Err(d.bad(field!("nodes[{i}].desc_offset"), "0 (desc_len is 0)", desc_offset));
            }
            None
        } else {
            Some(DescRange { offset: desc_offset, len: desc_len })
        };
        nodes.push(Node { name, kind, op, inputs, outputs, commands, descriptors });
    }
    d.finish()?;
    Ok(Graph { tensors, nodes })
}

pub(crate) fn decode_relocs(data: &[u8]) -> Result<Vec<Relocation>> {
    let mut d = Dec::new(names::RELOC, data);
    let n = d.count(RELOC_SIZE, MAX_RELOCS, field!("relocations"))?;
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let target = d.u32(field!("relocations[{i}].target"))?;
        let kind = d.u32(field!("relocations[{i}].kind"))?;
        let index = d.u32(field!("relocations[{i}].index"))?;
        d.reserved(4, field!("relocations[{i}].reserved"))?;
        let offset = d.u64(field!("relocations[{i}].offset"))?;
        let addend = d.u64(field!("relocations[{i}].addend"))?;
        let k =
            RelocKind::from_code(kind, index).ok_or_else(|| d.unknown(field!("relocations[{i}].kind"), kind as u64))?;
        if !matches!(k, RelocKind::Stream(_)) && index != 0 {
            return Err(d.bad(field!("relocations[{i}].index"), "0 (only stream relocations use it)", index));
        }
        v.push(Relocation { target: RelocTarget::from_code(target), offset, kind: k, addend });
    }
    d.finish()?;
    Ok(v)
}

pub(crate) fn decode_profile(data: &[u8]) -> Result<Vec<NodeProfile>> {
    let mut d = Dec::new(names::PROFILE, data);
    let n = d.count(PROFILE_SIZE, MAX_NODES, field!("entries"))?;
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let node = d.u32(field!("entries[{i}].node"))?;
        d.reserved(4, field!("entries[{i}].reserved"))?;
        let flops = d.u64(field!("entries[{i}].flops"))?;
        let bytes = d.u64(field!("entries[{i}].bytes"))?;
        v.push(NodeProfile { node, flops, bytes });
    }
    d.finish()?;
    Ok(v)
}
