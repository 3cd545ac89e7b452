//! Compute descriptors: what a COMPUTE packet points at.
//!
//! A descriptor starts with an [`OpHeader`] (op code and the descriptor's
//! size in bytes, which must equal the op's fixed size) followed by the
//! op's fields. Tensors are dense fp32, row-major, addressed by device VA
//! (4-byte aligned). Shapes up to rank [`MAX_RANK`]; unused dims must be 0.
//! Reserved fields must be zero. The device validates every shape against
//! the sizes and faults with `BadDescriptor` on any inconsistency.

pub use super::tile::TileDesc;

pub const MAX_RANK: usize = 6;

/// Largest descriptor a COMPUTE packet may name (bytes); larger is a
/// BadDescriptor fault.
pub const MAX_DESC_SIZE: usize = 4096;

/// Op codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum OpCode {
    Gemm = 1,
    Conv2d = 2,
    Pool = 3,
    Binary = 4,
    Unary = 5,
    Softmax = 6,
    LayerNorm = 7,
    Reduce = 8,
    Transpose = 9,
    StridedCopy = 10,
    Gather = 11,
    Cast = 12,
    Resize = 13,
    Where = 14,
    /// int8 quantise / dequantise (hardware minor version 6).
    Quant = 15,
    /// int8 GEMM with int32 accumulation and fused requantisation (minor 6).
    QGemm = 16,
    /// int8 2-D convolution, int32 accumulation, fused requantisation
    /// (minor 6).
    QConv = 17,
    /// int8 element-wise add or multiply with requantisation (minor 7).
    QBinary = 18,
    /// A tile program over a grid of instances ([`crate::tile`]; minor 8).
    Tile = 19,
    /// Sampling of an NCHW tensor at per-output normalised positions
    /// (minor 10).
    GridSample = 20,
    /// The k largest or smallest elements along an axis, sorted, with
    /// their indices (minor 10).
    TopK = 21,
    /// A fused chain of element-wise unary and binary functions over up to
    /// four broadcast inputs, in one pass (minor 11).
    Eltwise = 22,
    /// A recurrent layer (LSTM, GRU or RNN cell) run over a whole sequence
    /// for one direction (minor 12).
    Recurrent = 23,
    /// Up to [`MAX_CONCAT_PARTS`] row-major sources side by side in each
    /// row of the output: a concatenation in one op (minor 14).
    Concat = 24,
}

/// Unary functions; codes 0..=7 double as fused activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Unary {
    /// Identity (no activation).
    None = 0,
    Relu = 1,
    /// Exact GELU: x * Phi(x) (erf form).
    Gelu = 2,
    /// GELU, tanh approximation.
    GeluTanh = 3,
    Silu = 4,
    Sigmoid = 5,
    Tanh = 6,
    /// clamp(x, param0, param1).
    Clip = 7,
    Exp = 8,
    Log = 9,
    Sqrt = 10,
    Neg = 11,
    Abs = 12,
    Erf = 13,
    Reciprocal = 14,
    /// clamp(param0 * x + param1, 0, 1) (ONNX HardSigmoid: alpha, beta);
    /// since hardware minor version 1.
    HardSigmoid = 15,
    /// x * clamp(x / 6 + 1/2, 0, 1); since hardware minor version 1.
    HardSwish = 16,
    /// sin(x), x in radians; since hardware minor version 3.
    Sin = 17,
    /// cos(x), x in radians; since hardware minor version 3.
    Cos = 18,
    /// Rounding to an integral value, and the sign (-1, 0 or 1; NaN stays
    /// NaN); since hardware minor version 10. Round is half to even.
    Floor = 19,
    Ceil = 20,
    Round = 21,
    Sign = 22,
}

/// Largest of the unary codes 0..=7 usable as a fused activation.
pub const MAX_ACTIVATION: u32 = Unary::Clip as u32;

/// Whether unary `code` may be fused as an activation: 0..=7, and the
/// hard sigmoid and hard swish of minor version 1.
pub const fn is_activation(code: u32) -> bool {
    code <= MAX_ACTIVATION || code == Unary::HardSigmoid as u32 || code == Unary::HardSwish as u32
}

impl Unary {
    pub fn from_u32(v: u32) -> Option<Self> {
        use Unary::*;
        Some(match v {
            0 => None,
            1 => Relu,
            2 => Gelu,
            3 => GeluTanh,
            4 => Silu,
            5 => Sigmoid,
            6 => Tanh,
            7 => Clip,
            8 => Exp,
            9 => Log,
            10 => Sqrt,
            11 => Neg,
            12 => Abs,
            13 => Erf,
            14 => Reciprocal,
            15 => HardSigmoid,
            16 => HardSwish,
            17 => Sin,
            18 => Cos,
            19 => Floor,
            20 => Ceil,
            21 => Round,
            22 => Sign,
            _ => return Option::None,
        })
    }
}

/// Element-wise binary functions (numpy broadcasting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Binary {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
    Max = 4,
    Min = 5,
    Pow = 6,
    /// Comparisons (hardware minor version 2): 1.0 where `a (op) b`
    /// holds, else 0.0 (any comparison with NaN is false).
    Equal = 7,
    Less = 8,
    Greater = 9,
    LessOrEqual = 10,
    GreaterOrEqual = 11,
    /// Remainders (hardware minor version 10): `a - b·floor(a / b)`, the
    /// sign of the divisor (ONNX Mod with fmod = 0, Python's `%`), and
    /// `a - b·trunc(a / b)`, the sign of the dividend (C `fmod`, ONNX Mod
    /// with fmod = 1). A zero divisor gives NaN.
    Mod = 12,
    FMod = 13,
}

impl Binary {
    pub fn from_u32(v: u32) -> Option<Self> {
        use Binary::*;
        Some(match v {
            0 => Add,
            1 => Sub,
            2 => Mul,
            3 => Div,
            4 => Max,
            5 => Min,
            6 => Pow,
            7 => Equal,
            8 => Less,
            9 => Greater,
            10 => LessOrEqual,
            11 => GreaterOrEqual,
            12 => Mod,
            13 => FMod,
            _ => return None,
        })
    }
}

pub const POOL_MAX: u32 = 0;
pub const POOL_AVG: u32 = 1;
/// Pool flag: padded positions count in the average's divisor.
pub const POOL_COUNT_INCLUDE_PAD: u32 = 1 << 0;
/// Pool flag (MAX only; hardware minor version 16): the elements are
/// bytes, u8, or i8 with [`POOL_SIGNED`]; a window without a real tap
/// gives the type's least value.
pub const POOL_INT8: u32 = 1 << 1;
/// Pool flag, with [`POOL_INT8`] only: the bytes are i8.
pub const POOL_SIGNED: u32 = 1 << 2;

pub const REDUCE_SUM: u32 = 0;
pub const REDUCE_MEAN: u32 = 1;
pub const REDUCE_MAX: u32 = 2;
pub const REDUCE_MIN: u32 = 3;
/// Index (as f32) of the first maximum / minimum along the axis; the LAST
/// variants take the last one (hardware minor version 2).
pub const REDUCE_ARGMAX: u32 = 4;
pub const REDUCE_ARGMIN: u32 = 5;
pub const REDUCE_ARGMAX_LAST: u32 = 6;
pub const REDUCE_ARGMIN_LAST: u32 = 7;

pub const GEMM_TRANS_A: u32 = 1 << 0;
pub const GEMM_TRANS_B: u32 = 1 << 1;
/// C = A*B + C instead of C = A*B (before bias and activation).
pub const GEMM_ACCUMULATE: u32 = 1 << 2;
pub const GEMM_BIAS: u32 = 1 << 3;
/// C = act(A*B + bias + R) with R at residual_va, laid out like C (since
/// hardware minor version 1).
pub const GEMM_RESIDUAL: u32 = 1 << 4;
/// B is stored in the compute cores' panel layout ([`pack_gemm_b`]) rather
/// than as a matrix: constant weights, laid out once by the compiler, are
/// streamed by the GEMM engine as they lie (since hardware minor version
/// 4). Excludes GEMM_TRANS_B.
pub const GEMM_B_PACKED: u32 = 1 << 5;
/// Columns per panel of a packed GEMM B operand: the width of the compute
/// cores' GEMM tile.
pub const GEMM_PANEL: usize = 16;

/// Elements of one packed `[k × n]` B matrix: `k` rows of every panel,
/// the last panel zero-padded to [`GEMM_PANEL`] columns. `None` on
/// overflow.
pub const fn gemm_packed_b_len(k: u64, n: u64) -> Option<u64> {
    let panels = n.div_ceil(GEMM_PANEL as u64);
    match panels.checked_mul(GEMM_PANEL as u64) {
        Some(w) => k.checked_mul(w),
        None => None,
    }
}

/// Writes `op(B)` (`[k × n]`; `b` holds B as `[k × n]`, or `[n × k]` when
/// `trans_b`) into `dst` in the packed layout of [`GEMM_B_PACKED`]: panel
/// `p` (columns `16p .. 16p+16`) is `k` consecutive rows of 16 elements,
/// element `(l, j)` at `dst[p·16k + 16l + (j − 16p)]`; columns `≥ n` are 0.
///
/// # Panics
/// If `b` does not hold `k·n` elements or `dst` is not
/// `gemm_packed_b_len(k, n)` long.
pub fn pack_gemm_b(b: &[f32], k: usize, n: usize, trans_b: bool, dst: &mut [f32]) {
    assert_eq!(b.len(), k * n, "B holds k·n elements");
    assert_eq!(Some(dst.len() as u64), gemm_packed_b_len(k as u64, n as u64), "dst is one packed matrix");
    if k == 0 {
        return;
    }
    for (p, panel) in dst.chunks_exact_mut(k * GEMM_PANEL).enumerate() {
        for (l, row) in panel.chunks_exact_mut(GEMM_PANEL).enumerate() {
            for (jj, v) in row.iter_mut().enumerate() {
                let j = p * GEMM_PANEL + jj;
                *v = if j >= n {
                    0.0
                } else if trans_b {
                    b[j * k + l]
                } else {
                    b[l * n + j]
                };
            }
        }
    }
}
/// Element types of the int8 ops (QUANT, QGEMM, QCONV). int8 tensors are
/// one byte per element; `QTYPE_F32` is only an output type (a dequantised
/// result, for float islands after an integer op).
pub const QTYPE_U8: u32 = 0;
pub const QTYPE_I8: u32 = 1;
pub const QTYPE_F32: u32 = 2;
/// The range of a QTYPE_U8 / QTYPE_I8 value.
pub const fn qtype_range(t: u32) -> Option<(i32, i32)> {
    match t {
        QTYPE_U8 => Some((0, 255)),
        QTYPE_I8 => Some((-128, 127)),
        _ => None,
    }
}
/// QUANT modes: f32 → int8 (`q = clamp(round_half_even(x / scale) +
/// zero)`) and int8 → f32 (`x = (q − zero) · scale`).
pub const QUANT_QUANTIZE: u32 = 0;
pub const QUANT_DEQUANTIZE: u32 = 1;
/// QGEMM / QCONV: add the int32 bias (per output column / channel).
pub const QGEMM_BIAS: u32 = 1 << 0;
/// QGEMM / QCONV: per-column int32 zero points of B at `b_zero_va`
/// (without it B's zero point is 0, as for symmetric weights).
pub const QGEMM_B_ZERO: u32 = 1 << 1;
/// QGEMM / QCONV with a QTYPE_F32 output: max(0, y).
pub const QGEMM_RELU: u32 = 1 << 2;
/// QCONV only (hardware minor version 15): the weights' reduction index
/// is in channel quads (see [`qconv_k`]): each group of 4 `k` is 4 input
/// channels of one tap, so
/// the device reads an NCHW input's 4 channels of a position side by side
/// instead of building im2col rows.
pub const QCONV_CHANNEL_QUADS: u32 = 1 << 3;
/// QCONV only (hardware minor version 17): the weights are in the tile
/// layout of [`pack_qconv_tiles`] (blocks of 16 output channels, each
/// channel's reduction bytes in rows of up to 64) instead of
/// [`pack_qgemm_b`]'s panels: the operand order of a matrix unit that
/// multiplies 16 channels' rows by 16 positions' columns.
pub const QCONV_WEIGHT_TILES: u32 = 1 << 4;
/// QBINARY: max(0, y) before quantising the result.
pub const QBINARY_RELU: u32 = 1 << 0;
/// Columns per panel of a packed int8 B operand.
pub const QGEMM_PANEL: usize = 8;
/// `k` per group of a packed int8 B operand: each group is
/// `QGEMM_PANEL × QGEMM_KGROUP` bytes, column-major within the group.
pub const QGEMM_KGROUP: usize = 4;

