"""rbln.Runtime on the NPU: results, API, errors, threads."""

import json
import threading

import numpy as np
import pytest

import rbln
from conftest import close

pytestmark = pytest.mark.device


def test_run_matches_reference(mlp):
    path, x, want = mlp
    with rbln.Runtime(str(path)) as rt:
        y = rt.run(x)
        assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (16, 10)
        assert close(y, want)


def test_call_named_and_pathlike(mlp):
    path, x, want = mlp
    with rbln.Runtime(path) as rt:  # os.PathLike
        assert close(rt(x), want)
        assert close(rt.run(x=x), want)
        assert close(rt(x=x), want)


def test_out_preallocated(mlp):
    path, x, want = mlp
    with rbln.Runtime(path) as rt:
        out = np.empty((16, 10), np.float32)
        r = rt.run(x, out=out)
        assert r is out and close(out, want)
        with pytest.raises(ValueError, match=r"out for output 'y': expected a writable C-contiguous float32 array of shape \[16, 10\]"):
            rt.run(x, out=np.empty((16, 9), np.float32))
        with pytest.raises(ValueError):
            rt.run(x, out=np.empty((16, 10), np.float64))


def test_inputs_any_layout(mlp):
    path, x, want = mlp
    with rbln.Runtime(path) as rt:
        assert close(rt(np.asfortranarray(x)), want)       # not C-contiguous
        assert close(rt(x.tolist()), want)                  # nested lists take the model's dtype
        big = np.zeros((16, 512), np.float32)
        big[:, ::2] = x
        assert close(rt(big[:, ::2]), want)                 # strided view
        raw = bytearray(x.nbytes + 1)
        odd = np.frombuffer(raw, np.float32, count=x.size, offset=1).reshape(x.shape)
        odd[...] = x
        assert not odd.flags.aligned and odd.flags.c_contiguous
        assert close(rt(odd), want)                         # unaligned
        with pytest.raises(TypeError, match=r"input 'x': expected dtype f32, got >f4"):
            rt(x.astype(">f4"))                             # not native byte order: named, not misread


@pytest.mark.parametrize("shape", [(4, 16), (256, 128)])  # 256 B and 128 KiB outputs
def test_outputs_are_fresh_arrays(shape):
    """Small outputs are copied into arrays NumPy allocates, large ones
    wrap the runtime's vector: either way a fresh, writable, C-contiguous
    array that later runs do not touch."""
    import onnx_min
    model = rbln.compile_from_onnx(onnx_min.scale(shape, 3.0))
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    with model.create_runtime() as rt:
        a = rt.run(x)
        assert a.shape == shape and a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
        np.testing.assert_array_equal(a, 3 * x)
        a[...] = -1
        b = rt.run(x + 1)
        np.testing.assert_array_equal(b, 3 * (x + 1))
        assert (a == -1).all() and not np.shares_memory(a, b)


def test_inspect(mlp):
    path, _, _ = mlp
    with rbln.Runtime(path) as rt:
        info = rt.inspect()
        assert info["name"] == "mlp"
        assert info["inputs"] == [{"name": "x", "dtype": "float32", "shape": [16, 256], "range": None}]
        assert info["outputs"][0]["name"] == "y" and info["outputs"][0]["shape"] == [16, 10]
        assert info["memory"]["staging_bytes"] > 0 and info["memory"]["weight_bytes"] > 0
        assert sum(info["ops"].values()) >= 2
        assert "Runtime 'mlp'" in repr(rt)


def test_close_and_context_manager(mlp):
    path, x, want = mlp
    rt = rbln.Runtime(path)
    with rt as r:
        assert r is rt and not rt.closed
    assert rt.closed
    with pytest.raises(rbln.RBLNClosedError, match="the runtime is closed"):
        rt.run(x)
    assert isinstance(rbln.RBLNClosedError("x"), rbln.RBLNRuntimeError)
    rt.close()  # twice is fine
    # The device resources came back: many runtimes one after another.
    for _ in range(20):
        with rbln.Runtime(path) as rt2:
            pass
    with rbln.Runtime(path) as rt3:
        assert close(rt3(x), want)


def test_several_outputs(two_outputs_model):
    x = np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)
    with two_outputs_model.create_runtime() as rt:
        outs = rt.run(x)
        assert isinstance(outs, list) and len(outs) == 2
        assert close(outs[0], np.maximum(x, 0)) and close(outs[1], 2 * x + 1)
        o = [np.empty((2, 8), np.float32), np.empty((2, 8), np.float32)]
        assert rt.run(x, out=o) is o and close(o[1], 2 * x + 1)
        # In place: an input array is also an output's destination.
        y = x.copy()
        assert rt.run(y, out=[o[0], y])[1] is y and close(y, 2 * x + 1)
        with pytest.raises(ValueError, match=r"out: the model has 2 output\(s\), got 1 array\(s\)"):
            rt.run(x, out=[o[0]])


def test_int64_inputs(bert):
    path, ids, mask, want = bert
    assert ids.dtype == np.int64
    with rbln.Runtime(path) as rt:
        assert close(rt(ids, mask), want)
        assert close(rt(input_ids=ids, attention_mask=mask), want)
        assert close(rt(ids, attention_mask=mask), want)
        bad = ids.copy()
        bad[1, 3] = 100
        with pytest.raises(ValueError, match=r"input 'input_ids': element \[1, 3\] is 100, outside the range -100..100"):
            rt(bad, mask)
        with pytest.raises(TypeError, match=r"input 'input_ids': expected dtype i64, got f32"):
            rt(ids.astype(np.float32), mask)
        with pytest.raises(TypeError, match=r"input 'input_ids': expected dtype i64, got i32"):
            rt(ids.astype(np.int32), mask)
        assert close(rt(ids, mask), want)  # the device is fine after refusals


