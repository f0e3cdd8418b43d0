"""SGLang 08, phase 3: the Nsight Compute counters of every kernel of the traced steps, and the transitions as events
(08_execution_story.py conducts).

    counters_server(args, run, model_dir, base, P, backend)   the server cut to COUNTER_LAYERS layers under ncu,
                                                              held by a gate until the stories' server is done
    counters(srv, run, P, log_file)                           its one-step windows; the server stopped, ncu's log read
    join_counters(run, data)                                  each traced kernel takes the counters of its position
                                                              (common.tables.timeline.attach_counters)
    transitions(data)                                         prefill -> decode and the cache's cold -> warm prefill,
                                                              with what the hardware does in each
"""
from __future__ import annotations

import math
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from _sgl08_stories import ENV, known, SP, spans_by_step  # noqa: E402
from common.base import story  # noqa: E402
from common.capture import ncu  # noqa: E402
from common.tables import kernels, timeline, trace  # noqa: E402


COUNTER_LAYERS = 1    # the server under ncu runs the model cut to this many layers (recordings before: 2)


def counters_server(args, run, model_dir, base, P, backend):
    """The server cut to COUNTER_LAYERS layers under ncu, not started yet. One layer holds every kernel a layer of the
    full model launches (its FusedAddRMSNorm after attention is the one later layers open with: the join finds it by
    name and grid), and ncu replays ~35% fewer kernels than with 2 (each kernel costs ~0.5 s of replay on an H100). It is launched when the run begins and its scheduler
    is held by a gate (_sgl_gate, an SGLang plugin) after its imports and before it touches the GPU, so that its
    start (~60 s of Python imports under ncu on an H100) overlaps phases 0-2; main() releases it when the
    stories' server is done with the GPU. Niced: its imports yield the CPU to the stories' server."""
    log_file = run.dir / "ncu" / "ncu_log.txt"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    wrapper = ncu.build_cmd([], log_file=log_file, metrics=kernels.SUMMARY_METRICS, launch_count=5000, cache_control="none",
                            extra=["--profile-from-start", "off", "--graph-profiling", "node"])
    if shutil.which("nice"):
        wrapper = ["nice", "-n", "10", *wrapper]
    fl = base + sg.flags(attention_backend=backend, skip_server_warmup=True, decode_log_interval=1,
                         max_total_tokens=P["pool"], json_model_override_args={"num_hidden_layers": COUNTER_LAYERS},
                         **counter_graphs(P))
    gate = sg.Gate(run.dir / "ncu" / "gate")
    srv = sg.Server(model_dir, fl, port=args.port, log_path=run.path("server_ncu.log"), wrapper=wrapper, echo=run.log,
                    start_timeout=max(args.start_timeout, 1800), env={**ENV, **gate.env()},
                    name=f"server[{COUNTER_LAYERS} layer{'s' if COUNTER_LAYERS > 1 else ''} under ncu]")
    return srv, gate, log_file


