//! ELF file → sections → Model, then full validation. The inverse of
//! `encode.rs`; every read is bounds-checked (see `codec.rs`).

use crate::codec::{field, Dec};
use crate::container::{self, Container};
use crate::encode::NO_STREAM;
use crate::error::{FormatError, Result};
use crate::limits::*;
use crate::model::*;
use crate::names;

/// Section names of one program: the main one (`.rbln.meta`, ...) or an
/// entry point's (`.rbln.entry.<name>.meta`, ...).
struct SectionNames {
    prefix: String,
}

impl SectionNames {
    fn main() -> Self {
        SectionNames { prefix: names::PREFIX.into() }
    }
    fn entry(name: &str) -> Self {
        SectionNames { prefix: format!("{}{name}.", names::ENTRY_PREFIX) }
    }
    fn of(&self, part: &str) -> String {
        format!("{}{part}", self.prefix)
    }
    fn cmd(&self, stream: &str) -> String {
        format!("{}cmd.{stream}", self.prefix)
    }
}

/// One decoded program, before validation.
struct Decoded {
    meta: Meta,
    graph: Graph,
    program: Program,
    profile: Option<Vec<NodeProfile>>,
    weights_size: u64,
    /// The sections it was read from.
    sections: Vec<String>,
}

/// The magic and version at the start of a meta section.
fn identify<'a>(sec: &'a str, data: &'a [u8]) -> Result<(Version, Dec<'a>)> {
    let mut d = Dec::new(sec, data);
    let magic: [u8; 8] = match d.bytes(field!("magic")) {
        Ok(m) => m,
        Err(_) => return Err(FormatError::NotRbln { found: data.iter().take(8).copied().collect() }),
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
    Ok((version, d))
}

fn decode_program(c: &Container<'_>, n: &SectionNames) -> Result<Decoded> {
    let meta_name = n.of("meta");
    let meta_data = section(c, &meta_name)?;
    // Identification and version first: they decide how to read the rest.
    let (version, mut d) = identify(&meta_name, meta_data)?;
    let (meta, streams, weights_size) = decode_meta(&mut d, version)?;

    // Unique names before copying anything: two table entries naming one
    // section must not make us copy it twice.
    for (i, (_, name)) in streams.iter().enumerate() {
        if streams[..i].iter().any(|(_, other)| other == name) {
            return Err(FormatError::DuplicateName { kind: "command stream", name: name.clone() });
        }
    }
    let mut sections = vec![meta_name.clone()];
    let mut cmd_sections = Vec::with_capacity(streams.len());
    for (role, name) in &streams {
        let sname = n.cmd(name);
        let data = c.get(&sname).map(|s| s.data).ok_or(FormatError::MissingSection { name: sname.clone() })?;
        if data.len() as u64 > MAX_STREAM_SIZE {
            return Err(FormatError::LimitExceeded { section: sname, field: "size".into(), found: data.len() as u64, limit: MAX_STREAM_SIZE });
        }
        cmd_sections.push(CommandStream { name: name.clone(), role: *role, bytes: data.to_vec() });
        sections.push(sname);
    }
    let graph_name = n.of("graph");
    let graph = decode_graph(&graph_name, section(c, &graph_name)?)?;
    let desc_name = n.of("desc");
    let descriptors = section(c, &desc_name)?;
    if descriptors.len() as u64 > MAX_DESC_SIZE {
        return Err(FormatError::LimitExceeded { section: desc_name, field: "size".into(), found: descriptors.len() as u64, limit: MAX_DESC_SIZE });
    }
    let reloc_name = n.of("reloc");
    let relocations = decode_relocs(&reloc_name, section(c, &reloc_name)?)?;
    let profile_name = n.of("profile");
    let profile = match c.get(&profile_name) {
        Some(s) => Some(decode_profile(&profile_name, s.data)?),
        None => None,
    };
    sections.extend([graph_name, desc_name, reloc_name, profile_name]);
    let program = Program { descriptors: descriptors.to_vec(), streams: cmd_sections, relocations };
    Ok(Decoded { meta, graph, program, profile, weights_size, sections })
}

/// `.rbln.entries`: the main program's entry name and the other entries'
/// names, in order.
fn decode_entry_table(data: &[u8]) -> Result<(String, Vec<String>)> {
    let mut d = Dec::new(names::ENTRIES, data);
    let main = d.str(MAX_STREAM_NAME_LEN, field!("main"))?;
    let n = d.count(4, MAX_ENTRIES, field!("entries"))?;
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        v.push(d.str(MAX_STREAM_NAME_LEN, field!("entries[{i}]"))?);
    }
    d.finish()?;
    Ok((main, v))
}

