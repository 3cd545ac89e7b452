//! TTIR → tile program ([`rbln_hw::tile`]).
//!
//! Every TTIR op becomes one tile instruction (or none: `tt.return`); SSA
//! values map to registers. The kernel's pointer arguments become buffer
//! slots and its scalar arguments parameters, both in argument order. A
//! pointer value remembers the argument it was derived from (the buffer
//! slot), so a select between pointers into different arguments is
//! refused. Types outside f32 / i32 / i64 / i1 (f16, bf16, i8, f64, ...)
//! and ops outside the table below are refused with their TTIR line.

use std::collections::HashMap;

use rbln_hw::tile::{self as t, TileBinary, TileCmp, TileInstr, TileOp, TileProgramHeader, TileReduce, TileType, TileUnary, NO_OPERAND};

use super::{Attr, Func, Module, Op, TtirError, Type};

/// A kernel argument as the launch must bind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelArg {
    /// A pointer: buffer `slot` of elements of `dtype`.
    Buffer { name: String, slot: usize, dtype: TileType },
    /// A scalar: parameter `slot`.
    Param { name: String, slot: usize, dtype: TileType },
}

/// A lowered kernel.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// The `tt.func`'s name.
    pub name: String,
    /// The encoded, verified tile program.
    pub program: Vec<u8>,
    /// Every argument of the function, in order.
    pub args: Vec<KernelArg>,
    /// Bit `slot`: the kernel loads from / stores to that buffer.
    pub loads: u16,
    pub stores: u16,
    /// Largest program id axis used + 1 (0: no program id read).
    pub grid_rank: usize,
}

/// A value's register and type.
#[derive(Clone, Debug)]
struct Val {
    reg: u32,
    dtype: TileType,
    shape: Vec<u32>,
    slot: u8,
}

struct Lowering<'a> {
    func: &'a Func,
    instrs: Vec<TileInstr>,
    vals: HashMap<String, Val>,
    grid_rank: usize,
}

type R<T> = Result<T, TtirError>;

fn fail<T>(line: usize, msg: impl Into<String>) -> R<T> {
    Err(TtirError { line, kernel_line: None, msg: msg.into() })
}

/// The tile type of a TTIR element type.
fn elem_type(line: usize, t: &Type) -> R<TileType> {
    Ok(match t {
        Type::Float(32) => TileType::F32,
        Type::Int(32) => TileType::I32,
        Type::Int(64) => TileType::I64,
        Type::Int(1) => TileType::I1,
        Type::Ptr(_) => TileType::Ptr,
        other => return fail(line, format!("element type {} is not supported by the NPU's tile engine (f32, i32, i64 and i1 are)", type_name(other))),
    })
}

fn type_name(t: &Type) -> String {
    match t {
        Type::Int(b) => format!("i{b}"),
        Type::Float(b) => format!("f{b}"),
        Type::BFloat => "bf16".into(),
        Type::Ptr(e) => format!("!tt.ptr<{}>", type_name(e)),
        Type::Tensor(s, e) => format!("tensor<{}x{}>", s.iter().map(u64::to_string).collect::<Vec<_>>().join("x"), type_name(e)),
    }
}

/// Shape of a TTIR type as tile dims.
fn dims(line: usize, t: &Type) -> R<Vec<u32>> {
    let s = t.shape();
    if s.len() > t::MAX_TILE_RANK {
        return fail(line, format!("a rank-{} tensor; the tile engine takes rank {} at most", s.len(), t::MAX_TILE_RANK));
    }
    s.iter().map(|&d| u32::try_from(d).ok().filter(|&d| d > 0).map_or_else(|| fail(line, format!("dimension {d}")), Ok)).collect()
}

impl<'a> Lowering<'a> {
    fn val(&self, op: &Op, name: &str) -> R<Val> {
        self.vals.get(name).cloned().map_or_else(|| fail(op.line, format!("{} reads {name}, which is not defined before it", op.name)), Ok)
    }

    fn operand(&self, op: &Op, k: usize) -> R<Val> {
        match op.operands.get(k) {
            Some(n) => self.val(op, n),
            None => fail(op.line, format!("{} has {} operands, expected more", op.name, op.operands.len())),
        }
    }

