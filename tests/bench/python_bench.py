"""The Python SDK's overhead, for `make bench` (run in the guest by
tests/bench/guest.sh with target/guest-python):

    python3 tests/bench/python_bench.py MODEL.rbln INPUT.npy [--iterations N]
        [--warmup K] [--requests R] [--rounds M]

prints one JSON object:

- "sync": `rbln.Runtime.run` against the Rust `Runtime` looped in Rust
  (`Runtime._time_rust`) on the same runtime and input, in M blocks of N
  runs each, alternating (after K warm-up runs): p50 of each over all
  blocks (us), the difference, and the cost of a no-op call into the
  extension (`rbln.perf_counter_ns`) as a yardstick of the machine's
  Python speed; and, in each block, the Rust `Runtime` called N/2 times
  for two runs: p50 of the first and of the second runs over all blocks;
- "async": `rbln.AsyncRuntime(parallel=2).async_run` under asyncio (R
  requests through one `asyncio.gather` per round) against a Rust
  `AsyncRuntime` driven as `rbln-run --async --parallel 2` drives it
  (`_rbln._time_rust_async`), M rounds of each, alternating, after one
  warm-up round: the median round's throughput (inferences/s) of each.

Alternating in one process cancels most of the drift of a shared machine
(the guest's CPUs and the device model's compute share the host's cores).
Times come from `rbln.perf_counter_ns` (the clock rbln-run uses: the guest
kernel's own clock moves in 4 ms steps under TCG).
"""

import argparse
import asyncio
import json
import statistics

import numpy as np

import rbln
from rbln import _rbln

ns = rbln.perf_counter_ns


def noop_call_us(n=2000):
    t0 = ns()
    for _ in range(n):
        ns()
    return (ns() - t0) / n / 1e3


def sync_overhead(model, x, iterations, warmup, blocks):
    py, rust, firsts, seconds = [], [], [], []
    with rbln.Runtime(model) as rt:
        for _ in range(warmup):
            rt.run(x)
        for _ in range(blocks):
            for _ in range(iterations):
                t0 = ns()
                rt.run(x)
                py.append((ns() - t0) / 1e3)
            rust += [t / 1e3 for t in rt._time_rust(x, n=iterations)]
            f, s = rust_pairs(rt, x, max(1, iterations // 2))
            firsts += f
            seconds += s
    first, warm = statistics.median(firsts), statistics.median(seconds)
    p, r = statistics.median(py), statistics.median(rust)
    return {"runs": len(py), "blocks": blocks, "p50_us": p, "rust_p50_us": r, "overhead_us": p - r,
            "mean_us": statistics.fmean(py), "rust_mean_us": statistics.fmean(rust),
            "noop_call_us": noop_call_us(),
            "rust_first_p50_us": first, "rust_next_p50_us": warm, "overhead_vs_first_us": p - first}


def rust_pairs(rt, x, n):
    """The Rust `Runtime` called from Python for 2 runs at a time, n times:
    the first runs' and the second runs' latencies (us). Under TCG a run
    costs more right after the guest ran other code (here the few
    microseconds of Python between the calls) than straight after another
    run, whoever the caller: a first run is what every Python `run` pays
    before any cost of its own (README, "Benchmarks")."""
    first, second = [], []
    for _ in range(n):
        a, b = rt._time_rust(x, n=2)
        first.append(a / 1e3)
        second.append(b / 1e3)
    return first, second


async def gather_round(rt, x, requests):
    t0 = ns()
    outs = await asyncio.gather(*(rt.async_run(x) for _ in range(requests)))
    wall = (ns() - t0) / 1e9
    assert len(outs) == requests
    return requests / wall


def async_throughput(model, x, requests, rounds):
    py, rust = [], []
    rt = rbln.AsyncRuntime(model, parallel=2)
    try:
        asyncio.run(gather_round(rt, x, requests))  # warm-up
        for _ in range(rounds):
            py.append(asyncio.run(gather_round(rt, x, requests)))
            wall = _rbln._time_rust_async(model, x, n=requests, warmup=max(2, requests // 10), parallel=2)
            rust.append(requests / (wall / 1e9))
    finally:
        rt.close()
    return {"parallel": 2, "requests": requests, "rounds": rounds,
            "throughput_per_s": statistics.median(py), "rust_throughput_per_s": statistics.median(rust),
            "round_throughputs": py, "rust_round_throughputs": rust}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("input")
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    x = np.load(a.input)
    ns()  # calibrates the clock before anything is timed
    res = {"model": a.model, "sync": sync_overhead(a.model, x, a.iterations, a.warmup, a.rounds),
           "async": async_throughput(a.model, x, a.requests, a.rounds)}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
