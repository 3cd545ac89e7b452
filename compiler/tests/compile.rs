//! Host tests of rbln-compile on ONNX models built here with the same
//! protobuf schema: what is folded, fused and planned, and that every bad
//! model gets an error naming the node, the op and the reason. (Numbers
//! are checked against onnxruntime on the NPU by tests/vm/compiler.sh.)

use prost::Message;
use rbln_compile::onnx::*;
use rbln_compile::{compile, parse_input_shape, CompileError, Options};
use rbln_format::{Model, NodeKind, Placement};

fn tensor(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto { name: name.into(), dims: dims.to_vec(), data_type: elem::FLOAT, float_data: v.to_vec(), ..Default::default() }
}

fn ints(name: &str, v: &[i64]) -> TensorProto {
    TensorProto { name: name.into(), dims: vec![v.len() as i64], data_type: elem::INT64, int64_data: v.to_vec(), ..Default::default() }
}

fn vinfo(name: &str, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| if d < 0 { Dimension { dim_param: Some("batch".into()), dim_value: None } } else { Dimension { dim_value: Some(d), dim_param: None } })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto { tensor_type: Some(TypeProtoTensor { elem_type: elem::FLOAT, shape: Some(TensorShapeProto { dim }) }) }),
    }
}

fn node(op: &str, name: &str, ins: &[&str], outs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

fn attr_i(name: &str, v: i64) -> AttributeProto {
    AttributeProto { name: name.into(), i: v, r#type: 2, ..Default::default() }
}

fn attr_f(name: &str, v: f32) -> AttributeProto {
    AttributeProto { name: name.into(), f: v, r#type: 1, ..Default::default() }
}

fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto { name: name.into(), ints: v.to_vec(), r#type: 7, ..Default::default() }
}

fn model(nodes: Vec<NodeProto>, inits: Vec<TensorProto>, ins: Vec<ValueInfoProto>, outs: Vec<ValueInfoProto>) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        producer_name: "rbln-compile tests".into(),
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 17 }],
        graph: Some(GraphProto { node: nodes, initializer: inits, input: ins, output: outs, name: "g".into(), ..Default::default() }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) * scale).collect()
}

fn compiled(bytes: &[u8]) -> rbln_compile::Compiled {
    compile(bytes, "t", &Options::default()).unwrap_or_else(|e| panic!("compile failed: {e}"))
}

fn compute_ops(m: &Model) -> Vec<String> {
    m.graph.nodes.iter().filter(|n| n.kind == NodeKind::Compute).map(|n| n.op.clone()).collect()
}

fn unsupported(bytes: &[u8], opts: &Options) -> (String, String, String) {
    match compile(bytes, "t", opts) {
        Err(CompileError::Unsupported { node, op, reason }) => (node, op, reason),
        Err(e) => panic!("expected an unsupported-node error, got: {e}"),
        Ok(_) => panic!("expected an error"),
    }
}

/// x[2,8] -> MatMul W[8,4] -> Add b[4] -> Relu -> y
fn mlp() -> Vec<u8> {
    model(
        vec![
            node("MatMul", "fc", &["x", "W"], &["h"], vec![]),
            node("Add", "fc.bias", &["h", "b"], &["hb"], vec![]),
            node("Relu", "act", &["hb"], &["y"], vec![]),
        ],
        vec![tensor("W", &[8, 4], &ramp(32, 0.1)), tensor("b", &[4], &[0.1, 0.2, 0.3, 0.4])],
        vec![vinfo("x", &[2, 8])],
        vec![vinfo("y", &[2, 4])],
    )
}

#[test]
fn matmul_bias_relu_becomes_one_gemm() {
    let c = compiled(&mlp());
    assert_eq!(compute_ops(&c.model), ["MatMul+Add+Relu"]);
    assert_eq!((c.report.fused.bias, c.report.fused.activation), (1, 1));
    let meta = &c.model.meta;
    assert_eq!(meta.inputs[0].name, "x");
    assert_eq!(meta.inputs[0].shape, [2, 8]);
    assert_eq!(meta.outputs[0].name, "y");
    assert_eq!(meta.outputs[0].shape, [2, 4]);
    // The file round-trips through the validating reader.
    let bytes = c.model.to_bytes().unwrap();
    assert_eq!(Model::from_bytes(&bytes).unwrap().meta.name, "t");
}

#[test]
fn shape_chains_fold_to_a_static_reshape() {
    // y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])): PyTorch's
    // way of writing x.view(x.size(0), -1).
    let bytes = model(
        vec![
            node("Shape", "s", &["x"], &["s"], vec![]),
            node("Gather", "g", &["s", "zero"], &["b"], vec![attr_i("axis", 0)]),
            node("Unsqueeze", "u", &["b", "axes0"], &["b1"], vec![]),
            node("Concat", "c", &["b1", "minus1"], &["shape"], vec![attr_i("axis", 0)]),
            node("Reshape", "r", &["x", "shape"], &["flat"], vec![]),
            node("Sigmoid", "sig", &["flat"], &["y"], vec![]),
        ],
        vec![
            TensorProto { name: "zero".into(), data_type: elem::INT64, int64_data: vec![0], ..Default::default() },
            ints("axes0", &[0]),
            ints("minus1", &[-1]),
        ],
        vec![vinfo("x", &[3, 4, 5])],
        vec![vinfo("y", &[3, 20])],
    );
    let c = compiled(&bytes);
    assert_eq!(compute_ops(&c.model), ["Sigmoid"]);
    assert_eq!(c.report.views, 1);
    assert_eq!(c.model.meta.outputs[0].shape, [3, 20]);
}

