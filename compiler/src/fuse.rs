//! Graph rewrites that make fewer, bigger device ops:
//!
//! - the erf form of GELU (`x * 0.5 * (1 + erf(x / sqrt 2))`) and its tanh
//!   approximation (`... tanh(sqrt(2/pi) * (x + 0.044715 x^3))`) become one
//!   GELU op, `x * sigmoid(x)` one SiLU op, and the decomposed layer norm
//!   (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div [, Mul, Add]) one
//!   LayerNorm op;
//! - zero Pad before a Conv becomes the Conv's padding;
//! - a constant scale of a product whose operand comes from a GEMM with
//!   constant weights (attention's `/ sqrt(d)`) moves into those weights;
//! - per-channel constant Mul/Add after a Conv (BatchNormalization) fold
//!   into its weights and bias;
//! - a constant bias Add after a GEMM or Conv becomes its bias;
//! - a run-time Add of a GEMM's or Conv's result and a tensor of the same
//!   shape (a residual connection) becomes that op's residual operand;
//! - an activation after a GEMM, Conv or element-wise binary op becomes its
//!   fused activation;
//! - ops whose results nobody reads are dropped.
//!
//! A rewrite only consumes values that exactly one op reads and that are
//! not model outputs, so no one else sees an intermediate disappear.

use rbln_hw::ops::{Binary, Unary, REDUCE_MEAN};

use crate::ir::{Act, Const, Graph, Kind, Op, ValueId};
use crate::shape::volume;

/// What the rewrites did (for the compile report).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FuseStats {
    pub gelu: usize,
    pub gelu_tanh: usize,
    pub silu: usize,
    pub layer_norm: usize,
    pub rms_norm: usize,
    pub folded_into_conv: usize,
    pub pad_into_conv: usize,
    pub scale_into_weights: usize,
    pub bias: usize,
    pub residual: usize,
    pub activation: usize,
    pub dead: usize,
    /// Element-wise ops absorbed into ELTWISE programs
    /// ([`crate::eltwise`], after the int8 lowering).
    pub eltwise: usize,
}

pub fn run(g: &mut Graph) -> FuseStats {
    let mut st = FuseStats::default();
    // Each rule runs to a fixed point before the next: the patterns come
    // first (they consume plain element-wise ops), then the Conv folds,
    // then bias before activation (the activation applies after the bias);
    // scales move into weights once the projections carry their biases.
    let rules: [(Rule, &mut usize); 11] = [
        (gelu, &mut st.gelu),
        (gelu_tanh, &mut st.gelu_tanh),
        (silu, &mut st.silu),
        (layer_norm, &mut st.layer_norm),
        (rms_norm, &mut st.rms_norm),
        (pad_into_conv, &mut st.pad_into_conv),
        (conv_affine, &mut st.folded_into_conv),
        (bias, &mut st.bias),
        (scale_into_weights, &mut st.scale_into_weights),
        (residual, &mut st.residual),
        (activation, &mut st.activation),
    ];
    for (rule, count) in rules {
        while rewrite_once(g, rule).is_some() {
            *count += 1;
        }
    }
    st.dead = dead_code(g);
    st
}

/// Maps for pattern matching, rebuilt after every rewrite.
pub(crate) struct Index {
    pub(crate) producer: Vec<Option<usize>>,
    /// Distinct ops reading each value.
    pub(crate) consumers: Vec<Vec<usize>>,
    pub(crate) is_output: Vec<bool>,
}

impl Index {
    pub(crate) fn new(g: &Graph) -> Self {
        let mut producer = vec![None; g.values.len()];
        let mut consumers = vec![Vec::new(); g.values.len()];
        for (i, op) in g.ops.iter().enumerate() {
            producer[op.out] = Some(i);
            for v in op.kind.inputs() {
                if consumers[v].last() != Some(&i) {
                    consumers[v].push(i);
                }
            }
        }
        let mut is_output = vec![false; g.values.len()];
        for (_, v) in &g.outputs {
            is_output[*v] = true;
        }
        Index { producer, consumers, is_output }
    }

    /// The one op reading `v`, if exactly one does and `v` is internal.
    fn sole_reader(&self, v: ValueId) -> Option<usize> {
        match self.consumers[v].as_slice() {
            [only] if !self.is_output[v] => Some(*only),
            _ => None,
        }
    }
}

