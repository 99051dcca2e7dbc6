"""The evaluation chain, cheapest first, stopping at the first failure: source policy -> selfcheck -> best and
candidate timed in alternation -> on a GPU, the qualification under the verifier's schedule (alone: it times) ->
the task's checks (its stages after those, such as a memory guard and the verifier's gates) side by side; the
qualification and the checks only for a candidate that would be kept. A candidate the verifier could not time
(host-bound, see agent.stability) is never kept, and without a GPU nothing is kept on timing.

Each stage is the evaluator's own CLI in a subprocess (agent/ never imports evals/), given the task; its JSON is the
result.
"""
from __future__ import annotations

import json
import math
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from agent.config import Task
from agent.runner import clip, python_command, python_env, run_command
from agent.stability import limit_of, qualification_failed, shared_cases, stability_block, unstable_cases

SURELY_SLOWER = 0.05
"""How far below the best's score against the baseline a candidate's may be before it is not timed against the
best."""
LIMIT_PER_START = 15.0
"""A stage may take this many times the start's own selfcheck on the panel (which times the baseline beside it); the
slowest stages, the checks side by side, take 3-6 times as long."""
OUTPUT_TAIL = 3000
"""Characters of each stage's output its verdict keeps: a crash's last lines name the case it died on."""
LIMIT_FLOOR_S = 120.0
"""The least time limit of a stage, however fast the start's selfcheck: room for compiling on a cold cache."""


def panel_limit(task: Task, start_selfcheck_s: float) -> float:
    """The time limit of each evaluator stage on a run's panel: it follows the panel's cost (a hang on the smoke panel
    costs minutes, not the task's whole limit), never below the floor nor above the task's ``eval_timeout_s``."""
    return min(task.eval_timeout_s, max(LIMIT_FLOOR_S, LIMIT_PER_START * start_selfcheck_s))


@dataclass
class Stage:
    name: str
    ok: bool
    returncode: int | None
    seconds: float
    note: str
    report: dict | None
    output: str = ""

    def summary(self) -> dict:
        return {"name": self.name, "ok": self.ok, "returncode": self.returncode, "seconds": round(self.seconds, 2),
                "note": self.note, "output": self.output[-OUTPUT_TAIL:]}


def _failed_gates(report: dict) -> str:
    """The failed gates of a verifier report, per case, with their first evidence."""
    failed = [f"{c['case']['name']}: {gate}: {'; '.join(map(str, c['gates'][gate]['evidence'][:1]))[:300]}"
              for c in report.get("cases", []) for gate in c.get("failed", [])]
    failed += [f"{gate}" for gate, status in (report.get("gates") or {}).items()
               if status == "fail" and gate == "policy"]
    return "; ".join(failed)[:1500]


BASELINE_TIMING_GATES = {"dispersion", "baseline_agreement"}


def baseline_noise_only(report: dict) -> bool:
    """Whether a finished verifier report that is not valid failed only on the baseline's own timing: on every
    failed case only the dispersion or the baseline-agreement gate, every role ran and passed its own gates and was
    timed, and the candidate's groups are within the limit. Such a verdict says nothing against the candidate (a
    baseline near its host cost on some cases has groups at the host's pace), and the same verification run again
    can be valid. A partial report (a verifier cut off) is never one."""
    failed = [c for c in report.get("cases", []) if c.get("failed")]
    if report.get("valid") or report.get("partial") or "gates" not in report or not failed or report.get("skipped"):
        return False
    if any(status == "fail" and gate not in BASELINE_TIMING_GATES for gate, status in report["gates"].items()):
        return False

    def timed(role: dict | None) -> list[float]:  # a role's groups, empty where it broke or failed a gate of its own
        role = role or {}
        broken = role.get("error") or any((g or {}).get("status") == "fail" for g in (role.get("gates") or {}).values())
        times = [] if broken else role.get("times_us") or []
        return times if times and min(times) > 0 else []

    for case in failed:
        roles = case.get("roles") or {}
        groups = {name: timed(roles.get(name)) for name in ("baseline_before", "candidate", "baseline_after")}
        if (set(case["failed"]) - BASELINE_TIMING_GATES or not all(groups.values())
                or max(groups["candidate"]) / min(groups["candidate"]) > limit_of(report)):
            return False
    return True


