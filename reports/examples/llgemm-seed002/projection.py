"""What the tables could reach with plans already measured: for each visible point, the best of a selfcheck's own
speedup and every plan a sweep measured there (the smaller of its hot and flushed ratios to F.linear, each timed in
its own process), then the counts and geomeans table.py prints. An upper estimate: the best of many noisy plans reads
high. Usage: python3 projection.py SELFCHECK.json [SWEEP.jsonl ...] (default: every sweep_*.jsonl here)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from table import HERE, QUALIFIED, geomean  # this folder's side-by-side table: the same qualification and means


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    report = json.loads(Path(sys.argv[1]).read_text())
    sweeps = [Path(p) for p in sys.argv[2:]] or sorted(HERE.glob("sweep_*.jsonl"))
    best = {}  # (m, n, k) -> (speedup, hot ratio, where)
    for case in report["cases"]:
        c = case["case"]
        best[(c["m"], c["n"], c["k"])] = (case["speedup"], case["hot"]["ratio"], "selfcheck")
    for sweep in sweeps:
        for line in sweep.read_text().splitlines():
            entry = json.loads(line)
            shape = tuple(entry.get("shape", ()))
            if entry.get("ok") and shape in best and entry["r"] > best[shape][0]:
                best[shape] = (entry["r"], entry["r_hot"], f"{sweep.name}: {entry['plan']}")
    seed = json.loads((HERE / "seed002_table.json").read_text())
    theirs = {(m, row["n"], row["k"]): v for row in seed["rows"] for m, v in zip(seed["m"], row["speedups"])}
    print(f"the best measured plan of each point: {sys.argv[1]} and {len(sweeps)} sweep(s), on "
          f"{report.get('device') or 'an unnamed device'} (the seed's: an H200 SXM)")
    wins = sum(v[0] >= QUALIFIED for v in best.values())
    print(f"qualified wins: {wins} of {len(best)} (seed {sum(v is not None for v in theirs.values())})")
    print(f"geomean: {geomean([v[0] for v in best.values()]):.3f} as the task scores, "
          f"{geomean([v[1] if v[0] >= QUALIFIED else 1.0 for v in best.values()]):.3f} the seed's way (seed 1.368)")
    for m in seed["m"]:
        mine = [v[1] if v[0] >= QUALIFIED else 1.0 for k, v in best.items() if k[0] == m]
        seeds = [v or 1.0 for k, v in theirs.items() if k[0] == m]
        print(f"  M={m:<2}: {geomean(mine):.3f}, seed {geomean(seeds):.3f}")
    for shape, (speedup, _, where) in sorted(best.items()):
        if (theirs.get(shape) or 0) >= QUALIFIED and speedup < QUALIFIED:
            print(f"  the seed wins, no plan of ours does: {shape} best {speedup:.3f} ({where}), seed {theirs[shape]}")
    moved = {k: v[2] for k, v in best.items() if v[2] != "selfcheck"}
    print(f"points whose best plan is a sweep's, not the selfcheck's: {len(moved)}")
    for shape, where in sorted(moved.items()):
        print(f"  {shape}: {best[shape][0]:.3f} {where}")


if __name__ == "__main__":
    main()
