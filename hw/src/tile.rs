//! Tile programs: the compute cores' programmable engine (TILE, op 19,
//! hardware minor version 8).
//!
//! A tile program is straight-line SSA code over **tiles**: small dense
//! arrays (rank ≤ [`MAX_TILE_RANK`], at most [`MAX_TILE_ELEMS`] elements)
//! of f32, i32, i64, i1 or pointers. Instruction `i` defines register `i`;
//! operands name earlier registers. Every instruction carries its result
//! type (dtype, shape and, for pointers, the buffer slot), so [`verify`]
//! checks a whole program in one pass without allocating, and the
//! executor never meets an ill-typed operand.
//!
//! A TILE descriptor ([`TileDesc`]) launches a program over a grid of
//! program instances (`program_id` 0..grid per axis) with up to
//! [`MAX_TILE_BUFFERS`] buffers (VA and length in elements; the element
//! type is the program's) and up to [`MAX_TILE_PARAMS`] scalar
//! parameters. Pointers are **element offsets into one buffer**, the
//! buffer fixed by the program's types: a load or store of an active lane
//! outside `[0, len)` of its buffer is an `OutOfBounds` fault at the VA it
//! would have touched, so a program reaches nothing but its buffers.
//!
//! Binary layout: a [`TileProgramHeader`] (64 bytes) then `ninstr`
//! [`TileInstr`]s (48 bytes each), little-endian. `docs/hardware.md` 8.20
//! is the prose version, with each op's semantics.

use super::ops::OpHeader;

/// "RTIL", little-endian.
pub const TILE_MAGIC: u32 = u32::from_le_bytes(*b"RTIL");
pub const TILE_VERSION: u32 = 1;
pub const MAX_TILE_RANK: usize = 4;
/// Largest tile (elements): Triton's own limit on a tensor's elements.
pub const MAX_TILE_ELEMS: u64 = 1 << 20;
pub const MAX_TILE_INSTRS: u32 = 1 << 16;
pub const MAX_TILE_BUFFERS: usize = 16;
pub const MAX_TILE_PARAMS: usize = 16;
/// Sum of all result tiles' elements of one program: bounds the memory one
/// program instance may use.
pub const MAX_TILE_PROGRAM_ELEMS: u64 = 1 << 24;
/// Most program instances one launch may run.
pub const MAX_TILE_GRID: u64 = 1 << 24;
/// Operand index meaning "no operand".
pub const NO_OPERAND: u32 = u32::MAX;

/// Element types of registers, buffers and parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TileType {
    /// No value (a STORE's result).
    None = 0,
    F32 = 1,
    I32 = 2,
    I64 = 3,
    /// Boolean; one byte (0 or 1) in memory.
    I1 = 4,
    /// Element offsets (i64) into the buffer named by the instruction's
    /// `slot`.
    Ptr = 5,
}

impl TileType {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => TileType::None,
            1 => TileType::F32,
            2 => TileType::I32,
            3 => TileType::I64,
            4 => TileType::I1,
            5 => TileType::Ptr,
            _ => return None,
        })
    }
    /// Bytes per element in a buffer (`None`: not a memory type).
    pub const fn mem_size(self) -> Option<u64> {
        match self {
            TileType::F32 | TileType::I32 => Some(4),
            TileType::I64 => Some(8),
            TileType::I1 => Some(1),
            _ => None,
        }
    }
    pub const fn is_int(self) -> bool {
        matches!(self, TileType::I32 | TileType::I64 | TileType::I1)
    }
}

