//! Gather: with constant indices (checked here, stored as weights, folded on
//! constant data) or with run-time token ids (checked by the device, and
//! by the runtime against the input's value range). GatherElements: folded
//! on constants, else a Gather from the flattened data at flat indices.
//! ScatterND and ScatterElements: folded on constants; with constant
//! indices and run-time data or updates, a Gather of the updates into
//! the written positions and a Where against the data. OneHot: an EQUAL of
//! the (wrapped) indices against the positions along the new axis.

use super::*;

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &[
    "Gather", "GatherElements", "ScatterND", "ScatterElements", "OneHot",
];

impl Importer {
    pub(super) fn lower_gather(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let input = |i: usize| -> Result<ValueId> {
            ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")))
        };
        let op = cx.n.op_type.as_str();
        let v = match op {
            "Gather" => self.gather(cx, input(0)?, input(1)?)?,
            "GatherElements" => self.gather_elements(cx, input(0)?, input(1)?)?,
            "ScatterND" | "ScatterElements" => self.scatter(cx, input(0)?, input(1)?, input(2)?)?,
            "OneHot" => self.one_hot(cx, input(0)?, input(1)?, input(2)?)?,
            _ => return Err(cx.err(format!("internal error: '{op}' is not a gather op"))),
        };
        Ok(vec![v])
    }

    /// OneHot with a constant depth and values [off, on]: a new axis of
    /// length depth at `axis`; `on` where the position equals the index
    /// (negative indices count from the end; others outside [-depth,
    /// depth) give a row of `off`). Folded on constants.
    fn one_hot(&mut self, cx: &Cx, indices: ValueId, depth: ValueId, values: ValueId) -> Result<ValueId> {
        let d = match self.const_ints(cx, depth, 1)?.as_slice() {
            [d] if *d > 0 => *d as u64,
            other => return Err(cx.err(format!("depth {other:?}: one positive value expected"))),
        };
        let vals = self.need_const(cx, values, 2)?;
        if vals.len() != 2 {
            return Err(cx.err(format!("values has {} elements; [off, on] expected", vals.len())));
        }
        let (off, on) = (vals.floats()[0], vals.floats()[1]);
        let s = self.shape(indices);
        let a = cx.shape(shape::axis(cx.int("axis", -1), s.len() + 1, false))?;
        let mut out = s.clone();
        out.insert(a, d);
        rank_ok(cx, &out, "the output")?;
        let mut column = s.clone();
        column.insert(a, 1);
        let mut positions = vec![1; out.len()];
        positions[a] = d;
        if let Some(c) = self.konst(indices) {
            cx.shape(shape::fold_limit(&out))?;
            let (idx, inner) = (c.ints(), volume(&s[a..]) as usize);
            let mut v = vec![off; volume(&out) as usize];
            for (n, &i) in idx.iter().enumerate() {
                let i = if i < 0 { i + d as i64 } else { i };
                if (0..d as i64).contains(&i) {
                    let (o, r) = (n / inner.max(1), n % inner.max(1));
                    v[(o * d as usize + i as usize) * inner + r] = on;
                }
            }
            let c = if vals.is_float() { Const::f32(&out, v) } else { Const::i64(&out, v.iter().map(|&x| x as i64).collect()) };
            return Ok(self.constant(&Self::out_name(cx, 0), c));
        }
        // index + depth·(index < 0), then compared with the positions.
        let pos = self.constant(&format!("{}.positions", cx.name), Const::f32(&positions, (0..d).map(|i| i as f32).collect()));
        let idx = self.reshaped(cx, indices, column, Some("column"));
        let zero = self.scalar(cx, "zero", 0.0);
        let neg = self.elementwise(cx, Binary::Less, idx, zero, Some("negative"))?;
        let dv = self.scalar(cx, "depth", d as f32);
        let shift = self.elementwise(cx, Binary::Mul, neg, dv, Some("shift"))?;
        let idx = self.elementwise(cx, Binary::Add, idx, shift, Some("wrapped"))?;
        let hot = self.elementwise(cx, Binary::Equal, idx, pos, Some("hot"))?;
        // hot·(on − off) + off.
        let y = if (off, on) == (0.0, 1.0) {
            hot
        } else {
            let span = self.scalar(cx, "span", on - off);
            let scaled = self.elementwise(cx, Binary::Mul, hot, span, Some("scaled"))?;
            let base = self.scalar(cx, "off", off);
            self.elementwise(cx, Binary::Add, scaled, base, Some("valued"))?
        };
        if !vals.is_float() {
            return Ok(self.device(cx, Kind::Cast { x: y, from: DType::F32, to: DType::I64 }, out));
        }
        Ok(self.alias(cx, y))
    }

