"""Parallel candidates (--workers, --gpus, --cluster): a batch of distinct candidates evaluated side by side, each
worker pinned to its GPU, every attempt recorded exactly as a plain run records it (one vN, one row, one index line,
one commit); at most one kept per batch, after it is timed again alone; a worker that fails, dies or hangs costs its
attempt only. Real subprocesses, a real git repository, a real Dask cluster on loopback."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from agent import batch, ledger, pool
from agent.config import Task
from agent.ledger import ATTEMPT_ROW
from agent.runner import python_env, run_command
from tests.agent.conftest import add_toy_task, agent_command, agent_env, make_project, run_agent, runs
from tests.agent.test_tools import tools  # noqa: F401 (the fixture)

TASK = "tests/toy_task"


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A project copy holding the toy task as the repository ships it (v0 and main only)."""
    project = make_project(tmp_path)
    add_toy_task(project)
    return project


def entries(project: Path, task: str | None = TASK) -> list[dict]:
    return ledger.index_entries(Task.load(project, task))


def rows(project: Path, task: str | None = TASK) -> list[str]:
    return [line for line in Task.load(project, task).ledger_path.read_text().splitlines()
            if ATTEMPT_ROW.match(line) and not line.startswith("| v0 |")]


def assert_one_record_per_attempt(project: Path, iters: int, task: str | None = TASK) -> list[dict]:
    found = entries(project, task)
    assert [e["iteration"] for e in found] == list(range(1, iters + 1)), found
    assert [e["version"] for e in found] == [f"v{i}" for i in range(1, iters + 1)]
    assert [r.split(" | ")[0] for r in rows(project, task)] == [f"| v{i}" for i in range(1, iters + 1)]
    assert len({e["sha256"] for e in found}) == iters, "a batch evaluated the same candidate twice"
    for e in found:
        assert (Task.load(project, task).versions / e["version"] / "verdict.json").is_file()
    (state,) = runs(project)
    assert state["attempts"] == iters and len(state["history"]) == iters
    subjects = subprocess.run(["git", "log", "--format=%s", f"runs/{state['run_id']}"], cwd=project,
                              capture_output=True, text=True, check=True).stdout.splitlines()
    assert sorted(s.split(" | ")[0] for s in subjects if s.startswith("| v")) == \
        sorted(f"| v{i}" for i in range(1, iters + 1)), "one commit per attempt on the run's branch"
    return found


def test_two_workers_record_every_attempt_once_in_batches_of_two(toy: Path):
    done = run_agent(toy, "run", "--task", TASK, "--iters", "4", "--panel", "smoke", "--backend", "offline",
                     "--workers", "2", "--plain")
    assert done.returncode == 0, done.stderr
    found = assert_one_record_per_attempt(toy, 4)
    assert [e["batch"] for e in found] == [[1, 2], [1, 2], [3, 4], [3, 4]]
    # two workers on the one default device: their timings are marked shared, in the index and in the row
    assert all(e["worker"] == {"gpu": "", "host": None, "address": None, "shared": True} for e in found), found
    assert all(r.split(" | ")[4] == "v0" for r in rows(toy)), "every member's parent is the best it came from"
    assert all("[timed on a device shared with another worker]" in r for r in rows(toy)), rows(toy)
    assert "batch of 2: iterations 1-2" in done.stdout and "batch of 2: iterations 3-4" in done.stdout
    # the report's wall time counts each batch once (its evaluations side by side), beside the workers' summed time
    (state,) = runs(toy)
    report = (toy / "reports" / state["run_id"] / "report.md").read_text()
    assert "2 workers side by side" in report and "attempts per minute" in report, report[:2000]
    batch_s = sum(e["propose_s"] for e in found) + found[1]["batch_eval_s"] + found[3]["batch_eval_s"]
    assert f"| wall time | {batch_s / 60:.1f} min" in report
    for e in found:  # a worker's time is within its batch's, up to rounding: each stage, each sum, to 0.01 s
        verdict = json.loads((toy / TASK / "versions" / e["version"] / "verdict.json").read_text())
        # stages, their sum, the attempt's and the batch's times; a keeper adds its verdict beside the others (the
        # same stages) and that sum
        roundings = len(verdict["stages"]) * (2 if verdict.get("beside_others") else 1) + (
            4 if verdict.get("beside_others") else 3)
        assert e["eval_s"] <= e["batch_eval_s"] + 0.005 * roundings + 1e-9, (e, verdict["stages"])