def counters(srv, run, P, log_file):
    """Phase 3 on the (released, healthy) server under ncu: one-step windows; then the server is stopped, so that
    ncu writes its log. Returns (summary rows, window names)."""
    windows = []
    srv.generate(input_ids=sg.random_ids(16, 1), sampling_params={**SP, "max_new_tokens": 2})

    def window(name, during, steps=1):
        t0 = time.time()
        srv.start_profile(run.dir / "ncu", activities=["CUDA_PROFILER"], num_steps=steps)
        during()
        srv.stop_profile()
        windows.append(name)
        run.log(f"ncu window {name} done in {time.time() - t0:.1f} s")

    def while_decoding(n):
        reqs = [{"input_ids": sg.random_ids(P["prompt"], 60 + i), "sampling_params": {**SP, "max_new_tokens": 400}}
                for i in range(n)]
        srv.while_decoding(reqs, lambda: window(f"decode_b{n}", lambda: time.sleep(0.5)), running=n, timeout=900)
    # cache cold: token IDs that share nothing with the cache (attention: the ragged kernel only). No traced
    # story runs such a step; its counters are the cold side of the cache transition
    window("prefill-cold_b1", lambda: srv.generate(input_ids=sg.random_ids(P["prompt"], 2),
                                                   sampling_params={**SP, "max_new_tokens": 1}))
    # the served prefill: a text prompt after another one finds their common BOS token in the radix cache, so
    # attention reads that prefix from the paged KV (FlashInfer: ragged + paged + merge), as in the stories
    srv.generate(text=sg.random_text(16, 3), sampling_params={**SP, "max_new_tokens": 1})
    window("prefill_b1", lambda: srv.generate(text=sg.random_text(P["prompt"], 4),
                                              sampling_params={**SP, "max_new_tokens": 1}))
    while_decoding(1)
    # no window for the batch's prefill: its requests reach the scheduler one by one, so its prefill batches
    # differ from run to run (10, 13 and 8 requests on the H200 run of c447205) and a fixed window of batch/2
    # prompts (8192 tokens) matched none of them while costing the pass its largest replays
    while_decoding(P["batch"])
    t0 = time.time()
    srv.stop()
    rows = kernels.summarize(ncu.read_log(log_file, run.path("ncu/ncu.csv")))
    run.log(f"ncu: server stopped and its log read in {time.time() - t0:.1f} s")
    return rows, windows


def counter_graphs(P) -> dict:
    """The CUDA graphs the server under ncu captures: only the sizes its windows run (decode at batch 1 and
    at the batch; prefill of one prompt), so ncu follows 3 captures, not ~94. The kernels of those graphs are the
    full server's at the same sizes (its graphs cover every size)."""
    return {"cuda_graph_bs_decode": [1, P["batch"]], "cuda_graph_bs_prefill": [P["prompt"]]}


def prefill_paths(kt, spans=None) -> dict:
    """Each prefill step's attention path: "warm" when its prompt found a prefix in the radix cache (attention
    reads it from the paged KV), "cold" when nothing was cached; from the scheduler log's cached tokens (``spans``
    of analyse_story, in step order), or where the log says nothing, from a merge kernel in the step."""
    out = {}
    steps = sorted(int(s) for s in kt[kt["mode"] == "EXTEND"]["step"].unique())
    by_step = spans_by_step(kt, spans)
    for s in steps:
        cached = (by_step.get(s) or {}).get("cached_token")
        if cached is None:
            cached = int(kt[kt["step"] == s]["kernel"].str.contains("Merge").any())
        out[s] = "warm" if cached else "cold"
    return out


SAME_TOKENS = 0.1     # a prefill window stands for a traced prefill whose token count is within 10% of its own


