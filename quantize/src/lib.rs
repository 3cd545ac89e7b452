//! Post-training int8 quantisation of float ONNX models, calibrated on
//! the NPU.
//!
//! 0. [`fold_batchnorm`]: a BatchNormalization after a Conv moves into
//!    the Conv's weights and bias (as onnxruntime's pre-processing does),
//!    so that the normalised result is what gets quantised.
//! 1. [`plan`]: every Conv, MatMul and Gemm with constant float weights
//!    is a target. Its activation input and its result (after a Relu or
//!    Clip that is its only reader) are the tensors to calibrate.
//! 2. [`calibrate`]: the float model, compiled with those tensors as extra
//!    outputs, runs on the NPU over the user's samples; each tensor's
//!    range is its min–max, or the given percentiles of a 2048-bin
//!    histogram (a second pass).
//! 3. [`rewrite`]: the QDQ model onnxruntime's quantizer would write:
//!    activations u8 asymmetric per tensor, weights int8 symmetric per
//!    output channel (±127, or ±64 with `reduce_range`: the NPU's fastest
//!    exact kernel), biases int32 at scale `sx·sw`; rbln-compile runs each
//!    target as one integer op.
//! 4. [`report`]: the float and the quantised model on the NPU, every
//!    target's result compared (cosine similarity, largest error).

use std::collections::{HashMap, HashSet};

use rbln_compile::onnx::{elem, tensor_const, AttributeProto, ModelProto, NodeProto, TensorProto};
use rbln_compile::Options;
use rbln_runtime::{Runtime, Tensor};

pub type Result<T> = std::result::Result<T, String>;

/// Oldest opset whose DequantizeLinear takes per-channel scales (`axis`).
pub const MIN_OPSET: i64 = 13;

/// One Conv / MatMul / Gemm to quantise.
#[derive(Clone, Debug)]
pub struct Target {
    /// Index of the node in the graph.
    pub node: usize,
    pub name: String,
    pub op: String,
    /// The activation input, the weight and bias initializers.
    pub x: String,
    pub w: String,
    pub bias: Option<String>,
    /// The tensor quantised after the op: its result, or the result of
    /// the Relu / Clip that is its only reader.
    pub out: String,
    /// The weight axis of the output channels.
    pub channel_axis: usize,
}

#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub targets: Vec<Target>,
    /// Every tensor to calibrate, in first-use order.
    pub tensors: Vec<String>,
}

fn graph(m: &ModelProto) -> Result<&rbln_compile::onnx::GraphProto> {
    m.graph.as_ref().ok_or_else(|| "the model has no graph".to_string())
}

fn attr_i(n: &NodeProto, name: &str, default: i64) -> i64 {
    n.attribute.iter().find(|a| a.name == name).map_or(default, |a| a.i)
}

fn attr_f(n: &NodeProto, name: &str, default: f32) -> f32 {
    n.attribute.iter().find(|a| a.name == name).map_or(default, |a| a.f)
}

/// The model's default-domain opset.
pub fn opset(m: &ModelProto) -> i64 {
    m.opset_import.iter().find(|o| o.domain.is_empty() || o.domain == "ai.onnx").map_or(0, |o| o.version)
}

