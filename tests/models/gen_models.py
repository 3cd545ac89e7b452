#!/usr/bin/env python3
"""Build the ONNX test models of the compiler tests and their references.

    python gen_models.py OUTDIR

For each model NAME this writes OUTDIR/NAME.onnx and, for the models the
compiler must run, OUTDIR/NAME.input.npy (float32, seeded normal) and
OUTDIR/NAME.expected.npy (float32, onnxruntime's CPU output with every graph
optimization disabled). The failure-case models get no .npy files, except
dynamic-batch, which gets NAME.b3.input.npy / NAME.b3.expected.npy for a
batch of 3 (the compiler is run on it with --input-shape x=3x8).

Everything is deterministic: weights and inputs come from numpy RNGs seeded
per model, so two runs write identical bytes. Every model has one float32
input and one float32 output, and passes onnx.checker with full_check.
See README.md beside this file.
"""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# IR version per default-domain opset: 4 goes with opset 9, 8 with opsets
# 17-18, 9 with 19-20.
IR_VERSION = {9: 4, 17: 8, 18: 8, 20: 9, 21: 10}


class Graph:
    """A small graph builder: initializers and nodes in insertion order."""

    def __init__(self, name, seed):
        self.name = name
        self.nodes = []
        self.inits = []
        self.init_names = set()
        self.rng = np.random.default_rng([seed, 0])  # weights
        self.input_rng = np.random.default_rng([seed, 1])  # test inputs

    # -- constants ---------------------------------------------------------
    def const(self, name, value, dtype=np.float32):
        """An initializer; returns its name."""
        assert name not in self.init_names, name
        arr = np.asarray(value, dtype=dtype)
        self.inits.append(numpy_helper.from_array(arr, name))
        self.init_names.add(name)
        return name

    def i64(self, name, value):
        return self.const(name, value, np.int64)

    def normal(self, name, shape, std):
        return self.const(name, self.rng.normal(0.0, std, size=shape))

    def uniform(self, name, shape, lo, hi):
        return self.const(name, self.rng.uniform(lo, hi, size=shape))

    # -- nodes -------------------------------------------------------------
    def node(self, op, inputs, name, outputs=None, n_out=1, **attrs):
        """Add a node; returns its output name (or list of names)."""
        if outputs is None:
            outputs = [f"{name}.out"] if n_out == 1 else [f"{name}.out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=name, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def conv(self, x, name, cin, cout, k, stride=1, pad=None, group=1, bias=True,
             out=None, gain=1.0, std=None):
        """Conv with fan-in scaled weights (std sqrt(gain / fan_in)), or
        weights of standard deviation `std` when given."""
        pad = k // 2 if pad is None else pad
        fan_in = (cin // group) * k * k
        std = np.sqrt(gain / fan_in) if std is None else std
        w = self.normal(f"{name}.weight", (cout, cin // group, k, k), std)
        ins = [x, w]
        if bias:
            ins.append(self.normal(f"{name}.bias", (cout,), 0.1))
        return self.node("Conv", ins, name, outputs=[out] if out else None,
                         dilations=[1, 1], group=group, kernel_shape=[k, k],
                         pads=[pad] * 4, strides=[stride, stride])

    def bn(self, x, name, c):
        """Inference BatchNormalization with non-trivial statistics."""
        ins = [
            x,
            self.uniform(f"{name}.weight", (c,), 0.5, 1.5),
            self.normal(f"{name}.bias", (c,), 0.2),
            self.normal(f"{name}.running_mean", (c,), 0.3),
            self.uniform(f"{name}.running_var", (c,), 0.5, 2.0),
        ]
        return self.node("BatchNormalization", ins, name, epsilon=1e-5, momentum=0.9)

    def linear(self, x, name, fin, fout, std=None):
        """PyTorch's nn.Linear on a >2-D input: MatMul by W^T, then Add bias.
        Weights have std sqrt(1 / fin) unless `std` is given."""
        w = self.normal(f"{name}.weight", (fin, fout), np.sqrt(1.0 / fin) if std is None else std)
        b = self.normal(f"{name}.bias", (fout,), 0.1)
        y = self.node("MatMul", [x, w], f"{name}.MatMul")
        return self.node("Add", [y, b], f"{name}.Add")

    # -- model -------------------------------------------------------------
    def model(self, inp, in_shape, out, out_shape, opset=OPSET, inputs=None):
        """`inputs`: [(name, TensorProto type, shape)] for several or
        non-float inputs (then `inp` and `in_shape` are ignored)."""
        if inputs is None:
            inputs = [(inp, TensorProto.FLOAT, in_shape)]
        graph = helper.make_graph(
            self.nodes, self.name,
            [helper.make_tensor_value_info(n, t, sh) for n, t, sh in inputs],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
            initializer=self.inits,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", opset)],
            ir_version=IR_VERSION[opset],
            producer_name="rbln-tests-gen_models",
        )
        onnx.checker.check_model(model, full_check=True)
        return model

    def input_data(self, shape):
        return self.input_rng.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------
# Models. Each returns (model, input array or None).


def resnet():
    g = Graph("resnet", 101)
    x = "image"
    y = g.conv(x, "conv1", 3, 16, 3, bias=True)
    y = g.bn(y, "bn1", 16)
    y = g.node("Relu", [y], "relu")
    y = g.node("MaxPool", [y], "maxpool", ceil_mode=0, dilations=[1, 1],
               kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])

    def block(x, name, cin, cout, stride):
        y = g.conv(x, f"{name}.conv1", cin, cout, 3, stride=stride, bias=False)
        y = g.bn(y, f"{name}.bn1", cout)
        y = g.node("Relu", [y], f"{name}.relu")
        y = g.conv(y, f"{name}.conv2", cout, cout, 3, bias=False)
        y = g.bn(y, f"{name}.bn2", cout)
        if stride != 1 or cin != cout:
            sc = g.conv(x, f"{name}.downsample.0", cin, cout, 1, stride=stride, bias=False)
            sc = g.bn(sc, f"{name}.downsample.1", cout)
        else:
            sc = x
        y = g.node("Add", [y, sc], f"{name}.add")
        return g.node("Relu", [y], f"{name}.relu_1")

    y = block(y, "layer1.0", 16, 16, 1)
    y = block(y, "layer2.0", 16, 32, 2)
    y = g.node("GlobalAveragePool", [y], "avgpool")
    y = g.node("Flatten", [y], "flatten", axis=1)
    w = g.normal("fc.weight", (10, 32), np.sqrt(1.0 / 32))
    b = g.normal("fc.bias", (10,), 0.1)
    g.node("Gemm", [y, w, b], "fc", outputs=["logits"], alpha=1.0, beta=1.0, transB=1)
    return g.model(x, [2, 3, 32, 32], "logits", [2, 10]), g.input_data((2, 3, 32, 32))


def mobilenet():
    g = Graph("mobilenet", 102)
    x = "input"
    lo = g.const("relu6.min", 0.0)
    hi = g.const("relu6.max", 6.0)

    def cbr(x, name, cin, cout, k, stride=1, group=1, act=True):
        # He init (gain 2), so some activations reach the Clip's upper bound.
        y = g.conv(x, f"{name}.0", cin, cout, k, stride=stride, group=group, bias=False,
                   gain=2.0)
        y = g.bn(y, f"{name}.1", cout)
        if act:
            y = g.node("Clip", [y, lo, hi], f"{name}.2")
        return y

    y = cbr(x, "features.0", 3, 16, 3, stride=2)  # [1,16,16,16]
    # Inverted residual, stride 1, with the residual Add.
    r = y
    y = cbr(y, "features.1.conv.0", 16, 48, 1)
    y = cbr(y, "features.1.conv.1", 48, 48, 3, group=48)
    y = cbr(y, "features.1.conv.2", 48, 16, 1, act=False)
    y = g.node("Add", [r, y], "features.1.add")
    # Inverted residual, depthwise stride 2, no residual.
    y = cbr(y, "features.2.conv.0", 16, 48, 1)
    y = cbr(y, "features.2.conv.1", 48, 48, 3, stride=2, group=48)  # [1,48,8,8]
    y = cbr(y, "features.2.conv.2", 48, 24, 1, act=False)  # [1,24,8,8]
    # Squeeze-excite: scale * input, as torchvision's SqueezeExcitation.
    s = g.node("GlobalAveragePool", [y], "features.3.avgpool")
    s = g.conv(s, "features.3.fc1", 24, 8, 1, gain=2.0)
    s = g.node("Relu", [s], "features.3.relu")
    s = g.conv(s, "features.3.fc2", 8, 24, 1)
    s = g.node("Sigmoid", [s], "features.3.sigmoid")
    y = g.node("Mul", [s, y], "features.3.mul")  # [1,24,1,1] * [1,24,8,8]
    y = g.node("AveragePool", [y], "pool", ceil_mode=0, kernel_shape=[2, 2],
               pads=[0, 0, 0, 0], strides=[2, 2])  # [1,24,4,4]
    y = g.node("GlobalAveragePool", [y], "avgpool")
    y = g.node("Reshape", [y, g.i64("flatten.shape", [1, 24])], "flatten")
    # Larger than fan-in init so the softmax is not flat (pooled features are small).
    w = g.normal("classifier.weight", (24, 10), np.sqrt(4.0 / 24))
    b = g.normal("classifier.bias", (10,), 0.1)
    y = g.node("Gemm", [y, w, b], "classifier", alpha=1.0, beta=1.0, transB=0)
    g.node("Softmax", [y], "softmax", outputs=["probs"], axis=-1)
    return g.model(x, [1, 3, 32, 32], "probs", [1, 10]), g.input_data((1, 3, 32, 32))


def transformer():
    g = Graph("transformer", 103)
    x = "tokens"
    B, S, D, H, DH, F = 2, 16, 32, 2, 16, 64
    L = "encoder.layers.0"

    # Scalar and small int64 constants, each one initializer used by several nodes.
    idx0 = g.i64("const.idx0", 0)  # scalar
    idx1 = g.i64("const.idx1", 1)  # scalar
    ax0 = g.i64("const.axes0", [0])
    heads = g.i64("const.heads_dim", [H, DH])

    y = g.node("LayerNormalization",
               [x, g.uniform(f"{L}.norm1.weight", (D,), 0.8, 1.2),
                g.normal(f"{L}.norm1.bias", (D,), 0.1)],
               f"{L}.norm1", axis=-1, epsilon=1e-5)

    def split_heads(t, name, perm):
        """[B,S,D] -> Reshape [B,S,H,DH] (shape from a Shape chain) -> perm."""
        shp = g.node("Shape", [t], f"{name}.Shape")
        b = g.node("Gather", [shp, idx0], f"{name}.Gather", axis=0)
        s = g.node("Gather", [shp, idx1], f"{name}.Gather_1", axis=0)
        b = g.node("Unsqueeze", [b, ax0], f"{name}.Unsqueeze")
        s = g.node("Unsqueeze", [s, ax0], f"{name}.Unsqueeze_1")
        shape = g.node("Concat", [b, s, heads], f"{name}.Concat", axis=0)
        t = g.node("Reshape", [t, shape], f"{name}.Reshape")
        return g.node("Transpose", [t], f"{name}.Transpose", perm=perm)

    A = f"{L}.self_attn"
    q = split_heads(g.linear(y, f"{A}.q_proj", D, D), f"{A}.q", [0, 2, 1, 3])  # [B,H,S,DH]
    k = split_heads(g.linear(y, f"{A}.k_proj", D, D), f"{A}.k", [0, 2, 3, 1])  # [B,H,DH,S]
    v = split_heads(g.linear(y, f"{A}.v_proj", D, D), f"{A}.v", [0, 2, 1, 3])  # [B,H,S,DH]
    s = g.node("MatMul", [q, k], f"{A}.scores")  # [B,H,S,S]
    s = g.node("Div", [s, g.const(f"{A}.scale", np.sqrt(DH))], f"{A}.scale_div")
    s = g.node("Softmax", [s], f"{A}.softmax", axis=-1)
    o = g.node("MatMul", [s, v], f"{A}.context")  # [B,H,S,DH]
    o = g.node("Transpose", [o], f"{A}.context.Transpose", perm=[0, 2, 1, 3])
    o = g.node("Reshape", [o, g.i64(f"{A}.merge_shape", [B, S, -1])], f"{A}.context.Reshape")
    o = g.linear(o, f"{A}.out_proj", D, D)
    h = g.node("Add", [x, o], f"{L}.residual1")

    # norm2, decomposed as older exporters write LayerNorm.
    N = f"{L}.norm2"
    m = g.node("ReduceMean", [h], f"{N}.ReduceMean", axes=[-1], keepdims=1)
    d = g.node("Sub", [h, m], f"{N}.Sub")
    p = g.node("Pow", [d, g.const(f"{N}.two", 2.0)], f"{N}.Pow")
    var = g.node("ReduceMean", [p], f"{N}.ReduceMean_1", axes=[-1], keepdims=1)
    var = g.node("Add", [var, g.const(f"{N}.eps", 1e-5)], f"{N}.Add")
    sd = g.node("Sqrt", [var], f"{N}.Sqrt")
    n = g.node("Div", [d, sd], f"{N}.Div")
    n = g.node("Mul", [n, g.uniform(f"{N}.weight", (D,), 0.8, 1.2)], f"{N}.Mul")
    n = g.node("Add", [n, g.normal(f"{N}.bias", (D,), 0.1)], f"{N}.Add_1")

    # FFN with GELU written with Erf, in PyTorch's node order.
    f = g.linear(n, f"{L}.linear1", D, F)
    G = f"{L}.activation"
    e = g.node("Div", [f, g.const(f"{G}.sqrt2", 1.41421356)], f"{G}.Div")
    e = g.node("Erf", [e], f"{G}.Erf")
    e = g.node("Add", [e, g.const(f"{G}.one", 1.0)], f"{G}.Add")
    e = g.node("Mul", [f, e], f"{G}.Mul")
    e = g.node("Mul", [e, g.const(f"{G}.half", 0.5)], f"{G}.Mul_1")
    f = g.linear(e, f"{L}.linear2", F, D)
    h = g.node("Add", [h, f], f"{L}.residual2")  # [B,S,D]

    # Pooling head: first token and mean over the sequence, concatenated.
    first = g.node("Gather", [h, idx0], "pool.first_token", axis=1)  # [B,D]
    mean = g.node("ReduceMean", [h], "pool.mean", axes=[1], keepdims=0)  # [B,D]
    c = g.node("Concat", [first, mean], "pool.concat", axis=1)  # [B,2D]
    w = g.normal("pooler.dense.weight", (2 * D, 8), np.sqrt(1.0 / (2 * D)))
    b = g.normal("pooler.dense.bias", (8,), 0.1)
    c = g.node("Gemm", [c, w, b], "pooler.dense", alpha=1.0, beta=1.0, transB=0)
    g.node("Tanh", [c], "pooler.activation", outputs=["pooled"])
    return g.model(x, [B, S, D], "pooled", [B, 8]), g.input_data((B, S, D))


def ops():
    g = Graph("ops", 104)
    x = "x"  # [2,4,9,9]

    # Branch A: broadcasting arithmetic and pools on the full 9x9 map.
    a = g.node("Sub", [x, g.normal("a.channel_mean", (4, 1, 1), 0.3)], "a.sub")
    a = g.node("Div", [a, g.const("a.scale", 1.5)], "a.div")
    p0 = g.node("AveragePool", [a], "a.avgpool_excl", kernel_shape=[3, 3], strides=[1, 1],
                pads=[1, 1, 1, 1], count_include_pad=0)
    # Chained, not side by side, so swapping the two count_include_pad
    # values changes the result (Max of the two would be symmetric).
    p1 = g.node("AveragePool", [p0], "a.avgpool_incl", kernel_shape=[3, 3], strides=[1, 1],
                pads=[1, 1, 1, 1], count_include_pad=1)
    a = g.node("Max", [p0, p1], "a.max")
    a = g.node("MaxPool", [a], "a.maxpool_ceil", kernel_shape=[2, 2], strides=[2, 2],
               ceil_mode=1)  # [2,4,5,5]
    a = g.node("Transpose", [a], "a.nhwc", perm=[0, 2, 3, 1])  # [2,5,5,4]
    a = g.node("Flatten", [a], "a.flatten", axis=1)  # [2,100]

    # Branch B: strided Slice, unary ops, reductions.
    s = g.node("Slice", [x, g.i64("b.starts", [1]), g.i64("b.ends", [8]),
                         g.i64("b.axes", [2]), g.i64("b.steps", [2])], "b.slice")  # [2,4,4,9]
    sig = g.node("Sigmoid", [s], "b.sigmoid")
    th = g.node("Tanh", [s], "b.tanh")
    m = g.node("Min", [sig, th], "b.min")
    ex = g.node("Exp", [g.node("Mul", [s, g.const("b.exp_scale", 0.25)], "b.exp_in")], "b.exp")
    ab = g.node("Abs", [s], "b.abs")
    sq = g.node("Sqrt", [g.node("Add", [ab, g.const("b.one", 1.0)], "b.abs_plus1")], "b.sqrt")
    ng = g.node("Neg", [sq], "b.neg")
    er = g.node("Erf", [s], "b.erf")
    b = g.node("Add", [m, er], "b.add0")
    b = g.node("Mul", [b, ex], "b.mul")
    b = g.node("Div", [b, ng], "b.div")  # [2,4,4,9]
    rs = g.node("ReduceSum", [b, g.i64("b.sum_axes", [1])], "b.reducesum", keepdims=1)  # [2,1,4,9]
    rm = g.node("ReduceMax", [b], "b.reducemax", axes=[-1], keepdims=1)  # [2,4,4,1]
    b = g.node("Add", [rs, rm], "b.add2")  # broadcast -> [2,4,4,9]
    b = g.node("Unsqueeze", [b, g.i64("b.unsq_axes", [1])], "b.unsqueeze")  # [2,1,4,4,9]
    b = g.node("Squeeze", [b, g.i64("b.sq_axes", [1])], "b.squeeze")  # [2,4,4,9]
    b = g.node("Flatten", [b], "b.flatten", axis=1)  # [2,144]

    c = g.node("Concat", [a, b], "concat", axis=1)  # [2,244]
    g.node("MatMul", [c, g.normal("head.weight", (244, 6), np.sqrt(1.0 / 244))], "head",
           outputs=["y"])
    return g.model(x, [2, 4, 9, 9], "y", [2, 6]), g.input_data((2, 4, 9, 9))


def gelu20():
    g = Graph("gelu20", 105)
    x = "x"
    y = g.linear(x, "fc1", 32, 32)
    y = g.node("Gelu", [y], "gelu1", approximate="none")
    y = g.linear(y, "fc2", 32, 32)
    g.node("Gelu", [y], "gelu2", outputs=["y"], approximate="tanh")
    return g.model(x, [4, 32], "y", [4, 32], opset=20), g.input_data((4, 32))


def unsupported_op():
    g = Graph("unsupported-op", 106)
    y = g.node("Relu", ["x"], "relu0")
    g.node("RandomUniformLike", [y], "random1", outputs=["y"])
    return g.model("x", [1, 8], "y", [1, 8]), None


def dynamic_batch():
    g = Graph("dynamic-batch", 107)
    y = g.node("MatMul", ["x", g.normal("fc.weight", (8, 4), np.sqrt(2.0 / 8))], "fc")
    g.node("Relu", [y], "relu", outputs=["y"])
    return g.model("x", ["batch", 8], "y", ["batch", 4]), g.input_data((3, 8))


def ops2():
    g = Graph("ops2", 108)
    x = "x"  # [2,6,10,10]
    F = TensorProto.FLOAT
    # The batch-restoring Reshape shape [2,-1], folded from ConstantOfShape
    # (value 2, shape [1]) and a Range(-1, 0, 1) = [-1].
    batch = g.node("ConstantOfShape", [g.i64("shape.batch_len", [1])], "shape.batch",
                   value=helper.make_tensor("shape.batch.value", TensorProto.INT64, [1], [2]))
    rest = g.node("Range", [g.i64("shape.range.start", -1), g.i64("shape.range.limit", 0),
                            g.i64("shape.range.delta", 1)], "shape.range")
    to_batch = g.node("Concat", [batch, rest], "shape.concat", axis=0)  # [2,-1]

    def flat(t, name):
        return g.node("Reshape", [t, to_batch], name)

    xa, xb, xc = g.node("Split", [x, g.i64("split.sizes", [2, 2, 2])], "split",
                        n_out=3, axis=1)  # 3 x [2,2,10,10]

    # Branch A: convolutions and pools.
    # onnxruntime refuses auto_pad SAME_* with dilations, so the dilated 3x3
    # conv has the explicit pads SAME_UPPER would give (2 each side), and
    # SAME_UPPER is tested on a 2x2 kernel, where it pads 0 before, 1 after.
    w = g.normal("a.conv_dil.weight", (4, 2, 3, 3), np.sqrt(1.0 / 18))
    c1 = g.node("Conv", [xa, w, g.normal("a.conv_dil.bias", (4,), 0.1)], "a.conv_dil",
                dilations=[2, 2], kernel_shape=[3, 3], pads=[2, 2, 2, 2],
                strides=[1, 1])  # [2,4,10,10]
    w = g.normal("a.conv_same.weight", (4, 4, 2, 2), np.sqrt(1.0 / 16))
    c1 = g.node("Conv", [c1, w, g.normal("a.conv_same.bias", (4,), 0.1)], "a.conv_same",
                auto_pad="SAME_UPPER", kernel_shape=[2, 2], strides=[1, 1])  # [2,4,10,10]
    # Not depthwise: 2 groups of 3 input and 2 output channels; pads are
    # [top, left, bottom, right] = [0,1,2,1].
    w = g.normal("a.conv_group.weight", (4, 3, 3, 3), np.sqrt(1.0 / 27))
    c2 = g.node("Conv", [x, w, g.normal("a.conv_group.bias", (4,), 0.1)], "a.conv_group",
                group=2, kernel_shape=[3, 3], pads=[0, 1, 2, 1], strides=[1, 1])
    c = g.node("Add", [c1, c2], "a.add")  # [2,4,10,10]
    c = g.node("Clip", [c, g.const("a.clip.min", -0.5), ""], "a.clip")
    mp = g.node("MaxPool", [c], "a.maxpool_dil", kernel_shape=[2, 2], strides=[2, 2],
                dilations=[2, 2])  # [2,4,4,4]
    mp_rows = g.node("Flatten", [mp], "a.flatten2", axis=2)  # [8,16]
    gm = g.node("Gemm", [mp_rows, g.normal("a.gemm.b", (8, 5), np.sqrt(1.0 / 8)),
                         g.normal("a.gemm.c", (16, 5), 0.3)],
                "a.gemm", alpha=0.5, beta=2.0, transA=1)  # [16,5]
    ap = g.node("AveragePool", [c], "a.avgpool_same", auto_pad="SAME_LOWER",
                kernel_shape=[3, 3], strides=[2, 2], count_include_pad=0)  # [2,4,5,5]
    gp = g.node("GlobalMaxPool", [c], "a.globalmaxpool")  # [2,4,1,1]
    idx = g.node("Range", [g.i64("a.rows.start", 1), g.i64("a.rows.limit", 10),
                           g.i64("a.rows.delta", 4)], "a.rows")  # [1,5,9]
    rows = g.node("Gather", [c, idx], "a.gather_rows", axis=2)  # [2,4,3,10]
    rows = g.node("ReduceMean", [rows], "a.rows_mean", axes=[2, 3], keepdims=0)  # [2,4]
    a_parts = [flat(mp, "a.mp_flat"), flat(gm, "a.gemm_flat"), flat(ap, "a.ap_flat"),
               flat(gp, "a.gp_flat"), rows]  # 64, 40, 100, 4, 4

    # Branch B: Expand and reductions.
    m = g.node("ReduceMean", [xb], "b.mean", axes=[0, 2, 3], keepdims=1)  # [1,2,1,1]
    m = g.node("Expand", [m, g.i64("b.expand_shape", [2, 2, 10, 10])], "b.expand")
    b = g.node("Sub", [xb, m], "b.center")
    b = g.node("ReduceMin", [b], "b.min", axes=[1, 3], keepdims=1)  # [2,1,10,1]
    b = g.node("Squeeze", [b], "b.squeeze")  # [2,10]

    # Branch C: element-wise ops on a Gather with negative indices.
    t = g.node("Gather", [x, g.i64("c.idx", [5, -1, 0])], "c.gather", axis=1)  # [2,3,10,10]
    t = g.node("Dropout", [t, g.const("c.dropout.ratio", 0.5)], "c.dropout")
    t = g.node("Identity", [t], "c.identity")
    t = g.node("Cast", [t], "c.cast", to=F)
    ab1 = g.node("Add", [g.node("Abs", [t], "c.abs"), g.const("c.one", 1.0)], "c.abs1")
    r = g.node("Reciprocal", [ab1], "c.reciprocal")
    lg = g.node("Log", [ab1], "c.log")
    dv = g.node("Div", [g.const("c.numerator", 2.0), ab1], "c.div")  # 2 / (|t|+1)
    sb = g.node("Sub", [g.const("c.minuend", 1.0), t], "c.sub")  # 1 - t
    pw = g.node("Pow", [g.node("Mul", [t, g.const("c.half", 0.5)], "c.half_t"),
                        g.const("c.exponent", 3.0)], "c.pow")  # (t/2)^3, negative bases
    e = g.node("Mul", [r, lg], "c.mul")
    e = g.node("Add", [e, dv], "c.add0")
    e = g.node("Mul", [e, sb], "c.mul1")
    e = g.node("Add", [e, pw], "c.add1")  # [2,3,10,10]
    e = g.node("ReduceMean", [e], "c.mean", axes=[2, 3], keepdims=0)  # [2,3]
    cond = g.node("Equal", [g.i64("c.where.a", [1, 2, 3]), g.i64("c.where.b", [1, 0, 3])],
                  "c.where.equal")  # folds to [1,0,1]
    sel = g.node("Where", [cond, g.const("c.where.then", [1.5, 1.5, 1.5]),
                           g.const("c.where.else", [-2.0, -2.0, -2.0])], "c.where")
    e = g.node("Mul", [e, sel], "c.select_mul")  # [2,3] * [3]
    e = g.node("Unsqueeze", [e, g.i64("c.unsq_axes", [-1])], "c.unsqueeze")  # [2,3,1]

    # Branch D: MatMuls on pieces of the third split output.
    d = g.node("Flatten", [xc], "d.flatten", axis=1)  # [2,200]
    da = g.node("Slice", [d, g.i64("d.a.starts", [0]), g.i64("d.a.ends", [60]),
                          g.i64("d.a.axes", [1])], "d.a.slice")
    da = g.node("Reshape", [da, g.i64("d.a.shape", [2, 3, 4, 5])], "d.a.reshape")
    db = g.node("Slice", [d, g.i64("d.b.starts", [60]), g.i64("d.b.ends", [150]),
                          g.i64("d.b.axes", [1])], "d.b.slice")
    db = g.node("Reshape", [db, g.i64("d.b.shape", [2, 3, 5, 6])], "d.b.reshape")
    mm = g.node("MatMul", [da, db], "d.matmul_batched")  # [2,3,4,6]
    mm = g.node("LayerNormalization", [mm, g.uniform("d.norm.weight", (4, 6), 0.8, 1.2),
                                       g.normal("d.norm.bias", (4, 6), 0.1)],
                "d.norm", axis=-2, epsilon=1e-5)
    mw = g.node("MatMul", [da, g.normal("d.proj.weight", (5, 7), np.sqrt(1.0 / 5))],
                "d.matmul_2d")  # [2,3,4,7]
    mw = g.node("Reshape", [mw, g.i64("d.sm.shape", [2, 3, 28])], "d.sm.reshape")
    mw = g.node("Softmax", [mw], "d.softmax", axis=1)  # over the 3
    mw = g.node("Add", [mw, e], "d.add")  # [2,3,28] + [2,3,1]

    parts = a_parts + [b, flat(mm, "d.mm_flat"), flat(mw, "d.sm_flat")]  # ..., 10, 72, 84
    cat = g.node("Concat", parts, "concat", axis=1)  # [2,378]
    n = 64 + 40 + 100 + 4 + 4 + 10 + 72 + 84
    g.node("MatMul", [cat, g.normal("head.weight", (n, 8), np.sqrt(1.0 / n))], "head",
           outputs=["y"])
    return g.model(x, [2, 6, 10, 10], "y", [2, 8]), g.input_data((2, 6, 10, 10))


def legacy():
    """Opset 9 (IR 4): the attribute forms of ops whose parameters later
    became inputs, and Softmax's old coerce-to-2-D semantics."""
    g = Graph("legacy", 109)
    x = "x"  # [1,3,8,8]
    y = g.conv(x, "conv", 3, 8, 3, gain=2.0)
    y = g.node("Relu", [y], "relu")
    y = g.bn(y, "bn", 8)
    y = g.node("Clip", [y], "clip", min=-0.5, max=1.0)  # Clip-6: bounds are attributes
    y = g.node("Slice", [y], "slice", starts=[1, -6], ends=[7, 1000],
               axes=[2, 3])  # Slice-1: attributes -> [1,8,6,6]
    y = g.node("Unsqueeze", [y], "unsqueeze", axes=[2])  # [1,8,1,6,6]
    # With batch 1, a Squeeze that ignored its axes would also drop axis 0.
    y = g.node("Squeeze", [y], "squeeze", axes=[2])  # [1,8,6,6]
    # Softmax-1: the input is coerced to 2-D at axis 1, so this is one
    # softmax over all 8*6*6 = 288 values (opset 13+ would do 8 values).
    y = g.node("Softmax", [y], "softmax", axis=1)
    y = g.node("Mul", [y, g.const("softmax.rescale", 288.0)], "rescale")
    y = g.node("Flatten", [y], "flatten", axis=1)  # [1,288]
    w = g.normal("fc.weight", (10, 288), np.sqrt(1.0 / 288))
    b = g.normal("fc.bias", (10,), 0.1)  # Gemm-9: C is required
    g.node("Gemm", [y, w, b], "fc", outputs=["y"], alpha=1.0, beta=1.0, transB=1)
    return g.model(x, [1, 3, 8, 8], "y", [1, 10], opset=9), g.input_data((1, 3, 8, 8))


def resnet18():
    """torchvision's resnet18 at 224x224: same layers, shapes and names."""
    g = Graph("resnet18", 110)
    x = "image"

    def conv(x, name, cin, cout, k, stride=1):
        # torchvision: kaiming_normal_(mode="fan_out", nonlinearity="relu").
        return g.conv(x, name, cin, cout, k, stride=stride, bias=False,
                      std=np.sqrt(2.0 / (cout * k * k)))

    y = conv(x, "conv1", 3, 64, 7, stride=2)  # pad 3 -> [1,64,112,112]
    y = g.bn(y, "bn1", 64)
    y = g.node("Relu", [y], "relu")
    y = g.node("MaxPool", [y], "maxpool", ceil_mode=0, dilations=[1, 1],
               kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])  # [1,64,56,56]

    def block(x, name, cin, cout, stride):  # torchvision BasicBlock
        y = conv(x, f"{name}.conv1", cin, cout, 3, stride=stride)
        y = g.bn(y, f"{name}.bn1", cout)
        y = g.node("Relu", [y], f"{name}.relu")
        y = conv(y, f"{name}.conv2", cout, cout, 3)
        y = g.bn(y, f"{name}.bn2", cout)
        if stride != 1 or cin != cout:
            sc = conv(x, f"{name}.downsample.0", cin, cout, 1, stride=stride)
            sc = g.bn(sc, f"{name}.downsample.1", cout)
        else:
            sc = x
        y = g.node("Add", [y, sc], f"{name}.add")
        return g.node("Relu", [y], f"{name}.relu_1")

    cin = 64
    for i, (cout, stride) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)], start=1):
        y = block(y, f"layer{i}.0", cin, cout, stride)
        y = block(y, f"layer{i}.1", cout, cout, 1)
        cin = cout  # layer4 -> [1,512,7,7]
    y = g.node("GlobalAveragePool", [y], "avgpool")
    y = g.node("Flatten", [y], "flatten", axis=1)
    # torchvision's nn.Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    bound = 1.0 / np.sqrt(512)
    w = g.uniform("fc.weight", (1000, 512), -bound, bound)
    b = g.uniform("fc.bias", (1000,), -bound, bound)
    g.node("Gemm", [y, w, b], "fc", outputs=["logits"], alpha=1.0, beta=1.0, transB=1)
    return g.model(x, [1, 3, 224, 224], "logits", [1, 1000]), g.input_data((1, 3, 224, 224))