def window_specs(kt, names, P, spans=None) -> list[dict]:
    """Which traced step each ncu window stands for, and which steps take its counters. A prefill window stands
    for the traced prefill of its path (cold: "prefill-cold_*", else warm) nearest in tokens, within SAME_TOKENS; a
    decode window for the middle traced decode step of its batch size. A window no traced step matches keeps its place (step None),
    so the windows after it still align, and takes no kernel."""
    paths = prefill_paths(kt, spans)
    specs = []
    for name in names:
        mode = "EXTEND" if name.startswith("prefill") else "DECODE"
        bs = int(name.split("_b")[1])
        spec = {"name": name, "step": None, "match": {}}
        if mode == "EXTEND":
            want = "cold" if name.startswith("prefill-cold") else "warm"
            m = kt[(kt["mode"] == mode) & kt["step"].map(lambda s: paths.get(int(s)) == want)]
            per = m.groupby("step")[["bs", "toks"]].first().reset_index()
            per["d"] = (per["toks"] - bs * P["prompt"]).abs() * 1000 + (per["bs"] - bs).abs()
            per = per[(per["toks"] - bs * P["prompt"]).abs() <= SAME_TOKENS * bs * P["prompt"]]
            if len(per):
                best = per.sort_values(["d", "step"]).iloc[0]
                spec = {"name": name, "step": int(best["step"]),
                        "match": {"mode": mode, "bs": int(best["bs"]), "toks": int(best["toks"])}}
        else:
            m = kt[(kt["mode"] == mode) & (kt["bs"] == bs)]
            if len(m):
                steps = sorted(m["step"].unique())
                spec = {"name": name, "step": int(steps[len(steps) // 2]), "match": {"mode": mode, "bs": bs}}
        specs.append(spec)
    return specs


SAME_TIME = 0.25      # the few-layer server runs the same kernel when its ncu time is within 25% of the traced time


def same_kernels(kt, window: str) -> dict:
    """How far the kernels of the few-layer server under ncu are those of the full server, for one window: the share of
    kernels that took counters whose launch grid is the traced one, the median ncu/traced time, and the share
    within SAME_TIME of it (the rest is ncu's replay, clocks and caches: the observer effect of ncu)."""
    g = kt[kt["ncu_window"] == window]
    if not len(g):
        return {"same_grid_pct": math.nan, "ncu_over_traced": math.nan, "within_margin_pct": math.nan}
    grid = [timeline.same_dims(a, b) for a, b in zip(g["grid"], g["ncu_grid"])]
    ratio = g["ncu_ratio"].astype(float)
    return {"same_grid_pct": 100 * sum(grid) / len(g), "ncu_over_traced": float(ratio.median()),
            "within_margin_pct": float(100 * ((ratio - 1).abs() <= SAME_TIME).mean())}


def cold_attention(rows, info, n_layers: int = 2) -> list[dict]:
    """The attention kernels of one layer of the cold prefill window (ncu rows of "prefill-cold_*"): the cold side
    of the cache transition, which no traced story runs."""
    w = next((i for i in info if i["window"].startswith("prefill-cold") and i.get("ncu_rows")), None)
    if w is None:
        return []
    lo, hi = w["ncu_rows"]
    att = [r for r in rows.iloc[lo:hi + 1].to_dict("records") if trace.kernel_class(r["kernel"]) == "attention"]
    # the server under ncu ran n_layers: keep the last one's (of 2, the second: the one later layers are like)
    per = len(att) // n_layers if len(att) >= n_layers else len(att)
    return att[per * (n_layers - 1):] if per else att


def _attention_hw(rows) -> str:
    """'Kernel 12.3 us (ncu), tensor 45%, DRAM 20%' for each attention kernel of one layer."""
    f = story.fmt
    return " + ".join(f"{r['kernel'][:40]} {f(r.get('ncu_time_us'))} us (ncu), tensor {f(r.get('tensor_pct'))}%, "
                      f"DRAM {f(r.get('dram_pct'))}%" for r in rows)


def _step_state(kt, step) -> dict:
    """One traced step's kernel story: classes by time share, attention and GEMM kernels, GPU busy, counters."""
    g = kt[kt["step"] == step]
    span = float(g["end_us"].max() - g["ts_us"].min())
    tot = float(g["dur_us"].sum())
    sh = (g.groupby("cls")["dur_us"].sum() / tot * 100).sort_values(ascending=False)
    out = {"step": int(step), "mode": g["mode"].iloc[0], "bs": int(g["bs"].iloc[0]), "t_us": float(g["ts_us"].min()),
           "busy_pct": 100 * tot / span if span else math.nan, "shares": {k: float(v) for k, v in sh.head(4).items()},
           "attention": list(dict.fromkeys(g[(g["cls"] == "attention") & (g["layer"] == 1)]["kernel"])),
           "gemm": next(iter(g[(g["role"] == "gate_up_proj") & (g["layer"] == 1)]["kernel"]), None)}
    for col in ("tensor_pct", "dram_pct"):
        if col in g:
            c = g[g[col].notna()]
            w = c["dur_us"].astype(float)
            out[col] = float((c[col].astype(float) * w).sum() / w.sum()) if w.sum() else math.nan
    return out


def transitions(data) -> list[dict]:
    """The plan's transitions inside the traced story as events (t: epoch s, kind, text): prefill -> decode with what
    the hardware does (attention and GEMM kernels, class shares, GPU busy; with --ncu the tensor pipe and DRAM), and
    with --ncu the cache's cold -> warm prefill: one layer's attention kernels under ncu in the cold prefill window
    (nothing cached: ragged only) beside those of the served prefill (its BOS token cached: ragged + paged + merge).
    The cache over time request by request is 02's (its round-robin); the scheduler under pressure is 01's."""
    f = story.fmt
    out = []
    kt, base = data["kt_one"], data.get("base_one") or 0.0
    modes = {}
    for mode in ("EXTEND", "DECODE"):
        steps = sorted(kt[kt["mode"] == mode]["step"].unique())
        if steps:
            modes[mode] = _step_state(kt, steps[0] if mode == "EXTEND" else steps[len(steps) // 2])
    if len(modes) == 2:
        a, b = modes["EXTEND"], modes["DECODE"]
        hw = (f"; tensor pipe {f(a.get('tensor_pct'))}% -> {f(b.get('tensor_pct'))}%, DRAM {f(a.get('dram_pct'))}% -> "
              f"{f(b.get('dram_pct'))}% (ncu, time-weighted)" if known(a.get("tensor_pct")) and known(b.get("tensor_pct"))
              else "; counters: run with --ncu")
        out.append({"t": (b["t_us"] + base) / 1e6, "kind": "prefill -> decode", "text":
                    f"prefill -> decode: attention {'+'.join(a['attention'])} -> {'+'.join(b['attention'])}; GEMM "
                    f"(gate/up) {a['gemm']} -> {b['gemm']}; shares " + ", ".join(f"{k} {f(v)}%" for k, v in a["shares"].items())
                    + " -> " + ", ".join(f"{k} {f(v)}%" for k, v in b["shares"].items())
                    + f"; GPU busy {f(a['busy_pct'])}% -> {f(b['busy_pct'])}%" + hw})
    cold, warm = data.get("cold_attention") or [], []
    warm_steps = [s for s, p in prefill_paths(kt, data.get("spans_one")).items() if p == "warm"]
    if warm_steps and "ncu_time_us" in kt:
        g = kt[(kt["step"] == warm_steps[0]) & (kt["layer"] == 1) & (kt["cls"] == "attention")]
        warm = [r for r in g.to_dict("records") if known(r.get("ncu_time_us"))]
    if cold and warm:
        t = float(kt[kt["step"] == warm_steps[0]]["ts_us"].min())
        out.append({"t": (t + base) / 1e6, "kind": "cache cold -> warm", "text":
                    f"cache cold -> warm: a {data['P']['prompt']}-token prefill, per layer under ncu: attention ragged "
                    f"only (nothing cached) {_attention_hw(cold)} -> ragged + paged + merge (prefix in the cache) "
                    + _attention_hw(warm)})
    return out


def join_counters(run, data) -> None:
    """With --ncu (``data["windows"]``): every kernel of each story's traced steps takes the counters of its position
    in the window that stands for its step (window_specs; common.tables.timeline.attach_counters), ncu_windows_<story>.csv
    says how well each window matched, and the cold prefill window's attention (cold_attention) is kept for the
    cache's transition."""
    pk = data["pk"]
    rows = kernels.summarize(ncu.read_raw(run.dir / "ncu" / "ncu.csv"), peaks=pk)
    for name in ("one", "batch"):
        specs = window_specs(data[f"kt_{name}"], data["windows"], data["P"], data[f"spans_{name}"])
        data[f"kt_{name}"], info = timeline.attach_counters(data[f"kt_{name}"], rows, specs, pk,
                                                            keep_layers=data.get("ncu_layers") or 2)
        info = [{**i, "step": w["step"], **same_kernels(data[f"kt_{name}"], i["window"])}
                for i, w in zip(info, specs)]
        run.table(f"ncu_windows_{name}", info)
        run.log(f"counters on {name}: " + ", ".join(f"{i['window']} (step {i['step']}) {i['matched']}/{i['expected']} "
                                                    f"by name, {i['same_grid_pct']:.0f}% same grid, ncu/traced "
                                                    f"median {i['ncu_over_traced']:.2f}" for i in info if i["expected"]))
        if name == "one":
            data["cold_attention"] = cold_attention(rows, info, data.get("ncu_layers") or 2)
