"""mini-SGLang 00 (check_env) --reanalyse on its real H200 recording: the same verdict for every hypothesis as the
run that recorded it (tests/test_reanalyse.check_reanalysis).

tests/fixtures/recordings_h200/mini-sglang/00_check_env/: summary.json, the tables the analysis reads,
profilers.json, and log.txt + story.txt: the recording is from before facts.csv, so the first-call and reload times,
the tvm-ffi and FlashInfer cache folders and the libnccl paths are read back from them; tests/fixtures/README.md
says which run."""
import json
import shutil

import pytest

from test_reanalyse import REC, check_reanalysis

SCRIPTS = [("mini-sglang", "00_check_env")]


@pytest.mark.parametrize("system,stem", SCRIPTS, ids=[s for _, s in SCRIPTS])
def test_reanalysis_gives_the_recordings_verdicts(system, stem, tmp_path):
    check_reanalysis(system, stem, tmp_path)


def test_the_old_recordings_story_and_headline_come_back(tmp_path):
    """Read from log.txt/story.txt, the facts give the recording's own story and headline, line for line."""
    out = check_reanalysis("mini-sglang", "00_check_env", tmp_path)
    src = REC / "mini-sglang" / "00_check_env"
    assert (out / "story.txt").read_text().strip() == (src / "story.txt").read_text().strip()
    before, after = (json.loads((d / "summary.json").read_text()) for d in (src, out))
    assert after["headline"] == before["headline"]
    assert any("no facts.csv" in n for n in after["notes"])


def test_a_new_recording_reads_facts_csv(tmp_path):
    """A recording with facts.csv (the GPU path writes it since) is re-analysed from it, without log.txt/story.txt."""
    import importlib
    first = check_reanalysis("mini-sglang", "00_check_env", tmp_path / "a")
    src = tmp_path / "rec"
    shutil.copytree(REC / "mini-sglang" / "00_check_env", src)
    (src / "log.txt").unlink()
    (src / "story.txt").unlink()
    mod = importlib.import_module("re_mini_sglang_00_check_env")
    f = {"torch": "2.11.0+cu130", "cuda_runtime": "13.0", "sm_count": "132", "compute_capability": "9.0",
         "flashinfer": "0.6.15.post1", "tvm_ffi": "0.1.11", "nccl": "2.28.9",
         "minisgl_commit": "224595d3d7f83c275d418c5284b5d457da984c8c",
         "minisgl_source": "/work/main/.minisgl/python/minisgl",
         "declared_pins": "not pip-installed (source tree on PYTHONPATH): pins not enforced",
         "cuda_target": "9.0 (from nvidia-smi compute_cap)", "links": "single GPU", "tvm_ffi_cache": "/root/.cache/tvm-ffi",
         "first_call_s index": "0.03097006299999805", "first_call_s store 2048": "0.028795438999992484",
         "first_call_s store 256": "0.03", "first_call_s radix": "0.004001506999998128",
         "reload_ms 1": "110.02675199999601", "reload_ms 2": "142.4451450000106", "reload_ms 3": "111.80068999999548",
         "pynccl_build_s": None, "pynccl_error": None, "libnccl_linker": "/usr/lib/x86_64-linux-gnu/libnccl.so",
         "libnccl_wheel_dir": "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib",
         "flashinfer_cache": "/root/.cache/flashinfer/0.6.15.post1/90a/cached_ops", "radix_cached_before": "True"}
    import pandas as pd
    pd.DataFrame([{"fact": k, "value": v} for k, v in f.items()]).to_csv(src / "facts.csv", index=False)
    out = tmp_path / "b"
    assert mod.main(["--reanalyse", str(src), "--out", str(out)]) == 0
    assert (out / "story.txt").read_text() == (first / "story.txt").read_text()
    after = json.loads((out / "summary.json").read_text())
    assert [o["verdict"] for o in after["observations"]] == \
        [o["verdict"] for o in json.loads((first / "summary.json").read_text())["observations"]]
    assert not any("no facts.csv" in n for n in after["notes"])


def test_the_gpu_path_writes_every_fact_the_reanalysis_reads(tmp_path):
    """facts_rows (the GPU path's facts.csv) names the same facts a re-analysis of an older recording reads back."""
    import importlib
    from pathlib import Path
    from types import SimpleNamespace as NS
    check_reanalysis("mini-sglang", "00_check_env", tmp_path)
    mod = importlib.import_module("re_mini_sglang_00_check_env")
    x = NS(torch=NS(__version__="2.11.0+cu130", version=NS(cuda="13.0")), props=NS(multi_processor_count=132),
           cc="9.0", fi=NS(__version__="0.6.15.post1"), tvm_ffi=NS(__version__="0.1.11"), nccl="2.28.9",
           commit="c", src=Path("/s"), arch="9.0", root=Path("/root/.cache/tvm-ffi"),
           first={k: 0.03 for k in mod.FIRST}, reload=[110.0, 142.0, 112.0], t_nccl=None, nccl_err=None,
           nccl_link={"linker": "/usr/lib/libnccl.so", "wheel": "/w"}, fi_dir=Path("/fi"), radix_cached_before=True)
    rows = mod.facts_rows(x, "single GPU")
    src = REC / "mini-sglang" / "00_check_env"
    rec = mod.recording.open(src, mod.__file__, tables=("packages",))
    pkgs = {r["package"]: str(r["version"]) for r in rec.tables["packages"].to_dict("records")}
    old, _ = mod.facts_from_old(rec, pkgs)
    assert {r["fact"] for r in rows} == set(old)
    assert old["libnccl_wheel_dir"] == "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib"
    assert old["flashinfer_cache"] == "/root/.cache/flashinfer/0.6.15.post1/90a/cached_ops"
    assert old["tvm_ffi_cache"] == "/root/.cache/tvm-ffi" and old["reload_ms 2"] == "142.4451450000106"
