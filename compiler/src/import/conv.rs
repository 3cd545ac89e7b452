//! Convolutions (1-D, 2-D and 3-D, groups, dilation, auto_pad), lowered to
//! CONV2D descriptors, and the sliding-window geometry pooling shares.
//!
//! A 3-D convolution (NCDHW, e.g. video models) becomes a 2-D one over
//! (H, W) with the depth taps as extra input channels: one strided copy
//! gathers, for every output frame t, the `kD` input frames its taps read
//! (`x[n, c, t·sd + kd·dd]` of the depth-padded input) as channels
//! `c·kD + kd` of image `n·D' + t`; the weights [O, C/g, kD, kH, kW] are
//! then [O, C/g·kD, kH, kW] as stored (groups stay contiguous), and the
//! [N·D', O, H', W'] result is transposed to [N, O, D', H', W']. The copy
//! holds `kD/sd` times the input.
//!
//! A transposed convolution (ConvTranspose) whose kernel equals its stride
//! is a 1x1 convolution and a pixel shuffle; any other becomes the equivalent direct
//! one: the input spread out with `stride − 1` zeros between elements and
//! padded by `dilation·(k − 1) − pad` (a strided copy into a zero-filled
//! buffer), then a stride-1 convolution with the kernel flipped and its
//! channel axes swapped (done on the constant weights). It computes the
//! inserted zeros too: `stride²` times the MACs of a direct kernel (3-D:
//! always this form, `stride³`, with the direct 3-D conv below).

use super::*;

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &[
    "Conv", "ConvTranspose",
];

impl Importer {
    pub(super) fn lower_conv(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let input = |i: usize| -> Result<ValueId> {
            ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")))
        };
        let opt = |i: usize| ins.get(i).copied().flatten();
        let op = cx.n.op_type.as_str();
        let v = match op {
            "Conv" => self.conv(cx, input(0)?, input(1)?, opt(2))?,
            "ConvTranspose" => self.conv_transpose(cx, input(0)?, input(1)?, opt(2))?,
            _ => return Err(cx.err(format!("internal error: '{op}' is not a conv op"))),
        };
        Ok(vec![v])
    }

    /// (pad_begin, pad_end) per spatial axis from pads/auto_pad.
    pub(super) fn pads(&self, cx: &Cx, input: &[u64], kernel: &[u64], stride: &[u64], dil: &[u64]) -> Result<Vec<(u64, u64)>> {
        let sp = input.len();
        match cx.string("auto_pad").as_deref().unwrap_or("NOTSET") {
            "NOTSET" => {
                let p = cx.ints("pads").unwrap_or_else(|| vec![0; 2 * sp]);
                if p.len() != 2 * sp || p.iter().any(|&v| v < 0) {
                    return Err(cx.err(format!("pads {p:?}: {} non-negative values expected", 2 * sp)));
                }
                Ok((0..sp).map(|i| (p[i] as u64, p[i + sp] as u64)).collect())
            }
            "VALID" => Ok(vec![(0, 0); sp]),
            mode @ ("SAME_UPPER" | "SAME_LOWER") => Ok((0..sp)
                .map(|i| {
                    let out = input[i].div_ceil(stride[i]);
                    let need = ((out - 1) * stride[i] + (kernel[i] - 1) * dil[i] + 1).saturating_sub(input[i]);
                    let small = need / 2;
                    if mode == "SAME_UPPER" { (small, need - small) } else { (need - small, small) }
                })
                .collect()),
            other => Err(cx.err(format!("auto_pad '{other}' is not supported"))),
        }
    }

    pub(super) fn spatial_attr(&self, cx: &Cx, name: &str, sp: usize) -> Result<Vec<u64>> {
        match cx.ints(name) {
            None => Ok(vec![1; sp]),
            Some(v) if v.len() == sp && v.iter().all(|&x| x > 0) => Ok(v.iter().map(|&x| x as u64).collect()),
            Some(v) => Err(cx.err(format!("{name} {v:?}: {sp} positive values expected"))),
        }
    }

