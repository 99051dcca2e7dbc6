"""One role of the sealed verifier (evals/verifier.py), run in a process of its own: the hard gates, then the timing.

A role loads one solution (or the task's callable baseline) for one case of a task (evals/task.py) and records every
gate as a result field; it never raises for a bad candidate. Everything task-specific comes from the task: the build
arguments and call inputs (named by the manifest's contract), the input regimes, the oracle and its bound, the
output's shape and dtype, the bytes moved and the residency allowance. The gates pass (all a ``--gates-only`` run
does) checks, with every output kept and audited:
  api                   the entry point is callable and returns a callable
  output_structure      a plain torch.Tensor (no subclass), shape, dtype, device, contiguity, finiteness
  numerics_<mode>       agreement with the adapter's oracle within its bound, for each input regime of the adapter's
                        MODES ("normal" on the input pool; each other regime, such as an adversarial construction,
                        on its own weights and inputs)
  input_immutability    every tensor among the build arguments (each regime's) and the call inputs equal to clones and
                        with unchanged ``_version``
  fresh_outputs         no output overlaps the storage of an input or of a live earlier output; no element still
                        holds the allocator poison (unwritten); every kept output unchanged at the end
  no_output_caching     one element of each floating call input in turn, at positions drawn from the case seed,
                        changed in a new tensor; the first one's in place; each one's in place without a ``_version``
                        bump: each result must follow the change
  no_tampering          timers, synchronize, Event, the current-stream getter and the verifier's own checks keep
                        their identity across build and calls
  streams               (CUDA) the current stream is unchanged and the candidate never selects another stream
  isolation             no file, process, socket or thread started from the candidate's own frames (audit hook)
  residency             evals/residency.py's checkpoints: after build, after the first call, after all calls (skipped,
                        with the reason, for a task that declares no residency stage)
With timing, the task's timing protocol (its manifest's ``timing``) follows and adds schedule_outputs and
timing_sanity:

- eager-groups: the schedule (reset; distinct outputs audited and released; heater; untimed calls; timed groups);
  schedule_outputs re-validates every primed and timed output, and timing_sanity finds a median impossible that moves
  the case's bytes faster than both a read-only pass's measured bandwidth and SANITY_SLACK times a copy's. Each timed
  group calls on calls_per_group distinct call inputs whose values the verifier rewrites in place (a seeded draw, the
  same for all three roles) before the group, outside the timed region: no (address, _version) pair and no content
  repeats from one group to the next, so no cache pays off; the pool is checked unchanged before each rewrite.
- graph-paired: the candidate paired with the yardstick in this one process (evals/graph_timing.py: CUDA-graph
  replay, hot and L2-flushed). The yardstick (the task's baseline, or the solution given by ``--pair-with``) is built
  and captured during setup, before any candidate code exists in the process, so nothing the candidate does can
  change what its graphs run. The pool (graph_timing's HOT_CALLS call inputs) is checked unchanged and rewritten in
  place before every pair with that pair's seeded draw (group_inputs with the pair index); the candidate's graph
  outputs are set to NaN before every pair and schedule_outputs validates them against the oracle after it, and
  fresh_outputs their storage; timing_sanity holds the flushed center alone to the roofline (hot replays read the
  weight from the L2 and may beat it legitimately). The record's ``paired`` holds every series; ``times_us`` and
  ``median_us`` are the candidate's hot series and its center by place.

Stabilizers: the cyclic garbage collector is off during the timed groups or pairs, and a timing role on CUDA is pinned
to one core (os.sched_setaffinity).
A failure of the verifier's own setup (say, a case seed whose construction the adapter cannot complete) is
recorded as ``error.stage == SETUP_STAGE``: the case could not be judged, which says nothing about the candidate.
"""
from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from evals import graph_timing, residency, stability
from evals import kernel_harness as kh
from evals import task as tasks
from evals.gate_spies import (EVIDENCE_CAP, GateBook, Spies, bound_name, changed_inputs, heat,
                              isolate_timing_thread, overlaps, pin_to_one_core, poisoned_allocations,
                              same_values, tamper_snapshot, unwritten, validate, write_unversioned)
