"""Family variants on one case in one process: each a solution directory (the family, or a copy of it with one of
variants/*.diff applied) and plan overrides. Each is built, its output checked before and after the timed calls,
timed by do_bench (median, the L2 flushed between calls), and its host cost per call measured with the GPU kept
busy (so the host never waits). The first variant is the reference of the ratios; where it fails, the others print
no ratio.

    python reports/examples/h200-weight-stream/family_variants.py CASE_JSON '[[DIR, OVERRIDES], ...]'

CASE_JSON is a panel case: {"stratum": ..., "m": ..., "k": ..., "n": ..., "epilogue": "silu" or "gelu_tanh",
"seed": ...}.

Run from the repository root on a CUDA GPU; VB_DEV=cpu with TRITON_INTERPRET=1 checks the outputs alone (untimed).
A variant that fails to build or run prints its error and the others go on.
"""
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402

from evals import kernel_harness as kh  # noqa: E402
from evals import stability  # noqa: E402
from evals.loader import load_solution  # noqa: E402


def host_us(op, device, calls=100, rounds=7):
    """Median host time per call over ``rounds`` rounds of ``calls`` calls, each round queued behind a GPU spin."""
    for _ in range(3):
        op()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        stability.spin(device, 15000)
        start = time.perf_counter()
        for _ in range(calls):
            op()
        times.append((time.perf_counter() - start) * 1e6 / calls)
        torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def main():
    device = torch.device(os.environ.get("VB_DEV", "cuda"))
    c = json.loads(sys.argv[1])
    case = kh.Case(c["stratum"], c["m"], c["k"], c["n"], c["epilogue"], c["seed"])
    t = kh.generate(case, "normal", device)
    ref = kh.reference(t.x, t.qweight, t.scales, t.bias, t.residual, case.epilogue)
    timed = device.type == "cuda"
    modules, base = {}, None
    for index, (directory, overrides) in enumerate(json.loads(sys.argv[2])):
        label = f"{case.name} {directory} {json.dumps(overrides)}"
        try:
            family = modules.get(directory) or load_solution(ROOT / directory)
            modules[directory] = family
            plan = family.plan(case.m, case.k, case.n, overrides)
            fn = family.build(t.qweight, t.scales, t.bias, case.epilogue, config=overrides)
            first = kh.check_output(fn(t.x, t.residual), ref, (case.m, case.n))
            us = (1e3 * triton.testing.do_bench(lambda: fn(t.x, t.residual), warmup=50, rep=300,
                                                return_mode="median") if timed else None)
            again = kh.check_output(fn(t.x, t.residual), ref, (case.m, case.n))
            host = host_us(lambda: fn(t.x, t.residual), device) if timed else None
            if index == 0:
                base = us if first.ok and again.ok else None
            ratio = f" ({base / us:.3f}x the first)" if base else ""
            timing = f"{us:.2f} us{ratio} host {host:.1f} us" if timed else "untimed (CPU)"
            print(f"{label}: WS {plan['WS']} split {plan['SPLIT_K']} ok {first.ok and again.ok} {timing}", flush=True)
            if not (first.ok and again.ok):
                print("   ", first, again, flush=True)
        except Exception as exc:  # one variant's failure is its result; the others still run
            print(f"{label}: ERROR {type(exc).__name__}: {str(exc)[-1200:]}", flush=True)
            traceback.print_exc(limit=3)
        fn = None  # its repacked weights (about half the weight's bytes) go before the next build
        if timed:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
