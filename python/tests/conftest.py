"""Shared fixtures of the rbln Python tests.

They run inside the guest against /dev/rbln0 (tests/vm/python.sh), on the
models `make test` builds on the host first (target/models by
rbln-example-models, target/onnx by tests/compiler/compile-models.sh).
Without a device, the tests that need one are skipped, unless
RBLN_REQUIRE_DEVICE=1 (the VM suite sets it) makes that a failure.
"""

import os
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import rbln  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = ROOT / "target" / "models"
ONNX = ROOT / "target" / "onnx"


def close(a, b, tol=1e-4):
    """rbln-example-models compare's rule: |a - b| <= tol * (1 + |b|)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= tol * (1 + np.abs(b))))


def pytest_configure(config):
    config.addinivalue_line("markers", "device: needs an rbln NPU (/dev/rbln0)")


def pytest_collection_modifyitems(config, items):
    if rbln.device_count() > 0:
        return
    if os.environ.get("RBLN_REQUIRE_DEVICE") == "1":
        raise pytest.UsageError("RBLN_REQUIRE_DEVICE=1 but there is no /dev/rbln* (insmod kmd/rbln.ko)")
    skip = pytest.mark.skip(reason="no rbln NPU (/dev/rbln*)")
    for item in items:
        if "device" in item.keywords:
            item.add_marker(skip)


def need(path: pathlib.Path) -> pathlib.Path:
    if not path.exists():
        pytest.fail(f"{path.relative_to(ROOT)} is missing: build the test models on the host first "
                    "(target/release/rbln-example-models target/models; tests/compiler/compile-models.sh)")
    return path


@pytest.fixture(scope="session")
def mlp():
    """(model path, input, expected output) of the example MLP."""
    return (need(MODELS / "mlp.rbln"), np.load(need(MODELS / "mlp.input.npy")),
            np.load(need(MODELS / "mlp.expected.npy")))


@pytest.fixture(scope="session")
def bert():
    """(model path, input_ids, attention_mask, expected) of bert-ids: int64 inputs."""
    return (need(ONNX / "bert-ids.rbln"), np.load(need(ONNX / "bert-ids.input0.npy")),
            np.load(need(ONNX / "bert-ids.input1.npy")), np.load(need(ONNX / "bert-ids.expected.npy")))


@pytest.fixture(scope="session")
def scale_model():
    """y = 3 * x on [4, 16], compiled here: each output names its input."""
    import onnx_min
    return rbln.compile_from_onnx(onnx_min.scale((4, 16), 3.0))


@pytest.fixture(scope="session")
def two_outputs_model():
    import onnx_min
    return rbln.compile_from_onnx(onnx_min.two_outputs((2, 8)))
