//! Fused element-wise programs against the same steps run one by one with
//! the standalone kernels: the results must be bit-identical.

use super::elementwise::BINOPS;
use super::Rng;
use crate::*;

/// Input `x` of `shape` broadcast to `out_shape` (numpy rules), materialised.
fn broadcast_to(x: &[f32], shape: &[usize], out_shape: &[usize]) -> Vec<f32> {
    let n: usize = out_shape.iter().product();
    let pad = out_shape.len() - shape.len();
    (0..n)
        .map(|mut i| {
            let (mut src, mut stride) = (0, 1);
            for d in (0..out_shape.len()).rev() {
                let idx = i % out_shape[d];
                i /= out_shape[d];
                if d >= pad && shape[d - pad] != 1 {
                    src += idx * stride;
                }
                if d >= pad {
                    stride *= shape[d - pad];
                }
            }
            x[src]
        })
        .collect()
}

/// Element strides reading `shape` broadcast to `out_shape` (0 where
/// broadcast).
fn broadcast_strides(shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    let pad = out_shape.len() - shape.len();
    let mut st = vec![0; out_shape.len()];
    let mut acc = 1;
    for d in (pad..out_shape.len()).rev() {
        let n = shape[d - pad];
        st[d] = if n == 1 { 0 } else { acc };
        acc *= n;
    }
    st
}

/// The program run step by step with `unary` and `binary` on whole tensors.
fn reference(
    steps: &[EltStep],
    out_reg: u8,
    inputs: &[(Vec<f32>, Vec<usize>)],
    out_shape: &[usize],
) -> Vec<f32> {
    let n: usize = out_shape.iter().product();
    let mut regs: Vec<Option<Vec<f32>>> = vec![None; ELT_REGS];
    for (i, (x, s)) in inputs.iter().enumerate() {
        regs[i] = Some(broadcast_to(x, s, out_shape));
    }
    for s in steps {
        let (dst, v) = match *s {
            EltStep::Unary { op, dst, a } => {
                let mut y = vec![0.0; n];
                unary(op, regs[a as usize].as_ref().unwrap(), &mut y).unwrap();
                (dst, y)
            }
            EltStep::Binary { op, dst, a, b } => {
                let get = |o: EltOperand| match o {
                    EltOperand::Reg(r) => (regs[r as usize].clone().unwrap(), vec![n]),
                    EltOperand::Imm(v) => (vec![v], vec![1]),
                };
                let ((xa, sa), (xb, sb)) = (get(a), get(b));
                let mut y = vec![0.0; n];
                binary(op, &xa, &sa, &xb, &sb, &mut y).unwrap();
                (dst, y)
            }
        };
        regs[dst as usize] = Some(v);
    }
    regs[out_reg as usize].clone().unwrap()
}

const UNARIES: &[UnaryOp] = &[
    UnaryOp::Relu,
    UnaryOp::Sigmoid,
    UnaryOp::Tanh,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Abs,
    UnaryOp::Neg,
    UnaryOp::Sqrt,
    UnaryOp::Erf,
    UnaryOp::Gelu,
    UnaryOp::Silu,
    UnaryOp::Reciprocal,
    UnaryOp::HardSwish,
    UnaryOp::Clip {
        min: -0.5,
        max: 0.25,
    },
    UnaryOp::HardSigmoid {
        alpha: 0.2,
        beta: 0.5,
    },
    UnaryOp::Floor,
    UnaryOp::Sin,
    UnaryOp::Sign,
];

fn same_bits(ctx: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{ctx}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{ctx}: element {i}: got {g}, want {w}"
        );
    }
}

