//! Compiler graph -> `.rbln`: weights, the arena memory plan, descriptors
//! with relocations, the four command streams and the graph section.
//!
//! Memory plan: every run-time value gets arena bytes; views share their
//! source's bytes and an in-place concatenation its inputs'
//! (crate::storage: values sharing bytes form one storage). A value is
//! live from the node that produces it to the last node that reads it
//! (model inputs and outputs: from their transfer node on / until theirs),
//! a storage while any of its values is, exactly the rule `.rbln` readers
//! check. Storages are placed largest first at the lowest offset that no
//! storage with an overlapping lifetime occupies (greedy by size).

use std::collections::{HashMap, HashSet};
use std::mem::offset_of;

use rbln_format::{DType, Model, ModelBuilder, Node, RelocKind, StreamRole, TensorId, Va, WeightPool};
use rbln_hw::ops::*;

use crate::error::{CompileError, Result};
use crate::ir::{Data, Graph, Kind, Op, Sampling, ValueId};
use crate::shape::volume;

/// Arena offsets of activations are aligned to this (bytes).
pub const ACT_ALIGN: u64 = 256;

/// Sizes of the memory plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    pub weights_bytes: u64,
    /// Activations if every value had its own bytes.
    pub naive_bytes: u64,
    /// Activations as planned (the arena's activation region).
    pub planned_bytes: u64,
    pub arena_bytes: u64,
    pub staging_bytes: u64,
}

fn round_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Lifetime of an arena region: [first, last] node times, inclusive.
#[derive(Clone, Copy, Debug)]
struct Interval {
    first: u64,
    last: u64,
    size: u64,
}

/// Greedy-by-size placement; returns offsets (relative to the region)
/// and the region's size.
fn plan(items: &[Interval]) -> (Vec<u64>, u64) {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(items[i].size), items[i].first, i));
    let mut offsets = vec![0u64; items.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut end = 0;
    for &i in &order {
        let it = items[i];
        // Occupied ranges of placed items whose lifetimes overlap.
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| items[j].first <= it.last && it.first <= items[j].last)
            .map(|&j| (offsets[j], offsets[j] + round_up(items[j].size, ACT_ALIGN)))
            .collect();
        busy.sort_unstable();
        let need = round_up(it.size, ACT_ALIGN);
        let mut at = 0;
        for (s, e) in busy {
            if s >= at + need {
                break;
            }
            at = at.max(e);
        }
        offsets[i] = at;
        end = end.max(at + need);
        placed.push(i);
    }
    (offsets, end)
}

fn u32c(op: &Op, v: u64, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| CompileError::Unsupported {
        node: op.name.clone(),
        op: op.op.clone(),
        reason: format!("{what} = {v} does not fit the descriptor's 32-bit field"),
    })
}

fn dims6(op: &Op, d: &[u64], what: &str) -> Result<[u32; 6]> {
    let mut out = [0u32; 6];
    if d.len() > 6 {
        return Err(CompileError::Unsupported { node: op.name.clone(), op: op.op.clone(), reason: format!("{what} has rank {}", d.len()) });
    }
    for (o, &v) in out.iter_mut().zip(d) {
        *o = u32c(op, v, what)?;
    }
    Ok(out)
}

/// The QTYPE_* code of an int8 op's element type.
fn qtype_code(op: &Op, t: DType) -> Result<u32> {
    match t {
        DType::U8 => Ok(QTYPE_U8),
        DType::I8 => Ok(QTYPE_I8),
        DType::F32 => Ok(QTYPE_F32),
        other => Err(CompileError::Invalid(format!("{}: the int8 ops have no {} operand", op.name, other.name()))),
    }
}

fn qflags(zero: Option<ValueId>, bias: Option<ValueId>, out: &crate::ir::QOut) -> u32 {
    let mut f = 0;
    if zero.is_some() {
        f |= QGEMM_B_ZERO;
    }
    if bias.is_some() {
        f |= QGEMM_BIAS;
    }
    if out.relu {
        f |= QGEMM_RELU;
    }
    f
}

fn u64x6(d: &[u64]) -> [u64; 6] {
    let mut out = [0u64; 6];
    out[..d.len()].copy_from_slice(d);
    out
}

/// Unique names for the file's tensors.
#[derive(Default)]
struct Names(HashSet<String>);

impl Names {
    fn get(&mut self, want: &str) -> String {
        let base = if want.is_empty() { "t" } else { want };
        let mut name = base.to_string();
        let mut i = 1;
        while !self.0.insert(name.clone()) {
            name = format!("{base}#{i}");
            i += 1;
        }
        name
    }
}

/// What [`emit`] made.
pub struct Emitted {
    pub model: Model,
    pub memory: MemoryPlan,
    /// The weights after this graph's were added (the pool given plus any
    /// constant not already in it).
    pub pool: WeightPool,
}

