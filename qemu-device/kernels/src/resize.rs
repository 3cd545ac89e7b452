//! Spatial resize (NCHW): nearest, bilinear or bicubic sampling at source
//! coordinates given by an affine map of the output coordinates.

use crate::error::{KernelError, Result};
use crate::util::{check_len, volume};
use rayon::prelude::*;

/// How a nearest resize rounds a source coordinate (ONNX `nearest_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NearestMode {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
}

/// Sampling of [`resize2d`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ResizeMode {
    Nearest(NearestMode),
    /// Bilinear, with the source coordinate clamped to the input.
    Linear,
    /// Bicubic: Keys' kernel with coefficient `a` over the four inputs
    /// around the source coordinate (ONNX Resize `cubic`; PyTorch's
    /// bicubic is `a = -0.75`). Taps beyond an edge repeat the edge, or
    /// (`exclude_outside`) get weight 0 with the others renormalised.
    Cubic { a: f32, exclude_outside: bool },
}

/// Per output position of one axis: four source indices (clamped into the
/// input) and their weights.
/// Keys' cubic convolution kernel with coefficient `a`, at distance `d`.
#[inline]
pub(crate) fn keys(a: f32, d: f32) -> f32 {
    let d = d.abs();
    if d <= 1.0 {
        ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0
    } else if d < 2.0 {
        ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a
    } else {
        0.0
    }
}

fn cubic_taps(ax: &ResizeAxis, a: f32, exclude_outside: bool) -> Vec<([usize; 4], [f32; 4])> {
    let kernel = |d: f32| keys(a, d);
    let len = ax.input as i64;
    (0..ax.output)
        .map(|o| {
            let src = ax.scale * o as f32 + ax.offset;
            // Far outside the input every tap clamps to an edge; bounding
            // the coordinate keeps the index arithmetic exact.
            let src = src.clamp(-4.0, (len + 4) as f32);
            let base = src.floor();
            let t = src - base;
            let (mut idx, mut ws) = ([0usize; 4], [0.0f32; 4]);
            for k in 0..4 {
                let i = base as i64 + k as i64 - 1;
                let inside = (0..len).contains(&i);
                ws[k] = if exclude_outside && !inside { 0.0 } else { kernel(t + 1.0 - k as f32) };
                idx[k] = i.clamp(0, len - 1) as usize;
            }
            if exclude_outside {
                let sum: f32 = ws.iter().sum();
                if sum != 0.0 {
                    ws.iter_mut().for_each(|w| *w /= sum);
                }
            }
            (idx, ws)
        })
        .collect()
}

/// One spatial axis: output position `o` samples the input at
/// `scale·o + offset`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResizeAxis {
    pub input: usize,
    pub output: usize,
    pub scale: f32,
    pub offset: f32,
}

/// Parameters of [`resize2d`]: input `[batch, channels, h.input,
/// w.input]`, output `[batch, channels, h.output, w.output]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResizeParams {
    pub batch: usize,
    pub channels: usize,
    pub h: ResizeAxis,
    pub w: ResizeAxis,
    pub mode: ResizeMode,
}

/// Per output position of one axis: the two source indices and the
/// weight of the second (nearest: both indices equal, weight 0).
struct Taps {
    i0: Vec<usize>,
    i1: Vec<usize>,
    w1: Vec<f32>,
}

fn taps(a: &ResizeAxis, mode: ResizeMode) -> Taps {
    let last = a.input.saturating_sub(1);
    let mut t = Taps { i0: Vec::with_capacity(a.output), i1: Vec::with_capacity(a.output), w1: Vec::with_capacity(a.output) };
    for o in 0..a.output {
        let s = a.scale * o as f32 + a.offset;
        match mode {
            ResizeMode::Nearest(m) => {
                let r = match m {
                    NearestMode::Floor => s.floor(),
                    NearestMode::Ceil => s.ceil(),
                    // Exactly halfway goes down (up); otherwise to the nearest.
                    NearestMode::RoundPreferFloor => {
                        if s - s.floor() == 0.5 {
                            s.floor()
                        } else {
                            s.round()
                        }
                    }
                    NearestMode::RoundPreferCeil => {
                        if s - s.floor() == 0.5 {
                            s.ceil()
                        } else {
                            s.round()
                        }
                    }
                };
                // `as` saturates (NaN → 0): then clamped into the input.
                let i = (r.max(0.0) as usize).min(last);
                t.i0.push(i);
                t.i1.push(i);
                t.w1.push(0.0);
            }
            // Cubic has its own taps (`cubic_taps`).
            ResizeMode::Linear | ResizeMode::Cubic { .. } => {
                let s = s.clamp(0.0, last as f32);
                let i0 = (s.floor() as usize).min(last);
                let i1 = (i0 + 1).min(last);
                t.i0.push(i0);
                t.i1.push(i1);
                t.w1.push(s - i0 as f32);
            }
        }
    }
    t
}

