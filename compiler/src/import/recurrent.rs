//! Recurrent layers (LSTM, GRU, RNN): two device ops per direction.
//!
//! The input projection of every step is one GEMM up front (`X·Wᵀ` plus
//! the biases that are not inside a reset gate, `[T·B, G·H]`); one
//! RECURRENT op then runs the cell over the whole sequence (the products
//! of the state with `Rᵀ` and the gates' update, step after step, on the
//! device), writing every step's hidden state and (LSTM) the final cell
//! state. The outputs `Y`, `Y_h` and `Y_c` are copies out of those.
//! Unrolled into GEMMs and element-wise ops instead, a layer would cost
//! several ops per step, each far smaller than an op's fixed cost at the
//! hidden sizes such layers have. Only the default activations, no `clip`,
//! no `input_forget`, no peepholes (LSTM's `P` must be zero) and sequence
//! lengths equal to the sequence (or absent) are accepted; the weights and
//! biases must be constants.

use super::*;
use rbln_hw::ops::{REC_GRU, REC_LINEAR_BEFORE_RESET, REC_LSTM, REC_REVERSE, REC_RNN_RELU, REC_RNN_TANH};

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
        // Per direction: the RECURRENT op's output (every step's h, then
        // an LSTM's final c).
        let mut states = Vec::new();
        for (d, &reverse) in dirs.iter().enumerate() {
            let d = d as u64;
            let take = |c: &Const, len: u64, at: u64| c.floats()[(at * len) as usize..((at + 1) * len) as usize].to_vec();
            let wd = take(&w, width * isz, d);
            let rd = take(&r, width * hidden, d);
            let bd = &b[(d * 2 * width) as usize..((d + 1) * 2 * width) as usize];
            let h0 = self.initial_state(cx, opt(5), d, &geo, "h0");
            let c0 = match cell {
                Cell::Lstm => self.initial_state(cx, opt(6), d, &geo, "c0"),
                _ => None,
            };
            states.push(self.direction(cx, cell, xs, isz, &wd, &rd, bd, h0, c0, &geo, d, reverse));
        }
        // Y: [seq, dirs, batch, hidden] (one strided part per direction);
        // Y_h, Y_c: [dirs, batch, hidden].
        let bh = batch * hidden;
        let parts = states
            .iter()
            .enumerate()
            .map(|(d, &v)| CopyPart {
                src: v,
                src_offset: 0,
                dst_offset: d as u64 * bh,
                sizes: vec![seq, bh],
                src_strides: vec![bh, 1],
                dst_strides: vec![nd * bh, 1],
            })
            .collect();
        let y = self.device_out(cx, 0, Kind::Copy { parts }, vec![seq, nd, batch, hidden]);
        // The final h is the last step's (the first's, reversed).
        let last_h: Vec<(ValueId, u64)> = states.iter().zip(dirs).map(|(&v, &reverse)| (v, if reverse { 0 } else { (seq - 1) * bh })).collect();
        let mut outs = vec![y, self.final_state(cx, 1, &last_h, &geo)];
        if cell == Cell::Lstm {
            let last_c: Vec<(ValueId, u64)> = states.iter().map(|&v| (v, seq * bh)).collect();
            outs.push(self.final_state(cx, 2, &last_c, &geo));
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
    /// given one, or none (zeros: the RECURRENT op's default) when it is
    /// absent or a constant of zeros (as PyTorch exports `nn.LSTM` called
    /// without a state).
    fn initial_state(&mut self, cx: &Cx, given: Option<ValueId>, d: u64, geo: &Geometry, tag: &str) -> Option<ValueId> {
        let (b, h) = (geo.batch, geo.hidden);
        let v = given?;
        if self.konst(v).is_some_and(|c| c.floats().iter().all(|&x| x == 0.0)) {
            return None;
        }
        let part = CopyPart { src: v, src_offset: d * b * h, dst_offset: 0, sizes: vec![b * h], src_strides: vec![1], dst_strides: vec![1] };
        Some(self.device_tmp(cx, Kind::Copy { parts: vec![part] }, vec![b, h], &format!("d{d}.{tag}")))
    }

    /// Output `i` (Y_h or Y_c) from each direction's final state, `[batch,
    /// hidden]` at an element offset of a RECURRENT op's output.
    fn final_state(&mut self, cx: &Cx, i: usize, states: &[(ValueId, u64)], geo: &Geometry) -> ValueId {
        let (b, h, nd) = (geo.batch, geo.hidden, states.len() as u64);
        let parts = states
            .iter()
            .enumerate()
            .map(|(d, &(v, at))| CopyPart { src: v, src_offset: at, dst_offset: d as u64 * b * h, sizes: vec![b * h], src_strides: vec![1], dst_strides: vec![1] })
            .collect();
        self.device_out(cx, i, Kind::Copy { parts }, vec![nd, b, h])
    }

    /// `a·bᵀ` (`b` a constant `[n, k]`), plus `residual` and `bias` when given.
    #[allow(clippy::too_many_arguments)]
    fn gemm_t(&mut self, cx: &Cx, a: ValueId, b: ValueId, bias: Option<ValueId>, residual: Option<ValueId>, m: u64, n: u64, k: u64, tag: &str) -> ValueId {
        let kind = Kind::Gemm { a, b, bias, m, n, k, batch: 1, strides: [0; 3], trans_a: false, trans_b: true, b_packed: false, residual, act: Act::NONE };
        self.device_tmp(cx, kind, vec![m, n], tag)
    }

    /// One direction over the whole sequence: the projection GEMM and the
    /// RECURRENT op, whose output `[seq (+1 for an LSTM's c), batch,
    /// hidden]` holds every step's hidden state (in sequence order), then
    /// an LSTM's final cell state.
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
        h0: Option<ValueId>,
        c0: Option<ValueId>,
        geo: &Geometry,
        d: u64,
        reverse: bool,
    ) -> ValueId {
        let Geometry { seq, batch, hidden: hs, width } = *geo;
        let (wb, rb) = b.split_at(width as usize);
        // Biases outside the reset gate go into the projection: all of R's
        // but a linear-before-reset GRU's h gate's (Rb_h, applied inside
        // the reset by the RECURRENT op).
        let lbr = cell == (Cell::Gru { linear_before_reset: true });
        let inside = |j: usize| lbr && j as u64 >= 2 * hs;
        let proj_bias: Vec<f32> = (0..width as usize).map(|j| wb[j] + if inside(j) { 0.0 } else { rb[j] }).collect();
        let name = |what: &str| format!("{}.d{d}.{what}", cx.name);
        let wv = self.constant(&name("W"), Const::f32(&[width, isz], w.to_vec()));
        let bv = self.constant(&name("bias"), Const::f32(&[width], proj_bias));
        let x = self.gemm_t(cx, xs, wv, Some(bv), None, seq * batch, width, isz, &format!("d{d}.projection"));
        // The device takes Rᵀ `[hidden, width]` (whole rows scaled per step).
        let rt = fold::transpose(&Const::f32(&[width, hs], r.to_vec()), &[1, 0]);
        let rv = self.constant(&name("R_t"), rt);
        let rb_h = lbr.then(|| self.constant(&name("Rb_h"), Const::f32(&[hs], rb[(2 * hs) as usize..].to_vec())));
        let (code, flags) = match cell {
            Cell::Lstm => (REC_LSTM, 0),
            Cell::Gru { linear_before_reset } => (REC_GRU, if linear_before_reset { REC_LINEAR_BEFORE_RESET } else { 0 }),
            Cell::Rnn { relu: false } => (REC_RNN_TANH, 0),
            Cell::Rnn { relu: true } => (REC_RNN_RELU, 0),
        };
        let flags = flags | if reverse { REC_REVERSE } else { 0 };
        let kind = Kind::Recurrent { cell: code, flags, x, r: rv, rb: rb_h, h0, c0, seq, batch, hidden: hs };
        let rows = seq + u64::from(cell == Cell::Lstm);
        self.device_tmp(cx, kind, vec![rows, batch, hs], &format!("d{d}.states"))
    }
}
