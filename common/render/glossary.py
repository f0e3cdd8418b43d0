"""The words the reports use, written from the code that computes them (GLOSSARY.md's blocks).

    python -m common report          # refreshes GLOSSARY.md with the other pages
    render("columns")                # one section as Markdown: columns | stalls | rates | verdicts | times

Each section is rendered from the one place the meaning lives: the kernel table's declaration
(common.tables.kernels), the warp-stall table (common.judge.bounds.STALL_MEANING), the ceilings
(common.capture.ceilings), the verdict rule with its run-to-run margins and the GPU models that measured them
(common.judge.verdicts, common.judge.noise, common.base.stats). Change a meaning there and `make reports`
changes the glossary with it.
"""
from __future__ import annotations

from common.judge import bounds

SECTIONS = ("times", "rates", "columns", "stalls", "occupancy", "verdicts")


def _table(rows: list[dict], cols: list[str]) -> str:
    head = "| " + " | ".join(cols) + " |\n|" + "|".join("---" for _ in cols) + "|\n"
    return head + "".join("| " + " | ".join(str(r.get(c, "")).replace("|", "\\|") for c in cols) + " |\n" for r in rows)


def _times() -> str:
    return _table([
        {"word": "kernel time", "meaning": "the sum of the durations of a set of kernels as the GPU ran them (torch "
         "profiler / CUPTI timestamps): no launch latency, no idle gap between kernels"},
        {"word": "ncu time", "meaning": "one kernel's duration as Nsight Compute measured it while replaying it "
         "(its own clocks and caches setting, named on the page)"},
        {"word": "step span", "meaning": "first kernel start to last kernel end of one scheduler step on the GPU: "
         "kernel time plus the GPU's idle gaps inside the step"},
        {"word": "GPU busy", "meaning": "kernel time / step span: the share of the span in which a kernel ran"},
        {"word": "wall time", "meaning": "a clock on the CPU (time.time) around something, everything included"},
        {"word": "TTFT, ITL", "meaning": "time to first token and inter-token latency, wall time at the client: "
         "from sending the request to the first streamed token, and between streamed tokens"},
    ], ["word", "meaning"])


def _rates() -> str:
    from common.capture import ceilings
    from common.tables import kernels
    rows = [
        {"word": "effective bandwidth", "meaning": kernels.COLUMNS["eff_tb_s"].doc},
        {"word": "DRAM bandwidth", "meaning": kernels.COLUMNS["dram_tb_s"].doc},
        {"word": "DRAM %", "meaning": kernels.COLUMNS["dram_pct"].doc},
        {"word": "weight streaming %", "meaning": kernels.COLUMNS["stream_pct"].doc},
        {"word": "L2-resident", "meaning": kernels.COLUMNS["l2_resident"].doc},
        {"word": "working set", "meaning": f"the bytes a call touches; effective bandwidth is compared with a DRAM "
         f"ceiling only when the working set is at least {ceilings.STREAM_FACTOR} x the L2"},
        {"word": "bf16 ceiling", "meaning": "this GPU's best measured bf16 GEMM rate (TFLOP/s) over a sweep of shapes, "
         "each started off the power cap, with the SM clock it ran at"},
    ]
    kinds = ", ".join(f"{k} ({share})" for k, share in (("read", "writes < 10% of its bytes"),
                                                          ("mixed", "two reads per write"), ("copy", "one read per write"),
                                                          ("write", "reads < 10%")))
    rows.append({"word": "DRAM ceiling", "meaning": f"this GPU's measured DRAM bandwidth for one kind of traffic: "
                 f"{kinds}; a kernel is divided by the one of its own traffic (limits "
                 f"{', '.join(f'{lim:g}' for lim, _ in ceilings.KIND_BY_WRITE_SHARE[:-1])} of the write share)"})
    rows.append({"word": "TC, tensor %", "meaning": kernels.COLUMNS["tensor_pct"].doc})
    rows.append({"word": "SOL", "meaning": "speed of light: ncu's throughput as % of its theoretical peak "
                 "(DRAM SOL, SM SOL); the workbook compares them only to classify a kernel (common.judge.bounds.bound)"})
    return _table(rows, ["word", "meaning"])


