//! Compute cores: decode a descriptor, check every shape against the
//! sizes, read the operands through the context's MMU, run the kernel,
//! write the result back.
//!
//! Any inconsistency is a `BadDescriptor` fault at the descriptor's VA;
//! operands are read (and translated) before anything is computed, and the
//! output range is checked before it is written, so a faulting op leaves
//! its output untouched.

use rbln_hw::ops::{self, Binary, Desc, Unary};
use rbln_hw::ring::{Access, FaultCode};
use rbln_kernels as k;

use crate::mmu::{AddressSpace, Fault};

pub use rbln_hw::ops::MAX_DESC_SIZE;
/// Largest tensor one operand may have (elements): bounds the memory a
/// hostile descriptor can make the device allocate.
const MAX_TENSOR_ELEMS: u64 = 256 << 20;
/// Most work one descriptor may ask for (nominal FLOPs): bounds the time a
/// hostile descriptor can occupy a compute core, and so how long a queue
/// reset can take to complete (~1.5 s at this machine's GEMM speed).
const MAX_FLOPS: u64 = 1 << 38;

struct Op<'a, 'm> {
    mem: &'a mut AddressSpace<'m>,
    desc_va: u64,
}

type R<T> = Result<T, Fault>;

impl Op<'_, '_> {
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

    fn read(&mut self, va: u64, count: usize) -> R<Vec<f32>> {
        if !va.is_multiple_of(4) {
            return Err(Fault::new(FaultCode::Alignment, Access::Read, va));
        }
        self.mem.read_f32s(va, count)
    }

    fn write(&mut self, va: u64, data: &[f32]) -> R<()> {
        if !va.is_multiple_of(4) {
            return Err(Fault::new(FaultCode::Alignment, Access::Write, va));
        }
        // All or nothing: check the whole output before writing any of it.
        self.mem.check(va, data.len() as u64 * 4, Access::Write)?;
        self.mem.write_f32s(va, data)
    }

    fn flops(&self, parts: &[u64]) -> R<u64> {
        let f = parts.iter().try_fold(1u64, |a, &b| a.checked_mul(b)).ok_or_else(|| self.bad())?;
        if f > MAX_FLOPS {
            return Err(self.bad());
        }
        Ok(f)
    }
}

