"""The per-table search: every tier of a solution searched at once, each by its own coordinate moves, each move
credited by the panel's own per-case numbers. A solution asks for it with ``"strategy": "per-table"`` in its
SEARCH_SPACE (``agent.proposers.space``); the offline proposer then hands each iteration here.

A per-shape table (one tier per panel shape, as seed 002's tuning table has) gives the coordinate search of
``agent.proposers.offline`` one knob of one table per attempt: fifty tables, several knobs, a few attempts each, far
more attempts than a run makes. Here every table keeps its own incumbent, the best configuration measured for the
cases it holds, and attempts are of two kinds:

- a **step** gives every table that decides a panel shape (a tier, or the general table for the shapes no tier
  holds) its incumbent plus one move: on along the direction that last won for that table first, then the space's
  untried jumps (several knobs at once, to another region of the space), then the next untried neighbour of one knob
  (nearest first in the space's knob order), so that one evaluation times a move of every table;
- a **merge** gives every table its incumbent and moves nothing: only measured wins, so the loop's keep rule (faster
  than the best beyond noise, both timed in one process) keeps it once the wins add up past the noise. A merge comes
  when the incumbents' numbers put the score ``MERGE_GAIN`` over the best's, or after ``MERGE_AFTER`` steps from the
  best once they put it ``MERGE_FLOOR`` over, or in the run's last iteration (``IterationContext.last``: the
  ``iters``-th, or the one its time limit leaves room for), or right after a merge that was not kept and whose
  timing against the best refuted some of its tables (below); otherwise another step.

A merge not kept is still the one attempt that timed the incumbents against the best in one process (its verdict's
``versus_best``: each case's speedup over the best, as the task's score sees it). A table it changed on which one of
its cases ran under ``REFUTED`` times the best's speed is refuted: that configuration is no incumbent again while the
best's tables stay (a step's numbers and the best's came from two processes; the head-to-head timing outranks
them), so the next attempt merges the rest.

A table's move wins, and becomes its incumbent, when every panel case the table holds ran at least ``1 + MARGIN``
times faster than under its incumbent (speedups against the task's baseline, which each attempt measures paired in
its own process, so two attempts' numbers compare). In the run's last iteration the merge also switches to the
solution's fallback (a knob named ``FALLBACK`` with values ``[False, True]``, where the space declares one) every
table whose incumbent runs slower than the baseline on every case it holds, as seed 002 kept a plan only where it
won.

Everything comes from the ledger and the snapshots (``versions/vN/solution.py`` and ``verdict.json``): every table
configuration a recorded version holds (a move that would make one again is tried, in this run or a later one; on a
GPU, but one only the interpreter ran, correctly: ``offline.evaluated_here``) and, for the attempts made from the best
(in any run) that were correct on every case and timed on the best's kind of device, the numbers that make the
incumbents. So a resumed run, or a new one started from the best (``--from vN``), goes on where the last stopped. A
version whose tables are the best's counts as the best here: a kernel change submitted with the tables unchanged
(``agent submit``) goes on where the search from its parent stopped, each attempt made from the parent counted by its
gain over the parent's own numbers (the kernels differ). A knob a table of the best holds and the same table of an
earlier version lacks (a knob added since) is read there at the value it came in with, its value in the general table
of the best's first ancestor that has it, which by convention keeps the earlier code. Nothing here imports candidate
code.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from agent.config import Task
from agent.exceptions import LimitsExceeded, ProposerError
from agent.ledger import ATTEMPT_ROW, parse_row
from agent.proposers import IterationContext
from agent.proposers.offline import (Move, Shape, Table, _Source, admits, evaluated_here, find_tables, read_verdict,
                                     refused, render, run_on_gpu, same_model, single_moves)
from agent.proposers.space import Space, same_value
from agent.tools import Tools

STEP, MERGE = "per-table step", "per-table merge"
MARGIN = 0.03
"""A table's move wins when every case it holds ran at least this much faster than under its incumbent (seed 002's
qualification margin)."""
MERGE_GAIN = 1.10
"""A merge comes as soon as the incumbents' numbers put the score this far over the best's: a gain the keep rule's
noise cannot hide."""
MERGE_AFTER = 3
"""Else after this many steps from the best: a step costs one selfcheck, a merge also the time against the best and
the task's checks, several times as long (reports/examples/llgemm-seed002), so smaller wins gather first."""
MERGE_FLOOR = 1.03
"""...and only once the incumbents' numbers put the score this far over the best's: timed against the best, a merge
came out 0.6-4% under its estimate (each incumbent is the best of noisy tries), and the keep rule of a graph-paired
comparison asks at least 1% (agent.evaluate.NOISE_FLOOR; reports/examples/llgemm-seed002)."""
REFUTED = 0.94
"""A merged table is refuted where one of its cases ran under this fraction of the best's speed, timed against it:
past the noise of a case whose table the merge left alone (an A/A pair inside every merge: 0.95-1.015, geomean 0.992,
in two merges of 27-28 such cases; reports/examples/llgemm-seed002/README.md)."""
FALLBACK = "FALLBACK"
JUMP = (0, 0, -1, 0)  # a jump's Move.rank: jumps come in the space's order, before a table's one-knob moves
SHOWN = 6  # changes a summary names before "and N more"


