//! `rbln-run`: run a compiled `.rbln` model on the NPU.
//!
//!     rbln-run model.rbln --input x.npy [--output y.npy] [--iterations N]
//!              [--warmup K] [--inspect] [--json] [--device N]
//!
//! Exit codes: 0 success, 2 bad usage or input, 3 bad model file, 4 device
//! error (no device, fault, timeout).
//!
//! Latencies are wall-clock times of this process, measured with the TSC
//! (calibrated against the NPU's clock) when the kernel's clock is coarse,
//! as in a TCG guest (`rbln_runtime::clock`); `--json` says which clock in
//! "clock".

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rbln_runtime::{clock, inspect_entry, npy, stats::LatencyStats, AsyncRuntime, Data, Error, Runtime, Tensor};

#[derive(Parser)]
#[command(version, about = "Run a compiled .rbln model on the rbln NPU")]
struct Args {
    /// The model (.rbln).
    model: PathBuf,
    /// Input tensors (.npy: float32, int32, int64, int8, uint8 or bool, as
    /// the model declares), in the model's input order. Inputs
    /// not given are zero-filled (or random with --random).
    #[arg(long = "input", short = 'i')]
    inputs: Vec<PathBuf>,
    /// Write the outputs here: one file, or `name.npy`, `name.1.npy`, ...
    /// for several outputs.
    #[arg(long = "output", short = 'o')]
    output: Option<PathBuf>,
    /// Timed inferences.
    #[arg(long, default_value_t = 1)]
    iterations: u32,
    /// Untimed inferences before the timed ones.
    #[arg(long, default_value_t = 0)]
    warmup: u32,
    /// Fill missing inputs with random values in [-1, 1] instead of zeros.
    #[arg(long)]
    random: bool,
    /// Print the model's metadata and exit (no device needed): every entry
    /// point's interface, memory and ops, and the weights they share.
    #[arg(long)]
    inspect: bool,
    /// The entry point to run, in a model holding several (default: its
    /// main program); --inspect lists them.
    #[arg(long)]
    entry: Option<String>,
    /// Machine-readable report on stdout.
    #[arg(long)]
    json: bool,
    /// Device index: /dev/rblnN, or the N-th of RBLN_VISIBLE_DEVICES when set.
    #[arg(long, default_value_t = 0)]
    device: u32,
    /// Pipelined execution (AsyncRuntime) with --parallel requests in
    /// flight on separate model instances.
    #[arg(long = "async")]
    pipelined: bool,
    /// Model instances for --async: 1, or 2 (input transfer of request
    /// i+1 overlaps compute of request i).
    #[arg(long, default_value_t = 2)]
    parallel: usize,
    /// After the timed runs, profile one inference with device timestamps
    /// around every node and write a Chrome trace (Perfetto) here.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// The profiled submission runs the inference this many times back to
    /// back (1..=100) and the trace shows the last: the device's steady
    /// state in a loop of inferences (caches and worker threads warm, the
    /// guest asleep). The trace's otherData lists every run's span.
    #[arg(long, default_value_t = 1, requires = "profile")]
    profile_runs: u32,
}

/// A one-line progress bar on stderr for long runs (only on a terminal).
struct Progress {
    total: u32,
    shown: bool,
    last: Option<Instant>,
}

impl Progress {
    fn new(total: u32) -> Self {
        use std::io::IsTerminal;
        Self { total, shown: total >= 50 && std::io::stderr().is_terminal(), last: None }
    }

    fn tick(&mut self, done: u32) {
        if !self.shown || self.last.is_some_and(|t| t.elapsed() < Duration::from_millis(100) && done < self.total) {
            return;
        }
        self.last = Some(Instant::now());
        let width = 30;
        let filled = (done as usize * width) / self.total.max(1) as usize;
        eprint!("\r[{}{}] {done}/{}", "#".repeat(filled), " ".repeat(width - filled), self.total);
        if done == self.total {
            eprintln!();
        }
    }
}

const EXIT_USAGE: u8 = 2;
const EXIT_MODEL: u8 = 3;
const EXIT_DEVICE: u8 = 4;

fn fail(code: u8, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("rbln-run: {msg}");
    ExitCode::from(code)
}

