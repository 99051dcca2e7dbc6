"""The offline proposer: a coordinate search over the solution's tuning tables, needing no network.

Every fact about the task comes from its manifest (``agent.config.Task``): its strata, the case dimensions tiers key
on (``tier_dims``), sample cases, the check stages and the ledger's columns. The tables are the dict literal that
``get_config()`` returns (the general configuration) and, when the solution has one, each dict literal of a
module-level ``TIERS = [{...}, ...]`` list (per-shape overrides selected by their ``<DIM>_MIN``/``<DIM>_MAX`` range
in each of the task's tier dimensions; a tier without a dimension's keys holds any value of it; the first tier that
holds a shape wins). The knobs it may move, and to which values, are the solution's search space
(``agent.proposers.space``: its SEARCH_SPACE, else Triton's launch knobs). Each attempt moves one knob of one table
to a neighbouring declared value (or adds a tier for the weaker stratum), in an order chosen from the last profile
(the weaker stratum first); once every single move of the best is in the ledger, it combines two. It never proposes
a solution already in the ledger (by sha256), except on a GPU one that only the interpreter or another GPU model ran,
correctly: that one was never timed here (``evaluated_here``).

A shape is ``(stratum, value of each tier dimension in the task's order)``: the profile's cases, else the task's
``sample_cases``.

Speed counts only where the verifier can measure it: when the best's profile or the last verdict finds cases of a
stratum host-bound (GPU only), the stratum is the focus and the next moves are the space's ``device_bound`` moves in
the tables deciding its shapes (or a new tier for it), which give each call more GPU time than its host cost.
"""
from __future__ import annotations

import ast
import itertools
import json
from dataclasses import dataclass, field, replace
from typing import Callable

from agent.config import Task
from agent.exceptions import LimitsExceeded, ProposerError
from agent.ledger import ATTEMPT_ROW, identity, legacy_sha256, parse_row, solution_files
from agent.proposers import IterationContext
from agent.proposers.space import (Knob, Space, assigned, find_get_config, number, range_keys, read_space,
                                   same_value, string_keys)
from agent.tools import Tools

OPEN_END = 1 << 40  # how tiers write "no upper bound"
NOT_MEASURED = " (not yet measured on a GPU)"
Shape = tuple  # (stratum, value of each of the task's tier dimensions, in the task's order)


class _Source(str):
    """A value kept as its source text (e.g. GROUP_SIZE): never searched."""


def _literal(value: object) -> str:
    return str(value) if isinstance(value, _Source) else repr(value)


@dataclass
class Table:
    """One dict literal of the solution (or a tier to insert): its span, its entries (value source kept), each value's
    span, the strata its ranges meet and, for a tier, the range it covers in each of the task's tier dimensions, in
    their order (None: unknown, so any value)."""

    name: str  # "config" or "TIERS[i]"
    start: int
    end: int  # start == end: a new tier, inserted there as before + text + after
    entries: dict[str, object]
    strata: frozenset[str]
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    ranges: dict[str, tuple[int, int] | None] = field(default_factory=dict)  # tier dim -> (low, high); {}: config
    label: str = ""  # how a summary names it: "" (config), "TIERS[i]", "new tier X lo..hi"
    before: str = ""
    after: str = ""

    def holds(self, shape: Shape) -> bool:
        """Whether a tier's ranges hold a shape (stratum, value of each tier dimension), as the solution's plan()
        matches tiers."""
        return all(bounds is None or bounds[0] <= value <= bounds[1]
                   for bounds, value in zip(self.ranges.values(), shape[1:]))

    def text(self, changes: dict[str, object]) -> str:
        items = {**self.entries, **changes}.items()
        return self.before + "{" + ", ".join(f"{json.dumps(k)}: {_literal(v)}" for k, v in items) + "}" + self.after


def render(source: str, tables: list[Table], changes: dict[tuple[str, str], object]) -> str:
    """``source`` with every changed (table, knob) value rewritten (the rest of the text kept) and a new tier
    inserted when one of its knobs is changed."""
    edits = []
    for table in tables:
        mine = {knob: value for (name, knob), value in changes.items() if name == table.name}
        if mine and table.start == table.end:
            edits.append((table.start, table.end, table.text(mine)))
        elif mine:
            edits += [(*table.spans[knob], _literal(value)) for knob, value in mine.items()]
    for start, end, text in sorted(edits, key=lambda edit: edit[0], reverse=True):
        source = source[:start] + text + source[end:]
    return source