@dataclass(frozen=True)
class Change:
    table: str
    knob: str
    old: object
    new: object

    def __str__(self) -> str:
        return f"{self.table} {self.knob} {self.old}->{self.new}"


@dataclass
class Incumbent:
    """A table's best measured configuration: its knob values, the numbers of the cases it holds, and the change that
    made it (None: the best's own)."""

    entries: dict
    speedups: dict[str, float]
    won: Change | None = None
    changes: list[Change] = field(default_factory=list)  # against the best's table


def changes(before: list[Table], after: list[Table]) -> list[Change]:
    """The knob values that differ between two versions' tables of the same name."""
    old = {t.name: t.entries for t in before}
    found = []
    for table in after:
        for knob, value in table.entries.items():
            was = old.get(table.name, {}).get(knob, value)
            if was != value:
                found.append(Change(table.name, knob, was, value))
    return found


def summarize(kind: str, moved: list[Change]) -> str:
    shown = ", ".join(map(str, moved[:SHOWN])) + (f" and {len(moved) - SHOWN} more" if len(moved) > SHOWN else "")
    return f"{kind}: {len({c.table for c in moved})} table(s): {shown}"


class History:
    """The ledger's rows and the snapshots they name, each read once; each snapshot's tables read with the knobs the
    best's same-named table holds that it lacks (``tables``: the best's), at the value the knob came in with: its
    value in the general table of the best's first ancestor (``best``; else the first recorded version) that has it
    (a knob added to a kernel keeps the earlier code at that value); none where that value is an expression."""

    def __init__(self, tools: Tools, task: Task, gpu: bool, tables: list[Table] = (), best: str | None = None,
                 device: str | None = None):
        self.tools, self.task, self.gpu, self.device = tools, task, gpu, device
        self.sources: dict[str, str | None] = {}
        self.parsed: dict[str, list[Table] | None] = {}
        self.cases: dict[str, dict[str, float]] = {}
        self.verdicts: dict[str, dict] = {}
        ledger = tools.read_file(task.ledger)["output"]
        self.rows = [parse_row(line, task) for line in ledger.splitlines() if ATTEMPT_ROW.match(line)]
        self.by_version = {row.get("version"): row for row in self.rows}
        self.held = {t.name: set(t.entries) for t in tables}
        self.introduced: dict[str, object] = {}
        wanted, seen = set().union(*self.held.values()) if self.held else set(), set()
        ancestry = self.ancestry(best) if best in self.by_version else []
        for version in reversed(ancestry) if ancestry else list(self.by_version):
            general = (self._read(version) or [None])[0]
            for knob in (wanted - seen) & set(general.entries if general else ()):
                seen.add(knob)
                if not isinstance(general.entries[knob], _Source):
                    self.introduced[knob] = general.entries[knob]

    def ancestry(self, version: str | None) -> list[str]:
        """The version, its parent, the parent's parent... as the ledger's rows give them (a cycle ends it)."""
        found = []
        while version and version not in found:
            found.append(version)
            version = (self.by_version.get(version) or {}).get("parent")
        return found

    def _read(self, version: str | None) -> list[Table] | None:
        """The version's tables as its snapshot holds them; None without a snapshot or where it cannot be read."""
        if version not in self.parsed:
            source = self.source(version) if version else None
            try:
                self.parsed[version] = None if source is None else find_tables(source, self.task)
            except (ProposerError, SyntaxError, ValueError):  # a snapshot the search cannot read is no history
                self.parsed[version] = None
        return self.parsed[version]

    def tables(self, version: str) -> list[Table] | None:
        """The version's tables (None without a readable snapshot), each with the knobs it lacks that the best's
        holds, at the value each came in with."""
        read = self._read(version)
        if read is None:
            return None
        found = []
        for table in read:
            missing = {knob: self.introduced[knob] for knob in self.held.get(table.name, ())
                       if knob not in table.entries and knob in self.introduced}
            found.append(replace_entries(table, {**table.entries, **missing}) if missing else table)
        return found

    def lineage(self, best: str | None, tables: list[Table]) -> set[str]:
        """The best and every recorded version whose tables are the best's (``tables``): attempts made from any of
        them were made from the same tables."""
        if best is None:
            return set()
        mine = {configuration(t.name, t.entries) for t in tables}
        versions = dict.fromkeys(v for row in self.rows for v in (row.get("version"), row.get("parent")) if v)
        alike = {v for v in versions if (theirs := self.tables(v)) is not None
                 and {configuration(t.name, t.entries) for t in theirs} == mine}
        return alike | {best}

    def source(self, version: str) -> str | None:
        if version not in self.sources:
            read = self.tools.read_file(f"{self.task.versions_dir}/{version}/solution.py")
            self.sources[version] = None if read["returncode"] else read["output"]
        return self.sources[version]

    def verdict(self, version: str) -> dict:
        """That version's verdict.json ({} where it is missing or unreadable), read once."""
        if version not in self.verdicts:
            self.verdicts[version] = read_verdict(self.tools, self.task, version)
        return self.verdicts[version]

    def speedups(self, version: str) -> dict[str, float]:
        """Case name -> speedup against the baseline in that version's own selfcheck (its verdict's ``cases``); none
        from a version that was not correct on every case (a kernel wrong anywhere is trusted nowhere: a race in
        shared code shows on a few cases only) or whose numbers were taken on another kind of device than the
        best's (``gpu``), or on another GPU model (``same_device``)."""
        if version not in self.cases:
            verdict = self.verdict(version)
            cases = verdict.get("cases") or []
            trusted = verdict.get("correct") is True and bool(verdict.get("gpu_timing")) == self.gpu \
                and self.same_device(version)
            self.cases[version] = _speedups({c.get("name"): c for c in cases if isinstance(c, dict)}) if trusted \
                else {}
        return self.cases[version]

    def same_device(self, version: str) -> bool:
        """Whether a GPU-timed version ran on the search's GPU model (``device``: the best's profile names it): its
        verdict's ``device``, else the manifest's ``ledger_device``; true where either side is unknown. Speedups
        against the baseline differ between models (an H100 and an H200 differ in bandwidth by 1.4x), so another
        model's numbers make no incumbent and its configurations are untried here."""
        verdict = self.verdict(version)
        if not self.gpu or not verdict.get("gpu_timing"):  # no GPU model to tell apart
            return True
        return same_model(verdict, self.device, self.task.ledger_device)

    def configurations(self, measured: bool = False) -> set[tuple]:
        """(table name, its entries) of every table of every recorded version evaluated here (``evaluated_here``: a
        configuration only the interpreter or another GPU model ran correctly is untimed here, so it is tried again);
        with ``measured``, only of the versions whose numbers are trusted (``speedups``): what has been timed."""
        found = set()
        for row in self.rows:
            version = row["version"]
            tables = self.tables(version)
            if tables is None:
                continue
            if self.speedups(version) if measured else \
                    evaluated_here(lambda: self.verdict(version), self.gpu, self.device, self.task.ledger_device):
                found |= {configuration(t.name, t.entries) for t in tables}
        return found

    def refuted_by(self, row: dict, tables: list[Table], shapes: dict[str, Shape]) -> set[tuple]:
        """The table configurations a merge that was not kept refuted (``configuration`` of each): each table it
        changed against its parent on which a case the table holds (``held``, by the best's ``tables``) ran under
        ``REFUTED`` times the best's speed, timed against it in one process (its verdict's
        ``versus_best``). None for another kind of row, a kept merge, one never timed against the best, or one timed
        on another kind of device than the search's or another GPU model (``same_device``)."""
        if not row.get("summary / hypothesis", "").startswith(MERGE) or not self.same_device(row["version"]):
            return set()
        verdict = self.verdict(row["version"])
        if bool(verdict.get("gpu_timing")) != self.gpu:  # interpreter wall times refute nothing on a GPU, and back
            return set()
        if (verdict.get("worker") or {}).get("shared"):  # timed beside another worker on its GPU: not head-to-head
            return set()
        versus = verdict.get("versus_best")
        mine, theirs = self.tables(row["version"]), self.tables(row.get("parent"))
        if verdict.get("keep") or not isinstance(versus, dict) or mine is None or theirs is None:
            return set()
        before = {t.name: t.entries for t in theirs}
        return {configuration(t.name, t.entries) for t in mine if t.entries != before.get(t.name)
                and any(isinstance(versus.get(case), (int, float)) and versus[case] < REFUTED
                        for case in held(t, shapes, tables))}

    def moved(self, row: dict) -> list[Change]:
        """What a row's version changed against its parent (nothing when either snapshot is missing)."""
        mine, theirs = self.tables(row["version"]), self.tables(row["parent"])
        if mine is None or theirs is None:
            return []
        return changes(theirs, mine)


