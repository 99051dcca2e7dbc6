"""Per-case table of verifier JSONs: the candidate's host us and GPU us per call, their ratio, the spread of its 11
group times (max/min), the score ("-" where the case failed); then the strata and the verdict. Several files (one
panel, solutions judged in their own calls) print one after another.

    .venv/bin/python reports/examples/h200-host-path/panel_table.py FILE.json ...
"""
import json
import sys
from pathlib import Path


def cell(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(path: Path) -> str:
    report = json.loads(path.read_text())
    lines = [f"{path.name}: {Path(report['solution']).name} on {Path(report['panel']).name}, {report['device']}",
             f"{'case':26s} {'stratum':13s} {'host_us':>8s} {'gpu_us':>8s} {'gpu/host':>8s} {'max/min':>8s} "
             f"{'score':>7s}"]
    for case in report["cases"]:
        role = case.get("roles", {}).get("candidate", {})
        times = role.get("times_us") or []
        host, gpu = role.get("host_us"), role.get("gpu_us")
        lines.append(f"{case['case']['name']:26s} {case['case']['stratum']:13s} {cell(host, '8.2f')} "
                     f"{cell(gpu, '8.2f')} {cell(gpu / host if host and gpu else None, '8.2f')} "
                     f"{cell(max(times) / min(times) if times else None, '8.3f')} {cell(case.get('score'), '7.3f')}")
    strata = ", ".join(f"{name} {cell(score, '.3f')}" for name, score in (report.get("strata") or {}).items())
    lines.append(f"strata: {strata or '-'}; score {cell(report.get('score'), '.3f')}; valid {report.get('valid')}"
                 + ("; partial" if report.get("partial") else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: panel_table.py VERIFIER_JSON ...")
    print("\n\n".join(table(Path(p)) for p in sys.argv[1:]))
