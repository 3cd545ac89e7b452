//! gemm, conv2d and pool2d against naive references.

use super::{act_ref, assert_close, Rng, ACTS, SIZES};
use crate::*;

/// Returns (want, scale) where scale = Σ|a·b| + |bias| + |c|.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_ref(p: &GemmParams, a: &[f32], b: &[f32], bias: Option<&[f32]>, c0: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (m, n, k) = (p.m, p.n, p.k);
    let mut want = vec![0.0; m * n];
    let mut scale = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut sa) = (0.0f64, 0.0f64);
            for l in 0..k {
                let av = if p.trans_a { a[l * m + i] } else { a[i * k + l] } as f64;
                let bv = if p.trans_b { b[j * k + l] } else { b[l * n + j] } as f64;
                s += av * bv;
                sa += (av * bv).abs();
            }
            if let Some(bias) = bias {
                s += bias[j] as f64;
                sa += (bias[j] as f64).abs();
            }
            if p.accumulate {
                s += c0[i * n + j] as f64;
                sa += (c0[i * n + j] as f64).abs();
            }
            want[i * n + j] = act_ref(p.activation, s);
            scale[i * n + j] = sa;
        }
    }
    (want, scale)
}

fn check_gemm(rng: &mut Rng, p: GemmParams, with_bias: bool) {
    let a = rng.vec(p.m * p.k);
    let b = rng.vec(p.k * p.n);
    let bias = rng.vec(p.n);
    let bias = with_bias.then_some(&bias[..]);
    let c0 = rng.vec(p.m * p.n);
    let mut c = if p.accumulate { c0.clone() } else { vec![f32::NAN; p.m * p.n] };
    gemm(&p, &a, &b, bias, &mut c).unwrap();
    let (want, scale) = gemm_ref(&p, &a, &b, bias, &c0);
    assert_close(&format!("gemm {p:?} bias={with_bias}"), &c, &want, Some(&scale), 1e-5);
    // The same product with B in the packed layout the compiler writes.
    let mut packed = vec![f32::NAN; rbln_hw::ops::gemm_packed_b_len(p.k as u64, p.n as u64).unwrap() as usize];
    rbln_hw::ops::pack_gemm_b(&b, p.k, p.n, p.trans_b, &mut packed);
    let pp = GemmParams { trans_b: false, b_packed: true, ..p };
    let mut c = if p.accumulate { c0.clone() } else { vec![f32::NAN; p.m * p.n] };
    gemm(&pp, &a, &packed, bias, &mut c).unwrap();
    assert_close(&format!("gemm packed B {p:?} bias={with_bias}"), &c, &want, Some(&scale), 1e-5);
}

#[test]
fn gemm_random() {
    let mut rng = Rng::new(1);
    for it in 0..120 {
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
        let with_bias = rng.bool();
        check_gemm(&mut rng, p, with_bias);
    }
}

#[test]
fn gemm_large_threaded() {
    let mut rng = Rng::new(2);
    for &(m, n, k) in &[(257, 300, 513), (128, 129, 130), (1, 1000, 300), (3, 1000, 301), (700, 1, 65), (64, 1000, 128)] {
        for &(ta, tb) in &[(false, false), (true, true)] {
            let p = GemmParams { m, n, k, trans_a: ta, trans_b: tb, accumulate: ta, activation: Activation::Relu, ..Default::default() };
            check_gemm(&mut rng, p, true);
        }
    }
}

#[test]
fn gemm_degenerate() {
    // k = 0: C = act(bias (+ C)).
    let p = GemmParams {
        m: 3,
        n: 2,
        k: 0,
        activation: Activation::Relu,
        ..Default::default()
    };
    let mut c = vec![f32::NAN; 6];
    gemm(&p, &[], &[], Some(&[-1.0, 2.0]), &mut c).unwrap();
    assert_eq!(c, [0.0, 2.0, 0.0, 2.0, 0.0, 2.0]);
    let p = GemmParams { accumulate: true, ..p };
    let mut c = vec![5.0; 6];
    gemm(&p, &[], &[], Some(&[-1.0, 2.0]), &mut c).unwrap();
    assert_eq!(c, [4.0, 7.0, 4.0, 7.0, 4.0, 7.0]);
    // m = 0 / n = 0: empty output, nothing to do.
    let p = GemmParams { m: 0, n: 5, k: 4, ..Default::default() };
    gemm(&p, &[], &[0.0; 20], None, &mut []).unwrap();
    let p = GemmParams { m: 5, n: 0, k: 4, ..Default::default() };
    gemm(&p, &[0.0; 20], &[], Some(&[]), &mut []).unwrap();
}

