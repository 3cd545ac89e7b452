//! Every rejection path of the reader, each with a crafted file and an
//! assertion on the error variant and message.

mod common;

use common::*;
use rbln_format::container::{self, SectionSpec};
use rbln_format::*;
use rbln_hw::ops::{GemmDesc, Unary};

fn read(bytes: &[u8]) -> Result<Model, FormatError> {
    Model::from_bytes(bytes)
}

// Offsets inside .rbln.meta of the MLP fixture (name "mlp2", producer
// "rbln-format tests").
const META_HW: usize = 12;
const META_FLAGS: usize = 16;
const META_ARENA: usize = 20 + 4 + 4 + 4 + 17;
const META_WEIGHTS_SIZE: usize = META_ARENA + 24;
const META_STREAMS: usize = META_WEIGHTS_SIZE + 8;

// ---- ELF level ---------------------------------------------------------------

#[test]
fn empty_and_tiny_files_are_truncated() {
    let e = assert_err_msg(read(&[]), &["truncated", "ELF magic"]);
    assert!(matches!(e, FormatError::Truncated { file_size: 0, .. }));
    let e = assert_err_msg(read(&mlp_bytes()[..10]), &["truncated", "ELF header", "0..0+64", "10 bytes"]);
    assert!(matches!(e, FormatError::Truncated { offset: 0, len: 64, file_size: 10, .. }));
}

#[test]
fn truncated_files_name_what_is_cut() {
    let bytes = mlp_bytes();
    // The section table is at the end: any cut loses it.
    for cut in [64, 100, bytes.len() / 2, bytes.len() - 1] {
        let e = read(&bytes[..cut]).unwrap_err();
        assert!(
            matches!(&e, FormatError::Truncated { what, .. } if what == "section header table"),
            "cut at {cut}: {e}"
        );
    }
    // Cutting a section's bytes while the table stays intact.
    let mut b = bytes.clone();
    let idx = section_index(&b, ".rbln.weights");
    let at = shdr_field(&b, idx, 32);
    put_u64(&mut b, at, 1 << 20);
    let e = assert_err_msg(read(&b), &[".rbln.weights", "outside"]);
    assert!(matches!(e, FormatError::SectionOutOfBounds { size: 0x100000, .. }));
}

#[test]
fn bad_magic() {
    let mut b = mlp_bytes();
    b[1] = b'X';
    let e = assert_err_msg(read(&b), &["not an ELF file"]);
    assert!(matches!(e, FormatError::BadMagic { .. }));
    let e = read(b"PK\x03\x04 this is a zip file, not a model").unwrap_err();
    assert!(matches!(e, FormatError::BadMagic { found } if found == b"PK\x03\x04"));
}

#[test]
fn wrong_class_endianness_type_machine() {
    let cases: [(usize, &[u8], &str); 7] = [
        (4, &[1], "EI_CLASS"),
        (5, &[2], "EI_DATA"),
        (6, &[0], "EI_VERSION"),
        (7, &[3], "EI_OSABI"),
        (16, &[2, 0], "e_type"),
        (18, &[62, 0], "e_machine"),
        (58, &[32, 0], "e_shentsize"),
    ];
    for (at, v, field) in cases {
        let mut b = mlp_bytes();
        b[at..at + v.len()].copy_from_slice(v);
        let e = read(&b).unwrap_err();
        assert!(matches!(&e, FormatError::ElfHeader { field: f, .. } if *f == field), "{field}: {e}");
        assert!(e.to_string().contains(field));
    }
    let mut b = mlp_bytes();
    b[56] = 1; // e_phnum
    assert_err_msg(read(&b), &["e_phnum", "no program headers"]);
    let mut b = mlp_bytes();
    b[48] = 1; // e_flags
    assert_err_msg(read(&b), &["e_flags"]);
}

#[test]
fn section_table_counts_and_indices() {
    let mut b = mlp_bytes();
    b[60..62].copy_from_slice(&0xffffu16.to_le_bytes());
    let e = assert_err_msg(read(&b), &["e_shnum", "65535", "1024"]);
    assert!(matches!(e, FormatError::LimitExceeded { found: 65535, limit: 1024, .. }));
    let mut b = mlp_bytes();
    b[60..62].copy_from_slice(&0u16.to_le_bytes());
    assert_err_msg(read(&b), &["e_shnum"]);
    let mut b = mlp_bytes();
    b[62..64].copy_from_slice(&200u16.to_le_bytes());
    assert_err_msg(read(&b), &["e_shstrndx", "200"]);
    let mut b = mlp_bytes();
    put_u64(&mut b, 40, u64::MAX - 10); // e_shoff: overflow
    let e = assert_err_msg(read(&b), &["section header table"]);
    assert!(matches!(e, FormatError::Truncated { .. }));
    // The string-table index pointing at a PROGBITS section.
    let mut b = mlp_bytes();
    b[62..64].copy_from_slice(&1u16.to_le_bytes());
    assert_err_msg(read(&b), &["sh_type", "SHT_STRTAB"]);
    // A non-zero null section header.
    let mut b = mlp_bytes();
    let at = shdr_field(&b, 0, 32);
    b[at] = 1;
    assert_err_msg(read(&b), &["section header 0", "null"]);
}

#[test]
fn bad_section_headers() {
    let idx_of = |b: &[u8]| section_index(b, ".rbln.graph");
    // Name offset outside the string table.
    let mut b = mlp_bytes();
    let at = shdr_field(&b, idx_of(&b), 0);
    put_u32(&mut b, at, 0x10000);
    assert_err_msg(read(&b), &["sh_name"]);
    // Wrong type for an .rbln section.
    let mut b = mlp_bytes();
    let at = shdr_field(&b, idx_of(&b), 4);
    put_u32(&mut b, at, 8); // SHT_NOBITS
    assert_err_msg(read(&b), &[".rbln.graph", "sh_type", "SHT_PROGBITS"]);
    // Flags.
    let mut b = mlp_bytes();
    let at = shdr_field(&b, idx_of(&b), 8);
    put_u64(&mut b, at, 0x800); // SHF_COMPRESSED
    assert_err_msg(read(&b), &[".rbln.graph", "sh_flags", "0x800"]);
    // Alignment not a power of two, and an offset not aligned.
    let mut b = mlp_bytes();
    let at = shdr_field(&b, idx_of(&b), 48);
    put_u64(&mut b, at, 24);
    assert_err_msg(read(&b), &["sh_addralign", "power of two"]);
    let mut b = mlp_bytes();
    let at = shdr_field(&b, idx_of(&b), 48);
    put_u64(&mut b, at, 1 << 20);
    assert_err_msg(read(&b), &["sh_offset", "multiple of sh_addralign"]);
    // Size overflowing u64.
    let mut b = mlp_bytes();
    let at = shdr_field(&b, idx_of(&b), 32);
    put_u64(&mut b, at, u64::MAX);
    let e = assert_err_msg(read(&b), &[".rbln.graph", "outside"]);
    assert!(matches!(e, FormatError::SectionOutOfBounds { .. }));
}