#[test]
fn random_programs_match_the_ops_run_one_by_one() {
    let mut rng = Rng::new(2207);
    for it in 0..400 {
        let rank = rng.range(1, 4);
        // Sizes around the block length too, so rows split into blocks.
        let out_shape: Vec<usize> = (0..rank)
            .map(|_| rng.pick(&[1, 2, 3, 7, 16, 33, 300]))
            .collect();
        if out_shape.iter().product::<usize>() > 200_000 {
            continue;
        }
        let n_in = rng.range(1, ELT_MAX_INPUTS);
        let inputs: Vec<(Vec<f32>, Vec<usize>)> = (0..n_in)
            .map(|_| {
                let drop = rng.below(rank + 1).min(rank - 1);
                let shape: Vec<usize> = out_shape[drop..]
                    .iter()
                    .map(|&d| if rng.below(3) == 0 { 1 } else { d })
                    .collect();
                (rng.vec_in(shape.iter().product(), -3.0, 3.0), shape)
            })
            .collect();
        let mut defined: Vec<u8> = (0..n_in as u8).collect();
        let steps: Vec<EltStep> = (0..rng.range(1, 16))
            .map(|_| {
                let dst = rng.below(ELT_REGS) as u8;
                let reg = rng.pick(&defined);
                let step = if rng.below(3) == 0 {
                    EltStep::Unary {
                        op: rng.pick(UNARIES),
                        dst,
                        a: reg,
                    }
                } else {
                    let other = if rng.below(3) == 0 {
                        EltOperand::Imm(rng.pick(&[2.0, 3.0, 0.5, -1.25]))
                    } else {
                        EltOperand::Reg(rng.pick(&defined))
                    };
                    let (a, b) = if rng.bool() {
                        (EltOperand::Reg(reg), other)
                    } else {
                        (other, EltOperand::Reg(reg))
                    };
                    EltStep::Binary {
                        op: rng.pick(BINOPS),
                        dst,
                        a,
                        b,
                    }
                };
                if !defined.contains(&dst) {
                    defined.push(dst);
                }
                step
            })
            .collect();
        let out_reg = rng.pick(&defined);
        let want = reference(&steps, out_reg, &inputs, &out_shape);
        let mut got = vec![f32::NAN; want.len()];
        let strides: Vec<Vec<usize>> = inputs.iter().map(|(_, s)| broadcast_strides(s, &out_shape)).collect();
        let ins: Vec<(&[f32], &[usize])> = inputs.iter().zip(&strides).map(|((x, _), st)| (x.as_slice(), st.as_slice())).collect();
        eltwise(&steps, out_reg, &ins, &out_shape, &mut got).unwrap();
        same_bits(
            &format!("case {it}: {out_shape:?} {steps:?} -> r{out_reg}"),
            &got,
            &want,
        );
    }
}

#[test]
fn a_large_program_runs_in_parallel_and_matches() {
    // softplus(x) · scale[c] over [4, 64, 1000]: relu(x) + log(1 + exp(-|x|)).
    let mut rng = Rng::new(9);
    let (x, s) = (rng.vec_in(4 * 64 * 1000, -8.0, 8.0), rng.vec(64));
    let shape = [4, 64, 1000];
    let r = EltOperand::Reg;
    let steps = [
        EltStep::Unary {
            op: UnaryOp::Abs,
            dst: 2,
            a: 0,
        },
        EltStep::Unary {
            op: UnaryOp::Neg,
            dst: 2,
            a: 2,
        },
        EltStep::Unary {
            op: UnaryOp::Exp,
            dst: 2,
            a: 2,
        },
        EltStep::Binary {
            op: BinaryOp::Add,
            dst: 2,
            a: EltOperand::Imm(1.0),
            b: r(2),
        },
        EltStep::Unary {
            op: UnaryOp::Log,
            dst: 2,
            a: 2,
        },
        EltStep::Unary {
            op: UnaryOp::Relu,
            dst: 3,
            a: 0,
        },
        EltStep::Binary {
            op: BinaryOp::Add,
            dst: 2,
            a: r(3),
            b: r(2),
        },
        EltStep::Binary {
            op: BinaryOp::Mul,
            dst: 0,
            a: r(2),
            b: r(1),
        },
    ];
    let inputs = vec![(x, shape.to_vec()), (s, vec![64, 1])];
    let want = reference(&steps, 0, &inputs, &shape);
    let mut got = vec![0.0; want.len()];
    let strides: Vec<Vec<usize>> = inputs.iter().map(|(_, s)| broadcast_strides(s, &shape)).collect();
    let ins: Vec<(&[f32], &[usize])> = inputs.iter().zip(&strides).map(|((x, _), st)| (x.as_slice(), st.as_slice())).collect();
    eltwise(&steps, 0, &ins, &shape, &mut got).unwrap();
    same_bits("softplus * scale", &got, &want);
    // The result is an input, untouched by any step.
    eltwise(&steps, 1, &ins, &shape, &mut got).unwrap();
    same_bits(
        "out_reg = input 1",
        &got,
        &broadcast_to(&inputs[1].0, &[64, 1], &shape),
    );
}