/// A missing input: zeros, or random values (in [-1, 1] for floats, in
/// the input's range or 0..100 for int32/int64, in the input's range or
/// the whole type for int8/uint8, half true for bools).
fn default_input(want: &rbln_runtime::IoInfo, seed: u64, random: bool) -> Tensor {
    let n = Tensor::elements(&want.shape) as usize;
    let r: Vec<f32> = if random { random_values(n, seed) } else { vec![0.0; n] };
    let (lo, hi) = want.range.map_or((0, 100), |(lo, hi)| (lo.max(0).min(hi - 1), hi.min(lo.max(0) + 100)));
    // int8/uint8 (quantised inputs): values in the type's `tlo..thi`, or in
    // the part of the input's range inside it; zeros are 0, or the value
    // of that range nearest 0.
    let byte = |x: f32, tlo: i64, thi: i64| {
        let (lo, hi) = want.range.map_or((tlo, thi), |(lo, hi)| (lo.max(tlo), hi.min(thi)));
        let (lo, hi) = if lo < hi { (lo, hi) } else { (tlo, thi) };
        if random { lo + (((x + 1.0) / 2.0 * (hi - lo) as f32) as i64).clamp(0, hi - lo - 1) } else { 0.clamp(lo, hi - 1) }
    };
    let int = |x: f32| if random { lo + (((x + 1.0) / 2.0 * (hi - lo) as f32) as i64).clamp(0, hi - lo - 1) } else { lo.max(0).min(hi - 1) };
    match want.dtype {
        "i64" => Tensor::new(&want.shape, r.iter().map(|&x| int(x)).collect::<Vec<i64>>()),
        "i32" => Tensor::new(&want.shape, r.iter().map(|&x| int(x) as i32).collect::<Vec<i32>>()),
        "i8" => Tensor::new(&want.shape, r.iter().map(|&x| byte(x, -128, 128) as i8).collect::<Vec<i8>>()),
        "u8" => Tensor::new(&want.shape, r.iter().map(|&x| byte(x, 0, 256) as u8).collect::<Vec<u8>>()),
        "bool" => Tensor::new(&want.shape, r.iter().map(|&x| x > 0.0).collect::<Vec<bool>>()),
        _ => Tensor::new(&want.shape, r),
    }
}

fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn main() -> ExitCode {
    // SAFETY: restoring a signal's default disposition at start-up, before
    // any other thread exists; no handler code is involved.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let args = Args::parse();
    if !(1..=rbln_runtime::MAX_PROFILE_RUNS).contains(&args.profile_runs) {
        return fail(EXIT_USAGE, Error::ProfileRuns(args.profile_runs));
    }
    let model = match rbln_format::Model::open(&args.model) {
        Ok(m) => m,
        Err(e) => return fail(EXIT_MODEL, format!("{}: {e}", args.model.display())),
    };
    if args.inspect {
        print_inspect(&model, args.json);
        return ExitCode::SUCCESS;
    }
    let entry = args.entry.clone().unwrap_or_else(|| model.main_entry_name().to_string());
    let Some(e) = model.entry_point(&entry) else {
        let have: Vec<&str> = model.entry_points().iter().map(|e| e.name).collect();
        return fail(EXIT_USAGE, format!("the model has no entry point '{entry}' (it has: {})", have.join(", ")));
    };
    let info = inspect_entry(&model, e);
    if args.inputs.len() > info.inputs.len() {
        return fail(EXIT_USAGE, format!("{} inputs given, the model has {}", args.inputs.len(), info.inputs.len()));
    }
    let mut inputs = Vec::new();
    for (i, want) in info.inputs.iter().enumerate() {
        let t = match args.inputs.get(i) {
            Some(p) => match npy::read(p) {
                Ok(t) => t,
                Err(e) => return fail(EXIT_USAGE, e),
            },
            None => default_input(want, i as u64 + 1, args.random),
        };
        inputs.push(t);
    }
    let dev = match rbln_umd::Device::open(args.device) {
        Ok(d) => d,
        Err(e) => return fail(EXIT_DEVICE, e),
    };
    // Calibrate the clock (if the kernel's is coarse) before timing.
    clock::init_with_device(&dev);
    let load_start = clock::now();
    let classify = |e: &Error| match e {
        Error::InputCount { .. }
        | Error::InputShape { .. }
        | Error::InputDType { .. }
        | Error::InputLength { .. }
        | Error::InputValue { .. }
        | Error::Parallel(_)
        | Error::ProfileRuns(_) => EXIT_USAGE,
        Error::Format(_)
        | Error::HardwareVersion { .. }
        | Error::NotStaged { .. }
        | Error::EdgeDType { .. }
        | Error::EmptyProgram
        | Error::DramTooSmall { .. } => EXIT_MODEL,
        _ => EXIT_DEVICE,
    };
    let mut lat = Vec::with_capacity(args.iterations as usize);
    // Device time of each timed inference (synchronous runs): the same
    // inferences' share of `lat` spent on the device.
    let mut device: Vec<Duration> = Vec::with_capacity(args.iterations as usize);
    let mut outputs = Vec::new();
    let (load, wall);
    if args.pipelined && args.profile.is_some() {
        return fail(EXIT_USAGE, "--profile runs without --async");
    }
    if args.pipelined {
        let mut rt = match AsyncRuntime::with_entry(&dev, model, args.parallel, &entry) {
            Ok(r) => r,
            Err(e) => return fail(classify(&e), e),
        };
        load = load_start.elapsed();
        // Keep `parallel` requests in flight; latency is submit -> result.
        let mut window = std::collections::VecDeque::new();
        let mut progress = Progress::new(args.iterations.max(1));
        let total = args.warmup + args.iterations.max(1);
        let mut t_wall = clock::now();
        for i in 0..total {
            if i == args.warmup {
                // Drain the warm-up before timing.
                while let Some((_, h)) = window.pop_front() {
                    if let Err(e) = rbln_runtime::RunHandle::wait(h) {
                        return fail(classify(&e), e);
                    }
                }
                t_wall = clock::now();
            }
            match rt.run(&inputs) {
                Ok(h) => window.push_back((clock::now(), h)),
                Err(e) => return fail(classify(&e), e),
            }
            while window.len() >= rt.parallel() || (i + 1 == total && !window.is_empty()) {
                let Some((t0, h)) = window.pop_front() else { break };
                match h.wait() {
                    Ok(o) => outputs = o,
                    Err(e) => return fail(classify(&e), e),
                }
                if i >= args.warmup {
                    lat.push(t0.elapsed());
                    progress.tick(lat.len() as u32);
                }
            }
        }
        wall = t_wall.elapsed();
    } else {
        let mut rt = match Runtime::new(&dev, model).and_then(|mut r| r.select(&entry).map(|_| r)) {
            Ok(r) => r,
            Err(e) => return fail(classify(&e), e),
        };
        load = load_start.elapsed();
        for _ in 0..args.warmup {
            if let Err(e) = rt.run(&inputs) {
                return fail(classify(&e), e);
            }
        }
        let t_wall = clock::now();
        let mut progress = Progress::new(args.iterations.max(1));
        for i in 0..args.iterations.max(1) {
            let t0 = clock::now();
            match rt.run(&inputs) {
                Ok(o) => outputs = o,
                Err(e) => return fail(classify(&e), e),
            }
            lat.push(t0.elapsed());
            device.extend(rt.last_device_time());
            progress.tick(i + 1);
        }
        wall = t_wall.elapsed();
        if let Some(path) = &args.profile {
            let views: Vec<_> = inputs.iter().map(|t| t.view()).collect();
            match rt.profile_runs(&views, args.profile_runs) {
                Ok((outs, prof)) => {
                    // The latest inference's outputs: --output shows what the
                    // profiled runs computed.
                    outputs = outs;
                    if let Err(e) = std::fs::write(path, prof.to_chrome_trace(&info.name)) {
                        return fail(EXIT_USAGE, format!("{}: {e}", path.display()));
                    }
                    eprintln!("profile: {} events written to {}", prof.events.len(), path.display());
                }
                Err(e) => return fail(classify(&e), e),
            }
        }
    }
    if let Some(path) = &args.output {
        for (i, t) in outputs.iter().enumerate() {
            let p = if i == 0 { path.clone() } else { path.with_extension(format!("{i}.npy")) };
            if let Err(e) = npy::write(&p, t) {
                return fail(EXIT_USAGE, e);
            }
        }
    }
    let stats = LatencyStats::new(&lat, wall).unwrap_or_else(|| LatencyStats::new(&[Duration::ZERO], wall).unwrap());
    let dev_stats = LatencyStats::new(&device, wall);
    if args.json {
        let outs: Vec<_> = outputs
            .iter()
            .zip(&info.outputs)
            .map(|(t, o)| serde_json::json!({"name": o.name, "dtype": o.dtype, "shape": t.shape, "first": first_json(&t.data, 8)}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"model": info.name, "load_ms": load.as_secs_f64() * 1e3, "latency": stats.to_json(),
                "device": dev_stats.as_ref().map(LatencyStats::durations_json), "clock": clock::describe(), "outputs": outs})
        );
    } else {
        println!("Model:      {} on {} (loaded in {:.1} ms)", info.name, dev.path().display(), load.as_secs_f64() * 1e3);
        for (t, o) in outputs.iter().zip(&info.outputs) {
            let head = first_text(&t.data, 6);
            println!("Output:     {} {:?} [{}{}]", o.name, t.shape, head.join(", "), if t.data.len() > 6 { ", ..." } else { "" });
        }
        println!("{stats}");
        if let Some(d) = &dev_stats {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            println!("Device:     median {:.3} ms, min {:.3} ms, max {:.3} ms (device timestamps around each inference)", ms(d.p50), ms(d.min), ms(d.max));
        }
    }
    ExitCode::SUCCESS
}

