//! Token generation with a causal decoder compiled as one `.rbln` whose
//! entry points (docs/rbln-format.md §16) are a decode step of one token
//! and prefills over the prompt, sharing one copy of the weights and a KV
//! cache that stays on the device ([`Runtime::bind_state`]).
//!
//! The programs follow the decoder convention of
//! `tests/models/exports/export_decoder.py` (docs/python.md, "Generative
//! decoders"):
//! - decode: inputs `input_ids` `[1, 1]` and `position` `[1]` (i64), plus
//!   the cache inputs; outputs `logits` `[1, V]` plus, for each cache input
//!   `X`, the updated cache `X_out`;
//! - prefill (any number, one per prompt length P): the only input
//!   `input_ids` `[1, P]`; outputs `logits` `[1, V]` (the last position's)
//!   and each cache `X_out` holding positions `0..P`.
//!
//! The cache pairs (`X`, `X_out`) are bound as state across the programs,
//! so a prefill's cache lands where the decode step reads it, without a
//! trip through the host. A prompt goes through the longest prefill that
//! fits in it, its remaining tokens through the decode step one by one;
//! then each new token is chosen from the logits ([`Sampling`]) and fed
//! back until `max_new_tokens` or the end token.

use crate::{clock, Data, Error, Result, Runtime, Tensor};

/// How the next token is chosen from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    /// The highest logit (the first of equal ones).
    Greedy,
    /// Among the `k` highest logits, by their softmax at `temperature`.
    TopK { k: usize, temperature: f32 },
    /// Among the fewest highest logits whose softmax (at `temperature`)
    /// adds up to at least `p`.
    TopP { p: f32, temperature: f32 },
}

/// The seeded generator used by sampling (xorshift64*): the same seed
/// gives the same tokens.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The next token from `logits` (length V).
pub fn choose(logits: &[f32], sampling: Sampling, rng: &mut Rng) -> usize {
    let argmax = || logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) }).0;
    let (keep, temperature) = match sampling {
        Sampling::Greedy => return argmax(),
        Sampling::TopK { k, temperature } => (Keep::K(k.max(1)), temperature),
        Sampling::TopP { p, temperature } => (Keep::P(p), temperature),
    };
    if !(temperature > 0.0) {
        return argmax();
    }
    // Candidates by decreasing logit (ties by index).
    let mut order: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if order.is_empty() {
        return 0;
    }
    let top = logits[order[0]] as f64;
    let weights: Vec<f64> = order.iter().map(|&i| ((logits[i] as f64 - top) / temperature as f64).exp()).collect();
    let total: f64 = weights.iter().sum();
    let n = match keep {
        Keep::K(k) => k.min(order.len()),
        Keep::P(p) => {
            let mut acc = 0.0;
            let mut n = 0;
            for w in &weights {
                acc += w / total;
                n += 1;
                if acc >= p as f64 {
                    break;
                }
            }
            n
        }
    };
    let kept: f64 = weights[..n].iter().sum();
    let mut u = rng.uniform() * kept;
    for (j, w) in weights[..n].iter().enumerate() {
        if u < *w {
            return order[j];
        }
        u -= w;
    }
    order[n - 1]
}

enum Keep {
    K(usize),
    P(f32),
}

/// A decoder ready to generate: one runtime holding its decode step and
/// its prefills as entry points over one copy of the weights, the cache
/// bound as state shared by all of them.
pub struct Generator {
    p: Programs,
    /// Whether prompts go through the prefills ([`Generator::use_prefill`]).
    prefill_on: bool,
}

/// What one generation did.
#[derive(Clone, Debug, Default)]
pub struct Generation {
    pub tokens: Vec<i64>,
    /// Prompt processing until the first new token is known (the
    /// runtime's fine-grained clock, `rbln_runtime::clock`).
    pub time_to_first_token_ms: f64,
    /// New tokens after the first, per second of decode steps.
    pub tokens_per_s: f64,
    /// Prompt tokens that went through a prefill program (the rest, one by
    /// one through the decode step).
    pub prefill_tokens: usize,
}

pub(crate) fn gen_err(msg: String) -> Error {
    Error::Generate(msg)
}

