"""A solution's own SEARCH_SPACE drives the offline search: a toy solution whose knobs nothing else in the repository
names, searched by the real proposer on real tools until it has nothing left to propose."""
from __future__ import annotations

from dataclasses import replace

import pytest

from agent.config import Task
from agent.exceptions import LimitsExceeded, ProposerError, Submitted
from agent.ledger import format_row
from agent.proposers import IterationContext
from agent.proposers.offline import (NOT_MEASURED, OfflineProposer, failed_moves, find_tables, new_tier, render,
                                     shapes, single_moves, weaker_stratum)
from agent.proposers.space import range_keys, read_space
from tests.agent.test_tools import tools  # noqa: F401 (the fixture)
from tests.agent.test_units import _sha, changes, mark_tried, propose
from tests.conftest import ROOT, W4A16_FAMILY

TOY = '''"""A toy solution: its own switches, its own space."""
GROUP_SIZE = 64


def get_config():
    return {"TILE_WIBBLE": 32, "FROB_DEPTH": 2, "QUUX_MODE": 0, "ZORP_FACTOR": 3, "BLOCK_SIZE_K": GROUP_SIZE,
            "num_warps": 4}


TIERS = [
    {"N_MIN": 256, "N_MAX": 1024, "K_MIN": 128, "K_MAX": 1 << 40, "TILE_WIBBLE": 16},  # a few expert-batch shapes
]

SEARCH_SPACE = {
    "knobs": {
        "TILE_WIBBLE": {"values": [16, 32, 64], "reason": "wibblier tiles frob fewer quuxes"},
        "FROB_DEPTH": {"values": [1, 2, 3], "reason": "deeper frobs hide the zorp latency", "unmeasured": [3]},
        "QUUX_MODE": {"values": [0, 1, 2], "reason": "quux modes 1 and 2 fuse the wibble"},
    },
    "only_when": {"FROB_DEPTH": [{"QUUX_MODE": [1, 2]}]},
    "refused": [{"when": {"QUUX_MODE": [2], "TILE_WIBBLE": [64]}, "reason": "quux mode 2 has no 64-wide wibble"}],
}


def plan(N):
    config = dict(get_config())
    config.update(next((t for t in TIERS if t["N_MIN"] <= N <= t["N_MAX"]), {}))
    return config
'''
EXPERT_WEAKER = {"strata": {"balanced": 1.0, "expert-batch": 0.5}}
TASK = Task.load(ROOT)  # the W4A16 task: tiers key on n and k
RANGES = range_keys(TASK.tier_dims)
SPACE = read_space(TOY, RANGES)


def exhaust(tools, start: str, profile=None) -> list[tuple[str, object]]:  # noqa: F811
    """Every proposal from ``start`` until the search has nothing left, each marked tried in the ledger."""
    proposals = []
    for _ in range(300):
        (tools.candidate / "solution.py").write_text(start)
        try:
            proposal, submitted = propose(tools, profile)
        except LimitsExceeded:
            return proposals
        compile(proposal, "solution.py", "exec")  # every rendering is valid Python
        proposals.append((proposal, submitted))
        mark_tried(tools, proposal)
    raise AssertionError("the search never ran out")


def paired(summary: str, first: str, second: str) -> bool:
    return set(summary.split(" + ")) == {first, second}


def holds_refused(source: str) -> bool:
    tables = find_tables(source, TASK)
    return any({**tables[0].entries, **t.entries}.get("QUUX_MODE") == 2
               and {**tables[0].entries, **t.entries}.get("TILE_WIBBLE") == 64 for t in tables)


