"""The residency guard: what a solution keeps alive, checked at three checkpoints, for a task that declares the
residency stage.

    .venv/bin/python -m evals.residency [--task NAME|DIR] --solution DIR [--panel visible|smoke|FILE] [--calls N]
                                        [--jobs N] [--json OUT]

For each case, storage is measured after synchronize, ``gc.collect()`` and ``torch.cuda.empty_cache()`` as growth over
the guard's own tensors, after build, after the first call and after the whole call schedule. The measuring is this
module's; what may be kept is the task's: its adapter's ``residency(case)`` gives an allowance object with

    audit(point, new) -> [violation]   the rules a checkpoint breaks (``over_limit`` makes one violation record)
    account(point, new) -> dict        (optional) the task's own figures, recorded in the checkpoint (``figures``)
    quoted                             (optional) the names of those figures the verifier's residency gate quotes

where ``point`` is the Checkpoint (total, by dtype, unattributed) and ``new`` the storages the solution added
(Storage: nbytes, dtype name, shape). tasks/w4a16/adapter.py's Allowance is the example (total, floating, unpacked
and workspace rules). A task that declares no residency stage has no guard: this command refuses it (exit 2).

Storage is found two ways: every tensor and storage object reachable by the garbage collector (grouped by dtype),
and on CUDA the allocator's own count. Allocator bytes that no object explains (a raw allocation, a tensor held
only inside C++) cannot be shown not to be floating point ("unattributed"): an allowance counts them as floating.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from evals import kernel_harness as kh
from evals import task as tasks
from evals.loader import load_solution, resolve_solution_dir, unload_solution
from evals.selfcheck import CANDIDATE_ERRORS, error_record

MIB = 1 << 20
FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FLOATING_NAMES = frozenset(str(d).removeprefix("torch.") for d in FLOATING)
INTEGER_NAMES = frozenset(("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "bool"))
HALF_FLOAT_NAMES = frozenset(("float16", "bfloat16"))
STORAGE_HOLDERS = (torch.Tensor, torch.TypedStorage, torch.UntypedStorage)
ALLOCATOR_BLOCK = 512  # the CUDA caching allocator rounds every block up to this
CALLS_CUDA = 16384 + 8192 + 11 * 512  # the verifier's calls per role (eager-groups)
# graph-paired: a role's eager calls (its gates, the warm-ups and the captures; replays allocate nothing new), with room
CALLS_GRAPH = 512
CALLS_INTERPRETED = 24


def default_calls(task: tasks.Task, interpreted: bool) -> int:
    """Calls before the last checkpoint: as many as a verifier role of the task's protocol makes, few under the
    interpreter."""
    if interpreted:
        return CALLS_INTERPRETED
    return CALLS_GRAPH if task.graph_paired else CALLS_CUDA


@dataclass
class Storage:
    nbytes: int
    dtype: str  # "untyped" when only a bare storage object holds it
    shape: tuple


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


_frozen: list = []  # references to the tensors and storages that quiet_heap() took out of the collector's view
_quiet = {"count": None}  # gc.get_freeze_count() as quiet_heap() left it; None outside


def _held(obj):
    try:
        return weakref.ref(obj)
    except TypeError:  # not weakly referable: this closure keeps it alive until quiet_heap() exits
        return lambda: obj


@contextmanager
def quiet_heap():
    """Inside: every object alive on entry (the libraries, the harness) sits in the collector's permanent generation
    (``gc.freeze``), so ``settle``'s collection and ``live_storages``' scan visit only what was made since, which is
    a few thousand objects instead of a few hundred thousand; the tensors and storages among the frozen are
    remembered, and ``live_storages`` still reads them. Enter it before any candidate code is loaded and where no
    other thread makes objects; a frozen object's garbage cycle is never collected until the exit (``gc.unfreeze``).
    Inside one already, it does nothing more."""
    if _quiet["count"] is not None:
        yield
        return
    gc.collect()
    _frozen.extend(_held(obj) for obj in gc.get_objects() if issubclass(type(obj), STORAGE_HOLDERS))
    gc.freeze()
    _quiet["count"] = gc.get_freeze_count()
    try:
        yield
    finally:
        gc.unfreeze()
        _frozen.clear()
        _quiet["count"] = None


def _reachable():
    """Every object the collector tracks. Where anything but quiet_heap() froze objects since (nothing an honest
    candidate can do), all are first made visible again."""
    if _quiet["count"] is not None and gc.get_freeze_count() != _quiet["count"]:
        gc.unfreeze()
    yield from gc.get_objects()
    for ref in _frozen:
        obj = ref()
        if obj is not None:
            yield obj


def live_storages(device: torch.device) -> dict[int, Storage]:
    """Every storage on ``device`` that a Python object reaches, keyed by address (frozen objects included: see
    quiet_heap). A storage seen through a tensor takes that tensor's dtype; a floating view wins, so an integer view
    cannot hide a float buffer."""
    found: dict[int, Storage] = {}
    for obj in _reachable():
        kind = type(obj)
        try:
            if issubclass(kind, torch.Tensor):
                storage, dtype, shape = obj.untyped_storage(), _dtype_name(obj.dtype), tuple(obj.shape)
            elif issubclass(kind, torch.TypedStorage):
                storage, dtype, shape = obj.untyped(), _dtype_name(obj.dtype), (obj.size(),)
            elif issubclass(kind, torch.UntypedStorage):
                storage, dtype, shape = obj, "untyped", (obj.nbytes(),)
            else:
                continue
        except (RuntimeError, NotImplementedError):  # sparse, meta or other storage-less tensors
            continue
        if storage.device.type != device.type or storage.nbytes() == 0:
            continue
        key = storage.data_ptr()
        seen = found.get(key)
        if seen is None or seen.dtype == "untyped" or (dtype in FLOATING_NAMES and seen.dtype not in FLOATING_NAMES):
            found[key] = Storage(storage.nbytes(), dtype, shape)
    return found


def settle(device: torch.device) -> None:
    kh.synchronize(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def allocated(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


@dataclass
class Checkpoint:
    name: str
    total_bytes: int  # everything the solution added, unattributed bytes included
    by_dtype: dict[str, int]
    unattributed_bytes: int
    largest: list[dict]
    figures: dict = field(default_factory=dict)  # the allowance's own (its ``account``), flat in the record
    violations: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The checkpoint's record: the allowance's figures beside the measured ones."""
        return {"name": self.name, "total_bytes": self.total_bytes, **self.figures, "by_dtype": self.by_dtype,
                "unattributed_bytes": self.unattributed_bytes, "largest": self.largest, "violations": self.violations}

    def quoted(self, allowance) -> dict:
        """The figures the allowance names for the verifier's evidence (its ``quoted``), by name."""
        return {name: self.figures[name] for name in getattr(allowance, "quoted", ())}


