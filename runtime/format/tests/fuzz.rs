//! The parser's fuzz target, run by `cargo test` (and so by `make test`)
//! for a bounded number of seeded random cases per strategy:
//!
//! - `RBLN_FUZZ_CASES` (default 500): cases per strategy;
//! - `RBLN_FUZZ_SEED` (default 0x5eed, decimal or 0x-hex): base seed;
//! - `RBLN_FUZZ_REPLAY=<file>`: parse that one file (a saved failure).
//!
//! Every case must return Ok or Err, never panic; a panicking input is
//! saved under the cargo target tmp dir and its path printed. Strategies
//! go from blind (random bytes, truncations, bit flips, header edits) to
//! structure-aware (section edits with repaired checksums, edits of the
//! decoded model) so the deep validation paths are exercised too.

mod common;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use common::*;
use rbln_format::*;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
        }
        Err(_) => default,
    }
}

fn cases() -> u64 {
    env_u64("RBLN_FUZZ_CASES", 500)
}

/// splitmix64: small, seedable, good enough to drive mutations.
struct Rng(u64);

impl Rng {
    fn new(strategy: u64) -> Self {
        Rng(env_u64("RBLN_FUZZ_SEED", 0x5eed) ^ strategy.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn idx(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
    /// A value likely to hit an edge case, relative to `around`.
    fn interesting(&mut self, around: u64) -> u64 {
        match self.below(12) {
            0 => 0,
            1 => 1,
            2 => u64::MAX,
            3 => u32::MAX as u64,
            4 => i64::MAX as u64,
            5 => around,
            6 => around.wrapping_add(1),
            7 => around.wrapping_sub(1),
            8 => around.wrapping_add(8),
            9 => 1 << self.below(64),
            10 => self.below(4096),
            _ => self.next(),
        }
    }
}

#[derive(Default)]
struct Stats {
    ok: u64,
    err: BTreeMap<String, u64>,
}

impl Stats {
    fn report(&self, strategy: &str) {
        eprintln!("fuzz {strategy}: {} ok, errors {:?}", self.ok, self.err);
    }
    fn errors_other_than(&self, kinds: &[&str]) -> u64 {
        self.err.iter().filter(|(k, _)| !kinds.contains(&k.as_str())).map(|(_, n)| n).sum()
    }
}

fn variant(e: &FormatError) -> String {
    let d = format!("{e:?}");
    d.split(|c: char| !c.is_alphanumeric()).next().unwrap_or_default().to_string()
}

/// Parse `input`; a panic fails the test with a reproducible report.
fn run(input: &[u8], strategy: &str, case: u64, stats: &mut Stats) -> Option<FormatError> {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let r = Model::from_bytes(input);
        if let Ok(m) = &r {
            // Whatever the reader accepts, the writer reproduces exactly,
            // and relocating it works.
            let again = m.to_bytes().expect("a model the reader accepted must pass the writer's checks");
            assert_eq!(&Model::from_bytes(&again).expect("re-read"), m);
            let bases = RelocBases {
                arena: 1 << 32,
                staging: 2 << 32,
                descriptors: 3 << 32,
                streams: (0..m.program.streams.len() as u64).map(|i| (4 + i) << 32).collect(),
                weights_source: 5 << 32,
            };
            m.relocate(&bases).expect("relocating an accepted model");
        }
        if let Err(e) = &r {
            let _ = e.to_string();
        }
        r
    }));
    match r {
        Ok(Ok(_)) => {
            stats.ok += 1;
            None
        }
        Ok(Err(e)) => {
            *stats.err.entry(variant(&e)).or_default() += 1;
            Some(e)
        }
        Err(_) => {
            let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
            let path = dir.join(format!("rbln-fuzz-{strategy}-{case}.rbln"));
            let _ = std::fs::write(&path, input);
            panic!(
                "the reader panicked on {strategy} case {case} (RBLN_FUZZ_SEED={:#x}); input saved to {} \
                 (replay with RBLN_FUZZ_REPLAY={})",
                env_u64("RBLN_FUZZ_SEED", 0x5eed),
                path.display(),
                path.display()
            );
        }
    }
}

#[test]
fn replay() {
    if let Ok(path) = std::env::var("RBLN_FUZZ_REPLAY") {
        let bytes = std::fs::read(&path).unwrap();
        let r = Model::from_bytes(&bytes);
        eprintln!("replay {path}: {:?}", r.as_ref().map(|_| "Ok"));
    }
}

