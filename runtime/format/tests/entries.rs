//! Entry points (format minor 2): several programs over one weights
//! section — written, read back, and refused when inconsistent.

mod common;

use common::*;
use rbln_format::*;

/// The MLP as main program `first` plus a second program `second` over the
/// same weights (the MLP again, with a larger arena and a renamed input).
fn two_entries() -> Model {
    let mut other = mlp_model();
    other.meta.name = "second".into();
    other.meta.arena_size += 4096;
    other.meta.inputs[0].name = "x2".into();
    Model::with_entries(mlp_model(), "first", vec![other]).unwrap()
}

#[test]
fn entries_round_trip_and_store_the_weights_once() {
    let m = two_entries();
    let bytes = m.to_bytes().unwrap();
    let back = Model::from_bytes(&bytes).unwrap();
    assert_eq!(back, m);
    let names: Vec<&str> = back.entry_points().iter().map(|e| e.name).collect();
    assert_eq!(names, ["first", "second"]);
    let second = back.entry_point("second").unwrap();
    assert_eq!(second.meta.inputs[0].name, "x2");
    assert_eq!(second.meta.arena_size, back.meta.arena_size + 4096);
    assert_eq!(second.weights.len(), back.weights.len());
    // Both programs read every weight byte; the file holds them once.
    assert_eq!(second.weight_bytes_used(), back.main().weight_bytes_used());
    assert!(back.main().weight_bytes_used() > 0);
    let c = container::read(&bytes).unwrap();
    let names: Vec<&str> = c.sections.iter().map(|s| s.name).collect();
    for want in [".rbln.entries", ".rbln.entry.second.meta", ".rbln.entry.second.graph", ".rbln.entry.second.cmd.run", ".rbln.entry.second.reloc"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert_eq!(names.iter().filter(|n| n.contains("weights")).count(), 1, "{names:?}");
    // Relocating the second entry patches its own streams.
    let bases = RelocBases { arena: 0x10_0000, staging: 0x20_0000, descriptors: 0x30_0000, streams: vec![0x40_0000; 4], weights_source: 0x50_0000 };
    let r = second.relocate(&bases).unwrap();
    assert_eq!(r.streams.len(), second.program.streams.len());
    // A model without entries writes no table (its files read as before).
    let single = mlp_bytes();
    assert!(container::read(&single).unwrap().get(".rbln.entries").is_none());
    assert_eq!(Model::from_bytes(&single).unwrap().main_entry_name(), "main");
}

#[test]
fn an_entry_must_share_the_weights() {
    let mut other = mlp_model();
    other.meta.name = "b".into();
    other.weights[0] ^= 1;
    let e = Model::with_entries(mlp_model(), "a", vec![other]).unwrap_err();
    assert!(e.to_string().contains("does not carry the main program's weights"), "{e}");

    let mut m = two_entries();
    m.entries[0].meta.weights_offset = 4096;
    let e = assert_err_msg(Model::from_bytes(&m.to_bytes_unchecked().unwrap()), &["entries share one weights region"]);
    assert!(matches!(e, FormatError::BadEntries { .. }));
}

#[test]
fn entry_names_are_unique_section_words() {
    let mut m = two_entries();
    m.entries[0].meta.name = "first".into();
    let e = Model::from_bytes(&m.to_bytes_unchecked().unwrap()).unwrap_err();
    assert!(matches!(&e, FormatError::DuplicateName { kind: "entry point", name } if name == "first"), "{e}");
    let mut m = two_entries();
    m.entries[0].meta.name = "has space".into();
    assert_err_msg(Model::from_bytes(&m.to_bytes_unchecked().unwrap()), &["entry name 'has space'"]);
    let mut m = two_entries();
    m.main_entry = Some(String::new());
    assert!(matches!(m.validate(), Err(FormatError::BadEntries { .. })));
}

#[test]
fn an_invalid_entry_is_reported_as_that_entry() {
    let mut m = two_entries();
    m.entries[0].graph.nodes[1].inputs[0] = 999;
    let e = assert_err_msg(Model::from_bytes(&m.to_bytes_unchecked().unwrap()), &["entry point 'second'", "999"]);
    assert!(matches!(e, FormatError::InEntry { .. }));
    // A damaged entry section: the reader names the entry and the section.
    let b = patch_section(&two_entries().to_bytes().unwrap(), ".rbln.entry.second.graph", |d| d.truncate(d.len() - 3));
    assert_err_msg(Model::from_bytes(&b), &["entry point 'second'", ".rbln.entry.second.graph"]);
    // A listed entry whose sections are missing.
    let mut secs = sections(&two_entries().to_bytes().unwrap());
    secs.retain(|s| s.0 != ".rbln.entry.second.reloc");
    assert_err_msg(Model::from_bytes(&rewrap(&secs)), &["entry point 'second'", "required section .rbln.entry.second.reloc is missing"]);
    // Its weights_size must be the shared section's.
    let mut m = two_entries();
    m.weights.push(0);
    m.weights.extend_from_slice(&[0; 3]);
    let bytes = m.to_bytes_unchecked().unwrap();
    let mut secs = sections(&bytes);
    let w = secs.iter().find(|s| s.0 == ".rbln.weights").unwrap().2.len();
    secs.iter_mut().find(|s| s.0 == ".rbln.weights").unwrap().2.truncate(w - 4);
    let meta = &mut secs.iter_mut().find(|s| s.0 == ".rbln.meta").unwrap().2;
    // The main program's weights_size field follows magic, version, hw,
    // flags, name and producer, arena, staging, weights_offset.
    let at = 8 + 4 + 4 + 4 + (4 + 4) + (4 + 17) + 8 + 8 + 8;
    put_u64(meta, at, (w - 4) as u64);
    assert_err_msg(Model::from_bytes(&rewrap(&secs)), &["weights_size", "entry 'second'"]);
}

#[test]
fn unlisted_entry_sections_and_old_files_with_a_table_are_refused() {
    let mut secs = sections(&two_entries().to_bytes().unwrap());
    secs.push((".rbln.entry.ghost.meta".into(), 8, vec![0; 16]));
    let e = Model::from_bytes(&rewrap(&secs)).unwrap_err();
    assert!(matches!(&e, FormatError::UnknownSection { name, .. } if name == ".rbln.entry.ghost.meta"), "{e}");
    // Even a newer minor may not carry streams of an entry it does not list.
    let meta = &mut secs.iter_mut().find(|s| s.0 == ".rbln.meta").unwrap().2;
    meta[10] = 9;
    assert!(matches!(Model::from_bytes(&rewrap(&secs)), Err(FormatError::UnknownSection { .. })));
    // A minor-1 file knows no entry table.
    let mut secs = sections(&two_entries().to_bytes().unwrap());
    for s in secs.iter_mut().filter(|s| s.0.ends_with(".meta")) {
        s.2[10] = 1;
    }
    let e = Model::from_bytes(&rewrap(&secs)).unwrap_err();
    assert!(matches!(&e, FormatError::UnknownSection { name, .. } if name == ".rbln.entries"), "{e}");
}

#[test]
fn entries_need_minor_2_and_agree_on_the_version() {
    let mut m = two_entries();
    m.meta.version = Version { major: 1, minor: 1 };
    assert!(matches!(m.validate(), Err(FormatError::BadEntries { .. })));
    let mut m = two_entries();
    m.entries[0].meta.version = Version { major: 1, minor: 3 };
    let e = m.validate().unwrap_err();
    assert!(e.to_string().contains("format version 1.3"), "{e}");
}

#[test]
fn the_builder_stores_identical_weights_once() {
    let mut b = ModelBuilder::new("dedup");
    let w = b.add_weight_f32("w", &[4], &[1.0, 2.0, 3.0, 4.0]);
    let same = b.add_weight_f32("same", &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let other = b.add_weight_f32("other", &[4], &[1.0, 2.0, 3.0, 5.0]);
    assert_eq!(b.placement(w).unwrap().offset(), b.placement(same).unwrap().offset());
    assert_ne!(b.placement(w).unwrap().offset(), b.placement(other).unwrap().offset());
    assert_eq!(b.weights_len(), WEIGHT_ALIGN + 16);
    // A builder started from another's pool finds its weights there.
    let mut c = ModelBuilder::new("again");
    c.weight_pool(b.weights().clone());
    let again = c.add_weight_f32("again", &[4], &[1.0, 2.0, 3.0, 5.0]);
    assert_eq!(c.placement(again).unwrap().offset(), b.placement(other).unwrap().offset());
    assert_eq!(c.weights_len(), b.weights_len());
}