#[test]
fn gemm_in_sized_pool_matches() {
    let mut rng = Rng::new(3);
    let p = GemmParams { m: 200, n: 150, k: 99, ..Default::default() };
    let a = rng.vec(p.m * p.k);
    let b = rng.vec(p.k * p.n);
    let mut c1 = vec![0.0; p.m * p.n];
    let mut c2 = vec![0.0; p.m * p.n];
    gemm(&p, &a, &b, None, &mut c1).unwrap();
    thread_pool(1).unwrap().install(|| gemm(&p, &a, &b, None, &mut c2)).unwrap();
    let (want, scale) = gemm_ref(&p, &a, &b, None, &[]);
    assert_close("gemm pool(1)", &c2, &want, Some(&scale), 1e-5);
    assert_close("gemm global", &c1, &want, Some(&scale), 1e-5);
}

pub(crate) fn out_dim(input: usize, pa: usize, pb: usize, k: usize, s: usize, d: usize) -> Option<usize> {
    let padded = input + pa + pb;
    let ext = d * (k - 1) + 1;
    (padded >= ext).then(|| (padded - ext) / s + 1)
}

pub(crate) fn conv_ref(p: &Conv2dParams, x: &[f32], w: &[f32], bias: Option<&[f32]>) -> (Vec<f64>, Vec<f64>) {
    let pad = p.padding;
    let oh = out_dim(p.in_h, pad.top, pad.bottom, p.kernel[0], p.stride[0], p.dilation[0]).unwrap();
    let ow = out_dim(p.in_w, pad.left, pad.right, p.kernel[1], p.stride[1], p.dilation[1]).unwrap();
    let cg = p.in_channels / p.groups;
    let og = p.out_channels / p.groups;
    let (kh, kw) = (p.kernel[0], p.kernel[1]);
    let mut want = vec![0.0; p.batch * p.out_channels * oh * ow];
    let mut scale = vec![0.0; want.len()];
    for b in 0..p.batch {
        for co in 0..p.out_channels {
            let g = co / og;
            for oy in 0..oh {
                for ox in 0..ow {
                    let (mut s, mut sa) = (0.0f64, 0.0f64);
                    if let Some(bias) = bias {
                        s += bias[co] as f64;
                        sa += (bias[co] as f64).abs();
                    }
                    for c in 0..cg {
                        let ci = g * cg + c;
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * p.stride[0] + ky * p.dilation[0]) as isize - pad.top as isize;
                                let ix = (ox * p.stride[1] + kx * p.dilation[1]) as isize - pad.left as isize;
                                if iy < 0 || ix < 0 || iy >= p.in_h as isize || ix >= p.in_w as isize {
                                    continue;
                                }
                                let xv = x[((b * p.in_channels + ci) * p.in_h + iy as usize) * p.in_w + ix as usize] as f64;
                                let wv = w[((co * cg + c) * kh + ky) * kw + kx] as f64;
                                s += xv * wv;
                                sa += (xv * wv).abs();
                            }
                        }
                    }
                    let o = ((b * p.out_channels + co) * oh + oy) * ow + ox;
                    want[o] = act_ref(p.activation, s);
                    scale[o] = sa;
                }
            }
        }
    }
    (want, scale)
}

fn check_conv(rng: &mut Rng, p: &Conv2dParams, with_bias: bool) {
    let x = rng.vec(p.batch * p.in_channels * p.in_h * p.in_w);
    let w = rng.vec(p.out_channels * (p.in_channels / p.groups) * p.kernel[0] * p.kernel[1]);
    let bias = rng.vec(p.out_channels);
    let bias = with_bias.then_some(&bias[..]);
    let [n, c, oh, ow] = conv2d_output_shape(p).unwrap();
    let mut y = vec![f32::NAN; n * c * oh * ow];
    conv2d(p, &x, &w, bias, &mut y).unwrap();
    let (want, scale) = conv_ref(p, &x, &w, bias);
    assert_close(&format!("conv {p:?}"), &y, &want, Some(&scale), 1e-5);
}

/// Depthwise buffers are kept per thread between ops: an unpadded op whose
/// phase plane has the same length as a padded one's fills the padded
/// one's border with data, which must not leak into the padded op's taps.
#[test]
fn depthwise_padding_survives_a_previous_op_of_the_same_scratch_size() {
    let mut rng = Rng::new(41);
    let dw = |hw: usize, pad: usize| Conv2dParams {
        in_channels: 3,
        out_channels: 3,
        groups: 3,
        in_h: hw,
        in_w: hw,
        kernel: [3, 3],
        padding: Padding2d::uniform(pad),
        ..Default::default()
    };
    // 8x8 padded by 1 and 10x10 unpadded: both 8x8 outputs over 10-column
    // phase planes of 10 rows.
    thread_pool(1).unwrap().install(|| {
        for _ in 0..3 {
            check_conv(&mut rng, &dw(10, 0), false);
            check_conv(&mut rng, &dw(8, 1), true);
        }
    });
}

