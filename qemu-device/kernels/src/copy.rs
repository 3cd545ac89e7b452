//! Strided copies and dimension permutes.

use crate::error::{KernelError, Result};
use crate::util::{check_len, check_rank, volume, SendPtr, PAR_CHUNK};
use rayon::prelude::*;

/// Pieces of this many bytes avoid the slow case of [`copy_bytes`]: the C
/// library's `memmove` copies pieces this small with vector loads and
/// stores.
const SHORT_DISTANCE_PIECE: usize = 2048;

/// `memmove(dst, src, n)`: the bytes of `[src, src + n)` land at
/// `[dst, dst + n)`, the ranges may overlap.
///
/// Why not plain `ptr::copy`: glibc's `memmove` copies mid-sized blocks
/// (about 4 KiB to 1 MiB) with `rep movsb`, which on the AMD hosts this
/// device model runs on falls to 2-3 GB/s, against 40-60 GB/s, when the
/// destination lies 1 to 63 bytes past the source modulo 4 KiB (measured
/// on 4 KiB to 256 KiB blocks; the rows of a concatenation or a slice can
/// fall there). Such copies go piece by piece below the `rep movsb`
/// threshold instead, from the end when the destination is above the
/// source (memmove's order when they overlap).
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `n` bytes.
pub unsafe fn copy_bytes(src: *const u8, dst: *mut u8, n: usize) {
    let distance = (dst as usize).wrapping_sub(src as usize) % 4096;
    if n <= SHORT_DISTANCE_PIECE || !(1..64).contains(&distance) {
        // SAFETY: the caller's contract.
        unsafe { core::ptr::copy(src, dst, n) };
        return;
    }
    let pieces = n.div_ceil(SHORT_DISTANCE_PIECE);
    let overlaps_ahead = (dst as usize) > (src as usize) && (dst as usize) - (src as usize) < n;
    for k in 0..pieces {
        // Back to front if the destination overlaps the source from above:
        // every piece is read before a later (lower) piece overwrites it.
        let k = if overlaps_ahead { pieces - 1 - k } else { k };
        let off = k * SHORT_DISTANCE_PIECE;
        let len = SHORT_DISTANCE_PIECE.min(n - off);
        // SAFETY: `[off, off + len)` lies inside both `n`-byte ranges; a
        // piece that overlaps itself is a memmove.
        unsafe { core::ptr::copy(src.add(off), dst.add(off), len) };
    }
}

/// A generic strided copy: for every index `i` in `sizes`,
/// `dst[dst_offset + Σ i_d·dst_strides[d]] = src[src_offset + Σ i_d·src_strides[d]]`.
///
/// Offsets and strides are in elements; strides may be negative or zero.
/// Every reachable element must lie inside its slice, and the element count
/// may not exceed `dst.len()`. If the destination mapping is not provably
/// one-to-one (e.g. a zero stride), elements are copied sequentially in
/// row-major order of `sizes` and the last write wins; otherwise the copy is
/// parallel (and tiled when it transposes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StridedCopy<'a> {
    /// Extent of each dimension (rank ≤ 6).
    pub sizes: &'a [usize],
    pub src_offset: usize,
    pub src_strides: &'a [isize],
    pub dst_offset: usize,
    pub dst_strides: &'a [isize],
}

#[derive(Clone, Copy, Debug)]
struct Dim {
    size: usize,
    ss: isize,
    ds: isize,
}

/// A copy's dimensions, inline (rank ≤ 6): no allocation per copy.
type Dims = smallvec::SmallVec<[Dim; crate::MAX_RANK]>;

/// Smallest and largest element offset reachable from `offset`.
fn reach(what: &'static str, offset: usize, sizes: &[usize], strides: &[isize], len: usize) -> Result<()> {
    let of = || KernelError::Overflow { what };
    let (mut lo, mut hi) = (offset as i128, offset as i128);
    for (&s, &st) in sizes.iter().zip(strides) {
        let span = (s as i128 - 1).checked_mul(st as i128).ok_or_else(of)?;
        if span < 0 {
            lo = lo.checked_add(span).ok_or_else(of)?;
        } else {
            hi = hi.checked_add(span).ok_or_else(of)?;
        }
    }
    if lo < 0 {
        return Err(KernelError::OutOfBounds { what, index: lo, len });
    }
    if hi >= len as i128 {
        return Err(KernelError::OutOfBounds { what, index: hi, len });
    }
    Ok(())
}