/// x[1,2,6,6] -> Conv 3x3 pad 1 -> BatchNormalization -> Relu -> y
fn conv_bn() -> Vec<u8> {
    let (co, ci) = (4usize, 2usize);
    model(
        vec![
            node("Conv", "conv", &["x", "W"], &["c"], vec![attr_ints("pads", &[1, 1, 1, 1])]),
            node("BatchNormalization", "bn", &["c", "g", "be", "mu", "var"], &["n"], vec![attr_f("epsilon", 1e-5)]),
            node("Relu", "relu", &["n"], &["y"], vec![]),
        ],
        vec![
            tensor("W", &[co as i64, ci as i64, 3, 3], &ramp(co * ci * 9, 0.1)),
            tensor("g", &[4], &[1.0, 0.5, 2.0, 1.5]),
            tensor("be", &[4], &[0.0, 0.1, -0.1, 0.2]),
            tensor("mu", &[4], &[0.1, 0.0, 0.2, -0.3]),
            tensor("var", &[4], &[1.0, 2.0, 0.5, 1.5]),
        ],
        vec![vinfo("x", &[1, 2, 6, 6])],
        vec![vinfo("y", &[1, 4, 6, 6])],
    )
}

#[test]
fn batchnorm_folds_into_conv_and_relu_fuses() {
    let (co, ci) = (4usize, 2usize);
    let bytes = conv_bn();
    let c = compiled(&bytes);
    assert_eq!(compute_ops(&c.model), ["Conv+BatchNormalization+Relu"]);
    // Folded weights: conv weight * gamma / sqrt(var + eps), per channel.
    let w = c.model.graph.tensors.iter().find(|t| t.name == "conv.W.folded").expect("folded weights");
    let Placement::Weight { offset, size } = w.placement else { panic!("not a weight") };
    assert_eq!(size, (co * ci * 9 * 4) as u64);
    let data = &c.model.weights[offset as usize..(offset + size) as usize];
    let first_of_ch1 = f32::from_le_bytes(data[ci * 9 * 4..ci * 9 * 4 + 4].try_into().unwrap());
    let want = ramp(co * ci * 9, 0.1)[ci * 9] * 0.5 / (2.0f32 + 1e-5).sqrt();
    assert!((first_of_ch1 - want).abs() < 1e-6, "{first_of_ch1} vs {want}");
}

/// x[2,3,8] -> layer norm (decomposed) -> GELU (erf form) -> y
fn ln_gelu() -> Vec<u8> {
    let d = 8;
    model(
        vec![
            // Layer norm, decomposed.
            node("ReduceMean", "ln.mean", &["x"], &["mu"], vec![attr_ints("axes", &[-1])]),
            node("Sub", "ln.sub", &["x", "mu"], &["xc"], vec![]),
            node("Pow", "ln.pow", &["xc", "two"], &["sq"], vec![]),
            node("ReduceMean", "ln.var", &["sq"], &["var"], vec![attr_ints("axes", &[-1])]),
            node("Add", "ln.eps", &["var", "eps"], &["ve"], vec![]),
            node("Sqrt", "ln.sqrt", &["ve"], &["sd"], vec![]),
            node("Div", "ln.div", &["xc", "sd"], &["nx"], vec![]),
            node("Mul", "ln.gamma", &["nx", "gamma"], &["ng"], vec![]),
            node("Add", "ln.beta", &["ng", "beta"], &["ln"], vec![]),
            // GELU, erf form (PyTorch's export order).
            node("Div", "g.div", &["ln", "sqrt2"], &["u"], vec![]),
            node("Erf", "g.erf", &["u"], &["e"], vec![]),
            node("Add", "g.add", &["e", "one"], &["e1"], vec![]),
            node("Mul", "g.mul", &["ln", "e1"], &["xe"], vec![]),
            node("Mul", "g.half", &["xe", "half"], &["y"], vec![]),
        ],
        vec![
            tensor("two", &[], &[2.0]),
            tensor("eps", &[], &[1e-5]),
            tensor("gamma", &[d], &ramp(d as usize, 0.3)),
            tensor("beta", &[d], &ramp(d as usize, 0.1)),
            tensor("sqrt2", &[], &[std::f32::consts::SQRT_2]),
            tensor("one", &[], &[1.0]),
            tensor("half", &[], &[0.5]),
        ],
        vec![vinfo("x", &[2, 3, d])],
        vec![vinfo("y", &[2, 3, d])],
    )
}

