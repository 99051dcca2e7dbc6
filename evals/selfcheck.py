"""The visible evaluator: correctness (every input regime of the task), median latency, GB/s and speedup over the
task's baseline.

    .venv/bin/python -m evals.selfcheck [--task NAME|DIR] [--solution DIR] [--panel visible|smoke|FILE] [--baseline DIR]
                                        [--json OUT]
    .venv/bin/python -m evals.selfcheck [--task NAME|DIR] --list-cases [--panel visible|smoke|FILE]

Never raises for a bad candidate: a failure at any stage becomes the case's ``error`` field (stage, name, message).
The timing follows the task's protocol (its manifest's ``timing``):

- eager-groups: the candidate and the baseline timed in alternating groups of calls. On CUDA each case also records
  its host cost and GPU time per call and whether the GPU time clears the host cost by the calibrated ratio
  (evals/stability.py), the GPU time with as many distinct inputs as the verifier's pool: a host-bound case fails the
  verifier's dispersion gate on noisy hosts, so the loop keeps a candidate with one only when the timing under the
  verifier's own schedule (evals/qualify.py) holds it (agent/stability.py).
- graph-paired: ``evals.graph_timing.paired(candidate, baseline)``, CUDA-graph replay in pairs, hot and L2-flushed.
  ``median_us``, ``baseline_median_us`` (centers by place) and ``times_us`` are the hot regime's (the candidate's
  per-replay us per call), ``speedup`` the smaller of the hot and the flushed ratio, ``hot`` and ``flushed`` each
  regime's record (centers by place in the pairs, ratio, spreads by place, the series: evals/graph_timing.py),
  ``spread`` the larger of the candidate's two spreads minus 1 (the noise agent/evaluate.py's compare weighs), GB/s and
  %copy the flushed center's (the hot replays read the weight from the L2). The inputs are drawn afresh before every
  pair, and the candidate's graph outputs are set to NaN before and kept after every pair, then checked against the
  oracle in batches, all before the timing returns (``checks["graph_outputs"]``). Graph replay keeps the host out of the
  timed region, so no host-bound probe runs: ``stable`` is True and says why.
  Without CUDA there are no graphs: the pairs run eagerly with the same record (interpreter wall times).

Each case records the wall seconds of the phases it reached (``phase_s``: ``correctness`` in every regime, ``timing``,
``after_timing``, for eager-groups ``host_probe``; for graph-paired, of ``timing``, the input refills and the
outputs' checks, the host's time in them: ``timing_refills``, ``timing_output_checks``) and the report the seconds
before the first case (``setup_s``: the device, the copy bandwidth, loading the solution) and over the cases
(``cases_s``), both left out when the solution does not load: where an evaluation's time goes.

Exit status 0 only when every case is correct. Without CUDA it runs CPU tensors under the Triton interpreter and
says that its timings are not GPU timings.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from evals import graph_timing, stability
from evals import kernel_harness as kh
from evals import task as tasks
from evals.loader import load_solution, resolve_solution_dir
# what candidate code may raise that must become a record: SystemExit too (exit(0) must not end the evaluator
# with status 0); KeyboardInterrupt stays a person's Ctrl-C
CANDIDATE_ERRORS = (Exception, SystemExit, GeneratorExit)


CHECK_BATCH = 64  # graph outputs kept, then checked at once (why: reports/examples/llgemm-seed002/README.md)


@dataclass
class TimingPlan:
    groups: int
    calls_per_group: int
    warmup: int
    distinct_inputs: int

    @classmethod
    def for_device(cls, interpreted: bool) -> "TimingPlan":
        return cls(3, 1, 1, 2) if interpreted else cls(11, 256, 256, 16)


@dataclass
class CaseResult:
    case: dict
    correct: bool = False
    checks: dict = field(default_factory=dict)
    error: dict | None = None
    bytes: int = 0
    median_us: float | None = None
    times_us: list[float] = field(default_factory=list)
    gbps: float | None = None
    roofline_fraction: float | None = None
    baseline_median_us: float | None = None
    speedup: float | None = None
    # measurable speed (evals/stability.py): host cost and GPU time per call, and the calibrated rule's verdict
    host_us: float | None = None
    gpu_us: float | None = None
    device_ratio: float | None = None
    stable: bool | None = None
    stable_note: str = "not measured"
    # graph-paired only (a report of another protocol leaves them out): each regime's record and the candidate's noise
    hot: dict | None = None
    flushed: dict | None = None
    spread: float | None = None
    phase_s: dict = field(default_factory=dict)  # wall seconds of each phase the case reached


GRAPH_FIELDS = ("hot", "flushed", "spread")
PAIR_SEED = 100  # graph-paired: pair p's call inputs are the seeded draw PAIR_SEED + p
UNMEASURED = "not measured: no CUDA (interpreter)"


def graph_plan(device) -> graph_timing.Plan:
    """The graph-paired counts: the protocol's on CUDA, the smoke counts under the interpreter."""
    return graph_timing.FULL if device.type == "cuda" else graph_timing.SMOKE