#[test]
fn overlapping_sections() {
    let mut b = mlp_bytes();
    let meta = section_index(&b, ".rbln.meta");
    let graph = section_index(&b, ".rbln.graph");
    let meta_off = u64::from_le_bytes(b[shdr_field(&b, meta, 24)..][..8].try_into().unwrap());
    let at = shdr_field(&b, graph, 24);
    put_u64(&mut b, at, meta_off + 8);
    let e = assert_err_msg(read(&b), &[".rbln.meta", ".rbln.graph", "overlaps"]);
    assert!(matches!(e, FormatError::SectionOverlap { .. }));
    // A section overlapping the ELF header.
    let mut b = mlp_bytes();
    let at = shdr_field(&b, graph, 24);
    put_u64(&mut b, at, 0);
    assert_err_msg(read(&b), &["the ELF header", "overlaps"]);
}

#[test]
fn duplicate_sections() {
    let bytes = mlp_bytes();
    let mut secs = sections(&bytes);
    let g = secs.iter().find(|s| s.0 == ".rbln.graph").unwrap().clone();
    secs.push(g);
    let specs: Vec<SectionSpec> = secs.iter().map(|(n, a, d)| SectionSpec { name: n, align: *a, data: d }).collect();
    let e = assert_err_msg(read(&container::write(&specs).unwrap()), &["duplicate section .rbln.graph"]);
    assert!(matches!(e, FormatError::DuplicateSection { first: 2, .. }));
}

#[test]
fn missing_sections() {
    let bytes = mlp_bytes();
    for name in [".rbln.meta", ".rbln.graph", ".rbln.desc", ".rbln.reloc", ".rbln.weights", ".rbln.cmd.run"] {
        let secs: Vec<_> = sections(&bytes).into_iter().filter(|s| s.0 != name).collect();
        let e = read(&rewrap(&secs)).unwrap_err();
        assert!(matches!(&e, FormatError::MissingSection { name: n } if n == name), "{name}: {e}");
        assert!(e.to_string().contains(&format!("required section {name} is missing")));
    }
    // No .rbln.check at all.
    let secs = sections(&bytes);
    let specs: Vec<SectionSpec> = secs.iter().map(|(n, a, d)| SectionSpec { name: n, align: *a, data: d }).collect();
    let (raw, _) = container::write_elf(&specs).unwrap();
    assert_err_msg(read(&raw), &["required section .rbln.check is missing"]);
    // The profile is optional.
    let secs: Vec<_> = sections(&bytes).into_iter().filter(|s| s.0 != ".rbln.profile").collect();
    assert!(read(&rewrap(&secs)).unwrap().profile.is_none());
}

// ---- checksums -----------------------------------------------------------------

#[test]
fn corrupted_section_names_the_section() {
    let bytes = mlp_bytes();
    let c = container::read(&bytes).unwrap();
    for name in
        [".rbln.meta", ".rbln.graph", ".rbln.desc", ".rbln.cmd.run", ".rbln.reloc", ".rbln.weights", ".rbln.profile"]
    {
        let s = c.get(name).unwrap();
        let mut b = bytes.clone();
        b[s.offset as usize + s.data.len() / 2] ^= 0x10;
        let e = read(&b).unwrap_err();
        assert!(matches!(&e, FormatError::ChecksumMismatch { section, .. } if section == name), "{name}: {e}");
        assert!(e.to_string().contains(&format!("checksum mismatch in section {name}")));
    }
    // The check table itself.
    let s = c.get(".rbln.check").unwrap();
    let mut b = bytes.clone();
    b[s.offset as usize + 20] ^= 1;
    assert_err_msg(read(&b), &["checksum mismatch in section .rbln.check"]);
}

#[test]
fn corruption_outside_sections_fails_the_file_checksum() {
    let bytes = mlp_bytes();
    // EI_PAD (bytes 9..16) is not otherwise checked.
    let mut b = bytes.clone();
    b[12] = 0x5a;
    let e = assert_err_msg(read(&b), &["whole-file checksum mismatch"]);
    assert!(matches!(e, FormatError::FileChecksumMismatch { .. }));
    // Padding between .rbln.profile and the page-aligned weights.
    let c = container::read(&bytes).unwrap();
    let p = c.get(".rbln.profile").unwrap();
    let w = c.get(".rbln.weights").unwrap();
    let gap = w.offset as usize - 1;
    assert!(gap >= p.offset as usize + p.data.len(), "no padding before the weights");
    let mut b = bytes.clone();
    b[gap] = 0xff;
    assert_err_msg(read(&b), &["whole-file checksum mismatch"]);
    // Appended garbage.
    let mut b = bytes.clone();
    b.extend_from_slice(b"trailing");
    assert_err_msg(read(&b), &["whole-file checksum mismatch"]);
}

#[test]
fn check_table_must_cover_every_rbln_section() {
    let secs = sections(&mlp_bytes());
    let all: Vec<&str> = secs.iter().map(|s| s.0.as_str()).collect();
    // The independent check writer reproduces a valid file.
    read(&with_check(&secs, &all)).unwrap();
    let some: Vec<&str> = all.iter().copied().filter(|n| *n != ".rbln.desc").collect();
    let e = assert_err_msg(read(&with_check(&secs, &some)), &[".rbln.desc", "not covered by .rbln.check"]);
    assert!(matches!(e, FormatError::UncheckedSection { .. }));
    // Listing a section twice, or one that does not exist.
    let mut twice = all.clone();
    twice.push(".rbln.desc");
    assert_err_msg(read(&with_check(&secs, &twice)), &["duplicate check entry name '.rbln.desc'"]);
}

#[test]
fn check_table_header() {
    let secs = sections(&mlp_bytes());
    let all: Vec<&str> = secs.iter().map(|s| s.0.as_str()).collect();
    let good = with_check(&secs, &all);
    let chk = container::read(&good).unwrap().get(".rbln.check").unwrap().offset as usize;
    // Unknown algorithm (self crc repaired).
    let mut b = good.clone();
    b[chk + 8] = 2;
    let n = container::read_elf(&b).unwrap().get(".rbln.check").unwrap().data.len();
    let fixed = crc(&b[chk..chk + n - 4]);
    b[chk + n - 4..chk + n].copy_from_slice(&fixed.to_le_bytes());
    let e = assert_err_msg(read(&b), &[".rbln.check", "algorithm", "unknown value 2"]);
    assert!(matches!(e, FormatError::UnknownValue { .. }));
}

