//! Convolutions (1-D and 2-D, groups, dilation, auto_pad), lowered to CONV2D
//! descriptors, and the sliding-window geometry pooling shares.

use super::*;

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &[
    "Conv",
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
        if !(sx.len() == 3 || sx.len() == 4) || sw.len() != sx.len() {
            return Err(cx.err(format!("input {sx:?} / weights {sw:?}: only 1-D and 2-D convolution (NCL / NCHW) is supported")));
        }
        let g = cx.int("group", 1).max(1) as u64;
        let (n, c, o) = (sx[0], sx[1], sw[0]);
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
        let win = self.window(cx, &sx[2..], &sw[2..])?;
        let out_sp = win.output(cx)?;
        let kind = Kind::Conv {
            x, w, bias,
            dims: [n, c, win.input[0], win.input[1], o, win.kernel[0], win.kernel[1], g],
            stride: win.stride,
            dilation: win.dilation,
            pads: win.pad4(),
            residual: None,
            act: Act::NONE,
        };
        let mut out = vec![n, o];
        out.extend(&out_sp[2 - (sx.len() - 2)..]);
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
    let span = input + pb + pe;
    let eff = dil * (k.checked_sub(1)?) + 1;
    Some(span.checked_sub(eff)? / stride + 1)
}
