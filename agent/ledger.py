"""The record of a task: its versions/vN/ snapshots, its append-only ledger rows and index lines
(versions/index*.jsonl; each task's manifest says where; W4A16's are methods/versions/ and methods/experiment_log.md).

Everything is written under one file lock (versions/.lock), so parallel runs take distinct version numbers and their
rows land in version order. Rows are only ever appended, never rewritten. A record survives a kill at any instant:
see ``record``. A row's columns are the task's (``columns``): the fixed ones around the task's metric columns.
An index line keeps no verdict of its own: its vN/verdict.json holds it, and ``index_entries`` reads it from there
(``index_verdict``), so a line stays one or two kilobytes however many cases a panel has. The index is segmented:
index.jsonl, then index.1.jsonl, index.2.jsonl, ...; a line goes to the last one until it passes
``INDEX_SEGMENT_BYTES``, then to a new one, so no record file grows without bound and none is ever rewritten.
"""
from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.config import Task

HEAD = ("version", "time (UTC)", "run", "backend/model", "parent", "summary / hypothesis", "correct")
# "stable" is last: rows written before it existed end at sha256 and still read (parse_row gives them "-")
TAIL = ("score", "decision", "sha256", "stable")
VERSION_DIR = re.compile(r"^v(\d+)$")
ATTEMPT_ROW = re.compile(r"^\| v\d+ \|")  # an attempt's row: not the header, nor a promotion's "| promote vN |"
INDEX_SEGMENT = re.compile(r"^index(?:\.(\d+))?\.jsonl$")  # index.jsonl is segment 0, index.N.jsonl segment N
INDEX_SEGMENT_BYTES = 1 << 20  # a segment this large takes no more lines (about 700 of today's)
PENDING = "pending.json"  # in vN/ until its row and index line are written: what a kill left unwritten, written later
PAUSE_ENV = "KLOOP_PAUSE_AT"  # test-only: the agent process stops at the named write boundary (tests/agent/test_crash)


def pause_at(point: str) -> None:
    """Stop here, for a test to kill -9 the run at this boundary, when KLOOP_PAUSE_AT names ``point``; else nothing."""
    if os.environ.get(PAUSE_ENV) == point:
        print(f"kloop: paused at {point} (pid {os.getpid()})", file=sys.stderr, flush=True)
        while True:
            time.sleep(60)