    /// Spatial geometry of a 1-D or 2-D sliding window, lifted to 2-D (a 1-D
    /// window is a 2-D one of height 1: the bytes are the same).
    pub(super) fn window(&self, cx: &Cx, input: &[u64], kernel: &[u64]) -> Result<Window> {
        let sp = input.len();
        let stride = self.spatial_attr(cx, "strides", sp)?;
        let dil = self.spatial_attr(cx, "dilations", sp)?;
        let pads = self.pads(cx, input, kernel, &stride, &dil)?;
        let lift = |v: &[u64], one: u64| -> [u64; 2] { if sp == 1 { [one, v[0]] } else { [v[0], v[1]] } };
        Ok(Window {
            input: lift(input, 1),
            kernel: lift(kernel, 1),
            stride: lift(&stride, 1),
            dilation: lift(&dil, 1),
            pads: if sp == 1 { [(0, 0), pads[0]] } else { [pads[0], pads[1]] },
        })
    }

    pub(super) fn conv(&mut self, cx: &Cx, x: ValueId, w: ValueId, bias: Option<ValueId>) -> Result<ValueId> {
        let sx = self.shape(x);
        let sw = self.shape(w);
        if sx.len() == 5 && sw.len() == 5 {
            return self.conv3d(cx, x, w, bias);
        }
        if !(sx.len() == 3 || sx.len() == 4) || sw.len() != sx.len() {
            return Err(cx.err(format!("input {sx:?} / weights {sw:?}: only 1-D, 2-D and 3-D convolution (NCL / NCHW / NCDHW) is supported")));
        }
        let g = self.check_conv_operands(cx, &sx, &sw, bias)?;
        let (n, c, o) = (sx[0], sx[1], sw[0]);
        let mut win = self.window(cx, &sx[2..], &sw[2..])?;
        let out_sp = win.output(cx)?;
        let w = self.trim_dead_taps(cx, w, &mut win, out_sp);
        let kind = Kind::Conv {
            x, w, bias,
            dims: [n, c, win.input[0], win.input[1], o, win.kernel[0], win.kernel[1], g],
            stride: win.stride,
            dilation: win.dilation,
            pads: win.pad4(),
            residual: None,
            act: Act::NONE,
            winograd: false,
        };
        let mut out = vec![n, o];
        out.extend(&out_sp[2 - (sx.len() - 2)..]);
        Ok(self.device(cx, kind, out))
    }
}

impl Importer {
    /// The groups of a Conv whose input `sx`, weights `sw` and bias agree
    /// with each other and with `kernel_shape`.
    fn check_conv_operands(&self, cx: &Cx, sx: &[u64], sw: &[u64], bias: Option<ValueId>) -> Result<u64> {
        let g = cx.int("group", 1).max(1) as u64;
        let (c, o) = (sx[1], sw[0]);
        if c % g != 0 || o % g != 0 || sw[1] * g != c {
            return Err(cx.err(format!("weights {sw:?} do not fit {c} input channels in {g} groups")));
        }
        if let Some(ks) = cx.ints("kernel_shape") {
            if ks.iter().map(|&k| k as u64).ne(sw[2..].iter().copied()) {
                return Err(cx.err(format!("kernel_shape {ks:?} differs from the weights' {:?}", &sw[2..])));
            }
        }
        if let Some(bv) = bias {
            if self.shape(bv) != [o] {
                return Err(cx.err(format!("bias has shape {:?}; [{o}] expected", self.shape(bv))));
            }
        }
        Ok(g)
    }

    /// A 3-D convolution as a 2-D one with the depth taps as channels; see
    /// the module docs.
    fn conv3d(&mut self, cx: &Cx, x: ValueId, w: ValueId, bias: Option<ValueId>) -> Result<ValueId> {
        let (sx, sw) = (self.shape(x), self.shape(w));
        let g = self.check_conv_operands(cx, &sx, &sw, bias)?;
        let stride = self.spatial_attr(cx, "strides", 3)?;
        let dil = self.spatial_attr(cx, "dilations", 3)?;
        let pads = self.pads(cx, &sx[2..], &sw[2..], &stride, &dil)?;
        self.conv3d_with(cx, x, w, bias, g, &stride, &dil, &pads)
    }

