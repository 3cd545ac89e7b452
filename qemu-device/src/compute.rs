//! Compute cores: decode a descriptor, check every shape against the
//! sizes, read the operands through the context's MMU, run the kernel,
//! write the result back.
//!
//! Any inconsistency is a `BadDescriptor` fault at the descriptor's VA;
//! operands are read (and translated) before anything is computed, and the
//! output range is checked before it is written, so a faulting op leaves
//! its output untouched. Run-time values are checked before the output is
//! written too (a GATHER index outside its axis is an `IndexOutOfRange`
//! fault at that index's VA).
//!
//! Tensors are f32 except for CAST, whose operands may also be i32, i64 or
//! bool (bytes): the operand machinery is generic over [`Elem`].

use std::borrow::Cow;

use smallvec::SmallVec;

use rbln_hw::ops::{self, Binary, Desc, Unary};
use rbln_hw::ring::{Access, FaultCode};
use rbln_kernels as k;

use crate::mmu::{AddressSpace, Fault, Piece, Pinned, Span};

pub use rbln_hw::ops::MAX_DESC_SIZE;
/// Largest tensor one operand may have (elements): bounds the memory a
/// hostile descriptor can make the device allocate.
const MAX_TENSOR_ELEMS: u64 = 256 << 20;
/// Most work one descriptor may ask for (nominal FLOPs): bounds the time a
/// hostile descriptor can occupy a compute core, and so how long a queue
/// reset can take to complete (~1.5 s at this machine's GEMM speed).
const MAX_FLOPS: u64 = 1 << 38;
/// Operands one op may hold in place at once (more are staged).
const MAX_CLAIMS: usize = 8;

/// One op's operands, resolved in place.
///
/// Every operand range is translated and permission-checked as a whole
/// (`Pinned::resolve`) before the kernel runs. Operands that are
/// physically contiguous (anything inside one DRAM buffer object) are used
/// where they lie, as slices of device memory; scattered ones (host pages)
/// are gathered into a staging vector, and an output that is scattered or
/// overlaps another operand of the op is computed into staging and copied
/// out afterwards. Rust slices handed to a kernel therefore never alias a
/// mutable one.
struct Op<'p, 's, 'a> {
    mem: &'p Pinned<'s, 'a>,
    desc_va: u64,
    /// Byte ranges lent out as slices: (start, end, writable).
    claims: [(usize, usize, bool); MAX_CLAIMS],
    nclaims: usize,
}

/// An element type of a tensor operand.
///
/// # Safety
/// Implementors are plain numbers: no padding, and every bit pattern of
/// `size_of::<Self>()` bytes is a valid value (operand memory holds
/// whatever the guest put there).
unsafe trait Elem: Copy + Default + 'static {}
// SAFETY: IEEE binary32; every bit pattern is some f32 (NaNs included).
unsafe impl Elem for f32 {}
// SAFETY: two's-complement integers without padding or invalid values.
unsafe impl Elem for i32 {}
// SAFETY: as for i32.
unsafe impl Elem for i64 {}
// SAFETY: as for i32 (a TILE buffer's f32 bits or i32, staged).
unsafe impl Elem for u32 {}
// SAFETY: as for i32 (CAST's bool elements are raw bytes).
unsafe impl Elem for u8 {}

/// Where a kernel writes an output: device memory itself, or staging that
/// [`Out::commit`] copies out.
enum Out<'p, T: Elem = f32> {
    Direct(&'p mut [T]),
    Staged(Vec<T>, Span),
}

impl<T: Elem> Out<'_, T> {
    fn buf(&mut self) -> &mut [T] {
        match self {
            Out::Direct(s) => s,
            Out::Staged(v, _) => v,
        }
    }

    fn commit(self) {
        if let Out::Staged(v, span) = self {
            scatter(&v, &span);
        }
    }
}

/// Copy `data` into the pieces of `span` (same total length in bytes).
fn scatter<T: Elem>(data: &[T], span: &Span) {
    let mut src = data.as_ptr().cast::<u8>();
    for p in span.pieces() {
        // SAFETY: `p` is a resolved, writable range of device memory that
        // stays mapped while the op's `Pinned` lives; `data` covers the
        // span's total length (the caller sized it so), and a Rust vector
        // never overlaps device memory.
        unsafe {
            rbln_kernels::copy_bytes(src, p.ptr, p.len);
            src = src.add(p.len);
        }
    }
}

/// Gather the pieces of `span` into `dst` (of the span's total length).
fn gather_into(span: &Span, dst: &mut [u8]) {
    let mut off = 0;
    for p in span.pieces() {
        // SAFETY: `p` is resolved readable device memory (alive while the
        // op's `Pinned` lives); the pieces add up to `dst.len()` bytes.
        unsafe { rbln_kernels::copy_bytes(p.ptr, dst[off..off + p.len].as_mut_ptr(), p.len) };
        off += p.len;
    }
}

/// Gather the pieces of `span` into a new vector of `count` elements (the
/// span is `count` elements long).
fn gather_span<T: Elem>(span: &Span, count: usize) -> Vec<T> {
    let mut v = vec![T::default(); count];
    let len = std::mem::size_of_val(v.as_slice());
    // SAFETY: any byte pattern is a valid `T` (`Elem`); the byte view
    // covers exactly the vector's elements and nothing else borrows it.
    let bytes = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), len) };
    gather_into(span, bytes);
    v
}

type R<T> = Result<T, Fault>;

impl<'p> Op<'p, '_, '_> {
    fn bad(&self) -> Fault {
        Fault::new(FaultCode::BadDescriptor, Access::Read, self.desc_va)
    }

    fn kernel<T>(&self, r: k::Result<T>) -> R<T> {
        r.map_err(|e| {
            log::debug!("descriptor at {:#x}: {e}", self.desc_va);
            self.bad()
        })
    }

    /// Element count from dims, checked and bounded.
    fn volume(&self, dims: &[usize]) -> R<usize> {
        let mut v: u64 = 1;
        for &d in dims {
            v = v.checked_mul(d as u64).ok_or_else(|| self.bad())?;
        }
        if v > MAX_TENSOR_ELEMS {
            return Err(self.bad());
        }
        Ok(v as usize)
    }

    /// Translate `count` elements of `T` at `va` (aligned to the element
    /// size, else an Alignment fault at `va`). `count` is bounded by
    /// `MAX_TENSOR_ELEMS`, so the byte length cannot overflow.
    fn resolve<T: Elem>(&self, va: u64, count: usize, access: Access) -> R<Span> {
        let size = std::mem::size_of::<T>() as u64;
        if !va.is_multiple_of(size) {
            return Err(Fault::new(FaultCode::Alignment, access, va));
        }
        self.mem.resolve(va, count as u64 * size, access)
    }

    /// Whether [start, end) may be lent out: no overlap with a writable
    /// claim (or, for a writable claim, with any claim), and room left.
    fn claim(&mut self, piece: Piece, write: bool) -> bool {
        let (start, end) = (piece.ptr as usize, piece.ptr as usize + piece.len);
        let clash = self.claims[..self.nclaims].iter().any(|&(s, e, w)| (w || write) && start < e && s < end);
        if clash || self.nclaims == MAX_CLAIMS {
            return false;
        }
        self.claims[self.nclaims] = (start, end, write);
        self.nclaims += 1;
        true
    }

