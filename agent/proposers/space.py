"""The search space of a solution: which knobs of its tuning tables the offline proposer may move, and to what.

The space is the solution's own data, read with ``ast`` (candidate code is never imported): a module-level literal
next to the tables::

    SEARCH_SPACE = {
        "knobs": {"KNOB": {"values": [...], "reason": "one line", "unmeasured": [...]},
                  "OTHER": {"values": [...], "reason": {"up": "one line", "down": "one line"}}, ...},
        "only_when": {"KNOB": [{"OTHER": [values that let KNOB matter], ...}, ...]},
        "refused": [{"when": {"KNOB": [values], ...}, "reason": "..."}],
        "device_bound": {"KNOB": "up" | "down"},
        "strategy": "coordinate" | "per-table",
        "jumps": [{"to": {"KNOB": value, "OTHER": value, ...}, "reason": "one line"}, ...],
    }

- ``knobs`` (required, non-empty): the knobs to search, in the order to try them. ``values`` is a non-empty list of
  distinct literals (numbers, strings, True/False, None) in order (a move goes to a neighbouring value of this
  list); ``reason`` is the one-line hypothesis a move of this knob tests: a string for moves either way, or
  ``{"up": "...", "down": "..."}``, the hypothesis of a move toward later values of the list ("up") and of one toward
  earlier values ("down"); a move quotes the reason of its direction. ``unmeasured`` (optional) names those of
  ``values`` not yet measured on a GPU, which a proposal says. A knob is never a tier's range key (``<DIM>_MIN`` or
  ``<DIM>_MAX`` of a dimension the task's tiers key on: ``range_keys``).
- ``only_when`` (optional): for a declared knob, a non-empty list of alternatives ``{"OTHER": [values], ...}``; the
  knob matters (is worth moving) only where one alternative holds on the values a shape takes.
- ``refused`` (optional): combinations that the solution's ``plan()`` refuses, each with its reason; no proposal
  holds one.
- ``device_bound`` (optional): for a declared knob, the direction along its ``values`` list ("up": toward later
  values, "down": toward earlier ones) in which each call takes more GPU time without otherwise costing
  correctness. When cases of a stratum are host-bound (their GPU time does not clear the host cost, so the
  verifier's dispersion gate fails them), the next move is such a move in the table deciding those shapes.
- ``strategy`` (optional): "coordinate" (the default: one knob of one table per attempt, agent.proposers.offline) or
  "per-table" (a move of every table at once, each credited by the cases it holds: agent.proposers.per_table), for a
  solution with a table per panel shape.
- ``jumps`` (optional, per-table strategy only): starting points of regions that one-knob moves do not reach from
  one another, such as a second kernel path whose good tiles are bad ones for the first. ``to`` sets one or more
  declared knobs at once, each to one of its values, in no refused combination; ``reason`` is the hypothesis. A
  table tries each jump once, as one move, before its one-knob neighbours (unless a direction just won for it), and
  never where a knob the jump sets would not matter (``only_when``); the search then walks from wherever the
  measurements leave it.

Conditions name declared knobs or keys of ``get_config()``'s dict. Plain data only, except that int arithmetic
(``1 << 40``, ``16 * 1024``) is folded first. Anything else raises ``ProposerError`` saying what is wrong and where.

Without ``SEARCH_SPACE``, the space is the generic one of Triton's launch knobs among the keys ``get_config()``
returns: each ``BLOCK_SIZE_*`` whose value is an int literal (16 to 256, powers of two), ``num_warps`` and
``num_stages``, each with a reason per direction.
"""
from __future__ import annotations

import ast
import copy
import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.exceptions import ProposerError

DIRECTIONS = ("up", "down")  # along a knob's declared values: toward later ones, toward earlier ones
# how the offline proposer searches: one knob of one table per attempt (agent.proposers.offline), or every table at once
# with per-case credit (agent.proposers.per_table)
STRATEGIES = ("coordinate", "per-table")


def range_keys(dims: Iterable[str]) -> tuple[str, ...]:
    """The keys of a tier's range (the TIERS protocol, never a knob) for the case dimensions tiers key on (a task's
    ``tier_dims``, in order): ``<DIM>_MIN`` and ``<DIM>_MAX`` of each."""
    return tuple(f"{dim.upper()}_{end}" for dim in dims for end in ("MIN", "MAX"))


