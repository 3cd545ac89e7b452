//! The GEMM engine under [`gemm()`](crate::gemm) and the convolutions:
//! a BLIS-style register-blocked microkernel over a B operand packed into
//! column panels.
//!
//! `C[m×n] (+)= A[m×k] · B[k×n]`, where
//! - `A` is read in place through arbitrary strides (its elements are
//!   broadcast one at a time, so no packing is needed: a convolution's
//!   weights are used as stored),
//! - `B` is packed by the caller into [`NR`]-column panels: panel `p` holds
//!   columns `p·NR .. p·NR+NR` as `k` rows of `NR` contiguous floats
//!   (zero-padded past `n`). Convolutions write their im2col columns
//!   straight into this layout.
//!
//! The microkernel keeps an [`MR`]×[`NR`] tile of `C` in 12 AVX2 registers
//! and does 12 fused multiply-adds per two loads of `B` and six broadcasts
//! of `A`; the driver blocks `k` so a panel stays in L1 and `m` so the
//! block of `A` stays in L2. Hosts without AVX2+FMA run a portable kernel
//! of the same shape.

/// Rows of `C` per microkernel tile.
pub(crate) const MR: usize = 6;
/// Columns of `C` per microkernel tile = width of a packed `B` panel.
pub(crate) const NR: usize = 16;
/// `k` per block: a `KC`×`NR` panel of `B` (16 KiB) stays in L1.
const KC: usize = 256;
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
            if cs == 1 {
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

/// A microkernel: `tile[MR×NR] (row stride ldc) (+)= A'[MR×kc] · Bpanel`,
/// where row `i` of `A'` starts at `rows[i]` and steps by `a_cs`.
type Micro = unsafe fn(kc: usize, rows: &[*const f32; MR], a_cs: isize, b: *const f32, c: *mut f32, ldc: usize, acc: bool);

fn select() -> Micro {
    #[cfg(test)]
    if let Some(m) = micro_override() {
        return m;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        return avx2_fma;
    }
    portable
}

/// `C[m×n] (row stride ldc) = A·B (+ C if accumulate)` on the calling
/// thread, with `bp` the packed `B` ([`pack_b`]).
///
/// # Safety
/// `a` must be readable for every `(i, l)`, `i < m`, `l < k`; `c + i·ldc + j`
/// (`i < m`, `j < n`) writable (and readable if `accumulate`) and not
/// overlapping `a` or `bp`.
pub(crate) unsafe fn gemm_packed(m: usize, n: usize, k: usize, a: MatA, bp: &[f32], c: *mut f32, ldc: usize, accumulate: bool) {
    debug_assert_eq!(bp.len(), packed_len(k, n));
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
        return;
    }
    let micro = select();
    let panels = n.div_ceil(NR);
    let mut k0 = 0;
    while k0 < k {
        let kc = KC.min(k - k0);
        let acc = accumulate || k0 > 0;
        let mut i0 = 0;
        while i0 < m {
            let mc = MC.min(m - i0);
            for p in 0..panels {
                let j0 = p * NR;
                let nr = NR.min(n - j0);
                let b = bp[p * k * NR + k0 * NR..].as_ptr();
                let mut i = i0;
                while i < i0 + mc {
                    let mr = MR.min(i0 + mc - i);
                    // Rows past `m` repeat the last valid row: always
                    // readable, and their results are discarded.
                    let rows: [*const f32; MR] = core::array::from_fn(|r| {
                        let row = (i + r.min(mr - 1)) as isize;
                        // SAFETY: row < m, k0 < k: inside A.
                        unsafe { a.ptr.offset(row * a.rs + k0 as isize * a.cs) }
                    });
                    // SAFETY: (i, j0) is inside C.
                    let ct = unsafe { c.add(i * ldc + j0) };
                    if mr == MR && nr == NR {
                        // SAFETY: the full tile is inside C; rows and b
                        // cover kc steps (caller's contract, packed_len).
                        unsafe { micro(kc, &rows, a.cs, b, ct, ldc, acc) };
                    } else {
                        let mut tile = [0.0f32; MR * NR];
                        if acc {
                            for r in 0..mr {
                                // SAFETY: row r < mr of the tile, nr columns.
                                let src = unsafe { core::slice::from_raw_parts(ct.add(r * ldc), nr) };
                                tile[r * NR..r * NR + nr].copy_from_slice(src);
                            }
                        }
                        // SAFETY: `tile` is MR×NR with row stride NR.
                        unsafe { micro(kc, &rows, a.cs, b, tile.as_mut_ptr(), NR, acc) };
                        for r in 0..mr {
                            // SAFETY: as above.
                            let dst = unsafe { core::slice::from_raw_parts_mut(ct.add(r * ldc), nr) };
                            dst.copy_from_slice(&tile[r * NR..r * NR + nr]);
                        }
                    }
                    i += mr;
                }
            }
            i0 += mc;
        }
        k0 += kc;
    }
}

