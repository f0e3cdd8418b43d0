"""NVTX ranges that also appear in torch-profiler traces.

    with nvtx_range(f"decode bs={bs} kv={kv} bf16"):
        wrapper.run(q, kv_cache)

One range shows up three ways: as an NVTX push/pop (Nsight Systems, ncu --nvtx-include),
as a ``record_function`` user annotation (torch.profiler Chrome traces, CPU and GPU rows), and
as nothing at all when neither the ``nvtx`` package nor torch is present — scripts need not
check. Names should describe themselves and carry the configuration.
"""
from __future__ import annotations

import sys
from contextlib import ExitStack, contextmanager

try:
    import nvtx as _nvtx  # the NVIDIA `nvtx` package
except Exception:  # pragma: no cover - depends on the machine
    _nvtx = None


def _record_function(name):
    torch = sys.modules.get("torch")  # only when the script already uses torch
    if torch is None:
        return None
    return torch.autograd.profiler.record_function(name)


@contextmanager
def nvtx_range(name: str, color: str | None = None):
    """Mark a region for nsys/ncu (NVTX) and torch.profiler (record_function)."""
    with ExitStack() as stack:
        if _nvtx is not None:
            stack.enter_context(_nvtx.annotate(name, color=color))
        else:
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_available():
                torch.cuda.nvtx.range_push(name)
                stack.callback(torch.cuda.nvtx.range_pop)
        rf = _record_function(name)
        if rf is not None:
            stack.enter_context(rf)
        yield
