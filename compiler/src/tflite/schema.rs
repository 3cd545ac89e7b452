//! The part of the TFLite flatbuffer schema (`schema.fbs`, file identifier
//! "TFL3") the compiler reads, as thin typed accessors over
//! `flatbuffers::Table`, written the way flatc's generated Rust is: each
//! table implements `flatbuffers::Follow` (to be reached from an offset) and
//! `flatbuffers::Verifiable` (to be checked by `flatbuffers::root`).
//!
//! Every table is declared once, by the `table!` macro, as a list of
//! `field: type = slot`; the same list generates the accessors and the
//! verifier, so a field is never read as another type than the one that was
//! verified. Slots are vtable byte offsets (4 + 2 * field index), from the
//! public schema (see docs/compiler.md, "TFLite"). Fields not listed are
//! neither verified nor read; `flatbuffers::root::<Model>` verifies every
//! listed field of every reachable table before anything is read, so a
//! hostile file fails there with an error, never a panic.
//!
//! The only `unsafe` is flatbuffers' own contract: `Follow::follow` and
//! `Table::get` trust the buffer. Both are reached only through a `Model`
//! returned by [`root`], which ran the verifier over the same fields and
//! types.

use flatbuffers::{Follow, ForwardsUOffset, InvalidFlatbuffer, Table, Vector, Verifiable, Verifier, VerifierOptions};

/// A table: a struct around `flatbuffers::Table`, its `Follow` and
/// `Verifiable` impls, and one accessor per field. `scalar` fields return
/// the value or the schema's default; `offset` fields (vectors, strings,
/// tables) return `None` when absent.
macro_rules! table {
    ($(#[$m:meta])* $name:ident {
        $(scalar $sf:ident : $st:ty = $sd:expr, $ss:expr;)*
        $(offset $of:ident : $ot:ty, $os:expr;)*
    }) => {
        $(#[$m])*
        #[derive(Clone, Copy)]
        #[allow(dead_code)]
        pub struct $name<'a> {
            tab: Table<'a>,
        }

        impl<'a> Follow<'a> for $name<'a> {
            type Inner = $name<'a>;
            #[inline]
            unsafe fn follow(buf: &'a [u8], loc: usize) -> Self::Inner {
                // SAFETY: Follow's contract: the caller guarantees that
                // buf[loc..] holds a table of this type. Callers are
                // flatbuffers' own offset followers, reached from a root
                // that `root()` verified with this type's verifier.
                $name { tab: unsafe { Table::new(buf, loc) } }
            }
        }

        impl<'a> Verifiable for $name<'a> {
            #[inline]
            fn run_verifier(v: &mut Verifier, pos: usize) -> Result<(), InvalidFlatbuffer> {
                v.visit_table(pos)?
                    $(.visit_field::<$st>(stringify!($sf), $ss, false)?)*
                    $(.visit_field::<ForwardsUOffset<$ot>>(stringify!($of), $os, false)?)*
                    .finish();
                Ok(())
            }
        }

        #[allow(dead_code)]
        impl<'a> $name<'a> {
            $(
                pub fn $sf(&self) -> $st {
                    // SAFETY: slot $ss of this table was verified to hold a
                    // $st (run_verifier above) when the root was verified.
                    unsafe { self.tab.get::<$st>($ss, Some($sd)) }.unwrap_or($sd)
                }
            )*
            $(
                pub fn $of(&self) -> Option<$ot> {
                    // SAFETY: slot $os of this table was verified to hold
                    // an offset to a valid $ot (run_verifier above).
                    unsafe { self.tab.get::<ForwardsUOffset<$ot>>($os, None) }
                }
            )*
        }
    };
}

table!(
    /// `table Model`.
    Model {
        scalar version: u32 = 0, 4;
        offset operator_codes: Vector<'a, ForwardsUOffset<OperatorCode<'a>>>, 6;
        offset subgraphs: Vector<'a, ForwardsUOffset<SubGraph<'a>>>, 8;
        offset description: &'a str, 10;
        offset buffers: Vector<'a, ForwardsUOffset<Buffer<'a>>>, 12;
    }
);