@dataclass(frozen=True)
class Knob:
    values: tuple
    up: str
    """The hypothesis a move toward later values of ``values`` tests."""
    down: str
    """The hypothesis a move toward earlier values tests."""
    unmeasured: tuple = ()

    def reason(self, direction: str) -> str:
        """The hypothesis of a move in ``direction`` ("up" or "down")."""
        return self.up if direction == "up" else self.down


@dataclass(frozen=True)
class Space:
    knobs: dict[str, Knob]  # in the order to try
    only_when: dict[str, list[dict[str, list]]] = field(default_factory=dict)
    refused: list[tuple[dict[str, list], str]] = field(default_factory=list)
    device_bound: dict[str, str] = field(default_factory=dict)  # knob -> "up" or "down" along its values
    strategy: str = "coordinate"  # STRATEGIES
    jumps: list[tuple[dict, str]] = field(default_factory=list)  # (knob -> value, reason), in the order to try


# Triton launch knowledge, for a solution that declares no space; its own switches are for it to declare.
BLOCK_VALUES = (16, 32, 64, 128, 256)  # tl.dot needs at least 16 along each dimension
BLOCK_UP = "a larger {} tile reuses each load across more outputs"
BLOCK_DOWN = "a smaller {} tile makes more programs for the SMs"
LAUNCH_KNOBS = {
    "num_warps": Knob((2, 4, 8), "more warps per program hide load latency",
                      "fewer warps per program leave each thread more registers"),
    "num_stages": Knob((2, 3, 4, 5), "a deeper pipeline keeps more loads in flight",
                       "a shallower pipeline leaves shared memory for more resident programs"),
}

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.LShift: operator.lshift}


def number(node: ast.AST) -> int | None:
    """An int constant or an arithmetic of int constants (``1 << 40``, ``16 * 1024``), else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = number(node.left), number(node.right)
        if left is not None and right is not None and (not isinstance(node.op, ast.LShift) or 0 <= right <= 64):
            return _OPERATORS[type(node.op)](left, right)
    return None


def string_keys(node: ast.AST) -> bool:
    return isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str)
                                              for k in node.keys)


def assigned(tree: ast.Module, name: str) -> ast.AST | None:
    """The value of the last module-level ``name = ...``, else None."""
    found = None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
            found = node.value
    return found


def find_get_config(tree: ast.Module) -> tuple[ast.FunctionDef, ast.Dict]:
    """``def get_config()`` and the dict literal it returns (string keys), else ProposerError."""
    function = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_config"), None)
    returned = next((n.value for n in ast.walk(function) if isinstance(n, ast.Return)), None) if function else None
    if not string_keys(returned):
        raise ProposerError('the offline proposer needs `def get_config(): return {"KNOB": value, ...}` in solution.py')
    return function, returned


def read_space(source: str, ranges: Iterable[str]) -> Space:
    """The solution's SEARCH_SPACE, checked (ProposerError says what is wrong and where), or the generic space of
    Triton's launch knobs for the keys get_config() returns. ``ranges`` are the tier range keys no knob may be (the
    task's: ``range_keys(task.tier_dims)``)."""
    tree = ast.parse(source)
    returned = find_get_config(tree)[1]
    general = {key.value: value for key, value in zip(returned.keys, returned.values)}  # key -> its value's node
    node = assigned(tree, "SEARCH_SPACE")
    if node is None:
        launch = [k for k, v in general.items() if k in LAUNCH_KNOBS or k.startswith("BLOCK_SIZE_") and _int_literal(v)]
        return Space({k: LAUNCH_KNOBS.get(k) or Knob(BLOCK_VALUES, BLOCK_UP.format(k), BLOCK_DOWN.format(k))
                      for k in launch})
    space = _plain_data(node)
    _dict("", space, ("knobs",), ("only_when", "refused", "device_bound", "strategy", "jumps"))
    strategy = space.get("strategy", "coordinate")
    if strategy not in STRATEGIES:
        raise _fail("strategy", f"must be one of {', '.join(map(repr, STRATEGIES))}; got {space['strategy']!r}")
    knobs = _knobs(space["knobs"], tuple(ranges))
    names = set(knobs) | set(general)
    only_when = _only_when(space.get("only_when", {}), knobs, names)
    refused = _refused(space.get("refused", []), names)
    jumps = _jumps(space.get("jumps", []), knobs, refused)
    if jumps and strategy != "per-table":
        raise _fail("jumps", 'are taken by the per-table search only: declare "strategy": "per-table", or leave '
                             "them out")
    return Space(knobs, only_when, refused, _device_bound(space.get("device_bound", {}), knobs), strategy, jumps)


