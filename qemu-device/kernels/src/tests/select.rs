//! where_select against a naive reference: every broadcasting pattern,
//! NaN and signed-zero conditions, bit-exact copies, errors.

use super::elementwise::{operand_shape, random_shape};
use super::{strides_of, unravel, Rng};
use crate::*;

/// Naive Where: for every output multi-index, read each operand at the
/// index right-aligned to its shape (0 along its size-1 dims).
fn where_ref(c: &[f32], csh: &[usize], a: &[f32], ash: &[usize], b: &[f32], bsh: &[usize]) -> Vec<f32> {
    let rank = csh.len().max(ash.len()).max(bsh.len());
    let pad = |sh: &[usize]| -> Vec<usize> { std::iter::repeat_n(1, rank - sh.len()).chain(sh.iter().copied()).collect() };
    let (cp, ap, bp) = (pad(csh), pad(ash), pad(bsh));
    // The size other than 1 (they agree), else 1; 0 is a size like any.
    let out: Vec<usize> = (0..rank).map(|d| [cp[d], ap[d], bp[d]].into_iter().find(|&x| x != 1).unwrap_or(1)).collect();
    let index = |idx: &[usize], sh: &[usize]| -> usize {
        let st = strides_of(sh);
        (0..rank).map(|d| if sh[d] == 1 { 0 } else { idx[d] * st[d] }).sum()
    };
    (0..out.iter().product())
        .map(|i| {
            let idx = unravel(i, &out);
            if c[index(&idx, &cp)] != 0.0 {
                a[index(&idx, &ap)]
            } else {
                b[index(&idx, &bp)]
            }
        })
        .collect()
}

/// A condition mask of 0/1 with some NaNs (true) and -0.0s (false).
fn cond_vec(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.pick(&[0.0, 1.0, 1.0, 0.0, -0.0, f32::NAN, 2.5, -1.0])).collect()
}

#[track_caller]
fn check(csh: &[usize], ash: &[usize], bsh: &[usize], rng: &mut Rng) {
    let c = cond_vec(rng, csh.iter().product());
    // a and b distinguishable: a positive, b negative.
    let a = rng.vec_in(ash.iter().product(), 1.0, 2.0);
    let b = rng.vec_in(bsh.iter().product(), -2.0, -1.0);
    let shape = broadcast_shape3(csh, ash, bsh).unwrap();
    let mut y = vec![f32::NAN; shape.iter().product()];
    where_select(&c, csh, &a, ash, &b, bsh, &mut y).unwrap();
    let want = where_ref(&c, csh, &a, ash, &b, bsh);
    assert_eq!(y.len(), want.len());
    for (i, (g, w)) in y.iter().zip(&want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{csh:?} {ash:?} {bsh:?} [{i}]: got {g}, want {w}");
    }
}

#[test]
fn where_semantics() {
    // cond != 0: NaN selects a, -0.0 selects b; values are copied bit for
    // bit (a NaN payload and -0.0 survive).
    let nan_payload = f32::from_bits(0x7fc0_1234);
    let cond = [1.0, 0.0, f32::NAN, -0.0, -3.0, f32::INFINITY];
    let a = [10.0, 11.0, 12.0, 13.0, nan_payload, -0.0];
    let b = [20.0, 21.0, 22.0, 23.0, 24.0, 25.0];
    let mut y = [0.0; 6];
    where_select(&cond, &[6], &a, &[6], &b, &[6], &mut y).unwrap();
    let want = [10.0, 21.0, 12.0, 23.0, nan_payload, -0.0];
    assert_eq!(y.map(f32::to_bits), want.map(f32::to_bits));
    // Explicit broadcasts: a column cond [2,1] against a row a [3] and a
    // scalar b.
    let mut y = [0.0; 6];
    where_select(&[1.0, 0.0], &[2, 1], &[1.0, 2.0, 3.0], &[3], &[-1.0], &[], &mut y).unwrap();
    assert_eq!(y, [1.0, 2.0, 3.0, -1.0, -1.0, -1.0]);
    // A row cond [3] against a column a [2,1] and a full b [2,3].
    where_select(&[0.0, 1.0, 0.0], &[3], &[7.0, 8.0], &[2, 1], &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], &[2, 3], &mut y).unwrap();
    assert_eq!(y, [0.1, 7.0, 0.3, 0.4, 8.0, 0.6]);
    // A scalar cond selects a whole operand, broadcast.
    where_select(&[f32::NAN], &[], &[5.0], &[1, 1], &[0.0; 6], &[2, 3], &mut y).unwrap();
    assert_eq!(y, [5.0; 6]);
    where_select(&[0.0], &[1], &[5.0], &[1, 1], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &mut y).unwrap();
    assert_eq!(y, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    // All scalars: a rank-0 output.
    let mut y1 = [0.0];
    where_select(&[0.0], &[], &[1.0], &[], &[2.0], &[], &mut y1).unwrap();
    assert_eq!(y1, [2.0]);
}

