"""common.base.story renders what the reports show; common.render.plots draws without a display."""
import pytest
from common.base import story
from common.capture import ncu
from common.tables import kernels
from common.render import plots


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
    s = kernels.summarize(ncu.read_raw(fixture_path("ncu_raw_fullset_flashinfer_5kernels_h200.csv")), peaks={"dram_tb_s": 4.71})
    line = kernels.line({**s.iloc[0].to_dict(), "dur_us": 199.0})
    assert line.startswith("BatchDecodeWithPagedKVCacheKernel 199 us")
    assert "DRAM 2.72 TB/s = 57.8% of the read ceiling" in line and "registers" in line and "stalls " in line


def test_tree_wraps_long_labels_under_themselves():
    label = "layer gate_up_proj: " + "x" * 60 + " " + " ".join(["word"] * 40)
    t = story.tree("T", [(label, [("child", [])]), ("last", [])])
    lines = t.splitlines()
    assert all(len(x) <= story.WIDTH for x in lines) and lines[1].startswith("├── layer gate_up_proj")
    assert lines[2].startswith("│   │ word") and t.count("child") == 1 and lines[-1] == "└── last"


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


# ------------------------------------------------------------------ figures people read

PK = {"gpu": "NVIDIA H200", "dram_tb_s": 4.3, "bf16_tflops": 780.0, "source": "measured",
      "sources": {"dram_tb_s": "measured", "bf16_tflops": "measured"},
      "method": {"dram_tb_s": "best of 8 probes: triton write BLOCK=16384 warps=8",
                 "bf16_tflops": "best of 16 GEMM shapes: 8192x8192x8192 nt"},
      "datasheet": {"dram_tb_s": 4.8, "bf16_tflops": 989}}


def _scatters(fig):
    """{series name: PathCollection} of the roofline's points (each collection carries its series as gid)."""
    from matplotlib.collections import PathCollection
    return {c.get_gid(): c for c in fig.axes[0].collections if isinstance(c, PathCollection)}


def _rgb(colours):
    return {tuple(round(float(v), 4) for v in c[:3]) for c in colours}


def test_roofline_one_colour_and_marker_per_series():
    """A layer's kernel classes as series: points of one class share a colour; classes never share one."""
    pts = [{"label": f"{cls} {i}", "series": cls, "flop_per_byte": fpb * (1 + i), "tflop_s": tf * (1 + 0.1 * i)}
           for cls, fpb, tf in (("GEMM", 300, 500), ("attention", 1.0, 3.0), ("norm", 0.3, 1.0),
                                ("RoPE", 0.5, 1.5), ("store", 0.1, 0.3))
           for i in range(3)]
    fig = plots.roofline(pts, PK, title="Llama-3.1-8B layer, decode bs=32", series_order=plots.LAYER_CLASSES)
    sc = _scatters(fig)
    assert set(sc) == set(plots.LAYER_CLASSES)
    per_series = {k: _rgb(c.get_facecolors()) for k, c in sc.items()}
    assert all(len(v) == 1 for v in per_series.values())                 # one colour within a series
    assert len(set().union(*per_series.values())) == 5                   # five series, five colours
    markers = {str(c.get_paths()[0].vertices.round(3).tolist()) for c in sc.values()}
    assert len(markers) == 5                                             # and five markers
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert set(plots.LAYER_CLASSES) <= set(labels)                        # 15 points: a legend by series
    assert any(l.startswith("memory roof 4.30 TB/s (measured: best of 8 probes") for l in labels)
    assert any(l.startswith("compute roof bf16 780 TFLOP/s (measured: best of 16 GEMM shapes") for l in labels)
    assert any(l.startswith("datasheet 4.8 TB/s") for l in labels)
    assert "above" not in ax.get_title() and ax.hands_on_above_roof == []
    # a class keeps its colour in a figure that lacks the others
    fig2 = plots.roofline([p for p in pts if p["series"] == "norm"], PK, series_order=plots.LAYER_CLASSES)
    assert _rgb(_scatters(fig2)["norm"].get_facecolors()) == per_series["norm"]


def test_roofline_many_series_never_reuse_a_colour():
    pts = [{"label": f"k{i}", "series": f"s{i}", "flop_per_byte": 1 + i, "tflop_s": 1 + i} for i in range(20)]
    sc = _scatters(plots.roofline(pts, PK))
    assert len(set().union(*(_rgb(c.get_facecolors()) for c in sc.values()))) == 20
    st = plots.styles([f"s{i}" for i in range(60)])
    assert len({(tuple(c), m) for c, m in st.values()}) == 60         # past 20: the marker tells them apart


