//! The int8 microkernels: packed A micro-panels, the exactness modes, the
//! AVX2 `maddubs` kernel and the portable scalar one, and the requantising
//! epilogue of a micro-tile.
//!
//! A micro-panel holds `MR` rows of A (mapped to u8: an i8 value `a` is
//! stored as `a + 128`) for all `kg = ⌈k/4⌉` groups of 4 `k`: group `g` is
//! 16 bytes, row `i` at bytes `4i .. 4i+4`, so that one `set1_epi32`
//! broadcasts 4 consecutive `k` of one row against one 32-byte group of a
//! packed B panel (8 columns × 4 `k`). Padding (rows past `m`, `k` past
//! the end) is 0. A second `kg × 16`-byte part holds the sign masks of
//! [`Mode::Sign`].

#[cfg(target_arch = "x86_64")]
use core::arch::x86_64::*;

/// Rows per micro-panel.
pub(crate) const MR: usize = 4;
/// Rows per micro-panel of the VNNI convolution core (`super::vnni`).
pub(crate) const VNNI_MR: usize = 16;
/// Columns per micro-tile (two packed B panels).
pub(crate) const NR: usize = 16;
/// Columns of one packed B panel.
pub(crate) const PANEL: usize = rbln_hw::ops::QGEMM_PANEL;
/// Bytes of one group of a micro-panel.
pub(crate) const GROUP_A: usize = MR * 4;

/// How a micro-panel's products are formed (see the module docs of
/// `qgemm`): both are exact.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    /// `maddubs(a, b)`: the u8 operand is at most 127, or B is 7-bit.
    Plain,
    /// `maddubs(|a'|, b ^ m)` with `a' = a − 128` and `m` its sign as a
    /// byte mask (0xff when `a' < 0`; the second part holds `m`): for
    /// `a' < 0`, `|a'|·!b = a'·b − |a'|`, so `Σ a'·b` is the raw sum plus
    /// [`PanelInfo::rowadd`] (`Σ |a'|` over the negative `a'` of a row).
    /// Every product is in `−128·128 ..= 127·128` (`!b` and `b` are
    /// bytes), so pair sums lie in `−32768 ..= 32512`: exact for any B.
    /// One xor per (row, panel) beyond plain: it runs on every vector
    /// pipe, where `psignb` competed with the multiplies.
    Sign,
}

/// What the epilogue needs to know about a finished micro-panel:
/// `Σ a·b = raw + off·colsum[j]`, and the rows' sums of `a` (u8 domain).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PanelInfo {
    pub mode: Mode,
    pub off: i32,
    pub rowsum: [i32; MR],
    /// Added to every column of row `i` of the raw sums (the sign mode's
    /// correction; 0 otherwise).
    pub rowadd: [i32; MR],
}

/// Properties of B that pick the modes, from one scan per call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BStats {
    /// All `|b| ≤ 64`.
    pub seven_bit: bool,
    /// Some column has a non-zero zero point (the epilogue then needs the
    /// rows' sums of A).
    pub zero_points: bool,
}

/// The instruction set a call's integer kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Portable,
    /// `maddubs` (u8·i8 pairs summed into saturating i16): the modes keep
    /// it exact.
    Avx2,
    /// AVX2 plus `vpdpbusd` on ymm (AVX-512 VNNI): u8·i8 quadruples summed
    /// straight into i32, exact for any operands, one instruction where
    /// `maddubs` needs three: every micro-panel is plain.
    Vnni,
    /// VNNI, plus the AMX tile unit (`tdpbsud` on 16 × 64-byte tiles) for
    /// convolutions whose weights are in the tile layout ([`super::amx`]).
    Amx,
}

impl Isa {
    /// The best this CPU has.
    pub(crate) fn best() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if have_avx2() && crate::fastmath::avx512_allowed() && std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512vl") {
                return if super::amx::available() { Isa::Amx } else { Isa::Vnni };
            }
        }
        if have_avx2() {
            Isa::Avx2
        } else {
            Isa::Portable
        }
    }

    /// Whether the AVX2 paths (scans, epilogues) may run.
    pub(crate) fn simd(self) -> bool {
        self != Isa::Portable
    }

    /// Whether `vpdpbusd` may run (VNNI, or AMX which implies it).
    pub(crate) fn vnni(self) -> bool {
        matches!(self, Isa::Vnni | Isa::Amx)
    }
}

