"""Causal decoders generating on the NPU: GPT-2 and a Llama-style model
(rotary embeddings, RMSNorm, SwiGLU, grouped-query attention; random
weights from small configs), each one .rbln whose entry points — a decode
step, prefills at 4 and 8 tokens, a batched decode step and slot
prefills — share one copy of the weights
(tests/models/exports/export_decoder.py, compiled by
tests/compiler/compile-exports.sh). The tokens must be exactly those
transformers' generate() produced, for two prompt lengths, alone and
under continuous batching.
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


def ids(*v):
    return [np.array(x, np.int64) for x in v]


def reference(name, second=False):
    """(prompt ids, transformers' tokens) of the exporter's first or second
    prompt."""
    sfx = "2" if second else ""
    return (np.load(need(f"{name}-decoder.prompt{sfx}.npy"))[0].tolist(),
            np.load(need(f"{name}-decoder.generated{sfx}.npy")).tolist())


ENTRIES = ["decode", "prefill_4", "prefill_8", "decode_batch", "prefill_slot_4", "prefill_slot_8"]
PAIRS = [("k_cache", "k_cache_out"), ("v_cache", "v_cache_out")]


@pytest.mark.device
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_entry_points_share_the_weights_and_the_cache_by_hand(name):
    """The prefill and decode entry points of one Runtime, the cache bound
    as state across them: the prefill writes it on the device, each decode
    step passes only the token and its position."""
    prompt, want = reference(name)
    with rbln.Runtime(need(f"{name}-decoder.rbln"), state=PAIRS) as rt:
        assert rt.entries == ENTRIES and rt.entry == "decode"
        info = rt.inspect()
        assert [i["name"] for i in info["inputs"]] == ["input_ids", "position"]
        assert [o["name"] for o in info["outputs"]] == ["logits"]
        assert info["state"] == PAIRS and info["entries"] == ENTRIES
        # Every program reads nearly all of the one weights section.
        mem = info["memory"]
        assert 0.95 * mem["weight_bytes"] < mem["weights_used_bytes"] <= mem["weight_bytes"]
        assert not np.any(rt.get_state("k_cache"))
        rt.select("prefill_8")
        assert rt.entry == "prefill_8" and [i["name"] for i in rt.inspect()["inputs"]] == ["input_ids"]
        logits = rt.run(np.array([prompt], np.int64))
        k = rt.get_state("k_cache")
        assert np.any(k[:, :, 7]) and not np.any(k[:, :, 8:]), "the prefill wrote positions 0..7 of the cache"
        rt.select("decode")
        got = []
        for i in range(len(want)):
            got.append(int(np.argmax(logits[0])))
            if i + 1 < len(want):
                logits = rt.run(*ids([[got[-1]]], [len(prompt) + i]))
        assert got == want, f"first difference at token {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"
        k_end = rt.get_state("k_cache")
        assert np.any(k_end[:, :, len(prompt) + len(want) - 2]) and not np.any(k_end[:, :, len(prompt) + len(want) - 1:])
        # set_state writes what the next run reads; reset clears it.
        rt.set_state("v_cache", np.ones_like(k_end))
        assert np.all(rt.get_state("v_cache") == 1)
        rt.reset_state()
        assert not np.any(rt.get_state("k_cache"))
        with pytest.raises(rbln.RBLNError, match="'logits' is not a bound state input"):
            rt.set_state("logits", logits)
        with pytest.raises(rbln.RBLNError, match="state 'k_cache' is f32"):
            rt.set_state("k_cache", k[:1])
        with pytest.raises(rbln.RBLNError, match="no entry point 'prefill_5'"):
            rt.select("prefill_5")
    with pytest.raises(rbln.RBLNError, match="'nope' is not an input of the model"):
        rbln.Runtime(need(f"{name}-decoder.rbln"), state=[("nope", "logits")])
    with pytest.raises(rbln.RBLNError, match="are f32"):
        rbln.Runtime(need(f"{name}-decoder.rbln"), state=[("k_cache", "logits")])
    # entry= picks the program at construction.
    with rbln.Runtime(need(f"{name}-decoder.rbln"), entry="prefill_4") as rt:
        assert rt.entry == "prefill_4" and len(rt.run(np.array([prompt[:4]], np.int64))) == 3


@pytest.mark.device
def test_compile_entry_points_from_onnx_stores_the_weights_once(tmp_path):
    files = {"decode": "llama-decode.onnx", "prefill_4": "llama-prefill-4.onnx", "prefill_8": "llama-prefill-8.onnx"}
    both = rbln.compile_from_onnx({e: need(f) for e, f in files.items()}, name="llama")
    assert both.inspect()["entries"] == list(files)
    path = tmp_path / "llama.rbln"
    both.save(path)
    alone = tmp_path / "decode.rbln"
    rbln.compile_from_onnx(need(files["decode"])).save(alone)
    # Three programs in little more than the bytes of one.
    assert path.stat().st_size < 1.2 * alone.stat().st_size
    prompt, want = reference("llama")
    assert rbln.generate(str(path), prompt, max_new_tokens=8)["tokens"] == want[:8]
    with pytest.raises(rbln.RBLNCompileError, match="entry point 'prefill_4'"):
        rbln.compile_from_onnx({"decode": need(files["decode"]), "prefill_4": b"not onnx"})


@pytest.mark.device
def test_rbln_generate_greedy_streaming_and_sampling():
    prompt, want = reference("llama")
    prompt2, want2 = reference("llama", second=True)
    dec = rbln.Decoder(need("llama-decoder.rbln"))
    assert dec.prefill_lengths == [4, 8]
    r = rbln.generate(dec, prompt, max_new_tokens=len(want))
    assert r["tokens"] == want and r["prefill_tokens"] == 8
    assert r["time_to_first_token_ms"] > 0 and r["tokens_per_s"] > 0
    # 11 tokens: prefill_8, then 3 through the decode step.
    r = dec.generate(prompt2, max_new_tokens=len(want2))
    assert r["tokens"] == want2 and r["prefill_tokens"] == 8
    # Every prompt token through the decode step: the same tokens.
    r = dec.generate(prompt2, max_new_tokens=len(want2), prefill=False)
    assert r["tokens"] == want2 and r["prefill_tokens"] == 0
    # Streaming yields the same tokens one by one; on_token sees them too.
    assert list(rbln.generate(dec, prompt, max_new_tokens=10, stream=True)) == want[:10]
    seen = []
    rbln.generate(dec, prompt, max_new_tokens=5, on_token=seen.append)
    assert seen == want[:5]
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
    with pytest.raises(rbln.RBLNError, match="do not fit the cache"):
        dec.generate(prompt, max_new_tokens=500)
    with pytest.raises(rbln.RBLNError, match="no entry point of the model is a decode step"):
        rbln.Decoder(need("mobilenet_v3_small.rbln"))


@pytest.mark.device
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_continuous_batching(name):
    """Sequences join and leave the batched decode step; each gets exactly
    the tokens it gets alone."""
    prompt, want = reference(name)
    prompt2, want2 = reference(name, second=True)
    b = rbln.BatchDecoder(need(f"{name}-decoder.rbln"))
    assert b.slots == 4 and b.active == 0
    got = {}
    a = b.join(prompt, max_new_tokens=len(want))
    steps = 0

    def step():
        nonlocal steps
        steps += 1
        for i, t, finished in b.step():
            got.setdefault(i, []).append(t)
            if finished:
                done.add(i)

    done = set()
    for _ in range(3):
        step()
    c = b.join(prompt2, max_new_tokens=len(want2))  # joins while `a` decodes
    short = b.join(prompt2, max_new_tokens=6)
    gone = b.join(prompt, max_new_tokens=30)
    assert b.active == 4
    with pytest.raises(rbln.RBLNError, match="all 4 slots are busy"):
        b.join(prompt, max_new_tokens=4)
    b.cancel(gone)
    # A bad request is refused at join, before anything runs: the batch
    # goes on unaffected.
    with pytest.raises(rbln.RBLNError, match="prompt token 1 is 100000, outside the model's token ids 0..1000"):
        b.join([1, 100000, 2], max_new_tokens=4)
    with pytest.raises(rbln.RBLNError, match="the prompt is empty"):
        b.join([], max_new_tokens=4)
    gone = b.join(prompt, max_new_tokens=30)
    for _ in range(5):
        step()
    assert b.cancel(gone) and not b.cancel(gone)
    late = None
    while b.active:
        if short in done and late is None:
            late = b.join(prompt[:3], max_new_tokens=12)  # into the slot `short` left
        step()
        assert steps < 200
    assert got[a] == want
    assert got[c] == want2
    assert got[short] == want2[:6]
    assert got[gone] == want[:len(got[gone])] and 0 < len(got[gone]) < 30
    alone = rbln.generate(need(f"{name}-decoder.rbln"), prompt[:3], max_new_tokens=12)
    assert alone["prefill_tokens"] == 0 and got[late] == alone["tokens"]
    assert done == {a, c, short, late}
    with pytest.raises(rbln.RBLNError, match="do not fit the cache"):
        b.join(prompt, max_new_tokens=100)
    with pytest.raises(rbln.RBLNError, match="no entry point of the model is a batched decode step"):
        rbln.BatchDecoder(need("mobilenet_v3_small.rbln"))


def dram_in_use():
    """Device DRAM held by this process's rbln files (fdinfo's
    drm-total-dram, summed over them)."""
    import os
    import re

    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    total = 0
    for fd in os.listdir("/proc/self/fdinfo"):
        try:
            with open(f"/proc/self/fdinfo/{fd}") as f:
                m = re.search(r"drm-total-dram:\s+(\d+)\s*(\w+)", f.read())
        except OSError:
            continue
        if m:
            total += int(m.group(1)) * units[m.group(2)]
    return total


@pytest.mark.device
def test_one_file_of_entry_points_against_one_file_per_entry(tmp_path):
    """File size and device memory of the six-entry decoder against its six
    programs compiled as separate files and loaded as separate runtimes."""
    progs = {"decode": "decode", "prefill_4": "prefill-4", "prefill_8": "prefill-8", "decode_batch": "decode-batch",
             "prefill_slot_4": "prefill-slot-4", "prefill_slot_8": "prefill-slot-8"}
    singles = {}
    for e, f in progs.items():
        singles[e] = tmp_path / f"{e}.rbln"
        rbln.compile_from_onnx(need(f"llama-{f}.onnx")).save(singles[e])
    multi = need("llama-decoder.rbln")
    sizes = sum(p.stat().st_size for p in singles.values())
    assert multi.stat().st_size < sizes / 4, (multi.stat().st_size, sizes)
    base = dram_in_use()
    with rbln.Runtime(multi) as rt:
        assert rt.entries == list(progs)
        one = dram_in_use() - base
        weights = rt.inspect()["memory"]["weight_bytes"]
    runtimes = [rbln.Runtime(p) for p in singles.values()]
    try:
        six = dram_in_use() - base
    finally:
        for r in runtimes:
            r.close()
    print(f"llama: one file {multi.stat().st_size} B, six files {sizes} B; device DRAM {one} B vs {six} B; weights {weights} B")
    # One weights copy and one arena (the largest program's) against six of each.
    assert one < six / 3, (one, six)
    assert six - one > 4 * weights