/// Emit `g` as a model whose weights start from `pool` (empty for a
/// model of its own; the shared pool for entry points compiled together).
pub fn emit(g: &Graph, model_name: &str, properties: &[(String, String)], pool: WeightPool) -> Result<Emitted> {
    let mut b = ModelBuilder::new(model_name);
    b.weight_pool(pool);
    b.producer(&format!("rbln-compile {}", env!("CARGO_PKG_VERSION")));
    for (k, v) in properties {
        b.property(k, v);
    }
    let mut names = Names::default();
    let mut tid: HashMap<ValueId, TensorId> = HashMap::new();

    // Weights: every constant an op reads, in first-use order.
    let gather_indices: HashSet<ValueId> =
        g.ops.iter().filter_map(|o| if let Kind::Gather { indices, .. } = o.kind { Some(indices) } else { None }).collect();
    let int8_operands: HashSet<ValueId> = g
        .ops
        .iter()
        .filter(|o| matches!(o.kind, Kind::Quant { .. } | Kind::QGemm { .. } | Kind::QConv { .. } | Kind::QBinary { .. }))
        .flat_map(|o| o.kind.inputs())
        .collect();
    let tile_programs: HashSet<ValueId> =
        g.ops.iter().filter_map(|o| if let Kind::Tile { program, .. } = o.kind { Some(program) } else { None }).collect();
    for op in &g.ops {
        for v in op.kind.inputs() {
            let Some(c) = g.konst(v) else { continue };
            if tid.contains_key(&v) {
                continue;
            }
            let name = names.get(&g.values[v].name);
            let dtype = g.values[v].dtype;
            let t = if gather_indices.contains(&v) {
                let ints = c.ints();
                let bytes: Vec<u8> = ints.iter().flat_map(|x| x.to_le_bytes()).collect();
                b.add_weight(&name, DType::I64, &c.shape, &bytes)
            } else if tile_programs.contains(&v) {
                // A tile program's bytes, as the compiler encoded them.
                let bytes: Vec<u8> = c.ints().iter().map(|&x| x as u8).collect();
                b.add_weight(&name, DType::U8, &c.shape, &bytes)
            } else if int8_operands.contains(&v) && matches!(dtype, DType::I8 | DType::U8 | DType::I32) {
                // The int8 ops' operands (packed weights, zero points,
                // int32 biases): stored as their type, values in range by
                // construction.
                let ints = c.ints();
                let bytes: Vec<u8> = match dtype {
                    DType::I32 => ints.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
                    _ => ints.iter().map(|&x| x as u8).collect(),
                };
                b.add_weight(&name, dtype, &c.shape, &bytes)
            } else {
                let vals = match &c.data {
                    Data::F(v) => v.clone(),
                    Data::I(v) => v.iter().map(|&x| x as f32).collect(),
                };
                b.add_weight_f32(&name, &c.shape, &vals)
            };
            tid.insert(v, t);
        }
    }
    let weights_bytes = b.weights_len();

    // Node times: input transfers, ops, output transfers.
    let n_in = g.inputs.len() as u64;
    let op_time = |i: usize| n_in + i as u64 + 1;
    let out_time0 = n_in + g.ops.len() as u64 + 1;
    // Storages (values sharing bytes: views, in-place concatenations)
    // and their lifetimes.
    let st = crate::storage::Storages::of_graph(g)?;
    let mut life: HashMap<usize, (u64, u64)> = HashMap::new();
    let mut touch = |v: ValueId, t: u64| -> Result<()> {
        let s = st.place(v)?.storage;
        let e = life.entry(s).or_insert((t, t));
        e.0 = e.0.min(t);
        e.1 = e.1.max(t);
        Ok(())
    };
    for (i, (_, v)) in g.inputs.iter().enumerate() {
        touch(*v, i as u64 + 1)?;
    }
    for (i, op) in g.ops.iter().enumerate() {
        for v in op.kind.inputs() {
            if g.konst(v).is_none() {
                touch(v, op_time(i))?;
            }
        }
        touch(op.out, op_time(i))?;
    }
    for (j, (_, v)) in g.outputs.iter().enumerate() {
        touch(*v, out_time0 + j as u64)?;
    }
    let byte_size = |v: ValueId| g.values[v].elems() * g.values[v].dtype.size();
    // (storage, lowest member position, bytes) of the live storages.
    let spans: Vec<(usize, i64, u64)> = st.spans().into_iter().filter(|s| life.contains_key(&s.0)).collect();
    let items: Vec<Interval> =
        spans.iter().map(|&(s, _, size)| Interval { first: life[&s].0, last: life[&s].1, size }).collect();
    let (offsets, planned) = plan(&items);
    let naive: u64 = items.iter().map(|i| round_up(i.size, ACT_ALIGN)).sum();
    let act_base = round_up(weights_bytes, rbln_hw::PAGE_SIZE);
    // Arena offset of each storage's lowest position.
    let storage_off: HashMap<usize, (u64, i64)> =
        spans.iter().zip(&offsets).map(|(&(s, lo, _), o)| (s, (act_base + o, lo))).collect();
    let arena = round_up(act_base + planned, rbln_hw::PAGE_SIZE);
    b.arena_size(arena);

    // Staging: inputs, then outputs.
    let mut staging = 0;
    let mut stage = |b: &mut ModelBuilder, names: &mut Names, name: &str, v: ValueId| {
        let (shape, dtype) = (&g.values[v].shape, g.values[v].dtype);
        let t = b.staging_tensor(&names.get(name), dtype, shape, staging);
        staging = round_up(staging + volume(shape) * dtype.size(), ACT_ALIGN);
        t
    };
    let in_stage: Vec<TensorId> = g.inputs.iter().map(|(n, v)| stage(&mut b, &mut names, n, *v)).collect();
    let out_stage: Vec<TensorId> = g.outputs.iter().map(|(n, v)| stage(&mut b, &mut names, n, *v)).collect();
    let staging_bytes = round_up(staging.max(1), rbln_hw::PAGE_SIZE);
    b.staging_size(staging_bytes);

    // Arena tensors of run-time values.
    let arena_tensor = |b: &mut ModelBuilder, names: &mut Names, v: ValueId| -> TensorId {
        let name = if g.inputs.iter().any(|(_, i)| *i == v) { format!("{}.dev", g.values[v].name) } else { g.values[v].name.clone() };
        let p = st.place(v).expect("every run-time value has a place");
        let (base, lo) = storage_off[&p.storage];
        b.arena_tensor(&names.get(&name), g.values[v].dtype, &g.values[v].shape, base + (p.pos - lo) as u64)
    };
    for (_, v) in &g.inputs {
        let t = arena_tensor(&mut b, &mut names, *v);
        tid.insert(*v, t);
    }
    for op in &g.ops {
        let t = arena_tensor(&mut b, &mut names, op.out);
        tid.insert(op.out, t);
    }

    let upload = b.add_stream("upload", StreamRole::UploadWeights);
    let input = b.add_stream("input", StreamRole::InputTransfer);
    let run = b.add_stream("run", StreamRole::Run);
    let output = b.add_stream("output", StreamRole::OutputTransfer);
    if weights_bytes > 0 {
        b.dma_copy(upload, Va::Rel(RelocKind::WeightsSource, 0), Va::arena(0), weights_bytes);
    } else {
        b.nop(upload);
    }
    for (i, (name, v)) in g.inputs.iter().enumerate() {
        let (src, dst) = (in_stage[i], tid[v]);
        let at = b.dma_copy(input, b.va_of(src), b.va_of(dst), byte_size(*v));
        b.add_node(Node::host_to_device(&format!("{name}.upload"), src, dst).with_commands(input, at, 32));
    }
    let off = |b: &ModelBuilder, v: ValueId| b.placement(tid[&v]).map_or(0, |p| p.offset());
    for op in &g.ops {
        let ins: Vec<TensorId> = op.kind.inputs().iter().map(|v| tid[v]).collect();
        let out = tid[&op.out];
        match op.kind {
            Kind::View { .. } | Kind::SliceView { .. } => {
                b.add_node(Node::view(&op.name, ins[0], out));
                continue;
            }
            Kind::ConcatView { .. } => {
                b.add_node(Node::concat_view(&op.name, &ins, out));
                continue;
            }
            _ => {}
        }
        let descs = descriptors(g, op, &|v| off(&b, v))?;
        let mut cmd_at = None;
        if let Kind::Pad { value, .. } = op.kind {
            // The padding: fill the whole output, then copy the input in.
            let size = g.values[op.out].elems() * 4;
            cmd_at = Some(b.fill(run, Va::arena(off(&b, op.out)), size, value.to_bits()));
        }
        if let Kind::Tile { init, .. } = &op.kind {
            // The stored buffers start as zeros, or as the values the
            // kernel reads and writes (4-byte multiples: arena values are
            // 256-byte aligned and sized).
            let o = off(&b, op.out);
            cmd_at = Some(b.fill(run, Va::arena(o), round_up(byte_size(op.out), 4), 0));
            for &(v, at) in init {
                b.dma_copy(run, Va::arena(off(&b, v)), Va::arena(o + at), byte_size(v));
            }
        }
        // Descriptors first (contiguous in .rbln.desc: every size is a
        // multiple of DESC_ALIGN), then one COMPUTE packet each.
        let placed: Vec<(u64, u32)> = descs.iter().map(|(bytes, relocs)| (b.add_descriptor(bytes, relocs), bytes.len() as u32)).collect();
        let first = placed.first().map(|p| p.0);
        let total = placed.last().map_or(0, |&(at, size)| at + size as u64 - first.unwrap_or(at));
        for &(d, size) in &placed {
            let at = b.compute(run, d, size);
            cmd_at.get_or_insert(at);
        }
        let cmd_len = b.stream_len(run) - cmd_at.unwrap_or(0);
        let node = Node::compute(&op.name, &op.op, &ins, &[out])
            .with_commands(run, cmd_at.unwrap_or(0), cmd_len)
            .with_descriptors(first.unwrap_or(0), total);
        let id = b.add_node(node);
        let (flops, bytes) = cost(g, op);
        b.node_profile(id, flops, bytes);
    }
    for (j, (name, v)) in g.outputs.iter().enumerate() {
        let (src, dst) = (tid[v], out_stage[j]);
        let at = b.dma_copy(output, b.va_of(src), b.va_of(dst), byte_size(*v));
        b.add_node(Node::device_to_host(&format!("{name}.download"), src, dst).with_commands(output, at, 32));
    }
    for (i, (name, v)) in g.inputs.iter().enumerate() {
        b.input(name, in_stage[i]);
        if let Some(&(_, lo, hi)) = g.ranges.iter().find(|r| r.0 == *v) {
            b.input_range(name, rbln_format::ValueRange { lo, hi });
        }
    }
    for (j, (name, _)) in g.outputs.iter().enumerate() {
        b.output(name, out_stage[j]);
    }
    let mem = MemoryPlan { weights_bytes, naive_bytes: naive, planned_bytes: planned, arena_bytes: arena, staging_bytes };
    b.property("memory.weights_bytes", &weights_bytes.to_string())
        .property("memory.activations_naive_bytes", &naive.to_string())
        .property("memory.activations_planned_bytes", &planned.to_string());
    let pool = b.weights().clone();
    Ok(Emitted { model: b.build_model()?, memory: mem, pool })
}

