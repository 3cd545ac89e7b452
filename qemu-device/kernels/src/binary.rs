//! Element-wise binary operations with numpy-style broadcasting.

use crate::activation::{epilogue, Activation, Bias, EPI_BLOCK};
use crate::error::{KernelError, Result};
use crate::util::{check_len, check_rank, elementwise_chunk, stream_fence, stream_zip, volume, STREAM_MIN_BYTES};
use crate::{Shape, MAX_RANK};
use rayon::prelude::*;

/// Element-wise binary operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// IEEE division (`x/0` is `±inf` or `NaN`).
    Div,
    /// `f32::max` (a NaN operand yields the other operand).
    Max,
    /// `f32::min` (a NaN operand yields the other operand).
    Min,
    /// `f32::powf`.
    Pow,
    /// `1.0` where `a == b`, else `0.0` (IEEE: NaN equals nothing, `-0.0`
    /// equals `0.0`).
    Equal,
    /// `1.0` where `a < b`, else `0.0` (false if either is NaN).
    Less,
    /// `1.0` where `a > b`, else `0.0` (false if either is NaN).
    Greater,
    /// `1.0` where `a <= b`, else `0.0` (false if either is NaN).
    LessOrEqual,
    /// `1.0` where `a >= b`, else `0.0` (false if either is NaN).
    GreaterOrEqual,
    /// `a - b·floor(a/b)`, exactly: the remainder with the divisor's sign
    /// (Python's `%`; NaN for `b = 0`).
    Mod,
    /// `a - b·trunc(a/b)`, exactly: the remainder with the dividend's sign
    /// (C `fmod`; NaN for `b = 0`).
    FMod,
}

/// Python's `%` on floats: C's exact `fmod`, moved into the divisor's sign.
#[inline]
pub fn floor_mod(a: f32, b: f32) -> f32 {
    let r = a % b;
    if r != 0.0 && (r < 0.0) != (b < 0.0) {
        r + b
    } else {
        r
    }
}

/// The numpy broadcast of two shapes (right-aligned; each dimension pair
/// must be equal or contain a 1). Ranks up to [`MAX_RANK`].
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Result<Shape> {
    check_rank("binary lhs shape", a)?;
    check_rank("binary rhs shape", b)?;
    let rank = a.len().max(b.len());
    let mut out = Shape::from_elem(0, rank);
    for i in 0..rank {
        let da = if i < rank - a.len() { 1 } else { a[i - (rank - a.len())] };
        let db = if i < rank - b.len() { 1 } else { b[i - (rank - b.len())] };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(KernelError::Broadcast {
                a: a.to_vec(),
                b: b.to_vec(),
            });
        };
    }
    Ok(out)
}

/// `out = op(a, b)` with broadcasting; `out` has the element count of
/// [`broadcast_shape`]`(a_shape, b_shape)` (row-major). Parallel.
pub fn binary(op: BinaryOp, a: &[f32], a_shape: &[usize], b: &[f32], b_shape: &[usize], out: &mut [f32]) -> Result<()> {
    binary_act(op, a, a_shape, b, b_shape, Activation::None, out)
}

/// `out = act(op(a, b))` with broadcasting, in one pass (e.g. Add + Relu of
/// a residual block, Mul + Clip); otherwise as [`binary`].
pub fn binary_act(
    op: BinaryOp,
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
    act: Activation,
    out: &mut [f32],
) -> Result<()> {
    let out_shape = broadcast_shape(a_shape, b_shape)?;
    let out_len = volume("binary output", &out_shape)?;
    check_len("binary lhs", a.len(), volume("binary lhs", a_shape)?)?;
    check_len("binary rhs", b.len(), volume("binary rhs", b_shape)?)?;
    check_len("binary output", out.len(), out_len)?;
    if out.is_empty() {
        return Ok(());
    }
    // Non-empty output: every dimension is ≥ 1, so the operands' volumes
    // (validated above) bound all strides.
    let g = Geom::new([a_shape, b_shape], &out_shape);
    // Streaming stores for outputs too large to stay in cache, written in
    // long contiguous runs (each ends with a fence), when the activation
    // is a clamp applied on the way.
    let bytes = 4 * (a.len() + b.len() + out.len());
    let [sa, sb] = g.dims[0].s;
    let stream = match act.as_clamp() {
        (clamp, Activation::None) if bytes >= STREAM_MIN_BYTES && g.dims[0].size >= 4 * EPI_BLOCK && sa + sb > 0 => Some(clamp),
        _ => None,
    };
    with_op(op, (b.len() == 1).then(|| b[0]), Run { a, b, g: &g, act, stream, out });
    Ok(())
}