table!(
    /// `table OperatorCode`: the builtin op is max(deprecated_builtin_code,
    /// builtin_code) (the first is a byte kept for old readers).
    OperatorCode {
        scalar deprecated_builtin_code: i8 = 0, 4;
        scalar version: i32 = 1, 8;
        scalar builtin_code: i32 = 0, 10;
        offset custom_code: &'a str, 6;
    }
);

table!(
    /// `table SubGraph`.
    SubGraph {
        offset tensors: Vector<'a, ForwardsUOffset<Tensor<'a>>>, 4;
        offset inputs: Vector<'a, i32>, 6;
        offset outputs: Vector<'a, i32>, 8;
        offset operators: Vector<'a, ForwardsUOffset<Operator<'a>>>, 10;
        offset name: &'a str, 12;
    }
);

table!(
    /// `table Tensor`. `sparsity` and `quantization` are only checked for
    /// presence; `external_buffer` (an index into Model.external_buffers)
    /// is refused when non-zero.
    Tensor {
        scalar tensor_type: i8 = 0, 6;
        scalar buffer: u32 = 0, 8;
        scalar is_variable: bool = false, 14;
        scalar external_buffer: u32 = 0, 24;
        offset shape: Vector<'a, i32>, 4;
        offset name: &'a str, 10;
        offset quantization: QuantizationParameters<'a>, 12;
        offset sparsity: Opaque<'a>, 16;
        offset shape_signature: Vector<'a, i32>, 18;
    }
);

table!(
    /// `table QuantizationParameters`: affine quantisation, per tensor or
    /// along `quantized_dimension`; `details` (custom schemes) is only
    /// checked for presence, by its type tag.
    QuantizationParameters {
        scalar details_type: u8 = 0, 12;
        scalar quantized_dimension: i32 = 0, 16;
        offset scale: Vector<'a, f32>, 8;
        offset zero_point: Vector<'a, i64>, 10;
    }
);

table!(
    /// A table whose fields are not read (only its presence matters).
    Opaque {}
);

table!(
    /// `table Buffer`: inline `data`, or (files over 2 GB) `offset`/`size`
    /// of bytes after the flatbuffer, counted from the start of the file.
    Buffer {
        scalar offset: u64 = 0, 6;
        scalar size: u64 = 0, 8;
        offset data: Vector<'a, u8>, 4;
    }
);

