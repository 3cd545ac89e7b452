//! Fused epilogues (residual, activation) and the fast paths of conv2d,
//! pool2d and the element-wise kernels, against naive references.

use super::dense::{conv_ref, gemm_ref, pool_ref};
use super::elementwise::binary_ref;
use super::{act_ref, assert_close, Rng, ACTS, SIZES};
use crate::*;

/// Reference `act(pre + residual)` where `want_pre` is the un-activated
/// reference (computed with `Activation::None`).
fn add_residual_act(act: Activation, want_pre: &[f64], scale: &[f64], res: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let want = want_pre.iter().zip(res).map(|(&w, &r)| act_ref(act, w + r as f64)).collect();
    let scale = scale.iter().zip(res).map(|(&s, &r)| s + (r as f64).abs()).collect();
    (want, scale)
}

#[test]
fn gemm_residual_random() {
    let mut rng = Rng::new(101);
    for it in 0..150 {
        let p = GemmParams {
            m: rng.pick(SIZES),
            n: rng.pick(SIZES),
            k: rng.pick(SIZES),
            trans_a: rng.bool(),
            trans_b: rng.bool(),
            accumulate: rng.bool(),
            activation: ACTS[it % ACTS.len()],
            ..Default::default()
        };
        let a = rng.vec(p.m * p.k);
        let b = rng.vec(p.k * p.n);
        let bias = rng.vec(p.n);
        let bias = rng.bool().then_some(&bias[..]);
        let res = rng.vec(p.m * p.n);
        let c0 = rng.vec(p.m * p.n);
        let mut c = if p.accumulate { c0.clone() } else { vec![f32::NAN; p.m * p.n] };
        gemm_residual(&p, &a, &b, bias, Some(&res), &mut c).unwrap();
        let (pre, scale) = gemm_ref(&GemmParams { activation: Activation::None, ..p }, &a, &b, bias, &c0);
        let (want, scale) = add_residual_act(p.activation, &pre, &scale, &res);
        assert_close(&format!("gemm_residual {p:?}"), &c, &want, Some(&scale), 1e-5);
        // Without a residual it is gemm.
        let mut c1 = if p.accumulate { c0.clone() } else { vec![f32::NAN; p.m * p.n] };
        let mut c2 = c1.clone();
        gemm_residual(&p, &a, &b, bias, None, &mut c1).unwrap();
        gemm(&p, &a, &b, bias, &mut c2).unwrap();
        assert_eq!(c1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), c2.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }
    // Large, threaded, several row tasks.
    for &(m, n, k) in &[(3136 / 4, 96, 64), (130, 700, 33), (1, 3000, 17)] {
        let p = GemmParams { m, n, k, activation: Activation::Relu, ..Default::default() };
        let a = rng.vec(m * k);
        let b = rng.vec(k * n);
        let bias = rng.vec(n);
        let res = rng.vec(m * n);
        let mut c = vec![f32::NAN; m * n];
        gemm_residual(&p, &a, &b, Some(&bias), Some(&res), &mut c).unwrap();
        let (pre, scale) = gemm_ref(&GemmParams { activation: Activation::None, ..p }, &a, &b, Some(&bias), &[]);
        let (want, scale) = add_residual_act(p.activation, &pre, &scale, &res);
        assert_close("gemm_residual large", &c, &want, Some(&scale), 1e-5);
    }
}

#[test]
fn gemm_residual_errors() {
    let p = GemmParams { m: 2, n: 3, k: 4, ..Default::default() };
    let (a, b, mut c) = (vec![1.0; 8], vec![1.0; 12], vec![9.0; 6]);
    for bad in [5usize, 7, 0] {
        let r = gemm_residual(&p, &a, &b, None, Some(&vec![0.0; bad]), &mut c);
        assert!(matches!(r, Err(KernelError::LengthMismatch { what: "gemm residual", .. })), "{r:?}");
    }
    let r = gemm_residual(&p, &a[..7], &b, None, Some(&[0.0; 6]), &mut c);
    assert!(matches!(r, Err(KernelError::LengthMismatch { what: "gemm A", .. })));
    assert_eq!(c, [9.0; 6]);
    // Empty output with an empty residual is fine.
    let p = GemmParams { m: 0, n: 3, k: 4, ..Default::default() };
    gemm_residual(&p, &[], &b, None, Some(&[]), &mut []).unwrap();
}

