//! Resize and Upsample: nearest, (bi)linear and (bi)cubic resizing of the
//! last one or two axes of an NCHW / NCW tensor, lowered to one RESIZE
//! descriptor whose per-axis affine source-coordinate map encodes the ONNX
//! `coordinate_transformation_mode`. Cubic resizing of a constant (the
//! interpolated position embeddings of ViT-style models) is folded. An
//! NCDHW tensor (3-D UNets' trilinear upsampling) takes two RESIZEs, exact
//! because nearest and linear sampling are separable per axis: (H, W) on
//! the [N, C·D, H, W] view, then D on the [N·C, 1, D, H'·W'] view with the
//! identity map along its second axis. GridSample (4-D) is one
//! GRID_SAMPLE descriptor.

use super::*;

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &["Resize", "Upsample", "GridSample"];

impl Importer {
    /// GridSample on `[n, c, h, w]` with a grid `[n, oh, ow, 2]` (both may
    /// be run-time values): opset 16's mode names (bilinear, bicubic) and
    /// opset 20's (linear, cubic).
    fn lower_grid_sample(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let input = |i: usize| ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")));
        let (x, grid) = (input(0)?, input(1)?);
        let (s, g) = (self.shape(x), self.shape(grid));
        if s.len() != 4 {
            return Err(cx.err(format!("input has shape {s:?}; only 4-D (N, C, H, W) inputs are supported")));
        }
        if g.len() != 4 || g[0] != s[0] || g[3] != 2 {
            return Err(cx.err(format!("grid has shape {g:?}; [{}, H_out, W_out, 2] expected for the input {s:?}", s[0])));
        }
        let mode = match cx.string("mode").as_deref().unwrap_or(if self.opset >= 20 { "linear" } else { "bilinear" }) {
            "nearest" => GRID_NEAREST,
            "bilinear" | "linear" => GRID_LINEAR,
            "bicubic" | "cubic" => GRID_CUBIC,
            other => return Err(cx.err(format!("mode '{other}' is not supported (nearest, linear/bilinear, cubic/bicubic are)"))),
        };
        let padding = match cx.string("padding_mode").as_deref().unwrap_or("zeros") {
            "zeros" => GRID_PAD_ZEROS,
            "border" => GRID_PAD_BORDER,
            "reflection" => GRID_PAD_REFLECTION,
            other => return Err(cx.err(format!("padding_mode '{other}' is not supported (zeros, border, reflection are)"))),
        };
        let align_corners = match cx.int("align_corners", 0) {
            0 => false,
            1 => true,
            v => return Err(cx.err(format!("align_corners={v}; it must be 0 or 1"))),
        };
        let kind = Kind::GridSample { x, grid, dims: [s[0], s[1], s[2], s[3]], out: [g[1], g[2]], mode, padding, align_corners };
        Ok(vec![self.device(cx, kind, vec![s[0], s[1], g[1], g[2]])])
    }

