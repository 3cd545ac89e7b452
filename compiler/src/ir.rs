//! The compiler's graph: values with static shapes (constants carry their
//! data) and device ops, each producing one value.

use rbln_format::DType;
use rbln_hw::ops::{Binary, EltInstr, Unary};

pub type ValueId = usize;

/// Compile-time tensor data. Integer types are widened to i64.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F(Vec<f32>),
    I(Vec<i64>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Const {
    pub shape: Vec<u64>,
    pub data: Data,
}

impl Const {
    pub fn f32(shape: &[u64], v: Vec<f32>) -> Self {
        Const { shape: shape.to_vec(), data: Data::F(v) }
    }
    pub fn i64(shape: &[u64], v: Vec<i64>) -> Self {
        Const { shape: shape.to_vec(), data: Data::I(v) }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn len(&self) -> usize {
        match &self.data {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
        }
    }
    pub fn is_float(&self) -> bool {
        matches!(self.data, Data::F(_))
    }
    /// Values as i64 (floats truncated).
    pub fn ints(&self) -> Vec<i64> {
        match &self.data {
            Data::F(v) => v.iter().map(|&x| x as i64).collect(),
            Data::I(v) => v.clone(),
        }
    }
    pub fn floats(&self) -> Vec<f32> {
        match &self.data {
            Data::F(v) => v.clone(),
            Data::I(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }
    /// The single value of a one-element constant.
    pub fn scalar(&self) -> Option<f32> {
        (self.len() == 1).then(|| self.floats()[0])
    }
}

/// A tensor in the graph. `konst` is set for values known at compile time
/// (initializers and everything folded from them).
#[derive(Clone, Debug)]
pub struct Value {
    pub name: String,
    pub shape: Vec<u64>,
    pub konst: Option<Const>,
    /// Element type at run time: f32, except integer and bool model
    /// inputs, the indices and casts derived from them.
    pub dtype: DType,
}

impl Value {
    pub fn elems(&self) -> u64 {
        crate::shape::volume(&self.shape)
    }
}

/// A fused activation (unary code usable in Gemm/Conv descriptors).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Act {
    pub kind: Unary,
    pub p0: f32,
    pub p1: f32,
}

impl Act {
    pub const NONE: Act = Act { kind: Unary::None, p0: 0.0, p1: 0.0 };
}

/// Per-tensor quantisation of an 8-bit value: type (U8 / I8), scale, zero
/// point.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QParam {
    pub dtype: DType,
    pub scale: f32,
    pub zero: i32,
}

/// How an int8 op's output is written: `U8`/`I8` requantised with a zero
/// point and clamped to `[min, max]` (a fused ReLU raises `min` to the
/// zero point), or `F32` dequantised (optionally through a ReLU).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QOut {
    pub dtype: DType,
    pub zero: i32,
    pub min: i32,
    pub max: i32,
    pub relu: bool,
}

/// What a dequantised value was made from (QuantizeLinear /
/// DequantizeLinear bookkeeping for the int8 lowering): `q`, an integer
/// tensor of `qtype` (u8, i8 or i32), with `scale` and `zero` per index of
/// `axis` (one entry each when per-tensor, `axis` then `None`).
#[derive(Clone, Debug, PartialEq)]
pub struct QInfo {
    pub q: ValueId,
    pub qtype: DType,
    pub scale: Vec<f32>,
    pub zero: Vec<i64>,
    pub axis: Option<usize>,
}

/// One rank-`sizes.len()` box copied from `src` into the op's output
/// (strides and offsets in elements).
#[derive(Clone, Debug, PartialEq)]
pub struct CopyPart {
    pub src: ValueId,
    pub src_offset: u64,
    pub dst_offset: u64,
    pub sizes: Vec<u64>,
    pub src_strides: Vec<u64>,
    pub dst_strides: Vec<u64>,
}

/// How a RESIZE samples its input at a source coordinate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    /// The nearest input, rounding as `rbln_hw::ops::RESIZE_ROUND_*` /
    /// `RESIZE_FLOOR` / `RESIZE_CEIL` says.
    Nearest(u32),
    Linear,
    /// Keys' bicubic kernel with coefficient `a`; `exclude_outside` drops
    /// taps beyond the edges and renormalises.
    Cubic { a: f32, exclude_outside: bool },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    Gemm {
        a: ValueId,
        b: ValueId,
        bias: Option<ValueId>,
        m: u64,
        n: u64,
        k: u64,
        batch: u64,
        /// Batch strides in elements (0 broadcasts).
        strides: [u64; 3],
        trans_a: bool,
        trans_b: bool,
        /// B is a constant in the cores' panel layout (see [`crate::pack`]);
        /// `strides[1]` then counts packed matrices.
        b_packed: bool,
        /// Added before the activation; laid out like the output.
        residual: Option<ValueId>,
        act: Act,
    },
    Conv {
        x: ValueId,
        w: ValueId,
        bias: Option<ValueId>,
        /// n, c_in, h, w, c_out, kh, kw, groups.
        dims: [u64; 8],
        stride: [u64; 2],
        dilation: [u64; 2],
        /// top, left, bottom, right.
        pads: [u64; 4],
        /// Added before the activation; shaped like the output.
        residual: Option<ValueId>,
        act: Act,
        /// `w` holds the filters in Winograd F(2×2, 3×3)'s domain
        /// (`rbln_hw::ops::winograd_weights`, flag `CONV_WINOGRAD`): set by
        /// `pack::run` only.
        winograd: bool,
    },
    Pool {
        x: ValueId,
        max: bool,
        count_include_pad: bool,
        /// 8-bit elements (max pooling of quantised values; Some(signed),
        /// set by the int8 pass), else f32.
        int8: Option<bool>,
        /// n, c, h, w.
        dims: [u64; 4],
        kernel: [u64; 2],
        stride: [u64; 2],
        dilation: [u64; 2],
        pads: [u64; 4],
    },
    Binary {
        kind: Binary,
        a: ValueId,
        b: ValueId,
        /// Both padded to the same rank.
        a_dims: Vec<u64>,
        b_dims: Vec<u64>,
        /// Applied to the result.
        act: Act,
    },
    Unary { kind: Unary, x: ValueId, p0: f32, p1: f32 },
    /// Softmax, or (`log`) log-softmax, along `axis`.
    Softmax { x: ValueId, dims: Vec<u64>, axis: u64, log: bool },
    /// Layer normalisation of each row of `cols` elements; `rms`: without
    /// subtracting the mean (RMSNorm).
    LayerNorm { x: ValueId, gamma: Option<ValueId>, beta: Option<ValueId>, rows: u64, cols: u64, eps: f32, rms: bool },
    /// `kind` is one of rbln_hw::ops::REDUCE_*.
    Reduce { kind: u32, x: ValueId, dims: Vec<u64>, axis: u64 },
    Transpose { x: ValueId, dims: Vec<u64>, perm: Vec<u64> },
    Copy { parts: Vec<CopyPart> },
    /// `indices` is a constant (i64) or a run-time i32/i64 value.
    Gather { data: ValueId, indices: ValueId, dims: Vec<u64>, axis: u64, count: u64 },
    /// Element-wise conversion between run-time dtypes.
    Cast { x: ValueId, from: DType, to: DType },
    /// Spatial resize of `[n, c, h, w]` to `[n, c, out[0], out[1]]`:
    /// output (y, x) samples the input at `(map[0]·y + map[1], map[2]·x +
    /// map[3])` as `sampling` says.
    Resize { x: ValueId, dims: [u64; 4], out: [u64; 2], sampling: Sampling, map: [f32; 4] },
    /// `[n, c, h, w]` sampled at the normalised (x, y) pairs of `grid`
    /// `[n, out[0], out[1], 2]`; `mode` and `padding` are GRID_* codes.
    GridSample { x: ValueId, grid: ValueId, dims: [u64; 4], out: [u64; 2], mode: u32, padding: u32, align_corners: bool },
    /// The `k` largest (or smallest) of each line of `x` viewed as
    /// `[outer, len, inner]`, sorted: the output `[2, outer·k·inner]`
    /// holds the values, then their indices as f32.
    TopK { x: ValueId, outer: u64, len: u64, inner: u64, k: u64, largest: bool },
    /// `cond ≠ 0 ? a : b` with broadcasting; all dims padded to one rank.
    Where { cond: ValueId, a: ValueId, b: ValueId, cond_dims: Vec<u64>, a_dims: Vec<u64>, b_dims: Vec<u64> },
    /// Constant padding: the output (`dims` grown by `begin` and `end`, and
    /// each axis spread by its `step`: `(d − 1)·step + 1`) is filled with
    /// `value`, then `x` is copied into it at `begin`, element `i` of an
    /// axis at `begin + i·step` (steps > 1 interleave zeros, as a
    /// transposed convolution needs).
    Pad { x: ValueId, value: f32, dims: Vec<u64>, begin: Vec<u64>, end: Vec<u64>, step: Vec<u64> },
    /// The output reinterprets the input's bytes with another shape.
    View { x: ValueId },
    /// The output is `parts` side by side, their producers having written
    /// them in place (a concatenation without a copy; crate::storage).
    ConcatView { parts: Vec<ValueId> },
    /// The output is the contiguous bytes of `x` from byte `offset` on (a
    /// slice or split part read in place; crate::storage).
    SliceView { x: ValueId, offset: u64 },
    /// int8 quantise (f32 → `qtype`) or dequantise (`qtype` → f32) of `x`
    /// viewed as `[outer, channels, inner]`; `scale` (f32) and `zero`
    /// (i32) are constants of `channels` entries.
    Quant { x: ValueId, dequantize: bool, qtype: DType, outer: u64, channels: u64, inner: u64, scale: ValueId, zero: ValueId },
    /// int8 GEMM `[m × k]·[k × n]` with int32 accumulation: `b` is an i8
    /// constant in the cores' packed layout, `b_zero` / `bias` i32 and
    /// `scale` f32 constants of `n` entries.
    QGemm { a: ValueId, a_type: DType, a_zero: i32, b: ValueId, b_zero: Option<ValueId>, bias: Option<ValueId>, scale: ValueId, m: u64, n: u64, k: u64, out: QOut },
    /// int8 element-wise Add / Mul of two per-tensor quantised values of
    /// `count` elements each, as its QDQ definition, into a quantised
    /// output (`relu` before quantising).
    QBinary {
        kind: Binary,
        a: ValueId,
        a_q: QParam,
        b: ValueId,
        b_q: QParam,
        out_q: QParam,
        relu: bool,
        count: u64,
    },
    /// int8 convolution (geometry as `Conv`); `w` holds one packed B
    /// operand per group, its reduction in channel quads when `quads`
    /// (`rbln_hw::ops::QCONV_CHANNEL_QUADS`), in the tile layout when
    /// `tiles` (`QCONV_WEIGHT_TILES`, else panels); per-output-channel
    /// constants as in `QGemm`.
    QConv {
        quads: bool,
        tiles: bool,
        x: ValueId,
        x_type: DType,
        x_zero: i32,
        w: ValueId,
        w_zero: Option<ValueId>,
        bias: Option<ValueId>,
        scale: ValueId,
        dims: [u64; 8],
        stride: [u64; 2],
        dilation: [u64; 2],
        pads: [u64; 4],
        out: QOut,
    },
    /// A tile program (a lowered Triton kernel, [`crate::ttir`]) over
    /// `grid`: `program` is its bytes (a u8 constant), buffer slot `i` is
    /// `bufs[i]`, the scalar parameters' bits `params`. The output holds
    /// every buffer the program stores to, back to back; before the
    /// program runs it is zero-filled, then each `(value, byte offset)` of
    /// `init` is copied in (buffers the kernel reads and writes).
    Tile { program: ValueId, grid: [u32; 3], params: Vec<u64>, bufs: Vec<TileBuf>, init: Vec<(ValueId, u64)> },
    /// A fused chain of element-wise ops ([`crate::eltwise`]): register
    /// `i` starts as input `i`, value `inputs[i].0` read from element
    /// `inputs[i].1` on with the element strides `in_strides[i]` (one per
    /// output dim, 0 broadcasting); `program` runs on every element of
    /// `out_dims`; the output is register `out_reg`.
    Eltwise { inputs: Vec<(ValueId, u64)>, in_strides: Vec<Vec<u64>>, out_dims: Vec<u64>, program: Vec<EltInstr>, out_reg: u8 },
    /// One direction of a recurrent layer (rbln_hw::ops::RecurrentDesc;
    /// `cell` a REC_* code, `flags` REC_* flags): `x` the input projection
    /// `[seq, batch, G·hidden]`, `r` the constant `Rᵀ` `[hidden, G·hidden]`,
    /// `rb` a linear-before-reset GRU's `Rb_h`, `h0` / `c0` initial states
    /// (`None`: zeros). The output holds every step's hidden state
    /// `[seq, batch, hidden]`, then (LSTM) the final cell state.
    Recurrent { cell: u32, flags: u32, x: ValueId, r: ValueId, rb: Option<ValueId>, h0: Option<ValueId>, c0: Option<ValueId>, seq: u64, batch: u64, hidden: u64 },
}

