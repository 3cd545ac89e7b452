//! One program instance: the interpreter over whole tiles.

use std::sync::atomic::Ordering::Relaxed;

use rbln_hw::tile::{TileBinary, TileCmp, TileInstr, TileOp, TileProgram, TileReduce, TileType, TileUnary, NO_OPERAND};

use super::{TileFault, TileLaunch, TileMem};
use crate::activation::{unary, UnaryOp};
use crate::gemm::{gemm, GemmParams};

/// A register's value. Pointer tiles are element offsets (`L`).
#[derive(Clone, Debug, Default)]
enum Reg {
    #[default]
    Empty,
    F(Vec<f32>),
    I(Vec<i32>),
    L(Vec<i64>),
    B(Vec<bool>),
}

/// What the instances of a launch share: when each register dies.
pub(crate) struct Plan {
    /// Registers whose last reader is instruction `i` (or `i` itself, for
    /// a value nothing reads).
    free_after: Vec<Vec<u32>>,
    /// The last instruction reading each register.
    last_use: Vec<u32>,
}

impl Plan {
    pub(crate) fn new(p: &TileProgram<'_>) -> Plan {
        let n = p.len() as usize;
        let mut last: Vec<u32> = (0..n as u32).collect();
        for i in 0..p.len() {
            let ins = p.instr(i);
            for r in [ins.a, ins.b, ins.c, ins.d] {
                if r != NO_OPERAND {
                    last[r as usize] = i;
                }
            }
        }
        let mut free_after = vec![Vec::new(); n];
        for (r, &at) in last.iter().enumerate() {
            free_after[at as usize].push(r as u32);
        }
        Plan { free_after, last_use: last }
    }
}

/// Run one instance (`pid`) of a verified program.
pub fn run_instance(l: &TileLaunch<'_>, plan: &Plan, pid: [u32; 3]) -> Result<(), TileFault> {
    let p = &l.program;
    let mut regs: Vec<Reg> = vec![Reg::Empty; p.len() as usize];
    for i in 0..p.len() {
        let ins = p.instr(i);
        let t = p.reg_type(i);
        let dims: Vec<usize> = t.dims().iter().map(|&d| d as usize).collect();
        let op = TileOp::from_u8(ins.op).ok_or_else(bad)?;
        // An operand read for the last time, once, by this instruction:
        // its vector can become the result (no allocation, no copy).
        let dying = |r: u32| r != NO_OPERAND && plan.last_use[r as usize] == i && [ins.a, ins.b, ins.c, ins.d].iter().filter(|&&x| x == r).count() == 1;
        let reused = match op {
            TileOp::Reshape if dying(ins.a) => Some(std::mem::take(&mut regs[ins.a as usize])),
            TileOp::Binary if dying(ins.a) => {
                let mut a = std::mem::take(&mut regs[ins.a as usize]);
                if binary_inplace(kind(TileBinary::from_u8(ins.kind))?, &mut a, &regs[ins.b as usize]) {
                    Some(a)
                } else {
                    regs[ins.a as usize] = a;
                    None
                }
            }
            TileOp::Unary if dying(ins.a) && matches!(regs[ins.a as usize], Reg::F(_)) => {
                let mut a = std::mem::take(&mut regs[ins.a as usize]);
                if let (Reg::F(x), Some(u)) = (&mut a, unary_kernel_op(kind(TileUnary::from_u8(ins.kind))?)) {
                    crate::activation::unary_inplace(u, x).map_err(|_| bad())?;
                    Some(a)
                } else {
                    regs[ins.a as usize] = a;
                    None
                }
            }
            TileOp::Dot if dying(ins.c) => {
                let Reg::F(c) = std::mem::take(&mut regs[ins.c as usize]) else { return Err(bad()) };
                let k = p.reg_type(ins.a).shape[1] as usize;
                Some(dot(&regs[ins.a as usize], &regs[ins.b as usize], c, true, [dims[0], dims[1], k])?)
            }
            _ => None,
        };
        let value = match reused {
            Some(v) => v,
            None => compute(l, &regs, op, ins, t.dtype, &dims, pid)?,
        };
        regs[i as usize] = value;
        for &r in &plan.free_after[i as usize] {
            regs[r as usize] = Reg::Empty;
        }
    }
    Ok(())
}

