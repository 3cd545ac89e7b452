//! `rbln-compile model.onnx -o model.rbln [--input-shape name=1x3x224x224]`
//! `rbln-compile model.tflite -o model.rbln`

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use rbln_compile::{compile, compile_tflite, parse_input_shape, tflite, CompileError, Options};

/// Compile an ONNX or float32 TFLite model into a .rbln file for the rbln NPU.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The model: ONNX, or TFLite (recognised by its "TFL3" identifier or
    /// a .tflite extension).
    model: PathBuf,
    /// Where to write the .rbln file (default: the model's path with .rbln).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Static shape for an input, NAME=D0xD1x... (repeatable); needed for
    /// inputs with dynamic dimensions.
    #[arg(long = "input-shape", value_name = "NAME=SHAPE")]
    input_shapes: Vec<String>,
    /// Model name stored in the file (default: the file's stem).
    #[arg(long)]
    name: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Also list the compiled graph: every node with its op, output shape
    /// and arena offset.
    #[arg(long)]
    list: bool,
}

/// Exit statuses: 1 unsupported or invalid model, 2 usage, 3 I/O.
fn fail(code: u8, msg: String) -> ExitCode {
    eprintln!("rbln-compile: error: {msg}");
    ExitCode::from(code)
}

fn main() -> ExitCode {
    // SAFETY: restoring a signal's default disposition at start-up, before
    // any other thread exists; no handler code is involved.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let args = Args::parse();
    let mut opts = Options::default();
    for s in &args.input_shapes {
        match parse_input_shape(s) {
            Ok(p) => opts.input_shapes.push(p),
            Err(e) => return fail(2, e.to_string()),
        }
    }
    let bytes = match std::fs::read(&args.model) {
        Ok(b) => b,
        Err(e) => return fail(3, format!("{}: {e}", args.model.display())),
    };
    let stem = args.model.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned());
    let name = args.name.clone().unwrap_or(stem);
    let t0 = Instant::now();
    // By content; a .tflite file without the identifier gets the TFLite
    // reader's error rather than the protobuf decoder's.
    let is_tflite_name = args.model.extension().is_some_and(|e| e.eq_ignore_ascii_case("tflite"));
    let result = if tflite::is_tflite(&bytes) || is_tflite_name { compile_tflite(&bytes, &name, &opts) } else { compile(&bytes, &name, &opts) };
    let compiled = match result {
        Ok(c) => c,
        Err(e @ CompileError::BadInputShape(_)) => return fail(2, e.to_string()),
        Err(e) => return fail(1, format!("{}: {e}", args.model.display())),
    };
    let file = match compiled.model.to_bytes() {
        Ok(f) => f,
        Err(e) => return fail(1, format!("encoding the .rbln file: {e}")),
    };
    let elapsed = t0.elapsed();
    let out = args.output.clone().unwrap_or_else(|| args.model.with_extension("rbln"));
    if let Err(e) = std::fs::write(&out, &file) {
        return fail(3, format!("{}: {e}", out.display()));
    }
    let r = &compiled.report;
    let m = &r.memory;
    let saved = 100.0 * (1.0 - m.planned_bytes as f64 / m.naive_bytes.max(1) as f64);
    if args.json {
        let ops: Vec<String> = r.device_ops.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        println!(
            "{{\"model\":\"{name}\",\"output\":\"{}\",\"format\":\"{}\",\"compile_ms\":{:.3},\"onnx_nodes\":{},\"device_ops\":{},\"views\":{},\"packed_gemm_weights\":{},\"int8_ops\":{},\"ops\":{{{}}},\"weights_bytes\":{},\"activations_naive_bytes\":{},\"activations_planned_bytes\":{},\"arena_bytes\":{},\"file_bytes\":{}}}",
            out.display(), r.format.name(), elapsed.as_secs_f64() * 1e3, r.onnx_nodes, r.device_op_count(), r.views, r.layouts.len(), r.int8.conv + r.int8.gemm, ops.join(","),
            m.weights_bytes, m.naive_bytes, m.planned_bytes, m.arena_bytes, file.len()
        );
    } else {
        println!("{} -> {} in {:.1} ms", args.model.display(), out.display(), elapsed.as_secs_f64() * 1e3);
        println!("  {} {} -> device ops {} (+{} views)", r.format.nodes_label(), r.onnx_nodes, r.device_op_count(), r.views);
        let f = &r.fused;
        println!(
            "  fused: {} GELU (erf), {} GELU (tanh), {} SiLU, {} layer norm, {} scale into weights, {} pad + {} BatchNorm/affine into conv, {} bias, {} residual, {} activation; {} dead ops dropped",
            f.gelu, f.gelu_tanh, f.silu, f.layer_norm, f.scale_into_weights, f.pad_into_conv, f.folded_into_conv, f.bias, f.residual, f.activation, f.dead
        );
        if r.int8.conv + r.int8.gemm > 0 {
            println!(
                "  int8: {} Conv and {} GEMM on integer kernels ({} with an int8 output), {} Add/Mul on int8 values",
                r.int8.conv, r.int8.gemm, r.int8.int8_out, r.int8.eltwise
            );
        }
        let ops: Vec<String> = r.device_ops.iter().map(|(k, v)| format!("{k} x{v}")).collect();
        println!("  ops: {}", ops.join(", "));
        println!("  layouts: {} GEMMs read constant B packed in panels (--list names them)", r.layouts.len());
        println!(
            "  memory: weights {} B, activations {} B planned vs {} B naive ({saved:.1}% saved), arena {} B, file {} B",
            m.weights_bytes, m.planned_bytes, m.naive_bytes, m.arena_bytes, file.len()
        );
    }
    if args.list {
        let layouts: std::collections::HashMap<&str, &str> =
            compiled.report.layouts.iter().map(|l| (l.op.as_str(), l.note.as_str())).collect();
        let g = &compiled.model.graph;
        for (i, n) in g.nodes.iter().enumerate() {
            let out = n.outputs.first().and_then(|&t| g.tensors.get(t as usize));
            let (shape, place) = out.map_or((String::new(), String::new()), |t| (format!("{:?}", t.shape), format!("{:?}", t.placement)));
            let what = if n.op.is_empty() { format!("{:?}", n.kind) } else { n.op.clone() };
            let layout = layouts.get(n.name.as_str()).map_or(String::new(), |l| format!("  [{l}]"));
            println!("  {i:4} {:40} {:36} {shape:20} {place}{layout}", n.name, what);
        }
    }
    ExitCode::SUCCESS
}
