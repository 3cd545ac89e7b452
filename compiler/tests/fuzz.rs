//! The compiler's fuzz targets: ONNX, TFLite and TTIR inputs mutated from
//! seeds, each of which must compile or fail with an error — never panic,
//! hang or exhaust memory. `cargo test` (and so `make test`) runs a
//! bounded number of cases; `make fuzz` runs 10^6 per target.
//!
//! - `RBLN_FUZZ_CASES` (default 300): cases per target;
//! - `RBLN_FUZZ_SEED` (default 0x5eed): base seed;
//! - `RBLN_FUZZ_CORPUS`: colon-separated directories whose `.onnx`,
//!   `.tflite` and `.ttir` files join the built-in seeds (make fuzz passes
//!   the test models of target/onnx, target/tflite, target/triton, ...);
//! - `RBLN_FUZZ_REPLAY=<file>`: compile that one file (a saved crash).
//!
//! A panicking input is saved under `target/fuzz-crashes/` and named in
//! the failure; a crash found becomes a regression test (bad_models.rs
//! style) before it is fixed.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Instant;

use prost::Message;
use rbln_compile::onnx::*;
use rbln_compile::ttir::{Binding, Scalar, Type};
use rbln_compile::{compile, compile_kernel, Options};

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

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.next().is_multiple_of(one_in)
    }
    /// Values that break code: bounds, signs, powers of two, huge.
    fn interesting_i64(&mut self) -> i64 {
        const V: [i64; 14] = [0, 1, -1, 2, 3, 7, 8, 255, 256, 65535, i32::MAX as i64, i32::MIN as i64, i64::MAX, i64::MIN];
        if self.chance(3) { (self.next() % 1000) as i64 - 500 } else { V[self.below(V.len())] }
    }
}

/// Byte-level mutations: flips, interesting bytes, truncation, deletion,
/// duplication, splicing another seed in.
fn mutate_bytes(r: &mut Rng, b: &mut Vec<u8>, other: &[u8]) {
    for _ in 0..1 + r.below(4) {
        if b.is_empty() {
            b.extend_from_slice(&other[..other.len().min(64)]);
            continue;
        }
        let i = r.below(b.len());
        match r.below(8) {
            0 => b[i] ^= 1 << r.below(8),
            1 => b[i] = [0, 0xff, 0x7f, 0x80, 0x01][r.below(5)],
            2 => b.truncate(i),
            3 => {
                let n = r.below(32).min(b.len() - i);
                b.drain(i..i + n);
            }
            4 => {
                let n = r.below(32).min(b.len() - i);
                let chunk = b[i..i + n].to_vec();
                let at = r.below(b.len());
                b.splice(at..at, chunk);
            }
            5 if !other.is_empty() => {
                let j = r.below(other.len());
                let n = r.below(64).min(other.len() - j).min(b.len() - i);
                b[i..i + n].copy_from_slice(&other[j..j + n]);
            }
            6 if i + 8 <= b.len() => b[i..i + 8].copy_from_slice(&r.interesting_i64().to_le_bytes()),
            _ => b[i] = r.next() as u8,
        }
    }
}