/// The value of instruction `ins` (`op`; result type `dtype`, `dims`) from the
/// registers, each operand read in place.
fn compute(l: &TileLaunch<'_>, regs: &[Reg], op: TileOp, ins: TileInstr, dtype: TileType, dims: &[usize], pid: [u32; 3]) -> Result<Reg, TileFault> {
    let p = &l.program;
    let vol: usize = dims.iter().product();
    let reg = |r: u32| &regs[r as usize];
    let opt = |r: u32| (r != NO_OPERAND).then(|| &regs[r as usize]);
    let a_dims = || -> Vec<usize> { p.reg_type(ins.a).dims().iter().map(|&d| d as usize).collect() };
    let value = match op {
        TileOp::Const => constant(dtype, ins.imm, vol),
        TileOp::Param => constant(dtype, l.params[ins.slot as usize], 1),
        TileOp::Buffer => Reg::L(vec![0]),
        TileOp::ProgramId => Reg::I(vec![pid[ins.axis as usize] as i32]),
        TileOp::NumPrograms => Reg::I(vec![l.grid[ins.axis as usize] as i32]),
        TileOp::Range => {
            let start = ins.imm as u32 as i32;
            Reg::I((0..vol as i32).map(|k| start.wrapping_add(k)).collect())
        }
        TileOp::Splat => map_reg(reg(ins.a), &Splat(vol)),
        TileOp::Broadcast => {
            let from = a_dims();
            map_reg(reg(ins.a), &Broadcast { from: &from, to: dims })
        }
        TileOp::Reshape => reg(ins.a).clone(),
        TileOp::Permute => {
            let from = a_dims();
            let perm: Vec<usize> = (0..dims.len()).map(|k| ((ins.imm >> (8 * k)) & 0xff) as usize).collect();
            map_reg(reg(ins.a), &Permute { from: &from, perm: &perm })
        }
        TileOp::Binary => binary(kind(TileBinary::from_u8(ins.kind))?, reg(ins.a), reg(ins.b))?,
        TileOp::Compare => Reg::B(compare(kind(TileCmp::from_u8(ins.kind))?, reg(ins.a), reg(ins.b))?),
        TileOp::Unary => unary_op(kind(TileUnary::from_u8(ins.kind))?, reg(ins.a))?,
        TileOp::Convert => convert(reg(ins.a), dtype, ins.kind == 1)?,
        TileOp::Select => {
            let Reg::B(c) = reg(ins.a) else { return Err(bad()) };
            select(c, reg(ins.b), reg(ins.c))?
        }
        TileOp::Fma => match (reg(ins.a), reg(ins.b), reg(ins.c)) {
            (Reg::F(a), Reg::F(b), Reg::F(c)) => Reg::F(a.iter().zip(b).zip(c).map(|((&x, &y), &z)| x.mul_add(y, z)).collect()),
            _ => return Err(bad()),
        },
        TileOp::AddPtr => {
            let Reg::L(base) = reg(ins.a) else { return Err(bad()) };
            Reg::L(match reg(ins.b) {
                Reg::I(o) => base.iter().zip(o).map(|(&b, &o)| b.wrapping_add(o as i64)).collect(),
                Reg::L(o) => base.iter().zip(o).map(|(&b, &o)| b.wrapping_add(o)).collect(),
                _ => return Err(bad()),
            })
        }
        TileOp::Load => {
            let slot = p.reg_type(ins.a).slot as usize;
            let Reg::L(ptr) = reg(ins.a) else { return Err(bad()) };
            load(&l.bufs[slot], dtype, ptr, dims.last().copied().unwrap_or(1), mask(opt(ins.b))?, opt(ins.c)).map_err(|offset| TileFault::OutOfBounds { slot, offset, write: false })?
        }
        TileOp::Store => {
            let slot = p.reg_type(ins.a).slot as usize;
            let Reg::L(ptr) = reg(ins.a) else { return Err(bad()) };
            store(&l.bufs[slot], ptr, reg(ins.b), mask(opt(ins.c))?).map_err(|offset| TileFault::OutOfBounds { slot, offset, write: true })?;
            Reg::Empty
        }
        TileOp::Dot => {
            let k = p.reg_type(ins.a).shape[1] as usize;
            let (c, accumulate) = match opt(ins.c) {
                Some(Reg::F(c)) => (c.clone(), true),
                None => (vec![0.0; vol], false),
                _ => return Err(bad()),
            };
            dot(reg(ins.a), reg(ins.b), c, accumulate, [dims[0], dims[1], k])?
        }
        TileOp::Reduce => {
            let from = a_dims();
            let ax = ins.axis as usize;
            let (outer, len, inner) = (from[..ax].iter().product(), from[ax], from[ax + 1..].iter().product());
            reduce(kind(TileReduce::from_u8(ins.kind))?, reg(ins.a), outer, len, inner)?
        }
    };
    Ok(value)
}

