"""Per-case table of verifier JSONs: the candidate's host us and GPU us per call, their ratio, the spread of its 11
group times (max/min), the score; then the strata and the verdict. Several files (one panel, solutions judged in
their own calls) print one after another.

    .venv/bin/python reports/examples/h200-host-path/panel_table.py verifier-sealed-9311-v104.json ...
"""
import json
import sys
from pathlib import Path


def table(path: Path) -> str:
    report = json.loads(path.read_text())
    lines = [f"{path.name}: {Path(report['solution']).name} on {Path(report['panel']).name}, {report['device']}",
             f"{'case':26s} {'stratum':13s} {'host_us':>8s} {'gpu_us':>8s} {'gpu/host':>8s} {'max/min':>8s} "
             f"{'score':>7s}"]
    for case in report["cases"]:
        role = case["roles"]["candidate"]
        times = role.get("times_us") or []
        spread = max(times) / min(times) if times else float("nan")
        host, gpu = role.get("host_us"), role.get("gpu_us")
        ratio = gpu / host if host and gpu else float("nan")
        lines.append(f"{case['case']['name']:26s} {case['case']['stratum']:13s} {host or float('nan'):8.2f} "
                     f"{gpu or float('nan'):8.2f} {ratio:8.2f} {spread:8.3f} {case['score'] or 0:7.3f}")
    strata = ", ".join(f"{name} {score:.3f}" for name, score in report["strata"].items())
    lines.append(f"strata: {strata}; score {report['score']:.3f}; valid {report['valid']}")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: panel_table.py VERIFIER_JSON ...")
    print("\n\n".join(table(Path(p)) for p in sys.argv[1:]))
