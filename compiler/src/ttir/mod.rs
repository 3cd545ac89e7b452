//! Triton IR (TTIR) front end, first part: the parser.
//!
//! Triton's frontend and its TTIR pass list (inliner, canonicalizer,
//! combine, CSE, loop unrolling) print a `@triton.jit` kernel as MLIR text
//! in the `tt`, `arith`, `math` and `scf` dialects
//! (`tests/triton/kernels.py` makes them; `../shared/notes/triton.md`).
//! [`parse`] reads that text, one op per line, into a [`Module`]: every op
//! with its SSA results and operands, its attributes, its types and, for
//! the generic-form `"tt.reduce"`, its combiner region. It checks the
//! syntax only; which ops and types the NPU runs is the lowering's
//! business. Anything it cannot read is a [`TtirError`] naming the line,
//! and so is control flow it refuses on purpose: `scf.for` (what
//! `tl.range` makes; `tl.static_range` loops arrive unrolled), `scf.if`,
//! `scf.while`, calls to other functions.
//!
//! The grammar accepted, per line (MLIR's custom assembly of these ops):
//!
//! ```text
//! module {                                      (optionally with attributes)
//!   tt.func [public|private] @name(%arg0: TYPE [{attrs}], ...) [attributes {...}] {
//!     [%r[, %r...] =] DIALECT.OP [KEYWORD] [OPERANDS] [{attrs}] [: TYPES]
//!     %r = "tt.reduce"(%x) <{axis = N : i32}> ({
//!     ^bb0(%a: T, %b: T):
//!       ...
//!       tt.reduce.return %v : T
//!     }) : (TYPES) -> TYPES
//!     tt.return
//!   }
//! }
//! ```
//!
//! Types: `i1`, `i8`, `i16`, `i32`, `i64`, `f16`, `bf16`, `f32`, `f64`,
//! `!tt.ptr<T>` and `tensor<D0xD1x...xT>` (static dims).

mod launch;
mod lower;
mod parse;

pub use launch::{add_launch, dtype_of, kernel_graph, BufBind, Binding, LaunchArg, Scalar};
pub use lower::{lower, Kernel, KernelArg};
pub use parse::parse;

/// An element or value type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Type {
    /// Integer of this many bits (`i1` is a boolean).
    Int(u32),
    /// IEEE float of this many bits (`bf16` is `BFloat`).
    Float(u32),
    BFloat,
    /// A pointer to elements of the type.
    Ptr(Box<Type>),
    /// A static-shape tensor.
    Tensor(Vec<u64>, Box<Type>),
}

impl Type {
    /// The element type (itself for a scalar).
    pub fn elem(&self) -> &Type {
        match self {
            Type::Tensor(_, e) => e,
            t => t,
        }
    }
    /// The shape (empty for a scalar).
    pub fn shape(&self) -> &[u64] {
        match self {
            Type::Tensor(s, _) => s,
            _ => &[],
        }
    }
}

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// `N : iK`, or a bare integer.
    Int(i64),
    /// A float literal (decimal or MLIR's hex bit pattern).
    Float(f64),
    Bool(bool),
    Str(String),
    /// `dense<V>`: one value splatted over a tensor (the only dense form
    /// Triton prints for its constants).
    Splat(Box<Attr>),
    /// Anything else, kept as its text.
    Other(String),
}

/// One operation.
#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    /// 1-based line in the source text.
    pub line: usize,
    /// `tt.load`, `arith.addf`, `tt.reduce`, ...
    pub name: String,
    /// SSA names bound by the op (`%4`, `%cst_0`), in order.
    pub results: Vec<String>,
    /// SSA names read, in order.
    pub operands: Vec<String>,
    /// A bare word the op's syntax carries: `tt.get_program_id x`,
    /// `arith.cmpi slt`.
    pub keyword: Option<String>,
    /// The value of `arith.constant`.
    pub value: Option<Attr>,
    /// Attributes (`{axis = 1 : i32}`, `<{axis = 0 : i32}>`).
    pub attrs: Vec<(String, Attr)>,
    /// The types after `:`, operands' then results' where the syntax lists
    /// both (`(A) -> R`, `A * B -> R`, `A to R`, `A -> R`); for the short
    /// forms (`: T`, `: A, B`) as written.
    pub types: Vec<Type>,
    /// The combiner region of a `tt.reduce`.
    pub region: Option<Region>,
}

impl Op {
    /// An attribute by name.
    pub fn attr(&self, name: &str) -> Option<&Attr> {
        self.attrs.iter().find(|(n, _)| n == name).map(|(_, a)| a)
    }
}

/// A region with one block: its arguments and ops.
#[derive(Clone, Debug, PartialEq)]
pub struct Region {
    pub args: Vec<(String, Type)>,
    pub ops: Vec<Op>,
}

/// A `tt.func`.
#[derive(Clone, Debug, PartialEq)]
pub struct Func {
    pub line: usize,
    pub name: String,
    pub args: Vec<(String, Type)>,
    pub ops: Vec<Op>,
}

/// A parsed TTIR module.
#[derive(Clone, Debug, PartialEq)]
pub struct Module {
    pub funcs: Vec<Func>,
    /// The kernel source line (`file.py:N`, the file's base name) of each
    /// TTIR line that carries a location (`.str()` rather than
    /// `.str_nodebug()` output).
    pub sources: std::collections::BTreeMap<usize, String>,
}

/// Why a TTIR text was refused: its 1-based line, the kernel's source
/// line it came from (`kernels.py:121`, when the TTIR carries locations)
/// and the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct TtirError {
    pub line: usize,
    pub kernel_line: Option<String>,
    pub msg: String,
}

impl std::fmt::Display for TtirError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kernel_line {
            Some(s) => write!(f, "TTIR line {} ({s}): {}", self.line, self.msg),
            None => write!(f, "TTIR line {}: {}", self.line, self.msg),
        }
    }
}

impl TtirError {
    /// The error with the source line of its TTIR line, if known.
    pub(crate) fn located(mut self, sources: &std::collections::BTreeMap<usize, String>) -> Self {
        if self.kernel_line.is_none() {
            self.kernel_line = sources.get(&self.line).cloned();
        }
        self
    }
}

#[cfg(test)]
mod tests;
