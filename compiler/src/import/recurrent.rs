//! Recurrent layers (LSTM, GRU, RNN), unrolled over their static sequence
//! length into existing descriptors.
//!
//! Per direction, the input projection of every step is one GEMM up front
//! (`X·Wᵀ` plus the biases that are not inside a reset gate, `[T·B, G·H]`).
//! Each step then multiplies the previous hidden state by `Rᵀ` with the
//! step's rows of that projection added as the GEMM's residual, and forms
//! the gates and the new state with element-wise ops on column slices of
//! the result (strided copies). The outputs are gathered with one copy
//! each. A zero initial state is a constant. Only the default activations,
//! no `clip`, no `input_forget`, no peepholes (LSTM's `P` must be zero) and
//! sequence lengths equal to the sequence (or absent) are accepted; the
//! weights and biases must be constants.

use super::*;
use rbln_hw::ops::{Binary, Unary};

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &["LSTM", "GRU", "RNN"];

/// The flavour of a recurrent node.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cell {
    Lstm,
    /// `linear_before_reset`.
    Gru { linear_before_reset: bool },
    Rnn { relu: bool },
}

impl Cell {
    /// Gates per step (rows of W per direction, in units of H).
    fn gates(self) -> u64 {
        match self {
            Cell::Lstm => 4,
            Cell::Gru { .. } => 3,
            Cell::Rnn { .. } => 1,
        }
    }
}

/// What one direction computes over the sequence.
struct Geometry {
    seq: u64,
    batch: u64,
    hidden: u64,
    /// Gates × hidden: the width of a step's projection.
    width: u64,
}

