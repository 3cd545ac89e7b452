//! Fused element-wise programs: a chain of unary and binary functions over
//! up to [`ELT_MAX_INPUTS`] broadcast inputs, evaluated in one pass.
//!
//! A model's element-wise tails (softplus = `log(1 + exp(-|x|)) + relu(x)`,
//! an LSTM cell's `o * tanh(f * c + i * g)`, hard-swish written out as
//! `x * clip(x + 3, 0, 6) / 6`, …) would otherwise be one op each, every
//! one a full pass over memory plus a command's fixed cost. Here each
//! block of [`BLOCK`] output elements runs the whole program while its
//! registers sit in L1, and the result is written once.
//!
//! Every step computes exactly what the standalone kernel computes
//! ([`crate::unary`], [`crate::binary`]): the same functions, the same
//! rounding, so fusing never changes a result.

use std::cell::RefCell;

use crate::activation::{apply_copy, apply_slice, UnaryOp};
use crate::binary::{drive, drive_rows, with_op, BinaryOp, Geom, WithOp, MAX_BATCH_ROWS};
use crate::error::{KernelError, Result};
use crate::fastmath::simd_dispatch;
use crate::util::{check_len, check_rank, volume};
use crate::MAX_RANK;

/// Inputs a program reads at most.
pub const ELT_MAX_INPUTS: usize = 4;
/// Registers of a program; `r0..` start as the inputs.
pub const ELT_REGS: usize = 8;

/// Elements per register block: 13 blocks (8 registers, a scratch one,
/// one per input read with a stride) of 1 KiB stay in L1.
const BLOCK: usize = 256;
/// Slots: the registers, a free one for each result, then one per input
/// whose innermost stride is neither 0 nor 1 (gathered per block).
const SLOTS_LEN: usize = ELT_REGS + 1 + ELT_MAX_INPUTS;
const GATHERED: usize = ELT_REGS + 1;

/// An operand of a binary step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EltOperand {
    Reg(u8),
    Imm(f32),
}

/// One step of an element-wise program.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EltStep {
    /// `r[dst] = op(r[a])`
    Unary { op: UnaryOp, dst: u8, a: u8 },
    /// `r[dst] = op(a, b)` (at most one immediate).
    Binary {
        op: BinaryOp,
        dst: u8,
        a: EltOperand,
        b: EltOperand,
    },
}

/// Where a step reads an operand from, resolved once per call: an input
/// (before any step overwrote its register), a register's block, or an
/// immediate.
#[derive(Clone, Copy, Debug)]
enum Src {
    Input(usize),
    Slot(usize),
    Imm(f32),
}

/// The resolved steps of a program (inline up to the hardware's 16).
type Plan = smallvec::SmallVec<[Resolved; 16]>;

/// A step with its operands resolved to sources and its result to a
/// physical slot.
#[derive(Clone, Copy, Debug)]
enum Resolved {
    Unary {
        op: UnaryOp,
        dst: usize,
        a: Src,
    },
    Binary {
        op: BinaryOp,
        dst: usize,
        a: Src,
        b: Src,
    },
}

