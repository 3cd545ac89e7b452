//! int8 GEMM / conv / (de)quantisation against naive wrapping-int32
//! references; both the AVX2 and the portable path must agree exactly.

use super::Rng;
use crate::qgemm::kernel::{have_avx2, Isa};
use crate::qgemm::{qgemm_impl, QGEMM_MAX_K};
use crate::*;

/// Value distributions of A (u8 domain after mapping) and B.
#[derive(Clone, Copy, Debug)]
enum AKind {
    /// 0..=127: plain.
    Low,
    /// 0..=255: sign.
    Full,
    /// 128..=255: plain on a − 128.
    High,
    /// 0 and 255 alternating: worst case of saturation.
    Extreme,
}

#[derive(Clone, Copy, Debug)]
enum BKind {
    /// |b| ≤ 64.
    Seven,
    /// −127..=127.
    NoMin,
    /// −128..=127 with some −128.
    WithMin,
    /// −128 and 127 only.
    Extreme,
}

fn gen_a(r: &mut Rng, n: usize, kind: AKind, signed: bool) -> Vec<u8> {
    (0..n)
        .map(|i| {
            let u = match kind {
                AKind::Low => r.below(128) as u8,
                AKind::Full => r.below(256) as u8,
                AKind::High => 128 + r.below(128) as u8,
                AKind::Extreme => {
                    if (i + r.below(2)).is_multiple_of(2) {
                        255
                    } else {
                        0
                    }
                }
            };
            if signed {
                u ^ 0x80
            } else {
                u
            }
        })
        .collect()
}

fn gen_b(r: &mut Rng, n: usize, kind: BKind) -> Vec<i8> {
    let mut v: Vec<i8> = (0..n)
        .map(|_| match kind {
            BKind::Seven => (r.below(129) as i32 - 64) as i8,
            BKind::NoMin => (r.below(255) as i32 - 127) as i8,
            BKind::WithMin => r.below(256) as u8 as i8,
            BKind::Extreme => {
                if r.bool() {
                    -128
                } else {
                    127
                }
            }
        })
        .collect();
    if matches!(kind, BKind::WithMin) && !v.is_empty() {
        let i = r.below(v.len());
        v[i] = -128;
    }
    v
}

fn pack(b: &[i8], k: usize, n: usize) -> Vec<u8> {
    let len = rbln_hw::ops::qgemm_packed_b_len(k as u64, n as u64).unwrap() as usize;
    let mut dst = vec![0i8; len];
    rbln_hw::ops::pack_qgemm_b(b, k, n, false, &mut dst);
    dst.into_iter().map(|v| v as u8).collect()
}

/// `Σ_l A[i,l]·B[l,j]` for u8 A `[m × k]` and i8 B `[k × n]`, no zero
/// points (wrapping, as the kernels).
fn product_u8(a: &[u8], b: &[i8], m: usize, n: usize, k: usize) -> Vec<i32> {
    let mut acc = vec![0i32; m * n];
    for i in 0..m {
        for j in 0..n {
            acc[i * n + j] = (0..k).fold(0i32, |s, l| s.wrapping_add(a[i * k + l] as i32 * b[l * n + j] as i32));
        }
    }
    acc
}

fn aval(a: u8, signed: bool) -> i32 {
    if signed {
        a as i8 as i32
    } else {
        a as i32
    }
}

/// Expected output of one accumulator.
enum Want {
    Int(Vec<u8>),
    F32(Vec<f32>),
}

#[derive(Clone, Copy)]
enum OutSpec {
    Int { signed: bool, zero: i32, min: i32, max: i32 },
    F32 { relu: bool },
}

fn finish(acc: &[i32], n: usize, scale: &[f32], spec: OutSpec) -> Want {
    match spec {
        OutSpec::Int { zero, min, max, .. } => Want::Int(
            acc.iter()
                .enumerate()
                .map(|(i, &a)| {
                    let x = (a as f32 * scale[i % n]).round_ties_even() + zero as f32;
                    x.clamp(min as f32, max as f32) as i32 as u8
                })
                .collect(),
        ),
        OutSpec::F32 { relu } => Want::F32(
            acc.iter()
                .enumerate()
                .map(|(i, &a)| {
                    let x = a as f32 * scale[i % n];
                    if relu && (x.is_nan() || x <= 0.0) {
                        0.0
                    } else {
                        x
                    }
                })
                .collect(),
        ),
    }
}

fn run_spec(len: usize, spec: OutSpec, f: impl Fn(QDst<'_>) -> Result<()>) -> Want {
    match spec {
        OutSpec::Int { signed, zero, min, max } => {
            let mut out = vec![0xA5u8; len];
            f(QDst::Int { out: &mut out, signed, zero, min, max }).unwrap();
            Want::Int(out)
        }
        OutSpec::F32 { relu } => {
            let mut out = vec![f32::NAN; len];
            f(QDst::F32 { out: &mut out, relu }).unwrap();
            Want::F32(out)
        }
    }
}

#[track_caller]
fn assert_same(ctx: &str, got: &Want, want: &Want) {
    match (got, want) {
        (Want::Int(g), Want::Int(w)) => {
            if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
                panic!("{ctx}: element {i}: got {}, want {}", g[i], w[i]);
            }
        }
        (Want::F32(g), Want::F32(w)) => {
            if let Some(i) = (0..g.len()).find(|&i| g[i] != w[i]) {
                panic!("{ctx}: element {i}: got {}, want {}", g[i], w[i]);
            }
        }
        _ => unreachable!(),
    }
}

