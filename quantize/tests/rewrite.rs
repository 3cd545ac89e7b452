//! Host tests of rbln-quantize's model rewriting (the calibration and the
//! report run on the NPU: tests/vm/quantize.sh).

use std::collections::HashMap;

use prost::Message;
use rbln_compile::onnx::*;
use rbln_quantize::{fold_batchnorm, plan, rewrite, QuantOptions};

fn tensor(name: &str, dims: &[i64], v: Vec<f32>) -> TensorProto {
    TensorProto { name: name.into(), dims: dims.to_vec(), data_type: elem::FLOAT, float_data: v, ..Default::default() }
}

fn vinfo(name: &str, dims: &[i64]) -> ValueInfoProto {
    let dim = dims.iter().map(|&d| Dimension { dim_value: Some(d), dim_param: None }).collect();
    ValueInfoProto { name: name.into(), r#type: Some(TypeProto { tensor_type: Some(TypeProtoTensor { elem_type: elem::FLOAT, shape: Some(TensorShapeProto { dim }) }) }) }
}

fn node(op: &str, name: &str, ins: &[&str], outs: &[&str]) -> NodeProto {
    NodeProto { op_type: op.into(), name: name.into(), input: ins.iter().map(|s| s.to_string()).collect(), output: outs.iter().map(|s| s.to_string()).collect(), ..Default::default() }
}

fn ramp(n: usize, s: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 % 23) as f32 - 11.0) * s).collect()
}

/// x -> Conv(3->4, 3x3, pad 1) -> BatchNormalization -> Relu -> Conv(4->2, 1x1) -> y
fn model(opset: i64) -> ModelProto {
    let pads = AttributeProto { name: "pads".into(), ints: vec![1, 1, 1, 1], r#type: 7, ..Default::default() };
    let mut c1 = node("Conv", "c1", &["x", "w1", "b1"], &["h"]);
    c1.attribute.push(pads);
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: opset }],
        graph: Some(GraphProto {
            node: vec![
                c1,
                node("BatchNormalization", "bn", &["h", "s", "bb", "m", "v"], &["hn"]),
                node("Relu", "relu", &["hn"], &["r"]),
                node("Conv", "c2", &["r", "w2"], &["y"]),
            ],
            initializer: vec![
                tensor("w1", &[4, 3, 3, 3], ramp(108, 0.05)),
                tensor("b1", &[4], vec![0.1, -0.2, 0.3, 0.0]),
                tensor("s", &[4], vec![1.0, 2.0, 0.5, 1.5]),
                tensor("bb", &[4], vec![0.0, 0.1, -0.1, 0.2]),
                tensor("m", &[4], vec![0.1, 0.0, -0.2, 0.3]),
                tensor("v", &[4], vec![1.0, 0.5, 2.0, 1.0]),
                tensor("w2", &[2, 4, 1, 1], ramp(8, 0.1)),
            ],
            input: vec![vinfo("x", &[1, 3, 6, 6])],
            output: vec![vinfo("y", &[1, 2, 6, 6])],
            name: "g".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn batchnorm_folds_then_every_conv_becomes_an_int8_op() {
    let mut m = model(17);
    assert_eq!(fold_batchnorm(&mut m).unwrap(), 1);
    let ops: Vec<&str> = m.graph.as_ref().unwrap().node.iter().map(|n| n.op_type.as_str()).collect();
    assert_eq!(ops, ["Conv", "Relu", "Conv"]);
    let p = plan(&m).unwrap();
    assert_eq!(p.targets.len(), 2);
    // The first conv is quantised after its Relu; the second reads it.
    assert_eq!((p.targets[0].x.as_str(), p.targets[0].out.as_str()), ("x", "r"));
    assert_eq!((p.targets[1].x.as_str(), p.targets[1].out.as_str()), ("r", "y"));
    assert_eq!(p.tensors, ["x", "r", "y"]);
    let ranges: HashMap<String, (f32, f32)> = [("x", (-2.0, 2.0)), ("r", (0.0, 3.0)), ("y", (-4.0, 4.0))].iter().map(|(k, v)| (k.to_string(), *v)).collect();
    for reduce_range in [false, true] {
        let q = rewrite(&m, &p, &ranges, QuantOptions { reduce_range }).unwrap();
        let g = q.graph.as_ref().unwrap();
        // Weights int8 within ±127 (±64 with reduce_range), one scale per channel.
        let w = g.initializer.iter().find(|t| t.name == "c1.weight_bn_folded_quantized").expect("int8 weights");
        assert_eq!(w.data_type, elem::INT8);
        let lim = if reduce_range { 64 } else { 127 };
        assert!(w.int32_data.iter().all(|v| v.abs() <= lim) && w.int32_data.iter().any(|v| v.abs() == lim));
        // The graph output keeps its name (made by a DequantizeLinear).
        assert!(g.node.iter().any(|n| n.op_type == "DequantizeLinear" && n.output == ["y"]));
        let c = rbln_compile::compile(&q.encode_to_vec(), "q", &rbln_compile::Options::default()).unwrap();
        assert_eq!((c.report.int8.conv, c.report.int8.int8_out), (2, 2), "reduce_range {reduce_range}");
    }
}

#[test]
fn models_that_cannot_be_quantised_are_refused() {
    let e = plan(&model(11)).unwrap_err();
    assert!(e.contains("opset is 11") && e.contains("opset 13"), "{e}");
    let mut m = model(17);
    m.graph.as_mut().unwrap().node.retain(|n| n.op_type == "Relu");
    let e = plan(&m).unwrap_err();
    assert!(e.contains("nothing to quantise"), "{e}");
}
