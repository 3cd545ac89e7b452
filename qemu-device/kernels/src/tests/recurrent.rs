//! The fused recurrent kernel against a naive f64 reference written from
//! the ONNX definitions of LSTM, GRU (both reset placements) and RNN:
//! every cell, both directions, given and zero initial states, hidden
//! sizes around the vector width and one large enough to split its steps
//! across threads; and its operand checks.

use super::{assert_close, Rng};
use crate::*;

fn sig(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `(y [seq, batch, H], final c)` by the ONNX equations, in f64. `x` is
/// the projection (`X·Wᵀ` + the biases outside the cell), `rb` the
/// linear-before-reset GRU's `Rb_h`.
#[allow(clippy::too_many_arguments)]
fn reference(p: &RecurrentParams, x: &[f32], r: &[f32], rb: Option<&[f32]>, h0: Option<&[f32]>, c0: Option<&[f32]>) -> (Vec<f64>, Vec<f64>) {
    let (seq, batch, h) = (p.seq, p.batch, p.hidden);
    let w = p.cell.gates() * h;
    let f = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
    let mut hs = h0.map_or(vec![0.0; batch * h], f);
    let mut cs = c0.map_or(vec![0.0; batch * h], f);
    let mut y = vec![0.0; seq * batch * h];
    // row j of R times a state vector.
    let dot = |j: usize, v: &[f64]| (0..h).map(|k| r[j * h + k] as f64 * v[k]).sum::<f64>();
    for step in 0..seq {
        let t = if p.reverse { seq - 1 - step } else { step };
        let mut next = vec![0.0; batch * h];
        for b in 0..batch {
            let hb = &hs[b * h..(b + 1) * h];
            let xg = |j: usize| x[(t * batch + b) * w + j] as f64;
            for k in 0..h {
                next[b * h + k] = match p.cell {
                    RecCell::Lstm => {
                        let g = |gate: usize| xg(gate * h + k) + dot(gate * h + k, hb);
                        let (i, o, fg, cand) = (sig(g(0)), sig(g(1)), sig(g(2)), g(3).tanh());
                        let c = fg * cs[b * h + k] + i * cand;
                        cs[b * h + k] = c;
                        o * c.tanh()
                    }
                    RecCell::Rnn { relu } => {
                        let v = xg(k) + dot(k, hb);
                        if relu {
                            v.max(0.0)
                        } else {
                            v.tanh()
                        }
                    }
                    RecCell::Gru { linear_before_reset } => {
                        let z = sig(xg(k) + dot(k, hb));
                        let cand = if linear_before_reset {
                            let rg = sig(xg(h + k) + dot(h + k, hb));
                            (xg(2 * h + k) + rg * (dot(2 * h + k, hb) + rb.unwrap()[k] as f64)).tanh()
                        } else {
                            let reset: Vec<f64> = (0..h).map(|m| sig(xg(h + m) + dot(h + m, hb)) * hb[m]).collect();
                            (xg(2 * h + k) + dot(2 * h + k, &reset)).tanh()
                        };
                        (1.0 - z) * cand + z * hb[k]
                    }
                };
            }
        }
        // An LSTM's c was updated in place above; its h uses the new c.
        hs = next;
        y[t * batch * h..(t + 1) * batch * h].copy_from_slice(&hs);
    }
    (y, cs)
}

/// `[rows, cols]` → `[cols, rows]`.
pub(crate) fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols).map(|i| m[(i % rows) * cols + i / rows]).collect()
}

const CELLS: &[RecCell] = &[
    RecCell::Lstm,
    RecCell::Gru { linear_before_reset: false },
    RecCell::Gru { linear_before_reset: true },
    RecCell::Rnn { relu: false },
    RecCell::Rnn { relu: true },
];