fn rand_spec(r: &mut Rng) -> OutSpec {
    match r.below(4) {
        0 => OutSpec::Int { signed: false, zero: r.below(256) as i32, min: 0, max: 255 },
        1 => {
            let min = r.below(100) as i32 - 128;
            OutSpec::Int { signed: true, zero: r.below(256) as i32 - 128, min, max: min + r.below(128) as i32 }
        }
        2 => OutSpec::F32 { relu: false },
        _ => OutSpec::F32 { relu: true },
    }
}

/// Every instruction set this CPU has, best first.
fn paths() -> Vec<Isa> {
    let mut v = vec![Isa::best()];
    if v[0] == Isa::Amx {
        v.push(Isa::Vnni);
    }
    if have_avx2() && !v.contains(&Isa::Avx2) {
        v.push(Isa::Avx2);
    }
    if v[0] != Isa::Portable {
        v.push(Isa::Portable);
    }
    v
}

#[test]
fn qgemm_matches_reference() {
    let mut r = Rng::new(41);
    let akinds = [AKind::Low, AKind::Full, AKind::High, AKind::Extreme];
    let bkinds = [BKind::Seven, BKind::NoMin, BKind::WithMin, BKind::Extreme];
    for case in 0..400 {
        let m = if case % 7 == 0 { 1 } else { r.range(1, 40) };
        let n = r.pick(&[1, 3, 7, 8, 9, 15, 16, 17, 24, 33, 40]);
        let k = if case % 11 == 0 { r.range(0, 3) } else { r.range(1, 300) };
        let ak = akinds[case % 4];
        let bk = bkinds[(case / 4) % 4];
        let signed = r.bool();
        let a = gen_a(&mut r, m * k, ak, signed);
        let b = gen_b(&mut r, k * n, bk);
        let bp = pack(&b, k, n);
        let (lo, hi) = if signed { (-128, 127) } else { (0, 255) };
        let az = if r.below(4) == 0 { 0 } else { lo + r.below(256) as i32 };
        let zb: Option<Vec<i32>> = r.bool().then(|| (0..n).map(|_| r.below(256) as i32 - 128).collect());
        let bias: Option<Vec<i32>> = r.bool().then(|| (0..n).map(|_| r.below(1 << 20) as i32 - (1 << 19)).collect());
        let scale: Vec<f32> = (0..n).map(|_| r.f32_in(1e-4, 0.05)).collect();
        let spec = rand_spec(&mut r);
        assert!(az <= hi);
        let mut acc = vec![0i32; m * n];
        for i in 0..m {
            for j in 0..n {
                let zbj = zb.as_ref().map_or(0, |z| z[j]);
                let mut s = bias.as_ref().map_or(0, |b| b[j]);
                for l in 0..k {
                    let x = aval(a[i * k + l], signed) - az;
                    s = s.wrapping_add(x.wrapping_mul(b[l * n + j] as i32 - zbj));
                }
                acc[i * n + j] = s;
            }
        }
        let want = finish(&acc, n, &scale, spec);
        let p = QGemmParams { m, n, k, a_zero: az, b: &bp, b_zero: zb.as_deref(), bias: bias.as_deref(), scale: &scale };
        for simd in paths() {
            let got = run_spec(m * n, spec, |mut d| qgemm_impl(QTensor { data: &a, signed }, &p, &mut d, simd));
            assert_same(&format!("case {case} m{m} n{n} k{k} {ak:?} {bk:?} signed {signed} isa {simd:?}"), &got, &want);
        }
    }
}

/// Large enough to run in parallel with several row and column blocks.
#[test]
fn qgemm_large_parallel() {
    let mut r = Rng::new(5);
    for &(m, n, k, ak, bk) in &[
        (300, 200, 700, AKind::Full, BKind::NoMin),
        (97, 130, 1153, AKind::Full, BKind::WithMin),
        (513, 72, 64, AKind::Low, BKind::WithMin),
        (3, 1000, 1280, AKind::Full, BKind::Seven),
    ] {
        let a = gen_a(&mut r, m * k, ak, false);
        let b = gen_b(&mut r, k * n, bk);
        let bp = pack(&b, k, n);
        let scale: Vec<f32> = (0..n).map(|_| r.f32_in(1e-5, 1e-3)).collect();
        let az = 7;
        let mut acc = vec![0i32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0i32;
                for l in 0..k {
                    s = s.wrapping_add((a[i * k + l] as i32 - az) * b[l * n + j] as i32);
                }
                acc[i * n + j] = s;
            }
        }
        let spec = OutSpec::F32 { relu: false };
        let want = finish(&acc, n, &scale, spec);
        let p = QGemmParams { m, n, k, a_zero: az, b: &bp, b_zero: None, bias: None, scale: &scale };
        let got = run_spec(m * n, spec, |d| qgemm(QTensor { data: &a, signed: false }, &p, d));
        assert_same(&format!("{m}x{n}x{k}"), &got, &want);
    }
}