    /// [`Importer::conv3d`] with its geometry given (checked operands).
    #[allow(clippy::too_many_arguments)]
    fn conv3d_with(&mut self, cx: &Cx, x: ValueId, w: ValueId, bias: Option<ValueId>, g: u64, stride: &[u64], dil: &[u64], pads: &[(u64, u64)]) -> Result<ValueId> {
        let (sx, sw) = (self.shape(x), self.shape(w));
        let (n, c, o) = (sx[0], sx[1], sw[0]);
        let (d, h, wd) = (sx[2], sx[3], sx[4]);
        let kd = sw[2];
        let od = out_len(d, kd, stride[0], dil[0], pads[0]).ok_or_else(|| cx.err("the kernel is larger than the padded input"))?;
        let mut win = Window { input: [h, wd], kernel: [sw[3], sw[4]], stride: [stride[1], stride[2]], dilation: [dil[1], dil[2]], pads: [pads[1], pads[2]] };
        let out_hw = win.output(cx)?;
        let too_big = || cx.err(format!("input {sx:?} / weights {sw:?}: sizes overflow"));
        let ckd = c.checked_mul(kd).ok_or_else(too_big)?;
        let images = n.checked_mul(od).ok_or_else(too_big)?;
        // Depth padding first (zeros), so that every tap reads a frame.
        let xp = if pads[0] == (0, 0) {
            x
        } else {
            let (begin, end) = (vec![0, 0, pads[0].0, 0, 0], vec![0, 0, pads[0].1, 0, 0]);
            let dp = d.checked_add(pads[0].0).and_then(|v| v.checked_add(pads[0].1)).ok_or_else(too_big)?;
            let kind = Kind::Pad { x, value: 0.0, dims: sx.clone(), begin, end, step: vec![1; 5] };
            self.device_tmp(cx, kind, vec![n, c, dp, h, wd], "depth_padded")
        };
        let dp = self.shape(xp)[2];
        // Frames: image n·D' + t, channel c·kD + kd <- xp[n, c, t·sd + kd·dd].
        let mul = |a: u64, b: u64| a.checked_mul(b).ok_or_else(too_big);
        let hw = mul(h, wd)?;
        let (src_image, dst_image) = (mul(mul(c, dp)?, hw)?, mul(mul(od, ckd)?, hw)?);
        let (src_frame, dst_frame) = (mul(stride[0], hw)?, mul(ckd, hw)?);
        let (src_tap, src_channel) = (mul(dil[0], hw)?, mul(dp, hw)?);
        let parts = (0..kd)
            .map(|k| CopyPart {
                src: xp,
                src_offset: k * src_tap,
                dst_offset: k * hw,
                sizes: vec![n, od, c, hw],
                src_strides: vec![src_image, src_frame, src_channel, 1],
                dst_strides: vec![dst_image, dst_frame, kd * hw, 1],
            })
            .collect();
        let frames = self.device_tmp(cx, Kind::Copy { parts }, vec![images, ckd, h, wd], "frames");
        let w2 = self.reshaped(cx, w, vec![o, sw[1] * kd, sw[3], sw[4]], Some("weights_2d"));
        let w2 = self.trim_dead_taps(cx, w2, &mut win, out_hw);
        let kind = Kind::Conv {
            x: frames,
            w: w2,
            bias,
            dims: [images, ckd, h, wd, o, win.kernel[0], win.kernel[1], g],
            stride: win.stride,
            dilation: win.dilation,
            pads: win.pad4(),
            residual: None,
            act: Act::NONE,
            winograd: false,
        };
        let y = self.device_tmp(cx, kind, vec![images, o, out_hw[0], out_hw[1]], "per_frame");
        let y = self.reshaped(cx, y, vec![n, od, o, out_hw[0] * out_hw[1]], Some("per_frame_rows"));
        let y = self.permuted(cx, y, &[0, 2, 1, 3], Some("frames_last"))?;
        let y = self.reshaped(cx, y, vec![n, o, od, out_hw[0], out_hw[1]], Some("out"));
        Ok(self.alias(cx, y))
    }