@pytest.mark.gpu
def test_two_workers_pinned_to_one_gpu_record_every_attempt_with_their_timings_marked_shared(tmp_path: Path):
    """The W4A16 task on this machine's one GPU, two workers pinned to it: every attempt recorded once, in batches of
    two; each timing taken beside the other worker says so, and a keeper's, timed again alone, does not."""
    project = make_project(tmp_path)
    done = run_agent(project, "run", "--iters", "4", "--backend", "offline", "--panel", str(tmp_path / "panel.json"),
                     "--gpus", "0", "--workers", "2", "--plain", timeout=900)
    found = assert_one_record_per_attempt(project, 4, None)
    assert [e["batch"] for e in found] == [[1, 2], [1, 2], [3, 4], [3, 4]]
    assert "batch of 2: iterations 1-2 on GPU 0 (shared), GPU 0 (shared)" in done.stdout, done.stdout
    for entry, row in zip(found, rows(project, None)):
        verdict = entry["verdict"]
        assert verdict["gpu_timing"] and entry["worker"]["gpu"] == "0", entry
        alone = bool(verdict.get("evaluated_alone"))
        assert entry["worker"]["shared"] is not alone, entry
        if alone:  # kept on its timing alone; what it measured beside the other worker is kept beside it
            assert entry["keep"] and verdict["beside_others"]["worker"]["shared"], verdict
        assert ("[timed on a device shared with another worker]" in row) == (verdict["correct"] is not None
                                                                             and not alone), row
    assert sum(e["keep"] for e in found) <= 2, "at most one keeper a batch"
    (state,) = runs(project)
    report = (project / "reports" / state["run_id"] / "report.md").read_text()
    assert "2 workers side by side" in report and "attempts per minute" in report, report[:2000]


def test_a_batch_killed_after_its_first_record_resumes_without_losing_or_repeating_one(toy: Path):
    log = toy.parent / "stderr.txt"
    with open(log, "w") as stderr:
        process = subprocess.Popen(agent_command("run", "--task", TASK, "--iters", "3", "--panel", "smoke",
                                                 "--backend", "offline", "--workers", "2", "--plain"),
                                   cwd=toy, env=agent_env(KLOOP_PAUSE_AT="committed"), stdout=subprocess.DEVNULL,
                                   stderr=stderr)
    deadline = time.monotonic() + 180
    try:
        while "paused at committed" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        process.kill()
        process.wait()
    assert [e["iteration"] for e in entries(toy)] == [1], "killed after the batch's first record"
    (state,) = runs(toy)
    done = run_agent(toy, "run", "--resume", state["run_id"], "--plain")
    assert done.returncode == 0, done.stderr
    found = assert_one_record_per_attempt(toy, 3)
    assert "recovered v1 (iteration 1)" in done.stdout  # recorded and committed, then killed before the state
    assert [e["batch"] for e in found] == [[1, 2], [2, 3], [2, 3]], "the unrecorded member was proposed again"


def sleeper(gpu_log: Path):
    """An evaluator stand-in: a real subprocess under the worker's environment that records CUDA_VISIBLE_DEVICES and
    when it ran."""
    class Sleeper:
        def __init__(self, task, panel, cuda, work_dir, timeout_s=None, gpu=""):
            self.gpu = gpu

        def evaluate(self, candidate, *args):
            if candidate.name == "raises":
                raise OSError("no space left on device")
            seconds = {"hangs": 8, "long": 60}.get(candidate.name, 1)
            code = ("import os, sys, time; t = time.time(); time.sleep(float(sys.argv[1])); "
                    "print(os.environ.get('CUDA_VISIBLE_DEVICES', '-'), t, time.time())")
            out = run_command([sys.executable, "-c", code, str(seconds)], gpu_log, 60,
                              python_env(gpu_log, True, self.gpu))["output"].split()
            return {"gpu_seen": out[0], "start": float(out[1]), "end": float(out[2]), "keep": False}
    return Sleeper