/// Folds every inference-mode BatchNormalization whose input is a Conv
/// result read by nothing else (constant weights and statistics) into
/// that Conv; returns how many.
pub fn fold_batchnorm(m: &mut ModelProto) -> Result<usize> {
    let g = m.graph.as_mut().ok_or("the model has no graph")?;
    let mut folded = 0;
    loop {
        let consts: HashMap<String, Vec<f32>> = g
            .initializer
            .iter()
            .filter(|t| t.data_type == elem::FLOAT)
            .filter_map(|t| tensor_const(t, &t.name).ok().map(|c| (t.name.clone(), c.floats())))
            .collect();
        let outputs: HashSet<String> = g.output.iter().map(|o| o.name.clone()).collect();
        let mut found = None;
        for (b, bn) in g.node.iter().enumerate() {
            if bn.op_type != "BatchNormalization" || bn.output.len() != 1 || attr_i(bn, "training_mode", 0) != 0 || bn.input.len() != 5 {
                continue;
            }
            let x = &bn.input[0];
            let Some(c) = g.node.iter().position(|n| n.op_type == "Conv" && n.output.first() == Some(x)) else { continue };
            let readers = g.node.iter().filter(|n| n.input.contains(x)).count();
            if readers != 1 || outputs.contains(x) {
                continue;
            }
            let conv = &g.node[c];
            let (Some(w), Some(sc), Some(bb), Some(mean), Some(var)) =
                (conv.input.get(1).and_then(|w| consts.get(w)), consts.get(&bn.input[1]), consts.get(&bn.input[2]), consts.get(&bn.input[3]), consts.get(&bn.input[4]))
            else {
                continue;
            };
            let ch = sc.len();
            if [bb.len(), mean.len(), var.len()].iter().any(|&l| l != ch) || ch == 0 || w.len() % ch != 0 {
                continue;
            }
            let bias = match conv.input.get(2).filter(|s| !s.is_empty()) {
                Some(n) => match consts.get(n) {
                    Some(v) if v.len() == ch => v.clone(),
                    _ => continue,
                },
                None => vec![0.0; ch],
            };
            let eps = attr_f(bn, "epsilon", 1e-5);
            let k: Vec<f32> = (0..ch).map(|i| sc[i] / (var[i] + eps).sqrt()).collect();
            let per = w.len() / ch;
            let w2: Vec<f32> = w.iter().enumerate().map(|(i, &v)| v * k[i / per]).collect();
            let b2: Vec<f32> = (0..ch).map(|i| (bias[i] - mean[i]) * k[i] + bb[i]).collect();
            found = Some((c, b, w2, b2));
            break;
        }
        let Some((c, b, w2, b2)) = found else { return Ok(folded) };
        let conv_name = if g.node[c].name.is_empty() { format!("conv{c}") } else { g.node[c].name.clone() };
        let wdims = g.initializer.iter().find(|t| Some(&t.name) == g.node[c].input.get(1)).map(|t| t.dims.clone()).unwrap_or_default();
        let (wn, bn_) = (format!("{conv_name}.weight_bn_folded"), format!("{conv_name}.bias_bn_folded"));
        g.initializer.push(f32_tensor(&wn, &wdims, w2));
        g.initializer.push(f32_tensor(&bn_, &[b2.len() as i64], b2));
        let out = g.node[b].output[0].clone();
        let conv = &mut g.node[c];
        conv.input.truncate(2);
        conv.input[1] = wn;
        conv.input.push(bn_);
        conv.output[0] = out;
        g.node.remove(b);
        folded += 1;
    }
}

/// Finds the targets of a float model.
pub fn plan(m: &ModelProto) -> Result<Plan> {
    let g = graph(m)?;
    if opset(m) < MIN_OPSET {
        return Err(format!("the model's opset is {}; rbln-quantize needs opset {MIN_OPSET} or later (per-channel DequantizeLinear)", opset(m)));
    }
    if g.node.iter().any(|n| matches!(n.op_type.as_str(), "QuantizeLinear" | "DequantizeLinear" | "QLinearConv" | "QLinearMatMul")) {
        return Err("the model is already quantised".into());
    }
    let inits: HashMap<&str, &TensorProto> = g.initializer.iter().map(|t| (t.name.as_str(), t)).collect();
    let outputs: HashSet<&str> = g.output.iter().map(|o| o.name.as_str()).collect();
    let mut readers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for x in &n.input {
            readers.entry(x.as_str()).or_default().push(i);
        }
    }
    let float_init = |name: &str| inits.get(name).filter(|t| t.data_type == elem::FLOAT);
    let mut p = Plan::default();
    let mut seen = HashSet::new();
    for (i, n) in g.node.iter().enumerate() {
        let (Some(x), Some(w)) = (n.input.first(), n.input.get(1)) else { continue };
        let Some(wt) = float_init(w) else { continue };
        if inits.contains_key(x.as_str()) || n.output.is_empty() {
            continue;
        }
        let channel_axis = match n.op_type.as_str() {
            "Conv" if wt.dims.len() >= 3 => 0,
            "MatMul" if wt.dims.len() == 2 => 1,
            "Gemm" if attr_i(n, "transA", 0) == 0 && attr_f(n, "alpha", 1.0) == 1.0 && attr_f(n, "beta", 1.0) == 1.0 => {
                if attr_i(n, "transB", 0) != 0 { 0 } else { 1 }
            }
            _ => continue,
        };
        let channels = wt.dims.get(channel_axis).copied().unwrap_or(0);
        let bias = n.input.get(2).filter(|b| !b.is_empty()).cloned();
        if let Some(b) = &bias {
            match float_init(b) {
                Some(t) if t.dims.iter().product::<i64>() == channels => {}
                _ => continue, // a run-time or broadcast bias stays float
            }
        }
        // A Relu or Clip that alone reads the result: quantise after it.
        let mut out = n.output[0].clone();
        if let Some([r]) = readers.get(out.as_str()).map(|v| v.as_slice()) {
            let rn = &g.node[*r];
            if matches!(rn.op_type.as_str(), "Relu" | "Clip") && !outputs.contains(out.as_str()) && !rn.output.is_empty() {
                out = rn.output[0].clone();
            }
        }
        for t in [x, &out] {
            if seen.insert(t.clone()) {
                p.tensors.push(t.clone());
            }
        }
        p.targets.push(Target { node: i, name: n.name.clone(), op: n.op_type.clone(), x: x.clone(), w: w.clone(), bias, out, channel_axis });
    }
    if p.targets.is_empty() {
        return Err("nothing to quantise: no Conv, MatMul or Gemm with constant float weights".into());
    }
    Ok(p)
}

