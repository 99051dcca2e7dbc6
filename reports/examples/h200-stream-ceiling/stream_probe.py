"""What a 117 MB case's call costs against the stream that feeds it, in one process: family variants (a solution
directory and plan overrides; the ablations of variants/stream-ablations.diff compute a wrong output on purpose, and
say so), then a torch copy of the case's words and a plain-load read of them (reports/examples/h200-weight-stream's
read_ceiling.py kernel on two grids). Each is timed as a burst (after 2 s idle, 8 warm-up calls, then one group of
256 timed) and eager (4,096 untimed calls, then 11 groups of 512: make bench's loop with half its untimed calls), then
a second of back-to-back calls with the board's power (evals/power.py). Everything takes turns over two rounds; the
summary takes each time's larger round.

    python reports/examples/h200-stream-ceiling/stream_probe.py CASE_JSON '[[DIR, OVERRIDES], ...]'

Run from the repository root on a CUDA GPU.
"""
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "reports" / "examples" / "h200-weight-stream"))

import torch  # noqa: E402

from evals import kernel_harness as kh  # noqa: E402
from evals import power  # noqa: E402
from evals.loader import load_solution  # noqa: E402

ROUNDS = 2
IDLE_S = 2.0


def baselines(t):
    from read_ceiling import read_blocks
    words = t.qweight.view(-1)
    src = t.qweight.view(torch.uint8)
    dst = torch.empty_like(src)
    out = []

    def copy(x, r):
        dst.copy_(src)
        return dst
    out.append(["torch copy of the words (read + write)", copy])
    block = 1024
    blocks = words.numel() // block
    for programs, warps, unroll in [(896, 8, 4), (1792, 4, 4)]:
        per = blocks // programs
        if per * programs != blocks or per % unroll:
            continue
        o = torch.empty(programs * block, dtype=torch.int32, device=words.device)

        def read(x, r, programs=programs, per=per, warps=warps, unroll=unroll, o=o):
            read_blocks[(programs,)](words, o, per, BLOCK=block, UNROLL=unroll, num_warps=warps)
            return o
        out.append([f"plain-load read {programs}x{warps}w unroll {unroll}", read])
    return out


def main():
    device = torch.device("cuda")
    c = json.loads(sys.argv[1])
    case = kh.Case(c["stratum"], c["m"], c["k"], c["n"], c["epilogue"], c["seed"])
    t = kh.generate(case, "normal", device)
    ref = kh.reference(t.x, t.qweight, t.scales, t.bias, t.residual, case.epilogue)
    inputs = kh.make_inputs(case, 16, seed=5, device=device)
    words_bytes = t.qweight.numel() * 4
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
                  f"{plan['SPLIT_K']} stages {plan['WS_STAGES']} correct {ok}", flush=True)
            variants.append([label, fn, ok, []])
        except Exception as exc:
            print(f"{case.name} {label}: ERROR {type(exc).__name__}: {str(exc)[-1200:]}", flush=True)
            traceback.print_exc(limit=3)
    for label, fn in baselines(t):
        variants.append([label, fn, None, []])
    for round_ in range(ROUNDS):
        for label, fn, ok, results in variants:
            torch.cuda.synchronize()
            time.sleep(IDLE_S)
            burst = kh.median(kh.time_groups(fn, inputs, 1, 256, warmup=8))
            eager = kh.time_groups(fn, inputs, 11, 512, warmup=4096)
            p = power.probe(fn, inputs, device, kh.median(eager))
            results.append({"burst_us": burst, "eager_us": kh.median(eager), "spread": max(eager) / min(eager),
                            "power": p})
            print(f"  round {round_} {label}: burst {burst:.2f} us, eager {kh.median(eager):.2f} us "
                  f"(max/min {max(eager) / min(eager):.3f}); {power.describe(p) or power.numbers(p)}", flush=True)
    print(f"{case.name}: the larger of {ROUNDS} rounds; GB/s of the words ({words_bytes / 1e6:.1f} MB) read")
    for label, fn, ok, results in variants:
        row = {key: max(r[key] for r in results) for key in ("burst_us", "eager_us")}
        measured = [r["power"]["energy_mj"] for r in results if r["power"].get("note") == "measured"]
        energy = f"{max(measured):.2f} mJ" if measured else results[0]["power"]["note"]
        print(f"  {label}: burst {row['burst_us']:.2f} us ({words_bytes / row['burst_us'] / 1e3:.0f} GB/s), eager "
              f"{row['eager_us']:.2f} us ({words_bytes / row['eager_us'] / 1e3:.0f} GB/s), {energy}, correct {ok}",
              flush=True)


if __name__ == "__main__":
    main()
