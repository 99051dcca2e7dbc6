"""agent.runner: a command's result and time limit, and its whole process group dying with the agent (real
processes: an agent process, its evaluator command, and that command's own child)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.runner import LIFELINE, run_command

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


def in_group(pid: int, group: int) -> bool:
    try:
        return alive(pid) and os.getpgid(pid) == group
    except ProcessLookupError:
        return False


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def wait_for(path: Path, seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while True:
        if path.is_file() and path.read_text():
            return path.read_text()
        if time.monotonic() >= deadline:
            raise AssertionError(f"{path} never appeared: the command did not start its child in time")
        time.sleep(0.05)


def all_dead(pids: list[int], seconds: float = 15) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def test_a_command_reports_its_output_status_and_signal(tmp_path: Path):
    done = run_command([sys.executable, "-c", "print('out'); import sys; sys.exit(3)"], tmp_path, 60)
    assert done == {"output": "out\n", "returncode": 3, "timed_out": False}
    segv = "import os, resource, signal; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); os.kill(os.getpid(), 11)"
    done = run_command([sys.executable, "-c", segv], tmp_path, 60)
    assert done["returncode"] == -signal.SIGSEGV and "died of signal SIGSEGV" in done["output"]
    assert not (tmp_path / "core").exists(), "a core file of the group's leader"


@linux_only
def test_a_timeout_kills_the_command_and_its_children(tmp_path: Path):
    done = run_command([sys.executable, "-c", COMMAND], tmp_path, 20)  # room to start three processes on a busy CI
    assert done["timed_out"] and done["returncode"] == 124 and "process group was killed" in done["output"]
    pids = [int(p) for p in wait_for(tmp_path / "pids", 0).split()]
    assert all_dead(pids) == [], "the command or its child outlived the time limit"


@linux_only
def test_a_killed_agent_takes_its_evaluator_and_the_evaluators_children_along(tmp_path: Path):
    agent = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from agent.runner import run_command; "
                               f"run_command([sys.executable, '-c', {COMMAND!r}], Path('.'), 300)"],
        cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    group = None
    try:
        command, child = (int(p) for p in wait_for(tmp_path / "pids").split())
        group, leader = os.getpgid(command), parent_of(command)
        assert leader == group != agent.pid and parent_of(leader) == agent.pid, "the command runs under the leader"
        assert alive(command) and alive(child)
        agent.kill()  # kill -9: the agent runs no cleanup of its own
        agent.wait()
        assert all_dead([leader, command, child]) == [], "an evaluator process outlived the agent"
    finally:
        agent.kill()
        agent.wait()
        if group is not None and any(in_group(pid, group) for pid in (command, child)):
            os.killpg(group, signal.SIGKILL)  # what the lifeline should have done


@linux_only
def test_an_agent_gone_before_the_leader_runs_leaves_no_command(tmp_path: Path):
    """The agent dies between starting the leader and the leader's request for a death signal: the leader sees its
    parent is no longer the agent and kills the group before the command starts (or anything it would write)."""
    late = "import pathlib, time; time.sleep(2); pathlib.Path('late').write_text('ran')"
    starter = ("import os, subprocess, sys; "
               f"subprocess.Popen([sys.executable, '-I', {str(LIFELINE)!r}, str(os.getpid()), sys.executable, '-c', "
               f"{late!r}], start_new_session=True); os._exit(0)")
    subprocess.run([sys.executable, "-c", starter], cwd=tmp_path, check=True)
    time.sleep(6)
    assert not (tmp_path / "late").exists(), "the command ran on after its agent had gone"


@linux_only
def test_a_sigterm_to_the_leader_while_the_agent_lives_is_the_commands(tmp_path: Path):
    """Only the agent's death kills the group: a SIGTERM sent to the leader otherwise reaches the command, which
    handles it as it likes (here: says so and exits 0)."""
    command = ("import os, signal, sys, time; from pathlib import Path\n"
               "signal.signal(signal.SIGTERM, lambda *_: (print('term', flush=True), sys.exit(0)))\n"
               "Path('pids').write_text(str(os.getpid()))\n"
               "time.sleep(120)\n")

    def terminate_leader():
        os.kill(parent_of(int(wait_for(tmp_path / "pids"))), signal.SIGTERM)

    sender = threading.Thread(target=terminate_leader)
    sender.start()
    done = run_command([sys.executable, "-c", command], tmp_path, 120)
    sender.join()
    assert done == {"output": "term\n", "returncode": 0, "timed_out": False}