/// How activation ranges are chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Method {
    MinMax,
    /// Clip at the given percentile of |values| on each side (e.g. 99.99).
    Percentile(f64),
}

/// Calibration samples: one tensor per model input, per sample.
pub type Samples = Vec<Vec<Tensor>>;

const BINS: usize = 2048;

/// Runs `model` with `extra` as extra outputs over `samples` on `dev`,
/// handing each sample's extra tensors (in `extra` order) to `f`.
fn run_extra(dev: &rbln_umd::Device, model: &[u8], extra: &[String], samples: &Samples, mut f: impl FnMut(&[&[f32]])) -> Result<()> {
    let opts = Options { extra_outputs: extra.to_vec(), ..Default::default() };
    let c = rbln_compile::compile(model, "calibration", &opts).map_err(|e| format!("compiling for calibration: {e}"))?;
    let names: Vec<String> = c.model.meta.outputs.iter().map(|o| o.name.clone()).collect();
    let idx: Vec<usize> = extra.iter().map(|e| names.iter().position(|n| n == e).unwrap_or(0)).collect();
    let mut rt = Runtime::new(dev, c.model).map_err(|e| format!("loading the calibration program: {e}"))?;
    for (k, s) in samples.iter().enumerate() {
        let outs = rt.run(s).map_err(|e| format!("calibration sample {k}: {e}"))?;
        let views: Vec<&[f32]> = idx.iter().map(|&i| outs[i].as_f32().unwrap_or(&[])).collect();
        f(&views);
    }
    Ok(())
}

/// The range of every planned tensor over the samples.
pub fn calibrate(dev: &rbln_umd::Device, model: &[u8], p: &Plan, samples: &Samples, method: Method) -> Result<HashMap<String, (f32, f32)>> {
    if samples.is_empty() {
        return Err("no calibration samples".into());
    }
    let n = p.tensors.len();
    let mut lo = vec![f32::INFINITY; n];
    let mut hi = vec![f32::NEG_INFINITY; n];
    run_extra(dev, model, &p.tensors, samples, |outs| {
        for (t, v) in outs.iter().enumerate() {
            for &x in v.iter().filter(|x| x.is_finite()) {
                lo[t] = lo[t].min(x);
                hi[t] = hi[t].max(x);
            }
        }
    })?;
    if let Method::Percentile(pct) = method {
        if !(50.0..=100.0).contains(&pct) {
            return Err(format!("percentile {pct} is outside 50..100"));
        }
        let mut hist = vec![vec![0u64; BINS]; n];
        run_extra(dev, model, &p.tensors, samples, |outs| {
            for (t, v) in outs.iter().enumerate() {
                let w = (hi[t] - lo[t]).max(f32::MIN_POSITIVE);
                for &x in v.iter().filter(|x| x.is_finite()) {
                    let b = (((x - lo[t]) / w) * BINS as f32) as usize;
                    hist[t][b.min(BINS - 1)] += 1;
                }
            }
        })?;
        for t in 0..n {
            let total: u64 = hist[t].iter().sum();
            let cut = ((1.0 - pct / 100.0) * total as f64) as u64;
            let w = (hi[t] - lo[t]) / BINS as f32;
            let (mut acc, mut a) = (0u64, 0usize);
            while a < BINS - 1 && acc + hist[t][a] <= cut {
                acc += hist[t][a];
                a += 1;
            }
            let (mut acc2, mut b) = (0u64, BINS - 1);
            while b > a && acc2 + hist[t][b] <= cut {
                acc2 += hist[t][b];
                b -= 1;
            }
            let (l, h) = (lo[t] + a as f32 * w, lo[t] + (b + 1) as f32 * w);
            lo[t] = l;
            hi[t] = h;
        }
    }
    Ok(p.tensors.iter().cloned().zip(lo.into_iter().zip(hi)).map(|(t, (l, h))| (t, (l.min(0.0), h.max(0.0)))).collect())
}

