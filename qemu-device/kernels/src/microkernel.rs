//! The GEMM engine under [`gemm()`](crate::gemm) and the convolutions:
//! a BLIS-style register-blocked microkernel over a B operand packed into
//! column panels.
//!
//! `C[m×n] (+)= A[m×k] · B[k×n]`, where
//! - `A` is read in place through arbitrary strides (its elements are
//!   broadcast one at a time, so no packing is needed: a convolution's
//!   weights are used as stored),
//! - `B` ([`MatB`]) is either packed by the caller into [`NR`]-column
//!   panels (panel `p` holds columns `p·NR .. p·NR+NR` as `k` rows of `NR`
//!   contiguous floats, zero-padded past `n`), or read in place through a
//!   table of row offsets, each row contiguous: a convolution's taps
//!   straight from its (zero-padded, stride-phase split) input planes, an
//!   "indirect" GEMM with no im2col.
//!
//! The microkernel keeps an [`MR`]×[`NR`] tile of `C` in 12 AVX2 registers
//! and does 12 fused multiply-adds per two loads of `B` and six broadcasts
//! of `A` (a 4-row variant covers row counts 6 does not divide, such as
//! a grouped conv's 8 channels per group); the driver blocks `k` so a
//! panel stays in L1 and `m` so the block of `A` stays in L2. On AVX-512 hosts a wide kernel takes two
//! adjacent panels at once: an `MR`×2·`NR` tile in 12 zmm registers, 12
//! fused multiply-adds of 16 lanes per two loads of `B` and six
//! broadcasts, twice the AVX2 kernel's work per load; where 49 or more
//! columns remain it takes four (an `MR`×4·`NR` tile in 24 zmm registers,
//! 24 multiply-adds per four loads and six broadcasts, `k` blocked to
//! `KC_FOUR` so the four panels stay in L1). Both run on 4-row tiles too,
//! and mask their last panel's columns (a 7×7 map's 49 positions are one
//! masked four-panel tile). Hosts without AVX2+FMA run a portable kernel
//! of the AVX2 one's shape.

/// Rows of `C` per microkernel tile.
pub(crate) const MR: usize = 6;
/// Rows of the short tiles that cover row counts 6 does not divide (a
/// grouped conv's 8 channels per group are two of them, not 6 + a 6-row
/// tile of which 2 rows are real).
const SHORT_MR: usize = 4;
/// Columns of `C` per microkernel tile = width of a packed `B` panel, as
/// the hardware contract's packed GEMM operand lays them out.
pub(crate) const NR: usize = rbln_hw::ops::GEMM_PANEL;
/// `k` per block: a `KC`×`NR` panel of `B` (16 KiB; a pair, 32 KiB)
/// stays in L1.
const KC: usize = 256;
/// `k` per block where the wide kernel takes four panels at once: the four
/// (32 KiB) stay in L1. (With `KC` they did not: 4-panel tiles were no
/// faster than 2-panel ones; with this, kernels_bench's ResNet convs took
/// 0.77-0.96 of the 2-panel time, 8 alternated rounds, and 1024³ packed
/// 1.19.)
const KC_FOUR: usize = 128;
/// Rows of `A` per block: `MC`×`KC` floats (~240 KiB) stay in L2.
const MC: usize = 240;

/// Floats of a packed `B` of `k` rows and `n` columns.
pub(crate) fn packed_len(k: usize, n: usize) -> usize {
    k * n.div_ceil(NR) * NR
}

/// Packs `B[k×n]` (element `(l, j)` at `b[l·rs + j·cs]`) into [`NR`]-column
/// panels in `dst` (`packed_len(k, n)` floats).
///
/// # Safety
/// Every `b + l·rs + j·cs` with `l < k`, `j < n` must be readable.
pub(crate) unsafe fn pack_b(dst: &mut [f32], b: *const f32, rs: isize, cs: isize, k: usize, n: usize) {
    debug_assert_eq!(dst.len(), packed_len(k, n));
    if k == 0 {
        return;
    }
    for (p, panel) in dst.chunks_exact_mut(k * NR).enumerate() {
        let j0 = p * NR;
        let w = NR.min(n - j0);
        for (l, row) in panel.chunks_exact_mut(NR).enumerate() {
            // SAFETY: l < k and j0 + j < n (caller's contract).
            let src = unsafe { b.offset(l as isize * rs + j0 as isize * cs) };
            if cs == 1 && w == NR {
                // A whole panel row as one fixed-size copy: a few vector
                // moves, where a copy of run-time length calls memcpy.
                // SAFETY: as above, NR contiguous elements.
                row.copy_from_slice(unsafe { &*src.cast::<[f32; NR]>() });
            } else if cs == 1 {
                // SAFETY: as above, w contiguous elements.
                row[..w].copy_from_slice(unsafe { core::slice::from_raw_parts(src, w) });
            } else {
                for (j, v) in row[..w].iter_mut().enumerate() {
                    // SAFETY: as above.
                    *v = unsafe { *src.offset(j as isize * cs) };
                }
            }
            row[w..].fill(0.0);
        }
    }
}

/// `A` operand: element `(i, l)` at `ptr[i·rs + l·cs]`.
#[derive(Clone, Copy)]
pub(crate) struct MatA {
    pub ptr: *const f32,
    pub rs: isize,
    pub cs: isize,
}

