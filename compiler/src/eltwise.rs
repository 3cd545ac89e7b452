//! Chains of element-wise ops become one ELTWISE program
//! (`docs/hardware.md`, ELTWISE): softplus written out as `Abs, Neg, Exp,
//! Add, Log, Relu, Add`, an LSTM cell's `sigmoid / tanh / Mul / Add` tail,
//! hard-swish as `Add, Clip, Mul, Div`, … each cost a pass over memory and
//! a command; fused, the device reads the chain's inputs once and writes
//! its result once.
//!
//! A group grows backwards from a root (an element-wise op whose result
//! leaves the chain) over producers that are element-wise ops of the same
//! output shape, whose results nobody outside the group reads and which
//! are not model outputs. Operands from outside the group become the
//! program's inputs, read through element strides: broadcast as the op
//! read them, and through a slice or transpose that only the group reads
//! (a one-part COPY: Slice, Split, an LSTM's gate columns), which then
//! goes too. One-element constants become immediates. A producer joins
//! only while the program still fits the hardware's limits (inputs,
//! instructions, registers). Runs after the int8 lowering, which matches
//! QDQ patterns on plain element-wise ops.

use rbln_format::DType;
use rbln_hw::ops::{EltInstr, Unary, ELTWISE_IMM, ELTWISE_MAX_INPUTS, ELTWISE_MAX_INSTRS, ELTWISE_REGS, ELT_BINARY, ELT_UNARY};

use crate::fuse::Index;
use crate::ir::{Act, Graph, Kind, ValueId};
use crate::shape::{pad_rank, strides};

/// Fuses every chain it can; returns how many ops were absorbed into
/// another (the op count drops by as much).
pub fn run(g: &mut Graph) -> usize {
    let mut absorbed = 0;
    // Roots from the end: a root's group is final once formed (its
    // members are gone, and the root itself is no longer element-wise).
    let mut ix = Index::new(g);
    let mut i = g.ops.len();
    while i > 0 {
        i -= 1;
        if let Some(members) = group(g, &ix, i) {
            let (name, label) = (g.ops[members[0]].name.clone(), label(g, &members));
            let Some(kind) = program(g, &members) else { continue };
            let root = &mut g.ops[i];
            root.kind = kind;
            root.op = label;
            root.name = name;
            for &m in members.iter().rev().filter(|&&m| m != i) {
                g.ops.remove(m);
                absorbed += 1;
            }
            i = i.saturating_sub(members.len() - 1);
            ix = Index::new(g);
        }
    }
    absorbed
}

/// Whether op `i` computes element-wise on f32 values.
fn elementwise(g: &Graph, i: usize) -> bool {
    let op = &g.ops[i];
    let f32_out = g.values[op.out].dtype == DType::F32;
    match &op.kind {
        Kind::Unary { kind, x, .. } => f32_out && *kind != Unary::None && g.values[*x].dtype == DType::F32,
        Kind::Binary { a, b, .. } => f32_out && g.values[*a].dtype == DType::F32 && g.values[*b].dtype == DType::F32,
        _ => false,
    }
}

/// The ops of the group rooted at op `i` (ascending indices, `i` last),
/// if it has at least two.
fn group(g: &Graph, ix: &Index, i: usize) -> Option<Vec<usize>> {
    if !elementwise(g, i) {
        return None;
    }
    let shape = &g.values[g.ops[i].out].shape;
    if shape.len() > 6 {
        return None;
    }
    let mut members = vec![i];
    // Candidates: producers of the members' operands, latest first. A
    // COPY member is read from memory through strides: nothing behind it
    // joins.
    let mut k = 0;
    while k < members.len() {
        let m = members[k];
        k += 1;
        if matches!(g.ops[m].kind, Kind::Copy { .. }) {
            continue;
        }
        for v in g.ops[m].kind.inputs() {
            let Some(p) = ix.producer[v] else { continue };
            if members.contains(&p) || ix.is_output[v] {
                continue;
            }
            let joins = (elementwise(g, p) && &g.values[v].shape == shape) || strided_view(g, p).is_some();
            // Every reader of v must be in the group (with p in it).
            if !joins || !ix.consumers[v].iter().all(|q| members.contains(q)) {
                continue;
            }
            let mut trial = members.clone();
            trial.push(p);
            trial.sort_unstable();
            if program(g, &trial).is_some() {
                members.push(p);
            }
        }
    }
    // Worth a program: two element-wise ops at least (a lone op with an
    // absorbed copy is still one op fewer).
    if members.len() < 2 {
        return None;
    }
    members.sort_unstable();
    Some(members)
}