/// Structure-aware ONNX mutations on the decoded model: attributes, dims,
/// data types, wiring and op types change while the protobuf stays valid,
/// so the importer's and passes' checks are what gets exercised.
fn mutate_onnx(r: &mut Rng, m: &mut ModelProto) {
    let Some(g) = m.graph.as_mut() else { return };
    const OPS: [&str; 24] = [
        "Conv", "MatMul", "Gemm", "Add", "Mul", "Relu", "Reshape", "Transpose", "Concat", "Slice", "Gather", "Softmax", "MaxPool",
        "AveragePool", "BatchNormalization", "LayerNormalization", "Resize", "Pad", "Split", "Squeeze", "Unsqueeze", "Expand", "Where", "Cast",
    ];
    for _ in 0..1 + r.below(3) {
        match r.below(9) {
            0 if !g.node.is_empty() => {
                let n = r.below(g.node.len());
                g.node[n].op_type = OPS[r.below(OPS.len())].into();
            }
            1 if !g.node.is_empty() => {
                let n = r.below(g.node.len());
                if let Some(a) = g.node[n].attribute.first_mut() {
                    a.i = r.interesting_i64();
                    for v in a.ints.iter_mut() {
                        if r.chance(2) {
                            *v = r.interesting_i64();
                        }
                    }
                    if r.chance(4) {
                        a.ints.truncate(r.below(a.ints.len() + 1));
                    }
                    if r.chance(5) {
                        a.f = [f32::NAN, f32::INFINITY, -0.0, 1e30, -1.0][r.below(5)];
                    }
                }
            }
            2 if !g.initializer.is_empty() => {
                let t = r.below(g.initializer.len());
                let init = &mut g.initializer[t];
                let k = r.below(init.dims.len().max(1));
                if let Some(d) = init.dims.get_mut(k) {
                    *d = r.interesting_i64();
                } else {
                    init.dims.push(r.interesting_i64());
                }
            }
            3 if !g.initializer.is_empty() => {
                let t = r.below(g.initializer.len());
                let init = &mut g.initializer[t];
                init.float_data.truncate(r.below(init.float_data.len() + 1));
                init.raw_data.truncate(r.below(init.raw_data.len() + 1));
                init.int64_data.truncate(r.below(init.int64_data.len() + 1));
                if r.chance(3) {
                    init.data_type = r.below(17) as i32;
                }
            }
            4 if !g.input.is_empty() => {
                let i = r.below(g.input.len());
                if let Some(tt) = g.input[i].r#type.as_mut().and_then(|t| t.tensor_type.as_mut()) {
                    if r.chance(3) {
                        tt.elem_type = r.below(17) as i32;
                    }
                    if let Some(s) = tt.shape.as_mut() {
                        let k = r.below(s.dim.len().max(1));
                        if let Some(d) = s.dim.get_mut(k) {
                            d.dim_value = Some(r.interesting_i64());
                        } else {
                            s.dim.push(Dimension { dim_value: Some(r.interesting_i64()), dim_param: None });
                        }
                    }
                }
            }
            5 if g.node.len() > 1 => {
                // Rewire an input to some other value (maybe a later one:
                // a cycle, or one that does not exist).
                let n = r.below(g.node.len());
                let from = r.below(g.node.len());
                let k = r.below(g.node[n].input.len() + 1);
                if let Some(v) = g.node[from].output.first().cloned() {
                    if k < g.node[n].input.len() {
                        g.node[n].input[k] = v;
                    } else {
                        g.node[n].input.push(v);
                    }
                }
            }
            6 if !g.node.is_empty() => {
                let n = r.below(g.node.len());
                if r.chance(2) {
                    g.node.remove(n);
                } else {
                    let dup = g.node[n].clone();
                    g.node.insert(r.below(g.node.len()), dup);
                }
            }
            7 if !g.node.is_empty() => {
                let n = r.below(g.node.len());
                let ins = &mut g.node[n].input;
                if r.chance(2) {
                    ins.truncate(r.below(ins.len() + 1));
                } else {
                    ins.push(String::new());
                }
            }
            _ => {
                if let Some(o) = m.opset_import.first_mut() {
                    o.version = [1, 7, 11, 13, 17, 21, 99][r.below(7)];
                }
            }
        }
    }
}

/// TTIR text mutations: lines dropped, duplicated or swapped, numbers and
/// identifiers replaced, the text cut short.
fn mutate_ttir(r: &mut Rng, text: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    for _ in 0..1 + r.below(3) {
        if lines.is_empty() {
            break;
        }
        let i = r.below(lines.len());
        match r.below(6) {
            0 => {
                lines.remove(i);
            }
            1 => {
                let l = lines[i].clone();
                lines.insert(r.below(lines.len()), l);
            }
            2 => {
                let j = r.below(lines.len());
                lines.swap(i, j);
            }
            3 => {
                // Replace the first number on the line.
                let l = &lines[i];
                if let Some(s) = l.find(|c: char| c.is_ascii_digit()) {
                    let e = l[s..].find(|c: char| !c.is_ascii_digit()).map_or(l.len(), |e| s + e);
                    lines[i] = format!("{}{}{}", &l[..s], r.interesting_i64(), &l[e..]);
                }
            }
            4 => {
                // Replace an SSA name with another line's.
                let j = r.below(lines.len());
                if let (Some(a), Some(b)) = (lines[i].find('%'), lines[j].find('%')) {
                    let take = |l: &str, at: usize| l[at..].split(|c: char| !(c.is_alphanumeric() || c == '%' || c == '_')).next().unwrap_or("").to_string();
                    let (from, to) = (take(&lines[i], a), take(&lines[j], b));
                    lines[i] = lines[i].replacen(&from, &to, 1);
                }
            }
            _ => {
                let cut = r.below(lines[i].len() + 1);
                let mut c = cut;
                while !lines[i].is_char_boundary(c) {
                    c -= 1;
                }
                lines[i].truncate(c);
            }
        }
    }
    lines.join("\n")
}

