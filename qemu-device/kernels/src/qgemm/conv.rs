//! int8 convolution: im2col straight into packed micro-panels (rows =
//! output positions, k = (c, ky, kx)), then the int8 GEMM core, storing
//! NCHW (row stride 1, column stride `oh·ow`). On AVX-512 VNNI the
//! micro-panels are [`super::vnni`]'s (16 rows) and so is the core.

use super::kernel::{Isa, MR, VNNI_MR};
use super::{bstats, check_cols, check_dst, check_zero, col_data, drive, packed_b_len, panel_len, with_bytes2, BLayout, BlockCore, Core, QDst, QTensor, QGEMM_MAX_K};
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
    /// The weights' reduction index is in channel quads
    /// (`rbln_hw::ops::QCONV_CHANNEL_QUADS`, [`rbln_hw::ops::qconv_k`]).
    pub channel_quads: bool,
    /// The weights are in the tile layout
    /// (`rbln_hw::ops::QCONV_WEIGHT_TILES`, `pack_qconv_tiles`) rather than
    /// packed panels.
    pub weight_tiles: bool,
}

/// The f32 convolution's geometry is the int8 one's (its activation
/// aside): the one mapping between the two parameter sets, both ways.
impl From<&crate::conv::Conv2dParams> for QConvParams {
    fn from(p: &crate::conv::Conv2dParams) -> Self {
        let crate::conv::Conv2dParams { batch, in_channels, in_h, in_w, out_channels, kernel, stride, padding, dilation, groups, activation: _ } = *p;
        QConvParams { batch, in_channels, in_h, in_w, out_channels, kernel, stride, padding, dilation, groups, channel_quads: false, weight_tiles: false }
    }
}

impl From<&QConvParams> for crate::conv::Conv2dParams {
    fn from(p: &QConvParams) -> Self {
        let QConvParams { batch, in_channels, in_h, in_w, out_channels, kernel, stride, padding, dilation, groups, channel_quads: _, weight_tiles: _ } = *p;
        crate::conv::Conv2dParams { batch, in_channels, in_h, in_w, out_channels, kernel, stride, padding, dilation, groups, activation: crate::Activation::None }
    }
}

