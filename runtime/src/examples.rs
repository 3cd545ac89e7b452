//! Example models made with the `.rbln` writer API, with CPU references.

use std::mem::offset_of;

use rbln_format::{DType, Model, ModelBuilder, Node, RelocKind, StreamRole, Va};
use rbln_hw::ops::{GemmDesc, Unary, GEMM_BIAS};

use crate::Tensor;

/// A model, inputs for it and the outputs a CPU computes for them.
pub struct Example {
    pub model: Model,
    pub inputs: Vec<Tensor>,
    pub expected: Vec<Tensor>,
}

/// Deterministic pseudo-random values in [-scale, scale].
fn values(n: u64, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * scale
        })
        .collect()
}

fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// `relu?(x[m,k] · w[k,n] + b[n])` on the CPU, in f64.
fn dense(x: &[f32], w: &[f32], b: &[f32], m: usize, k: usize, n: usize, relu: bool) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = b[j] as f64;
            for p in 0..k {
                acc += x[i * k + p] as f64 * w[p * n + j] as f64;
            }
            y[i * n + j] = if relu { acc.max(0.0) as f32 } else { acc as f32 };
        }
    }
    y
}

/// A GEMM descriptor (+ bias, activation) with its VA fields relocated to
/// arena offsets; returns (descriptor offset, size).
fn gemm(b: &mut ModelBuilder, m: u64, n: u64, k: u64, act: Unary, offs: [u64; 4]) -> (u64, u32) {
    let d = GemmDesc { m: m as u32, n: n as u32, k: k as u32, batch: 1, flags: GEMM_BIAS, activation: act as u32, ..Default::default() }
        .with_header();
    let relocs = [
        (offset_of!(GemmDesc, a_va) as u64, RelocKind::Arena, offs[0]),
        (offset_of!(GemmDesc, b_va) as u64, RelocKind::Arena, offs[1]),
        (offset_of!(GemmDesc, bias_va) as u64, RelocKind::Arena, offs[2]),
        (offset_of!(GemmDesc, c_va) as u64, RelocKind::Arena, offs[3]),
    ];
    (b.add_descriptor(&d.to_bytes(), &relocs), GemmDesc::SIZE as u32)
}

/// A 2-layer MLP: `y[batch,outs] = relu(x W1 + b1) W2 + b2`.
pub fn mlp(batch: u64, ins: u64, hidden: u64, outs: u64) -> Example {
    let w1v = values(ins * hidden, 1, 1.0 / (ins as f32).sqrt());
    let b1v = values(hidden, 2, 0.1);
    let w2v = values(hidden * outs, 3, 1.0 / (hidden as f32).sqrt());
    let b2v = values(outs, 4, 0.1);
    let xv = values(batch * ins, 5, 1.0);

    let mut b = ModelBuilder::new("mlp");
    b.producer("rbln-runtime examples").property("layers", "2");
    let w1 = b.add_weight_f32("W1", &[ins, hidden], &w1v);
    let b1 = b.add_weight_f32("b1", &[hidden], &b1v);
    let w2 = b.add_weight_f32("W2", &[hidden, outs], &w2v);
    let b2 = b.add_weight_f32("b2", &[outs], &b2v);
    let wlen = b.build_model_unchecked().weights.len() as u64;

    // Arena: weights, then x, h, y (activations after the weights).
    let act = round_up(wlen, 4096);
    let (x_off, h_off) = (act, act + round_up(batch * ins * 4, 256));
    let y_off = h_off + round_up(batch * hidden * 4, 256);
    let arena = round_up(y_off + batch * outs * 4, 4096);
    let y_stage = round_up(batch * ins * 4, 256);
    b.arena_size(arena).staging_size(round_up(y_stage + batch * outs * 4, 4096));

    let x_host = b.staging_tensor("x", DType::F32, &[batch, ins], 0);
    let y_host = b.staging_tensor("y", DType::F32, &[batch, outs], y_stage);
    let x = b.arena_tensor("x.dev", DType::F32, &[batch, ins], x_off);
    let h = b.arena_tensor("h", DType::F32, &[batch, hidden], h_off);
    let y = b.arena_tensor("y.dev", DType::F32, &[batch, outs], y_off);

    let upload = b.add_stream("upload", StreamRole::UploadWeights);
    let input = b.add_stream("input", StreamRole::InputTransfer);
    let run = b.add_stream("run", StreamRole::Run);
    let output = b.add_stream("output", StreamRole::OutputTransfer);
    b.dma_copy(upload, Va::Rel(RelocKind::WeightsSource, 0), Va::arena(0), wlen);

    let at = b.dma_copy(input, b.va_of(x_host), b.va_of(x), batch * ins * 4);
    b.add_node(Node::host_to_device("x.upload", x_host, x).with_commands(input, at, 32));
    let off = |b: &ModelBuilder, t| b.placement(t).map_or(0, |p| p.offset());
    let offs1 = [off(&b, x), off(&b, w1), off(&b, b1), off(&b, h)];
    let (d1, s1) = gemm(&mut b, batch, hidden, ins, Unary::Relu, offs1);
    let at = b.compute(run, d1, s1);
    let n1 = b.add_node(Node::compute("fc1", "Gemm", &[x, w1, b1], &[h]).with_commands(run, at, 16).with_descriptors(d1, s1 as u64));
    let offs2 = [off(&b, h), off(&b, w2), off(&b, b2), off(&b, y)];
    let (d2, s2) = gemm(&mut b, batch, outs, hidden, Unary::None, offs2);
    let at = b.compute(run, d2, s2);
    let n2 = b.add_node(Node::compute("fc2", "Gemm", &[h, w2, b2], &[y]).with_commands(run, at, 16).with_descriptors(d2, s2 as u64));
    let at = b.dma_copy(output, b.va_of(y), b.va_of(y_host), batch * outs * 4);
    b.add_node(Node::device_to_host("y.download", y, y_host).with_commands(output, at, 32));
    b.input("x", x_host).output("y", y_host);
    b.node_profile(n1, 2 * batch * ins * hidden, 4 * (batch * ins + ins * hidden + hidden + batch * hidden));
    b.node_profile(n2, 2 * batch * hidden * outs, 4 * (batch * hidden + hidden * outs + outs + batch * outs));

    let model = b.build_model().expect("the example MLP is a valid model");
    let (bs, i, hd, o) = (batch as usize, ins as usize, hidden as usize, outs as usize);
    let hv = dense(&xv, &w1v, &b1v, bs, i, hd, true);
    let yv = dense(&hv, &w2v, &b2v, bs, hd, o, false);
    Example { model, inputs: vec![Tensor::new(&[batch, ins], xv)], expected: vec![Tensor::new(&[batch, outs], yv)] }
}

/// Largest absolute and relative differences between two tensors.
pub fn max_errors(got: &Tensor, want: &Tensor) -> (f32, f32) {
    got.data.iter().zip(&want.data).fold((0f32, 0f32), |(a, r), (g, w)| {
        let d = (g - w).abs();
        (a.max(d), r.max(d / w.abs().max(1e-6)))
    })
}
