"""Check that each named run recorded every attempt exactly once, as a plain run records one: a vN folder with its
files and verdict, one ledger row, one index line and one commit on the run's branch, iterations 1..n in order,
versions unique and rising, at most one keeper a batch, the run finished with as many attempts as its index holds;
and that a row says its timing was shared exactly where its index line says so. Prints one line per attempt (where
it was timed, whether the GPU was shared, its decision) and exits 1 where a run breaks a rule.

    python3 reports/examples/parallel-one-gpu/check_records.py [--task w4a16] RUN_ID...
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from agent import ledger  # noqa: E402
from agent.config import Task  # noqa: E402
from agent.ledger import ATTEMPT_ROW  # noqa: E402


SHARED = "[timed on a device shared with another worker]"


def check(task: Task, run_id: str) -> list[str]:
    problems: list[str] = []
    entries = [e for e in ledger.index_entries(task) if e["run"] == run_id]
    state_path = ROOT / "workspace" / ".runs" / run_id / "state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    if not entries:
        problems.append("no index line names this run")
    if state.get("status") != "finished":
        problems.append(f"the run's status is {state.get('status')!r}, not finished")
    versions = [e["version"] for e in entries]
    numbers = [int(v[1:]) for v in versions]
    if [e["iteration"] for e in entries] != list(range(1, len(entries) + 1)):
        problems.append(f"iterations {[e['iteration'] for e in entries]} are not 1..{len(entries)}")
    if numbers != sorted(set(numbers)):
        problems.append(f"versions {versions} repeat or fall")
    if state.get("attempts") != len(entries):
        problems.append(f"the run's state says {state.get('attempts')} attempts, the index {len(entries)}")
    rows: dict[str, list[dict]] = {}
    for line in task.ledger_path.read_text().splitlines():
        if ATTEMPT_ROW.match(line):
            row = ledger.parse_row(line, task)
            rows.setdefault(row["version"], []).append(row)
    branch = subprocess.run(["git", "log", "--format=%s", f"runs/{run_id}"], cwd=ROOT, capture_output=True,
                            text=True).stdout.splitlines()
    commits = [s.split(" | ")[0].strip("| ") for s in branch if s.startswith("| v")]
    if sorted(commits) != sorted(versions):
        problems.append(f"the run's branch has commits for {sorted(commits)}, the index {sorted(versions)}")
    batches: dict[tuple, int] = {}
    for entry in entries:
        version, folder = entry["version"], task.versions / entry["version"]
        if not (folder / "verdict.json").is_file() or not ledger.solution_files(folder):
            problems.append(f"{version}: its folder lacks verdict.json or the solution's files")
        found = rows.get(version, [])
        if len(found) != 1:
            problems.append(f"{version}: {len(found)} ledger rows")
        batch = tuple(entry.get("batch") or (entry["iteration"], entry["iteration"]))
        batches[batch] = batches.get(batch, 0) + bool(entry["keep"])
        worker = entry.get("worker") or {}
        decision = found[0]["decision"] if found else "-"
        said = bool(worker.get("shared")) and entry["verdict"].get("correct") is not None
        if found and (SHARED in decision) != said:
            problems.append(f"{version}: the row says shared {SHARED in decision}, the index line {said}")
        print(f"  {version} iteration {entry['iteration']} batch {list(batch)} gpu {worker.get('gpu', '-')!r} "
              f"host {worker.get('host')} shared {worker.get('shared')} eval {entry['eval_s']} s: {decision}")
    problems += [f"batch {list(b)}: {n} keepers" for b, n in batches.items() if n > 1]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default=None, help="the task (default w4a16)")
    parser.add_argument("runs", nargs="+", metavar="RUN_ID")
    args = parser.parse_args()
    task = Task.load(ROOT, args.task)
    failed = False
    for run_id in args.runs:
        print(f"run {run_id}:")
        problems = check(task, run_id)
        print("  every attempt recorded once" if not problems else "\n".join(f"  PROBLEM {p}" for p in problems))
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