// ---- identification, versions ----------------------------------------------------

#[test]
fn not_an_rbln_model() {
    let b = patch_section(&mlp_bytes(), ".rbln.meta", |m| m[..8].copy_from_slice(b"ONNXMODL"));
    let e = assert_err_msg(read(&b), &["not an rbln model"]);
    assert!(matches!(e, FormatError::NotRbln { .. }));
    let b = patch_section(&mlp_bytes(), ".rbln.meta", |m| m.truncate(3));
    assert!(matches!(read(&b), Err(FormatError::NotRbln { .. })));
}

#[test]
fn unknown_major_version() {
    let b = patch_section(&mlp_bytes(), ".rbln.meta", |m| m[8..10].copy_from_slice(&2u16.to_le_bytes()));
    let e = assert_err_msg(read(&b), &["unsupported format version 2.2", "major version 1"]);
    assert!(matches!(e, FormatError::UnsupportedVersion { major: 2, minor: 2, supported: 1 }));
    let b = patch_section(&mlp_bytes(), ".rbln.meta", |m| m[8..10].copy_from_slice(&0u16.to_le_bytes()));
    assert!(matches!(read(&b), Err(FormatError::UnsupportedVersion { major: 0, .. })));
}

#[test]
fn hardware_version() {
    let b = patch_section(&mlp_bytes(), ".rbln.meta", |m| put_u32(m, META_HW, 2 << 16));
    let implements = format!("implements {}.{}", rbln_hw::HW_VERSION_MAJOR, rbln_hw::HW_VERSION_MINOR);
    let e = assert_err_msg(read(&b), &["hardware version 2.0", &implements]);
    assert!(matches!(e, FormatError::HwVersion { required_major: 2, .. }));
    // A minor version above the one implemented.
    let next = rbln_hw::HW_VERSION_MINOR + 1;
    let b = patch_section(&mlp_bytes(), ".rbln.meta", |m| put_u32(m, META_HW, (1 << 16) | next));
    assert!(matches!(read(&b), Err(FormatError::HwVersion { required_minor, .. }) if required_minor as u32 == next));
}

// ---- structured-section decoding -------------------------------------------------

#[test]
fn truncated_and_overlong_sections() {
    for name in [".rbln.meta", ".rbln.graph", ".rbln.reloc", ".rbln.profile"] {
        let b = patch_section(&mlp_bytes(), name, |d| d.truncate(d.len() - 3));
        let e = read(&b).unwrap_err();
        assert!(
            matches!(&e, FormatError::SectionTruncated { section, .. } | FormatError::CountExceedsData { section, .. } if section == name),
            "{name}: {e}"
        );
        let b = patch_section(&mlp_bytes(), name, |d| d.extend_from_slice(&[0; 5]));
        let e = read(&b).unwrap_err();
        assert!(matches!(&e, FormatError::TrailingBytes { section, count: 5, .. } if section == name), "{name}: {e}");
    }
    let b = patch_section(&mlp_bytes(), ".rbln.graph", |d| d.truncate(30));
    let e = assert_err_msg(read(&b), &[".rbln.graph", "tensors claims 9 entries", "only 26 remain"]);
    assert!(matches!(e, FormatError::CountExceedsData { count: 9, .. }));
    let b = patch_section(&mlp_bytes(), ".rbln.graph", |d| d.truncate(240));
    assert_err_msg(read(&b), &[".rbln.graph", "tensors[5].offset at offset 234 needs 8 bytes, only 6 remain"]);
}

#[test]
fn claimed_counts_beyond_the_data_or_the_limits() {
    // 1000 tensors claimed, a few hundred bytes present.
    let b = patch_section(&mlp_bytes(), ".rbln.graph", |d| put_u32(d, 0, 1000));
    let e = assert_err_msg(read(&b), &[".rbln.graph", "tensors", "claims 1000 entries"]);
    assert!(matches!(e, FormatError::CountExceedsData { count: 1000, .. }));
    // Above the sane limit.
    let b = patch_section(&mlp_bytes(), ".rbln.graph", |d| put_u32(d, 0, u32::MAX));
    let e = assert_err_msg(read(&b), &["tensors count", "4294967295", "limit"]);
    assert!(matches!(e, FormatError::LimitExceeded { limit, .. } if limit == limits::MAX_TENSORS));
    // A 4 GB string.
    let b = patch_section(&mlp_bytes(), ".rbln.graph", |d| put_u32(d, 4, u32::MAX));
    assert_err_msg(read(&b), &["tensors[0].name length", "limit"]);
    // A string just within the limit but beyond the data.
    let b = patch_section(&mlp_bytes(), ".rbln.graph", |d| put_u32(d, 4, 4000));
    assert_err_msg(read(&b), &["tensors[0].name", "needs 4000 bytes"]);
    // Relocations.
    let b = patch_section(&mlp_bytes(), ".rbln.reloc", |d| put_u32(d, 0, 100_000));
    assert_err_msg(read(&b), &[".rbln.reloc", "claims 100000 entries", "needing at least 3200000 bytes"]);
    // Rank.
    let b = patch_section(&mlp_bytes(), ".rbln.graph", |d| put_u32(d, 12, 9));
    assert_err_msg(read(&b), &["tensors[0].shape rank count", "limit of 8"]);
    // Sizes in .rbln.meta.
    let b = patch_section(&mlp_bytes(), ".rbln.meta", |d| put_u64(d, META_ARENA, 1 << 50));
    assert_err_msg(read(&b), &["arena_size", "above the limit"]);
    let b = patch_section(&mlp_bytes(), ".rbln.meta", |d| put_u32(d, META_STREAMS, 65));
    assert_err_msg(read(&b), &["streams count", "limit of 64"]);
}