fn check(rng: &mut Rng, cell: RecCell, seq: usize, batch: usize, hidden: usize, reverse: bool, given: bool) {
    let p = RecurrentParams { cell, seq, batch, hidden, reverse };
    let w = cell.gates() * hidden;
    // Weights scaled like a trained layer's (|h·R| stays around 1).
    let scale = 1.0 / (hidden as f32).sqrt();
    let x = rng.vec(seq * batch * w);
    let r: Vec<f32> = rng.vec(w * hidden).iter().map(|v| v * scale).collect();
    let lbr = cell == (RecCell::Gru { linear_before_reset: true });
    let rb = lbr.then(|| rng.vec(hidden));
    let lstm = cell == RecCell::Lstm;
    let h0 = given.then(|| rng.vec(batch * hidden));
    let c0 = (given && lstm).then(|| rng.vec(batch * hidden));
    // The kernel takes Rᵀ `[H, W]`.
    let rt = transpose(&r, w, hidden);
    let ins = RecurrentInputs { x: &x, r: &rt, rb: rb.as_deref(), h0: h0.as_deref(), c0: c0.as_deref() };
    let mut y = vec![f32::NAN; seq * batch * hidden];
    let mut c = vec![f32::NAN; batch * hidden];
    recurrent(&p, &ins, &mut y, lstm.then_some(&mut c[..])).unwrap();
    let (want_y, want_c) = reference(&p, &x, &r, rb.as_deref(), h0.as_deref(), c0.as_deref());
    let ctx = format!("{cell:?} seq {seq} batch {batch} hidden {hidden} reverse {reverse} given {given}");
    // States are O(1) (h in [-1, 1]): errors are measured against 1, not
    // against values that cancel to near 0 in `cand + z·(h − cand)`.
    let ones = vec![1.0; y.len()];
    assert_close(&format!("{ctx}: y"), &y, &want_y, Some(&ones), 2e-5);
    if lstm {
        assert_close(&format!("{ctx}: c"), &c, &want_c, Some(&ones[..c.len()]), 2e-5);
    }
}

#[test]
fn every_cell_matches_the_onnx_equations() {
    let mut rng = Rng::new(23);
    for &cell in CELLS {
        for &hidden in &[1, 5, 16, 24, 33] {
            for reverse in [false, true] {
                let (seq, batch, given) = (rng.range(1, 7), rng.range(1, 3), rng.bool());
                check(&mut rng, cell, seq, batch, hidden, reverse, given);
            }
        }
    }
}

#[test]
fn large_steps_split_across_threads_give_the_same_states() {
    // 2·batch·H·W ≥ 2^20 FLOPs per step: the products run in row blocks.
    let mut rng = Rng::new(24);
    let pool = thread_pool(2).unwrap();
    pool.install(|| {
        for &cell in CELLS {
            check(&mut rng, cell, 3, 2, 272, true, true);
        }
    });
}

#[test]
fn operands_are_checked() {
    let p = RecurrentParams { cell: RecCell::Lstm, seq: 2, batch: 1, hidden: 3, reverse: false };
    let (x, r) = (vec![0.0; 24], vec![0.0; 36]);
    let mut y = vec![0.0; 6];
    let mut c = vec![0.0; 3];
    let ok = RecurrentInputs { x: &x, r: &r, rb: None, h0: None, c0: None };
    assert!(recurrent(&p, &ok, &mut y, Some(&mut c)).is_ok());
    assert!(recurrent(&p, &RecurrentInputs { x: &x[..23], ..ok }, &mut y, None).is_err());
    assert!(recurrent(&p, &RecurrentInputs { r: &r[..35], ..ok }, &mut y, None).is_err());
    assert!(recurrent(&p, &RecurrentInputs { h0: Some(&x[..2]), ..ok }, &mut y, None).is_err());
    assert!(recurrent(&p, &RecurrentInputs { rb: Some(&x[..3]), ..ok }, &mut y, None).is_err(), "Rb_h belongs to a GRU");
    assert!(recurrent(&p, &ok, &mut y[..5], None).is_err());
    assert!(recurrent(&p, &ok, &mut y, Some(&mut c[..2])).is_err());
    let rnn = RecurrentParams { cell: RecCell::Rnn { relu: false }, ..p };
    assert!(recurrent(&rnn, &RecurrentInputs { x: &x[..6], r: &r[..9], ..ok }, &mut y, Some(&mut c)).is_err(), "no cell state out of an RNN");
    let gru = RecurrentParams { cell: RecCell::Gru { linear_before_reset: true }, ..p };
    assert!(recurrent(&gru, &RecurrentInputs { x: &x[..18], r: &r[..27], ..ok }, &mut y, None).is_err(), "a linear-before-reset GRU needs Rb_h");
}