/// `out = program(inputs)`: input `i` is (`data`, `strides`), read at
/// output multi-index `e` from `data[Σ e_k · strides[k]]` (one stride per
/// output dim: a dense tensor, a broadcast one with 0 where it is, a
/// slice or a transposed view); register `i` starts as input `i`; the
/// steps run in order on every element; `out` receives register
/// `out_reg`. Errors (nothing written): too many inputs, a register out
/// of range or read before it holds a value, two immediates in a step,
/// a stride list of another rank than the output, an input whose
/// farthest element lies beyond its slice.
pub fn eltwise(steps: &[EltStep], out_reg: u8, inputs: &[(&[f32], &[usize])], out_shape: &[usize], out: &mut [f32]) -> Result<()> {
    if inputs.is_empty() || inputs.len() > ELT_MAX_INPUTS {
        return Err(KernelError::invalid("eltwise inputs", format!("{} inputs (1 to {ELT_MAX_INPUTS})", inputs.len())));
    }
    check_rank("eltwise output", out_shape)?;
    let out_len = volume("eltwise output", out_shape)?;
    check_len("eltwise output", out.len(), out_len)?;
    let zeros = [0usize; MAX_RANK];
    let mut strides: [&[usize]; ELT_MAX_INPUTS] = [&zeros[..out_shape.len()]; ELT_MAX_INPUTS];
    let mut data: [&[f32]; ELT_MAX_INPUTS] = [&[0.0]; ELT_MAX_INPUTS];
    for (i, &(d, st)) in inputs.iter().enumerate() {
        if st.len() != out_shape.len() {
            return Err(KernelError::invalid("eltwise input strides", format!("{} strides for an output of rank {}", st.len(), out_shape.len())));
        }
        if out_len > 0 {
            // The farthest element read, checked: strides come from the guest.
            let last = st.iter().zip(out_shape).try_fold(0usize, |acc, (&s, &n)| (n - 1).checked_mul(s).and_then(|x| x.checked_add(acc)));
            match last {
                Some(l) if l < d.len() => {}
                Some(l) => return Err(KernelError::OutOfBounds { what: "eltwise input", index: l as i128, len: d.len() }),
                None => return Err(KernelError::Overflow { what: "eltwise input extent" }),
            }
        }
        (strides[i], data[i]) = (st, d);
    }
    let (plan, out_src) = resolve(steps, out_reg, inputs.len())?;
    if out.is_empty() {
        return Ok(());
    }
    // Non-empty output, and every input's farthest element is within its
    // slice: no offset overflows.
    let g = Geom::with_strides(strides, out_shape);
    let inner = g.dims[0].s;
    let len = g.dims[0].size;
    if g.dims.len() > 1 && 2 * len <= BLOCK {
        // Short rows (a small map against per-channel values): whole rows
        // batched into each block, so that a step's fixed cost is spread
        // over a block rather than paid per row (2x on a 7x7 map).
        let per = (BLOCK / len).min(MAX_BATCH_ROWS);
        drive_rows(&g, out, per, |rows, o| {
            SLOTS.with(|slots| match slots.try_borrow_mut() {
                Ok(mut slots) => run_rows(&plan, out_src, &data, rows, inner, len, &mut slots, o),
                // As below: a fresh register file.
                Err(_) => run_rows(&plan, out_src, &data, rows, inner, len, &mut vec![[0.0; BLOCK]; SLOTS_LEN], o),
            })
        });
        return Ok(());
    }
    drive(&g, out, |offs, o| {
        SLOTS.with(|slots| match slots.try_borrow_mut() {
            Ok(mut slots) => run_row(&plan, out_src, &data, offs, inner, &mut slots, o),
            // Re-entered on this thread (cannot happen: a row never calls
            // back into rayon); a fresh register file keeps it correct.
            Err(_) => run_row(
                &plan,
                out_src,
                &data,
                offs,
                inner,
                &mut vec![[0.0; BLOCK]; SLOTS_LEN],
                o,
            ),
        })
    });
    Ok(())
}

thread_local! {
    /// Each thread's register blocks (allocated once).
    static SLOTS: RefCell<Vec<[f32; BLOCK]>> = RefCell::new(vec![[0.0; BLOCK]; SLOTS_LEN]);
}