pub(crate) fn model_from_bytes(bytes: &[u8]) -> Result<Model> {
    let c = container::read(bytes)?;
    let main = decode_program(&c, &SectionNames::main())?;
    let version = main.meta.version;
    let weights = section(&c, names::WEIGHTS)?;
    let (main_entry, entry_names) = match c.get(names::ENTRIES) {
        Some(s) if version.minor >= 2 => {
            let (m, e) = decode_entry_table(s.data)?;
            (Some(m), e)
        }
        // Before minor 2 the section is unknown (reported below).
        _ => (None, Vec::new()),
    };
    for (i, name) in entry_names.iter().enumerate() {
        if !crate::validate::is_section_word(name, MAX_STREAM_NAME_LEN) {
            return Err(FormatError::BadEntries { problem: format!("entry name '{name}' is not 1 to {MAX_STREAM_NAME_LEN} characters from [A-Za-z0-9_.-]") });
        }
        if entry_names[..i].contains(name) || main_entry.as_deref() == Some(name) {
            return Err(FormatError::DuplicateName { kind: "entry point", name: name.clone() });
        }
    }
    let mut programs = vec![main];
    for name in &entry_names {
        let p = decode_program(&c, &SectionNames::entry(name)).map_err(|source| FormatError::InEntry { entry: name.clone(), source: Box::new(source) })?;
        programs.push(p);
    }
    for (p, name) in programs.iter().zip(std::iter::once(names::WEIGHTS).chain(entry_names.iter().map(|n| n.as_str()))) {
        if p.weights_size != weights.len() as u64 {
            return Err(FormatError::BadField {
                section: p.sections[0].clone(),
                field: "weights_size".into(),
                expected: format!("{} (the size of {})", weights.len(), names::WEIGHTS),
                found: format!("{}{}", p.weights_size, if name == names::WEIGHTS { String::new() } else { format!(" (entry '{name}')") }),
            });
        }
    }

    // The section set: nothing unknown (unless written by a newer minor
    // version). An unlisted command stream or entry is never valid.
    let newer = version.minor > crate::FORMAT_MINOR;
    for s in &c.sections {
        if !s.name.starts_with(names::PREFIX) || matches!(s.name, names::WEIGHTS | names::CHECK) {
            continue;
        }
        if (s.name == names::ENTRIES && version.minor >= 2) || programs.iter().any(|p| p.sections.iter().any(|n| n == s.name)) {
            continue;
        }
        let listed_entry = entry_names.iter().any(|e| s.name.strip_prefix(names::ENTRY_PREFIX).and_then(|r| r.strip_prefix(e.as_str())).is_some_and(|r| r.starts_with('.')));
        let stream_like = s.name.starts_with(names::CMD_PREFIX) || (s.name.starts_with(names::ENTRY_PREFIX) && (!listed_entry || s.name.contains(".cmd.")));
        if newer && !stream_like {
            continue;
        }
        return Err(FormatError::UnknownSection { name: s.name.into(), major: version.major, minor: version.minor });
    }

    let mut programs = programs.into_iter();
    let Some(main) = programs.next() else { unreachable!("the main program was pushed first") };
    let entries = programs.map(|p| Entry { meta: p.meta, graph: p.graph, program: p.program, profile: p.profile }).collect();
    let model = Model {
        meta: main.meta,
        graph: main.graph,
        program: main.program,
        weights: weights.to_vec(),
        profile: main.profile,
        main_entry,
        entries,
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

pub(crate) fn decode_graph(sec: &str, data: &[u8]) -> Result<Graph> {
    let mut d = Dec::new(sec, data);
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

pub(crate) fn decode_relocs(sec: &str, data: &[u8]) -> Result<Vec<Relocation>> {
    let mut d = Dec::new(sec, data);
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

pub(crate) fn decode_profile(sec: &str, data: &[u8]) -> Result<Vec<NodeProfile>> {
    let mut d = Dec::new(sec, data);
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
