"""rbln: Python SDK of the rbln NPU stack.

    import rbln, numpy as np
    with rbln.Runtime("model.rbln") as rt:        # or a CompiledModel
        y = rt.run(np.zeros((1, 3, 224, 224), np.float32))

    rt = rbln.AsyncRuntime("model.rbln", parallel=2)
    ys = await asyncio.gather(*(rt.async_run(x) for x in xs))   # in order

    m = rbln.compile_from_onnx("model.onnx")      # or compile_from_torch(...)
    m.save("model.rbln"); rt = m.create_runtime()

The heavy lifting is the Rust stack (rbln_runtime, rbln_compile) in the
extension module ``rbln._rbln``; this file adds asyncio, file handling and
the PyTorch export.
"""

from __future__ import annotations

import asyncio
import collections.abc
import functools
import io
import os
import threading
import weakref
from typing import Any, Iterable, Sequence, Union

from . import _rbln
from ._errors import *  # noqa: F401,F403  (the exception hierarchy)
from ._errors import RBLNCompileError, RBLNValueError, __all__ as _error_names
from ._rbln import BatchDecoder, CompiledModel, Decoder, Runtime, Task, device_count, devices, perf_counter_ns

__version__: str = _rbln.__version__

InputInfo = Sequence[Union[tuple, list]]


class AsyncRuntime(_rbln.AsyncRuntime):
    """Pipelined execution over ``parallel`` (1 or 2) model instances.

    ``AsyncRuntime(model, *, device=0, parallel=1, tensor_type="np")``.
    ``run(*inputs)`` returns an :class:`rbln.Task` at once (``task.wait()``
    for the outputs); ``await rt.async_run(*inputs)`` on asyncio. Requests
    run in the order they were made; finished requests reach the event
    loop through a descriptor it watches, never blocking it.
    """

    def async_run(self, *inputs: Any, **named: Any) -> "Request":
        """Submit one inference now and return an awaitable of its outputs.

        Must be called with a running asyncio loop in this thread (inside
        a coroutine). Wrong inputs raise here, at the call. Cancelling the
        awaiting task abandons only this result: the request still runs in
        its turn, and every other request completes normally.
        """
        loop = asyncio.get_running_loop()
        fut = Request(loop=loop)
        last_loop, queue = _last_queue
        if last_loop() is not loop:
            queue = _completion_queue(loop)
        if queue is not None:
            self._run_into(queue, fut, inputs, named)
        else:
            task = self.run(*inputs, **named)
            task.add_done_callback(functools.partial(loop.call_soon_threadsafe, _deliver, fut, task))
        return fut


class Request(asyncio.Future):
    """What :meth:`AsyncRuntime.async_run` returns: an asyncio future of
    the request's outputs (await it, pass it to ``asyncio.gather``,
    ``wait_for`` or ``wait``, cancel it), which ``asyncio.create_task``
    also takes, as it takes a coroutine. Being a future, ``gather`` waits
    on it directly instead of wrapping it in a task: under load that
    wrapping would cost as much as the rest of a request's bookkeeping.
    """

    _iter = None

    # The coroutine protocol, for create_task: run as `await self` would.
    def send(self, value):
        if self._iter is None:
            self._iter = self.__await__()
        return self._iter.send(value)

    def throw(self, *exc):
        if self._iter is None:
            self._iter = self.__await__()
        return self._iter.throw(*exc)

    def close(self):
        self._iter = None


collections.abc.Coroutine.register(Request)

# Per event loop: the queue finished requests of every runtime reach it
# through (None: a loop without add_reader, which gets one
# call_soon_threadsafe per request instead). `_last_queue` caches the last
# lookup: (weak reference to the loop, its queue).
_queues: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = weakref.WeakKeyDictionary()
_queues_lock = threading.Lock()
_NO_READER = object()
_last_queue: tuple = (lambda: None, None)


def _completion_queue(loop: asyncio.AbstractEventLoop):
    global _last_queue
    q = _queues.get(loop)
    if q is None:
        with _queues_lock:  # loops of other threads register concurrently
            q = _queues.get(loop)
            if q is None:
                q = _rbln.CompletionQueue()
                try:
                    loop.add_reader(q.fileno(), q.deliver)
                except NotImplementedError:
                    q = _NO_READER
                _queues[loop] = q
    q = None if q is _NO_READER else q
    _last_queue = (weakref.ref(loop), q)
    return q


def _deliver(fut: asyncio.Future, task: Task) -> None:
    """On the loop's thread: hand a finished request to its future."""
    if fut.done():  # cancelled by its awaiter
        return
    try:
        fut.set_result(task.result())
    except BaseException as e:  # the request's error, raised by result()
        fut.set_exception(e)


