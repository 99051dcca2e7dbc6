"""The record: methods/versions/vN/ snapshots, the append-only ledger rows and methods/versions/index.jsonl.

Everything is written under one file lock (methods/versions/.lock), so parallel runs take distinct version numbers
and their rows land in version order. Rows are only ever appended, never rewritten.
"""
from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.config import Task

COLUMNS = ("version", "time (UTC)", "run", "backend/model", "parent", "summary / hypothesis", "correct", "residency",
           "balanced", "expert-batch", "score", "decision", "sha256")
VERSION_DIR = re.compile(r"^v(\d+)$")


@contextlib.contextmanager
def locked(task: Task) -> Iterator[None]:
    task.versions.mkdir(parents=True, exist_ok=True)
    with open(task.versions / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def solution_sha256(directory: Path) -> str:
    return hashlib.sha256((directory / "solution.py").read_bytes()).hexdigest()


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


def format_row(values: dict[str, object]) -> str:
    return "| " + " | ".join(cell(values.get(column)) for column in COLUMNS) + " |"


def rows(task: Task) -> list[str]:
    if not task.ledger_path.is_file():
        return []
    return [line for line in task.ledger_path.read_text().splitlines() if re.match(r"^\| v\d+ \|", line)]


def parse_row(line: str) -> dict[str, str]:
    return dict(zip(COLUMNS, (part.strip() for part in line.strip().strip("|").split(" | "))))


def index_entries(task: Task) -> list[dict]:
    path = task.versions / "index.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _append(task: Task, values: dict[str, object]) -> str:
    """Append one row to the ledger (the caller holds the lock)."""
    line = format_row(values)
    text = task.ledger_path.read_text() if task.ledger_path.is_file() else ""
    with open(task.ledger_path, "a") as handle:
        handle.write(("" if text.endswith("\n") or not text else "\n") + line + "\n")
    return line


def append_row(task: Task, values: dict[str, object]) -> str:
    """A row that records no new version (a promotion), under the same lock as every attempt."""
    with locked(task):
        return _append(task, values)


@dataclass
class Recorded:
    version: str
    row: str
    directory: Path


def record(task: Task, candidate: Path, parent_dir: Path | None, parent_label: str, row: dict[str, object],
           verdict: dict, index_extra: dict) -> Recorded:
    """Take the next vN, snapshot the candidate there, append its row and index line; all under the lock."""
    with locked(task):
        numbers = [int(m.group(1)) for p in task.versions.iterdir() if (m := VERSION_DIR.match(p.name))]
        version = f"v{max(numbers, default=-1) + 1}"
        directory = task.versions / version
        directory.mkdir()
        for path in solution_files(candidate):
            shutil.copy2(path, directory / path.name)
        (directory / "parent.patch").write_text(unified_patch(parent_dir, candidate, parent_label))
        (directory / "verdict.json").write_text(json.dumps(verdict, indent=2) + "\n")
        values = dict(row, version=version, sha256=solution_sha256(directory))
        line = _append(task, values)
        with open(task.versions / "index.jsonl", "a") as index:
            index.write(json.dumps(dict(values, **index_extra), sort_keys=True) + "\n")
    return Recorded(version, line, directory)
