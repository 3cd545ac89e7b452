//! Grid sampling (NCHW): every output element samples its input plane at
//! a normalised position read from a grid, with nearest, bilinear or
//! bicubic interpolation and zero, edge or reflected padding, as ONNX
//! GridSample and PyTorch's `F.grid_sample` define it on 4-D tensors.
//!
//! Padding applies per tap, as onnxruntime does: a tap outside the input
//! reads 0 (zeros), the nearest edge element (border), or the element at
//! the tap reflected at the borders (reflection).

use crate::error::{KernelError, Result};
use crate::resize::keys;
use crate::util::{check_len, for_each_task, sequential, volume, SendPtr};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GridMode {
    /// The nearest element, halves to even.
    Nearest,
    Linear,
    /// Keys' bicubic kernel, a = -0.75, over the 4×4 neighbourhood.
    Cubic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GridPadding {
    Zeros,
    Border,
    Reflection,
}

/// Input `[batch, channels, h, w]`, grid `[batch, oh, ow, 2]` of (x, y)
/// pairs, output `[batch, channels, oh, ow]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GridSampleParams {
    pub batch: usize,
    pub channels: usize,
    pub h: usize,
    pub w: usize,
    pub oh: usize,
    pub ow: usize,
    pub mode: GridMode,
    pub padding: GridPadding,
    /// -1 and 1 are the centres of the corner elements (else their outer
    /// edges).
    pub align_corners: bool,
}

/// Coordinates beyond this magnitude are clamped to it first: far enough
/// out that every tap is outside any input the device can hold, and small
/// enough that tap arithmetic stays exact.
const FAR: f32 = (1u32 << 22) as f32;

/// One axis of the input: its length and the padding rule.
#[derive(Clone, Copy)]
struct Axis {
    len: usize,
    align: bool,
    padding: GridPadding,
}

impl Axis {
    /// The input position of normalised coordinate `g`.
    fn denormalise(self, g: f32) -> f32 {
        let len = self.len as f32;
        let x = if self.align { (g + 1.0) / 2.0 * (len - 1.0) } else { ((g + 1.0) * len - 1.0) / 2.0 };
        x.clamp(-FAR, FAR)
    }

    /// The element tap `i` reads, or None for a zero.
    fn tap(self, i: i64) -> Option<usize> {
        let last = self.len as i64 - 1;
        match self.padding {
            GridPadding::Zeros => (0..=last).contains(&i).then_some(i as usize),
            GridPadding::Border => Some(i.clamp(0, last) as usize),
            GridPadding::Reflection => Some(self.reflect(i).clamp(0, last) as usize),
        }
    }

    /// `i` reflected at the borders (the edge centres with align_corners,
    /// else the outer edges) until it lies between them.
    fn reflect(self, i: i64) -> i64 {
        let (lo, hi) = if self.align { (0.0, self.len as f64 - 1.0) } else { (-0.5, self.len as f64 - 0.5) };
        let range = hi - lo;
        let x = i as f64;
        if range <= 0.0 || (lo..=hi).contains(&x) {
            return if range <= 0.0 { 0 } else { i };
        }
        let (d, from_low) = if x < lo { (lo - x, true) } else { (x - hi, false) };
        let n = (d / range).floor();
        let r = d - n * range;
        let even = n % 2.0 == 0.0;
        let y = if from_low == even { lo + r } else { hi - r };
        y as i64
    }
}

/// Up to 16 (element offset, weight) taps of one output position.
struct Taps {
    len: usize,
    at: [(u32, f32); 16],
}

impl Taps {
    fn new() -> Self {
        Taps { len: 0, at: [(0, 0.0); 16] }
    }
    fn push(&mut self, offset: usize, weight: f32) {
        self.at[self.len] = (offset as u32, weight);
        self.len += 1;
    }
}

