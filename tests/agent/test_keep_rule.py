"""The keep rule: the task's score (geomean per stratum, harmonic mean across strata) decides, not a geomean over
cases; a candidate surely slower than the best by both scores against v0 is not timed against the best; residency and
gates both run for a keeper; without CUDA nothing is a keeper. The evaluator stages are real subprocesses (stand-in
commands that write their JSON); the GPU path runs with ``cuda=True`` and a task whose stages leave out the
qualification (test_stability covers it)."""
from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
from pathlib import Path

import pytest

from agent.config import Task
from agent.evaluate import NOISE_FLOOR, SURELY_SLOWER, Evaluator, compare, paired_noise, placed_center

# A stand-in selfcheck: the numbers come from the solution directory's numbers.json ("versus_v0" or, with
# --baseline, "versus_best"): per-case speedups and a score, as evals.selfcheck reports them.
SELFCHECK = """
import json, sys
from pathlib import Path

import pytest
args = sys.argv[1:]
numbers = json.loads((Path(args[args.index('--solution') + 1]) / 'numbers.json').read_text())
part = numbers['versus_best' if '--baseline' in args else 'versus_v0']
cases = [{'case': {'name': f'c{i}', 'stratum': stratum}, 'correct': True, 'speedup': s, 'times_us': [10.0, 10.05],
          'median_us': 10.0} for i, (stratum, s) in enumerate(part['speedups'])]
for case in cases if 'paired' in part else []:  # the graph-paired records: each regime's ratio over the baseline
    for regime, r in zip(('hot', 'flushed'), part['paired']):
        case[regime] = {'candidate_times_us': [10.0] * 3, 'baseline_times_us': [10.0 * r] * 3, 'ratio': r}
report = {'cases': cases, 'score': part['score'], 'all_correct': True, 'strata': part.get('strata', {})}
Path(args[args.index('--json') + 1]).write_text(json.dumps(report))
"""
PASS = "import json, sys; json.dump({'ok': True, 'cases': []}, open(sys.argv[sys.argv.index('--json') + 1], 'w'))"


def report(score: float, speedups: list[tuple[str, float]]) -> dict:
    cases = [{"case": {"name": f"c{i}", "stratum": st}, "speedup": s, "times_us": [10.0, 10.05]}
             for i, (st, s) in enumerate(speedups)]
    return {"cases": cases, "score": score}


def test_compare_keeps_by_the_task_score_not_by_a_geomean_over_cases():
    # expert-batch doubled on three cases, balanced lost a third on two: the geomean over cases is 1.31, but the
    # score (harmonic mean of the stratum geomeans 0.67 and 2.0) is 1.0: no gain, no keep
    lopsided = [("balanced", 0.67)] * 2 + [("expert-batch", 2.0)] * 3
    verdict = compare(report(1.0038, lopsided))
    assert not verdict["keep"] and verdict["speedup_over_best"] == 1.0038
    assert abs(verdict["noise"] - 0.005) < 1e-9  # the median spread of the candidate's group times
    assert compare(report(1.2, lopsided))["keep"]
    assert not compare({"cases": report(1.2, lopsided)["cases"]})["keep"]  # no score: no valid comparison
    assert not compare(None)["keep"]


def test_a_case_without_paired_series_brings_its_own_spread_as_its_noise():
    """A selfcheck case with a ``spread`` (the candidate's larger interquartile spread minus 1) but no paired replay
    series: that is the case's noise, whatever its times' max/min; a case without one keeps max/min - 1."""
    paired = report(1.03, [("balanced", 1.03)] * 3)
    for case, spread in zip(paired["cases"], (0.04, 0.05, 0.06)):
        case.update(spread=spread, times_us=[10.0, 10.1, 30.0])  # one stalled replay: max/min - 1 would be 2.0
    verdict = compare(paired)
    assert abs(verdict["noise"] - 0.05) < 1e-9 and not verdict["keep"]  # 1.03 is within the noise
    assert compare(dict(paired, score=1.06))["keep"]
    mixed = report(1.03, [("balanced", 1.03)] * 3)
    mixed["cases"][0]["spread"] = 0.5  # the others fall back to max/min - 1 = 0.005
    assert abs(compare(mixed)["noise"] - 0.005) < 1e-9
    assert compare(mixed)["versus_best"] == {"c0": 1.03, "c1": 1.03, "c2": 1.03}