from evals.kernel_harness import dtype_label, structure_problem
from evals.loader import load_solution, unload_solution
from evals.selfcheck import CANDIDATE_ERRORS, error_record


def role_gates(task: tasks.Task) -> tuple[str, ...]:
    """A role's gates for ``task``, in the order a record lists them: one numerics gate per input regime."""
    return ("api", "output_structure", *(f"numerics_{mode}" for mode in task.adapter.MODES), "input_immutability",
            "fresh_outputs", "no_output_caching", "no_tampering", "streams", "isolation", "residency",
            "schedule_outputs", "timing_sanity")


def undeclared_gates(task: tasks.Task) -> dict[str, str]:
    """Role gates the task has no stage for (residency, where its manifest does not declare it), with the reason: a
    role skips them, and the verifier's verdict does not count those skips against the candidate."""
    if task.declares("residency"):
        return {}
    return {"residency": f"task {task.name} declares no residency stage (its task.json's stages: "
                         f"{', '.join(task.stages)})"}


TIMING_GATES = ("schedule_outputs", "timing_sanity")
# a median moving the case's bytes faster than both a read-only pass and 1.07x a copy is impossible: the copy reached
# 87-89% of the HBM's datasheet peak on H100 and H200 (reports/examples/llgemm-seed002/README.md, "The verifier on the
# H100"), so 1.07x stays under it; the read pass, measured, is a rate some code reached
SANITY_SLACK = 1.07
CUDA_ONLY = {"streams": "CUDA streams exist only on a CUDA device",
             "timing_sanity": "the bandwidth roofline is measured on CUDA only"}
SETUP_STAGE = "setup (the verifier's own)"
GATE_POOL = 4  # distinct call inputs of the gates pass
GATE_CALLS = 8  # plain calls after the targeted checks, so that storage kept lazily shows at the last checkpoint
KEPT_PRIMED = 8  # primed outputs kept with clones to the end: a stale workspace write shows as a changed value
POOL_SEED, GROUP_SEED = 11, 1000  # input draws: the pool's first values, then group g's values (GROUP_SEED + g)
CHANGE = 8.0  # added to one input element by the caching checks: a change far past the oracle's bound
_perf_counter = time.perf_counter  # the role's own wall clock, taken before any candidate code runs


@dataclass(frozen=True)
class Schedule:
    prime_outputs: int
    heater_warmup: int
    heater_matmuls: int
    heater_size: int
    untimed_calls: int
    groups: int
    calls_per_group: int
    input_pool: int  # distinct call inputs; at least calls_per_group, so no input repeats within a group
    pin: str = "process"  # a timing role on CUDA: PIN_MODES says what each value does

    @property
    def calls(self) -> int:
        return self.prime_outputs + self.untimed_calls + self.groups * self.calls_per_group


PIN_MODES = {
    "process": "the role's main thread on one core from its start, before the candidate loads (every thread started "
               "afterwards, the CUDA driver's included, inherits that core)",
    "none": "no pinning",
    "thread": "before each timed group, the timing thread alone on one core and every other thread of the process "
              "(the CUDA driver's, torch's) on the other cores",
}
# The timing protocol's schedule ("eager-groups", the task's spec); "smoke" only makes CPU tests short and never scores
# anything. "spec-unpinned" and "spec-thread-pinned" are that schedule with another pinning, to measure what the
# pinning does to a host-bound candidate's dispersion (measurement aids: the verdict of record is "spec").
SCHEDULES = {"spec": Schedule(16384, 8, 1024, 4096, 8192, 11, 512, 512),
             "smoke": Schedule(16, 1, 2, 256, 4, 11, 1, 4)}
SCHEDULES["spec-unpinned"] = replace(SCHEDULES["spec"], pin="none")
SCHEDULES["spec-thread-pinned"] = replace(SCHEDULES["spec"], pin="thread")
# a graph-paired task's counts by schedule name (evals/graph_timing.py): the protocol's, but the smoke schedule's
GRAPH_PLANS = {"smoke": graph_timing.SMOKE}


def graph_plan(schedule: str) -> graph_timing.Plan:
    return GRAPH_PLANS.get(schedule, graph_timing.FULL)


