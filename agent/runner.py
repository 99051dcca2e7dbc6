"""Run one command in its own session with a time limit; on expiry kill the whole process group.

Candidate code runs only in such subprocesses, so that a crash, a hang or a kill costs one attempt, never the run.
The group dies with the agent too (``lifeline.py``): a killed run leaves no evaluator behind.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

LIFELINE = Path(__file__).with_name("lifeline.py")
OUTPUT_LIMIT = 20_000  # characters of output kept: enough for a traceback, small enough for a prompt


def clip(text: str, limit: int = OUTPUT_LIMIT) -> str:
    return text if len(text) <= limit else f"[... {len(text) - limit} characters cut ...]\n" + text[-limit:]


def python_env(root: Path, cuda: bool, gpu: str = "") -> dict[str, str]:
    """The evaluator imports from the main checkout; without CUDA it runs under the Triton interpreter. ``gpu`` (a
    CUDA_VISIBLE_DEVICES value) pins a parallel run's worker to its GPU; empty, the agent's own environment holds."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if not cuda:
        env["TRITON_INTERPRET"] = "1"
    if gpu:  # numbered as nvidia-smi numbers them (--gpus all reads its list)
        env["CUDA_DEVICE_ORDER"], env["CUDA_VISIBLE_DEVICES"] = "PCI_BUS_ID", gpu
    env.pop("KLOOP_SCRIPT", None)
    env.pop("KLOOP_PAUSE_AT", None)  # the agent's test-only pause hook: nothing of the evaluator's business
    return env


# The process groups run_command has started and not yet reaped, on any thread, each under its thread's job label
# (``job``); the labels whose commands are stopped ("" stops every one).
_RUNNING: dict[int, str] = {}
_STOPPED: set[str] = set()
_LOCK = threading.Lock()
_JOB = threading.local()


@contextlib.contextmanager
def job(label: str) -> Iterator[None]:
    """The commands this thread runs belong to ``label`` (a parallel run's job) until the block ends."""
    _JOB.label = label
    try:
        yield
    finally:
        _JOB.label = None


def kill_running(label: str | None = None) -> None:
    """Kill the process groups run_command is waiting on (those of job ``label``; None: every one), and start no
    more of them: a parallel run's workers wait in threads of their own, which an interrupt of the main thread never
    reaches, and a stage that ends goes on to the next."""
    with _LOCK:
        _STOPPED.add(label or "")
        pids = [pid for pid, owner in _RUNNING.items() if label is None or owner == label]
    for pid in pids:
        _kill_group(pid)


def run_command(args: list[str], cwd: Path, timeout_s: float, env: dict[str, str] | None = None) -> dict:
    """``{"output", "returncode", "timed_out"}``; a timeout is returncode 124 and a signal death -signum. The group's
    leader is ``lifeline.py``, which kills the group if the agent dies first (Linux tells it when the thread that
    started it exits: this call holds the calling thread until the group is gone)."""
    label = getattr(_JOB, "label", None) or ""
    with _LOCK:
        if "" in _STOPPED or label in _STOPPED:
            return {"output": "[not started: the run is stopping]", "returncode": -signal.SIGKILL,
                    "timed_out": False}
        process = subprocess.Popen([sys.executable, "-I", str(LIFELINE), str(os.getpid()), *args], cwd=cwd, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                   start_new_session=True)
        _RUNNING[process.pid] = label
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        output, _ = process.communicate()
        return {"output": clip(output + f"\n[killed: no result within {timeout_s:g} s; "
                                        "the whole process group was killed]"),
                "returncode": 124, "timed_out": True}
    except BaseException:  # Ctrl-C or anything else: never leave the group running
        _kill_group(process.pid)
        process.wait()
        raise
    finally:
        # a finished leader may leave children in its group (compile workers, a stuck grandchild)
        _kill_group(process.pid)
        with _LOCK:
            _RUNNING.pop(process.pid, None)
    if process.returncode < 0:
        try:
            name = signal.Signals(-process.returncode).name
        except ValueError:  # a real-time signal has no name
            name = str(-process.returncode)
        output += f"\n[the process died of signal {name}]"
    return {"output": clip(output), "returncode": process.returncode, "timed_out": False}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def python_command(module_args: tuple[str, ...] | list[str], *args: str) -> list[str]:
    return [sys.executable, *module_args, *args]