def case_record(result: "CaseResult", task: tasks.Task) -> dict:
    """A case as the report holds it; the graph-paired fields only in a graph-paired task's report."""
    record = asdict(result)
    if not task.graph_paired:
        for name in GRAPH_FIELDS:
            del record[name]
    return record


def error_record(stage: str, exc: BaseException) -> dict:
    return {"stage": stage, "name": type(exc).__name__, "message": str(exc)[:2000],
            "traceback": "".join(traceback.format_exception(exc))[-4000:]}


def error_line(exc: BaseException, limit: int = 200) -> str:
    """``Name: first line of the message`` (clipped): an error in one table cell."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0][:limit] if lines else ''}"


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def stratum_scores(values: dict[str, list[float | None]]) -> tuple[dict[str, float | None], float | None]:
    """Geometric mean of the case ratios per stratum (None where a case has none); harmonic mean across strata."""
    per_stratum = {name: (geomean(v) if v and None not in v else None) for name, v in values.items()}
    score = (len(per_stratum) / sum(1 / v for v in per_stratum.values())
             if per_stratum and None not in per_stratum.values() else None)
    return per_stratum, score


def summarize(results: list[CaseResult]) -> dict:
    """Speedups by stratum and the score (None unless every case is correct)."""
    strata: dict[str, list[float | None]] = {}
    for result in results:
        strata.setdefault(result.case["stratum"], []).append(result.speedup if result.correct else None)
    per_stratum, score = stratum_scores(strata)
    correct = all(r.correct for r in results)
    return {"strata": per_stratum, "score": score if correct else None, "all_correct": correct,
            "stability": stability_summary(results)}


def stability_summary(results: list[CaseResult]) -> dict:
    """Whether every case's timing is measurable by the calibrated rule; ``stable`` None where nothing was measured."""
    measured = [r for r in results if r.stable is not None]
    unstable = [r for r in measured if not r.stable]
    if not measured:
        note = "not measured: " + ("no CUDA (interpreter)" if results and all(
            r.stable_note.startswith("not measured: no CUDA") for r in results) else "no case was timed")
    elif unstable:
        note = "; ".join(f"{r.case['name']}: {r.stable_note}" for r in unstable)
    elif all(r.stable_note == graph_timing.GRAPH_NOTE for r in measured):
        note = graph_timing.GRAPH_NOTE
    else:
        note = f"every case's GPU time is at least {stability.STABLE_RATIO:.2f}x its host cost"
    return {"measured": bool(measured), "ratio_min": stability.STABLE_RATIO, "limit": stability.DISPERSION_LIMIT,
            "stable": (not unstable) if measured else None,
            "unstable_cases": [r.case["name"] for r in unstable], "note": note}


def phase(result: CaseResult, name: str, began: float) -> float:
    """Record the wall seconds since ``began`` as the case's phase ``name``; the time it ended."""
    now = time.perf_counter()
    result.phase_s[name] = round(now - began, 6)
    return now


def check_mode(task: tasks.Task, module, case, mode: str, device, config: dict | None = None) -> tuple[dict, object]:
    """Build on ``mode`` inputs (with ``config`` overrides, for solutions that take them), one call, the oracle's
    verdict; the callable comes back for normal inputs."""
    problem = task.adapter.generate(case, mode, device)
    extra = {"config": config} if config is not None else {}
    fn = task.build(module, problem.weights, **extra)
    out = fn(*problem.inputs)
    kh.synchronize(device)
    ref = task.adapter.reference(problem.weights, problem.inputs, case)
    return task.adapter.check_output(out, ref, case).to_dict(), (fn if mode == "normal" else None)