#[test]
fn conv2d_random() {
    let mut rng = Rng::new(4);
    let mut valid = 0;
    for it in 0..400 {
        let groups = rng.pick(&[1, 1, 1, 2, 3, 4]);
        let depthwise = rng.below(4) == 0;
        let (cin, cout) = if depthwise {
            let c = rng.pick(&[1, 3, 8, 17]);
            (c, c * rng.pick(&[1, 1, 2]))
        } else {
            (groups * rng.pick(&[1, 2, 3, 5]), groups * rng.pick(&[1, 2, 3]))
        };
        let p = Conv2dParams {
            batch: rng.range(0, 2).max(it % 2),
            in_channels: cin,
            in_h: rng.pick(&[1, 2, 3, 7, 9, 17]),
            in_w: rng.pick(&[1, 2, 3, 7, 16, 33]),
            out_channels: cout,
            kernel: [rng.pick(&[1, 2, 3, 5]), rng.pick(&[1, 2, 3, 5])],
            stride: [rng.range(1, 3), rng.range(1, 3)],
            padding: Padding2d {
                top: rng.range(0, 3),
                left: rng.range(0, 3),
                bottom: rng.range(0, 3),
                right: rng.range(0, 3),
            },
            dilation: [rng.range(1, 2), rng.range(1, 3)],
            groups: if depthwise { cin } else { groups },
            activation: ACTS[it % ACTS.len()],
        };
        let pad = p.padding;
        let ok = out_dim(p.in_h, pad.top, pad.bottom, p.kernel[0], p.stride[0], p.dilation[0]).is_some()
            && out_dim(p.in_w, pad.left, pad.right, p.kernel[1], p.stride[1], p.dilation[1]).is_some();
        if !ok {
            assert!(matches!(conv2d_output_shape(&p), Err(KernelError::InvalidParam { .. })), "{p:?}");
            continue;
        }
        valid += 1;
        let with_bias = rng.bool();
        check_conv(&mut rng, &p, with_bias);
    }
    assert!(valid > 250, "only {valid} valid cases");
}

#[test]
fn conv2d_tiled_and_pointwise() {
    let mut rng = Rng::new(5);
    let base = Conv2dParams {
        batch: 2,
        in_channels: 64,
        in_h: 33,
        in_w: 33,
        out_channels: 8,
        kernel: [3, 3],
        padding: Padding2d::uniform(1),
        activation: Activation::Relu,
        ..Default::default()
    };
    // 576-deep reduction over 1089 positions: several tiles of the
    // phase-plane (indirect) path, which reads the garbage columns of the
    // flattened grid and must drop them.
    check_conv(&mut rng, &base, true);
    // Few positions, many output channels: tasks split the channels
    // (indirect, pointwise with a residual-free epilogue, strided 1×1).
    let late = Conv2dParams { in_channels: 20, in_h: 7, in_w: 6, out_channels: 250, batch: 1, ..base };
    check_conv(&mut rng, &late, true);
    check_conv(&mut rng, &Conv2dParams { kernel: [1, 1], padding: Padding2d::default(), ..late }, true);
    check_conv(&mut rng, &Conv2dParams { kernel: [1, 1], padding: Padding2d::default(), stride: [2, 2], in_h: 13, in_w: 14, ..late }, false);
    // Phase planes far larger than the data (a huge kernel over a padded
    // 1×1 input): the im2col fallback, in several reduction chunks.
    let huge = Conv2dParams { in_channels: 2, out_channels: 3, in_h: 1, in_w: 2, kernel: [81, 81], padding: Padding2d::uniform(40), batch: 2, ..base };
    check_conv(&mut rng, &huge, true);
    // Very deep columns (minimum tile of 64 positions).
    check_conv(&mut rng, &Conv2dParams { in_channels: 1024, in_h: 9, in_w: 9, out_channels: 4, batch: 1, ..base }, true);
    // Channel blocks sharing their input's panels, packed once per (image,
    // tile): a reduction of several chunks (1100 = 512 + 512 + 76 rows),
    // two images, two tiles of positions, and grouped.
    let shared = Conv2dParams { kernel: [1, 1], padding: Padding2d::default(), in_channels: 1100, out_channels: 200, in_h: 15, in_w: 15, batch: 2, ..base };
    thread_pool(2).unwrap().install(|| {
        use core::sync::atomic::Ordering::Relaxed;
        let runs = crate::conv::gemm::SHARED_PANEL_RUNS.load(Relaxed);
        check_conv(&mut rng, &shared, true);
        check_conv(&mut rng, &Conv2dParams { in_h: 23, in_w: 23, batch: 1, ..shared }, false);
        check_conv(&mut rng, &Conv2dParams { groups: 2, out_channels: 400, ..shared }, true);
        assert!(crate::conv::gemm::SHARED_PANEL_RUNS.load(Relaxed) >= runs + 3, "the convs shared their panels");
    });
    // 1×1 stride-1 unpadded: im2col skipped; grouped too.
    let pw = Conv2dParams { kernel: [1, 1], padding: Padding2d::default(), out_channels: 16, ..base };
    check_conv(&mut rng, &pw, false);
    check_conv(&mut rng, &Conv2dParams { groups: 4, ..pw }, true);
    // Depthwise 3×3 stride 2, larger planes.
    let dw = Conv2dParams { in_channels: 32, out_channels: 32, groups: 32, stride: [2, 2], in_h: 65, in_w: 64, ..base };
    check_conv(&mut rng, &dw, true);
}

