//! Every compute descriptor through the device: operands in guest memory,
//! results checked against straightforward CPU references. (The kernels'
//! own randomized tests live in qemu-device/kernels.)

mod common;

use std::time::Duration;

use common::*;
use rbln_hw::cmd::Encoder;
use rbln_hw::ops::*;
use rbln_hw::regs;
use rbln_hw::ring::{FaultCode, QueueState};

/// Tensor i lives at VA 0x100_0000 + i * 0x10_0000 (1 MiB each, host RAM).
fn tva(i: u64) -> u64 {
    0x100_0000 + i * 0x10_0000
}

struct OpRig {
    rig: Rig,
    ctx: Ctx,
    q: Queue,
    bus: Vec<u64>,
}

impl OpRig {
    fn new() -> Self {
        let mut rig = Rig::new();
        let ctx = rig.context(0);
        let q = rig.queue(0, &ctx, 64);
        let bus = (0..5).map(|i| rig.host_buffer(&ctx, tva(i), 1 << 20)).collect();
        Self { rig, ctx, q, bus }
    }

    fn put(&self, i: usize, v: &[f32]) {
        self.rig.write_f32s(self.bus[i], v);
    }

    fn get(&self, i: usize, n: usize) -> Vec<f32> {
        self.rig.read_f32s(self.bus[i], n)
    }

    /// Run one descriptor; returns the queue's fault code.
    fn run(&mut self, desc: &[u8]) -> FaultCode {
        let va = 0x80_0000 + self.q.tail as u64 * 0x1_0000;
        let dbus = self.rig.host_buffer(&self.ctx, va, 4096);
        self.rig.write(dbus, desc);
        let mut e = Encoder::new(Vec::new());
        e.compute(va, desc.len() as u32);
        self.rig.run(&self.ctx, &mut self.q, va + 0x8000, &e.buf);
        self.rig.wait_idle(&self.q, Duration::from_secs(20));
        FaultCode::from_u8(self.rig.reg32(regs::queue_reg(0, regs::Q_FAULT_CODE)) as u8).unwrap()
    }
}

fn close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "[{i}] {g} vs {w}");
    }
}

fn seq(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 % 23) as f32 - 11.0) * scale).collect()
}

#[test]
fn conv2d_with_padding_stride_groups() {
    let mut r = OpRig::new();
    let (n, c, h, w, co, kh, kw, g) = (1, 4, 7, 6, 6, 3, 3, 2);
    let (s, p) = (2, 1);
    let x = seq(n * c * h * w, 0.1);
    let wt = seq(co * (c / g) * kh * kw, 0.05);
    let b = seq(co, 0.3);
    r.put(0, &x);
    r.put(1, &wt);
    r.put(2, &b);
    let d = Conv2dDesc {
        n: n as u32, c_in: c as u32, h: h as u32, w: w as u32, c_out: co as u32, kh: kh as u32, kw: kw as u32,
        groups: g as u32, stride_h: s, stride_w: s, dil_h: 1, dil_w: 1, pad_top: p, pad_left: p, pad_bottom: p,
        pad_right: p, flags: CONV_BIAS, activation: 0, input_va: tva(0), weight_va: tva(1), bias_va: tva(2),
        output_va: tva(3), ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let (oh, ow) = ((h + 2 * p as usize - kh) / s as usize + 1, (w + 2 * p as usize - kw) / s as usize + 1);
    let mut want = vec![0f32; co * oh * ow];
    for o in 0..co {
        let grp = o / (co / g);
        for y in 0..oh {
            for xx in 0..ow {
                let mut acc = b[o];
                for ci in 0..c / g {
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let iy = (y * s as usize + ky) as isize - p as isize;
                            let ix = (xx * s as usize + kx) as isize - p as isize;
                            if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                                let cin = grp * (c / g) + ci;
                                acc += x[(cin * h + iy as usize) * w + ix as usize] * wt[((o * (c / g) + ci) * kh + ky) * kw + kx];
                            }
                        }
                    }
                }
                want[(o * oh + y) * ow + xx] = acc;
            }
        }
    }
    close(&r.get(3, want.len()), &want);
}

/// CONV_WINOGRAD: the filters transformed by `winograd_weights` give the
/// plain conv's result (bias, residual, ReLU; 121 tiles over two blocks);
/// the flag on a geometry F(2×2, 3×3) does not compute is BadDescriptor
/// and leaves the output untouched.
#[test]
fn conv_winograd_matches_plain_conv() {
    let (c, h, w, co) = (32usize, 22usize, 21usize, 24usize);
    let x = seq(c * h * w, 0.1);
    let wt = seq(co * c * 9, 0.05);
    let b = seq(co, 0.3);
    let res = seq(co * h * w, 0.2);
    let mut u = vec![0.0f32; winograd_weights_len(co as u64, c as u64).unwrap() as usize];
    winograd_weights(&wt, co, c, &mut u);
    let desc = |flags: u32| {
        Conv2dDesc {
            n: 1, c_in: c as u32, h: h as u32, w: w as u32, c_out: co as u32, kh: 3, kw: 3, groups: 1, stride_h: 1, stride_w: 1, dil_h: 1, dil_w: 1,
            pad_top: 1, pad_left: 1, pad_bottom: 1, pad_right: 1, flags: CONV_BIAS | CONV_RESIDUAL | flags, activation: Unary::Relu as u32,
            input_va: tva(0), weight_va: tva(1), bias_va: tva(2), output_va: tva(3), residual_va: tva(4), ..Default::default()
        }
        .with_header()
    };
    let mut outs = Vec::new();
    for (weights, flags) in [(&wt, 0), (&u, CONV_WINOGRAD)] {
        let mut r = OpRig::new();
        r.put(0, &x);
        r.put(1, weights);
        r.put(2, &b);
        r.put(4, &res);
        assert_eq!(r.run(&desc(flags).to_bytes()), FaultCode::None, "flags {flags:#x}");
        outs.push(r.get(3, co * h * w));
    }
    close(&outs[1], &outs[0]);
    assert!(outs[0].iter().any(|&v| v > 0.0) && outs[0].contains(&0.0), "ReLU cut some outputs, not all");
    for bad in [Conv2dDesc { stride_h: 2, ..desc(CONV_WINOGRAD) }, Conv2dDesc { groups: 2, ..desc(CONV_WINOGRAD) }, Conv2dDesc { kw: 1, ..desc(CONV_WINOGRAD) }] {
        let mut r = OpRig::new();
        r.put(0, &x);
        r.put(1, &u);
        r.rig.write(r.bus[3], &[0x5a; 4096]);
        assert_eq!(r.run(&bad.with_header().to_bytes()), FaultCode::BadDescriptor, "{bad:?}");
        assert!(r.rig.read(r.bus[3], 4096).iter().all(|&v| v == 0x5a), "output untouched");
    }
}

#[test]
fn elementwise_softmax_layernorm_reduce_transpose_gather_copy_pool() {
    let mut r = OpRig::new();
    // Binary with broadcasting: [2,3] * [3].
    r.put(0, &[1., 2., 3., 4., 5., 6.]);
    r.put(1, &[10., 20., 30.]);
    let d = BinaryDesc { kind: Binary::Mul as u32, rank: 2, a_dims: [2, 3, 0, 0, 0, 0], b_dims: [1, 3, 0, 0, 0, 0], a_va: tva(0), b_va: tva(1), out_va: tva(2), ..Default::default() }.with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    close(&r.get(2, 6), &[10., 40., 90., 40., 100., 180.]);

    // Unary in place: tanh.
    r.put(0, &[-1., 0., 0.5]);
    let d = UnaryDesc { kind: Unary::Tanh as u32, count: 3, in_va: tva(0), out_va: tva(0), ..Default::default() }.with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    close(&r.get(0, 3), &[(-1f32).tanh(), 0., 0.5f32.tanh()]);

    // Softmax over the last axis of [2,2].
    r.put(0, &[1., 2., 3., 3.]);
    let d = SoftmaxDesc { rank: 2, axis: 1, dims: [2, 2, 0, 0, 0, 0], in_va: tva(0), out_va: tva(1), ..Default::default() }.with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let e = (1f32).exp();
    close(&r.get(1, 4), &[1. / (1. + e), e / (1. + e), 0.5, 0.5]);
    // Log-softmax (minor version 12): the logs of the same.
    let d = SoftmaxDesc { flags: SOFTMAX_LOG, ..d };
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    close(&r.get(1, 4), &[-(1. + e).ln(), 1. - (1. + e).ln(), -(2f32).ln(), -(2f32).ln()]);

    // LayerNorm with gamma and beta.
    r.put(0, &[1., 2., 3., 4.]);
    r.put(1, &[2., 2., 2., 2.]);
    r.put(2, &[1., 1., 1., 1.]);
    let d = LayerNormDesc { rows: 1, cols: 4, epsilon: 0.0, flags: LAYERNORM_GAMMA | LAYERNORM_BETA, in_va: tva(0), gamma_va: tva(1), beta_va: tva(2), out_va: tva(3), ..Default::default() }.with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let sd = 1.25f32.sqrt();
    close(&r.get(3, 4), &[1. - 3. / sd, 1. - 1. / sd, 1. + 1. / sd, 1. + 3. / sd]);
    // RMS (minor version 13): x / sqrt(mean(x²)) · 2 + 1, mean(x²) = 7.5.
    let d = LayerNormDesc { flags: LAYERNORM_GAMMA | LAYERNORM_BETA | LAYERNORM_RMS, ..d };
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let rms = 7.5f32.sqrt();
    close(&r.get(3, 4), &[1. + 2. / rms, 1. + 4. / rms, 1. + 6. / rms, 1. + 8. / rms]);
    // An undefined flag bit is a bad descriptor (on a rig of its own: the
    // fault stops its queue).
    assert_eq!(OpRig::new().run(&LayerNormDesc { flags: 1 << 3, ..d }.to_bytes()), FaultCode::BadDescriptor);

    // Reduce mean over axis 0 of [2,3].
    r.put(0, &[1., 2., 3., 5., 6., 7.]);
    let d = ReduceDesc { kind: REDUCE_MEAN, rank: 2, dims: [2, 3, 0, 0, 0, 0], axis: 0, in_va: tva(0), out_va: tva(1), ..Default::default() }.with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    close(&r.get(1, 3), &[3., 4., 5.]);

    // Transpose [2,3] -> [3,2].
    let d = TransposeDesc { rank: 2, dims: [2, 3, 0, 0, 0, 0], perm: [1, 0, 0, 0, 0, 0], in_va: tva(0), out_va: tva(1), ..Default::default() }.with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    close(&r.get(1, 6), &[1., 5., 2., 6., 3., 7.]);

    // Gather rows [2, 0, -1] of a [3,2] table with i64 indices.
    r.put(0, &[0., 1., 10., 11., 20., 21.]);
    let idx: Vec<u8> = [2i64, 0, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
    r.rig.write(r.bus[1], &idx);
    let d = GatherDesc { rank: 2, axis: 0, dims: [3, 2, 0, 0, 0, 0], index_type: GATHER_INDEX_I64, num_indices: 3, data_va: tva(0), indices_va: tva(1), out_va: tva(2), ..Default::default() }.with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    close(&r.get(2, 6), &[20., 21., 0., 1., 20., 21.]);

    // Strided copy: column 1 of a [3,4] matrix into a contiguous [3].
    r.put(0, &(0..12).map(|i| i as f32).collect::<Vec<_>>());
    r.put(1, &[-1.; 4]);
    let d = StridedCopyDesc { rank: 1, sizes: [3, 0, 0, 0, 0, 0], src_strides: [4, 0, 0, 0, 0, 0], dst_strides: [1, 0, 0, 0, 0, 0], src_va: tva(0) + 4, dst_va: tva(1), ..Default::default() }.with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    close(&r.get(1, 4), &[1., 5., 9., -1.]);

    // Max pool 2x2 stride 2 over [1,1,2,4].
    r.put(0, &[1., 5., 2., 0., 3., 4., 8., 7.]);
    let d = PoolDesc { kind: POOL_MAX, n: 1, c: 1, h: 2, w: 4, kh: 2, kw: 2, stride_h: 2, stride_w: 2, dil_h: 1, dil_w: 1, input_va: tva(0), output_va: tva(1), ..Default::default() }.with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    close(&r.get(1, 2), &[5., 8.]);
    assert_eq!(r.rig.state(&r.q), QueueState::Idle);
}

/// POOL with INT8 (and SIGNED): the maximum byte of each window, u8 and
/// i8 orders, a window of padding only giving the type's least value;
/// INT8 with AVG, SIGNED without INT8 and unknown flag bits are
/// BadDescriptor and leave the output untouched.
#[test]
fn int8_max_pool() {
    let mut r = OpRig::new();
    // [1,1,2,4] bytes: 0x80 is 128 as u8, -128 as i8; 0x7f is 127 either way.
    r.rig.write(r.bus[0], &[0x80, 0x01, 0x7f, 0xff, 0x02, 0x03, 0x10, 0x20]);
    let d = PoolDesc { kind: POOL_MAX, flags: POOL_INT8, n: 1, c: 1, h: 2, w: 4, kh: 2, kw: 2, stride_h: 2, stride_w: 2, dil_h: 1, dil_w: 1, input_va: tva(0), output_va: tva(1), ..Default::default() }.with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    assert_eq!(r.rig.read(r.bus[1], 2), [0x80, 0xff]);
    let d = PoolDesc { flags: POOL_INT8 | POOL_SIGNED, ..d };
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    assert_eq!(r.rig.read(r.bus[1], 2), [0x03, 0x7f]);
    // A 1x1 window at stride 3 with 2 rows of padding on top: the first
    // output row sees padding only, the second row 1 at columns 0 and 3.
    let pad = PoolDesc { kh: 1, kw: 1, stride_h: 3, stride_w: 3, pad_top: 2, ..d };
    for (flags, least) in [(POOL_INT8, 0x00u8), (POOL_INT8 | POOL_SIGNED, 0x80)] {
        r.rig.write(r.bus[1], &[0x55; 4]);
        assert_eq!(r.run(&PoolDesc { flags, ..pad }.to_bytes()), FaultCode::None);
        assert_eq!(r.rig.read(r.bus[1], 4), [least, least, 0x02, 0x20], "flags {flags:#x}");
    }
    r.rig.write(r.bus[1], &[0x55; 4]);
    for bad in [PoolDesc { kind: POOL_AVG, ..d }, PoolDesc { flags: POOL_SIGNED, ..d }, PoolDesc { flags: POOL_INT8 | (1 << 3), ..d }] {
        assert_eq!(r.run(&bad.to_bytes()), FaultCode::BadDescriptor, "{bad:?}");
        assert_eq!(r.rig.read(r.bus[1], 4), [0x55; 4]);
    }
}

#[test]
fn batched_gemm_with_transposed_b() {
    let mut r = OpRig::new();
    let (batch, m, n, k) = (3usize, 4usize, 5usize, 6usize);
    let a = seq(batch * m * k, 0.1);
    let b = seq(n * k, 0.2); // one B, broadcast over the batch, stored [n,k]
    r.put(0, &a);
    r.put(1, &b);
    let d = GemmDesc { m: m as u32, n: n as u32, k: k as u32, batch: batch as u32, flags: GEMM_TRANS_B, a_batch_stride: (m * k) as u64, b_batch_stride: 0, c_batch_stride: (m * n) as u64, a_va: tva(0), b_va: tva(1), c_va: tva(2), ..Default::default() }.with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let mut want = vec![0f32; batch * m * n];
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                want[(bi * m + i) * n + j] = (0..k).map(|p| a[(bi * m + i) * k + p] * b[j * k + p]).sum();
            }
        }
    }
    close(&r.get(2, want.len()), &want);
}