/// The geometry of a convolution, checked as the f32 convolution's (the
/// same rules), plus the int8 kernels' limit on k; `kdim` is the weights'
/// reduction length (in channel quads: rounded up).
fn geometry(p: &QConvParams) -> Result<crate::conv::Geometry> {
    let mut g = crate::conv::geometry(&p.into())?;
    if p.channel_quads {
        let ks = rbln_hw::ops::qconv_k(g.cg as u64, p.kernel[0] as u64, p.kernel[1] as u64, rbln_hw::ops::QCONV_CHANNEL_QUADS);
        g.kdim = ks.and_then(|k| usize::try_from(k).ok()).ok_or(KernelError::Overflow { what: "qconv2d k" })?;
    }
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
/// B (`k = in_channels/groups·kh·kw` ordered (c, ky, kx), or in channel
/// quads with `p.channel_quads`; `rbln_hw::ops::pack_qgemm_b`), the groups
/// back to back; padded input
/// positions read as `x_zero`. `w_zero` / `bias` / `scale` have
/// `out_channels` entries; arithmetic and output as [`qgemm`](super::qgemm),
/// output channel as the column; `dst` is NCHW. With `p.weight_tiles` the
/// weights are in the tile layout instead (`rbln_hw::ops::pack_qconv_tiles`
/// with `qconv_tile_taps` taps), which the AMX core reads as tiles and
/// the VNNI core too; other cores get it rewritten as panels per call.
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
    // A strided 1×1 convolution's weights are the same bytes in channel
    // quads (k = c in both orders): the implicit path's stage reads each
    // input row once, 0.85-0.87 of the im2col packing's time on ResNet-50's
    // projections (1×1 s2 256→512 @56, kernels_bench, 9 rounds). (At
    // stride 1, 1.3-1.9× the direct path's.)
    let strided_1x1 = p.kernel == [1, 1] && p.stride != [1, 1] && g.cg.is_multiple_of(4);
    let p = &QConvParams { channel_quads: p.channel_quads || strided_1x1, ..*p };
    check_len("qconv2d input", x.data.len(), volume("qconv2d input", &[p.batch, p.in_channels, g.in_plane])?)?;
    check_zero("qconv2d input zero point", x_zero, x.signed)?;
    let (k, og) = (g.kdim, g.og);
    let kg = k.div_ceil(4);
    let layout = if p.weight_tiles {
        let taps = if p.channel_quads { p.kernel[0] * p.kernel[1] } else { 1 };
        if taps == 0 || !kg.is_multiple_of(taps) {
            return Err(KernelError::invalid("qconv2d weight tiles", format!("{taps} taps do not divide {kg} groups of k")));
        }
        BLayout::Tiles { taps }
    } else {
        BLayout::Panels
    };
    let blen = match layout {
        BLayout::Panels => packed_b_len(k, og)?,
        BLayout::Tiles { .. } => rbln_hw::ops::qconv_tiled_len(k as u64, og as u64).and_then(|l| usize::try_from(l).ok()).ok_or(KernelError::Overflow { what: "qconv2d weight tiles" })?,
    };
    check_len("qconv2d weight (packed)", w.len(), mul("qconv2d weight", blen, p.groups)?)?;
    check_cols("qconv2d scale", p.out_channels, w_zero, bias, scale)?;
    let (kind, out) = check_dst("qconv2d output", dst, volume("qconv2d output", &[p.batch, p.out_channels, g.out_plane])?)?;
    if p.batch == 0 || p.out_channels == 0 || g.out_plane == 0 {
        return Ok(());
    }
    let vnni_core = cfg!(target_arch = "x86_64") && isa.vnni() && vnni_available();
    // The cores without the VNNI layout's reads take panels: tiles are
    // rewritten (a slow path of CPUs without AVX-512 VNNI).
    let mut panels = Reused::take();
    let (w, layout, blen) = match layout {
        BLayout::Tiles { taps } if !vnni_core => {
            let plen = packed_b_len(k, og)?;
            panels.0.resize(mul("qconv2d weight", plen, p.groups)?, 0);
            tiles_to_panels(w, blen, k, og, taps, &mut panels.0, plen, seq_rewrite(p.groups, plen));
            (&panels.0[..], BLayout::Panels, plen)
        }
        _ => (w, layout, blen),
    };
    let xor = if x.signed { 0x80u8 } else { 0 };
    let xz = if x.signed { x_zero + 128 } else { x_zero };
    // Per group: the epilogue terms and B's range.
    let mut cds = Vec::with_capacity(p.groups);
    let (mut lo, mut hi) = (i8::MAX, i8::MIN);
    for grp in 0..p.groups {
        let r = grp * og..(grp + 1) * og;
        let (cd, l, h) = col_data(&w[grp * blen..][..blen], k, og, xz, w_zero.map(|z| &z[r.clone()]), bias.map(|b| &b[r.clone()]), &scale[r], isa, layout);
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
    let g = &g;
    // The packing for micro-panels of `mr` rows, `pl` bytes apart.
    let pack_for = |mr: usize, pl: usize| move |img: usize, r0: usize, rows: usize, block: &mut [u8]| {
        let (b, grp) = (img / p.groups, img % p.groups);
        let tp = rows.div_ceil(mr) * mr;
        let plane0 = (b * p.in_channels + grp * g.cg) * g.in_plane;
        let src = &x.data[plane0..][..g.cg * g.in_plane];
        let st = Stage::new(&h, &wa, kh, kw, g.cg, r0, rows, xor == 0);
        with_bytes2(st.len, |stage| {
            st.build(stage, src, &h, &wa, xor, xz as u8);
            let stage: &[u8] = if st.direct { src } else { stage };
            if st.direct && k.is_multiple_of(4) && k == g.cg && r0 + tp <= g.in_plane {
                // A 1×1 convolution reading whole micro-panels' worth of
                // positions inside every plane: im2col row c is plane c
                // itself, transposed straight from the input.
                let plane = g.in_plane;
                match mr {
                    4 => transpose::<MR>(block, |r| &src[r * plane + r0..][..tp], pl, tp, 0, k),
                    _ => transpose::<VNNI_MR>(block, |r| &src[r * plane + r0..][..tp], pl, tp, 0, k),
                }
                return;
            }
            match mr {
                4 => st.pack::<MR>(block, stage, &wa, k, p.channel_quads, kh, kw, r0, rows, tp, pl),
                _ => st.pack::<VNNI_MR>(block, stage, &wa, k, p.channel_quads, kh, kw, r0, rows, tp, pl),
            }
        })
    };
    // Image b, group grp: positions of channels grp·og + j.
    let place = |img: usize| (img / p.groups * p.out_channels + img % p.groups * og) * g.out_plane;
    #[cfg(target_arch = "x86_64")]
    if vnni_core {
        use super::vnni;
        let amx = isa == Isa::Amx && super::amx::available();
        let core = |img: usize| {
            let grp = img % p.groups;
            vnni::Core { kg, zero_points: stats.zero_points, kind, b: &w[grp * blen..][..blen], layout, amx, cols: cds[grp].cols() }
        };
        if implicit_applies(p, g) {
            implicit(x.data, xor, xz as u8, p, g, layout, &core, &out, &place, seq);
            return Ok(());
        }
        let pack = pack_for(vnni::MR, <vnni::Core<'_> as BlockCore>::panel_len(kg));
        // SAFETY: as below.
        unsafe { drive(images, g.out_plane, og, kg, seq, pack, core, &out, place, 1, g.out_plane) };
        return Ok(());
    }
    let core = |img: usize| {
        let grp = img % p.groups;
        Core { k, kg, stats, isa, kind, b: &w[grp * blen..][..blen], cols: cds[grp].cols() }
    };
    // SAFETY: (image, group) × positions × channels of the NCHW output
    // (length checked), distinct for distinct (img, row, column).
    unsafe { drive(images, g.out_plane, og, kg, seq, pack_for(MR, panel_len(kg)), core, &out, place, 1, g.out_plane) };
    Ok(())
}

/// Whether [`implicit`] runs `p`: weights in channel quads, and rows of
/// at least 8 positions in the stage (a vector of 16 then touches at most
/// three output rows).
#[cfg(target_arch = "x86_64")]
fn implicit_applies(p: &QConvParams, g: &crate::conv::Geometry) -> bool {
    let needw = (g.w.output - 1) * g.w.stride + (p.kernel[1] - 1) * g.w.dilation + 1;
    p.channel_quads && needw.div_ceil(g.w.stride) >= 8
}

/// The VNNI convolution without im2col, for weights in channel quads: a
/// block's stage (its output rows' input, padded, by column phase) is
/// rewritten with 4 channels side by side and its rows split by row phase
/// too (byte `4x + c%4` of row `yy/sh` of plane `(c/4, column phase, yy %
/// sh)`), so that reduction group `(c/4, ky, kx)` of 16 consecutive
/// positions of one output row is 64 consecutive bytes. Positions are
/// *virtual*: `r·pxw + ox` over the stage rows' width `pxw` (the columns
/// past the output width compute values that are not stored), so a
/// vector runs on across output rows (the next output row's input rows
/// are the next rows of the same row phase). Tasks are (image, block of
/// output rows, block of columns).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn implicit<'w>(x: &[u8], xor: u8, pad: u8, p: &QConvParams, g: &crate::conv::Geometry, layout: BLayout, core: &(impl Fn(usize) -> super::vnni::Core<'w> + Sync), out: &super::OutPtr, place: &(impl Fn(usize) -> usize + Sync), seq: bool) {
    use super::vnni::{Seg, MR as VR};
    use crate::util::{for_each_task, plan_threads};
    let (h, wa) = (g.h, g.w);
    let (kh, kw) = (p.kernel[0], p.kernel[1]);
    let (oh, ow, sw, sh) = (h.output, wa.output, wa.stride, h.stride);
    let needw = (ow - 1) * sw + (kw - 1) * wa.dilation + 1;
    let pxw = needw.div_ceil(sw);
    let (cg, cq) = (g.cg, g.cg.div_ceil(4));
    let images = p.batch * p.groups;
    let want = if seq { 1 } else { 6 * plan_threads(seq) };
    // About 16 vectors of positions per block; then enough tasks, from
    // blocks of columns first (fewer rows per block waste more lanes: a
    // 7×7 map's rows one by one would fill 7 of 16).
    let mut rows_blk = (256 / pxw).clamp(1, oh);
    // Column blocks in whole blocks of the weights' layout.
    let unit = if layout == BLayout::Panels { PANEL_COLS } else { super::vnni::TILE_COLS };
    let panels = g.og.div_ceil(unit);
    let tasks = |rows_blk: usize| images * oh.div_ceil(rows_blk);
    let mut ncb = if tasks(rows_blk) < want { want.div_ceil(tasks(rows_blk)).min(panels) } else { 1 };
    if tasks(rows_blk) * ncb < want {
        rows_blk = oh.div_ceil(want.div_ceil(images * ncb).min(oh)).max(1);
    }
    let nrb = oh.div_ceil(rows_blk);
    let cb = panels.div_ceil(ncb) * unit;
    ncb = g.og.div_ceil(cb);
    let blocks = images * nrb;
    // Block `blk`: image, first output row, rows; its stage geometry.
    let block = |blk: usize| {
        let (img, rb) = (blk / nrb, blk % nrb);
        let oy0 = rb * rows_blk;
        let nrows = rows_blk.min(oh - oy0);
        (img, oy0, nrows, Stage::new(&h, &wa, kh, kw, cg, oy0 * ow, nrows * ow, false))
    };
    // Bytes of a channel of a block's stage, of a quad of its rewritten
    // stage (row phases padded to whole rows), and the most any block
    // needs (a group's last real position lies in the stage, its vector
    // reads at most 60 bytes past it).
    // (An odd number of cache lines: the AMX core loads a tap's 16 quads
    // as one tile, rows one quad apart, which a stride of a multiple of
    // 1 KiB would map to a quarter of L1's sets.)
    let quad_of = |st: &Stage| (sw * sh * st.nry.div_ceil(sh) * pxw * 4).div_ceil(64) / 2 * 128 + 64;
    let len4 = cq * quad_of(&block(0).3) + VR * 4;
    // Writes channel quads q0 .. q1 of block `blk`'s rewritten stage into
    // `st4` (quad q0 first; the quads past cg/4 and the slack: `pad`).
    let build = |blk: usize, q0: usize, q1: usize, st4: &mut [u8]| {
        let (img, _, _, st) = block(blk);
        let (b, grp) = (img / p.groups, img % p.groups);
        let (quad, nph) = (quad_of(&st), st.nry.div_ceil(sh));
        let src = &x[(b * p.in_channels + grp * cg) * g.in_plane..][..cg * g.in_plane];
        // Straight from the input rows into the rewritten stage (through
        // a 4-row scratch only for column strides above 2).
        let (phases, rows) = st.reads(&h, &wa);
        with_bytes2(if sw > 2 { 4 * pxw } else { 0 }, |tmp| {
            for q in q0..q1 {
                for &yy in &rows {
                    let iy = (st.oy0 * sh + yy) as isize - h.pad_before as isize;
                    let real = iy >= 0 && (iy as usize) < h.input;
                    for &ph in &phases {
                        let at = (q - q0) * quad + (((ph * sh + yy % sh) * nph + yy / sh) * pxw) * 4;
                        let d = &mut st4[at..][..pxw * 4];
                        if !real {
                            d.fill(pad);
                            continue;
                        }
                        let srow = |c: usize| &src[c * g.in_plane + iy as usize * wa.input..][..wa.input];
                        let srcs: [Option<&[u8]>; 4] = core::array::from_fn(|i| (4 * q + i < cg).then(|| srow(4 * q + i)));
                        interleave_row(d, srcs, &wa, ph, xor, pad, tmp);
                    }
                }
            }
        });
        if q1 == cq {
            st4[(q1 - q0) * quad..].fill(pad);
        }
    };
    // Runs the columns c0 .. c0+nc of block `blk` on its rewritten stage.
    let run = |blk: usize, st4: &[u8], c0: usize, nc: usize| {
        let (img, oy0, nrows, st) = block(blk);
        assert!(st4.len() >= len4);
        let (nph, quad) = (st.nry.div_ceil(sh), quad_of(&st));
        let nv = (nrows - 1) * pxw + ow;
        let nvec = nv.div_ceil(VR);
        // Group (c/4, ky, kx)'s offset in the rewritten stage, by group
        // (a table: divisions per group cost more than its multiply-adds).
        let mut goffs = Vec::with_capacity(cq * kh * kw);
        for c4 in 0..cq {
            for ky in 0..kh {
                for kx in 0..kw {
                    let (ph, xo) = ((kx * wa.dilation) % sw, (kx * wa.dilation) / sw);
                    let (phy, yo) = ((ky * st.dh) % sh, (ky * st.dh) / sh);
                    goffs.push(c4 * quad + (((ph * sh + phy) * nph + yo) * pxw + xo) * 4);
                }
            }
        }
        // Each vector's runs of stored positions.
        let segs: smallvec::SmallVec<[Seg; 64]> = (0..nvec)
            .map(|v| {
                let mut s = Seg::default();
                let (v0, v1) = (v * VR, ((v + 1) * VR).min(nv));
                let mut r = v0 / pxw;
                while r * pxw < v1 {
                    let (l0, l1) = ((r * pxw).max(v0), (r * pxw + ow).min(v1));
                    if l1 > l0 {
                        let mask = (((1u32 << (l1 - l0)) - 1) << (l0 - v0)) as u16;
                        s.push(mask, ((oy0 + r) * ow) as isize + v0 as isize - (r * pxw) as isize);
                    }
                    r += 1;
                }
                s
            })
            .collect();
        // SAFETY: AVX-512 F/BW/VL and VNNI (the caller checked
        // `vnni::available`); vector v of group gi reads st4 at goffs[gi] +
        // 64v .. + 64 ≤ len4 (above); the stores are this block's rows ×
        // columns c0 .. c0+nc of image img's NCHW output, no other task's.
        // A tap's consecutive channel quads lie one rewritten quad apart.
        unsafe { core(img).tiles(st4.as_ptr(), VR * 4, nvec, &|gi| goffs[gi], quad, &segs, c0, nc, out, place(img) + c0 * g.out_plane, g.out_plane) };
    };
    if ncb == 1 {
        // Each block's stage built and used by one task, in its cache.
        for_each_task(blocks, seq, |blk| super::with_bytes(len4, |st4| {
            build(blk, 0, cq, st4);
            run(blk, st4, 0, g.og);
        }));
        return;
    }
    // Few blocks, many columns: every block's stage once (in parts of
    // channel quads, so that all threads build), shared by its columns'
    // tasks.
    super::with_bytes(blocks * len4, |shared| {
        let parts = want.div_ceil(blocks).clamp(1, cq);
        let per = cq.div_ceil(parts);
        let sp = crate::util::SendPtr(shared.as_mut_ptr());
        for_each_task(blocks * parts, seq, |t| {
            let (blk, part) = (t / parts, t % parts);
            let (q0, q1) = ((part * per).min(cq), ((part + 1) * per).min(cq));
            if q0 == q1 && q1 != cq {
                return;
            }
            let quad = quad_of(&block(blk).3);
            let start = blk * len4 + q0 * quad;
            let end = if q1 == cq { (blk + 1) * len4 } else { blk * len4 + q1 * quad };
            // SAFETY: tasks write disjoint ranges of `shared` (blocks are
            // len4 apart; parts cover disjoint quads of a block, the last
            // part also the block's slack).
            let st4 = unsafe { core::slice::from_raw_parts_mut(sp.get().add(start), end - start) };
            build(blk, q0, q1, st4);
        });
        let shared = &*shared;
        for_each_task(blocks * ncb, seq, |t| {
            let (blk, cbi) = (t / ncb, t % ncb);
            let c0 = cbi * cb;
            run(blk, &shared[blk * len4..][..len4], c0, cb.min(g.og - c0));
        });
    });
}

/// Columns of a packed B panel.
#[cfg(target_arch = "x86_64")]
const PANEL_COLS: usize = super::kernel::PANEL;

/// One stage row of column phase `ph` for 4 channels: `dst[4x + i]` is
/// channel i's input at column `x·sw + ph − pad_before` (`^ xor`), `pad`
/// where that column is padding or the channel is missing (`None`);
/// `dst` is 4 × the stage's width. Columns at strides above 2 are
/// gathered into `tmp` (4 × the width) first.
#[cfg(target_arch = "x86_64")]
fn interleave_row(dst: &mut [u8], rows: [Option<&[u8]>; 4], wa: &Axis, ph: usize, xor: u8, pad: u8, tmp: &mut [u8]) {
    let (sw, pb) = (wa.stride, wa.pad_before);
    let pxw = dst.len() / 4;
    // Real columns l..r: x·sw + ph − pb in 0..input.
    let l = if pb > ph { (pb - ph).div_ceil(sw) } else { 0 }.min(pxw);
    let r = (wa.input + pb).saturating_sub(ph).div_ceil(sw).min(pxw).max(l);
    dst[..4 * l].fill(pad);
    dst[4 * r..].fill(pad);
    if r == l {
        return;
    }
    let (n, first) = (r - l, l * sw + ph - pb);
    let padrow = [pad; 16];
    let dst = &mut dst[4 * l..4 * r];
    match sw {
        1 => interleave_body::<1>(dst, core::array::from_fn(|i| rows[i].map(|row| &row[first..first + n])), xor, &padrow),
        2 => interleave_body::<2>(dst, core::array::from_fn(|i| rows[i].map(|row| &row[first..first + 2 * n - 1])), xor, &padrow),
        _ => {
            let (t0, rest) = tmp.split_at_mut(n);
            let (t1, rest) = rest.split_at_mut(n);
            let (t2, rest) = rest.split_at_mut(n);
            let t3 = &mut rest[..n];
            let mut ts = [t0, t1, t2, t3];
            for (t, row) in ts.iter_mut().zip(rows) {
                if let Some(row) = row {
                    gather_bytes(t, &row[first..], sw, xor);
                }
            }
            let [t0, t1, t2, t3] = ts;
            let gathered = [&*t0, &*t1, &*t2, &*t3];
            interleave_body::<1>(dst, core::array::from_fn(|i| rows[i].map(|_| gathered[i])), 0, &padrow);
        }
    }
}

/// `dst[4x + i] = rows[i][S·x] ^ xor` (`pad` of `padrow` for a missing
/// row; a row holds the `S·(n − 1) + 1` bytes read, `n = dst.len() / 4`):
/// 16 columns at a time, each row's 16 bytes one load (at stride 2, the
/// even bytes of two loads, packed), the four interleaved by byte and word
/// unpacks (as [`store_interleaved`]); SSE2, the x86-64 baseline.
/// Gathering them byte by byte took 17 % of a 3×3 64→64 @56 int8
/// convolution, and at stride 2 a separate gathering pass 15 % of a 3×3
/// s2 128→128 @56 one (`perf`, kernels_bench).
#[cfg(target_arch = "x86_64")]
fn interleave_body<const S: usize>(dst: &mut [u8], rows: [Option<&[u8]>; 4], xor: u8, padrow: &[u8; 16]) {
    use core::arch::x86_64::*;
    let n = dst.len() / 4;
    if n == 0 {
        return;
    }
    let rows: [Option<&[u8]>; 4] = core::array::from_fn(|r| rows[r].map(|row| &row[..S * (n - 1) + 1]));
    // Whole vectors whose loads (16·S bytes) stay inside every row.
    let body = if S == 1 { n / 16 * 16 } else { (S * (n - 1) + 1) / (16 * S) * 16 };
    // SAFETY: SSE2 is baseline on x86_64; each load reads 16 bytes of a
    // row at `S·i + 16·S ≤ S·(n − 1) + 1 = row.len()` (`i < body`, sliced
    // above) or `padrow`; the stores write `dst[4i .. 4i + 64]`, inside
    // `dst` (`i + 16 ≤ body ≤ n`).
    unsafe {
        let x = _mm_set1_epi8(xor as i8);
        let pad = _mm_loadu_si128(padrow.as_ptr() as *const __m128i);
        let low = _mm_set1_epi16(0xff);
        let mut i = 0;
        while i < body {
            let ld = |r: usize| {
                rows[r].map_or(pad, |row| {
                    let p = row.as_ptr().add(S * i) as *const __m128i;
                    let v = if S == 1 { _mm_loadu_si128(p) } else { _mm_packus_epi16(_mm_and_si128(_mm_loadu_si128(p), low), _mm_and_si128(_mm_loadu_si128(p.add(1)), low)) };
                    _mm_xor_si128(v, x)
                })
            };
            let (a, b, c, d) = (ld(0), ld(1), ld(2), ld(3));
            let (ab_lo, ab_hi) = (_mm_unpacklo_epi8(a, b), _mm_unpackhi_epi8(a, b));
            let (cd_lo, cd_hi) = (_mm_unpacklo_epi8(c, d), _mm_unpackhi_epi8(c, d));
            let outs = [_mm_unpacklo_epi16(ab_lo, cd_lo), _mm_unpackhi_epi16(ab_lo, cd_lo), _mm_unpacklo_epi16(ab_hi, cd_hi), _mm_unpackhi_epi16(ab_hi, cd_hi)];
            let out = dst.as_mut_ptr().add(4 * i);
            for (o, v) in outs.iter().enumerate() {
                _mm_storeu_si128(out.add(16 * o) as *mut __m128i, *v);
            }
            i += 16;
        }
    }
    for j in body..n {
        for (r, row) in rows.iter().enumerate() {
            dst[4 * j + r] = row.map_or(padrow[0], |row| row[S * j] ^ xor);
        }
    }
}

crate::fastmath::simd_dispatch! {
    /// `dst[i] = src[i·stride] ^ xor` (`src` holds the last of them):
    /// stride 2 as whole pairs, which vectorize (on AVX-512 as truncating
    /// word-to-byte moves), others element by element.
    fn gather_bytes(dst: &mut [u8], src: &[u8], stride: usize, xor: u8) {
        let Some(n1) = dst.len().checked_sub(1) else { return };
        let (body, last) = dst.split_at_mut(n1);
        if stride == 2 {
            for (d, pair) in body.iter_mut().zip(src[..2 * n1].chunks_exact(2)) {
                *d = pair[0] ^ xor;
            }
        } else {
            for (d, s) in body.iter_mut().zip(src.iter().step_by(stride)) {
                *d = *s ^ xor;
            }
        }
        last[0] = src[n1 * stride] ^ xor;
    }
}

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
    /// The column phases and the rows (of `0..nry`) some tap reads: a
    /// strided 1×1 conv reads one phase of every other row, a quarter of
    /// the rest. (Decided once per stage, not per channel: the divisions
    /// cost more than the copies of a small map's rows.)
    fn reads(&self, ha: &Axis, wa: &Axis) -> (smallvec::SmallVec<[usize; 4]>, smallvec::SmallVec<[usize; 64]>) {
        let sw = wa.stride;
        let phases = (0..sw).filter(|&ph| (0..wa.kernel).any(|kx| (kx * wa.dilation) % sw == ph)).collect();
        let rows_out = self.nry.saturating_sub((ha.kernel - 1) * self.dh + 1) / self.sh + 1;
        let row_used = |yy: usize| (0..ha.kernel).any(|ky| yy >= ky * self.dh && (yy - ky * self.dh).is_multiple_of(self.sh) && (yy - ky * self.dh) / self.sh < rows_out);
        (phases, (0..self.nry).filter(|&yy| row_used(yy)).collect())
    }

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
        let (phases, rows) = self.reads(ha, wa);
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
                            gather_bytes(&mut d[l..r], &row[ix0..], sw, xor);
                        }
                    }
                }
            }
        }
    }

    /// Packs the im2col rows of output positions `r0 .. r0+rows` (`tp`
    /// of them padded with zeros, as are the rows `k .. 4·⌈k/4⌉`) into the
    /// micro-panels of `MR` rows (`pl` bytes apart, see [`transpose`]),
    /// reading `stage` (built by [`Stage::build`]) straight into the
    /// layout: 16 positions of one output row are 16 consecutive stage
    /// bytes for every reduction row (c, ky, kx), at an offset that is the
    /// sum of a per-position and a per-reduction-row part. (Gathering whole
    /// im2col rows into a buffer first and transposing that took about
    /// half of a VNNI 3×3 convolution.)
    #[allow(clippy::too_many_arguments)]
    fn pack<const MR: usize>(&self, block: &mut [u8], stage: &[u8], wa: &Axis, k: usize, quads: bool, kh: usize, kw: usize, r0: usize, rows: usize, tp: usize, pl: usize) {
        let (ow, sw, pxw) = (wa.output, wa.stride, self.pxw);
        // Stage offset of each real position (its reduction-row part 0).
        let pos = |q: usize| {
            let (oy, ox) = ((r0 + q) / ow, (r0 + q) % ow);
            (oy - self.oy0) * self.sh * pxw + ox
        };
        // Stage offset of reduction row r = (c·kh + ky)·kw + kx, or in
        // channel quads ((c/4·kh + ky)·kw + kx)·4 + c%4 (none for the
        // padding channels).
        let krow = |r: usize| {
            let (c, ky, kx) = if quads {
                let t = r / 4;
                ((t / (kh * kw)) * 4 + r % 4, t / kw % kh, t % kw)
            } else {
                (r / (kh * kw), r / kw % kh, r % kw)
            };
            let (ph, xo) = ((kx * wa.dilation) % sw, (kx * wa.dilation) / sw);
            (c < self.cg).then(|| (c * sw + ph) * self.cstride + ky * self.dh * pxw + xo)
        };
        let kg = k.div_ceil(4);
        // Each chunk of 16 positions as runs inside one output row (first
        // lane, lanes, stage offset): one run, or one per row it touches
        // (a 7×7 map's chunks touch three or four); real positions only.
        let mut runs: smallvec::SmallVec<[(usize, usize, usize); 64]> = smallvec::SmallVec::new();
        let mut first: smallvec::SmallVec<[usize; 64]> = smallvec::SmallVec::new();
        for c in 0..tp / 16 {
            first.push(runs.len());
            let mut lane = 0;
            while lane < 16 && 16 * c + lane < rows {
                let q = 16 * c + lane;
                let len = (ow - (r0 + q) % ow).min(16 - lane).min(rows - q);
                runs.push((lane, len, pos(q)));
                lane += len;
            }
        }
        first.push(runs.len());
        // Reduction rows' offsets by group (the rows past k: none).
        let bases: smallvec::SmallVec<[[Option<usize>; 4]; 64]> = (0..kg).map(|gi| core::array::from_fn(|kk| if 4 * gi + kk < k { krow(4 * gi + kk) } else { None })).collect();
        // Chunk by chunk, so that each micro-panel is written in order.
        let mut q = 0;
        while q + 16 <= tp {
            let runs = &runs[first[q / 16]..first[q / 16 + 1]];
            for (gi, bases) in bases.iter().enumerate() {
                let mut tmp = [[0u8; 16]; 4];
                for (t, base) in tmp.iter_mut().zip(bases) {
                    let Some(base) = *base else { continue };
                    if let [(0, 16, o)] = *runs {
                        t.copy_from_slice(&stage[base + o..][..16]);
                        continue;
                    }
                    for &(lane, len, o) in runs {
                        t[lane..lane + len].copy_from_slice(&stage[base + o..][..len]);
                    }
                }
                store_interleaved::<MR>(block, &tmp, q, gi, pl);
            }
            q += 16;
        }
        // A last part of fewer than 16 positions (4-row micro-panels only).
        while q < tp {
            for (gi, bases) in bases.iter().enumerate() {
                let dst = &mut block[panel_at::<MR>(q, gi, pl)..][..16];
                for i in 0..4 {
                    for kk in 0..4 {
                        dst[i * 4 + kk] = match bases[kk] {
                            Some(base) if q + i < rows => stage[base + pos(q + i)],
                            _ => 0,
                        };
                    }
                }
            }
            q += 4;
        }
    }
}