#[test]
fn random_bytes() {
    let mut rng = Rng::new(1);
    let mut stats = Stats::default();
    for case in 0..cases() {
        let max = if rng.chance(4) { 8192 } else { 256 };
        let len = rng.idx(max);
        let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Often a plausible ELF identification, so later checks are reached.
        if rng.chance(2) && b.len() >= 64 {
            b[..8].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
            b[16..20].copy_from_slice(&[1, 0, 0, 0]);
            b[20..24].copy_from_slice(&1u32.to_le_bytes());
            if rng.chance(2) {
                b[52..54].copy_from_slice(&64u16.to_le_bytes());
                b[56..58].copy_from_slice(&[0, 0]);
                b[58..60].copy_from_slice(&64u16.to_le_bytes());
                let shnum = rng.below(8) as u16 + 1;
                b[60..62].copy_from_slice(&shnum.to_le_bytes());
                b[62..64].copy_from_slice(&(rng.below(shnum as u64) as u16).to_le_bytes());
                put_u64(&mut b, 40, rng.below(len as u64));
                b[48..52].copy_from_slice(&[0; 4]);
            }
        }
        run(&b, "random_bytes", case, &mut stats);
    }
    stats.report("random_bytes");
    assert_eq!(stats.ok, 0, "random bytes parsed as a model");
}

#[test]
fn truncations() {
    let base = mlp_bytes();
    let mut rng = Rng::new(2);
    let mut stats = Stats::default();
    for case in 0..cases() {
        let cut = rng.idx(base.len());
        run(&base[..cut], "truncations", case, &mut stats);
    }
    stats.report("truncations");
    assert_eq!(stats.ok, 0, "a truncated file was accepted");
}

#[test]
fn bit_flips() {
    let base = mlp_bytes();
    let mut rng = Rng::new(3);
    let mut stats = Stats::default();
    for case in 0..cases() {
        let mut b = base.clone();
        let flips = 1 + rng.below(8);
        for _ in 0..flips {
            let at = rng.idx(b.len());
            b[at] ^= 1 << rng.below(8);
        }
        // A flip can cancel an earlier one; count only real changes.
        let changed = b != base;
        let e = run(&b, "bit_flips", case, &mut stats);
        if changed {
            assert!(e.is_some(), "case {case}: a corrupted file was accepted");
        }
    }
    stats.report("bit_flips");
}

#[test]
fn header_edits() {
    let base = mlp_bytes();
    let shnum = u16::from_le_bytes([base[60], base[61]]) as u32;
    let mut rng = Rng::new(4);
    let mut stats = Stats::default();
    for case in 0..cases() {
        let mut b = base.clone();
        for _ in 0..1 + rng.below(3) {
            if rng.chance(4) {
                // ELF header fields (offset, width).
                const F: [(usize, usize); 12] = [
                    (16, 2),
                    (18, 2),
                    (20, 4),
                    (24, 8),
                    (32, 8),
                    (40, 8),
                    (48, 4),
                    (52, 2),
                    (56, 2),
                    (58, 2),
                    (60, 2),
                    (62, 2),
                ];
                let (at, w) = F[rng.idx(F.len())];
                let old = le(&b[at..at + w]);
                let v = rng.interesting(old);
                b[at..at + w].copy_from_slice(&v.to_le_bytes()[..w]);
            } else {
                // A section header field: name, type, flags, offset, size, align.
                const F: [(usize, usize); 6] = [(0, 4), (4, 4), (8, 8), (24, 8), (32, 8), (48, 8)];
                let (fo, w) = F[rng.idx(F.len())];
                let at = shdr_field(&base, rng.below(shnum as u64) as u32, fo);
                let old = le(&b[at..at + w]);
                // Offsets and sizes: also try values around the file size.
                let around = if (fo == 24 || fo == 32) && rng.chance(2) { base.len() as u64 } else { old };
                let v = rng.interesting(around);
                b[at..at + w].copy_from_slice(&v.to_le_bytes()[..w]);
            }
        }
        let changed = b != base;
        let e = run(&b, "header_edits", case, &mut stats);
        if changed {
            assert!(e.is_some(), "case {case}: an edited file was accepted");
        }
    }
    stats.report("header_edits");
}

fn le(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(a)
}

