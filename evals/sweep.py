"""Sweep a solution's tuning overrides over a panel on the GPU: correctness, eager latency, graph GPU time per plan.

    .venv/bin/python -m evals.sweep [--task NAME|DIR] --solution methods/drafts/w4a16 --grid grid.json
                          [--panel visible] [--jobs 12] [--pin] [--inputs N] [--keep] [--json OUT]

The grid is a JSON list of override dicts, each passed to the solution's entry point as ``config=overrides``
(``task.build``) on top of the plan the solution would choose itself (``{}`` is that plan). Candidate code runs only
in child processes: first a pool of ``--jobs`` processes builds and checks every (case, overrides) pair once in each
of the task's input regimes (normal and adversarial for W4A16; this compiles every kernel into Triton's on-disk cache
in parallel), then one process times the pairs that passed, one after another, so that nothing else runs on the GPU or
the CPU meanwhile. Per pair: eager microseconds per call (median of 7 groups of 256 back-to-back calls after 256
untimed, the verifier's kind of number, shorter) with the groups' max/min (the verifier fails a role over 1.15:
host-bound plans are fast but may not pass), and the GPU time of one call replayed from a CUDA graph with the L2 hot
and with the L2 flushed (as ``evals.bench``), and the host cost and back-to-back GPU time per call with their ratio
(evals/stability.py: under about 1.3 the verifier's dispersion gate is at risk). Where the solution defines
``plan(*dims, overrides)`` (the case's ``dims`` in their order), each row also records the plan's integer entries. The
table lists, per case, every plan by eager time with its speedup over the solution's own plan; for a task timed as
graph-paired (llgemm) the callable baseline is replayed too (once per case, before its plans), and the table ranks
them by the lower of their hot and flushed speedups over it, as that task scores a case (its selfcheck replays several
calls a graph where the sweep replays one). The JSON holds every number. ``--pin`` times on one core, ``--inputs 512``
cycles through as many inputs as the verifier does and ``--keep`` holds every timed output as it does: one at a time
or together, they tell which of the verifier's timing conditions moves a host-bound plan.
A sweep is an exploration aid: what it finds enters the ledger only as an attempt the loop measures.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from pathlib import Path

from dataclasses import asdict

from evals import kernel_harness as kh
from evals import task as tasks
from evals.selfcheck import error_line


def _check_pair(task_ref: str, solution: str, case: dict, overrides: dict) -> dict:
    """Child process: the selfcheck's correctness check (every input regime of task ``task_ref``, a name or folder)
    with ``overrides``; ``case`` is the case's fields (a dict crosses the process boundary; the adapter's class is
    loaded in the child)."""
    from evals.loader import load_solution
    from evals.selfcheck import check_mode

    try:
        task = tasks.load(task_ref)
        case_obj = task.adapter.Case(**case)
        module = load_solution(Path(solution), entry=task.entry)
        device = kh.select_device().device
        for mode in task.adapter.MODES:
            check, _ = check_mode(task, module, case_obj, mode, device, overrides)
            if not check["ok"]:
                return {"ok": False, "error": f"{mode}: {check['message']}"}
        return {"ok": True, "error": None}
    except Exception as exc:  # the pair failed to build, compile or run: a row with its error
        return {"ok": False, "error": error_line(exc)}


def _time_pairs(task_ref: str, solution: str, pairs: list[tuple[dict, dict]], pin: bool = False, inputs: int = 16,
                keep: bool = False) -> list[dict]:
    """Child process: time each (case fields, overrides) in turn; with ``pin`` on one core and with ``keep`` holding
    every timed output until the groups end, as the verifier's roles do."""
    import torch

    from evals import graph_timing, stability
    from evals.gate_spies import pin_to_one_core
    from evals.loader import load_solution

    if pin:
        pin_to_one_core()
    task = tasks.load(task_ref)
    adapter = task.adapter
    module = load_solution(Path(solution), entry=task.entry)
    device = kh.select_device().device
    flush = torch.zeros(graph_timing.FLUSH_BYTES, dtype=torch.uint8, device=device)
    paired = task.graph_paired and task.baseline_dir is None  # a callable baseline to replay beside the plans
    results, cached = [], {}
    for fields, overrides in pairs:
        case_obj = adapter.Case(**fields)
        if case_obj.name not in cached:
            cached.clear()
            torch.cuda.empty_cache()
            problem = adapter.generate(case_obj, "normal", device)
            calls = adapter.make_inputs(case_obj, inputs, seed=5, device=device)
            base = {}
            if paired:  # the baseline, warmed by one untimed round, then timed as the plans are
                try:
                    baseline = task.build_baseline(problem.weights, case_obj)
                    graph_timing.replay_us(baseline, calls[0], None, replays=20)
                    base = {"baseline_hot_us": graph_timing.replay_us(baseline, calls[0], None, replays=20),
                            "baseline_flushed_us": graph_timing.replay_us(baseline, calls[0], flush, replays=20)}
                except Exception as exc:  # the plans are still timed, and ranked against the own plan
                    base = {"baseline_error": error_line(exc)}
            cached[case_obj.name] = (problem, calls, base)
        problem, calls, base = cached[case_obj.name]
        row = {"case": case_obj.name, "overrides": overrides, **base}
        try:
            fn = task.build(module, problem.weights, config=overrides)
            kept: list | None = [] if keep else None
            groups = kh.time_groups(fn, calls, 7, 256, warmup=256, keep=kept)
            del kept
            row["eager_us"] = kh.median(groups)
            row["spread"] = max(groups) / min(groups)  # the verifier fails a role over 1.15 (host-bound plans)
            row["graph_hot_us"] = graph_timing.replay_us(fn, calls[0], None, replays=20)
            row["graph_flushed_us"] = graph_timing.replay_us(fn, calls[0], flush, replays=20)
            found = stability.probe(fn, calls, device)  # host cost and back-to-back GPU time per call
            row.update(host_us=found["host_us"], gpu_us=found["gpu_us"], ratio=found["ratio"])
            ref = adapter.reference(problem.weights, problem.inputs, case_obj)
            # after thousands of calls: a plan that keeps state between calls must still be right
            row["correct_after"] = adapter.check_output(fn(*problem.inputs), ref, case_obj).ok
            if hasattr(module, "plan"):
                row["plan"] = {k: v for k, v in module.plan(*case_obj.dims.values(), overrides).items()
                               if isinstance(v, int)}
            del fn
        except Exception as exc:
            row["error"] = error_line(exc)
        results.append(row)
        print(json.dumps(row), flush=True)
    return results


