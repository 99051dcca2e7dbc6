"""How uncertain is a graph-paired selfcheck's score? The keep rule's own bootstrap (agent.evaluate.bootstrap_scores:
each case's paired replays redrawn, every case's speedup and the task's score recomputed), its percentiles, and the
noise the keep rule holds a candidate to. With ``--best``, the best's own selfcheck report: the comparison as the
keep rule now makes it, each case's speedup the one the task's score would see (agent.evaluate.implied).

    .venv/bin/python reports/examples/llgemm-seed002/score_bootstrap.py merge_v97_versus_v71.json [--draws 2000]
        [--best loop_v71_selfcheck.json]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: agent/

from agent.evaluate import NOISE_FLOOR, bootstrap_scores, compare  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("reports", nargs="+", help="selfcheck JSON reports of a graph-paired task")
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--best", help="the best's selfcheck report (its ratios over the yardstick)")
    args = parser.parse_args()
    if args.best and not Path(args.best).is_file():
        sys.exit(f"--best {args.best}: no such file (the best's selfcheck JSON report)")
    best = json.loads(Path(args.best).read_text()) if args.best else None
    for path in args.reports:
        report = json.loads(Path(path).read_text())
        scores = bootstrap_scores(report["cases"], args.draws)
        if scores is None:
            sys.exit(f"{path}: not every case has its hot and flushed paired series")
        low, mid, high = (scores[int(q * args.draws)] for q in (0.05, 0.5, 0.95))
        verdict = compare(report)
        print(f"{path}: score {report['score']:.4f}; resampled 5% {low:.4f}, 50% {mid:.4f}, 95% {high:.4f}; "
              f"the keep rule's noise {verdict['noise']:.4f} (floor {NOISE_FLOOR}): "
              f"{'keep' if verdict['keep'] else 'revert'}")
        if best is not None:
            judged = compare(report, best)
            if "implied" not in judged.get("compare_note", ""):
                sys.exit(f"{args.best}: it lacks a case of {path} or a regime's ratio")
            print(f"  against the best's own ratios ({args.best}): {judged['speedup_over_best']:.4f}, noise "
                  f"{judged['noise']:.4f}: {'keep' if judged['keep'] else 'revert'}")


if __name__ == "__main__":
    main()