/// Whether the AVX2 kernels can run on this CPU.
#[inline]
pub(crate) fn have_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Column sums (`n` padded to [`PANEL`], written to `colsum`, wrapping)
/// and min / max of one packed B (`kp = 4·kg` rows).
pub(crate) fn scan_b(b: &[u8], kg: usize, colsum: &mut [i32], simd: bool) -> (i8, i8) {
    let panel_len = kg * 32;
    debug_assert_eq!(colsum.len() * kg * 4, b.len());
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: AVX2 is available (`simd` is only set when it is).
        return unsafe { scan_b_avx2(b, kg, colsum) };
    }
    let _ = simd;
    let (mut lo, mut hi) = (i8::MAX, i8::MIN);
    for (p, panel) in b.chunks_exact(panel_len.max(1)).enumerate().take(colsum.len() / PANEL) {
        let cs = &mut colsum[p * PANEL..][..PANEL];
        cs.fill(0);
        for grp in panel.chunks_exact(32) {
            for (j, c) in grp.chunks_exact(4).enumerate() {
                for &v in c {
                    let v = v as i8;
                    lo = lo.min(v);
                    hi = hi.max(v);
                    cs[j] = cs[j].wrapping_add(v as i32);
                }
            }
        }
    }
    if kg == 0 {
        colsum.fill(0);
    }
    (lo, hi)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scan_b_avx2(b: &[u8], kg: usize, colsum: &mut [i32]) -> (i8, i8) {
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    let mut vmin = _mm256_set1_epi8(i8::MAX);
    let mut vmax = _mm256_set1_epi8(i8::MIN);
    for (p, cs) in colsum.chunks_exact_mut(PANEL).enumerate() {
        let panel = &b[p * kg * 32..][..kg * 32];
        let mut acc = _mm256_setzero_si256();
        for grp in panel.chunks_exact(32) {
            // SAFETY: `grp` is 32 bytes.
            let v = unsafe { _mm256_loadu_si256(grp.as_ptr() as *const __m256i) };
            vmin = _mm256_min_epi8(vmin, v);
            vmax = _mm256_max_epi8(vmax, v);
            // 1·b0 + 1·b1 never saturates; then the 4 k of a column.
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16));
        }
        // SAFETY: `cs` is 8 i32.
        unsafe { _mm256_storeu_si256(cs.as_mut_ptr() as *mut __m256i, acc) };
    }
    let mut mins = [0i8; 32];
    let mut maxs = [0i8; 32];
    // SAFETY: both arrays are 32 bytes.
    unsafe {
        _mm256_storeu_si256(mins.as_mut_ptr() as *mut __m256i, vmin);
        _mm256_storeu_si256(maxs.as_mut_ptr() as *mut __m256i, vmax);
    }
    (mins.iter().copied().min().unwrap_or(i8::MAX), maxs.iter().copied().max().unwrap_or(i8::MIN))
}

/// Micro-panels finished per mode (plain, plain on a − 128, sign),
/// for the tests to check that every path ran.
#[cfg(test)]
pub(crate) static MODES_SEEN: [core::sync::atomic::AtomicUsize; 3] = [const { core::sync::atomic::AtomicUsize::new(0) }; 3];

