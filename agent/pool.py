"""Parallel candidates: the evaluations of one batch side by side, each on a worker pinned to one GPU.

On this host (``LocalPool``) a worker is a thread driving the evaluator's subprocesses with CUDA_VISIBLE_DEVICES set
to its GPU. On a Dask cluster (``DaskPool``, ``--cluster ADDRESS``) it is a task on a cluster worker, which runs the
same evaluator, in subprocesses, in its own checkout of the project (``KLOOP_ROOT`` there, else the path the agent
runs from); start one worker per GPU, pinned, with a resource of one GPU:

    CUDA_VISIBLE_DEVICES=0 dask worker tcp://HOST:8786 --nworkers 1 --nthreads 1 --resources GPU=1

Either way a worker that raises, dies or gives no verdict in time costs its attempt (a failed ``worker`` stage, then
recorded like any attempt), never the run; a cluster left with no worker stops the run (EndpointUnavailable: resumable
once it is back), where it would otherwise spend every remaining attempt on failures. Each cluster job is pinned to
one live worker, and the agent watches that worker while it waits: one that leaves the cluster costs its job at
once, where Dask would move the job to another worker (behind that worker's own job, which then timed beside the
lost one; on an H100 a run made no progress for minutes after a worker died: reports/examples/parallel-one-gpu).

Why Dask rather than Ray: the GPU machines install from carried wheels; dask and distributed with everything they
need are 5.4 MB of wheels, Ray's own wheel alone 79 MB (ray 2.60, CPython 3.11, x86-64 Linux). Dask's scheduler
gives what the loop needs and no more: submit a function pinned to a worker with a resource (GPU=1), and list the
workers still there.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

from agent import ledger, runner
from agent.config import Task
from agent.evaluate import Evaluator, Stage
from agent.exceptions import EndpointUnavailable

POLL_S = 2.0
"""How often the agent asks whether a cluster job's worker is still there while it waits for the verdict."""

GRACE_S = 60.0
"""A worker's verdict may take its stages' limits plus this (start-up, the stages' own overheads) before the worker
is given up."""


@dataclass
class Slot:
    gpu: str
    """The worker's CUDA_VISIBLE_DEVICES; "" keeps the agent's environment (on a cluster: the worker's own)."""
    shared: bool
    """Another worker of the run has the same GPU: its timings share the device."""


def make_slots(workers: list[str]) -> list[Slot]:
    return [Slot(gpu, workers.count(gpu) > 1) for gpu in workers]


@dataclass
class Job:
    """One candidate of a batch, as its evaluation needs it."""
    iteration: int
    name: str
    """Its evaluation's folder under the run's attempts/."""
    candidate: Path
    """A snapshot of the candidate's files."""
    best: Path
    best_is_baseline: bool
    best_score: float | None
    best_check: dict | None


def failed_verdict(panel: str, cuda: bool, note: str, seconds: float = 0.0) -> dict:
    """The verdict of an attempt whose worker gave none: not valid, its ``worker`` stage failed with ``note``."""
    stage = Stage("worker", False, None, seconds, note, None).summary()
    return {"stages": [stage], "failed_stage": "worker", "panel": panel, "gpu_timing": cuda, "correct": None,
            "raised": False, "strata": {}, "score": None, "cases": [], "stable": "-", "stability_note": "",
            "unstable": [], "note": f"worker: {note}", "valid": False, "keep": False, "speedup_over_best": None,
            "noise": None}


def worker_limit(stage_limit_s: float, stages: int) -> float:
    """How long a worker may take for one verdict: every stage at its limit, and the grace."""
    return stage_limit_s * max(1, stages) + GRACE_S