/// Instruction op codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TileOp {
    /// Every element is `imm` (f32 bits, or a sign-extended integer).
    Const = 1,
    /// Scalar parameter `slot` of the launch.
    Param = 2,
    /// Pointer to element 0 of buffer `slot` (rank 0).
    Buffer = 3,
    /// This instance's program id along `axis` (i32, rank 0).
    ProgramId = 4,
    /// The grid's size along `axis` (i32, rank 0).
    NumPrograms = 5,
    /// `[imm, imm + shape[0])` as i32 (rank 1; `imm` sign-extended i32).
    Range = 6,
    /// Rank-0 `a` repeated over the result's shape.
    Splat = 7,
    /// `a` broadcast along its dims of size 1 (same rank).
    Broadcast = 8,
    /// `a`'s elements in order with another shape (same count).
    Reshape = 9,
    /// `a` with its axes permuted: result axis `i` is `a`'s axis
    /// `perm[i]`, `perm[i]` in byte `i` of `imm`.
    Permute = 10,
    /// Element-wise `a (kind) b` ([`TileBinary`]), same type and shape.
    Binary = 11,
    /// Element-wise comparison ([`TileCmp`]) to i1.
    Compare = 12,
    /// Element-wise function ([`TileUnary`]).
    Unary = 13,
    /// Element-wise conversion to the result dtype; `kind` 1: the source
    /// integer is unsigned (zero-extended / converted as unsigned).
    Convert = 14,
    /// `a ? b : c` element-wise (`a` i1).
    Select = 15,
    /// `a·b + c` (f32), fused.
    Fma = 16,
    /// Pointer `a` advanced by integer offsets `b` (elements).
    AddPtr = 17,
    /// Load through pointers `a`; `b` mask (i1, optional), `c` value of
    /// masked-off lanes (optional; else 0).
    Load = 18,
    /// Store `b` through pointers `a`; `c` mask (optional). No result.
    Store = 19,
    /// `a[M×K]·b[K×N] (+ c[M×N])` in f32 with f32 accumulation.
    Dot = 20,
    /// Reduction ([`TileReduce`]) of `a` along `axis` (the axis is
    /// removed).
    Reduce = 21,
}

impl TileOp {
    pub fn from_u8(v: u8) -> Option<Self> {
        use TileOp::*;
        Some(match v {
            1 => Const,
            2 => Param,
            3 => Buffer,
            4 => ProgramId,
            5 => NumPrograms,
            6 => Range,
            7 => Splat,
            8 => Broadcast,
            9 => Reshape,
            10 => Permute,
            11 => Binary,
            12 => Compare,
            13 => Unary,
            14 => Convert,
            15 => Select,
            16 => Fma,
            17 => AddPtr,
            18 => Load,
            19 => Store,
            20 => Dot,
            21 => Reduce,
            _ => return None,
        })
    }
}

/// BINARY kinds. Integers wrap (two's complement); a division by zero
/// gives 0 and a remainder by zero the dividend; shifts by at least the
/// width give 0 (ShrS: the sign). Float Min/Max ignore a NaN operand
/// (IEEE minNum/maxNum); Minimum/Maximum propagate it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TileBinary {
    Add = 0,
    Sub = 1,
    Mul = 2,
    /// Float division; signed integer division (truncating).
    Div = 3,
    /// Float remainder (sign of the dividend, as `fmod`); signed integer
    /// remainder.
    Rem = 4,
    Min = 5,
    Max = 6,
    Minimum = 7,
    Maximum = 8,
    And = 9,
    Or = 10,
    Xor = 11,
    Shl = 12,
    ShrS = 13,
    ShrU = 14,
    DivU = 15,
    RemU = 16,
    MinU = 17,
    MaxU = 18,
    /// `a^b` (f32).
    Pow = 19,
}

impl TileBinary {
    pub fn from_u8(v: u8) -> Option<Self> {
        use TileBinary::*;
        const ALL: [TileBinary; 20] =
            [Add, Sub, Mul, Div, Rem, Min, Max, Minimum, Maximum, And, Or, Xor, Shl, ShrS, ShrU, DivU, RemU, MinU, MaxU, Pow];
        ALL.get(v as usize).copied()
    }
    /// Whether the kind applies to elements of `t`.
    pub fn accepts(self, t: TileType) -> bool {
        use TileBinary::*;
        match t {
            TileType::F32 => matches!(self, Add | Sub | Mul | Div | Rem | Min | Max | Minimum | Maximum | Pow),
            TileType::I32 | TileType::I64 => !matches!(self, Minimum | Maximum | Pow),
            TileType::I1 => matches!(self, And | Or | Xor),
            _ => false,
        }
    }
}

/// COMPARE kinds: signed for integers, ordered for floats (false if
/// either is NaN) except `Ne`, which is unordered (true if either is NaN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TileCmp {
    Eq = 0,
    Ne = 1,
    Lt = 2,
    Le = 3,
    Gt = 4,
    Ge = 5,
    /// Unsigned integer comparisons.
    LtU = 6,
    LeU = 7,
    GtU = 8,
    GeU = 9,
}

impl TileCmp {
    pub fn from_u8(v: u8) -> Option<Self> {
        use TileCmp::*;
        const ALL: [TileCmp; 10] = [Eq, Ne, Lt, Le, Gt, Ge, LtU, LeU, GtU, GeU];
        ALL.get(v as usize).copied()
    }
    pub fn accepts(self, t: TileType) -> bool {
        match t {
            TileType::F32 => (self as u8) <= TileCmp::Ge as u8,
            TileType::I32 | TileType::I64 | TileType::I1 => true,
            _ => false,
        }
    }
}