#[test]
fn invalid_utf8_and_unknown_enums() {
    let b = patch_section(&mlp_bytes(), ".rbln.graph", |d| d[8] = 0xff);
    let e = assert_err_msg(read(&b), &[".rbln.graph", "tensors[0].name", "UTF-8"]);
    assert!(matches!(e, FormatError::InvalidUtf8 { .. }));
    let b = patch_section(&mlp_bytes(), ".rbln.graph", |d| d[10] = 42); // dtype of "W1"
    let e = assert_err_msg(read(&b), &["tensors[0].dtype", "unknown value 42"]);
    assert!(matches!(e, FormatError::UnknownValue { value: 42, .. }));
    let b = patch_section(&mlp_bytes(), ".rbln.graph", |d| d[11] = 7); // placement
    assert_err_msg(read(&b), &["tensors[0].placement", "unknown value 7"]);
    let b = patch_section(&mlp_bytes(), ".rbln.meta", |d| d[META_STREAMS + 4] = 9); // role
    assert_err_msg(read(&b), &["streams[0].role", "unknown value 9"]);
    let b = patch_section(&mlp_bytes(), ".rbln.reloc", |d| put_u32(d, 4 + 4, 77)); // kind
    assert_err_msg(read(&b), &["relocations[0].kind", "unknown value 77"]);
    let b = patch_section(&mlp_bytes(), ".rbln.reloc", |d| put_u32(d, 4 + 8, 1)); // index
    assert_err_msg(read(&b), &["relocations[0].index", "only stream relocations"]);
    let b = patch_section(&mlp_bytes(), ".rbln.reloc", |d| put_u32(d, 4 + 12, 1)); // reserved
    assert_err_msg(read(&b), &["relocations[0].reserved", "reserved"]);
    let b = patch_section(&mlp_bytes(), ".rbln.meta", |d| put_u32(d, META_FLAGS, 1));
    assert_err_msg(read(&b), &[".rbln.meta", "flags", "reserved"]);
}

#[test]
fn node_records() {
    // A view of several inputs is a concatenation: x.dev (arena 4096+16)
    // is not where it would start (the output h, 4160).
    let b = mutate(|m| m.graph.nodes[1].kind = NodeKind::View);
    assert_err_msg(read(&b), &["node 1 ('fc1', view)", "input 'x.dev'", "must be non-empty and start at arena offset 4160"]);
    // Stream NONE with a non-zero range.
    let bytes = mlp_bytes();
    let b = patch_section(&bytes, ".rbln.graph", |d| {
        // The last node (y.download) ends with stream, 4 x u64.
        let n = d.len();
        put_u32(d, n - 36, u32::MAX);
    });
    assert_err_msg(read(&b), &["nodes[3].cmd_offset/cmd_len", "no command stream"]);
    let b = patch_section(&bytes, ".rbln.graph", |d| {
        let n = d.len();
        put_u64(d, n - 16, 8); // desc_offset with desc_len 0
    });
    assert_err_msg(read(&b), &["nodes[3].desc_offset", "desc_len is 0"]);
}

#[test]
fn weights_size_must_match_the_section() {
    let b = patch_section(&mlp_bytes(), ".rbln.meta", |d| put_u64(d, META_WEIGHTS_SIZE, 4));
    let e = assert_err_msg(read(&b), &[".rbln.meta", "weights_size", "found 4"]);
    assert!(matches!(e, FormatError::BadField { .. }));
}

#[test]
fn unknown_and_unlisted_sections() {
    let bytes = mlp_bytes();
    let mut secs = sections(&bytes);
    secs.push((".rbln.cmd.extra".into(), 8, vec![0; 4]));
    let e = assert_err_msg(read(&rewrap(&secs)), &["unknown section .rbln.cmd.extra"]);
    assert!(matches!(e, FormatError::UnknownSection { .. }));
    // Even in a newer-minor file, a command stream must be in the table.
    secs.iter_mut().find(|s| s.0 == ".rbln.meta").unwrap().2[10] = 1;
    assert_err_msg(read(&rewrap(&secs)), &["unknown section .rbln.cmd.extra"]);
}

// ---- memory plan -----------------------------------------------------------------

#[test]
fn tensors_outside_their_region() {
    let ids = mlp_builder().1;
    let b = mutate(|m| m.graph.tensors[ids.h as usize].placement = Placement::Arena { offset: 8192 - 16, size: 32 });
    let e = assert_err_msg(read(&b), &["tensor 7 ('h')", "outside the arena (8192 bytes)"]);
    assert!(matches!(e, FormatError::TensorOutOfBounds { .. }));
    let b =
        mutate(|m| m.graph.tensors[ids.h as usize].placement = Placement::Arena { offset: u64::MAX - 15, size: 32 });
    assert_err_msg(read(&b), &["tensor 7 ('h')", "outside the arena"]);
    let b = mutate(|m| m.graph.tensors[ids.h as usize].placement = Placement::Arena { offset: 64, size: 32 });
    assert_err_msg(read(&b), &["tensor 7 ('h')", "outside the weights region"]);
    let b = mutate(|m| m.graph.tensors[ids.w2 as usize].placement = Placement::Weight { offset: 4096, size: 96 });
    assert_err_msg(read(&b), &["tensor 2 ('W2')", "weights region (arena bytes 0..332)"]);
    let b = mutate(|m| {
        m.graph.tensors[ids.y_host as usize].placement = Placement::Staging { offset: 4092, size: 12 };
        m.meta.outputs[0].placement = Placement::Staging { offset: 4092, size: 12 };
    });
    assert_err_msg(read(&b), &["tensor 5 ('y')", "staging buffer (4096 bytes)"]);
}

#[test]
fn tensor_size_and_alignment() {
    let ids = mlp_builder().1;
    let b = mutate(|m| m.graph.tensors[ids.h as usize].shape = vec![1, 9]);
    let e = assert_err_msg(read(&b), &["tensor 7 ('h')", "size is 32 bytes", "make 36"]);
    assert!(matches!(e, FormatError::TensorSize { .. }));
    let b = mutate(|m| m.graph.tensors[ids.h as usize].shape = vec![u64::MAX, 4]);
    assert_err_msg(read(&b), &["more than 2^64 bytes"]);
    let b = mutate(|m| m.graph.tensors[ids.h as usize].placement = Placement::Arena { offset: 4096 + 66, size: 32 });
    let e = assert_err_msg(read(&b), &["tensor 7 ('h')", "offset 4162 is not a multiple of 4"]);
    assert!(matches!(e, FormatError::TensorMisaligned { .. }));
}

#[test]
fn live_tensors_must_not_overlap() {
    let ids = mlp_builder().1;
    // h overlaps x.dev, which gemm1 reads while writing h.
    let b = mutate(|m| m.graph.tensors[ids.h as usize].placement = Placement::Arena { offset: ACT + 8, size: 32 });
    let e = assert_err_msg(read(&b), &["tensors 6 ('x.dev') and 7 ('h') overlap in the arena"]);
    assert!(matches!(e, FormatError::TensorOverlap { a: 6, b: 7, region: "arena", .. }));
    // y.dev overlapping h (both live at gemm2).
    let b =
        mutate(|m| m.graph.tensors[ids.y as usize].placement = Placement::Arena { offset: ACT + 64 + 28, size: 12 });
    assert_err_msg(read(&b), &["('h')", "('y.dev')", "overlap"]);
    // Staging: input and output buffers are both live for the whole run.
    let b = mutate(|m| {
        let p = Placement::Staging { offset: 8, size: 12 };
        m.graph.tensors[ids.y_host as usize].placement = p;
        m.meta.outputs[0].placement = p;
    });
    assert_err_msg(read(&b), &["('x')", "('y')", "overlap in the staging buffer"]);
}

