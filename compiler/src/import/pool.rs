//! Pooling: max and average windows (POOL descriptors) and global pooling
//! (REDUCE).

use super::conv::Window;
use super::*;

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &[
    "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
];

impl Importer {
    pub(super) fn lower_pool(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let input = |i: usize| -> Result<ValueId> {
            ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")))
        };
        let op = cx.n.op_type.as_str();
        let v = match op {
            // MaxPool's Indices output is not produced: a node reading it
            // fails with "output 1 of node ... which rbln-compile does not
            // produce".
            "MaxPool" | "AveragePool" => self.pool(cx, input(0)?, op == "MaxPool")?,
            "GlobalAveragePool" | "GlobalMaxPool" => {
                let x = input(0)?;
                let s = self.shape(x);
                if s.len() < 3 {
                    return Err(cx.err(format!("input has shape {s:?}; N, C and spatial dims expected")));
                }
                let nc = s[0] * s[1];
                let sp = volume(&s[2..]);
                let mut out = s[..2].to_vec();
                out.extend(std::iter::repeat_n(1, s.len() - 2));
                let kind = if op == "GlobalMaxPool" { REDUCE_MAX } else { REDUCE_MEAN };
                self.device(cx, Kind::Reduce { kind, x, dims: vec![nc, sp, 1], axis: 1 }, out)
            }
            _ => return Err(cx.err(format!("internal error: '{op}' is not a pool op"))),
        };
        Ok(vec![v])
    }

    pub(super) fn pool(&mut self, cx: &Cx, x: ValueId, max: bool) -> Result<ValueId> {
        let s = self.shape(x);
        if !(3..=5).contains(&s.len()) {
            return Err(cx.err(format!("input {s:?}: only 1-D, 2-D and 3-D pooling (NCL / NCHW / NCDHW) is supported")));
        }
        if cx.int("storage_order", 0) != 0 {
            return Err(cx.err("storage_order=1 is not supported"));
        }
        if s.len() == 5 {
            return self.pool3d(cx, x, max);
        }
        let sp = s.len() - 2;
        let k = self.spatial_attr(cx, "kernel_shape", sp)?;
        if cx.ints("kernel_shape").is_none() {
            return Err(cx.err("kernel_shape is missing"));
        }
        let mut win = self.window(cx, &s[2..], &k)?;
        let include_pad = !max && cx.int("count_include_pad", 0) != 0;
        if cx.int("ceil_mode", 0) != 0 {
            for i in 0..2 {
                ceil_mode_pad(cx, win.input[i], &mut win.kernel[i], win.stride[i], win.dilation[i], &mut win.pads[i], include_pad)?;
            }
        }
        let out_sp = win.output(cx)?;
        let kind = Kind::Pool {
            x, max, count_include_pad: include_pad, int8: None,
            dims: [s[0], s[1], win.input[0], win.input[1]],
            kernel: win.kernel,
            stride: win.stride,
            dilation: win.dilation,
            pads: win.pad4(),
        };
        let mut out = vec![s[0], s[1]];
        out.extend(&out_sp[2 - sp..]);
        Ok(self.device(cx, kind, out))
    }
}

impl Importer {
    /// 3-D pooling (NCDHW) as two 2-D ones, which is exact because both
    /// reductions are separable: over (H, W) on the [N, C·D, H, W] view,
    /// then over D on the [N·C, 1, D, H'·W'] view with a (kD, 1) window.
    /// (An average that leaves out the padding divides by the valid count
    /// per axis, whose product is the 3-D window's count.)
    fn pool3d(&mut self, cx: &Cx, x: ValueId, max: bool) -> Result<ValueId> {
        let s = self.shape(x);
        if cx.ints("kernel_shape").is_none() {
            return Err(cx.err("kernel_shape is missing"));
        }
        let mut k = self.spatial_attr(cx, "kernel_shape", 3)?;
        let stride = self.spatial_attr(cx, "strides", 3)?;
        let dil = self.spatial_attr(cx, "dilations", 3)?;
        let mut pads = self.pads(cx, &s[2..], &k, &stride, &dil)?;
        let include_pad = !max && cx.int("count_include_pad", 0) != 0;
        if cx.int("ceil_mode", 0) != 0 {
            for a in 0..3 {
                ceil_mode_pad(cx, s[2 + a], &mut k[a], stride[a], dil[a], &mut pads[a], include_pad)?;
            }
        }
        let (n, c, d, h, w) = (s[0], s[1], s[2], s[3], s[4]);
        let too_big = || cx.err(format!("input {s:?}: sizes overflow"));
        let planes = c.checked_mul(d).ok_or_else(too_big)?;
        let hw = Window { input: [h, w], kernel: [k[1], k[2]], stride: [stride[1], stride[2]], dilation: [dil[1], dil[2]], pads: [pads[1], pads[2]] };
        let [oh, ow] = hw.output(cx)?;
        let depth = Window { input: [d, oh * ow], kernel: [k[0], 1], stride: [stride[0], 1], dilation: [dil[0], 1], pads: [pads[0], (0, 0)] };
        let [od, _] = depth.output(cx)?;
        let frames = self.reshaped(cx, x, vec![n, planes, h, w], Some("frames"));
        let kind = Kind::Pool {
            x: frames, max, count_include_pad: include_pad, int8: None,
            dims: [n, planes, h, w],
            kernel: hw.kernel, stride: hw.stride, dilation: hw.dilation, pads: hw.pad4(),
        };
        let y = self.device_tmp(cx, kind, vec![n, planes, oh, ow], "per_frame");
        let nc = n.checked_mul(c).ok_or_else(too_big)?;
        let y = self.reshaped(cx, y, vec![nc, 1, d, oh * ow], Some("depth_rows"));
        let kind = Kind::Pool {
            x: y, max, count_include_pad: include_pad, int8: None,
            dims: [nc, 1, d, oh * ow],
            kernel: depth.kernel, stride: depth.stride, dilation: depth.dilation, pads: depth.pad4(),
        };
        let y = self.device_tmp(cx, kind, vec![nc, 1, od, oh * ow], "over_depth");
        let y = self.reshaped(cx, y, vec![n, c, od, oh, ow], Some("out"));
        Ok(self.alias(cx, y))
    }
}

/// Ceil mode on one axis: extra padding at the end, so the last window
/// fits; windows that would start in the end padding are dropped. A
/// window longer than the padded input by less than a stride still makes
/// one output (HF EfficientNet's pooler: a 1280-wide window over 7x7):
/// its window is the whole padded input, so the kernel shrinks to that.
fn ceil_mode_pad(cx: &Cx, inp: u64, k: &mut u64, st: u64, dil: u64, p: &mut (u64, u64), include_pad: bool) -> Result<()> {
    let too_big = || cx.err("the window's sizes overflow");
    let span = inp.checked_add(p.0).and_then(|v| v.checked_add(p.1)).ok_or_else(too_big)?;
    let eff = dil.checked_mul(k.saturating_sub(1)).and_then(|v| v.checked_add(1)).ok_or_else(too_big)?;
    if span < eff {
        if dil == 1 && eff - span < st {
            *k = span;
            return Ok(());
        }
        return Err(cx.err("the kernel is larger than the padded input"));
    }
    let mut out = (span - eff).div_ceil(st) + 1;
    if (out - 1) * st >= inp + p.0 {
        out -= 1;
    }
    let extra = ((out - 1) * st + eff).saturating_sub(span);
    if extra > 0 && include_pad {
        return Err(cx.err("ceil_mode=1 with count_include_pad=1 is not supported"));
    }
    p.1 += extra;
    Ok(())
}
