//! Weight layouts for the compute cores, chosen at compile time.
//!
//! A GEMM whose B operand is a constant (a MatMul's or Gemm's weights)
//! gets B rewritten once into the panel layout the cores' GEMM engine
//! streams (`rbln_hw::ops::pack_gemm_b`, flag `GEMM_B_PACKED`): the runtime
//! uploads it with the other weights and no inference repacks it. B is
//! left as stored where the padding of the last panel would grow it by
//! more than a quarter (few columns, e.g. an `[k × 1]` projection).

use std::collections::HashMap;

use rbln_hw::ops::{gemm_packed_b_len, pack_gemm_b, GEMM_PANEL};

use crate::ir::{Const, Data, Graph, Kind, ValueId};

/// What [`run`] decided for one op (for `rbln-compile --list`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The op's name (its ONNX node).
    pub op: String,
    pub note: String,
}

/// Packs the constant B operands of the graph's GEMMs; returns the
/// decisions, one per packed op. A constant read by several GEMMs in the
/// same way is packed once.
pub fn run(g: &mut Graph) -> Vec<Layout> {
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
            note: format!(
                "B packed: {k}x{n} weights in {GEMM_PANEL}-column panels{}",
                if mats > 1 { format!(", {mats} matrices") } else { String::new() }
            ),
        });
    }
    layouts
}