/// Pointwise convs whose planes are whole microkernel panels wide read
/// their input in place (`pointwise_rows`, asserted taken): one and two
/// images, groups, reductions of several blocks, channel splits, every
/// epilogue (bias, residual, a clamp, an activation after the stores).
#[test]
fn conv2d_pointwise_rows_in_place() {
    let mut rng = Rng::new(17);
    let runs = || crate::conv::gemm::POINTWISE_ROWS_RUNS.with(|n| n.get());
    let pw = |cin: usize, cout: usize, h: usize, w: usize, batch: usize, groups: usize, act: Activation| Conv2dParams {
        batch,
        in_channels: cin,
        in_h: h,
        in_w: w,
        out_channels: cout,
        kernel: [1, 1],
        groups,
        activation: act,
        ..Default::default()
    };
    for threads in [1, 2] {
        thread_pool(threads).unwrap().install(|| {
            let before = runs();
            check_conv(&mut rng, &pw(64, 24, 8, 8, 2, 1, Activation::Relu), true);
            check_conv(&mut rng, &pw(300, 40, 4, 4, 1, 1, Activation::Silu), false);
            check_conv(&mut rng, &pw(96, 200, 16, 20, 2, 2, Activation::None), true);
            check_conv(&mut rng, &pw(520, 7, 8, 6, 1, 1, Activation::Clip { min: -0.5, max: 0.5 }), true);
            super::fused::check_conv_residual(&mut rng, &pw(48, 256, 8, 8, 2, 1, Activation::Relu), true, true);
            super::fused::check_conv_residual(&mut rng, &pw(32, 20, 16, 16, 1, 2, Activation::Gelu), false, true);
            assert_eq!(runs(), before + 6, "every conv read its planes in place");
        });
    }
}

/// 3×3 stride-1 convolutions that take the Winograd F(2×2, 3×3) path (the
/// test checks that they do): odd output sizes (tiles hanging over the
/// last row and column), asymmetric and zero padding, batches, several
/// blocks of tile rows, every activation, bias or not; results within the
/// direct path's tolerance of the f64 reference.
#[test]
fn conv2d_winograd_per_call() {
    let mut rng = Rng::new(44);
    let base = Conv2dParams {
        batch: 1,
        in_channels: 16,
        in_h: 20,
        in_w: 20,
        out_channels: 16,
        kernel: [3, 3],
        padding: Padding2d::uniform(1),
        ..Default::default()
    };
    let cases = [
        base,
        Conv2dParams { in_h: 23, in_w: 21, batch: 2, ..base },
        Conv2dParams { in_h: 24, in_w: 25, padding: Padding2d { top: 0, left: 1, bottom: 2, right: 0 }, ..base },
        Conv2dParams { in_h: 26, in_w: 26, padding: Padding2d::default(), in_channels: 24, out_channels: 40, ..base },
        Conv2dParams { in_h: 9, in_w: 90, in_channels: 33, out_channels: 17, ..base },
        Conv2dParams { in_h: 57, in_w: 31, padding: Padding2d::uniform(2), ..base },
    ];
    // Forced: a host with the AVX-512 microkernel takes the direct path.
    use crate::conv::winograd::{applies, force, suits};
    for (i, p) in cases.iter().enumerate() {
        let p = Conv2dParams { activation: ACTS[i % ACTS.len()], ..*p };
        let g = crate::conv::geometry(&p).unwrap();
        assert!(suits(&p, &g) && force(|| applies(&p, &g)), "{p:?} should take the Winograd path");
        assert_eq!(applies(&p, &g), !crate::microkernel::has_wide(), "{p:?}: Winograd only without the AVX-512 microkernel");
        force(|| check_conv(&mut rng, &p, i % 2 == 0));
    }
    // With a residual (added before the activation).
    let p = Conv2dParams { in_h: 21, in_w: 22, batch: 2, activation: Activation::Relu, ..base };
    let x = rng.vec(p.batch * p.in_channels * p.in_h * p.in_w);
    let w = rng.vec(p.out_channels * p.in_channels * 9);
    let bias = rng.vec(p.out_channels);
    let [n, c, oh, ow] = conv2d_output_shape(&p).unwrap();
    let res = rng.vec(n * c * oh * ow);
    let mut y = vec![f32::NAN; res.len()];
    force(|| conv2d_residual(&p, &x, &w, Some(&bias), Some(&res), &mut y)).unwrap();
    let (lin, scale) = conv_ref(&Conv2dParams { activation: Activation::None, ..p }, &x, &w, Some(&bias));
    let want: Vec<f64> = lin.iter().zip(&res).map(|(&v, &r)| act_ref(p.activation, v + r as f64)).collect();
    let scale: Vec<f64> = scale.iter().zip(&res).map(|(&s, &r)| s + (r as f64).abs()).collect();
    assert_close("winograd + residual", &y, &want, Some(&scale), 1e-5);
    // Shapes it must not take: strided, dilated, grouped, too few channels
    // or output tiles.
    for q in [
        Conv2dParams { stride: [2, 2], ..base },
        Conv2dParams { dilation: [2, 2], ..base },
        Conv2dParams { groups: 2, ..base },
        Conv2dParams { in_channels: 8, ..base },
        Conv2dParams { in_h: 14, in_w: 14, ..base },
        Conv2dParams { kernel: [3, 5], ..base },
    ] {
        assert!(!suits(&q, &crate::conv::geometry(&q).unwrap()), "{q:?}");
    }
}

