#!/usr/bin/env python3
"""Causal decoders as static-shape prefill and decode programs with an
explicit KV cache, exported to ONNX, and transformers' own greedy
generation as the reference.

    export_decoder.py OUTDIR

For GPT-2 and a Llama-style model (transformers' GPT2LMHeadModel and
LlamaForCausalLM: rotary embeddings, RMSNorm, SwiGLU, grouped-query
attention; random weights from small configs, no downloads) writes, for
NAME in gpt2, llama, the entry points of one decoder (rbln-compile
--entry NAME=FILE puts them in one .rbln over one copy of the weights):

  NAME-decode.onnx       input_ids [1, 1], position [1] (int64), k_cache,
                         v_cache [L, KV heads, MAX, Dh] -> logits [1, V],
                         k_cache_out, v_cache_out: the token's keys and
                         values written at `position` (attention over
                         positions <= position)
  NAME-prefill-P.onnx    (P in PREFILLS) input_ids [1, P] -> logits [1, V]
                         (the last position's), k_cache_out, v_cache_out
                         (the prompt's keys and values, zeros after it)
  NAME-decode-batch.onnx continuous batching over SLOTS sequences:
                         input_ids [S, 1], position [S], k_slots, v_slots
                         [S, L, KV heads, MAX, Dh] -> logits [S, V],
                         k_slots_out, v_slots_out (each sequence at its own
                         position, attending to its own slot)
  NAME-prefill-slot-P.onnx  input_ids [1, P], slot [1] (int64), k_slots,
                         v_slots -> logits [1, V], k_slots_out,
                         v_slots_out (the prompt's cache in slot `slot`,
                         the other slots unchanged)
  NAME-decoder.prompt.npy / .generated.npy   a prompt [1, PROMPT] (int64)
                         and transformers' generate(do_sample=False)
                         tokens after it (NEW ids)
  NAME-decoder.prompt2.npy / .generated2.npy  a second prompt, of a length
                         no prefill has (PROMPT2), and its NEW2 tokens
  NAME-decoder.{prompt,generated,prompt2,generated2}.txt  the same,
                         comma-separated

Every graph is the model's own modules (embeddings, norms, the attention
and MLP projections) run in a forward written for a cache of fixed size
MAX: the cache is written with a Where over the positions (no scatter at
a run-time index) and attention masks the positions past the current
one, so the shapes never change. The script checks that onnxruntime
running prefill then decode step by step reproduces transformers' tokens
for both prompts, and that the batched programs give every sequence the
tokens it gets alone, before writing anything.
"""
import os
import sys

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_torch import randomize  # noqa: E402

OPSET = 17
PROMPT, NEW, MAX = 8, 64, 80
PROMPT2, NEW2 = 11, 24
PREFILLS = (4, 8)
SLOTS = 4


