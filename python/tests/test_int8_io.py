"""Models whose inputs and outputs are int8 / uint8 (quantised models with
an 8-bit interface, as fully quantised TFLite models have): numpy int8 and
uint8 arrays in and out, exact results, dtype errors."""

import numpy as np
import pytest

import onnx_min
import rbln

SHAPE = (4, 16)
A, B, Y = (0.1, -3), (0.05, 7), (0.08, -10)


def reference(a, b):
    """The model's QDQ definition in f32, rounding half to even."""
    f = np.float32
    af = (a.astype(np.int32) - A[1]).astype(f) * f(A[0])
    bf = (b.astype(np.int32) - B[1]).astype(f) * f(B[0])
    r = np.maximum(af + bf, f(0))
    return np.clip(np.rint(r / f(Y[0])) + Y[1], -128, 127).astype(np.int8)


@pytest.fixture(scope="module")
def model():
    return rbln.compile_from_onnx(onnx_min.int8_add(SHAPE, A, B, Y))


def test_int8_interface_is_reported(model):
    info = model.inspect()
    assert [(i["name"], i["dtype"]) for i in info["inputs"]] == [("a", "int8"), ("b", "uint8")], info["inputs"]
    assert info["outputs"][0]["dtype"] == "int8", info["outputs"]
    # The Add runs on the 8-bit values (QBINARY), not as a float island.
    ops = info["compile_report"]["device_ops"]
    assert list(ops) == ["int8:Add+Relu+QuantizeLinear"], ops


@pytest.mark.device
def test_int8_and_uint8_arrays_in_and_out(model):
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, SHAPE, dtype=np.int8)
    b = rng.integers(0, 256, SHAPE, dtype=np.uint8)
    with model.create_runtime() as rt:
        y = rt(a, b)
        assert y.dtype == np.int8 and y.shape == SHAPE
        np.testing.assert_array_equal(y, reference(a, b))
        # Extremes of both types.
        a2, b2 = np.full(SHAPE, 127, np.int8), np.full(SHAPE, 255, np.uint8)
        np.testing.assert_array_equal(rt(a=a2, b=b2), reference(a2, b2))
        out = np.empty(SHAPE, np.int8)
        rt.run(a, b, out=out)
        np.testing.assert_array_equal(out, reference(a, b))


@pytest.mark.device
def test_wrong_8bit_dtypes_are_refused(model):
    a = np.zeros(SHAPE, np.int8)
    b = np.zeros(SHAPE, np.uint8)
    with model.create_runtime() as rt:
        with pytest.raises(TypeError, match=r"input 'a': expected dtype i8, got u8"):
            rt(a.view(np.uint8), b)
        with pytest.raises(TypeError, match=r"input 'b': expected dtype u8, got f32"):
            rt(a, b.astype(np.float32))
        np.testing.assert_array_equal(rt(a, b), reference(a, b))  # fine after refusals