pub(crate) fn check_conv_residual(rng: &mut Rng, p: &Conv2dParams, with_bias: bool, with_res: bool) {
    let x = rng.vec(p.batch * p.in_channels * p.in_h * p.in_w);
    let w = rng.vec(p.out_channels * (p.in_channels / p.groups) * p.kernel[0] * p.kernel[1]);
    let bias = rng.vec(p.out_channels);
    let bias = with_bias.then_some(&bias[..]);
    let [n, c, oh, ow] = conv2d_output_shape(p).unwrap();
    let res = rng.vec(n * c * oh * ow);
    let mut y = vec![f32::NAN; n * c * oh * ow];
    conv2d_residual(p, &x, &w, bias, with_res.then_some(&res[..]), &mut y).unwrap();
    let (pre, scale) = conv_ref(&Conv2dParams { activation: Activation::None, ..*p }, &x, &w, bias);
    let zeros = vec![0.0; res.len()];
    let (want, scale) = add_residual_act(p.activation, &pre, &scale, if with_res { &res } else { &zeros });
    assert_close(&format!("conv2d_residual {p:?} bias={with_bias} res={with_res}"), &y, &want, Some(&scale), 1e-5);
}

/// Strongly dilated convs (DeepLab's ASPP) take the tap-major path, which
/// skips a tap for tiles whose output rows all read padding through it:
/// square and asymmetric dilations and paddings, batches, channel counts
/// past one chunk of reduction rows, and tiles no tap reaches (bias only).
#[test]
fn conv2d_dilated_tap_major() {
    let mut rng = Rng::new(117);
    let runs = || crate::conv::gemm::TAP_GEMM_RUNS.load(core::sync::atomic::Ordering::Relaxed);
    let before = runs();
    let base = Conv2dParams { batch: 1, in_channels: 64, in_h: 12, in_w: 13, out_channels: 20, kernel: [3, 3], stride: [1, 1], padding: Padding2d::uniform(6), dilation: [6, 6], groups: 1, activation: Activation::Relu };
    let cases = [
        base,
        Conv2dParams { batch: 2, in_channels: 600, out_channels: 9, in_h: 9, in_w: 10, padding: Padding2d::uniform(8), dilation: [8, 8], activation: Activation::None, ..base },
        Conv2dParams { kernel: [3, 2], padding: Padding2d { top: 10, left: 3, bottom: 8, right: 5 }, dilation: [10, 6], activation: Activation::Silu, ..base },
        // Kernel rows 20 apart under 60 rows of top padding: the first 40
        // output rows (whole tiles) read only padding.
        Conv2dParams { in_h: 8, in_w: 8, kernel: [2, 1], padding: Padding2d { top: 60, left: 0, bottom: 0, right: 0 }, dilation: [20, 1], ..base },
        Conv2dParams { groups: 2, in_channels: 128, out_channels: 10, ..base },
        // Padding that dwarfs the map: no phase planes, only the centre
        // tap reads the input (20 output positions: more than the
        // few-positions path takes).
        Conv2dParams { in_h: 2, in_w: 20, padding: Padding2d::uniform(40), dilation: [40, 40], stride: [2, 1], ..base },
    ];
    for (i, p) in cases.iter().enumerate() {
        check_conv_residual(&mut rng, p, i % 2 == 0, i % 3 != 1);
    }
    assert!(runs() >= before + cases.len(), "the tap-major path ran {} of {} times", runs() - before, cases.len());
}

/// Strided and dilated convs with many channels (ResNet's stride-2 3×3
/// and 1×1 projections, a DeepLab dilation) take the packed im2col path:
/// paddings, odd sizes, batches, groups, reduction rows past one chunk,
/// every epilogue part.
#[test]
fn conv2d_strided_packed() {
    let mut rng = Rng::new(131);
    let runs = || crate::conv::gemm::IM2COL_RUNS.load(core::sync::atomic::Ordering::Relaxed);
    let before = runs();
    let base = Conv2dParams { batch: 1, in_channels: 64, in_h: 15, in_w: 13, out_channels: 70, kernel: [3, 3], stride: [2, 2], padding: Padding2d::uniform(1), dilation: [1, 1], groups: 1, activation: Activation::Relu };
    let cases = [
        base,
        Conv2dParams { kernel: [1, 1], padding: Padding2d::default(), in_channels: 96, batch: 2, activation: Activation::None, ..base },
        Conv2dParams { in_channels: 72, stride: [2, 1], padding: Padding2d { top: 0, left: 2, bottom: 1, right: 0 }, activation: Activation::Silu, ..base },
        Conv2dParams { stride: [1, 1], dilation: [2, 2], padding: Padding2d::uniform(2), ..base },
        Conv2dParams { groups: 2, in_channels: 128, out_channels: 128, ..base },
        // 600 channels × 9 taps: reduction rows past one chunk.
        Conv2dParams { in_channels: 600, in_h: 9, in_w: 11, ..base },
    ];
    for (i, p) in cases.iter().enumerate() {
        check_conv_residual(&mut rng, p, i % 2 == 0, i % 3 != 1);
    }
    assert!(runs() >= before + cases.len(), "the packed path ran {} of {} times", runs() - before, cases.len());
}