/// GEMM_B_PACKED: B in the panel layout (`pack_gemm_b`), batched with a
/// per-matrix stride of one packed matrix; with TRANS_B as well, or a B
/// range one element short of the padded panels, the descriptor faults
/// and C is untouched.
#[test]
fn batched_gemm_with_packed_b() {
    let mut r = OpRig::new();
    let (batch, m, n, k) = (2usize, 13usize, 21usize, 5usize);
    let a = seq(batch * m * k, 0.1);
    let b = seq(batch * k * n, 0.2); // two B matrices, [k,n] each
    let plen = gemm_packed_b_len(k as u64, n as u64).unwrap() as usize;
    assert_eq!(plen, k * 32, "21 columns fill two panels of 16");
    let mut packed = vec![0f32; batch * plen];
    for bi in 0..batch {
        pack_gemm_b(&b[bi * k * n..][..k * n], k, n, false, &mut packed[bi * plen..][..plen]);
    }
    r.put(0, &a);
    r.put(1, &packed);
    let d = GemmDesc {
        m: m as u32,
        n: n as u32,
        k: k as u32,
        batch: batch as u32,
        flags: GEMM_B_PACKED,
        a_batch_stride: (m * k) as u64,
        b_batch_stride: plen as u64,
        c_batch_stride: (m * n) as u64,
        a_va: tva(0),
        b_va: tva(1),
        c_va: tva(2),
        ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let mut want = vec![0f32; batch * m * n];
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                want[(bi * m + i) * n + j] = (0..k).map(|p| a[(bi * m + i) * k + p] * b[bi * k * n + p * n + j]).sum();
            }
        }
    }
    close(&r.get(2, want.len()), &want);

    // B packed and transposed at once: refused at decode.
    let mut r = OpRig::new();
    r.put(2, &[42.0; 4]);
    let bad = GemmDesc { flags: GEMM_B_PACKED | GEMM_TRANS_B, ..d };
    assert_eq!(r.run(&bad.to_bytes()), FaultCode::BadDescriptor);
    assert_eq!(r.get(2, 1), [42.0]);
    // B in the last 1 MiB buffer, k chosen so that one panel fills it
    // exactly: with 17 columns the second panel lies beyond, unmapped.
    let mut r = OpRig::new();
    r.put(2, &[42.0; 4]);
    let big_k = (1 << 20) / 4 / 16; // one panel exactly fills the buffer
    let over = GemmDesc {
        m: 1,
        n: 17,
        k: big_k as u32,
        batch: 1,
        flags: GEMM_B_PACKED,
        a_va: tva(0),
        b_va: tva(4),
        c_va: tva(2),
        ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&over.to_bytes()), FaultCode::Unmapped, "17 columns need a second panel beyond the buffer");
    assert_eq!(r.get(2, 1), [42.0]);
}

#[test]
fn inconsistent_descriptors_fault_without_writing() {
    let mut r = OpRig::new();
    r.put(3, &[42.0; 16]);
    // Output tensor runs into unmapped memory: 1 MiB buffers, 2M elements.
    let d = UnaryDesc { kind: Unary::Relu as u32, count: 2 << 20, in_va: tva(0), out_va: tva(3), ..Default::default() }.with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::Unmapped);
    assert_eq!(r.get(3, 1), [42.0], "no partial write");
    for bad in [
        GemmDesc { m: u32::MAX, n: u32::MAX, k: u32::MAX, batch: 1, a_va: tva(0), b_va: tva(1), c_va: tva(3), ..Default::default() }.with_header().to_bytes().to_vec(),
        Conv2dDesc { n: 1, c_in: 3, h: 4, w: 4, c_out: 2, kh: 3, kw: 3, groups: 2, stride_h: 1, stride_w: 1, dil_h: 1, dil_w: 1, ..Default::default() }.with_header().to_bytes().to_vec(),
        Conv2dDesc { n: 1, c_in: 1, h: 4, w: 4, c_out: 1, kh: 3, kw: 3, groups: 1, stride_h: 0, stride_w: 1, dil_h: 1, dil_w: 1, ..Default::default() }.with_header().to_bytes().to_vec(),
        BinaryDesc { kind: 0, rank: 1, a_dims: [3, 0, 0, 0, 0, 0], b_dims: [4, 0, 0, 0, 0, 0], a_va: tva(0), b_va: tva(1), out_va: tva(3), ..Default::default() }.with_header().to_bytes().to_vec(),
        GatherDesc { rank: 1, axis: 0, dims: [3, 0, 0, 0, 0, 0], num_indices: 1, data_va: tva(0), indices_va: tva(1), out_va: tva(3), ..Default::default() }.with_header().to_bytes().to_vec(),
    ] {
        let mut r = OpRig::new();
        r.rig.write(r.bus[1], &[0xff; 64]); // gather index -1 is fine; 0xff.. as i32 = -1
        r.put(3, &[42.0; 4]);
        let code = r.run(&bad);
        assert!(matches!(code, FaultCode::BadDescriptor | FaultCode::None), "{code:?}");
        if code == FaultCode::None {
            // Only the gather case is legal (index -1 -> last row).
            continue;
        }
        assert_eq!(r.get(3, 1), [42.0]);
        assert!(r.rig.dev.healthy());
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const PAGE: u64 = 4096;

#[test]
fn in_place_output_reaching_a_read_only_page_faults_and_writes_nothing() {
    // Output of 3 pages in device DRAM (contiguous: the in-place path),
    // whose last page is mapped read-only. The op must fault before
    // touching any of it.
    let mut r = OpRig::new();
    let n = 3 * PAGE as usize / 4;
    let (x, y) = (seq(n, 0.5), seq(n, 0.25));
    r.put(0, &x);
    r.put(1, &y);
    let out_va = 0x400_0000;
    let ctx = r.ctx;
    r.rig.map(&ctx, out_va, rbln_hw::mmu::Target::Dram, 0x10_0000, 2 * PAGE, true, true);
    r.rig.map(&ctx, out_va + 2 * PAGE, rbln_hw::mmu::Target::Dram, 0x10_0000 + 2 * PAGE, PAGE, true, false);
    let before = r.rig.dram_read(0x10_0000, 3 * PAGE as usize);
    let d = BinaryDesc {
        kind: Binary::Add as u32, rank: 1, a_dims: [n as u32, 0, 0, 0, 0, 0], b_dims: [n as u32, 0, 0, 0, 0, 0],
        a_va: tva(0), b_va: tva(1), out_va, ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::Permission);
    assert_eq!(r.rig.reg64(regs::queue_reg(0, regs::Q_FAULT_ADDR_64)), out_va + 2 * PAGE, "fault names the page");
    assert_eq!(r.rig.dram_read(0x10_0000, 3 * PAGE as usize), before, "no byte of the output was written");
    assert!(r.rig.private_canary_intact());
}

#[test]
fn in_place_conv_output_over_an_unmapped_page_faults_and_writes_nothing() {
    // The same for a host-memory output whose range runs past its mapping.
    let mut r = OpRig::new();
    let (c, h, w) = (2usize, 32usize, 32usize);
    r.put(0, &seq(c * h * w, 0.1));
    r.put(1, &seq(c * c * 9, 0.1));
    let out_va = 0x400_0000;
    let ctx = r.ctx;
    let bus = r.rig.host_buffer(&ctx, out_va, PAGE); // 1 of the 2 pages needed
    r.rig.write(bus, &[0xAB; PAGE as usize]);
    let d = Conv2dDesc {
        n: 1, c_in: c as u32, h: h as u32, w: w as u32, c_out: c as u32, kh: 3, kw: 3, groups: 1, stride_h: 1,
        stride_w: 1, dil_h: 1, dil_w: 1, pad_top: 1, pad_left: 1, pad_bottom: 1, pad_right: 1,
        input_va: tva(0), weight_va: tva(1), output_va: out_va, ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::Unmapped);
    assert_eq!(r.rig.read(bus, PAGE as usize), vec![0xAB; PAGE as usize]);
}

#[test]
fn scattered_pages_and_overlapping_operands_compute_correctly() {
    let mut r = OpRig::new();
    let ctx = r.ctx;
    let n = 4 * PAGE as usize / 4;
    // Input and output VAs whose pages lie in reverse order in host memory.
    let scattered = |r: &mut OpRig, va: u64| -> Vec<u64> {
        let pages: Vec<u64> = (0..4).map(|_| r.rig.alloc(PAGE)).collect();
        for (i, &p) in pages.iter().rev().enumerate() {
            r.rig.map(&ctx, va + i as u64 * PAGE, rbln_hw::mmu::Target::Host, p, PAGE, true, true);
        }
        pages.into_iter().rev().collect()
    };
    let (in_va, out_va) = (0x500_0000, 0x600_0000);
    let in_pages = scattered(&mut r, in_va);
    let out_pages = scattered(&mut r, out_va);
    let x = seq(n, 0.5);
    for (i, &p) in in_pages.iter().enumerate() {
        r.rig.write(p, &f32_bytes(&x[i * 1024..(i + 1) * 1024]));
    }
    let y = seq(n, 0.125);
    r.put(1, &y);
    let add = |a_va: u64, out_va: u64| {
        BinaryDesc {
            kind: Binary::Add as u32, rank: 1, a_dims: [n as u32, 0, 0, 0, 0, 0], b_dims: [n as u32, 0, 0, 0, 0, 0],
            a_va, b_va: tva(1), out_va, ..Default::default()
        }
        .with_header()
    };
    // Scattered input -> scattered output.
    assert_eq!(r.run(&add(in_va, out_va).to_bytes()), FaultCode::None);
    let got: Vec<f32> = out_pages.iter().flat_map(|&p| r.rig.read_f32s(p, 1024)).collect();
    let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    close(&got, &want);
    // Output equal to an input (contiguous): a += y in place.
    r.put(0, &x);
    assert_eq!(r.run(&add(tva(0), tva(0)).to_bytes()), FaultCode::None);
    close(&r.get(0, n), &want);
    // Output overlapping an input at an offset: transpose into itself
    // shifted by one row must read the input as it was.
    let (rows, cols) = (8usize, 16usize);
    let m = seq(rows * cols, 1.0);
    r.put(2, &m);
    let t = TransposeDesc {
        rank: 2, dims: [rows as u32, cols as u32, 0, 0, 0, 0], perm: [1, 0, 0, 0, 0, 0], in_va: tva(2),
        out_va: tva(2) + cols as u64 * 4, ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&t.to_bytes()), FaultCode::None);
    let got = r.get(2, cols + rows * cols);
    close(&got[..cols], &m[..cols]);
    let want: Vec<f32> = (0..cols).flat_map(|j| (0..rows).map(move |i| (i, j))).map(|(i, j)| m[i * cols + j]).collect();
    close(&got[cols..], &want);
    // Unary in place (in == out).
    let u = UnaryDesc { kind: Unary::Relu as u32, count: n as u64, in_va: tva(0), out_va: tva(0), ..Default::default() }
        .with_header();
    assert_eq!(r.run(&u.to_bytes()), FaultCode::None);
    let relu: Vec<f32> = want_relu(&x, &y);
    close(&r.get(0, n), &relu);
}

fn want_relu(x: &[f32], y: &[f32]) -> Vec<f32> {
    x.iter().zip(y).map(|(a, b)| (a + b).max(0.0)).collect()
}

