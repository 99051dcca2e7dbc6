"""Per-run git worktrees (GitPython): workspace/<run-id> on branch runs/<run-id>, one commit per attempt.

Run state lives beside them in workspace/.runs/<run-id>/ (ignored by git, outside any worktree), written after
every step so that a killed run can be resumed.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import git

from agent.ledger import solution_files

IDENTITY = {"GIT_AUTHOR_NAME": "kloop", "GIT_AUTHOR_EMAIL": "kloop@localhost",
            "GIT_COMMITTER_NAME": "kloop", "GIT_COMMITTER_EMAIL": "kloop@localhost"}


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + os.urandom(2).hex()


@contextlib.contextmanager
def workspace_lock(root: Path) -> Iterator[None]:
    """git takes its own locks; ours serializes worktree add/remove so two runs started at once wait, not fail."""
    (root / "workspace").mkdir(exist_ok=True)
    with open(root / "workspace" / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def replace_solution(target: Path, source: Path) -> None:
    """Make ``target``'s .py files exactly ``source``'s."""
    for path in solution_files(target):
        path.unlink()
    for path in solution_files(source):
        shutil.copy2(path, target / path.name)


class Workspace:
    def __init__(self, root: Path, run_id: str, candidate_dir: str):
        self.root, self.run_id, self.candidate_rel = root, run_id, candidate_dir
        self.path = root / "workspace" / run_id
        self.state_dir = root / "workspace" / ".runs" / run_id
        self.branch = f"runs/{run_id}"

    @property
    def candidate(self) -> Path:
        return self.path / self.candidate_rel

    def create(self, start: Path) -> None:
        """A new worktree whose candidate is ``start``'s files (the main checkout's, uncommitted changes included)."""
        if self.path.exists():
            raise FileExistsError(f"{self.path} exists; pick another run id or --resume {self.run_id}")
        with workspace_lock(self.root):
            git.Repo(self.root).git.worktree("add", "-b", self.branch, str(self.path), "HEAD")
        self.candidate.mkdir(parents=True, exist_ok=True)
        replace_solution(self.candidate, start)
        self.commit(f"start run {self.run_id} from {start.relative_to(self.root)}")

    def commit(self, message: str) -> str:
        repo = git.Repo(self.path)
        repo.git.add("-A", "--", self.candidate_rel)
        with repo.git.custom_environment(**{k: v for k, v in IDENTITY.items() if k not in os.environ}):
            repo.git.commit("--allow-empty", "--no-verify", "-m", message)
        return repo.head.commit.hexsha

    def remove(self) -> None:
        with workspace_lock(self.root):
            git.Repo(self.root).git.worktree("remove", "--force", str(self.path))


@dataclass
class RunState:
    """Everything a resumed run needs; the best-so-far is always here and in the ledger."""

    run_id: str
    config: dict
    status: str = "running"  # running, finished, stopped (limits, Ctrl-C) or failed
    pid: int = 0
    attempts: int = 0
    started: str = ""
    start_label: str = "main"
    best_label: str = "main"
    best_score: float | None = None
    best_is_baseline: bool = False
    tokens: int = 0
    cost_usd: float = 0.0
    wall_s: float = 0.0
    history: list[dict] = field(default_factory=list)
    last_verdict: dict | None = None
    stop_reason: str = ""  # why the last session stopped (limits, the search exhausted, Ctrl-C)

    def save(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(state_dir / "state.json")  # atomic: a kill never leaves half a state

    @classmethod
    def load(cls, state_dir: Path) -> "RunState":
        path = state_dir / "state.json"
        if not path.is_file():
            raise FileNotFoundError(f"no run state at {path}; `python -m agent status` lists the runs")
        return cls(**json.loads(path.read_text()))


def all_runs(root: Path) -> list[RunState]:
    runs_dir = root / "workspace" / ".runs"
    return ([RunState.load(p) for p in sorted(runs_dir.iterdir()) if (p / "state.json").is_file()]
            if runs_dir.is_dir() else [])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


def clean(root: Path) -> list[str]:
    """Remove the worktrees of runs that are over (their branches, versions and rows stay); prune stale entries.
    Stopped runs (a limit, Ctrl-C) and killed ones keep their worktrees: `--resume` continues them."""
    removed = []
    for state in all_runs(root):
        workspace = Workspace(root, state.run_id, "")
        if workspace.path.exists() and state.status in ("finished", "failed"):
            workspace.remove()
            removed.append(state.run_id)
    with workspace_lock(root):
        git.Repo(root).git.worktree("prune")
    return removed
