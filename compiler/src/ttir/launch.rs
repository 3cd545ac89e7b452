//! A Triton kernel launch as a `.rbln` model: one TILE op.
//!
//! Every pointer argument is a model input of the tensor the launch binds
//! to it (named after the argument); every buffer the kernel stores to is
//! also a model output (`NAME.out`), starting from the input's contents,
//! so running the model is exactly the kernel writing into its arrays.
//! Scalar arguments are fixed at compile time (the launch specialises the
//! kernel, as Triton specialises on constexprs).

use rbln_format::DType;
use rbln_hw::tile::TileType;

use super::{lower, parse, KernelArg};
use crate::error::{CompileError, Result};
use crate::ir::{Const, CopyPart, Graph, Kind, Op, TileBuf, ValueId};

/// A scalar argument's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Int(i64),
    Float(f64),
}

/// What the launch binds to one kernel argument, in argument order.
#[derive(Clone, Debug, PartialEq)]
pub enum Binding {
    /// A pointer argument: a tensor of this shape (of the pointer's element
    /// type), named `name` in the model.
    Tensor { name: String, shape: Vec<u64> },
    Scalar(Scalar),
}

/// The `.rbln` dtype of a tile buffer type.
pub fn dtype_of(t: TileType) -> DType {
    match t {
        TileType::I32 => DType::I32,
        TileType::I64 => DType::I64,
        TileType::I1 => DType::Bool,
        _ => DType::F32,
    }
}

/// The parameter bits of `v` for a parameter of type `t`.
fn param_bits(name: &str, v: Scalar, t: TileType) -> Result<u64> {
    let bad = || Err(CompileError::Invalid(format!("kernel argument {name}: {v:?} is not a {t:?} value")));
    Ok(match (v, t) {
        (Scalar::Float(f), TileType::F32) => (f as f32).to_bits() as u64,
        (Scalar::Int(i), TileType::F32) => (i as f32).to_bits() as u64,
        (Scalar::Int(i), TileType::I32) if i32::try_from(i).is_ok() || u32::try_from(i).is_ok() => i as u32 as u64,
        (Scalar::Int(i), TileType::I64) => i as u64,
        (Scalar::Int(i), TileType::I1) if i == 0 || i == 1 => i as u64,
        _ => return bad(),
    })
}

/// The graph of one launch of the kernel in `ttir` (`kernel`: its name,
/// if the module has several functions) over `grid`.
pub fn kernel_graph(ttir: &str, kernel: Option<&str>, grid: [u32; 3], bindings: &[Binding]) -> Result<(Graph, String)> {
    let ttir_err = |e: super::TtirError| CompileError::Invalid(e.to_string());
    let k = lower(&parse(ttir).map_err(ttir_err)?, kernel).map_err(ttir_err)?;
    let invalid = |m: String| CompileError::Invalid(format!("kernel {}: {m}", k.name));
    if bindings.len() != k.args.len() {
        return Err(invalid(format!("takes {} arguments ({}), the launch gives {}", k.args.len(), arg_names(&k.args), bindings.len())));
    }
    if grid.contains(&0) {
        return Err(invalid("a grid dimension is 0".into()));
    }
    let mut g = Graph::default();
    let program_len = k.program.len() as u64;
    let program = g.add_value(&format!("{}.program", k.name), vec![program_len], Some(Const::i64(&[program_len], k.program.iter().map(|&b| b as i64).collect())));
    g.values[program].dtype = DType::U8;
    let mut params = Vec::new();
    // (slot, input value, elements, dtype) of every buffer.
    let mut bufs: Vec<(ValueId, u64, TileType)> = Vec::new();
    for (arg, bind) in k.args.iter().zip(bindings) {
        match (arg, bind) {
            (KernelArg::Buffer { dtype, .. }, Binding::Tensor { name, shape }) => {
                let v = g.add_value(name, shape.clone(), None);
                g.values[v].dtype = dtype_of(*dtype);
                g.inputs.push((name.clone(), v));
                bufs.push((v, g.values[v].elems(), *dtype));
            }
            (KernelArg::Param { name, dtype, .. }, Binding::Scalar(s)) => params.push(param_bits(name, *s, *dtype)?),
            (KernelArg::Buffer { name, .. }, _) => return Err(invalid(format!("argument {name} is a pointer: bind an array to it"))),
            (KernelArg::Param { name, .. }, _) => return Err(invalid(format!("argument {name} is a scalar: bind a number to it"))),
        }
    }
    let stored: Vec<usize> = (0..bufs.len()).filter(|&i| k.stores & (1 << i) != 0).collect();
    let Some(&first) = stored.first() else {
        return Err(invalid("stores to no buffer: it would compute nothing".into()));
    };
    let out_type = bufs[first].2;
    if stored.len() > 1 && (stored.iter().any(|&i| bufs[i].2 != out_type) || out_type.mem_size() != Some(4)) {
        return Err(invalid("stores to several buffers of different or non-32-bit element types; rbln packs several stored buffers only when all are f32 or i32".into()));
    }
    // The output: the stored buffers back to back.
    let mut offsets = vec![0u64; bufs.len()];
    let mut total = 0u64;
    for &i in &stored {
        offsets[i] = total;
        total += bufs[i].1;
    }
    let out_shape = if stored.len() == 1 { g.values[bufs[first].0].shape.clone() } else { vec![total] };
    let out = g.add_value(&format!("{}.stored", k.name), out_shape, None);
    g.values[out].dtype = dtype_of(out_type);
    let elem = out_type.mem_size().unwrap_or(4);
    let tile_bufs = (0..bufs.len())
        .map(|i| if stored.contains(&i) { TileBuf { value: None, offset: offsets[i], len: bufs[i].1 } } else { TileBuf { value: Some(bufs[i].0), offset: 0, len: bufs[i].1 } })
        .collect();
    let init = stored.iter().map(|&i| (bufs[i].0, offsets[i] * elem)).collect();
    g.ops.push(Op { name: k.name.clone(), op: "TritonKernel".into(), kind: Kind::Tile { program, grid, params, bufs: tile_bufs, init }, out });
    for &i in &stored {
        let name = format!("{}.out", g.values[bufs[i].0].name);
        if stored.len() == 1 {
            g.outputs.push((name, out));
            continue;
        }
        let v = g.add_value(&name, g.values[bufs[i].0].shape.clone(), None);
        g.values[v].dtype = dtype_of(out_type);
        let part = CopyPart { src: out, src_offset: offsets[i], dst_offset: 0, sizes: vec![bufs[i].1], src_strides: vec![1], dst_strides: vec![1] };
        g.ops.push(Op { name: name.clone(), op: "Copy".into(), kind: Kind::Copy { parts: vec![part] }, out: v });
        g.outputs.push((name, v));
    }
    Ok((g, k.name))
}

fn arg_names(args: &[KernelArg]) -> String {
    args.iter().map(|a| match a {
        KernelArg::Buffer { name, .. } | KernelArg::Param { name, .. } => name.as_str(),
    })
    .collect::<Vec<_>>()
    .join(", ")
}
