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


@dataclass
class Task:
    """The task the loop optimizes, as data: where the candidate lives and how the evaluator is run."""

    root: Path
    """The main checkout: methods/, the ledger and the evaluator live here."""
    candidate_dir: str = "methods/main"
    """The solution directory, relative to a checkout (the worktree's copy is the one the agent edits)."""
    versions_dir: str = "methods/versions"
    """Where every attempt is snapshotted as vN/."""
    ledger: str = "methods/experiment_log.md"
    """The append-only ledger."""
    spec: str = "prompts/task_spec.md"
    """The task's spec as the agent may read it (a copy; the evaluator's own files stay out of reach)."""
    baseline_version: str = "v0"
    """The yardstick version speedups are measured against."""
    eval_timeout_s: float = field(default_factory=lambda: float(os.environ.get("KLOOP_EVAL_TIMEOUT", "900")))
    """Wall-clock limit of each evaluator subprocess; on expiry its whole process group is killed. A run lowers it for
    its attempts to follow the panel (agent.evaluate.panel_limit)."""
    policy_cmd: tuple[str, ...] = ("-m", "evals.policy")
    gates_cmd: tuple[str, ...] = ("-m", "evals.verifier", "--gates-only", "--jobs", "3")  # untimed: 3 cases at once
    verify_cmd: tuple[str, ...] = ("-m", "evals.verifier")  # the full judge, three timed roles per case
    selfcheck_cmd: tuple[str, ...] = ("-m", "evals.selfcheck")
    residency_cmd: tuple[str, ...] = ("-m", "evals.residency")
    profile_cmd: tuple[str, ...] = ("-m", "evals.profile")
    qualify_cmd: tuple[str, ...] = ("-m", "evals.qualify", "--repeats", "1", "--schedules", "spec")
    """Times the candidate under the verifier's own candidate schedule and says whether every 11-group vector stays
    within the verifier's max/min limit; CUDA only (the agent never runs it under the interpreter)."""
    cases_cmd: tuple[str, ...] = ("-m", "evals.selfcheck", "--list-cases")
    """Lists a panel's cases (``--panel P`` appended), exit 2 when it is not a panel: run before a run starts, so that
    a bad panel is refused before anything is written."""

    @classmethod
    def load(cls, root: Path, task_file: str | None) -> "Task":
        """The default task, with the fields of ``task_file`` (JSON) replacing defaults; unknown fields are errors."""
        data = json.loads(Path(task_file).read_text()) if task_file else {}
        if "root" in data:
            raise ValueError(f"{task_file}: root is where the agent is installed and cannot be set")
        data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return from_dict(cls, {"root": root, **data})

    @property
    def versions(self) -> Path:
        return self.root / self.versions_dir

    @property
    def ledger_path(self) -> Path:
        return self.root / self.ledger


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
    """Run the residency guard and the gates on every correct candidate, not only on those that would be kept."""
    task_file: str | None = None
    """A JSON object of Task fields that replace the defaults (another task, other evaluator commands)."""
    cuda: bool = False
    """Whether the evaluator runs on a GPU; without it timings are interpreter wall times."""
