"""Whether a callable's eager time is set by the board's power limit: energy per call, power and SM clock.

A kernel that streams its weights at full HBM bandwidth, dequantizes and runs tensor-core work on every byte can draw
the board's whole power limit under a sustained eager loop (an H200: 700 W). The driver then lowers the SM clock
(clock-event reason "SW power cap") and every call takes longer than it does in a short burst from a cool start, while
the memory clock stays where it was. On an H200 main's 117 MB cases ran 43-46 us a call for the first 512 calls and
49-56 us once the board sat at its limit, SM clock mostly 1,400-1,800 MHz of 1,980 (reports/examples/h200-power). Such a
time is near the power bound, not the bandwidth bound: what moves it is the energy a call's work takes (fewer
instructions, fewer bytes through L2 and shared memory per weight byte), which shows as a higher SM clock at the same
power. Under the cap the energy per call mostly tracks the time per call (the board's limit times the call's time).

``probe`` runs the callable back to back for at least ``min_ms`` of GPU time, reading the board's energy counter
before and after (NVML, through ctypes: no Python package needed) and its SM clock and clock-event reasons while the
GPU is busy. A pass is power-capped by its clock-event reasons (the SW power cap, or the HW power brake), not by its
watts: the energy counter's mean over a one-second pass spreads by about 10% (one plan: 648 and 716 W in two passes,
both capped), so it can read past the limit with no cap active (v0's 117 MB case on an H200: 715 W, SM clock
1,980 MHz) or under it with the cap held.
Without NVML (no NVIDIA driver, as on the CPU machines) it says so and measures nothing.
"""
from __future__ import annotations

import ctypes
import math
import time

import torch

from evals import kernel_harness as kh

# nvmlClocksEventReasons bits (nvml.h)
REASONS = {0x1: "GPU idle", 0x2: "applications clocks setting", 0x4: "SW power cap", 0x8: "HW slowdown",
           0x10: "sync boost", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
           0x80: "HW power brake slowdown", 0x100: "display clock setting"}
POWER_BITS = 0x4 | 0x80
THERMAL_BITS = 0x20 | 0x40
CAPPED_SHARE = 0.5  # a pass with the power cap active in at least this share of its samples is power-capped
MIN_MS = 1000.0  # GPU time a probe covers: the energy counter then moves by hundreds of joules at full power
_NVML_CLOCK_SM = 1
_perf_counter = time.perf_counter
_nvml: list = []  # [library] once loaded, [None, why] once it failed


class PowerUnavailable(RuntimeError):
    """No NVML on this machine, or it does not know the device (the message says which)."""


def _library():
    if not _nvml:
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            code = lib.nvmlInit_v2()
            _nvml.extend([lib] if code == 0 else [None, f"nvmlInit_v2 returned {code}"])
        except OSError as exc:
            _nvml.extend([None, f"libnvidia-ml.so.1 not loadable ({exc})"])
    if _nvml[0] is None:
        raise PowerUnavailable(_nvml[1])
    return _nvml[0]


class Meter:
    """One GPU's energy counter, power limit, SM clock and clock-event reasons, read through NVML."""

    def __init__(self, device: torch.device):
        lib = self.lib = _library()
        props = torch.cuda.get_device_properties(device)
        self.handle = ctypes.c_void_p()
        uuid = getattr(props, "uuid", None)
        code = -1 if uuid is None else lib.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}".encode(), ctypes.byref(self.handle))
        pci = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
        if code != 0 and None not in pci:  # the same GPU by its PCI address
            bus = "{:08x}:{:02x}:{:02x}.0".format(*pci).encode()
            code = lib.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(self.handle))
        if code != 0:
            raise PowerUnavailable(f"NVML does not know CUDA device {device} (uuid {uuid}, PCI {pci}; error {code})")
        self._reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            lib.nvmlDeviceGetCurrentClocksThrottleReasons
        self.limit_w = self._uint(lib.nvmlDeviceGetEnforcedPowerLimit) / 1000
        self.max_sm_mhz = self._uint(lib.nvmlDeviceGetMaxClockInfo, _NVML_CLOCK_SM)
        self.energy_mj()  # fails here, not inside a timed pass, where the board has no energy counter

    def _uint(self, function, *args) -> int:
        value = ctypes.c_uint()
        code = function(self.handle, *args, ctypes.byref(value))
        if code != 0:
            raise PowerUnavailable(f"NVML {function.__name__} returned {code}")
        return value.value

    def energy_mj(self) -> int:
        """The board's energy counter (mJ since the driver loaded)."""
        value = ctypes.c_ulonglong()
        code = self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(value))
        if code != 0:
            raise PowerUnavailable(f"NVML nvmlDeviceGetTotalEnergyConsumption returned {code}")
        return value.value

    def sample(self) -> tuple[int, int]:
        """(SM clock MHz, clock-event reasons bitmask) now."""
        reasons = ctypes.c_ulonglong()
        code = self._reasons(self.handle, ctypes.byref(reasons))
        if code != 0:  # an unread bitmask would read as "no cap"
            raise PowerUnavailable(f"NVML {self._reasons.__name__} returned {code}")
        return self._uint(self.lib.nvmlDeviceGetClockInfo, _NVML_CLOCK_SM), reasons.value


