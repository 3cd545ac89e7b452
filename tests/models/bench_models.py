#!/usr/bin/env python3
"""The models of `make bench` (scripts/bench.sh) and their onnxruntime times.

    python bench_models.py gen OUTDIR [--smoke] NAME...
    python bench_models.py ort OUTDIR --threads T [--warmup K] [--min-runs N]
                           [--max-runs M] [--budget SECONDS] NAME...

`gen` writes OUTDIR/NAME.onnx and OUTDIR/NAME.input.npy for each NAME: a
test model of gen_models.py (its builder, same bytes), a benchmark model
below, or a micro-benchmark model (`micro-*`; `--smoke` makes these tiny).

`ort` times each OUTDIR/NAME.onnx with onnxruntime on the CPU provider as a
realistic reference: every graph optimization (ORT_ENABLE_ALL),
intra_op_num_threads T (the device model's compute threads), inter_op 1,
sequential execution. After K warm-up runs it times at least N and at most
M runs, stopping after SECONDS; it writes OUTDIR/NAME.ort.npy (the output)
and one JSON object per line on stdout: name, median_ms, min_ms, runs,
times_ms (sorted).

The benchmark models follow torchvision's / Hugging Face's layer structure
and names as their ONNX exports do, with seeded random weights (numpy,
onnx.helper, no PyTorch). Their outputs are not meaningful, only finite.
"""

import json
import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_models  # noqa: E402
from gen_models import Graph  # noqa: E402


def make_divisible(v, divisor=8):
    """torchvision's _make_divisible."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def activation(g, y, name, act):
    """ReLU, HardSwish or SiLU (x * Sigmoid(x), as torch exports nn.SiLU)."""
    if act == "RE":
        return g.node("Relu", [y], name)
    if act == "HS":
        return g.node("HardSwish", [y], name)
    if act == "SiLU":
        s = g.node("Sigmoid", [y], f"{name}.Sigmoid")
        return g.node("Mul", [y, s], f"{name}.Mul")
    assert act is None, act
    return y


def conv_bn_act(g, x, name, cin, cout, k, stride=1, group=1, act=None):
    """torchvision's Conv2dNormActivation: conv (no bias) `name.0`, BN
    `name.1`, activation `name.2`. Fan-in He init (see gen_models'
    mobilenetv2 for why not fan-out)."""
    y = g.conv(x, f"{name}.0", cin, cout, k, stride=stride, group=group, bias=False,
               gain=2.0 if act else 1.0)
    y = g.bn(y, f"{name}.1", cout)
    return activation(g, y, f"{name}.2", act)


def linear_2d(g, x, name, fin, fout):
    """nn.Linear on a 2-D input: Gemm transB=1 with nn.Linear's init."""
    bound = 1.0 / np.sqrt(fin)
    w = g.uniform(f"{name}.weight", (fout, fin), -bound, bound)
    b = g.uniform(f"{name}.bias", (fout,), -bound, bound)
    return g.node("Gemm", [x, w, b], name, alpha=1.0, beta=1.0, transB=1)


def classifier_head(g, y, name, fin, fout, out):
    y = g.node("GlobalAveragePool", [y], "avgpool")
    y = g.node("Flatten", [y], "flatten", axis=1)
    bound = 1.0 / np.sqrt(fin)
    w = g.uniform(f"{name}.weight", (fout, fin), -bound, bound)
    b = g.uniform(f"{name}.bias", (fout,), -bound, bound)
    return g.node("Gemm", [y, w, b], name, outputs=[out], alpha=1.0, beta=1.0, transB=1)


# ---------------------------------------------------------------------------
# Benchmark models. Each returns (model, input array).