def group_inputs(task: tasks.Task, case, count: int, group: int, device: torch.device) -> list[tuple]:
    """Timed group ``group``'s call inputs: a seeded draw of the task's adapter, the same in every role (and in
    evals.qualify)."""
    return task.adapter.make_inputs(case, count, seed=GROUP_SEED + group, device=device)


def run_schedule(fn, pool: list[tuple], s: Schedule, device: torch.device, before_group=None, primed_check=None,
                 keep: list | None = None, cores: set[int] | None = None, pinned: list | None = None) -> list[float]:
    """The timing protocol's schedule after the gates: reset; ``s.prime_outputs`` distinct outputs made, handed to
    ``primed_check`` and released; the heater; the untimed calls; then ``s.groups`` timed groups of
    ``s.calls_per_group`` calls on distinct pool entries (microseconds per call, one value per group).
    ``before_group(g)`` runs before group g outside the timed region (the verifier rewrites the pool there); with
    ``s.pin == "thread"`` on CUDA the timing thread is then isolated on one of ``cores`` (appended to ``pinned``).
    The verifier's roles and ``evals.qualify`` both time through here, so that they time the same thing."""
    residency.settle(device)  # the protocol's reset: synchronize, gc, empty_cache
    primed = [fn(*pool[i % len(pool)]) for i in range(s.prime_outputs)]
    if primed_check is not None:
        primed_check(primed)
    del primed  # released: the allocator now holds that many output blocks
    heat(s.heater_size, s.heater_warmup + s.heater_matmuls, device)
    for i in range(s.untimed_calls):
        fn(*pool[i % len(pool)])
    kh.synchronize(device)
    inputs = [pool[i % len(pool)] for i in range(s.calls_per_group)]  # distinct within a group
    hook = before_group
    if s.pin == "thread" and device.type == "cuda":
        if cores is None:  # the process's cores now, before the first group narrows the timing thread's
            cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()

        def hook(group):  # threads the last group started are moved too
            if before_group is not None:
                before_group(group)
            core = isolate_timing_thread(cores)
            if pinned is not None:
                pinned.append(core)
    return kh.time_groups(fn, inputs, s.groups, len(inputs), before_group=hook, keep=keep)