def _input_shapes(input_info: Any) -> list:
    """``[(name, shape[, dtype]), ...]`` or ``{name: shape}`` as the
    compiler's ``[(name, [dims])]``."""
    if input_info is None:
        return []
    items = input_info.items() if isinstance(input_info, dict) else input_info
    shapes = []
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) < 2:
            raise RBLNValueError(f"input_info: expected (name, shape[, dtype]) entries, got {item!r}")
        name, shape = item[0], item[1]
        try:
            dims = [int(d) for d in shape]
        except (TypeError, ValueError):
            raise RBLNValueError(f"input_info: input {name!r}: shape must be a sequence of integers, got {shape!r}") from None
        if any(d <= 0 for d in dims):
            raise RBLNValueError(f"input_info: input {name!r}: dimensions must be positive, got {dims}")
        shapes.append((str(name), dims))
    return shapes


def _read_model(path_or_bytes: Any, what: str) -> tuple:
    """The bytes of a model and a name for it."""
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        return bytes(path_or_bytes), "model"
    if hasattr(path_or_bytes, "SerializeToString"):  # an onnx.ModelProto
        return path_or_bytes.SerializeToString(), "model"
    try:
        path = os.fspath(path_or_bytes)
    except TypeError:
        raise RBLNValueError(
            f"{what}: expected a file path, bytes or an onnx.ModelProto, not {type(path_or_bytes).__name__}"
        ) from None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise RBLNCompileError(f"{path}: {e.strerror or e}") from e
    name = os.path.splitext(os.path.basename(path))[0] or "model"
    return data, name


def compile_from_onnx(path_or_bytes: Any, input_info: Any = None, *, name: str | None = None) -> CompiledModel:
    """Compile an ONNX model (path, bytes or onnx.ModelProto) for the NPU.

    ``path_or_bytes`` may also be a dict ``{entry name: model, ...}``: the
    models become entry points of one CompiledModel over one copy of their
    weights (the first is the main program), e.g. a decoder's decode step
    and prefills (docs/python.md). ``input_info``: static shapes for
    inputs, ``[(name, shape[, dtype]), ...]`` or ``{name: shape}`` (needed
    for dynamic dimensions). Raises :class:`rbln.RBLNCompileError` for
    models the compiler does not take. The GIL is released while
    compiling.
    """
    if isinstance(path_or_bytes, dict):
        if not path_or_bytes:
            raise RBLNValueError("compile_from_onnx: the dict of entry points is empty")
        entries = [(str(e), _read_model(m, "compile_from_onnx")[0]) for e, m in path_or_bytes.items()]
        return _rbln._compile_entries(entries, name or "model", _input_shapes(input_info))
    data, stem = _read_model(path_or_bytes, "compile_from_onnx")
    return _rbln._compile(data, name or stem, _input_shapes(input_info))


def compile_from_tflite(path_or_bytes: Any, *, name: str | None = None) -> CompiledModel:
    """Compile a float32 TFLite model (path or bytes) for the NPU."""
    data, stem = _read_model(path_or_bytes, "compile_from_tflite")
    return _rbln._compile(data, name or stem, [])


_TORCH_DTYPES = {"float32": "float32", "f32": "float32", "int64": "int64", "i64": "int64",
                 "int32": "int32", "i32": "int32", "bool": "bool"}


def compile_from_torch(module: Any, input_info: InputInfo, *, name: str | None = None,
                       output_names: Sequence[str] | None = None, opset_version: int = 17) -> CompiledModel:
    """Compile a ``torch.nn.Module`` for the NPU.

    ``input_info = [("x", [1, 3, 224, 224], "float32"), ...]`` names the
    inputs with static shapes and dtypes (float32, int64, int32, bool). The
    module is exported with ``torch.onnx.export`` (TorchScript exporter,
    opset 17) and compiled with :func:`compile_from_onnx`; ``output_names``
    names the outputs (default: the exporter's). Needs torch (and onnx)
    installed.
    """
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            "rbln.compile_from_torch needs PyTorch: install torch (and onnx) into this environment "
            "(pip install torch onnx), or export the model to ONNX elsewhere and use rbln.compile_from_onnx"
        ) from e
    shapes = _input_shapes(input_info)
    args = []
    for item, (iname, dims) in zip(input_info, shapes):
        dt = str(item[2]) if len(item) > 2 else "float32"
        dt = dt.replace("torch.", "")
        if dt not in _TORCH_DTYPES:
            raise RBLNValueError(f"input_info: input {iname!r}: dtype must be one of float32, int64, int32, bool, not {dt!r}")
        args.append(torch.zeros(dims, dtype=getattr(torch, _TORCH_DTYPES[dt])))
    buf = io.BytesIO()
    was_training = getattr(module, "training", False)
    if hasattr(module, "eval"):
        module.eval()
    try:
        with torch.no_grad():
            torch.onnx.export(module, tuple(args), buf, input_names=[n for n, _ in shapes],
                              output_names=list(output_names) if output_names else None,
                              opset_version=opset_version, dynamo=False)
    except Exception as e:
        raise RBLNCompileError(f"torch.onnx.export failed: {e}") from e
    finally:
        if was_training and hasattr(module, "train"):
            module.train()
    model_name = name or type(module).__name__
    return _rbln._compile(buf.getvalue(), model_name, shapes)


