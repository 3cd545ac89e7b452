//! permute, strided_copy and gather against naive references.

use super::{strides_of, unravel, Rng};
use crate::*;

fn random_perm(rng: &mut Rng, n: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        p.swap(i, rng.below(i + 1));
    }
    p
}

fn permute_ref(shape: &[usize], perm: &[usize], x: &[f32]) -> Vec<f32> {
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let st = strides_of(shape);
    (0..x.len())
        .map(|i| {
            let idx = unravel(i, &out_shape);
            x[(0..perm.len()).map(|d| idx[d] * st[perm[d]]).sum::<usize>()]
        })
        .collect()
}

#[test]
fn permute_random() {
    let mut rng = Rng::new(20);
    for _ in 0..300 {
        let rank = rng.range(0, 6);
        let shape: Vec<usize> = loop {
            let s: Vec<usize> = (0..rank).map(|_| rng.pick(&[1, 2, 3, 5, 7, 16, 17, 33, 40])).collect();
            if s.iter().product::<usize>() <= 50_000 {
                break s;
            }
        };
        let perm = random_perm(&mut rng, rank);
        let x = rng.vec(shape.iter().product());
        let mut y = vec![f32::NAN; x.len()];
        permute(&shape, &perm, &x, &mut y).unwrap();
        assert_eq!(y, permute_ref(&shape, &perm, &x), "{shape:?} {perm:?}");
    }
    // Large transposes: tiled and parallel paths.
    for (shape, perm) in [
        (vec![300, 513], vec![1, 0]),
        (vec![4, 100, 257], vec![0, 2, 1]),
        (vec![64, 65, 3], vec![2, 0, 1]),
        (vec![2, 3, 4, 5, 6, 7], vec![5, 3, 1, 0, 2, 4]),
    ] {
        let x = rng.vec(shape.iter().product());
        let mut y = vec![f32::NAN; x.len()];
        permute(&shape, &perm, &x, &mut y).unwrap();
        assert_eq!(y, permute_ref(&shape, &perm, &x), "{shape:?} {perm:?}");
    }
}

/// Returns (smallest, largest) offset reachable with `strides` from 0.
fn span(sizes: &[usize], strides: &[isize]) -> (isize, isize) {
    let (mut lo, mut hi) = (0, 0);
    for (&s, &st) in sizes.iter().zip(strides) {
        let e = (s as isize - 1) * st;
        if e < 0 {
            lo += e;
        } else {
            hi += e;
        }
    }
    (lo, hi)
}

#[test]
fn strided_copy_random() {
    let mut rng = Rng::new(21);
    let mut parallel_cases = 0;
    for it in 0..400 {
        let rank = rng.range(1, 4);
        let big = it % 10 == 0;
        let sizes: Vec<usize> = (0..rank)
            .map(|_| if big { rng.pick(&[16, 33, 64, 65]) } else { rng.pick(&[1, 2, 3, 5, 8, 17]) })
            .collect();
        // Source: arbitrary strides, including 0 and negative.
        let src_strides: Vec<isize> = (0..rank).map(|_| rng.range(0, 80) as isize - 40).collect();
        // Destination: a permuted, possibly padded/reversed dense layout, or
        // (sometimes) arbitrary overlapping strides.
        let dst_strides: Vec<isize> = if it % 4 == 3 {
            (0..rank).map(|_| rng.range(0, 6) as isize - 3).collect()
        } else {
            let perm = random_perm(&mut rng, rank);
            let mut st = vec![0isize; rank];
            let mut acc = 1isize;
            for &d in perm.iter().rev() {
                st[d] = if rng.below(4) == 0 { -acc } else { acc };
                acc *= sizes[d] as isize + rng.range(0, 2) as isize;
            }
            st
        };
        let (slo, shi) = span(&sizes, &src_strides);
        let (dlo, dhi) = span(&sizes, &dst_strides);
        let src_offset = (-slo) as usize + rng.range(0, 3);
        let dst_offset = (-dlo) as usize + rng.range(0, 3);
        let src_len = src_offset + shi as usize + 1 + rng.range(0, 3);
        let src = rng.vec(src_len);
        let total: usize = sizes.iter().product();
        let dst_len = (dst_offset + dhi as usize + 1 + rng.range(0, 3)).max(total);
        let mut dst: Vec<f32> = rng.vec(dst_len);
        let mut want = dst.clone();
        let p = StridedCopy {
            sizes: &sizes,
            src_offset,
            src_strides: &src_strides,
            dst_offset,
            dst_strides: &dst_strides,
        };
        for i in 0..total {
            let idx = unravel(i, &sizes);
            let s: isize = src_offset as isize + (0..rank).map(|d| idx[d] as isize * src_strides[d]).sum::<isize>();
            let t: isize = dst_offset as isize + (0..rank).map(|d| idx[d] as isize * dst_strides[d]).sum::<isize>();
            want[t as usize] = src[s as usize];
        }
        if total > 1 << 14 {
            parallel_cases += 1;
        }
        strided_copy(&p, &src, &mut dst).unwrap();
        assert_eq!(dst, want, "{p:?}");
    }
    assert!(parallel_cases > 5);
}

