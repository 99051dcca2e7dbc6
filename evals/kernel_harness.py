"""What every task's evaluation shares: the device (CUDA, else the Triton interpreter on CPU), timing by groups of
calls, the copy-bandwidth ceiling and the record of one output check. The task's own parts (cases, inputs, the
oracle) are its adapter's (evals/task.py).
"""
from __future__ import annotations

import gc
import os
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

# the evaluator's clocks, taken before any solution is imported, so that a patched timer cannot reach them
_perf_counter, _Event = time.perf_counter, torch.cuda.Event
ROOT = Path(__file__).resolve().parent.parent  # the repository: its evals package is the one child processes import


def child_env(**extra: str) -> dict[str, str]:
    """The environment of an evaluator child process (``python -m evals.<module>``): this one's with the repository
    first on PYTHONPATH, so that the child imports these evals wherever it runs, and ``extra`` (such as the parent's
    pid for ``gate_spies.die_with_parent``)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                **extra)


def usable_jobs(jobs: int, count: int) -> int:
    """How many processes run ``count`` independent jobs when ``jobs`` were asked for: at least one, at most one a job
    and one a core this process may use (two on one core would time each other's work)."""
    return max(1, min(jobs, count, len(os.sched_getaffinity(0))))


@dataclass
class CheckResult:
    ok: bool
    message: str
    bad_elements: int = 0
    worst_excess: float = 0.0  # max |out - ref| / tol; <= 1 passes

    def to_dict(self) -> dict:
        return asdict(self)


DTYPE_LABELS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


def dtype_label(dtype: torch.dtype) -> str:
    return DTYPE_LABELS.get(dtype, str(dtype).removeprefix("torch."))


def structure_problem(out, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> str | None:
    """What is wrong with the structure of an output (None: nothing): a plain tensor of ``shape`` and ``dtype`` on
    ``device``'s kind, contiguous."""
    if type(out) is not torch.Tensor:  # a subclass can override .double(), __sub__, ...: the checks' own operations
        kind = type(out)
        return f"output must be a plain torch.Tensor (not a subclass); got {kind.__module__}.{kind.__qualname__}"
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device.type != device.type:
        return (f"output must be {dtype_label(dtype)} {tuple(shape)} on {device.type}; got {out.dtype} "
                f"{tuple(out.shape)} on {out.device}")
    if not out.is_contiguous():
        return f"output must be contiguous; got strides {out.stride()}"
    return None


def cell(value, spec: str = ".2f") -> str:
    """A number in a table (``spec``, a format spec), "-" where there is none."""
    return "-" if value is None else format(value, spec)


def case_dict(case) -> dict:
    """A case as a report records it: its fields and its name."""
    return asdict(case) | {"name": case.name}


def default_panel() -> str:
    """The panel a module runs without --panel, as make chooses: visible on CUDA, else smoke (the visible shapes take
    hours under the Triton interpreter)."""
    return "visible" if torch.cuda.is_available() else "smoke"


# ---------------------------------------------------------------------------------------------------- device and timing
class SetupError(RuntimeError):
    """The machine is not set up to evaluate (the user's environment, not the candidate)."""


@dataclass
class DeviceInfo:
    device: torch.device
    interpreted: bool
    name: str
    message: str


def select_device() -> DeviceInfo:
    """CUDA when present; else CPU tensors under the Triton interpreter, which must be set before triton loads."""
    if torch.cuda.is_available():
        if os.environ.get("TRITON_INTERPRET") == "1":
            raise SetupError("TRITON_INTERPRET=1 is set on a CUDA machine; unset it to run kernels on the GPU")
        name = torch.cuda.get_device_name()
        return DeviceInfo(torch.device("cuda"), False, name, f"running on CUDA: {name}")
    os.environ["TRITON_INTERPRET"] = "1"
    # the interpreter evaluates sigmoid(-large) through numpy's exp, whose overflow to inf is the right answer
    warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
    return DeviceInfo(
        torch.device("cpu"), True, "cpu",
        "no CUDA device: running on CPU tensors under the Triton interpreter (TRITON_INTERPRET=1); "
        "timings are interpreter wall times, not GPU timings",
    )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median(values: list[float]) -> float:
    """The middle value (the upper one of an even count); the verifier's groups are odd in number."""
    return sorted(values)[len(values) // 2]


def time_groups(fn: Callable, inputs: list[tuple], groups: int, calls_per_group: int, warmup: int = 0,
                before_group: Callable[[int], None] | None = None, keep: list | None = None) -> list[float]:
    """Microseconds per call for each of ``groups`` groups of ``calls_per_group`` calls, cycling through ``inputs``.

    On CUDA each group is timed with a pair of CUDA events; on CPU with ``time.perf_counter`` (not GPU timing). Both
    clocks are the ones taken when this module loaded, before any candidate code could replace them. The cyclic
    garbage collector is off during the groups (a collection there is the evaluator's noise). ``before_group(g)``
    runs before group g, outside the timed region; ``keep`` collects every output of the groups.
    """
    device = inputs[0][0].device
    count = len(inputs)
    for i in range(warmup):
        fn(*inputs[i % count])
    synchronize(device)
    times = []
    call = 0
    gc.disable()
    try:
        for group in range(groups):
            if before_group is not None:
                before_group(group)
            if device.type == "cuda":
                start, end = _Event(enable_timing=True), _Event(enable_timing=True)
                start.record()
            else:
                began = _perf_counter()
            for _ in range(calls_per_group):
                out = fn(*inputs[call % count])
                if keep is not None:
                    keep.append(out)
                call += 1
            if device.type == "cuda":
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1000 / calls_per_group)
            else:
                times.append((_perf_counter() - began) * 1e6 / calls_per_group)
    finally:
        gc.enable()
    return times


def _pass_seconds(fn: Callable[[], object], warmup: int = 3, repeats: int = 10) -> float:
    """The median GPU seconds of ``fn()`` over ``repeats`` event-timed passes, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return median(times)


def read_bandwidth_gbps(device: torch.device, nbytes: int = 1 << 30) -> float | None:
    """A read-only pass's bandwidth (a sum over ``nbytes`` of fp32) in GB/s, the median of ten; None off CUDA. A
    kernel that only streams its operands may read faster than a copy moves (a copy also writes)."""
    if device.type != "cuda":
        return None
    src = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    return nbytes / _pass_seconds(src.sum) / 1e9


def copy_bandwidth_gbps(device: torch.device, nbytes: int = 1 << 30) -> float | None:
    """Device-to-device copy bandwidth (bytes read + written) in GB/s, the median of ten; None off CUDA."""
    if device.type != "cuda":
        return None
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return nbytes / _pass_seconds(lambda: dst.copy_(src)) / 1e9
