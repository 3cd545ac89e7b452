//! fp32 and int8 compute kernels of the rbln virtual NPU's compute cores.
//!
//! Every kernel takes plain row-major slices (`&[f32]` / `&mut [f32]`;
//! bytes for the int8 kernels, i32 and i64 where a type says so) plus
//! explicit dimensions, validates all of them (with checked arithmetic: the
//! values come from an untrusted guest) and returns
//! [`KernelError`] instead of panicking. On error nothing has been written.
//! Zero-sized dimensions are accepted wherever the result is well defined
//! (they produce an empty output); zero strides, kernels, dilations or
//! groups are errors.
//!
//! # Threading
//! Kernels are data-parallel on the **current rayon thread pool**: rayon's
//! global pool by default (one thread per core), or the pool whose
//! [`ThreadPool::install`](rayon::ThreadPool::install) the call runs in. To
//! bound the threads the device uses, build a pool with [`thread_pool`] and
//! call the kernels inside `pool.install(|| ...)`. The GEMM core (the `gemm`
//! crate) uses the same pool. Memory-bound element-wise kernels on small
//! tensors (up to 32 Ki elements) run on the calling thread, where waking
//! the pool would cost more than it saves.
//!
//! # Performance notes
//! - Fused epilogues (bias, residual, activation) are applied block by
//!   block right after each output tile is computed, while it is in cache.
//! - Convolutions with several input channels per group run as independent
//!   (image, group, tile of output positions) tasks: im2col into a reused
//!   per-thread buffer plus a single-threaded GEMM. Depthwise ones split the
//!   padded input plane into its stride phases so that every tap is a
//!   contiguous shifted window, summed in registers.
//! - Loops with transcendental functions are compiled twice and picked at
//!   run time: AVX2+FMA (fused multiply-adds in the polynomials) or the
//!   baseline target.
//!
//! # Kernels
//! - [`gemm`]: `C = act(op(A)·op(B) + bias (+ C))`; [`gemm_residual`] also
//!   adds a residual of `C`'s shape in the same pass
//! - [`conv2d`]: NCHW convolution with stride, padding, dilation, groups;
//!   [`conv2d_residual`] also adds a residual of the output's shape
//! - [`pool2d`]: max / average pooling
//! - [`binary`]: broadcasting element-wise Add/Sub/Mul/Div/Max/Min/Pow
//!   and the comparisons Equal/Less/Greater/LessOrEqual/GreaterOrEqual
//!   (1.0 or 0.0); [`binary_act`] fuses an activation
//! - [`where_select`]: `cond ? a : b` with all three operands broadcast
//! - [`unary`], [`unary_inplace`]: element-wise activations and math
//! - [`eltwise`]: a fused program of unary and binary steps over up to
//!   four broadcast inputs, one pass
//! - [`softmax`], [`layer_norm`], [`rms_norm`]
//! - [`reduce`]: Sum/Mean/Max/Min along one axis
//! - [`permute`], [`strided_copy`]
//! - [`gather`]: ONNX Gather with `i32` / `i64` indices
//! - [`resize2d`]: nearest / bilinear resize of NCHW planes
//! - [`cast`]: element-wise conversion between f32, i32, i64 and bool
//!   (the one kernel whose tensors are not all f32)
//! - [`qgemm`], [`qconv2d`]: int8 GEMM / NCHW convolution (u8 or i8
//!   activations, packed i8 weights, zero points, int32 bias), exact in
//!   wrapping int32, requantised to u8 / i8 or dequantised to f32 in the
//!   epilogue; [`quantize`], [`dequantize`]: per-tensor or per-channel
//!   f32 ↔ int8

mod activation;
mod binary;
mod cast;
mod conv;
mod copy;
mod eltwise;
mod error;
mod fastmath;
mod gather;
mod gemm;
mod grid_sample;
mod microkernel;
mod pool;
mod qgemm;
mod recurrent;
mod reduce;
mod resize;
mod select;
mod softmax;
mod tile;
mod topk;
mod util;

#[cfg(test)]
mod tests;

pub use activation::{activation_inplace, unary, unary_inplace, Activation, UnaryOp};
pub use binary::{binary, binary_act, broadcast_shape, BinaryOp};
pub use cast::{cast, CastDst, CastSrc};
pub use conv::{conv2d, conv2d_output_shape, conv2d_residual, conv2d_winograd, Conv2dParams, Padding2d};
pub use copy::{concat_rows, copy_bytes, permute, strided_copy, ConcatPart, StridedCopy};
pub use eltwise::{eltwise, EltOperand, EltStep, ELT_MAX_INPUTS, ELT_REGS};
pub use error::{KernelError, Result};
pub use gather::{gather, gather_output_shape, GatherIndex};
pub use gemm::{gemm, gemm_residual, GemmParams};
pub use grid_sample::{grid_sample, grid_sample_output_shape, GridMode, GridPadding, GridSampleParams};
pub use pool::{pool2d, pool2d_int8, pool2d_output_shape, Pool2dParams, PoolKind};
pub use qgemm::{dequantize, qbinary, qconv2d, qconv2d_output_shape, qgemm, quantize, QBinaryKind, QConvParams, QDst, QGemmParams, QOperand, QTensor, QGEMM_MAX_K};
pub use recurrent::{recurrent, RecCell, RecurrentInputs, RecurrentParams};
pub use reduce::{arg_reduce, reduce, ReduceOp};
pub use resize::{resize2d, resize2d_output_shape, NearestMode, ResizeAxis, ResizeMode, ResizeParams};
pub use select::{broadcast_shape3, where_select};
pub use softmax::{layer_norm, log_softmax, rms_norm, softmax};
pub use tile::{run_tile, TileFault, TileLaunch, TileMem};
pub use topk::top_k;
pub use util::parallel_tasks;

/// Re-export so callers can use the same rayon version for pools.
pub use rayon;

/// Maximum tensor rank accepted by the shape-generic kernels.
pub const MAX_RANK: usize = 6;

/// A tensor shape of rank at most [`MAX_RANK`], held inline.
pub type Shape = smallvec::SmallVec<[usize; MAX_RANK]>;

/// The widest instruction sets the kernels use on this host, for reports:
/// "avx512-vnni" (AVX-512 GEMM microkernel, int8 by VNNI),
/// "avx512-vnni-amx" (int8 convolutions also on the AMX tile unit), "avx512",
/// "avx2" or "baseline", with " (RBLN_NO_AVX512)" when that variable
/// holds them to AVX2 (the same decisions the kernels take per call).
pub fn isa_summary() -> String {
    let isa = if microkernel::has_wide() {
        match qgemm::kernel::Isa::best() {
            qgemm::kernel::Isa::Amx => "avx512-vnni-amx",
            qgemm::kernel::Isa::Vnni => "avx512-vnni",
            _ => "avx512",
        }
    } else if qgemm::kernel::have_avx2() {
        "avx2"
    } else {
        "baseline"
    };
    let held = if fastmath::avx512_allowed() { "" } else { " (RBLN_NO_AVX512)" };
    format!("{isa}{held}")
}

/// Builds a rayon pool with `threads` worker threads (0 = one per core), in
/// which to `install` kernel calls.
pub fn thread_pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("rbln-kernel-{i}"))
        .build()
        .map_err(|e| KernelError::ThreadPool(e.to_string()))
}