/// Bytes of one packed int8 `[k × n]` B matrix: `n` rounded up to
/// [`QGEMM_PANEL`] columns times `k` rounded up to [`QGEMM_KGROUP`].
/// `None` on overflow.
pub const fn qgemm_packed_b_len(k: u64, n: u64) -> Option<u64> {
    padded_int8_len(k, n, QGEMM_PANEL as u64)
}

/// `n` rounded up to `cols` times `k` rounded up to [`QGEMM_KGROUP`]:
/// the bytes of an int8 weight layout; `None` on overflow.
const fn padded_int8_len(k: u64, n: u64, cols: u64) -> Option<u64> {
    let w = match n.div_ceil(cols).checked_mul(cols) {
        Some(w) => w,
        None => return None,
    };
    match k.div_ceil(QGEMM_KGROUP as u64).checked_mul(QGEMM_KGROUP as u64) {
        Some(kp) => kp.checked_mul(w),
        None => None,
    }
}

/// The reduction length of one group's QCONV weights (`cin_g` input
/// channels per group, a `kh × kw` window): `cin_g·kh·kw`, ordered (c, ky,
/// kx); with [`QCONV_CHANNEL_QUADS`] `4⌈cin_g/4⌉·kh·kw`, ordered (c/4, ky,
/// kx, c%4): index `((c/4·kh + ky)·kw + kx)·4 + c%4`, the channels past
/// `cin_g` being padding whose weights equal the column's zero point (a
/// real 0). `None` on overflow.
pub const fn qconv_k(cin_g: u64, kh: u64, kw: u64, flags: u32) -> Option<u64> {
    let c = if flags & QCONV_CHANNEL_QUADS != 0 {
        match cin_g.div_ceil(4).checked_mul(4) {
            Some(c) => c,
            None => return None,
        }
    } else {
        cin_g
    };
    match c.checked_mul(kh) {
        Some(ck) => ck.checked_mul(kw),
        None => None,
    }
}

/// Reorders one group's conv weights `w` (`[c_out_g][cin_g][kh][kw]`,
/// rows of `cin_g·kh·kw`) into `dst`, rows of [`qconv_k`] with
/// [`QCONV_CHANNEL_QUADS`] (`[c_out_g][k]`, ready for [`pack_qgemm_b`]
/// with `trans_b`); `zero[o]` fills output channel o's padding channels.
///
/// # Panics
/// If `w` is not `c_out_g` rows, `zero` not `c_out_g` long or `dst` not
/// `c_out_g` rows of the quad order.
pub fn qconv_quad_order(w: &[i8], c_out_g: usize, cin_g: usize, kh: usize, kw: usize, zero: &[i8], dst: &mut [i8]) {
    let (taps, cq) = (kh * kw, cin_g.div_ceil(4) * 4);
    assert_eq!(w.len(), c_out_g * cin_g * taps, "w holds c_out_g rows of cin_g·kh·kw");
    assert_eq!(zero.len(), c_out_g, "one zero point per output channel");
    assert_eq!(dst.len(), c_out_g * cq * taps, "dst holds c_out_g rows of the quad order");
    for o in 0..c_out_g {
        let (src, row) = (&w[o * cin_g * taps..][..cin_g * taps], &mut dst[o * cq * taps..][..cq * taps]);
        for c in 0..cq {
            for t in 0..taps {
                row[((c / 4) * taps + t) * 4 + c % 4] = if c < cin_g { src[c * taps + t] } else { zero[o] };
            }
        }
    }
}

/// Writes int8 `op(B)` (`[k × n]`; `b` holds B as `[k × n]`, or `[n × k]`
/// when `trans_b`) into `dst` in the packed layout of QGEMM / QCONV
/// weights: panel `p` (columns `8p .. 8p+8`) is `⌈k/4⌉` groups of 32
/// bytes; element `(l, j)` is at `dst[p·8·kp + (l/4)·32 + (j − 8p)·4 +
/// l%4]` with `kp = 4⌈k/4⌉`. Padding rows and columns are 0. This is the
/// operand order of the cores' 8-bit multiply-add (4 consecutive `k` of
/// one column side by side).
///
/// # Panics
/// If `b` does not hold `k·n` elements or `dst` is not
/// `qgemm_packed_b_len(k, n)` long.
pub fn pack_qgemm_b(b: &[i8], k: usize, n: usize, trans_b: bool, dst: &mut [i8]) {
    assert_eq!(b.len(), k * n, "B holds k·n elements");
    assert_eq!(Some(dst.len() as u64), qgemm_packed_b_len(k as u64, n as u64), "dst is one packed matrix");
    let kp = k.div_ceil(QGEMM_KGROUP) * QGEMM_KGROUP;
    if kp == 0 {
        return;
    }
    for (p, panel) in dst.chunks_exact_mut(kp * QGEMM_PANEL).enumerate() {
        for (g, group) in panel.chunks_exact_mut(QGEMM_PANEL * QGEMM_KGROUP).enumerate() {
            for (i, v) in group.iter_mut().enumerate() {
                let (j, l) = (p * QGEMM_PANEL + i / QGEMM_KGROUP, g * QGEMM_KGROUP + i % QGEMM_KGROUP);
                *v = if j >= n || l >= k {
                    0
                } else if trans_b {
                    b[j * k + l]
                } else {
                    b[l * n + j]
                };
            }
        }
    }
}

/// Output channels per block of [`pack_qconv_tiles`]' layout.
pub const QTILE_COLS: usize = 16;
/// Groups of 4 `k` per row run of [`pack_qconv_tiles`]' layout (64 bytes).
pub const QTILE_GROUPS: usize = 16;

/// The taps of QCONV's tile layout: `kh·kw` with [`QCONV_CHANNEL_QUADS`]
/// (each tap's channel quads are one run), else 1 (`k` in order).
pub const fn qconv_tile_taps(kh: u64, kw: u64, flags: u32) -> u64 {
    if flags & QCONV_CHANNEL_QUADS != 0 {
        kh.saturating_mul(kw)
    } else {
        1
    }
}

/// Bytes of one group's QCONV weights in the tile layout (`k` rows, `n`
/// output channels): `n` rounded up to [`QTILE_COLS`] times `k` rounded up
/// to 4. `None` on overflow.
pub const fn qconv_tiled_len(k: u64, n: u64) -> Option<u64> {
    padded_int8_len(k, n, QTILE_COLS as u64)
}

/// Run `r` of tap `s` in one block of the tile layout (`kg` groups,
/// `taps` taps): its offset in the block and its length in quads (16,
/// or fewer for a tap's last run); channel `c`'s row starts `4·len·c`
/// bytes after it. (See [`qconv_tile_offset`].)
#[inline]
pub const fn qconv_tile_run(kg: usize, taps: usize, s: usize, r: usize) -> (usize, usize) {
    let qn = kg / taps;
    let rest = qn - QTILE_GROUPS * r;
    let len = if rest < QTILE_GROUPS { rest } else { QTILE_GROUPS };
    (QTILE_COLS * QGEMM_KGROUP * (qn * s + QTILE_GROUPS * r), len)
}

/// Where weight `(l, j)` (reduction index `l`, output channel `j`) of one
/// group lies in the tile layout, for `k` reduction rows and `taps` taps
/// ([`qconv_tile_taps`]; it divides `kg = ⌈k/4⌉`). Group `g = l/4` is
/// quad `q = g/taps` of tap `s = g%taps` (`qn = kg/taps` quads per tap),
/// channel `j` is `c = j%16` of block `b = j/16`: block `b` is `64·kg`
/// bytes, its tap `s` `64·qn` bytes, whose runs of 16 quads (`r = q/16`,
/// the last one `len = min(16, qn − 16r)` long) are `16·4·len` bytes
/// each: channel `c`'s row of `4·len` bytes, 4 bytes per quad. Offset
/// `64·kg·b + 64·qn·s + 1024·r + 4·len·c + 4·(q%16) + l%4`.
pub const fn qconv_tile_offset(k: usize, taps: usize, l: usize, j: usize) -> usize {
    let kg = k.div_ceil(QGEMM_KGROUP);
    let (g, b, c) = (l / QGEMM_KGROUP, j / QTILE_COLS, j % QTILE_COLS);
    let (q, s) = (g / taps, g % taps);
    let (run, len) = qconv_tile_run(kg, taps, s, q / QTILE_GROUPS);
    QTILE_COLS * QGEMM_KGROUP * kg * b + run + QGEMM_KGROUP * (len * c + q % QTILE_GROUPS) + l % QGEMM_KGROUP
}

/// Writes one group's QCONV weights `w` (`[n][k]`: output channel rows
/// of the reduction order, plain or [`qconv_quad_order`]) into `dst` in
/// the tile layout ([`qconv_tile_offset`]); padding channels and `k` are
/// 0.
///
/// # Panics
/// If `w` is not `n·k` long, `taps` does not divide `⌈k/4⌉` or `dst` is
/// not `qconv_tiled_len(k, n)` long.
pub fn pack_qconv_tiles(w: &[i8], k: usize, n: usize, taps: usize, dst: &mut [i8]) {
    assert_eq!(w.len(), k * n, "w holds n rows of k");
    let kg = k.div_ceil(QGEMM_KGROUP);
    assert!(taps > 0 && kg.is_multiple_of(taps), "taps divides the groups");
    assert_eq!(Some(dst.len() as u64), qconv_tiled_len(k as u64, n as u64), "dst is one tiled matrix");
    dst.fill(0);
    for j in 0..n {
        for l in 0..k {
            dst[qconv_tile_offset(k, taps, l, j)] = w[j * k + l];
        }
    }
}

pub const CONV_BIAS: u32 = 1 << 3;
/// out = act(conv + bias + R) with R at residual_va, shaped like the
/// output (since hardware minor version 1).
pub const CONV_RESIDUAL: u32 = 1 << 4;
/// CONV only (hardware minor version 18): the weights are a 3×3 filter
/// bank already in the domain of Winograd's minimal filtering F(2×2, 3×3)
/// ([`winograd_weights`]: 16 matrices `[c_out × c_in]`), and the device
/// computes the convolution that way: 2.25× fewer multiply-adds than the
/// direct sum, with the filter transform done once, at compile time.
/// Valid only for kh = kw = 3, stride 1, dilation 1, one group.
pub const CONV_WINOGRAD: u32 = 1 << 5;
/// Points of F(2×2, 3×3)'s transformed 4×4 tile: the matrices of
/// [`winograd_weights`].
pub const WINOGRAD_POINTS: usize = 16;

