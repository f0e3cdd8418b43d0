"""One-line errors instead of tracebacks when the machine is not ready.

A numbered script wraps its ``main`` with :func:`run_main`; anything below raises
:class:`SetupError` with a message that says what is missing and how to get it::

    def main(argv=None):
        args = parse_args(argv)
        torch = require_module("torch", "pip install -r requirements.txt")
        require_gpu(torch)
        ...

    if __name__ == "__main__":
        run_main(main)

Exit codes: 0 ok, 1 the experiment itself failed (recorded as failed), 2 the machine is
not ready (no GPU, package, tool or permission), 130 interrupted.
"""
from __future__ import annotations

import importlib
import shutil
import sys
import traceback

EXIT_FAILED, EXIT_SETUP, EXIT_INTERRUPTED = 1, 2, 130


class SetupError(RuntimeError):
    """The machine lacks something the script needs; the message says what and how to fix it."""


def require_module(name: str, pip: str | None = None):
    """Import and return a module, or raise SetupError naming the pip command."""
    try:
        return importlib.import_module(name)
    except ImportError as e:  # also catches broken installs (missing .so, bad pins)
        hint = pip or f"pip install {name.split('.')[0]}"
        raise SetupError(f"Python package '{name}' is not importable ({e.__class__.__name__}: "
                         f"{str(e).splitlines()[0][:160]}). Install it: {hint}") from None


def require_gpu(torch=None, min_count: int = 1):
    """Raise SetupError unless torch sees at least ``min_count`` CUDA GPUs; return the count."""
    torch = torch or require_module("torch", "pip install -r requirements.txt")
    if not shutil.which("nvidia-smi") and not torch.cuda.is_available():
        raise SetupError("No NVIDIA driver found (nvidia-smi missing and torch sees no CUDA device). "
                         "These experiments need an NVIDIA GPU (A100/H100/H200 or similar).")
    if not torch.cuda.is_available():
        raise SetupError(f"torch {torch.__version__} sees no CUDA device (torch built for CUDA "
                         f"{torch.version.cuda}). Check the driver with nvidia-smi and that torch is a CUDA build.")
    n = torch.cuda.device_count()
    if n < min_count:
        raise SetupError(f"This experiment needs {min_count} GPUs; {n} visible "
                         f"(CUDA_VISIBLE_DEVICES limits what is visible).")
    return n


def require_tool(name: str, hint: str) -> str:
    """Return the path of an executable on PATH, or raise SetupError with ``hint``."""
    path = shutil.which(name)
    if not path:
        raise SetupError(f"'{name}' is not on PATH. {hint}")
    return path


def run_main(main, argv=None) -> None:
    """Run ``main(argv)`` and turn known failures into one line and an exit code."""
    try:
        rc = main(argv)
    except SetupError as e:
        print(f"[setup] {e}", file=sys.stderr)
        sys.exit(EXIT_SETUP)
    except KeyboardInterrupt:
        print("[interrupted] stopped by Ctrl-C; earlier results were left as they were.", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as e:  # the experiment failed: one line here, the traceback kept in a file
        import os
        from pathlib import Path
        where = Path(os.environ.get("HANDS_ON_CACHE", Path.home() / ".cache" / "hands-on")) / "last-error.txt"
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_text(f"{' '.join(sys.argv)}\n{traceback.format_exc()}")
        except OSError:
            where = None
        print(f"[failed] {e.__class__.__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
              + (f" (traceback: {where})" if where else ""), file=sys.stderr)
        if os.environ.get("HANDS_ON_DEBUG"):
            traceback.print_exc()
        sys.exit(EXIT_FAILED)
    sys.exit(rc or 0)


def profilers(probe: bool = True) -> dict:
    """Which profilers work here: ncu (and whether it may read the GPU counters), nsys, torch.profiler.

    With ``probe`` ncu profiles one tiny torch kernel (~10 s) to test the counter permission.
    """
    import os
    import subprocess
    out: dict = {}
    ncu = shutil.which(os.environ.get("NCU", "ncu"))
    out["ncu"] = {"path": ncu}
    if ncu:
        v = subprocess.run([ncu, "--version"], capture_output=True, text=True)
        out["ncu"]["version"] = (v.stdout.strip().splitlines() or ["?"])[-1]
        if probe:
            app = [sys.executable, "-c", "import torch; x=torch.ones(1024, device='cuda'); (x*2).sum().item()"]
            try:
                p = subprocess.run([ncu, "--metrics", "gpu__time_duration.sum", "--kernel-name", "regex:elementwise",
                                    "--launch-count", "1", *app], capture_output=True, text=True, timeout=180)
                text = p.stdout + p.stderr
                out["ncu"]["counters"] = ("permission denied (ERR_NVGPUCTRPERM)" if "ERR_NVGPUCTRPERM" in text
                                          else "ok" if "gpu__time_duration.sum" in text else
                                          f"no result (rc={p.returncode})")
            except subprocess.TimeoutExpired:
                out["ncu"]["counters"] = "probe timed out"
    from . import nsys
    exe = nsys.find()
    out["nsys"] = {"path": exe, "version": nsys.version(exe) if exe else None,
                   "fallback": None if exe else "torch.profiler (Chrome trace)"}
    try:
        import torch  # noqa: F401
        out["torch_profiler"] = {"available": True}
    except ImportError:
        out["torch_profiler"] = {"available": False}
    return out
