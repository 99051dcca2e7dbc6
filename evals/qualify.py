"""Stability qualification: will the verifier's dispersion gate pass a plan, and on what margin?

    .venv/bin/python -m evals.qualify [--task NAME|DIR] --solution DIR [--panel visible|FILE] [--grid FILE]
                                      [--repeats 3] [--schedules spec,spec-unpinned,spec-thread-pinned] [--json OUT]
    .venv/bin/python -m evals.qualify [--task NAME|DIR] --synthetic 5,10,15,20,25,30,40 [--repeats 2]
                                      [--schedules ...] [--json OUT]
    .venv/bin/python -m evals.qualify --curve A.json [B.json ...]

Per plan (each override dict of ``--grid``, ``{}`` being the solution's own plan, passed to the task's entry point as
``config=``) and case of the task's panel (its adapter's weights and inputs): the host cost and the
GPU time per call (evals/stability.py's probe) and their ratio, then the candidate role's 11 timed group times under
the verifier's exact schedule (evals/gates.run_schedule: reset, 16,384 primed outputs released, the heater, 8,192
untimed calls, 11 groups of 512 with the pool rewritten before each and every timed output held until the groups
end), ``--repeats`` times under each pinning schedule
(``spec`` pins the process to one core as the verifier does; ``spec-unpinned``; ``spec-thread-pinned``). A vector's
max/min over 1.15 is what fails a verifier case. One child process per schedule times every case and plan in turn,
one schedule after another (candidate code never runs in this process), where the verifier starts a fresh process per
role and case and runs the gates first; the gates (correctness, residency) are the verifier's and are not repeated
here. Without CUDA the schedule runs under the interpreter and nothing is qualified (exit 1). ``--synthetic``
qualifies a callable with a known GPU time instead: ``torch.empty`` of one of the task's outputs (as make bench's host
floors allocate: the adapter's FLOOR_OUTPUT_SHAPE) and one kernel spinning T microseconds, the calibration's
controlled points.

``--curve`` reads qualification JSONs and prints the worst max/min by GPU/host ratio, and the calibrated threshold:
the smallest ratio at and above which every vector stayed within 1.10 (a margin under the gate). evals/stability.py's
STABLE_RATIO comes from that. Exit status: 0 when every vector is within the verifier's dispersion limit (1.15,
evals/stability.py's DISPERSION_LIMIT), 1 when one is not, 2 on bad usage (a task timed by another protocol than
eager-groups, such as graph-paired, included: it declares no qualify stage).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from evals import kernel_harness as kh
from evals import task as tasks
from evals.stability import DISPERSION_LIMIT as LIMIT  # a role's max/min over it fails a verifier case

MARGIN = 1.10  # what calibration asks of every vector above its threshold
SCHEDULES = ("spec", "spec-unpinned", "spec-thread-pinned")
CHILD_TIMEOUT_S = 1800
RATIO_BINS = (0.0, 0.8, 1.0, 1.1, 1.2, 1.3, 1.5, 2.0, 3.0, float("inf"))


# ----------------------------------------------------------------------------------------------------- the child
def child_main(argv: list[str]) -> int:
    """One schedule: every (case, overrides) pair timed in turn; a JSON line per pair appended to ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m evals.qualify child")
    parser.add_argument("--task", required=True)
    parser.add_argument("--solution")
    parser.add_argument("--synthetic", help="comma-separated spin microseconds")
    parser.add_argument("--panel")
    parser.add_argument("--grid", default="[{}]")
    parser.add_argument("--schedule", required=True)
    parser.add_argument("--repeats", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    from evals import gate_spies, gates

    gate_spies.die_with_parent(os.environ.get("KLOOP_QUALIFY_PID"))
    schedule = gates.SCHEDULES[args.schedule]
    info = kh.select_device()  # before the candidate imports triton
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    pinned = gate_spies.pin_to_one_core() if schedule.pin == "process" and info.device.type == "cuda" else None
    out = open(args.out, "a")  # opened before candidate code exists in this process

    def emit(row: dict) -> None:
        out.write(json.dumps({**row, "schedule": args.schedule, "pinned_core": pinned}) + "\n")
        out.flush()

    task = tasks.load(args.task)
    if args.synthetic:
        for spin_us in (float(v) for v in args.synthetic.split(",")):
            emit(time_synthetic(task, spin_us, schedule, info.device, args.repeats, cores))
    else:
        time_solution(task, Path(args.solution), args.panel, json.loads(args.grid), schedule, info.device,
                      args.repeats, cores, emit)
    out.close()
    return 0


def time_solution(task: tasks.Task, solution: Path, panel: str, grid: list[dict], schedule, device, repeats: int,
                  cores, emit) -> None:
    import torch

    from evals import gates, stability
    from evals.loader import load_solution
    from evals.selfcheck import CANDIDATE_ERRORS, error_line

    adapter = task.adapter
    module = load_solution(solution, entry=task.entry)
    for case in task.cases(panel):
        weights = adapter.generate(case, "normal", device).weights
        pool = adapter.make_inputs(case, max(schedule.input_pool, schedule.calls_per_group), seed=gates.POOL_SEED,
                                   device=device)

        refill = refiller(task, case, pool, device)
        for overrides in grid:
            row = {"case": case.name, "stratum": case.stratum, "overrides": overrides, "vectors": []}
            try:
                extra = {"config": overrides} if overrides else {}
                fn = task.build(module, weights, **extra)
                row.update(stability.probe(fn, pool, device))
                for repeat in range(repeats):
                    kept: list = []  # every timed output held to the end of its groups, as the verifier's roles do
                    times = gates.run_schedule(fn, pool, schedule, device, refill, keep=kept, cores=cores)
                    del kept
                    row["vectors"].append({"repeat": repeat, "times_us": times, "max_min": max(times) / min(times)})
                del fn
            except CANDIDATE_ERRORS as exc:  # the pair failed to build or run: a row with its error
                row["error"] = error_line(exc)
            emit(row)
        del weights, pool
        if device.type == "cuda":
            torch.cuda.empty_cache()


def refiller(task: tasks.Task, case, pool: list[tuple], device):
    """``refill(group)``: the verifier's seeded draw for that group written into the pool in place (every tensor of
    every call's inputs)."""
    from evals import gates

    def refill(group: int) -> None:
        fresh = gates.group_inputs(task, case, len(pool), group, device)
        for inputs, fresh_inputs in zip(pool, fresh):
            for tensor, fresh_tensor in zip(inputs, fresh_inputs, strict=True):
                tensor.copy_(fresh_tensor)
        kh.synchronize(device)
    return refill


def time_synthetic(task: tasks.Task, spin_us: float, schedule, device, repeats: int, cores) -> dict:
    """``torch.empty`` of one of the task's outputs (bench.floor_output) and one kernel spinning ``spin_us``: a
    callable of known GPU time."""
    import torch

    from evals import bench, gates, stability

    if device.type != "cuda":
        raise SystemExit("qualify: --synthetic needs CUDA (the spin kernel is a GPU kernel)")
    dummy = torch.empty(1, device=device)
    pool = [(dummy,)] * max(schedule.input_pool, schedule.calls_per_group)
    shape, dtype = bench.floor_output(task, task.cases("visible"))

    def fn(*inputs):
        out = torch.empty(shape, dtype=dtype, device=device)
        stability.spin(device, spin_us)
        return out

    row = {"case": f"spin {spin_us:g} us", "stratum": "synthetic", "overrides": {}, "spin_us": spin_us,
           "vectors": []}
    row.update(stability.probe(fn, pool, device))
    for repeat in range(repeats):
        kept: list = []
        times = gates.run_schedule(fn, pool, schedule, device, keep=kept, cores=cores)
        del kept
        row["vectors"].append({"repeat": repeat, "times_us": times, "max_min": max(times) / min(times)})
    return row


# ----------------------------------------------------------------------------------------------------- the parent
def run_child(args: list[str], schedule: str, scratch: Path) -> list[dict]:
    out = scratch / f"{schedule}.jsonl"
    command = [sys.executable, "-m", "evals.qualify", "child", "--schedule", schedule, "--out", str(out), *args]
    env = kh.child_env(KLOOP_QUALIFY_PID=str(os.getpid()))
    try:
        run = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        failure = None if run.returncode == 0 else f"exit status {run.returncode}: {run.stderr.strip()[-600:]}"
    except subprocess.TimeoutExpired:
        failure = f"no result within {CHILD_TIMEOUT_S} s"
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.is_file() else []
    if failure:  # what the child finished stays; the failure is a row of its own
        rows.append({"case": None, "schedule": schedule, "error": f"the {schedule} child failed: {failure}"})
    return rows


def merge(rows: list[dict]) -> list[dict]:
    """One entry per (case, overrides): every schedule's vectors, the host and GPU numbers of each, and the verdict."""
    from evals import stability

    merged: dict[tuple, dict] = {}
    for row in rows:
        if row.get("case") is None:
            continue
        key = (row["case"], json.dumps(row.get("overrides") or {}, sort_keys=True))
        entry = merged.setdefault(key, {"case": row["case"], "stratum": row.get("stratum"),
                                        "overrides": row.get("overrides") or {}, "spin_us": row.get("spin_us"),
                                        "probes": [], "vectors": [], "errors": []})
        if row.get("error"):
            entry["errors"].append(f"{row['schedule']}: {row['error']}")
        if row.get("host_us") is not None:
            entry["probes"].append({"schedule": row["schedule"], "host_us": row["host_us"], "gpu_us": row["gpu_us"]})
        entry["vectors"] += [{"schedule": row["schedule"], **v} for v in row.get("vectors", [])]
    for entry in merged.values():
        probes = entry["probes"]
        entry["host_us"] = kh.median([p["host_us"] for p in probes]) if probes else None
        entry["gpu_us"] = kh.median([p["gpu_us"] for p in probes]) if probes else None
        entry["ratio"] = entry["gpu_us"] / entry["host_us"] if probes else None
        notes = [row["note"] for row in rows if row.get("case") == entry["case"] and row.get("note")]
        entry["rule_stable"], entry["rule_note"] = stability.verdict(
            entry["host_us"], entry["gpu_us"], unmeasured=notes[0] if notes else "not measured")
        spreads = [v["max_min"] for v in entry["vectors"]]
        entry["worst_max_min"] = max(spreads) if spreads else None
        entry["passed"] = bool(spreads) and not entry["errors"] and max(spreads) <= LIMIT
    return list(merged.values())


def qualify(args_for_child: list[str], schedules: list[str], log=print, task: tasks.Task | None = None) -> dict:
    """Every schedule's child in turn (``args_for_child`` name the task, the solution or the synthetic points), their
    rows merged and judged against the verifier's limit."""
    info = kh.select_device()
    rows, failures = [], []
    with tempfile.TemporaryDirectory(prefix="kloop-qualify-") as scratch:
        for schedule in schedules:  # one after another: nothing else times meanwhile
            found = run_child(args_for_child, schedule, Path(scratch))
            failures += [r["error"] for r in found if r.get("case") is None]
            rows += found
            log(f"{schedule}: {sum(1 for r in found if r.get('case'))} pairs timed"
                + (f"; {failures[-1]}" if found and found[-1].get("case") is None else ""))
    entries = merge(rows)
    vectors = [(e, v) for e in entries for v in e["vectors"]]
    worst = max(vectors, key=lambda ev: ev[1]["max_min"], default=None)
    measured = info.device.type == "cuda"
    passed = measured and bool(entries) and not failures and all(e["passed"] for e in entries)
    from evals import stability

    return {"task": None if task is None else task.name, "device": info.name, "measured": measured, "limit": LIMIT,
            "margin": MARGIN, "ratio_min": stability.STABLE_RATIO, "schedules": schedules, "passed": passed,
            "failures": failures,
            "worst": None if worst is None else {"case": worst[0]["case"], "overrides": worst[0]["overrides"],
                                                 "schedule": worst[1]["schedule"],
                                                 "max_min": worst[1]["max_min"]},
            "note": "" if info.device.type == "cuda" else "interpreter wall times: no GPU timing, nothing qualified",
            "rows": entries}


def format_rows(report: dict) -> str:
    num = kh.cell

    lines = [f"{'case':<26} {'overrides':<28} {'host_us':>8} {'gpu_us':>8} {'ratio':>6} {'worst':>6}  vectors"]
    for e in report["rows"]:
        spreads = " ".join(f"{v['schedule'].removeprefix('spec-') or 'spec'}:{v['max_min']:.3f}"
                           for v in e["vectors"])
        lines.append(f"{e['case']:<26} {json.dumps(e['overrides'])[:28]:<28} {num(e['host_us']):>8} "
                     f"{num(e['gpu_us']):>8} {num(e['ratio']):>6} {num(e['worst_max_min'], '.3f'):>6}  "
                     + (spreads or "-") + ("" if e["passed"] else "  FAIL")
                     + "".join(f"\n    {m}" for m in e["errors"]))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- calibration
def curve(entries: list[dict]) -> dict:
    """Worst max/min per GPU/host ratio bin, and the threshold: the smallest measured ratio at and above which every
    vector stayed within MARGIN. None when no ratio qualifies (then nothing above the data is known to be stable).

    Where synthetic points are among the entries, they alone set the threshold: their GPU time is a spin, so their
    spread comes from the host alone, which is what the ratio can cure; a real plan also spreads for reasons of its
    own (a stalled group of a weight stream). Real plans' vectors over the margin at or above the threshold are
    listed as ``outliers``: spread the ratio does not explain."""
    points = sorted((e["ratio"], v["max_min"], e["case"], v["schedule"]) for e in entries if e.get("ratio")
                    for v in e["vectors"])
    synthetic = {e["case"] for e in entries if e.get("stratum") == "synthetic"}
    bins = []
    for low, high in zip(RATIO_BINS, RATIO_BINS[1:]):
        inside = [p for p in points if low <= p[0] < high]
        if inside:
            bins.append({"ratio_from": low, "ratio_to": high, "vectors": len(inside),
                         "worst_max_min": max(p[1] for p in inside),
                         "over_margin": sum(p[1] > MARGIN for p in inside),
                         "over_limit": sum(p[1] > LIMIT for p in inside)})
    calibrating = [p for p in points if p[2] in synthetic] if synthetic else points
    threshold = None
    for i in range(len(calibrating) - 1, -1, -1):  # walk down from the largest ratio while every vector above holds
        if calibrating[i][1] > MARGIN:
            break
        threshold = calibrating[i][0]
    above = [p for p in points if threshold is not None and p[0] >= threshold]
    return {"points": len(points), "bins": bins, "threshold": threshold, "margin": MARGIN,
            "calibrated_on": "synthetic" if synthetic else "all",
            "worst_above_threshold": max((p[1] for p in above), default=None),
            "outliers": [{"case": p[2], "schedule": p[3], "ratio": p[0], "max_min": p[1]} for p in above
                         if p[1] > MARGIN]}


def format_curve(found: dict) -> str:
    lines = [f"| GPU/host ratio | vectors | worst max/min | over {MARGIN:.2f} | over {LIMIT:.2f} |",
             "|---|---|---|---|---|"]
    for b in found["bins"]:
        high = "" if b["ratio_to"] == float("inf") else f"{b['ratio_to']:g}"
        lines.append(f"| {b['ratio_from']:g}-{high} | {b['vectors']} | {b['worst_max_min']:.3f} | "
                     f"{b['over_margin']} | {b['over_limit']} |")
    t = found["threshold"]
    lines.append(f"threshold: {'none (no ratio kept every vector within 1.10)' if t is None else f'{t:.2f}'}"
                 f" ({found['calibrated_on']} points; {found['points']} vectors in all)")
    lines += [f"over {MARGIN} above the threshold: {o['case']} {o['schedule']} max/min {o['max_min']:.3f} at ratio "
              f"{o['ratio']:.2f}" for o in found["outliers"]]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- entry point
def require_eager_groups(task: tasks.Task) -> None:
    """The qualification is the eager-groups protocol's: a task timed by another protocol is refused (ValueError)."""
    timing = task.manifest["timing"]
    if timing != "eager-groups":
        raise ValueError(f"task {task.name} is timed by the {timing} protocol, and the qualification times only the "
                         "eager-groups protocol's schedule (the verifier's groups of eager calls), which does not "
                         f"judge it: a {timing} task declares no qualify stage (graph replay keeps the host's cost out "
                         "of the timed region, so there is no host-bound dispersion to qualify)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        return child_main(argv[1:])
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m evals.qualify", description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--solution", help="a solution directory (default: the task's main)")
    source.add_argument("--synthetic", help="comma-separated spin times in microseconds (calibration points)")
    source.add_argument("--curve", nargs="+", help="qualification JSONs: print the calibration curve")
    tasks.add_argument(parser)
    parser.add_argument("--panel", help="visible, smoke or a panel JSON file (default: visible with CUDA, else smoke)")
    parser.add_argument("--grid", help="JSON file: a list of override dicts (default [{}], the solution's own plan)")
    parser.add_argument("--repeats", type=int, default=3, help="timed vectors per schedule (default 3)")
    parser.add_argument("--schedules", default=",".join(SCHEDULES),
                        help=f"comma-separated pinning schedules (default {','.join(SCHEDULES)})")
    parser.add_argument("--json", help="write every number here")
    args = parser.parse_args(argv)
    from evals import gates
    from evals.loader import resolve_solution_dir

    if args.curve:
        try:
            entries = [e for path in args.curve for e in json.loads(Path(path).read_text())["rows"]]
        except (OSError, ValueError, KeyError) as exc:
            print(f"qualify: --curve needs qualification JSONs (with rows): {exc}", file=sys.stderr)
            return 2
        found = curve(entries)
        print(format_curve(found))
        if args.json:
            Path(args.json).write_text(json.dumps(found, indent=1))
        return 0
    schedules = [s for s in args.schedules.split(",") if s]
    unknown = [s for s in schedules if s not in gates.SCHEDULES]
    if not schedules or unknown:
        parser.error(f"--schedules: unknown {unknown or 'none given'}; choose from {', '.join(gates.SCHEDULES)}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1; got {args.repeats}")
    try:
        task = tasks.load(args.task)
        require_eager_groups(task)
        if args.synthetic:
            spins = [float(v) for v in args.synthetic.split(",")]
            if not spins or min(spins) <= 0:
                raise ValueError("--synthetic needs positive spin times in microseconds, e.g. 5,10,20")
            if kh.select_device().device.type != "cuda":
                raise RuntimeError("--synthetic needs a CUDA GPU (its callable spins a GPU kernel)")
            child = ["--synthetic", args.synthetic]
        else:
            solution = resolve_solution_dir(args.solution or task.main_dir)
            panel = args.panel or kh.default_panel()
            task.cases(panel)
            if Path(panel).is_file():  # the children run in a scratch directory
                panel = str(Path(panel).resolve())
            grid = json.loads(Path(args.grid).read_text()) if args.grid else [{}]
            if not isinstance(grid, list) or not grid or not all(isinstance(g, dict) for g in grid):
                raise ValueError(f"--grid {args.grid} must hold a JSON list of override objects ({{}} is the own plan)")
            child = ["--solution", str(solution), "--panel", str(panel), "--grid", json.dumps(grid)]
        child += ["--task", str(task.folder), "--repeats", str(args.repeats)]
    except (OSError, ValueError, RuntimeError, kh.SetupError) as exc:
        print(f"qualify: {exc}", file=sys.stderr)
        return 2
    report = qualify(child, schedules, log=lambda line: print(line, flush=True), task=task)
    print(format_rows(report))
    if report["note"]:
        print("note: " + report["note"])
    worst = report["worst"]
    print(("passed" if report["passed"] else "NOT passed") + f": every vector within {LIMIT}" * report["passed"]
          + (f"; worst {worst['max_min']:.3f} ({worst['case']}, {worst['schedule']})" if worst else ""))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
