"""SGLang 01, parts 1-5 on one server: what 01_baseline_perf.py measures on the GPU (its docstring tells the parts and
their hypotheses; everything after the measurement, --reanalyse included, stays in 01_baseline_perf.py).

    measure(args, P, rates, model_dir, fl, run)   parts 1-5 on one server (the pipeline's shared one in --quick)
    one_request(srv, P, prof_dir, rep)            part 1: one streamed request under the torch profiler, joined
    itl_sweep(srv, P, run)                        part 3: ITL by token position at each (batch, prompt) point
    load_runs(srv, P, rates, run, bench)          part 4: bench_serving at each rate, batch dynamics from the log
    steps_under_load(srv, P, prof_dir, run)       part 4: a traced window of scheduler steps in a burst of its own
    perf_bar(srv, P, run, bench)                  part 5: the workbook's client against bench_serving
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from _sgl01_batch import batch_sweep, itl_rows  # noqa: E402
from _sgl01_pressure import pressure_run  # noqa: E402
from common.tables import trace  # noqa: E402


def one_request(srv, P, prof_dir, rep: int) -> dict:
    """One streamed request under the torch profiler; its steps joined to the scheduler log lines."""
    mark = srv.log_mark()
    (tr, *_), res = srv.traced(prof_dir, lambda: srv.generate(
        text=sg.random_text(P["prompt"], 1 + rep), stream=True, sampling_params={**sg.GREEDY, "max_new_tokens": P["new"]}),
        num_steps=1 + min(P["new"] - 1, 32))
    _kt, steps = sg.steps(trace.read_chrome_trace(tr))
    log_rows = sg.parse_batch_log(srv.log_since(mark))
    joined, info = sg.join_steps(steps, log_rows)
    return {"rep": rep, "result": res, "steps": steps, "joined": joined, "join": info, "log_rows": log_rows}


def itl_sweep(srv, P, run) -> list[dict]:
    """Each (batch, prompt) point of P["itl_points"], P["reps"] times: ITL by token position."""
    rows = []
    for b, L in P["itl_points"]:
        for rep in range(P["reps"]):
            try:
                srv.flush_cache()
                res = srv.generate_many([{"input_ids": sg.random_ids(L, 1000 * b + 100 * rep + i), "sampling_params":
                                          {**sg.GREEDY, "max_new_tokens": P["itl_new"]}} for i in range(b)], stream=True)
                got = [{**r, "rep": rep} for r in itl_rows(res, b, L)]
                rows += got
                run.log(f"ITL batch {b} prompt {L} rep {rep}: median {statistics.median(r['itl_ms'] for r in got):.2f} ms")
            except Exception as e:  # noqa: BLE001 - a sweep point fails, the sweep goes on
                run.point_error({"batch": b, "prompt_len": L, "rep": rep}, e)
    return rows


def load_runs(srv, P, rates, run, bench: list, control: bool = False) -> tuple[list, list]:
    """bench_serving at each rate (the highest P["reps"] times): headline, batch dynamics, retractions.
    Each run's timing goes to ``bench``; ``control``: the first run once more as its own process."""
    loads, timeline = [], []
    plan = [(r, 0) for r in rates[:-1]] + [(rates[-1], k) for k in range(P["reps"])] if rates else []
    if control and plan:
        try:
            srv.flush_cache()
            rate = plan[0][0]
            rec = sg.run_bench(srv, run.dir / "bench", f"control_rate_{rate}", num_prompts=P["load_n"],
                               input_len=P["load_in"], output_len=P["load_out"], rate=rate, echo=run.log,
                               own_process=True)
            bench.append(sg.bench_timing(rec, f"control_rate_{rate}"))
        except Exception as e:  # noqa: BLE001 - the control is extra
            run.point_error({"part": "bench control (own process)"}, e)
    for rate, rep in plan:
        try:
            srv.flush_cache()
            mark, m0 = srv.log_mark(), srv.metrics()
            rec = sg.run_bench(srv, run.dir / "bench", f"rate_{rate}_{rep}", num_prompts=P["load_n"],
                               input_len=P["load_in"], output_len=P["load_out"], rate=rate, echo=run.log)
            bench.append(sg.bench_timing(rec, f"rate_{rate}_{rep}"))
            rows, hr = sg.parse_batch_log(srv.log_since(mark)), sg.hit_rate(m0, srv.metrics())
            t0 = rows[0]["ts"] if rows else 0
            if rep == 0:
                timeline += [{"rate": rate, "t_s": r["ts"] - t0, **{c: r.get(c) for c in (
                    "kind", "running_req", "queue_req", "token_usage", "new_seq", "new_token", "cached_token")}}
                    for r in rows if r["kind"] in ("prefill", "decode")]
            dec = [r for r in rows if r["kind"] == "decode"]
            loads.append({**sg.bench_headline(rec), "rate": rate, "rep": rep,
                          "max_running": max((r["running_req"] for r in dec), default=0),
                          "max_queue": max((r.get("queue_req") or 0 for r in rows), default=0),
                          "max_token_usage": max((r.get("token_usage") or 0 for r in rows), default=0),
                          "prefill_batches": sum(r["kind"] == "prefill" for r in rows), "decode_steps": len(dec),
                          "retractions": hr["retracted_requests"]})
            run.log(f"rate {rate} rep {rep}: {rec['output_throughput']:.0f} out tok/s, TTFT p50 {rec['median_ttft_ms']:.0f} "
                    f"ms, ITL p50 {rec['median_itl_ms']:.1f} / p99 {rec['p99_itl_ms']:.1f} ms")
        except Exception as e:  # noqa: BLE001
            run.point_error({"rate": rate, "rep": rep}, e)
    return loads, timeline