/// Floats of a [`CONV_WINOGRAD`] filter bank: `16·c_out·c_in`.
pub fn winograd_weights_len(c_out: u64, c_in: u64) -> Option<u64> {
    (WINOGRAD_POINTS as u64).checked_mul(c_out)?.checked_mul(c_in)
}

/// `G·[g0, g1, g2]ᵀ` with F(2×2, 3×3)'s G = [[1,0,0],[½,½,½],[½,−½,½],[0,0,1]].
#[inline]
fn winograd_g(g0: f32, g1: f32, g2: f32) -> [f32; 4] {
    [g0, 0.5 * (g0 + g1 + g2), 0.5 * (g0 - g1 + g2), g2]
}

/// Writes the filter bank `w` (`[c_out][c_in][3][3]`, CONV's stored
/// layout) in [`CONV_WINOGRAD`]'s layout: `U = G·g·Gᵀ` (4×4) for each
/// filter `g`, point `ξ = 4r + c` of filter `(co, ci)` at
/// `dst[(ξ·c_out + co)·c_in + ci]`, so that point `ξ`'s weights are one
/// row-major `[c_out × c_in]` matrix. `G·g` is computed first (per column
/// of `g`), then `·Gᵀ` (per row), in f32, with the sums in the order
/// [`winograd_g`] writes them.
///
/// # Panics
/// If `w` is not `9·c_out·c_in` long or `dst` not `16·c_out·c_in`.
pub fn winograd_weights(w: &[f32], c_out: usize, c_in: usize, dst: &mut [f32]) {
    let filters = c_out * c_in;
    assert_eq!(w.len(), 9 * filters, "w holds c_out·c_in 3×3 filters");
    assert_eq!(dst.len(), WINOGRAD_POINTS * filters, "dst holds 16 matrices");
    for (f, g) in w.chunks_exact(9).enumerate() {
        // Column c of G·g, then row r of (G·g)·Gᵀ.
        let cols: [[f32; 4]; 3] = core::array::from_fn(|c| winograd_g(g[c], g[3 + c], g[6 + c]));
        for r in 0..4 {
            for (c, v) in winograd_g(cols[0][r], cols[1][r], cols[2][r]).into_iter().enumerate() {
                dst[(4 * r + c) * filters + f] = v;
            }
        }
    }
}
pub const LAYERNORM_GAMMA: u32 = 1 << 0;
pub const LAYERNORM_BETA: u32 = 1 << 1;
/// Root-mean-square normalisation: the mean is not subtracted (hardware
/// minor version 13).
pub const LAYERNORM_RMS: u32 = 1 << 2;
pub const GATHER_INDEX_I32: u32 = 0;
pub const GATHER_INDEX_I64: u32 = 1;
/// Element types of CAST (`src_type`, `dst_type`).
pub const CAST_F32: u32 = 0;
pub const CAST_I32: u32 = 1;
pub const CAST_I64: u32 = 2;
/// One byte per element: 0 is false, anything else true (written as 1).
pub const CAST_BOOL: u32 = 3;
/// RESIZE modes and nearest rounding modes.
pub const RESIZE_NEAREST: u32 = 0;
pub const RESIZE_LINEAR: u32 = 1;
/// Bicubic (Keys) with coefficient `cubic_a` (hardware minor version 10).
pub const RESIZE_CUBIC: u32 = 2;
/// Resize flag (cubic only): taps outside the input get weight 0 and the
/// others are renormalised, instead of repeating the edge.
pub const RESIZE_EXCLUDE_OUTSIDE: u32 = 1 << 0;

/// GRID_SAMPLE modes: the nearest input (halves to even), bilinear, and
/// bicubic (Keys, a = -0.75).
pub const GRID_NEAREST: u32 = 0;
pub const GRID_LINEAR: u32 = 1;
pub const GRID_CUBIC: u32 = 2;
/// GRID_SAMPLE padding: what a tap outside the input reads: 0, the edge,
/// or the input reflected at its borders.
pub const GRID_PAD_ZEROS: u32 = 0;
pub const GRID_PAD_BORDER: u32 = 1;
pub const GRID_PAD_REFLECTION: u32 = 2;
/// GRID_SAMPLE flag: -1 and 1 are the centres of the edge elements rather
/// than the outer edges of the edge elements.
pub const GRID_ALIGN_CORNERS: u32 = 1 << 0;
pub const RESIZE_ROUND_PREFER_FLOOR: u32 = 0;
pub const RESIZE_ROUND_PREFER_CEIL: u32 = 1;
pub const RESIZE_FLOOR: u32 = 2;
pub const RESIZE_CEIL: u32 = 3;
/// Bytes per element of a CAST element type (`None`: not a type).
pub const fn cast_type_size(t: u32) -> Option<u64> {
    match t {
        CAST_F32 | CAST_I32 => Some(4),
        CAST_I64 => Some(8),
        CAST_BOOL => Some(1),
        _ => None,
    }
}

wire_struct! {
    /// int8 quantise or dequantise (`mode`, a QUANT_*) of a tensor viewed
    /// as `[outer, channels, inner]`: element `(o, c, i)` uses `scale[c]`
    /// (f32, finite and > 0) and `zero[c]` (i32, in the range of `qtype`),
    /// `channels` entries each at `scale_va` / `zero_va` (per-tensor is
    /// `channels = 1`). Quantise rounds half to even and saturates; NaN
    /// becomes the zero point. f32 tensors are 4-byte aligned.
    pub struct QuantDesc {
        pub header: OpHeader,
        pub mode: u32,
        pub qtype: u32,
        pub outer: u64,
        pub channels: u64,
        pub inner: u64,
        pub scale_va: u64,
        pub zero_va: u64,
        pub in_va: u64,
        pub out_va: u64,
    }
}

wire_struct! {
    /// int8 GEMM: `acc[i,j] = Σ_l (A[i,l] − a_zero)·(B[l,j] − zb[j]) +
    /// bias[j]` in int32 (wrapping), A `[m × k]` row-major of `a_type`
    /// (u8 or i8), B int8 packed ([`pack_qgemm_b`]), zb the per-column
    /// zero points at `b_zero_va` (QGEMM_B_ZERO; else 0), bias int32 at
    /// `bias_va` (QGEMM_BIAS). Output `[m × n]` of `out_type`: u8/i8
    /// `clamp(round_half_even(acc·scale[j]) + out_zero, out_min, out_max)`,
    /// or f32 `acc·scale[j]` (max(0, ·) with QGEMM_RELU). `scale` is n
    /// finite f32 at `scale_va`. For an f32 output, `out_zero`, `out_min`
    /// and `out_max` are 0.
    pub struct QGemmDesc {
        pub header: OpHeader,
        pub m: u32,
        pub n: u32,
        pub k: u32,
        pub flags: u32,
        pub a_type: u32,
        pub out_type: u32,
        pub a_zero: i32,
        pub out_zero: i32,
        pub out_min: i32,
        pub out_max: i32,
        pub a_va: u64,
        pub b_va: u64,
        pub b_zero_va: u64,
        pub bias_va: u64,
        pub scale_va: u64,
        pub out_va: u64,
    }
}

wire_struct! {
    /// int8 2-D convolution, NCHW, geometry as CONV2D's. Per group `g`
    /// the weights are one packed `[k × c_out/groups]` B operand
    /// (`k = c_in/groups·kh·kw`, ordered (c, ky, kx), or in channel quads
    /// with QCONV_CHANNEL_QUADS: [`qconv_k`]; [`pack_qgemm_b`]),
    /// the groups' operands back to back; padded input positions hold
    /// `x_zero` (a real 0). The arithmetic, zero points, bias, scale and
    /// output are QGEMM's with output channel as the column.
    pub struct QConvDesc {
        pub header: OpHeader,
        pub n: u32,
        pub c_in: u32,
        pub h: u32,
        pub w: u32,
        pub c_out: u32,
        pub kh: u32,
        pub kw: u32,
        pub stride_h: u32,
        pub stride_w: u32,
        pub dil_h: u32,
        pub dil_w: u32,
        pub pad_top: u32,
        pub pad_left: u32,
        pub pad_bottom: u32,
        pub pad_right: u32,
        pub groups: u32,
        pub flags: u32,
        pub x_type: u32,
        pub out_type: u32,
        pub x_zero: i32,
        pub out_zero: i32,
        pub out_min: i32,
        pub out_max: i32,
        pub reserved: u32,
        pub x_va: u64,
        pub w_va: u64,
        pub w_zero_va: u64,
        pub bias_va: u64,
        pub scale_va: u64,
        pub out_va: u64,
    }
}

wire_struct! {
    /// int8 element-wise `kind` (Binary::Add or Binary::Mul) of two
    /// tensors of `count` elements each, computed as its QDQ definition in
    /// f32: `a' = (a − a_zero)·a_scale`, `b'` alike, `y = a' (kind) b'`
    /// (`max(0, y)` with QBINARY_RELU), then the output quantised as QUANT
    /// does (`y / out_scale` rounded half to even, `+ out_zero`,
    /// saturated). Types are QTYPE_U8 / QTYPE_I8, scales finite and > 0,
    /// zero points in their type's range.
    pub struct QBinaryDesc {
        pub header: OpHeader,
        pub kind: u32,
        pub flags: u32,
        pub a_type: u32,
        pub b_type: u32,
        pub out_type: u32,
        pub reserved: u32,
        pub a_scale: f32,
        pub b_scale: f32,
        pub out_scale: f32,
        pub a_zero: i32,
        pub b_zero: i32,
        pub out_zero: i32,
        pub count: u64,
        pub a_va: u64,
        pub b_va: u64,
        pub out_va: u64,
    }
}

/// Checks the type, zero-point and clamp fields shared by QGEMM and QCONV.
fn qgemm_fields_ok(flags: u32, a_type: u32, out_type: u32, a_zero: i32, out_zero: i32, out_min: i32, out_max: i32) -> Result<(), DescError> {
    use DescError::BadField;
    if flags & !(QGEMM_BIAS | QGEMM_B_ZERO | QGEMM_RELU | QCONV_CHANNEL_QUADS | QCONV_WEIGHT_TILES) != 0 {
        return Err(BadField("qgemm flags"));
    }
    let (lo, hi) = qtype_range(a_type).ok_or(BadField("input type"))?;
    if a_zero < lo || a_zero > hi {
        return Err(BadField("input zero point"));
    }
    match qtype_range(out_type) {
        Some((lo, hi)) => {
            if flags & QGEMM_RELU != 0 {
                return Err(BadField("relu flag with an int8 output (clamp with out_min)"));
            }
            if out_zero < lo || out_zero > hi || out_min < lo || out_max > hi || out_min > out_max {
                return Err(BadField("output zero point / clamp"));
            }
        }
        None if out_type == QTYPE_F32 => {
            if out_zero != 0 || out_min != 0 || out_max != 0 {
                return Err(BadField("output zero point / clamp of an f32 output"));
            }
        }
        None => return Err(BadField("output type")),
    }
    Ok(())
}

wire_struct! {
    /// First 8 bytes of every descriptor.
    pub struct OpHeader {
        pub op: u32,
        /// Size of the whole descriptor in bytes.
        pub size: u32,
    }
}