#[test]
fn fused_residual_and_binary_activation() {
    let mut r = OpRig::new();
    // Conv 1x1 (2 -> 3 channels, 4x4) + bias + residual, then Relu.
    let (c, co, hw) = (2usize, 3usize, 16usize);
    let x = seq(c * hw, 0.2);
    let wt = seq(co * c, 0.3);
    let b = seq(co, 0.5);
    let res = seq(co * hw, 0.7);
    r.put(0, &x);
    r.put(1, &wt);
    r.put(2, &b);
    r.put(3, &res);
    let d = Conv2dDesc {
        n: 1, c_in: c as u32, h: 4, w: 4, c_out: co as u32, kh: 1, kw: 1, groups: 1, stride_h: 1, stride_w: 1,
        dil_h: 1, dil_w: 1, flags: CONV_BIAS | CONV_RESIDUAL, activation: Unary::Relu as u32, input_va: tva(0),
        weight_va: tva(1), bias_va: tva(2), output_va: tva(4), residual_va: tva(3), ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let want: Vec<f32> = (0..co * hw)
        .map(|i| {
            let (o, p) = (i / hw, i % hw);
            let conv: f32 = (0..c).map(|ci| wt[o * c + ci] * x[ci * hw + p]).sum();
            (conv + b[o] + res[i]).max(0.0)
        })
        .collect();
    close(&r.get(4, co * hw), &want);

    // GEMM [2x3]·[3x2] + residual, two batches with C's stride.
    let (m, n, k) = (2usize, 2usize, 3usize);
    let a = seq(2 * m * k, 0.5);
    let bm = seq(k * n, 0.25);
    let res = seq(2 * m * n, 1.5);
    r.put(0, &a);
    r.put(1, &bm);
    r.put(3, &res);
    let g = GemmDesc {
        m: m as u32, n: n as u32, k: k as u32, batch: 2, flags: GEMM_RESIDUAL, a_batch_stride: (m * k) as u64,
        c_batch_stride: (m * n) as u64, a_va: tva(0), b_va: tva(1), c_va: tva(4), residual_va: tva(3),
        ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&g.to_bytes()), FaultCode::None);
    let want: Vec<f32> = (0..2 * m * n)
        .map(|i| {
            let (bt, row, col) = (i / (m * n), (i / n) % m, i % n);
            (0..k).map(|l| a[bt * m * k + row * k + l] * bm[l * n + col]).sum::<f32>() + res[i]
        })
        .collect();
    close(&r.get(4, 2 * m * n), &want);

    // Binary Sub with Clip(-1, 1) fused.
    let (p, q) = (seq(64, 0.3), seq(64, -0.2));
    r.put(0, &p);
    r.put(1, &q);
    let d = BinaryDesc {
        kind: Binary::Sub as u32, rank: 1, a_dims: [64, 0, 0, 0, 0, 0], b_dims: [64, 0, 0, 0, 0, 0], a_va: tva(0),
        b_va: tva(1), out_va: tva(2), activation: Unary::Clip as u32, act_param0: -1.0, act_param1: 1.0,
        ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let want: Vec<f32> = p.iter().zip(&q).map(|(a, b)| (a - b).clamp(-1.0, 1.0)).collect();
    close(&r.get(2, 64), &want);
}

// ---- CAST (hardware minor version 2) and GATHER index faults ----

const CAST_TYPES: [u32; 4] = [CAST_F32, CAST_I32, CAST_I64, CAST_BOOL];

fn type_name(t: u32) -> &'static str {
    ["f32", "i32", "i64", "bool"][t as usize]
}

/// A decoded element, as the reference conversion sees it.
#[derive(Clone, Copy, Debug)]
enum Val {
    F(f32),
    I(i64),
    B(bool),
}

fn decode(t: u32, bytes: &[u8]) -> Vec<Val> {
    let size = cast_type_size(t).unwrap() as usize;
    bytes
        .chunks_exact(size)
        .map(|c| match t {
            CAST_F32 => Val::F(f32::from_le_bytes(c.try_into().unwrap())),
            CAST_I32 => Val::I(i32::from_le_bytes(c.try_into().unwrap()) as i64),
            CAST_I64 => Val::I(i64::from_le_bytes(c.try_into().unwrap())),
            _ => Val::B(c[0] != 0),
        })
        .collect()
}

/// f32 -> integer per the spec: truncate toward zero, saturate, NaN -> 0.
fn sat(x: f32, min: i64, max: i64, lim: f32) -> i64 {
    if x.is_nan() {
        0
    } else if x >= lim {
        max
    } else if x < -lim {
        min
    } else {
        x.trunc() as i64
    }
}

/// The spec's conversion of one element, as little-endian bytes.
fn reference(v: Val, dst: u32) -> Vec<u8> {
    match (dst, v) {
        (CAST_F32, Val::F(x)) => x.to_le_bytes().to_vec(),
        (CAST_F32, Val::I(x)) => (x as f32).to_le_bytes().to_vec(),
        (CAST_F32, Val::B(b)) => (b as u8 as f32).to_le_bytes().to_vec(),
        (CAST_I32, Val::F(x)) => (sat(x, i32::MIN as i64, i32::MAX as i64, 2_147_483_648.0) as i32).to_le_bytes().to_vec(),
        // Low 32 bits.
        (CAST_I32, Val::I(x)) => ((x as u64 & 0xffff_ffff) as u32).to_le_bytes().to_vec(),
        (CAST_I32, Val::B(b)) => (b as i32).to_le_bytes().to_vec(),
        (CAST_I64, Val::F(x)) => sat(x, i64::MIN, i64::MAX, 9_223_372_036_854_775_808.0).to_le_bytes().to_vec(),
        (CAST_I64, Val::I(x)) => x.to_le_bytes().to_vec(),
        (CAST_I64, Val::B(b)) => (b as i64).to_le_bytes().to_vec(),
        (_, Val::F(x)) => vec![(x != 0.0) as u8],
        (_, Val::I(x)) => vec![(x != 0) as u8],
        (_, Val::B(b)) => vec![b as u8],
    }
}

/// Source tensors of every type, with the edge cases of the conversions.
fn cast_source(t: u32) -> Vec<u8> {
    match t {
        CAST_F32 => f32_bytes(&[
            0.0, -0.0, 1.5, -1.5, 2.5e9, -2.5e9, 1e19, -1e19, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 3.0, 0.25,
            -2_147_483_648.0,
        ]),
        CAST_I32 => [0, 1, -1, i32::MAX, i32::MIN, 16_777_217, 256, -7].iter().flat_map(|v: &i32| v.to_le_bytes()).collect(),
        CAST_I64 => [0, 1, -1, 1 << 32, (1 << 32) + 7, i64::MAX, i64::MIN, 0x8000_0000, (1 << 53) + 1]
            .iter()
            .flat_map(|v: &i64| v.to_le_bytes())
            .collect(),
        _ => vec![0, 1, 2, 0xff, 0, 0x80, 1],
    }
}

/// The error record's access field (Q_FAULT_CODE bits 15:8).
fn fault_access(r: &OpRig) -> u32 {
    (r.rig.reg32(regs::queue_reg(0, regs::Q_FAULT_CODE)) >> 8) & 0xff
}

fn fault_addr(r: &OpRig) -> u64 {
    r.rig.reg64(regs::queue_reg(0, regs::Q_FAULT_ADDR_64))
}

fn cast_desc(src_type: u32, dst_type: u32, count: u64, in_va: u64, out_va: u64) -> CastDesc {
    CastDesc { src_type, dst_type, count, in_va, out_va, ..Default::default() }.with_header()
}

#[test]
fn cast_every_type_pair_through_the_device() {
    let mut r = OpRig::new();
    for src in CAST_TYPES {
        for dst in CAST_TYPES {
            let input = cast_source(src);
            let vals = decode(src, &input);
            let n = vals.len();
            let want: Vec<u8> = vals.iter().flat_map(|&v| reference(v, dst)).collect();
            r.rig.write(r.bus[0], &input);
            r.rig.write(r.bus[1], &[0xA5; 256]);
            let d = cast_desc(src, dst, n as u64, tva(0), tva(1));
            assert_eq!(r.run(&d.to_bytes()), FaultCode::None, "{} -> {}", type_name(src), type_name(dst));
            let got = r.rig.read(r.bus[1], 256);
            let (out, rest) = got.split_at(want.len());
            assert_eq!(out, &want[..], "{} -> {}", type_name(src), type_name(dst));
            assert!(rest.iter().all(|&b| b == 0xA5), "{} -> {}: wrote past the output", type_name(src), type_name(dst));
            assert_eq!(r.rig.read(r.bus[0], input.len()), input, "input unchanged");
        }
    }
    // Spot checks of the rules, independent of the reference above.
    let i32s = |b: Vec<u8>| -> Vec<i32> { b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect() };
    r.put(0, &[1e19, f32::NAN, -1.9, -0.0, -3e9]);
    assert_eq!(r.run(&cast_desc(CAST_F32, CAST_I32, 5, tva(0), tva(1)).to_bytes()), FaultCode::None);
    assert_eq!(i32s(r.rig.read(r.bus[1], 20)), [i32::MAX, 0, -1, 0, i32::MIN]);
    let wide: Vec<u8> = [(5i64 << 32) | 0xFFFF_FFFE, -1, 1 << 31].iter().flat_map(|v: &i64| v.to_le_bytes()).collect();
    r.rig.write(r.bus[0], &wide);
    assert_eq!(r.run(&cast_desc(CAST_I64, CAST_I32, 3, tva(0), tva(1)).to_bytes()), FaultCode::None);
    assert_eq!(i32s(r.rig.read(r.bus[1], 12)), [-2, -1, i32::MIN], "i64 -> i32 keeps the low 32 bits");
    r.rig.write(r.bus[0], &[0, 7, 0x80, 0]);
    assert_eq!(r.run(&cast_desc(CAST_BOOL, CAST_F32, 4, tva(0), tva(1)).to_bytes()), FaultCode::None);
    assert_eq!(r.get(1, 4), [0.0, 1.0, 1.0, 0.0]);
    // count = 0 does nothing.
    r.rig.write(r.bus[1], &[0x11; 8]);
    assert_eq!(r.run(&cast_desc(CAST_I64, CAST_I64, 0, tva(0), tva(1)).to_bytes()), FaultCode::None);
    assert_eq!(r.rig.read(r.bus[1], 8), [0x11; 8]);
    assert_eq!(r.rig.state(&r.q), QueueState::Idle);
}

#[test]
fn cast_misaligned_addresses_fault_with_alignment() {
    // (src, dst, in_va, out_va, faulting VA, access: 1 read, 2 write)
    let cases = [
        (CAST_I64, CAST_F32, tva(0) + 4, tva(1), tva(0) + 4, 1),
        (CAST_F32, CAST_I64, tva(0), tva(1) + 4, tva(1) + 4, 2),
        (CAST_I32, CAST_BOOL, tva(0) + 2, tva(1), tva(0) + 2, 1),
        (CAST_BOOL, CAST_I32, tva(0) + 3, tva(1) + 1, tva(1) + 1, 2),
        (CAST_F32, CAST_F32, tva(0) + 1, tva(1) + 1, tva(0) + 1, 1),
    ];
    for (src, dst, in_va, out_va, at, access) in cases {
        let mut r = OpRig::new();
        r.rig.write(r.bus[0], &[1; 64]);
        r.rig.write(r.bus[1], &[0x5C; 64]);
        let d = cast_desc(src, dst, 4, in_va, out_va);
        assert_eq!(r.run(&d.to_bytes()), FaultCode::Alignment, "{} -> {}", type_name(src), type_name(dst));
        assert_eq!(fault_addr(&r), at);
        assert_eq!(fault_access(&r), access);
        assert_eq!(r.rig.read(r.bus[1], 64), [0x5C; 64], "output untouched");
        assert!(r.rig.dev.healthy());
    }
    // Bool tensors have 1-byte elements: any address is aligned.
    let mut r = OpRig::new();
    r.rig.write(r.bus[0], &[0, 0, 0, 9, 0, 3]);
    assert_eq!(r.run(&cast_desc(CAST_BOOL, CAST_BOOL, 3, tva(0) + 3, tva(1) + 5).to_bytes()), FaultCode::None);
    assert_eq!(r.rig.read(r.bus[1], 8), [0, 0, 0, 0, 0, 1, 0, 1]);
}

#[test]
fn cast_bad_types_and_oversized_counts_are_bad_descriptors() {
    for d in [
        cast_desc(4, CAST_F32, 4, tva(0), tva(1)),
        cast_desc(CAST_F32, 0x8000_0000, 4, tva(0), tva(1)),
        // > 2^28 elements; with an i64 operand > 2^27.
        cast_desc(CAST_F32, CAST_I32, (1 << 28) + 1, tva(0), tva(1)),
        cast_desc(CAST_F32, CAST_I64, (1 << 27) + 1, tva(0), tva(1)),
        cast_desc(CAST_I64, CAST_BOOL, (1 << 27) + 1, tva(0), tva(1)),
        cast_desc(CAST_BOOL, CAST_BOOL, u64::MAX, tva(0), tva(1)),
    ] {
        let mut r = OpRig::new();
        r.rig.write(r.bus[1], &[0x5C; 64]);
        assert_eq!(r.run(&d.to_bytes()), FaultCode::BadDescriptor, "{d:?}");
        assert_eq!(fault_addr(&r) & 0xffff, 0, "fault names the descriptor");
        assert_eq!(r.rig.read(r.bus[1], 64), [0x5C; 64]);
    }
    // A CAST descriptor of any other size is rejected: 48 bytes.
    let mut r = OpRig::new();
    let mut b = cast_desc(CAST_F32, CAST_I32, 1, tva(0), tva(1)).to_bytes().to_vec();
    b.extend_from_slice(&[0; 8]);
    b[4..8].copy_from_slice(&48u32.to_le_bytes());
    assert_eq!(r.run(&b), FaultCode::BadDescriptor);
}

