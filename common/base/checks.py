"""One-line errors instead of tracebacks when the machine is not ready or a script fails.

A numbered script wraps its ``main`` with :func:`run_main`; anything below raises
:class:`SetupError` with a message that says what is missing and how to get it::

    def main(argv=None):
        args = parse_args(argv)
        torch, nvtx = require_modules(("torch", "pip install -r requirements.txt"), ("nvtx", None))
        require_gpu(torch)
        ...

    if __name__ == "__main__":
        run_main(main)

Exit codes: 0 ok, 1 the experiment itself failed (recorded as failed), 2 the machine is
not ready (no GPU, package, tool, permission, disk space; an ``import`` of a package that is not
installed, anywhere in ``main``, is the same [setup] line with its install command), 130
interrupted by Ctrl-C, 143 stopped by SIGTERM (128 + the signal: SIGTERM and SIGHUP raise
:class:`Interrupted` while ``main`` runs, so a killed script records its run as interrupted like
Ctrl-C does). The traceback of a failure goes to
a file of its own: the failed run's ``error.txt`` when a results.Run was active, else
``$HANDS_ON_CACHE/errors/<stamp>-<pid>.txt`` (default ``~/.cache/hands-on``; the last 20 kept).
``HANDS_ON_DEBUG=1`` also prints it.
"""
from __future__ import annotations

import datetime as _dt
import importlib
import os
import shutil
import signal
import sys
import threading
import traceback
from pathlib import Path

EXIT_FAILED, EXIT_SETUP, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 130, 143
KEEP_ERRORS = 20
_ACTIVE = False   # True while run_main runs main(): results.Run leaves the one-line message to it


