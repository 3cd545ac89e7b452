//! Every way a `.rbln` file (or a model handed to the writer) can be wrong.

use std::path::PathBuf;

/// Why a file was rejected. Each variant names the section, field or
/// object concerned and, where there is one, the expected and found value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("file is {size} bytes, above the {limit}-byte limit")]
    FileTooLarge { size: u64, limit: u64 },

    // ---- ELF level -------------------------------------------------------
    #[error("file truncated: {what} needs bytes {offset}..{offset}+{len}, the file has {file_size} bytes")]
    Truncated { what: String, offset: u64, len: u64, file_size: u64 },

    #[error("not an ELF file: magic {found:02x?}, expected [7f, 45, 4c, 46]")]
    BadMagic { found: Vec<u8> },

    #[error("ELF header field {field}: expected {expected}, found {found}")]
    ElfHeader { field: &'static str, expected: String, found: String },

    #[error("section header {index} ({name}): {field}: expected {expected}, found {found}")]
    SectionHeader { index: u32, name: String, field: &'static str, expected: String, found: String },

    #[error("section {name}: bytes {offset}..{offset}+{size} lie outside the {file_size}-byte file")]
    SectionOutOfBounds { name: String, offset: u64, size: u64, file_size: u64 },

    #[error("{a} overlaps {b} in the file")]
    SectionOverlap { a: String, b: String },

    #[error("duplicate section {name} (section headers {first} and {second})")]
    DuplicateSection { name: String, first: u32, second: u32 },

    #[error("required section {name} is missing")]
    MissingSection { name: String },

    #[error("unknown section {name} (the file's format version {major}.{minor} does not define it)")]
    UnknownSection { name: String, major: u16, minor: u16 },

    // ---- identification and versions -----------------------------------
    #[error(".rbln.meta does not start with the magic \"RBLNMODL\" (found {found:02x?}): not an rbln model")]
    NotRbln { found: Vec<u8> },

    #[error("unsupported format version {major}.{minor}: this reader reads major version {supported}")]
    UnsupportedVersion { major: u16, minor: u16, supported: u16 },

    #[error("the model requires hardware version {required_major}.{required_minor}; this stack implements {supported_major}.{supported_minor}")]
    HwVersion { required_major: u16, required_minor: u16, supported_major: u16, supported_minor: u16 },

    // ---- checksums -------------------------------------------------------
    #[error("checksum mismatch in section {section}: stored crc32 {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch { section: String, stored: u32, computed: u32 },

    #[error("whole-file checksum mismatch: stored crc32 {stored:#010x}, computed {computed:#010x} (the damage is outside the checksummed sections: ELF header, section table, string table or padding)")]
    FileChecksumMismatch { stored: u32, computed: u32 },

    #[error("section {section} is not covered by .rbln.check")]
    UncheckedSection { section: String },

    // ---- structured-section decoding -----------------------------------
    #[error("{section}: {field} at offset {offset} needs {needed} bytes, only {available} remain")]
    SectionTruncated { section: String, field: String, offset: u64, needed: u64, available: u64 },

    #[error("{section}: {field} claims {count} entries needing at least {needed} bytes, only {available} remain")]
    CountExceedsData { section: String, field: String, count: u64, needed: u64, available: u64 },

    #[error("{section}: {field} is {found}, above the limit of {limit}")]
    LimitExceeded { section: String, field: String, found: u64, limit: u64 },

    #[error("{section}: {count} unexpected trailing bytes at offset {offset}")]
    TrailingBytes { section: String, offset: u64, count: u64 },

    #[error("{section}: {field} is not valid UTF-8")]
    InvalidUtf8 { section: String, field: String },

    #[error("{section}: {field}: unknown value {value}")]
    UnknownValue { section: String, field: String, value: u64 },

    #[error("{section}: {field}: expected {expected}, found {found}")]
    BadField { section: String, field: String, expected: String, found: String },

    // ---- memory plan -----------------------------------------------------
    #[error("tensor {tensor} ('{name}'): bytes {offset}..{offset}+{size} lie outside the {region} ({limit} bytes)")]
    TensorOutOfBounds { tensor: u32, name: String, region: String, offset: u64, size: u64, limit: u64 },

    #[error("tensor {tensor} ('{name}'): size is {found} bytes, its dtype and shape make {expected}")]
    TensorSize { tensor: u32, name: String, expected: String, found: u64 },

    #[error("tensor {tensor} ('{name}'): offset {offset} is not a multiple of {align}")]
    TensorMisaligned { tensor: u32, name: String, offset: u64, align: u64 },

    #[error("tensors {a} ('{a_name}') and {b} ('{b_name}') overlap in the {region} while both are live")]
    TensorOverlap { a: u32, a_name: String, b: u32, b_name: String, region: &'static str },

    #[error("duplicate {kind} name '{name}'")]
    DuplicateName { kind: &'static str, name: String },

    #[error("weights (arena bytes {offset}..{offset}+{size}) do not fit the {arena_size}-byte arena")]
    WeightsOutOfArena { offset: u64, size: u64, arena_size: u64 },

    // ---- graph -----------------------------------------------------------
    #[error("node {node} ('{name}'): {role} {slot} is tensor {tensor}, but the graph has {count} tensors")]
    UnknownTensor { node: u32, name: String, role: &'static str, slot: u32, tensor: u32, count: u32 },

    #[error("graph not in topological order: node {node} ('{name}') reads tensor {tensor} ('{tensor_name}'), produced by later node {producer}")]
    NotTopological { node: u32, name: String, tensor: u32, tensor_name: String, producer: u32 },

    #[error("tensor {tensor} ('{name}') is produced by node {first} and again by node {second}")]
    MultipleProducers { tensor: u32, name: String, first: u32, second: u32 },

    #[error("node {node} ('{name}') reads tensor {tensor} ('{tensor_name}'), which no earlier node produces and which is neither a model input nor a weight")]
    UninitializedRead { node: u32, name: String, tensor: u32, tensor_name: String },

    #[error("node {node} ('{name}', {kind}): {problem}")]
    BadNode { node: u32, name: String, kind: &'static str, problem: String },

    #[error("node {node} ('{name}', {kind}): {role} tensor {tensor} ('{tensor_name}') is in the {found}, expected {expected}")]
    BadPlacement {
        node: u32,
        name: String,
        kind: &'static str,
        role: &'static str,
        tensor: u32,
        tensor_name: String,
        expected: &'static str,
        found: &'static str,
    },

    #[error("node {node} ('{name}'): {what} range {offset}+{len} {problem}")]
    NodeRange { node: u32, name: String, what: String, offset: u64, len: u64, problem: String },

    #[error("node {node} ('{name}'): bad descriptor at .rbln.desc offset {offset}: {problem}")]
    BadDescriptor { node: u32, name: String, offset: u64, problem: String },

    #[error("{io} {index} ('{name}'): {field} is {found} in .rbln.meta but {expected} in the tensor table (tensor {tensor})")]
    IoMismatch {
        io: &'static str,
        index: u32,
        name: String,
        tensor: u32,
        field: &'static str,
        expected: String,
        found: String,
    },

    #[error("{io} {index} ('{name}'): {problem}")]
    BadIo { io: &'static str, index: u32, name: String, problem: String },

    #[error("op summary in .rbln.meta does not match the graph: {detail}")]
    OpSummary { detail: String },

    // ---- program ---------------------------------------------------------
    #[error("command stream {stream} ('{name}'): {problem}")]
    BadStream { stream: u32, name: String, problem: String },

    #[error("command stream '{stream}': bad packet at offset {offset}: {problem}")]
    BadPacket { stream: String, offset: u64, problem: String },

    #[error("relocation {index} ({target} offset {offset}): the 8-byte field lies outside the {size}-byte section")]
    RelocOutOfBounds { index: u64, target: String, offset: u64, size: u64 },

    #[error("relocation {index} ({target} offset {offset}): offset is not a multiple of {align}")]
    RelocMisaligned { index: u64, target: String, offset: u64, align: u64 },

    #[error("relocation {index} ({target} offset {offset}): not after the previous relocation (entries must be sorted by target then offset, fields must not overlap)")]
    RelocOrder { index: u64, target: String, offset: u64 },

    #[error("relocation {index} ({target} offset {offset}): {kind} addend {addend} exceeds the {limit}-byte region")]
    RelocAddend { index: u64, target: String, offset: u64, kind: &'static str, addend: u64, limit: u64 },

    #[error(
        "relocation {index} ({target} offset {offset}): the field holds {stored:#x}, expected the addend {addend:#x}"
    )]
    RelocStoredValue { index: u64, target: String, offset: u64, stored: u64, addend: u64 },

    #[error("relocation {index}: {problem}")]
    BadRelocation { index: u64, problem: String },

    #[error("relocating: {problem}")]
    Relocate { problem: String },

    // ---- profile ---------------------------------------------------------
    #[error(".rbln.profile entry {index}: {problem}")]
    BadProfile { index: u64, problem: String },

    // ---- entry points ----------------------------------------------------
    #[error(".rbln.entries: {problem}")]
    BadEntries { problem: String },

    #[error("entry point '{entry}': {source}")]
    InEntry {
        entry: String,
        #[source]
        source: Box<FormatError>,
    },

    // ---- writer ----------------------------------------------------------
    #[error("model builder: {0}")]
    Builder(String),
}

pub(crate) type Result<T, E = FormatError> = std::result::Result<T, E>;
