"""common.story renders what the reports show; common.plots draws without a display."""
from common import ncu, plots, story


def test_tree_shape():
    t = story.tree("STORY", [("prefill 38 ms", [("attention", []), ("mlp", [])]), ("decode", [])])
    assert t.splitlines() == ["STORY", "├── prefill 38 ms", "│   ├── attention", "│   └── mlp", "└── decode"]


def test_timeline_places_events_in_time():
    out = story.timeline([{"lane": "a", "start": 0, "end": 5}, {"lane": "b", "start": 5, "end": 10}], width=21)
    a, b = out.splitlines()[:2]
    bar_a, bar_b = a.split("|")[1], b.split("|")[1]
    assert bar_a.index("#") == 0 and bar_a.rstrip().endswith("#") and len(bar_a.rstrip()) == 11
    assert bar_b.index("#") == 10


def test_kernel_line_from_real_ncu_row(fixture_path):
    s = ncu.summarize(ncu.read_raw(fixture_path("ncu_raw_fullset_flashinfer_5kernels_h200.csv")))
    line = story.kernel_line(s.iloc[0].to_dict())
    assert line.startswith("BatchDecodeWithPagedKVCacheKernel 199 us")
    assert "DRAM 56.6%" in line and "registers" in line and "stalls:" in line


def test_fmt_and_table():
    assert story.fmt(float("nan")) == "-" and story.fmt(1234567.0) == "1,234,567" and story.fmt(3.14159) == "3.14"
    assert story.fmt(1955.08) == "1,955" and story.fmt(1965) == "1,965" and story.fmt(450.4) == "450"  # one style per column
    t = story.table([{"k": "a", "v": 1.5}, {"k": "bb", "v": 22.25}], ["k", "v"])
    assert t.splitlines()[2].startswith("a ") and t.splitlines()[3].endswith("22.2")


def test_plots_write_png(tmp_path):
    import pandas as pd
    fig = plots.roofline([{"label": "x", "flop_per_byte": 100, "tflop_s": 300}],
                         {"dram_tb_s": 4.0, "bf16_tflops": 800, "gpu": "test", "source": "measured"})
    fig.savefig(tmp_path / "r.png")
    df = pd.DataFrame({"n": [1, 2, 4, 1, 2, 4], "y": [1, 2, 3, 2, 3, 4], "g": list("aaabbb")})
    plots.sweep(df, "n", "y", hue="g", logx=True).savefig(tmp_path / "s.png")
    assert (tmp_path / "r.png").stat().st_size > 5000 and (tmp_path / "s.png").stat().st_size > 5000