/// Checks the program and maps it onto physical slots: logical register
/// `r` lives in slot `map[r]`; each step writes a free slot, which then
/// becomes its destination's (so a step may overwrite its own operand).
fn resolve(steps: &[EltStep], out_reg: u8, n_inputs: usize) -> Result<(Plan, Src)> {
    let bad = |why: String| KernelError::invalid("eltwise program", why);
    // Current source of each logical register (None: never written).
    let mut reg: [Option<Src>; ELT_REGS] = [None; ELT_REGS];
    for (i, r) in reg.iter_mut().enumerate().take(n_inputs) {
        *r = Some(Src::Input(i));
    }
    let mut slot_of = [usize::MAX; ELT_REGS];
    // Free slots (a stack): one more than the registers, so one is always
    // free for the next result.
    let mut free = [0usize; ELT_REGS + 1];
    for (i, f) in free.iter_mut().enumerate() {
        *f = ELT_REGS - i;
    }
    let mut n_free = ELT_REGS + 1;
    let read = |reg: &[Option<Src>; ELT_REGS], r: u8, i: usize| -> Result<Src> {
        reg.get(r as usize)
            .copied()
            .flatten()
            .ok_or_else(|| bad(format!("step {i} reads register {r}, which holds no value")))
    };
    let mut plan = Plan::new();
    for (i, s) in steps.iter().enumerate() {
        let (dst, step) = match *s {
            EltStep::Unary { op, dst, a } => (
                dst,
                Resolved::Unary {
                    op,
                    dst: 0,
                    a: read(&reg, a, i)?,
                },
            ),
            EltStep::Binary { op, dst, a, b } => {
                let src = |o: EltOperand| match o {
                    EltOperand::Reg(r) => read(&reg, r, i),
                    EltOperand::Imm(v) => Ok(Src::Imm(v)),
                };
                let (a, b) = (src(a)?, src(b)?);
                if matches!((a, b), (Src::Imm(_), Src::Imm(_))) {
                    return Err(bad(format!("step {i} has two immediates")));
                }
                (dst, Resolved::Binary { op, dst: 0, a, b })
            }
        };
        let d = dst as usize;
        if d >= ELT_REGS {
            return Err(bad(format!(
                "step {i} writes register {dst} (registers 0 to {})",
                ELT_REGS - 1
            )));
        }
        // Cannot be empty: at most ELT_REGS slots are held by registers.
        let Some(slot) = n_free.checked_sub(1).map(|i| free[i]) else {
            return Err(bad("out of slots".into()));
        };
        n_free -= 1;
        plan.push(match step {
            Resolved::Unary { op, a, .. } => Resolved::Unary { op, dst: slot, a },
            Resolved::Binary { op, a, b, .. } => Resolved::Binary {
                op,
                dst: slot,
                a,
                b,
            },
        });
        if slot_of[d] != usize::MAX {
            free[n_free] = slot_of[d];
            n_free += 1;
        }
        slot_of[d] = slot;
        reg[d] = Some(Src::Slot(slot));
    }
    let out = read(&reg, out_reg, steps.len())?;
    Ok((plan, out))
}

/// Runs the program over one row of the output (`o`), block by block;
/// input `k`'s elements start at `offs[k]` with stride `inner[k]` (0 or 1).
fn run_row(
    plan: &[Resolved],
    out_src: Src,
    data: &[&[f32]; ELT_MAX_INPUTS],
    offs: [usize; ELT_MAX_INPUTS],
    inner: [usize; ELT_MAX_INPUTS],
    slots: &mut [[f32; BLOCK]],
    o: &mut [f32],
) {
    let mut j0 = 0;
    while j0 < o.len() {
        let n = (o.len() - j0).min(BLOCK);
        // Inputs read with a stride: gathered into their slots.
        for k in 0..ELT_MAX_INPUTS {
            let s = inner[k];
            if s > 1 {
                let base = offs[k] + j0 * s;
                for (j, x) in slots[GATHERED + k][..n].iter_mut().enumerate() {
                    *x = data[k][base + j * s];
                }
            }
        }
        run_steps(plan, out_src, data, slots, &mut o[j0..j0 + n], |k| match inner[k] {
            0 => InputView::Scalar(data[k][offs[k]]),
            1 => InputView::Slice(&data[k][offs[k] + j0..][..n]),
            _ => InputView::Gathered,
        });
        j0 += n;
    }
}

