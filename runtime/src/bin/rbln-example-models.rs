//! `rbln-example-models DIR`: write the example models (made with the
//! `.rbln` writer API) with inputs and CPU-reference outputs as .npy:
//! DIR/mlp.rbln, DIR/mlp.input.npy, DIR/mlp.expected.npy, plus
//! DIR/mlp.badshape.npy (an input of the wrong shape, for tests).
//!
//! `rbln-example-models compare GOT.npy WANT.npy [TOL]`: exit 0 when the
//! shapes match and every |got - want| <= TOL * (1 + |want|) (default 1e-4),
//! printing the largest absolute error, relative error (over values with
//! |want| >= 0.01) and scaled error |got - want| / (1 + |want|).

use std::path::PathBuf;

fn compare(args: &[String]) -> Result<(), String> {
    let got = rbln_runtime::npy::read(std::path::Path::new(&args[0]))?;
    let want = rbln_runtime::npy::read(std::path::Path::new(&args[1]))?;
    let tol: f32 = args.get(2).map_or(Ok(1e-4), |t| t.parse().map_err(|e| format!("tolerance: {e}")))?;
    if got.shape != want.shape {
        return Err(format!("shape {:?}, expected {:?}", got.shape, want.shape));
    }
    if got.dtype() != want.dtype() {
        return Err(format!("dtype {}, expected {}", got.dtype().name(), want.dtype().name()));
    }
    let (gv, wv) = (got.data.to_f64(), want.data.to_f64());
    let (abs, _) = rbln_runtime::examples::max_errors(&got, &want);
    // Relative error where it means something (|want| >= 0.01), and the
    // error scaled as the tolerance is: |got - want| / (1 + |want|).
    let (mut rel, mut scaled) = (0f32, 0f32);
    for (&g, &w) in gv.iter().zip(&wv) {
        let (g, w) = (g as f32, w as f32);
        let d = (g - w).abs();
        if w.abs() >= 0.01 {
            rel = rel.max(d / w.abs());
        }
        scaled = scaled.max(d / (1.0 + w.abs()));
    }
    println!("max abs error {abs:.3e}, max rel error {rel:.3e} (|want| >= 0.01), max scaled error {scaled:.3e}");
    let bad = gv.iter().zip(&wv).filter(|(g, w)| (*g - *w).abs() > tol as f64 * (1.0 + w.abs())).count();
    if bad > 0 {
        return Err(format!("{bad} values beyond tolerance {tol}"));
    }
    Ok(())
}

/// Two same-shaped arrays as f64.
fn read_pair(got: &str, want: &str) -> Result<(Vec<f64>, Vec<f64>), String> {
    let got = rbln_runtime::npy::read(std::path::Path::new(got))?;
    let want = rbln_runtime::npy::read(std::path::Path::new(want))?;
    if got.shape != want.shape {
        return Err(format!("shape {:?}, expected {:?}", got.shape, want.shape));
    }
    Ok((got.data.to_f64(), want.data.to_f64()))
}

/// `compare-steps GOT WANT STEP MAX`: outputs of a quantised model, whose
/// values are multiples of one quantisation step; every element may be
/// at most MAX steps from the reference. Prints how many differ by 0, 1
/// and more steps.
fn compare_steps(args: &[String]) -> Result<(), String> {
    let (g, w) = read_pair(&args[0], &args[1])?;
    let step: f64 = args[2].parse().map_err(|e| format!("step: {e}"))?;
    let max: f64 = args[3].parse().map_err(|e| format!("max steps: {e}"))?;
    let steps: Vec<f64> = g.iter().zip(&w).map(|(a, b)| ((a - b).abs() / step).round()).collect();
    let count = |f: &dyn Fn(f64) -> bool| steps.iter().filter(|&&s| f(s)).count();
    let worst = steps.iter().fold(0f64, |a, &b| a.max(b));
    println!(
        "{} elements: {} equal, {} one step apart, {} more (worst {worst} steps of {step:.4e})",
        steps.len(),
        count(&|s| s == 0.0),
        count(&|s| s == 1.0),
        count(&|s| s > 1.0)
    );
    if worst > max {
        return Err(format!("{} elements more than {max} steps from the reference", count(&|s| s > max)));
    }
    Ok(())
}

/// `cosine GOT REF MIN`: cosine similarity of two outputs at least MIN.
fn cosine(args: &[String]) -> Result<(), String> {
    let (g, w) = read_pair(&args[0], &args[1])?;
    let dot: f64 = g.iter().zip(&w).map(|(a, b)| a * b).sum();
    let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
    let cos = dot / (norm(&g) * norm(&w)).max(f64::MIN_POSITIVE);
    let min: f64 = args[2].parse().map_err(|e| format!("min: {e}"))?;
    println!("cosine similarity {cos:.5}");
    if cos.is_nan() || cos < min {
        return Err(format!("cosine similarity {cos:.5} below {min}"));
    }
    Ok(())
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match (args.first().map(String::as_str), args.len()) {
        (Some("compare"), n) if n >= 3 => return compare(&args[1..]),
        (Some("compare-steps"), 5) => return compare_steps(&args[1..]),
        (Some("cosine"), 4) => return cosine(&args[1..]),
        _ => {}
    }
    let dir = PathBuf::from(args.first().ok_or("usage: rbln-example-models DIR | compare GOT.npy WANT.npy [TOL] | compare-steps GOT.npy WANT.npy STEP MAX | cosine GOT.npy REF.npy MIN")?);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ex = rbln_runtime::examples::mlp(16, 256, 512, 10);
    ex.model.save(dir.join("mlp.rbln")).map_err(|e| e.to_string())?;
    rbln_runtime::npy::write(&dir.join("mlp.input.npy"), &ex.inputs[0])?;
    rbln_runtime::npy::write(&dir.join("mlp.expected.npy"), &ex.expected[0])?;
    rbln_runtime::npy::write(&dir.join("mlp.badshape.npy"), &rbln_runtime::Tensor::zeros(&[16, 255]))?;
    let cnn = rbln_runtime::examples::cnn(4, 3, 32, 16, 10);
    cnn.model.save(dir.join("cnn.rbln")).map_err(|e| e.to_string())?;
    rbln_runtime::npy::write(&dir.join("cnn.input.npy"), &cnn.inputs[0])?;
    rbln_runtime::npy::write(&dir.join("cnn.expected.npy"), &cnn.expected[0])?;
    // Transfer-heavy: a 512 KiB input per request against a 64x2048x512
    // GEMM, so that input transfer and compute take comparable time.
    let big = rbln_runtime::examples::mlp(64, 2048, 512, 16);
    big.model.save(dir.join("mlp-wide.rbln")).map_err(|e| e.to_string())?;
    rbln_runtime::npy::write(&dir.join("mlp-wide.input.npy"), &big.inputs[0])?;
    rbln_runtime::npy::write(&dir.join("mlp-wide.expected.npy"), &big.expected[0])?;
    eprintln!("wrote {}/mlp.rbln (+ .input.npy, .expected.npy)", dir.display());
    Ok(())
}