/// Output shape `[batch, channels, h.output, w.output]`, validating `p`.
pub fn resize2d_output_shape(p: &ResizeParams) -> Result<[usize; 4]> {
    for (what, a) in [("resize height", &p.h), ("resize width", &p.w)] {
        if !(a.scale.is_finite() && a.offset.is_finite()) {
            return Err(KernelError::invalid(what, "the coordinate map is not finite"));
        }
        if a.input == 0 && a.output > 0 {
            return Err(KernelError::invalid(what, "an empty input cannot be resized to a non-empty output"));
        }
    }
    Ok([p.batch, p.channels, p.h.output, p.w.output])
}

/// Resizes every `h × w` plane of `input` into `output`.
pub fn resize2d(p: &ResizeParams, input: &[f32], output: &mut [f32]) -> Result<()> {
    let out_shape = resize2d_output_shape(p)?;
    let in_plane = p.h.input * p.w.input;
    let out_plane = p.h.output * p.w.output;
    check_len("resize input", input.len(), volume("resize input", &[p.batch, p.channels, p.h.input, p.w.input])?)?;
    check_len("resize output", output.len(), volume("resize output", &out_shape)?)?;
    if output.is_empty() {
        return Ok(());
    }
    let (ow, iw) = (p.w.output, p.w.input);
    let planes_per_task = (16_384 / out_plane.max(1)).max(1);
    if let ResizeMode::Cubic { a, exclude_outside } = p.mode {
        let (ty, tx) = (cubic_taps(&p.h, a, exclude_outside), cubic_taps(&p.w, a, exclude_outside));
        // Separable: the four input rows blend into one row, then four
        // taps of that row make each output element.
        output.par_chunks_mut(out_plane).with_min_len(planes_per_task).enumerate().for_each(|(pi, out)| {
            let src = &input[pi * in_plane..][..in_plane];
            let mut blended = vec![0.0f32; iw];
            for ((idx, ws), row) in ty.iter().zip(out.chunks_exact_mut(ow)) {
                blended.fill(0.0);
                for (&i, &w) in idx.iter().zip(ws) {
                    for (b, &v) in blended.iter_mut().zip(&src[i * iw..][..iw]) {
                        *b += w * v;
                    }
                }
                for (o, (xi, xw)) in row.iter_mut().zip(&tx) {
                    *o = xi.iter().zip(xw).map(|(&i, &w)| w * blended[i]).sum();
                }
            }
        });
        return Ok(());
    }
    let (ty, tx) = (taps(&p.h, p.mode), taps(&p.w, p.mode));
    output.par_chunks_mut(out_plane).with_min_len(planes_per_task).enumerate().for_each(|(pi, out)| {
        let src = &input[pi * in_plane..][..in_plane];
        for (oy, row) in out.chunks_exact_mut(ow).enumerate() {
            let (r0, r1) = (&src[ty.i0[oy] * iw..][..iw], &src[ty.i1[oy] * iw..][..iw]);
            match p.mode {
                ResizeMode::Nearest(_) => {
                    for (o, &ix) in row.iter_mut().zip(&tx.i0) {
                        *o = r0[ix];
                    }
                }
                ResizeMode::Linear | ResizeMode::Cubic { .. } => {
                    let wy = ty.w1[oy];
                    for (ox, o) in row.iter_mut().enumerate() {
                        let (x0, x1, wx) = (tx.i0[ox], tx.i1[ox], tx.w1[ox]);
                        let top = r0[x0] + (r0[x1] - r0[x0]) * wx;
                        let bottom = r1[x0] + (r1[x1] - r1[x0]) * wx;
                        *o = top + (bottom - top) * wy;
                    }
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axis(input: usize, output: usize, scale: f32, offset: f32) -> ResizeAxis {
        ResizeAxis { input, output, scale, offset }
    }

    /// f64 reference with the same conventions.
    fn reference(p: &ResizeParams, x: &[f32]) -> Vec<f64> {
        let src = |a: &ResizeAxis, o: usize| a.scale as f64 * o as f64 + a.offset as f64;
        let mut out = Vec::new();
        for pl in 0..p.batch * p.channels {
            let plane = &x[pl * p.h.input * p.w.input..];
            let at = |y: usize, x: usize| plane[y * p.w.input + x] as f64;
            for oy in 0..p.h.output {
                for ox in 0..p.w.output {
                    let (sy, sx) = (src(&p.h, oy), src(&p.w, ox));
                    out.push(match p.mode {
                        ResizeMode::Nearest(m) => {
                            let r = |s: f64| match m {
                                NearestMode::Floor => s.floor(),
                                NearestMode::Ceil => s.ceil(),
                                NearestMode::RoundPreferFloor => (s - 0.5).ceil(),
                                NearestMode::RoundPreferCeil => (s + 0.5).floor(),
                            };
                            let cl = |v: f64, n: usize| v.clamp(0.0, (n - 1) as f64) as usize;
                            at(cl(r(sy), p.h.input), cl(r(sx), p.w.input))
                        }
                        ResizeMode::Linear => {
                            let (sy, sx) = (sy.clamp(0.0, (p.h.input - 1) as f64), sx.clamp(0.0, (p.w.input - 1) as f64));
                            let (y0, x0) = (sy.floor() as usize, sx.floor() as usize);
                            let (y1, x1) = ((y0 + 1).min(p.h.input - 1), (x0 + 1).min(p.w.input - 1));
                            let (wy, wx) = (sy - y0 as f64, sx - x0 as f64);
                            (at(y0, x0) * (1.0 - wx) + at(y0, x1) * wx) * (1.0 - wy) + (at(y1, x0) * (1.0 - wx) + at(y1, x1) * wx) * wy
                        }
                        ResizeMode::Cubic { .. } => unreachable!("cubic_matches_a_direct_sum has its own reference"),
                    });
                }
            }
        }
        out
    }

    #[test]
    fn nearest_and_linear_match_the_reference() {
        let modes = [
            ResizeMode::Linear,
            ResizeMode::Nearest(NearestMode::RoundPreferFloor),
            ResizeMode::Nearest(NearestMode::RoundPreferCeil),
            ResizeMode::Nearest(NearestMode::Floor),
            ResizeMode::Nearest(NearestMode::Ceil),
        ];
        // (in, out, scale, offset): 2x upsampling half_pixel, asymmetric,
        // align_corners, downsampling, a single output.
        let axes = [
            (5, 10, 0.5, -0.25),
            (4, 8, 0.5, 0.0),
            (4, 7, 0.5, 0.0),
            (9, 4, 2.25, 0.625),
            (6, 1, 0.0, 0.0),
        ];
        for mode in modes {
            for &(hi, ho, hs, hb) in &axes {
                for &(wi, wo, ws, wb) in &axes[..3] {
                    let p = ResizeParams { batch: 2, channels: 3, h: axis(hi, ho, hs, hb), w: axis(wi, wo, ws, wb), mode };
                    let x: Vec<f32> = (0..2 * 3 * hi * wi).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.25).collect();
                    let mut y = vec![f32::NAN; 2 * 3 * ho * wo];
                    resize2d(&p, &x, &mut y).unwrap();
                    let want = reference(&p, &x);
                    for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
                        assert!((g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()), "{mode:?} {p:?} [{i}]: {g} vs {w}");
                    }
                }
            }
        }
    }

    /// Bicubic against a direct (non-separable) f64 sum over the 4×4
    /// neighbourhood, with edge repetition and with excluded outside taps.
    #[test]
    fn cubic_matches_a_direct_sum() {
        fn keys(a: f64, d: f64) -> f64 {
            let d = d.abs();
            if d <= 1.0 {
                ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0
            } else if d < 2.0 {
                ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a
            } else {
                0.0
            }
        }
        // (index, weight) pairs of one axis at source coordinate `s`.
        fn taps1(s: f64, len: usize, a: f64, exclude: bool) -> Vec<(usize, f64)> {
            let base = s.floor();
            let mut t: Vec<(usize, f64)> = (0..4)
                .filter_map(|k| {
                    let i = base as i64 + k - 1;
                    let inside = i >= 0 && i < len as i64;
                    (inside || !exclude).then(|| (i.clamp(0, len as i64 - 1) as usize, keys(a, s - i as f64)))
                })
                .collect();
            if exclude {
                let sum: f64 = t.iter().map(|p| p.1).sum();
                t.iter_mut().for_each(|p| p.1 /= sum);
            }
            t
        }
        for (a, exclude) in [(-0.75f32, false), (-0.5, false), (-0.75, true)] {
            for &(hi, ho, hs, hb) in &[(5usize, 10usize, 0.5f32, -0.25f32), (7, 3, 7.0 / 3.0, 0.666_666_7), (4, 7, 0.5, 0.0), (1, 3, 1.0 / 3.0, -1.0 / 3.0)] {
                for &(wi, wo, ws, wb) in &[(6usize, 12usize, 0.5f32, -0.25f32), (9, 4, 2.25, 0.625)] {
                    let p = ResizeParams { batch: 1, channels: 2, h: axis(hi, ho, hs, hb), w: axis(wi, wo, ws, wb), mode: ResizeMode::Cubic { a, exclude_outside: exclude } };
                    let x: Vec<f32> = (0..2 * hi * wi).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.25).collect();
                    let mut y = vec![f32::NAN; 2 * ho * wo];
                    resize2d(&p, &x, &mut y).unwrap();
                    for c in 0..2 {
                        for oy in 0..ho {
                            for ox in 0..wo {
                                let ty = taps1(hs as f64 * oy as f64 + hb as f64, hi, a as f64, exclude);
                                let tx = taps1(ws as f64 * ox as f64 + wb as f64, wi, a as f64, exclude);
                                let want: f64 = ty.iter().flat_map(|&(iy, wy)| tx.iter().map(move |&(ix, wx)| (iy, ix, wy * wx))).map(|(iy, ix, w)| w * x[(c * hi + iy) * wi + ix] as f64).sum();
                                let got = y[(c * ho + oy) * wo + ox] as f64;
                                assert!((got - want).abs() <= 2e-5 * (1.0 + want.abs()), "{p:?} [{c},{oy},{ox}]: {got} vs {want}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bad_parameters_are_errors_and_write_nothing() {
        let ok = ResizeParams { batch: 1, channels: 1, h: axis(2, 4, 0.5, 0.0), w: axis(2, 4, 0.5, 0.0), mode: ResizeMode::Linear };
        let x = [1.0f32; 4];
        let mut y = [7.0f32; 16];
        assert!(resize2d(&ResizeParams { h: axis(2, 4, f32::NAN, 0.0), ..ok }, &x, &mut y).is_err());
        assert!(resize2d(&ResizeParams { w: axis(0, 4, 1.0, 0.0), ..ok }, &[], &mut y).is_err());
        assert!(resize2d(&ok, &x[..3], &mut y).is_err());
        assert!(resize2d(&ok, &x, &mut y[..15]).is_err());
        assert!(y.iter().all(|&v| v == 7.0));
        // Huge or negative coordinates clamp into the input.
        let far = ResizeParams { h: axis(2, 4, 1e30, -1e30), mode: ResizeMode::Nearest(NearestMode::Floor), ..ok };
        resize2d(&far, &[1.0, 2.0, 3.0, 4.0], &mut y).unwrap();
        assert!(y.iter().all(|v| [1.0, 2.0, 3.0, 4.0].contains(v)));
    }
}
