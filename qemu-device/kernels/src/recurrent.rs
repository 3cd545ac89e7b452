//! A recurrent layer (LSTM, GRU, RNN) over a whole sequence in one call.
//!
//! Unrolled into GEMMs and element-wise ops, a layer costs several device
//! ops per step, each far smaller than an op's fixed cost when the hidden
//! size is a few dozen. Here the steps run in one loop: per step, one
//! matrix-vector product per batch row against the recurrent weights
//! (rows of `R` are contiguous, so each gate is a dot product) and the
//! cell's element-wise update, fused. The input projection `X·Wᵀ` of all
//! steps is not part of this: it is one large GEMM, done before.

use crate::error::{KernelError, Result};
use crate::fastmath::{self, madd, simd_dispatch};
use crate::util::{check_len, mul, sequential};
use rayon::prelude::*;

/// The cell a recurrent layer runs (ONNX gate orders: LSTM i, o, f, c;
/// GRU z, r, h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecCell {
    Lstm,
    /// `linear_before_reset`: the reset gate multiplies `h·R_hᵀ + Rb_h`
    /// instead of `h`.
    Gru { linear_before_reset: bool },
    Rnn { relu: bool },
}

impl RecCell {
    /// Gates per hidden unit.
    pub fn gates(self) -> usize {
        match self {
            RecCell::Lstm => 4,
            RecCell::Gru { .. } => 3,
            RecCell::Rnn { .. } => 1,
        }
    }
}

/// Sizes of one direction of a recurrent layer.
#[derive(Clone, Copy, Debug)]
pub struct RecurrentParams {
    pub cell: RecCell,
    pub seq: usize,
    pub batch: usize,
    pub hidden: usize,
    /// Steps run from the last to the first.
    pub reverse: bool,
}

/// The operands of [`recurrent`]: `x` `[seq, batch, G·H]`, `r` the
/// transposed recurrent weights `Rᵀ` `[H, G·H]`,
/// `rb` (linear-before-reset GRU) `[H]`, `h0` / `c0` `[batch, H]`.
pub struct RecurrentInputs<'a> {
    pub x: &'a [f32],
    pub r: &'a [f32],
    pub rb: Option<&'a [f32]>,
    pub h0: Option<&'a [f32]>,
    pub c0: Option<&'a [f32]>,
}