/// Pointwise convs over a few positions (squeeze-excite FCs on a 1×1
/// map) take the matrix-vector path: every epilogue part, groups, batches.
#[test]
fn conv2d_pointwise_few_positions() {
    let mut rng = Rng::new(103);
    for (it, (h, w)) in [(1, 1), (1, 2), (2, 3), (1, 7), (3, 2)].into_iter().enumerate() {
        for groups in [1, 2] {
            let p = Conv2dParams {
                batch: 1 + it % 2,
                in_channels: groups * 37,
                in_h: h,
                in_w: w,
                out_channels: groups * 29,
                groups,
                activation: ACTS[it % ACTS.len()],
                ..Default::default()
            };
            for (with_bias, with_res) in [(true, false), (false, true), (true, true), (false, false)] {
                check_conv_residual(&mut rng, &p, with_bias, with_res);
            }
        }
    }
}

/// Other convs with at most 16 output positions (SegFormer's patch
/// embeddings and spatial-reduction convs) run on an im2col of their
/// windows: padding, strides, dilations, kernels as large as the map,
/// groups, batches, every epilogue part; 16 positions exactly and 1.
#[test]
fn conv2d_few_windows() {
    let mut rng = Rng::new(118);
    let base = Conv2dParams { batch: 1, in_channels: 40, in_h: 4, in_w: 4, out_channels: 24, kernel: [3, 3], stride: [2, 2], padding: Padding2d::uniform(1), dilation: [1, 1], groups: 1, activation: Activation::None };
    let cases = [
        base,
        // Kernel = stride, unpadded, to 2×2.
        Conv2dParams { in_channels: 8, in_h: 16, in_w: 16, kernel: [8, 8], stride: [8, 8], padding: Padding2d::default(), batch: 2, activation: Activation::Relu, ..base },
        // 4×4 outputs (16), asymmetric padding, groups.
        Conv2dParams { in_h: 8, in_w: 8, padding: Padding2d { top: 1, left: 0, bottom: 0, right: 1 }, groups: 2, activation: Activation::Silu, ..base },
        // Dilated, one output position.
        Conv2dParams { in_h: 5, in_w: 5, stride: [1, 1], padding: Padding2d::default(), dilation: [2, 2], activation: Activation::Clip { min: -0.5, max: 0.5 }, ..base },
        // A 1×1 kernel with stride (not pointwise) and a non-square map.
        Conv2dParams { kernel: [1, 1], padding: Padding2d::default(), in_h: 3, in_w: 9, batch: 3, ..base },
    ];
    for (i, p) in cases.iter().enumerate() {
        let [_, _, oh, ow] = conv2d_output_shape(p).unwrap();
        assert!(oh * ow <= 16, "case {i}: {oh}x{ow}");
        for (with_bias, with_res) in [(true, false), (false, true), (true, true)] {
            check_conv_residual(&mut rng, p, with_bias, with_res);
        }
    }
}