#[test]
fn erf_gelu_and_decomposed_layernorm_are_recognised() {
    let bytes = ln_gelu();
    let c = compiled(&bytes);
    assert_eq!(compute_ops(&c.model), ["LayerNorm(decomposed)", "Gelu(erf)"]);
    assert_eq!((c.report.fused.layer_norm, c.report.fused.gelu), (1, 1));
}

#[test]
fn memory_plan_reuses_arena_bytes() {
    // A chain of 6 element-wise ops on 64 KiB tensors: at most 3 live at once.
    let n = 16384;
    let mut nodes = Vec::new();
    let names = ["x", "a", "b", "c", "d", "e", "y"];
    for i in 0..6 {
        let op = if i % 2 == 0 { "Sigmoid" } else { "Tanh" };
        nodes.push(node(op, &format!("n{i}"), &[names[i]], &[names[i + 1]], vec![]));
    }
    let c = compiled(&model(nodes, vec![], vec![vinfo("x", &[n])], vec![vinfo("y", &[n])]));
    let m = &c.report.memory;
    assert_eq!(m.naive_bytes, 7 * n as u64 * 4);
    assert!(m.planned_bytes <= 3 * n as u64 * 4, "planned {} bytes", m.planned_bytes);
    // The reader's liveness check accepted the plan (compile validates).
    assert_eq!(c.model.meta.properties.iter().find(|p| p.key == "memory.activations_planned_bytes").unwrap().value, m.planned_bytes.to_string());
}

#[test]
fn unsupported_op_names_node_op_and_reason() {
    let bytes = model(
        vec![node("Relu", "relu0", &["x"], &["r"], vec![]), node("TopK", "topk1", &["r", "k"], &["y", "i"], vec![])],
        vec![ints("k", &[3])],
        vec![vinfo("x", &[1, 8])],
        vec![vinfo("y", &[1, 3])],
    );
    let (who, op, reason) = unsupported(&bytes, &Options::default());
    assert_eq!((who.as_str(), op.as_str()), ("topk1", "TopK"));
    assert!(reason.contains("not supported"), "{reason}");
    let msg = compile(&bytes, "t", &Options::default()).err().unwrap().to_string();
    assert!(msg.starts_with("node 'topk1' (TopK): op type 'TopK' is not supported"), "{msg}");
}

#[test]
fn dynamic_shapes_need_input_shape() {
    let bytes = model(
        vec![node("Relu", "r", &["x"], &["y"], vec![])],
        vec![],
        vec![vinfo("x", &[-1, 8])],
        vec![vinfo("y", &[-1, 8])],
    );
    let e = compile(&bytes, "t", &Options::default()).err().unwrap();
    assert!(matches!(e, CompileError::DynamicShape { ref input, axis: 0, .. } if input == "x"), "{e}");
    assert!(e.to_string().contains("--input-shape x="), "{e}");
    let opts = Options { input_shapes: vec![parse_input_shape("x=5x8").unwrap()] };
    let c = compile(&bytes, "t", &opts).unwrap();
    assert_eq!(c.model.meta.inputs[0].shape, [5, 8]);
    // A fixed dim cannot be overridden; unknown names and bad syntax are errors.
    let bad = Options { input_shapes: vec![parse_input_shape("x=5x9").unwrap()] };
    assert!(compile(&bytes, "t", &bad).err().unwrap().to_string().contains("axis 1 is fixed to 8"));
    let bad = Options { input_shapes: vec![parse_input_shape("z=5x8").unwrap()] };
    assert!(compile(&bytes, "t", &bad).err().unwrap().to_string().contains("'z' is not an input"));
    assert!(parse_input_shape("x=5xq").is_err());
    assert!(parse_input_shape("5x8").is_err());
}