    /// `count` f32 values at `va`, in place when possible.
    fn input(&mut self, va: u64, count: usize) -> R<Cow<'p, [f32]>> {
        self.input_of(va, count)
    }

    /// `count` elements of `T` at `va`, in place when possible.
    fn input_of<T: Elem>(&mut self, va: u64, count: usize) -> R<Cow<'p, [T]>> {
        let span = self.resolve::<T>(va, count, Access::Read)?;
        if let Some(p) = span.contiguous() {
            // The VA is element aligned and VA and page offsets agree, so
            // the pointer is too; checked anyway (staging is the fallback).
            if p.ptr.cast::<T>().is_aligned() && self.claim(p, false) {
                // SAFETY: `p` is `count * size_of::<T>()` readable bytes of
                // device memory, aligned for `T` (checked), kept mapped and
                // translated while `self.mem` ('p) lives; any bit pattern
                // is a valid `T` (`Elem`). No `&mut` slice overlaps it
                // (claims). The guest may write it concurrently, as it may
                // under real DMA: values are then unspecified, but the
                // kernels only compute with them (sizes and indices never
                // come from operand memory).
                return Ok(Cow::Borrowed(unsafe { std::slice::from_raw_parts(p.ptr.cast::<T>(), count) }));
            }
        }
        Ok(Cow::Owned(gather_span(&span, count)))
    }

    /// Output of `count` f32 values at `va`. `preserve`: the kernel reads
    /// or skips some of the old contents, so staging starts from them.
    fn output(&mut self, va: u64, count: usize, preserve: bool) -> R<Out<'p>> {
        self.output_of(va, count, preserve)
    }

    /// Output of `count` elements of `T` at `va` (see [`Op::output`]).
    fn output_of<T: Elem>(&mut self, va: u64, count: usize, preserve: bool) -> R<Out<'p, T>> {
        let span = self.resolve::<T>(va, count, Access::Write)?;
        if let Some(p) = span.contiguous() {
            if p.ptr.cast::<T>().is_aligned() && self.claim(p, true) {
                // SAFETY: as in `input_of`, and the claim guarantees no
                // other slice of this op overlaps these bytes.
                return Ok(Out::Direct(unsafe { std::slice::from_raw_parts_mut(p.ptr.cast::<T>(), count) }));
            }
        }
        let v = if preserve { gather_span(&span, count) } else { vec![T::default(); count] };
        Ok(Out::Staged(v, span))
    }

    fn flops(&self, parts: &[u64]) -> R<u64> {
        let f = parts.iter().try_fold(1u64, |a, &b| a.checked_mul(b)).ok_or_else(|| self.bad())?;
        if f > MAX_FLOPS {
            return Err(self.bad());
        }
        Ok(f)
    }

    /// Run `f` on an output that is written after every input was read.
    fn write_out(&mut self, va: u64, count: usize, f: impl FnOnce(&mut [f32]) -> k::Result<()>) -> R<()> {
        self.write_out_of(va, count, f)
    }

    /// [`Op::write_out`] for an output of element type `T`.
    fn write_out_of<T: Elem>(&mut self, va: u64, count: usize, f: impl FnOnce(&mut [T]) -> k::Result<()>) -> R<()> {
        let mut out = self.output_of::<T>(va, count, false)?;
        let r = f(out.buf());
        self.kernel(r)?;
        out.commit();
        Ok(())
    }
}

fn dims(d: &[u32], rank: u32) -> k::Shape {
    d[..rank as usize].iter().map(|&x| x as usize).collect()
}

fn activation(code: u32, p0: f32, p1: f32) -> k::Activation {
    match Unary::from_u32(code) {
        Some(Unary::Relu) => k::Activation::Relu,
        Some(Unary::Gelu) => k::Activation::Gelu,
        Some(Unary::GeluTanh) => k::Activation::GeluTanh,
        Some(Unary::Silu) => k::Activation::Silu,
        Some(Unary::Sigmoid) => k::Activation::Sigmoid,
        Some(Unary::Tanh) => k::Activation::Tanh,
        Some(Unary::Clip) => k::Activation::Clip { min: p0, max: p1 },
        Some(Unary::HardSigmoid) => k::Activation::HardSigmoid { alpha: p0, beta: p1 },
        Some(Unary::HardSwish) => k::Activation::HardSwish,
        // Descriptor decoding only lets activation codes through.
        _ => k::Activation::None,
    }
}

fn binary_op(b: Binary) -> k::BinaryOp {
    use k::BinaryOp as B;
    match b {
        Binary::Add => B::Add,
        Binary::Sub => B::Sub,
        Binary::Mul => B::Mul,
        Binary::Div => B::Div,
        Binary::Max => B::Max,
        Binary::Min => B::Min,
        Binary::Pow => B::Pow,
        Binary::Equal => B::Equal,
        Binary::Less => B::Less,
        Binary::Greater => B::Greater,
        Binary::LessOrEqual => B::LessOrEqual,
        Binary::GreaterOrEqual => B::GreaterOrEqual,
        Binary::Mod => B::Mod,
        Binary::FMod => B::FMod,
    }
}

fn unary_op(u: Unary, p0: f32, p1: f32) -> Option<k::UnaryOp> {
    use k::UnaryOp as U;
    Some(match u {
        Unary::None => return None,
        Unary::Relu => U::Relu,
        Unary::Gelu => U::Gelu,
        Unary::GeluTanh => U::GeluTanh,
        Unary::Silu => U::Silu,
        Unary::Sigmoid => U::Sigmoid,
        Unary::Tanh => U::Tanh,
        Unary::Clip => U::Clip { min: p0, max: p1 },
        Unary::Exp => U::Exp,
        Unary::Log => U::Log,
        Unary::Sqrt => U::Sqrt,
        Unary::Neg => U::Neg,
        Unary::Abs => U::Abs,
        Unary::Erf => U::Erf,
        Unary::Reciprocal => U::Reciprocal,
        Unary::HardSigmoid => U::HardSigmoid { alpha: p0, beta: p1 },
        Unary::HardSwish => U::HardSwish,
        Unary::Sin => U::Sin,
        Unary::Cos => U::Cos,
        Unary::Floor => U::Floor,
        Unary::Ceil => U::Ceil,
        Unary::Round => U::Round,
        Unary::Sign => U::Sign,
    })
}

