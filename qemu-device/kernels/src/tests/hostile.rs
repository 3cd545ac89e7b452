//! Hostile parameters must produce errors, never panics, and leave the
//! output untouched.

use crate::*;

const BIG: usize = usize::MAX / 2 + 3;

macro_rules! assert_err {
    ($pat:pat, $e:expr) => {{
        let r = $e;
        assert!(matches!(r, Err($pat)), "{} => {:?}", stringify!($e), r);
        // The message names the problem.
        assert!(!r.unwrap_err().to_string().is_empty());
    }};
}

#[test]
fn gemm_hostile() {
    let p = GemmParams { m: 2, n: 3, k: 4, ..Default::default() };
    let (a, b, mut c) = (vec![1.0; 8], vec![1.0; 12], vec![9.0; 6]);
    assert_err!(KernelError::LengthMismatch { what: "gemm A", .. }, gemm(&p, &a[..7], &b, None, &mut c));
    assert_err!(KernelError::LengthMismatch { what: "gemm B", .. }, gemm(&p, &a, &b[..11], None, &mut c));
    assert_err!(KernelError::LengthMismatch { what: "gemm C", .. }, gemm(&p, &a, &b, None, &mut c[..5]));
    assert_err!(KernelError::LengthMismatch { what: "gemm bias", .. }, gemm(&p, &a, &b, Some(&[0.0; 2]), &mut c));
    assert_eq!(c, [9.0; 6]);
    let p = GemmParams { m: BIG, n: 1, k: 2, ..Default::default() };
    assert_err!(KernelError::Overflow { .. }, gemm(&p, &a, &b, None, &mut c));
    let p = GemmParams { m: usize::MAX, n: usize::MAX, k: 0, ..Default::default() };
    assert_err!(KernelError::Overflow { .. }, gemm(&p, &[], &[], None, &mut c));
    // Huge m with k = 0 and n = 0: consistent but C would overflow? No: 0.
    let p = GemmParams { m: usize::MAX, n: 0, k: 0, ..Default::default() };
    gemm(&p, &[], &[], None, &mut []).unwrap();
    // A packed B holds whole 16-column panels (k·16 here, not k·n), and
    // cannot be transposed as well.
    let p = GemmParams { m: 2, n: 3, k: 4, b_packed: true, ..Default::default() };
    let mut c = vec![9.0; 6];
    assert_err!(KernelError::LengthMismatch { what: "gemm B (packed)", .. }, gemm(&p, &a, &b, None, &mut c));
    assert_err!(KernelError::InvalidParam { .. }, gemm(&GemmParams { trans_b: true, ..p }, &a, &[1.0; 64], None, &mut c));
    assert_eq!(c, [9.0; 6]);
    gemm(&p, &a, &[1.0; 64], None, &mut c).unwrap();
    assert_eq!(c, [4.0; 6]);
    let p = GemmParams { m: 1, n: usize::MAX, k: 2, b_packed: true, ..Default::default() };
    assert_err!(KernelError::Overflow { .. }, gemm(&p, &a[..2], &b, None, &mut c));
}

fn conv_base() -> Conv2dParams {
    Conv2dParams {
        batch: 1,
        in_channels: 4,
        in_h: 5,
        in_w: 5,
        out_channels: 4,
        kernel: [3, 3],
        ..Default::default()
    }
}