def over_limit(point: Checkpoint, rule: str, used: int, limit: int, what: str) -> dict | None:
    """One broken rule, with the bytes over its limit; None when ``used`` is within ``limit``. An allowance's
    ``audit`` returns these."""
    if used <= limit:
        return None
    return {"rule": rule, "checkpoint": point.name, "bytes": used, "limit": limit, "over": used - limit,
            "message": f"{what}: {used:,} bytes > {limit:,} allowed ({used - limit:,} over) after {point.name}"}


def require_residency(task: tasks.Task) -> None:
    """ValueError, saying so, where the task declares no residency stage: it has no allowance to check."""
    if not task.declares("residency"):
        raise ValueError(f"task {task.name} declares no residency stage (its task.json's stages: "
                         f"{', '.join(task.stages)}): there is no allowance to check")


def allowance_for(task: tasks.Task, case):
    """The task's residency allowance for ``case`` (its adapter's ``residency(case)``); ValueError without one."""
    require_residency(task)
    if not callable(getattr(task.adapter, "residency", None)):
        raise ValueError(f"task {task.name} declares the residency stage but its adapter defines no residency(case) "
                         "(evals/task.py lists the interface)")
    return task.adapter.residency(case)


def measure(name: str, before: dict[int, Storage], before_allocated: int | None, device: torch.device,
            allowance) -> Checkpoint:
    """One checkpoint: what was added since ``before``, and the rules of ``allowance`` (a task's ``residency(case)``)
    it breaks."""
    settle(device)
    now = live_storages(device)
    new = [s for key, s in now.items() if key not in before]
    by_dtype: dict[str, int] = {}
    for s in new:
        by_dtype[s.dtype] = by_dtype.get(s.dtype, 0) + s.nbytes
    enumerated = sum(s.nbytes for s in new)
    unattributed = 0
    current = allocated(device)
    if current is not None:
        rounded = sum(-(-s.nbytes // ALLOCATOR_BLOCK) * ALLOCATOR_BLOCK for s in new)
        unattributed = max(0, current - before_allocated - rounded)
    largest = sorted(new, key=lambda s: -s.nbytes)[:5]
    point = Checkpoint(name, enumerated + unattributed, by_dtype, unattributed, [asdict(s) for s in largest])
    account = getattr(allowance, "account", None)
    point.figures = account(point, new) if account is not None else {}
    point.violations = allowance.audit(point, new)
    return point


@dataclass
class CaseResidency:
    case: dict
    ok: bool = False
    checkpoints: list[Checkpoint] = field(default_factory=list)
    error: dict | None = None
    calls: int = 0

    def to_dict(self) -> dict:
        return {"case": self.case, "ok": self.ok, "checkpoints": [point.to_dict() for point in self.checkpoints],
                "error": self.error, "calls": self.calls}


def guard_case(task: tasks.Task, solution: Path, case, device: torch.device, calls: int) -> CaseResidency:
    result = CaseResidency(case=kh.case_dict(case), calls=calls)
    allowance = allowance_for(task, case)
    weights = task.adapter.generate(case, task.adapter.MODES[0], device).weights
    inputs = task.adapter.make_inputs(case, 64 if device.type == "cuda" else 2, seed=2, device=device)
    settle(device)
    before, before_allocated = live_storages(device), allocated(device)
    stage, module = "load", None
    try:
        module = load_solution(solution, entry=task.entry)
        stage = "build"
        fn = task.build(module, weights)
        result.checkpoints.append(measure("build", before, before_allocated, device, allowance))
        stage = "first call"
        out = fn(*inputs[0])
        del out
        result.checkpoints.append(measure("first call", before, before_allocated, device, allowance))
        stage = "call schedule"
        for i in range(1, calls):
            fn(*inputs[i % len(inputs)])
        result.checkpoints.append(measure(f"{calls} calls", before, before_allocated, device, allowance))
        result.ok = not any(point.violations for point in result.checkpoints)
    except CANDIDATE_ERRORS as exc:
        result.error = error_record(stage, exc)
    finally:
        if module is not None:
            unload_solution(module)
    return result


def warm_libraries(device: torch.device) -> None:
    """cuBLAS takes its workspace at the first fp16 and fp32 matmul: take it before any baseline is measured."""
    for dtype in (torch.float16, torch.float32):
        a = torch.ones((64, 64), dtype=dtype, device=device)
        (a @ a).sum().item()


def run(solution: Path, panel: str, calls: int | None = None, log=print, task: tasks.Task | None = None,
        jobs: int = 1) -> dict:
    """Every case of ``panel`` guarded, in this process or (``jobs`` > 1) split over that many processes, at most
    one a core."""
    task = task or tasks.load()
    require_residency(task)  # before anything runs
    info = kh.select_device()
    log(info.message)
    if info.device.type != "cuda":
        log("residency on CPU: storage is counted from the tensors and storages Python can reach "
            "(no allocator count to cross-check, so memory held only inside C++ is not seen)")
    calls = calls or default_calls(task, info.interpreted)
    cases = task.cases(panel)
    jobs = kh.usable_jobs(jobs, len(cases))
    if jobs > 1:
        log(f"{len(cases)} cases over {jobs} processes, each a guard of its own (its own allocator count)")
        records = run_shards(task, solution, cases, calls, jobs)
        for case, record in zip(cases, records):
            log(format_case(record, allowance_for(task, case)))
    else:
        warm_libraries(info.device)
        records = []
        with quiet_heap():
            for case in cases:
                records.append(guard_case(task, solution, case, info.device, calls).to_dict())
                log(format_case(records[-1], allowance_for(task, case)))
    return {"task": task.name, "solution": str(solution), "panel": str(panel), "device": info.name, "calls": calls,
            "jobs": jobs, "ok": all(record["ok"] for record in records), "cases": records}


def run_shards(task: tasks.Task, solution: Path, cases: list, calls: int, jobs: int) -> list[dict]:
    """The cases dealt round-robin to ``jobs`` processes of this module, their records back in panel order. Each
    process measures only its own cases, each against what its process held before it, by its own allocator count;
    a process that ends without a report fails its cases."""
    shards = [cases[i::jobs] for i in range(jobs)]
    with tempfile.TemporaryDirectory(prefix="kloop-residency-") as scratch:
        with ThreadPoolExecutor(jobs) as pool:
            found = list(pool.map(lambda i: run_shard(task, solution, shards[i], calls, Path(scratch) / f"shard-{i}"),
                                  range(jobs)))
    records: list[dict] = [{}] * len(cases)
    for i, shard in enumerate(found):
        for j, record in enumerate(shard):
            records[i + j * jobs] = record
    return records


def run_shard(task: tasks.Task, solution: Path, cases: list, calls: int, base: Path) -> list[dict]:
    panel, out = base.with_suffix(".panel.json"), base.with_suffix(".json")
    panel.write_text(json.dumps({"cases": [asdict(case) for case in cases]}))
    command = [sys.executable, "-m", "evals.residency", "--task", str(task.folder), "--solution", str(solution),
               "--panel", str(panel), "--calls", str(calls), "--json", str(out)]
    done = subprocess.run(command, cwd=kh.ROOT, env=kh.child_env(KLOOP_GUARD_PID=str(os.getpid())), capture_output=True,
                          text=True)
    last = (done.stderr.strip().splitlines() or ["(no stderr)"])[-1][:300]
    try:
        records = json.loads(out.read_text())["cases"]
        if [record["case"] for record in records] == [kh.case_dict(case) for case in cases]:
            return records
        failure = f"exit status {done.returncode}, a report that does not hold its cases; stderr's last line: {last}"
    except (OSError, ValueError, KeyError, TypeError):
        failure = (f"exit status {done.returncode} without a report; stderr's last line: {last}; before it: "
                   f"{done.stderr[-1500:]}")
    error = {"stage": "guard process", "name": "GuardProcessFailed", "message": failure}
    return [CaseResidency(case=kh.case_dict(case), calls=calls, error=error).to_dict() for case in cases]


def format_case(record: dict, allowance=None) -> str:
    """A case's record (``CaseResidency.to_dict``) as the guard prints it, with the figures ``allowance`` quotes."""
    lines = [f"{record['case']['name']:<26} {'ok' if record['ok'] else 'FAIL'}"]
    for point in record["checkpoints"]:
        dtypes = (", ".join(f"{name} {nbytes / MIB:.2f}" for name, nbytes in sorted(point["by_dtype"].items()))
                  or "nothing new")
        figures = "".join(f", {name.removesuffix('_bytes')} {point[name] / MIB:8.2f} MiB"
                          for name in getattr(allowance, "quoted", ()) if name in point)
        lines.append(f"    after {point['name']:<14} total {point['total_bytes'] / MIB:9.2f} MiB{figures} "
                     f"[{dtypes}{' MiB' if point['by_dtype'] else ''}]"
                     + (f", unattributed {point['unattributed_bytes'] / MIB:.2f} MiB"
                        if point["unattributed_bytes"] else ""))
        lines += [f"      violated {v['rule']}: {v['message']}" for v in point["violations"]]
    if record["error"]:
        error = record["error"]
        lines.append(f"    error in {error['stage']}: {error['name']}: {error['message']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m evals.residency", description=__doc__.split("\n")[0])
    tasks.add_argument(parser)
    parser.add_argument("--solution", help="solution directory (default: the task's main)")
    parser.add_argument("--panel", help="visible, smoke or a panel JSON file (default: visible with CUDA, else smoke)")
    parser.add_argument("--calls", type=int, help=f"calls before the last checkpoint (default on CUDA {CALLS_CUDA}, "
                                                  f"the verifier's per role, or {CALLS_GRAPH} for a graph-paired task; "
                                                  f"{CALLS_INTERPRETED} under the interpreter)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="guard the cases in this many processes at once, at most one a core (default 1)")
    parser.add_argument("--json", help="write the full report here")
    args = parser.parse_args(argv)
    from evals.gate_spies import die_with_parent  # gate_spies imports this module
    die_with_parent(os.environ.get("KLOOP_GUARD_PID"))  # a guard process of a split run goes with its parent
    if args.calls is not None and args.calls < 1:
        parser.error("--calls must be at least 1")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    try:
        task = tasks.load(args.task)
        require_residency(task)  # before the solution's path is checked
        solution = resolve_solution_dir(args.solution or task.main_dir)
        report = run(solution, args.panel or kh.default_panel(), args.calls, log=lambda line: print(line, flush=True),
                     task=task, jobs=args.jobs)
    except (FileNotFoundError, ValueError, kh.SetupError) as exc:  # TaskError is a ValueError
        print(f"residency: {exc}", file=sys.stderr)
        return 2
    print("residency guard: " + ("every case within the contract" if report["ok"] else "FAILED"))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