/// UNARY kinds. Integers (i32, i64) accept Neg and Abs (wrapping); the
/// rest are f32 only, accurate to a few ulp (Erf: absolute error < 5e-7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TileUnary {
    Neg = 0,
    Abs = 1,
    Exp = 2,
    Exp2 = 3,
    Log = 4,
    Log2 = 5,
    Sqrt = 6,
    Rsqrt = 7,
    Sin = 8,
    Cos = 9,
    Floor = 10,
    Ceil = 11,
    Erf = 12,
    Tanh = 13,
}

impl TileUnary {
    pub fn from_u8(v: u8) -> Option<Self> {
        use TileUnary::*;
        const ALL: [TileUnary; 14] = [Neg, Abs, Exp, Exp2, Log, Log2, Sqrt, Rsqrt, Sin, Cos, Floor, Ceil, Erf, Tanh];
        ALL.get(v as usize).copied()
    }
    pub fn accepts(self, t: TileType) -> bool {
        match t {
            TileType::F32 => true,
            TileType::I32 | TileType::I64 => matches!(self, TileUnary::Neg | TileUnary::Abs),
            _ => false,
        }
    }
}

/// REDUCE kinds (float Max/Min as BINARY's: NaN ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TileReduce {
    Sum = 0,
    Max = 1,
    Min = 2,
    /// NaN-propagating float max / min.
    Maximum = 3,
    Minimum = 4,
    Prod = 5,
    And = 6,
    Or = 7,
    Xor = 8,
}

impl TileReduce {
    pub fn from_u8(v: u8) -> Option<Self> {
        use TileReduce::*;
        const ALL: [TileReduce; 9] = [Sum, Max, Min, Maximum, Minimum, Prod, And, Or, Xor];
        ALL.get(v as usize).copied()
    }
    pub fn accepts(self, t: TileType) -> bool {
        use TileReduce::*;
        match t {
            TileType::F32 => matches!(self, Sum | Max | Min | Maximum | Minimum | Prod),
            TileType::I32 | TileType::I64 => !matches!(self, Maximum | Minimum),
            TileType::I1 => matches!(self, And | Or | Xor),
            _ => false,
        }
    }
}

wire_struct! {
    /// The first 64 bytes of a tile program.
    pub struct TileProgramHeader {
        /// [`TILE_MAGIC`].
        pub magic: u32,
        /// [`TILE_VERSION`].
        pub version: u32,
        /// Instructions that follow (1..=[`MAX_TILE_INSTRS`]).
        pub ninstr: u32,
        /// Buffers the launch must give (≤ [`MAX_TILE_BUFFERS`]).
        pub nbufs: u32,
        /// Scalar parameters the launch must give (≤ [`MAX_TILE_PARAMS`]).
        pub nparams: u32,
        pub reserved: u32,
        /// Element type ([`TileType`], a memory type) of each buffer;
        /// entries from `nbufs` on are 0.
        pub buf_types: [u8; 16],
        /// Type of each parameter (F32, I32, I64 or I1); from `nparams` on 0.
        pub param_types: [u8; 16],
        pub reserved2: u64,
    }
}

wire_struct! {
    /// One instruction; it defines the register of its own index.
    pub struct TileInstr {
        /// [`TileOp`].
        pub op: u8,
        /// Result element type ([`TileType`]).
        pub dtype: u8,
        /// Result rank (≤ [`MAX_TILE_RANK`]).
        pub rank: u8,
        /// Sub-operation: the BINARY / COMPARE / UNARY / REDUCE kind,
        /// CONVERT's signedness; else 0.
        pub kind: u8,
        /// Buffer of a pointer result; PARAM's parameter; else 0.
        pub slot: u8,
        /// PROGRAM_ID / NUM_PROGRAMS / REDUCE axis; else 0.
        pub axis: u8,
        pub reserved: u16,
        /// Operand registers (earlier instructions), [`NO_OPERAND`] when
        /// unused.
        pub a: u32,
        pub b: u32,
        pub c: u32,
        pub d: u32,
        /// Result shape; dims from `rank` on are 0, the others ≥ 1.
        pub shape: [u32; 4],
        /// CONST's value, RANGE's start, PERMUTE's axes; else 0.
        pub imm: u64,
    }
}

