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
//! program's inputs (broadcast as the op read them; one-element constants
//! become immediates). A producer joins only while the program still fits
//! the hardware's limits (inputs, instructions, registers). Runs after the
//! int8 lowering, which matches QDQ patterns on plain element-wise ops.

use rbln_format::DType;
use rbln_hw::ops::{EltInstr, Unary, ELTWISE_IMM, ELTWISE_MAX_INPUTS, ELTWISE_MAX_INSTRS, ELTWISE_REGS, ELT_BINARY, ELT_UNARY};

use crate::ir::{Act, Graph, Kind, ValueId};

/// Fuses every chain it can; returns how many ops were absorbed into
/// another (the op count drops by as much).
pub fn run(g: &mut Graph) -> usize {
    let mut absorbed = 0;
    // Roots from the end: a root's group is final once formed (its
    // members are gone, and the root itself is no longer element-wise).
    let mut i = g.ops.len();
    while i > 0 {
        i -= 1;
        if let Some(members) = group(g, i) {
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
fn group(g: &Graph, i: usize) -> Option<Vec<usize>> {
    if !elementwise(g, i) {
        return None;
    }
    let shape = &g.values[g.ops[i].out].shape;
    if shape.len() > 6 {
        return None;
    }
    let mut producer = vec![None; g.values.len()];
    let mut readers = vec![0usize; g.values.len()];
    for (j, op) in g.ops.iter().enumerate() {
        producer[op.out] = Some(j);
        let mut ins = op.kind.inputs();
        ins.sort_unstable();
        ins.dedup();
        for v in ins {
            readers[v] += 1;
        }
    }
    let is_output = |v: ValueId| g.outputs.iter().any(|(_, o)| *o == v);
    let mut members = vec![i];
    // Candidates: producers of the members' operands, latest first.
    let mut k = 0;
    while k < members.len() {
        let m = members[k];
        k += 1;
        for v in g.ops[m].kind.inputs() {
            let Some(p) = producer[v] else { continue };
            if members.contains(&p) || !elementwise(g, p) || is_output(v) || &g.values[v].shape != shape {
                continue;
            }
            // Every reader of v must be in the group (with p in it).
            let inside = members.iter().filter(|&&q| g.ops[q].kind.inputs().contains(&v)).count();
            if inside != readers[v] {
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

/// A program's operand: a register or the instruction's immediate.
enum Operand {
    Reg(u8),
    Imm(f32),
}

/// The program's inputs as they are found.
struct Inputs<'g> {
    g: &'g Graph,
    out_dims: Vec<u64>,
    values: Vec<ValueId>,
    dims: Vec<Vec<u64>>,
}

impl Inputs<'_> {
    /// `d` padded to the output's rank, if it broadcasts to it.
    fn pad(&self, d: &[u64]) -> Option<Vec<u64>> {
        let lead = self.out_dims.len().checked_sub(d.len())?;
        let p: Vec<u64> = std::iter::repeat_n(1, lead).chain(d.iter().copied()).collect();
        p.iter().zip(&self.out_dims).all(|(&a, &o)| a == 1 || a == o).then_some(p)
    }

    /// The operand for outside value `v` read with `dims` (None: the full
    /// output shape, as a unary op reads): an immediate for a
    /// one-element constant where allowed, else an input register.
    fn outside(&mut self, v: ValueId, dims: Option<&[u64]>, allow_imm: bool) -> Option<Operand> {
        if allow_imm {
            if let Some(c) = self.g.konst(v).and_then(|c| c.scalar()) {
                return Some(Operand::Imm(c));
            }
        }
        let d = self.pad(dims.unwrap_or(&self.out_dims.clone()))?;
        if let Some(i) = self.values.iter().zip(&self.dims).position(|(&x, xd)| x == v && *xd == d) {
            return Some(Operand::Reg(i as u8));
        }
        if self.values.len() == ELTWISE_MAX_INPUTS {
            return None;
        }
        self.values.push(v);
        self.dims.push(d);
        Some(Operand::Reg((self.values.len() - 1) as u8))
    }
}

/// The ELTWISE op computing the group's result (its last member's), or
/// None if it does not fit the hardware's limits.
fn program(g: &Graph, members: &[usize]) -> Option<Kind> {
    let root = *members.last()?;
    let out_dims = g.values[g.ops[root].out].shape.clone();
    let produced = |v: ValueId| members.iter().any(|&m| g.ops[m].out == v);
    // Position of the last member reading each value (register liveness).
    let last_use = |v: ValueId| members.iter().rposition(|&m| g.ops[m].kind.inputs().contains(&v));
    // The operands each member reads, with the dims it reads them at.
    let operands = |m: usize| -> Option<Vec<(ValueId, Option<&[u64]>)>> {
        match &g.ops[m].kind {
            Kind::Unary { x, .. } => Some(vec![(*x, None)]),
            Kind::Binary { a, b, a_dims, b_dims, .. } => Some(vec![(*a, Some(&a_dims[..])), (*b, Some(&b_dims[..]))]),
            _ => None,
        }
    };
    let mut inputs = Inputs { g, out_dims: out_dims.clone(), values: Vec::new(), dims: Vec::new() };
    // Inputs take the first registers, in order of first use.
    for &m in members {
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
    let n_in = inputs.values.len();
    let mut busy = [false; ELTWISE_REGS as usize];
    busy[..n_in].iter_mut().for_each(|b| *b = true);
    // Members' results currently in registers.
    let mut held: Vec<(ValueId, u8)> = Vec::new();
    let mut instrs: Vec<EltInstr> = Vec::new();
    let mut out_reg = 0u8;
    for (pos, &m) in members.iter().enumerate() {
        let op = &g.ops[m];
        let unary = matches!(op.kind, Kind::Unary { .. });
        let mut regs = [0u8; 2];
        let mut imm = 0.0;
        let ops = operands(m)?;
        for (slot, &(v, d)) in ops.iter().enumerate() {
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
        for (r, &v) in inputs.values.iter().enumerate() {
            if last_use(v) == Some(pos) {
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
    if instrs.len() > ELTWISE_MAX_INSTRS {
        return None;
    }
    Some(Kind::Eltwise { inputs: inputs.values, in_dims: inputs.dims, out_dims, program: instrs, out_reg })
}
