#!/usr/bin/env python3
"""Aggregate the raw results of `make bench` into OUT/report.json and print
the table (scripts/bench.sh runs it after the VM).

    python bench_report.py OUT            # writes OUT/report.json, prints the table
    python bench_report.py --check FILE   # is the report well-formed and complete?

Inputs, all under OUT: plan.env (what was run), machine.env (host facts
recorded by bench.sh), models/NAME.{onnx,compile.rc,compile.err,report.json},
host/ort.{before,after}.jsonl (bench_models.py ort before and after the
VM; ort.paired.jsonl: right before each of a model's profiles, the
guest asleep, one line per turn),
host/native.{before,after}.json (rbln-bench-host before and after the
VM; native.paired.jsonl: right before each profile of the micro models
compared with it and before the DMA step, one line per turn tagged with
what it is paired with),
guest/* (tests/bench/guest.sh: rbln-run --json reports, Chrome traces of
rbln-run --profile, rbln-bench-guest results).

Definitions (see README.md, "Benchmarks"):
- device_ms: span of one profiled inference's device timestamps (first
  event start to last event end, input and output transfers included),
  median over the profiled inferences; each profiled submission runs the
  inference PROFILE_RUNS times back to back (rbln-run --profile-runs,
  which records every run's span; its trace holds the last run's events)
  and device_ms is the median over all profiles' runs but the first: the
  steady state of a loop of inferences, as onnxruntime's median is
  (device_first_run_ms: the median of the first runs);
- run_p50_ms: rbln-run's p50 latency in the guest (wall clock, TCG guest);
  run_device_p50_ms: the p50 device time of those same inferences (device
  timestamps around each), run_overhead = run_p50_ms / run_device_p50_ms - 1;
- ratio: device_ms / onnxruntime_ms (lower is better, 1 = parity).
Micro rows carry value, reference, unit, ratio = value / reference and
`better` ("higher" or "lower") saying which direction is good.
"""

import datetime
import json
import math
import os
import shlex
import sys

import numpy as np