/// `conv2d_winograd` on filters transformed by the hardware contract's
/// `winograd_weights` (the compiler's CONV_WINOGRAD layout): blocks of 64
/// tiles cut mid-row (rows of 75 tiles, and blocks spanning rows), odd
/// output sizes, asymmetric and zero padding, batches, few tiles with the
/// output channels split between tasks, every activation (a clamp in the
/// transform, others after it), with and without bias and residual;
/// within the direct path's tolerance of the f64 reference, and
/// bit-identical to the per-call Winograd path (same transform, same
/// tasks).
#[test]
fn conv2d_winograd_transformed_filters() {
    let mut rng = Rng::new(45);
    let base = Conv2dParams { batch: 1, in_channels: 16, in_h: 20, in_w: 20, out_channels: 16, kernel: [3, 3], padding: Padding2d::uniform(1), ..Default::default() };
    let cases = [
        Conv2dParams { in_channels: 24, out_channels: 40, ..base },
        Conv2dParams { in_h: 23, in_w: 21, batch: 2, ..base },
        Conv2dParams { in_h: 24, in_w: 25, padding: Padding2d { top: 0, left: 1, bottom: 2, right: 0 }, ..base },
        Conv2dParams { in_h: 26, in_w: 26, padding: Padding2d::default(), in_channels: 33, out_channels: 17, ..base },
        Conv2dParams { in_h: 6, in_w: 150, in_channels: 20, out_channels: 19, ..base },
        Conv2dParams { in_h: 30, in_w: 34, in_channels: 64, out_channels: 64, ..base },
        // 16 tiles, 100 channels: the channels split between tasks.
        Conv2dParams { in_h: 7, in_w: 7, in_channels: 40, out_channels: 100, ..base },
        Conv2dParams { in_h: 1, in_w: 1, padding: Padding2d::uniform(2), ..base },
    ];
    for (i, p) in cases.iter().enumerate() {
        for (j, act) in ACTS.iter().enumerate() {
            if (i + j) % 3 != 0 && j != 0 {
                continue;
            }
            let p = Conv2dParams { activation: *act, ..*p };
            let x = rng.vec(p.batch * p.in_channels * p.in_h * p.in_w);
            let w = rng.vec(p.out_channels * p.in_channels * 9);
            let mut u = vec![0.0; 16 * p.out_channels * p.in_channels];
            rbln_hw::ops::winograd_weights(&w, p.out_channels, p.in_channels, &mut u);
            let bias = rng.vec(p.out_channels);
            let bias = (j % 2 == 0).then_some(&bias[..]);
            let [n, c, oh, ow] = conv2d_output_shape(&p).unwrap();
            let res = rng.vec(n * c * oh * ow);
            let res = (i % 2 == 1).then_some(&res[..]);
            let mut y = vec![f32::NAN; n * c * oh * ow];
            conv2d_winograd(&p, &x, &u, bias, res, &mut y).unwrap();
            let (lin, scale) = conv_ref(&Conv2dParams { activation: Activation::None, ..p }, &x, &w, bias);
            let r = |k: usize| res.map_or(0.0, |r| r[k] as f64);
            let want: Vec<f64> = lin.iter().enumerate().map(|(k, &v)| act_ref(p.activation, v + r(k))).collect();
            let scale: Vec<f64> = scale.iter().enumerate().map(|(k, &s)| s + r(k).abs()).collect();
            assert_close(&format!("winograd {p:?}"), &y, &want, Some(&scale), 1e-5);
            let g = crate::conv::geometry(&p).unwrap();
            let mut z = vec![f32::NAN; y.len()];
            crate::conv::winograd::conv(&p, &g, &x, &w, bias, res, &mut z);
            assert!(y.iter().zip(&z).all(|(a, b)| a.to_bits() == b.to_bits()), "{p:?}: per-call transform differs");
        }
    }
    // No input channels: act(bias).
    let p = Conv2dParams { in_channels: 0, out_channels: 2, in_h: 3, in_w: 3, activation: Activation::Relu, ..base };
    let mut y = vec![f32::NAN; 2 * 9];
    conv2d_winograd(&p, &[], &[], Some(&[1.5, -2.0]), None, &mut y).unwrap();
    assert_eq!(y, [[1.5; 9], [0.0; 9]].concat());
    // Geometries it cannot compute, and operands of the wrong length.
    let x = vec![0.0; 16 * 400];
    let u = vec![0.0; 16 * 16 * 16];
    let mut y = vec![0.0; 16 * 400];
    for q in [Conv2dParams { stride: [2, 2], ..base }, Conv2dParams { dilation: [2, 2], ..base }, Conv2dParams { groups: 2, ..base }, Conv2dParams { kernel: [3, 5], ..base }] {
        let err = conv2d_winograd(&q, &x, &u, None, None, &mut y).unwrap_err().to_string();
        assert!(err.contains("3x3 kernel, stride 1"), "{q:?}: {err}");
    }
    assert!(conv2d_winograd(&base, &x, &u[1..], None, None, &mut y).unwrap_err().to_string().contains("winograd weight"));
    // A padding that would blow the padded planes up far beyond the data.
    let q = Conv2dParams { in_channels: 64, out_channels: 1, in_h: 1, in_w: 1, padding: Padding2d::uniform(300), ..base };
    let [_, _, oh, ow] = conv2d_output_shape(&q).unwrap();
    let mut yq = vec![0.0; oh * ow];
    let err = conv2d_winograd(&q, &[0.0; 64], &vec![0.0; 16 * 64], None, None, &mut yq).unwrap_err().to_string();
    assert!(err.contains("padding"), "{err}");
    assert!(conv2d_winograd(&base, &x[1..], &u, None, None, &mut y).is_err());
    assert!(conv2d_winograd(&base, &x, &u, Some(&[0.0; 15]), None, &mut y).is_err());
    assert!(conv2d_winograd(&base, &x, &u, None, Some(&x[1..]), &mut y).is_err());
}