#[test]
fn conv2d_hostile() {
    let x = vec![1.0; 100];
    let w = vec![1.0; 4 * 4 * 9];
    let mut y = vec![7.0; 4 * 9];
    let b = conv_base();
    conv2d(&b, &x, &w, None, &mut y).unwrap();
    y.fill(7.0);
    let bad = [
        Conv2dParams { stride: [0, 1], ..b },
        Conv2dParams { stride: [1, 0], ..b },
        Conv2dParams { dilation: [0, 1], ..b },
        Conv2dParams { kernel: [0, 3], ..b },
        Conv2dParams { groups: 0, ..b },
        Conv2dParams { groups: 3, ..b },
        Conv2dParams { out_channels: 6, groups: 4, ..b },
        Conv2dParams { kernel: [6, 3], ..b },
        Conv2dParams { dilation: [1, 3], ..b },
        Conv2dParams { padding: Padding2d { top: usize::MAX, ..Default::default() }, ..b },
        Conv2dParams { padding: Padding2d { left: BIG, right: BIG, ..Default::default() }, ..b },
        Conv2dParams { padding: Padding2d::uniform(usize::MAX / 4), ..b },
        Conv2dParams { dilation: [usize::MAX, 1], ..b },
        Conv2dParams { batch: BIG, ..b },
        Conv2dParams { in_channels: usize::MAX - 3, groups: 1, ..b },
        Conv2dParams { in_h: usize::MAX, in_w: 2, ..b },
        Conv2dParams { out_channels: usize::MAX, groups: 1, ..b },
        Conv2dParams { batch: 2, ..b },
        Conv2dParams { in_channels: 8, groups: 2, ..b },
    ];
    for p in bad {
        let r = conv2d(&p, &x, &w, None, &mut y);
        assert!(r.is_err(), "{p:?}");
        assert!(!r.unwrap_err().to_string().is_empty());
    }
    assert_err!(KernelError::LengthMismatch { what: "conv2d bias", .. }, conv2d(&b, &x, &w, Some(&[0.0; 3]), &mut y));
    assert_err!(KernelError::LengthMismatch { what: "conv2d output", .. }, conv2d(&b, &x, &w, None, &mut y[..35]));
    assert_err!(KernelError::LengthMismatch { what: "conv2d weight", .. }, conv2d(&b, &x, &w[1..], None, &mut y));
    assert!(y.iter().all(|&v| v == 7.0));
}

#[test]
fn pool2d_hostile() {
    let b = Pool2dParams { channels: 2, in_h: 4, in_w: 4, kernel: [2, 2], stride: [2, 2], ..Default::default() };
    let x = vec![1.0; 32];
    let mut y = vec![5.0; 8];
    pool2d(&b, &x, &mut y).unwrap();
    y.fill(5.0);
    let bad = [
        Pool2dParams { stride: [0, 2], ..b },
        Pool2dParams { kernel: [2, 0], ..b },
        Pool2dParams { dilation: [1, 0], ..b },
        Pool2dParams { kernel: [5, 2], ..b },
        Pool2dParams { padding: Padding2d { bottom: usize::MAX, ..Default::default() }, ..b },
        Pool2dParams { kernel: [usize::MAX, 2], padding: Padding2d::uniform(usize::MAX / 2), ..b },
        Pool2dParams { channels: usize::MAX, ..b },
        Pool2dParams { batch: 3, ..b },
    ];
    for p in bad {
        assert!(pool2d(&p, &x, &mut y).is_err(), "{p:?}");
    }
    assert_err!(KernelError::LengthMismatch { .. }, pool2d(&b, &x, &mut y[..7]));
    assert!(y.iter().all(|&v| v == 5.0));
}

