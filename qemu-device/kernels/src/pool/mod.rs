//! 2-D max / average pooling (NCHW).

use crate::conv::{gather_strided, Axis, Padding2d};
use crate::error::Result;
use crate::fastmath::simd_dispatch;
use crate::util::{check_len, max_f32, mul, sum_f32, valid_range, volume};
use rayon::prelude::*;

mod bytes;
#[cfg(target_arch = "x86_64")]
mod rows;

pub use bytes::pool2d_int8;

/// Pooling reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// Maximum over the window's real (non-padding) elements; `-inf` if the
    /// window covers padding only.
    Max,
    /// Mean over the window. With `count_include_pad` the divisor is
    /// `kernel[0]·kernel[1]` (padding counts as zeros), otherwise the number
    /// of real elements in the window (0 of them gives 0).
    Avg { count_include_pad: bool },
}

impl PoolKind {
    /// The reduction's identity: what padding contributes.
    fn identity(self) -> f32 {
        match self {
            PoolKind::Max => f32::NEG_INFINITY,
            PoolKind::Avg { .. } => 0.0,
        }
    }
}

/// Parameters of [`pool2d`].
///
/// Input `[batch, channels, in_h, in_w]`, output
/// `[batch, channels, out_h, out_w]`, output sizes as for
/// [`Conv2dParams`](crate::Conv2dParams) (floor mode). Global average pooling
/// is `Avg` with `kernel = [in_h, in_w]`, stride 1, no padding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pool2dParams {
    pub batch: usize,
    pub channels: usize,
    pub in_h: usize,
    pub in_w: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: Padding2d,
    pub dilation: [usize; 2],
    pub kind: PoolKind,
}

impl Default for Pool2dParams {
    fn default() -> Self {
        Pool2dParams {
            batch: 1,
            channels: 1,
            in_h: 1,
            in_w: 1,
            kernel: [1, 1],
            stride: [1, 1],
            padding: Padding2d::default(),
            dilation: [1, 1],
            kind: PoolKind::Max,
        }
    }
}

fn axes(p: &Pool2dParams) -> Result<(Axis, Axis)> {
    let pad = p.padding;
    Ok((
        Axis::new("pool2d height", p.in_h, pad.top, pad.bottom, p.kernel[0], p.stride[0], p.dilation[0])?,
        Axis::new("pool2d width", p.in_w, pad.left, pad.right, p.kernel[1], p.stride[1], p.dilation[1])?,
    ))
}

/// Output shape `[batch, channels, out_h, out_w]` of `p`, validating it.
pub fn pool2d_output_shape(p: &Pool2dParams) -> Result<[usize; 4]> {
    let (h, w) = axes(p)?;
    Ok([p.batch, p.channels, h.output, w.output])
}

/// The axes and plane sizes (input, output) of `p`, with the input and
/// output lengths checked against them.
fn planes(p: &Pool2dParams, input: usize, output: usize) -> Result<(Axis, Axis, usize, usize)> {
    let (ha, wa) = axes(p)?;
    let in_plane = mul("pool2d input", p.in_h, p.in_w)?;
    let out_plane = mul("pool2d output", ha.output, wa.output)?;
    check_len("pool2d input", input, volume("pool2d input", &[p.batch, p.channels, in_plane])?)?;
    check_len("pool2d output", output, volume("pool2d output", &[p.batch, p.channels, out_plane])?)?;
    Ok((ha, wa, in_plane, out_plane))
}