#[test]
fn cast_output_reaching_a_read_only_page_faults_and_writes_nothing() {
    // i32 -> i64 of 3 pages' worth of output in device DRAM (contiguous:
    // the in-place path) whose last page is read-only.
    let mut r = OpRig::new();
    let n = 3 * PAGE as usize / 8;
    let x: Vec<u8> = (0..n as i32).flat_map(|i| (i * 7 - 100).to_le_bytes()).collect();
    r.rig.write(r.bus[0], &x);
    let out_va = 0x400_0000;
    let ctx = r.ctx;
    r.rig.map(&ctx, out_va, rbln_hw::mmu::Target::Dram, 0x10_0000, 2 * PAGE, true, true);
    r.rig.map(&ctx, out_va + 2 * PAGE, rbln_hw::mmu::Target::Dram, 0x10_0000 + 2 * PAGE, PAGE, true, false);
    r.rig.dev.dram().write(0x10_0000, &[0xEF; 3 * PAGE as usize]).unwrap();
    let before = r.rig.dram_read(0x10_0000, 3 * PAGE as usize);
    let d = cast_desc(CAST_I32, CAST_I64, n as u64, tva(0), out_va);
    assert_eq!(r.run(&d.to_bytes()), FaultCode::Permission);
    assert_eq!(fault_addr(&r), out_va + 2 * PAGE, "fault names the page");
    assert_eq!(fault_access(&r), 2);
    assert_eq!(r.rig.dram_read(0x10_0000, 3 * PAGE as usize), before, "no byte of the output was written");
    assert!(r.rig.private_canary_intact());

    // The same range minus the read-only page works, through the same path.
    let mut r2 = OpRig::new();
    r2.rig.write(r2.bus[0], &x);
    let ctx = r2.ctx;
    r2.rig.map(&ctx, out_va, rbln_hw::mmu::Target::Dram, 0x10_0000, 2 * PAGE, true, true);
    let m = 2 * PAGE as usize / 8;
    assert_eq!(r2.run(&cast_desc(CAST_I32, CAST_I64, m as u64, tva(0), out_va).to_bytes()), FaultCode::None);
    let got: Vec<i64> =
        r2.rig.dram_read(0x10_0000, m * 8).chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(got, (0..m as i64).map(|i| i * 7 - 100).collect::<Vec<_>>());
}

