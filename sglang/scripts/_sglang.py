"""SGLang's own facts for the numbered scripts, one face over the rooms that hold them (each imports on its own).

    import _sglang as sg
    with sg.Server(model_dir, sg.flags(load_format="dummy", attention_backend="flashinfer", enable_metrics=True),
                   log_path=run.path("server.log"), echo=run.log) as srv:
        mark = srv.log_mark()
        out = srv.generate(input_ids=ids, sampling_params={"max_new_tokens": 8, "temperature": 0})
        rows = sg.parse_batch_log(srv.log_since(mark))      # "Prefill batch" / "Decode batch" lines
        m = srv.metrics()                                   # /metrics (Prometheus text) -> Metrics
        (tr,), _ = srv.traced(run.dir / "profiles", lambda: srv.generate(...))   # /start_profile .. /stop_profile
        kt, steps = sg.steps(trace.read_chrome_trace(tr))
    # leaving the block -- normally, on an error, on Ctrl-C or SIGTERM -- stops the whole process tree

Server (``python -m sglang.launch_server``) is a common.capture.procs.Group (own session and process group,
the whole tree stopped on exit, error, Ctrl-C, SIGTERM) with what SGLang needs around it:
  * a port from the OS (procs.free_port) unless one is given; a given port already in use is a
    SetupError (one line);
  * a pidfile (default ``$HANDS_ON_CACHE/servers/<script>/<run pid>-<name>.pid``, ``pidfile=False``: none):
    before it starts, every server that a run of any script killed with SIGKILL left behind (its
    pidfile's owner is dead; procs.reap_left over the whole registry) is stopped; servers of runs still
    going are left alone;
  * the environment: NVLink multicast off (procs.nccl_env, the workbook's one policy; --enable-nccl-nvls
    and --enable-symm-mem refused), the /health generation probe off (no 1-token prefills in the
    logs), HF offline for local model dirs;
  * waits for ``/health`` (200) up to ``start_timeout`` while watching the process: if it exits,
    ServerError with the last log lines;
  * with a ``wrapper`` (an ncu or nsys command line) the application inside is signalled first and
    the wrapper given ``wrapper_stop_timeout`` seconds to write its report, then the group is stopped;
  * ``run_bench(srv, ...)`` runs ``sglang.benchmark.serving`` in the server's BenchWorker: one process
    that imports it once and runs each benchmark's ``cli_main()`` (same arguments, output file and log
    as the command line), stopped with the server.

Parsers (pure functions; tests/test_sglang_helpers.py runs them on real H200 output):
  parse_batch_log(text)     scheduler lines -> rows (kind, time, new-seq, new-token, cached-token, token
                            usage, running-req, queue-req, ...); a line that starts like a batch line but
                            does not parse raises ParseError (format drift fails loudly)
  parse_metrics(text)       /metrics -> Metrics: .total(name, **labels), .get, .series, .histogram
  startup_breakdown(log, t_launch)  where a server start went, phase by phase, from the log's own time stamps
                            (imports of each process, weights, KV pool, each CUDA-graph capture, warm-up);
                            Server prints it once it is healthy (``srv.startup_phases``)
  hit_rate(before, after)   prefix-cache hit rate from counter deltas (never the cache_hit_rate gauge)
  read_bench_jsonl(path)    `sglang.benchmark.serving --output-file` -> one dict per run
  parse_step_name(name)     'step[EXTEND bs=1 toks=11]' -> {"mode", "bs", "toks"}
  steps(ev)                 SGLang's forward steps: their kernels (common.tables.trace.step_kernels) and a row per step
  join_steps(steps, rows)   each traced step next to its scheduler log line (matched by sequence)

The rooms, each one noun, each importing only the rooms above it in this list (explicit imports, no cycle):
  _sgl_facts   flags and why each differs from SGLang's defaults, model options, errors, seeded prompts
  _sgl_logs    the parsers of the server's log and /metrics (batch lines, start phases, memory)
  _sgl_bench   sglang.benchmark.serving in one worker process (BenchWorker, run_bench)
  _sgl_stamps  SGLang's forward steps in a trace and the per-request stage stamps (waterfalls)
  _sgl_server  Server: start, health, HTTP calls, profiler windows, stop; the registry of servers left behind
  _sgl_gate    the gate plugin that holds a server's scheduler until the GPU is free
  _sgl_shared  the pipeline's shared servers (SharedServer; held ones wait at a _sgl_gate) and the experiments'
               server() choice among them
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))     # the rooms sit beside this file
from _sgl_facts import (  # noqa: E402,F401
    GREEDY, QUICK_POOL_TOKENS, SERVING_ENV, SGLANG_PIP, TRACE_ENV, add_model_args, changes_from_defaults,
    config_line, fa3_usable, flags, graphs_text, model_and_flags, model_shape, parse_flags, ParseError,
    random_ids, random_text, require_sglang, require_stack, ServerError, serving_flags, sglang_installed, table
)
from _sgl_logs import (  # noqa: E402,F401
    START_PHASES, breakdown_lines, breakdown_row, decode_step_ms, hit_rate, is_probe, memory_lines,
    parse_batch_log, parse_metrics, stage_lines, startup_breakdown, startup_memory
)
from _sgl_bench import (  # noqa: E402,F401
    bench_cmd, bench_headline, bench_timing, BenchWorker, latency_summary, read_bench_jsonl,
    run_bench, tool_env
)
from _sgl_stamps import (  # noqa: E402,F401
    OUTER_RANGE, STEP_RANGE, TTFT_CHAIN, decode_split, itl_waterfall, join_steps, parse_step_name, prefill_split,
    request_stamps, steps, ttft_waterfall
)
from _sgl_server import Server  # noqa: E402,F401
from _sgl_shared import PIPELINE_STEM, _sglang_env, flag_diff, server, SharedServer, why_not_shared  # noqa: E402,F401
from _sgl_gate import Gate, GateError  # noqa: E402,F401