def read_env(path):
    env = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    k, v = line.split("=", 1)
                    env[k] = " ".join(shlex.split(v))
    return env


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_text(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def last_line(path):
    lines = [ln for ln in read_text(path).splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def size_str(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10} KiB"
    return f"{n} B"


def median(v):
    """The median (the mean of the middle two of an even count)."""
    v = sorted(v)
    if not v:
        return None
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


class Guest:
    """The guest's results for one model."""

    def __init__(self, out, name):
        self.g = os.path.join(out, "guest")
        self.name = name

    def path(self, suffix):
        return os.path.join(self.g, f"{self.name}.{suffix}")

    def error(self):
        """None if rbln-run ran, else why not."""
        rc = read_text(self.path("run.rc"), None)
        if rc is None:
            return "no guest result (the VM run did not reach this model)"
        if rc != "0":
            return f"rbln-run exited with status {rc}: {last_line(self.path('run.err'))}"
        return None

    def run(self):
        return read_json(self.path("run.json"))

    def trace_files(self):
        out, i = [], 0
        while True:
            t = read_json(self.path(f"trace.{i}.json"))
            if t is None:
                return out
            out.append(t)
            i += 1

    def traces(self):
        return [t["traceEvents"] for t in self.trace_files()]

    def run_spans(self):
        """(spans of the first runs, spans of the runs after them), in ms,
        over the profiles: each profiled submission (rbln-run --profile-runs
        N) records the span of each of its N back-to-back runs; a trace
        without them counts as one run, its events' span."""
        first, later = [], []
        for t in self.trace_files():
            spans = (t.get("otherData") or {}).get("run_spans_us")
            if isinstance(spans, list) and spans and all(isinstance(s, (int, float)) for s in spans):
                spans = [s / 1e3 for s in spans]
            else:
                spans = [span_ms(t["traceEvents"])]
            first.append(spans[0])
            later.extend(spans[1:])
        return first, later


def span_ms(events):
    """First event start to last event end (Chrome trace times are in us)."""
    if not events:
        return None
    return (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) / 1e3


def compute_ms(events):
    return sum(e["dur"] for e in events if e.get("cat") == "compute") / 1e3


def transfer_ms(events):
    return sum(e["dur"] for e in events if e.get("cat") != "compute") / 1e3


def onnx_input_shapes(path):
    """Input shape and initializer shapes of a micro model (small files)."""
    import onnx
    m = onnx.load(path)
    (inp,) = m.graph.input
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    inits = {t.name: list(t.dims) for t in m.graph.initializer}
    return shape, inits


def diff_vs_ort(out, name):
    got = os.path.join(out, "guest", f"{name}.out.npy")
    ref = os.path.join(out, "models", f"{name}.ort.npy")
    if not (os.path.exists(got) and os.path.exists(ref)):
        return None
    a, b = np.load(got), np.load(ref)
    if a.shape != b.shape:
        return {"error": f"output shape {list(a.shape)} != onnxruntime's {list(b.shape)}"}
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return {"max_abs": float(d.max()), "max_scaled": float((d / (1.0 + np.abs(b))).max())}


def model_row(out, name, ort, kind):
    row = {"name": name, "kind": kind, "onnxruntime_ms": None, "device_ms": None,
           "run_p50_ms": None, "ratio": None, "error": None}
    errors = []
    o = ort.get(name)
    if o is None:
        errors.append("no onnxruntime result")
    elif "error" in o:
        errors.append(f"onnxruntime: {o['error']}")
    else:
        row["onnxruntime_ms"] = o["median_ms"]
        row["onnxruntime_min_ms"] = o["min_ms"]
        row["onnxruntime_runs"] = o["runs"]
        row["onnxruntime_phase_ms"] = o["phase_median_ms"]
        row["onnxruntime_paired"] = o["paired"]
    rc = read_text(os.path.join(out, "models", f"{name}.compile.rc"), None)
    if rc != "0":
        err = last_line(os.path.join(out, "models", f"{name}.compile.err"))
        errors.append(f"rbln-compile failed (status {rc}): {err}" if rc else "not compiled")
    else:
        rep = read_json(os.path.join(out, "models", f"{name}.report.json")) or {}
        row["device_ops"] = rep.get("device_ops")
        g = Guest(out, name)
        gerr = g.error()
        if gerr:
            errors.append(gerr)
        else:
            run = g.run() or {}
            lat = run.get("latency", {})
            row["run_p50_ms"] = lat.get("p50_ms")
            row["run"] = {k: lat.get(k) for k in ("count", "mean_ms", "min_ms", "p90_ms")}
            # The device time of the same timed inferences (timestamps
            # around each): run_p50 over it is the runtime's own overhead,
            # free of the drift between the timed runs and the profiles.
            dev = run.get("device") or {}
            row["run_device_p50_ms"] = dev.get("p50_ms")
            if dev.get("p50_ms") and lat.get("p50_ms"):
                row["run_overhead"] = lat["p50_ms"] / dev["p50_ms"] - 1
            row["load_ms"] = run.get("load_ms")
            traces = g.traces()
            if not traces:
                errors.append("no profile trace")
            else:
                first, later = g.run_spans()
                # The runs after the first of each profiled submission: the
                # steady state of a loop (all of them when a profile holds
                # one run only).
                spans = [s for s in later if s is not None] or [s for s in first if s is not None]
                row["device_ms"] = median(spans) if spans else None
                row["device_min_ms"] = min(spans) if spans else None
                row["device_ms_profiles"] = spans
                row["device_compute_ms"] = median([compute_ms(t) for t in traces])
                row["device_transfer_ms"] = median([transfer_ms(t) for t in traces])
                if later:
                    # The first inference of each profiled submission: the
                    # device (caches, worker threads) coming out of idle.
                    row["device_first_run_ms"] = median(first)
            diff = diff_vs_ort(out, name)
            if diff is not None:
                row["diff_vs_onnxruntime"] = diff
    if row["device_ms"] and row["onnxruntime_ms"]:
        row["ratio"] = row["device_ms"] / row["onnxruntime_ms"]
        # Best against best: less sensitive to other work on the machine.
        row["ratio_min"] = row["device_min_ms"] / row["onnxruntime_min_ms"]
    if errors:
        row["error"] = "; ".join(errors)
    return row


def micro_rows(out, plan, ort, native):
    rows = []
    models = os.path.join(out, "models")

    def row(name, unit, better, value=None, reference=None, error=None, **extra):
        r = {"name": name, "value": value, "reference": reference, "unit": unit,
             "ratio": value / reference if value and reference else None, "better": better,
             "error": error}
        r.update(extra)
        rows.append(r)

    def device_compute(name):
        """(median compute-event ms over the profiles, error); the minimum
        goes to mins[name]."""
        g = Guest(out, name)
        rc = read_text(os.path.join(models, f"{name}.compile.rc"), None)
        if rc != "0":
            return None, f"rbln-compile failed: {last_line(os.path.join(models, f'{name}.compile.err'))}"
        err = g.error()
        if err:
            return None, err
        t = g.traces()
        if not t:
            return None, "no profile trace"
        v = [compute_ms(ev) for ev in t]
        mins[name] = min(v)
        return median(v), None

    def host_refs(tag):
        """(gemm result, copies by size, how they were paired) of
        rbln-bench-host for the row measured after turns tagged TAG."""
        nat, how = native.for_tag(tag)
        return ((nat or {}).get("gemm") or {}, {c["bytes"]: c for c in (nat or {}).get("copy", [])},
                {"reference_turns": how, "reference_runs": (nat or {}).get("runs")})

    mins = {}

    # 1. GEMM n x n x n: device (one MatMul compiled from ONNX) vs the gemm crate.
    name = "micro-gemm"
    if os.path.exists(os.path.join(models, f"{name}.onnx")):
        (n, _), _ = onnx_input_shapes(os.path.join(models, f"{name}.onnx"))
        flop = 2.0 * n ** 3
        ms, err = device_compute(name)
        gemm_native, _, how = host_refs(name)
        host_n = gemm_native.get("m")
        ref = gemm_native.get("gflops") if host_n == n else None
        if ref is None and not err:
            err = f"no host gemm-crate result for n={n}"
        o = ort.get(name, {})
        row(f"gemm {n}x{n}x{n}", "GFLOP/s", "higher", flop / ms / 1e6 if ms else None, ref, err,
            device_ms=ms, device_min_ms=mins.get(name), reference_ms=gemm_native.get("median_ms"),
            reference_best_gflops=gemm_native.get("best_gflops"),
            reference_what=f"gemm crate on {plan.get('THREADS')} threads (rbln-bench-host)",
            onnxruntime_gflops=flop / o["median_ms"] / 1e6 if "median_ms" in o else None, **how)

    # 1a. A Triton kernel on the tile engine: the causal attention kernel
    # (one TILE op) against the same attention as built-in ops
    # (Transpose, MatMul, Mul, Add of the mask, Softmax, MatMul), both on
    # the device (compute time of the whole model).
    tri, blt = "micro-attention-triton", "micro-attention-builtin"
    if os.path.exists(os.path.join(models, f"{tri}.onnx")) and os.path.exists(os.path.join(models, f"{blt}.onnx")):
        import onnx
        q = onnx.load(os.path.join(models, f"{blt}.onnx")).graph.input[0]
        shapes = [d.dim_value for d in q.type.tensor_type.shape.dim]
        ms_t, err_t = device_compute(tri)
        ms_b, err_b = device_compute(blt)
        o = ort.get(blt, {})
        row(f"triton attention {shapes[0]}x{shapes[1]} causal", "ms", "lower", ms_t, ms_b, err_t or err_b,
            device_ms=ms_t, device_min_ms=mins.get(tri), reference_ms=ms_b, reference_min_ms=mins.get(blt),
            reference_what="the same attention as built-in ops on the device",
            onnxruntime_ms=o.get("median_ms"))

    # 1c. Causal decoders: rbln-generate (the KV cache on the device) vs
    # onnxruntime running the same prefill and decode programs with the
    # cache on the host: time to first token and decode tokens/s (guest:
    # median of the generations after the warm-up; onnxruntime: its best).
    for d in plan.get("DECODERS", "").split():
        def guest_runs(kind):
            runs, err = [], None
            for i in range(1, int(plan.get("DEC_RUNS", "1")) + 1):
                path = os.path.join(out, "guest", f"{kind}.{d}.{i}.json")
                try:
                    with open(path) as f:
                        runs.append(json.load(f))
                except (OSError, ValueError) as e:
                    err = f"{kind}.{d}.{i}: {e}: {last_line(os.path.join(out, 'guest', f'{kind}.{d}.{i}.err'))}"
                    break
            return runs, err

        runs, err = guest_runs("decoder")
        batch, batch_err = guest_runs("decoder-batch")
        refs = []
        for phase in ("before", "after"):
            try:
                with open(os.path.join(out, "host", f"decoder.{phase}.jsonl")) as f:
                    refs += [r for r in map(json.loads, f) if r.get("name") == d and "error" not in r]
            except OSError:
                pass
        ttft = median([r["time_to_first_token_ms"] for r in runs]) if runs and not err else None
        tps = median([r["tokens_per_s"] for r in runs]) if runs and not err else None
        ref_ttft = min((r["time_to_first_token_ms"] for r in refs), default=None)
        ref_tps = max((r["tokens_per_s"] for r in refs), default=None)
        if not err and not refs:
            err = "no onnxruntime decoder reference"
        tokens = plan.get("DEC_TOKENS")
        row(f"decoder {d}: decode tokens/s ({tokens} new tokens)", "tokens/s", "higher", tps, ref_tps, err,
            reference_what="onnxruntime, the same programs, the KV cache on the host")
        row(f"decoder {d}: time to first token", "ms", "lower", ttft, ref_ttft, err,
            reference_what="onnxruntime, the same prefill program")
        seqs = plan.get("DEC_SEQS", "4")
        btps = median([r["tokens_per_s"] for r in batch]) if batch and not batch_err else None
        ref_btps = max((r["batch_tokens_per_s"] for r in refs if "batch_tokens_per_s" in r), default=None)
        if not batch_err and ref_btps is None:
            why = next((r["batch_error"] for r in refs if "batch_error" in r), None)
            batch_err = "no onnxruntime batched decoder reference" + (f" ({why})" if why else "")
        row(f"decoder {d}: {seqs} sequences, continuous batching, tokens/s", "tokens/s", "higher", btps, ref_btps, batch_err,
            reference_what="onnxruntime, the same slot prefill and batched decode programs, the caches on the host")

    # 1b. The same GEMM quantised (QDQ, int8 weights, u8 activations): the
    # device's QGEMM against its own f32 GEMM above (device time of the
    # one GEMM op; the QuantizeLinear / DequantizeLinear around it are
    # not counted).
    # micro-gemm-int8r: the same with reduce_range (7-bit weights).
    for name, what in (("micro-gemm-int8", "int8 gemm"), ("micro-gemm-int8r", "int8 gemm (7-bit weights)")):
        if os.path.exists(os.path.join(models, f"{name}.onnx")):
            n = int(onnx_input_shapes(os.path.join(models, "micro-gemm.onnx"))[0][0]) if os.path.exists(os.path.join(models, "micro-gemm.onnx")) else None
            g, err, ms = Guest(out, name), None, None
            rc = read_text(os.path.join(models, f"{name}.compile.rc"), None)
            if rc != "0":
                err = f"rbln-compile failed: {last_line(os.path.join(models, f'{name}.compile.err'))}"
            else:
                err = g.error() or (None if g.traces() else "no profile trace")
            if not err:
                v = [sum(e["dur"] for e in t if e.get("cat") == "compute" and e.get("name") == "gemm") / 1e3 for t in g.traces()]
                ms = median(v) if all(v) else None
                err = None if ms else "no 'gemm' op in the trace"
            f32 = next((r for r in rows if r["name"].startswith("gemm ")), None)
            ref = f32["value"] if f32 else None
            if n is None and not err:
                err = "no f32 micro-gemm to compare with"
            o = ort.get(name, {})
            flop = 2.0 * n ** 3 if n else None
            row(f"{what} {n}x{n}x{n} vs f32 (device)", "GOP/s", "higher", flop / ms / 1e6 if ms and flop else None, ref, err,
                device_ms=ms, reference_what="the device's f32 GEMM of the row above (target: ratio >= 2)",
                onnxruntime_gops=flop / o["median_ms"] / 1e6 if "median_ms" in o and flop else None)

    # 2. A ResNet conv: device vs onnxruntime's Conv, same 1-node model.
    name = "micro-conv"
    if os.path.exists(os.path.join(models, f"{name}.onnx")):
        (_, c, h, w), inits = onnx_input_shapes(os.path.join(models, f"{name}.onnx"))
        co, ci, kh, kw = inits["conv.weight"]
        flop = 2.0 * co * ci * kh * kw * h * w
        ms, err = device_compute(name)
        o = ort.get(name, {})
        ref = o.get("median_ms")
        if ref is None and not err:
            err = "no onnxruntime result"
        row(f"conv {kh}x{kw} {ci}->{co} {h}x{w} pad 1", "ms", "lower", ms, ref, err,
            device_min_ms=mins.get(name), reference_min_ms=o.get("min_ms"),
            device_gflops=flop / ms / 1e6 if ms else None,
            reference_gflops=flop / ref / 1e6 if ref else None,
            reference_what=f"onnxruntime Conv, {plan.get('THREADS')} threads")

    # 3. Element-wise Add in DRAM vs the host's copy bandwidth.
    name = "micro-add"
    if os.path.exists(os.path.join(models, f"{name}.onnx")):
        shape, _ = onnx_input_shapes(os.path.join(models, f"{name}.onnx"))
        nbytes = 4 * math.prod(shape)
        ms, err = device_compute(name)
        _, copies, how = host_refs(name)
        cp = copies.get(nbytes)
        ref = cp["copy_nt"]["gbps_read_write"] if cp else None
        if ref is None and not err:
            err = f"no host copy result for {nbytes} bytes"
        o = ort.get(name, {})
        row(f"add 2x{size_str(nbytes)} -> {size_str(nbytes)}", "GB/s", "higher",
            3 * nbytes / ms / 1e6 if ms else None, ref, err,
            bytes=nbytes, device_ms=ms, device_min_ms=mins.get(name),
            bytes_counted="Add: 2 reads + 1 write; copy: 1 read + 1 write",
            reference_what=f"host copy on {plan.get('THREADS')} threads (rbln-bench-host)",
            reference_memcpy_1t_gbps=cp["memcpy_1t"]["gbps_read_write"] if cp else None,
            onnxruntime_gbps=3 * nbytes / o["median_ms"] / 1e6 if "median_ms" in o else None, **how)

    # 4. DMA host -> device DRAM vs host memcpy of the same size.
    def guest_bench(what):
        """(rbln-bench-guest WHAT's JSON, error)."""
        g = os.path.join(out, "guest", what)
        r = read_json(g + ".json")
        if r:
            return r, None
        rc = read_text(g + ".rc", None)
        if rc is None:
            return None, "no guest result (the VM run did not get this far)"
        return None, f"rbln-bench-guest {what} exited with status {rc}: {last_line(g + '.err')}"

    dma, dma_err = guest_bench("dma")
    _, copies, how = host_refs("dma")
    for s in plan.get("DMA_SIZES", "").split():
        s = int(s)
        d = next((r for r in (dma or {}).get("dma", []) if r["bytes"] == s), None)
        cp = copies.get(s)
        row(f"dma host->DRAM {size_str(s)}", "GB/s", "higher", d["h2d_gbps"] if d else None,
            cp["memcpy_1t"]["gbps"] if cp else None,
            dma_err or (None if d and cp else "missing result"),
            bytes=s, device_ms=d["h2d_median_ns"] / 1e6 if d else None,
            d2h_gbps=d["d2h_gbps"] if d else None,
            first_copy_gbps=d.get("h2d_first_gbps") if d else None,
            copies_per_submission=d.get("stream") if d else None,
            value_what="host->DRAM copies streaming back to back (all but each submission's first)",
            bytes_counted="bytes copied (size / time), both sides",
            reference_what="host memcpy, 1 thread (rbln-bench-host)", **how)

    # 5. NOP submit -> fence latency, both submission paths.
    lat, lat_err = guest_bench("latency")
    k = (lat or {}).get("ioctl_submit_fence_wait", {})
    u = (lat or {}).get("user_submit_spin", {})
    row("nop submit->fence, ioctl SUBMIT + FENCE_WAIT", "us", "lower", k.get("p50_us"), None, lat_err,
        p99_us=k.get("p99_us"), mean_us=k.get("mean_us"), runs=k.get("runs"),
        reference_what="none (value only)", clock=(lat or {}).get("clock"))
    row("nop submit->fence, user-mode submit + spin", "us", "lower", u.get("p50_us"), k.get("p50_us"),
        lat_err, p99_us=u.get("p99_us"), mean_us=u.get("mean_us"), runs=u.get("runs"),
        reference_what="the ioctl path's p50 (same boot)", clock=(lat or {}).get("clock"))

    # 6. AsyncRuntime parallel 2 vs 1 on a transfer-bound model.
    if os.path.exists(os.path.join(models, "micro-relu.onnx")):
        tp = {}
        errs = []
        for p in (1, 2):
            r = read_json(os.path.join(out, "guest", f"async.p{p}.json"))
            if r:
                tp[p] = r["latency"]["throughput_per_s"]
            else:
                errs.append(f"parallel {p}: " + (last_line(os.path.join(out, "guest", f"async.p{p}.err"))
                                                 or "no guest result"))
        shape, _ = onnx_input_shapes(os.path.join(models, "micro-relu.onnx"))
        row(f"AsyncRuntime parallel 2 vs 1, Relu {'x'.join(map(str, shape))}", "inferences/s",
            "higher", tp.get(2), tp.get(1), "; ".join(errs) or None,
            reference_what="--async --parallel 1", iterations=int(plan.get("ASYNC_ITERS", 0)))

    # 7. The Python SDK against the Rust runtime, same model and input,
    # back to back in one boot (tests/bench/python_bench.py).
    for m in plan.get("PY_MODELS", "").split():
        g = os.path.join(out, "guest", f"py.{m}")
        rs, ra, py = (read_json(f"{g}.{k}.json") for k in ("rust-sync", "rust-async", "python"))

        def why(*parts):
            missing = [k for k, r in parts if not r]
            return "; ".join(f"{k}: " + (last_line(f"{g}.{k}.err") or "no guest result") for k in missing) or None

        sy, asy = (py or {}).get("sync") or {}, (py or {}).get("async") or {}
        rust_us, py_us = sy.get("rust_p50_us"), sy.get("p50_us")
        allowed = max(30.0, 0.1 * rust_us) if rust_us else None
        mean_over = sy["mean_us"] - sy["rust_mean_us"] if sy else None
        row(f"Python Runtime.run vs Rust Runtime, {m}", "us", "lower", py_us, rust_us, why(("python", py)),
            overhead_p50_us=py_us - rust_us if py_us and rust_us else None, overhead_mean_us=mean_over,
            allowed_overhead_us=allowed,
            within_allowed=(mean_over <= allowed) if mean_over is not None and allowed else None,
            noop_call_us=sy.get("noop_call_us"),
            rust_first_run_p50_us=sy.get("rust_first_p50_us"), rust_next_run_p50_us=sy.get("rust_next_p50_us"),
            overhead_vs_rust_first_run_us=sy.get("overhead_vs_first_us"),
            rbln_run_p50_us=rs["latency"]["p50_ms"] * 1e3 if rs else None,
            reference_what="the Rust Runtime looped in Rust in the same process on the same runtime and "
                           "input, blocks alternating with the Python calls (p50 of each)",
            runs=sy.get("runs"))
        row(f"Python async_run (asyncio.gather, parallel 2) vs Rust AsyncRuntime, {m}", "inferences/s",
            "higher", asy.get("throughput_per_s"), asy.get("rust_throughput_per_s"), why(("python", py)),
            reference_what="a Rust AsyncRuntime driven as rbln-run --async --parallel 2 drives it, in the "
                           "same process, rounds alternating with the Python rounds (median round of each)",
            rbln_run_async_throughput_per_s=ra["latency"]["throughput_per_s"] if ra else None,
            requests=asy.get("requests"), rounds=asy.get("rounds"),
            round_throughputs=asy.get("round_throughputs"),
            rust_round_throughputs=asy.get("rust_round_throughputs"))

    # 8. rbln-serve under a bounded gRPC load (rbln-serve-load on the host
    # through QEMU user networking, or in the guest) against rbln-run
    # --async --parallel 2 on the same model.
    client = read_text(os.path.join(out, "guest", "serve.client")) or "guest"
    where = ("client on the host, through QEMU user networking to the guest's port" if client == "host"
             else "client and server both in the guest")
    for m in plan.get("SERVE_MODELS", "").split():
        g = os.path.join(out, "guest", f"serve.{m}")
        ref = read_json(f"{g}.async.json")
        ref_tp = ref["latency"]["throughput_per_s"] if ref else None
        for c in plan.get("SERVE_CONC", "").split():
            r = read_json(f"{g}.c{c}.json")
            err = None
            if not r:
                err = last_line(f"{g}.c{c}.err") or read_text(os.path.join(out, "guest", "serve.fatal")) or "no guest result"
            elif r["errors"] or r["wrong"]:
                err = f"{r['errors']} error(s) {r['error_codes']}, {r['wrong']} wrong answer(s)"
            if not ref:
                err = err or ("rbln-run --async: " + (last_line(f"{g}.async.err") or "no guest result"))
            r = r or {}
            row(f"rbln-serve gRPC load vs rbln-run --async, {m}, concurrency {c}", "inferences/s", "higher",
                r.get("throughput_per_s"), ref_tp, err,
                p50_ms=r.get("p50_ms"), p99_ms=r.get("p99_ms"), requests=r.get("requests"), ok=r.get("ok"),
                errors=r.get("errors"), wrong=r.get("wrong"), client=client,
                rbln_run_async_p50_ms=ref["latency"]["p50_ms"] if ref else None,
                reference_what="rbln-run --async --parallel 2 on the same model and device, right before "
                               f"(the server runs 2 instances; {where})")
    return rows


def machine_info(out, plan):
    m = read_env(os.path.join(out, "machine.env"))
    try:
        import onnxruntime
        m["onnxruntime_version"] = onnxruntime.__version__
    except ImportError:
        pass
    m["guest_clocksource"] = read_text(os.path.join(out, "guest", "clocksource")) or None
    # The CPUs the guest kernel brought up (QEMU is given VM_SMP vCPUs).
    cpus = read_text(os.path.join(out, "guest", "cpus"))
    m["guest_cpus"] = int(cpus) if cpus and cpus.strip().isdigit() else None
    for k in ("host_cpus", "device_cores", "git_dirty_files"):
        if k in m:
            m[k] = int(m[k])
    for k in list(m):
        if k.startswith(("others_cpu_", "steal_cpu_")):
            m[k] = float(m[k])
    m["threads"] = int(plan.get("THREADS", 0))
    return m


PHASES = ("before", "after")
# The references timed during the VM, right before what they are compared
# with (scripts/bench-host-client.sh).
PAIRED = "paired"


def reference_runs(runs):
    """Of a reference's results by phase, the ones its figure is made of:
    the paired run alone when there is one, else the others pooled."""
    if PAIRED in runs:
        return {PAIRED: runs[PAIRED]}
    return runs


def pool_turns(results):
    """bench_models.py ort results of one model, as one: every good turn's
    runs together (an error only when every turn failed)."""
    good = [r for r in results if "error" not in r]
    if not good:
        return results[-1]
    times = sorted(t for r in good for t in r["times_ms"])
    return {"name": good[0]["name"], "median_ms": median(times), "min_ms": times[0], "runs": len(times),
            "times_ms": times, "turns": len(good)}


def read_ort(out):
    """onnxruntime times. A model the guest had timed right before its
    profiles (host/ort.paired.jsonl, scripts/bench-host-client.sh) takes
    that paired run's median_ms and min_ms; the others pool the runs before
    and after the VM. Every row keeps each phase's median (before, after,
    paired) and says which it took ("paired")."""
    phases = {}
    for ph in PHASES + (PAIRED,):
        path = os.path.join(out, "host", f"ort.{ph}.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                phases[ph] = {}
                for r in map(json.loads, filter(str.strip, f)):
                    phases[ph].setdefault(r["name"], []).append(r)
            # One result per model, its turns pooled (the paired reference
            # takes a turn before each of the model's profiles).
            phases[ph] = {name: pool_turns(rs) for name, rs in phases[ph].items()}
    ort = {}
    for name in set().union(*phases.values()) if phases else ():
        rows = {ph: p[name] for ph, p in phases.items() if name in p}
        good = {ph: r for ph, r in rows.items() if "error" not in r}
        if not good:
            ort[name] = next(iter(rows.values()))
            continue
        times = sorted(t for r in reference_runs(good).values() for t in r["times_ms"])
        ort[name] = {"name": name, "median_ms": median(times), "min_ms": times[0], "runs": len(times),
                     "paired": PAIRED in good, "phase_median_ms": {ph: r["median_ms"] for ph, r in good.items()}}
    return ort


def merge_native(runs):
    """rbln-bench-host results as one: the median of each figure over the
    runs (GFLOP/s, GB/s, ms), every run's figure kept."""
    if not runs:
        return None
    first = runs[0]
    gemm = None
    g = [r["gemm"] for r in runs if r.get("gemm")]
    if g:
        gemm = dict(g[0], gflops=median([x["gflops"] for x in g]),
                    median_ms=median([x["median_ms"] for x in g]),
                    best_gflops=max(x["best_gflops"] for x in g),
                    every_gflops=[x["gflops"] for x in g])
    copies = []
    for c in first.get("copy", []):
        same = [x for r in runs for x in r.get("copy", []) if x["bytes"] == c["bytes"]]
        merged = {"bytes": c["bytes"]}
        for k in ("memcpy_1t", "copy_nt"):
            merged[k] = {f: median([x[k][f] for x in same]) for f in ("gbps", "gbps_read_write", "median_ms")}
            merged[k]["every_gbps"] = [x[k]["gbps"] for x in same]
        copies.append(merged)
    return {"threads": first.get("threads"), "gemm": gemm, "copy": copies, "runs": len(runs),
            "kernels_isa": first.get("kernels_isa")}


class Native:
    """The micro rows' host references (rbln-bench-host). A row takes the
    turns timed right before its own device measurements (the paired
    turns tagged with its model, or "dma"), else every paired turn, else
    the runs before and after the VM; `for_tag` says which it took."""

    def __init__(self, out):
        self.phases = {ph: read_json(os.path.join(out, "host", f"native.{ph}.json")) for ph in PHASES}
        self.phases = {ph: r for ph, r in self.phases.items() if r}
        self.turns = []
        path = os.path.join(out, "host", f"native.{PAIRED}.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                for line in filter(str.strip, f):
                    try:
                        self.turns.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass  # a torn line: the turn is lost, not the report

    def for_tag(self, tag):
        """(merged references, which: "paired" | "paired-any" | "before-after" | None)."""
        own = [t for t in self.turns if t.get("tag") == tag]
        if own:
            return merge_native(own), PAIRED
        if self.turns:
            return merge_native(self.turns), "paired-any"
        if self.phases:
            return merge_native(list(self.phases.values())), "before-after"
        return None, None

    def any(self):
        return self.for_tag(None)[0]


def drift(models):
    """The largest ratio between onnxruntime's medians of one model in
    different phases (before the VM, paired, after; models over 1 ms), a
    measure of how much the machine's speed drifted."""
    worst = None
    for r in models:
        ph = r.get("onnxruntime_phase_ms") or {}
        if len(ph) >= 2 and min(ph.values()) > 1.0:
            d = max(ph.values()) / min(ph.values())
            if worst is None or d > worst["max"]:
                worst = {"max": d, "model": r["name"]}
    return worst


def geomean(v):
    return math.exp(sum(map(math.log, v)) / len(v)) if v else None


def build_report(out):
    plan = read_env(os.path.join(out, "plan.env"))
    ort = read_ort(out)
    native = Native(out)
    test = plan.get("TEST_MODELS", "").split()
    models = [model_row(out, n, ort, "test") for n in test]
    models += [model_row(out, n, ort, "bench") for n in plan.get("BENCH_MODELS", "").split()]
    models += [model_row(out, n, ort, "export") for n in plan.get("EXPORT_MODELS", "").split()]
    # int8 models against their float originals on the device (the
    # quantised model's device time / the float one's).
    by_name = {r["name"]: r for r in models}
    for r in models:
        base = r["name"].rsplit("-int8", 1)[0] if r["name"].endswith(("-int8", "-int8r")) else None
        f = by_name.get(base) if base else None
        if f and r.get("device_ms") and f.get("device_ms"):
            r["device_vs_float"] = r["device_ms"] / f["device_ms"]
    ratios = [r["ratio"] for r in models if r["ratio"]]
    ratios_min = [r["ratio_min"] for r in models if r.get("ratio_min")]
    machine = machine_info(out, plan)
    # What the kernels' dispatch chose here (rbln-bench-host asks them).
    machine["kernels_isa"] = (native.any() or {}).get("kernels_isa")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mode": "smoke" if plan.get("SMOKE") == "1" else "full",
        "threads": machine["threads"],
        "machine": machine,
        "settings": {k.lower(): v for k, v in plan.items() if k not in ("TEST_MODELS", "BENCH_MODELS", "EXPORT_MODELS", "MODELS")},
        "vm_status": int(read_text(os.path.join(out, "vm.rc"), "-1")),
        "models": models,
        "geomean_ratio": geomean(ratios),
        "geomean_ratio_models": len(ratios),
        "geomean_ratio_min": geomean(ratios_min),
        "onnxruntime_drift": drift(models),
        "micro": micro_rows(out, plan, ort, native),
        # The micro rows' host references (gemm crate, copies) were timed
        # right before the device measurements they are compared with, the
        # guest asleep (each row's `reference_turns` says how).
        "micro_references_paired": bool(native.turns),
    }


def fmt(v, width, digits=3):
    if v is None:
        return "-".rjust(width)
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}".rjust(width)
        return f"{v:.{digits}f}".rjust(width)
    return str(v).rjust(width)


def print_table(rep):
    m = rep["machine"]
    print(f"make bench ({rep['mode']}), {rep['date']}: onnxruntime {m.get('onnxruntime_version')} on "
          f"{rep['threads']} threads vs the rbln NPU ({m.get('device_cores')} cores, kernels on "
          f"{rep['threads']} threads, {m.get('kernels_isa') or 'ISA not recorded'}); host: {m.get('cpu_model')}")
    w = max([len(r["name"]) for r in rep["models"]] + [5])
    print(f"{'model'.ljust(w)} | onnxruntime ms | device ms | run p50 ms | ratio")
    print(f"{'-' * w}-|----------------|-----------|------------|-------")
    for r in rep["models"]:
        print(f"{r['name'].ljust(w)} | {fmt(r['onnxruntime_ms'], 14)} | {fmt(r['device_ms'], 9)} | "
              f"{fmt(r['run_p50_ms'], 10)} | {fmt(r['ratio'], 5, 2)}")
    g = rep["geomean_ratio"]
    print(f"geometric mean of ratios (device / onnxruntime, {rep['geomean_ratio_models']} models): "
          f"{'-' if g is None else f'{g:.2f}'}")
    g = rep.get("geomean_ratio_min")
    if g is not None:
        print(f"  (best run against best run: {g:.2f})")
    timed = [r for r in rep["models"] if r.get("onnxruntime_ms")]
    if timed:
        paired = sum(1 for r in timed if r.get("onnxruntime_paired"))
        print(f"  onnxruntime timed right before the model's device profiles (paired): {paired} of {len(timed)} models; "
              "the others pool the runs before and after the VM")
    phases = [("host_before", "host references before the VM"), ("vm", "the VM"),
              ("host_after", "host references after it")]
    others = [(m.get(f"others_cpu_{p}"), m.get(f"steal_cpu_{p}"), what) for p, what in phases]
    if all(o is not None for o, _, _ in others):
        print("  CPU time of the machine used by other processes / stolen by the hypervisor: " +
              ", ".join(f"{o * 100:.0f}% / {st * 100:.0f}% during {what}" for o, st, what in others))
    busy = any(o > 0.1 or st > 0.1 for o, st, _ in others if o is not None)
    drift = rep.get("onnxruntime_drift")
    drifted = drift and drift["max"] > 1.2
    if busy or drifted:
        why = ["other processes used the machine"] if busy else []
        if drifted:
            why.append(f"onnxruntime's medians of one model (before the VM, paired, after) differ by up to "
                       f"{(drift['max'] - 1) * 100:.0f}% ({drift['model']})")
        print(f"  NOTE: {'; '.join(why)}: expect noise of that order")
    long = [r for r in rep["models"] if (r.get("run_device_p50_ms") or 0) >= 10 and r.get("run_overhead") is not None]
    if long:
        ok = [r for r in long if r["run_overhead"] <= 0.15]
        worst = max(long, key=lambda r: r["run_overhead"])
        print(f"  rbln-run p50 within 15% of the same inferences' device time: {len(ok)} of {len(long)} models of >= 10 ms "
              f"(most: {worst['name']} +{worst['run_overhead'] * 100:.0f}%)")
    for r in rep["models"]:
        if r.get("device_vs_float"):
            print(f"  {r['name']}: device time {r['device_vs_float']:.2f}x its float model's (target <= 0.6)")
    errs = [r for r in rep["models"] if r["error"]]
    for r in errs:
        print(f"  {r['name']}: ERROR {r['error']}")
    print()
    w = max([len(r["name"]) for r in rep["micro"]] + [5])
    print(f"{'micro'.ljust(w)} | {'value':>10} | {'reference':>10} | {'unit':<12} | ratio")
    print(f"{'-' * w}-|------------|------------|--------------|------")
    for r in rep["micro"]:
        print(f"{r['name'].ljust(w)} | {fmt(r['value'], 10)} | {fmt(r['reference'], 10)} | "
              f"{r['unit']:<12} | {fmt(r['ratio'], 5, 2)}  ({r['better']} is better)")
    print("  host references (gemm crate, copies): " + ("timed in turns with the device measurements (paired), median of the turns"
          if rep.get("micro_references_paired") else "the mean of the runs before and after the VM"))
    for r in rep["micro"]:
        if r["error"]:
            print(f"  {r['name']}: ERROR {r['error']}")


def check(path):
    """Problems of a report: missing fields, non-positive numbers, errors."""
    rep = read_json(path)
    if rep is None:
        return [f"{path}: missing or not JSON"]
    probs = []

    def pos(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0

    for k in ("date", "threads", "machine", "models", "micro"):
        if k not in rep:
            probs.append(f"no '{k}'")
    if not pos(rep.get("threads")):
        probs.append("threads is not positive")
    if not rep.get("models"):
        probs.append("no models")
    for r in rep.get("models", []):
        for k in ("onnxruntime_ms", "device_ms", "run_p50_ms", "ratio"):
            if not pos(r.get(k)):
                probs.append(f"model {r.get('name')}: {k} = {r.get(k)!r}")
        if r.get("error"):
            probs.append(f"model {r.get('name')}: error {r['error']}")
    if not pos(rep.get("geomean_ratio")):
        probs.append(f"geomean_ratio = {rep.get('geomean_ratio')!r}")
    names = " ".join(r.get("name", "") for r in rep.get("micro", []))
    for want in ("gemm", "int8 gemm", "triton attention", "conv", "add", "dma", "ioctl", "user-mode", "AsyncRuntime", "Python Runtime.run",
                 "Python async_run", "rbln-serve gRPC load"):
        if want not in names:
            probs.append(f"no micro row for {want}")
    for r in rep.get("micro", []):
        for k in ("name", "value", "reference", "unit", "ratio"):
            if k not in r:
                probs.append(f"micro {r.get('name')}: no '{k}'")
        if not pos(r.get("value")):
            probs.append(f"micro {r.get('name')}: value = {r.get('value')!r}")
        # A reference is optional (the ioctl latency row has none); when
        # there is one, the ratio must be there too.
        if r.get("reference") is not None and not (pos(r.get("reference")) and pos(r.get("ratio"))):
            probs.append(f"micro {r.get('name')}: reference {r.get('reference')!r}, ratio {r.get('ratio')!r}")
        if r.get("error"):
            probs.append(f"micro {r.get('name')}: error {r['error']}")
    if sum(1 for r in rep.get("micro", []) if r.get("reference") is None) > 1:
        probs.append("more than one micro row without a reference")
    return probs


def main(argv):
    if len(argv) == 3 and argv[1] == "--check":
        probs = check(argv[2])
        for p in probs:
            print(f"bench report: {p}", file=sys.stderr)
        if not probs:
            print(f"bench report {argv[2]}: well-formed and complete", file=sys.stderr)
        return 1 if probs else 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[1]
    rep = build_report(out)
    path = os.path.join(out, "report.json")
    with open(path + ".tmp", "w") as f:
        json.dump(rep, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print_table(rep)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