    pub(super) fn lower_resize(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        if cx.n.op_type == "GridSample" {
            return self.lower_grid_sample(cx, ins);
        }
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let s = self.shape(x);
        if !(3..=5).contains(&s.len()) {
            return Err(cx.err(format!("input has shape {s:?}; N, C and one, two or three spatial dims are supported")));
        }
        let legacy = cx.n.op_type == "Upsample" || self.opset < 11;
        // Scales or sizes: Upsample-7 has a `scales` attribute; Upsample-9
        // and Resize-10 a scales input; Resize-11+ scales (input 2) or sizes
        // (input 3).
        let (scales, sizes) = if cx.n.op_type == "Upsample" && self.opset < 9 {
            (Some(cx.attr("scales").map(|a| a.floats.clone()).unwrap_or_default()), None)
        } else if legacy {
            let v = ins.get(1).copied().flatten().ok_or_else(|| cx.err("input 1 (scales) is missing"))?;
            (Some(self.need_const(cx, v, 1)?.floats()), None)
        } else {
            let get = |me: &Self, i: usize| -> Result<Option<Const>> {
                match ins.get(i).copied().flatten() {
                    Some(v) => me.need_const(cx, v, i).map(|c| (!c.is_empty()).then_some(c)),
                    None => Ok(None),
                }
            };
            (get(self, 2)?.map(|c| c.floats()), get(self, 3)?.map(|c| c.ints()))
        };
        if !legacy {
            if let Some(axes) = cx.ints("axes") {
                let all: Vec<i64> = (0..s.len() as i64).collect();
                if axes != all {
                    return Err(cx.err(format!("axes {axes:?}: only the default (every axis) is supported")));
                }
            }
            if cx.int("antialias", 0) != 0 && scales.as_ref().is_some_and(|sc| sc.iter().any(|&v| v < 1.0)) {
                return Err(cx.err("antialias downsampling is not supported"));
            }
            let policy = cx.string("keep_aspect_ratio_policy").unwrap_or_else(|| "stretch".into());
            if policy != "stretch" {
                return Err(cx.err(format!("keep_aspect_ratio_policy '{policy}' is not supported (only 'stretch')")));
            }
        }
        // Per axis: output length and the scale the coordinate map uses.
        let r = s.len();
        let (out, scale): (Vec<u64>, Vec<f32>) = match (&scales, &sizes) {
            (_, Some(sz)) => {
                if sz.len() != r || sz.iter().any(|&v| v <= 0) {
                    return Err(cx.err(format!("sizes {sz:?} must be {r} positive lengths")));
                }
                let out: Vec<u64> = sz.iter().map(|&v| v as u64).collect();
                let scale = out.iter().zip(&s).map(|(&o, &i)| o as f32 / i.max(1) as f32).collect();
                (out, scale)
            }
            (Some(sc), None) => {
                if sc.len() != r || sc.iter().any(|&v| !(v.is_finite() && v > 0.0)) {
                    return Err(cx.err(format!("scales {sc:?} must be {r} positive finite factors")));
                }
                let out = sc.iter().zip(&s).map(|(&f, &i)| (i as f32 * f).floor() as u64).collect();
                (out, sc.clone())
            }
            (None, None) => return Err(cx.err("neither scales nor sizes is given")),
        };
        if out[0] != s[0] || out[1] != s[1] {
            return Err(cx.err(format!("resizes the batch or channel axis ({:?} -> {:?}); only spatial axes can be resized", &s[..2], &out[..2])));
        }
        if out.contains(&0) {
            return Err(cx.err(format!("output shape {out:?} has an empty axis")));
        }
        let mode = cx.string("mode").unwrap_or_else(|| "nearest".into());
        let is_cubic = matches!(mode.as_str(), "cubic" | "bicubic");
        if !(is_cubic || matches!(mode.as_str(), "nearest" | "linear" | "bilinear")) {
            return Err(cx.err(format!("mode '{mode}' is not supported (nearest, linear and cubic are)")));
        }
        let ctm = if legacy { "asymmetric".to_string() } else { cx.string("coordinate_transformation_mode").unwrap_or_else(|| "half_pixel".into()) };
        let nearest_rounding = if legacy {
            // Upsample / Resize-10 round like onnxruntime's "simple" mode:
            // down when enlarging, up when shrinking.
            let sp = &scale[2..];
            if sp.iter().all(|&f| f >= 1.0) {
                RESIZE_FLOOR
            } else if sp.iter().all(|&f| f < 1.0) {
                RESIZE_CEIL
            } else {
                return Err(cx.err("nearest resizing that enlarges one axis and shrinks the other (opset < 11) is not supported"));
            }
        } else {
            match cx.string("nearest_mode").as_deref().unwrap_or("round_prefer_floor") {
                "round_prefer_floor" => RESIZE_ROUND_PREFER_FLOOR,
                "round_prefer_ceil" => RESIZE_ROUND_PREFER_CEIL,
                "floor" => RESIZE_FLOOR,
                "ceil" => RESIZE_CEIL,
                other => return Err(cx.err(format!("nearest_mode '{other}' is not supported"))),
            }
        };
        // Source coordinate = a·x + b for each spatial axis.
        let map_axis = |i: usize| -> Result<(f32, f32)> {
            let (inl, outl, f) = (s[i], out[i], scale[i]);
            Ok(match ctm.as_str() {
                "half_pixel" => (1.0 / f, 0.5 / f - 0.5),
                "pytorch_half_pixel" if outl > 1 => (1.0 / f, 0.5 / f - 0.5),
                "pytorch_half_pixel" => (0.0, 0.0),
                "align_corners" if outl > 1 => ((inl - 1) as f32 / (outl - 1) as f32, 0.0),
                "align_corners" => (0.0, 0.0),
                "asymmetric" => (1.0 / f, 0.0),
                "tf_half_pixel_for_nearest" => (1.0 / f, 0.5 / f),
                other => return Err(cx.err(format!("coordinate_transformation_mode '{other}' is not supported"))),
            })
        };
        let sampling = match mode.as_str() {
            "nearest" => Sampling::Nearest(nearest_rounding),
            "linear" | "bilinear" => Sampling::Linear,
            _ => Sampling::Cubic { a: cx.float("cubic_coeff_a", -0.75), exclude_outside: cx.int("exclude_outside", 0) != 0 },
        };
        if r == 5 {
            if is_cubic {
                return Err(cx.err("mode 'cubic' on a 3-D (NCDHW) input is not supported (nearest and linear are)"));
            }
            let (d, h, w) = (map_axis(2)?, map_axis(3)?, map_axis(4)?);
            let too_big = || cx.err(format!("input {s:?}, output {out:?}: sizes overflow"));
            let planes = s[1].checked_mul(s[2]).ok_or_else(too_big)?;
            let frames = self.reshaped(cx, x, vec![s[0], planes, s[3], s[4]], Some("frames"));
            let kind = Kind::Resize { x: frames, dims: [s[0], planes, s[3], s[4]], out: [out[3], out[4]], sampling, map: [h.0, h.1, w.0, w.1] };
            let y = self.device_tmp(cx, kind, vec![s[0], planes, out[3], out[4]], "per_frame");
            let (nc, hw) = (s[0].checked_mul(s[1]).ok_or_else(too_big)?, out[3].checked_mul(out[4]).ok_or_else(too_big)?);
            let y = self.reshaped(cx, y, vec![nc, 1, s[2], hw], Some("depth_rows"));
            let kind = Kind::Resize { x: y, dims: [nc, 1, s[2], hw], out: [out[2], hw], sampling, map: [d.0, d.1, 1.0, 0.0] };
            let y = self.device_tmp(cx, kind, vec![nc, 1, out[2], hw], "over_depth");
            let y = self.reshaped(cx, y, out.clone(), Some("out"));
            return Ok(vec![self.alias(cx, y)]);
        }
        let (dims, out2, map) = if r == 4 {
            let (y, xx) = (map_axis(2)?, map_axis(3)?);
            ([s[0], s[1], s[2], s[3]], [out[2], out[3]], [y.0, y.1, xx.0, xx.1])
        } else {
            let xx = map_axis(2)?;
            ([s[0], s[1], 1, s[2]], [1, out[2]], [0.0, 0.0, xx.0, xx.1])
        };
        if let (Sampling::Cubic { a, exclude_outside }, Some(c)) = (sampling, self.konst(x)) {
            let v = cubic(&c.floats(), dims, out2, map, a, exclude_outside);
            return Ok(vec![self.constant(&Self::out_name(cx, 0), Const::f32(&out, v))]);
        }
        if out2 == [dims[2], dims[3]] && map == [1.0, 0.0, 1.0, 0.0] {
            // The identity: no data moves.
            return Ok(vec![self.alias(cx, x)]);
        }
        let kind = Kind::Resize { x, dims, out: out2, sampling, map };
        Ok(vec![self.device(cx, kind, out)])
    }
}