class StaticCache(nn.Module):
    """A decoder's forward over a KV cache of MAX positions, shared by the
    models: each supplies `embed`, `blocks`, `qkv` (its input norm,
    projections and position encoding, row-wise over tokens), `mix`
    (attention output projection and MLP) and `head` (final norm and
    logits, row-wise)."""

    def __init__(self, max_len, heads, kv_heads, head_dim):
        super().__init__()
        self.max, self.h, self.kv, self.dh = max_len, heads, kv_heads, head_dim

    def attend(self, blk, x, q, k, v, mask):
        rep = self.h // self.kv  # grouped-query attention: each kv head serves rep query heads
        k, v = k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)
        s = (q @ k.transpose(1, 2)) / (self.dh ** 0.5)
        s = torch.where(mask, s, torch.tensor(float("-inf")))
        o = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).reshape(x.shape[0], -1)  # [T, H*Dh]
        return self.mix(blk, x, o)

    def prefill(self, input_ids):
        p = input_ids.shape[1]
        positions = torch.arange(p)
        x = self.embed(input_ids[0], positions)
        causal = torch.tril(torch.ones(p, p, dtype=torch.bool))
        ks, vs = [], []
        for blk in self.blocks():
            q, k, v = self.qkv(blk, x, positions)
            x = self.attend(blk, x, q, k, v, causal)
            pad = (0, 0, 0, self.max - p)
            ks.append(nn.functional.pad(k, pad))
            vs.append(nn.functional.pad(v, pad))
        return self.head(x[-1:]), torch.stack(ks), torch.stack(vs)

    def decode(self, input_ids, position, k_cache, v_cache):
        x = self.embed(input_ids[0], position)  # [1, D]
        at = torch.arange(self.max)
        here = (at == position).reshape(1, self.max, 1)  # the token's slot
        valid = (at <= position).reshape(1, 1, self.max)  # attend to <= position
        ks, vs = [], []
        for i, blk in enumerate(self.blocks()):
            q, k, v = self.qkv(blk, x, position)
            k = torch.where(here, k, k_cache[i])
            v = torch.where(here, v, v_cache[i])
            x = self.attend(blk, x, q, k, v, valid)
            ks.append(k)
            vs.append(v)
        return self.head(x), torch.stack(ks), torch.stack(vs)

    def decode_batch(self, input_ids, position, k_slots, v_slots):
        """One token for each of S sequences, each at its own position in
        its own cache slot ([S, L, KV, MAX, Dh])."""
        s = input_ids.shape[0]
        x = self.embed(input_ids[:, 0], position)  # [S, D]: row-wise, one token per sequence
        at = torch.arange(self.max)
        here = (at.reshape(1, -1) == position.reshape(-1, 1)).reshape(s, 1, self.max, 1)
        valid = (at.reshape(1, -1) <= position.reshape(-1, 1)).reshape(s, 1, 1, self.max)
        rep = self.h // self.kv
        ks, vs = [], []
        for i, blk in enumerate(self.blocks()):
            q, k, v = self.qkv(blk, x, position)  # [H or KV, S, Dh]
            k = torch.where(here, k.transpose(0, 1).unsqueeze(2), k_slots[:, i])  # [S, KV, MAX, Dh]
            v = torch.where(here, v.transpose(0, 1).unsqueeze(2), v_slots[:, i])
            q = q.transpose(0, 1).unsqueeze(2)  # [S, H, 1, Dh]
            kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            a = (q @ kk.transpose(2, 3)) / (self.dh ** 0.5)
            a = torch.where(valid, a, torch.tensor(float("-inf")))
            o = (torch.softmax(a, dim=-1) @ vv).reshape(s, -1)  # [S, H*Dh]
            x = self.mix(blk, x, o)
            ks.append(k)
            vs.append(v)
        return self.head(x), torch.stack(ks, dim=1), torch.stack(vs, dim=1)

    def prefill_slot(self, input_ids, slot, k_slots, v_slots):
        """The prefill, its cache written into slot `slot` of the batch."""
        logits, k, v = self.prefill(input_ids)
        mine = (torch.arange(k_slots.shape[0]) == slot).reshape(-1, 1, 1, 1, 1)
        return logits, torch.where(mine, k.unsqueeze(0), k_slots), torch.where(mine, v.unsqueeze(0), v_slots)


class Program(nn.Module):
    """One entry point: method `what` of the StaticCache model."""

    def __init__(self, m, what):
        super().__init__()
        self.m, self.what = m, what

    def forward(self, *args):
        return getattr(self.m, self.what)(*args)