/// Performs the copy described by `p`; see [`StridedCopy`].
pub fn strided_copy(p: &StridedCopy<'_>, src: &[f32], dst: &mut [f32]) -> Result<()> {
    check_rank("strided_copy sizes", p.sizes)?;
    if p.src_strides.len() != p.sizes.len() || p.dst_strides.len() != p.sizes.len() {
        return Err(KernelError::invalid(
            "strided_copy strides",
            format!(
                "{} sizes but {} source and {} destination strides",
                p.sizes.len(),
                p.src_strides.len(),
                p.dst_strides.len()
            ),
        ));
    }
    if p.sizes.contains(&0) {
        return Ok(());
    }
    let total = volume("strided_copy sizes", p.sizes)?;
    if total > dst.len() {
        return Err(KernelError::invalid(
            "strided_copy destination strides",
            format!("{total} elements cannot be written to distinct places of a slice of {}", dst.len()),
        ));
    }
    reach("strided_copy source", p.src_offset, p.sizes, p.src_strides, src.len())?;
    reach("strided_copy destination", p.dst_offset, p.sizes, p.dst_strides, dst.len())?;
    let dims: Dims = (0..p.sizes.len())
        .map(|d| Dim {
            size: p.sizes[d],
            ss: p.src_strides[d],
            ds: p.dst_strides[d],
        })
        .collect();
    // SAFETY: `reach` proved every offset reachable by `dims` from the two
    // bases lies inside the slices, and sub-walks stay inside that envelope.
    unsafe { run(dims, src, p.src_offset, dst, p.dst_offset) };
    Ok(())
}

/// One source of [`concat_rows`]: `rows × cols` row-major, landing at
/// column `col` of every output row.
#[derive(Clone, Copy, Debug)]
pub struct ConcatPart<'a> {
    pub src: &'a [f32],
    pub col: usize,
    pub cols: usize,
}

