"""`--reanalyse DIR` of FlashInfer's 00, 01, 04, 05 and 07 (common.run.recording): each script's analysis again, on a CPU,
from its real H200 recording in tests/fixtures/recordings_h200/flashinfer/<stem>/ (the `--quick --ncu` pipeline run
of commit a5d3c27, 2026-11-25; tests/fixtures/README.md): the same verdict for every hypothesis as the recording."""
import pytest

from test_reanalyse import check_reanalysis, copy_recording

# script stems whose --reanalyse is proven on their recording
STEMS = ["04_profile_rmsnorm", "05_profile_rope", "01_test_kernels", "07_jit_analysis", "00_check_env"]


@pytest.mark.parametrize("stem", STEMS)
def test_flashinfer_reanalysis_gives_the_recordings_verdicts(stem, tmp_path):
    check_reanalysis("flashinfer", stem, tmp_path)


def test_01_reads_its_probes_table_like_the_facts_it_derives(tmp_path):
    """01's verdicts read facts the GPU phase probes (the norm path, the rejected shape, the GPU); a run from now on
    records them in probes.csv. The a5d3c27 recording predates it: its facts are read back from its provenance and
    observations. Written as probes.csv beside that recording (the columns the GPU phase writes), the re-analysis
    reads the table instead and gives the same verdicts."""
    import json
    pd = pytest.importorskip("pandas")
    from common.run import recording
    m01, src = copy_recording("flashinfer", "01_test_kernels", tmp_path, "re_fi_01_probes")
    facts, how = m01.probes_of(recording.open(src, m01.__file__, tables=("checks", "modules"), optional=("probes",)))
    assert how and facts["cuda_norm"] is True and facts["cutlass_dsl_importable"] is False and facts["rejected"] is True
    assert facts["compute_major"] == 9 and facts["gpu_name"] == "NVIDIA H200" and facts["failures"] == ""
    pd.DataFrame([facts], columns=m01.PROBE_COLUMNS).to_csv(src / "probes.csv", index=False)
    again, how = m01.probes_of(recording.open(src, m01.__file__, tables=("checks", "modules"), optional=("probes",)))
    assert how is None and again == facts
    out = tmp_path / "out"
    assert m01.main(["--reanalyse", str(src), "--out", str(out)]) == 0
    verdicts = [{o["hypothesis"]: o["verdict"] for o in json.loads((d / "summary.json").read_text())["observations"]}
                for d in (src, out)]
    assert verdicts[0] == verdicts[1]


def test_07_reads_its_passes_table_and_each_cli_calls_text(tmp_path):
    """07's story prints each pass's wall time, CPUs, MAX_JOBS and your cache's folder, which no table of the a5d3c27
    recording held: from now on passes.csv; that recording's are read from its story. Written as passes.csv beside
    it, the re-analysis reads the table and tells the same story. The jit-cli verdict reads the CLI's output, kept in
    cli_module_status.txt: a full run makes two calls of the same command, each output with blank lines in it."""
    import json
    m07, src = copy_recording("flashinfer", "07_jit_analysis", tmp_path, "re_fi_07_passes")
    summary = json.loads((src / "summary.json").read_text())
    passes = m07.passes_from_story(summary["story"])
    assert list(passes["wall_s"].iloc[:2]) == [18.5, 5.6] and passes["module_folders"].iloc[2] == 7
    passes.to_csv(src / "passes.csv", index=False)
    out = tmp_path / "out"
    assert m07.main(["--reanalyse", str(src), "--out", str(out)]) == 0
    after = json.loads((out / "summary.json").read_text())
    # the same story, but an unset MAX_JOBS reads 'unset' (the recording printed Python's None); read back the same
    assert "MAX_JOBS=None" in summary["story"]
    assert (out / "story.txt").read_text() == summary["story"].replace("MAX_JOBS=None", "MAX_JOBS=unset") + "\n"
    assert m07.passes_from_story((out / "story.txt").read_text())["max_jobs"].isna().iloc[0]
    assert not any("passes" in n for n in after["notes"])
    cmd = "python -m flashinfer module-status --filter compiled"
    text = "\n\n".join(f"$ {cmd}\n{body}" for body in ("A\n\n=== Summary ===\nCompiled: 1", "B\n\nCompiled: 5"))
    assert m07.cli_texts(text, [cmd, cmd]) == ["A\n\n=== Summary ===\nCompiled: 1", "B\n\nCompiled: 5"]
    assert m07.cli_texts(text, [cmd, cmd, cmd]) == [None] * 3


def test_00_reads_its_device_table_and_probes_nothing(tmp_path):
    """00's story prints the GPU's memory as torch reports it, which the a5d3c27 recording kept only in its story
    (its provenance has NVML's 150.8 GB, the story torch's 150): from now on device.csv. Written beside that
    recording, the re-analysis reads it and tells the same story. Without environment.json (the profilers and
    FlashInfer's paths were probed on the GPU machine and recorded only there) it is one [setup] line."""
    import json
    pd = pytest.importorskip("pandas")
    from common.run import recording
    from common.base.checks import SetupError
    m00, src = copy_recording("flashinfer", "00_check_env", tmp_path, "re_fi_00_device")
    rec = recording.open(src, m00.__file__, tables=("peaks",), optional=("device",))
    dev, how = m00.device_from(rec, json.loads((src / "environment.json").read_text()))
    assert how and dev["total_memory_bytes"] == 150e9 and dev["l2_bytes"] == 60 * 2**20 and dev["cc_major"] == 9
    pd.DataFrame([dev], columns=m00.DEVICE_COLUMNS).to_csv(src / "device.csv", index=False)
    out = tmp_path / "out"
    assert m00.main(["--reanalyse", str(src), "--out", str(out)]) == 0
    summary = json.loads((src / "summary.json").read_text())
    assert (out / "story.txt").read_text() == summary["story"] + "\n"
    assert not any("device.csv" in n for n in json.loads((out / "summary.json").read_text())["notes"])
    (src / "environment.json").unlink()
    with pytest.raises(SetupError, match="no environment.json: the profilers"):
        m00.main(["--reanalyse", str(src), "--out", str(tmp_path / "out2")])