/// The decoder convention's view of one program.
pub(crate) enum Role {
    /// A decode step for `batch` sequences, with the cache inputs X.
    Decode { batch: u64, cache: Vec<String> },
    /// A prefill over `length` prompt tokens.
    Prefill { length: u64 },
    /// A prefill over `length` prompt tokens into one slot (input `slot`)
    /// of a batched cache (continuous batching, [`crate::batch`]).
    PrefillSlot { length: u64 },
    Other,
}

/// The inputs X of `info` that have an output X_out.
fn cache_inputs(info: &crate::ModelInfo) -> Vec<String> {
    info.inputs.iter().filter(|i| info.outputs.iter().any(|o| o.name == format!("{}_out", i.name))).map(|i| i.name.clone()).collect()
}

pub(crate) fn role(info: &crate::ModelInfo) -> Role {
    let input = |n: &str| info.inputs.iter().find(|i| i.name == n);
    let has_logits = info.outputs.iter().any(|o| o.name == "logits");
    let prompt_len = |ids: &crate::IoInfo| (ids.shape.len() == 2 && ids.shape[0] == 1).then(|| ids.shape[1]);
    match (input("input_ids"), input("position"), input("slot")) {
        (Some(ids), Some(_), None) if has_logits => Role::Decode { batch: ids.shape.first().copied().unwrap_or(1), cache: cache_inputs(info) },
        (Some(ids), None, None) if has_logits && info.inputs.len() == 1 => match prompt_len(ids) {
            Some(length) => Role::Prefill { length },
            None => Role::Other,
        },
        (Some(ids), None, Some(_)) if has_logits && info.inputs.len() == 2 + cache_inputs(info).len() => match prompt_len(ids) {
            Some(length) => Role::PrefillSlot { length },
            None => Role::Other,
        },
        _ => Role::Other,
    }
}

/// The cache's position axis of a cache input's shape: the one that is
/// not the slots, layers, heads or head dim — the second to last.
pub(crate) fn cache_positions(shape: &[u64]) -> u64 {
    shape.iter().rev().nth(1).copied().unwrap_or(0)
}

/// A decoder's programs on one runtime with their cache bound as state:
/// what [`Generator`] and [`crate::batch::BatchDecoder`] both drive.
pub(crate) struct Programs {
    pub rt: Runtime,
    /// The decode step's entry.
    pub decode: String,
    /// The prefill entries by prompt length, ascending.
    pub prefills: Vec<(u64, String)>,
    /// The decode step's first cache input's shape, and the positions it
    /// holds (its second-to-last axis).
    pub cache_shape: Vec<u64>,
    pub max_positions: u64,
    /// The token ids the decode step takes (`input_ids`' value range).
    tokens: Option<(i64, i64)>,
    /// Index of `logits` among each entry's outputs as runs return them
    /// (bound state left out).
    logits_at: Vec<(String, usize)>,
}

impl Programs {
    /// Bind the decode step's `cache` pairs (`X`, `X_out`) across `rt`'s
    /// programs, after checking that every prefill writes each `X_out`
    /// (and, with `prefills_read`, reads each `X`). `what` names the
    /// decode step in errors.
    pub(crate) fn bind(mut rt: Runtime, what: &str, decode: String, cache: Vec<String>, mut prefills: Vec<(u64, String)>, prefills_read: bool) -> Result<Programs> {
        if cache.is_empty() {
            return Err(gen_err(format!("the {what} '{decode}' has no cache (an input X with an output X_out)")));
        }
        rt.select(&decode)?;
        let info = rt.info();
        let cache_shape = info.inputs.iter().find(|i| i.name == cache[0]).map(|i| i.shape.clone()).unwrap_or_default();
        // The ids the model declares for `input_ids`, else those of its
        // vocabulary (the logits' last axis): a token outside would fault
        // the device's embedding lookup, failing every sequence of a batch.
        let vocab = info.outputs.iter().find(|o| o.name == "logits").and_then(|o| o.shape.last()).map(|&v| (0, v as i64));
        let tokens = info.inputs.iter().find(|i| i.name == "input_ids").and_then(|i| i.range).or(vocab);
        let max_positions = cache_positions(&cache_shape);
        for (_, p) in &prefills {
            rt.select(p)?;
            let pi = rt.info();
            for c in &cache {
                let reads = !prefills_read || pi.inputs.iter().any(|i| &i.name == c);
                if !reads || !pi.outputs.iter().any(|o| o.name == format!("{c}_out")) {
                    let needs = if prefills_read { format!("read '{c}' and write '{c}_out'") } else { format!("write '{c}_out'") };
                    return Err(gen_err(format!("the prefill '{p}' does not {needs} (the {what}'s cache)")));
                }
            }
        }
        prefills.sort();
        let pairs: Vec<(String, String)> = cache.iter().map(|c| (c.clone(), format!("{c}_out"))).collect();
        rt.bind_state(&pairs)?;
        let mut logits_at = Vec::new();
        for e in std::iter::once(&decode).chain(prefills.iter().map(|p| &p.1)) {
            rt.select(e)?;
            let at = rt.info().outputs.iter().position(|o| o.name == "logits").ok_or_else(|| gen_err(format!("'{e}' has no output 'logits'")))?;
            logits_at.push((e.clone(), at));
        }
        Ok(Programs { rt, decode, prefills, cache_shape, max_positions, tokens, logits_at })
    }