def test_local_workers_are_pinned_side_by_side_and_a_failing_or_hung_one_costs_its_attempt(tmp_path, monkeypatch):
    monkeypatch.setattr(pool, "Evaluator", sleeper(tmp_path))
    monkeypatch.setattr(pool, "GRACE_S", 4.0)
    task = types.SimpleNamespace(eval_timeout_s=1.0, stages=())
    slots = pool.make_slots(["3", "5", "5", "7"])
    assert [s.shared for s in slots] == [False, True, True, False]
    workers = pool.LocalPool(task, "smoke", True, tmp_path, slots)
    jobs = [pool.Job(i, f"j{i}", tmp_path / name, tmp_path, False, None, None)
            for i, name in enumerate(("a", "b", "raises", "hangs"))]
    started = time.monotonic()
    first, second, raised, hung = workers.evaluate(jobs, 1.0, False)
    assert time.monotonic() - started < 20, "a hung worker held the batch past its limit"
    assert (first["gpu_seen"], second["gpu_seen"]) == ("3", "5")
    assert first["start"] < second["end"] and second["start"] < first["end"], "the workers ran one after another"
    for verdict, why in ((raised, "the worker failed: OSError: no space left on device"),
                         (hung, "no verdict within")):
        assert not verdict["valid"] and not verdict["keep"] and verdict["failed_stage"] == "worker"
        assert why in verdict["stages"][0]["note"], verdict


def verdict(speedup: float, keep: bool) -> dict:
    return {"keep": keep, "valid": True, "gpu_timing": True, "correct": True, "speedup_over_best": speedup,
            "noise": 0.01, "stages": [{"name": "selfcheck", "ok": True, "seconds": 2.0}], "score": 1.5}


@pytest.mark.parametrize("alone_keeps", [True, False])
def test_a_batch_keeps_its_fastest_keeper_only_once_evaluated_again_alone(alone_keeps, tmp_path):
    asked = []

    def evaluate_alone(job, slot, limit, full_check, worker):
        asked.append((job.iteration, job.name, slot.gpu))
        return verdict(1.08, True) if alone_keeps else verdict(1.005, False)

    run = types.SimpleNamespace(state=types.SimpleNamespace(eval_limit_s=None), config=types.SimpleNamespace(
        full_check=False), pool=types.SimpleNamespace(evaluate_alone=evaluate_alone))
    jobs = [pool.Job(i, f"00{i}-x", tmp_path, tmp_path, False, 1.2, None) for i in (5, 6, 7)]
    verdicts = [verdict(1.05, True), verdict(1.10, True), verdict(0.97, False)]
    slots = [pool.Slot("0", True), pool.Slot("0", True), pool.Slot("1", False)]
    for found in verdicts:
        found["worker"] = {"gpu": "0", "host": None, "address": None, "shared": True}
    chosen, lost = batch.choose(run, jobs, verdicts, slots)
    assert lost is None
    assert asked == [(6, "006-x-alone", "0")], "only the fastest keeper is evaluated again, on its own GPU"
    assert verdicts[1]["keep"] is alone_keeps and not verdicts[0]["keep"] and not verdicts[2]["keep"]
    assert "iteration 6 was faster against the best (1.100x against 1.050x)" in verdicts[0]["batch_note"]
    assert ("then not kept alone" in verdicts[0]["batch_note"]) is not alone_keeps
    from agent.loop import decision
    assert decision(verdicts[0]).startswith("revert (batch: iteration 6 was faster")
    if alone_keeps:  # the alone verdict stands for the attempt, and its folder is the attempt's
        assert verdicts[1]["speedup_over_best"] == 1.08 and verdicts[1]["evaluated_alone"]
        assert verdicts[1]["beside_others"]["speedup_over_best"] == 1.10 and not verdicts[1]["worker"]["shared"]
        assert [j.name for j in chosen] == ["005-x", "006-x-alone", "007-x"]
        assert decision(verdicts[1]) == "keep (1.080x best, noise 0.010, evaluated again alone)"
    else:
        assert chosen == jobs and verdicts[1]["stages"][-1]["name"] == "alone"
        assert decision(verdicts[1]).startswith("revert (batch: evaluated again alone: revert (1.005x best")