def configuration(name: str, entries: dict) -> tuple:
    return name, tuple(sorted((knob, repr(value)) for knob, value in entries.items()))


def _speedups(cases: dict) -> dict[str, float]:
    return {name: c["speedup"] for name, c in cases.items()
            if name and c.get("correct") is not False and isinstance(c.get("speedup"), (int, float))
            and c["speedup"] > 0}


def panel_shapes(profile: dict | None, task: Task) -> dict[str, Shape]:
    """Case name -> shape (stratum, each tier dimension) of the best's profiled panel."""
    dims = tuple(task.tier_dims)
    found = {}
    for entry in (profile or {}).get("cases") or []:
        case = entry.get("case") or {}
        if case.get("name") and all(d in case for d in dims):
            found[case["name"]] = (case.get("stratum"), *(case[d] for d in dims))
    return found


def held(table: Table, shapes: dict[str, Shape], tables: list[Table]) -> list[str]:
    """The panel cases whose plan this table decides: the first tier holding a shape, else the general table."""
    return [name for name, shape in shapes.items()
            if next((t for t in tables[1:] if t.holds(shape)), tables[0]).name == table.name]


def incumbents(history: History, best_label: str | None, tables: list[Table], shapes: dict[str, Shape],
               best: dict[str, float], lineage: set[str] | None = None,
               refuted: set[tuple] = frozenset()) -> dict[str, Incumbent]:
    """Each table's incumbent: the best's own values and numbers, then every attempt made from the best or from a
    version with its tables (``lineage``, by default the best alone; its parent, in any run: a run started from a
    version goes on where an earlier run from it stopped), in ledger order, each table taking an attempt's values
    where every case it holds ran 1 + MARGIN faster. An attempt made from another version of the lineage (whose
    kernel may differ from the best's) counts by its gain over that version's own numbers, applied to the best's;
    none where that version has no trusted numbers. A table's ``won`` starts as the single change the search's last
    attempt in the lineage made to it (the best's own, or, for a best recorded by hand, its nearest such ancestor's),
    when that was a per-table merge; the losing moves of a kept step are undone where the best is that step. A
    configuration in ``refuted`` (``History.refuted_by``) never becomes an incumbent."""
    parents = {best_label} if lineage is None else lineage
    found = {t.name: Incumbent(dict(t.entries), {c: best[c] for c in held(t, shapes, tables) if c in best})
             for t in tables}
    rows = history.by_version
    own = rows.get(best_label)
    if own is not None and own.get("summary / hypothesis", "").startswith(STEP):
        undo_losses(history, own, tables, found)
    # momentum: the merge that made the best, or, for a best recorded by hand, its nearest ancestor in the lineage
    # that the search made
    searched = next((rows[v] for v in history.ancestry(best_label) if v in parents and v in rows
                     and rows[v].get("summary / hypothesis", "").startswith((STEP, MERGE))), None)
    if searched is not None and searched.get("summary / hypothesis", "").startswith(MERGE):
        for table, moved in _by_table(history.moved(searched)).items():
            if table in found and len(moved) == 1:
                found[table].won = moved[0]
    for row in history.rows:
        if best_label is None or row.get("parent") not in parents:
            continue
        theirs = history.tables(row["version"])
        if theirs is None:
            continue
        numbers = history.speedups(row["version"])
        if row.get("parent") != best_label:  # its gain over its own parent, on the best's numbers
            before = history.speedups(row["parent"])
            numbers = {case: value * best[case] / before[case] for case, value in numbers.items()
                       if case in best and before.get(case)}
        for table in theirs:
            incumbent = found.get(table.name)
            if incumbent is None or table.entries == incumbent.entries or not incumbent.speedups \
                    or configuration(table.name, table.entries) in refuted:
                continue
            if all(case in numbers and numbers[case] >= value * (1 + MARGIN)
                   for case, value in incumbent.speedups.items()):
                moved = changes([replace_entries(table, incumbent.entries)], [table])
                incumbent.entries = dict(table.entries)
                incumbent.speedups = {case: numbers[case] for case in incumbent.speedups}
                incumbent.won = moved[0] if len(moved) == 1 else None
    for table in tables:
        found[table.name].changes = changes([table], [replace_entries(table, found[table.name].entries)])
    return found