#[test]
fn section_edits_with_valid_checksums() {
    let base = mlp_bytes();
    let secs = sections(&base);
    let mut rng = Rng::new(5);
    let mut stats = Stats::default();
    for case in 0..cases() {
        let mut s = secs.clone();
        let i = rng.idx(s.len());
        let d = &mut s[i].2;
        for _ in 0..1 + rng.below(3) {
            match rng.below(8) {
                0 if !d.is_empty() => {
                    let at = rng.idx(d.len());
                    d[at] ^= 1 << rng.below(8);
                }
                1 if d.len() >= 4 => {
                    let at = rng.idx(d.len() - 3);
                    let v = rng.interesting(le(&d[at..at + 4])) as u32;
                    put_u32(d, at, v);
                }
                2 if d.len() >= 8 => {
                    let at = rng.idx(d.len() - 7) & !3;
                    let v = rng.interesting(le(&d[at..at + 8]));
                    put_u64(d, at, v);
                }
                3 => {
                    let n = rng.idx(d.len() + 1);
                    d.truncate(n);
                }
                4 => {
                    let n = rng.idx(64);
                    let extra: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                    let at = rng.idx(d.len() + 1);
                    d.splice(at..at, extra);
                }
                5 if !d.is_empty() => {
                    let a = rng.idx(d.len());
                    let b = (a + rng.idx(16)).min(d.len());
                    d.drain(a..b);
                }
                6 if !d.is_empty() => {
                    let at = rng.idx(d.len());
                    d[at] = rng.interesting(d[at] as u64) as u8;
                }
                _ => {
                    // Drop or duplicate a whole section.
                    if rng.chance(2) {
                        s.remove(i);
                    } else {
                        let dup = s[i].clone();
                        s.push(dup);
                    }
                    break;
                }
            }
        }
        run(&rewrap(&s), "section_edits", case, &mut stats);
    }
    stats.report("section_edits");
    // The harness must get past the checksums into the section parsers.
    assert!(stats.errors_other_than(&["ChecksumMismatch", "FileChecksumMismatch"]) > cases() / 2, "{:?}", stats.err);
    assert!(stats.err.len() >= 8, "too few distinct errors reached: {:?}", stats.err);
}