/// A built-in ONNX seed: Conv -> Relu -> MaxPool -> Reshape -> Gemm ->
/// Softmax, with initializers and attributes to mutate.
fn onnx_seed() -> Vec<u8> {
    let vinfo = |name: &str, dims: &[i64]| ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: elem::FLOAT,
                shape: Some(TensorShapeProto { dim: dims.iter().map(|&d| Dimension { dim_value: Some(d), dim_param: None }).collect() }),
            }),
        }),
    };
    let t = |name: &str, dims: &[i64]| {
        let n: i64 = dims.iter().product();
        TensorProto { name: name.into(), dims: dims.to_vec(), data_type: elem::FLOAT, float_data: (0..n).map(|i| (i % 7) as f32 * 0.1).collect(), ..Default::default() }
    };
    let ai = |name: &str, v: &[i64]| AttributeProto { name: name.into(), ints: v.to_vec(), r#type: 7, ..Default::default() };
    let node = |op: &str, ins: &[&str], out: &str, attrs: Vec<AttributeProto>| NodeProto {
        op_type: op.into(),
        name: out.into(),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        attribute: attrs,
        ..Default::default()
    };
    let shape = TensorProto { name: "shape".into(), dims: vec![2], data_type: elem::INT64, int64_data: vec![1, -1], ..Default::default() };
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 17 }],
        graph: Some(GraphProto {
            node: vec![
                node("Conv", &["x", "w", "b"], "c", vec![ai("kernel_shape", &[3, 3]), ai("pads", &[1, 1, 1, 1])]),
                node("Relu", &["c"], "r", vec![]),
                node("MaxPool", &["r"], "p", vec![ai("kernel_shape", &[2, 2]), ai("strides", &[2, 2])]),
                node("Reshape", &["p", "shape"], "f", vec![]),
                node("Gemm", &["f", "fw", "fb"], "g", vec![AttributeProto { name: "transB".into(), i: 1, r#type: 2, ..Default::default() }]),
                node("Softmax", &["g"], "y", vec![]),
            ],
            initializer: vec![t("w", &[4, 2, 3, 3]), t("b", &[4]), t("fw", &[5, 64]), t("fb", &[5]), shape],
            input: vec![vinfo("x", &[1, 2, 8, 8])],
            output: vec![vinfo("y", &[1, 5])],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// Built-in TTIR seed: a vector add as triton prints it.
const TTIR_SEED: &str = r#"module {
  tt.func public @add_kernel(%x_ptr: !tt.ptr<f32>, %y_ptr: !tt.ptr<f32>, %out_ptr: !tt.ptr<f32>, %n: i32) {
    %c64_i32 = arith.constant 64 : i32
    %pid = tt.get_program_id x : i32
    %start = arith.muli %pid, %c64_i32 : i32
    %range = tt.make_range {end = 64 : i32, start = 0 : i32} : tensor<64xi32>
    %s = tt.splat %start : i32 -> tensor<64xi32>
    %offs = arith.addi %s, %range : tensor<64xi32>
    %ns = tt.splat %n : i32 -> tensor<64xi32>
    %mask = arith.cmpi slt, %offs, %ns : tensor<64xi32>
    %xp = tt.splat %x_ptr : !tt.ptr<f32> -> tensor<64x!tt.ptr<f32>>
    %xa = tt.addptr %xp, %offs : tensor<64x!tt.ptr<f32>>, tensor<64xi32>
    %x = tt.load %xa, %mask : tensor<64x!tt.ptr<f32>>
    %yp = tt.splat %y_ptr : !tt.ptr<f32> -> tensor<64x!tt.ptr<f32>>
    %ya = tt.addptr %yp, %offs : tensor<64x!tt.ptr<f32>>, tensor<64xi32>
    %y = tt.load %ya, %mask : tensor<64x!tt.ptr<f32>>
    %sum = arith.addf %x, %y : tensor<64xf32>
    %op = tt.splat %out_ptr : !tt.ptr<f32> -> tensor<64x!tt.ptr<f32>>
    %oa = tt.addptr %op, %offs : tensor<64x!tt.ptr<f32>>, tensor<64xi32>
    tt.store %oa, %sum, %mask : tensor<64x!tt.ptr<f32>>
    tt.return
  }
}
"#;

/// Seed files with extension `ext` from `RBLN_FUZZ_CORPUS`.
fn corpus(ext: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for dir in std::env::var("RBLN_FUZZ_CORPUS").unwrap_or_default().split(':').filter(|d| !d.is_empty()) {
        let Ok(rd) = std::fs::read_dir(dir) else { continue };
        let mut paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == ext)).collect();
        paths.sort();
        // Small files only: a case must be cheap for 10^6 of them.
        out.extend(paths.iter().filter_map(|p| std::fs::read(p).ok()).filter(|b| b.len() <= 256 << 10));
    }
    out
}

/// Run `cases` mutated inputs through `target`; panics are collected,
/// saved and reported together.
fn run(name: &str, seeds: &[Vec<u8>], mutate: impl Fn(&mut Rng, &[u8], &[u8]) -> Vec<u8>, target: impl Fn(&[u8])) {
    let cases = env_u64("RBLN_FUZZ_CASES", 300);
    let mut r = Rng(env_u64("RBLN_FUZZ_SEED", 0x5eed) ^ name.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64)));
    let mut crashes = Vec::new();
    let t0 = Instant::now();
    // Quiet the default panic hook's message per crash; reported below.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for case in 0..cases {
        let seed = &seeds[r.below(seeds.len())];
        let other = &seeds[r.below(seeds.len())];
        let input = mutate(&mut r, seed, other);
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| target(&input))) {
            let why = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../fuzz-crashes");
            let _ = std::fs::create_dir_all(&dir);
            let path = dir.join(format!("{name}-{case}.bin"));
            let _ = std::fs::write(&path, &input);
            crashes.push(format!("case {case}: {why} (input saved to {})", path.display()));
            if crashes.len() >= 20 {
                break;
            }
        }
    }
    std::panic::set_hook(hook);
    let s = t0.elapsed().as_secs_f64();
    println!("fuzz {name}: {cases} cases from {} seeds in {s:.1} s ({:.0}/s), {} crashes", seeds.len(), cases as f64 / s, crashes.len());
    assert!(crashes.is_empty(), "{name}: inputs that panicked:\n{}", crashes.join("\n"));
}