    /// The BUFFER or PARAM instruction of argument `name` (slot `slot`);
    /// a pointer's value remembers its buffer.
    fn argument(&mut self, name: &str, op: TileOp, dtype: TileType, slot: usize) {
        let reg = self.instrs.len() as u32;
        self.instrs.push(TileInstr { slot: slot as u8, ..TileInstr::new(op, dtype, &[]) });
        let ptr_slot = if dtype == TileType::Ptr { slot as u8 } else { 0 };
        self.vals.insert(name.to_string(), Val { reg, dtype, shape: vec![], slot: ptr_slot });
    }

    fn push(&mut self, op: &Op, ins: TileInstr, dtype: TileType, shape: Vec<u32>, slot: u8) -> R<()> {
        let reg = self.instrs.len() as u32;
        if reg >= t::MAX_TILE_INSTRS {
            return fail(op.line, format!("the kernel needs more than {} tile instructions", t::MAX_TILE_INSTRS));
        }
        self.instrs.push(TileInstr { slot, ..ins }.typed(dtype, &shape));
        if let Some(r) = op.results.first() {
            self.vals.insert(r.clone(), Val { reg, dtype, shape, slot });
        }
        Ok(())
    }
}

/// An argument's name without its `%` (Triton prints the Python names
/// when the TTIR carries locations, `%argN` otherwise).
fn plain(ssa: &str) -> String {
    ssa.trim_start_matches('%').to_string()
}

/// The result type the op declares (the last type after `:`).
fn result_type(op: &Op) -> R<&Type> {
    op.types.last().map_or_else(|| fail(op.line, format!("{} has no type", op.name)), Ok)
}

/// An instruction of `op` with no operands; `push` gives its type.
fn instr(op: TileOp) -> TileInstr {
    TileInstr::new(op, TileType::None, &[])
}

fn binary_kind(name: &str) -> Option<TileBinary> {
    use TileBinary::*;
    Some(match name {
        "arith.addf" | "arith.addi" => Add,
        "arith.subf" | "arith.subi" => Sub,
        "arith.mulf" | "arith.muli" => Mul,
        "arith.divf" | "arith.divsi" => Div,
        "arith.remf" | "arith.remsi" => Rem,
        "arith.divui" => DivU,
        "arith.remui" => RemU,
        "arith.minnumf" | "arith.minsi" => Min,
        "arith.maxnumf" | "arith.maxsi" => Max,
        "arith.minimumf" => Minimum,
        "arith.maximumf" => Maximum,
        "arith.minui" => MinU,
        "arith.maxui" => MaxU,
        "arith.andi" => And,
        "arith.ori" => Or,
        "arith.xori" => Xor,
        "arith.shli" => Shl,
        "arith.shrsi" => ShrS,
        "arith.shrui" => ShrU,
        "math.powf" => Pow,
        _ => return None,
    })
}

fn unary_kind(name: &str) -> Option<TileUnary> {
    use TileUnary::*;
    Some(match name {
        "arith.negf" => Neg,
        "math.absf" | "math.absi" => Abs,
        "math.exp" => Exp,
        "math.exp2" => Exp2,
        "math.log" => Log,
        "math.log2" => Log2,
        "math.sqrt" => Sqrt,
        "math.rsqrt" => Rsqrt,
        "math.sin" => Sin,
        "math.cos" => Cos,
        "math.floor" => Floor,
        "math.ceil" => Ceil,
        "math.erf" => Erf,
        "math.tanh" => Tanh,
        _ => return None,
    })
}

/// Integer / float conversions: (op, source is unsigned).
fn convert_kind(name: &str) -> Option<bool> {
    Some(match name {
        "arith.sitofp" | "arith.fptosi" | "arith.extsi" | "arith.trunci" | "arith.index_cast" => false,
        "arith.uitofp" | "arith.fptoui" | "arith.extui" | "arith.index_castui" => true,
        _ => return None,
    })
}

fn cmp_kind(name: &str, pred: &str) -> Option<TileCmp> {
    use TileCmp::*;
    Some(match (name, pred) {
        ("arith.cmpf", "oeq") | ("arith.cmpi", "eq") => Eq,
        ("arith.cmpf", "une") | ("arith.cmpi", "ne") => Ne,
        ("arith.cmpf", "olt") | ("arith.cmpi", "slt") => Lt,
        ("arith.cmpf", "ole") | ("arith.cmpi", "sle") => Le,
        ("arith.cmpf", "ogt") | ("arith.cmpi", "sgt") => Gt,
        ("arith.cmpf", "oge") | ("arith.cmpi", "sge") => Ge,
        ("arith.cmpi", "ult") => LtU,
        ("arith.cmpi", "ule") => LeU,
        ("arith.cmpi", "ugt") => GtU,
        ("arith.cmpi", "uge") => GeU,
        _ => return None,
    })
}