def _locator(source: str):
    lines = source.splitlines(keepends=True)
    offset = list(itertools.accumulate((len(line) for line in lines), initial=0))

    def at(lineno: int, col: int) -> int:  # ast columns count UTF-8 bytes
        return offset[lineno - 1] + len(lines[lineno - 1].encode()[:col].decode())

    return lambda node: (at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset))


def _table(name: str, node: ast.Dict, locate, source: str, **more) -> Table:
    entries, spans = {}, {}
    for key, value in zip(node.keys, node.values):
        spans[key.value] = locate(value)
        kept = isinstance(value, ast.Constant)
        entries[key.value] = value.value if kept else _Source(ast.get_source_segment(source, value))
    return Table(name, *locate(node), entries, spans=spans, **more)


def _high(high: int | None) -> int:
    return OPEN_END if high is None else min(high, OPEN_END)


def _strata(ranges: dict[str, tuple[int, int] | None], task: Task) -> frozenset[str]:
    """The strata whose ranges overlap ``ranges`` in every dimension the stratum constrains (a dimension ``ranges``
    does not bound, or bounds unknowably, overlaps)."""
    return frozenset(name for name, constrained in task.strata.items()
                     if all(ranges.get(dim) is None or ranges[dim][0] <= _high(high) and ranges[dim][1] >= low
                            for dim, (low, high) in constrained.items()))


def find_tables(source: str, task: Task) -> list[Table]:
    """The general table (required) and the tiers (optional), in order of precedence: config, TIERS[0], ..."""
    tree, locate = ast.parse(source), _locator(source)
    tables = [_table("config", find_get_config(tree)[1], locate, source, strata=frozenset(task.strata))]
    tiers = assigned(tree, "TIERS")
    for index, element in enumerate(tiers.elts if isinstance(tiers, ast.List) else []):
        if string_keys(element):
            bounds = {k.value: number(v) for k, v in zip(element.keys, element.values)}
            ranges: dict[str, tuple[int, int] | None] = {}
            for dim in task.tier_dims:
                min_key, max_key = range_keys([dim])
                low, high = bounds.get(min_key, -OPEN_END), bounds.get(max_key, OPEN_END)  # no key: any value
                ranges[dim] = (low, high) if low is not None and high is not None else None  # None: not a literal
            tables.append(_table(f"TIERS[{index}]", element, locate, source, label=f"TIERS[{index}]",
                                 strata=_strata(ranges, task), ranges=ranges))
    return tables


def find_table(source: str, task: Task) -> Table:
    """The general table alone (get_config's dict literal)."""
    return find_tables(source, task)[0]


def _tier_ranges(stratum: str, task: Task) -> dict[str, tuple[int, int]] | None:
    """A new tier's ranges for the stratum: the stratum's range in each tier dimension it constrains (within the
    dimension's domain), the domain in the others; None when it constrains no tier dimension (a tier would hold
    every shape)."""
    constrained = task.strata[stratum]
    if not any(dim in constrained for dim in task.tier_dims):
        return None
    ranges = {}
    for dim, (domain_low, domain_high) in task.tier_dims.items():
        low, high = constrained.get(dim, (domain_low, domain_high))
        lows = [bound for bound in (low, domain_low) if bound is not None]
        ranges[dim] = (max(lows) if lows else -OPEN_END, min(_high(high), _high(domain_high)))
    return ranges