#[test]
fn bad_models_get_precise_errors() {
    // Not protobuf at all.
    assert!(matches!(compile(b"\xff\xff\xff\xff", "t", &Options::default()), Err(CompileError::Decode(_))));
    // Truncated file.
    let good = mlp();
    assert!(compile(&good[..good.len() / 2], "t", &Options::default()).is_err());
    // A node reading a name nobody defines.
    let bytes = model(vec![node("Relu", "r", &["nope"], &["y"], vec![])], vec![], vec![vinfo("x", &[2])], vec![vinfo("y", &[2])]);
    let e = compile(&bytes, "t", &Options::default()).err().unwrap().to_string();
    assert!(e.contains("reads 'nope', which no earlier node"), "{e}");
    // Shapes that do not multiply.
    let bytes = model(
        vec![node("MatMul", "mm", &["x", "W"], &["y"], vec![])],
        vec![tensor("W", &[5, 4], &ramp(20, 0.1))],
        vec![vinfo("x", &[2, 8])],
        vec![vinfo("y", &[2, 4])],
    );
    let (who, op, reason) = unsupported(&bytes, &Options::default());
    assert_eq!((who.as_str(), op.as_str()), ("mm", "MatMul"));
    assert!(reason.contains("do not multiply"), "{reason}");
    // Weight data shorter than its dims.
    let bytes = model(
        vec![node("MatMul", "mm", &["x", "W"], &["y"], vec![])],
        vec![tensor("W", &[8, 4], &ramp(20, 0.1))],
        vec![vinfo("x", &[2, 8])],
        vec![vinfo("y", &[2, 4])],
    );
    let e = compile(&bytes, "t", &Options::default()).err().unwrap().to_string();
    assert!(e.contains("tensor 'W'") && e.contains("32 elements declared, 20 stored"), "{e}");
    // Declared output shape that disagrees with inference.
    let bytes = model(vec![node("Relu", "r", &["x"], &["y"], vec![])], vec![], vec![vinfo("x", &[2, 3])], vec![vinfo("y", &[3, 2])]);
    let e = compile(&bytes, "t", &Options::default()).err().unwrap().to_string();
    assert!(e.contains("shape inference gives [2, 3]"), "{e}");
    // Inputs of types the NPU does not take are refused with the reason.
    let mut m = ModelProto::decode(mlp().as_slice()).unwrap();
    m.graph.as_mut().unwrap().input[0].r#type.as_mut().unwrap().tensor_type.as_mut().unwrap().elem_type = elem::UINT16;
    let e = compile(&m.encode_to_vec(), "t", &Options::default()).err().unwrap().to_string();
    assert!(e.contains("input 'x' is uint16"), "{e}");
    // A run-time cast to a type that does not exist at run time.
    let bytes = model(
        vec![node("Cast", "to_f64", &["x"], &["y"], vec![attr_i("to", elem::DOUBLE as i64)])],
        vec![],
        vec![vinfo("x", &[2])],
        vec![vinfo("y", &[2])],
    );
    let (who, _, reason) = unsupported(&bytes, &Options::default());
    assert_eq!(who, "to_f64");
    assert!(reason.contains("casts a run-time tensor to double"), "{reason}");
    // A run-time cast to int64 whose result the model declares float.
    let bytes = model(
        vec![node("Cast", "to_int", &["x"], &["y"], vec![attr_i("to", elem::INT64 as i64)])],
        vec![],
        vec![vinfo("x", &[2])],
        vec![vinfo("y", &[2])],
    );
    let e = compile(&bytes, "t", &Options::default()).err().unwrap().to_string();
    assert!(e.contains("output 'y' is float in the model but computed as i64"), "{e}");
    // Reading an output the compiler does not produce (MaxPool's indices).
    let bytes = model(
        vec![
            node("MaxPool", "mp", &["x"], &["p", "idx"], vec![attr_ints("kernel_shape", &[2, 2])]),
            node("Cast", "c", &["idx"], &["y"], vec![attr_i("to", elem::FLOAT as i64)]),
        ],
        vec![],
        vec![vinfo("x", &[1, 1, 4, 4])],
        vec![vinfo("y", &[1, 1, 3, 3])],
    );
    let e = compile(&bytes, "t", &Options::default()).err().unwrap().to_string();
    assert!(e.contains("reads 'idx', output 1 of node 'mp' (MaxPool), which rbln-compile does not produce"), "{e}");
    // Control flow.
    let mut n = node("If", "branch", &["x"], &["y"], vec![]);
    n.attribute.push(AttributeProto { name: "then_branch".into(), g: Some(vec![]), r#type: 5, ..Default::default() });
    let bytes = model(vec![n], vec![], vec![vinfo("x", &[2])], vec![vinfo("y", &[2])]);
    let (_, op, reason) = unsupported(&bytes, &Options::default());
    assert_eq!(op, "If");
    assert!(reason.contains("control flow"), "{reason}");
}

#[test]
fn random_bytes_never_panic() {
    // Mutate a valid model byte by byte: every result is Ok or an error.
    let good = mlp();
    let mut s = 0x2545F4914F6CDD1Du64;
    for _ in 0..3000 {
        let mut b = good.clone();
        for _ in 0..1 + (s % 4) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let i = (s as usize) % b.len();
            b[i] = (s >> 32) as u8;
        }
        let _ = compile(&b, "t", &Options::default());
    }
}

#[test]
fn oversized_shapes_are_errors() {
    let bytes = model(vec![node("Relu", "r", &["x"], &["y"], vec![])], vec![], vec![vinfo("x", &[1 << 40, 1 << 40])], vec![vinfo("y", &[2])]);
    let e = compile(&bytes, "t", &Options::default()).err().unwrap().to_string();
    assert!(e.contains("too large"), "{e}");
    // Broadcasting two inputs into a tensor too large for the device.
    let bytes = model(
        vec![node("Add", "big", &["x", "xt"], &["y"], vec![])],
        vec![],
        vec![vinfo("x", &[1 << 20, 1]), vinfo("xt", &[1, 1 << 20])],
        vec![vinfo("y", &[1 << 20, 1 << 20])],
    );
    let (who, _, reason) = unsupported(&bytes, &Options::default());
    assert_eq!(who, "big");
    assert!(reason.contains("too large"), "{reason}");
    // Expanding a constant into a huge one is not folded.
    let bytes = model(
        vec![node("Expand", "ex", &["c", "shape"], &["e"], vec![]), node("Add", "a", &["x", "e"], &["y"], vec![])],
        vec![tensor("c", &[1], &[1.0]), ints("shape", &[1 << 30])],
        vec![vinfo("x", &[1])],
        vec![vinfo("y", &[1 << 30])],
    );
    let (who, _, reason) = unsupported(&bytes, &Options::default());
    assert_eq!(who, "ex");
    assert!(reason.contains("too large to fold"), "{reason}");
}

/// Structured mutations of valid models (dims, attributes, wiring, op
/// types): every one compiles or fails with an error, none panics.
#[test]
fn mutated_models_never_panic() {
    let ops = ["Conv", "MatMul", "Gemm", "Reshape", "Transpose", "Softmax", "Gather", "Slice", "Concat", "ReduceMean", "Pad", "PRelu",
        "MaxPool", "AveragePool", "Split", "Squeeze", "Unsqueeze", "Expand", "LayerNormalization", "Flatten", "Clip", "LeakyRelu"];
    let vals = [-(1i64 << 40), -3, -1, 0, 1, 2, 3, 7, 1 << 31, i64::MAX];
    let bases: Vec<ModelProto> = [mlp(), conv_bn(), ln_gelu()].iter().map(|b| ModelProto::decode(b.as_slice()).unwrap()).collect();
    let mut s = 0x9E3779B97F4A7C15u64;
    let mut rnd = |n: usize| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % n.max(1) as u64) as usize
    };
    let (mut ok, mut err) = (0, 0);
    for case in 0..std::env::var("RBLN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(4000usize) {
        let mut m = bases[case % bases.len()].clone();
        let g = m.graph.as_mut().unwrap();
        for _ in 0..1 + rnd(3) {
            match rnd(6) {
                0 => {
                    let n = rnd(g.node.len());
                    g.node[n].op_type = ops[rnd(ops.len())].into();
                }
                1 => {
                    let n = rnd(g.node.len());
                    let names = ["axis", "axes", "pads", "strides", "kernel_shape", "group", "perm", "transB", "keepdims", "dilations"];
                    let v: Vec<i64> = (0..rnd(5)).map(|_| vals[rnd(vals.len())]).collect();
                    g.node[n].attribute.push(AttributeProto { name: names[rnd(names.len())].into(), i: vals[rnd(vals.len())], ints: v, ..Default::default() });
                }
                2 => {
                    let t = rnd(g.initializer.len());
                    if let Some(t) = g.initializer.get_mut(t) {
                        if !t.dims.is_empty() {
                            let d = rnd(t.dims.len());
                            t.dims[d] = vals[rnd(vals.len())];
                        }
                    }
                }
                3 => {
                    let dims = &mut g.input[0].r#type.as_mut().unwrap().tensor_type.as_mut().unwrap().shape.as_mut().unwrap().dim;
                    let d = rnd(dims.len());
                    dims[d].dim_value = Some(vals[rnd(vals.len())]);
                }
                4 => {
                    let n = rnd(g.node.len());
                    let all: Vec<String> = g.node.iter().flat_map(|n| n.output.clone()).chain(g.initializer.iter().map(|t| t.name.clone())).collect();
                    let k = rnd(g.node[n].input.len() + 1);
                    let pick = all[rnd(all.len())].clone();
                    if k < g.node[n].input.len() { g.node[n].input[k] = pick } else { g.node[n].input.push(pick) }
                }
                _ => {
                    let n = rnd(g.node.len());
                    let k = rnd(g.node.len());
                    g.node.swap(n, k);
                }
            }
        }
        let bytes = m.encode_to_vec();
        match std::panic::catch_unwind(|| compile(&bytes, "t", &Options::default()).is_ok()) {
            Ok(true) => ok += 1,
            Ok(false) => err += 1,
            Err(_) => panic!("case {case} panicked; model: {m:?}"),
        }
    }
    eprintln!("{ok} mutated models compiled, {err} refused with an error");
    assert!(err > 0 && ok > 0);
}