@contextlib.contextmanager
def locked(task: Task) -> Iterator[None]:
    task.versions.mkdir(parents=True, exist_ok=True)
    with open(task.versions / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def columns(task: Task) -> tuple[str, ...]:
    """The task's ledger columns: the fixed head, the task's metric columns (checks and strata), the fixed tail."""
    return HEAD + task.columns + TAIL


def identity(files: dict[str, bytes]) -> str:
    """A version's identity: the hash of all its source files (names and bytes), so that two versions that differ in a
    helper file never share one. Rows written before it hashed solution.py alone (``legacy_sha256``)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()


def solution_sha256(directory: Path) -> str:
    """The identity of a solution directory's source files."""
    return identity({path.name: path.read_bytes() for path in solution_files(directory)})


def legacy_sha256(solution_source: bytes) -> str:
    """The identity rows written before ``identity`` carry: solution.py's bytes alone."""
    return hashlib.sha256(solution_source).hexdigest()


def same_version(task: Task, directory: Path) -> str | None:
    """The first version whose snapshot holds exactly ``directory``'s source files (by their identity), else None.
    Read from the snapshots themselves, so rows of either hash agree."""
    identity = solution_sha256(directory)
    numbered = sorted((int(m.group(1)), p) for p in task.versions.iterdir() if (m := VERSION_DIR.match(p.name))) \
        if task.versions.is_dir() else []
    return next((f"v{n}" for n, path in numbered if solution_sha256(path) == identity), None)


def fmt(value: float | None, spec: str = ".3f") -> str:
    """A number as every table of the loop prints it (``spec``, a format spec), "-" where there is none."""
    return "-" if value is None else format(value, spec)


def solution_files(directory: Path) -> list[Path]:
    """The solution's .py files; a symlink is never one (copying it would copy whatever it points at)."""
    return sorted(p for p in directory.glob("*.py") if p.is_file() and not p.is_symlink())


def unified_patch(parent: Path | None, child: Path, label: str) -> str:
    """The candidate's .py files as a unified diff against its parent's (``label`` names the parent)."""
    names = sorted({p.name for p in solution_files(child)}
                   | ({p.name for p in solution_files(parent)} if parent else set()))
    chunks: list[str] = []
    for name in names:
        old = (parent / name).read_text().splitlines(keepends=True) if parent and (parent / name).is_file() else []
        new = (child / name).read_text().splitlines(keepends=True) if (child / name).is_file() else []
        chunks += difflib.unified_diff(old, new, f"{label}/{name}", f"candidate/{name}")
    return "".join(chunks)


def cell(value: object) -> str:
    """One ledger cell: no pipes or newlines, so a summary can never break the table."""
    text = "-" if value is None else str(value)
    return " ".join(text.replace("|", "/").split())


def format_row(values: dict[str, object], task: Task) -> str:
    return "| " + " | ".join(cell(values.get(column)) for column in columns(task)) + " |"


def header(task: Task) -> str:
    """The table's header and rule, as the ledger file and the prompts show them."""
    names = columns(task)
    return format_row(dict(zip(names, names)), task) + "\n|" + "---|" * len(names)


def _start_ledger(task: Task) -> None:
    """A new task's ledger: a title, what a row is, and the table's header (the caller holds the lock)."""
    if task.ledger_path.is_file():
        return
    task.ledger_path.parent.mkdir(parents=True, exist_ok=True)
    _append_line(task.ledger_path, f"# Experiment log: task {task.name}\n\nThe ledger of every attempt, append-only: "
                                   "one row per attempt, beginning `| vN |`; rows are never rewritten. Speedups are "
                                   f"over {task.baseline_label}.\n\n{header(task)}")


def rows(task: Task) -> list[str]:
    if not task.ledger_path.is_file():
        return []
    return [line for line in task.ledger_path.read_text().splitlines() if ATTEMPT_ROW.match(line)]


def parse_row(line: str, task: Task) -> dict[str, str]:
    """Every column of a row by name; a row with fewer cells (written before a column was appended) reads "-" there,
    as format_row writes a missing value."""
    names = columns(task)
    parts = [part.strip() for part in line.strip().strip("|").split(" | ")]
    return dict(zip(names, parts + ["-"] * (len(names) - len(parts))))


def index_verdict(verdict: dict) -> dict:
    """A verdict as index entries carry it: vN/verdict.json less each case's speedup over the best (``versus_best``)
    and the stages' output tails."""
    trimmed = {k: v for k, v in verdict.items() if k != "versus_best"}
    if "stages" in verdict:
        trimmed["stages"] = [{k: v for k, v in stage.items() if k != "output"} for stage in verdict["stages"]]
    return trimmed


def snapshot_verdict(task: Task, version: str) -> dict:
    """``index_verdict`` of vN/verdict.json; a snapshot without it is damaged, and the error says how to restore it."""
    path = task.versions / version / "verdict.json"
    try:
        return index_verdict(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc.__class__.__name__}: {exc}. The index line of {version} reads its verdict "
                         f"from there; restore the snapshot (git checkout -- {path.parent}) or the records it came "
                         "with") from None


def index_segments(task: Task) -> list[Path]:
    """The index's files in order: index.jsonl, then index.1.jsonl, index.2.jsonl, ... (by number, not by name)."""
    if not task.versions.is_dir():
        return []
    found = [(int(m.group(1) or 0), path) for path in task.versions.glob("index*.jsonl")
             if (m := INDEX_SEGMENT.match(path.name))]
    return [path for _, path in sorted(found)]


def index_append_path(task: Task) -> Path:
    """The segment the next index line goes to: the last one while it is under ``INDEX_SEGMENT_BYTES``, else a new
    one numbered after it."""
    segments = index_segments(task)
    if not segments:
        return task.versions / "index.jsonl"
    last = segments[-1]
    if last.stat().st_size < INDEX_SEGMENT_BYTES:
        return last
    return task.versions / f"index.{int(INDEX_SEGMENT.match(last.name).group(1) or 0) + 1}.jsonl"


def index_entries(task: Task, verdicts: bool = True) -> list[dict]:
    """Every index line of every segment, in order, each with its ``verdict`` (from its snapshot where the line keeps
    none; lines written before the index stopped keeping verdicts carry their own). ``verdicts=False``: the lines as
    written."""
    entries = [json.loads(line) for path in index_segments(task) for line in path.read_text().splitlines()
               if line.strip()]
    if verdicts:
        for entry in entries:
            if "verdict" not in entry:
                entry["verdict"] = snapshot_verdict(task, entry["version"])
    return entries