/// One source of a CONCAT: `rows × cols` elements from `src_offset` of
/// `src`, landing at column `col` of each output row.
struct ConcatPiece {
    src: ValueId,
    src_offset: u64,
    col: u64,
    cols: u64,
}

/// A copy whose parts each move whole rows of a row-major source into
/// columns of the output's rows: (rows, output row length, the parts).
/// Concatenations along any axis of two or more inputs look like this.
fn concat_rows(g: &Graph, parts: &[crate::ir::CopyPart], out: ValueId) -> Option<(u64, u64, Vec<ConcatPiece>)> {
    if parts.len() < 2 {
        return None;
    }
    let (rows, _) = row_shape(&parts[0])?;
    let n_out = g.values[out].elems();
    if rows == 0 || n_out % rows != 0 {
        return None;
    }
    let out_cols = n_out / rows;
    let mut pieces = Vec::with_capacity(parts.len());
    for p in parts {
        let (r, cols) = row_shape(p)?;
        let (src_row, dst_row) = if p.sizes.len() == 2 { (p.src_strides[0], p.dst_strides[0]) } else { (cols, out_cols) };
        let col = p.dst_offset;
        if r != rows || cols == 0 || (rows > 1 && (src_row != cols || dst_row != out_cols)) || col.checked_add(cols)? > out_cols {
            return None;
        }
        pieces.push(ConcatPiece { src: p.src, src_offset: p.src_offset, col, cols });
    }
    Some((rows, out_cols, pieces))
}

