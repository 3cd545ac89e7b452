#!/usr/bin/env python3
"""Keras models converted to float32 TFLite, with litert references.

    export_keras.py OUTDIR [NAME...]

Builds each model with seeded random weights (no downloads), converts it
with tf.lite.TFLiteConverter.from_keras_model (float32, no optimizations,
except the two variants named below), and writes

    OUTDIR/NAME.tflite
    OUTDIR/NAME.input.npy      seeded input (NHWC, as the model takes it)
    OUTDIR/NAME.expected.npy   the output of ai_edge_litert's Interpreter (.expected.1.npy,
                               ... for further outputs, in the model's output order)
    OUTDIR/NAME.ops.txt        the TFLite operator list, one per line

Models:
  keras-cnn       a small CNN using most of Keras' image layers
  tf-ops          a Keras layer of raw TensorFlow ops (matmul, split, pack,
                  gather, strided slices, reductions, resizes, ...)
  keras-cnn-fp16  keras-cnn with float16 weights (DEQUANTIZE ops)
  mobilenetv2     keras.applications.MobileNetV2 at 224x224
  deeplabv3plus   Keras' DeepLabV3+ example (ResNet-50 backbone, ASPP with
                  dilated convs and image pooling, decoder) at 512x512
  keras-cnn-int8  keras-cnn fully quantized (int8 weights per channel, int8
                  activations calibrated on 8 seeded inputs), int8 input
                  and outputs: .input.npy is int8, quantized with the
                  input's parameters
  mobilenetv2-int8  mobilenetv2 fully quantized, float32 input and output
                  (QUANTIZE / DEQUANTIZE at the edges)

For the quantized models also: NAME.step (.step.1, ...), each output's
quantization step (1 for an int8 output); NAME.expected-ref.npy, the
output of litert's reference kernels (BUILTIN_REF); NAME.float.npy, the
float Keras model's output on the same input (float outputs only).

and two models the compiler must refuse: unsupported-op (TOPK_V2) and
int16 (a CNN quantized with int16 activations, "16x8"). Batch-norm parameters, biases and PReLU
slopes are randomised, and batch-norm statistics are taken from one
train-mode pass on random data, so no layer is trivially constant and the
activations stay in range through deep nets. Deterministic: same seed,
same files.
"""
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402
from keras import layers  # noqa: E402
from ai_edge_litert.interpreter import Interpreter, OpResolverType  # noqa: E402

SEED = 1234


