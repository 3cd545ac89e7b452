//! Continuous batching: several sequences decoded together, joining and
//! leaving between steps, each in its own slot of a batched KV cache that
//! stays on the device.
//!
//! The model's entry points follow the batched half of the decoder
//! convention (`tests/models/exports/export_decoder.py`, docs/python.md):
//! - a batched decode step: inputs `input_ids` `[S, 1]`, `position` `[S]`
//!   (i64) and the slot caches `X` `[S, ...]`; outputs `logits` `[S, V]`
//!   and each `X_out` — every slot's token at that slot's own position,
//!   attending only to its own slot;
//! - prefills into one slot (any number, one per prompt length P): inputs
//!   `input_ids` `[1, P]`, `slot` `[1]` (i64) and the caches; outputs
//!   `logits` `[1, V]` and each `X_out` with the prompt's cache in that
//!   slot and the other slots unchanged.
//!
//! The caches are bound as state ([`Runtime::bind_state`]) shared by all
//! these programs. A sequence joins ([`BatchDecoder::join`]) through the
//! longest slot prefill that fits its prompt; the rest of its prompt, and
//! then each token it generates, are fed through the batched steps
//! ([`BatchDecoder::step`]), which advance every active sequence by one
//! token. A free slot rides along with token 0 at position 0: it writes
//! only its own slot, which the next sequence to take it overwrites (a
//! prefill writes the whole slot; a step at position p reads only
//! positions <= p, all written by that sequence).

use std::collections::VecDeque;

use crate::generate::{choose, gen_err, role, Programs, Rng, Role, Sampling};
use crate::{Result, Runtime, Tensor};

/// One token chosen by a [`BatchDecoder::step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Emitted {
    /// The sequence ([`BatchDecoder::join`]'s id).
    pub id: u64,
    pub token: i64,
    /// The sequence ended with this token (its `max_new_tokens`, or its end
    /// token) and left its slot.
    pub finished: bool,
}

struct Sequence {
    id: u64,
    /// Tokens still to be fed (the prompt's rest, then each new token).
    feed: VecDeque<i64>,
    /// The position the next fed token takes.
    position: u64,
    /// Logits to choose the next token from, when the last fed token was
    /// the prompt's last or a generated one.
    logits: Option<Vec<f32>>,
    generated: usize,
    max_new_tokens: usize,
    sampling: Sampling,
    rng: Rng,
    eos: Option<i64>,
}

/// Sequences decoded together on one runtime (module docs).
pub struct BatchDecoder {
    /// The batched decode step and the slot prefills.
    p: Programs,
    slots: Vec<Option<Sequence>>,
    next_id: u64,
}

impl BatchDecoder {
    /// `rt` loaded from a decoder's `.rbln` with a batched decode step (the
    /// one with the most slots) and optionally slot prefills (module docs).
    pub fn new(mut rt: Runtime) -> Result<BatchDecoder> {
        let mut decode: Option<(u64, String, Vec<String>)> = None;
        let mut prefills = Vec::new();
        for e in rt.entries() {
            rt.select(&e)?;
            match role(&rt.info()) {
                Role::Decode { batch, cache } if batch > 1 && decode.as_ref().is_none_or(|d| batch > d.0) => decode = Some((batch, e, cache)),
                Role::PrefillSlot { length } => prefills.push((length, e)),
                _ => {}
            }
        }
        let Some((batch, decode, cache)) = decode else {
            return Err(gen_err(format!(
                "no entry point of the model is a batched decode step (inputs 'input_ids' [S, 1] with S > 1 and 'position', output 'logits'); it has: {}",
                rt.entries().join(", ")
            )));
        };
        let p = Programs::bind(rt, "batched decode step", decode, cache, prefills, true)?;
        if p.cache_shape.first() != Some(&batch) {
            return Err(gen_err(format!("the cache of '{}' is {:?}: its first axis must be the {batch} slots", p.decode, p.cache_shape)));
        }
        let slots = (0..batch).map(|_| None).collect();
        Ok(BatchDecoder { p, slots, next_id: 0 })
    }

