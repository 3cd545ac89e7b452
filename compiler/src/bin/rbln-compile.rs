//! `rbln-compile model.onnx -o model.rbln [--input-shape name=1x3x224x224]`
//! `rbln-compile model.tflite -o model.rbln`
//! `rbln-compile --entry prefill=prefill.onnx --entry decode=decode.onnx -o lm.rbln`

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use rbln_compile::pack::{count, LayoutKind};
use rbln_compile::{compile, compile_entries, compile_tflite, parse_input_shape, tflite, CompileError, Compiled, Options, Report};

/// Compile an ONNX or float32 TFLite model into a .rbln file for the rbln NPU.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The model: ONNX, or TFLite (recognised by its "TFL3" identifier or
    /// a .tflite extension). Not with --entry.
    #[arg(required_unless_present = "entries", conflicts_with = "entries")]
    model: Option<PathBuf>,
    /// An entry point NAME compiled from FILE (repeatable; the first is the
    /// main program): one .rbln holding every program over one copy of
    /// their weights, e.g. a decoder's prefill and decode steps. Needs -o.
    #[arg(long = "entry", value_name = "NAME=FILE", id = "entries", requires = "output")]
    entries: Vec<String>,
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
    /// Keep element-wise ops as separate device ops instead of fusing
    /// their chains into ELTWISE programs (to look at a chain op by op).
    #[arg(long)]
    no_eltwise: bool,
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
    let mut opts = Options { unfused_elementwise: args.no_eltwise, ..Default::default() };
    for s in &args.input_shapes {
        match parse_input_shape(s) {
            Ok(p) => opts.input_shapes.push(p),
            Err(e) => return fail(2, e.to_string()),
        }
    }
    let read = |path: &PathBuf| std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()));
    let t0 = Instant::now();
    let (compiled, source, out, name) = if let Some(model) = &args.model {
        let bytes = match read(model) {
            Ok(b) => b,
            Err(e) => return fail(3, e),
        };
        let stem = model.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned());
        let name = args.name.clone().unwrap_or(stem);
        // By content; a .tflite file without the identifier gets the
        // TFLite reader's error rather than the protobuf decoder's.
        let is_tflite_name = model.extension().is_some_and(|e| e.eq_ignore_ascii_case("tflite"));
        let result = if tflite::is_tflite(&bytes) || is_tflite_name { compile_tflite(&bytes, &name, &opts) } else { compile(&bytes, &name, &opts) };
        let out = args.output.clone().unwrap_or_else(|| model.with_extension("rbln"));
        (result, model.display().to_string(), out, name)
    } else {
        let mut sources = Vec::new();
        for e in &args.entries {
            let Some((n, path)) = e.split_once('=').filter(|(n, p)| !n.is_empty() && !p.is_empty()) else {
                return fail(2, format!("--entry {e}: expected NAME=FILE"));
            };
            match read(&PathBuf::from(path)) {
                Ok(b) => sources.push((n.to_string(), b)),
                Err(e) => return fail(3, e),
            }
        }
        let out = args.output.clone().unwrap_or_default();
        let stem = out.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned());
        let name = args.name.clone().unwrap_or(stem);
        let refs: Vec<(&str, &[u8])> = sources.iter().map(|(n, b)| (n.as_str(), b.as_slice())).collect();
        let what = sources.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ");
        (compile_entries(&refs, &name, &opts), format!("entries {what}"), out, name)
    };
    let compiled = match compiled {
        Ok(c) => c,
        Err(e @ CompileError::BadInputShape(_)) => return fail(2, e.to_string()),
        Err(e) => return fail(1, format!("{source}: {e}")),
    };
    let file = match compiled.model.to_bytes() {
        Ok(f) => f,
        Err(e) => return fail(1, format!("encoding the .rbln file: {e}")),
    };
    let elapsed = t0.elapsed();
    if let Err(e) = std::fs::write(&out, &file) {
        return fail(3, format!("{}: {e}", out.display()));
    }
    let reports = reports(&compiled);
    // What the programs read of the shared weights, and what one file per
    // entry point would hold.
    let used: Vec<u64> = compiled.model.entry_points().iter().map(|e| e.weight_bytes_used()).collect();
    if args.json {
        let entry_json: Vec<String> = reports.iter().zip(&used).map(|((n, r), u)| format!("{{\"entry\":\"{n}\",{},\"weights_used_bytes\":{u}}}", report_json(r))).collect();
        let main = &compiled.report;
        println!(
            "{{\"model\":\"{name}\",\"output\":\"{}\",\"compile_ms\":{:.3},{},\"file_bytes\":{},\"entries\":[{}],\"weights_separate_bytes\":{}}}",
            out.display(), elapsed.as_secs_f64() * 1e3, report_json(main), file.len(), entry_json.join(","), used.iter().sum::<u64>()
        );
    } else {
        println!("{source} -> {} in {:.1} ms", out.display(), elapsed.as_secs_f64() * 1e3);
        let several = reports.len() > 1;
        for (n, r) in &reports {
            if several {
                println!("  entry {n}:");
            }
            print_report(r, file.len(), if several { "    " } else { "  " });
        }
        if several {
            let each: Vec<String> = reports.iter().zip(&used).map(|((n, _), u)| format!("{n} {u} B")).collect();
            println!(
                "  shared weights: {} B stored once for {} entry points (each reads: {}; one file per entry would hold {} B)",
                compiled.model.weights.len(), reports.len(), each.join(", "), used.iter().sum::<u64>()
            );
        }
    }
    if args.list {
        for (e, (n, r)) in compiled.model.entry_points().iter().zip(&reports) {
            if reports.len() > 1 {
                println!("  entry {n}:");
            }
            let layouts: std::collections::HashMap<&str, &str> = r.layouts.iter().map(|l| (l.op.as_str(), l.note.as_str())).collect();
            let g = e.graph;
            for (i, n) in g.nodes.iter().enumerate() {
                let out = n.outputs.first().and_then(|&t| g.tensors.get(t as usize));
                let (shape, place) = out.map_or((String::new(), String::new()), |t| (format!("{:?}", t.shape), format!("{:?}", t.placement)));
                let what = match (n.op.is_empty(), n.inputs.len()) {
                    (false, _) => n.op.clone(),
                    (true, k) if n.kind == rbln_format::NodeKind::View && k > 1 => format!("View (concat of {k}, in place)"),
                    (true, 1)
                        if n.kind == rbln_format::NodeKind::View
                            && g.tensors.get(n.inputs[0] as usize).map(|t| t.placement) != out.map(|t| t.placement) =>
                    {
                        "View (slice, in place)".to_string()
                    }
                    (true, _) => format!("{:?}", n.kind),
                };
                let layout = layouts.get(n.name.as_str()).map_or(String::new(), |l| format!("  [{l}]"));
                println!("  {i:4} {:40} {:36} {shape:20} {place}{layout}", n.name, what);
            }
        }
    }
    ExitCode::SUCCESS
}