wire_struct! {
    /// TILE (op 19): run a tile program over a grid. Buffer `i` is
    /// `buf_len[i]` elements of the program's `buf_types[i]` at
    /// `buf_va[i]`; parameter `i` is `params[i]` (f32 and i32 in the low
    /// 32 bits, the high bits 0; i1 0 or 1). Entries from `nbufs` /
    /// `nparams` on are 0.
    pub struct TileDesc {
        pub header: OpHeader,
        pub program_va: u64,
        /// Program bytes: 64 + 48·ninstr.
        pub program_size: u32,
        pub nbufs: u32,
        pub grid: [u32; 3],
        pub nparams: u32,
        pub buf_va: [u64; 16],
        pub buf_len: [u64; 16],
        pub params: [u64; 16],
    }
}

impl TileInstr {
    /// An instruction of `op` with result type `dtype` and `shape` (rank =
    /// its length, at most [`MAX_TILE_RANK`]; longer shapes are cut), no
    /// operands and the other fields 0.
    pub fn new(op: TileOp, dtype: TileType, shape: &[u32]) -> TileInstr {
        TileInstr { op: op as u8, a: NO_OPERAND, b: NO_OPERAND, c: NO_OPERAND, d: NO_OPERAND, ..Default::default() }.typed(dtype, shape)
    }

    /// The instruction with result type `dtype` and `shape` (cut at
    /// [`MAX_TILE_RANK`]).
    pub fn typed(self, dtype: TileType, shape: &[u32]) -> TileInstr {
        let rank = shape.len().min(MAX_TILE_RANK);
        let mut s = [0u32; 4];
        s[..rank].copy_from_slice(&shape[..rank]);
        TileInstr { dtype: dtype as u8, rank: rank as u8, shape: s, ..self }
    }
}

const _: () = assert!(TileProgramHeader::SIZE == 64);
const _: () = assert!(TileInstr::SIZE == 48);
const _: () = assert!(TileDesc::SIZE == 424);
const _: () = assert!(MAX_TILE_BUFFERS == 16 && MAX_TILE_PARAMS == 16);

/// Largest program (bytes).
pub const MAX_TILE_PROGRAM_SIZE: u64 = TileProgramHeader::SIZE as u64 + TileInstr::SIZE as u64 * MAX_TILE_INSTRS as u64;

/// Why a tile program or launch was refused: the instruction (or
/// `u32::MAX` for the header / descriptor) and the rule broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileError {
    pub instr: u32,
    pub what: &'static str,
}

impl core::fmt::Display for TileError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.instr == u32::MAX {
            write!(f, "tile program: {}", self.what)
        } else {
            write!(f, "tile program instruction {}: {}", self.instr, self.what)
        }
    }
}

/// A register's type, as its defining instruction states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegType {
    pub dtype: TileType,
    pub rank: usize,
    pub shape: [u32; 4],
    /// Buffer of a pointer register.
    pub slot: u8,
}

impl RegType {
    pub fn dims(&self) -> &[u32] {
        &self.shape[..self.rank]
    }
    pub fn volume(&self) -> u64 {
        self.dims().iter().map(|&d| d as u64).product()
    }
    /// Same dtype, slot and shape.
    fn same(&self, o: &RegType) -> bool {
        self == o
    }
}

/// What [`verify`] learned about a program.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TileInfo {
    pub header: TileProgramHeader,
    /// Bit `i`: buffer `i` is loaded from / stored to.
    pub loads: u16,
    pub stores: u16,
    /// Work of one instance: the result tiles' elements plus 2·M·N·K per
    /// DOT (the nominal FLOP count of 8.21 per program instance).
    pub work: u64,
}

/// A program's bytes, checked for size.
#[derive(Clone, Copy, Debug)]
pub struct TileProgram<'a> {
    bytes: &'a [u8],
    pub header: TileProgramHeader,
}

impl<'a> TileProgram<'a> {
    /// The header and size checks (not the instructions: see [`verify`]).
    pub fn new(bytes: &'a [u8]) -> Result<Self, TileError> {
        let err = |what| TileError { instr: u32::MAX, what };
        let header = TileProgramHeader::read_from(bytes).ok_or(err("shorter than its header"))?;
        if header.magic != TILE_MAGIC {
            return Err(err("bad magic"));
        }
        if header.version != TILE_VERSION {
            return Err(err("unknown version"));
        }
        if header.ninstr == 0 || header.ninstr > MAX_TILE_INSTRS {
            return Err(err("instruction count"));
        }
        if bytes.len() as u64 != TileProgramHeader::SIZE as u64 + TileInstr::SIZE as u64 * header.ninstr as u64 {
            return Err(err("size is not 64 + 48 x instructions"));
        }
        if header.reserved != 0 || header.reserved2 != 0 {
            return Err(err("reserved header field"));
        }
        let (nb, np) = (header.nbufs as usize, header.nparams as usize);
        if nb > MAX_TILE_BUFFERS || np > MAX_TILE_PARAMS {
            return Err(err("too many buffers or parameters"));
        }
        for (i, &t) in header.buf_types.iter().enumerate() {
            let ok = match TileType::from_u8(t) {
                _ if i >= nb => t == 0,
                Some(t) => t.mem_size().is_some(),
                None => false,
            };
            if !ok {
                return Err(err("buffer type"));
            }
        }
        for (i, &t) in header.param_types.iter().enumerate() {
            let ok = match TileType::from_u8(t) {
                _ if i >= np => t == 0,
                Some(t) => t.mem_size().is_some(),
                None => false,
            };
            if !ok {
                return Err(err("parameter type"));
            }
        }
        Ok(TileProgram { bytes, header })
    }