/// The `B` operand of [`gemm_packed`].
#[derive(Clone, Copy)]
pub(crate) enum MatB<'a> {
    /// Panels written by [`pack_b`] (`packed_len(k, n)` floats).
    Packed(&'a [f32]),
    /// Row `l`, columns `j .. j+NR` at `base + offs[l] + j` (`offs` has `k`
    /// entries). Every column up to `n` rounded up to a multiple of `NR` must
    /// be readable; the extra columns' results are discarded.
    Rows { base: *const f32, offs: &'a [isize] },
}

/// An epilogue [`gemm_packed`] applies to `C` as it stores the final sums
/// (in registers: no second pass over the tile):
/// `c[i][j] = clamp((c[i][j] + row_bias[i] + col_bias[j]) + residual[i][j])`,
/// each term optional, added in that order (the order of
/// [`epilogue`](crate::activation::epilogue), so a fused result is
/// bit-identical to a separate pass), the clamp `min(max(x, lo), hi)` with
/// x86 `maxps`/`minps` semantics (a NaN becomes `lo`, as `f32::max` does).
#[derive(Clone, Copy, Default)]
pub(crate) struct Post<'a> {
    /// One value per row of `C` (`m` of them).
    pub row_bias: Option<&'a [f32]>,
    /// One value per column of `C` (`n` of them).
    pub col_bias: Option<&'a [f32]>,
    /// Element `(i, j)` at `ptr[i·ld + j]`, readable for `i < m`, `j < n`.
    pub residual: Option<(*const f32, usize)>,
    /// `(lo, hi)`; neither NaN.
    pub clamp: Option<(f32, f32)>,
}

impl Post<'_> {
    fn any(&self) -> bool {
        self.row_bias.is_some() || self.col_bias.is_some() || self.residual.is_some() || self.clamp.is_some()
    }

    /// The epilogue of the tile at `(i, j)`: pointers at its first row and
    /// column (null where a term is absent).
    fn tile(&self, i: usize, j: usize) -> TilePost {
        let (lo, hi) = self.clamp.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
        TilePost {
            rb: self.row_bias.map_or(core::ptr::null(), |b| b[i..].as_ptr()),
            cb: self.col_bias.map_or(core::ptr::null(), |b| b[j..].as_ptr()),
            res: self.residual.map_or(core::ptr::null(), |(r, ld)| r.wrapping_add(i * ld + j)),
            res_ld: self.residual.map_or(0, |(_, ld)| ld),
            clamp: self.clamp.is_some(),
            lo,
            hi,
        }
    }
}

/// [`Post`] for one tile: row `r`'s bias at `rb[r]`, column `c`'s at
/// `cb[c]`, its residual at `res[r·res_ld + c]` (null: none).
struct TilePost {
    rb: *const f32,
    cb: *const f32,
    res: *const f32,
    res_ld: usize,
    clamp: bool,
    lo: f32,
    hi: f32,
}