def new_tier(source: str, tables: list[Table], stratum: str, task: Task) -> Table | None:
    """A tier for the stratum's whole range (``_tier_ranges``), to append at the end of TIERS (or, where the solution
    names TIERS but assigns none, in a new ``TIERS = [...]`` right after get_config); None when a tier covers that
    range already, the stratum constrains no tier dimension or the solution does not use TIERS."""
    ranges = _tier_ranges(stratum, task)
    if ranges is None or any(all(t.ranges.get(dim) and t.ranges[dim][0] <= low and t.ranges[dim][1] >= high
                                 for dim, (low, high) in ranges.items()) for t in tables[1:]):
        return None
    tree, locate = ast.parse(source), _locator(source)
    tiers = assigned(tree, "TIERS")
    if isinstance(tiers, ast.List) and tiers.elts:
        last_start, last_end = locate(tiers.elts[-1])
        close = locate(tiers)[1] - 1
        indent = source[source.rfind("\n", 0, last_start) + 1:last_start]
        indent = indent if indent.isspace() else "    "
        rest = source[last_end:close]
        if not rest.lstrip(" \t").startswith(","):
            at, before, after = last_end, ",\n" + indent, ""
        else:
            comma = last_end + len(rest) - len(rest.lstrip(" \t"))
            newline = source.find("\n", comma, close)  # after a comment on the last tier's line
            at, before, after = (newline, "\n" + indent, ",") if newline >= 0 else (comma + 1, " ", ",")
    elif isinstance(tiers, ast.List):
        at, before, after = locate(tiers)[1] - 1, "\n    ", ",\n"
    elif tiers is None and any(isinstance(n, ast.Name) and n.id == "TIERS" or isinstance(n, ast.Constant)
                               and n.value == "TIERS" for n in ast.walk(tree)):
        line_end = source.find("\n", locate(find_get_config(tree)[0])[1])
        at = line_end + 1 if line_end >= 0 else len(source)
        before, after = ("\n\n" if line_end >= 0 else "\n\n\n") + "TIERS = [\n    ", ",\n]\n"
    else:
        return None
    name = f"TIERS[{len(tiers.elts) if tiers else 0}]"
    entries: dict[str, object] = {}
    for dim, (low, high) in ranges.items():
        min_key, max_key = range_keys([dim])
        entries |= {min_key: low, max_key: _Source("1 << 40") if high == OPEN_END else high}
    label = ", ".join(f"{dim.upper()} {low}..{'1<<40' if high == OPEN_END else high}"
                      for dim, (low, high) in ranges.items() if dim in task.strata[stratum])
    return Table(name, at, at, entries, _strata(ranges, task), ranges=ranges, before=before, after=after,
                 label=f"new tier {label}")


def _holds(value: object, allowed: list) -> bool:
    return value is not None and not isinstance(value, _Source) and any(same_value(value, a) for a in allowed)


def admits(allowed: list, value: object) -> bool:
    """Whether an only_when alternative's ``allowed`` values admit ``value``: an unset or computed value does not
    restrict; True is not 1."""
    return value is None or isinstance(value, _Source) or any(same_value(value, a) for a in allowed)


def refused(tables: list[Table], space: Space, changes: dict[tuple[str, str], object] | None = None) -> str | None:
    """The reason of the first refused combination some table holds with ``changes`` made (its effective values: the
    general table updated by the table), else None."""
    changes = changes or {}
    effective = [{**t.entries, **{k: v for (name, k), v in changes.items() if name == t.name}} for t in tables]
    for seen in ({**effective[0], **entries} for entries in effective):
        for when, reason in space.refused:
            if all(_holds(seen.get(knob), allowed) for knob, allowed in when.items()):
                return reason
    return None


def neighbours(knob: Knob, current: object) -> list[tuple[int, int, object]]:
    """The other declared values as (index distance, 0 toward later values else 1, value), nearest first; a current
    value the space does not declare sits where its number would, else before them all."""
    if isinstance(current, _Source):  # computed values are never searched
        return []
    values = knob.values
    if current in values:
        here = values.index(current)
        return sorted((abs(i - here), 0 if i > here else 1, v) for i, v in enumerate(values) if i != here)
    numbers = all(type(v) in (int, float) for v in (*values, current))
    gap = sum(v < current for v in values) if numbers else 0
    return sorted((i - gap + 1, 0, v) if i >= gap else (gap - i, 1, v) for i, v in enumerate(values))


def weaker_stratum(profile: dict | None, task: Task) -> str:
    """The stratum with the lowest score in the profile's "strata"; the first of the task's strata when a score is
    missing, and the first in the task's order among equal lowest scores."""
    scores = (profile or {}).get("strata") or {}
    names = list(task.strata)
    if not all(type(scores.get(name)) in (int, float) for name in names):
        return names[0]
    return min(names, key=lambda name: scores[name])  # min keeps the first of equal ones


@dataclass(frozen=True)
class Move:
    rank: tuple  # (index distance, table rank, knob rank, side: 0 toward later declared values, else 1)
    table: str
    knob: str
    current: object
    value: object
    reason: str
    label: str = ""
    also: tuple = ()  # a jump's other (knob, value) pairs (agent.proposers.per_table); empty for a one-knob move

    def changes(self) -> dict[str, object]:
        """Knob -> value of everything the move sets."""
        return {self.knob: self.value, **dict(self.also)}

    @property
    def direction(self) -> str:
        """Its way along the knob's declared values: "up" toward later ones, "down" toward earlier ones."""
        return "up" if self.rank[3] == 0 else "down"

    def __str__(self) -> str:
        return f"{self.label + ' ' if self.label else ''}{self.knob} {self.current}->{self.value}"