/// Picks the mode of a micro-panel whose plain part (the first `kg·16`
/// bytes of `panel`, `2·kg·16` long) is filled, rewrites it for that mode
/// and returns its [`PanelInfo`]. `rows` rows and `k` are real (the rest
/// is padding, ignored when choosing). Without `simd`, always plain.
pub(crate) fn finish_panel(panel: &mut [u8], kg: usize, k: usize, rows: usize, b: BStats, isa: Isa) -> PanelInfo {
    let (simd, exact) = (isa.simd(), isa.vnni());
    if (!simd || b.seven_bit || exact) && !b.zero_points {
        // Plain whatever A holds, and no row sums needed (symmetric
        // weights): nothing to scan.
        #[cfg(test)]
        MODES_SEEN[0].fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        return PanelInfo { mode: Mode::Plain, off: 0, rowsum: [0; MR], rowadd: [0; MR] };
    }
    let (plain, second) = panel.split_at_mut(kg * GROUP_A);
    // Byte masks of the real rows, and of the real k of the last group.
    let mut rmask = [0u8; GROUP_A];
    let mut lmask = [0u8; GROUP_A];
    let kl = if k.is_multiple_of(4) { 4 } else { k % 4 };
    for i in 0..GROUP_A {
        rmask[i] = if i / 4 < rows { 0xff } else { 0 };
        lmask[i] = if i / 4 < rows && i % 4 < kl { 0xff } else { 0 };
    }
    #[cfg(target_arch = "x86_64")]
    let (rowsum, lo, hi) = if simd {
        // SAFETY: AVX2 is available (`simd`).
        unsafe { scan_panel_avx2(plain, kg, &rmask, &lmask) }
    } else {
        scan_panel(plain, kg, &rmask, &lmask)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (rowsum, lo, hi) = scan_panel(plain, kg, &rmask, &lmask);
    let info = |mode, off, rowadd| {
        #[cfg(test)]
        MODES_SEEN[match (mode, off) {
            (Mode::Plain, 0) => 0,
            (Mode::Plain, _) => 1,
            (Mode::Sign, _) => 2,
        }]
        .fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        PanelInfo { mode, off, rowsum, rowadd }
    };
    if !simd || hi <= 127 || b.seven_bit || exact {
        return info(Mode::Plain, 0, [0; MR]);
    }
    if lo >= 128 {
        // a − 128 ∈ 0..=127 (padding becomes 128, against B's zero rows).
        plain.iter_mut().for_each(|v| *v ^= 0x80);
        return info(Mode::Plain, 128, [0; MR]);
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: AVX2 is available (`simd`).
        let rowadd = unsafe { sign_rewrite_avx2(plain, second) };
        info(Mode::Sign, 128, rowadd)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (second, info);
        unreachable!("the sign mode needs AVX2")
    }
}

/// Rewrites a micro-panel for [`Mode::Sign`]: `plain` (u8 `a`) becomes
/// `|a − 128|`, `second` the sign masks; returns each row's `Σ |a'|` over
/// its negative `a'` ([`PanelInfo::rowadd`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sign_rewrite_avx2(plain: &mut [u8], second: &mut [u8]) -> [i32; MR] {
    let c80 = _mm_set1_epi8(-128);
    let ones8 = _mm_set1_epi8(1);
    let ones16 = _mm_set1_epi16(1);
    let mut sum = _mm_setzero_si128();
    for (p, s) in plain.chunks_exact_mut(GROUP_A).zip(second.chunks_exact_mut(GROUP_A)) {
        // SAFETY (loads / stores): `p` and `s` are 16 bytes.
        let a = _mm_xor_si128(unsafe { _mm_loadu_si128(p.as_ptr() as *const __m128i) }, c80);
        let m = _mm_cmpgt_epi8(_mm_setzero_si128(), a);
        // |−128| is 0x80 = 128 as u8.
        let u = _mm_abs_epi8(a);
        // SAFETY: as above.
        unsafe {
            _mm_storeu_si128(p.as_mut_ptr() as *mut __m128i, u);
            _mm_storeu_si128(s.as_mut_ptr() as *mut __m128i, m);
        }
        // Pairs of u8 ≤ 256, then the 4 bytes of each row (i32 lane i = row i).
        sum = _mm_add_epi32(sum, _mm_madd_epi16(_mm_maddubs_epi16(_mm_and_si128(u, m), ones8), ones16));
    }
    let mut r = [0i32; MR];
    // SAFETY: 16 bytes.
    unsafe { _mm_storeu_si128(r.as_mut_ptr() as *mut __m128i, sum) };
    r
}

