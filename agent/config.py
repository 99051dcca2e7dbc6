"""Configuration: one dataclass per component; unknown keys are errors, so a typo never silently becomes a default."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

PROG = ".venv/bin/python -m agent"  # the CLI as the README, every usage line and every hint spell it


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build ``cls`` from ``data``; a key that is not a field is an error that names the valid keys."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown key(s) {unknown}; valid keys are {sorted(names)}")
    return cls(**data)


TASKS_DIR = "tasks"
DEFAULT_TASK = "w4a16"
MANIFEST = "task.json"


class TaskError(ValueError):
    """A task that cannot be used (no such task, a malformed manifest): the message says what to fix."""


@dataclass
class Task:
    """The task the loop optimizes, as its manifest (tasks/<name>/task.json) declares it: where its candidate, versions
    and ledger live, what the agent may read, its strata and tier dimensions, its baseline, which evaluator stages
    apply and the ledger's metric columns. The loop reads the manifest only (never the adapter, which is the
    evaluator's); every evaluator command it runs gets ``--task`` with the task's folder. Paths are relative to the
    repository root."""

    root: Path
    """The main checkout: the task's main, versions and ledger live here."""
    name: str
    folder: str
    """The task's folder (task.json), relative to ``root``."""
    spec: str
    """The spec the agent reads (the tool read_file("spec") returns it)."""
    candidate_dir: str
    """The solution directory (the manifest's ``main``; the worktree's copy is the one the agent edits)."""
    versions_dir: str
    """Where every attempt is snapshotted as vN/."""
    ledger: str
    """The append-only ledger."""
    strata: dict[str, dict[str, list]]
    """Stratum name -> {dimension: [low, high or None]}: a case belongs to the first stratum whose ranges hold it."""
    baseline: dict
    """{"version": "v0"} (a frozen version) or {"callable": "..."} (the adapter's baseline, e.g. a library call)."""
    stages: tuple[str, ...]
    """The evaluator stages that apply, in order: policy, selfcheck, then optionally qualify (GPU), then the checks run
    for a would-be keeper (each a column of the ledger where ``columns`` names it)."""
    columns: tuple[str, ...]
    """The ledger's metric columns between "correct" and "score": check stages and strata, by name."""
    readable: tuple[str, ...] = ()
    """Folders (relative to the root) the agent may read besides its candidate, the versions and the ledger."""
    tools: dict[str, dict] = field(default_factory=dict)
    """Tools the agent gets for the task's checks: ``{"run_NAME": {"stage": STAGE, "description": "..."}}``."""
    tier_dims: dict[str, list] = field(default_factory=dict)
    """Case dimensions a solution's TIERS may key on (``<DIM>_MIN``/``<DIM>_MAX``), each with its domain [low, high or
    None]: the offline search's shape classes."""
    sample_cases: tuple[dict, ...] = ()
    """Dimensions of cases the strata span, for the offline search when no profile names the panel's own cases."""
    description: str = ""
    timing: str = "eager-groups"
    """The manifest's timing protocol: "eager-groups" (CUDA events over groups of eager calls, with the host-bound
    rule) or "graph-paired" (CUDA-graph replay paired with the baseline, hot and L2-flushed); the prompt says which."""
    ledger_device: str | None = None
    """The GPU that every GPU-timed verdict of the ledger naming no device was timed on (verdicts written before the
    loop recorded the device): the per-table search compares numbers of one GPU model only."""
    eval_timeout_s: float = field(default_factory=lambda: float(os.environ.get("KLOOP_EVAL_TIMEOUT", "900")))
    """Wall-clock limit of each evaluator subprocess; on expiry its whole process group is killed. A run lowers it for
    its attempts to follow the panel (agent.evaluate.panel_limit)."""
    commands: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The evaluator command of each check stage the task declares beyond the built-in ones (the manifest's
    ``commands``, by stage name; a built-in stage's command may be replaced there too)."""
    policy_cmd: tuple[str, ...] = ("-m", "evals.policy")
    gates_cmd: tuple[str, ...] = ("-m", "evals.verifier", "--gates-only", "--jobs", "3")  # untimed: 3 cases at once
    verify_cmd: tuple[str, ...] = ("-m", "evals.verifier")  # the full judge, three timed roles per case
    selfcheck_cmd: tuple[str, ...] = ("-m", "evals.selfcheck")
    profile_cmd: tuple[str, ...] = ("-m", "evals.profile")
    qualify_cmd: tuple[str, ...] = ("-m", "evals.qualify", "--repeats", "1", "--schedules", "spec")
    """Times the candidate under the verifier's own candidate schedule and says whether every 11-group vector stays
    within the verifier's max/min limit; CUDA only (the agent never runs it under the interpreter)."""
    cases_cmd: tuple[str, ...] = ("-m", "evals.selfcheck", "--list-cases")
    """Lists a panel's cases (``--panel P`` appended), exit 2 when it is not a panel: run before a run starts, so that
    a bad panel is refused before anything is written."""

    @classmethod
    def load(cls, root: Path, task: str | None = None) -> "Task":
        """The task named ``task`` (a folder under tasks/), or the task whose folder (or task.json) is the path
        ``task``; the default task when None. A manifest's ``commands`` replace evaluator commands by stage name."""
        folder = resolve_task(root, task)
        try:
            data = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise TaskError(f"{folder / MANIFEST}: {exc}") from None
        required = ("name", "spec", "main", "versions", "ledger", "strata", "baseline", "stages")
        missing = [key for key in required if key not in data]
        if missing:
            raise TaskError(f"{folder / MANIFEST} lacks {missing} (README.md, 'Add your own task', lists the fields)")
        _check_manifest(folder / MANIFEST, data)
        commands = {stage: tuple(command) for stage, command in data.get("commands", {}).items()}
        built_in = {f.name for f in dataclasses.fields(cls) if f.name.endswith("_cmd")}
        replaced = {f"{stage}_cmd": command for stage, command in commands.items() if f"{stage}_cmd" in built_in}
        missing = [stage for stage in data["stages"] if f"{stage}_cmd" not in built_in and stage not in commands]
        if missing:
            raise TaskError(f"{folder / MANIFEST}: stage(s) {missing} have no evaluator command: give each in "
                            '"commands" ({"STAGE": ["-m", "evals.MODULE"]})')
        folder_rel = folder.relative_to(root.resolve()).as_posix() if folder.is_relative_to(root.resolve()) else \
            str(folder)
        _refuse_shared_records(root, folder, data)
        return cls(root=root, name=data["name"], folder=folder_rel, spec=data["spec"], candidate_dir=data["main"],
                   versions_dir=data["versions"], ledger=data["ledger"], strata=data["strata"],
                   baseline=data["baseline"], stages=tuple(data["stages"]),
                   columns=tuple(data.get("columns", list(data["strata"]))),
                   readable=tuple(data.get("readable", ())), tools=data.get("tools", {}),
                   tier_dims=data.get("tier_dims", {}),
                   sample_cases=tuple(data.get("sample_cases", ())), description=data.get("description", ""),
                   timing=data.get("timing", "eager-groups"), ledger_device=data.get("ledger_device"),
                   commands=commands, **replaced)

    def command(self, stage: str) -> tuple[str, ...]:
        """The evaluator command (python arguments) of a stage."""
        return self.commands.get(stage) or getattr(self, f"{stage}_cmd")

    @property
    def graph_paired(self) -> bool:
        """Whether the task is timed by CUDA-graph replay paired with the baseline (else by eager groups)."""
        return self.timing == "graph-paired"

    @property
    def versions(self) -> Path:
        return self.root / self.versions_dir

    @property
    def ledger_path(self) -> Path:
        return self.root / self.ledger

    @property
    def baseline_version(self) -> str | None:
        """The frozen version speedups are measured against, or None for a callable baseline."""
        return self.baseline.get("version")

    @property
    def baseline_label(self) -> str:
        """How scores name their yardstick: the version, or the callable."""
        return self.baseline_version or str(self.baseline.get("callable"))

    @property
    def checks(self) -> tuple[str, ...]:
        """The stages run only for a would-be keeper (or with --full-check), side by side: those after selfcheck and
        the qualification."""
        return tuple(s for s in self.stages if s not in ("policy", "selfcheck", "qualify"))

    @property
    def task_arg(self) -> tuple[str, str]:
        """What every evaluator command gets: the task's folder."""
        return ("--task", str(self.root / self.folder))

    def stratum_of(self, dims: dict[str, int]) -> str | None:
        """The first stratum whose ranges hold ``dims``, else None (a dimension it does not name is not checked)."""
        for name, ranges in self.strata.items():
            if all(dim in dims and low <= dims[dim] and (high is None or dims[dim] <= high)
                   for dim, (low, high) in ranges.items()):
                return name
        return None


def _ranges(value: object) -> bool:
    """{dim: [low, high or null]} with int bounds."""
    return isinstance(value, dict) and all(
        isinstance(bounds, list) and len(bounds) == 2 and type(bounds[0]) is int
        and (bounds[1] is None or type(bounds[1]) is int) for bounds in value.values())


def _check_manifest(path: Path, data: dict) -> None:
    """The fields the loop reads, by type and by how they refer to each other; the first wrong one is a TaskError
    that names it and what it must be."""
    def need(ok: bool, key: str, what: str) -> None:
        if not ok:
            raise TaskError(f"{path}: {key} must be {what}; got {json.dumps(data.get(key))[:200]}")

    for key in ("name", "spec", "main", "versions", "ledger"):
        need(isinstance(data[key], str) and bool(data[key]), key, "a non-empty string")
    need(isinstance(data["strata"], dict) and bool(data["strata"]) and all(map(_ranges, data["strata"].values())),
         "strata", '{"NAME": {"DIM": [low, high or null]}, ...} (at least one stratum)')
    need(_ranges(data.get("tier_dims", {})), "tier_dims", '{"DIM": [low, high or null], ...}')
    baseline = data["baseline"]
    need(isinstance(baseline, dict) and len(baseline) == 1 and set(baseline) <= {"version", "callable"}
         and isinstance(next(iter(baseline.values())), str), "baseline", '{"version": "v0"} or {"callable": "..."}')
    stages = data["stages"]
    need(isinstance(stages, list) and stages[:2] == ["policy", "selfcheck"] and all(isinstance(x, str) for x in stages),
         "stages", 'a list that starts "policy", "selfcheck"')
    checks = [stage for stage in stages if stage not in ("policy", "selfcheck", "qualify")]
    columns = data.get("columns", list(data["strata"]))
    need(isinstance(columns, list) and all(c in checks or c in data["strata"] for c in columns), "columns",
         f"a list of check stages ({', '.join(checks) or 'none'}) and strata ({', '.join(data['strata'])})")
    tools = data.get("tools", {})
    need(isinstance(tools, dict) and all(isinstance(t, dict) and t.get("stage") in checks
                                         and isinstance(t.get("description"), str) for t in tools.values()),
         "tools", '{"run_NAME": {"stage": A_CHECK_STAGE, "description": "..."}}')
    need(isinstance(data.get("readable", []), list), "readable", "a list of folders")
    need(isinstance(data.get("sample_cases", []), list) and all(isinstance(c, dict) and all(type(v) is int
                                                                for v in c.values())
                                                                for c in data.get("sample_cases", [])),
         "sample_cases", '[{"DIM": value, ...}, ...]')
    need(isinstance(data.get("commands", {}), dict) and all(isinstance(c, list) and c for c in
                                                            data.get("commands", {}).values()),
         "commands", '{"STAGE": ["-m", "evals.MODULE", ...]}')
    need(data.get("ledger_device") is None or isinstance(data["ledger_device"], str) and data["ledger_device"] != "",
         "ledger_device", 'a GPU name as the selfcheck reports it (e.g. "NVIDIA H200"), null or left out')


def _refuse_shared_records(root: Path, folder: Path, data: dict) -> None:
    """Each task has its own main, versions and ledger: a manifest that names another task's is refused, so that no
    command ever records into, or promotes from, another task's records."""
    if folder == (root / TASKS_DIR / DEFAULT_TASK).resolve():  # the default task is never blocked by another's
        return
    mine = {key: Path(data[key]) for key in ("main", "versions", "ledger")}
    others = (root / TASKS_DIR).glob(f"*/{MANIFEST}") if (root / TASKS_DIR).is_dir() else []
    for other in others:
        if other.parent.resolve() == folder:
            continue
        try:
            theirs = json.loads(other.read_text())
        except (OSError, ValueError):
            continue
        shared = [key for key, path in mine.items() if key in theirs and Path(theirs[key]) == path]
        if shared:
            raise TaskError(f"{folder / MANIFEST}: its {', '.join(shared)} ({', '.join(str(mine[k]) for k in shared)}) "
                            f"belong to task {theirs.get('name', other.parent.name)}; give task {data['name']} its own "
                            "(every task has its own main, versions and ledger)")


def resolve_task(root: Path, task: str | None) -> Path:
    """A task's folder: a name under tasks/, else a path to a folder holding task.json (or to task.json)."""
    given = task or DEFAULT_TASK
    named = root / TASKS_DIR / given
    if "/" not in given and (named / MANIFEST).is_file():
        return named.resolve()
    path = Path(given)
    path = path.parent if path.name == MANIFEST else path
    if (path / MANIFEST).is_file():
        return path.resolve()
    known = sorted(p.name for p in (root / TASKS_DIR).iterdir() if (p / MANIFEST).is_file()) \
        if (root / TASKS_DIR).is_dir() else []
    raise TaskError(f"no task {given!r}: give a task name ({', '.join(known) or 'none under tasks/'}) or a folder "
                    f"holding {MANIFEST}")


@dataclass
class RunConfig:
    """One run of the loop, as the CLI resolved it (saved in the run state, so --resume needs nothing else)."""

    iters: int = 20
    """Attempts to make (submits), counting those of earlier sessions of a resumed run."""
    backend: str = "offline"
    """offline, openai or scripted (auto is resolved before this is built)."""
    model: str = ""
    """The model name for the openai backend."""
    panel: str = "visible"
    """visible, smoke or a panel JSON path (without CUDA, visible becomes smoke)."""
    start_from: str = "main"
    """main or vN: what the worktree's candidate starts as."""
    time_limit_min: float | None = None
    """Stop starting new iterations after this many minutes of this session."""
    cost_limit_usd: float | None = None
    """Stop when the proposer's accumulated cost reaches this."""
    script: str | None = None
    """The scripted backend's list of tool calls (a JSON file)."""
    full_check: bool = False
    """Run the task's checks on every correct candidate, not only on those that would be kept."""
    task: str | None = None
    """The task's folder (absolute) as the run resolved it: --resume, report and every hint use it."""
    cuda: bool = False
    """Whether the evaluator runs on a GPU; without it timings are interpreter wall times."""
    workers: list[str] = field(default_factory=list)
    """A parallel run's workers, each the GPU it is pinned to (a CUDA_VISIBLE_DEVICES value; "" for the agent's own
    environment); a GPU named twice is shared. Empty: one attempt at a time, as a plain run."""
    cluster: str | None = None
    """A Dask scheduler's address: the workers are that cluster's (agent/pool.py), not local processes."""