class LocalPool:
    """Workers on this host: one thread per slot, each evaluation's subprocesses pinned to the slot's GPU."""

    def __init__(self, task: Task, panel: str, cuda: bool, attempts: Path, slots: list[Slot]):
        self.task, self.panel, self.cuda, self.attempts, self.slots = task, panel, cuda, attempts, slots

    def wait_s(self, limit_s: float | None) -> float:
        return worker_limit(limit_s or self.task.eval_timeout_s, len(self.task.stages) + 2)

    def _evaluate(self, job: Job, slot: Slot, limit_s: float | None, full_check: bool) -> dict:
        evaluator = Evaluator(self.task, self.panel, self.cuda, self.attempts / job.name, limit_s, gpu=slot.gpu)
        with runner.job(job.name):  # its process groups carry its name: a timeout kills them alone
            return evaluator.evaluate(job.candidate, job.best, job.best_is_baseline, full_check, job.best_score,
                                      job.best_check)

    def evaluate(self, jobs: list[Job], limit_s: float | None, full_check: bool,
                 slots: list[Slot] | None = None) -> list[dict]:
        """The verdict of each job, in order, on the slot of the same position (``slots``, default the pool's), side
        by side. An interrupt kills every evaluation's process group before it goes on (runner.kill_running)."""
        wait = self.wait_s(limit_s)
        pool = ThreadPoolExecutor(max(1, len(jobs)), thread_name_prefix="kloop-worker")
        try:
            futures = [pool.submit(self._evaluate, job, slot, limit_s, full_check)
                       for job, slot in zip(jobs, slots or self.slots)]
            started = time.monotonic()
            return [self._result(job, future, started, wait) for job, future in zip(jobs, futures)]
        except BaseException:  # Ctrl-C twice, or the agent's own failure: no evaluator outlives the batch
            runner.kill_running()
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # a hung worker's thread is left; its groups die at limits

    def _result(self, job: Job, future, started: float, wait: float) -> dict:
        try:
            return future.result(timeout=max(0.0, started + wait - time.monotonic()))
        except FutureTimeout:  # its evaluation ends here: nothing of it runs beside the next one
            runner.kill_running(job.name)
            return failed_verdict(self.panel, self.cuda, f"no verdict within {wait:.0f} s of the batch's start", wait)
        except Exception as exc:  # a bug or an OS error in the worker: its attempt fails, the batch goes on
            return failed_verdict(self.panel, self.cuda, f"the worker failed: {type(exc).__name__}: {exc}",
                                  time.monotonic() - started)

    def evaluate_alone(self, job: Job, slot: Slot, limit_s: float | None, full_check: bool,
                       worker: dict | None = None) -> dict:
        """The job evaluated again on ``slot`` (on a cluster: the ``worker`` its verdict names) with no other worker
        running: the verdict a keep rests on."""
        return self.evaluate([job], limit_s, full_check, [slot])[0]

    def check(self) -> None:
        """Raise EndpointUnavailable where the workers cannot take a batch (a cluster that is gone)."""

    def close(self) -> None:
        pass


def _files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in ledger.solution_files(directory)}


def _write(directory: Path, files: dict[str, bytes]) -> Path:
    directory.mkdir(parents=True)
    for name, data in files.items():
        (directory / Path(name).name).write_bytes(data)
    return directory


def remote_evaluate(payload: dict) -> dict:
    """On a cluster worker: the job's evaluation by the evaluator of the worker's own checkout, in a temporary
    folder; the verdict and the evaluator's JSON reports come back."""
    started = time.time()  # the worker host's clock: spans of one host compare (batch.mark_shared)
    root = Path(os.environ.get("KLOOP_ROOT") or payload["root"])
    folder = root / payload["task"]  # the task's folder relative to the checkout, or a name under tasks/
    task = Task.load(root, str(folder) if (folder / "task.json").is_file() else payload["task"])
    with tempfile.TemporaryDirectory(prefix="kloop-worker-") as tmp:
        candidate = _write(Path(tmp) / "candidate", payload["candidate"])
        best = _write(Path(tmp) / "best", payload["best"])
        panel = payload["panel"]
        if payload.get("panel_text") is not None:
            panel = str(Path(tmp) / "panel.json")
            Path(panel).write_text(payload["panel_text"])
        work = Path(tmp) / "evaluation"
        with runner.job(payload["name"]):  # the agent may stop it by name (kill_running on this worker)
            verdict = Evaluator(task, panel, payload["cuda"], work, payload["limit_s"]).evaluate(
                candidate, best, payload["best_is_baseline"], payload["full_check"], payload["best_score"],
                payload["best_check"])
        reports = {path.name: path.read_text() for path in work.glob("*.json")}
    from distributed import get_worker

    return {"verdict": verdict | {"panel": payload["panel"]}, "reports": reports, "host": socket.gethostname(),
            "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "address": get_worker().address,
            "span": [started, time.time()]}


