"""Quantised (QDQ) test models made by onnxruntime's own quantizer.

Each float model of gen_models.py listed below goes through
onnxruntime.quantization.quantize_static (QDQ format, u8 activations, s8
weights, as its defaults are; per-channel and per-tensor weights) with
min-max calibration over a few seeded random inputs. Written to OUTDIR:

- NAME.onnx: the QDQ model,
- NAME.input.npy: the test input (not one of the calibration inputs),
- NAME.expected.npy: onnxruntime executing the QDQ model as written
  (graph optimisations off: DequantizeLinear, the float op,
  QuantizeLinear — the ONNX definition of the model),
- NAME.expected-ort.npy: onnxruntime with all graph optimisations, which
  fuses the QDQ groups into its own integer kernels (QLinearConv and the
  like, u8×s8 multiply-adds that can saturate on CPUs without VNNI): for
  the report only, it strays several steps from the definition,
- NAME.float.npy: the float model's output on the same input,
- NAME.step: the quantisation step of the output (the scale of the last
  DequantizeLinear), which the NPU's result is compared in.

With --bad, writes instead small QDQ models with malformed quantisation
parameters (bad-*.onnx) that rbln-compile must refuse.

Usage: gen_int8.py [--bad] OUTDIR
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                      quantize_static)
from onnxruntime.quantization.shape_inference import quant_pre_process

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_models  # noqa: E402

# (name, float builder, per-channel weights, format): QDQ, or QOperator
# (QLinearConv, QLinearMatMul and onnxruntime's com.microsoft QGemm,
# QLinearAdd, QLinearMul, QLinearConcat, QLinearSoftmax,
# QLinearGlobalAveragePool).
MODELS = [
    # (name, float model, per-channel weights, format, activation type)
    ("resnet18-int8", gen_models.resnet18, True, QuantFormat.QDQ, QuantType.QUInt8),
    ("resnet18-int8-pt", gen_models.resnet18, False, QuantFormat.QDQ, QuantType.QUInt8),
    # Signed (asymmetric) int8 activations: onnxruntime's S8S8.
    ("resnet18-int8-s8", gen_models.resnet18, True, QuantFormat.QDQ, QuantType.QInt8),
    ("mobilenetv2-int8", gen_models.mobilenetv2, True, QuantFormat.QDQ, QuantType.QUInt8),
    ("transformer-int8", gen_models.transformer, True, QuantFormat.QDQ, QuantType.QUInt8),
    ("resnet18-int8-qop", gen_models.resnet18, True, QuantFormat.QOperator, QuantType.QUInt8),
    ("transformer-int8-qop", gen_models.transformer, True, QuantFormat.QOperator, QuantType.QUInt8),
]
CALIBRATION_INPUTS = 4


class Inputs(CalibrationDataReader):
    def __init__(self, name, shape, seed):
        rng = np.random.default_rng(seed)
        self.items = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(CALIBRATION_INPUTS)])

    def get_next(self):
        return next(self.items, None)


def session(path, optimize):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                     else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def output_step(model):
    """The scale of the DequantizeLinear that makes the graph's output
    (None when a float op makes it)."""
    (out,) = model.graph.output
    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if out.name in n.output and n.op_type == "DequantizeLinear":
            return float(onnx.numpy_helper.to_array(inits[n.input[1]]).reshape(-1)[0])
    return None


def bad_models(out):
    """One QuantizeLinear -> DequantizeLinear -> Conv model per defect."""
    from onnx import TensorProto, helper, numpy_helper

    def model(name, scale, zero, zero_type=TensorProto.UINT8, **attrs):
        w = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "w")
        s = numpy_helper.from_array(np.asarray(scale, np.float32), "s")
        z = helper.make_tensor("z", zero_type, [len(zero)] if np.ndim(scale) else [], [0] * len(zero))
        # Written into int32_data directly: the helper refuses values out
        # of the type's range, which is the defect wanted here.
        z.int32_data[:] = zero
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], **attrs),
                 helper.make_node("Conv", ["d", "w"], ["y"])]
        g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w, s, z])
        # Saved without checking: these models are malformed on purpose.
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), os.path.join(out, f"{name}.onnx"))

    model("bad-zero", 0.5, [300])
    model("bad-scale", -0.5, [0])
    model("bad-axis", [0.5, 0.5, 0.5], [0, 0, 0], axis=1)
    model("bad-block", [0.5, 0.5, 0.5, 0.5], [0, 0, 0, 0], axis=1, block_size=2)


def quantize_qdq(model, workdir, name, per_channel=True, fmt=QuantFormat.QDQ, reduce_range=False, activations=QuantType.QUInt8):
    """`model` (float ONNX) quantised as a user would: onnxruntime's
    pre-processing (shape inference, BatchNormalization folded into the
    Conv), then quantize_static in QDQ format (u8 activations, s8
    weights) with min-max calibration over seeded random inputs. Saves
    NAME.float.onnx, NAME.prep.onnx and NAME.onnx in `workdir`; returns
    the path of the float and of the quantised model."""
    fpath = os.path.join(workdir, f"{name}.float.onnx")
    onnx.save(model, fpath)
    (inp,) = model.graph.input
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    ppath = os.path.join(workdir, f"{name}.prep.onnx")
    quant_pre_process(fpath, ppath, skip_symbolic_shape=True)
    qpath = os.path.join(workdir, f"{name}.onnx")
    quantize_static(ppath, qpath, Inputs(inp.name, shape, 7), quant_format=fmt,
                    activation_type=activations, weight_type=QuantType.QInt8, per_channel=per_channel,
                    reduce_range=reduce_range,
                    calibrate_method=CalibrationMethod.MinMax)
    return fpath, qpath


def calibration_sets(out):
    """Calibration data for rbln-quantize (tests/vm/quantize.sh): 4 seeded
    random samples per float test model, as a .npz with one [N, ...]
    array per model input."""
    for name, build in [("resnet18", gen_models.resnet18), ("resnet", gen_models.resnet), ("mobilenet", gen_models.mobilenet)]:
        model, _ = build()
        (inp,) = model.graph.input
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        rng = np.random.default_rng(11)
        np.savez(os.path.join(out, f"calib-{name}.npz"), **{inp.name: rng.standard_normal([4] + shape).astype(np.float32)})


def main(argv):
    if len(argv) == 3 and argv[1] == "--bad":
        bad_models(argv[2])
        return 0
    if len(argv) == 3 and argv[1] == "--calibration":
        calibration_sets(argv[2])
        return 0
    if len(argv) != 2:
        sys.stderr.write(f"usage: {argv[0]} [--bad] OUTDIR\n")
        return 2
    out = argv[1]
    os.makedirs(out, exist_ok=True)
    for name, build, per_channel, fmt, activations in MODELS:
        model, data = build()
        (inp,) = model.graph.input
        fpath, qpath = quantize_qdq(model, out, name, per_channel, fmt, activations=activations)
        qmodel = onnx.load(qpath)
        feeds = {inp.name: data}
        (want,) = session(qpath, False).run(None, feeds)
        (fused,) = session(qpath, True).run(None, feeds)
        (flt,) = session(fpath, False).run(None, feeds)
        np.save(os.path.join(out, f"{name}.input.npy"), data)
        np.save(os.path.join(out, f"{name}.expected.npy"), np.asarray(want, dtype=np.float32))
        np.save(os.path.join(out, f"{name}.expected-ort.npy"), np.asarray(fused, dtype=np.float32))
        np.save(os.path.join(out, f"{name}.float.npy"), np.asarray(flt, dtype=np.float32))
        step = output_step(qmodel)
        if step is not None:
            with open(os.path.join(out, f"{name}.step"), "w") as f:
                f.write(f"{step:.9g}\n")
        ops = sorted({n.op_type for n in qmodel.graph.node})
        print(f"{name}: {len(qmodel.graph.node)} nodes, output step {step}, ops: {' '.join(ops)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