def paired_report(gain: float, jitter: float, seed: int = 1, flushed_gain: float | None = None) -> dict:
    """Six cases in two strata, each with 21 hot and 101 flushed replays: the baseline ``gain`` times slower than the
    candidate (``flushed_gain`` times in the flushed regime, where given), each replay's times off by up to
    ``jitter`` (uniform), the score formed as the selfcheck forms it."""
    rng = random.Random(seed)
    cases, strata = [], {}
    for i in range(6):
        case = {"case": {"name": f"p{i}", "stratum": ("m1", "m16")[i % 2]}, "spread": 0.03}
        for regime, pairs in (("hot", 21), ("flushed", 101)):
            base = 5.0 + i
            ratio = flushed_gain if regime == "flushed" and flushed_gain is not None else gain
            candidate = [base * (1 + rng.uniform(-jitter, jitter)) for _ in range(pairs)]
            baseline = [base * ratio * (1 + rng.uniform(-jitter, jitter)) for _ in range(pairs)]
            case[regime] = {"candidate_times_us": candidate, "baseline_times_us": baseline,
                            "ratio": by_place(baseline) / by_place(candidate)}
        case["speedup"] = min(case["hot"]["ratio"], case["flushed"]["ratio"])
        strata.setdefault(case["case"]["stratum"], []).append(math.log(case["speedup"]))
        cases.append(case)
    means = [math.exp(sum(v) / len(v)) for v in strata.values()]
    return {"cases": cases, "score": len(means) / sum(1 / m for m in means)}


def by_place(values: list[float]) -> float:
    """A series' center as the selfcheck takes it (evals/graph_timing.py's center): by place in the pairs."""
    return placed_center(values, [list(range(0, len(values), 2)), list(range(1, len(values), 2))])


def test_the_bootstrap_redraws_each_place_in_the_pairs_within_itself():
    """Whichever callable runs first in its pair 16% slower, at equal speed: the whole series' medians read 0.86
    (the candidate ran first in 11 of 21 hot pairs); by place the ratio is 1.0, and redrawn within each place it
    stays 1.0 in every draw (no noise)."""
    cases = []
    for i in range(6):
        case = {"case": {"name": f"p{i}", "stratum": ("m1", "m16")[i % 2]}}
        for regime, pairs in (("hot", 21), ("flushed", 101)):
            candidate = [7.1 if j % 2 == 0 else 6.1 for j in range(pairs)]  # first in the even pairs
            baseline = [6.1 if j % 2 == 0 else 7.1 for j in range(pairs)]
            case[regime] = {"candidate_times_us": candidate, "baseline_times_us": baseline,
                            "ratio": by_place(baseline) / by_place(candidate)}
        cases.append(case)
    hot = cases[0]["hot"]
    assert statistics.median(hot["baseline_times_us"]) / statistics.median(hot["candidate_times_us"]) == \
        pytest.approx(6.1 / 7.1)
    assert hot["ratio"] == pytest.approx(1.0) and paired_noise(cases) == pytest.approx(0.0, abs=1e-12)


def test_a_graph_paired_comparison_is_held_to_its_scores_bootstrap_noise_at_least_the_floor():
    """Where every case has its paired replays, the noise is half the score's bootstrap 5-95% range, at least
    NOISE_FLOOR: a steady 2% gain over 50 cases' worth of pairs is kept although each case's own spread
    (3%) is larger; the same gain under replays 40% apart is not; a gain under the floor never is."""
    steady = paired_report(1.02, 0.005)
    verdict = compare(steady)
    assert verdict["noise"] == NOISE_FLOOR and verdict["keep"], verdict  # each case's spread, 0.03, would revert it
    assert paired_noise(steady["cases"]) < NOISE_FLOOR
    assert not compare(paired_report(1.005, 0.005))["keep"]  # under the floor
    noisy = paired_report(1.02, 0.4)
    loud = compare(noisy)
    assert loud["noise"] > 0.02 and not loud["keep"], loud
    assert compare(noisy)["noise"] == loud["noise"]  # seeded: the same report, the same noise
    assert set(loud["versus_best"]) == {f"p{i}" for i in range(6)}
    # one case without its flushed series: the whole comparison falls back to the median case spread
    partial = paired_report(1.02, 0.005)
    del partial["cases"][0]["flushed"]
    assert paired_noise(partial["cases"]) is None
    assert abs(compare(partial)["noise"] - 0.03) < 1e-9 and not compare(partial)["keep"]


def best_check(hot: float, flushed: float, names: list[str]) -> dict:
    """The best's own selfcheck report as far as the comparison reads it: each case's ratio over the yardstick in
    both regimes."""
    return {"cases": [{"case": {"name": name}, "hot": {"ratio": hot}, "flushed": {"ratio": flushed}}
                      for name in names]}