#[test]
fn silu_fuses_into_conv() {
    let bytes = model(
        vec![
            node("Conv", "conv", &["x", "W", "B"], &["c"], vec![]),
            node("Sigmoid", "sig", &["c"], &["s"], vec![]),
            node("Mul", "swish", &["c", "s"], &["y"], vec![]),
        ],
        vec![tensor("W", &[3, 2, 1, 1], &ramp(6, 0.2)), tensor("B", &[3], &[0.1, 0.0, -0.1])],
        vec![vinfo("x", &[1, 2, 4, 4])],
        vec![vinfo("y", &[1, 3, 4, 4])],
    );
    let c = compiled(&bytes);
    assert_eq!(compute_ops(&c.model), ["Conv+Silu"]);
    assert_eq!((c.report.fused.silu, c.report.fused.activation), (1, 1));
}

#[test]
fn degenerate_graphs_compile() {
    // Output = input (through Identity): only transfers and a view.
    let bytes = model(vec![node("Identity", "id", &["x"], &["y"], vec![])], vec![], vec![vinfo("x", &[4])], vec![vinfo("y", &[4])]);
    let c = compiled(&bytes);
    assert!(compute_ops(&c.model).is_empty());
    // Two outputs, one of them an intermediate that is also read further.
    let bytes = model(
        vec![node("Relu", "r", &["x"], &["h"], vec![]), node("Sigmoid", "s", &["h"], &["y"], vec![])],
        vec![],
        vec![vinfo("x", &[4])],
        vec![vinfo("h", &[4]), vinfo("y", &[4])],
    );
    let c = compiled(&bytes);
    assert_eq!(compute_ops(&c.model), ["Relu", "Sigmoid"]);
    assert_eq!(c.model.meta.outputs.len(), 2);
    // An output that is a constant is refused.
    let bytes = model(vec![], vec![tensor("k", &[2], &[1.0, 2.0])], vec![vinfo("x", &[2])], vec![vinfo("k", &[2])]);
    let e = compile(&bytes, "t", &Options::default()).err().unwrap().to_string();
    assert!(e.contains("output 'k' is a constant"), "{e}");
}

