"""How uncertain is a graph-paired selfcheck's score? Resample each case's paired replays (the same pair indices for
candidate and yardstick, hot and flushed apart), recompute every case's speedup (min of the two regimes' median
ratios) and the task's score (geomean per stratum, harmonic mean across strata), and print its percentiles.

    .venv/bin/python reports/examples/llgemm-seed002/score_bootstrap.py merge_v97_versus_v71.json [--draws 2000]
"""
import argparse
import json

import numpy as np


def scores(report: dict, draws: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logs: dict[str, list[np.ndarray]] = {}
    for case in report["cases"]:
        ratios = []
        for regime in ("hot", "flushed"):
            a = np.array(case[regime]["candidate_times_us"])
            b = np.array(case[regime]["baseline_times_us"])
            pick = rng.integers(0, len(a), size=(draws, len(a)))
            ratios.append(np.median(b[pick], axis=1) / np.median(a[pick], axis=1))
        logs.setdefault(case["case"]["stratum"], []).append(np.log(np.minimum(*ratios)))
    strata = [np.exp(np.mean(v, axis=0)) for v in logs.values()]
    return len(strata) / sum(1 / s for s in strata)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("reports", nargs="+", help="selfcheck JSON reports of a graph-paired task")
    parser.add_argument("--draws", type=int, default=2000)
    args = parser.parse_args()
    for path in args.reports:
        report = json.load(open(path))
        spreads = sorted(c["spread"] for c in report["cases"])
        low, mid, high = np.quantile(scores(report, args.draws), [0.05, 0.5, 0.95])
        print(f"{path}: score {report['score']:.4f}; resampled 5% {low:.4f}, 50% {mid:.4f}, 95% {high:.4f}; "
              f"median case spread (the keep rule's noise) {spreads[len(spreads) // 2]:.3f}")


if __name__ == "__main__":
    main()