def resnet50(res=224):
    """torchvision's resnet50 (v1.5: stride on the 3x3 conv), with its names;
    BatchNormalization nodes after bias-free convs."""
    g = Graph("resnet50", 201)
    x = "image"

    def conv(x, name, cin, cout, k, stride=1):
        # torchvision: kaiming_normal_(mode="fan_out", nonlinearity="relu").
        return g.conv(x, name, cin, cout, k, stride=stride, bias=False,
                      std=np.sqrt(2.0 / (cout * k * k)))

    y = conv(x, "conv1", 3, 64, 7, stride=2)
    y = g.bn(y, "bn1", 64)
    y = g.node("Relu", [y], "relu")
    y = g.node("MaxPool", [y], "maxpool", ceil_mode=0, dilations=[1, 1],
               kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])

    def bottleneck(x, name, cin, width, stride):
        cout = width * 4
        y = conv(x, f"{name}.conv1", cin, width, 1)
        y = g.node("Relu", [g.bn(y, f"{name}.bn1", width)], f"{name}.relu")
        y = conv(y, f"{name}.conv2", width, width, 3, stride=stride)
        y = g.node("Relu", [g.bn(y, f"{name}.bn2", width)], f"{name}.relu_1")
        y = conv(y, f"{name}.conv3", width, cout, 1)
        y = g.bn(y, f"{name}.bn3", cout)
        if stride != 1 or cin != cout:
            sc = conv(x, f"{name}.downsample.0", cin, cout, 1, stride=stride)
            sc = g.bn(sc, f"{name}.downsample.1", cout)
        else:
            sc = x
        y = g.node("Add", [y, sc], f"{name}.add")
        return g.node("Relu", [y], f"{name}.relu_2")

    cin = 64
    for i, (width, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2),
                                                 (512, 3, 2)], start=1):
        for j in range(blocks):
            y = bottleneck(y, f"layer{i}.{j}", cin, width, stride if j == 0 else 1)
            cin = width * 4
    classifier_head(g, y, "fc", 2048, 1000, "logits")
    return g.model(x, [1, 3, res, res], "logits", [1, 1000]), g.input_data((1, 3, res, res))


