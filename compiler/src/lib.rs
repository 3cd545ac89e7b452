//! rbln-compile: ONNX and TFLite models to `.rbln` files for the rbln NPU.
//!
//! Pipeline: decode the protobuf ([`onnx`]; a TFLite flatbuffer is first
//! translated into the same ONNX structures by [`tflite`]) -> import with static shapes
//! and constant folding ([`import`]) -> fuse ([`fuse`]) -> run quantised
//! Conv/GEMM on int8 kernels ([`int8`]) -> lay out constant
//! weights for the cores ([`pack`]) -> plan memory and
//! emit descriptors and command streams ([`emit`]) -> a validated
//! [`rbln_format::Model`].

pub mod eltwise;
pub mod emit;
pub mod error;
pub mod fold;
pub mod fuse;
pub mod import;
pub mod int8;
pub mod ir;
pub mod onnx;
pub mod pack;
pub mod shape;
pub mod storage;
pub mod tflite;
pub mod ttir;

use std::collections::BTreeMap;

use rbln_format::WeightPool;

pub use emit::MemoryPlan;
pub use error::{CompileError, Result};
pub use fuse::FuseStats;
pub use int8::Int8Stats;
pub use import::Options;
pub use pack::Layout;

/// The kind of model file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    Onnx,
    Tflite,
    /// A Triton kernel's TTIR ([`ttir`]).
    Ttir,
}

impl SourceFormat {
    /// What the report calls the model's nodes.
    pub fn nodes_label(self) -> &'static str {
        match self {
            SourceFormat::Onnx => "ONNX nodes",
            SourceFormat::Tflite => "TFLite operators",
            SourceFormat::Ttir => "TTIR ops",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            SourceFormat::Onnx => "onnx",
            SourceFormat::Tflite => "tflite",
            SourceFormat::Ttir => "ttir",
        }
    }
}

/// What a compilation did.
#[derive(Clone, Debug)]
pub struct Report {
    pub format: SourceFormat,
    /// Nodes in the ONNX graph, or operators in a TFLite model's subgraph.
    pub onnx_nodes: usize,
    /// Device ops in the `.rbln` graph (views excluded), by op label.
    pub device_ops: BTreeMap<String, usize>,
    /// Views (reshapes and in-place concatenations: no data moves).
    pub views: usize,
    /// Concatenations whose inputs' producers write into the result
    /// (crate::storage), counted among the views.
    pub concats_in_place: usize,
    /// Slices read in place (crate::storage), counted among the views.
    pub slices_in_place: usize,
    /// Weight layout decisions, one per op whose weights were laid out
    /// for the cores.
    pub layouts: Vec<Layout>,
    pub fused: FuseStats,
    /// Conv / GEMM ops lowered to int8 kernels.
    pub int8: Int8Stats,
    pub memory: MemoryPlan,
}

impl Report {
    pub fn device_op_count(&self) -> usize {
        self.device_ops.values().sum()
    }
}

/// A compiled model and its report.
pub struct Compiled {
    pub model: rbln_format::Model,
    /// The main program's report.
    pub report: Report,
    /// The other entry points' reports ([`compile_entries`]), in order.
    pub entries: Vec<(String, Report)>,
}

/// A graph after the passes, ready to be emitted, with what the report
/// says about it so far.
struct Prepared {
    g: ir::Graph,
    props: Vec<(String, String)>,
    format: SourceFormat,
    onnx_nodes: usize,
    fused: FuseStats,
    int8: Int8Stats,
    layouts: Vec<Layout>,
    in_place: storage::InPlace,
}

/// Compile the bytes of an ONNX or TFLite file (told apart by TFLite's
/// "TFL3" identifier at bytes 4..8); `name` becomes the model's name.
pub fn compile(bytes: &[u8], name: &str, opts: &Options) -> Result<Compiled> {
    if tflite::is_tflite(bytes) {
        return compile_tflite(bytes, name, opts);
    }
    finish(import_onnx(bytes, opts)?, name, WeightPool::default())
}

fn import_onnx(bytes: &[u8], opts: &Options) -> Result<Prepared> {
    let proto = onnx::decode(bytes)?;
    let g = import::import(&proto, opts)?;
    let opset = proto.opset_import.iter().find(|o| o.domain.is_empty() || o.domain == "ai.onnx").map_or(0, |o| o.version);
    let mut props = vec![("onnx.opset".to_string(), opset.to_string())];
    if !proto.producer_name.is_empty() {
        props.push(("onnx.producer".into(), format!("{} {}", proto.producer_name, proto.producer_version).trim().to_string()));
    }
    let onnx_nodes = proto.graph.as_ref().map_or(0, |g| g.node.len());
    Ok(prepare(g, props, SourceFormat::Onnx, onnx_nodes, opts))
}

/// Compile the bytes of a float32 TFLite file: its main subgraph is
/// translated into ONNX nodes ([`tflite`]), then imported, fused and
/// emitted as an ONNX model is.
pub fn compile_tflite(bytes: &[u8], name: &str, opts: &Options) -> Result<Compiled> {
    finish(import_tflite(bytes, opts)?, name, WeightPool::default())
}

fn import_tflite(bytes: &[u8], opts: &Options) -> Result<Prepared> {
    let t = tflite::translate(bytes)?;
    let g = import::import(&t.model, opts).map_err(|e| t.map_error(e))?;
    let mut props = vec![("tflite.schema_version".to_string(), t.version.to_string())];
    if !t.description.is_empty() {
        props.push(("tflite.description".into(), t.description.clone()));
    }
    Ok(prepare(g, props, SourceFormat::Tflite, t.operators, opts))
}

