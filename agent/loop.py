"""The run: `while True: step()`; each step is one attempt (propose -> evaluate -> record -> keep or revert).

Limits raise LimitsExceeded at the top of a step; the run state is saved in `finally` after every step, so a killed
run resumes where it stopped and the best-so-far is always on record.
"""
from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from agent import ledger
from agent.config import DEFAULT_TASK, PROG, TASKS_DIR, RunConfig, Task
from agent.ledger import fmt
from agent.display import Display
from agent.evaluate import Evaluator, correct_cell, panel_limit
from agent.exceptions import EndpointUnavailable, LimitsExceeded, ProposerError, Submitted
from agent.prompts import render
from agent.proposers import IterationContext, Proposer, Usage
from agent.tools import Tools, profile_text
from agent.workspace import RunState, Workspace, replace_solution


class Run:
    def __init__(self, task: Task, config: RunConfig, state: RunState, workspace: Workspace, proposer: Proposer,
                 display: Display):
        self.task, self.config, self.state, self.workspace, self.proposer = task, config, state, workspace, proposer
        self.display = display
        # the start's measurement and the proposer's tools run on the first worker's GPU (a cluster's: on this host);
        # one worker pinned to one GPU (--gpus N) is a plain run on that GPU
        self.gpu = config.workers[0] if config.workers and not config.cluster else ""
        self.evaluator_tools = Evaluator(task, config.panel, config.cuda, workspace.state_dir / "tools", gpu=self.gpu)
        self.tools = Tools(task, workspace.path, self.evaluator_tools)
        self.stop_reason: str | None = None
        self.session_start = time.monotonic()
        # a resumed GPU run measures its best again before its first attempt (``measure_best``)
        self.remeasure = False
        self.pool = make_pool(task, config, workspace.state_dir / "attempts")

    @property
    def best_dir(self) -> Path:
        label = self.state.best_label
        return self.task.versions / label if label.startswith("v") else self.workspace.state_dir / "start"

    def best_profile(self) -> dict | None:
        path = self.workspace.state_dir / "best_selfcheck.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def run(self) -> RunState:
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        from agent import batch  # it builds on this module's Attempt and record
        step = (lambda: batch.step(self)) if self.pool else self.step
        try:
            self.recover()
            if self.remeasure:
                self.check_limits()  # a finished run resumed without new iterations measures nothing
                replace_solution(self.tools.candidate, self.best_dir)
                self.measure_best(start=False)
            while True:
                step()
        except LimitsExceeded as exc:
            self.state.status = "finished" if self.state.attempts >= self.config.iters else "stopped"
            self.state.stop_reason = str(exc)
            self.display.line(f"run {self.state.run_id} {self.state.status}: {exc}")
        except EndpointUnavailable as exc:  # nothing was proposed, so nothing is evaluated: stop, resumable, say why
            self.state.status, self.state.stop_reason = "stopped", str(exc)
            self.display.line(f"run {self.state.run_id} stopped: {exc}")
            raise
        except BaseException as exc:
            self.state.status = "failed"
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.state.stop_reason = f"{self.stop_reason}; then {reason}" if self.stop_reason else reason
            raise
        finally:
            signal.signal(signal.SIGINT, previous)
            self.state.save(self.workspace.state_dir)
            self.display.close()
            if self.pool:
                self.pool.close()
        return self.state

    def _on_sigint(self, signum, frame) -> None:
        if self.stop_reason == "interrupted (Ctrl-C)":
            raise KeyboardInterrupt  # a second Ctrl-C aborts at once
        self.stop_reason = "interrupted (Ctrl-C)"
        self.display.notice("Ctrl-C: finishing and recording the current attempt, then stopping (Ctrl-C again aborts)")

    def measure_best(self, start: bool) -> None:
        """The best's selfcheck in the worktree (which holds it): its score is the best score and its report the
        profile that candidates' estimates, the proposer and the keep rule (its ratios over the yardstick) read, and
        its time sets the stages' limits. Run for the start of a run and again when a GPU run resumes: a resumed run
        may land on another host or another GPU model, and only numbers measured in one sitting compare (the last
        sitting's stay in its attempts' records). Written in an order that a kill leaves either whole or to be made
        again: the state, then start_selfcheck.json (the start's only), the mark a resumed run goes by."""
        what = "the start" if start else "the best again (a resumed GPU run)"
        self.display.line(f"measuring {what} ({self.state.best_label}) on panel {Path(self.config.panel).name}")
        stage = self.evaluator_tools.selfcheck(self.tools.candidate)
        measured = bool(stage.report and "cases" in stage.report)
        if not start and (not stage.ok or not measured or stage.report.get("interpreted")):
            # the last sitting's numbers are no reference here, and a best that fails here is no best to beat
            why = "no GPU here: the interpreter's times would replace the GPU's" \
                if measured and stage.ok else stage.note
            raise LimitsExceeded(f"the best ({self.state.best_label}) could not be measured again on this machine "
                                 f"({why}); start a new run here (--from a version that runs here)")
        if measured:
            self.state.best_score = stage.report.get("score")
            self.limit_stages(stage.seconds)
            (self.workspace.state_dir / "best_selfcheck.json").write_text(json.dumps(stage.report))
            device = stage.report.get("device")
            self.display.line(f"{'start' if start else 'best'}: score {fmt(self.state.best_score)} ({stage.note})"
                              + (f" on {device}" if device and not start else ""))
        else:
            self.display.line(f"start: score {fmt(self.state.best_score)} ({stage.note})")
        self.state.save(self.workspace.state_dir)
        if start and measured:  # the start's stays for the report
            (self.workspace.state_dir / "start_selfcheck.json").write_text(json.dumps(stage.report))

    def limit_stages(self, start_selfcheck_s: float) -> None:
        """The time limit of each stage of an attempt's evaluation follows the panel: a multiple of the start's own
        selfcheck there. The proposer's tools keep the task's limit (a profile may take longer than a selfcheck)."""
        self.state.eval_limit_s = panel_limit(self.task, start_selfcheck_s)

    def check_limits(self) -> None:
        if self.display.output_lost and not self.stop_reason:
            self.stop_reason = "the output's reader has gone (a closed pipe, such as tee or head exiting)"
        if self.stop_reason:
            raise LimitsExceeded(self.stop_reason)
        if self.state.attempts >= self.config.iters:
            raise LimitsExceeded(f"{self.state.attempts} of {self.config.iters} iterations done")
        minutes = (time.monotonic() - self.session_start) / 60
        if self.config.time_limit_min is not None and minutes >= self.config.time_limit_min:
            raise LimitsExceeded(f"time limit of {self.config.time_limit_min:g} min reached")
        if self.config.cost_limit_usd is not None and self.state.cost_usd >= self.config.cost_limit_usd:
            raise LimitsExceeded(f"cost limit ${self.config.cost_limit_usd:g} reached "
                                 f"(${self.state.cost_usd:.4f} spent)")

    def context(self, iteration: int, pending: list[str] | tuple = ()) -> IterationContext:
        """The proposer's view of an iteration; ``pending``: the summaries of a batch's members proposed before this
        one, not yet evaluated (the prompt asks for something else)."""
        profile = self.best_profile()
        last = self.state.last_verdict
        values = dict(spec=(self.task.root / self.task.spec).read_text(), run_id=self.state.run_id, iteration=iteration,
                      iters=self.config.iters, best_label=self.state.best_label, best_score=fmt(self.state.best_score),
                      timing_note=gpu_timing_note(self.task) if self.config.cuda else render("timing_interpreter"),
                      solution=(self.tools.candidate / "solution.py").read_text(), main=self.task.candidate_dir,
                      baseline=self.task.baseline_label)
        feedback = dict(ledger_header=ledger.header(self.task),
                        ledger_rows="\n".join(ledger.rows(self.task)[-15:]) or "(none yet)",
                        last_verdict=json.dumps(last, indent=1)[:3000] if last else "(none yet)",
                        profile=profile_text(profile) if profile else "(none yet)",
                        steps_left=getattr(self.proposer, "max_steps", "a few"),
                        pending="" if not pending else "# Proposed in this batch, not yet evaluated (propose "
                        "something else)\n\n" + "".join(f"- {summary}\n" for summary in pending) + "\n")
        prompts = {"system": render("system", **self.tools.prompt_values()), "task": render("task", **values),
                   "iteration": render("iteration", **feedback)}
        walls = [h["wall_s"] for h in self.state.history if h.get("wall_s")]
        closing = last_iteration(iteration, self.config.iters, self.config.time_limit_min,
                                 time.monotonic() - self.session_start, walls)
        return IterationContext(iteration, prompts, profile, last, iters=self.config.iters,
                                best=self.state.best_label, last=closing, gpu=self.config.cuda)

    def step(self) -> None:
        self.check_limits()
        iteration = self.state.attempts + 1
        last = self.state.history[-1]["decision"] if self.state.history else "-"
        self.display.status(iteration, f"{self.state.best_label} ({fmt(self.state.best_score)})", last)
        context, started = self.context(iteration), time.monotonic()
        summary, hypothesis = self.propose(context)
        self.attempt(iteration, summary, hypothesis, context, time.monotonic() - started)

    def propose(self, context: IterationContext) -> tuple[str, str]:
        """The proposer's edit of the candidate, and its (summary, hypothesis); its tokens and cost go into the run
        state whatever happens. A proposer that left the candidate as the best and failed raises
        EndpointUnavailable (timing the best again says nothing); LimitsExceeded passes through."""
        try:
            self.proposer.iterate(context, self.tools)
            return "(the proposer returned without submitting)", ""
        except Submitted as submitted:
            return submitted.summary, submitted.hypothesis
        except ProposerError as exc:
            if same_files(self.tools.candidate, self.best_dir):
                raise EndpointUnavailable(f"the proposer produced no candidate: {exc}") from exc
            return f"(no submit: {exc})", ""
        finally:
            self.state.tokens += context.usage.tokens
            self.state.cost_usd += context.usage.cost_usd
            self.state.save(self.workspace.state_dir)

    def attempt(self, iteration: int, summary: str, hypothesis: str, context: IterationContext,
                propose_s: float) -> None:
        """Evaluate the candidate, then record it (``record``)."""
        started = time.monotonic()
        name = eval_name(iteration)
        evaluator = Evaluator(self.task, self.config.panel, self.config.cuda,
                              self.workspace.state_dir / "attempts" / name, self.state.eval_limit_s, gpu=self.gpu)
        verdict = evaluator.evaluate(self.tools.candidate, self.best_dir, self.state.best_is_baseline,
                                     self.config.full_check, self.state.best_score, self.best_profile())
        self.record(Attempt(iteration, summary, hypothesis, context.usage, propose_s, time.monotonic() - started,
                            name, verdict), (self.state.best_label, self.best_dir))

    def record(self, attempt: Attempt, parent: tuple[str, Path], extra: dict | None = None) -> None:
        """Write the candidate's attempt in an order that a kill at any instant leaves whole: the record (vN, row,
        index line; see ledger.record), the commit on the run's branch, the run state. ``parent`` is the best it was
        proposed from (label, folder). A resumed run finishes a recorded attempt from its index line (``recover``)
        and makes an unrecorded one again."""
        verdict, usage = attempt.verdict, attempt.usage
        text = attempt.summary + (f"; hypothesis: {attempt.hypothesis}"
                                  if attempt.hypothesis and attempt.hypothesis not in attempt.summary else "")
        # the checks run only for a candidate about to be kept (or with --full-check)
        row = row_values(self.task, verdict, datetime.now(timezone.utc), run=self.state.run_id,
                         backend=self.proposer.label, parent=parent[0], summary=text,
                         decision=decision(verdict), unchecked="not run (not kept)")
        extra = {"task": self.task.name, "iteration": attempt.iteration, "summary": attempt.summary,
                 "hypothesis": attempt.hypothesis, "keep": verdict["keep"],
                 "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                 "tokens": usage.tokens, "cost_usd": usage.cost_usd, "propose_s": round(attempt.propose_s, 2),
                 "eval_s": round(attempt.eval_s, 2), "wall_s": round(attempt.propose_s + attempt.eval_s, 2),
                 "eval_dir": attempt.eval_dir, **(extra or {})}
        recorded = ledger.record(self.task, self.tools.candidate, parent[1], parent[0], row, verdict, extra)
        ledger.pause_at("recorded")
        self.workspace.commit(recorded.row)
        ledger.pause_at("committed")
        self.apply(recorded.entry)
        if not verdict["keep"]:
            replace_solution(self.tools.candidate, self.best_dir)  # the worktree returns to the best
        self.state.save(self.workspace.state_dir)
        self.display.line(recorded.row)
        self.display.done(f"{self.state.best_label} ({fmt(self.state.best_score)})", row["decision"])

    def apply(self, entry: dict) -> None:
        """Take a recorded attempt (its index line) into the run state: the same for an attempt just made and for one
        that a killed session recorded but did not apply."""
        verdict = entry["verdict"]
        if entry["keep"]:
            report = self.workspace.state_dir / "attempts" / entry.get("eval_dir", "") / "selfcheck.json"
            best_report = self.workspace.state_dir / "best_selfcheck.json"
            if report.is_file():
                best_report.write_text(report.read_text())
            else:  # the old best's numbers are not the new best's: no reference rather than a wrong one
                best_report.unlink(missing_ok=True)
            self.state.best_label, self.state.best_score, self.state.best_is_baseline = (
                entry["version"], verdict["score"], False)
        self.state.attempts = entry["iteration"]
        self.state.wall_s += entry["wall_s"]
        self.state.last_verdict = {k: verdict.get(k) for k in ("failed_stage", "note", "correct", *self.task.checks,
                                                                "strata", "score", "speedup_over_best", "noise",
                                                                "stable", "unstable", "keep")}
        self.state.last_verdict["version"] = entry["version"]
        self.state.history.append({"version": entry["version"], "decision": entry["decision"],
                                   "score": verdict["score"], "valid": verdict["valid"], "wall_s": entry["wall_s"]})

    def recover(self) -> None:
        """Finish what a killed session left half-done, before any new attempt: a record without its row or index line
        (ledger.finish_pending), then each attempt of this run that is in the index but not yet in the run state: its
        commit when the branch lacks it, then the state. So a recorded attempt is never made again nor lost."""
        ledger.finish_pending(self.task)
        entries = sorted((e for e in ledger.index_entries(self.task)
                          if e.get("run") == self.state.run_id and e.get("iteration", 0) > self.state.attempts),
                         key=lambda e: e["iteration"])
        for entry in entries:
            if not self.workspace.has_commit(entry["version"]):
                replace_solution(self.tools.candidate, self.task.versions / entry["version"])
                self.workspace.commit(ledger.format_row(entry, self.task))
            self.apply(entry)
            self.state.save(self.workspace.state_dir)
            self.display.line(f"recovered {entry['version']} (iteration {entry['iteration']}), recorded by a killed "
                              "session")
        if entries:
            replace_solution(self.tools.candidate, self.best_dir)