#[test]
fn cast_in_place_reads_the_input_first() {
    let mut r = OpRig::new();
    let n = 3000; // more than a page, so overlapping pages matter
    // f32 -> i32 in place (same VA, same element size).
    let x: Vec<f32> = (0..n).map(|i| (i as f32 - 1500.0) * 0.75).collect();
    r.put(0, &x);
    assert_eq!(r.run(&cast_desc(CAST_F32, CAST_I32, n as u64, tva(0), tva(0)).to_bytes()), FaultCode::None);
    let got: Vec<i32> = r.rig.read(r.bus[0], n * 4).chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(got, x.iter().map(|&v| v.trunc() as i32).collect::<Vec<_>>());
    // And back: i32 -> f32 in place.
    assert_eq!(r.run(&cast_desc(CAST_I32, CAST_F32, n as u64, tva(0), tva(0)).to_bytes()), FaultCode::None);
    assert_eq!(r.get(0, n), got.iter().map(|&v| v as f32).collect::<Vec<_>>());
    // bool -> bool in place normalises.
    r.rig.write(r.bus[2], &[0, 3, 0xff, 0, 1]);
    assert_eq!(r.run(&cast_desc(CAST_BOOL, CAST_BOOL, 5, tva(2), tva(2)).to_bytes()), FaultCode::None);
    assert_eq!(r.rig.read(r.bus[2], 5), [0, 1, 1, 0, 1]);
    // Widening onto its own input (i32 -> i64, same start, output twice
    // as long): every element converts from the input as it was.
    let v: Vec<i32> = (0..n as i32).map(|i| i - 2000).collect();
    r.rig.write(r.bus[3], &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    assert_eq!(r.run(&cast_desc(CAST_I32, CAST_I64, n as u64, tva(3), tva(3)).to_bytes()), FaultCode::None);
    let got: Vec<i64> = r.rig.read(r.bus[3], n * 8).chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(got, v.iter().map(|&x| x as i64).collect::<Vec<_>>());
    // Narrowing into the second half of its own input (i64 -> i32).
    let w: Vec<i64> = (0..n as i64).map(|i| (i << 32) | (i + 5)).collect();
    r.rig.write(r.bus[4], &w.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    let out_va = tva(4) + (n * 4) as u64;
    assert_eq!(r.run(&cast_desc(CAST_I64, CAST_I32, n as u64, tva(4), out_va).to_bytes()), FaultCode::None);
    let got: Vec<i32> =
        r.rig.read(r.bus[4] + (n * 4) as u64, n * 4).chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(got, w.iter().map(|&x| x as i32).collect::<Vec<_>>());
}

#[test]
fn gather_out_of_range_index_faults_at_that_index() {
    let table = [0., 1., 10., 11., 20., 21.]; // [3, 2], gathered along axis 0
    let gather = |index_type: u32, n: u64, out_va: u64| {
        GatherDesc {
            rank: 2, axis: 0, dims: [3, 2, 0, 0, 0, 0], index_type, num_indices: n, data_va: tva(0),
            indices_va: tva(1), out_va, ..Default::default()
        }
        .with_header()
    };
    // i64 indices; the first bad one is 3 at position 2 (-3 is fine).
    let mut r = OpRig::new();
    r.put(0, &table);
    let idx: Vec<u8> = [1i64, -3, 3, 0, 99].iter().flat_map(|v| v.to_le_bytes()).collect();
    r.rig.write(r.bus[1], &idx);
    r.put(2, &[42.0; 16]);
    assert_eq!(r.run(&gather(GATHER_INDEX_I64, 5, tva(2)).to_bytes()), FaultCode::IndexOutOfRange);
    assert_eq!(fault_addr(&r), tva(1) + 2 * 8, "the offending index's VA");
    assert_eq!(fault_access(&r), 1);
    assert_eq!(r.get(2, 16), [42.0; 16], "output untouched");
    assert!(r.rig.dev.healthy());

    // i32 indices: -4 at position 1.
    let mut r = OpRig::new();
    r.put(0, &table);
    let idx: Vec<u8> = [2i32, -4, 5].iter().flat_map(|v| v.to_le_bytes()).collect();
    r.rig.write(r.bus[1], &idx);
    r.put(2, &[42.0; 16]);
    assert_eq!(r.run(&gather(GATHER_INDEX_I32, 3, tva(2)).to_bytes()), FaultCode::IndexOutOfRange);
    assert_eq!(fault_addr(&r), tva(1) + 4);
    assert_eq!(r.get(2, 16), [42.0; 16]);

    // A huge i64 (beyond i32) is out of range too, not truncated.
    let mut r = OpRig::new();
    r.put(0, &table);
    r.rig.write(r.bus[1], &[0i64, 1 << 32].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
    r.put(2, &[42.0; 16]);
    assert_eq!(r.run(&gather(GATHER_INDEX_I64, 2, tva(2)).to_bytes()), FaultCode::IndexOutOfRange);
    assert_eq!(fault_addr(&r), tva(1) + 8);
    assert_eq!(r.get(2, 16), [42.0; 16]);

    // Translation faults come first: a bad index with an unmapped output
    // is an Unmapped fault at the output.
    let mut r = OpRig::new();
    r.put(0, &table);
    r.rig.write(r.bus[1], &7i64.to_le_bytes());
    assert_eq!(r.run(&gather(GATHER_INDEX_I64, 1, 0x7700_0000).to_bytes()), FaultCode::Unmapped);
    assert_eq!(fault_addr(&r), 0x7700_0000);

    // Indices at the edges of [-dim, dim) are fine.
    let mut r = OpRig::new();
    r.put(0, &table);
    r.rig.write(r.bus[1], &[-3i64, 2].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
    assert_eq!(r.run(&gather(GATHER_INDEX_I64, 2, tva(2)).to_bytes()), FaultCode::None);
    close(&r.get(2, 4), &[0., 1., 20., 21.]);
}

fn resize_desc(mode: u32, nearest_mode: u32, hw: [u32; 4], map: [f32; 4], out_va: u64) -> ResizeDesc {
    let [h, w, oh, ow] = hw;
    let [scale_y, offset_y, scale_x, offset_x] = map;
    ResizeDesc {
        mode, nearest_mode, n: 1, c: 2, h, w, oh, ow, scale_y, offset_y, scale_x, offset_x,
        in_va: tva(0), out_va, ..Default::default()
    }
    .with_header()
}

#[test]
fn resize_nearest_and_bilinear_through_the_device() {
    let mut r = OpRig::new();
    let x: Vec<f32> = (0..2 * 3 * 4).map(|i| i as f32).collect(); // [1, 2, 3, 4]
    r.put(0, &x);
    // Nearest 2x (asymmetric, floor): every input pixel becomes a 2x2 block.
    let d = resize_desc(RESIZE_NEAREST, RESIZE_FLOOR, [3, 4, 6, 8], [0.5, 0.0, 0.5, 0.0], tva(3));
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let got = r.get(3, 2 * 6 * 8);
    for c in 0..2 {
        for y in 0..6 {
            for xx in 0..8 {
                assert_eq!(got[(c * 6 + y) * 8 + xx], x[(c * 3 + y / 2) * 4 + xx / 2], "c{c} ({y},{xx})");
            }
        }
    }
    // Bilinear, align_corners 3x4 -> 5x7: corners exact, the centre of the
    // first plane is the average of its four middle pixels' row.
    let d = resize_desc(RESIZE_LINEAR, 0, [3, 4, 5, 7], [0.5, 0.0, 0.5, 0.0], tva(3));
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let got = r.get(3, 2 * 5 * 7);
    assert_eq!([got[0], got[6], got[28], got[34]], [x[0], x[3], x[8], x[11]]);
    close(&[got[7 * 2 + 3]], &[(x[5] + x[6]) / 2.0]);
    // A non-finite coordinate map or an unknown mode is a bad descriptor,
    // and nothing is written.
    r.put(4, &[42.0; 4]);
    for d in [
        resize_desc(RESIZE_LINEAR, 0, [3, 4, 5, 7], [f32::INFINITY, 0.0, 0.5, 0.0], tva(4)),
        resize_desc(3, 0, [3, 4, 5, 7], [0.5, 0.0, 0.5, 0.0], tva(4)),
        ResizeDesc { cubic_a: -0.75, ..resize_desc(RESIZE_LINEAR, 0, [3, 4, 5, 7], [0.5, 0.0, 0.5, 0.0], tva(4)) },
        ResizeDesc { flags: 2, ..resize_desc(RESIZE_CUBIC, 0, [3, 4, 5, 7], [0.5, 0.0, 0.5, 0.0], tva(4)) },
        resize_desc(RESIZE_LINEAR, RESIZE_CEIL, [3, 4, 5, 7], [0.5, 0.0, 0.5, 0.0], tva(4)),
        resize_desc(RESIZE_NEAREST, 0, [0, 4, 5, 7], [0.5, 0.0, 0.5, 0.0], tva(4)),
    ] {
        let mut r = OpRig::new();
        r.put(4, &[42.0; 4]);
        assert_eq!(r.run(&d.to_bytes()), FaultCode::BadDescriptor);
        assert_eq!(r.get(4, 4), [42.0; 4]);
    }
}

/// Bicubic (minor version 10): a ramp [0, 1, 2, 3] resized to 7 with
/// align_corners (source x/2). Inside, Keys' kernel reproduces the ramp;
/// next to the edges the repeated edge bends it (taps [-1→0, 0, 1, 2] with
/// weights [-3, 19, 19, -3]/32 at x = 0.5), or with EXCLUDE_OUTSIDE the
/// outside tap is dropped and the rest renormalised (13/35).
#[test]
fn bicubic_resize_through_the_device() {
    let mut r = OpRig::new();
    r.put(0, &[0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0]);
    let cubic = |flags: u32| ResizeDesc { cubic_a: -0.75, flags, ..resize_desc(RESIZE_CUBIC, 0, [1, 4, 1, 7], [0.0, 0.0, 0.5, 0.0], tva(3)) };
    assert_eq!(r.run(&cubic(0).to_bytes()), FaultCode::None);
    let want = [0.0, 0.40625, 1.0, 1.5, 2.0, 2.59375, 3.0];
    close(&r.get(3, 14), &[want, want].concat());
    assert_eq!(r.run(&cubic(RESIZE_EXCLUDE_OUTSIDE).to_bytes()), FaultCode::None);
    let got = r.get(3, 7);
    close(&got[..3], &[0.0, 13.0 / 35.0, 1.0]);
    close(&got[4..], &[2.0, 3.0 - 13.0 / 35.0, 3.0]);
    // The 72-byte RESIZE of minor versions 2-9 still runs.
    let short = resize_desc(RESIZE_LINEAR, 0, [1, 4, 1, 7], [0.0, 0.0, 0.5, 0.0], tva(3));
    let mut b = short.to_bytes()[..72].to_vec();
    b[4..8].copy_from_slice(&72u32.to_le_bytes());
    assert_eq!(r.run(&b), FaultCode::None);
    close(&r.get(3, 7), &[0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]);
}

// ---- GRID_SAMPLE (hardware minor version 10) ----

fn grid_desc(mode: u32, padding: u32, flags: u32, points: u32) -> GridSampleDesc {
    GridSampleDesc { mode, padding, flags, n: 1, c: 1, h: 2, w: 2, oh: 1, ow: points, in_va: tva(0), grid_va: tva(1), out_va: tva(3), ..Default::default() }
        .with_header()
}

/// A 2x2 input sampled at the corners, the centre and outside, in each
/// padding mode; an unmapped grid faults at its VA and writes nothing.
#[test]
fn grid_sample_through_the_device() {
    let mut r = OpRig::new();
    r.put(0, &[1.0, 2.0, 3.0, 4.0]);
    // (x, y) pairs: top-left, bottom-right, centre, far bottom-right.
    r.put(1, &[-1.0, -1.0, 1.0, 1.0, 0.0, 0.0, 3.0, 3.0]);
    let cases = [
        (GRID_LINEAR, GRID_PAD_ZEROS, GRID_ALIGN_CORNERS, [1.0, 4.0, 2.5, 0.0]),
        (GRID_LINEAR, GRID_PAD_BORDER, GRID_ALIGN_CORNERS, [1.0, 4.0, 2.5, 4.0]),
        // Without align_corners, ±1 is the outer edge: half the corner
        // element's weight falls outside (zeros) in each axis.
        (GRID_LINEAR, GRID_PAD_ZEROS, 0, [0.25, 1.0, 2.5, 0.0]),
        // The centre is position 0.5: halves round to even, to element 0.
        (GRID_NEAREST, GRID_PAD_BORDER, 0, [1.0, 4.0, 1.0, 4.0]),
        (GRID_CUBIC, GRID_PAD_BORDER, GRID_ALIGN_CORNERS, [1.0, 4.0, 2.5, 4.0]),
    ];
    for (mode, padding, flags, want) in cases {
        assert_eq!(r.run(&grid_desc(mode, padding, flags, 4).to_bytes()), FaultCode::None);
        close(&r.get(3, 4), &want);
    }
    // Reflection with align_corners mirrors at the edge centres 0 and 1:
    // the far point is position 2 on both axes, mirrored at 1 to 0.
    assert_eq!(r.run(&grid_desc(GRID_NEAREST, GRID_PAD_REFLECTION, GRID_ALIGN_CORNERS, 4).to_bytes()), FaultCode::None);
    close(&r.get(3, 4), &[1.0, 4.0, 1.0, 1.0]);
    let mut d = grid_desc(GRID_LINEAR, GRID_PAD_ZEROS, 0, 4);
    d.grid_va = 0x7700_0000;
    r.put(3, &[42.0; 4]);
    assert_eq!(r.run(&d.to_bytes()), FaultCode::Unmapped);
    assert_eq!(r.rig.reg64(regs::queue_reg(0, regs::Q_FAULT_ADDR_64)), 0x7700_0000);
    assert_eq!(r.get(3, 4), [42.0; 4]);
    assert!(r.rig.dev.healthy());
}

// ---- TOPK (hardware minor version 10) ----

/// The 2 largest of each column of a [3, 2] matrix (axis 0, inner 2), with
/// a tie resolved by index; an unmapped indices output faults at its VA
/// and neither output is written.
#[test]
fn top_k_through_the_device() {
    let mut r = OpRig::new();
    r.put(0, &[1.0, 9.0, 5.0, 9.0, 5.0, -1.0]);
    let d = TopKDesc { outer: 1, len: 3, inner: 2, k: 2, flags: TOPK_LARGEST, in_va: tva(0), values_va: tva(3), indices_va: tva(4), ..Default::default() }
        .with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    assert_eq!(r.get(3, 4), [5.0, 9.0, 5.0, 9.0]);
    assert_eq!(r.get(4, 4), [1.0, 0.0, 2.0, 1.0]);
    let smallest = TopKDesc { flags: 0, k: 1, ..d };
    assert_eq!(r.run(&smallest.to_bytes()), FaultCode::None);
    assert_eq!((r.get(3, 2), r.get(4, 2)), (vec![1.0, -1.0], vec![0.0, 2.0]));
    r.put(3, &[42.0; 4]);
    let bad = TopKDesc { indices_va: 0x7700_0000, ..d };
    assert_eq!(r.run(&bad.to_bytes()), FaultCode::Unmapped);
    assert_eq!(r.rig.reg64(regs::queue_reg(0, regs::Q_FAULT_ADDR_64)), 0x7700_0000);
    assert_eq!(r.get(3, 4), [42.0; 4]);
    assert!(r.rig.dev.healthy());
    // k beyond the axis is a bad descriptor.
    let mut r = OpRig::new();
    assert_eq!(r.run(&TopKDesc { k: 4, ..d }.to_bytes()), FaultCode::BadDescriptor);
}

// ---- BINARY comparisons and WHERE (hardware minor version 2) ----

fn binary_desc(kind: Binary, rank: u32, a_dims: [u32; 6], b_dims: [u32; 6], out_va: u64) -> BinaryDesc {
    BinaryDesc { kind: kind as u32, rank, a_dims, b_dims, a_va: tva(0), b_va: tva(1), out_va, ..Default::default() }
        .with_header()
}

#[test]
fn comparisons_through_the_device_with_broadcasting_and_activation() {
    let mut r = OpRig::new();
    // a [2,3] against a row b [1,3]: ties, a NaN on each side, -0 vs +0.
    let a = [1.0, 2.0, f32::NAN, -0.0, 5.0, 3.0];
    let b = [1.0, 5.0, 3.0];
    r.put(0, &a);
    r.put(1, &b);
    type Holds = fn(f32, f32) -> bool;
    let cmp: [(Binary, Holds); 5] = [
        (Binary::Equal, |x, y| x == y),
        (Binary::Less, |x, y| x < y),
        (Binary::Greater, |x, y| x > y),
        (Binary::LessOrEqual, |x, y| x <= y),
        (Binary::GreaterOrEqual, |x, y| x >= y),
    ];
    let want_of = |f: Holds| -> Vec<f32> { (0..6).map(|i| f(a[i], b[i % 3]) as u32 as f32).collect() };
    for (kind, f) in cmp {
        r.put(2, &[7.0; 6]);
        let flops = r.rig.reg64(regs::CNT_COMPUTE_FLOPS_64);
        let d = binary_desc(kind, 2, [2, 3, 0, 0, 0, 0], [1, 3, 0, 0, 0, 0], tva(2));
        assert_eq!(r.run(&d.to_bytes()), FaultCode::None, "{kind:?}");
        assert_eq!(r.get(2, 6), want_of(f), "{kind:?}");
        assert_eq!(r.rig.reg64(regs::CNT_COMPUTE_FLOPS_64) - flops, 6, "{kind:?}: FLOPs = N_out");
    }
    // Spelled out for two kinds: NaN is never equal nor ordered, -0 == +0.
    let d = binary_desc(Binary::LessOrEqual, 2, [2, 3, 0, 0, 0, 0], [1, 3, 0, 0, 0, 0], tva(2));
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    assert_eq!(r.get(2, 6), [1.0, 1.0, 0.0, 1.0, 1.0, 1.0]);
    r.put(1, &[0.0, 5.0, 3.0]);
    let d = binary_desc(Binary::Equal, 2, [2, 3, 0, 0, 0, 0], [1, 3, 0, 0, 0, 0], tva(2));
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    assert_eq!(r.get(2, 6), [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]);

    // A column a [3,1] against a row b [1,4] ([3,4] out), with a fused
    // activation of the 0/1 result: Greater + Clip(0.25, 0.5) gives 0.5
    // where a > b and 0.25 elsewhere; Less + Sigmoid gives σ(1) or σ(0).
    r.put(0, &[0.0, 2.0, 4.0]);
    r.put(1, &[1.0, 2.0, 3.0, f32::NAN]);
    let mut d = binary_desc(Binary::Greater, 2, [3, 1, 0, 0, 0, 0], [1, 4, 0, 0, 0, 0], tva(2));
    d.activation = Unary::Clip as u32;
    d.act_param0 = 0.25;
    d.act_param1 = 0.5;
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    #[rustfmt::skip]
    assert_eq!(r.get(2, 12), [
        0.25, 0.25, 0.25, 0.25,
        0.5, 0.25, 0.25, 0.25,
        0.5, 0.5, 0.5, 0.25,
    ]);
    let mut d = binary_desc(Binary::Less, 2, [3, 1, 0, 0, 0, 0], [1, 4, 0, 0, 0, 0], tva(2));
    d.activation = Unary::Sigmoid as u32;
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let (s0, s1) = (0.5, 1.0 / (1.0 + (-1f32).exp()));
    #[rustfmt::skip]
    close(&r.get(2, 12), &[
        s1, s1, s1, s0,
        s0, s0, s1, s0,
        s0, s0, s0, s0,
    ]);
}

fn where_desc(rank: u32, cond_dims: [u32; 6], a_dims: [u32; 6], b_dims: [u32; 6], out_va: u64) -> WhereDesc {
    WhereDesc { rank, cond_dims, a_dims, b_dims, cond_va: tva(0), a_va: tva(1), b_va: tva(2), out_va, ..Default::default() }
        .with_header()
}

#[test]
fn where_through_the_device_with_broadcasting() {
    let mut r = OpRig::new();
    // cond [2,1,3], a [1,4,1] (a column), b scalar [1,1,1]: out [2,4,3].
    // NaN counts as true, -0.0 as false.
    let cond = [1.0, 0.0, f32::NAN, -0.0, 2.0, 0.0];
    let a = [10.0, 20.0, 30.0, 40.0];
    r.put(0, &cond);
    r.put(1, &a);
    r.put(2, &[-1.0]);
    r.put(3, &[7.0; 25]);
    let flops = r.rig.reg64(regs::CNT_COMPUTE_FLOPS_64);
    let d = where_desc(3, [2, 1, 3, 0, 0, 0], [1, 4, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0], tva(3));
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    assert_eq!(r.rig.reg64(regs::CNT_COMPUTE_FLOPS_64) - flops, 24, "FLOPs = N_out");
    let mut want = vec![];
    for c in cond.chunks(3) {
        for &aj in &a {
            want.extend(c.iter().map(|&ck| if ck != 0.0 { aj } else { -1.0 }));
        }
    }
    assert_eq!(r.get(3, 25)[..24], want[..]);
    assert_eq!(r.get(3, 25)[24], 7.0, "nothing past the output");

    // Rank 0: three scalars.
    r.put(0, &[0.0]);
    r.put(1, &[1.5]);
    r.put(2, &[2.5]);
    r.put(3, &[7.0; 2]);
    let d = where_desc(0, [0; 6], [0; 6], [0; 6], tva(3));
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    assert_eq!(r.get(3, 2), [2.5, 7.0]);

    // A comparison's mask as the condition (ONNX Where(x > 0, x, 0.1·x)
    // as the compiler would lower it), the output over the a operand.
    let n = 3000;
    let x = seq(n, 0.01);
    let x10: Vec<f32> = x.iter().map(|v| 0.1 * v).collect();
    r.put(1, &x);
    r.put(2, &x10);
    r.put(3, &[0.0]);
    let g = BinaryDesc {
        kind: Binary::Greater as u32, rank: 1, a_dims: [n as u32, 0, 0, 0, 0, 0], b_dims: [1, 0, 0, 0, 0, 0],
        a_va: tva(1), b_va: tva(3), out_va: tva(0), ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&g.to_bytes()), FaultCode::None);
    let mut d = where_desc(1, [n as u32, 0, 0, 0, 0, 0], [n as u32, 0, 0, 0, 0, 0], [n as u32, 0, 0, 0, 0, 0], tva(1));
    d.a_va = tva(1);
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let want: Vec<f32> = x.iter().map(|&v| if v > 0.0 { v } else { 0.1 * v }).collect();
    assert_eq!(r.get(1, n), want);
}

#[test]
fn bad_where_descriptors_fault_without_writing() {
    let full = |d: [u32; 2]| [d[0], d[1], 0, 0, 0, 0];
    let mut reserved = where_desc(2, full([2, 3]), full([2, 3]), full([2, 3]), tva(3));
    reserved.reserved = 1;
    let mut wide = where_desc(2, full([2, 3]), full([2, 3]), full([2, 3]), tva(3));
    wide.b_dims[2] = 1; // a dim beyond rank
    for (what, d) in [
        ("cond [2,3] vs a [3,2]", where_desc(2, full([2, 3]), full([3, 2]), full([1, 1]), tva(3))),
        ("a [2,3] vs b [2,2]", where_desc(2, full([1, 3]), full([2, 3]), full([2, 2]), tva(3))),
        ("cond [4,1] vs b [2,3]", where_desc(2, full([4, 1]), full([1, 1]), full([2, 3]), tva(3))),
        ("output above MAX_TENSOR_ELEMS", where_desc(2, full([1 << 15, 1]), full([1, 1 << 15]), full([1, 1]), tva(3))),
        ("operand above MAX_TENSOR_ELEMS", where_desc(2, full([1, 1]), full([1 << 15, 1 << 14]), full([1, 1]), tva(3))),
        ("reserved", reserved),
        ("dim beyond rank", wide),
        ("rank 7", WhereDesc { rank: 7, ..where_desc(2, full([1, 1]), full([1, 1]), full([1, 1]), tva(3)) }),
    ] {
        let mut r = OpRig::new();
        r.put(0, &[1.0; 6]);
        r.put(1, &[2.0; 6]);
        r.put(2, &[3.0; 6]);
        r.put(3, &[42.0; 8]);
        assert_eq!(r.run(&d.to_bytes()), FaultCode::BadDescriptor, "{what}");
        assert_eq!(r.rig.reg64(regs::queue_reg(0, regs::Q_FAULT_ADDR_64)), 0x80_0000, "{what}: fault at desc_va");
        assert_eq!(r.get(3, 8), [42.0; 8], "{what}: output untouched");
        assert!(r.rig.dev.healthy());
    }
    // Operands are translated in the order cond, a, b, then the output: an
    // unmapped b faults at b's VA before anything is written.
    let mut r = OpRig::new();
    r.put(3, &[42.0; 8]);
    let mut d = where_desc(2, full([2, 3]), full([2, 3]), full([2, 3]), tva(3));
    d.b_va = 0x7700_0000;
    assert_eq!(r.run(&d.to_bytes()), FaultCode::Unmapped);
    assert_eq!(r.rig.reg64(regs::queue_reg(0, regs::Q_FAULT_ADDR_64)), 0x7700_0000);
    assert_eq!(r.get(3, 8), [42.0; 8]);
    // A misaligned operand is an Alignment fault at it.
    let mut r = OpRig::new();
    r.put(3, &[42.0; 8]);
    let mut d = where_desc(2, full([2, 3]), full([2, 3]), full([2, 3]), tva(3));
    d.cond_va = tva(0) + 2;
    assert_eq!(r.run(&d.to_bytes()), FaultCode::Alignment);
    assert_eq!(r.rig.reg64(regs::queue_reg(0, regs::Q_FAULT_ADDR_64)), tva(0) + 2);
    assert_eq!(r.get(3, 8), [42.0; 8]);
}

#[test]
fn argmax_and_argmin_reduce_to_indices() {
    let mut r = OpRig::new();
    // [2, 3] along axis 1: ties resolve to the first (or, LAST, the last).
    r.put(0, &[1.0, 4.0, 4.0, 2.0, -1.0, -1.0]);
    let red = |kind: u32| {
        ReduceDesc { kind, rank: 2, dims: [2, 3, 0, 0, 0, 0], axis: 1, in_va: tva(0), out_va: tva(3), ..Default::default() }
            .with_header()
            .to_bytes()
            .to_vec()
    };
    for (kind, want) in [
        (REDUCE_ARGMAX, [1.0, 0.0]),
        (REDUCE_ARGMAX_LAST, [2.0, 0.0]),
        (REDUCE_ARGMIN, [0.0, 1.0]),
        (REDUCE_ARGMIN_LAST, [0.0, 2.0]),
    ] {
        assert_eq!(r.run(&red(kind)), FaultCode::None);
        assert_eq!(r.get(3, 2), want, "kind {kind}");
    }
    // Kinds past ARGMIN_LAST are bad descriptors; the output stays.
    r.put(3, &[42.0, 42.0]);
    assert_eq!(r.run(&red(REDUCE_ARGMIN_LAST + 1)), FaultCode::BadDescriptor);
    assert_eq!(r.get(3, 2), [42.0, 42.0]);
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// QUANT both ways, QGEMM (u8 A, per-column scales, bias, int8 and f32
/// outputs) and QCONV (padding read as the zero point) through the device,
/// against scalar references of the contract (hardware 8.16–8.18).
#[test]
fn int8_quantize_gemm_and_conv_through_the_device() {
    let mut r = OpRig::new();
    // QUANT: per channel ([2, 3, 2] viewed with channels = 3), u8.
    let x: Vec<f32> = vec![0.0, 0.5, 1.5, 2.5, -1.0, 100.0, f32::NAN, 0.25, 3.0, -3.0, 0.75, 1.25];
    let scale = [0.5f32, 1.0, 0.25];
    let zero = [10i32, 0, 128];
    r.put(0, &x);
    r.put(1, &scale);
    r.rig.write(r.bus[2], &i32_bytes(&zero));
    let q = QuantDesc { mode: QUANT_QUANTIZE, qtype: QTYPE_U8, outer: 2, channels: 3, inner: 2, scale_va: tva(1), zero_va: tva(2), in_va: tva(0), out_va: tva(3), ..Default::default() }.with_header();
    assert_eq!(r.run(&q.to_bytes()), FaultCode::None);
    let got = r.rig.read(r.bus[3], 12);
    let want: Vec<u8> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let c = (i / 2) % 3;
            if v.is_nan() {
                return zero[c] as u8;
            }
            ((v / scale[c]).round_ties_even() as i64 + zero[c] as i64).clamp(0, 255) as u8
        })
        .collect();
    assert_eq!(got, want);
    // Ties round to even: 1.5 → 2 and 2.5 → 2 (channel 1: scale 1, zero 0).
    assert_eq!((got[2], got[3]), (2, 2));
    let dq = QuantDesc { mode: QUANT_DEQUANTIZE, ..q }.with_header();
    let dq = QuantDesc { in_va: tva(3), out_va: tva(4), ..dq };
    assert_eq!(r.run(&dq.to_bytes()), FaultCode::None);
    let back = r.get(4, 12);
    for (i, (&b, &g)) in back.iter().zip(&got).enumerate() {
        let c = (i / 2) % 3;
        assert_eq!(b, (g as i32 - zero[c]) as f32 * scale[c], "[{i}]");
    }

    // QGEMM: A [5 × 7] u8 (zero 3), B [7 × 10] i8 packed, bias, scales.
    let (m, n, k) = (5usize, 10usize, 7usize);
    let a: Vec<u8> = (0..m * k).map(|i| (i * 53 % 256) as u8).collect();
    let b: Vec<i8> = (0..k * n).map(|i| ((i * 29 % 255) as i32 - 127) as i8).collect();
    let bias: Vec<i32> = (0..n as i32).map(|j| j * 50 - 200).collect();
    let sc: Vec<f32> = (0..n).map(|j| 0.001 * (j + 1) as f32).collect();
    let mut packed = vec![0i8; qgemm_packed_b_len(k as u64, n as u64).unwrap() as usize];
    pack_qgemm_b(&b, k, n, false, &mut packed);
    let mut r = OpRig::new();
    r.rig.write(r.bus[0], &a);
    r.rig.write(r.bus[1], &packed.iter().map(|&v| v as u8).collect::<Vec<u8>>());
    r.rig.write(r.bus[2], &i32_bytes(&bias));
    r.put(3, &sc);
    let acc = |i: usize, j: usize| (0..k).map(|l| (a[i * k + l] as i32 - 3) * b[l * n + j] as i32).sum::<i32>() + bias[j];
    let g = QGemmDesc {
        m: m as u32, n: n as u32, k: k as u32, flags: QGEMM_BIAS, a_type: QTYPE_U8, out_type: QTYPE_I8, a_zero: 3,
        out_zero: -5, out_min: -5, out_max: 127, a_va: tva(0), b_va: tva(1), bias_va: tva(2), scale_va: tva(3), out_va: tva(4),
        ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&g.to_bytes()), FaultCode::None);
    let got = r.rig.read(r.bus[4], m * n);
    for i in 0..m {
        for j in 0..n {
            let want = ((acc(i, j) as f32 * sc[j]).round_ties_even() as i32 - 5).clamp(-5, 127);
            assert_eq!(got[i * n + j] as i8 as i32, want, "({i}, {j})");
        }
    }
    let f = QGemmDesc { out_type: QTYPE_F32, out_zero: 0, out_min: 0, out_max: 0, flags: QGEMM_BIAS | QGEMM_RELU, ..g }.with_header();
    assert_eq!(r.run(&f.to_bytes()), FaultCode::None);
    let got = r.get(4, m * n);
    for i in 0..m {
        for j in 0..n {
            assert_eq!(got[i * n + j], (acc(i, j) as f32 * sc[j]).max(0.0), "f32 ({i}, {j})");
        }
    }

    // QCONV: 1 × 2 × 4 × 4 i8 input (zero −2), 3 output channels, 3 × 3,
    // pad 1: the border reads −2, a real 0.
    let (c, h, w, co) = (2usize, 4usize, 4usize, 3usize);
    let xq: Vec<i8> = (0..c * h * w).map(|i| ((i * 71 % 200) as i32 - 100) as i8).collect();
    let wq: Vec<i8> = (0..co * c * 9).map(|i| ((i * 13 % 120) as i32 - 60) as i8).collect();
    let kdim = c * 9;
    let mut wp = vec![0i8; qgemm_packed_b_len(kdim as u64, co as u64).unwrap() as usize];
    pack_qgemm_b(&wq, kdim, co, true, &mut wp);
    let cs = [0.01f32, 0.02, 0.03];
    let mut r = OpRig::new();
    r.rig.write(r.bus[0], &xq.iter().map(|&v| v as u8).collect::<Vec<u8>>());
    r.rig.write(r.bus[1], &wp.iter().map(|&v| v as u8).collect::<Vec<u8>>());
    r.put(3, &cs);
    let d = QConvDesc {
        n: 1, c_in: c as u32, h: h as u32, w: w as u32, c_out: co as u32, kh: 3, kw: 3, stride_h: 1, stride_w: 1, dil_h: 1, dil_w: 1,
        pad_top: 1, pad_left: 1, pad_bottom: 1, pad_right: 1, groups: 1, x_type: QTYPE_I8, out_type: QTYPE_F32, x_zero: -2,
        x_va: tva(0), w_va: tva(1), scale_va: tva(3), out_va: tva(4), ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let got = r.get(4, co * h * w);
    for o in 0..co {
        for y in 0..h {
            for xx in 0..w {
                let mut s = 0i32;
                for ci in 0..c {
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (iy, ix) = (y as i64 + ky as i64 - 1, xx as i64 + kx as i64 - 1);
                            let v = if (0..h as i64).contains(&iy) && (0..w as i64).contains(&ix) { xq[ci * h * w + iy as usize * w + ix as usize] as i32 } else { -2 };
                            s += (v + 2) * wq[o * kdim + ci * 9 + ky * 3 + kx] as i32;
                        }
                    }
                }
                assert_eq!(got[o * h * w + y * w + xx], s as f32 * cs[o], "({o}, {y}, {xx})");
            }
        }
    }
}