/// Runs the layer: `y[t]` `[batch, H]` receives the hidden state after step
/// `t`; `c_out` (LSTM) the final cell state. Same results as the unrolled
/// GEMM + UNARY + BINARY ops up to the order of the dot products' sums.
pub fn recurrent(p: &RecurrentParams, ins: &RecurrentInputs<'_>, y: &mut [f32], c_out: Option<&mut [f32]>) -> Result<()> {
    let (seq, batch, h) = (p.seq, p.batch, p.hidden);
    let g = p.cell.gates();
    let w = mul("recurrent width", g, h)?;
    let bh = mul("recurrent state", batch, h)?;
    check_len("recurrent x", ins.x.len(), mul("recurrent x", mul("recurrent x", seq, batch)?, w)?)?;
    check_len("recurrent r", ins.r.len(), mul("recurrent r", w, h)?)?;
    check_len("recurrent y", y.len(), mul("recurrent y", seq, bh)?)?;
    let lbr = p.cell == (RecCell::Gru { linear_before_reset: true });
    match (ins.rb, lbr) {
        (Some(rb), true) => check_len("recurrent rb", rb.len(), h)?,
        (None, false) => {}
        _ => return Err(KernelError::invalid("recurrent rb", "Rb_h is the operand of a linear-before-reset GRU only")),
    }
    if let Some(h0) = ins.h0 {
        check_len("recurrent h0", h0.len(), bh)?;
    }
    let lstm = p.cell == RecCell::Lstm;
    if !lstm && (ins.c0.is_some() || c_out.is_some()) {
        return Err(KernelError::invalid("recurrent c", "only an LSTM has a cell state"));
    }
    if let Some(c0) = ins.c0 {
        check_len("recurrent c0", c0.len(), bh)?;
    }
    if let Some(c) = &c_out {
        check_len("recurrent c", c.len(), bh)?;
    }
    if seq == 0 || bh == 0 {
        return Ok(());
    }
    // Work per step: the products with R dominate.
    let par = !sequential(mul("recurrent flops", 2 * bh, w)?);
    let mut c: Vec<f32> = match (lstm, ins.c0) {
        (true, Some(c0)) => c0.to_vec(),
        (true, None) => vec![0.0; bh],
        (false, _) => Vec::new(),
    };
    let mut gates = vec![0.0f32; batch * w];
    let mut hprev = ins.h0.map_or_else(|| vec![0.0; bh], <[f32]>::to_vec);
    // A GRU without linear-before-reset needs `r ⊙ h` between its two
    // products.
    let mut reset = if p.cell == (RecCell::Gru { linear_before_reset: false }) { vec![0.0f32; bh] } else { Vec::new() };
    for step in 0..seq {
        let t = if p.reverse { seq - 1 - step } else { step };
        let xt = &ins.x[t * batch * w..(t + 1) * batch * w];
        let yt = &mut y[t * bh..(t + 1) * bh];
        // x's columns `rows` of batch row b.
        let x_of = |rows: core::ops::Range<usize>| move |b: usize| &xt[b * w + rows.start..b * w + rows.end];
        match p.cell {
            RecCell::Lstm => {
                products(par, &hprev, ins.r, h, w, 0..w, x_of(0..w), &mut gates);
                lstm_update(&mut gates, &mut c, yt, h);
            }
            RecCell::Rnn { relu } => {
                products(par, &hprev, ins.r, h, w, 0..w, x_of(0..w), &mut gates);
                rnn_update(&gates, yt, relu);
            }
            RecCell::Gru { linear_before_reset: true } => {
                // z and r: x + h·Rᵀ; h: h·R_hᵀ + Rb_h alone (the reset
                // multiplies it before x is added).
                products(par, &hprev, ins.r, h, w, 0..2 * h, x_of(0..2 * h), &mut gates);
                let rb = ins.rb.unwrap_or(&[]);
                products(par, &hprev, ins.r, h, w, 2 * h..w, |_| rb, &mut gates);
                gru_update(&mut gates, xt, &hprev, yt, h, true);
            }
            RecCell::Gru { linear_before_reset: false } => {
                products(par, &hprev, ins.r, h, w, 0..2 * h, x_of(0..2 * h), &mut gates);
                gru_reset(&mut gates, &hprev, &mut reset, h);
                products(par, &reset, ins.r, h, w, 2 * h..w, x_of(2 * h..w), &mut gates);
                gru_update(&mut gates, xt, &hprev, yt, h, false);
            }
        }
        hprev.copy_from_slice(yt);
    }
    if let Some(out) = c_out {
        out.copy_from_slice(&c);
    }
    Ok(())
}

/// Gate columns a task computes when a step is split across threads.
const COLS_PER_TASK: usize = 128;

/// `gates[b, j] = add(b)[j − cols.start] + hs[b]·Rᵀ[·, j]` for the gate
/// columns `j` in `cols` of every batch row `b` (`gates` rows are `w`
/// wide, `rt` is `Rᵀ` `[h, w]`); sequential, or split over batch rows or
/// (one row) blocks of columns.
#[allow(clippy::too_many_arguments)]
fn products<'a>(par: bool, hs: &[f32], rt: &[f32], h: usize, w: usize, cols: core::ops::Range<usize>, add: impl Fn(usize) -> &'a [f32] + Sync, gates: &mut [f32]) {
    let (lo, hi) = (cols.start, cols.end);
    let batch = gates.len() / w;
    if par && batch == 1 {
        let add = add(0);
        gates[lo..hi].par_chunks_mut(COLS_PER_TASK).enumerate().for_each(|(i, out)| {
            let j0 = lo + i * COLS_PER_TASK;
            gemv_t(&hs[..h], rt, w, j0, &add[j0 - lo..j0 - lo + out.len()], out);
        });
    } else if par {
        gates.par_chunks_mut(w).enumerate().for_each(|(b, gb)| gemv_t(&hs[b * h..(b + 1) * h], rt, w, lo, add(b), &mut gb[lo..hi]));
    } else {
        for (b, gb) in gates.chunks_exact_mut(w).enumerate() {
            gemv_t(&hs[b * h..(b + 1) * h], rt, w, lo, add(b), &mut gb[lo..hi]);
        }
    }
}