/// Byte offset in a block of micro-panels of `MR` rows (`pl` bytes apart)
/// of position `q`'s (a multiple of 4) 4 rows × 4 `k` in group `gi`: 16
/// consecutive bytes.
#[inline(always)]
fn panel_at<const MR: usize>(q: usize, gi: usize, pl: usize) -> usize {
    (q / MR) * pl + gi * MR * 4 + (q % MR) * 4
}

/// Stores 4 reduction rows × 16 positions (`rows[kk][i]`, positions `q ..
/// q+16`, reduction rows `4gi ..`) as their micro-panels' bytes `4i + kk`:
/// four 16-byte pieces of groups (of 4 micro-panels of 4 rows, or one
/// whole group of a 16-row micro-panel).
#[inline(always)]
fn store_interleaved<const MR: usize>(block: &mut [u8], rows: &[[u8; 16]; 4], q: usize, gi: usize, pl: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::*;
        // SAFETY: SSE2 is baseline on x86_64; the loads read the 16-byte
        // arrays of `rows`; each store writes 16 bytes inside `block`
        // (sliced).
        unsafe {
            let ld = |r: &[u8; 16]| _mm_loadu_si128(r.as_ptr() as *const __m128i);
            let (a, b, c, d) = (ld(&rows[0]), ld(&rows[1]), ld(&rows[2]), ld(&rows[3]));
            let ab_lo = _mm_unpacklo_epi8(a, b);
            let ab_hi = _mm_unpackhi_epi8(a, b);
            let cd_lo = _mm_unpacklo_epi8(c, d);
            let cd_hi = _mm_unpackhi_epi8(c, d);
            let outs = [_mm_unpacklo_epi16(ab_lo, cd_lo), _mm_unpackhi_epi16(ab_lo, cd_lo), _mm_unpacklo_epi16(ab_hi, cd_hi), _mm_unpackhi_epi16(ab_hi, cd_hi)];
            for (o, v) in outs.iter().enumerate() {
                let dst = &mut block[panel_at::<MR>(q + 4 * o, gi, pl)..][..16];
                _mm_storeu_si128(dst.as_mut_ptr() as *mut __m128i, *v);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for o in 0..4 {
        let dst = &mut block[panel_at::<MR>(q + 4 * o, gi, pl)..][..16];
        for i in 0..4 {
            for kk in 0..4 {
                dst[i * 4 + kk] = rows[kk][4 * o + i];
            }
        }
    }
}

/// Moves im2col rows `k0 .. k0+kc` (`row(r)`: row `r`, `tp` bytes, `tp` a
/// multiple of `MR`) into the plain parts of the micro-panels of `MR` rows
/// (`pl` bytes apart): group `k0/4 + g` of panel `mp`, byte `4i + kk` =
/// `row(k0 + 4g + kk)[MR·mp + i]`.
fn transpose<'r, const MR: usize>(block: &mut [u8], row: impl Fn(usize) -> &'r [u8], pl: usize, tp: usize, k0: usize, kc: usize) {
    debug_assert!(tp.is_multiple_of(MR));
    for g in 0..kc / 4 {
        let rows: [&[u8]; 4] = core::array::from_fn(|kk| row(k0 + 4 * g + kk));
        let gi = k0 / 4 + g;
        let mut q = 0;
        while q + 16 <= tp {
            let tmp: [[u8; 16]; 4] = core::array::from_fn(|kk| rows[kk][q..q + 16].try_into().expect("16 bytes"));
            store_interleaved::<MR>(block, &tmp, q, gi, pl);
            q += 16;
        }
        while q < tp {
            let dst = &mut block[panel_at::<MR>(q, gi, pl)..][..16];
            for i in 0..4 {
                for kk in 0..4 {
                    dst[i * 4 + kk] = rows[kk][q + i];
                }
            }
            q += 4;
        }
    }
}

/// Whether the VNNI core runs here.
fn vnni_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::vnni::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

std::thread_local! {
    /// The panels tiled weights are rewritten into on cores that do not
    /// read tiles, kept between ops (no allocation per op).
    static PANELS: core::cell::RefCell<Vec<u8>> = const { core::cell::RefCell::new(Vec::new()) };
}

/// This thread's panel buffer for the length of one op, handed back when
/// dropped (a nested op, which finds it taken, gets a new one).
struct Reused(Vec<u8>);

impl Reused {
    fn take() -> Reused {
        Reused(PANELS.with(|c| c.try_borrow_mut().map(|mut v| core::mem::take(&mut *v)).unwrap_or_default()))
    }
}

impl Drop for Reused {
    fn drop(&mut self) {
        let v = core::mem::take(&mut self.0);
        PANELS.with(|c| {
            if let Ok(mut slot) = c.try_borrow_mut() {
                if slot.capacity() < v.capacity() {
                    *slot = v;
                }
            }
        });
    }
}

/// Whether rewriting `groups` matrices of `plen` bytes runs on this thread
/// alone (too little to share).
fn seq_rewrite(groups: usize, plen: usize) -> bool {
    sequential(groups.saturating_mul(plen).saturating_mul(4))
}

/// The `groups` weight matrices of `w` (each `blen` bytes in the tile
/// layout with `taps` taps, `k × n`) as packed panels (`plen` bytes each)
/// back to back in `dst`: the same bytes as reading each back into rows
/// and packing them with `rbln_hw::ops::pack_qgemm_b` ([`tiles_to_panels_ref`]).
/// Both layouts keep each column's 4 consecutive `k` side by side, so the
/// rewrite moves 4-byte words: a column's run of quads of one tap is
/// contiguous in the tiles, and each word lands 8 words after the
/// previous quad's in its panel. Tasks are (group, block of 16 columns).
/// (Measured, AMD EPYC, AVX2: the per-element rewrite took ~7 ns per
/// weight byte, more than the convolution itself on ResNet-50's shapes.)
#[allow(clippy::too_many_arguments)]
fn tiles_to_panels(w: &[u8], blen: usize, k: usize, n: usize, taps: usize, dst: &mut [u8], plen: usize, seq: bool) {
    use rbln_hw::ops::{qconv_tile_run, QGEMM_KGROUP as KG4, QGEMM_PANEL as PW, QTILE_COLS as TC, QTILE_GROUPS as TG};
    let kg = k.div_ceil(KG4);
    let blocks = n.div_ceil(TC);
    let groups = dst.len() / plen.max(1);
    if kg == 0 || blocks == 0 || groups == 0 {
        return;
    }
    let qn = kg / taps;
    let runs = qn.div_ceil(TG);
    let word = |b: &[u8], i: usize| u32::from_ne_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
    let out = crate::util::SendPtr(dst.as_mut_ptr());
    crate::util::for_each_task(groups * blocks, seq, |t| {
        let (grp, blk) = (t / blocks, t % blocks);
        let src = &w[grp * blen..][..blen];
        // SAFETY: group grp's panels; a task writes the columns of its
        // block only (panels of 8 lie inside blocks of 16), so tasks write
        // disjoint bytes of `dst`, which nothing else reads meanwhile.
        let pan = unsafe { core::slice::from_raw_parts_mut(out.get().add(grp * plen), plen) };
        let j1 = ((blk + 1) * TC).min(n);
        #[cfg(target_arch = "x86_64")]
        if j1 - blk * TC == TC && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2; `src` is one group's tiles (kg·16 words per
            // block), `pan` its panels (kg·8 words per panel), block blk
            // has all 16 columns.
            unsafe { avx2_block(src, pan, kg, taps, blk) };
            return;
        }
        for j in blk * TC..j1 {
            let c = j % TC;
            // Column j's words in its panel: panel j/8 is kg groups of 8
            // words; group g holds column j at word j%8.
            let col = (j / PW) * PW * kg + j % PW;
            for s in 0..taps {
                for r in 0..runs {
                    let (run, len) = qconv_tile_run(kg, taps, s, r);
                    let from = (TC * KG4 * kg * blk + run) / 4 + len * c;
                    for qq in 0..len {
                        let g = (TG * r + qq) * taps + s;
                        let v = word(src, from + qq).to_ne_bytes();
                        pan[4 * (col + PW * g)..][..4].copy_from_slice(&v);
                    }
                }
            }
        }
        // The panel's padding columns (past n, in the last block) are 0.
        if j1 == n {
            for j in n..n.next_multiple_of(PW) {
                let col = (j / PW) * PW * kg + j % PW;
                for g in 0..kg {
                    pan[4 * (col + PW * g)..][..4].fill(0);
                }
            }
        }
    });
}

