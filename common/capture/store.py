"""Where a run's files live on disk: results/<stem>, .previous, .failed; atomic writes; recovery after a crash.

The folder layout and the moves that keep it whole (common.run.results.Run writes through them;
common.render.report and common.run.recording read what they left)::

    <stem>/                                the last successful run, whole ("status": "ok", "schema": SCHEMA)
    .partial-<stem>-<stamp>-<pid>/         a run in progress; pruned once its pid is dead
    .previous/<stem>/                      the run it replaced (one copy)
    .failed/<stem>/<stamp>-<pid>-<status>/ failed | interrupted | setup-error runs (the last KEEP_FAILED kept,
                                           within KEEP_FAILED_BYTES: see prune_failed)
"""
from __future__ import annotations

import csv
import datetime as _dt
import errno
import json
import math
import os
import re
import shutil
import stat
from pathlib import Path

from common.base.checks import SetupError

SCHEMA = 2              # summary.json layout version; common.render.report reads only this one

SUMMARY = "summary.json"

KEEP_FAILED = 5         # failed / interrupted runs kept per stem
KEEP_FAILED_BYTES = 512 * 2**20     # what they may hold together, beyond the newest: older ones shrink to RECORD
RECORD = ("summary.json", "error.txt")   # a failed run's small record: what it was, how it ended

DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)

_STALE = re.compile(r"^\.(partial|trash)-.+-(\d+)$")   # our temporary folders end in -<pid>

_FAILED = re.compile(r"^\d{8}-\d{6}-\d{6}-\d+-[a-z-]+$")  # .failed/<stem>/<stamp>-<pid>-<status>


class ResultsError(SetupError):
    """The results could not be written (disk full, read-only, quota); earlier results are intact."""


def _jsonable(o):
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, set):
        return sorted(o)
    return str(o)


def _clean(o):
    """NaN/inf are not JSON: store them as null."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def write_json_atomic(path: Path, data) -> None:
    """Write JSON to a temp file in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(_clean(json.loads(json.dumps(data, default=_jsonable))), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def dangling(entry: Path) -> str | None:
    """Why a results entry that is a symbolic link cannot take a run: its target does not exist (a disk that is not
    mounted leaves its bare mount point, where a run must create nothing). None when it is no link or its target is
    there."""
    if not os.path.islink(entry) or os.path.exists(entry):
        return None
    target = Path(entry).resolve()
    if script_of(previous_dir(target)) is not None:
        return None          # a run killed between its two renames: recover() puts the last one back there
    return (f"{entry} is a link to {target}, which does not exist (is its disk mounted?); nothing was written: mount "
            f"the disk, create {target}, or remove the link")


def unusable(final: Path, e: OSError) -> str | None:
    """The true reason, in words, why a results folder ``final`` could not be made, for the two errors whose errno
    text misleads ('not writable'): a file where a folder of its path should be, a name too long for the file system
    (with the .partial-<name>-<time>-<pid> folder a run writes beside it). None for the others."""
    final = Path(final)
    if e.errno in (errno.ENOTDIR, errno.EEXIST):
        for p in reversed([final, *final.parents]):
            if os.path.lexists(p) and not os.path.isdir(p):
                return f"{p} is a file, not a folder"
    if e.errno == errno.ENAMETOOLONG:
        try:
            limit = os.pathconf(next(p for p in final.parents if p.is_dir()), "PC_NAME_MAX")
        except (OSError, ValueError, StopIteration):
            limit = 255
        room = limit - len(f".partial--{_stamp()}-{os.getpid()}")
        longest = max(final.parent.parts, key=len, default="")
        if len(longest) > limit:
            return f"a folder name in its path is {len(longest)} characters; this file system takes at most {limit}"
        return (f"its name is {len(final.name)} characters; beside it a run writes .partial-<name>-<time>-<pid>, so "
                f"this file system ({limit} a name) takes names of at most {room}")
    return None


def disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from or during) is a full disk, a quota or a read-only file
    system: then a failed run keeps only its small record (nothing of its own files fits)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _size(p: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(p):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def shrink(record: Path) -> None:
    """Keep only the small record (RECORD) of a failed run's folder."""
    for p in list(record.iterdir()) if record.is_dir() else ():
        if p.name in RECORD:
            continue
        if p.is_dir() and not p.is_symlink():
            _rmtree(p)
        else:
            p.unlink(missing_ok=True)


def prune_failed(root: Path) -> None:
    """Bound ``.failed/<stem>/``: the last KEEP_FAILED runs; the newest whole, the older ones whole while they hold
    KEEP_FAILED_BYTES together, beyond that shrunk to their small record. Failed runs never fill a disk."""
    try:
        kept = sorted((p for p in Path(root).iterdir() if _FAILED.match(p.name)), reverse=True)
    except OSError:
        return
    for p in kept[KEEP_FAILED:]:
        _rmtree(p)
    total = 0
    for p in kept[1:KEEP_FAILED]:
        size = _size(p)
        if total + size > KEEP_FAILED_BYTES:
            shrink(p)
            size = _size(p)
        total += size


def _stamp() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")


def _oserr(e: OSError) -> str:
    return f"[Errno {e.errno}] {e.strerror}" if e.strerror else f"{e.__class__.__name__}: {e}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rmtree(p: Path) -> None:
    """Remove a folder of ours; a symbolic link goes, never what it points to."""
    if p.is_symlink():
        p.unlink(missing_ok=True)
    else:
        shutil.rmtree(p, ignore_errors=True)


def results_dir(script_file: str | Path) -> Path:
    """``<system>/results/<stem>/`` for a script at ``<system>/scripts/<stem>.py``."""
    script = Path(script_file).resolve()
    return script.parent.parent / "results" / script.stem


def previous_dir(final: Path) -> Path:
    """Where the run a newer one replaced is kept: ``<parent>/.previous/<name>``."""
    return final.parent / ".previous" / final.name


def failed_dir(final: Path) -> Path:
    """Where failed and interrupted runs of ``final`` are kept: ``<parent>/.failed/<name>/``."""
    return final.parent / ".failed" / final.name


def newer_schema(summary: dict, src) -> str | None:
    """Why a recording cannot be re-analysed by this workbook: its summary.json has a schema newer than SCHEMA (a later
    workbook wrote it; its fields may mean other things), or one that is no number. None when it can: an older
    summary, or one without the key, is read as it was and its re-analysis is written as SCHEMA."""
    v = summary.get("schema")
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and v <= SCHEMA):
        return None
    commit = ((summary.get("provenance") or {}).get("git") or {}).get("commit")
    return (f"--reanalyse {src}: a recording of summary schema {v!r}, newer than this workbook's ({SCHEMA}): "
            f"re-analyse it with the workbook that recorded it{f' (commit {str(commit)[:12]})' if commit else ''}, or "
            f"update this one (git pull); it is not rewritten as schema {SCHEMA}")