#[test]
fn elementwise_hostile() {
    let mut y = vec![0.0; 6];
    assert_err!(KernelError::Broadcast { .. }, binary(BinaryOp::Add, &[0.0; 6], &[2, 3], &[0.0; 2], &[2], &mut y));
    assert_err!(KernelError::RankTooLarge { .. }, binary(BinaryOp::Add, &[0.0], &[1; 7], &[0.0], &[1], &mut y[..1]));
    assert_err!(KernelError::LengthMismatch { .. }, binary(BinaryOp::Add, &[0.0; 5], &[2, 3], &[0.0], &[], &mut y));
    assert_err!(KernelError::LengthMismatch { .. }, binary(BinaryOp::Add, &[0.0; 6], &[2, 3], &[0.0], &[], &mut y[..5]));
    assert_err!(
        KernelError::Overflow { .. },
        binary(BinaryOp::Mul, &[0.0], &[usize::MAX, 2, 1], &[0.0], &[1, 1, 3], &mut y)
    );
    assert_err!(
        KernelError::Overflow { .. },
        binary(BinaryOp::Mul, &[0.0], &[1, 1 << 40], &[0.0], &[1 << 40, 1], &mut y)
    );
    // Softmax / reduce / layer_norm.
    assert_err!(KernelError::AxisOutOfRange { .. }, softmax(&[2, 3], 2, &[0.0; 6], &mut y));
    assert_err!(KernelError::AxisOutOfRange { .. }, softmax(&[2, 3], -3, &[0.0; 6], &mut y));
    assert_err!(KernelError::AxisOutOfRange { .. }, softmax(&[2, 3], isize::MIN, &[0.0; 6], &mut y));
    assert_err!(KernelError::AxisOutOfRange { .. }, softmax(&[], 0, &[0.0], &mut y[..1]));
    assert_err!(KernelError::RankTooLarge { .. }, softmax(&[1; 7], 0, &[0.0], &mut y[..1]));
    assert_err!(KernelError::LengthMismatch { .. }, softmax(&[2, 3], 1, &[0.0; 6], &mut y[..4]));
    assert_err!(KernelError::Overflow { .. }, softmax(&[usize::MAX, 3], 1, &[0.0; 6], &mut y));
    assert_err!(KernelError::AxisOutOfRange { .. }, reduce(ReduceOp::Sum, &[2, 3], 5, &[0.0; 6], &mut y));
    assert_err!(KernelError::LengthMismatch { .. }, reduce(ReduceOp::Sum, &[2, 3], 1, &[0.0; 6], &mut y));
    assert_err!(
        KernelError::Overflow { .. },
        reduce(ReduceOp::Max, &[usize::MAX, 0, usize::MAX], 1, &[], &mut y)
    );
    assert_err!(KernelError::InvalidParam { .. }, layer_norm(&[0.0; 6], 0, None, None, 1e-5, &mut y));
    assert_err!(KernelError::InvalidParam { .. }, layer_norm(&[0.0; 6], 4, None, None, 1e-5, &mut y));
    assert_err!(KernelError::InvalidParam { .. }, layer_norm(&[0.0; 6], 3, None, None, f32::NAN, &mut y));
    assert_err!(KernelError::InvalidParam { .. }, layer_norm(&[0.0; 6], 3, None, None, -1.0, &mut y));
    assert_err!(KernelError::LengthMismatch { .. }, layer_norm(&[0.0; 6], 3, Some(&[1.0; 2]), None, 0.0, &mut y));
    assert_err!(KernelError::LengthMismatch { .. }, layer_norm(&[0.0; 6], 3, None, Some(&[1.0; 4]), 0.0, &mut y));
    assert_err!(KernelError::LengthMismatch { .. }, layer_norm(&[0.0; 6], 3, None, None, 0.0, &mut y[..3]));
    assert!(y.iter().all(|&v| v == 0.0));
    // eps = 0 on constant rows gives NaN, not a panic.
    layer_norm(&[1.0; 6], 3, None, None, 0.0, &mut y).unwrap();
    assert!(y.iter().all(|v| v.is_nan()));
}

