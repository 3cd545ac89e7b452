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

/// The operands of [`recurrent`]: `x` `[seq, batch, G·H]`, `r` `[G·H, H]`,
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
                lstm_update(&gates, &mut c, yt, h);
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
                gru_update(&gates, xt, &hprev, yt, h, true);
            }
            RecCell::Gru { linear_before_reset: false } => {
                products(par, &hprev, ins.r, h, w, 0..2 * h, x_of(0..2 * h), &mut gates);
                gru_reset(&mut gates, &hprev, &mut reset, h);
                products(par, &reset, ins.r, h, w, 2 * h..w, x_of(2 * h..w), &mut gates);
                gru_update(&gates, xt, &hprev, yt, h, false);
            }
        }
        hprev.copy_from_slice(yt);
    }
    if let Some(out) = c_out {
        out.copy_from_slice(&c);
    }
    Ok(())
}

/// Gate rows a task computes when a step is split across threads.
const ROWS_PER_TASK: usize = 64;

/// `gates[b, j] = add(b)[j − rows.start] + hs[b]·R[j]` for the gate rows
/// `j` in `rows` of every batch row `b` (`gates` rows are `w` wide);
/// sequential or split over blocks of rows.
#[allow(clippy::too_many_arguments)]
fn products<'a>(par: bool, hs: &[f32], r: &[f32], h: usize, w: usize, rows: core::ops::Range<usize>, add: impl Fn(usize) -> &'a [f32] + Sync, gates: &mut [f32]) {
    let (lo, hi) = (rows.start, rows.end);
    for (b, gb) in gates.chunks_exact_mut(w).enumerate() {
        let (hb, ab) = (&hs[b * h..(b + 1) * h], add(b));
        if par {
            gb[lo..hi].par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(i, out)| {
                let (j0, n) = (lo + i * ROWS_PER_TASK, out.len());
                dot_rows(hb, &r[j0 * h..(j0 + n) * h], &ab[j0 - lo..j0 - lo + n], out);
            });
        } else {
            dot_rows(hb, &r[lo * h..hi * h], ab, &mut gb[lo..hi]);
        }
    }
}

simd_dispatch! {
    /// `out[j] = x[j] + h·r[j]` for the rows `r[j]` (each `h.len()` long).
    fn dot_rows(h: &[f32], r: &[f32], x: &[f32], out: &mut [f32]) {
        const L: usize = 16;
        let n = h.len();
        for ((o, &xv), row) in out.iter_mut().zip(x).zip(r.chunks_exact(n.max(1))) {
            let mut acc = [0.0f32; L];
            let (hc, ht) = h.split_at(n - n % L);
            let (rc, rt) = row.split_at(n - n % L);
            for (a, b) in hc.chunks_exact(L).zip(rc.chunks_exact(L)) {
                for l in 0..L {
                    acc[l] = madd::<FMA>(a[l], b[l], acc[l]);
                }
            }
            let mut s = 0.0f32;
            for (&a, &b) in ht.iter().zip(rt) {
                s = madd::<FMA>(a, b, s);
            }
            // Pairwise sum of the lanes.
            let mut width = L;
            while width > 1 {
                width /= 2;
                for l in 0..width {
                    acc[l] += acc[l + width];
                }
            }
            *o = xv + (acc[0] + s);
        }
    }
}

simd_dispatch! {
    /// LSTM: `c = f⊙c + i⊙tanh(g_c)`, `h = o⊙tanh(c)` per batch row.
    fn lstm_update(gates: &[f32], c: &mut [f32], h_out: &mut [f32], h: usize) {
        for ((g, cb), hb) in gates.chunks_exact(4 * h).zip(c.chunks_exact_mut(h)).zip(h_out.chunks_exact_mut(h)) {
            let (gi, rest) = g.split_at(h);
            let (go, rest) = rest.split_at(h);
            let (gf, gc) = rest.split_at(h);
            for k in 0..h {
                let i = fastmath::sigmoid::<FMA>(gi[k]);
                let o = fastmath::sigmoid::<FMA>(go[k]);
                let f = fastmath::sigmoid::<FMA>(gf[k]);
                let cand = fastmath::tanh::<FMA>(gc[k]);
                let cn = f * cb[k] + i * cand;
                cb[k] = cn;
                hb[k] = o * fastmath::tanh::<FMA>(cn);
            }
        }
    }
}

simd_dispatch! {
    /// RNN: `h = act(gates)`.
    fn rnn_update(gates: &[f32], h_out: &mut [f32], relu: bool) {
        for (o, &v) in h_out.iter_mut().zip(gates) {
            *o = if relu { v.max(0.0) } else { fastmath::tanh::<FMA>(v) };
        }
    }
}

simd_dispatch! {
    /// GRU without linear-before-reset, between its products: the z and r
    /// gates' sigmoids (in place) and `reset = r ⊙ h`.
    fn gru_reset(gates: &mut [f32], hprev: &[f32], reset: &mut [f32], h: usize) {
        let w = 3 * h;
        for ((g, hb), rs) in gates.chunks_exact_mut(w).zip(hprev.chunks_exact(h)).zip(reset.chunks_exact_mut(h)) {
            for v in &mut g[..2 * h] {
                *v = fastmath::sigmoid::<FMA>(*v);
            }
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
    /// squashed); `h = cand + z ⊙ (h_prev − cand)`.
    fn gru_update(gates: &[f32], x: &[f32], hprev: &[f32], h_out: &mut [f32], h: usize, lbr: bool) {
        let w = 3 * h;
        for (((g, xb), hb), ob) in gates.chunks_exact(w).zip(x.chunks_exact(w)).zip(hprev.chunks_exact(h)).zip(h_out.chunks_exact_mut(h)) {
            for k in 0..h {
                let (z, cand) = if lbr {
                    let z = fastmath::sigmoid::<FMA>(g[k]);
                    let r = fastmath::sigmoid::<FMA>(g[h + k]);
                    (z, fastmath::tanh::<FMA>(xb[2 * h + k] + r * g[2 * h + k]))
                } else {
                    (g[k], fastmath::tanh::<FMA>(g[2 * h + k]))
                };
                ob[k] = cand + z * (hb[k] - cand);
            }
        }
    }
}
