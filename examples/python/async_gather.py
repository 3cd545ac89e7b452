"""100 requests through asyncio.gather on an AsyncRuntime with parallel=2.

    python3 examples/python/async_gather.py [model.rbln]

The pattern of the RBLN concurrency tutorial: two model instances on the
NPU, the input transfer of request i+1 overlapping the compute of request
i, results handed back to the event loop as they complete. Each result is
checked against a synchronous Runtime run of the same input.
"""

import asyncio
import sys
import time

import numpy as np

import rbln

N = 100


def random_input(spec, rng):
    shape, dtype = spec["shape"], spec["dtype"]
    if dtype == "float32":
        return rng.standard_normal(shape, dtype=np.float32)
    lo, hi = spec["range"] or (0, 2)
    return rng.integers(lo, hi, size=shape).astype(dtype)


async def main(model: str) -> None:
    rng = np.random.default_rng(0)
    runtime = rbln.AsyncRuntime(model, parallel=2)
    specs = runtime.inspect()["inputs"]
    requests = [[random_input(s, rng) for s in specs] for _ in range(N)]

    t0 = time.perf_counter()
    results = await asyncio.gather(*(runtime.async_run(*inputs) for inputs in requests))
    elapsed = time.perf_counter() - t0
    runtime.close()

    with rbln.Runtime(model) as reference:
        for i in (0, N // 2, N - 1):
            want = reference.run(*requests[i])
            assert np.array_equal(np.asarray(results[i]), np.asarray(want)), f"request {i} differs"
    print(f"{N} requests, parallel=2: {elapsed * 1e3:.1f} ms, {N / elapsed:.1f} inferences/s; "
          f"results in order (checked against rbln.Runtime)")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "target/models/mlp.rbln"))
