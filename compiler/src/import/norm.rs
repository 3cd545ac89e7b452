//! Normalisation and reductions: BatchNormalization (folded into an affine
//! op or the producing conv), LayerNormalization, InstanceNormalization and
//! GroupNormalization (a LAYERNORM over each group's elements, then a
//! per-channel scale and shift), Softmax, LogSoftmax, Hardmax, Reduce* and
//! TopK.

use super::*;

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &[
    "BatchNormalization", "Softmax", "LogSoftmax", "Hardmax", "LayerNormalization", "InstanceNormalization", "GroupNormalization", "ArgMax", "ArgMin", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
    "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "TopK",
];

impl Importer {
    pub(super) fn lower_norm(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let input = |i: usize| -> Result<ValueId> {
            ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")))
        };
        let opt = |i: usize| ins.get(i).copied().flatten();
        let op = cx.n.op_type.as_str();
        let v = match op {
            "BatchNormalization" => self.batch_norm(cx, ins)?,
            "Softmax" | "LogSoftmax" | "Hardmax" => {
                let x = input(0)?;
                let s = self.shape(x);
                let legacy = self.opset < 13;
                let a = cx.shape(shape::axis(cx.int("axis", if legacy { 1 } else { -1 }), s.len(), false))?;
                let dims = if legacy {
                    vec![volume(&s[..a]), volume(&s[a..]), 1]
                } else {
                    vec![volume(&s[..a]), s[a], volume(&s[a + 1..])]
                };
                if op == "Hardmax" {
                    self.hardmax(cx, x, dims)?
                } else {
                    self.device(cx, Kind::Softmax { x, dims, axis: 1, log: op == "LogSoftmax" }, s)
                }
            }
            "LayerNormalization" => {
                let x = input(0)?;
                let s = self.shape(x);
                let a = cx.shape(shape::axis(cx.int("axis", -1), s.len(), false))?;
                let (rows, cols) = (volume(&s[..a]), volume(&s[a..]));
                let gamma = input(1)?;
                let beta = opt(2);
                for (i, p) in [(1, Some(gamma)), (2, beta)] {
                    if let Some(p) = p {
                        if volume(&self.shape(p)) != cols {
                            return Err(cx.err(format!("input {i} has shape {:?}; {cols} elements (the normalised dims {:?}) expected", self.shape(p), &s[a..])));
                        }
                    }
                }
                self.device(cx, Kind::LayerNorm { x, gamma: Some(gamma), beta, rows, cols, eps: cx.float("epsilon", 1e-5), rms: false }, s)
            }
            "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare"
            | "ReduceLogSum" | "ReduceLogSumExp" => self.reduce(cx, ins)?,
            "InstanceNormalization" | "GroupNormalization" => self.group_norm(cx, ins)?,
            "ArgMax" | "ArgMin" => self.arg_extreme(cx, input(0)?)?,
            "TopK" => return self.top_k(cx, ins),
            _ => return Err(cx.err(format!("internal error: '{op}' is not a norm op"))),
        };
        Ok(vec![v])
    }

    /// `x − max − log Σ exp(x − max)` along axis 1 of the `[outer, len,
    /// inner]` view: finite wherever the inputs are (the log of a Softmax
    /// would be −inf where a probability underflows).
    /// 1 at the first maximum along axis 1 of the `[outer, len, inner]`
    /// view, 0 elsewhere: a REDUCE argmax and an EQUAL of the positions
    /// against it.
    fn hardmax(&mut self, cx: &Cx, x: ValueId, dims: Vec<u64>) -> Result<ValueId> {
        let s = self.shape(x);
        if dims[1] == 0 {
            return Ok(self.alias(cx, x));
        }
        let xv = self.reshaped(cx, x, dims.clone(), Some("rows"));
        let reduced = vec![dims[0], 1, dims[2]];
        let idx = self.device_tmp(cx, Kind::Reduce { kind: REDUCE_ARGMAX, x: xv, dims: dims.clone(), axis: 1 }, reduced, "index");
        let positions = self.constant(&format!("{}.positions", cx.name), Const::f32(&[1, dims[1], 1], (0..dims[1]).map(|i| i as f32).collect()));
        let y = self.elementwise(cx, Binary::Equal, positions, idx, Some("rows_out"))?;
        let y = self.reshaped(cx, y, s, Some("out"));
        Ok(self.alias(cx, y))
    }