/// Run the descriptor `bytes` (read from `desc_va`); returns its nominal
/// FLOP count.
pub fn run(mem: &mut AddressSpace<'_>, bytes: &[u8], desc_va: u64) -> R<u64> {
    let bad = Fault::new(FaultCode::BadDescriptor, Access::Read, desc_va);
    let desc = Desc::decode(bytes).map_err(|e| {
        log::debug!("descriptor at {desc_va:#x}: {e:?}");
        bad
    })?;
    let pinned = mem.pin();
    let mut op = Op { mem: &pinned, desc_va, claims: [(0, 0, false); MAX_CLAIMS], nclaims: 0 };
    match desc {
        Desc::Gemm(d) => gemm(&mut op, &d),
        Desc::Conv2d(d) => conv2d(&mut op, &d),
        Desc::Pool(d) => pool(&mut op, &d),
        Desc::Binary(d) => {
            let (ad, bd) = (dims(&d.a_dims, d.rank), dims(&d.b_dims, d.rank));
            let out_shape = op.kernel(k::broadcast_shape(&ad, &bd))?;
            let (na, nb, no) = (op.volume(&ad)?, op.volume(&bd)?, op.volume(&out_shape)?);
            let flops = op.flops(&[no as u64])?;
            // Descriptor decoding only lets known kinds through.
            let kind = binary_op(Binary::from_u32(d.kind).ok_or(bad)?);
            let act = activation(d.activation, d.act_param0, d.act_param1);
            let a = op.input(d.a_va, na)?;
            let b = op.input(d.b_va, nb)?;
            op.write_out(d.out_va, no, |out| k::binary_act(kind, &a, &ad, &b, &bd, act, out))?;
            Ok(flops)
        }
        Desc::Unary(d) => {
            let n = usize::try_from(d.count).map_err(|_| bad)?;
            op.volume(&[n])?;
            let u = Unary::from_u32(d.kind).ok_or(bad)?;
            let f = unary_op(u, d.param0, d.param1);
            if d.in_va == d.out_va {
                // In place: the output starts as the input.
                let mut out = op.output(d.out_va, n, true)?;
                if let Some(f) = f {
                    let r = k::unary_inplace(f, out.buf());
                    op.kernel(r)?;
                }
                out.commit();
            } else {
                let x = op.input(d.in_va, n)?;
                op.write_out(d.out_va, n, |y| match f {
                    Some(f) => k::unary(f, &x, y),
                    None => {
                        y.copy_from_slice(&x);
                        Ok(())
                    }
                })?;
            }
            Ok(n as u64)
        }
        Desc::Softmax(d) => {
            let shape = dims(&d.dims, d.rank);
            let n = op.volume(&shape)?;
            let x = op.input(d.in_va, n)?;
            let log = d.flags & ops::SOFTMAX_LOG != 0;
            op.write_out(d.out_va, n, |y| if log { k::log_softmax(&shape, d.axis as isize, &x, y) } else { k::softmax(&shape, d.axis as isize, &x, y) })?;
            Ok(5 * n as u64)
        }
        Desc::LayerNorm(d) => {
            let (rows, cols) = (d.rows as usize, d.cols as usize);
            let n = op.volume(&[rows, cols])?;
            let x = op.input(d.in_va, n)?;
            let gamma = if d.flags & ops::LAYERNORM_GAMMA != 0 { Some(op.input(d.gamma_va, cols)?) } else { None };
            let beta = if d.flags & ops::LAYERNORM_BETA != 0 { Some(op.input(d.beta_va, cols)?) } else { None };
            let norm = if d.flags & ops::LAYERNORM_RMS != 0 { k::rms_norm } else { k::layer_norm };
            op.write_out(d.out_va, n, |y| norm(&x, cols, gamma.as_deref(), beta.as_deref(), d.epsilon, y))?;
            Ok(8 * n as u64)
        }
        Desc::Reduce(d) => {
            let shape = dims(&d.dims, d.rank);
            let n = op.volume(&shape)?;
            let mut out_shape = shape.clone();
            out_shape.remove(d.axis as usize);
            let out_n = op.volume(&out_shape)?;
            let x = op.input(d.in_va, n)?;
            let axis = d.axis as isize;
            if d.kind >= ops::REDUCE_ARGMAX {
                let max = matches!(d.kind, ops::REDUCE_ARGMAX | ops::REDUCE_ARGMAX_LAST);
                let last = d.kind >= ops::REDUCE_ARGMAX_LAST;
                op.write_out(d.out_va, out_n, |y| k::arg_reduce(max, last, &shape, axis, &x, y))?;
                return Ok(n as u64);
            }
            let kind = match d.kind {
                ops::REDUCE_SUM => k::ReduceOp::Sum,
                ops::REDUCE_MEAN => k::ReduceOp::Mean,
                ops::REDUCE_MAX => k::ReduceOp::Max,
                _ => k::ReduceOp::Min,
            };
            op.write_out(d.out_va, out_n, |y| k::reduce(kind, &shape, axis, &x, y))?;
            Ok(n as u64)
        }
        Desc::Transpose(d) => {
            let shape = dims(&d.dims, d.rank);
            let perm: Vec<usize> = d.perm[..d.rank as usize].iter().map(|&p| p as usize).collect();
            let n = op.volume(&shape)?;
            let x = op.input(d.in_va, n)?;
            op.write_out(d.out_va, n, |y| k::permute(&shape, &perm, &x, y))?;
            Ok(n as u64)
        }
        Desc::StridedCopy(d) => strided_copy(&mut op, &d),
        Desc::Concat(d) => concat(&mut op, &d),
        Desc::Cast(d) => cast(&mut op, &d),
        Desc::Resize(d) => resize(&mut op, &d),
        Desc::GridSample(d) => grid_sample(&mut op, &d),
        Desc::TopK(d) => top_k(&mut op, &d),
        Desc::Eltwise(d) => eltwise(&mut op, &d),
        Desc::Recurrent(d) => recurrent(&mut op, &d),
        Desc::Quant(d) => quant(&mut op, &d),
        Desc::QGemm(d) => qgemm(&mut op, &d),
        Desc::QConv(d) => qconv(&mut op, &d),
        Desc::QBinary(d) => qbinary(&mut op, &d),
        Desc::Tile(d) => tile(&mut op, &d),
        Desc::Where(d) => {
            let (cd, ad, bd) = (dims(&d.cond_dims, d.rank), dims(&d.a_dims, d.rank), dims(&d.b_dims, d.rank));
            let out_shape = op.kernel(k::broadcast_shape3(&cd, &ad, &bd))?;
            let (nc, na, nb, no) = (op.volume(&cd)?, op.volume(&ad)?, op.volume(&bd)?, op.volume(&out_shape)?);
            let flops = op.flops(&[no as u64])?;
            let cond = op.input(d.cond_va, nc)?;
            let a = op.input(d.a_va, na)?;
            let b = op.input(d.b_va, nb)?;
            op.write_out(d.out_va, no, |out| k::where_select(&cond, &cd, &a, &ad, &b, &bd, out))?;
            Ok(flops)
        }
        Desc::Gather(d) => {
            let shape = dims(&d.dims, d.rank);
            let ni = usize::try_from(d.num_indices).map_err(|_| bad)?;
            let out_shape = op.kernel(k::gather_output_shape(&shape, d.axis as isize, &[ni]))?;
            let (n, no) = (op.volume(&shape)?, op.volume(&out_shape)?);
            op.volume(&[ni, 2])?;
            let dim = shape.get(d.axis as usize).copied().ok_or(bad)?;
            let (align, width) = if d.index_type == ops::GATHER_INDEX_I32 { (4, 4) } else { (8, 8) };
            if d.indices_va % align != 0 {
                return Err(Fault::new(FaultCode::Alignment, Access::Read, d.indices_va));
            }
            // Indices are copied out before use: the guest could change
            // them under the device after the bounds check otherwise.
            let span = op.mem.resolve(d.indices_va, (ni * width) as u64, Access::Read)?;
            let mut raw = vec![0u8; ni * width];
            gather_into(&span, &mut raw);
            let data = op.input(d.data_va, n)?;
            let g =
                GatherArgs { shape: &shape, axis: d.axis as usize, dim, indices_va: d.indices_va, out_va: d.out_va, no };
            if d.index_type == ops::GATHER_INDEX_I32 {
                let idx: Vec<i32> = raw.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                gather(&mut op, &g, &data, &idx)?;
            } else {
                let idx: Vec<i64> = raw
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect();
                gather(&mut op, &g, &data, &idx)?;
            }
            Ok(no as u64)
        }
    }
}

/// What [`gather`] needs of a checked GATHER descriptor.
struct GatherArgs<'a> {
    shape: &'a [usize],
    axis: usize,
    /// Length of the gathered axis.
    dim: usize,
    indices_va: u64,
    out_va: u64,
    /// Output element count.
    no: usize,
}

/// The first index outside `[-dim, dim)` (ONNX: negative indices count
/// from the end once).
fn first_bad_index<I: k::GatherIndex>(idx: &[I], dim: usize) -> Option<usize> {
    // dim <= u32::MAX (a descriptor dim), so it fits an i64.
    let dim = i64::try_from(dim).unwrap_or(i64::MAX);
    idx.iter().position(|i| {
        let i = i.to_i64();
        i < -dim || i >= dim
    })
}