def randomize(model, calib, seed):
    """Random BN gamma/beta, biases and PReLU slopes, then BN statistics
    from one train-mode pass on `calib` (momentum 0 for that pass)."""
    rng = np.random.default_rng(seed)
    bns = []
    for layer in model.layers:
        if isinstance(layer, layers.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.gamma.assign(rng.uniform(0.5, 1.5, c).astype(np.float32))
            layer.beta.assign(rng.normal(0.0, 0.2, c).astype(np.float32))
            bns.append((layer, layer.momentum))
            layer.momentum = 0.0
        elif isinstance(layer, layers.PReLU):
            a = layer.alpha
            a.assign(rng.uniform(0.05, 0.4, a.shape).astype(np.float32))
        elif getattr(layer, "use_bias", False) and getattr(layer, "bias", None) is not None:
            b = layer.bias
            b.assign(rng.normal(0.0, 0.1, b.shape).astype(np.float32))
    if bns:
        model(calib, training=True)
        for layer, momentum in bns:
            layer.momentum = momentum


# ---- keras-cnn --------------------------------------------------------


def keras_cnn():
    inp = keras.Input((32, 32, 3), batch_size=1, name="image")
    x = layers.Conv2D(16, 3, padding="same", use_bias=False)(inp)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    a = layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x)  # 16x16
    b = layers.DepthwiseConv2D(3, strides=2, padding="same", depth_multiplier=2)(x)  # 16x16x32
    b = layers.BatchNormalization()(b)
    b = layers.Activation("hard_swish")(b)
    b = layers.Conv2D(16, 1)(b)
    x = layers.Add()([a, b])
    x = layers.LeakyReLU(negative_slope=0.2)(x)
    s = layers.SeparableConv2D(24, 3, padding="same", dilation_rate=2)(x)
    s = layers.PReLU(shared_axes=[1, 2])(s)
    v = layers.ZeroPadding2D(((1, 2), (0, 1)))(x)
    v = layers.Conv2D(24, 3, padding="valid", activation="tanh")(v)  # 17x15 -> crop
    v = layers.Cropping2D(((1, 0), (0, 0)))(v)
    v = layers.Resizing(16, 16, interpolation="bilinear")(v)
    x = layers.Concatenate()([s, v])  # 16x16x48
    # squeeze-excite
    se = layers.GlobalAveragePooling2D(keepdims=True)(x)
    se = layers.Conv2D(12, 1, activation="relu")(se)
    se = layers.Conv2D(48, 1, activation="sigmoid")(se)
    x = layers.Multiply()([x, se])
    p = layers.MaxPooling2D(3, strides=2, padding="same")(x)  # 8x8
    q = layers.AveragePooling2D(2)(x)  # 8x8
    x = layers.Subtract()([p, q])
    m1 = layers.Maximum()([p, q])
    m2 = layers.Minimum()([p, q])
    x = layers.Concatenate()([x, m1, m2])  # 8x8x144
    x = layers.Conv2D(32, 3, padding="valid")(x)  # 6x6
    x = layers.BatchNormalization()(x)
    x = layers.Activation("swish")(x)
    up = layers.UpSampling2D(2, interpolation="nearest")(x)  # 12x12
    up = layers.Conv2DTranspose(8, 3, strides=2, padding="same", activation="relu")(up)  # 24x24
    up = layers.UpSampling2D(2, interpolation="bilinear")(up)  # 48x48
    up = layers.AveragePooling2D(3, strides=2, padding="same", name="feature")(up)  # 24x24x8
    g = layers.GlobalMaxPooling2D()(x)
    f = layers.Flatten()(x)
    f = layers.Dense(64, activation="relu")(f)
    f = layers.Dense(32)(layers.Concatenate()([f, g]))
    f = layers.Reshape((4, 8))(f)
    f = layers.Permute((2, 1))(f)
    f = layers.Dense(5)(f)  # 8x5, FULLY_CONNECTED with keep_num_dims
    f = layers.Flatten()(f)
    out = layers.Softmax(name="probs")(layers.Dense(10)(f))
    return keras.Model(inp, [out, up], name="keras_cnn")


# ---- tf-ops -----------------------------------------------------------