    /// Kernel taps that read only padding for every output position (a
    /// dilated convolution on a small input: DeepLabV3's ASPP at rates 24
    /// and 36 on a 32x32 map) multiply zeros: constant weights lose them,
    /// and the padding shrinks by as much, so the output is unchanged
    /// (rate 36 on 32x32 becomes a 1x1 convolution, 9x fewer operations).
    /// Live taps along an axis form one run; a run that would need negative
    /// padding, or an axis with no live tap, is left as it is.
    fn trim_dead_taps(&mut self, cx: &Cx, w: ValueId, win: &mut Window, out: [u64; 2]) -> ValueId {
        let mut keep = [(0u64, 0u64); 2];
        for a in 0..2 {
            let (i, k, s, d) = (win.input[a] as i64, win.kernel[a] as i64, win.stride[a] as i64, win.dilation[a] as i64);
            let (pb, pe) = (win.pads[a].0 as i64, win.pads[a].1 as i64);
            let o = out[a] as i64;
            // Tap t reads o'·s - pb + t·d, o' in 0..o: live if one lands in 0..i.
            let live = |t: i64| (0..o).any(|q| (0..i).contains(&(q * s - pb + t * d)));
            let (Some(t0), Some(t1)) = ((0..k).find(|&t| live(t)), (0..k).rev().find(|&t| live(t))) else { return w };
            if pb - t0 * d < 0 || pe - (k - 1 - t1) * d < 0 {
                return w;
            }
            keep[a] = (t0 as u64, t1 as u64);
        }
        let [(y0, y1), (x0, x1)] = keep;
        if (y0, y1, x0, x1) == (0, win.kernel[0] - 1, 0, win.kernel[1] - 1) {
            return w;
        }
        let Some(wc) = self.konst(w) else { return w };
        let sw = self.shape(w);
        let (kh, kw) = (win.kernel[0] as usize, win.kernel[1] as usize);
        let (nh, nw) = ((y1 - y0 + 1) as usize, (x1 - x0 + 1) as usize);
        let src = wc.floats();
        let mut dst = Vec::with_capacity(src.len() / (kh * kw) * nh * nw);
        for plane in src.chunks_exact(kh * kw) {
            for ky in y0 as usize..=y1 as usize {
                dst.extend_from_slice(&plane[ky * kw + x0 as usize..=ky * kw + x1 as usize]);
            }
        }
        let mut shape = sw[..2].to_vec();
        shape.extend(if sw.len() == 3 { vec![nw as u64] } else { vec![nh as u64, nw as u64] });
        for (a, (t0, t1)) in keep.into_iter().enumerate() {
            let d = win.dilation[a];
            win.pads[a] = (win.pads[a].0 - t0 * d, win.pads[a].1 - (win.kernel[a] - 1 - t1) * d);
            win.kernel[a] = t1 - t0 + 1;
            if win.kernel[a] == 1 {
                win.dilation[a] = 1;
            }
        }
        self.constant(&format!("{}.live_taps", cx.name), Const::f32(&shape, dst))
    }

