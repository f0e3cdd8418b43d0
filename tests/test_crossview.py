"""common.render.crossview: the same Llama-3.1-8B shapes in the three systems, from their recorded tables.

tests/fixtures/crossview_h200/: the tables the H200 pipeline runs recorded (SGLang `--quick --ncu` at 224595d;
mini-SGLang and FlashInfer `--quick --ncu` at a5d3c27; 2026-11-25), cut to the attention rows, each with its
summary's provenance (tests/fixtures/README.md)."""
import shutil

import pytest

from common.render import crossview, report


@pytest.fixture
def root(fixture_path, tmp_path):
    shutil.copytree(fixture_path("crossview_h200"), tmp_path, dirs_exist_ok=True)
    return tmp_path


def test_decode_rows_keep_only_launches_that_read_the_whole_kv(root):
    rows, used = crossview.decode(root)
    sgl = [r for r in rows if r["system"] == "SGLang"]
    att = next(r for r in sgl if "Merge" not in r["kernel"])
    # 05 recorded 4 decode launches of the attention kernel; 2 read ~19 MB (shorter KV), 2 the 537 MB of KV
    assert att["launches"] == 2 and att["ncu_us"] > 100 and att["dram_pct"] > 80
    assert {r["system"] for r in rows} == {"SGLang", "mini-SGLang", "FlashInfer"} and len(used) == 3
    tc = [r for r in rows if r["kernel"] == "BatchPrefillWithPagedKVCacheKernel"]
    assert len(tc) == 3 and max(r["ncu_us"] for r in tc) / min(r["ncu_us"] for r in tc) < 1.1  # one kernel, one time


def test_prefill_rows_show_the_three_plans_and_no_out_of_range_hit_rate(root):
    rows, _ = crossview.prefill(root)
    by = {(r["system"], r["kernel"]) for r in rows}
    assert ("SGLang", "MergeStateKernel") in by and ("mini-SGLang", "PersistentVariableLengthMergeStatesKernel") in by
    assert ("FlashInfer", "PrefillWithKVCacheKernel") in by                    # FA3: one kernel, no merge
    assert all(r["traced_us"] for r in rows if r["system"] != "FlashInfer")
    assert all(r["l2_hit_pct"] is None or r["l2_hit_pct"] <= 100.5 for r in rows)


def test_the_page_is_rendered_and_a_missing_system_gives_fewer_rows(root):
    (root / "CROSS-SYSTEM.md").write_text("# x\n<!-- auto:runs -->\n<!-- /auto -->\n<!-- auto:cross/decode -->\n"
                                          "old\n<!-- /auto -->\n<!-- auto:cross/nope -->\nkept\n<!-- /auto -->\n")
    out = report.refresh(systems=(), root=root, echo=lambda *a: None)
    page = (root / "CROSS-SYSTEM.md").read_text()
    assert "| SGLang |" in page and "224595d" in page and "old" not in page and "kept" in page
    assert any("cross/nope" in k for k in out.kept)
    shutil.rmtree(root / "sglang")
    rows, used = crossview.decode(root)
    assert rows and "SGLang" not in {r["system"] for r in rows} and len(used) == 2
    shutil.rmtree(root / "mini-sglang")
    shutil.rmtree(root / "flashinfer")
    assert crossview.render("decode", root) == (None, "no system has a run of the decode shape in its results/")