/// Max or average pooling; see [`Pool2dParams`]. Parallel over planes.
pub fn pool2d(p: &Pool2dParams, input: &[f32], output: &mut [f32]) -> Result<()> {
    let (ha, wa, in_plane, out_plane) = planes(p, input.len(), output.len())?;
    let window = mul("pool2d window", p.kernel[0], p.kernel[1])?;
    if output.is_empty() {
        return Ok(());
    }
    let kind = p.kind;
    let planes_per_task = (16_384 / in_plane.max(out_plane).max(1)).max(1);
    let global = ha.output == 1 && wa.output == 1 && ha.kernel == p.in_h && wa.kernel == p.in_w && ha.pad_before == 0 && wa.pad_before == 0 && ha.dilation == 1 && wa.dilation == 1;
    if global {
        // Global pooling: one reduction per plane (the window is the plane).
        output
            .par_chunks_mut(planes_per_task)
            .enumerate()
            .for_each(|(t, out)| {
                for (i, o) in out.iter_mut().enumerate() {
                    let plane = &input[(t * planes_per_task + i) * in_plane..][..in_plane];
                    *o = match kind {
                        PoolKind::Max => max_f32(plane),
                        PoolKind::Avg { .. } if in_plane == 0 => 0.0,
                        PoolKind::Avg { .. } => sum_f32(plane) / in_plane as f32,
                    };
                }
            });
        return Ok(());
    }
    let same = kind == PoolKind::Max
        && [ha.stride, wa.stride, ha.dilation, wa.dilation] == [1; 4]
        && (ha.output, wa.output) == (p.in_h, p.in_w);
    if same && in_plane > 0 {
        // Stride-1 max pooling to the input's size (inception branches,
        // YOLO's SPPF): whole-plane passes instead of row by row.
        let (kh, ph, kw, pw) = (ha.kernel, ha.pad_before, wa.kernel, wa.pad_before);
        output
            .par_chunks_mut(in_plane)
            .with_min_len(planes_per_task)
            .enumerate()
            .for_each_init(Vec::new, |v: &mut Vec<f32>, (plane, out)| {
                v.resize(in_plane, 0.0);
                let x = &input[plane * in_plane..][..in_plane];
                same_max_plane(x, p.in_h, p.in_w, kh, ph, kw, pw, v, out);
            });
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if kind == PoolKind::Max && in_plane > 0 && rows::applies(&ha, &wa) {
        // Downsampling max pools (ResNet's stem, VGG's, UNet's): straight
        // from the input rows, tasks of whole planes.
        let planes = p.batch * p.channels;
        let tasks = planes.div_ceil(planes_per_task);
        let dst = crate::util::SendPtr(output.as_mut_ptr());
        crate::util::for_each_task(tasks, input.len() <= crate::util::SEQ_MAX, |t| {
            for plane in t * planes_per_task..((t + 1) * planes_per_task).min(planes) {
                // SAFETY: `applies` held; plane `plane` of the input and of
                // the output lie in them (lengths checked above), and each
                // task writes its own planes.
                unsafe { rows::max_plane(&ha, &wa, input[plane * in_plane..].as_ptr(), dst.get().add(plane * out_plane)) };
            }
        });
        return Ok(());
    }
    if in_plane == 0 {
        // Every window covers padding only (the other dimension may be
        // huge: allocate nothing per input row).
        output.fill(kind.identity());
        return Ok(());
    }
    // Per output column: first input column of the window and number of
    // real (non-padding) taps, computed once.
    let cols: Vec<(usize, usize)> = (0..wa.output)
        .map(|ox| {
            let r = valid_range(wa.base(ox), wa.dilation, wa.kernel, wa.input);
            let first = if r.is_empty() { 0 } else { wa.input_index(ox, r.start) as usize };
            (first, r.len())
        })
        .collect();
    let hz = Phased::new(&wa);
    output
        .par_chunks_mut(out_plane)
        .with_min_len(planes_per_task)
        .enumerate()
        .for_each_init(
            || (Vec::new(), Vec::new()),
            |(vrow, scratch): &mut (Vec<f32>, Vec<f32>), (plane, out)| {
                let inp = &input[plane * in_plane..][..in_plane];
                vrow.resize(wa.input, 0.0);
                pool_plane(kind, &ha, &wa, hz.as_ref(), &cols, window, inp, vrow, scratch, out);
            },
        );
    Ok(())
}

simd_dispatch! {
    /// One plane of [`pool2d`], row by row (the row kernels below inline
    /// here: one dispatch per plane, not per row).
    #[allow(clippy::too_many_arguments)]
    fn pool_plane(
        kind: PoolKind,
        ha: &Axis,
        wa: &Axis,
        hz: Option<&Phased>,
        cols: &[(usize, usize)],
        window: usize,
        inp: &[f32],
        vrow: &mut [f32],
        scratch: &mut Vec<f32>,
        out: &mut [f32]
    ) {
        for oy in 0..ha.output {
            let ky_range = valid_range(ha.base(oy), ha.dilation, ha.kernel, ha.input);
            let row_of = |ky: usize| &inp[ha.input_index(oy, ky) as usize * wa.input..][..wa.input];
            let o = &mut out[oy * wa.output..][..wa.output];
            let nrows = ky_range.len();
            match hz {
                // Windows of up to three rows (the usual 2×2 and 3×3):
                // the rows as an array, whose iterator inlines (a mapped
                // range did not: a call per row took a fifth of a small
                // map's pooling).
                Some(hz) if nrows <= 3 => {
                    let mut rows: [&[f32]; 3] = [&[]; 3];
                    for (slot, ky) in rows.iter_mut().zip(ky_range) {
                        *slot = row_of(ky);
                    }
                    hz.row(kind, rows[..nrows].iter().copied(), scratch, o);
                    finish_row(kind, cols, nrows, window, o);
                }
                Some(hz) => {
                    hz.row(kind, ky_range.map(row_of), scratch, o);
                    finish_row(kind, cols, nrows, window, o);
                }
                None => pool_row(kind, ky_range.map(row_of), vrow, cols, wa.dilation, nrows, window, o),
            }
        }
    }
}

/// Horizontal pass of undilated windows as whole-row vector operations: the
/// reduced row, padded with the identity, is split into its stride phases
/// so that every tap is a contiguous shifted slice (stride-2 windows of two
/// or three taps, the usual downsampling, in one pass without phases).
pub(crate) struct Phased {
    /// Input columns.
    input: usize,
    pad: usize,
    stride: usize,
    kernel: usize,
    /// Length of the padded row (with `stride` elements of slack).
    padded: usize,
    /// Length of a phase.
    phase: usize,
}

impl Phased {
    fn new(wa: &Axis) -> Option<Phased> {
        if wa.dilation != 1 || wa.stride > 8 || wa.kernel > 64 {
            return None;
        }
        let (s, k, ow) = (wa.stride, wa.kernel, wa.output);
        let padded = (ow - 1).checked_mul(s)?.checked_add(k)?.checked_add(s)?;
        // Only for geometries whose padding is comparable to the data.
        if padded > wa.input.saturating_add(ow).saturating_mul(4).saturating_add(64) {
            return None;
        }
        Some(Phased {
            input: wa.input,
            pad: wa.pad_before,
            stride: s,
            kernel: k,
            padded,
            phase: ow + (k - 1) / s,
        })
    }

    /// `out[ox] = reduce over taps of vrow[ox·s + kx - pad]` (identity in
    /// the padding), before any averaging, where `vrow` is the column-wise
    /// reduction of the window's input `rows` (written straight into the
    /// padded row).
    #[inline(always)]
    fn row<'a>(&self, kind: PoolKind, rows: impl Iterator<Item = &'a [f32]>, scratch: &mut Vec<f32>, out: &mut [f32]) {
        let ident = kind.identity();
        let max = kind == PoolKind::Max;
        let (s, plen) = (self.stride, self.phase);
        let nph = s.min(self.kernel);
        scratch.resize(self.padded + nph * plen, 0.0);
        let (hp, ph) = scratch.split_at_mut(self.padded);
        let pl = self.pad.min(self.padded);
        let n = self.input.min(self.padded - pl);
        hp[..pl].fill(ident);
        reduce_window_rows(kind, rows.map(|r| &r[..n]), &mut hp[pl..pl + n]);
        hp[pl + n..].fill(ident);
        let ow = out.len();
        if s == 2 && (self.kernel == 2 || self.kernel == 3) {
            // The common downsampling windows: one pass, no phase planes.
            pool_s2(max, self.kernel == 3, hp, out);
            return;
        }
        out.fill(ident);
        if s == 1 {
            for kx in 0..self.kernel {
                reduce_rows(max, out, &hp[kx..kx + ow]);
            }
            return;
        }
        for r in 0..nph {
            gather_strided(&mut ph[r * plen..][..plen], &hp[r..], s);
        }
        for kx in 0..self.kernel {
            reduce_rows(max, out, &ph[(kx % s) * plen + kx / s..][..ow]);
        }
    }
}