def steps_under_load(srv, P, prof_dir, run) -> tuple[list, dict]:
    """A staggered burst of its own; once >= 2 requests decode, P["trace_steps"] steps are traced and
    joined to their log lines (a trace export blocks the scheduler: never inside a measured run)."""
    srv.flush_cache()
    mark = srv.log_mark()
    burst = [{"input_ids": sg.random_ids(P["load_in"], 70_000 + i), "sampling_params": {
        **sg.GREEDY, "max_new_tokens": P["load_out"]}} for i in range(P["load_n"])]
    before = list(prof_dir.glob("*.trace.json*"))
    srv.while_decoding(burst, lambda: srv.start_profile(prof_dir, num_steps=P["trace_steps"]), running=r"[2-9]|\d\d+",
                       stagger_s=0.02)
    srv.stop_profile()
    _kt, st = sg.steps(trace.read_chrome_trace(srv.wait_traces(prof_dir, before)[0]))
    joined, info = sg.join_steps(st, sg.parse_batch_log(srv.log_since(mark)))
    run.log(f"traced {len(st)} steps under load; joined to log lines: {info['matched']}/{info['of']}")
    return joined, info


def perf_bar(srv, P, run, bench: list) -> list[dict]:
    """P["reps"] rounds: bench_serving --request-rate inf, then the workbook's client, same shape."""
    bar = []
    for rnd in range(P["reps"]):
        try:
            ref = sg.run_bench(srv, run.dir / "bench", f"bar_ref_{rnd}", num_prompts=P["bar_n"], input_len=P["bar_in"],
                               output_len=P["bar_out"], rate="inf", echo=run.log)
            bench.append(sg.bench_timing(ref, f"bar_ref_{rnd}"))
            srv.flush_cache()
            wb = sg.latency_summary(srv.generate_many([{"input_ids": sg.random_ids(P["bar_in"], 50_000 + i),
                                                        "sampling_params": {**sg.GREEDY, "max_new_tokens": P["bar_out"]}}
                                                       for i in range(P["bar_n"])]))
            bar.append({"round": rnd, "bench_serving_out_tok_s": ref["output_throughput"],
                        "workbook_out_tok_s": wb["output_throughput"], "failed": wb["failed"],
                        "ratio_pct": 100 * wb["output_throughput"] / ref["output_throughput"]})
            run.log(f"perf bar round {rnd}: workbook {wb['output_throughput']:.0f} vs bench_serving "
                    f"{ref['output_throughput']:.0f} out tok/s -> {bar[-1]['ratio_pct']:.1f}%")
        except Exception as e:  # noqa: BLE001
            run.point_error({"perf_bar_round": rnd}, e)
    return bar


def measure(args, P, rates, model_dir, fl, run) -> dict:
    """Parts 1-5 on one server."""
    prof = run.dir / "profiles"
    d: dict = {"bench": []}
    with sg.server(run, model_dir, fl, quick=args.quick, port=args.port, start_timeout=args.start_timeout) as srv:
        out = srv.generate(input_ids=sg.random_ids(16, 0), sampling_params={**sg.GREEDY, "max_new_tokens": 8})
        mi = out["meta_info"]
        if not (mi["prompt_tokens"] == 16 and mi["completion_tokens"] == 8 and len(out.get("output_ids", [])) == 8):
            raise RuntimeError(f"sanity request came back wrong: {mi}")
        run.log("sanity: 16-token prompt, 8 tokens back ✅  All results match. Starting benchmarks.")
        if not args.skip_load and not args.bench_control:
            # the bench_serving worker imports sglang (~20 s of one CPU core, 2026-11-23 and 11-28 H200 runs) while
            # parts 1-3 measure; it touches no GPU and sends nothing until the first load run
            srv.bench_worker(run.log).warm()
        d["requests"] = [one_request(srv, P, prof, rep) for rep in range(P["reps"])]
        mark = srv.log_mark()
        d["batch"] = srv.generate_many([{"text": sg.random_text(P["prompt"], 100 + i), "sampling_params":
                                         {**sg.GREEDY, "max_new_tokens": 32}} for i in range(P["batch"])])
        d["batch_rows"] = sg.parse_batch_log(srv.log_since(mark))
        d["itl"] = itl_sweep(srv, P, run)
        d["batch_sweep"] = batch_sweep(srv, P, run, bool(args.quick))
        d["loads"], d["timeline"] = load_runs(srv, P, [] if args.skip_load else rates, run, d["bench"],
                                              control=args.bench_control)
        d["pressure"] = None
        if not args.skip_load:
            try:
                d["pressure"] = pressure_run(srv, run, P)
            except Exception as e:  # noqa: BLE001 - the other parts stand
                run.point_error({"part": "pressure load"}, e)
        d["under_load"], d["under_load_join"] = [], {}
        if not args.skip_load:
            try:
                d["under_load"], d["under_load_join"] = steps_under_load(srv, P, prof, run)
            except Exception as e:  # noqa: BLE001
                run.point_error({"part": "traced steps under load"}, e)
        d["bar"] = [] if args.skip_load else perf_bar(srv, P, run, d["bench"])
    return d