# ----------------------------------------------------------------------------------------------------- the role
class Role:
    """One role: ``solution_dir`` (a solution's directory) or, where it is None, the task's callable baseline. For a
    graph-paired task its timing pairs it with ``yardstick`` (a solution's directory; None: the task's baseline) under
    ``plan``."""

    def __init__(self, task: tasks.Task, solution_dir: Path | None, case, schedule: Schedule, timing: bool,
                 device: torch.device, book: GateBook, record: dict, yardstick: Path | None = None,
                 plan: graph_timing.Plan = graph_timing.FULL) -> None:
        self.task, self.adapter = task, task.adapter
        self.solution_dir, self.case, self.schedule, self.timing = solution_dir, case, schedule, timing
        self.paired = task.graph_paired
        self.yardstick_dir, self.plan, self.yardstick = yardstick, plan, None
        self.device, self.book, self.record = device, book, record
        self.shape, self.dtype = tuple(self.adapter.output_shape(case)), self.adapter.OUTPUT_DTYPE
        self.call_args = task.call_args
        self.stage = "setup"
        self.module = self.fn = None
        self.kept: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # (label, output, clone) checked at the end
        self.calls = 0
        self.cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()  # "thread" mode's cores

    def setup(self) -> None:
        """Everything the verifier owns exists before the residency baseline and before any candidate code runs."""
        case, device, adapter = self.case, self.device, self.adapter
        normal, *others = adapter.MODES
        self.normal_mode = normal
        self.weights = adapter.generate(case, normal, device).weights
        self.regimes = {}  # every other input regime: its problem and its oracle, made before any candidate code
        for mode in others:
            problem = adapter.generate(case, mode, device)
            self.regimes[mode] = (problem, adapter.reference(problem.weights, problem.inputs, case))
        self.pool = adapter.make_inputs(case, self.pool_size(), seed=POOL_SEED, device=device)
        self.refs = self.task.references(self.weights, self.pool, case)
        self.guarded = {name: t for name, t in self.weights.items() if isinstance(t, torch.Tensor)}
        for mode, (problem, _) in self.regimes.items():
            self.guarded |= {f"{mode} {name}": t for name, t in problem.weights.items() if isinstance(t, torch.Tensor)}
            self.guarded |= {f"{mode} {name}": t for name, t in zip(self.call_args, problem.inputs)
                             if isinstance(t, torch.Tensor)}
        self.pool_names = []
        for i, inputs in enumerate(self.pool):
            for name, t in zip(self.call_args, inputs):
                if isinstance(t, torch.Tensor):
                    self.guarded[f"{name}[{i}]"] = t
                    self.pool_names.append(f"{name}[{i}]")
        self.clones = {name: t.clone() for name, t in self.guarded.items()}
        # the oracle of the caching trials reads these, never a build argument the candidate could have written
        self.weight_clones = {name: self.clones.get(name, value) for name, value in self.weights.items()}
        self.allowance = residency.allowance_for(self.task, case) if self.task.declares("residency") else None
        if self.timing and device.type == "cuda":
            self.record["copy_gbps"] = kh.copy_bandwidth_gbps(device)
            self.record["read_gbps"] = kh.read_bandwidth_gbps(device)
        if self.timing and self.paired:  # captured before any candidate code exists in this process
            build, self.record["yardstick"] = tasks.baseline_builder(self.task, self.yardstick_dir)
            self.yardstick = graph_timing.prepare(build(self.weights, case), self.pool, "baseline", self.plan)
        residency.warm_libraries(device)
        residency.settle(device)
        self.before, self.before_allocated = residency.live_storages(device), residency.allocated(device)
        self.versions = {name: t._version for name, t in self.guarded.items()}
        self.spies = Spies(self.solution_dir or Path(self.adapter.__file__).resolve().parent)
        self.snapshot = tamper_snapshot(self.task)
        self.threads_before = threading.active_count()
        self.stream_before = torch.cuda.current_stream().stream_id if device.type == "cuda" else None

    def pool_size(self) -> int:
        if not self.timing:
            return GATE_POOL
        if self.paired:  # the static call inputs of the graphs
            return max(GATE_POOL, self.plan.hot_calls)
        return max(self.schedule.input_pool, self.schedule.calls_per_group)

    def call(self, fn, *inputs):
        with poisoned_allocations(self.shape, self.dtype, self.device):
            out = fn(*inputs)
        kh.synchronize(self.device)
        self.calls += 1
        return out

    def build(self, weights: dict):
        """The candidate's callable for ``weights``: its entry point, or the task's callable baseline."""
        if self.solution_dir is None:
            return self.task.build_baseline(weights, self.case)
        return self.task.build(self.module, weights)

    # --------------------------------------------------------------------------------------------- gates pass
    def gates_pass(self) -> None:
        self.stage = "load and build"
        if self.solution_dir is not None:
            # the parent ran the source policy; this isolated process gathers dynamic evidence even against rejected
            # code
            self.module = load_solution(self.solution_dir, enforce_policy=False, entry=self.task.entry)
        fn = self.build(self.weights)
        if not self.book.check("api", callable(fn), f"build returned {type(fn).__name__}"):
            return
        self.fn = fn
        self.checks("build")
        self.stage = "first call"
        out = self.call(fn, *self.pool[0])
        self.audit("first call", out, self.refs[0], f"numerics_{self.normal_mode}", keep=False)
        self.alias_check([("first call", out)])
        del out
        self.checks("first call")
        for mode in self.regimes:
            self.stage = f"{mode} build and call"
            self.regime_check(mode)
        self.stage = "single-element changes"
        self.caching_check(fn)
        self.stage = "gate calls"
        for i in range(GATE_CALLS):
            out = self.call(fn, *self.pool[i % GATE_POOL])
            self.audit(f"call {i}", out, self.refs[i % GATE_POOL], f"numerics_{self.normal_mode}")
        self.alias_check([(label, out) for label, out, _ in self.kept])
        self.checks("gates pass", residency_point=False)

    def audit(self, label: str, out, ref, numerics_gate: str, keep: bool = True) -> None:
        problem = structure_problem(out, self.shape, self.dtype, self.device)
        if problem is None and not bool(torch.isfinite(out).all()):
            problem = f"{int((~torch.isfinite(out)).sum())} elements are not finite"
        self.book.check("output_structure", problem is None,
                        f"{label}: {problem or f'{dtype_label(self.dtype)}, contiguous, finite'}")
        if type(out) is torch.Tensor and out.dtype == self.dtype:  # a subclass may override view and sum too
            left = unwritten(out)
            self.book.check("fresh_outputs", not left, f"{label}: {left} elements still hold the allocator "
                            "poison (never written)" if left else f"{label}: every element written")
        result = self.adapter.check_output(out, ref, self.case)
        self.book.check(numerics_gate, result.ok,
                        f"{label}: {result.message} (worst {result.worst_excess:.3g} of the bound)")
        if keep:
            self.keep(label, out)

    def keep(self, label: str, out):
        """Hold an output and a clone to the end of the role: whatever writes into it later shows."""
        if type(out) is torch.Tensor:
            self.kept.append((label, out, out.clone()))
        return out

    def regime_check(self, mode: str) -> None:
        """A build on the regime's own weights and one call on its inputs, against its oracle."""
        problem, ref = self.regimes[mode]
        fn = self.build(problem.weights)
        if self.book.check("api", callable(fn), f"build ({mode} weights) returned {type(fn).__name__}"):
            self.audit(mode, self.call(fn, *problem.inputs), ref, f"numerics_{mode}")

    def caching_check(self, fn) -> None:
        """A call input that differs from an earlier one in a single element (positions drawn from the case seed) must
        give its own correct output. Each floating call input in turn is changed in a new tensor; the first one in
        place; then each one in place with ``_version`` left as it was."""
        rng = random.Random(self.case.seed)

        def anywhere(t: torch.Tensor) -> tuple[int, ...]:
            return tuple(rng.randrange(size) for size in t.shape)

        base = tuple(self.pool[0])
        floating = [i for i, t in enumerate(base) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not floating:
            self.book.skip("no_output_caching", "the task's call inputs hold no floating tensor to change")
            return
        names = [self.call_args[i] if i < len(self.call_args) else f"input {i}" for i in range(len(base))]
        changed = {}
        for i in floating:
            changed[i] = base[i].clone()
            changed[i][anywhere(changed[i])] += CHANGE
        earlier = self.caching_trial(fn, "original input", base, None)
        for i in floating:
            self.caching_trial(fn, f"{names[i]} changed in one element (new tensor)",
                               base[:i] + (changed[i],) + base[i + 1:], earlier)
        same = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in base)
        earlier = self.caching_trial(fn, "same address, before the writes", same, None)
        first = floating[0]
        same[first][anywhere(same[first])] += CHANGE
        earlier = self.caching_trial(fn, f"{names[first]} changed in one element in place (same address)", same,
                                     earlier)
        for i in floating:
            hidden = write_unversioned(same[i], anywhere(same[i]), CHANGE)
            earlier = self.caching_trial(fn, f"{names[i]} changed in one element in place, " + (
                "_version unchanged" if hidden else "(the write moved _version)"), same, earlier)

    def caching_trial(self, fn, label: str, inputs: tuple, earlier):
        """Call once; unless ``earlier`` is None, the output must match the oracle (its values, cloned, returned)."""
        out = self.call(fn, *inputs)
        self.keep(f"caching: {label}", out)
        if earlier is not None:
            ref = self.adapter.reference(self.weight_clones, inputs, self.case)
            result = self.adapter.check_output(out, ref, self.case)
            stale = (not result.ok and type(out) is torch.Tensor and isinstance(earlier, torch.Tensor)
                     and out.shape == earlier.shape and out.dtype == earlier.dtype and same_values(out, earlier))
            self.book.check("no_output_caching", result.ok, f"{label}: {result.message}"
                            + (" (identical to the output before the change: a cached result)" if stale else ""))
        return out.clone() if type(out) is torch.Tensor else out  # its values now, whatever aliases it later

    def alias_check(self, outputs: list[tuple[str, torch.Tensor]]) -> None:
        found = overlaps([(f"input {name}", t) for name, t in self.guarded.items()] + outputs)
        self.book.check("fresh_outputs", not found, "; ".join(found[:EVIDENCE_CAP]) if found else
                        f"{len(outputs)} outputs: storage disjoint from each other and from every input")

    def checks(self, when: str, residency_point: bool = True) -> None:
        """Residency (a checkpoint, where the task declares it), tampering, streams and isolation, as they stand."""
        if residency_point and self.allowance is not None:
            point = residency.measure(when, self.before, self.before_allocated, self.device, self.allowance)
            self.book.check("residency", not point.violations, {
                "checkpoint": when, "total_bytes": point.total_bytes, **point.quoted(self.allowance),
                "unattributed_bytes": point.unattributed_bytes, "violations": [v["message"] for v in point.violations]})
        now = tamper_snapshot(self.task)
        replaced = [name for name, handle in self.snapshot.items() if now[name] is not handle]
        self.book.check("no_tampering", not replaced, f"after {when}: " + (f"replaced {', '.join(replaced)}" if replaced
                        else f"{len(now)} timer, synchronize, stream and checker handles unchanged"))
        if self.device.type == "cuda":
            stream = self.snapshot["torch.cuda.current_stream"]().stream_id
            ok = stream == self.stream_before and not self.spies.stream_sets
            self.book.check("streams", ok, f"after {when}: current stream {stream} (was {self.stream_before})"
                            + (f"; {'; '.join(self.spies.stream_sets[:3])}" if self.spies.stream_sets else ""))
        threads = threading.active_count()
        ok = not self.spies.events and threads <= self.threads_before
        self.book.check("isolation", ok, f"after {when}: {threads} threads (were {self.threads_before})"
                        + (f"; {'; '.join(self.spies.events[:4])}" if self.spies.events
                           else "; no file, process or socket use"))

    # --------------------------------------------------------------------------------------------- timing pass
    def timing_pass(self) -> None:
        if self.paired:
            self.paired_pass()
            return
        s, pool, device = self.schedule, self.pool, self.device
        self.stage = "timing schedule"

        def primed_check(primed: list) -> None:
            self.calls += len(primed)
            self.validate_phase("primed", primed, [(0, len(primed), self.refs)])
            ends = (list(range(min(KEPT_PRIMED // 2, len(primed))))
                    + list(range(max(KEPT_PRIMED // 2, len(primed) - KEPT_PRIMED // 2), len(primed))))
            for i in ends:
                self.keep(f"primed output {i}", primed[i])

        timed: list = []
        pinned = []
        times = run_schedule(self.fn, pool, s, device, self.refill, primed_check, timed, self.cores, pinned)
        if pinned:
            self.record["pinned_core"] = pinned[-1]
        self.calls += s.untimed_calls + len(timed)
        self.record["times_us"] = times
        self.record["median_us"] = median = kh.median(times)
        per = s.calls_per_group  # each group's inputs drawn again from their seed: the oracle of one group at a time
        groups = ((g * per, (g + 1) * per, self.task.references(self.weights, self.group_inputs(g), self.case))
                  for g in range(s.groups))
        self.validate_phase("timed", timed, groups)
        del timed
        self.sanity(median, "median", "")
        # after the groups, so that they are timed exactly as the protocol says: what explains a dispersion failure
        found = stability.probe(self.fn, pool, device)
        self.calls += found["calls"]
        self.record.update(host_us=found["host_us"], gpu_us=found["gpu_us"])
        self.checks("timing", residency_point=False)

    def paired_pass(self) -> None:
        """The graph-paired protocol: the candidate's graphs captured, then paired with the yardstick's."""
        self.stage = "graph-paired timing"
        found = graph_timing.paired(self.fn, self.yardstick, self.pool, self.refill, self.paired_check,
                                    names=("candidate", "baseline"), plan=self.plan)
        self.calls += found["calls"]["candidate"]
        self.record["paired"] = found
        hot, flushed = found["hot"], found["flushed"]
        self.record["times_us"], self.record["median_us"] = hot["candidate_times_us"], hot["candidate_us"]
        self.record["speedup"] = found["speedup"]
        self.sanity(flushed["candidate_us"], "flushed center",
                    "; the hot center is not held to it (hot replays read the weight from the L2 and may beat the HBM "
                    "roofline legitimately)")
        residency.settle(self.device)
        self.checks("timing", residency_point=False)

    def sanity(self, median: float | None, label: str, note: str) -> None:
        """timing_sanity: ``median`` (us per call) against the case's bytes at the faster of a read-only pass and
        SANITY_SLACK times the copy (``roofline_us`` the bytes at the faster measured rate); skipped (the book's
        CUDA_ONLY default) where no copy was measured; a missing median fails."""
        copy, read = self.record.get("copy_gbps"), self.record.get("read_gbps")
        if not copy:
            return
        if median is None:
            self.book.check("timing_sanity", False, f"{label}: no time measured")
            return
        nbytes = self.adapter.bytes_moved(self.case)
        self.record["roofline_us"] = nbytes / (max(copy, read or 0) * 1e3)
        floor = nbytes / (max(read or 0, copy * SANITY_SLACK) * 1e3)
        self.book.check("timing_sanity", median >= floor,
                        f"{label} {median:.2f} us vs {floor:.2f} us to move {nbytes:,} bytes at the faster of a "
                        f"read-only pass ({kh.cell(read, '.0f')} GB/s) and {SANITY_SLACK}x the copy ({copy:.0f} GB/s)"
                        + ("" if median >= floor else ": faster than possible") + note)

    def paired_check(self, name: str, regime: str, pair: int, outputs: list) -> None:
        """The candidate's graph outputs after ``pair`` (output j from pool input j, cycled) against the oracle of that
        pair's draw, and their storage against the inputs' and each other's."""
        if name != "candidate":
            return
        refs = self.task.references(self.weight_clones, self.group_inputs(pair), self.case)
        indices = [j % len(self.pool) for j in range(len(outputs))]
        bad, messages = validate(outputs, indices, refs, self.task, self.case, self.device)
        label = f"{len(outputs)} {regime} graph outputs after pair {pair}"
        self.book.check("schedule_outputs", not bad, f"{label}: " + (
            f"{bad} bad: {messages[:EVIDENCE_CAP]}" if bad else f"all within {bound_name(self.task)}"))
        found = overlaps([(f"input {name}", t) for name, t in self.guarded.items()]
                         + [(f"{regime} graph output {j}", o) for j, o in enumerate(outputs)])
        self.book.check("fresh_outputs", not found, f"{label}: " + (
            "; ".join(found[:EVIDENCE_CAP]) if found else "storage disjoint from each other and from every input"))

    def validate_phase(self, phase: str, outs: list, batches) -> None:
        """``batches``: (start, stop, refs), outputs[start:stop] made from pool inputs 0, 1, ... in turn (cycled)."""
        bad, messages = 0, []
        for start, stop, refs in batches:
            indices = [i % len(refs) for i in range(stop - start)]
            wrong, found = validate(outs[start:stop], indices, refs, self.task, self.case, self.device)
            bad, messages = bad + wrong, messages + [f"outputs {start}..{stop - 1}: {m}" for m in found]
        self.book.check("schedule_outputs", not bad, f"{len(outs)} {phase} outputs: " + (
            f"{bad} bad: {messages[:EVIDENCE_CAP]}" if bad else f"all within {bound_name(self.task)}"))
        found = overlaps([(f"input {name}", t) for name, t in self.guarded.items()]
                         + [(f"{phase} output {i}", o) for i, o in enumerate(outs)])
        self.book.check("fresh_outputs", not found, f"{len(outs)} {phase} outputs: " + (
            "; ".join(found[:EVIDENCE_CAP]) if found else "storage disjoint from each other and from every input"))

    def group_inputs(self, group: int) -> list[tuple]:
        return group_inputs(self.task, self.case, len(self.pool), group, self.device)

    def refill(self, group: int) -> None:
        """Group ``group``'s values into the pool, in place (the addresses stay, ``_version`` moves on). First the
        pool must still hold what the verifier wrote last: a write during the previous group shows here."""
        changed = changed_inputs(self.pool_names, self.guarded, self.versions, self.clones)
        if changed:
            self.book.check("input_immutability", False, f"before {'pair' if self.paired else 'timed group'} {group}: "
                            + "; ".join(changed[:EVIDENCE_CAP]))
        for i, fresh in enumerate(self.group_inputs(group)):
            for name, target, values in zip(self.call_args, self.pool[i], fresh):
                if not isinstance(target, torch.Tensor):
                    continue
                label = f"{name}[{i}]"
                target.copy_(values)
                self.clones[label].copy_(values)  # the clone keeps its storage: nothing new for residency to count
                self.versions[label] = target._version
        kh.synchronize(self.device)

    # --------------------------------------------------------------------------------------------- closing checks
    def close(self) -> None:
        self.stage = "closing checks"
        kh.synchronize(self.device)
        if self.kept:
            changed = [label for label, out, clone in self.kept
                       if out.shape != clone.shape or not same_values(out, clone)]
            self.book.check("fresh_outputs", not changed, f"{len(self.kept)} kept outputs: " + (
                f"overwritten after they were returned: {', '.join(changed[:EVIDENCE_CAP])}" if changed
                else "unchanged at the end"))
        problems = changed_inputs(list(self.guarded), self.guarded, self.versions, self.clones)
        self.book.check("input_immutability", not problems, "; ".join(problems[:EVIDENCE_CAP]) if problems else
                        f"{len(self.guarded)} inputs: values and _version unchanged")
        self.kept.clear()
        if self.fn is not None:
            self.checks(f"{self.calls} calls")
        # the yardstick's graphs were alive when the residency baseline was taken: freed only after the last
        # checkpoint, so that no storage the candidate keeps can take their place unseen
        self.yardstick = None
        self.record["calls"] = self.calls
        if self.module is not None:
            unload_solution(self.module)


def baseline_label(task: tasks.Task) -> str:
    """How a record names the task's callable baseline (the manifest's ``baseline.callable``)."""
    return task.manifest["baseline"].get("callable") or "the task's callable baseline"


def run_role(task: tasks.Task, solution_dir: Path | None, case, schedule: Schedule, timing: bool,
             yardstick: Path | None = None, plan: graph_timing.Plan = graph_timing.FULL) -> dict:
    """One solution (``solution_dir``; None: the task's callable baseline) on one case; the record of every gate.
    A graph-paired task's timing pairs it with ``yardstick`` (None: the task's baseline) under ``plan``. Never raises
    for a bad candidate."""
    began = _perf_counter()
    info = kh.select_device()  # before the candidate imports triton
    record = {"case": kh.case_dict(case), "solution": str(solution_dir) if solution_dir else baseline_label(task),
              "device": info.name, "timing": timing, "schedule": asdict(schedule),
              "pinned_core": pin_to_one_core() if timing and schedule.pin == "process"
              and info.device.type == "cuda" else None,
              "error": None, "times_us": [], "median_us": None, "copy_gbps": None, "read_gbps": None,
              "roofline_us": None, "calls": 0}
    book = GateBook(role_gates(task))
    for name, reason in CUDA_ONLY.items():
        if info.device.type != "cuda":
            book.skip(name, reason + f"; this run is on {info.name}")
    for name, reason in undeclared_gates(task).items():
        book.skip(name, reason)
    if not timing:
        for name in TIMING_GATES:
            book.skip(name, "a timing gate: not run with --gates-only")
    role = Role(task, solution_dir, case, schedule, timing, info.device, book, record, yardstick, plan)
    with residency.quiet_heap():  # the residency checkpoints' scans and the protocol's resets skip the libraries
        for step in (role.setup, role.gates_pass, role.timing_pass, role.close):
            if step == role.timing_pass and (not timing or book.failed() or role.fn is None):
                for name in TIMING_GATES if timing else ():  # cheap to expensive: a failed candidate is not timed
                    if book.gates[name]["status"] == "not_run":
                        book.skip(name, f"not timed: hard gates failed first "
                                        f"({', '.join(book.failed()) or 'no build'})")
                continue
            try:
                step()
            except CANDIDATE_ERRORS as exc:  # the candidate's failure is a field of the record
                if role.stage == "setup":
                    record["error"] = error_record(SETUP_STAGE, exc)
                    break
                # build and fn must run without raising: an exception anywhere in the candidate's run fails the api
                # gate
                book.check("api", False, f"raised during {role.stage}: {type(exc).__name__}: {str(exc)[:500]}")
                record["error"] = record["error"] or error_record(role.stage, exc)
    record["gates"] = book.gates
    record["wall_s"] = round(_perf_counter() - began, 3)
    return record