/// A 4-row block with values ≥ 128 next to blocks that are ≤ 127 picks
/// different modes per block; all must agree.
#[test]
fn qgemm_mixed_blocks() {
    let mut r = Rng::new(9);
    let (m, n, k) = (24, 16, 37);
    let mut a = gen_a(&mut r, m * k, AKind::Low, false);
    for v in &mut a[4 * k..8 * k] {
        *v = r.below(256) as u8;
    }
    for v in &mut a[8 * k..12 * k] {
        *v = 128 + r.below(128) as u8;
    }
    for bk in [BKind::NoMin, BKind::WithMin, BKind::Extreme] {
        let b = gen_b(&mut r, k * n, bk);
        let bp = pack(&b, k, n);
        let scale = vec![1.0f32; n];
        let acc = product_u8(&a, &b, m, n, k);
        let spec = OutSpec::F32 { relu: false };
        let want = finish(&acc, n, &scale, spec);
        let p = QGemmParams { m, n, k, a_zero: 0, b: &bp, b_zero: None, bias: None, scale: &scale };
        for simd in paths() {
            let got = run_spec(m * n, spec, |mut d| qgemm_impl(QTensor { data: &a, signed: false }, &p, &mut d, simd));
            assert_same(&format!("{bk:?} isa {simd:?}"), &got, &want);
        }
    }
    if have_avx2() {
        for (i, c) in crate::qgemm::kernel::MODES_SEEN.iter().enumerate() {
            assert!(c.load(core::sync::atomic::Ordering::Relaxed) > 0, "mode {i} never ran");
        }
    }
}

/// The sign mode's extreme pair sums: a = 0 (a' = −128) against b = 127
/// gives two products of −16384 (−32768, the bottom of i16), a = 255
/// against b = −128 the top; rows also hold one 255 / 0 so that the
/// sign mode is picked (some a > 127 and some a < 128).
#[test]
fn qgemm_sign_extremes() {
    let (m, n, k) = (8, 16, 64);
    for (av, bv) in [(0u8, 127i8), (0, -128), (255, -128), (255, 127)] {
        let mut a = vec![av; m * k];
        for i in 0..m {
            a[i * k + k - 1] = 255 - av;
        }
        let b = vec![bv; k * n];
        let bp = pack(&b, k, n);
        let scale = vec![1.0f32; n];
        let acc = product_u8(&a, &b, m, n, k);
        let spec = OutSpec::F32 { relu: false };
        let want = finish(&acc, n, &scale, spec);
        let p = QGemmParams { m, n, k, a_zero: 0, b: &bp, b_zero: None, bias: None, scale: &scale };
        for simd in paths() {
            let got = run_spec(m * n, spec, |mut d| qgemm_impl(QTensor { data: &a, signed: false }, &p, &mut d, simd));
            assert_same(&format!("a {av} b {bv} isa {simd:?}"), &got, &want);
        }
    }
}

fn int(out: &mut [u8]) -> QDst<'_> {
    QDst::Int { out, signed: false, zero: 0, min: 0, max: 255 }
}

#[test]
fn qgemm_rejects_bad_params() {
    let (m, n, k) = (2, 3, 5);
    let a = vec![1u8; m * k];
    let bp = vec![0u8; rbln_hw::ops::qgemm_packed_b_len(k as u64, n as u64).unwrap() as usize];
    let scale = vec![1.0f32; n];
    let ok = QGemmParams { m, n, k, a_zero: 0, b: &bp, b_zero: None, bias: None, scale: &scale };
    let mut out = vec![7u8; m * n];
    let at = QTensor { data: &a, signed: false };
    assert!(qgemm(at, &ok, int(&mut out)).is_ok());
    out.fill(7);
    let bad_scale = [1.0, f32::NAN, 1.0];
    let bz = [0, 200, 0];
    let short = [0i32; 2];
    let cases: Vec<QGemmParams<'_>> = vec![
        QGemmParams { k: 4, ..ok },
        QGemmParams { a_zero: 256, ..ok },
        QGemmParams { a_zero: -1, ..ok },
        QGemmParams { b: &bp[1..], ..ok },
        QGemmParams { scale: &bad_scale, ..ok },
        QGemmParams { scale: &scale[..2], ..ok },
        QGemmParams { b_zero: Some(&bz), ..ok },
        QGemmParams { bias: Some(&short), ..ok },
        QGemmParams { m: usize::MAX, ..ok },
    ];
    for (i, p) in cases.iter().enumerate() {
        assert!(qgemm(at, p, int(&mut out)).is_err(), "case {i}");
        assert!(out.iter().all(|&v| v == 7), "case {i} wrote");
    }
    assert!(qgemm(QTensor { data: &a, signed: true }, &QGemmParams { a_zero: 128, ..ok }, int(&mut out)).is_err());
    assert!(qgemm(at, &ok, QDst::Int { out: &mut out, signed: true, zero: 128, min: -128, max: 127 }).is_err());
    assert!(qgemm(at, &ok, QDst::Int { out: &mut out, signed: false, zero: 0, min: 10, max: 5 }).is_err());
    assert!(qgemm(at, &ok, QDst::Int { out: &mut out, signed: false, zero: 0, min: -1, max: 5 }).is_err());
    assert!(qgemm(at, &ok, QDst::Int { out: &mut out[1..].to_vec(), signed: false, zero: 0, min: 0, max: 255 }).is_err());
    assert!(out.iter().all(|&v| v == 7));
    let big = QGEMM_MAX_K + 1;
    let p = QGemmParams { m: 0, k: big, ..ok };
    assert!(qgemm(QTensor { data: &[], signed: false }, &p, QDst::F32 { out: &mut [], relu: false }).is_err());
    // Empty shapes are fine.
    let p = QGemmParams { m: 0, ..ok };
    assert!(qgemm(QTensor { data: &[], signed: false }, &p, QDst::F32 { out: &mut [], relu: false }).is_ok());
}

