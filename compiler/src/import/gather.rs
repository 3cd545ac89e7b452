//! Gather: with constant indices (checked here, stored as weights, folded on
//! constant data) or with run-time token ids (checked by the device, and
//! by the runtime against the input's value range).

use super::*;

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &[
    "Gather",
];

impl Importer {
    pub(super) fn lower_gather(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let input = |i: usize| -> Result<ValueId> {
            ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")))
        };
        let op = cx.n.op_type.as_str();
        let v = match op {
            "Gather" => self.gather(cx, input(0)?, input(1)?)?,
            _ => return Err(cx.err(format!("internal error: '{op}' is not a gather op"))),
        };
        Ok(vec![v])
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
        let mut out: Vec<u64> = s[..a].to_vec();
        out.extend(&idx.shape);
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
            return Ok(self.constant(&Self::out_name(cx, 0), c));
        }
        rank_ok(cx, &s, "the data")?;
        let iv = self.constant(&format!("{}.indices", cx.name), Const::i64(&idx.shape, norm));
        let kind = Kind::Gather { data, indices: iv, dims: s, axis: a as u64, count: idx.len() as u64 };
        Ok(self.device(cx, kind, out))
    }

    /// Gather with indices known only at run time (token ids): the device
    /// bounds-checks every index; a model input used as indices also gets
    /// the value range the runtime checks before submitting.
    pub(super) fn gather_run_time(&mut self, cx: &Cx, data: ValueId, indices: ValueId, s: Vec<u64>, a: usize) -> Result<ValueId> {
        let it = self.g.values[indices].dtype;
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
