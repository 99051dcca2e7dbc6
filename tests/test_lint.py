"""ruff, configured in pyproject.toml ([tool.ruff]: E, F and W at 120 columns), finds nothing in the project."""
import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def ruff_check(*args: str) -> subprocess.CompletedProcess:
    # a missing ruff fails rather than skips: a skipped lint test would let every finding through unnoticed
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed in this environment: run `make setup` (it installs the dev extras)")
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_ruff_finds_nothing():
    run = ruff_check(str(ROOT))
    assert run.returncode == 0, f"ruff check found problems (rules in pyproject.toml):\n{run.stdout}{run.stderr}"


def test_a_long_line_fails_the_check(tmp_path):
    """The check can fail: a 130-character line breaks the project's 120."""
    source = tmp_path / "long_line.py"
    line = 'X = "' + "x" * 124 + '"'
    assert len(line) == 130
    source.write_text(line + "\n")
    run = ruff_check("--config", str(ROOT / "pyproject.toml"), str(source))
    assert run.returncode != 0 and "E501" in run.stdout, run.stdout + run.stderr