simd_dispatch! {
    /// `out[i] = add[i] + Σ_k h[k]·rt[k·w + lo + i]`: rows of `Rᵀ` (columns
    /// `lo..lo + out.len()`) scaled and accumulated.
    fn gemv_t(h: &[f32], rt: &[f32], w: usize, lo: usize, add: &[f32], out: &mut [f32]) {
        out.copy_from_slice(add);
        let n = out.len();
        for (k, &hk) in h.iter().enumerate() {
            let row = &rt[k * w + lo..k * w + lo + n];
            for (o, &r) in out.iter_mut().zip(row) {
                *o = madd::<FMA>(hk, r, *o);
            }
        }
    }
}

/// `f` over a slice in place: a plain map, which vectorizes.
#[inline(always)]
fn map(xs: &mut [f32], f: impl Fn(f32) -> f32) {
    for v in xs {
        *v = f(*v);
    }
}

// The cell updates below work in passes over contiguous gate blocks (a
// squashing map, then the combination) rather than element by element
// across the blocks, so that each pass vectorizes.

simd_dispatch! {
    /// LSTM: `c = f⊙c + i⊙tanh(g_c)`, `h = o⊙tanh(c)` per batch row (the
    /// gates are squashed in place).
    fn lstm_update(gates: &mut [f32], c: &mut [f32], h_out: &mut [f32], h: usize) {
        for ((g, cb), hb) in gates.chunks_exact_mut(4 * h).zip(c.chunks_exact_mut(h)).zip(h_out.chunks_exact_mut(h)) {
            let (iof, gc) = g.split_at_mut(3 * h);
            map(iof, fastmath::sigmoid::<FMA>);
            map(gc, fastmath::tanh::<FMA>);
            let (i, of) = iof.split_at(h);
            let (o, f) = of.split_at(h);
            for k in 0..h {
                cb[k] = f[k] * cb[k] + i[k] * gc[k];
            }
            hb.copy_from_slice(cb);
            map(hb, fastmath::tanh::<FMA>);
            for k in 0..h {
                hb[k] *= o[k];
            }
        }
    }
}

simd_dispatch! {
    /// RNN: `h = act(gates)`.
    fn rnn_update(gates: &[f32], h_out: &mut [f32], relu: bool) {
        h_out.copy_from_slice(gates);
        if relu {
            map(h_out, |v| v.max(0.0));
        } else {
            map(h_out, fastmath::tanh::<FMA>);
        }
    }
}

simd_dispatch! {
    /// GRU without linear-before-reset, between its products: the z and r
    /// gates' sigmoids (in place) and `reset = r ⊙ h`.
    fn gru_reset(gates: &mut [f32], hprev: &[f32], reset: &mut [f32], h: usize) {
        let w = 3 * h;
        for ((g, hb), rs) in gates.chunks_exact_mut(w).zip(hprev.chunks_exact(h)).zip(reset.chunks_exact_mut(h)) {
            map(&mut g[..2 * h], fastmath::sigmoid::<FMA>);
            for k in 0..h {
                rs[k] = g[h + k] * hb[k];
            }
        }
    }
}

simd_dispatch! {
    /// GRU: `cand = tanh(x_h + r ⊙ (h·R_hᵀ + Rb_h))` (linear-before-reset:
    /// the gates hold `x + h·Rᵀ` for z and r, `h·R_hᵀ + Rb_h` for h) or
    /// `tanh(x_h + (r⊙h)·R_hᵀ)` (the gates hold it, z and r already
    /// squashed); `h = cand + z ⊙ (h_prev − cand)`. The gates are
    /// overwritten.
    fn gru_update(gates: &mut [f32], x: &[f32], hprev: &[f32], h_out: &mut [f32], h: usize, lbr: bool) {
        let w = 3 * h;
        for (((g, xb), hb), ob) in gates.chunks_exact_mut(w).zip(x.chunks_exact(w)).zip(hprev.chunks_exact(h)).zip(h_out.chunks_exact_mut(h)) {
            let (zr, cand) = g.split_at_mut(2 * h);
            if lbr {
                map(zr, fastmath::sigmoid::<FMA>);
                let (r, xh) = (&zr[h..], &xb[2 * h..]);
                for k in 0..h {
                    cand[k] = xh[k] + r[k] * cand[k];
                }
            }
            map(cand, fastmath::tanh::<FMA>);
            let z = &zr[..h];
            for k in 0..h {
                ob[k] = cand[k] + z[k] * (hb[k] - cand[k]);
            }
        }
    }
}