/// QCONV's WEIGHT_TILES flag: the same weights in the tile layout give
/// the same bytes as in panels (a 64-channel 3×3 in channel quads, which
/// the AMX core takes where the host has it, and a 1×1), two blocks of
/// output channels, the second partial.
#[test]
fn qconv_weight_tiles_match_panels() {
    for (kk, pad, flags, c, h, w, co) in [(3usize, 1u32, QCONV_CHANNEL_QUADS, 64usize, 6usize, 7usize, 24usize), (1, 0, 0, 64, 6, 7, 24), (3, 1, QCONV_CHANNEL_QUADS, 64, 56, 56, 64), (3, 1, QCONV_CHANNEL_QUADS, 256, 14, 14, 256)] {
        let xq: Vec<u8> = (0..c * h * w).map(|i| (i * 37 % 251) as u8).collect();
        let kdim = qconv_k(c as u64, kk as u64, kk as u64, flags).unwrap() as usize;
        let wq: Vec<i8> = (0..co * kdim).map(|i| ((i * 13 % 255) as i32 - 127) as i8).collect();
        let mut panels = vec![0i8; qgemm_packed_b_len(kdim as u64, co as u64).unwrap() as usize];
        pack_qgemm_b(&wq, kdim, co, true, &mut panels);
        let mut tiles = vec![0i8; qconv_tiled_len(kdim as u64, co as u64).unwrap() as usize];
        pack_qconv_tiles(&wq, kdim, co, qconv_tile_taps(kk as u64, kk as u64, flags) as usize, &mut tiles);
        let bias: Vec<i32> = (0..co as i32).map(|j| 100 * j - 900).collect();
        let mut outs = Vec::new();
        for (wbytes, f) in [(&panels, flags), (&tiles, flags | QCONV_WEIGHT_TILES)] {
            let mut r = OpRig::new();
            r.rig.write(r.bus[0], &xq);
            r.rig.write(r.bus[1], &wbytes.iter().map(|&v| v as u8).collect::<Vec<u8>>());
            r.rig.write(r.bus[2], &i32_bytes(&bias));
            r.put(3, &vec![0.0007f32; co]);
            r.rig.write(r.bus[4], &vec![0x5a; co * h * w]);
            let d = QConvDesc {
                n: 1, c_in: c as u32, h: h as u32, w: w as u32, c_out: co as u32, kh: kk as u32, kw: kk as u32, stride_h: 1, stride_w: 1, dil_h: 1, dil_w: 1,
                pad_top: pad, pad_left: pad, pad_bottom: pad, pad_right: pad, groups: 1, flags: f | QGEMM_BIAS, x_type: QTYPE_U8, out_type: QTYPE_U8, x_zero: 5,
                out_zero: 100, out_max: 255, x_va: tva(0), w_va: tva(1), bias_va: tva(2), scale_va: tva(3), out_va: tva(4), ..Default::default()
            }
            .with_header();
            assert_eq!(r.run(&d.to_bytes()), FaultCode::None, "flags {f:#x}");
            outs.push(r.rig.read(r.bus[4], co * h * w));
        }
        assert_eq!(outs[0], outs[1], "{kk}x{kk}: tiles against panels");
        assert!(outs[0].iter().any(|&v| v != outs[0][0]), "a non-constant output");
    }
}