#[test]
fn strided_inputs_read_transposes_and_slices() {
    // out[i][j] = A^T[i][j] * B[i][2 + j] + c[j] over [4, 3] (and over
    // [4, 300], where rows split into blocks and are gathered per block).
    for cols in [3usize, 300] {
        let mut rng = Rng::new(cols as u64);
        let (a, b, c) = (rng.vec(cols * 4), rng.vec(4 * (cols + 4)), rng.vec(cols));
        let steps = [
            EltStep::Binary { op: BinaryOp::Mul, dst: 3, a: EltOperand::Reg(0), b: EltOperand::Reg(1) },
            EltStep::Binary { op: BinaryOp::Add, dst: 3, a: EltOperand::Reg(3), b: EltOperand::Reg(2) },
        ];
        let (a_st, b_st, c_st) = ([1, 4], [cols + 4, 1], [0, 1]);
        let ins: [(&[f32], &[usize]); 3] = [(&a, &a_st), (&b[2..], &b_st), (&c, &c_st)];
        let mut got = vec![0.0; 4 * cols];
        eltwise(&steps, 3, &ins, &[4, cols], &mut got).unwrap();
        let want: Vec<f32> = (0..4 * cols).map(|e| {
            let (i, j) = (e / cols, e % cols);
            a[j * 4 + i] * b[i * (cols + 4) + 2 + j] + c[j]
        }).collect();
        same_bits(&format!("{cols} columns"), &got, &want);
    }
}

#[test]
fn bad_programs_and_shapes_are_refused_without_writing() {
    let x = [1.0f32; 6];
    let (shape, s): (&[usize], &[usize]) = (&[2, 3], &[3, 1]);
    let add = |dst, a, b| EltStep::Binary { op: BinaryOp::Add, dst, a, b };
    let r = EltOperand::Reg;
    let one = || vec![add(1, r(0), r(0))];
    let cases: Vec<(Vec<EltStep>, u8, Vec<(&[f32], &[usize])>, &[usize])> = vec![
        (vec![add(1, r(0), r(2))], 1, vec![(&x, s)], shape),                                 // r2 holds nothing
        (vec![add(8, r(0), r(0))], 0, vec![(&x, s)], shape),                                 // no register 8
        (vec![add(1, EltOperand::Imm(1.0), EltOperand::Imm(2.0))], 1, vec![(&x, s)], shape), // two immediates
        (one(), 3, vec![(&x, s)], shape),                                                    // out_reg empty
        (one(), 1, vec![], shape),                                                           // no inputs
        (one(), 1, vec![(&x, s); 5], shape),                                                 // five inputs
        (one(), 1, vec![(&x, &[1])], shape),                                                 // strides of rank 1
        (one(), 1, vec![(&x[..5], s)], shape),                                               // reads past the slice
        (one(), 1, vec![(&x, &[4, 1])], shape),                                              // reads past the slice
        (one(), 1, vec![(&x, &[usize::MAX, 1])], shape),                                     // extent overflows
        (one(), 1, vec![(&x, &[0; 7])], &[1, 2, 3, 1, 1, 1, 1]),                             // rank 7
    ];
    for (i, (steps, out_reg, ins, out_shape)) in cases.into_iter().enumerate() {
        let mut out = vec![7.0f32; out_shape.iter().product()];
        assert!(eltwise(&steps, out_reg, &ins, out_shape, &mut out).is_err(), "case {i}");
        assert!(out.iter().all(|&v| v == 7.0), "case {i} wrote its output");
    }
    let mut short = [0.0f32; 5];
    assert!(eltwise(&one(), 1, &[(&x, s)], shape, &mut short).is_err());
}

#[test]
fn short_rows_are_batched_per_block_and_match() {
    // BatchNorm + ReLU on small maps, x · scale[c] + shift[c]: rows of 49,
    // 9 and 1 elements, several per block, some blocks ending mid-task,
    // enough of them to run in parallel.
    let r = EltOperand::Reg;
    let steps = [
        EltStep::Binary { op: BinaryOp::Mul, dst: 3, a: r(0), b: r(1) },
        EltStep::Binary { op: BinaryOp::Add, dst: 3, a: r(3), b: r(2) },
        EltStep::Unary { op: UnaryOp::Relu, dst: 3, a: 3 },
    ];
    for (n, c, hw) in [(1usize, 864usize, 7usize), (3, 77, 3), (2, 300, 1), (4, 1000, 7)] {
        let mut rng = Rng::new((c * hw) as u64);
        let shape = vec![n, c, hw, hw];
        let inputs = vec![
            (rng.vec_in(n * c * hw * hw, -2.0, 2.0), shape.clone()),
            (rng.vec(c), vec![c, 1, 1]),
            (rng.vec(c), vec![c, 1, 1]),
        ];
        let strides: Vec<Vec<usize>> = inputs.iter().map(|(_, s)| broadcast_strides(s, &shape)).collect();
        let ins: Vec<(&[f32], &[usize])> = inputs.iter().zip(&strides).map(|((x, _), st)| (x.as_slice(), st.as_slice())).collect();
        for out_reg in [3u8, 1] {
            let want = reference(&steps, out_reg, &inputs, &shape);
            let mut got = vec![f32::NAN; want.len()];
            eltwise(&steps, out_reg, &ins, &shape, &mut got).unwrap();
            same_bits(&format!("{shape:?} -> r{out_reg}"), &got, &want);
        }
    }
}