def test_only_declared_knobs_move_to_declared_values_and_refused_combinations_never_appear(tools):  # noqa: F811
    proposals = exhaust(tools, TOY)
    base = find_tables(TOY, TASK)
    summaries = [s.summary for _, s in proposals]
    assert len(summaries) == len(set(summaries)) and any(" + " in s for s in summaries)
    for proposal, submitted in proposals:
        moved = changes(base, find_tables(proposal, TASK))
        assert 1 <= len(moved) <= 2, submitted.summary
        assert all(value in SPACE.knobs[knob].values for _, knob, value in moved), submitted.summary
        assert not holds_refused(proposal), submitted.summary
        assert "ZORP_FACTOR" not in submitted.summary and "num_warps" not in submitted.summary  # not in the space
        assert "FROB_DEPTH" not in submitted.summary  # only when QUUX_MODE is 1 or 2, which no table holds
    # the refused pair was reachable: both of its moves were proposed alone
    assert {"TILE_WIBBLE 32->64", "QUUX_MODE 0->2"} <= set(summaries)
    assert not any(paired(s, "TILE_WIBBLE 32->64", "QUUX_MODE 0->2") for s in summaries)
    assert not any(paired(s, "TIERS[0] TILE_WIBBLE 16->64", "QUUX_MODE 0->2") for s in summaries)  # the tier's shapes
    assert any(paired(s, "TIERS[0] TILE_WIBBLE 16->32", "QUUX_MODE 0->2") for s in summaries)
    first = proposals[0][1]
    assert first.summary == "new tier N 4096..1<<40 TILE_WIBBLE 32->64"  # no tier covers the (weaker) balanced shapes
    assert first.hypothesis.startswith("wibblier tiles frob fewer quuxes, for the balanced shapes only (config:")
    wibble = next(s for _, s in proposals if s.summary == "TILE_WIBBLE 32->64")
    assert wibble.hypothesis.startswith("wibblier tiles frob fewer quuxes (config: ")


def test_only_when_lets_a_knob_move_where_it_matters_and_unmeasured_values_are_marked(tools):  # noqa: F811
    quux = TOY.replace('"QUUX_MODE": 0, "ZORP', '"QUUX_MODE": 1, "ZORP', 1)
    assert quux != TOY
    proposals = {s.summary: s for _, s in exhaust(tools, quux)}
    assert {"FROB_DEPTH 2->3", "FROB_DEPTH 2->1"} <= set(proposals)
    assert proposals["FROB_DEPTH 2->3"].hypothesis.startswith(f"deeper frobs hide the zorp latency{NOT_MEASURED} (")
    assert NOT_MEASURED not in proposals["FROB_DEPTH 2->1"].hypothesis
    assert "QUUX_MODE 1->2" in proposals and "TILE_WIBBLE 32->64" in proposals
    assert not any(paired(s, "QUUX_MODE 1->2", "TILE_WIBBLE 32->64") for s in proposals)


def test_a_tier_is_added_for_the_weaker_stratum_and_then_edited(tools):  # noqa: F811
    tools.candidate.joinpath("solution.py").write_text(TOY)
    proposal, submitted = propose(tools, EXPERT_WEAKER)
    assert submitted.summary == "TIERS[0] TILE_WIBBLE 16->32"  # the expert-batch tier first
    mark_tried(tools, proposal)
    tools.candidate.joinpath("solution.py").write_text(TOY)
    proposal, submitted = propose(tools, EXPERT_WEAKER)
    # TIERS[0] covers only part of the expert-batch shapes: a tier for all of them goes at the end of TIERS, where it
    # serves the expert-batch shapes TIERS[0] does not hold (N 2048 here), which take TILE_WIBBLE from the general table
    assert submitted.summary == "new tier N 1..2048 TILE_WIBBLE 32->64"
    assert submitted.hypothesis.startswith(
        "wibblier tiles frob fewer quuxes, for the expert-batch shapes that no earlier tier holds")
    tables = find_tables(proposal, TASK)
    assert [t.name for t in tables] == ["config", "TIERS[0]", "TIERS[1]"]
    assert tables[1].entries == find_tables(TOY, TASK)[1].entries  # first match wins: the narrower one keeps precedence
    assert tables[2].entries == {"N_MIN": 1, "N_MAX": 2048, "K_MIN": 128, "K_MAX": "1 << 40", "TILE_WIBBLE": 64}
    added = '\n    {"N_MIN": 1, "N_MAX": 2048, "K_MIN": 128, "K_MAX": 1 << 40, "TILE_WIBBLE": 64},'
    assert proposal.count(added) == 1 and proposal.replace(added, "") == TOY
    # kept: the expert-batch shapes have their tier now, so it is edited, never added again
    tiered = proposal
    later = [s.summary for _, s in exhaust(tools, tiered, EXPERT_WEAKER)]
    assert not any(s.startswith("new tier") for s in later)
    assert {"TIERS[1] TILE_WIBBLE 64->32", "TIERS[1] TILE_WIBBLE 64->16"} <= set(later)
    assert later.index("TIERS[1] TILE_WIBBLE 64->32") < later.index("QUUX_MODE 0->1")  # the weaker stratum's first


