"""The project's own records agree: a run's records brought back from another machine (the ledger, the snapshots and
the index) must arrive whole, or a later run would not see those attempts."""
from __future__ import annotations

from collections import Counter

from agent import ledger
from agent.config import Task
from tests.conftest import ROOT


def test_every_snapshot_has_one_ledger_row_and_one_index_line():
    task = Task.load(ROOT)
    snapshots = {p.name for p in task.versions.iterdir() if p.is_dir() and p.name[1:].isdigit()}
    rows = Counter(ledger.parse_row(line, task)["version"] for line in ledger.rows(task))
    lines = Counter(entry["version"] for entry in ledger.index_entries(task))
    baseline = task.baseline_version  # written by hand: a row and a snapshot, no evaluation and so no index line
    assert set(rows) == snapshots and max(rows.values()) == 1, "ledger rows and snapshots differ"
    assert set(lines) == snapshots - {baseline} and max(lines.values()) == 1, (
        f"index lines and snapshots differ: no line for {sorted(snapshots - {baseline} - set(lines))}, "
        f"no snapshot for {sorted(set(lines) - snapshots)}")