/// A concatenation in one pass: for every row `r < rows`, each part's row
/// `r` lands at `out[r·out_cols + col ..]`, parts in order (a later one
/// wins where they overlap); columns no part covers keep their values.
/// Output rows are split between threads when the copy is large.
pub fn concat_rows(rows: usize, out_cols: usize, parts: &[ConcatPart<'_>], out: &mut [f32]) -> Result<()> {
    let n_out = rows.checked_mul(out_cols).ok_or_else(|| KernelError::invalid("concat rows", format!("{rows} × {out_cols} overflows")))?;
    check_len("concat output", out.len(), n_out)?;
    let mut moved = 0usize;
    for p in parts {
        if p.col.checked_add(p.cols).is_none_or(|end| end > out_cols) {
            return Err(KernelError::invalid("concat part", format!("columns {}..+{} outside a row of {out_cols}", p.col, p.cols)));
        }
        let n = rows.checked_mul(p.cols).ok_or_else(|| KernelError::invalid("concat part", "size overflows"))?;
        check_len("concat part", p.src.len(), n)?;
        moved = moved.saturating_add(n);
    }
    if n_out == 0 {
        return Ok(());
    }
    let row = |r: usize, dst: &mut [f32]| {
        for p in parts {
            let (from, to) = (&p.src[r * p.cols..][..p.cols], &mut dst[p.col..p.col + p.cols]);
            // SAFETY: both slices hold `p.cols` elements (bounds checked by
            // the indexing above) and do not overlap (a shared and a
            // mutable borrow). copy_bytes, not copy_from_slice: rows of a
            // few KiB at a distance that defeats `rep movsb` (its doc).
            unsafe { copy_bytes(from.as_ptr().cast(), to.as_mut_ptr().cast(), 4 * p.cols) };
        }
    };
    if moved < 2 * PAR_CHUNK || rows == 1 {
        out.chunks_mut(out_cols).enumerate().for_each(|(r, dst)| row(r, dst));
    } else {
        out.par_chunks_mut(out_cols).enumerate().for_each(|(r, dst)| row(r, dst));
    }
    Ok(())
}

/// `y = x` with dimensions permuted: `y`'s dimension `i` is `x`'s dimension
/// `perm[i]` (numpy `transpose(x, perm)`). Rank ≤ 6.
pub fn permute(shape: &[usize], perm: &[usize], x: &[f32], y: &mut [f32]) -> Result<()> {
    check_rank("permute shape", shape)?;
    let rank = shape.len();
    let mut seen = [false; crate::MAX_RANK];
    if perm.len() != rank || perm.iter().any(|&p| p >= rank || std::mem::replace(&mut seen[p], true)) {
        return Err(KernelError::invalid(
            "permute perm",
            format!("{perm:?} is not a permutation of 0..{rank}"),
        ));
    }
    let total = volume("permute shape", shape)?;
    check_len("permute input", x.len(), total)?;
    check_len("permute output", y.len(), total)?;
    if total == 0 {
        return Ok(());
    }
    let mut in_strides = [0isize; crate::MAX_RANK];
    let mut s = 1usize;
    for d in (0..rank).rev() {
        in_strides[d] = s as isize;
        s *= shape[d];
    }
    let mut dims: Dims = smallvec::smallvec![Dim { size: 1, ss: 0, ds: 0 }; rank];
    let mut ds = 1usize;
    for i in (0..rank).rev() {
        dims[i] = Dim {
            size: shape[perm[i]],
            ss: in_strides[perm[i]],
            ds: ds as isize,
        };
        ds *= dims[i].size;
    }
    // SAFETY: a permutation of a contiguous tensor's strides covers exactly
    // 0..total in both slices.
    unsafe { run(dims, x, 0, y, 0) };
    Ok(())
}

/// Side of the square tiles of a transposing copy.
const TILE: usize = 32;

/// Executes a validated copy.
///
/// # Safety
/// All offsets reachable from the bases through `dims` must be in bounds.
unsafe fn run(mut dims: Dims, src: &[f32], src_off: usize, dst: &mut [f32], dst_off: usize) {
    dims.retain(|d| d.size != 1);
    let injective = is_injective(&dims);
    if injective {
        // Order no longer matters: put the smallest destination stride innermost.
        dims.sort_by_key(|d| std::cmp::Reverse(d.ds.unsigned_abs()));
    }
    let mut merged = Dims::new();
    for d in dims.into_iter().rev() {
        // Walking inner → outer; `last` is the current innermost group.
        match merged.last_mut() {
            Some(last)
                if last.ss.checked_mul(last.size as isize) == Some(d.ss)
                    && last.ds.checked_mul(last.size as isize) == Some(d.ds) =>
            {
                last.size *= d.size
            }
            _ => merged.push(d),
        }
    }
    merged.reverse(); // outer → inner
    if merged.is_empty() {
        merged.push(Dim { size: 1, ss: 0, ds: 0 });
    }
    // A transposing copy: some non-innermost dim reads contiguously while the
    // innermost does not. Make it the second-innermost and tile the pair.
    let n = merged.len();
    let mut tiled = false;
    if injective && n >= 2 && merged[n - 1].ss.unsigned_abs() != 1 {
        if let Some(t) = (0..n - 1).rev().find(|&t| merged[t].ss.unsigned_abs() == 1) {
            let d = merged.remove(t);
            merged.insert(n - 2, d);
            tiled = true;
        }
    }
    let src_base = SendPtr(src.as_ptr().add(src_off) as *mut f32);
    let dst_base = SendPtr(dst.as_mut_ptr().add(dst_off));
    let total: usize = merged.iter().map(|d| d.size).product();
    let top = merged[0];
    if !injective || total <= PAR_CHUNK || top.size == 1 {
        walk(&merged, tiled, src_base.get(), dst_base.get());
        return;
    }
    // Split the outermost dimension into ranges, one task each.
    let per_index = total / top.size;
    let step = (PAR_CHUNK / per_index).max(1);
    let tasks = top.size.div_ceil(step);
    (0..tasks).into_par_iter().for_each(|t| {
        let start = t * step;
        let mut dims = merged.clone();
        dims[0].size = step.min(top.size - start);
        let s = src_base.get().offset(start as isize * top.ss);
        let d = dst_base.get().offset(start as isize * top.ds);
        // SAFETY: tasks cover disjoint index ranges of an injective mapping.
        walk(&dims, tiled, s, d);
    });
}

/// Sufficient condition for the destination mapping to be one-to-one: in
/// order of increasing |stride|, each stride exceeds the span of the smaller ones.
fn is_injective(dims: &[Dim]) -> bool {
    let mut strides: Vec<(usize, usize)> = dims.iter().map(|d| (d.ds.unsigned_abs(), d.size)).collect();
    strides.sort_unstable();
    let mut span = 0usize; // max offset reachable by the dims seen so far
    for (st, size) in strides {
        if st <= span {
            return false;
        }
        // Cannot overflow: the total span was bounds-checked against a slice.
        span += (size - 1) * st;
    }
    true
}

unsafe fn walk(dims: &[Dim], tiled: bool, src: *mut f32, dst: *mut f32) {
    let base = if tiled { 2 } else { 1 };
    if dims.len() > base {
        let d = dims[0];
        for i in 0..d.size as isize {
            walk(&dims[1..], tiled, src.offset(i * d.ss), dst.offset(i * d.ds));
        }
    } else if tiled {
        let (a, b) = (dims[0], dims[1]);
        // A plain transpose (contiguous source along `a`, contiguous
        // destination along `b`) goes through 8×8 register transposes.
        #[cfg(target_arch = "x86_64")]
        let blocks = a.ss == 1 && b.ds == 1 && std::arch::is_x86_feature_detected!("avx");
        #[cfg(not(target_arch = "x86_64"))]
        let blocks = false;
        for i0 in (0..a.size).step_by(TILE) {
            let i1 = (i0 + TILE).min(a.size);
            for j0 in (0..b.size).step_by(TILE) {
                let j1 = (j0 + TILE).min(b.size);
                // [i0, ie) × [j0, je): whole 8×8 blocks; the rest element-wise.
                let (ie, je) = if blocks { (i0 + (i1 - i0) / 8 * 8, j0 + (j1 - j0) / 8 * 8) } else { (i0, j0) };
                #[cfg(target_arch = "x86_64")]
                for i in (i0..ie).step_by(8) {
                    for j in (j0..je).step_by(8) {
                        // SAFETY: AVX was detected; the block reads source
                        // elements (i..i+8, j..j+8) and writes the same
                        // destination elements as the element-wise loop,
                        // all inside the validated envelope.
                        unsafe {
                            transpose8x8(
                                src.offset(i as isize + j as isize * b.ss),
                                b.ss,
                                dst.offset(i as isize * a.ds + j as isize),
                                a.ds,
                            )
                        };
                    }
                }
                for i in i0..i1 {
                    let s = src.offset(i as isize * a.ss);
                    let d = dst.offset(i as isize * a.ds);
                    let jstart = if i < ie { je } else { j0 };
                    for j in jstart..j1 {
                        *d.offset(j as isize * b.ds) = *s.offset(j as isize * b.ss);
                    }
                }
            }
        }
    } else {
        let d = dims[0];
        if d.ss == 1 && d.ds == 1 {
            copy_bytes(src.cast(), dst.cast(), d.size * 4);
        } else {
            for j in 0..d.size as isize {
                *dst.offset(j * d.ds) = *src.offset(j * d.ss);
            }
        }
    }
}

/// Transposes an 8×8 block: source row `k` (8 contiguous elements at
/// `src + k·src_stride`) becomes destination column `k` (destination row
/// `r` is 8 contiguous elements at `dst + r·dst_stride`).
///
/// # Safety
/// The CPU must support AVX; the 64 source elements must be readable and
/// the 64 destination elements writable, and the two must not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub(crate) unsafe fn transpose8x8(src: *const f32, src_stride: isize, dst: *mut f32, dst_stride: isize) {
    use core::arch::x86_64::*;
    // SAFETY: per the function contract (unaligned loads and stores).
    unsafe {
        let r0 = _mm256_loadu_ps(src);
        let r1 = _mm256_loadu_ps(src.offset(src_stride));
        let r2 = _mm256_loadu_ps(src.offset(2 * src_stride));
        let r3 = _mm256_loadu_ps(src.offset(3 * src_stride));
        let r4 = _mm256_loadu_ps(src.offset(4 * src_stride));
        let r5 = _mm256_loadu_ps(src.offset(5 * src_stride));
        let r6 = _mm256_loadu_ps(src.offset(6 * src_stride));
        let r7 = _mm256_loadu_ps(src.offset(7 * src_stride));
        let t0 = _mm256_unpacklo_ps(r0, r1);
        let t1 = _mm256_unpackhi_ps(r0, r1);
        let t2 = _mm256_unpacklo_ps(r2, r3);
        let t3 = _mm256_unpackhi_ps(r2, r3);
        let t4 = _mm256_unpacklo_ps(r4, r5);
        let t5 = _mm256_unpackhi_ps(r4, r5);
        let t6 = _mm256_unpacklo_ps(r6, r7);
        let t7 = _mm256_unpackhi_ps(r6, r7);
        // Columns (0, 4), (1, 5), (2, 6), (3, 7) of rows 0-3 and 4-7.
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        _mm256_storeu_ps(dst, _mm256_permute2f128_ps::<0x20>(s0, s4));
        _mm256_storeu_ps(dst.offset(dst_stride), _mm256_permute2f128_ps::<0x20>(s1, s5));
        _mm256_storeu_ps(dst.offset(2 * dst_stride), _mm256_permute2f128_ps::<0x20>(s2, s6));
        _mm256_storeu_ps(dst.offset(3 * dst_stride), _mm256_permute2f128_ps::<0x20>(s3, s7));
        _mm256_storeu_ps(dst.offset(4 * dst_stride), _mm256_permute2f128_ps::<0x31>(s0, s4));
        _mm256_storeu_ps(dst.offset(5 * dst_stride), _mm256_permute2f128_ps::<0x31>(s1, s5));
        _mm256_storeu_ps(dst.offset(6 * dst_stride), _mm256_permute2f128_ps::<0x31>(s2, s6));
        _mm256_storeu_ps(dst.offset(7 * dst_stride), _mm256_permute2f128_ps::<0x31>(s3, s7));
    }
}
