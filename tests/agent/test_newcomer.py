"""A newcomer's first hour: bad input is refused with one line and exit 2 before anything is written (no
run state, worktree, branch, row or version), every message says what to do, and what does run says why it stopped.

Each test drives the CLI as a person would, in a real subprocess of a throwaway copy of the project."""
from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent import ledger
from agent.config import Task
from tests.agent.conftest import agent_command, agent_env, index, ledger_rows, make_project, run_agent, runs

ROOT = Path(__file__).resolve().parent.parent.parent


def agent(project: Path, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """The CLI as a person runs it, whatever its exit status."""
    return subprocess.run(agent_command(*args), cwd=project, env=agent_env(**env), capture_output=True, text=True,
                          timeout=timeout)


def git(project: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=project, capture_output=True, text=True, check=True).stdout


def written(project: Path) -> dict:
    """Everything bad input must leave alone: the ledger and methods/ byte for byte, run state, worktrees, branches."""
    methods = project / "methods"
    runs_dir = project / "workspace" / ".runs"
    return {"files": {p.relative_to(methods).as_posix(): p.read_bytes() for p in sorted(methods.rglob("*"))
                      if p.is_file() and p.name != ".lock" and "__pycache__" not in p.parts},
            "runs": sorted(p.name for p in runs_dir.iterdir()) if runs_dir.is_dir() else [],
            "worktrees": git(project, "worktree", "list", "--porcelain"),
            "branches": git(project, "branch", "--list", "--all")}


def refused(done: subprocess.CompletedProcess, *words: str) -> str:
    """Exit 2 and one line on stderr that holds ``words``; the line comes back."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


def test_a_bad_panel_start_or_backend_is_refused_before_anything_is_written(project: Path, panel: Path):
    malformed, empty = project.parent / "malformed.json", project.parent / "empty.json"
    malformed.write_text('{"cases": [')
    empty.write_text('{"cases": []}')
    before = written(project)
    solution = project / "methods" / "main" / "solution.py"
    bad = [(["run", "--iters", "1", "--panel", str(malformed)], ("malformed.json", "panel")),
           (["run", "--iters", "1", "--panel", str(empty)], ("empty.json", "no cases")),
           (["run", "--iters", "1", "--panel", str(project.parent / "absent.json")], ("absent.json",)),
           (["run", "--iters", "1", "--panel", str(panel), "--from", "v9999"],
            ("--from v9999", "an existing version of task w4a16", "methods/versions/v9999/solution.py")),
           (["run", "--iters", "1", "--panel", str(panel), "--backend", "scripted"], ("--script",)),
           (["submit", str(solution), "--summary", "s", "--panel", str(malformed)], ("malformed.json",))]
    for args, words in bad:
        refused(agent(project, *args), *words)
        assert written(project) == before, f"{args} wrote something"
    assert len(ledger_rows(project)) == 1 and not index(project)


@pytest.mark.parametrize("iters", ["0", "-1"])
def test_fewer_than_one_iteration_is_refused(project: Path, panel: Path, iters: str):
    before = written(project)
    done = agent(project, "run", "--iters", iters, "--panel", str(panel))
    assert done.returncode == 2 and "--iters" in done.stderr and "at least 1" in done.stderr, done.stderr
    assert written(project) == before and not (project / "reports").exists()


@pytest.mark.parametrize("limit", [("--time-limit", "0"), ("--time-limit", "-5"), ("--time-limit", "nan"),
                                   ("--cost-limit", "0"), ("--cost-limit", "inf"), ("--time-limit", "ten")])
def test_a_limit_that_is_not_above_zero_is_refused(project: Path, panel: Path, limit: tuple[str, str]):
    before = written(project)
    done = agent(project, "run", "--iters", "1", "--panel", str(panel), *limit)
    assert done.returncode == 2 and limit[0] in done.stderr and "above 0" in done.stderr, done.stderr
    assert written(project) == before and not (project / "reports").exists()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_endpoint_is_refused_at_once(project: Path, panel: Path):
    before = written(project)
    url = f"http://127.0.0.1:{closed_port()}/v1"
    started = time.monotonic()
    done = agent(project, "run", "--iters", "1", "--backend", "openai", "--model", "m", "--panel", str(panel),
                 OPENAI_BASE_URL=url, OPENAI_API_KEY="test")
    line = refused(done, url, "--backend offline")
    assert time.monotonic() - started < 60, "the probe retried instead of failing at once"
    assert "OPENAI_BASE_URL" in line
    assert written(project) == before


class FailingEndpoint(ThreadingHTTPServer):
    """Answers the model list (so the probe before the first attempt passes), then fails every completion."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), FailingHandler)
        self.completions = 0


class FailingHandler(BaseHTTPRequestHandler):
    server: FailingEndpoint

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._reply(200, {"object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "t"}]})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.completions += 1
        self._reply(503, {"error": {"message": "the model is loading"}})

    def log_message(self, *args) -> None:
        pass


def test_an_endpoint_that_fails_mid_run_ends_it_without_timing_the_unchanged_candidate(project: Path, panel: Path):
    server = FailingEndpoint()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = agent(project, "run", "--iters", "2", "--backend", "openai", "--model", "m", "--panel", str(panel),
                     timeout=240, OPENAI_BASE_URL=f"http://127.0.0.1:{server.server_port}/v1", OPENAI_API_KEY="t",
                     KLOOP_RETRY_BASE_S="0.01")
    finally:
        server.shutdown()
    assert done.returncode == 1, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert server.completions == 7, "one request and six retries"
    assert done.stderr.count("retrying") == 6, done.stderr  # progress while retrying
    assert "Traceback" not in done.stderr
    assert len(ledger_rows(project)) == 1 and not index(project), "an attempt was recorded"
    (state,) = runs(project)
    assert state["status"] == "stopped" and state["attempts"] == 0
    assert "endpoint" in state["stop_reason"] and "503" in state["stop_reason"]
    assert state["stop_reason"] in done.stdout + done.stderr


class RefusingHandler(FailingHandler):
    """Lists the models, then refuses every completion as a client error (a model name the server does not serve)."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.completions += 1
        self._reply(404, {"error": {"message": "the model 'nope' does not exist"}})


def test_an_endpoint_that_refuses_the_request_stops_the_run_without_timing_the_unchanged_candidate(
        project: Path, panel: Path):
    server = FailingEndpoint()
    server.RequestHandlerClass = RefusingHandler
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = agent(project, "run", "--iters", "2", "--backend", "openai", "--model", "nope", "--panel", str(panel),
                     timeout=240, OPENAI_BASE_URL=f"http://127.0.0.1:{server.server_port}/v1", OPENAI_API_KEY="t")
    finally:
        server.shutdown()
    assert done.returncode == 1, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert server.completions == 1, "a client error is not retried"
    assert len(ledger_rows(project)) == 1 and not index(project), "the unchanged candidate was recorded"
    (state,) = runs(project)
    assert state["status"] == "stopped" and "no candidate" in state["stop_reason"] and "404" in state["stop_reason"]


def test_resuming_an_unknown_run_says_so_in_one_line(project: Path):
    before = written(project)
    refused(agent(project, "run", "--resume", "nosuchrun"), "nosuchrun", "status")
    assert written(project) == before


def test_the_commands_people_are_told_to_type_work_and_a_missing_dependency_names_make_setup(project: Path):
    for module in ("agent", "evals.selfcheck"):  # -S: no site-packages, as with a python outside the venv
        done = subprocess.run([sys.executable, "-S", "-m", module, "--help"], cwd=project, capture_output=True,
                              text=True, timeout=60)
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(lines) == 1 and "make setup" in lines[0], done.stderr
    usage = agent(project, "run", "--help").stdout
    assert usage.startswith("usage: .venv/bin/python -m agent run"), usage
    readme = (ROOT / "README.md").read_text()
    told = [line for line in readme.splitlines() if "python -m " in line]
    assert told and all(".venv/bin/python -m " in line for line in told), told


def record_by_hand(project: Path, version: str, score: str, decision: str, panel: str, gpu_timing: bool) -> None:
    """``version``: a copy of v0 with its row and index line, as a run on ``panel`` records it."""
    task = Task.load(project)
    shutil.copytree(task.versions / "v0", task.versions / version)
    row = {"version": version, "time (UTC)": "2026-12-01 00:00:00", "run": "r", "backend/model": "offline",
           "parent": "v0", "summary / hypothesis": "s", "correct": "yes", "residency": "ok", "balanced": score,
           "expert-batch": score, "score": score, "decision": decision,
           "sha256": ledger.solution_sha256(task.versions / version)}
    ledger.append_row(task, row)
    verdict = {"panel": panel, "gpu_timing": gpu_timing, "valid": True, "keep": decision.startswith("keep")}
    with open(task.versions / "index.jsonl", "a") as index_file:
        index_file.write(json.dumps(dict(row, verdict=verdict)) + "\n")


def test_promoting_a_reverted_version_on_interpreter_numbers_needs_force(project: Path, panel: Path):
    record_by_hand(project, "v1", "0.900", "revert (0.900x best, noise 0.1)", "smoke", gpu_timing=False)
    before = written(project)
    done = agent(project, "promote", "v1", "--panel", str(panel))
    assert done.returncode == 1, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert "revert (0.900x best" in done.stdout and "interpreter" in done.stdout and "--force" in done.stdout
    assert written(project) == before, "a refused promotion changed methods/"


def test_promoting_a_version_the_loop_reverted_on_gpu_numbers_needs_force(project: Path, panel: Path):
    """The mistake of typing another task's version number without its TASK=: the default task's vN of that number
    is one its loop reverted, and promote says so and stops unless forced."""
    record_by_hand(project, "v1", "1.100", "revert (1.010x best, noise 0.020)", "visible", gpu_timing=True)
    before = written(project)
    done = agent(project, "promote", "v1", "--panel", str(panel))
    assert done.returncode == 1, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.startswith("task w4a16, v1 (methods/versions/v1): its own row: revert (1.010x best")
    assert "the loop reverted v1 of task w4a16" in done.stdout and "FORCE=1" in done.stdout
    assert "VERIFY=1" in done.stdout and "TASK=" in done.stdout and written(project) == before
    forced = agent(project, "promote", "v1", "--panel", str(panel), "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    row = [line for line in (project / "methods" / "experiment_log.md").read_text().splitlines()
           if line.startswith("| promote v1 |")][-1]
    assert "(forced past its revert)" in row and "| promoted (forced) |" in row


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.Popen, str]:
    """A run whose output goes through a pipe whose reader is gone (tee killed by Ctrl-C) when Ctrl-C comes, while
    its first attempt is in flight."""
    project = make_project(tmp_path_factory.mktemp("interrupted"))
    panel = project.parent / "panel.json"
    process = subprocess.Popen(agent_command("run", "--iters", "3", "--backend", "offline", "--panel", str(panel)),
                               cwd=project, env=agent_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    for line in process.stdout:
        if line.startswith("[iteration 1]"):
            break
    process.stdout.close()  # the reader goes first, as tee does on Ctrl-C
    process.send_signal(signal.SIGINT)
    stderr = process.communicate(timeout=300)[1]
    return project, panel, process, stderr


def test_ctrl_c_through_a_closed_pipe_records_the_attempt_in_flight(interrupted):
    project, _, process, stderr = interrupted
    assert process.returncode == 0 and "Traceback" not in stderr, stderr
    (state,) = runs(project)
    assert state["status"] == "stopped" and state["stop_reason"] == "interrupted (Ctrl-C)"
    assert state["attempts"] == 1 and len(ledger_rows(project)) == 2 and len(index(project)) == 1
    assert (project / "reports" / state["run_id"] / "report.md").is_file()


def test_status_into_a_closed_pipe_is_quiet(project: Path):
    process = subprocess.Popen(agent_command("status", "--rows", "50"), cwd=project, env=agent_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # as `| head` does once it has what it wants
    stderr = process.communicate(timeout=60)[1]
    assert process.returncode == 0 and stderr == "", stderr


def test_the_report_and_resume_of_a_stopped_run(interrupted):
    project, _, _, _ = interrupted
    (state,) = runs(project)
    report = (project / "reports" / state["run_id"] / "report.md").read_text()
    commit = git(project, "rev-parse", "--short", "HEAD").strip()
    assert f"| commit | {commit} |" in report, "the run's own ledger rows made the checkout look dirty"
    before = written(project)
    line = refused(agent(project, "run", "--resume", state["run_id"], "--iters", "1"), "1 attempt", "more than 1")
    assert state["run_id"] in line and written(project) == before


def test_status_says_where_each_best_was_measured(project: Path):
    record_by_hand(project, "v1", "1.300", "keep (1.300x best, noise 0.01)", "visible", gpu_timing=True)
    record_by_hand(project, "v2", "2.500", "keep (2.500x best, noise 0.4)", "/tmp/x/panel.json", gpu_timing=False)
    status = run_agent(project, "status").stdout.splitlines()
    assert status[:2] == ["0 run(s)", "task w4a16 (methods/experiment_log.md):"], status
    assert status[2] == "  best kept versions, by where they were measured (scores compare only within one line):"
    assert "    visible panel, GPU: v1 1.300" in status, status
    assert "    panel and device not recorded: v0 1.000" in status, status
    # a keep on interpreter timings (a row from before nothing was kept without a GPU) ranks nothing: never a best
    assert not any("v2" in line for line in status if "panel" in line), status
    assert "  kept on interpreter timings, which rank nothing (not listed as best): v2" in status, status
    assert status[status.index("  last rows:") + 1:] == ["    " + line for line in ledger_rows(project)[-5:]]


def test_a_rejected_submit_exits_1(project: Path, panel: Path):
    broken = project.parent / "broken"
    broken.mkdir()
    (broken / "solution.py").write_text("def build(qweight, scales, bias, epilogue:\n")
    done = agent(project, "submit", str(broken), "--summary", "a syntax error", "--panel", str(panel), timeout=240)
    assert done.returncode == 1, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert "v1 was rejected: revert: policy" in done.stdout, done.stdout
    assert len(ledger_rows(project)) == 2 and "revert: policy" in ledger_rows(project)[1], "the attempt is recorded"


def test_every_run_option_shows_its_help_and_default():
    done = subprocess.run(agent_command("run", "--help"), cwd=ROOT, env=agent_env(), capture_output=True, text=True,
                          timeout=60, check=True)
    text = " ".join(done.stdout.split())
    assert "(default: auto)" in text and "(default: main)" in text, text
    for option in ("--iters", "--backend", "--model", "--panel", "--from", "--resume", "--time-limit", "--script"):
        assert option in text