def script_of(dir_: Path) -> str | None:
    """The script whose run a folder holds (``"script"`` of its summary.json), or None when it is not a
    results folder (absent, not a folder, no readable summary)."""
    try:
        s = json.loads((Path(dir_) / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    return s.get("script") if isinstance(s, dict) else None


def foreign(path: Path, script: str) -> str | None:
    """Why a run of ``script`` may not replace (or discard) ``path``: it exists and is not a results folder
    of that script. None when absent or one. Only such folders are ever moved or deleted. A folder that
    another run moves away while it is read is looked at again (two runs of one script at once)."""
    for _ in range(50):
        try:
            before = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISDIR(before.st_mode):        # the stat above, not a second look that a rename can race
            return "is not a folder"
        made = script_of(path)
        try:
            after = os.stat(path)
        except FileNotFoundError:
            continue
        if (after.st_ino, after.st_dev) == (before.st_ino, before.st_dev):
            break
    if made is None:
        return "is not a results folder (no summary.json of a run)"
    return None if made == script else f"holds a run of {made}"


def recover(final: Path) -> bool:
    """Put ``.previous/<name>`` back when a process died between the two renames of a finish."""
    final = Path(final)
    prev = previous_dir(final)
    if os.path.lexists(final) or script_of(prev) is None:    # only a run of ours goes back
        return False
    try:
        os.rename(prev, final)
        return True
    except OSError:  # another process got there first, or the folder is read-only
        return False


def load_summary(dir_: str | Path) -> dict | None:
    """The summary.json of a results folder, or None when absent or unreadable."""
    recover(Path(dir_))
    p = Path(dir_) / SUMMARY
    try:
        s = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return s if isinstance(s, dict) else None


def _prune_stale(base: Path) -> None:
    """Remove ``.partial-*`` / ``.trash-*`` folders whose owner process is gone."""
    try:
        entries = list(base.iterdir())
    except OSError:
        return
    for p in entries:
        m = _STALE.match(p.name)
        if m and int(m.group(2)) != os.getpid() and not _pid_alive(int(m.group(2))):
            _rmtree(p)


def _aside(p: Path) -> Path | None:
    """Rename folder ``p`` out of the way (atomic) to a ``.trash-*`` name; None when there is none."""
    trash = p.parent.parent / f".trash-{p.name}-{_stamp()}-{os.getpid()}"
    try:
        os.rename(p, trash)
    except FileNotFoundError:
        return None
    return trash


def _put_back(trash: Path | None, p: Path) -> None:
    """Undo :func:`_aside` (a newer run's folder already at ``p`` wins: then the trash goes)."""
    if trash is None:
        return
    try:
        os.rename(trash, p)
    except OSError:
        _rmtree(trash)


def _swap_in(src: Path, final: Path, script: str) -> None:
    """Replace folder ``final`` by ``src``; the replaced folder becomes ``.previous/<name>``. Only a results
    folder of ``script`` is ever moved or dropped, and the kept ``.previous`` run goes only once ``src``
    is in place (a rename that fails leaves both as they were)."""
    prev = previous_dir(final)
    prev.parent.mkdir(exist_ok=True)
    for _ in range(20):  # a concurrent run may slip in between two renames: then go round again
        for p in (final, prev):
            why = foreign(p, script)
            if why:
                raise OSError(errno.EEXIST, f"{p} {why}: not replaced")
        old = _aside(prev)
        try:
            _rename_pair(final, prev, src)
        except OSError as e:
            _put_back(old, prev)
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                continue
            raise
        if old:
            _rmtree(old)
        return
    raise OSError(errno.EBUSY, f"{final} kept changing while this run was moved in")


def _rename_pair(final: Path, prev: Path, src: Path) -> None:
    """``final`` -> ``prev`` (when there), then ``src`` -> ``final``; the first is undone if the second fails."""
    try:
        os.rename(final, prev)
        moved = True
    except FileNotFoundError:
        moved = False
    try:
        os.rename(src, final)
    except OSError:
        if moved:
            recover(final)
        raise


def _write_csv(p: Path, rows: list[dict]) -> None:
    """A list of dicts as CSV without pandas (columns in order of first appearance)."""
    cols: dict = {}
    for r in rows:
        cols.update(dict.fromkeys(r))
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(cols))
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if v is None or (isinstance(v, float) and math.isnan(v)) else v
                        for k, v in r.items()})


