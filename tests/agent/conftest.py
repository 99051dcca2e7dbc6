"""A throwaway copy of the project (its working tree, uncommitted files included) as a fresh git repository, so that
runs of `python -m agent` create versions, rows and worktrees there and never in the real methods/."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent import ledger
from agent.config import Task
from agent.ledger import ATTEMPT_ROW
from tests.conftest import TOY, TOY_SHIPPED

ROOT = Path(__file__).resolve().parent.parent.parent
COPIED = ("agent", "evals", "methods", "prompts", "tasks", "pyproject.toml", ".gitignore")
IGNORED = shutil.ignore_patterns("__pycache__", ".lock", "*.pyc")
# one tiny case keeps an attempt to a few seconds under the interpreter
ONE_CASE = {"cases": [{"stratum": "balanced", "m": 19, "k": 256, "n": 256, "epilogue": "silu", "seed": 1}]}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path)


def make_project(tmp_path: Path) -> Path:
    """``tmp_path``/kloop: the project's copy, committed, v0 its only version and its main; ``tmp_path``/panel.json:
    one case."""
    copy = tmp_path / "kloop"
    copy.mkdir()
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=IGNORED)
        elif source.is_file():
            shutil.copy2(source, copy / name)
    for entry in (copy / "methods" / "versions").iterdir():  # keep the yardstick only: runs of the real repo stay out
        if entry.name != "v0" and entry.is_dir():
            shutil.rmtree(entry)
    for segment in (copy / "methods" / "versions").glob("index*.jsonl"):
        segment.unlink()
    # methods/main is v0 here, whatever the real one holds: these tests drive the loop's mechanics through v0's
    # one-file kernel and its knobs; test_run_offline runs the loop from the real, promoted main
    main = copy / "methods" / "main"
    shutil.rmtree(main)
    main.mkdir()
    shutil.copy2(copy / "methods" / "versions" / "v0" / "solution.py", main / "solution.py")
    ledger = copy / "methods" / "experiment_log.md"
    ledger.write_text("".join(line for line in ledger.read_text().splitlines(keepends=True)  # the header stays
                              if not (ATTEMPT_ROW.match(line) or line.startswith("| promote v"))
                              or line.startswith("| v0 |")))
    (copy / "workspace").mkdir()
    (copy / "workspace" / ".gitkeep").touch()
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost"]
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
    subprocess.run(git + ["add", "-A"], cwd=copy, check=True)
    subprocess.run(git + ["commit", "-qm", "fixture"], cwd=copy, check=True)
    (tmp_path / "panel.json").write_text(json.dumps(ONE_CASE))
    return copy


@pytest.fixture
def panel(project: Path) -> Path:
    return project.parent / "panel.json"


def agent_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "KLOOP_"))}
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONUNBUFFERED", None)  # buffered, as a user's shell runs it: a closed pipe shows at the flush
    return env | extra


def agent_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "agent", *args]


def run_agent(project: Path, *args: str, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run(agent_command(*args), cwd=project, env=agent_env(**env), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"agent {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def manifest(project: Path, task: str = "w4a16") -> dict:
    return json.loads((project / "tasks" / task / "task.json").read_text())


def ledger_rows(project: Path, task: str = "w4a16") -> list[str]:
    """The attempt rows of the task's ledger (none before its first attempt)."""
    path = project / manifest(project, task)["ledger"]
    return [line for line in path.read_text().splitlines() if ATTEMPT_ROW.match(line)] if path.is_file() else []


def index(project: Path, task: str = "w4a16") -> list[dict]:
    """The task's index entries, each with its verdict (read from its snapshot, as the loop reads them)."""
    return ledger.index_entries(Task.load(project, task))


def add_toy_task(project: Path) -> None:
    """The toy task as the repository ships it, committed at tests/toy_task in ``project``."""
    shutil.copytree(TOY, project / "tests" / "toy_task", ignore=TOY_SHIPPED)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost"]
    subprocess.run(git + ["add", "-A"], cwd=project, check=True)
    subprocess.run(git + ["commit", "-qm", "the toy task"], cwd=project, check=True)


def add_task(project: Path, name: str, **fields: object) -> Path:
    """tasks/``name``/, committed: W4A16's manifest (its adapter, spec and panels) under another name, with records of
    its own under its folder (main and versions/v0 copies of v0, a ledger its first row starts), ``fields`` replacing
    the manifest's."""
    data = manifest(project) | {"name": name, "main": f"tasks/{name}/main", "versions": f"tasks/{name}/versions",
                                "ledger": f"tasks/{name}/experiment_log.md", "readable": []} | fields
    folder = project / "tasks" / name
    folder.mkdir()
    (folder / "task.json").write_text(json.dumps(data, indent=2) + "\n")
    for key in ("main", "versions"):
        if not (project / data[key]).exists():
            (project / data[key]).mkdir(parents=True)
    if not (project / data["versions"] / "v0").exists():
        shutil.copytree(project / "methods" / "versions" / "v0", project / data["versions"] / "v0")
    if not (project / data["main"] / "solution.py").exists():
        shutil.copy2(project / "methods" / "versions" / "v0" / "solution.py", project / data["main"] / "solution.py")
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost"]
    subprocess.run(git + ["add", "-A"], cwd=project, check=True)
    subprocess.run(git + ["commit", "-qm", f"task {name}"], cwd=project, check=True)
    return folder


def runs(project: Path) -> list[dict]:
    runs_dir = project / "workspace" / ".runs"
    # a run's directory exists a moment before its first state.json (written whole, by rename)
    return ([json.loads((p / "state.json").read_text()) for p in sorted(runs_dir.iterdir())
             if (p / "state.json").is_file()] if runs_dir.is_dir() else [])
