"""agent.runner: a command's result and time limit, and its whole process group dying with the agent (real
processes: an agent process, its evaluator command, and that command's own child)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.runner import run_command

ROOT = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="reads process states from /proc (Linux); the death signal is Linux's too")

# an evaluator-like command: starts a child of its own, writes both pids, then works for two minutes
COMMAND = """
import os, subprocess, sys, time
from pathlib import Path
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
Path("pids").write_text(f"{os.getpid()} {child.pid}")
time.sleep(120)
"""


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie (dead, not yet reaped by whoever inherited it) counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def wait_for(path: Path, seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def all_dead(pids: list[int], seconds: float = 15) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def test_a_command_reports_its_output_status_and_signal(tmp_path: Path):
    done = run_command([sys.executable, "-c", "print('out'); import sys; sys.exit(3)"], tmp_path, 60)
    assert done == {"output": "out\n", "returncode": 3, "timed_out": False}
    done = run_command([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"], tmp_path, 60)
    assert done["returncode"] == -signal.SIGSEGV and "died of signal SIGSEGV" in done["output"]


@linux_only
def test_a_timeout_kills_the_command_and_its_children(tmp_path: Path):
    done = run_command([sys.executable, "-c", COMMAND], tmp_path, 5)
    assert done["timed_out"] and done["returncode"] == 124 and "process group was killed" in done["output"]
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert all_dead(pids) == [], "the command or its child outlived the time limit"


@linux_only
def test_a_killed_agent_takes_its_evaluator_and_the_evaluators_children_along(tmp_path: Path):
    agent = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from agent.runner import run_command; "
                               f"run_command([sys.executable, '-c', {COMMAND!r}], Path('.'), 300)"],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        command, child = (int(p) for p in wait_for(tmp_path / "pids").split())
        leader = parent_of(command)
        assert leader != agent.pid and parent_of(leader) == agent.pid, "the command runs under the group's leader"
        assert alive(command) and alive(child)
        agent.kill()  # kill -9: the agent runs no cleanup of its own
        agent.wait()
        assert all_dead([leader, command, child]) == [], "an evaluator process outlived the agent"
    finally:
        agent.kill()
        for pid in [int(p) for p in (tmp_path / "pids").read_text().split()] if (tmp_path / "pids").is_file() else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
