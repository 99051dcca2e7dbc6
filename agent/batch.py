"""A parallel run's step: a batch of distinct candidates proposed from the best, evaluated side by side (one worker
each: agent/pool.py), then recorded in order exactly as a plain run records one attempt (its vN, row, index line and
commit), keeping at most one.

Each verdict compares its candidate with the best timed in the same process on its worker's GPU, so a ratio never
mixes GPUs. Of the batch's would-be keepers the one with the largest ratio is timed against the best once more, alone
(no other worker running), and kept only if that comparison keeps it too; the others are reverted, and their rows say
which attempt was faster. Timings taken beside another worker on the same GPU are marked shared in the verdict, the
index line and the row's decision.

A kill at any instant loses nothing recorded: a recorded member is finished by ``Run.recover``; an unrecorded one is
proposed again.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from agent import ledger
from agent.loop import Attempt, eval_name
from agent.evaluate import compare
from agent.exceptions import EndpointUnavailable, LimitsExceeded, ProposerError, Submitted
from agent.pool import Job, Slot
from agent.proposers import Usage
from agent.workspace import replace_solution

REPROPOSALS = 2
"""A proposer that repeats a candidate already in the batch is asked again, up to this many times per member."""


@dataclass
class Proposal:
    iteration: int
    summary: str
    hypothesis: str
    usage: Usage
    propose_s: float
    snapshot: Path
    identity: str


def step(run) -> None:
    """One batch: propose, evaluate side by side, choose, record in order."""
    run.check_limits()
    first = run.state.attempts + 1
    size = min(len(run.pool.slots), run.config.iters - run.state.attempts)
    parent = (run.state.best_label, run.best_dir)
    folder = run.workspace.state_dir / "batch"
    shutil.rmtree(folder, ignore_errors=True)  # a killed batch's unrecorded members: proposed again
    folder.mkdir(parents=True)
    last = run.state.history[-1]["decision"] if run.state.history else "-"
    run.display.status(first, f"{run.state.best_label} ({ledger.fmt(run.state.best_score)})", last)
    proposals = propose(run, first, size, folder)
    jobs = [Job(p.iteration, eval_name(p.iteration), p.snapshot, parent[1], run.state.best_is_baseline,
                run.state.best_score, run.best_profile()) for p in proposals]
    run.display.line(f"batch of {len(jobs)}: iterations {first}-{first + len(jobs) - 1} on "
                     + ", ".join(worker_label(slot, len(jobs) > 1) for slot in run.pool.slots[:len(jobs)]))
    started = time.monotonic()
    verdicts = run.pool.evaluate(jobs, run.state.eval_limit_s, run.config.full_check)
    slots = run.pool.slots[:len(jobs)]
    for verdict, slot in zip(verdicts, slots):
        verdict["worker"] = {"gpu": verdict.pop("worker_gpu", slot.gpu), "host": verdict.pop("worker_host", None),
                             "shared": slot.shared and len(jobs) > 1}
    choose(run, jobs, verdicts, slots)
    eval_s = time.monotonic() - started  # the batch's evaluations side by side, and the keeper's second timing
    for proposal, job, verdict in zip(proposals, jobs, verdicts):
        replace_solution(run.tools.candidate, proposal.snapshot)
        own_s = sum(stage.get("seconds") or 0.0 for stage in verdict["stages"])  # its worker's time, not the batch's
        attempt = Attempt(proposal.iteration, proposal.summary, proposal.hypothesis, proposal.usage,
                          proposal.propose_s, own_s, job.name, verdict)
        run.record(attempt, parent, {"worker": verdict["worker"], "batch": [jobs[0].iteration, jobs[-1].iteration],
                                     "batch_eval_s": round(eval_s, 2)})
    replace_solution(run.tools.candidate, run.best_dir)
    shutil.rmtree(folder, ignore_errors=True)


def propose(run, first: int, size: int, folder: Path) -> list[Proposal]:
    """Up to ``size`` candidates, each from the best and distinct from the best and from each other; the proposer
    knows the earlier ones (``IterationContext.pending``). Fewer when the proposer runs out of moves; none raises
    what a plain step raises (LimitsExceeded, EndpointUnavailable)."""
    proposals: list[Proposal] = []
    seen = {ledger.identity(files_of(run.best_dir))}
    asked = 0
    while len(proposals) < size and asked < size * (1 + REPROPOSALS):
        asked += 1
        iteration = first + len(proposals)
        context = run.context(iteration)
        context.pending = [p.identity for p in proposals]
        context.pending_sources = [(p.snapshot / "solution.py").read_text() for p in proposals
                                   if (p.snapshot / "solution.py").is_file()]
        started = time.monotonic()
        try:
            run.proposer.iterate(context, run.tools)
            summary, hypothesis = "(the proposer returned without submitting)", ""
        except Submitted as submitted:
            summary, hypothesis = submitted.summary, submitted.hypothesis
        except LimitsExceeded:
            if proposals:
                break
            raise
        except ProposerError as exc:
            if same_files_as(run.tools.candidate, run.best_dir):
                if proposals:
                    break
                raise EndpointUnavailable(f"the proposer produced no candidate: {exc}") from exc
            summary, hypothesis = f"(no submit: {exc})", ""
        finally:
            run.state.tokens += context.usage.tokens
            run.state.cost_usd += context.usage.cost_usd
            run.state.save(run.workspace.state_dir)
        identity = ledger.identity(files_of(run.tools.candidate))
        if identity in seen:
            run.display.line(f"batch: the proposal for iteration {iteration} repeats the best or an earlier member: "
                             "asked again")
            replace_solution(run.tools.candidate, run.best_dir)
            continue
        seen.add(identity)
        snapshot = folder / f"{iteration:03d}"
        replace_solution(snapshot, run.tools.candidate)
        replace_solution(run.tools.candidate, run.best_dir)
        proposals.append(Proposal(iteration, summary, hypothesis, context.usage, time.monotonic() - started,
                                  snapshot, identity))
    if not proposals:
        raise LimitsExceeded("the proposer repeated the best or its own candidates "
                             f"{asked} times in a row: nothing new to evaluate")
    return proposals


def choose(run, jobs: list[Job], verdicts: list[dict], slots: list[Slot]) -> None:
    """Keep at most one: the would-be keeper with the largest ratio to the best, once timed again alone."""
    keepers = [i for i, verdict in enumerate(verdicts) if verdict["keep"]]
    if not keepers:
        return
    winner = max(keepers, key=lambda i: verdicts[i]["speedup_over_best"] or 0.0)
    top = verdicts[winner]
    for i in keepers:
        if i != winner:
            verdicts[i]["keep"] = False
            verdicts[i]["batch_note"] = (f"iteration {jobs[winner].iteration} was faster against the best "
                                         f"({top['speedup_over_best']:.3f}x against "
                                         f"{verdicts[i]['speedup_over_best']:.3f}x)")
    if len(jobs) == 1:
        return
    stage = run.pool.retime(jobs[winner], slots[winner], run.state.eval_limit_s)
    again = compare(stage.report) if stage.ok else {"keep": False, "speedup_over_best": None, "noise": None}
    top["stages"].append(stage.summary())
    if again["keep"]:
        top.update(speedup_over_best=again["speedup_over_best"], noise=again["noise"], retimed_alone=True)
        return
    top["keep"] = False
    measured = (f"{again['speedup_over_best']:.3f}x best, noise {again['noise']:.3f}"
                if again["speedup_over_best"] is not None else stage.note)
    top["batch_note"] = f"timed again alone against the best: {measured}"


def worker_label(slot: Slot, beside_others: bool) -> str:
    where = f"GPU {slot.gpu}" if slot.gpu else "the default device"
    return where + (" (shared)" if slot.shared and beside_others else "")


def files_of(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in ledger.solution_files(directory)}


def same_files_as(candidate: Path, best: Path) -> bool:
    return files_of(candidate) == files_of(best)
