//! Matrix products: Gemm, MatMul (with batch broadcasting), two-operand
//! Einsum in its matrix-product forms, and CumSum (a product with a
//! triangular matrix of ones), lowered to GEMM descriptors.

use super::*;

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &[
    "Gemm", "MatMul", "Einsum", "CumSum",
];

impl Importer {
    pub(super) fn lower_matmul(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let input = |i: usize| -> Result<ValueId> {
            ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")))
        };
        let opt = |i: usize| ins.get(i).copied().flatten();
        let op = cx.n.op_type.as_str();
        let v = match op {
            "Gemm" => self.gemm(cx, input(0)?, input(1)?, opt(2))?,
            "MatMul" => self.matmul(cx, input(0)?, input(1)?)?,
            "Einsum" => self.einsum(cx, ins)?,
            "CumSum" => self.cumsum(cx, input(0)?, input(1)?)?,
            _ => return Err(cx.err(format!("internal error: '{op}' is not a matmul op"))),
        };
        Ok(vec![v])
    }

    /// CumSum along one axis: folded on a constant; at run time (position
    /// ids counted from an attention mask) a product with a constant n×n
    /// matrix M of ones and zeros, y[.., j, ..] = Σ_i M[i][j]·x[.., i, ..],
    /// M[i][j] = 1 where i ≤ j (i < j exclusive; i ≥ j / i > j reversed).
    /// Exact on integers below 2^24, as every run-time integer is.
    fn cumsum(&mut self, cx: &Cx, x: ValueId, axis: ValueId) -> Result<ValueId> {
        let axis = cx.shape(fold::int_scalar(&self.need_const(cx, axis, 1)?, "axis (input 1)"))?;
        let (exclusive, reverse) = (cx.int("exclusive", 0) != 0, cx.int("reverse", 0) != 0);
        if let Some(c) = self.konst(x) {
            let c = cx.shape(fold::cumsum(c, axis, exclusive, reverse))?;
            return Ok(self.constant(&Self::out_name(cx, 0), c));
        }
        let s = self.shape(x);
        let a = cx.shape(shape::axis(axis, s.len(), false))?;
        let n = s[a];
        if n > 4096 {
            return Err(cx.err(format!("a run-time CumSum over {n} elements (at most 4096)")));
        }
        let x = if self.g.values[x].dtype == DType::F32 { x } else { self.as_f32(cx, x) };
        let included = |i: u64, j: u64| match (exclusive, reverse) {
            (false, false) => i <= j,
            (true, false) => i < j,
            (false, true) => i >= j,
            (true, true) => i > j,
        };
        let last = a + 1 == s.len();
        // Last axis: x · M. Otherwise Mᵀ · x[pre] over [n, post] matrices.
        let m: Vec<f32> = (0..n * n)
            .map(|e| {
                let (r, c) = (e / n, e % n);
                let (i, j) = if last { (r, c) } else { (c, r) };
                if included(i, j) { 1.0 } else { 0.0 }
            })
            .collect();
        let mv = self.constant(&format!("{}.triangle", cx.name), Const::f32(&[n, n], m));
        if last {
            return self.matmul(cx, x, mv);
        }
        let x3 = self.reshaped(cx, x, vec![volume(&s[..a]), n, volume(&s[a + 1..])], Some("rows"));
        let y = self.matmul(cx, mv, x3)?;
        let y = self.reshaped(cx, y, s, Some("sums"));
        Ok(self.alias(cx, y))
    }

    pub(super) fn dims_u64(&self, cx: &Cx, v: ValueId, rank: usize, what: &str) -> Result<Vec<u64>> {
        let s = self.shape(v);
        if s.len() != rank {
            return Err(cx.err(format!("{what} has shape {s:?}; rank {rank} expected")));
        }
        Ok(s)
    }

