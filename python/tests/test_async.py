"""rbln.AsyncRuntime: tasks, asyncio, ordering, cancellation, threads."""

import asyncio
import threading

import numpy as np
import pytest

import rbln
from conftest import ONNX, close, need

pytestmark = pytest.mark.device


def inputs(n):
    """n distinct inputs: request i is filled with i (y = 3x tells them apart)."""
    return [np.full((4, 16), i, np.float32) for i in range(n)]


@pytest.mark.parametrize("parallel", [1, 2])
def test_task_wait(mlp, parallel):
    path, x, want = mlp
    with rbln.AsyncRuntime(path, parallel=parallel) as rt:
        assert rt.parallel == parallel
        tasks = [rt.run(x) for _ in range(6)]
        for t in tasks:
            assert close(t.wait(), want)
            assert t.done()
            assert t.wait(timeout=0) is t.wait()  # same objects once done
        with pytest.raises(ValueError, match="timeout must be a non-negative number"):
            tasks[0].wait(timeout=-1)


def test_gather_in_order(scale_model):
    """A few hundred requests through asyncio.gather with parallel=2: each
    result is its own input's."""
    xs = inputs(300)

    async def main(rt):
        return await asyncio.gather(*(rt.async_run(x) for x in xs))

    with scale_model.create_async_runtime(parallel=2) as rt:
        ys = asyncio.run(main(rt))
    assert len(ys) == 300
    bad = [i for i, (x, y) in enumerate(zip(xs, ys)) if not np.array_equal(y, 3 * x)]
    assert bad == []


def test_event_loop_not_blocked():
    """While requests are in flight the loop keeps running other work.
    resnet18 at 224x224 takes tens of ms per inference on the device, far
    more than a submission, so the requests are still running when the
    ticker starts, whatever the guest's scheduling (the small CNN this used
    was sometimes done with all 40 before the loop's first turn)."""
    path = need(ONNX / "resnet18.rbln")
    x = np.load(need(ONNX / "resnet18.input.npy"))
    want = np.load(need(ONNX / "resnet18.expected.npy"))
    n = 8

    async def main(rt):
        ticks = []
        stop = False

        async def ticker():
            while not stop:
                ticks.append(sum(f.done() for f in futs))
                await asyncio.sleep(0)

        futs = []
        t = asyncio.create_task(ticker())
        futs += [rt.async_run(x) for _ in range(n)]
        ys = await asyncio.gather(*futs)
        stop = True
        await t
        return ys, ticks

    with rbln.AsyncRuntime(path, parallel=2) as rt:
        ys, ticks = asyncio.run(main(rt))
    assert all(close(y, want) for y in ys)
    # The ticker ran before, between and after completions: several
    # distinct partial counts, not a jump from none to all.
    partial = {k for k in ticks if 0 < k < n}
    assert len(partial) >= 2 and ticks[0] < n, (partial, ticks[:3], len(ticks))


def test_cancel_does_not_disturb_others(scale_model):
    xs = inputs(60)

    async def main(rt):
        tasks = [asyncio.create_task(rt.async_run(x)) for x in xs]
        await asyncio.sleep(0)  # every request submitted
        for i in range(0, 60, 4):
            tasks[i].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        after = await rt.async_run(xs[7])  # the runtime still works
        return results, after

    with scale_model.create_async_runtime(parallel=2) as rt:
        results, after = asyncio.run(main(rt))
    for i, r in enumerate(results):
        if i % 4 == 0:
            # cancelled before its result arrived (or it had arrived already)
            assert isinstance(r, asyncio.CancelledError) or np.array_equal(r, 3 * xs[i])
        else:
            assert np.array_equal(r, 3 * xs[i]), i
    assert np.array_equal(after, 3 * xs[7])


def test_cancel_while_waiting(scale_model):
    """Cancelling tasks mid-flight with a timeout: the rest complete."""
    xs = inputs(40)

    async def main(rt):
        short = [asyncio.wait_for(rt.async_run(x), timeout=1e-6) for x in xs[:20]]
        normal = [rt.async_run(x) for x in xs[20:]]
        r1 = await asyncio.gather(*short, return_exceptions=True)
        r2 = await asyncio.gather(*normal)
        return r1, r2

    with scale_model.create_async_runtime(parallel=2) as rt:
        r1, r2 = asyncio.run(main(rt))
    for x, r in zip(xs[:20], r1):
        assert isinstance(r, asyncio.TimeoutError) or np.array_equal(r, 3 * x)
    assert all(np.array_equal(y, 3 * x) for x, y in zip(xs[20:], r2))


