"""argparse types that check a value before any GPU work or server start.

    p.add_argument("--batches", type=cli.positive_ints, help="comma-separated, e.g. 1,32,256")
    p.add_argument("--mem-fraction", type=cli.fraction, default=0.8)
    p.add_argument("--model-path", type=cli.model_dir)
    p.add_argument("--variants", type=cli.choices_list("cuda", "tc"), default="cuda,tc")
    args = p.parse_args(argv)
    cli.check_gpus_for(max(tp_sizes))            # after parsing, still before any GPU work

A bad value ends the script at parse time with argparse's usage line and one line saying what is
wrong and what is allowed (exit code 2), e.g.
``error: argument --batches: expected positive integers separated by commas, got 'abc'``.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def _err(msg: str):
    return argparse.ArgumentTypeError(msg)


def _int(text: str, low: int, what: str) -> int:
    try:
        v = int(str(text).strip())
    except ValueError:
        v = None
    if v is None or v < low:
        raise _err(f"expected {what}, got {text!r}")
    return v


def positive_int(text: str) -> int:
    return _int(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _int(text, 0, "an integer >= 0")


def positive_ints(text: str) -> list[int]:
    """'1,32,256' -> [1, 32, 256]; every item a positive integer, at least one."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    try:
        vals = [int(x) for x in items]
    except ValueError:
        vals = None
    if not items or vals is None or any(v < 1 for v in vals):
        raise _err(f"expected positive integers separated by commas, got {text!r}")
    return vals


def _float(text: str, ok, what: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = None
    if v is None or not ok(v):
        raise _err(f"expected {what}, got {text!r}")
    return v


def positive_float(text: str) -> float:
    return _float(text, lambda v: v > 0, "a positive number")


def fraction(text: str) -> float:
    """A fraction in (0, 1] (e.g. --mem-fraction-static)."""
    return _float(text, lambda v: 0 < v <= 1, "a fraction in (0, 1]")


def rates(text: str) -> list[str]:
    """Request rates: positive numbers or 'inf', comma-separated ('4,16,inf')."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    bad = []
    for x in items:
        try:
            if x != "inf" and not float(x) > 0:
                bad.append(x)
        except ValueError:
            bad.append(x)
    if not items or bad:
        raise _err(f"expected request rates (positive numbers or 'inf') separated by commas, got {text!r}")
    return items


def choices_list(*allowed: str):
    """A type for 'a,b' lists whose items must be among ``allowed``."""
    def parse(text: str) -> list[str]:
        items = [x.strip() for x in str(text).split(",") if x.strip()]
        bad = [x for x in items if x not in allowed]
        if not items or bad:
            raise _err(f"unknown value(s) {', '.join(bad) or repr(text)}; choose from {', '.join(allowed)}")
        return items
    parse.__name__ = "list"
    return parse


def model_dir(text: str) -> str:
    """A local model folder with a config.json (real weights are loaded from it)."""
    p = Path(text).expanduser()
    if not p.is_dir():
        raise _err(f"{text!r} is not a folder (give a local model folder with config.json and weights)")
    if not (p / "config.json").is_file():
        raise _err(f"{text!r} has no config.json (is it a Hugging Face model folder?)")
    return str(p)


def preset(text: str) -> str:
    """A dummy-weight architecture preset of common.capture.models."""
    from common.capture.models import PRESETS
    if text not in PRESETS:
        raise _err(f"unknown model preset {text!r}; choose from {', '.join(sorted(PRESETS))}")
    return text


def port(text: str) -> int:
    v = positive_int(text)
    if v > 65535:
        raise _err(f"expected a TCP port in 1..65535, got {text!r}")
    return v


def check_gpus_for(n: int, what: str = "this run") -> int:
    """SetupError unless ``n`` GPUs are visible (NVML / nvidia-smi; no torch import); returns the count."""
    from common.base.checks import SetupError
    from common.capture.gpu import gpus
    have = len(gpus())
    if have == 0:
        raise SetupError("No NVIDIA GPU visible (nvidia-smi / NVML found none). These experiments need an NVIDIA "
                         "GPU (A100/H100/H200 or similar).")
    if n > have:
        raise SetupError(f"{what} needs {n} GPUs; {have} visible (CUDA_VISIBLE_DEVICES limits what is visible).")
    return have


def parser(script_file, doc: str, quick: str | None = None, out: bool = True, prog: str | None = None):
    """The parser every numbered script starts from: its docstring as description (first paragraph) and
    epilog (the whole usage doc), ``--quick`` with what it trims, ``--out`` (the results folder, by default
    ``<system>/results/<stem>``)."""
    from pathlib import Path
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc)
    if quick is not None:
        p.add_argument("--quick", action="store_true", help=quick)
    if out:
        script = Path(script_file).resolve()
        p.add_argument("--out", default=None,
                       help=f"results folder (default {script.parent.parent.name}/results/{script.stem})")
    return p