def test_a_solution_that_names_tiers_but_has_none_gets_a_tiers_list_after_get_config(tools):  # noqa: F811
    untiered = TOY.replace(TOY[TOY.index("TIERS = ["):TOY.index("SEARCH_SPACE")], "").replace(
        "next((t for t in TIERS", 'next((t for t in globals().get("TIERS", ())')
    assert "TIERS = [" not in untiered and '"TIERS"' in untiered
    tools.candidate.joinpath("solution.py").write_text(untiered)
    proposal, submitted = propose(tools, EXPERT_WEAKER)
    assert submitted.summary == "new tier N 1..2048 TILE_WIBBLE 32->64"
    assert '"num_warps": 4}\n\n\nTIERS = [\n    {"N_MIN": 1, "N_MAX": 2048, "K_MIN": 128, "K_MAX": 1 << 40, ' \
           '"TILE_WIBBLE": 64},\n]\n\n\nSEARCH_SPACE' in proposal
    assert [t.name for t in find_tables(proposal, TASK)] == ["config", "TIERS[0]"]
    # a solution that never names TIERS reads none: a tier would change nothing, so none is proposed
    silent = untiered.replace('globals().get("TIERS", ())', "()")
    assert not any("tier" in s.summary for _, s in exhaust(tools, silent, EXPERT_WEAKER))


def test_a_new_tier_move_that_failed_alone_is_never_combined(tools):  # noqa: F811
    failed = None
    ledger = tools.task.ledger_path
    for _ in range(40):
        tools.candidate.joinpath("solution.py").write_text(TOY)
        proposal, submitted = propose(tools, EXPERT_WEAKER)
        if " + " in submitted.summary:
            break
        row = {"version": "v9", "sha256": _sha(proposal), "correct": "yes", "residency": "not run (slower)",
               "summary / hypothesis": f"{submitted.summary}; hypothesis: h"}
        if submitted.summary.startswith("new tier"):
            failed = failed or submitted.summary
            row |= {"correct": "no", "residency": "-"} if failed == submitted.summary else {}
        ledger.write_text(ledger.read_text() + format_row(row, tools.task) + "\n")
    assert failed == "new tier N 1..2048 TILE_WIBBLE 32->64"
    mark_tried(tools, proposal)
    pairs = [submitted.summary] + [s.summary for _, s in exhaust(tools, TOY, EXPERT_WEAKER)]
    assert pairs and all(" + " in s for s in pairs) and not any(failed in s for s in pairs)
    assert any("new tier N 1..2048 TILE_WIBBLE 32->16" in s for s in pairs)  # its other value still combines