class Evaluator:
    """Runs the task's evaluator commands on a solution directory; outputs go to ``work_dir``."""

    def __init__(self, task: Task, panel: str, cuda: bool, work_dir: Path, timeout_s: float | None = None,
                 gpu: str = ""):
        self.task, self.panel, self.cuda, self.work_dir, self.gpu = task, panel, cuda, work_dir, gpu
        # per stage; a run passes its panel_limit, which a lower task limit (KLOOP_EVAL_TIMEOUT on --resume) caps
        self.timeout_s = min(timeout_s or task.eval_timeout_s, task.eval_timeout_s)
        work_dir.mkdir(parents=True, exist_ok=True)

    def _run(self, name: str, module_args: tuple[str, ...], args: list[str], json_out: Path,
             task: bool = True) -> Stage:
        """One evaluator command (``task``: given the task's folder; the source policy, the same for every task, is
        not) with its JSON report."""
        json_out.unlink(missing_ok=True)
        started = time.monotonic()
        given = self.task.task_arg if task else ()
        result = run_command(python_command(module_args, *given, *args, "--json", str(json_out)),
                             self.task.root, self.timeout_s, python_env(self.task.root, self.cuda, self.gpu))
        seconds = time.monotonic() - started
        try:
            report = json.loads(json_out.read_text()) if json_out.is_file() else None
        except ValueError:  # a process killed while writing leaves half a file: no report
            report = None
        rc = result["returncode"]
        if result["timed_out"]:
            limit = "the task's limit" if self.timeout_s >= self.task.eval_timeout_s else "the panel's limit"
            note = f"timed out after {self.timeout_s:g} s, {limit} (process group killed)"
        elif rc < 0:
            note = f"crashed: killed by signal {-rc}; its last output: " + _tail(result["output"], 4)
        elif report is None:
            note = f"exit {rc} without a JSON report: " + _tail(result["output"])
        else:
            note = "ok" if rc == 0 else f"exit {rc}"
        return Stage(name, rc == 0 and report is not None, rc, seconds, note, report, clip(result["output"], 4000))

    def policy(self, solution: Path) -> Stage:
        stage = self._run("policy", self.task.policy_cmd, [str(solution)], self.work_dir / "policy.json", task=False)
        if not stage.ok and stage.report and "files" in stage.report:
            found = [f"{Path(f).name}:{v['line']} [{v['rule']}] {v['message']}"
                     for f, vs in stage.report["files"].items() for v in vs]
            stage.note = "policy violations: " + "; ".join(found[:5])
        return stage

    def gates(self, solution: Path) -> Stage:
        """The verifier's hard gates, untimed. A gates command that cannot run (a missing module, a crash) fails the
        stage like any other: a verdict never says the gates passed when they did not run."""
        stage = self._run("gates", self.task.gates_cmd, ["--solution", str(solution), "--panel", self.panel],
                          self.work_dir / "gates.json")
        if stage.report and not stage.ok:
            stage.note = "failed gates: " + (_failed_gates(stage.report) or stage.note)
        elif not stage.report:
            stage.note = "the gates did not run: " + stage.note
        return stage

    def verify(self, solution: Path) -> Stage:
        """The full verifier on the panel: every gate, then the baseline before, the solution, the baseline after,
        each timed in its own process (minutes on the visible panel). Only a GPU can pass it: interpreter timings are
        never valid."""
        stage = self._run("verifier", self.task.verify_cmd, ["--solution", str(solution), "--panel", self.panel],
                          self.work_dir / "verifier.json")
        if stage.report:
            if stage.ok:
                stage.note = f"valid, score {stage.report.get('score') or 0:.3f}"
            else:
                stage.note = "not valid: " + (_failed_gates(stage.report) or stage.note)
        return stage

    def selfcheck(self, solution: Path, baseline: Path | None = None, name: str = "selfcheck") -> Stage:
        args = ["--solution", str(solution), "--panel", self.panel]
        args += ["--baseline", str(baseline)] if baseline else []
        stage = self._run(name, self.task.selfcheck_cmd, args, self.work_dir / f"{name}.json")
        if stage.report and "cases" in stage.report and not stage.ok:
            failures = "; ".join(_case_failure(c) for c in stage.report["cases"] if not c["correct"])
            stage.note = "incorrect: " + failures[:1500]
        return stage

    def profile(self, solution: Path) -> Stage:
        return self._run("profile", self.task.profile_cmd, ["--solution", str(solution), "--panel", self.panel],
                         self.work_dir / "profile.json")

    def qualify(self, solution: Path) -> Stage:
        """The candidate timed under the verifier's own candidate schedule (GPU only: never called otherwise); ok when
        every timed vector stays within the verifier's max/min limit."""
        stage = self._run("qualify", self.task.qualify_cmd, ["--solution", str(solution), "--panel", self.panel],
                          self.work_dir / "qualify.json")
        report = stage.report
        if report is None:
            stage.note = "the qualification did not run: " + stage.note
        elif not report.get("passed") or not report.get("measured"):  # over the limit, or it could not time
            stage.ok, stage.note = False, stability_block(None, report)[2]
        return stage

    def check(self, name: str, solution: Path) -> Stage:
        """One of the task's checks by stage name (the gates, or a check command such as a memory guard whose report
        lists cases with ``ok``)."""
        if name == "gates":
            return self.gates(solution)
        stage = self._run(name, self.task.command(name), ["--solution", str(solution), "--panel", self.panel],
                          self.work_dir / f"{name}.json")
        if stage.report and "cases" in stage.report and not stage.ok:
            failures = "; ".join(_case_failure(c) for c in stage.report["cases"] if not c.get("ok"))
            stage.note = f"{name}: " + failures[:1500]
        return stage

    def evaluate(self, solution: Path, best: Path, best_is_baseline: bool, full_check: bool = True,
                 best_score: float | None = None, best_check: dict | None = None) -> dict:
        """The verdict of one attempt; ``keep`` is True only for a valid candidate faster than ``best`` beyond noise
        and, on a GPU, stable.

        Cheapest first, stopping at the first failure: policy, selfcheck (correctness and speed against the
        baseline), the
        comparison with the best (both timed in alternation in one process); on a GPU the qualification under the
        verifier's schedule, alone since it times; then the task's checks, the slowest stages on a GPU, side by side
        (none times anything). Without ``full_check`` (the loop's default) the qualification and the checks run only
        for a candidate that would be kept, since a slower one is reverted whatever they say. A candidate whose score
        against the baseline is more than ``SURELY_SLOWER`` below ``best_score`` (the best's own score against it)
        cannot be kept: it is not timed against the best, and its row says so. Without a GPU nothing is kept: the
        interpreter's wall times cannot rank kernels, so no candidate is timed against the best or is a would-be
        keeper there.

        On a GPU a keeper must also be stable (``agent.stability``): a case the selfcheck finds host-bound, or a
        qualification vector over the verifier's limit, blocks the keep; such a candidate is still valid (correct,
        scored) and its ``stable`` cell says why. A host-bound case on which the candidate's GPU time is the best's
        (``best_check``, the best's selfcheck report: its plan there is as far from its host as the best's), or whose
        GPU time clears its host cost short of the ratio, does not block: the qualification, which times the
        verifier's own schedule, decides it. Without CUDA nothing is measured: the qualification never runs and the
        cell is "-". ``best_check`` also gives a graph-paired comparison with the best the best's own ratios over
        the yardstick (``compare``).
        """
        stages: list[Stage] = []

        def passed(stage: Stage) -> bool:
            stages.append(stage)
            return stage.ok

        comparison: dict = {"keep": False, "speedup_over_best": None, "noise": None}
        stable, stable_cell, stable_note = True, "-", ""
        if passed(self.policy(solution)) and passed(self.selfcheck(solution)):
            check = stages[-1].report
            if self.cuda:
                stable, stable_cell, stable_note = stability_block(check, None, best_check)
            estimate = (check.get("score") or 0.0) / best_score if best_score else None
            if best_is_baseline:  # the selfcheck already timed the candidate against the baseline in alternation
                comparison = compare(check)
            elif not self.cuda or not stable or (estimate is not None and estimate < 1 - SURELY_SLOWER):
                # cannot be kept (interpreter timings keep nothing): timing it against the best would say nothing
                estimated = "estimated from both scores against the baseline; " if estimate is not None else ""
                comparison = {"keep": False, "speedup_over_best": estimate, "noise": None,
                              "compare_note": estimated + "not timed against the best"}
            elif passed(self.selfcheck(solution, best, "versus_best")):
                comparison = compare(stages[-1].report, best_check)
            keeper = comparison["keep"] and self.cuda
            if self.cuda and "qualify" in self.task.stages and stable and (keeper or full_check):
                stages.append(self.qualify(solution))  # alone: it times, so nothing may run beside it
                report = stages[-1].report
                stable, stable_cell, stable_note = stability_block(
                    check, report if report is not None else {"measured": False, "note": stages[-1].note}, best_check)
            if (keeper and stable) or full_check:
                with ThreadPoolExecutor(max(1, len(self.task.checks))) as pool:  # none is timed: side by side
                    checks = [pool.submit(self.check, name, solution) for name in self.task.checks]
                    stages.extend(future.result() for future in checks)
        check = next((s.report for s in stages if s.name == "selfcheck" and s.report and "cases" in s.report), None)
        names = {s.name: s for s in stages}
        qualified = names["qualify"].report if "qualify" in names else None
        notes = [f"{s.name}: {s.note}" for s in stages if s.note != "ok"]
        if not stable and "qualify" not in names:  # the selfcheck's host-bound probe, which no stage note says
            notes.append(f"stability: {stable_note}")
        shared = shared_cases(check, best_check) if self.cuda else []
        for defer, why in (("as best", "at the best's own GPU time"), ("near", "GPU time above the host cost")):
            cases = [u for u in shared if u["defer"] == defer]
            if cases:
                notes.append(f"stability: not blocking, {why}"
                             + (" (the qualification decided)" if "qualify" in names else "") + ": "
                             + ", ".join(f"{u['case']} {u['why']}" for u in cases))
        verdict = {"stages": [s.summary() for s in stages],
                   # a qualification that measured a vector over the limit answered: the stable cell says it
                   "failed_stage": next((s.name for s in stages
                                         if not s.ok and not (s.name == "qualify" and qualification_failed(s.report))),
                                        None),
                   "panel": self.panel, "gpu_timing": self.cuda,
                   "correct": None if check is None else bool(check.get("all_correct")),
                   # a case that raised (a compile error such as OutOfResources, a crash) rather than computed wrongly
                   "raised": bool(check) and any(c.get("error") for c in check.get("cases", [])),
                   **{name: ("ok" if names[name].ok else "FAIL") if name in names else None
                      for name in self.task.checks},
                   "strata": (check or {}).get("strata", {}), "score": (check or {}).get("score"),
                   # the GPU model its numbers were taken on: the per-table search compares one model's only
                   "device": (check or {}).get("device") if self.cuda else None,
                   "cases": [_case_numbers(c) for c in (check or {}).get("cases", [])],
                   # "yes", "no (why)" or "-" (not measured: no CUDA, or never reached), and the cases that were not
                   "stable": stable_cell, "stability_note": stable_note,
                   "unstable": unstable_cases(check, qualified, best_check) if self.cuda else [],
                   "note": "; ".join(notes)}
        verdict["valid"] = verdict["failed_stage"] is None and verdict["score"] is not None
        # a keeper has passed the qualification (where the task has one) and every check, measured on a GPU
        steady = stable and ("qualify" in names or "qualify" not in self.task.stages)
        verdict.update(comparison, keep=verdict["valid"] and comparison["keep"] and self.cuda and steady
                       and all(name in names for name in self.task.checks))
        return verdict


