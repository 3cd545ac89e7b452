//! The TTIR parser on what triton 3.9 itself prints for the custom-kernel
//! test kernels (tests/triton/kernels.py). `tests/triton/check.sh` makes
//! the files and runs this with `RBLN_TTIR_DIR` set (`--ignored`: a plain
//! `cargo test` has no triton to make them).

use std::collections::BTreeSet;
use std::path::PathBuf;

use rbln_compile::ttir::{parse, Attr, Op};

fn dir() -> PathBuf {
    PathBuf::from(std::env::var("RBLN_TTIR_DIR").expect("RBLN_TTIR_DIR: the directory tests/triton/kernels.py wrote"))
}

fn read(name: &str) -> String {
    let p = dir().join(format!("{name}.ttir"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every op, regions included.
fn all_ops(ops: &[Op]) -> Vec<&Op> {
    ops.iter().flat_map(|o| std::iter::once(o).chain(o.region.iter().flat_map(|r| all_ops(&r.ops)))).collect()
}

#[test]
#[ignore = "needs the TTIR that tests/triton/check.sh makes with triton"]
fn triton_kernels_parse() {
    // The op set the issue counts (about 25), which the lowering will take.
    let known: BTreeSet<&str> = [
        "tt.addptr", "tt.splat", "tt.broadcast", "tt.expand_dims", "tt.make_range", "tt.load", "tt.store", "tt.dot", "tt.reduce",
        "tt.reduce.return", "tt.trans", "tt.get_program_id", "tt.return", "arith.constant", "arith.addi", "arith.subi", "arith.muli",
        "arith.cmpi", "arith.cmpf", "arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.maxnumf", "arith.minnumf",
        "arith.select", "arith.andi", "arith.ori", "arith.sitofp", "math.exp", "math.sqrt", "math.rsqrt",
    ]
    .into();
    let mut seen = BTreeSet::new();
    for (name, dots, reduces) in [("add", 0, 0), ("softmax", 0, 2), ("matmul", 2, 0), ("layernorm", 0, 2), ("attention", 8, 8)] {
        let m = parse(&read(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(m.funcs.len(), 1, "{name}");
        let f = &m.funcs[0];
        assert_eq!(f.name, name);
        let ops = all_ops(&f.ops);
        let count = |n: &str| ops.iter().filter(|o| o.name == n).count();
        assert_eq!((count("tt.dot"), count("tt.reduce")), (dots, reduces), "{name}: dots and reductions");
        assert_eq!(f.ops.last().map(|o| o.name.as_str()), Some("tt.return"), "{name}");
        for o in &ops {
            assert!(known.contains(o.name.as_str()), "{name}: unexpected op {} at line {}", o.name, o.line);
            seen.insert(o.name.clone());
            // Every operand is defined earlier (or is an argument).
            for v in &o.operands {
                let defined = f.args.iter().any(|(a, _)| a == v)
                    || ops.iter().any(|d| d.line < o.line && d.results.contains(v))
                    || ops.iter().any(|d| d.region.as_ref().is_some_and(|r| r.args.iter().any(|(a, _)| a == v)));
                assert!(defined, "{name} line {}: {v} is not defined before", o.line);
            }
        }
        // The -inf of a masked max load is a float, not the hex text.
        if name == "softmax" {
            let cst = ops.iter().find(|o| o.name == "arith.constant").unwrap();
            assert_eq!(cst.value, Some(Attr::Splat(Box::new(Attr::Float(f64::NEG_INFINITY)))));
        }
    }
    assert!(seen.len() >= 20, "the kernels use {} distinct ops: {seen:?}", seen.len());
}

#[test]
#[ignore = "needs the TTIR that tests/triton/check.sh makes with triton"]
fn a_tl_range_loop_is_refused_with_its_line() {
    let text = read("range_loop");
    let line = text.lines().position(|l| l.contains("scf.for")).expect("triton printed an scf.for") + 1;
    let e = parse(&text).unwrap_err();
    assert_eq!(e.line, line);
    assert!(e.to_string().contains("scf.for (a loop over tl.range"), "{e}");
    // The error names the kernel's own line too: the `for` of kernels.py.
    let py = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/triton/kernels.py")).unwrap();
    let for_line = py.lines().position(|l| l.contains("for i in tl.range(0, n):")).unwrap() + 1;
    assert_eq!(e.kernel_line.as_deref(), Some(format!("kernels.py:{for_line}").as_str()), "{e}");
}

/// Deterministic test data in [-1, 1).
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// Lower `name` and run it on the host tile engine: `inputs` bound to the
/// pointer arguments in order (the stored ones are written in place),
/// `params` the scalar arguments' bits.
fn run_kernel(name: &str, bufs: &mut [Vec<f32>], params: &[u64], grid: [u32; 3]) {
    use rbln_kernels::{run_tile, TileLaunch, TileMem};
    use std::sync::atomic::AtomicU32;
    let k = rbln_compile::ttir::lower(&parse(&read(name)).unwrap(), None).unwrap_or_else(|e| panic!("{name}: {e}"));
    let info = rbln_hw::tile::verify(&k.program).unwrap();
    let staged: Vec<Vec<AtomicU32>> =
        bufs.iter().enumerate().map(|(i, b)| if k.stores & (1 << i) != 0 { b.iter().map(|v| AtomicU32::new(v.to_bits())).collect() } else { Vec::new() }).collect();
    let mems: Vec<TileMem<'_>> = bufs.iter().zip(&staged).enumerate().map(|(i, (b, s))| if k.stores & (1 << i) != 0 { TileMem::W32(s) } else { TileMem::F32(b) }).collect();
    let mut p = [0u64; 16];
    p[..params.len()].copy_from_slice(params);
    let launch = TileLaunch { program: rbln_hw::tile::TileProgram::new(&k.program).unwrap(), info, grid, params: p, bufs: &mems };
    run_tile(&launch).unwrap_or_else(|e| panic!("{name}: {e}"));
    drop(mems);
    for (i, s) in staged.into_iter().enumerate() {
        if k.stores & (1 << i) != 0 {
            bufs[i] = s.into_iter().map(|a| f32::from_bits(a.into_inner())).collect();
        }
    }
}

fn assert_close(name: &str, got: &[f32], want: &[f32]) {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() / scale <= 1e-5, "{name}[{i}]: {g} vs {w}");
    }
}

#[test]
#[ignore = "needs the TTIR that tests/triton/check.sh makes with triton"]
fn lowered_kernels_compute_on_the_tile_engine() {
    // add: n = 1000 over blocks of 256 (the mask cuts the last block).
    let n = 1000;
    let (x, y) = (data(n, 1), data(n, 2));
    let mut bufs = vec![x.clone(), y.clone(), vec![7.0; n + 24]];
    run_kernel("add", &mut bufs, &[n as u64], [4, 1, 1]);
    let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    assert_close("add", &bufs[2][..n], &want);
    assert!(bufs[2][n..].iter().all(|&v| v == 7.0), "add wrote past its mask");

    // softmax: 5 rows of 100 columns, stride 100.
    let (rows, cols) = (5, 100);
    let x = data(rows * cols, 3);
    let mut bufs = vec![x.clone(), vec![0.0; rows * cols]];
    run_kernel("softmax", &mut bufs, &[cols as u64, cols as u64], [rows as u32, 1, 1]);
    let mut want = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let s: f32 = row.iter().map(|v| (v - m).exp()).sum();
        for c in 0..cols {
            want[r * cols + c] = (row[c] - m).exp() / s;
        }
    }
    assert_close("softmax", &bufs[1], &want);

    // matmul: [M=50, K=64] x [64, N=40], 32x32 tiles, grid 2x2.
    let (m, kk, nn) = (50, 64, 40);
    let (a, b) = (data(m * kk, 4), data(kk * nn, 5));
    let mut bufs = vec![a.clone(), b.clone(), vec![0.0; m * nn]];
    run_kernel("matmul", &mut bufs, &[m as u64, nn as u64], [2, 2, 1]);
    let mut want = vec![0.0f32; m * nn];
    for i in 0..m {
        for j in 0..nn {
            want[i * nn + j] = (0..kk).map(|l| a[i * kk + l] * b[l * nn + j]).sum();
        }
    }
    assert_close("matmul", &bufs[2], &want);

    // layernorm: 3 rows of 100, eps 1e-5.
    let (rows, cols) = (3, 100);
    let (x, w, bias) = (data(rows * cols, 6), data(cols, 7), data(cols, 8));
    let mut bufs = vec![x.clone(), w.clone(), bias.clone(), vec![0.0; rows * cols]];
    run_kernel("layernorm", &mut bufs, &[cols as u64, 1e-5f32.to_bits() as u64], [rows as u32, 1, 1]);
    let mut want = vec![0.0; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mean = row.iter().sum::<f32>() / cols as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / cols as f32;
        for c in 0..cols {
            want[r * cols + c] = (row[c] - mean) / (var + 1e-5).sqrt() * w[c] + bias[c];
        }
    }
    assert_close("layernorm", &bufs[3], &want);

    // attention: SEQ 64, HEAD_DIM 32, causal, blocks of 16.
    let (seq, d) = (64, 32);
    let (q, k, v) = (data(seq * d, 9), data(seq * d, 10), data(seq * d, 11));
    let scale = 1.0 / (d as f32).sqrt();
    let mut bufs = vec![q.clone(), k.clone(), v.clone(), vec![0.0; seq * d]];
    run_kernel("attention", &mut bufs, &[scale.to_bits() as u64], [(seq / 16) as u32, 1, 1]);
    let mut want = vec![0.0f32; seq * d];
    for i in 0..seq {
        let s: Vec<f32> = (0..=i).map(|j| (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f32>() * scale).collect();
        let mx = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let e: Vec<f32> = s.iter().map(|x| (x - mx).exp()).collect();
        let sum: f32 = e.iter().sum();
        for c in 0..d {
            want[i * d + c] = (0..=i).map(|j| e[j] * v[j * d + c]).sum::<f32>() / sum;
        }
    }
    assert_close("attention", &bufs[3], &want);
}

#[test]
#[ignore = "needs the TTIR that tests/triton/check.sh makes with triton"]
fn a_kernel_launch_compiles_to_a_model() {
    use rbln_compile::ttir::{Binding, Scalar};
    let t = |name: &str, n: u64| Binding::Tensor { name: name.into(), shape: vec![n] };
    let c = rbln_compile::compile_kernel(&read("add"), None, [4, 1, 1], &[t("x", 1000), t("y", 1000), t("out", 1000), Binding::Scalar(Scalar::Int(1000))])
        .unwrap();
    assert_eq!(c.report.device_ops.get("TritonKernel"), Some(&1));
    let meta = &c.model.meta;
    assert_eq!(meta.inputs.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["x", "y", "out"]);
    assert_eq!(meta.outputs.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["out.out"]);
    c.model.validate().unwrap();
    // The launch is checked against the kernel's arguments.
    let e = rbln_compile::compile_kernel(&read("add"), None, [4, 1, 1], &[t("x", 1000)]).err().unwrap();
    assert!(e.to_string().contains("takes 4 arguments (x_ptr, y_ptr, out_ptr, n), the launch gives 1"), "{e}");
    let e = rbln_compile::compile_kernel(&read("add"), None, [4, 1, 1], &[t("x", 8), t("y", 8), t("o", 8), Binding::Scalar(Scalar::Float(0.5))]).err().unwrap();
    assert!(e.to_string().contains("is not a I32 value"), "{e}");
}