#[test]
fn copy_hostile() {
    let src = vec![1.0; 16];
    let mut dst = vec![0.0; 16];
    let base = StridedCopy { sizes: &[4, 4], src_offset: 0, src_strides: &[4, 1], dst_offset: 0, dst_strides: &[1, 4] };
    strided_copy(&base, &src, &mut dst).unwrap();
    dst.fill(0.0);
    let cases: Vec<StridedCopy<'_>> = vec![
        StridedCopy { src_offset: 1, ..base },
        StridedCopy { dst_offset: 1, ..base },
        StridedCopy { src_strides: &[4, -1], ..base },
        StridedCopy { dst_strides: &[-1, 4], ..base },
        StridedCopy { src_strides: &[5, 1], ..base },
        StridedCopy { src_strides: &[4], ..base },
        StridedCopy { dst_strides: &[1, 4, 1], ..base },
        StridedCopy { sizes: &[4, 4, 1, 1, 1, 1, 1], src_strides: &[0; 7], dst_strides: &[0; 7], ..base },
        StridedCopy { sizes: &[usize::MAX, 2], src_strides: &[isize::MAX, isize::MAX], ..base },
        StridedCopy { sizes: &[usize::MAX, usize::MAX], src_strides: &[0, 0], dst_strides: &[0, 0], ..base },
        StridedCopy { sizes: &[usize::MAX], src_strides: &[isize::MIN], dst_strides: &[1], ..base },
        StridedCopy { sizes: &[17], src_strides: &[0], dst_strides: &[0], ..base },
        StridedCopy { src_offset: usize::MAX, ..base },
    ];
    for p in &cases {
        let r = strided_copy(p, &src, &mut dst);
        assert!(r.is_err(), "{p:?}");
    }
    assert!(dst.iter().all(|&v| v == 0.0));
    // Zero-sized copies touch nothing, whatever the offsets.
    strided_copy(&StridedCopy { sizes: &[0, 4], src_offset: 99, ..base }, &src, &mut dst).unwrap();
    // Overlapping destination: sequential, last write wins.
    let mut d = [0.0f32; 2];
    strided_copy(
        &StridedCopy { sizes: &[2], src_offset: 0, src_strides: &[1], dst_offset: 1, dst_strides: &[0] },
        &[3.0, 4.0],
        &mut d,
    )
    .unwrap();
    assert_eq!(d, [0.0, 4.0]);

    let x = vec![0.0; 6];
    let mut y = vec![0.0; 6];
    for perm in [&[0, 0][..], &[0, 2], &[1], &[0, 1, 2], &[usize::MAX, 0]] {
        assert_err!(KernelError::InvalidParam { .. }, permute(&[2, 3], perm, &x, &mut y));
    }
    assert_err!(KernelError::LengthMismatch { .. }, permute(&[2, 3], &[1, 0], &x, &mut y[..5]));
    assert_err!(KernelError::Overflow { .. }, permute(&[usize::MAX, 3], &[1, 0], &x, &mut y));
    assert_err!(KernelError::RankTooLarge { .. }, permute(&[1; 7], &[0, 1, 2, 3, 4, 5, 6], &x[..1], &mut y[..1]));
}

#[test]
fn gather_hostile() {
    let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let mut y = vec![-1.0; 8];
    gather(&data, &[3, 4], 0, &[-3i64, 2], &[2], &mut y).unwrap();
    assert_eq!(y, [0.0, 1.0, 2.0, 3.0, 8.0, 9.0, 10.0, 11.0]);
    y.fill(-1.0);
    for idx in [3i64, -4, i64::MIN, i64::MAX] {
        let r = gather(&data, &[3, 4], 0, &[0, idx], &[2], &mut y);
        assert_eq!(r, Err(KernelError::IndexOutOfRange { index: idx, position: 1, size: 3 }));
    }
    assert_err!(KernelError::IndexOutOfRange { .. }, gather(&data, &[3, 4], 1, &[i32::MIN], &[1], &mut y[..3]));
    assert_err!(KernelError::AxisOutOfRange { .. }, gather(&data, &[3, 4], 2, &[0i64], &[1], &mut y[..3]));
    assert_err!(KernelError::AxisOutOfRange { .. }, gather(&data, &[], 0, &[0i64], &[], &mut y[..1]));
    assert_err!(KernelError::LengthMismatch { .. }, gather(&data[..11], &[3, 4], 0, &[0i64], &[1], &mut y[..4]));
    assert_err!(KernelError::LengthMismatch { .. }, gather(&data, &[3, 4], 0, &[0i64, 1], &[1], &mut y[..4]));
    assert_err!(KernelError::LengthMismatch { .. }, gather(&data, &[3, 4], 0, &[0i64], &[1], &mut y[..5]));
    assert_err!(KernelError::RankTooLarge { .. }, gather(&data, &[3, 4], 0, &[0i64], &[1; 7], &mut y[..4]));
    assert_err!(
        KernelError::Overflow { .. },
        gather(&[], &[0, usize::MAX], 0, &[0i64, 0], &[2], &mut y)
    );
    assert!(y.iter().all(|&v| v == -1.0));
    gather(&data, &[3, 4], 0, &[] as &[i64], &[usize::MAX, 0, usize::MAX], &mut []).unwrap();
    // Empty axis with no indices is fine; with indices it is out of range.
    gather(&[], &[2, 0], 1, &[] as &[i64], &[0], &mut []).unwrap();
    assert_err!(KernelError::IndexOutOfRange { .. }, gather(&[], &[2, 0], 1, &[0i64], &[1], &mut y[..2]));
}