/// One coalesced dimension: its size and the element stride of each of
/// the `N` operands along it (0 where the operand is broadcast).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dim<const N: usize> {
    pub(crate) size: usize,
    pub(crate) s: [usize; N],
}

/// Coalesced broadcast geometry of `N` operands against one output:
/// `dims[0]` is innermost. The innermost strides are 0 or 1.
pub(crate) struct Geom<const N: usize> {
    pub(crate) dims: smallvec::SmallVec<[Dim<N>; MAX_RANK]>,
}

impl<const N: usize> Geom<N> {
    /// Callers guarantee that every shape broadcasts to `out_shape` (rank
    /// at most `out_shape.len()`), that the output is non-empty and that
    /// each operand's volume fits a `usize` (so no stride overflows).
    pub(crate) fn new(shapes: [&[usize]; N], out_shape: &[usize]) -> Geom<N> {
        // Strides of each operand aligned to the output's dims (0 where
        // broadcast).
        let rank = out_shape.len();
        let mut strides = [[0usize; MAX_RANK]; N];
        let mut stride = [1usize; N];
        for i in (0..rank).rev() {
            for (k, sh) in shapes.iter().enumerate() {
                let d = if i + sh.len() >= rank { sh[i + sh.len() - rank] } else { 1 };
                strides[k][i] = if d == 1 { 0 } else { stride[k] };
                // Cannot overflow: the output is non-empty, so the products
                // are bounded by the validated operand volumes.
                stride[k] *= d;
            }
        }
        Self::with_strides(strides.each_ref().map(|s| &s[..rank]), out_shape)
    }

    /// Geometry of operands with explicit element strides per output dim
    /// (0 broadcasts), coalesced from the innermost dimension outwards.
    /// Callers guarantee a non-empty output and that every operand's
    /// farthest element, `Σ (dim - 1)·stride`, fits its slice.
    pub(crate) fn with_strides(strides: [&[usize]; N], out_shape: &[usize]) -> Geom<N> {
        let mut dims: smallvec::SmallVec<[Dim<N>; MAX_RANK]> = smallvec::SmallVec::new();
        for i in (0..out_shape.len()).rev() {
            let size = out_shape[i];
            if size == 1 {
                continue;
            }
            let s = strides.map(|st| st[i]);
            match dims.last_mut() {
                Some(last) if (0..N).all(|k| s[k] == last.s[k] * last.size) => last.size *= size,
                _ => dims.push(Dim { size, s }),
            }
        }
        if dims.is_empty() {
            dims.push(Dim { size: 1, s: [0; N] });
        }
        Geom { dims }
    }
}

/// The operand offsets of consecutive rows over a geometry's outer dims:
/// the multi-index of the current row (innermost first), advanced like an
/// odometer, and each operand's offset for it.
struct Odometer<'g, const N: usize> {
    outer: &'g [Dim<N>],
    idx: [usize; MAX_RANK],
    off: [usize; N],
}

impl<'g, const N: usize> Odometer<'g, N> {
    /// At row `row` (counted over the outer dims).
    #[inline(always)]
    fn at(outer: &'g [Dim<N>], row: usize) -> Self {
        let (mut idx, mut off, mut rest) = ([0usize; MAX_RANK], [0usize; N], row);
        for (k, d) in outer.iter().enumerate() {
            idx[k] = rest % d.size;
            rest /= d.size;
            for (o, s) in off.iter_mut().zip(d.s) {
                *o += idx[k] * s;
            }
        }
        Odometer { outer, idx, off }
    }

    /// On to the next row.
    #[inline(always)]
    fn advance(&mut self) {
        for (k, d) in self.outer.iter().enumerate() {
            self.idx[k] += 1;
            for (o, s) in self.off.iter_mut().zip(d.s) {
                *o += s;
            }
            if self.idx[k] < d.size {
                break;
            }
            self.idx[k] = 0;
            for (o, s) in self.off.iter_mut().zip(d.s) {
                *o -= d.size * s;
            }
        }
    }
}

/// Most rows [`drive_rows`] hands over in one call.
pub(crate) const MAX_BATCH_ROWS: usize = 64;

