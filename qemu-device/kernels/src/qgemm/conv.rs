//! int8 convolution: im2col straight into packed micro-panels (rows =
//! output positions, k = (c, ky, kx)), then the int8 GEMM core, storing
//! NCHW (row stride 1, column stride `oh·ow`).

use super::kernel::{GROUP_A, MR};
use super::{bstats, check_cols, check_dst, check_zero, col_data, drive, packed_b_len, panel_len, with_bytes2, Core, QDst, QTensor, QGEMM_MAX_K};
use crate::conv::{Axis, Padding2d};
use crate::error::{KernelError, Result};
use crate::util::{check_len, mul, sequential, volume};

/// Parameters of [`qconv2d`]: the geometry of `Conv2dParams` (NCHW).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QConvParams {
    pub batch: usize,
    pub in_channels: usize,
    pub in_h: usize,
    pub in_w: usize,
    pub out_channels: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: Padding2d,
    pub dilation: [usize; 2],
    /// Must divide both channel counts.
    pub groups: usize,
}

/// The f32 convolution's geometry is the int8 one's (its activation
/// aside): the one mapping between the two parameter sets, both ways.
impl From<&crate::conv::Conv2dParams> for QConvParams {
    fn from(p: &crate::conv::Conv2dParams) -> Self {
        let crate::conv::Conv2dParams { batch, in_channels, in_h, in_w, out_channels, kernel, stride, padding, dilation, groups, activation: _ } = *p;
        QConvParams { batch, in_channels, in_h, in_w, out_channels, kernel, stride, padding, dilation, groups }
    }
}

impl From<&QConvParams> for crate::conv::Conv2dParams {
    fn from(p: &QConvParams) -> Self {
        let QConvParams { batch, in_channels, in_h, in_w, out_channels, kernel, stride, padding, dilation, groups } = *p;
        crate::conv::Conv2dParams { batch, in_channels, in_h, in_w, out_channels, kernel, stride, padding, dilation, groups, activation: crate::Activation::None }
    }
}

/// The geometry of a convolution, checked as the f32 convolution's (the
/// same rules), plus the int8 kernels' limit on k.
fn geometry(p: &QConvParams) -> Result<crate::conv::Geometry> {
    let g = crate::conv::geometry(&p.into())?;
    if g.kdim > QGEMM_MAX_K {
        return Err(KernelError::invalid("qconv2d k", format!("{} exceeds the maximum of {QGEMM_MAX_K}", g.kdim)));
    }
    Ok(g)
}

/// Output shape `[batch, out_channels, out_h, out_w]` of `p`, validating it.
pub fn qconv2d_output_shape(p: &QConvParams) -> Result<[usize; 4]> {
    let g = geometry(p)?;
    Ok([p.batch, p.out_channels, g.h.output, g.w.output])
}