/// (rows, columns) of a rank-1 or rank-2 copy part whose rows are
/// contiguous on both sides.
fn row_shape(p: &crate::ir::CopyPart) -> Option<(u64, u64)> {
    match p.sizes.as_slice() {
        [n] if p.src_strides[0] == 1 && p.dst_strides[0] == 1 => Some((1, *n)),
        [r, c] if p.src_strides[1] == 1 && p.dst_strides[1] == 1 => Some((*r, *c)),
        _ => None,
    }
}

/// Nominal FLOPs and bytes touched by an op (`.rbln.profile`).
fn cost(g: &Graph, op: &Op) -> (u64, u64) {
    let out = g.values[op.out].elems();
    let bytes = op.kind.inputs().iter().fold(out, |a, &v| a.saturating_add(g.values[v].elems())).saturating_mul(4);
    let mul = |f: &[u64]| f.iter().fold(1u64, |a, &b| a.saturating_mul(b));
    let flops = match &op.kind {
        Kind::Gemm { m, n, k, batch, .. } => mul(&[2, *m, *n, *k, *batch]),
        Kind::Conv { dims, .. } | Kind::QConv { dims, .. } => mul(&[2, out, dims[1] / dims[7].max(1), dims[5], dims[6]]),
        Kind::QGemm { m, n, k, .. } => mul(&[2, *m, *n, *k]),
        Kind::Pool { kernel, .. } => mul(&[out, kernel[0], kernel[1]]),
        Kind::LayerNorm { .. } | Kind::Softmax { .. } => mul(&[5, out]),
        Kind::Reduce { x, .. } => g.values[*x].elems(),
        // seq·batch·G·H·(2H + 10): the x projection's size times that.
        Kind::Recurrent { x, hidden, .. } => mul(&[g.values[*x].elems(), 2 * hidden + 10]),
        _ => out,
    };
    (flops, bytes)
}

type Desc = (Vec<u8>, Vec<(u64, RelocKind, u64)>);

fn reloc(field: usize, arena_offset: u64) -> (u64, RelocKind, u64) {
    (field as u64, RelocKind::Arena, arena_offset)
}