/// As [`drive`] for an output with outer dims, but hands over up to
/// `per` (≤ [`MAX_BATCH_ROWS`]) consecutive rows at once: `rows(offsets,
/// out_block)` gets each row's operand offsets and the block of those
/// rows (contiguous in the output). For short rows (a small feature map
/// broadcast against per-channel values) the per-call work is then
/// spread over many elements.
pub(crate) fn drive_rows<const N: usize, F>(g: &Geom<N>, out: &mut [f32], per: usize, rows: F)
where
    F: Fn(&[[usize; N]], &mut [f32]) + Sync,
{
    if out.is_empty() {
        return;
    }
    let inner = g.dims[0];
    let per = per.clamp(1, MAX_BATCH_ROWS);
    let chunk = elementwise_chunk(out.len());
    // Tasks of whole row batches.
    let task_rows = (chunk / inner.size).max(1).div_ceil(per) * per;
    let body = |t: usize, chunk: &mut [f32]| {
        let mut od = Odometer::at(&g.dims[1..], t * task_rows);
        let mut batch = [[0usize; N]; MAX_BATCH_ROWS];
        for block in chunk.chunks_mut(per * inner.size) {
            let n = block.len() / inner.size;
            for b in batch.iter_mut().take(n) {
                *b = od.off;
                od.advance();
            }
            rows(&batch[..n], block);
        }
    };
    let task = task_rows * inner.size;
    if task >= out.len() {
        body(0, out);
    } else {
        out.par_chunks_mut(task).enumerate().for_each(|(t, c)| body(t, c));
    }
}

/// Runs `row(offsets, out_segment)` over the whole output, in parallel
/// for large outputs: each call covers a run of consecutive output
/// elements along the innermost coalesced dim, whose operand elements
/// start at `offsets` and advance by `g.dims[0].s`.
#[inline(always)]
pub(crate) fn drive<const N: usize, F>(g: &Geom<N>, out: &mut [f32], row: F)
where
    F: Fn([usize; N], &mut [f32]) + Sync,
{
    if out.is_empty() {
        return;
    }
    let inner = g.dims[0];
    let outer = &g.dims[1..];
    let chunk = elementwise_chunk(out.len());
    if outer.is_empty() {
        let body = |t: usize, o: &mut [f32]| {
            let j0 = t * chunk;
            row(inner.s.map(|s| j0 * s), o);
        };
        if chunk >= out.len() {
            body(0, out);
        } else {
            out.par_chunks_mut(chunk).enumerate().for_each(|(t, o)| body(t, o));
        }
        return;
    }
    let rows = (chunk / inner.size).max(1);
    let body = |t: usize, chunk: &mut [f32]| {
        let mut od = Odometer::at(outer, t * rows);
        for o in chunk.chunks_exact_mut(inner.size) {
            row(od.off, o);
            od.advance();
        }
    };
    let task = rows * inner.size;
    if task >= out.len() {
        body(0, out);
    } else {
        out.par_chunks_mut(task).enumerate().for_each(|(t, c)| body(t, c));
    }
}

/// Row kernel: `out[j] = f(a[j·sa], b[j·sb])` with sa, sb ∈ {0, 1}.
#[inline(always)]
fn row<F: Fn(f32, f32) -> f32>(f: &F, a: &[f32], sa: usize, b: &[f32], sb: usize, out: &mut [f32]) {
    let n = out.len();
    match (sa, sb) {
        (1, 1) => {
            for ((o, &x), &y) in out.iter_mut().zip(&a[..n]).zip(&b[..n]) {
                *o = f(x, y);
            }
        }
        (1, _) => {
            let y = b[0];
            for (o, &x) in out.iter_mut().zip(&a[..n]) {
                *o = f(x, y);
            }
        }
        (_, 1) => {
            let x = a[0];
            for (o, &y) in out.iter_mut().zip(&b[..n]) {
                *o = f(x, y);
            }
        }
        _ => out.fill(f(a[0], b[0])),
    }
}

/// [`row`] followed by `act`, block by block so that the activation reads
/// the block from L1; or, with `stream = Some(clamp)` (the activation
/// nothing or a clamp), in one pass with streaming stores.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn row_act<F: Fn(f32, f32) -> f32>(f: &F, a: &[f32], sa: usize, b: &[f32], sb: usize, act: Activation, stream: Option<Option<(f32, f32)>>, out: &mut [f32]) {
    match stream {
        // The clamp as the epilogue applies it (ReLU's `max` maps NaN to 0).
        Some(Some((lo, hi))) => row_stream(&|x, y| f(x, y).max(lo).min(hi), a, sa, b, sb, out),
        Some(None) => row_stream(f, a, sa, b, sb, out),
        None => row_blocks(f, a, sa, b, sb, act, out),
    }
}

