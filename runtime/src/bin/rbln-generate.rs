//! `rbln-generate`: generate tokens with a causal decoder on the NPU.
//!
//!     rbln-generate decode.rbln [--prefill prefill.rbln] --prompt-ids 1,2,3
//!                   --max-new-tokens N [--sampling greedy|top-k|top-p]
//!                   [--top-k K] [--top-p P] [--temperature T] [--seed S]
//!                   [--eos-id ID] [--json] [--device N]
//!
//! The programs follow the decoder convention (rbln_runtime::generate):
//! the decode program's KV cache stays on the device between steps. Each
//! new token id is printed on its own line as soon as it is chosen; then
//! a summary (time to first token, tokens/s) on stderr, or one JSON object
//! on stdout with --json.
//!
//! Exit codes: 0 success, 2 bad usage or arguments, 3 bad model file, 4
//! device error.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use rbln_runtime::generate::{Generator, Sampling};
use rbln_runtime::{Error, Runtime};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    Greedy,
    TopK,
    TopP,
}

#[derive(Parser)]
#[command(version, about = "Generate tokens with a causal decoder on the rbln NPU")]
struct Args {
    /// The decode program (.rbln): one token in, logits and the updated KV cache out.
    decode: PathBuf,
    /// The prefill program (.rbln), used when the prompt has exactly its length.
    #[arg(long)]
    prefill: Option<PathBuf>,
    /// The prompt's token ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    prompt_ids: Vec<i64>,
    #[arg(long, default_value_t = 16)]
    max_new_tokens: usize,
    #[arg(long, value_enum, default_value_t = Mode::Greedy)]
    sampling: Mode,
    #[arg(long, default_value_t = 50)]
    top_k: usize,
    #[arg(long, default_value_t = 0.9)]
    top_p: f32,
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop after this token.
    #[arg(long)]
    eos_id: Option<i64>,
    #[arg(long)]
    json: bool,
    #[arg(long, default_value_t = 0)]
    device: u32,
}

fn fail(code: u8, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("rbln-generate: error: {msg}");
    ExitCode::from(code)
}

fn load(dev: &rbln_umd::Device, path: &PathBuf) -> Result<Runtime, (u8, String)> {
    let model = rbln_format::Model::open(path).map_err(|e| (3, format!("{}: {e}", path.display())))?;
    Runtime::new(dev, model).map_err(|e| (4, format!("{}: {e}", path.display())))
}

fn main() -> ExitCode {
    let a = Args::parse();
    let sampling = match a.sampling {
        Mode::Greedy => Sampling::Greedy,
        Mode::TopK => Sampling::TopK { k: a.top_k, temperature: a.temperature },
        Mode::TopP => Sampling::TopP { p: a.top_p, temperature: a.temperature },
    };
    if !(a.temperature >= 0.0) || !(0.0..=1.0).contains(&a.top_p) {
        return fail(2, "--temperature must be >= 0 and --top-p in [0, 1]");
    }
    let dev = match rbln_umd::Device::open(a.device) {
        Ok(d) => d,
        Err(e) => return fail(4, e),
    };
    // Times with the TSC calibrated against the NPU where the kernel's
    // clock is coarse (a TCG guest), as rbln-run does.
    rbln_runtime::clock::init_with_device(&dev);
    let decode = match load(&dev, &a.decode) {
        Ok(r) => r,
        Err((c, m)) => return fail(c, m),
    };
    let prefill = match a.prefill.as_ref().map(|p| load(&dev, p)).transpose() {
        Ok(r) => r,
        Err((c, m)) => return fail(c, m),
    };
    let mut g = match Generator::new(decode, prefill) {
        Ok(g) => g,
        Err(e) => return fail(2, e),
    };
    let mut out = std::io::stdout();
    let json = a.json;
    let r = g.generate(&a.prompt_ids, a.max_new_tokens, sampling, a.seed, a.eos_id, |t| {
        if !json {
            let _ = writeln!(out, "{t}");
            let _ = out.flush();
        }
    });
    match r {
        Ok(gen) => {
            if json {
                let toks: Vec<String> = gen.tokens.iter().map(i64::to_string).collect();
                println!(
                    "{{\"tokens\":[{}],\"new_tokens\":{},\"time_to_first_token_ms\":{:.3},\"tokens_per_s\":{:.3},\"prefill\":{}}}",
                    toks.join(","),
                    gen.tokens.len(),
                    gen.time_to_first_token_ms,
                    gen.tokens_per_s,
                    gen.used_prefill
                );
            } else {
                eprintln!(
                    "{} new tokens; time to first token {:.2} ms ({}), {:.1} tokens/s",
                    gen.tokens.len(),
                    gen.time_to_first_token_ms,
                    if gen.used_prefill { "prefill" } else { "prompt token by token" },
                    gen.tokens_per_s
                );
            }
            ExitCode::SUCCESS
        }
        Err(e @ (Error::Generate(_) | Error::State(_))) => fail(2, e),
        Err(e) => fail(4, e),
    }
}
