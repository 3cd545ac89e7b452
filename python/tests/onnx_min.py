"""Tiny ONNX models written as protobuf bytes by hand (the guest has no
`onnx` package): enough for compile_from_onnx tests and a model with
several outputs."""

import struct

FLOAT, UINT8, INT8, INT64 = 1, 2, 3, 7


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, value) -> bytes:
    if isinstance(value, int):
        return _varint(num << 3) + _varint(value)
    if isinstance(value, str):
        value = value.encode()
    return _varint(num << 3 | 2) + _varint(len(value)) + bytes(value)


def _value_info(name: str, elem_type: int, shape) -> bytes:
    dims = b"".join(_field(1, _field(1, int(d))) for d in shape)
    tensor_type = _field(1, elem_type) + _field(2, dims)
    return _field(1, name) + _field(2, _field(1, tensor_type))


def _node(op: str, inputs, outputs, name: str) -> bytes:
    return (b"".join(_field(1, i) for i in inputs) + b"".join(_field(2, o) for o in outputs)
            + _field(3, name) + _field(4, op))


def _tensor_f32(name: str, shape, values) -> bytes:
    raw = struct.pack(f"<{len(values)}f", *values)
    return b"".join(_field(1, int(d)) for d in shape) + _field(2, FLOAT) + _field(8, name) + _field(9, raw)


def _tensor_8bit(name: str, elem_type: int, values) -> bytes:
    """A scalar int8 / uint8 tensor (a zero point)."""
    raw = struct.pack("<" + ("b" if elem_type == INT8 else "B") * len(values), *values)
    return _field(2, elem_type) + _field(8, name) + _field(9, raw)


def model(nodes, inputs, outputs, initializers=(), opset: int = 17, zero_points=()) -> bytes:
    """nodes: (op, [inputs], [outputs]); inputs/outputs: (name, elem_type,
    shape); initializers: (name, shape, float values); zero_points: (name,
    INT8 or UINT8, value) scalars."""
    g = b"".join(_field(1, _node(op, i, o, f"n{k}")) for k, (op, i, o) in enumerate(nodes))
    g += _field(2, "g")
    g += b"".join(_field(5, _tensor_f32(*t)) for t in initializers)
    g += b"".join(_field(5, _tensor_8bit(n, t, [v])) for n, t, v in zero_points)
    g += b"".join(_field(11, _value_info(*v)) for v in inputs)
    g += b"".join(_field(12, _value_info(*v)) for v in outputs)
    return _field(1, 8) + _field(2, "rbln-python-tests") + _field(7, g) + _field(8, _field(2, opset))


def two_outputs(shape=(2, 8)) -> bytes:
    """relu = Relu(x), scaled = x * 2 + 1: two outputs of one input."""
    n = 1
    for d in shape:
        n *= d
    return model(
        [("Relu", ["x"], ["relu"]), ("Mul", ["x", "two"], ["t"]), ("Add", ["t", "one"], ["scaled"])],
        [("x", FLOAT, shape)],
        [("relu", FLOAT, shape), ("scaled", FLOAT, shape)],
        [("two", [1], [2.0]), ("one", [1], [1.0])],
    )


def scale(shape=(4, 16), factor: float = 3.0) -> bytes:
    """y = x * factor: each request's output tells which input it came from."""
    return model([("Mul", ["x", "k"], ["y"])], [("x", FLOAT, shape)], [("y", FLOAT, shape)],
                 [("k", [1], [factor])])


def dynamic(shape=("batch", 8)) -> bytes:
    """y = Relu(x) with a named (dynamic) first dimension."""
    def vi(name):
        dims = b"".join(_field(1, _field(2, d) if isinstance(d, str) else _field(1, d)) for d in shape)
        return _field(1, name) + _field(2, _field(1, _field(1, FLOAT) + _field(2, dims)))
    g = _field(1, _node("Relu", ["x"], ["y"], "n0")) + _field(2, "g") + _field(11, vi("x")) + _field(12, vi("y"))
    return _field(1, 8) + _field(2, "rbln-python-tests") + _field(7, g) + _field(8, _field(2, 17))


def int8_add(shape=(4, 16), a=(0.1, -3), b=(0.05, 7), y=(0.08, -10)) -> bytes:
    """y = QuantizeLinear(Relu(DequantizeLinear(a) + DequantizeLinear(b))):
    a int8, b uint8, y int8, each (scale, zero point): a quantised model
    with an 8-bit interface."""
    return model(
        [("DequantizeLinear", ["a", "sa", "za"], ["af"]), ("DequantizeLinear", ["b", "sb", "zb"], ["bf"]),
         ("Add", ["af", "bf"], ["s"]), ("Relu", ["s"], ["r"]), ("QuantizeLinear", ["r", "sy", "zy"], ["y"])],
        [("a", INT8, shape), ("b", UINT8, shape)], [("y", INT8, shape)],
        [("sa", [], [a[0]]), ("sb", [], [b[0]]), ("sy", [], [y[0]])], opset=17,
        zero_points=[("za", INT8, a[1]), ("zb", UINT8, b[1]), ("zy", INT8, y[1])])
