"""Custom kernels in Triton, run on the NPU's tile engine.

    import numpy as np, rbln.triton, triton, triton.language as tl

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    kernel = rbln.triton.compile(add, signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"},
                                 constexprs={"BLOCK": 256}, grid=lambda meta: (triton.cdiv(1000, meta["BLOCK"]),))
    kernel(x, y, out, 1000)          # writes `out` in place, like a Triton launch

Triton's frontend turns the kernel into TTIR (:mod:`rbln._ttir`, no GPU
needed); ``rbln-compile`` lowers that to a tile program and wraps one
launch of it in a ``.rbln`` model (pointer arguments are its inputs, the
buffers the kernel stores to its outputs). Each distinct launch (array
shapes, scalar values, grid) is compiled once and kept with its runtime.

The rules are vLLM-RBLN's: loops use ``tl.static_range`` with constexpr
bounds (``tl.range`` makes an ``scf.for`` the NPU refuses), reductions
are along one axis, tiles are f32 / i32 / i64 / i1 of at most 2^20
elements. A load or store outside the arrays a kernel was given faults on
the device (nothing is written) and raises :class:`rbln.RBLNDeviceError`
naming the kernel.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence, Union

import numpy as np

from . import _rbln
from ._errors import RBLNDeviceError, RBLNError, RBLNTypeError, RBLNValueError
from ._ttir import ttir as _ttir_text

__all__ = ["compile", "Kernel"]

# Triton pointer types and the numpy dtypes they take.
_POINTER_DTYPES = {"*fp32": np.float32, "*i32": np.int32, "*i64": np.int64, "*i1": np.bool_}
_SCALARS = {"i32": "int", "i64": "int", "i1": "int", "fp32": "float"}

Grid = Union[Sequence[int], Callable[[dict], Sequence[int]]]


def compile(fn, *, signature: dict, constexprs: dict | None = None, grid: Grid = (1,), device: int = 0) -> "Kernel":
    """Compile ``fn`` (a ``@triton.jit`` function) for the NPU.

    ``signature`` maps the kernel's run-time parameters to Triton types:
    pointers ``"*fp32"``, ``"*i32"``, ``"*i64"``, ``"*i1"`` and scalars
    ``"i32"``, ``"i64"``, ``"fp32"``. ``constexprs`` gives every
    ``tl.constexpr`` parameter's value. ``grid`` is the launch grid (1 to
    3 program counts) or a function of the constexprs returning it
    (Triton's ``lambda meta: ...``); ``kernel[grid](...)`` overrides it for
    one call.
    """
    constexprs = dict(constexprs or {})
    params = _parameters(fn)
    for name in signature:
        if name not in params:
            raise RBLNValueError(f"signature names {name!r}, which is not a parameter of {_name(fn)}")
        if signature[name] not in _POINTER_DTYPES and signature[name] not in _SCALARS:
            raise RBLNTypeError(f"parameter {name}: type {signature[name]!r} is not supported "
                                f"(pointers {', '.join(_POINTER_DTYPES)}; scalars {', '.join(_SCALARS)})")
    missing = [p for p in params if p not in signature and p not in constexprs]
    if missing:
        raise RBLNValueError(f"{_name(fn)}: parameters {missing} are neither in the signature nor constexprs")
    full = {p: signature.get(p, "constexpr") for p in params}
    try:
        text = _ttir_text(fn, full, constexprs)
    except Exception as e:  # triton's frontend: a CompilationError and the like
        raise RBLNError(f"triton could not compile {_name(fn)} to TTIR: {e}") from e
    runtime_params = [p for p in params if p in signature]
    return Kernel(_name(fn), text, [(p, signature[p]) for p in runtime_params], constexprs, grid, device)


class Kernel:
    """A compiled Triton kernel: ``kernel(*args)`` runs it on the NPU.

    Arguments follow the signature's parameters in the function's order:
    numpy arrays (C-contiguous, of the pointer's dtype) for pointers,
    numbers for scalars. Arrays the kernel stores to are updated in place.
    """

    def __init__(self, name: str, ttir: str, params: list, constexprs: dict, grid: Grid, device: int):
        self.name = name
        #: The TTIR text triton produced (what rbln-compile lowers).
        self.ttir = ttir
        self._params = params
        self._constexprs = constexprs
        self._grid = grid
        self._device = device
        self._launches: dict = {}

    def __repr__(self) -> str:
        args = ", ".join(f"{n}: {t}" for n, t in self._params)
        return f"<rbln.triton.Kernel {self.name}({args})>"

    def __getitem__(self, grid: Grid) -> Callable[..., None]:
        return lambda *args: self._launch(grid, args)

    def __call__(self, *args: Any) -> None:
        self._launch(self._grid, args)

    def compiled(self, *args: Any, grid: Grid | None = None) -> "_rbln.CompiledModel":
        """The ``.rbln`` model of one launch with these arguments (save it,
        inspect it, or run it with :class:`rbln.Runtime`)."""
        return self._prepare(self._grid if grid is None else grid, args)[0]

    def onnx_attributes(self, *scalars: Any, grid: Grid | None = None) -> dict:
        """The attributes of an ONNX node running this kernel as a custom
        operator of the ``rbln.triton`` domain (docs/compiler.md), for
        ``onnx.helper.make_node(name, inputs, outputs, domain="rbln.triton",
        **kernel.onnx_attributes(...))``: the node's inputs then its outputs
        bind the kernel's pointer arguments in order, ``scalars`` its
        scalar arguments in order."""
        kinds = [_SCALARS[t] for _, t in self._params if t in _SCALARS]
        if len(scalars) != len(kinds):
            raise RBLNTypeError(f"kernel {self.name} takes {len(kinds)} scalar arguments, got {len(scalars)}")
        ints, floats = [], []
        for (name, _), kind, v in zip([p for p in self._params if p[1] in _SCALARS], kinds, scalars):
            if kind == "int":
                if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                    raise RBLNTypeError(f"kernel {self.name}: argument {name} takes an integer, got {v!r}")
                ints.append(int(v))
            else:
                floats.append(float(v))
        g = self._grid3(self._grid if grid is None else grid)
        while len(g) > 1 and g[-1] == 1:
            g = g[:-1]
        attrs = {"ttir": self.ttir, "kernel": self.name, "grid": list(g)}
        if ints:
            attrs["int_args"] = ints
        if floats:
            attrs["float_args"] = floats
        return attrs

    def _grid3(self, grid: Grid) -> tuple:
        g = grid(dict(self._constexprs)) if callable(grid) else grid
        g = tuple(int(x) for x in (g if isinstance(g, (tuple, list)) else (g,)))
        if not 1 <= len(g) <= 3 or any(x < 1 for x in g):
            raise RBLNValueError(f"kernel {self.name}: grid {g} must be 1 to 3 program counts, each >= 1")
        return g + (1,) * (3 - len(g))

    def _prepare(self, grid: Grid, args: Sequence[Any]):
        if len(args) != len(self._params):
            names = ", ".join(n for n, _ in self._params)
            raise RBLNTypeError(f"kernel {self.name} takes {len(self._params)} arguments ({names}), got {len(args)}")
        bindings, arrays, key = [], [], [self._grid3(grid)]
        for (name, ty), a in zip(self._params, args):
            if ty in _POINTER_DTYPES:
                want = np.dtype(_POINTER_DTYPES[ty])
                if not isinstance(a, np.ndarray):
                    raise RBLNTypeError(f"kernel {self.name}: argument {name} ({ty}) takes a numpy array, got {type(a).__name__}")
                if a.dtype != want:
                    raise RBLNTypeError(f"kernel {self.name}: argument {name} ({ty}) takes {want} elements, got {a.dtype}")
                if not a.flags.c_contiguous:
                    raise RBLNValueError(f"kernel {self.name}: argument {name} must be C-contiguous")
                bindings.append(("tensor", name, list(a.shape)))
                arrays.append((name, a))
                key.append(a.shape)
            else:
                if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, float, np.integer, np.floating)):
                    raise RBLNTypeError(f"kernel {self.name}: argument {name} ({ty}) takes a number, got {type(a).__name__}")
                kind = _SCALARS[ty]
                if kind == "int" and not isinstance(a, (int, np.integer)):
                    raise RBLNTypeError(f"kernel {self.name}: argument {name} ({ty}) takes an integer, got {a!r}")
                v = int(a) if kind == "int" else float(a)
                bindings.append((kind, v))
                key.append(v)
        key = tuple(key)
        entry = self._launches.get(key)
        if entry is None:
            model = _rbln._compile_kernel(self.ttir, self.name, key[0], bindings)
            entry = (model, None)
            self._launches[key] = entry
        return entry[0], key, arrays

    def _launch(self, grid: Grid, args: Sequence[Any]) -> None:
        model, key, arrays = self._prepare(grid, args)
        loaded = self._launches[key][1]
        if loaded is None:
            # Once per launch: the runtime, and the arguments its outputs
            # (NAME.out, one per stored buffer) go back to.
            stored = [o["name"][: -len(".out")] for o in model.inspect()["outputs"]]
            loaded = (model.create_runtime(device=self._device), stored)
            self._launches[key] = (model, loaded)
        rt, stored = loaded
        try:
            outs = rt.run(*(a for _, a in arrays))
        except RBLNDeviceError as e:
            raise type(e)(f"triton kernel {self.name!r} failed on the NPU: {e}") from e
        if len(stored) == 1:
            outs = [outs]
        by_name = dict(arrays)
        for name, out in zip(stored, outs):
            target = by_name[name]
            np.copyto(target, np.asarray(out).reshape(target.shape))


def _parameters(fn) -> list:
    """The parameter names of a ``triton.jit`` function (or a plain one)."""
    if hasattr(fn, "arg_names"):
        return list(fn.arg_names)
    return list(inspect.signature(getattr(fn, "fn", fn)).parameters)


def _name(fn) -> str:
    return getattr(getattr(fn, "fn", fn), "__name__", "kernel")