#[test]
fn where_every_broadcast_pattern() {
    let mut rng = Rng::new(21);
    let cases: &[(&[usize], &[usize], &[usize])] = &[
        // Same shapes.
        (&[2, 3], &[2, 3], &[2, 3]),
        // Scalar cond (rank 0 and size-1 dims), scalar a / b.
        (&[], &[2, 3], &[2, 3]),
        (&[1, 1], &[4, 5], &[4, 5]),
        (&[4, 5], &[], &[4, 5]),
        (&[4, 5], &[4, 5], &[1]),
        (&[4, 5], &[], &[]),
        (&[], &[], &[4, 5]),
        // Row broadcasts (a trailing vector) and column broadcasts ([n,1]).
        (&[5], &[4, 5], &[4, 5]),
        (&[4, 5], &[5], &[1, 5]),
        (&[4, 1], &[4, 5], &[4, 5]),
        (&[4, 5], &[4, 1], &[4, 1]),
        (&[4, 1], &[1, 5], &[5]),
        (&[1, 5], &[4, 1], &[4, 5]),
        // All three different; the output larger than each operand.
        (&[2, 1, 3], &[4, 1], &[5, 1, 1, 1]),
        (&[1, 3, 1, 2], &[6, 1, 4, 1], &[4, 2]),
        (&[3, 1, 1, 1, 1, 2], &[1, 2, 1, 3, 1, 1], &[1, 1, 2, 1, 2, 1]),
        // Zero-volume output.
        (&[0, 3], &[1, 3], &[3]),
        (&[2, 1], &[2, 0], &[1]),
        // Large: several parallel tasks on each code path.
        (&[300, 257], &[300, 257], &[300, 257]),
        (&[300, 1], &[1, 257], &[257]),
        (&[257], &[300, 1], &[300, 257]),
        (&[1], &[70_001], &[70_001]),
        (&[70_001], &[], &[1]),
        (&[64, 3, 2, 100], &[64, 1, 2, 1], &[1, 3, 1, 100]),
        (&[64, 1, 1, 100], &[64, 3, 2, 100], &[3, 2, 1]),
    ];
    for &(csh, ash, bsh) in cases {
        check(csh, ash, bsh, &mut rng);
        // Every role for every shape.
        check(ash, bsh, csh, &mut rng);
        check(bsh, csh, ash, &mut rng);
    }
}

#[test]
fn where_random_broadcasts() {
    let mut rng = Rng::new(22);
    for it in 0..500 {
        let rank = rng.range(0, 6);
        let out = random_shape(&mut rng, rank, 40_000);
        let mut shapes: Vec<Vec<usize>> = (0..3).map(|_| operand_shape(&mut rng, &out)).collect();
        shapes[it % 3] = out.clone();
        if it % 4 == 0 {
            shapes.swap(0, 2);
        }
        check(&shapes[0], &shapes[1], &shapes[2], &mut rng);
    }
}

#[test]
fn where_errors_write_nothing() {
    let mut y = vec![3.0; 6];
    let (c, a, b) = (vec![1.0; 6], vec![2.0; 6], vec![4.0; 6]);
    macro_rules! refused {
        ($pat:pat, $e:expr) => {{
            let r = $e;
            assert!(matches!(r, Err($pat)), "{} => {:?}", stringify!($e), r);
            assert_eq!(y, [3.0; 6], "{}", stringify!($e));
        }};
    }
    // Incompatible shapes, in each pair.
    refused!(KernelError::Broadcast { .. }, where_select(&c, &[2, 3], &a[..2], &[2], &b, &[2, 3], &mut y));
    refused!(KernelError::Broadcast { .. }, where_select(&c, &[2, 3], &a, &[2, 3], &b[..2], &[2], &mut y));
    refused!(KernelError::Broadcast { .. }, where_select(&c[..2], &[2, 1], &a[..3], &[3], &b[..3], &[3, 1], &mut y));
    // Ranks above MAX_RANK.
    refused!(KernelError::RankTooLarge { .. }, where_select(&c[..1], &[1; 7], &a[..1], &[1], &b[..1], &[1], &mut y[..1]));
    refused!(KernelError::RankTooLarge { .. }, where_select(&c[..1], &[1], &a[..1], &[1; 7], &b[..1], &[1], &mut y[..1]));
    refused!(KernelError::RankTooLarge { .. }, where_select(&c[..1], &[1], &a[..1], &[1], &b[..1], &[1; 7], &mut y[..1]));
    // Slices that do not match their shapes, or the output's.
    refused!(KernelError::LengthMismatch { .. }, where_select(&c[..5], &[2, 3], &a, &[2, 3], &b, &[2, 3], &mut y));
    refused!(KernelError::LengthMismatch { .. }, where_select(&c, &[2, 3], &a[..5], &[2, 3], &b, &[2, 3], &mut y));
    refused!(KernelError::LengthMismatch { .. }, where_select(&c, &[2, 3], &a, &[2, 3], &b[..1], &[2, 3], &mut y));
    refused!(KernelError::LengthMismatch { .. }, where_select(&c, &[2, 3], &a, &[2, 3], &b, &[2, 3], &mut y[..5]));
    refused!(KernelError::LengthMismatch { .. }, where_select(&c, &[2, 3], &a, &[2, 3], &b, &[2, 3], &mut [3.0; 7]));
    // Volumes that overflow: an operand's own, and the broadcast output's.
    refused!(KernelError::Overflow { .. }, where_select(&c[..1], &[usize::MAX, 2], &a[..1], &[1], &b[..1], &[1], &mut y));
    refused!(
        KernelError::Overflow { .. },
        where_select(&c[..1], &[1, 1 << 40, 1], &a[..1], &[1 << 40, 1, 1], &b[..1], &[1, 1, 1 << 40], &mut y)
    );
}
