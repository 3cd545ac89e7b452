"""Triton IR (TTIR) of a ``@triton.jit`` function, without a GPU.

Triton's frontend builds the kernel's IR and the CUDA backend's TTIR pass
list (inliner, canonicalizer, combine, CSE, loop unrolling, ...) runs on
it; nothing GPU-specific (no LLVM, no ptxas) runs, so this works on a
CPU-only machine (``../shared/notes/triton.md``). This module needs only
triton (not the rest of rbln): ``tests/triton/kernels.py`` loads it by
path in the host's triton venv.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def ttir(fn, signature: dict, constexprs: dict) -> str:
    """The TTIR text of ``fn`` (a ``triton.jit`` function), with source
    locations.

    ``signature`` maps every parameter to its Triton type (``"*fp32"``,
    ``"i32"``, ``"fp32"``, ...; ``"constexpr"`` for the constexprs), and
    ``constexprs`` gives the constexprs' values.
    """
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget, Language
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    target = GPUTarget("cuda", 80, 32)
    backend = make_backend(target)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = ASTSource(fn=fn, signature=signature, constexprs=constexprs).make_ir(
        target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)
    stages: dict = {}
    backend.add_stages(stages, options, Language.TRITON)
    # `str()` keeps the locations (`loc(...)`), so that rbln's errors can
    # name the kernel's source line.
    return stages["ttir"](module, {}).str()