    pub(super) fn gemm(&mut self, cx: &Cx, a: ValueId, b: ValueId, c: Option<ValueId>) -> Result<ValueId> {
        let (sa, sb) = (self.dims_u64(cx, a, 2, "A")?, self.dims_u64(cx, b, 2, "B")?);
        let (ta, tb) = (cx.int("transA", 0) != 0, cx.int("transB", 0) != 0);
        let (m, k) = if ta { (sa[1], sa[0]) } else { (sa[0], sa[1]) };
        let (kb, n) = if tb { (sb[1], sb[0]) } else { (sb[0], sb[1]) };
        if k != kb {
            return Err(cx.err(format!("A {sa:?} and B {sb:?} do not multiply (transA={ta}, transB={tb})")));
        }
        let (alpha, beta) = (cx.float("alpha", 1.0), cx.float("beta", 1.0));
        let (mut a, mut b) = (a, b);
        if alpha != 1.0 {
            if let Some(cb) = self.konst(b).cloned() {
                b = self.constant(&format!("{}.alpha_B", cx.name), Const::f32(&cb.shape, cb.floats().iter().map(|v| v * alpha).collect()));
            } else if let Some(ca) = self.konst(a).cloned() {
                a = self.constant(&format!("{}.alpha_A", cx.name), Const::f32(&ca.shape, ca.floats().iter().map(|v| v * alpha).collect()));
            } else {
                return Err(cx.err(format!("alpha={alpha} with neither A nor B constant")));
            }
        }
        let mut c = c.filter(|_| beta != 0.0);
        if let Some(cv) = c {
            if beta != 1.0 {
                let cc = self.konst(cv).cloned().ok_or_else(|| cx.err(format!("beta={beta} with a run-time C")))?;
                c = Some(self.constant(&format!("{}.beta_C", cx.name), Const::f32(&cc.shape, cc.floats().iter().map(|v| v * beta).collect())));
            }
        }
        let out = vec![m, n];
        let bias_like = |s: &[u64]| volume(s) == n && (s.len() == 1 || s.len() == 2 && s[0] == 1);
        let bias = c.filter(|&cv| bias_like(&self.shape(cv)));
        let kind = Kind::Gemm { a, b, bias, m, n, k, batch: 1, strides: [0; 3], trans_a: ta, trans_b: tb, b_packed: false, residual: None, act: Act::NONE };
        match c {
            Some(cv) if bias.is_none() => {
                let sc = self.shape(cv);
                cx.shape(shape::broadcast(&sc, &out).and_then(|o| if o == out { Ok(o) } else { Err(format!("C {sc:?} does not broadcast to {out:?}")) }))?;
                let t = self.device_tmp(cx, kind, out.clone(), "product");
                let k = Kind::Binary { kind: Binary::Add, a: t, b: cv, a_dims: out.clone(), b_dims: shape::pad_rank(&sc, 2), act: Act::NONE };
                Ok(self.device(cx, k, out))
            }
            _ => Ok(self.device(cx, kind, out)),
        }
    }

