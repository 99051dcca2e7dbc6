"""Two tasks in one project: each run, row, version and report belongs to its task, the CLI names the task wherever
it matters, and a command never reads or writes another task's records. W4A16 and "other" (W4A16's manifest with
records of its own under tasks/other/) each get a run; every command is a real subprocess of the project's copy."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.agent.conftest import add_task, agent_command, agent_env, index, ledger_rows, make_project, run_agent, runs

BROKEN = "def build(qweight, scales, bias, epilogue:\n"  # a syntax error: the policy stage refuses it at once


def agent(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(agent_command(*args), cwd=project, env=agent_env(), capture_output=True, text=True,
                          timeout=240)


def refused(done: subprocess.CompletedProcess, line: str) -> None:
    assert done.returncode == 2 and done.stderr == f"agent: {line}\n", (done.returncode, done.stdout, done.stderr)


def one_attempt(project: Path, panel: Path, main: str, *task: str) -> tuple[str, str]:
    """A finished one-iteration scripted run (a candidate the policy refuses): its id and its output."""
    script = project.parent / f"script-{main.replace('/', '-')}.json"
    script.write_text(json.dumps([{"tool": "write_file", "args": {"path": f"{main}/solution.py", "content": BROKEN}},
                                  {"tool": "submit", "args": {"summary": "broken", "hypothesis": "none"}}]))
    known = {state["run_id"] for state in runs(project)}
    done = run_agent(project, "run", "--iters", "1", "--backend", "scripted", "--script", str(script), "--panel",
                     str(panel), *task)
    (run_id,) = {state["run_id"] for state in runs(project)} - known
    return run_id, done.stdout


@pytest.fixture(scope="module")
def two_tasks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str, str, str]:
    """The project with task "other" beside W4A16, and a finished run of each: (project, panel, the W4A16 run, the
    other's run, the other run's output)."""
    project = make_project(tmp_path_factory.mktemp("tasks"))
    panel = project.parent / "panel.json"
    add_task(project, "other")
    default, _ = one_attempt(project, panel, "methods/main")
    other, said = one_attempt(project, panel, "tasks/other/main", "--task", "other")
    return project, panel, default, other, said


def test_each_run_records_into_its_own_tasks_records(two_tasks):
    project, _, default, other, said = two_tasks
    states = {state["run_id"]: state for state in runs(project)}
    assert states[default]["config"]["task"] == str(project / "tasks" / "w4a16")
    assert states[other]["config"]["task"] == str(project / "tasks" / "other")
    assert "task_file" not in states[other]["config"]
    assert [(e["version"], e["run"], e["task"]) for e in index(project)] == [("v1", default, "w4a16")]
    assert [(e["version"], e["run"], e["task"]) for e in index(project, "other")] == [("v1", other, "other")]
    assert len(ledger_rows(project)) == 2 and ledger_rows(project)[1].startswith("| v1 | ") and default in \
        ledger_rows(project)[1]
    (row,) = ledger_rows(project, "other")
    assert row.startswith("| v1 | ") and f"| {other} |" in row and "| revert: policy" in row
    # the other task's ledger was started with its header, under a title naming the task
    text = (project / "tasks" / "other" / "experiment_log.md").read_text()
    assert text.startswith("# Experiment log: task other\n") and "| version | time (UTC) | run |" in text
    assert (project / "tasks" / "other" / "versions" / "v1" / "solution.py").read_text() == BROKEN
    # the closing summary names the task and its hints carry TASK= (the default task's carry none)
    assert f"run {other} (task other): finished, 1 attempt(s)" in said
    assert "make agent-run TASK=other ITER=20" in said and "make promote TASK=other V=N" in said
    assert "ledger: tasks/other/experiment_log.md; versions: tasks/other/versions/" in said
    assert f"resume: .venv/bin/python -m agent run --resume {other}" in said
    default_said = (project / "reports" / default / "report.md").read_text()
    assert "`make promote V=N`" in default_said and "TASK=" not in default_said


def test_status_groups_runs_by_task_and_shows_the_selected_tasks_records(two_tasks):
    project, _, default, other, _ = two_tasks
    status = run_agent(project, "status").stdout.splitlines()
    assert status[0] == "2 run(s) of 2 tasks"
    assert status[1] == "task w4a16: 1 run(s)" and status[2].startswith(f"  {default}  finished ")
    assert status[3] == "task other: 1 run(s)" and status[4].startswith(f"  {other}  finished ")
    assert all(line.endswith("  CPU: nothing kept on interpreter timings") for line in (status[2], status[4]))
    assert status[5] == "task w4a16 (methods/experiment_log.md):"
    assert status[status.index("  last rows:") + 1:] == ["    " + line for line in ledger_rows(project)[-5:]]
    # --task other: its runs first, then its own ledger's rows
    status = run_agent(project, "status", "--task", "other").stdout.splitlines()
    assert status[:2] == ["2 run(s) of 2 tasks", "task other: 1 run(s)"] and status[3] == "task w4a16: 1 run(s)"
    assert status[5] == "task other (tasks/other/experiment_log.md):"
    assert status[6] == "  best kept versions, by where they were measured (scores compare only within one line): " \
                        "(none)"
    assert status[status.index("  last rows:") + 1:] == ["    " + ledger_rows(project, "other")[0]]


def test_report_takes_the_runs_own_task_and_refuses_another(two_tasks):
    project, _, default, other, _ = two_tasks
    listing = project / "reports" / "index.md"
    before = listing.read_bytes()
    refused(agent(project, "report", default, "--task", "other"), f"run {default} is a run of task w4a16, not other")
    refused(agent(project, "report", other, "--task", "w4a16"), f"run {other} is a run of task other, not w4a16")
    assert listing.read_bytes() == before
    for args in ([other], [other, "--task", "other"]):
        done = run_agent(project, "report", *args)
        assert done.stdout == f"reports/{other}/report.md and report.html written (task other)\n"
    markdown = (project / "reports" / other / "report.md").read_text()
    assert "| task | other (tasks/other) |" in markdown and "`make promote TASK=other V=N`" in markdown
    # the index: one section per task, each with its own run
    text = listing.read_text()
    sections = {part.split("\n", 1)[0]: part for part in text.split("## task ")[1:]}
    assert sorted(sections) == ["other", "w4a16"]
    assert f"| {other} |" in sections["other"] and f"| {default} |" not in sections["other"]
    assert f"| {default} |" in sections["w4a16"] and f"| {other} |" not in sections["w4a16"]


def test_resume_refuses_a_task_other_than_the_runs_own(two_tasks):
    project, _, _, other, _ = two_tasks
    refused(agent(project, "run", "--resume", other, "--task", "w4a16"),
            f"run {other} is a run of task other, not w4a16; leave --task out to resume it")
    # a run an older kloop started with a task file (JSON of field overrides) is not resumed as some other task
    state = project / "workspace" / ".runs" / other / "state.json"
    saved = state.read_text()
    data = json.loads(saved)
    data["config"] |= {"task_file": "/old/task.json"}
    state.write_text(json.dumps(data))
    try:
        refused(agent(project, "run", "--resume", other),
                f"run {other} was started with a task file (/old/task.json) of an older kloop; start a new run")
    finally:
        state.write_text(saved)


def test_promote_refuses_a_version_another_task_recorded(two_tasks):
    """The other task's v1, its snapshot and index line brought into W4A16's versions (records copied between
    checkouts, say): W4A16's promote refuses it, and nothing changes."""
    project, panel, _, _, _ = two_tasks
    versions = project / "methods" / "versions"
    shutil.copytree(project / "tasks" / "other" / "versions" / "v1", versions / "v9")
    (line,) = [e for e in index(project, "other") if e["version"] == "v1"]
    before = {"main": (project / "methods" / "main" / "solution.py").read_bytes(),
              "ledger": (project / "methods" / "experiment_log.md").read_bytes()}
    with open(versions / "index.jsonl", "a") as lines:
        lines.write(json.dumps(dict(line, version="v9")) + "\n")
    try:
        done = agent(project, "promote", "v9", "--panel", str(panel), "--force")
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stdout == ("promote: refused: v9 in methods/versions was recorded by task other, not w4a16; "
                               "nothing promoted (promote it as a version of its own task: make promote TASK=other "
                               "V=9)\n")
        assert {"main": (project / "methods" / "main" / "solution.py").read_bytes(),
                "ledger": (project / "methods" / "experiment_log.md").read_bytes()} == before
        assert not (project / "workspace" / ".promotions").exists(), "a check ran"
        # the other task's own v1 is no version of W4A16's
        missing = agent(project, "promote", "v2")
        assert missing.returncode == 2 and missing.stdout.startswith("promote: task w4a16 has no version v2 ")
    finally:  # the module's other tests see W4A16's records as the runs left them
        shutil.rmtree(versions / "v9")
        entries = (versions / "index.jsonl").read_text().splitlines()
        (versions / "index.jsonl").write_text("".join(e + "\n" for e in entries[:-1]))