wire_struct! {
    /// `batch` GEMMs: C[m,n] = act(op(A)[m,k] * op(B)[k,n] (+ C) + bias[n]
    /// (+ R[m,n])). op(A) is A ([m,k]) or, with GEMM_TRANS_A, A^T of a [k,m]
    /// matrix; same for B. Batch strides are in elements; 0 broadcasts one
    /// matrix. R (GEMM_RESIDUAL) uses C's batch stride.
    pub struct GemmDesc {
        pub header: OpHeader,
        pub m: u32,
        pub n: u32,
        pub k: u32,
        pub flags: u32,
        pub batch: u32,
        pub activation: u32,
        pub act_param0: f32,
        pub act_param1: f32,
        pub a_batch_stride: u64,
        pub b_batch_stride: u64,
        pub c_batch_stride: u64,
        pub a_va: u64,
        pub b_va: u64,
        pub c_va: u64,
        pub bias_va: u64,
        pub residual_va: u64,
    }
}

wire_struct! {
    /// 2-D convolution, NCHW. Weights [c_out, c_in/groups, kh, kw], bias
    /// [c_out]; output [n, c_out, oh, ow] with
    /// oh = (h + pad_top + pad_bottom - dil_h*(kh-1) - 1) / stride_h + 1;
    /// with CONV_RESIDUAL, a tensor of the output's shape at residual_va is
    /// added before the activation.
    pub struct Conv2dDesc {
        pub header: OpHeader,
        pub n: u32,
        pub c_in: u32,
        pub h: u32,
        pub w: u32,
        pub c_out: u32,
        pub kh: u32,
        pub kw: u32,
        pub groups: u32,
        pub stride_h: u32,
        pub stride_w: u32,
        pub dil_h: u32,
        pub dil_w: u32,
        pub pad_top: u32,
        pub pad_left: u32,
        pub pad_bottom: u32,
        pub pad_right: u32,
        pub flags: u32,
        pub activation: u32,
        pub act_param0: f32,
        pub act_param1: f32,
        pub input_va: u64,
        pub weight_va: u64,
        pub bias_va: u64,
        pub output_va: u64,
        pub residual_va: u64,
    }
}

wire_struct! {
    /// Max or average pooling, NCHW; output size as for Conv2dDesc.
    pub struct PoolDesc {
        pub header: OpHeader,
        pub kind: u32,
        pub flags: u32,
        pub n: u32,
        pub c: u32,
        pub h: u32,
        pub w: u32,
        pub kh: u32,
        pub kw: u32,
        pub stride_h: u32,
        pub stride_w: u32,
        pub pad_top: u32,
        pub pad_left: u32,
        pub pad_bottom: u32,
        pub pad_right: u32,
        pub dil_h: u32,
        pub dil_w: u32,
        pub input_va: u64,
        pub output_va: u64,
    }
}

wire_struct! {
    /// out = act(a (kind) b) with numpy broadcasting. Both shapes have
    /// `rank` dims (pad the shorter with leading 1s); out has the broadcast
    /// shape. The activation fields exist since hardware minor version 1.
    pub struct BinaryDesc {
        pub header: OpHeader,
        pub kind: u32,
        pub rank: u32,
        pub a_dims: [u32; 6],
        pub b_dims: [u32; 6],
        pub a_va: u64,
        pub b_va: u64,
        pub out_va: u64,
        pub activation: u32,
        pub act_param0: f32,
        pub act_param1: f32,
        /// Reserved, must be 0.
        pub reserved: u32,
    }
}

wire_struct! {
    /// out[i] = f(in[i]) for `count` elements; in and out may be equal.
    pub struct UnaryDesc {
        pub header: OpHeader,
        pub kind: u32,
        pub reserved: u32,
        pub param0: f32,
        pub param1: f32,
        pub count: u64,
        pub in_va: u64,
        pub out_va: u64,
    }
}

wire_struct! {
    /// Numerically stable softmax along `axis` (with SOFTMAX_LOG, since
    /// minor version 12: log-softmax).
    pub struct SoftmaxDesc {
        pub header: OpHeader,
        pub rank: u32,
        pub axis: u32,
        pub dims: [u32; 6],
        /// SOFTMAX_LOG; other bits must be 0.
        pub flags: u32,
        pub reserved: u32,
        pub in_va: u64,
        pub out_va: u64,
    }
}

wire_struct! {
    /// Layer normalisation of `rows` rows of `cols` elements:
    /// out = (x - mean) / sqrt(var + epsilon) * gamma + beta (RMS flag:
    /// without the mean, var = mean of x²).
    pub struct LayerNormDesc {
        pub header: OpHeader,
        pub rows: u32,
        pub cols: u32,
        pub epsilon: f32,
        pub flags: u32,
        pub in_va: u64,
        pub gamma_va: u64,
        pub beta_va: u64,
        pub out_va: u64,
    }
}

wire_struct! {
    /// Reduction along `axis`; out has the input's shape without that axis.
    pub struct ReduceDesc {
        pub header: OpHeader,
        pub kind: u32,
        pub rank: u32,
        pub dims: [u32; 6],
        pub axis: u32,
        pub reserved: u32,
        pub in_va: u64,
        pub out_va: u64,
    }
}

wire_struct! {
    /// out = permute(in, perm): out dim i is in dim perm[i].
    pub struct TransposeDesc {
        pub header: OpHeader,
        pub rank: u32,
        pub reserved: u32,
        pub dims: [u32; 6],
        pub perm: [u32; 6],
        pub in_va: u64,
        pub out_va: u64,
    }
}

wire_struct! {
    /// Copy a rank-`rank` box of 4-byte elements: element (i0..ir) goes
    /// from src_va + 4*sum(i*src_strides) to dst_va + 4*sum(i*dst_strides).
    pub struct StridedCopyDesc {
        pub header: OpHeader,
        pub rank: u32,
        pub reserved: u32,
        pub sizes: [u32; 6],
        pub src_strides: [u64; 6],
        pub dst_strides: [u64; 6],
        pub src_va: u64,
        pub dst_va: u64,
    }
}

wire_struct! {
    /// ONNX Gather along `axis` with `num_indices` flat indices (i32 or
    /// i64, negative counts from the end): out shape is
    /// dims[..axis] ++ [num_indices] ++ dims[axis+1..].
    pub struct GatherDesc {
        pub header: OpHeader,
        pub rank: u32,
        pub axis: u32,
        pub dims: [u32; 6],
        pub index_type: u32,
        pub reserved: u32,
        pub num_indices: u64,
        pub data_va: u64,
        pub indices_va: u64,
        pub out_va: u64,
    }
}

wire_struct! {
    /// Element-wise conversion of `count` elements between f32, i32, i64
    /// and bool (hardware minor version 2). Integers to f32 round to
    /// nearest; f32 to integers truncate toward zero, saturating at the
    /// type's range (NaN becomes 0); i64 to i32 keeps the low 32 bits;
    /// anything to bool is `x != 0`. Each address is aligned to its
    /// element size.
    pub struct CastDesc {
        pub header: OpHeader,
        pub src_type: u32,
        pub dst_type: u32,
        pub count: u64,
        pub in_va: u64,
        pub out_va: u64,
    }
}

wire_struct! {
    /// Spatial resize of an NCHW tensor (hardware minor version 2). Output
    /// (y, x) samples the input at source coordinates `scale_y·y +
    /// offset_y`, `scale_x·x + offset_x` (every ONNX / PyTorch / TF
    /// coordinate convention is such an affine map): nearest with a
    /// rounding mode, bilinear (coordinates clamped to the input) or,
    /// since minor version 10, bicubic: four taps per axis around the
    /// source coordinate with Keys' kernel of coefficient `cubic_a`, taps
    /// beyond an edge repeating it or (RESIZE_EXCLUDE_OUTSIDE) dropped.
    pub struct ResizeDesc {
        pub header: OpHeader,
        pub mode: u32,
        pub nearest_mode: u32,
        pub n: u32,
        pub c: u32,
        pub h: u32,
        pub w: u32,
        pub oh: u32,
        pub ow: u32,
        pub scale_y: f32,
        pub offset_y: f32,
        pub scale_x: f32,
        pub offset_x: f32,
        pub in_va: u64,
        pub out_va: u64,
        /// Since minor version 10 (a 72-byte descriptor reads with both 0).
        pub cubic_a: f32,
        pub flags: u32,
    }
}

wire_struct! {
    /// out = cond ≠ 0 ? a : b, element-wise with numpy broadcasting of the
    /// three operands (hardware minor version 2). All shapes have `rank`
    /// dims (the shorter padded with leading 1s); cond is f32 (a 0/1 mask
    /// as comparisons write it; NaN counts as true).
    pub struct WhereDesc {
        pub header: OpHeader,
        pub rank: u32,
        /// Reserved, must be 0.
        pub reserved: u32,
        pub cond_dims: [u32; 6],
        pub a_dims: [u32; 6],
        pub b_dims: [u32; 6],
        pub cond_va: u64,
        pub a_va: u64,
        pub b_va: u64,
        pub out_va: u64,
    }
}

wire_struct! {
    /// out[n, c, y, x] samples in[n, c] at the normalised position
    /// grid[n, y, x] = (gx, gy), each in [-1, 1] across the input's width
    /// and height (hardware minor version 10; ONNX GridSample on 4-D
    /// tensors, PyTorch's F.grid_sample).
    pub struct GridSampleDesc {
        pub header: OpHeader,
        pub mode: u32,
        pub padding: u32,
        pub flags: u32,
        /// Reserved, must be 0.
        pub reserved: u32,
        pub n: u32,
        pub c: u32,
        pub h: u32,
        pub w: u32,
        pub oh: u32,
        pub ow: u32,
        /// `[n, c, h, w]`.
        pub in_va: u64,
        /// `[n, oh, ow, 2]`: (x, y) pairs.
        pub grid_va: u64,
        /// `[n, c, oh, ow]`.
        pub out_va: u64,
    }
}

const _: () = assert!(GridSampleDesc::SIZE == 72);

/// TOPK flag: the k largest (else the k smallest).
pub const TOPK_LARGEST: u32 = 1 << 0;
/// Longest axis a TOPK selects from: its indices are written as f32,
/// exact below 2^24.
pub const TOPK_MAX_LEN: u32 = 1 << 24;

wire_struct! {
    /// For each of the `outer × inner` lines of `[outer, len, inner]`
    /// (stride `inner`), the `k` largest (TOPK_LARGEST) or smallest
    /// elements in order, ties by ascending index, NaN above +inf; values
    /// and their indices (as f32) to `[outer, k, inner]` each (hardware
    /// minor version 10; ONNX TopK, torch.topk).
    pub struct TopKDesc {
        pub header: OpHeader,
        pub outer: u32,
        pub len: u32,
        pub inner: u32,
        pub k: u32,
        pub flags: u32,
        /// Reserved, must be 0.
        pub reserved: u32,
        pub in_va: u64,
        pub values_va: u64,
        pub indices_va: u64,
    }
}

const _: () = assert!(TopKDesc::SIZE == 56);