def mobilenetv3_small(res=224):
    """torchvision's mobilenet_v3_small, with its names: HardSwish and
    HardSigmoid ops (torch's opset-14+ export), squeeze-excite as
    GlobalAveragePool, 1x1 convs with bias, ReLU, HardSigmoid, Mul."""
    g = Graph("mobilenetv3-small", 202)
    x = "input"
    y = conv_bn_act(g, x, "features.0", 3, 16, 3, stride=2, act="HS")
    # (in, kernel, expanded, out, SE, activation, stride)
    cfg = [(16, 3, 16, 16, True, "RE", 2), (16, 3, 72, 24, False, "RE", 2),
           (24, 3, 88, 24, False, "RE", 1), (24, 5, 96, 40, True, "HS", 2),
           (40, 5, 240, 40, True, "HS", 1), (40, 5, 240, 40, True, "HS", 1),
           (40, 5, 120, 48, True, "HS", 1), (48, 5, 144, 48, True, "HS", 1),
           (48, 5, 288, 96, True, "HS", 2), (96, 5, 576, 96, True, "HS", 1),
           (96, 5, 576, 96, True, "HS", 1)]
    for i, (cin, k, exp, cout, se, act, stride) in enumerate(cfg, start=1):
        name, j, r = f"features.{i}.block", 0, y
        if exp != cin:
            y = conv_bn_act(g, y, f"{name}.{j}", cin, exp, 1, act=act)
            j += 1
        y = conv_bn_act(g, y, f"{name}.{j}", exp, exp, k, stride=stride, group=exp, act=act)
        j += 1
        if se:
            sq = make_divisible(exp // 4)
            s = g.node("GlobalAveragePool", [y], f"{name}.{j}.avgpool")
            s = g.conv(s, f"{name}.{j}.fc1", exp, sq, 1, gain=2.0)
            s = g.node("Relu", [s], f"{name}.{j}.activation")
            s = g.conv(s, f"{name}.{j}.fc2", sq, exp, 1)
            s = g.node("HardSigmoid", [s], f"{name}.{j}.scale_activation",
                       alpha=1.0 / 6.0, beta=0.5)
            y = g.node("Mul", [s, y], f"{name}.{j}.mul")
            j += 1
        y = conv_bn_act(g, y, f"{name}.{j}", exp, cout, 1)
        if stride == 1 and cin == cout:
            y = g.node("Add", [y, r], f"features.{i}.add")
    y = conv_bn_act(g, y, "features.12", 96, 576, 1, act="HS")
    y = g.node("GlobalAveragePool", [y], "avgpool")
    y = g.node("Flatten", [y], "flatten", axis=1)
    y = linear_2d(g, y, "classifier.0", 576, 1024)
    y = g.node("HardSwish", [y], "classifier.1")
    bound = 1.0 / np.sqrt(1024)
    g.node("Gemm", [y, g.uniform("classifier.3.weight", (1000, 1024), -bound, bound),
                    g.uniform("classifier.3.bias", (1000,), -bound, bound)],
           "classifier.3", outputs=["logits"], alpha=1.0, beta=1.0, transB=1)
    return g.model(x, [1, 3, res, res], "logits", [1, 1000]), g.input_data((1, 3, res, res))


def efficientnet_b0(res=224):
    """torchvision's efficientnet_b0, with its names: SiLU as x * Sigmoid(x),
    MBConv blocks with depthwise convs and squeeze-excite (SiLU, Sigmoid)."""
    g = Graph("efficientnet-b0", 203)
    x = "input"
    y = conv_bn_act(g, x, "features.0", 3, 32, 3, stride=2, act="SiLU")
    # (expand ratio, kernel, stride, in, out, layers)
    cfg = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2),
           (6, 3, 2, 40, 80, 3), (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4),
           (6, 3, 1, 192, 320, 1)]
    for s, (t, k, stride, cin, cout, n) in enumerate(cfg, start=1):
        for b in range(n):
            bin_, bstride = (cin, stride) if b == 0 else (cout, 1)
            exp = make_divisible(bin_ * t)
            name, j, r = f"features.{s}.{b}.block", 0, y
            if exp != bin_:
                y = conv_bn_act(g, y, f"{name}.{j}", bin_, exp, 1, act="SiLU")
                j += 1
            y = conv_bn_act(g, y, f"{name}.{j}", exp, exp, k, stride=bstride, group=exp,
                            act="SiLU")
            j += 1
            sq = max(1, bin_ // 4)
            e = g.node("GlobalAveragePool", [y], f"{name}.{j}.avgpool")
            e = g.conv(e, f"{name}.{j}.fc1", exp, sq, 1, gain=2.0)
            e = activation(g, e, f"{name}.{j}.activation", "SiLU")
            e = g.conv(e, f"{name}.{j}.fc2", sq, exp, 1)
            e = g.node("Sigmoid", [e], f"{name}.{j}.scale_activation")
            y = g.node("Mul", [e, y], f"{name}.{j}.mul")
            j += 1
            y = conv_bn_act(g, y, f"{name}.{j}", exp, cout, 1)
            if bstride == 1 and bin_ == cout:
                y = g.node("Add", [y, r], f"features.{s}.{b}.add")
    y = conv_bn_act(g, y, "features.8", 320, 1280, 1, act="SiLU")
    classifier_head(g, y, "classifier.1", 1280, 1000, "logits")
    return g.model(x, [1, 3, res, res], "logits", [1, 1000]), g.input_data((1, 3, res, res))


def bert(name, seed, layers, S, D, H, FF):
    """A BERT encoder as Hugging Face exports it (opset 17), fed float
    embeddings [1,S,D] (the compiler takes float inputs only): embeddings
    LayerNorm, then post-norm layers of MatMul+Add projections, head split
    by Reshape + Transpose, batched MatMuls, Div by sqrt(head dim), Softmax,
    GELU written with Erf, residual Adds and LayerNormalization. Xavier
    weights. Output: last_hidden_state [1,S,D]."""
    g = Graph(name, seed)
    x = "embeddings"
    DH = D // H
    heads = g.i64("const.heads_shape", [1, S, H, DH])
    merge = g.i64("const.merge_shape", [1, S, D])
    scale = g.const("const.scale", np.sqrt(DH))
    sqrt2 = g.const("const.sqrt2", 1.41421356)
    one = g.const("const.one", 1.0)
    half = g.const("const.half", 0.5)

    def xavier(fin, fout):
        return np.sqrt(2.0 / (fin + fout))

    def layer_norm(t, n, out=None):
        return g.node("LayerNormalization",
                      [t, g.uniform(f"{n}.weight", (D,), 0.8, 1.2), g.normal(f"{n}.bias", (D,), 0.1)],
                      n, outputs=[out] if out else None, axis=-1, epsilon=1e-12)

    def split(t, n, perm):
        t = g.node("Reshape", [t, heads], f"{n}.Reshape")
        return g.node("Transpose", [t], f"{n}.Transpose", perm=perm)

    h = layer_norm(x, "embeddings.LayerNorm")
    for i in range(layers):
        L = f"encoder.layer.{i}"
        A = f"{L}.attention.self"
        q = split(g.linear(h, f"{A}.query", D, D, std=xavier(D, D)), f"{A}.q", [0, 2, 1, 3])
        k = split(g.linear(h, f"{A}.key", D, D, std=xavier(D, D)), f"{A}.k", [0, 2, 3, 1])
        v = split(g.linear(h, f"{A}.value", D, D, std=xavier(D, D)), f"{A}.v", [0, 2, 1, 3])
        s = g.node("MatMul", [q, k], f"{A}.scores")  # [1,H,S,S]
        s = g.node("Div", [s, scale], f"{A}.scale_div")
        s = g.node("Softmax", [s], f"{A}.softmax", axis=-1)
        o = g.node("MatMul", [s, v], f"{A}.context")  # [1,H,S,DH]
        o = g.node("Transpose", [o], f"{A}.context.Transpose", perm=[0, 2, 1, 3])
        o = g.node("Reshape", [o, merge], f"{A}.context.Reshape")
        o = g.linear(o, f"{L}.attention.output.dense", D, D, std=xavier(D, D))
        h = layer_norm(g.node("Add", [o, h], f"{L}.attention.output.add"),
                       f"{L}.attention.output.LayerNorm")
        f = g.linear(h, f"{L}.intermediate.dense", D, FF, std=xavier(D, FF))
        G = f"{L}.intermediate.gelu"
        e = g.node("Div", [f, sqrt2], f"{G}.Div")
        e = g.node("Erf", [e], f"{G}.Erf")
        e = g.node("Add", [e, one], f"{G}.Add")
        e = g.node("Mul", [f, e], f"{G}.Mul")
        e = g.node("Mul", [e, half], f"{G}.Mul_1")
        f = g.linear(e, f"{L}.output.dense", FF, D, std=xavier(FF, D))
        last = i == layers - 1
        h = layer_norm(g.node("Add", [f, h], f"{L}.output.add"), f"{L}.output.LayerNorm",
                       out="last_hidden_state" if last else None)
    return g.model(x, [1, S, D], "last_hidden_state", [1, S, D]), g.input_data((1, S, D))


# ---------------------------------------------------------------------------
# Micro-benchmark models (one node each); `smoke` shrinks them.


def micro_gemm(smoke):
    n = 64 if smoke else 1024
    g = Graph("micro-gemm", 301)
    g.node("MatMul", ["a", g.normal("b", (n, n), np.sqrt(1.0 / n))], "gemm", outputs=["c"])
    return g.model("a", [n, n], "c", [n, n]), g.input_data((n, n))


def micro_conv(smoke):
    """ResNet's layer1 3x3 conv: 64 -> 64 channels, 56x56, pad 1, no bias."""
    c, hw = (8, 8) if smoke else (64, 56)
    g = Graph("micro-conv", 302)
    g.conv("x", "conv", c, c, 3, bias=False, out="y")
    return g.model("x", [1, c, hw, hw], "y", [1, c, hw, hw]), g.input_data((1, c, hw, hw))


# [1,64,256,256] float32 = 16 MiB.
BIG = (1, 64, 256, 256)
SMALL = (1, 4, 32, 32)


def micro_add(smoke):
    """x + W: two 16 MiB tensors in device DRAM -> a 16 MiB result."""
    shape = SMALL if smoke else BIG
    g = Graph("micro-add", 303)
    g.node("Add", ["x", g.normal("w", shape, 1.0)], "add", outputs=["y"])
    return g.model("x", list(shape), "y", list(shape)), g.input_data(shape)


def micro_relu(smoke):
    """A transfer-bound model: 16 MiB in, a Relu, 16 MiB out."""
    shape = SMALL if smoke else BIG
    g = Graph("micro-relu", 304)
    g.node("Relu", ["x"], "relu", outputs=["y"])
    return g.model("x", list(shape), "y", list(shape)), g.input_data(shape)


def micro_mlp(smoke):
    """A small model, where per-call costs show (the Python SDK rows):
    [16, 256] -> Linear 256 -> Relu -> Linear 10."""
    g = Graph("micro-mlp", 305)
    h = g.node("Relu", [g.linear("x", "fc1", 256, 256)], "relu")
    g.node("Add", [g.node("MatMul", [h, g.normal("fc2.weight", (256, 10), 1 / 16)], "fc2.matmul"),
                   g.normal("fc2.bias", (10,), 0.1)], "fc2.add", outputs=["y"])
    return g.model("x", [16, 256], "y", [16, 10]), g.input_data((16, 256))


def attention_models(smoke):
    """Causal single-head attention, q, k, v -> o, at the bench shape
    (SEQ 1024, HEAD_DIM 64; smoke: 64, 32): (the Triton kernel as a
    rbln.triton custom operator, the same attention as built-in ops).
    The kernel's TTIR is what tests/triton/kernels.py printed for that
    shape (attention_bench / attention), in $RBLN_TTIR_DIR."""
    seq, d, kernel = (64, 32, "attention") if smoke else (1024, 64, "attention_bench")
    ttir_dir = os.environ.get("RBLN_TTIR_DIR")
    if not ttir_dir:
        raise SystemExit("bench_models.py: set RBLN_TTIR_DIR to the TTIR of tests/triton/kernels.py (scripts/bench.sh does)")
    with open(os.path.join(ttir_dir, f"{kernel}.ttir")) as f:
        ttir = f.read()
    block = 16 if smoke else 64
    scale = 1.0 / np.sqrt(d)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [seq, d]) for n in ("q", "k", "v")]
    out = [helper.make_tensor_value_info("o", TensorProto.FLOAT, [seq, d])]
    rng = np.random.default_rng(306)
    data = [rng.standard_normal((seq, d)).astype(np.float32) for _ in range(3)]
    custom = helper.make_node(kernel, ["q", "k", "v"], ["o"], name="attention", domain="rbln.triton",
                              ttir=ttir, grid=[seq // block], float_args=[float(scale)])
    triton = helper.make_model(helper.make_graph([custom], "attention-triton", io, out),
                               opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("rbln.triton", 1)])
    mask = np.where(np.tril(np.ones((seq, seq), bool)), 0.0, -np.inf).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0], name="kt"),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
        helper.make_node("Mul", ["s", "scale"], ["ss"], name="scale"),
        helper.make_node("Add", ["ss", "mask"], ["sm"], name="mask"),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["o"], name="pv"),
    ]
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "scale"), numpy_helper.from_array(mask, "mask")]
    builtin = helper.make_model(helper.make_graph(nodes, "attention-builtin", io, out, inits), opset_imports=[helper.make_opsetid("", 17)])
    return triton, builtin, data


