"""The whole loop, offline, as a person runs it: versions, rows, commits, resume after SIGKILL, parallel runs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import git
import pytest
import torch

from agent.config import Task
from agent.ledger import columns
from agent.proposers.space import range_keys, read_space
from tests.agent.conftest import ROOT, agent_command, agent_env, index, ledger_rows, run_agent, runs


def test_offline_run_records_versions_rows_and_commits(project: Path, panel: Path):
    ledger_before = (project / "methods" / "experiment_log.md").read_text()
    done = run_agent(project, "run", "--iters", "3", "--backend", "offline", "--panel", str(panel))
    assert "not GPU timings" in done.stdout
    cuda = torch.cuda.is_available()
    if cuda:
        assert "to promote it" in done.stdout or "no candidate beat the start" in done.stdout
    else:  # nothing is kept on interpreter timings: the summary says so and names the valid candidates
        valid = [e["version"] for e in index(project) if e["verdict"]["valid"]]
        assert ("no GPU: nothing is kept on Triton interpreter timings, which rank nothing; "
                f"{len(valid)} valid candidate(s) recorded" + (f" ({', '.join(valid)})" if valid else "")
                + ". Measure them on a GPU: make agent-run ITER=20 there, or make promote V=N on a GPU machine (here "
                "only FORCE=1 promotes).") in done.stdout, done.stdout
        assert "to promote it" not in done.stdout

    ledger_after = (project / "methods" / "experiment_log.md").read_text()
    assert ledger_after.startswith(ledger_before), "earlier ledger rows changed"
    rows = ledger_rows(project)[1:]
    assert [row.split(" | ")[0] for row in rows] == ["| v1", "| v2", "| v3"]
    names = columns(Task.load(project))
    for number, row in enumerate(rows, 1):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == len(names) and cells[3] == "offline" and cells[6] == "yes"
        if not cuda:
            assert cells[names.index("stable")] == "-"  # interpreter timings measure no stability
            assert cells[11].startswith("revert (no GPU: nothing is kept on interpreter timings, which rank nothing; ")
        # the residency guard and the gates run for a candidate that would be kept; a slower one is reverted first
        assert cells[7] == ("ok" if cells[11].startswith("keep") else "not run (not kept)")
        assert "->" in cells[5] and "hypothesis:" in cells[5]
        assert cells[11].startswith(("keep", "revert"))
        version = project / "methods" / "versions" / f"v{number}"
        assert {p.name for p in version.iterdir()} >= {"solution.py", "parent.patch", "verdict.json"}
        assert "get_config" in (version / "parent.patch").read_text()
    assert len({row.rsplit(" | ", 2)[1] for row in rows}) == 3, "the offline search proposed the same solution twice"

    entries = index(project)
    assert [e["version"] for e in entries] == ["v1", "v2", "v3"]
    assert all({"tokens", "cost_usd", "wall_s", "eval_s", "verdict"} <= set(e) for e in entries)

    (state,) = runs(project)
    assert state["status"] == "finished" and state["attempts"] == 3
    branch = git.Repo(project).commit(f"runs/{state['run_id']}")
    messages = [c.message.strip() for c in list(git.Repo(project).iter_commits(branch, max_count=3))][::-1]
    assert messages == rows, "each attempt is one commit whose message is its ledger row"
    kept = [e["version"] for e in entries if e["keep"]]
    assert state["best_label"] == (kept[-1] if kept else "v0")

    status = run_agent(project, "status")
    assert state["run_id"] in status.stdout and "v3" in status.stdout
    cleaned = run_agent(project, "clean-workspace")
    assert state["run_id"] in cleaned.stdout and not (project / "workspace" / state["run_id"]).exists()


def test_an_offline_run_starts_from_the_promoted_main(project: Path, panel: Path):
    """`make agent-run` as a user types it: from the real methods/main (every file of it), not the fixture's v0."""
    main = project / "methods" / "main"
    for old in main.iterdir():
        old.unlink()
    files = sorted(p.name for p in (ROOT / "methods" / "main").glob("*.py"))
    for name in files:
        (main / name).write_text((ROOT / "methods" / "main" / name).read_text())
    git_as_test = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost"]
    subprocess.run(git_as_test + ["add", "-A"], cwd=project, check=True)
    subprocess.run(git_as_test + ["commit", "-qm", "the promoted main"], cwd=project, check=True)
    done = run_agent(project, "run", "--iters", "1", "--backend", "offline", "--panel", str(panel))
    assert "start: score" in done.stdout and "start: score -" not in done.stdout  # the start itself was measured
    (row,) = ledger_rows(project)[1:]
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    # its parent is main, which no version of this copy's ledger holds (v0's sha would read v0)
    assert cells[0] == "v1" and cells[3] == "offline" and cells[4] == "main" and cells[6] == "yes", row
    version = project / "methods" / "versions" / "v1"
    assert sorted(p.name for p in version.iterdir()) == sorted(files + ["parent.patch", "verdict.json"])
    moved = cells[5].split(";")[0].split(" + ")
    knobs = read_space((ROOT / "methods" / "main" / "solution.py").read_text(),
                       range_keys(Task.load(ROOT).tier_dims)).knobs
    assert all(any(knob in move.split() for knob in knobs) for move in moved), (cells[5], sorted(knobs))


def wait_for(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.2)