/// The first `n` elements, for the JSON report.
fn first_json(d: &Data, n: usize) -> serde_json::Value {
    match d {
        Data::F32(v) => v.iter().take(n).copied().collect::<Vec<_>>().into(),
        Data::I32(v) => v.iter().take(n).copied().collect::<Vec<_>>().into(),
        Data::I64(v) => v.iter().take(n).copied().collect::<Vec<_>>().into(),
        Data::I8(v) => v.iter().take(n).copied().collect::<Vec<_>>().into(),
        Data::U8(v) => v.iter().take(n).copied().collect::<Vec<_>>().into(),
        Data::Bool(v) => v.iter().take(n).copied().collect::<Vec<_>>().into(),
    }
}

/// The first `n` elements, for the console.
fn first_text(d: &Data, n: usize) -> Vec<String> {
    match d {
        Data::F32(v) => v.iter().take(n).map(|x| format!("{x:.5}")).collect(),
        Data::I32(v) => v.iter().take(n).map(|x| x.to_string()).collect(),
        Data::I64(v) => v.iter().take(n).map(|x| x.to_string()).collect(),
        Data::I8(v) => v.iter().take(n).map(|x| x.to_string()).collect(),
        Data::U8(v) => v.iter().take(n).map(|x| x.to_string()).collect(),
        Data::Bool(v) => v.iter().take(n).map(|x| x.to_string()).collect(),
    }
}

/// `--inspect`: the model, its entry points and the weights they share.
fn print_inspect(model: &rbln_format::Model, json: bool) {
    let infos: Vec<rbln_runtime::ModelInfo> = model.entry_points().into_iter().map(|e| inspect_entry(model, e)).collect();
    let main = &infos[0];
    let separate: u64 = infos.iter().map(|i| i.weights_used_bytes).sum();
    let properties = || model.meta.properties.iter().map(|p| (p.key.clone(), serde_json::Value::from(p.value.clone()))).collect::<serde_json::Map<_, _>>();
    if json {
        let io = |v: &[rbln_runtime::IoInfo]| {
            v.iter().map(|t| serde_json::json!({"name": t.name, "dtype": t.dtype, "shape": t.shape, "range": t.range.map(|(lo, hi)| [lo, hi])})).collect::<Vec<_>>()
        };
        let ops = |i: &rbln_runtime::ModelInfo| i.ops.iter().map(|(op, n)| serde_json::json!({"op": op, "count": n})).collect::<Vec<_>>();
        let entries: Vec<_> = infos
            .iter()
            .map(|i| {
                serde_json::json!({"name": i.entry, "inputs": io(&i.inputs), "outputs": io(&i.outputs), "arena_bytes": i.arena_bytes,
                    "staging_bytes": i.staging_bytes, "weights_used_bytes": i.weights_used_bytes, "ops": ops(i)})
            })
            .collect();
        // The main program's fields at the top level, as for a model of
        // one program.
        println!(
            "{}",
            serde_json::json!({"name": main.name, "producer": main.producer, "inputs": io(&main.inputs),
                "outputs": io(&main.outputs), "arena_bytes": main.arena_bytes,
                "staging_bytes": main.staging_bytes, "weight_bytes": main.weight_bytes, "ops": ops(main),
                "entries": entries, "weights_separate_bytes": separate, "properties": properties()})
        );
        return;
    }
    println!("model:    {} (produced by {})", main.name, main.producer);
    let several = infos.len() > 1;
    if several {
        let each: Vec<String> = infos.iter().map(|i| format!("{} {} B", i.entry, i.weights_used_bytes)).collect();
        println!("entries:  {} (main: {})", infos.iter().map(|i| i.entry.as_str()).collect::<Vec<_>>().join(", "), main.entry);
        println!(
            "weights:  {} B stored once, shared by {} entry points (each reads: {}); one file per entry point would hold {} B",
            main.weight_bytes,
            infos.len(),
            each.join(", "),
            separate
        );
    }
    let pad = if several { "  " } else { "" };
    for i in &infos {
        if several {
            println!("entry:    {}", i.entry);
        }
        for t in &i.inputs {
            let range = t.range.map_or(String::new(), |(lo, hi)| format!(" values {lo}..{hi}"));
            println!("{pad}input:    {} {} {:?}{range}", t.name, t.dtype, t.shape);
        }
        for t in &i.outputs {
            println!("{pad}output:   {} {} {:?}", t.name, t.dtype, t.shape);
        }
        println!("{pad}memory:   arena {} B, staging {} B, weights {} B", i.arena_bytes, i.staging_bytes, i.weight_bytes);
        let ops: Vec<String> = i.ops.iter().map(|(op, n)| format!("{op} x{n}")).collect();
        println!("{pad}ops:      {}", ops.join(", "));
    }
    for p in &model.meta.properties {
        println!("property: {} = {}", p.key, p.value);
    }
}
