//! Ops that move or reinterpret data: views (Reshape, Flatten, Squeeze,
//! Unsqueeze, Identity, Dropout, same-type Cast), Cast between run-time
//! types, Transpose, Concat, Slice, Split, Expand and constant Pad.

use super::*;

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &[
    "Identity", "Dropout", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "DepthToSpace", "SpaceToDepth", "Tile",
    "Concat", "Slice", "Split", "Expand", "Pad",
];

impl Importer {
    pub(super) fn lower_layout(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let input = |i: usize| -> Result<ValueId> {
            ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")))
        };
        let opt = |i: usize| ins.get(i).copied().flatten();
        let op = cx.n.op_type.as_str();
        let v = match op {
            "Identity" | "Dropout" | "Cast" | "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => self.view_op(cx, ins)?,
            "Transpose" => {
                let x = input(0)?;
                let s = self.shape(x);
                let perm: Vec<usize> = match cx.ints("perm") {
                    Some(p) => p.iter().map(|&a| cx.shape(shape::axis(a, s.len(), false))).collect::<Result<_>>()?,
                    None => (0..s.len()).rev().collect(),
                };
                let mut seen = perm.clone();
                seen.sort_unstable();
                if seen != (0..s.len()).collect::<Vec<_>>() {
                    return Err(cx.err(format!("perm {perm:?} is not a permutation of the {} axes", s.len())));
                }
                self.permuted(cx, x, &perm, None)?
            }
            "Concat" => self.concat(cx, ins)?,
            "Slice" => {
                let x = input(0)?;
                let s = self.shape(x);
                let (starts, ends, axes, steps) = if self.opset < 10 {
                    (cx.ints("starts").unwrap_or_default(), cx.ints("ends").unwrap_or_default(), cx.ints("axes"), None)
                } else {
                    let get = |me: &Self, i: usize| -> Result<Option<Vec<i64>>> { opt(i).map(|v| me.const_ints(cx, v, i)).transpose() };
                    (get(self, 1)?.unwrap_or_default(), get(self, 2)?.unwrap_or_default(), get(self, 3)?, get(self, 4)?)
                };
                let b = cx.shape(shape::slice(&s, &starts, &ends, axes.as_deref(), steps.as_deref()))?;
                let mut y = self.slice_out(cx, 0, x, &b.out, &b.start, &b.step)?;
                // Negative steps: the ascending box, then flipped along
                // each such axis by a Gather of the reversed positions.
                for (a, _) in b.reversed.iter().enumerate().filter(|(a, &r)| r && b.out[*a] > 1) {
                    let n = b.out[a] as i64;
                    y = self.gather_const(cx, y, &[n as u64], (0..n).rev().collect(), a)?;
                }
                y
            }
            "Split" => return self.split(cx, ins),
            "Expand" => {
                let x = input(0)?;
                let s = self.shape(x);
                let spec = self.const_ints(cx, input(1)?, 1)?;
                let spec: Vec<u64> = spec.iter().map(|&d| d.max(0) as u64).collect();
                let out = cx.shape(shape::broadcast(&s, &spec))?;
                self.broadcast_to(cx, x, out, None)?
            }
            "Pad" => self.pad(cx, ins)?,
            "DepthToSpace" | "SpaceToDepth" => self.depth_space(cx, input(0)?)?,
            "Tile" => self.tile(cx, input(0)?, input(1)?)?,
            _ => return Err(cx.err(format!("internal error: '{op}' is not a layout op"))),
        };
        Ok(vec![v])
    }

