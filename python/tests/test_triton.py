"""rbln.triton: Triton kernels compiled by rbln and run on the NPU's tile
engine, against numpy (scaled error <= 1e-5).

The kernels are tests/triton/kernels.py's (vector add with a mask, row
softmax, tiled matmul, layer norm, the naive flash-attention prefill);
the constexprs are the ones that file lists, the shapes are chosen here
so that masks cut partial blocks.
"""

import pathlib
import sys

import numpy as np
import pytest

import rbln

triton = pytest.importorskip("triton")
import rbln.triton  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "triton"))
import kernels as K  # noqa: E402

P, I32, F32 = "*fp32", "i32", "fp32"


def scaled_error(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-12))


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.device
def test_vector_add_with_a_mask():
    n = 1000
    kernel = rbln.triton.compile(K.add, signature={"x_ptr": P, "y_ptr": P, "out_ptr": P, "n": I32}, constexprs={"BLOCK": 256},
                                 grid=lambda meta: (triton.cdiv(n, meta["BLOCK"]),))
    x, y = rand(n, seed=1), rand(n, seed=2)
    out = np.full(n + 24, 7.0, np.float32)
    # The array is longer than n: the mask keeps the kernel inside n.
    kernel(x, y, out, n)
    assert scaled_error(out[:n], x + y) <= 1e-5
    assert np.all(out[n:] == 7.0)
    assert "tt.load" in kernel.ttir


@pytest.mark.device
def test_row_softmax():
    rows, cols = 7, 100
    kernel = rbln.triton.compile(K.softmax, signature={"x_ptr": P, "out_ptr": P, "n_cols": I32, "stride": I32}, constexprs={"BLOCK": 128},
                                 grid=(rows,))
    x = rand(rows, cols, seed=3) * 4
    out = np.zeros_like(x)
    kernel(x, out, cols, cols)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    assert scaled_error(out, e / e.sum(axis=1, keepdims=True)) <= 1e-5


@pytest.mark.device
def test_tiled_matmul():
    m, k, n = 50, 64, 40
    kernel = rbln.triton.compile(K.matmul, signature={"a_ptr": P, "b_ptr": P, "c_ptr": P, "M": I32, "N": I32},
                                 constexprs={"K": k, "BM": 32, "BN": 32, "BK": 32})
    a, b = rand(m, k, seed=4), rand(k, n, seed=5)
    c = np.zeros((m, n), np.float32)
    kernel[(triton.cdiv(m, 32), triton.cdiv(n, 32))](a, b, c, m, n)
    assert scaled_error(c, a.astype(np.float64) @ b) <= 1e-5


@pytest.mark.device
def test_layer_norm():
    rows, cols, eps = 5, 100, 1e-5
    kernel = rbln.triton.compile(K.layernorm, signature={"x_ptr": P, "w_ptr": P, "b_ptr": P, "out_ptr": P, "n_cols": I32, "eps": F32},
                                 constexprs={"BLOCK": 128}, grid=(rows,))
    x, w, b = rand(rows, cols, seed=6), rand(cols, seed=7), rand(cols, seed=8)
    out = np.zeros_like(x)
    kernel(x, w, b, out, cols, eps)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + eps) * w + b
    assert scaled_error(out, want) <= 1e-5


def attention_reference(q, k, v, scale):
    s = (q.astype(np.float64) @ k.T) * scale
    s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


ATTENTION_SIG = {"q_ptr": P, "k_ptr": P, "v_ptr": P, "o_ptr": P, "scale": F32}