def undo_losses(history: History, row: dict, tables: list[Table], found: dict[str, Incumbent]) -> None:
    """A step the keep rule kept (its score beat the best's) still holds the moves that lost: each table whose cases
    did not all win by the margin over the step's parent takes the parent's values and numbers back as its incumbent,
    so that the next merge undoes its move. Nothing to compare where the parent's numbers are not trusted."""
    parent, before = history.tables(row["parent"]), history.speedups(row["parent"])
    if parent is None or not before:
        return
    theirs = {t.name: t.entries for t in parent}
    for table in tables:
        incumbent = found[table.name]
        old = theirs.get(table.name)
        if old is None or old == table.entries or not incumbent.speedups:
            continue
        if not all(case in before and value >= before[case] * (1 + MARGIN)
                   for case, value in incumbent.speedups.items()):
            incumbent.entries = dict(old)
            incumbent.speedups = {case: before[case] for case in incumbent.speedups if case in before}


def score(numbers: dict[str, float], shapes: dict[str, Shape]) -> float | None:
    """The task's score of per-case speedups: geometric mean per stratum, harmonic mean across strata."""
    strata: dict[str, list[float]] = {}
    for name, shape in shapes.items():
        if name not in numbers:
            return None
        strata.setdefault(shape[0], []).append(numbers[name])
    if not strata:
        return None
    means = [math.exp(sum(map(math.log, v)) / len(v)) for v in strata.values()]
    return len(means) / sum(1 / m for m in means)