/// Portable microkernel (the compiler vectorises the 16-wide rows).
///
/// # Safety
/// See [`Micro`]: `rows[i] + l·a_cs` and `b + l·NR + j` readable for
/// `l < kc`, the tile at `c` writable (readable if `acc`).
unsafe fn portable(kc: usize, rows: &[*const f32; MR], a_cs: isize, b: *const f32, c: *mut f32, ldc: usize, acc: bool) {
    let mut t = [[0.0f32; NR]; MR];
    if acc {
        for (i, row) in t.iter_mut().enumerate() {
            // SAFETY: tile row i (contract).
            row.copy_from_slice(unsafe { core::slice::from_raw_parts(c.add(i * ldc), NR) });
        }
    }
    for l in 0..kc {
        // SAFETY: panel row l (contract).
        let bl = unsafe { &*(b.add(l * NR) as *const [f32; NR]) };
        for (i, row) in t.iter_mut().enumerate() {
            // SAFETY: A element (i, l) (contract).
            let av = unsafe { *rows[i].offset(l as isize * a_cs) };
            for (x, &bv) in row.iter_mut().zip(bl) {
                *x += av * bv;
            }
        }
    }
    for (i, row) in t.iter().enumerate() {
        // SAFETY: tile row i (contract).
        unsafe { core::slice::from_raw_parts_mut(c.add(i * ldc), NR) }.copy_from_slice(row);
    }
}

/// AVX2+FMA microkernel: the 6×16 tile in 12 ymm registers.
///
/// # Safety
/// As [`portable`], and the CPU supports AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_fma(kc: usize, rows: &[*const f32; MR], a_cs: isize, b: *const f32, c: *mut f32, ldc: usize, acc: bool) {
    use core::arch::x86_64::*;
    // SAFETY (whole body): every pointer dereferenced is inside the tile,
    // the panel's kc rows or A's kc columns of the six rows (contract).
    unsafe {
        let mut r = [[_mm256_setzero_ps(); 2]; MR];
        if acc {
            for (i, ri) in r.iter_mut().enumerate() {
                ri[0] = _mm256_loadu_ps(c.add(i * ldc));
                ri[1] = _mm256_loadu_ps(c.add(i * ldc + 8));
            }
        }
        let mut b = b;
        let mut off = 0isize;
        for _ in 0..kc {
            let b0 = _mm256_loadu_ps(b);
            let b1 = _mm256_loadu_ps(b.add(8));
            for (i, ri) in r.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*rows[i].offset(off));
                ri[0] = _mm256_fmadd_ps(av, b0, ri[0]);
                ri[1] = _mm256_fmadd_ps(av, b1, ri[1]);
            }
            b = b.add(NR);
            off += a_cs;
        }
        for (i, ri) in r.iter().enumerate() {
            _mm256_storeu_ps(c.add(i * ldc), ri[0]);
            _mm256_storeu_ps(c.add(i * ldc + 8), ri[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|l| a[i * k + l] as f64 * b[l * n + j] as f64).sum::<f64>() as f32;
            }
        }
        c
    }

    fn check(m: usize, n: usize, k: usize, micro: Micro) {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1).collect();
        let mut bp = vec![f32::NAN; packed_len(k, n)];
        // SAFETY: b is k×n row-major.
        unsafe { pack_b(&mut bp, b.as_ptr(), n as isize, 1, k, n) };
        let ldc = n + 3;
        let mut c = vec![1.0f32; m * ldc];
        let a_m = MatA { ptr: a.as_ptr(), rs: k as isize, cs: 1 };
        // SAFETY: shapes as documented; padding columns of C untouched.
        unsafe { run_with(micro, m, n, k, a_m, &bp, c.as_mut_ptr(), ldc, true) };
        let want = naive(m, n, k, &a, &b);
        for i in 0..m {
            for j in 0..ldc {
                let got = c[i * ldc + j];
                let w = if j < n { want[i * n + j] + 1.0 } else { 1.0 };
                assert!((got - w).abs() <= 1e-4 * (1.0 + w.abs()), "{m}x{n}x{k} ({i},{j}): {got} vs {w}");
            }
        }
    }

    /// [`gemm_packed`] with a given microkernel.
    unsafe fn run_with(micro: Micro, m: usize, n: usize, k: usize, a: MatA, bp: &[f32], c: *mut f32, ldc: usize, acc: bool) {
        MICRO_OVERRIDE.with(|o| o.set(Some(micro)));
        // SAFETY: forwarded contract.
        unsafe { gemm_packed(m, n, k, a, bp, c, ldc, acc) };
        MICRO_OVERRIDE.with(|o| o.set(None));
    }

    std::thread_local! {
        pub(super) static MICRO_OVERRIDE: core::cell::Cell<Option<Micro>> = const { core::cell::Cell::new(None) };
    }

    #[test]
    fn edges_and_k_blocks_match_naive() {
        let mut micros: Vec<Micro> = vec![portable];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            micros.push(avx2_fma);
        }
        for micro in micros {
            for &(m, n, k) in &[(1, 1, 1), (6, 16, 3), (7, 17, 5), (13, 40, 300), (250, 33, 520), (5, 3, 0)] {
                check(m, n, k, micro);
            }
        }
    }
}

#[cfg(test)]
fn micro_override() -> Option<Micro> {
    tests::MICRO_OVERRIDE.with(|o| o.get())
}