class RawOps(layers.Layer):
    """TensorFlow ops that Keras layers rarely produce."""

    def build(self, input_shape):
        c = input_shape[-1]
        rng = np.random.default_rng(SEED + 1)
        self.w = self.add_weight(shape=(c, 12), initializer=keras.initializers.Constant(rng.normal(0, 0.3, (c, 12))))
        self.k = self.add_weight(shape=(3, 3, c, 8), initializer=keras.initializers.Constant(rng.normal(0, 0.3, (3, 3, c, 8))))

    def call(self, x):  # x: [1, 12, 12, 6]
        y = tf.nn.conv2d(x, self.k, strides=1, padding="SAME")  # [1,12,12,8]
        y = tf.nn.relu(y)
        e = tf.exp(-tf.abs(y)) + tf.sqrt(tf.abs(y) + 1.0) * tf.math.rsqrt(tf.square(y) + 1.0)
        d = tf.math.squared_difference(y, e) / (1.0 + tf.reduce_max(y, axis=[1, 2], keepdims=True))
        p = tf.pad(d, [[0, 0], [1, 1], [2, 0], [0, 0]])  # [1,14,14,8]
        p = tf.nn.max_pool2d(p, 2, 2, "VALID")  # [1,7,7,8]
        r1 = tf.compat.v1.image.resize_bilinear(p, (13, 13), align_corners=True)
        r2 = tf.image.resize(p, (13, 13), method="bilinear")  # half-pixel centers
        r3 = tf.image.resize(p, (14, 14), method="nearest")
        r = r1 - r2 + r3[:, :13, 1:, :]  # [1,13,13,8]
        a, b = tf.split(r, 2, axis=-1)  # 2 x [1,13,13,4]
        c1, c2, c3 = tf.split(r, [2, 3, 3], axis=3)
        s = tf.concat([a * b, c1, c2 - tf.reduce_mean(c3, axis=-1, keepdims=True)], axis=-1)  # [1,13,13,9]
        t = tf.transpose(s, [0, 3, 1, 2])  # [1,9,13,13]
        m = tf.matmul(t, t, transpose_b=True)  # [1,9,13,13] BATCH_MATMUL
        m = tf.reshape(m, [1, 9, 169])
        g = tf.gather(m, [0, 2, 4, 8], axis=1)  # [1,4,169]
        u = tf.unstack(g, axis=1)
        st = tf.stack([u[0] + u[3], u[1] * u[2]], axis=1)  # [1,2,169]
        st = tf.nn.tanh(st) + tf.sigmoid(tf.reduce_sum(st, axis=-1, keepdims=True))
        x2 = tf.reshape(x, [1, 144, 6])
        h = tf.matmul(x2, self.w)  # [1,144,12]
        h = tf.nn.leaky_relu(h, 0.1)
        h = tf.expand_dims(tf.reduce_max(h, axis=1), 1)  # [1,1,12]
        h = tf.squeeze(h, axis=1)
        hs = h[:, 2:10:2]  # strided slice
        out = tf.concat([tf.reshape(st, [1, 338]), tf.maximum(hs, 0.0), tf.minimum(h, 0.5)], axis=-1)
        # Softmax over the channels of a 4-D tensor (axis -1 of NHWC).
        sm = tf.reduce_sum(tf.nn.softmax(r * 2.0) * r, axis=[1, 2])  # [1, 8]
        # More ops on the 4-D map p [1,7,7,8]: SLICE, PADV2, REDUCE_MIN over
        # channels without keep_dims, resizes without flags and nearest
        # with align_corners, CAST, LOG, clipping.
        q = tf.slice(p, [0, 1, 0, 2], [1, 5, -1, 4])  # [1,5,7,4]
        q = tf.pad(q, [[0, 0], [1, 0], [0, 1], [0, 0]], constant_values=0.5)  # [1,6,8,4]
        q = tf.compat.v1.image.resize_bilinear(q, (9, 11)) + tf.compat.v1.image.resize_nearest_neighbor(q, (9, 11), align_corners=True)
        mn = tf.reduce_min(q, axis=3)  # [1,9,11]
        ci = tf.cast(tf.cast(q * 4.0, tf.int32), tf.float32)
        lg = tf.math.log(tf.abs(q) + 1.0) + tf.clip_by_value(q, -1.0, 1.0)
        extra = tf.concat([tf.reshape(mn, [1, 99]), tf.reduce_mean(ci + lg, axis=[1, 3])], axis=-1)  # [1, 110]
        return tf.concat([out, sm, extra], axis=-1)


def tf_ops():
    inp = keras.Input((12, 12, 6), batch_size=1, name="x")
    return keras.Model(inp, RawOps()(inp), name="tf_ops")


# ---- DeepLabV3+ (Keras' example: keras.io/examples/vision/deeplabv3_plus) --


def conv_block(x, filters=256, kernel_size=3, dilation_rate=1, use_bias=False):
    x = layers.Conv2D(filters, kernel_size, dilation_rate=dilation_rate, padding="same", use_bias=use_bias,
                      kernel_initializer=keras.initializers.HeNormal())(x)
    x = layers.BatchNormalization()(x)
    return layers.ReLU()(x)