    pub fn len(&self) -> u32 {
        self.header.ninstr
    }

    pub fn is_empty(&self) -> bool {
        self.header.ninstr == 0
    }

    /// Instruction `i` (< len).
    pub fn instr(&self, i: u32) -> TileInstr {
        let at = TileProgramHeader::SIZE + TileInstr::SIZE * i as usize;
        TileInstr::read_from(&self.bytes[at..]).unwrap_or_default()
    }

    /// The result type instruction `i` declares (checked by [`verify`]).
    pub fn reg_type(&self, i: u32) -> RegType {
        let ins = self.instr(i);
        let dtype = TileType::from_u8(ins.dtype).unwrap_or(TileType::None);
        RegType {
            dtype,
            rank: (ins.rank as usize).min(MAX_TILE_RANK),
            shape: ins.shape,
            // PARAM's slot names its parameter, not a buffer.
            slot: if dtype == TileType::Ptr { ins.slot } else { 0 },
        }
    }
}

/// Check every instruction of `bytes`: header rules, operand order,
/// types and shapes, kinds, limits. On success the executor may rely on
/// every rule of `docs/hardware.md` 8.20.
pub fn verify(bytes: &[u8]) -> Result<TileInfo, TileError> {
    let p = TileProgram::new(bytes)?;
    let h = p.header;
    let mut info = TileInfo { header: h, loads: 0, stores: 0, work: 0 };
    let mut total: u64 = 0;
    for i in 0..p.len() {
        let ins = p.instr(i);
        let err = |what| TileError { instr: i, what };
        let op = TileOp::from_u8(ins.op).ok_or(err("unknown op"))?;
        let dtype = TileType::from_u8(ins.dtype).ok_or(err("unknown dtype"))?;
        let rank = ins.rank as usize;
        if rank > MAX_TILE_RANK {
            return Err(err("rank above 4"));
        }
        if ins.shape[..rank].contains(&0) || ins.shape[rank..].iter().any(|&d| d != 0) {
            return Err(err("shape: dims must be >= 1 up to the rank and 0 after"));
        }
        if ins.reserved != 0 {
            return Err(err("reserved field"));
        }
        let r = p.reg_type(i);
        let vol = r.volume();
        if vol > MAX_TILE_ELEMS {
            return Err(err("tile above 2^20 elements"));
        }
        // Which operands the op takes (a, b, c, d): required / optional / none.
        let operand = |v: u32| -> Result<Option<RegType>, TileError> {
            if v == NO_OPERAND {
                return Ok(None);
            }
            if v >= i {
                return Err(err("operand is not an earlier instruction"));
            }
            let t = p.reg_type(v);
            if t.dtype == TileType::None {
                return Err(err("operand has no value (a STORE)"));
            }
            Ok(Some(t))
        };
        let (a, b, c, d) = (operand(ins.a)?, operand(ins.b)?, operand(ins.c)?, operand(ins.d)?);
        let need = |o: Option<RegType>| o.ok_or(err("missing operand"));
        let none = |o: Option<RegType>| if o.is_some() { Err(err("unexpected operand")) } else { Ok(()) };
        let value_type = |t: TileType| matches!(t, TileType::F32 | TileType::I32 | TileType::I64 | TileType::I1);
        let mut slot_used = false;
        let mut kind_used = false;
        let mut axis_used = false;
        let mut imm_used = false;
        match op {
            TileOp::Const => {
                none(a)?;
                if !value_type(dtype) {
                    return Err(err("constant type"));
                }
                imm_used = true;
                let ok = match dtype {
                    TileType::F32 | TileType::I32 => ins.imm >> 32 == 0,
                    TileType::I1 => ins.imm <= 1,
                    _ => true,
                };
                if !ok {
                    return Err(err("constant bits beyond its type"));
                }
            }
            TileOp::Param => {
                none(a)?;
                slot_used = true;
                if ins.slot as u32 >= h.nparams || rank != 0 || ins.dtype != h.param_types[ins.slot as usize] {
                    return Err(err("parameter slot, type or rank"));
                }
            }
            TileOp::Buffer => {
                none(a)?;
                slot_used = true;
                if ins.slot as u32 >= h.nbufs || rank != 0 || dtype != TileType::Ptr {
                    return Err(err("buffer slot, type or rank"));
                }
            }
            TileOp::ProgramId | TileOp::NumPrograms => {
                none(a)?;
                axis_used = true;
                if ins.axis > 2 || rank != 0 || dtype != TileType::I32 {
                    return Err(err("program id axis, type or rank"));
                }
            }
            TileOp::Range => {
                none(a)?;
                imm_used = true;
                if rank != 1 || dtype != TileType::I32 || ins.imm >> 32 != 0 {
                    return Err(err("range type, rank or start"));
                }
                let start = ins.imm as u32 as i32 as i64;
                if start + ins.shape[0] as i64 > i32::MAX as i64 + 1 {
                    return Err(err("range beyond i32"));
                }
            }
            TileOp::Splat | TileOp::Broadcast | TileOp::Reshape | TileOp::Permute => {
                let a = need(a)?;
                none(b)?;
                slot_used = dtype == TileType::Ptr;
                if a.dtype != dtype || a.slot != r.slot {
                    return Err(err("result type differs from the operand's"));
                }
                match op {
                    TileOp::Splat if a.rank != 0 => return Err(err("splat of a non-scalar")),
                    TileOp::Broadcast if a.rank != rank || a.dims().iter().zip(r.dims()).any(|(&x, &y)| x != y && x != 1) => {
                        return Err(err("broadcast shape"));
                    }
                    TileOp::Reshape if a.volume() != vol => return Err(err("reshape changes the element count")),
                    TileOp::Permute => {
                        imm_used = true;
                        if a.rank != rank || ins.imm >> (8 * rank) != 0 {
                            return Err(err("permute rank"));
                        }
                        let mut seen = 0u32;
                        for k in 0..rank {
                            let src = ((ins.imm >> (8 * k)) & 0xff) as usize;
                            if src >= rank || seen & (1 << src) != 0 || a.shape[src] != r.shape[k] {
                                return Err(err("permute axes or shape"));
                            }
                            seen |= 1 << src;
                        }
                    }
                    _ => {}
                }
            }
            TileOp::Binary | TileOp::Compare => {
                let (a, b) = (need(a)?, need(b)?);
                none(c)?;
                kind_used = true;
                if !a.same(&b) || a.rank != rank || a.shape != r.shape {
                    return Err(err("operands differ in type or shape from each other or the result"));
                }
                let ok = if op == TileOp::Binary {
                    dtype == a.dtype && TileBinary::from_u8(ins.kind).is_some_and(|k| k.accepts(dtype))
                } else {
                    dtype == TileType::I1 && TileCmp::from_u8(ins.kind).is_some_and(|k| k.accepts(a.dtype))
                };
                if !ok {
                    return Err(err("kind or type"));
                }
            }
            TileOp::Unary => {
                let a = need(a)?;
                none(b)?;
                kind_used = true;
                if a.dtype != dtype || a.rank != rank || a.shape != r.shape || !TileUnary::from_u8(ins.kind).is_some_and(|k| k.accepts(dtype)) {
                    return Err(err("unary kind, type or shape"));
                }
            }
            TileOp::Convert => {
                let a = need(a)?;
                none(b)?;
                kind_used = true;
                if !value_type(a.dtype) || !value_type(dtype) || a.rank != rank || a.shape != r.shape || ins.kind > 1 {
                    return Err(err("convert types or shape"));
                }
            }
            TileOp::Select => {
                let (a, b, c) = (need(a)?, need(b)?, need(c)?);
                slot_used = dtype == TileType::Ptr;
                if a.dtype != TileType::I1 || a.rank != rank || a.shape != r.shape || !b.same(&r) || !c.same(&r) {
                    return Err(err("select types or shapes"));
                }
            }
            TileOp::Fma => {
                let (a, b, c) = (need(a)?, need(b)?, need(c)?);
                if dtype != TileType::F32 || !a.same(&r) || !b.same(&r) || !c.same(&r) {
                    return Err(err("fma types or shapes"));
                }
            }
            TileOp::AddPtr => {
                let (a, b) = (need(a)?, need(b)?);
                none(c)?;
                slot_used = true;
                if !a.same(&r) || dtype != TileType::Ptr || !matches!(b.dtype, TileType::I32 | TileType::I64) || b.rank != rank || b.shape != r.shape {
                    return Err(err("addptr types or shapes"));
                }
            }
            TileOp::Load => {
                let a = need(a)?;
                none(d)?;
                if a.dtype != TileType::Ptr || a.rank != rank || a.shape != r.shape || ins.dtype != h.buf_types[a.slot as usize] {
                    return Err(err("load pointer, type or shape"));
                }
                if let Some(m) = b {
                    if m.dtype != TileType::I1 || m.rank != rank || m.shape != r.shape {
                        return Err(err("load mask type or shape"));
                    }
                }
                if let Some(o) = c {
                    if !o.same(&r) {
                        return Err(err("load fill value type or shape"));
                    }
                }
                info.loads |= 1 << a.slot;
            }
            TileOp::Store => {
                let (a, v) = (need(a)?, need(b)?);
                none(d)?;
                if dtype != TileType::None || rank != 0 {
                    return Err(err("store has no result"));
                }
                if a.dtype != TileType::Ptr || v.dtype as u8 != h.buf_types[a.slot as usize] || v.rank != a.rank || v.shape != a.shape {
                    return Err(err("store pointer, value type or shape"));
                }
                if let Some(m) = c {
                    if m.dtype != TileType::I1 || m.rank != a.rank || m.shape != a.shape {
                        return Err(err("store mask type or shape"));
                    }
                }
                info.stores |= 1 << a.slot;
            }
            TileOp::Dot => {
                let (a, b) = (need(a)?, need(b)?);
                none(d)?;
                let f = |t: &RegType| t.dtype == TileType::F32 && t.rank == 2;
                if dtype != TileType::F32 || rank != 2 || !f(&a) || !f(&b) {
                    return Err(err("dot operands must be rank-2 f32"));
                }
                let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
                if b.shape[0] != k || r.shape[0] != m || r.shape[1] != n {
                    return Err(err("dot shapes"));
                }
                if let Some(c) = c {
                    if !c.same(&r) {
                        return Err(err("dot accumulator type or shape"));
                    }
                }
                info.work += 2 * m as u64 * n as u64 * k as u64;
            }
            TileOp::Reduce => {
                let a = need(a)?;
                none(b)?;
                kind_used = true;
                axis_used = true;
                let ax = ins.axis as usize;
                if ax >= a.rank || rank + 1 != a.rank || dtype != a.dtype || !TileReduce::from_u8(ins.kind).is_some_and(|k| k.accepts(dtype)) {
                    return Err(err("reduce axis, kind or type"));
                }
                let kept = a.dims().iter().enumerate().filter(|&(k, _)| k != ax).map(|(_, &d)| d);
                if !kept.eq(r.dims().iter().copied()) {
                    return Err(err("reduce shape"));
                }
            }
        }
        // Pointer results carry the buffer slot; nothing else does.
        if dtype == TileType::Ptr {
            if ins.slot as u32 >= h.nbufs {
                return Err(err("pointer slot"));
            }
        } else if !slot_used && ins.slot != 0 {
            return Err(err("slot of a non-pointer"));
        }
        if (!kind_used && ins.kind != 0) || (!axis_used && ins.axis != 0) || (!imm_used && ins.imm != 0) {
            return Err(err("unused field not 0"));
        }
        if matches!(op, TileOp::Const | TileOp::Param | TileOp::Buffer | TileOp::ProgramId | TileOp::NumPrograms | TileOp::Range) {
            if ins.b != NO_OPERAND || ins.c != NO_OPERAND || ins.d != NO_OPERAND {
                return Err(err("unexpected operand"));
            }
        } else if !matches!(op, TileOp::Select | TileOp::Fma | TileOp::Load | TileOp::Store | TileOp::Dot) && (ins.c != NO_OPERAND || ins.d != NO_OPERAND) {
            return Err(err("unexpected operand"));
        }
        total += vol;
        if total > MAX_TILE_PROGRAM_ELEMS {
            return Err(err("program's tiles exceed 2^24 elements"));
        }
    }
    info.work += total;
    Ok(info)
}