def mobilenetv2():
    """torchvision's mobilenet_v2 (width 1.0) at 224x224: same layers,
    shapes and names."""
    g = Graph("mobilenetv2", 111)
    x = "input"
    lo = g.const("relu6.min", 0.0)
    hi = g.const("relu6.max", 6.0)

    def cbr(x, name, cin, cout, k, stride=1, group=1, act=True):
        # Fan-in He init (torchvision's fan_out init would scale each
        # depthwise conv's output variance by 2/channels, which BN with
        # fixed statistics does not undo).
        y = g.conv(x, f"{name}.0", cin, cout, k, stride=stride, group=group, bias=False,
                   gain=2.0 if act else 1.0)
        y = g.bn(y, f"{name}.1", cout)
        if act:
            y = g.node("Clip", [y, lo, hi], f"{name}.2")  # ReLU6
        return y

    y = cbr(x, "features.0", 3, 32, 3, stride=2)  # [1,32,112,112]
    cin, i = 32, 1
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for j in range(n):
            stride = s if j == 0 else 1
            hidden = cin * t
            name = f"features.{i}.conv"
            r, k = y, 0
            if t != 1:  # expand 1x1
                y = cbr(y, f"{name}.0", cin, hidden, 1)
                k = 1
            y = cbr(y, f"{name}.{k}", hidden, hidden, 3, stride=stride, group=hidden)  # depthwise
            y = g.conv(y, f"{name}.{k + 1}", hidden, c, 1, bias=False)  # linear projection
            y = g.bn(y, f"{name}.{k + 2}", c)
            if stride == 1 and cin == c:
                y = g.node("Add", [r, y], f"features.{i}.add")
            cin, i = c, i + 1
    y = cbr(y, "features.18", 320, 1280, 1)  # [1,1280,7,7]
    y = g.node("GlobalAveragePool", [y], "avgpool")
    y = g.node("Flatten", [y], "flatten", axis=1)
    w = g.normal("classifier.1.weight", (1000, 1280), np.sqrt(1.0 / 1280))
    b = g.normal("classifier.1.bias", (1000,), 0.1)
    g.node("Gemm", [y, w, b], "classifier.1", outputs=["logits"], alpha=1.0, beta=1.0,
           transB=1)
    return g.model(x, [1, 3, 224, 224], "logits", [1, 1000]), g.input_data((1, 3, 224, 224))


