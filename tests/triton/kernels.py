#!/usr/bin/env python3
"""Triton kernels of the custom-kernel tests, printed as TTIR.

    kernels.py OUTDIR [NAME...]

Writes OUTDIR/NAME.ttir for each kernel: the Triton IR that triton's
frontend and its TTIR pass list (inliner, canonicalizer, combine, CSE,
loop unrolling, ...) produce, without a GPU (../shared/notes/triton.md).
These are the inputs of rbln's TTIR front end.

Kernels (each with the constexprs it is compiled with):
  add        masked vector add, BLOCK 256
  softmax    row softmax (keep_dims max and sum), BLOCK 128
  matmul     tiled matmul, tl.static_range over K blocks, 32x32x32 tiles
  layernorm  row layer norm with weight and bias, BLOCK 128
  attention  naive flash-attention prefill: causal mask, online softmax
             over key blocks (tl.static_range), BLOCK_M 16, BLOCK_N 16,
             HEAD_DIM 32, SEQ 64
  attention_bench  the same at the bench's shape: SEQ 1024, HEAD_DIM 64,
             64x64 blocks
  range_loop a loop over tl.range (what rbln refuses: scf.for)
"""
import importlib.util
import os
import pathlib
import sys

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# The TTIR printer of the rbln package, loaded by path: this venv has
# triton but not rbln's extension module.
_spec = importlib.util.spec_from_file_location(
    "rbln_ttir", pathlib.Path(__file__).resolve().parents[2] / "python" / "rbln" / "_ttir.py")
_ttir = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ttir)
ttir = _ttir.ttir


@triton.jit
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def softmax(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    m = tl.max(x, axis=0, keep_dims=True)
    e = tl.exp(x - m)
    s = tl.sum(e, axis=0, keep_dims=True)
    tl.store(out_ptr + row * stride + cols, e / s, mask=mask)


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in tl.static_range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        b = tl.load(b_ptr + (k0 + rk)[:, None] * N + rn[None, :], mask=rn[None, :] < N, other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def layernorm(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0, keep_dims=True) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0, keep_dims=True) / n_cols
    y = d / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * n_cols + cols, y * w + b, mask=mask)


@triton.jit
def attention(q_ptr, k_ptr, v_ptr, o_ptr, scale, SEQ: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pm = tl.program_id(0)
    rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + rm[:, None] * HEAD_DIM + rd[None, :])
    m_i = tl.full((BLOCK_M, 1), -float("inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M, 1), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for n0 in tl.static_range(0, SEQ, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + rn[None, :] * HEAD_DIM + rd[:, None])
        s = tl.dot(q, k, input_precision="ieee") * scale
        s = tl.where(rm[:, None] >= rn[None, :], s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1, keep_dims=True))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1, keep_dims=True)
        v = tl.load(v_ptr + rn[:, None] * HEAD_DIM + rd[None, :])
        acc = acc * alpha + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    tl.store(o_ptr + rm[:, None] * HEAD_DIM + rd[None, :], acc / l_i)


@triton.jit
def range_loop(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for i in tl.range(0, n):
        acc += tl.load(x_ptr + i * BLOCK + offs)
    tl.store(out_ptr + offs, acc)


PTR, I32, F32, C = "*fp32", "i32", "fp32", "constexpr"
KERNELS = {
    "add": (add, {"x_ptr": PTR, "y_ptr": PTR, "out_ptr": PTR, "n": I32, "BLOCK": C}, {"BLOCK": 256}),
    "softmax": (softmax, {"x_ptr": PTR, "out_ptr": PTR, "n_cols": I32, "stride": I32, "BLOCK": C}, {"BLOCK": 128}),
    "matmul": (matmul, {"a_ptr": PTR, "b_ptr": PTR, "c_ptr": PTR, "M": I32, "N": I32, "K": C, "BM": C, "BN": C, "BK": C},
               {"K": 64, "BM": 32, "BN": 32, "BK": 32}),
    "layernorm": (layernorm, {"x_ptr": PTR, "w_ptr": PTR, "b_ptr": PTR, "out_ptr": PTR, "n_cols": I32, "eps": F32, "BLOCK": C},
                  {"BLOCK": 128}),
    "attention": (attention, {"q_ptr": PTR, "k_ptr": PTR, "v_ptr": PTR, "o_ptr": PTR, "scale": F32, "SEQ": C, "HEAD_DIM": C,
                              "BLOCK_M": C, "BLOCK_N": C}, {"SEQ": 64, "HEAD_DIM": 32, "BLOCK_M": 16, "BLOCK_N": 16}),
    # The bench shape (scripts/bench.sh: against the built-in MatMul +
    # Softmax path of the same attention).
    "attention_bench": (attention, {"q_ptr": PTR, "k_ptr": PTR, "v_ptr": PTR, "o_ptr": PTR, "scale": F32, "SEQ": C, "HEAD_DIM": C,
                                    "BLOCK_M": C, "BLOCK_N": C}, {"SEQ": 1024, "HEAD_DIM": 64, "BLOCK_M": 64, "BLOCK_N": 64}),
    "range_loop": (range_loop, {"x_ptr": PTR, "out_ptr": PTR, "n": I32, "BLOCK": C}, {"BLOCK": 64}),
}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name in sys.argv[2:] or list(KERNELS):
        fn, sig, consts = KERNELS[name]
        text = ttir(fn, sig, consts)
        with open(os.path.join(out, f"{name}.ttir"), "w") as f:
            f.write(text)
        print(f"{name}: {len(text.splitlines())} lines", file=sys.stderr)


if __name__ == "__main__":
    main()