/// Inputs an ELTWISE program reads at most.
pub const ELTWISE_MAX_INPUTS: usize = 4;
/// Instructions of an ELTWISE program at most.
pub const ELTWISE_MAX_INSTRS: usize = 16;
/// Registers of an ELTWISE program: `r0..r{n_inputs-1}` start as the
/// inputs, the rest are written by instructions.
pub const ELTWISE_REGS: u32 = 8;
/// Operand register number meaning "the instruction's `imm`".
pub const ELTWISE_IMM: u8 = 0xff;
/// ELTWISE instruction classes: an unused slot (all fields 0), a
/// [`Unary`] function of `a`, a [`Binary`] function of `a` and `b`.
pub const ELT_NOP: u8 = 0;
pub const ELT_UNARY: u8 = 1;
pub const ELT_BINARY: u8 = 2;

wire_struct! {
    /// One ELTWISE instruction: `r[dst] = code(a)` (ELT_UNARY, with
    /// `param0`/`param1` as a UNARY's) or `r[dst] = code(a, b)`
    /// (ELT_BINARY). An operand is a register, or [`ELTWISE_IMM`] for the
    /// scalar `imm` (at most one operand of an instruction).
    pub struct EltInstr {
        pub class: u8,
        pub code: u8,
        pub dst: u8,
        pub a: u8,
        pub b: u8,
        /// Reserved, must be 0.
        pub reserved: [u8; 3],
        pub imm: f32,
        pub param0: f32,
        pub param1: f32,
    }
}

wire_struct! {
    /// `out = program(in_0, ..., in_{n_inputs-1})` element by element
    /// (hardware minor version 11): at output multi-index `e`, input `i`
    /// is the f32 at `in_va[i] + 4·Σ_k e_k·in_strides[i][k]` (element
    /// strides, one per output dim: 0 broadcasts, so a dense, broadcast,
    /// sliced or transposed tensor reads alike); register `r_i` starts as
    /// input `i`, the `n_instrs` instructions run in order on each
    /// element, and `out` (dense, `out_dims`) receives register
    /// `out_reg`. Slots from `n_instrs` on, inputs from `n_inputs` on and
    /// dims and strides from `rank` on must be 0. A register must be
    /// written (or be an input) before an instruction reads it. The
    /// result is the one the same UNARY and BINARY ops would give one
    /// after another.
    pub struct EltwiseDesc {
        pub header: OpHeader,
        pub rank: u32,
        pub n_inputs: u32,
        pub n_instrs: u32,
        pub out_reg: u32,
        pub out_dims: [u32; 6],
        pub in_strides: [[u64; 6]; 4],
        pub in_va: [u64; 4],
        pub out_va: u64,
        pub instrs: [EltInstr; 16],
    }
}

const _: () = assert!(EltInstr::SIZE == 20);
const _: () = assert!(EltwiseDesc::SIZE == 600);
const _: () = assert!(ELTWISE_MAX_INPUTS == 4 && ELTWISE_MAX_INSTRS == 16);

impl EltwiseDesc {
    /// Checks the program and the ranks: classes and codes known,
    /// registers in range and written before read, unused slots, inputs,
    /// dims and strides zero. (Strides are checked against memory when the
    /// op runs.)
    fn check(&self) -> Result<(), DescError> {
        use DescError::BadField;
        let (n_in, n_ins) = (self.n_inputs as usize, self.n_instrs as usize);
        if !(1..=ELTWISE_MAX_INPUTS).contains(&n_in) || !(1..=ELTWISE_MAX_INSTRS).contains(&n_ins) {
            return Err(BadField("eltwise input/instruction count"));
        }
        if !dims_ok(self.rank, &self.out_dims) {
            return Err(BadField("rank/dims"));
        }
        for (i, st) in self.in_strides.iter().enumerate() {
            let used = i < n_in;
            let unused_zero = st.iter().enumerate().all(|(k, &s)| (used && k < self.rank as usize) || s == 0);
            if !unused_zero || (!used && self.in_va[i] != 0) {
                return Err(BadField("eltwise input strides"));
            }
        }
        // Bit i: register i holds a value.
        let mut defined: u32 = (1 << n_in) - 1;
        let readable = |r: u8, defined: u32| r == ELTWISE_IMM || (u32::from(r) < ELTWISE_REGS && defined & (1 << r) != 0);
        for (i, ins) in self.instrs.iter().enumerate() {
            if i >= n_ins {
                if *ins != EltInstr::default() {
                    return Err(BadField("eltwise unused instruction"));
                }
                continue;
            }
            let ok = ins.reserved == [0; 3]
                && u32::from(ins.dst) < ELTWISE_REGS
                && readable(ins.a, defined)
                && match ins.class {
                    ELT_UNARY => {
                        ins.a != ELTWISE_IMM && ins.b == 0 && !matches!(Unary::from_u32(ins.code.into()), None | Some(Unary::None))
                    }
                    ELT_BINARY => {
                        readable(ins.b, defined)
                            && !(ins.a == ELTWISE_IMM && ins.b == ELTWISE_IMM)
                            && Binary::from_u32(ins.code.into()).is_some()
                    }
                    _ => false,
                };
            if !ok {
                return Err(BadField("eltwise instruction"));
            }
            defined |= 1 << ins.dst;
        }
        if self.out_reg >= ELTWISE_REGS || defined & (1 << self.out_reg) == 0 {
            return Err(BadField("eltwise out_reg"));
        }
        Ok(())
    }
}
/// SOFTMAX flag (minor version 12): log-softmax, `(x − m) − ln Σ exp(x −
/// m)` with `m` the maximum along the axis.
pub const SOFTMAX_LOG: u32 = 1 << 0;

/// RECURRENT cells (ONNX LSTM, GRU and RNN with their default
/// activations; gate order as ONNX: LSTM i, o, f, c; GRU z, r, h).
pub const REC_LSTM: u32 = 0;
pub const REC_GRU: u32 = 1;
pub const REC_RNN_TANH: u32 = 2;
pub const REC_RNN_RELU: u32 = 3;
/// RECURRENT flag: the steps run from the last to the first.
pub const REC_REVERSE: u32 = 1 << 0;
/// RECURRENT flag (GRU only): the reset gate multiplies `h·R_hᵀ + Rb_h`
/// (ONNX `linear_before_reset=1`, PyTorch's GRU) instead of `h`.
pub const REC_LINEAR_BEFORE_RESET: u32 = 1 << 1;

/// Gates of a RECURRENT cell (rows of R per hidden unit), or `None` for an
/// unknown cell.
pub fn rec_gates(cell: u32) -> Option<u32> {
    match cell {
        REC_LSTM => Some(4),
        REC_GRU => Some(3),
        REC_RNN_TANH | REC_RNN_RELU => Some(1),
        _ => None,
    }
}

wire_struct! {
    /// One direction of a recurrent layer over `seq` steps (hardware minor
    /// version 12). With `G` gates of `H = hidden` units, `W = G·H`: `x` is
    /// the input projection `[seq, batch, W]` (`X·Wᵀ` plus the biases
    /// added outside the cell: all of them, except a linear-before-reset
    /// GRU's `Rb_h`), `r` the transposed recurrent weights `Rᵀ` `[H, W]`
    /// (row-major: ONNX `R` of one direction, transposed, so that a step's
    /// product scales whole rows), `rb` that GRU's `Rb_h` `[H]` (else 0), `h0`
    /// and (LSTM) `c0` the initial states `[batch, H]` (0: zeros). Step
    /// `t` (in order, or from `seq − 1` down with REC_REVERSE) computes the
    /// gates `x[t] + h·Rᵀ` and the new state as ONNX defines the cell, and
    /// writes `h` to `y[t]` (`y`: `[seq, batch, H]`). An LSTM writes its
    /// final cell state to `c` `[batch, H]` (0: not written; other cells:
    /// 0). The final hidden state is `y[seq − 1]` (`y[0]` reversed).
    pub struct RecurrentDesc {
        pub header: OpHeader,
        pub cell: u32,
        pub flags: u32,
        pub seq: u32,
        pub batch: u32,
        pub hidden: u32,
        /// Reserved, must be 0.
        pub reserved: u32,
        pub x_va: u64,
        pub r_va: u64,
        pub rb_va: u64,
        pub h0_va: u64,
        pub c0_va: u64,
        pub y_va: u64,
        pub c_va: u64,
    }
}

const _: () = assert!(RecurrentDesc::SIZE == 88);

/// Sources of one CONCAT descriptor.
pub const MAX_CONCAT_PARTS: usize = 16;

wire_struct! {
    /// A concatenation of 4-byte elements (hardware minor version 14):
    /// for every row `r < rows` and every part `i < parts`, elements
    /// `r·cols[i] .. (r+1)·cols[i]` of source `i` (`src_va[i]`, `rows ×
    /// cols[i]` row-major) go to `out_va` + 4·(`r·out_cols + col[i]` ..).
    /// Output elements no part covers keep their contents; parts are
    /// written in order (a later one wins where they overlap). Part `i`
    /// needs `cols[i] ≥ 1` and `col[i] + cols[i] ≤ out_cols`; the fields
    /// of parts `≥ parts` are 0.
    pub struct ConcatDesc {
        pub header: OpHeader,
        pub rows: u32,
        pub out_cols: u32,
        pub parts: u32,
        /// Reserved, must be 0.
        pub reserved: u32,
        pub out_va: u64,
        pub src_va: [u64; 16],
        pub col: [u32; 16],
        pub cols: [u32; 16],
    }
}

const _: () = assert!(ConcatDesc::SIZE == 288);

impl ConcatDesc {
    fn check(&self) -> Result<(), DescError> {
        let n = self.parts as usize;
        if n == 0 || n > MAX_CONCAT_PARTS || self.reserved != 0 || self.rows == 0 || self.out_cols == 0 {
            return Err(DescError::BadField("concat rows/out_cols/parts"));
        }
        for i in 0..n {
            if self.cols[i] == 0 || self.col[i] as u64 + self.cols[i] as u64 > self.out_cols as u64 {
                return Err(DescError::BadField("concat part columns"));
            }
        }
        if (n..MAX_CONCAT_PARTS).any(|i| self.src_va[i] != 0 || self.col[i] != 0 || self.cols[i] != 0) {
            return Err(DescError::BadField("concat unused part"));
        }
        Ok(())
    }
}

impl RecurrentDesc {
    /// Checks cell, flags and which optional operands the cell may have.
    fn check(&self) -> Result<(), DescError> {
        use DescError::BadField;
        if rec_gates(self.cell).is_none() {
            return Err(BadField("recurrent cell"));
        }
        let lbr_ok = self.cell == REC_GRU || self.flags & REC_LINEAR_BEFORE_RESET == 0;
        if self.flags & !(REC_REVERSE | REC_LINEAR_BEFORE_RESET) != 0 || !lbr_ok || self.reserved != 0 {
            return Err(BadField("recurrent flags"));
        }
        if self.seq == 0 || self.batch == 0 || self.hidden == 0 {
            return Err(BadField("recurrent sizes"));
        }
        let lstm = self.cell == REC_LSTM;
        // Rb_h is present exactly with linear-before-reset.
        if (self.rb_va != 0) != (self.flags & REC_LINEAR_BEFORE_RESET != 0) || (!lstm && (self.c0_va != 0 || self.c_va != 0)) {
            return Err(BadField("recurrent operands"));
        }
        Ok(())
    }
}

