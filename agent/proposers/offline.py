"""The offline proposer: a coordinate search over the solution's tuning tables, needing no network.

The tables are the dict literal that ``get_config()`` returns (the general configuration) and, when the solution has
one, each dict literal of a module-level ``TIERS = [{...}, ...]`` list (per-shape overrides selected by their
``N_MIN``/``N_MAX``/``K_MIN``/``K_MAX`` range). The search space is discovered from the tables' keys, so knobs another
engineer adds later are searched as well. Each attempt changes one knob to a neighbouring value, in an order chosen
from the last profile (the weaker stratum first); once every single-knob neighbour of the best is in the ledger, it
combines two of them. It never proposes a solution already in the ledger (by sha256).
"""
from __future__ import annotations

import ast
import hashlib
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass

from agent.exceptions import LimitsExceeded, ProposerError
from agent.ledger import parse_row
from agent.proposers import IterationContext
from agent.tools import Tools

# The values worth trying per known knob; an unknown int knob tries half and double, a bool its negation.
SEARCH_SPACE: dict[str, list] = {
    "BLOCK_SIZE_N": [16, 32, 64, 128, 256],
    "BLOCK_SIZE_M": [16, 32],  # tl.dot needs at least 16 rows
    "num_warps": [2, 4, 8],
    "num_stages": [2, 3, 4, 5],
    "SPLIT_K": [1, 2, 4, 8, 16],  # from 0 (where a solution documents 0 as its own choice) the nearest is 1
    "MIN_PROGRAMS": [132, 264, 396, 528],
    "SWAP_AB": [0, 1],
    "LAYOUT": [0, 1, 2, 3],
    "UNPACK": [0, 1],
    "MAGIC": [0, 1],
    "DEQUANT": [0, 1, 2, 3],
    "SCALE_AFTER_DOT": [0, 1],
    "REDUCE_MODE": [0, 1],
    "REDUCE_BLOCK": [256, 512, 1024, 2048],
    "REDUCE_WARPS": [2, 4, 8],
    "LAUNCH": [1, 2],
    "GRID": [0, 1],
}
# one scale row per K step: BLOCK_SIZE_K must stay the quantization group; a tier's range is what it covers, not a knob
FIXED = {"BLOCK_SIZE_K", "GROUP_SIZE", "N_MIN", "N_MAX", "K_MIN", "K_MAX"}
STRATA_N = {"balanced": (4096, 1 << 62), "expert-batch": (1, 2048)}  # SPEC.md's N ranges of the two strata

# Why a move could help: (knob, direction) -> hypothesis tail.
REASONS: dict[tuple[str, int], str] = {
    ("BLOCK_SIZE_N", +1): "fewer programs re-read x and each streams a wider weight tile; expect balanced cases faster",
    ("BLOCK_SIZE_N", -1): "more programs to fill the SMs when N is small; expect expert-batch cases faster",
    ("BLOCK_SIZE_M", +1): "one M tile covers every scored M (18..32), so each weight word is read once",
    ("BLOCK_SIZE_M", -1): "smaller M tiles waste less MMA work; expect small-M cases faster if not weight-bound",
    ("num_warps", +1): "more warps hide the latency of the dequantize and the loads",
    ("num_warps", -1): "fewer warps per program cut scheduling overhead for these thin tiles",
    ("num_stages", +1): "a deeper pipeline keeps more weight loads in flight; expect the weight stream nearer copy bandwidth",
    ("num_stages", -1): "less shared memory per program lets more programs stay resident",
    ("SPLIT_K", +1): "more programs along K fill the SMs for small N; expect expert-batch cases faster",
    ("SPLIT_K", -1): "less reduction work and traffic (and fewer launches); expect balanced cases faster",
    ("MIN_PROGRAMS", +1): "more split-K programs per SM hide memory latency",
    ("MIN_PROGRAMS", -1): "fewer split-K programs cut the partial-sum traffic of the reduction",
    ("UNPACK", +1): "load the word of every row (L1 serves the repeats) instead of expanding one load by reshape",
    ("UNPACK", -1): "load each packed word once and expand it in registers",
    ("MAGIC", +1): "convert codes to fp16 through the 0x6400 exponent trick instead of an int-to-float conversion",
    ("MAGIC", -1): "a plain int-to-float conversion, in case the bit trick costs layout conversions",
    ("REDUCE_MODE", +1): "one launch and one allocation per call (atomic split-K sums, the last program's epilogue); "
                         "expect launch-bound cases faster",
    ("REDUCE_MODE", -1): "a second kernel sums the partials: no atomics, no kept accumulator",
    ("LAYOUT", +1): "words repacked closer to the order the kernel reads them (3: each nibble where the MMA operand "
                    "register holds it, so the dequantized tile skips shared memory)",
    ("LAYOUT", -1): "a simpler word layout, in case the repacked one costs the compiler a layout conversion",
    ("DEQUANT", +1): "fewer instructions per weight in the dequant (2: two codes per 32-bit operation in inline PTX; "
                     "3: one shift per word instead of three)",
    ("DEQUANT", -1): "a plainer dequant, in case the joined one costs a layout conversion",
    ("LAUNCH", +1): "integer addresses straight to the launcher's C entry: less host time per call; expect the "
                    "host-bound expert-batch cases faster and steadier",
    ("LAUNCH", -1): "tensors through the compiled kernel's launcher, which checks every pointer with the driver",
    ("GRID", +1): "stream-K: a fixed grid shares the tiles' group steps evenly, so no partial last wave of programs "
                  "idles SMs; expect the HBM-streaming balanced cases faster",
    ("GRID", -1): "one program per tile and split: no program walks across tiles, and tiles owned whole skip the "
                  "accumulator",
}
# Knob combinations a solution refuses (its plan() raises): a proposal holding one is never made. Checked per table
# on the values its shapes see (the general table updated by the table).
CONFLICTS: list[tuple[str, Callable[[dict], bool]]] = [
    ("LAYOUT 3 needs DEQUANT 1 or 2",
     lambda c: c.get("SWAP_AB", 1) == 1 and c.get("LAYOUT") == 3 and c.get("DEQUANT") == 0),
    ("GRID 1 (stream-K) needs SWAP_AB 1", lambda c: c.get("GRID") == 1 and c.get("SWAP_AB", 1) == 0),
]