/// One whole block of 16 columns of [`tiles_to_panels`] by 8×8 word
/// transposes: a run of a tap holds the block's 16 channel rows of `len`
/// quads, and a panel wants, per quad, 8 channels' words side by side.
/// Partial runs (fewer than 8 quads left) go word by word.
///
/// # Safety
/// AVX2; `src` holds the group's tiles for `kg` quads (block `blk`
/// inside it), `pan` the group's panels, `taps` divides `kg`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2_block(src: &[u8], pan: &mut [u8], kg: usize, taps: usize, blk: usize) {
    use rbln_hw::ops::{qconv_tile_run, QGEMM_PANEL as PW, QTILE_COLS as TC, QTILE_GROUPS as TG};
    let qn = kg / taps;
    assert!(src.len() >= 4 * TC * kg * (blk + 1) && pan.len() >= 4 * PW * kg * (2 * blk + 2));
    let (sp, dp) = (src.as_ptr().cast::<f32>(), pan.as_mut_ptr().cast::<f32>());
    for s in 0..taps {
        for r in 0..qn.div_ceil(TG) {
            let (run, len) = qconv_tile_run(kg, taps, s, r);
            let base = TC * kg * blk + run / 4;
            let mut qq = 0;
            while qq < len {
                let wide = len - qq >= 8;
                for half in 0..2 {
                    // Panel 2·blk + half: channels 8·half .. 8·half + 8.
                    let col0 = (2 * blk + half) * PW * kg;
                    if wide {
                        // Rows c (stride len) of quads qq .. qq + 8 become
                        // the panel's rows of quads g (stride PW·taps).
                        let g0 = (TG * r + qq) * taps + s;
                        // SAFETY: rows c < 8 of the run, words qq .. qq + 8
                        // < len, inside the block's tiles; panel words of
                        // quads g0 + i·taps < kg (asserted above); the
                        // words are moved as floats, bit for bit.
                        unsafe { crate::copy::transpose8x8(sp.add(base + len * 8 * half + qq), len as isize, dp.add(col0 + PW * g0), (PW * taps) as isize) };
                    } else {
                        for i in qq..len {
                            let g = (TG * r + i) * taps + s;
                            for c in 0..PW {
                                // SAFETY: as above, one word each.
                                unsafe { dp.add(col0 + PW * g + c).write_unaligned(sp.add(base + len * (8 * half + c) + i).read_unaligned()) };
                            }
                        }
                    }
                }
                qq += if wide { 8 } else { len - qq };
            }
        }
    }
}

