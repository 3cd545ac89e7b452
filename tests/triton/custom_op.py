#!/usr/bin/env python3
"""The attention kernel as a custom operator inside an ONNX model.

    custom_op.py TTIR_DIR OUTDIR

Writes, from TTIR_DIR/attention.ttir (tests/triton/kernels.py: SEQ 64,
HEAD_DIM 32, 16x16 blocks, causal):

  attention-op.onnx      x -> q, k, v projections (MatMul) -> the Triton
                         kernel (a node of the rbln.triton domain) -> an
                         output projection plus x (MatMul, Add)
  attention-ref.onnx     the same model with attention as built-in ops
                         (MatMul, Mul, Add of a causal -inf mask, Softmax,
                         MatMul): what onnxruntime runs
  attention-op.input.npy, attention-op.expected.npy
                         x and onnxruntime's output of attention-ref.onnx
  attention-bad-*.onnx   custom nodes rbln-compile must refuse

in the venv of tests/models/requirements.txt (onnx, onnxruntime).
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SEQ, D = 64, 32
SCALE = 1.0 / np.sqrt(D)


def weights(seed):
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for n in ("wq", "wk", "wv", "wo")}


def graph(attention_nodes, extra_inits, name):
    w = weights(0)
    inits = [numpy_helper.from_array(v, n) for n, v in w.items()] + extra_inits
    nodes = [helper.make_node("MatMul", ["x", n], [n[1]], name=f"proj_{n[1]}") for n in ("wq", "wk", "wv")]
    nodes += attention_nodes
    nodes += [helper.make_node("MatMul", ["o", "wo"], ["ow"], name="out_proj"), helper.make_node("Add", ["ow", "x"], ["y"], name="residual")]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [SEQ, D])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [SEQ, D])], inits)
    return g


def custom_node(text, **override):
    attrs = dict(ttir=text, grid=[SEQ // 16], float_args=[float(SCALE)])
    attrs.update(override)
    attrs = {k: v for k, v in attrs.items() if v is not None}
    return helper.make_node("attention", ["q", "k", "v"], ["o"], name="attn", domain="rbln.triton", **attrs)


def model(g, custom):
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("rbln.triton", 1)] if custom else [])
    return helper.make_model(g, opset_imports=opsets, producer_name="rbln-tests")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = sys.argv[1:]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(src, "attention.ttir")) as f:
        ttir = f.read()
    onnx.save(model(graph([custom_node(ttir)], [], "attention_op"), True), os.path.join(out, "attention-op.onnx"))

    mask = np.where(np.tril(np.ones((SEQ, SEQ), bool)), 0.0, -np.inf).astype(np.float32)
    ref_nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Add", ["ss", "mask"], ["sm"]),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
    ]
    inits = [numpy_helper.from_array(np.array(SCALE, np.float32), "scale"), numpy_helper.from_array(mask, "mask")]
    ref = model(graph(ref_nodes, inits, "attention_ref"), False)
    onnx.checker.check_model(ref)
    onnx.save(ref, os.path.join(out, "attention-ref.onnx"))
    x = np.random.default_rng(1).standard_normal((SEQ, D)).astype(np.float32)
    y = ort.InferenceSession(ref.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.save(os.path.join(out, "attention-op.input.npy"), x)
    np.save(os.path.join(out, "attention-op.expected.npy"), y)

    # Custom nodes that must be refused, each for one reason.
    bad = {
        "no-ttir": custom_node(ttir, ttir=None),
        "no-grid": custom_node(ttir, grid=None),
        "no-scale": custom_node(ttir, float_args=None),
        "bad-ttir": custom_node(ttir.replace("tt.dot", "tt.dott", 1)),
    }
    for name, node in bad.items():
        onnx.save(model(graph([node], [], "bad"), True), os.path.join(out, f"attention-bad-{name}.onnx"))
    print(f"attention-op: {SEQ}x{D}, {len(bad)} refusals", file=sys.stderr)


if __name__ == "__main__":
    main()