def _int_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _plain_data(node: ast.AST) -> object:
    """SEARCH_SPACE's value, its int arithmetic folded, by ``ast.literal_eval``."""

    class Fold(ast.NodeTransformer):
        def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
            value = number(node)
            return self.generic_visit(node) if value is None else ast.copy_location(ast.Constant(value), node)

    try:
        return ast.literal_eval(Fold().visit(copy.deepcopy(node)))
    except (ValueError, TypeError, SyntaxError) as exc:
        raise ProposerError(f"SEARCH_SPACE (line {node.lineno}) must be plain data (dicts, lists, strings, numbers; "
                            f"int arithmetic such as 1 << 40): {exc}") from None


def _knobs(declared_knobs: object, ranges: tuple[str, ...]) -> dict[str, Knob]:
    if not isinstance(declared_knobs, dict) or not declared_knobs:
        raise _fail("knobs", 'must be a non-empty dict {"KNOB": {"values": [...], "reason": "..."}, ...}')
    knobs = {}
    for name, declared in declared_knobs.items():
        where = f"knobs[{name!r}]"
        if not isinstance(name, str) or name in ranges:
            raise _fail(where, f"is not a knob name (a string other than the tier range keys {', '.join(ranges)})")
        _dict(where, declared, ("values", "reason"), ("unmeasured",))
        values = _values(f"{where}['values']", declared["values"])
        up, down = _reasons(f"{where}['reason']", declared["reason"])
        unmeasured = _values(f"{where}['unmeasured']", declared["unmeasured"]) if "unmeasured" in declared else ()
        if any(v not in values for v in unmeasured):
            raise _fail(f"{where}['unmeasured']", f"must hold only its values {list(values)}, not {list(unmeasured)}")
        knobs[name] = Knob(values, up, down, unmeasured)
    return knobs


def _reasons(where: str, reason: object) -> tuple[str, str]:
    """A knob's reason as (up, down): one string for both directions, or a dict of both."""
    if isinstance(reason, dict) and set(reason) == set(DIRECTIONS) and all(
            isinstance(reason[d], str) and reason[d].strip() for d in DIRECTIONS):
        return reason["up"].strip(), reason["down"].strip()
    if isinstance(reason, str) and reason.strip():
        return reason.strip(), reason.strip()
    raise _fail(where, f'must be a non-empty string (the hypothesis of a move either way) or {{"up": "...", "down": '
                       f'"..."}} (toward later values, toward earlier ones), each non-empty; not {reason!r}')


def _only_when(only_when: object, knobs: dict[str, Knob], names: set[str]) -> dict[str, list[dict[str, list]]]:
    if not isinstance(only_when, dict):
        raise _fail("only_when", f'must be a dict {{"KNOB": [{{"OTHER": [values]}}, ...]}}; got {only_when!r}')
    for name, alternatives in only_when.items():
        if name not in knobs:
            raise _fail(f"only_when[{name!r}]", "names a knob that SEARCH_SPACE['knobs'] does not declare")
        if not isinstance(alternatives, list) or not alternatives:
            raise _fail(f"only_when[{name!r}]", f"must be a non-empty list of alternatives; got {alternatives!r}")
        for index, alternative in enumerate(alternatives):
            _condition(f"only_when[{name!r}][{index}]", alternative, names)
    return only_when


def _refused(rules: object, names: set[str]) -> list[tuple[dict[str, list], str]]:
    if not isinstance(rules, list):
        raise _fail("refused", f'must be a list of {{"when": {{...}}, "reason": "..."}}; got {rules!r}')
    for index, rule in enumerate(rules):
        _dict(f"refused[{index}]", rule, ("when", "reason"))
        _condition(f"refused[{index}]['when']", rule["when"], names)
        if not isinstance(rule["reason"], str) or not rule["reason"].strip():
            raise _fail(f"refused[{index}]['reason']", f"must be a non-empty string; got {rule['reason']!r}")
    return [(rule["when"], rule["reason"]) for rule in rules]


