"""Profiler feedback for a solution: where each case stands against the GPU's measured ceilings, and why.

    .venv/bin/python -m evals.profile [--task NAME|DIR] [--solution DIR] [--panel visible|smoke|FILE] [--ncu]
                                      [--overrides JSON] [--json OUT]

Per case of the task's panel: median latency; the bytes the case must move (the adapter's ``bytes_moved``) and the
achieved GB/s as a fraction of the measured copy bandwidth; FLOP (the adapter's ``flop``, where it has one) and the
fraction of the measured fp16 matmul rate; host time per call against GPU time per call (the launch-overhead share);
the kernels one call launches with their grids against the SM count and their registers and shared memory
(torch.profiler); each Triton kernel's registers and spills (Triton's compiled-kernel metadata); with --ncu, where
Nsight Compute works, the main kernel's DRAM, L2 and L1 throughput, achieved and theoretical occupancy, issue
activity, registers, shared memory and top stall reasons; the board's power, SM clock and energy per call over a
second of back-to-back calls (evals/power.py). Then a bottleneck label with the evidence behind it ("power-capped"
where the board sat at its power limit with its SM clock lowered). ``--solution`` defaults to the task's main;
``--overrides JSON`` passes tuning overrides to a family's entry point as ``config=`` (``task.build``). The two
ceilings are measured once per device and cached in ~/.cache/kloop/. Without a GPU it says so and reports the static
numbers (bytes, FLOP). For a task timed by the graph-paired protocol (evals/graph_timing.py) the latency is the
protocol's: one call replayed from a CUDA graph with the L2 flushed (evals/graph_timing.replay_us), and no case is
labelled launch-bound, since graph replay keeps the host's cost out of the timed region (the host cost is still
reported).
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from evals import graph_timing, power, stability
from evals import kernel_harness as kh
from evals import task as tasks
from evals.loader import load_solution, resolve_solution_dir, unload_solution
from evals.selfcheck import CANDIDATE_ERRORS, error_record

CACHE = Path.home() / ".cache" / "kloop" / "device_rates.json"
PROFILED_CALLS = 20
# Nsight Compute: the sections whose metrics the summary reads (its raw page lists every metric they collect), and
# the summary's names for the metrics it keeps.
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats")
NCU_METRICS = {
    "duration_us": "gpu__time_duration.sum",
    "dram_throughput_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_throughput_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1_throughput_pct": "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "issue_active_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "registers_per_thread": "launch__registers_per_thread",
    "shared_bytes_dynamic": "launch__shared_mem_per_block_dynamic",
    "shared_bytes_static": "launch__shared_mem_per_block_static",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
}
# stall reasons: warps stalled on each, per issued instruction (WarpStateStats); "selected" is the issuing warp
# itself (1.00 by definition), not a stall
NCU_STALL = re.compile(r"^smsp__average_warps?_issue_stalled_(\w+?)_per_issue_active\.ratio$")
NOT_A_STALL = frozenset(("selected",))


@dataclass
class KernelLaunch:
    name: str
    calls_per_call: float  # launches of this kernel per solution call
    gpu_us: float  # mean duration of one launch
    grid: list[int]
    block: list[int]
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = None


@dataclass
class CaseProfile:
    case: dict
    bytes: int
    flop: int | None  # None where the task's adapter gives no flop(case)
    median_us: float | None = None
    gbps: float | None = None
    copy_fraction: float | None = None
    tflops: float | None = None
    matmul_fraction: float | None = None
    host_us_per_call: float | None = None
    gpu_us_per_call: float | None = None
    launch_overhead_share: float | None = None  # the part of the latency the GPU spends waiting for the host
    kernels: list[KernelLaunch] = field(default_factory=list)
    triton_kernels: list[dict] = field(default_factory=list)
    ncu: dict | None = None
    power: dict | None = None  # board power, SM clock and energy per call, back to back (evals/power.py)
    bottleneck: str = "unknown"
    evidence: str = ""
    error: dict | None = None


def device_rates(device: torch.device) -> dict:
    """Copy bandwidth (GB/s) and fp16 matmul rate (TFLOP/s), measured once per device and cached."""
    key = f"{torch.cuda.get_device_name(device)} | torch {torch.__version__}"
    cached = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
    if key not in cached:
        a = torch.randn((8192, 8192), dtype=torch.float16, device=device)
        times = kh.time_groups(lambda p, q: p @ q, [(a, a)], groups=5, calls_per_group=4, warmup=3)
        cached[key] = {"copy_gbps": kh.copy_bandwidth_gbps(device),
                       "matmul_tflops": 2 * 8192**3 / (kh.median(times) * 1e-6) / 1e12}
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        CACHE.write_text(json.dumps(cached, indent=2))
    return cached[key]


def triton_kernels(module) -> list[dict]:
    """Registers, spills and shared memory of every Triton kernel the solution's module compiled."""
    found = []
    for name, obj in vars(module).items():
        while hasattr(obj, "fn") and not hasattr(obj, "device_caches"):  # autotune / heuristics wrappers
            obj = obj.fn
        for kernel_cache, *_ in getattr(obj, "device_caches", {}).values():
            for compiled in kernel_cache.values():
                meta = compiled.metadata
                found.append({"kernel": name, "registers": getattr(compiled, "n_regs", None),
                              "spills": getattr(compiled, "n_spills", None),
                              "shared_memory_bytes": getattr(meta, "shared", None),
                              "num_warps": getattr(meta, "num_warps", None),
                              "num_stages": getattr(meta, "num_stages", None)})
    return found