simd_dispatch! {
    /// One `h × w` plane of stride-1 max pooling to the same size (window
    /// `kh × kw` starting `ph`, `pw` before each output): the rows'
    /// column-wise maxima into `v`, full windows of all rows as one pass
    /// per tap over the flattened plane, then the same across the columns
    /// of `v`, with the windows that the plane's edges clip (border rows,
    /// and columns whose flat window would wrap into the next row) redone
    /// on their own.
    #[allow(clippy::too_many_arguments)]
    fn same_max_plane(x: &[f32], h: usize, w: usize, kh: usize, ph: usize, kw: usize, pw: usize, v: &mut [f32], out: &mut [f32]) {
        let n = h * w;
        // Rows: output row oy takes input rows [oy - ph, oy - ph + kh) ∩ [0, h).
        // Rows [f0, f1) have whole windows (oy ≥ ph, oy - ph + kh ≤ h).
        let (f0, f1) = (ph, (h + ph + 1).saturating_sub(kh).min(h));
        if f1 > f0 {
            let dst = &mut v[f0 * w..f1 * w];
            let src = |ky: usize| &x[(f0 - ph + ky) * w..(f1 - ph + ky) * w];
            dst.copy_from_slice(src(0));
            for ky in 1..kh {
                reduce_rows(true, dst, src(ky));
            }
        }
        // The rows with partial windows: 0..f0 and f1..h (all of them
        // when f1 ≤ f0). (Ranges, not a filter over every row: a small
        // plane's bookkeeping cost as much as its maxima.)
        for oy in (0..f0.min(h)).chain(f1.max(f0)..h) {
            let lo = oy.saturating_sub(ph);
            let hi = (oy + kh - ph).min(h);
            let dst = &mut v[oy * w..][..w];
            dst.copy_from_slice(&x[lo * w..][..w]);
            for iy in lo + 1..hi {
                reduce_rows(true, dst, &x[iy * w..][..w]);
            }
        }
        // Columns: out[i] = max of v[i - pw .. i - pw + kw] where the
        // window stays in i's row.
        let pa = kw - 1 - pw;
        if n > pw + pa {
            let dst = &mut out[pw..n - pa];
            let m = dst.len();
            dst.copy_from_slice(&v[..m]);
            for kx in 1..kw {
                reduce_rows(true, dst, &v[kx..kx + m]);
            }
        }
        // The columns with partial windows: 0..pw and w − pa..w.
        let (left, right) = (pw.min(w), w.saturating_sub(pa).max(pw.min(w)));
        for (row, o) in v.chunks_exact(w).zip(out.chunks_exact_mut(w)) {
            for ox in (0..left).chain(right..w) {
                let lo = ox.saturating_sub(pw);
                let hi = (ox + kw - pw).min(w);
                o[ox] = row[lo + 1..hi].iter().fold(row[lo], |a, &b| a.max(b));
            }
        }
    }
}