MALFORMED = [
    ('"values": [16, 32, 64]', '"values": []', r"SEARCH_SPACE knobs\['TILE_WIBBLE'\]\['values'\] must be a non-empty"
                                              r" list of literals"),
    ('"values": [16, 32, 64]', '"values": list(range(3))', r"SEARCH_SPACE \(line \d+\) must be plain data"),
    ('"values": [0, 1, 2], "reason": "quux modes 1 and 2 fuse the wibble"', '"values": [0, 1, 2]',
     r"SEARCH_SPACE knobs\['QUUX_MODE'\] must have the keys \['values', 'reason'\].*missing \['reason'\]"),
    ('"unmeasured": [3]', '"unmeasured": [4]', r"knobs\['FROB_DEPTH'\]\['unmeasured'\] must hold only its values"),
    ('"only_when": {"FROB_DEPTH": [{"QUUX_MODE"', '"only_when": {"FROB_DEPTH": [{"QUUX_MOD"',
     r"only_when\['FROB_DEPTH'\]\[0\] names 'QUUX_MOD', which is neither a declared knob nor a key of get_config"),
    ('"only_when"', '"only_if"', r"SEARCH_SPACE must have the keys \['knobs'\].*unknown \['only_if'\]"),
    ('"refused": [{"when"', '"refused": [{"if"', r"SEARCH_SPACE refused\[0\] must have the keys \['when', 'reason'\]"),
    ('"TILE_WIBBLE": {"values"', '"N_MIN": {"values"', r"knobs\['N_MIN'\] is not a knob name"),
    ('"values": [1, 2, 3]', '"values": [1, 2, 2]', r"knobs\['FROB_DEPTH'\]\['values'\] repeats a value"),
    ('"refused": [', '"device_bound": {"ZORP_FACTOR": "up"}, "refused": [',
     r"device_bound\['ZORP_FACTOR'\] names a knob that SEARCH_SPACE\['knobs'\] does not declare"),
    ('"refused": [', '"device_bound": {"TILE_WIBBLE": "higher"}, "refused": [',
     r"device_bound\['TILE_WIBBLE'\] must be 'up' \(toward later values of the knob's list\) or 'down' \(toward "
     r"earlier ones\); got 'higher'"),
    ('"refused": [', '"device_bound": ["TILE_WIBBLE"], "refused": [',
     r"SEARCH_SPACE device_bound must be a dict \{\"KNOB\": \"up\" or \"down\"\}; got \['TILE_WIBBLE'\]"),
]


@pytest.mark.parametrize("old, new, message", MALFORMED)
def test_a_malformed_search_space_stops_the_search_and_says_where(tools, old, new, message):  # noqa: F811
    """Not a ProposerError, which the loop records as an attempt of the unchanged candidate: LimitsExceeded, which
    stops the run with this reason before anything is recorded."""
    assert TOY.count(old) == 1
    tools.candidate.joinpath("solution.py").write_text(TOY.replace(old, new))
    with pytest.raises(LimitsExceeded, match="the offline search cannot read .*solution.py: .*" + message):
        propose(tools)
    with pytest.raises(ProposerError, match=message):
        read_space(TOY.replace(old, new), RANGES)


def test_without_a_search_space_only_triton_launch_knobs_move(tools):  # noqa: F811
    bare = TOY[:TOY.index("SEARCH_SPACE")].replace('"TILE_WIBBLE": 32,', '"BLOCK_SIZE_N": 64, "TILE_WIBBLE": 32,')
    bare = bare.replace('"ZORP_FACTOR": 3,', '"ZORP_FACTOR": 3, "num_stages": 3,')
    space = read_space(bare, RANGES)
    assert list(space.knobs) == ["BLOCK_SIZE_N", "num_stages", "num_warps"]  # BLOCK_SIZE_K is GROUP_SIZE: computed
    moved = {knob for proposal, _ in exhaust(tools, bare) for _, knob, _ in changes(find_tables(bare, TASK),
                                                                                     find_tables(proposal, TASK))}
    assert moved == {"BLOCK_SIZE_N", "num_warps", "num_stages"}


