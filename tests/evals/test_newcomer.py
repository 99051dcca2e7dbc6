"""A newcomer's first hour with the evaluator's modules: a solution that does not load says why on the
terminal, an empty panel is a usage error, and without CUDA every module defaults to the smoke panel, as make does."""
import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

DEFAULT_PANEL = "visible" if torch.cuda.is_available() else "smoke"
SMOKE_CASES = len(json.loads((ROOT / "tasks" / "w4a16" / "panels" / "smoke.json").read_text())["cases"])


def module(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"evals.{name}", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture
def unparsable(tmp_path):
    solution = tmp_path / "unparsable"
    solution.mkdir()
    (solution / "solution.py").write_text("def build(qweight, scales, bias, epilogue:\n    pass\n")
    return solution


def test_selfcheck_prints_why_a_solution_did_not_load(unparsable, panel_file):
    run = module("selfcheck", "--solution", str(unparsable), "--panel",
                 str(panel_file(("balanced", 18, 256, 256, "silu", 1))))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "did not load" in run.stdout and "PolicyViolation" in run.stdout, run.stdout
    assert "cannot parse" in run.stdout and "was never closed" in run.stdout, run.stdout


@pytest.mark.parametrize("name", ["selfcheck", "residency", "profile"])
def test_without_a_panel_the_modules_pick_the_one_make_picks(name, unparsable, tmp_path):
    out = tmp_path / "report.json"
    run = module(name, "--solution", str(unparsable), "--json", str(out))
    assert run.returncode in (0, 1), run.stdout + run.stderr  # without CUDA the profile loads no solution
    report = json.loads(out.read_text())
    assert report["panel"] == DEFAULT_PANEL
    if DEFAULT_PANEL == "smoke":
        assert len(report["cases"]) == SMOKE_CASES


def test_a_panel_without_cases_is_a_usage_error(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text('{"cases": []}')
    for args in (["--list-cases", "--panel", str(empty)], ["--solution", "methods/versions/v0", "--panel", str(empty)]):
        run = module("selfcheck", *args)
        assert run.returncode == 2 and "no cases" in run.stderr, run.stdout + run.stderr
    listed = module("selfcheck", "--list-cases", "--panel", "smoke")
    assert listed.returncode == 0 and len(listed.stdout.strip().splitlines()) == SMOKE_CASES, listed.stdout
