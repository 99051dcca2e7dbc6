"""The project's own records agree: a run's records brought back from another machine (the ledger, the snapshots and
the index) must arrive whole, or a later run would not see those attempts."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from agent import ledger
from agent.config import Task
from tests.conftest import ROOT

TASKS = sorted(p.name for p in (ROOT / "tasks").iterdir() if (p / "task.json").is_file())


@pytest.mark.parametrize("name", TASKS)
def test_every_snapshot_has_one_ledger_row_and_one_index_line(name: str):
    task = Task.load(ROOT, name)
    snapshots = {p.name for p in task.versions.iterdir() if p.is_dir() and p.name[1:].isdigit()}
    rows = Counter(ledger.parse_row(line, task)["version"] for line in ledger.rows(task))
    lines = Counter(entry["version"] for entry in ledger.index_entries(task))
    # v0, the start, is written by hand: no evaluation and so no index line; a row where it is the yardstick (W4A16's)
    start = {"v0"} & snapshots
    unrowed = start - {task.baseline_version}
    assert set(rows) == snapshots - unrowed and max(rows.values()) == 1, "ledger rows and snapshots differ"
    assert set(lines) == snapshots - start and max(lines.values()) == 1, (
        f"index lines and snapshots differ: no line for {sorted(snapshots - start - set(lines))}, "
        f"no snapshot for {sorted(set(lines) - snapshots)}")


@pytest.mark.parametrize("name", TASKS)
def test_every_index_line_of_the_repository_reads_with_its_verdict(name: str):
    task = Task.load(ROOT, name)
    entries = ledger.index_entries(task)
    assert entries, f"task {name} has no index lines"
    assert all(isinstance(e["verdict"], dict) and "valid" in e["verdict"] for e in entries)


def test_an_index_line_keeps_no_verdict_and_reads_it_from_its_snapshot(project: Path):
    """The index line of a record is small and carries no verdict; index_entries gives it the snapshot's verdict
    less versus_best and the stages' outputs, as the record returned it. A line of the older form, with a verdict of
    its own, reads as written; a snapshot that lost its verdict.json is an error that says how to restore it."""
    task = Task.load(project)
    cases = [{"name": f"case{i}", "speedup": 1.0 + i / 100, "median_us": 10.0} for i in range(200)]
    verdict = {"valid": True, "keep": False, "score": 1.02, "cases": cases,
               "versus_best": {"cases": cases}, "stages": [{"name": "selfcheck", "ok": True, "output": "x" * 5000}]}
    row = {"run": "r", "backend/model": "offline", "parent": "v0", "summary / hypothesis": "s", "correct": "yes",
           "score": "1.020", "decision": "revert"}
    main = task.root / task.candidate_dir
    recorded = ledger.record(task, main, task.versions / "v0", "v0", row, verdict, {"iteration": 1})

    (line,) = (task.versions / "index.jsonl").read_text().splitlines()
    assert "verdict" not in json.loads(line) and len(line) < 1000, line
    assert not (recorded.directory / ledger.PENDING).exists()
    expected = {"valid": True, "keep": False, "score": 1.02, "cases": cases,
                "stages": [{"name": "selfcheck", "ok": True}]}
    (entry,) = ledger.index_entries(task)
    assert entry["verdict"] == expected == recorded.entry["verdict"]
    assert json.loads((recorded.directory / "verdict.json").read_text()) == verdict, "the snapshot keeps it whole"

    older = dict(json.loads(line), version="v7", verdict={"valid": False, "score": None})
    with open(task.versions / "index.jsonl", "a") as lines:
        lines.write(json.dumps(older) + "\n")
    assert [e["verdict"] for e in ledger.index_entries(task)] == [expected, {"valid": False, "score": None}]

    (recorded.directory / "verdict.json").unlink()
    assert [e["version"] for e in ledger.index_entries(task, verdicts=False)] == [recorded.version, "v7"]
    with pytest.raises(ValueError, match=rf"{recorded.version}/verdict\.json.*restore the snapshot"):
        ledger.index_entries(task)


def test_the_index_goes_on_in_a_new_segment_once_the_last_is_full(project: Path, monkeypatch):
    """Once the last segment holds INDEX_SEGMENT_BYTES, the next line starts index.N.jsonl and the full one is
    left as written; index_entries reads the segments by number (index.10 after index.2), crash recovery included."""
    task = Task.load(project)
    row = {"run": "r", "backend/model": "offline", "parent": "v0", "summary / hypothesis": "s", "correct": "yes",
           "score": "1.000", "decision": "revert"}
    verdict = {"valid": True, "keep": False, "score": 1.0}
    main = task.root / task.candidate_dir

    def record():
        return ledger.record(task, main, task.versions / "v0", "v0", row, verdict, {"iteration": 1}).version

    first = record()
    monkeypatch.setattr(ledger, "INDEX_SEGMENT_BYTES", 1)  # every segment with a line in it is full
    full = (task.versions / "index.jsonl").read_bytes()
    second, third = record(), record()
    assert (task.versions / "index.jsonl").read_bytes() == full
    assert [p.name for p in ledger.index_segments(task)] == ["index.jsonl", "index.1.jsonl", "index.2.jsonl"]
    (task.versions / "index.2.jsonl").rename(task.versions / "index.10.jsonl")
    assert [p.name for p in ledger.index_segments(task)] == ["index.jsonl", "index.1.jsonl", "index.10.jsonl"]
    assert [e["version"] for e in ledger.index_entries(task)] == [first, second, third]

    fourth = record()
    segment = task.versions / "index.11.jsonl"
    (line,) = segment.read_text().splitlines()
    assert json.loads(line)["version"] == fourth
    # a kill after the row, before the index line: recovery writes the line where a record would have
    segment.unlink()
    row_line = next(r for r in ledger.rows(task) if r.startswith(f"| {fourth} |"))
    (task.versions / fourth / ledger.PENDING).write_text(json.dumps({"row": row_line, "index": json.loads(line)}))
    assert ledger.finish_pending(task) == [fourth]
    assert segment.read_text().splitlines() == [line]
    assert [e["version"] for e in ledger.index_entries(task)] == [first, second, third, fourth]