/// `maxps` semantics: `b` unless `a > b` (so NaN gives `b`).
#[inline(always)]
fn max_ps(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `minps` semantics: `b` unless `a < b`.
#[inline(always)]
fn min_ps(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

/// `min(max(x, lo), hi)` with `maxps`/`minps` semantics (a NaN `x`
/// becomes `lo`), as the microkernel's clamp.
#[inline(always)]
pub(crate) fn clamp_ps(x: f32, lo: f32, hi: f32) -> f32 {
    min_ps(max_ps(x, lo), hi)
}

impl TilePost {
    /// Applies it to element `(r, c)` of the tile, value `x`.
    ///
    /// # Safety
    /// The terms present are readable at `(r, c)` (row `r` < the tile's
    /// real rows, column `c` < its real columns).
    #[inline(always)]
    unsafe fn apply(&self, r: usize, c: usize, mut x: f32) -> f32 {
        // SAFETY: the caller's contract.
        unsafe {
            if !self.rb.is_null() {
                x += *self.rb.add(r);
            }
            if !self.cb.is_null() {
                x += *self.cb.add(c);
            }
            if !self.res.is_null() {
                x += *self.res.add(r * self.res_ld + c);
            }
        }
        if self.clamp {
            x = min_ps(max_ps(x, self.lo), self.hi);
        }
        x
    }

    /// Applies it to the first `rows` × `cols` elements of the tile at `c`
    /// (row stride `ldc`).
    ///
    /// # Safety
    /// As [`TilePost::apply`] for each of them, and they are writable.
    unsafe fn apply_tile(&self, c: *mut f32, ldc: usize, rows: usize, cols: usize) {
        for r in 0..rows {
            for j in 0..cols {
                // SAFETY: the caller's contract.
                unsafe {
                    let x = c.add(r * ldc + j);
                    *x = self.apply(r, j, *x);
                }
            }
        }
    }
}

/// A microkernel: `tile[R×NR] (row stride ldc) (+)= A'[R×kc] · B'[kc×NR]`
/// for its row count `R` (`MR` or `SHORT_MR`; it reads the first `R` of
/// `rows`), where row `i` of `A'` starts at `rows[i]` and steps by `a_cs`, and row
/// `l` of `B'` is at `b + offs[l]` if `offs` is non-null, else at `b + l·NR`;
/// then `post` (if non-null) on the whole tile as it is stored.
type Micro = unsafe fn(kc: usize, rows: &[*const f32; MR], a_cs: isize, b: *const f32, offs: *const isize, c: *mut f32, ldc: usize, acc: bool, post: *const TilePost);

/// A wide microkernel: as [`Micro`] over `P` adjacent panels (2 or 4),
/// panel `q` at `b + q·pstride` (each with the same row addressing, all
/// `P·NR` columns readable), on an `R`×`P·NR` tile of which only the first
/// `cols` columns (`(P-1)·NR < cols ≤ P·NR`) are read and written, `post`
/// (if non-null) covering those.
type Wide = unsafe fn(kc: usize, rows: &[*const f32; MR], a_cs: isize, b: *const f32, pstride: isize, offs: *const isize, c: *mut f32, ldc: usize, acc: bool, cols: usize, post: *const TilePost);

/// The wide microkernels of one instruction set on `P` panels, (packed,
/// indirect) each: on `MR`-row tiles and on `SHORT_MR`-row ones.
#[derive(Clone, Copy)]
struct WideKernels {
    full: (Wide, Wide),
    short: (Wide, Wide),
}

/// The wide microkernels: on two panels, and on four where the columns
/// reach that far (24 accumulators: half the loads per multiply-add).
#[derive(Clone, Copy)]
struct WideFamily {
    two: WideKernels,
    four: Option<WideKernels>,
}

impl WideFamily {
    #[cfg(target_arch = "x86_64")]
    fn avx512() -> WideFamily {
        WideFamily {
            two: WideKernels { full: (avx512::<false, MR, 2>, avx512::<true, MR, 2>), short: (avx512::<false, SHORT_MR, 2>, avx512::<true, SHORT_MR, 2>) },
            four: Some(WideKernels { full: (avx512::<false, MR, 4>, avx512::<true, MR, 4>), short: (avx512::<false, SHORT_MR, 4>, avx512::<true, SHORT_MR, 4>) }),
        }
    }
}

/// Whether GEMMs run on a wide (AVX-512) microkernel here.
pub(crate) fn has_wide() -> bool {
    select_wide().is_some()
}

/// The wide microkernels for this CPU, if it has them.
fn select_wide() -> Option<WideFamily> {
    #[cfg(test)]
    if let Some(w) = tests::WIDE_OVERRIDE.with(|o| o.get()) {
        return w;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::fastmath::avx512_allowed() && std::arch::is_x86_feature_detected!("avx512f") {
        return Some(WideFamily::avx512());
    }
    None
}

/// The narrow microkernels of one instruction set, (packed, indirect)
/// each: on `MR`-row tiles and on `SHORT_MR`-row ones.
#[derive(Clone, Copy)]
struct Family {
    full: (Micro, Micro),
    short: (Micro, Micro),
    /// `MR` rows × the first `NR / 2` columns, for a last panel of at most
    /// that many real columns (a 7×7 map's 49 positions are three panels
    /// and one column: half the work of a full tile on that column).
    half: Option<(Micro, Micro)>,
}

impl Family {
    fn portable() -> Family {
        Family { full: (portable::<false, MR>, portable::<true, MR>), short: (portable::<false, SHORT_MR>, portable::<true, SHORT_MR>), half: None }
    }

    #[cfg(target_arch = "x86_64")]
    fn avx2_fma() -> Family {
        Family {
            full: (avx2_fma::<false, MR>, avx2_fma::<true, MR>),
            short: (avx2_fma::<false, SHORT_MR>, avx2_fma::<true, SHORT_MR>),
            half: Some((avx2_fma_half::<false>, avx2_fma_half::<true>)),
        }
    }

    /// The (packed, indirect) kernels for tiles of `rows` rows and `cols`
    /// real columns: only the first `cols` of the tile's columns are
    /// meaningful on return (the others may be left as they were).
    fn rows(&self, rows: usize, cols: usize) -> (Micro, Micro) {
        match self.half {
            Some(half) if rows == MR && cols <= NR / 2 => half,
            _ if rows == MR => self.full,
            _ => self.short,
        }
    }
}

/// The rows of the next tile when `left` rows of a block remain: `MR`
/// unless a tail of `SHORT_MR` rows (or two) covers the rest with fewer
/// padding rows (8 → 4 + 4, 10 → 6 + 4, 7 → 4 + 4, 3 → 4; 5 → 6).
fn tile_height(left: usize) -> usize {
    if left >= 9 || left == 6 || left == 5 {
        MR
    } else {
        SHORT_MR
    }
}

/// The narrow microkernels for this CPU.
fn select() -> Family {
    #[cfg(test)]
    if let Some(m) = micro_override() {
        return m;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        return Family::avx2_fma();
    }
    Family::portable()
}

/// `C[m×n] (row stride ldc) = post(A·B (+ C if accumulate))` on the
/// calling thread.
///
/// # Safety
/// `a` must be readable for every `(i, l)`, `i < m`, `l < k`; `b` as its
/// variant says; `c + i·ldc + j` (`i < m`, `j < n`) writable (and readable if
/// `accumulate`) and not overlapping `a` or `b`; `post`'s terms as it says.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_packed(m: usize, n: usize, k: usize, a: MatA, b: MatB<'_>, c: *mut f32, ldc: usize, accumulate: bool, post: Option<&Post<'_>>) {
    let post = post.filter(|p| p.any());
    match b {
        MatB::Packed(bp) => debug_assert_eq!(bp.len(), packed_len(k, n)),
        MatB::Rows { offs, .. } => debug_assert_eq!(offs.len(), k),
    }
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                // SAFETY: row i of C (caller's contract).
                unsafe { core::slice::from_raw_parts_mut(c.add(i * ldc), n) }.fill(0.0);
            }
        }
        if let Some(post) = post {
            // SAFETY: C and post's terms cover m × n (caller's contract).
            unsafe { post.tile(0, 0).apply_tile(c, ldc, m, n) };
        }
        return;
    }
    let family = select();
    let wide = select_wide();
    let four_panels = wide.is_some_and(|w| w.four.is_some()) && n > 3 * NR;
    let panels = n.div_ceil(NR);
    let mut k0 = 0;
    while k0 < k {
        let kc = if four_panels { KC_FOUR } else { KC }.min(k - k0);
        let acc = accumulate || k0 > 0;
        // The epilogue goes with the last block's stores.
        let post = post.filter(|_| k0 + kc == k);
        let mut i0 = 0;
        while i0 < m {
            let mc = MC.min(m - i0);
            let mut p = 0;
            while p < panels {
                let j0 = p * NR;
                // Two or four panels at once where the wide kernels exist
                // and more than one (three) panel's columns remain: a last
                // group of panels with a partial one is one masked wide
                // tile, not narrow ones.
                let group = wide.and_then(|wf| match n - j0 {
                    rem if rem > 3 * NR && wf.four.is_some() => wf.four.map(|w| (w, 4)),
                    rem if rem > NR => Some((wf.two, 2)),
                    _ => None,
                });
                if let Some((wk, np)) = group {
                    let cols = (n - j0).min(np * NR);
                    let (b0, pstride, offs) = match b {
                        // Panels p .. p + np exist: n > j0 + (np - 1)·NR.
                        MatB::Packed(bp) => (bp[p * k * NR + k0 * NR..].as_ptr(), (k * NR) as isize, core::ptr::null()),
                        // SAFETY: column j0 of the rows (contract: readable
                        // up to n rounded up to NR, at least j0 + np·NR).
                        MatB::Rows { base, offs } => (unsafe { base.add(j0) }, NR as isize, offs[k0..].as_ptr()),
                    };
                    let mut i = i0;
                    while i < i0 + mc {
                        let h = tile_height(i0 + mc - i);
                        let (packed, indirect) = if h == MR { wk.full } else { wk.short };
                        let micro = if matches!(b, MatB::Rows { .. }) { indirect } else { packed };
                        let mr = h.min(i0 + mc - i);
                        let rows = tile_rows(a, i, mr, k0);
                        // SAFETY: (i, j0) is inside C.
                        let ct = unsafe { c.add(i * ldc + j0) };
                        if mr == h {
                            let tp = post.map(|p| p.tile(i, j0));
                            let tp = tp.as_ref().map_or(core::ptr::null(), |t| t as *const TilePost);
                            // SAFETY: the tile's h rows and cols columns are
                            // inside C; rows and the panels cover kc steps;
                            // post's terms cover the tile.
                            unsafe { micro(kc, &rows, a.cs, b0, pstride, offs, ct, ldc, acc, cols, tp) };
                        } else {
                            // SAFETY: the tile's mr rows and cols columns
                            // are inside C and post's terms; the stage is
                            // MR×4NR (≥ h rows, ≥ np·NR columns).
                            unsafe {
                                staged(4 * NR, ct, ldc, mr, cols, acc, post.map(|p| p.tile(i, j0)), |t, ld| {
                                    micro(kc, &rows, a.cs, b0, pstride, offs, t, ld, acc, np * NR, core::ptr::null())
                                })
                            };
                        }
                        i += mr;
                    }
                    p += np;
                    continue;
                }
                let nr = NR.min(n - j0);
                let (bpan, offs) = match b {
                    MatB::Packed(bp) => (bp[p * k * NR + k0 * NR..].as_ptr(), core::ptr::null()),
                    // SAFETY: column j0 of the rows (contract); offsets k0.. exist.
                    MatB::Rows { base, offs } => (unsafe { base.add(j0) }, offs[k0..].as_ptr()),
                };
                let mut i = i0;
                while i < i0 + mc {
                    let h = tile_height(i0 + mc - i);
                    let (packed, indirect) = family.rows(h, nr);
                    let micro = if matches!(b, MatB::Rows { .. }) { indirect } else { packed };
                    let mr = h.min(i0 + mc - i);
                    let rows = tile_rows(a, i, mr, k0);
                    // SAFETY: (i, j0) is inside C.
                    let ct = unsafe { c.add(i * ldc + j0) };
                    if mr == h && nr == NR {
                        let tp = post.map(|p| p.tile(i, j0));
                        let tp = tp.as_ref().map_or(core::ptr::null(), |t| t as *const TilePost);
                        // SAFETY: the full tile is inside C; rows and b
                        // cover kc steps (caller's contract, packed_len);
                        // post's terms cover the tile.
                        unsafe { micro(kc, &rows, a.cs, bpan, offs, ct, ldc, acc, tp) };
                    } else {
                        // SAFETY: the tile's mr rows and nr columns are
                        // inside C and post's terms; the stage is MR×NR
                        // (≥ h rows).
                        unsafe {
                            staged(NR, ct, ldc, mr, nr, acc, post.map(|p| p.tile(i, j0)), |t, ld| {
                                micro(kc, &rows, a.cs, bpan, offs, t, ld, acc, core::ptr::null())
                            })
                        };
                    }
                    i += mr;
                }
                p += 1;
            }
            i0 += mc;
        }
        k0 += kc;
    }
}

