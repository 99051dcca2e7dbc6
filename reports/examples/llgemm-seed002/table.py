"""Seed 002's table beside ours: rows (N, K), columns M, each cell ours (the lower of the hot and the L2-flushed
speedup over F.linear, both paired in one process) and the seed's (its hot-replay speedup; "fallback" where it kept
F.linear), the qualified wins (>= 1.03 in both regimes), and the geometric means over the 50 points and per M
(the seed's fallbacks count as 1.0; ours count as measured, and once more the seed's way: a qualified point at its
hot speedup, the others at 1.0).

    python reports/examples/llgemm-seed002/table.py SELFCHECK.json [--ledger tasks/llgemm/experiment_log.md --run ID]

SELFCHECK.json: `python -m evals.selfcheck --task llgemm --json ...` of the version to show, on the visible panel, on
an H200.
"""
import argparse
import json
import math
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUALIFIED = 1.03  # seed 002 kept a plan only when it won by about 3% in both regimes


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("selfcheck")
    parser.add_argument("--ledger", help="the task's ledger, to count a run's attempts and its kept versions")
    parser.add_argument("--run", action="append", default=[], help="run id(s) whose rows to count")
    args = parser.parse_args()
    seed = json.loads((HERE / "seed002_table.json").read_text())
    report = json.loads(Path(args.selfcheck).read_text())
    ours = {}
    for case in report["cases"]:
        c = case["case"]
        hot, flushed = (case.get("hot") or {}).get("ratio"), (case.get("flushed") or {}).get("ratio")
        ours[(c["m"], c["n"], c["k"])] = (case.get("speedup"), hot, flushed, case.get("correct"))
    ms = seed["m"]
    lines = ["| (N, K) | " + " | ".join(f"M={m}: ours / seed" for m in ms) + " |",
             "|---|" + "---|" * len(ms)]
    all_ours, all_seed, as_seed = [], [], []
    per_m = {m: ([], [], []) for m in ms}  # ours as the task scores, ours the seed's way, the seed's
    wins_ours = wins_seed = 0
    for row in seed["rows"]:
        cells = []
        for m, theirs in zip(ms, row["speedups"]):
            speedup, hot, flushed, correct = ours.get((m, row["n"], row["k"]), (None, None, None, None))
            mine = "-" if speedup is None else f"{speedup:.3f}{'*' if speedup >= QUALIFIED else ''}"
            if hot is not None:
                mine += f" (hot {hot:.2f}, fl {flushed:.2f})"
            cells.append(f"{mine} / {'fallback' if theirs is None else f'{theirs:.3f}'}")
            if speedup is not None:
                # the seed's way: a qualified point at its hot speedup, every other point at F.linear's 1.0
                as_seed.append(hot if speedup >= QUALIFIED and hot else 1.0)
                all_ours.append(speedup)
                per_m[m][0].append(speedup)
                per_m[m][1].append(as_seed[-1])
                wins_ours += speedup >= QUALIFIED
            all_seed.append(theirs or 1.0)
            per_m[m][2].append(theirs or 1.0)
            wins_seed += theirs is not None
        lines.append(f"| ({row['n']}, {row['k']}) | " + " | ".join(cells) + " |")
    device = report.get("device") or "an unnamed device"
    print(f"ours: {args.selfcheck}, measured on {device}; the seed's: an H200 SXM"
          + ("" if "H200" in device else " (ours is another GPU model: the two columns do not compare)") + "\n")
    print("\n".join(lines))
    print(f"\n* qualified: >= {QUALIFIED} in both regimes (ours is the lower of the two).")
    print(f"qualified wins: ours {wins_ours} of {len(all_ours)}, seed {wins_seed} of {len(all_seed)}")
    if len(all_ours) == len(all_seed):
        print(f"geomean over the {len(all_ours)} points: ours {geomean(all_ours):.3f} (each the lower of its two "
              f"speedups, as the task scores), seed {geomean(all_seed):.3f}")
        print(f"  counted the seed's way (a qualified point at its hot speedup, the others at 1.0): ours "
              f"{geomean(as_seed):.3f}")
    for m in ms:
        mine, mine_as_seed, theirs = per_m[m]
        if mine:
            print(f"  M={m:<2}: ours {geomean(mine):.3f} ({geomean(mine_as_seed):.3f} the seed's way), "
                  f"seed {geomean(theirs):.3f}")
    if args.ledger and args.run:
        rows = [line for line in Path(args.ledger).read_text().splitlines()
                if re.match(r"^\| v\d+ \|", line) and any(f"| {run} |" in line for run in args.run)]
        kept = sum("| keep" in line for line in rows)
        print(f"loop: {len(rows)} attempts in run(s) {', '.join(args.run)}, {kept} kept")


if __name__ == "__main__":
    main()