def _columns() -> str:
    from common.tables import kernels
    return _table(kernels.glossary_rows(), ["column", "unit", "stage", "meaning"])


def _stalls() -> str:
    from common.tables import kernels
    rows = [{"stall": k, "meaning": v, "memory stall": "yes" if k in bounds.MEMORY_STALLS else ""}
            for k, v in bounds.STALL_MEANING.items()]
    return (_table(rows, ["stall", "meaning", "memory stall"]) +
            f"\nA stall share is the share of a kernel's warp-stall samples with that reason. It is called a "
            f"bottleneck only when the pipe it waits on is not saturated: stalls on the tensor pipe (gmma, wait, "
            f"math_pipe_throttle) with the tensor pipe at or above {kernels.SATURATED:g}% busy are the pipe at work; "
            f"memory stalls with DRAM at or above {kernels.SATURATED:g}% of its ceiling are waits on saturated DRAM.\n")


def _occupancy() -> str:
    from common.tables import kernels
    rows = [{"word": w, "meaning": kernels.COLUMNS[c].doc} for w, c in (
        ("achieved occupancy", "occupancy_pct"), ("theoretical occupancy", "theoretical_occupancy_pct"),
        ("CTAs per SM", "ctas_per_sm"), ("limiter", "limiter"), ("warps per CTA", "warps_per_cta"),
        ("waves", "waves"), ("one CTA per SM by design", "one_cta_per_sm"))]
    rows.append({"word": "CTA", "meaning": "cooperative thread array, a thread block: the unit a kernel launch is cut "
                 "into, placed on one SM"})
    return _table(rows, ["word", "meaning"])


def _verdicts() -> str:
    from common.base.stats import BOOTSTRAP_FROM
    from common.judge import noise, verdicts
    borrowed = verdicts._margin_source({"borrowed": True, "model": "MODEL", "runs": "RUNS"})
    return _table([
        {"word": "hypothesis", "meaning": "what the plan expected, with the quantity it is judged on, the range that "
         "confirms it and where that range comes from"},
        {"word": "confirmed", "meaning": "the whole interval of the measurement lies inside the range and, where the "
         "quantity has a run-to-run margin, its point moved by that margin stays inside too"},
        {"word": "refuted", "meaning": "the whole interval lies outside the range and, with a run-to-run margin, its "
         "point moved by that margin stays outside too"},
        {"word": "inconclusive", "meaning": "the interval crosses a bound of the range, the point moved by its "
         "run-to-run margin would cross one (\"within the run-to-run noise\"), there were fewer than 3 repetitions, "
         "or a premise failed"},
        {"word": "run-to-run margin", "meaning": "how far a judged quantity's point moved between two runs of the same "
         f"experiments on one GPU model, the largest move seen, kept per GPU model in {noise._rel(noise.NOISE_FILE)} "
         "(python -m common noise A B --write); a verdict names the runs it comes from. GPU models with margins of "
         f"their own: {', '.join(noise.models()) or 'none yet'}"},
        {"word": "borrowed margin", "meaning": "a GPU model without a margin of its own for a quantity borrows the "
         "largest one any other model measured (common.judge.noise.margin_for), never silently: the verdict says "
         f"\"{borrowed}\""},
        {"word": "premise failed", "meaning": "a condition the hypothesis depends on did not hold (e.g. the pool never "
         "filled): the verdict is inconclusive whatever the number"},
        {"word": "[lo, hi] (3 range)", "meaning": "the interval of 3 to 9 repetitions: their lowest and highest value "
         "(the number says how many)"},
        {"word": "bootstrap95", "meaning": f"with {BOOTSTRAP_FROM} or more samples, a percentile-bootstrap 95% "
         "interval of the median (seeded, reproducible)"},
        {"word": "range over N shapes", "meaning": "a sweep judged as a whole: every shape's value inside the range "
         "confirms, every one outside refutes"},
    ], ["word", "meaning"])


def render(section: str) -> str:
    """One section of the glossary as Markdown (KeyError for an unknown one)."""
    return {"times": _times, "rates": _rates, "columns": _columns, "stalls": _stalls, "occupancy": _occupancy,
            "verdicts": _verdicts}[section]()