    /// ConvTranspose whose kernel equals its stride (no dilation, padding
    /// or groups): `cols = W'·x` as a 1x1 Conv with W'[(co, t), ci] =
    /// W[ci, co, t] (t the kernel offset) and the bias repeated per offset,
    /// then the columns shuffled into place: [n, o, k0, k1, h, w] ->
    /// [n, o, h, k0, w, k1] -> [n, o, h·k0, w·k1] (1-D: [n, o, k, l] ->
    /// [n, o, l, k] -> [n, o, l·k]).
    #[allow(clippy::too_many_arguments)] // the op's operands and its three sizes
    fn conv_transpose_disjoint(&mut self, cx: &Cx, x: ValueId, wc: &Const, bias: Option<ValueId>, [n, c, o]: [u64; 3], input: &[u64], kernel: &[u64]) -> Result<ValueId> {
        let kvol = volume(kernel);
        let src = wc.floats();
        let mut w = vec![0.0f32; src.len()];
        for ci in 0..c as usize {
            for co in 0..o as usize {
                for t in 0..kvol as usize {
                    w[(co * kvol as usize + t) * c as usize + ci] = src[(ci * o as usize + co) * kvol as usize + t];
                }
            }
        }
        let wv = self.constant(&format!("{}.column_weights", cx.name), Const::f32(&[o * kvol, c, 1, 1], w));
        let bv = match bias.and_then(|b| self.konst(b)).map(|b| b.floats()) {
            Some(b) => {
                let rep: Vec<f32> = b.iter().flat_map(|&v| std::iter::repeat_n(v, kvol as usize)).collect();
                Some(self.constant(&format!("{}.column_bias", cx.name), Const::f32(&[o * kvol], rep)))
            }
            None => None,
        };
        let (h, wd) = if input.len() == 1 { (1, input[0]) } else { (input[0], input[1]) };
        let kind = Kind::Conv {
            x,
            w: wv,
            bias: bv,
            dims: [n, c, h, wd, o * kvol, 1, 1, 1],
            stride: [1, 1],
            dilation: [1, 1],
            pads: [0; 4],
            residual: None,
            act: Act::NONE,
            winograd: false,
        };
        let cols = self.device_tmp(cx, kind, vec![n, o * kvol, h, wd], "columns");
        let (blocks, perm, out) = if input.len() == 1 {
            (vec![n, o, kernel[0], input[0]], vec![0, 1, 3, 2], vec![n, o, input[0] * kernel[0]])
        } else {
            (vec![n, o, kernel[0], kernel[1], input[0], input[1]], vec![0, 1, 4, 2, 5, 3], vec![n, o, input[0] * kernel[0], input[1] * kernel[1]])
        };
        let b = self.reshaped(cx, cols, blocks, Some("blocks"));
        let y = self.permuted(cx, b, &perm, Some("shuffled"))?;
        let y = self.reshaped(cx, y, out, Some("out"));
        Ok(self.alias(cx, y))
    }