/// A LOAD / STORE mask operand.
fn mask(r: Option<&Reg>) -> Result<Option<&[bool]>, TileFault> {
    match r {
        Some(Reg::B(m)) => Ok(Some(m.as_slice())),
        None => Ok(None),
        _ => Err(bad()),
    }
}

/// `a[m×k]·b[k×n] (+ c)` into `c` (`[m, n, k]`).
fn dot(a: &Reg, b: &Reg, mut c: Vec<f32>, accumulate: bool, [m, n, k]: [usize; 3]) -> Result<Reg, TileFault> {
    let (Reg::F(a), Reg::F(b)) = (a, b) else { return Err(bad()) };
    let gp = GemmParams { m, n, k, accumulate, ..Default::default() };
    gemm(&gp, a, b, None, &mut c).map_err(|_| bad())?;
    Ok(Reg::F(c))
}

/// An inconsistency a verified program cannot have.
fn bad() -> TileFault {
    TileFault::Launch("unverified program")
}

fn kind<T>(k: Option<T>) -> Result<T, TileFault> {
    k.ok_or_else(bad)
}

fn constant(t: TileType, bits: u64, n: usize) -> Reg {
    match t {
        TileType::F32 => Reg::F(vec![f32::from_bits(bits as u32); n]),
        TileType::I32 => Reg::I(vec![bits as u32 as i32; n]),
        TileType::I64 => Reg::L(vec![bits as i64; n]),
        _ => Reg::B(vec![bits & 1 != 0; n]),
    }
}

/// A shape operation, the same on every element type.
trait Shape {
    fn apply<T: Copy>(&self, v: &[T]) -> Vec<T>;
}

fn map_reg(r: &Reg, f: &impl Shape) -> Reg {
    match r {
        Reg::Empty => Reg::Empty,
        Reg::F(v) => Reg::F(f.apply(v)),
        Reg::I(v) => Reg::I(f.apply(v)),
        Reg::L(v) => Reg::L(f.apply(v)),
        Reg::B(v) => Reg::B(f.apply(v)),
    }
}

struct Splat(usize);

impl Shape for Splat {
    fn apply<T: Copy>(&self, v: &[T]) -> Vec<T> {
        vec![v[0]; self.0]
    }
}

/// Row-major strides of `dims`.
fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * dims[k + 1];
    }
    s
}

/// Visit every index of `dims` in row-major order, passing the offset
/// `Σ idx[k]·src_strides[k]`.
fn for_each_offset(dims: &[usize], src_strides: &[usize], mut f: impl FnMut(usize)) {
    let rank = dims.len();
    if dims.contains(&0) {
        return;
    }
    if rank == 0 {
        f(0);
        return;
    }
    // The innermost axis as a loop, the rest as an odometer.
    let (inner, inner_stride) = (dims[rank - 1], src_strides[rank - 1]);
    let mut idx = vec![0usize; rank - 1];
    let mut base = 0usize;
    loop {
        for j in 0..inner {
            f(base + j * inner_stride);
        }
        let mut k = rank - 1;
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            base += src_strides[k];
            if idx[k] < dims[k] {
                break;
            }
            base -= idx[k] * src_strides[k];
            idx[k] = 0;
        }
    }
}

struct Broadcast<'d> {
    from: &'d [usize],
    to: &'d [usize],
}

impl Shape for Broadcast<'_> {
    fn apply<T: Copy>(&self, v: &[T]) -> Vec<T> {
        let mut s = strides(self.from);
        for (k, st) in s.iter_mut().enumerate() {
            if self.from[k] == 1 {
                *st = 0;
            }
        }
        let mut out = Vec::with_capacity(self.to.iter().product());
        let rank = self.to.len();
        if rank == 0 {
            out.push(v[0]);
            return out;
        }
        // Whole innermost rows at once: a copy of a source row, or one
        // value repeated (memcpy / memset speed instead of per element).
        let (inner, outer_dims) = (self.to[rank - 1], &self.to[..rank - 1]);
        let row_stride = s[rank - 1];
        for_each_offset(outer_dims, &s[..rank - 1], |o| {
            if row_stride == 0 {
                out.resize(out.len() + inner, v[o]);
            } else {
                out.extend_from_slice(&v[o..o + inner]);
            }
        });
        out
    }
}