/// `table Operator` and its `builtin_options` union (type at slot 10,
/// value at slot 12): one accessor per options table read, generated with
/// the union arm of the verifier from one list.
macro_rules! operator {
    ($($acc:ident : $t:ident = $key:expr;)*) => {
        /// `table Operator`.
        #[derive(Clone, Copy)]
        pub struct Operator<'a> {
            tab: Table<'a>,
        }

        impl<'a> Follow<'a> for Operator<'a> {
            type Inner = Operator<'a>;
            #[inline]
            unsafe fn follow(buf: &'a [u8], loc: usize) -> Self::Inner {
                // SAFETY: as for every table (see `table!`).
                Operator { tab: unsafe { Table::new(buf, loc) } }
            }
        }

        impl<'a> Verifiable for Operator<'a> {
            fn run_verifier(v: &mut Verifier, pos: usize) -> Result<(), InvalidFlatbuffer> {
                v.visit_table(pos)?
                    .visit_field::<u32>("opcode_index", 4, false)?
                    .visit_field::<ForwardsUOffset<Vector<'_, i32>>>("inputs", 6, false)?
                    .visit_field::<ForwardsUOffset<Vector<'_, i32>>>("outputs", 8, false)?
                    .visit_union::<u8, _>("builtin_options_type", 10, "builtin_options", 12, false, |key, v, pos| match key {
                        $($key => v.verify_union_variant::<ForwardsUOffset<$t>>(stringify!($t), pos),)*
                        _ => Ok(()),
                    })?
                    .finish();
                Ok(())
            }
        }

        #[allow(dead_code)]
        impl<'a> Operator<'a> {
            pub fn opcode_index(&self) -> u32 {
                // SAFETY: verified as u32 (run_verifier above).
                unsafe { self.tab.get::<u32>(4, Some(0)) }.unwrap_or(0)
            }
            pub fn inputs(&self) -> Option<Vector<'a, i32>> {
                // SAFETY: verified as a vector of i32.
                unsafe { self.tab.get::<ForwardsUOffset<Vector<'a, i32>>>(6, None) }
            }
            pub fn outputs(&self) -> Option<Vector<'a, i32>> {
                // SAFETY: verified as a vector of i32.
                unsafe { self.tab.get::<ForwardsUOffset<Vector<'a, i32>>>(8, None) }
            }
            pub fn builtin_options_type(&self) -> u8 {
                // SAFETY: verified as u8 (the union's key).
                unsafe { self.tab.get::<u8>(10, Some(0)) }.unwrap_or(0)
            }
            $(
                pub fn $acc(&self) -> Option<$t<'a>> {
                    if self.builtin_options_type() != $key {
                        return None;
                    }
                    // SAFETY: with this key, the verifier checked the
                    // union's value as a $t.
                    unsafe { self.tab.get::<ForwardsUOffset<$t<'a>>>(12, None) }
                }
            )*
        }
    };
}

operator! {
    conv2d_options: Conv2DOptions = 1;
    depthwise_options: DepthwiseConv2DOptions = 2;
    pool2d_options: Pool2DOptions = 5;
    fully_connected_options: FullyConnectedOptions = 8;
    softmax_options: FloatOptions = 9;
    concatenation_options: ConcatenationOptions = 10;
    add_options: ActivationOptions = 11;
    resize_bilinear_options: ResizeBilinearOptions = 15;
    mul_options: ActivationOptions = 21;
    gather_options: GatherOptions = 23;
    reducer_options: ReducerOptions = 27;
    sub_options: ActivationOptions = 28;
    div_options: ActivationOptions = 29;
    strided_slice_options: StridedSliceOptions = 32;
    split_options: CountOptions = 35;
    transpose_conv_options: TransposeConvOptions = 49;
    pack_options: PackOptions = 59;
    unpack_options: PackOptions = 64;
    resize_nearest_options: ResizeNearestNeighborOptions = 74;
    leaky_relu_options: FloatOptions = 75;
    split_v_options: CountOptions = 79;
    batch_matmul_options: BatchMatMulOptions = 101;
}

table!(
    /// `Conv2DOptions`. Padding: 0 SAME, 1 VALID. Activation: 0 NONE,
    /// 1 RELU, 2 RELU_N1_TO_1, 3 RELU6, 4 TANH, 5 SIGN_BIT.
    Conv2DOptions {
        scalar padding: i8 = 0, 4;
        scalar stride_w: i32 = 0, 6;
        scalar stride_h: i32 = 0, 8;
        scalar fused_activation_function: i8 = 0, 10;
        scalar dilation_w_factor: i32 = 1, 12;
        scalar dilation_h_factor: i32 = 1, 14;
    }
);

table!(
    /// `DepthwiseConv2DOptions`.
    DepthwiseConv2DOptions {
        scalar padding: i8 = 0, 4;
        scalar stride_w: i32 = 0, 6;
        scalar stride_h: i32 = 0, 8;
        scalar depth_multiplier: i32 = 0, 10;
        scalar fused_activation_function: i8 = 0, 12;
        scalar dilation_w_factor: i32 = 1, 14;
        scalar dilation_h_factor: i32 = 1, 16;
    }
);