_meters: dict = {}


def meter(device: torch.device) -> Meter:
    """The device's Meter (opened once per process); PowerUnavailable says why there is none."""
    device = torch.device(device)
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _meters:
        _meters[key] = Meter(device)
    return _meters[key]


def probe(fn, inputs: list[tuple], device: torch.device, per_call_us: float, min_ms: float = MIN_MS) -> dict:
    """Energy per call, mean board power and SM clock of ``fn`` run back to back for about ``min_ms`` of GPU time.

    ``per_call_us`` (the eager time just measured) sizes the pass. The energy counter is read with the GPU idle
    before and after, so the energy per call includes the board's idle power, as any real call pays it. The SM clock
    and the clock-event reasons are sampled about 40 times, each right after a batch of calls is issued (the GPU busy).
    """
    if torch.device(device).type != "cuda":
        return {"note": "not measured: no CUDA device"}
    try:
        m = meter(device)
    except PowerUnavailable as exc:
        return {"note": f"not measured: {exc}"}
    calls = max(64, math.ceil(min_ms * 1000 / max(per_call_us, 1.0)))
    batch = max(16, calls // 40)
    kh.synchronize(device)
    samples, issued = [], 0
    try:
        e0, t0 = m.energy_mj(), _perf_counter()
        while issued < calls:
            for _ in range(batch):
                fn(*inputs[issued % len(inputs)])
                issued += 1
            samples.append(m.sample())
        kh.synchronize(device)
        e1, t1 = m.energy_mj(), _perf_counter()
    except PowerUnavailable as exc:  # the board's counters, not the callable: the pass measured nothing
        kh.synchronize(device)
        return {"note": f"not measured: {exc}"}
    capped = sum(1 for _, r in samples if r & POWER_BITS) / len(samples)
    thermal = sum(1 for _, r in samples if r & THERMAL_BITS) / len(samples)
    seen = 0
    for _, r in samples:
        seen |= r
    return {"energy_mj": (e1 - e0) / issued, "power_w": (e1 - e0) / 1000 / (t1 - t0), "limit_w": m.limit_w,
            "sm_mhz": kh.median([float(c) for c, _ in samples]), "max_sm_mhz": m.max_sm_mhz,
            "capped": capped, "thermal": thermal,
            "reasons": [name for bit, name in REASONS.items() if seen & bit], "calls": issued,
            "note": "measured"}


def numbers(p: dict) -> str:
    """A probe's numbers in words, or its note where it measured nothing."""
    if p.get("note") != "measured":
        return p.get("note", "not measured")
    return (f"{p['power_w']:.0f} W of a {p['limit_w']:.0f} W limit, SM clock {p['sm_mhz']:.0f} of "
            f"{p['max_sm_mhz']} MHz, {p['energy_mj']:.2f} mJ a call")


def describe(p: dict | None) -> str | None:
    """A power-capped (or thermally slowed) pass in words, with its numbers; None for a pass that was neither or
    was not measured."""
    if not p or p.get("note") != "measured":
        return None
    if p["capped"] >= CAPPED_SHARE:
        return f"power-capped (power cap or brake active in {100 * p['capped']:.0f}% of samples): {numbers(p)}"
    if p["thermal"] >= CAPPED_SHARE:
        return f"thermally slowed ({100 * p['thermal']:.0f}% of samples): {numbers(p)}"
    return None