/// The work of a launch: `work` per instance times the grid (`None` above
/// u64).
pub fn launch_work(info: &TileInfo, grid: [u32; 3]) -> Option<u64> {
    let g = (grid[0] as u64).checked_mul(grid[1] as u64)?.checked_mul(grid[2] as u64)?;
    info.work.checked_mul(g)
}

/// Encode a program: header fields `nbufs`, `nparams`, `buf_types`,
/// `param_types` from `header`, the rest filled in.
pub fn encode_program(header: &TileProgramHeader, instrs: &[TileInstr], out: &mut [u8]) -> Option<()> {
    let mut h = *header;
    h.magic = TILE_MAGIC;
    h.version = TILE_VERSION;
    h.ninstr = u32::try_from(instrs.len()).ok()?;
    h.write_to(out)?;
    for (i, ins) in instrs.iter().enumerate() {
        ins.write_to(out.get_mut(TileProgramHeader::SIZE + i * TileInstr::SIZE..)?)?;
    }
    Some(())
}

/// Bytes of a program of `n` instructions.
pub const fn program_size(n: usize) -> usize {
    TileProgramHeader::SIZE + TileInstr::SIZE * n
}

#[cfg(test)]
mod tests {
    use super::*;

    use TileInstr as I;
    fn ins(op: TileOp, dtype: TileType, shape: &[u32]) -> TileInstr {
        I::new(op, dtype, shape)
    }