def make_pool(task: Task, config: RunConfig, attempts: Path):
    """A parallel run's workers (more than one, or a cluster's), else None: one attempt at a time."""
    from agent.pool import DaskPool, LocalPool, Slot, make_slots

    if config.cluster:  # a cluster's workers are pinned, one per GPU, where they were started
        slots = [Slot("", False) for _ in config.workers]
        return DaskPool(task, config.panel, config.cuda, attempts, slots, config.cluster)
    slots = make_slots(config.workers)
    return LocalPool(task, config.panel, config.cuda, attempts, slots) if len(slots) > 1 else None


@dataclass
class Attempt:
    """One candidate's evaluation, as its record needs it."""
    iteration: int
    summary: str
    hypothesis: str
    usage: Usage
    propose_s: float
    eval_s: float
    eval_dir: str
    verdict: dict


def gpu_timing_note(task: Task) -> str:
    """How a GPU run of ``task`` times its candidates, in a few words (the prompt's and the run report's)."""
    return render("timing_graph" if task.graph_paired else "timing_gpu")


def last_iteration(iteration: int, iters: int, time_limit_min: float | None, elapsed_s: float,
                   walls: list[float]) -> bool:
    """Whether ``iteration`` is, by estimate, the run's last: it is the ``iters``-th, or under a time limit less time
    is left than a typical attempt of this run takes (the median of its last five ``walls``, seconds), so that no
    other would start after it. A proposer makes its closing move there (the per-table search merges what won),
    which a run stopped by its clock would otherwise never reach. An estimate: the run may go on for an attempt or so
    (each such attempt is last too), or stop after an attempt that was not; before the run's first attempt is timed
    none is last by the clock."""
    if iteration >= iters:
        return True
    if time_limit_min is None or not walls:
        return False
    recent = sorted(walls[-5:])
    return time_limit_min * 60 - elapsed_s <= recent[len(recent) // 2]


def eval_name(iteration: int) -> str:
    """A folder of its own per evaluation: a killed run's evaluator children may still write to theirs on --resume."""
    return f"{iteration:03d}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{os.urandom(3).hex()}"


def same_files(candidate: Path, best: Path) -> bool:
    """Whether the candidate's solution files are the best's, byte for byte."""
    mine, theirs = ledger.solution_files(candidate), ledger.solution_files(best)
    return [p.name for p in mine] == [p.name for p in theirs] and all(
        a.read_bytes() == b.read_bytes() for a, b in zip(mine, theirs))


def row_values(task: Task, verdict: dict, when: datetime, *, run: str, backend: str, parent: str, summary: str,
               decision: str, unchecked: str) -> dict[str, object]:
    """A ledger row's cells but its version and identity, from an attempt's or a promotion's verdict."""
    return {"time (UTC)": when.strftime("%Y-%m-%d %H:%M:%S"), "run": run, "backend/model": backend, "parent": parent,
            "summary / hypothesis": summary, "correct": correct_cell(verdict),
            **metric_cells(task, verdict, unchecked), "score": fmt(verdict["score"]), "decision": decision,
            "stable": verdict.get("stable")}


def metric_cells(task: Task, verdict: dict, unchecked: str) -> dict[str, str]:
    """The task's metric columns of a row: each check stage's result (``unchecked`` for a correct candidate it did not
    run on, since the checks run only for one about to be kept), each stratum's score."""
    cells = {}
    for column in task.columns:
        if column in task.strata:
            cells[column] = fmt((verdict["strata"] or {}).get(column))
        else:
            cells[column] = verdict.get(column) or (unchecked if verdict["correct"] else "-")
    return cells


def decision(verdict: dict) -> str:
    """``verdict_decision``, marked where the candidate was timed beside another worker on the same GPU."""
    shared = (verdict.get("worker") or {}).get("shared") and verdict.get("correct") is not None
    return verdict_decision(verdict) + (" [timed on a device shared with another worker]" if shared else "")


def verdict_decision(verdict: dict) -> str:
    """The ledger's decision cell: keep or revert and why, the reason in full (each stage's output tail is in
    verdict.json). Without a GPU nothing is kept on timing: interpreter wall times cannot rank kernels, and the cell
    says so. A valid candidate the verifier could not time (its ``stable`` cell "no ...", GPU only) reads "revert
    (unstable: CASE WHY; 1.420x best)"."""
    speedup, noise = verdict.get("speedup_over_best"), verdict.get("noise")
    estimated = verdict.get("compare_note", "").startswith("estimated")
    if verdict["valid"] and not verdict.get("gpu_timing"):
        measured = ("" if speedup is None else f"; ~{speedup:.3f}x best from both scores against the baseline"
                    if estimated else f"; {speedup:.3f}x best, noise {fmt(noise)}")
        return f"revert (no GPU: nothing is kept on interpreter timings, which rank nothing{measured})"
    if verdict["keep"]:
        again = ", evaluated again alone" if verdict.get("evaluated_alone") else ""
        return f"keep ({speedup:.3f}x best, noise {noise:.3f}{again})"
    if verdict["valid"] and verdict.get("batch_note"):
        return f"revert (batch: {verdict['batch_note']})"
    if verdict["valid"] and str(verdict.get("stable", "")).startswith("no"):
        why = ", ".join(f"{u['case']} {u['why']}" for u in verdict.get("unstable") or []) or verdict["stability_note"]
        return f"revert (unstable: {why}; {'~' if estimated else ''}{fmt(speedup)}x best)"
    if verdict["valid"] and estimated:
        return f"revert (~{speedup:.3f}x best from both scores against the baseline, not timed against it)"
    if verdict["valid"]:
        return f"revert ({fmt(speedup)}x best, noise {fmt(noise)})"
    failed = next((s for s in verdict["stages"] if not s["ok"]), None)
    if failed is None:
        return "revert: no score"
    return "revert: " + (failed["note"] if failed["note"].startswith(failed["name"])
                         else f"{failed['name']} {failed['note']}")


def summary(task: Task, state: RunState) -> str:
    lines = [f"run {state.run_id} (task {task.name}): {state.status}, {state.attempts} attempt(s), "
             f"{state.wall_s:.0f} s of work, {state.tokens} tokens, ${state.cost_usd:.4f}"]
    if not state.config.get("cuda"):
        # a scored candidate that failed a check (--full-check) is not valid; older states record no "valid"
        valid = [h["version"] for h in state.history if h.get("valid", h.get("score") is not None)]
        lines.append(f"no GPU: nothing is kept on Triton interpreter timings, which rank nothing; "
                     f"{len(valid)} valid candidate(s) recorded" + (f" ({', '.join(valid[:8])}"
                                                                    + (", ..." if len(valid) > 8 else "") + ")"
                                                                    if valid else "")
                     + f". Measure them on a GPU: {make_hint(task, 'agent-run', ITER=20)} there, or "
                       f"{make_hint(task, 'promote', V='N')} on a GPU machine (here only FORCE=1 promotes).")
    elif state.best_label == state.start_label:
        lines.append(f"no candidate beat the start ({state.start_label}, score {fmt(state.best_score)}).")
    else:
        lines.append(f"best: {state.best_label}, score {fmt(state.best_score)} "
                     f"(speedup over {task.baseline_label}, harmonic mean of strata)")
        lines.append(f"to promote it: {make_hint(task, 'promote', V=state.best_label.removeprefix('v'))}  "
                     f"({PROG} promote {task_flag(task)}{state.best_label})")
    lines.append(f"ledger: {task.ledger}; versions: {task.versions_dir}/; "
                 f"resume: {PROG} run --resume {state.run_id}")
    return "\n".join(lines)


def task_flag(task: Task) -> str:
    """``--task NAME `` for a command line, empty for the default task (so its hints read as they always have)."""
    return "" if task.name == DEFAULT_TASK else f"--task {task_ref(task)} "


def task_ref(task: Task) -> str:
    """How a command names the task: its name when it lives under tasks/, else its folder."""
    return task.name if task.folder == f"{TASKS_DIR}/{task.name}" else task.folder


def make_hint(task: Task, target: str, **variables: object) -> str:
    """A make command line for the task: ``make promote TASK=NAME V=3`` (no TASK= for the default task)."""
    words = ["make", target] + ([] if task.name == DEFAULT_TASK else [f"TASK={task_ref(task)}"])
    return " ".join(words + [f"{key}={value}" for key, value in variables.items()])