def test_clean_workspace_removes_only_the_tasks_finished_worktrees(two_tasks):
    project, _, default, other, _ = two_tasks
    worktrees = project / "workspace"
    assert (worktrees / default).is_dir() and (worktrees / other).is_dir()
    done = run_agent(project, "clean-workspace", "--task", "other")
    assert done.stdout == f"removed 1 finished worktree(s) of task other: {other}\n"
    assert (worktrees / default).is_dir() and not (worktrees / other).exists()


def test_an_unknown_task_or_one_sharing_anothers_records_is_refused_before_anything_is_written(project: Path,
                                                                                                panel: Path):
    for args in (["run", "--iters", "1", "--panel", str(panel), "--task", "nosuch"], ["status", "--task", "nosuch"],
                 ["promote", "v0", "--task", "nosuch"], ["clean-workspace", "--task", "nosuch"],
                 ["submit", str(project / "methods" / "main"), "--summary", "s", "--task", "nosuch"]):
        refused(agent(project, *args),
                "no task 'nosuch': give a task name (llgemm, w4a16) or a folder holding task.json")
    add_task(project, "other")
    refused(agent(project, "run", "--iters", "1", "--panel", str(panel), "--task", "nosuch"),
            "no task 'nosuch': give a task name (llgemm, other, w4a16) or a folder holding task.json")
    # a manifest whose ledger is W4A16's is refused; the default task it copies is not blocked by it
    add_task(project, "copycat", ledger="methods/experiment_log.md")
    done = agent(project, "run", "--iters", "1", "--panel", str(panel), "--task", "copycat")
    assert done.returncode == 2 and "belong to task" in done.stderr and "every task has its own main, versions " \
        "and ledger" in done.stderr, done.stderr
    assert "belong to task w4a16; give task copycat its own" in agent(project, "status", "--task", "copycat").stderr
    assert agent(project, "status", "--task", "w4a16").returncode == 0
    assert not runs(project) and not index(project) and len(ledger_rows(project)) == 1