/// Compile one launch of a Triton kernel, given as the TTIR triton prints
/// (`kernel`: which function, when the module has several), over `grid`
/// with `bindings` for its arguments: a model whose inputs are the
/// pointer arguments' tensors and whose outputs are the buffers the kernel
/// stores to ([`ttir::kernel_graph`]).
pub fn compile_kernel(ttir_text: &str, kernel: Option<&str>, grid: [u32; 3], bindings: &[ttir::Binding]) -> Result<Compiled> {
    let (g, name) = ttir::kernel_graph(ttir_text, kernel, grid, bindings)?;
    let ops = ttir_text.lines().filter(|l| l.contains(" = ") || l.trim_start().starts_with("tt.store")).count();
    let props = vec![("ttir.kernel".to_string(), name.clone()), ("ttir.grid".to_string(), format!("{}x{}x{}", grid[0], grid[1], grid[2]))];
    finish(prepare(g, props, SourceFormat::Ttir, ops, &Options::default()), &name, WeightPool::default())
}

/// Compile several ONNX or TFLite models into one `.rbln` whose programs
/// are entry points over one weights section (docs/rbln-format.md §16):
/// `sources` are (entry name, file bytes), the first becoming the main
/// program; `name` is the model's name. A weight the programs lay out
/// identically is stored once ([`WeightPool`]).
pub fn compile_entries(sources: &[(&str, &[u8])], name: &str, opts: &Options) -> Result<Compiled> {
    let Some(((main_name, _), _)) = sources.split_first() else {
        return Err(CompileError::Invalid("no entry points to compile".into()));
    };
    let in_entry = |entry: &str, e: CompileError| CompileError::Entry { entry: entry.to_string(), source: Box::new(e) };
    let mut prepared = Vec::with_capacity(sources.len());
    for (i, (entry, bytes)) in sources.iter().enumerate() {
        if sources[..i].iter().any(|(n, _)| n == entry) {
            return Err(CompileError::Invalid(format!("two entry points are called '{entry}'")));
        }
        let p = if tflite::is_tflite(bytes) { import_tflite(bytes, opts) } else { import_onnx(bytes, opts) };
        prepared.push(p.map_err(|e| in_entry(entry, e))?);
    }
    // Every program's weights in one pool first, so that each program is
    // then emitted over the same, final weights.
    let mut pool = WeightPool::default();
    for (p, (entry, _)) in prepared.iter().zip(sources) {
        pool = emit::emit(&p.g, entry, &p.props, pool).map_err(|e| in_entry(entry, e))?.pool;
    }
    let mut compiled = Vec::with_capacity(sources.len());
    for (p, (entry, _)) in prepared.into_iter().zip(sources) {
        let model_name = if entry == main_name { name } else { entry };
        let c = finish(p, model_name, pool.clone()).map_err(|e| in_entry(entry, e))?;
        if c.model.weights.len() as u64 != pool.len() {
            return Err(in_entry(entry, CompileError::Invalid("its weights differ from the shared pool's".into())));
        }
        compiled.push((entry.to_string(), c));
    }
    let mut all = compiled.into_iter();
    let Some((_, main)) = all.next() else { unreachable!("sources is not empty") };
    let (others, entries): (Vec<_>, Vec<_>) = all.map(|(n, c)| (c.model, (n, c.report))).unzip();
    let model = rbln_format::Model::with_entries(main.model, main_name, others)?;
    Ok(Compiled { model, report: main.report, entries })
}

fn prepare(mut g: ir::Graph, props: Vec<(String, String)>, format: SourceFormat, onnx_nodes: usize, opts: &Options) -> Prepared {
    let fused = fuse::run(&mut g);
    let mut fused = fused;
    let int8 = int8::run(&mut g);
    fuse::drop_dead(&mut g);
    if !opts.unfused_elementwise {
        fused.eltwise = eltwise::run(&mut g);
    }
    let layouts = pack::run(&mut g);
    // Last: it decides the memory layout of the graph the others made.
    let in_place = storage::in_place(&mut g);
    Prepared { g, props, format, onnx_nodes, fused, int8, layouts, in_place }
}

fn finish(p: Prepared, name: &str, pool: WeightPool) -> Result<Compiled> {
    let mut device_ops = BTreeMap::new();
    let mut views = 0;
    for op in &p.g.ops {
        if matches!(op.kind, ir::Kind::View { .. } | ir::Kind::ConcatView { .. } | ir::Kind::SliceView { .. }) {
            views += 1;
        } else {
            *device_ops.entry(op.op.clone()).or_insert(0) += 1;
        }
    }
    let e = emit::emit(&p.g, name, &p.props, pool)?;
    let report = Report {
        format: p.format,
        onnx_nodes: p.onnx_nodes,
        device_ops,
        views,
        concats_in_place: p.in_place.concats,
        slices_in_place: p.in_place.slices,
        layouts: p.layouts,
        fused: p.fused,
        int8: p.int8,
        memory: e.memory,
    };
    Ok(Compiled { model: e.model, report, entries: Vec::new() })
}

/// Parse `name=1x3x224x224`.
pub fn parse_input_shape(s: &str) -> Result<(String, Vec<u64>)> {
    let (name, dims) = s.rsplit_once('=').ok_or_else(|| CompileError::BadInputShape(format!("'{s}': expected NAME=D0xD1x...")))?;
    let dims: std::result::Result<Vec<u64>, _> = dims.split(['x', 'X', ',']).map(|d| d.trim().parse::<u64>()).collect();
    match dims {
        Ok(d) if !d.is_empty() && !name.is_empty() => Ok((name.to_string(), d)),
        _ => Err(CompileError::BadInputShape(format!("'{s}': expected NAME=D0xD1x... with positive integers"))),
    }
}