/// `Eltwise(A+B)`: the members' labels, each once (a decomposed ONNX
/// op labels all its pieces alike).
fn label(g: &Graph, members: &[usize]) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for &m in members {
        for p in g.ops[m].op.split('+') {
            if !parts.contains(&p) {
                parts.push(p);
            }
        }
    }
    format!("Eltwise({})", parts.join("+"))
}

/// The one-part COPY op `p` as a strided view of its source: (source,
/// element offset, the source's sizes and strides), when its output is
/// that box laid out densely and the source is f32.
fn strided_view(g: &Graph, p: usize) -> Option<(ValueId, u64, &[u64], &[u64])> {
    let Kind::Copy { parts } = &g.ops[p].kind else { return None };
    let [part] = parts.as_slice() else { return None };
    let out = g.ops[p].out;
    let dense = strides(&part.sizes);
    let sizes_vol: u64 = part.sizes.iter().product();
    let ok = part.dst_offset == 0
        && part.dst_strides.iter().zip(&dense).zip(&part.sizes).all(|((&s, &d), &n)| s == d || n == 1)
        && sizes_vol == g.values[out].elems()
        && g.values[part.src].dtype == DType::F32
        && g.values[out].dtype == DType::F32;
    ok.then_some((part.src, part.src_offset, &part.sizes[..], &part.src_strides[..]))
}

/// Strides reading a tensor of `sizes` with `strides` as if reshaped to
/// `target` (same volume), if the reshape needs no copy: each run of
/// target dims must cover a run of source dims that is contiguous within
/// itself (numpy's no-copy reshape). Dims of size 1 get stride 0.
fn reshaped_strides(sizes: &[u64], strides: &[u64], target: &[u64]) -> Option<Vec<u64>> {
    let old: Vec<(u64, u64)> = sizes.iter().zip(strides).filter(|p| *p.0 != 1).map(|(&n, &s)| (n, s)).collect();
    let new: Vec<usize> = (0..target.len()).filter(|&k| target[k] != 1).collect();
    let mut out = vec![0u64; target.len()];
    let (mut oi, mut ni) = (0, 0);
    while oi < old.len() && ni < new.len() {
        let (mut oj, mut nj) = (oi + 1, ni + 1);
        let (mut op, mut np) = (old[oi].0, target[new[ni]]);
        while op != np {
            if np < op {
                np = np.checked_mul(target[*new.get(nj)?])?;
                nj += 1;
            } else {
                op = op.checked_mul(old.get(oj)?.0)?;
                oj += 1;
            }
        }
        if (oi..oj - 1).any(|o| old[o].1 != old[o + 1].0.saturating_mul(old[o + 1].1)) {
            return None;
        }
        out[new[nj - 1]] = old[oj - 1].1;
        for t in (ni..nj - 1).rev() {
            out[new[t]] = out[new[t + 1]].checked_mul(target[new[t + 1]])?;
        }
        (oi, ni) = (oj, nj);
    }
    (oi == old.len() && ni == new.len()).then_some(out)
}

/// A program's operand: a register or the instruction's immediate.
enum Operand {
    Reg(u8),
    Imm(f32),
}

/// One input of the program: a value read from an element offset with
/// strides, and the values the members read through it (for liveness).
struct Input {
    value: ValueId,
    at: u64,
    strides: Vec<u64>,
    read_as: Vec<ValueId>,
}

/// The program's inputs as they are found.
struct Inputs<'g> {
    g: &'g Graph,
    members: &'g [usize],
    out_dims: Vec<u64>,
    list: Vec<Input>,
}