def estimated_gain(tables: list[Table], found: dict[str, Incumbent], shapes: dict[str, Shape],
                   best: dict[str, float]) -> float:
    """The score with every table at its incumbent over the best's, from the numbers each was measured at (1.0 when
    either score cannot be formed)."""
    merged = dict(best)
    for table in tables:
        merged.update(found[table.name].speedups if found[table.name].changes else {})
    before, after = score(best, shapes), score(merged, shapes)
    return after / before if before and after else 1.0


def _by_table(moved: list[Change]) -> dict[str, list[Change]]:
    grouped: dict[str, list[Change]] = {}
    for change in moved:
        grouped.setdefault(change.table, []).append(change)
    return grouped


def replace_entries(table: Table, entries: dict) -> Table:
    return Table(table.name, table.start, table.end, dict(entries), table.strata, table.spans, table.ranges,
                 table.label, table.before, table.after)


def losing(tables: list[Table], found: dict[str, Incumbent], space: Space) -> list[str]:
    """Tables whose incumbent (fallback off) runs slower than the baseline on every case it holds."""
    if FALLBACK not in space.knobs or list(space.knobs[FALLBACK].values) != [False, True]:
        return []
    return [t.name for t in tables if found[t.name].entries.get(FALLBACK) is False and found[t.name].speedups
            and all(v < 1.0 for v in found[t.name].speedups.values())]