def test_what_a_table_decides_follows_the_shapes_as_plan_matches_them():
    """A tier covering part of a stratum decides only the shapes it holds (the first matching tier, as plan() picks
    it); the rest take the general table, so a new tier for the stratum may take that knob for them."""
    family = (W4A16_FAMILY / "solution.py").read_text()
    cases = [{"case": {"stratum": stratum, "n": n, "k": 8192}}
             for stratum, n in (("expert-batch", 1024), ("balanced", 8192), ("balanced", 28672))]
    expert = {"strata": {"balanced": 1.0, "expert-batch": 0.5}, "cases": cases}
    # the family's own expert-batch tier covers the stratum's widths: no second one, and the moves of that tier
    # are its own knobs (those it sets), since the first matching tier decides the shape
    tables = find_tables(family, TASK)
    held = [t for t in tables[1:] if t.ranges.get("n") and t.ranges["n"][0] <= 1 and t.ranges["n"][1] >= 2048]
    assert held and new_tier(family, tables, "expert-batch", TASK) is None
    moves = single_moves(tables, expert, read_space(family, RANGES), TASK, None)
    assert {m.knob for m in moves if m.table == held[0].name} <= set(held[0].entries) - {"N_MIN", "N_MAX", "K_MIN",
                                                                                        "K_MAX"}
    assert any(m.table == held[0].name for m in moves)
    # without it, a new tier for the stratum may take a knob the general table decides for the expert-batch case
    line = next(line for line in family.splitlines() if line.lstrip().startswith('{"N_MIN": 1, "N_MAX": 4095'))
    family = family.replace(line + "\n", "")
    tables, space = find_tables(family, TASK), read_space(family, RANGES)
    moves = single_moves(tables, expert, space, TASK, new_tier(family, tables, "expert-batch", TASK))
    # the widest deep tier (N >= 23808, K >= 8192) holds one balanced case: the general MIN_PROGRAMS serves the other
    # and the expert-batch case, so an expert-batch tier of its own may move it
    assert any(str(m) == "new tier N 1..2048 MIN_PROGRAMS 396->528" for m in moves)
    assert any(str(m) == "MIN_PROGRAMS 396->528" for m in moves) and any(str(m).startswith("TIERS[0]") for m in moves)
    balanced = {"strata": {"balanced": 0.5, "expert-batch": 1.0}, "cases": cases}
    tier = new_tier(family, tables, "balanced", TASK)
    added = [m for m in single_moves(tables, balanced, space, TASK, tier) if m.table == tier.name]
    assert added and all("for the balanced shapes that no earlier tier holds" in m.reason for m in added)
    only_widest = [c for c in cases if c["case"]["n"] != 8192]  # every balanced case in the widest tier
    assert not [m for m in single_moves(tables, {**balanced, "cases": only_widest}, space, TASK, tier)
                if m.table == tier.name], "a tier no case reaches decides nothing"


# the toy space, with the directions in which each call takes more GPU time (made-up knobs, as the rest of the toy)
DEVICE_BOUND = TOY.replace('    "refused": [', '    "device_bound": {"QUUX_MODE": "up", "TILE_WIBBLE": "down"},\n'
                           '    "refused": [', 1)
HOST_BOUND = "24x16384x1536-silu"
# the best's selfcheck on a GPU: balanced is the weaker stratum, and the expert-batch case (N 1536, which no tier of
# the toy holds) is host-bound
BALANCED_WEAKER = {"strata": {"balanced": 0.5, "expert-batch": 1.0},
                   "cases": [{"case": {"name": "24x8192x8192-silu", "stratum": "balanced", "n": 8192, "k": 8192},
                              "stable": True},
                             {"case": {"name": HOST_BOUND, "stratum": "expert-batch", "n": 1536, "k": 16384},
                              "stable": True}]}
HOST_BOUND_PROFILE = {**BALANCED_WEAKER, "cases": [BALANCED_WEAKER["cases"][0],
                                                   {**BALANCED_WEAKER["cases"][1], "stable": False}]}
LAST_VERDICT = {"stable": f"no (host-bound: {HOST_BOUND})", "keep": False,
                "unstable": [{"case": HOST_BOUND, "stratum": "expert-batch", "why": "GPU 9.1 us below 1.30x host",
                              "note": "host-bound"}]}
DEVICE_BOUND_FIRST = ["new tier N 1..2048 TILE_WIBBLE 32->16", "new tier N 1..2048 QUUX_MODE 0->1",
                      "TILE_WIBBLE 32->16", "QUUX_MODE 0->1", "new tier N 1..2048 QUUX_MODE 0->2", "QUUX_MODE 0->2"]


def propose_after(tools, source: str, profile: dict, last_verdict: dict | None) -> Submitted:  # noqa: F811
    tools.candidate.joinpath("solution.py").write_text(source)
    with pytest.raises(Submitted) as submitted:
        OfflineProposer().iterate(IterationContext(1, {}, profile, last_verdict), tools)
    mark_tried(tools, tools.candidate.joinpath("solution.py").read_text())
    return submitted.value


def test_device_bound_directions_are_read():
    assert read_space(DEVICE_BOUND, RANGES).device_bound == {"QUUX_MODE": "up", "TILE_WIBBLE": "down"}
    assert SPACE.device_bound == {}


