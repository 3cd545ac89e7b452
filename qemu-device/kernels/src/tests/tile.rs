//! The tile engine on hand-built programs: every op family computes what
//! docs/hardware.md 8.20 says, out-of-bounds lanes fault with their
//! buffer and offset, and damaged programs that still verify run without
//! a panic.

use std::sync::atomic::{AtomicU32, Ordering};

use rbln_hw::tile::*;

use super::Rng;
use crate::{run_tile, TileFault, TileLaunch, TileMem};

type I = TileInstr;

/// Programs over buffer 0 (f32, read) and buffer 1 (f32, written).
fn encode(v: &[I]) -> Vec<u8> {
    let mut h = TileProgramHeader { nbufs: 2, nparams: 1, ..Default::default() };
    h.buf_types[..2].fill(TileType::F32 as u8);
    h.param_types[0] = TileType::I32 as u8;
    let mut out = vec![0u8; program_size(v.len())];
    encode_program(&h, v, &mut out).unwrap();
    out
}

/// `out[pid·8 + j] = f(x[pid·8 + j])` for j < 8, where the middle of the
/// program (registers 11..) computes from register 10 (the loaded x) and
/// its last instruction is the value stored.
fn program(middle: &[I]) -> Vec<u8> {
    let n = 11 + middle.len() as u32;
    let mut v = vec![
        I::new(TileOp::Buffer, TileType::Ptr, &[]),
        I { slot: 1, ..I::new(TileOp::Buffer, TileType::Ptr, &[]) },
        I::new(TileOp::ProgramId, TileType::I32, &[]),
        I { imm: 8, ..I::new(TileOp::Const, TileType::I32, &[]) },
        I { a: 2, b: 3, kind: TileBinary::Mul as u8, ..I::new(TileOp::Binary, TileType::I32, &[]) },
        I { a: 4, ..I::new(TileOp::Splat, TileType::I32, &[8]) },
        I::new(TileOp::Range, TileType::I32, &[8]),
        I { a: 5, b: 6, kind: TileBinary::Add as u8, ..I::new(TileOp::Binary, TileType::I32, &[8]) },
        I { a: 0, ..I::new(TileOp::Splat, TileType::Ptr, &[8]) },
        I { a: 8, b: 7, ..I::new(TileOp::AddPtr, TileType::Ptr, &[8]) },
        I { a: 9, ..I::new(TileOp::Load, TileType::F32, &[8]) },
    ];
    v.extend_from_slice(middle);
    v.push(I { a: 1, slot: 1, ..I::new(TileOp::Splat, TileType::Ptr, &[8]) });
    v.push(I { a: n, b: 7, slot: 1, ..I::new(TileOp::AddPtr, TileType::Ptr, &[8]) });
    v.push(I { a: n + 1, b: n - 1, ..I::new(TileOp::Store, TileType::None, &[]) });
    encode(&v)
}

/// Run `bytes` over `grid` instances with x and an output of `out_len`
/// elements (initially -7); the output, or the fault.
fn run(bytes: &[u8], x: &[f32], out_len: usize, grid: u32) -> Result<Vec<f32>, TileFault> {
    let info = verify(bytes).unwrap();
    let out: Vec<AtomicU32> = (0..out_len).map(|_| AtomicU32::new((-7f32).to_bits())).collect();
    let mems = [TileMem::F32(x), TileMem::W32(&out)];
    let launch = TileLaunch { program: TileProgram::new(bytes).unwrap(), info, grid: [grid, 1, 1], params: [0; 16], bufs: &mems };
    run_tile(&launch)?;
    Ok(out.iter().map(|a| f32::from_bits(a.load(Ordering::Relaxed))).collect())
}

fn x16() -> Vec<f32> {
    (0..16).map(|i| i as f32 * 0.5 - 3.0).collect()
}

