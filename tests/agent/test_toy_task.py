"""A second task through the seam alone: the toy task (tests/toy_task, colscale) goes through run, resume, submit,
report, status and promote in a copy of the project, with its own ledger, versions and main, and the W4A16 task's
ledger, versions and main stay byte for byte as they were."""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from agent.ledger import ATTEMPT_ROW
from tests.conftest import TOY
from tests.agent.conftest import add_toy_task, agent_command, agent_env, make_project, run_agent

TASK = "tests/toy_task"


def snapshot(root: Path) -> dict[str, str]:
    """Every file of the W4A16 task's records and main, by path, with its hash."""
    found = {}
    for folder in ("methods/main", "methods/versions"):
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() and path.name != ".lock":
                found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    ledger = root / "methods" / "experiment_log.md"
    found[str(ledger.relative_to(root))] = hashlib.sha256(ledger.read_bytes()).hexdigest()
    return found


def agent(project: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(agent_command(*args), cwd=project, env=agent_env(), capture_output=True, text=True,
                          timeout=timeout)


def toy_rows(project: Path) -> list[str]:
    ledger = project / TASK / "experiment_log.md"
    return [line for line in ledger.read_text().splitlines() if ATTEMPT_ROW.match(line)]


def test_the_toy_task_goes_through_every_command_and_leaves_w4a16_alone(tmp_path):
    project = make_project(tmp_path)
    add_toy_task(project)  # its v0 and main, without the runs of it this checkout recorded
    before = snapshot(project)

    done = run_agent(project, "run", "--task", TASK, "--iters", "2", "--panel", "smoke", "--backend", "offline",
                     "--plain")
    run_id = json.loads(next((project / "workspace" / ".runs").glob("*/state.json")).read_text())["run_id"]
    rows = toy_rows(project)
    assert [row.split(" | ")[0] for row in rows] == ["| v1", "| v2"], rows
    header = (project / TASK / "experiment_log.md").read_text()
    assert "# Experiment log: task colscale" in header and "| correct | narrow | wide | score |" in header
    # without a GPU nothing is kept, the row says why, and the closing hint names the task
    assert all("no GPU: nothing is kept on interpreter timings" in row for row in rows), rows
    assert f"TASK={TASK}" in done.stdout and "make promote V=" not in done.stdout, done.stdout
    assert (project / TASK / "versions" / "v1" / "verdict.json").is_file()
    index = [json.loads(line) for line in (project / TASK / "versions" / "index.jsonl").read_text().splitlines()]
    assert [e["task"] for e in index] == ["colscale", "colscale"]

    run_agent(project, "run", "--resume", run_id, "--iters", "3", "--plain")  # the run's task comes from its state
    assert [row.split(" | ")[0] for row in toy_rows(project)] == ["| v1", "| v2", "| v3"]

    candidate = tmp_path / "hand"
    candidate.mkdir()
    source = (TOY / "main" / "solution.py").read_text()
    (candidate / "solution.py").write_text(source.replace('"BLOCK_SIZE": 64', '"BLOCK_SIZE": 128'))
    run_agent(project, "submit", str(candidate), "--task", TASK, "--summary", "BLOCK_SIZE 128 by hand",
              "--panel", "smoke", "--plain")
    submitted = toy_rows(project)[-1]
    assert submitted.startswith("| v4 |") and "| hand |" in submitted and "BLOCK_SIZE 128 by hand" in submitted

    shown = run_agent(project, "report", run_id).stdout
    assert "task colscale" in shown
    report = (project / "reports" / run_id / "report.md").read_text()
    assert "colscale (tests/toy_task)" in report and "torch.mul us" in report
    index_md = (project / "reports" / "index.md").read_text()
    assert "## task colscale" in index_md and run_id in index_md
    refused = agent(project, "report", run_id, "--task", "w4a16")
    assert refused.returncode == 2 and "a run of task colscale" in refused.stderr

    status = run_agent(project, "status", "--task", TASK).stdout
    assert "task colscale: 2 run(s)" in status and "task colscale (tests/toy_task/experiment_log.md):" in status
    assert "| v4 |" in status

    # the W4A16 task has no v4: a promote that forgets TASK= is refused and changes nothing
    crossed = agent(project, "promote", "v4")
    assert crossed.returncode == 2 and "task w4a16 has no version v4" in crossed.stdout, crossed.stdout
    on_cpu = agent(project, "promote", "--task", TASK, "v4")
    assert on_cpu.returncode == 1 and "measured only under the interpreter" in on_cpu.stdout, on_cpu.stdout
    promoted = run_agent(project, "promote", "--task", TASK, "v4", "--force", timeout=600)
    assert "promoted v4 to tests/toy_task/main" in promoted.stdout, promoted.stdout
    assert (project / TASK / "main" / "solution.py").read_text() == (candidate / "solution.py").read_text()
    assert any(line.startswith("| promote v4 |") for line in
               (project / TASK / "experiment_log.md").read_text().splitlines())

    assert snapshot(project) == before  # the W4A16 task's main, versions and ledger: byte for byte