def encoder4():
    """A BERT-mini-like stack of 4 post-norm encoder layers."""
    g = Graph("encoder4", 112)
    x = "hidden"
    S, D, H, DH, FF = 128, 256, 4, 64, 1024

    def xavier(fin, fout):
        return np.sqrt(2.0 / (fin + fout))

    heads = g.i64("const.heads_shape", [1, S, H, DH])
    merge = g.i64("const.merge_shape", [1, S, D])
    scale = g.const("const.scale", np.sqrt(DH))
    sqrt2 = g.const("const.sqrt2", 1.41421356)
    one = g.const("const.one", 1.0)
    half = g.const("const.half", 0.5)
    two = g.const("const.two", 2.0)
    eps = g.const("const.eps", 1e-5)

    def layer_norm(t, name, decomposed, out=None):
        w = g.uniform(f"{name}.weight", (D,), 0.8, 1.2)
        b = g.normal(f"{name}.bias", (D,), 0.1)
        if not decomposed:
            return g.node("LayerNormalization", [t, w, b], name,
                          outputs=[out] if out else None, axis=-1, epsilon=1e-5)
        m = g.node("ReduceMean", [t], f"{name}.ReduceMean", axes=[-1], keepdims=1)
        d = g.node("Sub", [t, m], f"{name}.Sub")
        p = g.node("Pow", [d, two], f"{name}.Pow")
        var = g.node("ReduceMean", [p], f"{name}.ReduceMean_1", axes=[-1], keepdims=1)
        var = g.node("Add", [var, eps], f"{name}.Add")
        sd = g.node("Sqrt", [var], f"{name}.Sqrt")
        n = g.node("Div", [d, sd], f"{name}.Div")
        n = g.node("Mul", [n, w], f"{name}.Mul")
        return g.node("Add", [n, b], f"{name}.Add_1")

    def heads_of(t, name, perm):  # [1,S,D] -> [1,S,H,DH] -> perm
        t = g.node("Reshape", [t, heads], f"{name}.Reshape")
        return g.node("Transpose", [t], f"{name}.Transpose", perm=perm)

    h = x
    for i in range(4):
        L = f"encoder.layers.{i}"
        A = f"{L}.self_attn"
        decomposed = i % 2 == 1
        q = heads_of(g.linear(h, f"{A}.q_proj", D, D, std=xavier(D, D)), f"{A}.q",
                     [0, 2, 1, 3])  # [1,H,S,DH]
        k = heads_of(g.linear(h, f"{A}.k_proj", D, D, std=xavier(D, D)), f"{A}.k",
                     [0, 2, 3, 1])  # [1,H,DH,S]
        v = heads_of(g.linear(h, f"{A}.v_proj", D, D, std=xavier(D, D)), f"{A}.v",
                     [0, 2, 1, 3])  # [1,H,S,DH]
        s = g.node("MatMul", [q, k], f"{A}.scores")  # [1,H,S,S]
        s = g.node("Div", [s, scale], f"{A}.scale_div")
        s = g.node("Softmax", [s], f"{A}.softmax", axis=-1)
        o = g.node("MatMul", [s, v], f"{A}.context")  # [1,H,S,DH]
        o = g.node("Transpose", [o], f"{A}.context.Transpose", perm=[0, 2, 1, 3])
        o = g.node("Reshape", [o, merge], f"{A}.context.Reshape")
        o = g.linear(o, f"{A}.out_proj", D, D, std=xavier(D, D))
        h = g.node("Add", [h, o], f"{L}.residual1")
        h = layer_norm(h, f"{L}.norm1", decomposed)
        # FFN with GELU written with Erf, in PyTorch's node order.
        f = g.linear(h, f"{L}.linear1", D, FF, std=xavier(D, FF))
        G = f"{L}.activation"
        e = g.node("Div", [f, sqrt2], f"{G}.Div")
        e = g.node("Erf", [e], f"{G}.Erf")
        e = g.node("Add", [e, one], f"{G}.Add")
        e = g.node("Mul", [f, e], f"{G}.Mul")
        e = g.node("Mul", [e, half], f"{G}.Mul_1")
        f = g.linear(e, f"{L}.linear2", FF, D, std=xavier(FF, D))
        h = g.node("Add", [h, f], f"{L}.residual2")
        h = layer_norm(h, f"{L}.norm2", decomposed)
    layer_norm(h, "encoder.norm", False, out="out")
    return g.model(x, [1, S, D], "out", [1, S, D]), g.input_data((1, S, D))