#[test]
fn duplicate_names() {
    let ids = mlp_builder().1;
    let b = mutate(|m| m.graph.tensors[ids.h as usize].name = "W1".into());
    let e = assert_err_msg(read(&b), &["duplicate tensor name 'W1'"]);
    assert!(matches!(e, FormatError::DuplicateName { kind: "tensor", .. }));
    let b = mutate(|m| m.meta.properties[1].key = "source".into());
    assert_err_msg(read(&b), &["duplicate property name 'source'"]);
    // Two streams with one name: the writer refuses, the file would hold
    // two sections of that name, and a table naming one section twice is
    // refused before anything is copied.
    let mut m = mlp_model();
    m.program.streams[3].name = "upload".into();
    assert!(matches!(m.validate(), Err(FormatError::DuplicateName { kind: "command stream", .. })));
    let e = read(&m.to_bytes_unchecked().unwrap()).unwrap_err();
    assert!(matches!(e, FormatError::DuplicateSection { .. }), "{e}");
    let b = patch_section(&mlp_bytes(), ".rbln.meta", |d| {
        let at = d.windows(6).rposition(|w| w == b"output").unwrap();
        d[at..at + 6].copy_from_slice(b"upload");
    });
    assert_err_msg(read(&b), &["duplicate command stream name 'upload'"]);
}

#[test]
fn weights_must_fit_the_arena() {
    let b = mutate(|m| m.meta.weights_offset = 8192 - 100);
    let e = assert_err_msg(read(&b), &["weights (arena bytes 8092..8092+332)", "8192-byte arena"]);
    assert!(matches!(e, FormatError::WeightsOutOfArena { .. }));
    let b = mutate(|m| m.meta.weights_offset = u64::MAX - 3);
    assert!(matches!(read(&b), Err(FormatError::WeightsOutOfArena { .. })));
}

// ---- graph -----------------------------------------------------------------------

#[test]
fn unknown_tensor_ids() {
    let b = mutate(|m| m.graph.nodes[1].inputs[1] = 42);
    let e = assert_err_msg(read(&b), &["node 1 ('fc1')", "input 1 is tensor 42", "9 tensors"]);
    assert!(matches!(e, FormatError::UnknownTensor { tensor: 42, role: "input", slot: 1, .. }));
    let b = mutate(|m| m.graph.nodes[2].outputs[0] = 9);
    assert_err_msg(read(&b), &["node 2 ('fc2')", "output 0 is tensor 9"]);
    let b = mutate(|m| m.meta.inputs[0].tensor = 1000);
    assert_err_msg(read(&b), &["input 0 ('x')", "tensor 1000 does not exist"]);
}

#[test]
fn graph_must_be_topologically_ordered() {
    let b = mutate(|m| m.graph.nodes.swap(1, 2));
    let e = assert_err_msg(read(&b), &["not in topological order", "node 1 ('fc2')", "tensor 7 ('h')", "later node 2"]);
    assert!(matches!(e, FormatError::NotTopological { node: 1, producer: 2, .. }));
    // A node reading its own output.
    let ids = mlp_builder().1;
    let b = mutate(|m| m.graph.nodes[1].inputs.push(ids.h));
    assert!(matches!(read(&b), Err(FormatError::NotTopological { node: 1, producer: 1, .. })));
}

#[test]
fn one_producer_per_tensor() {
    let ids = mlp_builder().1;
    let b = mutate(|m| m.graph.nodes[2].outputs[0] = ids.h);
    let e = assert_err_msg(read(&b), &["tensor 7 ('h') is produced by node 1 and again by node 2"]);
    assert!(matches!(e, FormatError::MultipleProducers { first: 1, second: 2, .. }));
}

#[test]
fn reads_of_unproduced_tensors() {
    let b = mutate(|m| {
        m.graph.nodes.remove(0);
        m.profile = None;
    });
    let e = assert_err_msg(read(&b), &["node 0 ('fc1') reads tensor 6 ('x.dev')", "no earlier node produces"]);
    assert!(matches!(e, FormatError::UninitializedRead { .. }));
}

#[test]
fn node_kinds_and_placements() {
    let ids = mlp_builder().1;
    // A compute node reading host memory.
    let b = mutate(|m| m.graph.nodes[1].inputs[0] = ids.x_host);
    let e = assert_err_msg(
        read(&b),
        &["node 1 ('fc1', compute)", "input tensor 4 ('x')", "staging buffer", "expected arena or weights region"],
    );
    assert!(matches!(e, FormatError::BadPlacement { .. }));
    // A transfer in the wrong direction.
    let b = mutate(|m| m.graph.nodes[0].kind = NodeKind::DeviceToHost);
    assert!(matches!(read(&b), Err(FormatError::BadPlacement { role: "input", expected: "arena", .. })));
    // Transfer sizes must agree.
    let b = mutate(|m| m.graph.nodes[3].inputs[0] = ids.h);
    assert_err_msg(read(&b), &["node 3 ('y.download', device-to-host)", "copies 32 bytes ('h') into 12 bytes ('y')"]);
    // Compute nodes need an op, transfers must not have one.
    let b = mutate(|m| {
        m.graph.nodes[1].op.clear();
        m.meta.ops[0].count = 1;
    });
    assert_err_msg(read(&b), &["compute node without an op name"]);
    let b = mutate(|m| m.graph.nodes[0].op = "Copy".into());
    assert_err_msg(read(&b), &["op must be empty for host-to-device nodes"]);
    // Commands are required (except for views), descriptors only for compute.
    let b = mutate(|m| m.graph.nodes[0].commands = None);
    assert_err_msg(read(&b), &["node 0 ('x.upload', host-to-device): no command range"]);
    let b = mutate(|m| m.graph.nodes[0].descriptors = Some(DescRange { offset: 0, len: 96 }));
    assert_err_msg(read(&b), &["only compute nodes have descriptors"]);
}

#[test]
fn view_nodes() {
    let ids = mlp_builder().1;
    let b = mutate(|m| {
        m.graph.nodes[3] = Node::view("v", ids.y, ids.y_host);
    });
    assert_err_msg(read(&b), &["node 3 ('v', view)", "must occupy the input's bytes or a part of them"]);
}