/// Naive grouped conv on unpacked weights `[co][c][ky][kx]`.
#[allow(clippy::too_many_arguments)]
fn conv_ref(p: &QConvParams, x: &[u8], signed: bool, xz: i32, w: &[i8], wz: Option<&[i32]>, bias: Option<&[i32]>) -> Vec<i32> {
    let [bn, co, oh, ow] = qconv2d_output_shape(p).unwrap();
    let (cg, og) = (p.in_channels / p.groups, p.out_channels / p.groups);
    let (kh, kw) = (p.kernel[0], p.kernel[1]);
    let mut out = vec![0i32; bn * co * oh * ow];
    for b in 0..bn {
        for o in 0..co {
            let grp = o / og;
            let z = wz.map_or(0, |z| z[o]);
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut s = bias.map_or(0, |b| b[o]);
                    for c in 0..cg {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * p.stride[0] + ky * p.dilation[0]) as isize - p.padding.top as isize;
                                let ix = (ox * p.stride[1] + kx * p.dilation[1]) as isize - p.padding.left as isize;
                                let ci = grp * cg + c;
                                let xv = if iy < 0 || ix < 0 || iy >= p.in_h as isize || ix >= p.in_w as isize {
                                    xz
                                } else {
                                    aval(x[((b * p.in_channels + ci) * p.in_h + iy as usize) * p.in_w + ix as usize], signed)
                                };
                                let wv = w[((o * cg + c) * kh + ky) * kw + kx] as i32;
                                s = s.wrapping_add((xv - xz).wrapping_mul(wv - z));
                            }
                        }
                    }
                    out[((b * co + o) * oh + oy) * ow + ox] = s;
                }
            }
        }
    }
    out
}

/// Packs `[co][c][ky][kx]` weights per group as `[k × og]` B operands.
/// The packed weights of `w` (`[c_out][cin_g·kh·kw]`), in channel quads
/// when `p.channel_quads` (padding channels at the column's zero point of
/// `wz`).
fn pack_conv_w(w: &[i8], p: &QConvParams, wz: Option<&[i32]>) -> Vec<u8> {
    let (cg, og) = (p.in_channels / p.groups, p.out_channels / p.groups);
    let (kh, kw) = (p.kernel[0], p.kernel[1]);
    let k0 = cg * kh * kw;
    let flags = if p.channel_quads { rbln_hw::ops::QCONV_CHANNEL_QUADS } else { 0 };
    let k = rbln_hw::ops::qconv_k(cg as u64, kh as u64, kw as u64, flags).unwrap() as usize;
    let mut out = Vec::new();
    for grp in 0..p.groups {
        // B[l][j] = w[grp·og + j][l]: stored [og × k], i.e. transposed.
        let mut wg = w[grp * og * k0..][..og * k0].to_vec();
        if p.channel_quads {
            let zero: Vec<i8> = (0..og).map(|j| wz.map_or(0, |z| z[grp * og + j] as i8)).collect();
            let mut q = vec![0i8; og * k];
            rbln_hw::ops::qconv_quad_order(&wg, og, cg, kh, kw, &zero, &mut q);
            wg = q;
        }
        let dst = if p.weight_tiles {
            let taps = rbln_hw::ops::qconv_tile_taps(kh as u64, kw as u64, flags) as usize;
            let mut dst = vec![0i8; rbln_hw::ops::qconv_tiled_len(k as u64, og as u64).unwrap() as usize];
            rbln_hw::ops::pack_qconv_tiles(&wg, k, og, taps, &mut dst);
            dst
        } else {
            let mut dst = vec![0i8; rbln_hw::ops::qgemm_packed_b_len(k as u64, og as u64).unwrap() as usize];
            rbln_hw::ops::pack_qgemm_b(&wg, k, og, true, &mut dst);
            dst
        };
        out.extend(dst.into_iter().map(|v| v as u8));
    }
    out
}

/// B's statistics (7-bit or not, column sums) come from a scan split over
/// the threads for large B: one full-range weight pair in the last chunk
/// of otherwise 7-bit weights must still rule out the plain mode, which
/// would saturate against a row of 255s.
#[test]
fn qgemm_parallel_scan_sees_every_chunk() {
    let mut r = Rng::new(17);
    let (m, n, k) = (4, 1000, 1280);
    let mut a = gen_a(&mut r, m * k, AKind::Full, false);
    a[..k].fill(255);
    let mut b = gen_b(&mut r, k * n, BKind::Seven);
    b[(n - 1)..].iter_mut().step_by(n).take(2).for_each(|v| *v = -128);
    let bp = pack(&b, k, n);
    let scale = vec![1e-4f32; n];
    let acc = product_u8(&a, &b, m, n, k);
    let spec = OutSpec::F32 { relu: false };
    let want = finish(&acc, n, &scale, spec);
    let p = QGemmParams { m, n, k, a_zero: 0, b: &bp, b_zero: None, bias: None, scale: &scale };
    for simd in paths() {
        let got = run_spec(m * n, spec, |mut d| qgemm_impl(QTensor { data: &a, signed: false }, &p, &mut d, simd));
        assert_same(&format!("parallel scan isa {simd:?}"), &got, &want);
    }
}