struct Permute<'d> {
    from: &'d [usize],
    perm: &'d [usize],
}

impl Shape for Permute<'_> {
    fn apply<T: Copy>(&self, v: &[T]) -> Vec<T> {
        let s = strides(self.from);
        let dims: Vec<usize> = self.perm.iter().map(|&p| self.from[p]).collect();
        let src: Vec<usize> = self.perm.iter().map(|&p| s[p]).collect();
        let mut out = Vec::with_capacity(v.len());
        for_each_offset(&dims, &src, |o| out.push(v[o]));
        out
    }
}

fn zip<T: Copy, U>(a: &[T], b: &[T], f: impl Fn(T, T) -> U) -> Vec<U> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

/// NaN-propagating max / min (arith.maximumf / minimumf).
fn maximum(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() {
        f32::NAN
    } else {
        x.max(y)
    }
}

fn minimum(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() {
        f32::NAN
    } else {
        x.min(y)
    }
}

/// Integer BINARY for one width: `$t` signed, `$u` its unsigned twin.
macro_rules! int_binary {
    ($name:ident, $t:ty, $u:ty) => {
        fn $name(k: TileBinary, a: &[$t], b: &[$t]) -> Option<Vec<$t>> {
            use TileBinary::*;
            const BITS: $t = <$t>::BITS as $t;
            Some(match k {
                Add => zip(a, b, <$t>::wrapping_add),
                Sub => zip(a, b, <$t>::wrapping_sub),
                Mul => zip(a, b, <$t>::wrapping_mul),
                Div => zip(a, b, |x, y| if y == 0 { 0 } else { x.wrapping_div(y) }),
                Rem => zip(a, b, |x, y| if y == 0 { x } else { x.wrapping_rem(y) }),
                DivU => zip(a, b, |x, y| if y == 0 { 0 } else { ((x as $u) / (y as $u)) as $t }),
                RemU => zip(a, b, |x, y| if y == 0 { x } else { ((x as $u) % (y as $u)) as $t }),
                Min => zip(a, b, |x, y| x.min(y)),
                Max => zip(a, b, |x, y| x.max(y)),
                MinU => zip(a, b, |x, y| (x as $u).min(y as $u) as $t),
                MaxU => zip(a, b, |x, y| (x as $u).max(y as $u) as $t),
                And => zip(a, b, |x, y| x & y),
                Or => zip(a, b, |x, y| x | y),
                Xor => zip(a, b, |x, y| x ^ y),
                Shl => zip(a, b, |x, y| if (y as $u) < BITS as $u { x << y } else { 0 }),
                ShrU => zip(a, b, |x, y| if (y as $u) < BITS as $u { ((x as $u) >> y) as $t } else { 0 }),
                ShrS => zip(a, b, |x, y| x >> ((y as $u).min(BITS as $u - 1))),
                Minimum | Maximum | Pow => return None,
            })
        }
    };
}
int_binary!(binary_i32, i32, u32);
int_binary!(binary_i64, i64, u64);

fn binary(k: TileBinary, a: &Reg, b: &Reg) -> Result<Reg, TileFault> {
    use TileBinary::*;
    Ok(match (a, b) {
        (Reg::F(a), Reg::F(b)) => Reg::F(match k {
            Add => zip(a, b, |x, y| x + y),
            Sub => zip(a, b, |x, y| x - y),
            Mul => zip(a, b, |x, y| x * y),
            Div => zip(a, b, |x, y| x / y),
            Rem => zip(a, b, |x, y| x % y),
            Min => zip(a, b, f32::min),
            Max => zip(a, b, f32::max),
            Minimum => zip(a, b, minimum),
            Maximum => zip(a, b, maximum),
            Pow => zip(a, b, f32::powf),
            _ => return Err(bad()),
        }),
        (Reg::I(a), Reg::I(b)) => Reg::I(binary_i32(k, a, b).ok_or_else(bad)?),
        (Reg::L(a), Reg::L(b)) => Reg::L(binary_i64(k, a, b).ok_or_else(bad)?),
        (Reg::B(a), Reg::B(b)) => Reg::B(match k {
            And => zip(a, b, |x, y| x & y),
            Or => zip(a, b, |x, y| x | y),
            Xor => zip(a, b, |x, y| x ^ y),
            _ => return Err(bad()),
        }),
        _ => return Err(bad()),
    })
}