/// x [1,4] uploaded into arena ACT, h = relu(x W1 + b1) [1,8] written
/// right after it, `cat` [1,12] a view of both side by side (a
/// concatenation done in place), downloaded. With `z`, a second input
/// [1,2] at ACT+8, sharing bytes with x; with `zh` as well, a view of z
/// and h side by side joins z to the storage of x, h and cat.
fn concat_fixture(z: bool, zh: bool) -> (Model, Vec<u32>) {
    let mut b = ModelBuilder::new("cat");
    let w1 = b.add_weight_f32("W1", &[IN, HID], &[0.5; (IN * HID) as usize]);
    let b1 = b.add_weight_f32("b1", &[HID], &[0.25; HID as usize]);
    let x_host = b.staging_tensor("x", DType::F32, &[1, IN], 0);
    let c_host = b.staging_tensor("cat", DType::F32, &[1, IN + HID], 64);
    let x = b.arena_tensor("x.dev", DType::F32, &[1, IN], ACT);
    let h = b.arena_tensor("h", DType::F32, &[1, HID], ACT + 4 * IN);
    let c = b.arena_tensor("cat.dev", DType::F32, &[1, IN + HID], ACT);
    let upload = b.add_stream("upload", StreamRole::UploadWeights);
    let input = b.add_stream("input", StreamRole::InputTransfer);
    let run = b.add_stream("run", StreamRole::Run);
    let output = b.add_stream("output", StreamRole::OutputTransfer);
    let wlen = b.weights_len();
    b.dma_copy(upload, Va::Rel(RelocKind::WeightsSource, 0), Va::arena(0), wlen);
    let at = b.dma_copy(input, b.va_of(x_host), b.va_of(x), IN * 4);
    b.add_node(Node::host_to_device("x.upload", x_host, x).with_commands(input, at, 32));
    let mut ids = vec![x, h, c];
    if z {
        let z_host = b.staging_tensor("z", DType::F32, &[1, 2], 128);
        let zd = b.arena_tensor("z.dev", DType::F32, &[1, 2], ACT + 8);
        let zh = b.arena_tensor("zh", DType::F32, &[1, 2 + HID], ACT + 8);
        let at = b.dma_copy(input, b.va_of(z_host), b.va_of(zd), 8);
        b.add_node(Node::host_to_device("z.upload", z_host, zd).with_commands(input, at, 32));
        b.input("z", z_host);
        ids.push(zh);
        ids.push(zd);
    }
    let (d, size) = gemm(&mut b, 1, HID as u32, IN as u32, Unary::Relu, x, w1, b1, h);
    let at = b.compute(run, d, size);
    b.add_node(Node::compute("fc1", "Gemm", &[x, w1, b1], &[h]).with_commands(run, at, 16).with_descriptors(d, size as u64));
    b.add_node(Node::concat_view("cat", &[x, h], c));
    if z && zh {
        b.add_node(Node::concat_view("zh", &[ids[4], h], ids[3]));
    }
    let at = b.dma_copy(output, b.va_of(c), b.va_of(c_host), (IN + HID) * 4);
    b.add_node(Node::device_to_host("cat.download", c, c_host).with_commands(output, at, 32));
    b.input("x", x_host).output("cat", c_host);
    (b.build_model_unchecked(), ids)
}

/// x [1,4] uploaded into arena ACT, s = its elements 2..4 (a slice read
/// in place: a view at ACT+8), downloaded.
fn slice_fixture() -> (Model, u32) {
    let mut b = ModelBuilder::new("slice");
    let x_host = b.staging_tensor("x", DType::F32, &[1, IN], 0);
    let s_host = b.staging_tensor("s", DType::F32, &[1, 2], 64);
    let x = b.arena_tensor("x.dev", DType::F32, &[1, IN], ACT);
    let sd = b.arena_tensor("s.dev", DType::F32, &[1, 2], ACT + 8);
    let upload = b.add_stream("upload", StreamRole::UploadWeights);
    let input = b.add_stream("input", StreamRole::InputTransfer);
    let run = b.add_stream("run", StreamRole::Run);
    let output = b.add_stream("output", StreamRole::OutputTransfer);
    b.nop(upload);
    b.nop(run);
    let at = b.dma_copy(input, b.va_of(x_host), b.va_of(x), IN * 4);
    b.add_node(Node::host_to_device("x.upload", x_host, x).with_commands(input, at, 32));
    b.add_node(Node::view("s", x, sd));
    let at = b.dma_copy(output, b.va_of(sd), b.va_of(s_host), 8);
    b.add_node(Node::device_to_host("s.download", sd, s_host).with_commands(output, at, 32));
    b.input("x", x_host).output("s", s_host);
    (b.build_model_unchecked(), sd)
}

#[test]
fn slice_views() {
    let (m, _) = slice_fixture();
    read(&m.to_bytes_unchecked().unwrap()).expect("a view of a contiguous part of its input is valid");
    // Reaching past the input's end.
    let (mut m, s) = slice_fixture();
    m.graph.tensors[s as usize].placement = Placement::Arena { offset: ACT + 12, size: 8 };
    assert_err_msg(read(&m.to_bytes_unchecked().unwrap()), &["node 1 ('s', view)", "must occupy the input's bytes or a part of them"]);
}

#[test]
fn concatenation_views() {
    // In place: h lies right after x, the view spans both.
    let (m, ids) = concat_fixture(false, false);
    let m = read(&m.to_bytes_unchecked().unwrap()).expect("a concatenation view of x and h is valid");
    assert_eq!(m.graph.nodes[2].inputs, vec![ids[0], ids[1]]);
    // A gap between the inputs.
    let (mut m, ids) = concat_fixture(false, false);
    m.graph.tensors[ids[1] as usize].placement = Placement::Arena { offset: ACT + 32, size: 4 * HID };
    assert_err_msg(read(&m.to_bytes_unchecked().unwrap()), &["node 2 ('cat', view)", "input 'h'", "start at arena offset 4112"]);
    // The inputs covering less than the output.
    let (mut m, ids) = concat_fixture(false, false);
    m.graph.tensors[ids[2] as usize].shape = vec![1, IN + HID + 1];
    m.graph.tensors[ids[2] as usize].placement = Placement::Arena { offset: ACT, size: 4 * (IN + HID) + 4 };
    assert_err_msg(read(&m.to_bytes_unchecked().unwrap()), &["node 2 ('cat', view)", "the inputs cover 48 bytes"]);
    // A concatenation view of a weight.
    let (mut m, _) = concat_fixture(false, false);
    m.graph.nodes[2].inputs[0] = 0;
    assert_err_msg(read(&m.to_bytes_unchecked().unwrap()), &["node 2 ('cat', view)", "'W1') is in the weights region, expected arena"]);
    // Two written tensors of one storage sharing bytes: x (4096+16) and
    // z (4104+8), joined through h by the views cat and zh.
    let (m, _) = concat_fixture(true, true);
    let e = assert_err_msg(read(&m.to_bytes_unchecked().unwrap()), &["'x.dev'", "'z.dev'", "overlap in the storage of views"]);
    assert!(matches!(e, FormatError::TensorOverlap { .. }));
    // Without the view zh, z is a storage of its own over bytes of the
    // storage of x, h and cat (named by x) while both are live.
    let (m, _) = concat_fixture(true, false);
    assert_err_msg(read(&m.to_bytes_unchecked().unwrap()), &["'x.dev'", "'z.dev'", "overlap in the arena while both are live"]);
}

