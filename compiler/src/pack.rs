//! Weight layouts for the compute cores, chosen at compile time.
//!
//! A GEMM whose B operand is a constant (a MatMul's or Gemm's weights)
//! gets B rewritten once into the panel layout the cores' GEMM engine
//! streams (`rbln_hw::ops::pack_gemm_b`, flag `GEMM_B_PACKED`): the runtime
//! uploads it with the other weights and no inference repacks it. B is
//! left as stored where the padding of the last panel would grow it by
//! more than a quarter (few columns, e.g. an `[k × 1]` projection).
//!
//! A 3×3 stride-1 convolution with enough output tiles and channels
//! ([`winograd_pays`]) gets its filters transformed once into Winograd
//! F(2×2, 3×3)'s domain (`rbln_hw::ops::winograd_weights`, flag
//! `CONV_WINOGRAD`): the device then computes it with 2.25× fewer
//! multiply-adds.

use std::collections::HashMap;

use rbln_hw::ops::{gemm_packed_b_len, pack_gemm_b, winograd_weights, winograd_weights_len, GEMM_PANEL};

use crate::ir::{Const, Data, Graph, Kind, ValueId};

/// What [`run`] decided for one op (for `rbln-compile --list`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The op's name (its ONNX node).
    pub op: String,
    pub kind: LayoutKind,
    pub note: String,
}

/// The weight layouts [`run`] chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutKind {
    /// A GEMM's constant B in panels (`GEMM_B_PACKED`).
    GemmPanels,
    /// A convolution's filters in Winograd's domain (`CONV_WINOGRAD`).
    Winograd,
}

/// How many of `layouts` are of `kind`.
pub fn count(layouts: &[Layout], kind: LayoutKind) -> usize {
    layouts.iter().filter(|l| l.kind == kind).count()
}

/// Packs the constant B operands of the graph's GEMMs and transforms the
/// filters of the convolutions Winograd's algorithm suits; returns the
/// decisions, one per op. A constant read by several ops in the same way
/// is rewritten once.
pub fn run(g: &mut Graph) -> Vec<Layout> {
    let mut layouts = gemm_panels(g);
    layouts.extend(winograd_filters(g));
    layouts
}

/// Whether a 3×3 stride-1 undilated single-group convolution producing
/// `oh × ow` maps of `c_out` channels from `c_in` runs faster on
/// F(2×2, 3×3) than directly: enough 2×2 output tiles for the GEMMs'
/// width and for the transformed filters (16/9 of the direct weights'
/// bytes, read from memory once per inference) to be reused. Measured on
/// a 2-core AVX-512 host (device time per op, ResNet-18 and ResNet-50 in
/// the guest, medians of paired profiles, Winograd/direct): 56×56 maps
/// 0.56-0.70, 28×28 0.63-0.79; 14×14 (49 tiles) 0.96-1.24 in the models
/// although 0.86 warm in kernels_bench: not taken. Nor are narrow convs
/// (16→16 @16 in kernels_bench: 1.8, per-task costs dominate).
pub fn winograd_pays(c_in: u64, c_out: u64, oh: u64, ow: u64) -> bool {
    let tiles = oh.div_ceil(2) * ow.div_ceil(2);
    c_in >= 16 && c_out >= 16 && tiles >= 100
}