/// A tile C cannot take whole (fewer real rows than the kernel writes, or
/// a narrow kernel's partial panel): `kernel` runs on an `MR`×`w` stage
/// (`w ≤ 4·NR`), given its pointer and row stride, holding C's
/// `rows`×`cols` corner at `ct` first if `acc`; the corner is copied back
/// and `post` applied to it.
///
/// # Safety
/// The corner (row stride `ldc`) is inside C and `post`'s terms cover it;
/// `kernel` writes only inside the stage.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn staged(w: usize, ct: *mut f32, ldc: usize, rows: usize, cols: usize, acc: bool, post: Option<TilePost>, kernel: impl FnOnce(*mut f32, usize)) {
    debug_assert!(rows <= MR && cols <= w && w <= 4 * NR);
    let mut stage = [0.0f32; MR * 4 * NR];
    if acc {
        for r in 0..rows {
            // SAFETY: row r of the corner (contract).
            let src = unsafe { core::slice::from_raw_parts(ct.add(r * ldc), cols) };
            stage[r * w..r * w + cols].copy_from_slice(src);
        }
    }
    kernel(stage.as_mut_ptr(), w);
    for r in 0..rows {
        // SAFETY: as above.
        let dst = unsafe { core::slice::from_raw_parts_mut(ct.add(r * ldc), cols) };
        dst.copy_from_slice(&stage[r * w..r * w + cols]);
    }
    if let Some(post) = post {
        // SAFETY: the corner, inside C and post's terms (contract).
        unsafe { post.apply_tile(ct, ldc, rows, cols) };
    }
}