#[test]
fn conv2d_degenerate() {
    let mut rng = Rng::new(6);
    // Empty batch, and zero input channels (output = act(bias)).
    let p = Conv2dParams { batch: 0, in_channels: 2, out_channels: 3, in_h: 4, in_w: 4, kernel: [3, 3], ..Default::default() };
    conv2d(&p, &[], &rng.vec(3 * 2 * 9), None, &mut []).unwrap();
    let p = Conv2dParams { batch: 1, in_channels: 0, ..p };
    let mut y = vec![f32::NAN; 3 * 2 * 2];
    conv2d(&p, &[], &[], Some(&[1.0, -2.0, 3.0]), &mut y).unwrap();
    assert_eq!(y, [1.0, 1.0, 1.0, 1.0, -2.0, -2.0, -2.0, -2.0, 3.0, 3.0, 3.0, 3.0]);
    // Zero input channels, pointwise.
    let q = Conv2dParams { kernel: [1, 1], in_h: 2, in_w: 3, ..p };
    let mut y = vec![f32::NAN; 3 * 6];
    conv2d(&q, &[], &[], None, &mut y).unwrap();
    assert_eq!(y, [0.0; 18]);
    // Empty input plane with padding: everything reads padding.
    let p = Conv2dParams { in_channels: 2, in_h: 0, in_w: 0, padding: Padding2d::uniform(1), kernel: [2, 2], ..p };
    let mut y = vec![f32::NAN; 3];
    conv2d(&p, &[], &rng.vec(3 * 2 * 4), Some(&[1.0, 2.0, 3.0]), &mut y).unwrap();
    assert_eq!(y, [1.0, 2.0, 3.0]);
}

/// (want, scale) with scale the mean |value| for averages.
pub(crate) fn pool_ref(p: &Pool2dParams, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let pad = p.padding;
    let oh = out_dim(p.in_h, pad.top, pad.bottom, p.kernel[0], p.stride[0], p.dilation[0]).unwrap();
    let ow = out_dim(p.in_w, pad.left, pad.right, p.kernel[1], p.stride[1], p.dilation[1]).unwrap();
    let mut out = Vec::new();
    let mut scale = Vec::new();
    for plane in 0..p.batch * p.channels {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut vals = Vec::new();
                for ky in 0..p.kernel[0] {
                    for kx in 0..p.kernel[1] {
                        let iy = (oy * p.stride[0] + ky * p.dilation[0]) as isize - pad.top as isize;
                        let ix = (ox * p.stride[1] + kx * p.dilation[1]) as isize - pad.left as isize;
                        if iy >= 0 && ix >= 0 && iy < p.in_h as isize && ix < p.in_w as isize {
                            vals.push(x[(plane * p.in_h + iy as usize) * p.in_w + ix as usize] as f64);
                        }
                    }
                }
                scale.push(vals.iter().map(|v| v.abs()).sum::<f64>() / vals.len().max(1) as f64);
                out.push(match p.kind {
                    PoolKind::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    PoolKind::Avg { count_include_pad } => {
                        let sum: f64 = vals.iter().sum();
                        if count_include_pad {
                            sum / (p.kernel[0] * p.kernel[1]) as f64
                        } else if vals.is_empty() {
                            0.0
                        } else {
                            sum / vals.len() as f64
                        }
                    }
                });
            }
        }
    }
    (out, scale)
}