#[test]
fn conv2d_residual_random() {
    let mut rng = Rng::new(102);
    for it in 0..200 {
        let groups = rng.pick(&[1, 1, 2, 3]);
        let depthwise = rng.below(3) == 0;
        let (cin, cout) = if depthwise {
            let c = rng.pick(&[1, 3, 8, 17]);
            (c, c * rng.pick(&[1, 1, 2]))
        } else {
            (groups * rng.pick(&[1, 2, 3, 5]), groups * rng.pick(&[1, 2, 3]))
        };
        let k = rng.pick(&[1, 1, 3, 5, 7]);
        let p = Conv2dParams {
            batch: rng.range(1, 2),
            in_channels: cin,
            in_h: rng.pick(&[7, 9, 17, 20]),
            in_w: rng.pick(&[7, 9, 16, 33]),
            out_channels: cout,
            kernel: [k, k],
            stride: [rng.range(1, 2), rng.range(1, 2)],
            padding: Padding2d::uniform(rng.range(0, k / 2)),
            dilation: [1, 1],
            groups: if depthwise { cin } else { groups },
            activation: ACTS[it % ACTS.len()],
        };
        let with_bias = rng.bool();
        check_conv_residual(&mut rng, &p, with_bias, true);
    }
}

#[test]
fn conv2d_residual_errors() {
    let p = Conv2dParams { in_channels: 4, in_h: 5, in_w: 5, out_channels: 4, kernel: [3, 3], ..Default::default() };
    let x = vec![1.0; 100];
    let w = vec![1.0; 4 * 4 * 9];
    let mut y = vec![7.0; 4 * 9];
    for bad in [35usize, 37, 0, 100] {
        let r = conv2d_residual(&p, &x, &w, None, Some(&vec![0.0; bad]), &mut y);
        assert!(matches!(r, Err(KernelError::LengthMismatch { what: "conv2d residual", .. })), "{r:?}");
    }
    // Depthwise too.
    let q = Conv2dParams { groups: 4, ..p };
    let r = conv2d_residual(&q, &x, &w[..36], None, Some(&[0.0; 3]), &mut y);
    assert!(matches!(r, Err(KernelError::LengthMismatch { what: "conv2d residual", .. })), "{r:?}");
    assert!(y.iter().all(|&v| v == 7.0));
    conv2d_residual(&p, &x, &w, None, Some(&[1.0; 36]), &mut y).unwrap();
    assert!(y.iter().all(|&v| v == 37.0), "{y:?}");
    // No input channels: act(bias + residual).
    let q = Conv2dParams { in_channels: 0, out_channels: 2, in_h: 2, in_w: 2, kernel: [1, 1], activation: Activation::Relu, ..p };
    let mut y = vec![f32::NAN; 8];
    let res = [1.0, -5.0, 2.0, 0.0, -1.0, 1.0, 0.5, -3.0];
    conv2d_residual(&q, &[], &[], Some(&[1.0, -1.0]), Some(&res), &mut y).unwrap();
    assert_eq!(y, [2.0, 0.0, 3.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
}

#[test]
fn binary_act_random() {
    let mut rng = Rng::new(103);
    let ops = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Pow,
        BinaryOp::Less,
        BinaryOp::GreaterOrEqual,
        BinaryOp::Equal,
    ];
    // 10 ops against 9 shapes: every op meets several shapes.
    let shapes: &[(&[usize], &[usize])] = &[
        (&[7], &[7]),
        (&[1, 3, 5, 5], &[1, 3, 1, 1]),
        (&[1, 3, 1, 1], &[1, 3, 5, 5]),
        (&[2, 17, 9], &[9]),
        (&[2, 1, 9], &[1, 4, 1]),
        (&[70_001], &[70_001]),
        (&[1, 96, 33, 31], &[1, 96, 1, 1]),
        (&[40_000], &[1]),
        (&[3, 50_000], &[3, 1]),
    ];
    for (it, &(ash, bsh)) in shapes.iter().cycle().take(shapes.len() * 4).enumerate() {
        let op = ops[it % ops.len()];
        let act = ACTS[(it / 2) % ACTS.len()];
        let a = rng.vec_in(ash.iter().product(), 0.1, 2.0);
        let b = rng.vec_in(bsh.iter().product(), -2.0, 2.0);
        let shape = broadcast_shape(ash, bsh).unwrap();
        let mut y = vec![f32::NAN; shape.iter().product()];
        binary_act(op, &a, ash, &b, bsh, act, &mut y).unwrap();
        let pre = binary_ref(op, &a, ash, &b, bsh, &shape);
        let want: Vec<f64> = pre.iter().map(|&v| act_ref(act, v)).collect();
        // erf's absolute error (5e-7) is scaled by |x|/2 in GELU; the
        // activations' inputs are rounded to f32 first (relative 6e-8,
        // amplified by the slope).
        let scale: Vec<f64> = pre
            .iter()
            .map(|&v| match act {
                Activation::Gelu => 0.05 * v.abs().max(1.0),
                _ => v.abs().max(1.0) * 0.01,
            })
            .collect();
        assert_close(&format!("binary_act {op:?} {act:?} {ash:?} {bsh:?}"), &y, &want, Some(&scale), 2e-5);
        // binary == binary_act(None), bit for bit.
        let mut y1 = vec![0.0; y.len()];
        let mut y2 = vec![1.0; y.len()];
        binary(op, &a, ash, &b, bsh, &mut y1).unwrap();
        binary_act(op, &a, ash, &b, bsh, Activation::None, &mut y2).unwrap();
        assert!(y1.iter().zip(&y2).all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan())));
    }
}