def test_host_bound_cases_make_the_device_bound_moves_of_their_stratum_come_first(tools):  # noqa: F811
    """Cases of a stratum found host-bound in the best's own selfcheck make that stratum the focus: its device-bound
    moves come first, nearest first, in the tables deciding its shapes (a new tier for it before the general table,
    which serves the other stratum too; TIERS[0] holds no such shape), each saying why; never a move the other way
    (TILE_WIBBLE up, QUUX_MODE down)."""
    profile, last_verdict = HOST_BOUND_PROFILE, None
    first = [propose_after(tools, DEVICE_BOUND, profile, last_verdict) for _ in DEVICE_BOUND_FIRST]
    assert [s.summary for s in first] == DEVICE_BOUND_FIRST
    assert all(s.hypothesis.startswith(f"the expert-batch cases {HOST_BOUND} are host-bound (GPU time per call below "
                                       "the host cost's margin, so the verifier's dispersion gate fails them): ")
               for s in first)
    assert "TILE_WIBBLE down gives each call more GPU time; wibblier tiles frob fewer quuxes" in first[0].hypothesis
    # once they are all in the ledger the search goes on as ever, the host-bound stratum still its focus
    after = propose_after(tools, DEVICE_BOUND, profile, last_verdict)
    assert after.summary not in DEVICE_BOUND_FIRST and "host-bound" not in after.hypothesis


def test_without_host_bound_cases_device_bound_changes_nothing(tools):  # noqa: F811
    """A steady best is not slowed: not even after an attempt reverted as host-bound (LAST_VERDICT), which left the
    best as it was."""
    with_directions = [propose_after(tools, DEVICE_BOUND, BALANCED_WEAKER, LAST_VERDICT).summary for _ in range(4)]
    tools.task.ledger_path.write_text(tools.task.ledger_path.read_text().split("| v9 |")[0])
    without = [propose_after(tools, TOY, BALANCED_WEAKER, None).summary for _ in range(4)]
    assert with_directions == without and with_directions[0] == "new tier N 4096..1<<40 TILE_WIBBLE 32->64"


# A task whose tiers key on M alone (as a decode GEMM's would): two strata of M, the knob's reason per direction.
DECODE_FACTS = {"tier_dims": {"m": [1, None]}, "strata": {"decode": {"m": [1, 16]}, "prefill": {"m": [17, None]}},
                "sample_cases": ({"m": 1, "n": 4096}, {"m": 16, "n": 4096}, {"m": 64, "n": 4096}),
                "stages": ("policy", "selfcheck", "gates"), "columns": ("gates", "decode", "prefill")}
DECODE_TASK = replace(TASK, **DECODE_FACTS)
DECODE = '''def get_config():
    return {"SPLIT": 2, "num_warps": 4}


TIERS = [
    {"M_MIN": 1, "M_MAX": 8, "SPLIT": 4},
]

SEARCH_SPACE = {"knobs": {
    "SPLIT": {"values": [1, 2, 4, 8],
              "reason": {"up": "more splits fill the SMs", "down": "fewer splits cut the sums"}},
}}
'''
DECODE_WEAKER = {"strata": {"decode": 0.5, "prefill": 1.0}}


