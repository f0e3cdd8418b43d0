"""A stand-in for `python -m sglang.launch_server` in CPU tests of sglang/scripts/_sglang.Server.

It takes the same --model-path/--host/--port flags (the tests give it a port the OS chose, on
127.0.0.1), serves /health, /v1/models, /generate (plain and streamed), /metrics, /v1/loads and /flush_cache
(like SGLang: it waits up to ?timeout= seconds for running requests, then flushes and logs "Cache flushed
successfully!", or answers 400), and can misbehave on purpose:
  --spawn-child     start a child process (like SGLang's scheduler) that must be stopped too
  --die-after S     exit with code 3 after S seconds (a server that dies during start-up)
  --no-health       never answer /health with 200 (a server that never becomes ready)
  --ignore-term     ignore SIGTERM
  --child-ignores-term  with --spawn-child: the child ignores SIGTERM (forces the stop's SIGKILL path: the launcher
                    itself gets SIGKILL first)
  --crash-sleep S   with --spawn-child, as SGLang 0.5.17's launcher: a SIGTERM only sets a flag that a watchdog reads
                    every S seconds, and a child that dies of a signal is taken for a crash: S seconds of sleep
                    ("crash diagnostics") before it exits; the child dies with it (PR_SET_PDEATHSIG, as SGLang's)
  --ready-after S   answer /health with 503 for the first S seconds
  --sglang-log      print SGLang's start-up milestone lines (time-stamped like SGLANG_LOG_MS=1) while it starts
  --gated-scheduler spawn a "scheduler" process that loads SGLang's general plugins (entry points of
                    sglang.srt.plugins, where sglang/scripts/_sgl_gate.py holds it) before it is ready; /health
                    answers 200 only after it; when it exits with an error the server exits with code 3, as
                    SGLang's launcher does when its scheduler dies before it is ready
With HANDS_ON_GATE in its environment (a server held by _sgl_gate) it starts gated as with --gated-scheduler, as
SGLang 0.5.17 does: after the ServerArgs line its "scheduler" -- a multiprocessing child -- runs the plugins of the
entry-point group sglang.srt.plugins (SGLang's load_plugins()), so the gate holds it; the rest of the start (the
lines that touch the GPU: "Init torch distributed begin" on) comes only once the child is through.
A /generate whose sampling_params hold "fake_running_s": S stays running for S seconds (also when its client
has gone), as a request a killed experiment left behind; /v1/loads counts it.
Every loop is bounded: the server and its child exit on their own after MAX_LIFE_S (a test that dies
leaves nothing running for long).
As a wrapper (`--wrapper REPORT -- cmd...`) it runs cmd as a child like ncu/nsys do, waits for it,
and writes REPORT when the child has exited; `--wrapper-setsid` starts the child in a session of its
own (out of the wrapper's process group, as a profiler may do).
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_LIFE_S = 120

METRICS = ('# TYPE sglang:prompt_tokens_total counter\n'
           'sglang:prompt_tokens_total{model_name="m",is_streaming="false"} 10.0\n'
           'sglang:cached_tokens_total{cache_source="device",model_name="m"} 4.0\n')


def wrapper_main(argv, setsid=False):
    report, cmd = argv[0], argv[2:]
    p = subprocess.Popen(cmd, start_new_session=setsid)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # like nsys: keep going until the app is gone
    p.wait()
    time.sleep(0.3)                                   # "writing the report"
    with open(report, "w") as f:
        f.write(f"app exited with {p.returncode}\n")
    print("fake wrapper: report written", flush=True)


START_LINES = ("server_args=ServerArgs(model_path='m', load_format='dummy')", "Init torch distributed begin.",
               "Init torch distributed ends. elapsed=0.01 s", "Load weight begin. avail mem=78.50 GB",
               "Load weight end. elapsed=0.01 s, type=LlamaForCausalLM, avail mem=63.48 GB, mem usage=15.02 GB.",
               "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 32768, K size: 2.00 GB, V size: 2.00 GB",
               "Memory pool end. avail mem=58.35 GB",
               "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8]",
               "Capture target decode CUDA graph end. elapsed=0.01 s", "The server is fired up and ready to roll!")


def scheduler():
    """The scheduler stand-in (a spawned process, as SGLang's): SGLang's load_plugins(), then ready."""
    from importlib.metadata import entry_points
    for ep in entry_points(group="sglang.srt.plugins"):
        ep.load()()
    print("fake scheduler: configured", flush=True)


CHILDREN: list = []      # what --spawn-child started (taken down when the scheduler dies)
TERM: list = []          # --crash-sleep: a SIGTERM came


def gated_start(ready, argv=()):
    """The ServerArgs line, then spawn the scheduler; once it is through (its gate released) the rest of the start's
    lines (with --sglang-log) and ``ready``; exit 3 when it dies first."""
    import multiprocessing
    os.environ.setdefault("HANDS_ON_GATE_TIMEOUT", str(MAX_LIFE_S))      # bounded, as every loop here
    if "--sglang-log" in argv:
        log(START_LINES[0])
    proc = multiprocessing.get_context("spawn").Process(target=scheduler, daemon=True)
    proc.start()

    def watch():
        proc.join()
        if proc.exitcode:
            log(f"Rank 0 scheduler is dead (exit code {proc.exitcode})")
            for c in CHILDREN:                 # SGLang's launcher takes its process tree down with it
                c.kill()
            os._exit(3)
        if "--sglang-log" in argv:
            start_log(0.5, START_LINES[1:])
        ready.set()
    threading.Thread(target=watch, daemon=True).start()


def log(msg):
    """One line as SGLang writes it with SGLANG_LOG_MS=1."""
    t = time.time()
    print(time.strftime("[%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}] {msg}", flush=True)


def start_log(span, lines=START_LINES):
    for line in lines:
        time.sleep(span / (len(START_LINES) + 1))
        log(line)


def main(argv):
    if argv and argv[0] in ("--wrapper", "--wrapper-setsid"):
        return wrapper_main(argv[1:], setsid=argv[0] == "--wrapper-setsid")
    a = {k: v for k, v in zip(argv, argv[1:] + [""])}
    port, host = int(a["--port"]), a.get("--host", "127.0.0.1")
    t0 = time.time()
    ready_after = float(a.get("--ready-after", 0) or 0)
    print(f"fake server: model {a.get('--model-path')} on {host}:{port}", flush=True)
    gate = "--gated-scheduler" in argv or bool(os.environ.get("HANDS_ON_GATE"))
    if "--sglang-log" in argv and not gate:        # gated: gated_start logs them around the hold
        threading.Thread(target=start_log, args=(max(ready_after, 0.5),), daemon=True).start()
    crash_sleep = float(a.get("--crash-sleep") or 0)
    if "--ignore-term" in argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif crash_sleep:
        def watchdog():                            # SGLang's sigterm_watchdog: polls its flag every few seconds
            while True:
                time.sleep(crash_sleep)
                if TERM:
                    print("fake server: SIGTERM seen by the watchdog", flush=True)
                    os._exit(0)
        signal.signal(signal.SIGTERM, lambda *_: TERM.append(1))
        threading.Thread(target=watchdog, daemon=True).start()
    else:
        signal.signal(signal.SIGTERM, lambda *_: (print("fake server: SIGTERM", flush=True), os._exit(0)))
    scheduled = threading.Event()
    if not gate:
        scheduled.set()
    if "--spawn-child" in argv:
        pdeath = "import ctypes; ctypes.CDLL('libc.so.6').prctl(1, 9)\n" if crash_sleep else ""   # PR_SET_PDEATHSIG
        if "--child-ignores-term" in argv:
            pdeath += "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        CHILDREN.append(subprocess.Popen([sys.executable, "-c",
                                          f"{pdeath}import time\nfor _ in range({MAX_LIFE_S}): time.sleep(1)"]))
        if crash_sleep:
            def crash():                           # the child died of a signal: a "crash", diagnostics first
                if CHILDREN[0].wait() < 0:
                    print(f"fake server: child exited with {CHILDREN[0].returncode}; sleeping {crash_sleep} s "
                          f"before crash diagnostics", flush=True)
                    time.sleep(crash_sleep)
                    os._exit(0)
            threading.Thread(target=crash, daemon=True).start()
    threading.Timer(MAX_LIFE_S, lambda: os._exit(4)).start()       # bounded: never outlives a test run for long
    if "--die-after" in a:
        def die():
            time.sleep(float(a["--die-after"]))
            print("fake server: dying on purpose (CUDA out of memory)", flush=True)
            os._exit(3)
        threading.Thread(target=die, daemon=True).start()

    if gate:                                       # once the SIGTERM and die handlers are in place
        gated_start(scheduled, argv)
    running = [0]
    lock = threading.Lock()

    def loads():
        return json.dumps({"loads": [{"dp_rank": 0, "num_running_reqs": running[0], "num_waiting_reqs": 0,
                                      "num_used_tokens": 16 * running[0]}]})

    class H(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, body, ctype="application/json"):
            data = body if isinstance(body, bytes) else body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.startswith("/health"):
                ok = "--no-health" not in argv and time.time() - t0 >= ready_after and scheduled.is_set()
                return self._send(200 if ok else 503, "")
            if self.path.startswith("/metrics"):
                return self._send(200, METRICS, "text/plain")
            if self.path.startswith("/v1/loads"):
                return self._send(200, loads())
            if self.path.startswith("/v1/models"):            # bench_serving's readiness check
                return self._send(200, json.dumps({"object": "list", "data": [{"id": a.get("--model-path")}]}))
            self._send(404, "not found")

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            if self.path.startswith("/flush_cache"):
                q = dict(x.split("=", 1) for x in self.path.partition("?")[2].split("&") if "=" in x)
                end = time.time() + float(q.get("timeout") or 0)
                while running[0] and time.time() < end:
                    time.sleep(0.05)
                if running[0]:
                    return self._send(400, "Timed out waiting for idle state.", "text/plain")
                log("Cache flushed successfully!")
                return self._send(200, "Cache flushed.\n", "text/plain")
            if self.path.startswith("/generate"):
                ids = body.get("input_ids") or [1] * len(body.get("text") or "x")
                new = body.get("sampling_params", {}).get("max_new_tokens", 4)
                if ids and isinstance(ids[0], list) and not body.get("stream"):     # a batch: one result each
                    log(f"Prefill batch, #new-seq: {len(ids)}, #new-token: {sum(map(len, ids))}, #running-req: 0")
                    return self._send(200, json.dumps([{"text": "x" * new, "output_ids": list(range(new)),
                                                        "meta_info": {"prompt_tokens": len(x), "completion_tokens": new}}
                                                       for x in ids]))
                hold = float(body.get("sampling_params", {}).get("fake_running_s") or 0)
                if hold:
                    with lock:
                        running[0] += 1
                    try:
                        time.sleep(hold)
                    finally:
                        with lock:
                            running[0] -= 1
                meta = {"prompt_tokens": len(ids), "cached_tokens": 0, "e2e_latency": 0.01}
                if not body.get("stream"):
                    return self._send(200, json.dumps({"text": "x" * new, "output_ids": list(range(new)),
                                                       "meta_info": {**meta, "completion_tokens": new}}))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i in range(1, new + 1):
                    time.sleep(0.01)
                    chunk = {"text": "x" * i, "output_ids": list(range(i)),   # cumulative, as SGLang streams
                             "meta_info": {**meta, "completion_tokens": i}}
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                return
            self._send(404, "not found")

    ThreadingHTTPServer((host, port), H).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