/// The `MR` row pointers of A for a tile of `mr` rows from row `i`, at
/// column `k0`: rows past the tile's repeat its last valid row (always
/// readable; their results are discarded).
#[inline(always)]
fn tile_rows(a: MatA, i: usize, mr: usize, k0: usize) -> [*const f32; MR] {
    core::array::from_fn(|r| {
        let row = (i + r.min(mr - 1)) as isize;
        // Pointer arithmetic only: the caller keeps row < m and k0 < k,
        // inside A.
        a.ptr.wrapping_offset(row * a.rs + k0 as isize * a.cs)
    })
}

/// Row `l` of a microkernel's `B` (see [`Micro`]).
///
/// # Safety
/// `offs` (if `INDIRECT`) has more than `l` entries.
#[inline(always)]
unsafe fn b_row<const INDIRECT: bool>(b: *const f32, offs: *const isize, l: usize) -> *const f32 {
    if INDIRECT {
        // SAFETY: contract; the row lies in the caller's operand.
        unsafe { b.wrapping_offset(*offs.add(l)) }
    } else {
        b.wrapping_add(l * NR)
    }
}

/// Portable microkernel (the compiler vectorises the 16-wide rows).
///
/// # Safety
/// See [`Micro`]: `rows[i] + l·a_cs` and B's row `l` (NR floats) readable
/// for `l < kc`, the tile at `c` writable (readable if `acc`).
#[allow(clippy::too_many_arguments)]
unsafe fn portable<const INDIRECT: bool, const ROWS: usize>(kc: usize, rows: &[*const f32; MR], a_cs: isize, b: *const f32, offs: *const isize, c: *mut f32, ldc: usize, acc: bool, post: *const TilePost) {
    let mut t = [[0.0f32; NR]; ROWS];
    if acc {
        for (i, row) in t.iter_mut().enumerate() {
            // SAFETY: tile row i (contract).
            row.copy_from_slice(unsafe { core::slice::from_raw_parts(c.add(i * ldc), NR) });
        }
    }
    for l in 0..kc {
        // SAFETY: B row l (contract).
        let bl = unsafe { &*(b_row::<INDIRECT>(b, offs, l) as *const [f32; NR]) };
        for (i, row) in t.iter_mut().enumerate() {
            // SAFETY: A element (i, l) (contract).
            let av = unsafe { *rows[i].offset(l as isize * a_cs) };
            for (x, &bv) in row.iter_mut().zip(bl) {
                *x += av * bv;
            }
        }
    }
    // SAFETY: null or a live TilePost covering the tile (contract).
    if let Some(post) = unsafe { post.as_ref() } {
        for (i, row) in t.iter_mut().enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                // SAFETY: (i, j) is inside the tile.
                *x = unsafe { post.apply(i, j, *x) };
            }
        }
    }
    for (i, row) in t.iter().enumerate() {
        // SAFETY: tile row i (contract).
        unsafe { core::slice::from_raw_parts_mut(c.add(i * ldc), NR) }.copy_from_slice(row);
    }
}

/// AVX2+FMA microkernel: the `ROWS`×16 tile in `2·ROWS` ymm registers
/// (6 rows: 12; 4 rows: 8, still enough independent chains to cover the
/// multiply-add latency).
///
/// # Safety
/// As [`portable`], and the CPU supports AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_fma<const INDIRECT: bool, const ROWS: usize>(kc: usize, rows: &[*const f32; MR], a_cs: isize, b: *const f32, offs: *const isize, c: *mut f32, ldc: usize, acc: bool, post: *const TilePost) {
    use core::arch::x86_64::*;
    // SAFETY (whole body): every pointer dereferenced is inside the tile,
    // the panel's kc rows or A's kc columns of the ROWS rows (contract).
    unsafe {
        let mut r = [[_mm256_setzero_ps(); 2]; ROWS];
        if acc {
            for (i, ri) in r.iter_mut().enumerate() {
                ri[0] = _mm256_loadu_ps(c.add(i * ldc));
                ri[1] = _mm256_loadu_ps(c.add(i * ldc + 8));
            }
        }
        if let Some(p) = post.as_ref() {
            if !p.res.is_null() {
                prefetch_tile::<ROWS>(p.res, p.res_ld);
            }
        }
        let mut off = 0isize;
        for l in 0..kc {
            let bl = b_row::<INDIRECT>(b, offs, l);
            let b0 = _mm256_loadu_ps(bl);
            let b1 = _mm256_loadu_ps(bl.add(8));
            for (i, ri) in r.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*rows[i].offset(off));
                ri[0] = _mm256_fmadd_ps(av, b0, ri[0]);
                ri[1] = _mm256_fmadd_ps(av, b1, ri[1]);
            }
            off = off.wrapping_add(a_cs);
        }
        if let Some(p) = post.as_ref() {
            // The epilogue on the registers, in TilePost::apply's order.
            if !p.rb.is_null() {
                for (i, ri) in r.iter_mut().enumerate() {
                    let v = _mm256_broadcast_ss(&*p.rb.add(i));
                    ri[0] = _mm256_add_ps(ri[0], v);
                    ri[1] = _mm256_add_ps(ri[1], v);
                }
            }
            if !p.cb.is_null() {
                let (v0, v1) = (_mm256_loadu_ps(p.cb), _mm256_loadu_ps(p.cb.add(8)));
                for ri in r.iter_mut() {
                    ri[0] = _mm256_add_ps(ri[0], v0);
                    ri[1] = _mm256_add_ps(ri[1], v1);
                }
            }
            if !p.res.is_null() {
                for (i, ri) in r.iter_mut().enumerate() {
                    ri[0] = _mm256_add_ps(ri[0], _mm256_loadu_ps(p.res.add(i * p.res_ld)));
                    ri[1] = _mm256_add_ps(ri[1], _mm256_loadu_ps(p.res.add(i * p.res_ld + 8)));
                }
            }
            if p.clamp {
                let (lo, hi) = (_mm256_set1_ps(p.lo), _mm256_set1_ps(p.hi));
                for ri in r.iter_mut() {
                    ri[0] = _mm256_min_ps(_mm256_max_ps(ri[0], lo), hi);
                    ri[1] = _mm256_min_ps(_mm256_max_ps(ri[1], lo), hi);
                }
            }
        }
        for (i, ri) in r.iter().enumerate() {
            _mm256_storeu_ps(c.add(i * ldc), ri[0]);
            _mm256_storeu_ps(c.add(i * ldc + 8), ri[1]);
        }
    }
}

