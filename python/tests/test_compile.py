"""The compiler from Python (pure Rust: works on the host and in the guest)."""

import numpy as np
import pytest

import onnx_min
import rbln
from conftest import ONNX, close, need


def test_compile_onnx_file_save_load(tmp_path):
    m = rbln.compile_from_onnx(need(ONNX / "ops.onnx"))
    assert m.name == "ops"
    info = m.inspect()
    assert info["inputs"][0]["name"] == "x" and info["compile_report"]["format"] == "onnx"
    m.save(tmp_path / "ops.rbln")
    again = rbln.CompiledModel(tmp_path / "ops.rbln")
    assert again.inspect()["outputs"] == info["outputs"]
    assert again.to_bytes() == (tmp_path / "ops.rbln").read_bytes()


def test_compile_bytes_and_input_info():
    with pytest.raises(rbln.RBLNCompileError, match="dynamic dimension 'batch'"):
        rbln.compile_from_onnx(onnx_min.dynamic())
    m = rbln.compile_from_onnx(onnx_min.dynamic(), input_info=[("x", [3, 8], "float32")])
    assert m.inspect()["inputs"][0]["shape"] == [3, 8]
    m = rbln.compile_from_onnx(onnx_min.dynamic(), input_info={"x": (5, 8)})
    assert m.inspect()["inputs"][0]["shape"] == [5, 8]
    with pytest.raises(ValueError, match="dimensions must be positive"):
        rbln.compile_from_onnx(onnx_min.dynamic(), input_info=[("x", [0, 8])])


def test_compile_errors(tmp_path):
    with pytest.raises(rbln.RBLNCompileError, match="op type 'RandomUniformLike' is not supported"):
        rbln.compile_from_onnx(need(ONNX / "unsupported-op.onnx"))
    with pytest.raises(rbln.RBLNCompileError, match="not an ONNX model"):
        rbln.compile_from_onnx(b"\x07garbage")
    with pytest.raises(rbln.RBLNCompileError, match="missing.onnx"):
        rbln.compile_from_onnx(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="expected a file path, bytes or an onnx.ModelProto"):
        rbln.compile_from_onnx(3.5)


def test_compile_from_torch_without_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="rbln.compile_from_torch needs PyTorch"):
            rbln.compile_from_torch(object(), [("x", [1, 4], "float32")])
    else:
        pytest.skip("torch is installed: compile_from_torch is tested with it")


@pytest.mark.device
def test_compiled_model_runs(tmp_path):
    m = rbln.compile_from_onnx(need(ONNX / "ops.onnx"))
    x, want = np.load(need(ONNX / "ops.input.npy")), np.load(need(ONNX / "ops.expected.npy"))
    with m.create_runtime() as rt:
        assert close(rt(x), want)
    with m.create_async_runtime(parallel=2) as rt:
        assert isinstance(rt, rbln.AsyncRuntime)
        assert all(close(t.wait(), want) for t in [rt.run(x) for _ in range(4)])
    m.save(tmp_path / "ops.rbln")
    with rbln.Runtime(tmp_path / "ops.rbln") as rt:
        assert close(rt(x), want)