#[test]
fn binary_act_errors() {
    let mut y = vec![3.0; 6];
    let relu = Activation::Relu;
    let r = binary_act(BinaryOp::Add, &[0.0; 6], &[2, 3], &[0.0; 2], &[2], relu, &mut y);
    assert!(matches!(r, Err(KernelError::Broadcast { .. })));
    let r = binary_act(BinaryOp::Add, &[0.0; 5], &[2, 3], &[0.0], &[], relu, &mut y);
    assert!(matches!(r, Err(KernelError::LengthMismatch { .. })));
    let r = binary_act(BinaryOp::Add, &[0.0; 6], &[2, 3], &[0.0], &[], relu, &mut y[..5]);
    assert!(matches!(r, Err(KernelError::LengthMismatch { .. })));
    let r = binary_act(BinaryOp::Mul, &[0.0], &[1, 1 << 40], &[0.0], &[1 << 40, 1], relu, &mut y);
    assert!(matches!(r, Err(KernelError::Overflow { .. })));
    assert!(y.iter().all(|&v| v == 3.0));
    binary_act(BinaryOp::Sub, &[1.0, -2.0], &[2], &[2.0], &[1], Activation::Clip { min: -3.5, max: 0.5 }, &mut y[..2]).unwrap();
    assert_eq!(&y[..2], &[-1.0, -3.5]);
}

#[test]
fn pool2d_model_shapes() {
    let mut rng = Rng::new(104);
    let cases = [
        // ResNet stem max pool and odd sizes around it.
        (3, 112, 112, 3, 2, 1, PoolKind::Max),
        (2, 17, 23, 3, 2, 1, PoolKind::Max),
        (2, 16, 9, 3, 2, 0, PoolKind::Max),
        (2, 15, 15, 2, 2, 0, PoolKind::Max),
        (2, 13, 11, 3, 1, 1, PoolKind::Max),
        (2, 13, 11, 3, 1, 1, PoolKind::Avg { count_include_pad: false }),
        (2, 13, 11, 3, 2, 1, PoolKind::Avg { count_include_pad: true }),
        // Global average pools.
        (33, 7, 7, 7, 1, 0, PoolKind::Avg { count_include_pad: false }),
        (5, 14, 14, 14, 1, 0, PoolKind::Avg { count_include_pad: true }),
        (600, 1, 1, 1, 1, 0, PoolKind::Avg { count_include_pad: false }),
        (40, 9, 9, 9, 1, 0, PoolKind::Max),
        // Stride-1 max pools to the input's size (inception branches,
        // YOLO's SPPF), planes narrower than the window among them.
        (7, 14, 14, 3, 1, 1, PoolKind::Max),
        (3, 20, 20, 5, 1, 2, PoolKind::Max),
        (2, 9, 31, 5, 1, 2, PoolKind::Max),
        (2, 2, 3, 5, 1, 2, PoolKind::Max),
        (2, 1, 9, 3, 1, 1, PoolKind::Max),
        (2, 6, 1, 7, 1, 3, PoolKind::Max),
        // Downsampling windows of 2 and 3 taps with row tails.
        (3, 28, 29, 3, 2, 1, PoolKind::Max),
        (3, 27, 35, 2, 2, 0, PoolKind::Avg { count_include_pad: true }),
        (3, 19, 41, 3, 2, 1, PoolKind::Avg { count_include_pad: false }),
    ];
    for (c, h, w, k, s, pad, kind) in cases {
        for batch in [1, 2] {
            let p = Pool2dParams {
                batch,
                channels: c,
                in_h: h,
                in_w: w,
                kernel: [k, k],
                stride: [s, s],
                padding: Padding2d::uniform(pad),
                kind,
                ..Default::default()
            };
            check_pool(&p, &rng.vec(batch * c * h * w));
        }
    }
    // Same-size windows with asymmetric padding (an even kernel, as
    // ceil-mode exporters pad), NaNs among the inputs.
    for (k, pad) in [(2, Padding2d { top: 0, left: 0, bottom: 1, right: 1 }), (4, Padding2d { top: 2, left: 1, bottom: 1, right: 2 })] {
        let p = Pool2dParams { channels: 3, in_h: 11, in_w: 13, kernel: [k, k], padding: pad, kind: PoolKind::Max, ..Default::default() };
        let mut x = rng.vec(3 * 11 * 13);
        x[17] = f32::NAN;
        assert_eq!(pool2d_output_shape(&p).unwrap()[2..], [11, 13]);
        check_pool(&p, &x);
    }
}