const _: () = assert!(OpHeader::SIZE == 8);
const _: () = assert!(GemmDesc::SIZE == 104);
const _: () = assert!(Conv2dDesc::SIZE == 128);
const _: () = assert!(PoolDesc::SIZE == 88);
const _: () = assert!(BinaryDesc::SIZE == 104);
const _: () = assert!(UnaryDesc::SIZE == 48);
const _: () = assert!(SoftmaxDesc::SIZE == 64);
const _: () = assert!(LayerNormDesc::SIZE == 56);
const _: () = assert!(ReduceDesc::SIZE == 64);
const _: () = assert!(TransposeDesc::SIZE == 80);
const _: () = assert!(StridedCopyDesc::SIZE == 152);
const _: () = assert!(GatherDesc::SIZE == 80);
const _: () = assert!(CastDesc::SIZE == 40);
const _: () = assert!(QuantDesc::SIZE == 72);
const _: () = assert!(QGemmDesc::SIZE == 96);
const _: () = assert!(QConvDesc::SIZE == 152);
const _: () = assert!(QBinaryDesc::SIZE == 88);
const _: () = assert!(ResizeDesc::SIZE == 80);
const _: () = assert!(WhereDesc::SIZE == 120);

/// A decoded descriptor (fields not yet checked against tensor sizes).
/// Short-lived (decoded, then executed), so its size, that of the largest
/// descriptor, does not matter; no_std has no Box for the big ones.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum Desc {
    Gemm(GemmDesc),
    Conv2d(Conv2dDesc),
    Pool(PoolDesc),
    Binary(BinaryDesc),
    Unary(UnaryDesc),
    Softmax(SoftmaxDesc),
    LayerNorm(LayerNormDesc),
    Reduce(ReduceDesc),
    Transpose(TransposeDesc),
    StridedCopy(StridedCopyDesc),
    Gather(GatherDesc),
    Cast(CastDesc),
    Resize(ResizeDesc),
    Where(WhereDesc),
    Quant(QuantDesc),
    QGemm(QGemmDesc),
    QConv(QConvDesc),
    QBinary(QBinaryDesc),
    Tile(TileDesc),
    GridSample(GridSampleDesc),
    TopK(TopKDesc),
    Eltwise(EltwiseDesc),
    Recurrent(RecurrentDesc),
    Concat(ConcatDesc),
}

/// Why a descriptor was rejected before looking at its tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DescError {
    Truncated,
    UnknownOp(u32),
    /// header.size differs from the op's size or from the packet's size.
    BadSize,
    /// rank > MAX_RANK, axis >= rank, bad kind, non-zero reserved field,
    /// unknown flag, unused dim not 0.
    BadField(&'static str),
}

fn dims_ok(rank: u32, dims: &[u32]) -> bool {
    rank as usize <= MAX_RANK && dims[rank as usize..].iter().all(|&d| d == 0)
}

macro_rules! encode_fn {
    ($t:ident, $op:ident) => {
        impl $t {
            /// Size to put in the header.
            pub const OP: OpCode = OpCode::$op;
            /// The descriptor with its header filled in.
            pub fn with_header(mut self) -> Self {
                self.header = OpHeader { op: OpCode::$op as u32, size: Self::SIZE as u32 };
                self
            }
        }
    };
}
encode_fn!(GemmDesc, Gemm);
encode_fn!(Conv2dDesc, Conv2d);
encode_fn!(PoolDesc, Pool);
encode_fn!(BinaryDesc, Binary);
encode_fn!(UnaryDesc, Unary);
encode_fn!(SoftmaxDesc, Softmax);
encode_fn!(LayerNormDesc, LayerNorm);
encode_fn!(ReduceDesc, Reduce);
encode_fn!(TransposeDesc, Transpose);
encode_fn!(StridedCopyDesc, StridedCopy);
encode_fn!(GatherDesc, Gather);
encode_fn!(CastDesc, Cast);
encode_fn!(ResizeDesc, Resize);
encode_fn!(WhereDesc, Where);
encode_fn!(QuantDesc, Quant);
encode_fn!(QGemmDesc, QGemm);
encode_fn!(QConvDesc, QConv);
encode_fn!(QBinaryDesc, QBinary);
encode_fn!(TileDesc, Tile);
encode_fn!(GridSampleDesc, GridSample);
encode_fn!(TopKDesc, TopK);
encode_fn!(EltwiseDesc, Eltwise);
encode_fn!(RecurrentDesc, Recurrent);
encode_fn!(ConcatDesc, Concat);

/// Sizes of descriptors written before fields were appended to them
/// (GEMM, CONV2D and BINARY in minor version 1, RESIZE in minor version
/// 10), with the current size: such a descriptor reads as the current one
/// with the new fields zero (their features off).
const SHORT_SIZES: [(OpCode, usize, usize); 4] = [
    (OpCode::Gemm, 96, GemmDesc::SIZE),
    (OpCode::Conv2d, 120, Conv2dDesc::SIZE),
    (OpCode::Binary, 88, BinaryDesc::SIZE),
    (OpCode::Resize, 72, ResizeDesc::SIZE),
];

/// Largest descriptor of any op.
const LARGEST_DESC: usize = EltwiseDesc::SIZE;
const _: () = {
    let mut i = 0;
    while i < SHORT_SIZES.len() {
        assert!(SHORT_SIZES[i].1 < SHORT_SIZES[i].2 && SHORT_SIZES[i].2 <= LARGEST_DESC);
        i += 1;
    }
};

