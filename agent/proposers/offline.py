"""The offline proposer: a coordinate search over the solution's tuning table, needing no network.

The search space is discovered from the keys of the dict literal that ``get_config()`` returns, so knobs another
engineer adds later (split-K, reduction modes) are searched as well. Each attempt changes one knob to a neighbouring
value, in an order chosen from the last profile, and never proposes a solution already in the ledger (by sha256).
"""
from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass

from agent.exceptions import LimitsExceeded, ProposerError
from agent.ledger import parse_row
from agent.proposers import IterationContext
from agent.tools import Tools

# The values worth trying per known knob; an unknown int knob tries half and double, a bool its negation.
SEARCH_SPACE: dict[str, list] = {
    "BLOCK_SIZE_N": [32, 64, 128, 256],
    "BLOCK_SIZE_M": [16, 32],  # tl.dot needs at least 16 rows
    "num_warps": [2, 4, 8],
    "num_stages": [2, 3, 4, 5],
    "SPLIT_K": [1, 2, 4, 8, 16],
}
FIXED = {"BLOCK_SIZE_K", "GROUP_SIZE"}  # one scale row per K step: BLOCK_SIZE_K must stay the quantization group

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
    ("SPLIT_K", -1): "less reduction work and traffic; expect balanced cases faster",
}


@dataclass
class Table:
    """The dict literal returned by get_config(): its span in the source and its entries (value source kept)."""

    start: int
    end: int
    entries: dict[str, object]  # a literal value, or ast.AST source text for anything computed

    def render(self, source: str, changes: dict[str, object]) -> str:
        items = ", ".join(f'"{k}": {_literal(changes.get(k, v))}' for k, v in self.entries.items())
        return source[: self.start] + "{" + items + "}" + source[self.end:]


class _Source(str):
    """A value kept as its source text (e.g. GROUP_SIZE)."""


def _literal(value: object) -> str:
    return str(value) if isinstance(value, _Source) else repr(value)


def find_table(source: str) -> Table:
    tree = ast.parse(source)
    function = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_config"), None)
    returned = next((n.value for n in ast.walk(function) if isinstance(n, ast.Return)), None) if function else None
    if not isinstance(returned, ast.Dict) or not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in returned.keys):
        raise ProposerError("the offline proposer needs `def get_config(): return {\"KNOB\": value, ...}` in solution.py")
    lines = source.splitlines(keepends=True)
    offset = [0]
    for line in lines:
        offset.append(offset[-1] + len(line))
    entries: dict[str, object] = {}
    for key, value in zip(returned.keys, returned.values):
        entries[key.value] = value.value if isinstance(value, ast.Constant) else _Source(ast.get_source_segment(source, value))
    start = offset[returned.lineno - 1] + len(lines[returned.lineno - 1].encode()[: returned.col_offset].decode())
    end = offset[returned.end_lineno - 1] + len(lines[returned.end_lineno - 1].encode()[: returned.end_col_offset].decode())
    return Table(start, end, entries)


def candidate_values(knob: str, value: object, direction: int) -> list[tuple[int, int, object]]:
    """Other values of ``knob`` as (distance, 0 for the preferred direction else 1, value), nearest first."""
    if isinstance(value, bool):
        return [(1, 0, not value)]
    if not isinstance(value, int) or isinstance(value, _Source) or knob in FIXED:
        return []
    values = SEARCH_SPACE.get(knob) or [v for v in (value // 2, value * 2) if v >= 1]

    def distance(v: int) -> int:
        return abs(values.index(v) - values.index(value)) if value in values else abs(v - value)

    return sorted((distance(v), 0 if (v > value) == (direction > 0) else 1, v) for v in values if v != value)


def knob_order(entries: dict[str, object], profile: dict | None) -> tuple[list[str], int]:
    """Knobs in the order to try, and the preferred direction of BLOCK_SIZE_N (SPLIT_K the opposite), chosen from
    the weaker stratum of the profile: small-N expert-batch cases want more programs, balanced ones wider tiles."""
    strata = (profile or {}).get("strata") or {}
    balanced, expert = strata.get("balanced"), strata.get("expert-batch")
    if balanced is not None and expert is not None and expert < balanced:
        first, direction = ["SPLIT_K", "BLOCK_SIZE_N", "num_warps", "num_stages", "BLOCK_SIZE_M"], -1
    else:  # the weight stream of the big cases is the default bottleneck
        first, direction = ["BLOCK_SIZE_N", "num_stages", "num_warps", "BLOCK_SIZE_M", "SPLIT_K"], +1
    order = [k for k in first if k in entries] + [k for k in entries if k not in first]
    return order, direction


class OfflineProposer:
    label = "offline"

    def iterate(self, context: IterationContext, tools: Tools) -> None:
        solution = f"{tools.task.candidate_dir}/solution.py"
        read = tools.read_file(solution)
        if read["returncode"]:
            raise ProposerError(read["output"])
        source = read["output"]
        table = find_table(source)
        ledger = tools.read_file(tools.task.ledger)["output"]
        tried = {parse_row(line).get("sha256") for line in ledger.splitlines() if line.startswith("| v")}
        tried |= {_sha(source), _sha(table.render(source, {}))}  # the start, as written and as rendered
        order, direction = knob_order(table.entries, context.profile)
        moves = []  # every single-knob move; nearest neighbours of all knobs before farther values of any
        for rank, knob in enumerate(order):
            preferred = {"BLOCK_SIZE_N": direction, "SPLIT_K": -direction, "BLOCK_SIZE_M": +1}.get(knob, +1)
            moves += [(distance, rank, side, knob, value)
                      for distance, side, value in candidate_values(knob, table.entries[knob], preferred)]
        for _, _, _, knob, value in sorted(moves, key=lambda move: move[:3]):
            current = table.entries[knob]
            proposal = table.render(source, {knob: value})
            if _sha(proposal) in tried:
                continue
            reason = REASONS.get((knob, +1 if value > current else -1), "explore the neighbouring value")
            config = ", ".join(f"{k}={_literal(v)}" for k, v in dict(table.entries, **{knob: value}).items())
            tools.write_file(solution, proposal)
            tools.submit(f"{knob} {current}->{value}", f"{reason} (config: {config})")
        raise LimitsExceeded("the offline search has tried every single-knob neighbour of the best configuration")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