impl Inputs<'_> {
    /// `d` padded to the output's rank, if it broadcasts to it.
    fn pad(&self, d: &[u64]) -> Option<Vec<u64>> {
        let p = pad_rank(d, self.out_dims.len());
        (d.len() <= p.len() && p.iter().zip(&self.out_dims).all(|(&a, &o)| a == 1 || a == o)).then_some(p)
    }

    /// The operand for value `v` from outside the program, read with
    /// `dims` (None: the full output shape, as a unary op reads): an
    /// immediate for a one-element constant where allowed, else an input
    /// register, through the member COPY that makes `v` if there is one.
    fn outside(&mut self, v: ValueId, dims: Option<&[u64]>, allow_imm: bool) -> Option<Operand> {
        if allow_imm {
            if let Some(c) = self.g.konst(v).and_then(|c| c.scalar()) {
                return Some(Operand::Imm(c));
            }
        }
        let d = self.pad(dims.unwrap_or(&self.out_dims.clone()))?;
        let copy = self.members.iter().find(|&&m| self.g.ops[m].out == v).and_then(|&m| strided_view(self.g, m));
        let (value, at, view) = match copy {
            Some((src, at, sizes, strides)) => (src, at, reshaped_strides(sizes, strides, &d)?),
            None => (v, 0, strides(&d)),
        };
        // Broadcast dims read one element.
        let strides: Vec<u64> = view.iter().zip(&d).map(|(&s, &n)| if n == 1 { 0 } else { s }).collect();
        if let Some(i) = self.list.iter().position(|x| x.value == value && x.at == at && x.strides == strides) {
            if !self.list[i].read_as.contains(&v) {
                self.list[i].read_as.push(v);
            }
            return Some(Operand::Reg(i as u8));
        }
        if self.list.len() == ELTWISE_MAX_INPUTS {
            return None;
        }
        self.list.push(Input { value, at, strides, read_as: vec![v] });
        Some(Operand::Reg((self.list.len() - 1) as u8))
    }
}