/// Random semantic edits of the decoded model.
fn mutate_model(m: &mut Model, rng: &mut Rng) {
    if m.graph.nodes.is_empty() {
        m.graph.nodes.push(Node::view("v", 0, 0));
        return;
    }
    let nt = m.graph.tensors.len().max(1);
    let nn = m.graph.nodes.len().max(1);
    match rng.below(22) {
        0 => {
            let t = &mut m.graph.tensors[rng.idx(nt)];
            let (o, s) = (t.placement.offset(), t.placement.size());
            let (o, s) = if rng.chance(2) { (rng.interesting(o), s) } else { (o, rng.interesting(s)) };
            t.placement = Placement::from_code(rng.below(3) as u8, o, s).unwrap();
        }
        1 => {
            let t = &mut m.graph.tensors[rng.idx(nt)];
            if !t.shape.is_empty() && rng.chance(2) {
                let k = rng.idx(t.shape.len());
                t.shape[k] = rng.interesting(t.shape[k]);
            } else {
                t.shape.push(rng.interesting(1));
            }
        }
        2 => m.graph.tensors[rng.idx(nt)].dtype = DType::from_u8(1 + rng.below(8) as u8).unwrap(),
        3 => {
            let n = &mut m.graph.nodes[rng.idx(nn)];
            let list = if rng.chance(2) { &mut n.inputs } else { &mut n.outputs };
            if !list.is_empty() && rng.chance(2) {
                let k = rng.idx(list.len());
                list[k] = rng.below(nt as u64 + 2) as u32;
            } else if rng.chance(2) {
                list.push(rng.below(nt as u64 + 2) as u32);
            } else {
                list.clear();
            }
        }
        4 => m.graph.nodes[rng.idx(nn)].kind = NodeKind::from_u8(rng.below(4) as u8).unwrap(),
        5 => {
            let n = &mut m.graph.nodes[rng.idx(nn)];
            n.commands = match n.commands {
                Some(c) if rng.chance(4) => Some(CmdRange { stream: rng.below(6) as u32, ..c }),
                Some(c) if rng.chance(2) => Some(CmdRange { offset: rng.interesting(c.offset) & !3, ..c }),
                Some(c) if rng.chance(2) => Some(CmdRange { len: rng.interesting(c.len), ..c }),
                _ => None,
            }
        }
        6 => {
            let n = &mut m.graph.nodes[rng.idx(nn)];
            n.descriptors = Some(DescRange { offset: rng.interesting(0) & !3, len: rng.interesting(96) });
        }
        7 => {
            let (a, b) = (rng.idx(nn), rng.idx(nn));
            m.graph.nodes.swap(a, b);
        }
        8 => {
            let k = rng.idx(nn);
            if rng.chance(2) {
                m.graph.nodes.remove(k);
            } else {
                let dup = m.graph.nodes[k].clone();
                m.graph.nodes.insert(rng.idx(nn), dup);
            }
        }
        9 if !m.program.relocations.is_empty() => {
            let k = rng.idx(m.program.relocations.len());
            let r = &mut m.program.relocations[k];
            match rng.below(4) {
                0 => r.offset = rng.interesting(r.offset),
                1 => r.addend = rng.interesting(r.addend),
                2 => r.target = RelocTarget::from_code(rng.below(6) as u32),
                _ => r.kind = RelocKind::from_code(1 + rng.below(5) as u32, rng.below(6) as u32).unwrap(),
            }
        }
        10 if !m.program.relocations.is_empty() => {
            let (a, b) = (rng.idx(m.program.relocations.len()), rng.idx(m.program.relocations.len()));
            m.program.relocations.swap(a, b);
        }
        11 => {
            let s = rng.idx(m.program.streams.len());
            m.program.streams[s].role = StreamRole::from_u8(rng.below(5) as u8).unwrap();
        }
        12 => {
            let s = rng.idx(m.program.streams.len());
            let b = &mut m.program.streams[s].bytes;
            if !b.is_empty() {
                let at = rng.idx(b.len());
                b[at] = rng.next() as u8;
            }
        }
        13 => {
            let d = &mut m.program.descriptors;
            if !d.is_empty() {
                let at = rng.idx(d.len()) & !3;
                let v = rng.interesting(0) as u32;
                if at + 4 <= d.len() {
                    put_u32(d, at, v);
                }
            }
        }
        14 => m.meta.arena_size = rng.interesting(m.meta.arena_size),
        15 => m.meta.staging_size = rng.interesting(m.meta.staging_size),
        16 => m.meta.weights_offset = rng.interesting(m.meta.weights_offset),
        17 => {
            let list = if rng.chance(2) { &mut m.meta.inputs } else { &mut m.meta.outputs };
            if let Some(b) = list.first_mut() {
                match rng.below(4) {
                    0 => b.tensor = rng.below(nt as u64 + 1) as u32,
                    1 => b.shape.push(1),
                    2 => b.placement = Placement::Arena { offset: b.placement.offset(), size: b.placement.size() },
                    _ => b.dtype = DType::I64,
                }
            }
        }
        18 => {
            if let Some(p) = m.profile.as_mut() {
                if !p.is_empty() {
                    let k = rng.idx(p.len());
                    p[k].node = rng.below(nn as u64 + 1) as u32;
                }
            }
        }
        19 => {
            let len = rng.idx(m.weights.len() + 64);
            m.weights.resize(len, 0);
        }
        20 => {
            // A view between random tensors.
            let (a, b) = (rng.below(nt as u64) as u32, rng.below(nt as u64) as u32);
            m.graph.nodes.insert(rng.idx(nn + 1), Node::view("v", a, b));
        }
        _ => m.meta.ops.first_mut().into_iter().for_each(|o| o.count = rng.below(4) as u32),
    }
}

#[test]
fn model_edits() {
    let base = mlp_model();
    let mut rng = Rng::new(6);
    let mut stats = Stats::default();
    let mut agree = 0u64;
    for case in 0..cases() {
        let mut m = base.clone();
        for _ in 0..1 + rng.below(3) {
            mutate_model(&mut m, &mut rng);
        }
        let verdict =
            catch_unwind(AssertUnwindSafe(|| m.validate().err().map(|e| e.to_string()))).unwrap_or_else(|_| {
                panic!("Model::validate panicked on model_edits case {case}: {m:?}");
            });
        let bytes = m.to_bytes_unchecked().unwrap();
        let e = run(&bytes, "model_edits", case, &mut stats);
        // The writer's check and the reader agree: a model passes
        // validate() exactly when its file reads back as the same model.
        // (A model the file cannot represent, e.g. an empty descriptor
        // range, fails validate() and reads back as a different model.)
        let same = e.is_none() && Model::from_bytes(&bytes).is_ok_and(|back| back == m);
        assert_eq!(verdict.is_none(), same, "case {case}: validate() said {verdict:?}, the reader said {e:?}");
        agree += 1;
    }
    stats.report("model_edits");
    assert_eq!(agree, cases());
    assert!(stats.err.len() >= 12, "too few distinct errors reached: {:?}", stats.err);
}
