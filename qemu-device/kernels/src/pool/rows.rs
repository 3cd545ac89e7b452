//! Stride-2 max pooling with windows 2 or 3 wide, on AVX-512: each output
//! row's 16-output vectors straight from the input rows.
//!
//! The window's input rows are reduced column-wise in registers (each row
//! vector one masked load: lanes left of the row, i.e. the padding, and
//! past its end are not read and count as `-inf`), then the even and odd
//! columns are picked out of two such vectors (`vpermt2ps`) and, for a
//! window of 3, the even ones one column on (`valignd`, with the 33rd
//! column from a third load). No scratch, no pass over a padded copy.
//!
//! Maxima are taken with the new value first (`vmaxps` returns its second
//! operand when either is NaN, here the running maximum, which starts at
//! `-inf`): NaN inputs are skipped, as `f32::max` skips them, and a
//! window of NaNs only gives `-inf`.

use core::arch::x86_64::*;

use crate::conv::dw_rows::lanes;
use crate::conv::Axis;

/// Whether [`max_plane`] computes pooling on `ha` × `wa`: horizontal
/// stride 2 and window 2 or 3, a vertical window of at most 3 rows, no
/// dilation.
pub(crate) fn applies(ha: &Axis, wa: &Axis) -> bool {
    wa.stride == 2 && (2..=3).contains(&wa.kernel) && ha.kernel <= 3 && ha.dilation == 1 && wa.dilation == 1 && crate::fastmath::has_avx512()
}

/// Max pooling of one plane (`ha.input × wa.input` at `inp` to
/// `ha.output × wa.output` at `out`).
///
/// # Safety
/// [`applies`] holds; `inp` is readable for `ha.input·wa.input` floats and
/// `out` writable for `ha.output·wa.output`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn max_plane(ha: &Axis, wa: &Axis, inp: *const f32, out: *mut f32) {
    let (iw, ow) = (wa.input as isize, wa.output);
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    let k3 = wa.kernel == 3;
    for oy in 0..ha.output {
        let ys = crate::util::valid_range(ha.base(oy), 1, ha.kernel, ha.input);
        let mut rows = [inp; 3];
        for (slot, ky) in rows.iter_mut().zip(ys.clone()) {
            // SAFETY: row ha.input_index(oy, ky) lies in the plane.
            *slot = unsafe { inp.add(ha.input_index(oy, ky) as usize * wa.input) };
        }
        let rows = &rows[..ys.len()];
        // SAFETY: the output row lies in `out`.
        let orow = unsafe { out.add(oy * ow) };
        let mut ox = 0;
        while ox < ow {
            let c = (2 * ox) as isize - wa.pad_before as isize;
            let masks = [lanes(-c, iw - c), lanes(-c - 16, iw - c - 16), lanes(-c - 32, iw - c - 32) & 1];
            let mut v = [ninf; 3];
            for &row in rows {
                for (j, v) in v.iter_mut().enumerate().take(if k3 { 3 } else { 2 }) {
                    // SAFETY: only the lanes of `masks[j]`, inside the row,
                    // are read (masked lanes are neither read nor faulted on).
                    let x = unsafe { _mm512_mask_loadu_ps(ninf, masks[j], row.wrapping_offset(c + 16 * j as isize)) };
                    *v = _mm512_max_ps(x, *v);
                }
            }
            let (e, o) = (_mm512_permutex2var_ps(v[0], even, v[1]), _mm512_permutex2var_ps(v[0], odd, v[1]));
            let mut r = _mm512_max_ps(o, e);
            if k3 {
                let e2 = _mm512_castsi512_ps(_mm512_alignr_epi32::<1>(_mm512_castps_si512(v[2]), _mm512_castps_si512(e)));
                r = _mm512_max_ps(e2, r);
            }
            // SAFETY: outputs ox .. ox + n of this row.
            unsafe { _mm512_mask_storeu_ps(orow.add(ox), lanes(0, (ow - ox) as isize), r) };
            ox += 16;
        }
    }
}