/// A rewrite: given the graph and an op index, either rewrites around that
/// op and returns the ops to delete, or returns None.
type Rule = fn(&mut Graph, &Index, usize) -> Option<Vec<usize>>;

fn rewrite_once(g: &mut Graph, rule: Rule) -> Option<()> {
    let idx = Index::new(g);
    for i in 0..g.ops.len() {
        if let Some(mut dead) = rule(g, &idx, i) {
            dead.sort_unstable();
            dead.dedup();
            for d in dead.into_iter().rev() {
                g.ops.remove(d);
            }
            return Some(());
        }
    }
    None
}

fn scalar_near(g: &Graph, v: ValueId, want: f32) -> bool {
    g.konst(v).and_then(Const::scalar).is_some_and(|x| (x - want).abs() <= 1e-4 * want.abs().max(1.0))
}

/// `(kind, a, b)` of a Binary op.
fn binary(op: &Op) -> Option<(Binary, ValueId, ValueId)> {
    match op.kind {
        Kind::Binary { kind, a, b, .. } => Some((kind, a, b)),
        _ => None,
    }
}

/// For a commutative op reading `v`, the other operand.
fn other(a: ValueId, b: ValueId, v: ValueId) -> Option<ValueId> {
    if a == v {
        Some(b)
    } else if b == v {
        Some(a)
    } else {
        None
    }
}

/// Op `c` (the sole reader of op `p`'s result) becomes `kind`, which does
/// the work of both; it keeps `p`'s ONNX name and its own output. Returns
/// the op to delete (`p`).
fn absorb(g: &mut Graph, p: usize, c: usize, kind: Kind) -> Option<Vec<usize>> {
    let label = join(&g.ops[p].op, &g.ops[c].op);
    let name = g.ops[p].name.clone();
    let op = &mut g.ops[c];
    op.kind = kind;
    op.name = name;
    op.op = label;
    Some(vec![p])
}

fn join(a: &str, b: &str) -> String {
    if a.rsplit('+').next() == Some(b) {
        a.to_string()
    } else {
        format!("{a}+{b}")
    }
}

/// `x * 0.5 * (1 + erf(x / sqrt(2)))`, in the operand orders exporters use.
fn gelu(g: &mut Graph, ix: &Index, i: usize) -> Option<Vec<usize>> {
    let Kind::Unary { kind: Unary::Erf, x: u, .. } = g.ops[i].kind else { return None };
    let p = ix.producer[u]?;
    ix.sole_reader(u)?;
    let (pk, pa, pb) = binary(&g.ops[p])?;
    let x = match pk {
        Binary::Div if scalar_near(g, pb, std::f32::consts::SQRT_2) => pa,
        Binary::Mul if scalar_near(g, pb, std::f32::consts::FRAC_1_SQRT_2) => pa,
        Binary::Mul if scalar_near(g, pa, std::f32::consts::FRAC_1_SQRT_2) => pb,
        _ => return None,
    };
    let mut dead = vec![p, i];
    let c = gelu_tail(g, ix, i, x, &mut dead)?;
    let op = &mut g.ops[c];
    op.kind = Kind::Unary { kind: Unary::Gelu, x, p0: 0.0, p1: 0.0 };
    op.op = "Gelu(erf)".into();
    Some(dead)
}

