"""The instruments of a verifier role (evals/gates.py), none of which holds role state: the gate book, the spies,
the output and input audits, and the oracle over an input pool.

GateBook records each gate's status and evidence; Spies blames audit events, thread starts and stream selections on
the candidate's own frames; tamper_snapshot names the handles whose identity must survive build and calls; the
audits poison the allocator, check structure, storage overlaps, batches against the oracle, and inputs against clones.
Everything task-specific (the output's shape and dtype, the oracle, its bound) comes from the task's adapter
(evals/task.py); the optional batched forms ``references`` and ``outside_bound`` are used where the adapter has them.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import signal
import sys
import sysconfig
import threading
import time
from pathlib import Path

import torch

from evals import kernel_harness as kh
from evals import residency

POISON_BYTE = 0x7E  # every byte of a poisoned block: an element of any dtype reads as that byte repeated
POISON_BITS = POISON_BYTE * 0x101  # 0x7E7E: a two-byte element (fp16: a quiet NaN with a payload no arithmetic makes)
POISON_COPIES = 16  # enough freed output-sized blocks that the CUDA caching allocator's next output lands on one
_M_MMAP_THRESHOLD, _M_PERTURB = -3, -6  # glibc mallopt parameters
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit; blocks below it come from the heap, where the fill applies
VALIDATE_CHUNK = 64  # outputs compared against the oracle at once (bounds fp64 scratch)
EVIDENCE_CAP = 8
DEFAULT_BOUND = "the reference's bound"  # what a batch's failures are said to be outside, unless the adapter's BOUND
_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _open_libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # no C library to open
        return None


_LIBC = _open_libc()  # at import, not inside a candidate's call, where the spies watch ctypes.dlopen
_STDLIB = tuple({sysconfig.get_paths()["stdlib"] + os.sep, sysconfig.get_paths()["platstdlib"] + os.sep})
_WATCHED_EVENTS = frozenset(("open", "os.system", "subprocess.Popen", "os.posix_spawn", "os.spawn", "os.fork",
                             "os.forkpty", "os.exec", "os.kill", "socket.__new__", "socket.connect", "socket.bind",
                             "ctypes.dlopen", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.chdir"))


class GateBook:
    """Each gate's status (pass, fail, skip, not_run) and a few lines of evidence; a failure is never overwritten."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.gates = {name: {"status": "not_run", "evidence": []} for name in names}

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


ADAPTER_CHECKS = ("reference", "check_output", "references", "outside_bound")  # what the gates call on the adapter


def tamper_snapshot(task) -> dict[str, object]:
    """The handles whose identity must survive build and calls: timers, synchronize, streams, the allocator's entry,
    gc, and the checks the verifier calls (the task adapter's oracle and output check, residency's measure); for a
    graph-paired task also CUDA-graph capture and replay and the spin kernel (evals/graph_timing.py)."""
    checks = {f"adapter.{name}": getattr(task.adapter, name) for name in ADAPTER_CHECKS
              if hasattr(task.adapter, name)}
    graphs = {}
    if getattr(task, "graph_paired", False):
        cls = torch.cuda.CUDAGraph
        graphs = {"torch.cuda.graph": torch.cuda.graph, "torch.cuda.CUDAGraph": cls,
                  "torch.cuda.CUDAGraph.replay": cls.replay, "torch.cuda.CUDAGraph.capture_begin": cls.capture_begin,
                  "torch.cuda.CUDAGraph.capture_end": cls.capture_end, "torch.cuda._sleep": torch.cuda._sleep}
    return {"time.perf_counter": time.perf_counter, "time.perf_counter_ns": time.perf_counter_ns,
            "time.time": time.time, "time.monotonic": time.monotonic, "torch.cuda.synchronize": torch.cuda.synchronize,
            "torch.cuda.Event": torch.cuda.Event, "torch.cuda.current_stream": torch.cuda.current_stream,
            "torch.cuda.Stream": torch.cuda.Stream, "torch.cuda.set_stream": torch.cuda.set_stream,
            "torch.empty": torch.empty, "gc.collect": gc.collect, "gc.disable": gc.disable, "gc.enable": gc.enable,
            "gc.get_objects": gc.get_objects, "gc.freeze": gc.freeze, "gc.unfreeze": gc.unfreeze,
            **checks, "residency.measure": residency.measure,
            "residency.live_storages": residency.live_storages, **graphs}