/// [`row`] with streaming stores (`sa + sb > 0`).
#[inline(always)]
fn row_stream<F: Fn(f32, f32) -> f32>(f: &F, a: &[f32], sa: usize, b: &[f32], sb: usize, out: &mut [f32]) {
    match (sa, sb) {
        (1, 1) => stream_zip(out, a, b, f),
        (1, _) => {
            let y = b[0];
            stream_zip(out, a, a, |x, _| f(x, y));
        }
        _ => {
            let x = a[0];
            stream_zip(out, b, b, |_, y| f(x, y));
        }
    }
    stream_fence();
}

/// [`row`] followed by `act`, block by block.
#[inline(always)]
fn row_blocks<F: Fn(f32, f32) -> f32>(f: &F, a: &[f32], sa: usize, b: &[f32], sb: usize, act: Activation, out: &mut [f32]) {
    if act == Activation::None {
        row(f, a, sa, b, sb, out);
        return;
    }
    for (i, blk) in out.chunks_mut(EPI_BLOCK).enumerate() {
        let j0 = i * EPI_BLOCK;
        row(f, &a[j0 * sa..], sa, &b[j0 * sb..], sb, blk);
        epilogue(blk, Bias::None, None, act);
    }
}

/// Something to run with an op's element function ([`with_op`]).
pub(crate) trait WithOp {
    fn run<F: Fn(f32, f32) -> f32 + Sync + Copy>(self, f: F);
}

/// Runs `k` with what `op` computes on one pair of elements: the one
/// definition of every binary op, shared by BINARY and ELTWISE (so a fused
/// chain gives exactly the separate ops' results). `b_scalar`: the right
/// operand when it is one value for the whole op.
#[inline(always)]
pub(crate) fn with_op(op: BinaryOp, b_scalar: Option<f32>, k: impl WithOp) {
    match op {
        BinaryOp::Add => k.run(|x, y| x + y),
        BinaryOp::Sub => k.run(|x, y| x - y),
        BinaryOp::Mul => k.run(|x, y| x * y),
        BinaryOp::Div => k.run(|x, y| x / y),
        BinaryOp::Max => k.run(f32::max),
        BinaryOp::Min => k.run(f32::min),
        // A constant small integer exponent (x^2 and x^3 of variance and
        // tanh-GELU) multiplies: powf per element is ~20x slower.
        BinaryOp::Pow if b_scalar == Some(2.0) => k.run(|x, _| x * x),
        BinaryOp::Pow if b_scalar == Some(3.0) => k.run(|x, _| x * x * x),
        BinaryOp::Pow => k.run(f32::powf),
        // IEEE comparisons: false whenever an operand is NaN; -0 == +0.
        BinaryOp::Equal => k.run(|x, y| mask(x == y)),
        BinaryOp::Less => k.run(|x, y| mask(x < y)),
        BinaryOp::Greater => k.run(|x, y| mask(x > y)),
        BinaryOp::LessOrEqual => k.run(|x, y| mask(x <= y)),
        BinaryOp::GreaterOrEqual => k.run(|x, y| mask(x >= y)),
        BinaryOp::Mod => k.run(floor_mod),
        BinaryOp::FMod => k.run(|x, y| x % y),
    }
}

/// A broadcast binary op over the whole output, in parallel.
struct Run<'a> {
    a: &'a [f32],
    b: &'a [f32],
    g: &'a Geom<2>,
    act: Activation,
    /// Streaming stores, with the activation's clamp if it has one.
    stream: Option<Option<(f32, f32)>>,
    out: &'a mut [f32],
}

impl WithOp for Run<'_> {
    fn run<F: Fn(f32, f32) -> f32 + Sync + Copy>(self, f: F) {
        let Run { a, b, g, act, stream, out } = self;
        let [sa, sb] = g.dims[0].s;
        drive(g, out, |[oa, ob], o| row_act(&f, &a[oa..], sa, &b[ob..], sb, act, stream, o));
    }
}

/// 1.0 where `holds`, else 0.0 (a select the compiler vectorizes).
#[inline(always)]
fn mask(holds: bool) -> f32 {
    if holds {
        1.0
    } else {
        0.0
    }
}