/// The convolutions' filters in Winograd's domain where [`winograd_pays`].
fn winograd_filters(g: &mut Graph) -> Vec<Layout> {
    let mut layouts = Vec::new();
    let mut done: HashMap<ValueId, ValueId> = HashMap::new();
    for i in 0..g.ops.len() {
        let Kind::Conv { w, dims, stride, dilation, winograd: false, .. } = g.ops[i].kind else {
            continue;
        };
        let [_, c_in, _, _, c_out, kh, kw, groups] = dims;
        if (kh, kw, stride, dilation, groups) != (3, 3, [1, 1], [1, 1], 1) {
            continue;
        }
        let &[_, _, oh, ow] = g.values[g.ops[i].out].shape.as_slice() else {
            continue;
        };
        if !winograd_pays(c_in, c_out, oh, ow) {
            continue;
        }
        let Some(len) = winograd_weights_len(c_out, c_in) else {
            continue;
        };
        let u = match done.get(&w) {
            Some(&u) => u,
            None => {
                let Some(Const { data: Data::F(data), .. }) = g.konst(w) else {
                    continue;
                };
                let (co, ci) = (c_out as usize, c_in as usize);
                if data.len() != 9 * co * ci {
                    continue;
                }
                let mut out = vec![0.0f32; len as usize];
                winograd_weights(data, co, ci, &mut out);
                let name = format!("{}.winograd", g.values[w].name);
                let u = g.add_value(&name, vec![len], Some(Const::f32(&[len], out)));
                done.insert(w, u);
                u
            }
        };
        if let Kind::Conv { w, winograd, .. } = &mut g.ops[i].kind {
            *w = u;
            *winograd = true;
        }
        layouts.push(Layout {
            op: g.ops[i].name.clone(),
            kind: LayoutKind::Winograd,
            note: format!("Winograd F(2x2,3x3): {c_out}x{c_in} filters as 16 transformed matrices ({oh}x{ow} outputs)"),
        });
    }
    layouts
}

/// The GEMMs' constant B operands in panels.
fn gemm_panels(g: &mut Graph) -> Vec<Layout> {
    let mut layouts = Vec::new();
    // (B, k, n, trans_b, matrices, stride) -> packed value.
    let mut done: HashMap<(ValueId, u64, u64, bool, u64, u64), ValueId> = HashMap::new();
    for i in 0..g.ops.len() {
        let Kind::Gemm { b, n, k, batch, strides, trans_b, b_packed: false, .. } = g.ops[i].kind else {
            continue;
        };
        let Some(Const { data: Data::F(data), .. }) = g.konst(b) else {
            continue;
        };
        let Some(plen) = gemm_packed_b_len(k, n) else {
            continue;
        };
        let padded = n.div_ceil(GEMM_PANEL as u64) * GEMM_PANEL as u64;
        if (padded - n) * 4 > n || k == 0 {
            continue;
        }
        // One matrix, or one per batch index at B's batch stride.
        let (mats, stride) = if batch > 1 && strides[1] != 0 { (batch, strides[1]) } else { (1, 0) };
        let key = (b, k, n, trans_b, mats, stride);
        let packed = match done.get(&key) {
            Some(&v) => v,
            None => {
                let (k, n, plen, mats, stride) = (k as usize, n as usize, plen as usize, mats as usize, stride as usize);
                let fits = (mats - 1).checked_mul(stride).and_then(|o| o.checked_add(k * n)).is_some_and(|end| end <= data.len());
                if !fits {
                    continue;
                }
                let mut out = vec![0.0f32; mats * plen];
                for (m, dst) in out.chunks_exact_mut(plen).enumerate() {
                    pack_gemm_b(&data[m * stride..][..k * n], k, n, trans_b, dst);
                }
                let name = format!("{}.panels", g.values[b].name);
                let v = g.add_value(&name, vec![out.len() as u64], Some(Const::f32(&[out.len() as u64], out)));
                done.insert(key, v);
                v
            }
        };
        if let Kind::Gemm { b, strides, trans_b, b_packed, .. } = &mut g.ops[i].kind {
            *b = packed;
            *b_packed = true;
            *trans_b = false;
            if mats > 1 {
                strides[1] = plen;
            }
        }
        layouts.push(Layout {
            op: g.ops[i].name.clone(),
            kind: LayoutKind::GemmPanels,
            note: format!(
                "B packed: {k}x{n} weights in {GEMM_PANEL}-column panels{}",
                if mats > 1 { format!(", {mats} matrices") } else { String::new() }
            ),
        });
    }
    layouts
}