# ----------------------------------------------------------------------------------------------------- output audits
def poison_bits(itemsize: int) -> int:
    """An element of ``itemsize`` bytes that is all POISON_BYTE, as the signed integer of that width reads it."""
    return int.from_bytes(bytes([POISON_BYTE]) * itemsize, "little", signed=True)


def unwritten(out: torch.Tensor) -> int:
    """Elements of ``out`` that still hold the poison (read through the integer dtype of the element's width)."""
    width = out.element_size()
    if width not in _SAME_WIDTH_INT:
        return 0
    return int((out.view(_SAME_WIDTH_INT[width]) == poison_bits(width)).sum())


def poison_allocator(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """Leave freed blocks of the output's size full of POISON_BYTE, so that elements a call never writes show."""
    nbytes = math.prod(shape) * dtype.itemsize
    blocks = [torch.full((nbytes,), POISON_BYTE, dtype=torch.uint8, device=device) for _ in range(POISON_COPIES)]
    del blocks


def malloc_fill(on: bool) -> bool:
    """Make glibc's malloc fill every block it hands out with POISON_BYTE (``on``), or stop; False without glibc.

    Which free chunk glibc picks depends on the heap's whole history: in CI a fresh output once landed 56% on freed
    poison and 44% elsewhere. The fill (M_PERTURB) does not depend on it. It applies to heap blocks only, so the
    mmap threshold is raised to glibc's ceiling (and stays there: mallopt cannot restore the dynamic threshold).
    """
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:
        return False
    if on and mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) != 1:
        return False
    return mallopt(_M_PERTURB, POISON_BYTE ^ 0xFF if on else 0) == 1  # glibc fills with the complement