def evaluate_case(task: tasks.Task, module, baseline, case, device, plan: TimingPlan,
                  copy_gbps: float | None) -> CaseResult:
    """One case: correctness in every regime, then the candidate and ``baseline`` (``(weights, case) -> callable``)
    timed in alternating groups, the check after timing and, on CUDA, the host-bound probe; for a graph-paired task
    the two timed by ``time_paired`` instead, and no probe."""
    if task.graph_paired:
        return evaluate_paired(task, module, baseline, case, device, copy_gbps)
    adapter = task.adapter
    result = CaseResult(case=kh.case_dict(case), bytes=adapter.bytes_moved(case))
    stage = "correctness"
    try:
        fn, began = None, time.perf_counter()
        for mode in adapter.MODES:
            stage = f"correctness ({mode})"
            result.checks[mode], built = check_mode(task, module, case, mode, device)
            fn = built or fn
        result.correct = all(check["ok"] for check in result.checks.values())
        began = phase(result, "correctness", began)
        if not result.correct:
            return result
        stage = "timing"
        weights = adapter.generate(case, "normal", device).weights
        base_fn = baseline(weights, case)
        inputs = adapter.make_inputs(case, plan.distinct_inputs, seed=1, device=device)
        cand_times, base_times = [], []
        for _ in range(plan.groups):  # alternate groups so that drift hits both alike
            cand_times += kh.time_groups(fn, inputs, 1, plan.calls_per_group, plan.warmup if not cand_times else 0)
            base_times += kh.time_groups(base_fn, inputs, 1, plan.calls_per_group, plan.warmup if not base_times else 0)
        began = phase(result, "timing", began)
        stage = "correctness (after timing)"  # a solution honest only for its first calls fails here
        after = adapter.make_inputs(case, 1, seed=9, device=device)[0]
        ref = adapter.reference(weights, after, case)
        result.checks["after_timing"] = adapter.check_output(fn(*after), ref, case).to_dict()
        result.correct = result.checks["after_timing"]["ok"]
        began = phase(result, "after_timing", began)
        stage = "host cost and GPU time"
        if device.type == "cuda":  # as many distinct inputs as the verifier's pool (off CUDA nothing is probed)
            inputs = adapter.make_inputs(case, stability.PROBE_POOL, seed=2, device=device)
        found = stability.probe(fn, inputs, device)
        del inputs
        phase(result, "host_probe", began)
        result.host_us, result.gpu_us, result.device_ratio = found["host_us"], found["gpu_us"], found["ratio"]
        result.stable, result.stable_note = stability.verdict(found["host_us"], found["gpu_us"],
                                                              unmeasured=found["note"])
        result.times_us = cand_times
        result.median_us = kh.median(cand_times)
        result.baseline_median_us = kh.median(base_times)
        result.speedup = result.baseline_median_us / result.median_us
        result.gbps = result.bytes / result.median_us / 1e3
        if copy_gbps:
            result.roofline_fraction = result.gbps / copy_gbps
    except CANDIDATE_ERRORS as exc:  # a bad candidate is a result, never a crash of the evaluator
        result.correct = False
        result.error = error_record(stage, exc)
    return result


