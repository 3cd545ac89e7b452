//! The `.rbln` compiled-model container: its writer ([`ModelBuilder`],
//! [`Model::to_bytes`]) and a hardened reader ([`Model::from_bytes`],
//! [`Model::open`]).
//!
//! A `.rbln` file is a little-endian ELF64 relocatable object (`ET_REL`,
//! `EM_NONE`, so `readelf -S model.rbln` lists its sections) holding:
//!
//! | section | contents |
//! |---|---|
//! | `.rbln.meta` | magic, format version, required hardware version, model name, producer, memory plan (arena / staging / weights), command-stream table, inputs and outputs, op summary, properties |
//! | `.rbln.graph` | tensors (dtype, shape, placement) and nodes in topological order, host↔device transfers included |
//! | `.rbln.desc` | compute descriptors (`rbln_hw::ops::*Desc`), pre-encoded |
//! | `.rbln.cmd.<name>` | one pre-encoded command stream (`rbln_hw::cmd` packets) per entry of the stream table |
//! | `.rbln.reloc` | relocations patching device VAs into `.rbln.desc` and the command streams |
//! | `.rbln.weights` | all weights, laid out exactly as they land in the device arena |
//! | `.rbln.profile` | optional per-node cost estimates |
//! | `.rbln.check` | CRC-32 of every section and of the whole file |
//!
//! `docs/rbln-format.md` is the byte-level specification; this crate is its
//! reference implementation. The reader checks everything the
//! specification requires and returns a [`FormatError`] naming the section,
//! field, expected and found value; it never panics and never allocates
//! more than a small multiple of the bytes actually present.
#![forbid(unsafe_code)]

mod builder;
mod codec;
pub mod container;
mod decode;
mod encode;
mod error;
mod model;
mod validate;

pub use builder::{ModelBuilder, NodeId, StreamId, TensorId, Va, WeightPool, DESC_ALIGN, WEIGHT_ALIGN};
pub use error::FormatError;
pub use model::*;

/// Format major version written by this crate; a reader rejects any other
/// major version.
pub const FORMAT_MAJOR: u16 = 1;
/// Format minor version written by this crate. Files with a higher minor
/// (same major) are read; sections this reader does not know are skipped.
pub const FORMAT_MINOR: u16 = 2;

/// Magic at the start of `.rbln.meta`.
pub const META_MAGIC: [u8; 8] = *b"RBLNMODL";
/// Magic at the start of `.rbln.check`.
pub const CHECK_MAGIC: [u8; 8] = *b"RBLNCHK\0";
/// Checksum algorithm id in `.rbln.check`: CRC-32/ISO-HDLC (zlib's crc32).
pub const CHECK_ALGO_CRC32: u32 = 1;

/// Section names.
pub mod names {
    pub const META: &str = ".rbln.meta";
    pub const GRAPH: &str = ".rbln.graph";
    pub const DESC: &str = ".rbln.desc";
    /// Prefix of command-stream sections: `.rbln.cmd.<stream name>`.
    pub const CMD_PREFIX: &str = ".rbln.cmd.";
    pub const RELOC: &str = ".rbln.reloc";
    pub const WEIGHTS: &str = ".rbln.weights";
    pub const PROFILE: &str = ".rbln.profile";
    /// The entry table (format minor 2).
    pub const ENTRIES: &str = ".rbln.entries";
    /// Prefix of an entry point's sections: `.rbln.entry.<entry name>.`
    /// then `meta`, `graph`, `desc`, `reloc`, `profile` or
    /// `cmd.<stream name>`.
    pub const ENTRY_PREFIX: &str = ".rbln.entry.";
    pub const CHECK: &str = ".rbln.check";
    pub const SHSTRTAB: &str = ".shstrtab";
    /// Every section of the format starts with this prefix.
    pub const PREFIX: &str = ".rbln.";
}

/// Sanity limits the reader enforces (documented in docs/rbln-format.md).
pub mod limits {
    /// Largest file [`crate::Model::open`] reads.
    pub const MAX_FILE_SIZE: u64 = 1 << 40;
    /// Section header table entries, including the null entry.
    pub const MAX_SECTIONS: u64 = 1024;
    /// Bytes in a name (model, producer, tensor, node, op, io, property key).
    pub const MAX_NAME_LEN: u64 = 4096;
    /// Bytes in a property value.
    pub const MAX_VALUE_LEN: u64 = 1 << 16;
    pub const MAX_PROPERTIES: u64 = 1024;
    pub const MAX_TENSORS: u64 = 1 << 20;
    pub const MAX_NODES: u64 = 1 << 20;
    /// Inputs (or outputs) of one node.
    pub const MAX_NODE_ARITY: u64 = 1024;
    /// Model inputs (or outputs).
    pub const MAX_IO: u64 = 1024;
    pub const MAX_RANK: u64 = 8;
    /// Command streams.
    pub const MAX_STREAMS: u64 = 64;
    /// Bytes in one command stream: what one ring entry may execute.
    pub const MAX_STREAM_SIZE: u64 = rbln_hw::ring::MAX_CMDBUF_SIZE as u64;
    /// Bytes in `.rbln.desc`.
    pub const MAX_DESC_SIZE: u64 = 1 << 30;
    pub const MAX_RELOCS: u64 = 1 << 24;
    /// Device arena and host staging buffer sizes (and so every tensor).
    pub const MAX_ARENA_SIZE: u64 = 1 << 40;
    pub const MAX_STAGING_SIZE: u64 = 1 << 40;
    /// Length of a stream name (the `<name>` of `.rbln.cmd.<name>`), and
    /// of an entry point's name.
    pub const MAX_STREAM_NAME_LEN: u64 = 64;
    /// Entry points besides the main program.
    pub const MAX_ENTRIES: u64 = 64;
}

/// Alignment of every tensor offset (the device addresses fp32 data with
/// 4-byte alignment).
pub const TENSOR_ALIGN: u64 = 4;
/// Alignment of relocation offsets and node command/descriptor ranges.
pub const RELOC_ALIGN: u64 = 4;
/// `.rbln.weights` section alignment in files this crate writes (so a
/// mapped file can hand the weights to the device page-aligned).
pub const WEIGHTS_FILE_ALIGN: u64 = 4096;