def next_move(table: Table, moves: list[Move], tried: set[tuple], last_won: Change | None, space: Space,
              general: Table, visited: list[frozenset] = ()) -> Move | None:
    """The table's next move from its incumbent: on along the direction that last won for it, else its first untried
    jump (``jump_moves``; ``visited``: the configurations this table has been timed at, as ``configuration``'s
    entries), else its first untried neighbour (the move's order: ``single_moves``); nothing for a table that has no
    neighbour to move to (it decides no panel shape). A move is tried when the table configuration it makes has been
    evaluated (``tried``: ``configuration`` of every recorded version's tables that counts here, ``evaluated_here``)."""
    def allowed(move: Move) -> bool:
        key = configuration(table.name, {**table.entries, **move.changes()})
        return key not in tried and not refused([general, table], space,
                                                {(table.name, knob): value for knob, value in move.changes().items()})

    if last_won is not None and last_won.knob in space.knobs and table.entries.get(last_won.knob) == last_won.new:
        values = space.knobs[last_won.knob].values
        if last_won.old in values and last_won.new in values:
            here, before = values.index(last_won.new), values.index(last_won.old)
            onward = here + (1 if here > before else -1)
            move = next((m for m in moves if 0 <= onward < len(values) and m.knob == last_won.knob
                         and m.value == values[onward]), None)
            if move is not None and allowed(move):
                return move
    jumps = jump_moves(table, space, general, visited) if moves else []
    return next((m for m in jumps + moves if allowed(m)), None)


def jump_moves(table: Table, space: Space, general: Table, visited: list[frozenset] = ()) -> list[Move]:
    """The space's jumps that would change the table, in their order, each as one move setting every knob of the
    jump that differs. A table tries a jump once: none that a configuration in ``visited`` (where the table has been
    timed) already held (all its values), none where a knob it sets would not matter (``only_when``, on the general
    table's values updated by the table's and the jump's: a table at its fallback), none that would overwrite a
    computed value or set a knob the table lacks (render changes a table's own literal entries only)."""
    found = []
    for to, reason in space.jumps:
        if not all(knob in table.entries and not isinstance(table.entries[knob], _Source) for knob in to):
            continue
        held = {(knob, repr(value)) for knob, value in to.items()}
        if any(held <= entries for entries in visited):
            continue
        after = {**general.entries, **table.entries, **to}
        if not all(any(all(admits(allowed, after.get(other)) for other, allowed in alternative.items())
                       for alternative in space.only_when[knob]) for knob in to if space.only_when.get(knob)):
            continue
        differ = [(knob, value) for knob, value in to.items() if not same_value(table.entries[knob], value)]
        if differ:
            (knob, value), *also = differ
            found.append(Move(JUMP, table.name, knob, table.entries[knob], value,
                              f"jump to {_render(to)}: {reason}", table.label, tuple(also)))
    return found


def _render(values: dict) -> str:
    return ", ".join(f"{knob}={value!r}" for knob, value in values.items())


