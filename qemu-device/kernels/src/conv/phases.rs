//! Stride-phase planes: a convolution's input, zero-padded and split by
//! stride phase, so that every tap of the kernel reads a contiguous window.
//!
//! Phase (py, px) of a padded plane holds rows py, py+sh, … and columns
//! px, px+sw, … . Tap (ky, kx) of output (oy, ox) then lies in phase
//! ((ky·dh) % sh, (kx·dw) % sw) at (oy + ky·dh / sh, ox + kx·dw / sw). Over
//! the output grid flattened with the phase planes' row length `cols`
//! (position q = oy·cols + ox, the columns ox ≥ out_w being garbage that
//! callers drop), each tap is the window starting at a fixed offset: a
//! shifted contiguous read.

use super::{gather_strided, Axis};
use crate::util::valid_range;

/// Zeros after each phase plane's spare row: reads of a whole vector (up
/// to 16 floats) of garbage positions past the last output stay inside.
const TAIL: usize = 16;

/// Layout of the stride-phase planes of the depthwise fast path; all the
/// index arithmetic is done once per call, not per plane.
pub(super) struct PhaseGeometry {
    /// Columns of a phase plane.
    pub(super) cols: usize,
    /// Elements per phase plane (with one spare row of zeros).
    pub(super) plane: usize,
    /// How each phase plane is filled from the input plane.
    fills: Vec<PhaseFill>,
    /// Scratch offset of each tap's window, in (ky, kx) order.
    pub(super) tap_offsets: Vec<usize>,
}

/// Rows `rows` of a phase plane (at scratch offset `base`) take, at columns
/// `cols`, input row `iy0 + (i - rows.start)·sh` from column `ix0` with step `sw`.
struct PhaseFill {
    base: usize,
    rows: core::ops::Range<usize>,
    cols: core::ops::Range<usize>,
    iy0: usize,
    ix0: usize,
}

impl PhaseGeometry {
    pub(super) fn new(ha: &Axis, wa: &Axis, in_plane: usize, out_plane: usize) -> Option<PhaseGeometry> {
        // Tap t reads phase (t·d) % s at offset (t·d) / s. t·d ≤ the padded
        // extent, which fits in isize (see `Axis::new`).
        let off_y = (ha.kernel - 1) * ha.dilation / ha.stride;
        let off_x = (wa.kernel - 1) * wa.dilation / wa.stride;
        let rows = ha.output.checked_add(off_y)?;
        let cols = wa.output.checked_add(off_x)?;
        // One spare row plus TAIL elements: reads of the garbage outputs
        // that round the flattened grid up to whole vectors stay in the plane.
        let plane = rows.checked_add(1)?.checked_mul(cols)?.checked_add(TAIL)?;
        // The kernel area is bounded by the (validated) weight length.
        let mut phases: Vec<(usize, usize)> = Vec::new();
        let mut tap_phase = Vec::with_capacity(ha.kernel * wa.kernel);
        for ky in 0..ha.kernel {
            for kx in 0..wa.kernel {
                let (ty, tx) = (ky * ha.dilation, kx * wa.dilation);
                let ph = (ty % ha.stride, tx % wa.stride);
                let pi = match phases.iter().position(|&q| q == ph) {
                    Some(pi) => pi,
                    None if phases.len() == 16 => return None,
                    None => {
                        phases.push(ph);
                        phases.len() - 1
                    }
                };
                tap_phase.push((pi, ty / ha.stride, tx / wa.stride));
            }
        }
        let total = plane.checked_mul(phases.len())?;
        // Only when the scratch stays comparable to the real data.
        let limit = in_plane.saturating_add(out_plane).saturating_mul(4).max(1 << 12);
        if total > limit {
            return None;
        }
        let tap_offsets = tap_phase.iter().map(|&(pi, oy, ox)| pi * plane + oy * cols + ox).collect();
        let fills = phases
            .iter()
            .enumerate()
            .map(|(pi, &(py, px))| {
                // Phase-plane row i is padded row i·sh + py, column j padded
                // column j·sw + px; only the in-bounds ones are non-zero.
                let iv = valid_range(py as isize - ha.pad_before as isize, ha.stride, rows, ha.input);
                let jv = valid_range(px as isize - wa.pad_before as isize, wa.stride, cols, wa.input);
                // For a non-empty range the first row / column is a real
                // input index (so the arithmetic cannot overflow); an empty
                // one is never read.
                let first = |r: &core::ops::Range<usize>, a: &Axis, ph: usize| {
                    if r.is_empty() {
                        0
                    } else {
                        r.start * a.stride + ph - a.pad_before
                    }
                };
                PhaseFill {
                    base: pi * plane,
                    iy0: first(&iv, ha, py),
                    ix0: first(&jv, wa, px),
                    rows: iv,
                    cols: jv,
                }
            })
            .collect();
        Some(PhaseGeometry {
            cols,
            plane,
            fills,
            tap_offsets,
        })
    }

    /// What determines which positions [`fill`](Self::fill) writes (the
    /// rest being padding): two geometries with the same layout leave their
    /// zeros in the same places, so a buffer filled for one can be refilled
    /// for the other without clearing it.
    fn layout(&self) -> impl Iterator<Item = usize> + '_ {
        [self.cols, self.plane]
            .into_iter()
            .chain(self.fills.iter().flat_map(|f| [f.base, f.rows.start, f.rows.end, f.cols.start, f.cols.end]))
    }

    /// Writes this geometry's [`layout`](Self::layout) into `key`.
    pub(super) fn layout_key(&self, key: &mut Vec<usize>) {
        key.clear();
        key.extend(self.layout());
    }

    /// Whether `key` holds this geometry's layout (compared in place: no
    /// allocation per plane).
    pub(super) fn has_layout(&self, key: &[usize]) -> bool {
        key.iter().copied().eq(self.layout())
    }

    /// Floats of one input plane's phase planes.
    pub(super) fn len(&self) -> usize {
        self.plane * self.fills.len()
    }

    /// Writes input plane `inp`'s phase planes into `dst` (`len()` floats).
    /// Only the positions that hold input are written, unless `zero` asks
    /// for the padding to be cleared as well (needed unless `dst` already
    /// holds phases of this geometry).
    pub(super) fn fill(&self, inp: &[f32], ha: &Axis, wa: &Axis, dst: &mut [f32], zero: bool) {
        if zero {
            dst.fill(0.0);
        }
        for f in &self.fills {
            let n = f.cols.len();
            if n == 0 {
                continue;
            }
            for (r, i) in f.rows.clone().enumerate() {
                let iy = f.iy0 + r * ha.stride;
                let src = &inp[iy * wa.input + f.ix0..];
                let d = &mut dst[f.base + i * self.cols + f.cols.start..][..n];
                gather_strided(d, src, wa.stride);
            }
        }
    }
}