@pytest.mark.device
def test_flash_attention_prefill():
    seq, d = 64, 32
    kernel = rbln.triton.compile(K.attention, signature=ATTENTION_SIG,
                                 constexprs={"SEQ": seq, "HEAD_DIM": d, "BLOCK_M": 16, "BLOCK_N": 16}, grid=(seq // 16,))
    q, k, v = rand(seq, d, seed=9), rand(seq, d, seed=10), rand(seq, d, seed=11)
    o = np.zeros_like(q)
    kernel(q, k, v, o, 1 / np.sqrt(d))
    assert scaled_error(o, attention_reference(q, k, v, 1 / np.sqrt(d))) <= 1e-5
    # A second launch of the same shapes reuses the compiled model.
    o2 = np.zeros_like(q)
    kernel(q * 2, k, v, o2, 1 / np.sqrt(d))
    assert scaled_error(o2, attention_reference(q * 2, k, v, 1 / np.sqrt(d))) <= 1e-5
    assert len(kernel._launches) == 1


@triton.jit
def _reach_past(x_ptr, out_ptr, BLOCK: triton.language.constexpr):
    offs = triton.language.arange(0, BLOCK)
    # No mask: the last program reads and writes past the arrays.
    v = triton.language.load(x_ptr + triton.language.program_id(0) * BLOCK + offs)
    triton.language.store(out_ptr + triton.language.program_id(0) * BLOCK + offs, v + 1)


@pytest.mark.device
def test_a_kernel_reaching_outside_its_buffers_faults_and_writes_nothing():
    kernel = rbln.triton.compile(_reach_past, signature={"x_ptr": P, "out_ptr": P}, constexprs={"BLOCK": 64}, grid=(2,))
    x = np.arange(100, dtype=np.float32)
    out = np.full(100, -1.0, np.float32)
    with pytest.raises(rbln.RBLNDeviceError) as e:
        kernel(x, out)
    msg = str(e.value)
    assert "_reach_past" in msg and "outside its buffer" in msg, msg
    # The launch wrote nothing, not even the first program's in-bounds block.
    assert np.all(out == -1.0)
    # The device and the runtime go on: an in-bounds launch works.
    x2 = np.arange(128, dtype=np.float32)
    out2 = np.zeros(128, np.float32)
    kernel(x2, out2)
    assert np.array_equal(out2, x2 + 1)


def test_refusals_name_the_problem():
    @triton.jit
    def loop(x_ptr, n, BLOCK: triton.language.constexpr):
        acc = triton.language.zeros((BLOCK,), triton.language.float32)
        for i in triton.language.range(0, n):
            acc += triton.language.load(x_ptr + i * BLOCK + triton.language.arange(0, BLOCK))
        triton.language.store(x_ptr + triton.language.arange(0, BLOCK), acc)

    kernel = rbln.triton.compile(loop, signature={"x_ptr": P, "n": I32}, constexprs={"BLOCK": 16})
    # The error names the TTIR line and the kernel's own (the `for`).
    with pytest.raises(rbln.RBLNCompileError, match=r"TTIR line \d+ \(test_triton.py:\d+\): scf.for"):
        kernel.compiled(np.zeros(64, np.float32), 4)
    add = rbln.triton.compile(K.add, signature={"x_ptr": P, "y_ptr": P, "out_ptr": P, "n": I32}, constexprs={"BLOCK": 256})
    with pytest.raises(rbln.RBLNTypeError, match="argument y_ptr .* takes float32 elements, got float64"):
        add(np.zeros(4, np.float32), np.zeros(4), np.zeros(4, np.float32), 4)
    with pytest.raises(rbln.RBLNTypeError, match="takes 4 arguments"):
        add(np.zeros(4, np.float32))
    with pytest.raises(rbln.RBLNTypeError, match="type 'fp16'"):
        rbln.triton.compile(K.add, signature={"x_ptr": "fp16", "y_ptr": P, "out_ptr": P, "n": I32}, constexprs={"BLOCK": 256})


def test_onnx_attributes_bind_scalars_and_grid():
    kernel = rbln.triton.compile(K.layernorm, signature={"x_ptr": P, "w_ptr": P, "b_ptr": P, "out_ptr": P, "n_cols": I32, "eps": F32},
                                 constexprs={"BLOCK": 128}, grid=(5,))
    attrs = kernel.onnx_attributes(100, 1e-5)
    assert attrs["grid"] == [5] and attrs["int_args"] == [100] and attrs["float_args"] == [pytest.approx(1e-5)]
    assert attrs["kernel"] == "layernorm" and attrs["ttir"] == kernel.ttir
    assert kernel.onnx_attributes(100, 1e-5, grid=(2, 3))["grid"] == [2, 3]
    with pytest.raises(rbln.RBLNTypeError, match="takes 2 scalar arguments"):
        kernel.onnx_attributes(100)
    with pytest.raises(rbln.RBLNTypeError, match="n_cols takes an integer"):
        kernel.onnx_attributes(1.5, 1e-5)