def test_a_paired_comparison_counts_the_regime_that_binds_the_bests_score():
    """The task scores a case at its smaller regime ratio over the yardstick. The best's ratios there (1.3 hot, 1.1
    flushed: the flushed regime binds) say which of the candidate's gains counts: 4% in the flushed regime alone is a
    4% gain of the task's score (kept), where the smaller of the two ratios over the best reads no gain; 4% in the
    hot regime alone moves the score by nothing (not kept). Without the best's ratios for every case the comparison
    is the smaller of the two ratios over the best, as the report scores it."""
    names = [f"p{i}" for i in range(6)]
    flushed_only = paired_report(1.0, 0.005, flushed_gain=1.04)
    assert flushed_only["score"] == pytest.approx(1.0, abs=0.005)
    judged = compare(flushed_only, best_check(1.3, 1.1, names))
    assert judged["keep"] and judged["speedup_over_best"] == pytest.approx(1.04, abs=0.005), judged
    assert judged["versus_best"]["p0"] == pytest.approx(1.04, abs=0.005)
    assert "implied by the best's own ratios" in judged["compare_note"]
    hot_only = compare(paired_report(1.04, 0.005, flushed_gain=1.0), best_check(1.3, 1.1, names))
    assert not hot_only["keep"] and hot_only["speedup_over_best"] == pytest.approx(1.0, abs=0.005), hot_only
    # the hot regime binds instead (1.1 hot, 1.3 flushed): now the hot gain counts
    assert compare(paired_report(1.04, 0.005, flushed_gain=1.0), best_check(1.1, 1.3, names))["keep"]
    no_flushed = best_check(1.3, 1.1, names)
    no_flushed["cases"][0]["flushed"]["ratio"] = None
    elsewhere = best_check(1.3, 1.1, names) | {"device": "another GPU"}
    for partial in (best_check(1.3, 1.1, names[1:]), None, no_flushed, elsewhere):
        fallback = compare(flushed_only, partial)
        assert fallback["speedup_over_best"] == flushed_only["score"] and not fallback["keep"], fallback
        assert "implied" not in fallback["compare_note"]
    assert "another GPU model" in compare(flushed_only, elsewhere)["compare_note"]
    # the noise is the bootstrap of the score it gates: the implied one, not the smaller ratio's
    noisy = paired_report(1.0, 0.2, flushed_gain=1.04)
    standing = {name: (1.3, 1.1) for name in names}
    assert compare(noisy, best_check(1.3, 1.1, names))["noise"] == paired_noise(noisy["cases"], standing)
    assert paired_noise(noisy["cases"], standing) > NOISE_FLOOR and paired_noise(noisy["cases"], standing) != \
        paired_noise(noisy["cases"])
    # a case without a name is still compared (as the selfcheck never writes one, no best's ratio can be its)
    del flushed_only["cases"][0]["case"]["name"]
    assert compare(flushed_only)["speedup_over_best"] == flushed_only["score"]
    assert "implied" not in compare(flushed_only, best_check(1.3, 1.1, names))["compare_note"]


def evaluator(tmp_path: Path, cuda: bool = True) -> Evaluator:
    task = Task.load(Path(__file__).resolve().parents[2])
    task = dataclasses.replace(task, policy_cmd=("-c", PASS), selfcheck_cmd=("-c", SELFCHECK), gates_cmd=("-c", PASS),
                               commands={"residency": ("-c", PASS)},
                               stages=tuple(s for s in task.stages if s != "qualify"))
    assert task.checks == ("residency", "gates")
    return Evaluator(task, "smoke", cuda, tmp_path / "work")


def solution(tmp_path: Path, name: str, versus_v0: float, versus_best: float,
             paired: tuple[float, float] | None = None) -> Path:
    """A stand-in solution's numbers; ``paired``, where given, the (hot, flushed) ratios of its graph-paired timing
    against the best."""
    directory = tmp_path / name
    directory.mkdir()
    (directory / "solution.py").write_text("def build(qweight, scales, bias, epilogue):\n    pass\n")
    speedups = [("balanced", versus_v0), ("expert-batch", versus_v0)]
    against_best = {"score": versus_best, "speedups": [(s, versus_best) for s, _ in speedups]}
    (directory / "numbers.json").write_text(json.dumps({
        "versus_v0": {"score": versus_v0, "speedups": speedups},
        "versus_best": against_best | ({"paired": paired} if paired else {})}))
    return directory