def aspp(x):
    dims = x.shape
    p = layers.AveragePooling2D(pool_size=(dims[-3], dims[-2]))(x)
    p = conv_block(p, kernel_size=1, use_bias=True)
    out_pool = layers.UpSampling2D(size=(dims[-3] // p.shape[1], dims[-2] // p.shape[2]), interpolation="bilinear")(p)
    out_1 = conv_block(x, kernel_size=1, dilation_rate=1)
    out_6 = conv_block(x, kernel_size=3, dilation_rate=6)
    out_12 = conv_block(x, kernel_size=3, dilation_rate=12)
    out_18 = conv_block(x, kernel_size=3, dilation_rate=18)
    x = layers.Concatenate(axis=-1)([out_pool, out_1, out_6, out_12, out_18])
    return conv_block(x, kernel_size=1)


def deeplabv3plus(size=512, classes=20):
    inp = keras.Input((size, size, 3), batch_size=1, name="image")
    pre = keras.applications.resnet50.preprocess_input(inp)
    resnet = keras.applications.ResNet50(weights=None, include_top=False, input_tensor=pre)
    x = resnet.get_layer("conv4_block6_2_relu").output
    x = aspp(x)
    a = layers.UpSampling2D(size=(size // 4 // x.shape[1], size // 4 // x.shape[2]), interpolation="bilinear")(x)
    b = resnet.get_layer("conv2_block3_2_relu").output
    b = conv_block(b, filters=48, kernel_size=1)
    x = layers.Concatenate(axis=-1)([a, b])
    x = conv_block(x)
    x = conv_block(x)
    x = layers.UpSampling2D(size=(size // x.shape[1], size // x.shape[2]), interpolation="bilinear")(x)
    out = layers.Conv2D(classes, 1, padding="same")(x)
    return keras.Model(inp, out, name="deeplabv3plus")


# ---- refused models ---------------------------------------------------


class TopK(layers.Layer):
    def call(self, x):
        return tf.math.top_k(tf.reshape(x, [1, -1]), k=4).values


def unsupported_op():
    inp = keras.Input((4, 4, 2), batch_size=1, name="x")
    return keras.Model(inp, TopK()(layers.Conv2D(2, 1)(inp)), name="unsupported_op")


def tiny_cnn():
    inp = keras.Input((8, 8, 3), batch_size=1, name="x")
    x = layers.Conv2D(4, 3, padding="same", activation="relu")(inp)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(3)(x), name="tiny")


# ---- conversion and references ---------------------------------------


def convert(model, fp16=False, int8_data=None, int8_io=False, int16=False):
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    if fp16:
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.target_spec.supported_types = [tf.float16]
    if int8_data is not None:
        # Full integer quantization as TensorFlow's guide describes it.
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = lambda: ([d[None]] for d in int8_data)
        conv.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
                                          if int16 else tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if int8_io:
            conv.inference_input_type = tf.int8
            conv.inference_output_type = tf.int8
    return conv.convert()


def output_steps(tfl):
    """The quantization step of each output: 1 when it is quantized (its
    values are the integers), else the scale of the DEQUANTIZE input that
    makes it."""
    it = Interpreter(model_content=tfl)
    details = {t["index"]: t for t in it.get_tensor_details()}
    made_by = {o["outputs"][0]: o for o in it._get_ops_details() if len(o["outputs"]) == 1}
    steps = []
    for o in it.get_output_details():
        if o["dtype"] in (np.int8, np.uint8):
            steps.append(1.0)
            continue
        scale = 0.0
        if made_by.get(o["index"], {}).get("op_name") == "DEQUANTIZE":
            scale = details[made_by[o["index"]]["inputs"][0]]["quantization"][0]
        steps.append(scale)
    return steps


def reference(tfl, x, kernels=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES):
    # TFLite's builtin kernels, without the XNNPACK delegate (which would
    # hide the operators behind DELEGATE nodes).
    it = Interpreter(model_content=tfl, num_threads=1, experimental_op_resolver_type=kernels)
    it.allocate_tensors()
    ins = it.get_input_details()
    assert len(ins) == 1, ins
    it.set_tensor(ins[0]["index"], x)
    it.invoke()
    outs = it.get_output_details()
    ops = [o["op_name"] for o in it._get_ops_details()]
    return [it.get_tensor(o["index"]).copy() for o in outs], [o["name"] for o in outs], ops


MODELS = {
    # name: (builder, pixel input (0..255, else N(0, 1)), calibration batch)
    "keras-cnn": (keras_cnn, False, 4),
    "tf-ops": (tf_ops, False, 0),
    "keras-cnn-fp16": (keras_cnn, False, 4),
    # Logits (no softmax): a softmax over 1000 near-uniform classes would
    # hide errors.
    "mobilenetv2": (lambda: keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3), alpha=1.0,
                                                           classifier_activation=None), False, 2),
    "deeplabv3plus": (deeplabv3plus, True, 1),
    "keras-cnn-int8": (keras_cnn, False, 4),
    "mobilenetv2-int8": (lambda: keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3), alpha=1.0,
                                                                classifier_activation=None), False, 2),
}


def export(name, out):
    t0 = time.time()
    keras.utils.set_random_seed(SEED)
    build, pixels, calib_n = MODELS[name]
    model = build()
    shape = tuple(model.inputs[0].shape[1:])
    rng = np.random.default_rng(SEED + 7)

    def data(n):
        d = rng.uniform(0, 255, (n,) + shape) if pixels else rng.standard_normal((n,) + shape)
        return d.astype(np.float32)

    if calib_n:
        randomize(model, data(calib_n), SEED + 3)
    int8 = name.endswith("-int8")
    tfl = convert(model, fp16=name.endswith("-fp16"), int8_data=data(8) if int8 else None, int8_io=name == "keras-cnn-int8")
    x = data(1)
    inp = Interpreter(model_content=tfl).get_input_details()[0]
    if inp["dtype"] == np.int8:
        scale, zero = inp["quantization"]
        x = np.clip(np.round(x / scale) + zero, -128, 127).astype(np.int8)
    outs, names, ops = reference(tfl, x)
    if int8:
        # The float model on the same (dequantized) input, and TFLite's
        # reference kernels (BUILTIN_REF), whose distance from its
        # optimized ones shows how far int8 rounding noise carries.
        xf = x.astype(np.float32)
        if inp["dtype"] == np.int8:
            xf = (xf - zero) * scale
        floats = model(xf)
        floats = floats if isinstance(floats, (list, tuple)) else [floats]
        refs, _, _ = reference(tfl, x, OpResolverType.BUILTIN_REF)
        for i, step in enumerate(output_steps(tfl)):
            sfx = '' if i == 0 else f'.{i}'
            with open(f"{out}/{name}.step{sfx}", "w") as f:
                f.write(f"{step!r}\n")
            np.save(f"{out}/{name}.expected-ref{sfx}.npy", refs[i])
            if outs[i].dtype == np.float32:
                # Keras orders the outputs its own way: match them by shape.
                (f,) = [np.asarray(f, np.float32) for f in floats if tuple(f.shape) == outs[i].shape]
                np.save(f"{out}/{name}.float{sfx}.npy", f)
    with open(f"{out}/{name}.tflite", "wb") as f:
        f.write(tfl)
    np.save(f"{out}/{name}.input.npy", x)
    # The TFLite output order is the interpreter's; rbln-run writes outputs
    # in the same order (.expected.npy, .expected.1.npy, ... as rbln-run names them).
    for i, o in enumerate(outs):
        np.save(f"{out}/{name}.expected{'' if i == 0 else f'.{i}'}.npy", o)
    with open(f"{out}/{name}.ops.txt", "w") as f:
        f.write("\n".join(ops) + "\n")
    hist = {}
    for o in ops:
        hist[o] = hist.get(o, 0) + 1
    print(f"{name}: {len(tfl) / 2**20:.1f} MiB, {len(ops)} ops, outputs {[(n, o.shape) for n, o in zip(names, outs)]}, "
          f"{time.time() - t0:.1f} s; {dict(sorted(hist.items()))}", file=sys.stderr)


def export_refused(out):
    keras.utils.set_random_seed(SEED)
    with open(f"{out}/unsupported-op.tflite", "wb") as f:
        f.write(convert(unsupported_op()))
    rng = np.random.default_rng(SEED)
    data = rng.standard_normal((8, 8, 8, 3)).astype(np.float32)
    with open(f"{out}/int16.tflite", "wb") as f:
        f.write(convert(tiny_cnn(), int8_data=data, int16=True))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    names = sys.argv[2:] or list(MODELS) + ["refused"]
    for n in names:
        if n == "refused":
            export_refused(out)
        else:
            export(n, out)


if __name__ == "__main__":
    main()
