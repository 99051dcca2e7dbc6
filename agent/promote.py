"""Promotion by hand: `.venv/bin/python -m agent promote [--task T] vN [--verify] [--force]` (make promote [TASK=T]
V=N [VERIFY=1]): vN of the task's own versions into the task's main.

Says what vN's own ledger row decided and where its numbers came from, and asks for --force when the loop reverted
it (on a GPU: slower, unstable or failed) or when its numbers are Triton interpreter timings (CPU), which say nothing
about speed on a GPU. Re-runs the selfcheck and every check the task
declares on vN (on a GPU also the qualification under the verifier's schedule; a vN that is not stable is
said and its row's stable cell records it), and with --verify (a GPU) the full verifier on the panel too, the timing
gates included; refuses with the reason when any fails (unless --force, which the ledger records), copies vN's files
into the task's main and appends a promotion row (first cell `promote vN`). A refusal after the checks ran is a row
too (decision `refused (...)`, main unchanged): the minutes of measurement behind it are not lost; a verifier refusal
on the baseline's own timing alone says so, and that the same promotion can simply run again. It never changes the
versions, and never promotes a version another task recorded.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

from agent import ledger
from agent.config import Task
from agent.evaluate import Evaluator, baseline_noise_only
from agent.ledger import fmt
from agent.loop import make_hint, row_values
from agent.workspace import default_panel, replace_solution


def current_label(task: Task) -> str:
    """The version the task's main equals, by its files (main when it matches none)."""
    main = task.root / task.candidate_dir
    return (ledger.same_version(task, main) if (main / "solution.py").is_file() else None) or "main"


def recorded(task: Task, version: str) -> tuple[str | None, bool | None, str | None]:
    """The decision of ``version``'s own row, whether its numbers are GPU timings (None where not recorded) and the
    task its index line names (None for lines written before they named one)."""
    row = next((r for r in (ledger.parse_row(line, task) for line in ledger.rows(task))
                if r.get("version") == version), {})
    entry = next((e for e in ledger.index_entries(task) if e.get("version") == version), {})
    return row.get("decision"), (entry.get("verdict") or {}).get("gpu_timing"), entry.get("task")