    /// Run entry `e` and return its logits.
    pub(crate) fn logits(&mut self, e: &str, inputs: &[Tensor]) -> Result<Vec<f32>> {
        let outs = self.rt.run_entry(e, inputs)?;
        let at = self.logits_at.iter().find(|l| l.0 == e).map(|l| l.1).ok_or_else(|| gen_err(format!("no logits for '{e}'")))?;
        match outs.into_iter().nth(at).map(|t| t.data) {
            Some(Data::F32(v)) => Ok(v),
            _ => Err(gen_err("'logits' is not float32".into())),
        }
    }

    /// Run the decode step.
    pub(crate) fn step(&mut self, inputs: &[Tensor]) -> Result<Vec<f32>> {
        let decode = std::mem::take(&mut self.decode);
        let r = self.logits(&decode, inputs);
        self.decode = decode;
        r
    }

    /// The longest prefill not longer than `len` tokens.
    pub(crate) fn prefill_for(&self, len: usize) -> Option<(u64, String)> {
        self.prefills.iter().rev().find(|p| p.0 <= len as u64).cloned()
    }

    /// Refuse an empty prompt, one with a token the model does not take,
    /// and `prompt + new` tokens that do not fit the cache: before anything
    /// runs, so that (in a batch) no other sequence is affected.
    pub(crate) fn check_request(&self, prompt: &[i64], new: usize) -> Result<()> {
        if prompt.is_empty() {
            return Err(gen_err("the prompt is empty".into()));
        }
        if let Some((lo, hi)) = self.tokens {
            if let Some((i, t)) = prompt.iter().enumerate().find(|(_, t)| !(lo..hi).contains(*t)) {
                return Err(gen_err(format!("prompt token {i} is {t}, outside the model's token ids {lo}..{hi}")));
            }
        }
        if prompt.len() as u64 + new as u64 > self.max_positions + 1 {
            return Err(gen_err(format!("{} prompt + {new} new tokens do not fit the cache of {} positions", prompt.len(), self.max_positions)));
        }
        Ok(())
    }
}

impl Generator {
    /// `rt` loaded from a decoder's `.rbln` (module docs): its batch-1
    /// decode step and any prefills are found by their interfaces, and the
    /// cache pairs (`X`, `X_out`) bound as state.
    pub fn new(mut rt: Runtime) -> Result<Generator> {
        let mut decode = None;
        let mut prefills = Vec::new();
        let mut cache = Vec::new();
        for e in rt.entries() {
            rt.select(&e)?;
            match role(&rt.info()) {
                Role::Decode { batch: 1, cache: c } if decode.is_none() => {
                    decode = Some(e);
                    cache = c;
                }
                Role::Prefill { length } => prefills.push((length, e)),
                _ => {}
            }
        }
        let Some(decode) = decode else {
            return Err(gen_err(format!(
                "no entry point of the model is a decode step (inputs 'input_ids' [1, 1] and 'position', output 'logits'); it has: {}",
                rt.entries().join(", ")
            )));
        };
        Ok(Generator { p: Programs::bind(rt, "decode step", decode, cache, prefills, false)?, prefill_on: true })
    }