def shapes(profile: dict | None, task: Task) -> tuple[Shape, ...]:
    """The shapes (stratum, value of each tier dimension) of the profile's cases, else of the task's sample cases
    (each in the stratum that holds it): what a table decides is judged on these."""
    dims = tuple(task.tier_dims)
    cases = [case.get("case") or {} for case in (profile or {}).get("cases") or []]
    found = {(c["stratum"], *(c[d] for d in dims)) for c in cases
             if c.get("stratum") in task.strata and all(d in c for d in dims)}
    if found:
        return tuple(sorted(found))
    samples = ((task.stratum_of(c), c) for c in task.sample_cases if all(d in c for d in dims))
    return tuple(dict.fromkeys((stratum, *(c[d] for d in dims)) for stratum, c in samples if stratum is not None))


def decider(tables: list[Table], shape: Shape, knob: str) -> Table:
    """The table whose value of ``knob`` a shape takes, as plan() chooses: the first tier that holds the shape when
    it sets the knob, else the general table."""
    tier = next((t for t in tables[1:] if t.holds(shape)), None)
    return tier if tier is not None and knob in tier.entries else tables[0]


def decides(tables: list[Table], table: Table, knob: str, space: Space, cases) -> bool:
    """Whether changing ``knob`` in ``table`` changes anything for the shapes ``cases``: some shape takes its value
    from this table (a general knob that tiers override everywhere decides nothing), and the knob matters there (one
    of its only_when alternatives holds on the values that shape takes; a knob no table holds does not restrict)."""

    def matters(shape: Shape) -> bool:
        return not space.only_when.get(knob) or any(
            all(admits(allowed, value) for other, allowed in alternative.items()
                for value in [decider(tables, shape, other).entries.get(other)])
            for alternative in space.only_when[knob])

    return any(decider(tables, shape, knob) is table and matters(shape) for shape in cases)


def single_moves(tables: list[Table], profile: dict | None, space: Space, task: Task, tier: Table | None = None,
                 focus: str | None = None) -> list[Move]:
    """Every one-knob neighbour of every table (and of ``tier``, a new tier for the focus stratum), nearest first;
    tables deciding the focus stratum (by default the weaker one) before the others, then the space's knob order.
    Knobs that decide nothing for the panel's shapes (see ``decides``) are left out; a new tier takes a knob only where
    the general table's value of it also serves a shape of another stratum (else moving the general table is the same
    attempt). A move's reason is its knob's for the direction it moves (``Knob.reason``)."""
    weaker, general, cases = focus or weaker_stratum(profile, task), tables[0], shapes(profile, task)
    ranked = sorted(tables + ([tier] if tier else []), key=lambda t: (weaker not in t.strata, len(t.strata), t.start))
    shadowed = tier is not None and any(t.holds(shape) for t in tables[1:] for shape in cases if shape[0] == weaker)
    moves = []
    for table_rank, table in enumerate(ranked):
        for knob_rank, (knob, declared) in enumerate(space.knobs.items()):
            if table is tier:
                if knob not in general.entries:
                    continue
                trial = replace(tier, entries={**tier.entries, knob: general.entries[knob]})
                if not decides(tables + [trial], trial, knob, space, cases) or not any(
                        decider(tables, shape, knob) is general for shape in cases if shape[0] != weaker):
                    continue
                only = "that no earlier tier holds" if shadowed else "only"
                current, why = general.entries[knob], f", for the {weaker} shapes {only}"
            elif knob in table.entries and decides(tables, table, knob, space, cases):
                current, why = table.entries[knob], ""
            else:
                continue
            for distance, side, value in neighbours(declared, current):
                reason = declared.reason("up" if side == 0 else "down") + why
                reason += NOT_MEASURED if value in declared.unmeasured else ""
                rank = (distance, table_rank, knob_rank, side)
                moves.append(Move(rank, table.name, knob, current, value, reason, table.label))
    return sorted(moves, key=lambda m: m.rank)