/// A TILE operand: buffer `value` (or, if `None`, the op's output from
/// element `offset`), `len` elements.
#[derive(Clone, Debug, PartialEq)]
pub struct TileBuf {
    pub value: Option<ValueId>,
    pub offset: u64,
    pub len: u64,
}

impl Kind {
    /// Every value the op reads.
    pub fn inputs(&self) -> Vec<ValueId> {
        use Kind::*;
        match self {
            Gemm { a, b, bias, residual, .. } => [Some(*a), Some(*b), *bias, *residual].into_iter().flatten().collect(),
            Conv { x, w, bias, residual, .. } => [Some(*x), Some(*w), *bias, *residual].into_iter().flatten().collect(),
            Pool { x, .. } | Unary { x, .. } | Softmax { x, .. } | Reduce { x, .. } | Transpose { x, .. } | Pad { x, .. } | View { x } | Cast { x, .. } | Resize { x, .. } | TopK { x, .. } | SliceView { x, .. } => vec![*x],
            Binary { a, b, .. } => vec![*a, *b],
            Where { cond, a, b, .. } => vec![*cond, *a, *b],
            GridSample { x, grid, .. } => vec![*x, *grid],
            LayerNorm { x, gamma, beta, .. } => [Some(*x), *gamma, *beta].into_iter().flatten().collect(),
            Copy { parts } => {
                let mut v: Vec<ValueId> = parts.iter().map(|p| p.src).collect();
                v.dedup();
                v
            }
            ConcatView { parts } => parts.clone(),
            Gather { data, indices, .. } => vec![*data, *indices],
            Quant { x, scale, zero, .. } => vec![*x, *scale, *zero],
            QGemm { a, b, b_zero, bias, scale, .. } => [Some(*a), Some(*b), *b_zero, *bias, Some(*scale)].into_iter().flatten().collect(),
            QConv { x, w, w_zero, bias, scale, .. } => [Some(*x), Some(*w), *w_zero, *bias, Some(*scale)].into_iter().flatten().collect(),
            QBinary { a, b, .. } => vec![*a, *b],
            Recurrent { x, r, rb, h0, c0, .. } => [Some(*x), Some(*r), *rb, *h0, *c0].into_iter().flatten().collect(),
            Eltwise { inputs, .. } => {
                let mut v: Vec<ValueId> = inputs.iter().map(|i| i.0).collect();
                v.dedup();
                v
            }
            Tile { program, bufs, init, .. } => {
                let mut v = vec![*program];
                for b in bufs.iter().filter_map(|b| b.value).chain(init.iter().map(|i| i.0)) {
                    if !v.contains(&b) {
                        v.push(b);
                    }
                }
                v
            }
        }
    }
}

