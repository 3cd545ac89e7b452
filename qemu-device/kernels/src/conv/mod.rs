//! 2-D convolution (NCHW) with fused bias and activation.

mod depthwise;
mod direct;
pub(crate) mod dw_rows;
pub(crate) mod gemm;
mod phases;
pub(crate) mod winograd;
pub use winograd::conv2d_winograd;

use crate::activation::Activation;
use crate::error::{KernelError, Result};
use crate::fastmath::simd_dispatch;
use crate::util::{add, check_len, mul, valid_range, volume};

/// Explicit padding of the two spatial dimensions, in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Padding2d {
    pub top: usize,
    pub left: usize,
    pub bottom: usize,
    pub right: usize,
}

impl Padding2d {
    /// The same padding on all four sides.
    pub fn uniform(p: usize) -> Self {
        Padding2d {
            top: p,
            left: p,
            bottom: p,
            right: p,
        }
    }
}

/// Parameters of [`conv2d`].
///
/// Shapes: input `[batch, in_channels, in_h, in_w]`, weight
/// `[out_channels, in_channels / groups, kernel[0], kernel[1]]`, bias
/// `[out_channels]`, output `[batch, out_channels, out_h, out_w]` with
/// `out = (in + pad_before + pad_after - dilation·(kernel-1) - 1) / stride + 1`
/// (floor). `[h, w]` order for all pairs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conv2dParams {
    pub batch: usize,
    pub in_channels: usize,
    pub in_h: usize,
    pub in_w: usize,
    pub out_channels: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: Padding2d,
    pub dilation: [usize; 2],
    /// Must divide both channel counts (`groups = in_channels = out_channels`
    /// is depthwise).
    pub groups: usize,
    pub activation: Activation,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams {
            batch: 1,
            in_channels: 1,
            in_h: 1,
            in_w: 1,
            out_channels: 1,
            kernel: [1, 1],
            stride: [1, 1],
            padding: Padding2d::default(),
            dilation: [1, 1],
            groups: 1,
            activation: Activation::None,
        }
    }
}

/// One spatial dimension's window geometry, validated.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Axis {
    pub input: usize,
    pub pad_before: usize,
    pub kernel: usize,
    pub stride: usize,
    pub dilation: usize,
    pub output: usize,
}

impl Axis {
    /// Validates a window geometry. The whole padded extent must fit in
    /// `isize` so that all window arithmetic below is overflow-free.
    pub(crate) fn new(
        what: &'static str,
        input: usize,
        pad_before: usize,
        pad_after: usize,
        kernel: usize,
        stride: usize,
        dilation: usize,
    ) -> Result<Axis> {
        if kernel == 0 {
            return Err(KernelError::invalid(what, "kernel size is zero"));
        }
        if stride == 0 {
            return Err(KernelError::invalid(what, "stride is zero"));
        }
        if dilation == 0 {
            return Err(KernelError::invalid(what, "dilation is zero"));
        }
        let padded = add(what, add(what, input, pad_before)?, pad_after)?;
        if padded > isize::MAX as usize {
            return Err(KernelError::Overflow { what });
        }
        let extent = add(what, mul(what, dilation, kernel - 1)?, 1)?;
        if extent > padded {
            return Err(KernelError::invalid(
                what,
                format!("window extent {extent} exceeds padded input size {padded}"),
            ));
        }
        Ok(Axis {
            input,
            pad_before,
            kernel,
            stride,
            dilation,
            output: (padded - extent) / stride + 1,
        })
    }

    /// Input coordinate of tap 0 of output position `o`, minus padding.
    #[inline(always)]
    pub(crate) fn base(&self, o: usize) -> isize {
        (o * self.stride) as isize - self.pad_before as isize
    }

    /// Range of output positions `o` for which tap `t` reads a real input.
    #[inline(always)]
    pub(crate) fn valid_outputs(&self, t: usize) -> core::ops::Range<usize> {
        let base = (t * self.dilation) as isize - self.pad_before as isize;
        valid_range(base, self.stride, self.output, self.input)
    }

