"""The loop keeps only what the verifier would accept: a candidate the verifier could not time (a case host-bound in
the selfcheck with less GPU time than both its host cost and the best's plan there, or a vector over max/min 1.15
under the verifier's schedule) is never kept; a host-bound case at the best's own GPU time, or near host-bound (GPU
time above the host cost, under the ratio), is left to that qualification; without CUDA the qualification never runs
and nothing claims stability.

This machine has no GPU. The CUDA branch runs the real ``Evaluator.evaluate`` with ``cuda=True`` on stand-in
evaluator commands (real subprocesses that write the JSON the task's selfcheck and qualification write on a GPU);
``stability_block`` and ``decision`` are also checked as pure functions on crafted reports.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from agent.config import Task
from agent.evaluate import Evaluator
from agent.ledger import columns, format_row, header, parse_row, rows
from agent.loop import decision
from agent.stability import shared_cases, stability_block, unstable_cases
from agent.tools import profile_text
from tests.conftest import ROOT

HOST_BOUND_NOTE = "host-bound: GPU 9.1 us per call is below 1.30 x the host cost 11.2 us"
NEAR_NOTE = "near host-bound: GPU 13.0 us per call is only 1.16x the host cost 11.2 us (stable from 1.30x)"
# A stand-in selfcheck: per-case speedups and a score from the solution's numbers.json ("versus_v0" or, with
# --baseline, "versus_best"); the cases named in "host_bound" measured host-bound (GPU time under the host cost), those
# in "near_host_bound" near it (above the host cost, under the ratio), the others stable, as on a GPU.
SELFCHECK = f"""
import json, sys
from pathlib import Path
args = sys.argv[1:]
numbers = json.loads((Path(args[args.index('--solution') + 1]) / 'numbers.json').read_text())
part = numbers['versus_best' if '--baseline' in args else 'versus_v0']
slow = numbers.get('host_bound', [])
near = numbers.get('near_host_bound', [])  # GPU time above the host cost, short of the 1.3 ratio
gpu = {{**{{c: 9.1 for c in slow}}, **{{c: 13.0 for c in near}}}}
notes = {{**{{c: {HOST_BOUND_NOTE!r} for c in slow}}, **{{c: {NEAR_NOTE!r} for c in near}}}}
cases = [{{'case': {{'name': f'c{{i}}', 'stratum': stratum}}, 'correct': True, 'speedup': s, 'median_us': 10.0,
          'times_us': [10.0, 10.05], 'host_us': 11.2, 'gpu_us': gpu.get(f'c{{i}}', 30.0),
          'stable': f'c{{i}}' not in gpu, 'stable_note': notes.get(f'c{{i}}', 'stable')}}
         for i, (stratum, s) in enumerate(part['speedups'])]
stability = {{'measured': True, 'ratio_min': 1.3, 'stable': not gpu, 'unstable_cases': sorted(gpu), 'note': ''}}
report = {{'cases': cases, 'score': part['score'], 'all_correct': True, 'strata': {{}}, 'stability': stability}}
Path(args[args.index('--json') + 1]).write_text(json.dumps(report))
"""
# A stand-in qualification: case c1's one vector has the spread numbers.json names; every call is logged in the
# solution directory, so a test can tell whether (and with which arguments) it ran.
QUALIFY = """
import json, sys
from pathlib import Path
args = sys.argv[1:]
solution = Path(args[args.index('--solution') + 1])
with open(solution / 'qualify.calls', 'a') as log:
    log.write(' '.join(args) + '\\n')
spread = json.loads((solution / 'numbers.json').read_text()).get('qualify_max_min', 1.04)
passed = spread <= 1.15
vector = {'schedule': 'spec', 'repeat': 0, 'times_us': [12.0] * 11, 'max_min': spread}
row = {'case': 'c1', 'stratum': 'expert-batch', 'overrides': {}, 'host_us': 11.2, 'gpu_us': 16.0, 'ratio': 1.43,
       'vectors': [vector], 'worst_max_min': spread, 'passed': passed}