/// The tanh approximation of GELU (GPT-2's `gelu_new`, PyTorch's
/// `gelu(approximate="tanh")` as exporters decompose it):
/// `x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`, with x^3 as
/// `Pow(x, 3)` or `x * x * x`, in the operand orders exporters use.
fn gelu_tanh(g: &mut Graph, ix: &Index, i: usize) -> Option<Vec<usize>> {
    let Kind::Unary { kind: Unary::Tanh, x: u, .. } = g.ops[i].kind else { return None };
    // u = sqrt(2/pi) * v
    let p = ix.producer[u]?;
    ix.sole_reader(u)?;
    let (Binary::Mul, a, b) = binary(&g.ops[p])? else { return None };
    let k = std::f32::consts::FRAC_2_SQRT_PI * std::f32::consts::FRAC_1_SQRT_2;
    let v = if scalar_near(g, a, k) { b } else if scalar_near(g, b, k) { a } else { return None };
    // v = x + w
    let q = ix.producer[v]?;
    ix.sole_reader(v)?;
    let (Binary::Add, a, b) = binary(&g.ops[q])? else { return None };
    // w = 0.044715 * x^3, and the Add's other operand is x.
    let (x, w, r) = [(a, b), (b, a)].into_iter().find_map(|(x, w)| {
        let r = ix.producer[w]?;
        ix.sole_reader(w)?;
        let (Binary::Mul, ra, rb) = binary(&g.ops[r])? else { return None };
        let cube = if scalar_near(g, ra, 0.044715) { rb } else if scalar_near(g, rb, 0.044715) { ra } else { return None };
        is_cube_of(g, ix, cube, x).then_some((x, w, r))
    })?;
    let _ = w;
    let mut dead = vec![p, q, r, i];
    dead.extend(cube_ops(g, ix, &g.ops[r]));
    let c = gelu_tail(g, ix, i, x, &mut dead)?;
    let op = &mut g.ops[c];
    op.kind = Kind::Unary { kind: Unary::GeluTanh, x, p0: 0.0, p1: 0.0 };
    op.op = "Gelu(tanh)".into();
    Some(dead)
}

/// Whether `c` (read only by the 0.044715 scale) is `Pow(x, 3)` or
/// `x * x * x` (either association).
fn is_cube_of(g: &Graph, ix: &Index, c: ValueId, x: ValueId) -> bool {
    let Some(pc) = ix.producer[c].filter(|_| ix.sole_reader(c).is_some()) else { return false };
    match binary(&g.ops[pc]) {
        Some((Binary::Pow, a, b)) => a == x && scalar_near(g, b, 3.0),
        Some((Binary::Mul, a, b)) => {
            let square = |s: ValueId| {
                ix.producer[s].filter(|_| ix.sole_reader(s).is_some()).and_then(|ps| binary(&g.ops[ps]))
                    == Some((Binary::Mul, x, x))
            };
            (a == x && square(b)) || (b == x && square(a))
        }
        _ => false,
    }
}