#[test]
fn qconv2d_matches_reference() {
    let mut r = Rng::new(77);
    let akinds = [AKind::Low, AKind::Full, AKind::High, AKind::Extreme];
    let bkinds = [BKind::Seven, BKind::NoMin, BKind::WithMin, BKind::Extreme];
    for case in 0..150 {
        let groups = match case % 4 {
            0 => 1,
            1 => r.range(1, 3),
            _ => 1,
        };
        let depthwise = case % 5 == 3;
        let (cin, cout, groups) = if depthwise {
            let c = r.range(1, 6);
            (c, c * r.range(1, 2), c)
        } else {
            (groups * r.range(1, 5), groups * r.range(1, 20), groups)
        };
        let kern = [r.range(1, 3), r.range(1, 3)];
        let dil = [r.range(1, 2), r.range(1, 2)];
        let stride = [r.range(1, 2), r.range(1, 3)];
        let pad = Padding2d { top: r.range(0, 2), left: r.range(0, 2), bottom: r.range(0, 2), right: r.range(0, 1) };
        let in_h = r.range(dil[0] * (kern[0] - 1) + 1, 12);
        let in_w = r.range(dil[1] * (kern[1] - 1) + 1, 12);
        let p = QConvParams { batch: r.range(1, 2), in_channels: cin, in_h, in_w, out_channels: cout, kernel: kern, stride, padding: pad, dilation: dil, groups, channel_quads: case % 3 == 1, weight_tiles: case % 2 == 1 };
        let [bn, co, oh, ow] = qconv2d_output_shape(&p).unwrap();
        let signed = r.bool();
        let ak = akinds[case % 4];
        let bk = bkinds[(case / 4) % 4];
        let x = gen_a(&mut r, bn * cin * in_h * in_w, ak, signed);
        let k = cin / groups * kern[0] * kern[1];
        let w = gen_b(&mut r, cout * k, bk);
        let (lo, _) = if signed { (-128, 127) } else { (0, 255) };
        let xz = lo + r.below(256) as i32;
        let wz: Option<Vec<i32>> = r.bool().then(|| (0..cout).map(|_| r.below(256) as i32 - 128).collect());
        let wp = pack_conv_w(&w, &p, wz.as_deref());
        let bias: Option<Vec<i32>> = r.bool().then(|| (0..cout).map(|_| r.below(20000) as i32 - 10000).collect());
        let scale: Vec<f32> = (0..cout).map(|_| r.f32_in(1e-3, 0.02)).collect();
        let spec = rand_spec(&mut r);
        let acc = conv_ref(&p, &x, signed, xz, &w, wz.as_deref(), bias.as_deref());
        // Column = channel: scale index is (flat / (oh·ow)) % co.
        let npos = oh * ow;
        let sc_flat: Vec<f32> = (0..acc.len()).map(|i| scale[(i / npos) % co]).collect();
        let want = finish(&acc, acc.len().max(1), &sc_flat, spec);
        for simd in paths() {
            let got = run_spec(acc.len(), spec, |mut d| {
                crate::qgemm::conv_impl(QTensor { data: &x, signed }, xz, &wp, wz.as_deref(), bias.as_deref(), &scale, &p, &mut d, simd)
            });
            assert_same(&format!("case {case} {p:?} {ak:?} {bk:?} signed {signed} isa {simd:?}"), &got, &want);
        }
    }
}

#[test]
fn qconv2d_large_parallel() {
    let mut r = Rng::new(3);
    let x = gen_a(&mut r, 2 * 24 * 30 * 29, AKind::Full, false);
    let w = gen_b(&mut r, 40 * 12 * 9, BKind::WithMin);
    for channel_quads in [false, true] {
        let p = QConvParams { batch: 2, in_channels: 24, in_h: 30, in_w: 29, out_channels: 40, kernel: [3, 3], stride: [1, 1], padding: Padding2d::uniform(1), dilation: [1, 1], groups: 2, channel_quads, weight_tiles: channel_quads };
        let wp = pack_conv_w(&w, &p, None);
        let scale = vec![0.01f32; 40];
        let acc = conv_ref(&p, &x, false, 3, &w, None, None);
        let spec = OutSpec::Int { signed: false, zero: 128, min: 0, max: 255 };
        let want = finish(&acc, acc.len(), &vec![0.01f32; acc.len()], spec);
        let got = run_spec(acc.len(), spec, |d| qconv2d(QTensor { data: &x, signed: false }, 3, &wp, None, None, &scale, &p, d));
        assert_same(&format!("large conv, channel quads {channel_quads}"), &got, &want);
    }
}