def test_roofline_few_points_labelled_and_above_roof_flagged():
    pts = [{"label": "decode b32 kv4096", "flop_per_byte": 1.0, "tflop_s": 4.0},      # 4.0 < 4.3: under
           {"label": "decode b64 kv4096", "flop_per_byte": 1.0, "tflop_s": 4.4},      # 4.4 > 4.3 x 1: above
           {"label": "prefill 4096", "flop_per_byte": 600, "tflop_s": 700}]
    fig = plots.roofline(pts, PK, title="Paged decode")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert {"decode b32 kv4096", "decode b64 kv4096", "prefill 4096"} <= set(texts)   # labels beside the points
    assert "1 point(s) above the measured roof: the ceiling probe under-measures" in ax.get_title()
    assert ax.hands_on_above_roof == ["decode b64 kv4096"]
    sc = _scatters(fig)
    assert len(sc) == 3                                                   # no series given: one per point
    assert len(set().union(*(_rgb(c.get_facecolors()) for c in sc.values()))) == 3
    red = (1.0, 0.0, 0.0)
    assert _rgb(sc["decode b64 kv4096"].get_edgecolors()) == {red}
    assert red not in _rgb(sc["decode b32 kv4096"].get_edgecolors())
    # labelled points need no legend entries of their own: the legend holds only the roofs
    assert not set(ax.get_legend_handles_labels()[1]) & {p["label"] for p in pts}


def test_roofline_datasheet_roof_is_named():
    pk = {"gpu": "NVIDIA H100", "dram_tb_s": 3.35, "bf16_tflops": 989, "source": "datasheet",
          "sources": {"dram_tb_s": "datasheet", "bf16_tflops": "datasheet"}}
    fig = plots.roofline([{"label": "x", "flop_per_byte": 1.0, "tflop_s": 1.0}], pk)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "memory roof 3.35 TB/s (datasheet)" in labels and not any(l.startswith("datasheet ") for l in labels)


def test_sweep_colours_distinct():
    import pandas as pd
    df = pd.DataFrame({"n": list(range(4)) * 12, "y": range(48), "g": [f"b{i // 4}" for i in range(48)]})
    fig = plots.sweep(df, "n", "y", hue="g")
    lines = [l for l in fig.axes[0].lines if l.get_gid()]
    assert len(lines) == 12
    assert len({tuple(round(v, 4) for v in l.get_color()[:3]) for l in lines}) == 12


def test_a_percent_sweep_draws_and_names_its_ceiling():
    import pandas as pd
    df = pd.DataFrame({"tokens": [1, 2, 4], "pct_peak_dram": [40.0, 70.0, 91.0], "v": ["a"] * 3})
    of = "the measured DRAM ceiling 4.7 TB/s (best of 7 probes: fill_) of NVIDIA H200"
    ax = plots.sweep(df, "tokens", "pct_peak_dram", hue="v", of=of).axes[0]
    assert ax.get_ylabel() == "% of the measured DRAM ceiling"
    roof = [l for l in ax.lines if l.get_label() == of]
    assert len(roof) == 1 and list(roof[0].get_ydata()) == [100, 100]


def test_fold_and_section_on_a_real_story(fixture_path):
    """The H200 08 story of the --quick --ncu pipeline run (commit 224595d; tests/fixtures/README.md), as recorded
    before stories were folded: its first line (the quick mode's changes) is over 120 characters. fold() brings every line to <= 120
    without losing a word, and is a no-op the second time; section() picks top-level branches, cut to a depth."""
    import gzip
    import re
    from common.base import story
    raw = gzip.open(fixture_path("sglang_08_story_h200_g2.txt.gz"), "rt").read()
    assert max(map(len, raw.split("\n"))) > 300
    f = story.fold(raw)
    assert max(map(len, f.split("\n"))) <= story.WIDTH and story.fold(f) == f
    words = lambda t: re.sub(r"[│├└─\s]+", " ", t).split()  # noqa: E731
    assert words(f) == words(raw)                                           # nothing cut off, nothing added
    w = story.section(f, ["TTFT waterfall", "ITL waterfall"])
    assert "client TTFT (median)" in w and "EXTEND step" not in w and w.startswith("NOT SGLang's default")
    one = story.section(f, ["one request"], depth=2)
    assert "EXTEND step (bs 1)" in one and "layer qkv_proj" not in one and "deeper lines in story.txt" in one
    assert "layer qkv_proj" in story.section(f, ["one request"], depth=3)
    with pytest.raises(KeyError, match="the branches are"):
        story.section(f, ["no such branch"])
