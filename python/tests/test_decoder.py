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


@pytest.mark.device
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_generation_matches_transformers(name):
    prompt = np.load(need(f"{name}-decoder.prompt.npy"))
    want = np.load(need(f"{name}-decoder.generated.npy")).tolist()
    with rbln.Runtime(need(f"{name}-prefill.rbln")) as prefill, rbln.Runtime(need(f"{name}-decode.rbln")) as decode:
        info = decode.inspect()
        assert [i["name"] for i in info["inputs"]] == ["input_ids", "position", "k_cache", "v_cache"]
        logits, k, v = prefill.run(prompt)
        got = []
        for step in range(len(want)):
            token = int(np.argmax(logits[0]))
            got.append(token)
            if step + 1 == len(want):
                break
            position = prompt.shape[1] + step
            logits, k, v = decode.run(np.array([[token]], np.int64), np.array([position], np.int64), k, v)
    assert got == want, f"first difference at token {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"
    assert len(got) >= 64