/// Malformed int8 descriptors are BadDescriptor and write nothing: bad
/// types, zero points and clamps, non-finite or zero scales (in memory),
/// inconsistent conv groups.
#[test]
fn bad_int8_descriptors_fault_without_writing() {
    let base = QGemmDesc { m: 4, n: 8, k: 8, a_type: QTYPE_U8, out_type: QTYPE_U8, out_max: 255, a_va: tva(0), b_va: tva(1), scale_va: tva(3), out_va: tva(4), ..Default::default() }.with_header();
    let conv = QConvDesc { n: 1, c_in: 4, h: 4, w: 4, c_out: 4, kh: 1, kw: 1, stride_h: 1, stride_w: 1, dil_h: 1, dil_w: 1, groups: 1, x_type: QTYPE_U8, out_type: QTYPE_U8, out_max: 255, x_va: tva(0), w_va: tva(1), scale_va: tva(3), out_va: tva(4), ..Default::default() }.with_header();
    let cases: Vec<(&str, Vec<u8>, f32)> = vec![
        ("a_type 7", QGemmDesc { a_type: 7, ..base }.to_bytes().to_vec(), 1.0),
        ("out_type 3", QGemmDesc { out_type: 3, ..base }.to_bytes().to_vec(), 1.0),
        ("a_zero out of u8", QGemmDesc { a_zero: 256, ..base }.to_bytes().to_vec(), 1.0),
        ("out_min > out_max", QGemmDesc { out_min: 9, out_max: 8, ..base }.to_bytes().to_vec(), 1.0),
        ("relu with an int8 output", QGemmDesc { flags: QGEMM_RELU, ..base }.to_bytes().to_vec(), 1.0),
        ("clamp on an f32 output", QGemmDesc { out_type: QTYPE_F32, ..base }.to_bytes().to_vec(), 1.0),
        ("unknown flag", QGemmDesc { flags: 1 << 9, ..base }.to_bytes().to_vec(), 1.0),
        ("NaN scale", base.to_bytes().to_vec(), f32::NAN),
        ("huge m·n·k", QGemmDesc { m: u32::MAX, n: u32::MAX, k: u32::MAX, ..base }.to_bytes().to_vec(), 1.0),
        ("conv groups not dividing c_out", QConvDesc { groups: 3, c_in: 3, ..conv }.to_bytes().to_vec(), 1.0),
        ("conv reserved", QConvDesc { reserved: 1, ..conv }.to_bytes().to_vec(), 1.0),
        ("quant mode 2", QuantDesc { mode: 2, qtype: QTYPE_U8, outer: 1, channels: 1, inner: 4, scale_va: tva(3), zero_va: tva(2), in_va: tva(0), out_va: tva(4), ..Default::default() }.with_header().to_bytes().to_vec(), 1.0),
        ("quant zero 999", QuantDesc { mode: QUANT_QUANTIZE, qtype: QTYPE_U8, outer: 1, channels: 1, inner: 4, scale_va: tva(3), zero_va: tva(2), in_va: tva(0), out_va: tva(4), ..Default::default() }.with_header().to_bytes().to_vec(), 1.0),
        ("quant scale 0", QuantDesc { mode: QUANT_DEQUANTIZE, qtype: QTYPE_U8, outer: 1, channels: 1, inner: 4, scale_va: tva(3), zero_va: tva(2), in_va: tva(0), out_va: tva(4), ..Default::default() }.with_header().to_bytes().to_vec(), 0.0),
    ];
    for (what, desc, scale) in cases {
        let mut r = OpRig::new();
        r.put(3, &[scale; 64]);
        r.rig.write(r.bus[2], &i32_bytes(&[999; 4]));
        r.rig.write(r.bus[4], &[0x5a; 64]);
        let code = r.run(&desc);
        assert_eq!(code, FaultCode::BadDescriptor, "{what}");
        assert_eq!(r.rig.read(r.bus[4], 64), [0x5a; 64], "{what}: nothing written");
        assert!(r.rig.dev.healthy(), "{what}");
    }
}

/// QBINARY (hardware 8.19): int8 add and multiply through the device, as
/// their QDQ definition; malformed ones fault without writing.
#[test]
fn int8_binary_through_the_device() {
    let n = 37usize;
    let a: Vec<u8> = (0..n).map(|i| (i * 97 % 256) as u8).collect();
    let b: Vec<u8> = (0..n).map(|i| (i * 31 % 256) as u8).collect();
    let base = QBinaryDesc {
        kind: Binary::Add as u32, a_type: QTYPE_U8, b_type: QTYPE_I8, out_type: QTYPE_I8, a_scale: 0.05, b_scale: 0.02, out_scale: 0.07,
        a_zero: 120, b_zero: -4, out_zero: 3, count: n as u64, a_va: tva(0), b_va: tva(1), out_va: tva(4), ..Default::default()
    }
    .with_header();
    for (kind, relu) in [(Binary::Add, false), (Binary::Add, true), (Binary::Mul, false)] {
        let mut r = OpRig::new();
        r.rig.write(r.bus[0], &a);
        r.rig.write(r.bus[1], &b);
        let d = QBinaryDesc { kind: kind as u32, flags: if relu { QBINARY_RELU } else { 0 }, ..base };
        assert_eq!(r.run(&d.to_bytes()), FaultCode::None, "{kind:?}");
        let got = r.rig.read(r.bus[4], n);
        for i in 0..n {
            let (x, z) = ((a[i] as i32 - 120) as f32 * 0.05, (b[i] as i8 as i32 + 4) as f32 * 0.02);
            let y = if kind == Binary::Add { x + z } else { x * z };
            let y = if relu { y.max(0.0) } else { y };
            let want = ((y / 0.07).round_ties_even() + 3.0).clamp(-128.0, 127.0) as i32;
            assert_eq!(got[i] as i8 as i32, want, "{kind:?} relu {relu} [{i}]");
        }
    }
    let cases: [(&str, QBinaryDesc); 6] = [
        ("kind Sub", QBinaryDesc { kind: Binary::Sub as u32, ..base }),
        ("unknown flag", QBinaryDesc { flags: 2, ..base }),
        ("b_type 2 (f32)", QBinaryDesc { b_type: QTYPE_F32, ..base }),
        ("out_zero outside i8", QBinaryDesc { out_zero: 200, ..base }),
        ("zero scale", QBinaryDesc { a_scale: 0.0, ..base }),
        ("count past the buffer", QBinaryDesc { count: u64::MAX, ..base }),
    ];
    for (what, d) in cases {
        let mut r = OpRig::new();
        r.rig.write(r.bus[4], &[0x5a; 64]);
        assert_eq!(r.run(&d.to_bytes()), FaultCode::BadDescriptor, "{what}");
        assert_eq!(r.rig.read(r.bus[4], 64), [0x5a; 64], "{what}: nothing written");
        assert!(r.rig.dev.healthy(), "{what}");
    }
}

/// A tile program: `out[pid·8 + j] = x[pid·8 + j] + 1` for j < 8 (x in
/// buffer 0, out in buffer 1).
fn add_one_program() -> Vec<u8> {
    use rbln_hw::tile::*;
    let ins = TileInstr::new;
    let v = [
        ins(TileOp::Buffer, TileType::Ptr, &[]),
        TileInstr { slot: 1, ..ins(TileOp::Buffer, TileType::Ptr, &[]) },
        ins(TileOp::ProgramId, TileType::I32, &[]),
        TileInstr { imm: 8, ..ins(TileOp::Const, TileType::I32, &[]) },
        TileInstr { a: 2, b: 3, kind: TileBinary::Mul as u8, ..ins(TileOp::Binary, TileType::I32, &[]) },
        TileInstr { a: 4, ..ins(TileOp::Splat, TileType::I32, &[8]) },
        ins(TileOp::Range, TileType::I32, &[8]),
        TileInstr { a: 5, b: 6, kind: TileBinary::Add as u8, ..ins(TileOp::Binary, TileType::I32, &[8]) },
        TileInstr { a: 0, ..ins(TileOp::Splat, TileType::Ptr, &[8]) },
        TileInstr { a: 8, b: 7, ..ins(TileOp::AddPtr, TileType::Ptr, &[8]) },
        TileInstr { a: 9, ..ins(TileOp::Load, TileType::F32, &[8]) },
        TileInstr { imm: 1f32.to_bits() as u64, ..ins(TileOp::Const, TileType::F32, &[8]) },
        TileInstr { a: 10, b: 11, kind: TileBinary::Add as u8, ..ins(TileOp::Binary, TileType::F32, &[8]) },
        TileInstr { a: 1, slot: 1, ..ins(TileOp::Splat, TileType::Ptr, &[8]) },
        TileInstr { a: 13, b: 7, slot: 1, ..ins(TileOp::AddPtr, TileType::Ptr, &[8]) },
        TileInstr { a: 14, b: 12, ..ins(TileOp::Store, TileType::None, &[]) },
    ];
    let mut h = TileProgramHeader { nbufs: 2, ..Default::default() };
    h.buf_types[..2].fill(TileType::F32 as u8);
    let mut out = vec![0u8; program_size(v.len())];
    encode_program(&h, &v, &mut out).unwrap();
    verify(&out).unwrap();
    out
}

fn tile_desc(program: &[u8], grid: u32, x_len: u64, out_len: u64) -> TileDesc {
    let mut d = TileDesc { program_va: tva(2), program_size: program.len() as u32, nbufs: 2, grid: [grid, 1, 1], ..Default::default() }.with_header();
    d.buf_va[..2].copy_from_slice(&[tva(0), tva(1)]);
    d.buf_len[..2].copy_from_slice(&[x_len, out_len]);
    d
}

#[test]
fn a_tile_program_runs_its_grid_and_faults_outside_its_buffers() {
    let program = add_one_program();
    let mut r = OpRig::new();
    let x = seq(16, 0.5);
    r.put(0, &x);
    r.put(1, &[-7.0; 17]);
    r.rig.write(r.bus[2], &program);
    assert_eq!(r.run(&tile_desc(&program, 2, 16, 16).to_bytes()), FaultCode::None);
    let want: Vec<f32> = x.iter().map(|v| v + 1.0).chain([-7.0]).collect();
    assert_eq!(r.get(1, 17), want);

    // The output buffer is 12 long: instance 1's lanes 4..8 store past it.
    // Nothing is written (not even instance 0's in-bounds lanes); the fault
    // is at the first lane outside, element 12 of buffer 1.
    let mut r = OpRig::new();
    r.put(0, &x);
    r.put(1, &[-7.0; 16]);
    r.rig.write(r.bus[2], &program);
    assert_eq!(r.run(&tile_desc(&program, 2, 16, 12).to_bytes()), FaultCode::OutOfBounds);
    assert_eq!((fault_access(&r), fault_addr(&r)), (2, tva(1) + 12 * 4));
    assert_eq!(r.get(1, 16), [-7.0; 16], "a faulting launch wrote something");
    // A load past x (10 elements) faults as a read.
    let mut r = OpRig::new();
    r.rig.write(r.bus[2], &program);
    assert_eq!(r.run(&tile_desc(&program, 2, 10, 16).to_bytes()), FaultCode::OutOfBounds);
    assert_eq!((fault_access(&r), fault_addr(&r)), (1, tva(0) + 10 * 4));
    assert!(r.rig.dev.healthy());

    // Launches that do not fit the program, and broken programs.
    let mut bad_magic = program.clone();
    bad_magic[0] ^= 1;
    let mut bad_operand = program.clone();
    // Instruction 5 (SPLAT) reads register 15 (after it).
    bad_operand[64 + 5 * 48 + 8..64 + 5 * 48 + 12].copy_from_slice(&15u32.to_le_bytes());
    let mut three_bufs = tile_desc(&program, 2, 16, 16);
    three_bufs.nbufs = 3;
    three_bufs.buf_va[2] = tva(3);
    three_bufs.buf_len[2] = 4;
    let mut huge_grid = tile_desc(&program, 2, 16, 16);
    huge_grid.grid = [1 << 16, 1 << 16, 1];
    for (what, prog, d) in [
        ("bad magic", bad_magic, tile_desc(&program, 2, 16, 16)),
        ("operand after its use", bad_operand, tile_desc(&program, 2, 16, 16)),
        ("buffer count", program.clone(), three_bufs),
        ("grid above 2^24", program.clone(), huge_grid),
    ] {
        let mut r = OpRig::new();
        r.put(1, &[-7.0; 16]);
        r.rig.write(r.bus[2], &prog);
        assert_eq!(r.run(&d.to_bytes()), FaultCode::BadDescriptor, "{what}");
        assert_eq!(r.get(1, 16), [-7.0; 16], "{what}");
    }
    // A program in unmapped memory is a translation fault at its VA.
    let mut r = OpRig::new();
    let mut d = tile_desc(&program, 2, 16, 16);
    d.program_va = 0x7000_0000;
    assert_eq!(r.run(&d.to_bytes()), FaultCode::Unmapped);
    assert_eq!(fault_addr(&r), 0x7000_0000);
}

// ---- ELTWISE programs (hardware minor version 11) ----

fn elt(class: u8, code: u32, dst: u8, a: u8, b: u8, imm: f32) -> EltInstr {
    EltInstr {
        class,
        code: code as u8,
        dst,
        a,
        b,
        imm,
        ..Default::default()
    }
}

/// `h = o * tanh(f * c + i * g)` over [2, 3] with `o` a [1, 3] row: the
/// shape of an LSTM cell's tail, five ops in one.
fn lstm_tail() -> EltwiseDesc {
    let mut d = EltwiseDesc {
        rank: 2,
        n_inputs: 4,
        n_instrs: 5,
        out_reg: 0,
        out_dims: [2, 3, 0, 0, 0, 0],
        ..Default::default()
    };
    d.in_strides = [
        [3, 1, 0, 0, 0, 0],
        [3, 1, 0, 0, 0, 0],
        [3, 1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0, 0],
    ];
    d.in_va = [tva(0), tva(1), tva(2), tva(3)];
    d.out_va = tva(4);
    let prog = [
        elt(ELT_BINARY, Binary::Mul as u32, 4, 0, 1, 0.0), // f * c
        elt(ELT_BINARY, Binary::Mul as u32, 5, 2, ELTWISE_IMM, 0.5), // i * g, g = 0.5
        elt(ELT_BINARY, Binary::Add as u32, 4, 4, 5, 0.0),
        elt(ELT_UNARY, Unary::Tanh as u32, 4, 4, 0, 0.0),
        elt(ELT_BINARY, Binary::Mul as u32, 0, 3, 4, 0.0), // o * tanh(...)
    ];
    d.instrs[..5].copy_from_slice(&prog);
    d.with_header()
}

