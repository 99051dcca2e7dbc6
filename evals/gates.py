"""One role of the sealed verifier (evals/verifier.py), run in a process of its own: the hard gates, then the timing.

A role loads one solution for one case and records every gate as a result field; it never raises for a bad candidate.
The gates pass (all a ``--gates-only`` run does) checks, with every output kept and audited:
  api                   build(...) is callable and returns a callable
  output_structure      shape, dtype, device, contiguity, finiteness of every checked output
  numerics_normal       agreement with the fp64 oracle within kernel_harness's fp32 bound, normal inputs
  numerics_adversarial  the same on the adversarial construction (fp16 accumulation overflows there)
  input_immutability    x, residual, qweight, scales, bias equal to clones and with unchanged ``_version``
  fresh_outputs         no output overlaps the storage of an input or of a live earlier output; no element still
                        holds the allocator poison (unwritten); every kept output unchanged at the end
  no_output_caching     one element of x or residual changed (in a new tensor, and in place) changes the result
  no_tampering          timers, synchronize, Event, the current-stream getter and the verifier's own checks keep
                        their identity across build and calls
  streams               (CUDA) the current stream is unchanged and the candidate never selects another stream
  isolation             no file, process, socket or thread started from the candidate's own frames (audit hook)
  residency             evals/residency.py's checkpoints: after build, after the first call, after all calls
With timing, SPEC.md's schedule follows (reset; distinct outputs audited and released; heater; untimed calls;
timed groups) and adds schedule_outputs (every primed and timed output re-validated) and timing_sanity (a median
under the copy-bandwidth roofline of the case's bytes is impossible). Stabilizers: the cyclic garbage collector is
off during the timed groups, and a timing role on CUDA is pinned to one core (os.sched_setaffinity).
"""
from __future__ import annotations

import gc
import math
import os
import sys
import sysconfig
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from evals import kernel_harness as kh
from evals import residency
from evals.loader import load_solution, unload_solution
from evals.selfcheck import error_record

ROLE_GATES = ("api", "output_structure", "numerics_normal", "numerics_adversarial", "input_immutability",
              "fresh_outputs", "no_output_caching", "no_tampering", "streams", "isolation", "residency",
              "schedule_outputs", "timing_sanity")
TIMING_GATES = ("schedule_outputs", "timing_sanity")
CUDA_ONLY = {"streams": "CUDA streams exist only on a CUDA device",
             "timing_sanity": "the copy-bandwidth roofline is measured on CUDA only"}
GATE_POOL = 4  # distinct input pairs of the gates pass
GATE_CALLS = 8  # plain calls after the targeted checks, so that storage kept lazily shows at the last checkpoint
KEPT_PRIMED = 8  # primed outputs kept with clones to the end: a stale workspace write shows as a changed value
POISON_BITS = 0x7E5A  # an fp16 quiet NaN with a payload that no arithmetic produces
POISON_COPIES = 16  # enough freed output-sized blocks that the next output lands on one (CPU malloc included)
VALIDATE_CHUNK = 64  # outputs compared against the oracle at once (bounds fp64 scratch)
EVIDENCE_CAP = 8