def test_resume_after_sigkill(project: Path, panel: Path):
    process = subprocess.Popen(agent_command("run", "--iters", "3", "--backend", "offline", "--panel", str(panel)),
                               cwd=project, env=agent_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(r["attempts"] >= 1 for r in runs(project)), 180)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    (state,) = runs(project)
    assert state["status"] == "running" and state["attempts"] < 3
    assert "killed (resumable)" in run_agent(project, "status").stdout
    # the killed run's evaluator children may outlive it and still write to its directories: on --resume, every
    # evaluation gets a directory of its own, never the one the same iteration had (here planted under its old name)
    killed_at = state["attempts"]
    attempts = project / "workspace" / ".runs" / state["run_id"] / "attempts"
    left = {p.name for p in attempts.iterdir()}
    stale = attempts / f"{killed_at + 1:03d}"
    stale.mkdir(exist_ok=True)
    (stale / "orphan.txt").write_text("written by a killed run's evaluator\n")

    resumed = run_agent(project, "run", "--resume", state["run_id"])
    # the interpreter's timings compare nothing, so only a GPU run measures its best again on resuming
    assert ("measuring the best again" in resumed.stdout) == torch.cuda.is_available(), resumed.stdout
    (state,) = runs(project)
    assert state["status"] == "finished" and state["attempts"] == 3
    assert [p.name for p in stale.iterdir()] == ["orphan.txt"], "the resumed run evaluated in a killed run's directory"
    fresh = sorted(p.name for p in attempts.iterdir() if p.name not in left | {stale.name})
    assert [int(name[:3]) for name in fresh] == list(range(killed_at + 1, 4))
    assert all((attempts / name / "policy.json").is_file() for name in fresh)
    versions = [e["version"] for e in index(project)]
    assert len(versions) == len(set(versions)) >= 3
    assert [row.split(" | ")[0] for row in ledger_rows(project)] == ["| v0"] + [f"| {v}" for v in versions]


@pytest.mark.gpu
def test_a_resumed_gpu_run_measures_its_best_again(project: Path, panel: Path):
    """A resumed run may sit on another host or GPU model than its last sitting: before its next attempt it times its
    best again, and that report (the proposer's profile, the estimates' reference) replaces the last sitting's."""
    run_agent(project, "run", "--iters", "1", "--backend", "offline", "--panel", str(panel))
    (state,) = runs(project)
    state_dir = project / "workspace" / ".runs" / state["run_id"]
    before = json.loads((state_dir / "best_selfcheck.json").read_text())
    done = run_agent(project, "run", "--resume", state["run_id"], "--iters", "2")
    assert f"measuring the best again (a resumed GPU run) ({state['best_label']})" in done.stdout, done.stdout
    remeasured = json.loads((state_dir / "tools" / "selfcheck.json").read_text())  # the evaluator's own record
    assert remeasured["device"] == torch.cuda.get_device_name() and not remeasured["interpreted"]
    times = [[c["times_us"] for c in report["cases"]] for report in (before, remeasured)]
    assert times[0] != times[1], "the resumed run did not time its best again"
    (after,) = runs(project)
    assert after["status"] == "finished" and after["attempts"] == 2
    if after["best_label"] == state["best_label"]:  # the new attempt was not kept: the best's report is the new one
        assert json.loads((state_dir / "best_selfcheck.json").read_text()) == remeasured


def test_two_runs_at_once_never_share_a_version(project: Path, panel: Path):
    ledger_before = (project / "methods" / "experiment_log.md").read_text()
    command = agent_command("run", "--iters", "2", "--backend", "offline", "--panel", str(panel))
    processes = [subprocess.Popen(command, cwd=project, env=agent_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs

    states = runs(project)
    assert len(states) == 2 and all(s["status"] == "finished" for s in states)
    entries = index(project)
    versions = [e["version"] for e in entries]
    assert sorted(versions, key=lambda v: int(v[1:])) == ["v1", "v2", "v3", "v4"]
    assert {e["run"] for e in entries} == {s["run_id"] for s in states}
    assert (project / "methods" / "experiment_log.md").read_text().startswith(ledger_before)
    assert [row.split(" | ")[0] for row in ledger_rows(project)] == ["| v0", "| v1", "| v2", "| v3", "| v4"]
    branches = {b.name for b in git.Repo(project).branches}
    assert {f"runs/{s['run_id']}" for s in states} <= branches
    for entry in entries:
        assert json.loads((project / "methods" / "versions" / entry["version"] / "verdict.json").read_text())["stages"]
    assert os.path.isdir(project / "workspace" / states[0]["run_id"])


def test_a_hand_written_candidate_is_submitted_as_one_attempt(project: Path, panel: Path, tmp_path: Path):
    draft = tmp_path / "draft"
    draft.mkdir()
    source = (project / "methods" / "versions" / "v0" / "solution.py").read_text()
    (draft / "solution.py").write_text(source.replace('"BLOCK_SIZE_N": 64', '"BLOCK_SIZE_N": 32'))
    done = run_agent(project, "submit", str(draft), "--summary", "narrower tiles by hand",
                     "--hypothesis", "more programs", "--from", "v0", "--panel", str(panel))
    assert "backend hand" in done.stdout
    (row,) = ledger_rows(project)[1:]
    cells = [c.strip() for c in row.strip("|").split(" | ")]
    assert cells[0] == "v1" and cells[3] == "hand" and cells[4] == "v0" and cells[6] == "yes"
    assert cells[5] == "narrower tiles by hand; hypothesis: more programs"
    assert (project / "methods" / "versions" / "v1" / "solution.py").read_text() == (draft / "solution.py").read_text()
    (state,) = runs(project)
    assert state["attempts"] == 1 and state["config"]["backend"] == "scripted"
    missing = subprocess.run(agent_command("submit", str(tmp_path / "nothing"), "--summary", "x"), cwd=project,
                             env=agent_env(), capture_output=True, text=True)
    assert missing.returncode != 0 and "needs a solution.py" in missing.stderr