def test_a_task_whose_tiers_key_on_m_gets_moves_and_new_tiers_keyed_by_m():
    task = DECODE_TASK
    assert range_keys(task.tier_dims) == ("M_MIN", "M_MAX")
    tables, space = find_tables(DECODE, task), read_space(DECODE, range_keys(task.tier_dims))
    assert tables[1].ranges == {"m": (1, 8)} and tables[1].strata == {"decode"}
    assert shapes(None, task) == (("decode", 1), ("decode", 16), ("prefill", 64))  # the sample cases, by stratum
    profiled = {"cases": [{"case": {"name": "c", "stratum": "prefill", "m": 32, "n": 8192}}]}
    assert shapes(profiled, task) == (("prefill", 32),)
    # TIERS[0] holds only part of the decode shapes (M 1..8 of 1..16): a tier for all of them, keyed by M alone
    tier = new_tier(DECODE, tables, "decode", task)
    assert tier.label == "new tier M 1..16" and tier.entries == {"M_MIN": 1, "M_MAX": 16}
    assert tier.strata == {"decode"}
    moves = [str(m) for m in single_moves(tables, DECODE_WEAKER, space, task, tier)]
    assert moves[:3] == ["TIERS[0] SPLIT 4->8", "TIERS[0] SPLIT 4->2", "new tier M 1..16 SPLIT 2->4"]
    assert "SPLIT 2->4" in moves and not any("N_" in m or "K_" in m for m in moves)
    proposal = render(DECODE, tables + [tier], {(tier.name, "SPLIT"): 4})
    assert proposal == DECODE.replace('"SPLIT": 4},\n', '"SPLIT": 4},\n    {"M_MIN": 1, "M_MAX": 16, "SPLIT": 4},\n')
    assert [t.ranges for t in find_tables(proposal, task)[1:]] == [{"m": (1, 8)}, {"m": (1, 16)}]
    # the open end of the upper stratum renders as 1 << 40, as every tier writes it
    wide = new_tier(DECODE, tables, "prefill", task)
    assert wide.label == "new tier M 17..1<<40"
    assert '{"M_MIN": 17, "M_MAX": 1 << 40, "SPLIT": 1}' in render(DECODE, tables + [wide], {(wide.name, "SPLIT"): 1})
    # a knob may not be this task's range key, but may be another task's
    with pytest.raises(ProposerError, match=r"knobs\['M_MIN'\] is not a knob name"):
        read_space(DECODE.replace('"SPLIT": {"values"', '"M_MIN": {"values"'), range_keys(task.tier_dims))
    assert "N_MIN" in read_space(DECODE.replace('"SPLIT": {"values"', '"N_MIN": {"values"'), ("M_MIN", "M_MAX")).knobs
    # a single move fails by the task's own check columns (here gates), never by a column it does not have
    rows = [{"correct": "yes", "gates": "failed", "summary / hypothesis": "new tier M 1..16 SPLIT 2->4; hypothesis: h"},
            {"correct": "yes", "gates": "not run (slower)", "residency": "over",
             "summary / hypothesis": "SPLIT 2->1; hypothesis: h"}]
    assert failed_moves(rows, task) == {("new tier M 1..16", "SPLIT", "4")}
    assert failed_moves(rows, TASK) == {("new tier M 1..16", "SPLIT", "4"), ("config", "SPLIT", "1")}  # residency


def test_the_offline_proposer_takes_the_task_from_its_tools(tools):  # noqa: F811
    tools.task = replace(tools.task, **DECODE_FACTS)  # the fixture's copy of the project: its ledger, not the real one
    tools.candidate.joinpath("solution.py").write_text(DECODE)
    proposal, submitted = propose(tools, DECODE_WEAKER)
    assert submitted.summary == "TIERS[0] SPLIT 4->8" and submitted.hypothesis.startswith("more splits fill the SMs (")
    mark_tried(tools, proposal)
    tools.candidate.joinpath("solution.py").write_text(DECODE)
    proposal, submitted = propose(tools, DECODE_WEAKER)
    assert submitted.summary == "TIERS[0] SPLIT 4->2" and submitted.hypothesis.startswith("fewer splits cut the sums (")
    mark_tried(tools, proposal)
    tools.candidate.joinpath("solution.py").write_text(DECODE)
    proposal, submitted = propose(tools, DECODE_WEAKER)
    assert submitted.summary == "new tier M 1..16 SPLIT 2->4"
    assert submitted.hypothesis.startswith("more splits fill the SMs, for the decode shapes that no earlier tier holds")
    assert '{"M_MIN": 1, "M_MAX": 16, "SPLIT": 4}' in proposal


