//! TFLite operators as ONNX node sequences (see the module docs of
//! [`crate::tflite`] for the layout rules).
//!
//! Every tensor the translation has produced is held in one or both of two
//! forms: *plain* (TFLite's own layout, e.g. NHWC) and, for 4-D tensors,
//! *NCHW* (the plain tensor transposed by [0, 3, 1, 2]). Ops that have an
//! NCHW ONNX counterpart (convolutions, pools, resizes) read and write the
//! NCHW form; layout-agnostic ops (element-wise, concat, reductions, pads,
//! slices, softmax over channels) work on whichever form their inputs are
//! in, with their axes remapped; every other op reads the plain form. A
//! form that does not exist yet is made by one Transpose the first time it
//! is needed, and reused.
//!
//! A quantised run-time tensor (see [`crate::tflite`]) is held as its
//! 8-bit value in one or both forms (`qforms`); its float forms are the
//! DequantizeLinear of those, made when an op reads them. An op writing it
//! computes in f32 and its result goes through one QuantizeLinear. A
//! layout change of a quantised tensor transposes the 8-bit value (so that
//! the DequantizeLinear stays next to the op that reads it, where the int8
//! lowering looks for it). Quantised constants become 8-bit (or int32)
//! initializers, already in the layout the op reads, with their
//! DequantizeLinear.

use std::collections::{HashMap, HashSet};

use super::schema::Operator;
use super::{attr_f, attr_i, attr_ints, attr_s, initializer, node, ty, OpInfo, QParams, TensorInfo, QUANTIZED};
use crate::error::{CompileError, Result};
use crate::ir::{Const, Data};
use crate::onnx::{elem, AttributeProto, NodeProto, TensorProto};

/// NHWC axis -> NCHW axis.
const NHWC_TO_NCHW_AXIS: [usize; 4] = [0, 2, 3, 1];
/// Transpose permutation NHWC -> NCHW (output axis i reads input axis p[i]).
const TO_NCHW: [usize; 4] = [0, 3, 1, 2];
/// Transpose permutation NCHW -> NHWC.
const TO_NHWC: [usize; 4] = [0, 2, 3, 1];

/// ONNX node name -> (operator index, first output tensor name, op name).
pub type NodeOps = HashMap<String, (usize, String, String)>;

#[derive(Clone, Default)]
struct Forms {
    plain: Option<String>,
    nchw: Option<String>,
    /// The form the producer wrote (true: NCHW).
    primary_nchw: bool,
}

impl Forms {
    /// Record `name` as the NCHW (or plain) form.
    fn hold(&mut self, nchw: bool, name: &str) {
        if nchw {
            self.nchw = Some(name.to_string());
        } else {
            self.plain = Some(name.to_string());
        }
    }
}

pub struct Lowering {
    pub tensors: Vec<TensorInfo>,
    forms: Vec<Forms>,
    /// The 8-bit forms of quantised run-time tensors.
    qforms: Vec<Forms>,
    /// Dequantised constants already made (their value names).
    dq_consts: HashSet<String>,
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    /// Initializer names already made.
    init_names: HashSet<String>,
    node_ops: NodeOps,
    /// The operator being lowered: index, label name, op name.
    cur: (usize, String, String),
    /// Base for this operator's node and value names.
    base: String,
    counter: usize,
    /// The serialized operator (options), when lowering one.
    op_options: Option<OptionsRef>,
}

/// The options the current operator carries, copied out of the flatbuffer.
#[derive(Clone, Copy, Debug, Default)]
pub struct OptionsRef {
    pub padding: i8,
    pub stride_w: i32,
    pub stride_h: i32,
    pub dilation_w: i32,
    pub dilation_h: i32,
    pub filter_w: i32,
    pub filter_h: i32,
    pub depth_multiplier: i32,
    pub activation: i8,
    pub axis: i32,
    pub keep_dims: bool,
    pub keep_num_dims: bool,
    pub weights_format: i8,
    pub align_corners: bool,
    pub half_pixel_centers: bool,
    pub float: f32,
    pub count: i32,
    pub batch_dims: i32,
    pub begin_mask: i32,
    pub end_mask: i32,
    pub ellipsis_mask: i32,
    pub new_axis_mask: i32,
    pub shrink_axis_mask: i32,
    pub slice_offset: bool,
    pub adj_x: bool,
    pub adj_y: bool,
    /// Whether the union held the table the op expects.
    pub present: bool,
}

impl OptionsRef {
    /// The options of `o` for the builtin `code`, with schema defaults when
    /// the table is absent.
    pub fn read(o: &Operator<'_>, code: i32) -> OptionsRef {
        let mut r = OptionsRef { dilation_w: 1, dilation_h: 1, ..Default::default() };
        match code {
            3 => {
                if let Some(p) = o.conv2d_options() {
                    r.present = true;
                    r.padding = p.padding();
                    r.stride_w = p.stride_w();
                    r.stride_h = p.stride_h();
                    r.activation = p.fused_activation_function();
                    r.dilation_w = p.dilation_w_factor();
                    r.dilation_h = p.dilation_h_factor();
                }
            }
            4 => {
                if let Some(p) = o.depthwise_options() {
                    r.present = true;
                    r.padding = p.padding();
                    r.stride_w = p.stride_w();
                    r.stride_h = p.stride_h();
                    r.depth_multiplier = p.depth_multiplier();
                    r.activation = p.fused_activation_function();
                    r.dilation_w = p.dilation_w_factor();
                    r.dilation_h = p.dilation_h_factor();
                }
            }
            1 | 17 => {
                if let Some(p) = o.pool2d_options() {
                    r.present = true;
                    r.padding = p.padding();
                    r.stride_w = p.stride_w();
                    r.stride_h = p.stride_h();
                    r.filter_w = p.filter_width();
                    r.filter_h = p.filter_height();
                    r.activation = p.fused_activation_function();
                }
            }
            9 => {
                if let Some(p) = o.fully_connected_options() {
                    r.present = true;
                    r.activation = p.fused_activation_function();
                    r.weights_format = p.weights_format();
                    r.keep_num_dims = p.keep_num_dims();
                }
            }
            25 => {
                r.float = 1.0;
                if let Some(p) = o.softmax_options() {
                    r.present = true;
                    r.float = p.value();
                }
            }
            98 => {
                if let Some(p) = o.leaky_relu_options() {
                    r.present = true;
                    r.float = p.value();
                }
            }
            2 => {
                if let Some(p) = o.concatenation_options() {
                    r.present = true;
                    r.axis = p.axis();
                    r.activation = p.fused_activation_function();
                }
            }
            0 | 18 | 41 | 42 => {
                let a = o.add_options().or(o.mul_options()).or(o.sub_options()).or(o.div_options());
                if let Some(p) = a {
                    r.present = true;
                    r.activation = p.fused_activation_function();
                }
            }
            23 => {
                if let Some(p) = o.resize_bilinear_options() {
                    r.present = true;
                    r.align_corners = p.align_corners();
                    r.half_pixel_centers = p.half_pixel_centers();
                }
            }
            97 => {
                if let Some(p) = o.resize_nearest_options() {
                    r.present = true;
                    r.align_corners = p.align_corners();
                    r.half_pixel_centers = p.half_pixel_centers();
                }
            }
            36 => {
                if let Some(p) = o.gather_options() {
                    r.present = true;
                    r.axis = p.axis();
                    r.batch_dims = p.batch_dims();
                }
            }
            40 | 74 | 82 | 89 => {
                if let Some(p) = o.reducer_options() {
                    r.present = true;
                    r.keep_dims = p.keep_dims();
                }
            }
            45 => {
                if let Some(p) = o.strided_slice_options() {
                    r.present = true;
                    r.begin_mask = p.begin_mask();
                    r.end_mask = p.end_mask();
                    r.ellipsis_mask = p.ellipsis_mask();
                    r.new_axis_mask = p.new_axis_mask();
                    r.shrink_axis_mask = p.shrink_axis_mask();
                    r.slice_offset = p.offset();
                }
            }
            49 => {
                if let Some(p) = o.split_options() {
                    r.present = true;
                    r.count = p.num_splits();
                }
            }
            102 => {
                if let Some(p) = o.split_v_options() {
                    r.present = true;
                    r.count = p.num_splits();
                }
            }
            67 => {
                if let Some(p) = o.transpose_conv_options() {
                    r.present = true;
                    r.padding = p.padding();
                    r.stride_w = p.stride_w();
                    r.stride_h = p.stride_h();
                    r.activation = p.fused_activation_function();
                }
            }
            83 => {
                if let Some(p) = o.pack_options() {
                    r.present = true;
                    r.count = p.count();
                    r.axis = p.axis();
                }
            }
            88 => {
                if let Some(p) = o.unpack_options() {
                    r.present = true;
                    r.count = p.count();
                    r.axis = p.axis();
                }
            }
            126 => {
                if let Some(p) = o.batch_matmul_options() {
                    r.present = true;
                    r.adj_x = p.adj_x();
                    r.adj_y = p.adj_y();
                }
            }
            _ => {}
        }
        r
    }
}