/// Cubic (Keys, coefficient `a`) resize of `[n, c, h, w]` to `out` with the
/// source coordinate `map[0]·y + map[1]`, `map[2]·x + map[3]`, as ONNX
/// Resize defines it: four taps per axis around the source coordinate,
/// clamped to the edge, or (`exclude_outside`) dropped and the remaining
/// weights renormalised. Separable: rows first, then columns.
fn cubic(x: &[f32], [n, c, h, w]: [u64; 4], [oh, ow]: [u64; 2], map: [f32; 4], a: f32, exclude: bool) -> Vec<f32> {
    let kernel = |d: f32| -> f32 {
        let d = d.abs();
        if d <= 1.0 {
            ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0
        } else if d < 2.0 {
            ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a
        } else {
            0.0
        }
    };
    // Per output position of one axis: four (source index, weight) taps.
    let taps = |len: u64, out: u64, scale: f32, offset: f32| -> Vec<[(usize, f32); 4]> {
        (0..out)
            .map(|o| {
                let src = scale * o as f32 + offset;
                let base = src.floor();
                let t = src - base;
                let mut ws = [0.0f32; 4];
                let mut idx = [0usize; 4];
                for k in 0..4 {
                    let i = base as i64 + k as i64 - 1;
                    let wgt = kernel(t + 1.0 - k as f32);
                    let inside = i >= 0 && i < len as i64;
                    ws[k] = if exclude && !inside { 0.0 } else { wgt };
                    idx[k] = i.clamp(0, len as i64 - 1) as usize;
                }
                if exclude {
                    let sum: f32 = ws.iter().sum();
                    if sum != 0.0 {
                        ws.iter_mut().for_each(|v| *v /= sum);
                    }
                }
                [(idx[0], ws[0]), (idx[1], ws[1]), (idx[2], ws[2]), (idx[3], ws[3])]
            })
            .collect()
    };
    let (ty, tx) = (taps(h, oh, map[0], map[1]), taps(w, ow, map[2], map[3]));
    let (h, w, oh, ow) = (h as usize, w as usize, oh as usize, ow as usize);
    let mut out = vec![0.0f32; (n * c) as usize * oh * ow];
    let mut rows = vec![0.0f32; oh * w];
    for p in 0..(n * c) as usize {
        let plane = &x[p * h * w..][..h * w];
        for (oy, t) in ty.iter().enumerate() {
            for xx in 0..w {
                rows[oy * w + xx] = t.iter().map(|&(i, wt)| wt * plane[i * w + xx]).sum();
            }
        }
        let o = &mut out[p * oh * ow..][..oh * ow];
        for oy in 0..oh {
            for (ox, t) in tx.iter().enumerate() {
                o[oy * ow + ox] = t.iter().map(|&(i, wt)| wt * rows[oy * w + i]).sum();
            }
        }
    }
    out
}