/// u8 scale and zero point of the range `[lo, hi]` (which holds 0).
pub fn activation_params(lo: f32, hi: f32) -> (f32, u8) {
    let scale = ((hi - lo) / 255.0).max(1e-8);
    let zero = (-lo / scale).round_ties_even().clamp(0.0, 255.0) as u8;
    (scale, zero)
}

/// Options of [`rewrite`].
#[derive(Clone, Copy, Debug, Default)]
pub struct QuantOptions {
    /// Weights in ±64 instead of ±127 (7 bits): the NPU multiplies them
    /// on its fastest exact path whatever the activations.
    pub reduce_range: bool,
}

fn f32_tensor(name: &str, dims: &[i64], v: Vec<f32>) -> TensorProto {
    TensorProto { name: name.into(), dims: dims.to_vec(), data_type: elem::FLOAT, float_data: v, ..Default::default() }
}

fn int_tensor(name: &str, dims: &[i64], ty: i32, v: Vec<i32>) -> TensorProto {
    TensorProto { name: name.into(), dims: dims.to_vec(), data_type: ty, int32_data: v, ..Default::default() }
}

fn qdq_node(op: &str, name: &str, ins: [&str; 3], out: &str, axis: Option<i64>) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: ins.iter().filter(|s| !s.is_empty()).map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        attribute: axis.map(|a| vec![AttributeProto { name: "axis".into(), i: a, r#type: 2, ..Default::default() }]).unwrap_or_default(),
        ..Default::default()
    }
}

/// The QDQ model: `m` with QuantizeLinear/DequantizeLinear around every
/// target (see the module doc).
pub fn rewrite(m: &ModelProto, p: &Plan, ranges: &HashMap<String, (f32, f32)>, o: QuantOptions) -> Result<ModelProto> {
    let g = graph(m)?;
    let inits: HashMap<&str, &TensorProto> = g.initializer.iter().map(|t| (t.name.as_str(), t)).collect();
    let qmax: f32 = if o.reduce_range { 64.0 } else { 127.0 };
    let mut out = m.clone();
    let og = out.graph.as_mut().ok_or("the model has no graph")?;
    let mut nodes: Vec<NodeProto> = Vec::new();
    let mut new_inits: Vec<TensorProto> = Vec::new();
    // Tensors now made by a DequantizeLinear (their consumers read them
    // as they are), and the scale of each quantised activation.
    let mut dequantized: HashSet<String> = HashSet::new();
    let mut act_scale: HashMap<String, f32> = HashMap::new();
    let by_node: HashMap<usize, &Target> = p.targets.iter().map(|t| (t.node, t)).collect();
    let outs: HashSet<&str> = p.targets.iter().map(|t| t.out.as_str()).collect();
    let range = |t: &str| ranges.get(t).copied().ok_or_else(|| format!("no calibrated range for '{t}'"));
    // QuantizeLinear + DequantizeLinear of activation `t` read from `src`,
    // the DequantizeLinear writing `dst`.
    let act_qdq = |t: &str, src: &str, dst: &str, nodes: &mut Vec<NodeProto>, new_inits: &mut Vec<TensorProto>| -> Result<f32> {
        let (lo, hi) = range(t)?;
        let (s, z) = activation_params(lo, hi);
        let (sn, zn, qn) = (format!("{t}_scale"), format!("{t}_zero_point"), format!("{t}_quantized"));
        new_inits.push(f32_tensor(&sn, &[], vec![s]));
        new_inits.push(int_tensor(&zn, &[], elem::UINT8, vec![z as i32]));
        nodes.push(qdq_node("QuantizeLinear", &format!("{t}_QuantizeLinear"), [src, &sn, &zn], &qn, None));
        nodes.push(qdq_node("DequantizeLinear", &format!("{t}_DequantizeLinear"), [&qn, &sn, &zn], dst, None));
        Ok(s)
    };
    for (i, n) in g.node.iter().enumerate() {
        let mut n = n.clone();
        if let Some(t) = by_node.get(&i) {
            // The activation input.
            if !dequantized.contains(&t.x) {
                let dq = format!("{}_dequantized", t.x);
                let s = act_qdq(&t.x, &t.x, &dq, &mut nodes, &mut new_inits)?;
                act_scale.insert(t.x.clone(), s);
                n.input[0] = dq;
            }
            let sx = *act_scale.get(&t.x).ok_or_else(|| format!("no scale for '{}'", t.x))?;
            // Weights: int8, symmetric, per output channel.
            let wt = inits.get(t.w.as_str()).ok_or_else(|| format!("weight '{}' is not an initializer", t.w))?;
            let wc = tensor_const(wt, &t.w).map_err(|e| e.to_string())?;
            let wv = wc.floats();
            let dims: Vec<usize> = wt.dims.iter().map(|&d| d as usize).collect();
            let ch = dims[t.channel_axis];
            let inner: usize = dims[t.channel_axis + 1..].iter().product();
            let chan = |k: usize| (k / inner) % ch;
            let mut amax = vec![0f32; ch];
            for (k, &v) in wv.iter().enumerate() {
                amax[chan(k)] = amax[chan(k)].max(v.abs());
            }
            let sw: Vec<f32> = amax.iter().map(|&a| if a > 0.0 { a / qmax } else { 1.0 }).collect();
            let q: Vec<i32> = wv.iter().enumerate().map(|(k, &v)| (v / sw[chan(k)]).round_ties_even().clamp(-qmax, qmax) as i32).collect();
            let (qn, sn, zn, dn) = (format!("{}_quantized", t.w), format!("{}_scale", t.w), format!("{}_zero_point", t.w), format!("{}_dequantized", t.w));
            new_inits.push(int_tensor(&qn, &wt.dims, elem::INT8, q));
            new_inits.push(f32_tensor(&sn, &[ch as i64], sw.clone()));
            new_inits.push(int_tensor(&zn, &[ch as i64], elem::INT8, vec![0; ch]));
            nodes.push(qdq_node("DequantizeLinear", &format!("{}_DequantizeLinear", t.w), [&qn, &sn, &zn], &dn, Some(t.channel_axis as i64)));
            n.input[1] = dn;
            // Bias: int32 at scale sx·sw.
            if let Some(b) = &t.bias {
                let bt = inits.get(b.as_str()).ok_or_else(|| format!("bias '{b}' is not an initializer"))?;
                let bv = tensor_const(bt, b).map_err(|e| e.to_string())?.floats();
                let bs: Vec<f32> = sw.iter().map(|&s| s * sx).collect();
                let bq: Vec<i32> = bv.iter().zip(&bs).map(|(&v, &s)| (v as f64 / s as f64).round_ties_even().clamp(i32::MIN as f64, i32::MAX as f64) as i32).collect();
                let (qn, sn, dn) = (format!("{b}_quantized"), format!("{b}_scale"), format!("{b}_dequantized"));
                new_inits.push(int_tensor(&qn, &bt.dims, elem::INT32, bq));
                new_inits.push(f32_tensor(&sn, &[ch as i64], bs));
                nodes.push(qdq_node("DequantizeLinear", &format!("{b}_DequantizeLinear"), [&qn, &sn, ""], &dn, Some(0)));
                n.input[2] = dn;
            }
        }
        // The result of a target (or of its Relu / Clip): quantised, its
        // consumers read the DequantizeLinear's output under the old name.
        let o = n.output.first().cloned().unwrap_or_default();
        if outs.contains(o.as_str()) && !dequantized.contains(&o) {
            let raw = format!("{o}_float");
            n.output[0] = raw.clone();
            nodes.push(n);
            let s = act_qdq(&o, &raw, &o, &mut nodes, &mut new_inits)?;
            act_scale.insert(o.clone(), s);
            dequantized.insert(o);
        } else {
            nodes.push(n);
        }
    }
    og.node = nodes;
    og.initializer.extend(new_inits);
    Ok(out)
}

/// The error one target's result takes from quantisation.
#[derive(Clone, Debug)]
pub struct LayerError {
    pub target: String,
    pub tensor: String,
    pub cosine: f64,
    /// Largest |quantised − float| over the largest |float|.
    pub max_rel: f64,
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    if aa == 0.0 && bb == 0.0 {
        return 1.0;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(f64::MIN_POSITIVE)
}

/// Every target's result in the float and the quantised model, on the
/// first sample, compared; plus the model outputs (target "<output>").
pub fn report(dev: &rbln_umd::Device, float: &[u8], quant: &[u8], p: &Plan, samples: &Samples) -> Result<Vec<LayerError>> {
    let first: Samples = samples.iter().take(1).cloned().collect();
    let mut tensors: Vec<String> = p.targets.iter().map(|t| t.out.clone()).collect();
    tensors.dedup();
    let model = rbln_compile::onnx::decode(float).map_err(|e| e.to_string())?;
    let outs: Vec<String> = graph(&model)?.output.iter().map(|o| o.name.clone()).collect();
    let all: Vec<String> = outs.iter().chain(&tensors).cloned().collect::<Vec<_>>();
    let mut all_u = Vec::new();
    for t in all {
        if !all_u.contains(&t) {
            all_u.push(t);
        }
    }
    let mut f: Vec<Vec<f32>> = Vec::new();
    run_extra(dev, float, &all_u, &first, |v| f = v.iter().map(|x| x.to_vec()).collect())?;
    let mut q: Vec<Vec<f32>> = Vec::new();
    run_extra(dev, quant, &all_u, &first, |v| q = v.iter().map(|x| x.to_vec()).collect())?;
    Ok(all_u
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let target = if outs.contains(t) {
                "<output>".to_string()
            } else {
                p.targets.iter().find(|x| &x.out == t).map_or(String::new(), |x| x.name.clone())
            };
            let big = f[i].iter().fold(0f32, |a, &x| a.max(x.abs())).max(f32::MIN_POSITIVE);
            let err = f[i].iter().zip(&q[i]).fold(0f32, |a, (&x, &y)| a.max((x - y).abs()));
            LayerError { target, tensor: t.clone(), cosine: cosine(&f[i], &q[i]), max_rel: (err / big) as f64 }
        })
        .collect())
}