    /// Input index of tap `t` of output `o` (only meaningful when valid).
    #[inline(always)]
    pub(crate) fn input_index(&self, o: usize, t: usize) -> isize {
        self.base(o) + (t * self.dilation) as isize
    }
}

/// Validated conv geometry.
pub(crate) struct Geometry {
    pub(crate) h: Axis,
    pub(crate) w: Axis,
    pub(crate) cg: usize,
    pub(crate) og: usize,
    pub(crate) in_plane: usize,
    pub(crate) out_plane: usize,
    pub(crate) kdim: usize,
}

pub(crate) fn geometry(p: &Conv2dParams) -> Result<Geometry> {
    let pad = p.padding;
    let h = Axis::new("conv2d height", p.in_h, pad.top, pad.bottom, p.kernel[0], p.stride[0], p.dilation[0])?;
    let w = Axis::new("conv2d width", p.in_w, pad.left, pad.right, p.kernel[1], p.stride[1], p.dilation[1])?;
    if p.groups == 0 {
        return Err(KernelError::invalid("conv2d groups", "groups is zero"));
    }
    if !p.in_channels.is_multiple_of(p.groups) || !p.out_channels.is_multiple_of(p.groups) {
        return Err(KernelError::invalid(
            "conv2d groups",
            format!(
                "groups {} does not divide in_channels {} and out_channels {}",
                p.groups, p.in_channels, p.out_channels
            ),
        ));
    }
    let cg = p.in_channels / p.groups;
    let kdim = volume("conv2d weight", &[cg, p.kernel[0], p.kernel[1]])?;
    Ok(Geometry {
        h,
        w,
        cg,
        og: p.out_channels / p.groups,
        in_plane: mul("conv2d input", p.in_h, p.in_w)?,
        out_plane: mul("conv2d output", h.output, w.output)?,
        kdim,
    })
}

/// Output shape `[batch, out_channels, out_h, out_w]` of `p`, validating it.
pub fn conv2d_output_shape(p: &Conv2dParams) -> Result<[usize; 4]> {
    let g = geometry(p)?;
    Ok([p.batch, p.out_channels, g.h.output, g.w.output])
}

/// `output = act(conv(input, weight) + bias)`; see [`Conv2dParams`] for shapes.
///
/// Convolutions with more than one input channel per group run as parallel
/// tasks of (image, group, tile of output positions), each an im2col into a
/// cache-sized buffer plus a GEMM (1×1 stride-1 unpadded ones skip
/// im2col); 3×3 stride-1 ones with enough channels and output positions
/// use Winograd's F(2×2, 3×3) (2.25× fewer multiply-adds); those with one
/// input channel per group (depthwise) use a direct SIMD loop parallel
/// over output planes. Runs on the current rayon pool.
pub fn conv2d(p: &Conv2dParams, input: &[f32], weight: &[f32], bias: Option<&[f32]>, output: &mut [f32]) -> Result<()> {
    conv2d_residual(p, input, weight, bias, None, output)
}