def ops3():
    """1-D Conv and pools on [N,C,L], Pad (folded into a conv and standalone),
    LeakyRelu, HardSigmoid, HardSwish, PRelu."""
    g = Graph("ops3", 113)
    x = "x"  # [2,4,16]

    def conv1d(t, name, cin, cout, k, pads, stride=1, group=1, bias=True, gain=1.0):
        w = g.normal(f"{name}.weight", (cout, cin // group, k),
                     np.sqrt(gain / ((cin // group) * k)))
        ins = [t, w] + ([g.normal(f"{name}.bias", (cout,), 0.1)] if bias else [])
        return g.node("Conv", ins, name, dilations=[1], group=group, kernel_shape=[k],
                      pads=pads, strides=[stride])

    # Branch A: Conv k3 with bias, LeakyRelu (about half its inputs are
    # negative, and AveragePool is linear, so the slope reaches y).
    a = conv1d(x, "a.conv_k3", 4, 8, 3, [1, 1])  # [2,8,16]
    a = g.node("LeakyRelu", [a], "a.leakyrelu", alpha=0.1)
    a = g.node("AveragePool", [a], "a.avgpool", kernel_shape=[2], strides=[2],
               pads=[0, 0], count_include_pad=0)  # [2,8,8]
    a = g.node("Flatten", [a], "a.flatten", axis=1)  # [2,64]

    # Branch B: MaxPool, grouped Conv (2 groups of 2 input and 2 output
    # channels), PRelu with one slope per channel ([4,1], broadcast over L;
    # about a quarter of its inputs are negative).
    b = g.node("MaxPool", [x], "b.maxpool", kernel_shape=[3], strides=[2],
               pads=[1, 1])  # [2,4,8]
    b = conv1d(b, "b.conv_group", 4, 4, 3, [1, 1], group=2)  # [2,4,8]
    b = g.node("PRelu", [b, g.uniform("b.prelu.slope", (4, 1), 0.1, 0.6)], "b.prelu")
    b = g.node("Flatten", [b], "b.flatten", axis=1)  # [2,32]

    # Branch C: a zero Pad directly before a 2-D Conv with pads 0 (a
    # compiler may fold it into the conv's pads: top 1, left 1, bottom 1,
    # right 2), then HardSigmoid. The conv weights are large (its output has
    # a std of about 2.6), so more than a quarter of the values fall outside
    # [-2.5, 2.5], where HardSigmoid clamps to 0 or 1.
    c = g.node("Reshape", [x, g.i64("c.reshape.shape", [2, 4, 4, 4])], "c.reshape")
    c = g.node("Pad", [c, g.i64("c.pad.pads", [0, 0, 1, 1, 0, 0, 1, 2]),
                       g.const("c.pad.value", 0.0)], "c.pad", mode="constant")  # [2,4,6,7]
    w = g.normal("c.conv.weight", (4, 4, 3, 3), np.sqrt(9.0 / 36))
    c = g.node("Conv", [c, w, g.normal("c.conv.bias", (4,), 0.1)], "c.conv",
               dilations=[1, 1], group=1, kernel_shape=[3, 3], pads=[0, 0, 0, 0],
               strides=[1, 1])  # [2,4,4,5]
    c = g.node("HardSigmoid", [c], "c.hardsigmoid", alpha=0.2, beta=0.5)
    c = g.node("Flatten", [c], "c.flatten", axis=1)  # [2,80]

    # Branch D: a Pad with value 0.5 on the last axis (2 before, 3 after)
    # feeding a Mul, so it cannot be folded into the conv after it; then a
    # Conv k5 stride 2 without bias, with asymmetric pads [2,1] on the odd
    # length 21: (21 + 3 - 5) // 2 + 1 = 10 outputs (symmetric pads [2,2]
    # would give 11, [1,1] or [1,2] 10 shifted by one); then HardSwish,
    # whose input has a std of about 1.6 (below -3 it gives 0, in (-3,0)
    # negative values).
    d = g.node("Pad", [x, g.i64("d.pad.pads", [0, 0, 2, 0, 0, 3]),
                       g.const("d.pad.value", 0.5)], "d.pad", mode="constant")  # [2,4,21]
    d = g.node("Mul", [d, g.uniform("d.mul.scale", (21,), 0.5, 1.5)], "d.mul")
    d = conv1d(d, "d.conv_k5_s2", 4, 4, 5, [2, 1], stride=2, bias=False,
               gain=3.0)  # [2,4,10]
    d = g.node("HardSwish", [d], "d.hardswish")
    d = g.node("Flatten", [d], "d.flatten", axis=1)  # [2,40]

    cat = g.node("Concat", [a, b, c, d], "concat", axis=1)  # [2,216]
    n = 64 + 32 + 80 + 40
    g.node("MatMul", [cat, g.normal("head.weight", (n, 8), np.sqrt(1.0 / n))], "head",
           outputs=["y"])
    return g.model(x, [2, 4, 16], "y", [2, 8]), g.input_data((2, 4, 16))


def bert_ids():
    """A BERT-style encoder taking token ids and an attention mask exactly as
    transformers' BertModel exports them: int64 input_ids and attention_mask
    [B, S]; word embeddings gathered with the ids at run time; position and
    token-type embeddings gathered with constants (folded); the extended
    mask Unsqueeze -> Cast(float) -> Sub(1, m) -> Mul(min) added to the
    scores; one attention layer and a pooler-free last hidden state."""
    g = Graph("bert-ids", 113)
    B, S, D, H, DH, V = 2, 16, 32, 2, 16, 100
    E = "embeddings"
    ids, mask = "input_ids", "attention_mask"
    words = g.node("Gather", [g.normal(f"{E}.word_embeddings.weight", (V, D), 1.0), ids],
                   f"{E}.word_embeddings", axis=0)
    pos_ids = g.i64(f"{E}.position_ids", np.arange(512).reshape(1, 512))
    pos_ids = g.node("Slice", [pos_ids, g.i64("const.zero1", [0]), g.i64("const.seq1", [S]),
                               g.i64("const.one_axis", [1])], f"{E}.Slice")
    pos = g.node("Gather", [g.normal(f"{E}.position_embeddings.weight", (512, D), 1.0), pos_ids],
                 f"{E}.position_embeddings", axis=0)
    tt = g.node("Gather", [g.normal(f"{E}.token_type_embeddings.weight", (2, D), 1.0),
                           g.i64(f"{E}.token_type_ids", np.zeros((1, S)))], f"{E}.token_type_embeddings", axis=0)
    x = g.node("Add", [g.node("Add", [words, tt], f"{E}.Add"), pos], f"{E}.Add_1")
    x = g.node("LayerNormalization", [x, g.uniform(f"{E}.LayerNorm.weight", (D,), 0.8, 1.2),
                                      g.normal(f"{E}.LayerNorm.bias", (D,), 0.1)],
               f"{E}.LayerNorm", axis=-1, epsilon=1e-12)
    # Extended attention mask [B, 1, 1, S]: (1 - mask) * finfo(float32).min.
    m = g.node("Unsqueeze", [mask, g.i64("const.axes1", [1])], "mask.Unsqueeze")
    m = g.node("Unsqueeze", [m, g.i64("const.axes2", [2])], "mask.Unsqueeze_1")
    m = g.node("Cast", [m], "mask.Cast", to=TensorProto.FLOAT)
    m = g.node("Sub", [g.const("const.one", 1.0), m], "mask.Sub")
    m = g.node("Mul", [m, g.const("const.min", np.finfo(np.float32).min)], "mask.Mul")
    A = "encoder.layer.0.attention.self"
    heads = g.i64("const.heads", [B, S, H, DH])

    def split(t, perm):
        return g.node("Transpose", [g.node("Reshape", [t, heads], f"{t}.Reshape")], f"{t}.Transpose", perm=perm)

    q = split(g.linear(x, f"{A}.query", D, D), [0, 2, 1, 3])
    k = split(g.linear(x, f"{A}.key", D, D), [0, 2, 3, 1])
    v = split(g.linear(x, f"{A}.value", D, D), [0, 2, 1, 3])
    sc = g.node("MatMul", [q, k], f"{A}.scores")
    sc = g.node("Div", [sc, g.const(f"{A}.scale", np.sqrt(DH))], f"{A}.Div")
    sc = g.node("Add", [sc, m], f"{A}.Add_mask")
    sc = g.node("Softmax", [sc], f"{A}.softmax", axis=-1)
    o = g.node("MatMul", [sc, v], f"{A}.context")
    o = g.node("Transpose", [o], f"{A}.context.Transpose", perm=[0, 2, 1, 3])
    o = g.node("Reshape", [o, g.i64(f"{A}.merge", [B, S, D])], f"{A}.context.Reshape")
    O = "encoder.layer.0.attention.output"
    o = g.linear(o, f"{O}.dense", D, D)
    o = g.node("LayerNormalization", [g.node("Add", [o, x], f"{O}.Add"),
                                      g.uniform(f"{O}.LayerNorm.weight", (D,), 0.8, 1.2),
                                      g.normal(f"{O}.LayerNorm.bias", (D,), 0.1)],
               f"{O}.LayerNorm", axis=-1, epsilon=1e-12, outputs=["last_hidden_state"])
    model = g.model(None, None, "last_hidden_state", [B, S, D],
                    inputs=[(ids, TensorProto.INT64, [B, S]), (mask, TensorProto.INT64, [B, S])])
    rng = g.input_rng
    ids_v = rng.integers(0, V, size=(B, S)).astype(np.int64)
    mask_v = np.ones((B, S), dtype=np.int64)
    mask_v[1, 11:] = 0  # the second sequence is padded
    return model, [ids_v, mask_v]


def dilated():
    """Dilated convolutions whose outer taps read only padding (DeepLabV3's
    ASPP on a small map): a 3x3 at dilation 12 on 12x12 (only the centre
    tap is live), a 5x3 at dilations (6, 13) (rows 1-3 and the centre
    column live), a 3x3 at stride 2 and dilation 11 (the first tap of each
    axis dead: asymmetric padding), a 3x3 at dilation 8 whose taps all
    stay live, and a 1-D conv at dilation 150 (centre tap only); flattened
    and concatenated."""
    g = Graph("dilated", 121)
    x = "x"  # [1,8,12,12]

    def conv(name, cout, k, dil, pads, stride=(1, 1)):
        w = g.normal(f"{name}.weight", (cout, 8, *k), np.sqrt(1.0 / (8 * k[0] * k[1])))
        y = g.node("Conv", [x, w, g.normal(f"{name}.bias", (cout,), 0.1)], name, dilations=list(dil),
                   group=1, kernel_shape=list(k), pads=list(pads), strides=list(stride))
        return g.node("Flatten", [y], f"{name}.flatten", axis=1)

    parts = [
        conv("centre", 4, (3, 3), (12, 12), [12, 12, 12, 12]),          # [1,4,12,12]
        conv("rows", 4, (5, 3), (6, 13), [12, 13, 12, 13]),             # [1,4,12,12]
        conv("strided", 4, (3, 3), (11, 11), [11, 11, 11, 11], (2, 2)),  # [1,4,6,6]
        conv("live", 4, (3, 3), (8, 8), [8, 8, 8, 8]),                  # [1,4,12,12]
    ]
    r = g.node("Reshape", [x, g.i64("r.shape", [1, 8, 144])], "r.reshape")
    w = g.normal("line.weight", (4, 8, 3), np.sqrt(1.0 / 24))
    line = g.node("Conv", [r, w], "line", dilations=[150], group=1, kernel_shape=[3], pads=[150, 150],
                  strides=[1])  # [1,4,144]
    parts.append(g.node("Flatten", [line], "line.flatten", axis=1))
    y = g.node("Concat", parts, "concat", outputs=["y"], axis=1)
    n = 4 * 144 * 3 + 4 * 36 + 4 * 144
    return g.model("x", [1, 8, 12, 12], "y", [1, n]), g.input_data((1, 8, 12, 12))


def fold_ops():
    """Opset 18: every op rbln-compile evaluates only at compile time, on
    constants, each result combined with the run-time input so the output
    depends on every folded value. The folded values are flattened to
    float and concatenated into F [246] (added to x [2,246]); a NonZero of a
    constant mask gives Gather indices into x, reshaped by a folded shape;
    a ReduceProd gives the shape [2,6,41] that x is reshaped to before a
    Transpose. onnxruntime computes all of it at run time."""
    g = Graph("fold-ops", 114)
    x = "x"  # [2,246]
    F32, BOOL = TensorProto.FLOAT, np.bool_
    flat_shape = g.i64("const.flat", [-1])
    parts = []  # (name, number of elements)

    def part(t, name, n, cast=True):
        """Flatten a folded value (cast to float first when it is not)."""
        if cast:
            t = g.node("Cast", [t], f"{name}.cast", to=F32)
        parts.append((g.node("Reshape", [t, flat_shape], f"{name}.flat"), n))

    # Mod: integers with fmod 0 (divisor's sign) and 1 (dividend's sign),
    # floats with fmod 1.
    a, b = g.i64("mod.a", [7, -7, 7, -7, 9]), g.i64("mod.b", [3, 3, -3, -3, 4])
    part(g.node("Mod", [a, b], "mod.int", fmod=0), "mod.int", 5)  # [1,2,-2,-1,1]
    part(g.node("Mod", [a, b], "mod.int_fmod", fmod=1), "mod.int_fmod", 5)  # [1,-1,1,-1,1]
    part(g.node("Mod", [g.const("mod.fa", [5.5, -5.5, 2.25]), g.const("mod.fb", [2.0, 2.0, -1.0])],
                "mod.float", fmod=1), "mod.float", 3, cast=False)  # [1.5,-1.5,0.25]

    # And, Or, Xor, Not on bool constants.
    p_, q_ = g.const("logic.p", [True, False, True, False], BOOL), g.const("logic.q", [True, True, False, False], BOOL)
    logic = [g.node(op, [p_, q_], f"logic.{op.lower()}") for op in ("And", "Or", "Xor")]
    logic.append(g.node("Not", [p_], "logic.not"))
    part(g.node("Concat", logic, "logic.concat", axis=0), "logic", 16)

    # GatherElements on axis 1 with negative indices.
    d23 = g.const("ge.data", [[1, 2, 3], [4, 5, 6]])
    part(g.node("GatherElements", [d23, g.i64("ge.indices", [[-1, 0], [1, -3]])], "ge", axis=1),
         "ge", 4, cast=False)  # [[3,1],[5,4]]

    # ScatterND, every reduction (duplicate and negative indices except
    # for "none", where duplicates are undefined).
    sd = g.const("snd.data", np.arange(6).reshape(2, 3))
    part(g.node("ScatterND", [sd, g.i64("snd.idx_unique", [[0, 1], [1, -1]]), g.const("snd.upd_unique", [10, -3])],
                "snd.none", reduction="none"), "snd.none", 6, cast=False)
    sidx, supd = g.i64("snd.idx", [[0, 1], [1, -1], [0, 1]]), g.const("snd.upd", [10, -3, 5])
    for red in ("add", "mul", "max", "min"):
        part(g.node("ScatterND", [sd, sidx, supd], f"snd.{red}", reduction=red), f"snd.{red}", 6, cast=False)

    # ScatterElements: integers on axis 1 with add (negative and duplicate
    # indices), floats on axis 0 without reduction.
    part(g.node("ScatterElements", [g.i64("se.data", [[1, 2, 3], [4, 5, 6]]), g.i64("se.idx", [[-1, 0], [2, 2]]),
                                    g.i64("se.upd", [[5, 6], [7, 8]])], "se.add", axis=1, reduction="add"),
         "se.add", 6)  # [[7,2,8],[4,5,21]]
    part(g.node("ScatterElements", [g.const("se.fdata", np.arange(6).reshape(3, 2)), g.i64("se.fidx", [[2, 0]]),
                                    g.const("se.fupd", [[-1, -2]])], "se.none", axis=0),
         "se.none", 6, cast=False)

    # Tile of integers.
    part(g.node("Tile", [g.i64("tile.x", [[1, 2]]), g.i64("tile.reps", [2, 3])], "tile"), "tile", 12)

    # CumSum: exclusive and reversed with an int32 scalar axis; plain on
    # integers with a [1] axis.
    part(g.node("CumSum", [d23, g.const("cs.axis", 1, np.int32)], "cs.excl_rev", exclusive=1, reverse=1),
         "cs.excl_rev", 6, cast=False)  # [[5,3,0],[11,6,0]]
    part(g.node("CumSum", [g.i64("cs.ints", [[1, 2, 3], [4, 5, 6]]), g.i64("cs.axis0", [0])], "cs.int"),
         "cs.int", 6)  # [[1,2,3],[5,7,9]]

    # Floor, Ceil, Round (half to even), Sign.
    h = g.const("round.x", [0.5, 1.5, 2.5, -0.5, -2.5, -1.7, 0.0])
    for op in ("Floor", "Ceil", "Round", "Sign"):
        part(g.node(op, [h], f"round.{op.lower()}"), f"round.{op.lower()}", 7, cast=False)

    # Variadic Max/Min on integers and floats.
    ints3 = [g.i64("mm.i1", [1, 5, -3]), g.i64("mm.i2", [2]), g.i64("mm.i3", [0, 7, -9])]
    flts3 = [g.const("mm.f1", [0.5, -1.0, 2.0]), g.const("mm.f2", [1.5]), g.const("mm.f3", [-0.5, 3.0, 2.5])]
    for op in ("Max", "Min"):
        part(g.node(op, ints3, f"mm.int_{op.lower()}"), f"mm.int_{op.lower()}", 3)
        part(g.node(op, flts3, f"mm.float_{op.lower()}"), f"mm.float_{op.lower()}", 3, cast=False)

    # Every Reduce* on float constants (axes input [1], keepdims 1), and
    # on integers: ReduceProd and ReduceMean (truncating) over axis 1,
    # ReduceMax over everything, ReduceSumSquare with empty axes and
    # noop_with_empty_axes (each element squared).
    rf, ax1 = g.const("red.f", [[1.0, 2.0, 3.0], [4.0, 0.5, 2.0]]), g.i64("red.axes1", [1])
    for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
               "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"):
        part(g.node(op, [rf, ax1], f"red.{op}", keepdims=1), f"red.{op}", 2, cast=False)
    ri = g.i64("red.i", [[-3, -2, 2], [4, 5, 6]])
    part(g.node("ReduceProd", [ri, ax1], "red.int_prod", keepdims=0), "red.int_prod", 2)  # [12,120]
    part(g.node("ReduceMean", [ri, ax1], "red.int_mean", keepdims=0), "red.int_mean", 2)  # [-1,5]
    part(g.node("ReduceMax", [ri], "red.int_max", keepdims=0), "red.int_max", 1)  # 6
    part(g.node("ReduceSumSquare", [ri, g.i64("red.no_axes", np.zeros(0))], "red.int_noop",
                noop_with_empty_axes=1), "red.int_noop", 6)

    # Trilu: upper with k=1, lower with k=-1, integers with the defaults.
    t33 = g.const("trilu.x", np.arange(1, 10).reshape(3, 3))
    part(g.node("Trilu", [t33, g.i64("trilu.k1", 1)], "trilu.upper", upper=1), "trilu.upper", 9, cast=False)
    part(g.node("Trilu", [t33, g.i64("trilu.km1", -1)], "trilu.lower", upper=0), "trilu.lower", 9, cast=False)
    part(g.node("Trilu", [g.i64("trilu.ints", np.arange(1, 10).reshape(3, 3))], "trilu.int"), "trilu.int", 9)

    # IsNaN, IsInf (both signs, and +inf only).
    special = g.const("isx", [np.inf, -np.inf, np.nan, 1.0])
    part(g.node("IsNaN", [special], "isnan"), "isnan", 4)
    part(g.node("IsInf", [special], "isinf"), "isinf", 4)
    part(g.node("IsInf", [special], "isinf_pos", detect_negative=0), "isinf_pos", 4)

    # Expand and the comparisons on integers.
    part(g.node("Expand", [g.i64("cmp.col", [[1], [2]]), g.i64("cmp.shape", [2, 1, 3])], "cmp.expand"),
         "cmp.expand", 12)
    c1, c2 = g.i64("cmp.a", [1, 3, 5]), g.i64("cmp.b", [3])
    for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        part(g.node(op, [c1, c2], f"cmp.{op}"), f"cmp.{op}", 3)

    # Casts of constants: float to bool (non-zero is true), int64 to int16
    # and uint8 (wrapping).
    part(g.node("Cast", [g.const("cast.f", [0.5, 0.0, -2.0, 300.7])], "cast.bool", to=TensorProto.BOOL),
         "cast.bool", 4)
    wide = g.i64("cast.wide", [65541, -1, 300])
    part(g.node("Cast", [wide], "cast.int16", to=TensorProto.INT16), "cast.int16", 3)  # [5,-1,300]
    part(g.node("Cast", [wide], "cast.uint8", to=TensorProto.UINT8), "cast.uint8", 3)  # [5,255,44]

    n = sum(k for _, k in parts)  # 246
    folded = g.node("Concat", [p for p, _ in parts], "folded", axis=0)  # F [246]
    y1 = g.node("Add", [x, folded], "use.add")  # [2,246]

    # NonZero of a constant mask as Gather indices ([1,4] -> [2,1,4]), then
    # a Reshape to [2, 4] whose shape is folded from a Tile and a ReduceSum.
    mask = g.const("nz.mask", [False, True, False, True, True, False, False, True], BOOL)
    idx = g.node("NonZero", [mask], "nz")  # [[1,3,4,7]]
    y2 = g.node("Gather", [x, idx], "use.gather", axis=1)
    count = g.node("ReduceSum", [g.node("Cast", [mask], "nz.mask_int", to=TensorProto.INT64)], "nz.count",
                   keepdims=1)  # [4]
    rows = g.node("Tile", [g.i64("nz.rows", [2]), g.i64("nz.rows_reps", [1])], "nz.rows_tile")  # [2]
    y2 = g.node("Reshape", [y2, g.node("Concat", [rows, count], "nz.shape", axis=0)], "use.gather_rows")

    # x reshaped to a folded [2,6,41], transposed, and flattened back.
    shape3 = g.node("ReduceProd", [g.i64("shape.factors", [[2, 1], [3, 2], [41, 1]]), ax1], "shape.prod",
                    keepdims=0)  # [2,6,41]
    y3 = g.node("Transpose", [g.node("Reshape", [x, shape3], "use.reshape")], "use.transpose", perm=[0, 2, 1])
    y3 = g.node("Reshape", [y3, g.i64("use.rows", [2, -1])], "use.rows_back")
    g.node("Concat", [y1, y2, y3], "out", outputs=["y"], axis=1)  # [2, 246 + 4 + 246]
    return g.model(x, [2, n], "y", [2, 2 * n + 4], opset=18), g.input_data((2, n))


def resize():
    """Resize as exporters write it: PyTorch's nn.Upsample(scale_factor=2)
    (nearest, asymmetric, floor: YOLOv8's neck), F.interpolate bilinear with
    align_corners False (pytorch_half_pixel) and True (align_corners), a
    downsampling to given sizes (half_pixel, TF/Keras), nearest with
    round_prefer_ceil at non-integer scales, half_pixel nearest (round_prefer_floor), and
    a 1-D linear resize; every result feeds the output."""
    g = Graph("resize", 114)
    x = "x"
    f = lambda name, v: g.const(name, v)  # noqa: E731
    i64 = g.i64
    outs = []

    def rs(name, inputs, **attrs):
        y = g.node("Resize", inputs, name, **attrs)
        outs.append(g.node("Flatten", [y], f"{name}.flatten", axis=1))

    rs("up_nearest", [x, "", f("s2", [1, 1, 2, 2])], mode="nearest",
       coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    rs("up_bilinear", [x, "", f("s2b", [1, 1, 2, 2])], mode="linear",
       coordinate_transformation_mode="pytorch_half_pixel")
    rs("align_corners", [x, "", "", i64("sz_ac", [1, 4, 11, 13])], mode="linear",
       coordinate_transformation_mode="align_corners")
    rs("down_half_pixel", [x, "", "", i64("sz_down", [1, 4, 3, 5])], mode="linear",
       coordinate_transformation_mode="half_pixel")
    rs("nearest_ceil", [x, "", f("s_frac", [1, 1, 1.5, 2.5])], mode="nearest",
       coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil")
    rs("half_pixel_nearest", [x, "", "", i64("sz_hp", [1, 4, 12, 16])], mode="nearest",
       coordinate_transformation_mode="half_pixel")
    line = g.node("Reshape", [x, i64("to_ncw", [1, 4, 48])], "to_ncw")
    y1 = g.node("Resize", [line, "", f("s1d", [1, 1, 1.75])], "line_linear", mode="linear",
                coordinate_transformation_mode="half_pixel")
    outs.append(g.node("Flatten", [y1], "line_linear.flatten", axis=1))
    n = 4 * (12 * 16 * 2 + 11 * 13 + 3 * 5 + 9 * 20 + 12 * 16 + 84)
    g.node("Concat", outs, "concat", axis=1, outputs=["y"])
    return g.model(x, [1, 4, 6, 8], "y", [1, n]), g.input_data((1, 4, 6, 8))


def convtranspose():
    """ConvTranspose as decoders use it: UNet's k2 s2 up-convolution followed
    by the skip Concat and a 3x3 conv, DCGAN's k4 s2 p1, a grouped k3 s2
    p1 one with output_padding 1 and bias, a dilated one with asymmetric
    pads, and a 1-D one; every result feeds the output."""
    g = Graph("convtranspose", 115)
    x = "x"  # [1, 8, 5, 6]
    outs = []

    def ct(name, inp, cin, cout, k, group=1, bias=True, **attrs):
        kk = k if isinstance(k, (list, tuple)) else [k, k]
        w = g.normal(f"{name}.weight", (cin, cout // group, *kk), np.sqrt(2.0 / (cin * int(np.prod(kk)))))
        ins = [inp, w] + ([g.normal(f"{name}.bias", (cout,), 0.1)] if bias else [])
        return g.node("ConvTranspose", ins, name, group=group, **attrs)

    up = ct("up", x, 8, 4, 2, strides=[2, 2])  # [1, 4, 10, 12]
    skip = g.conv(g.node("Resize", [x, "", g.const("up.s", [1, 1, 2, 2])], "skip.resize", mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"), "skip.conv", 8, 4, 1)
    cat = g.node("Concat", [up, skip], "up.concat", axis=1)
    y = g.conv(cat, "up.conv", 8, 6, 3)
    outs.append(g.node("Flatten", [y], "up.flatten", axis=1))
    d = ct("dcgan", x, 8, 3, 4, strides=[2, 2], pads=[1, 1, 1, 1], bias=False)  # [1, 3, 10, 12]
    outs.append(g.node("Flatten", [d], "dcgan.flatten", axis=1))
    gr = ct("grouped", x, 8, 6, 3, group=2, strides=[2, 2], pads=[1, 1, 1, 1],
            output_padding=[1, 1])  # [1, 6, 10, 12]
    outs.append(g.node("Flatten", [gr], "grouped.flatten", axis=1))
    di = ct("dilated", x, 8, 2, 3, strides=[1, 2], dilations=[2, 1], pads=[1, 0, 2, 1])  # [1, 2, 6, 12]
    outs.append(g.node("Flatten", [di], "dilated.flatten", axis=1))
    line = g.node("Reshape", [x, g.i64("to_ncw", [1, 8, 30])], "to_ncw")
    l1 = ct("line", line, 8, 3, [3], strides=[3], bias=True)  # [1, 3, 90]
    outs.append(g.node("Flatten", [l1], "line.flatten", axis=1))
    n = 6 * 10 * 12 + 3 * 10 * 12 + 6 * 10 * 12 + 2 * 6 * 12 + 3 * 90
    g.node("Concat", outs, "concat", axis=1, outputs=["y"])
    return g.model(x, [1, 8, 5, 6], "y", [1, n]), g.input_data((1, 8, 5, 6))


def conv3d():
    """3-D convolutions as video and volumetric nets use them, on a batch
    of two clips: R3D's 3x3x3 block (Conv, BatchNormalization, Relu, a
    residual Add), R(2+1)D's factorised (1,3,3) then (3,1,1) pair with
    strides on either axis, a grouped one with depth dilation and
    asymmetric pads, a depthwise one with auto_pad SAME_UPPER and no bias,
    then GlobalAveragePool over (D, H, W); 3-D MaxPool (a (1,3,3) stem
    pool, a 3x3x3 one in ceil mode) and AveragePool (padding left out of
    and counted in the average); 3-D ConvTranspose (a 3-D UNet's k2 s2
    up-convolution, a grouped k3 one with output_padding); 3-D Resize
    (trilinear by scales, nearest by sizes); every result feeds the
    output."""
    g = Graph("conv3d", 124)
    x = "x"  # [2, 4, 6, 8, 8]
    outs = []

    def c3(name, inp, cin, cout, k, group=1, bias=True, **attrs):
        w = g.normal(f"{name}.weight", (cout, cin // group, *k), np.sqrt(2.0 / (cin // group * int(np.prod(k)))))
        ins = [inp, w] + ([g.normal(f"{name}.bias", (cout,), 0.1)] if bias else [])
        return g.node("Conv", ins, name, group=group, kernel_shape=list(k), **attrs)

    y = c3("r3d.conv1", x, 4, 8, (3, 3, 3), pads=[1] * 6)  # [2, 8, 6, 8, 8]
    y = g.node("Relu", [g.bn(y, "r3d.bn1", 8)], "r3d.relu1")
    z = c3("r3d.conv2", y, 8, 8, (3, 3, 3), pads=[1] * 6, bias=False)
    z = g.node("Relu", [g.node("Add", [g.bn(z, "r3d.bn2", 8), y], "r3d.add")], "r3d.relu2")
    outs.append(g.node("Flatten", [z], "r3d.flatten", axis=1))
    s = c3("r21d.spatial", z, 8, 6, (1, 3, 3), strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1])  # [2, 6, 6, 4, 4]
    t = c3("r21d.temporal", g.node("Relu", [s], "r21d.relu"), 6, 8, (3, 1, 1), strides=[2, 1, 1],
           pads=[1, 0, 0, 1, 0, 0])  # [2, 8, 3, 4, 4]
    outs.append(g.node("Flatten", [t], "r21d.flatten", axis=1))
    gr = c3("grouped", x, 4, 6, (2, 3, 3), group=2, dilations=[2, 1, 1], pads=[1, 0, 1, 0, 2, 1])  # [2, 6, 5, 8, 8]
    outs.append(g.node("Flatten", [gr], "grouped.flatten", axis=1))
    dw = c3("depthwise", x, 4, 4, (3, 3, 3), group=4, bias=False, auto_pad="SAME_UPPER",
            strides=[2, 2, 2])  # [2, 4, 3, 4, 4]
    outs.append(g.node("Flatten", [dw], "depthwise.flatten", axis=1))
    outs.append(g.node("Flatten", [g.node("GlobalAveragePool", [t], "pool")], "pool.flatten", axis=1))
    pools = [
        ("MaxPool", dict(kernel_shape=[1, 3, 3], strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1])),  # [2, 4, 6, 4, 4]
        ("MaxPool", dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], ceil_mode=1)),  # [2, 4, 3, 4, 4]
        ("AveragePool", dict(kernel_shape=[2, 3, 3], strides=[2, 2, 2], pads=[1] * 6)),  # [2, 4, 4, 4, 4]
        ("AveragePool", dict(kernel_shape=[3, 2, 2], strides=[1, 2, 2], pads=[1, 0, 0, 1, 0, 0],
                             count_include_pad=1)),  # [2, 4, 6, 4, 4]
    ]
    for i, (op, attrs) in enumerate(pools):
        outs.append(g.node("Flatten", [g.node(op, [x], f"pool3d.{i}", **attrs)], f"pool3d.{i}.flatten", axis=1))
    w = g.normal("up3d.weight", (4, 3, 2, 2, 2), np.sqrt(2.0 / 32))
    up = g.node("ConvTranspose", [x, w, g.normal("up3d.bias", (3,), 0.1)], "up3d", strides=[2, 2, 2])  # [2, 3, 12, 16, 16]
    outs.append(g.node("Flatten", [up], "up3d.flatten", axis=1))
    w = g.normal("ct3d.weight", (4, 2, 3, 3, 3), np.sqrt(2.0 / 54))
    ct = g.node("ConvTranspose", [x, w], "ct3d", group=2, strides=[1, 2, 2], pads=[1] * 6,
                output_padding=[0, 1, 1])  # [2, 4, 6, 16, 16]
    outs.append(g.node("Flatten", [ct], "ct3d.flatten", axis=1))
    tri = g.node("Resize", [x, "", g.const("tri.scales", [1, 1, 2, 1.5, 2])], "tri", mode="linear",
                 coordinate_transformation_mode="half_pixel")  # [2, 4, 12, 12, 16]
    outs.append(g.node("Flatten", [tri], "tri.flatten", axis=1))
    near = g.node("Resize", [x, "", "", g.i64("near.sizes", [2, 4, 3, 5, 4])], "near", mode="nearest",
                  coordinate_transformation_mode="asymmetric", nearest_mode="floor")  # [2, 4, 3, 5, 4]
    outs.append(g.node("Flatten", [near], "near.flatten", axis=1))
    n = (8 * 6 * 8 * 8 + 8 * 3 * 4 * 4 + 6 * 5 * 8 * 8 + 4 * 3 * 4 * 4 + 8 + 4 * (96 + 48 + 64 + 96)
         + 3 * 12 * 16 * 16 + 4 * 6 * 16 * 16 + 4 * 12 * 12 * 16 + 4 * 3 * 5 * 4)
    g.node("Concat", outs, "concat", axis=1, outputs=["y"])
    return g.model(x, [2, 4, 6, 8, 8], "y", [2, n]), g.input_data((2, 4, 6, 8, 8))


def recurrent():
    """Recurrent layers unrolled on the NPU: a forward LSTM from given
    initial states, a bidirectional GRU with the reset after the product
    (linear_before_reset=1, as PyTorch exports nn.GRU), a reverse GRU with
    it before, a ReLU RNN from a given state, and a bidirectional LSTM
    without biases; every Y, Y_h and Y_c feeds the output, and a
    LogSoftmax of the first LSTM's Y scaled by 100 (probabilities that
    underflow float32: their logs must stay finite)."""
    g = Graph("recurrent", 125)
    x = "x"  # [5, 2, 6]: seq, batch, input
    T, B, I, H = 5, 2, 6, 8
    outs = []

    def weights(name, dirs, gates, bias=True):
        s = np.sqrt(1.0 / H)
        ins = [g.uniform(f"{name}.W", (dirs, gates * H, I), -s, s), g.uniform(f"{name}.R", (dirs, gates * H, H), -s, s)]
        ins.append(g.uniform(f"{name}.B", (dirs, 2 * gates * H), -s, s) if bias else "")
        return ins

    def flat(v, name):
        outs.append(g.node("Reshape", [v, g.i64(f"{name}.shape", [1, -1])], f"{name}.flat"))

    h0 = g.normal("lstm.h0", (1, B, H), 0.5)
    c0 = g.normal("lstm.c0", (1, B, H), 0.5)
    y, yh, yc = g.node("LSTM", [x] + weights("lstm", 1, 4) + ["", h0, c0], "lstm", n_out=3, hidden_size=H)
    for v, n in [(y, "lstm.y"), (yh, "lstm.yh"), (yc, "lstm.yc")]:
        flat(v, n)
    y, yh = g.node("GRU", [x] + weights("gru", 2, 3), "gru", n_out=2, hidden_size=H, direction="bidirectional",
                   linear_before_reset=1)
    flat(y, "gru.y")
    flat(yh, "gru.yh")
    y, yh = g.node("GRU", [x] + weights("gru0", 1, 3), "gru0", n_out=2, hidden_size=H, direction="reverse")
    flat(y, "gru0.y")
    flat(yh, "gru0.yh")
    y = g.node("RNN", [x] + weights("rnn", 1, 1) + ["", g.normal("rnn.h0", (1, B, H), 0.5)], "rnn",
               hidden_size=H, activations=["Relu"])
    flat(y, "rnn.y")
    y, yh, yc = g.node("LSTM", [x] + weights("lstm1", 2, 4, bias=False), "lstm1", n_out=3, hidden_size=H,
                       direction="bidirectional")
    for v, n in [(y, "lstm1.y"), (yh, "lstm1.yh"), (yc, "lstm1.yc")]:
        flat(v, n)
    lsm = g.node("LogSoftmax", [g.node("Mul", [outs[0], g.const("lsm.scale", 100.0)], "lsm.scale")], "lsm", axis=-1)
    outs.append(lsm)
    n = (T * B * H + 2 * B * H) + (2 * T * B * H + 2 * B * H) + (T * B * H + B * H) + T * B * H + (2 * T * B * H + 4 * B * H)
    n += T * B * H
    g.node("Concat", outs, "concat", axis=1, outputs=["y"])
    return g.model(x, [T, B, I], "y", [1, n]), g.input_data((T, B, I))


def activations():
    """Activations that are chains of device ops: Softplus (up to x = 40,
    where exp(x) would overflow), Softsign, Elu, Selu, Celu, Mish,
    ThresholdedRelu, and the variadic Sum and Mean."""
    g = Graph("activations", 126)
    x = "x"  # [2, 3, 4, 5]
    big = g.node("Mul", [x, g.const("big.scale", 16.0)], "big")
    outs = [
        g.node("Softplus", [big], "softplus"),
        g.node("Softsign", [big], "softsign"),
        g.node("Elu", [x], "elu", alpha=0.7),
        g.node("Selu", [x], "selu"),
        g.node("Celu", [x], "celu", alpha=1.5),
        g.node("Mish", [big], "mish"),
        g.node("ThresholdedRelu", [x], "thresholded", alpha=0.5),
        g.node("Sum", [x, big, g.normal("sum.c", (5,), 1.0)], "sum"),
        g.node("Mean", [x, big], "mean"),
    ]
    outs = [g.node("Flatten", [v], f"{v}.flatten", axis=1) for v in outs]
    g.node("Concat", outs, "concat", axis=1, outputs=["y"])
    return g.model(x, [2, 3, 4, 5], "y", [2, 9 * 60], opset=18), g.input_data((2, 3, 4, 5))


def topk():
    """TopK as classifiers' top-k and detection heads use it: the largest 3
    along the last axis, the smallest 4 along axis 1, every element (k =
    the axis length), on values with ties (which must come out in index
    order); values and indices (as float) feed the output."""
    g = Graph("topk", 127)
    q = "x"  # [2, 6, 10], multiples of 0.5: many ties
    outs = []
    for name, k, attrs in [("top3", 3, dict(axis=-1)), ("bottom4", 4, dict(axis=1, largest=0)),
                           ("all", 10, dict(axis=2, sorted=1))]:
        v, i = g.node("TopK", [q, g.i64(f"{name}.k", [k])], name, n_out=2, **attrs)
        outs.append(g.node("Flatten", [v], f"{name}.v", axis=1))
        fi = g.node("Cast", [i], f"{name}.cast", to=TensorProto.FLOAT)
        outs.append(g.node("Flatten", [fi], f"{name}.i", axis=1))
    n = 2 * (6 * 3 + 4 * 10 + 6 * 10)
    g.node("Concat", outs, "concat", axis=1, outputs=["y"])
    return g.model(q, [2, 6, 10], "y", [2, n]), np.round(g.input_data((2, 6, 10)) * 2) / 2


def pads():
    """Pad in every mode: reflect (mirroring without the edge, as
    PyTorch's ReflectionPad2d and anti-aliased downsampling use it), edge
    (replicate), and negative pads, which crop (NASNet's shifted paths),
    alone and together with positive ones; every result feeds the output."""
    g = Graph("pads", 128)
    x = "x"  # [1, 3, 5, 6]
    cases = [
        ("reflect", [0, 0, 1, 2, 0, 0, 2, 1], dict(mode="reflect")),  # [1, 3, 8, 9]
        ("edge", [0, 0, 0, 2, 0, 0, 1, 2], dict(mode="edge")),  # [1, 3, 6, 10]
        ("crop", [0, 0, -1, -1, 0, 0, 1, 1], {}),  # [1, 3, 5, 6]
        ("crop_only", [0, 0, 0, -2, 0, 0, -1, 0], {}),  # [1, 3, 4, 4]
        ("crop_reflect", [0, 0, -1, 1, 0, 0, 0, 1], dict(mode="reflect")),  # [1, 3, 4, 8]
    ]
    outs = []
    for name, p, attrs in cases:
        y = g.node("Pad", [x, g.i64(f"{name}.pads", p)], name, **attrs)
        outs.append(g.node("Flatten", [y], f"{name}.flatten", axis=1))
    n = 3 * (8 * 9 + 6 * 10 + 5 * 6 + 4 * 4 + 4 * 8)
    g.node("Concat", outs, "concat", axis=1, outputs=["y"])
    return g.model(x, [1, 3, 5, 6], "y", [1, n]), g.input_data((1, 3, 5, 6))


def rounding():
    """Run-time rounding and remainders (Floor, Ceil, Round with its ties
    to even, Sign of values with zeros, Mod: C's fmod on floats and
    Python's remainder on int64), OneHot of run-time int64 indices (in
    range; negative and out of range, with other values), Hardmax with
    tied maxima, and bicubic
    Resize as PyTorch's F.interpolate(mode="bicubic") and TF write it
    (Keys' a = -0.75 and -0.5, edge taps repeated or excluded, up and
    down); every result feeds the output."""
    g = Graph("rounding", 129)
    x = "x"  # [2, 3, 6, 8], multiples of 0.25: ties for Round and Hardmax
    f = lambda name, v: g.const(name, v)  # noqa: E731
    outs = []

    def out(v):
        outs.append(g.node("Flatten", [v], f"{v}.flatten", axis=1))

    for op in ["Floor", "Ceil", "Round", "Sign"]:
        out(g.node(op, [x], op.lower()))
    out(g.node("Mod", [x, f("d", [1.5])], "fmod", fmod=1))
    out(g.node("Mod", [x, f("dn", [-0.75])], "fmod_neg", fmod=1))
    xi = g.node("Cast", [g.node("Mul", [x, f("four", [4.0])], "x4")], "to_int", to=TensorProto.INT64)
    m = g.node("Mod", [xi, g.i64("three", [3])], "int_mod")
    out(g.node("Cast", [m], "int_mod_f", to=TensorProto.FLOAT))
    out(g.node("OneHot", [m, g.i64("depth3", [3]), f("off_on", [0.0, 1.0])], "one_hot"))
    out(g.node("OneHot", [xi, g.i64("depth5", [5]), f("off_on2", [-1.0, 2.0])], "one_hot_wrap", axis=1))
    out(g.node("Hardmax", [x], "hardmax"))
    out(g.node("Hardmax", [x], "hardmax_c", axis=1))
    out(g.node("Resize", [x, "", f("s_up", [1, 1, 2, 1.5])], "bicubic_up", mode="cubic",
               coordinate_transformation_mode="pytorch_half_pixel", cubic_coeff_a=-0.75))
    out(g.node("Resize", [x, "", "", g.i64("sz_ac", [2, 3, 9, 11])], "bicubic_ac", mode="cubic",
               coordinate_transformation_mode="align_corners", cubic_coeff_a=-0.75))
    out(g.node("Resize", [x, "", "", g.i64("sz_down", [2, 3, 4, 5])], "bicubic_tf", mode="cubic",
               coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.5, exclude_outside=1))
    n = 3 * 48 * 9 + 3 * 48 * 3 + 5 * 3 * 48 + 3 * 12 * 12 + 3 * 9 * 11 + 3 * 4 * 5
    g.node("Concat", outs, "concat", axis=1, outputs=["y"])
    return g.model(x, [2, 3, 6, 8], "y", [2, n], opset=18), np.round(g.input_data((2, 3, 6, 8)) * 4) / 4


def sampling():
    """GridSample as spatial transformers, optical flow (RAFT) and
    deformable attention use it: a run-time grid made from the input itself
    (its first two channels, scaled, as (x, y) pairs; about a quarter of
    the coordinates fall outside [-1, 1]), sampled in every mode (nearest,
    bilinear, bicubic), padding (zeros, border, reflection) and
    align_corners setting; every result feeds the output."""
    g = Graph("sampling", 130)
    x = "x"  # [2, 3, 5, 6]
    xy = g.node("Slice", [x, g.i64("c0", [0]), g.i64("c2", [2]), g.i64("axis1", [1])], "xy")
    xy = g.node("Mul", [xy, g.const("spread", [0.8])], "xy_scaled")
    grid = g.node("Transpose", [xy], "grid", perm=[0, 2, 3, 1])  # [2, 5, 6, 2]
    outs = []
    for mode in ["nearest", "bilinear", "bicubic"]:
        for padding in ["zeros", "border", "reflection"]:
            for align in [0, 1]:
                name = f"{mode}_{padding}_{align}"
                y = g.node("GridSample", [x, grid], name, mode=mode, padding_mode=padding, align_corners=align)
                outs.append(g.node("Flatten", [y], f"{name}.flatten", axis=1))
    g.node("Concat", outs, "concat", axis=1, outputs=["y"])
    return g.model(x, [2, 3, 5, 6], "y", [2, 18 * 90], opset=17), g.input_data((2, 3, 5, 6))


def norm_space():
    """Norms and pixel shuffles of image decoders and super-resolution nets:
    InstanceNormalization, GroupNormalization (opset 21: scale and bias per
    channel), DepthToSpace in DCR and CRD modes and SpaceToDepth."""
    g = Graph("norm-space", 116)
    x = "x"  # [2, 8, 6, 6]
    outs = []
    y = g.node("InstanceNormalization", [x, g.uniform("in.scale", (8,), 0.5, 1.5), g.normal("in.bias", (8,), 0.2)],
               "instance_norm", epsilon=1e-5)
    outs.append(g.node("Flatten", [y], "instance_norm.flatten", axis=1))
    y = g.node("GroupNormalization", [x, g.uniform("gn.scale", (8,), 0.5, 1.5), g.normal("gn.bias", (8,), 0.2)],
               "group_norm", num_groups=4, epsilon=1e-5)
    outs.append(g.node("Flatten", [y], "group_norm.flatten", axis=1))
    for mode in ["DCR", "CRD"]:
        y = g.node("DepthToSpace", [x], f"d2s_{mode}", blocksize=2, mode=mode)  # [2, 2, 12, 12]
        outs.append(g.node("Flatten", [y], f"d2s_{mode}.flatten", axis=1))
    y = g.node("SpaceToDepth", [x], "s2d", blocksize=3)  # [2, 72, 2, 2]
    outs.append(g.node("Flatten", [y], "s2d.flatten", axis=1))
    n = 5 * 8 * 36
    g.node("Concat", outs, "concat", axis=1, outputs=["y"])
    return g.model(x, [2, 8, 6, 6], "y", [2, n], opset=21), g.input_data((2, 8, 6, 6))


def einsum():
    """Einsum in the matrix-product forms models use: attention scores
    (bhid,bhjd->bhij) and context (bhij,bhjd->bhid), a linear layer against
    a constant (bid,jd->bij), ellipsis batches, and a transposed output."""
    g = Graph("einsum", 117)
    x = "x"  # [2, 3, 4, 8] = [b, h, i, d]
    outs = []
    sc = g.node("Einsum", [x, x], "scores", equation="bhid,bhjd->bhij")  # [2,3,4,4]
    outs.append(g.node("Flatten", [sc], "scores.flatten", axis=1))
    ctx = g.node("Einsum", [sc, x], "context", equation="bhij,bhjd->bhid")  # [2,3,4,8]
    outs.append(g.node("Flatten", [ctx], "context.flatten", axis=1))
    flat = g.node("Reshape", [x, g.i64("bid", [2, 12, 8])], "to_bid")
    lin = g.node("Einsum", [flat, g.normal("w", (5, 8), 0.3)], "linear", equation="bid,jd->bij")  # [2,12,5]
    outs.append(g.node("Flatten", [lin], "linear.flatten", axis=1))
    ell = g.node("Einsum", [x, g.normal("w2", (8, 6), 0.3)], "ellipsis", equation="...ij,jk->...ik")  # [2,3,4,6]
    outs.append(g.node("Flatten", [ell], "ellipsis.flatten", axis=1))
    tr = g.node("Einsum", [x, x], "transposed_out", equation="bhid,bhjd->bjhi")  # [2,4,3,4]
    outs.append(g.node("Flatten", [tr], "transposed_out.flatten", axis=1))
    n = 3 * 16 + 3 * 32 + 12 * 5 + 3 * 24 + 4 * 12
    g.node("Concat", outs, "concat", axis=1, outputs=["y"])
    return g.model(x, [2, 3, 4, 8], "y", [2, n]), g.input_data((2, 3, 4, 8))


def masks():
    """Masks computed at run time, as transformer exports build them from an
    int64 attention mask: Cast to bool, Equal with 0, Not, comparisons of a
    float input, And/Or/Xor, and Where selecting scores or a large negative
    value, a run-time Tile and ArgMax/ArgMin; every result (cast to float) feeds the
    output."""
    g = Graph("masks", 118)
    x, mask = "x", "attention_mask"  # [2, 8] float, [2, 8] int64
    outs = []

    def f(v, name):
        outs.append(g.node("Cast", [v], f"{name}.float", to=TensorProto.FLOAT))

    keep = g.node("Cast", [mask], "keep", to=TensorProto.BOOL)
    pad = g.node("Equal", [mask, g.i64("zero", 0)], "is_pad")
    f(pad, "is_pad")
    f(g.node("Not", [pad], "not_pad"), "not_pad")
    pos = g.node("Greater", [x, g.const("zero_f", 0.0)], "positive")
    f(pos, "positive")
    f(g.node("LessOrEqual", [x, g.const("half", 0.5)], "le_half"), "le_half")
    f(g.node("GreaterOrEqual", [x, g.const("mhalf", -0.5)], "ge_mhalf"), "ge_mhalf")
    f(g.node("Less", [x, g.node("Neg", [x], "neg_x")], "lt_neg"), "lt_neg")
    both = g.node("And", [keep, pos], "keep_and_pos")
    f(both, "keep_and_pos")
    either = g.node("Or", [keep, pos], "keep_or_pos")
    f(either, "keep_or_pos")
    f(g.node("Xor", [both, either], "xor"), "xor")
    sel = g.node("Where", [keep, x, g.const("big_neg", np.finfo(np.float32).min)], "masked_scores")
    outs.append(g.node("Softmax", [sel], "masked_softmax", axis=-1))
    outs.append(g.node("Where", [pos, x, g.node("Mul", [x, g.const("slope", 0.1)], "scaled")], "leaky"))
    # A run-time Tile (one strided copy) of the input: [2, 8] -> [2, 16].
    outs.append(g.node("Tile", [x, g.i64("reps", [1, 2])], "tiled"))
    # ArgMax / ArgMin (int64 indices) over the masked scores and the input.
    f(g.node("ArgMax", [sel], "argmax", axis=1, keepdims=1), "argmax")
    f(g.node("ArgMin", [x], "argmin", axis=-1, keepdims=1, select_last_index=1), "argmin")
    g.node("Concat", outs, "concat", axis=1, outputs=["y"])
    model = g.model(None, None, "y", [2, 8 * (len(outs) - 2) + 8 + 2],
                    inputs=[(x, TensorProto.FLOAT, [2, 8]), (mask, TensorProto.INT64, [2, 8])])
    xv = g.input_data((2, 8))
    mv = np.ones((2, 8), dtype=np.int64)
    mv[0, 6:] = 0
    mv[1, 3:] = 0
    return model, [xv, mv]


# name -> (builder, suffix of the .npy files or None for no reference)
MODELS = [
    ("resnet", resnet, ""),
    ("mobilenet", mobilenet, ""),
    ("transformer", transformer, ""),
    ("ops", ops, ""),
    ("gelu20", gelu20, ""),
    ("unsupported-op", unsupported_op, None),
    ("dynamic-batch", dynamic_batch, ".b3"),
    ("ops2", ops2, ""),
    ("legacy", legacy, ""),
    ("resnet18", resnet18, ""),
    ("mobilenetv2", mobilenetv2, ""),
    ("encoder4", encoder4, ""),
    ("ops3", ops3, ""),
    ("bert-ids", bert_ids, ""),
    ("resize", resize, ""),
    ("convtranspose", convtranspose, ""),
    ("norm-space", norm_space, ""),
    ("einsum", einsum, ""),
    ("masks", masks, ""),
    ("fold-ops", fold_ops, ""),
    ("dilated", dilated, ""),
    ("conv3d", conv3d, ""),
    ("recurrent", recurrent, ""),
    ("activations", activations, ""),
    ("topk", topk, ""),
    ("pads", pads, ""),
    ("rounding", rounding, ""),
    ("sampling", sampling, ""),
]


def session(model):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # One thread: the reference must not depend on how work is split.
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def shape_str(vi):
    dims = vi.type.tensor_type.shape.dim
    return "[" + ",".join(d.dim_param if d.dim_param else str(d.dim_value) for d in dims) + "]"


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(f"usage: {argv[0]} OUTDIR\n")
        return 2
    out = argv[1]
    os.makedirs(out, exist_ok=True)
    for name, build, suffix in MODELS:
        model, data = build()
        onnx.save(model, os.path.join(out, f"{name}.onnx"))
        sess = session(model)  # also proves onnxruntime loads it
        g = model.graph
        (outp,) = g.output
        if suffix is not None:
            # Several inputs: a list in input order, saved as .input0.npy,
            # .input1.npy, ...; one input: .input.npy.
            arrays = data if isinstance(data, list) else [data]
            feeds = {i.name: a for i, a in zip(g.input, arrays)}
            (res,) = sess.run([outp.name], feeds)
            res = np.asarray(res, dtype=np.float32)
            if not np.all(np.isfinite(res)):
                raise SystemExit(f"{name}: onnxruntime output is not finite")
            if isinstance(data, list):
                for k, a in enumerate(arrays):
                    np.save(os.path.join(out, f"{name}{suffix}.input{k}.npy"), a)
            else:
                np.save(os.path.join(out, f"{name}{suffix}.input.npy"), data)
            np.save(os.path.join(out, f"{name}{suffix}.expected.npy"), res)
        ops_used = sorted({n.op_type for n in g.node})
        ins = ", ".join(f"{i.name}{shape_str(i)}" for i in g.input)
        print(f"{name}: {ins} -> {outp.name}{shape_str(outp)}, "
              f"opset {model.opset_import[0].version}, {len(g.node)} nodes, "
              f"ops: {' '.join(ops_used)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