report = {'passed': passed, 'limit': 1.15, 'worst': {'case': 'c1', 'schedule': 'spec', 'max_min': spread},
          'rows': [row], 'measured': True, 'note': ''}
Path(args[args.index('--json') + 1]).write_text(json.dumps(report))
sys.exit(0 if passed else 1)
"""
PASS = "import json, sys; json.dump({'ok': True, 'cases': []}, open(sys.argv[sys.argv.index('--json') + 1], 'w'))"


def evaluator(tmp_path: Path, cuda: bool) -> Evaluator:
    task = Task.load(ROOT)
    task = dataclasses.replace(task, policy_cmd=("-c", PASS), selfcheck_cmd=("-c", SELFCHECK), gates_cmd=("-c", PASS),
                               commands={"residency": ("-c", PASS)},
                               qualify_cmd=("-c", QUALIFY) + task.qualify_cmd[2:])  # the default's arguments
    return Evaluator(task, "smoke", cuda, tmp_path / "work")


def solution(tmp_path: Path, name: str, versus_v0: float, versus_best: float, **numbers) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "solution.py").write_text("def build(qweight, scales, bias, epilogue):\n    pass\n")
    speedups = [("balanced", versus_v0), ("expert-batch", versus_v0)]
    (directory / "numbers.json").write_text(json.dumps({
        "versus_v0": {"score": versus_v0, "speedups": speedups},
        "versus_best": {"score": versus_best, "speedups": [(s, versus_best) for s, _ in speedups]}, **numbers}))
    return directory


def qualify_calls(directory: Path) -> list[str]:
    path = directory / "qualify.calls"
    return path.read_text().splitlines() if path.is_file() else []


def test_a_host_bound_case_blocks_the_keep_before_anything_slow_runs(tmp_path: Path):
    best = solution(tmp_path, "best", 1.0, 1.0)
    fast = solution(tmp_path, "fast", 1.42, 1.5, host_bound=["c1"])  # faster, but c1 is host-bound
    verdict = evaluator(tmp_path, cuda=True).evaluate(fast, best, best_is_baseline=False, full_check=False,
                                                      best_score=1.0)
    # not timed against the best, not qualified, no residency or gates: it cannot be kept whatever they say
    assert [s["name"] for s in verdict["stages"]] == ["policy", "selfcheck"] and not qualify_calls(fast)
    assert verdict["valid"] and not verdict["keep"] and verdict["failed_stage"] is None
    assert verdict["stable"] == "no (host-bound: c1)"
    assert verdict["unstable"] == [{"case": "c1", "stratum": "expert-batch", "why": "GPU 9.1 us below 1.30x host "
                                    "11.2 us", "note": HOST_BOUND_NOTE}]
    assert f"c1: {HOST_BOUND_NOTE}" in verdict["note"]  # which case and the evaluator's own why
    assert decision(verdict) == "revert (unstable: c1 GPU 9.1 us below 1.30x host 11.2 us; ~1.420x best)"


def test_a_host_bound_case_the_best_shares_is_left_to_the_qualification(tmp_path: Path):
    """c1 is host-bound in the candidate's selfcheck at the GPU time the best's own selfcheck measured there (its plan
    is as far from its host as the best's): the host moved, not the candidate, so it does not block untried; the
    candidate is timed against the best and qualified under the verifier's schedule, which decides."""
    best = solution(tmp_path, "best", 1.0, 1.0)
    best_check = gpu_report(("c0", "balanced", True, 30.0), ("c1", "expert-batch", True, 9.2))
    fast = solution(tmp_path, "fast", 1.42, 1.4, host_bound=["c1"], qualify_max_min=1.04)
    verdict = evaluator(tmp_path, cuda=True).evaluate(fast, best, best_is_baseline=False, full_check=False,
                                                      best_score=1.0, best_check=best_check)
    assert [s["name"] for s in verdict["stages"]][:4] == ["policy", "selfcheck", "versus_best", "qualify"]
    assert len(qualify_calls(fast)) == 1
    assert verdict["keep"] and verdict["stable"] == "yes" and verdict["unstable"] == []
    assert ("stability: not blocking, at the best's own GPU time (the qualification decided): c1 GPU 9.1 us below "
            "1.30x host 11.2 us; the best's 9.2 us") in verdict["note"]
    # the qualification still answers: over the limit there, the same candidate is not kept
    fast2 = solution(tmp_path, "fast2", 1.42, 1.4, host_bound=["c1"], qualify_max_min=1.21)
    verdict = evaluator(tmp_path / "2", cuda=True).evaluate(fast2, best, best_is_baseline=False, full_check=False,
                                                            best_score=1.0, best_check=best_check)
    assert not verdict["keep"] and verdict["stable"] == "no (c1 spec max/min 1.210)"
    # not faster than the best: no qualification, and the cell says the case is host-bound only as the best is
    level = solution(tmp_path, "level", 1.0, 0.99, host_bound=["c1"])
    verdict = evaluator(tmp_path / "3", cuda=True).evaluate(level, best, best_is_baseline=False, full_check=False,
                                                            best_score=1.0, best_check=best_check)
    assert [s["name"] for s in verdict["stages"]] == ["policy", "selfcheck", "versus_best"] and not qualify_calls(level)
    assert verdict["stable"] == "as best (host-bound: c1)" and verdict["unstable"] == []
    assert "not blocking, at the best's own GPU time: c1" in verdict["note"]
    assert decision(verdict) == "revert (0.990x best, noise 0.005)"


def test_a_near_host_bound_case_is_left_to_the_qualification(tmp_path: Path):
    """c1's GPU time (13.0 us) clears its host cost (11.2 us) short of the 1.3 ratio, with no best to compare: it does
    not block untried; the qualification, the verifier's own schedule, decides, both ways."""
    best = solution(tmp_path, "best", 1.0, 1.0)
    fast = solution(tmp_path, "fast", 1.42, 1.4, near_host_bound=["c1"], qualify_max_min=1.04)
    verdict = evaluator(tmp_path, cuda=True).evaluate(fast, best, best_is_baseline=False, full_check=False,
                                                      best_score=1.0)
    assert [s["name"] for s in verdict["stages"]][:4] == ["policy", "selfcheck", "versus_best", "qualify"]
    assert verdict["keep"] and verdict["stable"] == "yes" and verdict["unstable"] == []
    assert ("stability: not blocking, GPU time above the host cost (the qualification decided): c1 GPU 13.0 us "
            "below 1.30x host 11.2 us") in verdict["note"]
    unsteady = solution(tmp_path, "unsteady", 1.42, 1.4, near_host_bound=["c1"], qualify_max_min=1.19)
    verdict = evaluator(tmp_path / "2", cuda=True).evaluate(unsteady, best, best_is_baseline=False, full_check=False,
                                                            best_score=1.0)
    assert not verdict["keep"] and verdict["stable"] == "no (c1 spec max/min 1.190)"
    # not faster: no qualification, and the cell says what was not settled
    level = solution(tmp_path, "level", 1.0, 0.99, near_host_bound=["c1"])
    verdict = evaluator(tmp_path / "3", cuda=True).evaluate(level, best, best_is_baseline=False, full_check=False,
                                                            best_score=1.0)
    assert not qualify_calls(level) and verdict["stable"] == "near host-bound, not qualified: c1"


def test_a_host_bound_case_the_candidate_moved_toward_its_host_still_blocks(tmp_path: Path):
    """The best's plan took 12 us of GPU time on c1 and the candidate's takes 9.1: the candidate made c1 host-bound,
    so it is not kept, and neither the comparison nor the qualification runs."""
    best = solution(tmp_path, "best", 1.0, 1.0)
    best_check = gpu_report(("c0", "balanced", True, 30.0), ("c1", "expert-batch", True, 12.0))
    fast = solution(tmp_path, "fast", 1.42, 1.5, host_bound=["c1"])
    verdict = evaluator(tmp_path, cuda=True).evaluate(fast, best, best_is_baseline=False, full_check=False,
                                                      best_score=1.0, best_check=best_check)
    assert [s["name"] for s in verdict["stages"]] == ["policy", "selfcheck"] and not qualify_calls(fast)
    assert not verdict["keep"] and verdict["stable"] == "no (host-bound: c1)"
    assert "not blocking" not in verdict["note"]
    # a best whose GPU time there was not measured is no reference: the case blocks as it would without one
    unmeasured = gpu_report(("c0", "balanced", True, 30.0), ("c1", "expert-batch", None, None))
    verdict = evaluator(tmp_path / "2", cuda=True).evaluate(fast, best, best_is_baseline=False, full_check=False,
                                                            best_score=1.0, best_check=unmeasured)
    assert not verdict["keep"] and verdict["stable"] == "no (host-bound: c1)"


def test_a_keeper_is_qualified_alone_then_checked_and_kept_when_every_vector_passes(tmp_path: Path):
    best = solution(tmp_path, "best", 1.0, 1.0)
    fast = solution(tmp_path, "fast", 1.4, 1.4, qualify_max_min=1.04)
    verdict = evaluator(tmp_path, cuda=True).evaluate(fast, best, best_is_baseline=False, full_check=False,
                                                      best_score=1.0)
    names = [s["name"] for s in verdict["stages"]]
    # the qualification times: it runs alone, after the comparison and before the untimed pair
    assert names[:4] == ["policy", "selfcheck", "versus_best", "qualify"] and set(names[4:]) == {"residency", "gates"}
    # the task's folder before the stage's own arguments
    assert qualify_calls(fast) == [f"--repeats 1 --schedules spec --task {ROOT / 'tasks' / 'w4a16'} --solution {fast} "
                                   f"--panel smoke --json {tmp_path / 'work' / 'qualify.json'}"]
    assert verdict["keep"] and verdict["stable"] == "yes" and verdict["unstable"] == []
    assert decision(verdict).startswith("keep (1.400x best")


def test_a_keeper_over_the_limit_under_the_verifiers_schedule_is_not_kept(tmp_path: Path):
    best = solution(tmp_path, "best", 1.0, 1.0)
    fast = solution(tmp_path, "fast", 1.42, 1.42, qualify_max_min=1.21)
    verdict = evaluator(tmp_path, cuda=True).evaluate(fast, best, best_is_baseline=False, full_check=False,
                                                      best_score=1.0)
    assert [s["name"] for s in verdict["stages"]] == ["policy", "selfcheck", "versus_best", "qualify"]
    qualify = verdict["stages"][-1]
    assert not qualify["ok"]
    assert qualify["note"] == "unstable under the verifier's schedule: c1 spec max/min 1.210 > 1.15"
    # an answer about the candidate, not a stage that failed to run: the verdict is valid and says why it is not kept
    assert verdict["valid"] and verdict["failed_stage"] is None and not verdict["keep"]
    assert verdict["stable"] == "no (c1 spec max/min 1.210)"
    assert "qualify: unstable under the verifier's schedule: c1 spec max/min 1.210 > 1.15" in verdict["note"]
    assert decision(verdict) == "revert (unstable: c1 spec max/min 1.210 > 1.15; 1.420x best)"


def test_a_qualification_that_cannot_run_fails_the_keeper(tmp_path: Path):
    best = solution(tmp_path, "best", 1.0, 1.0)
    fast = solution(tmp_path, "fast", 1.4, 1.4)
    judge = evaluator(tmp_path, cuda=True)
    judge.task.qualify_cmd = ("-m", "evals.no_such_qualify")
    verdict = judge.evaluate(fast, best, best_is_baseline=False, full_check=False, best_score=1.0)
    assert verdict["failed_stage"] == "qualify" and not verdict["valid"] and not verdict["keep"]
    assert verdict["stable"] == "-" and "the qualification did not run" in verdict["note"]
    assert decision(verdict).startswith("revert: qualify the qualification did not run")


def test_a_slower_candidate_is_never_qualified(tmp_path: Path):
    """Iterations stay fast: only a candidate about to be kept pays for the qualification."""
    best = solution(tmp_path, "best", 1.0, 1.0)
    slow = solution(tmp_path, "slow", 0.99, 0.99)
    verdict = evaluator(tmp_path, cuda=True).evaluate(slow, best, best_is_baseline=False, full_check=False,
                                                      best_score=1.0)
    assert [s["name"] for s in verdict["stages"]] == ["policy", "selfcheck", "versus_best"] and not qualify_calls(slow)
    assert not verdict["keep"] and verdict["stable"] == "yes"  # the selfcheck measured every case stable


def test_without_cuda_nothing_is_qualified_and_nothing_claims_stability(tmp_path: Path):
    """Under the interpreter the agent never calls the qualification and ignores stability fields, whatever a
    report says: interpreter timings measure nothing about the GPU, so a valid, faster candidate is not kept either
    and its decision says why."""
    best = solution(tmp_path, "best", 1.0, 1.0)
    fast = solution(tmp_path, "fast", 1.4, 1.4, host_bound=["c1"], qualify_max_min=1.5)
    verdict = evaluator(tmp_path, cuda=False).evaluate(fast, best, best_is_baseline=False, full_check=True,
                                                       best_score=1.0)
    assert [s["name"] for s in verdict["stages"]][:2] == ["policy", "selfcheck"]  # never timed against the best
    assert set(s["name"] for s in verdict["stages"][2:]) == {"residency", "gates"} and not qualify_calls(fast)
    assert verdict["valid"] and not verdict["keep"] and verdict["speedup_over_best"] == pytest.approx(1.4)
    assert verdict["stable"] == "-" and verdict["unstable"] == []
    assert decision(verdict) == ("revert (no GPU: nothing is kept on interpreter timings, which rank nothing; "
                                 "~1.400x best from both scores against the baseline)")
    assert "stab" not in decision(verdict) and "stab" not in verdict["note"]
    # the same candidate on a GPU, with the qualification passing: kept
    steady = solution(tmp_path, "steady", 1.4, 1.4, qualify_max_min=1.04)
    verdict = evaluator(tmp_path / "gpu", cuda=True).evaluate(steady, best, best_is_baseline=False, full_check=False,
                                                              best_score=1.0)
    assert verdict["keep"] and decision(verdict) == "keep (1.400x best, noise 0.005)"


def gpu_report(*cases: tuple[str, str, bool | None, float | None]) -> dict:
    """A selfcheck report as a GPU run writes it: (name, stratum, stable, gpu_us) per case, host cost 11.2 us."""
    listed = [{"case": {"name": name, "stratum": stratum}, "stable": stable, "gpu_us": gpu, "host_us": 11.2,
               "stable_note": HOST_BOUND_NOTE if stable is False else "ok"} for name, stratum, stable, gpu in cases]
    measured = [c for c in cases if c[2] is not None]
    return {"cases": listed, "stability": {"measured": bool(measured), "ratio_min": 1.3,
                                           "stable": all(c[2] for c in measured) if measured else None,
                                           "unstable_cases": [c[0] for c in measured if not c[2]], "note": ""}}


def test_stability_block_on_crafted_reports():
    """The rule as a pure function of the two reports (what a GPU would write; none exists here)."""
    stable = gpu_report(("a", "balanced", True, 40.0), ("b", "expert-batch", True, 20.0))
    assert stability_block(stable, None) == (True, "yes", "")
    assert stability_block(gpu_report(("a", "balanced", None, None)), None) == (True, "-", "")
    assert stability_block(None, None) == (True, "-", "")
    one = gpu_report(("a", "balanced", True, 40.0), ("b", "expert-batch", False, 9.1))
    ok, cell, note = stability_block(one, None)
    assert not ok and cell == "no (host-bound: b)" and note.endswith(f"b: {HOST_BOUND_NOTE}")
    two = gpu_report(("a", "expert-batch", False, 9.1), ("b", "expert-batch", False, 9.1))
    assert stability_block(two, {"measured": True, "passed": True})[:2] == (False, "no (host-bound: 2 cases)")
    # a report whose top-level stability says unstable without naming a case still blocks
    vague = {"cases": [], "stability": {"measured": True, "stable": False, "unstable_cases": [], "note": "why"}}
    assert stability_block(vague, None) == (False, "no (host-bound)", stability_block(vague, None)[2])
    passed = {"measured": True, "passed": True, "limit": 1.15, "failures": [],
              "worst": {"case": "a", "schedule": "spec", "max_min": 1.04},
              "rows": [qualified_row("a", "balanced", 1.04, 1.02), qualified_row("b", "expert-batch", 1.01)]}
    assert stability_block(stable, passed) == (True, "yes", "")
    assert stability_block(None, passed) == (True, "yes", "")
    failed = {**passed, "passed": False, "worst": {"case": "b", "schedule": "spec-unpinned", "max_min": 1.3},
              "rows": [passed["rows"][0], qualified_row("b", "expert-batch", 1.05, 1.3)]}
    assert stability_block(stable, failed) == (
        False, "no (b spec-unpinned max/min 1.300)",
        "unstable under the verifier's schedule: b spec-unpinned max/min 1.300 > 1.15")
    why = "spec-unpinned max/min 1.300 > 1.15"
    assert unstable_cases(None, failed) == [{"case": "b", "stratum": "expert-batch", "why": why,
                                             "note": f"under the verifier's schedule: {why}"}]
    assert unstable_cases(one, failed)[0]["case"] == "b" and unstable_cases(one, failed)[0]["why"].startswith("GPU")
    # with the best's selfcheck: a case at >= 0.97x the best's GPU time does not block, nor does the top-level
    # "unstable" that only such cases make; a case faster on the GPU than the best's plan there still does
    best = gpu_report(("a", "expert-batch", True, 9.3), ("b", "expert-batch", True, 9.2))  # 9.1 >= 0.97 x each
    assert stability_block(one, None, best) == (True, "as best (host-bound: b)", "")
    assert stability_block(one, passed, best) == (True, "yes", "")
    assert unstable_cases(one, None, best) == [] and [u["case"] for u in shared_cases(one, best)] == ["b"]
    assert stability_block(two, None, best) == (True, "as best (host-bound: 2 cases)", "")
    slower_best = gpu_report(("a", "expert-batch", True, 9.5), ("b", "expert-batch", True, 9.2))  # 9.1 < 0.97 x 9.5
    assert stability_block(two, None, slower_best)[:2] == (False, "no (host-bound: a)")
    assert [u["case"] for u in unstable_cases(two, None, slower_best)] == ["a"]
    assert [u["case"] for u in shared_cases(two, slower_best)] == ["b"]  # one blocks, one is shared: it blocks
    # a top-level "unstable" naming a case the report does not list still blocks, shared cases or not
    ghost = {**one, "stability": {**one["stability"], "unstable_cases": ["b", "z"]}}
    assert stability_block(ghost, None, best)[:2] == (False, "no (host-bound)")
    assert stability_block(two, None, {"cases": []})[:2] == (False, "no (host-bound: 2 cases)")
    # a GPU time at or above the host cost, short of the ratio, is left to the qualification; below it, it blocks
    near = gpu_report(("a", "balanced", True, 40.0), ("b", "expert-batch", False, 11.2))
    assert stability_block(near, None) == (True, "near host-bound, not qualified: b", "")
    assert stability_block(near, passed) == (True, "yes", "")
    assert stability_block(near, failed)[:2] == (False, "no (b spec-unpinned max/min 1.300)")
    assert [u["defer"] for u in shared_cases(near, None)] == ["near"] and unstable_cases(near, None) == []
    assert stability_block(gpu_report(("b", "expert-batch", False, 11.1)), None)[:2] == (False, "no (host-bound: b)")
    # one of each: the cell names the near one (the other is at the best's own time)
    mixed = gpu_report(("a", "expert-batch", False, 9.1), ("b", "expert-batch", False, 11.2))
    far_best = gpu_report(("a", "expert-batch", True, 9.3), ("b", "expert-batch", True, 20.0))
    assert [u["defer"] for u in shared_cases(mixed, far_best)] == ["as best", "near"]
    assert stability_block(mixed, None, far_best) == (True, "near host-bound, not qualified: b", "")
    # a qualification that could not time (a child that crashed) blocks the keep without calling the candidate unstable
    crashed = {**passed, "passed": False, "failures": ["the spec child failed: exit status 1: boom"]}
    assert stability_block(stable, crashed) == (False, "-", "not qualified: the spec child failed: exit status 1: boom")
    assert stability_block(stable, {"measured": False, "note": "no CUDA"}) == (False, "-", "not qualified: no CUDA")


def qualified_row(case: str, stratum: str, *spreads: float) -> dict:
    """A qualification row: one vector per spread, under spec then spec-unpinned."""
    vectors = [{"schedule": schedule, "repeat": 0, "times_us": [], "max_min": spread}
               for schedule, spread in zip(("spec", "spec-unpinned"), spreads)]
    return {"case": case, "stratum": stratum, "overrides": {}, "vectors": vectors, "errors": [],
            "worst_max_min": max(spreads), "passed": max(spreads) <= 1.15}


def test_decision_names_the_unstable_cases_and_the_speedup():
    verdict = {"keep": False, "valid": True, "gpu_timing": True, "speedup_over_best": 1.42, "noise": 0.01,
               "stable": "no (host-bound: 24x16384x1536-silu)", "stability_note": "host-bound ...",
               "unstable": [{"case": "24x16384x1536-silu", "stratum": "expert-batch",
                             "why": "GPU 9.1 us below 1.30x host 11.2 us"}], "stages": []}
    assert decision(verdict) == "revert (unstable: 24x16384x1536-silu GPU 9.1 us below 1.30x host 11.2 us; 1.420x best)"
    assert decision({**verdict, "stable": "yes"}) == "revert (1.420x best, noise 0.010)"


def test_the_ledger_has_a_stable_cell_and_rows_without_it_still_read(project: Path):
    task = Task.load(project)
    names = columns(task)
    assert names == ("version", "time (UTC)", "run", "backend/model", "parent", "summary / hypothesis", "correct",
                     "residency", "balanced", "expert-batch", "score", "decision", "sha256", "stable")
    row = format_row({"version": "v7", "decision": "keep (1.2x best, noise 0.01)", "sha256": "ab", "stable": "yes"},
                     task)
    assert row.endswith("| ab | yes |") and parse_row(row, task)["stable"] == "yes"
    old = "| v3 | t | r | offline | v1 | s | yes | ok | 1.000 | 1.000 | 1.000 | keep (1.1x best, noise 0.01) | cd |"
    parsed = parse_row(old, task)
    assert parsed["sha256"] == "cd" and parsed["stable"] == "-" and list(parsed) == list(names)
    # the real ledger (append-only: the 14-column header was appended below the 13-cell rows): its last header, the one
    # new rows go under, names every column, and every row (written with 13 cells or 14) reads whole
    ledger = (project / "methods" / "experiment_log.md").read_text().splitlines()
    last = [line for line in ledger if line.startswith("| version |")][-1]
    assert last == format_row(dict(zip(names, names)), task)
    assert "\n".join(ledger[ledger.index(last):ledger.index(last) + 2]) == header(task)
    assert ledger[ledger.index(last) + 1] == "|" + "---|" * len(names)
    assert all(len(parse_row(line, task)) == len(names) for line in rows(task))


@pytest.mark.parametrize("stable, shown", [(False, "NO"), (True, "yes"), (None, "-")])
def test_the_profile_the_prompt_shows_says_which_cases_are_host_bound(stable, shown):
    report = gpu_report(("24x16384x1536-silu", "expert-batch", stable, 9.1))
    text = profile_text({**report, "strata": {}})
    assert text.splitlines()[1].split()[-1] == shown and ("host-bound (" in text) == (stable is False)


def test_the_profile_of_a_graph_paired_report_shows_each_regime():
    """A graph-paired task (hot and L2-flushed CUDA-graph replays) has no host and GPU times a call: the prompt's
    profile shows each regime's time and ratio to the baseline, so the smaller one, the speedup, says which regime
    holds a case back."""
    def case(name: str, hot: float, flushed: float) -> dict:
        return {"case": {"name": name, "stratum": "m1"}, "median_us": 5.0, "gbps": 2000.0, "roofline_fraction": 0.5,
                "speedup": min(hot, flushed), "host_us": None, "gpu_us": None, "stable": True,
                "hot": {"candidate_us": 5.0, "baseline_us": 5.0 * hot, "ratio": hot},
                "flushed": {"candidate_us": 9.0, "baseline_us": 9.0 * flushed, "ratio": flushed}}

    text = profile_text({"cases": [case("1x4096x2560", 1.204, 1.071), case("2x4096x2560", 0.981, 1.012)],
                         "strata": {"m1": 1.0}})
    header, first, second = text.splitlines()[:3]
    assert header.split()[3:] == ["flush_us", "GB/s", "%copy", "speedup", "hot_x", "flush_x", "stable"]
    assert first.split()[2:] == ["5.00", "9.00", "2000.0", "50.0", "1.071", "1.204", "1.071", "yes"]
    assert second.split()[-3:-1] == ["0.981", "1.012"] and "graph-paired timing" in text
    # an eager-timed report keeps its host and GPU columns, and no such note
    eager = profile_text({**gpu_report(("a", "balanced", True, 40.0)), "strata": {}})
    assert "host_us" in eager.splitlines()[0] and "graph-paired" not in eager
    # the interpreter's report of a graph-paired task (eager wall times, no regimes): its protocol sets the columns,
    # which stay empty, and no note on replays it never made
    interpreted = profile_text({"cases": [{"case": {"name": "1x24x2560", "stratum": "m1"}, "median_us": 900.0,
                                           "speedup": 1.0}], "strata": {}, "interpreted": True,
                                "timing": {"protocol": "graph-paired", "graphs": False}})
    assert interpreted.splitlines()[0].split()[-3:] == ["hot_x", "flush_x", "stable"]
    assert interpreted.splitlines()[1].split()[-3:] == ["-", "-", "-"] and "graph-paired timing" not in interpreted
    assert "Triton-interpreter wall times" in interpreted


def test_the_limit_comes_from_the_report_that_judged_by_it():
    from agent.stability import LEGACY_LIMIT, limit_of, qualification_failed

    assert limit_of({"limit": 1.2}) == 1.2  # a qualification's or the verifier's own
    assert limit_of({"stability": {"limit": 1.1}}) == 1.1  # a selfcheck's
    assert limit_of({}) == limit_of(None) == LEGACY_LIMIT == 1.15  # reports written before they carried it
    over = {"measured": True, "passed": False, "limit": 1.2,
            "rows": [{"case": "c", "vectors": [{"schedule": "spec", "max_min": 1.18}]}],
            "worst": {"case": "c", "schedule": "spec", "max_min": 1.18}}
    assert not qualification_failed(over)  # 1.18 is within this report's own 1.2
