//! The container layer: named sections in an ELF64 little-endian file plus
//! the `.rbln.check` checksum table. Knows nothing about what the sections
//! mean; [`crate::Model`] builds on it.
//!
//! Public so that tools (and the tests) can inspect or assemble files at
//! the section level, e.g. to produce deliberately broken files.

use object::elf::{self, FileHeader64, SectionHeader64};
use object::write::elf::{FileHeader, SectionHeader, Writer};
use object::{Endianness, LittleEndian as LE};

use crate::codec::{field, Dec, Enc};
use crate::error::{FormatError, Result};
use crate::limits::{MAX_NAME_LEN, MAX_SECTIONS};
use crate::names;

/// Size of the ELF64 file header.
pub const EHDR_SIZE: u64 = 64;
/// Size of one ELF64 section header.
pub const SHDR_SIZE: u64 = 64;

/// CRC-32/ISO-HDLC (the zlib / PNG / Ethernet CRC) of `data`.
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// A section to write.
#[derive(Clone, Copy, Debug)]
pub struct SectionSpec<'a> {
    pub name: &'a str,
    /// File-offset alignment (rounded up to a power of two, at most 64 KiB).
    pub align: u64,
    pub data: &'a [u8],
}

/// A section of a parsed file.
#[derive(Clone, Copy, Debug)]
pub struct Section<'a> {
    /// Index in the section header table.
    pub index: u32,
    pub name: &'a str,
    pub sh_type: u32,
    pub offset: u64,
    pub align: u64,
    pub data: &'a [u8],
}

/// A parsed file: its sections in section-header order (the null section
/// excluded).
#[derive(Clone, Debug)]
pub struct Container<'a> {
    pub sections: Vec<Section<'a>>,
}

impl<'a> Container<'a> {
    pub fn get(&self, name: &str) -> Option<&Section<'a>> {
        self.sections.iter().find(|s| s.name == name)
    }
}

/// Write an ELF file with `sections` (in this order) followed by a
/// `.rbln.check` section covering all of them and the whole file, then
/// `.shstrtab` and the section header table.
pub fn write(sections: &[SectionSpec]) -> Result<Vec<u8>> {
    // The check section's size depends only on the names, so lay it out
    // with zero checksums first and patch them in afterwards.
    let mut enc = Enc::default();
    enc.raw(&crate::CHECK_MAGIC).u32(crate::CHECK_ALGO_CRC32).count(sections.len());
    for s in sections {
        enc.str(s.name).u64(s.data.len() as u64).u32(crc32(s.data));
    }
    enc.u32(0).u32(0); // file crc, self crc
    let check = enc.buf;
    let mut all = sections.to_vec();
    all.push(SectionSpec { name: names::CHECK, align: 8, data: &check });
    let (mut out, ranges) = write_elf(&all)?;
    let (off, size) = ranges.last().copied().unwrap_or_default();
    let (off, end) = (off as usize, (off + size) as usize);
    if end < off + 8 || end > out.len() {
        return Err(FormatError::Builder("internal error: check section misplaced".into()));
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&out[..off]);
    h.update(&out[end..]);
    out[end - 8..end - 4].copy_from_slice(&h.finalize().to_le_bytes());
    let self_crc = crc32(&out[off..end - 4]);
    out[end - 4..end].copy_from_slice(&self_crc.to_le_bytes());
    Ok(out)
}

/// (file offset, size) of each written section.
pub type Ranges = Vec<(u64, u64)>;