@contextlib.contextmanager
def poisoned_allocations(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
    """Within, an output (``shape``, ``dtype``) the call allocates holds POISON_BYTE wherever the call leaves it
    unwritten.

    CUDA: the caching allocator hands out one of the freed output-sized blocks. CPU: glibc fills each block it hands
    out (the freed blocks stay as the fallback without glibc; CPU outputs above 32 MB come from mmap, zeroed).
    """
    poison_allocator(shape, dtype, device)  # before the fill starts: with it on, glibc would overwrite what it frees
    filling = device.type == "cpu" and malloc_fill(True)
    try:
        yield
    finally:
        if filling:
            malloc_fill(False)


def span(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def overlaps(labelled: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Pairs of tensors whose storages share bytes (sorted sweep, so 16,384 outputs cost a sort)."""
    spans = sorted((*span(t), label) for label, t in labelled
                   if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes())
    found, reach, holder = [], -1, ""
    for start, end, label in spans:
        if start < reach:
            found.append(f"{label} shares storage with {holder}")
        if end > reach:
            reach, holder = end, label
    return found


def bound_name(task) -> str:
    """What the task's oracle bounds outputs by, in words (the adapter's BOUND, e.g. "the fp32 bound")."""
    return getattr(task.adapter, "BOUND", DEFAULT_BOUND)


def validate(outs: list, indices: list[int], refs: list, task, case, device) -> tuple[int, list[str]]:
    """Outputs (of pool inputs ``indices``) outside the oracle's bound, counted by batches; returns (bad, messages).
    A batch of one input's outputs goes to the adapter's ``outside_bound(outs, ref, case) -> count`` where it has one,
    else each output to its ``check_output``."""
    adapter = task.adapter
    shape, dtype = tuple(adapter.output_shape(case)), adapter.OUTPUT_DTYPE
    count = getattr(adapter, "outside_bound", None)
    bad, messages = 0, []
    by_input: dict[int, list] = {}
    for n, (out, index) in enumerate(zip(outs, indices)):
        problem = kh.structure_problem(out, shape, dtype, device)
        if problem:
            bad += 1
            messages.append(f"output {n}: {problem}")
        else:
            by_input.setdefault(index, []).append(out)
    for index, group in by_input.items():
        for start in range(0, len(group), VALIDATE_CHUNK):
            batch = group[start:start + VALIDATE_CHUNK]
            wrong = (count(batch, refs[index], case) if count is not None
                     else sum(not adapter.check_output(out, refs[index], case).ok for out in batch))
            bad += wrong
            if wrong:
                messages.append(f"{wrong} outputs of input {index} outside {bound_name(task)} or not finite")
    return bad, messages[:EVIDENCE_CAP]


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:  # NaN never equals itself; compare with NaNs mapped alike
        return torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))
    return torch.equal(a, b)


def write_unversioned(tensor: torch.Tensor, index: tuple[int, int], delta: float) -> bool:
    """Add ``delta`` to one element through a second tensor on the same storage, which has a version counter of its
    own, so ``tensor._version`` does not move (a cache keyed on address and version cannot see the change).
    Returns whether that held: the value changed and the version did not."""
    version, before = tensor._version, float(tensor[index])
    alias = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    alias.set_(tensor.untyped_storage(), tensor.storage_offset(), tensor.shape, tensor.stride())
    alias[index] += delta
    return tensor._version == version and float(tensor[index]) != before


def changed_inputs(names: list[str], guarded: dict, versions: dict, clones: dict) -> list[str]:
    """Which of the named inputs moved ``_version`` or changed values since the verifier last recorded them."""
    problems = []
    for name in names:
        tensor = guarded[name]
        if tensor._version != versions[name]:
            problems.append(f"{name} written in place (_version {versions[name]} -> {tensor._version})")
        elif not same_values(tensor, clones[name]):
            problems.append(f"{name} changed values")
    return problems


# ----------------------------------------------------------------------------------------------------- timing
def heat(size: int, matmuls: int, device: torch.device) -> None:
    a = torch.randn((size, size), device=device).half()
    b = torch.randn_like(a)
    for _ in range(matmuls):
        a @ b
    kh.synchronize(device)


def isolate_timing_thread(cores: set[int]) -> int | None:
    """The calling thread alone on the highest of ``cores``, every other thread of this process on the rest.

    Threads that already exist (the CUDA driver's, torch's) keep running, just never on the timing thread's core.
    None where the OS has no per-thread affinity (no /proc/self/task) or there is only one core.
    """
    if not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task") or len(cores) < 2:
        return None
    core = max(cores)
    me = threading.get_native_id()
    for name in os.listdir("/proc/self/task"):
        tid = int(name)
        try:
            os.sched_setaffinity(tid, {core} if tid == me else cores - {core})
        except OSError:  # the thread ended meanwhile
            pass
    return core


def die_with_parent(parent: str | None) -> bool:
    """Ask Linux to SIGKILL this process when its parent (pid ``parent``: the verifier, the sweep) dies; exit at once
    if it already has, so that nothing keeps timing on the GPU after a killed evaluator.

    False where that cannot be arranged (no prctl: not Linux) or no parent pid was given.
    """
    if not parent or not sys.platform.startswith("linux"):
        return False
    prctl = getattr(_LIBC, "prctl", None)
    if prctl is None or prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        return False
    if os.getppid() != int(parent):  # the verifier died before the request took effect
        os._exit(1)
    return True


def pin_to_one_core() -> int | None:
    """Pin the role to one core (the timing protocol's advice: fewer stalled host groups); None where the OS has no
    affinity call."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core