def micro_attention(which):
    def build_one(smoke):
        triton, builtin, data = attention_models(smoke)
        return (triton if which == "triton" else builtin), data
    return build_one


BENCH = {
    "resnet50": resnet50,
    "mobilenetv3-small": mobilenetv3_small,
    "efficientnet-b0": efficientnet_b0,
    # MiniLM-L12-H384-sized BERT: 12 layers, hidden 384, 12 heads, FFN 1536.
    "bert-l12-h384": lambda: bert("bert-l12-h384", 204, 12, 128, 384, 12, 1536),
    # For the smoke run of make test.
    "bert-tiny": lambda: bert("bert-tiny", 205, 2, 16, 64, 2, 128),
}
MICRO = {
    "micro-gemm": micro_gemm,
    "micro-conv": micro_conv,
    "micro-add": micro_add,
    "micro-relu": micro_relu,
    "micro-mlp": micro_mlp,
    "micro-attention-triton": micro_attention("triton"),
    "micro-attention-builtin": micro_attention("builtin"),
}
# Models onnxruntime cannot run itself (a custom operator), timed on the
# model with the same computation in built-in ops.
ORT_STAND_IN = {"micro-attention-triton": "micro-attention-builtin"}


def build(name, smoke):
    # NAME-int8: NAME quantised by onnxruntime's quantize_static (QDQ,
    # per-channel int8 weights), as tests/models/gen_int8.py makes them;
    # NAME-int8r: the same with reduce_range (7-bit weights, which
    # onnxruntime recommends for CPUs without VNNI and which the NPU's
    # plain int8 path multiplies without any correction).
    for suffix, reduce_range in (("-int8", False), ("-int8r", True)):
        if name.endswith(suffix):
            import tempfile

            import gen_int8
            model, data = build(name[: -len(suffix)], smoke)
            with tempfile.TemporaryDirectory() as d:
                _, qpath = gen_int8.quantize_qdq(model, d, name, reduce_range=reduce_range)
                return onnx.load(qpath), data
    if name in MICRO:
        return MICRO[name](smoke)
    if name in BENCH:
        return BENCH[name]()
    for n, builder, suffix in gen_models.MODELS:
        if n == name and suffix == "":
            return builder()
    known = sorted(BENCH) + sorted(MICRO) + [n for n, _, s in gen_models.MODELS if s == ""]
    raise SystemExit(f"bench_models.py: unknown model {name!r} (known: {' '.join(known)})")


