//! The TTIR parser on hand-written kernels in the form triton 3.9 prints
//! (vector add, a keep_dims reduction, a dot), its refusals with their
//! lines, and random damage that must give errors, never panics. The
//! kernels triton itself prints are parsed by `tests/ttir.rs`
//! (tests/triton/check.sh).

use super::*;

const ADD: &str = r#"module {
  tt.func public @add(%arg0: !tt.ptr<f32> {tt.divisibility = 16 : i32}, %arg1: !tt.ptr<f32>, %arg2: !tt.ptr<f32>, %arg3: i32) attributes {noinline = false} {
    %cst = arith.constant dense<0.000000e+00> : tensor<256xf32>
    %c256_i32 = arith.constant 256 : i32
    %0 = tt.get_program_id x : i32
    %1 = arith.muli %0, %c256_i32 : i32
    %2 = tt.make_range {end = 256 : i32, start = 0 : i32} : tensor<256xi32>
    %3 = tt.splat %1 : i32 -> tensor<256xi32>
    %4 = arith.addi %3, %2 : tensor<256xi32>
    %5 = tt.splat %arg3 : i32 -> tensor<256xi32>
    %6 = arith.cmpi slt, %4, %5 : tensor<256xi32>
    %7 = tt.splat %arg0 : !tt.ptr<f32> -> tensor<256x!tt.ptr<f32>>
    %8 = tt.addptr %7, %4 : tensor<256x!tt.ptr<f32>>, tensor<256xi32>
    %9 = tt.load %8, %6, %cst : tensor<256x!tt.ptr<f32>>
    %10 = arith.addf %9, %9 : tensor<256xf32>
    tt.store %8, %10, %6 : tensor<256x!tt.ptr<f32>>
    tt.return
  }
}
"#;

const REDUCE: &str = r#"module {
  tt.func public @rowmax(%arg0: !tt.ptr<f32>, %arg1: !tt.ptr<f32>) attributes {noinline = false} {
    %cst = arith.constant dense<0xFF800000> : tensor<16x128xf32>
    %0 = tt.make_range {end = 128 : i32, start = 0 : i32} : tensor<128xi32>
    %1 = tt.expand_dims %0 {axis = 0 : i32} : tensor<128xi32> -> tensor<1x128xi32>
    %2 = tt.broadcast %1 : tensor<1x128xi32> -> tensor<16x128xi32>
    %3 = tt.splat %arg0 : !tt.ptr<f32> -> tensor<16x128x!tt.ptr<f32>>
    %4 = tt.addptr %3, %2 : tensor<16x128x!tt.ptr<f32>>, tensor<16x128xi32>
    %5 = tt.load %4 : tensor<16x128x!tt.ptr<f32>>
    %6 = "tt.reduce"(%5) <{axis = 1 : i32}> ({
    ^bb0(%arg2: f32, %arg3: f32):
      %9 = arith.maxnumf %arg2, %arg3 : f32
      tt.reduce.return %9 : f32
    }) : (tensor<16x128xf32>) -> tensor<16xf32>
    %7 = tt.dot %5, %5, %cst, inputPrecision = tf32 : tensor<16x128xf32> * tensor<128x16xf32> -> tensor<16x16xf32>
    %8 = arith.sitofp %arg1 : i32 to f32
    tt.return
  }
}
"#;

#[test]
fn a_masked_vector_add_parses() {
    let m = parse(ADD).unwrap();
    let f = &m.funcs[0];
    assert_eq!(f.name, "add");
    assert_eq!(f.args[0], ("%arg0".into(), Type::Ptr(Box::new(Type::Float(32)))));
    assert_eq!(f.args[3].1, Type::Int(32));
    assert_eq!(f.ops.len(), 15);
    let cst = &f.ops[0];
    assert_eq!((cst.name.as_str(), cst.results.as_slice()), ("arith.constant", &["%cst".to_string()][..]));
    assert_eq!(cst.value, Some(Attr::Splat(Box::new(Attr::Float(0.0)))));
    assert_eq!(cst.types, [Type::Tensor(vec![256], Box::new(Type::Float(32)))]);
    assert_eq!(f.ops[1].value, Some(Attr::Int(256)));
    assert_eq!(f.ops[2].keyword.as_deref(), Some("x"));
    let range = &f.ops[4];
    assert_eq!((range.attr("start"), range.attr("end")), (Some(&Attr::Int(0)), Some(&Attr::Int(256))));
    let cmp = &f.ops[8];
    assert_eq!((cmp.keyword.as_deref(), cmp.operands.as_slice()), (Some("slt"), &["%4".to_string(), "%5".to_string()][..]));
    let splat = &f.ops[9];
    assert_eq!(splat.types[1], Type::Tensor(vec![256], Box::new(Type::Ptr(Box::new(Type::Float(32))))));
    let load = &f.ops[11];
    assert_eq!((load.operands.len(), load.line), (3, 14));
    let store = &f.ops[13];
    assert!(store.results.is_empty() && store.operands == ["%8", "%10", "%6"]);
    assert_eq!(f.ops[14].name, "tt.return");
}

