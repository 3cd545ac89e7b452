//! Custom operators written in Triton: a node of the `rbln.triton` domain
//! carries a kernel's TTIR and runs as one TILE op between built-in ops.
//!
//! Attributes:
//! - `ttir` (string, required): the kernel's TTIR, as triton prints it
//!   (`rbln.triton.Kernel.ttir`); `kernel` (string): which function, when
//!   the module has several.
//! - `grid` (ints, 1 to 3 values ≥ 1, required): the launch grid.
//! - `int_args` (ints), `float_args` (floats): the kernel's integer and
//!   f32 scalar arguments, each list in argument order.
//! - `output_shapes` (ints): each output's rank then its dims (`[2, 64,
//!   32]` is one output of shape [64, 32]); without it every output has
//!   the first input's shape.
//!
//! The kernel's pointer arguments take the node's inputs, then its
//! outputs, in order. An input is only read (a kernel storing into it is
//! refused); an output starts as zeros and must be stored to.

use super::*;
use crate::ttir::{self, BufBind, LaunchArg, Scalar};
use rbln_hw::tile::TileType;

/// The ONNX domain of Triton custom operators.
pub(super) const DOMAIN: &str = "rbln.triton";

impl Importer {
    pub(super) fn lower_triton(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let text = cx.string("ttir").ok_or_else(|| cx.err("a rbln.triton node needs the attribute 'ttir' (the kernel's TTIR text)"))?;
        let module = ttir::parse(&text).map_err(|e| cx.err(e.to_string()))?;
        let k = ttir::lower(&module, cx.string("kernel").as_deref()).map_err(|e| cx.err(e.to_string()))?;
        let grid_attr = cx.ints("grid").ok_or_else(|| cx.err("needs the attribute 'grid' (1 to 3 program counts)"))?;
        if grid_attr.is_empty() || grid_attr.len() > 3 || grid_attr.iter().any(|&g| g < 1 || g > u32::MAX as i64) {
            return Err(cx.err(format!("grid {grid_attr:?}: 1 to 3 program counts, each >= 1")));
        }
        let mut grid = [1u32; 3];
        for (g, &v) in grid.iter_mut().zip(&grid_attr) {
            *g = v as u32;
        }
        let int_args = cx.ints("int_args").unwrap_or_default();
        let float_args = cx.attr("float_args").map(|a| a.floats.clone()).unwrap_or_default();
        let outputs = cx.n.output.len();
        let shapes = self.triton_output_shapes(cx, ins, outputs)?;
        let (mut next_in, mut next_out, mut next_int, mut next_float) = (0, 0, 0, 0);
        let mut args = Vec::with_capacity(k.args.len());
        for arg in &k.args {
            args.push(match arg {
                ttir::KernelArg::Buffer { name, .. } => {
                    if next_in < ins.len() {
                        let v = ins[next_in].ok_or_else(|| cx.err(format!("input {next_in} (for kernel argument {name}) is empty")))?;
                        next_in += 1;
                        LaunchArg::Buffer(BufBind::Input(v))
                    } else if next_out < outputs {
                        next_out += 1;
                        LaunchArg::Buffer(BufBind::Output { name: Self::out_name(cx, next_out - 1), shape: shapes[next_out - 1].clone() })
                    } else {
                        return Err(cx.err(format!("kernel {} has more pointer arguments than the node has inputs and outputs ({} + {outputs})", k.name, ins.len())));
                    }
                }
                ttir::KernelArg::Param { name, dtype, .. } if *dtype == TileType::F32 => {
                    let v = float_args.get(next_float).ok_or_else(|| cx.err(format!("kernel argument {name} (fp32): float_args has only {} values", float_args.len())))?;
                    next_float += 1;
                    LaunchArg::Scalar(Scalar::Float(*v as f64))
                }
                ttir::KernelArg::Param { name, .. } => {
                    let v = int_args.get(next_int).ok_or_else(|| cx.err(format!("kernel argument {name} (integer): int_args has only {} values", int_args.len())))?;
                    next_int += 1;
                    LaunchArg::Scalar(Scalar::Int(*v))
                }
            });
        }
        if next_in != ins.len() || next_out != outputs || next_int != int_args.len() || next_float != float_args.len() {
            return Err(cx.err(format!(
                "kernel {} takes {} pointers, {} integers and {} floats; the node gives {} inputs + {} outputs, {} int_args and {} float_args",
                k.name,
                next_in + next_out,
                next_int,
                next_float,
                ins.len(),
                outputs,
                int_args.len(),
                float_args.len()
            )));
        }
        ttir::add_launch(&mut self.g, &k, &cx.name, grid, &args).map_err(|e| cx.err(e.to_string()))
    }

    /// Each output's shape: from `output_shapes`, or the first input's.
    fn triton_output_shapes(&self, cx: &Cx, ins: &[Option<ValueId>], outputs: usize) -> Result<Vec<Vec<u64>>> {
        let Some(flat) = cx.ints("output_shapes") else {
            let first = ins.first().copied().flatten().ok_or_else(|| cx.err("no input to take the output shape from: give output_shapes"))?;
            return Ok(vec![self.g.values[first].shape.clone(); outputs]);
        };
        let mut shapes = Vec::new();
        let mut rest = flat.as_slice();
        while let Some((&rank, tail)) = rest.split_first() {
            let rank = usize::try_from(rank).ok().filter(|&r| r <= tail.len()).ok_or_else(|| cx.err(format!("output_shapes {flat:?}: a rank runs past the list")))?;
            if tail[..rank].iter().any(|&d| d < 1) {
                return Err(cx.err(format!("output_shapes {flat:?}: dims must be >= 1")));
            }
            shapes.push(tail[..rank].iter().map(|&d| d as u64).collect());
            rest = &tail[rank..];
        }
        if shapes.len() != outputs {
            return Err(cx.err(format!("output_shapes gives {} shapes for {outputs} outputs", shapes.len())));
        }
        Ok(shapes)
    }
}
