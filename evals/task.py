"""A task as the evaluator sees it: the manifest (``tasks/<name>/task.json``) and its adapter module.

The manifest is plain data that the loop (agent/) reads too; the adapter is the task's code, imported here only:
case generation, the reference and its bound, bytes moved, the sealed-panel generator and, where the task declares
them, a residency allowance, an external baseline and the bench's peers. Every evaluator module takes a task (``--task
NAME|DIR``, default ``w4a16``) and asks it for everything that is the task's; they know no task's terms.

The adapter's interface (``tasks/w4a16/adapter.py`` is the full example, ``tests/toy_task/adapter.py`` the smallest):

    Case                          a frozen dataclass: ``stratum``, ``seed``, the case's dimensions; ``.name`` and
                                  ``.dims`` (its dimensions by name, as the manifest's strata and tier_dims name them)
    MODES                         the input regimes the correctness gates check, "normal" first
    generate(case, mode, device)  -> Problem: the build arguments (by name, in the contract's order) and one call's
                                  inputs (a tuple, in the contract's order), deterministic in (case, mode, device)
    make_inputs(case, count, seed, device) -> list of fresh call-input tuples of the normal regime
    reference(weights, inputs, case) -> an object the adapter's check_output takes (the oracle and its bound)
    check_output(out, ref, case)  -> CheckResult: structure and agreement of one output
    output_shape(case), OUTPUT_DTYPE   what every output must be (shape, dtype)
    bytes_moved(case)             the fewest bytes one call moves (GB/s and fractions of copy bandwidth)
    make_panel(seed, per_stratum) -> {"note", "cases": [rows]}: a sealed panel, disjoint from the visible one
    residency(case)               (only where the manifest declares the residency stage) the allowance: an object
                                  whose ``audit(point, new)`` returns the violations of a checkpoint (each made by
                                  evals.residency.over_limit); optionally ``account(point, new)`` (the task's own
                                  figures of a checkpoint) and ``quoted`` (the figures its evidence shows)
    references(weights, inputs, case), outside_bound(outs, ref, case), check_outputs(outs, refs, case)   (optional)
                                  a batched oracle, a count of one input's outputs outside the bound, and each
                                  output's check_output result (equal to it) at once, for the verifier's many calls
                                  and the graph-paired timing's checks; BOUND names the bound in
                                  evidence; PER_STRATUM_MIN = (n, why): the fewest sealed cases per stratum
    baseline(weights, case)       (only for a callable baseline) the yardstick's callable for those weights
    PEERS                         (optional) {name: (builder(weights, case) -> callable, note)}: what make bench sets
                                  beside the solutions; skipped_peers() -> lines for peers it cannot run here
    flop(case), FLOOR_OUTPUT_SHAPE   (optional) FLOP per call for the profile; the output the bench's host floors
                                  allocate (default: the panel's largest output)
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TASKS_DIR = ROOT / "tasks"
DEFAULT_TASK = "w4a16"
GRAPH_PAIRED = "graph-paired"
REFERENCE_CHUNK = 64  # call inputs per batched oracle pass (bounds its fp64 scratch)
# the timing protocols this evaluator implements (a manifest's "timing"); another protocol needs its timer here first
TIMING_PROTOCOLS = {
    "eager-groups": "the verifier's groups of eager calls, three roles per case (tasks/w4a16/spec.md's schedule)",
    GRAPH_PAIRED: "CUDA-graph replay, the candidate paired with the baseline in one process, hot and L2-flushed "
                    "(evals/graph_timing.py)",
}


class TaskError(ValueError):
    """A task that cannot be used: a missing folder or file, a malformed manifest. The message says what to fix."""


@dataclass
class Problem:
    """One case's build arguments (by name, in the contract's order) and one call's inputs (in the contract's order)."""

    weights: dict[str, Any]
    inputs: tuple


@dataclass
class Task:
    name: str
    folder: Path
    manifest: dict
    adapter: ModuleType
    panels: dict[str, Path] = field(default_factory=dict)

    @property
    def build_args(self) -> list[str]:
        return list(self.manifest["contract"]["build_args"])

    @property
    def call_args(self) -> list[str]:
        return list(self.manifest["contract"]["call_args"])

    @property
    def entry(self) -> str:
        return self.manifest["contract"].get("entry", "build")

    @property
    def strata(self) -> dict[str, dict]:
        return self.manifest["strata"]

    @property
    def stages(self) -> list[str]:
        return list(self.manifest["stages"])

    @property
    def graph_paired(self) -> bool:
        """Whether the task is timed by the graph-paired protocol (evals/graph_timing.py), else by eager groups."""
        return self.manifest["timing"] == GRAPH_PAIRED

    def declares(self, stage: str) -> bool:
        return stage in self.manifest["stages"]

    @property
    def baseline_version(self) -> str | None:
        return self.manifest["baseline"].get("version")

    @property
    def baseline_dir(self) -> Path | None:
        """The baseline version's snapshot, or None for a callable baseline."""
        version = self.baseline_version
        return ROOT / self.manifest["versions"] / version if version else None

    @property
    def main_dir(self) -> Path:
        return ROOT / self.manifest["main"]

    def build(self, module: ModuleType, weights: dict, **extra):
        """The solution's callable: its entry point called with the build arguments in the contract's order."""
        entry = getattr(module, self.entry, None)
        if not callable(entry):
            raise AttributeError(f"the solution defines no callable {self.entry}({', '.join(self.build_args)})")
        return entry(*(weights[name] for name in self.build_args), **extra)

    def build_baseline(self, weights: dict, case):
        """The callable baseline's function for these weights (a task whose baseline is a version loads it instead)."""
        return self.adapter.baseline(weights, case)

    def references(self, weights: dict, pool: list, case) -> list:
        """The oracle for each call input of ``pool``: the adapter's batched ``references(weights, inputs, case)`` over
        chunks of REFERENCE_CHUNK where it has one (one pass over the weights per chunk), else its ``reference`` per
        input."""
        batched = getattr(self.adapter, "references", None)
        refs = []
        for start in range(0, len(pool), REFERENCE_CHUNK):
            chunk = pool[start:start + REFERENCE_CHUNK]
            refs += (batched(weights, chunk, case) if batched is not None
                     else [self.adapter.reference(weights, inputs, case) for inputs in chunk])
        return refs

    def check_outputs(self, outs: list, refs: list, case) -> list:
        """``check_output`` of each of ``outs`` against its ``refs``: the adapter's batched ``check_outputs`` where it
        has one, else one by one."""
        batched = getattr(self.adapter, "check_outputs", None)
        if batched is not None:
            return batched(outs, refs, case)
        return [self.adapter.check_output(out, ref, case) for out, ref in zip(outs, refs, strict=True)]

    def cases(self, panel: str | os.PathLike) -> list:
        """A panel's cases, by name (visible, smoke) or a JSON file path; a malformed panel raises ValueError."""
        path = self.panels.get(str(panel), Path(panel))
        if not path.is_file():
            raise FileNotFoundError(f"no panel file at {path}; give {' or '.join(map(repr, self.panels))} or the path "
                                    f"of a panel JSON of task {self.name}")
        try:
            data = json.loads(path.read_text())
            rows = data["cases"] if isinstance(data, dict) else data
            cases = [self.adapter.Case(**row) for row in rows]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: a panel of task {self.name} is JSON {{\"cases\": [{{{', '.join(self.case_keys)}"
                             f"}}, ...]}} ({type(exc).__name__}: {exc})") from None
        if not cases:
            raise ValueError(f"{path}: the panel has no cases; give at least one {{{', '.join(self.case_keys)}}}")
        return cases

    @property
    def case_keys(self) -> list[str]:
        return [f.name for f in self.adapter.Case.__dataclass_fields__.values()]


def resolve(name_or_path: str | os.PathLike | None) -> Path:
    """The task folder: a name under tasks/, or a path to a folder holding task.json (or to task.json itself)."""
    given = str(name_or_path or DEFAULT_TASK)
    path = Path(given)
    if path.name == "task.json" and path.is_file():
        return path.parent.resolve()
    if (path / "task.json").is_file() and (os.sep in given or not (TASKS_DIR / given).is_dir()):
        return path.resolve()
    if (TASKS_DIR / given / "task.json").is_file():
        return (TASKS_DIR / given).resolve()
    known = sorted(p.name for p in TASKS_DIR.iterdir() if (p / "task.json").is_file()) if TASKS_DIR.is_dir() else []
    raise TaskError(f"no task {given!r}: give a task name ({', '.join(known) or 'none under tasks/'}) or a folder "
                    "holding task.json")


def read_manifest(folder: Path) -> dict:
    try:
        manifest = json.loads((folder / "task.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TaskError(f"{folder / 'task.json'}: {exc}") from None
    missing = [k for k in ("name", "spec", "adapter", "contract", "main", "versions", "ledger", "panels", "strata",
                           "baseline", "stages", "timing") if k not in manifest]
    if missing:
        raise TaskError(f"{folder / 'task.json'} lacks {missing} (README.md, 'Add your own task', lists the fields)")
    if manifest["timing"] not in TIMING_PROTOCOLS:
        raise TaskError(f"{folder / 'task.json'}: timing {manifest['timing']!r} is not a protocol this evaluator "
                        "implements; give one of:\n" + "\n".join(f"  {name}: {what}"
                                                               for name, what in TIMING_PROTOCOLS.items()))
    if manifest["timing"] == GRAPH_PAIRED and "qualify" in manifest["stages"]:
        raise TaskError(f"{folder / 'task.json'}: a graph-paired task has no qualify stage (the qualification times "
                        "the eager-groups schedule; graph replay keeps the host out of the timed region): remove "
                        "qualify from its stages")
    if manifest["stages"][:2] != ["policy", "selfcheck"]:  # the checks after them are the task's own to name
        raise TaskError(f"{folder / 'task.json'}: stages must start with policy, selfcheck; got {manifest['stages']}")
    if set(manifest["baseline"]) not in ({"version"}, {"callable"}):
        raise TaskError(f"{folder / 'task.json'}: baseline is {{\"version\": \"v0\"}} or {{\"callable\": "
                        f"\"adapter.baseline\"}}; got {manifest['baseline']}")
    return manifest


_loaded: dict[Path, Task] = {}


def load(name_or_path: str | os.PathLike | None = None) -> Task:
    """The task (manifest and adapter), loaded once per process."""
    folder = resolve(name_or_path)
    if folder in _loaded:
        return _loaded[folder]
    manifest = read_manifest(folder)
    adapter_path = ROOT / manifest["adapter"]
    if not adapter_path.is_file():
        raise TaskError(f"task {manifest['name']}: no adapter at {adapter_path} (the manifest's adapter, relative to "
                        "the repository root)")
    module_name = f"kloop_task_{manifest['name'].replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(module_name, adapter_path)
    adapter = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = adapter  # dataclasses resolve their module by name
    spec.loader.exec_module(adapter)
    panels = {name: ROOT / path for name, path in manifest["panels"].items()}
    task = Task(manifest["name"], folder, manifest, adapter, panels)
    _loaded[folder] = task
    return task


def add_argument(parser) -> None:
    """The ``--task`` option every evaluator command takes."""
    parser.add_argument("--task", default=DEFAULT_TASK,
                        help=f"the task: a name under tasks/ or a folder holding task.json (default {DEFAULT_TASK})")


def baseline_builder(task: Task, baseline_dir: Path | None):
    """``(weights, case) -> callable`` for the yardstick: the solution at ``baseline_dir`` (a version such as v0, or the
    best of a run), loaded once, or, where ``baseline_dir`` is None and the task's baseline is a callable, the
    adapter's ``baseline``. Returns ``(builder, label)``; a version's load errors propagate (it is the evaluator's
    input, not the candidate)."""
    from evals.loader import load_solution

    if baseline_dir is None and task.baseline_dir is None:
        return task.build_baseline, task.manifest["baseline"]["callable"]
    directory = baseline_dir or task.baseline_dir
    module = load_solution(directory)
    return (lambda weights, case: task.build(module, weights)), str(directory)


def grid_of(name_or_path: str | os.PathLike | None) -> str:
    """The task's default sweep grid (the manifest's ``sweep_grid``); a TaskError where it declares none."""
    manifest = read_manifest(resolve(name_or_path))
    if "sweep_grid" not in manifest:
        raise TaskError(f"task {manifest['name']} declares no sweep_grid: give --grid FILE (a JSON list of override "
                        "dicts)")
    return str(ROOT / manifest["sweep_grid"])


def main(argv: list[str] | None = None) -> int:
    """``python -m evals.task main [TASK]``: the task's main (for make's defaults); ``list``: the tasks under tasks/."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["main"] and len(argv) <= 2:
            print(ROOT / read_manifest(resolve(argv[1] if len(argv) == 2 else None))["main"])
            return 0
        if argv == ["list"]:
            for folder in sorted(TASKS_DIR.glob("*/task.json")):
                manifest = read_manifest(folder.parent)
                print(f"{manifest['name']:<16} {manifest.get('description', '')}")
            return 0
    except TaskError as exc:
        print(f"task: {exc}", file=sys.stderr)
        return 2
    print("usage: python -m evals.task main [TASK] | list", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