/// The descriptors of one op, with arena relocations for their VAs.
fn descriptors(g: &Graph, op: &Op, off: &dyn Fn(ValueId) -> u64) -> Result<Vec<Desc>> {
    let o = off(op.out);
    Ok(match &op.kind {
        Kind::Gemm { a, b, bias, m, n, k, batch, strides, trans_a, trans_b, b_packed, residual, act } => {
            let mut flags = 0;
            if *b_packed {
                flags |= GEMM_B_PACKED;
            }
            if *trans_a {
                flags |= GEMM_TRANS_A;
            }
            if *trans_b {
                flags |= GEMM_TRANS_B;
            }
            if bias.is_some() {
                flags |= GEMM_BIAS;
            }
            if residual.is_some() {
                flags |= GEMM_RESIDUAL;
            }
            let d = GemmDesc {
                m: u32c(op, *m, "m")?,
                n: u32c(op, *n, "n")?,
                k: u32c(op, *k, "k")?,
                flags,
                batch: u32c(op, *batch, "batch")?,
                activation: act.kind as u32,
                act_param0: act.p0,
                act_param1: act.p1,
                a_batch_stride: strides[0],
                b_batch_stride: strides[1],
                c_batch_stride: strides[2],
                ..Default::default()
            }
            .with_header();
            let mut r = vec![reloc(offset_of!(GemmDesc, a_va), off(*a)), reloc(offset_of!(GemmDesc, b_va), off(*b)), reloc(offset_of!(GemmDesc, c_va), o)];
            if let Some(bv) = bias {
                r.push(reloc(offset_of!(GemmDesc, bias_va), off(*bv)));
            }
            if let Some(rv) = residual {
                r.push(reloc(offset_of!(GemmDesc, residual_va), off(*rv)));
            }
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::Conv { x, w, bias, dims, stride, dilation, pads, residual, act, winograd } => {
            let d = Conv2dDesc {
                n: u32c(op, dims[0], "n")?,
                c_in: u32c(op, dims[1], "c_in")?,
                h: u32c(op, dims[2], "h")?,
                w: u32c(op, dims[3], "w")?,
                c_out: u32c(op, dims[4], "c_out")?,
                kh: u32c(op, dims[5], "kh")?,
                kw: u32c(op, dims[6], "kw")?,
                groups: u32c(op, dims[7], "groups")?,
                stride_h: u32c(op, stride[0], "stride")?,
                stride_w: u32c(op, stride[1], "stride")?,
                dil_h: u32c(op, dilation[0], "dilation")?,
                dil_w: u32c(op, dilation[1], "dilation")?,
                pad_top: u32c(op, pads[0], "pad")?,
                pad_left: u32c(op, pads[1], "pad")?,
                pad_bottom: u32c(op, pads[2], "pad")?,
                pad_right: u32c(op, pads[3], "pad")?,
                flags: if bias.is_some() { CONV_BIAS } else { 0 } | if residual.is_some() { CONV_RESIDUAL } else { 0 } | if *winograd { CONV_WINOGRAD } else { 0 },
                activation: act.kind as u32,
                act_param0: act.p0,
                act_param1: act.p1,
                ..Default::default()
            }
            .with_header();
            let mut r = vec![reloc(offset_of!(Conv2dDesc, input_va), off(*x)), reloc(offset_of!(Conv2dDesc, weight_va), off(*w)), reloc(offset_of!(Conv2dDesc, output_va), o)];
            if let Some(bv) = bias {
                r.push(reloc(offset_of!(Conv2dDesc, bias_va), off(*bv)));
            }
            if let Some(rv) = residual {
                r.push(reloc(offset_of!(Conv2dDesc, residual_va), off(*rv)));
            }
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::Pool { x, max, count_include_pad, int8, dims, kernel, stride, dilation, pads } => {
            let bytes = match int8 {
                Some(true) => POOL_INT8 | POOL_SIGNED,
                Some(false) => POOL_INT8,
                None => 0,
            };
            let d = PoolDesc {
                kind: if *max { POOL_MAX } else { POOL_AVG },
                flags: if *count_include_pad { POOL_COUNT_INCLUDE_PAD } else { 0 } | bytes,
                n: u32c(op, dims[0], "n")?,
                c: u32c(op, dims[1], "c")?,
                h: u32c(op, dims[2], "h")?,
                w: u32c(op, dims[3], "w")?,
                kh: u32c(op, kernel[0], "kh")?,
                kw: u32c(op, kernel[1], "kw")?,
                stride_h: u32c(op, stride[0], "stride")?,
                stride_w: u32c(op, stride[1], "stride")?,
                pad_top: u32c(op, pads[0], "pad")?,
                pad_left: u32c(op, pads[1], "pad")?,
                pad_bottom: u32c(op, pads[2], "pad")?,
                pad_right: u32c(op, pads[3], "pad")?,
                dil_h: u32c(op, dilation[0], "dilation")?,
                dil_w: u32c(op, dilation[1], "dilation")?,
                ..Default::default()
            }
            .with_header();
            vec![(d.to_bytes().to_vec(), vec![reloc(offset_of!(PoolDesc, input_va), off(*x)), reloc(offset_of!(PoolDesc, output_va), o)])]
        }
        Kind::Binary { kind, a, b, a_dims, b_dims, act } => {
            let d = BinaryDesc {
                kind: *kind as u32,
                rank: a_dims.len() as u32,
                a_dims: dims6(op, a_dims, "a")?,
                b_dims: dims6(op, b_dims, "b")?,
                activation: act.kind as u32,
                act_param0: act.p0,
                act_param1: act.p1,
                ..Default::default()
            }
            .with_header();
            let r = vec![reloc(offset_of!(BinaryDesc, a_va), off(*a)), reloc(offset_of!(BinaryDesc, b_va), off(*b)), reloc(offset_of!(BinaryDesc, out_va), o)];
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::Unary { kind, x, p0, p1 } => {
            let d = UnaryDesc { kind: *kind as u32, param0: *p0, param1: *p1, count: g.values[op.out].elems(), ..Default::default() }.with_header();
            vec![(d.to_bytes().to_vec(), vec![reloc(offset_of!(UnaryDesc, in_va), off(*x)), reloc(offset_of!(UnaryDesc, out_va), o)])]
        }
        Kind::Softmax { x, dims, axis, log } => {
            let flags = if *log { SOFTMAX_LOG } else { 0 };
            let d = SoftmaxDesc { rank: dims.len() as u32, axis: *axis as u32, dims: dims6(op, dims, "dims")?, flags, ..Default::default() }.with_header();
            vec![(d.to_bytes().to_vec(), vec![reloc(offset_of!(SoftmaxDesc, in_va), off(*x)), reloc(offset_of!(SoftmaxDesc, out_va), o)])]
        }
        Kind::LayerNorm { x, gamma, beta, rows, cols, eps, rms } => {
            let flags = if gamma.is_some() { LAYERNORM_GAMMA } else { 0 } | if beta.is_some() { LAYERNORM_BETA } else { 0 } | if *rms { LAYERNORM_RMS } else { 0 };
            let d = LayerNormDesc { rows: u32c(op, *rows, "rows")?, cols: u32c(op, *cols, "cols")?, epsilon: *eps, flags, ..Default::default() }.with_header();
            let mut r = vec![reloc(offset_of!(LayerNormDesc, in_va), off(*x)), reloc(offset_of!(LayerNormDesc, out_va), o)];
            if let Some(v) = gamma {
                r.push(reloc(offset_of!(LayerNormDesc, gamma_va), off(*v)));
            }
            if let Some(v) = beta {
                r.push(reloc(offset_of!(LayerNormDesc, beta_va), off(*v)));
            }
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::Reduce { kind, x, dims, axis } => {
            let d = ReduceDesc { kind: *kind, rank: dims.len() as u32, dims: dims6(op, dims, "dims")?, axis: *axis as u32, ..Default::default() }.with_header();
            vec![(d.to_bytes().to_vec(), vec![reloc(offset_of!(ReduceDesc, in_va), off(*x)), reloc(offset_of!(ReduceDesc, out_va), o)])]
        }
        Kind::Transpose { x, dims, perm } => {
            let p: Vec<u64> = perm.clone();
            let d = TransposeDesc { rank: dims.len() as u32, dims: dims6(op, dims, "dims")?, perm: dims6(op, &p, "perm")?, ..Default::default() }.with_header();
            vec![(d.to_bytes().to_vec(), vec![reloc(offset_of!(TransposeDesc, in_va), off(*x)), reloc(offset_of!(TransposeDesc, out_va), o)])]
        }
        Kind::Copy { parts } if let Some((rows, out_cols, pieces)) = concat_rows(g, parts, op.out) => {
            // A concatenation: one CONCAT per MAX_CONCAT_PARTS sources.
            let mut v = Vec::new();
            for chunk in pieces.chunks(MAX_CONCAT_PARTS) {
                let mut d = ConcatDesc { rows: u32c(op, rows, "rows")?, out_cols: u32c(op, out_cols, "columns")?, parts: chunk.len() as u32, ..Default::default() };
                let mut r = vec![reloc(offset_of!(ConcatDesc, out_va), o)];
                for (i, p) in chunk.iter().enumerate() {
                    (d.col[i], d.cols[i]) = (u32c(op, p.col, "column")?, u32c(op, p.cols, "columns")?);
                    r.push(reloc(offset_of!(ConcatDesc, src_va) + 8 * i, off(p.src) + 4 * p.src_offset));
                }
                v.push((d.with_header().to_bytes().to_vec(), r));
            }
            v
        }
        Kind::Copy { parts } => {
            let mut v = Vec::new();
            for p in parts {
                let d = StridedCopyDesc {
                    rank: p.sizes.len() as u32,
                    sizes: dims6(op, &p.sizes, "sizes")?,
                    src_strides: u64x6(&p.src_strides),
                    dst_strides: u64x6(&p.dst_strides),
                    ..Default::default()
                }
                .with_header();
                let r = vec![
                    reloc(offset_of!(StridedCopyDesc, src_va), off(p.src) + 4 * p.src_offset),
                    reloc(offset_of!(StridedCopyDesc, dst_va), o + 4 * p.dst_offset),
                ];
                v.push((d.to_bytes().to_vec(), r));
            }
            v
        }
        Kind::Gather { data, indices, dims, axis, count } => {
            // Constant indices are stored as i64; run-time ones as they come.
            let i32_indices = g.konst(*indices).is_none() && g.values[*indices].dtype == DType::I32;
            let d = GatherDesc {
                rank: dims.len() as u32,
                axis: *axis as u32,
                dims: dims6(op, dims, "dims")?,
                index_type: if i32_indices { GATHER_INDEX_I32 } else { GATHER_INDEX_I64 },
                num_indices: *count,
                ..Default::default()
            }
            .with_header();
            let r = vec![
                reloc(offset_of!(GatherDesc, data_va), off(*data)),
                reloc(offset_of!(GatherDesc, indices_va), off(*indices)),
                reloc(offset_of!(GatherDesc, out_va), o),
            ];
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::Pad { x, dims, begin, step, .. } => {
            let out_dims: Vec<u64> = g.values[op.out].shape.clone();
            let out_strides = crate::shape::strides(&out_dims);
            let at: u64 = begin.iter().zip(&out_strides).map(|(b, s)| b * s).sum();
            let dst_strides: Vec<u64> = out_strides.iter().zip(step).map(|(s, k)| s * k).collect();
            let d = StridedCopyDesc {
                rank: dims.len() as u32,
                sizes: dims6(op, dims, "dims")?,
                src_strides: u64x6(&crate::shape::strides(dims)),
                dst_strides: u64x6(&dst_strides),
                ..Default::default()
            }
            .with_header();
            let r = vec![reloc(offset_of!(StridedCopyDesc, src_va), off(*x)), reloc(offset_of!(StridedCopyDesc, dst_va), o + 4 * at)];
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::Quant { x, dequantize, qtype, outer, channels, inner, scale, zero } => {
            let d = QuantDesc {
                mode: if *dequantize { QUANT_DEQUANTIZE } else { QUANT_QUANTIZE },
                qtype: qtype_code(op, *qtype)?,
                outer: *outer,
                channels: *channels,
                inner: *inner,
                ..Default::default()
            }
            .with_header();
            let r = vec![
                reloc(offset_of!(QuantDesc, scale_va), off(*scale)),
                reloc(offset_of!(QuantDesc, zero_va), off(*zero)),
                reloc(offset_of!(QuantDesc, in_va), off(*x)),
                reloc(offset_of!(QuantDesc, out_va), o),
            ];
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::QGemm { a, a_type, a_zero, b, b_zero, bias, scale, m, n, k, out } => {
            let d = QGemmDesc {
                m: u32c(op, *m, "m")?,
                n: u32c(op, *n, "n")?,
                k: u32c(op, *k, "k")?,
                flags: qflags(*b_zero, *bias, out),
                a_type: qtype_code(op, *a_type)?,
                out_type: qtype_code(op, out.dtype)?,
                a_zero: *a_zero,
                out_zero: out.zero,
                out_min: out.min,
                out_max: out.max,
                ..Default::default()
            }
            .with_header();
            let mut r = vec![
                reloc(offset_of!(QGemmDesc, a_va), off(*a)),
                reloc(offset_of!(QGemmDesc, b_va), off(*b)),
                reloc(offset_of!(QGemmDesc, scale_va), off(*scale)),
                reloc(offset_of!(QGemmDesc, out_va), o),
            ];
            if let Some(z) = b_zero {
                r.push(reloc(offset_of!(QGemmDesc, b_zero_va), off(*z)));
            }
            if let Some(bv) = bias {
                r.push(reloc(offset_of!(QGemmDesc, bias_va), off(*bv)));
            }
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::Tile { program, grid, params, bufs, .. } => {
            let elem = g.values[op.out].dtype.size();
            let mut d = TileDesc {
                program_size: u32c(op, g.values[*program].elems(), "tile program size")?,
                nbufs: bufs.len() as u32,
                grid: *grid,
                nparams: params.len() as u32,
                ..Default::default()
            }
            .with_header();
            d.params[..params.len()].copy_from_slice(params);
            let mut r = vec![reloc(offset_of!(TileDesc, program_va), off(*program))];
            for (i, tb) in bufs.iter().enumerate() {
                d.buf_len[i] = tb.len;
                let at = match tb.value {
                    Some(v) => off(v),
                    None => o + elem * tb.offset,
                };
                r.push(reloc(offset_of!(TileDesc, buf_va) + 8 * i, at));
            }
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::QBinary { kind, a, a_q, b, b_q, out_q, relu, count } => {
            let d = QBinaryDesc {
                kind: *kind as u32,
                flags: if *relu { QBINARY_RELU } else { 0 },
                a_type: qtype_code(op, a_q.dtype)?,
                b_type: qtype_code(op, b_q.dtype)?,
                out_type: qtype_code(op, out_q.dtype)?,
                a_scale: a_q.scale,
                b_scale: b_q.scale,
                out_scale: out_q.scale,
                a_zero: a_q.zero,
                b_zero: b_q.zero,
                out_zero: out_q.zero,
                count: *count,
                ..Default::default()
            }
            .with_header();
            let r = vec![reloc(offset_of!(QBinaryDesc, a_va), off(*a)), reloc(offset_of!(QBinaryDesc, b_va), off(*b)), reloc(offset_of!(QBinaryDesc, out_va), o)];
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::QConv { quads, tiles, x, x_type, x_zero, w, w_zero, bias, scale, dims, stride, dilation, pads, out } => {
            let d = QConvDesc {
                n: u32c(op, dims[0], "n")?,
                c_in: u32c(op, dims[1], "c_in")?,
                h: u32c(op, dims[2], "h")?,
                w: u32c(op, dims[3], "w")?,
                c_out: u32c(op, dims[4], "c_out")?,
                kh: u32c(op, dims[5], "kh")?,
                kw: u32c(op, dims[6], "kw")?,
                groups: u32c(op, dims[7], "groups")?,
                stride_h: u32c(op, stride[0], "stride")?,
                stride_w: u32c(op, stride[1], "stride")?,
                dil_h: u32c(op, dilation[0], "dilation")?,
                dil_w: u32c(op, dilation[1], "dilation")?,
                pad_top: u32c(op, pads[0], "pad")?,
                pad_left: u32c(op, pads[1], "pad")?,
                pad_bottom: u32c(op, pads[2], "pad")?,
                pad_right: u32c(op, pads[3], "pad")?,
                flags: qflags(*w_zero, *bias, out) | if *quads { rbln_hw::ops::QCONV_CHANNEL_QUADS } else { 0 } | if *tiles { rbln_hw::ops::QCONV_WEIGHT_TILES } else { 0 },
                x_type: qtype_code(op, *x_type)?,
                out_type: qtype_code(op, out.dtype)?,
                x_zero: *x_zero,
                out_zero: out.zero,
                out_min: out.min,
                out_max: out.max,
                ..Default::default()
            }
            .with_header();
            let mut r = vec![
                reloc(offset_of!(QConvDesc, x_va), off(*x)),
                reloc(offset_of!(QConvDesc, w_va), off(*w)),
                reloc(offset_of!(QConvDesc, scale_va), off(*scale)),
                reloc(offset_of!(QConvDesc, out_va), o),
            ];
            if let Some(z) = w_zero {
                r.push(reloc(offset_of!(QConvDesc, w_zero_va), off(*z)));
            }
            if let Some(bv) = bias {
                r.push(reloc(offset_of!(QConvDesc, bias_va), off(*bv)));
            }
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::Cast { x, from, to } => {
            let code = |t: &DType| match t {
                DType::I32 => Ok(CAST_I32),
                DType::I64 => Ok(CAST_I64),
                DType::Bool => Ok(CAST_BOOL),
                DType::F32 => Ok(CAST_F32),
                other => Err(CompileError::Invalid(format!("{}: no device cast for {}", op.name, other.name()))),
            };
            let d = CastDesc { src_type: code(from)?, dst_type: code(to)?, count: g.values[op.out].elems(), ..Default::default() }
                .with_header();
            let r = vec![reloc(offset_of!(CastDesc, in_va), off(*x)), reloc(offset_of!(CastDesc, out_va), o)];
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::Resize { x, dims, out, sampling, map } => {
            let (mode, nearest_mode, cubic_a, flags) = match *sampling {
                Sampling::Nearest(rounding) => (RESIZE_NEAREST, rounding, 0.0, 0),
                Sampling::Linear => (RESIZE_LINEAR, 0, 0.0, 0),
                Sampling::Cubic { a, exclude_outside } => (RESIZE_CUBIC, 0, a, if exclude_outside { RESIZE_EXCLUDE_OUTSIDE } else { 0 }),
            };
            let d = ResizeDesc {
                mode,
                nearest_mode,
                cubic_a,
                flags,
                n: u32c(op, dims[0], "n")?,
                c: u32c(op, dims[1], "c")?,
                h: u32c(op, dims[2], "h")?,
                w: u32c(op, dims[3], "w")?,
                oh: u32c(op, out[0], "oh")?,
                ow: u32c(op, out[1], "ow")?,
                scale_y: map[0],
                offset_y: map[1],
                scale_x: map[2],
                offset_x: map[3],
                ..Default::default()
            }
            .with_header();
            let r = vec![reloc(offset_of!(ResizeDesc, in_va), off(*x)), reloc(offset_of!(ResizeDesc, out_va), o)];
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::GridSample { x, grid, dims, out, mode, padding, align_corners } => {
            let d = GridSampleDesc {
                mode: *mode,
                padding: *padding,
                flags: if *align_corners { GRID_ALIGN_CORNERS } else { 0 },
                n: u32c(op, dims[0], "n")?,
                c: u32c(op, dims[1], "c")?,
                h: u32c(op, dims[2], "h")?,
                w: u32c(op, dims[3], "w")?,
                oh: u32c(op, out[0], "oh")?,
                ow: u32c(op, out[1], "ow")?,
                ..Default::default()
            }
            .with_header();
            let r = vec![
                reloc(offset_of!(GridSampleDesc, in_va), off(*x)),
                reloc(offset_of!(GridSampleDesc, grid_va), off(*grid)),
                reloc(offset_of!(GridSampleDesc, out_va), o),
            ];
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::TopK { x, outer, len, inner, k, largest } => {
            let d = TopKDesc {
                outer: u32c(op, *outer, "outer")?,
                len: u32c(op, *len, "len")?,
                inner: u32c(op, *inner, "inner")?,
                k: u32c(op, *k, "k")?,
                flags: if *largest { TOPK_LARGEST } else { 0 },
                ..Default::default()
            }
            .with_header();
            // Values, then indices, in the one output.
            let r = vec![
                reloc(offset_of!(TopKDesc, in_va), off(*x)),
                reloc(offset_of!(TopKDesc, values_va), o),
                reloc(offset_of!(TopKDesc, indices_va), o + outer * k * inner * 4),
            ];
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::Recurrent { cell, flags, x, r, rb, h0, c0, seq, batch, hidden } => {
            let d = RecurrentDesc {
                cell: *cell,
                flags: *flags,
                seq: u32c(op, *seq, "seq")?,
                batch: u32c(op, *batch, "batch")?,
                hidden: u32c(op, *hidden, "hidden")?,
                ..Default::default()
            }
            .with_header();
            // Every step's h, then an LSTM's final c, in the one output.
            let mut r = vec![
                reloc(offset_of!(RecurrentDesc, x_va), off(*x)),
                reloc(offset_of!(RecurrentDesc, r_va), off(*r)),
                reloc(offset_of!(RecurrentDesc, y_va), o),
            ];
            for (at, v) in [(offset_of!(RecurrentDesc, rb_va), rb), (offset_of!(RecurrentDesc, h0_va), h0), (offset_of!(RecurrentDesc, c0_va), c0)] {
                if let Some(v) = v {
                    r.push(reloc(at, off(*v)));
                }
            }
            if *cell == REC_LSTM {
                r.push(reloc(offset_of!(RecurrentDesc, c_va), o + seq * batch * hidden * 4));
            }
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::Where { cond, a, b, cond_dims, a_dims, b_dims } => {
            let d = WhereDesc {
                rank: a_dims.len() as u32,
                cond_dims: dims6(op, cond_dims, "cond dims")?,
                a_dims: dims6(op, a_dims, "a dims")?,
                b_dims: dims6(op, b_dims, "b dims")?,
                ..Default::default()
            }
            .with_header();
            let r = vec![
                reloc(offset_of!(WhereDesc, cond_va), off(*cond)),
                reloc(offset_of!(WhereDesc, a_va), off(*a)),
                reloc(offset_of!(WhereDesc, b_va), off(*b)),
                reloc(offset_of!(WhereDesc, out_va), o),
            ];
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::Eltwise { inputs, in_strides, out_dims, program, out_reg } => {
            let mut d = EltwiseDesc {
                rank: out_dims.len() as u32,
                n_inputs: inputs.len() as u32,
                n_instrs: program.len() as u32,
                out_reg: u32::from(*out_reg),
                out_dims: dims6(op, out_dims, "dims")?,
                ..Default::default()
            };
            for (slot, st) in d.in_strides.iter_mut().zip(in_strides) {
                *slot = u64x6(st);
            }
            for (slot, ins) in d.instrs.iter_mut().zip(program) {
                *slot = *ins;
            }
            let d = d.with_header();
            let mut r: Vec<_> = inputs.iter().enumerate().map(|(i, &(v, at))| reloc(offset_of!(EltwiseDesc, in_va) + 8 * i, off(v) + 4 * at)).collect();
            r.push(reloc(offset_of!(EltwiseDesc, out_va), o));
            vec![(d.to_bytes().to_vec(), r)]
        }
        Kind::View { .. } | Kind::ConcatView { .. } | Kind::SliceView { .. } => Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_reuses_bytes_of_dead_values() {
        // a chain x -> y -> z -> w: x and z can share, y and w can share.
        let items = [
            Interval { first: 1, last: 2, size: 1000 },
            Interval { first: 2, last: 3, size: 1000 },
            Interval { first: 3, last: 4, size: 1000 },
            Interval { first: 4, last: 5, size: 1000 },
        ];
        let (off, end) = plan(&items);
        assert_eq!(end, 2 * 1024);
        for i in 0..4 {
            for j in 0..4 {
                let overlap_t = items[i].first <= items[j].last && items[j].first <= items[i].last;
                if i != j && overlap_t {
                    assert_ne!(off[i], off[j], "{i} and {j} are live together");
                }
            }
        }
    }
}