/// The combiner of a `tt.reduce` region: one op on the two block
/// arguments, returned.
fn reduce_kind(op: &Op) -> R<TileReduce> {
    use TileReduce::*;
    let refuse = |why: &str| fail(op.line, format!("tt.reduce: {why}; the tile engine reduces with one of add, mul, max, min, and, or, xor"));
    let Some(region) = &op.region else { return refuse("no combiner region") };
    if op.operands.len() != 1 || region.args.len() != 2 {
        return refuse("a reduction of several tensors (argmax-style)");
    }
    let [body, ret] = region.ops.as_slice() else { return refuse("a combiner of more than one op") };
    let args = [region.args[0].0.as_str(), region.args[1].0.as_str()];
    let uses_args = body.operands.len() == 2 && args.iter().all(|a| body.operands.iter().any(|o| o == a)) && body.operands[0] != body.operands[1];
    if ret.name != "tt.reduce.return" || ret.operands.len() != 1 || body.results.first() != ret.operands.first() || !uses_args {
        return refuse("a combiner that is not one op on its two arguments");
    }
    Ok(match body.name.as_str() {
        "arith.addf" | "arith.addi" => Sum,
        "arith.mulf" | "arith.muli" => Prod,
        "arith.maxnumf" | "arith.maxsi" => Max,
        "arith.minnumf" | "arith.minsi" => Min,
        "arith.maximumf" => Maximum,
        "arith.minimumf" => Minimum,
        "arith.andi" => And,
        "arith.ori" => Or,
        "arith.xori" => Xor,
        other => return refuse(&format!("combiner {other}")),
    })
}

/// The bits of a constant of tile type `t`.
fn const_bits(line: usize, v: &Attr, t: TileType) -> R<u64> {
    let v = match v {
        Attr::Splat(inner) => inner.as_ref(),
        v => v,
    };
    Ok(match (v, t) {
        (Attr::Float(f), TileType::F32) => (*f as f32).to_bits() as u64,
        (Attr::Int(i), TileType::F32) => (*i as f32).to_bits() as u64,
        (Attr::Int(i), TileType::I32) => *i as i32 as u32 as u64,
        (Attr::Int(i), TileType::I64) => *i as u64,
        (Attr::Bool(b), TileType::I1) => *b as u64,
        (Attr::Int(i), TileType::I1) => (*i & 1) as u64,
        _ => return fail(line, format!("arith.constant: cannot read {v:?} as {t:?} (only splat constants are supported)")),
    })
}

/// Lower the kernel `name` of `m` (or its only public function). Errors
/// name the kernel's source line when the TTIR had locations.
pub fn lower(m: &Module, name: Option<&str>) -> R<Kernel> {
    lower_func(m, name).map_err(|e| e.located(&m.sources))
}