    fn program(nbufs: u32, instrs: &[TileInstr]) -> [u8; 1024] {
        let mut h = TileProgramHeader { nbufs, ..Default::default() };
        for t in &mut h.buf_types[..nbufs as usize] {
            *t = TileType::F32 as u8;
        }
        let mut out = [0u8; 1024];
        encode_program(&h, instrs, &mut out).unwrap();
        out
    }

    /// out[i] = x[i] + 1 over a 4-element tile.
    fn add_one() -> [TileInstr; 8] {
        let mut v = [ins(TileOp::Buffer, TileType::Ptr, &[]); 8];
        v[1].slot = 1;
        v[2] = ins(TileOp::Range, TileType::I32, &[4]);
        v[3] = TileInstr { a: 0, ..ins(TileOp::Splat, TileType::Ptr, &[4]) };
        v[4] = TileInstr { a: 3, b: 2, ..ins(TileOp::AddPtr, TileType::Ptr, &[4]) };
        v[5] = TileInstr { a: 4, ..ins(TileOp::Load, TileType::F32, &[4]) };
        v[6] = TileInstr { a: 5, b: 5, kind: TileBinary::Add as u8, ..ins(TileOp::Binary, TileType::F32, &[4]) };
        v[7] = TileInstr { a: 4, b: 6, ..ins(TileOp::Store, TileType::None, &[]) };
        v
    }