/// Row sums, min and max (real bytes only) of a micro-panel's plain part.
fn scan_panel(plain: &[u8], kg: usize, rmask: &[u8; GROUP_A], lmask: &[u8; GROUP_A]) -> ([i32; MR], u8, u8) {
    let mut rowsum = [0i32; MR];
    let (mut lo, mut hi) = (u8::MAX, u8::MIN);
    for (g, grp) in plain.chunks_exact(GROUP_A).enumerate() {
        let m = if g + 1 == kg { lmask } else { rmask };
        for (i, &v) in grp.iter().enumerate() {
            rowsum[i / 4] = rowsum[i / 4].wrapping_add(v as i32);
            if m[i] != 0 {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
    }
    (rowsum, lo, hi)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scan_panel_avx2(plain: &[u8], kg: usize, rmask: &[u8; GROUP_A], lmask: &[u8; GROUP_A]) -> ([i32; MR], u8, u8) {
    // SAFETY (loads / stores): every operand is 16 bytes.
    let ld = |p: &[u8]| unsafe { _mm_loadu_si128(p.as_ptr() as *const __m128i) };
    let (rm, lm) = (ld(rmask), ld(lmask));
    let all = _mm_set1_epi8(-1);
    let ones8 = _mm_set1_epi8(1);
    let ones16 = _mm_set1_epi16(1);
    let mut sum = _mm_setzero_si128();
    let mut vmin = all;
    let mut vmax = _mm_setzero_si128();
    for (g, grp) in plain.chunks_exact(GROUP_A).enumerate() {
        let v = ld(grp);
        let m = if g + 1 == kg { lm } else { rm };
        vmax = _mm_max_epu8(vmax, _mm_and_si128(v, m));
        vmin = _mm_min_epu8(vmin, _mm_or_si128(v, _mm_xor_si128(m, all)));
        // u8 · 1 pairs ≤ 510, then the 4 bytes of each row, in i32 (wrapping).
        sum = _mm_add_epi32(sum, _mm_madd_epi16(_mm_maddubs_epi16(v, ones8), ones16));
    }
    let (mut rs, mut mins, mut maxs) = ([0i32; MR], [0u8; 16], [0u8; 16]);
    // SAFETY: 16-byte arrays.
    unsafe {
        _mm_storeu_si128(rs.as_mut_ptr() as *mut __m128i, sum);
        _mm_storeu_si128(mins.as_mut_ptr() as *mut __m128i, vmin);
        _mm_storeu_si128(maxs.as_mut_ptr() as *mut __m128i, vmax);
    }
    (rs, mins.iter().copied().min().unwrap_or(0), maxs.iter().copied().max().unwrap_or(0))
}

/// `out[i][j] (+)= Σ_g Σ_kk A(i, 4g+kk)·B(4g+kk, j)` (raw, by `mode`,
/// wrapping; `out` is overwritten when `first`, else added to) for the
/// `kg` groups of a micro-panel at `a` (plain part) / `a2` (second part)
/// and `np` (1 or 2) B panels at `b`, `b_stride` bytes apart, each `kg·32`
/// bytes (columns of a missing second panel are 0 after a `first` call).
///
/// # Safety
/// `a`, `a2` are readable for `kg·16` bytes (`a2` only read by
/// [`Mode::Sign`]); `b .. b + (np−1)·b_stride + kg·32` is readable;
/// `isa` only as this CPU has it.
#[inline]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn micro(a: *const u8, a2: *const u8, b: *const u8, b_stride: usize, np: usize, kg: usize, mode: Mode, isa: Isa, first: bool, out: &mut [[i32; NR]; MR]) {
    debug_assert!((1..=2).contains(&np));
    #[cfg(target_arch = "x86_64")]
    if isa.vnni() && mode == Mode::Plain {
        // SAFETY: as documented by the caller.
        unsafe {
            if np == 2 {
                micro_vnni_wide(a, b, b_stride, kg, first, out)
            } else {
                micro_vnni::<1>(a, b, b_stride, kg, first, out)
            }
        }
        return;
    }
    let simd = isa.simd();
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: as documented by the caller.
        unsafe {
            match (mode, np) {
                (Mode::Plain, 2) => micro_avx2::<0, 2>(a, a2, b, b_stride, kg, first, out),
                (Mode::Plain, _) => micro_avx2::<0, 1>(a, a2, b, b_stride, kg, first, out),
                (Mode::Sign, 2) => micro_avx2::<1, 2>(a, a2, b, b_stride, kg, first, out),
                (Mode::Sign, _) => micro_avx2::<1, 1>(a, a2, b, b_stride, kg, first, out),
            }
        }
        return;
    }
    let _ = (simd, mode, a2);
    // Portable: the plain u8 values (no mode is ever chosen without SIMD).
    if first {
        for row in out.iter_mut() {
            row.fill(0);
        }
    }
    // SAFETY: the caller's contract.
    let a = unsafe { core::slice::from_raw_parts(a, kg * GROUP_A) };
    for p in 0..np {
        // SAFETY: panel p is readable (caller).
        let bp = unsafe { core::slice::from_raw_parts(b.add(p * b_stride), kg * 32) };
        for g in 0..kg {
            let ag = &a[g * GROUP_A..][..GROUP_A];
            let bg = &bp[g * 32..][..32];
            for (i, row) in out.iter_mut().enumerate() {
                for jj in 0..PANEL {
                    let mut s = 0i32;
                    for kk in 0..4 {
                        s += ag[i * 4 + kk] as i32 * bg[jj * 4 + kk] as i8 as i32;
                    }
                    row[p * PANEL + jj] = row[p * PANEL + jj].wrapping_add(s);
                }
            }
        }
    }
}

/// The AVX2 micro-kernel: `MODE` 0 plain, 1 sign; `NP` panels.
///
/// # Safety
/// AVX2 available; `a`, `a2` hold `kg·16` bytes; the `NP` panels are
/// readable (see [`micro`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn micro_avx2<const MODE: u8, const NP: usize>(a: *const u8, a2: *const u8, b: *const u8, b_stride: usize, kg: usize, first: bool, out: &mut [[i32; NR]; MR]) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_si256(); 2]; MR];
    if first && NP == 1 {
        // The columns of the missing panel: 0 (as when k is 0).
        for row in out.iter_mut() {
            row.fill(0);
        }
    }
    if !first {
        for (row, acc) in out.iter().zip(acc.iter_mut()) {
            for p in 0..NP {
                // SAFETY: 8 i32 at row[8p..].
                acc[p] = unsafe { _mm256_loadu_si256(row[p * PANEL..].as_ptr() as *const __m256i) };
            }
        }
    }
    for g in 0..kg {
        let mut vb = [_mm256_setzero_si256(); 2];
        for (p, v) in vb.iter_mut().enumerate().take(NP) {
            // SAFETY: group g of panel p is inside the readable B (caller).
            *v = unsafe { _mm256_loadu_si256(b.add(p * b_stride + g * 32) as *const __m256i) };
        }
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: byte g·16 + 4i + 3 < kg·16 (caller).
            let x = unsafe { (a.add(g * GROUP_A + 4 * i) as *const i32).read_unaligned() };
            let va = _mm256_set1_epi32(x);
            if MODE == 0 {
                for p in 0..NP {
                    acc[p] = _mm256_add_epi32(acc[p], _mm256_madd_epi16(_mm256_maddubs_epi16(va, vb[p]), ones));
                }
            } else {
                // SAFETY: as for `a`.
                let y = unsafe { (a2.add(g * GROUP_A + 4 * i) as *const i32).read_unaligned() };
                let v2 = _mm256_set1_epi32(y);
                for p in 0..NP {
                    // b, or !b where a' < 0 (see `Mode::Sign`).
                    let t = _mm256_maddubs_epi16(va, _mm256_xor_si256(vb[p], v2));
                    acc[p] = _mm256_add_epi32(acc[p], _mm256_madd_epi16(t, ones));
                }
            }
        }
    }
    for (row, acc) in out.iter_mut().zip(acc.iter()) {
        for p in 0..NP {
            // SAFETY: 8 i32 at row[8p..].
            unsafe { _mm256_storeu_si256(row[p * PANEL..].as_mut_ptr() as *mut __m256i, acc[p]) };
        }
    }
}