    /// Slots in the batch.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Sequences in the batch.
    pub fn active(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Positions each slot's cache holds.
    pub fn max_positions(&self) -> u64 {
        self.p.max_positions
    }

    /// Add a sequence in a free slot: its prompt's first tokens through the
    /// longest slot prefill that fits them (the rest are fed by the next
    /// steps). Returns its id; its tokens come from [`Self::step`].
    pub fn join(&mut self, prompt: &[i64], max_new_tokens: usize, sampling: Sampling, seed: u64, eos: Option<i64>) -> Result<u64> {
        if max_new_tokens == 0 {
            return Err(gen_err("a sequence needs max_new_tokens >= 1".into()));
        }
        self.p.check_request(prompt, max_new_tokens)?;
        let Some(slot) = self.slots.iter().position(|s| s.is_none()) else {
            return Err(gen_err(format!("all {} slots are busy", self.slots.len())));
        };
        let prefill = self.p.prefill_for(prompt.len());
        let (mut logits, mut done) = (None, 0);
        if let Some((n, e)) = prefill {
            done = n as usize;
            let inputs = [Tensor::new(&[1, n], prompt[..done].to_vec()), Tensor::new(&[1], vec![slot as i64])];
            let l = self.p.logits(&e, &inputs)?;
            // The prefill's logits choose the first token only when it
            // took the whole prompt.
            logits = (done == prompt.len()).then_some(l);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.slots[slot] = Some(Sequence {
            id,
            feed: prompt[done..].iter().copied().collect(),
            position: done as u64,
            logits,
            generated: 0,
            max_new_tokens,
            sampling,
            rng: Rng::new(seed),
            eos,
        });
        Ok(id)
    }

    /// End sequence `id` now, freeing its slot. False if it is not in the
    /// batch (finished or never joined).
    pub fn cancel(&mut self, id: u64) -> bool {
        match self.slots.iter_mut().find(|s| s.as_ref().is_some_and(|q| q.id == id)) {
            Some(s) => {
                *s = None;
                true
            }
            None => false,
        }
    }

    /// Advance every sequence by one token: choose each ready sequence's
    /// next token (returned, in slot order; a finished sequence leaves its
    /// slot), then run the batched decode step over every sequence still
    /// feeding. Does nothing without sequences.
    pub fn step(&mut self) -> Result<Vec<Emitted>> {
        let mut emitted = Vec::new();
        for s in self.slots.iter_mut() {
            let Some(q) = s else { continue };
            let Some(logits) = q.logits.take() else { continue };
            let token = choose(&logits, q.sampling, &mut q.rng) as i64;
            q.generated += 1;
            let finished = q.generated == q.max_new_tokens || Some(token) == q.eos;
            emitted.push(Emitted { id: q.id, token, finished });
            if finished {
                *s = None;
            } else {
                q.feed.push_back(token);
            }
        }
        let n = self.slots.len();
        let (mut ids, mut pos) = (vec![0i64; n], vec![0i64; n]);
        let mut fed = vec![false; n];
        for (i, s) in self.slots.iter_mut().enumerate() {
            let Some(q) = s else { continue };
            if let Some(t) = q.feed.pop_front() {
                ids[i] = t;
                pos[i] = q.position as i64;
                q.position += 1;
                fed[i] = true;
            }
        }
        if fed.iter().any(|&f| f) {
            let logits = self.p.step(&[Tensor::new(&[n as u64, 1], ids), Tensor::new(&[n as u64], pos)])?;
            let vocab = logits.len() / n.max(1);
            for (i, s) in self.slots.iter_mut().enumerate() {
                if let (Some(q), true) = (s, fed[i]) {
                    // Logits count once the prompt is all fed.
                    if q.feed.is_empty() {
                        q.logits = Some(logits[i * vocab..(i + 1) * vocab].to_vec());
                    }
                }
            }
        }
        Ok(emitted)
    }
}