def evaluate_paired(task: tasks.Task, module, baseline, case, device, copy_gbps: float | None) -> CaseResult:
    """``evaluate_case`` for a graph-paired task: correctness in every regime, the candidate paired with ``baseline``
    (``time_paired``), the check after timing."""
    adapter = task.adapter
    result = CaseResult(case=kh.case_dict(case), bytes=adapter.bytes_moved(case))
    stage = "correctness"
    try:
        fn, began = None, time.perf_counter()
        for mode in adapter.MODES:
            stage = f"correctness ({mode})"
            result.checks[mode], built = check_mode(task, module, case, mode, device)
            fn = built or fn
        result.correct = all(check["ok"] for check in result.checks.values())
        began = phase(result, "correctness", began)
        if not result.correct:
            return result
        stage = "timing (graph-paired)"
        weights = adapter.generate(case, "normal", device).weights
        found, result.checks["graph_outputs"] = time_paired(task, fn, baseline(weights, case), case, weights, device,
                                                            spent=result.phase_s)
        began = phase(result, "timing", began)
        stage = "correctness (after timing)"  # a solution honest only for its first calls fails here
        after = adapter.make_inputs(case, 1, seed=9, device=device)[0]
        ref = adapter.reference(weights, after, case)
        result.checks["after_timing"] = adapter.check_output(fn(*after), ref, case).to_dict()
        phase(result, "after_timing", began)
        result.correct = result.checks["after_timing"]["ok"] and result.checks["graph_outputs"]["ok"]
        hot, flushed = found["hot"], found["flushed"]
        result.hot, result.flushed = hot, flushed
        result.times_us = hot["candidate_times_us"]
        result.median_us, result.baseline_median_us = hot["candidate_us"], hot["baseline_us"]
        result.speedup = found["speedup"]
        spreads = (hot["candidate_spread"], flushed["candidate_spread"])
        result.spread = None if None in spreads else max(spreads) - 1
        result.gbps = result.bytes / flushed["candidate_us"] / 1e3  # from HBM: the hot replays may read the L2
        if copy_gbps:
            result.roofline_fraction = result.gbps / copy_gbps
        result.stable, result.stable_note = (True, graph_timing.GRAPH_NOTE) if found["graphs"] else (None, UNMEASURED)
    except CANDIDATE_ERRORS as exc:  # a bad candidate is a result, never a crash of the evaluator
        result.correct = False
        result.error = error_record(stage, exc)
    return result


def time_paired(task: tasks.Task, fn, base_fn, case, weights: dict, device,
                spent: dict | None = None) -> tuple[dict, dict]:
    """The candidate ``fn`` paired with ``base_fn`` (``graph_timing.paired``) on ``graph_plan``'s count of static
    call inputs, rewritten in place before pair p with the seeded draw PAIR_SEED + p; the candidate's outputs, where
    ``paired`` hands them over, kept and checked against the oracle (on that draw) in batches of CHECK_BATCH, all of
    them before it returns. Returns (paired's record, the check's record: the first failing output's, else a passing
    one). ``spent``, where given, gets the host's wall seconds in the refills (``timing_refills``) and in the outputs'
    copies and checks (``timing_output_checks``), both outside the timed replays; on CUDA the refills' kernels run
    asynchronously (their GPU time falls in the next wait) and the checks' time includes waiting for the oracle."""
    adapter = task.adapter
    spent = {} if spent is None else spent
    spent["timing_refills"] = spent["timing_output_checks"] = 0.0
    plan = graph_plan(device)
    static = adapter.make_inputs(case, plan.hot_calls, seed=1, device=device)
    drawn: list[tuple] = []

    def refill(pair: int) -> None:
        began = time.perf_counter()
        drawn[:] = adapter.make_inputs(case, len(static), seed=PAIR_SEED + pair, device=device)
        for inputs, values in zip(static, drawn):
            for target, value in zip(inputs, values, strict=True):
                if isinstance(target, torch.Tensor):
                    target.copy_(value)
        spent["timing_refills"] += time.perf_counter() - began

    checked, failures = [], []
    shape, dtype = tuple(adapter.output_shape(case)), adapter.OUTPUT_DTYPE
    # (regime, pair, output index, the kept output, its inputs, its result where already judged), in pair order
    pending: list[tuple] = []

    def settle() -> None:
        """Judge the pending outputs, CHECK_BATCH at a time (one oracle pass and one comparison a batch where the
        adapter has batched forms: the host's cost of a check is mostly per call, not per output)."""
        began = time.perf_counter()
        for start in range(0, len(pending), CHECK_BATCH):
            batch = pending[start:start + CHECK_BATCH]
            open_ = [p for p in batch if p[5] is None]
            found = iter(task.check_outputs([p[3] for p in open_],
                                            task.references(weights, [p[4] for p in open_], case), case))
            for regime, pair, j, _, _, result in batch:
                result = next(found) if result is None else result
                checked.append(result)
                if not result.ok:
                    failures.append(result.to_dict() | {"message": f"{regime} graph output {j} after pair {pair}: "
                                                                   f"{result.message}"})
        pending.clear()
        spent["timing_output_checks"] += time.perf_counter() - began

    def check(name: str, regime: str, pair: int, outputs: list) -> None:
        if name != "candidate":
            return
        began = time.perf_counter()
        for j, out in enumerate(outputs):
            inputs = drawn[j % len(drawn)]
            if kh.structure_problem(out, shape, dtype, device) is None:
                # the graph rewrites its outputs in the next pair: a copy (of the same structure) is judged later
                pending.append((regime, pair, j, out.clone(), inputs, None))
            else:  # judged now, while it is the object the pair returned
                (ref,) = task.references(weights, [inputs], case)
                pending.append((regime, pair, j, None, inputs, adapter.check_output(out, ref, case)))
        spent["timing_output_checks"] += time.perf_counter() - began
        # never inside the hot regime: the oracle's pass over W would leave the L2 colder for the next pair's first
        # callable, the candidate after every even pair; each flushed replay follows a flush of the L2 anyway
        if regime != "hot" and len(pending) >= CHECK_BATCH:
            settle()

    try:
        found = graph_timing.paired(fn, base_fn, static, refill, check, names=("candidate", "baseline"), plan=plan)
        if pending:
            settle()
    finally:
        for name in ("timing_refills", "timing_output_checks"):
            spent[name] = round(spent[name], 6)
    verdict = failures[0] if failures else {
        "ok": True, "message": f"{len(checked)} graph outputs of fresh draws within the bound", "bad_elements": 0,
        "worst_excess": max((c.worst_excess for c in checked), default=0.0)}
    return found, verdict


