"""The sealed judge of a task's spec: every hard gate, then the task's timing protocol per case, then the score.

    .venv/bin/python -m evals.verifier [--task NAME|DIR] --solution DIR --panel FILE [--baseline DIR] [--json OUT]
                                       [--gates-only [--jobs N]]
    .venv/bin/python -m evals.verifier make-panel [--task NAME|DIR] --seed S [--out FILE] [--per-stratum 5]

The task (evals/task.py; default w4a16) gives everything that is its own: cases, inputs, the oracle, the strata, the
baseline and the sealed-panel generator; this module and evals/gates.py know no task's terms.

``--json OUT`` is rewritten after each case while the run goes on (``partial``: true, never valid), so a run stopped
early still leaves the cases it judged; the last write is the full report.

This process never imports candidate code. It runs the source policy (evals/policy.py) itself, and for each case starts
role processes (``python -m evals.verifier role ...``, evals/gates.py) in a scratch directory, as the task's timing
protocol (its manifest's ``timing``, the report's ``timing``) says. The baseline is the task's (its manifest's version,
or the adapter's callable, which a role runs with ``--baseline-callable``), or the solution given by ``--baseline``.

- eager-groups: three roles per case, the baseline "before", the candidate, the baseline "after", each with the
  protocol's full schedule. Dispersion: each role's 11 group times have max/min <= 1.15, and baseline_agreement: the
  two baseline medians agree within 1.15, with no retry and no trimming. Case score = sqrt(before * after) /
  candidate.
- graph-paired: one role per case, the candidate's, which runs every gate and then times the candidate paired with
  the baseline in its own process (evals/graph_timing.py: CUDA-graph replay, hot and L2-flushed, the baseline loaded
  and captured before the candidate; a role runs with ``--pair-with DIR`` where the baseline is a solution).
  Each series is taken by place in the pairs (first or second; graph_timing's center and place_spread).
  Dispersion: each of the four series (candidate and baseline, hot and flushed) has an interquartile spread p75/p25 <=
  1.15, and baseline_agreement: the baseline's centers over the first and the second half of the pairs agree within
  1.15 in each regime; a missing series fails dispersion, and a missing baseline series baseline_agreement too.
  Case score = min(hot ratio, flushed ratio), each the baseline's center over the candidate's: a speedup counts only
  where it holds in both regimes. timing_sanity holds the flushed center alone to the bandwidth roofline (gates.py).

Geometric mean per stratum; harmonic mean across strata. Exit status 0 only for a valid submission (every gate
passed, none skipped). A source that the policy rejects is invalid whatever it does, so a full run does not time it:
its role gates are skipped and policy is the failed gate.

``--gates-only`` runs the candidate role alone, every gate but the timing ones (even when the policy failed: the
role's dynamic evidence shows what the code does); without CUDA on CPU tensors under the Triton interpreter,
skipping only the CUDA-only gates and saying why (exit 0 when no gate failed). Nothing is timed there, so
``--jobs N`` checks N cases at once (at most one a core), each still in its own process.
A case the verifier itself cannot set up (a seed whose construction the task's adapter cannot complete) fails the
case_setup gate with the verifier's message; that is a panel problem to re-draw, not a failure of the candidate.
A hidden ``--schedule smoke`` shrinks the schedule so that CPU tests of the whole pipeline finish; it never scores.

A failed eager-groups dispersion gate says why where it can: after its timed groups the candidate role measures its
host cost and GPU time per call (evals/stability.py), and the gate's evidence names a host-bound candidate (GPU time
below the host cost, or under the calibrated ratio). The verdict does not change: the gate still fails. (Graph replay
keeps the host out of the timed region: a graph-paired role measures no host cost.)
Stabilizers (the timing protocol's advice), on the verifier's side only: the cyclic garbage collector is disabled
during the timed groups, and each timing role on CUDA pins itself to one core with os.sched_setaffinity where the OS
has it. The hidden ``--schedule spec-unpinned`` (no pinning) and ``--schedule spec-thread-pinned`` (the timing
thread alone on one core, the process's other threads on the rest) run the protocol's schedule with another pinning,
to measure what the pinning does to a host-bound candidate's dispersion; the report says so (``schedule``), and the
verdict of record is the default. A role process dies with the verifier (Linux: PR_SET_PDEATHSIG), so a verifier
killed by a time limit leaves nothing running on the GPU.
The input schedule is a pool of 512 distinct call inputs (one per call of a timed group), drawn from the case's seed;
before each timed group, outside its timed region, the pool is rewritten in place with the group's own seeded draw:
identical for all three roles, fresh for each case and group, and no call input (address, _version or contents)
repeats within a group or between groups, so a cache of outputs never pays off. Under graph-paired the pool is the
graphs' static call inputs, rewritten the same way before every pair (the draw of the pair's index).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from evals import gate_spies, gates, graph_timing, stability
from evals import kernel_harness as kh
from evals import task as tasks
from evals.gates import SETUP_STAGE, role_gates
from evals.loader import resolve_solution_dir
from evals.selfcheck import stratum_scores
from evals.stability import DISPERSION_LIMIT

ROOT = kh.ROOT
ROLES = ("baseline_before", "candidate", "baseline_after")
ROLE_TIMEOUT_S = {"spec": 900, "spec-unpinned": 900, "spec-thread-pinned": 900, "smoke": 600}
PANEL_HOME = Path.home() / ".kloop" / "panels"
# the agent reads and writes these (and a task's own readable, main and versions folders): no sealed panel may live
# there
PROTECTED_DIRS = ("methods", "workspace", "tasks")
PER_STRATUM = 5
_ROLE_IDS = itertools.count()  # unique record names when roles run at once


# ----------------------------------------------------------------------------------------------------- roles
def run_role_process(task: tasks.Task, solution: Path | None, case, schedule: str, timing: bool,
                     scratch: Path, pair_with: Path | None = None) -> dict:
    """One role in a fresh process (``solution`` None: the task's callable baseline; a graph-paired task's timing
    pairs it with ``pair_with``, None: the task's baseline); a crash, a hang or a missing record becomes an error
    record."""
    out = scratch / f"role-{os.getpid()}-{next(_ROLE_IDS)}-{case.name}.json"
    command = ([sys.executable, "-m", "evals.verifier", "role", "--task", str(task.folder)]
               + (["--solution", str(solution)] if solution is not None else ["--baseline-callable"])
               + ["--case", json.dumps(asdict(case)), "--schedule", schedule, "--out", str(out)]
               + (["--timing"] if timing else []) + (["--pair-with", str(pair_with)] if pair_with is not None else []))
    env = kh.child_env(KLOOP_VERIFIER_PID=str(os.getpid()))
    try:
        run = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True,
                             timeout=ROLE_TIMEOUT_S[schedule])
        failure = f"exit status {run.returncode}; stderr: {run.stderr[-1500:]}"
    except subprocess.TimeoutExpired:
        failure = f"no result within {ROLE_TIMEOUT_S[schedule]} s"
    try:
        return json.loads(out.read_text())
    except (OSError, ValueError):  # no record, or a half-written one: the process died
        pass
    return {"case": kh.case_dict(case), "solution": solution_label(task, solution), "gates": {}, "times_us": [],
            "median_us": None, "error": {"stage": "role process", "name": "RoleCrashed", "message": failure}}


def solution_label(task: tasks.Task, solution: Path | None) -> str:
    return str(solution) if solution is not None else gates.baseline_label(task)


def role_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m evals.verifier role")
    tasks.add_argument(parser)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--solution", help="the solution directory this role runs")
    which.add_argument("--baseline-callable", action="store_true",
                       help="run the task's callable baseline (its adapter's baseline(weights, case)), no solution")
    parser.add_argument("--case", required=True, help="the case as JSON")
    parser.add_argument("--schedule", default="spec")
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--pair-with", help="graph-paired: the yardstick solution the timing pairs this role with "
                                            "(default: the task's baseline)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    gate_spies.die_with_parent(os.environ.get("KLOOP_VERIFIER_PID"))
    out = open(args.out, "w")  # opened before candidate code exists in this process
    task = tasks.load(args.task)
    solution = None if args.baseline_callable else resolve_solution_dir(args.solution)
    record = gates.run_role(task, solution, task.adapter.Case(**json.loads(args.case)), gates.SCHEDULES[args.schedule],
                            args.timing, Path(args.pair_with) if args.pair_with else None,
                            gates.graph_plan(args.schedule))
    out.write(json.dumps(record, default=str))
    out.close()
    return 0


# ----------------------------------------------------------------------------------------------------- judging
def policy_gate(solution: Path) -> dict:
    from evals.policy import check_files

    found = {file: violations for file, violations in check_files([solution]).items() if violations}
    evidence = [f"{Path(file).name}:{v.line}: [{v.rule}] {v.message}" for file, vs in found.items() for v in vs]
    return {"status": "fail" if found else "pass", "evidence": evidence or [f"every *.py of {solution} clean"]}


def not_run_record(task: tasks.Task, case, solution: Path, reason: str) -> dict:
    """The candidate's record when its role is deliberately not run: every role gate skipped, with the reason."""
    return {"case": kh.case_dict(case), "solution": str(solution), "not_run": reason, "times_us": [], "median_us": None,
            "error": None, "gates": {name: {"status": "skip", "evidence": [reason]} for name in role_gates(task)}}


def dispersion(times: list[float]) -> float | None:
    return max(times) / min(times) if times and min(times) > 0 else None


def host_bound_line(record: dict) -> str:
    """The candidate's host cost and GPU time per call (measured after its timed groups), and whether that explains
    its dispersion: a GPU time below the host cost leaves each group's time to the noisy host."""
    host, gpu = record.get("host_us"), record.get("gpu_us")
    if host is None or gpu is None:
        return "candidate host cost and GPU time per call: not measured"
    stable, why = stability.verdict(host, gpu)
    return (f"candidate: host {host:.2f} us per call, GPU {gpu:.2f} us per call; "
            + (why if not stable else f"{why}: not host-bound, so the host's or the GPU's noise spread the groups"))


def judge_case(task: tasks.Task, case, roles: dict[str, dict], policy: dict, gates_only: bool) -> dict:
    candidate = roles["candidate"]
    gates = {name: dict(gate) for name, gate in candidate.get("gates", {}).items()}
    gates["policy"] = policy
    setup_failures = [f"{role}: {r['error']['name']}: {r['error']['message'][:400]}" for role, r in roles.items()
                      if (r.get("error") or {}).get("stage") == SETUP_STAGE]
    if setup_failures:  # the verifier's own failure: the case was never judged, so nothing is said of the candidate
        unjudged = {"status": "skip", "evidence": ["not run: the verifier could not set up this case (see case_setup)"]}
        gates = {name: dict(unjudged) for name in (*role_gates(task), "coverage")} | {"policy": policy, "case_setup": {
            "status": "fail", "evidence": [f"the verifier could not set up {case.name} (seed {case.seed}), so no role "
                                           "gate ran; a panel or verifier problem, not a failure of the candidate "
                                           "(draw the panel again): " + "; ".join(setup_failures)]}}
    elif candidate.get("not_run"):
        gates["coverage"] = {"status": "skip", "evidence": [candidate["not_run"]]}
    else:
        missing = [name for name, gate in gates.items() if gate["status"] == "not_run"] or (
            ["every role gate"] if not candidate.get("gates") else [])
        crash = (candidate.get("error") or {}).get("name") == "RoleCrashed"
        gates["coverage"] = {"status": "fail" if missing or crash else "pass", "evidence": [
            f"not evaluated: {', '.join(missing)}"
            + (f" ({candidate['error']['message'][:300]})" if candidate.get("error") else "")
            if missing or crash else f"every gate ran on {case.name}"]}
    paired = task.graph_paired
    medians = paired_medians(candidate) if paired else {role: r.get("median_us") for role, r in roles.items()}
    ratio = None
    if gates_only or candidate.get("median_us") is None:
        reason = "a timing gate: not run with --gates-only" if gates_only else "the candidate was not timed"
        for name in ("dispersion", "baseline_agreement"):
            gates[name] = {"status": "skip", "evidence": [reason]}
    elif paired:
        ratio = judge_paired(candidate, gates)
    else:
        spreads = {role: dispersion(r.get("times_us") or []) for role, r in roles.items()}
        bad = [role for role in ROLES if spreads.get(role) is None or spreads[role] > DISPERSION_LIMIT]
        gates["dispersion"] = {"status": "fail" if bad else "pass", "evidence": [
            ", ".join(f"{role} max/min {kh.cell(spreads.get(role), '.3f')}"
                      for role in ROLES)
            + (f"; over {DISPERSION_LIMIT} or missing: {', '.join(bad)}" if bad else "")]
            # the groups in order show one stalled group apart from a drift (us per call)
            + [f"{role} groups: " + " ".join(f"{t:.2f}" for t in roles[role]["times_us"])
               for role in bad if roles.get(role, {}).get("times_us")]
            + ([host_bound_line(candidate)] if "candidate" in bad else [])}
        before, after = medians.get("baseline_before"), medians.get("baseline_after")
        broken = [f"{role} failed {name}" for role in ("baseline_before", "baseline_after")
                  for name, gate in roles.get(role, {}).get("gates", {}).items() if gate["status"] == "fail"]
        agree = before and after and max(before, after) / min(before, after) <= DISPERSION_LIMIT and not broken
        gates["baseline_agreement"] = {"status": "pass" if agree else "fail", "evidence": [
            f"baseline medians {before or 0:.2f} us and {after or 0:.2f} us" + ("" if agree else
            f": not within {DISPERSION_LIMIT}x, or a baseline role failed ({', '.join(broken) or 'no failed gate'})")]}
        if before and after and medians.get("candidate"):
            ratio = math.sqrt(before * after) / medians["candidate"]
    failed = [name for name, gate in gates.items() if gate["status"] == "fail"]
    skipped = [name for name, gate in gates.items() if gate["status"] == "skip"]
    return {"case": kh.case_dict(case), "gates": gates, "failed": failed, "skipped": skipped, "medians_us": medians,
            "ratio": ratio, "score": None if failed else ratio, "roles": roles}


PAIRED_SERIES = (("hot", "candidate"), ("hot", "baseline"), ("flushed", "candidate"), ("flushed", "baseline"))


def paired_series(record: dict, regime: str, who: str) -> list[float] | None:
    """One series of a graph-paired role's record (us per call per replay); None where it is missing or empty."""
    values = ((record.get("paired") or {}).get(regime) or {}).get(f"{who}_times_us")
    return list(values) if values else None


def paired_medians(record: dict) -> dict[str, float | None]:
    """A graph-paired case's medians by series, each taken by place in the pairs (``graph_timing.center``):
    ``<who>_<regime>`` (None where a series is missing)."""
    return {f"{who}_{regime}": graph_timing.center(paired_series(record, regime, who)) for regime, who in PAIRED_SERIES}


def judge_paired(record: dict, gates: dict) -> float | None:
    """The graph-paired timing gates from the candidate role's series (fail-closed: a missing series fails), and
    the case ratio: the smaller of the two regimes' baseline center / candidate center (None unless both exist).

    dispersion: every one of the four series' interquartile spread p75/p25, taken by place in the pairs
    (``graph_timing.place_spread``), <= DISPERSION_LIMIT (a failure lists the failing series replay by replay);
    baseline_agreement, in each regime: the baseline's centers over the first and the second half of the pairs
    within DISPERSION_LIMIT of each other, and its replays right after the candidate's (the even pairs) no slower
    than DISPERSION_LIMIT times those it ran first (the odd pairs). The place statistics would not see a candidate
    that slows the replay after its own (say, by leaving the L2 dirty) in one place alone; where anything, the first
    replay of a pair is the slower."""
    spreads = {(regime, who): graph_timing.place_spread(paired_series(record, regime, who))
               for regime, who in PAIRED_SERIES}
    # a missing or NaN spread fails ("not <=" holds for NaN)
    bad = [(regime, who) for (regime, who), value in spreads.items() if value is None or not value <= DISPERSION_LIMIT]
    gates["dispersion"] = {"status": "fail" if bad else "pass", "evidence": [
        ", ".join(f"{regime} {who} p75/p25 {kh.cell(value, '.3f')}" for (regime, who), value in spreads.items())
        + (f"; over {DISPERSION_LIMIT} or missing: {', '.join(f'{r} {w}' for r, w in bad)}" if bad else "")]
        + [f"{regime} {who} replays (us per call): " + " ".join(f"{t:.2f}" for t in values)
           for regime, who in bad if (values := paired_series(record, regime, who))]}
    lines, agree = [], True
    for regime in ("hot", "flushed"):
        series = paired_series(record, regime, "baseline")
        halves = graph_timing.halves(series)
        within = bool(halves) and min(halves) > 0 and max(halves) / min(halves) <= DISPERSION_LIMIT
        places = graph_timing.places(series or [])  # the even pairs (after the candidate's replay), the odd
        after, first = (statistics.median(p) for p in places) if len(places) == 2 else (None, None)
        unslowed = bool(after and first) and after / first <= DISPERSION_LIMIT
        agree = agree and within and unslowed
        lines.append(f"{regime} baseline halves " + (f"{halves[0]:.2f} us and {halves[1]:.2f} us" if halves
                                                     else "missing") + ("" if within else " (disagree)")
                     + f", after the candidate {kh.cell(after)} us and first in its pair {kh.cell(first)} us"
                     + ("" if unslowed else " (slowed after the candidate)"))
    gates["baseline_agreement"] = {"status": "pass" if agree else "fail", "evidence": [
        "; ".join(lines) + ("" if agree else f": not within {DISPERSION_LIMIT}x, or missing")]}
    medians = paired_medians(record)
    ratios = [medians[f"baseline_{regime}"] / medians[f"candidate_{regime}"] for regime in ("hot", "flushed")
              if medians[f"baseline_{regime}"] and medians[f"candidate_{regime}"]]
    return min(ratios) if len(ratios) == 2 else None


def summarize(cases: list[dict], gates_only: bool, task: tasks.Task | None = None) -> dict:
    """The report's verdict over judged cases: each gate's status, the skipped gates with a reason, the scores.
    Valid: no gate failed and, in a full run, none skipped but those the task declares away (``task``)."""
    names = list(dict.fromkeys(name for c in cases for name in c["gates"]))
    statuses = {}
    for name in names:
        seen = {c["gates"].get(name, {}).get("status", "not_run") for c in cases}
        statuses[name] = "fail" if seen & {"fail", "not_run"} else ("skip" if seen == {"skip"} else "pass")
    skipped = {name: next(c["gates"][name]["evidence"][0] for c in cases if name in c["gates"])
               for name, s in statuses.items() if s == "skip"}
    strata: dict[str, list] = {}
    for c in cases:
        strata.setdefault(c["case"]["stratum"], []).append(c["score"])
    per_stratum, score = stratum_scores(strata)
    score = None if gates_only else score
    passed = bool(cases) and all(s != "fail" for s in statuses.values())
    blocking = set(skipped) - set(gates.undeclared_gates(task) if task is not None else ())
    return {"gates": statuses, "skipped": skipped, "strata": per_stratum, "score": score,
            "valid": passed and (gates_only or (not blocking and score is not None))}


def judge(task: tasks.Task, solution: Path, panel: str, baseline: Path | None, gates_only: bool, schedule: str,
          log=print, jobs: int = 1, progress=None) -> dict:
    """Every case's roles, one process each, against ``baseline`` (a solution directory; None: the task's callable
    baseline). Timed roles always run one at a time; with ``gates_only`` (nothing is timed) up to ``jobs`` cases run
    at once, at most one a core. ``progress(report)``, if given, receives the report so far after each case
    (``partial``: True, never valid), so that a run stopped early leaves the cases it judged."""
    info = kh.select_device()
    cases = task.cases(panel)
    policy = policy_gate(solution)
    log(f"{info.message}\npolicy: {policy['status']}"
        + ("" if policy["status"] == "pass" else "\n    " + "\n    ".join(policy["evidence"][:10])))
    paired = task.graph_paired
    log(PAIRED_HEADER if paired else HEADER)
    head = {"task": task.name, "limit": DISPERSION_LIMIT, "solution": str(solution),
            "baseline": solution_label(task, baseline),
            "panel": str(panel), "device": info.name, **provenance(), "mode": "gates-only" if gates_only else "full",
            "schedule": schedule, "timing": task.manifest["timing"]}
    jobs = kh.usable_jobs(jobs, len(cases)) if gates_only else 1
    if gates_only:
        head["jobs"] = jobs
    judged = []
    with tempfile.TemporaryDirectory(prefix="kloop-verifier-") as scratch:
        untimed = []  # by position: two cases of a panel may share a name (same shape, other seeds)
        if gates_only:
            with ThreadPoolExecutor(jobs) as pool:
                untimed = list(pool.map(lambda c: run_role_process(task, solution, c, schedule, False, Path(scratch)),
                                        cases))
        for position, case in enumerate(cases):
            if gates_only:
                roles = {"candidate": untimed[position]}
            elif policy["status"] != "pass":  # invalid whatever it does: timing it would spend three roles for nothing
                roles = {"candidate": not_run_record(task, case, solution,
                                                     "not run: the source policy rejected the solution, so it is not "
                                                     "timed (--gates-only still runs it for evidence)")}
            elif paired:  # one role: the baseline is timed beside the candidate, in its process
                roles = {"candidate": run_role_process(task, solution, case, schedule, True, Path(scratch),
                                                       pair_with=baseline)}
            else:
                roles = {"baseline_before": run_role_process(task, baseline, case, schedule, True, Path(scratch))}
                roles["candidate"] = run_role_process(task, solution, case, schedule, True, Path(scratch))
                if roles["candidate"].get("median_us") is not None:  # an untimed (failed) candidate needs no "after"
                    roles["baseline_after"] = run_role_process(task, baseline, case, schedule, True, Path(scratch))
            judged.append(judge_case(task, case, roles, policy, gates_only))
            log(format_row(judged[-1]))
            if progress is not None and len(judged) < len(cases):
                progress({**head, "cases": list(judged), "partial": True, "valid": False,
                          "note": f"{len(judged)} of {len(cases)} cases judged; the run did not finish"})
    return {**head, "cases": judged, **summarize(judged, gates_only, task)}


def provenance() -> dict:
    """The checkout's commit and dirty flag and the library versions, so a report says what judged what."""
    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return run.stdout.strip() if run.returncode == 0 else ""

    versions = {}
    for name in ("torch", "triton"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain")),
            "python": sys.version.split()[0], "versions": versions}


HEADER = f"{'case':<26} {'stratum':<12} {'before_us':>10} {'cand_us':>10} {'after_us':>10} {'score':>7}  gates"
PAIRED_HEADER = (f"{'case':<26} {'stratum':<12} {'cand_hot':>9} {'base_hot':>9} {'hot_x':>7} {'cand_fl':>9} "
                 f"{'base_fl':>9} {'flush_x':>7} {'score':>7}  gates")


def format_row(c: dict) -> str:
    num = kh.cell

    m = c["medians_us"]
    verdict = "ok" if not c["failed"] else "FAIL " + ", ".join(c["failed"])
    if "candidate_hot" in m:  # graph-paired: each regime's centers (graph_timing.center) and ratio
        def ratio(regime: str) -> float | None:
            base, cand = m.get(f"baseline_{regime}"), m.get(f"candidate_{regime}")
            return base / cand if base and cand else None

        line = (f"{c['case']['name']:<26} {c['case']['stratum']:<12} {num(m['candidate_hot']):>9} "
                f"{num(m.get('baseline_hot')):>9} {num(ratio('hot'), '.3f'):>7} {num(m.get('candidate_flushed')):>9} "
                f"{num(m.get('baseline_flushed')):>9} {num(ratio('flushed'), '.3f'):>7} {num(c['score'], '.3f'):>7}  "
                f"{verdict}")
    else:
        line = (f"{c['case']['name']:<26} {c['case']['stratum']:<12} {num(m.get('baseline_before')):>10} "
                f"{num(m.get('candidate')):>10} {num(m.get('baseline_after')):>10} {num(c['score'], '.3f'):>7}  "
                f"{verdict}")
    for name in c["failed"]:
        evidence = c["gates"][name]["evidence"]
        line += f"\n    {name}: {str(evidence[0])[:400] if evidence else ''}"
        if name == "dispersion":  # each failing role's groups (each failing series' replays) in order
            line += "".join(f"\n      {str(more)[:400]}" for more in evidence[1:])
    return line


def print_summary(report: dict) -> None:
    for name, reason in report["skipped"].items():
        print(f"skipped {name}: {reason}")
    failed = [name for name, status in report["gates"].items() if status == "fail"]
    print("gates: " + ("all passed" if not failed else "FAILED " + ", ".join(failed)))
    if report["mode"] == "full":
        strata = ", ".join(f"{name} {kh.cell(v, '.3f')}" for name, v in report["strata"].items())
        print(f"score by stratum (geomean): {strata}; score (harmonic mean): "
              f"{kh.cell(report['score'], '.3f')}")
    if report.get("timing") == graph_timing.PROTOCOL:
        print("timing: graph-paired (CUDA-graph replay, the candidate paired with the baseline in one process; a "
              "case's score is the smaller of its hot and flushed ratios)")
    if report["schedule"] not in ("spec", "smoke"):
        pin = gates.SCHEDULES[report["schedule"]].pin
        print(f"schedule: {report['schedule']} (pinning: {gates.PIN_MODES[pin]}): "
              "a measurement, not the verdict of record")
    print("verdict: " + ("valid" if report["valid"] else "NOT valid"))


# ----------------------------------------------------------------------------------------------------- sealed panels
def make_panel(seed: int, per_stratum: int = PER_STRATUM, task: tasks.Task | None = None) -> dict:
    """A sealed panel of the task (default: the default task), drawn by its adapter's ``make_panel`` from the seed
    alone: ``per_stratum`` cases in each of the manifest's strata, disjoint from the visible panel's cases."""
    task = task or tasks.load()
    return task.adapter.make_panel(seed, per_stratum, task.strata, task.cases("visible"))


def protected_dirs(task: tasks.Task) -> list[Path]:
    """The folders no sealed panel may be written under: PROTECTED_DIRS and the task's readable, main and versions
    folders (a path in the repository by its top folder there; one outside it as it is)."""
    own = [Path(path) for path in (*task.manifest.get("readable", []), task.manifest["main"],
                                   task.manifest["versions"]) if path]
    dirs = [ROOT / name for name in PROTECTED_DIRS]
    dirs += [path if path.is_absolute() else ROOT / path.parts[0] for path in own]
    return list(dict.fromkeys(path.resolve() for path in dirs))


def make_panel_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m evals.verifier make-panel",
                                     description=make_panel.__doc__.split("\n")[0])
    tasks.add_argument(parser)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", type=Path, help=f"default {PANEL_HOME}/sealed-<seed>.json (outside the repository)")
    parser.add_argument("--per-stratum", type=int, default=PER_STRATUM)
    args = parser.parse_args(argv)
    try:
        task = tasks.load(args.task)
    except tasks.TaskError as exc:
        print(f"make-panel: {exc}", file=sys.stderr)
        return 2
    out = (args.out or PANEL_HOME / f"sealed-{args.seed}.json").expanduser().resolve()
    protected = protected_dirs(task)
    if any(out.is_relative_to(path) for path in protected):
        names = [str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path) for path in protected]
        print(f"make-panel: refusing to write {out}: the agent reads {', '.join(names)}/; "
              f"write outside the repository (default {PANEL_HOME})", file=sys.stderr)
        return 2
    fewest, why = getattr(task.adapter, "PER_STRATUM_MIN", (1, "one case"))
    if args.per_stratum < fewest:
        parser.error(f"--per-stratum must be at least {fewest} ({why})")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(make_panel(args.seed, args.per_stratum, task), indent=2) + "\n")
    print(f"sealed panel: {out}")
    return 0