/// Write an ELF file with exactly `sections` (no `.rbln.check` is added).
/// Returns the file and each section's (offset, size).
pub fn write_elf(sections: &[SectionSpec]) -> Result<(Vec<u8>, Ranges)> {
    let werr = |e: object::write::Error| FormatError::Builder(format!("ELF writer: {e}"));
    // ELF section names are NUL-terminated; a NUL inside one cannot be
    // represented.
    let names: Vec<Vec<u8>> =
        sections.iter().map(|s| s.name.bytes().map(|b| if b == 0 { b'?' } else { b }).collect()).collect();
    let aligns: Vec<u64> = sections.iter().map(|s| s.align.clamp(1, 1 << 16).next_power_of_two()).collect();
    let mut buf = Vec::new();
    let mut ranges = Vec::with_capacity(sections.len());
    {
        let mut w = Writer::new(Endianness::Little, true, &mut buf);
        w.reserve_file_header();
        let mut ids = Vec::with_capacity(sections.len());
        for n in &names {
            ids.push(w.add_section_name(n));
            w.reserve_section_index();
        }
        w.reserve_shstrtab_section_index();
        for (s, &a) in sections.iter().zip(&aligns) {
            let off = w.reserve(s.data.len() as u64, a);
            ranges.push((off, s.data.len() as u64));
        }
        w.reserve_shstrtab().map_err(werr)?;
        w.reserve_section_headers();
        w.write_file_header(&FileHeader {
            os_abi: elf::ELFOSABI_NONE,
            abi_version: 0,
            e_type: elf::ET_REL,
            e_machine: elf::EM_NONE,
            e_entry: 0,
            e_flags: elf::FileFlags(0),
        })
        .map_err(werr)?;
        for ((s, &a), &(off, _)) in sections.iter().zip(&aligns).zip(&ranges) {
            w.write_align(a);
            w.pad_until(off);
            w.write(s.data);
        }
        w.write_shstrtab();
        w.write_null_section_header();
        for ((&id, &a), &(off, size)) in ids.iter().zip(&aligns).zip(&ranges) {
            w.write_section_header(&SectionHeader {
                sh_name: w.section_name_offset(Some(id)),
                sh_type: elf::SHT_PROGBITS,
                sh_flags: elf::SectionFlags(0),
                sh_addr: 0,
                sh_offset: off,
                sh_size: size,
                sh_link: 0,
                sh_info: 0,
                sh_addralign: a,
                sh_entsize: 0,
            });
        }
        w.write_shstrtab_section_header();
    }
    Ok((buf, ranges))
}

/// Parse and validate the ELF structure, then verify `.rbln.check`.
pub fn read(bytes: &[u8]) -> Result<Container<'_>> {
    let c = read_elf(bytes)?;
    verify_checksums(&c, bytes)?;
    Ok(c)
}

fn hdr_err(field: &'static str, expected: impl Into<String>, found: impl ToString) -> FormatError {
    FormatError::ElfHeader { field, expected: expected.into(), found: found.to_string() }
}