def profile_kernels(fn, inputs, calls: int) -> list[KernelLaunch]:
    """The kernels one call launches, from a torch.profiler trace of ``calls`` calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            fn(*inputs[i % len(inputs)])
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    launches: dict[str, list[dict]] = {}
    for event in events:
        if event.get("cat") == "kernel":
            launches.setdefault(event["name"], []).append(event)
    result = []
    for name, group in sorted(launches.items(), key=lambda item: -sum(e.get("dur", 0) for e in item[1])):
        args = group[0].get("args", {})
        result.append(KernelLaunch(name[:80], len(group) / calls, sum(e.get("dur", 0) for e in group) / len(group),
                                   list(args.get("grid", [])), list(args.get("block", [])),
                                   args.get("registers per thread"), args.get("shared memory")))
    return result


def label(p: CaseProfile, sm_count: int) -> tuple[str, str]:
    """The bottleneck and the numbers behind it, most decisive first."""
    main = p.kernels[0] if p.kernels else None
    programs = 1
    for size in (main.grid if main else []):
        programs *= size
    share = p.launch_overhead_share or 0.0
    # the GPU idles most of the time, or the host needs longer to issue a call than the GPU to run it
    if share > 0.5 or (share > 0.1 and (p.host_us_per_call or 0) >= (p.gpu_us_per_call or float("inf"))):
        return "launch-bound", (f"host {p.host_us_per_call:.1f} us per call vs GPU {p.gpu_us_per_call:.1f} us: "
                                f"the GPU idles {100 * share:.0f}% of the time; "
                                f"{sum(k.calls_per_call for k in p.kernels):.0f} kernel(s) per call")
    capped = power.describe(p.power)
    if capped and capped.startswith("power-capped"):  # the SM clock, not the copy engine, sets the time
        return "power-capped", (f"the power cap or brake held in {100 * p.power['capped']:.0f}% of samples: "
                                f"{power.numbers(p.power)}; {100 * (p.copy_fraction or 0):.1f}% of copy bandwidth")
    if main and programs < sm_count:
        return "under-filled grid", (f"{main.name}: {programs} programs on {sm_count} SMs; "
                                     f"{100 * (p.copy_fraction or 0):.1f}% of copy bandwidth")
    if (p.matmul_fraction or 0) > (p.copy_fraction or 0):
        return "compute-bound", (f"{100 * p.matmul_fraction:.1f}% of the fp16 matmul rate vs "
                                 f"{100 * (p.copy_fraction or 0):.1f}% of copy bandwidth")
    return "memory-bound", (f"{100 * (p.copy_fraction or 0):.1f}% of copy bandwidth vs "
                            f"{100 * (p.matmul_fraction or 0):.2f}% of the fp16 matmul rate; "
                            f"{programs} programs on {sm_count} SMs")


def run_ncu(task: tasks.Task, solution: Path, case, kernel: str, overrides: dict | None = None) -> dict:
    """Kernel ``kernel`` (a name as torch.profiler gives it: the call's longest) under Nsight Compute in a child
    process, its fourth launch of five calls: DRAM, L2 and L1 throughput, achieved and theoretical occupancy, issue
    activity, registers and shared memory, and the top stall reasons."""
    if shutil.which("ncu") is None:
        return {"available": False, "reason": "ncu is not on PATH"}
    target = [sys.executable, "-m", "evals.profile", "--task", str(task.folder), "--solution", str(solution),
              "--ncu-target", json.dumps(asdict(case))] + (["--overrides", json.dumps(overrides)] if overrides else [])
    # only this kernel's launches count: building and the inputs launch kernels of their own first
    command = ["ncu", "--clock-control", "none", "--csv", "--page", "raw", "--kernel-name-base", "function",
               "--kernel-name", ncu_kernel_filter(kernel), "--launch-skip", "3", "--launch-count", "1",
               *[arg for section in NCU_SECTIONS for arg in ("--section", section)], *target]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600,
                         cwd=Path(__file__).resolve().parent.parent)
    summary = parse_ncu_raw(run.stdout)
    if summary is None:
        return {"available": False,
                "reason": (run.stderr or run.stdout).strip().splitlines()[-1:] or "no metrics in ncu output"}
    if not summary["stalls"] or any(summary[key] is None for key in NCU_METRICS):
        summary["raw_csv"] = run.stdout[-200_000:]  # what this ncu names differently, to read
    return {"available": True, **summary}


def ncu_kernel_filter(name: str) -> str:
    """Nsight Compute's --kernel-name for a kernel as torch.profiler names it, matched against ncu's function base
    name (the bare identifier): a Triton kernel's name is that already; a C++ kernel's loses its return type,
    namespaces, template arguments and parameters ("void at::native::f<4, ...>(int, ...)" -> "f")."""
    bare = name.removeprefix("void ").split("<")[0].split("(")[0].strip()
    return "regex:^" + re.escape(bare.rsplit("::", 1)[-1]) + "$"


def parse_ncu_raw(text: str) -> dict | None:
    """The summary of the first profiled kernel in ``ncu --csv --page raw`` output (a header row of metric names, a
    row of units, a row per kernel), or None where there is none. Numbers are floats; stalls are
    ``[[reason, warps per issued instruction], ...]``, largest first."""
    rows = [row for row in csv.reader(line for line in text.splitlines() if line.startswith('"'))]
    header = next((i for i, row in enumerate(rows) if "gpu__time_duration.sum" in row or "Kernel Name" in row), None)
    if header is None or len(rows) < header + 3:
        return None
    names, units, values = rows[header], rows[header + 1], rows[header + 2]
    cells = dict(zip(names, values))
    scale = dict(zip(names, units))

    def number(metric):
        try:
            value = float(cells[metric].replace(",", ""))
        except (KeyError, ValueError):
            return None
        unit = scale.get(metric, "")
        return value * {"ns": 1e-3, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6,
                        "Kbyte": 1e3, "Mbyte": 1e6, "KB": 1e3, "MB": 1e6, "KiB": 1024.0,
                        "MiB": 1048576.0}.get(unit.split("/")[0], 1.0)  # times in us, sizes in bytes

    summary = {key: number(metric) for key, metric in NCU_METRICS.items()}
    stalls = []
    for metric in cells:
        found = NCU_STALL.match(metric)
        if found and found.group(1) not in NOT_A_STALL and number(metric) is not None:
            stalls.append([found.group(1), round(number(metric), 3)])
    summary["stalls"] = sorted(stalls, key=lambda item: -item[1])
    summary["kernel"] = cells.get("Kernel Name", "")
    return summary if any(v is not None for k, v in summary.items() if k in NCU_METRICS) else None


def case_flop(task: tasks.Task, case) -> int | None:
    """The FLOP of one call, where the task's adapter counts them (``flop(case)``); else None."""
    flop = getattr(task.adapter, "flop", None)
    return None if flop is None else flop(case)


def profile_case(task: tasks.Task, solution: Path, case, device: torch.device, rates: dict | None, use_ncu: bool,
                 overrides: dict | None = None) -> CaseProfile:
    p = CaseProfile(case=kh.case_dict(case), bytes=task.adapter.bytes_moved(case), flop=case_flop(task, case))
    if rates is None:
        flop = "" if p.flop is None else f" and {p.flop:,} FLOP"
        p.bottleneck, p.evidence = "unknown", (f"no GPU: {p.bytes:,} bytes{flop} per call; latency, "
                                                "bandwidth and kernel data need CUDA")
        return p
    module = None
    try:
        module = load_solution(solution, entry=task.entry)
        problem = task.adapter.generate(case, "normal", device)
        fn = build(task, module, problem.weights, overrides)
        inputs = task.adapter.make_inputs(case, 16, seed=4, device=device)
        paired = task.graph_paired
        if paired:  # the protocol's own latency: graph replay with the L2 flushed
            flush = torch.zeros(graph_timing.FLUSH_BYTES, dtype=torch.uint8, device=device)
            p.median_us = graph_timing.replay_us(fn, inputs[0], flush)
            del flush
        else:
            times = kh.time_groups(fn, inputs, groups=11, calls_per_group=256, warmup=256)
            p.median_us = kh.median(times)
        p.gbps = p.bytes / p.median_us / 1e3
        p.copy_fraction = p.gbps / rates["copy_gbps"]
        if p.flop is not None:
            p.tflops = p.flop / p.median_us / 1e6
            p.matmul_fraction = p.tflops / rates["matmul_tflops"]
        p.host_us_per_call = stability.probe(fn, inputs, device)["host_us"]  # the GPU kept busy: no wait in it
        p.power = power.probe(fn, inputs, device, p.median_us)
        p.kernels = profile_kernels(fn, inputs, PROFILED_CALLS)
        p.gpu_us_per_call = sum(k.gpu_us * k.calls_per_call for k in p.kernels)
        # under graph replay the host's cost is outside the timed region: no share of it in the latency
        p.launch_overhead_share = None if paired else max(0.0, 1 - p.gpu_us_per_call / p.median_us)
        p.triton_kernels = triton_kernels(module)
        if use_ncu:
            longest = max(p.kernels, key=lambda k: k.gpu_us * k.calls_per_call, default=None)
            p.ncu = (run_ncu(task, solution, case, longest.name, overrides) if longest else
                     {"available": False, "reason": "the profiler saw no kernel"})
        p.bottleneck, p.evidence = label(p, torch.cuda.get_device_properties(device).multi_processor_count)
        if paired:
            p.evidence += ("; latency: CUDA-graph replay, L2 flushed (graph-paired: the host's cost is outside the "
                           "timed region)")
    except CANDIDATE_ERRORS as exc:
        p.error = error_record("profile", exc)
    finally:
        if module is not None:
            unload_solution(module)
    return p


def build(task: tasks.Task, module, weights: dict, overrides: dict | None):
    """The solution's callable for one case's build arguments; ``overrides`` go to a family's entry point as
    ``config=`` (tuning only)."""
    if overrides:
        return task.build(module, weights, config=overrides)
    return task.build(module, weights)


def ncu_target(task: tasks.Task, solution: Path, case_json: str, overrides: dict | None = None) -> None:
    """What ncu runs: a few calls of one case, nothing else on the GPU after the warm-up launches."""
    case = task.adapter.Case(**json.loads(case_json))
    problem = task.adapter.generate(case, "normal", "cuda")
    fn = build(task, load_solution(solution, entry=task.entry), problem.weights, overrides)
    for _ in range(5):
        fn(*problem.inputs)
    torch.cuda.synchronize()


def run(solution: Path, panel: str, use_ncu: bool = False, log=print, overrides: dict | None = None,
        task: tasks.Task | None = None) -> dict:
    task = task or tasks.load()
    info = kh.select_device()
    log(info.message)
    cases = task.cases(panel)
    rates = device_rates(info.device) if info.device.type == "cuda" else None
    profiles = []
    for case in cases:
        profiles.append(profile_case(task, solution, case, info.device, rates, use_ncu, overrides))
        log(format_row(profiles[-1]))
    return {"task": task.name, "solution": str(solution), "panel": str(panel), "overrides": overrides,
            "device": info.name, "rates": rates, "cases": [asdict(p) for p in profiles]}


def format_row(p: CaseProfile) -> str:
    num = kh.cell

    line = (f"{p.case['name']:<26} {num(p.median_us, '.2f'):>9} us {num(p.gbps, '.0f'):>6} GB/s "
            f"{num(p.copy_fraction and 100 * p.copy_fraction, '.1f'):>5}% copy  "
            f"host {num(p.host_us_per_call, '.1f'):>6} us  gpu {num(p.gpu_us_per_call, '.1f'):>7} us  "
            f"{p.bottleneck}: {p.evidence}")
    for k in p.kernels[:3]:
        line += (f"\n    {k.name[:50]:<50} x{k.calls_per_call:.0f} {k.gpu_us:8.2f} us grid {k.grid} block {k.block} "
                 f"regs {k.registers_per_thread}")
    for t in p.triton_kernels:
        line += (f"\n    triton {t['kernel']}: {t['registers']} registers, {t['spills']} spills, "
                 f"{t['shared_memory_bytes']} B shared")
    if p.power:
        line += "\n    power: " + (power.describe(p.power) or power.numbers(p.power))
    if p.ncu:
        line += "\n    ncu: " + format_ncu(p.ncu)
    if p.error:
        line += f"\n    error: {p.error['name']}: {p.error['message']}"
    return line


def format_ncu(ncu: dict) -> str:
    if not ncu.get("available"):
        return f"not available: {ncu.get('reason')}"

    def num(key, fmt=".1f"):
        return kh.cell(ncu.get(key), fmt)
    shared = sum(ncu.get(key) or 0 for key in ("shared_bytes_dynamic", "shared_bytes_static"))
    stalls = ", ".join(f"{reason} {value:.2f}" for reason, value in ncu.get("stalls", [])[:4]) or "-"
    return (f"{num('duration_us', '.2f')} us; DRAM {num('dram_throughput_pct')}%, L2 {num('l2_throughput_pct')}%, "
            f"L1 {num('l1_throughput_pct')}%; occupancy {num('achieved_occupancy_pct')}% achieved of "
            f"{num('theoretical_occupancy_pct')}%; issue active {num('issue_active_pct')}%; "
            f"{num('registers_per_thread', '.0f')} registers, {shared:.0f} B shared; grid {num('grid_size', '.0f')} x "
            f"{num('block_size', '.0f')}; top stalls (warps per issue): {stalls}")


def parse_overrides(text: str | None) -> dict | None:
    """--overrides: a JSON object of plan keys, or a ValueError that shows the form."""
    if not text:
        return None
    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--overrides is not JSON ({exc.msg}); give an object, e.g. '{{\"num_warps\": 8}}'") from None
    if not isinstance(overrides, dict):
        raise ValueError(f"--overrides must be a JSON object, e.g. '{{\"num_warps\": 8}}'; got {text!r}")
    return overrides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m evals.profile", description=__doc__.split("\n")[0])
    tasks.add_argument(parser)
    parser.add_argument("--solution", help="solution directory (default: the task's main)")
    parser.add_argument("--panel", help="visible, smoke or a panel JSON file (default: visible with CUDA, else smoke)")
    parser.add_argument("--ncu", action="store_true",
                        help="add Nsight Compute's throughputs, occupancy, registers, shared memory and stall reasons "
                             "(slow)")
    parser.add_argument("--overrides", help="JSON dict of tuning overrides for a family's build(..., config=)")
    parser.add_argument("--json", help="write the full report here")
    parser.add_argument("--ncu-target", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        task = tasks.load(args.task)
        solution = resolve_solution_dir(args.solution or task.main_dir)
        overrides = parse_overrides(args.overrides)
        if args.ncu_target:
            ncu_target(task, solution, args.ncu_target, overrides)
            return 0
        report = run(solution, args.panel or kh.default_panel(), args.ncu, log=lambda line: print(line, flush=True),
                     overrides=overrides, task=task)
    except (FileNotFoundError, ValueError, kh.SetupError) as exc:
        print(f"profile: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 1 if any(c["error"] for c in report["cases"]) else 0


if __name__ == "__main__":
    sys.exit(main())