/// GATHER with its indices copied out of guest memory: translate the
/// output, check every index (an IndexOutOfRange fault at the first bad
/// index's VA), then gather. Nothing is written on a fault.
fn gather<I: k::GatherIndex>(op: &mut Op<'_, '_, '_>, g: &GatherArgs<'_>, data: &[f32], idx: &[I]) -> R<()> {
    let mut out = op.output(g.out_va, g.no, false)?;
    if let Some(i) = first_bad_index(idx, g.dim) {
        let width = std::mem::size_of::<I>() as u64;
        // Inside the translated index range (below VA_LIMIT): cannot
        // saturate.
        let va = g.indices_va.saturating_add((i as u64).saturating_mul(width));
        return Err(Fault::new(FaultCode::IndexOutOfRange, Access::Read, va));
    }
    let r = k::gather(data, g.shape, g.axis as isize, idx, &[idx.len()], out.buf());
    op.kernel(r)?;
    out.commit();
    Ok(())
}

/// A CAST operand as read, typed by its element type.
enum CastIn<'p> {
    F32(Cow<'p, [f32]>),
    I32(Cow<'p, [i32]>),
    I64(Cow<'p, [i64]>),
    Bool(Cow<'p, [u8]>),
}

impl CastIn<'_> {
    fn view(&self) -> k::CastSrc<'_> {
        match self {
            CastIn::F32(s) => k::CastSrc::F32(s),
            CastIn::I32(s) => k::CastSrc::I32(s),
            CastIn::I64(s) => k::CastSrc::I64(s),
            CastIn::Bool(s) => k::CastSrc::Bool(s),
        }
    }
}

fn cast(op: &mut Op<'_, '_, '_>, d: &ops::CastDesc) -> R<u64> {
    let (src_size, dst_size) = match (ops::cast_type_size(d.src_type), ops::cast_type_size(d.dst_type)) {
        (Some(s), Some(t)) => (s, t),
        // Descriptor decoding only lets the element types through.
        _ => return Err(op.bad()),
    };
    let n = usize::try_from(d.count).map_err(|_| op.bad())?;
    // Every operand at most MAX_TENSOR_ELEMS * 4 bytes, like the largest
    // f32 tensor: with an i64 operand at most 2^27 elements.
    let words = src_size.max(dst_size).div_ceil(4) as usize;
    op.volume(&[n, words])?;
    let input = match d.src_type {
        ops::CAST_F32 => CastIn::F32(op.input_of(d.in_va, n)?),
        ops::CAST_I32 => CastIn::I32(op.input_of(d.in_va, n)?),
        ops::CAST_I64 => CastIn::I64(op.input_of(d.in_va, n)?),
        _ => CastIn::Bool(op.input_of(d.in_va, n)?),
    };
    // The output is written after the input was read (or borrowed where it
    // does not overlap the output): an overlapping output is staged.
    let src = input.view();
    match d.dst_type {
        ops::CAST_F32 => op.write_out_of(d.out_va, n, |o| k::cast(src, k::CastDst::F32(o)))?,
        ops::CAST_I32 => op.write_out_of(d.out_va, n, |o| k::cast(src, k::CastDst::I32(o)))?,
        ops::CAST_I64 => op.write_out_of(d.out_va, n, |o| k::cast(src, k::CastDst::I64(o)))?,
        _ => op.write_out_of(d.out_va, n, |o| k::cast(src, k::CastDst::Bool(o)))?,
    }
    Ok(n as u64)
}

fn padding(top: u32, left: u32, bottom: u32, right: u32) -> k::Padding2d {
    k::Padding2d { top: top as usize, left: left as usize, bottom: bottom as usize, right: right as usize }
}

fn gemm(op: &mut Op<'_, '_, '_>, d: &ops::GemmDesc) -> R<u64> {
    let (m, n, kk, batch) = (d.m as usize, d.n as usize, d.k as usize, d.batch as usize);
    let flops = op.flops(&[2, m as u64, n as u64, kk as u64, batch as u64])?;
    if batch == 0 {
        return Ok(0);
    }
    let b_packed = d.flags & ops::GEMM_B_PACKED != 0;
    // A packed B holds whole panels (the contract's packed length).
    let b_len = if b_packed {
        ops::gemm_packed_b_len(kk as u64, n as u64).filter(|&l| l <= MAX_TENSOR_ELEMS).ok_or_else(|| op.bad())? as usize
    } else {
        op.volume(&[kk, n])?
    };
    let (a_len, c_len) = (op.volume(&[m, kk])?, op.volume(&[m, n])?);
    // Extent of each operand over the batch: (batch-1)*stride + matrix.
    let extent = |op: &Op<'_, '_, '_>, stride: u64, len: usize| -> R<usize> {
        let e = (batch as u64 - 1).checked_mul(stride).and_then(|x| x.checked_add(len as u64));
        match e {
            Some(e) if e <= MAX_TENSOR_ELEMS => Ok(e as usize),
            _ => Err(op.bad()),
        }
    };
    let (a_ext, b_ext, c_ext) = (
        extent(op, d.a_batch_stride, a_len)?,
        extent(op, d.b_batch_stride, b_len)?,
        extent(op, d.c_batch_stride, c_len)?,
    );
    if batch > 1 && (d.c_batch_stride as usize) < c_len {
        return Err(op.bad()); // output matrices would overlap
    }
    let a = op.input(d.a_va, a_ext)?;
    let b = op.input(d.b_va, b_ext)?;
    let bias = if d.flags & ops::GEMM_BIAS != 0 { Some(op.input(d.bias_va, n)?) } else { None };
    let residual = if d.flags & ops::GEMM_RESIDUAL != 0 { Some(op.input(d.residual_va, c_ext)?) } else { None };
    let accumulate = d.flags & ops::GEMM_ACCUMULATE != 0;
    // C's old contents matter with accumulation, and in the gaps between
    // batch matrices, which must survive.
    let gaps = batch > 1 && d.c_batch_stride as usize != c_len;
    let mut c = op.output(d.c_va, c_ext, accumulate || gaps)?;
    let p = k::GemmParams {
        m,
        n,
        k: kk,
        trans_a: d.flags & ops::GEMM_TRANS_A != 0,
        trans_b: d.flags & ops::GEMM_TRANS_B != 0,
        b_packed,
        accumulate,
        activation: activation(d.activation, d.act_param0, d.act_param1),
    };
    for i in 0..batch {
        let (ao, bo, co) =
            (i * d.a_batch_stride as usize, i * d.b_batch_stride as usize, i * d.c_batch_stride as usize);
        let res = residual.as_deref().map(|r| &r[co..co + c_len]);
        let r = k::gemm_residual(&p, &a[ao..ao + a_len], &b[bo..bo + b_len], bias.as_deref(), res, &mut c.buf()[co..co + c_len]);
        op.kernel(r)?;
    }
    c.commit();
    Ok(flops)
}

fn conv2d(op: &mut Op<'_, '_, '_>, d: &ops::Conv2dDesc) -> R<u64> {
    let p = k::Conv2dParams {
        batch: d.n as usize,
        in_channels: d.c_in as usize,
        in_h: d.h as usize,
        in_w: d.w as usize,
        out_channels: d.c_out as usize,
        kernel: [d.kh as usize, d.kw as usize],
        stride: [d.stride_h as usize, d.stride_w as usize],
        padding: padding(d.pad_top, d.pad_left, d.pad_bottom, d.pad_right),
        dilation: [d.dil_h as usize, d.dil_w as usize],
        groups: d.groups as usize,
        activation: activation(d.activation, d.act_param0, d.act_param1),
    };
    let out_shape = op.kernel(k::conv2d_output_shape(&p))?;
    if p.groups == 0 || !p.in_channels.is_multiple_of(p.groups) {
        return Err(op.bad());
    }
    let cin_g = p.in_channels / p.groups;
    let winograd = d.flags & ops::CONV_WINOGRAD != 0;
    let n_in = op.volume(&[p.batch, p.in_channels, p.in_h, p.in_w])?;
    // CONV_WINOGRAD: 16 matrices [c_out × c_in] (the decoder checked the
    // geometry: 3×3, stride 1, undilated, one group).
    let n_w = if winograd {
        op.volume(&[ops::WINOGRAD_POINTS, p.out_channels, cin_g])?
    } else {
        op.volume(&[p.out_channels, cin_g, p.kernel[0], p.kernel[1]])?
    };
    let n_out = op.volume(&out_shape)?;
    let flops = op.flops(&[2, n_out as u64, cin_g as u64, p.kernel[0] as u64, p.kernel[1] as u64])?;
    let input = op.input(d.input_va, n_in)?;
    let weight = op.input(d.weight_va, n_w)?;
    let bias = if d.flags & ops::CONV_BIAS != 0 { Some(op.input(d.bias_va, p.out_channels)?) } else { None };
    let residual = if d.flags & ops::CONV_RESIDUAL != 0 { Some(op.input(d.residual_va, n_out)?) } else { None };
    op.write_out(d.output_va, n_out, |out| {
        if winograd {
            k::conv2d_winograd(&p, &input, &weight, bias.as_deref(), residual.as_deref(), out)
        } else {
            k::conv2d_residual(&p, &input, &weight, bias.as_deref(), residual.as_deref(), out)
        }
    })?;
    Ok(flops)
}