/// COMPARE of one element type; `$u` is the unsigned twin of integers.
macro_rules! compare_as {
    ($name:ident, $t:ty, $u:ty) => {
        fn $name(k: TileCmp, a: &[$t], b: &[$t]) -> Vec<bool> {
            use TileCmp::*;
            match k {
                Eq => zip(a, b, |x, y| x == y),
                Ne => zip(a, b, |x, y| x != y),
                Lt => zip(a, b, |x, y| x < y),
                Le => zip(a, b, |x, y| x <= y),
                Gt => zip(a, b, |x, y| x > y),
                Ge => zip(a, b, |x, y| x >= y),
                LtU => zip(a, b, |x, y| (x as $u) < (y as $u)),
                LeU => zip(a, b, |x, y| (x as $u) <= (y as $u)),
                GtU => zip(a, b, |x, y| (x as $u) > (y as $u)),
                GeU => zip(a, b, |x, y| (x as $u) >= (y as $u)),
            }
        }
    };
}
compare_as!(compare_i32, i32, u32);
compare_as!(compare_i64, i64, u64);
// As i1: true is -1 signed, 1 unsigned, so signed order puts true first.
compare_as!(compare_i1, i8, u8);

fn compare(k: TileCmp, a: &Reg, b: &Reg) -> Result<Vec<bool>, TileFault> {
    use TileCmp::*;
    Ok(match (a, b) {
        (Reg::F(a), Reg::F(b)) => match k {
            Eq => zip(a, b, |x, y| x == y),
            // Unordered: true when either is NaN (arith.cmpf une).
            Ne => zip(a, b, |x, y| x != y),
            Lt => zip(a, b, |x, y| x < y),
            Le => zip(a, b, |x, y| x <= y),
            Gt => zip(a, b, |x, y| x > y),
            Ge => zip(a, b, |x, y| x >= y),
            _ => return Err(bad()),
        },
        (Reg::I(a), Reg::I(b)) => compare_i32(k, a, b),
        (Reg::L(a), Reg::L(b)) => compare_i64(k, a, b),
        (Reg::B(a), Reg::B(b)) => {
            let w = |v: &[bool]| v.iter().map(|&x| -(x as i8)).collect::<Vec<i8>>();
            compare_i1(k, &w(a), &w(b))
        }
        _ => return Err(bad()),
    })
}