fn lower_func(m: &Module, name: Option<&str>) -> R<Kernel> {
    let func = match name {
        Some(n) => m.funcs.iter().find(|f| f.name == n),
        None => match m.funcs.as_slice() {
            [f] => Some(f),
            fs => fs.iter().find(|f| !f.name.starts_with('_')),
        },
    };
    let Some(func) = func else {
        return fail(1, format!("no kernel {} in the module", name.unwrap_or("function")));
    };
    let mut lw = Lowering { func, instrs: Vec::new(), vals: HashMap::new(), grid_rank: 0 };
    let mut header = TileProgramHeader::default();
    let mut args = Vec::new();
    for (name, ty) in &func.args {
        let line = func.line;
        match ty {
            Type::Ptr(e) => {
                let dtype = elem_type(line, e)?;
                if dtype == TileType::Ptr {
                    return fail(line, format!("argument {name}: a pointer to pointers"));
                }
                let slot = header.nbufs as usize;
                if slot >= t::MAX_TILE_BUFFERS {
                    return fail(line, format!("more than {} pointer arguments", t::MAX_TILE_BUFFERS));
                }
                header.buf_types[slot] = dtype as u8;
                header.nbufs += 1;
                lw.argument(name, TileOp::Buffer, TileType::Ptr, slot);
                args.push(KernelArg::Buffer { name: plain(name), slot, dtype });
            }
            Type::Tensor(..) => return fail(line, format!("argument {name}: a tensor argument (pass a pointer)")),
            scalar => {
                let dtype = elem_type(line, scalar)?;
                let slot = header.nparams as usize;
                if slot >= t::MAX_TILE_PARAMS {
                    return fail(line, format!("more than {} scalar arguments", t::MAX_TILE_PARAMS));
                }
                header.param_types[slot] = dtype as u8;
                header.nparams += 1;
                lw.argument(name, TileOp::Param, dtype, slot);
                args.push(KernelArg::Param { name: plain(name), slot, dtype });
            }
        }
    }
    for op in &func.ops {
        lower_op(&mut lw, op)?;
    }
    let n = lw.instrs.len();
    let mut program = vec![0u8; t::program_size(n)];
    t::encode_program(&header, &lw.instrs, &mut program).ok_or(TtirError { line: func.line, kernel_line: None, msg: "cannot encode the program".into() })?;
    let info = t::verify(&program).map_err(|e| TtirError { line: func.line, kernel_line: None, msg: format!("internal error, the lowered program is invalid: {e}") })?;
    Ok(Kernel { name: func.name.clone(), program, args, loads: info.loads, stores: info.stores, grid_rank: lw.grid_rank })
}