#[test]
fn eltwise_program_through_the_device() {
    let mut r = OpRig::new();
    let (f, c, i, o) = (seq(6, 0.1), seq(6, -0.2), seq(6, 0.3), vec![1.0, -2.0, 0.5]);
    for (k, v) in [&f, &c, &i, &o].into_iter().enumerate() {
        r.put(k, v);
    }
    let d = lstm_tail();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let want: Vec<f32> = (0..6)
        .map(|j| o[j % 3] * (f[j] * c[j] + i[j] * 0.5).tanh())
        .collect();
    close(&r.get(4, 6), &want);
    // Inputs read through strides: f transposed (stored [3, 2]) and c a
    // column slice of a [2, 5] matrix.
    let ft: Vec<f32> = (0..6).map(|j| f[(j % 2) * 3 + j / 2]).collect();
    r.put(0, &ft);
    let cm: Vec<f32> = (0..10).map(|j| if (1..4).contains(&(j % 5)) { c[(j / 5) * 3 + j % 5 - 1] } else { 99.0 }).collect();
    r.put(1, &cm);
    let strided = EltwiseDesc { in_strides: [[1, 2, 0, 0, 0, 0], [5, 1, 0, 0, 0, 0], d.in_strides[2], d.in_strides[3]], in_va: [tva(0), tva(1) + 4, tva(2), tva(3)], ..d };
    assert_eq!(r.run(&strided.to_bytes()), FaultCode::None);
    close(&r.get(4, 6), &want);
    r.put(0, &f);
    r.put(1, &c);
    // The output may be one of the inputs: every input is read first.
    let in_place = EltwiseDesc {
        out_va: tva(0),
        ..d
    };
    assert_eq!(r.run(&in_place.to_bytes()), FaultCode::None);
    close(&r.get(0, 6), &want);
}

#[test]
fn eltwise_faults_leave_the_output_untouched() {
    let mut r = OpRig::new();
    r.put(4, &[42.0; 6]);
    // An input that is not mapped: the fault names it, nothing is written.
    let d = EltwiseDesc {
        in_va: [tva(0), tva(1), 0x7700_0000, tva(3)],
        ..lstm_tail()
    };
    assert_eq!(r.run(&d.to_bytes()), FaultCode::Unmapped);
    assert_eq!(
        r.rig.reg64(regs::queue_reg(0, regs::Q_FAULT_ADDR_64)),
        0x7700_0000
    );
    assert_eq!(r.get(4, 6), [42.0; 6]);
    assert!(r.rig.dev.healthy());
    // A register read before it is written is a bad descriptor.
    let mut r = OpRig::new();
    let mut bad = lstm_tail();
    bad.instrs[0].a = 6;
    assert_eq!(r.run(&bad.to_bytes()), FaultCode::BadDescriptor);
    // So is a stride beyond the rank.
    let mut r = OpRig::new();
    let mut bad = lstm_tail();
    bad.in_strides[3][2] = 1;
    assert_eq!(r.run(&bad.to_bytes()), FaultCode::BadDescriptor);
    // Strides reaching past the input's mapping fault there, before any
    // output is written.
    let mut r = OpRig::new();
    r.put(4, &[42.0; 6]);
    let mut far = lstm_tail();
    far.in_strides[3] = [1 << 20, 1, 0, 0, 0, 0];
    assert_eq!(r.run(&far.to_bytes()), FaultCode::Unmapped);
    assert_eq!(r.get(4, 6), [42.0; 6]);
    // A stride so large the extent overflows is a bad descriptor.
    let mut r = OpRig::new();
    far.in_strides[3] = [u64::MAX / 2, 1, 0, 0, 0, 0];
    assert_eq!(r.run(&far.to_bytes()), FaultCode::BadDescriptor);
    assert!(r.rig.dev.healthy());
}

// ---- RECURRENT layers (hardware minor version 12) ----

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `[rows, cols]` → `[cols, rows]` (RECURRENT takes `Rᵀ`).
fn transposed(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols).map(|i| m[(i % rows) * cols + i / rows]).collect()
}

/// An LSTM step by step from the ONNX equations (gates i, o, f, c):
/// `(y, final c)`.
fn lstm_ref(x: &[f32], r: &[f32], h0: &[f32], c0: &[f32], seq: usize, hid: usize, reverse: bool) -> (Vec<f32>, Vec<f32>) {
    let (mut h, mut c) = (h0.to_vec(), c0.to_vec());
    let mut y = vec![0.0; seq * hid];
    for step in 0..seq {
        let t = if reverse { seq - 1 - step } else { step };
        let g = |j: usize| x[t * 4 * hid + j] + (0..hid).map(|k| r[j * hid + k] * h[k]).sum::<f32>();
        let gates: Vec<f32> = (0..4 * hid).map(g).collect();
        for k in 0..hid {
            let (i, o, f, cand) = (sigmoid(gates[k]), sigmoid(gates[hid + k]), sigmoid(gates[2 * hid + k]), gates[3 * hid + k].tanh());
            c[k] = f * c[k] + i * cand;
            h[k] = o * c[k].tanh();
        }
        y[t * hid..(t + 1) * hid].copy_from_slice(&h);
    }
    (y, c)
}

#[test]
fn recurrent_lstm_through_the_device() {
    let mut r = OpRig::new();
    let (seq_len, hid) = (4, 3);
    let (x, w) = (seq(seq_len * 4 * hid, 0.05), seq(4 * hid * hid, 0.03));
    let (h0, c0) = (vec![0.1, -0.2, 0.3], vec![-0.5, 0.25, 0.75]);
    r.put(0, &x);
    r.put(1, &transposed(&w, 4 * hid, hid));
    r.put(2, &[h0.clone(), c0.clone()].concat());
    let d = RecurrentDesc {
        cell: REC_LSTM,
        flags: REC_REVERSE,
        seq: seq_len as u32,
        batch: 1,
        hidden: hid as u32,
        x_va: tva(0),
        r_va: tva(1),
        h0_va: tva(2),
        c0_va: tva(2) + 4 * hid as u64,
        y_va: tva(3),
        c_va: tva(4),
        ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let (want_y, want_c) = lstm_ref(&x, &w, &h0, &c0, seq_len, hid, true);
    close(&r.get(3, seq_len * hid), &want_y);
    close(&r.get(4, hid), &want_c);
    // Zero initial states when their VAs are 0; the output may overlap
    // the projection it reads (the device stages it).
    let zero = RecurrentDesc { flags: 0, h0_va: 0, c0_va: 0, y_va: tva(0), ..d };
    assert_eq!(r.run(&zero.to_bytes()), FaultCode::None);
    let (want_y, want_c) = lstm_ref(&x, &w, &[0.0; 3], &[0.0; 3], seq_len, hid, false);
    close(&r.get(0, seq_len * hid), &want_y);
    close(&r.get(4, hid), &want_c);
}

#[test]
fn recurrent_gru_through_the_device() {
    // A linear-before-reset GRU (PyTorch's): cand = tanh(x_h + r ⊙ (h·R_hᵀ + Rb_h)).
    let mut r = OpRig::new();
    let (seq_len, hid) = (3, 2);
    let (x, w, rb) = (seq(seq_len * 3 * hid, 0.07), seq(3 * hid * hid, 0.05), vec![0.2, -0.1]);
    r.put(0, &x);
    r.put(1, &transposed(&w, 3 * hid, hid));
    r.put(2, &rb);
    let d = RecurrentDesc {
        cell: REC_GRU,
        flags: REC_LINEAR_BEFORE_RESET,
        seq: seq_len as u32,
        batch: 1,
        hidden: hid as u32,
        x_va: tva(0),
        r_va: tva(1),
        rb_va: tva(2),
        y_va: tva(3),
        ..Default::default()
    }
    .with_header();
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    let mut h = vec![0.0f32; hid];
    let mut want = Vec::new();
    for t in 0..seq_len {
        let xg = |j: usize| x[t * 3 * hid + j];
        let rh = |j: usize| (0..hid).map(|k| w[j * hid + k] * h[k]).sum::<f32>();
        let next: Vec<f32> = (0..hid)
            .map(|k| {
                let z = sigmoid(xg(k) + rh(k));
                let rg = sigmoid(xg(hid + k) + rh(hid + k));
                let cand = (xg(2 * hid + k) + rg * (rh(2 * hid + k) + rb[k])).tanh();
                (1.0 - z) * cand + z * h[k]
            })
            .collect();
        h = next;
        want.extend_from_slice(&h);
    }
    close(&r.get(3, seq_len * hid), &want);
}

#[test]
fn recurrent_faults_leave_the_outputs_untouched() {
    let base = RecurrentDesc { cell: REC_LSTM, seq: 2, batch: 1, hidden: 2, x_va: tva(0), r_va: tva(1), y_va: tva(3), c_va: tva(4), ..Default::default() }
        .with_header();
    // An initial state that is not mapped: the fault names it, neither
    // output is written.
    let mut r = OpRig::new();
    r.put(3, &[42.0; 4]);
    r.put(4, &[42.0; 2]);
    let d = RecurrentDesc { c0_va: 0x7700_0000, ..base };
    assert_eq!(r.run(&d.to_bytes()), FaultCode::Unmapped);
    assert_eq!(r.rig.reg64(regs::queue_reg(0, regs::Q_FAULT_ADDR_64)), 0x7700_0000);
    assert_eq!(r.get(3, 4), [42.0; 4]);
    assert_eq!(r.get(4, 2), [42.0; 2]);
    // A cell-state output that runs off its mapping: nothing written.
    let mut r = OpRig::new();
    r.put(3, &[42.0; 4]);
    let d = RecurrentDesc { c_va: tva(5) - 4, ..base };
    assert_ne!(r.run(&d.to_bytes()), FaultCode::None);
    assert_eq!(r.get(3, 4), [42.0; 4]);
    // A linear-before-reset GRU without Rb_h, and an unknown cell, are
    // bad descriptors.
    let mut r = OpRig::new();
    let gru = RecurrentDesc { cell: REC_GRU, flags: REC_LINEAR_BEFORE_RESET, c_va: 0, ..base };
    assert_eq!(r.run(&gru.to_bytes()), FaultCode::BadDescriptor);
    let mut r = OpRig::new();
    assert_eq!(r.run(&RecurrentDesc { cell: 9, ..base }.to_bytes()), FaultCode::BadDescriptor);
    // Sizes whose operands exceed any tensor are bad descriptors too.
    let mut r = OpRig::new();
    assert_eq!(r.run(&RecurrentDesc { seq: u32::MAX, hidden: u32::MAX, ..base }.to_bytes()), FaultCode::BadDescriptor);
    assert!(r.rig.dev.healthy());
}

fn concat_desc(rows: u32, out_cols: u32, parts: &[(u64, u32, u32)], out_va: u64) -> ConcatDesc {
    let mut d = ConcatDesc { rows, out_cols, parts: parts.len() as u32, out_va, ..Default::default() };
    for (i, &(va, col, cols)) in parts.iter().enumerate() {
        (d.src_va[i], d.col[i], d.cols[i]) = (va, col, cols);
    }
    d.with_header()
}

#[test]
fn concat_through_the_device() {
    let mut r = OpRig::new();
    // Three sources [2,3], [2,1], [2,2] side by side in rows of 7: the
    // last column is nobody's and keeps its value.
    r.put(0, &[1., 2., 3., 4., 5., 6.]);
    r.put(1, &[10., 20.]);
    r.put(2, &[100., 200., 300., 400.]);
    r.put(3, &[-1.; 16]);
    let d = concat_desc(2, 7, &[(tva(0), 0, 3), (tva(1), 3, 1), (tva(2), 4, 2)], tva(3));
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    assert_eq!(r.get(3, 15), [1., 2., 3., 10., 100., 200., -1., 4., 5., 6., 20., 300., 400., -1., -1.]);
    // Parts in another order than their columns, and one source read
    // twice.
    let d = concat_desc(2, 6, &[(tva(2), 4, 2), (tva(0), 1, 3), (tva(1), 0, 1)], tva(4));
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    assert_eq!(r.get(4, 12), [10., 1., 2., 3., 100., 200., 20., 4., 5., 6., 300., 400.]);
    // The output over a source: every source is read before the output
    // is written (it starts at source 0, which is its own part 0).
    r.put(0, &[1., 2., 3., 4., 5., 6., 7., 8.]);
    let d = concat_desc(2, 4, &[(tva(1), 0, 1), (tva(0), 1, 3)], tva(0));
    assert_eq!(r.run(&d.to_bytes()), FaultCode::None);
    assert_eq!(r.get(0, 8), [10., 1., 2., 3., 20., 4., 5., 6.]);
    assert_eq!(r.rig.state(&r.q), QueueState::Idle);
}

#[test]
fn concat_faults_write_nothing() {
    // A source running into unmapped memory (1 MiB buffers): Unmapped, the
    // output untouched.
    let mut r = OpRig::new();
    r.put(3, &[42.0; 8]);
    let d = concat_desc(2, 4, &[(tva(0), 0, 2), (tva(4) + (1 << 20) - 8, 2, 2)], tva(3));
    assert_eq!(r.run(&d.to_bytes()), FaultCode::Unmapped);
    assert_eq!(r.get(3, 8), [42.0; 8], "no partial write");
    // A part past the end of the row, and a used field of an unused part:
    // BadDescriptor, nothing written.
    for bad in [concat_desc(2, 4, &[(tva(0), 3, 2)], tva(3)), {
        let mut d = concat_desc(2, 4, &[(tva(0), 0, 4)], tva(3));
        d.cols[5] = 1;
        d
    }] {
        let mut r = OpRig::new();
        r.put(3, &[42.0; 8]);
        assert_eq!(r.run(&bad.to_bytes()), FaultCode::BadDescriptor);
        assert_eq!(r.get(3, 8), [42.0; 8]);
        assert!(r.rig.dev.healthy());
    }
}
