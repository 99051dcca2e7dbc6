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
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import git

from agent.ledger import pause_at, solution_files

OWN_GIT_S = 60.0
"""The longest one git command of ours runs: an index.lock written later than this after our marker is not ours."""
STALE_LOCK_S = 10.0
"""How long a lock of a dead session of ours must stay untouched before it is removed: a git child can outlive its
killed parent for a moment, and finishes well within this."""
IDENTITY = {"GIT_AUTHOR_NAME": "kloop", "GIT_AUTHOR_EMAIL": "kloop@localhost",
            "GIT_COMMITTER_NAME": "kloop", "GIT_COMMITTER_EMAIL": "kloop@localhost"}


def runs_dir(root: Path) -> Path:
    """Where every run's state lives: workspace/.runs/ (one folder per run id)."""
    return root / "workspace" / ".runs"


def run_state_dir(root: Path, run_id: str) -> Path:
    return runs_dir(root) / run_id


def default_panel(cuda: bool) -> str:
    """The panel a command uses when none is given: visible on a GPU, else smoke (the visible shapes take hours under
    the interpreter)."""
    return "visible" if cuda else "smoke"


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
    """Make ``target``'s .py files exactly ``source``'s (a new task's first main: the folder made)."""
    target.mkdir(parents=True, exist_ok=True)
    for path in solution_files(target):
        path.unlink()
    for path in solution_files(source):
        shutil.copy2(path, target / path.name)


class Workspace:
    def __init__(self, root: Path, run_id: str, candidate_dir: str):
        self.root, self.run_id, self.candidate_rel = root, run_id, candidate_dir
        self.path = root / "workspace" / run_id
        self.state_dir = run_state_dir(root, run_id)
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

    @property
    def git_marker(self) -> Path:
        """Holds our pid while a git command of this run may be running in the worktree: an index.lock left with it,
        and that pid gone, is ours to remove."""
        return self.state_dir / "git.pid"

    @contextlib.contextmanager
    def _git(self) -> Iterator[git.Repo]:
        repo = git.Repo(self.path)
        self._clear_stale_lock(Path(repo.git_dir) / "index.lock")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.git_marker.write_text(f"{os.getpid()}\n")
        try:
            yield repo
        finally:  # git has exited (GitPython waits for it): no lock of ours is held any more
            self.git_marker.unlink(missing_ok=True)

    def _clear_stale_lock(self, lock: Path) -> None:
        """Remove an index.lock that a git command of a killed session of this run left behind: our marker names a
        process that is gone and the lock was written while that command ran. Any other lock is refused, never
        removed: it may be held by a live git process."""
        if not lock.exists():
            return
        owner = self.git_marker.read_text().strip() if self.git_marker.is_file() else ""
        written = lock.stat().st_mtime
        if (not owner.isdigit() or int(owner) == os.getpid() or pid_alive(int(owner))
                or not self.git_marker.stat().st_mtime - 1 <= written <= self.git_marker.stat().st_mtime + OWN_GIT_S):
            raise RuntimeError(f"{lock} exists and was not left by a killed session of run {self.run_id}: another "
                               f"git process may hold it. Remove it once no git command runs in {self.path}, then "
                               f"resume.")
        before = lock.stat()
        time.sleep(max(0.0, written + STALE_LOCK_S - time.time()))
        after = lock.stat() if lock.exists() else None
        if after is not None and (after.st_ino, after.st_mtime_ns) != (before.st_ino, before.st_mtime_ns):
            raise RuntimeError(f"{lock} changed while it was judged stale: a git process holds it; resume later")
        lock.unlink(missing_ok=True)

    def commit(self, message: str) -> str:
        with self._git() as repo:
            repo.git.add("-A", "--", self.candidate_rel)
            pause_at("commit")
            with repo.git.custom_environment(**{k: v for k, v in IDENTITY.items() if k not in os.environ}):
                repo.git.commit("--allow-empty", "--no-verify", "-m", message)
            return repo.head.commit.hexsha

    def has_commit(self, version: str) -> bool:
        """Whether the run's branch holds the commit of ``version`` (its message is the version's ledger row)."""
        for subject in git.Repo(self.path).git.log("--format=%s", self.branch).splitlines():
            if subject.startswith(f"| {version} |"):
                return True
            if subject.startswith(f"start run {self.run_id} "):
                return False
        return False

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
    eval_limit_s: float | None = None  # each evaluator stage's time limit on the panel (None: the task's)

    def save(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        tmp = state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(state_dir / "state.json")  # atomic: a kill never leaves half a state

    @classmethod
    def load(cls, state_dir: Path) -> "RunState":
        path = state_dir / "state.json"
        if not path.is_file():
            raise FileNotFoundError(f"no run state at {path}; `.venv/bin/python -m agent status` lists the runs")
        return cls(**json.loads(path.read_text()))


def all_runs(root: Path) -> list[RunState]:
    folder = runs_dir(root)
    return ([RunState.load(p) for p in sorted(folder.iterdir()) if (p / "state.json").is_file()]
            if folder.is_dir() else [])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


def clean(root: Path, mine=lambda state: True) -> list[str]:
    """Remove the worktrees of runs that are over and ``mine`` (their branches, versions and rows stay); prune stale
    entries. Stopped runs (a limit, Ctrl-C) and killed ones keep their worktrees: `--resume` continues them."""
    removed = []
    for state in filter(mine, all_runs(root)):
        workspace = Workspace(root, state.run_id, "")
        if workspace.path.exists() and state.status in ("finished", "failed"):
            workspace.remove()
            removed.append(state.run_id)
    with workspace_lock(root):
        git.Repo(root).git.worktree("prune")
    return removed
