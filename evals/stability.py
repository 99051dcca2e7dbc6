"""Whether a callable's timing is measurable: its host cost per call against its GPU time per call.

The verifier fails a case when one role's 11 group times spread over DISPERSION_LIMIT (max/min; evals/verifier.py
applies it, and every report that judges by it carries it as "limit"). A call whose GPU work is shorter than the
host's work to issue it leaves the GPU waiting on the host, so each group's time is the host's, and these hosts are
noisy (one pinned host loop: max/min 1.40 over 11 groups). A call whose GPU time clears its host cost keeps the
launch queue full, and the group times are the GPU's, which are steady. ``probe`` measures both numbers in one pass;
``verdict`` applies the calibrated rule: stable when GPU time >= STABLE_RATIO x host cost.

STABLE_RATIO: on an H200 every timed vector of the synthetic calibration (a spin kernel of known GPU time, all three
pinning schedules) stayed within 1.10 max/min, a margin under the gate, from a GPU/host ratio of 1.06 up
(``python -m evals.qualify --curve``, reports/examples/h200-stability). The rule asks 1.3: the host cost is measured
once per case, and the same call's host cost moved between 11 and 17 us from one measurement to the next there.
"""
from __future__ import annotations

import time

import torch

from evals import kernel_harness as kh

DISPERSION_LIMIT = 1.15
"""The verifier's max/min over a role's 11 timed groups, and over its two baseline medians: over it, a case fails."""
STABLE_RATIO = 1.3
"""GPU time per call over host cost per call at and above which the verifier's timed vectors stay within 1.10."""
PROBE_CALLS = 128  # calls issued while the GPU is busy: well under the launch queue's depth
PROBE_ROUNDS = 5
# Distinct call inputs the selfcheck probes with: as many as the verifier's input pool (evals/gates.py, its "spec"
# schedule), which ``probe`` takes in turn over its rounds, so that its GPU time per call is the one the verifier's
# groups see. A few inputs cycled stay in the L2 and run shorter (a W4A16 plan cycled over 16 inputs ran at 0.6-0.8x
# the verifier's times on an H200: reports/examples/h200-verifier-regime).
PROBE_POOL = 512
SPIN_US = 8000.0  # the first busy stretch; doubled while the host needs longer than it to issue the calls
SPIN_MAX_US = 256_000.0  # a callable whose calls the host cannot issue within this (it waits on the GPU) is not probed
_perf_counter, _Event = time.perf_counter, torch.cuda.Event  # taken before any candidate code runs
_cycles_per_us: list[float] = []


def cycles_per_us(device: torch.device) -> float:
    """Clock cycles of ``torch.cuda._sleep`` per microsecond on this GPU (measured once per process)."""
    if not _cycles_per_us:
        cycles = 2_000_000
        torch.cuda._sleep(cycles // 10)  # the first launch loads the kernel
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _cycles_per_us.append(cycles / (start.elapsed_time(end) * 1000))
    return _cycles_per_us[0]


def spin(device: torch.device, us: float) -> None:
    """Keep the GPU busy for about ``us`` microseconds (one kernel)."""
    torch.cuda._sleep(max(1, int(us * cycles_per_us(device))))


def round_inputs(inputs: list[tuple], first: int, calls: int) -> list[tuple]:
    """The inputs of one probe round: ``calls`` of ``inputs`` in turn from position ``first`` (cycled)."""
    return [inputs[i % len(inputs)] for i in range(first, first + calls)]


def probe(fn, inputs: list[tuple], device: torch.device, calls: int = PROBE_CALLS,
          rounds: int = PROBE_ROUNDS) -> dict:
    """Host us per call and GPU us per call of ``fn``, measured together.

    Each round: a spin kernel keeps the GPU busy while the host issues ``calls`` calls (wall clock: the host cost,
    with no wait on the GPU in it); the calls then run back to back on the GPU (CUDA events after the spin and after
    the last call: the GPU time per call, launch gaps included). The calls take ``inputs`` in turn, each round going
    on where the last stopped, so a pool larger than one round is used whole. ``calls`` in the result counts every
    call made. A round counts only when the spin outlasted the host's issuing; otherwise the spin doubles and the
    round runs again. Medians over ``rounds``. Off CUDA both are None.
    """
    if device.type != "cuda":
        return {"host_us": None, "gpu_us": None, "ratio": None, "calls": 0,
                "note": "not measured: no CUDA (interpreter)"}
    cycles_per_us(device)  # measured once, before any spin is timed
    for i in range(3):  # compiled and warm before anything is timed
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize(device)
    hosts, gpus, spin_us, tries, issued = [], [], SPIN_US, 0, 3
    while len(hosts) < rounds and tries < rounds + 8:
        tries += 1
        issued += calls
        began_spin, after_spin, done = (_Event(enable_timing=True) for _ in range(3))
        began_spin.record()
        spin(device, spin_us)
        after_spin.record()
        batch = round_inputs(inputs, issued - calls, calls)  # picked before the clock starts
        began = _perf_counter()
        for args in batch:
            fn(*args)
        host = (_perf_counter() - began) * 1e6
        done.record()
        done.synchronize()
        if host >= 0.9 * began_spin.elapsed_time(after_spin) * 1000:  # the GPU may have caught up: not counted
            if spin_us >= SPIN_MAX_US:
                break
            spin_us *= 2
            continue
        hosts.append(host / calls)
        gpus.append(after_spin.elapsed_time(done) * 1000 / calls)
    if not hosts:
        return {"host_us": None, "gpu_us": None, "ratio": None, "calls": issued,
                "note": f"not measured: the host never issued {calls} calls within a {spin_us / 1000:.0f} ms spin "
                        "(it waits on the GPU within a call)"}
    host_us, gpu_us = kh.median(hosts), kh.median(gpus)
    return {"host_us": host_us, "gpu_us": gpu_us, "ratio": gpu_us / host_us, "calls": issued, "note": "measured"}


def verdict(host_us: float | None, gpu_us: float | None, ratio_min: float = STABLE_RATIO,
            unmeasured: str = "not measured: no CUDA (interpreter)") -> tuple[bool | None, str]:
    """(stable, why): stable when the GPU time per call is at least ``ratio_min`` x the host cost per call;
    ``unmeasured`` is the why when either number is missing (the probe's own note)."""
    if host_us is None or gpu_us is None:
        return None, unmeasured
    ratio = gpu_us / host_us
    if ratio >= ratio_min:
        return True, f"device-bound: GPU {gpu_us:.1f} us per call is {ratio:.2f}x the host cost {host_us:.1f} us"
    if gpu_us < host_us:
        return False, (f"host-bound: the GPU time is below the host cost (GPU {gpu_us:.1f} us per call, host "
                       f"{host_us:.1f} us; stable from {ratio_min:.2f}x)")
    return False, (f"near host-bound: GPU {gpu_us:.1f} us per call is only {ratio:.2f}x the host cost "
                   f"{host_us:.1f} us (stable from {ratio_min:.2f}x)")
