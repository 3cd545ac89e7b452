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
    got.data.to_f64().iter().zip(want.data.to_f64()).fold((0f32, 0f32), |(a, r), (g, w)| {
        let d = (g - w).abs() as f32;
        (a.max(d), r.max(d / (w.abs() as f32).max(1e-6)))
    })
}

/// CPU conv2d (NCHW, stride 1, `pad` on every side) + ReLU, in f64.
#[allow(clippy::too_many_arguments)] // a reference in the shape of the layer it checks
fn conv_relu(x: &[f32], w: &[f32], b: &[f32], n: usize, ci: usize, hw: usize, co: usize, k: usize, pad: usize) -> Vec<f32> {
    let mut y = vec![0f32; n * co * hw * hw];
    for img in 0..n {
        for o in 0..co {
            for r in 0..hw {
                for c in 0..hw {
                    let mut acc = b[o] as f64;
                    for i in 0..ci {
                        for kr in 0..k {
                            for kc in 0..k {
                                let (rr, cc) = ((r + kr) as isize - pad as isize, (c + kc) as isize - pad as isize);
                                if rr >= 0 && cc >= 0 && (rr as usize) < hw && (cc as usize) < hw {
                                    acc += x[((img * ci + i) * hw + rr as usize) * hw + cc as usize] as f64
                                        * w[((o * ci + i) * k + kr) * k + kc] as f64;
                                }
                            }
                        }
                    }
                    y[((img * co + o) * hw + r) * hw + c] = acc.max(0.0) as f32;
                }
            }
        }
    }
    y
}

/// CPU 2x2 max pooling, stride 2 (NCHW).
fn maxpool2(x: &[f32], n: usize, c: usize, hw: usize) -> Vec<f32> {
    let o = hw / 2;
    let mut y = vec![0f32; n * c * o * o];
    for p in 0..n * c {
        for r in 0..o {
            for q in 0..o {
                let at = |dr: usize, dq: usize| x[(p * hw + 2 * r + dr) * hw + 2 * q + dq];
                y[(p * o + r) * o + q] = at(0, 0).max(at(0, 1)).max(at(1, 0)).max(at(1, 1));
            }
        }
    }
    y
}

