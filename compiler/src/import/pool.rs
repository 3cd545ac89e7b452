//! Pooling: max and average windows (POOL descriptors) and global pooling
//! (REDUCE).

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
        if !(s.len() == 3 || s.len() == 4) {
            return Err(cx.err(format!("input {s:?}: only 1-D and 2-D pooling (NCL / NCHW) is supported")));
        }
        if cx.int("storage_order", 0) != 0 {
            return Err(cx.err("storage_order=1 is not supported"));
        }
        let sp = s.len() - 2;
        let k = self.spatial_attr(cx, "kernel_shape", sp)?;
        if cx.ints("kernel_shape").is_none() {
            return Err(cx.err("kernel_shape is missing"));
        }
        let mut win = self.window(cx, &s[2..], &k)?;
        let include_pad = !max && cx.int("count_include_pad", 0) != 0;
        if cx.int("ceil_mode", 0) != 0 {
            // Ceil mode = extra padding at the end, so the last window fits;
            // windows that would start in the end padding are dropped.
            for i in 0..2 {
                let (inp, st, p) = (win.input[i], win.stride[i], &mut win.pads[i]);
                let span = inp + p.0 + p.1;
                let eff = win.dilation[i] * (win.kernel[i] - 1) + 1;
                if span < eff {
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
            }
        }
        let out_sp = win.output(cx)?;
        let kind = Kind::Pool {
            x, max, count_include_pad: include_pad,
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