# ------------------------------------------------------------------ reading a run back

def summary_problem(s) -> str | None:
    """What makes a summary.json unusable for reports, or None when it is a finished, successful run
    of this schema with provenance."""
    if not isinstance(s, dict):
        return f"not a JSON object (a {type(s).__name__})"
    schema = s.get("schema")
    if schema is None:
        return f"no \"schema\" key (an older summary; reports read schema {SCHEMA}): re-run the script"
    if not isinstance(schema, int) or schema < SCHEMA:
        return f"schema {schema!r} is older than {SCHEMA}: re-run the script"
    if schema > SCHEMA:
        return f"schema {schema} is newer than this workbook reads ({SCHEMA}): update the workbook"
    if s.get("status") != "ok":
        return f"status {s.get('status')!r}: only finished, successful runs refresh reports"
    prov = s.get("provenance")
    if not isinstance(prov, dict) or not prov.get("date_utc"):
        return "no provenance (GPU, stack, commit, date)"
    for k, t in (("packages", dict), ("git", dict), ("reanalysed", dict)):
        if prov.get(k) is not None and not isinstance(prov[k], t):
            return f"provenance \"{k}\" is a {type(prov[k]).__name__}, not an object"
    for k, t in (("headline", dict), ("observations", list), ("point_errors", list), ("story", str), ("findings", list)):
        if s.get(k) is not None and not isinstance(s[k], t):
            return f"\"{k}\" is a {type(s[k]).__name__}, not a {t.__name__}"
    for i, o in enumerate(s.get("observations") or [], 1):
        if not isinstance(o, dict) or not {"expected", "observed", "verdict"} <= set(o):
            return f"observation {i} lacks expected/observed/verdict"
    if any(not isinstance(e, dict) for e in s.get("point_errors") or []):
        return "a point error is not an object"
    return None


def read_summary(p: Path) -> tuple[dict | None, str]:
    """(a finished, successful run's summary, "") or (None, what is wrong) for results/<stem>/summary.json."""
    try:
        s = json.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not text (undecodable bytes)"
    except ValueError as e:
        return None, f"not valid JSON ({e})"
    except OSError as e:
        return None, f"unreadable ({e.strerror or e})"
    why = summary_problem(s)
    return (None, why) if why else (s, "")