def test_async_errors(bert, mlp):
    path, ids, mask, want = bert

    async def main(rt):
        ok = await rt.async_run(ids, mask)
        with pytest.raises(ValueError, match=r"input 'input_ids': expected shape \[2, 16\], got \[2, 15\]"):
            await rt.async_run(ids[:, :15], mask[:, :15])
        with pytest.raises(TypeError, match=r"expected dtype i64, got f32"):
            await rt.async_run(ids.astype(np.float32), mask)
        bad = ids.copy()
        bad[0, 0] = -101
        # A value the device would fault on is refused by the runtime; the
        # error comes back through the request.
        with pytest.raises(ValueError, match=r"input 'input_ids': element \[0, 0\] is -101"):
            await rt.async_run(bad, mask)
        again = await rt.async_run(ids, attention_mask=mask)
        return ok, again

    with rbln.AsyncRuntime(path, parallel=2) as rt:
        ok, again = asyncio.run(main(rt))
    assert close(ok, want) and close(again, want)
    with pytest.raises(ValueError, match="parallel must be 1 or 2, not 3"):
        rbln.AsyncRuntime(mlp[0], parallel=3)


def test_closed(mlp):
    path, x, want = mlp
    rt = rbln.AsyncRuntime(path, parallel=2)
    pending = [rt.run(x) for _ in range(8)]
    rt.close()  # submitted requests still complete
    assert all(close(t.wait(timeout=60), want) for t in pending)
    assert rt.closed
    with pytest.raises(rbln.RBLNClosedError):
        rt.run(x)
    rt.close()


def test_threads_share_one_async_runtime(scale_model):
    errors = []
    with scale_model.create_async_runtime(parallel=2) as rt:
        def worker(k):
            tasks = [(x, rt.run(x)) for x in (np.full((4, 16), k * 1000 + i, np.float32) for i in range(20))]
            for x, t in tasks:
                if not np.array_equal(t.wait(), 3 * x):
                    errors.append((k, float(x[0, 0])))
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_inputs_copied_at_submission(scale_model):
    """The caller may reuse its array as soon as run() returns."""
    with scale_model.create_async_runtime(parallel=2) as rt:
        buf = np.zeros((4, 16), np.float32)
        tasks = []
        for i in range(10):
            buf[:] = i
            tasks.append(rt.run(buf))
        assert [float(t.wait()[0, 0]) for t in tasks] == [3.0 * i for i in range(10)]


def test_event_loops_in_threads_share_runtimes(scale_model, mlp):
    """Each thread's loop gets the completions of its own requests, from two
    runtimes at once; a loop closed and replaced (asyncio.run twice) too."""
    path, x, want = mlp
    errors = []
    with scale_model.create_async_runtime(parallel=2) as rt, rbln.AsyncRuntime(path, parallel=2) as rt2:
        def worker(k):
            for rnd in range(2):  # a fresh event loop each round
                xs = [np.full((4, 16), k * 1000 + rnd * 100 + i, np.float32) for i in range(25)]

                async def main():
                    return await asyncio.gather(*(rt.async_run(v) for v in xs), rt2.async_run(x))

                ys = asyncio.run(main())
                errors.extend((k, i) for i, (v, y) in enumerate(zip(xs, ys)) if not np.array_equal(y, 3 * v))
                if not close(ys[-1], want):
                    errors.append((k, "mlp"))
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_async_run_is_a_coroutine(scale_model):
    """async_run's awaitable works with asyncio.create_task and wait_for."""
    async def main(rt):
        x = np.full((4, 16), 5, np.float32)
        t = asyncio.create_task(rt.async_run(x))
        y2 = await asyncio.wait_for(rt.async_run(2 * x), timeout=60)
        return await t, y2

    with scale_model.create_async_runtime(parallel=2) as rt:
        y, y2 = asyncio.run(main(rt))
    assert np.array_equal(y, np.full((4, 16), 15, np.float32)) and np.array_equal(y2, 2 * y)