/// The shapes of the fast paths: few positions with a long k (packed once,
/// shared by column blocks, k-blocked), 1×1 reading the planes directly,
/// a strided 7×7 stem, each against the reference, on both paths.
#[test]
fn qconv2d_resnet_like_shapes() {
    let mut r = Rng::new(11);
    let cases = [
        // (cin, cout, hw, kernel, stride, pad, signed, A kind)
        (96, 80, 5, 3, 1, 1, true, AKind::Full),
        (64, 48, 7, 3, 1, 1, false, AKind::Full),
        (40, 24, 9, 1, 1, 0, false, AKind::Full),
        (40, 24, 9, 1, 1, 0, false, AKind::Low),
        // 1×1 over many positions: blocks transposed straight from the
        // planes, and (169 = 4·42 + 1) a last block that is not.
        (64, 40, 28, 1, 1, 0, false, AKind::Full),
        (36, 20, 13, 1, 1, 0, false, AKind::Full),
        (3, 16, 30, 7, 2, 3, false, AKind::Full),
        (5, 16, 21, 3, 2, 1, true, AKind::High),
        // Strided 1×1 projections: the stage holds one phase of every
        // other row (odd sizes: the last row and column are read too).
        (64, 40, 15, 1, 2, 0, false, AKind::Full),
        (48, 24, 14, 1, 3, 0, true, AKind::Full),
        // The AMX core's shapes (weights in tiles, 16 quads per tap):
        // stride 2, several runs and blocks, one partial block; few
        // positions (one vector).
        (128, 48, 14, 3, 2, 1, false, AKind::Full),
        (256, 72, 7, 3, 1, 1, true, AKind::Extreme),
        (128, 33, 4, 1, 1, 0, false, AKind::Full),
    ];
    let layouts = [(false, false), (true, false), (false, true), (true, true)];
    for ((cin, cout, hw, kk, s, pad, signed, ak), (channel_quads, weight_tiles)) in cases.iter().flat_map(|&c| layouts.map(|l| (c, l))) {
        let p = QConvParams { batch: 1, in_channels: cin, in_h: hw, in_w: hw, out_channels: cout, kernel: [kk, kk], stride: [s, s], padding: Padding2d::uniform(pad), dilation: [1, 1], groups: 1, channel_quads, weight_tiles };
        let x = gen_a(&mut r, cin * hw * hw, ak, signed);
        let k = cin * kk * kk;
        let w = gen_b(&mut r, cout * k, BKind::NoMin);
        let wp = pack_conv_w(&w, &p, None);
        // (A u8 zero point of 0, the usual one after a ReLU, needs no
        // column sums of the weights; -128 as i8 neither.)
        let xz = match (signed, weight_tiles) {
            (true, true) => -128,
            (true, false) => -5,
            (false, true) => 0,
            (false, false) => 7,
        };
        let bias: Vec<i32> = (0..cout).map(|_| r.below(20000) as i32 - 10000).collect();
        let scale: Vec<f32> = (0..cout).map(|_| r.f32_in(1e-5, 1e-3)).collect();
        let acc = conv_ref(&p, &x, signed, xz, &w, None, Some(&bias));
        let [_, co, oh, ow] = qconv2d_output_shape(&p).unwrap();
        let npos = oh * ow;
        let sc_flat: Vec<f32> = (0..acc.len()).map(|i| scale[(i / npos) % co]).collect();
        for spec in [OutSpec::F32 { relu: false }, OutSpec::Int { signed: false, zero: 128, min: 0, max: 255 }] {
            let want = finish(&acc, acc.len(), &sc_flat, spec);
            for simd in paths() {
                let got = run_spec(acc.len(), spec, |mut d| crate::qgemm::conv_impl(QTensor { data: &x, signed }, xz, &wp, None, Some(&bias), &scale, &p, &mut d, simd));
                assert_same(&format!("{p:?} signed {signed} {ak:?} isa {simd:?}"), &got, &want);
            }
        }
    }
}

/// Weights in tiles with zero points (the AMX core's shape, which leaves
/// them to the VNNI core), against the reference on every path; a tiled
/// operand is measured by the tile layout's length.
#[test]
fn qconv2d_weight_tiles_zero_points_and_length() {
    let mut r = Rng::new(5);
    let p = QConvParams { batch: 2, in_channels: 64, in_h: 9, in_w: 10, out_channels: 20, kernel: [3, 3], stride: [1, 1], padding: Padding2d::uniform(1), dilation: [1, 1], groups: 1, channel_quads: true, weight_tiles: true };
    let x = gen_a(&mut r, 2 * 64 * 90, AKind::Full, false);
    let w = gen_b(&mut r, 20 * 64 * 9, BKind::WithMin);
    let wz: Vec<i32> = (0..20).map(|_| r.below(256) as i32 - 128).collect();
    let wp = pack_conv_w(&w, &p, Some(&wz));
    let scale = vec![0.003f32; 20];
    let acc = conv_ref(&p, &x, false, 9, &w, Some(&wz), None);
    let spec = OutSpec::F32 { relu: false };
    let want = finish(&acc, acc.len(), &vec![0.003f32; acc.len()], spec);
    for simd in paths() {
        let got = run_spec(acc.len(), spec, |mut d| crate::qgemm::conv_impl(QTensor { data: &x, signed: false }, 9, &wp, Some(&wz), None, &scale, &p, &mut d, simd));
        assert_same(&format!("tiles with zero points, isa {simd:?}"), &got, &want);
    }
    // 32 columns (two blocks) × 576: one byte less, or the panels' 24 × 576, is wrong.
    assert_eq!(wp.len(), 32 * 576);
    let mut out = vec![0f32; acc.len()];
    let xt = QTensor { data: &x, signed: false };
    assert!(qconv2d(xt, 9, &wp[1..], None, None, &scale, &p, QDst::F32 { out: &mut out, relu: false }).is_err());
    assert!(qconv2d(xt, 9, &wp[..24 * 576], None, None, &scale, &p, QDst::F32 { out: &mut out, relu: false }).is_err());
    assert!(qconv2d(xt, 9, &wp[..24 * 576], None, None, &scale, &QConvParams { weight_tiles: false, ..p }, QDst::F32 { out: &mut out, relu: false }).is_ok());
}

#[test]
fn qconv2d_rejects_bad_params() {
    let p = QConvParams { batch: 1, in_channels: 4, in_h: 5, in_w: 5, out_channels: 4, kernel: [3, 3], stride: [1, 1], padding: Padding2d::default(), dilation: [1, 1], groups: 2, channel_quads: false, weight_tiles: false };
    let x = vec![0u8; 100];
    let blen = rbln_hw::ops::qgemm_packed_b_len(18, 2).unwrap() as usize;
    let w = vec![0u8; 2 * blen];
    let scale = vec![1.0f32; 4];
    let mut out = vec![0f32; 4 * 9];
    let xt = QTensor { data: &x, signed: false };
    assert!(qconv2d(xt, 0, &w, None, None, &scale, &p, QDst::F32 { out: &mut out, relu: false }).is_ok());
    assert!(qconv2d(xt, 0, &w[1..], None, None, &scale, &p, QDst::F32 { out: &mut out, relu: false }).is_err());
    assert!(qconv2d(xt, 300, &w, None, None, &scale, &p, QDst::F32 { out: &mut out, relu: false }).is_err());
    assert!(qconv2d(xt, 0, &w, None, None, &scale[1..], &p, QDst::F32 { out: &mut out, relu: false }).is_err());
    assert!(qconv2d(QTensor { data: &x[1..], signed: false }, 0, &w, None, None, &scale, &p, QDst::F32 { out: &mut out, relu: false }).is_err());
    assert!(qconv2d(xt, 0, &w, None, None, &scale, &QConvParams { groups: 3, ..p }, QDst::F32 { out: &mut out, relu: false }).is_err());
    assert!(qconv2d(xt, 0, &w, None, None, &scale, &QConvParams { groups: 0, ..p }, QDst::F32 { out: &mut out, relu: false }).is_err());
    assert!(qconv2d(xt, 0, &w, None, None, &scale, &QConvParams { stride: [0, 1], ..p }, QDst::F32 { out: &mut out, relu: false }).is_err());
    assert!(qconv2d(xt, 0, &w, None, None, &scale, &p, QDst::F32 { out: &mut out[1..], relu: false }).is_err());
    assert!(qconv2d_output_shape(&QConvParams { kernel: [9, 1], ..p }).is_err());
}