/// Asks for the `ROWS` rows of `NR` floats at `p` (row stride `ld`) to
/// be brought into L1 while the tile's multiply-adds run: a conv's
/// residual rows lie a whole output plane apart (NCHW), a pattern the
/// hardware prefetchers do not follow, and without this the residual's
/// loads at the end of every tile miss the cache (ResNet's 1×1 64→256
/// conv with its residual: 71 → 97 GFLOP/s in kernels_bench).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_tile<const ROWS: usize>(p: *const f32, ld: usize) {
    use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for i in 0..ROWS {
        let row = p.wrapping_add(i * ld);
        // SAFETY: prefetches never fault, whatever the address.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(row as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(NR - 1) as *const i8);
        }
    }
}

/// AVX2+FMA microkernel on the first `NR / 2` columns of an `MR`-row tile
/// (6 ymm accumulators; one load of B and six broadcasts per step): the
/// tail panel of a GEMM whose columns end just past a panel boundary. It
/// writes those 8 columns only, takes no epilogue (the caller's tail path
/// applies it) and reads only the first `NR / 2` floats of each B row.
///
/// # Safety
/// As [`avx2_fma`] with `post` null, for the tile's first `NR / 2` columns.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_fma_half<const INDIRECT: bool>(kc: usize, rows: &[*const f32; MR], a_cs: isize, b: *const f32, offs: *const isize, c: *mut f32, ldc: usize, acc: bool, post: *const TilePost) {
    use core::arch::x86_64::*;
    debug_assert!(post.is_null());
    // SAFETY (whole body): every pointer dereferenced is inside the tile's
    // first NR/2 columns, the panel's kc rows or A's kc columns of the MR
    // rows (contract).
    unsafe {
        let mut r = [_mm256_setzero_ps(); MR];
        if acc {
            for (i, ri) in r.iter_mut().enumerate() {
                *ri = _mm256_loadu_ps(c.add(i * ldc));
            }
        }
        let mut off = 0isize;
        for l in 0..kc {
            let b0 = _mm256_loadu_ps(b_row::<INDIRECT>(b, offs, l));
            for (i, ri) in r.iter_mut().enumerate() {
                *ri = _mm256_fmadd_ps(_mm256_broadcast_ss(&*rows[i].offset(off)), b0, *ri);
            }
            off = off.wrapping_add(a_cs);
        }
        for (i, ri) in r.iter().enumerate() {
            _mm256_storeu_ps(c.add(i * ldc), *ri);
        }
    }
}

