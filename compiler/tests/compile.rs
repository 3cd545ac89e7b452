//! Host tests of rbln-compile on ONNX models built here with the same
//! protobuf schema: what is folded, fused and planned, and that every bad
//! model gets an error naming the node, the op and the reason. (Numbers
//! are checked against onnxruntime on the NPU by tests/vm/compiler.sh.)

use prost::Message;
use rbln_compile::onnx::*;
use rbln_compile::{compile, parse_input_shape, CompileError, Options};
use rbln_format::{Model, NodeKind, Placement};
use rbln_hw::ops::{
    Binary, ConcatDesc, Desc, GemmDesc, GridSampleDesc, ResizeDesc, TopKDesc, ELTWISE_IMM, TOPK_LARGEST, GRID_ALIGN_CORNERS, GRID_CUBIC, GRID_LINEAR, GRID_PAD_REFLECTION, GRID_PAD_ZEROS, RESIZE_CUBIC,
    RESIZE_EXCLUDE_OUTSIDE, RecurrentDesc, REC_GRU, REC_LINEAR_BEFORE_RESET, REC_LSTM, REC_REVERSE,
};

fn tensor(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto { name: name.into(), dims: dims.to_vec(), data_type: elem::FLOAT, float_data: v.to_vec(), ..Default::default() }
}

fn ints(name: &str, v: &[i64]) -> TensorProto {
    TensorProto { name: name.into(), dims: vec![v.len() as i64], data_type: elem::INT64, int64_data: v.to_vec(), ..Default::default() }
}

fn vinfo(name: &str, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| {
            if d < 0 {
                Dimension { dim_param: Some("batch".into()), dim_value: None }
            } else {
                Dimension { dim_value: Some(d), dim_param: None }
            }
        })
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