table!(
    /// `Pool2DOptions`.
    Pool2DOptions {
        scalar padding: i8 = 0, 4;
        scalar stride_w: i32 = 0, 6;
        scalar stride_h: i32 = 0, 8;
        scalar filter_width: i32 = 0, 10;
        scalar filter_height: i32 = 0, 12;
        scalar fused_activation_function: i8 = 0, 14;
    }
);

table!(
    /// `FullyConnectedOptions`. weights_format 0 is DEFAULT.
    FullyConnectedOptions {
        scalar fused_activation_function: i8 = 0, 4;
        scalar weights_format: i8 = 0, 6;
        scalar keep_num_dims: bool = false, 8;
    }
);

table!(
    /// `SoftmaxOptions` (beta) and `LeakyReluOptions` (alpha): one float.
    FloatOptions {
        scalar value: f32 = 0.0, 4;
    }
);

table!(
    /// `ConcatenationOptions`.
    ConcatenationOptions {
        scalar axis: i32 = 0, 4;
        scalar fused_activation_function: i8 = 0, 6;
    }
);

table!(
    /// `AddOptions`, `SubOptions`, `MulOptions`, `DivOptions`.
    ActivationOptions {
        scalar fused_activation_function: i8 = 0, 4;
    }
);

table!(
    /// `ResizeBilinearOptions` (slots 4 and 6 are deprecated fields).
    ResizeBilinearOptions {
        scalar align_corners: bool = false, 8;
        scalar half_pixel_centers: bool = false, 10;
    }
);

table!(
    /// `ResizeNearestNeighborOptions`.
    ResizeNearestNeighborOptions {
        scalar align_corners: bool = false, 4;
        scalar half_pixel_centers: bool = false, 6;
    }
);

table!(
    /// `GatherOptions`.
    GatherOptions {
        scalar axis: i32 = 0, 4;
        scalar batch_dims: i32 = 0, 6;
    }
);

table!(
    /// `ReducerOptions` (MEAN, SUM, REDUCE_MAX, REDUCE_MIN, ...).
    ReducerOptions {
        scalar keep_dims: bool = false, 4;
    }
);

table!(
    /// `StridedSliceOptions`.
    StridedSliceOptions {
        scalar begin_mask: i32 = 0, 4;
        scalar end_mask: i32 = 0, 6;
        scalar ellipsis_mask: i32 = 0, 8;
        scalar new_axis_mask: i32 = 0, 10;
        scalar shrink_axis_mask: i32 = 0, 12;
        scalar offset: bool = false, 14;
    }
);

table!(
    /// `SplitOptions` and `SplitVOptions`: num_splits.
    CountOptions {
        scalar num_splits: i32 = 0, 4;
    }
);

table!(
    /// `TransposeConvOptions`.
    TransposeConvOptions {
        scalar padding: i8 = 0, 4;
        scalar stride_w: i32 = 0, 6;
        scalar stride_h: i32 = 0, 8;
        scalar fused_activation_function: i8 = 0, 10;
    }
);

table!(
    /// `PackOptions` (values_count, axis) and `UnpackOptions` (num, axis).
    PackOptions {
        scalar count: i32 = 0, 4;
        scalar axis: i32 = 0, 6;
    }
);

table!(
    /// `BatchMatMulOptions`.
    BatchMatMulOptions {
        scalar adj_x: bool = false, 4;
        scalar adj_y: bool = false, 6;
    }
);

/// The file identifier at bytes 4..8 of every TFLite file.
pub const IDENTIFIER: &[u8; 4] = b"TFL3";

/// The root table, after verifying the whole buffer.
pub fn root(bytes: &[u8]) -> Result<Model<'_>, InvalidFlatbuffer> {
    // The default limits except the size: a model's weights may take up to
    // the 4 GiB a flatbuffer can address.
    let opts = VerifierOptions { max_apparent_size: 1 << 32, ..Default::default() };
    flatbuffers::root_with_opts::<Model>(&opts, bytes)
}