    pub(super) fn conv_transpose(&mut self, cx: &Cx, x: ValueId, w: ValueId, bias: Option<ValueId>) -> Result<ValueId> {
        let sx = self.shape(x);
        let sw = self.shape(w);
        if !(3..=5).contains(&sx.len()) || sw.len() != sx.len() {
            return Err(cx.err(format!("input {sx:?} / weights {sw:?}: only 1-D, 2-D and 3-D transposed convolution is supported")));
        }
        let sp = sx.len() - 2;
        let g = cx.int("group", 1).max(1) as u64;
        let (n, c) = (sx[0], sx[1]);
        if sw[0] != c || c % g != 0 {
            return Err(cx.err(format!("weights {sw:?} do not fit {c} input channels in {g} groups")));
        }
        let og = sw[1];
        let o = og * g;
        let kernel = &sw[2..];
        if let Some(ks) = cx.ints("kernel_shape") {
            if ks.iter().map(|&k| k as u64).ne(kernel.iter().copied()) {
                return Err(cx.err(format!("kernel_shape {ks:?} differs from the weights' {kernel:?}")));
            }
        }
        let wc = self.konst(w).cloned().ok_or_else(|| cx.err("weights computed at run time are not supported"))?;
        if let Some(bv) = bias {
            if self.shape(bv) != [o] {
                return Err(cx.err(format!("bias has shape {:?}; [{o}] expected", self.shape(bv))));
            }
        }
        let stride = self.spatial_attr(cx, "strides", sp)?;
        let dil = self.spatial_attr(cx, "dilations", sp)?;
        let out_pad = match cx.ints("output_padding") {
            Some(p) if p.len() == sp && p.iter().zip(&stride).zip(&dil).all(|((&v, &s), &d)| v >= 0 && ((v as u64) < s || (v as u64) < d)) => {
                p.iter().map(|&v| v as u64).collect::<Vec<_>>()
            }
            Some(p) => return Err(cx.err(format!("output_padding {p:?}: {sp} values below the stride or dilation expected"))),
            None => vec![0; sp],
        };
        let input = &sx[2..];
        // Full output extent before padding is removed, per axis.
        let full: Vec<u64> = (0..sp)
            .map(|i| {
                let span = stride[i].checked_mul(input[i].checked_sub(1)?)?;
                span.checked_add(out_pad[i])?.checked_add(dil[i].checked_mul(kernel[i].checked_sub(1)?)?)?.checked_add(1)
            })
            .collect::<Option<_>>()
            .ok_or_else(|| cx.err(format!("input {input:?}, kernel {kernel:?}, strides {stride:?}, dilations {dil:?}: the output size overflows")))?;
        let explicit_out = cx.ints("output_shape").filter(|v| !v.is_empty());
        let auto = cx.string("auto_pad").unwrap_or_else(|| "NOTSET".into());
        let pads: Vec<(u64, u64)> = if let Some(os) = explicit_out.as_ref() {
            let os = &os[os.len().saturating_sub(sp)..];
            if os.len() != sp {
                return Err(cx.err(format!("output_shape {os:?}: {sp} spatial sizes expected")));
            }
            (0..sp)
                .map(|i| {
                    let total = (full[i] as i64) - os[i];
                    if total < 0 {
                        return Err(cx.err(format!("output_shape {os:?} is larger than the transposed convolution produces")));
                    }
                    let t = total as u64;
                    Ok(if auto == "SAME_LOWER" { (t - t / 2, t / 2) } else { (t / 2, t - t / 2) })
                })
                .collect::<Result<_>>()?
        } else {
            match auto.as_str() {
                "NOTSET" => {
                    let p = cx.ints("pads").unwrap_or_else(|| vec![0; 2 * sp]);
                    if p.len() != 2 * sp || p.iter().any(|&v| v < 0) {
                        return Err(cx.err(format!("pads {p:?}: {} non-negative values expected", 2 * sp)));
                    }
                    (0..sp).map(|i| (p[i] as u64, p[i + sp] as u64)).collect()
                }
                "VALID" => vec![(0, 0); sp],
                "SAME_UPPER" | "SAME_LOWER" => (0..sp)
                    .map(|i| {
                        let t = full[i].saturating_sub(input[i] * stride[i]);
                        if auto == "SAME_LOWER" { (t - t / 2, t / 2) } else { (t / 2, t - t / 2) }
                    })
                    .collect(),
                other => return Err(cx.err(format!("auto_pad '{other}' is not supported"))),
            }
        };
        // Kernel = stride, no overlap, nothing cropped (UNet's and FPN's k2 s2
        // up-convolutions): every input pixel writes its own k-block, so the
        // layer is a 1x1 convolution to o·k channels followed by a pixel
        // shuffle, a quarter of the spread form's work for k = s = 2.
        // (Its 3-D shuffle would need rank 8: 3-D takes the spread form.)
        let disjoint = g == 1
            && sp < 3
            && (0..sp).all(|i| kernel[i] == stride[i] && dil[i] == 1 && pads[i] == (0, 0) && out_pad[i] == 0)
            && bias.is_none_or(|b| self.konst(b).is_some());
        if disjoint {
            return self.conv_transpose_disjoint(cx, x, &wc, bias, [n, c, o], input, kernel);
        }
        // The spread, padded input of the equivalent direct convolution.
        let mut begin = vec![0u64; sx.len()];
        let mut end = vec![0u64; sx.len()];
        let mut step = vec![1u64; sx.len()];
        let mut spread = sx.clone();
        for i in 0..sp {
            let reach = dil[i] * (kernel[i] - 1);
            let (pb, pe) = pads[i];
            if pb > reach || pe > reach + out_pad[i] {
                return Err(cx.err(format!("pads {:?} exceed the kernel's reach {reach}: cropping is not supported", pads[i])));
            }
            begin[i + 2] = reach - pb;
            end[i + 2] = reach + out_pad[i] - pe;
            step[i + 2] = stride[i];
            spread[i + 2] = (input[i] - 1) * stride[i] + 1 + begin[i + 2] + end[i + 2];
        }
        if full.iter().zip(&pads).any(|(&f, &(pb, pe))| f <= pb + pe) {
            return Err(cx.err("the padding leaves an empty output"));
        }
        rank_ok(cx, &spread, "the spread input")?;
        cx.shape(shape::fold_limit(&spread))?;
        let dims: Vec<u64> = sx.clone();
        let xs = self.device_tmp(cx, Kind::Pad { x, value: 0.0, dims, begin, end, step }, spread.clone(), "spread");
        // Weights [c, og, k...] -> [o = g·og, c/g, k... flipped].
        let cg = c / g;
        let kvol = volume(kernel) as usize;
        let src = wc.floats();
        let mut wt = vec![0.0f32; src.len()];
        for gi in 0..g as usize {
            for ci in 0..cg as usize {
                for co in 0..og as usize {
                    let from = ((gi * cg as usize + ci) * og as usize + co) * kvol;
                    let to = ((gi * og as usize + co) * cg as usize + ci) * kvol;
                    for t in 0..kvol {
                        wt[to + kvol - 1 - t] = src[from + t];
                    }
                }
            }
        }
        let mut wshape = vec![o, cg];
        wshape.extend(kernel);
        let wv = self.constant(&format!("{}.flipped_weights", cx.name), Const::f32(&wshape, wt));
        if sp == 3 {
            return self.conv3d_with(cx, xs, wv, bias, g, &[1; 3], &dil, &[(0, 0); 3]);
        }
        let lift = |v: &[u64], one: u64| -> [u64; 2] { if sp == 1 { [one, v[0]] } else { [v[0], v[1]] } };
        let sin = lift(&spread[2..], 1);
        let k2 = lift(kernel, 1);
        let d2 = lift(&dil, 1);
        let kind = Kind::Conv {
            x: xs,
            w: wv,
            bias,
            dims: [n, c, sin[0], sin[1], o, k2[0], k2[1], g],
            stride: [1, 1],
            dilation: d2,
            pads: [0; 4],
            residual: None,
            act: Act::NONE,
            winograd: false,
        };
        let mut out = vec![n, o];
        for i in 0..sp {
            out.push(full[i] - pads[i].0 - pads[i].1);
        }
        Ok(self.device(cx, kind, out))
    }
}

