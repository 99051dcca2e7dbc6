"""The colscale task's adapter (evals/task.py lists what an adapter provides): out = x * gain, column by column.

A toy task for the tests and the README's worked example: tiny, fast under the Triton interpreter, and sharing no
term with any other task, so that a test can show the loop and the evaluator serve it through the task seam alone.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import torch

from evals.kernel_harness import CheckResult
from evals.task import Problem

MODES = ("normal", "extreme")
OUTPUT_DTYPE = torch.float32
ULP = 2.0**-23  # fp32's spacing at 1.0


@dataclass(frozen=True)
class Case:
    stratum: str
    m: int
    n: int
    seed: int

    def __post_init__(self) -> None:
        if self.m < 1 or self.n < 1:
            raise ValueError(f"a colscale case needs M >= 1 and N >= 1; got M={self.m} N={self.n}")

    @property
    def name(self) -> str:
        return f"{self.m}x{self.n}"

    @property
    def dims(self) -> dict[str, int]:
        return {"m": self.m, "n": self.n}


def _generator(device, *parts: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(hash(parts) % (2**62))


def generate(case: Case, mode: str = "normal", device="cpu") -> Problem:
    """The gain and one x; "extreme" draws magnitudes near fp32's range ends, whose products stay finite."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    gen = _generator(device, case.seed, MODES.index(mode))
    gain = torch.randn(case.n, generator=gen, device=device)
    if mode == "extreme":
        gain = gain * 2.0 ** torch.randint(-60, 60, (case.n,), generator=gen, device=device).float()
    return Problem({"gain": gain}, make_inputs(case, 1, 100 + MODES.index(mode), device)[0])


def make_inputs(case: Case, count: int, seed: int, device="cpu") -> list[tuple]:
    gen = _generator(device, case.seed, 7, seed)
    return [(torch.randn((case.m, case.n), generator=gen, device=device),) for _ in range(count)]


def reference(weights: dict, inputs: tuple, case: Case) -> torch.Tensor:
    return inputs[0].double() * weights["gain"].double()


def check_output(out, ref: torch.Tensor, case: Case) -> CheckResult:
    if type(out) is not torch.Tensor:
        return CheckResult(False, f"output must be a plain torch.Tensor; got {type(out).__name__}")
    if tuple(out.shape) != output_shape(case) or out.dtype != OUTPUT_DTYPE or not out.is_contiguous():
        return CheckResult(False, f"output must be contiguous fp32 {output_shape(case)}; got {out.dtype} "
                                  f"{tuple(out.shape)}")
    excess = (out.double() - ref).abs() / (2 * ULP * ref.abs() + 1e-38)
    bad = int((excess > 1).sum())
    worst = float(excess.max()) if excess.numel() else 0.0
    if bad:
        return CheckResult(False, f"{bad} elements beyond 2 ulp of x * gain", bad, worst)
    return CheckResult(True, "ok", 0, worst)


def output_shape(case: Case) -> tuple[int, int]:
    return (case.m, case.n)


def bytes_moved(case: Case) -> int:
    return 4 * (2 * case.m * case.n + case.n)


def baseline(weights: dict, case: Case):
    gain = weights["gain"]
    return lambda x: torch.mul(x, gain)


def make_panel(seed: int, per_stratum: int, strata: dict[str, dict], visible: list[Case]) -> dict:
    """Cases of each stratum's N range (up to 8192), disjoint from the visible ones."""
    rng = random.Random(seed)
    taken = {(c.m, c.n) for c in visible}
    cases = []
    for stratum, ranges in strata.items():
        low, high = ranges["n"][0], ranges["n"][1] or 8192
        while sum(c["stratum"] == stratum for c in cases) < per_stratum:
            m, n = rng.randint(1, 16), rng.randint(low, high)
            if (m, n) not in taken:
                taken.add((m, n))
                cases.append(asdict(Case(stratum, m, n, rng.randrange(10_000, 2**31))))
    return {"note": f"sealed panel drawn with seed {seed}; never give it to the agent", "cases": cases}
