//! Token generation with a causal decoder compiled as two programs: a
//! prefill over the prompt and a decode step of one token, sharing a KV
//! cache that stays on the device ([`Runtime::bind_state`]).
//!
//! The programs follow the decoder convention of
//! `tests/models/exports/export_decoder.py` (docs/python.md, "Generative
//! decoders"):
//! - decode: inputs `input_ids` `[1, 1]` and `position` `[1]` (i64), plus
//!   the cache inputs; outputs `logits` `[1, V]` plus, for each cache input
//!   `X`, the updated cache `X_out` (bound as state);
//! - prefill (optional): input `input_ids` `[1, P]`; outputs `logits`
//!   `[1, V]` (the last position's) and each cache `X` for positions
//!   `0..P`.
//!
//! A prompt of exactly P tokens goes through the prefill; any other length
//! (up to the cache size) goes through the decode program token by token,
//! which fills the same cache. Then each new token is chosen from the
//! logits ([`Sampling`]) and fed back until `max_new_tokens` or the end
//! token.

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

/// A decoder ready to generate: the decode program with its cache bound
/// as state, and the prefill program if there is one.
pub struct Generator {
    decode: Runtime,
    prefill: Option<Runtime>,
    /// The cache inputs of the decode program (= the prefill's cache
    /// outputs).
    cache: Vec<String>,
    /// Positions the cache holds (the decode program's cache length).
    max_positions: u64,
    /// The programs' output names, in order (the decode program's without
    /// its cache), and the prompt length the prefill takes.
    decode_outputs: Vec<String>,
    prefill_outputs: Vec<String>,
    prefill_len: Option<u64>,
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
    /// The prompt went through the prefill program (else token by token).
    pub used_prefill: bool,
}

fn gen_err(msg: String) -> Error {
    Error::Generate(msg)
}

impl Generator {
    /// `decode` (and `prefill`, if given) loaded, following the decoder
    /// convention (module docs); the cache pairs are found by name.
    pub fn new(mut decode: Runtime, prefill: Option<Runtime>) -> Result<Generator> {
        let info = decode.info();
        let has_in = |n: &str| info.inputs.iter().any(|i| i.name == n);
        if !has_in("input_ids") || !has_in("position") || !info.outputs.iter().any(|o| o.name == "logits") {
            return Err(gen_err("the decode program needs inputs 'input_ids' and 'position' and an output 'logits'".into()));
        }
        let pairs: Vec<(String, String)> = info
            .inputs
            .iter()
            .filter(|i| info.outputs.iter().any(|o| o.name == format!("{}_out", i.name)))
            .map(|i| (i.name.clone(), format!("{}_out", i.name)))
            .collect();
        if pairs.is_empty() {
            return Err(gen_err("the decode program has no cache (an input X with an output X_out)".into()));
        }
        let cache: Vec<String> = pairs.iter().map(|p| p.0.clone()).collect();
        let cache_shape = info.inputs.iter().find(|i| i.name == cache[0]).map(|i| i.shape.clone()).unwrap_or_default();
        // The cache's position axis: the one of the shape that is not the
        // layers, heads or head dim — taken as the second to last.
        let max_positions = cache_shape.iter().rev().nth(1).copied().unwrap_or(0);
        decode.bind_state(&pairs)?;
        let names = |v: &[crate::IoInfo]| v.iter().map(|o| o.name.clone()).collect::<Vec<_>>();
        let decode_outputs = names(&decode.info().outputs);
        let (mut prefill_outputs, mut prefill_len) = (Vec::new(), None);
        if let Some(p) = &prefill {
            let pi = p.info();
            for c in &cache {
                if !pi.outputs.iter().any(|o| &o.name == c) {
                    return Err(gen_err(format!("the prefill program has no output '{c}' (the decode program's cache)")));
                }
            }
            prefill_outputs = names(&pi.outputs);
            prefill_len = pi.inputs.iter().find(|i| i.name == "input_ids").and_then(|i| i.shape.last().copied());
        }
        Ok(Generator { decode, prefill, cache, max_positions, decode_outputs, prefill_outputs, prefill_len })
    }

    /// Prompt length the prefill takes (None without a prefill).
    pub fn prefill_length(&self) -> Option<u64> {
        self.prefill_len
    }

    fn logits(outs: &[Tensor], names: &[String]) -> Result<Vec<f32>> {
        let i = names.iter().position(|n| n == "logits").ok_or_else(|| gen_err("no 'logits' output".into()))?;
        match &outs[i].data {
            Data::F32(v) => Ok(v.clone()),
            _ => Err(gen_err("'logits' is not float32".into())),
        }
    }

    fn step(&mut self, token: i64, position: u64) -> Result<Vec<f32>> {
        let outs = self.decode.run(&[Tensor::new(&[1, 1], vec![token]), Tensor::new(&[1], vec![position as i64])])?;
        Self::logits(&outs, &self.decode_outputs)
    }

    /// Generate up to `max_new_tokens` after `prompt`, calling `on_token`
    /// with each new token as soon as it is chosen; stops early at `eos`.
    pub fn generate(&mut self, prompt: &[i64], max_new_tokens: usize, sampling: Sampling, seed: u64, eos: Option<i64>, mut on_token: impl FnMut(i64)) -> Result<Generation> {
        if prompt.is_empty() {
            return Err(gen_err("the prompt is empty".into()));
        }
        let total = prompt.len() as u64 + max_new_tokens as u64;
        if total > self.max_positions + 1 {
            return Err(gen_err(format!(
                "{} prompt + {max_new_tokens} new tokens do not fit the cache of {} positions",
                prompt.len(),
                self.max_positions
            )));
        }
        let mut rng = Rng::new(seed);
        let t0 = clock::now();
        self.decode.reset_state()?;
        let used_prefill = self.prefill_length() == Some(prompt.len() as u64);
        let mut logits = if used_prefill {
            let Some(prefill) = self.prefill.as_mut() else { return Err(gen_err("no prefill".into())) };
            let names = &self.prefill_outputs;
            let outs = prefill.run(&[Tensor::new(&[1, prompt.len() as u64], prompt.to_vec())])?;
            for c in &self.cache {
                let i = names.iter().position(|n| n == c).ok_or_else(|| gen_err(format!("no prefill output '{c}'")))?;
                self.decode.set_state(c, outs[i].view())?;
            }
            Self::logits(&outs, names)?
        } else {
            let mut l = Vec::new();
            for (pos, &t) in prompt.iter().enumerate() {
                l = self.step(t, pos as u64)?;
            }
            l
        };
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
        Ok(Generation { tokens, time_to_first_token_ms: ttft, tokens_per_s, used_prefill })
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