/// Stride-2 windows of 2 or 3 (`k3`) taps over the padded row `hp`:
/// `out[ox] = reduce(hp[2·ox], hp[2·ox + 1] [, hp[2·ox + 2]])`, eight
/// outputs at a time from one 17-element window (vector deinterleaves).
#[inline(always)]
fn pool_s2(max: bool, k3: bool, hp: &[f32], out: &mut [f32]) {
    match (max, k3) {
        (true, true) => pool_s2_k::<true, true>(hp, out),
        (true, false) => pool_s2_k::<true, false>(hp, out),
        (false, true) => pool_s2_k::<false, true>(hp, out),
        (false, false) => pool_s2_k::<false, false>(hp, out),
    }
}

#[inline(always)]
fn pool_s2_k<const MAX: bool, const K3: bool>(hp: &[f32], out: &mut [f32]) {
    let op = |a: f32, b: f32| if MAX { a.max(b) } else { a + b };
    let mut ox = 0;
    for o in out.chunks_exact_mut(8) {
        let Some(c) = hp.get(2 * ox..2 * ox + 17) else { break };
        for i in 0..8 {
            let m = op(c[2 * i], c[2 * i + 1]);
            o[i] = if K3 { op(m, c[2 * i + 2]) } else { m };
        }
        ox += 8;
    }
    for (j, o) in out[ox..].iter_mut().enumerate() {
        let b = 2 * (ox + j);
        let m = op(hp[b], hp[b + 1]);
        *o = if K3 { op(m, hp[b + 2]) } else { m };
    }
}

