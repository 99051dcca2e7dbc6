"""Benchmark: the task's baseline, main and peers on its visible panel against floors measured in the same process.

    .venv/bin/python -m evals.bench [--task NAME|DIR] [--panel visible|FILE] [--solutions DIR ...] [--no-peers]
                                    [--json OUT]

The solutions default to the task's baseline version and its main (the manifest's baseline and main); for a
task whose baseline is a callable, to its versions' v0 (where it has one) and its main, with the callable timed as a
row of its own (note "baseline"). Per case: the HBM
roofline (the case's bytes, the adapter's ``bytes_moved``, at the measured copy bandwidth), the GPU floor (4 us of
fixed kernel cost + that roofline) and two host floors (torch.empty of one output + one launch through Triton's JIT
dispatch; the same through the already-compiled kernel's launcher; the output is the adapter's FLOOR_OUTPUT_SHAPE of
its OUTPUT_DTYPE, else the panel's largest output). Then per implementation: eager latency under the verifier's
protocol (8,192 untimed calls, 11 groups of 512 timed with CUDA events; the peers, which are slow, get 512 untimed
calls and 11 groups of 64), GPU time by CUDA-graph replay with the L2 hot and with the L2 flushed before every replay
(seed 002's dual qualification), the host cost per call with the GPU kept busy (``host_us``, evals/stability.py: eager
time near it means host-bound), eager over the larger of the case's floors (``x_floor``: the compiled-launch host
floor or the GPU floor, whichever binds; 1.0 would be at that bound), the board's power, SM clock and energy per call
over a second of back-to-back calls (evals/power.py: a row whose note says power-capped ran at the board's power limit
with its SM clock lowered, so its eager time is near the power bound, not the bandwidth bound), and correctness on
normal inputs (the adapter's reference and check). Peers: the adapter's optional ``PEERS``, ``{name: (builder(weights,
case) -> callable, note)}`` (the note says whether the peer keeps to the task's rules), and ``skipped_peers()``, one
log line per peer it cannot run here; W4A16's are in tasks/w4a16/adapter.py. Needs CUDA.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from evals import kernel_harness as kh
from evals import power, stability
from evals import task as tasks
from evals import graph_timing
from evals.graph_timing import FLUSH_BYTES  # the L2 flush the graph-paired pairs read too
from evals.loader import load_solution, resolve_solution_dir
from evals.selfcheck import error_line

FIXED_KERNEL_US = 4.0


@dataclass
class Row:
    case: str
    impl: str
    note: str
    correct: bool | None = None
    eager_us: float | None = None
    graph_hot_us: float | None = None
    graph_flushed_us: float | None = None
    flushed_copy_fraction: float | None = None
    host_us: float | None = None  # host cost per call with the GPU kept busy (evals/stability.py)
    gpu_us: float | None = None  # the same pass's back-to-back GPU time per call
    floor_ratio: float | None = None  # eager / max(compiled-launch host floor, GPU floor): floor_ratio()
    power: dict | None = None  # board power, SM clock and energy per call, back to back (evals/power.py)
    error: str | None = None


# ------------------------------------------------------------------------------------------------ timing
def eager_us(fn, inputs, untimed: int, groups: int, per_group: int) -> float:
    times = kh.time_groups(fn, inputs, groups, per_group, warmup=untimed)
    return kh.median(times)


def floor_output(task: tasks.Task, cases: list) -> tuple[tuple[int, ...], torch.dtype]:
    """The output one call allocates in the host floors (and in evals.qualify's synthetic callable): the adapter's
    FLOOR_OUTPUT_SHAPE where it has one, else the largest output of ``cases``; of the task's OUTPUT_DTYPE."""
    shape = getattr(task.adapter, "FLOOR_OUTPUT_SHAPE", None)
    if shape is None:
        shape = max((tuple(task.adapter.output_shape(case)) for case in cases), key=lambda s: (math.prod(s), s))
    return tuple(shape), task.adapter.OUTPUT_DTYPE


def host_floors(device: torch.device, shape: tuple[int, ...], dtype: torch.dtype) -> dict:
    """torch.empty of an output (``shape``, ``dtype``) + one launch of a one-store Triton kernel: through the JIT
    dispatch, then the compiled launcher."""
    import triton
    import triton.language as tl

    @triton.jit
    def one_store(out_ptr):
        tl.store(out_ptr, 0.0)

    probe = torch.empty(1, dtype=torch.float16, device=device)
    compiled = one_store.warmup(probe, grid=(1,))
    launch = compiled[(1, 1, 1)]  # CompiledKernel.__getitem__ binds the grid once; a hot path keeps the runner
    inputs = [(probe,)]

    def jit_call(_):
        out = torch.empty(shape, dtype=dtype, device=device)
        one_store[(1,)](out)

    def compiled_call(_):
        out = torch.empty(shape, dtype=dtype, device=device)
        launch(out)

    return {"jit_launch_us": eager_us(jit_call, inputs, 2048, 11, 512),
            "compiled_launch_us": eager_us(compiled_call, inputs, 2048, 11, 512)}


# ------------------------------------------------------------------------------------------------ the bench
def floor_ratio(eager_us: float | None, gpu_floor_us: float, host_floor_us: float) -> float | None:
    """Eager time over the floor that binds, the larger of the GPU floor and the compiled-launch host floor."""
    return None if eager_us is None else eager_us / max(gpu_floor_us, host_floor_us)


def bench_impl(task: tasks.Task, name: str, note: str, build, case, problem: tasks.Problem, inputs: list[tuple],
               copy_gbps: float, flush, full: bool, device: torch.device) -> Row:
    """One implementation on one case: ``build(weights, case)`` gives its callable; checked on ``problem``'s own call
    inputs, then timed on ``inputs``."""
    adapter = task.adapter
    row = Row(case.name, name, note)
    try:
        fn = build(problem.weights, case)
        ref = adapter.reference(problem.weights, problem.inputs, case)
        row.correct = adapter.check_output(fn(*problem.inputs), ref, case).ok
        row.eager_us = eager_us(fn, inputs, *((8192, 11, 512) if full else (512, 11, 64)))
        row.graph_hot_us = graph_timing.replay_us(fn, inputs[0], None)
        row.graph_flushed_us = graph_timing.replay_us(fn, inputs[0], flush)
        row.flushed_copy_fraction = adapter.bytes_moved(case) / row.graph_flushed_us / 1e3 / copy_gbps
        found = stability.probe(fn, inputs, device)
        row.host_us, row.gpu_us = found["host_us"], found["gpu_us"]
        # last: its second of back-to-back calls would leave the columns above timed on a board at its power limit
        row.power = power.probe(fn, inputs, device, row.eager_us)
    except Exception as exc:  # a peer that does not run on this torch is a row with its error, not a failed bench
        row.error = error_line(exc, 160)
    return row


def implementations(task: tasks.Task, solutions: list[Path], peers: bool, log=print) -> list[tuple]:
    """``(name, note, builder(weights, case) -> callable, full)`` per row: our solutions (note "ours", the full eager
    schedule), the task's callable baseline where it has one (note "baseline"), then with ``peers`` the adapter's
    PEERS (the short schedule: peers are slow)."""
    impls = []
    for path in solutions:
        module = load_solution(path, entry=task.entry)
        impls.append((path.name, "ours", lambda weights, case, module=module: task.build(module, weights), True))
    if task.baseline_dir is None:
        impls.append((task.manifest["baseline"]["callable"], "baseline", task.build_baseline, True))
    if peers:
        impls += [(name, note, build, False) for name, (build, note) in getattr(task.adapter, "PEERS", {}).items()]
        for line in getattr(task.adapter, "skipped_peers", list)():
            log(line)
    else:
        log("peers: not run (--no-peers)")
    return impls


def default_solutions(task: tasks.Task) -> list[Path]:
    """The task's baseline version and its main; for a task whose baseline is a callable (a row of its own), its
    versions' v0 where it exists, and its main."""
    if task.baseline_dir is not None:
        return [task.baseline_dir, task.main_dir]
    first = tasks.ROOT / task.manifest["versions"] / "v0"
    return [first, task.main_dir] if (first / "solution.py").is_file() else [task.main_dir]


def run(panel: str, solutions: list[Path] | None = None, log=print, peers: bool = True,
        task: tasks.Task | None = None) -> dict:
    """The bench of ``solutions`` (default: ``default_solutions``)."""
    task = task or tasks.load()
    if solutions is None:
        solutions = default_solutions(task)
    info = kh.select_device()
    if info.device.type != "cuda":
        raise RuntimeError("the benchmark needs a CUDA GPU (" + info.message + ")")
    log(info.message)
    panel_cases = task.cases(panel)
    copy_gbps = kh.copy_bandwidth_gbps(info.device)
    floors = host_floors(info.device, *floor_output(task, panel_cases))
    log(f"copy bandwidth {copy_gbps:.0f} GB/s; host floors: JIT launch {floors['jit_launch_us']:.2f} us, "
        f"compiled launch {floors['compiled_launch_us']:.2f} us")
    try:
        board = power.meter(info.device)
        board_info = {"limit_w": board.limit_w, "max_sm_mhz": board.max_sm_mhz}
        log(f"power limit {board.limit_w:.0f} W, SM clock up to {board.max_sm_mhz} MHz")
    except power.PowerUnavailable as exc:
        board_info = {"note": f"not measured: {exc}"}
        log(f"power: not measured ({exc})")
    impls = implementations(task, solutions, peers, log)
    flush = torch.zeros(FLUSH_BYTES, dtype=torch.uint8, device=info.device)
    cases = []
    for case in panel_cases:
        problem = task.adapter.generate(case, "normal", info.device)
        inputs = task.adapter.make_inputs(case, 16, seed=5, device=info.device)
        roofline_us = task.adapter.bytes_moved(case) / copy_gbps / 1e3
        gpu_floor = FIXED_KERNEL_US + roofline_us
        target = 1.5 * max(gpu_floor, floors["compiled_launch_us"])  # the larger floor binds
        rows = [bench_impl(task, name, note, build, case, problem, inputs, copy_gbps, flush, full, info.device)
                for name, note, build, full in impls]
        for row in rows:
            row.floor_ratio = floor_ratio(row.eager_us, gpu_floor, floors["compiled_launch_us"])
        cases.append({"case": kh.case_dict(case), "roofline_us": roofline_us, "gpu_floor_us": gpu_floor,
                      "target_us": target, "rows": [asdict(r) for r in rows]})
        log(format_case(cases[-1]))
    return {"task": task.name, "device": info.name, "copy_gbps": copy_gbps, "host_floors": floors,
            "power": board_info, "panel": str(panel), "cases": cases}


def format_case(entry: dict) -> str:
    num = kh.cell

    c = entry["case"]
    lines = [f"{c['name']} ({c['stratum']}): roofline {entry['roofline_us']:.2f} us, "
             f"GPU floor {entry['gpu_floor_us']:.2f} us, target (1.5x the larger floor) {entry['target_us']:.2f} us"]
    lines.append(f"  {'implementation':<28} {'eager_us':>9} {'graph_hot':>9} {'flushed':>9} {'host_us':>8} "
                 f"{'%copy':>6} {'x_floor':>7} {'watts':>6} {'sm_mhz':>6} {'mJ':>6} {'correct':>7}  note")
    for r in entry["rows"]:
        p = r.get("power") or {}
        capped = power.describe(p)
        lines.append(f"  {r['impl']:<28} {num(r['eager_us']):>9} {num(r['graph_hot_us']):>9} "
                     f"{num(r['graph_flushed_us']):>9} {num(r.get('host_us')):>8} "
                     f"{num(r['flushed_copy_fraction'] and 100 * r['flushed_copy_fraction'], '.1f'):>6} "
                     f"{num(r.get('floor_ratio')):>7} {num(p.get('power_w'), '.0f'):>6} "
                     f"{num(p.get('sm_mhz'), '.0f'):>6} {num(p.get('energy_mj')):>6} "
                     f"{'-' if r['correct'] is None else ('yes' if r['correct'] else 'NO'):>7}  {r['note']}"
                     + (f"; {capped.split(':')[0]}" if capped else "")
                     + (f"; error {r['error']}" if r['error'] else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m evals.bench", description=__doc__.split("\n")[0])
    tasks.add_argument(parser)
    parser.add_argument("--panel", help="visible, smoke or a panel JSON file (default: visible with CUDA, else "
                                        "smoke); bench needs CUDA")
    parser.add_argument("--solutions", nargs="+",
                        help="our solutions to time (default: the task's baseline version, or for a callable "
                             "baseline its v0 where it has one, and its main)")
    parser.add_argument("--no-peers", action="store_true",
                        help="time our solutions only (the peers take minutes: a slow peer is ~1 ms a call)")
    parser.add_argument("--json", help="write the full report here")
    args = parser.parse_args(argv)
    try:
        task = tasks.load(args.task)
        solutions = [resolve_solution_dir(s) for s in args.solutions] if args.solutions else None
        report = run(args.panel or kh.default_panel(), solutions, log=lambda line: print(line, flush=True),
                     peers=not args.no_peers, task=task)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if all(r["correct"] for c in report["cases"] for r in c["rows"] if r["note"] == "ours") else 1


if __name__ == "__main__":
    sys.exit(main())