impl Importer {
    pub(super) fn lower_recurrent(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let input = |i: usize| -> Result<ValueId> { ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing"))) };
        let opt = |i: usize| ins.get(i).copied().flatten();
        let cell = match cx.n.op_type.as_str() {
            "LSTM" => Cell::Lstm,
            "GRU" => Cell::Gru { linear_before_reset: cx.int("linear_before_reset", 0) != 0 },
            "RNN" => Cell::Rnn { relu: false },
            op => return Err(cx.err(format!("internal error: '{op}' is not a recurrent op"))),
        };
        let cell = match (cell, self.activations(cx, cell)?) {
            (Cell::Rnn { .. }, relu) => Cell::Rnn { relu },
            (c, _) => c,
        };
        if cx.attr("clip").is_some() {
            return Err(cx.err("clip is not supported"));
        }
        if cx.int("input_forget", 0) != 0 {
            return Err(cx.err("input_forget=1 is not supported"));
        }
        // Batch-major layout (1) is not supported (nor by onnxruntime's CPU
        // kernels, the reference here); exporters write 0.
        let layout = cx.int("layout", 0);
        if layout != 0 {
            return Err(cx.err(format!("layout {layout}: only 0 (sequence-major) is supported")));
        }
        let dirs: &[bool] = match cx.string("direction").as_deref().unwrap_or("forward") {
            "forward" => &[false],
            "reverse" => &[true],
            "bidirectional" => &[false, true],
            other => return Err(cx.err(format!("direction '{other}': forward, reverse or bidirectional expected"))),
        };
        let nd = dirs.len() as u64;
        let x = input(0)?;
        let sx = self.shape(x);
        if sx.len() != 3 {
            return Err(cx.err(format!("X has shape {sx:?}; [seq, batch, input] expected")));
        }
        let (seq, batch, isz) = (sx[0], sx[1], sx[2]);
        let w = self.konst(input(1)?).cloned().ok_or_else(|| cx.err("W computed at run time is not supported"))?;
        let r = self.konst(input(2)?).cloned().ok_or_else(|| cx.err("R computed at run time is not supported"))?;
        let gates = cell.gates();
        let hidden = match cx.int("hidden_size", 0) {
            h if h > 0 => h as u64,
            _ => r.shape.get(2).copied().unwrap_or(0),
        };
        let width = gates * hidden;
        if seq == 0 || batch == 0 || hidden == 0 {
            return Err(cx.err(format!("X {sx:?}, hidden_size {hidden}: empty sequences, batches and states are not supported")));
        }
        if w.shape != [nd, width, isz] || r.shape != [nd, width, hidden] {
            return Err(cx.err(format!(
                "W {:?} / R {:?}: [{nd}, {width}, {isz}] and [{nd}, {width}, {hidden}] expected ({gates} gates of {hidden}, {nd} direction(s))",
                w.shape, r.shape
            )));
        }
        let b = match opt(3) {
            Some(v) => {
                let c = self.konst(v).cloned().ok_or_else(|| cx.err("B computed at run time is not supported"))?;
                if c.shape != [nd, 2 * width] {
                    return Err(cx.err(format!("B has shape {:?}; [{nd}, {}] expected", c.shape, 2 * width)));
                }
                c.floats()
            }
            None => vec![0.0; (nd * 2 * width) as usize],
        };
        if let Some(v) = opt(4) {
            let lens = self.konst(v).map(Const::ints).ok_or_else(|| cx.err("sequence_lens computed at run time is not supported"))?;
            if lens.len() as u64 != batch || lens.iter().any(|&l| l as u64 != seq) {
                return Err(cx.err(format!("sequence_lens {lens:?}: only every sequence at the full length {seq} is supported")));
            }
        }
        if cell == Cell::Lstm {
            if let Some(v) = opt(7) {
                let p = self.konst(v).map(Const::floats).ok_or_else(|| cx.err("P computed at run time is not supported"))?;
                if p.iter().any(|&v| v != 0.0) {
                    return Err(cx.err("peephole weights (P) are not supported"));
                }
            }
        }
        let state_shape = vec![nd, batch, hidden];
        for (i, what) in [(5, "initial_h"), (6, "initial_c")] {
            if let Some(v) = opt(i).filter(|_| i == 5 || cell == Cell::Lstm) {
                if self.shape(v) != state_shape {
                    return Err(cx.err(format!("{what} has shape {:?}; {state_shape:?} expected", self.shape(v))));
                }
            }
        }
        let too_big = || cx.err(format!("X {sx:?}, hidden_size {hidden}: sizes overflow"));
        seq.checked_mul(batch).and_then(|v| v.checked_mul(width.max(isz))).and_then(|v| v.checked_mul(nd)).ok_or_else(too_big)?;
        cx.shape(shape::fold_limit(&[seq, nd, batch, width]))?;
        let geo = Geometry { seq, batch, hidden, width };
        // X as [seq·batch, input], steps in order.
        let xs = self.reshaped(cx, x, vec![seq * batch, isz], Some("steps"));
        let (mut ys, mut hs, mut cs) = (Vec::new(), Vec::new(), Vec::new());
        for (d, &reverse) in dirs.iter().enumerate() {
            let d = d as u64;
            let take = |c: &Const, len: u64, at: u64| c.floats()[(at * len) as usize..((at + 1) * len) as usize].to_vec();
            let wd = take(&w, width * isz, d);
            let rd = take(&r, width * hidden, d);
            let bd = &b[(d * 2 * width) as usize..((d + 1) * 2 * width) as usize];
            let h0 = self.initial_state(cx, opt(5), d, &geo, "h0");
            let c0 = match cell {
                Cell::Lstm => Some(self.initial_state(cx, opt(6), d, &geo, "c0")),
                _ => None,
            };
            let (y, h, c) = self.direction(cx, cell, xs, isz, &wd, &rd, bd, h0, c0, &geo, d, reverse)?;
            ys.push(y);
            hs.push(h);
            cs.extend(c);
        }
        // Y: [seq, dirs, batch, hidden]; Y_h, Y_c: [dirs, batch, hidden].
        let bh = batch * hidden;
        let mut parts = Vec::new();
        for (d, steps) in ys.iter().enumerate() {
            for (t, &v) in steps.iter().enumerate() {
                let (t, d) = (t as u64, d as u64);
                parts.push(CopyPart { src: v, src_offset: 0, dst_offset: (t * nd + d) * bh, sizes: vec![bh], src_strides: vec![1], dst_strides: vec![1] });
            }
        }
        let y = self.device_out(cx, 0, Kind::Copy { parts }, vec![seq, nd, batch, hidden]);
        let mut outs = vec![y, self.final_state(cx, 1, &hs, &geo)];
        if cell == Cell::Lstm {
            outs.push(self.final_state(cx, 2, &cs, &geo));
        }
        Ok(outs)
    }

    /// The `activations` attribute: only the defaults (RNN: Tanh or Relu,
    /// returned as `relu`).
    fn activations(&self, cx: &Cx, cell: Cell) -> Result<bool> {
        let Some(a) = cx.attr("activations") else { return Ok(false) };
        let names: Vec<String> = a.strings.iter().map(|s| String::from_utf8_lossy(s).to_ascii_lowercase()).collect();
        let defaults: &[&str] = match cell {
            Cell::Lstm => &["sigmoid", "tanh", "tanh"],
            Cell::Gru { .. } => &["sigmoid", "tanh"],
            Cell::Rnn { .. } => {
                let relu = names.first().is_some_and(|n| n == "relu");
                if names.iter().all(|n| n == names[0].as_str()) && (relu || names.first().is_some_and(|n| n == "tanh")) {
                    return Ok(relu);
                }
                &["tanh"]
            }
        };
        if names.chunks(defaults.len()).all(|c| c == defaults) && !names.is_empty() {
            return Ok(false);
        }
        Err(cx.err(format!("activations {names:?} are not supported (only the default {defaults:?} per direction)")))
    }

    /// Direction `d`'s initial state as `[batch, hidden]`: a slice of the
    /// given one, or zeros.
    fn initial_state(&mut self, cx: &Cx, given: Option<ValueId>, d: u64, geo: &Geometry, tag: &str) -> ValueId {
        let (b, h) = (geo.batch, geo.hidden);
        let tag = format!("d{d}.{tag}");
        let Some(v) = given else {
            return self.constant(&format!("{}.{tag}", cx.name), Const::f32(&[b, h], vec![0.0; (b * h) as usize]));
        };
        let part = CopyPart { src: v, src_offset: d * b * h, dst_offset: 0, sizes: vec![b * h], src_strides: vec![1], dst_strides: vec![1] };
        self.device_tmp(cx, Kind::Copy { parts: vec![part] }, vec![b, h], &tag)
    }

    /// Output `i` (Y_h or Y_c) from each direction's final state.
    fn final_state(&mut self, cx: &Cx, i: usize, states: &[ValueId], geo: &Geometry) -> ValueId {
        let (b, h, nd) = (geo.batch, geo.hidden, states.len() as u64);
        let parts = states
            .iter()
            .enumerate()
            .map(|(d, &v)| CopyPart { src: v, src_offset: 0, dst_offset: d as u64 * b * h, sizes: vec![b * h], src_strides: vec![1], dst_strides: vec![1] })
            .collect();
        self.device_out(cx, i, Kind::Copy { parts }, vec![nd, b, h])
    }

    /// Columns `c0 .. c0 + n` of rows `r0 .. r0 + rows` of the 2-D value
    /// `v` (`cols` wide), as a new `[rows, n]` value.
    #[allow(clippy::too_many_arguments)]
    fn block(&mut self, cx: &Cx, v: ValueId, cols: u64, r0: u64, rows: u64, c0: u64, n: u64, tag: &str) -> ValueId {
        let part = CopyPart { src: v, src_offset: r0 * cols + c0, dst_offset: 0, sizes: vec![rows, n], src_strides: vec![cols, 1], dst_strides: vec![n, 1] };
        self.device_tmp(cx, Kind::Copy { parts: vec![part] }, vec![rows, n], tag)
    }

    /// `a·bᵀ` (`b` a constant `[n, k]`), plus `residual` and `bias` when given.
    #[allow(clippy::too_many_arguments)]
    fn gemm_t(&mut self, cx: &Cx, a: ValueId, b: ValueId, bias: Option<ValueId>, residual: Option<ValueId>, m: u64, n: u64, k: u64, tag: &str) -> ValueId {
        let kind = Kind::Gemm { a, b, bias, m, n, k, batch: 1, strides: [0; 3], trans_a: false, trans_b: true, b_packed: false, residual, act: Act::NONE };
        self.device_tmp(cx, kind, vec![m, n], tag)
    }

    /// One direction over the whole sequence: every step's hidden state
    /// (in sequence order), the final hidden state and (LSTM) cell state.
    #[allow(clippy::too_many_arguments)]
    fn direction(
        &mut self,
        cx: &Cx,
        cell: Cell,
        xs: ValueId,
        isz: u64,
        w: &[f32],
        r: &[f32],
        b: &[f32],
        h0: ValueId,
        c0: Option<ValueId>,
        geo: &Geometry,
        d: u64,
        reverse: bool,
    ) -> Result<(Vec<ValueId>, ValueId, Option<ValueId>)> {
        let Geometry { seq, batch, hidden: hs, width } = *geo;
        let (wb, rb) = b.split_at(width as usize);
        // Biases outside the reset gate go into the projection.
        let lbr = cell == (Cell::Gru { linear_before_reset: true });
        let proj_bias: Vec<f32> = (0..width as usize).map(|j| wb[j] + if lbr { 0.0 } else { rb[j] }).collect();
        let name = |what: &str| format!("{}.d{d}.{what}", cx.name);
        let wv = self.constant(&name("W"), Const::f32(&[width, isz], w.to_vec()));
        let bv = self.constant(&name("bias"), Const::f32(&[width], proj_bias));
        let proj = self.gemm_t(cx, xs, wv, Some(bv), None, seq * batch, width, isz, &format!("d{d}.projection"));
        // Gate blocks `lo .. lo + n` of R (hs rows of hs each).
        let rows = |lo: u64, n: u64| r[(lo * hs * hs) as usize..((lo + n) * hs * hs) as usize].to_vec();
        // The recurrent weights, once per direction: all gates' rows (GRU
        // with the reset after the product: and their bias), or (GRU with
        // the reset before it) z and r apart from h.
        let (r_main, r_extra) = match cell {
            Cell::Gru { linear_before_reset: false } => (
                self.constant(&name("R_zr"), Const::f32(&[2 * hs, hs], rows(0, 2))),
                Some(self.constant(&name("R_h"), Const::f32(&[hs, hs], rows(2, 1)))),
            ),
            _ => {
                let r = self.constant(&name("R"), Const::f32(&[width, hs], rows(0, cell.gates())));
                (r, lbr.then(|| self.constant(&name("Rb"), Const::f32(&[width], rb.to_vec()))))
            }
        };
        let mut h = h0;
        let mut c = c0;
        let mut ys = vec![h0; seq as usize];
        for step in 0..seq {
            let t = if reverse { seq - 1 - step } else { step };
            let tag = |what: &str| format!("d{d}.t{t}.{what}");
            match cell {
                Cell::Rnn { relu } => {
                    let xp = self.block(cx, proj, width, t * batch, batch, 0, hs, &tag("x"));
                    let pre = self.gemm_t(cx, h, r_main, None, Some(xp), batch, hs, hs, &tag("pre"));
                    h = self.unary_tmp(cx, if relu { Unary::Relu } else { Unary::Tanh }, pre, &tag("h"));
                }
                Cell::Lstm => {
                    // Gates i, o, f, c (ONNX order).
                    let xp = self.block(cx, proj, width, t * batch, batch, 0, width, &tag("x"));
                    let pre = self.gemm_t(cx, h, r_main, None, Some(xp), batch, width, hs, &tag("gates"));
                    let sig = self.unary_tmp(cx, Unary::Sigmoid, pre, &tag("sigmoid"));
                    let i = self.block(cx, sig, width, 0, batch, 0, hs, &tag("i"));
                    let o = self.block(cx, sig, width, 0, batch, hs, hs, &tag("o"));
                    let f = self.block(cx, sig, width, 0, batch, 2 * hs, hs, &tag("f"));
                    let g = self.block(cx, pre, width, 0, batch, 3 * hs, hs, &tag("g_pre"));
                    let g = self.unary_tmp(cx, Unary::Tanh, g, &tag("g"));
                    let c_prev = c.ok_or_else(|| cx.err("internal error: LSTM without a cell state"))?;
                    let keep = self.elementwise(cx, Binary::Mul, f, c_prev, Some(&tag("keep")))?;
                    let add = self.elementwise(cx, Binary::Mul, i, g, Some(&tag("add")))?;
                    let cn = self.elementwise(cx, Binary::Add, keep, add, Some(&tag("c")))?;
                    let tc = self.unary_tmp(cx, Unary::Tanh, cn, &tag("tanh_c"));
                    h = self.elementwise(cx, Binary::Mul, o, tc, Some(&tag("h")))?;
                    c = Some(cn);
                }
                Cell::Gru { linear_before_reset } => {
                    // Gates z, r, h (ONNX order).
                    let h_prev = h;
                    let r_extra = r_extra.ok_or_else(|| cx.err("internal error: GRU without its second recurrent constant"))?;
                    let (z, rr, cand_pre);
                    if linear_before_reset {
                        let rec = self.gemm_t(cx, h_prev, r_main, Some(r_extra), None, batch, width, hs, &tag("recurrent"));
                        let xzr = self.block(cx, proj, width, t * batch, batch, 0, 2 * hs, &tag("x_zr"));
                        let rzr = self.block(cx, rec, width, 0, batch, 0, 2 * hs, &tag("r_zr"));
                        let zr = self.elementwise(cx, Binary::Add, xzr, rzr, Some(&tag("zr_pre")))?;
                        let zr = self.unary_tmp(cx, Unary::Sigmoid, zr, &tag("zr"));
                        z = self.block(cx, zr, 2 * hs, 0, batch, 0, hs, &tag("z"));
                        rr = self.block(cx, zr, 2 * hs, 0, batch, hs, hs, &tag("r"));
                        let rh = self.block(cx, rec, width, 0, batch, 2 * hs, hs, &tag("r_h"));
                        let gated = self.elementwise(cx, Binary::Mul, rr, rh, Some(&tag("reset")))?;
                        let xh = self.block(cx, proj, width, t * batch, batch, 2 * hs, hs, &tag("x_h"));
                        cand_pre = self.elementwise(cx, Binary::Add, xh, gated, Some(&tag("cand_pre")))?;
                    } else {
                        let xzr = self.block(cx, proj, width, t * batch, batch, 0, 2 * hs, &tag("x_zr"));
                        let zr = self.gemm_t(cx, h_prev, r_main, None, Some(xzr), batch, 2 * hs, hs, &tag("zr_pre"));
                        let zr = self.unary_tmp(cx, Unary::Sigmoid, zr, &tag("zr"));
                        z = self.block(cx, zr, 2 * hs, 0, batch, 0, hs, &tag("z"));
                        rr = self.block(cx, zr, 2 * hs, 0, batch, hs, hs, &tag("r"));
                        let reset = self.elementwise(cx, Binary::Mul, rr, h_prev, Some(&tag("reset")))?;
                        let xh = self.block(cx, proj, width, t * batch, batch, 2 * hs, hs, &tag("x_h"));
                        cand_pre = self.gemm_t(cx, reset, r_extra, None, Some(xh), batch, hs, hs, &tag("cand_pre"));
                    }
                    let cand = self.unary_tmp(cx, Unary::Tanh, cand_pre, &tag("cand"));
                    // (1 − z)·cand + z·h = cand + z·(h − cand).
                    let diff = self.elementwise(cx, Binary::Sub, h_prev, cand, Some(&tag("diff")))?;
                    let mix = self.elementwise(cx, Binary::Mul, z, diff, Some(&tag("mix")))?;
                    h = self.elementwise(cx, Binary::Add, cand, mix, Some(&tag("h")))?;
                }
            }
            ys[t as usize] = h;
        }
        Ok((ys, h, c))
    }
}