fn quant(op: &mut Op<'_, '_, '_>, d: &ops::QuantDesc) -> R<u64> {
    let to_usize = |v: u64| usize::try_from(v).map_err(|_| op.bad());
    let (outer, channels, inner) = (to_usize(d.outer)?, to_usize(d.channels)?, to_usize(d.inner)?);
    let n = op.volume(&[outer, channels, inner])?;
    op.volume(&[channels])?;
    let signed = d.qtype == ops::QTYPE_I8;
    let scale = op.input_of::<f32>(d.scale_va, channels)?;
    let zero = op.input_of::<i32>(d.zero_va, channels)?;
    if d.mode == ops::QUANT_QUANTIZE {
        let x = op.input(d.in_va, n)?;
        op.write_out_of::<u8>(d.out_va, n, |q| k::quantize(&x, q, signed, outer, channels, inner, &scale, &zero))?;
    } else {
        let q = op.input_of::<u8>(d.in_va, n)?;
        let src = k::QTensor { data: &q, signed };
        op.write_out(d.out_va, n, |x| k::dequantize(src, x, outer, channels, inner, &scale, &zero))?;
    }
    Ok(n as u64)
}

fn qbinary(op: &mut Op<'_, '_, '_>, d: &ops::QBinaryDesc) -> R<u64> {
    let n = op.volume(&[usize::try_from(d.count).map_err(|_| op.bad())?])?;
    let kind = if d.kind == ops::Binary::Mul as u32 { k::QBinaryKind::Mul } else { k::QBinaryKind::Add };
    let qa = op.input_of::<u8>(d.a_va, n)?;
    let qb = op.input_of::<u8>(d.b_va, n)?;
    let a = k::QOperand { q: k::QTensor { data: &qa, signed: d.a_type == ops::QTYPE_I8 }, scale: d.a_scale, zero: d.a_zero };
    let b = k::QOperand { q: k::QTensor { data: &qb, signed: d.b_type == ops::QTYPE_I8 }, scale: d.b_scale, zero: d.b_zero };
    let relu = d.flags & ops::QBINARY_RELU != 0;
    op.write_out_of::<u8>(d.out_va, n, |out| k::qbinary(kind, a, b, relu, out, d.out_type == ops::QTYPE_I8, d.out_scale, d.out_zero))?;
    Ok(n as u64)
}

/// A TILE buffer as resolved: read in place (or staged), or staged as
/// atomics the program's instances store into.
enum TileBuf<'p> {
    F32(Cow<'p, [f32]>),
    I32(Cow<'p, [i32]>),
    I64(Cow<'p, [i64]>),
    I1(Cow<'p, [u8]>),
    W32(Vec<std::sync::atomic::AtomicU32>, Span),
    W64(Vec<std::sync::atomic::AtomicU64>, Span),
    W8(Vec<std::sync::atomic::AtomicU8>, Span),
}

impl TileBuf<'_> {
    fn view(&self) -> k::TileMem<'_> {
        match self {
            TileBuf::F32(s) => k::TileMem::F32(s),
            TileBuf::I32(s) => k::TileMem::I32(s),
            TileBuf::I64(s) => k::TileMem::I64(s),
            TileBuf::I1(s) => k::TileMem::I1(s),
            TileBuf::W32(v, _) => k::TileMem::W32(v),
            TileBuf::W64(v, _) => k::TileMem::W64(v),
            TileBuf::W8(v, _) => k::TileMem::W8(v),
        }
    }

    /// Copy a written buffer's staging out to its memory.
    fn commit(self) {
        use std::sync::atomic::AtomicU8;
        match self {
            TileBuf::W32(v, span) => scatter(&v.into_iter().map(|a| a.into_inner()).collect::<Vec<u32>>(), &span),
            TileBuf::W64(v, span) => scatter(&v.into_iter().map(|a| a.into_inner() as i64).collect::<Vec<i64>>(), &span),
            TileBuf::W8(v, span) => scatter(&v.into_iter().map(AtomicU8::into_inner).collect::<Vec<u8>>(), &span),
            _ => {}
        }
    }
}

/// TILE: read and verify the program, check the launch against it,
/// translate every buffer (read; stored ones also write), run the grid on
/// staging for the stored buffers, and write them back only if no
/// instance faulted.
fn tile(op: &mut Op<'_, '_, '_>, d: &ops::TileDesc) -> R<u64> {
    use rbln_hw::tile::{self as t, TileType};
    use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};
    let code = op.input_of::<u8>(d.program_va, d.program_size as usize)?;
    let refuse = |e: t::TileError| {
        log::debug!("descriptor at {:#x}: {e}", op.desc_va);
        op.bad()
    };
    let info = t::verify(&code).map_err(refuse)?;
    let program = t::TileProgram::new(&code).map_err(refuse)?;
    let h = info.header;
    if d.nbufs != h.nbufs || d.nparams != h.nparams {
        return Err(refuse(t::TileError { instr: u32::MAX, what: "the launch's buffer or parameter count differs from the program's" }));
    }
    for (i, &bits) in d.params[..h.nparams as usize].iter().enumerate() {
        let ok = match TileType::from_u8(h.param_types[i]) {
            Some(TileType::F32 | TileType::I32) => bits >> 32 == 0,
            Some(TileType::I1) => bits <= 1,
            _ => true,
        };
        if !ok {
            return Err(refuse(t::TileError { instr: u32::MAX, what: "a parameter's bits exceed its type" }));
        }
    }
    let grid = d.grid.iter().try_fold(1u64, |a, &g| a.checked_mul(g as u64)).filter(|&g| g <= t::MAX_TILE_GRID);
    let work = t::launch_work(&info, d.grid).filter(|&w| w <= MAX_FLOPS);
    if grid.is_none() || work.is_none() {
        return Err(refuse(t::TileError { instr: u32::MAX, what: "grid or work above the limits" }));
    }
    let mut bufs: Vec<TileBuf<'_>> = Vec::with_capacity(h.nbufs as usize);
    for i in 0..h.nbufs as usize {
        let (va, len) = (d.buf_va[i], op.volume(&[usize::try_from(d.buf_len[i]).map_err(|_| op.bad())?])?);
        let ty = TileType::from_u8(h.buf_types[i]);
        if info.stores & (1 << i) != 0 {
            // Loaded too, or not: a written buffer is staged with its old
            // contents (masked-off lanes keep them) and needs both rights.
            let b = match ty {
                Some(TileType::I64) => {
                    op.resolve::<i64>(va, len, Access::Read)?;
                    let span = op.resolve::<i64>(va, len, Access::Write)?;
                    TileBuf::W64(gather_span::<i64>(&span, len).into_iter().map(|v| AtomicU64::new(v as u64)).collect(), span)
                }
                Some(TileType::I1) => {
                    op.resolve::<u8>(va, len, Access::Read)?;
                    let span = op.resolve::<u8>(va, len, Access::Write)?;
                    TileBuf::W8(gather_span::<u8>(&span, len).into_iter().map(AtomicU8::new).collect(), span)
                }
                _ => {
                    op.resolve::<f32>(va, len, Access::Read)?;
                    let span = op.resolve::<f32>(va, len, Access::Write)?;
                    TileBuf::W32(gather_span::<u32>(&span, len).into_iter().map(AtomicU32::new).collect(), span)
                }
            };
            bufs.push(b);
        } else {
            bufs.push(match ty {
                Some(TileType::I32) => TileBuf::I32(op.input_of::<i32>(va, len)?),
                Some(TileType::I64) => TileBuf::I64(op.input_of::<i64>(va, len)?),
                Some(TileType::I1) => TileBuf::I1(op.input_of::<u8>(va, len)?),
                _ => TileBuf::F32(op.input_of::<f32>(va, len)?),
            });
        }
    }
    let views: Vec<k::TileMem<'_>> = bufs.iter().map(TileBuf::view).collect();
    let launch = k::TileLaunch { program, info, grid: d.grid, params: d.params, bufs: &views };
    match k::run_tile(&launch) {
        Ok(()) => {}
        Err(k::TileFault::OutOfBounds { slot, offset, write }) => {
            let size = TileType::from_u8(h.buf_types[slot]).and_then(TileType::mem_size).unwrap_or(4);
            let va = d.buf_va[slot].wrapping_add((offset as u64).wrapping_mul(size));
            log::debug!("tile program at {:#x}: buffer {slot} element {offset} is outside its {} elements", d.program_va, d.buf_len[slot]);
            return Err(Fault::new(FaultCode::OutOfBounds, if write { Access::Write } else { Access::Read }, va));
        }
        Err(e) => {
            log::debug!("descriptor at {:#x}: {e}", op.desc_va);
            return Err(op.bad());
        }
    }
    drop(views);
    for b in bufs {
        b.commit();
    }
    Ok(work.unwrap_or(0))
}

