"""Crash consistency: a run killed with SIGKILL at any write boundary, then resumed, loses, repeats and orphans no
attempt: one row, one index line, one vN and one commit on the run's branch per attempt, and the run state agrees."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import git
import pytest

from agent.workspace import Workspace
from tests.agent.conftest import agent_command, agent_env, index, ledger_rows, run_agent, runs

# every boundary between the writes of one attempt, in the order they are written (ledger.record, Workspace.commit,
# Run.attempt); "commit" is inside the commit, between git add and git commit
POINTS = ("snapshot", "row", "index", "recorded", "committed", "commit")


def pause_and_kill(project: Path, args: list[str], point: str, log: Path) -> None:
    """Start `python -m agent` with the pause hook at ``point``, wait until it stops there, kill -9 it."""
    with open(log, "w") as stderr:
        process = subprocess.Popen(agent_command(*args), cwd=project, env=agent_env(KLOOP_PAUSE_AT=point),
                                   stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 180
    try:
        while f"paused at {point}" not in log.read_text():
            assert process.poll() is None, f"the run ended before {point}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the run never reached {point}:\n{log.read_text()}"
            time.sleep(0.2)
    finally:
        process.kill()
        process.wait()


def test_a_run_killed_at_every_boundary_resumes_with_one_record_per_attempt(project: Path, panel: Path):
    source = (project / "methods" / "main" / "solution.py").read_text() + "\n# a trivial edit: the same candidate\n"
    iters = len(POINTS) + 1
    script = project.parent / "script.json"
    edit = {"tool": "write_file", "args": {"path": "methods/main/solution.py", "content": source}}
    submit = {"tool": "submit", "args": {"summary": "trivial", "hypothesis": "none"}}
    script.write_text(json.dumps([edit, submit] * iters))
    log = project.parent / "stderr.txt"
    pause_and_kill(project, ["run", "--iters", str(iters), "--backend", "scripted", "--script", str(script),
                             "--panel", str(panel)], POINTS[0], log)
    (state,) = runs(project)
    run_id = state["run_id"]
    assert state["attempts"] == 0 and (project / "methods" / "versions" / "v1" / "pending.json").is_file()
    assert len(ledger_rows(project)) == 1, "killed after the snapshot, before its row"
    workspace = Workspace(project, run_id, "methods/main")
    # each resumed session first finishes what the last kill left half-done, then is killed at the next boundary of
    # its own next attempt
    for point in POINTS[1:]:
        pause_and_kill(project, ["run", "--resume", run_id], point, log)
    # the last kill came between git add and git commit: plant the index.lock that git commit would have left
    marker = workspace.state_dir / "git.pid"
    assert marker.is_file(), "the killed commit left no marker naming its process"
    lock = Path(git.Repo(workspace.path).git_dir) / "index.lock"
    lock.touch()
    then = time.time() - 30
    os.utime(marker, (then, then))
    os.utime(lock, (then, then))

    run_agent(project, "run", "--resume", run_id)
    (state,) = runs(project)
    assert state["status"] == "finished" and state["attempts"] == iters
    assert 120 <= state["eval_limit_s"] <= 900, "the evaluation limit follows the panel (the start's selfcheck)"
    versions = [f"v{n}" for n in range(1, iters + 1)]
    entries = index(project)
    assert [e["version"] for e in entries] == versions
    assert [e["iteration"] for e in entries] == list(range(1, iters + 1)), "an attempt was lost or made twice"
    rows = ledger_rows(project)[1:]
    assert [row.split(" | ")[0] for row in rows] == [f"| {v}" for v in versions]
    assert [h["version"] for h in state["history"]] == versions
    kept = [e["version"] for e in entries if e["keep"]]
    assert state["best_label"] == (kept[-1] if kept else state["start_label"])
    for version in versions:
        assert sorted(p.name for p in (project / "methods" / "versions" / version).iterdir()) == [
            "parent.patch", "solution.py", "verdict.json"]
    assert not list((project / "methods" / "versions").glob(".staging-*"))
    repo = git.Repo(project)
    subjects = [c.message.strip() for c in repo.iter_commits(f"runs/{run_id}", max_count=iters + 1)][::-1]
    assert subjects[0].startswith(f"start run {run_id}") and subjects[1:] == rows, "one commit per attempt, in order"
    assert not lock.exists() and not marker.exists()
    best = project / "methods" / "versions" / state["best_label"]
    if state["best_label"].startswith("v"):  # the worktree is back at the best, whatever the last attempt wrote
        assert (workspace.candidate / "solution.py").read_text() == (best / "solution.py").read_text()


def test_an_index_lock_not_left_by_a_killed_session_is_never_removed(project: Path):
    workspace = Workspace(project, "locks", "methods/main")
    workspace.create(project / "methods" / "main")
    lock = Path(git.Repo(workspace.path).git_dir) / "index.lock"
    lock.touch()  # another git process in the worktree: no marker of ours
    with pytest.raises(RuntimeError, match="another git process may hold it"):
        workspace.commit("refused")
    assert lock.exists()
    workspace.git_marker.write_text(f"{os.getpid()}\n")  # a live process of ours: its git may be running now
    with pytest.raises(RuntimeError, match="was not left by a killed session"):
        workspace.commit("refused")
    assert lock.exists()
    gone = subprocess.Popen(["true"])
    gone.wait()
    workspace.git_marker.write_text(f"{gone.pid}\n")  # a dead session's marker, but a lock written long after it
    then = time.time() - 600
    os.utime(workspace.git_marker, (then, then))
    with pytest.raises(RuntimeError):
        workspace.commit("refused")
    assert lock.exists()
    os.utime(lock, (then + 1, then + 1))  # written while that session's git ran: ours, stale
    workspace.commit("after a killed session")
    assert not lock.exists() and git.Repo(workspace.path).head.commit.message.strip() == "after a killed session"
