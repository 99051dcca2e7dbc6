"""Shared fixtures. Without CUDA, kernels run under the Triton interpreter, which must be chosen before triton loads."""
import os
import shutil
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """A test marked gpu is skipped, with its reason, where there is no CUDA: under the interpreter the panel's shapes
    would run for hours, and no GPU test asserts anything about the interpreter."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here): run make test-gpu on a GPU machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


ROOT = Path(__file__).resolve().parent.parent
REDTEAM = Path(__file__).resolve().parent / "redteam"
TOY = ROOT / "tests" / "toy_task"
# the W4A16 family under test: its draft while one differs from main (one copy otherwise), else main
W4A16_FAMILY = next(p for p in (ROOT / "methods" / "drafts" / "w4a16", ROOT / "methods" / "main") if p.is_dir())
# the toy task as the repository ships it: v0 and main, without whatever runs of it in this checkout recorded
TOY_SHIPPED = shutil.ignore_patterns("__pycache__", "experiment_log.md", "index*.jsonl", ".lock", "v[1-9]*")
sys.path.insert(0, str(ROOT))


@pytest.fixture
def device() -> torch.device:
    from evals.kernel_harness import select_device

    return select_device().device


@pytest.fixture
def redteam_solution(tmp_path):
    """Materialize tests/redteam/<name>.py as a solution directory (solution.py beside its core.py helper)."""

    def make(name: str) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        shutil.copy(REDTEAM / f"{name}.py", directory / "solution.py")
        shutil.copy(REDTEAM / "core.py", directory / "core.py")
        return directory

    return make


@pytest.fixture
def panel_file(tmp_path):
    """Write a panel JSON of the given cases [(stratum, m, k, n, epilogue, seed), ...] and return its path."""
    import json

    def make(*cases) -> Path:
        path = tmp_path / "panel.json"
        keys = ("stratum", "m", "k", "n", "epilogue", "seed")
        path.write_text(json.dumps({"cases": [dict(zip(keys, case)) for case in cases]}))
        return path

    return make