/// Parse and validate the ELF structure only (no checksums): header,
/// section table, names, bounds, alignment, overlaps, duplicates.
pub fn read_elf(bytes: &[u8]) -> Result<Container<'_>> {
    let file_size = bytes.len() as u64;
    let trunc =
        |what: &str, offset: u64, len: u64| FormatError::Truncated { what: what.into(), offset, len, file_size };
    if bytes.len() < 4 {
        return Err(trunc("ELF magic", 0, 4));
    }
    if bytes[..4] != elf::ELFMAG {
        return Err(FormatError::BadMagic { found: bytes[..4].to_vec() });
    }
    if file_size < EHDR_SIZE {
        return Err(trunc("ELF header", 0, EHDR_SIZE));
    }
    let (h, _) = object::pod::from_bytes::<FileHeader64<LE>>(bytes).map_err(|_| trunc("ELF header", 0, EHDR_SIZE))?;
    let id = &h.e_ident;
    if id.class != elf::ELFCLASS64 {
        return Err(hdr_err("EI_CLASS", "2 (ELFCLASS64)", id.class.0));
    }
    if id.data != elf::ELFDATA2LSB {
        return Err(hdr_err("EI_DATA", "1 (ELFDATA2LSB, little-endian)", id.data.0));
    }
    if id.version != elf::EV_CURRENT {
        return Err(hdr_err("EI_VERSION", "1 (EV_CURRENT)", id.version.0));
    }
    if id.os_abi != elf::ELFOSABI_NONE {
        return Err(hdr_err("EI_OSABI", "0 (ELFOSABI_NONE)", id.os_abi.0));
    }
    let e_type = h.e_type.get(LE).0;
    if e_type != elf::ET_REL.0 {
        return Err(hdr_err("e_type", "1 (ET_REL)", e_type));
    }
    let machine = h.e_machine.get(LE).0;
    if machine != elf::EM_NONE.0 {
        return Err(hdr_err("e_machine", "0 (EM_NONE)", machine));
    }
    if h.e_version.get(LE) != 1 {
        return Err(hdr_err("e_version", "1 (EV_CURRENT)", h.e_version.get(LE)));
    }
    if h.e_flags.get(LE).0 != 0 {
        return Err(hdr_err("e_flags", "0", h.e_flags.get(LE).0));
    }
    if h.e_ehsize.get(LE) as u64 != EHDR_SIZE {
        return Err(hdr_err("e_ehsize", "64", h.e_ehsize.get(LE)));
    }
    if h.e_phnum.get(LE) != 0 {
        return Err(hdr_err("e_phnum", "0 (no program headers)", h.e_phnum.get(LE)));
    }
    if h.e_shentsize.get(LE) as u64 != SHDR_SIZE {
        return Err(hdr_err("e_shentsize", "64", h.e_shentsize.get(LE)));
    }
    let shnum = h.e_shnum.get(LE) as u64;
    if shnum < 2 {
        // 0 would mean extended numbering (unsupported); 1 is the null
        // section alone.
        return Err(hdr_err("e_shnum", format!("2..={MAX_SECTIONS}"), shnum));
    }
    if shnum > MAX_SECTIONS {
        return Err(FormatError::LimitExceeded {
            section: "ELF header".into(),
            field: "e_shnum".into(),
            found: shnum,
            limit: MAX_SECTIONS,
        });
    }
    let shoff = h.e_shoff.get(LE);
    let sht_len = shnum * SHDR_SIZE;
    if shoff.checked_add(sht_len).is_none_or(|end| end > file_size) {
        return Err(trunc("section header table", shoff, sht_len));
    }
    let shstrndx = h.e_shstrndx.get(LE).0 as u64;
    if shstrndx == 0 || shstrndx >= shnum {
        return Err(hdr_err("e_shstrndx", format!("1..{shnum}"), shstrndx));
    }
    let (shdrs, _) = object::pod::slice_from_bytes::<SectionHeader64<LE>>(&bytes[shoff as usize..], shnum as usize)
        .map_err(|_| trunc("section header table", shoff, sht_len))?;

    if object::pod::bytes_of(&shdrs[0]).iter().any(|&b| b != 0) {
        return Err(FormatError::SectionHeader {
            index: 0,
            name: "null section".into(),
            field: "all fields",
            expected: "0 (SHT_NULL, no extended numbering)".into(),
            found: "non-zero".into(),
        });
    }

    // Bounds-checked file bytes of section `i`.
    let data_of = |i: usize, name: &str| -> Result<&[u8]> {
        let s = &shdrs[i];
        if s.sh_type.get(LE) == elf::SHT_NOBITS {
            return Ok(&[]);
        }
        let (off, size) = (s.sh_offset.get(LE), s.sh_size.get(LE));
        match off.checked_add(size) {
            Some(end) if end <= file_size => Ok(&bytes[off as usize..end as usize]),
            _ => Err(FormatError::SectionOutOfBounds { name: name.into(), offset: off, size, file_size }),
        }
    };

    let strtab_hdr = &shdrs[shstrndx as usize];
    if strtab_hdr.sh_type.get(LE) != elf::SHT_STRTAB {
        return Err(FormatError::SectionHeader {
            index: shstrndx as u32,
            name: "section name string table".into(),
            field: "sh_type",
            expected: "3 (SHT_STRTAB)".into(),
            found: strtab_hdr.sh_type.get(LE).0.to_string(),
        });
    }
    let strtab = data_of(shstrndx as usize, "section name string table")?;

    let mut sections = Vec::with_capacity(shnum as usize - 1);
    for (i, s) in shdrs.iter().enumerate().skip(1) {
        let index = i as u32;
        let sh_name = s.sh_name.get(LE) as usize;
        let bad = |field: &'static str, expected: &str, found: String, name: &str| FormatError::SectionHeader {
            index,
            name: name.into(),
            field,
            expected: expected.into(),
            found,
        };
        let raw = strtab.get(sh_name..).and_then(|t| t.iter().position(|&b| b == 0).map(|n| &t[..n]));
        let Some(raw) = raw else {
            return Err(bad(
                "sh_name",
                "offset of a NUL-terminated name in the section name string table",
                sh_name.to_string(),
                "?",
            ));
        };
        if raw.is_empty() || raw.len() as u64 > MAX_NAME_LEN {
            return Err(bad("sh_name", "a name of 1 to 4096 bytes", format!("{} bytes", raw.len()), "?"));
        }
        let Ok(name) = std::str::from_utf8(raw) else {
            return Err(bad("sh_name", "UTF-8", format!("{raw:02x?}"), "?"));
        };
        let sh_type = s.sh_type.get(LE).0;
        let is_rbln = name.starts_with(names::PREFIX);
        if is_rbln && sh_type != elf::SHT_PROGBITS.0 {
            return Err(bad("sh_type", "1 (SHT_PROGBITS)", sh_type.to_string(), name));
        }
        let flags = s.sh_flags.get(LE).0;
        if is_rbln && flags != 0 {
            return Err(bad("sh_flags", "0", format!("{flags:#x}"), name));
        }
        let align = s.sh_addralign.get(LE);
        if align != 0 && !align.is_power_of_two() {
            return Err(bad("sh_addralign", "0 or a power of two", align.to_string(), name));
        }
        let data = data_of(i, name)?;
        let offset = s.sh_offset.get(LE);
        if sh_type != elf::SHT_NOBITS.0 && align > 1 && offset % align != 0 {
            return Err(bad("sh_offset", &format!("a multiple of sh_addralign ({align})"), offset.to_string(), name));
        }
        sections.push(Section { index, name, sh_type, offset, align, data });
    }

    // Duplicate names.
    let mut by_name: Vec<&Section> = sections.iter().collect();
    by_name.sort_by(|a, b| a.name.cmp(b.name).then(a.index.cmp(&b.index)));
    for w in by_name.windows(2) {
        if w[0].name == w[1].name {
            return Err(FormatError::DuplicateSection {
                name: w[0].name.into(),
                first: w[0].index,
                second: w[1].index,
            });
        }
    }

    // Nothing may overlap: ELF header, section table, section contents.
    let mut ranges: Vec<(u64, u64, String)> = Vec::with_capacity(sections.len() + 2);
    ranges.push((0, EHDR_SIZE, "the ELF header".into()));
    ranges.push((shoff, shoff + sht_len, "the section header table".into()));
    for s in &sections {
        if !s.data.is_empty() {
            ranges.push((s.offset, s.offset + s.data.len() as u64, format!("section {}", s.name)));
        }
    }
    ranges.sort_by_key(|r| (r.0, r.1));
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(FormatError::SectionOverlap { a: w[0].2.clone(), b: w[1].2.clone() });
        }
    }
    Ok(Container { sections })
}