/// Reads calibration samples from a `.npz` archive: one array per model
/// input (float32), named as the input, shaped `[N, ...input shape]` (N
/// samples) or as the input (one sample).
pub fn read_npz(path: &std::path::Path, m: &ModelProto) -> Result<Samples> {
    let g = graph(m)?;
    let inits: HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    let mut z = npyz::npz::NpzArchive::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut per_input: Vec<(Vec<u64>, Vec<f32>)> = Vec::new();
    for vi in g.input.iter().filter(|i| !inits.contains(i.name.as_str())) {
        let shape: Vec<u64> = vi
            .r#type
            .as_ref()
            .and_then(|t| t.tensor_type.as_ref())
            .and_then(|t| t.shape.as_ref())
            .map(|s| s.dim.iter().map(|d| d.dim_value.unwrap_or(0).max(0) as u64).collect())
            .unwrap_or_default();
        let arr = z
            .by_name(&vi.name)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .ok_or_else(|| format!("{}: no array named '{}' (one per model input)", path.display(), vi.name))?;
        let ashape = arr.shape().to_vec();
        let data: Vec<f32> = arr.into_vec::<f32>().map_err(|e| format!("{}: '{}' is not float32: {e}", path.display(), vi.name))?;
        let per: u64 = shape.iter().product();
        if shape.contains(&0) || per == 0 {
            return Err(format!("input '{}' has no static shape", vi.name));
        }
        if ashape != shape && (ashape.len() != shape.len() + 1 || ashape[1..] != shape[..]) {
            return Err(format!("{}: '{}' has shape {ashape:?}; expected {shape:?} or [N, {}]", path.display(), vi.name, shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")));
        }
        per_input.push((shape, data));
    }
    let counts: Vec<usize> = per_input.iter().map(|(s, d)| d.len() / s.iter().product::<u64>() as usize).collect();
    let n = counts.first().copied().unwrap_or(0);
    if counts.iter().any(|&c| c != n) || n == 0 {
        return Err(format!("{}: the inputs have different sample counts {counts:?}", path.display()));
    }
    Ok((0..n)
        .map(|k| per_input.iter().map(|(s, d)| {
            let per = s.iter().product::<u64>() as usize;
            Tensor::new(s, d[k * per..(k + 1) * per].to_vec())
        }).collect())
        .collect())
}