/// The per-output-column operands shared by QGEMM and QCONV.
struct QColumns<'p> {
    b_zero: Option<Cow<'p, [i32]>>,
    bias: Option<Cow<'p, [i32]>>,
    scale: Cow<'p, [f32]>,
}

fn q_columns<'p>(op: &mut Op<'p, '_, '_>, flags: u32, cols: usize, b_zero_va: u64, bias_va: u64, scale_va: u64) -> R<QColumns<'p>> {
    let b_zero = if flags & ops::QGEMM_B_ZERO != 0 { Some(op.input_of::<i32>(b_zero_va, cols)?) } else { None };
    let bias = if flags & ops::QGEMM_BIAS != 0 { Some(op.input_of::<i32>(bias_va, cols)?) } else { None };
    Ok(QColumns { b_zero, bias, scale: op.input_of::<f32>(scale_va, cols)? })
}

/// Writes a QGEMM / QCONV result of `count` elements at `va` as the
/// descriptor's output type.
#[allow(clippy::too_many_arguments)]
fn q_write(op: &mut Op<'_, '_, '_>, va: u64, count: usize, out_type: u32, zero: i32, min: i32, max: i32, relu: bool, f: impl FnOnce(k::QDst<'_>) -> k::Result<()>) -> R<()> {
    if out_type == ops::QTYPE_F32 {
        op.write_out(va, count, |out| f(k::QDst::F32 { out, relu }))
    } else {
        let signed = out_type == ops::QTYPE_I8;
        op.write_out_of::<u8>(va, count, |out| f(k::QDst::Int { out, signed, zero, min, max }))
    }
}

fn qgemm(op: &mut Op<'_, '_, '_>, d: &ops::QGemmDesc) -> R<u64> {
    let (m, n, kk) = (d.m as usize, d.n as usize, d.k as usize);
    let flops = op.flops(&[2, m as u64, n as u64, kk as u64])?;
    let b_len = ops::qgemm_packed_b_len(kk as u64, n as u64).filter(|&l| l <= MAX_TENSOR_ELEMS).ok_or_else(|| op.bad())? as usize;
    let (a_len, c_len) = (op.volume(&[m, kk])?, op.volume(&[m, n])?);
    op.volume(&[n])?;
    let a = op.input_of::<u8>(d.a_va, a_len)?;
    let b = op.input_of::<u8>(d.b_va, b_len)?;
    let cols = q_columns(op, d.flags, n, d.b_zero_va, d.bias_va, d.scale_va)?;
    let p = k::QGemmParams { m, n, k: kk, a_zero: d.a_zero, b: &b, b_zero: cols.b_zero.as_deref(), bias: cols.bias.as_deref(), scale: &cols.scale };
    let a = k::QTensor { data: &a, signed: d.a_type == ops::QTYPE_I8 };
    let relu = d.flags & ops::QGEMM_RELU != 0;
    q_write(op, d.out_va, c_len, d.out_type, d.out_zero, d.out_min, d.out_max, relu, |dst| k::qgemm(a, &p, dst))?;
    Ok(flops)
}

fn qconv(op: &mut Op<'_, '_, '_>, d: &ops::QConvDesc) -> R<u64> {
    let p = k::QConvParams {
        batch: d.n as usize,
        in_channels: d.c_in as usize,
        in_h: d.h as usize,
        in_w: d.w as usize,
        out_channels: d.c_out as usize,
        kernel: [d.kh as usize, d.kw as usize],
        stride: [d.stride_h as usize, d.stride_w as usize],
        padding: padding(d.pad_top, d.pad_left, d.pad_bottom, d.pad_right),
        dilation: [d.dil_h as usize, d.dil_w as usize],
        groups: d.groups as usize,
        channel_quads: d.flags & ops::QCONV_CHANNEL_QUADS != 0,
        weight_tiles: d.flags & ops::QCONV_WEIGHT_TILES != 0,
    };
    let out_shape = op.kernel(k::qconv2d_output_shape(&p))?;
    if p.groups == 0 || !p.in_channels.is_multiple_of(p.groups) || !p.out_channels.is_multiple_of(p.groups) {
        return Err(op.bad());
    }
    let (cin_g, cout_g) = (p.in_channels / p.groups, p.out_channels / p.groups);
    let k_g = ops::qconv_k(cin_g as u64, p.kernel[0] as u64, p.kernel[1] as u64, d.flags).ok_or_else(|| op.bad())?;
    let n_in = op.volume(&[p.batch, p.in_channels, p.in_h, p.in_w])?;
    let per_group = if p.weight_tiles { ops::qconv_tiled_len(k_g, cout_g as u64) } else { ops::qgemm_packed_b_len(k_g, cout_g as u64) }.ok_or_else(|| op.bad())?;
    let n_w = per_group.checked_mul(p.groups as u64).filter(|&l| l <= MAX_TENSOR_ELEMS).ok_or_else(|| op.bad())? as usize;
    let n_out = op.volume(&out_shape)?;
    // Real multiply-adds (the padding channels of a quad order are not).
    let flops = op.flops(&[2, n_out as u64, cin_g as u64, p.kernel[0] as u64, p.kernel[1] as u64])?;
    let x = op.input_of::<u8>(d.x_va, n_in)?;
    let w = op.input_of::<u8>(d.w_va, n_w)?;
    let cols = q_columns(op, d.flags, p.out_channels, d.w_zero_va, d.bias_va, d.scale_va)?;
    let x = k::QTensor { data: &x, signed: d.x_type == ops::QTYPE_I8 };
    let relu = d.flags & ops::QGEMM_RELU != 0;
    q_write(op, d.out_va, n_out, d.out_type, d.out_zero, d.out_min, d.out_max, relu, |dst| {
        k::qconv2d(x, d.x_zero, &w, cols.b_zero.as_deref(), cols.bias.as_deref(), &cols.scale, &p, dst)
    })?;
    Ok(flops)
}