def test_a_malformed_manifest_is_refused_naming_the_field(project: Path, panel: Path):
    for name, fields, said in (
            ("flat", {"strata": ["narrow", "wide"]}, "strata must be"),
            ("bare", {"baseline": "v0"}, "baseline must be"),
            ("loose", {"tools": {"run_x": {"stage": "nosuch", "description": "d"}}}, "tools must be"),
            ("odd", {"columns": ["nosuch"]}, "columns must be"),
            ("unnamed", {"ledger_device": 200}, "ledger_device must be")):
        add_task(project, name, **fields)
        done = agent(project, "run", "--iters", "1", "--panel", str(panel), "--task", name)
        assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr
    # a manifest the loop accepts but the evaluator cannot load (no adapter) is refused before the run, too
    add_task(project, "headless", adapter="tasks/headless/nosuch.py")
    done = agent(project, "run", "--iters", "1", "--panel", str(panel), "--task", "headless")
    assert done.returncode == 2 and "no adapter" in done.stderr, done.stderr
    assert not runs(project)


def test_a_hand_written_candidate_is_submitted_to_the_named_task(project: Path, panel: Path, tmp_path: Path):
    add_task(project, "other")
    draft = tmp_path / "draft"
    draft.mkdir()
    source = (project / "tasks" / "other" / "main" / "solution.py").read_text()
    (draft / "solution.py").write_text(source.replace('"BLOCK_SIZE_N": 64', '"BLOCK_SIZE_N": 32'))
    (draft / "helper.py").write_text("X = 1\n")
    done = run_agent(project, "submit", str(draft), "--summary", "narrower tiles by hand", "--panel", str(panel),
                     "--task", "other")
    assert "(task other)" in done.stdout
    (row,) = ledger_rows(project, "other")
    assert row.startswith("| v1 | ") and "| hand | v0 | narrower tiles by hand |" in row
    (entry,) = index(project, "other")
    assert entry["task"] == "other" and entry["version"] == "v1"
    snapshot = project / "tasks" / "other" / "versions" / "v1"
    assert {p.name: p.read_text() for p in snapshot.glob("*.py")} == {
        p.name: p.read_text() for p in draft.glob("*.py")}
    assert not index(project) and len(ledger_rows(project)) == 1, "W4A16's records stay as they were"
    assert (project / "tasks" / "other" / "main" / "solution.py").read_text() == source, "main changes only by promote"