/// [`tiles_to_panels`] element by element through the layouts' defining
/// functions (the reference its test compares with).
#[cfg(test)]
fn tiles_to_panels_ref(w: &[u8], blen: usize, k: usize, n: usize, taps: usize, groups: usize) -> Result<Vec<u8>> {
    let plen = packed_b_len(k, n)?;
    let mut out = vec![0i8; mul("qconv2d weight", plen, groups)?];
    let mut rows = vec![0i8; mul("qconv2d weight", k, n)?];
    for (src, dst) in w.chunks_exact(blen.max(1)).zip(out.chunks_exact_mut(plen.max(1))).take(groups) {
        for (j, row) in rows.chunks_exact_mut(k.max(1)).enumerate().take(n) {
            for (l, v) in row.iter_mut().enumerate() {
                *v = src[rbln_hw::ops::qconv_tile_offset(k, taps, l, j)] as i8;
            }
        }
        rbln_hw::ops::pack_qgemm_b(&rows, k, n, true, dst);
    }
    Ok(out.into_iter().map(|v| v as u8).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word-wise rewrite gives the reference's bytes for partial runs
    /// (quads per tap not a multiple of 16), channel counts that fill
    /// neither a panel nor a block, `k` not a multiple of 4, several
    /// groups, on one thread and shared; over a buffer holding garbage.
    #[test]
    fn tiles_to_panels_matches_the_reference() {
        let mut seed = 7u32;
        let mut byte = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as i8
        };
        // (k, n, taps, groups)
        for (k, n, taps, groups) in [(64, 16, 1, 1), (36, 24, 9, 2), (144, 64, 9, 1), (1152, 40, 9, 1), (256, 5, 1, 3), (10, 17, 1, 1), (2304, 33, 9, 2), (80, 8, 1, 1)] {
            let blen = rbln_hw::ops::qconv_tiled_len(k as u64, n as u64).unwrap() as usize;
            let mut w = vec![0i8; blen * groups];
            for g in 0..groups {
                let rows: Vec<i8> = (0..k * n).map(|_| byte()).collect();
                rbln_hw::ops::pack_qconv_tiles(&rows, k, n, taps, &mut w[g * blen..][..blen]);
            }
            let w: Vec<u8> = w.into_iter().map(|v| v as u8).collect();
            let want = tiles_to_panels_ref(&w, blen, k, n, taps, groups).unwrap();
            let plen = packed_b_len(k, n).unwrap();
            for seq in [true, false] {
                let mut got = vec![0xa5u8; plen * groups];
                tiles_to_panels(&w, blen, k, n, taps, &mut got, plen, seq);
                assert!(got == want, "k {k} n {n} taps {taps} groups {groups} seq {seq}");
            }
        }
    }
}