def test_a_candidate_refused_only_on_a_shared_timing_is_evaluated_again_alone(tmp_path):
    """Beside another worker on one GPU a faster candidate's noise can exceed its gain: the fastest such one is timed
    again alone, and kept if that keeps it; one timed alone, or slower, is not asked again."""
    asked = []

    def evaluate_alone(job, slot, limit, full_check, worker):
        asked.append(job.iteration)
        return verdict(1.30, True)

    run = types.SimpleNamespace(state=types.SimpleNamespace(eval_limit_s=None), config=types.SimpleNamespace(
        full_check=False), pool=types.SimpleNamespace(evaluate_alone=evaluate_alone))
    jobs = [pool.Job(i, f"00{i}-x", tmp_path, tmp_path, False, 1.2, None) for i in (1, 2, 3, 4)]
    verdicts = [verdict(1.37, False) | {"noise": 0.41}, verdict(1.20, False) | {"noise": 0.30},
                verdict(1.50, False), verdict(0.90, False)]
    for found, shared in zip(verdicts, (True, True, False, True)):
        found["worker"] = {"gpu": "0", "host": None, "address": None, "shared": shared}
    chosen, lost = batch.choose(run, jobs, verdicts, [pool.Slot("0", True)] * 4)
    assert asked == [1], "the fastest refused on a shared timing; not the one timed alone (3) nor the slower (4)"
    assert verdicts[0]["keep"] and verdicts[0]["evaluated_alone"] and verdicts[0]["beside_others"]["noise"] == 0.41
    assert not any(v["keep"] for v in verdicts[1:]) and [j.name for j in chosen][0] == "001-x-alone"
    assert "batch_note" not in verdicts[1], "a refused member keeps its own decision"

    # a batch with a keeper tries that one alone, however fast a refused member looked; a refused one that is not
    # kept alone either says both
    asked.clear()
    verdicts = [verdict(1.37, False) | {"noise": 0.41}, verdict(1.10, True)]
    for found in verdicts:
        found["worker"] = {"gpu": "0", "host": None, "address": None, "shared": True}
    batch.choose(run, jobs[:2], verdicts, [pool.Slot("0", True)] * 2)
    assert asked == [2]
    verdicts = [verdict(1.37, False) | {"noise": 0.41}, verdict(0.9, False)]
    for found in verdicts:
        found["worker"] = {"gpu": "0", "host": None, "address": None, "shared": True}
    run.pool.evaluate_alone = lambda *args: verdict(1.01, False)
    batch.choose(run, jobs[:2], verdicts, [pool.Slot("0", True)] * 2)
    from agent.loop import decision
    assert decision(verdicts[0]).startswith("revert (batch: revert (1.370x best, noise 0.410) beside another worker; "
                                            "evaluated again alone: revert (1.010x best"), decision(verdicts[0])


def test_shared_is_said_only_of_slots_that_share_a_gpu_within_the_batch():
    slots = pool.make_slots(["0", "1", "0"])
    assert [s.shared for s in slots] == [True, False, True]
    assert [s.shared for s in batch.batch_slots(slots[:2])] == [False, False], "GPU 0 alone in a batch of two"
    assert [s.shared for s in batch.batch_slots(slots)] == [True, False, True]


def test_cluster_jobs_that_ran_at_once_on_one_gpu_of_one_host_are_marked_shared_and_no_others():
    def verdict(host, gpu):
        return {"worker": {"gpu": gpu, "host": host, "address": None, "shared": False}}

    verdicts = [verdict("a", "0"), verdict("a", ""), verdict("a", "1"), verdict("b", "0"), verdict("b", "0"),
                verdict(None, ""), verdict("a", "0")]
    # a: two at once on device 0 (one with CUDA_VISIBLE_DEVICES unset), one alone on device 1; b: one job after the
    # other (one worker, or a second that started once the first had ended); a worker that failed reports no span
    spans = [[0, 10], [5, 15], [0, 10], [0, 10], [10, 20], None, [20, 30]]
    batch.mark_shared(verdicts, spans)
    assert [v["worker"]["shared"] for v in verdicts] == [True, True, False, False, False, False, False]