/// `pool2d` on `x` against the f64 reference.
fn check_pool(p: &Pool2dParams, x: &[f32]) {
    let [n, c, oh, ow] = pool2d_output_shape(p).unwrap();
    let mut y = vec![f32::NAN; n * c * oh * ow];
    pool2d(p, x, &mut y).unwrap();
    let (want, scale) = pool_ref(p, x);
    assert_close(&format!("pool {p:?}"), &y, &want, Some(&scale), 1e-5);
}

#[test]
fn depthwise_fast_path_shapes() {
    let mut rng = Rng::new(105);
    // (channels, multiplier, h, w, kernel, stride, pad, dilation)
    let cases = [
        (3, 1, 112, 112, 3, 1, 1, 1),
        (5, 1, 57, 33, 3, 2, 1, 1),
        (4, 1, 56, 56, 5, 2, 2, 1),
        (7, 1, 28, 27, 5, 1, 2, 1),
        (9, 1, 14, 14, 3, 1, 1, 1),
        (17, 1, 7, 7, 5, 1, 2, 1),
        (6, 1, 7, 7, 3, 2, 1, 1),
        (3, 2, 13, 11, 3, 1, 1, 1),
        (2, 3, 9, 10, 5, 2, 2, 2),
        (4, 1, 20, 21, 3, 3, 0, 1),
        (4, 1, 15, 16, 3, 2, 4, 3),
        (2, 1, 5, 5, 7, 1, 3, 1),
        (2, 1, 1, 1, 3, 1, 1, 1),
        (3, 1, 9, 70, 1, 1, 0, 1),
        (3, 1, 9, 70, 1, 2, 0, 1),
        // Whole blocks of 8 channels (register transposes in and out) and
        // a partial one after them; rows narrower than 8, row tails, bands
        // of rows, strides 2 and 3, dilation.
        (8, 1, 7, 7, 5, 1, 2, 1),
        (16, 1, 29, 30, 3, 2, 1, 1),
        (24, 1, 14, 14, 3, 1, 1, 1),
        (8, 1, 9, 70, 3, 3, 1, 2),
        (16, 1, 112, 20, 3, 1, 1, 1),
        (40, 1, 13, 13, 7, 1, 3, 1),
        (12, 1, 6, 5, 3, 1, 1, 1),
        // 16-lane blocks (AVX-512): whole ones, a shifted last one (72 =
        // 4·16 + 8, 33), small maps whose rows leave together, stride 2
        // with dilation, wide short rows; and 3×3 windows on maps of
        // 14×14 outputs or more, which run per plane there.
        (32, 1, 7, 7, 5, 1, 2, 1),
        (72, 1, 14, 14, 5, 2, 2, 1),
        (48, 1, 9, 9, 3, 1, 1, 1),
        (33, 1, 12, 11, 3, 2, 1, 2),
        (16, 1, 3, 40, 7, 1, 3, 1),
        (20, 1, 30, 30, 3, 1, 1, 1),
        (18, 1, 31, 29, 3, 2, 1, 1),
        // Stride 1 straight from the input rows (AVX-512, rows of 14 or
        // more outputs): rows of exactly one vector, one lane past it, a
        // masked tail after whole vectors; no padding; more padding than
        // the window needs; a channel multiplier; row counts that leave
        // 4-, 2- and 1-row blocks after the 8-row ones.
        (5, 1, 16, 16, 3, 1, 1, 1),
        (3, 1, 15, 17, 3, 1, 1, 1),
        (4, 1, 19, 33, 3, 1, 1, 1),
        (3, 1, 18, 18, 3, 1, 0, 1),
        (3, 1, 14, 14, 3, 1, 2, 1),
        (2, 2, 23, 20, 3, 1, 1, 1),
        (3, 1, 15, 14, 1, 1, 0, 1),
        (3, 1, 20, 19, 5, 1, 0, 1),
        (2, 1, 17, 33, 5, 1, 1, 1),
        (2, 1, 14, 14, 5, 1, 3, 1),
        // ... and at stride 2 (the input rows split into column phases):
        // odd and even widths, rows of 16 and 17 outputs, no padding,
        // a 2×2 window (the per-tap loads).
        (3, 1, 33, 33, 3, 2, 1, 1),
        (2, 1, 30, 34, 3, 2, 0, 1),
        (2, 1, 29, 35, 5, 2, 2, 1),
        (3, 1, 28, 28, 2, 2, 0, 1),
    ];
    for (it, &(c, mult, h, w, k, s, pad, d)) in cases.iter().enumerate() {
        for batch in [1, 2] {
            let p = Conv2dParams {
                batch,
                in_channels: c,
                in_h: h,
                in_w: w,
                out_channels: c * mult,
                kernel: [k, k],
                stride: [s, s],
                padding: Padding2d::uniform(pad),
                dilation: [d, d],
                groups: c,
                activation: ACTS[it % ACTS.len()],
            };
            check_conv_residual(&mut rng, &p, true, batch == 2);
        }
    }
    // Asymmetric padding / strides / kernels.
    let p = Conv2dParams {
        batch: 1,
        in_channels: 3,
        in_h: 17,
        in_w: 23,
        out_channels: 3,
        kernel: [3, 5],
        stride: [1, 2],
        padding: Padding2d { top: 0, left: 2, bottom: 2, right: 1 },
        dilation: [2, 1],
        groups: 3,
        activation: Activation::Relu,
    };
    check_conv_residual(&mut rng, &p, true, true);
    check_conv_residual(&mut rng, &Conv2dParams { in_channels: 16, out_channels: 16, groups: 16, ..p }, true, true);
    // The same without dilation (the row path), at each mix of strides 1
    // and 2, and windows of one row or one column.
    for kernel in [[3, 3], [1, 3], [3, 1], [2, 4], [5, 5]] {
        for stride in [[1, 1], [2, 1], [1, 2], [2, 2]] {
            let q = Conv2dParams { stride, dilation: [1, 1], kernel, ..p };
            check_conv_residual(&mut rng, &q, true, true);
        }
    }
    // Huge padding with a dilated kernel: the phase planes would dwarf the
    // data, so the generic loop runs (and must agree).
    let p = Conv2dParams {
        batch: 1,
        in_channels: 2,
        in_h: 2,
        in_w: 3,
        out_channels: 2,
        kernel: [3, 3],
        stride: [1, 1],
        padding: Padding2d::uniform(40),
        dilation: [40, 40],
        groups: 2,
        activation: Activation::None,
    };
    check_conv_residual(&mut rng, &p, true, true);
}