#[test]
fn unary_hostile() {
    let mut y = [0.0; 3];
    assert_err!(KernelError::LengthMismatch { .. }, unary(UnaryOp::Exp, &[1.0; 4], &mut y));
    assert!(thread_pool(1).is_ok());
}

/// Random mixes of nasty values: every call must return (Ok or Err) without
/// panicking. Slices get the exact implied length when that is small, so
/// both the validation and the compute paths are exercised.
#[test]
fn fuzz_no_panic() {
    use super::Rng;
    const NASTY: &[usize] = &[
        0,
        1,
        2,
        3,
        5,
        usize::MAX,
        usize::MAX - 1,
        usize::MAX / 2,
        usize::MAX / 2 + 1,
        1 << 32,
        (1 << 31) + 1,
        isize::MAX as usize,
    ];
    let mut rng = Rng::new(99);
    let val = |rng: &mut Rng| if rng.below(3) == 0 { rng.pick(NASTY) } else { rng.range(0, 6) };
    let buf = |n: Option<usize>, rng: &mut Rng| -> Vec<f32> {
        match n {
            Some(n) if n <= 4096 && rng.below(8) != 0 => vec![0.5; n],
            _ => vec![0.5; rng.range(0, 16)],
        }
    };
    let prod = |xs: &[usize]| xs.iter().try_fold(1usize, |a, &b| a.checked_mul(b));
    let mut oks = 0;
    for _ in 0..20_000 {
        // conv2d
        let p = Conv2dParams {
            batch: val(&mut rng),
            in_channels: val(&mut rng),
            in_h: val(&mut rng),
            in_w: val(&mut rng),
            out_channels: val(&mut rng),
            kernel: [val(&mut rng), val(&mut rng)],
            stride: [val(&mut rng), val(&mut rng)],
            padding: Padding2d { top: val(&mut rng), left: val(&mut rng), bottom: val(&mut rng), right: val(&mut rng) },
            dilation: [val(&mut rng), val(&mut rng)],
            groups: val(&mut rng),
            activation: Activation::Gelu,
        };
        let x = buf(prod(&[p.batch, p.in_channels, p.in_h, p.in_w]), &mut rng);
        let w = buf(
            p.in_channels.checked_div(p.groups).and_then(|c| prod(&[p.out_channels, c, p.kernel[0], p.kernel[1]])),
            &mut rng,
        );
        let mut y = buf(conv2d_output_shape(&p).ok().and_then(|s| prod(&s)), &mut rng);
        let bias = buf(Some(p.out_channels), &mut rng);
        oks += conv2d(&p, &x, &w, Some(&bias), &mut y).is_ok() as usize;
        let res = buf(Some(y.len()), &mut rng);
        oks += conv2d_residual(&p, &x, &w, Some(&bias), Some(&res), &mut y).is_ok() as usize;
        // pool2d
        let q = Pool2dParams {
            batch: p.batch,
            channels: p.in_channels,
            in_h: p.in_h,
            in_w: p.in_w,
            kernel: p.kernel,
            stride: p.stride,
            padding: p.padding,
            dilation: p.dilation,
            kind: PoolKind::Avg { count_include_pad: rng.bool() },
        };
        let mut y = buf(pool2d_output_shape(&q).ok().and_then(|s| prod(&s)), &mut rng);
        oks += pool2d(&q, &x, &mut y).is_ok() as usize;
        // gemm
        let g = GemmParams { m: val(&mut rng), n: val(&mut rng), k: val(&mut rng), trans_a: rng.bool(), ..Default::default() };
        let a = buf(prod(&[g.m, g.k]), &mut rng);
        let b = buf(prod(&[g.k, g.n]), &mut rng);
        let mut c = buf(prod(&[g.m, g.n]), &mut rng);
        oks += gemm(&g, &a, &b, None, &mut c).is_ok() as usize;
        let res = buf(Some(c.len()), &mut rng);
        oks += gemm_residual(&g, &a, &b, None, Some(&res), &mut c).is_ok() as usize;
        // shape-generic kernels
        let shape: Vec<usize> = (0..rng.range(0, 7)).map(|_| val(&mut rng)).collect();
        let shape2: Vec<usize> = (0..rng.range(0, 7)).map(|_| val(&mut rng)).collect();
        let x = buf(prod(&shape), &mut rng);
        let x2 = buf(prod(&shape2), &mut rng);
        let mut y = buf(broadcast_shape(&shape, &shape2).ok().and_then(|s| prod(&s)), &mut rng);
        oks += binary(BinaryOp::Pow, &x, &shape, &x2, &shape2, &mut y).is_ok() as usize;
        oks += binary_act(BinaryOp::Add, &x, &shape, &x2, &shape2, Activation::Silu, &mut y).is_ok() as usize;
        oks += binary(BinaryOp::LessOrEqual, &x, &shape, &x2, &shape2, &mut y).is_ok() as usize;
        let shape3: Vec<usize> = (0..rng.range(0, 7)).map(|_| val(&mut rng)).collect();
        let x3 = buf(prod(&shape3), &mut rng);
        let mut y = buf(broadcast_shape3(&shape, &shape2, &shape3).ok().and_then(|s| prod(&s)), &mut rng);
        oks += where_select(&x, &shape, &x2, &shape2, &x3, &shape3, &mut y).is_ok() as usize;
        let axis = rng.range(0, 8) as isize - 4;
        let mut y = buf(prod(&shape), &mut rng);
        oks += softmax(&shape, axis, &x, &mut y).is_ok() as usize;
        let mut y = buf(prod(&shape).map(|n| n / shape.get(axis.rem_euclid(7) as usize).copied().unwrap_or(1).max(1)), &mut rng);
        oks += reduce(ReduceOp::Mean, &shape, axis, &x, &mut y).is_ok() as usize;
        let mut perm: Vec<usize> = (0..shape.len()).rev().collect();
        if !perm.is_empty() && rng.below(4) == 0 {
            perm[0] = val(&mut rng);
        }
        let mut y = buf(prod(&shape), &mut rng);
        oks += permute(&shape, &perm, &x, &mut y).is_ok() as usize;
        let idx: Vec<i64> = (0..rng.range(0, 4)).map(|_| (val(&mut rng) as i64).wrapping_sub(2)).collect();
        let mut y = buf(gather_output_shape(&shape, axis, &[idx.len()]).ok().and_then(|s| prod(&s)), &mut rng);
        oks += gather(&x, &shape, axis, &idx, &[idx.len()], &mut y).is_ok() as usize;
        let strides: Vec<isize> = shape.iter().map(|_| val(&mut rng) as isize).collect();
        let dst_strides: Vec<isize> = shape.iter().map(|_| (val(&mut rng) as isize).wrapping_neg()).collect();
        let mut y = buf(None, &mut rng);
        let sc = StridedCopy {
            sizes: &shape,
            src_offset: val(&mut rng),
            src_strides: &strides,
            dst_offset: val(&mut rng),
            dst_strides: &dst_strides,
        };
        oks += strided_copy(&sc, &x, &mut y).is_ok() as usize;
    }
    // Some calls got through validation and computed.
    assert!(oks > 5000, "{oks}");
}
