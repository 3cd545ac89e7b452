//! Model → section bytes → ELF file. The byte layouts are specified in
//! docs/rbln-format.md; `decode.rs` is the exact inverse.

use std::borrow::Cow;

use crate::codec::Enc;
use crate::container::{self, SectionSpec};
use crate::error::Result;
use crate::model::*;
use crate::names;

/// Sentinel for "no command stream" in a node record.
pub(crate) const NO_STREAM: u32 = u32::MAX;

/// The encoded sections of one program, named with `prefix` (`.rbln.`
/// for the main program, `.rbln.entry.<name>.` for an entry point).
fn program_sections<'a>(e: &EntryRef<'a>, prefix: &str) -> Vec<(String, Cow<'a, [u8]>)> {
    let mut secs = vec![
        (format!("{prefix}meta"), Cow::Owned(encode_meta(e))),
        (format!("{prefix}graph"), Cow::Owned(encode_graph(e.graph))),
        (format!("{prefix}desc"), Cow::Borrowed(e.program.descriptors.as_slice())),
    ];
    for s in &e.program.streams {
        secs.push((format!("{prefix}cmd.{}", s.name), Cow::Borrowed(s.bytes.as_slice())));
    }
    secs.push((format!("{prefix}reloc"), Cow::Owned(encode_relocs(&e.program.relocations))));
    if let Some(p) = e.profile {
        secs.push((format!("{prefix}profile"), Cow::Owned(encode_profile(p))));
    }
    secs
}

pub(crate) fn model_to_bytes(m: &Model) -> Result<Vec<u8>> {
    let mut secs = program_sections(&m.main(), names::PREFIX);
    if m.main_entry.is_some() || !m.entries.is_empty() {
        let mut e = Enc::default();
        e.str(m.main_entry_name()).count(m.entries.len());
        for x in &m.entries {
            e.str(&x.meta.name);
        }
        secs.push((names::ENTRIES.to_string(), Cow::Owned(e.buf)));
        for x in m.entry_points().iter().skip(1) {
            secs.extend(program_sections(x, &format!("{}{}.", names::ENTRY_PREFIX, x.name)));
        }
    }
    let mut specs: Vec<SectionSpec> = secs.iter().map(|(name, data)| SectionSpec { name, align: 8, data }).collect();
    specs.push(SectionSpec { name: names::WEIGHTS, align: crate::WEIGHTS_FILE_ALIGN, data: &m.weights });
    container::write(&specs)
}

fn io(e: &mut Enc, b: &IoBinding) {
    e.str(&b.name).u32(b.tensor).u8(b.dtype as u8).u8(b.placement.code()).shape(&b.shape);
    e.u64(b.placement.offset()).u64(b.placement.size());
}

pub(crate) fn encode_meta(m: &EntryRef<'_>) -> Vec<u8> {
    let mt = &m.meta;
    let mut e = Enc::default();
    e.raw(&crate::META_MAGIC).u16(mt.version.major).u16(mt.version.minor);
    e.u32(mt.hw_version).u32(0);
    e.str(&mt.name).str(&mt.producer);
    e.u64(mt.arena_size).u64(mt.staging_size).u64(mt.weights_offset).u64(m.weights.len() as u64);
    e.count(m.program.streams.len());
    for s in &m.program.streams {
        e.u8(s.role as u8).str(&s.name);
    }
    e.count(mt.inputs.len());
    for b in &mt.inputs {
        io(&mut e, b);
    }
    e.count(mt.outputs.len());
    for b in &mt.outputs {
        io(&mut e, b);
    }
    e.count(mt.ops.len());
    for o in &mt.ops {
        e.str(&o.op).u32(o.count);
    }
    e.count(mt.properties.len());
    for p in &mt.properties {
        e.str(&p.key).str(&p.value);
    }
    // Minor 1: value ranges of inputs.
    let ranged: Vec<_> = mt.inputs.iter().enumerate().filter_map(|(i, b)| b.range.map(|r| (i, r))).collect();
    e.count(ranged.len());
    for (i, r) in ranged {
        e.u32(i as u32).u64(r.lo as u64).u64(r.hi as u64);
    }
    e.buf
}

pub(crate) fn encode_graph(g: &Graph) -> Vec<u8> {
    let mut e = Enc::default();
    e.count(g.tensors.len());
    for t in &g.tensors {
        e.str(&t.name).u8(t.dtype as u8).u8(t.placement.code()).shape(&t.shape);
        e.u64(t.placement.offset()).u64(t.placement.size());
    }
    e.count(g.nodes.len());
    for n in &g.nodes {
        e.str(&n.name).u8(n.kind as u8).str(&n.op);
        e.count(n.inputs.len());
        for &t in &n.inputs {
            e.u32(t);
        }
        e.count(n.outputs.len());
        for &t in &n.outputs {
            e.u32(t);
        }
        match n.commands {
            Some(c) => e.u32(c.stream).u64(c.offset).u64(c.len),
            None => e.u32(NO_STREAM).u64(0).u64(0),
        };
        match n.descriptors {
            Some(d) => e.u64(d.offset).u64(d.len),
            None => e.u64(0).u64(0),
        };
    }
    e.buf
}

pub(crate) fn encode_relocs(r: &[Relocation]) -> Vec<u8> {
    let mut e = Enc::default();
    e.count(r.len());
    for r in r {
        let (kind, index) = r.kind.code();
        e.u32(r.target.code()).u32(kind).u32(index).u32(0).u64(r.offset).u64(r.addend);
    }
    e.buf
}

pub(crate) fn encode_profile(p: &[NodeProfile]) -> Vec<u8> {
    let mut e = Enc::default();
    e.count(p.len());
    for p in p {
        e.u32(p.node).u32(0).u64(p.flops).u64(p.bytes);
    }
    e.buf
}