def test_a_move_quotes_the_reason_of_its_direction():
    source = TOY.replace('"reason": "wibblier tiles frob fewer quuxes"',
                         '"reason": {"up": "wider wibbles frob fewer quuxes",\n'
                         '                       "down": "narrower wibbles make more frobs"}')
    space = read_space(source, RANGES)
    assert space.knobs["TILE_WIBBLE"].reason("up") == "wider wibbles frob fewer quuxes"
    assert space.knobs["QUUX_MODE"].reason("down") == space.knobs["QUUX_MODE"].reason("up")  # one string: both ways
    tables = find_tables(source, TASK)
    moves = {str(m): m.reason for m in single_moves(tables, EXPERT_WEAKER, space, TASK, None)}
    assert moves["TILE_WIBBLE 32->64"] == "wider wibbles frob fewer quuxes"
    assert moves["TILE_WIBBLE 32->16"] == "narrower wibbles make more frobs"
    assert moves["TIERS[0] TILE_WIBBLE 16->32"] == "wider wibbles frob fewer quuxes"
    tier = new_tier(source, tables, "balanced", TASK)
    added = {str(m): m.reason for m in single_moves(tables, None, space, TASK, tier) if m.table == tier.name}
    assert added["new tier N 4096..1<<40 TILE_WIBBLE 32->16"] == "narrower wibbles make more frobs, for the " \
                                                                 "balanced shapes only"
    # Triton's launch knobs say why either way
    launch = TOY[:TOY.index("SEARCH_SPACE")].replace('"TILE_WIBBLE": 32,', '"BLOCK_SIZE_N": 64, "num_stages": 3,')
    bare = read_space(launch, RANGES)
    for knob in ("BLOCK_SIZE_N", "num_warps", "num_stages"):
        assert bare.knobs[knob].reason("up") != bare.knobs[knob].reason("down")
    assert "larger BLOCK_SIZE_N tile" in bare.knobs["BLOCK_SIZE_N"].reason("up")
    assert "smaller BLOCK_SIZE_N tile" in bare.knobs["BLOCK_SIZE_N"].reason("down")
    for bad in ('{"up": "wider"}', '{"up": "wider", "down": ""}', '{"up": "a", "down": "b", "sideways": "c"}', '[]'):
        with pytest.raises(ProposerError, match=r"knobs\['TILE_WIBBLE'\]\['reason'\] must be a non-empty string .* or "
                                                r"\{\"up\": \"...\", \"down\": \"...\"\}"):
            read_space(TOY.replace('"wibblier tiles frob fewer quuxes"', bad), RANGES)


def test_the_weaker_stratum_is_the_lowest_score_else_the_first_in_the_tasks_order():
    three = replace(TASK, strata={"small": {"n": [1, 1024]}, "mid": {"n": [1025, 8192]}, "large": {"n": [8193, None]}})
    assert weaker_stratum({"strata": {"small": 1.2, "mid": 0.7, "large": 0.9}}, three) == "mid"
    assert weaker_stratum({"strata": {"small": 1.2, "mid": 0.9, "large": 0.7}}, three) == "large"
    assert weaker_stratum({"strata": {"small": 1.2, "mid": 0.7, "large": 0.7}}, three) == "mid"  # a tie: the first
    assert weaker_stratum({"strata": {"small": 0.7, "mid": 0.7, "large": 0.7}}, three) == "small"
    assert weaker_stratum({"strata": {"small": 1.2, "mid": 0.7}}, three) == "small"  # a score missing
    assert weaker_stratum({"strata": {"small": 1.2, "mid": 0.7, "large": None}}, three) == "small"
    assert weaker_stratum(None, three) == "small"
    # the W4A16 task: its first stratum unless the other scores lower
    assert weaker_stratum(None, TASK) == "balanced" and weaker_stratum(EXPERT_WEAKER, TASK) == "expert-batch"
    assert weaker_stratum({"strata": {"balanced": 0.9, "expert-batch": 0.9}}, TASK) == "balanced"
    assert weaker_stratum({"strata": {"balanced": 0.5, "expert-batch": 1.0}}, TASK) == "balanced"
    # a table's strata: those whose ranges it meets
    tables = find_tables(TOY, three)
    assert tables[0].strata == set(three.strata) and tables[1].strata == {"small"}  # TIERS[0]: N 256..1024
    tier = new_tier(TOY, tables, "large", three)
    assert tier.entries == {"N_MIN": 8193, "N_MAX": "1 << 40", "K_MIN": 128, "K_MAX": "1 << 40"}
    assert tier.strata == {"large"}