/// Every program's report, the main one first, named by entry.
fn reports(c: &Compiled) -> Vec<(String, &Report)> {
    let mut v = vec![(c.model.main_entry_name().to_string(), &c.report)];
    v.extend(c.entries.iter().map(|(n, r)| (n.clone(), r)));
    v
}

/// The report's fields as JSON object members (no braces).
fn report_json(r: &Report) -> String {
    let m = &r.memory;
    let ops: Vec<String> = r.device_ops.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    let (panels, winograd) = (count(&r.layouts, LayoutKind::GemmPanels), count(&r.layouts, LayoutKind::Winograd));
    format!(
        "\"format\":\"{}\",\"onnx_nodes\":{},\"device_ops\":{},\"views\":{},\"concats_in_place\":{},\"slices_in_place\":{},\"packed_gemm_weights\":{},\"winograd_convs\":{},\"int8_ops\":{},\"ops\":{{{}}},\"weights_bytes\":{},\"activations_naive_bytes\":{},\"activations_planned_bytes\":{},\"arena_bytes\":{}",
        r.format.name(), r.onnx_nodes, r.device_op_count(), r.views, r.concats_in_place, r.slices_in_place, panels, winograd, r.int8.conv + r.int8.gemm, ops.join(","),
        m.weights_bytes, m.naive_bytes, m.planned_bytes, m.arena_bytes
    )
}

fn print_report(r: &Report, file_len: usize, indent: &str) {
    let m = &r.memory;
    let saved = 100.0 * (1.0 - m.planned_bytes as f64 / m.naive_bytes.max(1) as f64);
    println!("{indent}{} {} -> device ops {} (+{} views)", r.format.nodes_label(), r.onnx_nodes, r.device_op_count(), r.views);
    let f = &r.fused;
    println!(
        "{indent}fused: {} GELU (erf), {} GELU (tanh), {} SiLU, {} layer norm, {} RMS norm, {} scale into weights, {} pad + {} BatchNorm/affine into conv, {} bias, {} residual, {} activation, {} element-wise ops into ELTWISE programs; {} dead ops dropped",
        f.gelu, f.gelu_tanh, f.silu, f.layer_norm, f.rms_norm, f.scale_into_weights, f.pad_into_conv, f.folded_into_conv, f.bias, f.residual, f.activation, f.eltwise, f.dead
    );
    if r.int8.conv + r.int8.gemm > 0 {
        println!(
            "{indent}int8: {} Conv and {} GEMM on integer kernels ({} with an int8 output; {} Conv with weights in channel quads, {} in tiles), {} Add/Mul and {} MaxPool on int8 values",
            r.int8.conv, r.int8.gemm, r.int8.int8_out, r.int8.conv_quads, r.int8.conv_tiles, r.int8.eltwise, r.int8.max_pool
        );
    }
    let ops: Vec<String> = r.device_ops.iter().map(|(k, v)| format!("{k} x{v}")).collect();
    println!("{indent}ops: {}", ops.join(", "));
    println!(
        "{indent}layouts: {} GEMMs read constant B packed in panels, {} Conv with filters in Winograd's domain, {} concatenations written in place by their inputs' producers, {} slices read in place (--list names them)",
        count(&r.layouts, LayoutKind::GemmPanels),
        count(&r.layouts, LayoutKind::Winograd),
        r.concats_in_place,
        r.slices_in_place
    );
    println!(
        "{indent}memory: weights {} B, activations {} B planned vs {} B naive ({saved:.1}% saved), arena {} B, file {file_len} B",
        m.weights_bytes, m.planned_bytes, m.naive_bytes, m.arena_bytes
    );
}
