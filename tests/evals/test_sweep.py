"""The sweep (evals/sweep.py): its per-pair check on real kernels (interpreter on CPU), its table, and its usage errors.
The timing half needs CUDA and runs on the GPU only (`make sweep`)."""
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from evals import sweep
from evals import task as tasks
from evals.loader import load_solution
from tests.conftest import ROOT, W4A16_FAMILY

FAMILY = str(W4A16_FAMILY)
TASK = tasks.load("w4a16")


def test_check_pair_runs_the_oracle_and_reports_a_bad_plan_as_a_row():
    case = asdict(TASK.cases("smoke")[0])  # the case's fields: what crosses to the worker process
    good = sweep._check_pair("w4a16", FAMILY, case, {"BLOCK_SIZE_N": 128, "SPLIT_K": 2})
    assert good == {"ok": True, "error": None}
    bad = sweep._check_pair(str(TASK.folder), FAMILY, case, {"GRID": 7})
    assert not bad["ok"] and "GRID must be one of (0, 1)" in bad["error"]


def test_check_pair_serves_the_llgemm_family_with_its_knobs():
    """llgemm's family (from v70) takes config=overrides as the sweep passes them: a GEMV plan is checked on the
    interpreter, an unknown knob is a row with its error."""
    family = str(ROOT / "tasks" / "llgemm" / "versions" / "v70")
    case = asdict(tasks.load("llgemm").cases("smoke")[0])
    good = sweep._check_pair("llgemm", family, case, {"FALLBACK": False, "MMA": False, "BLOCK_N": 4, "BLOCK_K": 64,
                                                     "SPLIT_K": 2, "VEC": 1})
    assert good == {"ok": True, "error": None}
    bad = sweep._check_pair("llgemm", family, case, {"GRID": 1})
    assert not bad["ok"] and "unknown knob(s) GRID" in bad["error"]


def test_table_orders_plans_by_eager_time_against_the_own_plan():
    def row(overrides, eager, **extra):
        return {"case": "a", "overrides": overrides, "eager_us": eager, "graph_hot_us": eager / 2,
                "graph_flushed_us": eager / 2 + 1, "correct_after": True, **extra}

    rows = [row({}, 10.0, spread=1.31), row({"X": 1}, 8.0), row({"Y": 1}, 5.0, correct_after=False),
            {"case": "a", "overrides": {"Z": 1}, "error": "OutOfResources: shared memory"}]
    lines = sweep.table({"timed": rows}).splitlines()[2:]
    assert lines[0].startswith('| a | {"X": 1} | 8.00 | 1.25 | - |')
    assert lines[1].startswith("| a | {} | 10.00 | 1.00 | 1.310 |")  # the spread the verifier's dispersion gate reads
    assert "wrong after timing" in lines[2] and "OutOfResources" in lines[3]  # never ranked, always listed


def test_a_graph_paired_tasks_table_ranks_plans_by_the_lower_of_their_speedups_over_the_baseline():
    """llgemm scores a case at the lower of its hot and flushed speedups over F.linear: a plan fast hot and slow
    flushed ranks below one a little faster in both, and eager time ranks nothing."""
    def row(overrides, hot, flushed, eager, **extra):
        return {"case": "a", "overrides": overrides, "eager_us": eager, "graph_hot_us": hot,
                "graph_flushed_us": flushed, "baseline_hot_us": 6.0, "baseline_flushed_us": 9.0,
                "correct_after": True, **extra}

    rows = [row({}, 6.0, 9.0, 9.0), row({"X": 1}, 5.0, 10.0, 1.0), row({"Y": 1}, 5.5, 8.5, 20.0),
            row({"Z": 1}, 1.0, 1.0, 1.0, correct_after=False), {"case": "a", "overrides": {"W": 1}, "error": "boom"}]
    title, _, _, *lines = sweep.table({"graph_paired": True, "timed": rows}).splitlines()
    assert "lower of their hot and flushed speedups over the baseline" in title
    assert lines[0].startswith('| a | {"Y": 1} | 5.50 | 8.50 | 1.09 | 1.06 | 1.06 |')
    assert lines[1].startswith("| a | {} | 6.00 | 9.00 | 1.00 | 1.00 | 1.00 |")
    assert lines[2].startswith('| a | {"X": 1} | 5.00 | 10.00 | 1.20 | 0.90 | 0.90 |')
    assert lines[3].startswith("| a | baseline | 6.00 | 9.00 |")
    assert "wrong after timing" in lines[4] and "boom" in lines[5]  # never ranked, always listed
    without = [{k: v for k, v in r.items() if not k.startswith("baseline")} for r in rows]  # no baseline replayed
    title, _, _, *lines = sweep.table({"graph_paired": True, "timed": without}).splitlines()
    assert "over the solution's own plan" in title and lines[0].startswith('| a | {"Y": 1} |')


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "evals.sweep", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_cli_usage_errors(tmp_path):
    bad = tmp_path / "grid.json"
    bad.write_text('{"SWAP_AB": 1}')
    run = run_cli("--solution", FAMILY, "--grid", str(bad))
    assert run.returncode == 2 and "a JSON list of objects" in run.stderr
    run = run_cli("--solution", FAMILY, "--grid", str(tmp_path / "missing.json"))
    assert run.returncode == 2 and "missing.json" in run.stderr
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{}]))
    run = run_cli("--solution", FAMILY, "--grid", str(good), "--jobs", "0")
    assert run.returncode == 2 and "--jobs must be at least 1" in run.stderr
    run = run_cli("--solution", FAMILY, "--grid", str(good), "--inputs", "0")
    assert run.returncode == 2 and "--inputs must be at least 1" in run.stderr
    run = run_cli("--solution", str(tmp_path), "--grid", str(good))
    assert run.returncode == 2 and "no solution.py" in run.stderr
    run = run_cli("--task", "no-such-task", "--solution", FAMILY, "--grid", str(good))
    assert run.returncode == 2 and "no task 'no-such-task'" in run.stderr
    if not torch.cuda.is_available():
        run = run_cli("--solution", FAMILY, "--grid", str(good))
        assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr


@pytest.mark.parametrize("task,family,dims", [("w4a16", FAMILY, (24, 8192, 4096)),
                                              ("llgemm", str(ROOT / "tasks" / "llgemm" / "versions" / "v70"),
                                               (8, 320, 10240))])
def test_the_shipped_grid_names_only_knobs_the_family_plans_with(task, family, dims):
    grid = json.loads(Path(tasks.grid_of(task)).read_text())
    module = load_solution(family)
    knobs = set(module.get_config())
    assert grid[0] == {} and len(grid) >= 2  # the family's own plan first: the table's "x own plan" column
    for overrides in grid:
        assert set(overrides) <= knobs, set(overrides) - knobs
        module.plan(*dims, overrides)  # a plan the family accepts (W4A16's BLOCK_SIZE_K stays the group)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the sweep times on a CUDA GPU")
def test_pinned_sweep_with_the_verifiers_input_count_times_and_says_so(tmp_path):
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps([{}]))
    out = tmp_path / "sweep.json"
    run = run_cli("--solution", FAMILY, "--grid", str(grid), "--panel", "smoke", "--jobs", "2", "--pin",
                  "--inputs", "32", "--keep", "--json", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["pinned"] is True and result["inputs"] == 32 and result["kept_outputs"] and not result["failed"]
    assert result["task"] == "w4a16" and len(result["timed"]) == len(TASK.cases("smoke"))
    assert all(row["eager_us"] > 0 and row["correct_after"] for row in result["timed"])