def refused(tables: list) -> str | None:
    """The first conflict some table of a proposal holds, else None."""
    for table in tables:
        seen = {**tables[0].entries, **table.entries}
        for name, holds in CONFLICTS:
            if holds(seen):
                return name
    return None


class _Source(str):
    """A value kept as its source text (e.g. GROUP_SIZE)."""


def _literal(value: object) -> str:
    return str(value) if isinstance(value, _Source) else repr(value)


@dataclass
class Table:
    """One dict literal of the solution: its span in the source, its entries (value source kept) and the strata of
    the visible panel it decides."""

    name: str  # "config" or "TIERS[i]"
    start: int
    end: int
    entries: dict[str, object]
    strata: frozenset[str]

    def text(self, changes: dict[str, object]) -> str:
        return "{" + ", ".join(f'"{k}": {_literal(changes.get(k, v))}' for k, v in self.entries.items()) + "}"


def render(source: str, tables: list[Table], changes: dict[tuple[str, str], object]) -> str:
    """``source`` with every changed (table, knob) rewritten; tables are replaced from the last to the first."""
    for table in sorted(tables, key=lambda t: t.start, reverse=True):
        mine = {knob: value for (name, knob), value in changes.items() if name == table.name}
        if mine:
            source = source[: table.start] + table.text(mine) + source[table.end:]
    return source


def _span(source: str, node: ast.AST) -> tuple[int, int]:
    lines = source.splitlines(keepends=True)
    offset = [0]
    for line in lines:
        offset.append(offset[-1] + len(line))

    def at(lineno: int, col: int) -> int:  # ast columns count UTF-8 bytes
        return offset[lineno - 1] + len(lines[lineno - 1].encode()[:col].decode())

    return at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)


def _entries(source: str, node: ast.Dict) -> dict[str, object]:
    entries: dict[str, object] = {}
    for key, value in zip(node.keys, node.values):
        entries[key.value] = value.value if isinstance(value, ast.Constant) else _Source(ast.get_source_segment(source, value))
    return entries


def _string_keys(node: ast.AST) -> bool:
    return isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys)


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.LShift: operator.lshift}


def _number(node: ast.AST) -> int | None:
    """An int constant or an arithmetic of int constants (``1 << 40``, ``16 * 1024``), else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _number(node.left), _number(node.right)
        if left is not None and right is not None and (not isinstance(node.op, ast.LShift) or 0 <= right <= 64):
            return _OPERATORS[type(node.op)](left, right)
    return None


def _tier_strata(node: ast.Dict) -> frozenset[str]:
    """The strata whose N range meets the tier's [N_MIN, N_MAX] (both when the range cannot be read)."""
    bounds = {k.value: _number(v) for k, v in zip(node.keys, node.values)}
    low, high = bounds.get("N_MIN", 0), bounds.get("N_MAX", 1 << 62)
    if low is None or high is None:
        return frozenset(STRATA_N)
    return frozenset(s for s, (a, b) in STRATA_N.items() if low <= b and high >= a)