/// `output = act(conv(input, weight) + bias + residual)`: [`conv2d`] with a
/// residual (skip connection) of the output's shape (NCHW, same layout)
/// added in the same pass as the bias, before the activation, while each
/// output tile is still in cache.
pub fn conv2d_residual(
    p: &Conv2dParams,
    input: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    output: &mut [f32],
) -> Result<()> {
    let g = geometry(p)?;
    check_len("conv2d weight", weight.len(), mul("conv2d weight", p.out_channels, g.kdim)?)?;
    check_operands(p, &g, input, bias, residual, output)?;
    if output.is_empty() {
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    let direct = g.cg > 1 && direct::applies(p, &g);
    #[cfg(not(target_arch = "x86_64"))]
    let direct = false;
    if g.cg == 1 {
        depthwise::direct(p, &g, input, weight, bias, residual, output);
    } else if direct {
        #[cfg(target_arch = "x86_64")]
        direct::conv(p, &g, input, weight, bias, residual, output);
    } else if winograd::applies(p, &g) {
        winograd::conv(p, &g, input, weight, bias, residual, output);
    } else {
        gemm::conv_gemm(p, &g, input, weight, bias, residual, output);
    }
    Ok(())
}

/// The lengths of a conv's operands other than its weights (whose layout
/// depends on the path: [`conv2d_residual`], [`conv2d_winograd`]).
pub(crate) fn check_operands(p: &Conv2dParams, g: &Geometry, input: &[f32], bias: Option<&[f32]>, residual: Option<&[f32]>, output: &[f32]) -> Result<()> {
    check_len("conv2d input", input.len(), volume("conv2d input", &[p.batch, p.in_channels, g.in_plane])?)?;
    check_len("conv2d output", output.len(), volume("conv2d output", &[p.batch, p.out_channels, g.out_plane])?)?;
    if let Some(b) = bias {
        check_len("conv2d bias", b.len(), p.out_channels)?;
    }
    if let Some(r) = residual {
        check_len("conv2d residual", r.len(), output.len())?;
    }
    Ok(())
}

/// `dst[j] = src[j·stride]` (`src` holds at least `(dst.len() - 1)·stride + 1`
/// elements; `stride ≥ 1`).
#[inline]
pub(crate) fn gather_strided(dst: &mut [f32], src: &[f32], stride: usize) {
    let n = dst.len();
    if n == 0 {
        return;
    }
    if stride == 1 {
        copy_row(dst, src);
        return;
    }
    gather_strided_simd(dst, src, stride);
}

/// `dst.copy_from_slice(&src[..dst.len()])`, without a call into `memcpy`
/// for the short rows of small maps (a 14-float row: `memcpy`'s call and
/// size dispatch cost more than the copy).
#[inline]
pub(crate) fn copy_row(dst: &mut [f32], src: &[f32]) {
    let n = dst.len();
    let src = &src[..n];
    #[cfg(target_arch = "x86_64")]
    if n <= 64 && crate::fastmath::has_avx512() {
        // SAFETY: AVX-512 F is present; both slices hold `n` floats.
        unsafe { copy_row_avx512(dst.as_mut_ptr(), src.as_ptr(), n) };
        return;
    }
    dst.copy_from_slice(src);
}

/// # Safety
/// AVX-512 F; `src` readable and `dst` writable for `n` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn copy_row_avx512(dst: *mut f32, src: *const f32, n: usize) {
    use core::arch::x86_64::*;
    let mut i = 0;
    // SAFETY: every access is below `n` (the tail through a mask).
    unsafe {
        while i + 16 <= n {
            _mm512_storeu_ps(dst.add(i), _mm512_loadu_ps(src.add(i)));
            i += 16;
        }
        if i < n {
            let m: __mmask16 = (1u16 << (n - i)) - 1;
            _mm512_mask_storeu_ps(dst.add(i), m, _mm512_maskz_loadu_ps(m, src.add(i)));
        }
    }
}

simd_dispatch! {
    /// [`gather_strided`] for `stride ≥ 2`, `dst` non-empty: whole
    /// `stride`-element chunks, which vectorize as interleaved loads.
    fn gather_strided_simd(dst: &mut [f32], src: &[f32], stride: usize) {
        let n = dst.len();
        let (body, last) = dst.split_at_mut(n - 1);
        let full = &src[..(n - 1) * stride];
        if stride == 2 {
            for (v, c) in body.iter_mut().zip(full.chunks_exact(2)) {
                *v = c[0];
            }
        } else {
            for (v, c) in body.iter_mut().zip(full.chunks_exact(stride)) {
                *v = c[0];
            }
        }
        last[0] = src[(n - 1) * stride];
    }
}