/// A small CNN: conv 3x3 (pad 1) + ReLU -> max pool 2x2 -> dense to
/// `classes`, on `batch` images of `channels` x `size` x `size`.
pub fn cnn(batch: u64, channels: u64, size: u64, filters: u64, classes: u64) -> Example {
    use rbln_hw::ops::{Conv2dDesc, PoolDesc, CONV_BIAS, POOL_MAX};
    let k = 3u64;
    let half = size / 2;
    let flat = filters * half * half;
    let wcv = values(filters * channels * k * k, 11, 1.0 / ((channels * k * k) as f32).sqrt());
    let bcv = values(filters, 12, 0.1);
    let wdv = values(flat * classes, 13, 1.0 / (flat as f32).sqrt());
    let bdv = values(classes, 14, 0.1);
    let xv = values(batch * channels * size * size, 15, 1.0);

    let mut b = ModelBuilder::new("cnn");
    b.producer("rbln-runtime examples").property("layers", "conv,pool,dense");
    let wc = b.add_weight_f32("conv.W", &[filters, channels, k, k], &wcv);
    let bc = b.add_weight_f32("conv.b", &[filters], &bcv);
    let wd = b.add_weight_f32("fc.W", &[flat, classes], &wdv);
    let bd = b.add_weight_f32("fc.b", &[classes], &bdv);
    let wlen = b.build_model_unchecked().weights.len() as u64;
    let a0 = round_up(wlen, 4096);
    let x_off = a0;
    let c_off = x_off + round_up(batch * channels * size * size * 4, 256);
    let p_off = c_off + round_up(batch * filters * size * size * 4, 256);
    let y_off = p_off + round_up(batch * flat * 4, 256);
    b.arena_size(round_up(y_off + batch * classes * 4, 4096));
    let y_stage = round_up(batch * channels * size * size * 4, 256);
    b.staging_size(round_up(y_stage + batch * classes * 4, 4096));

    let x_host = b.staging_tensor("image", DType::F32, &[batch, channels, size, size], 0);
    let y_host = b.staging_tensor("logits", DType::F32, &[batch, classes], y_stage);
    let x = b.arena_tensor("image.dev", DType::F32, &[batch, channels, size, size], x_off);
    let cv = b.arena_tensor("conv", DType::F32, &[batch, filters, size, size], c_off);
    let pl = b.arena_tensor("pool", DType::F32, &[batch, filters, half, half], p_off);
    let y = b.arena_tensor("logits.dev", DType::F32, &[batch, classes], y_off);

    let upload = b.add_stream("upload", StreamRole::UploadWeights);
    let input = b.add_stream("input", StreamRole::InputTransfer);
    let run = b.add_stream("run", StreamRole::Run);
    let output = b.add_stream("output", StreamRole::OutputTransfer);
    b.dma_copy(upload, Va::Rel(RelocKind::WeightsSource, 0), Va::arena(0), wlen);
    let at = b.dma_copy(input, b.va_of(x_host), b.va_of(x), batch * channels * size * size * 4);
    b.add_node(Node::host_to_device("image.upload", x_host, x).with_commands(input, at, 32));

    let off = |b: &ModelBuilder, t| b.placement(t).map_or(0, |p| p.offset());
    let conv = Conv2dDesc {
        n: batch as u32, c_in: channels as u32, h: size as u32, w: size as u32, c_out: filters as u32,
        kh: 3, kw: 3, groups: 1, stride_h: 1, stride_w: 1, dil_h: 1, dil_w: 1,
        pad_top: 1, pad_left: 1, pad_bottom: 1, pad_right: 1, flags: CONV_BIAS, activation: Unary::Relu as u32,
        ..Default::default()
    }
    .with_header();
    let relocs = [
        (offset_of!(Conv2dDesc, input_va) as u64, RelocKind::Arena, off(&b, x)),
        (offset_of!(Conv2dDesc, weight_va) as u64, RelocKind::Arena, off(&b, wc)),
        (offset_of!(Conv2dDesc, bias_va) as u64, RelocKind::Arena, off(&b, bc)),
        (offset_of!(Conv2dDesc, output_va) as u64, RelocKind::Arena, off(&b, cv)),
    ];
    let d = b.add_descriptor(&conv.to_bytes(), &relocs);
    let at = b.compute(run, d, Conv2dDesc::SIZE as u32);
    b.add_node(Node::compute("conv1", "Conv", &[x, wc, bc], &[cv]).with_commands(run, at, 16).with_descriptors(d, Conv2dDesc::SIZE as u64));
    let pool = PoolDesc {
        kind: POOL_MAX, n: batch as u32, c: filters as u32, h: size as u32, w: size as u32,
        kh: 2, kw: 2, stride_h: 2, stride_w: 2, dil_h: 1, dil_w: 1, ..Default::default()
    }
    .with_header();
    let relocs = [
        (offset_of!(PoolDesc, input_va) as u64, RelocKind::Arena, off(&b, cv)),
        (offset_of!(PoolDesc, output_va) as u64, RelocKind::Arena, off(&b, pl)),
    ];
    let d = b.add_descriptor(&pool.to_bytes(), &relocs);
    let at = b.compute(run, d, PoolDesc::SIZE as u32);
    b.add_node(Node::compute("pool1", "MaxPool", &[cv], &[pl]).with_commands(run, at, 16).with_descriptors(d, PoolDesc::SIZE as u64));
    // The pooled NCHW tensor is read as [batch, flat] (row-major flatten).
    let offs = [off(&b, pl), off(&b, wd), off(&b, bd), off(&b, y)];
    let (d, s) = gemm(&mut b, batch, classes, flat, Unary::None, offs);
    let at = b.compute(run, d, s);
    b.add_node(Node::compute("fc", "Gemm", &[pl, wd, bd], &[y]).with_commands(run, at, 16).with_descriptors(d, s as u64));
    let at = b.dma_copy(output, b.va_of(y), b.va_of(y_host), batch * classes * 4);
    b.add_node(Node::device_to_host("logits.download", y, y_host).with_commands(output, at, 32));
    b.input("image", x_host).output("logits", y_host);

    let model = b.build_model().expect("the example CNN is a valid model");
    let (bs, ci, hw, co) = (batch as usize, channels as usize, size as usize, filters as usize);
    let cvv = conv_relu(&xv, &wcv, &bcv, bs, ci, hw, co, 3, 1);
    let plv = maxpool2(&cvv, bs, co, hw);
    let yv = dense(&plv, &wdv, &bdv, bs, flat as usize, classes as usize, false);
    Example {
        model,
        inputs: vec![Tensor::new(&[batch, channels, size, size], xv)],
        expected: vec![Tensor::new(&[batch, classes], yv)],
    }
}