def _append_line(path: Path, line: str) -> None:
    """Append ``line`` in one write(2) to an O_APPEND file: a kill leaves the whole line or none of it."""
    data = (line + "\n").encode()
    if path.is_file() and path.stat().st_size:
        with open(path, "rb") as handle:
            handle.seek(-1, os.SEEK_END)
            data = data if handle.read(1) == b"\n" else b"\n" + data
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:  # a regular file takes it in one write; a short write (a full disk) continues, never drops
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def _finish_pending(task: Task) -> list[str]:
    """Write what a killed writer left unwritten (the caller holds the lock, so that writer is gone): the row and the
    index line of each vN that still holds pending.json. A half-made snapshot never became a vN; it is removed.
    Returns the versions finished."""
    for staging in task.versions.glob(".staging-v*"):
        shutil.rmtree(staging)
    finished = []
    pending_paths = [p for p in task.versions.glob(f"v*/{PENDING}") if VERSION_DIR.match(p.parent.name)]
    for path in sorted(pending_paths, key=lambda p: int(p.parent.name[1:])):
        pending = json.loads(path.read_text())
        version = pending["index"]["version"]
        if not any(line.startswith(f"| {version} |") for line in rows(task)):
            _start_ledger(task)  # a kill before a new task's first row left no header either
            _append_line(task.ledger_path, pending["row"])
        if not any(entry.get("version") == version for entry in index_entries(task, verdicts=False)):
            _append_line(index_append_path(task), json.dumps(pending["index"], sort_keys=True))
        path.unlink()
        finished.append(version)
    return finished


def finish_pending(task: Task) -> list[str]:
    """``_finish_pending`` under the lock: a resumed run calls it before it reads the index."""
    with locked(task):
        return _finish_pending(task)


def append_row(task: Task, values: dict[str, object]) -> str:
    """A row that records no new version (a promotion), under the same lock as every attempt."""
    with locked(task):
        _finish_pending(task)  # an attempt's row before any row written after it
        line = format_row(values, task)
        _start_ledger(task)
        _append_line(task.ledger_path, line)
        return line


@dataclass
class Recorded:
    version: str
    row: str
    directory: Path
    entry: dict  # its index line, with the verdict index_entries gives it


def record(task: Task, candidate: Path, parent_dir: Path | None, parent_label: str, row: dict[str, object],
           verdict: dict, index_extra: dict) -> Recorded:
    """Take the next vN and record the attempt there, under the lock, in an order that a kill at any instant leaves
    recoverable. The snapshot is made in .staging-vN/ and renamed to vN/ whole, pending.json (its row and index line)
    included; then the row, the index line, and pending.json is removed. A kill before the rename leaves no vN; after
    it, the next record or a resumed run (``finish_pending``) writes what is missing, so the attempt is recorded
    exactly once. The index line, once written, is the record a resumed run goes by."""
    with locked(task):
        _finish_pending(task)
        numbers = [int(m.group(1)) for p in task.versions.iterdir() if (m := VERSION_DIR.match(p.name))]
        version = f"v{max(numbers, default=-1) + 1}"
        directory, staging = task.versions / version, task.versions / f".staging-{version}"
        staging.mkdir()
        for path in solution_files(candidate):
            shutil.copy2(path, staging / path.name)
        (staging / "parent.patch").write_text(unified_patch(parent_dir, candidate, parent_label))
        (staging / "verdict.json").write_text(json.dumps(verdict, indent=2) + "\n")
        values = dict(row, version=version, sha256=solution_sha256(staging))
        line, entry = format_row(values, task), json.loads(json.dumps(dict(values, **index_extra)))
        entry["verdict"] = json.loads(json.dumps(index_verdict(verdict)))  # as index_entries reads it back
        written = {k: v for k, v in entry.items() if k != "verdict"}
        (staging / PENDING).write_text(json.dumps({"row": line, "index": written}) + "\n")
        staging.rename(directory)
        pause_at("snapshot")
        _start_ledger(task)
        _append_line(task.ledger_path, line)
        pause_at("row")
        _append_line(index_append_path(task), json.dumps(written, sort_keys=True))
        pause_at("index")
        (directory / PENDING).unlink()
    return Recorded(version, line, directory, entry)
