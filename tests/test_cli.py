"""common.run.cli: every bad value is one argparse line before any GPU work."""
import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from common.run import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("fn,good,want", [
    (cli.positive_ints, "1, 32,256", [1, 32, 256]), (cli.fraction, "0.8", 0.8), (cli.fraction, "1", 1.0),
    (cli.rates, "4,16,inf", ["4", "16", "inf"]), (cli.positive_int, "7", 7), (cli.port, "30000", 30000),
    (cli.non_negative_int, "0", 0), (cli.preset, "llama-3.1-8b", "llama-3.1-8b")])
def test_good_values(fn, good, want):
    assert fn(good) == want


@pytest.mark.parametrize("fn,bad,msg", [
    (cli.positive_ints, "abc", "positive integers"), (cli.positive_ints, "1,-1", "positive integers"),
    (cli.positive_ints, "", "positive integers"), (cli.fraction, "5", r"\(0, 1\]"), (cli.fraction, "0", r"\(0, 1\]"),
    (cli.fraction, "x", r"\(0, 1\]"), (cli.rates, "4,fast", "request rates"), (cli.rates, "0", "request rates"),
    (cli.positive_int, "0", "positive integer"), (cli.port, "70000", "1..65535"),
    (cli.preset, "llama-9", "choose from"), (cli.model_dir, "/nonexistent/model", "not a folder")])
def test_bad_values_are_named(fn, bad, msg):
    with pytest.raises(argparse.ArgumentTypeError, match=msg):
        fn(bad)


def test_model_dir_needs_a_config(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError, match="no config.json"):
        cli.model_dir(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert cli.model_dir(str(tmp_path)) == str(tmp_path)


def test_choices_list():
    t = cli.choices_list("cuda", "tc")
    assert t("tc,cuda") == ["tc", "cuda"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown value.*gpu.*choose from cuda, tc"):
        t("cuda,gpu")


def test_argparse_prints_one_error_line_and_exits_2():
    code = ("import sys, argparse; sys.path.insert(0, %r); from common.run import cli; p = argparse.ArgumentParser(prog='x');"
            "p.add_argument('--batches', type=cli.positive_ints); p.parse_args(['--batches', 'abc'])" % str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1] == "x: error: argument --batches: expected positive integers separated by commas, got 'abc'"