#[test]
fn node_command_and_descriptor_ranges() {
    let b = mutate(|m| m.graph.nodes[1].commands = Some(CmdRange { stream: 9, offset: 0, len: 16 }));
    let e = assert_err_msg(read(&b), &["node 1 ('fc1')", "names stream 9, but there are 4"]);
    assert!(matches!(e, FormatError::NodeRange { .. }));
    let b = mutate(|m| m.graph.nodes[1].commands = Some(CmdRange { stream: 2, offset: 16, len: 32 }));
    assert_err_msg(read(&b), &["command (stream 'run') range 16+32", "exceeds the 32-byte stream"]);
    let b = mutate(|m| m.graph.nodes[1].commands = Some(CmdRange { stream: 2, offset: 8, len: 8 }));
    assert_err_msg(read(&b), &["packet boundaries"]);
    let b = mutate(|m| m.graph.nodes[1].commands = Some(CmdRange { stream: 2, offset: 0, len: 0 }));
    assert_err_msg(read(&b), &["is empty"]);
    let b = mutate(|m| m.graph.nodes[1].descriptors = Some(DescRange { offset: 2, len: 104 }));
    assert_err_msg(read(&b), &["descriptor range 2+104", "not a multiple of 4"]);
    let b = mutate(|m| m.graph.nodes[1].descriptors = Some(DescRange { offset: 104, len: 208 }));
    assert_err_msg(read(&b), &["descriptor range 104+208", "exceeds the 208-byte .rbln.desc"]);
    let b = mutate(|m| m.graph.nodes[2].descriptors = Some(DescRange { offset: 0, len: 208 }));
    assert_err_msg(read(&b), &["node 2 ('fc2')", "descriptor range 0+208", "overlaps the descriptor range of node 1"]);
    let b = mutate(|m| m.graph.nodes[2].commands = Some(CmdRange { stream: 2, offset: 0, len: 32 }));
    assert_err_msg(
        read(&b),
        &["node 2 ('fc2')", "command (stream 'run') range 0+32", "overlaps the command range of node 1"],
    );
    // (An empty range cannot be written: on disk, length 0 means "none".)
    let mut m = mlp_model();
    m.graph.nodes[1].descriptors = Some(DescRange { offset: 0, len: 0 });
    let e = m.validate().unwrap_err();
    assert!(e.to_string().contains("descriptor range 0+0 is empty"), "{e}");
    let b = mutate(|m| {
        m.graph.nodes[2].descriptors = None;
        m.graph.nodes[1].descriptors = Some(DescRange { offset: 0, len: 108 });
    });
    assert_err_msg(read(&b), &["bad descriptor at .rbln.desc offset 104", "descriptor header needs 8"]);
}

#[test]
fn descriptors_must_decode() {
    // activation = 99 in the first GEMM.
    let at = std::mem::offset_of!(GemmDesc, activation);
    let b = mutate(|m| put_u32(&mut m.program.descriptors, at, 99));
    let e = assert_err_msg(read(&b), &["node 1 ('fc1')", "bad descriptor at .rbln.desc offset 0", "activation"]);
    assert!(matches!(e, FormatError::BadDescriptor { .. }));
    let b = mutate(|m| put_u32(&mut m.program.descriptors, 4, 12)); // header.size
    assert_err_msg(read(&b), &["bad descriptor at .rbln.desc offset 0", "BadSize"]);
}

#[test]
fn io_must_match_the_tensor_table() {
    let b = mutate(|m| m.meta.inputs[0].shape = vec![4]);
    let e = assert_err_msg(read(&b), &["input 0 ('x')", "shape is [4] in .rbln.meta but [1, 4] in the tensor table"]);
    assert!(matches!(e, FormatError::IoMismatch { field: "shape", .. }));
    let b = mutate(|m| m.meta.outputs[0].dtype = DType::F16);
    assert_err_msg(read(&b), &["output 0 ('y')", "dtype is f16", "f32"]);
    let b = mutate(|m| m.meta.outputs[0].placement = Placement::Staging { offset: 128, size: 12 });
    assert!(matches!(read(&b), Err(FormatError::IoMismatch { field: "placement", .. })));
    let ids = mlp_builder().1;
    let b = mutate(|m| {
        let t = &m.graph.tensors[ids.w1 as usize];
        m.meta.outputs[0] = IoBinding {
            name: "w".into(),
            tensor: ids.w1,
            dtype: t.dtype,
            shape: t.shape.clone(),
            placement: t.placement,
            range: None,
        };
    });
    let e = assert_err_msg(read(&b), &["output 0 ('w')", "is a weight"]);
    assert!(matches!(e, FormatError::BadIo { .. }));
    let b = mutate(|m| {
        let t = &m.graph.tensors[ids.h as usize];
        m.meta.inputs.push(IoBinding {
            name: "h".into(),
            tensor: ids.h,
            dtype: t.dtype,
            shape: t.shape.clone(),
            placement: t.placement,
            range: None,
        });
    });
    assert_err_msg(read(&b), &["input 1 ('h')", "produced by node 1"]);
    let b = mutate(|m| {
        m.graph.nodes.pop();
        m.profile.as_mut().unwrap().pop();
    });
    assert_err_msg(read(&b), &["output 0 ('y')", "no node produces tensor 5"]);
    let b = mutate(|m| {
        let dup = m.meta.inputs[0].clone();
        m.meta.inputs.push(dup);
    });
    assert_err_msg(read(&b), &["duplicate input name 'x'"]);
}