def generate(model: Any, prompt_ids: Iterable[int], *, device: int = 0, stream: bool = False, **options: Any) -> Any:
    """Generate tokens with a causal decoder on the NPU.

    ``model`` is the decoder (a .rbln path or CompiledModel whose entry
    points follow the decoder convention of docs/python.md) or an
    :class:`rbln.Decoder`. ``options``: ``max_new_tokens``, ``sampling``
    ("greedy", "top-k", "top-p"), ``top_k``, ``top_p``, ``temperature``,
    ``seed``, ``eos_id``, ``prefill``, ``on_token``. Returns a dict
    (``tokens``, ``time_to_first_token_ms``, ``tokens_per_s``,
    ``prefill_tokens``), or with ``stream=True`` an iterator over the new
    tokens as they are chosen.
    """
    dec = model if isinstance(model, Decoder) else Decoder(model, device=device)
    prompt = [int(t) for t in prompt_ids]
    if not stream:
        return dec.generate(prompt, **options)
    if "on_token" in options:
        raise RBLNValueError("stream=True yields the tokens itself; it takes no on_token")
    return _stream_tokens(dec, prompt, options)


def _stream_tokens(dec: Decoder, prompt: list, options: dict):
    """Run the generation on a thread; yield its tokens as they come."""
    import queue

    tokens: queue.Queue = queue.Queue()
    end = object()
    outcome: dict = {}

    def work():
        try:
            outcome.update(dec.generate(prompt, on_token=tokens.put, **options))
        except BaseException as e:  # re-raised in the consumer
            outcome["error"] = e
        finally:
            tokens.put(end)

    worker = threading.Thread(target=work, name="rbln-generate", daemon=True)
    worker.start()
    while (t := tokens.get()) is not end:
        yield t
    worker.join()
    if "error" in outcome:
        raise outcome["error"]


class QuantizedModel:
    """An int8 (QDQ) ONNX model made by :func:`rbln.quantize`.

    ``data``: the model's bytes; ``report``: one dict per quantised layer
    and per model output (``layer``, ``tensor``, ``cosine``, ``max_rel``:
    the largest error over the largest float magnitude), float model vs
    quantised model on the NPU, first calibration sample.
    """

    def __init__(self, data: bytes, report: list):
        self.data = data
        self.report = report

    def save(self, path: Any) -> None:
        with open(os.fspath(path), "wb") as f:
            f.write(self.data)

    def compile(self, input_info: Any = None, *, name: str | None = None) -> CompiledModel:
        """Compile for the NPU (its Conv/MatMul/Gemm on the int8 kernels)."""
        return compile_from_onnx(self.data, input_info, name=name or "quantized")

    def __repr__(self) -> str:
        worst = min((r["cosine"] for r in self.report if r["layer"] != "<output>"), default=None)
        return f"<rbln.QuantizedModel {len(self.data)} bytes, lowest layer cosine {worst}>"


def quantize(model: Any, calibration: Any, *, method: str = "minmax", percentile: float = 99.99,
             reduce_range: bool = False, device: int = 0, report: bool = True) -> QuantizedModel:
    """Post-training int8 quantisation, calibrated on the NPU (rbln-quantize).

    ``model``: a float ONNX model (path, bytes or onnx.ModelProto).
    ``calibration``: a ``.npz`` path, or ``{input name: array}`` with the
    samples stacked on a leading axis (``[N, *input shape]``) or one
    sample. ``method``: ``"minmax"`` or ``"percentile"`` (clip at
    ``percentile`` on each side). ``reduce_range``: 7-bit weights (the
    NPU's fastest exact path). BatchNormalization after a Conv is folded
    first. Raises :class:`rbln.RBLNValueError` for bad calibration data,
    :class:`rbln.RBLNCompileError` for a model that cannot be quantised.
    The GIL is released while it works.
    """
    import tempfile

    import numpy as np

    data, _ = _read_model(model, "quantize")
    if isinstance(calibration, (str, os.PathLike)):
        return _quantize_npz(data, os.fspath(calibration), method, percentile, reduce_range, device, report)
    if not isinstance(calibration, collections.abc.Mapping):
        raise RBLNValueError("calibration: expected a .npz path or {input name: array}")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "calibration.npz")
        np.savez(path, **{str(k): np.ascontiguousarray(v, dtype=np.float32) for k, v in calibration.items()})
        return _quantize_npz(data, path, method, percentile, reduce_range, device, report)


def _quantize_npz(data, path, method, percentile, reduce_range, device, report) -> QuantizedModel:
    out, rows = _rbln._quantize(data, path, method, float(percentile), bool(reduce_range), int(device), bool(report))
    return QuantizedModel(bytes(out), [dict(layer=a, tensor=b, cosine=c, max_rel=d) for a, b, c, d in rows])


__all__ = [
    "QuantizedModel",
    "quantize",
    "Runtime",
    "AsyncRuntime",
    "Task",
    "Request",
    "CompiledModel",
    "Decoder",
    "BatchDecoder",
    "generate",
    "compile_from_onnx",
    "compile_from_tflite",
    "compile_from_torch",
    "device_count",
    "devices",
    "perf_counter_ns",
    *_error_names,
]