/// int8 NCHW convolution: `x` `[batch, in_channels, in_h, in_w]` with zero
/// point `x_zero`; weights per group one packed `[k × out_channels/groups]`
/// B (`k = in_channels/groups·kh·kw` ordered (c, ky, kx);
/// `rbln_hw::ops::pack_qgemm_b`), the groups back to back; padded input
/// positions read as `x_zero`. `w_zero` / `bias` / `scale` have
/// `out_channels` entries; arithmetic and output as [`qgemm`](super::qgemm),
/// output channel as the column; `dst` is NCHW.
#[allow(clippy::too_many_arguments)]
pub fn qconv2d(x: QTensor<'_>, x_zero: i32, w: &[u8], w_zero: Option<&[i32]>, bias: Option<&[i32]>, scale: &[f32], p: &QConvParams, mut dst: QDst<'_>) -> Result<()> {
    qconv2d_impl(x, x_zero, w, w_zero, bias, scale, p, &mut dst, super::kernel::Isa::best())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn qconv2d_impl(
    x: QTensor<'_>,
    x_zero: i32,
    w: &[u8],
    w_zero: Option<&[i32]>,
    bias: Option<&[i32]>,
    scale: &[f32],
    p: &QConvParams,
    dst: &mut QDst<'_>,
    isa: super::kernel::Isa,
) -> Result<()> {
    let g = geometry(p)?;
    check_len("qconv2d input", x.data.len(), volume("qconv2d input", &[p.batch, p.in_channels, g.in_plane])?)?;
    check_zero("qconv2d input zero point", x_zero, x.signed)?;
    let blen = packed_b_len(g.kdim, g.og)?;
    check_len("qconv2d weight (packed)", w.len(), mul("qconv2d weight", blen, p.groups)?)?;
    check_cols("qconv2d scale", p.out_channels, w_zero, bias, scale)?;
    let (kind, out) = check_dst("qconv2d output", dst, volume("qconv2d output", &[p.batch, p.out_channels, g.out_plane])?)?;
    if p.batch == 0 || p.out_channels == 0 || g.out_plane == 0 {
        return Ok(());
    }
    let xor = if x.signed { 0x80u8 } else { 0 };
    let xz = if x.signed { x_zero + 128 } else { x_zero };
    let (k, og) = (g.kdim, g.og);
    let kg = k.div_ceil(4);
    // Per group: the epilogue terms and B's range.
    let mut cds = Vec::with_capacity(p.groups);
    let (mut lo, mut hi) = (i8::MAX, i8::MIN);
    for grp in 0..p.groups {
        let r = grp * og..(grp + 1) * og;
        let (cd, l, h) = col_data(&w[grp * blen..][..blen], k, og, xz, w_zero.map(|z| &z[r.clone()]), bias.map(|b| &b[r.clone()]), &scale[r], isa.simd());
        cds.push(cd);
        lo = lo.min(l);
        hi = hi.max(h);
    }
    // Empty groups (og = 0) leave the range inverted: nothing to choose.
    let stats = bstats(lo.min(hi), hi.max(lo), w_zero);
    let images = p.batch * p.groups;
    let seq = sequential(images.saturating_mul(g.out_plane).saturating_mul(og).saturating_mul(k).saturating_mul(2));
    let (h, wa) = (g.h, g.w);
    let (kh, kw) = (p.kernel[0], p.kernel[1]);
    let pack = |img: usize, r0: usize, rows: usize, block: &mut [u8]| {
        let (b, grp) = (img / p.groups, img % p.groups);
        let tp = rows.div_ceil(MR) * MR;
        let plane0 = (b * p.in_channels + grp * g.cg) * g.in_plane;
        let src = &x.data[plane0..][..g.cg * g.in_plane];
        let st = Stage::new(&h, &wa, kh, kw, g.cg, r0, rows, xor == 0);
        with_bytes2(st.len + SLACK + KC * tp + SLACK, |buf| {
            let (stage, run) = buf.split_at_mut(st.len + SLACK);
            st.build(stage, src, &h, &wa, xor, xz as u8);
            let stage: &[u8] = if st.direct { src } else { stage };
            let pl = panel_len(kg);
            if st.direct && k.is_multiple_of(4) && r0 + tp <= g.in_plane {
                // A 1×1 convolution reading whole micro-panels' worth of
                // positions inside every plane: im2col row c is plane c
                // itself, transposed straight from the input.
                let plane = g.in_plane;
                transpose(block, |r| &src[r * plane + r0..][..tp], pl, tp, 0, k);
                return;
            }
            // Reduction row r = (c·kh + ky)·kw + kx, stepped without
            // divisions; the positions' first output row and column once.
            let at = Start { oy: r0 / wa.output, ox: r0 % wa.output };
            let (mut c, mut ky, mut kx) = (0, 0, 0);
            let mut k0 = 0;
            while k0 < kg * 4 {
                let kc = KC.min(kg * 4 - k0);
                for rr in 0..kc {
                    let r = k0 + rr;
                    if r >= k {
                        run[rr * tp..][..tp].fill(0);
                        continue;
                    }
                    st.gather(run, rr * tp, stage, &wa, c, ky, kx, at, rows);
                    run[rr * tp + rows..][..tp - rows].fill(0);
                    kx += 1;
                    if kx == kw {
                        kx = 0;
                        ky += 1;
                        if ky == kh {
                            ky = 0;
                            c += 1;
                        }
                    }
                }
                transpose(block, |r| &run[(r - k0) * tp..][..tp], pl, tp, k0, kc);
                k0 += kc;
            }
        })
    };
    let core = |img: usize| {
        let grp = img % p.groups;
        Core { k, kg, stats, isa, kind, b: &w[grp * blen..][..blen], cols: cds[grp].cols() }
    };
    // Image b, group grp: positions of channels grp·og + j.
    let place = |img: usize| (img / p.groups * p.out_channels + img % p.groups * og) * g.out_plane;
    // SAFETY: (image, group) × positions × channels of the NCHW output
    // (length checked), distinct for distinct (img, row, column).
    unsafe { drive(images, g.out_plane, og, kg, seq, pack, core, &out, place, 1, g.out_plane) };
    Ok(())
}

/// Reduction rows gathered per im2col chunk (a multiple of 4).
const KC: usize = 64;
/// Readable / writable bytes past the ends of the staging buffers (the
/// gathers copy whole 8-byte words).
const SLACK: usize = 16;

/// The input under a block of output positions, padded and split by
/// column phase: byte `((c·sw + ph)·nry + yy)·pxw + x` is the padded input
/// at row `oy0·sh + yy`, column `x·sw + ph` of channel `c` (`^ xor`, or
/// the pad value). Every im2col row segment is then one contiguous run.
struct Stage {
    /// Reads the input planes themselves (1×1, stride 1, no padding, u8).
    direct: bool,
    /// Bytes between the (channel, phase) blocks.
    cstride: usize,
    cg: usize,
    sh: usize,
    dh: usize,
    oy0: usize,
    nry: usize,
    pxw: usize,
    len: usize,
}

impl Stage {
    #[allow(clippy::too_many_arguments)]
    fn new(ha: &Axis, wa: &Axis, kh: usize, kw: usize, cg: usize, r0: usize, rows: usize, direct: bool) -> Stage {
        let ow = wa.output;
        let (oy0, oy1) = (r0 / ow, (r0 + rows - 1) / ow);
        let nry = (oy1 - oy0) * ha.stride + (kh - 1) * ha.dilation + 1;
        let needw = (ow - 1) * wa.stride + (kw - 1) * wa.dilation + 1;
        let pxw = needw.div_ceil(wa.stride);
        if direct && kh == 1 && kw == 1 && ha.stride == 1 && wa.stride == 1 && ha.pad_before == 0 && wa.pad_before == 0 && ha.output == ha.input && wa.output == wa.input {
            return Stage { direct: true, cstride: ha.input * wa.input, cg, sh: 1, dh: 1, oy0: 0, nry: ha.input, pxw: wa.input, len: 0 };
        }
        Stage { direct: false, cstride: nry * pxw, cg, sh: ha.stride, dh: ha.dilation, oy0, nry, pxw, len: cg * wa.stride * nry * pxw }
    }

    /// Fills `stage` (`len` bytes) from the channels' planes in `src`.
    #[allow(clippy::too_many_arguments)]
    fn build(&self, stage: &mut [u8], src: &[u8], ha: &Axis, wa: &Axis, xor: u8, pad: u8) {
        if self.direct {
            return;
        }
        let (sw, pxw, nry) = (wa.stride, self.pxw, self.nry);
        let plane = ha.input * wa.input;
        // Only the column phases and rows some tap reads (a strided 1×1
        // conv reads one phase of every other row: a quarter of the rest).
        // (Decided once per stage, not per channel: the divisions cost more
        // than the copies of a small map's rows.)
        let phases: smallvec::SmallVec<[usize; 4]> = (0..sw).filter(|&ph| (0..wa.kernel).any(|kx| (kx * wa.dilation) % sw == ph)).collect();
        let rows_out = nry.saturating_sub((ha.kernel - 1) * self.dh + 1) / self.sh + 1;
        let row_used = |yy: usize| (0..ha.kernel).any(|ky| yy >= ky * self.dh && (yy - ky * self.dh) % self.sh == 0 && (yy - ky * self.dh) / self.sh < rows_out);
        let rows: smallvec::SmallVec<[usize; 64]> = (0..nry).filter(|&yy| row_used(yy)).collect();
        for c in 0..self.cg {
            for &yy in &rows {
                let iy = (self.oy0 * self.sh + yy) as isize - ha.pad_before as isize;
                let real = iy >= 0 && (iy as usize) < ha.input;
                for &ph in &phases {
                    let d = &mut stage[((c * sw + ph) * nry + yy) * pxw..][..pxw];
                    if !real {
                        d.fill(pad);
                        continue;
                    }
                    let row = &src[c * plane + iy as usize * wa.input..][..wa.input];
                    if sw == 1 {
                        let l = wa.pad_before.min(pxw);
                        let r = (wa.pad_before + wa.input).min(pxw).max(l);
                        d[..l].fill(pad);
                        if r > l {
                            for (d, &s) in d[l..r].iter_mut().zip(&row[l - wa.pad_before..]) {
                                *d = s ^ xor;
                            }
                        }
                        d[r..].fill(pad);
                    } else {
                        // Real columns: xx·sw + ph − pad_before in 0..input.
                        let (pb, ph2) = (wa.pad_before, ph);
                        let l = if pb > ph2 { (pb - ph2).div_ceil(sw) } else { 0 }.min(pxw);
                        let r = (wa.input + pb).saturating_sub(ph2).div_ceil(sw).min(pxw).max(l);
                        d[..l].fill(pad);
                        d[r..].fill(pad);
                        if r > l {
                            let ix0 = l * sw + ph2 - pb;
                            for (d, s) in d[l..r].iter_mut().zip(row[ix0..].iter().step_by(sw)) {
                                *d = *s ^ xor;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Row `(c, ky, kx)` of the im2col matrix for output positions from
    /// `t0` (at output row and column `t0`) on, `rows` of them, written at
    /// `run[at..]` (and up to 7 bytes after it).
    #[allow(clippy::too_many_arguments)]
    fn gather(&self, run: &mut [u8], at: usize, stage: &[u8], wa: &Axis, c: usize, ky: usize, kx: usize, t0: Start, rows: usize) {
        let ow = wa.output;
        let (sw, pxw) = (wa.stride, self.pxw);
        let (ph, xo) = if sw == 1 { (0, kx * wa.dilation) } else { ((kx * wa.dilation) % sw, (kx * wa.dilation) / sw) };
        let (mut oy, mut ox0) = (t0.oy, t0.ox);
        let mut j = 0;
        while j < rows {
            let seg = (ow - ox0).min(rows - j);
            let yy = (oy - self.oy0) * self.sh + ky * self.dh;
            let off = (c * sw + ph) * self.cstride + yy * pxw + xo + ox0;
            if off + seg.div_ceil(8) * 8 <= stage.len() && at + j + seg.div_ceil(8) * 8 <= run.len() {
                // SAFETY: both ranges, rounded up to whole words, are in
                // bounds (checked).
                unsafe { copy_words(run.as_mut_ptr().add(at + j), stage.as_ptr().add(off), seg) };
            } else {
                run[at + j..][..seg].copy_from_slice(&stage[off..][..seg]);
            }
            j += seg;
            ox0 = 0;
            oy += 1;
        }
    }
}

/// The output row and column of a block's first position.
#[derive(Clone, Copy)]
struct Start {
    oy: usize,
    ox: usize,
}

/// Copies `len` bytes rounded up to whole 8-byte words.
///
/// # Safety
/// `src` / `dst` are readable / writable for `len.div_ceil(8)·8` bytes.
#[inline(always)]
unsafe fn copy_words(dst: *mut u8, src: *const u8, len: usize) {
    let mut i = 0;
    while i < len {
        // SAFETY: the caller's contract.
        unsafe { (dst.add(i) as *mut u64).write_unaligned((src.add(i) as *const u64).read_unaligned()) };
        i += 8;
    }
}

/// Moves im2col rows `k0 .. k0+kc` (`row(r)`: row `r`, `tp` bytes, `tp` a
/// multiple of MR) into the plain parts of the micro-panels (`pl` bytes
/// apart): group `k0/4 + g` of panel `mp`, byte `4i + kk` =
/// `row(k0 + 4g + kk)[4mp + i]`.
fn transpose<'r>(block: &mut [u8], row: impl Fn(usize) -> &'r [u8], pl: usize, tp: usize, k0: usize, kc: usize) {
    let nmp = tp / MR;
    for g in 0..kc / 4 {
        let rows: [&[u8]; 4] = core::array::from_fn(|kk| row(k0 + 4 * g + kk));
        let goff = (k0 / 4 + g) * GROUP_A;
        let mut mp = 0;
        #[cfg(target_arch = "x86_64")]
        while mp + 4 <= nmp {
            use core::arch::x86_64::*;
            // SSE2 (baseline on x86_64): 4 k-rows × 16 positions → the
            // groups of 4 micro-panels.
            // SAFETY: 16 bytes at 4mp of each row (4mp + 16 ≤ tp); each
            // store is one 16-byte group of a micro-panel inside `block`.
            unsafe {
                let ld = |r: &[u8]| _mm_loadu_si128(r[4 * mp..].as_ptr() as *const __m128i);
                let (a, b, c, d) = (ld(rows[0]), ld(rows[1]), ld(rows[2]), ld(rows[3]));
                let ab_lo = _mm_unpacklo_epi8(a, b);
                let ab_hi = _mm_unpackhi_epi8(a, b);
                let cd_lo = _mm_unpacklo_epi8(c, d);
                let cd_hi = _mm_unpackhi_epi8(c, d);
                let outs = [_mm_unpacklo_epi16(ab_lo, cd_lo), _mm_unpackhi_epi16(ab_lo, cd_lo), _mm_unpacklo_epi16(ab_hi, cd_hi), _mm_unpackhi_epi16(ab_hi, cd_hi)];
                for (q, v) in outs.iter().enumerate() {
                    let dst = &mut block[(mp + q) * pl + goff..][..GROUP_A];
                    _mm_storeu_si128(dst.as_mut_ptr() as *mut __m128i, *v);
                }
            }
            mp += 4;
        }
        while mp < nmp {
            let dst = &mut block[mp * pl + goff..][..GROUP_A];
            for i in 0..MR {
                for kk in 0..4 {
                    dst[i * 4 + kk] = rows[kk][mp * MR + i];
                }
            }
            mp += 1;
        }
    }
}
