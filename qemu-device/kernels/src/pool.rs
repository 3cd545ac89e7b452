//! 2-D max / average pooling (NCHW).

use crate::conv::{Axis, Padding2d};
use crate::error::Result;
use crate::util::{check_len, mul, volume};
use rayon::prelude::*;

/// Pooling reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// Maximum over the window's real (non-padding) elements; `-inf` if the
    /// window covers padding only.
    Max,
    /// Mean over the window. With `count_include_pad` the divisor is
    /// `kernel[0]·kernel[1]` (padding counts as zeros), otherwise the number
    /// of real elements in the window (0 of them gives 0).
    Avg { count_include_pad: bool },
}

/// Parameters of [`pool2d`].
///
/// Input `[batch, channels, in_h, in_w]`, output
/// `[batch, channels, out_h, out_w]`, output sizes as for
/// [`Conv2dParams`](crate::Conv2dParams) (floor mode). Global average pooling
/// is `Avg` with `kernel = [in_h, in_w]`, stride 1, no padding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pool2dParams {
    pub batch: usize,
    pub channels: usize,
    pub in_h: usize,
    pub in_w: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: Padding2d,
    pub dilation: [usize; 2],
    pub kind: PoolKind,
}

impl Default for Pool2dParams {
    fn default() -> Self {
        Pool2dParams {
            batch: 1,
            channels: 1,
            in_h: 1,
            in_w: 1,
            kernel: [1, 1],
            stride: [1, 1],
            padding: Padding2d::default(),
            dilation: [1, 1],
            kind: PoolKind::Max,
        }
    }
}

fn axes(p: &Pool2dParams) -> Result<(Axis, Axis)> {
    let pad = p.padding;
    Ok((
        Axis::new("pool2d height", p.in_h, pad.top, pad.bottom, p.kernel[0], p.stride[0], p.dilation[0])?,
        Axis::new("pool2d width", p.in_w, pad.left, pad.right, p.kernel[1], p.stride[1], p.dilation[1])?,
    ))
}

/// Output shape `[batch, channels, out_h, out_w]` of `p`, validating it.
pub fn pool2d_output_shape(p: &Pool2dParams) -> Result<[usize; 4]> {
    let (h, w) = axes(p)?;
    Ok([p.batch, p.channels, h.output, w.output])
}

/// Max or average pooling; see [`Pool2dParams`]. Parallel over planes.
pub fn pool2d(p: &Pool2dParams, input: &[f32], output: &mut [f32]) -> Result<()> {
    let (ha, wa) = axes(p)?;
    let in_plane = mul("pool2d input", p.in_h, p.in_w)?;
    let out_plane = mul("pool2d output", ha.output, wa.output)?;
    let window = mul("pool2d window", p.kernel[0], p.kernel[1])?;
    check_len("pool2d input", input.len(), volume("pool2d input", &[p.batch, p.channels, in_plane])?)?;
    check_len("pool2d output", output.len(), volume("pool2d output", &[p.batch, p.channels, out_plane])?)?;
    if output.is_empty() {
        return Ok(());
    }
    let kind = p.kind;
    output
        .par_chunks_mut(out_plane)
        .enumerate()
        .for_each(|(plane, out)| {
            let inp = &input[plane * in_plane..][..in_plane];
            for oy in 0..ha.output {
                let ky_range = crate::util::valid_range(ha.base(oy), ha.dilation, ha.kernel, ha.input);
                let orow = &mut out[oy * wa.output..][..wa.output];
                for (ox, o) in orow.iter_mut().enumerate() {
                    let kx_range = crate::util::valid_range(wa.base(ox), wa.dilation, wa.kernel, wa.input);
                    let ix0 = wa.base(ox);
                    let mut acc = match kind {
                        PoolKind::Max => f32::NEG_INFINITY,
                        PoolKind::Avg { .. } => 0.0,
                    };
                    for ky in ky_range.clone() {
                        let iy = ha.input_index(oy, ky) as usize;
                        let row = &inp[iy * wa.input..][..wa.input];
                        match kind {
                            PoolKind::Max => {
                                for kx in kx_range.clone() {
                                    acc = acc.max(row[(ix0 + (kx * wa.dilation) as isize) as usize]);
                                }
                            }
                            PoolKind::Avg { .. } => {
                                for kx in kx_range.clone() {
                                    acc += row[(ix0 + (kx * wa.dilation) as isize) as usize];
                                }
                            }
                        }
                    }
                    *o = match kind {
                        PoolKind::Max => acc,
                        PoolKind::Avg { count_include_pad: true } => acc / window as f32,
                        PoolKind::Avg { count_include_pad: false } => {
                            let count = ky_range.len() * kx_range.len();
                            if count == 0 {
                                0.0
                            } else {
                                acc / count as f32
                            }
                        }
                    };
                }
            }
        });
    Ok(())
}