/// How an input is read over a block of whole rows.
#[derive(Clone, Copy)]
enum BlockInput {
    /// One contiguous run from this offset (laid out like the output).
    Run(usize),
    /// One value for the whole block.
    Const(f32),
    /// Copied, filled or gathered row by row into its slot.
    Gathered,
}

/// [`run_row`] over `rows.len()` whole rows of `len` elements (the block
/// `o`, at most [`BLOCK`] elements): input `k`'s row `r` starts at
/// `rows[r][k]` with stride `inner[k]`.
#[allow(clippy::too_many_arguments)]
fn run_rows(
    plan: &[Resolved],
    out_src: Src,
    data: &[&[f32]; ELT_MAX_INPUTS],
    rows: &[[usize; ELT_MAX_INPUTS]],
    inner: [usize; ELT_MAX_INPUTS],
    len: usize,
    slots: &mut [[f32; BLOCK]],
    o: &mut [f32],
) {
    let n = o.len();
    debug_assert!(n == rows.len() * len && n <= BLOCK);
    let mut how = [BlockInput::Const(0.0); ELT_MAX_INPUTS];
    for k in 0..ELT_MAX_INPUTS {
        let (s, o0) = (inner[k], rows[0][k]);
        how[k] = if s == 1 && rows.iter().enumerate().all(|(r, off)| off[k] == o0 + r * len) {
            BlockInput::Run(o0)
        } else if s == 0 && rows.iter().all(|off| off[k] == o0) {
            BlockInput::Const(data[k][o0])
        } else {
            for (seg, off) in slots[GATHERED + k][..n].chunks_exact_mut(len).zip(rows) {
                let base = off[k];
                match s {
                    0 => seg.fill(data[k][base]),
                    1 => seg.copy_from_slice(&data[k][base..base + len]),
                    _ => {
                        for (j, x) in seg.iter_mut().enumerate() {
                            *x = data[k][base + j * s];
                        }
                    }
                }
            }
            BlockInput::Gathered
        };
    }
    run_steps(plan, out_src, data, slots, o, |k| match how[k] {
        BlockInput::Run(o0) => InputView::Slice(&data[k][o0..o0 + n]),
        BlockInput::Const(v) => InputView::Scalar(v),
        BlockInput::Gathered => InputView::Gathered,
    });
}

/// Input `k`'s values over a block.
#[derive(Clone, Copy)]
enum InputView<'d> {
    /// Where they lie.
    Slice(&'d [f32]),
    /// One value for the whole block.
    Scalar(f32),
    /// In the input's slot (gathered beforehand).
    Gathered,
}

/// The program's steps over one block (`block`, at most [`BLOCK`]
/// elements), then the result into it; `input(k)` says where input `k`'s
/// values over the block are.
#[inline(always)]
fn run_steps<'d>(plan: &[Resolved], out_src: Src, data: &[&'d [f32]; ELT_MAX_INPUTS], slots: &mut [[f32; BLOCK]], block: &mut [f32], input: impl Fn(usize) -> InputView<'d>) {
    let n = block.len();
    // The last step writes the output block itself when it is the result.
    let direct_last = match (out_src, plan.last()) {
        (Src::Slot(p), Some(Resolved::Unary { dst, .. } | Resolved::Binary { dst, .. })) => p == *dst,
        _ => false,
    };
    for (i, step) in plan.iter().enumerate() {
        let (Resolved::Unary { dst, .. } | Resolved::Binary { dst, .. }) = *step;
        // `dst` is a free slot: no operand of this step reads it.
        let (lo, hi) = slots.split_at_mut(dst);
        let Some((target, hi)) = hi.split_first_mut() else {
            continue;
        };
        let slot = |p: usize| if p < dst { &lo[p][..n] } else { &hi[p - dst - 1][..n] };
        let view = |s: Src| match s {
            Src::Slot(p) => Opnd::Slice(slot(p)),
            Src::Input(k) => match input(k) {
                InputView::Slice(x) => Opnd::Slice(x),
                InputView::Scalar(v) => Opnd::Scalar(v),
                InputView::Gathered => Opnd::Slice(slot(GATHERED + k)),
            },
            Src::Imm(v) => Opnd::Scalar(v),
        };
        let t: &mut [f32] = if direct_last && i + 1 == plan.len() { &mut *block } else { &mut target[..n] };
        step_block(*step, data, view, t);
    }
    if !direct_last {
        match out_src {
            Src::Slot(p) => block.copy_from_slice(&slots[p][..n]),
            Src::Input(k) => match input(k) {
                InputView::Slice(x) => block.copy_from_slice(x),
                InputView::Scalar(v) => block.fill(v),
                InputView::Gathered => block.copy_from_slice(&slots[GATHERED + k][..n]),
            },
            Src::Imm(v) => block.fill(v),
        }
    }
}

