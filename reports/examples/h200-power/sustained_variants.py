"""Family variants on one case in one process, timed as a burst from a cool board and under a sustained eager loop,
with the board's power, SM clock and energy per call (evals/power.py). Each variant is built and its output checked
before and after its timed calls; the variants then take turns over ``ROUNDS`` rounds, so that a drift of the board's
state lands on all of them.

    python reports/examples/h200-power/sustained_variants.py CASE_JSON '[[DIR, OVERRIDES], ...]'

Per variant and round:
- burst: after 2 s with the GPU idle, one group of 256 calls timed with CUDA events, before the board's power draw
  has risen to its limit;
- eager: then 4,096 untimed calls and 11 groups of 512 (make bench's eager loop with half its untimed calls, 16 inputs
  cycled), the median;
- power: a second more of back-to-back calls with the board's energy counter read before and after (power.probe).
The first variant is the reference of the ratios. Run from the repository root on a CUDA GPU.
"""
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from evals import kernel_harness as kh  # noqa: E402
from evals import power  # noqa: E402
from evals.loader import load_solution  # noqa: E402

ROUNDS = 2
IDLE_S = 2.0


def main():
    device = torch.device("cuda")
    c = json.loads(sys.argv[1])
    case = kh.Case(c["stratum"], c["m"], c["k"], c["n"], c["epilogue"], c["seed"])
    t = kh.generate(case, "normal", device)
    ref = kh.reference(t.x, t.qweight, t.scales, t.bias, t.residual, case.epilogue)
    inputs = kh.make_inputs(case, 16, seed=5, device=device)
    modules, variants = {}, []
    for directory, overrides in json.loads(sys.argv[2]):
        label = f"{directory} {json.dumps(overrides)}"
        try:
            family = modules.get(directory) or load_solution(ROOT / directory)
            modules[directory] = family
            plan = family.plan(case.m, case.k, case.n, overrides)
            fn = family.build(t.qweight, t.scales, t.bias, case.epilogue, config=overrides)
            ok = kh.check_output(fn(t.x, t.residual), ref, (case.m, case.n)).ok
            print(f"{case.name} {label}: WS {plan['WS']} BLOCK_SIZE_N {plan['BLOCK_SIZE_N']} split "
                  f"{plan['SPLIT_K']} correct {ok}", flush=True)
            variants.append([label, fn, ok, []])
        except Exception as exc:  # one variant's failure is its result; the others still run
            print(f"{case.name} {label}: ERROR {type(exc).__name__}: {str(exc)[-1200:]}", flush=True)
            traceback.print_exc(limit=3)
    for round_ in range(ROUNDS):
        for label, fn, ok, results in variants:
            if not ok:
                continue
            torch.cuda.synchronize()
            time.sleep(IDLE_S)
            burst = kh.median(kh.time_groups(fn, inputs, 1, 256, warmup=8))
            eager = kh.time_groups(fn, inputs, 11, 512, warmup=4096)
            p = power.probe(fn, inputs, device, kh.median(eager))
            results.append({"burst_us": burst, "eager_us": kh.median(eager),
                            "spread": max(eager) / min(eager), "power": p})
            print(f"  round {round_} {label}: burst {burst:.2f} us, eager {kh.median(eager):.2f} us "
                  f"(max/min {max(eager) / min(eager):.3f}); {power.describe(p) or power.numbers(p)}", flush=True)
    base = variants[0][3] if variants and variants[0][2] else None
    print(f"{case.name}: medians over the rounds (of two, the larger)"
          + (" (ratios: the first variant's time over this one's)" if base else ""))
    for label, fn, ok, results in variants:
        if not results:
            print(f"  {label}: not timed (incorrect output)" if not ok else f"  {label}: no result")
            continue
        row = {key: kh.median([r[key] for r in results]) for key in ("burst_us", "eager_us")}
        measured = [r["power"]["energy_mj"] for r in results if r["power"].get("note") == "measured"]
        energy = f"{kh.median(measured):.2f} mJ a call" if measured else results[0]["power"]["note"]
        again = kh.check_output(fn(t.x, t.residual), ref, (case.m, case.n)).ok
        ratio = ""
        if base:
            b = {key: kh.median([r[key] for r in base]) for key in ("burst_us", "eager_us")}
            ratio = f" ({b['burst_us'] / row['burst_us']:.3f}x, {b['eager_us'] / row['eager_us']:.3f}x)"
        print(f"  {label}: burst {row['burst_us']:.2f} us, eager {row['eager_us']:.2f} us{ratio}, {energy}, "
              f"correct after {again}", flush=True)


if __name__ == "__main__":
    main()