/// The VNNI micro-kernel (plain mode): `vpdpbusd` adds each u8·i8
/// quadruple's sum to its i32 lane.
///
/// # Safety
/// AVX2, AVX-512 VNNI and VL available; as [`micro_avx2`] otherwise.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
unsafe fn micro_vnni<const NP: usize>(a: *const u8, b: *const u8, b_stride: usize, kg: usize, first: bool, out: &mut [[i32; NR]; MR]) {
    let mut acc = [[_mm256_setzero_si256(); 2]; MR];
    if first && NP == 1 {
        for row in out.iter_mut() {
            row.fill(0);
        }
    }
    if !first {
        for (row, acc) in out.iter().zip(acc.iter_mut()) {
            for p in 0..NP {
                // SAFETY: 8 i32 at row[8p..].
                acc[p] = unsafe { _mm256_loadu_si256(row[p * PANEL..].as_ptr() as *const __m256i) };
            }
        }
    }
    for g in 0..kg {
        let mut vb = [_mm256_setzero_si256(); 2];
        for (p, v) in vb.iter_mut().enumerate().take(NP) {
            // SAFETY: group g of panel p is inside the readable B (caller).
            *v = unsafe { _mm256_loadu_si256(b.add(p * b_stride + g * 32) as *const __m256i) };
        }
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: byte g·16 + 4i + 3 < kg·16 (caller).
            let va = _mm256_set1_epi32(unsafe { (a.add(g * GROUP_A + 4 * i) as *const i32).read_unaligned() });
            for p in 0..NP {
                acc[p] = _mm256_dpbusd_epi32(acc[p], va, vb[p]);
            }
        }
    }
    for (row, acc) in out.iter_mut().zip(acc.iter()) {
        for p in 0..NP {
            // SAFETY: 8 i32 at row[8p..].
            unsafe { _mm256_storeu_si256(row[p * PANEL..].as_mut_ptr() as *mut __m256i, acc[p]) };
        }
    }
}

