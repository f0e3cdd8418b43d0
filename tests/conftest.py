"""Shared test setup: repo root on sys.path, a temporary cache, the `gpu` marker, the fixtures folder.

Every test, and every process a test starts, uses a cache of this session's own (HANDS_ON_CACHE: a
temporary folder, removed at the end): error files, pidfiles, model folders and measured ceilings never go
to the user's ~/.cache/hands-on (nor to a HANDS_ON_CACHE the user set)."""
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(ROOT))
CACHE = Path(tempfile.mkdtemp(prefix="hands-on-test-cache-"))
os.environ["HANDS_ON_CACHE"] = str(CACHE)


def pytest_unconfigure(config):
    shutil.rmtree(CACHE, ignore_errors=True)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (and ncu/nsys where named); "
                            "run on the GPU machine with `make test-gpu`")
    config.addinivalue_line("markers", "stack: needs the serving stack installed (SGLang), not a GPU; skipped "
                            "where it is absent, run on the GPU machine by `make test-gpu` too")


@pytest.fixture
def fixture_path():
    def get(name: str) -> Path:
        p = FIXTURES / name
        assert p.exists(), f"missing fixture {p}"
        return p
    return get