def test_wrong_inputs(mlp):
    path, x, _ = mlp
    with rbln.Runtime(path) as rt:
        with pytest.raises(rbln.RBLNInputError, match=r"input 'x': expected shape \[16, 256\], got \[16, 255\]") as e:
            rt(x[:, :255])
        assert isinstance(e.value, ValueError) and isinstance(e.value, rbln.RBLNError)
        with pytest.raises(TypeError, match=r"input 'x': expected dtype f32, got float64") as e:
            rt(x.astype(np.float64))
        assert isinstance(e.value, rbln.RBLNInputTypeError)
        with pytest.raises(TypeError, match=r"input 'x': expected dtype f32, got i64"):
            rt(x.astype(np.int64))
        with pytest.raises(ValueError, match=r"the model has 1 input\(s\) \(x\), got 2"):
            rt(x, x)
        with pytest.raises(ValueError, match=r"the model has 1 input\(s\) \(x\), got 0"):
            rt()
        with pytest.raises(ValueError, match=r"the model has no input 'z' \(its inputs: x\)"):
            rt(z=x)
        with pytest.raises(TypeError, match="input 'x' given twice"):
            rt(x, x=x)


def test_bad_files(mlp, tmp_path):
    path, _, _ = mlp
    with pytest.raises(FileNotFoundError) as e:
        rbln.Runtime(tmp_path / "missing.rbln")
    assert isinstance(e.value, rbln.RBLNModelError)
    data = path.read_bytes()
    (tmp_path / "trunc.rbln").write_bytes(data[:5000])
    with pytest.raises(rbln.RBLNModelError, match="trunc.rbln: "):
        rbln.Runtime(tmp_path / "trunc.rbln")
    flipped = bytearray(data)
    flipped[3000] ^= 0xFF
    (tmp_path / "flip.rbln").write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="(?i)checksum|crc"):
        rbln.Runtime(tmp_path / "flip.rbln")
    (tmp_path / "junk.rbln").write_bytes(b"not a model at all")
    with pytest.raises(rbln.RBLNModelError):
        rbln.CompiledModel(tmp_path / "junk.rbln")
    with pytest.raises(TypeError, match="model must be a .rbln path or an rbln.CompiledModel, not int"):
        rbln.Runtime(42)


def test_no_such_device(mlp):
    path, _, _ = mlp
    with pytest.raises(rbln.RBLNDeviceError, match=r"no /dev/rbln7: is rbln.ko loaded\?"):
        rbln.Runtime(path, device=7)
    with pytest.raises(ValueError, match='tensor_type must be "np" or "pt"'):
        rbln.Runtime(path, tensor_type="tf")


def test_devices():
    assert rbln.device_count() >= 1
    d = rbln.devices()[0]
    assert d["index"] == 0 and d["path"] == "/dev/rbln0"
    assert d["memory"] > 0 and d["num_queues"] >= 16 and d["hw_version"].count(".") == 1
    assert d["health"] == "ok", d


def test_profiler(mlp):
    path, x, want = mlp
    with rbln.Runtime(path, activate_profiler=True) as rt:
        assert rt.profile_trace() is None
        assert close(rt(x), want)
        trace = json.loads(rt.profile_trace())
        assert trace["traceEvents"] and all(e["ph"] == "X" for e in trace["traceEvents"])


def test_last_device_time(mlp):
    path, x, want = mlp
    rt = rbln.Runtime(path)
    assert rt.last_device_time_ns() is None
    t0 = rbln.perf_counter_ns()
    assert close(rt(x), want)
    wall = rbln.perf_counter_ns() - t0
    d = rt.last_device_time_ns()
    assert d is not None and 0 < d <= wall, (d, wall)
    rt.close()
    with pytest.raises(rbln.RBLNClosedError):
        rt.last_device_time_ns()


def test_threads_share_one_runtime(scale_model):
    """Runs from several threads on one Runtime are serialized; each gets
    the result of its own input."""
    errors = []
    with scale_model.create_runtime() as rt:
        def worker(k):
            try:
                for i in range(15):
                    x = np.full((4, 16), k * 100 + i, np.float32)
                    y = rt(x)
                    if not np.array_equal(y, 3 * x):
                        errors.append((k, i, float(y[0, 0])))
            except Exception as e:  # pragma: no cover - reported below
                errors.append((k, repr(e)))
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_tensor_type_pt(mlp):
    """tensor_type="pt": torch tensors in and out where torch imports; where
    it does not (the guest's Python has numpy only), a clear ImportError at
    construction, before any device work."""
    path, x, want = mlp
    try:
        import torch
    except ImportError:
        for make in (rbln.Runtime, rbln.AsyncRuntime):
            with pytest.raises(ImportError, match=r'tensor_type="pt" needs PyTorch, which does not import here'):
                make(path, tensor_type="pt")
        return
    with rbln.Runtime(path, tensor_type="pt") as rt:
        y = rt.run(torch.from_numpy(x))
        assert isinstance(y, torch.Tensor) and close(y.numpy(), want)