/// As [`compiled`], with element-wise chains left as separate ops: for
/// tests of the other rewrites and lowerings.
fn compiled_unfused(bytes: &[u8]) -> rbln_compile::Compiled {
    let opts = Options { unfused_elementwise: true, ..Default::default() };
    compile(bytes, "t", &opts).unwrap_or_else(|e| panic!("compile failed: {e}"))
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

/// A 3×3 stride-1 conv (+BN+Relu) with 100 output tiles (20×20) and 16
/// channels gets its folded filters in Winograd's domain (the contract's
/// `winograd_weights` of the folded weights, flag CONV_WINOGRAD, counted
/// in the report); a smaller map (18×18: 81 tiles), a strided conv and a
/// narrow one (2 channels) keep the plain layout.
#[test]
fn winograd_filters_where_they_pay() {
    let conv = |c: usize, hw: usize, stride: i64| {
        model(
            vec![
                node("Conv", "conv", &["x", "W"], &["c"], vec![attr_ints("pads", &[1, 1, 1, 1]), attr_ints("strides", &[stride, stride])]),
                node("BatchNormalization", "bn", &["c", "g", "be", "mu", "var"], &["n"], vec![attr_f("epsilon", 1e-5)]),
                node("Relu", "relu", &["n"], &["y"], vec![]),
            ],
            vec![
                tensor("W", &[c as i64, c as i64, 3, 3], &ramp(c * c * 9, 0.01)),
                tensor("g", &[c as i64], &ramp(c, 0.1)),
                tensor("be", &[c as i64], &ramp(c, 0.01)),
                tensor("mu", &[c as i64], &ramp(c, 0.02)),
                tensor("var", &[c as i64], &vec![1.5; c]),
            ],
            vec![vinfo("x", &[1, c as i64, hw as i64, hw as i64])],
            vec![vinfo("y", &[1, c as i64, (hw as i64 - 1) / stride + 1, (hw as i64 - 1) / stride + 1])],
        )
    };
    let weight = |c: &rbln_compile::Compiled, name: &str| {
        let t = c.model.graph.tensors.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no tensor {name}"));
        let Placement::Weight { offset, size } = t.placement else { panic!("{name} is not a weight") };
        c.model.weights[offset as usize..(offset + size) as usize].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect::<Vec<f32>>()
    };
    let conv_flags = |c: &rbln_compile::Compiled| {
        let descs = &c.model.program.descriptors;
        let rbln_hw::ops::Desc::Conv2d(d) = rbln_hw::ops::Desc::decode(&descs[..rbln_hw::ops::Conv2dDesc::SIZE]).unwrap() else { panic!("not a conv") };
        d.flags
    };
    let n = 16;
    let c = compiled(&conv(n, 20, 1));
    assert_eq!(rbln_compile::pack::count(&c.report.layouts, rbln_compile::pack::LayoutKind::Winograd), 1);
    assert_ne!(conv_flags(&c) & rbln_hw::ops::CONV_WINOGRAD, 0);
    let u = weight(&c, "conv.W.folded.winograd");
    // The folded filters, as the plain compile stores them.
    let plain = compiled(&conv(n, 18, 1));
    assert_eq!(conv_flags(&plain) & rbln_hw::ops::CONV_WINOGRAD, 0);
    assert_eq!(rbln_compile::pack::count(&plain.report.layouts, rbln_compile::pack::LayoutKind::Winograd), 0);
    let w = weight(&plain, "conv.W.folded");
    let mut want = vec![0.0f32; 16 * n * n];
    rbln_hw::ops::winograd_weights(&w, n, n, &mut want);
    assert_eq!(u, want);
    assert_eq!(conv_flags(&compiled(&conv(n, 40, 2))) & rbln_hw::ops::CONV_WINOGRAD, 0, "strided");
    assert_eq!(conv_flags(&compiled(&conv(2, 20, 1))) & rbln_hw::ops::CONV_WINOGRAD, 0, "2 channels");
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

/// x[2,3,8] -> RMS norm, decomposed as `form` says -> y (plus x itself
/// in `residual`, which keeps x read by a third op).
fn rms(form: &str, residual: bool) -> Vec<u8> {
    let d = 8;
    let mut nodes = match form {
        // LLaMA / Qwen / T5: x * (1 / sqrt(mean(x^2) + eps)), then * weight
        // (LLaMA and Qwen cast to float32 in between).
        "llama" | "llama-cast" => vec![
            node("Pow", "n.pow", &["x", "two"], &["sq"], vec![]),
            node("ReduceMean", "n.mean", &["sq"], &["ms"], vec![attr_ints("axes", &[-1])]),
            node("Add", "n.eps", &["ms", "eps"], &["me"], vec![]),
            node("Sqrt", "n.sqrt", &["me"], &["rt"], vec![]),
            node("Div", "n.recip", &["one", "rt"], &["inv"], vec![]),
            node("Mul", "n.scale", &["x", "inv"], &["nx0"], vec![]),
            if form == "llama" { node("Identity", "n.id", &["nx0"], &["nx"], vec![]) } else { node("Cast", "n.cast", &["nx0"], &["nx"], vec![attr_i("to", 1)]) },
            node("Mul", "n.gamma", &["gamma", "nx"], &["y"], vec![]),
        ],
        // x / sqrt(mean(x*x) + eps), no weight ("wrong": x*x / ...).
        "div" | "wrong" => vec![
            node("Mul", "n.sq", &["x", "x"], &["sq"], vec![]),
            node("ReduceMean", "n.mean", &["sq"], &["ms"], vec![attr_ints("axes", &[-1])]),
            node("Add", "n.eps", &["eps", "ms"], &["me"], vec![]),
            node("Sqrt", "n.sqrt", &["me"], &["rt"], vec![]),
            node("Div", "n.div", &[if form == "div" { "x" } else { "sq" }, "rt"], &["y"], vec![]),
        ],
        // Reciprocal, then * weight.
        _ => vec![
            node("Pow", "n.pow", &["x", "two"], &["sq"], vec![]),
            node("ReduceMean", "n.mean", &["sq"], &["ms"], vec![attr_ints("axes", &[-1])]),
            node("Add", "n.eps", &["ms", "eps"], &["me"], vec![]),
            node("Sqrt", "n.sqrt", &["me"], &["rt"], vec![]),
            node("Reciprocal", "n.recip", &["rt"], &["inv"], vec![]),
            node("Mul", "n.scale", &["inv", "x"], &["nx"], vec![]),
            node("Mul", "n.gamma", &["nx", "gamma"], &["y"], vec![]),
        ],
    };
    if residual {
        let last = nodes.last_mut().unwrap();
        last.output[0] = "normed".into();
        nodes.push(node("Add", "res", &["x", "normed"], &["y"], vec![]));
    }
    model(
        nodes,
        vec![
            tensor("two", &[], &[2.0]),
            tensor("eps", &[], &[1e-6]),
            tensor("one", &[], &[1.0]),
            tensor("gamma", &[d], &ramp(d as usize, 0.3)),
        ],
        vec![vinfo("x", &[2, 3, d])],
        vec![vinfo("y", &[2, 3, d])],
    )
}

#[test]
fn decomposed_rms_norm_is_recognised() {
    for form in ["llama", "llama-cast", "div", "reciprocal"] {
        let c = compiled(&rms(form, false));
        assert_eq!(compute_ops(&c.model), ["RMSNorm(decomposed)"], "{form}");
        assert_eq!((c.report.fused.rms_norm, c.report.fused.layer_norm), (1, 0), "{form}");
        // x read by the residual Add too: still one norm op.
        let c = compiled(&rms(form, true));
        let ops = compute_ops(&c.model);
        assert_eq!((ops.len(), ops[0].as_str()), (2, "RMSNorm(decomposed)"), "{form} + residual: {ops:?}");
    }
    // Not an RMS norm: x² divided by its RMS (the square is read twice).
    let c = compiled(&rms("wrong", false));
    assert_eq!(c.report.fused.rms_norm, 0);
    assert!(!compute_ops(&c.model).iter().any(|o| o.contains("RMSNorm")));
}

/// GPT-2's MLP entry as exporters write it: Conv1D (rows Gemm between two
/// Reshapes), then the tanh GELU with the cube as `Pow(x, 3)` or `x*x*x`.
fn conv1d_gelu_tanh(cube_by_pow: bool) -> Vec<u8> {
    let mut nodes = vec![
        node("Reshape", "fc.rows", &["x", "rows"], &["xr"], vec![]),
        node("Gemm", "fc", &["xr", "W", "b"], &["hr"], vec![]),
        node("Reshape", "fc.back", &["hr", "back"], &["h"], vec![]),
    ];
    if cube_by_pow {
        nodes.push(node("Pow", "g.pow", &["h", "three"], &["h3"], vec![]));
    } else {
        nodes.push(node("Mul", "g.sq", &["h", "h"], &["h2"], vec![]));
        nodes.push(node("Mul", "g.cube", &["h2", "h"], &["h3"], vec![]));
    }
    nodes.extend([
        node("Mul", "g.c", &["c", "h3"], &["ch3"], vec![]),
        node("Add", "g.add", &["h", "ch3"], &["v"], vec![]),
        node("Mul", "g.k", &["v", "k"], &["u"], vec![]),
        node("Tanh", "g.tanh", &["u"], &["t"], vec![]),
        node("Mul", "g.half", &["h", "half"], &["hh"], vec![]),
        node("Add", "g.one", &["t", "one"], &["t1"], vec![]),
        node("Mul", "g.out", &["hh", "t1"], &["y"], vec![]),
    ]);
    model(
        nodes,
        vec![
            ints("rows", &[6, 8]),
            ints("back", &[2, 3, 8]),
            tensor("W", &[8, 8], &ramp(64, 0.05)),
            tensor("b", &[8], &ramp(8, 0.1)),
            tensor("three", &[], &[3.0]),
            tensor("c", &[], &[0.044715]),
            tensor("k", &[], &[(2.0 / std::f32::consts::PI).sqrt()]),
            tensor("half", &[], &[0.5]),
            tensor("one", &[], &[1.0]),
        ],
        vec![vinfo("x", &[2, 3, 8])],
        vec![vinfo("y", &[2, 3, 8])],
    )
}

#[test]
fn tanh_gelu_is_recognised_and_fuses_into_the_gemm_through_a_reshape() {
    for by_pow in [true, false] {
        let c = compiled(&conv1d_gelu_tanh(by_pow));
        assert_eq!(compute_ops(&c.model), ["Gemm+Gelu(tanh)"], "cube by Pow: {by_pow}");
        assert_eq!((c.report.fused.gelu_tanh, c.report.fused.activation), (1, 1));
        assert_eq!(c.model.meta.outputs[0].shape, [2, 3, 8]);
    }
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
    let c = compiled_unfused(&model(nodes, vec![], vec![vinfo("x", &[n])], vec![vinfo("y", &[n])]));
    let m = &c.report.memory;
    assert_eq!(m.naive_bytes, 7 * n as u64 * 4);
    assert!(m.planned_bytes <= 3 * n as u64 * 4, "planned {} bytes", m.planned_bytes);
    // The reader's liveness check accepted the plan (compile validates).
    assert_eq!(c.model.meta.properties.iter().find(|p| p.key == "memory.activations_planned_bytes").unwrap().value, m.planned_bytes.to_string());
}

#[test]
fn unsupported_op_names_node_op_and_reason() {
    let bytes = model(
        vec![node("Relu", "relu0", &["x"], &["r"], vec![]), node("RandomUniformLike", "random1", &["r"], &["y"], vec![])],
        vec![],
        vec![vinfo("x", &[1, 8])],
        vec![vinfo("y", &[1, 8])],
    );
    let (who, op, reason) = unsupported(&bytes, &Options::default());
    assert_eq!((who.as_str(), op.as_str()), ("random1", "RandomUniformLike"));
    assert!(reason.contains("not supported"), "{reason}");
    let msg = compile(&bytes, "t", &Options::default()).err().unwrap().to_string();
    assert!(msg.starts_with("node 'random1' (RandomUniformLike): op type 'RandomUniformLike' is not supported"), "{msg}");
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
    let opts = Options { input_shapes: vec![parse_input_shape("x=5x8").unwrap()], ..Default::default() };
    let c = compile(&bytes, "t", &opts).unwrap();
    assert_eq!(c.model.meta.inputs[0].shape, [5, 8]);
    // A fixed dim cannot be overridden; unknown names and bad syntax are errors.
    let bad = Options { input_shapes: vec![parse_input_shape("x=5x9").unwrap()], ..Default::default() };
    assert!(compile(&bytes, "t", &bad).err().unwrap().to_string().contains("axis 1 is fixed to 8"));
    let bad = Options { input_shapes: vec![parse_input_shape("z=5x8").unwrap()], ..Default::default() };
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
    let cast = |to: i32| {
        model(
            vec![node("Cast", "to", &["x"], &["c"], vec![attr_i("to", to as i64)]), node("Relu", "r", &["c"], &["y"], vec![])],
            vec![],
            vec![vinfo("x", &[2])],
            vec![vinfo("y", &[2])],
        )
    };
    let (who, _, reason) = unsupported(&cast(elem::UINT16), &Options::default());
    assert_eq!(who, "to");
    assert!(reason.contains("casts a run-time tensor to uint16"), "{reason}");
    // Floating-point run-time values are float32: a cast to float64 or
    // float16 moves nothing.
    for to in [elem::DOUBLE, elem::FLOAT16, elem::BFLOAT16] {
        assert_eq!(compute_ops(&compiled(&cast(to)).model), ["Relu"]);
    }
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

/// A chain of compile-time-only ops (a base for the structured mutations):
/// every intermediate is a small constant, the result is added to x.
fn fold_chain() -> Vec<u8> {
    let f = |name: &str, inp: &str| node("Cast", name, &[inp], &[name], vec![attr_i("to", elem::FLOAT as i64)]);
    model(
        vec![
            node("GatherElements", "ge", &["d", "gi"], &["g"], vec![attr_i("axis", 1)]),
            node("ScatterND", "sn", &["g", "si", "su"], &["s"], vec![]),
            node("ScatterElements", "se", &["s", "gi", "g"], &["s2"], vec![attr_i("axis", 1)]),
            node("CumSum", "cs", &["s2", "ax"], &["c"], vec![attr_i("exclusive", 1)]),
            node("Trilu", "tri", &["c", "k"], &["t"], vec![attr_i("upper", 0)]),
            node("Tile", "tile", &["t", "reps"], &["ti"], vec![]),
            node("Mod", "mod", &["ti", "three"], &["m"], vec![attr_i("fmod", 1)]),
            node("Round", "round", &["m"], &["r0"], vec![]),
            node("ReduceProd", "rp", &["r0"], &["p"], vec![attr_ints("axes", &[0]), attr_i("keepdims", 1)]),
            node("NonZero", "nz", &["p"], &["nzi"], vec![]),
            node("ReduceSum", "nzs", &["nzi"], &["n0"], vec![attr_i("keepdims", 0)]),
            node("Greater", "gt", &["p", "n0"], &["b"], vec![]),
            node("Xor", "xor", &["b", "b"], &["bx"], vec![]),
            node("Not", "not", &["bx"], &["bn"], vec![]),
            f("bf", "bn"),
            node("Add", "a", &["p", "bf"], &["pb"], vec![]),
            node("Reshape", "flat", &["pb", "shape"], &["r"], vec![]),
            node("Add", "use", &["x", "r"], &["y"], vec![]),
        ],
        vec![
            tensor("d", &[2, 3], &[0.5, 1.5, 2.5, -0.5, 3.0, 4.0]),
            i64_tensor("gi", &[2, 3], &[2, 0, 1, -1, 1, 0]),
            i64_tensor("si", &[1, 2], &[1, 2]),
            tensor("su", &[1], &[7.0]),
            i64_tensor("ax", &[], &[1]),
            i64_tensor("k", &[], &[1]),
            i64_tensor("reps", &[2], &[1, 2]),
            tensor("three", &[], &[3.0]),
            i64_tensor("shape", &[1], &[6]),
        ],
        vec![vinfo("x", &[6])],
        vec![vinfo("y", &[6])],
    )
}

#[test]
fn fold_chain_compiles_to_one_add() {
    assert_eq!(compute_ops(&compiled(&fold_chain()).model), ["Add"]);
}

/// Structured mutations of valid models (dims, attributes, wiring, op
/// types): every one compiles or fails with an error, none panics.
#[test]
fn mutated_models_never_panic() {
    let ops = ["Conv", "MatMul", "Gemm", "Reshape", "Transpose", "Softmax", "Gather", "Slice", "Concat", "ReduceMean", "Pad", "PRelu",
        "MaxPool", "AveragePool", "Split", "Squeeze", "Unsqueeze", "Expand", "LayerNormalization", "Flatten", "Clip", "LeakyRelu",
        "Mod", "And", "Xor", "Not", "GatherElements", "ScatterND", "ScatterElements", "Tile", "CumSum", "Round", "Sign",
        "ReduceProd", "ReduceLogSumExp", "ReduceL2", "NonZero", "Trilu", "IsInf", "Cast", "Where", "Range"];
    let vals = [-(1i64 << 40), -3, -1, 0, 1, 2, 3, 7, 1 << 31, i64::MAX];
    let bases: Vec<ModelProto> = [mlp(), conv_bn(), ln_gelu(), fold_chain()].iter().map(|b| ModelProto::decode(b.as_slice()).unwrap()).collect();
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
                    let names = ["axis", "axes", "pads", "strides", "kernel_shape", "group", "perm", "transB", "keepdims", "dilations",
                        "upper", "exclusive", "reverse", "fmod", "noop_with_empty_axes", "to"];
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
    let c = compiled_unfused(&bytes);
    assert_eq!(compute_ops(&c.model), ["Pad+Conv", "LeakyRelu", "LeakyRelu"]);
    assert_eq!(c.report.fused.pad_into_conv, 1);
    // A non-zero pad value stays a Pad (FILL + copy).
    let bytes = model(
        vec![node("Pad", "pad", &["x", "pads", "half"], &["y"], vec![])],
        vec![ints("pads", &[0, 1, 0, 2]), tensor("half", &[], &[0.5])],
        vec![vinfo("x", &[2, 3])],
        vec![vinfo("y", &[2, 6])],
    );
    assert_eq!(compute_ops(&compiled_unfused(&bytes).model), ["Pad"]);
    // Wrap padding is refused with the reason.
    let bytes = model(
        vec![node("Pad", "pad", &["x", "pads"], &["y"], vec![AttributeProto { name: "mode".into(), s: b"wrap".to_vec(), r#type: 3, ..Default::default() }])],
        vec![ints("pads", &[0, 1, 0, 2])],
        vec![vinfo("x", &[2, 3])],
        vec![vinfo("y", &[2, 6])],
    );
    let (who, _, reason) = unsupported(&bytes, &Options::default());
    assert_eq!(who, "pad");
    assert!(reason.contains("mode 'wrap' is not supported"), "{reason}");
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
    let c = compiled_unfused(&bytes);
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
    let c = compiled_unfused(&bytes);
    assert_eq!(compute_ops(&c.model), ["Conv", "Add", "Mul"]);
    let bytes = model(
        vec![node("Conv", "conv", &["x", "W"], &["c"], vec![]), node("Add", "skip", &["c", "r"], &["z"], vec![])],
        vec![tensor("W", &[2, 2, 1, 1], &ramp(4, 0.1))],
        vec![vinfo("x", &[1, 2, 3, 3]), vinfo("r", &[1, 1, 3, 3])],
        vec![vinfo("z", &[1, 2, 3, 3])],
    );
    assert_eq!(compute_ops(&compiled_unfused(&bytes).model), ["Conv", "Add"]);
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

// --- Constant folding of shape and mask subgraphs --------------------------

fn i64_tensor(name: &str, dims: &[i64], v: &[i64]) -> TensorProto {
    TensorProto { name: name.into(), dims: dims.to_vec(), data_type: elem::INT64, int64_data: v.to_vec(), ..Default::default() }
}

fn bool_tensor(name: &str, dims: &[i64], v: &[bool]) -> TensorProto {
    let v: Vec<i32> = v.iter().map(|&b| b as i32).collect();
    TensorProto { name: name.into(), dims: dims.to_vec(), data_type: elem::BOOL, int32_data: v, ..Default::default() }
}

fn attr_s(name: &str, v: &str) -> AttributeProto {
    AttributeProto { name: name.into(), s: v.as_bytes().to_vec(), r#type: 3, ..Default::default() }
}

/// An output whose shape the file leaves open.
fn unshaped(name: &str) -> ValueInfoProto {
    ValueInfoProto { name: name.into(), r#type: Some(TypeProto { tensor_type: Some(TypeProtoTensor { elem_type: elem::FLOAT, shape: None }) }) }
}

fn model_at(opset: i64, nodes: Vec<NodeProto>, inits: Vec<TensorProto>, ins: Vec<ValueInfoProto>, outs: Vec<ValueInfoProto>) -> Vec<u8> {
    let mut m = ModelProto::decode(model(nodes, inits, ins, outs).as_slice()).unwrap();
    m.opset_import[0].version = opset;
    m.encode_to_vec()
}

/// Compiles `nodes` (computing `r` from constants) followed by
/// `y = Add(x, r)` for a run-time x [1], checks that only the Add runs on
/// the device, and returns r (the Add's weight operand) with its shape.
fn fold_at(opset: i64, mut nodes: Vec<NodeProto>, inits: Vec<TensorProto>) -> (Vec<u64>, Vec<f32>) {
    nodes.push(node("Add", "use", &["x", "r"], &["y"], vec![]));
    let c = compiled(&model_at(opset, nodes, inits, vec![vinfo("x", &[1])], vec![unshaped("y")]));
    assert_eq!(compute_ops(&c.model), ["Add"]);
    let t = c.model.graph.tensors.iter().find(|t| t.name == "r").expect("the folded value is a weight");
    let Placement::Weight { offset, size } = t.placement else { panic!("r is not a weight") };
    let bytes = &c.model.weights[offset as usize..(offset + size) as usize];
    (t.shape.clone(), bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect())
}

fn fold(nodes: Vec<NodeProto>, inits: Vec<TensorProto>) -> (Vec<u64>, Vec<f32>) {
    fold_at(18, nodes, inits)
}

/// The error of a model whose one node `op` reads `ins` (initializers,
/// or the run-time input x [2,3]).
fn fold_error(op: &str, ins: &[&str], inits: Vec<TensorProto>, attrs: Vec<AttributeProto>) -> (String, String, String) {
    let nodes = vec![node(op, "n", ins, &["r"], attrs), node("Add", "use", &["x", "r"], &["y"], vec![])];
    unsupported(&model_at(18, nodes, inits, vec![vinfo("x", &[2, 3])], vec![unshaped("y")]), &Options::default())
}

/// Expected values are onnxruntime 1.32's on the same subgraphs.
#[test]
fn mask_subgraphs_fold() {
    // Position ids from an attention mask, as HF exports them:
    // (cumsum(mask, 1) * mask) + 1, then a Cast to float.
    let (s, v) = fold(
        vec![
            node("CumSum", "cs", &["mask", "one"], &["c"], vec![]),
            node("Mul", "m", &["c", "mask"], &["cm"], vec![]),
            node("Add", "a", &["cm", "one"], &["p"], vec![]),
            node("Cast", "f", &["p"], &["r"], vec![attr_i("to", elem::FLOAT as i64)]),
        ],
        vec![i64_tensor("mask", &[1, 5], &[1, 1, 1, 0, 0]), i64_tensor("one", &[], &[1])],
    );
    assert_eq!((s, v), (vec![1, 5], vec![2., 3., 4., 1., 1.]));
    // A causal mask: Trilu of ones (lower, k=0) -> bool -> Not -> Where(-1e4, 0).
    let (s, v) = fold(
        vec![
            node("ConstantOfShape", "ones", &["sq"], &["o"], vec![AttributeProto { name: "value".into(), t: Some(i64_tensor("", &[1], &[1])), r#type: 4, ..Default::default() }]),
            node("Trilu", "tri", &["o"], &["t"], vec![attr_i("upper", 0)]),
            node("Cast", "b", &["t"], &["tb"], vec![attr_i("to", elem::BOOL as i64)]),
            node("Not", "not", &["tb"], &["nb"], vec![]),
            node("Where", "w", &["nb", "neg", "zero"], &["r"], vec![]),
        ],
        vec![i64_tensor("sq", &[2], &[3, 3]), tensor("neg", &[], &[-1e4]), tensor("zero", &[], &[0.0])],
    );
    assert_eq!((s, v), (vec![3, 3], vec![0., -1e4, -1e4, 0., 0., -1e4, 0., 0., 0.]));
    // A Cast to bool is 0/1, not the value (0.5 -> true).
    let (_, v) = fold(
        vec![node("Cast", "b", &["h"], &["hb"], vec![attr_i("to", elem::BOOL as i64)]), node("Cast", "f", &["hb"], &["r"], vec![attr_i("to", elem::FLOAT as i64)])],
        vec![tensor("h", &[3], &[0.5, 0.0, -2.0])],
    );
    assert_eq!(v, [1., 0., 1.]);
}

#[test]
fn arithmetic_folds_follow_onnx() {
    let cat = |ins: &[&str]| node("Concat", "cat", ins, &["r"], vec![attr_i("axis", 0)]);
    let f = |name: &str, inp: &str| node("Cast", name, &[inp], &[name], vec![attr_i("to", elem::FLOAT as i64)]);
    // Mod: integers with both sign rules, floats with fmod=1.
    let (_, v) = fold(
        vec![
            node("Mod", "m0", &["a", "b"], &["m0i"], vec![]),
            node("Mod", "m1", &["a", "b"], &["m1i"], vec![attr_i("fmod", 1)]),
            node("Mod", "m2", &["fa", "fb"], &["m2"], vec![attr_i("fmod", 1)]),
            f("m0", "m0i"),
            f("m1", "m1i"),
            cat(&["m0", "m1", "m2"]),
        ],
        vec![i64_tensor("a", &[4], &[5, -5, 5, -5]), i64_tensor("b", &[4], &[3, 3, -3, -3]), tensor("fa", &[2], &[5.5, -5.5]), tensor("fb", &[2], &[-2.0, 2.0])],
    );
    assert_eq!(v, [2., 1., -1., -2., 2., -2., 2., -2., 1.5, -1.5]);
    // Rounding (half to even), Sign; variadic Max/Min on integers; IsNaN/IsInf.
    let (_, v) = fold(
        vec![
            node("Round", "round", &["h"], &["rd"], vec![]),
            node("Floor", "floor", &["h"], &["fl"], vec![]),
            node("Ceil", "ceil", &["h"], &["ce"], vec![]),
            node("Sign", "sign", &["h"], &["sg"], vec![]),
            node("Max", "max", &["i1", "i2", "i3"], &["mxi"], vec![]),
            node("Min", "min", &["i1", "i2", "i3"], &["mni"], vec![]),
            f("mx", "mxi"),
            f("mn", "mni"),
            node("IsInf", "isinf", &["nf"], &["ii"], vec![attr_i("detect_negative", 0)]),
            node("IsNaN", "isnan", &["nf"], &["in"], vec![]),
            f("iif", "ii"),
            f("inf", "in"),
            cat(&["rd", "fl", "ce", "sg", "mx", "mn", "iif", "inf"]),
        ],
        vec![
            tensor("h", &[4], &[0.5, 1.5, -2.5, -0.0]),
            i64_tensor("i1", &[2], &[1, 5]),
            i64_tensor("i2", &[1], &[3]),
            i64_tensor("i3", &[2], &[-4, 9]),
            tensor("nf", &[3], &[f32::INFINITY, f32::NEG_INFINITY, f32::NAN]),
        ],
    );
    #[rustfmt::skip]
    let want = [0., 2., -2., -0., /* floor */ 0., 1., -3., -0., /* ceil */ 1., 2., -2., -0., /* sign */ 1., 1., -1., 0.,
        /* max */ 3., 9., /* min */ -4., 3., /* isinf(+) */ 1., 0., 0., /* isnan */ 0., 0., 1.];
    assert_eq!(v, want);
    // Comparisons and logic on integers.
    let (_, v) = fold(
        vec![
            node("LessOrEqual", "le", &["i1", "i2"], &["le"], vec![]),
            node("GreaterOrEqual", "ge", &["i1", "i2"], &["ge"], vec![]),
            node("And", "and", &["le", "ge"], &["an"], vec![]),
            node("Or", "or", &["le", "ge"], &["or"], vec![]),
            node("Xor", "xor", &["le", "ge"], &["xo"], vec![]),
            node("Concat", "c", &["le", "ge", "an", "or", "xo"], &["ci"], vec![attr_i("axis", 0)]),
            f("r", "ci"),
        ],
        vec![i64_tensor("i1", &[3], &[1, 3, 5]), i64_tensor("i2", &[], &[3])],
    );
    assert_eq!(v, [1., 1., 0., 0., 1., 1., 0., 1., 0., 1., 1., 1., 1., 0., 1.]);
}

#[test]
fn index_folds_follow_onnx() {
    let f = |inp: &str| node("Cast", "f", &[inp], &["r"], vec![attr_i("to", elem::FLOAT as i64)]);
    let d = || tensor("d", &[2, 3], &[0., 1., 2., 3., 4., 5.]);
    // GatherElements with negative indices.
    let (s, v) = fold(vec![node("GatherElements", "ge", &["d", "i"], &["r"], vec![attr_i("axis", 1)])], vec![d(), i64_tensor("i", &[2, 2], &[-1, 0, 1, -3])]);
    assert_eq!((s, v), (vec![2, 2], vec![2., 0., 4., 3.]));
    // ScatterND: every reduction, with a duplicated index.
    for (red, want) in [("none", [0., 10., 2., 3., 4., 5.]), ("add", [0., 20., 2., 3., 4., 5.]), ("mul", [0., 90., 2., 3., 4., 5.]), ("max", [0., 10., 2., 3., 4., 5.]), ("min", [0., 1., 2., 3., 4., 5.])] {
        let (_, v) = fold(
            vec![node("ScatterND", "sn", &["d", "i", "u"], &["r"], vec![attr_s("reduction", red)])],
            vec![d(), i64_tensor("i", &[2, 2], &[0, 1, -2, -2]), tensor("u", &[2], &[9., 10.])],
        );
        assert_eq!(v, want, "reduction {red}");
    }
    // ScatterElements along axis 0 (negative index) with add.
    let (_, v) = fold(
        vec![node("ScatterElements", "se", &["d", "i", "u"], &["r"], vec![attr_i("axis", 0), attr_s("reduction", "add")])],
        vec![d(), i64_tensor("i", &[1, 3], &[-1, 0, 1]), tensor("u", &[1, 3], &[10., 20., 30.])],
    );
    assert_eq!(v, [0., 21., 2., 13., 4., 35.]);
    // Tile of integers, then Cast.
    let (s, v) = fold(vec![node("Tile", "t", &["a", "reps"], &["ti"], vec![]), f("ti")], vec![i64_tensor("a", &[1, 2], &[7, 8]), i64_tensor("reps", &[2], &[2, 2])]);
    assert_eq!((s, v), (vec![2, 4], vec![7., 8., 7., 8., 7., 8., 7., 8.]));
    // CumSum, exclusive and reversed, axis as a 1-element int32 input.
    let axis = TensorProto { name: "ax".into(), dims: vec![1], data_type: elem::INT32, int32_data: vec![1], ..Default::default() };
    let (_, v) = fold(vec![node("CumSum", "cs", &["d", "ax"], &["r"], vec![attr_i("exclusive", 1), attr_i("reverse", 1)])], vec![d(), axis]);
    assert_eq!(v, [3., 2., 0., 9., 5., 0.]);
    // NonZero of a constant mask, used as run-time Gather indices of x.
    let bytes = model_at(
        18,
        vec![node("NonZero", "nz", &["m"], &["idx"], vec![]), node("Gather", "g", &["x", "idx"], &["y"], vec![attr_i("axis", 1)])],
        vec![bool_tensor("m", &[4], &[false, true, false, true])],
        vec![vinfo("x", &[2, 4])],
        vec![vinfo("y", &[2, 1, 2])],
    );
    let c = compiled(&bytes);
    assert_eq!(compute_ops(&c.model), ["Gather"]);
    let t = c.model.graph.tensors.iter().find(|t| t.name == "g.indices").expect("the indices are a weight");
    let Placement::Weight { offset, .. } = t.placement else { panic!("not a weight") };
    let idx: Vec<i64> = c.model.weights[offset as usize..offset as usize + 16].chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!((t.shape.clone(), idx), (vec![1, 2], vec![1, 3]));
}

#[test]
fn constant_reductions_fold() {
    let p = || i64_tensor("p", &[2, 2], &[1, 2, 3, 4]);
    let f = |inp: &str| node("Cast", "f", &[inp], &["r"], vec![attr_i("to", elem::FLOAT as i64)]);
    // ReduceProd on integers: axes as an input (opset 18) ...
    let (s, v) = fold(vec![node("ReduceProd", "rp", &["p", "ax"], &["q"], vec![]), f("q")], vec![p(), i64_tensor("ax", &[1], &[-1])]);
    assert_eq!((s, v), (vec![2, 1], vec![2., 12.]));
    // ... and as an attribute (opset 17), keepdims=0.
    let (s, v) = fold_at(17, vec![node("ReduceProd", "rp", &["p"], &["q"], vec![attr_ints("axes", &[0]), attr_i("keepdims", 0)]), f("q")], vec![p()]);
    assert_eq!((s, v), (vec![2], vec![3., 8.]));
    // The device reductions fold on constants too; no axes reduces all.
    let (s, v) = fold(vec![node("ReduceMax", "rm", &["p"], &["q"], vec![attr_i("keepdims", 0)]), f("q")], vec![p()]);
    assert_eq!((s, v), (vec![], vec![4.]));
    // noop_with_empty_axes: each element alone (SumSquare squares it).
    let (_, v) = fold(vec![node("ReduceSumSquare", "rs", &["p", "none"], &["q"], vec![attr_i("noop_with_empty_axes", 1)]), f("q")], vec![p(), i64_tensor("none", &[0], &[])]);
    assert_eq!(v, [1., 4., 9., 16.]);
    // Float reductions: L1, L2, LogSumExp, mean of integers truncates.
    let x = || tensor("x3", &[2, 2], &[3., -4., 0., 2.]);
    let (_, v) = fold(vec![node("ReduceL2", "l2", &["x3", "ax"], &["r"], vec![attr_i("keepdims", 0)])], vec![x(), i64_tensor("ax", &[1], &[1])]);
    assert_eq!(v, [5., 2.]);
    let (_, v) = fold(vec![node("ReduceL1", "l1", &["x3"], &["r"], vec![attr_i("keepdims", 0)])], vec![x()]);
    assert_eq!(v, [9.]);
    let (_, v) = fold(vec![node("ReduceMean", "mean", &["n"], &["q"], vec![]), f("q")], vec![i64_tensor("n", &[3], &[-3, -2, 2])]);
    assert_eq!(v, [-1.]);
    let (_, v) = fold(vec![node("ReduceLogSumExp", "lse", &["x3"], &["r"], vec![attr_i("keepdims", 0)])], vec![x()]);
    let want = (3f32.exp() + (-4f32).exp() + 1.0 + 2f32.exp()).ln();
    assert!((v[0] - want).abs() < 1e-6, "{v:?} vs {want}");
}

#[test]
fn compile_time_ops_refuse_run_time_inputs() {
    let cases: Vec<(&str, Vec<&str>, Vec<TensorProto>)> = vec![
        ("ReduceProd", vec!["x"], vec![]),
        ("ReduceLogSumExp", vec!["x"], vec![]),
        ("NonZero", vec!["x"], vec![]),
        ("Trilu", vec!["x"], vec![]),
    ];
    for (op, ins, inits) in cases {
        let (who, got_op, reason) = fold_error(op, &ins, inits, vec![]);
        assert_eq!((who.as_str(), got_op.as_str()), ("n", op));
        let at = ins.iter().position(|&i| i == "x").unwrap();
        assert!(reason.contains(&format!("input {at} ('x') is computed at run time; this op is only supported on compile-time constants")), "{op}: {reason}");
    }
    // A run-time integer input is named as it is (no float conversion first).
    let bytes = model(
        vec![node("Trilu", "tri", &["mask"], &["p"], vec![]), node("Cast", "f", &["p"], &["pf"], vec![attr_i("to", elem::FLOAT as i64)]), node("Add", "a", &["x", "pf"], &["y"], vec![])],
        vec![],
        vec![vinfo("x", &[4, 4]), typed_vinfo("mask", &[4, 4], elem::INT64)],
        vec![vinfo("y", &[4, 4])],
    );
    let (who, op, reason) = unsupported(&bytes, &Options::default());
    assert_eq!((who.as_str(), op.as_str()), ("tri", "Trilu"));
    assert!(reason.contains("input 0 ('mask') is computed at run time"), "{reason}");
    // CumSum of a run-time mask (position ids) runs on the device.
    let bytes = model(
        vec![node("CumSum", "pos", &["mask", "ax"], &["p"], vec![]), node("Cast", "f", &["p"], &["pf"], vec![attr_i("to", elem::FLOAT as i64)]), node("Add", "a", &["x", "pf"], &["y"], vec![])],
        vec![i64_tensor("ax", &[], &[1])],
        vec![vinfo("x", &[1, 4]), typed_vinfo("mask", &[1, 4], elem::INT64)],
        vec![vinfo("y", &[1, 4])],
    );
    assert!(compute_ops(&compiled(&bytes).model).contains(&"CumSum".to_string()));
    // The Reduce* ops the device has keep running on run-time inputs.
    let bytes = model(vec![node("ReduceMax", "rm", &["x"], &["y"], vec![attr_ints("axes", &[1])])], vec![], vec![vinfo("x", &[2, 3])], vec![vinfo("y", &[2, 1])]);
    assert_eq!(compute_ops(&compiled(&bytes).model), ["ReduceMax"]);
}

#[test]
fn bad_constant_folds_name_node_op_and_reason() {
    let d = || tensor("d", &[2, 3], &[0., 1., 2., 3., 4., 5.]);
    /// Op, its inputs, the initializers, its attributes, and the reason expected.
    type Case<'a> = (&'a str, Vec<&'a str>, Vec<TensorProto>, Vec<AttributeProto>, &'a str);
    let cases: Vec<Case> = vec![
        ("Mod", vec!["a", "z"], vec![i64_tensor("a", &[1], &[5]), i64_tensor("z", &[1], &[0])], vec![], "integer Mod of 5 by zero"),
        ("Mod", vec!["d", "d"], vec![d()], vec![], "fmod=0 on floating-point inputs"),
        ("Mod", vec!["d", "d"], vec![d()], vec![attr_i("fmod", 2)], "fmod=2; it must be 0 or 1"),
        ("GatherElements", vec!["d", "i"], vec![d(), i64_tensor("i", &[1, 1], &[3])], vec![attr_i("axis", 1)], "index 3 is out of range for axis 1 of size 3"),
        ("GatherElements", vec!["d", "i"], vec![d(), i64_tensor("i", &[2], &[0, 0])], vec![], "must have the same rank"),
        ("GatherElements", vec!["d", "i"], vec![d(), i64_tensor("i", &[1, 1], &[0])], vec![attr_i("axis", 2)], "axis 2 is out of range for rank 2"),
        ("GatherElements", vec!["d", "d"], vec![d()], vec![], "indices must be integers"),
        ("ScatterND", vec!["d", "i", "u"], vec![d(), i64_tensor("i", &[1, 2], &[2, 0]), tensor("u", &[1], &[1.])], vec![], "index 2 is out of range for axis 0 of size 2"),
        ("ScatterND", vec!["d", "i", "u"], vec![d(), i64_tensor("i", &[1, 1], &[0]), tensor("u", &[1, 2], &[1., 1.])], vec![], "updates have shape [1, 2]"),
        ("ScatterND", vec!["d", "i", "u"], vec![d(), i64_tensor("i", &[1, 3], &[0, 0, 0]), tensor("u", &[1], &[1.])], vec![], "address 3 axes"),
        ("ScatterND", vec!["d", "i", "u"], vec![d(), i64_tensor("i", &[1, 1], &[0]), tensor("u", &[1, 3], &[1., 1., 1.])], vec![attr_s("reduction", "mean")], "reduction 'mean' is not one of"),
        ("ScatterElements", vec!["d", "i", "u"], vec![d(), i64_tensor("i", &[1, 1], &[-4]), tensor("u", &[1, 1], &[1.])], vec![attr_i("axis", 1)], "index -4 is out of range"),
        ("ScatterElements", vec!["d", "i", "u"], vec![d(), i64_tensor("i", &[1, 1], &[0]), tensor("u", &[1, 2], &[1., 1.])], vec![], "must have the same shape"),
        ("Tile", vec!["d", "reps"], vec![d(), i64_tensor("reps", &[2], &[1, -2])], vec![], "negative count"),
        ("Tile", vec!["d", "reps"], vec![d(), i64_tensor("reps", &[1], &[2])], vec![], "1 repeats for an input of rank 2"),
        ("Tile", vec!["d", "reps"], vec![d(), i64_tensor("reps", &[2], &[1 << 20, 1 << 20])], vec![], "too large to fold"),
        ("CumSum", vec!["d", "ax"], vec![d(), i64_tensor("ax", &[2], &[0, 1])], vec![], "axis (input 1) must be a scalar"),
        ("CumSum", vec!["d", "ax"], vec![d(), i64_tensor("ax", &[], &[2])], vec![], "axis 2 is out of range"),
        ("Trilu", vec!["v"], vec![tensor("v", &[3], &[1., 2., 3.])], vec![], "must have rank at least 2"),
        ("Trilu", vec!["d", "k"], vec![d(), tensor("k", &[], &[1.0])], vec![], "k (input 1) must be integers"),
        ("ReduceProd", vec!["d", "ax"], vec![d(), i64_tensor("ax", &[1], &[5])], vec![], "axis 5 is out of range"),
        ("ReduceMax", vec!["e", "ax"], vec![i64_tensor("e", &[0, 2], &[]), i64_tensor("ax", &[1], &[0])], vec![], "empty set of integers"),
        ("Cast", vec!["d"], vec![d()], vec![attr_i("to", 8)], "a cast to string (8) cannot be folded"),
    ];
    for (op, ins, inits, attrs, want) in cases {
        let (who, got_op, reason) = fold_error(op, &ins, inits, attrs);
        assert_eq!((who.as_str(), got_op.as_str()), ("n", op));
        assert!(reason.contains(want), "{op}: {reason} (expected '{want}')");
    }
}

#[test]
fn resize_and_conv_transpose_lower_or_say_why_not() {
    // Nearest 2x: one RESIZE; cubic and crop-and-resize are refused.
    let resize = |attrs: Vec<AttributeProto>| {
        model(
            vec![node("Resize", "up", &["x", "", "s"], &["y"], attrs)],
            vec![tensor("s", &[4], &[1.0, 1.0, 2.0, 2.0])],
            vec![vinfo("x", &[1, 2, 3, 4])],
            vec![vinfo("y", &[1, 2, 6, 8])],
        )
    };
    assert_eq!(compute_ops(&compiled(&resize(vec![attr_s("mode", "nearest")])).model), ["Resize"]);
    assert_eq!(compute_ops(&compiled(&resize(vec![attr_s("mode", "cubic")])).model), ["Resize"]);
    let (who, op, reason) = unsupported(&resize(vec![attr_s("mode", "lanczos")]), &Options::default());
    assert_eq!((who.as_str(), op.as_str()), ("up", "Resize"));
    assert!(reason.contains("mode 'lanczos' is not supported"), "{reason}");
    let (_, _, reason) = unsupported(&resize(vec![attr_s("coordinate_transformation_mode", "tf_crop_and_resize")]), &Options::default());
    assert!(reason.contains("'tf_crop_and_resize' is not supported"), "{reason}");
    // Resizing the channel axis is refused.
    let bytes = model(
        vec![node("Resize", "up", &["x", "", "s"], &["y"], vec![])],
        vec![tensor("s", &[4], &[1.0, 2.0, 1.0, 1.0])],
        vec![vinfo("x", &[1, 2, 3, 4])],
        vec![vinfo("y", &[1, 4, 3, 4])],
    );
    assert!(unsupported(&bytes, &Options::default()).2.contains("only spatial axes"));

    // ConvTranspose k2 s2: a zero-spreading copy and a stride-1 conv.
    let ct = |weights_const: bool| {
        let w = tensor("w", &[2, 3, 2, 2], &ramp(24, 0.1));
        model(
            vec![node("ConvTranspose", "up", &["x", "w"], &["y"], vec![attr_ints("strides", &[2, 2])])],
            if weights_const { vec![w] } else { vec![] },
            if weights_const { vec![vinfo("x", &[1, 2, 3, 4])] } else { vec![vinfo("x", &[1, 2, 3, 4]), vinfo("w", &[2, 3, 2, 2])] },
            vec![vinfo("y", &[1, 3, 6, 8])],
        )
    };
    assert_eq!(compute_ops(&compiled(&ct(true)).model), ["ConvTranspose", "ConvTranspose"]);
    let (_, op, reason) = unsupported(&ct(false), &Options::default());
    assert_eq!(op, "ConvTranspose");
    assert!(reason.contains("weights computed at run time"), "{reason}");
}

#[test]
fn group_norms_and_pixel_shuffles_lower_to_existing_descriptors() {
    // GroupNormalization-18 takes per-group scale and bias: expanded per
    // channel; InstanceNormalization per channel.
    let gn = |opset_scale: usize| {
        let mut m = ModelProto::decode(
            model(
                vec![node("GroupNormalization", "gn", &["x", "s", "b"], &["y"], vec![attr_i("num_groups", 2)])],
                vec![tensor("s", &[opset_scale as i64], &ramp(opset_scale, 0.5)), tensor("b", &[opset_scale as i64], &ramp(opset_scale, 0.1))],
                vec![vinfo("x", &[1, 4, 3, 3])],
                vec![vinfo("y", &[1, 4, 3, 3])],
            )
            .as_slice(),
        )
        .unwrap();
        m.opset_import[0].version = 18;
        m.encode_to_vec()
    };
    let ops = compute_ops(&compiled_unfused(&gn(2)).model);
    assert_eq!(ops.iter().filter(|o| *o == "GroupNormalization").count(), 3, "{ops:?}");
    let (who, _, reason) = unsupported(&gn(3), &Options::default());
    assert_eq!(who, "gn");
    assert!(reason.contains("3 values; 4 (one per channel) expected"), "{reason}");
    // DepthToSpace is views around one TRANSPOSE; a bad blocksize says why.
    let d2s = |bs: i64| {
        model(
            vec![node("DepthToSpace", "d2s", &["x"], &["y"], vec![attr_i("blocksize", bs)])],
            vec![],
            vec![vinfo("x", &[1, 8, 2, 3])],
            vec![vinfo("y", &[1, 2, 4, 6])],
        )
    };
    assert_eq!(compute_ops(&compiled_unfused(&d2s(2)).model), ["DepthToSpace"]);
    let (_, op, reason) = unsupported(&d2s(3), &Options::default());
    assert_eq!(op, "DepthToSpace");
    assert!(reason.contains("not a multiple of blocksize² = 9"), "{reason}");
}

#[test]
fn comparisons_logic_and_where_run_on_the_device() {
    // A padding mask from an int64 input, as SDPA-style exports build it:
    // Equal(mask, 0) -> Where(cond, -inf-ish, scores); Not/And/Or/Xor too.
    let bytes = model(
        vec![
            node("Equal", "pad", &["mask", "zero"], &["is_pad"], vec![]),
            node("Not", "keep", &["is_pad"], &["k"], vec![]),
            node("Greater", "pos", &["x", "zero_f"], &["p"], vec![]),
            node("And", "both", &["k", "p"], &["kp"], vec![]),
            node("Or", "either", &["k", "p"], &["ko"], vec![]),
            node("Xor", "one", &["kp", "ko"], &["kx"], vec![]),
            node("Where", "sel", &["kx", "x", "neg"], &["y"], vec![]),
        ],
        vec![ints("zero", &[0]), tensor("zero_f", &[], &[0.0]), tensor("neg", &[], &[-1e9])],
        vec![vinfo("x", &[2, 4]), typed_vinfo("mask", &[2, 4], elem::INT64)],
        vec![vinfo("y", &[2, 4])],
    );
    let ops = compute_ops(&compiled_unfused(&bytes).model);
    for want in ["Cast", "Equal", "Not", "Greater", "And", "Or", "Xor", "Where"] {
        assert!(ops.iter().any(|o| o == want), "{want} missing from {ops:?}");
    }
    // All-constant inputs still fold to nothing on the device.
    let bytes = model(
        vec![node("Less", "c", &["a", "b"], &["m"], vec![]), node("Where", "w", &["m", "x", "x2"], &["y"], vec![])],
        vec![tensor("a", &[2], &[1.0, 3.0]), tensor("b", &[2], &[2.0, 2.0])],
        vec![vinfo("x", &[2]), vinfo("x2", &[2])],
        vec![vinfo("y", &[2])],
    );
    assert_eq!(compute_ops(&compiled_unfused(&bytes).model), ["Where"]);
}

#[test]
fn tile_of_a_run_time_tensor_is_one_strided_copy() {
    let tile = |reps: &[i64]| {
        model(
            vec![node("Tile", "t", &["x", "reps"], &["y"], vec![])],
            vec![ints("reps", reps)],
            vec![vinfo("x", &[2, 3])],
            vec![vinfo("y", &[2 * reps[0], 3 * reps[1]])],
        )
    };
    assert_eq!(compute_ops(&compiled(&tile(&[2, 4])).model), ["Tile"]);
    // Repeating nothing is a view.
    assert!(compute_ops(&compiled(&tile(&[1, 1])).model).is_empty());
    let (_, op, reason) = unsupported(&tile(&[1, -1]), &Options::default());
    assert_eq!(op, "Tile");
    assert!(reason.contains("non-negative counts"), "{reason}");
}

#[test]
fn argmax_is_a_reduce_then_a_cast_to_int64() {
    let bytes = model(
        vec![node("ArgMax", "am", &["x"], &["i"], vec![attr_i("axis", 1), attr_i("keepdims", 0)])],
        vec![],
        vec![vinfo("x", &[2, 5])],
        vec![typed_vinfo("i", &[2], elem::INT64)],
    );
    let c = compiled(&bytes);
    assert_eq!(compute_ops(&c.model), ["ArgMax", "ArgMax"]);
    assert_eq!(c.model.meta.outputs[0].dtype, rbln_format::DType::I64);
}

// --- Ops that real exports compute at run time -------------------------------

/// What transformers, torchvision and timm exports compute on run-time
/// values: rotary embeddings (Sin, Cos), position ids from a mask (CumSum,
/// GatherElements), cosine attention (ReduceL2), flips (negative Slice
/// steps), upper-case Einsum subscripts. Each lowers to device ops (the VM
/// suite tests/vm/exports.sh checks the numbers on real exports).
#[test]
fn run_time_forms_of_export_ops() {
    let lowered = |nodes: Vec<NodeProto>, inits: Vec<TensorProto>, x: &[i64], y: &[i64]| {
        compute_ops(&compiled(&model(nodes, inits, vec![vinfo("x", x)], vec![vinfo("y", y)])).model)
    };
    assert_eq!(lowered(vec![node("Sin", "s", &["x"], &["y"], vec![])], vec![], &[4], &[4]), ["Sin"]);
    assert_eq!(lowered(vec![node("Cos", "c", &["x"], &["y"], vec![])], vec![], &[4], &[4]), ["Cos"]);
    // CumSum: one GEMM against a triangle of ones, on the last axis or not.
    let cumsum = |axis: i64, attrs: Vec<AttributeProto>| {
        lowered(vec![node("CumSum", "cs", &["x", "ax"], &["y"], attrs)], vec![i64_tensor("ax", &[], &[axis])], &[2, 5, 3], &[2, 5, 3])
    };
    assert_eq!(cumsum(-1, vec![]), ["CumSum"]);
    assert_eq!(cumsum(1, vec![attr_i("exclusive", 1), attr_i("reverse", 1)]), ["CumSum"]);
    // ReduceL2 = sqrt(sum(x·x)); ReduceL1 = sum(|x|).
    assert_eq!(lowered(vec![node("ReduceL2", "r", &["x"], &["y"], vec![attr_ints("axes", &[1])])], vec![], &[2, 3], &[2, 1]), ["ReduceL2"; 3]);
    assert_eq!(lowered(vec![node("ReduceL1", "r", &["x"], &["y"], vec![attr_ints("axes", &[1])])], vec![], &[2, 3], &[2, 1]), ["ReduceL1"; 2]);
    // A flip: the ascending box, then a Gather of reversed positions.
    let flip = vec![node("Slice", "sl", &["x", "st", "en", "ax", "sp"], &["y"], vec![])];
    let inits = || {
        vec![
            i64_tensor("st", &[1], &[-1]),
            i64_tensor("en", &[1], &[i64::MIN]),
            i64_tensor("ax", &[1], &[0]),
            i64_tensor("sp", &[1], &[-1]),
        ]
    };
    assert_eq!(lowered(flip, inits(), &[4, 3], &[4, 3]), ["Slice"]);
    let every_other = vec![node("Slice", "sl", &["x", "st", "en", "ax", "sp"], &["y"], vec![])];
    let inits2 = vec![i64_tensor("st", &[1], &[4]), i64_tensor("en", &[1], &[0]), i64_tensor("ax", &[1], &[1]), i64_tensor("sp", &[1], &[-2])];
    // Elements 4 and 2 of axis 1: a strided copy, then the flip.
    assert_eq!(lowered(every_other, inits2, &[2, 6], &[2, 2]), ["Slice", "Slice"]);
    // GatherElements with constant indices: one Gather from the flat data.
    let ge = vec![node("GatherElements", "ge", &["x", "i"], &["y"], vec![attr_i("axis", 1)])];
    assert_eq!(lowered(ge, vec![i64_tensor("i", &[2, 2], &[2, 0, -1, 1])], &[2, 3], &[2, 2]), ["GatherElements"]);
    let einsum = vec![node("Einsum", "e", &["x", "w"], &["y"], vec![attr_s("equation", "BIJ,JK->BIK")])];
    assert_eq!(lowered(einsum, vec![tensor("w", &[3, 4], &ramp(12, 0.1))], &[2, 5, 3], &[2, 5, 4]), ["Einsum"]);
}

/// GatherElements with run-time indices (position ids computed from a
/// mask): flat positions computed on the device, checked, cast, gathered.
#[test]
fn gather_elements_with_run_time_indices() {
    let bytes = model(
        vec![node("GatherElements", "ge", &["E", "x"], &["y"], vec![attr_i("axis", 1)])],
        vec![tensor("E", &[2, 5], &ramp(10, 0.5))],
        vec![typed_vinfo("x", &[2, 3], elem::INT64)],
        vec![vinfo("y", &[2, 3])],
    );
    let ops = compute_ops(&compiled(&bytes).model);
    assert_eq!(ops.first().map(String::as_str), Some("Cast"), "{ops:?}");
    assert_eq!(ops.last().map(String::as_str), Some("GatherElements"), "{ops:?}");
}

/// IsNaN / IsInf on run-time values (DETR's activation checks) are
/// comparisons; ScatterND / ScatterElements with constant indices and
/// run-time data or updates (BART's shifted decoder ids) are a GATHER of
/// the updates and a WHERE; cubic Resize runs on the device, and folds on
/// constants.
#[test]
fn run_time_checks_scatters_and_cubic() {
    let lowered = |nodes: Vec<NodeProto>, inits: Vec<TensorProto>, x: &[i64], y: &[i64]| {
        compute_ops(&compiled_unfused(&model(nodes, inits, vec![vinfo("x", x)], vec![vinfo("y", y)])).model)
    };
    let isnan = vec![node("IsNaN", "n", &["x"], &["b"], vec![]), node("Cast", "c", &["b"], &["y"], vec![attr_i("to", elem::FLOAT as i64)])];
    // (The Cast of a run-time 0/1 to float moves nothing.)
    assert_eq!(lowered(isnan, vec![], &[4], &[4]), ["IsNaN", "IsNaN"]);
    let isinf = vec![node("IsInf", "i", &["x"], &["b"], vec![attr_i("detect_negative", 0)]), node("Cast", "c", &["b"], &["y"], vec![attr_i("to", elem::FLOAT as i64)])];
    assert_eq!(lowered(isinf, vec![], &[4], &[4]), ["IsInf"]);
    // shifted[:, 1:] = x[:, :-1] as exporters write it.
    let idx: Vec<i64> = (0..2).flat_map(|b| (1..4).flat_map(move |j| [b, j])).collect();
    let scatter = vec![node("ScatterND", "s", &["z", "i", "x"], &["y"], vec![])];
    let inits = vec![tensor("z", &[2, 4], &[0.0; 8]), i64_tensor("i", &[2, 3, 2], &idx)];
    assert_eq!(lowered(scatter, inits, &[2, 3], &[2, 4]), ["ScatterND", "ScatterND"]);
    let scatter = vec![node("ScatterElements", "s", &["x", "i", "u"], &["y"], vec![attr_i("axis", 1)])];
    let inits = vec![i64_tensor("i", &[1, 2], &[0, -1]), tensor("u", &[1, 2], &[5.0, 6.0])];
    assert_eq!(lowered(scatter, inits, &[2, 3], &[2, 3]), ["ScatterElements"]);
    // Reductions other than none need constants.
    let bytes = model(
        vec![node("ScatterND", "s", &["x", "i", "u"], &["y"], vec![attr_s("reduction", "add")])],
        vec![i64_tensor("i", &[1, 1], &[0]), tensor("u", &[1, 3], &[1., 2., 3.])],
        vec![vinfo("x", &[2, 3])],
        vec![vinfo("y", &[2, 3])],
    );
    let (who, op, reason) = unsupported(&bytes, &Options::default());
    assert_eq!((who.as_str(), op.as_str()), ("s", "ScatterND"));
    assert!(reason.contains("a reduction other than 'none'"), "{reason}");
    // Cubic on a run-time tensor is one RESIZE carrying Keys' coefficient
    // and the exclude_outside flag; on a 3-D input it is refused.
    let cubic = |attrs: Vec<AttributeProto>| {
        let attrs = [vec![attr_s("mode", "cubic")], attrs].concat();
        model(vec![node("Resize", "r", &["x", "", "sc"], &["y"], attrs)], vec![tensor("sc", &[4], &[1., 1., 2., 2.])], vec![vinfo("x", &[1, 1, 2, 2])], vec![vinfo("y", &[1, 1, 4, 4])])
    };
    let m = compiled_unfused(&cubic(vec![attr_f("cubic_coeff_a", -0.5), attr_i("exclude_outside", 1)])).model;
    let d = resize_descs(&m);
    assert_eq!((d.len(), d[0].mode, d[0].cubic_a, d[0].flags), (1, RESIZE_CUBIC, -0.5, RESIZE_EXCLUDE_OUTSIDE));
    let d = resize_descs(&compiled_unfused(&cubic(vec![])).model);
    assert_eq!((d[0].mode, d[0].cubic_a, d[0].flags), (RESIZE_CUBIC, -0.75, 0));
    let bytes = model(
        vec![node("Resize", "r", &["x", "", "sc"], &["y"], vec![attr_s("mode", "cubic")])],
        vec![tensor("sc", &[5], &[1., 1., 2., 2., 2.])],
        vec![vinfo("x", &[1, 1, 2, 2, 2])],
        vec![vinfo("y", &[1, 1, 4, 4, 4])],
    );
    assert!(unsupported(&bytes, &Options::default()).2.contains("mode 'cubic' on a 3-D (NCDHW) input is not supported"));
}

/// GridSample is one GRID_SAMPLE of the input and a run-time grid, with
/// opset 16's and opset 20's mode names; what it cannot do is refused
/// naming the node and the reason.
#[test]
fn grid_sample_lowers_to_one_descriptor() {
    let gs = |attrs: Vec<AttributeProto>, x: &[i64], grid: &[i64], y: &[i64]| {
        model(vec![node("GridSample", "gs", &["x", "g"], &["y"], attrs)], vec![], vec![vinfo("x", x), vinfo("g", grid)], vec![vinfo("y", y)])
    };
    let m = compiled(&gs(vec![attr_s("mode", "bicubic"), attr_s("padding_mode", "reflection"), attr_i("align_corners", 1)], &[2, 3, 5, 6], &[2, 4, 7, 2], &[2, 3, 4, 7])).model;
    assert_eq!(compute_ops(&m), ["GridSample"]);
    let d: Vec<GridSampleDesc> = descriptors(&m).into_iter().filter_map(|d| if let Desc::GridSample(g) = d { Some(g) } else { None }).collect();
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].mode, d[0].padding, d[0].flags, d[0].n, d[0].c, d[0].h, d[0].w, d[0].oh, d[0].ow), (GRID_CUBIC, GRID_PAD_REFLECTION, GRID_ALIGN_CORNERS, 2, 3, 5, 6, 4, 7));
    let m = compiled(&gs(vec![], &[1, 1, 2, 2], &[1, 3, 3, 2], &[1, 1, 3, 3])).model;
    let d = descriptors(&m);
    assert!(matches!(d[..], [Desc::GridSample(g)] if g.mode == GRID_LINEAR && g.padding == GRID_PAD_ZEROS && g.flags == 0), "{d:?}");
    let refused = |attrs, x: &[i64], grid: &[i64], y: &[i64], want: &str| {
        let (who, op, reason) = unsupported(&gs(attrs, x, grid, y), &Options::default());
        assert_eq!((who.as_str(), op.as_str()), ("gs", "GridSample"));
        assert!(reason.contains(want), "{reason} (expected '{want}')");
    };
    refused(vec![], &[1, 1, 2, 2, 2], &[1, 2, 2, 2, 3], &[1, 1, 2, 2, 2], "only 4-D (N, C, H, W) inputs");
    refused(vec![], &[1, 1, 2, 2], &[1, 3, 3, 3], &[1, 1, 3, 3], "grid has shape [1, 3, 3, 3]");
    refused(vec![], &[2, 1, 2, 2], &[1, 3, 3, 2], &[2, 1, 3, 3], "grid has shape [1, 3, 3, 2]");
    refused(vec![attr_s("mode", "lanczos")], &[1, 1, 2, 2], &[1, 3, 3, 2], &[1, 1, 3, 3], "mode 'lanczos' is not supported");
    refused(vec![attr_s("padding_mode", "wrap")], &[1, 1, 2, 2], &[1, 3, 3, 2], &[1, 1, 3, 3], "padding_mode 'wrap' is not supported");
}

/// MatMul whose batch dims broadcast only partially ([2, 1, 4] against
/// [1, 3, 4] batches of 3x5 and 5x2 matrices): each operand is repeated to
/// the [2, 3] batch by one copy, then one batched GEMM.
#[test]
fn matmul_with_partially_broadcast_batches() {
    let bytes = model(
        vec![node("MatMul", "mm", &["a", "b"], &["y"], vec![])],
        vec![],
        vec![vinfo("a", &[2, 1, 3, 5]), vinfo("b", &[1, 3, 5, 2])],
        vec![vinfo("y", &[2, 3, 3, 2])],
    );
    let m = compiled(&bytes).model;
    assert_eq!(compute_ops(&m), ["MatMul", "MatMul", "MatMul"]);
    let gemms: Vec<GemmDesc> = descriptors(&m).into_iter().filter_map(|d| if let Desc::Gemm(g) = d { Some(g) } else { None }).collect();
    assert_eq!(gemms.len(), 1);
    assert_eq!((gemms[0].m, gemms[0].n, gemms[0].k, gemms[0].batch), (3, 2, 5, 6));
}

/// Every descriptor of a compiled model's compute nodes, in node order
/// (each node's range holds its descriptors back to back, each sized by
/// its header).
fn descriptors(m: &Model) -> Vec<Desc> {
    let blob = &m.program.descriptors;
    let mut out = Vec::new();
    for r in m.graph.nodes.iter().filter_map(|n| n.descriptors) {
        let (mut at, end) = (r.offset as usize, (r.offset + r.len) as usize);
        while at < end {
            let size = u32::from_le_bytes(blob[at + 4..at + 8].try_into().unwrap()) as usize;
            out.push(Desc::decode(&blob[at..at + size]).unwrap());
            at += size;
        }
    }
    out
}

/// The RESIZE descriptors of a compiled model's command stream.
fn resize_descs(m: &Model) -> Vec<ResizeDesc> {
    descriptors(m).into_iter().filter_map(|d| if let Desc::Resize(r) = d { Some(r) } else { None }).collect()
}

/// Floor, Ceil, Round and Sign on run-time values are UNARY ops; Mod is a
/// BINARY (Python's remainder for fmod=0, which ONNX allows for integers,
/// C's fmod for fmod=1); Hardmax is an argmax and an EQUAL.
#[test]
fn run_time_rounding_remainders_and_hardmax() {
    let lowered = |nodes: Vec<NodeProto>, inits: Vec<TensorProto>, x: &[i64], y: &[i64]| {
        compute_ops(&compiled_unfused(&model(nodes, inits, vec![vinfo("x", x)], vec![vinfo("y", y)])).model)
    };
    for op in ["Floor", "Ceil", "Round", "Sign"] {
        assert_eq!(lowered(vec![node(op, "u", &["x"], &["y"], vec![])], vec![], &[4], &[4]), [op]);
    }
    let fmod = vec![node("Mod", "m", &["x", "d"], &["y"], vec![attr_i("fmod", 1)])];
    assert_eq!(lowered(fmod, vec![tensor("d", &[1], &[2.5])], &[4], &[4]), ["Mod"]);
    let kinds: Vec<u32> = descriptors(&compiled_unfused(&model(
        vec![node("Mod", "m", &["x", "d"], &["y"], vec![attr_i("fmod", 1)])],
        vec![tensor("d", &[1], &[2.5])],
        vec![vinfo("x", &[4])],
        vec![vinfo("y", &[4])],
    )).model)
    .into_iter()
    .filter_map(|d| if let Desc::Binary(b) = d { Some(b.kind) } else { None })
    .collect();
    assert_eq!(kinds, [Binary::FMod as u32]);
    // Position parity of an int64 mask: Python's remainder, then a cast.
    let bytes = model(
        vec![node("Mod", "pos", &["mask", "two"], &["p"], vec![]), node("Cast", "f", &["p"], &["pf"], vec![attr_i("to", elem::FLOAT as i64)]), node("Add", "a", &["x", "pf"], &["y"], vec![])],
        vec![i64_tensor("two", &[], &[2])],
        vec![vinfo("x", &[1, 4]), typed_vinfo("mask", &[1, 4], elem::INT64)],
        vec![vinfo("y", &[1, 4])],
    );
    let m = compiled_unfused(&bytes).model;
    assert!(descriptors(&m).iter().any(|d| matches!(d, Desc::Binary(b) if b.kind == Binary::Mod as u32)));
    // Hashing token ids computed at run time (CANINE): (ids + 1)·p mod n.
    let bytes = model(
        vec![
            node("Cast", "ids", &["x"], &["i"], vec![attr_i("to", elem::INT64 as i64)]),
            node("Mul", "hash", &["i", "p"], &["h"], vec![]),
            node("Mod", "bucket", &["h", "n"], &["b"], vec![]),
            node("Cast", "f", &["b"], &["y"], vec![attr_i("to", elem::FLOAT as i64)]),
        ],
        vec![i64_tensor("p", &[], &[31]), i64_tensor("n", &[], &[1000])],
        vec![vinfo("x", &[4])],
        vec![vinfo("y", &[4])],
    );
    assert!(descriptors(&compiled_unfused(&bytes).model).iter().any(|d| matches!(d, Desc::Binary(b) if b.kind == Binary::Mod as u32)));
    // OneHot of run-time indices: wrap the negative ones, compare with the
    // positions, scale to [off, on]; of constant indices, folded.
    let one_hot = |ids: Option<&[i64]>| {
        let mut inits = vec![i64_tensor("d", &[], &[4]), tensor("v", &[2], &[-1.0, 3.0])];
        let ins = match ids {
            Some(v) => {
                inits.push(i64_tensor("i", &[2, 3], v));
                vec![vinfo("x", &[2, 4, 3])]
            }
            None => vec![vinfo("x", &[2, 4, 3]), typed_vinfo("i", &[2, 3], elem::INT64)],
        };
        let nodes = vec![node("OneHot", "oh", &["i", "d", "v"], &["h"], vec![attr_i("axis", 1)]), node("Add", "a", &["x", "h"], &["y"], vec![])];
        compiled_unfused(&model(nodes, inits, ins, vec![vinfo("y", &[2, 4, 3])])).model
    };
    assert_eq!(compute_ops(&one_hot(None)), ["Cast", "OneHot", "OneHot", "OneHot", "OneHot", "OneHot", "OneHot", "Add"]);
    let m = one_hot(Some(&[0, -1, 4, 3, -5, 2]));
    assert_eq!(compute_ops(&m), ["Add"]);
    let t = m.graph.tensors.iter().find(|t| t.name == "h").expect("the folded one-hot is a weight");
    let Placement::Weight { offset, size } = t.placement else { panic!("not a weight") };
    let w: Vec<f32> = m.weights[offset as usize..(offset + size) as usize].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    // [2, 4, 3]: batch 0 has indices 0, -1 (→ 3), 4 (off) along axis 1.
    assert_eq!(&w[..12], &[3.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 3.0, -1.0]);
    // Batch 1: 3, -5 (beyond -depth: off), 2.
    assert_eq!(&w[12..], &[-1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 3.0, 3.0, -1.0, -1.0]);
    // Hardmax over the last axis (opset 13+) of [2, 3, 5].
    assert_eq!(lowered(vec![node("Hardmax", "h", &["x"], &["y"], vec![])], vec![], &[2, 3, 5], &[2, 3, 5]), ["Hardmax", "Hardmax"]);
}

/// Cubic Resize folded on a constant matches the ONNX definition (Keys'
/// cubic, a = -0.75, taps clamped to the edge): a ramp stays a ramp where
/// all four taps are inside, and bends at the edge.
#[test]
fn cubic_resize_folds_on_constants() {
    let ramp: Vec<f32> = (0..4).map(|i| i as f32).collect();
    let bytes = model(
        vec![
            node("Resize", "r", &["c", "", "sc"], &["up"], vec![attr_s("mode", "cubic"), attr_s("coordinate_transformation_mode", "align_corners")]),
            node("Add", "a", &["x", "up"], &["y"], vec![]),
        ],
        vec![tensor("c", &[1, 1, 1, 4], &ramp), tensor("sc", &[4], &[1., 1., 1., 1.75])],
        vec![vinfo("x", &[1, 1, 1, 7])],
        vec![vinfo("y", &[1, 1, 1, 7])],
    );
    let m = compiled(&bytes).model;
    assert_eq!(compute_ops(&m), ["Add"]);
    // align_corners maps output i to input i·3/6 = i/2. At i = 1 the taps
    // are inputs [0 (clamped -1), 0, 1, 2] with weights [-3/32, 19/32,
    // 19/32, -3/32]: 0.40625; inside (i = 2, 3) the ramp gives i/2.
    let want = [0.0, 0.40625, 1.0, 1.5, 2.0, 2.59375, 3.0];
    let t = m.graph.tensors.iter().find(|t| t.name == "up").expect("the folded resize is a weight");
    let Placement::Weight { offset, size } = t.placement else { panic!("not a weight") };
    assert_eq!(size, 7 * 4);
    let w: Vec<f32> = m.weights[offset as usize..(offset + size) as usize].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    for (i, (v, want)) in w.iter().zip(want).enumerate() {
        assert!((v - want).abs() < 1e-5, "{i}: {v} vs {want}");
    }
}

/// Constant GEMM weights are stored in the cores' panel layout, once per
/// distinct use: two MatMuls reading one W [8,32] share one packed copy
/// (and the original is not stored); a Gemm with transB packs its own
/// (the transpose is absorbed); W [8,4] would grow 4x in one 16-column
/// panel and stays as stored.
#[test]
fn constant_gemm_weights_are_packed_once_per_use() {
    let w: Vec<f32> = ramp(8 * 32, 0.1);
    let bytes = model(
        vec![
            node("MatMul", "a", &["x", "W"], &["ya"], vec![]),
            node("MatMul", "b", &["x", "W"], &["yb"], vec![]),
            node("Gemm", "c", &["x", "Wt"], &["yc"], vec![attr_i("transB", 1)]),
            node("MatMul", "d", &["x", "Wsmall"], &["yd"], vec![]),
        ],
        vec![tensor("W", &[8, 32], &w), tensor("Wt", &[32, 8], &w), tensor("Wsmall", &[8, 4], &ramp(32, 0.1))],
        vec![vinfo("x", &[2, 8])],
        vec![vinfo("ya", &[2, 32]), vinfo("yb", &[2, 32]), vinfo("yc", &[2, 32]), vinfo("yd", &[2, 4])],
    );
    let c = compiled(&bytes);
    let packed: Vec<&str> = c.report.layouts.iter().map(|l| l.op.as_str()).collect();
    assert_eq!(packed, ["a", "b", "c"]);
    assert!(c.report.layouts[0].note.contains("8x32"), "{:?}", c.report.layouts[0]);
    // W packed once (8·32 floats, no padding), Wt packed once, Wsmall as is.
    let weights: Vec<(String, u64)> = c
        .model
        .graph
        .tensors
        .iter()
        .filter(|t| matches!(t.placement, Placement::Weight { .. }))
        .map(|t| (t.name.clone(), t.shape.iter().product()))
        .collect();
    assert_eq!(weights.len(), 3, "{weights:?}");
    assert!(weights.contains(&("W.panels".to_string(), 256)), "{weights:?}");
    assert!(weights.contains(&("Wt.panels".to_string(), 256)), "{weights:?}");
    assert!(weights.contains(&("Wsmall".to_string(), 32)), "{weights:?}");
}

fn i8_tensor(name: &str, dims: &[i64], ty: i32, v: &[i32]) -> TensorProto {
    TensorProto { name: name.into(), dims: dims.to_vec(), data_type: ty, int32_data: v.to_vec(), ..Default::default() }
}

/// x[1,4,6,6] -> Q -> DQ -> Conv(DQ(W int8, per channel), DQ(b int32)) ->
/// Relu -> Q -> DQ -> y: onnxruntime's QDQ form of a quantised conv.
fn qdq_conv(per_channel: bool) -> Vec<u8> {
    let w: Vec<i32> = (0..8 * 4 * 9).map(|i| (i * 37 % 255) - 127).collect();
    let ws: Vec<f32> = if per_channel { (0..8).map(|i| 0.01 + 0.001 * i as f32).collect() } else { vec![0.01] };
    let wdims: &[i64] = if per_channel { &[8] } else { &[] };
    let wz = vec![0; ws.len()];
    let b: Vec<i32> = (0..8).map(|i| i * 100 - 300).collect();
    let bs: Vec<f32> = ws.iter().map(|s| s * 0.05).collect();
    model(
        vec![
            node("QuantizeLinear", "qx", &["x", "xs", "xz"], &["xq"], vec![]),
            node("DequantizeLinear", "dqx", &["xq", "xs", "xz"], &["xd"], vec![]),
            node("DequantizeLinear", "dqw", &["W", "ws", "wz"], &["wd"], vec![attr_i("axis", 0)]),
            node("DequantizeLinear", "dqb", &["B", "bs"], &["bd"], vec![attr_i("axis", 0)]),
            node("Conv", "conv", &["xd", "wd", "bd"], &["c"], vec![attr_ints("pads", &[1, 1, 1, 1])]),
            node("Relu", "relu", &["c"], &["r"], vec![]),
            node("QuantizeLinear", "qy", &["r", "ys", "yz"], &["yq"], vec![]),
            node("DequantizeLinear", "dqy", &["yq", "ys", "yz"], &["y"], vec![]),
        ],
        vec![
            tensor("xs", &[], &[0.05]),
            i8_tensor("xz", &[], elem::UINT8, &[128]),
            i8_tensor("W", &[8, 4, 3, 3], elem::INT8, &w),
            tensor("ws", wdims, &ws),
            i8_tensor("wz", wdims, elem::INT8, &wz),
            i8_tensor("B", &[8], elem::INT32, &b),
            tensor("bs", if per_channel { &[8] } else { &[] }, if per_channel { &bs } else { &bs[..1] }),
            tensor("ys", &[], &[0.1]),
            i8_tensor("yz", &[], elem::UINT8, &[0]),
        ],
        vec![vinfo("x", &[1, 4, 6, 6])],
        vec![vinfo("y", &[1, 8, 6, 6])],
    )
}

#[test]
fn qdq_conv_runs_on_the_int8_kernels() {
    for per_channel in [true, false] {
        let c = compiled(&qdq_conv(per_channel));
        assert_eq!(compute_ops(&c.model), ["QuantizeLinear", "int8:Conv+Relu+QuantizeLinear", "DequantizeLinear"], "per channel {per_channel}");
        assert_eq!((c.report.int8.conv, c.report.int8.gemm, c.report.int8.int8_out), (1, 0, 1));
        // The int8 weights are stored as bytes (8 columns x 36 rows),
        // plus the scales, zero points and int32 bias: no f32 copy.
        let w = c.model.graph.tensors.iter().find(|t| t.name.ends_with("packed_q")).expect("packed int8 weights");
        assert_eq!(w.dtype, rbln_format::DType::I8);
        assert_eq!(w.shape, [8 * 36]);
        assert!(c.report.memory.weights_bytes < 8 * 36 * 4, "weights {} B", c.report.memory.weights_bytes);
    }
}

#[test]
fn bad_quantization_parameters_are_refused() {
    // A per-channel scale of the wrong length.
    let mut m = ModelProto::decode(qdq_conv(true).as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    let ws = g.initializer.iter_mut().find(|t| t.name == "ws").unwrap();
    ws.dims = vec![7];
    ws.float_data.truncate(7);
    let wz = g.initializer.iter_mut().find(|t| t.name == "wz").unwrap();
    wz.dims = vec![7];
    wz.int32_data.truncate(7);
    let (node, op, reason) = unsupported(&m.encode_to_vec(), &Options::default());
    assert_eq!((node.as_str(), op.as_str()), ("dqw", "DequantizeLinear"));
    assert!(reason.contains("7 scales do not match axis 0"), "{reason}");
    // A weight value outside int8 (stored in int32_data).
    let mut m = ModelProto::decode(qdq_conv(true).as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    g.initializer.iter_mut().find(|t| t.name == "W").unwrap().int32_data[5] = 200;
    let (node, _, reason) = unsupported(&m.encode_to_vec(), &Options::default());
    assert_eq!(node, "dqw");
    assert!(reason.contains("constant input value 200 is outside the range of i8"), "{reason}");
}

#[test]
fn int8_lowering_variants() {
    // u8 weights with a zero point: stored as i8 with per-channel zero
    // points (value − 128, zero − 128).
    let mut m = ModelProto::decode(qdq_conv(true).as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    let w = g.initializer.iter_mut().find(|t| t.name == "W").unwrap();
    w.data_type = elem::UINT8;
    for v in w.int32_data.iter_mut() {
        *v += 127;
    }
    let wz = g.initializer.iter_mut().find(|t| t.name == "wz").unwrap();
    wz.data_type = elem::UINT8;
    wz.int32_data = vec![127; 8];
    let c = compiled(&m.encode_to_vec());
    assert_eq!(c.report.int8.conv, 1);
    let z = c.model.graph.tensors.iter().find(|t| t.name.ends_with("zero_q")).expect("weight zero points");
    assert_eq!((z.dtype, z.shape.as_slice()), (rbln_format::DType::I32, &[8u64][..]));

    // A conv result read by two ops (the QuantizeLinear and the output):
    // the integer op dequantises its own result.
    let mut m = ModelProto::decode(qdq_conv(false).as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    g.output.push(vinfo("r", &[1, 8, 6, 6]));
    let c = compiled(&m.encode_to_vec());
    assert_eq!((c.report.int8.conv, c.report.int8.int8_out), (1, 0));
    assert!(compute_ops(&c.model).contains(&"int8:Conv+Relu".to_string()), "{:?}", compute_ops(&c.model));

    // An operator of another domain is refused, naming what is read.
    let mut m = ModelProto::decode(qdq_conv(false).as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    g.node[5].domain = "com.example".into();
    let (node, _, reason) = unsupported(&m.encode_to_vec(), &Options::default());
    assert_eq!(node, "relu");
    assert!(reason.contains("operator domain 'com.example' is not supported") && reason.contains("QLinearAdd"), "{reason}");
}

/// The same conv in the QOperator form: one QLinearConv node.
#[test]
fn qlinearconv_lowers_like_its_qdq_form() {
    let m = ModelProto::decode(qdq_conv(true).as_slice()).unwrap();
    let g = m.graph.as_ref().unwrap();
    let qnode = node(
        "QLinearConv",
        "conv",
        &["xq", "xs", "xz", "W", "ws", "wz", "ys", "yz", "B"],
        &["yq"],
        vec![attr_ints("pads", &[1, 1, 1, 1])],
    );
    let nodes = vec![g.node[0].clone(), qnode, g.node[7].clone()];
    let bytes = model(nodes, g.initializer.clone(), g.input.clone(), g.output.clone());
    let c = compiled(&bytes);
    assert_eq!(compute_ops(&c.model), ["QuantizeLinear", "int8:Conv+QuantizeLinear", "DequantizeLinear"]);
    assert_eq!((c.report.int8.conv, c.report.int8.int8_out), (1, 1));
}

/// a, b [2,8] -> Q -> DQ each -> Add (+Relu) -> Q -> DQ -> y: the QDQ form
/// of onnxruntime's quantised Add (a residual connection).
fn qdq_add(relu: bool, b_shape: &[i64]) -> Vec<u8> {
    let mut nodes = vec![
        node("QuantizeLinear", "qa", &["a", "as", "az"], &["aq"], vec![]),
        node("DequantizeLinear", "dqa", &["aq", "as", "az"], &["ad"], vec![]),
        node("QuantizeLinear", "qb", &["b", "bs", "bz"], &["bq"], vec![]),
        node("DequantizeLinear", "dqb", &["bq", "bs", "bz"], &["bd"], vec![]),
        node("Add", "add", &["ad", "bd"], &["s"], vec![]),
    ];
    let sum = if relu {
        nodes.push(node("Relu", "relu", &["s"], &["r"], vec![]));
        "r"
    } else {
        "s"
    };
    nodes.push(node("QuantizeLinear", "qy", &[sum, "ys", "yz"], &["yq"], vec![]));
    nodes.push(node("DequantizeLinear", "dqy", &["yq", "ys", "yz"], &["y"], vec![]));
    model(
        nodes,
        vec![
            tensor("as", &[], &[0.05]),
            i8_tensor("az", &[], elem::UINT8, &[128]),
            tensor("bs", &[], &[0.02]),
            i8_tensor("bz", &[], elem::INT8, &[-3]),
            tensor("ys", &[], &[0.07]),
            i8_tensor("yz", &[], elem::UINT8, &[10]),
        ],
        vec![vinfo("a", &[2, 8]), vinfo("b", b_shape)],
        vec![vinfo("y", &[2, 8])],
    )
}

#[test]
fn qdq_add_runs_on_int8_values() {
    for relu in [false, true] {
        let c = compiled(&qdq_add(relu, &[2, 8]));
        let label = if relu { "int8:Add+Relu+QuantizeLinear" } else { "int8:Add+QuantizeLinear" };
        assert_eq!(compute_ops(&c.model), ["QuantizeLinear", "QuantizeLinear", label, "DequantizeLinear"], "relu {relu}");
        assert_eq!(c.report.int8.eltwise, 1);
    }
    // Broadcasting (b is [1, 8]) stays a float island.
    let c = compiled(&qdq_add(false, &[1, 8]));
    assert_eq!(c.report.int8.eltwise, 0);
    assert!(compute_ops(&c.model).contains(&"Add".to_string()), "{:?}", compute_ops(&c.model));
    // So does an Add whose result is also a model output (no single
    // QuantizeLinear reader).
    let mut m = ModelProto::decode(qdq_add(false, &[2, 8]).as_slice()).unwrap();
    m.graph.as_mut().unwrap().output.push(vinfo("s", &[2, 8]));
    let c = compiled(&m.encode_to_vec());
    assert_eq!(c.report.int8.eltwise, 0);
}

/// The MLP at another batch size, and with an extra layer of its own.
fn mlp_rows(rows: i64, extra: bool) -> Vec<u8> {
    let mut nodes = vec![
        node("MatMul", "fc", &["x", "W"], &["h"], vec![]),
        node("Add", "fc.bias", &["h", "b"], &["hb"], vec![]),
        node("Relu", "act", &["hb"], &[if extra { "a" } else { "y" }], vec![]),
    ];
    let mut inits = vec![tensor("W", &[8, 4], &ramp(32, 0.1)), tensor("b", &[4], &[0.1, 0.2, 0.3, 0.4])];
    if extra {
        nodes.push(node("MatMul", "fc2", &["a", "W2"], &["y"], vec![]));
        inits.push(tensor("W2", &[4, 4], &ramp(16, 0.3)));
    }
    model(nodes, inits, vec![vinfo("x", &[rows, 8])], vec![vinfo("y", &[rows, 4])])
}

#[test]
fn entry_points_share_identical_weights_and_keep_their_own() {
    let (one, four, extra) = (mlp_rows(1, false), mlp_rows(4, false), mlp_rows(2, true));
    let c = rbln_compile::compile_entries(&[("one", &one), ("four", &four), ("extra", &extra)], "mlp", &Options::default()).unwrap();
    let m = &c.model;
    let names: Vec<&str> = m.entry_points().iter().map(|e| e.name).collect();
    assert_eq!(names, ["one", "four", "extra"]);
    assert_eq!(m.meta.name, "mlp");
    assert_eq!(c.entries.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(), ["four", "extra"]);
    // W and b once for all three; W2 only for `extra`.
    let alone = |b: &[u8]| compiled(b).model.weights.len() as u64;
    assert_eq!(m.weights.len() as u64, alone(&extra));
    assert!(alone(&one) < alone(&extra));
    let used: Vec<u64> = m.entry_points().iter().map(|e| e.weight_bytes_used()).collect();
    assert_eq!(used[0], used[1]);
    assert!(used[2] > used[0]);
    // Every program's weight tensors hold the bytes they hold when compiled alone.
    for (e, src) in m.entry_points().iter().zip([&one, &four, &extra]) {
        let single = compiled(src).model;
        for t in e.graph.tensors.iter().filter(|t| matches!(t.placement, Placement::Weight { .. })) {
            let s = single.graph.tensors.iter().find(|u| u.name == t.name).unwrap_or_else(|| panic!("{} not in the single model", t.name));
            let bytes = |p: Placement, w: &[u8]| w[p.offset() as usize..(p.offset() + p.size()) as usize].to_vec();
            assert_eq!(bytes(t.placement, &m.weights), bytes(s.placement, &single.weights), "{}: {}", e.name, t.name);
        }
    }
    // The file round-trips; a broken entry is named.
    let back = Model::from_bytes(&m.to_bytes().unwrap()).unwrap();
    assert_eq!(&back, m);
    let e = rbln_compile::compile_entries(&[("one", &one), ("bad", b"garbage")], "mlp", &Options::default()).err().unwrap();
    assert!(e.to_string().starts_with("entry point 'bad': not an ONNX model"), "{e}");
    let e = rbln_compile::compile_entries(&[("one", &one), ("one", &four)], "mlp", &Options::default()).err().unwrap();
    assert!(e.to_string().contains("two entry points are called 'one'"), "{e}");
}

/// Regressions from `make fuzz` (compiler/tests/fuzz.rs): sizes chosen to
/// overflow u64/i64 arithmetic in shape inference are errors naming the
/// problem, never an arithmetic-overflow panic.
#[test]
fn hostile_sizes_are_errors_not_overflows() {
    let err = |bytes: Vec<u8>| compile(&bytes, "t", &Options::default()).err().expect("a hostile model compiled").to_string();
    // DepthToSpace with a blocksize whose square overflows.
    let e = err(model(
        vec![node("DepthToSpace", "d2s", &["x"], &["y"], vec![attr_i("blocksize", i64::MAX)])],
        vec![],
        vec![vinfo("x", &[1, 4, 2, 2])],
        vec![vinfo("y", &[1, 1, 4, 4])],
    ));
    assert!(e.contains("blocksize 9223372036854775807 must be in 1..=65536"), "{e}");
    // ConvTranspose whose stride makes the full output overflow.
    let e = err(model(
        vec![node("ConvTranspose", "ct", &["x", "W"], &["y"], vec![attr_ints("strides", &[1 << 62, 1])])],
        vec![tensor("W", &[2, 2, 3, 3], &ramp(36, 0.1))],
        vec![vinfo("x", &[1, 2, 8, 8])],
        vec![vinfo("y", &[1, 2, 8, 8])],
    ));
    assert!(e.contains("the output size overflows"), "{e}");
    // Conv with pads that overflow the padded extent.
    let e = err(model(
        vec![node("Conv", "c", &["x", "W"], &["y"], vec![attr_ints("pads", &[i64::MAX, 0, i64::MAX, 0])])],
        vec![tensor("W", &[2, 2, 3, 3], &ramp(36, 0.1))],
        vec![vinfo("x", &[1, 2, 8, 8])],
        vec![vinfo("y", &[1, 2, 8, 8])],
    ));
    assert!(!e.is_empty());
    // Range over the whole of i64.
    let e = err(model(
        vec![node("Range", "r", &["s", "l", "d"], &["n"], vec![]), node("Cast", "c", &["n"], &["f"], vec![attr_i("to", 1)]), node("Add", "a", &["x", "f"], &["y"], vec![])],
        vec![ints("s", &[i64::MIN]), ints("l", &[i64::MAX]), ints("d", &[1])],
        vec![vinfo("x", &[4])],
        vec![vinfo("y", &[4])],
    ));
    assert!(e.contains("Range of"), "{e}");
}

#[test]
fn conv3d_runs_as_a_frame_gather_a_2d_conv_and_a_transpose() {
    let c3 = |x: &[i64], w: &[i64], attrs: Vec<AttributeProto>, y: &[i64]| {
        let n = w.iter().product::<i64>() as usize;
        model(
            vec![node("Conv", "c3", &["x", "w"], &["y"], attrs)],
            vec![tensor("w", w, &ramp(n, 0.01))],
            vec![vinfo("x", x)],
            vec![vinfo("y", y)],
        )
    };
    // Depth padding: FILL + copy, the frame gather, the conv, the transpose.
    let padded = c3(&[2, 2, 4, 5, 5], &[3, 2, 3, 3, 3], vec![attr_ints("pads", &[1; 6])], &[2, 3, 4, 5, 5]);
    assert_eq!(compute_ops(&compiled(&padded).model).len(), 4);
    // No depth padding and one output frame: no pad, and the transpose
    // moves only unit dims (a view).
    let one_frame = c3(&[1, 2, 3, 5, 5], &[3, 2, 3, 3, 3], vec![], &[1, 3, 1, 3, 3]);
    assert_eq!(compute_ops(&compiled(&one_frame).model).len(), 2);
    // Errors name what is wrong.
    let deep = c3(&[1, 2, 2, 5, 5], &[3, 2, 3, 3, 3], vec![], &[1, 3, 1, 3, 3]);
    assert!(unsupported(&deep, &Options::default()).2.contains("kernel is larger than the padded input"));
    let groups = c3(&[1, 4, 4, 5, 5], &[3, 3, 3, 3, 3], vec![attr_i("group", 2)], &[1, 3, 2, 3, 3]);
    assert!(unsupported(&groups, &Options::default()).2.contains("do not fit 4 input channels in 2 groups"));
    let t3 = model(
        vec![node("ConvTranspose", "t3", &["x", "w"], &["y"], vec![])],
        vec![tensor("w", &[2, 3, 2, 2, 2], &ramp(48, 0.01))],
        vec![vinfo("x", &[1, 2, 3, 3, 3])],
        vec![vinfo("y", &[1, 3, 4, 4, 4])],
    );
    // ConvTranspose: the zero-spread input, then the 3-D conv's gather,
    // conv and transpose.
    assert_eq!(compute_ops(&compiled(&t3).model).len(), 4);
}

#[test]
fn pool3d_runs_as_a_pool_over_h_w_then_one_over_d() {
    let p3 = |op: &str, attrs: Vec<AttributeProto>, y: &[i64]| {
        model(vec![node(op, "p3", &["x"], &["y"], attrs)], vec![], vec![vinfo("x", &[1, 2, 6, 8, 8])], vec![vinfo("y", y)])
    };
    let k = |v: &[i64]| attr_ints("kernel_shape", v);
    let mp = p3("MaxPool", vec![k(&[3, 3, 3]), attr_ints("strides", &[2, 2, 2]), attr_i("ceil_mode", 1)], &[1, 2, 3, 4, 4]);
    assert_eq!(compute_ops(&compiled(&mp).model), ["MaxPool", "MaxPool"]);
    let ap = p3("AveragePool", vec![k(&[2, 2, 2]), attr_ints("pads", &[1; 6])], &[1, 2, 7, 9, 9]);
    assert_eq!(compute_ops(&compiled(&ap).model), ["AveragePool", "AveragePool"]);
    let bad = p3("AveragePool", vec![k(&[3, 3, 3]), attr_ints("strides", &[2, 2, 2]), attr_i("ceil_mode", 1), attr_i("count_include_pad", 1)], &[1, 2, 3, 4, 4]);
    assert!(unsupported(&bad, &Options::default()).2.contains("ceil_mode=1 with count_include_pad=1"));
    let big = p3("MaxPool", vec![k(&[7, 3, 3])], &[1, 2, 1, 6, 6]);
    assert!(unsupported(&big, &Options::default()).2.contains("kernel is larger than the padded input"));
    let missing = p3("MaxPool", vec![], &[1, 2, 6, 8, 8]);
    assert!(unsupported(&missing, &Options::default()).2.contains("kernel_shape is missing"));
    // A window wider than the input by less than a stride with ceil_mode
    // (HF EfficientNet's AvgPool2d(1280, ceil_mode=True) on 7x7) averages
    // the whole input: the kernel becomes the input's extent.
    let wide = model(
        vec![node("AveragePool", "pool", &["x"], &["y"], vec![k(&[1280, 1280]), attr_ints("strides", &[1280, 1280]), attr_i("ceil_mode", 1)])],
        vec![],
        vec![vinfo("x", &[1, 4, 7, 7])],
        vec![vinfo("y", &[1, 4, 1, 1])],
    );
    let d = descriptors(&compiled(&wide).model);
    assert!(matches!(d[..], [Desc::Pool(p)] if (p.kh, p.kw, p.pad_bottom, p.pad_right) == (7, 7, 0, 0)), "{d:?}");
    let too_wide = model(
        vec![node("AveragePool", "pool", &["x"], &["y"], vec![k(&[9, 9]), attr_ints("strides", &[1, 1]), attr_i("ceil_mode", 1)])],
        vec![],
        vec![vinfo("x", &[1, 4, 7, 7])],
        vec![vinfo("y", &[1, 4, 1, 1])],
    );
    assert!(unsupported(&too_wide, &Options::default()).2.contains("kernel is larger than the padded input"));
}

#[test]
fn recurrent_layers_are_one_recurrent_op_per_direction_and_refuse_what_they_do_not_model() {
    // LSTM over 3 steps (seq 3, batch 2, input 4, hidden 5).
    let lstm = |attrs: Vec<AttributeProto>, extra: Vec<TensorProto>, ins: &[&str]| {
        let mut inits = vec![tensor("W", &[1, 20, 4], &ramp(80, 0.01)), tensor("R", &[1, 20, 5], &ramp(100, 0.01))];
        inits.extend(extra);
        model(
            vec![node("LSTM", "lstm", ins, &["y", "yh"], attrs)],
            inits,
            vec![vinfo("x", &[3, 2, 4])],
            vec![vinfo("y", &[3, 1, 2, 5])],
        )
    };
    let hidden = attr_i("hidden_size", 5);
    let ok = compiled(&lstm(vec![hidden.clone()], vec![], &["x", "W", "R"]));
    // The projection GEMM and the RECURRENT op; Y is a slice of its
    // output read in place (Y_h is not a graph output).
    assert_eq!(compute_ops(&ok.model), ["LSTM"; 2]);
    assert_eq!(ok.report.slices_in_place, 1);
    let rec: Vec<RecurrentDesc> = descriptors(&ok.model).into_iter().filter_map(|d| if let Desc::Recurrent(r) = d { Some(r) } else { None }).collect();
    assert_eq!(rec.len(), 1);
    assert_eq!((rec[0].cell, rec[0].flags, rec[0].seq, rec[0].batch, rec[0].hidden), (REC_LSTM, 0, 3, 2, 5));
    assert_eq!((rec[0].h0_va, rec[0].c0_va, rec[0].rb_va), (0, 0, 0), "zero initial states are the op's default");
    assert_ne!(rec[0].c_va, 0);
    // A constant zero initial state (PyTorch's export of nn.LSTM called
    // without one) is the default too; any other is copied in.
    let h0_of = |v: f32| {
        let m = compiled(&lstm(vec![hidden.clone()], vec![tensor("h0", &[1, 2, 5], &[v; 10])], &["x", "W", "R", "", "", "h0"]));
        descriptors(&m.model).into_iter().find_map(|d| if let Desc::Recurrent(r) = d { Some(r.h0_va) } else { None }).unwrap()
    };
    assert_eq!(h0_of(0.0), 0);
    assert_ne!(h0_of(0.5), 0);
    // Bidirectional GRUs with the reset after the product: one op per
    // direction, the second reversed, each with its Rb_h.
    let gru = model(
        vec![node("GRU", "gru", &["x", "W", "R", "B"], &["y"], vec![attr_i("hidden_size", 5), attr_i("linear_before_reset", 1), attr_s("direction", "bidirectional")])],
        vec![tensor("W", &[2, 15, 4], &ramp(120, 0.01)), tensor("R", &[2, 15, 5], &ramp(150, 0.01)), tensor("B", &[2, 30], &ramp(60, 0.01))],
        vec![vinfo("x", &[3, 2, 4])],
        vec![vinfo("y", &[3, 2, 2, 5])],
    );
    let rec: Vec<RecurrentDesc> = descriptors(&compiled(&gru).model).into_iter().filter_map(|d| if let Desc::Recurrent(r) = d { Some(r) } else { None }).collect();
    let flags: Vec<u32> = rec.iter().map(|r| r.flags).collect();
    assert_eq!(flags, [REC_LINEAR_BEFORE_RESET, REC_LINEAR_BEFORE_RESET | REC_REVERSE]);
    assert!(rec.iter().all(|r| r.cell == REC_GRU && r.rb_va != 0 && r.c_va == 0));
    let full = tensor("lens", &[2], &[3.0, 3.0]);
    compiled_unfused(&lstm(vec![hidden.clone()], vec![full], &["x", "W", "R", "", "lens"]));
    let reason = |attrs: Vec<AttributeProto>, extra: Vec<TensorProto>, ins: &[&str]| unsupported(&lstm(attrs, extra, ins), &Options::default()).2;
    assert!(reason(vec![hidden.clone(), attr_i("layout", 1)], vec![], &["x", "W", "R"]).contains("only 0 (sequence-major)"));
    assert!(reason(vec![hidden.clone(), attr_f("clip", 3.0)], vec![], &["x", "W", "R"]).contains("clip"));
    assert!(reason(vec![hidden.clone(), attr_i("input_forget", 1)], vec![], &["x", "W", "R"]).contains("input_forget"));
    let acts = AttributeProto { name: "activations".into(), strings: vec![b"Relu".to_vec(), b"Tanh".to_vec(), b"Tanh".to_vec()], r#type: 8, ..Default::default() };
    assert!(reason(vec![hidden.clone(), acts], vec![], &["x", "W", "R"]).contains("activations"));
    let short = tensor("lens", &[2], &[3.0, 2.0]);
    assert!(reason(vec![hidden.clone()], vec![short], &["x", "W", "R", "", "lens"]).contains("sequence_lens"));
    let peep = tensor("P", &[1, 15], &ramp(15, 0.1));
    assert!(reason(vec![hidden.clone()], vec![peep], &["x", "W", "R", "", "", "", "", "P"]).contains("peephole"));
    assert!(reason(vec![attr_i("hidden_size", 6)], vec![], &["x", "W", "R"]).contains("expected"));
    // Weights computed at run time.
    let bytes = model(
        vec![node("GRU", "gru", &["x", "w", "R"], &["y"], vec![attr_i("hidden_size", 5)])],
        vec![tensor("R", &[1, 15, 5], &ramp(75, 0.01))],
        vec![vinfo("x", &[3, 2, 4]), vinfo("w", &[1, 15, 4])],
        vec![vinfo("y", &[3, 1, 2, 5])],
    );
    assert!(unsupported(&bytes, &Options::default()).2.contains("W computed at run time"));
}

#[test]
fn top_k_is_one_selection_op_and_refuses_what_it_cannot_bound() {
    let topk = |k: i64, len: i64, k_const: bool| {
        model(
            vec![node("TopK", "topk", &["x", "k"], &["v", "i"], vec![])],
            if k_const { vec![ints("k", &[k])] } else { vec![] },
            if k_const { vec![vinfo("x", &[2, len])] } else { vec![vinfo("x", &[2, len]), vinfo("k", &[1])] },
            vec![vinfo("v", &[2, k]), typed_vinfo("i", &[2, k], elem::INT64)],
        )
    };
    // One TOPK and the cast of the indices; its halves (values, indices)
    // are slices of its output read in place.
    let c = compiled(&topk(3, 10, true));
    assert_eq!(compute_ops(&c.model), ["TopK"; 2]);
    assert_eq!(c.report.slices_in_place, 2);
    let m = compiled(&topk(300, 1000, true)).model;
    let d: Vec<TopKDesc> = descriptors(&m).into_iter().filter_map(|d| if let Desc::TopK(t) = d { Some(t) } else { None }).collect();
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].outer, d[0].len, d[0].inner, d[0].k, d[0].flags), (2, 1000, 1, 300, TOPK_LARGEST));
    assert!(unsupported(&topk(11, 10, true), &Options::default()).2.contains("0..=10"));
    assert!(compile(&topk(3, 10, false), "t", &Options::default()).is_err());
}

#[test]
fn pad_modes_crops_and_training_mode_batch_norm_of_constants() {
    let pad = |p: &[i64], mode: &str, y: &[i64]| {
        let attrs = vec![AttributeProto { name: "mode".into(), s: mode.as_bytes().to_vec(), r#type: 3, ..Default::default() }];
        model(vec![node("Pad", "pad", &["x", "p"], &["y"], attrs)], vec![ints("p", p)], vec![vinfo("x", &[1, 2, 4, 5])], vec![vinfo("y", y)])
    };
    // Reflect on two axes: one copy per axis.
    assert_eq!(compute_ops(&compiled(&pad(&[0, 0, 1, 2, 0, 0, 2, 1], "reflect", &[1, 2, 7, 8])).model).len(), 2);
    // Crop, then pad.
    assert_eq!(compute_ops(&compiled(&pad(&[0, 0, -1, 0, 0, 0, 1, 0], "constant", &[1, 2, 4, 5])).model).len(), 2);
    assert!(unsupported(&pad(&[0, 0, 0, 5, 0, 0, 0, 0], "reflect", &[1, 2, 4, 10]), &Options::default()).2.contains("smaller than the axis"));
    assert!(unsupported(&pad(&[0, 0, 0, 1, 0, 0, 0, 1], "wrap", &[1, 2, 4, 7]), &Options::default()).2.contains("mode 'wrap'"));
    assert!(unsupported(&pad(&[0, 0, -2, 0, 0, 0, -2, 0], "constant", &[1, 2, 0, 5]), &Options::default()).2.contains("crop all"));
    // BatchNormalization in training mode: folded on a constant input
    // (weight standardisation), refused on a run-time one.
    let bn = |x_const: bool| {
        let mut inits = vec![tensor("s", &[2], &[1.0, 2.0]), tensor("b", &[2], &[0.0, 1.0]), tensor("m", &[2], &[0.0, 0.0]), tensor("v", &[2], &[1.0, 1.0])];
        if x_const {
            inits.push(tensor("x", &[2, 2, 3], &ramp(12, 0.5)));
        }
        model(
            vec![
                node("BatchNormalization", "bn", &["x", "s", "b", "m", "v"], &["y"], vec![attr_i("training_mode", 1)]),
                node("Add", "add", &["y", "in"], &["z"], vec![]),
            ],
            inits,
            if x_const { vec![vinfo("in", &[2, 2, 3])] } else { vec![vinfo("x", &[2, 2, 3]), vinfo("in", &[2, 2, 3])] },
            vec![vinfo("z", &[2, 2, 3])],
        )
    };
    compiled(&bn(true));
    assert!(unsupported(&bn(false), &Options::default()).2.contains("training_mode=1 on a run-time input"));
}

/// Hard-swish written out and scaled per channel, `x * clip(x + 3, 0, 6) / 6
/// * s`, is one ELTWISE program over x and the broadcast scale, the scalar
/// constants as immediates; a value read outside the chain or a model
/// output stays an op of its own.
#[test]
fn element_wise_chains_fuse_into_one_eltwise_program() {
    let chain = |extra_output: bool| {
        let mut outs = vec![vinfo("y", &[1, 3, 2, 2])];
        if extra_output {
            outs.push(vinfo("m", &[1, 3, 2, 2]));
        }
        model(
            vec![
                node("Add", "plus3", &["x", "three"], &["p"], vec![]),
                node("Clip", "clip", &["p", "zero", "six"], &["c"], vec![]),
                node("Mul", "times", &["x", "c"], &["m"], vec![]),
                node("Div", "sixth", &["m", "six"], &["h"], vec![]),
                node("Mul", "scale", &["h", "s"], &["y"], vec![]),
            ],
            vec![tensor("three", &[], &[3.0]), tensor("zero", &[], &[0.0]), tensor("six", &[], &[6.0]), tensor("s", &[1, 3, 1, 1], &[0.5, 1.0, 2.0])],
            vec![vinfo("x", &[1, 3, 2, 2])],
            outs,
        )
    };
    let c = compiled(&chain(false));
    assert_eq!(compute_ops(&c.model), ["Eltwise(Add+Clip+Mul+Div)"]);
    assert_eq!(c.report.fused.eltwise, 3);
    let d: Vec<_> = descriptors(&c.model).into_iter().filter_map(|d| if let Desc::Eltwise(e) = d { Some(e) } else { None }).collect();
    assert_eq!(d.len(), 1);
    let e = d[0];
    assert_eq!((e.rank, e.n_inputs, e.n_instrs), (4, 2, 5));
    assert_eq!(e.out_dims[..4], [1, 3, 2, 2]);
    assert_eq!(e.in_strides[..2], [[0, 4, 2, 1, 0, 0], [0, 1, 0, 0, 0, 0]]);
    let imms: Vec<f32> = e.instrs[..5].iter().filter(|i| i.a == ELTWISE_IMM || i.b == ELTWISE_IMM).map(|i| i.imm).collect();
    assert_eq!(imms, [3.0, 6.0]);
    // Op by op when asked to.
    assert_eq!(compute_ops(&compiled_unfused(&chain(false)).model).len(), 4);
    // `m` is a model output: the chain splits there.
    let c = compiled(&chain(true));
    assert_eq!(compute_ops(&c.model), ["Eltwise(Add+Clip+Mul)", "Eltwise(Div+Mul)"]);
}

/// A gated linear unit, `x[:, :4] * sigmoid(x[:, 4:])`: both slices are
/// read in place through strides, so the two copies go too.
#[test]
fn slices_read_only_by_a_chain_become_strided_inputs() {
    let bytes = model(
        vec![
            node("Slice", "left", &["x", "s0", "e0", "ax"], &["a"], vec![]),
            node("Slice", "right", &["x", "s1", "e1", "ax"], &["b"], vec![]),
            node("Sigmoid", "gate", &["b"], &["g"], vec![]),
            node("Mul", "glu", &["a", "g"], &["y"], vec![]),
        ],
        vec![ints("s0", &[0]), ints("e0", &[4]), ints("s1", &[4]), ints("e1", &[8]), ints("ax", &[1])],
        vec![vinfo("x", &[3, 8])],
        vec![vinfo("y", &[3, 4])],
    );
    let c = compiled(&bytes);
    assert_eq!(compute_ops(&c.model), ["Eltwise(Slice+Sigmoid+Mul)"]);
    assert_eq!(compute_ops(&compiled_unfused(&bytes).model), ["Slice", "Slice", "Sigmoid", "Mul"]);
    let d: Vec<_> = descriptors(&c.model).into_iter().filter_map(|d| if let Desc::Eltwise(e) = d { Some(e) } else { None }).collect();
    let e = d[0];
    assert_eq!((e.n_inputs, e.n_instrs), (2, 2));
    assert_eq!(e.in_strides[..2], [[8, 1, 0, 0, 0, 0], [8, 1, 0, 0, 0, 0]]);
}

/// DenseNet's pattern at batch `n`: a = Sigmoid(x), b = Tanh(a),
/// c1 = Concat(a, b), d = Conv1x1(c1) (4 channels), c2 = Concat(a, b, d),
/// y = Conv1x1(c2); `twice` makes the first concatenation Concat(a, a).
fn dense_block(n: i64, twice: bool) -> Vec<u8> {
    let second = if twice { "a" } else { "b" };
    model(
        vec![
            node("Sigmoid", "s", &["x"], &["a"], vec![]),
            node("Tanh", "t", &["a"], &["b"], vec![]),
            node("Concat", "cat1", &["a", second], &["c1"], vec![attr_i("axis", 1)]),
            node("Conv", "conv1", &["c1", "W1"], &["d"], vec![]),
            node("Concat", "cat2", &["a", "b", "d"], &["c2"], vec![attr_i("axis", 1)]),
            node("Conv", "conv2", &["c2", "W2"], &["y"], vec![]),
        ],
        vec![tensor("W1", &[4, 8, 1, 1], &ramp(32, 0.1)), tensor("W2", &[2, 12, 1, 1], &ramp(24, 0.1))],
        vec![vinfo("x", &[n, 4, 3, 3])],
        vec![vinfo("y", &[n, 2, 3, 3])],
    )
}

#[test]
fn a_concatenation_of_many_inputs_takes_one_concat_per_sixteen() {
    // 20 vectors [2, 3] on axis 1: rows 2, output rows of 60.
    let names: Vec<String> = (0..20).map(|i| format!("a{i}")).collect();
    let mut nodes: Vec<NodeProto> = names.iter().map(|n| node("Sigmoid", n, &["x"], &[n], vec![])).collect();
    let refs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    nodes.push(node("Concat", "cat", &refs, &["y"], vec![attr_i("axis", 1)]));
    let c = compiled_unfused(&model(nodes, vec![], vec![vinfo("x", &[2, 3])], vec![vinfo("y", &[2, 60])]));
    let cats: Vec<ConcatDesc> = descriptors(&c.model).into_iter().filter_map(|d| if let Desc::Concat(c) = d { Some(c) } else { None }).collect();
    assert_eq!(cats.iter().map(|c| c.parts).collect::<Vec<_>>(), vec![16, 4]);
    assert_eq!((cats[1].rows, cats[1].out_cols, cats[1].col[3], cats[1].cols[3]), (2, 60, 57, 3));
}

#[test]
fn concatenations_are_written_in_place_by_their_inputs_producers() {
    let c = compiled_unfused(&dense_block(1, false));
    assert_eq!(c.report.concats_in_place, 2);
    assert!(!compute_ops(&c.model).iter().any(|o| o == "Concat"), "{:?}", compute_ops(&c.model));
    let g = &c.model.graph;
    let tensor = |name: &str| g.tensors.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no tensor {name}")).placement;
    let views: Vec<&rbln_format::Node> = g.nodes.iter().filter(|n| n.kind == NodeKind::View).collect();
    assert_eq!(views.iter().map(|n| n.inputs.len()).collect::<Vec<_>>(), vec![2, 3]);
    // a, b and d side by side; both concatenations start at a.
    let (a, b, d) = (tensor("a"), tensor("b"), tensor("d"));
    assert_eq!(b.offset(), a.offset() + a.size());
    assert_eq!(d.offset(), b.offset() + b.size());
    assert_eq!((tensor("c1").offset(), tensor("c1").size()), (a.offset(), a.size() + b.size()));
    assert_eq!((tensor("c2").offset(), tensor("c2").size()), (a.offset(), a.size() + b.size() + d.size()));
    // At batch 2 each input is two runs of the result: copies remain, one
    // CONCAT descriptor each (rows = the batch, columns 36 + 36 (+ 36)).
    let copied = compiled_unfused(&dense_block(2, false));
    assert_eq!(copied.report.concats_in_place, 0, "at batch 2 no input is contiguous in the result");
    assert_eq!(compute_ops(&copied.model).iter().filter(|o| *o == "Concat").count(), 2);
    let cats: Vec<ConcatDesc> = descriptors(&copied.model).into_iter().filter_map(|d| if let Desc::Concat(c) = d { Some(c) } else { None }).collect();
    assert_eq!(cats.len(), 2);
    assert_eq!((cats[0].rows, cats[0].out_cols, cats[0].parts, cats[0].col[..2].to_vec(), cats[0].cols[..2].to_vec()), (2, 72, 2, vec![0, 36], vec![36, 36]));
    assert_eq!((cats[1].out_cols, cats[1].parts, cats[1].col[2]), (108, 3, 72));
    assert!(!descriptors(&copied.model).iter().any(|d| matches!(d, Desc::StridedCopy(_))));
    // a at two places of one concatenation: that one stays a copy; the
    // second still goes in place (a and b side by side, d after them).
    let twice = compiled_unfused(&dense_block(1, true));
    assert_eq!(twice.report.concats_in_place, 1);
    assert_eq!(compute_ops(&twice.model).iter().filter(|o| *o == "Concat").count(), 1);
}

/// x [n,8,2,2] -> Sigmoid -> Split into channels 3 + 5 -> Tanh of each ->
/// Concat.
fn split_halves(n: i64) -> Vec<u8> {
    model(
        vec![
            node("Sigmoid", "s", &["x"], &["a"], vec![]),
            node("Split", "split", &["a", "sizes"], &["p", "q"], vec![attr_i("axis", 1)]),
            node("Tanh", "t1", &["p"], &["tp"], vec![]),
            node("Tanh", "t2", &["q"], &["tq"], vec![]),
            node("Concat", "cat", &["tq", "tp"], &["y"], vec![attr_i("axis", 1)]),
        ],
        vec![ints("sizes", &[3, 5])],
        vec![vinfo("x", &[n, 8, 2, 2])],
        vec![vinfo("y", &[n, 8, 2, 2])],
    )
}

#[test]
fn contiguous_slices_are_read_in_place() {
    let c = compiled_unfused(&split_halves(1));
    assert_eq!((c.report.slices_in_place, c.report.concats_in_place), (2, 1));
    assert!(!compute_ops(&c.model).iter().any(|o| o == "Split" || o == "Slice" || o == "Concat"), "{:?}", compute_ops(&c.model));
    let g = &c.model.graph;
    let place = |name: &str| g.tensors.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("no tensor {name}")).placement;
    // p is a's first 3 channels (48 bytes), q the other 5.
    assert_eq!((place("p").offset(), place("p").size()), (place("a").offset(), 48));
    assert_eq!((place("q").offset(), place("q").size()), (place("a").offset() + 48, 80));
    // At batch 2 each part is two runs of a: copies.
    let c = compiled_unfused(&split_halves(2));
    assert_eq!(c.report.slices_in_place, 0);
    assert_eq!(compute_ops(&c.model).iter().filter(|o| *o == "Split").count(), 2);
}