fn taps(p: &GridSampleParams, gx: f32, gy: f32) -> Taps {
    let ax = Axis { len: p.w, align: p.align_corners, padding: p.padding };
    let ay = Axis { len: p.h, align: p.align_corners, padding: p.padding };
    let (x, y) = (ax.denormalise(gx), ay.denormalise(gy));
    let mut t = Taps::new();
    let mut add = |iy: i64, ix: i64, wgt: f32| {
        if let (Some(r), Some(c)) = (ay.tap(iy), ax.tap(ix)) {
            t.push(r * p.w + c, wgt);
        }
    };
    match p.mode {
        GridMode::Nearest => add(y.round_ties_even() as i64, x.round_ties_even() as i64, 1.0),
        GridMode::Linear => {
            let (x1, y1) = (x.floor(), y.floor());
            let (dx, dy) = (x - x1, y - y1);
            let (x1, y1) = (x1 as i64, y1 as i64);
            add(y1, x1, (1.0 - dy) * (1.0 - dx));
            add(y1, x1 + 1, (1.0 - dy) * dx);
            add(y1 + 1, x1, dy * (1.0 - dx));
            add(y1 + 1, x1 + 1, dy * dx);
        }
        GridMode::Cubic => {
            let (x1, y1) = (x.floor(), y.floor());
            let (tx, ty) = (x - x1, y - y1);
            let w = |t: f32| [keys(-0.75, t + 1.0), keys(-0.75, t), keys(-0.75, 1.0 - t), keys(-0.75, 2.0 - t)];
            let (wx, wy) = (w(tx), w(ty));
            for (j, &wyj) in wy.iter().enumerate() {
                for (i, &wxi) in wx.iter().enumerate() {
                    add(y1 as i64 - 1 + j as i64, x1 as i64 - 1 + i as i64, wyj * wxi);
                }
            }
        }
    }
    t
}

/// Output shape `[batch, channels, oh, ow]`, validating `p`.
pub fn grid_sample_output_shape(p: &GridSampleParams) -> Result<[usize; 4]> {
    let out = [p.batch, p.channels, p.oh, p.ow];
    if (p.h == 0 || p.w == 0) && volume("grid sample output", &out)? > 0 {
        return Err(KernelError::invalid("grid sample", "an empty input cannot be sampled into a non-empty output"));
    }
    if p.h.checked_mul(p.w).is_none_or(|n| n > u32::MAX as usize) {
        return Err(KernelError::invalid("grid sample", "an input plane of more than 2^32 elements"));
    }
    Ok(out)
}

/// Output positions per task: their taps (136 bytes each) are planned
/// once and used by every channel, so memory stays bounded whatever the
/// grid's size.
const POSITIONS_PER_TASK: usize = 2048;