/// AVX-512 wide microkernel: the `ROWS`×`P`·16 tile of `P` panels in
/// `P`·`ROWS` zmm registers (6 rows of 4 panels: 24 of them, with the
/// four loads of B and a broadcast of A 29 of the 32), the last panel's
/// columns masked to the tile's `cols`.
///
/// # Safety
/// See [`Wide`]: as [`portable`] for each panel, the tile's `ROWS` rows
/// and first `cols` columns at `c`, and the CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx512<const INDIRECT: bool, const ROWS: usize, const P: usize>(kc: usize, rows: &[*const f32; MR], a_cs: isize, b: *const f32, pstride: isize, offs: *const isize, c: *mut f32, ldc: usize, acc: bool, cols: usize, post: *const TilePost) {
    use core::arch::x86_64::*;
    debug_assert!(cols > (P - 1) * NR && cols <= P * NR);
    // A panel is one zmm register of floats.
    const L: usize = NR;
    const { assert!(L == 16) };
    // The last panel's real columns.
    let ml: __mmask16 = (((1u32 << (cols - (P - 1) * NR)) - 1) & 0xffff) as __mmask16;
    let last = (P - 1) * L;
    // SAFETY (whole body): every pointer dereferenced is inside the tile
    // (the last panel's columns through the mask), the panels' kc rows,
    // A's kc columns of the ROWS rows or post's terms for the tile
    // (contract).
    unsafe {
        let mut r = [[_mm512_setzero_ps(); P]; ROWS];
        if acc {
            for (i, ri) in r.iter_mut().enumerate() {
                for (q, v) in ri.iter_mut().enumerate().take(P - 1) {
                    *v = _mm512_loadu_ps(c.add(i * ldc + q * L));
                }
                ri[P - 1] = _mm512_maskz_loadu_ps(ml, c.add(i * ldc + last));
            }
        }
        if let Some(p) = post.as_ref() {
            if !p.res.is_null() {
                for q in 0..P {
                    prefetch_tile::<ROWS>(p.res.wrapping_add(q * L), p.res_ld);
                }
            }
        }
        let mut off = 0isize;
        for l in 0..kc {
            let bl = b_row::<INDIRECT>(b, offs, l);
            let x: [__m512; P] = core::array::from_fn(|q| _mm512_loadu_ps(bl.wrapping_offset(q as isize * pstride)));
            for (i, ri) in r.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*rows[i].offset(off));
                for q in 0..P {
                    ri[q] = _mm512_fmadd_ps(av, x[q], ri[q]);
                }
            }
            off = off.wrapping_add(a_cs);
        }
        if let Some(p) = post.as_ref() {
            // The epilogue on the registers, in TilePost::apply's order.
            if !p.rb.is_null() {
                for (i, ri) in r.iter_mut().enumerate() {
                    let v = _mm512_set1_ps(*p.rb.add(i));
                    for x in ri.iter_mut() {
                        *x = _mm512_add_ps(*x, v);
                    }
                }
            }
            if !p.cb.is_null() {
                let v: [__m512; P] = core::array::from_fn(|q| if q + 1 < P { _mm512_loadu_ps(p.cb.add(q * L)) } else { _mm512_maskz_loadu_ps(ml, p.cb.add(last)) });
                for ri in r.iter_mut() {
                    for q in 0..P {
                        ri[q] = _mm512_add_ps(ri[q], v[q]);
                    }
                }
            }
            if !p.res.is_null() {
                for (i, ri) in r.iter_mut().enumerate() {
                    let row = p.res.add(i * p.res_ld);
                    for (q, x) in ri.iter_mut().enumerate().take(P - 1) {
                        *x = _mm512_add_ps(*x, _mm512_loadu_ps(row.add(q * L)));
                    }
                    ri[P - 1] = _mm512_add_ps(ri[P - 1], _mm512_maskz_loadu_ps(ml, row.add(last)));
                }
            }
            if p.clamp {
                let (lo, hi) = (_mm512_set1_ps(p.lo), _mm512_set1_ps(p.hi));
                for ri in r.iter_mut() {
                    for x in ri.iter_mut() {
                        *x = _mm512_min_ps(_mm512_max_ps(*x, lo), hi);
                    }
                }
            }
        }
        for (i, ri) in r.iter().enumerate() {
            for (q, v) in ri.iter().enumerate().take(P - 1) {
                _mm512_storeu_ps(c.add(i * ldc + q * L), *v);
            }
            _mm512_mask_storeu_ps(c.add(i * ldc + last), ml, ri[P - 1]);
        }
    }
}

