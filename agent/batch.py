"""A parallel run's step: a batch of distinct candidates proposed from the best, evaluated side by side (one worker
each: agent/pool.py), then recorded in order exactly as a plain run records one attempt (its vN, row, index line and
commit), keeping at most one.

Each verdict compares its candidate with the best timed in the same process on its worker's GPU, so a ratio never
mixes GPUs. Of the batch's would-be keepers (where there is none: of the candidates timed faster than the best beside
another worker on their GPU yet refused, since that timing's noise refutes nothing) the one with the largest ratio is
evaluated again, whole, alone (no other worker running) on its worker's GPU, and kept only if that verdict keeps it:
its selfcheck, its comparison with the best and its qualification are then the run's reference, as a plain run's are.
The others are reverted, and their rows say which attempt was faster. Timings taken beside another worker on the same
GPU are marked shared in the verdict, the index line and the row's decision.

A kill at any instant loses nothing recorded: a recorded member is finished by ``Run.recover``; an unrecorded one is
proposed again.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from agent import ledger
from agent.exceptions import EndpointUnavailable, LimitsExceeded
from agent.loop import Attempt, decision, eval_name, verdict_decision
from agent.pool import Job, Slot
from agent.proposers import Usage
from agent.workspace import replace_solution

REPROPOSALS = 2
"""A proposer that repeats the best or a candidate already in the batch is asked again: the batch asks at most
(1 + REPROPOSALS) times its size in all."""


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
    run.pool.check()
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
    slots = batch_slots(run.pool.slots[:len(jobs)])
    run.display.line(f"batch of {len(jobs)}: iterations {first}-{first + len(jobs) - 1} on "
                     + ", ".join(worker_label(slot) for slot in slots))
    started = time.monotonic()
    verdicts = run.pool.evaluate(jobs, run.state.eval_limit_s, run.config.full_check, slots)
    spans = [verdict.pop("worker_span", None) for verdict in verdicts]  # a cluster worker's [start, end]
    for verdict, slot in zip(verdicts, slots):
        verdict["worker"] = worker_of(verdict, slot)
    mark_shared(verdicts, spans)
    jobs, lost = choose(run, jobs, verdicts, slots)
    eval_s = time.monotonic() - started  # the batch's evaluations side by side, and its keeper's evaluation alone
    for proposal, job, verdict in zip(proposals, jobs, verdicts):
        replace_solution(run.tools.candidate, proposal.snapshot)
        # its worker's time, not the batch's (a keeper's: beside the others, then alone)
        own_s = seconds(verdict) + (verdict.get("beside_others") or {}).get("seconds", 0.0)
        attempt = Attempt(proposal.iteration, proposal.summary, proposal.hypothesis, proposal.usage,
                          proposal.propose_s, own_s, job.name, verdict)
        run.record(attempt, parent, {"worker": verdict["worker"], "batch": [jobs[0].iteration, jobs[-1].iteration],
                                     "batch_eval_s": round(eval_s, 2)})
    replace_solution(run.tools.candidate, run.best_dir)
    shutil.rmtree(folder, ignore_errors=True)
    if lost:  # the cluster went during the keeper's evaluation alone: the batch is recorded, the run stops
        raise lost


def worker_of(verdict: dict, slot: Slot) -> dict:
    """Where a verdict was measured: its GPU and host (a cluster's worker says; else the slot), and whether the GPU
    was shared with another worker of the batch."""
    return {"gpu": verdict.pop("worker_gpu", slot.gpu), "host": verdict.pop("worker_host", None),
            "address": verdict.pop("worker_address", None), "shared": slot.shared}


def mark_shared(verdicts: list[dict], spans: list[list[float] | None]) -> None:
    """Cluster verdicts timed on one host's same GPU (CUDA_VISIBLE_DEVICES, unset read as device 0) while another ran
    there are marked shared, as local slots are before they run: a cluster's slots cannot know where their jobs will
    go. Two jobs one worker ran one after the other did not share. A job whose worker failed reports no span, so
    the one that ran beside it goes unmarked."""
    def place(verdict: dict) -> tuple:
        return verdict["worker"]["host"], verdict["worker"]["gpu"] or "0"

    for i, (verdict, span) in enumerate(zip(verdicts, spans)):
        if span is None or not verdict["worker"]["host"]:
            continue
        verdict["worker"]["shared"] = verdict["worker"]["shared"] or any(
            j != i and other is not None and verdicts[j]["worker"]["host"] and place(verdicts[j]) == place(verdict)
            and span[0] < other[1] and other[0] < span[1] for j, other in enumerate(spans))


def seconds(verdict: dict) -> float:
    return round(sum(stage.get("seconds") or 0.0 for stage in verdict["stages"]), 2)


def batch_slots(slots: list[Slot]) -> list[Slot]:
    """The batch's slots, each shared only where another of them has the same GPU."""
    gpus = [slot.gpu for slot in slots]
    return [Slot(slot.gpu, slot.shared and gpus.count(slot.gpu) > 1) for slot in slots]


def propose(run, first: int, size: int, folder: Path) -> list[Proposal]:
    """Up to ``size`` candidates, each from the best and distinct from the best and from each other; the proposer
    knows the earlier ones (``IterationContext.pending``). Fewer when the proposer runs out of moves; none raises
    what a plain step raises (LimitsExceeded, EndpointUnavailable). A repeated proposal's tokens and time go with
    the next member."""
    proposals: list[Proposal] = []
    seen = {ledger.solution_sha256(run.best_dir)}
    asked, carried, carried_s = 0, Usage(), 0.0
    while len(proposals) < size and asked < size * (1 + REPROPOSALS):
        if run.stop_reason and proposals:  # Ctrl-C: evaluate and record what was proposed, propose no more
            break
        asked += 1
        iteration = first + len(proposals)
        sources = [(p.snapshot / "solution.py").read_text() for p in proposals
                   if (p.snapshot / "solution.py").is_file()]
        context = run.context(iteration, [p.summary for p in proposals])
        context.pending, context.pending_sources = [p.identity for p in proposals], sources
        started = time.monotonic()
        try:
            summary, hypothesis = run.propose(context)
        except (LimitsExceeded, EndpointUnavailable):  # no more from the proposer: evaluate what the batch has
            if proposals:
                break
            raise
        usage = Usage(carried.prompt_tokens + context.usage.prompt_tokens,
                      carried.completion_tokens + context.usage.completion_tokens,
                      carried.cost_usd + context.usage.cost_usd)
        spent_s = carried_s + time.monotonic() - started
        identity = ledger.solution_sha256(run.tools.candidate)
        if identity in seen:
            run.display.line(f"batch: the proposal for iteration {iteration} repeats the best or an earlier member: "
                             "asked again")
            replace_solution(run.tools.candidate, run.best_dir)
            carried, carried_s = usage, spent_s
            continue
        seen.add(identity)
        snapshot = folder / f"{iteration:03d}"
        replace_solution(snapshot, run.tools.candidate)
        replace_solution(run.tools.candidate, run.best_dir)
        proposals.append(Proposal(iteration, summary, hypothesis, usage, spent_s, snapshot, identity))
        carried, carried_s = Usage(), 0.0
    if not proposals:
        raise LimitsExceeded("the proposer repeated the best or its own candidates "
                             f"{asked} times in a row: nothing new to evaluate")
    return proposals


def choose(run, jobs: list[Job], verdicts: list[dict], slots: list[Slot]) -> tuple[list[Job], Exception | None]:
    """Keep at most one: the would-be keeper with the largest ratio to the best, once evaluated again alone (its
    verdict then stands for the attempt, and its folder is the job's). The jobs, with that one's folder, and the
    cluster's loss (EndpointUnavailable) if it happened during that evaluation, for the caller to raise once the batch
    is recorded."""
    keepers = [i for i, verdict in enumerate(verdicts) if verdict["keep"]]
    # where none would be kept, the fastest refused beside another worker on its GPU is tried alone
    hopeful = [] if keepers else [i for i, verdict in enumerate(verdicts) if refuted_by_sharing(verdict)]
    if not keepers and not hopeful:
        return jobs, None
    winner = max(keepers or hopeful, key=lambda i: verdicts[i]["speedup_over_best"] or 0.0)
    top, lost, chosen = verdicts[winner], None, jobs
    for i in keepers:
        verdicts[i]["keep"] = i == winner
    if len(jobs) > 1:
        alone_job = replace(jobs[winner], name=jobs[winner].name + "-alone")
        try:
            alone = run.pool.evaluate_alone(alone_job, slots[winner], run.state.eval_limit_s, run.config.full_check,
                                            top["worker"])
        except EndpointUnavailable as exc:
            alone, lost = None, exc
        if alone is not None and alone["keep"]:
            alone.pop("worker_span", None)
            alone["worker"] = worker_of(alone, replace(slots[winner], shared=False))
            verdicts[winner] = alone | {"evaluated_alone": True, "beside_others": summary_of(top)}
            chosen = [alone_job if i == winner else job for i, job in enumerate(jobs)]
        else:
            why = decision(alone) if alone is not None else f"lost: {lost}"
            refused = "" if top["keep"] else f"{verdict_decision(top)} beside another worker; "
            top["keep"], top["batch_note"] = False, f"{refused}evaluated again alone: {why}"
            top["stages"].append({"name": "alone", "ok": bool(alone and alone["valid"]), "returncode": None,
                                  "seconds": seconds(alone) if alone else 0.0, "note": top["batch_note"],
                                  "output": ""})
    kept = verdicts[winner]["keep"]
    for i in keepers:
        if i != winner:
            verdicts[i]["batch_note"] = (f"iteration {jobs[winner].iteration} was faster against the best "
                                         f"({top['speedup_over_best']:.3f}x against "
                                         f"{verdicts[i]['speedup_over_best']:.3f}x)"
                                         + ("" if kept else ", then not kept alone; this one was not tried alone"))
    return chosen, lost


def refuted_by_sharing(verdict: dict) -> bool:
    """A valid candidate timed on a GPU faster than the best beside another worker there, yet not kept: the shared
    timing's noise (or its stability probe) may be all that refused it, so it is worth an evaluation alone (shared
    noise reached 0.41 on an H100: reports/examples/parallel-one-gpu)."""
    return bool((verdict.get("worker") or {}).get("shared")) and bool(verdict.get("valid")) \
        and bool(verdict.get("gpu_timing")) and (verdict.get("speedup_over_best") or 0.0) > 1.0


def summary_of(verdict: dict) -> dict:
    """What a verdict said beside the other workers, kept in the verdict that replaces it."""
    return {key: verdict.get(key) for key in ("score", "speedup_over_best", "noise", "stable", "worker")} | {
        "seconds": seconds(verdict)}


def worker_label(slot: Slot) -> str:
    where = f"GPU {slot.gpu}" if slot.gpu else "the default device"
    return where + (" (shared)" if slot.shared else "")