def test_a_surely_slower_candidate_is_not_timed_against_the_best(tmp_path: Path):
    best = solution(tmp_path, "best", 1.5, 1.0)
    slow = solution(tmp_path, "slow", 1.2, 0.8)  # 0.8x the best's 1.5 by the scores against v0: surely slower
    verdict = evaluator(tmp_path).evaluate(slow, best, best_is_baseline=False, full_check=False, best_score=1.5)
    assert [s["name"] for s in verdict["stages"]] == ["policy", "selfcheck"]
    assert verdict["valid"] and not verdict["keep"] and abs(verdict["speedup_over_best"] - 0.8) < 1e-9
    assert verdict["compare_note"].startswith("estimated")


def test_a_close_candidate_is_timed_against_the_best_and_a_keeper_gets_residency_and_gates(tmp_path: Path):
    best = solution(tmp_path, "best", 1.5, 1.0)
    close = solution(tmp_path, "close", 1.5 * (1 - SURELY_SLOWER / 2), 1.1)  # within the margin: timed, and faster
    verdict = evaluator(tmp_path).evaluate(close, best, best_is_baseline=False, full_check=False, best_score=1.5)
    names = [s["name"] for s in verdict["stages"]]
    assert names[:3] == ["policy", "selfcheck", "versus_best"] and set(names[3:]) == {"residency", "gates"}
    assert verdict["keep"] and verdict["speedup_over_best"] == 1.1 and "compare_note" not in verdict
    assert verdict["residency"] == "ok" and verdict["gates"] == "ok" and verdict["gpu_timing"]
    # the same candidate without CUDA: valid and as fast, but interpreter timings keep nothing, so no check runs
    verdict = evaluator(tmp_path / "cpu", cuda=False).evaluate(close, best, best_is_baseline=False, full_check=False,
                                                               best_score=1.5)
    assert [s["name"] for s in verdict["stages"]] == ["policy", "selfcheck"]  # not timed against the best either
    assert verdict["valid"] and not verdict["keep"] and verdict["compare_note"].startswith("estimated")
    assert verdict["speedup_over_best"] == pytest.approx(1 - SURELY_SLOWER / 2)  # from both scores against v0
    assert verdict["residency"] is None and verdict["gates"] is None and not verdict["gpu_timing"]
    # with --full-check the checks run there too, and still nothing is kept
    verdict = evaluator(tmp_path / "full", cuda=False).evaluate(close, best, best_is_baseline=False, full_check=True,
                                                                best_score=1.5)
    assert set(s["name"] for s in verdict["stages"][2:]) == {"residency", "gates"} and not verdict["keep"]
    # without the best's score (a run that has not measured it) nothing is skipped
    lost = solution(tmp_path, "lost", 0.5, 0.9)
    verdict = evaluator(tmp_path).evaluate(lost, best, best_is_baseline=False, full_check=False, best_score=None)
    assert [s["name"] for s in verdict["stages"]] == ["policy", "selfcheck", "versus_best"] and not verdict["keep"]


def test_the_loop_judges_a_paired_timing_against_the_bests_own_report(tmp_path: Path):
    """The evaluator hands the best's selfcheck report (``best_check``) to the comparison: timed against the best at
    1.00 hot and 1.04 flushed, a candidate gains 4% where the best's flushed ratio binds (kept), nothing where its
    hot ratio does (not kept)."""
    best = solution(tmp_path, "best", 1.5, 1.0)
    close = solution(tmp_path, "close", 1.5, 1.0, paired=(1.0, 1.04))
    for (hot, flushed), kept in (((1.3, 1.1), True), ((1.1, 1.3), False)):
        verdict = evaluator(tmp_path / f"{hot}").evaluate(close, best, best_is_baseline=False, full_check=False,
                                                          best_score=1.5, best_check=best_check(hot, flushed,
                                                                                                ["c0", "c1"]))
        assert verdict["keep"] is kept and verdict["speedup_over_best"] == pytest.approx(1.04 if kept else 1.0)
        assert [s["name"] for s in verdict["stages"]][:3] == ["policy", "selfcheck", "versus_best"]


def test_a_keeper_whose_gates_cannot_run_is_not_kept(tmp_path: Path):
    """A gates command that does not run (here: its module is missing) is a failed stage, never a pass."""
    best = solution(tmp_path, "best", 1.5, 1.0)
    close = solution(tmp_path, "close", 1.5, 1.1)
    judge = evaluator(tmp_path)
    judge.task.gates_cmd = ("-m", "evals.no_such_verifier", "--gates-only")
    verdict = judge.evaluate(close, best, best_is_baseline=False, full_check=False, best_score=1.5)
    gates = next(s for s in verdict["stages"] if s["name"] == "gates")
    assert not gates["ok"] and "the gates did not run" in gates["note"] and "no_such_verifier" in gates["note"]
    assert verdict["failed_stage"] == "gates" and verdict["gates"] == "FAIL"
    assert not verdict["valid"] and not verdict["keep"]