impl Desc {
    /// Decode and field-check a descriptor occupying exactly `buf`.
    pub fn decode(buf: &[u8]) -> Result<Desc, DescError> {
        use DescError::*;
        let h = OpHeader::read_from(buf).ok_or(Truncated)?;
        if h.size as usize != buf.len() {
            return Err(BadSize);
        }
        if let Some(&(_, _, size)) = SHORT_SIZES.iter().find(|&&(op, short, _)| op as u32 == h.op && short == buf.len()) {
            let mut wide = [0u8; LARGEST_DESC];
            wide[..buf.len()].copy_from_slice(buf);
            wide[4..8].copy_from_slice(&(size as u32).to_le_bytes());
            return Self::decode(&wide[..size]);
        }
        macro_rules! get {
            ($t:ident) => {{
                if buf.len() != $t::SIZE {
                    return Err(BadSize);
                }
                $t::read_from(buf).ok_or(Truncated)?
            }};
        }
        let act_ok = is_activation;
        let d = match h.op {
            1 => {
                let d = get!(GemmDesc);
                if d.flags & !(GEMM_TRANS_A | GEMM_TRANS_B | GEMM_ACCUMULATE | GEMM_BIAS | GEMM_RESIDUAL | GEMM_B_PACKED) != 0
                    || d.flags & (GEMM_TRANS_B | GEMM_B_PACKED) == GEMM_TRANS_B | GEMM_B_PACKED
                {
                    return Err(BadField("gemm flags"));
                }
                if !act_ok(d.activation) {
                    return Err(BadField("activation"));
                }
                Desc::Gemm(d)
            }
            2 => {
                let d = get!(Conv2dDesc);
                if d.flags & !(CONV_BIAS | CONV_RESIDUAL | CONV_WINOGRAD) != 0 {
                    return Err(BadField("conv flags"));
                }
                if d.flags & CONV_WINOGRAD != 0
                    && (d.kh, d.kw, d.stride_h, d.stride_w, d.dil_h, d.dil_w, d.groups) != (3, 3, 1, 1, 1, 1, 1)
                {
                    return Err(BadField("conv winograd geometry"));
                }
                if !act_ok(d.activation) {
                    return Err(BadField("activation"));
                }
                Desc::Conv2d(d)
            }
            3 => {
                let d = get!(PoolDesc);
                let int8 = d.flags & POOL_INT8 != 0;
                if d.kind > POOL_AVG
                    || d.flags & !(POOL_COUNT_INCLUDE_PAD | POOL_INT8 | POOL_SIGNED) != 0
                    || (int8 && d.kind != POOL_MAX)
                    || (!int8 && d.flags & POOL_SIGNED != 0)
                {
                    return Err(BadField("pool kind/flags"));
                }
                Desc::Pool(d)
            }
            4 => {
                let d = get!(BinaryDesc);
                if Binary::from_u32(d.kind).is_none() || d.reserved != 0 {
                    return Err(BadField("binary kind"));
                }
                if !act_ok(d.activation) {
                    return Err(BadField("activation"));
                }
                if !dims_ok(d.rank, &d.a_dims) || !dims_ok(d.rank, &d.b_dims) {
                    return Err(BadField("rank/dims"));
                }
                Desc::Binary(d)
            }
            5 => {
                let d = get!(UnaryDesc);
                if Unary::from_u32(d.kind).is_none() || d.reserved != 0 {
                    return Err(BadField("unary kind"));
                }
                Desc::Unary(d)
            }
            6 => {
                let d = get!(SoftmaxDesc);
                if !dims_ok(d.rank, &d.dims) || d.axis >= d.rank {
                    return Err(BadField("rank/axis/dims"));
                }
                if d.flags & !SOFTMAX_LOG != 0 || d.reserved != 0 {
                    return Err(BadField("softmax flags"));
                }
                Desc::Softmax(d)
            }
            7 => {
                let d = get!(LayerNormDesc);
                if d.flags & !(LAYERNORM_GAMMA | LAYERNORM_BETA | LAYERNORM_RMS) != 0 {
                    return Err(BadField("layernorm flags"));
                }
                Desc::LayerNorm(d)
            }
            8 => {
                let d = get!(ReduceDesc);
                if d.kind > REDUCE_ARGMIN_LAST || d.reserved != 0 {
                    return Err(BadField("reduce kind"));
                }
                if !dims_ok(d.rank, &d.dims) || d.axis >= d.rank {
                    return Err(BadField("rank/axis/dims"));
                }
                Desc::Reduce(d)
            }
            9 => {
                let d = get!(TransposeDesc);
                if !dims_ok(d.rank, &d.dims) || d.reserved != 0 {
                    return Err(BadField("rank/dims"));
                }
                // perm must be a permutation of 0..rank.
                let mut seen = 0u32;
                for &p in &d.perm[..d.rank as usize] {
                    if p >= d.rank || seen & (1 << p) != 0 {
                        return Err(BadField("perm"));
                    }
                    seen |= 1 << p;
                }
                if d.perm[d.rank as usize..].iter().any(|&p| p != 0) {
                    return Err(BadField("perm"));
                }
                Desc::Transpose(d)
            }
            10 => {
                let d = get!(StridedCopyDesc);
                if !dims_ok(d.rank, &d.sizes) || d.reserved != 0 {
                    return Err(BadField("rank/sizes"));
                }
                Desc::StridedCopy(d)
            }
            11 => {
                let d = get!(GatherDesc);
                if !dims_ok(d.rank, &d.dims) || d.axis >= d.rank || d.reserved != 0 {
                    return Err(BadField("rank/axis/dims"));
                }
                if d.index_type > GATHER_INDEX_I64 {
                    return Err(BadField("index type"));
                }
                Desc::Gather(d)
            }
            12 => {
                let d = get!(CastDesc);
                if cast_type_size(d.src_type).is_none() || cast_type_size(d.dst_type).is_none() {
                    return Err(BadField("element type"));
                }
                Desc::Cast(d)
            }
            13 => {
                let d = get!(ResizeDesc);
                if d.mode > RESIZE_CUBIC || d.nearest_mode > RESIZE_CEIL {
                    return Err(BadField("mode"));
                }
                if d.mode != RESIZE_NEAREST && d.nearest_mode != 0 {
                    return Err(BadField("nearest_mode of a linear or cubic resize"));
                }
                if d.mode != RESIZE_CUBIC && (d.cubic_a != 0.0 || d.flags != 0) {
                    return Err(BadField("cubic_a/flags of a nearest or linear resize"));
                }
                if d.flags & !RESIZE_EXCLUDE_OUTSIDE != 0 {
                    return Err(BadField("resize flags"));
                }
                if ![d.scale_y, d.offset_y, d.scale_x, d.offset_x, d.cubic_a].iter().all(|v| v.is_finite()) {
                    return Err(BadField("coordinate map"));
                }
                Desc::Resize(d)
            }
            14 => {
                let d = get!(WhereDesc);
                if !dims_ok(d.rank, &d.cond_dims) || !dims_ok(d.rank, &d.a_dims) || !dims_ok(d.rank, &d.b_dims) || d.reserved != 0 {
                    return Err(BadField("rank/dims"));
                }
                Desc::Where(d)
            }
            15 => {
                let d = get!(QuantDesc);
                if d.mode > QUANT_DEQUANTIZE {
                    return Err(BadField("quant mode"));
                }
                if qtype_range(d.qtype).is_none() {
                    return Err(BadField("quant type"));
                }
                Desc::Quant(d)
            }
            16 => {
                let d = get!(QGemmDesc);
                if d.flags & (QCONV_CHANNEL_QUADS | QCONV_WEIGHT_TILES) != 0 {
                    return Err(BadField("qgemm flags"));
                }
                qgemm_fields_ok(d.flags, d.a_type, d.out_type, d.a_zero, d.out_zero, d.out_min, d.out_max)?;
                Desc::QGemm(d)
            }
            17 => {
                let d = get!(QConvDesc);
                qgemm_fields_ok(d.flags, d.x_type, d.out_type, d.x_zero, d.out_zero, d.out_min, d.out_max)?;
                if d.reserved != 0 {
                    return Err(BadField("reserved"));
                }
                Desc::QConv(d)
            }
            18 => {
                let d = get!(QBinaryDesc);
                if !matches!(Binary::from_u32(d.kind), Some(Binary::Add | Binary::Mul)) {
                    return Err(BadField("qbinary kind"));
                }
                if d.flags & !QBINARY_RELU != 0 || d.reserved != 0 {
                    return Err(BadField("qbinary flags"));
                }
                for (t, z, s) in [(d.a_type, d.a_zero, d.a_scale), (d.b_type, d.b_zero, d.b_scale), (d.out_type, d.out_zero, d.out_scale)] {
                    let (lo, hi) = qtype_range(t).ok_or(BadField("qbinary type"))?;
                    if z < lo || z > hi {
                        return Err(BadField("qbinary zero point"));
                    }
                    if !(s.is_finite() && s > 0.0) {
                        return Err(BadField("qbinary scale"));
                    }
                }
                Desc::QBinary(d)
            }
            19 => {
                let d = get!(TileDesc);
                let (nb, np) = (d.nbufs as usize, d.nparams as usize);
                if nb > super::tile::MAX_TILE_BUFFERS || np > super::tile::MAX_TILE_PARAMS {
                    return Err(BadField("tile buffer / parameter count"));
                }
                if d.buf_va[nb..].iter().chain(&d.buf_len[nb..]).chain(&d.params[np..]).any(|&v| v != 0) {
                    return Err(BadField("tile entries beyond the counts"));
                }
                if d.program_size as u64 > super::tile::MAX_TILE_PROGRAM_SIZE {
                    return Err(BadField("tile program size"));
                }
                Desc::Tile(d)
            }
            20 => {
                let d = get!(GridSampleDesc);
                if d.mode > GRID_CUBIC || d.padding > GRID_PAD_REFLECTION {
                    return Err(BadField("mode/padding"));
                }
                if d.flags & !GRID_ALIGN_CORNERS != 0 || d.reserved != 0 {
                    return Err(BadField("grid sample flags"));
                }
                Desc::GridSample(d)
            }
            21 => {
                let d = get!(TopKDesc);
                if d.flags & !TOPK_LARGEST != 0 || d.reserved != 0 {
                    return Err(BadField("topk flags"));
                }
                if d.k > d.len || d.len > TOPK_MAX_LEN {
                    return Err(BadField("k/len"));
                }
                Desc::TopK(d)
            }
            22 => {
                let d = get!(EltwiseDesc);
                d.check()?;
                Desc::Eltwise(d)
            }
            23 => {
                let d = get!(RecurrentDesc);
                d.check()?;
                Desc::Recurrent(d)
            }
            24 => {
                let d = get!(ConcatDesc);
                d.check()?;
                Desc::Concat(d)
            }
            op => return Err(UnknownOp(op)),
        };
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_round_trip_and_rejects() {
        let d = GemmDesc { m: 3, n: 4, k: 5, batch: 1, a_va: 0x1000, ..Default::default() }.with_header();
        let b = d.to_bytes();
        assert_eq!(Desc::decode(&b), Ok(Desc::Gemm(d)));
        assert_eq!(Desc::decode(&b[..50]), Err(DescError::BadSize));
        let mut bad = d;
        bad.activation = 99;
        assert!(matches!(Desc::decode(&bad.to_bytes()), Err(DescError::BadField(_))));
        let t = TransposeDesc { rank: 2, dims: [2, 3, 0, 0, 0, 0], perm: [1, 1, 0, 0, 0, 0], ..Default::default() }
            .with_header();
        assert!(matches!(Desc::decode(&t.to_bytes()), Err(DescError::BadField("perm"))));
        // A minor-version-0 descriptor (before residual_va) reads with the
        // appended fields zero; flags of the new features need the new size.
        let old = &b[..96];
        let mut old = old.to_vec();
        old[4..8].copy_from_slice(&96u32.to_le_bytes());
        assert_eq!(Desc::decode(&old), Ok(Desc::Gemm(d)));
        // A minor-version-2 RESIZE (72 bytes, before cubic_a and flags).
        let r = ResizeDesc { n: 1, c: 1, h: 2, w: 2, oh: 4, ow: 4, scale_y: 0.5, scale_x: 0.5, mode: RESIZE_LINEAR, ..Default::default() }
            .with_header();
        let mut short = r.to_bytes()[..72].to_vec();
        short[4..8].copy_from_slice(&72u32.to_le_bytes());
        assert_eq!(Desc::decode(&short), Ok(Desc::Resize(r)));
        let cubic = ResizeDesc { mode: RESIZE_CUBIC, cubic_a: -0.75, flags: RESIZE_EXCLUDE_OUTSIDE, ..r };
        assert_eq!(Desc::decode(&cubic.to_bytes()), Ok(Desc::Resize(cubic)));
        for bad in [
            ResizeDesc { cubic_a: -0.5, ..r },
            ResizeDesc { flags: RESIZE_EXCLUDE_OUTSIDE, ..r },
            ResizeDesc { flags: 2, ..cubic },
            ResizeDesc { cubic_a: f32::NAN, ..cubic },
            ResizeDesc { nearest_mode: RESIZE_FLOOR, ..cubic },
            ResizeDesc { mode: 3, ..r },
        ] {
            assert!(matches!(Desc::decode(&bad.to_bytes()), Err(DescError::BadField(_))), "{bad:?}");
        }
        let g = GridSampleDesc { n: 1, c: 2, h: 3, w: 4, oh: 5, ow: 6, mode: GRID_CUBIC, padding: GRID_PAD_REFLECTION, flags: GRID_ALIGN_CORNERS, ..Default::default() }
            .with_header();
        assert_eq!(Desc::decode(&g.to_bytes()), Ok(Desc::GridSample(g)));
        for bad in [GridSampleDesc { mode: 3, ..g }, GridSampleDesc { padding: 3, ..g }, GridSampleDesc { flags: 2, ..g }, GridSampleDesc { reserved: 1, ..g }] {
            assert!(matches!(Desc::decode(&bad.to_bytes()), Err(DescError::BadField(_))), "{bad:?}");
        }
        let t = TopKDesc { outer: 2, len: 10, inner: 3, k: 4, flags: TOPK_LARGEST, ..Default::default() }.with_header();
        assert_eq!(Desc::decode(&t.to_bytes()), Ok(Desc::TopK(t)));
        for bad in [TopKDesc { k: 11, ..t }, TopKDesc { flags: 2, ..t }, TopKDesc { reserved: 1, ..t }, TopKDesc { len: TOPK_MAX_LEN + 1, ..t }] {
            assert!(matches!(Desc::decode(&bad.to_bytes()), Err(DescError::BadField(_))), "{bad:?}");
        }
        eltwise_programs_are_checked();
        let mut h = [0u8; 8];
        OpHeader { op: 77, size: 8 }.write_to(&mut h).unwrap();
        assert_eq!(Desc::decode(&h), Err(DescError::UnknownOp(77)));
    }

    /// softplus(x) = relu(x) + log(1 + exp(-|x|)) over x [2, 3] and a
    /// scale [1, 3]: a valid program, then each way of breaking it.
    fn eltwise_programs_are_checked() {
        let ins = |class, code: u32, dst, a, b, imm| EltInstr { class, code: code as u8, dst, a, b, imm, ..Default::default() };
        let mut e = EltwiseDesc { rank: 2, n_inputs: 2, n_instrs: 6, out_reg: 2, out_dims: [2, 3, 0, 0, 0, 0], ..Default::default() };
        e.in_strides[0] = [3, 1, 0, 0, 0, 0];
        e.in_strides[1] = [0, 1, 0, 0, 0, 0];
        e.in_va = [0x1000, 0x2000, 0, 0];
        let prog = [
            ins(ELT_UNARY, Unary::Abs as u32, 2, 0, 0, 0.0),
            ins(ELT_UNARY, Unary::Neg as u32, 2, 2, 0, 0.0),
            ins(ELT_UNARY, Unary::Exp as u32, 2, 2, 0, 0.0),
            ins(ELT_BINARY, Binary::Add as u32, 2, ELTWISE_IMM, 2, 1.0),
            ins(ELT_UNARY, Unary::Log as u32, 3, 2, 0, 0.0),
            ins(ELT_BINARY, Binary::Mul as u32, 2, 3, 1, 0.0),
        ];
        e.instrs[..6].copy_from_slice(&prog);
        let e = e.with_header();
        assert_eq!(Desc::decode(&e.to_bytes()), Ok(Desc::Eltwise(e)));
        let with = |f: &dyn Fn(&mut EltwiseDesc)| {
            let mut b = e;
            f(&mut b);
            b
        };
        let bad = [
            with(&|b| b.n_inputs = 0),
            with(&|b| b.n_inputs = 5),
            with(&|b| b.n_instrs = 17),
            with(&|b| b.n_instrs = 5), // slot 5 is not zero
            with(&|b| b.out_reg = 4),  // never written
            with(&|b| b.out_reg = 8),
            with(&|b| b.in_strides[1][2] = 1), // a stride beyond the rank
            with(&|b| b.in_strides[2] = [1, 1, 0, 0, 0, 0]), // an unused input
            with(&|b| b.in_va[3] = 0x3000),
            with(&|b| b.instrs[0].a = 5), // read before written
            with(&|b| b.instrs[0].dst = 8),
            with(&|b| b.instrs[0].a = ELTWISE_IMM), // a unary of an immediate
            with(&|b| b.instrs[0].class = 3),
            with(&|b| b.instrs[0].code = 0), // Unary::None
            with(&|b| b.instrs[0].code = 99),
            with(&|b| b.instrs[5].code = 99),
            with(&|b| b.instrs[5].b = 0x7f),
            with(&|b| (b.instrs[3].a, b.instrs[3].b) = (ELTWISE_IMM, ELTWISE_IMM)),
            with(&|b| b.instrs[2].reserved[1] = 1),
            with(&|b| b.rank = 7),
        ];
        for b in bad {
            assert!(matches!(Desc::decode(&b.to_bytes()), Err(DescError::BadField(_))), "{b:?}");
        }
    }

    #[test]
    fn concat_descriptors_are_checked() {
        let mut d = ConcatDesc { rows: 2, out_cols: 7, parts: 2, out_va: 0x3000, ..Default::default() }.with_header();
        (d.src_va[0], d.col[0], d.cols[0]) = (0x1000, 0, 3);
        (d.src_va[1], d.col[1], d.cols[1]) = (0x2000, 3, 4);
        assert_eq!(Desc::decode(&d.to_bytes()), Ok(Desc::Concat(d)));
        let with = |f: &dyn Fn(&mut ConcatDesc)| {
            let mut b = d;
            f(&mut b);
            b
        };
        let bad = [
            with(&|b| b.parts = 0),
            with(&|b| b.parts = MAX_CONCAT_PARTS as u32 + 1),
            with(&|b| b.rows = 0),
            with(&|b| b.out_cols = 0),
            with(&|b| b.reserved = 1),
            with(&|b| b.cols[1] = 0),
            with(&|b| b.col[1] = 4),                         // 4 + 4 > 7
            with(&|b| (b.col[1], b.cols[1]) = (u32::MAX, 2)), // no wrap-around
            with(&|b| b.src_va[2] = 0x4000),                 // an unused part
            with(&|b| b.cols[15] = 1),
        ];
        for b in bad {
            assert!(matches!(Desc::decode(&b.to_bytes()), Err(DescError::BadField(_))), "{b:?}");
        }
    }

    /// CONV_WINOGRAD's filter layout: U = G·g·Gᵀ (worked for g = 1..9,
    /// checked against the matrix product in f64), point ξ of filter
    /// (co, ci) at (ξ·c_out + co)·c_in + ci; the flag is decoded for 3×3
    /// stride-1 undilated single-group convs only.
    #[test]
    fn conv_winograd_weights() {
        let g: [f32; 9] = core::array::from_fn(|i| (i + 1) as f32);
        let want = [1.0, 3.0, 1.0, 3.0, 6.0, 11.25, 3.75, 9.0, 2.0, 3.75, 1.25, 3.0, 7.0, 12.0, 4.0, 9.0];
        let mut u = [0.0f32; 16];
        winograd_weights(&g, 1, 1, &mut u);
        assert_eq!(u, want);
        // c_out 2 × c_in 3: filter (1, 2) is g, the others zero.
        let mut w = [0.0f32; 2 * 3 * 9];
        w[(3 + 2) * 9..][..9].copy_from_slice(&g);
        let mut u = [f32::NAN; 16 * 6];
        winograd_weights(&w, 2, 3, &mut u);
        for (i, &v) in u.iter().enumerate() {
            let (xi, f) = (i / 6, i % 6);
            assert_eq!(v, if f == 3 + 2 { want[xi] } else { 0.0 }, "index {i}");
        }
        assert_eq!(winograd_weights_len(64, 32), Some(16 * 64 * 32));
        assert_eq!(winograd_weights_len(u64::MAX, 2), None);
        let d = Conv2dDesc { n: 1, c_in: 4, h: 8, w: 8, c_out: 4, kh: 3, kw: 3, groups: 1, stride_h: 1, stride_w: 1, dil_h: 1, dil_w: 1, flags: CONV_WINOGRAD | CONV_BIAS, ..Default::default() }.with_header();
        assert_eq!(Desc::decode(&d.to_bytes()), Ok(Desc::Conv2d(d)));
        for bad in [
            Conv2dDesc { stride_w: 2, ..d },
            Conv2dDesc { dil_h: 2, ..d },
            Conv2dDesc { groups: 2, ..d },
            Conv2dDesc { kh: 5, ..d },
            Conv2dDesc { kw: 1, ..d },
        ] {
            assert_eq!(Desc::decode(&bad.to_bytes()), Err(DescError::BadField("conv winograd geometry")), "{bad:?}");
        }
        assert!(Desc::decode(&Conv2dDesc { flags: 1 << 6, ..d }.to_bytes()).is_err());
    }

    /// The channel-quad order of QCONV weights: index ((c/4·kh + ky)·kw +
    /// kx)·4 + c%4, padding channels at the column's zero point; the flag
    /// is QCONV's only.
    #[test]
    fn qconv_channel_quads() {
        assert_eq!(qconv_k(6, 3, 3, 0), Some(54));
        assert_eq!(qconv_k(6, 3, 3, QCONV_CHANNEL_QUADS), Some(72));
        assert_eq!(qconv_k(u64::MAX, 2, 1, QCONV_CHANNEL_QUADS), None);
        // 2 output channels, 5 input channels, a 1×2 window: w[o][c][t] = 10c + t (+ 100 for o = 1).
        let mut w = [0i8; 20];
        for (i, v) in w.iter_mut().enumerate() {
            let (o, c, t) = (i / 10, i / 2 % 5, i % 2);
            *v = (o * 100 + 10 * c + t) as i8;
        }
        let mut q = [0i8; 2 * 8 * 2];
        qconv_quad_order(&w, 2, 5, 1, 2, &[-3, 7], &mut q);
        // Row 0: quad 0 tap 0 (c 0..4), quad 0 tap 1, quad 1 tap 0 (c 4, then padding), quad 1 tap 1.
        assert_eq!(&q[..16], &[0, 10, 20, 30, 1, 11, 21, 31, 40, -3, -3, -3, 41, -3, -3, -3]);
        assert_eq!(&q[16..20], &[100, 110, 120, -126]);
        assert_eq!(&q[24..28], &[-116, 7, 7, 7]);
        let qc = QConvDesc { n: 1, c_in: 4, h: 3, w: 3, c_out: 1, kh: 3, kw: 3, stride_h: 1, stride_w: 1, dil_h: 1, dil_w: 1, groups: 1, flags: QCONV_CHANNEL_QUADS, ..Default::default() }.with_header();
        assert_eq!(Desc::decode(&qc.to_bytes()), Ok(Desc::QConv(qc)));
        let qg = QGemmDesc { m: 1, n: 1, k: 4, flags: QCONV_CHANNEL_QUADS, ..Default::default() }.with_header();
        assert_eq!(Desc::decode(&qg.to_bytes()), Err(DescError::BadField("qgemm flags")));
    }

    /// The tile layout places every weight of a matrix at its own offset
    /// inside the matrix (padding elsewhere), a tap's runs of 16 quads as
    /// channel rows; the flag is QCONV's only.
    #[test]
    fn qconv_weight_tiles() {
        // 3 taps × 20 quads (a 4-quad last run), 18 channels (2 blocks).
        let (k, n, taps) = (4 * 20 * 3, 18, 3);
        let len = qconv_tiled_len(k as u64, n as u64).unwrap() as usize;
        assert_eq!(len, 32 * k);
        let mut seen = [false; 32 * 240];
        for j in 0..n {
            for l in 0..k {
                let o = qconv_tile_offset(k, taps, l, j);
                assert!(o < len && !seen[o], "({l}, {j}) at {o}");
                seen[o] = true;
            }
        }
        // Quad q of tap s: group 3q + s. Channel 1's row of the first run
        // of tap 2: 64 bytes after channel 0's; the last run's rows are 16
        // bytes (4 quads).
        assert_eq!(qconv_tile_offset(k, taps, 4 * 2, 0), 2 * 64 * 20);
        assert_eq!(qconv_tile_offset(k, taps, 4 * 2 + 1, 1), 2 * 64 * 20 + 64 + 1);
        assert_eq!(qconv_tile_offset(k, taps, 4 * (3 * 17), 1), 1024 + 16 + 4);
        assert_eq!(qconv_tile_offset(k, taps, 0, 17), 64 * 60 + 64);
        let w: [i8; 240 * 18] = core::array::from_fn(|i| (i % 251) as i8);
        let mut t = [1i8; 32 * 240];
        pack_qconv_tiles(&w, k, n, taps, &mut t);
        assert_eq!(t[qconv_tile_offset(k, taps, 7, 5)], w[5 * k + 7]);
        assert_eq!(t.iter().filter(|&&v| v != 0).count(), w.iter().filter(|&&v| v != 0).count());
        // k not a multiple of 4 (one tap): the last group is padded.
        assert_eq!(qconv_tiled_len(6, 1), Some(8 * 16));
        assert_eq!(qconv_tile_offset(6, 1, 5, 1), 8 + 4 + 1);
        let qc = QConvDesc { n: 1, c_in: 4, h: 3, w: 3, c_out: 1, kh: 3, kw: 3, stride_h: 1, stride_w: 1, dil_h: 1, dil_w: 1, groups: 1, flags: QCONV_WEIGHT_TILES, ..Default::default() }.with_header();
        assert_eq!(Desc::decode(&qc.to_bytes()), Ok(Desc::QConv(qc)));
        let qg = QGemmDesc { m: 1, n: 1, k: 4, flags: QCONV_WEIGHT_TILES, ..Default::default() }.with_header();
        assert_eq!(Desc::decode(&qg.to_bytes()), Err(DescError::BadField("qgemm flags")));
    }

    #[test]
    fn softmax_takes_the_log_flag_only() {
        let d = SoftmaxDesc { rank: 2, axis: 1, dims: [2, 3, 0, 0, 0, 0], flags: SOFTMAX_LOG, ..Default::default() }.with_header();
        assert_eq!(Desc::decode(&d.to_bytes()), Ok(Desc::Softmax(d)));
        let bad = SoftmaxDesc { flags: 2, ..d };
        assert!(matches!(Desc::decode(&bad.to_bytes()), Err(DescError::BadField(_))));
    }

    #[test]
    fn recurrent_descriptors_are_checked() {
        let lstm = RecurrentDesc { cell: REC_LSTM, seq: 5, batch: 2, hidden: 8, x_va: 0x1000, r_va: 0x2000, y_va: 0x3000, c_va: 0x4000, ..Default::default() }
            .with_header();
        assert_eq!(Desc::decode(&lstm.to_bytes()), Ok(Desc::Recurrent(lstm)));
        let gru = RecurrentDesc { cell: REC_GRU, flags: REC_LINEAR_BEFORE_RESET | REC_REVERSE, rb_va: 0x5000, c_va: 0, ..lstm };
        assert_eq!(Desc::decode(&gru.to_bytes()), Ok(Desc::Recurrent(gru)));
        let bad = [
            RecurrentDesc { cell: 4, ..lstm },
            RecurrentDesc { flags: 1 << 2, ..lstm },
            RecurrentDesc { flags: REC_LINEAR_BEFORE_RESET, ..lstm }, // only a GRU resets
            RecurrentDesc { rb_va: 0x5000, ..lstm },                  // Rb_h without linear-before-reset
            RecurrentDesc { cell: REC_RNN_TANH, ..lstm },             // a cell state out of an RNN
            RecurrentDesc { c0_va: 0x6000, c_va: 0, ..gru },
            RecurrentDesc { seq: 0, ..lstm },
            RecurrentDesc { hidden: 0, ..lstm },
            RecurrentDesc { reserved: 1, ..lstm },
        ];
        for b in bad {
            assert!(matches!(Desc::decode(&b.to_bytes()), Err(DescError::BadField(_))), "{b:?}");
        }
    }
}
