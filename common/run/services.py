"""The shared services of one pipeline run (common.run.pipeline): a server row's start, the check before each step
that uses it, the environment that offers it to those steps, its stop after its last step and at the end; a held
service is launched when the run begins and finishes its start at its row (the protocol of a handle is in
common/run/pipeline.py's docstring). What a service says goes to the console and to its row's log (Sink)."""
from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path

from common.run.steps import ServiceSkipped, fmt_s, server_row


class Sink:
    """What a service says: on the console and in its row's log (once the run has a folder)."""

    def __init__(self):
        self.path: Path | None = None

    def __call__(self, msg) -> None:
        print(msg, flush=True)
        if self.path:
            with open(self.path, "a") as f:
                f.write(f"{msg}\n")


class Services:
    """The shared services of one run: started at their row, checked (and restarted) before each step that
    uses them, offered to those steps through the environment, stopped after their last step and at the end.
    A held one (Service.held) is launched when the run begins (:meth:`launch`) and finishes its start at its row."""

    def __init__(self, handles: dict, sinks: dict, plan: list, run, width: int, held=()):
        self.handles, self.sinks, self.run, self.width = handles, sinks, run, width
        self.last = {n: p.name for p in plan if p.kind == "measure" for n in p.services}
        self.held = [n for n in held if hasattr(handles.get(n), "launch")]
        self.up: set = set()
        self.launched: set = set()             # launched and held, their row not reached yet
        self.launch_errors: dict = {}          # name -> what its launch raised (raised again at its row)
        self.down: dict = {}                   # name -> why it is not offered
        self.early: dict = {}                  # name -> the row it was started at, before its own (together())

    def reap(self) -> None:
        for n, h in self.handles.items():
            try:
                h.reap()
            except Exception as e:  # noqa: BLE001 - said, the run goes on
                print(f"{server_row(n)}: could not look for servers of killed runs: {e.__class__.__name__}: {e}",
                      flush=True)

    def _log_dir(self, name: str) -> Path:
        """Point ``name``'s sink at the run's logs/server-NAME.log; the folder its handle writes its own log into."""
        self.sinks[name].path = self.run.path(f"logs/server-{name}.log")
        return self.sinks[name].path.parent

    def launch(self) -> None:
        """Launch every held service now: its imports run while the steps before its row run; it touches the GPU
        only once its row releases it. A launch that fails is said at its row (its steps start their own)."""
        for n in self.held:
            try:
                self.handles[n].launch(self._log_dir(n))
                self.launched.add(n)
            except KeyboardInterrupt:
                self._stop(n, quiet=True)
                raise
            except Exception as e:  # noqa: BLE001 - kept for its row
                self.launch_errors[n] = e
                self._stop(n, quiet=True)
                continue
            print(f"[launch] {server_row(n):<{self.width}}  held until its row (its imports run meanwhile)", flush=True)

    def together(self, name: str) -> list[str]:
        """The held services still waiting for their rows that start at ``name``'s row too: where every handle
        says that many of them fit on the GPU at once (``together_ok(n)``) and can be released without waiting
        (``release()``). They then load and capture while no step measures, and their own rows only confirm."""
        if name not in self.launched:
            return []
        rest = [n for n in self.held if n != name and n in self.launched and n not in self.launch_errors]
        if not rest or not all(hasattr(self.handles[n], "release") for n in rest):
            return []
        k = len(self.up) + 1 + len(rest)
        ok = all(getattr(self.handles[n], "together_ok", lambda _k: False)(k) for n in (name, *rest))
        return rest if ok else []

    def start(self, name: str, row: dict, tag: str) -> None:
        """Start ``name`` (a held one: release it), filling its row (status, seconds); its steps start their own
        when it does not. Held services that fit beside it (:meth:`together`) are released with it and waited for
        in this row; at their own rows they are already up."""
        from common.base.checks import SetupError
        h, sink = self.handles[name], self.sinks[name]
        logs = self._log_dir(name)
        t0 = time.time()
        if name in self.early and name in self.up:
            row["status"], row["seconds"] = "ok", 0.0
            print(f"{tag}  ok  (up since {server_row(self.early[name])}'s row)", flush=True)
            return
        partners = self.together(name)
        for n in list(partners):
            try:
                self.handles[n].release()
            except Exception:  # noqa: BLE001 - not released: it starts at its own row, as without this
                partners.remove(n)
        if partners:
            print(f"{tag}  with {', '.join(map(server_row, partners))}: released together (they fit on the GPU "
                  f"at once); this row waits for all of them", flush=True)
        try:
            if name in self.launch_errors:
                raise self.launch_errors.pop(name)
            h.start(logs)
            row["status"] = "ok"
            self.up.add(name)
            for n in partners:
                self._start_early(n, name, t0)
        except ServiceSkipped as e:
            row["status"], self.down[name] = "ok (skipped)", str(e)
            sink(f"{server_row(name)}: not started: {e}; its steps start their own servers")
        except KeyboardInterrupt:
            row["status"] = "interrupted"
            self._stop(name, quiet=True)
            raise
        except Exception as e:  # noqa: BLE001 - one line; the steps go on without it
            first = str(e).splitlines()[0][:300] if str(e) else ""
            row["status"] = "setup-error" if isinstance(e, SetupError) else "failed"
            self.down[name] = f"{e.__class__.__name__}: {first}"
            sink(f"{server_row(name)}: could not start ({self.down[name]}); its steps start their own servers")
            self._stop(name, quiet=True)
        finally:
            row["seconds"] = round(time.time() - t0, 1)
            self.launched.discard(name)
            for n in partners:                  # released with a row that failed: stopped (their rows start them)
                if n not in self.up:
                    self._stop(n, quiet=True)
        print(f"{tag}  {row['status']}  in {fmt_s(row['seconds'])}", flush=True)

    def _start_early(self, name: str, by: str, t0: float) -> None:
        """Wait for a service released with ``by`` (whose row began at ``t0``); a failure is said, and its own row
        starts it anew."""
        sink = self.sinks[name]
        try:
            self.handles[name].start(self._log_dir(name))
        except KeyboardInterrupt:
            self._stop(name, quiet=True)
            raise
        except Exception as e:  # noqa: BLE001 - said; its own row starts it again
            self._stop(name, quiet=True)
            sink(f"{server_row(name)}: did not start with {server_row(by)} ({e.__class__.__name__}: "
                 f"{str(e).splitlines()[0][:200] if str(e) else ''}); its own row starts it")
            return
        self.up.add(name)
        self.launched.discard(name)
        self.early[name] = by
        print(f"         {server_row(name):<{self.width}}  ok, with {server_row(by)}: ready {fmt_s(time.time() - t0)} "
              f"after that row began", flush=True)

    def ready(self, name: str, step: str) -> list[dict]:
        """Before ``step``: the service is usable, or it is restarted (the new rows)."""
        if name not in self.up:
            return []
        try:
            why = self.handles[name].check()
        except Exception as e:  # noqa: BLE001
            why = f"its check failed: {e.__class__.__name__}: {e}"
        if not why:
            return []
        self.sinks[name](f"{server_row(name)}: not usable before {step} ({why}); restarting it")
        self._stop(name, quiet=True)
        row = {"step": server_row(name), "status": "", "seconds": 0.0, "kind": "server",
               "command": self.handles[name].describe(), "started_utc": utc_now(), "rc": ""}
        tag = f"[restart] {server_row(name):<{self.width}}"
        print(f"{tag}  started  (before {step})", flush=True)
        self.start(name, row, tag)
        return [row]

    def env(self, name: str) -> dict:
        return self.handles[name].env() if name in self.up else {}

    def after(self, step: str) -> None:
        for n, last in self.last.items():
            if last == step and n in self.up:
                self._stop(n)

    def _stop(self, name: str, quiet: bool = False) -> None:
        t0 = time.time()
        try:
            self.handles[name].stop()
        finally:
            if (name in self.up or name in self.launched) and not quiet:
                self.sinks[name](f"{server_row(name)}: stopped in {time.time() - t0:.1f} s")
            self.up.discard(name)
            self.launched.discard(name)

    def stop_all(self) -> None:
        for n in [*self.up, *self.launched]:
            try:
                self._stop(n)
            except KeyboardInterrupt:           # a second Ctrl-C: the group got SIGKILL; once more, quickly
                self._stop(n, quiet=True)

    def lines(self) -> list[str]:
        out = []
        for n, h in self.handles.items():
            try:
                out += list(h.lines())
            except Exception:  # noqa: BLE001 - the story goes without them
                pass
        return out



def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