/// The ops making the cube that the scale op `scale` reads (valid after
/// [`is_cube_of`] said yes).
fn cube_ops(g: &Graph, ix: &Index, scale: &Op) -> Vec<usize> {
    let mut ops = Vec::new();
    let Some((_, a, b)) = binary(scale) else { return ops };
    for c in [a, b] {
        let Some(pc) = ix.producer[c] else { continue };
        match binary(&g.ops[pc]) {
            Some((Binary::Pow, ..)) => ops.push(pc),
            Some((Binary::Mul, ma, mb)) => {
                ops.push(pc);
                for s in [ma, mb] {
                    if let Some(ps) = ix.producer[s] {
                        if binary(&g.ops[ps]).is_some_and(|(k, ..)| k == Binary::Mul) && ix.sole_reader(s).is_some() {
                            ops.push(ps);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    ops
}

/// The `* 0.5 * (1 + t) * x` tail shared by both GELU forms, from op `t`
/// (erf or tanh), in any order, `x * 0.5` possibly computed on the side.
/// Pushes the consumed ops onto `dead` and returns the last op, which
/// becomes the GELU.
fn gelu_tail(g: &Graph, ix: &Index, t: usize, x: ValueId, dead: &mut Vec<usize>) -> Option<usize> {
    let (mut add, mut with_x, mut half) = (false, false, false);
    let mut cur = g.ops[t].out;
    loop {
        let c = ix.sole_reader(cur)?;
        let (k, a, b) = binary(&g.ops[c])?;
        let o = other(a, b, cur)?;
        match k {
            Binary::Add if !add && scalar_near(g, o, 1.0) => add = true,
            Binary::Mul if !half && scalar_near(g, o, 0.5) => half = true,
            Binary::Mul if add && !with_x && o == x => with_x = true,
            Binary::Mul if add && !with_x && !half => {
                // (x * 0.5) computed on the side.
                let h = ix.producer[o]?;
                ix.sole_reader(o)?;
                let (hk, ha, hb) = binary(&g.ops[h])?;
                let ok = hk == Binary::Mul && other(ha, hb, x).is_some_and(|c| scalar_near(g, c, 0.5));
                if !ok {
                    return None;
                }
                dead.push(h);
                with_x = true;
                half = true;
            }
            _ => return None,
        }
        cur = g.ops[c].out;
        if add && with_x && half {
            return (g.values[cur].shape == g.values[x].shape).then_some(c);
        }
        dead.push(c);
    }
}

/// `x * sigmoid(x)` (SiLU, Swish).
fn silu(g: &mut Graph, ix: &Index, i: usize) -> Option<Vec<usize>> {
    let Kind::Unary { kind: Unary::Sigmoid, x, .. } = g.ops[i].kind else { return None };
    let m = ix.sole_reader(g.ops[i].out)?;
    let (Binary::Mul, a, b) = binary(&g.ops[m])? else { return None };
    if other(a, b, g.ops[i].out)? != x || g.values[g.ops[m].out].shape != g.values[x].shape {
        return None;
    }
    let op = &mut g.ops[m];
    op.kind = Kind::Unary { kind: Unary::Silu, x, p0: 0.0, p1: 0.0 };
    op.op = "Silu".into();
    Some(vec![i])
}

/// Whether `p` (a per-row parameter of a layer norm over the last `cols`
/// elements of `x`) broadcasts only over the leading dims.
fn trailing(g: &Graph, p: ValueId, x: ValueId, cols: u64) -> bool {
    let ps: Vec<u64> = g.values[p].shape.iter().copied().skip_while(|&d| d == 1).collect();
    let xs = &g.values[x].shape;
    volume(&ps) == cols && xs.ends_with(&ps) && g.konst(p).is_some()
}

/// The op that alone reads op `i`'s result and combines it by `kind`
/// with a [`trailing`] constant of a norm over `x`, and that constant.
fn trailing_param(g: &Graph, ix: &Index, i: usize, kind: Binary, x: ValueId, cols: u64) -> Option<(usize, ValueId)> {
    let m = ix.sole_reader(g.ops[i].out)?;
    let (k, a, b) = binary(&g.ops[m])?;
    let p = other(a, b, g.ops[i].out)?;
    (k == kind && trailing(g, p, x, cols)).then_some((m, p))
}

/// `(x - mean) / sqrt(mean((x - mean)^2) + eps) [* gamma] [+ beta]` over
/// the trailing elements of each row.
fn layer_norm(g: &mut Graph, ix: &Index, i: usize) -> Option<Vec<usize>> {
    let reduce_rows = |op: &Op| -> Option<(ValueId, u64, u64)> {
        match &op.kind {
            Kind::Reduce { kind: REDUCE_MEAN, x, dims, axis: 1 } if dims[2] == 1 => Some((*x, dims[0], dims[1])),
            _ => None,
        }
    };
    let (x, rows, cols) = reduce_rows(&g.ops[i])?;
    let mean = g.ops[i].out;
    let s = ix.sole_reader(mean)?;
    let (Binary::Sub, sx, sm) = binary(&g.ops[s])? else { return None };
    if sx != x || sm != mean {
        return None;
    }
    let d = g.ops[s].out;
    if ix.is_output[d] || ix.consumers[d].len() != 2 {
        return None;
    }
    // One reader squares d, the other divides it by the deviation.
    let (q, div) = {
        let (c0, c1) = (ix.consumers[d][0], ix.consumers[d][1]);
        let is_sq = |c: usize| match binary(&g.ops[c]) {
            Some((Binary::Pow, a, b)) => a == d && scalar_near(g, b, 2.0),
            Some((Binary::Mul, a, b)) => a == d && b == d,
            _ => false,
        };
        if is_sq(c0) { (c0, c1) } else if is_sq(c1) { (c1, c0) } else { return None }
    };
    let r2 = ix.sole_reader(g.ops[q].out)?;
    if reduce_rows(&g.ops[r2])? != (g.ops[q].out, rows, cols) {
        return None;
    }
    let a = ix.sole_reader(g.ops[r2].out)?;
    let (Binary::Add, av, ae) = binary(&g.ops[a])? else { return None };
    let eps = g.konst(other(av, ae, g.ops[r2].out)?)?.scalar()?;
    let sq = ix.sole_reader(g.ops[a].out)?;
    let Kind::Unary { kind: Unary::Sqrt, .. } = g.ops[sq].kind else { return None };
    if ix.sole_reader(g.ops[sq].out)? != div {
        return None;
    }
    let (Binary::Div, dn, dd) = binary(&g.ops[div])? else { return None };
    if dn != d || dd != g.ops[sq].out {
        return None;
    }
    let mut dead = vec![i, s, q, r2, a, sq];
    let mut last = div;
    let (mut gamma, mut beta) = (None, None);
    if let Some((m, p)) = trailing_param(g, ix, div, Binary::Mul, x, cols) {
        gamma = Some(p);
        dead.push(last);
        last = m;
        if let Some((ad, p)) = trailing_param(g, ix, m, Binary::Add, x, cols) {
            beta = Some(p);
            dead.push(last);
            last = ad;
        }
    }
    if g.values[g.ops[last].out].shape != g.values[x].shape {
        return None;
    }
    let name = g.ops[i].name.clone();
    let op = &mut g.ops[last];
    op.kind = Kind::LayerNorm { x, gamma, beta, rows, cols, eps, rms: false };
    op.op = "LayerNorm(decomposed)".into();
    op.name = name;
    Some(dead)
}

/// `x / sqrt(mean(x^2) + eps) [* gamma]` over the trailing elements of
/// each row (RMSNorm, as LLaMA, Qwen and T5 export it: `x * (1 /
/// sqrt(...))`, or `x / sqrt(...)`), `x^2` as `Pow(x, 2)` or `x * x`.
fn rms_norm(g: &mut Graph, ix: &Index, i: usize) -> Option<Vec<usize>> {
    let Kind::Reduce { kind: REDUCE_MEAN, x: sq_out, ref dims, axis: 1 } = g.ops[i].kind else { return None };
    if dims[2] != 1 {
        return None;
    }
    let (rows, cols) = (dims[0], dims[1]);
    let q = ix.producer[sq_out]?;
    let x = match binary(&g.ops[q])? {
        (Binary::Pow, a, b) if scalar_near(g, b, 2.0) => a,
        (Binary::Mul, a, b) if a == b => a,
        _ => return None,
    };
    if ix.sole_reader(sq_out)? != i || g.values[x].shape != g.values[sq_out].shape {
        return None;
    }
    let a = ix.sole_reader(g.ops[i].out)?;
    let (Binary::Add, av, ae) = binary(&g.ops[a])? else { return None };
    let eps = g.konst(other(av, ae, g.ops[i].out)?)?.scalar()?;
    let sq = ix.sole_reader(g.ops[a].out)?;
    let Kind::Unary { kind: Unary::Sqrt, .. } = g.ops[sq].kind else { return None };
    let s = g.ops[sq].out;
    let d = ix.sole_reader(s)?;
    let mut dead = vec![q, i, a, sq];
    // x / s, or x * (1 / s) with the reciprocal as a Div or a Reciprocal.
    let normed = match (&g.ops[d].kind, binary(&g.ops[d])) {
        (_, Some((Binary::Div, n, den))) if den == s && n == x => d,
        (kind, bin) => {
            let recip = match (kind, bin) {
                (_, Some((Binary::Div, n, den))) => den == s && scalar_near(g, n, 1.0),
                (Kind::Unary { kind: Unary::Reciprocal, .. }, _) => true,
                _ => false,
            };
            if !recip {
                return None;
            }
            let r = g.ops[d].out;
            let m = ix.sole_reader(r)?;
            let (Binary::Mul, ma, mb) = binary(&g.ops[m])? else { return None };
            if other(ma, mb, r)? != x {
                return None;
            }
            dead.push(d);
            m
        }
    };
    let mut last = normed;
    let mut gamma = None;
    // The weight may come after identity views (LLaMA's and Qwen's
    // exports cast the normalised value to its own type first).
    let (mut cur, mut views) = (normed, Vec::new());
    while let Some(v) = ix.sole_reader(g.ops[cur].out) {
        if !matches!(g.ops[v].kind, Kind::View { .. }) || g.values[g.ops[v].out].shape != g.values[x].shape {
            break;
        }
        views.push(v);
        cur = v;
    }
    if let Some((m, p)) = trailing_param(g, ix, cur, Binary::Mul, x, cols) {
        gamma = Some(p);
        dead.push(last);
        dead.extend(views);
        last = m;
    }
    if g.values[g.ops[last].out].shape != g.values[x].shape {
        return None;
    }
    let name = g.ops[i].name.clone();
    let op = &mut g.ops[last];
    op.kind = Kind::LayerNorm { x, gamma, beta: None, rows, cols, eps, rms: true };
    op.op = "RMSNorm(decomposed)".into();
    op.name = name;
    Some(dead)
}

/// Per-channel constant of a conv with `c_out` channels and an output of
/// rank `rank`: its values when it broadcasts as [1, C, 1, ...].
fn per_channel(g: &Graph, v: ValueId, c_out: u64, rank: usize) -> Option<Vec<f32>> {
    let c = g.konst(v)?;
    if c.shape.len() > rank {
        return None;
    }
    let p = crate::shape::pad_rank(&c.shape, rank);
    let ok = p.iter().enumerate().all(|(i, &d)| d == if i == 1 { c_out } else { 1 });
    ok.then(|| c.floats())
}

/// Conv followed by a per-channel constant Mul or Add (a folded
/// BatchNormalization): scale the weights and bias, or shift the bias.
fn conv_affine(g: &mut Graph, ix: &Index, i: usize) -> Option<Vec<usize>> {
    let Kind::Conv { w, bias, dims, act, residual: None, .. } = g.ops[i].kind.clone() else { return None };
    if act != Act::NONE {
        return None;
    }
    let c = ix.sole_reader(g.ops[i].out)?;
    let (k, a, b) = binary(&g.ops[c])?;
    let p = other(a, b, g.ops[i].out)?;
    let vals = per_channel(g, p, dims[4], g.values[g.ops[i].out].shape.len())?;
    let old_bias = match bias {
        Some(bv) => g.konst(bv)?.floats(),
        None => vec![0.0; dims[4] as usize],
    };
    let (new_w, new_b) = match k {
        Binary::Mul => {
            let wc = g.konst(w)?;
            let per = wc.len() / dims[4] as usize;
            let wv: Vec<f32> = wc.floats().iter().enumerate().map(|(j, &x)| x * vals[j / per]).collect();
            (Some(Const::f32(&wc.shape, wv)), old_bias.iter().zip(&vals).map(|(b, s)| b * s).collect::<Vec<f32>>())
        }
        Binary::Add => (None, old_bias.iter().zip(&vals).map(|(b, t)| b + t).collect()),
        _ => return None,
    };
    let name = g.ops[i].name.clone();
    let w2 = match new_w {
        Some(c) => g.add_value(&format!("{name}.W.folded"), c.shape.clone(), Some(c)),
        None => w,
    };
    let b2 = g.add_value(&format!("{name}.B.folded"), vec![dims[4]], Some(Const::f32(&[dims[4]], new_b)));
    let Kind::Conv { x, stride, dilation, pads, .. } = g.ops[i].kind else { return None };
    absorb(g, i, c, Kind::Conv { x, w: w2, bias: Some(b2), dims, stride, dilation, pads, residual: None, act, winograd: false })
}

/// Zero padding of the spatial dims before a Conv becomes the Conv's own
/// padding (TensorFlow exports write it as a separate Pad).
fn pad_into_conv(g: &mut Graph, ix: &Index, i: usize) -> Option<Vec<usize>> {
    let Kind::Pad { x, value, ref begin, ref end, ref step, .. } = g.ops[i].kind else { return None };
    let r = begin.len();
    if value != 0.0 || !(r == 3 || r == 4) || begin[..2].iter().chain(&end[..2]).any(|&p| p != 0) || step.iter().any(|&s| s != 1) {
        return None;
    }
    // (top, left, bottom, right) added; a 1-D conv has no height to pad.
    let add = if r == 4 { [begin[2], begin[3], end[2], end[3]] } else { [0, begin[2], 0, end[2]] };
    let c = ix.sole_reader(g.ops[i].out)?;
    let Kind::Conv { x: cx, w, bias, mut dims, stride, dilation, mut pads, residual, act, winograd } = g.ops[c].kind.clone() else { return None };
    if cx != g.ops[i].out {
        return None;
    }
    dims[2] -= add[0] + add[2];
    dims[3] -= add[1] + add[3];
    for (p, a) in pads.iter_mut().zip(add) {
        *p += a;
    }
    let label = join(&g.ops[i].op, &g.ops[c].op);
    let op = &mut g.ops[c];
    op.kind = Kind::Conv { x, w, bias, dims, stride, dilation, pads, residual, act, winograd };
    op.op = label;
    Some(vec![i])
}

/// `(A·B) / c` or `(A·B) * c` with a constant scalar c, where A (or B) is
/// computed by a GEMM with constant weights through only views and
/// transposes (attention's `Q·Kᵀ / sqrt(d)`): scale that GEMM's weights
/// and bias instead, and drop the element-wise op.
fn scale_into_weights(g: &mut Graph, ix: &Index, i: usize) -> Option<Vec<usize>> {
    let (k, a, b) = binary(&g.ops[i])?;
    let (prod, c) = match k {
        Binary::Div => (a, g.konst(b)?.scalar()?),
        Binary::Mul => g.konst(b).and_then(Const::scalar).map(|c| (a, c)).or_else(|| Some((b, g.konst(a)?.scalar()?)))?,
        _ => return None,
    };
    let factor = if k == Binary::Div { 1.0 / c } else { c };
    if !factor.is_finite() || g.values[g.ops[i].out].shape != g.values[prod].shape {
        return None;
    }
    let p = ix.producer[prod]?;
    ix.sole_reader(prod)?;
    let Kind::Gemm { a: ga, b: gb, bias: None, residual: None, act, .. } = g.ops[p].kind else { return None };
    if act != Act::NONE {
        return None;
    }
    // Walk one operand back to a GEMM with constant weights.
    let source = |mut v: ValueId| -> Option<usize> {
        loop {
            ix.sole_reader(v)?;
            let q = ix.producer[v]?;
            match g.ops[q].kind {
                Kind::View { x } | Kind::Transpose { x, .. } => v = x,
                Kind::Gemm { b, bias, act, residual: None, .. } if act == Act::NONE && g.konst(b).is_some() && bias.is_none_or(|x| g.konst(x).is_some()) => {
                    return Some(q)
                }
                _ => return None,
            }
        }
    };
    let w = source(ga).or_else(|| source(gb))?;
    let Kind::Gemm { b: wb, bias: wbias, .. } = g.ops[w].kind else { return None };
    let scaled = |g: &mut Graph, v: ValueId| -> Option<ValueId> {
        let c = g.konst(v)?;
        let data: Vec<f32> = c.floats().iter().map(|x| x * factor).collect();
        let shape = c.shape.clone();
        let name = format!("{}.scaled", g.values[v].name);
        Some(g.add_value(&name, shape.clone(), Some(Const::f32(&shape, data))))
    };
    let nb = scaled(g, wb)?;
    let nbias = match wbias {
        Some(x) => Some(scaled(g, x)?),
        None => None,
    };
    if let Kind::Gemm { b, bias, .. } = &mut g.ops[w].kind {
        *b = nb;
        *bias = nbias;
    }
    g.ops[w].op = join(&g.ops[w].op, &format!("{}(scale)", g.ops[i].op));
    // The product takes the element-wise op's place (and output).
    let kind = g.ops[p].kind.clone();
    absorb(g, p, i, kind)
}

/// A constant bias Add after a GEMM (over its n columns) or a Conv.
fn bias(g: &mut Graph, ix: &Index, i: usize) -> Option<Vec<usize>> {
    let (n, is_conv) = match &g.ops[i].kind {
        Kind::Gemm { bias: None, act, n, .. } if *act == Act::NONE => (*n, false),
        Kind::Conv { bias: None, act, dims, .. } if *act == Act::NONE => (dims[4], true),
        _ => return None,
    };
    let c = ix.sole_reader(g.ops[i].out)?;
    let (Binary::Add, a, b) = binary(&g.ops[c])? else { return None };
    let p = other(a, b, g.ops[i].out)?;
    let vals = if is_conv {
        per_channel(g, p, n, g.values[g.ops[i].out].shape.len())?
    } else {
        let k = g.konst(p)?;
        let s: Vec<u64> = k.shape.iter().copied().skip_while(|&d| d == 1).collect();
        if s != [n] && !(n == 1 && s.is_empty()) {
            return None;
        }
        k.floats()
    };
    // The sum has the product's shape (the bias only broadcasts).
    if g.values[g.ops[c].out].shape != g.values[g.ops[i].out].shape {
        return None;
    }
    let name = g.ops[i].name.clone();
    let bv = g.add_value(&format!("{name}.bias"), vec![n], Some(Const::f32(&[n], vals)));
    let mut kind = g.ops[i].kind.clone();
    match &mut kind {
        Kind::Gemm { bias, .. } | Kind::Conv { bias, .. } => *bias = Some(bv),
        _ => return None,
    }
    absorb(g, i, c, kind)
}

/// An activation after a GEMM, Conv or element-wise binary op.
fn activation(g: &mut Graph, ix: &Index, i: usize) -> Option<Vec<usize>> {
    match &g.ops[i].kind {
        Kind::Gemm { act, .. } | Kind::Conv { act, .. } | Kind::Binary { act, .. } if *act == Act::NONE => {}
        _ => return None,
    }
    let mut c = ix.sole_reader(g.ops[i].out)?;
    // Through a reshape (GPT-2's Conv1D: Gemm on 2-D rows, then back to
    // 3-D): an element-wise activation commutes with it.
    let view = matches!(g.ops[c].kind, Kind::View { .. }).then_some(c);
    if let Some(v) = view {
        c = ix.sole_reader(g.ops[v].out)?;
    }
    let Kind::Unary { kind, p0, p1, .. } = g.ops[c].kind else { return None };
    if kind == Unary::None || !rbln_hw::ops::is_activation(kind as u32) {
        return None;
    }
    let mut k = g.ops[i].kind.clone();
    match &mut k {
        Kind::Gemm { act, .. } | Kind::Conv { act, .. } | Kind::Binary { act, .. } => *act = Act { kind, p0, p1 },
        _ => return None,
    }
    let Some(v) = view else { return absorb(g, i, c, k) };
    // op i takes the activation; the view now produces the activation's
    // result (same shape and dtype), and the activation op goes.
    if g.values[g.ops[c].out].shape != g.values[g.ops[v].out].shape {
        return None;
    }
    let label = join(&g.ops[i].op, &g.ops[c].op);
    g.ops[i].kind = k;
    g.ops[i].op = label;
    g.ops[v].out = g.ops[c].out;
    Some(vec![c])
}

/// A residual connection: `Add(conv_or_gemm(..), r)` with `r` computed at
/// run time and of the sum's shape becomes the Conv's (GEMM's) residual
/// operand, so the sum is made while the product is still in cache; the
/// activation rule then takes the Relu after it too.
fn residual(g: &mut Graph, ix: &Index, i: usize) -> Option<Vec<usize>> {
    match &g.ops[i].kind {
        Kind::Gemm { act, residual: None, .. } | Kind::Conv { act, residual: None, .. } if *act == Act::NONE => {}
        _ => return None,
    }
    let out = g.ops[i].out;
    let c = ix.sole_reader(out)?;
    let (Binary::Add, a, b) = binary(&g.ops[c])? else { return None };
    let r = other(a, b, out)?;
    // Same shape on all three: no broadcasting, and not x + x.
    let shape = &g.values[out].shape;
    if r == out || g.konst(r).is_some() || &g.values[r].shape != shape || &g.values[g.ops[c].out].shape != shape {
        return None;
    }
    let mut k = g.ops[i].kind.clone();
    match &mut k {
        Kind::Gemm { residual, .. } | Kind::Conv { residual, .. } => *residual = Some(r),
        _ => return None,
    }
    absorb(g, i, c, k)
}

/// Drops ops whose results no output depends on (after later passes).
pub fn drop_dead(g: &mut Graph) -> usize {
    dead_code(g)
}

/// Drop ops whose results no output depends on; returns how many.
fn dead_code(g: &mut Graph) -> usize {
    let mut live = vec![false; g.values.len()];
    for (_, v) in &g.outputs {
        live[*v] = true;
    }
    for op in g.ops.iter().rev() {
        if live[op.out] {
            for v in op.kind.inputs() {
                live[v] = true;
            }
        }
    }
    let before = g.ops.len();
    g.ops.retain(|op| live[op.out]);
    before - g.ops.len()
}
