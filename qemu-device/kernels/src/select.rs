//! Element-wise ternary select (ONNX Where) with numpy-style broadcasting
//! of all three operands, on the broadcast machinery of [`crate::binary`].

use crate::binary::{broadcast_shape, drive, Geom};
use crate::error::Result;
use crate::util::{check_len, check_rank, volume};

/// The numpy broadcast of the three shapes of a [`where_select`]
/// (right-aligned; in each dimension the sizes other than 1 must agree).
/// Ranks up to [`crate::MAX_RANK`].
pub fn broadcast_shape3(cond: &[usize], a: &[usize], b: &[usize]) -> Result<crate::Shape> {
    check_rank("where cond shape", cond)?;
    check_rank("where a shape", a)?;
    check_rank("where b shape", b)?;
    broadcast_shape(&broadcast_shape(cond, a)?, b)
}

/// `out = cond != 0 ? a : b`, element-wise, with `cond`, `a` and `b`
/// broadcast together (numpy rules); `out` has the element count of
/// [`broadcast_shape3`]`(cond_dims, a_dims, b_dims)` (row-major).
///
/// `cond` is f32: a NaN counts as true (NaN ≠ 0) and `-0.0` as false.
/// The selected value is copied bit for bit (NaN payloads, signed zeros).
/// Parallel on large outputs; on error nothing is written.
pub fn where_select(
    cond: &[f32],
    cond_dims: &[usize],
    a: &[f32],
    a_dims: &[usize],
    b: &[f32],
    b_dims: &[usize],
    out: &mut [f32],
) -> Result<()> {
    let out_shape = broadcast_shape3(cond_dims, a_dims, b_dims)?;
    let out_len = volume("where output", &out_shape)?;
    check_len("where cond", cond.len(), volume("where cond", cond_dims)?)?;
    check_len("where a", a.len(), volume("where a", a_dims)?)?;
    check_len("where b", b.len(), volume("where b", b_dims)?)?;
    check_len("where output", out.len(), out_len)?;
    if out.is_empty() {
        return Ok(());
    }
    // Non-empty output: every dimension is ≥ 1, so the operands' volumes
    // (validated above) bound all strides.
    let g = Geom::new([cond_dims, a_dims, b_dims], &out_shape);
    let [sc, sa, sb] = g.dims[0].s;
    drive(&g, out, |[oc, oa, ob], o| select_row(&cond[oc..], sc, &a[oa..], sa, &b[ob..], sb, o));
    Ok(())
}

/// `c != 0 ? x : y` (NaN ≠ 0 is true), bit for bit, as a bit-mask
/// blend: written as an `if`, LLVM turns the two loads feeding it into one
/// load through a selected pointer, which does not vectorize.
#[inline(always)]
fn pick(c: f32, x: f32, y: f32) -> f32 {
    let m = u32::from(c != 0.0).wrapping_neg();
    f32::from_bits((x.to_bits() & m) | (y.to_bits() & !m))
}

/// Row kernel: `out[j] = pick(c[j·sc], a[j·sa], b[j·sb])` with every
/// stride 0 or 1; one straight loop per stride pattern.
#[inline(always)]
fn select_row(c: &[f32], sc: usize, a: &[f32], sa: usize, b: &[f32], sb: usize, out: &mut [f32]) {
    let n = out.len();
    if sc == 0 {
        // One condition for the whole row: a copy of one operand.
        let (src, s) = if c[0] != 0.0 { (a, sa) } else { (b, sb) };
        if s == 0 {
            out.fill(src[0]);
        } else {
            out.copy_from_slice(&src[..n]);
        }
        return;
    }
    let c = &c[..n];
    match (sa, sb) {
        (1, 1) => {
            for (((o, &ci), &x), &y) in out.iter_mut().zip(c).zip(&a[..n]).zip(&b[..n]) {
                *o = pick(ci, x, y);
            }
        }
        (1, _) => {
            let y = b[0];
            for ((o, &ci), &x) in out.iter_mut().zip(c).zip(&a[..n]) {
                *o = pick(ci, x, y);
            }
        }
        (_, 1) => {
            let x = a[0];
            for ((o, &ci), &y) in out.iter_mut().zip(c).zip(&b[..n]) {
                *o = pick(ci, x, y);
            }
        }
        _ => {
            let (x, y) = (a[0], b[0]);
            for (o, &ci) in out.iter_mut().zip(c) {
                *o = pick(ci, x, y);
            }
        }
    }
}