/// The microkernels a test forces (see `tests::MICRO_OVERRIDE`).
#[cfg(test)]
fn micro_override() -> Option<Family> {
    tests::MICRO_OVERRIDE.with(|o| o.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    type Pair = Family;

    type WidePair = Option<WideFamily>;

    std::thread_local! {
        pub(super) static MICRO_OVERRIDE: core::cell::Cell<Option<Pair>> = const { core::cell::Cell::new(None) };
        /// Some(None): no wide kernel; Some(Some(..)): that one.
        pub(super) static WIDE_OVERRIDE: core::cell::Cell<Option<WidePair>> = const { core::cell::Cell::new(None) };
    }

    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|l| a[i * k + l] as f64 * b[l * n + j] as f64).sum::<f64>() as f32;
            }
        }
        c
    }

    /// `gemm_packed` with `micros`, B packed and B through row offsets,
    /// against f64 sums; C has padding columns that must stay untouched.
    fn check(m: usize, n: usize, k: usize, micros: Pair, wide: WidePair) {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1).collect();
        let want = naive(m, n, k, &a, &b);
        let mut bp = vec![f32::NAN; packed_len(k, n)];
        // SAFETY: b is k×n row-major.
        unsafe { pack_b(&mut bp, b.as_ptr(), n as isize, 1, k, n) };
        // B in place, rows in reverse order with a stride that leaves room
        // for the rounded-up columns.
        let stride = n.div_ceil(NR) * NR + 5;
        let mut rows_b = vec![0.0f32; k.max(1) * stride];
        let offs: Vec<isize> = (0..k).map(|l| ((k - 1 - l) * stride) as isize).collect();
        for l in 0..k {
            rows_b[(k - 1 - l) * stride..][..n].copy_from_slice(&b[l * n..][..n]);
        }
        let a_m = MatA { ptr: a.as_ptr(), rs: k as isize, cs: 1 };
        for operand in [MatB::Packed(&bp), MatB::Rows { base: rows_b.as_ptr(), offs: &offs }] {
            let ldc = n + 3;
            let mut c = vec![1.0f32; m * ldc];
            MICRO_OVERRIDE.with(|o| o.set(Some(micros)));
            WIDE_OVERRIDE.with(|o| o.set(Some(wide)));
            // SAFETY: shapes as documented; rows_b has the rounded-up columns.
            unsafe { gemm_packed(m, n, k, a_m, operand, c.as_mut_ptr(), ldc, true, None) };
            MICRO_OVERRIDE.with(|o| o.set(None));
            WIDE_OVERRIDE.with(|o| o.set(None));
            for i in 0..m {
                for j in 0..ldc {
                    let got = c[i * ldc + j];
                    let w = if j < n { want[i * n + j] + 1.0 } else { 1.0 };
                    assert!((got - w).abs() <= 1e-4 * (1.0 + w.abs()), "{m}x{n}x{k} ({i},{j}): {got} vs {w}");
                }
            }
        }
    }

    /// `gemm_packed` with a [`Post`] is bit-identical to `gemm_packed`
    /// without it followed by the separate epilogue's arithmetic (bias,
    /// then residual, then `max` / `min`), on every tile shape and in
    /// every k block layout; a NaN sum clamps to `lo` as `f32::max` does,
    /// and columns past `n` stay untouched.
    fn check_post(m: usize, n: usize, k: usize, micros: Pair, wide: WidePair) {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1).collect();
        let mut bp = vec![f32::NAN; packed_len(k, n)];
        // SAFETY: b is k×n row-major.
        unsafe { pack_b(&mut bp, b.as_ptr(), n as isize, 1, k, n) };
        let a_m = MatA { ptr: a.as_ptr(), rs: k as isize, cs: 1 };
        let ldc = n + 3;
        let row_bias: Vec<f32> = (0..m).map(|i| (i % 5) as f32 * 0.3 - 0.6).collect();
        let col_bias: Vec<f32> = (0..n).map(|j| (j % 7) as f32 * 0.2 - 0.5).collect();
        // A NaN in the residual makes NaN sums.
        let res: Vec<f32> = (0..m * ldc).map(|i| if i % 29 == 3 { f32::NAN } else { (i % 9) as f32 * 0.25 - 1.0 }).collect();
        let run = |post: Option<&Post<'_>>| {
            let mut c = vec![7.0f32; m * ldc];
            MICRO_OVERRIDE.with(|o| o.set(Some(micros)));
            WIDE_OVERRIDE.with(|o| o.set(Some(wide)));
            // SAFETY: shapes as documented; the post's terms cover m × n.
            unsafe { gemm_packed(m, n, k, a_m, MatB::Packed(&bp), c.as_mut_ptr(), ldc, false, post) };
            MICRO_OVERRIDE.with(|o| o.set(None));
            WIDE_OVERRIDE.with(|o| o.set(None));
            c
        };
        let plain = run(None);
        for (rb, cb, r, clamp) in [
            (true, false, false, None),
            (false, true, true, Some((0.0, f32::INFINITY))),
            (true, false, true, Some((-0.5, 0.75))),
            (false, false, false, Some((1.0, -1.0))),
        ] {
            let post = Post {
                row_bias: rb.then_some(&row_bias[..]),
                col_bias: cb.then_some(&col_bias[..]),
                residual: r.then_some((res.as_ptr(), ldc)),
                clamp,
            };
            let got = run(Some(&post));
            for i in 0..m {
                for j in 0..ldc {
                    let mut want = plain[i * ldc + j];
                    if j < n {
                        if rb {
                            want += row_bias[i];
                        }
                        if cb {
                            want += col_bias[j];
                        }
                        if r {
                            want += res[i * ldc + j];
                        }
                        if let Some((lo, hi)) = clamp {
                            want = want.max(lo).min(hi);
                        }
                    }
                    let g = got[i * ldc + j];
                    assert!(g.to_bits() == want.to_bits() || (g == 0.0 && want == 0.0), "{m}x{n}x{k} {rb} {cb} {r} {clamp:?} ({i},{j}): {g} vs {want}");
                }
            }
        }
    }

    /// The microkernel's panels are the contract's packed GEMM B layout.
    #[test]
    fn pack_b_is_the_contract_layout() {
        for &(k, n) in &[(1, 1), (3, 16), (7, 17), (5, 40)] {
            let b: Vec<f32> = (0..k * n).map(|i| i as f32 + 0.5).collect();
            let mut ours = vec![f32::NAN; packed_len(k, n)];
            // SAFETY: b is k×n row-major.
            unsafe { pack_b(&mut ours, b.as_ptr(), n as isize, 1, k, n) };
            let mut hw = vec![f32::NAN; packed_len(k, n)];
            rbln_hw::ops::pack_gemm_b(&b, k, n, false, &mut hw);
            assert_eq!(ours, hw, "k {k} n {n}");
        }
    }

    #[test]
    fn edges_and_k_blocks_match_naive() {
        let mut micros: Vec<Pair> = vec![Family::portable()];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            micros.push(Family::avx2_fma());
        }
        let mut wides: Vec<WidePair> = vec![None];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            wides.push(Some(WideFamily::avx512()));
        }
        for pair in micros {
            for &wide in &wides {
                // Pairs of full panels, a lone last panel, partial rows.
                // Row counts whose tiles mix 6 and 4 rows (8, 10, 14), end
                // in a partial short tile (3, 7, 13) or a partial full one (5, 11).
                // Last panels of 1..=8 real columns (the half-width kernel)
                // and of 9 (the full one): 17, 33, 40, 8, 49 / 25, 57.
                for &(m, n, k) in &[(1, 1, 1), (6, 16, 3), (7, 17, 5), (13, 40, 300), (250, 33, 520), (5, 3, 0), (6, 32, 4), (11, 64, 257), (3, 80, 9), (8, 16, 7), (10, 48, 33), (14, 17, 260), (4, 16, 2), (6, 8, 5), (12, 25, 70), (18, 57, 300), (54, 49, 260)] {
                    check(m, n, k, pair, wide);
                    check_post(m, n, k, pair, wide);
                }
            }
        }
    }
}