# ----------------------------------------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["role"]:
        return role_main(argv[1:])
    if argv[:1] == ["make-panel"]:
        return make_panel_main(argv[1:])
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m evals.verifier", description=__doc__.split("\n")[0])
    tasks.add_argument(parser)
    parser.add_argument("--solution", help="solution directory (default: the task's main)")
    parser.add_argument("--panel", help="a panel JSON file, visible or smoke (default: visible on CUDA, else smoke)")
    parser.add_argument("--baseline", help="the yardstick, a solution directory (default: the task's baseline, its "
                                           "manifest's version or, where it names a callable, the adapter's)")
    parser.add_argument("--json", type=Path, help="write the full report here (after each case while it runs)")
    parser.add_argument("--gates-only", action="store_true", help="every hard gate but the timing ones, quickly")
    parser.add_argument("--jobs", type=int, default=1,
                        help="with --gates-only: cases checked at once, each in its own process, at most one a "
                             "core (default 1)")
    parser.add_argument("--schedule", choices=tuple(gates.SCHEDULES), default="spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        task = tasks.load(args.task)
        args.panel = args.panel or kh.default_panel()
        solution = resolve_solution_dir(args.solution or task.main_dir)
        baseline = args.baseline or task.baseline_dir  # None: the task's callable baseline
        baseline = resolve_solution_dir(baseline) if baseline is not None else None
        task.cases(args.panel)
    except (FileNotFoundError, ValueError, kh.SetupError) as exc:  # the user's paths, not the candidate's failure
        print(f"verifier: {exc}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print(f"verifier: --jobs must be at least 1; got {args.jobs}", file=sys.stderr)
        return 2
    def write(report: dict) -> None:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            partial = args.json.with_name(args.json.name + ".partial")
            partial.write_text(json.dumps(report, indent=2, default=str) + "\n")
            partial.replace(args.json)  # whole files only: a run killed while writing keeps the previous one

    report = judge(task, solution, args.panel, baseline, args.gates_only, args.schedule,
                   log=lambda line: print(line, flush=True), jobs=args.jobs, progress=write)
    print_summary(report)
    write(report)
    return 0 if report["valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