/// The VNNI micro-kernel on both panels at once: each zmm holds a row's
/// 16 columns (panel 0 in the low half), and even and odd groups go to
/// separate accumulators, so eight independent `vpdpbusd` chains hide
/// the instruction's latency.
///
/// # Safety
/// AVX-512F, VNNI and VL available; as [`micro_avx2`] with two panels.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512vnni,avx512vl")]
unsafe fn micro_vnni_wide(a: *const u8, b: *const u8, b_stride: usize, kg: usize, first: bool, out: &mut [[i32; NR]; MR]) {
    let mut even = [_mm512_setzero_si512(); MR];
    let mut odd = [_mm512_setzero_si512(); MR];
    if !first {
        for (row, acc) in out.iter().zip(even.iter_mut()) {
            // SAFETY: 16 i32 in the row.
            *acc = unsafe { _mm512_loadu_si512(row.as_ptr() as *const __m512i) };
        }
    }
    // SAFETY (loads below): group g of both panels is inside the readable
    // B, and bytes g·16 .. g·16 + 16 of A exist (caller).
    let group = |g: usize| unsafe {
        let lo = _mm256_loadu_si256(b.add(g * 32) as *const __m256i);
        let hi = _mm256_loadu_si256(b.add(b_stride + g * 32) as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    };
    let row_a = |g: usize, i: usize| unsafe { _mm512_set1_epi32((a.add(g * GROUP_A + 4 * i) as *const i32).read_unaligned()) };
    let mut g = 0;
    while g + 1 < kg {
        let (v0, v1) = (group(g), group(g + 1));
        for i in 0..MR {
            even[i] = _mm512_dpbusd_epi32(even[i], row_a(g, i), v0);
            odd[i] = _mm512_dpbusd_epi32(odd[i], row_a(g + 1, i), v1);
        }
        g += 2;
    }
    if g < kg {
        let v0 = group(g);
        for (i, acc) in even.iter_mut().enumerate() {
            *acc = _mm512_dpbusd_epi32(*acc, row_a(g, i), v0);
        }
    }
    for (i, row) in out.iter_mut().enumerate() {
        // SAFETY: 16 i32 in the row.
        unsafe { _mm512_storeu_si512(row.as_mut_ptr() as *mut __m512i, _mm512_add_epi32(even[i], odd[i])) };
    }
}

/// Per-column terms of the epilogue, `n` padded to [`NR`] (zeros):
/// `acc[i][j] = raw + cconst[j] + off·colsum[j] − zb[j]·rowsum[i] + rowadd[i]`,
/// then scaled by `scale[j]`.
#[derive(Clone, Copy)]
pub(crate) struct Cols<'a> {
    pub colsum: &'a [i32],
    pub cconst: &'a [i32],
    pub zb: &'a [i32],
    pub scale: &'a [f32],
}

/// The output kind of an epilogue.
#[derive(Clone, Copy)]
pub(crate) enum OutKind {
    /// u8 / i8 bytes: `clamp(round_even(acc·scale) + zero, min, max)`.
    Int { zero: i32, min: i32, max: i32 },
    /// `acc·scale`, optionally `max(0, ·)`.
    F32 { relu: bool },
}

/// The values of one micro-tile, before they are stored.
pub(crate) enum TileVals {
    Int([[i32; NR]; MR]),
    F32([[f32; NR]; MR]),
}