def promote(task: Task, version: str, cuda: bool, force: bool = False, panel: str | None = None, log=print,
            note: str = "", verify: bool = False) -> int:
    source = task.versions / version
    if not re.fullmatch(r"v\d+", version) or not (source / "solution.py").is_file():
        log(f"promote: task {task.name} has no version {version} (expected vN with "
            f"{task.versions_dir}/vN/solution.py); another task's versions need its TASK=")
        return 2
    if verify and not cuda:
        log("promote: --verify needs a CUDA GPU: the verifier's timing gates do not run under the interpreter "
            "(promote without --verify here, and run make verify on a GPU); nothing promoted")
        return 2
    decision, gpu_timing, owner = recorded(task, version)
    if owner is not None and owner != task.name:
        log(f"promote: refused: {version} in {task.versions_dir} was recorded by task {owner}, not {task.name}; "
            f"nothing promoted (promote it as a version of its own task: make promote TASK={owner} V={version[1:]})")
        return 2
    origin = {True: "GPU timings", False: "Triton interpreter timings (CPU), not GPU timings",
              None: "of unrecorded origin"}[gpu_timing]
    log(f"task {task.name}, {version} ({task.versions_dir}/{version}): its own row: "
        f"{decision or 'none in ' + task.ledger}; its numbers are {origin}")
    # a version its loop reverted on a GPU is promoted only on the verifier's word (--verify) or by force; rows of
    # interpreter timings judged nothing (the check below stands for them)
    reverted = bool(decision) and decision.startswith("revert") and gpu_timing is not False
    if reverted and not verify and not force:
        log(f"promote: refused: the loop reverted {version} of task {task.name} (its row above says why); promote it "
            "on the verifier's word with --verify (VERIFY=1, a GPU), or pass --force (FORCE=1), which the ledger "
            "records; or name another task's version with its TASK=; nothing promoted")
        return 1
    # on a GPU the checks below measure it there; on CPU nothing would, so only --force promotes it
    interpreter_only = gpu_timing is False and not cuda
    if interpreter_only and not force:
        log(f"promote: refused: {version} was measured only under the interpreter, whose timings say nothing about "
            f"its speed on a GPU; promote it on a GPU machine ({make_hint(task, 'promote', V=version[1:])} there, "
            "which measures it first), or pass --force (FORCE=1), which the ledger records; nothing promoted")
        return 1
    panel = panel or default_panel(cuda)
    stamp = datetime.now(timezone.utc)
    evaluator = Evaluator(task, panel, cuda,
                          task.root / "workspace" / ".promotions" / f"{version}-{stamp:%Y%m%d-%H%M%S}")
    qualify = "qualification (if no case is host-bound), " if cuda and "qualify" in task.stages else ""
    log(f"checking {version} of task {task.name} on the {panel} panel ({'GPU' if cuda else 'CPU, Triton interpreter'})"
        f": source policy, selfcheck, {qualify}{', '.join(task.checks) or 'no further checks'}")
    verdict = evaluator.evaluate(source, source, best_is_baseline=True)  # the selfcheck times the task's baseline
    for stage in verdict["stages"]:
        log(f"  {stage['name']:<10} {'ok' if stage['ok'] else 'FAILED'}  "
            f"{stage['note'] if stage['note'] != 'ok' else ''}")
    parent = current_label(task)  # what the task's main is now, and stays if this is refused

    def record(summary: str, decision: str) -> None:
        # "promote vN", not "vN": the row records no new version, so ledger.rows() (the attempts) never counts it
        ledger.append_row(task, {"version": f"promote {version}", "sha256": ledger.solution_sha256(source),
                                 **row_values(task, verdict, stamp, run="promotion", backend="by hand", parent=parent,
                                              summary=summary + (f"; why: {note}" if note else ""),
                                              decision=decision, unchecked="-")})

    failed = verdict["failed_stage"] or "no score"
    evidence = evaluator.work_dir.relative_to(task.root)  # each stage's JSON report, the verifier's too
    if not verdict["valid"]:
        if not force:
            record(f"refused {version}: {failed}: {verdict['note'][:400]}; {task.candidate_dir} unchanged; "
                   f"reports in {evidence}", f"refused ({failed})")
            log(f"promote: refused: {version} fails {verdict['failed_stage']}: {verdict['note']} "
                "(--force overrides, and is recorded); the ledger records the refusal")
            return 1
        log(f"promote: forcing past {verdict['failed_stage']}; the ledger records it")
    if verdict["stable"].startswith("no"):  # said and recorded; --verify is the check that refuses
        log(f"promote: warning: {version} is not stable on this GPU, and the verifier's dispersion gate fails such a "
            f"solution: {verdict['stability_note']} (--verify runs the verifier itself)")
    verified = ""
    if verify:
        log(f"verifying {version} on the {panel} panel: every gate, then {task.baseline_label} before, {version}, "
            f"{task.baseline_label} after, one process each (several minutes on the visible panel)")
        stage = evaluator.verify(source)
        log(f"  verifier   {'ok' if stage.ok else 'FAILED'}  {stage.note}")
        if not stage.ok:
            # a refusal on the baseline's own timing alone is the hosts' noise, not the candidate's: say so and what
            # to do
            retry = (f"only the baseline's ({task.baseline_label}'s) own timing failed, {version}'s groups were within "
                     "the limit: run the same promotion again" if baseline_noise_only(stage.report or {}) else "")
            if not force:
                record(f"refused {version}: verifier on {Path(panel).name}: {stage.note[:400]}; "
                       + (f"{retry}; " if retry else "")
                       + f"{task.candidate_dir} unchanged; reports in {evidence}", "refused (verifier)")
                log(f"promote: refused: {version} fails the verifier: {stage.note} "
                    "(--force overrides, and is recorded); the ledger records the refusal")
                if retry:
                    log(f"promote: {retry}")
                return 1
            log("promote: forcing past the verifier; the ledger records it")
        verified = (f"; verifier on {Path(panel).name}: {stage.note[:160]}" if stage.ok
                    else f" (forced past the verifier on {Path(panel).name}: {stage.note[:120]})")
    replace_solution(task.root / task.candidate_dir, source)
    forced = f" (forced past {verdict['failed_stage']}: {verdict['note'][:120]})" if not verdict["valid"] else ""
    forced += " (forced past interpreter-only numbers)" if interpreter_only else ""
    forced += " (forced past its revert)" if reverted and not verify else ""
    record(f"promoted {version} to {task.candidate_dir}{forced}{verified}",
           "promoted (forced)" if forced or "forced past the verifier" in verified else "promoted")
    log(f"promoted {version} to {task.candidate_dir} (was {parent}); score {fmt(verdict['score'])}")
    return 0
