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

use super::{lower, parse, Kernel, KernelArg};
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

/// What a TILE op binds to one kernel argument.
#[derive(Clone, Debug, PartialEq)]
pub enum LaunchArg {
    Buffer(BufBind),
    Scalar(Scalar),
}

/// How a TILE op binds one pointer argument.
#[derive(Clone, Debug, PartialEq)]
pub enum BufBind {
    /// A value the kernel only reads (storing into it is refused).
    Input(ValueId),
    /// A value the kernel may read and write: its stored result is a new
    /// value starting from this one's contents.
    InOut(ValueId),
    /// A new value of this shape (named `name`) that the kernel stores to,
    /// starting as zeros.
    Output { name: String, shape: Vec<u64> },
}

/// Add one launch of `k` to `g`: a TILE op (named `op_name`) and, when the
/// kernel stores to several buffers, the copies that split them out.
/// `args` binds every kernel argument in order (`BufBind` for pointers, a
/// [`LaunchArg::Scalar`] for the others). Returns the value each stored buffer ends as,
/// in argument order.
pub fn add_launch(g: &mut Graph, k: &Kernel, op_name: &str, grid: [u32; 3], args: &[LaunchArg]) -> Result<Vec<ValueId>> {
    let invalid = |m: String| CompileError::Invalid(format!("kernel {}: {m}", k.name));
    if args.len() != k.args.len() {
        return Err(arg_count(k, args.len()));
    }
    if grid.contains(&0) {
        return Err(invalid("a grid dimension is 0".into()));
    }
    let program_len = k.program.len() as u64;
    let program = g.add_value(&format!("{op_name}.program"), vec![program_len], Some(Const::i64(&[program_len], k.program.iter().map(|&b| b as i64).collect())));
    g.values[program].dtype = DType::U8;
    let mut params = Vec::new();
    // Every buffer: its binding, elements, type and name.
    let mut bufs: Vec<(BufBind, u64, TileType, String)> = Vec::new();
    for (arg, bind) in k.args.iter().zip(args) {
        match (arg, bind) {
            (KernelArg::Buffer { name, dtype, slot }, LaunchArg::Buffer(b)) => {
                let (len, vname) = match b {
                    BufBind::Input(v) | BufBind::InOut(v) => {
                        if g.values[*v].dtype != dtype_of(*dtype) {
                            return Err(invalid(format!("argument {name} points to {:?} elements, its tensor '{}' holds {:?}", dtype_of(*dtype), g.values[*v].name, g.values[*v].dtype)));
                        }
                        if matches!(b, BufBind::Input(_)) && k.stores & (1 << slot) != 0 {
                            return Err(invalid(format!("stores into argument {name}, which is bound to the input '{}' (bind it to an output)", g.values[*v].name)));
                        }
                        (g.values[*v].elems(), g.values[*v].name.clone())
                    }
                    BufBind::Output { name: n, shape } => {
                        if k.stores & (1 << slot) == 0 {
                            return Err(invalid(format!("never stores to argument {name}, which is bound to the output '{n}'")));
                        }
                        (crate::shape::volume(shape), n.clone())
                    }
                };
                bufs.push((b.clone(), len, *dtype, vname));
            }
            (KernelArg::Param { name, dtype, .. }, LaunchArg::Scalar(s)) => params.push(param_bits(name, *s, *dtype)?),
            (KernelArg::Buffer { name, .. }, _) => return Err(invalid(format!("argument {name} is a pointer: bind a tensor to it"))),
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
    let shape_of = |g: &Graph, b: &BufBind| match b {
        BufBind::Input(v) | BufBind::InOut(v) => g.values[*v].shape.clone(),
        BufBind::Output { shape, .. } => shape.clone(),
    };
    // The op's output: the stored buffers back to back.
    let mut offsets = vec![0u64; bufs.len()];
    let mut total = 0u64;
    for &i in &stored {
        offsets[i] = total;
        total += bufs[i].1;
    }
    let single = stored.len() == 1;
    let (out_name, out_shape) = if single { (bufs[first].3.clone() + ".out", shape_of(g, &bufs[first].0)) } else { (format!("{op_name}.stored"), vec![total]) };
    let out_name = match &bufs[first].0 {
        BufBind::Output { name, .. } if single => name.clone(),
        _ => out_name,
    };
    let out = g.add_value(&out_name, out_shape, None);
    g.values[out].dtype = dtype_of(out_type);
    let elem = out_type.mem_size().unwrap_or(4);
    let tile_bufs = bufs
        .iter()
        .enumerate()
        .map(|(i, (b, len, ..))| match b {
            BufBind::Input(v) | BufBind::InOut(v) if !stored.contains(&i) => TileBuf { value: Some(*v), offset: 0, len: *len },
            _ => TileBuf { value: None, offset: offsets[i], len: *len },
        })
        .collect();
    let init = stored
        .iter()
        .filter_map(|&i| match bufs[i].0 {
            BufBind::InOut(v) => Some((v, offsets[i] * elem)),
            _ => None,
        })
        .collect();
    g.ops.push(Op { name: op_name.into(), op: "TritonKernel".into(), kind: Kind::Tile { program, grid, params, bufs: tile_bufs, init }, out });
    if single {
        return Ok(vec![out]);
    }
    let mut results = Vec::new();
    for &i in &stored {
        let name = match &bufs[i].0 {
            BufBind::Output { name, .. } => name.clone(),
            _ => format!("{}.out", bufs[i].3),
        };
        let v = g.add_value(&name, shape_of(g, &bufs[i].0), None);
        g.values[v].dtype = dtype_of(out_type);
        let part = CopyPart { src: out, src_offset: offsets[i], dst_offset: 0, sizes: vec![bufs[i].1], src_strides: vec![1], dst_strides: vec![1] };
        g.ops.push(Op { name: format!("{op_name}.{name}"), op: "Copy".into(), kind: Kind::Copy { parts: vec![part] }, out: v });
        results.push(v);
    }
    Ok(results)
}

/// The graph of one launch of the kernel in `ttir` (`kernel`: its name,
/// if the module has several functions) over `grid`: every pointer
/// argument a model input (read and written in place), every stored
/// buffer a model output `NAME.out`.
pub fn kernel_graph(ttir: &str, kernel: Option<&str>, grid: [u32; 3], bindings: &[Binding]) -> Result<(Graph, String)> {
    let ttir_err = |e: super::TtirError| CompileError::Invalid(e.to_string());
    let k = lower(&parse(ttir).map_err(ttir_err)?, kernel).map_err(ttir_err)?;
    let mut g = Graph::default();
    let mut args = Vec::new();
    if bindings.len() != k.args.len() {
        return Err(arg_count(&k, bindings.len()));
    }
    for (arg, bind) in k.args.iter().zip(bindings) {
        args.push(match (arg, bind) {
            (KernelArg::Buffer { dtype, .. }, Binding::Tensor { name, shape }) => {
                let v = g.add_value(name, shape.clone(), None);
                g.values[v].dtype = dtype_of(*dtype);
                g.inputs.push((name.clone(), v));
                LaunchArg::Buffer(BufBind::InOut(v))
            }
            (KernelArg::Param { .. }, Binding::Scalar(s)) => LaunchArg::Scalar(*s),
            (KernelArg::Buffer { name, .. }, _) => return Err(CompileError::Invalid(format!("kernel {}: argument {name} is a pointer: bind an array to it", k.name))),
            (KernelArg::Param { name, .. }, _) => return Err(CompileError::Invalid(format!("kernel {}: argument {name} is a scalar: bind a number to it", k.name))),
        });
    }
    let outs = add_launch(&mut g, &k, &k.name.clone(), grid, &args)?;
    for v in outs {
        g.outputs.push((g.values[v].name.clone(), v));
    }
    Ok((g, k.name))
}

/// A launch binding `given` arguments to `k`, which takes another number.
fn arg_count(k: &Kernel, given: usize) -> CompileError {
    CompileError::Invalid(format!("kernel {}: takes {} arguments ({}), the launch gives {given}", k.name, k.args.len(), arg_names(&k.args)))
}

fn arg_names(args: &[KernelArg]) -> String {
    args.iter().map(|a| match a {
        KernelArg::Buffer { name, .. } | KernelArg::Param { name, .. } => name.as_str(),
    })
    .collect::<Vec<_>>()
    .join(", ")
}
