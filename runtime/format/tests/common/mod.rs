//! Shared test fixtures: a 2-layer MLP model and section-level helpers.
#![allow(dead_code)]

use std::mem::offset_of;

use rbln_format::container::{self, SectionSpec};
use rbln_format::*;
use rbln_hw::ops::{GemmDesc, Unary, GEMM_BIAS};

pub const IN: u64 = 4;
pub const HID: u64 = 8;
pub const OUT: u64 = 3;
/// Arena offset of the activations (the weights occupy 0..).
pub const ACT: u64 = 4096;

/// Ids of the MLP's tensors.
pub struct Mlp {
    pub x_host: u32,
    pub y_host: u32,
    pub x: u32,
    pub h: u32,
    pub y: u32,
    pub w1: u32,
    pub b1: u32,
    pub w2: u32,
    pub b2: u32,
}

fn vals(n: u64, scale: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 - n as f32 / 2.0) * scale).collect()
}

/// GEMM descriptor with its four VA fields relocated against the arena.
#[allow(clippy::too_many_arguments)]
pub fn gemm(b: &mut ModelBuilder, m: u32, n: u32, k: u32, act: Unary, a: u32, w: u32, bias: u32, c: u32) -> (u64, u32) {
    let d =
        GemmDesc { m, n, k, batch: 1, flags: GEMM_BIAS, activation: act as u32, ..Default::default() }.with_header();
    let off = |t| b.placement(t).unwrap().offset();
    let relocs = [
        (offset_of!(GemmDesc, a_va) as u64, RelocKind::Arena, off(a)),
        (offset_of!(GemmDesc, b_va) as u64, RelocKind::Arena, off(w)),
        (offset_of!(GemmDesc, c_va) as u64, RelocKind::Arena, off(c)),
        (offset_of!(GemmDesc, bias_va) as u64, RelocKind::Arena, off(bias)),
    ];
    (b.add_descriptor(&d.to_bytes(), &relocs), GemmDesc::SIZE as u32)
}

/// x[1,4] -> relu(x W1 + b1) [1,8] -> (. W2 + b2) [1,3], with explicit
/// host<->device transfers, four command streams, relocations everywhere
/// and an output that reuses the input's arena bytes.
pub fn mlp_builder() -> (ModelBuilder, Mlp) {
    let mut b = ModelBuilder::new("mlp2");
    b.producer("rbln-format tests").property("source", "mlp2.onnx").property("opset", "17");
    let w1 = b.add_weight_f32("W1", &[IN, HID], &vals(IN * HID, 0.125));
    let b1 = b.add_weight_f32("b1", &[HID], &vals(HID, 0.5));
    let w2 = b.add_weight_f32("W2", &[HID, OUT], &vals(HID * OUT, 0.25));
    let b2 = b.add_weight_f32("b2", &[OUT], &vals(OUT, 1.0));
    let x_host = b.staging_tensor("x", DType::F32, &[1, IN], 0);
    let y_host = b.staging_tensor("y", DType::F32, &[1, OUT], 64);
    let x = b.arena_tensor("x.dev", DType::F32, &[1, IN], ACT);
    let h = b.arena_tensor("h", DType::F32, &[1, HID], ACT + 64);
    // y reuses x's bytes: x is dead once gemm1 ran.
    let y = b.arena_tensor("y.dev", DType::F32, &[1, OUT], ACT);

    let upload = b.add_stream("upload", StreamRole::UploadWeights);
    let input = b.add_stream("input", StreamRole::InputTransfer);
    let run = b.add_stream("run", StreamRole::Run);
    let output = b.add_stream("output", StreamRole::OutputTransfer);

    let wlen = b.weights_len();
    b.dma_copy(upload, Va::Rel(RelocKind::WeightsSource, 0), Va::arena(0), wlen);

    let at = b.dma_copy(input, b.va_of(x_host), b.va_of(x), IN * 4);
    let n0 = b.add_node(Node::host_to_device("x.upload", x_host, x).with_commands(input, at, 32));

    let (d1, s1) = gemm(&mut b, 1, HID as u32, IN as u32, Unary::Relu, x, w1, b1, h);
    let at = b.compute(run, d1, s1);
    let n1 = b.add_node(
        Node::compute("fc1", "Gemm", &[x, w1, b1], &[h]).with_commands(run, at, 16).with_descriptors(d1, s1 as u64),
    );
    let (d2, s2) = gemm(&mut b, 1, OUT as u32, HID as u32, Unary::None, h, w2, b2, y);
    let at = b.compute(run, d2, s2);
    let n2 = b.add_node(
        Node::compute("fc2", "Gemm", &[h, w2, b2], &[y]).with_commands(run, at, 16).with_descriptors(d2, s2 as u64),
    );
    let at = b.dma_copy(output, b.va_of(y), b.va_of(y_host), OUT * 4);
    let n3 = b.add_node(Node::device_to_host("y.download", y, y_host).with_commands(output, at, 32));

    b.input("x", x_host).output("y", y_host);
    b.node_profile(n1, 2 * IN * HID, 4 * (IN + IN * HID + HID + HID));
    b.node_profile(n2, 2 * HID * OUT, 4 * (HID + HID * OUT + OUT + OUT));
    b.node_profile(n0, 0, 2 * 4 * IN);
    b.node_profile(n3, 0, 2 * 4 * OUT);
    (b, Mlp { x_host, y_host, x, h, y, w1, b1, w2, b2 })
}