fn dims(d: &[u32], rank: u32) -> Vec<usize> {
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
        // Descriptor decoding only lets activation codes through.
        _ => k::Activation::None,
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
    let mut op = Op { mem, desc_va };
    match desc {
        Desc::Gemm(d) => gemm(&mut op, &d),
        Desc::Conv2d(d) => conv2d(&mut op, &d),
        Desc::Pool(d) => pool(&mut op, &d),
        Desc::Binary(d) => {
            let (ad, bd) = (dims(&d.a_dims, d.rank), dims(&d.b_dims, d.rank));
            let out_shape = op.kernel(k::broadcast_shape(&ad, &bd))?;
            let (na, nb, no) = (op.volume(&ad)?, op.volume(&bd)?, op.volume(&out_shape)?);
            let flops = op.flops(&[no as u64])?;
            let a = op.read(d.a_va, na)?;
            let b = op.read(d.b_va, nb)?;
            let mut out = vec![0f32; no];
            let kind = match Binary::from_u32(d.kind) {
                Some(Binary::Add) => k::BinaryOp::Add,
                Some(Binary::Sub) => k::BinaryOp::Sub,
                Some(Binary::Mul) => k::BinaryOp::Mul,
                Some(Binary::Div) => k::BinaryOp::Div,
                Some(Binary::Max) => k::BinaryOp::Max,
                Some(Binary::Min) => k::BinaryOp::Min,
                Some(Binary::Pow) => k::BinaryOp::Pow,
                None => return Err(bad),
            };
            op.kernel(k::binary(kind, &a, &ad, &b, &bd, &mut out))?;
            op.write(d.out_va, &out)?;
            Ok(flops)
        }
        Desc::Unary(d) => {
            let n = usize::try_from(d.count).map_err(|_| bad)?;
            op.volume(&[n])?;
            let mut x = op.read(d.in_va, n)?;
            let u = Unary::from_u32(d.kind).ok_or(bad)?;
            if let Some(u) = unary_op(u, d.param0, d.param1) {
                op.kernel(k::unary_inplace(u, &mut x))?;
            }
            op.write(d.out_va, &x)?;
            Ok(n as u64)
        }
        Desc::Softmax(d) => {
            let shape = dims(&d.dims, d.rank);
            let n = op.volume(&shape)?;
            let x = op.read(d.in_va, n)?;
            let mut y = vec![0f32; n];
            op.kernel(k::softmax(&shape, d.axis as isize, &x, &mut y))?;
            op.write(d.out_va, &y)?;
            Ok(5 * n as u64)
        }
        Desc::LayerNorm(d) => {
            let (rows, cols) = (d.rows as usize, d.cols as usize);
            let n = op.volume(&[rows, cols])?;
            let x = op.read(d.in_va, n)?;
            let gamma = if d.flags & ops::LAYERNORM_GAMMA != 0 { Some(op.read(d.gamma_va, cols)?) } else { None };
            let beta = if d.flags & ops::LAYERNORM_BETA != 0 { Some(op.read(d.beta_va, cols)?) } else { None };
            let mut y = vec![0f32; n];
            op.kernel(k::layer_norm(&x, cols, gamma.as_deref(), beta.as_deref(), d.epsilon, &mut y))?;
            op.write(d.out_va, &y)?;
            Ok(8 * n as u64)
        }
        Desc::Reduce(d) => {
            let shape = dims(&d.dims, d.rank);
            let n = op.volume(&shape)?;
            let mut out_shape = shape.clone();
            out_shape.remove(d.axis as usize);
            let out_n = op.volume(&out_shape)?;
            let x = op.read(d.in_va, n)?;
            let mut y = vec![0f32; out_n];
            let kind = match d.kind {
                ops::REDUCE_SUM => k::ReduceOp::Sum,
                ops::REDUCE_MEAN => k::ReduceOp::Mean,
                ops::REDUCE_MAX => k::ReduceOp::Max,
                _ => k::ReduceOp::Min,
            };
            op.kernel(k::reduce(kind, &shape, d.axis as isize, &x, &mut y))?;
            op.write(d.out_va, &y)?;
            Ok(n as u64)
        }
        Desc::Transpose(d) => {
            let shape = dims(&d.dims, d.rank);
            let perm: Vec<usize> = d.perm[..d.rank as usize].iter().map(|&p| p as usize).collect();
            let n = op.volume(&shape)?;
            let x = op.read(d.in_va, n)?;
            let mut y = vec![0f32; n];
            op.kernel(k::permute(&shape, &perm, &x, &mut y))?;
            op.write(d.out_va, &y)?;
            Ok(n as u64)
        }
        Desc::StridedCopy(d) => strided_copy(&mut op, &d),
        Desc::Gather(d) => {
            let shape = dims(&d.dims, d.rank);
            let ni = usize::try_from(d.num_indices).map_err(|_| bad)?;
            let out_shape = op.kernel(k::gather_output_shape(&shape, d.axis as isize, &[ni]))?;
            let (n, no) = (op.volume(&shape)?, op.volume(&out_shape)?);
            op.volume(&[ni, 2])?;
            let align = if d.index_type == ops::GATHER_INDEX_I32 { 4 } else { 8 };
            if d.indices_va % align != 0 {
                return Err(Fault::new(FaultCode::Alignment, Access::Read, d.indices_va));
            }
            let data = op.read(d.data_va, n)?;
            let mut out = vec![0f32; no];
            if d.index_type == ops::GATHER_INDEX_I32 {
                let raw = op.mem.read_vec(d.indices_va, ni * 4)?;
                let idx: Vec<i32> = raw.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                op.kernel(k::gather(&data, &shape, d.axis as isize, &idx, &[ni], &mut out))?;
            } else {
                let raw = op.mem.read_vec(d.indices_va, ni * 8)?;
                let idx: Vec<i64> =
                    raw.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
                op.kernel(k::gather(&data, &shape, d.axis as isize, &idx, &[ni], &mut out))?;
            }
            op.write(d.out_va, &out)?;
            Ok(no as u64)
        }
    }
}

fn padding(top: u32, left: u32, bottom: u32, right: u32) -> k::Padding2d {
    k::Padding2d { top: top as usize, left: left as usize, bottom: bottom as usize, right: right as usize }
}