# the verifier's own handles, taken before any candidate code runs
_perf_counter, _Event, _synchronize = time.perf_counter, torch.cuda.Event, torch.cuda.synchronize
_STDLIB = tuple({sysconfig.get_paths()["stdlib"] + os.sep, sysconfig.get_paths()["platstdlib"] + os.sep})
_WATCHED_EVENTS = frozenset(("open", "os.system", "subprocess.Popen", "os.posix_spawn", "os.spawn", "os.fork",
                             "os.forkpty", "os.exec", "os.kill", "socket.__new__", "socket.connect", "socket.bind",
                             "ctypes.dlopen", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.chdir"))


@dataclass(frozen=True)
class Schedule:
    prime_outputs: int
    heater_warmup: int
    heater_matmuls: int
    heater_size: int
    untimed_calls: int
    groups: int
    calls_per_group: int
    input_pool: int  # distinct pre-generated (x, residual) pairs, cycled; the same for all three roles

    @property
    def calls(self) -> int:
        return self.prime_outputs + self.untimed_calls + self.groups * self.calls_per_group


# SPEC.md's schedule; "smoke" only makes CPU tests short and never scores anything.
SCHEDULES = {"spec": Schedule(16384, 8, 1024, 4096, 8192, 11, 512, 64),
             "smoke": Schedule(16, 1, 2, 256, 4, 11, 1, 4)}


class GateBook:
    """Each gate's status (pass, fail, skip, not_run) and a few lines of evidence; a failure is never overwritten."""

    def __init__(self) -> None:
        self.gates = {name: {"status": "not_run", "evidence": []} for name in ROLE_GATES}

    def check(self, name: str, ok: bool, evidence) -> bool:
        """Record one observation: a failing gate keeps its first failures, a passing one its latest evidence."""
        gate = self.gates[name]
        if not ok:
            if gate["status"] != "fail":
                gate["status"], gate["evidence"] = "fail", []
            if len(gate["evidence"]) < EVIDENCE_CAP:
                gate["evidence"].append(evidence)
        elif gate["status"] != "fail":
            gate["status"], gate["evidence"] = "pass", (gate["evidence"] + [evidence])[-EVIDENCE_CAP:]
        return ok

    def skip(self, name: str, reason: str) -> None:
        self.gates[name] = {"status": "skip", "evidence": [reason]}

    def failed(self) -> list[str]:
        return [name for name, gate in self.gates.items() if gate["status"] == "fail"]


# ----------------------------------------------------------------------------------------------------- spies
class Spies:
    """Events raised from the candidate's own frames: audit events, thread starts and stream selections."""

    def __init__(self, solution_dir: Path) -> None:
        self.prefix = str(solution_dir) + os.sep
        self.events: list[str] = []
        self.stream_sets: list[str] = []
        sys.addaudithook(self._audit)  # permanent by design: a role process judges one solution once
        start = threading.Thread.start
        spies = self

        def spied_start(thread, *args, **kwargs):
            where = spies.culprit(sys._getframe(1))
            if where:
                spies.events.append(f"thread start ({getattr(thread, 'name', '?')}) at {where}")
            return start(thread, *args, **kwargs)

        threading.Thread.start = spied_start
        set_stream = getattr(torch._C, "_cuda_setStream", None)
        if set_stream is not None:
            def spied_set_stream(*args, **kwargs):
                where = spies.culprit(sys._getframe(1), anywhere=True)
                if where and kwargs.get("stream_id", args[0] if args else None) != spies.first_stream_id:
                    spies.stream_sets.append(f"stream {kwargs or args} selected from {where}")
                return set_stream(*args, **kwargs)

            torch._C._cuda_setStream = spied_set_stream
        self.first_stream_id = torch.cuda.current_stream().stream_id if torch.cuda.is_available() else None

    def culprit(self, frame, anywhere: bool = False) -> str | None:
        """file:line of the candidate frame to blame: the innermost frame outside the standard library (or, with
        ``anywhere``, any frame on the stack) when it lies in the solution directory. Imports are not blamed."""
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith("<frozen importlib"):
                return None
            if name.startswith(self.prefix):
                return f"{Path(name).name}:{frame.f_lineno}"
            if not anywhere and not _is_stdlib(name):
                return None
            frame = frame.f_back
        return None

    def _audit(self, event: str, args: tuple) -> None:
        if event in _WATCHED_EVENTS:
            where = self.culprit(sys._getframe(1))
            if where:
                self.events.append(f"{event} {str(args)[:160]} at {where}")


def _is_stdlib(filename: str) -> bool:
    # a venv's platstdlib holds its site-packages: libraries there (torch, triton) are not the standard library
    return filename.startswith("<") or (filename.startswith(_STDLIB) and "-packages" + os.sep not in filename)


def tamper_snapshot() -> dict[str, object]:
    return {"time.perf_counter": time.perf_counter, "time.perf_counter_ns": time.perf_counter_ns,
            "time.time": time.time, "time.monotonic": time.monotonic, "torch.cuda.synchronize": torch.cuda.synchronize,
            "torch.cuda.Event": torch.cuda.Event, "torch.cuda.current_stream": torch.cuda.current_stream,
            "torch.cuda.Stream": torch.cuda.Stream, "torch.cuda.set_stream": torch.cuda.set_stream,
            "torch.empty": torch.empty, "gc.collect": gc.collect, "gc.disable": gc.disable, "gc.enable": gc.enable,
            "kernel_harness.reference": kh.reference, "kernel_harness.check_output": kh.check_output,
            "residency.measure": residency.measure}


# ----------------------------------------------------------------------------------------------------- output audits
def poison_allocator(shape: tuple[int, int], device: torch.device) -> None:
    """Leave freed blocks of the output's size full of POISON_BITS, so that elements a call never writes show."""
    blocks = [torch.full((shape[0] * shape[1],), POISON_BITS, dtype=torch.int16, device=device) for _ in range(POISON_COPIES)]
    del blocks


def structure_problem(out, shape: tuple[int, int], device: torch.device) -> str | None:
    if not isinstance(out, torch.Tensor):
        return f"output must be a torch.Tensor; got {type(out).__name__}"
    if tuple(out.shape) != shape or out.dtype != torch.float16 or out.device.type != device.type:
        return f"output must be fp16 {shape} on {device.type}; got {out.dtype} {tuple(out.shape)} on {out.device}"
    if not out.is_contiguous():
        return f"output must be contiguous; got strides {out.stride()}"
    return None


def span(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def overlaps(labelled: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Pairs of tensors whose storages share bytes (sorted sweep, so 16,384 outputs cost a sort)."""
    spans = sorted((*span(t), label) for label, t in labelled if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes())
    found, reach, holder = [], -1, ""
    for start, end, label in spans:
        if start < reach:
            found.append(f"{label} shares storage with {holder}")
        if end > reach:
            reach, holder = end, label
    return found


def validate(outs: list, indices: list[int], refs: list[kh.Reference], shape, device) -> tuple[int, list[str]]:
    """Outputs (of pool inputs ``indices``) outside the oracle's bound, counted by batches; returns (bad, messages)."""
    bad, messages = 0, []
    by_input: dict[int, list] = {}
    for n, (out, index) in enumerate(zip(outs, indices)):
        problem = structure_problem(out, shape, device)
        if problem:
            bad += 1
            messages.append(f"output {n}: {problem}")
        else:
            by_input.setdefault(index, []).append(out)
    for index, group in by_input.items():
        for start in range(0, len(group), VALIDATE_CHUNK):
            stack = torch.stack(group[start:start + VALIDATE_CHUNK]).double()
            within = (stack - refs[index].out).abs() <= refs[index].tolerance  # NaN compares False: counted bad
            wrong = int((~within.flatten(1).all(dim=1)).sum())
            bad += wrong
            if wrong:
                messages.append(f"{wrong} outputs of input {index} outside the fp32 bound or not finite")
    return bad, messages[:EVIDENCE_CAP]


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:  # NaN never equals itself; compare with NaNs mapped alike
        return torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))
    return torch.equal(a, b)


def pin_to_one_core() -> int | None:
    """Pin the role to one core (SPEC.md advice: fewer stalled host groups); None where the OS has no affinity call."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


# ----------------------------------------------------------------------------------------------------- the role
class Role:
    def __init__(self, solution_dir: Path, case: kh.Case, schedule: Schedule, timing: bool, device: torch.device,
                 book: GateBook, record: dict) -> None:
        self.solution_dir, self.case, self.schedule, self.timing = solution_dir, case, schedule, timing
        self.device, self.book, self.record = device, book, record
        self.shape = (case.m, case.n)
        self.stage = "setup"
        self.module = self.fn = None
        self.kept: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # (label, output, clone) checked at the end
        self.calls = 0

    def setup(self) -> None:
        """Everything the verifier owns exists before the residency baseline and before any candidate code runs."""
        case, device = self.case, self.device
        self.weights = kh.generate(case, "normal", device)
        self.adversarial = kh.generate(case, "adversarial", device)
        a = self.adversarial
        self.adversarial_ref = kh.reference(a.x, a.qweight, a.scales, a.bias, a.residual, case.epilogue)
        self.pool = kh.make_inputs(case, max(self.schedule.input_pool if self.timing else 0, GATE_POOL), seed=11, device=device)
        self.refs = self.references(self.pool)
        w = self.weights
        self.guarded = {"qweight": w.qweight, "scales": w.scales, "bias": w.bias, "adversarial qweight": a.qweight,
                        "adversarial scales": a.scales, "adversarial bias": a.bias, "adversarial x": a.x,
                        "adversarial residual": a.residual}
        for i, (x, residual) in enumerate(self.pool):
            self.guarded[f"x[{i}]"], self.guarded[f"residual[{i}]"] = x, residual
        self.clones = {name: t.clone() for name, t in self.guarded.items()}
        if self.timing and device.type == "cuda":
            self.record["copy_gbps"] = kh.copy_bandwidth_gbps(device)
        residency.warm_libraries(device)
        residency.settle(device)
        self.before, self.before_allocated = residency.live_storages(device), residency.allocated(device)
        self.versions = {name: t._version for name, t in self.guarded.items()}
        self.spies = Spies(self.solution_dir)
        self.snapshot = tamper_snapshot()
        self.threads_before = threading.active_count()
        self.stream_before = torch.cuda.current_stream().stream_id if device.type == "cuda" else None

    def references(self, pool) -> list[kh.Reference]:
        """One oracle pass over all pool inputs stacked by rows (rows are independent), split back per input."""
        w, m = self.weights, self.case.m
        ref = kh.reference(torch.cat([p[0] for p in pool]), w.qweight, w.scales, w.bias,
                           torch.cat([p[1] for p in pool]), self.case.epilogue)
        return [kh.Reference(ref.out[i * m:(i + 1) * m], ref.tolerance[i * m:(i + 1) * m]) for i in range(len(pool))]

    def call(self, fn, x, residual):
        poison_allocator(self.shape, self.device)
        out = fn(x, residual)
        kh.synchronize(self.device)
        self.calls += 1
        return out

    # --------------------------------------------------------------------------------------------- gates pass
    def gates_pass(self) -> None:
        self.stage = "load and build"
        self.module = load_solution(self.solution_dir)
        w = self.weights
        fn = self.module.build(w.qweight, w.scales, w.bias, self.case.epilogue)
        if not self.book.check("api", callable(fn), f"build returned {type(fn).__name__}"):
            return
        self.fn = fn
        self.checks("build")
        self.stage = "first call"
        out = self.call(fn, *self.pool[0])
        self.audit("first call", out, self.refs[0], "numerics_normal", keep=False)
        self.alias_check([("first call", out)])
        del out
        self.checks("first call")
        self.stage = "adversarial build and call"
        self.adversarial_check()
        self.stage = "single-element changes"
        self.caching_check(fn)
        self.stage = "gate calls"
        for i in range(GATE_CALLS):
            out = self.call(fn, *self.pool[i % GATE_POOL])
            self.audit(f"call {i}", out, self.refs[i % GATE_POOL], "numerics_normal")
        self.alias_check([(label, out) for label, out, _ in self.kept])
        self.checks("gates pass", residency_point=False)

    def audit(self, label: str, out, ref: kh.Reference, numerics_gate: str, keep: bool = True) -> None:
        problem = structure_problem(out, self.shape, self.device)
        if problem is None and not bool(torch.isfinite(out).all()):
            problem = f"{int((~torch.isfinite(out)).sum())} elements are not finite"
        self.book.check("output_structure", problem is None, f"{label}: {problem or 'fp16, contiguous, finite'}")
        if isinstance(out, torch.Tensor) and out.dtype == torch.float16:
            unwritten = int((out.view(torch.int16) == POISON_BITS).sum())
            self.book.check("fresh_outputs", not unwritten, f"{label}: {unwritten} elements still hold the allocator "
                            "poison (never written)" if unwritten else f"{label}: every element written")
        result = kh.check_output(out, ref, self.shape)
        self.book.check(numerics_gate, result.ok, f"{label}: {result.message} (worst {result.worst_excess:.3g} of the bound)")
        if keep:
            self.keep(label, out)

    def keep(self, label: str, out):
        """Hold an output and a clone to the end of the role: whatever writes into it later shows."""
        if isinstance(out, torch.Tensor):
            self.kept.append((label, out, out.clone()))
        return out

    def adversarial_check(self) -> None:
        a = self.adversarial
        fn = self.module.build(a.qweight, a.scales, a.bias, self.case.epilogue)
        if self.book.check("api", callable(fn), f"build (adversarial weights) returned {type(fn).__name__}"):
            self.audit("adversarial", self.call(fn, a.x, a.residual), self.adversarial_ref, "numerics_adversarial")

    def caching_check(self, fn) -> None:
        """An input that differs from an earlier one in a single element must give its own correct output."""
        (x0, r0), pristine = self.pool[0], self.clones  # the oracle never reads a tensor the candidate could write
        x1, r1 = x0.clone(), r0.clone()
        x1[-1, -1] += 8
        r1[-1, -1] += 8
        earlier = self.call(fn, x0, r0)
        self.keep("caching: original input", earlier)
        earlier = earlier.clone() if isinstance(earlier, torch.Tensor) else earlier  # its values now, whatever aliases it
        in_place = x0.clone()
        self.keep("caching: same address, before the write", self.call(fn, in_place, r0))
        in_place[-1, -1] += 8
        trials = [("x changed in one element (new tensor)", x1, r0), ("residual changed in one element (new tensor)", x0, r1),
                  ("x changed in one element in place (same address)", in_place, r0)]
        for label, x, residual in trials:
            out = self.call(fn, x, residual)
            ref = kh.reference(x, pristine["qweight"], pristine["scales"], pristine["bias"], residual, self.case.epilogue)
            result = kh.check_output(out, ref, self.shape)
            stale = (not result.ok and isinstance(out, torch.Tensor) and isinstance(earlier, torch.Tensor)
                     and out.shape == earlier.shape and out.dtype == earlier.dtype and same_values(out, earlier))
            self.book.check("no_output_caching", result.ok, f"{label}: {result.message}"
                            + (" (identical to the output of the original input: a cached result)" if stale else ""))
            self.keep(f"caching: {label}", out)

    def alias_check(self, outputs: list[tuple[str, torch.Tensor]]) -> None:
        found = overlaps([(f"input {name}", t) for name, t in self.guarded.items()] + outputs)
        self.book.check("fresh_outputs", not found, "; ".join(found[:EVIDENCE_CAP]) if found else
                        f"{len(outputs)} outputs: storage disjoint from each other and from every input")

    def checks(self, when: str, residency_point: bool = True) -> None:
        """Residency (a checkpoint), tampering, streams and isolation, as they stand now."""
        if residency_point:
            point = residency.measure(when, self.before, self.before_allocated, self.device, self.case)
            self.book.check("residency", not point.violations, {
                "checkpoint": when, "total_bytes": point.total_bytes, "floating_bytes": point.floating_bytes,
                "unattributed_bytes": point.unattributed_bytes, "violations": [v["message"] for v in point.violations]})
        now = tamper_snapshot()
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
                        + (f"; {'; '.join(self.spies.events[:4])}" if self.spies.events else "; no file, process or socket use"))

    # --------------------------------------------------------------------------------------------- timing pass
    def timing_pass(self) -> None:
        s, pool, device = self.schedule, self.pool, self.device
        self.stage = "timing schedule"
        residency.settle(device)  # SPEC.md's reset: synchronize, gc, empty_cache
        primed = [self.fn(*pool[i % len(pool)]) for i in range(s.prime_outputs)]
        self.calls += len(primed)
        self.validate_phase("primed", primed)
        ends = list(range(min(KEPT_PRIMED // 2, len(primed)))) + list(range(max(KEPT_PRIMED // 2, len(primed) - KEPT_PRIMED // 2), len(primed)))
        for i in ends:
            self.keep(f"primed output {i}", primed[i])
        del primed  # released: the allocator now holds that many output blocks
        self.heat()
        for i in range(s.untimed_calls):
            self.fn(*pool[i % len(pool)])
        self.calls += s.untimed_calls
        kh.synchronize(device)
        times, timed = self.timed_groups()
        self.calls += len(timed)
        self.record["times_us"] = times
        self.record["median_us"] = median = sorted(times)[len(times) // 2]
        self.validate_phase("timed", timed)
        del timed
        gbps = self.record.get("copy_gbps")
        if gbps:
            self.record["roofline_us"] = roofline = self.case.bytes_moved() / (gbps * 1e3)
            self.book.check("timing_sanity", median >= roofline, f"median {median:.2f} us vs {roofline:.2f} us to move "
                            f"{self.case.bytes_moved():,} bytes at the copy bandwidth {gbps:.0f} GB/s"
                            + ("" if median >= roofline else ": faster than possible"))
        self.checks("timing", residency_point=False)

    def validate_phase(self, phase: str, outs: list) -> None:
        bad, messages = validate(outs, [i % len(self.pool) for i in range(len(outs))], self.refs, self.shape, self.device)
        self.book.check("schedule_outputs", not bad, f"{len(outs)} {phase} outputs: " + (f"{bad} bad: {messages}" if bad
                        else "all within the fp32 bound"))
        found = overlaps([(f"input {name}", t) for name, t in self.guarded.items()] + [(f"{phase} output {i}", o) for i, o in enumerate(outs)])
        self.book.check("fresh_outputs", not found, f"{len(outs)} {phase} outputs: " + ("; ".join(found[:EVIDENCE_CAP]) if found
                        else "storage disjoint from each other and from every input"))

    def heat(self) -> None:
        s = self.schedule
        a = torch.randn((s.heater_size, s.heater_size), device=self.device).half()
        b = torch.randn_like(a)
        for _ in range(s.heater_warmup + s.heater_matmuls):
            a @ b
        kh.synchronize(self.device)

    def timed_groups(self) -> tuple[list[float], list]:
        """Microseconds per call of each group (CUDA events; perf_counter off CUDA), every output kept for re-validation."""
        s, fn, pool = self.schedule, self.fn, self.pool
        outs, times, count = [], [], len(pool)
        gc.disable()  # a collection inside a group is the verifier's noise, not the candidate's
        try:
            for _ in range(s.groups):
                if self.device.type == "cuda":
                    start, end = _Event(enable_timing=True), _Event(enable_timing=True)
                    start.record()
                    for _ in range(s.calls_per_group):
                        outs.append(fn(*pool[len(outs) % count]))
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1000 / s.calls_per_group)
                else:
                    began = _perf_counter()
                    for _ in range(s.calls_per_group):
                        outs.append(fn(*pool[len(outs) % count]))
                    times.append((_perf_counter() - began) * 1e6 / s.calls_per_group)
        finally:
            gc.enable()
        return times, outs

    # --------------------------------------------------------------------------------------------- closing checks
    def close(self) -> None:
        self.stage = "closing checks"
        kh.synchronize(self.device)
        if self.kept:
            changed = [label for label, out, clone in self.kept if out.shape != clone.shape or not same_values(out, clone)]
            self.book.check("fresh_outputs", not changed, f"{len(self.kept)} kept outputs: " + (
                f"overwritten after they were returned: {', '.join(changed[:EVIDENCE_CAP])}" if changed else "unchanged at the end"))
        problems = []
        for name, tensor in self.guarded.items():
            if tensor._version != self.versions[name]:
                problems.append(f"{name} written in place (_version {self.versions[name]} -> {tensor._version})")
            elif not same_values(tensor, self.clones[name]):
                problems.append(f"{name} changed values")
        self.book.check("input_immutability", not problems, "; ".join(problems[:EVIDENCE_CAP]) if problems else
                        f"{len(self.guarded)} inputs: values and _version unchanged")
        self.kept.clear()
        if self.fn is not None:
            self.checks(f"{self.calls} calls")
        self.record["calls"] = self.calls
        if self.module is not None:
            unload_solution(self.module)


def run_role(solution_dir: Path, case: kh.Case, schedule: Schedule, timing: bool) -> dict:
    """One solution on one case; the record of every gate. Never raises for a bad candidate."""
    began = _perf_counter()
    info = kh.select_device()  # before the candidate imports triton
    record = {"case": kh.case_dict(case), "solution": str(solution_dir), "device": info.name, "timing": timing,
              "schedule": asdict(schedule), "pinned_core": pin_to_one_core() if timing and info.device.type == "cuda" else None,
              "error": None, "times_us": [], "median_us": None, "copy_gbps": None, "roofline_us": None, "calls": 0}
    book = GateBook()
    for name, reason in CUDA_ONLY.items():
        if info.device.type != "cuda":
            book.skip(name, reason + f"; this run is on {info.name}")
    if not timing:
        for name in TIMING_GATES:
            book.skip(name, "a timing gate: not run with --gates-only")
    role = Role(solution_dir, case, schedule, timing, info.device, book, record)
    for step in (role.setup, role.gates_pass, role.timing_pass, role.close):
        if step == role.timing_pass and (not timing or book.failed() or role.fn is None):
            for name in TIMING_GATES if timing else ():  # cheap to expensive: a failed candidate is not timed
                if book.gates[name]["status"] == "not_run":
                    book.skip(name, f"not timed: hard gates failed first ({', '.join(book.failed()) or 'no build'})")
            continue
        try:
            step()
        except (Exception, SystemExit) as exc:  # the candidate's failure is a field of the record
            if role.stage == "setup":
                record["error"] = error_record("setup (the verifier's own)", exc)
                break
            # build and fn must run without raising: an exception anywhere in the candidate's run fails the api gate
            book.check("api", False, f"raised during {role.stage}: {type(exc).__name__}: {str(exc)[:500]}")
            record["error"] = record["error"] or error_record(role.stage, exc)
    record["gates"] = book.gates
    record["wall_s"] = round(_perf_counter() - began, 3)
    return record