def iterate(context: IterationContext, tools: Tools, source: str, tables: list[Table], space: Space,
            known) -> None:
    """One per-table attempt: a merge when some incumbent differs from the best and the incumbents' numbers put the
    score MERGE_GAIN over the best's, or MERGE_FLOOR over it once MERGE_AFTER steps have been made from the best, or
    in the run's last iteration, or over 1 right after a merge that refuted tables (the trimmed merge); else a
    step (steps and merges counted on the best's GPU model only). ``known(proposal)`` says whether the ledger holds
    that solution already.
    Ends in ``tools.submit``, or LimitsExceeded when no table has a move left."""
    task = tools.task
    history = History(tools, task, gpu=run_on_gpu(context), tables=tables, best=context.best,
                      device=(context.profile or {}).get("device"))
    shapes = panel_shapes(context.profile, task)
    best = _speedups({(c.get("case") or {}).get("name"): c for c in (context.profile or {}).get("cases") or []})
    lineage = history.lineage(context.best, tables)
    refutations = {row["version"]: history.refuted_by(row, tables, shapes) for row in history.rows
                   if row.get("parent") in lineage}
    refuted = set().union(*refutations.values())
    found = incumbents(history, context.best, tables, shapes, best, lineage, refuted)
    final = context.last or context.iters is not None and context.iteration >= context.iters

    def submit(edits: dict, moved: list[Change], kind: str, reason: str) -> None:
        proposal = render(source, tables, edits)
        if known(proposal):
            return
        tools.write_file(f"{task.candidate_dir}/solution.py", proposal)
        tools.submit(summarize(kind, moved), reason)

    pending = [c for t in tables for c in found[t.name].changes]
    since, last = 0, None  # steps from the best (or a version with its tables) since its last merge attempt
    for row in history.rows:  # on this GPU model: another's attempts say nothing here
        if row.get("parent") in lineage and history.same_device(row["version"]):
            kind = row.get("summary / hypothesis", "")
            since = since + 1 if kind.startswith(STEP) else 0 if kind.startswith(MERGE) else since
            last = row
    trimmed = len(refutations[last["version"]]) if last is not None else 0
    gain = estimated_gain(tables, found, shapes, best) if pending else 1.0
    if pending and (final or since >= MERGE_AFTER and gain >= MERGE_FLOOR or gain >= MERGE_GAIN
                    or trimmed and gain > 1) or final:
        switched = losing(tables, found, space) if final else []
        moved = pending + [Change(name, FALLBACK, False, True) for name in switched]
        if moved:
            reasons = [f"every table's incumbent: {len({c.table for c in pending})} table(s) whose every case ran at "
                       f"least {1 + MARGIN:.2f}x faster than under the best's values (score ~{gain:.3f}x the best's "
                       "from those numbers)"] if pending else []
            if trimmed:
                reasons.append(f"without the last merge's configuration of {trimmed} table(s), which ran a case "
                               f"under {REFUTED}x the best's speed, timed against it")
            if switched:
                reasons.append(f"the run's closing attempt (its last, by estimate): {len(switched)} table(s) slower "
                               "than the baseline on every case fall back to it")
            reason = "; ".join(reasons)
            submit({(c.table, c.knob): c.new for c in moved}, moved, MERGE, reason)
    step(tools, history, tables, found, space, context, submit)


def step(tools: Tools, history: History, tables: list[Table], found: dict[str, Incumbent], space: Space,
         context: IterationContext, submit) -> None:
    """Every table that decides a panel shape at its incumbent plus its own next untried move."""
    # a parallel run's batch: the members proposed before this one, not yet recorded, are tried too
    pending = {configuration(t.name, t.entries) for source in context.pending_sources
               for t in find_tables(source, tools.task)}
    tried = history.configurations() | {configuration(t.name, t.entries) for t in tables} | pending
    current = [replace_entries(t, found[t.name].entries) for t in tables]
    # where each table has been timed: a jump counts as tried only there (a step wrong on some other table's case,
    # or timed on another kind of device, measured no table, and a jump is the one way into its region)
    visited: dict[str, list[frozenset]] = {}
    for name, entries in history.configurations(measured=True) | pending:
        visited.setdefault(name, []).append(frozenset(entries))
    by_table: dict[str, list[Move]] = {}
    for move in single_moves(current, context.profile, space, tools.task):
        by_table.setdefault(move.table, []).append(move)
    chosen = [move for table in current
              if (move := next_move(table, by_table.get(table.name, []), tried, found[table.name].won, space,
                                    current[0], visited.get(table.name, []))) is not None]
    if not chosen:
        raise LimitsExceeded("the per-table search has tried every jump and single-knob neighbour of every table's "
                              "incumbent")
    edits = {(c.table, c.knob): c.new for t in tables for c in found[t.name].changes}
    edits |= {(m.table, knob): value for m in chosen for knob, value in m.changes().items()}
    counts: dict[str, int] = {}
    for move in chosen:
        kind = move.reason.split(":")[0] if move.rank == JUMP else f"{move.knob} {move.direction}"
        counts[kind] = counts.get(kind, 0) + 1
    reason = "each table's incumbent and its next untried move, measured on every case at once (" + ", ".join(
        f"{name} in {n}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1])) + ")"
    entries = {t.name: t.entries for t in current}
    moved = [Change(m.table, knob, entries[m.table][knob], value)
             for m in chosen for knob, value in m.changes().items()]
    submit(edits, moved, STEP, reason)
    raise LimitsExceeded("the per-table search's next step is already in the ledger")
