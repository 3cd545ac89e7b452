"""rbln.quantize: post-training int8 quantisation calibrated on the NPU."""

import numpy as np
import pytest

import rbln
from conftest import ONNX, need


def cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


@pytest.mark.device
def test_quantize_compile_run(tmp_path):
    rng = np.random.default_rng(3)
    cal = {"image": rng.standard_normal((3, 2, 3, 32, 32)).astype(np.float32)}
    q = rbln.quantize(need(ONNX / "resnet.onnx"), cal, method="percentile", percentile=99.9)
    layers = [r for r in q.report if r["layer"] != "<output>"]
    assert layers and all(r["cosine"] > 0.99 for r in layers), q.report
    assert any(r["layer"] == "<output>" for r in q.report)
    m = q.compile()
    assert any(op.startswith("int8:") for op in m.inspect()["compile_report"]["device_ops"])
    q.save(tmp_path / "r.int8.onnx")
    assert (tmp_path / "r.int8.onnx").read_bytes() == q.data
    x = np.load(need(ONNX / "resnet.input.npy"))
    with m.create_runtime() as rt:
        y = rt.run(x)
    assert cosine(y, np.load(need(ONNX / "resnet.expected.npy"))) >= 0.99


@pytest.mark.device
def test_quantize_bad_calibration():
    with pytest.raises(rbln.RBLNValueError, match="no array named 'image'"):
        rbln.quantize(need(ONNX / "resnet.onnx"), {"x": np.zeros((2, 3, 32, 32), np.float32)}, report=False)
    with pytest.raises(rbln.RBLNValueError, match="has shape"):
        rbln.quantize(need(ONNX / "resnet.onnx"), {"image": np.zeros((2, 3), np.float32)}, report=False)
    with pytest.raises(rbln.RBLNValueError, match="calibration: expected"):
        rbln.quantize(need(ONNX / "resnet.onnx"), [1, 2, 3])