    pub(super) fn gather(&mut self, cx: &Cx, data: ValueId, indices: ValueId) -> Result<ValueId> {
        let s = self.shape(data);
        let a = cx.shape(shape::axis(cx.int("axis", 0), s.len(), false))?;
        let Some(idx) = self.konst(indices).cloned() else {
            return self.gather_run_time(cx, data, indices, s, a);
        };
        if idx.is_float() {
            return Err(cx.err("indices must be integers"));
        }
        let d = s[a] as i64;
        let mut norm = Vec::with_capacity(idx.len());
        for &i in &idx.ints() {
            if i < -d || i >= d {
                return Err(cx.err(format!("index {i} is out of range for axis {a} of size {d}")));
            }
            norm.push(if i < 0 { i + d } else { i });
        }
        self.gather_const(cx, data, &idx.shape, norm, a)
    }

    /// Gather along axis `a` at constant indices `norm` (each in range,
    /// non-negative) of shape `ishape`: folded on a constant, else a GATHER
    /// with the indices as a constant operand.
    pub(super) fn gather_const(&mut self, cx: &Cx, data: ValueId, ishape: &[u64], norm: Vec<i64>, a: usize) -> Result<ValueId> {
        self.gather_const_tagged(cx, data, ishape, norm, a, None)
    }

    /// [`Self::gather_const`] whose result is an intermediate named by
    /// `tag` (None: the node's output).
    pub(super) fn gather_const_tagged(&mut self, cx: &Cx, data: ValueId, ishape: &[u64], norm: Vec<i64>, a: usize, tag: Option<&str>) -> Result<ValueId> {
        let s = self.shape(data);
        let mut out: Vec<u64> = s[..a].to_vec();
        out.extend(ishape);
        out.extend(&s[a + 1..]);
        if let Some(c) = self.konst(data) {
            let (outer, inner) = (volume(&s[..a]), volume(&s[a + 1..]));
            let mut pick = Vec::new();
            for o in 0..outer {
                for &i in &norm {
                    for k in 0..inner {
                        pick.push(((o * s[a] + i as u64) * inner + k) as usize);
                    }
                }
            }
            let c = fold::pick(c, &pick, &out);
            return Ok(self.result_const(cx, tag, c));
        }
        rank_ok(cx, &s, "the data")?;
        let count = norm.len() as u64;
        let iv = self.constant(&format!("{}.indices", cx.name), Const::i64(ishape, norm));
        let kind = Kind::Gather { data, indices: iv, dims: s, axis: a as u64, count };
        Ok(self.result(cx, tag, kind, out))
    }