fn gemm(op: &mut Op<'_, '_>, d: &ops::GemmDesc) -> R<u64> {
    let (m, n, kk, batch) = (d.m as usize, d.n as usize, d.k as usize, d.batch as usize);
    let flops = op.flops(&[2, m as u64, n as u64, kk as u64, batch as u64])?;
    if batch == 0 {
        return Ok(0);
    }
    let (a_len, b_len, c_len) = (op.volume(&[m, kk])?, op.volume(&[kk, n])?, op.volume(&[m, n])?);
    // Extent of each operand over the batch: (batch-1)*stride + matrix.
    let extent = |op: &Op<'_, '_>, stride: u64, len: usize| -> R<usize> {
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
    let a = op.read(d.a_va, a_ext)?;
    let b = op.read(d.b_va, b_ext)?;
    let bias = if d.flags & ops::GEMM_BIAS != 0 { Some(op.read(d.bias_va, n)?) } else { None };
    let accumulate = d.flags & ops::GEMM_ACCUMULATE != 0;
    // C is read back when its old contents matter: accumulation, or gaps
    // between batch matrices that must survive the write.
    let gaps = batch > 1 && d.c_batch_stride as usize != c_len;
    let mut c = if accumulate || gaps { op.read(d.c_va, c_ext)? } else { vec![0f32; c_ext] };
    let p = k::GemmParams {
        m,
        n,
        k: kk,
        trans_a: d.flags & ops::GEMM_TRANS_A != 0,
        trans_b: d.flags & ops::GEMM_TRANS_B != 0,
        accumulate,
        activation: activation(d.activation, d.act_param0, d.act_param1),
    };
    for i in 0..batch {
        let (ao, bo, co) =
            (i * d.a_batch_stride as usize, i * d.b_batch_stride as usize, i * d.c_batch_stride as usize);
        let r = k::gemm(&p, &a[ao..ao + a_len], &b[bo..bo + b_len], bias.as_deref(), &mut c[co..co + c_len]);
        op.kernel(r)?;
    }
    op.write(d.c_va, &c)?;
    Ok(flops)
}

fn conv2d(op: &mut Op<'_, '_>, d: &ops::Conv2dDesc) -> R<u64> {
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
    let n_in = op.volume(&[p.batch, p.in_channels, p.in_h, p.in_w])?;
    let n_w = op.volume(&[p.out_channels, cin_g, p.kernel[0], p.kernel[1]])?;
    let n_out = op.volume(&out_shape)?;
    let flops = op.flops(&[2, n_out as u64, cin_g as u64, p.kernel[0] as u64, p.kernel[1] as u64])?;
    let input = op.read(d.input_va, n_in)?;
    let weight = op.read(d.weight_va, n_w)?;
    let bias = if d.flags & ops::CONV_BIAS != 0 { Some(op.read(d.bias_va, p.out_channels)?) } else { None };
    let mut out = vec![0f32; n_out];
    op.kernel(k::conv2d(&p, &input, &weight, bias.as_deref(), &mut out))?;
    op.write(d.output_va, &out)?;
    Ok(flops)
}

fn pool(op: &mut Op<'_, '_>, d: &ops::PoolDesc) -> R<u64> {
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
    let input = op.read(d.input_va, n_in)?;
    let mut out = vec![0f32; n_out];
    op.kernel(k::pool2d(&p, &input, &mut out))?;
    op.write(d.output_va, &out)?;
    Ok(flops)
}

fn strided_copy(op: &mut Op<'_, '_>, d: &ops::StridedCopyDesc) -> R<u64> {
    let sizes = dims(&d.sizes, d.rank);
    let n = op.volume(&sizes)?;
    if n == 0 {
        return Ok(0);
    }
    // Extent (elements) covered by a box with these strides.
    let extent = |op: &Op<'_, '_>, strides: &[u64]| -> R<usize> {
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
    let src_strides: Vec<isize> = d.src_strides[..rank].iter().map(|&s| s as isize).collect();
    let dst_strides: Vec<isize> = d.dst_strides[..rank].iter().map(|&s| s as isize).collect();
    let src = op.read(d.src_va, src_ext)?;
    // The destination box may have gaps that must keep their contents.
    let mut dst = op.read(d.dst_va, dst_ext)?;
    let p = k::StridedCopy { sizes: &sizes, src_offset: 0, src_strides: &src_strides, dst_offset: 0, dst_strides: &dst_strides };
    op.kernel(k::strided_copy(&p, &src, &mut dst))?;
    op.write(d.dst_va, &dst)?;
    Ok(n as u64)
}