class Gpt2(StaticCache):
    """GPT-2: learned positions, LayerNorms, fused qkv projection."""

    def __init__(self, hf, max_len):
        cfg = hf.config
        super().__init__(max_len, cfg.n_head, cfg.n_head, cfg.n_embd // cfg.n_head)
        self.t, self.lm, self.d = hf.transformer, hf.lm_head, cfg.n_embd

    def embed(self, ids, positions):
        return self.t.wte(ids) + self.t.wpe(positions)

    def blocks(self):
        return self.t.h

    def qkv(self, blk, x, positions):
        q, k, v = blk.attn.c_attn(blk.ln_1(x)).split(self.d, dim=-1)
        return [t.reshape(-1, self.h, self.dh).transpose(0, 1) for t in (q, k, v)]

    def mix(self, blk, x, o):
        x = x + blk.attn.c_proj(o)
        return x + blk.mlp(blk.ln_2(x))

    def head(self, x):
        return self.lm(self.t.ln_f(x))


class Llama(StaticCache):
    """A Llama: RMSNorm, rotary embeddings at the tokens' positions,
    grouped-query attention, SwiGLU MLP."""

    def __init__(self, hf, max_len):
        cfg = hf.config
        super().__init__(max_len, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads)
        self.m, self.lm = hf.model, hf.lm_head

    def embed(self, ids, positions):
        return self.m.embed_tokens(ids)

    def blocks(self):
        return self.m.layers

    def qkv(self, layer, x, positions):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        x = layer.input_layernorm(x)
        a = layer.self_attn
        q = a.q_proj(x).reshape(-1, self.h, self.dh).transpose(0, 1)
        k = a.k_proj(x).reshape(-1, self.kv, self.dh).transpose(0, 1)
        v = a.v_proj(x).reshape(-1, self.kv, self.dh).transpose(0, 1)
        cos, sin = self.m.rotary_emb(x, positions.reshape(1, -1))
        q, k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
        return q[0], k[0], v

    def mix(self, layer, x, o):
        x = x + layer.self_attn.o_proj(o)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def head(self, x):
        return self.lm(self.m.norm(x))


def gpt2(seed):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    # An untied head: with random weights, a tied one makes greedy decoding
    # repeat one token (its own embedding scores highest).
    cfg = GPT2Config(vocab_size=1000, n_positions=MAX, n_embd=128, n_layer=4, n_head=4, attn_implementation="eager",
                     bos_token_id=0, eos_token_id=None, tie_word_embeddings=False)
    hf = randomize(GPT2LMHeadModel(cfg), seed).eval()
    return hf, Gpt2(hf, MAX).eval(), (cfg.n_layer, cfg.n_head, MAX, cfg.n_embd // cfg.n_head)


def llama(seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=MAX, attn_implementation="eager",
                      bos_token_id=0, eos_token_id=None, tie_word_embeddings=False)
    hf = randomize(LlamaForCausalLM(cfg), seed).eval()
    m = Llama(hf, MAX).eval()
    return hf, m, (cfg.num_hidden_layers, m.kv, MAX, m.dh)


def reference(hf, prompt, new):
    """transformers' greedy tokens after `prompt`."""
    with torch.no_grad():
        return hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, do_sample=False,
                           pad_token_id=0)[0, prompt.shape[1]:].tolist()


def export(out, name, program, args, inputs, outputs):
    with torch.no_grad():
        torch.onnx.export(program, args, os.path.join(out, f"{name}.onnx"), opset_version=OPSET, dynamo=False,
                          input_names=inputs, output_names=outputs)
    return ort.InferenceSession(os.path.join(out, f"{name}.onnx"), ort.SessionOptions(), providers=["CPUExecutionProvider"])


def export_decoder(out, name, hf, m, cache_shape, seed):
    """Export NAME's programs, check onnxruntime over them against
    transformers' greedy tokens, save the prompts and the tokens."""
    rng = np.random.default_rng(seed)
    vocab = hf.config.vocab_size
    prompts = [torch.from_numpy(rng.integers(0, vocab, (1, n)).astype(np.int64)) for n in (PROMPT, PROMPT2)]
    refs = [reference(hf, p, n) for p, n in zip(prompts, (NEW, NEW2))]
    cache = torch.zeros(cache_shape)
    slots = torch.zeros((SLOTS,) + tuple(cache_shape))
    i64 = lambda *v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    dec = export(out, f"{name}-decode", Program(m, "decode"), (prompts[0][:, :1], i64(PROMPT), cache, cache),
                 ["input_ids", "position", "k_cache", "v_cache"], ["logits", "k_cache_out", "v_cache_out"])
    pre = {p: export(out, f"{name}-prefill-{p}", Program(m, "prefill"), (prompts[0][:, :p],), ["input_ids"],
                     ["logits", "k_cache_out", "v_cache_out"]) for p in PREFILLS}
    dec_b = export(out, f"{name}-decode-batch", Program(m, "decode_batch"),
                   (prompts[0][:, :1].repeat(SLOTS, 1), i64(*range(SLOTS)), slots, slots),
                   ["input_ids", "position", "k_slots", "v_slots"], ["logits", "k_slots_out", "v_slots_out"])
    pre_s = {p: export(out, f"{name}-prefill-slot-{p}", Program(m, "prefill_slot"), (prompts[0][:, :p], i64(1), slots, slots),
                       ["input_ids", "slot", "k_slots", "v_slots"], ["logits", "k_slots_out", "v_slots_out"]) for p in PREFILLS}

    # onnxruntime through the programs must give transformers' tokens: the
    # longest prefill that fits, then the rest of the prompt and the new
    # tokens through the decode step.
    def alone(prompt, new):
        p = max(n for n in PREFILLS if n <= prompt.shape[1])
        logits, k, v = pre[p].run(None, {"input_ids": prompt[:, :p].numpy()})
        feed = prompt[0, p:].tolist()
        got, pos = [], p
        while len(got) < new:
            if not feed:
                got.append(int(np.argmax(logits[0])))
                if len(got) == new:
                    break
                feed.append(got[-1])
            logits, k, v = dec.run(None, {"input_ids": np.array([[feed.pop(0)]], np.int64), "position": np.array([pos], np.int64),
                                          "k_cache": k, "v_cache": v})
            pos += 1
        return got

    for prompt, ref, new in zip(prompts, refs, (NEW, NEW2)):
        got = alone(prompt, new)
        if got != ref:
            sys.exit(f"export_decoder.py: {name}: onnxruntime over the exported programs gave {got}, transformers {ref}")

    # The batched programs: both prompts in slots 2 and 0 (the second
    # joining two steps later), each must get its tokens alone.
    ks = np.zeros(slots.shape, np.float32)
    vs = np.zeros(slots.shape, np.float32)
    seqs = {}
    def join(slot, prompt):
        nonlocal ks, vs
        p = max(n for n in PREFILLS if n <= prompt.shape[1])
        logits, ks, vs = pre_s[p].run(None, {"input_ids": prompt[:, :p].numpy(), "slot": np.array([slot], np.int64),
                                             "k_slots": ks, "v_slots": vs})
        seqs[slot] = {"feed": prompt[0, p:].tolist(), "pos": p, "got": [], "logits": logits[0]}
    join(2, prompts[0])
    for step in range(NEW + 4):
        if step == 2:
            join(0, prompts[1])
        ids, pos = np.zeros((SLOTS, 1), np.int64), np.zeros(SLOTS, np.int64)
        for slot, q in seqs.items():
            if not q["feed"] and len(q["got"]) < (NEW if slot == 2 else NEW2):
                q["got"].append(int(np.argmax(q["logits"])))
                q["feed"].append(q["got"][-1])
            if q["feed"]:
                ids[slot, 0], pos[slot] = q["feed"].pop(0), q["pos"]
                q["pos"] += 1
        logits, ks, vs = dec_b.run(None, {"input_ids": ids, "position": pos, "k_slots": ks, "v_slots": vs})
        for slot, q in seqs.items():
            q["logits"] = logits[slot]
    for slot, ref, new in ((2, refs[0], NEW), (0, refs[1], NEW2)):
        if seqs[slot]["got"][:new] != ref:
            sys.exit(f"export_decoder.py: {name}: the batched programs gave slot {slot} {seqs[slot]['got'][:new]}, transformers {ref}")

    for suffix, prompt, ref in (("", prompts[0], refs[0]), ("2", prompts[1], refs[1])):
        np.save(os.path.join(out, f"{name}-decoder.prompt{suffix}.npy"), prompt.numpy())
        np.save(os.path.join(out, f"{name}-decoder.generated{suffix}.npy"), np.array(ref, np.int64))
        # The same as comma-separated text, for rbln-generate in the guest.
        for what, ids in ((f"prompt{suffix}", prompt.numpy()[0]), (f"generated{suffix}", ref)):
            with open(os.path.join(out, f"{name}-decoder.{what}.txt"), "w") as f:
                f.write(",".join(str(int(i)) for i in ids) + "\n")
    print(f"{name}: prompts {PROMPT} and {PROMPT2}, prefills {PREFILLS}, {SLOTS} batch slots, cache {cache_shape}; "
          "onnxruntime matches transformers", file=sys.stderr)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, build, seed in (("gpt2", gpt2, 11), ("llama", llama, 22)):
        hf, m, cache_shape = build(seed)
        export_decoder(out, name, hf, m, cache_shape, seed)


if __name__ == "__main__":
    main()