#[test]
fn quantize_rounds_saturates_and_maps_nan() {
    let x = [0.5f32, 1.5, 2.5, -0.5, -1.5, 1000.0, -1000.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.49];
    let mut out = vec![0u8; x.len()];
    quantize(&x, &mut out, false, 1, 1, x.len(), &[1.0], &[10]).unwrap();
    assert_eq!(out, [10, 12, 12, 10, 8, 255, 0, 10, 255, 0, 10]);
    quantize(&x, &mut out, true, 1, 1, x.len(), &[1.0], &[-3]).unwrap();
    let s: Vec<i8> = out.iter().map(|&v| v as i8).collect();
    assert_eq!(s, [-3, -1, -1, -3, -5, 127, -128, -3, 127, -128, -3]);
    // Per channel: [outer 2, channels 3, inner 2].
    let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let scale = [1.0f32, 2.0, 4.0];
    let zero = [0, 1, 2];
    let mut q = vec![0u8; 12];
    quantize(&x, &mut q, false, 2, 3, 2, &scale, &zero).unwrap();
    for i in 0..12 {
        let c = (i / 2) % 3;
        let want = ((x[i] / scale[c]).round_ties_even() + zero[c] as f32).clamp(0.0, 255.0) as u8;
        assert_eq!(q[i], want, "element {i}");
    }
    let mut back = vec![0f32; 12];
    dequantize(QTensor { data: &q, signed: false }, &mut back, 2, 3, 2, &scale, &zero).unwrap();
    for i in 0..12 {
        let c = (i / 2) % 3;
        assert_eq!(back[i], (q[i] as i32 - zero[c]) as f32 * scale[c]);
    }
    // Large, parallel, signed round trip.
    let mut r = Rng::new(1);
    let n = 200_003;
    let x = r.vec_in(n, -3.0, 3.0);
    let mut q = vec![0u8; n];
    quantize(&x, &mut q, true, 1, 1, n, &[0.02], &[5]).unwrap();
    let mut back = vec![0f32; n];
    dequantize(QTensor { data: &q, signed: true }, &mut back, n, 1, 1, &[0.02], &[5]).unwrap();
    for i in 0..n {
        let want = ((x[i] / 0.02).round_ties_even() + 5.0).clamp(-128.0, 127.0) as i32;
        assert_eq!(q[i] as i8 as i32, want, "element {i}");
        assert_eq!(back[i], (want - 5) as f32 * 0.02);
    }
}

#[test]
fn quantize_rejects_bad_params() {
    let x = [1.0f32; 6];
    let mut out = [9u8; 6];
    assert!(quantize(&x, &mut out, false, 1, 2, 3, &[1.0, 0.0], &[0, 0]).is_err());
    assert!(quantize(&x, &mut out, false, 1, 2, 3, &[1.0, f32::INFINITY], &[0, 0]).is_err());
    assert!(quantize(&x, &mut out, false, 1, 2, 3, &[1.0, -1.0], &[0, 0]).is_err());
    assert!(quantize(&x, &mut out, false, 1, 2, 3, &[1.0, 1.0], &[0, 256]).is_err());
    assert!(quantize(&x, &mut out, true, 1, 2, 3, &[1.0, 1.0], &[0, 128]).is_err());
    assert!(quantize(&x, &mut out, false, 1, 2, 3, &[1.0], &[0]).is_err());
    assert!(quantize(&x, &mut out, false, 2, 2, 3, &[1.0, 1.0], &[0, 0]).is_err());
    assert!(quantize(&x, &mut out[1..], false, 1, 2, 3, &[1.0, 1.0], &[0, 0]).is_err());
    assert!(quantize(&x, &mut out, false, usize::MAX, 2, 3, &[1.0, 1.0], &[0, 0]).is_err());
    assert_eq!(out, [9; 6]);
    let mut f = [7f32; 6];
    assert!(dequantize(QTensor { data: &out, signed: false }, &mut f, 1, 2, 3, &[1.0, f32::NAN], &[0, 0]).is_err());
    assert!(dequantize(QTensor { data: &out, signed: true }, &mut f, 1, 2, 3, &[1.0, 1.0], &[0, 200]).is_err());
    assert!(dequantize(QTensor { data: &out, signed: false }, &mut f[1..], 1, 2, 3, &[1.0, 1.0], &[0, 0]).is_err());
    assert_eq!(f, [7.0; 6]);
}

