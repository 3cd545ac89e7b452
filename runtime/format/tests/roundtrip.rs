//! Write → read round trips, relocation, interoperability with standard
//! ELF tools.

mod common;

use common::*;
use rbln_format::container;
use rbln_format::*;
use rbln_hw::cmd::Packet;
use rbln_hw::ops::{Desc, GemmDesc};

#[test]
fn mlp_round_trip_is_exact() {
    let (b, ids) = mlp_builder();
    let model = b.build_model().unwrap();
    let bytes = b.build().unwrap();
    let back = Model::from_bytes(&bytes).unwrap();
    assert_eq!(back, model);

    // The parts are really there, not just equal-because-empty.
    assert_eq!(back.meta.version, Version { major: 1, minor: 2 });
    assert_eq!(back.meta.name, "mlp2");
    assert_eq!(back.meta.hw_version, rbln_hw::HW_VERSION);
    assert_eq!(back.meta.inputs.len(), 1);
    assert_eq!(back.meta.inputs[0].shape, vec![1, IN]);
    assert_eq!(back.meta.outputs[0].placement, Placement::Staging { offset: 64, size: OUT * 4 });
    assert_eq!(back.meta.ops, vec![OpCount { op: "Gemm".into(), count: 2 }]);
    assert_eq!(back.meta.arena_size, 8192);
    assert_eq!(back.meta.staging_size, 4096);
    assert_eq!(back.graph.tensors.len(), 9);
    assert_eq!(back.graph.nodes.len(), 4);
    assert_eq!(back.graph.nodes[0].kind, NodeKind::HostToDevice);
    assert_eq!(back.graph.nodes[3].kind, NodeKind::DeviceToHost);
    assert_eq!(back.graph.nodes[1].inputs, vec![ids.x, ids.w1, ids.b1]);
    assert_eq!(back.program.streams.len(), 4);
    assert_eq!(back.stream_by_role(StreamRole::Run), Some(2));
    assert_eq!(back.program.relocations.len(), 2 + 2 + 2 + 2 + 8);
    assert_eq!(back.program.descriptors.len(), 2 * GemmDesc::SIZE);
    let w2 = back.graph.tensors[ids.w2 as usize].placement;
    let w2_bytes = &back.weights[w2.offset() as usize..(w2.offset() + w2.size()) as usize];
    assert_eq!(f32::from_le_bytes(w2_bytes[4..8].try_into().unwrap()), (1.0 - 12.0) * 0.25);
    let prof = back.profile.as_ref().unwrap();
    assert_eq!(prof.iter().map(|p| p.node).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert_eq!(prof[1].flops, 2 * IN * HID);
    assert_eq!(back.meta.properties[0], Property { key: "source".into(), value: "mlp2.onnx".into() });

    // Writing the read model again gives the same bytes.
    assert_eq!(back.to_bytes().unwrap(), bytes);
}

#[test]
fn descriptors_and_streams_decode_before_and_after_relocation() {
    let m = mlp_model();
    let bases = RelocBases {
        arena: 0x10_0000_0000,
        staging: 0x20_0000_0000,
        descriptors: 0x30_0000_0000,
        streams: vec![0x40_0000_0000, 0x40_0001_0000, 0x40_0002_0000, 0x40_0003_0000],
        weights_source: 0x50_0000_0000,
    };
    let r = m.relocate(&bases).unwrap();

    // run: two COMPUTE packets pointing at the two descriptors.
    let run = &r.streams[2];
    let (p0, n0) = Packet::decode(run).unwrap();
    let (p1, _) = Packet::decode(&run[n0..]).unwrap();
    let Packet::Compute(c0) = p0 else { panic!("{p0:?}") };
    let Packet::Compute(c1) = p1 else { panic!("{p1:?}") };
    assert_eq!(c0.desc_va, bases.descriptors);
    assert_eq!(c1.desc_va, bases.descriptors + GemmDesc::SIZE as u64);
    assert_eq!(c0.desc_size as usize, GemmDesc::SIZE);

    // The first GEMM reads x.dev and W1 (weights at arena 0), writes h.
    let Desc::Gemm(g) = Desc::decode(&r.descriptors[..GemmDesc::SIZE]).unwrap() else { panic!() };
    assert_eq!((g.m, g.n, g.k), (1, HID as u32, IN as u32));
    assert_eq!(g.a_va, bases.arena + ACT);
    assert_eq!(g.b_va, bases.arena);
    assert_eq!(g.c_va, bases.arena + ACT + 64);
    let Desc::Gemm(g2) = Desc::decode(&r.descriptors[GemmDesc::SIZE..]).unwrap() else { panic!() };
    assert_eq!(g2.c_va, bases.arena + ACT, "y.dev reuses x.dev's bytes");

    // Transfers.
    let Packet::DmaCopy(up) = Packet::decode(&r.streams[0]).unwrap().0 else { panic!() };
    assert_eq!((up.src_va, up.dst_va, up.size), (bases.weights_source, bases.arena, m.weights.len() as u64));
    let Packet::DmaCopy(inp) = Packet::decode(&r.streams[1]).unwrap().0 else { panic!() };
    assert_eq!((inp.src_va, inp.dst_va, inp.size), (bases.staging, bases.arena + ACT, 16));
    let Packet::DmaCopy(out) = Packet::decode(&r.streams[3]).unwrap().0 else { panic!() };
    assert_eq!((out.src_va, out.dst_va, out.size), (bases.arena + ACT, bases.staging + 64, 12));

    // Unrelocated fields hold the addends (offsets).
    let Desc::Gemm(raw) = Desc::decode(&m.program.descriptors[..GemmDesc::SIZE]).unwrap() else { panic!() };
    assert_eq!(raw.a_va, ACT);

    // Overflow and a missing stream base are errors, not panics.
    let mut bad = bases.clone();
    bad.arena = u64::MAX;
    assert!(matches!(m.relocate(&bad), Err(FormatError::Relocate { .. })));
    bad = bases.clone();
    bad.streams.pop();
    assert!(matches!(m.relocate(&bad), Err(FormatError::Relocate { .. })));
}

#[test]
fn indirect_and_fill_relocations() {
    let mut b = ModelBuilder::new("indirect");
    let t = b.arena_tensor("t", DType::F32, &[16], 0);
    let sub = b.add_stream("sub", StreamRole::Aux);
    let at = b.fill(sub, b.va_of(t), 64, 0x3f80_0000);
    b.nop(sub);
    let run = b.add_stream("run", StreamRole::Run);
    let call = b.indirect(run, sub);
    b.timestamp(run, Va::Abs(0x1000));
    b.add_node(Node::compute("ones", "Fill", &[], &[t]).with_commands(sub, at, 24));
    b.output("t", t);
    let m = b.build_model().unwrap();
    let back = Model::from_bytes(&m.to_bytes().unwrap()).unwrap();
    assert_eq!(back, m);
    let bases = RelocBases { arena: 0x8000, streams: vec![0xa000, 0xb000], ..Default::default() };
    let r = back.relocate(&bases).unwrap();
    let Packet::Indirect(ind) = Packet::decode(&r.streams[1][call as usize..]).unwrap().0 else { panic!() };
    assert_eq!((ind.va, ind.size), (0xa000, 28));
    let Packet::Fill(f) = Packet::decode(&r.streams[0]).unwrap().0 else { panic!() };
    assert_eq!(f.dst_va, 0x8000);
    // The absolute timestamp address is left alone.
    let Packet::Timestamp(ts) = Packet::decode(&r.streams[1][16..]).unwrap().0 else { panic!() };
    assert_eq!(ts.addr_va, 0x1000);
}

#[test]
fn views_share_bytes_and_extend_lifetimes() {
    // x -> relu -> a (arena 0) -> view -> a2 (same bytes) -> relu -> c.
    // c may not take a's bytes while a2 is still read, but a view is free.
    let build = |c_offset: u64| {
        let mut b = ModelBuilder::new("view");
        let x = b.arena_tensor("x", DType::F32, &[2, 2], 256);
        let a = b.arena_tensor("a", DType::F32, &[2, 2], 0);
        let a2 = b.arena_tensor("a2", DType::F32, &[4], 0);
        let c = b.arena_tensor("c", DType::F32, &[4], c_offset);
        let run = b.add_stream("run", StreamRole::Run);
        let p = b.nop(run);
        b.add_node(Node::compute("r1", "Relu", &[x], &[a]).with_commands(run, p, 4));
        b.add_node(Node::view("flat", a, a2));
        let p = b.nop(run);
        b.add_node(Node::compute("r2", "Relu", &[a2], &[c]).with_commands(run, p, 4));
        b.input("x", x).output("c", c);
        b.build_model()
    };
    let ok = build(64).unwrap();
    assert_eq!(Model::from_bytes(&ok.to_bytes().unwrap()).unwrap(), ok);
    match build(0) {
        Err(FormatError::TensorOverlap { a_name, b_name, region: "arena", .. }) => {
            assert_eq!((a_name.as_str(), b_name.as_str()), ("a", "c"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn empty_profile_and_weights_round_trip() {
    let mut b = ModelBuilder::new("tiny");
    let x = b.staging_tensor("x", DType::I32, &[3], 0);
    let y = b.arena_tensor("y", DType::I32, &[3], 0);
    let s = b.add_stream("run", StreamRole::Run);
    let at = b.dma_copy(s, b.va_of(x), b.va_of(y), 12);
    b.add_node(Node::host_to_device("in", x, y).with_commands(s, at, 32));
    b.input("x", x).output("y", y);
    let m = b.build_model().unwrap();
    assert!(m.profile.is_none());
    assert!(m.weights.is_empty());
    assert!(m.meta.ops.is_empty());
    let back = Model::from_bytes(&m.to_bytes().unwrap()).unwrap();
    assert_eq!(back, m);
}

#[test]
fn save_and_open() {
    let m = mlp_model();
    let dir = std::env::temp_dir().join(format!("rbln-format-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mlp.rbln");
    m.save(&path).unwrap();
    assert_eq!(Model::open(&path).unwrap(), m);
    let missing = dir.join("missing.rbln");
    let e = Model::open(&missing).unwrap_err();
    assert!(matches!(e, FormatError::Io { .. }), "{e}");
    assert!(e.to_string().contains("missing.rbln"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn file_layout_follows_the_spec() {
    let bytes = mlp_bytes();
    // ELF64, little-endian, ET_REL, EM_NONE.
    assert_eq!(&bytes[..7], &[0x7f, b'E', b'L', b'F', 2, 1, 1]);
    assert_eq!(u16::from_le_bytes([bytes[16], bytes[17]]), 1);
    assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), 0);
    let c = container::read(&bytes).unwrap();
    let order: Vec<&str> = c.sections.iter().map(|s| s.name).collect();
    assert_eq!(
        order,
        [
            ".rbln.meta",
            ".rbln.graph",
            ".rbln.desc",
            ".rbln.cmd.upload",
            ".rbln.cmd.input",
            ".rbln.cmd.run",
            ".rbln.cmd.output",
            ".rbln.reloc",
            ".rbln.profile",
            ".rbln.weights",
            ".rbln.check",
            ".shstrtab"
        ]
    );
    let w = c.get(".rbln.weights").unwrap();
    assert_eq!(w.offset % 4096, 0);
    assert_eq!(w.align, 4096);
    // .rbln.meta starts with the magic and the version.
    let meta = c.get(".rbln.meta").unwrap().data;
    assert_eq!(&meta[..8], b"RBLNMODL");
    assert_eq!(&meta[8..12], &[1, 0, 2, 0]);
    // The check section verifies with an independent CRC implementation.
    let chk = c.get(".rbln.check").unwrap();
    let n = chk.data.len();
    assert_eq!(crc(&chk.data[..n - 4]).to_le_bytes(), chk.data[n - 4..]);
    let mut rest = bytes[..chk.offset as usize].to_vec();
    rest.extend_from_slice(&bytes[chk.offset as usize + n..]);
    assert_eq!(crc(&rest).to_le_bytes(), chk.data[n - 8..n - 4]);
}

#[test]
fn crc32_is_the_standard_one() {
    assert_eq!(container::crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(crc(b"123456789"), 0xCBF4_3926);
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
    assert_eq!(container::crc32(&data), crc(&data));
}

#[test]
fn generic_elf_parser_reads_it() {
    use object::{Object, ObjectSection};
    let bytes = mlp_bytes();
    let f = object::read::elf::ElfFile64::<object::LittleEndian>::parse(&*bytes).unwrap();
    let m = mlp_model();
    let graph = f.section_by_name(".rbln.graph").unwrap();
    assert_eq!(graph.data().unwrap().len(), container::read(&bytes).unwrap().get(".rbln.graph").unwrap().data.len());
    let weights = f.section_by_name(".rbln.weights").unwrap();
    assert_eq!(weights.data().unwrap(), &m.weights[..]);
    assert_eq!(f.sections().count(), 12); // the null section is not listed
}

#[test]
fn readelf_lists_the_sections() {
    let Ok(out) = std::process::Command::new("readelf")
        .args(["-S", "-W", "-h"])
        .arg({
            let p = std::env::temp_dir().join(format!("rbln-readelf-{}.rbln", std::process::id()));
            std::fs::write(&p, mlp_bytes()).unwrap();
            p
        })
        .output()
    else {
        eprintln!("SKIP: readelf not found on this host");
        return;
    };
    let _ = std::fs::remove_file(std::env::temp_dir().join(format!("rbln-readelf-{}.rbln", std::process::id())));
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "readelf failed: {err}");
    assert!(err.trim().is_empty(), "readelf warned: {err}");
    for name in [
        ".rbln.meta",
        ".rbln.graph",
        ".rbln.desc",
        ".rbln.cmd.upload",
        ".rbln.cmd.input",
        ".rbln.cmd.run",
        ".rbln.cmd.output",
        ".rbln.reloc",
        ".rbln.profile",
        ".rbln.weights",
        ".rbln.check",
    ] {
        assert!(text.contains(name), "readelf -S does not show {name}:\n{text}");
    }
    assert!(text.contains("REL (Relocatable file)"), "{text}");
    assert!(text.contains("ELF64"), "{text}");
}

#[test]
fn newer_minor_versions_may_add_sections() {
    let bytes = mlp_bytes();
    let mut secs = sections(&bytes);
    secs.push((".rbln.future".into(), 8, vec![1, 2, 3]));
    // Same minor: an unknown section is an error.
    let e = Model::from_bytes(&rewrap(&secs)).unwrap_err();
    assert!(matches!(&e, FormatError::UnknownSection { name, .. } if name == ".rbln.future"), "{e}");
    // Newer minor: skipped.
    secs.iter_mut().find(|s| s.0 == ".rbln.meta").unwrap().2[10] = 7;
    let m = Model::from_bytes(&rewrap(&secs)).unwrap();
    assert_eq!(m.meta.version, Version { major: 1, minor: 7 });
    // Sections outside the .rbln. namespace are ignored (but checksummed).
    let mut secs = sections(&bytes);
    secs.push((".comment".into(), 1, b"made by hand\0".to_vec()));
    Model::from_bytes(&rewrap(&secs)).unwrap();
}

#[test]
fn builder_reports_what_the_reader_would() {
    let (mut b, ids) = mlp_builder();
    b.arena_size(1024); // smaller than the weights + activations
    let e = b.build().unwrap_err();
    assert!(matches!(e, FormatError::TensorOutOfBounds { .. } | FormatError::WeightsOutOfArena { .. }), "{e}");
    let (mut b, _) = mlp_builder();
    b.input("again", ids.h);
    let e = b.build().unwrap_err();
    assert!(matches!(e, FormatError::BadIo { io: "input", .. }), "{e}");
    let (mut b, _) = mlp_builder();
    b.weights_offset(8192);
    assert!(matches!(b.build(), Err(FormatError::Builder(m)) if m.contains("weights_offset")));
    let (mut b, _) = mlp_builder();
    b.output("nope", 999);
    assert!(matches!(b.build(), Err(FormatError::Builder(m)) if m.contains("tensor 999")));
}

#[test]
fn integer_input_ranges_round_trip_and_minor_0_files_still_load() {
    let mut m = mlp_model();
    let x = m.meta.inputs[0].tensor as usize;
    m.graph.tensors[x].dtype = DType::I32;
    m.meta.inputs[0].dtype = DType::I32;
    m.meta.inputs[0].range = Some(ValueRange { lo: -3, hi: 30522 });
    let bytes = m.to_bytes_unchecked().unwrap();
    let back = Model::from_bytes(&bytes).unwrap();
    assert_eq!(back.meta.inputs[0].range, Some(ValueRange { lo: -3, hi: 30522 }));
    assert!(back.meta.inputs[0].range.unwrap().contains(30521));
    assert!(!back.meta.inputs[0].range.unwrap().contains(30522));

    // A minor-0 file: no input_ranges list at the end of .rbln.meta.
    let mut secs = sections(&mlp_bytes());
    let meta = &mut secs.iter_mut().find(|s| s.0 == ".rbln.meta").unwrap().2;
    meta[10] = 0;
    assert_eq!(meta[meta.len() - 4..], [0, 0, 0, 0], "an empty input_ranges count ends the section");
    meta.truncate(meta.len() - 4);
    let old = Model::from_bytes(&rewrap(&secs)).unwrap();
    assert_eq!(old.meta.version, Version { major: 1, minor: 0 });
    assert!(old.meta.inputs.iter().all(|b| b.range.is_none()));
}