def run(solution: Path, panel: str, baseline_dir: Path | None = None, log=print, enforce_policy: bool = True,
        task: tasks.Task | None = None, progress=lambda name: None) -> dict:
    """The selfcheck report of ``solution`` on the task's panel, against ``baseline_dir`` (default: the task's
    baseline, a version or a callable). ``enforce_policy`` False (never from the command line) lets a test drive a
    candidate that the source policy would stop into the timed path, to see how the evaluator survives it.
    ``progress(name)`` is told each case before it runs (the command line says it on stderr, so that a crash's last
    words name its case)."""
    task = task or tasks.load()
    began = time.perf_counter()
    info = kh.select_device()  # before any solution imports triton
    log(info.message)

    cases = task.cases(panel)
    plan = TimingPlan.for_device(info.interpreted)
    baseline, label = tasks.baseline_builder(task, baseline_dir)
    timing, note = asdict(plan), ("interpreter wall time, not GPU timing" if info.interpreted
                                  else "CUDA events, median of groups")
    if task.graph_paired:
        timing = {"protocol": graph_timing.PROTOCOL, "graphs": not info.interpreted, **asdict(graph_plan(info.device))}
        note = (graph_timing.EAGER_NOTE if info.interpreted else "CUDA-graph replay, the candidate paired with the "
                "baseline, hot and L2-flushed: medians of the hot replays; speedup = min(hot ratio, flushed ratio)")
    report = {"task": task.name, "solution": str(solution), "baseline": label, "panel": str(panel),
              "device": info.name,
              "interpreted": info.interpreted, "timing": timing,
              "timing_note": note,
              "copy_gbps": kh.copy_bandwidth_gbps(info.device), "cases": []}
    try:
        module = load_solution(solution, enforce_policy=enforce_policy, entry=task.entry)
    except CANDIDATE_ERRORS as exc:
        failure = error_record("load", exc)
        log(f"{solution} did not load, so no case ran: {failure['name']}: {failure['message']}")
        results = [CaseResult(case=kh.case_dict(case), bytes=task.adapter.bytes_moved(case), error=failure)
                   for case in cases]
    else:
        results = []
        log(header(task.adapter.MODES, task.graph_paired))
        first = time.perf_counter()
        report["setup_s"] = round(first - began, 6)
        for case in cases:
            progress(case.name)
            results.append(evaluate_case(task, module, baseline, case, info.device, plan, report["copy_gbps"]))
            log(format_row(results[-1], task.adapter.MODES, task.graph_paired))
        report["cases_s"] = round(time.perf_counter() - first, 6)
    report["cases"] = [case_record(r, task) for r in results]
    report.update(summarize(results))
    return report


def header(modes: tuple[str, ...], paired: bool = False) -> str:
    """The table's header: a column per input regime of the task (its first six letters); a graph-paired task's table
    has each regime's ratio and the candidate's spread where the host-bound probe's host and GPU times stand."""
    return (f"{'case':<26} {'stratum':<12} " + "".join(f"{mode[:6]:>7} " for mode in modes)
            + f"{'median_us':>10} {'GB/s':>8} {'%copy':>6} {'base_us':>9} {'speedup':>8} "
            + (f"{'hot_x':>8} {'flush_x':>8} {'spread':>6} " if paired else f"{'host_us':>8} {'gpu_us':>8} ")
            + f"{'stable':>6}")