#[test]
fn element_wise_ops_compute_per_lane() {
    let x = x16();
    let f32c = |v: f32| I { imm: v.to_bits() as u64, ..I::new(TileOp::Const, TileType::F32, &[8]) };
    let bin = |k: TileBinary, a: u32, b: u32| I { a, b, kind: k as u8, ..I::new(TileOp::Binary, TileType::F32, &[8]) };
    let cases: Vec<(Vec<I>, fn(f32) -> f32)> = vec![
        (vec![f32c(2.0), bin(TileBinary::Mul, 10, 11)], |v| v * 2.0),
        (vec![f32c(0.0), bin(TileBinary::Max, 10, 11)], |v| v.max(0.0)),
        (vec![I { a: 10, kind: TileUnary::Exp as u8, ..I::new(TileOp::Unary, TileType::F32, &[8]) }], f32::exp),
        (vec![I { a: 10, kind: TileUnary::Floor as u8, ..I::new(TileOp::Unary, TileType::F32, &[8]) }], f32::floor),
        // select(x < 0, -x, x) = |x|
        (
            vec![
                f32c(0.0),
                I { a: 10, b: 11, kind: TileCmp::Lt as u8, ..I::new(TileOp::Compare, TileType::I1, &[8]) },
                I { a: 10, kind: TileUnary::Neg as u8, ..I::new(TileOp::Unary, TileType::F32, &[8]) },
                I { a: 12, b: 13, c: 10, ..I::new(TileOp::Select, TileType::F32, &[8]) },
            ],
            f32::abs,
        ),
        // f32 -> i32 -> f32 truncates toward zero.
        (
            vec![I { a: 10, ..I::new(TileOp::Convert, TileType::I32, &[8]) }, I { a: 11, ..I::new(TileOp::Convert, TileType::F32, &[8]) }],
            f32::trunc,
        ),
        // The row's sum, broadcast back: reshape to [1, 8], reduce, splat.
        (
            vec![
                I { a: 10, ..I::new(TileOp::Reshape, TileType::F32, &[1, 8]) },
                I { a: 11, axis: 1, kind: TileReduce::Sum as u8, ..I::new(TileOp::Reduce, TileType::F32, &[1]) },
                I { a: 12, ..I::new(TileOp::Broadcast, TileType::F32, &[8]) },
            ],
            |_| f32::NAN,
        ),
    ];
    for (i, (middle, f)) in cases.into_iter().enumerate() {
        let got = run(&program(&middle), &x, 16, 2).unwrap_or_else(|e| panic!("case {i}: {e}"));
        for (j, &g) in got.iter().enumerate() {
            let want = if i == 6 { x[j / 8 * 8..j / 8 * 8 + 8].iter().sum() } else { f(x[j]) };
            assert!((g - want).abs() <= 1e-6 * (1.0 + want.abs()), "case {i} lane {j}: {g} vs {want}");
        }
    }
}

#[test]
fn lanes_outside_a_buffer_fault_with_its_offset() {
    let x = x16();
    let bytes = program(&[]);
    assert_eq!(run(&bytes, &x, 12, 2), Err(TileFault::OutOfBounds { slot: 1, offset: 12, write: true }));
    assert_eq!(run(&bytes, &x[..9], 16, 2), Err(TileFault::OutOfBounds { slot: 0, offset: 9, write: false }));
    assert_eq!(run(&bytes, &x, 16, 2).unwrap(), x);
}

#[test]
fn damaged_programs_that_verify_run_without_panicking() {
    let base = program(&[
        I { imm: 2f32.to_bits() as u64, ..I::new(TileOp::Const, TileType::F32, &[8]) },
        I { a: 10, b: 11, kind: TileBinary::Mul as u8, ..I::new(TileOp::Binary, TileType::F32, &[8]) },
        I { a: 12, ..I::new(TileOp::Reshape, TileType::F32, &[2, 4]) },
        I { a: 13, imm: 0x0001, ..I::new(TileOp::Permute, TileType::F32, &[4, 2]) },
        I { a: 14, ..I::new(TileOp::Reshape, TileType::F32, &[8]) },
    ]);
    let x = x16();
    let mut rng = Rng::new(17);
    let (mut verified, mut ran) = (0, 0);
    for _ in 0..20_000 {
        let mut b = base.clone();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(b.len());
            b[at] = match rng.below(4) {
                0 => rng.below(256) as u8,
                1 => b[at].wrapping_add(1),
                2 => b[at].wrapping_sub(1),
                _ => 0xff,
            };
        }
        if verify(&b).is_err() {
            continue;
        }
        verified += 1;
        let info = verify(&b).unwrap();
        let out: Vec<AtomicU32> = (0..16).map(|_| AtomicU32::new(0)).collect();
        let xs: Vec<i32> = (0..16).collect();
        // The header may have changed the buffer types: give what it says.
        let h = TileProgram::new(&b).unwrap().header;
        let mems: Vec<TileMem<'_>> = (0..h.nbufs as usize)
            .map(|i| match (h.buf_types[i], info.stores & (1 << i) != 0) {
                (_, true) => TileMem::W32(&out),
                (2, false) => TileMem::I32(&xs),
                _ => TileMem::F32(&x),
            })
            .collect();
        let launch = TileLaunch { program: TileProgram::new(&b).unwrap(), info, grid: [2, 1, 1], params: [3; 16], bufs: &mems };
        if run_tile(&launch).is_ok() {
            ran += 1;
        }
    }
    // The mutations hit both sides of the verifier and the engine.
    assert!(verified > 100 && ran > 10, "verified {verified}, ran {ran}");
}