#[test]
fn depthwise_and_pool_huge_strides() {
    // Strides near usize::MAX with padding: one output per axis, empty
    // phase ranges; nothing may overflow.
    let mut rng = Rng::new(106);
    for &stride in &[usize::MAX, usize::MAX / 2, isize::MAX as usize, 1 << 40] {
        for pad in [0usize, 1, 2, 3] {
            let p = Conv2dParams {
                batch: 1,
                in_channels: 2,
                in_h: 3,
                in_w: 4,
                out_channels: 2,
                kernel: [2, 3],
                stride: [stride, stride],
                padding: Padding2d::uniform(pad),
                dilation: [1, 1],
                groups: 2,
                activation: Activation::None,
            };
            if conv2d_output_shape(&p).is_ok() {
                check_conv_residual(&mut rng, &p, true, true);
            }
            let q = Pool2dParams {
                channels: 2,
                in_h: 3,
                in_w: 4,
                kernel: [2, 3],
                stride: [stride, stride],
                padding: Padding2d::uniform(pad),
                kind: PoolKind::Max,
                ..Default::default()
            };
            if pool2d_output_shape(&q).is_ok() {
                check_pool(&q, &rng.vec(2 * 12));
            }
        }
    }
}

/// Depthwise conv and pooling with nasty geometry: errors or correct
/// results, never a panic.
#[test]
fn depthwise_and_pool_fuzz() {
    const NASTY: &[usize] = &[0, 1, 2, 3, 5, 8, 40, usize::MAX, usize::MAX / 2, isize::MAX as usize, 1 << 33];
    let mut rng = Rng::new(107);
    let mut computed = 0;
    for _ in 0..20_000 {
        let mut v = |small: usize| if rng.below(4) == 0 { rng.pick(NASTY) } else { rng.range(0, small) };
        let c = v(3).max(1);
        let p = Conv2dParams {
            batch: 1,
            in_channels: c,
            in_h: v(9),
            in_w: v(9),
            out_channels: c,
            kernel: [v(5), v(5)],
            stride: [v(3), v(3)],
            padding: Padding2d { top: v(3), left: v(3), bottom: v(3), right: v(3) },
            dilation: [v(3), v(3)],
            groups: c,
            activation: Activation::Relu,
        };
        let shape = conv2d_output_shape(&p);
        let small = |n: usize| n <= 1 << 16;
        let ok_sizes = shape.as_ref().is_ok_and(|s| small(s.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).unwrap_or(usize::MAX)))
            && small(c.saturating_mul(p.in_h).saturating_mul(p.in_w))
            && small(c.saturating_mul(p.kernel[0]).saturating_mul(p.kernel[1]));
        if !ok_sizes {
            let x = vec![0.5; 8];
            let mut y = vec![0.0; 8];
            let _ = conv2d(&p, &x, &x, None, &mut y);
            continue;
        }
        let [n, co, oh, ow] = shape.unwrap();
        let x = rng.vec(c * p.in_h * p.in_w);
        let w = rng.vec(c * p.kernel[0] * p.kernel[1]);
        let mut y = vec![f32::NAN; n * co * oh * ow];
        conv2d(&p, &x, &w, None, &mut y).unwrap();
        let (want, scale) = conv_ref(&p, &x, &w, None);
        assert_close(&format!("{p:?}"), &y, &want, Some(&scale), 1e-5);
        let q = Pool2dParams {
            batch: 1,
            channels: c,
            in_h: p.in_h,
            in_w: p.in_w,
            kernel: p.kernel,
            stride: p.stride,
            padding: p.padding,
            dilation: p.dilation,
            kind: if rng.bool() { PoolKind::Max } else { PoolKind::Avg { count_include_pad: rng.bool() } },
        };
        let mut y = vec![f32::NAN; n * co * oh * ow];
        pool2d(&q, &x, &mut y).unwrap();
        let (want, scale) = pool_ref(&q, &x);
        assert_close(&format!("{q:?}"), &y, &want, Some(&scale), 1e-5);
        computed += 1;
    }
    assert!(computed > 500, "{computed}");
}