/// Column-wise reduction of the window's input rows into `vrow` (the
/// identity when there are none); windows of two or three rows in one pass.
#[inline(always)]
fn reduce_window_rows<'a>(kind: PoolKind, mut rows: impl Iterator<Item = &'a [f32]>, vrow: &mut [f32]) {
    let max = kind == PoolKind::Max;
    let Some(r0) = rows.next() else {
        vrow.fill(kind.identity());
        return;
    };
    let Some(r1) = rows.next() else {
        vrow.copy_from_slice(r0);
        return;
    };
    match rows.next() {
        Some(r2) => reduce_rows3(max, vrow, r0, r1, Some(r2)),
        None => reduce_rows3(max, vrow, r0, r1, None),
    }
    for r in rows {
        reduce_rows(max, vrow, r);
    }
}

/// `acc = reduce(a, b [, c])` element-wise: the max or the sum of two
/// or three rows, in one pass.
#[inline(always)]
fn reduce_rows3(max: bool, acc: &mut [f32], a: &[f32], b: &[f32], c: Option<&[f32]>) {
    let n = acc.len();
    let (a, b) = (&a[..n], &b[..n]);
    match (max, c) {
        (true, Some(c)) => {
            let c = &c[..n];
            for i in 0..n {
                acc[i] = a[i].max(b[i]).max(c[i]);
            }
        }
        (false, Some(c)) => {
            let c = &c[..n];
            for i in 0..n {
                acc[i] = a[i] + b[i] + c[i];
            }
        }
        (true, None) => {
            for i in 0..n {
                acc[i] = a[i].max(b[i]);
            }
        }
        (false, None) => {
            for i in 0..n {
                acc[i] = a[i] + b[i];
            }
        }
    }
}

/// Averages (or, for max, fixes windows without rows) one output row.
#[inline(always)]
fn finish_row(kind: PoolKind, cols: &[(usize, usize)], nrows: usize, window: usize, out: &mut [f32]) {
    match kind {
        PoolKind::Max => {
            if nrows == 0 {
                out.fill(f32::NEG_INFINITY);
            }
        }
        PoolKind::Avg { count_include_pad: true } => {
            let w = window as f32;
            for o in out.iter_mut() {
                *o /= w;
            }
        }
        PoolKind::Avg { count_include_pad: false } => {
            for (o, &(_, count)) in out.iter_mut().zip(cols) {
                let n = nrows * count;
                *o = if n == 0 { 0.0 } else { *o / n as f32 };
            }
        }
    }
}

/// One output row: reduces the window's input rows column-wise into `vrow`
/// (vectorized), then each output's columns of `vrow`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn pool_row<'a>(
    kind: PoolKind,
    rows: impl Iterator<Item = &'a [f32]>,
    vrow: &mut [f32],
    cols: &[(usize, usize)],
    dil: usize,
    nrows: usize,
    window: usize,
    out: &mut [f32],
) {
    reduce_window_rows(kind, rows, vrow);
    for (o, &(first, count)) in out.iter_mut().zip(cols) {
        *o = match kind {
            PoolKind::Max => {
                let mut acc = f32::NEG_INFINITY;
                if dil == 1 {
                    for &v in &vrow[first..first + count] {
                        acc = acc.max(v);
                    }
                } else {
                    for t in 0..count {
                        acc = acc.max(vrow[first + t * dil]);
                    }
                }
                if nrows == 0 {
                    f32::NEG_INFINITY
                } else {
                    acc
                }
            }
            PoolKind::Avg { count_include_pad } => {
                let mut acc = 0.0;
                if dil == 1 {
                    for &v in &vrow[first..first + count] {
                        acc += v;
                    }
                } else {
                    for t in 0..count {
                        acc += vrow[first + t * dil];
                    }
                }
                if count_include_pad {
                    acc / window as f32
                } else {
                    let n = nrows * count;
                    if n == 0 {
                        0.0
                    } else {
                        acc / n as f32
                    }
                }
            }
        };
    }
}

/// `acc = max(acc, r)` or `acc += r`, element-wise.
#[inline(always)]
fn reduce_rows(max: bool, acc: &mut [f32], r: &[f32]) {
    if max {
        for (a, &v) in acc.iter_mut().zip(r) {
            *a = a.max(v);
        }
    } else {
        for (a, &v) in acc.iter_mut().zip(r) {
            *a += v;
        }
    }
}