    #[test]
    fn verify_accepts_a_program_and_reports_its_buffers() {
        let v = add_one();
        let bytes = program(2, &v);
        let info = verify(&bytes[..program_size(v.len())]).unwrap();
        assert_eq!((info.loads, info.stores), (1, 1));
        // Result elements: 1 + 1 + 4 + 4 + 4 + 4 + 4, and the store's
        // rank-0 "result" counts as 1.
        assert_eq!(info.work, 23);
    }

    #[test]
    fn verify_refuses_each_broken_rule() {
        let good = add_one();
        let mut cases: [(usize, TileInstr, &str); 8] = [(0, good[0], ""); 8];
        cases[0] = (6, TileInstr { kind: TileBinary::And as u8, ..good[6] }, "kind or type");
        cases[1] = (5, TileInstr { a: 6, ..good[5] }, "operand is not an earlier instruction");
        cases[2] = (4, TileInstr { slot: 3, ..good[4] }, "addptr types or shapes");
        cases[3] = (2, TileInstr { shape: [0, 0, 0, 0], ..good[2] }, "shape: dims must be >= 1 up to the rank and 0 after");
        cases[4] = (6, TileInstr { b: 7, ..good[6] }, "operand is not an earlier instruction");
        cases[5] = (7, TileInstr { c: 6, ..good[7] }, "store mask type or shape");
        cases[6] = (3, TileInstr { op: 99, ..good[3] }, "unknown op");
        cases[7] = (2, TileInstr { imm: 1 << 40, ..good[2] }, "range type, rank or start");
        for (at, bad, what) in cases {
            let mut v = good;
            v[at] = bad;
            let bytes = program(2, &v);
            assert_eq!(verify(&bytes[..program_size(v.len())]), Err(TileError { instr: at as u32, what }), "case at {at}");
        }
        // A store into a value with no result, a truncated program.
        let bytes = program(2, &good);
        assert!(verify(&bytes[..program_size(good.len()) - 1]).is_err());
        assert_eq!(verify(&bytes[..10]).unwrap_err().what, "shorter than its header");
    }
}