@pytest.mark.parametrize("args, said", [
    (["--gpus", "0,x"], "--gpus 0,x: expected all or comma-separated CUDA device ids"),
    (["--gpus", ""], "expected all or comma-separated"),
    (["--workers", "0"], "must be at least 1"),
    (["--cluster", "tcp://127.0.0.1:1", "--gpus", "0"], "a cluster's workers are pinned where they start"),
])
def test_bad_worker_flags_are_refused_before_anything_is_written(toy: Path, args, said):
    done = subprocess.run(agent_command("run", "--task", TASK, "--iters", "2", "--panel", "smoke", "--backend",
                                        "offline", *args), cwd=toy, env=agent_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert not entries(toy) and not runs(toy)


def test_resolving_workers_pins_each_gpu_once_and_shares_them_past_that(monkeypatch):
    from agent.__main__ import Refused, resolve_workers
    assert resolve_workers("0,1", None, None) == ["0", "1"]
    assert resolve_workers("2", None, None) == ["2"]  # one worker pinned: a plain run on GPU 2
    assert resolve_workers("0,1", 3, None) == ["0", "1", "0"]
    assert resolve_workers(None, 2, None) == ["", ""] and resolve_workers(None, 1, None) == []
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(Refused, match="nvidia-smi lists no GPU here"):
        resolve_workers("all", None, None)


def cuda_here() -> bool:
    import torch
    return torch.cuda.is_available()


@pytest.fixture
def cluster():
    distributed = pytest.importorskip("distributed", reason="make setup installs distributed (the cluster extra)")
    if cuda_here():  # the agent's run here would be a GPU run, and these workers CPU ones: refused, rightly
        pytest.skip("the local cluster's tests are CPU runs: on a CUDA host the agent refuses CPU workers")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as found:
        yield found


def test_a_dask_cluster_evaluates_a_batch_and_a_failing_worker_costs_its_attempt(toy: Path, cluster, monkeypatch):
    done = run_agent(toy, "run", "--task", TASK, "--iters", "2", "--panel", "smoke", "--backend", "offline",
                     "--cluster", cluster.scheduler_address, "--plain")
    assert done.returncode == 0, done.stderr
    found = assert_one_record_per_attempt(toy, 2)
    assert [e["batch"] for e in found] == [[1, 2], [1, 2]], "the cluster's two workers took one batch"
    # one job pinned to each worker, side by side on this host's one device: both say their timings were shared
    assert len({e["worker"]["address"] for e in found}) == 2, found
    assert all(e["worker"]["host"] and e["worker"]["shared"] for e in found), found
    assert all("[timed on a device shared with another worker]" in r for r in rows(toy)), rows(toy)
    assert all(e["verdict"]["correct"] for e in found), "evaluated on the cluster's workers"
    # a task the worker's checkout lacks: its attempt fails with the worker's error, the other job is evaluated
    from agent.config import Task
    task = Task.load(toy, TASK)
    workers = pool.DaskPool(task, "smoke", False, toy.parent / "attempts", [pool.Slot("", False)] * 2,
                            cluster.scheduler_address)
    try:
        best = toy / TASK / "main"
        jobs = [pool.Job(1, "good", best, best, True, None, None), pool.Job(2, "bad", best, best, True, None, None)]
        broken = workers._payload(jobs[1], None, False)
        monkeypatch.setattr(workers, "_payload", lambda job, limit, full: broken if job.name == "bad"
                            else pool.DaskPool._payload(workers, job, limit, full))
        broken["task"] = "no-such-task"
        good, bad = workers.evaluate(jobs, None, False)
    finally:
        workers.close()
    assert good["correct"] and good["worker_host"]
    assert bad["failed_stage"] == "worker" and "TaskError: no task 'no-such-task'" in bad["stages"][0]["note"]
    assert (toy.parent / "attempts" / "good" / "selfcheck.json").is_file(), "the worker's reports came back"


def test_a_cluster_worker_that_dies_mid_evaluation_costs_its_job_at_once_and_the_other_goes_on(toy: Path, cluster):
    """Dask would move a dead worker's job to the other worker, behind that one's own job; pinned, the job fails as
    soon as its worker is gone, not when its evaluation would have ended."""
    import os
    import signal
    import threading
    workers = pool.DaskPool(Task.load(toy, TASK), "smoke", False, toy.parent / "attempts", [pool.Slot("", False)] * 2,
                            cluster.scheduler_address)
    best, slow = toy / TASK / "main", toy.parent / "slow"
    shutil.copytree(best, slow)
    # minutes of pure Python when the evaluator imports it (the source policy refuses sleeps)
    (slow / "solution.py").write_text((best / "solution.py").read_text() + "\nSPUN = sum(1 for _ in range(10**10))\n")
    jobs = [pool.Job(1, "good", best, best, True, None, None), pool.Job(2, "slow", slow, best, True, None, None)]
    pids = workers.client.run(os.getpid)
    doomed = sorted(workers.live_workers())[1]  # the second job's worker: jobs are pinned in that order
    killer = threading.Timer(5.0, os.kill, (pids[doomed], signal.SIGKILL))
    started = time.monotonic()
    killer.start()
    try:
        good, lost = workers.evaluate(jobs, None, False)
    finally:
        killer.cancel()
        workers.close()
    assert good["correct"] and good["worker_address"] != doomed
    assert lost["failed_stage"] == "worker", lost
    assert f"{doomed} is no longer in the cluster (it died or was stopped)" in lost["stages"][0]["note"], lost
    assert time.monotonic() - started < 150, "the lost job was waited for until its evaluation's end"


class Forcing(pool.LocalPool):
    """The real local workers (CPU, interpreter), whose verdicts for one iteration say keep, as a GPU's would for a
    faster candidate: the loop's keep path on a CPU machine. The alone evaluation keeps it too."""
    keeper = 2

    def evaluate(self, jobs, limit_s, full_check, slots=None):
        verdicts = super().evaluate(jobs, limit_s, full_check, slots)
        for job, found in zip(jobs, verdicts):
            if job.iteration == self.keeper:
                found.update(keep=True, speedup_over_best=1.2, noise=0.01, gpu_timing=True)
        return verdicts

    def evaluate_alone(self, job, slot, limit_s, full_check, worker=None):
        found = super().evaluate_alone(job, slot, limit_s, full_check, worker)
        return found | {"keep": True, "speedup_over_best": 1.15, "noise": 0.01, "gpu_timing": True}


def test_a_batch_that_keeps_records_every_member_against_the_best_it_came_from(toy: Path, monkeypatch, capsys):
    from agent import __main__ as cli
    from agent import loop
    monkeypatch.setattr(cli, "ROOT", toy)
    monkeypatch.chdir(toy)
    monkeypatch.setattr(loop, "make_pool", lambda task, config, attempts: Forcing(
        task, config.panel, config.cuda, attempts, pool.make_slots(config.workers)))
    code = cli.main(["run", "--task", TASK, "--iters", "4", "--panel", "smoke", "--backend", "offline",
                     "--workers", "2", "--plain"])
    assert code == 0, capsys.readouterr()
    found = assert_one_record_per_attempt(toy, 4)
    cells = [r.split(" | ") for r in rows(toy)]
    assert [c[4] for c in cells] == ["v0", "v0", "v2", "v2"], "members' parents: the best their batch came from"
    assert cells[1][-3].startswith("keep (1.150x best, noise 0.010, evaluated again alone)"), cells[1]
    assert found[1]["eval_dir"].endswith("-alone") and found[1]["verdict"]["beside_others"]["speedup_over_best"] == 1.2
    (state,) = runs(toy)
    assert state["best_label"] == "v2"
    best_check = toy / "workspace" / ".runs" / state["run_id"] / "best_selfcheck.json"
    alone = toy / "workspace" / ".runs" / state["run_id"] / "attempts" / found[1]["eval_dir"] / "selfcheck.json"
    assert best_check.read_text() == alone.read_text(), "the best's reference is its evaluation alone"
    candidate = toy / "workspace" / state["run_id"] / TASK / "main" / "solution.py"
    assert candidate.read_text() == (toy / TASK / "versions" / "v2" / "solution.py").read_text()


def test_a_cluster_of_another_kind_or_gone_is_refused_or_stops_the_run(toy: Path, cluster):
    from agent.__main__ import Refused, cluster_workers
    from agent.config import Task
    from agent.exceptions import EndpointUnavailable
    assert cluster_workers(cluster.scheduler_address, cuda=False) == 2
    with pytest.raises(Refused, match="must be of this host's kind, a CUDA GPU"):
        cluster_workers(cluster.scheduler_address, cuda=True)  # this host's workers have no GPU
    workers = pool.DaskPool(Task.load(toy, TASK), "smoke", False, toy.parent / "attempts", [pool.Slot("", False)],
                            cluster.scheduler_address)
    try:
        workers.check()  # workers there: nothing to say
        cluster.scale(0)
        deadline = time.monotonic() + 30
        while workers.client.scheduler_info().get("workers") and time.monotonic() < deadline:
            time.sleep(0.2)
        with pytest.raises(EndpointUnavailable, match="has no workers .* resumable once the cluster is back"):
            workers.check()
    finally:
        workers.close()


def test_an_interrupt_kills_every_workers_evaluation_and_starts_no_more(tmp_path, monkeypatch, request):
    """A second Ctrl-C reaches the main thread only: the batch kills the workers' process groups, and the stages they
    would go on to never start."""
    import signal
    import threading

    from agent import runner
    monkeypatch.setattr(runner, "_STOPPED", set())
    monkeypatch.setattr(pool, "Evaluator", sleeper(tmp_path))
    task = types.SimpleNamespace(eval_timeout_s=120.0, stages=())
    workers = pool.LocalPool(task, "smoke", True, tmp_path, pool.make_slots(["", ""]))
    jobs = [pool.Job(i, f"j{i}", tmp_path / "long", tmp_path, False, None, None) for i in range(2)]
    # Ctrl-C raises as in an interactive shell (a shell without job control starts background jobs ignoring SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    sent = {}

    def ctrl_c() -> None:  # as a terminal sends it, to the main thread, once both evaluations sleep their 60 s
        deadline = time.monotonic() + 30
        while len(runner._RUNNING) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        sent.update(running=len(runner._RUNNING), at=time.monotonic() - started)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    started = time.monotonic()
    threading.Thread(target=ctrl_c, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        verdicts = workers.evaluate(jobs, 120.0, False)
        pytest.fail(f"the batch ended without the interrupt, {time.monotonic() - started:.1f} s in (Ctrl-C sent "
                    f"{sent}; handler now {signal.getsignal(signal.SIGINT)}): {str(verdicts)[:1500]}")
    deadline = time.monotonic() + 15
    while runner._RUNNING and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not runner._RUNNING and time.monotonic() - started - sent["at"] < 15, "an evaluation outlived the interrupt"
    assert run_command([sys.executable, "-c", "print(1)"], tmp_path, 10)["output"].startswith("[not started")


def test_a_cluster_asked_for_more_workers_than_it_has_is_refused(toy: Path, cluster):
    done = subprocess.run(agent_command("run", "--task", TASK, "--iters", "2", "--panel", "smoke", "--backend",
                                        "offline", "--cluster", cluster.scheduler_address, "--workers", "3"),
                          cwd=toy, env=agent_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--workers 3: the cluster at" in done.stderr and "has 2 worker(s)" in done.stderr
    assert not entries(toy) and not runs(toy)


def fake_run(tools):  # noqa: F811
    """What Run.context reads of a run, without the run."""
    return types.SimpleNamespace(task=tools.task, tools=tools, proposer=types.SimpleNamespace(max_steps=3),
                                 best_profile=lambda: None, session_start=time.monotonic(),
                                 config=types.SimpleNamespace(cuda=False, iters=4, time_limit_min=None),
                                 state=types.SimpleNamespace(last_verdict=None, run_id="r", best_label="v0",
                                                             best_score=1.0, history=[]))


def test_a_models_prompt_lists_the_batchs_earlier_members(tools):  # noqa: F811
    from agent.loop import Run
    run = fake_run(tools)
    plain = Run.context(run, 2).prompts["iteration"]
    batch_member = Run.context(run, 2, ["BLOCK_SIZE_N 64->128", "num_warps 4->8"]).prompts["iteration"]
    assert "Proposed in this batch" not in plain
    assert "# Proposed in this batch, not yet evaluated (propose something else)\n\n- BLOCK_SIZE_N 64->128\n" \
        "- num_warps 4->8\n\nPropose the next change" in batch_member


def test_the_context_marks_the_last_iteration_by_the_iteration_limit_or_the_clock(tools):  # noqa: F811
    from agent.loop import Run
    run = fake_run(tools)
    assert not Run.context(run, 2).last and Run.context(run, 4).last  # the iteration limit's last
    # a time limit: the attempts' walls (as apply() keeps them) against the time left
    run.config.time_limit_min, run.state.history = 1.0, [{"wall_s": 30.0}, {"wall_s": 40.0}, {}]
    run.session_start = time.monotonic() - 25.0  # 35 s left: less than a typical attempt (40 s)
    assert Run.context(run, 2).last
    run.session_start = time.monotonic()  # 60 s left
    assert not Run.context(run, 2).last
