"""Causal decoders generating on the NPU: GPT-2 and a Llama-style model
(rotary embeddings, RMSNorm, SwiGLU, grouped-query attention; random
weights from small configs) as a prefill and a decode program over a
fixed-size KV cache
(tests/models/exports/export_decoder.py, compiled by
tests/compiler/compile-exports.sh), run greedily token by token; the
tokens must be exactly those transformers' generate() produced.

For now the cache travels with each call (an input and an output of the
decode program) and each program holds its own copy of the weights.
"""

import pathlib

import numpy as np
import pytest

import rbln

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXPORTS = ROOT / "target" / "exports"


def need(name):
    p = EXPORTS / name
    if not p.exists():
        pytest.fail(f"{p.relative_to(ROOT)} is missing: run tests/compiler/compile-exports.sh on the host first")
    return p


def greedy(prefill, step, prompt, n):
    """n tokens: the prefill's logits, then `step(token, position)`'s."""
    logits = prefill(prompt)
    got = []
    for i in range(n):
        token = int(np.argmax(logits[0]))
        got.append(token)
        if i + 1 < n:
            logits = step(token, prompt.shape[1] + i)
    return got


def ids(*v):
    return [np.array(x, np.int64) for x in v]


@pytest.mark.device
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_generation_matches_transformers(name):
    prompt = np.load(need(f"{name}-decoder.prompt.npy"))
    want = np.load(need(f"{name}-decoder.generated.npy")).tolist()
    with rbln.Runtime(need(f"{name}-prefill.rbln")) as prefill, rbln.Runtime(need(f"{name}-decode.rbln")) as decode:
        info = decode.inspect()
        assert [i["name"] for i in info["inputs"]] == ["input_ids", "position", "k_cache", "v_cache"]
        cache = {}

        def first(p):
            logits, cache["k"], cache["v"] = prefill.run(p)
            return logits

        def step(token, position):
            logits, cache["k"], cache["v"] = decode.run(*ids([[token]], [position]), cache["k"], cache["v"])
            return logits

        got = greedy(first, step, prompt, len(want))
    assert got == want, f"first difference at token {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"
    assert len(got) >= 64


@pytest.mark.device
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_the_kv_cache_stays_on_the_device(name):
    """The decode program's cache bound as state: set once from the
    prefill, then each step passes only the token and its position and
    gets only the logits; the tokens are the same."""
    prompt = np.load(need(f"{name}-decoder.prompt.npy"))
    want = np.load(need(f"{name}-decoder.generated.npy")).tolist()
    pairs = [("k_cache", "k_cache_out"), ("v_cache", "v_cache_out")]
    with rbln.Runtime(need(f"{name}-prefill.rbln")) as prefill, \
            rbln.Runtime(need(f"{name}-decode.rbln"), state=pairs) as decode:
        assert decode.state == pairs
        info = decode.inspect()
        assert [i["name"] for i in info["inputs"]] == ["input_ids", "position"]
        assert [o["name"] for o in info["outputs"]] == ["logits"]
        assert info["state"] == pairs
        logits, k, v = prefill.run(prompt)
        # The state starts as zeros; set it from the prefill.
        assert not np.any(decode.get_state("k_cache"))
        decode.set_state("k_cache", k)
        decode.set_state("v_cache", v)
        assert np.array_equal(decode.get_state("v_cache"), v)
        got = greedy(lambda p: logits, lambda t, pos: decode.run(*ids([[t]], [pos])), prompt, len(want))
        assert got == want
        # The cache now holds every position up to the last token's.
        k_end = decode.get_state("k_cache")
        assert np.any(k_end[:, :, prompt.shape[1] + len(want) - 2]) and not np.any(k_end[:, :, prompt.shape[1] + len(want) - 1:])
        decode.reset_state()
        assert not np.any(decode.get_state("k_cache"))
        with pytest.raises(rbln.RBLNError, match="'logits' is not a bound state input"):
            decode.set_state("logits", logits)
        with pytest.raises(rbln.RBLNError, match="state 'k_cache' is f32"):
            decode.set_state("k_cache", k[:1])
    with pytest.raises(rbln.RBLNError, match="'nope' is not an input of the model"):
        rbln.Runtime(need(f"{name}-decode.rbln"), state=[("nope", "logits")])
    with pytest.raises(rbln.RBLNError, match="differ"):
        rbln.Runtime(need(f"{name}-decode.rbln"), state=[("k_cache", "logits")])


@pytest.mark.device
def test_rbln_generate_greedy_streaming_and_sampling():
    prompt = np.load(need("llama-decoder.prompt.npy"))[0].tolist()
    want = np.load(need("llama-decoder.generated.npy")).tolist()
    dec = rbln.Decoder(need("llama-decode.rbln"), prefill=need("llama-prefill.rbln"))
    r = rbln.generate(dec, prompt, max_new_tokens=len(want))
    assert r["tokens"] == want and r["used_prefill"]
    assert r["time_to_first_token_ms"] > 0 and r["tokens_per_s"] > 0
    # Streaming yields the same tokens one by one; on_token sees them too.
    assert list(rbln.generate(dec, prompt, max_new_tokens=10, stream=True)) == want[:10]
    seen = []
    rbln.generate(dec, prompt, max_new_tokens=5, on_token=seen.append)
    assert seen == want[:5]
    # A shorter prompt goes token by token through the decode program.
    r = rbln.generate(need("llama-decode.rbln"), prompt[:5], max_new_tokens=4)
    assert not r["used_prefill"] and len(r["tokens"]) == 4
    # Sampling: repeatable with a seed.
    a = rbln.generate(dec, prompt, max_new_tokens=16, sampling="top-p", top_p=0.9, temperature=1.5, seed=3)["tokens"]
    b = rbln.generate(dec, prompt, max_new_tokens=16, sampling="top-p", top_p=0.9, temperature=1.5, seed=3)["tokens"]
    assert a == b
    # Errors: a callback that raises stops generation and surfaces; bad options.
    def boom(t):
        raise KeyError("stop")
    with pytest.raises(KeyError):
        rbln.generate(dec, prompt, max_new_tokens=4, on_token=boom)
    with pytest.raises(rbln.RBLNValueError, match="on_token"):
        rbln.generate(dec, prompt, max_new_tokens=4, stream=True, on_token=boom)
    with pytest.raises(rbln.RBLNValueError, match='sampling "beam"'):
        dec.generate(prompt, sampling="beam")
    with pytest.raises(rbln.RBLNValueError, match="do not fit the cache"):
        dec.generate(prompt, max_new_tokens=500)