pub fn mlp_model() -> Model {
    mlp_builder().0.build_model().expect("the MLP fixture is valid")
}

pub fn mlp_bytes() -> Vec<u8> {
    mlp_builder().0.build().expect("the MLP fixture is valid")
}

/// The file's sections (without `.rbln.check` and `.shstrtab`), as
/// (name, align, bytes).
pub fn sections(bytes: &[u8]) -> Vec<(String, u64, Vec<u8>)> {
    let c = container::read_elf(bytes).expect("parsable ELF");
    c.sections
        .iter()
        .filter(|s| s.name != names::CHECK && s.name != names::SHSTRTAB)
        .map(|s| (s.name.to_string(), s.align, s.data.to_vec()))
        .collect()
}

/// Write sections again, with a fresh `.rbln.check`.
pub fn rewrap(secs: &[(String, u64, Vec<u8>)]) -> Vec<u8> {
    let specs: Vec<SectionSpec> = secs.iter().map(|(n, a, d)| SectionSpec { name: n, align: *a, data: d }).collect();
    container::write(&specs).expect("container write")
}

/// Edit one section's bytes and rewrap with valid checksums.
pub fn patch_section(bytes: &[u8], name: &str, f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut secs = sections(bytes);
    let s = secs.iter_mut().find(|s| s.0 == name).unwrap_or_else(|| panic!("no section {name}"));
    f(&mut s.2);
    rewrap(&secs)
}

/// Edit the model, then encode it without validation (valid checksums).
pub fn mutate(f: impl FnOnce(&mut Model)) -> Vec<u8> {
    let mut m = mlp_model();
    f(&mut m);
    m.to_bytes_unchecked().expect("encode")
}

/// File offset of section header `index`'s field at `field_off`.
pub fn shdr_field(bytes: &[u8], index: u32, field_off: usize) -> usize {
    let shoff = u64::from_le_bytes(bytes[40..48].try_into().unwrap()) as usize;
    shoff + 64 * index as usize + field_off
}

pub fn section_index(bytes: &[u8], name: &str) -> u32 {
    container::read_elf(bytes).unwrap().get(name).unwrap().index
}

pub fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// An independent writer of `.rbln.check`, straight from the spec: used to
/// craft check tables that list only some sections, and as a second
/// implementation of the checksum rules.
pub fn with_check(secs: &[(String, u64, Vec<u8>)], listed: &[&str]) -> Vec<u8> {
    let mut check = Vec::new();
    check.extend_from_slice(b"RBLNCHK\0");
    check.extend_from_slice(&1u32.to_le_bytes());
    check.extend_from_slice(&(listed.len() as u32).to_le_bytes());
    for name in listed {
        let data = &secs.iter().find(|s| s.0 == *name).unwrap().2;
        check.extend_from_slice(&(name.len() as u32).to_le_bytes());
        check.extend_from_slice(name.as_bytes());
        check.extend_from_slice(&(data.len() as u64).to_le_bytes());
        check.extend_from_slice(&crc(data).to_le_bytes());
    }
    check.extend_from_slice(&[0; 8]);
    let mut specs: Vec<SectionSpec> =
        secs.iter().map(|(n, a, d)| SectionSpec { name: n, align: *a, data: d }).collect();
    specs.push(SectionSpec { name: names::CHECK, align: 8, data: &check });
    let (mut out, ranges) = container::write_elf(&specs).unwrap();
    let (off, size) = *ranges.last().unwrap();
    let (off, end) = (off as usize, (off + size) as usize);
    let mut rest = out[..off].to_vec();
    rest.extend_from_slice(&out[end..]);
    let file_crc = crc(&rest);
    out[end - 8..end - 4].copy_from_slice(&file_crc.to_le_bytes());
    let self_crc = crc(&out[off..end - 4]);
    out[end - 4..end].copy_from_slice(&self_crc.to_le_bytes());
    out
}

/// Bitwise CRC-32/ISO-HDLC, written from its definition (reflected
/// polynomial 0xEDB88320, init and xorout 0xFFFFFFFF).
pub fn crc(data: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
        }
    }
    !c
}

/// Assert `r` is an error whose message contains every `needle`.
#[track_caller]
pub fn assert_err_msg(r: Result<Model, FormatError>, needles: &[&str]) -> FormatError {
    let e = match r {
        Ok(_) => panic!("expected an error containing {needles:?}, got Ok"),
        Err(e) => e,
    };
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "error message {msg:?} does not contain {n:?}");
    }
    e
}