/// A device op: `kind` computes `out`. `name` is the ONNX node it came
/// from; `op` is the ONNX op type, or the fused ops joined by '+'.
#[derive(Clone, Debug)]
pub struct Op {
    pub name: String,
    pub op: String,
    pub kind: Kind,
    pub out: ValueId,
}

/// The imported graph.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub values: Vec<Value>,
    pub ops: Vec<Op>,
    pub inputs: Vec<(String, ValueId)>,
    pub outputs: Vec<(String, ValueId)>,
    /// Values integer inputs may hold (`lo..hi`), from the ops that use
    /// them as indices.
    pub ranges: Vec<(ValueId, i64, i64)>,
    /// Values that are dequantised integer tensors (from
    /// DequantizeLinear), for the int8 lowering.
    pub dequantized: std::collections::HashMap<ValueId, QInfo>,
}

impl Graph {
    pub fn add_value(&mut self, name: &str, shape: Vec<u64>, konst: Option<Const>) -> ValueId {
        self.values.push(Value { name: name.into(), shape, konst, dtype: DType::F32 });
        self.values.len() - 1
    }
    /// Narrows the values input `v` may hold to `lo..hi`.
    pub fn restrict_range(&mut self, v: ValueId, lo: i64, hi: i64) {
        match self.ranges.iter_mut().find(|r| r.0 == v) {
            Some(r) => {
                r.1 = r.1.max(lo);
                r.2 = r.2.min(hi);
            }
            None => self.ranges.push((v, lo, hi)),
        }
    }
    pub fn konst(&self, v: ValueId) -> Option<&Const> {
        self.values[v].konst.as_ref()
    }
}
