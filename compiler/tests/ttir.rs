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
}