def run(solution: str, grid: list[dict], panel: str, jobs: int, log=print, pin: bool = False, inputs: int = 16,
        keep: bool = False, task: tasks.Task | None = None) -> dict:
    task = task or tasks.load()
    task_ref = str(task.folder)  # what the children load the task from
    info = kh.select_device()
    if info.device.type != "cuda":
        raise RuntimeError("the sweep needs a CUDA GPU (" + info.message + ")")
    cases = task.cases(panel)
    pairs = [(case, overrides) for case in cases for overrides in grid]
    context = multiprocessing.get_context("spawn")  # a fresh interpreter per worker: no CUDA state is forked
    from evals.gate_spies import die_with_parent

    # workers die with this process (a sweep killed by a time limit leaves nothing timing on the GPU)
    hygiene = {"initializer": die_with_parent, "initargs": (str(os.getpid()),)}
    with context.Pool(jobs, **hygiene) as pool:
        checks = pool.starmap(_check_pair, [(task_ref, solution, asdict(case), overrides) for case, overrides in pairs])
    failed = [{"case": case.name, "overrides": overrides, "error": check["error"]}
              for (case, overrides), check in zip(pairs, checks) if not check["ok"]]
    for row in failed:
        log(f"failed: {row['case']} {json.dumps(row['overrides'])}: {row['error']}")
    passed = [(asdict(case), overrides) for (case, overrides), check in zip(pairs, checks) if check["ok"]]
    with context.Pool(1, **hygiene) as pool:
        timed = pool.apply(_time_pairs, (task_ref, solution, passed, pin, inputs, keep))
    return {"task": task.name, "device": info.message, "solution": solution, "grid": grid, "pinned": pin,
            "inputs": inputs, "kept_outputs": keep, "graph_paired": task.graph_paired, "failed": failed,
            "timed": timed}


def table(result: dict) -> str:
    """Per case, the timed plans that ran right, best first, then the timed ones that failed (the ones that failed
    their check are logged before the table). A graph-paired task's plans rank by the lower of their hot and flushed
    speedups over the baseline (its score of a case), else over the solution's own plan; any other task's by eager
    time."""
    if result.get("graph_paired"):
        return paired_table(result)
    lines = ["| case | overrides | eager us | x own plan | max/min | graph hot us | graph flushed us | host us | "
             "GPU/host |", "|---|---|---|---|---|---|---|---|---|"]
    for case, rows in by_case(result["timed"]).items():
        good = [r for r in rows if "eager_us" in r and r.get("correct_after")]
        own = next((r["eager_us"] for r in good if not r["overrides"]), None)
        for r in sorted(good, key=lambda r: r["eager_us"]):
            ratio = f"{own / r['eager_us']:.2f}" if own else "-"
            spread = f"{r['spread']:.3f}" if r.get("spread") else "-"
            lines.append(f"| {case} | {json.dumps(r['overrides'])} | {r['eager_us']:.2f} | {ratio} | {spread} | "
                         f"{r['graph_hot_us']:.2f} | {r['graph_flushed_us']:.2f} | "
                         + (f"{r['host_us']:.2f} | {r['ratio']:.2f} |" if r.get("ratio") else "- | - |"))
        lines += failed_rows(case, rows, good, 9)
    return "\n".join(lines)


