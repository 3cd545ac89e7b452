//! Host tests of the TFLite front end on models built here with the
//! flatbuffers builder: a valid model compiles, and truncated, bit-flipped
//! or inconsistent files fail with a `CompileError`, never a panic.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::ops::{OptionsRef, SUPPORTED};
use super::*;
use crate::{compile, compile_tflite, Options};

/// Builtin options of an operator, as the test writes them.
#[derive(Clone)]
enum Opt {
    /// Conv2DOptions (union type 1): padding, stride_w, stride_h, activation.
    Conv(i8, i32, i32, i8),
    /// AddOptions (union type 11): activation.
    Add(i8),
}

#[derive(Clone)]
struct BufSpec {
    data: Vec<u8>,
    /// Store the data after the flatbuffer (Buffer.offset/size).
    external: bool,
}

#[derive(Clone)]
struct Spec {
    /// (shape, type, buffer, name)
    tensors: Vec<(Vec<i32>, i8, u32, String)>,
    buffers: Vec<BufSpec>,
    /// (builtin code, custom code)
    codes: Vec<(i32, Option<String>)>,
    /// (opcode index, inputs, outputs, options)
    ops: Vec<(u32, Vec<i32>, Vec<i32>, Opt)>,
    inputs: Vec<i32>,
    outputs: Vec<i32>,
    /// Quantisation parameters: (tensor, scales, zero points, dimension).
    quant: Vec<(usize, Vec<f32>, Vec<i64>, i32)>,
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// x [1,4,4,2] -> CONV_2D (3 filters 1x1, bias, RELU, SAME) -> y [1,4,4,3]
/// -> ADD [3] constant -> z [1,4,4,3].
fn spec() -> Spec {
    let filter: Vec<f32> = (0..6).map(|i| i as f32 * 0.25 - 0.5).collect();
    Spec {
        tensors: vec![
            (vec![1, 4, 4, 2], ty::FLOAT32, 0, "x".into()),
            (vec![3, 1, 1, 2], ty::FLOAT32, 1, "filter".into()),
            (vec![3], ty::FLOAT32, 2, "bias".into()),
            (vec![1, 4, 4, 3], ty::FLOAT32, 0, "y".into()),
            (vec![3], ty::FLOAT32, 3, "c".into()),
            (vec![1, 4, 4, 3], ty::FLOAT32, 0, "z".into()),
        ],
        buffers: vec![
            BufSpec { data: vec![], external: false },
            BufSpec { data: f32_bytes(&filter), external: false },
            BufSpec { data: f32_bytes(&[0.1, -0.2, 0.3]), external: false },
            BufSpec { data: f32_bytes(&[1.0, 2.0, 3.0]), external: false },
        ],
        codes: vec![(3, None), (0, None)],
        ops: vec![(0, vec![0, 1, 2], vec![3], Opt::Conv(0, 1, 1, 1)), (1, vec![3, 4], vec![5], Opt::Add(0))],
        inputs: vec![0],
        outputs: vec![5],
        quant: vec![],
    }
}

fn build_with(s: &Spec, ext_base: u64) -> (Vec<u8>, Vec<(u64, Vec<u8>)>) {
    let mut b = FlatBufferBuilder::new();
    let mut external = Vec::new();
    let mut next = ext_base;
    let mut bufs = Vec::new();
    for d in &s.buffers {
        if d.external {
            let t = b.start_table();
            b.push_slot_always::<u64>(6, next);
            b.push_slot_always::<u64>(8, d.data.len() as u64);
            bufs.push(b.end_table(t));
            external.push((next, d.data.clone()));
            next += (d.data.len() as u64).div_ceil(16) * 16;
        } else {
            let v = b.create_vector(&d.data);
            let t = b.start_table();
            b.push_slot_always::<WIPOffset<_>>(4, v);
            bufs.push(b.end_table(t));
        }
    }
    let bufs = b.create_vector(&bufs);
    let mut codes = Vec::new();
    for (code, custom) in &s.codes {
        let cc = custom.as_ref().map(|c| b.create_string(c));
        let t = b.start_table();
        b.push_slot::<i8>(4, (*code).min(127) as i8, 0);
        if let Some(cc) = cc {
            b.push_slot_always::<WIPOffset<_>>(6, cc);
        }
        b.push_slot::<i32>(10, *code, 0);
        codes.push(b.end_table(t));
    }
    let codes = b.create_vector(&codes);
    let mut tensors = Vec::new();
    for (i, (shape, tt, buf, name)) in s.tensors.iter().enumerate() {
        let sh = b.create_vector(shape);
        let nm = b.create_string(name);
        let q = s.quant.iter().find(|q| q.0 == i).map(|(_, scale, zero, dim)| {
            let (sv, zv) = (b.create_vector(scale), b.create_vector(zero));
            let t = b.start_table();
            b.push_slot_always::<WIPOffset<_>>(8, sv);
            b.push_slot_always::<WIPOffset<_>>(10, zv);
            b.push_slot::<i32>(16, *dim, 0);
            b.end_table(t)
        });
        let t = b.start_table();
        if let Some(q) = q {
            b.push_slot_always::<WIPOffset<_>>(12, q);
        }
        b.push_slot_always::<WIPOffset<_>>(4, sh);
        b.push_slot::<i8>(6, *tt, 0);
        b.push_slot::<u32>(8, *buf, 0);
        b.push_slot_always::<WIPOffset<_>>(10, nm);
        tensors.push(b.end_table(t));
    }
    let tensors = b.create_vector(&tensors);
    let mut ops = Vec::new();
    for (ci, ins, outs, opt) in &s.ops {
        let ins = b.create_vector(ins);
        let outs = b.create_vector(outs);
        let (key, opts) = match opt {
            Opt::Conv(p, sw, sh, act) => {
                let t = b.start_table();
                b.push_slot::<i8>(4, *p, 0);
                b.push_slot::<i32>(6, *sw, 0);
                b.push_slot::<i32>(8, *sh, 0);
                b.push_slot::<i8>(10, *act, 0);
                (1, Some(b.end_table(t)))
            }
            Opt::Add(act) => {
                let t = b.start_table();
                b.push_slot::<i8>(4, *act, 0);
                (11, Some(b.end_table(t)))
            }
        };
        let t = b.start_table();
        b.push_slot::<u32>(4, *ci, 0);
        b.push_slot_always::<WIPOffset<_>>(6, ins);
        b.push_slot_always::<WIPOffset<_>>(8, outs);
        b.push_slot::<u8>(10, key, 0);
        if let Some(o) = opts {
            b.push_slot_always::<WIPOffset<_>>(12, o);
        }
        ops.push(b.end_table(t));
    }
    let ops = b.create_vector(&ops);
    let inputs = b.create_vector(&s.inputs);
    let outputs = b.create_vector(&s.outputs);
    let name = b.create_string("main");
    let t = b.start_table();
    b.push_slot_always::<WIPOffset<_>>(4, tensors);
    b.push_slot_always::<WIPOffset<_>>(6, inputs);
    b.push_slot_always::<WIPOffset<_>>(8, outputs);
    b.push_slot_always::<WIPOffset<_>>(10, ops);
    b.push_slot_always::<WIPOffset<_>>(12, name);
    let sg = b.end_table(t);
    let sgs = b.create_vector(&[sg]);
    let t = b.start_table();
    b.push_slot::<u32>(4, 3, 0);
    b.push_slot_always::<WIPOffset<_>>(6, codes);
    b.push_slot_always::<WIPOffset<_>>(8, sgs);
    b.push_slot_always::<WIPOffset<_>>(12, bufs);
    let root = b.end_table(t);
    b.finish(root, Some("TFL3"));
    (b.finished_data().to_vec(), external)
}

/// The file: the flatbuffer, then any external buffer data at the offsets
/// its Buffer tables give (16-aligned after the flatbuffer).
fn build(s: &Spec) -> Vec<u8> {
    let (fb, _) = build_with(s, 1 << 40);
    let base = (fb.len() as u64).div_ceil(16) * 16;
    let (mut fb, ext) = build_with(s, base);
    for (off, data) in ext {
        fb.resize(off as usize, 0);
        fb.extend_from_slice(&data);
    }
    fb
}

fn err(bytes: &[u8]) -> String {
    match compile_tflite(bytes, "t", &Options::default()) {
        Ok(_) => panic!("compiled, an error was expected"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_valid_model_compiles_nchw_inside_nhwc_outside() {
    let bytes = build(&spec());
    assert!(is_tflite(&bytes));
    let t = translate(&bytes).unwrap();
    let g = t.model.graph.as_ref().unwrap();
    let ops: Vec<&str> = g.node.iter().map(|n| n.op_type.as_str()).collect();
    // One transpose in, the conv and its activation, the add in NCHW, one
    // transpose out.
    assert_eq!(ops, ["Transpose", "Conv", "Relu", "Add", "Transpose"]);
    let c = g.initializer.iter().find(|i| i.name == "c#b4nchw").expect("the [3] constant laid out as [1,3,1,1]");
    assert_eq!(c.dims, [1, 3, 1, 1]);
    let w = g.initializer.iter().find(|i| i.name == "filter#oihw").unwrap();
    assert_eq!(w.dims, [3, 2, 1, 1]);
    assert_eq!(g.output[0].name, "z");
    let compiled = compile(&bytes, "t", &Options::default()).unwrap();
    assert_eq!(compiled.report.format, crate::SourceFormat::Tflite);
    assert_eq!(compiled.report.onnx_nodes, 2);
    let m = &compiled.model.graph;
    let io: Vec<_> = m.nodes.iter().flat_map(|n| n.outputs.iter()).map(|&i| m.tensors[i as usize].shape.clone()).collect();
    assert!(io.contains(&vec![1, 4, 4, 3]), "the output stays NHWC: {io:?}");
}

#[test]
fn external_buffers_read_like_inline_ones() {
    let mut s = spec();
    s.buffers[1].external = true;
    let ext = build(&s);
    let inline = build(&spec());
    assert!(ext.len() > inline.len());
    let a = translate(&ext).unwrap().model;
    let b = translate(&inline).unwrap().model;
    assert_eq!(a.graph.unwrap().initializer, b.graph.unwrap().initializer);
    // An offset past the end of the file.
    let cut = &ext[..ext.len() - 8];
    assert!(err(cut).contains("lies outside the"), "{}", err(cut));
}

#[test]
fn refusals_name_the_operator() {
    let mut s = spec();
    s.codes[1] = (48, None); // TOPK_V2
    let e = err(&build(&s));
    assert!(e.starts_with("operator 1 'z' (TOPK_V2): operator TOPK_V2 is not supported"), "{e}");

    let mut s = spec();
    s.codes[1] = (32, Some("MyOp".into()));
    assert!(err(&build(&s)).contains("operator 1 'z' (CUSTOM 'MyOp'): custom operators"));

    let mut s = spec();
    s.tensors[0].1 = ty::INT8;
    assert!(err(&build(&s)).contains("input 'x' is int8 (quantized) without per-tensor parameters: rbln-compile takes int8 and uint8"));

    let mut s = spec();
    s.tensors[3].1 = ty::INT8;
    assert!(err(&build(&s)).contains("operator 0 'y' (CONV_2D): tensor 'y' is int8 (quantized)"));

    let mut s = spec();
    s.codes[1] = (119, None); // WHILE
    assert!(err(&build(&s)).contains("control flow"));

    // A run-time filter.
    let mut s = spec();
    s.tensors[1].2 = 0;
    let e = err(&build(&s));
    assert!(e.contains("operator 0 'y' (CONV_2D): the filter ('filter') is computed at run time"), "{e}");

    // SIGN_BIT activation.
    let mut s = spec();
    s.ops[0].3 = Opt::Conv(0, 1, 1, 5);
    assert!(err(&build(&s)).contains("SIGN_BIT"));

    // Zero stride.
    let mut s = spec();
    s.ops[0].3 = Opt::Conv(0, 0, 1, 0);
    assert!(err(&build(&s)).contains("strides (1, 0) must be positive"));
}

#[test]
fn inconsistent_files_are_errors() {
    let mut s = spec();
    s.ops[1].1[1] = 99;
    assert!(err(&build(&s)).contains("operator 1 (ADD) input 1 refers to tensor 99, out of range"));

    let mut s = spec();
    s.tensors[4].2 = 17;
    assert!(err(&build(&s)).contains("tensor 'c': refers to buffer 17, out of range"));

    let mut s = spec();
    s.buffers[3].data.pop();
    let e = err(&build(&s));
    assert!(e.contains("tensor 'c': its buffer holds 11 bytes but shape [3] of float32 needs 12"), "{e}");

    let mut s = spec();
    s.ops[0].0 = 5;
    assert!(err(&build(&s)).contains("operator 0 uses operator code 5, out of range"));

    let mut s = spec();
    s.tensors[0].0 = vec![1, -1, 4, 2];
    assert!(err(&build(&s)).contains("has dimension -1"));

    // The filter's channels do not match the input's.
    let mut s = spec();
    s.tensors[0].0 = vec![1, 4, 4, 3];
    assert!(err(&build(&s)).contains("filter [3, 1, 1, 2] has 2 input channels; the input has 3"));

    // Not a TFLite file, or too short to be one.
    assert!(err(b"hello").contains("too short"));
    assert!(err(&[0u8; 64]).contains("no \"TFL3\" file identifier"));
    // The ONNX path still takes ONNX: the identifier decides.
    assert!(matches!(compile(&[0xff, 0xff, 0xff], "t", &Options::default()), Err(CompileError::Decode(_))));
}

/// Small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn truncated_and_mutated_files_never_panic() {
    let mut s = spec();
    s.buffers[2].external = true;
    for valid in [build(&spec()), build(&s)] {
        assert!(compile_tflite(&valid, "t", &Options::default()).is_ok());
        for len in 0..valid.len() {
            let _ = compile_tflite(&valid[..len], "t", &Options::default());
        }
        let cases: usize = std::env::var("RBLN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut ok, mut failed) = (0, 0);
        for _ in 0..cases {
            let mut m = valid.clone();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(m.len());
                match rng.below(3) {
                    0 => m[i] ^= 1 << rng.below(8),
                    1 => m[i] = rng.next() as u8,
                    _ => m[i] = [0x00, 0xff, 0x7f, 0x80, 0x01][rng.below(5)],
                }
            }
            match compile_tflite(&m, "t", &Options::default()) {
                Ok(_) => ok += 1,
                Err(_) => failed += 1,
            }
        }
        // Most single-byte changes hit weights or names and still compile;
        // the rest must be errors (a panic fails the test).
        assert!(ok > 0 && failed > 0, "{ok} compiled, {failed} refused");
    }
}

#[test]
fn helpers() {
    assert_eq!(f16_to_f32(0x3c00), 1.0);
    assert_eq!(f16_to_f32(0xc000), -2.0);
    assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
    assert!(f16_to_f32(0x7c00).is_infinite());
    assert!(f16_to_f32(0x7e00).is_nan());
    assert_eq!(op_name(3), Some("CONV_2D"));
    assert_eq!(op_name(161), Some("RIGHT_SHIFT"));
    assert_eq!(op_name(200), Some("STABLEHLO_*"));
    assert_eq!(op_name(500), None);
    assert!(SUPPORTED.windows(2).all(|w| w[0] < w[1]), "SUPPORTED is sorted");
    assert_eq!(OptionsRef::default().activation, 0);
}

/// `spec()` fully quantised as the TFLite converter writes it: int8
/// activations per tensor, int8 filter per output channel, int32 bias at
/// the input scale times the filter's, an int8 constant operand.
fn quantized_spec() -> Spec {
    let mut s = spec();
    for (t, ty) in [(0, ty::INT8), (1, ty::INT8), (2, ty::INT32), (3, ty::INT8), (4, ty::INT8), (5, ty::INT8)] {
        s.tensors[t].1 = ty;
    }
    s.buffers[1].data = [-100i8, -50, 0, 50, 100, 127].iter().map(|&v| v as u8).collect();
    s.buffers[2].data = [10i32, -20, 30].iter().flat_map(|v| v.to_le_bytes()).collect();
    s.buffers[3].data = [20u8, 40, 60].to_vec();
    let sw = [0.01f32, 0.02, 0.03];
    s.quant = vec![
        (0, vec![0.05], vec![-3], 0),
        (1, sw.to_vec(), vec![0, 0, 0], 0),
        (2, sw.iter().map(|w| w * 0.05).collect(), vec![0, 0, 0], 0),
        (3, vec![0.1], vec![-128], 0),
        (4, vec![0.02], vec![0], 0),
        (5, vec![0.2], vec![5], 0),
    ];
    s
}

#[test]
fn a_quantized_model_becomes_qdq_and_its_conv_runs_on_int8_kernels() {
    let bytes = build(&quantized_spec());
    let t = translate(&bytes).unwrap();
    let g = t.model.graph.as_ref().unwrap();
    let elem_of = |vi: &crate::onnx::ValueInfoProto| vi.r#type.as_ref().unwrap().tensor_type.as_ref().unwrap().elem_type;
    assert_eq!(elem_of(&g.input[0]), crate::onnx::elem::INT8, "the int8 input stays int8");
    assert_eq!(elem_of(&g.output[0]), crate::onnx::elem::INT8, "the int8 output stays int8");
    let ops: Vec<&str> = g.node.iter().map(|n| n.op_type.as_str()).collect();
    // The 8-bit input is transposed as it is, then dequantised next to
    // the conv; the conv's and the add's results are quantised.
    assert_eq!(ops.iter().filter(|o| **o == "QuantizeLinear").count(), 2, "{ops:?}");
    assert!(ops.starts_with(&["Transpose", "DequantizeLinear"]), "{ops:?}");
    let w = g.node.iter().find(|n| n.op_type == "DequantizeLinear" && n.output[0] == "filter#oihw").expect("the filter's DequantizeLinear");
    assert_eq!(w.attribute.iter().find(|a| a.name == "axis").map(|a| a.i), Some(0), "per output channel");
    let compiled = compile(&bytes, "t", &Options::default()).unwrap();
    assert_eq!((compiled.report.int8.conv, compiled.report.int8.int8_out), (1, 1), "{:?}", compiled.report.int8);
    let meta = &compiled.model.meta;
    assert_eq!((meta.inputs[0].dtype, meta.outputs[0].dtype), (rbln_format::DType::I8, rbln_format::DType::I8));
}

#[test]
fn bad_quantization_parameters_are_refused() {
    type Case = (usize, Vec<f32>, Vec<i64>, i32, &'static str);
    let cases: [Case; 5] = [
        (3, vec![0.1], vec![200], 0, "tensor 'y': has zero point 200, outside -128..=127 of int8"),
        (3, vec![-0.1], vec![0], 0, "has quantisation scale -0.1; scales must be finite and positive"),
        (1, vec![0.1, 0.2], vec![0, 0], 0, "has 2 quantisation scales along axis 0, but its shape is [3, 1, 1, 2]"),
        (1, vec![0.1, 0.2, 0.3], vec![0, 0], 0, "has 3 quantisation scales but 2 zero points"),
        (3, vec![0.1, 0.1, 0.1], vec![0, 0, 0], 3, "tensor 'y' is int8 (quantized per channel at run time)"),
    ];
    for (t, scale, zero, dim, want) in cases {
        let mut s = quantized_spec();
        s.quant.retain(|q| q.0 != t);
        s.quant.push((t, scale, zero, dim));
        let e = err(&build(&s));
        assert!(e.contains(want), "{e}\nwanted: {want}");
    }
}
