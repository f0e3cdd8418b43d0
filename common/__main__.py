"""`python -m common TOOL ...`: the workbook's tools, each a floor's own command line.

    python -m common report [--system S]          refresh the auto blocks of every page (make reports)
    python -m common reference [--write]          the reference run each final page compares with
    python -m common pipeline --system S [...]    the runner behind every 06_full_pipeline.sh
    python -m common pipelines --quick S1 S2 ...  make quick / make all: the systems' pipelines in order
    python -m common jit --system S | --modules M  build the JIT modules a system's steps load
    python -m common ceilings measure | show      this GPU's measured ceilings (the cached record)
    python -m common ncu profile ... | summarize   a command under Nsight Compute, as a kernel table
    python -m common models NAME                  write a dummy-weight model folder
    python -m common noise ...                    run-to-run margins from two runs
    python -m common crossview                    the three systems on the same shapes
"""
import importlib
import sys

TOOLS = {"report": "common.run.steps:report_main", "reference": "common.render.reference:main", "pipeline": "common.run.pipeline:main",
         "pipelines": "common.run.pipelines:main",
         "jit": "common.run.warmup:main", "ceilings": "common.capture.probes:ceilings_main",
         "ncu": "common.tables.kernels:ncu_main", "models": "common.capture.models:main",
         "noise": "common.judge.noise:main", "crossview": "common.render.crossview:main"}


def main() -> None:
    tool = sys.argv[1] if len(sys.argv) > 1 else ""
    if tool not in TOOLS:
        print(__doc__.strip() if tool in ("", "-h", "--help") else
              f"python -m common: unknown tool {tool!r}; one of {', '.join(TOOLS)}", file=sys.stderr if tool else None)
        sys.exit(0 if tool in ("", "-h", "--help") else 2)
    mod, fn = TOOLS[tool].split(":")
    sys.argv = [f"python -m common {tool}", *sys.argv[2:]]
    entry = getattr(importlib.import_module(mod), fn)
    from common.base.checks import run_main
    run_main(entry)


if __name__ == "__main__":
    main()