def worker_facts() -> dict:
    """On a cluster worker: whether it has a CUDA GPU (asked in a subprocess, as the agent asks of its own host)."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=300)
    return {"cuda": probe.stdout.strip() == "True", "host": socket.gethostname()}


class DaskPool(LocalPool):
    """Workers of a Dask cluster: each job a task that needs one GPU of a worker (on a GPU run), its files shipped."""

    def __init__(self, task: Task, panel: str, cuda: bool, attempts: Path, slots: list[Slot], address: str):
        super().__init__(task, panel, cuda, attempts, slots)
        self.address, self.client = address, connect(address)

    def _payload(self, job: Job, limit_s: float | None, full_check: bool) -> dict:
        panel_path = Path(self.panel)
        return {"name": job.name, "root": str(self.task.root), "task": self.task.folder, "panel": self.panel,
                "panel_text": panel_path.read_text() if panel_path.is_file() else None, "cuda": self.cuda,
                "limit_s": limit_s, "candidate": _files(job.candidate), "best": _files(job.best),
                "best_is_baseline": job.best_is_baseline, "full_check": full_check, "best_score": job.best_score,
                "best_check": job.best_check}

    def _gather(self, job: Job, future, worker: str, started: float, wait: float) -> dict:
        """The worker's verdict (its reports written into the job's evaluation folder), or a failed one with the
        future cancelled: no verdict by ``started + wait``, the worker gone from the cluster, an error raised in the
        task."""
        while not future.done():
            if time.monotonic() > started + wait:
                why = f"no verdict within {wait:.0f} s"
            elif worker not in self.live_workers():
                why = f"{worker} is no longer in the cluster (it died or was stopped)"
            else:
                time.sleep(POLL_S)
                continue
            self._stop(job, future)
            return failed_verdict(self.panel, self.cuda, why, time.monotonic() - started)
        try:  # done: the fetch is quick, unless the worker holding the result died meanwhile (never run again)
            result = future.result(timeout=GRACE_S)
        except Exception as exc:
            self._stop(job, future)
            return failed_verdict(self.panel, self.cuda, f"the worker failed: {type(exc).__name__}: {exc}",
                                  time.monotonic() - started)
        folder = self.attempts / job.name
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in result["reports"].items():
            (folder / Path(name).name).write_text(text)
        return result["verdict"] | {"worker_host": result["host"], "worker_gpu": result["gpu"],
                                    "worker_address": result["address"], "worker_span": result["span"]}

    def _stop(self, job: Job, future) -> None:
        """Cancel a job and kill its evaluation where a worker still runs it (a cancel alone stops no running task)."""
        future.cancel()
        try:
            self.client.run(runner.kill_running, job.name)
        except Exception:  # a cluster that is gone has nothing left running
            pass

    def evaluate(self, jobs: list[Job], limit_s: float | None, full_check: bool,
                 slots: list[Slot] | None = None) -> list[dict]:
        return self._run(jobs, limit_s, full_check, None)

    def _run(self, jobs: list[Job], limit_s: float | None, full_check: bool, worker: str | None) -> list[dict]:
        """The jobs' verdicts, each job pinned to one live worker (``worker`` if given; else one each, in turn, where
        the batch has more jobs than the cluster has workers left: those run one after another)."""
        started, wait = time.monotonic(), self.wait_s(limit_s)
        live = sorted(self.live_workers())
        if not live:
            raise self.gone()
        targets = [worker] * len(jobs) if worker else [live[i % len(live)] for i in range(len(jobs))]
        # a worker runs its jobs one after another: the k-th may take k limits from the batch's start
        waits = [wait * targets[:i + 1].count(target) for i, target in enumerate(targets)]
        placed = {"resources": {"GPU": 1}} if self.cuda else {}
        futures = [self.client.submit(remote_evaluate, self._payload(job, limit_s, full_check), pure=False,
                                      workers=[target], allow_other_workers=False, **placed)
                   for job, target in zip(jobs, targets)]
        try:
            verdicts = [self._gather(job, future, target, started, limit)
                        for job, future, target, limit in zip(jobs, futures, targets, waits)]
        except BaseException:  # Ctrl-C twice: no evaluation left running on the cluster
            for job, future in zip(jobs, futures):
                self._stop(job, future)
            raise
        if all(verdict["failed_stage"] == "worker" for verdict in verdicts):  # is the cluster still there?
            self.check()
        return verdicts

    def evaluate_alone(self, job: Job, slot: Slot, limit_s: float | None, full_check: bool,
                       worker: dict | None = None) -> dict:
        return self._run([job], limit_s, full_check, (worker or {}).get("address"))[0]

    def live_workers(self) -> set[str]:
        """The addresses of the cluster's workers now (a GPU run's: those with a GPU resource); none where the
        scheduler is gone."""
        try:
            workers = scheduler_workers(self.client) if self.client.status == "running" else {}
        except Exception:  # a scheduler that is gone
            return set()
        return {address for address, info in workers.items()
                if not self.cuda or (info.get("resources") or {}).get("GPU")}

    def gone(self) -> EndpointUnavailable:
        return EndpointUnavailable(f"the Dask cluster at {self.address} has no workers (or no scheduler) left: the "
                                   "run stops here, resumable once the cluster is back")

    def check(self) -> None:
        if not self.live_workers():
            raise self.gone()

    def close(self) -> None:
        self.client.close()


def scheduler_workers(client) -> dict[str, dict]:
    """Every worker the scheduler knows, by address (some versions of distributed list 5 unless asked for all)."""
    try:
        return client.scheduler_info(n_workers=-1).get("workers", {})
    except TypeError:  # a version without the keyword lists them all
        return client.scheduler_info().get("workers", {})


def connect(address: str):
    """A client of the Dask scheduler at ``address``; ConnectionError with what to do where it cannot be reached."""
    try:
        from distributed import Client
    except ModuleNotFoundError as exc:
        raise ConnectionError("--cluster needs the 'distributed' package (dask): run `make setup`") from exc
    try:
        return Client(address, timeout="15s")
    except (OSError, TimeoutError) as exc:
        raise ConnectionError(f"no Dask scheduler answered at {address} ({type(exc).__name__}: {exc}); start one "
                              "(`dask scheduler`) and its workers (`dask worker ADDRESS --resources GPU=1`), or "
                              "leave --cluster out") from None