fn compile_any(bytes: &[u8]) {
    let _ = compile(bytes, "fuzz", &Options::default());
}

#[test]
fn onnx_inputs_never_panic() {
    if let Ok(path) = std::env::var("RBLN_FUZZ_REPLAY") {
        return compile_any(&std::fs::read(path).unwrap());
    }
    let mut seeds = corpus("onnx");
    seeds.push(onnx_seed());
    run(
        "onnx",
        &seeds,
        |r, seed, other| {
            // Half blind, half structure-aware.
            if r.chance(2) {
                if let Ok(mut m) = ModelProto::decode(seed) {
                    mutate_onnx(r, &mut m);
                    return m.encode_to_vec();
                }
            }
            let mut b = seed.to_vec();
            mutate_bytes(r, &mut b, other);
            b
        },
        compile_any,
    );
}

#[test]
fn tflite_inputs_never_panic() {
    let seeds = corpus("tflite");
    if seeds.is_empty() {
        println!("fuzz tflite: no seeds (set RBLN_FUZZ_CORPUS to a directory of .tflite files, as make fuzz does)");
        return;
    }
    run(
        "tflite",
        &seeds,
        |r, seed, other| {
            let mut b = seed.to_vec();
            // Mostly in the flatbuffer's tables (the head of the file), not
            // in weight bytes, where a change only changes numbers.
            if r.chance(4) || b.len() < 4096 {
                mutate_bytes(r, &mut b, other);
            } else {
                let mut head = b[..4096].to_vec();
                mutate_bytes(r, &mut head, other);
                b.splice(..4096, head);
            }
            b
        },
        compile_any,
    );
}

/// Compile a TTIR kernel with a launch built from its own signature:
/// 4096-element tensors for pointers, 4096 for integers, 0.5 for floats.
fn compile_ttir(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else { return };
    let Ok(m) = rbln_compile::ttir::parse(text) else { return };
    let Some(f) = m.funcs.first() else { return };
    let bindings: Vec<Binding> = f
        .args
        .iter()
        .map(|(name, t)| match t {
            Type::Ptr(_) => Binding::Tensor { name: name.trim_start_matches('%').to_string(), shape: vec![4096] },
            Type::Float(_) | Type::BFloat => Binding::Scalar(Scalar::Float(0.5)),
            _ => Binding::Scalar(Scalar::Int(4096)),
        })
        .collect();
    let _ = compile_kernel(text, None, [4, 1, 1], &bindings);
}

#[test]
fn ttir_inputs_never_panic() {
    let mut seeds = corpus("ttir");
    seeds.push(TTIR_SEED.as_bytes().to_vec());
    run(
        "ttir",
        &seeds,
        |r, seed, other| {
            if r.chance(5) {
                let mut b = seed.to_vec();
                mutate_bytes(r, &mut b, other);
                b
            } else {
                mutate_ttir(r, &String::from_utf8_lossy(seed)).into_bytes()
            }
        },
        compile_ttir,
    );
}