#[test]
fn zero_pad_folds_into_conv_and_1d_conv_compiles() {
    let bytes = model(
        vec![
            node("Pad", "pad", &["x", "pads", "zero"], &["p"], vec![]),
            node("Conv", "conv", &["p", "W"], &["c"], vec![]),
            node("LeakyRelu", "lrelu", &["c"], &["y"], vec![attr_f("alpha", 0.1)]),
        ],
        vec![ints("pads", &[0, 0, 2, 0, 0, 1]), tensor("zero", &[], &[0.0]), tensor("W", &[3, 2, 3], &ramp(18, 0.2))],
        vec![vinfo("x", &[1, 2, 8])],
        vec![vinfo("y", &[1, 3, 9])],
    );
    let c = compiled(&bytes);
    assert_eq!(compute_ops(&c.model), ["Pad+Conv", "LeakyRelu", "LeakyRelu"]);
    assert_eq!(c.report.fused.pad_into_conv, 1);
    // A non-zero pad value stays a Pad (FILL + copy).
    let bytes = model(
        vec![node("Pad", "pad", &["x", "pads", "half"], &["y"], vec![])],
        vec![ints("pads", &[0, 1, 0, 2]), tensor("half", &[], &[0.5])],
        vec![vinfo("x", &[2, 3])],
        vec![vinfo("y", &[2, 6])],
    );
    assert_eq!(compute_ops(&compiled(&bytes).model), ["Pad"]);
    // Reflect padding is refused with the reason.
    let bytes = model(
        vec![node("Pad", "pad", &["x", "pads"], &["y"], vec![AttributeProto { name: "mode".into(), s: b"reflect".to_vec(), r#type: 3, ..Default::default() }])],
        vec![ints("pads", &[0, 1, 0, 2])],
        vec![vinfo("x", &[2, 3])],
        vec![vinfo("y", &[2, 6])],
    );
    let (who, _, reason) = unsupported(&bytes, &Options::default());
    assert_eq!(who, "pad");
    assert!(reason.contains("mode 'reflect' is not supported"), "{reason}");
}

#[test]
fn attention_scale_moves_into_the_query_weights() {
    // scores = (x·Wq + bq) · (x·Wk)ᵀ / 3
    let d = 4;
    let bytes = model(
        vec![
            node("MatMul", "q", &["x", "Wq"], &["q0"], vec![]),
            node("Add", "q.bias", &["q0", "bq"], &["qb"], vec![]),
            node("MatMul", "k", &["x", "Wk"], &["k0"], vec![]),
            node("Transpose", "kt", &["k0"], &["kT"], vec![attr_ints("perm", &[1, 0])]),
            node("MatMul", "scores", &["qb", "kT"], &["s"], vec![]),
            node("Div", "scale", &["s", "three"], &["y"], vec![]),
        ],
        vec![
            tensor("Wq", &[d, d], &ramp(16, 0.3)),
            tensor("bq", &[d], &[0.3, 0.6, -0.3, 0.9]),
            tensor("Wk", &[d, d], &ramp(16, 0.2)),
            tensor("three", &[], &[3.0]),
        ],
        vec![vinfo("x", &[5, d])],
        vec![vinfo("y", &[5, 5])],
    );
    let c = compiled(&bytes);
    assert_eq!(c.report.fused.scale_into_weights, 1);
    assert_eq!(compute_ops(&c.model), ["MatMul+Add+Div(scale)", "MatMul", "Transpose", "MatMul+Div"]);
    // The scaled copy of the query bias is bq / 3.
    let names: Vec<&str> = c.model.graph.tensors.iter().map(|t| t.name.as_str()).collect();
    let t = c.model.graph.tensors.iter().find(|t| t.name.ends_with(".bias.scaled")).unwrap_or_else(|| panic!("no scaled bias in {names:?}"));
    let Placement::Weight { offset, .. } = t.placement else { panic!("not a weight") };
    let v = f32::from_le_bytes(c.model.weights[offset as usize + 12..offset as usize + 16].try_into().unwrap());
    assert!((v - 0.3).abs() < 1e-6, "{v}");
}

/// A residual block: y = Relu(BN(Conv(x)) + x), then z = Relu(y + y2)
/// with y2 = Sigmoid(y) (an Add of two run-time tensors no conv produces).
#[test]
fn residual_add_and_relu_fuse_into_the_conv_and_binary_ops() {
    let c = 4usize;
    let bytes = model(
        vec![
            node("Conv", "conv", &["x", "W"], &["c"], vec![attr_ints("pads", &[1, 1, 1, 1])]),
            node("BatchNormalization", "bn", &["c", "g", "be", "mu", "var"], &["n"], vec![attr_f("epsilon", 1e-5)]),
            node("Add", "skip", &["n", "x"], &["s"], vec![]),
            node("Relu", "relu", &["s"], &["y"], vec![]),
            node("Sigmoid", "sig", &["y"], &["y2"], vec![]),
            node("Add", "add2", &["y", "y2"], &["s2"], vec![]),
            node("Relu", "relu2", &["s2"], &["z"], vec![]),
        ],
        vec![
            tensor("W", &[c as i64, c as i64, 3, 3], &ramp(c * c * 9, 0.1)),
            tensor("g", &[4], &[1.0, 0.5, 2.0, 1.5]),
            tensor("be", &[4], &[0.0, 0.1, -0.1, 0.2]),
            tensor("mu", &[4], &[0.1, 0.0, 0.2, -0.3]),
            tensor("var", &[4], &[1.0, 2.0, 0.5, 1.5]),
        ],
        vec![vinfo("x", &[1, 4, 6, 6])],
        vec![vinfo("z", &[1, 4, 6, 6])],
    );
    let c = compiled(&bytes);
    assert_eq!(compute_ops(&c.model), ["Conv+BatchNormalization+Add+Relu", "Sigmoid", "Add+Relu"]);
    assert_eq!((c.report.fused.residual, c.report.fused.activation), (1, 2));
    // The conv's descriptor carries the residual flag and a Relu; the
    // binary one a Relu.
    let descs = &c.model.program.descriptors;
    let conv = rbln_hw::ops::Desc::decode(&descs[..rbln_hw::ops::Conv2dDesc::SIZE]).unwrap();
    let rbln_hw::ops::Desc::Conv2d(d) = conv else { panic!("{conv:?}") };
    assert_ne!(d.flags & rbln_hw::ops::CONV_RESIDUAL, 0);
    assert_eq!(d.activation, rbln_hw::ops::Unary::Relu as u32);
}

/// A product read twice, or an Add whose other operand broadcasts, keeps
/// its Add: fusing would change what the other reader sees.
#[test]
fn residual_fusion_needs_a_sole_reader_and_equal_shapes() {
    let bytes = model(
        vec![
            node("Conv", "conv", &["x", "W"], &["c"], vec![]),
            node("Add", "skip", &["c", "r"], &["s"], vec![]),
            node("Mul", "other", &["c", "s"], &["z"], vec![]),
        ],
        vec![tensor("W", &[2, 2, 1, 1], &ramp(4, 0.1))],
        vec![vinfo("x", &[1, 2, 3, 3]), vinfo("r", &[1, 2, 3, 3])],
        vec![vinfo("z", &[1, 2, 3, 3])],
    );
    let c = compiled(&bytes);
    assert_eq!(compute_ops(&c.model), ["Conv", "Add", "Mul"]);
    let bytes = model(
        vec![node("Conv", "conv", &["x", "W"], &["c"], vec![]), node("Add", "skip", &["c", "r"], &["z"], vec![])],
        vec![tensor("W", &[2, 2, 1, 1], &ramp(4, 0.1))],
        vec![vinfo("x", &[1, 2, 3, 3]), vinfo("r", &[1, 1, 3, 3])],
        vec![vinfo("z", &[1, 2, 3, 3])],
    );
    assert_eq!(compute_ops(&compiled(&bytes).model), ["Conv", "Add"]);
}

/// torchvision's MobileNetV3 block tail: Conv -> BN -> HardSwish is one op,
/// and a standalone HardSigmoid keeps its alpha and beta.
#[test]
fn hardswish_fuses_into_conv_and_hardsigmoid_is_one_op() {
    let bytes = model(
        vec![
            node("Conv", "conv", &["x", "W"], &["c"], vec![]),
            node("HardSwish", "hs", &["c"], &["h"], vec![]),
            node("HardSigmoid", "gate", &["h"], &["y"], vec![attr_f("alpha", 0.25), attr_f("beta", 0.4)]),
        ],
        vec![tensor("W", &[2, 2, 1, 1], &ramp(4, 0.1))],
        vec![vinfo("x", &[1, 2, 3, 3])],
        vec![vinfo("y", &[1, 2, 3, 3])],
    );
    let c = compiled(&bytes);
    assert_eq!(compute_ops(&c.model), ["Conv+HardSwish", "HardSigmoid"]);
    let descs = &c.model.program.descriptors;
    let rbln_hw::ops::Desc::Conv2d(d) = rbln_hw::ops::Desc::decode(&descs[..rbln_hw::ops::Conv2dDesc::SIZE]).unwrap() else {
        panic!("not a conv")
    };
    assert_eq!(d.activation, rbln_hw::ops::Unary::HardSwish as u32);
    let u = c.model.graph.nodes.iter().find(|n| n.op == "HardSigmoid").and_then(|n| n.descriptors).expect("descriptor");
    let rbln_hw::ops::Desc::Unary(d) = rbln_hw::ops::Desc::decode(&descs[u.offset as usize..(u.offset + u.len) as usize]).unwrap() else {
        panic!("not a unary")
    };
    assert_eq!((d.kind, d.param0, d.param1), (rbln_hw::ops::Unary::HardSigmoid as u32, 0.25, 0.4));
}

fn typed_vinfo(name: &str, dims: &[i64], elem_type: i32) -> ValueInfoProto {
    let mut v = vinfo(name, dims);
    if let Some(t) = v.r#type.as_mut().and_then(|t| t.tensor_type.as_mut()) {
        t.elem_type = elem_type;
    }
    v
}

/// Token ids [2,5] (int64) index an embedding of 7 rows at run time; an
/// int64 mask [2,5] becomes an additive f32 bias through Unsqueeze, Cast,
/// Sub and Mul, as transformers' BERT export writes it.
fn token_model(ids_type: i32) -> Vec<u8> {
    model(
        vec![
            node("Gather", "emb", &["E", "ids"], &["e"], vec![attr_i("axis", 0)]),
            node("Unsqueeze", "m1", &["mask", "ax2"], &["mu"], vec![]),
            node("Cast", "mc", &["mu"], &["mf"], vec![attr_i("to", elem::FLOAT as i64)]),
            node("Sub", "ms", &["one", "mf"], &["mi"], vec![]),
            node("Mul", "mm", &["mi", "big"], &["mb"], vec![]),
            node("Add", "add", &["e", "mb"], &["y"], vec![]),
        ],
        vec![tensor("E", &[7, 3], &ramp(21, 0.1)), ints("ax2", &[2]), tensor("one", &[], &[1.0]), tensor("big", &[], &[-1e4])],
        vec![typed_vinfo("ids", &[2, 5], ids_type), typed_vinfo("mask", &[2, 5], elem::INT64)],
        vec![vinfo("y", &[2, 5, 3])],
    )
}

#[test]
fn integer_inputs_index_embeddings_and_cast_at_run_time() {
    for (ty, dtype) in [(elem::INT64, rbln_format::DType::I64), (elem::INT32, rbln_format::DType::I32)] {
        let c = compiled(&token_model(ty));
        let m = &c.model;
        let ids = &m.meta.inputs[0];
        assert_eq!((ids.name.as_str(), ids.dtype), ("ids", dtype));
        // The ids index rows -7..7 of the embedding (ONNX allows negatives).
        assert_eq!(ids.range, Some(rbln_format::ValueRange { lo: -7, hi: 7 }));
        let mask = &m.meta.inputs[1];
        assert_eq!((mask.dtype, mask.range), (rbln_format::DType::I64, None));
        let ops = compute_ops(m);
        assert!(ops.iter().any(|o| o == "Gather"), "{ops:?}");
        assert!(ops.iter().any(|o| o == "Cast"), "{ops:?}");
    }
    // A run-time int64 operand of arithmetic is converted first.
    let bytes = model(
        vec![node("Add", "add", &["x", "k"], &["y"], vec![])],
        vec![tensor("k", &[], &[0.5])],
        vec![typed_vinfo("x", &[4], elem::INT64)],
        vec![vinfo("y", &[4])],
    );
    let ops = compute_ops(&compiled(&bytes).model);
    assert_eq!(ops, ["Cast", "Add"]);
    // Float indices at run time are refused with the node and the reason.
    let bytes = model(
        vec![node("Gather", "g", &["E", "x"], &["y"], vec![])],
        vec![tensor("E", &[7, 3], &ramp(21, 0.1))],
        vec![vinfo("x", &[2])],
        vec![vinfo("y", &[2, 3])],
    );
    let (who, op, reason) = unsupported(&bytes, &Options::default());
    assert_eq!((who.as_str(), op.as_str()), ("g", "Gather"));
    assert!(reason.contains("must be int32 or int64"), "{reason}");
    // Inputs of other types name the input and the type.
    let bytes = model(vec![node("Relu", "r", &["x"], &["y"], vec![])], vec![], vec![typed_vinfo("x", &[2], elem::DOUBLE)], vec![vinfo("y", &[2])]);
    let e = compile(&bytes, "t", &Options::default()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("input 'x' is double"), "{e}");
}