def _jumps(jumps: object, knobs: dict[str, Knob], refused: list[tuple[dict[str, list], str]]) -> list[tuple[dict, str]]:
    if not isinstance(jumps, list):
        raise _fail("jumps", f'must be a list of {{"to": {{"KNOB": value, ...}}, "reason": "..."}}; got {jumps!r}')
    found = []
    for index, jump in enumerate(jumps):
        where = f"jumps[{index}]"
        _dict(where, jump, ("to", "reason"))
        to = jump["to"]
        if not isinstance(to, dict) or not to:
            raise _fail(f"{where}['to']", f'must be a non-empty dict {{"KNOB": value, ...}}; got {to!r}')
        for name, value in to.items():
            if name not in knobs:
                raise _fail(f"{where}['to']", f"names {name!r}, which SEARCH_SPACE['knobs'] does not declare")
            if not any(same_value(value, v) for v in knobs[name].values):
                raise _fail(f"{where}['to'][{name!r}]", f"must be one of the knob's values "
                                                        f"{list(knobs[name].values)}; got {value!r}")
        if not isinstance(jump["reason"], str) or not jump["reason"].strip():
            raise _fail(f"{where}['reason']", f"must be a non-empty string; got {jump['reason']!r}")
        if any(to == other for other, _ in found):
            raise _fail(where, f"repeats an earlier jump: {to!r}")
        for when, why in refused:  # a combination the jump's own values make, whatever the table holds
            if all(knob in to and any(same_value(to[knob], v) for v in allowed) for knob, allowed in when.items()):
                raise _fail(where, f"sets a refused combination {when!r} ({why}); no table could take it")
        found.append((to, jump["reason"].strip()))
    return found


def same_value(a: object, b: object) -> bool:
    """Equal, and both bools or both not: True is not the value 1 here."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _device_bound(directions: object, knobs: dict[str, Knob]) -> dict[str, str]:
    if not isinstance(directions, dict):
        raise _fail("device_bound", f'must be a dict {{"KNOB": "up" or "down"}}; got {directions!r}')
    for name, direction in directions.items():
        if name not in knobs:
            raise _fail(f"device_bound[{name!r}]", "names a knob that SEARCH_SPACE['knobs'] does not declare")
        if direction not in DIRECTIONS:
            raise _fail(f"device_bound[{name!r}]", f"must be 'up' (toward later values of the knob's list) or 'down' "
                                                   f"(toward earlier ones); got {direction!r}")
    return directions


def _fail(where: str, what: str) -> ProposerError:
    return ProposerError(f"SEARCH_SPACE {where} {what}" if where else f"SEARCH_SPACE {what}")


def _values(where: str, values: object) -> tuple:
    if not isinstance(values, list) or not values or not all(v is None or isinstance(v, (bool, int, float, str))
                                                             for v in values):
        raise _fail(where, f"must be a non-empty list of literals (numbers, strings, True/False, None); got {values!r}")
    if any(v in values[:i] for i, v in enumerate(values)):
        raise _fail(where, f"repeats a value: {values!r}")
    if any(isinstance(v, float) and not math.isfinite(v) for v in values):  # repr(inf) is no Python literal
        raise _fail(where, f"must hold finite numbers; got {values!r}")
    return tuple(values)


def _dict(where: str, value: object, required: tuple, optional: tuple = ()) -> dict:
    if not isinstance(value, dict):
        raise _fail(where, f"must be a dict; got {value!r}")
    missing = [k for k in required if k not in value]
    unknown = [k for k in value if k not in required + optional]
    if missing or unknown:
        keys = f"must have the keys {list(required)}" + (f" (optional: {list(optional)})" if optional else "")
        keys += (f"; missing {missing}" if missing else "") + (f"; unknown {unknown}" if unknown else "")
        raise _fail(where, keys)
    return value


def _condition(where: str, value: object, names: set[str]) -> dict[str, list]:
    if not isinstance(value, dict) or not value:
        raise _fail(where, f'must be a non-empty dict {{"KNOB": [values], ...}}; got {value!r}')
    for name, allowed in value.items():
        if name not in names:
            raise _fail(where, f"names {name!r}, which is neither a declared knob nor a key of get_config()'s dict")
        _values(f"{where}[{name!r}]", allowed)
    return value