def format_row(r: CaseResult, modes: tuple[str, ...], paired: bool = False) -> str:
    def ok(mode: str) -> str:
        check = r.checks.get(mode)
        return "-" if check is None else ("ok" if check["ok"] else "FAIL")

    num = kh.cell

    if paired:  # each regime's ratio and the candidate's spread
        middle = (f"{num((r.hot or {}).get('ratio'), '.3f'):>8} {num((r.flushed or {}).get('ratio'), '.3f'):>8} "
                  f"{num(r.spread, '.3f'):>6} ")
    else:
        middle = f"{num(r.host_us, '.2f'):>8} {num(r.gpu_us, '.2f'):>8} "
    line = (f"{r.case['name']:<26} {r.case['stratum']:<12} " + "".join(f"{ok(mode):>7} " for mode in modes)
            + f"{num(r.median_us, '.2f'):>10} {num(r.gbps, '.1f'):>8} "
            f"{num(r.roofline_fraction and 100 * r.roofline_fraction, '.1f'):>6} "
            f"{num(r.baseline_median_us, '.2f'):>9} {num(r.speedup, '.3f'):>8} " + middle
            + f"{'-' if r.stable is None else ('yes' if r.stable else 'NO'):>6}")
    if r.stable is False:
        line += f"\n    unstable: {r.stable_note}"
    if r.error:
        line += (f"\n    error in {r.error['stage']}: {r.error['name']}: "
                 f"{r.error['message'].splitlines()[0] if r.error['message'] else ''}")
    for mode, check in r.checks.items():
        if not check["ok"]:
            line += f"\n    {mode}: {check['message']}"
    return line


def print_summary(report: dict) -> None:
    strata = ", ".join(f"{name} {kh.cell(v, '.3f')}" for name, v in report["strata"].items())
    score = kh.cell(report["score"], ".3f")
    bw = "" if report["copy_gbps"] is None else f"; copy bandwidth {report['copy_gbps']:.0f} GB/s"
    print(f"speedup over the baseline by stratum (geomean): {strata}; score (harmonic mean): {score}{bw}")
    stable = report.get("stability") or {}
    if report["timing"].get("protocol") == graph_timing.PROTOCOL:
        if stable.get("measured"):  # off CUDA the note below says how it timed
            print(f"timing: graph-paired, {report['timing_note']}; stability: {stable['note']}")
    elif stable.get("measured"):
        print(f"stability (GPU time >= {stable['ratio_min']:.2f}x host cost per call): "
              + ("every case" if stable["stable"] else "NOT " + ", ".join(stable["unstable_cases"])))
    if report["interpreted"]:
        print("note: " + report["timing_note"])


def main(argv: list[str] | None = None, enforce_policy: bool = True) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m evals.selfcheck", description=__doc__.split("\n")[0])
    tasks.add_argument(parser)
    parser.add_argument("--solution", help="solution directory (default: the task's main)")
    parser.add_argument("--panel", help="visible, smoke or a panel JSON file (default: visible with CUDA, else smoke)")
    parser.add_argument("--list-cases", action="store_true",
                        help="print the panel's cases and exit (exit 2 when it is not a panel)")
    parser.add_argument("--baseline", help="the yardstick solution (default: the task's baseline)")
    parser.add_argument("--json", help="write the full report here")
    args = parser.parse_args(argv)
    panel = args.panel or kh.default_panel()
    try:
        task = tasks.load(args.task)
        if args.list_cases:
            for case in task.cases(panel):
                print(f"{case.name} {case.stratum} seed {case.seed}")
            return 0
        solution = Path(args.solution) if args.solution else task.main_dir
        resolve_solution_dir(solution)
        report = run(solution, panel, Path(args.baseline) if args.baseline else None,
                     log=lambda line: print(line, flush=True), enforce_policy=enforce_policy, task=task,
                     progress=lambda name: print(f"checking {name}", file=sys.stderr, flush=True))
    except (FileNotFoundError, ValueError, kh.SetupError) as exc:  # the user's paths or machine, not the candidate
        print(f"selfcheck: {exc}", file=sys.stderr)
        return 2
    print_summary(report)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if report["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