/// The ELTWISE op computing the group's result (its last member's), or
/// None if it does not fit the hardware's limits.
fn program(g: &Graph, members: &[usize]) -> Option<Kind> {
    let root = *members.last()?;
    let out_dims = g.values[g.ops[root].out].shape.clone();
    // Members that compute (the COPY members only feed inputs).
    let computing: Vec<usize> = members.iter().copied().filter(|&m| !matches!(g.ops[m].kind, Kind::Copy { .. })).collect();
    let produced = |v: ValueId| computing.iter().any(|&m| g.ops[m].out == v);
    // Position of the last computing member reading each value.
    let last_use = |v: ValueId| computing.iter().rposition(|&m| g.ops[m].kind.inputs().contains(&v));
    // The operands each member reads, with the dims it reads them at.
    let operands = |m: usize| -> Option<Vec<(ValueId, Option<&[u64]>)>> {
        match &g.ops[m].kind {
            Kind::Unary { x, .. } => Some(vec![(*x, None)]),
            Kind::Binary { a, b, a_dims, b_dims, .. } => Some(vec![(*a, Some(&a_dims[..])), (*b, Some(&b_dims[..]))]),
            _ => None,
        }
    };
    let mut inputs = Inputs { g, members, out_dims: out_dims.clone(), list: Vec::new() };
    // Inputs take the first registers, in order of first use.
    for &m in &computing {
        let unary = matches!(g.ops[m].kind, Kind::Unary { .. });
        for (v, d) in operands(m)? {
            if produced(v) {
                // A member's result has the full shape and must be read so.
                if d.is_some_and(|d| inputs.pad(d).as_deref() != Some(&out_dims[..])) {
                    return None;
                }
            } else {
                inputs.outside(v, d, !unary)?;
            }
        }
    }
    // Every COPY member must feed the program.
    if members.iter().any(|&m| matches!(g.ops[m].kind, Kind::Copy { .. }) && !inputs.list.iter().any(|x| x.read_as.contains(&g.ops[m].out))) {
        return None;
    }
    let n_in = inputs.list.len();
    let mut busy = [false; ELTWISE_REGS as usize];
    busy[..n_in].iter_mut().for_each(|b| *b = true);
    // Members' results currently in registers.
    let mut held: Vec<(ValueId, u8)> = Vec::new();
    let mut instrs: Vec<EltInstr> = Vec::new();
    let mut out_reg = 0u8;
    for (pos, &m) in computing.iter().enumerate() {
        let op = &g.ops[m];
        let unary = matches!(op.kind, Kind::Unary { .. });
        let mut regs = [0u8; 2];
        let mut imm = 0.0;
        for (slot, (v, d)) in operands(m)?.into_iter().enumerate() {
            regs[slot] = if produced(v) {
                held.iter().find(|h| h.0 == v)?.1
            } else {
                match inputs.outside(v, d, !unary)? {
                    Operand::Reg(r) => r,
                    Operand::Imm(x) => {
                        imm = x;
                        ELTWISE_IMM
                    }
                }
            };
        }
        let (mut ins, act) = match &op.kind {
            Kind::Unary { kind, p0, p1, .. } => {
                (EltInstr { class: ELT_UNARY, code: *kind as u8, a: regs[0], param0: *p0, param1: *p1, ..Default::default() }, Act::NONE)
            }
            Kind::Binary { kind, act, .. } if regs != [ELTWISE_IMM; 2] => {
                (EltInstr { class: ELT_BINARY, code: *kind as u8, a: regs[0], b: regs[1], imm, ..Default::default() }, *act)
            }
            _ => return None,
        };
        // Registers whose value this op reads last are free for its
        // result (an instruction may overwrite its own operand).
        for (r, x) in inputs.list.iter().enumerate() {
            if x.read_as.iter().filter_map(|&v| last_use(v)).max() == Some(pos) {
                busy[r] = false;
            }
        }
        held.retain(|&(v, r)| {
            let live = last_use(v).is_some_and(|l| l > pos);
            if !live {
                busy[r as usize] = false;
            }
            live
        });
        let dst = busy.iter().position(|b| !b)? as u8;
        busy[dst as usize] = true;
        ins.dst = dst;
        instrs.push(ins);
        if act != Act::NONE {
            instrs.push(EltInstr { class: ELT_UNARY, code: act.kind as u8, dst, a: dst, param0: act.p0, param1: act.p1, ..Default::default() });
        }
        held.push((op.out, dst));
        out_reg = dst;
    }
    if instrs.is_empty() || instrs.len() > ELTWISE_MAX_INSTRS {
        return None;
    }
    let (inputs, in_strides) = inputs.list.into_iter().map(|x| ((x.value, x.at), x.strides)).unzip();
    Some(Kind::Eltwise { inputs, in_strides, out_dims, program: instrs, out_reg })
}

#[cfg(test)]
mod tests {
    use super::reshaped_strides;

    #[test]
    fn reshapes_of_strided_views_that_need_no_copy() {
        // Columns 2..5 of a [4, 7] matrix, as [4, 3], [2, 2, 3] and [12]
        // (the last is not one stride: refused).
        assert_eq!(reshaped_strides(&[4, 3], &[7, 1], &[4, 3]), Some(vec![7, 1]));
        assert_eq!(reshaped_strides(&[4, 3], &[7, 1], &[2, 2, 3]), Some(vec![14, 7, 1]));
        assert_eq!(reshaped_strides(&[4, 3], &[7, 1], &[12]), None);
        // A dense [2, 3, 4] merged and split, with size-1 dims anywhere.
        assert_eq!(reshaped_strides(&[2, 3, 4], &[12, 4, 1], &[1, 6, 1, 4]), Some(vec![0, 4, 0, 1]));
        assert_eq!(reshaped_strides(&[1, 24], &[24, 1], &[2, 12]), Some(vec![12, 1]));
        // A transpose ([3, 2] read from a [2, 3]) keeps its strides, but
        // cannot merge.
        assert_eq!(reshaped_strides(&[3, 2], &[1, 3], &[3, 2]), Some(vec![1, 3]));
        assert_eq!(reshaped_strides(&[3, 2], &[1, 3], &[6]), None);
        // Volumes that disagree.
        assert_eq!(reshaped_strides(&[4, 3], &[3, 1], &[5]), None);
    }
}