/// A sliding window in 2-D (see `Importer::window`).
pub(super) struct Window {
    pub(super) input: [u64; 2],
    pub(super) kernel: [u64; 2],
    pub(super) stride: [u64; 2],
    pub(super) dilation: [u64; 2],
    /// (begin, end) per spatial axis.
    pub(super) pads: [(u64, u64); 2],
}

impl Window {
    /// Output height and width.
    pub(super) fn output(&self, cx: &Cx) -> Result<[u64; 2]> {
        let mut o = [0; 2];
        for (i, v) in o.iter_mut().enumerate() {
            *v = out_len(self.input[i], self.kernel[i], self.stride[i], self.dilation[i], self.pads[i])
                .ok_or_else(|| cx.err("the kernel is larger than the padded input"))?;
        }
        Ok(o)
    }
    /// Pads as the descriptors order them: top, left, bottom, right.
    pub(super) fn pad4(&self) -> [u64; 4] {
        [self.pads[0].0, self.pads[1].0, self.pads[0].1, self.pads[1].1]
    }
}

/// Output length of a sliding window; None when the window does not fit.
fn out_len(input: u64, k: u64, stride: u64, dil: u64, (pb, pe): (u64, u64)) -> Option<u64> {
    // Checked: hostile sizes must not overflow (they are refused).
    let span = input.checked_add(pb)?.checked_add(pe)?;
    let eff = dil.checked_mul(k.checked_sub(1)?)?.checked_add(1)?;
    Some(span.checked_sub(eff)?.checked_div(stride)? + 1)
}