fn pool(op: &mut Op<'_, '_, '_>, d: &ops::PoolDesc) -> R<u64> {
    let p = k::Pool2dParams {
        batch: d.n as usize,
        channels: d.c as usize,
        in_h: d.h as usize,
        in_w: d.w as usize,
        kernel: [d.kh as usize, d.kw as usize],
        stride: [d.stride_h as usize, d.stride_w as usize],
        padding: padding(d.pad_top, d.pad_left, d.pad_bottom, d.pad_right),
        dilation: [d.dil_h as usize, d.dil_w as usize],
        kind: if d.kind == ops::POOL_MAX {
            k::PoolKind::Max
        } else {
            k::PoolKind::Avg { count_include_pad: d.flags & ops::POOL_COUNT_INCLUDE_PAD != 0 }
        },
    };
    let out_shape = op.kernel(k::pool2d_output_shape(&p))?;
    let n_in = op.volume(&[p.batch, p.channels, p.in_h, p.in_w])?;
    let n_out = op.volume(&out_shape)?;
    let flops = op.flops(&[n_out as u64, p.kernel[0] as u64, p.kernel[1] as u64])?;
    if d.flags & ops::POOL_INT8 != 0 {
        // (Decoding only lets INT8 through with MAX.)
        let signed = d.flags & ops::POOL_SIGNED != 0;
        let input = op.input_of::<u8>(d.input_va, n_in)?;
        op.write_out_of::<u8>(d.output_va, n_out, |out| k::pool2d_int8(&p, &input, signed, out))?;
        return Ok(flops);
    }
    let input = op.input(d.input_va, n_in)?;
    op.write_out(d.output_va, n_out, |out| k::pool2d(&p, &input, out))?;
    Ok(flops)
}

fn resize(op: &mut Op<'_, '_, '_>, d: &ops::ResizeDesc) -> R<u64> {
    let axis = |input: u32, output: u32, scale: f32, offset: f32| k::ResizeAxis {
        input: input as usize,
        output: output as usize,
        scale,
        offset,
    };
    let mode = match (d.mode, d.nearest_mode) {
        (ops::RESIZE_LINEAR, _) => k::ResizeMode::Linear,
        (ops::RESIZE_CUBIC, _) => k::ResizeMode::Cubic { a: d.cubic_a, exclude_outside: d.flags & ops::RESIZE_EXCLUDE_OUTSIDE != 0 },
        (_, ops::RESIZE_ROUND_PREFER_CEIL) => k::ResizeMode::Nearest(k::NearestMode::RoundPreferCeil),
        (_, ops::RESIZE_FLOOR) => k::ResizeMode::Nearest(k::NearestMode::Floor),
        (_, ops::RESIZE_CEIL) => k::ResizeMode::Nearest(k::NearestMode::Ceil),
        _ => k::ResizeMode::Nearest(k::NearestMode::RoundPreferFloor),
    };
    let p = k::ResizeParams {
        batch: d.n as usize,
        channels: d.c as usize,
        h: axis(d.h, d.oh, d.scale_y, d.offset_y),
        w: axis(d.w, d.ow, d.scale_x, d.offset_x),
        mode,
    };
    let out_shape = op.kernel(k::resize2d_output_shape(&p))?;
    let n_in = op.volume(&[p.batch, p.channels, p.h.input, p.w.input])?;
    let n_out = op.volume(&out_shape)?;
    // Multiply-adds per output element.
    let per = match d.mode {
        ops::RESIZE_LINEAR => 4,
        ops::RESIZE_CUBIC => 20,
        _ => 1,
    };
    let flops = op.flops(&[n_out as u64, per])?;
    let input = op.input(d.in_va, n_in)?;
    op.write_out(d.out_va, n_out, |out| k::resize2d(&p, &input, out))?;
    Ok(flops)
}

fn grid_sample(op: &mut Op<'_, '_, '_>, d: &ops::GridSampleDesc) -> R<u64> {
    let p = k::GridSampleParams {
        batch: d.n as usize,
        channels: d.c as usize,
        h: d.h as usize,
        w: d.w as usize,
        oh: d.oh as usize,
        ow: d.ow as usize,
        mode: match d.mode {
            ops::GRID_NEAREST => k::GridMode::Nearest,
            ops::GRID_LINEAR => k::GridMode::Linear,
            _ => k::GridMode::Cubic,
        },
        padding: match d.padding {
            ops::GRID_PAD_ZEROS => k::GridPadding::Zeros,
            ops::GRID_PAD_BORDER => k::GridPadding::Border,
            _ => k::GridPadding::Reflection,
        },
        align_corners: d.flags & ops::GRID_ALIGN_CORNERS != 0,
    };
    let out_shape = op.kernel(k::grid_sample_output_shape(&p))?;
    let n_in = op.volume(&[p.batch, p.channels, p.h, p.w])?;
    let n_grid = op.volume(&[p.batch, p.oh, p.ow, 2])?;
    let n_out = op.volume(&out_shape)?;
    // Multiply-adds per output element: 1, 4 or 16 taps.
    let per = [1, 4, 16][d.mode as usize];
    let flops = op.flops(&[n_out as u64, per])?;
    let input = op.input(d.in_va, n_in)?;
    let grid = op.input(d.grid_va, n_grid)?;
    op.write_out(d.out_va, n_out, |out| k::grid_sample(&p, &input, &grid, out))?;
    Ok(flops)
}

fn top_k(op: &mut Op<'_, '_, '_>, d: &ops::TopKDesc) -> R<u64> {
    let (outer, len, inner, k) = (d.outer as usize, d.len as usize, d.inner as usize, d.k as usize);
    let n_in = op.volume(&[outer, len, inner])?;
    let n_out = op.volume(&[outer, k, inner])?;
    // Nominal work: a selection pass over the input, then sorting the
    // chosen elements: N_in + N_out·⌈log2(k + 1)⌉.
    let sort = op.flops(&[n_out as u64, (u64::BITS - (k as u64).leading_zeros()) as u64])?;
    let flops = op.flops(&[(n_in as u64).checked_add(sort).ok_or_else(|| op.bad())?])?;
    let input = op.input(d.in_va, n_in)?;
    // Both outputs are translated before either is written.
    let mut values = op.output(d.values_va, n_out, false)?;
    let mut indices = op.output(d.indices_va, n_out, false)?;
    let r = k::top_k(d.flags & ops::TOPK_LARGEST != 0, outer, len, inner, k, &input, values.buf(), indices.buf());
    op.kernel(r)?;
    values.commit();
    indices.commit();
    Ok(flops)
}

