//! The checked-in C header `include/rbln_umd.h` must be what cbindgen makes
//! of `src/capi.rs` today, and must compile as C and C++.

use std::path::{Path, PathBuf};
use std::process::Command;

const REGENERATE: &str = "RBLN_UPDATE_HEADER=1 cargo test -p rbln-umd --release --test header";

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate() -> Vec<u8> {
    let config = cbindgen::Config::from_file(dir().join("cbindgen.toml")).expect("umd/cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir().join("src/capi.rs"))
        .generate()
        .expect("cbindgen could not process umd/src/capi.rs");
    let mut out = Vec::new();
    bindings.write(&mut out);
    out
}

#[test]
fn header_is_fresh() {
    let path = dir().join("include/rbln_umd.h");
    let fresh = generate();
    if std::env::var_os("RBLN_UPDATE_HEADER").is_some_and(|v| v == "1") {
        std::fs::write(&path, &fresh).expect("writing umd/include/rbln_umd.h");
        eprintln!("wrote {}", path.display());
        return;
    }
    let old = std::fs::read(&path).unwrap_or_default();
    if old != fresh {
        let first = old.split(|&b| b == b'\n').zip(fresh.split(|&b| b == b'\n')).position(|(a, b)| a != b);
        panic!(
            "umd/include/rbln_umd.h is stale: it differs from what cbindgen generates from umd/src/capi.rs{}.\n\
             Regenerate it with\n    {REGENERATE}\nand commit the result.",
            first.map_or(String::from(" (length differs)"), |l| format!(" (first difference at line {})", l + 1))
        );
    }
}

fn compiles(compiler: &str, lang: &str, header: &Path) -> Option<std::process::Output> {
    let src = format!("#include \"{}\"\nint main(void) {{ return rbln_umd_abi_version() == RBLN_UMD_ABI_VERSION ? 0 : 1; }}\n", header.display());
    let tmp = std::env::temp_dir().join(format!("rbln_umd_header_{}_{lang}.{}", std::process::id(), if lang == "c" { "c" } else { "cpp" }));
    std::fs::write(&tmp, src).ok()?;
    let std = if lang == "c" { "-std=c11" } else { "-std=c++17" };
    let out = Command::new(compiler).args([std, "-Wall", "-Wextra", "-Werror", "-fsyntax-only"]).arg(&tmp).output().ok();
    let _ = std::fs::remove_file(&tmp);
    out
}

#[test]
fn header_compiles_as_c_and_cxx() {
    let header = dir().join("include/rbln_umd.h");
    for (cc, lang) in [("cc", "c"), ("c++", "c++")] {
        match compiles(cc, lang, &header) {
            None => eprintln!("skipped: no {cc} on this machine"),
            Some(out) => assert!(
                out.status.success(),
                "{} does not compile as {lang}:\n{}",
                header.display(),
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }
}
