"""Where make bench's eager time and the verifier's schedule part: main on a panel's cases, in one process.

    python reports/examples/h200-power/gap.py PANEL [CASE_NAME ...]    (from the repository root, on a CUDA GPU)

Each row: the median microseconds per call over 11 groups of 512 (CUDA events), with the groups' max/min; the rows
differ in one thing each (inputs cycled, outputs kept, primed outputs, the heater, the verifier's schedule run
unpinned, v0 run first), then the host cost and back-to-back GPU time (stability.probe) and 60 groups from an idle
GPU. The results also go to $OUT/logs/gap.json (OUT unset: /tmp/logs/gap.json).
"""
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from evals import gates, residency, stability  # noqa: E402
from evals import kernel_harness as kh  # noqa: E402
from evals.gate_spies import heat  # noqa: E402
from evals.loader import load_solution  # noqa: E402

dev = torch.device("cuda")
main = load_solution(ROOT / "methods" / "main").build
v0 = load_solution(ROOT / "methods" / "versions" / "v0").build
out = {}


def row(name, times, extra=""):
    med = kh.median(times)
    print(f"  {name:<52} {med:8.2f} us  max/min {max(times) / min(times):.3f}  {extra}", flush=True)
    return {"median": med, "times": times}


for case in kh.load_panel(sys.argv[1]):
    if len(sys.argv) > 2 and case.name not in sys.argv[2:]:
        continue
    print(case.name, flush=True)
    w = kh.generate(case, "normal", dev)
    fn = main(w.qweight, w.scales, w.bias, case.epilogue)
    in16 = kh.make_inputs(case, 16, seed=5, device=dev)
    in512 = kh.make_inputs(case, 512, seed=5, device=dev)
    r = out[case.name] = {}

    def T(inputs, warm=8192, keep=None, fn=fn):
        return kh.time_groups(fn, inputs, 11, 512, warmup=warm, keep=keep)

    r["bench16"] = row("bench: 16 inputs, 8192 untimed", T(in16))
    r["bench16b"] = row("the same again", T(in16))
    r["pool512"] = row("512 inputs", T(in512))
    keep = []
    r["pool512keep"] = row("512 inputs, outputs kept", T(in512, keep=keep))
    del keep
    keep = []
    r["in16keep"] = row("16 inputs, outputs kept", T(in16, keep=keep))
    del keep
    residency.settle(dev)
    primed = [fn(*in512[i % 512]) for i in range(16384)]
    del primed
    r["primed"] = row("16384 outputs primed and released, 16 inputs", T(in16))
    r["primed512keep"] = row("  then 512 inputs, outputs kept", T(in512, keep=[]))
    residency.settle(dev)
    heat(4096, 1032, dev)
    r["heat"] = row("after the heater, 16 inputs, 512 untimed", T(in16, warm=512))
    heat(4096, 1032, dev)
    r["heat8192"] = row("after the heater, 16 inputs, 8192 untimed", T(in16))
    keep = []
    r["spec"] = row("gates.run_schedule spec-unpinned, kept", gates.run_schedule(
        fn, in512, gates.SCHEDULES["spec-unpinned"], dev, keep=keep))
    del keep
    r["bench16c"] = row("bench 16 inputs once more", T(in16))
    f0 = v0(w.qweight, w.scales, w.bias, case.epilogue)
    kh.time_groups(f0, in16, 11, 512, warmup=8192)
    r["after_v0"] = row("after v0's eager rows (as make bench), 16 inputs", T(in16))
    p = stability.probe(fn, in512, dev)
    print(f"  probe 512: host {p['host_us']:.2f} gpu {p['gpu_us']:.2f}", flush=True)
    p16 = stability.probe(fn, in16, dev)
    print(f"  probe 16: host {p16['host_us']:.2f} gpu {p16['gpu_us']:.2f}", flush=True)
    r["probe512"], r["probe16"] = p, p16
    # a long run: does a group's time drift as the stream goes on?
    trend = kh.time_groups(fn, in16, 60, 512, warmup=0)
    print("  60 groups from cold: " + " ".join(f"{t:.1f}" for t in trend), flush=True)
    r["trend"] = trend
    del fn, f0, w, in16, in512
    residency.settle(dev)
logs = Path(os.environ.get("OUT", "/tmp")) / "logs"
logs.mkdir(parents=True, exist_ok=True)
(logs / "gap.json").write_text(json.dumps(out, indent=1))