    /// Prompt lengths the prefills take, ascending.
    pub fn prefill_lengths(&self) -> Vec<u64> {
        self.p.prefills.iter().map(|p| p.0).collect()
    }

    /// Send prompts through the prefills (the default) or, with `false`,
    /// every prompt token through the decode step.
    pub fn use_prefill(&mut self, on: bool) {
        self.prefill_on = on;
    }

    /// The runtime (to inspect it, or run its programs directly).
    pub fn runtime(&mut self) -> &mut Runtime {
        &mut self.p.rt
    }

    fn step(&mut self, token: i64, position: u64) -> Result<Vec<f32>> {
        self.p.step(&[Tensor::new(&[1, 1], vec![token]), Tensor::new(&[1], vec![position as i64])])
    }

    /// Generate up to `max_new_tokens` after `prompt`, calling `on_token`
    /// with each new token as soon as it is chosen; stops early at `eos`.
    /// The prompt's first tokens go through the longest prefill that
    /// fits in it, the rest through the decode step one by one.
    pub fn generate(&mut self, prompt: &[i64], max_new_tokens: usize, sampling: Sampling, seed: u64, eos: Option<i64>, mut on_token: impl FnMut(i64)) -> Result<Generation> {
        self.p.check_request(prompt, max_new_tokens)?;
        let mut rng = Rng::new(seed);
        let t0 = clock::now();
        self.p.rt.reset_state()?;
        let prefill = self.p.prefill_for(prompt.len()).filter(|_| self.prefill_on);
        let mut logits = Vec::new();
        let mut done = 0;
        if let Some((n, e)) = prefill {
            done = n as usize;
            logits = self.p.logits(&e, &[Tensor::new(&[1, n], prompt[..done].to_vec())])?;
        }
        for (pos, &t) in prompt.iter().enumerate().skip(done) {
            logits = self.step(t, pos as u64)?;
        }
        let mut tokens = Vec::with_capacity(max_new_tokens);
        let mut ttft = 0.0;
        let mut t_first = clock::now();
        for n in 0..max_new_tokens {
            let token = choose(&logits, sampling, &mut rng) as i64;
            if n == 0 {
                ttft = t0.elapsed().as_secs_f64() * 1e3;
                t_first = clock::now();
            }
            tokens.push(token);
            on_token(token);
            if Some(token) == eos || n + 1 == max_new_tokens {
                break;
            }
            logits = self.step(token, (prompt.len() + n) as u64)?;
        }
        let decode_s = t_first.elapsed().as_secs_f64();
        let tokens_per_s = if tokens.len() > 1 && decode_s > 0.0 { (tokens.len() - 1) as f64 / decode_s } else { 0.0 };
        Ok(Generation { tokens, time_to_first_token_ms: ttft, tokens_per_s, prefill_tokens: done })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum_and_sampling_stays_in_its_set() {
        let logits = [0.5, 3.0, 3.0, -1.0, 2.9];
        let mut rng = Rng::new(7);
        assert_eq!(choose(&logits, Sampling::Greedy, &mut rng), 1);
        // top-k 2: only tokens 1 and 2 (the two highest).
        for _ in 0..200 {
            let t = choose(&logits, Sampling::TopK { k: 2, temperature: 1.0 }, &mut rng);
            assert!(t == 1 || t == 2, "{t}");
        }
        // top-p 0.5: token 1 alone holds less than half; 1 and 2 hold more.
        let mut seen = [0usize; 5];
        for _ in 0..400 {
            seen[choose(&logits, Sampling::TopP { p: 0.5, temperature: 1.0 }, &mut rng)] += 1;
        }
        assert!(seen[1] > 100 && seen[2] > 100 && seen[0] + seen[3] + seen[4] == 0, "{seen:?}");
        // A tiny temperature is greedy in effect; zero is greedy.
        assert_eq!(choose(&logits, Sampling::TopK { k: 5, temperature: 0.0 }, &mut rng), 1);
        // The same seed gives the same choices.
        let pick = |seed| {
            let mut r = Rng::new(seed);
            (0..20).map(|_| choose(&logits, Sampling::TopK { k: 5, temperature: 2.0 }, &mut r)).collect::<Vec<_>>()
        };
        assert_eq!(pick(3), pick(3));
        assert_ne!(pick(3), pick(4));
    }
}