/// Samples every plane of `input` at the positions of `grid` into `output`.
pub fn grid_sample(p: &GridSampleParams, input: &[f32], grid: &[f32], output: &mut [f32]) -> Result<()> {
    let out_shape = grid_sample_output_shape(p)?;
    check_len("grid sample input", input.len(), volume("grid sample input", &[p.batch, p.channels, p.h, p.w])?)?;
    check_len("grid sample grid", grid.len(), volume("grid sample grid", &[p.batch, p.oh, p.ow, 2])?)?;
    check_len("grid sample output", output.len(), volume("grid sample output", &out_shape)?)?;
    if output.is_empty() {
        return Ok(());
    }
    let (in_plane, out_plane) = (p.h * p.w, p.oh * p.ow);
    // Tasks: (batch, run of positions), all channels each.
    let chunks = out_plane.div_ceil(POSITIONS_PER_TASK);
    let taps_per_position = match p.mode {
        GridMode::Nearest => 1,
        GridMode::Linear => 4,
        GridMode::Cubic => 16,
    };
    let seq = sequential(output.len().saturating_mul(2 * taps_per_position));
    let out_ptr = SendPtr(output.as_mut_ptr());
    for_each_task(p.batch * chunks, seq, |t| {
        let (b, chunk) = (t / chunks, t % chunks);
        let first = chunk * POSITIONS_PER_TASK;
        let n = POSITIONS_PER_TASK.min(out_plane - first);
        let plan: Vec<Taps> = grid[(b * out_plane + first) * 2..][..n * 2].chunks_exact(2).map(|xy| taps(p, xy[0], xy[1])).collect();
        for c in 0..p.channels {
            let plane = b * p.channels + c;
            let src = &input[plane * in_plane..][..in_plane];
            // SAFETY: positions first..first+n of output plane `plane`
            // (within output.len(), checked above); tasks cover disjoint
            // (batch, position run) pairs, so no two write one element.
            let out = unsafe { core::slice::from_raw_parts_mut(out_ptr.get().add(plane * out_plane + first), n) };
            for (o, t) in out.iter_mut().zip(&plan) {
                *o = t.at[..t.len].iter().map(|&(i, wgt)| wgt * src[i as usize]).sum();
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An f64 reference written from the ONNX definition: padding per tap,
    /// reflection by repeated mirroring.
    fn reference(p: &GridSampleParams, x: &[f32], grid: &[f32]) -> Vec<f64> {
        let pixel = |plane: &[f32], r: i64, c: i64| -> f64 {
            let (h, w) = (p.h as i64, p.w as i64);
            let mirror = |mut v: f64, len: i64| -> i64 {
                let (lo, hi) = if p.align_corners { (0.0, len as f64 - 1.0) } else { (-0.5, len as f64 - 0.5) };
                if hi <= lo {
                    return 0;
                }
                while v < lo || v > hi {
                    v = if v < lo { 2.0 * lo - v } else { 2.0 * hi - v };
                }
                v as i64
            };
            let (r, c) = match p.padding {
                GridPadding::Zeros if r < 0 || r >= h || c < 0 || c >= w => return 0.0,
                GridPadding::Zeros => (r, c),
                GridPadding::Border => (r.clamp(0, h - 1), c.clamp(0, w - 1)),
                GridPadding::Reflection => (mirror(r as f64, h).clamp(0, h - 1), mirror(c as f64, w).clamp(0, w - 1)),
            };
            plane[(r * w + c) as usize] as f64
        };
        let denorm = |g: f64, len: usize| if p.align_corners { (g + 1.0) / 2.0 * (len as f64 - 1.0) } else { ((g + 1.0) * len as f64 - 1.0) / 2.0 };
        let keys = |d: f64| {
            let (a, d) = (-0.75, d.abs());
            if d <= 1.0 {
                ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0
            } else if d < 2.0 {
                ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a
            } else {
                0.0
            }
        };
        let mut out = Vec::new();
        for b in 0..p.batch {
            for c in 0..p.channels {
                let plane = &x[(b * p.channels + c) * p.h * p.w..][..p.h * p.w];
                for pos in 0..p.oh * p.ow {
                    let g = &grid[(b * p.oh * p.ow + pos) * 2..];
                    let (sx, sy) = (denorm(g[0] as f64, p.w), denorm(g[1] as f64, p.h));
                    out.push(match p.mode {
                        GridMode::Nearest => pixel(plane, sy.round_ties_even() as i64, sx.round_ties_even() as i64),
                        GridMode::Linear => {
                            let (x1, y1) = (sx.floor(), sy.floor());
                            let (fx, fy) = (sx - x1, sy - y1);
                            let (x1, y1) = (x1 as i64, y1 as i64);
                            (1.0 - fy) * ((1.0 - fx) * pixel(plane, y1, x1) + fx * pixel(plane, y1, x1 + 1))
                                + fy * ((1.0 - fx) * pixel(plane, y1 + 1, x1) + fx * pixel(plane, y1 + 1, x1 + 1))
                        }
                        GridMode::Cubic => {
                            let (x1, y1) = (sx.floor(), sy.floor());
                            let mut v = 0.0;
                            for j in -1..3i64 {
                                for i in -1..3i64 {
                                    let wgt = keys(sy - (y1 + j as f64)) * keys(sx - (x1 + i as f64));
                                    v += wgt * pixel(plane, y1 as i64 + j, x1 as i64 + i);
                                }
                            }
                            v
                        }
                    });
                }
            }
        }
        out
    }

    #[test]
    fn every_mode_and_padding_matches_the_reference() {
        let mut seed = 12345u64;
        let mut rnd = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) as f64 / (1u64 << 31) as f64) as f32
        };
        // The last shape spans two tasks' runs of positions.
        for (h, w, oh, ow) in [(5, 7, 4, 6), (1, 3, 2, 2), (6, 1, 3, 5), (9, 8, 7, 9), (9, 8, 47, 51)] {
            let (n, c) = (2, 3);
            let x: Vec<f32> = (0..n * c * h * w).map(|_| rnd() * 4.0 - 2.0).collect();
            // Positions inside and well outside [-1, 1], some exactly on
            // element centres and halves.
            let grid: Vec<f32> = (0..n * oh * ow * 2)
                .map(|i| if i % 7 == 0 { ((i % 9) as f32 - 4.0) * 0.25 } else { rnd() * 3.4 - 1.7 })
                .collect();
            for mode in [GridMode::Nearest, GridMode::Linear, GridMode::Cubic] {
                for padding in [GridPadding::Zeros, GridPadding::Border, GridPadding::Reflection] {
                    for align_corners in [false, true] {
                        let p = GridSampleParams { batch: n, channels: c, h, w, oh, ow, mode, padding, align_corners };
                        let mut y = vec![f32::NAN; n * c * oh * ow];
                        grid_sample(&p, &x, &grid, &mut y).unwrap();
                        let want = reference(&p, &x, &grid);
                        for (i, (&g, &r)) in y.iter().zip(&want).enumerate() {
                            assert!((g as f64 - r).abs() <= 2e-5 * (1.0 + r.abs()), "{p:?} [{i}]: {g} vs {r}");
                        }
                    }
                }
            }
        }
    }

    /// The identity grid with align_corners reproduces the input.
    #[test]
    fn the_identity_grid_copies() {
        let (h, w) = (4, 6);
        let x: Vec<f32> = (0..h * w).map(|i| i as f32 * 0.5 - 3.0).collect();
        let grid: Vec<f32> = (0..h * w).flat_map(|i| [2.0 * (i % w) as f32 / (w - 1) as f32 - 1.0, 2.0 * (i / w) as f32 / (h - 1) as f32 - 1.0]).collect();
        for mode in [GridMode::Nearest, GridMode::Linear, GridMode::Cubic] {
            let p = GridSampleParams { batch: 1, channels: 1, h, w, oh: h, ow: w, mode, padding: GridPadding::Zeros, align_corners: true };
            let mut y = vec![0.0; h * w];
            grid_sample(&p, &x, &grid, &mut y).unwrap();
            for (a, b) in y.iter().zip(&x) {
                assert!((a - b).abs() < 1e-5, "{mode:?}: {y:?}");
            }
        }
    }

    #[test]
    fn bad_shapes_and_hostile_grids() {
        let p = GridSampleParams { batch: 1, channels: 1, h: 2, w: 2, oh: 1, ow: 3, mode: GridMode::Cubic, padding: GridPadding::Reflection, align_corners: false };
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let mut y = [7.0f32; 3];
        assert!(grid_sample(&p, &x[..3], &[0.0; 6], &mut y).is_err());
        assert!(grid_sample(&p, &x, &[0.0; 5], &mut y).is_err());
        assert!(grid_sample(&GridSampleParams { h: 0, ..p }, &[], &[0.0; 6], &mut y).is_err());
        assert_eq!(y, [7.0; 3]);
        // Infinite and NaN positions: no panic, finite results where the
        // padding defines them.
        let hostile = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e30, -1e30, f32::NAN];
        for padding in [GridPadding::Zeros, GridPadding::Border, GridPadding::Reflection] {
            for mode in [GridMode::Nearest, GridMode::Linear, GridMode::Cubic] {
                grid_sample(&GridSampleParams { padding, mode, ..p }, &x, &hostile, &mut y).unwrap();
            }
        }
    }
}