fn gather_ref(data: &[f32], shape: &[usize], axis: usize, idx: &[i64], n_idx: usize) -> Vec<f32> {
    let outer: usize = shape[..axis].iter().product();
    let size = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = Vec::new();
    for o in 0..outer {
        for &i in idx.iter().take(n_idx) {
            let j = if i < 0 { i + size as i64 } else { i } as usize;
            out.extend_from_slice(&data[(o * size + j) * inner..][..inner]);
        }
    }
    out
}

#[test]
fn gather_random() {
    let mut rng = Rng::new(22);
    for it in 0..300 {
        let rank = rng.range(1, 4);
        let shape: Vec<usize> = (0..rank).map(|_| rng.pick(&[1, 2, 3, 7, 17, 33])).collect();
        let axis = rng.below(rank);
        let size = shape[axis];
        let idx_shape: Vec<usize> = (0..rng.range(0, 2)).map(|_| rng.pick(&[1, 2, 5, 9])).collect();
        let n_idx: usize = idx_shape.iter().product();
        let idx: Vec<i64> = (0..n_idx).map(|_| rng.range(0, 2 * size - 1) as i64 - size as i64).collect();
        let data = rng.vec(shape.iter().product());
        let out_shape = gather_output_shape(&shape, axis as isize - rank as isize, &idx_shape).unwrap();
        assert_eq!(out_shape.len(), rank - 1 + idx_shape.len());
        let want = gather_ref(&data, &shape, axis, &idx, n_idx);
        assert_eq!(out_shape.iter().product::<usize>(), want.len());
        let mut y = vec![f32::NAN; want.len()];
        if it % 2 == 0 {
            gather(&data, &shape, axis as isize, &idx, &idx_shape, &mut y).unwrap();
        } else {
            let idx32: Vec<i32> = idx.iter().map(|&i| i as i32).collect();
            gather(&data, &shape, axis as isize - rank as isize, &idx32, &idx_shape, &mut y).unwrap();
        }
        assert_eq!(y, want, "{shape:?} axis {axis} {idx:?}");
    }
    // Embedding-style lookup large enough to run in parallel.
    let data = rng.vec(1000 * 64);
    let idx: Vec<i64> = (0..4096).map(|_| rng.below(1000) as i64).collect();
    let mut y = vec![0.0; 4096 * 64];
    gather(&data, &[1000, 64], 0, &idx, &[64, 64], &mut y).unwrap();
    assert_eq!(y, gather_ref(&data, &[1000, 64], 0, &idx, 4096));
}

/// `copy_bytes` is a memmove at every distance, including the short
/// distances modulo 4 KiB that it copies piece by piece, and overlapping
/// ranges in both directions.
#[test]
fn copy_bytes_is_memmove() {
    let pattern = |len: usize| -> Vec<u8> { (0..len).map(|i| (i * 131 + i / 251) as u8).collect() };
    for n in [0usize, 1, 100, 2048, 2049, 4096, 6000, 70_001] {
        for distance in [-8192isize, -4095, -4080, -64, -16, -1, 1, 16, 63, 64, 4096 + 16, 8192 + 1, 3 * 4096 + 63] {
            let base = 9000usize;
            let len = base + n + 9000 + 4 * 4096;
            let mut buf = pattern(len);
            let mut want = buf.clone();
            let src = base;
            let dst = (base as isize + distance) as usize;
            want.copy_within(src..src + n, dst);
            let p = buf.as_mut_ptr();
            // SAFETY: both ranges lie inside `buf` (len leaves room on each
            // side for every distance above).
            unsafe { copy_bytes(p.add(src), p.add(dst), n) };
            assert!(buf == want, "n {n} distance {distance}");
        }
    }
}