#[test]
fn qbinary_equals_dequantize_op_quantize() {
    // The composite it replaces: dequantize both, f32 op (+ relu),
    // quantize; bit for bit, over sizes that cross the chunking and the
    // parallel threshold, signed and unsigned mixes.
    let mut r = Rng::new(7);
    for (n, a_signed, b_signed, out_signed) in [(1usize, false, false, false), (300, true, false, true), (1031, false, true, false), (150_001, true, true, true), (140_000, false, true, false)] {
        let bytes = |r: &mut Rng| -> Vec<u8> { r.vec_in(n, 0.0, 256.0).iter().map(|&v| (v as u32).min(255) as u8).collect() };
        let (qa, qb) = (bytes(&mut r), bytes(&mut r));
        let a = QOperand { q: QTensor { data: &qa, signed: a_signed }, scale: 0.037, zero: if a_signed { -5 } else { 130 } };
        let b = QOperand { q: QTensor { data: &qb, signed: b_signed }, scale: 0.011, zero: if b_signed { 3 } else { 7 } };
        for kind in [QBinaryKind::Add, QBinaryKind::Mul] {
            for relu in [false, true] {
                let (os, oz) = if kind == QBinaryKind::Add { (0.05f32, if out_signed { -10 } else { 100 }) } else { (0.003, if out_signed { 0 } else { 128 }) };
                let mut got = vec![0u8; n];
                qbinary(kind, a, b, relu, &mut got, out_signed, os, oz).unwrap();
                let (mut fa, mut fb) = (vec![0f32; n], vec![0f32; n]);
                dequantize(a.q, &mut fa, 1, 1, n, &[a.scale], &[a.zero]).unwrap();
                dequantize(b.q, &mut fb, 1, 1, n, &[b.scale], &[b.zero]).unwrap();
                let y: Vec<f32> = fa
                    .iter()
                    .zip(&fb)
                    .map(|(x, z)| if kind == QBinaryKind::Add { x + z } else { x * z })
                    .map(|v| if relu { v.max(0.0) } else { v })
                    .collect();
                let mut want = vec![0u8; n];
                quantize(&y, &mut want, out_signed, 1, 1, n, &[os], &[oz]).unwrap();
                assert_eq!(got, want, "{kind:?} relu {relu} n {n}");
            }
        }
    }
}

/// Scales that put many results on or next to a rounding tie (sums of
/// multiples of 0.05 over 0.1, products over 0.3, powers of two), a subnormal output
/// scale (no normal reciprocal) and a huge one: still bit for bit the
/// dequantise, op, quantise composite (whose quantise divides).
#[test]
fn qbinary_near_ties_match_the_division() {
    let n = 4099;
    let qa: Vec<u8> = (0..n).map(|i| (i * 7 % 256) as u8).collect();
    let qb: Vec<u8> = (0..n).map(|i| (i * 13 % 251) as u8).collect();
    for (kind, sa, sb, os) in [
        (QBinaryKind::Add, 0.05f32, 0.05f32, 0.1f32),
        (QBinaryKind::Add, 0.1, 0.3, 0.2),
        (QBinaryKind::Mul, 0.1, 0.3, 0.3),
        // Powers of two: exact reciprocal, exact ties.
        (QBinaryKind::Add, 0.0625, 0.03125, 0.125),
        (QBinaryKind::Mul, 0.25, 0.5, 0.0625),
        (QBinaryKind::Add, 0.05, 0.05, 1e-40),
        (QBinaryKind::Mul, 1e30, 1e-5, 1e30),
    ] {
        let a = QOperand { q: QTensor { data: &qa, signed: false }, scale: sa, zero: 0 };
        let b = QOperand { q: QTensor { data: &qb, signed: false }, scale: sb, zero: 0 };
        for relu in [false, true] {
            let mut got = vec![0u8; n];
            qbinary(kind, a, b, relu, &mut got, false, os, 0).unwrap();
            let (mut fa, mut fb) = (vec![0f32; n], vec![0f32; n]);
            dequantize(a.q, &mut fa, 1, 1, n, &[sa], &[0]).unwrap();
            dequantize(b.q, &mut fb, 1, 1, n, &[sb], &[0]).unwrap();
            let y: Vec<f32> = fa.iter().zip(&fb).map(|(x, z)| if kind == QBinaryKind::Add { x + z } else { x * z }).map(|v| if relu { v.max(0.0) } else { v }).collect();
            let mut want = vec![0u8; n];
            quantize(&y, &mut want, false, 1, 1, n, &[os], &[0]).unwrap();
            assert_eq!(got, want, "{kind:?} scales {sa} {sb} -> {os}, relu {relu}");
        }
    }
}

#[test]
fn qbinary_rejects_bad_params() {
    let q = [1u8; 4];
    let t = QTensor { data: &q, signed: false };
    let ok = QOperand { q: t, scale: 1.0, zero: 0 };
    let mut out = [9u8; 4];
    assert!(qbinary(QBinaryKind::Add, QOperand { scale: 0.0, ..ok }, ok, false, &mut out, false, 1.0, 0).is_err());
    assert!(qbinary(QBinaryKind::Add, ok, QOperand { zero: 300, ..ok }, false, &mut out, false, 1.0, 0).is_err());
    assert!(qbinary(QBinaryKind::Add, ok, QOperand { q: QTensor { data: &q[1..], signed: false }, ..ok }, false, &mut out, false, 1.0, 0).is_err());
    assert!(qbinary(QBinaryKind::Add, ok, ok, false, &mut out, true, 1.0, 128).is_err());
    assert!(qbinary(QBinaryKind::Mul, ok, ok, false, &mut out, false, f32::NAN, 0).is_err());
    assert_eq!(out, [9; 4]);
}