class SetupError(RuntimeError):
    """The machine lacks something the script needs; the message says what and how to fix it."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM / SIGHUP while run_main runs ``main``: handled like Ctrl-C, exit 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


def require_module(name: str, pip: str | None = None):
    """Import and return a module, or raise SetupError naming the pip command."""
    try:
        return importlib.import_module(name)
    except ImportError as e:  # also catches broken installs (missing .so, bad pins)
        hint = pip or f"pip install {name.split('.')[0]}"
        raise SetupError(f"Python package '{name}' is not importable ({e.__class__.__name__}: "
                         f"{str(e).splitlines()[0][:160]}). Install it: {hint}") from None


# pip names of the packages whose import name differs (or that come with the pinned stack)
PIP_NAMES = {"torch": "-r requirements.txt", "sglang": "-r requirements.txt", "flashinfer": "-r requirements.txt",
             "sgl_kernel": "-r requirements.txt", "cupti": "cupti-python", "pynvml": "nvidia-ml-py",
             "yaml": "pyyaml", "PIL": "pillow", "tvm_ffi": "apache-tvm-ffi"}


def missing_package(e: BaseException) -> SetupError | None:
    """The SetupError for an ``import`` of a package that is not installed (a ModuleNotFoundError
    raised anywhere in a script, e.g. ``import pandas`` inside a function), or None. A module of the
    workbook itself (common.*, _fi, _sglang, ...) that fails to import is a bug, not a missing package."""
    name = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
    top = (name or "").split(".")[0]
    if not top or top == "common" or top.startswith("_"):
        return None
    return SetupError(f"Python package '{top}' is not importable ({e.__class__.__name__}: {_first_line(e)[:160]}). "
                      f"Install it: pip install {PIP_NAMES.get(top, top)}")


def require_modules(*specs):
    """``require_modules(("pandas", None), ("matplotlib", "pip install matplotlib"))``: the modules in
    order, or one SetupError naming every missing one and its install command."""
    mods, missing = [], []
    for name, pip in specs:
        try:
            mods.append(require_module(name, pip))
        except SetupError:
            missing.append(f"'{name}' ({pip or 'pip install ' + name.split('.')[0]})")
    if missing:
        raise SetupError(f"Python package(s) not importable: {', '.join(missing)}")
    return mods


def require_gpu(torch=None, min_count: int = 1):
    """Raise SetupError unless torch sees at least ``min_count`` CUDA GPUs; return the count."""
    torch = torch or require_module("torch", "pip install -r requirements.txt")
    if not shutil.which("nvidia-smi") and not torch.cuda.is_available():
        raise SetupError("No NVIDIA driver found (nvidia-smi missing and torch sees no CUDA device). "
                         "These experiments need an NVIDIA GPU (A100/H100/H200 or similar).")
    if not torch.cuda.is_available():
        if not getattr(torch.version, "cuda", None):    # e.g. torch from the CPU wheel index
            raise SetupError(f"torch {torch.__version__} is a CPU-only build (no CUDA). Install the CUDA build: "
                             "pip install -r requirements.txt")
        raise SetupError(f"torch {torch.__version__} sees no CUDA device (torch built for CUDA "
                         f"{torch.version.cuda}). Check the driver with nvidia-smi.")
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


def cache_dir() -> Path:
    """``$HANDS_ON_CACHE`` or ``~/.cache/hands-on``."""
    return Path(os.environ.get("HANDS_ON_CACHE", Path.home() / ".cache" / "hands-on"))


def cache_folder(*parts: str) -> Path:
    """``<cache>/<parts...>``, created; a SetupError naming it and HANDS_ON_CACHE when it cannot be written
    (a read-only cache folder or HOME, a file in its place). For what a run must write there (pidfiles,
    model folders, measured ceilings); reading needs no check."""
    d = cache_dir().joinpath(*parts)
    try:
        d.mkdir(parents=True, exist_ok=True)
        if not os.access(d, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as e:
        raise SetupError(f"cache folder {d} is not writable ([Errno {e.errno}] {e.strerror or e}); set "
                         "HANDS_ON_CACHE to a writable folder") from None
    return d


def _can_make(d: Path) -> bool:
    """Whether folder ``d`` exists writable, or could be created (its nearest existing ancestor is a writable folder)."""
    p = d
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return os.path.isdir(p) and os.access(p, os.W_OK | os.X_OK)


def matplotlib_home() -> str | None:
    """Point MPLCONFIGDIR at a writable folder where matplotlib's own (under HOME: ~/.config/matplotlib and
    ~/.cache/matplotlib on Linux) cannot be written, before anything imports matplotlib (run_main does it first):
    else matplotlib prints two warnings of its own before the run's one line (a read-only HOME, a HOME that is not a
    folder). The folder: <cache>/matplotlib where the cache can be written, else hands-on-matplotlib-<uid> in the
    temporary folder (kept: its font cache makes the next import fast). Returns it, or None when nothing was needed."""
    if os.environ.get("MPLCONFIGDIR"):
        return None
    try:
        home = Path.home()
    except (RuntimeError, KeyError):
        home = Path("/nonexistent")
    if sys.platform.startswith(("linux", "freebsd")):
        own = [Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "matplotlib",
               Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "matplotlib"]
    else:
        own = [home / ".matplotlib"]
    if all(_can_make(d) for d in own):
        return None
    import stat
    import tempfile
    uid = os.getuid() if hasattr(os, "getuid") else 0
    for d in (cache_dir() / "matplotlib", Path(tempfile.gettempdir()) / f"hands-on-matplotlib-{uid}"):
        try:
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            st = os.lstat(d)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and os.access(d, os.W_OK):   # never another user's folder
            os.environ["MPLCONFIGDIR"] = str(d)
            return str(d)
    return None


def _writes(d: Path) -> bool:
    """Whether a file can really be created in folder ``d`` (a read-only mount refuses even root, whom the mode
    bits let through): one is made and removed."""
    import tempfile
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".hands-on-probe-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(tmp)
    return True


def bytecode_home(module: str = "torch") -> str | None:
    """Point PYTHONPYCACHEPREFIX at <cache>/pycache for the processes this one starts, where ``module`` (torch) has no
    compiled bytecode beside its files and Python cannot write any there: a read-only install, or
    PYTHONDONTWRITEBYTECODE set (then unset for them). Else every fresh process compiles torch and the rest again: a
    profiled fresh step on a lent H200 compiled 1,944 modules in 6.8 s (2026-11-28). Imports nothing of ``module``.
    Returns the note to print once, None when nothing was needed (PYTHONPYCACHEPREFIX already set, HANDS_ON_PYCACHE=0,
    the bytecode there, or Python able to write it on first import)."""
    import importlib.util
    if os.environ.get("PYTHONPYCACHEPREFIX") or os.environ.get("HANDS_ON_PYCACHE") == "0":
        return None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not (spec.origin or "").endswith(".py"):
        return None
    pyc = Path(importlib.util.cache_from_source(spec.origin))
    if pyc.exists():
        return None
    dont = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    if not dont and _writes(pyc.parent if pyc.parent.is_dir() else pyc.parent.parent):
        return None                                   # the first import writes it there
    try:
        d = cache_folder("pycache")
    except SetupError:
        return None
    os.environ["PYTHONPYCACHEPREFIX"] = str(d)
    if dont:
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    why = "PYTHONDONTWRITEBYTECODE is set" if dont else f"{pyc.parent.parent} cannot be written"
    return (f"note: {module} has no compiled bytecode beside its files and {why}, so every fresh Python would compile "
            f"it again; the processes of this run keep theirs in {d} (PYTHONPYCACHEPREFIX"
            f"{', PYTHONDONTWRITEBYTECODE unset for them' if dont else ''}; HANDS_ON_PYCACHE=0 turns this off)")


def save_traceback(exc: BaseException) -> Path | None:
    """Write the traceback of ``exc`` to ``<cache>/errors/<stamp>-<pid>.txt`` (the last KEEP_ERRORS
    kept); its path, or None when it cannot be written."""
    d = cache_dir() / "errors"
    p = d / f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S-%f')}-{os.getpid()}.txt"
    try:
        d.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{' '.join(sys.argv)}\n"
                     + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        for old in sorted(d.glob("*.txt"))[:-KEEP_ERRORS]:
            old.unlink(missing_ok=True)
    except OSError:
        return None
    return p


def in_run_main() -> bool:
    """True while :func:`run_main` runs a ``main`` (it prints the one line for any failure)."""
    return _ACTIVE


MAX_LINE = 1000    # the one line keeps its paths whole (a record's folder is its last word)


def _first_line(e: BaseException) -> str:
    s = str(e)
    return s.splitlines()[0][:MAX_LINE] if s else ""


def _install_signal_handlers() -> dict:
    """SIGTERM / SIGHUP raise Interrupted in the main thread; returns the handlers to restore."""
    old: dict = {}
    if threading.current_thread() is not threading.main_thread():
        return old
    from common import interrupted_at_start
    # the imports are done: Ctrl-C raises again. Also where the script started with SIGINT ignored (a background job
    # of a non-interactive shell, `nohup ... &`): `kill -INT` then stops it as Ctrl-C would, as the pipeline does
    if signal.getsignal(signal.SIGINT) in (interrupted_at_start, signal.SIG_IGN):
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def on_signal(signum, frame):
        raise Interrupted(signum)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(sig) in (signal.SIG_DFL, None):   # an ignored SIGHUP (nohup) stays ignored
                old[sig] = signal.signal(sig, on_signal)
        except (ValueError, OSError):
            pass
    return old


def _outcome(e: BaseException) -> tuple[str, int]:
    """The one line and the exit code for an exception that ended ``main``."""
    e = missing_package(e) or e
    if isinstance(e, SetupError):
        return f"[setup] {_first_line(e)}", EXIT_SETUP
    if isinstance(e, KeyboardInterrupt):
        signum = getattr(e, "signum", signal.SIGINT)
        how = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        kept = getattr(e, "kept_in", None)
        return (f"[interrupted] stopped by {how}; earlier results were left as they were"
                + (f" (this run kept in {kept})" if kept else "") + "."), 128 + int(signum)
    where = getattr(e, "error_file", None) or save_traceback(e)
    if os.environ.get("HANDS_ON_DEBUG"):
        traceback.print_exception(type(e), e, e.__traceback__)
    text = str(e)
    if getattr(e, "ran_in", None) and getattr(e, "kept_in", None):   # e.g. a server log: where it is now
        text = text.replace(str(e.ran_in), str(e.kept_in))
    msg = text.splitlines()[0][:MAX_LINE] if text else ""
    return (f"[failed] {e.__class__.__name__}: {msg}"
            + (f" (traceback: {where})" if where else "")), EXIT_FAILED


def run_main(main, argv=None) -> None:
    """Run ``main(argv)`` and turn known failures into one line and an exit code (module docstring)."""
    global _ACTIVE
    matplotlib_home()
    old = _install_signal_handlers()
    _ACTIVE = True
    try:
        rc = main(argv)
        line = None
    except (Exception, KeyboardInterrupt) as e:  # the experiment failed: one line, the traceback in a file
        line, rc = _outcome(e)
    finally:
        _ACTIVE = False
        for sig, h in old.items():
            signal.signal(sig, h)
    if line:
        print(line, file=sys.stderr)
    sys.exit(rc or 0)