def paired_table(result: dict) -> str:
    """The graph-paired table: each plan's hot and flushed replay times, its speedups in each over the baseline (or,
    where none was replayed, over the own plan) and the lower of the two, which ranks the plans."""
    lines = ["| case | overrides | graph hot us | graph flushed us | x hot | x flushed | lower | eager us |",
             "|---|---|---|---|---|---|---|---|"]
    for case, rows in by_case(result["timed"]).items():
        good = [r for r in rows if "graph_hot_us" in r and r.get("correct_after")]
        own = next((r for r in good if not r["overrides"]), None)
        ref = ("baseline_hot_us", "baseline_flushed_us") if all("baseline_hot_us" in r for r in good) else None

        def speedups(r: dict) -> tuple[float, float] | None:
            if ref:
                return r[ref[0]] / r["graph_hot_us"], r[ref[1]] / r["graph_flushed_us"]
            if own:
                return own["graph_hot_us"] / r["graph_hot_us"], own["graph_flushed_us"] / r["graph_flushed_us"]
            return None

        ranked = (sorted(good, key=lambda r: -min(speedups(r))) if ref or own
                  else sorted(good, key=lambda r: r["graph_hot_us"]))
        for r in ranked:
            found = speedups(r)
            ratios = f"{found[0]:.2f} | {found[1]:.2f} | {min(found):.2f}" if found else "- | - | -"
            lines.append(f"| {case} | {json.dumps(r['overrides'])} | {r['graph_hot_us']:.2f} | "
                         f"{r['graph_flushed_us']:.2f} | {ratios} | {r['eager_us']:.2f} |")
        if ref and good:
            lines.append(f"| {case} | baseline | {good[0][ref[0]]:.2f} | {good[0][ref[1]]:.2f} | 1.00 | 1.00 | 1.00 | "
                         "- |")
        lines += failed_rows(case, rows, good, 8)
    title = ("speedups over the baseline" if any("baseline_hot_us" in r for r in result["timed"])
             else "speedups over the solution's own plan")
    return "\n".join([f"graph-paired task: plans ranked by the lower of their hot and flushed {title}"] + lines)


def by_case(timed: list[dict]) -> dict[str, list[dict]]:
    """The timed rows grouped by case, in the order they ran."""
    found: dict[str, list[dict]] = {}
    for row in timed:
        found.setdefault(row["case"], []).append(row)
    return found


def failed_rows(case: str, rows: list[dict], good: list[dict], columns: int) -> list[str]:
    """The rows that were never ranked: an error, or wrong after timing."""
    return [f"| {case} | {json.dumps(r['overrides'])} | {r.get('error') or 'wrong after timing'} |"
            + " |" * (columns - 3) for r in rows if r not in good]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m evals.sweep", description=__doc__.splitlines()[0])
    tasks.add_argument(parser)
    parser.add_argument("--solution", help="a solution directory or its solution.py (default: the task's main)")
    parser.add_argument("--grid", help="JSON file: a list of override dicts ({} is the own plan; default: the task's "
                                       "manifest's sweep_grid)")
    parser.add_argument("--panel", help="visible, smoke or a panel JSON file (default: visible with CUDA, else smoke)")
    parser.add_argument("--jobs", type=int, default=8, help="processes that build and check in parallel (default 8)")
    parser.add_argument("--pin", action="store_true", help="time on one core, as the verifier's roles do")
    parser.add_argument("--inputs", type=int, default=16,
                        help="distinct call inputs cycled through (default 16; the verifier uses 512)")
    parser.add_argument("--keep", action="store_true", help="hold every timed output until the groups end, as the "
                                                            "verifier does")
    parser.add_argument("--json", help="write every number here")
    args = parser.parse_args(argv)
    try:
        args.grid = args.grid or tasks.grid_of(args.task)
    except tasks.TaskError as exc:
        parser.error(str(exc))
    try:
        grid = json.loads(Path(args.grid).read_text())
    except (OSError, ValueError) as exc:
        parser.error(f"--grid {args.grid}: {exc}")
    if not isinstance(grid, list) or not all(isinstance(g, dict) for g in grid):
        parser.error("--grid must hold a JSON list of objects (override dicts)")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1; got {args.jobs}")
    if args.inputs < 1:
        parser.error(f"--inputs must be at least 1; got {args.inputs}")
    from evals.loader import resolve_solution_dir

    try:
        task = tasks.load(args.task)
        solution = str(resolve_solution_dir(args.solution or task.main_dir))
        result = run(solution, grid, args.panel or kh.default_panel(), args.jobs, pin=args.pin, inputs=args.inputs,
                     keep=args.keep, task=task)
    except (FileNotFoundError, RuntimeError, ValueError) as exc:
        print(f"sweep: {exc}", file=sys.stderr)
        return 2
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