    pub(super) fn matmul(&mut self, cx: &Cx, a: ValueId, b: ValueId) -> Result<ValueId> {
        let (sa, sb) = (self.shape(a), self.shape(b));
        if sa.is_empty() || sb.is_empty() {
            return Err(cx.err("scalar operands are not allowed"));
        }
        let a2: Vec<u64> = if sa.len() == 1 { vec![1, sa[0]] } else { sa.clone() };
        let b2: Vec<u64> = if sb.len() == 1 { vec![sb[0], 1] } else { sb.clone() };
        let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
        let (kb, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
        if k != kb {
            return Err(cx.err(format!("A {sa:?} and B {sb:?} do not multiply ({k} != {kb})")));
        }
        let (ab, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
        let batch_shape = cx.shape(shape::broadcast(ab, bb))?;
        let mut out = batch_shape.clone();
        if sa.len() > 1 {
            out.push(m);
        }
        if sb.len() > 1 {
            out.push(n);
        }
        let (va, vb) = (volume(ab), volume(bb));
        let kind = |m: u64, batch: u64, strides: [u64; 3]| Kind::Gemm {
            a, b, bias: None, m, n, k, batch, strides, trans_a: false, trans_b: false, b_packed: false, residual: None, act: Act::NONE,
        };
        let kind = if vb == 1 {
            // B is one matrix: A's batch folds into its rows.
            kind(va * m, 1, [0; 3])
        } else if va == 1 {
            kind(m, vb, [0, k * n, m * n])
        } else if shape::pad_rank(ab, batch_shape.len()) == shape::pad_rank(bb, batch_shape.len()) {
            kind(m, va, [m * k, k * n, m * n])
        } else {
            // Batch dims that broadcast partially ([1, 4, L] against
            // [1, 1, L], lambda networks' positional term): both operands
            // are repeated to the full batch, then one batched GEMM.
            let full = |rows: u64, cols: u64| [batch_shape.clone(), vec![rows, cols]].concat();
            let a = self.broadcast_to(cx, a, full(m, k), Some("a_batched"))?;
            let b = self.broadcast_to(cx, b, full(k, n), Some("b_batched"))?;
            let batch = volume(&batch_shape);
            Kind::Gemm { a, b, bias: None, m, n, k, batch, strides: [m * k, k * n, m * n], trans_a: false, trans_b: false, b_packed: false, residual: None, act: Act::NONE }
        };
        Ok(self.device(cx, kind, out))
    }

    /// Two-operand Einsum whose every index is a batch index (in both
    /// operands and the output), a contracted one (both operands, not the
    /// output) or a free one (one operand and the output): operands are
    /// permuted to [batch, free, contracted] / [batch, contracted, free],
    /// multiplied as one batched GEMM and permuted into the output order.
    pub(super) fn einsum(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<ValueId> {
        let xs: Vec<ValueId> = ins.iter().flatten().copied().collect();
        if xs.len() != 2 {
            return Err(cx.err(format!("{} operands; only two-operand (matrix product) equations are supported", xs.len())));
        }
        let eq: String = cx.string("equation").unwrap_or_default().chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, out) = eq.split_once("->").ok_or_else(|| cx.err(format!("equation '{eq}' has no explicit output ('->')")))?;
        let (ea, eb) = lhs.split_once(',').ok_or_else(|| cx.err(format!("equation '{eq}' does not have two operands")))?;
        let (sa, sb) = (self.shape(xs[0]), self.shape(xs[1]));
        // Ellipses become digits, aligned from the right ('0' the innermost
        // ellipsis axis in every operand), so they cannot clash with letters.
        let expand = |t: &str, rank: usize| -> Result<Vec<char>> {
            let named = t.replace("...", "").chars().count();
            if !t.chars().all(|c| c.is_ascii_alphabetic() || c == '.') {
                return Err(cx.err(format!("subscripts '{t}' must be letters (and '...')")));
            }
            let ell = if t.contains("...") { rank.checked_sub(named).ok_or_else(|| cx.err(format!("'{t}' has more indices than rank {rank}")))? } else { 0 };
            let fresh: String = (0..ell).rev().map(|k| (b'0' + k as u8) as char).collect();
            let v: Vec<char> = t.replace("...", &fresh).chars().collect();
            if v.len() != rank {
                return Err(cx.err(format!("subscripts '{t}' name {} axes of a rank-{rank} operand", v.len())));
            }
            Ok(v)
        };
        let (ia, ib) = (expand(ea, sa.len())?, expand(eb, sb.len())?);
        let ell_rank = ia.iter().chain(&ib).filter(|c| c.is_ascii_digit()).map(|&c| (c as u8 - b'0' + 1) as usize).max().unwrap_or(0);
        let fresh: String = (0..ell_rank).rev().map(|k| (b'0' + k as u8) as char).collect();
        let io: Vec<char> = out.replace("...", &fresh).chars().collect();
        let size = |c: char| -> Result<u64> {
            let a = ia.iter().position(|&x| x == c).map(|i| sa[i]);
            let b = ib.iter().position(|&x| x == c).map(|i| sb[i]);
            match (a, b) {
                (Some(x), Some(y)) if x != y => Err(cx.err(format!("index '{c}' has sizes {x} and {y}"))),
                (Some(x), _) | (None, Some(x)) => Ok(x),
                (None, None) => Err(cx.err(format!("output index '{c}' is in neither operand"))),
            }
        };
        for (t, v) in [(ea, &ia), (eb, &ib), (out, &io)] {
            let mut u = v.clone();
            u.sort_unstable();
            u.dedup();
            if u.len() != v.len() {
                return Err(cx.err(format!("'{t}' repeats an index (diagonals are not supported)")));
            }
        }
        let (mut batch, mut contr, mut fa, mut fb) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for &c in ia.iter().chain(ib.iter().filter(|c| !ia.contains(c))) {
            let (in_a, in_b, in_o) = (ia.contains(&c), ib.contains(&c), io.contains(&c));
            match (in_a, in_b, in_o) {
                (true, true, true) => batch.push(c),
                (true, true, false) => contr.push(c),
                (true, false, true) => fa.push(c),
                (false, true, true) => fb.push(c),
                _ => return Err(cx.err(format!("index '{c}' is summed within one operand; only matrix-product equations are supported"))),
            }
        }
        let order = |from: &[char], want: Vec<char>| -> Vec<usize> { want.iter().map(|c| from.iter().position(|x| x == c).unwrap_or(0)).collect() };
        let pa = order(&ia, [batch.clone(), fa.clone(), contr.clone()].concat());
        let pb = order(&ib, [batch.clone(), contr.clone(), fb.clone()].concat());
        let vol = |cs: &[char]| -> Result<u64> { cs.iter().map(|&c| size(c)).try_fold(1u64, |acc, d| Ok(acc * d?)) };
        let (bt, m, k, n) = (vol(&batch)?, vol(&fa)?, vol(&contr)?, vol(&fb)?);
        let a = self.permuted(cx, xs[0], &pa, Some("a"))?;
        let b = self.permuted(cx, xs[1], &pb, Some("b"))?;
        let a = self.reshaped(cx, a, vec![bt, m, k], Some("a3"));
        let b = self.reshaped(cx, b, vec![bt, k, n], Some("b3"));
        let p = self.matmul(cx, a, b)?;
        let prod: Vec<char> = [batch, fa, fb].concat();
        let dims: Result<Vec<u64>> = prod.iter().map(|&c| size(c)).collect();
        let p = self.reshaped(cx, p, dims?, Some("product"));
        let po = order(&prod, io.clone());
        if io.iter().any(|c| !prod.contains(c)) {
            return Err(cx.err(format!("output '{out}' names an index of neither operand")));
        }
        let y = self.permuted(cx, p, &po, Some("out"))?;
        Ok(self.alias(cx, y))
    }
}