#[test]
fn op_summary_must_match_the_graph() {
    let b = mutate(|m| m.meta.ops[0].count = 3);
    let e = assert_err_msg(read(&b), &["op summary", "'Gemm' is listed 3 times, the graph has 2"]);
    assert!(matches!(e, FormatError::OpSummary { .. }));
    let b = mutate(|m| m.meta.ops.clear());
    assert_err_msg(read(&b), &["'Gemm' is used by the graph but not listed"]);
    let b = mutate(|m| m.meta.ops.push(OpCount { op: "Conv".into(), count: 1 }));
    assert_err_msg(read(&b), &["sorted"]);
    let b = mutate(|m| m.meta.ops.push(OpCount { op: "Relu".into(), count: 1 }));
    assert_err_msg(read(&b), &["'Relu' is listed but no compute node uses it"]);
}

// ---- program ---------------------------------------------------------------------

#[test]
fn command_streams_must_decode() {
    let b = mutate(|m| m.program.streams[2].bytes[16] = 0xee); // opcode of the 2nd packet
    let e = assert_err_msg(read(&b), &["command stream 'run'", "bad packet at offset 16", "UnknownOpcode(238)"]);
    assert!(matches!(e, FormatError::BadPacket { offset: 16, .. }));
    let b = mutate(|m| m.program.streams[2].bytes.extend_from_slice(&[0, 0]));
    assert_err_msg(read(&b), &["command stream 2 ('run')", "not a whole number of dwords"]);
}

#[test]
fn stream_table_rules() {
    let b = mutate(|m| m.program.streams[1].role = StreamRole::Run);
    let e = assert_err_msg(read(&b), &["command stream 2 ('run')", "a second stream with role run"]);
    assert!(matches!(e, FormatError::BadStream { .. }));
    let b = mutate(|m| m.program.streams[2].role = StreamRole::Aux);
    assert_err_msg(read(&b), &["exactly one stream with role run", "found 0"]);
    let b = mutate(|m| m.program.streams[2].name = "r/un".into());
    assert_err_msg(read(&b), &["[A-Za-z0-9_.-]"]);
}

#[test]
fn relocations_outside_or_misaligned() {
    let find = |m: &Model, t: RelocTarget| m.program.relocations.iter().position(|r| r.target == t).unwrap();
    let b = mutate(|m| {
        let i = find(m, RelocTarget::Stream(2));
        let last = m.program.relocations.iter().rposition(|r| r.target == RelocTarget::Stream(2)).unwrap();
        assert_eq!(i + 1, last);
        m.program.relocations[last].offset = 28;
    });
    let e = assert_err_msg(read(&b), &["relocation", ".rbln.cmd.run offset 28", "outside the 32-byte section"]);
    assert!(matches!(e, FormatError::RelocOutOfBounds { .. }));
    let b = mutate(|m| {
        let i = find(m, RelocTarget::Stream(2));
        m.program.relocations[i].offset = 10;
    });
    let e = assert_err_msg(read(&b), &[".rbln.cmd.run offset 10", "not a multiple of 4"]);
    assert!(matches!(e, FormatError::RelocMisaligned { .. }));
    let b = mutate(|m| m.program.relocations[0].offset = u64::MAX - 3);
    assert!(matches!(read(&b), Err(FormatError::RelocOutOfBounds { .. })));
    let b = mutate(|m| m.program.relocations[0].target = RelocTarget::Stream(7));
    assert_err_msg(read(&b), &["relocation 0", "target stream 7 does not exist"]);
}

#[test]
fn relocations_sorted_and_disjoint() {
    let b = mutate(|m| m.program.relocations.swap(0, 1));
    let e = assert_err_msg(read(&b), &["relocation 1", "must be sorted"]);
    assert!(matches!(e, FormatError::RelocOrder { index: 1, .. }));
    let b = mutate(|m| {
        let r = m.program.relocations[0];
        m.program.relocations.insert(1, Relocation { offset: r.offset + 4, ..r });
    });
    assert!(matches!(read(&b), Err(FormatError::RelocOrder { index: 1, .. })));
}

#[test]
fn relocation_addends_and_stored_values() {
    let b = mutate(|m| {
        let r = &mut m.program.relocations[0]; // a_va of the first GEMM (arena)
        r.addend = 1 << 20;
        let o = r.offset as usize;
        put_u64(&mut m.program.descriptors, o, 1 << 20);
    });
    let e = assert_err_msg(read(&b), &["relocation 0", "arena addend 1048576 exceeds the 8192-byte region"]);
    assert!(matches!(e, FormatError::RelocAddend { kind: "arena", .. }));
    let b = mutate(|m| {
        let o = m.program.relocations[0].offset as usize;
        put_u64(&mut m.program.descriptors, o, 0x1234);
    });
    let e = assert_err_msg(read(&b), &["relocation 0", "holds 0x1234, expected the addend 0x1000"]);
    assert!(matches!(e, FormatError::RelocStoredValue { .. }));
    let b = mutate(|m| {
        let i = m.program.relocations.iter().position(|r| matches!(r.kind, RelocKind::WeightsSource)).unwrap();
        m.program.relocations[i].kind = RelocKind::Stream(5);
    });
    assert_err_msg(read(&b), &["refers to stream 5, but there are 4 streams"]);
}

#[test]
fn profile_entries() {
    let b = mutate(|m| m.profile.as_mut().unwrap()[3].node = 4);
    let e = assert_err_msg(read(&b), &[".rbln.profile entry 3", "node 4 does not exist"]);
    assert!(matches!(e, FormatError::BadProfile { .. }));
    let b = mutate(|m| m.profile.as_mut().unwrap()[2].node = 1);
    assert_err_msg(read(&b), &[".rbln.profile entry 2", "sorted"]);
}

#[test]
fn errors_are_displayable_and_checked_writes_refuse() {
    // The checked writer refuses exactly what the reader refuses.
    let mut m = mlp_model();
    m.graph.nodes.swap(1, 2);
    assert!(matches!(m.to_bytes(), Err(FormatError::NotTopological { .. })));
    let bytes = m.to_bytes_unchecked().unwrap();
    assert!(matches!(read(&bytes), Err(FormatError::NotTopological { .. })));
}

#[test]
fn value_ranges_only_on_integer_inputs() {
    let b = mutate(|m| m.meta.inputs[0].range = Some(ValueRange { lo: 0, hi: 10 }));
    assert_err_msg(read(&b), &["input 0 ('x')", "value range on a f32 tensor"]);
    let b = mutate(|m| {
        m.graph.tensors[m.meta.inputs[0].tensor as usize].dtype = DType::I32;
        m.meta.inputs[0].dtype = DType::I32;
        m.meta.inputs[0].range = Some(ValueRange { lo: 5, hi: 5 });
    });
    assert_err_msg(read(&b), &["input 0 ('x')", "empty value range 5..5"]);
}