def compare(report: dict | None, best_check: dict | None = None) -> dict:
    """The candidate's speedup over the best, both timed in alternation in one process, aggregated as the task's
    score (the selfcheck's: geometric mean per stratum, harmonic mean across strata), against the noise. A plain
    geomean over all cases would keep a candidate that wins one stratum by more than it loses the other and lowers
    the score.

    Where every case is graph-paired (its ``hot`` and ``flushed`` records hold the paired replays' series), a case's
    speedup is the one the task's score would see (``implied``): the task scores each case at the smaller of its two
    regimes' ratios over the yardstick, so with the best's own ratios there (``best_check``, its selfcheck report)
    the candidate's are the best's times its ratios over the best, regime by regime. The smaller of the two ratios
    over the best reads low where nothing changed and misses a gain in the regime that binds while the other stays
    level (reports/examples/llgemm-seed002/README.md, "the keep rule"); without the best's ratios for every case it is
    still what is used. The noise there: half the score's 5-95% range over bootstrap redraws of those pairs
    (``paired_noise``), at least ``NOISE_FLOOR``. Else the report's score, and the median over cases of each case's
    noise: its ``spread`` where the report gives one (the candidate's larger spread by place, minus 1), else the
    spread (max/min - 1) of the candidate's per-group times. ``versus_best`` keeps each case's speedup, which the
    per-table search reads back (a merge's table whose cases lost here is not merged again)."""
    cases = (report or {}).get("cases", [])
    speedups = [c["speedup"] for c in cases if c.get("speedup")]
    score = (report or {}).get("score")
    if not cases or len(speedups) != len(cases) or not score:
        return {"keep": False, "speedup_over_best": None, "noise": None, "compare_note": "no valid comparison"}
    standing = best_ratios(report, best_check)
    paired = paired_noise(cases, standing)
    named = [(c.get("case") or {}).get("name") for c in cases]
    if paired is not None:
        values = [implied((c["hot"]["ratio"], c["flushed"]["ratio"]), (standing or {}).get(name))
                  for c, name in zip(cases, named)]
        if standing:
            score = task_score([(c["case"]["stratum"], value) for c, value in zip(cases, values)])
        noise = max(NOISE_FLOOR, paired)
        note = f"noise: half the score's bootstrap 5-95% range, {paired:.4f} (floor {NOISE_FLOOR})"
        if standing:
            note = "the task's score implied by the best's own ratios over the yardstick; " + note
        elif best_check and best_check.get("device") != report.get("device"):
            note = "the best's report from another GPU model: the smaller ratio over the best; " + note
        return {"keep": score > 1 + noise, "speedup_over_best": score, "noise": noise, "compare_note": note,
                "versus_best": {name: value for name, value in zip(named, values) if name}}
    per_case = {name: c["speedup"] for c, name in zip(cases, named) if name}
    spreads = sorted(c["spread"] if c.get("spread") is not None else max(c["times_us"]) / min(c["times_us"]) - 1
                     for c in cases if c.get("spread") is not None or c.get("times_us"))
    noise = spreads[len(spreads) // 2] if spreads else 0.0
    return {"keep": score > 1 + noise, "speedup_over_best": score, "noise": noise, "versus_best": per_case}


NOISE_FLOOR = 0.01
"""The least noise of a graph-paired comparison: the replays' bootstrap sees one process's noise only. Two merges
of nearly the same tables, timed against the same best in two runs, scored 0.2% apart, each with a bootstrap 5-95%
range of 0.4% (reports/examples/llgemm-seed002/README.md, "the keep rule")."""
BOOTSTRAP_DRAWS = 400
PAIRED = ("hot", "flushed")


def best_ratios(report: dict, best_check: dict | None) -> dict[str, tuple[float, float]] | None:
    """Each case's (hot, flushed) ratio over the task's yardstick in the best's selfcheck report, by case name; None
    unless that report was measured on the GPU model of ``report`` (the candidate against the best) and has both,
    positive, for every case of ``report``: another model's ratios say nothing of which regime binds here."""
    if not best_check or best_check.get("device") != report.get("device"):
        return None
    known = {}
    for case in best_check.get("cases", []):
        ratios = tuple((case.get(name) or {}).get("ratio") for name in PAIRED)
        name = (case.get("case") or {}).get("name")
        if name and all(isinstance(r, (int, float)) and r > 0 for r in ratios):
            known[name] = ratios
    names = [(c.get("case") or {}).get("name") for c in report.get("cases", [])]
    return {name: known[name] for name in names} if names and all(n in known for n in names) else None


def implied(ratios: tuple[float, float], best: tuple[float, float] | None) -> float:
    """A case's speedup over the best as the task's score sees it: the smaller of the candidate's ratios over the
    yardstick (the best's, ``best``, times the candidate's over the best, ``ratios``, regime by regime) over the
    smaller of the best's; without ``best``, the smaller of ``ratios``."""
    if best is None:
        return min(ratios)
    return min(b * r for b, r in zip(best, ratios, strict=True)) / min(best)


def task_score(values: list[tuple[str, float]]) -> float:
    """The task's score of (stratum, speedup) pairs: the geometric mean per stratum, their harmonic mean."""
    strata: dict[str, list[float]] = {}
    for stratum, value in values:
        strata.setdefault(stratum, []).append(math.log(value))
    means = [math.exp(sum(v) / len(v)) for v in strata.values()]
    return len(means) / sum(1 / m for m in means)


def paired_noise(cases: list[dict], best: dict | None = None, draws: int = BOOTSTRAP_DRAWS) -> float | None:
    """Half the 5-95% range of the score over ``draws`` bootstrap redraws of the paired replays
    (``bootstrap_scores``); None where a case has no paired series."""
    scores = bootstrap_scores(cases, draws, best=best)
    return None if scores is None else (scores[int(0.95 * draws)] - scores[int(0.05 * draws)]) / 2


def bootstrap_scores(cases: list[dict], draws: int, seed: int = 0, best: dict | None = None) -> list[float] | None:
    """The task's score over ``draws`` bootstrap redraws of every case's paired replays, sorted: each regime's pairs
    drawn with replacement within their place (even- or odd-indexed), candidate and baseline together; a case's
    speedup from its regimes' baseline/candidate ratios of centers by place, ``implied`` with the best's ratios
    ``best`` (by case name) where given, else the smaller, as the selfcheck scores it. None unless every case has
    both regimes' series of equal lengths. Seeded: the same report gives the same scores."""
    series = []
    for case in cases:
        regimes = [case.get(name) or {} for name in PAIRED]
        pairs = [(r.get("candidate_times_us") or [], r.get("baseline_times_us") or []) for r in regimes]
        stratum = (case.get("case") or {}).get("stratum")
        if not stratum or not all(a and len(a) == len(b) and min(a) > 0 and min(b) > 0 for a, b in pairs):
            return None
        series.append((stratum, pairs, (best or {}).get(case["case"].get("name"))))
    rng = random.Random(seed)
    scores = []
    for _ in range(draws):
        values = []
        for stratum, pairs, standing in series:
            ratios = []
            for candidate, baseline in pairs:
                # each place in the pairs (the even- and the odd-indexed) redrawn within itself, as the selfcheck
                # takes a series' center by place (evals/graph_timing.py)
                picks = [[rng.choice(place) for _ in place] for place in (range(0, len(candidate), 2),
                                                                           range(1, len(candidate), 2)) if place]
                ratios.append(placed_center(baseline, picks) / placed_center(candidate, picks))
            values.append((stratum, implied(tuple(ratios), standing)))
        scores.append(task_score(values))
    return sorted(scores)


def placed_center(values: list[float], picks: list[list[int]]) -> float:
    """The geometric mean of the medians of ``values`` at each list of indices in ``picks``."""
    medians = [statistics.median(values[i] for i in place) for place in picks]
    return math.prod(medians) ** (1 / len(medians))


def _case_failure(case: dict) -> str:
    name = case["case"]["name"]
    if case.get("error"):
        return f"{name}: {case['error']['stage']}: {case['error']['name']}: {case['error']['message'][:300]}"
    bad = [f"{mode}: {c['message'][:300]}" for mode, c in (case.get("checks") or {}).items() if not c.get("ok")]
    return f"{name}: " + ("; ".join(bad) or "not ok")


def correct_cell(verdict: dict) -> str:
    """The ledger's "correct" cell: yes, no (a wrong result), error (a case raised: it did not compile or crashed), or -
    (never checked)."""
    if verdict["correct"] is None:
        return "-"
    return "yes" if verdict["correct"] else ("error" if verdict.get("raised") else "no")


def _case_numbers(case: dict) -> dict:
    keys = ("correct", "median_us", "gbps", "roofline_fraction", "baseline_median_us", "speedup", "host_us", "gpu_us",
            "stable")
    return {"name": case["case"]["name"], "stratum": case["case"]["stratum"]} | {k: case.get(k) for k in keys}


def _tail(text: str, lines: int = 6) -> str:
    return " / ".join(text.strip().splitlines()[-lines:])[-800:]