def unstable_strata(profile: dict | None, task: Task) -> dict[str, list[str]]:
    """Stratum -> names of the best's cases measured unstable (host-bound on a GPU: selfcheck cases whose ``stable``
    is False). The best's own measurement, not the last attempt's: an attempt reverted as host-bound left the best as
    it was, and slowing a steady best gains nothing. Empty without a GPU."""
    found: dict[str, list[str]] = {}
    named = [((c.get("case") or {}).get("stratum"), (c.get("case") or {}).get("name"))
             for c in (profile or {}).get("cases") or [] if c.get("stable") is False]
    for stratum, name in named:
        if stratum in task.strata and name not in found.setdefault(stratum, []):
            found[stratum].append(name)
    return found


def device_bound_moves(tables: list[Table], tier: Table | None, moves: list[Move], profile: dict | None,
                       space: Space, task: Task, stratum: str, names: list[str]) -> list[Move]:
    """The moves of ``moves`` that give each call of the stratum's shapes more GPU time: a knob the space marks
    ``device_bound``, moved in its direction, in a table that decides some shape of the stratum (or in the new tier,
    when it is the stratum's), in their order; each hypothesis says why it comes first."""
    held = [shape for shape in shapes(profile, task) if shape[0] == stratum]
    cases = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    found = []
    for move in moves:
        if space.device_bound.get(move.knob) != move.direction:
            continue
        table = tier if tier is not None and move.table == tier.name else next(t for t in tables
                                                                               if t.name == move.table)
        if stratum in table.strata if table is tier else decides(tables, table, move.knob, space, held):
            found.append(replace(move, reason=(
                f"the {stratum} cases {cases} are host-bound (GPU time per call below the host cost's margin, so the "
                f"verifier's dispersion gate fails them): {move.knob} {move.direction} gives each call more GPU time; "
                + move.reason)))
    return found


class OfflineProposer:
    label = "offline"

    def iterate(self, context: IterationContext, tools: Tools) -> None:
        task = tools.task
        solution = f"{task.candidate_dir}/solution.py"
        read = tools.read_file(solution)
        if read["returncode"]:
            raise ProposerError(read["output"])
        source = read["output"]
        try:
            tables, space = find_tables(source, task), read_space(source, range_keys(task.tier_dims))
        except ProposerError as exc:  # the solution's own tables or space: every later iteration would fail alike
            raise LimitsExceeded(f"the offline search cannot read {solution}: {exc}") from exc
        unstable = unstable_strata(context.profile, task)
        focus = next(iter(unstable), None) or weaker_stratum(context.profile, task)  # an unmeasurable one scores 0
        tier = new_tier(source, tables, focus, task)
        everything = tables + ([tier] if tier else [])
        ledger = tools.read_file(task.ledger)["output"]
        rows = [parse_row(line, task) for line in ledger.splitlines() if ATTEMPT_ROW.match(line)]
        # a proposal is tried when a row holds its identity (all its files: solution.py as proposed, the helpers as
        # they are) or, for rows from before identities hashed every file, solution.py's own hash
        helpers = {path.name: path.read_bytes() for path in solution_files(tools.candidate)
                   if path.name != "solution.py"}
        gpu, device = run_on_gpu(context), (context.profile or {}).get("device")
        recorded: dict[str, list[str]] = {}
        for row in rows:
            recorded.setdefault(row.get("sha256"), []).append(row.get("version"))
        fixed = {legacy_sha256(source.encode())} | set(context.pending)

        def tried(sha: str) -> bool:  # a verdict is read only for a proposal the ledger holds
            return sha in fixed or any(evaluated_here(lambda: read_verdict(tools, task, version), gpu, device,
                                                      task.ledger_device) for version in recorded.get(sha, ()))

        def known(proposal: str) -> bool:
            return (tried(legacy_sha256(proposal.encode()))
                    or tried(identity({**helpers, "solution.py": proposal.encode()})))
        if space.strategy == "per-table":
            from agent.proposers import per_table  # it builds on this module's tables and moves

            per_table.iterate(context, tools, source, tables, space, known)
        broken = failed_moves(rows, task)
        singles = single_moves(tables, context.profile, space, task, tier, focus)
        first: dict[tuple, Move] = {}
        for stratum, names in unstable.items():
            for move in device_bound_moves(tables, tier, singles, context.profile, space, task, stratum, names):
                first.setdefault((move.table, move.knob, move.value), move)
        singles = list(first.values()) + [m for m in singles if (m.table, m.knob, m.value) not in first]
        pairs = sorted(((a, b) for a, b in itertools.combinations(singles, 2) if (a.table, a.knob) != (b.table, b.knob)
                        and not {(m.label or "config", m.knob, str(m.value)) for m in (a, b)} & broken),
                       key=lambda pair: (pair[0].rank[0] + pair[1].rank[0], pair[0].rank[1:], pair[1].rank[1:]))
        for moves in itertools.chain(((m,) for m in singles), pairs):
            changes = {(m.table, m.knob): m.value for m in moves}
            proposal = render(source, everything, changes)
            if known(proposal) or refused(everything, space, changes):
                continue
            where = {m.table for m in moves}
            reason = "; ".join(m.reason for m in moves)
            if len(moves) > 1:
                reason = f"every single-knob neighbour is in the ledger: combine two ({reason})"
            config = " | ".join(("" if t.name == "config" else f"{t.name}: ")
                                + ", ".join(f"{k}={_literal(v)}" for k, v in t.entries.items())
                                for t in find_tables(proposal, task) if t.name in where)
            tools.write_file(solution, proposal)
            tools.submit(" + ".join(map(str, moves)), f"{reason} (config: {config})")
        raise LimitsExceeded("the offline search has tried every single-knob neighbour of the best configuration and "
                             "every pair of them")