    /// GatherElements: out[i] = data[i with axis coordinate idx[i]], shape
    /// of `indices`. Data and indices constant: folded. Constant indices:
    /// a Gather of the flattened data at the flat positions. Run-time
    /// indices (position ids computed from a mask): the flat positions are
    /// computed on the device in f32 (exact: at most 2^24 elements), an
    /// index outside [-d, d) is replaced by one past the end so that the
    /// device's bounds check faults on it, then cast to i64 for the Gather.
    fn gather_elements(&mut self, cx: &Cx, data: ValueId, indices: ValueId) -> Result<ValueId> {
        if let (Some(d), Some(i)) = (self.konst(data), self.konst(indices)) {
            let c = cx.shape(fold::gather_elements(d, i, cx.int("axis", 0)))?;
            return Ok(self.constant(&Self::out_name(cx, 0), c));
        }
        let (s, is) = (self.shape(data), self.shape(indices));
        let a = cx.shape(shape::axis(cx.int("axis", 0), s.len(), false))?;
        if is.len() != s.len() || is.iter().zip(&s).enumerate().any(|(k, (i, d))| k != a && i > d) {
            return Err(cx.err(format!("indices {is:?} do not fit data {s:?} along axis {a}")));
        }
        let n = volume(&s);
        if n >= 1 << 24 {
            return Err(cx.err(format!("data of {n} elements; at most 2^24 with run-time operands")));
        }
        let (st, d) = (strides(&s), s[a] as i64);
        // Flat offset of every output element along the other axes.
        let mut other = Vec::with_capacity(volume(&is) as usize);
        let mut idx = vec![0u64; is.len()];
        for _ in 0..volume(&is) {
            other.push(idx.iter().zip(&st).enumerate().filter(|(k, _)| *k != a).map(|(_, (i, s))| i * s).sum::<u64>());
            for k in (0..is.len()).rev() {
                idx[k] += 1;
                if idx[k] < is[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        let flat = self.reshaped(cx, data, vec![n], Some("flat"));
        if let Some(i) = self.konst(indices) {
            let mut pos = Vec::with_capacity(other.len());
            for (&v, &o) in i.ints().iter().zip(&other) {
                if v < -d || v >= d {
                    return Err(cx.err(format!("index {v} is out of range for axis {a} of size {d}")));
                }
                pos.push((if v < 0 { v + d } else { v }) * st[a] as i64 + o as i64);
            }
            return self.gather_const(cx, flat, &is, pos, 0);
        }
        let scalar = |me: &mut Self, tag: &str, v: f32| me.constant(&format!("{}.{tag}", cx.name), Const::f32(&[], vec![v]));
        let (zero, dim, stride, end) = (scalar(self, "zero", 0.0), scalar(self, "dim", d as f32), scalar(self, "stride", st[a] as f32), scalar(self, "end", n as f32));
        let offsets = self.constant(&format!("{}.offsets", cx.name), Const::f32(&is, other.iter().map(|&o| o as f32).collect()));
        let neg = self.binary(cx, Binary::Less, indices, zero, false)?;
        let wrap = self.binary(cx, Binary::Mul, neg, dim, false)?;
        let i = self.binary(cx, Binary::Add, indices, wrap, false)?;
        let lo = self.binary(cx, Binary::GreaterOrEqual, i, zero, false)?;
        let hi = self.binary(cx, Binary::Less, i, dim, false)?;
        let ok = self.binary(cx, Binary::Mul, lo, hi, false)?;
        let pos = self.binary(cx, Binary::Mul, i, stride, false)?;
        let pos = self.binary(cx, Binary::Add, pos, offsets, false)?;
        let pos = self.where_select(cx, ok, pos, end, Some("checked"))?;
        let pos = self.device_tmp(cx, Kind::Cast { x: pos, from: DType::F32, to: DType::I64 }, is.clone(), "positions");
        let kind = Kind::Gather { data: flat, indices: pos, dims: vec![n], axis: 0, count: volume(&is) };
        Ok(self.device(cx, kind, is))
    }

    /// ScatterND / ScatterElements. All constant: folded. Constant indices
    /// (BART's `shift_tokens_right`, in-place slice assignments): the fold
    /// itself, run on stand-ins (data −1, update k holding k), says which
    /// update lands on each output element (the last, as ONNX's reduction
    /// none); then `out = written ? updates[source] : data`, one GATHER and
    /// one WHERE. Run-time indices and other reductions are refused.
    fn scatter(&mut self, cx: &Cx, data: ValueId, indices: ValueId, updates: ValueId) -> Result<ValueId> {
        let op = cx.n.op_type.as_str();
        let r = cx.shape(fold::Reduction::parse(cx.string("reduction").as_deref().unwrap_or("none")))?;
        let apply = |d: &Const, i: &Const, u: &Const| -> std::result::Result<Const, String> {
            if op == "ScatterND" { fold::scatter_nd(d, i, u, r) } else { fold::scatter_elements(d, i, u, cx.int("axis", 0), r) }
        };
        if let (Some(d), Some(i), Some(u)) = (self.konst(data), self.konst(indices), self.konst(updates)) {
            let c = cx.shape(apply(d, i, u))?;
            return Ok(self.constant(&Self::out_name(cx, 0), c));
        }
        let idx = self.need_const(cx, indices, 1)?;
        if r != fold::Reduction::None {
            return Err(cx.err("a reduction other than 'none' with run-time data or updates"));
        }
        let (ds, us) = (self.shape(data), self.shape(updates));
        let nu = volume(&us);
        if nu >= 1 << 24 {
            return Err(cx.err(format!("{nu} updates; at most 2^24 with run-time operands")));
        }
        let stand_in = Const::f32(&ds, vec![-1.0; volume(&ds) as usize]);
        let ids = Const::f32(&us, (0..nu).map(|k| k as f32).collect());
        let source = cx.shape(apply(&stand_in, &idx, &ids))?.floats();
        let written: Vec<f32> = source.iter().map(|&s| if s >= 0.0 { 1.0 } else { 0.0 }).collect();
        let from: Vec<i64> = source.iter().map(|&s| s.max(0.0) as i64).collect();
        let flat = self.reshaped(cx, updates, vec![nu], Some("updates"));
        let picked = self.gather_const_tagged(cx, flat, &ds, from, 0, Some("picked"))?;
        let mask = self.constant(&format!("{}.written", cx.name), Const::f32(&ds, written));
        self.where_select(cx, mask, picked, data, None)
    }

    /// Gather with indices known only at run time (token ids): the device
    /// bounds-checks every index; a model input used as indices also gets
    /// the value range the runtime checks before submitting.
    pub(super) fn gather_run_time(&mut self, cx: &Cx, data: ValueId, indices: ValueId, s: Vec<u64>, a: usize) -> Result<ValueId> {
        let mut indices = indices;
        let mut it = self.g.values[indices].dtype;
        if it == DType::F32 && self.input_behind(indices).is_none() {
            // Integer arithmetic on ids (position ids from a cumulative
            // sum of the mask) runs in f32: back to i64, exact below 2^24.
            // (A float model input stays refused below.)
            indices = self.device_tmp(cx, Kind::Cast { x: indices, from: DType::F32, to: DType::I64 }, self.shape(indices), "ids");
            it = DType::I64;
        }
        if !matches!(it, DType::I32 | DType::I64) {
            return Err(cx.err(format!(
                "indices '{}' are {} at run time; run-time indices must be int32 or int64 (a model input or a cast of one)",
                self.g.values[indices].name,
                it.name()
            )));
        }
        rank_ok(cx, &s, "the data")?;
        let ishape = self.shape(indices);
        let mut out: Vec<u64> = s[..a].to_vec();
        out.extend(&ishape);
        out.extend(&s[a + 1..]);
        rank_ok(cx, &out, "the output")?;
        if let Some(input) = self.input_behind(indices) {
            let d = s[a] as i64;
            self.g.restrict_range(input, -d, d);
        }
        let count = volume(&ishape);
        let kind = Kind::Gather { data, indices, dims: s, axis: a as u64, count };
        Ok(self.device(cx, kind, out))
    }
}