fn lower_op(lw: &mut Lowering<'_>, op: &Op) -> R<()> {
    let line = op.line;
    let name = op.name.as_str();
    // Element-wise ops keep their first operand's type.
    if let Some(kind) = binary_kind(name) {
        let (a, b) = (lw.operand(op, 0)?, lw.operand(op, 1)?);
        same_type(op, &a, &b)?;
        if !kind.accepts(a.dtype) {
            return fail(line, format!("{name} on {:?} elements", a.dtype));
        }
        let ins = TileInstr { kind: kind as u8, a: a.reg, b: b.reg, ..instr(TileOp::Binary) };
        return lw.push(op, ins, a.dtype, a.shape, 0);
    }
    if let Some(kind) = unary_kind(name) {
        let a = lw.operand(op, 0)?;
        let ins = TileInstr { kind: kind as u8, a: a.reg, ..instr(TileOp::Unary) };
        return lw.push(op, ins, a.dtype, a.shape, 0);
    }
    if let Some(unsigned) = convert_kind(name) {
        let a = lw.operand(op, 0)?;
        let to = elem_type(line, result_type(op)?.elem())?;
        let ins = TileInstr { kind: unsigned as u8, a: a.reg, ..instr(TileOp::Convert) };
        return lw.push(op, ins, to, a.shape, 0);
    }
    match name {
        "tt.return" => Ok(()),
        "arith.constant" => {
            let ty = result_type(op)?;
            let dtype = elem_type(line, ty.elem())?;
            let v = op.value.as_ref().map_or_else(|| fail(line, "arith.constant without a value"), Ok)?;
            let ins = TileInstr { imm: const_bits(line, v, dtype)?, ..instr(TileOp::Const) };
            lw.push(op, ins, dtype, dims(line, ty)?, 0)
        }
        "tt.get_program_id" | "tt.get_num_programs" => {
            let axis = match op.keyword.as_deref() {
                Some("x") => 0,
                Some("y") => 1,
                Some("z") => 2,
                other => return fail(line, format!("{name} axis {other:?}")),
            };
            lw.grid_rank = lw.grid_rank.max(axis as usize + 1);
            let o = if name == "tt.get_program_id" { TileOp::ProgramId } else { TileOp::NumPrograms };
            lw.push(op, TileInstr { axis, ..instr(o) }, TileType::I32, vec![], 0)
        }
        "tt.make_range" => {
            let get = |k: &str| match op.attr(k) {
                Some(Attr::Int(v)) => Ok(*v),
                _ => fail(line, format!("tt.make_range without {k}")),
            };
            let (start, end) = (get("start")?, get("end")?);
            let n = u32::try_from(end - start).ok().filter(|&n| n > 0).map_or_else(|| fail(line, "tt.make_range: empty range"), Ok)?;
            let s = i32::try_from(start).map_or_else(|_| fail(line, "tt.make_range start beyond i32"), Ok)?;
            lw.push(op, TileInstr { imm: s as u32 as u64, ..instr(TileOp::Range) }, TileType::I32, vec![n], 0)
        }
        "tt.splat" | "tt.broadcast" | "tt.expand_dims" | "tt.reshape" => {
            let a = lw.operand(op, 0)?;
            let shape = dims(line, result_type(op)?)?;
            let o = match name {
                "tt.splat" => TileOp::Splat,
                "tt.broadcast" => TileOp::Broadcast,
                _ => TileOp::Reshape,
            };
            // A rank-0 value spread over a shape is a splat whatever op says so.
            let o = if o == TileOp::Broadcast && a.shape.is_empty() { TileOp::Splat } else { o };
            lw.push(op, TileInstr { a: a.reg, ..instr(o) }, a.dtype, shape, a.slot)
        }
        "tt.trans" => {
            let a = lw.operand(op, 0)?;
            let order: Vec<u64> = match op.attr("order") {
                Some(Attr::Other(s)) => s.trim_start_matches("array<i32:").trim_end_matches('>').split(',').filter_map(|x| x.trim().parse().ok()).collect(),
                _ => return fail(line, "tt.trans without an order"),
            };
            if order.len() != a.shape.len() {
                return fail(line, "tt.trans: order does not match the rank");
            }
            let imm = order.iter().enumerate().fold(0u64, |acc, (k, &p)| acc | (p << (8 * k)));
            let shape = order.iter().map(|&p| a.shape.get(p as usize).copied().unwrap_or(0)).collect();
            lw.push(op, TileInstr { a: a.reg, imm, ..instr(TileOp::Permute) }, a.dtype, shape, a.slot)
        }
        "tt.addptr" => {
            let (a, b) = (lw.operand(op, 0)?, lw.operand(op, 1)?);
            if a.dtype != TileType::Ptr || !matches!(b.dtype, TileType::I32 | TileType::I64) || a.shape != b.shape {
                return fail(line, "tt.addptr: a pointer plus integer offsets of its shape");
            }
            lw.push(op, TileInstr { a: a.reg, b: b.reg, ..instr(TileOp::AddPtr) }, TileType::Ptr, a.shape, a.slot)
        }
        "tt.load" => {
            let p = lw.operand(op, 0)?;
            if p.dtype != TileType::Ptr {
                return fail(line, "tt.load of a block pointer (tt.make_tensor_ptr) is not supported; use pointer tensors");
            }
            let mask = if op.operands.len() > 1 { lw.operand(op, 1)?.reg } else { NO_OPERAND };
            let other = if op.operands.len() > 2 { lw.operand(op, 2)?.reg } else { NO_OPERAND };
            let elem = kernel_buf_type(lw, p.slot);
            // `other` may be a scalar splat by the frontend already; it has the result's shape.
            let ins = TileInstr { a: p.reg, b: mask, c: other, ..instr(TileOp::Load) };
            lw.push(op, ins, elem, p.shape, 0)
        }
        "tt.store" => {
            let (p, v) = (lw.operand(op, 0)?, lw.operand(op, 1)?);
            if p.dtype != TileType::Ptr {
                return fail(line, "tt.store through a block pointer is not supported");
            }
            let mask = if op.operands.len() > 2 { lw.operand(op, 2)?.reg } else { NO_OPERAND };
            lw.push(op, TileInstr { a: p.reg, b: v.reg, c: mask, ..instr(TileOp::Store) }, TileType::None, vec![], 0)
        }
        "tt.dot" => {
            let (a, b) = (lw.operand(op, 0)?, lw.operand(op, 1)?);
            let c = if op.operands.len() > 2 { lw.operand(op, 2)?.reg } else { NO_OPERAND };
            if a.shape.len() != 2 || b.shape.len() != 2 || a.dtype != TileType::F32 || b.dtype != TileType::F32 {
                return fail(line, "tt.dot: the tile engine multiplies rank-2 f32 tiles (no batched or low-precision dot)");
            }
            if a.shape[1] != b.shape[0] {
                return fail(line, format!("tt.dot: [{}x{}] times [{}x{}]", a.shape[0], a.shape[1], b.shape[0], b.shape[1]));
            }
            let shape = vec![a.shape[0], b.shape[1]];
            lw.push(op, TileInstr { a: a.reg, b: b.reg, c, ..instr(TileOp::Dot) }, TileType::F32, shape, 0)
        }
        "tt.reduce" => {
            let a = lw.operand(op, 0)?;
            let axis = match op.attr("axis") {
                Some(Attr::Int(v)) if (0..a.shape.len() as i64).contains(v) => *v as usize,
                _ => return fail(line, "tt.reduce: axis missing or outside the operand's rank"),
            };
            let kind = reduce_kind(op)?;
            if !kind.accepts(a.dtype) {
                return fail(line, format!("tt.reduce: {kind:?} of {:?} elements", a.dtype));
            }
            let mut shape = a.shape.clone();
            shape.remove(axis);
            lw.push(op, TileInstr { kind: kind as u8, axis: axis as u8, a: a.reg, ..instr(TileOp::Reduce) }, a.dtype, shape, 0)
        }
        "arith.cmpf" | "arith.cmpi" => {
            let pred = op.keyword.as_deref().unwrap_or("");
            let kind = cmp_kind(name, pred).map_or_else(|| fail(line, format!("{name} predicate {pred} is not supported")), Ok)?;
            let (a, b) = (lw.operand(op, 0)?, lw.operand(op, 1)?);
            same_type(op, &a, &b)?;
            lw.push(op, TileInstr { kind: kind as u8, a: a.reg, b: b.reg, ..instr(TileOp::Compare) }, TileType::I1, a.shape, 0)
        }
        "arith.select" => {
            let (c, a, b) = (lw.operand(op, 0)?, lw.operand(op, 1)?, lw.operand(op, 2)?);
            if a.dtype == TileType::Ptr && a.slot != b.slot {
                return fail(line, "arith.select between pointers into different arguments");
            }
            same_type(op, &a, &b)?;
            if c.dtype != TileType::I1 || (!c.shape.is_empty() && c.shape != a.shape) {
                return fail(line, "arith.select: the condition is not i1 of the values' shape");
            }
            // A scalar condition over tensors: splat it first.
            let cond = if c.shape.is_empty() && !a.shape.is_empty() {
                let reg = lw.instrs.len() as u32;
                lw.instrs.push(TileInstr { a: c.reg, ..TileInstr::new(TileOp::Splat, TileType::I1, &a.shape) });
                reg
            } else {
                c.reg
            };
            lw.push(op, TileInstr { a: cond, b: a.reg, c: b.reg, ..instr(TileOp::Select) }, a.dtype, a.shape, a.slot)
        }
        "math.fma" => {
            let (a, b, c) = (lw.operand(op, 0)?, lw.operand(op, 1)?, lw.operand(op, 2)?);
            lw.push(op, TileInstr { a: a.reg, b: b.reg, c: c.reg, ..instr(TileOp::Fma) }, a.dtype, a.shape, 0)
        }
        "tt.make_tensor_ptr" | "tt.advance" => fail(line, format!("{name}: block pointers are not supported; index with pointer tensors")),
        "tt.atomic_rmw" | "tt.atomic_cas" => fail(line, format!("{name}: atomics are not supported by the tile engine")),
        "tt.print" | "tt.assert" => fail(line, format!("{name}: device-side printing and assertions are not supported")),
        other => fail(line, format!("op {other} is not supported by the NPU's tile engine")),
    }
}

/// Element-wise operands must agree in type and shape (Triton broadcasts
/// explicitly before).
fn same_type(op: &Op, a: &Val, b: &Val) -> R<()> {
    if a.dtype != b.dtype || a.shape != b.shape {
        return fail(op.line, format!("{}: operands of different types or shapes ({:?}{:?} and {:?}{:?})", op.name, a.dtype, a.shape, b.dtype, b.shape));
    }
    Ok(())
}

/// The element type of buffer `slot` (from the function's arguments).
fn kernel_buf_type(lw: &Lowering<'_>, slot: u8) -> TileType {
    let ptrs = lw.func.args.iter().filter_map(|(_, t)| if let Type::Ptr(e) = t { Some(e) } else { None });
    ptrs.clone().nth(slot as usize).and_then(|e| elem_type(0, e).ok()).unwrap_or(TileType::F32)
}