#[test]
fn pool2d_random() {
    let mut rng = Rng::new(7);
    let mut valid = 0;
    for it in 0..400 {
        let p = Pool2dParams {
            batch: rng.range(0, 2).max(it % 2),
            channels: rng.pick(&[1, 3, 4]),
            in_h: rng.pick(&[1, 2, 3, 7, 8, 17]),
            in_w: rng.pick(&[1, 3, 5, 16, 33]),
            kernel: [rng.pick(&[1, 2, 3, 5]), rng.pick(&[1, 2, 3, 4])],
            stride: [rng.range(1, 3), rng.range(1, 3)],
            padding: Padding2d {
                top: rng.range(0, 2),
                left: rng.range(0, 3),
                bottom: rng.range(0, 2),
                right: rng.range(0, 4),
            },
            dilation: [rng.range(1, 2), rng.range(1, 2)],
            kind: match it % 3 {
                0 => PoolKind::Max,
                1 => PoolKind::Avg { count_include_pad: true },
                _ => PoolKind::Avg { count_include_pad: false },
            },
        };
        let pad = p.padding;
        let ok = out_dim(p.in_h, pad.top, pad.bottom, p.kernel[0], p.stride[0], p.dilation[0]).is_some()
            && out_dim(p.in_w, pad.left, pad.right, p.kernel[1], p.stride[1], p.dilation[1]).is_some();
        if !ok {
            assert!(pool2d_output_shape(&p).is_err(), "{p:?}");
            continue;
        }
        valid += 1;
        let x = rng.vec(p.batch * p.channels * p.in_h * p.in_w);
        let [n, c, oh, ow] = pool2d_output_shape(&p).unwrap();
        let mut y = vec![f32::NAN; n * c * oh * ow];
        pool2d(&p, &x, &mut y).unwrap();
        let (want, scale) = pool_ref(&p, &x);
        assert_close(&format!("pool {p:?}"), &y, &want, Some(&scale), 1e-5);
    }
    assert!(valid > 250, "only {valid} valid cases");
}

/// 8-bit max pooling: u8 and i8 bytes give the maxima of the naive
/// reference on their values (a window of padding only: the type's least
/// value), over random geometries and sizes past one task's planes
/// (64 planes of 17x33: several tasks, in parallel); average pooling is
/// refused.
#[test]
fn pool2d_int8_random() {
    let mut rng = Rng::new(11);
    let mut cases = 0;
    for it in 0..300 {
        let p = Pool2dParams {
            batch: 1 + it % 2,
            channels: if it % 10 == 0 { 64 } else { rng.pick(&[1, 3]) },
            in_h: rng.pick(&[1, 2, 3, 7, 17]),
            in_w: rng.pick(&[1, 3, 5, 16, 33]),
            kernel: [rng.pick(&[1, 2, 3]), rng.pick(&[1, 2, 3])],
            stride: [rng.range(1, 3), rng.range(1, 3)],
            padding: Padding2d { top: rng.range(0, 3), left: rng.range(0, 2), bottom: rng.range(0, 2), right: rng.range(0, 3) },
            dilation: [1, rng.range(1, 2)],
            kind: PoolKind::Max,
        };
        let Ok([n, c, oh, ow]) = pool2d_output_shape(&p) else { continue };
        cases += 1;
        let x: Vec<u8> = rng.vec(p.batch * p.channels * p.in_h * p.in_w).iter().map(|v| (v * 127.0 + 128.0) as u8).collect();
        for signed in [false, true] {
            let vals: Vec<f32> = x.iter().map(|&b| if signed { b as i8 as f32 } else { b as f32 }).collect();
            let (want, _) = pool_ref(&p, &vals);
            let least = if signed { -128.0 } else { 0.0 };
            let mut y = vec![0x5au8; n * c * oh * ow];
            pool2d_int8(&p, &x, signed, &mut y).unwrap();
            for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
                let g = if signed { g as i8 as f64 } else { g as f64 };
                assert_eq!(g, w.max(least), "{p:?} signed {signed} [{i}]");
            }
        }
    }
    assert!(cases > 150, "only {cases} valid cases");
    let p = Pool2dParams { kernel: [2, 2], kind: PoolKind::Avg { count_include_pad: false }, in_h: 2, in_w: 2, ..Default::default() };
    assert!(pool2d_int8(&p, &[1; 4], false, &mut [0]).is_err());
}