#[test]
fn reductions_dots_and_casts_parse() {
    let m = parse(REDUCE).unwrap();
    let ops = &m.funcs[0].ops;
    assert_eq!(ops[0].value, Some(Attr::Splat(Box::new(Attr::Float(f64::NEG_INFINITY)))), "0xFF800000 is -inf as f32");
    assert_eq!(ops[2].attr("axis"), Some(&Attr::Int(0)));
    let red = &ops[7];
    assert_eq!((red.name.as_str(), red.operands.as_slice(), red.attr("axis")), ("tt.reduce", &["%5".to_string()][..], Some(&Attr::Int(1))));
    let region = red.region.as_ref().unwrap();
    assert_eq!(region.args.len(), 2);
    assert_eq!(region.ops.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), ["arith.maxnumf", "tt.reduce.return"]);
    assert_eq!(red.types, [Type::Tensor(vec![16, 128], Box::new(Type::Float(32))), Type::Tensor(vec![16], Box::new(Type::Float(32)))]);
    let dot = &ops[8];
    assert_eq!((dot.operands.len(), dot.types.len()), (3, 3));
    assert_eq!(dot.attr("inputPrecision"), Some(&Attr::Other("tf32".into())));
    assert_eq!(ops[9].types, [Type::Int(32), Type::Float(32)]);
    assert_eq!(ops[10].name, "tt.return");
}

#[test]
fn refusals_name_the_line() {
    let with = |line: &str| ADD.replace("    %10 = arith.addf %9, %9 : tensor<256xf32>", line);
    let cases = [
        ("    %10 = scf.for %a = %c0 to %n step %c1 iter_args(%b = %cst) -> (tensor<256xf32>) : i32 {", "TTIR line 15: scf.for (a loop over tl.range"),
        ("    %10 = scf.if %6 -> (f32) {", "TTIR line 15: scf.if (data-dependent control flow)"),
        ("    %10 = tt.call @helper(%9) : (tensor<256xf32>) -> tensor<256xf32>", "TTIR line 15: tt.call"),
        ("    %10 = \"tt.scan\"(%9) <{axis = 0 : i32}> ({", "TTIR line 15: generic-form op \"tt.scan\""),
        ("    %10 = arith.addf %9, %9 : tensor<256xq32>", "TTIR line 15: unknown type `q32`"),
        ("    %10 = arith.addf %9, 9 : tensor<256xf32>", "TTIR line 15: arith.addf: unexpected `9`"),
        ("    %10 = arith.addf %9, %9 : tensor<?xf32>", "tensor type without static dims"),
        ("    10 = arith.addf %9", "TTIR line 15: expected an op name"),
    ];
    for (line, want) in cases {
        let e = parse(&with(line)).unwrap_err().to_string();
        assert!(e.contains(want), "{line}\n-> {e}\nwanted {want}");
    }
    assert_eq!(parse("").unwrap_err().to_string(), "TTIR line 1: empty text: expected `module {`");
    assert!(parse("module {\n}\n").unwrap_err().msg.contains("no tt.func"));
    assert!(parse(&ADD[..ADD.len() - 3]).unwrap_err().msg.contains("not closed"));
    assert!(parse(&format!("{ADD}}}\n")).unwrap_err().msg.contains("text after the module"));
    let deep = format!("{}f32{}", "!tt.ptr<".repeat(40), ">".repeat(40));
    assert!(parse(&ADD.replace("%arg3: i32", &format!("%arg3: {deep}"))).unwrap_err().msg.contains("nested too deeply"));
}

#[test]
fn damaged_text_never_panics() {
    // Every prefix, and 4000 seeded single-byte mutations of both kernels.
    for src in [ADD, REDUCE] {
        for cut in 0..src.len() {
            if src.is_char_boundary(cut) {
                let _ = parse(&src[..cut]);
            }
        }
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let alphabet = b"%{}()<>[]:,=\"-> x0123456789.@^#abcdefghijklmnopqrstuvwxyz!\n";
        for _ in 0..4000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let mut b = src.as_bytes().to_vec();
            let at = (s % b.len() as u64) as usize;
            match (s >> 32) % 3 {
                0 => b[at] = alphabet[(s >> 40) as usize % alphabet.len()],
                1 => {
                    b.remove(at);
                }
                _ => b.insert(at, alphabet[(s >> 40) as usize % alphabet.len()]),
            }
            // Whatever parses also goes through the lowering (and the
            // hardware verifier it ends with): errors, never panics.
            if let Ok(m) = parse(&String::from_utf8_lossy(&b)) {
                let _ = lower(&m, None);
            }
        }
    }
}