/// Applies the epilogue to the raw micro-tile `raw` (columns `j0 .. j0+NR`
/// of `cols`).
pub(crate) fn epilogue(raw: &[[i32; NR]; MR], info: &PanelInfo, cols: &Cols<'_>, j0: usize, kind: OutKind, simd: bool) -> TileVals {
    let cs = &cols.colsum[j0..][..NR];
    let cc = &cols.cconst[j0..][..NR];
    let zb = &cols.zb[j0..][..NR];
    let sc = &cols.scale[j0..][..NR];
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: AVX2 is available (`simd`).
        return unsafe { epilogue_avx2(raw, info, cs, cc, zb, sc, kind) };
    }
    let _ = simd;
    let mut acc = [[0i32; NR]; MR];
    for i in 0..MR {
        for j in 0..NR {
            acc[i][j] = raw[i][j]
                .wrapping_add(cc[j])
                .wrapping_add(info.off.wrapping_mul(cs[j]))
                .wrapping_sub(zb[j].wrapping_mul(info.rowsum[i]))
                .wrapping_add(info.rowadd[i]);
        }
    }
    match kind {
        OutKind::Int { zero, min, max } => {
            let mut v = [[0i32; NR]; MR];
            for i in 0..MR {
                for j in 0..NR {
                    v[i][j] = requant(acc[i][j], sc[j], zero, min, max);
                }
            }
            TileVals::Int(v)
        }
        OutKind::F32 { relu } => {
            let mut v = [[0f32; NR]; MR];
            for i in 0..MR {
                for j in 0..NR {
                    v[i][j] = to_f32(acc[i][j], sc[j], relu);
                }
            }
            TileVals::F32(v)
        }
    }
}

/// `clamp(round_even(acc·scale) + zero, min, max)`, in f32.
#[inline]
pub(crate) fn requant(acc: i32, scale: f32, zero: i32, min: i32, max: i32) -> i32 {
    let x = (acc as f32 * scale).round_ties_even() + zero as f32;
    x.max(min as f32).min(max as f32) as i32
}

/// `acc·scale`, with relu `x > 0 ? x : 0`.
#[inline]
// `!(x > 0.0)`: NaN goes to 0 too.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub(crate) fn to_f32(acc: i32, scale: f32, relu: bool) -> f32 {
    let x = acc as f32 * scale;
    if relu && !(x > 0.0) {
        0.0
    } else {
        x
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::needless_range_loop)] // rows and halves index several arrays at once
unsafe fn epilogue_avx2(raw: &[[i32; NR]; MR], info: &PanelInfo, cs: &[i32], cc: &[i32], zb: &[i32], sc: &[f32], kind: OutKind) -> TileVals {
    // SAFETY (all loads / stores below): every slice and row has NR = 16
    // elements; h ∈ {0, 8}.
    let ld = |s: &[i32], h: usize| unsafe { _mm256_loadu_si256(s[h..].as_ptr() as *const __m256i) };
    let off = _mm256_set1_epi32(info.off);
    let mut acc = [[_mm256_setzero_si256(); 2]; MR];
    for h in 0..2 {
        let base = _mm256_add_epi32(ld(cc, h * 8), _mm256_mullo_epi32(off, ld(cs, h * 8)));
        let z = ld(zb, h * 8);
        for i in 0..MR {
            let r = _mm256_sub_epi32(ld(&raw[i], h * 8), _mm256_mullo_epi32(z, _mm256_set1_epi32(info.rowsum[i])));
            acc[i][h] = _mm256_add_epi32(_mm256_add_epi32(r, base), _mm256_set1_epi32(info.rowadd[i]));
        }
    }
    // SAFETY: as above.
    let scale = unsafe { [_mm256_loadu_ps(sc.as_ptr()), _mm256_loadu_ps(sc[8..].as_ptr())] };
    match kind {
        OutKind::Int { zero, min, max } => {
            let (z, lo, hi) = (_mm256_set1_ps(zero as f32), _mm256_set1_ps(min as f32), _mm256_set1_ps(max as f32));
            let mut v = [[0i32; NR]; MR];
            for i in 0..MR {
                for h in 0..2 {
                    let x = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[i][h]), scale[h]);
                    let x = _mm256_add_ps(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x), z);
                    let x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
                    // SAFETY: as above.
                    unsafe { _mm256_storeu_si256(v[i][h * 8..].as_mut_ptr() as *mut __m256i, _mm256_cvtps_epi32(x)) };
                }
            }
            TileVals::Int(v)
        }
        OutKind::F32 { relu } => {
            let zero = _mm256_setzero_ps();
            let mut v = [[0f32; NR]; MR];
            for i in 0..MR {
                for h in 0..2 {
                    let mut x = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[i][h]), scale[h]);
                    if relu {
                        x = _mm256_max_ps(x, zero);
                    }
                    // SAFETY: as above.
                    unsafe { _mm256_storeu_ps(v[i][h * 8..].as_mut_ptr(), x) };
                }
            }
            TileVals::F32(v)
        }
    }
}