fn eltwise(op: &mut Op<'_, '_, '_>, d: &ops::EltwiseDesc) -> R<u64> {
    let out_shape = dims(&d.out_dims, d.rank);
    let n_out = op.volume(&out_shape)?;
    let (n_in, n_instrs) = (d.n_inputs as usize, d.n_instrs as usize);
    let flops = op.flops(&[n_out as u64, n_instrs as u64])?;
    // Decoding checked the program; a code it let through maps here.
    let mut steps: SmallVec<[k::EltStep; ops::ELTWISE_MAX_INSTRS]> = SmallVec::new();
    for ins in &d.instrs[..n_instrs] {
        let operand = |r: u8| if r == ops::ELTWISE_IMM { k::EltOperand::Imm(ins.imm) } else { k::EltOperand::Reg(r) };
        steps.push(match ins.class {
            ops::ELT_UNARY => {
                let u = Unary::from_u32(ins.code.into()).ok_or_else(|| op.bad())?;
                k::EltStep::Unary { op: unary_op(u, ins.param0, ins.param1).ok_or_else(|| op.bad())?, dst: ins.dst, a: ins.a }
            }
            _ => {
                let b = Binary::from_u32(ins.code.into()).ok_or_else(|| op.bad())?;
                k::EltStep::Binary { op: binary_op(b), dst: ins.dst, a: operand(ins.a), b: operand(ins.b) }
            }
        });
    }
    // Each input's extent: its farthest element + 1 (none for an empty
    // output), checked like any operand's size.
    let rank = d.rank as usize;
    let mut strides: SmallVec<[k::Shape; ops::ELTWISE_MAX_INPUTS]> = SmallVec::new();
    let mut inputs: SmallVec<[Cow<'_, [f32]>; ops::ELTWISE_MAX_INPUTS]> = SmallVec::new();
    for i in 0..n_in {
        let st: k::Shape = d.in_strides[i][..rank].iter().map(|&s| usize::try_from(s).unwrap_or(usize::MAX)).collect();
        let extent = if n_out == 0 {
            0
        } else {
            let last = st.iter().zip(&out_shape).try_fold(0usize, |acc, (&s, &n)| (n - 1).checked_mul(s).and_then(|x| x.checked_add(acc)));
            last.and_then(|l| l.checked_add(1)).ok_or_else(|| op.bad())?
        };
        op.volume(&[extent])?;
        inputs.push(op.input(d.in_va[i], extent)?);
        strides.push(st);
    }
    let ins: SmallVec<[(&[f32], &[usize]); ops::ELTWISE_MAX_INPUTS]> = inputs.iter().zip(&strides).map(|(x, s)| (&x[..], &s[..])).collect();
    op.write_out(d.out_va, n_out, |out| k::eltwise(&steps, d.out_reg as u8, &ins, &out_shape, out))?;
    Ok(flops)
}

fn recurrent(op: &mut Op<'_, '_, '_>, d: &ops::RecurrentDesc) -> R<u64> {
    let lbr = d.flags & ops::REC_LINEAR_BEFORE_RESET != 0;
    // Decoding checked the cell and which operands it may have.
    let cell = match d.cell {
        ops::REC_LSTM => k::RecCell::Lstm,
        ops::REC_GRU => k::RecCell::Gru { linear_before_reset: lbr },
        ops::REC_RNN_TANH => k::RecCell::Rnn { relu: false },
        ops::REC_RNN_RELU => k::RecCell::Rnn { relu: true },
        _ => return Err(op.bad()),
    };
    let (seq, batch, hidden) = (d.seq as usize, d.batch as usize, d.hidden as usize);
    let width = op.volume(&[cell.gates(), hidden])?;
    let n_x = op.volume(&[seq, batch, width])?;
    let n_r = op.volume(&[width, hidden])?;
    let n_state = op.volume(&[batch, hidden])?;
    let n_y = op.volume(&[seq, n_state])?;
    // Nominal work: the products with R, then about ten operations per
    // gate element for the cell's update.
    let flops = op.flops(&[n_x as u64, hidden as u64 * 2 + 10])?;
    let x = op.input(d.x_va, n_x)?;
    let r = op.input(d.r_va, n_r)?;
    // Optional operands are absent at VA 0 (decoding checked that Rb_h
    // comes with linear-before-reset, and only with it).
    let rb = if d.rb_va != 0 { Some(op.input(d.rb_va, hidden)?) } else { None };
    let h0 = if d.h0_va != 0 { Some(op.input(d.h0_va, n_state)?) } else { None };
    let c0 = if d.c0_va != 0 { Some(op.input(d.c0_va, n_state)?) } else { None };
    // Both outputs are translated before either is written.
    let mut y = op.output(d.y_va, n_y, false)?;
    let mut c = if d.c_va == 0 { None } else { Some(op.output(d.c_va, n_state, false)?) };
    let p = k::RecurrentParams { cell, seq, batch, hidden, reverse: d.flags & ops::REC_REVERSE != 0 };
    let ins = k::RecurrentInputs { x: &x, r: &r, rb: rb.as_deref(), h0: h0.as_deref(), c0: c0.as_deref() };
    let res = k::recurrent(&p, &ins, y.buf(), c.as_mut().map(|c| c.buf()));
    op.kernel(res)?;
    y.commit();
    if let Some(c) = c {
        c.commit();
    }
    Ok(flops)
}

fn concat(op: &mut Op<'_, '_, '_>, d: &ops::ConcatDesc) -> R<u64> {
    let (rows, out_cols, n) = (d.rows as usize, d.out_cols as usize, d.parts as usize);
    let n_out = op.volume(&[rows, out_cols])?;
    // Decoding bounded `parts` and each part's columns to the row.
    let mut srcs: SmallVec<[Cow<'_, [f32]>; ops::MAX_CONCAT_PARTS]> = SmallVec::new();
    let mut moved = 0u64;
    for i in 0..n {
        let count = op.volume(&[rows, d.cols[i] as usize])?;
        srcs.push(op.input(d.src_va[i], count)?);
        moved += count as u64;
    }
    // Whether the parts tile every row, so that the old contents need not
    // be kept.
    let mut spans: SmallVec<[(u32, u32); ops::MAX_CONCAT_PARTS]> = (0..n).map(|i| (d.col[i], d.cols[i])).collect();
    spans.sort_unstable();
    let tiles = spans.iter().try_fold(0u32, |at, &(c, w)| (c == at).then_some(c + w)) == Some(d.out_cols);
    let parts: SmallVec<[k::ConcatPart<'_>; ops::MAX_CONCAT_PARTS]> =
        srcs.iter().enumerate().map(|(i, s)| k::ConcatPart { src: s, col: d.col[i] as usize, cols: d.cols[i] as usize }).collect();
    let mut out = op.output(d.out_va, n_out, !tiles)?;
    let r = k::concat_rows(rows, out_cols, &parts, out.buf());
    op.kernel(r)?;
    out.commit();
    Ok(moved)
}

fn strided_copy(op: &mut Op<'_, '_, '_>, d: &ops::StridedCopyDesc) -> R<u64> {
    let sizes = dims(&d.sizes, d.rank);
    let n = op.volume(&sizes)?;
    if n == 0 {
        return Ok(0);
    }
    // Extent (elements) covered by a box with these strides.
    let extent = |op: &Op<'_, '_, '_>, strides: &[u64]| -> R<usize> {
        let mut e: u64 = 1;
        for (&s, &st) in sizes.iter().zip(strides) {
            e = (s as u64 - 1).checked_mul(st).and_then(|x| x.checked_add(e)).ok_or_else(|| op.bad())?;
        }
        if e > MAX_TENSOR_ELEMS {
            return Err(op.bad());
        }
        Ok(e as usize)
    };
    let rank = d.rank as usize;
    let src_ext = extent(op, &d.src_strides[..rank])?;
    let dst_ext = extent(op, &d.dst_strides[..rank])?;
    let (mut src_strides, mut dst_strides) = ([0isize; 6], [0isize; 6]);
    for i in 0..rank {
        (src_strides[i], dst_strides[i]) = (d.src_strides[i] as isize, d.dst_strides[i] as isize);
    }
    let (src_strides, dst_strides) = (&src_strides[..rank], &dst_strides[..rank]);
    let src = op.input(d.src_va, src_ext)?;
    // The destination box may have gaps that must keep their contents.
    let mut dst = op.output(d.dst_va, dst_ext, true)?;
    let p = k::StridedCopy { sizes: &sizes, src_offset: 0, src_strides, dst_offset: 0, dst_strides };
    let r = k::strided_copy(&p, &src, dst.buf());
    op.kernel(r)?;
    dst.commit();
    Ok(n as u64)
}
