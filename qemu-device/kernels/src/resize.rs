//! Spatial resize (NCHW): nearest or bilinear sampling at source
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
            ResizeMode::Linear => {
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
    let (ty, tx) = (taps(&p.h, p.mode), taps(&p.w, p.mode));
    let (ow, iw) = (p.w.output, p.w.input);
    let planes_per_task = (16_384 / out_plane.max(1)).max(1);
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
                ResizeMode::Linear => {
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