#[test]
fn pool2d_global_average_and_all_padding_windows() {
    let mut rng = Rng::new(8);
    let x = rng.vec(2 * 3 * 7 * 9);
    let p = Pool2dParams {
        batch: 2,
        channels: 3,
        in_h: 7,
        in_w: 9,
        kernel: [7, 9],
        kind: PoolKind::Avg { count_include_pad: false },
        ..Default::default()
    };
    let mut y = vec![0.0; 6];
    pool2d(&p, &x, &mut y).unwrap();
    let want: Vec<f64> = x.chunks(63).map(|c| c.iter().map(|&v| v as f64).sum::<f64>() / 63.0).collect();
    assert_close("global avg", &y, &want, None, 1e-5);
    // Windows entirely in padding: max gives -inf, avg (excluding pad) 0.
    let p = Pool2dParams { batch: 1, channels: 1, in_h: 1, in_w: 1, kernel: [1, 1], padding: Padding2d { top: 1, ..Default::default() }, ..Default::default() };
    let mut y = [0.0; 2];
    pool2d(&p, &[3.0], &mut y).unwrap();
    assert_eq!(y, [f32::NEG_INFINITY, 3.0]);
    let p = Pool2dParams { kind: PoolKind::Avg { count_include_pad: false }, ..p };
    pool2d(&p, &[3.0], &mut y).unwrap();
    assert_eq!(y, [0.0, 3.0]);
}

/// Short reductions (stems, small convolutions), which the direct path
/// takes on AVX-512 when their rows fill its vectors (the GEMM path the
/// others, and elsewhere): strides 1 and 2 on
/// each axis, odd and even sizes, rows of one vector, one lane past it and
/// several; channel counts that leave a partial block of 8; padding from
/// none to more than the window; 2×2 to 7×7 windows, non-square ones; a
/// batch; row counts that leave 2- and 1-row blocks after the 3-row ones;
/// bias or not, every epilogue (residual, clamp, activations); one and
/// two threads.
#[test]
fn conv2d_short_reductions() {
    let mut rng = Rng::new(23);
    type Case = (usize, usize, usize, usize, [usize; 2], [usize; 2], Padding2d, usize);
    #[rustfmt::skip]
    let cases: [Case; 16] = [
        // (cin, cout, h, w, kernel, stride, padding, batch)
        (3, 16, 32, 32, [3, 3], [1, 1], Padding2d::uniform(1), 2),
        (3, 32, 33, 35, [3, 3], [2, 2], Padding2d::uniform(1), 1),
        (3, 13, 40, 37, [7, 7], [2, 2], Padding2d::uniform(3), 1),
        (16, 16, 16, 16, [3, 3], [1, 1], Padding2d::uniform(1), 2),
        (16, 20, 16, 17, [3, 3], [2, 1], Padding2d { top: 0, left: 1, bottom: 2, right: 1 }, 1),
        (17, 9, 9, 8, [3, 3], [1, 1], Padding2d::uniform(0), 2),
        (5, 8, 20, 30, [5, 5], [1, 2], Padding2d::uniform(2), 1),
        (4, 11, 14, 24, [1, 3], [1, 1], Padding2d { top: 0, left: 1, bottom: 0, right: 1 }, 1),
        (6, 7, 12, 12, [3, 1], [2, 2], Padding2d::uniform(4), 1),
        (2, 24, 18, 19, [2, 2], [2, 2], Padding2d::default(), 2),
        (8, 8, 23, 16, [3, 3], [1, 1], Padding2d::uniform(1), 1),
        (1, 40, 11, 31, [4, 6], [1, 1], Padding2d { top: 2, left: 3, bottom: 1, right: 2 }, 1),
        (3, 16, 64, 64, [3, 3], [2, 2], Padding2d::uniform(1), 2),
        (3, 13, 60, 63, [7, 7], [2, 2], Padding2d::uniform(3), 1),
        (4, 10, 30, 32, [3, 3], [1, 2], Padding2d::uniform(1), 1),
        (5, 9, 33, 16, [3, 3], [2, 1], Padding2d { top: 1, left: 0, bottom: 0, right: 2 }, 1),
    ];
    let acts = [Activation::None, Activation::Relu, Activation::Clip { min: -0.5, max: 0.5 }, Activation::Silu];
    for threads in [1, 2] {
        thread_pool(threads).unwrap().install(|| {
            for (i, &(cin, cout, h, w, kernel, stride, padding, batch)) in cases.iter().enumerate() {
                let p = Conv2dParams {
                    batch,
                    in_channels: cin,
                    in_h: h,
                    in_w: w,
                    out_channels: cout,
                    kernel,
                    stride,
                    padding,
                    activation: acts[i % acts.len()],
                    ..Default::default()
                };
                check_conv(&mut rng, &p, i % 3 != 2);
                super::fused::check_conv_residual(&mut rng, &p, i % 2 == 0, true);
            }
        });
    }
}