/// Verify `.rbln.check`: its own CRC, every listed section's size and CRC,
/// that every `.rbln.*` section is listed, and the whole-file CRC.
pub fn verify_checksums(c: &Container, bytes: &[u8]) -> Result<()> {
    let sec = names::CHECK;
    let check = c.get(sec).ok_or_else(|| FormatError::MissingSection { name: sec.into() })?;
    let data = check.data;
    // magic 8 + algo 4 + count 4 + file crc 4 + self crc 4
    if data.len() < 24 {
        return Err(FormatError::SectionTruncated {
            section: sec.into(),
            field: "header and trailer".into(),
            offset: 0,
            needed: 24,
            available: data.len() as u64,
        });
    }
    let (body, tail) = data.split_at(data.len() - 4);
    let stored = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    let computed = crc32(body);
    if stored != computed {
        return Err(FormatError::ChecksumMismatch { section: sec.into(), stored, computed });
    }
    let mut d = Dec::new(sec, body);
    let magic: [u8; 8] = d.bytes(field!("magic"))?;
    if magic != crate::CHECK_MAGIC {
        return Err(d.bad(field!("magic"), "\"RBLNCHK\\0\"", format!("{magic:02x?}")));
    }
    let algo = d.u32(field!("algorithm"))?;
    if algo != crate::CHECK_ALGO_CRC32 {
        return Err(d.unknown(field!("algorithm"), algo as u64));
    }
    // name (>= 4) + size 8 + crc 4
    let n = d.count(16, MAX_SECTIONS, field!("entries"))?;
    let mut listed: Vec<&str> = Vec::with_capacity(n);
    for i in 0..n {
        let name = d.str(MAX_NAME_LEN, field!("entries[{i}].name"))?;
        let size = d.u64(field!("entries[{i}].size"))?;
        let stored = d.u32(field!("entries[{i}].crc32"))?;
        let Some(s) = c.get(&name) else {
            return Err(FormatError::MissingSection { name });
        };
        if listed.contains(&s.name) {
            return Err(FormatError::DuplicateName { kind: "check entry", name });
        }
        listed.push(s.name);
        if size != s.data.len() as u64 {
            return Err(d.bad(field!("entries[{i}].size (section {name})"), s.data.len().to_string(), size));
        }
        let computed = crc32(s.data);
        if stored != computed {
            return Err(FormatError::ChecksumMismatch { section: name, stored, computed });
        }
    }
    let stored_file = d.u32(field!("file crc32"))?;
    d.finish()?;
    for s in &c.sections {
        if s.name.starts_with(names::PREFIX) && s.name != sec && !listed.contains(&s.name) {
            return Err(FormatError::UncheckedSection { section: s.name.into() });
        }
    }
    let off = check.offset as usize;
    let end = off + data.len();
    let mut h = crc32fast::Hasher::new();
    h.update(bytes.get(..off).unwrap_or_default());
    h.update(bytes.get(end..).unwrap_or_default());
    let computed = h.finalize();
    if stored_file != computed {
        return Err(FormatError::FileChecksumMismatch { stored: stored_file, computed });
    }
    Ok(())
}