/// Transposing permutes (8×8 register blocks plus ragged edges) against a
/// naive reference.
#[test]
fn permute_transposes() {
    let mut rng = Rng::new(108);
    let cases: &[(&[usize], &[usize])] = &[
        (&[37, 45], &[1, 0]),
        (&[8, 8], &[1, 0]),
        (&[64, 33], &[1, 0]),
        (&[3, 37, 45], &[0, 2, 1]),
        (&[2, 20, 9, 11], &[0, 2, 3, 1]),
        (&[1, 96, 14, 14], &[0, 2, 3, 1]),
        (&[1, 14, 14, 96], &[0, 3, 1, 2]),
        (&[2, 12, 17, 64], &[0, 2, 1, 3]),
        (&[5, 7, 9], &[2, 1, 0]),
        (&[40, 3, 41], &[2, 1, 0]),
    ];
    for &(shape, perm) in cases {
        let n: usize = shape.iter().product();
        let x = rng.vec(n);
        let mut y = vec![f32::NAN; n];
        permute(shape, perm, &x, &mut y).unwrap();
        let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        let in_strides = super::strides_of(shape);
        for (o, &v) in y.iter().enumerate() {
            let idx = super::unravel(o, &out_shape);
            let src: usize = idx.iter().zip(perm).map(|(&i, &p)| i * in_strides[p]).sum();
            assert_eq!(v.to_bits(), x[src].to_bits(), "{shape:?} {perm:?} at {o}");
        }
    }
}