    pub(super) fn batch_norm(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<ValueId> {
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let s = self.shape(x);
        if s.len() < 2 {
            return Err(cx.err(format!("input {s:?} has no channel axis")));
        }
        if cx.int("training_mode", 0) != 0 {
            return self.batch_norm_of_constant(cx, ins, x, &s);
        }
        let c = s[1];
        let p = (1..5).map(|i| self.channel_param(cx, ins, i, c)).collect::<Result<Vec<_>>>()?;
        let eps = cx.float("epsilon", 1e-5);
        // y = x * s + t with s = scale / sqrt(var + eps), t = bias - mean * s.
        let sc: Vec<f32> = (0..c as usize).map(|i| p[0][i] / (p[3][i] + eps).sqrt()).collect();
        let sh: Vec<f32> = (0..c as usize).map(|i| p[1][i] - p[2][i] * sc[i]).collect();
        self.channel_affine(cx, x, sc, sh, "shift")
    }

    /// BatchNormalization's constant input `i`: one value per channel.
    fn channel_param(&self, cx: &Cx, ins: &[Option<ValueId>], i: usize, c: u64) -> Result<Vec<f32>> {
        let v = ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")))?;
        let k = self.need_const(cx, v, i)?;
        if k.len() as u64 != c {
            return Err(cx.err(format!("input {i} has {} values for {c} channels", k.len())));
        }
        Ok(k.floats())
    }

    /// BatchNormalization in training mode normalises by the statistics of
    /// its own input: folded when that input is a constant (NFNets' and
    /// other weight-standardised convs normalise their weights so), refused
    /// otherwise. Population variance, as ONNX defines it; statistics in f64.
    fn batch_norm_of_constant(&mut self, cx: &Cx, ins: &[Option<ValueId>], x: ValueId, s: &[u64]) -> Result<ValueId> {
        let Some(xc) = self.konst(x).map(Const::floats) else {
            return Err(cx.err("training_mode=1 on a run-time input is not supported (inference only)"));
        };
        let (scale, bias) = (self.channel_param(cx, ins, 1, s[1])?, self.channel_param(cx, ins, 2, s[1])?);
        let c = s[1] as usize;
        let inner = volume(&s[2..]) as usize;
        let eps = cx.float("epsilon", 1e-5) as f64;
        let (mut sum, mut sq) = (vec![0f64; c], vec![0f64; c]);
        for (i, &v) in xc.iter().enumerate() {
            let ch = (i / inner.max(1)) % c;
            sum[ch] += v as f64;
            sq[ch] += v as f64 * v as f64;
        }
        let count = (xc.len() / c.max(1)).max(1) as f64;
        let y = xc
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let ch = (i / inner.max(1)) % c;
                let mean = sum[ch] / count;
                let var = (sq[ch] / count - mean * mean).max(0.0);
                (((v as f64 - mean) / (var + eps).sqrt()) * scale[ch] as f64 + bias[ch] as f64) as f32
            })
            .collect();
        Ok(self.constant(&Self::out_name(cx, 0), Const::f32(s, y)))
    }

    /// `x · scale[c] + shift[c]` over the channel axis 1 of `x`: two
    /// broadcasting BINARY ops (the shift constant is named `cx.name.tag`).
    fn channel_affine(&mut self, cx: &Cx, x: ValueId, scale: Vec<f32>, shift: Vec<f32>, tag: &str) -> Result<ValueId> {
        let s = self.shape(x);
        let mut cshape = vec![s[1]];
        cshape.extend(std::iter::repeat_n(1, s.len() - 2));
        let (sv, tv) = (
            self.constant(&format!("{}.scale", cx.name), Const::f32(&cshape, scale)),
            self.constant(&format!("{}.{tag}", cx.name), Const::f32(&cshape, shift)),
        );
        rank_ok(cx, &s, "the input")?;
        let padded = shape::pad_rank(&cshape, s.len());
        let t = self.device_tmp(cx, Kind::Binary { kind: Binary::Mul, a: x, b: sv, a_dims: s.clone(), b_dims: padded.clone(), act: Act::NONE }, s.clone(), "scaled");
        Ok(self.device(cx, Kind::Binary { kind: Binary::Add, a: t, b: tv, a_dims: s.clone(), b_dims: padded, act: Act::NONE }, s))
    }

    /// InstanceNormalization (one group per channel) and GroupNormalization:
    /// each (image, group) slice is normalised on its own, then scaled and
    /// shifted per channel.
    pub(super) fn group_norm(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<ValueId> {
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let s = self.shape(x);
        if s.len() < 3 {
            return Err(cx.err(format!("input {s:?}: N, C and spatial dims expected")));
        }
        let (n, c) = (s[0], s[1]);
        let instance = cx.n.op_type == "InstanceNormalization";
        let groups = if instance { c } else { cx.int("num_groups", 0).max(0) as u64 };
        if groups == 0 || c % groups != 0 {
            return Err(cx.err(format!("num_groups {groups} does not divide the {c} channels")));
        }
        if !instance && cx.int("stash_type", 1) != 1 {
            return Err(cx.err("stash_type other than float32 is not supported"));
        }
        // Scale and bias: per channel, or (GroupNormalization before opset
        // 21) per group, each group's value repeated over its channels.
        let mut affine = Vec::new();
        for i in [1, 2] {
            let v = ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")))?;
            let k = self.need_const(cx, v, i)?.floats();
            let per_channel: Vec<f32> = if k.len() as u64 == c {
                k
            } else if !instance && k.len() as u64 == groups && self.opset < 21 {
                (0..c as usize).map(|ch| k[ch / (c / groups) as usize]).collect()
            } else {
                return Err(cx.err(format!("input {i} has {} values; {c} (one per channel) expected", k.len())));
            };
            affine.push(per_channel);
        }
        let rows = n * groups;
        let cols = volume(&s[1..]) / groups;
        let eps = cx.float("epsilon", 1e-5);
        let normed = self.device_tmp(cx, Kind::LayerNorm { x, gamma: None, beta: None, rows, cols, eps, rms: false }, s, "normalized");
        let shift = affine.pop().unwrap_or_default();
        let scale = affine.pop().unwrap_or_default();
        self.channel_affine(cx, normed, scale, shift, "bias")
    }

    /// ArgMax / ArgMin: a REDUCE that writes the index as f32, then a CAST to
    /// the int64 ONNX gives it.
    pub(super) fn arg_extreme(&mut self, cx: &Cx, x: ValueId) -> Result<ValueId> {
        let s = self.shape(x);
        if s.is_empty() {
            return Err(cx.err("the input is a scalar"));
        }
        let a = cx.shape(shape::axis(cx.int("axis", 0), s.len(), false))?;
        if s[a] == 0 {
            return Err(cx.err(format!("axis {a} is empty")));
        }
        let last = cx.int("select_last_index", 0) != 0;
        let kind = match (cx.n.op_type == "ArgMax", last) {
            (true, false) => REDUCE_ARGMAX,
            (true, true) => REDUCE_ARGMAX_LAST,
            (false, false) => REDUCE_ARGMIN,
            (false, true) => REDUCE_ARGMIN_LAST,
        };
        let mut out = s.clone();
        if cx.int("keepdims", 1) != 0 {
            out[a] = 1;
        } else {
            out.remove(a);
        }
        let dims = vec![volume(&s[..a]), s[a], volume(&s[a + 1..])];
        let idx = self.device_tmp(cx, Kind::Reduce { kind, x, dims, axis: 1 }, out.clone(), "index");
        Ok(self.device(cx, Kind::Cast { x: idx, from: DType::F32, to: DType::I64 }, out))
    }

    /// TopK as one TOPK over the `[outer, len, inner]` view, writing the
    /// values and then the indices (as f32) into one `[2, outer, k,
    /// inner]` buffer; a copy takes out each half, and the indices are
    /// cast to int64. Sorted output, ties in index order as ONNX requires
    /// (also for `sorted=0`, which allows any order).
    fn top_k(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let s = self.shape(x);
        if s.is_empty() {
            return Err(cx.err("the input is a scalar"));
        }
        let a = cx.shape(shape::axis(cx.int("axis", -1), s.len(), false))?;
        let k = if self.opset < 10 {
            cx.int("k", -1)
        } else {
            let kv = ins.get(1).copied().flatten().ok_or_else(|| cx.err("input 1 (K) is missing"))?;
            match self.const_ints(cx, kv, 1)?.as_slice() {
                [k] => *k,
                other => return Err(cx.err(format!("K {other:?}: one value expected"))),
            }
        };
        let len = s[a];
        if k < 0 || k as u64 > len {
            return Err(cx.err(format!("k {k}: 0..={len} (the length of axis {a}) expected")));
        }
        let k = k as u64;
        if len > TOPK_MAX_LEN as u64 {
            return Err(cx.err(format!("axis {a} has {len} elements; at most 2^24 (indices are computed in f32)")));
        }
        let largest = cx.int("largest", 1) != 0;
        let (outer, inner) = (volume(&s[..a]), volume(&s[a + 1..]));
        let mut out = s.clone();
        out[a] = k;
        if k == 0 {
            let empty = |me: &mut Self, i: usize, c: Const| me.constant(&Self::out_name(cx, i), c);
            return Ok(vec![empty(self, 0, Const::f32(&out, vec![])), empty(self, 1, Const::i64(&out, vec![]))]);
        }
        let n = outer * k * inner;
        let both = self.device_tmp(cx, Kind::TopK { x, outer, len, inner, k, largest }, vec![2, n], "values_and_indices");
        let half = |at: u64| vec![CopyPart { src: both, src_offset: at * n, dst_offset: 0, sizes: vec![n], src_strides: vec![1], dst_strides: vec![1] }];
        let vals = self.device_out(cx, 0, Kind::Copy { parts: half(0) }, out.clone());
        let idx = self.device_tmp(cx, Kind::Copy { parts: half(1) }, out.clone(), "indices_f32");
        let idx = self.device_out(cx, 1, Kind::Cast { x: idx, from: DType::F32, to: DType::I64 }, out);
        Ok(vec![vals, idx])
    }

    pub(super) fn reduce(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<ValueId> {
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let s = self.shape(x);
        let op = cx.n.op_type.as_str();
        let axes_from_input = self.opset >= 18 || (op == "ReduceSum" && self.opset >= 13);
        let axes = if axes_from_input {
            match ins.get(1).copied().flatten() {
                Some(v) => Some(self.const_ints(cx, v, 1)?),
                None => None,
            }
        } else {
            cx.ints("axes")
        };
        let keep = cx.int("keepdims", 1) != 0;
        // ReduceL1, ReduceL2, ReduceSumSquare and ReduceLogSum run as a sum
        // between element-wise ops (|x| or x·x before, sqrt or log after).
        let device = matches!(op, "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum");
        let mut axes: Vec<usize> = match axes {
            Some(a) if !a.is_empty() => a.iter().map(|&v| cx.shape(shape::axis(v, s.len(), false))).collect::<Result<_>>()?,
            // No reduction. On constants each element is reduced alone
            // (ReduceSumSquare squares it, as onnxruntime does).
            _ if cx.int("noop_with_empty_axes", 0) != 0 => {
                if device && self.konst(x).is_none() {
                    return Ok(self.alias(cx, x));
                }
                let c = self.need_const(cx, x, 0)?;
                let c = cx.shape(fold::reduce(op, &c, &[], true))?;
                return Ok(self.constant(&Self::out_name(cx, 0), c));
            }
            _ => (0..s.len()).collect(),
        };
        axes.sort_unstable();
        axes.dedup();
        if !device || self.konst(x).is_some() {
            let c = self.need_const(cx, x, 0)?;
            let c = cx.shape(fold::reduce(op, &c, &axes, keep))?;
            return Ok(self.constant(&Self::out_name(cx, 0), c));
        }
        let out: Vec<u64> = if keep {
            s.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect()
        } else {
            s.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect()
        };
        let kind = match op {
            "ReduceMean" => REDUCE_MEAN,
            "ReduceMax" => REDUCE_MAX,
            "ReduceMin" => REDUCE_MIN,
            _ => REDUCE_SUM,
        };
        let x = match op {
            "ReduceL1" => self.device_tmp(cx, Kind::Unary { kind: Unary::Abs, x, p0: 0.0, p1: 0.0 }, s.clone(), "abs"),
            "ReduceL2" | "ReduceSumSquare" => {
                let sq = Kind::Binary { kind: Binary::Mul, a: x, b: x, a_dims: s.clone(), b_dims: s.clone(), act: Act::NONE };
                self.device_tmp(cx, sq, s.clone(), "square")
            }
            _ => x,
        };
        let post = match op {
            "ReduceL2" => Some(Unary::Sqrt),
            "ReduceLogSum" => Some(Unary::Log),
            _ => None,
        };
        // Runs of adjacent axes reduce in one op ([outer, run, inner]),
        // last run first so the earlier axes keep their positions.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for &a in &axes {
            match runs.last_mut() {
                Some(r) if r.1 + 1 == a => r.1 = a,
                _ => runs.push((a, a)),
            }
        }
        let mut cur = s.clone();
        let mut v = x;
        for (i, &(a0, a1)) in runs.iter().enumerate().rev() {
            let dims = vec![volume(&cur[..a0]), volume(&cur[a0..=a1]), volume(&cur[a1 + 1..])];
            cur.drain(a0..=a1);
            let k = Kind::Reduce { kind, x: v, dims, axis: 1 };
            v = if i == 0 && post.is_none() {
                self.device(cx, k, out.clone())
            } else {
                self.device_tmp(cx, k, if i == 0 { out.clone() } else { cur.clone() }, &format!("axis{a0}"))
            };
        }
        if let Some(f) = post {
            v = self.device(cx, Kind::Unary { kind: f, x: v, p0: 0.0, p1: 0.0 }, out);
        }
        Ok(v)
    }
}