/// TF's SAME padding for one spatial dim: (begin, end), the extra pixel at
/// the end.
fn same_pads(input: i64, k: i64, stride: i64, dilation: i64) -> (i64, i64) {
    let eff = (k - 1).saturating_mul(dilation).saturating_add(1);
    let out = (input + stride - 1) / stride;
    let total = ((out - 1).saturating_mul(stride).saturating_add(eff) - input).max(0);
    (total / 2, total - total / 2)
}

/// Permute a row-major array of `shape` by `perm` (output axis i is input
/// axis perm[i]).
fn permute<T: Copy>(data: &[T], shape: &[u64], perm: &[usize]) -> (Vec<T>, Vec<u64>) {
    let rank = shape.len();
    let out_shape: Vec<u64> = perm.iter().map(|&p| shape[p]).collect();
    let mut in_strides = vec![1u64; rank];
    for i in (0..rank.saturating_sub(1)).rev() {
        in_strides[i] = in_strides[i + 1] * shape[i + 1];
    }
    let strides: Vec<u64> = perm.iter().map(|&p| in_strides[p]).collect();
    let mut out = Vec::with_capacity(data.len());
    let mut idx = vec![0u64; rank];
    for _ in 0..data.len() {
        let off: u64 = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
        out.push(data[off as usize]);
        for a in (0..rank).rev() {
            idx[a] += 1;
            if idx[a] < out_shape[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    (out, out_shape)
}

fn permute_const(c: &Const, perm: &[usize]) -> Const {
    match &c.data {
        Data::F(v) => {
            let (d, s) = permute(v, &c.shape, perm);
            Const { shape: s, data: Data::F(d) }
        }
        Data::I(v) => {
            let (d, s) = permute(v, &c.shape, perm);
            Const { shape: s, data: Data::I(d) }
        }
    }
}

/// A quantised constant's real values (f32).
fn dequantized(c: &Const, q: &QParams) -> Const {
    let ints = c.ints();
    // Entries along the quantised axis repeat every `inner` elements.
    let inner: u64 = c.shape.iter().skip(q.dim + 1).product();
    let v = ints
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let ch = if q.scale.len() == 1 { 0 } else { (i as u64 / inner.max(1)) as usize % q.scale.len() };
            ((x - q.zero[ch]) as f64 * q.scale[ch] as f64) as f32
        })
        .collect();
    Const::f32(&c.shape, v)
}

fn ints_const(v: &[i64]) -> Const {
    Const::i64(&[v.len() as u64], v.to_vec())
}

impl Lowering {
    pub fn new(tensors: Vec<TensorInfo>) -> Self {
        let n = tensors.len();
        Lowering {
            tensors,
            forms: vec![Forms::default(); n],
            qforms: vec![Forms::default(); n],
            dq_consts: HashSet::new(),
            nodes: Vec::new(),
            inits: Vec::new(),
            init_names: HashSet::new(),
            node_ops: HashMap::new(),
            cur: (0, String::new(), String::new()),
            base: String::new(),
            counter: 0,
            op_options: None,
        }
    }

    pub fn finish(self) -> (Vec<NodeProto>, Vec<TensorProto>, NodeOps) {
        (self.nodes, self.inits, self.node_ops)
    }

    /// A model input: held in its plain form under its own name (its
    /// 8-bit form when quantised).
    pub fn set_input(&mut self, t: usize) {
        let f = Forms { plain: Some(self.tensors[t].uname.clone()), nchw: None, primary_nchw: false };
        if self.quantized_run_time(t) {
            self.qforms[t] = f;
        } else {
            self.forms[t] = f;
        }
    }

    /// A run-time tensor carried as 8-bit values (QDQ).
    fn quantized_run_time(&self, t: usize) -> bool {
        self.tensors[t].q.is_some() && self.konst(t).is_none()
    }

    /// The plain form of a model output (the interface name).
    pub fn plain_output(&mut self, t: usize) -> Result<String> {
        let f = if self.quantized_run_time(t) { &self.qforms[t] } else { &self.forms[t] };
        if f.plain.is_none() && f.nchw.is_none() {
            let what = &self.tensors[t].name;
            return Err(CompileError::Invalid(if self.tensors[t].konst.is_some() {
                format!("output '{what}' is a constant (it does not depend on any input); nothing to run")
            } else {
                format!("output '{what}' is not computed by any operator")
            }));
        }
        // A Transpose made here belongs to no operator.
        self.base = format!("{}#out", self.tensors[t].uname);
        if self.quantized_run_time(t) {
            return self.qform(t, false);
        }
        self.form(t, false)
    }

    fn err(&self, reason: impl Into<String>) -> CompileError {
        CompileError::TfliteOp { index: self.cur.0, name: self.cur.1.clone(), op: self.cur.2.clone(), reason: reason.into() }
    }

    fn opts(&self) -> OptionsRef {
        self.op_options.unwrap_or_default()
    }

    fn fresh(&mut self, tag: &str) -> String {
        self.counter += 1;
        format!("{}#{tag}{}", self.base, self.counter)
    }

    /// The name a tensor's form is written under.
    fn form_name(&self, t: usize, nchw: bool) -> String {
        if nchw {
            format!("{}#nchw", self.tensors[t].uname)
        } else {
            self.tensors[t].uname.clone()
        }
    }

    fn emit(&mut self, op: &str, inputs: Vec<String>, outputs: Vec<String>, attrs: Vec<AttributeProto>) {
        let name = self.node_name();
        self.node_ops.insert(name.clone(), self.cur.clone());
        self.nodes.push(node(op, &name, inputs, outputs, attrs));
    }

    /// Node names: the operator's label first, then label#2, #3, ...
    fn node_name(&mut self) -> String {
        let mut k = 1;
        loop {
            let n = if k == 1 { self.base.clone() } else { format!("{}#{k}", self.base) };
            if !self.node_ops.contains_key(&n) {
                return n;
            }
            k += 1;
        }
    }

    fn konst(&self, t: usize) -> Option<&Const> {
        self.tensors[t].konst.as_ref()
    }

    /// An initializer (made once per name).
    fn init(&mut self, name: String, c: &Const, elem_type: i32) -> String {
        if self.init_names.insert(name.clone()) {
            self.inits.push(initializer(&name, c, elem_type));
        }
        name
    }

    fn init_ints(&mut self, v: &[i64]) -> String {
        let name = self.fresh("i");
        self.init(name, &ints_const(v), elem::INT64)
    }

    fn init_f32(&mut self, v: f32) -> String {
        let name = self.fresh("f");
        self.init(name, &Const::f32(&[], vec![v]), elem::FLOAT)
    }

    fn elem_of(&self, t: usize) -> Result<i32> {
        let info = &self.tensors[t];
        if info.quantized {
            return Err(self.err(format!("tensor '{}' is {} (quantized): {QUANTIZED}", info.name, ty::name(info.ty))));
        }
        ty::onnx(info.ty).ok_or_else(|| self.err(format!("tensor '{}' is {}, which rbln-compile does not handle", info.name, ty::name(info.ty))))
    }

    /// Whether a run-time tensor's producer wrote it in NCHW form.
    fn is_nchw(&self, t: usize) -> bool {
        self.konst(t).is_none() && self.forms[t].primary_nchw
    }

    /// Constant `t` as the initializer `name` holding `c` (its data
    /// re-laid-out: axis i of `c` is axis `axes[i]` of the tensor, None for
    /// an added unit axis). A quantised constant is its 8-bit (or int32)
    /// data under `name#q` and the value `name` is its DequantizeLinear.
    fn const_form(&mut self, t: usize, name: String, c: &Const, axes: &[Option<usize>]) -> Result<String> {
        let Some(q) = self.tensors[t].q.clone() else {
            let et = self.elem_of(t)?;
            return Ok(self.init(name, c, et));
        };
        if self.dq_consts.insert(name.clone()) {
            let et = ty::onnx_quantized(self.tensors[t].ty).ok_or_else(|| self.err(QUANTIZED))?;
            let qn = self.init(format!("{name}#q"), c, et);
            let mut attrs = vec![];
            if q.scale.len() > 1 {
                let axis = axes.iter().position(|&a| a == Some(q.dim)).ok_or_else(|| self.err("a per-channel quantised constant loses its channel axis"))?;
                attrs.push(attr_i("axis", axis as i64));
            }
            let (s, z) = self.qparams(&format!("{name}#"), &q, et);
            self.emit("DequantizeLinear", vec![qn, s, z], vec![name.clone()], attrs);
        }
        Ok(name)
    }

    /// The scale and zero-point initializers of `q` (scalars when per
    /// tensor), named `{prefix}scale` and `{prefix}zero`.
    fn qparams(&mut self, prefix: &str, q: &QParams, et: i32) -> (String, String) {
        let dims: &[u64] = if q.scale.len() == 1 { &[] } else { &[q.scale.len() as u64] };
        let s = self.init(format!("{prefix}scale"), &Const::f32(dims, q.scale.clone()), elem::FLOAT);
        let z = self.init(format!("{prefix}zero"), &Const::i64(dims, q.zero.clone()), et);
        (s, z)
    }

    /// The scale and zero-point initializers of quantised run-time tensor
    /// `t` (None for any other tensor).
    fn run_time_qparams(&mut self, t: usize) -> Option<(String, String)> {
        let q = self.tensors[t].q.clone().filter(|_| self.quantized_run_time(t))?;
        let et = ty::onnx_quantized(self.tensors[t].ty)?;
        Some(self.qparams(&format!("{}#", self.tensors[t].uname), &q, et))
    }

    /// The 8-bit value of quantised run-time tensor `t` in the wanted form.
    fn qform(&mut self, t: usize, nchw: bool) -> Result<String> {
        let nchw = nchw && self.tensors[t].rank() == 4;
        let out = format!("{}#q", self.form_name(t, nchw));
        self.relayout(t, true, nchw, out)
    }

    /// Tensor `t` in the wanted layout among its float forms (or its 8-bit
    /// ones, `quantized`): the one held, else one Transpose of the other
    /// into `out`.
    fn relayout(&mut self, t: usize, quantized: bool, nchw: bool, out: String) -> Result<String> {
        let f = if quantized { &self.qforms[t] } else { &self.forms[t] }.clone();
        if let Some(n) = if nchw { &f.nchw } else { &f.plain } {
            return Ok(n.clone());
        }
        let Some(src) = (if nchw { f.plain } else { f.nchw }) else {
            return Err(self.err(format!(
                "reads tensor '{}', which no earlier operator computes and which is neither an input nor a constant",
                self.tensors[t].name
            )));
        };
        let perm = if nchw { TO_NCHW } else { TO_NHWC };
        self.emit("Transpose", vec![src], vec![out.clone()], vec![attr_ints("perm", perm.iter().map(|&p| p as i64).collect())]);
        Forms::hold(if quantized { &mut self.qforms[t] } else { &mut self.forms[t] }, nchw, &out);
        Ok(out)
    }

    /// The ONNX value holding tensor `t` in the wanted form.
    fn form(&mut self, t: usize, nchw: bool) -> Result<String> {
        let nchw = nchw && self.tensors[t].rank() == 4;
        if let Some(c) = self.konst(t).cloned() {
            let name = self.form_name(t, nchw);
            let rank = c.shape.len();
            let (c, perm) = if nchw { (permute_const(&c, &TO_NCHW), TO_NCHW.to_vec()) } else { (c, (0..rank).collect()) };
            return self.const_form(t, name, &c, &perm.iter().map(|&p| Some(p)).collect::<Vec<_>>());
        }
        if self.quantized_run_time(t) && (if nchw { &self.forms[t].nchw } else { &self.forms[t].plain }).is_none() {
            let qn = self.qform(t, nchw)?;
            let (s, z) = self.run_time_qparams(t).ok_or_else(|| self.err(QUANTIZED))?;
            let out = format!("{}#dq", self.form_name(t, nchw));
            self.emit("DequantizeLinear", vec![qn, s, z], vec![out.clone()], vec![]);
            Forms::hold(&mut self.forms[t], nchw, &out);
            return Ok(out);
        }
        let out = self.form_name(t, nchw);
        self.relayout(t, false, nchw, out)
    }

    /// Record that `name` holds tensor `t` (in NCHW form if `nchw`). A
    /// quantised tensor is then the QuantizeLinear of `name`.
    fn set(&mut self, t: usize, name: String, nchw: bool) {
        let nchw = nchw && self.tensors[t].rank() == 4;
        let holds = |n: String| if nchw { Forms { plain: None, nchw: Some(n), primary_nchw: true } } else { Forms { plain: Some(n), nchw: None, primary_nchw: false } };
        if let Some((s, z)) = self.run_time_qparams(t) {
            let qn = format!("{name}#q");
            self.emit("QuantizeLinear", vec![name, s, z], vec![qn.clone()], vec![]);
            self.qforms[t] = holds(qn);
            self.forms[t] = Forms { plain: None, nchw: None, primary_nchw: nchw };
            return;
        }
        self.forms[t] = holds(name);
    }

    /// The output name of tensor `t` in a form.
    fn out(&self, t: usize, nchw: bool) -> String {
        self.form_name(t, nchw && self.tensors[t].rank() == 4)
    }

    /// Write `op(inputs)` into output tensor `t`, followed by the fused
    /// activation `act`.
    fn emit_act(&mut self, op: &str, inputs: Vec<String>, t: usize, nchw: bool, attrs: Vec<AttributeProto>, act: i8) -> Result<()> {
        let out = self.out(t, nchw);
        if act == 0 {
            self.emit(op, inputs, vec![out.clone()], attrs);
        } else {
            let mid = self.fresh("pre_act");
            self.emit(op, inputs, vec![mid.clone()], attrs);
            self.activation(mid, out.clone(), act)?;
        }
        self.set(t, out, nchw);
        Ok(())
    }

    fn activation(&mut self, x: String, out: String, act: i8) -> Result<()> {
        match act {
            0 => self.emit("Identity", vec![x], vec![out], vec![]),
            1 => self.emit("Relu", vec![x], vec![out], vec![]),
            2 => self.clip(x, out, -1.0, 1.0),
            3 => self.clip(x, out, 0.0, 6.0),
            4 => self.emit("Tanh", vec![x], vec![out], vec![]),
            5 => return Err(self.err("fused activation SIGN_BIT is not supported")),
            a => return Err(self.err(format!("unknown fused activation {a}"))),
        }
        Ok(())
    }

    fn clip(&mut self, x: String, out: String, lo: f32, hi: f32) {
        let lo = self.init_f32(lo);
        let hi = self.init_f32(hi);
        self.emit("Clip", vec![x, lo, hi], vec![out], vec![]);
    }

    fn input(&self, op: &OpInfo, k: usize) -> Result<usize> {
        op.inputs.get(k).copied().flatten().ok_or_else(|| self.err(format!("input {k} is missing")))
    }

    fn output(&self, op: &OpInfo, k: usize) -> Result<usize> {
        op.outputs.get(k).copied().ok_or_else(|| self.err(format!("output {k} is missing")))
    }

    fn need_const(&self, t: usize, what: &str) -> Result<Const> {
        self.konst(t)
            .cloned()
            .ok_or_else(|| self.err(format!("{what} ('{}') is computed at run time; rbln-compile needs it to be a constant", self.tensors[t].name)))
    }

    fn need_rank(&self, t: usize, rank: usize, what: &str) -> Result<()> {
        let r = self.tensors[t].rank();
        if r != rank {
            return Err(self.err(format!("{what} ('{}') has rank {r}; {rank} expected", self.tensors[t].name)));
        }
        Ok(())
    }

    fn need_dims(&self, t: usize) -> Result<Vec<i64>> {
        let s = &self.tensors[t].shape;
        if s.iter().any(|&d| d < 0) {
            return Err(self.err(format!("tensor '{}' has a dynamic shape {s:?}; static shapes are needed", self.tensors[t].name)));
        }
        Ok(s.clone())
    }

    /// Normalise an axis for a rank.
    fn axis(&self, a: i64, rank: usize) -> Result<usize> {
        let r = rank as i64;
        let v = if a < 0 { a + r } else { a };
        if !(0..r.max(1)).contains(&v) {
            return Err(self.err(format!("axis {a} is out of range for rank {rank}")));
        }
        Ok(v as usize)
    }

    /// Lower one operator.
    pub fn lower_op(&mut self, op: &OpInfo) -> Result<()> {
        let opts = op.opts;
        let first = op.outputs[0];
        self.cur = (op.index, self.tensors[first].name.clone(), op.name.clone());
        self.base = self.tensors[first].uname.clone();
        self.op_options = Some(opts);
        for &t in op.inputs.iter().flatten().chain(&op.outputs) {
            let info = &self.tensors[t];
            let carried = match &info.q {
                Some(_) if info.konst.is_some() => true,
                Some(q) => q.scale.len() == 1 && matches!(info.ty, ty::INT8 | ty::UINT8),
                None => false,
            };
            if info.quantized && !carried && !(op.code == 6 && info.konst.is_some()) {
                let how = if info.q.as_ref().is_some_and(|q| q.scale.len() > 1) { "quantized per channel at run time" } else { "quantized" };
                return Err(self.err(format!("tensor '{}' is {} ({how}): {QUANTIZED}", info.name, ty::name(info.ty))));
            }
        }
        match op.code {
            // Element-wise binary.
            0 => self.binary(op, "Add"),
            41 => self.binary(op, "Sub"),
            18 => self.binary(op, "Mul"),
            42 => self.binary(op, "Div"),
            55 => self.binary(op, "Max"),
            57 => self.binary(op, "Min"),
            78 => self.binary(op, "Pow"),
            99 => self.squared_difference(op),
            54 => self.binary(op, "PRelu"),
            // Element-wise unary.
            19 => self.unary(op, "Relu", vec![]),
            21 => self.unary_clip(op, 0.0, 6.0),
            20 => self.unary_clip(op, -1.0, 1.0),
            152 => self.unary_clip(op, 0.0, 1.0),
            14 => self.unary(op, "Sigmoid", vec![]),
            28 => self.unary(op, "Tanh", vec![]),
            47 => self.unary(op, "Exp", vec![]),
            73 => self.unary(op, "Log", vec![]),
            75 => self.unary(op, "Sqrt", vec![]),
            76 => self.rsqrt(op),
            101 => self.unary(op, "Abs", vec![]),
            59 => self.unary(op, "Neg", vec![]),
            92 => self.square(op),
            117 => self.unary(op, "HardSwish", vec![]),
            98 => {
                let alpha = opts.float;
                self.unary(op, "LeakyRelu", vec![attr_f("alpha", alpha)])
            }
            53 => self.cast(op),
            6 => self.dequantize(op),
            // Convolutions and pools.
            3 => self.conv(op, false),
            4 => self.conv(op, true),
            67 => self.transpose_conv(op),
            1 => self.pool(op, "AveragePool"),
            17 => self.pool(op, "MaxPool"),
            9 => self.fully_connected(op),
            126 => self.batch_matmul(op),
            // Reductions and normalisation.
            40 => self.reduce(op, "ReduceMean"),
            74 => self.reduce(op, "ReduceSum"),
            82 => self.reduce(op, "ReduceMax"),
            89 => self.reduce(op, "ReduceMin"),
            25 => self.softmax(op),
            // Layout.
            2 => self.concat(op),
            34 | 60 => self.pad(op),
            22 | 43 | 70 => self.reshape(op),
            39 => self.transpose(op),
            45 => self.strided_slice(op),
            65 => self.slice(op),
            36 => self.gather(op),
            49 | 102 => self.split(op),
            83 => self.pack(op),
            88 => self.unpack(op),
            69 => self.tile(op),
            77 => self.shape(op),
            23 | 97 => self.resize(op),
            31 | 118 | 119 | 129 => Err(self.err("control flow (it calls another subgraph); rbln-compile reads only the main subgraph")),
            114 => self.quantize(op),
            32 => Err(self.err("custom operators are not supported")),
            _ => Err(self.err(format!("operator {} is not supported by rbln-compile (supported: {})", op.name, SUPPORTED.join(", ")))),
        }
    }

    // ---- element-wise ------------------------------------------------

    /// An operand of an op computing in NCHW when `nchw`: 4-D tensors in
    /// NCHW form, lower-rank ones (broadcasting over NHWC's trailing axes)
    /// padded to rank 4 and transposed alike.
    fn operand(&mut self, t: usize, nchw: bool) -> Result<String> {
        let rank = self.tensors[t].rank();
        if !nchw || rank == 4 {
            return self.form(t, nchw);
        }
        if rank > 4 {
            return Err(self.err(format!("operand '{}' of rank {rank} broadcasts against a 4-D tensor", self.tensors[t].name)));
        }
        let mut dims4 = vec![1i64; 4 - rank];
        dims4.extend(self.need_dims(t)?);
        if let Some(c) = self.konst(t).cloned() {
            let c4 = Const { shape: dims4.iter().map(|&d| d as u64).collect(), data: c.data };
            let c4 = permute_const(&c4, &TO_NCHW);
            let name = format!("{}#b4nchw", self.tensors[t].uname);
            // Axis i of the rank-4 form is axis i − (4 − rank) of t.
            let axes: Vec<Option<usize>> = TO_NCHW.iter().map(|&p| p.checked_sub(4 - rank)).collect();
            return self.const_form(t, name, &c4, &axes);
        }
        let plain = self.form(t, false)?;
        let shape = self.init_ints(&dims4);
        let r4 = self.fresh("rank4");
        self.emit("Reshape", vec![plain, shape], vec![r4.clone()], vec![]);
        let out = self.fresh("rank4nchw");
        self.emit("Transpose", vec![r4], vec![out.clone()], vec![attr_ints("perm", vec![0, 3, 1, 2])]);
        Ok(out)
    }

    /// Compute an element-wise op in NCHW when its output is 4-D and a
    /// run-time operand is held in NCHW.
    fn pick_nchw(&self, ins: &[usize], out: usize) -> bool {
        self.tensors[out].rank() == 4 && ins.iter().any(|&t| self.tensors[t].rank() == 4 && self.is_nchw(t))
    }

    fn binary(&mut self, op: &OpInfo, onnx: &str) -> Result<()> {
        let (a, b, o) = (self.input(op, 0)?, self.input(op, 1)?, self.output(op, 0)?);
        let nchw = self.pick_nchw(&[a, b], o);
        let x = self.operand(a, nchw)?;
        let y = self.operand(b, nchw)?;
        let act = self.opts().activation;
        self.emit_act(onnx, vec![x, y], o, nchw, vec![], act)
    }

    fn squared_difference(&mut self, op: &OpInfo) -> Result<()> {
        let (a, b, o) = (self.input(op, 0)?, self.input(op, 1)?, self.output(op, 0)?);
        let nchw = self.pick_nchw(&[a, b], o);
        let x = self.operand(a, nchw)?;
        let y = self.operand(b, nchw)?;
        let d = self.fresh("diff");
        self.emit("Sub", vec![x, y], vec![d.clone()], vec![]);
        self.emit_act("Mul", vec![d.clone(), d], o, nchw, vec![], 0)
    }

    fn unary(&mut self, op: &OpInfo, onnx: &str, attrs: Vec<AttributeProto>) -> Result<()> {
        let (a, o) = (self.input(op, 0)?, self.output(op, 0)?);
        let nchw = self.is_nchw(a) && self.tensors[o].rank() == 4;
        let x = self.form(a, nchw)?;
        self.emit_act(onnx, vec![x], o, nchw, attrs, 0)
    }

    fn unary_clip(&mut self, op: &OpInfo, lo: f32, hi: f32) -> Result<()> {
        let (a, o) = (self.input(op, 0)?, self.output(op, 0)?);
        let nchw = self.is_nchw(a) && self.tensors[o].rank() == 4;
        let x = self.form(a, nchw)?;
        let out = self.out(o, nchw);
        self.clip(x, out.clone(), lo, hi);
        self.set(o, out, nchw);
        Ok(())
    }

    fn rsqrt(&mut self, op: &OpInfo) -> Result<()> {
        let (a, o) = (self.input(op, 0)?, self.output(op, 0)?);
        let nchw = self.is_nchw(a) && self.tensors[o].rank() == 4;
        let x = self.form(a, nchw)?;
        let s = self.fresh("sqrt");
        self.emit("Sqrt", vec![x], vec![s.clone()], vec![]);
        self.emit_act("Reciprocal", vec![s], o, nchw, vec![], 0)
    }

    fn square(&mut self, op: &OpInfo) -> Result<()> {
        let (a, o) = (self.input(op, 0)?, self.output(op, 0)?);
        let nchw = self.is_nchw(a) && self.tensors[o].rank() == 4;
        let x = self.form(a, nchw)?;
        self.emit_act("Mul", vec![x.clone(), x], o, nchw, vec![], 0)
    }

    fn cast(&mut self, op: &OpInfo) -> Result<()> {
        let (a, o) = (self.input(op, 0)?, self.output(op, 0)?);
        let to = self.elem_of(o)?;
        let nchw = self.is_nchw(a) && self.tensors[o].rank() == 4;
        let x = self.form(a, nchw)?;
        self.emit_act("Cast", vec![x], o, nchw, vec![attr_i("to", i64::from(to))], 0)
    }

    /// DEQUANTIZE: of a float16 constant (weights stored as fp16) or a
    /// quantised constant, folded; of a quantised run-time tensor, its
    /// float form.
    fn dequantize(&mut self, op: &OpInfo) -> Result<()> {
        let (a, o) = (self.input(op, 0)?, self.output(op, 0)?);
        let info = &self.tensors[a];
        match (&info.konst, info.ty, &info.q) {
            (Some(c), ty::FLOAT16, _) => {
                let c = c.clone();
                self.tensors[o].konst = Some(c);
                Ok(())
            }
            (Some(c), _, Some(q)) => {
                let c = dequantized(c, q);
                self.tensors[o].konst = Some(c);
                Ok(())
            }
            (None, _, Some(_)) if self.tensors[o].q.is_none() => self.unary(op, "Identity", vec![]),
            (Some(_), t, _) => Err(self.err(format!("DEQUANTIZE of a {} constant without quantisation parameters", ty::name(t)))),
            (None, t, _) => Err(self.err(format!("DEQUANTIZE of a run-time {} tensor without quantisation parameters into a float one", ty::name(t)))),
        }
    }

    /// QUANTIZE: a float tensor quantised, or a quantised one requantised
    /// (its float form through the output's QuantizeLinear).
    fn quantize(&mut self, op: &OpInfo) -> Result<()> {
        let o = self.output(op, 0)?;
        if !self.quantized_run_time(o) {
            return Err(self.err(format!("QUANTIZE into '{}' without quantisation parameters: {QUANTIZED}", self.tensors[o].name)));
        }
        self.unary(op, "Identity", vec![])
    }

    // ---- convolutions and pools -------------------------------------

    fn spatial(&self, input: usize) -> Result<(i64, i64)> {
        self.need_rank(input, 4, "the input")?;
        let d = self.need_dims(input)?;
        Ok((d[1], d[2]))
    }

    fn strides(&self) -> Result<(i64, i64)> {
        let o = self.opts();
        if o.stride_h < 1 || o.stride_w < 1 {
            return Err(self.err(format!("strides ({}, {}) must be positive", o.stride_h, o.stride_w)));
        }
        Ok((i64::from(o.stride_h), i64::from(o.stride_w)))
    }

    fn pads(&self, (h, w): (i64, i64), (kh, kw): (i64, i64), (sh, sw): (i64, i64), (dh, dw): (i64, i64)) -> Result<Vec<i64>> {
        match self.opts().padding {
            0 => {
                let (t, b) = same_pads(h, kh, sh, dh);
                let (l, r) = same_pads(w, kw, sw, dw);
                Ok(vec![t, l, b, r])
            }
            1 => Ok(vec![0, 0, 0, 0]),
            p => Err(self.err(format!("unknown padding {p}"))),
        }
    }

    fn conv(&mut self, op: &OpInfo, depthwise: bool) -> Result<()> {
        let (x, w, o) = (self.input(op, 0)?, self.input(op, 1)?, self.output(op, 0)?);
        let hw = self.spatial(x)?;
        self.need_rank(w, 4, "the filter")?;
        let wc = self.need_const(w, "the filter")?;
        let cin = self.need_dims(x)?[3];
        let fd: Vec<i64> = wc.shape.iter().map(|&d| d as i64).collect();
        let opts = self.opts();
        if opts.dilation_h < 1 || opts.dilation_w < 1 {
            return Err(self.err(format!("dilations ({}, {}) must be positive", opts.dilation_h, opts.dilation_w)));
        }
        let s = self.strides()?;
        let d = (i64::from(opts.dilation_h), i64::from(opts.dilation_w));
        let pads = self.pads(hw, (fd[1], fd[2]), s, d)?;
        let (perm, group) = if depthwise {
            if fd[0] != 1 || cin <= 0 || fd[3] % cin != 0 {
                return Err(self.err(format!("depthwise filter {fd:?} does not fit {cin} input channels")));
            }
            ([3, 0, 1, 2], cin)
        } else {
            if fd[3] <= 0 || cin % fd[3] != 0 {
                return Err(self.err(format!("filter {fd:?} has {} input channels; the input has {cin}", fd[3])));
            }
            (TO_NCHW, cin / fd[3])
        };
        let xin = self.form(x, true)?;
        let wname = format!("{}#oihw", self.tensors[w].uname);
        let wname = self.const_form(w, wname, &permute_const(&wc, &perm), &perm.map(Some))?;
        let mut ins = vec![xin, wname];
        if let Some(b) = op.inputs.get(2).copied().flatten() {
            ins.push(self.form(b, false)?);
        }
        let attrs = vec![
            attr_ints("strides", vec![s.0, s.1]),
            attr_ints("dilations", vec![d.0, d.1]),
            attr_ints("pads", pads),
            attr_i("group", group),
            attr_ints("kernel_shape", vec![fd[1], fd[2]]),
        ];
        self.emit_act("Conv", ins, o, true, attrs, opts.activation)
    }

    fn transpose_conv(&mut self, op: &OpInfo) -> Result<()> {
        // Inputs: output_shape, weights [O, KH, KW, I], input, bias.
        let (w, x, o) = (self.input(op, 1)?, self.input(op, 2)?, self.output(op, 0)?);
        let (h, wd) = self.spatial(x)?;
        self.need_rank(w, 4, "the filter")?;
        self.need_rank(o, 4, "the output")?;
        let wc = self.need_const(w, "the filter")?;
        let fd: Vec<i64> = wc.shape.iter().map(|&d| d as i64).collect();
        let od = self.need_dims(o)?;
        let (sh, sw) = self.strides()?;
        let mut pads = vec![0; 4];
        let mut out_pad = vec![0; 2];
        for (i, (inp, k, s, out)) in [(h, fd[1], sh, od[1]), (wd, fd[2], sw, od[2])].into_iter().enumerate() {
            let full = (inp - 1).saturating_mul(s).saturating_add(k);
            let total = match self.opts().padding {
                0 => (full - out).max(0),
                1 => 0,
                p => return Err(self.err(format!("unknown padding {p}"))),
            };
            let extra = out - (full - total);
            if !(0..s).contains(&extra) {
                return Err(self.err(format!("output size {out} does not follow from input {inp}, kernel {k} and stride {s}")));
            }
            pads[i] = total / 2;
            pads[i + 2] = total - total / 2;
            out_pad[i] = extra;
        }
        let perm = [3, 0, 1, 2];
        let xin = self.form(x, true)?;
        let wname = format!("{}#iohw", self.tensors[w].uname);
        let wname = self.const_form(w, wname, &permute_const(&wc, &perm), &perm.map(Some))?;
        let mut ins = vec![xin, wname];
        if let Some(b) = op.inputs.get(3).copied().flatten() {
            ins.push(self.form(b, false)?);
        }
        let attrs = vec![
            attr_ints("strides", vec![sh, sw]),
            attr_ints("pads", pads),
            attr_ints("output_padding", out_pad),
            attr_ints("kernel_shape", vec![fd[1], fd[2]]),
        ];
        let act = self.opts().activation;
        self.emit_act("ConvTranspose", ins, o, true, attrs, act)
    }

    fn pool(&mut self, op: &OpInfo, onnx: &str) -> Result<()> {
        let (x, o) = (self.input(op, 0)?, self.output(op, 0)?);
        let hw = self.spatial(x)?;
        let opts = self.opts();
        if opts.filter_h < 1 || opts.filter_w < 1 {
            return Err(self.err(format!("filter size ({}, {}) must be positive", opts.filter_h, opts.filter_w)));
        }
        let k = (i64::from(opts.filter_h), i64::from(opts.filter_w));
        let s = self.strides()?;
        let pads = self.pads(hw, k, s, (1, 1))?;
        let xin = self.form(x, true)?;
        let mut attrs = vec![attr_ints("kernel_shape", vec![k.0, k.1]), attr_ints("strides", vec![s.0, s.1]), attr_ints("pads", pads)];
        if onnx == "AveragePool" {
            attrs.push(attr_i("count_include_pad", 0));
        }
        self.emit_act(onnx, vec![xin], o, true, attrs, opts.activation)
    }

    fn fully_connected(&mut self, op: &OpInfo) -> Result<()> {
        let (x, w, o) = (self.input(op, 0)?, self.input(op, 1)?, self.output(op, 0)?);
        let opts = self.opts();
        if opts.weights_format != 0 {
            return Err(self.err("shuffled (int8) weights are not supported"));
        }
        self.need_rank(w, 2, "the weights")?;
        let wd = self.need_dims(w)?;
        let xd = self.need_dims(x)?;
        let od = self.need_dims(o)?;
        let k = wd[1];
        let total = xd.iter().try_fold(1i64, |a, &d| a.checked_mul(d)).ok_or_else(|| self.err(format!("input {xd:?} is too large")))?;
        if k <= 0 || total % k != 0 {
            return Err(self.err(format!("input {xd:?} does not split into rows of {k}")));
        }
        let mut xin = self.form(x, false)?;
        let keep = opts.keep_num_dims && xd.len() > 2;
        if !keep && xd.len() != 2 {
            let shape = self.init_ints(&[total / k, k]);
            let r = self.fresh("rows");
            self.emit("Reshape", vec![xin, shape], vec![r.clone()], vec![]);
            xin = r;
        }
        let win = self.form(w, false)?;
        let bias = op.inputs.get(2).copied().flatten();
        let act = opts.activation;
        let rows_out = if keep { xd.len() } else { 2 };
        let needs_reshape = od.len() != rows_out;
        let result = if needs_reshape { self.fresh("fc") } else { self.out(o, false) };
        let mid = if act != 0 { self.fresh("pre_act") } else { result.clone() };
        if !keep {
            let mut ins = vec![xin, win];
            if let Some(b) = bias {
                ins.push(self.form(b, false)?);
            }
            self.emit("Gemm", ins, vec![mid.clone()], vec![attr_i("transB", 1)]);
        } else {
            let wt = self.fresh("wT");
            self.emit("Transpose", vec![win], vec![wt.clone()], vec![attr_ints("perm", vec![1, 0])]);
            if let Some(b) = bias {
                let mm = self.fresh("mm");
                self.emit("MatMul", vec![xin, wt], vec![mm.clone()], vec![]);
                let bn = self.form(b, false)?;
                self.emit("Add", vec![mm, bn], vec![mid.clone()], vec![]);
            } else {
                self.emit("MatMul", vec![xin, wt], vec![mid.clone()], vec![]);
            }
        }
        if act != 0 {
            self.activation(mid, result.clone(), act)?;
        }
        let out = self.out(o, false);
        if needs_reshape {
            let shape = self.init_ints(&od);
            self.emit("Reshape", vec![result, shape], vec![out.clone()], vec![]);
        }
        self.set(o, out, false);
        Ok(())
    }

    fn batch_matmul(&mut self, op: &OpInfo) -> Result<()> {
        let (a, b, o) = (self.input(op, 0)?, self.input(op, 1)?, self.output(op, 0)?);
        let opts = self.opts();
        let mut ins = Vec::new();
        for (t, adj) in [(a, opts.adj_x), (b, opts.adj_y)] {
            let v = self.form(t, false)?;
            let r = self.tensors[t].rank();
            if adj {
                if r < 2 {
                    return Err(self.err(format!("adjoint of a rank-{r} operand")));
                }
                let mut perm: Vec<i64> = (0..r as i64).collect();
                perm.swap(r - 2, r - 1);
                let tv = self.fresh("adj");
                self.emit("Transpose", vec![v], vec![tv.clone()], vec![attr_ints("perm", perm)]);
                ins.push(tv);
            } else {
                ins.push(v);
            }
        }
        self.emit_act("MatMul", ins, o, false, vec![], 0)
    }

    // ---- reductions ---------------------------------------------------

    fn const_axes(&self, t: usize, rank: usize) -> Result<Vec<usize>> {
        let c = self.need_const(t, "the axes")?;
        let mut axes = Vec::new();
        for a in c.ints() {
            let a = self.axis(a, rank)?;
            if !axes.contains(&a) {
                axes.push(a);
            }
        }
        axes.sort_unstable();
        Ok(axes)
    }

    fn reduce(&mut self, op: &OpInfo, onnx: &str) -> Result<()> {
        let (x, ax, o) = (self.input(op, 0)?, self.input(op, 1)?, self.output(op, 0)?);
        let rank = self.tensors[x].rank();
        let axes = self.const_axes(ax, rank)?;
        let keep = self.opts().keep_dims;
        if axes.is_empty() {
            return self.reshape_to_declared(x, o);
        }
        // NCHW stays valid when the kept axes keep their relative order.
        let nchw = rank == 4 && self.is_nchw(x) && {
            let kept = |a: usize| !axes.contains(&a);
            keep || !(kept(3) && (kept(1) || kept(2)))
        };
        let axes: Vec<i64> = if nchw { axes.iter().map(|&a| NHWC_TO_NCHW_AXIS[a] as i64).collect() } else { axes.iter().map(|&a| a as i64).collect() };
        let xin = self.form(x, nchw)?;
        let keepdims = attr_i("keepdims", i64::from(keep));
        let out_nchw = nchw && keep;
        if onnx == "ReduceSum" {
            let a = self.init_ints(&axes);
            self.emit_act(onnx, vec![xin, a], o, out_nchw, vec![keepdims], 0)
        } else {
            self.emit_act(onnx, vec![xin], o, out_nchw, vec![attr_ints("axes", axes), keepdims], 0)
        }
    }

    fn softmax(&mut self, op: &OpInfo) -> Result<()> {
        let (x, o) = (self.input(op, 0)?, self.output(op, 0)?);
        let rank = self.tensors[x].rank();
        if rank == 0 {
            return Err(self.err("softmax of a scalar"));
        }
        let nchw = rank == 4 && self.is_nchw(x);
        let mut xin = self.form(x, nchw)?;
        let beta = self.opts().float;
        if beta != 1.0 {
            let b = self.init_f32(beta);
            let s = self.fresh("beta");
            self.emit("Mul", vec![xin, b], vec![s.clone()], vec![]);
            xin = s;
        }
        let axis = if nchw { 1 } else { rank as i64 - 1 };
        self.emit_act("Softmax", vec![xin], o, nchw, vec![attr_i("axis", axis)], 0)
    }

    // ---- layout -------------------------------------------------------

    fn concat(&mut self, op: &OpInfo) -> Result<()> {
        let o = self.output(op, 0)?;
        let ins: Vec<usize> = op.inputs.iter().copied().flatten().collect();
        if ins.is_empty() {
            return Err(self.err("no inputs"));
        }
        let rank = self.tensors[o].rank();
        let axis = self.axis(i64::from(self.opts().axis), rank)?;
        let nchw = self.pick_nchw(&ins, o);
        let mut names = Vec::new();
        for &t in &ins {
            if self.tensors[t].rank() != rank {
                return Err(self.err(format!("input '{}' has rank {}, the output {rank}", self.tensors[t].name, self.tensors[t].rank())));
            }
            names.push(self.form(t, nchw)?);
        }
        let axis = if nchw { NHWC_TO_NCHW_AXIS[axis] } else { axis };
        let act = self.opts().activation;
        self.emit_act("Concat", names, o, nchw, vec![attr_i("axis", axis as i64)], act)
    }

    fn pad(&mut self, op: &OpInfo) -> Result<()> {
        let (x, p, o) = (self.input(op, 0)?, self.input(op, 1)?, self.output(op, 0)?);
        let rank = self.tensors[x].rank();
        let pc = self.need_const(p, "the paddings")?;
        let pv = pc.ints();
        if pv.len() != 2 * rank {
            return Err(self.err(format!("paddings have {} values; rank {rank} needs {}", pv.len(), 2 * rank)));
        }
        let nchw = rank == 4 && self.is_nchw(x);
        let src = |j: usize| if nchw { TO_NCHW[j] } else { j };
        let mut pads = vec![0i64; 2 * rank];
        for j in 0..rank {
            pads[j] = pv[2 * src(j)];
            pads[rank + j] = pv[2 * src(j) + 1];
        }
        let xin = self.form(x, nchw)?;
        let pn = self.init_ints(&pads);
        let mut ins = vec![xin, pn];
        if let Some(v) = op.inputs.get(2).copied().flatten() {
            ins.push(self.form(v, false)?);
        }
        self.emit_act("Pad", ins, o, nchw, vec![attr_s("mode", "constant")], 0)
    }

    fn reshape_to_declared(&mut self, x: usize, o: usize) -> Result<()> {
        let od = self.need_dims(o)?;
        let xin = self.form(x, false)?;
        let shape = self.init_ints(&od);
        self.emit_act("Reshape", vec![xin, shape], o, false, vec![], 0)
    }

    /// RESHAPE, SQUEEZE, EXPAND_DIMS: a reshape of the plain form to the
    /// output's declared shape.
    fn reshape(&mut self, op: &OpInfo) -> Result<()> {
        let (x, o) = (self.input(op, 0)?, self.output(op, 0)?);
        self.reshape_to_declared(x, o)
    }

    fn transpose(&mut self, op: &OpInfo) -> Result<()> {
        let (x, p, o) = (self.input(op, 0)?, self.input(op, 1)?, self.output(op, 0)?);
        let rank = self.tensors[x].rank();
        let pc = self.need_const(p, "the permutation")?.ints();
        let mut perm = Vec::with_capacity(rank);
        for &a in &pc {
            perm.push(self.axis(a, rank)?);
        }
        let mut seen = perm.clone();
        seen.sort_unstable();
        if seen != (0..rank).collect::<Vec<_>>() {
            return Err(self.err(format!("{pc:?} is not a permutation of rank {rank}")));
        }
        let nchw = rank == 4 && self.is_nchw(x);
        // From the NCHW form: plain axis a is NCHW axis NHWC_TO_NCHW_AXIS[a].
        let perm: Vec<i64> = perm.iter().map(|&a| if nchw { NHWC_TO_NCHW_AXIS[a] as i64 } else { a as i64 }).collect();
        let xin = self.form(x, nchw)?;
        self.emit_act("Transpose", vec![xin], o, false, vec![attr_ints("perm", perm)], 0)
    }

    /// One ONNX Slice of `x` (axes in TFLite's plain numbering), on the
    /// NCHW form when `x` is held so; returns the value and its form.
    fn slice_axes(&mut self, x: usize, starts: Vec<i64>, ends: Vec<i64>, axes: Vec<usize>, steps: Vec<i64>) -> Result<(String, bool)> {
        let nchw = self.tensors[x].rank() == 4 && self.is_nchw(x);
        let axes: Vec<i64> = axes.iter().map(|&a| if nchw { NHWC_TO_NCHW_AXIS[a] as i64 } else { a as i64 }).collect();
        let xin = self.form(x, nchw)?;
        let s = self.init_ints(&starts);
        let e = self.init_ints(&ends);
        let a = self.init_ints(&axes);
        let st = self.init_ints(&steps);
        let out = self.fresh("slice");
        self.emit("Slice", vec![xin, s, e, a, st], vec![out.clone()], vec![]);
        Ok((out, nchw))
    }

    /// Bind a sliced value to the output: directly when the ranks agree,
    /// else (shrunk axes) through the plain form and a reshape.
    fn bind_sliced(&mut self, v: String, nchw: bool, o: usize, rank_in: usize) -> Result<()> {
        let od = self.need_dims(o)?;
        if od.len() == rank_in {
            let out = self.out(o, nchw);
            self.emit("Identity", vec![v], vec![out.clone()], vec![]);
            self.set(o, out, nchw);
            return Ok(());
        }
        let plain = if nchw {
            let p = self.fresh("plain");
            self.emit("Transpose", vec![v], vec![p.clone()], vec![attr_ints("perm", vec![0, 2, 3, 1])]);
            p
        } else {
            v
        };
        let shape = self.init_ints(&od);
        let out = self.out(o, false);
        self.emit("Reshape", vec![plain, shape], vec![out.clone()], vec![]);
        self.set(o, out, false);
        Ok(())
    }

    fn strided_slice(&mut self, op: &OpInfo) -> Result<()> {
        let (x, b, e, s, o) = (self.input(op, 0)?, self.input(op, 1)?, self.input(op, 2)?, self.input(op, 3)?, self.output(op, 0)?);
        let opts = self.opts();
        if opts.ellipsis_mask != 0 || opts.new_axis_mask != 0 {
            return Err(self.err("ellipsis and new-axis masks are not supported"));
        }
        if opts.slice_offset {
            return Err(self.err("offset mode (end relative to begin) is not supported"));
        }
        let dims = self.need_dims(x)?;
        let rank = dims.len();
        let (bv, ev, sv) =
            (self.need_const(b, "begin")?.ints(), self.need_const(e, "end")?.ints(), self.need_const(s, "strides")?.ints());
        if bv.len() > rank || ev.len() != bv.len() || sv.len() != bv.len() {
            return Err(self.err(format!("begin/end/strides of lengths {}/{}/{} for rank {rank}", bv.len(), ev.len(), sv.len())));
        }
        let (mut starts, mut ends, mut axes, mut steps) = (vec![], vec![], vec![], vec![]);
        for i in 0..bv.len() {
            let bit = |m: i32| i < 31 && (m >> i) & 1 == 1;
            let st = sv[i];
            if st <= 0 {
                return Err(self.err(format!("stride {st} on axis {i}: only positive strides are supported")));
            }
            if bit(opts.shrink_axis_mask) {
                let mut p = bv[i];
                if p < 0 {
                    p += dims[i];
                }
                if !(0..dims[i]).contains(&p) {
                    return Err(self.err(format!("index {} is out of range for axis {i} of size {}", bv[i], dims[i])));
                }
                starts.push(p);
                ends.push(p + 1);
            } else {
                starts.push(if bit(opts.begin_mask) { 0 } else { bv[i] });
                ends.push(if bit(opts.end_mask) { i64::MAX } else { ev[i] });
            }
            axes.push(i);
            steps.push(if bit(opts.shrink_axis_mask) { 1 } else { st });
        }
        let (v, nchw) = self.slice_axes(x, starts, ends, axes, steps)?;
        self.bind_sliced(v, nchw, o, rank)
    }

    fn slice(&mut self, op: &OpInfo) -> Result<()> {
        let (x, b, s, o) = (self.input(op, 0)?, self.input(op, 1)?, self.input(op, 2)?, self.output(op, 0)?);
        let rank = self.tensors[x].rank();
        let (bv, sv) = (self.need_const(b, "begin")?.ints(), self.need_const(s, "size")?.ints());
        if bv.len() != rank || sv.len() != rank {
            return Err(self.err(format!("begin/size of lengths {}/{} for rank {rank}", bv.len(), sv.len())));
        }
        let ends: Vec<i64> = bv.iter().zip(&sv).map(|(&b, &s)| if s < 0 { i64::MAX } else { b.saturating_add(s) }).collect();
        let (v, nchw) = self.slice_axes(x, bv, ends, (0..rank).collect(), vec![1; rank])?;
        self.bind_sliced(v, nchw, o, rank)
    }

    fn gather(&mut self, op: &OpInfo) -> Result<()> {
        let (x, i, o) = (self.input(op, 0)?, self.input(op, 1)?, self.output(op, 0)?);
        let opts = self.opts();
        if opts.batch_dims != 0 {
            return Err(self.err(format!("batch_dims {} is not supported", opts.batch_dims)));
        }
        let rank = self.tensors[x].rank();
        let axis = self.axis(i64::from(opts.axis), rank)?;
        let nchw = rank == 4 && self.is_nchw(x) && self.tensors[i].rank() == 1;
        let xin = self.form(x, nchw)?;
        let idx = self.form(i, false)?;
        let axis = if nchw { NHWC_TO_NCHW_AXIS[axis] } else { axis };
        self.emit_act("Gather", vec![xin, idx], o, nchw, vec![attr_i("axis", axis as i64)], 0)
    }

    fn split(&mut self, op: &OpInfo) -> Result<()> {
        // SPLIT: (axis, input); SPLIT_V: (input, size_splits, axis).
        let v = op.code == 102;
        let (x, ax) = if v { (self.input(op, 0)?, self.input(op, 2)?) } else { (self.input(op, 1)?, self.input(op, 0)?) };
        let dims = self.need_dims(x)?;
        let rank = dims.len();
        let a = self.need_const(ax, "the axis")?.ints();
        let axis = self.axis(*a.first().ok_or_else(|| self.err("empty axis"))?, rank)?;
        let n = op.outputs.len();
        let dim = dims[axis];
        let sizes: Vec<i64> = if v {
            let mut s = self.need_const(self.input(op, 1)?, "size_splits")?.ints();
            if s.len() != n {
                return Err(self.err(format!("{} sizes for {n} outputs", s.len())));
            }
            let known = s.iter().filter(|&&x| x >= 0).fold(0i64, |a, &x| a.saturating_add(x));
            let unknown = s.iter().filter(|&&x| x < 0).count();
            if unknown > 1 {
                return Err(self.err("more than one size is -1"));
            }
            for x in s.iter_mut().filter(|x| **x < 0) {
                *x = dim - known;
            }
            s
        } else {
            if n == 0 || dim % n as i64 != 0 {
                return Err(self.err(format!("axis of size {dim} does not split into {n} outputs")));
            }
            vec![dim / n as i64; n]
        };
        if sizes.iter().any(|&s| s < 0) || sizes.iter().fold(0i64, |a, &x| a.saturating_add(x)) != dim {
            return Err(self.err(format!("sizes {sizes:?} do not add up to {dim}")));
        }
        let nchw = rank == 4 && self.is_nchw(x);
        let xin = self.form(x, nchw)?;
        let sz = self.init_ints(&sizes);
        let outs: Vec<String> = op.outputs.iter().map(|&t| self.out(t, nchw)).collect();
        let axis = if nchw { NHWC_TO_NCHW_AXIS[axis] } else { axis };
        self.emit("Split", vec![xin, sz], outs.clone(), vec![attr_i("axis", axis as i64)]);
        for (&t, name) in op.outputs.iter().zip(outs) {
            self.set(t, name, nchw);
        }
        Ok(())
    }

    fn pack(&mut self, op: &OpInfo) -> Result<()> {
        let o = self.output(op, 0)?;
        let ins: Vec<usize> = op.inputs.iter().copied().flatten().collect();
        let od = self.need_dims(o)?;
        let rank = od.len();
        let axis = self.axis(i64::from(self.opts().axis), rank)?;
        if ins.is_empty() {
            return Err(self.err("no inputs"));
        }
        // Each input with a size-1 axis inserted, then one Concat. Packing
        // 3-D tensors along the last axis of a 4-D output is a channel
        // concat in NCHW (the unit-axis transposes are views).
        let nchw = rank == 4 && axis == 3;
        let mut unit = od.clone();
        unit[axis] = 1;
        let mut names = Vec::new();
        for &t in &ins {
            let xin = self.form(t, false)?;
            let shape = self.init_ints(&unit);
            let u = self.fresh("unsq");
            self.emit("Reshape", vec![xin, shape], vec![u.clone()], vec![]);
            if nchw {
                let n = self.fresh("unsq_nchw");
                self.emit("Transpose", vec![u], vec![n.clone()], vec![attr_ints("perm", vec![0, 3, 1, 2])]);
                names.push(n);
            } else {
                names.push(u);
            }
        }
        let caxis = if nchw { 1 } else { axis as i64 };
        self.emit_act("Concat", names, o, nchw, vec![attr_i("axis", caxis)], 0)
    }

    fn unpack(&mut self, op: &OpInfo) -> Result<()> {
        let x = self.input(op, 0)?;
        let dims = self.need_dims(x)?;
        let rank = dims.len();
        let axis = self.axis(i64::from(self.opts().axis), rank)?;
        let n = op.outputs.len();
        if dims[axis] != n as i64 {
            return Err(self.err(format!("axis {axis} has size {}, {n} outputs", dims[axis])));
        }
        let nchw = rank == 4 && self.is_nchw(x);
        let xin = self.form(x, nchw)?;
        let sz = self.init_ints(&vec![1; n]);
        let pieces: Vec<String> = (0..n).map(|_| self.fresh("piece")).collect();
        let saxis = if nchw { NHWC_TO_NCHW_AXIS[axis] } else { axis };
        self.emit("Split", vec![xin, sz], pieces.clone(), vec![attr_i("axis", saxis as i64)]);
        for (&t, p) in op.outputs.iter().zip(pieces) {
            self.bind_sliced(p, nchw, t, rank)?;
        }
        Ok(())
    }

    fn tile(&mut self, op: &OpInfo) -> Result<()> {
        let (x, m, o) = (self.input(op, 0)?, self.input(op, 1)?, self.output(op, 0)?);
        let rank = self.tensors[x].rank();
        let mv = self.need_const(m, "the multiples")?.ints();
        if mv.len() != rank {
            return Err(self.err(format!("{} multiples for rank {rank}", mv.len())));
        }
        let nchw = rank == 4 && self.is_nchw(x);
        let reps: Vec<i64> = if nchw { TO_NCHW.iter().map(|&j| mv[j]).collect() } else { mv };
        let xin = self.form(x, nchw)?;
        let r = self.init_ints(&reps);
        self.emit_act("Tile", vec![xin, r], o, nchw, vec![], 0)
    }

    /// SHAPE: the input's static shape, a constant.
    fn shape(&mut self, op: &OpInfo) -> Result<()> {
        let (x, o) = (self.input(op, 0)?, self.output(op, 0)?);
        let d = self.need_dims(x)?;
        self.tensors[o].konst = Some(Const::i64(&[d.len() as u64], d));
        Ok(())
    }

    fn resize(&mut self, op: &OpInfo) -> Result<()> {
        let (x, o) = (self.input(op, 0)?, self.output(op, 0)?);
        self.need_rank(x, 4, "the input")?;
        self.need_rank(o, 4, "the output")?;
        let od = self.need_dims(o)?;
        if let Some(sz) = op.inputs.get(1).copied().flatten().and_then(|t| self.konst(t)) {
            let s = sz.ints();
            if s.len() != 2 || s[0] != od[1] || s[1] != od[2] {
                return Err(self.err(format!("size {s:?} disagrees with the output shape {od:?}")));
            }
        }
        let opts = self.opts();
        let bilinear = op.code == 23;
        let (coord, nearest) = match (opts.align_corners, opts.half_pixel_centers, bilinear) {
            (true, true, _) => return Err(self.err("align_corners together with half_pixel_centers is not supported")),
            (false, false, _) => ("asymmetric", "floor"),
            (true, false, true) => ("align_corners", "floor"),
            (false, true, true) => ("half_pixel", "floor"),
            (true, false, false) => ("align_corners", "round_prefer_ceil"),
            (false, true, false) => ("tf_half_pixel_for_nearest", "floor"),
        };
        let xin = self.form(x, true)?;
        let sizes = self.init_ints(&[od[0], od[3], od[1], od[2]]);
        let attrs = vec![
            attr_s("mode", if bilinear { "linear" } else { "nearest" }),
            attr_s("coordinate_transformation_mode", coord),
            attr_s("nearest_mode", nearest),
        ];
        self.emit_act("Resize", vec![xin, String::new(), String::new(), sizes], o, true, attrs, 0)
    }
}

/// The builtin operators the translation handles.
pub const SUPPORTED: &[&str] = &[
    "ABS", "ADD", "AVERAGE_POOL_2D", "BATCH_MATMUL", "CAST", "CONCATENATION", "CONV_2D", "DEPTHWISE_CONV_2D", "DEQUANTIZE (float16 constants)", "DIV",
    "EXP", "EXPAND_DIMS", "FULLY_CONNECTED", "GATHER", "HARD_SWISH", "LEAKY_RELU", "LOG", "LOGISTIC", "MAXIMUM", "MAX_POOL_2D", "MEAN",
    "MINIMUM", "MUL", "NEG", "PACK", "PAD", "PADV2", "POW", "PRELU", "REDUCE_MAX", "REDUCE_MIN", "RELU", "RELU6", "RELU_0_TO_1",
    "RELU_N1_TO_1", "RESHAPE", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "RSQRT", "SHAPE", "SLICE", "SOFTMAX", "SPLIT", "SPLIT_V",
    "SQRT", "SQUARE", "SQUARED_DIFFERENCE", "SQUEEZE", "STRIDED_SLICE", "SUB", "SUM", "TANH", "TILE", "TRANSPOSE", "TRANSPOSE_CONV",
    "UNPACK",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_padding_follows_tensorflow() {
        // 224, k3, s2: out 112, total pad 1, the extra pixel at the end.
        assert_eq!(same_pads(224, 3, 2, 1), (0, 1));
        assert_eq!(same_pads(7, 3, 1, 1), (1, 1));
        assert_eq!(same_pads(32, 3, 1, 18), (18, 18));
        assert_eq!(same_pads(5, 1, 2, 1), (0, 0));
        assert_eq!(same_pads(4, 2, 2, 1), (0, 0));
    }

    #[test]
    fn permute_moves_axes() {
        // [1, 2, 2, 3] NHWC -> NCHW
        let v: Vec<u32> = (0..12).collect();
        let (p, s) = permute(&v, &[1, 2, 2, 3], &TO_NCHW);
        assert_eq!(s, [1, 3, 2, 2]);
        assert_eq!(p, [0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11]);
        let (back, s2) = permute(&p, &s, &TO_NHWC);
        assert_eq!((back, s2), (v, vec![1, 2, 2, 3]));
        for a in 0..4 {
            assert_eq!(TO_NCHW[NHWC_TO_NCHW_AXIS[a]], a);
        }
    }

    #[test]
    fn quantised_constants_dequantise_per_tensor_and_per_axis() {
        // [2, 3] int8, per channel along axis 1: scale[c]·(q − zero[c]).
        let c = Const { shape: vec![2, 3], data: Data::I(vec![1, 2, 3, -4, 5, -6]) };
        let q = QParams { scale: vec![1.0, 0.5, 0.25], zero: vec![0, 1, 2], dim: 1 };
        assert_eq!(dequantized(&c, &q).floats(), [1.0, 0.5, 0.25, -4.0, 2.0, -2.0]);
        // Along axis 0, and per tensor.
        let q = QParams { scale: vec![2.0, 3.0], zero: vec![1, -1], dim: 0 };
        assert_eq!(dequantized(&c, &q).floats(), [0.0, 2.0, 4.0, -9.0, 18.0, -15.0]);
        let q = QParams { scale: vec![0.5], zero: vec![1], dim: 0 };
        assert_eq!(dequantized(&c, &q).floats(), [0.0, 0.5, 1.0, -2.5, 2.0, -3.5]);
    }
}
