"""Shared test setup: repo root on sys.path, the `gpu` marker, the fixtures folder."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(ROOT))


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
