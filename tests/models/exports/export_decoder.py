#!/usr/bin/env python3
"""Causal decoders as static-shape prefill and decode programs with an
explicit KV cache, exported to ONNX, and transformers' own greedy
generation as the reference.

    export_decoder.py OUTDIR

For GPT-2 and a Llama-style model (transformers' GPT2LMHeadModel and
LlamaForCausalLM: rotary embeddings, RMSNorm, SwiGLU, grouped-query
attention; random weights from small configs, no downloads) writes, for
NAME in gpt2, llama:

  NAME-prefill.onnx   input_ids [1, P] -> logits [1, V] (the last
                      position's), k_cache, v_cache [L, KV heads, MAX, Dh]
                      (the prompt's keys and values, zeros after it)
  NAME-decode.onnx    input_ids [1, 1], position [1] (int64), k_cache,
                      v_cache -> logits [1, V], k_cache, v_cache with
                      the token's keys and values written at `position`
                      (attention over positions <= position)
  NAME-decoder.prompt.npy     the prompt ids [1, P] (int64)
  NAME-decoder.generated.npy  transformers' generate(do_sample=False)
                      tokens after the prompt (NEW ids, int64)
  NAME-decoder.{prompt,generated}.txt  the same, comma-separated

Both graphs are the model's own modules (embeddings, LayerNorms, the
attention and MLP projections) run in a forward written for a cache of
fixed size MAX: the cache is written with a Where over the positions
(no scatter at a run-time index) and attention masks the positions past
the current one, so the shapes never change. The script checks that
onnxruntime running prefill then decode step by step reproduces
transformers' tokens before writing them.
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


class StaticCache(nn.Module):
    """A decoder's forward over a KV cache of MAX positions, shared by the
    models: each supplies `embed`, `blocks`, `qkv` (its input norm,
    projections and position encoding), `mix` (attention output
    projection and MLP) and `logits`."""

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
        return self.logits(x), torch.stack(ks), torch.stack(vs)

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
        return self.logits(x), torch.stack(ks), torch.stack(vs)


class Prefill(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m.prefill(input_ids)


class Decode(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, position, k_cache, v_cache):
        return self.m.decode(input_ids, position, k_cache, v_cache)


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

    def logits(self, x):
        return self.lm(self.t.ln_f(x[-1:]))  # [1, V]


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

    def logits(self, x):
        return self.lm(self.m.norm(x[-1:]))


def gpt2(seed):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=1000, n_positions=MAX, n_embd=128, n_layer=4, n_head=4, attn_implementation="eager",
                     bos_token_id=0, eos_token_id=None)
    hf = randomize(GPT2LMHeadModel(cfg), seed).eval()
    m = Gpt2(hf, MAX)
    return hf, Prefill(m).eval(), Decode(m).eval(), (cfg.n_layer, m.kv, MAX, m.dh)


def llama(seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=MAX, attn_implementation="eager",
                      bos_token_id=0, eos_token_id=None)
    hf = randomize(LlamaForCausalLM(cfg), seed).eval()
    m = Llama(hf, MAX)
    return hf, Prefill(m).eval(), Decode(m).eval(), (cfg.num_hidden_layers, m.kv, MAX, m.dh)


def export_pair(out, name, hf, pre, dec, cache_shape, seed):
    """Export NAME-prefill / NAME-decode, check onnxruntime over them
    against transformers' greedy tokens, save the prompt and the tokens."""
    prompt = torch.from_numpy(np.random.default_rng(seed).integers(0, hf.config.vocab_size, (1, PROMPT)).astype(np.int64))
    with torch.no_grad():
        ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW, do_sample=False,
                          pad_token_id=0)[0, PROMPT:].numpy()
    cache = torch.zeros(cache_shape)
    with torch.no_grad():
        torch.onnx.export(pre, (prompt,), os.path.join(out, f"{name}-prefill.onnx"), opset_version=OPSET, dynamo=False,
                          input_names=["input_ids"], output_names=["logits", "k_cache", "v_cache"])
        torch.onnx.export(dec, (prompt[:, :1], torch.tensor([PROMPT]), cache, cache), os.path.join(out, f"{name}-decode.onnx"),
                          opset_version=OPSET, dynamo=False, input_names=["input_ids", "position", "k_cache", "v_cache"],
                          output_names=["logits", "k_cache_out", "v_cache_out"])
    # onnxruntime through the two programs must give transformers' tokens.
    so = ort.SessionOptions()
    sp = ort.InferenceSession(os.path.join(out, f"{name}-prefill.onnx"), so, providers=["CPUExecutionProvider"])
    sd = ort.InferenceSession(os.path.join(out, f"{name}-decode.onnx"), so, providers=["CPUExecutionProvider"])
    logits, k, v = sp.run(None, {"input_ids": prompt.numpy()})
    got = []
    for step in range(NEW):
        tok = int(np.argmax(logits[0]))
        got.append(tok)
        if step + 1 == NEW:
            break
        logits, k, v = sd.run(None, {"input_ids": np.array([[tok]], np.int64), "position": np.array([PROMPT + step], np.int64),
                                     "k_cache": k, "v_cache": v})
    if got != ref.tolist():
        sys.exit(f"export_decoder.py: {name}: onnxruntime over the exported programs gave {got}, transformers {ref.tolist()}")
    np.save(os.path.join(out, f"{name}-decoder.prompt.npy"), prompt.numpy())
    np.save(os.path.join(out, f"{name}-decoder.generated.npy"), ref.astype(np.int64))
    # The same as comma-separated text, for rbln-generate in the guest.
    for what, ids in (("prompt", prompt.numpy()[0]), ("generated", ref)):
        with open(os.path.join(out, f"{name}-decoder.{what}.txt"), "w") as f:
            f.write(",".join(str(int(i)) for i in ids) + "\n")
    print(f"{name}: prompt {PROMPT}, {NEW} new tokens, cache {cache_shape}; onnxruntime matches transformers", file=sys.stderr)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, build, seed in (("gpt2", gpt2, 21), ("llama", llama, 22)):
        hf, pre, dec, cache_shape = build(seed)
        export_pair(out, name, hf, pre, dec, cache_shape, seed)


if __name__ == "__main__":
    main()