/// `a = a (k) b` in place for the float kinds that vectorise best;
/// `false` (nothing done) for the others.
fn binary_inplace(k: TileBinary, a: &mut Reg, b: &Reg) -> bool {
    use TileBinary::*;
    let (Reg::F(a), Reg::F(b)) = (a, b) else { return false };
    fn each(a: &mut [f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
        for (x, &y) in a.iter_mut().zip(b) {
            *x = f(*x, y);
        }
    }
    match k {
        Add => each(a, b, |x, y| x + y),
        Sub => each(a, b, |x, y| x - y),
        Mul => each(a, b, |x, y| x * y),
        Div => each(a, b, |x, y| x / y),
        Min => each(a, b, f32::min),
        Max => each(a, b, f32::max),
        Minimum => each(a, b, minimum),
        Maximum => each(a, b, maximum),
        _ => return false,
    }
    true
}

/// The f32 kernel of a UNARY kind, where the activation kernels have it.
fn unary_kernel_op(k: TileUnary) -> Option<UnaryOp> {
    use TileUnary::*;
    Some(match k {
        Neg => UnaryOp::Neg,
        Abs => UnaryOp::Abs,
        Exp => UnaryOp::Exp,
        Log => UnaryOp::Log,
        Sqrt => UnaryOp::Sqrt,
        Sin => UnaryOp::Sin,
        Cos => UnaryOp::Cos,
        Erf => UnaryOp::Erf,
        Tanh => UnaryOp::Tanh,
        _ => return None,
    })
}

fn unary_op(k: TileUnary, a: &Reg) -> Result<Reg, TileFault> {
    use TileUnary::*;
    let kernel = |op: UnaryOp, x: &[f32]| -> Result<Reg, TileFault> {
        let mut y = vec![0.0; x.len()];
        unary(op, x, &mut y).map_err(|_| bad())?;
        Ok(Reg::F(y))
    };
    Ok(match a {
        Reg::F(x) => match (k, unary_kernel_op(k)) {
            (_, Some(op)) => kernel(op, x)?,
            (Exp2, _) => Reg::F(x.iter().map(|v| v.exp2()).collect()),
            (Log2, _) => Reg::F(x.iter().map(|v| v.log2()).collect()),
            (Rsqrt, _) => Reg::F(x.iter().map(|v| 1.0 / v.sqrt()).collect()),
            (Floor, _) => Reg::F(x.iter().map(|v| v.floor()).collect()),
            (Ceil, _) => Reg::F(x.iter().map(|v| v.ceil()).collect()),
            _ => return Err(bad()),
        },
        Reg::I(x) => Reg::I(match k {
            Neg => x.iter().map(|v| v.wrapping_neg()).collect(),
            Abs => x.iter().map(|v| v.wrapping_abs()).collect(),
            _ => return Err(bad()),
        }),
        Reg::L(x) => Reg::L(match k {
            Neg => x.iter().map(|v| v.wrapping_neg()).collect(),
            Abs => x.iter().map(|v| v.wrapping_abs()).collect(),
            _ => return Err(bad()),
        }),
        _ => return Err(bad()),
    })
}

/// CONVERT. Integers are read signed, or unsigned when `unsigned` (an i1
/// true is then 1, else -1); float to integer truncates toward zero and
/// saturates (NaN is 0); to i1 keeps the low bit of the integer value.
fn convert(a: &Reg, to: TileType, unsigned: bool) -> Result<Reg, TileFault> {
    // Every integer source as i128 (exact for i64 and u64 alike).
    let ints: Option<Vec<i128>> = match a {
        Reg::I(v) => Some(v.iter().map(|&x| if unsigned { x as u32 as i128 } else { x as i128 }).collect()),
        Reg::L(v) => Some(v.iter().map(|&x| if unsigned { x as u64 as i128 } else { x as i128 }).collect()),
        Reg::B(v) => Some(v.iter().map(|&x| if !x { 0 } else if unsigned { 1 } else { -1 }).collect()),
        _ => None,
    };
    Ok(match (a, ints, to) {
        (Reg::F(v), _, TileType::F32) => Reg::F(v.clone()),
        (Reg::F(v), _, TileType::I32) => Reg::I(v.iter().map(|&x| if unsigned { x as u32 as i32 } else { x as i32 }).collect()),
        (Reg::F(v), _, TileType::I64) => Reg::L(v.iter().map(|&x| if unsigned { x as u64 as i64 } else { x as i64 }).collect()),
        (Reg::F(v), _, TileType::I1) => Reg::B(v.iter().map(|&x| (x as i64) & 1 != 0).collect()),
        (_, Some(n), TileType::F32) => Reg::F(n.iter().map(|&x| x as f32).collect()),
        (_, Some(n), TileType::I32) => Reg::I(n.iter().map(|&x| x as i32).collect()),
        (_, Some(n), TileType::I64) => Reg::L(n.iter().map(|&x| x as i64).collect()),
        (_, Some(n), TileType::I1) => Reg::B(n.iter().map(|&x| x & 1 != 0).collect()),
        _ => return Err(bad()),
    })
}

fn select(c: &[bool], a: &Reg, b: &Reg) -> Result<Reg, TileFault> {
    fn pick<T: Copy>(c: &[bool], a: &[T], b: &[T]) -> Vec<T> {
        c.iter().zip(a.iter().zip(b)).map(|(&c, (&x, &y))| if c { x } else { y }).collect()
    }
    Ok(match (a, b) {
        (Reg::F(a), Reg::F(b)) => Reg::F(pick(c, a, b)),
        (Reg::I(a), Reg::I(b)) => Reg::I(pick(c, a, b)),
        (Reg::L(a), Reg::L(b)) => Reg::L(pick(c, a, b)),
        (Reg::B(a), Reg::B(b)) => Reg::B(pick(c, a, b)),
        _ => return Err(bad()),
    })
}

/// Lane `i` reads `read(ptr[i])` where the mask is on (an offset outside
/// `[0, len)` is an error carrying it), `other[i]` (or the default) where
/// it is off.
fn gather<T: Copy + Default>(len: usize, ptr: &[i64], mask: Option<&[bool]>, other: Option<&[T]>, read: impl Fn(usize) -> T) -> Result<Vec<T>, i64> {
    if mask.is_none() {
        // Unmasked: check the whole range once, then read without a
        // branch per lane.
        let (lo, hi) = ptr.iter().fold((i64::MAX, i64::MIN), |(lo, hi), &o| (lo.min(o), hi.max(o)));
        if !ptr.is_empty() && (lo < 0 || hi as u64 >= len as u64) {
            return Err(ptr.iter().copied().find(|&o| o < 0 || o as u64 >= len as u64).unwrap_or(lo));
        }
        return Ok(ptr.iter().map(|&o| read(o as usize)).collect());
    }
    let mut out = Vec::with_capacity(ptr.len());
    for (i, &o) in ptr.iter().enumerate() {
        if mask.is_none_or(|m| m[i]) {
            if o < 0 || o as u64 >= len as u64 {
                return Err(o);
            }
            out.push(read(o as usize));
        } else {
            out.push(other.map_or_else(T::default, |v| v[i]));
        }
    }
    Ok(out)
}

/// An unmasked f32 load whose rows (runs of `row` lanes) each read
/// consecutive elements: row copies. `None` when some row is not such a
/// run.
fn load_rows(s: &[f32], ptr: &[i64], row: usize) -> Option<Result<Vec<f32>, i64>> {
    if row < 8 || !ptr.len().is_multiple_of(row) {
        return None;
    }
    let contiguous = ptr.chunks_exact(row).all(|r| r.iter().enumerate().all(|(j, &o)| o.wrapping_sub(r[0]) == j as i64));
    if !contiguous {
        return None;
    }
    let mut out = Vec::with_capacity(ptr.len());
    for r in ptr.chunks_exact(row) {
        let (lo, hi) = (r[0], r[0].wrapping_add(row as i64 - 1));
        if lo < 0 || hi < lo || hi as u64 >= s.len() as u64 {
            let bad = r.iter().copied().find(|&o| o < 0 || o as u64 >= s.len() as u64).unwrap_or(lo);
            return Some(Err(bad));
        }
        out.extend_from_slice(&s[lo as usize..=hi as usize]);
    }
    Some(Ok(out))
}

fn load(mem: &TileMem<'_>, dtype: TileType, ptr: &[i64], row: usize, mask: Option<&[bool]>, other: Option<&Reg>) -> Result<Reg, i64> {
    let len = mem.len();
    if let (TileMem::F32(s), None) = (mem, mask) {
        if let Some(r) = load_rows(s, ptr, row) {
            return r.map(Reg::F);
        }
    }
    let (mut of, mut oi, mut ol, mut ob) = (None, None, None, None);
    match other {
        Some(Reg::F(v)) => of = Some(v.as_slice()),
        Some(Reg::I(v)) => oi = Some(v.as_slice()),
        Some(Reg::L(v)) => ol = Some(v.as_slice()),
        Some(Reg::B(v)) => ob = Some(v.as_slice()),
        _ => {}
    }
    Ok(match mem {
        TileMem::F32(s) => Reg::F(gather(len, ptr, mask, of, |o| s[o])?),
        TileMem::I32(s) => Reg::I(gather(len, ptr, mask, oi, |o| s[o])?),
        TileMem::I64(s) => Reg::L(gather(len, ptr, mask, ol, |o| s[o])?),
        TileMem::I1(s) => Reg::B(gather(len, ptr, mask, ob, |o| s[o] != 0)?),
        // A written 32-bit buffer holds f32 bits or i32, as the program's
        // buffer type says.
        TileMem::W32(s) if dtype == TileType::I32 => Reg::I(gather(len, ptr, mask, oi, |o| s[o].load(Relaxed) as i32)?),
        TileMem::W32(s) => Reg::F(gather(len, ptr, mask, of, |o| f32::from_bits(s[o].load(Relaxed)))?),
        TileMem::W64(s) => Reg::L(gather(len, ptr, mask, ol, |o| s[o].load(Relaxed) as i64)?),
        TileMem::W8(s) => Reg::B(gather(len, ptr, mask, ob, |o| s[o].load(Relaxed) != 0)?),
    })
}

/// Lane `i` writes `write(ptr[i], i)` where the mask is on.
fn scatter(len: usize, ptr: &[i64], mask: Option<&[bool]>, write: impl Fn(usize, usize)) -> Result<(), i64> {
    for (i, &o) in ptr.iter().enumerate() {
        if mask.is_none_or(|m| m[i]) {
            if o < 0 || o as u64 >= len as u64 {
                return Err(o);
            }
            write(o as usize, i);
        }
    }
    Ok(())
}

fn store(mem: &TileMem<'_>, ptr: &[i64], value: &Reg, mask: Option<&[bool]>) -> Result<(), i64> {
    let len = mem.len();
    match (mem, value) {
        (TileMem::W32(s), Reg::F(v)) => scatter(len, ptr, mask, |o, i| s[o].store(v[i].to_bits(), Relaxed)),
        (TileMem::W32(s), Reg::I(v)) => scatter(len, ptr, mask, |o, i| s[o].store(v[i] as u32, Relaxed)),
        (TileMem::W64(s), Reg::L(v)) => scatter(len, ptr, mask, |o, i| s[o].store(v[i] as u64, Relaxed)),
        (TileMem::W8(s), Reg::B(v)) => scatter(len, ptr, mask, |o, i| s[o].store(v[i] as u8, Relaxed)),
        // run_tile checked every stored buffer is a written one of the
        // value's type; nothing to do otherwise.
        _ => Ok(()),
    }
}

/// An integer REDUCE of `$v` (elements `$t`) by kind `$k`.
macro_rules! int_reduce {
    ($k:expr, $v:expr, $o:expr, $l:expr, $i:expr, $t:ty) => {
        match $k {
            TileReduce::Sum => fold($v, $o, $l, $i, <$t>::wrapping_add),
            TileReduce::Prod => fold($v, $o, $l, $i, <$t>::wrapping_mul),
            TileReduce::Max => fold($v, $o, $l, $i, <$t>::max),
            TileReduce::Min => fold($v, $o, $l, $i, <$t>::min),
            TileReduce::And => fold($v, $o, $l, $i, |x, y| x & y),
            TileReduce::Or => fold($v, $o, $l, $i, |x, y| x | y),
            TileReduce::Xor => fold($v, $o, $l, $i, |x, y| x ^ y),
            _ => return Err(bad()),
        }
    };
}

/// REDUCE over the middle axis of `[outer, len, inner]`.
fn reduce(k: TileReduce, a: &Reg, outer: usize, len: usize, inner: usize) -> Result<Reg, TileFault> {
    fn fold<T: Copy>(v: &[T], outer: usize, len: usize, inner: usize, f: impl Fn(T, T) -> T) -> Vec<T> {
        let mut out = Vec::with_capacity(outer * inner);
        for o in 0..outer {
            let base = o * len * inner;
            if inner == 1 {
                // Eight independent lanes, combined at the end: the
                // compiler vectorises this (the kinds are associative up
                // to float rounding, which Triton's reductions leave open
                // too).
                let row = &v[base..base + len];
                let (lanes, rest) = row.split_at(len - len % 8);
                let mut acc = row[0];
                if !lanes.is_empty() {
                    let mut l: [T; 8] = lanes[..8].try_into().unwrap_or([row[0]; 8]);
                    for c in lanes[8..].chunks_exact(8) {
                        for k in 0..8 {
                            l[k] = f(l[k], c[k]);
                        }
                    }
                    acc = l[1..].iter().fold(l[0], |a, &x| f(a, x));
                    for &x in rest {
                        acc = f(acc, x);
                    }
                } else {
                    for &x in &row[1..] {
                        acc = f(acc, x);
                    }
                }
                out.push(acc);
            } else {
                let mut acc: Vec<T> = v[base..base + inner].to_vec();
                for l in 1..len {
                    for (a, &x) in acc.iter_mut().zip(&v[base + l * inner..base + (l + 1) * inner]) {
                        *a = f(*a, x);
                    }
                }
                out.extend(acc);
            }
        }
        out
    }
    use TileReduce::*;
    let (o, l, i) = (outer, len, inner);
    Ok(match a {
        Reg::F(v) => Reg::F(match k {
            Sum => fold(v, o, l, i, |x, y| x + y),
            Prod => fold(v, o, l, i, |x, y| x * y),
            Max => fold(v, o, l, i, f32::max),
            Min => fold(v, o, l, i, f32::min),
            Maximum => fold(v, o, l, i, maximum),
            Minimum => fold(v, o, l, i, minimum),
            _ => return Err(bad()),
        }),
        // Integer reductions, the same for both widths (wrapping).
        Reg::I(v) => Reg::I(int_reduce!(k, v, o, l, i, i32)),
        Reg::L(v) => Reg::L(int_reduce!(k, v, o, l, i, i64)),
        Reg::B(v) => Reg::B(match k {
            And => fold(v, o, l, i, |x, y| x & y),
            Or => fold(v, o, l, i, |x, y| x | y),
            Xor => fold(v, o, l, i, |x, y| x ^ y),
            _ => return Err(bad()),
        }),
        Reg::Empty => return Err(bad()),
    })
}