    /// `x` repeated along its size-1 (or missing leading) axes to `to`, a
    /// shape it broadcasts to: folded on a constant, a view when nothing
    /// repeats, else one broadcasting copy.
    pub(super) fn broadcast_to(&mut self, cx: &Cx, x: ValueId, to: Vec<u64>, tag: Option<&str>) -> Result<ValueId> {
        let s = self.shape(x);
        let src_strides = shape::broadcast_strides(&s, &to);
        if let Some(c) = self.konst(x) {
            cx.shape(shape::fold_limit(&to))?;
            let c = fold::pick(c, &shape::box_indices(&to, &src_strides, 0), &to);
            return Ok(self.result_const(cx, tag, c));
        }
        if to == s {
            return Ok(self.result(cx, tag, Kind::View { x }, to));
        }
        rank_ok(cx, &to, "the broadcast result")?;
        let part = CopyPart { src: x, src_offset: 0, dst_offset: 0, dst_strides: strides(&to), sizes: to.clone(), src_strides };
        Ok(self.result(cx, tag, Kind::Copy { parts: vec![part] }, to))
    }

    /// Ops that only reinterpret (or, for constants, convert) a tensor.
    pub(super) fn view_op(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<ValueId> {
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let s = self.shape(x);
        let op = cx.n.op_type.as_str();
        let axes = |me: &Self| -> Result<Option<Vec<i64>>> {
            if me.opset < 13 {
                Ok(cx.ints("axes"))
            } else {
                ins.get(1).copied().flatten().map(|v| me.const_ints(cx, v, 1)).transpose()
            }
        };
        let out = match op {
            "Identity" => s.clone(),
            "Dropout" => {
                if let Some(t) = ins.get(2).copied().flatten() {
                    if self.konst(t).is_none_or(|c| c.ints().iter().any(|&b| b != 0)) {
                        return Err(cx.err("training_mode must be a constant false"));
                    }
                }
                s.clone()
            }
            "Cast" => {
                let to = cx.int("to", elem::FLOAT as i64) as i32;
                if let Some(c) = self.konst(x) {
                    let c = cx.shape(fold::cast(c, to))?;
                    return Ok(self.constant(&Self::out_name(cx, 0), c));
                }
                // Run-time floating-point values are computed in float32, as
                // compile-time ones are held: a cast to float64 (Deformable
                // DETR's sampling offsets) or float16 is one to float32.
                let to = if matches!(to, elem::DOUBLE | elem::FLOAT16 | elem::BFLOAT16) { elem::FLOAT } else { to };
                let to = run_time_dtype(to).ok_or_else(|| {
                    cx.err(format!("casts a run-time tensor to {}; run-time tensors are float32, int32, int64 or bool", elem::name(to)))
                })?;
                let from = self.g.values[x].dtype;
                if from != to {
                    return Ok(self.device(cx, Kind::Cast { x, from, to }, s));
                }
                s.clone()
            }
            "Reshape" => {
                let spec = if self.opset < 5 { cx.ints("shape").unwrap_or_default() } else {
                    let v = ins.get(1).copied().flatten().ok_or_else(|| cx.err("input 1 (shape) is missing"))?;
                    self.const_ints(cx, v, 1)?
                };
                cx.shape(shape::reshape(&s, &spec, cx.int("allowzero", 0) != 0))?
            }
            "Flatten" => {
                let a = cx.shape(shape::axis(cx.int("axis", 1), s.len(), true))?;
                vec![volume(&s[..a]), volume(&s[a..])]
            }
            "Squeeze" => match axes(self)? {
                None => s.iter().copied().filter(|&d| d != 1).collect(),
                Some(ax) => {
                    let mut drop = vec![false; s.len()];
                    for a in ax {
                        let a = cx.shape(shape::axis(a, s.len(), false))?;
                        if s[a] != 1 {
                            return Err(cx.err(format!("axis {a} has size {}, not 1", s[a])));
                        }
                        drop[a] = true;
                    }
                    s.iter().zip(&drop).filter(|(_, &d)| !d).map(|(&v, _)| v).collect()
                }
            },
            _ => {
                // Unsqueeze
                let ax = axes(self)?.ok_or_else(|| cx.err("axes are missing"))?;
                let r = s.len() + ax.len();
                let mut at = vec![false; r];
                for a in ax {
                    let a = cx.shape(shape::axis(a, r, false))?;
                    if at[a] {
                        return Err(cx.err(format!("axis {a} is repeated")));
                    }
                    at[a] = true;
                }
                let mut it = s.iter();
                at.iter().map(|&one| if one { 1 } else { *it.next().unwrap_or(&1) }).collect()
            }
        };
        Ok(match self.konst(x).cloned() {
            Some(mut c) => {
                c.shape = out;
                self.constant(&Self::out_name(cx, 0), c)
            }
            None => self.device(cx, Kind::View { x }, out),
        })
    }

    /// clip(alpha * x + beta, 0, 1); the node's output when `last`.
    pub(super) fn pad(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<ValueId> {
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let s = self.shape(x);
        let r = s.len();
        let mode = cx.string("mode").unwrap_or_else(|| "constant".into());
        if !matches!(mode.as_str(), "constant" | "reflect" | "edge") {
            return Err(cx.err(format!("mode '{mode}' is not supported (constant, reflect and edge are)")));
        }
        let (pads, value, axes) = if self.opset < 11 {
            (cx.ints("pads").ok_or_else(|| cx.err("pads are missing"))?, cx.float("value", 0.0), None)
        } else {
            let pads = self.const_ints(cx, ins.get(1).copied().flatten().ok_or_else(|| cx.err("input 1 (pads) is missing"))?, 1)?;
            let value = match ins.get(2).copied().flatten() {
                Some(v) => self.konst(v).and_then(Const::scalar).ok_or_else(|| cx.err("constant_value must be a one-element constant"))?,
                None => 0.0,
            };
            let axes = ins.get(3).copied().flatten().map(|v| self.const_ints(cx, v, 3)).transpose()?;
            (pads, value, axes)
        };
        let axes: Vec<usize> = match axes {
            Some(a) => a.iter().map(|&v| cx.shape(shape::axis(v, r, false))).collect::<Result<_>>()?,
            None => (0..r).collect(),
        };
        if pads.len() != 2 * axes.len() {
            return Err(cx.err(format!("{} pads for {} axes", pads.len(), axes.len())));
        }
        // Negative pads crop: a slice first, then the non-negative pads.
        let (mut crop_b, mut crop_e) = (vec![0u64; r], vec![0u64; r]);
        let (mut begin, mut end) = (vec![0u64; r], vec![0u64; r]);
        for (i, &a) in axes.iter().enumerate() {
            let (pb, pe) = (pads[i], pads[i + axes.len()]);
            (crop_b[a], begin[a]) = if pb < 0 { (pb.unsigned_abs(), 0) } else { (0, pb as u64) };
            (crop_e[a], end[a]) = if pe < 0 { (pe.unsigned_abs(), 0) } else { (0, pe as u64) };
            if crop_b[a].saturating_add(crop_e[a]) >= s[a].max(1) && (crop_b[a] | crop_e[a]) != 0 {
                return Err(cx.err(format!("pads {pads:?} crop all of axis {a} (size {})", s[a])));
            }
        }
        let (x, s) = if crop_b.iter().chain(&crop_e).any(|&c| c != 0) {
            let kept: Vec<u64> = (0..r).map(|a| s[a] - crop_b[a] - crop_e[a]).collect();
            let only_crop = begin.iter().chain(&end).all(|&p| p == 0);
            let cropped = if only_crop {
                self.slice_out(cx, 0, x, &kept, &crop_b, &vec![1; r])?
            } else {
                let part = self.box_part(x, &kept, &crop_b, &vec![1; r]);
                self.device_tmp(cx, Kind::Copy { parts: vec![part] }, kept.clone(), "cropped")
            };
            if only_crop {
                return Ok(cropped);
            }
            (cropped, kept)
        } else {
            (x, s)
        };
        if mode != "constant" {
            return self.pad_by_copies(cx, x, &s, &begin, &end, mode == "reflect");
        }
        let out: Vec<u64> = (0..r).map(|i| s[i].saturating_add(begin[i]).saturating_add(end[i])).collect();
        if let Some(c) = self.konst(x) {
            cx.shape(shape::fold_limit(&out))?;
            let st = strides(&out);
            let at: u64 = begin.iter().zip(&st).map(|(b, s)| b * s).sum();
            let mut v = vec![value; volume(&out) as usize];
            for (src, dst) in c.floats().into_iter().zip(shape::box_indices(&s, &st, at)) {
                v[dst] = src;
            }
            return Ok(self.constant(&Self::out_name(cx, 0), Const::f32(&out, v)));
        }
        if out == s {
            return Ok(self.device(cx, Kind::View { x }, s));
        }
        rank_ok(cx, &out, "the output")?;
        let step = vec![1; r];
        Ok(self.device(cx, Kind::Pad { x, value, dims: s, begin, end, step }, out))
    }

    /// Reflect / edge padding: one copy per padded axis, made of the
    /// unchanged block and one slab per padding position (the element it
    /// mirrors, or the edge element). Reflect pads must be shorter than
    /// their axis.
    fn pad_by_copies(&mut self, cx: &Cx, x: ValueId, s: &[u64], begin: &[u64], end: &[u64], reflect: bool) -> Result<ValueId> {
        let mut cur = x;
        let mut shape = s.to_vec();
        let padded: Vec<usize> = (0..s.len()).filter(|&a| begin[a] + end[a] > 0).collect();
        if padded.is_empty() {
            return Ok(self.alias(cx, x));
        }
        for (n, &a) in padded.iter().enumerate() {
            let (size, pb, pe) = (shape[a], begin[a], end[a]);
            if reflect && (pb >= size || pe >= size) {
                return Err(cx.err(format!("reflect pads ({pb}, {pe}) on axis {a} of size {size}: each must be smaller than the axis")));
            }
            if pb + pe > 1024 {
                return Err(cx.err(format!("pads ({pb}, {pe}) on axis {a}: at most 1024 in reflect or edge mode")));
            }
            let (outer, inner) = (volume(&shape[..a]), volume(&shape[a + 1..]));
            let out_len = size + pb + pe;
            let slab = |src_i: u64, dst_i: u64| CopyPart {
                src: cur,
                src_offset: src_i * inner,
                dst_offset: dst_i * inner,
                sizes: vec![outer, inner],
                src_strides: vec![size * inner, 1],
                dst_strides: vec![out_len * inner, 1],
            };
            let mut parts = vec![CopyPart {
                src: cur,
                src_offset: 0,
                dst_offset: pb * inner,
                sizes: vec![outer, size * inner],
                src_strides: vec![size * inner, 1],
                dst_strides: vec![out_len * inner, 1],
            }];
            for j in 0..pb {
                parts.push(slab(if reflect { j + 1 } else { 0 }, pb - 1 - j));
            }
            for j in 0..pe {
                parts.push(slab(if reflect { size - 2 - j } else { size - 1 }, pb + size + j));
            }
            shape[a] = out_len;
            rank_ok(cx, &shape, "the output")?;
            cur = if n + 1 == padded.len() {
                self.device(cx, Kind::Copy { parts }, shape.clone())
            } else {
                self.device_tmp(cx, Kind::Copy { parts }, shape.clone(), &format!("padded{a}"))
            };
        }
        Ok(cur)
    }

    /// DepthToSpace (DCR and CRD) and SpaceToDepth: a rank-6 reshape, a
    /// transpose and a reshape back (views around one TRANSPOSE).
    pub(super) fn depth_space(&mut self, cx: &Cx, x: ValueId) -> Result<ValueId> {
        let s = self.shape(x);
        if s.len() != 4 {
            return Err(cx.err(format!("input {s:?}: NCHW expected")));
        }
        let b = cx.int("blocksize", 0);
        if !(1..=1 << 16).contains(&b) {
            return Err(cx.err(format!("blocksize {b} must be in 1..=65536")));
        }
        let b = b as u64;
        let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
        let (split, perm, out): (Vec<u64>, [usize; 6], Vec<u64>) = if cx.n.op_type == "DepthToSpace" {
            if c % (b * b) != 0 {
                return Err(cx.err(format!("{c} channels are not a multiple of blocksize² = {}", b * b)));
            }
            let co = c / (b * b);
            let grown = |d: u64| d.checked_mul(b).ok_or_else(|| cx.err(format!("{d} x blocksize {b} overflows")));
            let out = vec![n, co, grown(h)?, grown(w)?];
            match cx.string("mode").as_deref().unwrap_or("DCR") {
                "DCR" => (vec![n, b, b, co, h, w], [0, 3, 4, 1, 5, 2], out),
                "CRD" => (vec![n, co, b, b, h, w], [0, 1, 4, 2, 5, 3], out),
                m => return Err(cx.err(format!("mode '{m}' is not supported (DCR or CRD)"))),
            }
        } else {
            if h % b != 0 || w % b != 0 {
                return Err(cx.err(format!("height {h} and width {w} must be multiples of blocksize {b}")));
            }
            (vec![n, c, h / b, b, w / b, b], [0, 3, 5, 1, 2, 4], vec![n, c * b * b, h / b, w / b])
        };
        let v = self.reshaped(cx, x, split, Some("split"));
        let t = self.permuted(cx, v, &perm, Some("moved"))?;
        Ok(self.reshaped(cx, t, out, None))
    }

    /// Tile: folded on constants; at run time one STRIDED_COPY whose box
    /// has, for every repeated axis, a repeat dimension (source stride 0)
    /// before the axis itself.
    pub(super) fn tile(&mut self, cx: &Cx, x: ValueId, reps: ValueId) -> Result<ValueId> {
        let r = self.need_const(cx, reps, 1)?;
        if let Some(c) = self.konst(x).cloned() {
            let c = cx.shape(fold::tile(&c, &r))?;
            return Ok(self.constant(&Self::out_name(cx, 0), c));
        }
        let s = self.shape(x);
        let reps = r.ints();
        if reps.len() != s.len() || reps.iter().any(|&k| k < 0) {
            return Err(cx.err(format!("repeats {reps:?}: {} non-negative counts expected", s.len())));
        }
        let out: Vec<u64> = s.iter().zip(&reps).map(|(&d, &k)| d * k as u64).collect();
        if out == s {
            return Ok(self.device(cx, Kind::View { x }, out));
        }
        let (src_st, dst_st) = (strides(&s), strides(&out));
        let (mut sizes, mut src_strides, mut dst_strides) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..s.len() {
            if reps[i] > 1 {
                sizes.push(reps[i] as u64);
                src_strides.push(0);
                dst_strides.push(s[i] * dst_st[i]);
            }
            sizes.push(s[i]);
            src_strides.push(src_st[i]);
            dst_strides.push(dst_st[i]);
        }
        if sizes.len() > MAX_RANK {
            return Err(cx.err(format!("repeating {} axes of a rank-{} input needs a copy of rank {} (at most {MAX_RANK})", sizes.len() - s.len(), s.len(), sizes.len())));
        }
        let part = CopyPart { src: x, src_offset: 0, dst_offset: 0, sizes, src_strides, dst_strides };
        Ok(self.device(cx, Kind::Copy { parts: vec![part] }, out))
    }

    pub(super) fn concat(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<ValueId> {
        let xs: Vec<ValueId> = ins.iter().flatten().copied().collect();
        let first = *xs.first().ok_or_else(|| cx.err("no inputs"))?;
        let s0 = self.shape(first);
        let a = cx.shape(shape::axis(cx.int("axis", 0), s0.len(), false))?;
        let mut out = s0.clone();
        out[a] = 0;
        for &x in &xs {
            let s = self.shape(x);
            if s.len() != s0.len() || s.iter().enumerate().any(|(i, &d)| i != a && d != s0[i]) {
                return Err(cx.err(format!("input shapes {s0:?} and {s:?} do not concatenate on axis {a}")));
            }
            out[a] += s[a];
        }
        if xs.iter().all(|&x| self.konst(x).is_some()) {
            let cs: Vec<&Const> = xs.iter().map(|&x| self.konst(x).expect("checked")).collect();
            let c = fold::concat(&cs, a, &out);
            return Ok(self.constant(&Self::out_name(cx, 0), c));
        }
        let (outer, inner) = (volume(&out[..a]), volume(&out[a + 1..]));
        let mut parts = Vec::new();
        let mut at = 0;
        for &x in &xs {
            let len = self.shape(x)[a];
            if len > 0 {
                parts.push(CopyPart {
                    src: x,
                    src_offset: 0,
                    dst_offset: at * inner,
                    sizes: vec![outer, len * inner],
                    src_strides: vec![len * inner, 1],
                    dst_strides: vec![out[a] * inner, 1],
                });
            }
            at += len;
        }
        Ok(self.device(cx, Kind::Copy { parts }, out))
    }

    /// Output `i` is the box (start, step, shape `out`) of `x`.
    pub(super) fn slice_out(&mut self, cx: &Cx, i: usize, x: ValueId, out: &[u64], start: &[u64], step: &[u64]) -> Result<ValueId> {
        let s = self.shape(x);
        let part = self.box_part(x, out, start, step);
        if let Some(c) = self.konst(x) {
            let c = fold::pick(c, &shape::box_indices(out, &part.src_strides, part.src_offset), out);
            return Ok(self.constant(&Self::out_name(cx, i), c));
        }
        if out == s.as_slice() {
            return Ok(self.device_out(cx, i, Kind::View { x }, s));
        }
        rank_ok(cx, &s, "the input")?;
        Ok(self.device_out(cx, i, Kind::Copy { parts: vec![part] }, out.to_vec()))
    }

    /// The copy of the box (start, step, shape `out`) of `x` into a new
    /// `out`-shaped value.
    fn box_part(&self, x: ValueId, out: &[u64], start: &[u64], step: &[u64]) -> CopyPart {
        let st = strides(&self.shape(x));
        let src_strides = st.iter().zip(step).map(|(a, b)| a * b).collect();
        let src_offset = st.iter().zip(start).map(|(a, b)| a * b).sum();
        CopyPart { src: x, src_offset, dst_offset: 0, sizes: out.to_vec(), src_strides, dst_strides: strides(out) }
    }

    pub(super) fn split(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let x = ins.first().copied().flatten().ok_or_else(|| cx.err("input 0 is missing"))?;
        let s = self.shape(x);
        let a = cx.shape(shape::axis(cx.int("axis", 0), s.len(), false))?;
        let outs = cx.n.output.len() as u64;
        let sizes: Vec<u64> = match (ins.get(1).copied().flatten(), cx.ints("split")) {
            (Some(v), _) => self.const_ints(cx, v, 1)?.iter().map(|&d| d.max(0) as u64).collect(),
            (None, Some(sp)) => sp.iter().map(|&d| d.max(0) as u64).collect(),
            (None, None) => {
                let parts = cx.int("num_outputs", outs as i64).max(1) as u64;
                let each = s[a].div_ceil(parts);
                (0..parts).map(|i| each.min(s[a].saturating_sub(i * each))).collect()
            }
        };
        if sizes.iter().sum::<u64>() != s[a] || sizes.len() as u64 != outs {
            return Err(cx.err(format!("split sizes {sizes:?} do not cover axis {a} of {s:?} with {outs} outputs")));
        }
        let mut res = Vec::new();
        let mut at = 0;
        for (i, &len) in sizes.iter().enumerate() {
            let mut out = s.clone();
            out[a] = len;
            let mut start = vec![0; s.len()];
            start[a] = at;
            res.push(self.slice_out(cx, i, x, &out, &start, &vec![1; s.len()])?);
            at += len;
        }
        Ok(res)
    }
}
