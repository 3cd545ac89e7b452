"""The Python SDK's overhead, for `make bench` (run in the guest by
tests/bench/guest.sh with target/guest-python):

    python3 tests/bench/python_bench.py MODEL.rbln INPUT.npy [--iterations N]
        [--warmup K] [--requests R] [--rounds M]

prints one JSON object:

- "sync": `rbln.Runtime.run` latency (p50, mean, min in us over N runs
  after K warm-up runs), to set against `rbln-run --iterations N` on the
  same model and input (the Rust `Runtime`);
- "async": `rbln.AsyncRuntime(parallel=2).async_run` under asyncio: R
  requests through one `asyncio.gather`, M rounds after one warm-up round;
  throughput (inferences/s) of the median round, to set against
  `rbln-run --async --parallel 2`.

Times come from `rbln.perf_counter_ns` (the clock rbln-run uses: the
guest kernel's own clock moves in 4 ms steps under TCG).
"""

import argparse
import asyncio
import json
import statistics

import numpy as np

import rbln


def sync_latency(model, x, iterations, warmup):
    with rbln.Runtime(model) as rt:
        for _ in range(warmup):
            rt.run(x)
        lat = []
        for _ in range(iterations):
            t0 = rbln.perf_counter_ns()
            rt.run(x)
            lat.append((rbln.perf_counter_ns() - t0) / 1e3)
    lat.sort()
    return {"runs": len(lat), "p50_us": statistics.median(lat), "mean_us": statistics.fmean(lat), "min_us": lat[0]}


async def async_throughput(model, x, requests, rounds):
    rt = rbln.AsyncRuntime(model, parallel=2)
    try:
        walls = []
        for r in range(rounds + 1):
            t0 = rbln.perf_counter_ns()
            outs = await asyncio.gather(*(rt.async_run(x) for _ in range(requests)))
            if r:  # the first round warms up
                walls.append((rbln.perf_counter_ns() - t0) / 1e9)
            assert len(outs) == requests
    finally:
        rt.close()
    wall = statistics.median(walls)
    return {"parallel": 2, "requests": requests, "rounds": rounds, "wall_ms": wall * 1e3,
            "throughput_per_s": requests / wall, "round_throughputs": [requests / w for w in walls]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("input")
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    x = np.load(a.input)
    rbln.perf_counter_ns()  # calibrates the clock before anything is timed
    res = {"model": a.model, "sync": sync_latency(a.model, x, a.iterations, a.warmup),
           "async": asyncio.run(async_throughput(a.model, x, a.requests, a.rounds))}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