def find_tables(source: str) -> list[Table]:
    """The general table (required) and the tiers (optional), in source order of precedence: config, TIERS[0], ..."""
    tree = ast.parse(source)
    function = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_config"), None)
    returned = next((n.value for n in ast.walk(function) if isinstance(n, ast.Return)), None) if function else None
    if not _string_keys(returned):
        raise ProposerError("the offline proposer needs `def get_config(): return {\"KNOB\": value, ...}` in solution.py")
    tables = [Table("config", *_span(source, returned), _entries(source, returned), frozenset(STRATA_N))]
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id == "TIERS" and isinstance(value, ast.List):
            for index, element in enumerate(value.elts):
                if _string_keys(element):
                    entries = _entries(source, element)
                    tables.append(Table(f"TIERS[{index}]", *_span(source, element), entries, _tier_strata(element)))
    return tables


def find_table(source: str) -> Table:
    """The general table alone (get_config's dict literal)."""
    return find_tables(source)[0]


def candidate_values(knob: str, value: object, direction: int) -> list[tuple[int, int, object]]:
    """Other values of ``knob`` as (distance, 0 for the preferred direction else 1, value), nearest first."""
    if isinstance(value, bool):
        return [(1, 0, not value)]
    if not isinstance(value, int) or knob in FIXED:  # computed values (_Source) are str: never searched
        return []
    values = SEARCH_SPACE.get(knob) or [v for v in (value // 2, value * 2) if v >= 1]

    def distance(v: int) -> int:
        return abs(values.index(v) - values.index(value)) if value in values else abs(v - value)

    return sorted((distance(v), 0 if (v > value) == (direction > 0) else 1, v) for v in values if v != value)


def weaker_stratum(profile: dict | None) -> str:
    strata = (profile or {}).get("strata") or {}
    balanced, expert = strata.get("balanced"), strata.get("expert-batch")
    return "expert-batch" if balanced is not None and expert is not None and expert < balanced else "balanced"


def _order(entries: dict[str, object], stratum: str) -> tuple[list[str], int]:
    """Knobs in the order to try for a stratum, and the preferred direction of BLOCK_SIZE_N (SPLIT_K the opposite):
    small-N expert-batch cases want more programs, balanced ones wider tiles."""
    if stratum == "expert-batch":
        first, direction = ["SPLIT_K", "REDUCE_MODE", "BLOCK_SIZE_N", "MIN_PROGRAMS", "num_warps", "num_stages",
                            "BLOCK_SIZE_M"], -1
    else:  # the weight stream of the big cases is the default bottleneck
        first, direction = ["BLOCK_SIZE_N", "num_stages", "num_warps", "UNPACK", "MAGIC", "BLOCK_SIZE_M", "SPLIT_K"], +1
    order = [k for k in first if k in entries] + [k for k in entries if k not in first]
    return order, direction


@dataclass(frozen=True)
class Move:
    rank: tuple
    table: str
    knob: str
    current: object
    value: object
    reason: str


# a knob that matters only when another has some value: (the other, whether a value of it lets the knob matter)
REQUIRES: dict[str, tuple[str, Callable[[object], bool]]] = {
    "MIN_PROGRAMS": ("SPLIT_K", lambda v: v == 0),  # the solution's own split count (0) reads it
    "REDUCE_MODE": ("SPLIT_K", lambda v: v != 1), "REDUCE_BLOCK": ("SPLIT_K", lambda v: v != 1),
    "REDUCE_WARPS": ("SPLIT_K", lambda v: v != 1),
    "LAYOUT": ("SWAP_AB", lambda v: v == 1), "UNPACK": ("SWAP_AB", lambda v: v == 0),  # each orientation's own
}


def decider(tables: list[Table], stratum: str, knob: str) -> Table:
    """The table whose value of ``knob`` the stratum's shapes take: the first tier covering the stratum that sets it,
    else the general table."""
    return next((t for t in tables[1:] if stratum in t.strata and knob in t.entries), tables[0])


def decides(tables: list[Table], table: Table, knob: str) -> bool:
    """Whether changing ``knob`` in ``table`` changes anything on the panel: some stratum takes its value from this
    table (a general knob that tiers override for every stratum decides nothing), and the knob matters there."""
    other, matters = REQUIRES.get(knob, (None, None))

    def lets(stratum: str) -> bool:
        value = decider(tables, stratum, other).entries.get(other) if other else None
        return value is None or matters(value)

    return any(decider(tables, s, knob) is table and lets(s) for s in table.strata)


def single_moves(tables: list[Table], profile: dict | None) -> list[Move]:
    """Every one-knob neighbour of every table, nearest first; tables deciding the weaker stratum before the others.
    Knobs that decide nothing on the panel (see ``decides``) are left out."""
    weaker = weaker_stratum(profile)
    moves = []
    for table_rank, table in enumerate(sorted(tables, key=lambda t: (weaker not in t.strata, len(t.strata), t.start))):
        stratum = weaker if weaker in table.strata else next(iter(sorted(table.strata)), weaker)
        order, direction = _order(table.entries, stratum)
        for knob_rank, knob in enumerate(order):
            if not decides(tables, table, knob):
                continue
            preferred = {"BLOCK_SIZE_N": direction, "SPLIT_K": -direction, "MIN_PROGRAMS": -direction,
                         "BLOCK_SIZE_M": +1}.get(knob, +1)
            current = table.entries[knob]
            for distance, side, value in candidate_values(knob, current, preferred):
                reason = REASONS.get((knob, +1 if value > current else -1), "explore the neighbouring value")
                moves.append(Move((distance, table_rank, knob_rank, side), table.name, knob, current, value, reason))
    return sorted(moves, key=lambda m: m.rank)


class OfflineProposer:
    label = "offline"

    def iterate(self, context: IterationContext, tools: Tools) -> None:
        solution = f"{tools.task.candidate_dir}/solution.py"
        read = tools.read_file(solution)
        if read["returncode"]:
            raise ProposerError(read["output"])
        source = read["output"]
        tables = find_tables(source)
        ledger = tools.read_file(tools.task.ledger)["output"]
        rows = [parse_row(line) for line in ledger.splitlines() if line.startswith("| v")]
        tried = {row.get("sha256") for row in rows}
        tried |= {_sha(source), _sha(render(source, tables, {}))}  # the start, as written and as rendered
        broken = failed_moves(rows)
        singles = single_moves(tables, context.profile)
        pairs = sorted(((a, b) for a, b in itertools.combinations(singles, 2) if (a.table, a.knob) != (b.table, b.knob)
                        and not {(m.table, m.knob, str(m.value)) for m in (a, b)} & broken),
                       key=lambda pair: (pair[0].rank[0] + pair[1].rank[0], pair[0].rank[1:], pair[1].rank[1:]))
        for moves in itertools.chain(((m,) for m in singles), pairs):
            proposal = render(source, tables, {(m.table, m.knob): m.value for m in moves})
            if _sha(proposal) in tried or refused(find_tables(proposal)):
                continue
            where = {m.table for m in moves}
            summary = " + ".join(f"{'' if m.table == 'config' else m.table + ' '}{m.knob} {m.current}->{m.value}" for m in moves)
            reason = "; ".join(m.reason for m in moves)
            if len(moves) > 1:
                reason = f"every single-knob neighbour is in the ledger: combine two ({reason})"
            config = " | ".join(("" if t.name == "config" else f"{t.name}: ")
                                + ", ".join(f"{k}={_literal(v)}" for k, v in t.entries.items())
                                for t in find_tables(proposal) if t.name in where)
            tools.write_file(solution, proposal)
            tools.submit(summary, f"{reason} (config: {config})")
        raise LimitsExceeded("the offline search has tried every single-knob neighbour of the best configuration and "
                             "every pair of them")


def failed_moves(rows: list[dict]) -> set[tuple[str, str, str]]:
    """(table, knob, value) of the single-knob attempts that failed (did not compile, wrong, over the contract): a
    combination that repeats one of them is not worth an attempt."""
    broken = set()
    for row in rows:
        if row.get("correct") == "yes" and row.get("residency") in ("ok", "not run (slower)"):
            continue
        summary = row.get("summary / hypothesis", "").split("; hypothesis:")[0]
        if " + " in summary:
            continue
        words = summary.split()
        if len(words) in (2, 3) and "->" in words[-1]:
            table = words[0] if len(words) == 3 else "config"
            broken.add((table, words[-2], words[-1].split("->")[1]))
    return broken


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
