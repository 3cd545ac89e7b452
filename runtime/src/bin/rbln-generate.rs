//! `rbln-generate`: generate tokens with a causal decoder on the NPU.
//!
//!     rbln-generate model.rbln --prompt-ids 1,2,3 [--prompt-ids 4,5 ...]
//!                   --max-new-tokens N[,N...] [--sampling greedy|top-k|top-p]
//!                   [--top-k K] [--top-p P] [--temperature T] [--seed S]
//!                   [--eos-id ID] [--no-prefill] [--batch] [--json]
//!                   [--device N]
//!
//! The model's entry points follow the decoder convention
//! (rbln_runtime::generate): a decode step and any prefills over one copy
//! of the weights, the KV cache on the device between steps. With several
//! prompts (or --batch), the batched entry points decode them together
//! with continuous batching (rbln_runtime::batch): a prompt joins as soon
//! as a slot is free, a sequence leaves when it is done; each token is
//! printed as `SEQ: TOKEN` (SEQ: the prompt's index). Each
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
use rbln_runtime::batch::BatchDecoder;
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
    /// The decoder (.rbln): a decode step (one token in, logits and the
    /// updated KV cache out) and optionally prefills, as entry points.
    model: PathBuf,
    /// Every prompt token through the decode step, none through a prefill.
    #[arg(long)]
    no_prefill: bool,
    /// A prompt's token ids, comma-separated (repeatable: several prompts
    /// are decoded with continuous batching).
    #[arg(long, required = true)]
    prompt_ids: Vec<String>,
    /// New tokens per prompt: one value for all, or one per prompt.
    #[arg(long, value_delimiter = ',', default_value = "16")]
    max_new_tokens: Vec<usize>,
    /// Decode through the batched entry points even for one prompt.
    #[arg(long)]
    batch: bool,
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
    let mut prompts = Vec::new();
    for p in &a.prompt_ids {
        match p.split(',').map(|t| t.trim().parse::<i64>()).collect::<Result<Vec<_>, _>>() {
            Ok(v) if !v.is_empty() => prompts.push(v),
            _ => return fail(2, format!("--prompt-ids {p:?}: expected comma-separated token ids")),
        }
    }
    let news: Vec<usize> = match a.max_new_tokens.as_slice() {
        [n] => vec![*n; prompts.len()],
        v if v.len() == prompts.len() => v.to_vec(),
        v => return fail(2, format!("--max-new-tokens has {} values for {} prompts (give one, or one per prompt)", v.len(), prompts.len())),
    };
    let dev = match rbln_umd::Device::open(a.device) {
        Ok(d) => d,
        Err(e) => return fail(4, e),
    };
    // Times with the TSC calibrated against the NPU where the kernel's
    // clock is coarse (a TCG guest), as rbln-run does.
    rbln_runtime::clock::init_with_device(&dev);
    let model = match rbln_format::Model::open(&a.model) {
        Ok(m) => m,
        Err(e) => return fail(3, format!("{}: {e}", a.model.display())),
    };
    let rt = match Runtime::new(&dev, model) {
        Ok(r) => r,
        Err(e) => return fail(4, format!("{}: {e}", a.model.display())),
    };
    if prompts.len() > 1 || a.batch {
        return batched(rt, &prompts, &news, sampling, &a);
    }
    let prompt = &prompts[0];
    let mut g = match Generator::new(rt) {
        Ok(g) => g,
        Err(e @ (Error::Generate(_) | Error::State(_))) => return fail(2, e),
        Err(e) => return fail(4, e),
    };
    g.use_prefill(!a.no_prefill);
    let mut out = std::io::stdout();
    let json = a.json;
    let r = g.generate(prompt, news[0], sampling, a.seed, a.eos_id, |t| {
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
                    "{{\"tokens\":[{}],\"new_tokens\":{},\"time_to_first_token_ms\":{:.3},\"tokens_per_s\":{:.3},\"prefill_tokens\":{}}}",
                    toks.join(","),
                    gen.tokens.len(),
                    gen.time_to_first_token_ms,
                    gen.tokens_per_s,
                    gen.prefill_tokens
                );
            } else {
                eprintln!(
                    "{} new tokens; time to first token {:.2} ms ({} prompt tokens through a prefill, {} through the decode step), {:.1} tokens/s",
                    gen.tokens.len(),
                    gen.time_to_first_token_ms,
                    gen.prefill_tokens,
                    prompt.len() - gen.prefill_tokens,
                    gen.tokens_per_s
                );
            }
            ExitCode::SUCCESS
        }
        Err(e @ (Error::Generate(_) | Error::State(_))) => fail(2, e),
        Err(e) => fail(4, e),
    }
}

/// Continuous batching over `prompts`: each joins when a slot is free
/// (its seed: `--seed` plus its index), every step advances all.
fn batched(rt: Runtime, prompts: &[Vec<i64>], news: &[usize], sampling: Sampling, a: &Args) -> ExitCode {
    let mut b = match BatchDecoder::new(rt) {
        Ok(b) => b,
        Err(e @ (Error::Generate(_) | Error::State(_))) => return fail(2, e),
        Err(e) => return fail(4, e),
    };
    let mut out = std::io::stdout();
    let mut tokens: Vec<Vec<i64>> = vec![Vec::new(); prompts.len()];
    let mut of_id = std::collections::HashMap::new();
    let (mut next, mut steps, mut most) = (0usize, 0u64, 0usize);
    let t0 = rbln_runtime::clock::now();
    while next < prompts.len() || b.active() > 0 {
        while next < prompts.len() && b.active() < b.slots() {
            match b.join(&prompts[next], news[next], sampling, a.seed.wrapping_add(next as u64), a.eos_id) {
                Ok(id) => {
                    of_id.insert(id, next);
                }
                Err(e @ Error::Generate(_)) => return fail(2, format!("prompt {next}: {e}")),
                Err(e) => return fail(4, format!("prompt {next}: {e}")),
            }
            next += 1;
        }
        most = most.max(b.active());
        match b.step() {
            Ok(emitted) => {
                for t in emitted {
                    let seq = of_id[&t.id];
                    tokens[seq].push(t.token);
                    if !a.json {
                        let _ = writeln!(out, "{seq}: {}", t.token);
                        let _ = out.flush();
                    }
                }
            }
            Err(e) => return fail(4, e),
        }
        steps += 1;
    }
    let s = t0.elapsed().as_secs_f64();
    let total: usize = tokens.iter().map(Vec::len).sum();
    if a.json {
        let seqs: Vec<String> = tokens
            .iter()
            .map(|t| format!("[{}]", t.iter().map(i64::to_string).collect::<Vec<_>>().join(",")))
            .collect();
        println!(
            "{{\"sequences\":[{}],\"new_tokens\":{total},\"steps\":{steps},\"slots\":{},\"most_active\":{most},\"tokens_per_s\":{:.3}}}",
            seqs.join(","),
            b.slots(),
            total as f64 / s.max(1e-9)
        );
    } else {
        eprintln!(
            "{} sequences, {total} new tokens in {steps} steps over {} slots (at most {most} active), {:.1} tokens/s",
            prompts.len(),
            b.slots(),
            total as f64 / s.max(1e-9)
        );
    }
    ExitCode::SUCCESS
}