def read_verdict(tools: Tools, task: Task, version: str | None) -> dict:
    """A recorded version's verdict.json ({} where it is missing or unreadable)."""
    if not version:
        return {}
    read = tools.read_file(f"{task.versions_dir}/{version}/verdict.json")
    try:
        verdict = json.loads(read["output"]) if not read["returncode"] else {}
    except ValueError:
        return {}
    return verdict if isinstance(verdict, dict) else {}


def run_on_gpu(context: IterationContext) -> bool:
    """Whether the search's run evaluates on a GPU: the run says (``context.gpu``), else the best's profile does
    (False where neither says: the interpreter's rule, everything recorded counts as tried)."""
    if context.gpu is not None:
        return context.gpu
    return (context.profile or {}).get("interpreted") is False


def evaluated_here(verdict: Callable[[], dict], gpu: bool, device: str | None = None,
                   ledger_device: str | None = None) -> bool:
    """Whether a recorded attempt counts as tried for a search on a GPU (``gpu``; of the model ``device``, where
    known) or under the interpreter; its ``verdict`` (read only on a GPU). Under the interpreter every attempt does
    (running one again adds nothing). On a GPU every attempt does but one that ran correctly without being timed here:
    only under the interpreter, or on another GPU model (the verdict's ``device``, else ``ledger_device``, the task's
    model for verdicts that name none). A wrong one stays tried (a kernel wrong on one device is not timed on
    another), and so does one whose verdict is missing or does not say where it ran."""
    if not gpu:
        return True
    found = verdict()
    if not found or found.get("correct") is not True:
        return True
    if found.get("gpu_timing", True) is False:
        return False
    return same_model(found, device, ledger_device)


def same_model(verdict: dict, device: str | None, ledger_device: str | None) -> bool:
    """Whether a GPU-timed verdict was timed on the GPU model ``device``: its own ``device``, else ``ledger_device``
    (the task's model for verdicts that name none); true where either side is unknown."""
    recorded = verdict.get("device") or ledger_device
    return device is None or recorded is None or recorded == device


def failed_moves(rows: list[dict], task: Task) -> set[tuple[str, str, str]]:
    """(table, knob, value) of the single-knob attempts that failed (did not compile, wrong, or a check of the task
    found it wanting: a check column of its row, one of ``task.checks`` the ledger shows, neither "ok..." nor "not
    run..."): a combination that repeats one of them is not worth an attempt. The table is "config", "TIERS[i]" or
    "new tier X lo..hi", as the summary names it."""
    checks = [check for check in task.checks if check in task.columns]
    broken = set()
    for row in rows:
        if row.get("correct") == "yes" and all(row.get(c, "").startswith(("ok", "not run")) for c in checks):
            continue
        summary = row.get("summary / hypothesis", "").split("; hypothesis:")[0]
        words = summary.split()
        if " + " not in summary and len(words) >= 2 and "->" in words[-1]:
            broken.add((" ".join(words[:-2]) or "config", words[-2], words[-1].split("->")[1]))
    return broken