def gen(out, names, smoke):
    os.makedirs(out, exist_ok=True)
    for name in names:
        model, data = build(name, smoke)
        onnx.save(model, os.path.join(out, f"{name}.onnx"))
        if isinstance(data, list):  # several inputs, in input order
            for k, a in enumerate(data):
                np.save(os.path.join(out, f"{name}.input{k}.npy"), a)
        else:
            np.save(os.path.join(out, f"{name}.input.npy"), data)
        params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
        print(f"{name}: {len(model.graph.node)} nodes, {params / 1e6:.2f} M parameters, "
              f"ops: {' '.join(sorted({n.op_type for n in model.graph.node}))}", file=sys.stderr)


def ort_session(path, threads):
    """onnxruntime as every reference row runs it: CPU, ORT_ENABLE_ALL,
    sequential, `threads` intra-op threads."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def ort_time(path, data, threads, warmup, min_runs, max_runs, budget):
    sess = ort_session(path, threads)
    feed = {i.name: d for i, d in zip(sess.get_inputs(), data)}
    out = None
    for _ in range(warmup):
        out = sess.run(None, feed)
    times = []
    start = time.perf_counter()
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() - start < budget):
        t0 = time.perf_counter()
        out = sess.run(None, feed)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times, np.asarray(out[0], dtype=np.float32)


def model_inputs(out, name):
    """A model's input arrays: NAME.input.npy, or NAME.input0.npy,
    NAME.input1.npy, ... for several inputs (in input order)."""
    one = os.path.join(out, f"{name}.input.npy")
    if os.path.exists(one):
        return [np.load(one)]
    arrays, k = [], 0
    while os.path.exists(os.path.join(out, f"{name}.input{k}.npy")):
        arrays.append(np.load(os.path.join(out, f"{name}.input{k}.npy")))
        k += 1
    if not arrays:
        raise FileNotFoundError(f"no {name}.input.npy or {name}.input0.npy in {out}")
    return arrays


def ort_all(out, names, threads, warmup, min_runs, max_runs, budget):
    for name in names:
        path = os.path.join(out, f"{ORT_STAND_IN.get(name, name)}.onnx")
        row = {"name": name, "threads": threads}
        try:
            data = model_inputs(out, name)
            times, res = ort_time(path, data, threads, warmup, min_runs, max_runs, budget)
            np.save(os.path.join(out, f"{name}.ort.npy"), res)
            row.update(median_ms=times[len(times) // 2] * 1e3, min_ms=times[0] * 1e3,
                       runs=len(times), warmup=warmup, finite=bool(np.all(np.isfinite(res))),
                       times_ms=[round(t * 1e3, 6) for t in times])
        except Exception as e:  # noqa: BLE001 - recorded in the report
            row["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(row), flush=True)
        print(f"onnxruntime {name}: " + (f"{row['median_ms']:.3f} ms (median of {row['runs']})"
                                         if "error" not in row else row["error"]), file=sys.stderr)


def decoder_ort(out, names, threads, new_tokens, runs, seqs):
    """The decoders' prefill and decode programs on onnxruntime with the
    KV cache as host arrays (the reference of the decoder rows): time to
    first token (the prefill and its argmax) and decode tokens/s, greedy,
    best of `runs` generations (after one warm-up); and `seqs` sequences
    through the slot prefill and the batched decode step, all tokens per
    second from the first prefill to the last token (as rbln-generate
    counts continuous batching)."""
    for name in names:
        row = {"name": name, "threads": threads, "new_tokens": new_tokens}
        try:
            pre = ort_session(os.path.join(out, f"{name}-prefill-8.onnx"), threads)
            dec = ort_session(os.path.join(out, f"{name}-decode.onnx"), threads)
            with open(os.path.join(out, f"{name}-decoder.prompt.txt")) as f:
                prompt = np.array([[int(t) for t in f.read().strip().split(",")]], np.int64)
            ttfts, rates = [], []
            for _ in range(runs + 1):
                t0 = time.perf_counter()
                logits, k, v = pre.run(None, {"input_ids": prompt})
                tok = int(np.argmax(logits[0]))
                t1 = time.perf_counter()
                for step in range(new_tokens - 1):
                    logits, k, v = dec.run(None, {"input_ids": np.array([[tok]], np.int64),
                                                  "position": np.array([prompt.shape[1] + step], np.int64),
                                                  "k_cache": k, "v_cache": v})
                    tok = int(np.argmax(logits[0]))
                t2 = time.perf_counter()
                ttfts.append((t1 - t0) * 1e3)
                rates.append((new_tokens - 1) / (t2 - t1))
            row.update(time_to_first_token_ms=min(ttfts[1:]), tokens_per_s=max(rates[1:]), runs=runs)
            try:
                pre_s = ort_session(os.path.join(out, f"{name}-prefill-slot-8.onnx"), threads)
                dec_b = ort_session(os.path.join(out, f"{name}-decode-batch.onnx"), threads)
                slots_shape = list(dec_b.get_inputs()[2].shape)
                batch = []
                for _ in range(runs + 1):
                    ks, vs = np.zeros(slots_shape, np.float32), np.zeros(slots_shape, np.float32)
                    t0 = time.perf_counter()
                    toks = np.zeros((slots_shape[0], 1), np.int64)
                    for s in range(seqs):
                        logits, ks, vs = pre_s.run(None, {"input_ids": prompt, "slot": np.array([s], np.int64), "k_slots": ks, "v_slots": vs})
                        toks[s, 0] = int(np.argmax(logits[0]))
                    pos = np.full(slots_shape[0], prompt.shape[1], np.int64)
                    for step in range(new_tokens - 1):
                        logits, ks, vs = dec_b.run(None, {"input_ids": toks, "position": pos, "k_slots": ks, "v_slots": vs})
                        toks = np.argmax(logits, axis=1).astype(np.int64).reshape(-1, 1)
                        pos += 1
                    batch.append(seqs * new_tokens / (time.perf_counter() - t0))
                row.update(seqs=seqs, batch_tokens_per_s=max(batch[1:]))
            except Exception as e:  # noqa: BLE001 - recorded in the report
                row["batch_error"] = f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - recorded in the report
            row["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(row), flush=True)
        print(f"onnxruntime decoder {name}: " + (f"ttft {row['time_to_first_token_ms']:.3f} ms, {row['tokens_per_s']:.1f} tokens/s"
                                                 if "error" not in row else row["error"]), file=sys.stderr)


def main(argv):
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pg = sub.add_parser("gen")
    pg.add_argument("out")
    pg.add_argument("names", nargs="+")
    pg.add_argument("--smoke", action="store_true")
    po = sub.add_parser("ort")
    po.add_argument("out")
    po.add_argument("names", nargs="+")
    po.add_argument("--threads", type=int, required=True)
    po.add_argument("--warmup", type=int, default=3)
    po.add_argument("--min-runs", type=int, default=5)
    po.add_argument("--max-runs", type=int, default=50)
    po.add_argument("--budget", type=float, default=3.0)
    pd = sub.add_parser("decoder-ort")
    pd.add_argument("out")
    pd.add_argument("names", nargs="+")
    pd.add_argument("--threads", type=int, required=True)
    pd.add_argument("--new-tokens", type=int, default=64)
    pd.add_argument("--runs", type=int, default=3)
    pd.add_argument("--seqs", type=int, default=4)
    a = p.parse_args(argv[1:])
    if a.cmd == "gen":
        gen(a.out, a.names, a.smoke)
    elif a.cmd == "decoder-ort":
        decoder_ort(a.out, a.names, a.threads, a.new_tokens, a.runs, a.seqs)
    else:
        ort_all(a.out, a.names, a.threads, a.warmup, a.min_runs, a.max_runs, a.budget)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