#[test]
fn the_add_kernel_lowers_and_refusals_name_the_op() {
    let k = lower(&parse(ADD).unwrap(), None).unwrap();
    assert_eq!(k.name, "add");
    assert_eq!((k.loads, k.stores, k.grid_rank), (0b001, 0b001, 1));
    assert!(matches!(&k.args[3], KernelArg::Param { slot: 0, dtype: rbln_hw::tile::TileType::I32, .. }));
    rbln_hw::tile::verify(&k.program).unwrap();
    let refuse = |text: String, want: &str| {
        let e = lower(&parse(&text).unwrap(), None).unwrap_err().to_string();
        assert!(e.contains(want), "{e} (wanted {want})");
    };
    refuse(ADD.replace("tensor<256xf32>", "tensor<256xf16>"), "element type f16 is not supported");
    refuse(ADD.replace("%10 = arith.addf %9, %9", "%10 = arith.addf %9, %cst_x"), "reads %cst_x, which is not defined");
    refuse(ADD.replace("arith.cmpi slt", "arith.cmpi foo"), "predicate foo is not supported");
    refuse(ADD.replace("%10 = arith.addf %9, %9 : tensor<256xf32>", "%10 = tt.print %9 : tensor<256xf32>"), "tt.print");
    refuse(ADD.replace("%10 = arith.addf %9, %9", "%10 = arith.addf %9, %4"), "operands of different types or shapes");
    // The reduction kernel's dot multiplies [16x128] by [16x128].
    refuse(REDUCE.to_string(), "tt.dot: [16x128] times [16x128]");
}

/// What triton's `str()` prints: locations on ops, arguments and the
/// closing brace of a region, and the `#loc` table around the module.
const LOCATED: &str = r##"#loc = loc("/home/u/k.py":10:1)
#loc2 = loc("/home/u/k.py":12:9)
module {
  tt.func public @k(%x_ptr: !tt.ptr<f32> loc("x_ptr"(#loc)), %n: i32 loc("n"(#loc))) attributes {noinline = false} {
    %acc = arith.constant dense<0.000000e+00> : tensor<64xf32> loc(#loc9)
    %c0_i32 = arith.constant 0 : i32 loc(#loc3)
    %c1_i32 = arith.constant 1 : i32 loc(#loc3)
    %acc_0 = scf.for %i = %c0_i32 to %n step %c1_i32 iter_args(%acc_1 = %acc) -> (tensor<64xf32>)  : i32 {
      scf.yield %acc_1 : tensor<64xf32> loc(#loc3)
    } loc(#loc5)
    tt.return loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc1 = loc("/site-packages/triton/language/standard.py":155:12)
#loc3 = loc("/home/u/k.py":13:5)
#loc4 = loc(unknown)
#loc5 = loc("acc"(#loc3))
#loc8 = loc("acc"(#loc2))
#loc9 = loc(callsite(#loc1 at #loc8))
"##;

#[test]
fn locations_resolve_to_the_kernels_lines() {
    // The loop is refused at its TTIR line, naming the `for` (line 13 of
    // k.py, from the location on the loop's closing brace).
    let e = parse(LOCATED).unwrap_err();
    assert_eq!((e.line, e.kernel_line.as_deref()), (8, Some("k.py:13")), "{e}");
    assert_eq!(e.to_string().split(':').next(), Some("TTIR line 8 (k.py"));
    // Without the loop: the constant made inside tl.zeros (triton's
    // library) points at the kernel line that called it.
    let no_loop: String = LOCATED.lines().filter(|l| !l.contains("scf.") && !l.trim_start().starts_with("} loc(#loc5)")).map(|l| format!("{l}\n")).collect();
    let m = parse(&no_loop).unwrap();
    assert_eq!(m.funcs[0].args.iter().map(|a| a.0.as_str()).collect::<Vec<_>>(), ["%x_ptr", "%n"]);
    let cst = &m.funcs[0].ops[0];
    assert_eq!(m.sources.get(&cst.line).map(String::as_str), Some("k.py:12"));
    // A lowering error is located too.
    let bad = no_loop.replace("arith.constant 1 : i32", "arith.constant 1 : i8");
    let e = lower(&parse(&bad).unwrap(), None).unwrap_err();
    assert_eq!(e.kernel_line.as_deref(), Some("k.py:13"), "{e}");
}