/// One step over a block: `t = step(operands)`, the operands read
/// through `view`.
#[inline(always)]
fn step_block<'a>(step: Resolved, data: &[&[f32]; ELT_MAX_INPUTS], view: impl Fn(Src) -> Opnd<'a>, t: &mut [f32]) {
    match step {
        Resolved::Unary { op, a, .. } => match view(a) {
            Opnd::Slice(x) => apply_copy(op, x, t),
            Opnd::Scalar(v) => {
                t.fill(v);
                apply_slice(op, t);
            }
        },
        Resolved::Binary { op, a, b, .. } => {
            // As `binary`, whose small-exponent Pow needs a one-element
            // exponent (not just a broadcast one).
            let b_const = match b {
                Src::Imm(_) => true,
                Src::Input(k) => data[k].len() == 1,
                Src::Slot(_) => false,
            };
            binary_block(op, view(a), view(b), b_const, t)
        }
    }
}


/// A binary step's operand over one block.
#[derive(Clone, Copy)]
pub(crate) enum Opnd<'a> {
    Slice(&'a [f32]),
    Scalar(f32),
}

#[inline(always)]
fn apply2<F: Fn(f32, f32) -> f32>(a: Opnd<'_>, b: Opnd<'_>, out: &mut [f32], f: F) {
    match (a, b) {
        (Opnd::Slice(x), Opnd::Slice(y)) => {
            for ((o, &x), &y) in out.iter_mut().zip(x).zip(y) {
                *o = f(x, y);
            }
        }
        (Opnd::Slice(x), Opnd::Scalar(y)) => {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = f(x, y);
            }
        }
        (Opnd::Scalar(x), Opnd::Slice(y)) => {
            for (o, &y) in out.iter_mut().zip(y) {
                *o = f(x, y);
            }
        }
        (Opnd::Scalar(x), Opnd::Scalar(y)) => out.fill(f(x, y)),
    }
}

/// One block of a binary step.
struct Block<'a, 'o> {
    a: Opnd<'a>,
    b: Opnd<'a>,
    out: &'o mut [f32],
}

impl WithOp for Block<'_, '_> {
    #[inline(always)]
    fn run<F: Fn(f32, f32) -> f32 + Sync + Copy>(self, f: F) {
        apply2(self.a, self.b, self.out, f)
    }
}

simd_dispatch! {
    /// `out = op(a, b)` over one block, as [`crate::binary`] computes it
    /// (`b_const`: `b` is one value for the whole op, an immediate or a
    /// one-element input).
    fn binary_block(op: BinaryOp, a: Opnd<'_>, b: Opnd<'_>, b_const: bool, out: &mut [f32]) {
        let b_scalar = match b {
            Opnd::Scalar(v) if b_const => Some(v),
            _ => None,
        };
        with_op(op, b_scalar, Block { a, b, out })
    }
}
