"""The per-table search (agent.proposers.per_table) on real tools and a real ledger: a step moves every table at once,
a merge takes the tables whose every case won, the last attempt falls back where the baseline is faster."""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from agent.exceptions import Submitted
from agent.ledger import format_row
from agent.proposers import IterationContext
from agent.proposers.offline import OfflineProposer, find_tables
from agent.proposers.per_table import MARGIN, REFUTED
from tests.agent.test_tools import tools  # noqa: F401 (the fixture)

FACTS = {"tier_dims": {"m": [1, 16], "n": [1, None], "k": [8, None]},
         "strata": {"m1": {"m": [1, 1]}, "m2": {"m": [2, 2]}}, "sample_cases": (),
         "stages": ("policy", "selfcheck"), "columns": ("m1", "m2")}
SOURCE = '''def get_config():
    return {"BLOCK": 32, "SPLIT": 1, "FALLBACK": False}


SEARCH_SPACE = {
    "strategy": "per-table",
    "knobs": {
        "BLOCK": {"values": [16, 32, 64], "reason": {"up": "wider blocks", "down": "narrower blocks"}},
        "SPLIT": {"values": [1, 2, 4], "reason": {"up": "more splits", "down": "fewer splits"}},
        "FALLBACK": {"values": [False, True], "reason": {"up": "the baseline", "down": "the kernel"}},
    },
    "only_when": {"BLOCK": [{"FALLBACK": [False]}], "SPLIT": [{"FALLBACK": [False]}]},
}

TIERS = [
    {"M_MIN": 1, "M_MAX": 1, "N_MIN": 64, "N_MAX": 64, "K_MIN": 64, "K_MAX": 64, "BLOCK": 32, "SPLIT": 1,
     "FALLBACK": False},
    {"M_MIN": 2, "M_MAX": 2, "N_MIN": 64, "N_MAX": 64, "K_MIN": 64, "K_MAX": 64, "BLOCK": 32, "SPLIT": 1,
     "FALLBACK": False},
    {"M_MIN": 1, "M_MAX": 1, "N_MIN": 128, "N_MAX": 128, "K_MIN": 64, "K_MAX": 64, "BLOCK": 32, "SPLIT": 1,
     "FALLBACK": False},
]
'''
RUN = "20261204-000000-0001"
CASES = {"a": ("m1", 1, 64), "b": ("m2", 2, 64), "c": ("m1", 1, 128)}  # held by TIERS[0], [1], [2]


def profile(speedups: dict[str, float], device: str | None = None) -> dict:
    return {"interpreted": False, "device": device,
            "cases": [{"case": {"name": name, "stratum": s, "m": m, "n": n, "k": 64, "seed": 1},
                       "speedup": speedups[name], "correct": True} for name, (s, m, n) in CASES.items()]}


def record(tools, version: str, parent: str, source: str, summary: str, decision: str,  # noqa: F811
           speedups: dict[str, float] | None = None, correct: bool = True, gpu: bool = True,
           versus_best: dict[str, float] | None = None, device: str | None = None,
           worker: dict | None = None) -> None:
    """A snapshot, its verdict's cases (and, for an attempt timed against the best, each case's speedup over it) and
    its ledger row, as the loop writes them."""
    folder = tools.task.versions / version
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "solution.py").write_text(source)
    cases = [{"name": n, "stratum": CASES[n][0], "speedup": v, "correct": True} for n, v in (speedups or {}).items()]
    verdict = {"correct": correct, "gpu_timing": gpu, "cases": cases, "keep": decision.startswith("keep")}
    verdict |= ({"device": device} if device else {}) | ({"worker": worker} if worker else {})
    (folder / "verdict.json").write_text(json.dumps(verdict | ({"versus_best": versus_best} if versus_best else {})))
    ledger = tools.task.ledger_path
    row = {"version": version, "run": RUN, "parent": parent, "summary / hypothesis": summary, "decision": decision,
           "sha256": hashlib.sha256(source.encode()).hexdigest()}  # solution.py's own: how the search knows a try
    ledger.write_text(ledger.read_text() + format_row(row, tools.task) + "\n")


def propose(tools, best: str, best_speedups: dict, last: str | None = None, iteration: int = 1,  # noqa: F811
            iters: int = 20, label: str = "v1", final: bool = False, device: str | None = None,
            ) -> tuple[str, Submitted]:
    tools.candidate.joinpath("solution.py").write_text(best)
    with pytest.raises(Submitted) as submitted:
        OfflineProposer().iterate(IterationContext(iteration, {}, profile(best_speedups, device),
                                                   {"version": last} if last else None, iters=iters, best=label,
                                                   last=final),
                                 tools)
    return tools.candidate.joinpath("solution.py").read_text(), submitted.value


def entries(source: str, task) -> list[dict]:
    return [t.entries for t in find_tables(source, task)[1:]]


def test_steps_and_merges_alternate_and_credit_each_table_by_its_own_cases(tools):  # noqa: F811
    tools.task = replace(tools.task, **FACTS)
    task = tools.task
    start = {"a": 1.0, "b": 0.8, "c": 1.2}
    record(tools, "v1", "v0", SOURCE, "start", "keep")
    # a step: every table deciding a case moves its first neighbour (toward later values first, knob order)
    step, submitted = propose(tools, SOURCE, start)
    assert submitted.summary.startswith("per-table step: 3 table(s): TIERS[0] BLOCK 32->64")
    assert [e["BLOCK"] for e in entries(step, task)] == [64, 64, 64] and "in 3" in submitted.hypothesis
    # its numbers: TIERS[0]'s case won (by enough to merge at once), TIERS[1]'s lost, TIERS[2]'s gained less than the
    # margin
    after = {"a": 2.0, "b": 0.7, "c": 1.2 * (1 + MARGIN / 2)}
    record(tools, "v2", "v1", step, submitted.summary, "revert (0.990x best, noise 0.010)", after)
    merged, submitted = propose(tools, SOURCE, start, last="v2")
    assert submitted.summary == "per-table merge: 1 table(s): TIERS[0] BLOCK 32->64"
    assert "score ~1.141x the best's" in submitted.hypothesis
    assert [e["BLOCK"] for e in entries(merged, task)] == [64, 32, 32]
    # a merge the keep rule did not keep: the next step starts every table at its incumbent (TIERS[0] at 64), and
    # TIERS[0] never goes back to 32 and has no value past 64, so it moves on to SPLIT; the others take their next
    # untried neighbour
    record(tools, "v3", "v1", merged, submitted.summary, "revert (1.004x best, noise 0.010)",
           {"a": after["a"], "b": 0.8, "c": 1.2})
    step2, submitted = propose(tools, SOURCE, start, last="v3")
    assert submitted.summary.startswith("per-table step: 3 table(s): TIERS[0] SPLIT 1->2, TIERS[1] BLOCK 32->16, "
                                        "TIERS[2] BLOCK 32->16")
    assert [(e["BLOCK"], e["SPLIT"]) for e in entries(step2, task)] == [(64, 2), (16, 1), (16, 1)]
    # that step's wins join TIERS[0]'s: the next merge holds both tables' incumbents, measured against their own
    after2 = {"a": after["a"] * (1 + 2 * MARGIN), "b": 0.7, "c": 1.2 * (1 + 2 * MARGIN)}  # gain ~1.16
    record(tools, "v4", "v1", step2, submitted.summary, "revert (0.990x best, noise 0.010)", after2)
    merged2, submitted = propose(tools, SOURCE, start, last="v4")
    assert submitted.summary == ("per-table merge: 2 table(s): TIERS[0] BLOCK 32->64, TIERS[0] SPLIT 1->2, "
                                 "TIERS[2] BLOCK 32->16")
    assert [(e["BLOCK"], e["SPLIT"]) for e in entries(merged2, task)] == [(64, 2), (32, 1), (16, 1)]


def test_small_wins_gather_over_steps_before_a_merge(tools):  # noqa: F811
    """Wins too small to show past the keep rule's noise stay as incumbents through further steps (each table going on
    from its own incumbent) until MERGE_AFTER steps from the best have put the estimate MERGE_FLOOR over the best's;
    then one merge holds them all."""
    from agent.proposers.per_table import MERGE_AFTER, MERGE_FLOOR, MERGE_GAIN

    tools.task = replace(tools.task, **FACTS)
    start = {"a": 1.0, "b": 1.0, "c": 1.0}
    record(tools, "v1", "v0", SOURCE, "start", "keep")
    numbers = dict(start)
    for i in range(MERGE_AFTER):
        proposal, submitted = propose(tools, SOURCE, start, last=f"v{i + 1}" if i else None)
        assert submitted.summary.startswith("per-table step"), (i, submitted.summary)
        numbers["a"] *= 1 + 3 * MARGIN  # TIERS[0] wins each time; the others never
        record(tools, f"v{i + 2}", "v1", proposal, submitted.summary, "revert (~0.99x best)", numbers)
    assert MERGE_FLOOR <= 2 / (1 / numbers["a"] ** 0.5 + 1) < MERGE_GAIN  # m1's geomean of a and c, then m2's 1.0
    merged, submitted = propose(tools, SOURCE, start, last=f"v{MERGE_AFTER + 1}")
    # BLOCK won first; at its end (64) the table went on to SPLIT, which won, and on along it (momentum)
    assert submitted.summary == "per-table merge: 1 table(s): TIERS[0] BLOCK 32->64, TIERS[0] SPLIT 1->4"
    assert [(e["BLOCK"], e["SPLIT"]) for e in entries(merged, tools.task)] == [(64, 4), (32, 1), (32, 1)]


def test_no_merge_after_the_steps_while_the_estimate_is_under_the_floor(tools):  # noqa: F811
    """MERGE_AFTER steps from the best whose wins put the estimate under MERGE_FLOOR: the keep rule's noise would hide
    such a merge, so the next attempt is another step (the wins stay incumbents)."""
    from agent.proposers.per_table import MERGE_AFTER, MERGE_FLOOR

    tools.task = replace(tools.task, **FACTS)
    start = {"a": 1.0, "b": 1.0, "c": 1.0}
    record(tools, "v1", "v0", SOURCE, "start", "keep")
    numbers = dict(start)
    for i in range(MERGE_AFTER):
        proposal, submitted = propose(tools, SOURCE, start, last=f"v{i + 1}" if i else None)
        numbers["a"] *= 1 + 1.1 * MARGIN
        record(tools, f"v{i + 2}", "v1", proposal, submitted.summary, "revert (~0.99x best)", numbers)
    assert 1 < 2 / (1 / numbers["a"] ** 0.5 + 1) < MERGE_FLOOR
    _, submitted = propose(tools, SOURCE, start, last=f"v{MERGE_AFTER + 1}")
    assert submitted.summary.startswith("per-table step"), submitted.summary
    # the run's last iteration merges whatever won: the iters-th, or the last its time limit leaves room for
    _, submitted = propose(tools, SOURCE, start, last=f"v{MERGE_AFTER + 1}", iteration=20, iters=20)
    assert submitted.summary.startswith("per-table merge: 1 table(s): TIERS[0]"), submitted.summary
    _, submitted = propose(tools, SOURCE, start, last=f"v{MERGE_AFTER + 1}", iteration=6, iters=40, final=True)
    assert submitted.summary.startswith("per-table merge: 1 table(s): TIERS[0]"), submitted.summary


@pytest.mark.parametrize("trusted", [{"correct": False}, {"gpu": False}], ids=["a-wrong-case", "interpreter-timed"])
def test_no_credit_from_an_attempt_wrong_anywhere_or_timed_on_another_device(tools, trusted):  # noqa: F811
    """A step wrong on any case (a bug in shared code shows on a few cases only), or timed under the interpreter
    while the best was timed on a GPU, makes no incumbent: the next attempt is another step, not a merge. The wrong
    step is not tried again; the one only the interpreter ran was never timed, so the GPU run tries it (the same
    solution, which the ledger already holds)."""
    tools.task = replace(tools.task, **FACTS)
    start = {"a": 1.0, "b": 0.8, "c": 1.2}
    record(tools, "v1", "v0", SOURCE, "start", "keep")
    step, submitted = propose(tools, SOURCE, start)
    record(tools, "v2", "v1", step, submitted.summary, "revert", {"a": 2.0, "b": 2.0, "c": 2.0}, **trusted)
    again, submitted = propose(tools, SOURCE, start, last="v2")
    assert submitted.summary.startswith("per-table step"), submitted.summary
    assert (again == step) is (trusted == {"gpu": False})


def test_a_merge_that_lost_a_tables_cases_head_to_head_is_trimmed_and_merged_again(tools):  # noqa: F811
    """A merge the keep rule reverted, whose timing against the best shows one table's case under REFUTED: that
    table's configuration is refuted (never an incumbent again) and the next attempt is the merge without it, however
    few steps came since; a trimmed merge that refutes nothing more is followed by steps, the refuted table moving on
    from the best's values."""
    tools.task = replace(tools.task, **FACTS)
    start = {"a": 1.0, "b": 0.8, "c": 1.2}
    record(tools, "v1", "v0", SOURCE, "start", "keep", start)
    step, submitted = propose(tools, SOURCE, start)
    after = {"a": 2.0, "b": 0.7, "c": 1.2 * (1 + 2 * MARGIN)}  # TIERS[0] and TIERS[2] won on their step numbers
    record(tools, "v2", "v1", step, submitted.summary, "revert (0.990x best, noise 0.010)", after)
    merged, submitted = propose(tools, SOURCE, start, last="v2")
    assert submitted.summary == "per-table merge: 2 table(s): TIERS[0] BLOCK 32->64, TIERS[2] BLOCK 32->64"
    # timed against the best, TIERS[2]'s case c ran 0.9x: refuted; a 0.95x on a (an unchanged table's noise) is not
    record(tools, "v3", "v1", merged, submitted.summary, "revert (1.004x best, noise 0.010)", after,
           versus_best={"a": REFUTED + 0.01, "b": 1.0, "c": 0.9})
    trimmed, submitted = propose(tools, SOURCE, start, last="v3")
    assert submitted.summary == "per-table merge: 1 table(s): TIERS[0] BLOCK 32->64", submitted.summary
    assert "configuration of 1 table(s)" in submitted.hypothesis
    assert [e["BLOCK"] for e in entries(trimmed, tools.task)] == [64, 32, 32]
    record(tools, "v4", "v1", trimmed, submitted.summary, "revert (1.004x best, noise 0.010)", after | {"c": 1.2},
           versus_best={"a": 1.004, "b": 1.0, "c": 1.0})
    proposal, submitted = propose(tools, SOURCE, start, last="v4")
    assert submitted.summary.startswith("per-table step"), submitted.summary
    # TIERS[2] is back at the best's BLOCK 32; 64 is tried, so it moves down
    assert [e["BLOCK"] for e in entries(proposal, tools.task)][2] == 16


@pytest.mark.parametrize("recorded", ["NVIDIA H200", None], ids=["named", "ledger-device"])
def test_numbers_of_another_gpu_model_make_no_incumbent_and_their_moves_stay_untried(tools, recorded):  # noqa: F811
    """A step timed on an H200 (its verdict names the device, or names none and the manifest's ``ledger_device``
    says it): a search whose best was profiled on an H200 merges its win; one profiled on an H100 does not (an
    H100's speedups are not an H200's), and tries the move again."""
    tools.task = replace(tools.task, **FACTS, ledger_device="NVIDIA H200")
    start = {"a": 1.0, "b": 0.8, "c": 1.2}
    record(tools, "v1", "v0", SOURCE, "start", "keep", start)
    tier1 = '"BLOCK": {}, "SPLIT": 1,\n     "FALLBACK": False}},\n    {{"M_MIN": 1, "M_MAX": 1, "N_MIN": 128'
    moved = SOURCE.replace(tier1.format(32), tier1.format(16))
    moved = moved.replace('"BLOCK": 32, "SPLIT": 1,\n     "FALLBACK": False},\n    {"M_MIN": 2',
                          '"BLOCK": 64, "SPLIT": 1,\n     "FALLBACK": False},\n    {"M_MIN": 2')
    assert [e["BLOCK"] for e in entries(moved, tools.task)] == [64, 16, 32]
    record(tools, "v2", "v1", moved, "per-table step: 2 table(s): TIERS[0] BLOCK 32->64, TIERS[1] BLOCK 32->16",
           "revert (~0.99x best)", start | {"a": 2.0, "b": 0.7}, device=recorded)  # TIERS[1] lost
    _, submitted = propose(tools, SOURCE, start, last="v2", device="NVIDIA H200")
    assert submitted.summary == "per-table merge: 1 table(s): TIERS[0] BLOCK 32->64", submitted.summary
    step, submitted = propose(tools, SOURCE, start, last="v2", device="NVIDIA H100 80GB HBM3")
    assert submitted.summary.startswith("per-table step"), submitted.summary
    assert [e["BLOCK"] for e in entries(step, tools.task)][0] == 64  # untried on this model


@pytest.mark.parametrize("elsewhere", [{"device": "NVIDIA H100 80GB HBM3"}, {"gpu": False},
                                       {"device": "NVIDIA H200", "worker": {"gpu": "0", "shared": True}}],
                         ids=["another-model", "interpreter", "shared-gpu"])
def test_a_merge_timed_on_another_device_refutes_nothing_here(tools, elsewhere):  # noqa: F811
    """A merge an H100 (or the interpreter) timed against the best, one of its tables losing there: a search on the
    H200 takes no refutation from it (its head-to-head numbers are not the H200's), so it trims nothing, and the
    merge, untimed on the H200, is made again there. One timed on the H200 beside another worker refutes nothing
    either (and, timed there, is not made again: the search steps)."""
    tools.task = replace(tools.task, **FACTS, ledger_device="NVIDIA H200")
    start = {"a": 1.0, "b": 0.8, "c": 1.2}
    record(tools, "v1", "v0", SOURCE, "start", "keep", start)
    step, submitted = propose(tools, SOURCE, start, device="NVIDIA H200")
    record(tools, "v2", "v1", step, submitted.summary, "revert (0.990x best, noise 0.010)",
           {"a": 2.0, "b": 0.7, "c": 1.2 * (1 + 2 * MARGIN)})
    merged, submitted = propose(tools, SOURCE, start, last="v2", device="NVIDIA H200")
    assert submitted.summary == "per-table merge: 2 table(s): TIERS[0] BLOCK 32->64, TIERS[2] BLOCK 32->64"
    record(tools, "v3", "v1", merged, submitted.summary, "revert (1.004x best, noise 0.010)", start,
           versus_best={"a": 1.2, "b": 1.0, "c": 0.9}, **elsewhere)
    again, submitted = propose(tools, SOURCE, start, last="v3", device="NVIDIA H200")
    if "worker" in elsewhere:
        assert submitted.summary.startswith("per-table step"), submitted.summary
    else:
        assert submitted.summary == "per-table merge: 2 table(s): TIERS[0] BLOCK 32->64, TIERS[2] BLOCK 32->64"
        assert again == merged


def test_a_kept_step_gives_back_the_moves_that_lost(tools):  # noqa: F811
    """The keep rule may keep a step whose score beat the best's: the tables whose move did not win go back to the
    parent's values as their incumbents (here TIERS[1]'s loss alone is worth a merge), and move on from there."""
    tools.task = replace(tools.task, **FACTS)
    start = {"a": 1.0, "b": 0.8, "c": 1.2}
    record(tools, "v1", "v0", SOURCE, "start", "keep", start)
    step, submitted = propose(tools, SOURCE, start)
    after = {"a": 3.0, "b": 0.7, "c": 1.2}  # TIERS[0] won by far, TIERS[1] lost, TIERS[2] stood still
    record(tools, "v2", "v1", step, submitted.summary, "keep (1.300x best, noise 0.010)", after)
    proposal, submitted = propose(tools, step, after, last="v2", label="v2")
    assert submitted.summary == "per-table merge: 2 table(s): TIERS[1] BLOCK 64->32, TIERS[2] BLOCK 64->32"
    assert [e["BLOCK"] for e in entries(proposal, tools.task)] == [64, 32, 32]
    record(tools, "v3", "v2", proposal, submitted.summary, "revert (1.01x best, noise 0.02)", start | {"a": 3.0})
    proposal, submitted = propose(tools, step, after, last="v3", label="v2")  # not kept: on from the incumbents
    assert submitted.summary.startswith("per-table step: 3 table(s): TIERS[0] SPLIT 1->2, TIERS[1] BLOCK 32->16")
    assert [e["BLOCK"] for e in entries(proposal, tools.task)] == [64, 16, 16]


def test_a_won_direction_is_followed_first(tools):  # noqa: F811
    """A kept merge that moved SPLIT up for TIERS[0]: its next move goes on up, before the knob order's BLOCK."""
    tools.task = replace(tools.task, **FACTS)
    split = SOURCE.replace('"BLOCK": 32, "SPLIT": 1,\n     "FALLBACK": False},\n    {"M_MIN": 2',
                           '"BLOCK": 32, "SPLIT": 2,\n     "FALLBACK": False},\n    {"M_MIN": 2')
    assert split != SOURCE
    record(tools, "v1", "v0", SOURCE, "start", "keep")
    record(tools, "v2", "v1", split, "per-table merge: 1 table(s): TIERS[0] SPLIT 1->2", "keep (1.1x)")
    step, submitted = propose(tools, split, {"a": 1.0, "b": 1.0, "c": 1.0}, last="v2", label="v2")
    assert submitted.summary.startswith("per-table step: 3 table(s): TIERS[0] SPLIT 2->4, TIERS[1] BLOCK 32->64")


def test_the_last_attempt_falls_back_where_the_baseline_wins_on_every_case(tools):  # noqa: F811
    tools.task = replace(tools.task, **FACTS)
    record(tools, "v1", "v0", SOURCE, "start", "keep")
    proposal, submitted = propose(tools, SOURCE, {"a": 0.9, "b": 1.2, "c": 0.95}, iteration=20, iters=20)
    assert submitted.summary == ("per-table merge: 2 table(s): TIERS[0] FALLBACK False->True, "
                                 "TIERS[2] FALLBACK False->True")
    assert [e["FALLBACK"] for e in entries(proposal, tools.task)] == [True, False, True]


def test_an_unknown_strategy_is_refused_with_the_known_ones():
    from agent.exceptions import ProposerError
    from agent.proposers.space import range_keys, read_space

    with pytest.raises(ProposerError, match=r"SEARCH_SPACE strategy must be one of 'coordinate', 'per-table'; got "
                                            r"'greedy'"):
        read_space(SOURCE.replace('"strategy": "per-table"', '"strategy": "greedy"'), range_keys(FACTS["tier_dims"]))
    assert read_space(SOURCE, range_keys(FACTS["tier_dims"])).strategy == "per-table"


def test_a_batch_member_takes_each_tables_next_move_past_the_pending_ones(tools):  # noqa: F811
    """In a parallel run's batch the members proposed before, not yet recorded (``IterationContext.pending``), count
    as tried: the next member is a different step, each table at its next untried neighbour."""
    tools.task = replace(tools.task, **FACTS)
    start = {"a": 1.0, "b": 0.8, "c": 1.2}
    record(tools, "v1", "v0", SOURCE, "start", "keep")
    first, _ = propose(tools, SOURCE, start)
    tools.candidate.joinpath("solution.py").write_text(SOURCE)
    from agent.ledger import identity
    with pytest.raises(Submitted) as submitted:
        OfflineProposer().iterate(IterationContext(2, {}, profile(start), None, iters=20, best="v1",
                                                   pending=[identity({"solution.py": first.encode()})],
                                                   pending_sources=[first]), tools)
    second = tools.candidate.joinpath("solution.py").read_text()
    assert [e["BLOCK"] for e in entries(first, tools.task)] == [64, 64, 64]
    assert second != first and submitted.value.summary.startswith("per-table step: 3 table(s): TIERS[0] BLOCK 32->16")
    assert [e["BLOCK"] for e in entries(second, tools.task)] == [16, 16, 16]


JUMP = '    "jumps": [{"to": {"BLOCK": 16, "SPLIT": 4}, "reason": "the other path"}],\n'
JUMPING = SOURCE.replace('    "only_when": {', JUMP + '    "only_when": {')


def test_every_table_tries_a_jump_once_before_its_one_knob_moves_and_a_won_jump_is_merged(tools):  # noqa: F811
    """A jump moves several knobs of every table in one step; a table whose every case won takes the jump's values
    into the merge, and from there walks one knob at a time; a table whose jump lost never tries it again."""
    assert JUMPING != SOURCE
    tools.task = replace(tools.task, **FACTS)
    start = {"a": 1.0, "b": 0.8, "c": 1.2}
    record(tools, "v1", "v0", JUMPING, "start", "keep")
    step, submitted = propose(tools, JUMPING, start)
    assert submitted.summary.startswith("per-table step: 3 table(s): TIERS[0] BLOCK 32->16, TIERS[0] SPLIT 1->4, "
                                        "TIERS[1] BLOCK 32->16")
    assert "jump to BLOCK=16, SPLIT=4 in 3" in submitted.hypothesis
    assert [(e["BLOCK"], e["SPLIT"]) for e in entries(step, tools.task)] == [(16, 4)] * 3
    record(tools, "v2", "v1", step, submitted.summary, "revert (0.990x best)", {"a": 2.0, "b": 0.7, "c": 1.0})
    merged, submitted = propose(tools, JUMPING, start, last="v2")
    assert submitted.summary == "per-table merge: 1 table(s): TIERS[0] BLOCK 32->16, TIERS[0] SPLIT 1->4"
    assert [(e["BLOCK"], e["SPLIT"]) for e in entries(merged, tools.task)] == [(16, 4), (32, 1), (32, 1)]
    record(tools, "v3", "v1", merged, submitted.summary, "revert (1.004x best, noise 0.010)", start | {"a": 2.0})
    step2, submitted = propose(tools, JUMPING, start, last="v3")
    # TIERS[0] walks one knob from the jump's values (BLOCK 16->32, SPLIT kept at 4); the others, their jump tried,
    # take their first one-knob neighbour
    assert [(e["BLOCK"], e["SPLIT"]) for e in entries(step2, tools.task)] == [(32, 4), (64, 1), (64, 1)]
    assert "jump" not in submitted.hypothesis


def test_a_jump_is_checked_where_the_space_is_read():
    from agent.exceptions import ProposerError
    from agent.proposers.space import range_keys, read_space

    ranges = range_keys(FACTS["tier_dims"])
    assert read_space(JUMPING, ranges).jumps == [({"BLOCK": 16, "SPLIT": 4}, "the other path")]
    for to, message in [({"TILE": 16}, r"jumps\[0\]\['to'\] names 'TILE', which SEARCH_SPACE\['knobs'\] does not"),
                        ({"BLOCK": 48}, r"jumps\[0\]\['to'\]\['BLOCK'\] must be one of the knob's values \[16, 32, 64"),
                        ({"FALLBACK": 1}, r"jumps\[0\]\['to'\]\['FALLBACK'\] must be one of the knob's values"),
                        ({}, r"jumps\[0\]\['to'\] must be a non-empty dict")]:
        with pytest.raises(ProposerError, match=message):
            read_space(JUMPING.replace('{"BLOCK": 16, "SPLIT": 4}', repr(to)), ranges)
    with pytest.raises(ProposerError, match=r"SEARCH_SPACE jumps are taken by the per-table search only"):
        read_space(JUMPING.replace('"strategy": "per-table",', ""), ranges)
    rule = '    "refused": [{"when": {"SPLIT": [4], "BLOCK": [16]}, "reason": "too small"}],\n'
    refusing = JUMPING.replace('    "only_when": {', rule + '    "only_when": {')
    with pytest.raises(ProposerError, match=r"jumps\[0\] sets a refused combination .* \(too small\); no table"):
        read_space(refusing, ranges)


@pytest.mark.parametrize("timed", [True, False], ids=["timed", "wrong-somewhere"])
def test_a_lost_jump_stays_tried_after_a_win_on_a_knob_it_leaves_alone(tools, timed):  # noqa: F811
    """The jump is tried once per table: a later win on another knob makes the jump's configuration new, but the table
    has been timed at the jump's values, so it walks on one knob at a time. A jump step wrong on some case timed no
    table: the jump comes again."""
    tools.task = replace(tools.task, **FACTS)
    warps = '        "WARPS": {"values": [4, 8], "reason": "warps"},\n'
    source = JUMPING.replace('    "knobs": {\n', '    "knobs": {\n' + warps)
    source = source.replace('"SPLIT": 1,\n     "FALLBACK": False}', '"SPLIT": 1, "WARPS": 4,\n     "FALLBACK": False}')
    assert source.count('"WARPS": 4') == 3
    start = {"a": 1.0, "b": 1.0, "c": 1.0}
    record(tools, "v1", "v0", source, "start", "keep")
    step, submitted = propose(tools, source, start)
    assert "jump to" in submitted.hypothesis
    record(tools, "v2", "v1", step, submitted.summary, "revert", {"a": 0.5, "b": 0.5, "c": 0.5}, correct=timed)
    step, submitted = propose(tools, source, start, last="v2")
    assert submitted.summary.startswith("per-table step: 3 table(s): TIERS[0] WARPS 4->8")
    record(tools, "v3", "v1", step, submitted.summary, "revert", {"a": 3.0, "b": 0.5, "c": 0.5})
    merged, submitted = propose(tools, source, start, last="v3")
    assert submitted.summary == "per-table merge: 1 table(s): TIERS[0] WARPS 4->8"
    record(tools, "v4", "v1", merged, submitted.summary, "keep (2.0x best)", {"a": 3.0, "b": 1.0, "c": 1.0})
    step, submitted = propose(tools, merged, {"a": 3.0, "b": 1.0, "c": 1.0}, last="v4", label="v4")
    assert ("jump to" in submitted.hypothesis) is not timed, submitted.hypothesis
    assert ([(e["BLOCK"], e["SPLIT"]) for e in entries(step, tools.task)][0] == (16, 4)) is not timed


def test_a_table_at_its_fallback_gets_no_jump(tools):  # noqa: F811
    """Where the knobs a jump sets would not matter (only_when: the table runs the baseline), the table takes its own
    next move instead."""
    tools.task = replace(tools.task, **FACTS)
    tier = '{"M_MIN": 2, "M_MAX": 2, "N_MIN": 64, "N_MAX": 64, "K_MIN": 64, "K_MAX": 64, "BLOCK": 32, "SPLIT": 1,\n'
    source = JUMPING.replace(tier + '     "FALLBACK": False}', tier + '     "FALLBACK": True}')
    assert source != JUMPING
    record(tools, "v1", "v0", source, "start", "keep")
    step, submitted = propose(tools, source, {"a": 1.0, "b": 1.0, "c": 1.0})
    assert "jump to BLOCK=16, SPLIT=4 in 2" in submitted.hypothesis
    assert [(e["BLOCK"], e["SPLIT"], e["FALLBACK"]) for e in entries(step, tools.task)] == [
        (16, 4, False), (32, 1, False), (16, 4, False)]


def test_a_jump_leaves_a_computed_value_alone(tools):  # noqa: F811
    """A table whose value of a knob the jump sets is an expression is not jumped (render changes literals only)."""
    tools.task = replace(tools.task, **FACTS)
    computed = JUMPING.replace('"N_MIN": 128, "N_MAX": 128, "K_MIN": 64, "K_MAX": 64, "BLOCK": 32, "SPLIT": 1,',
                               '"N_MIN": 128, "N_MAX": 128, "K_MIN": 64, "K_MAX": 64, "BLOCK": 32, "SPLIT": 2 - 1,')
    assert computed != JUMPING
    record(tools, "v1", "v0", computed, "start", "keep")
    step, submitted = propose(tools, computed, {"a": 1.0, "b": 1.0, "c": 1.0})
    assert "jump to BLOCK=16, SPLIT=4 in 2" in submitted.hypothesis and '"SPLIT": 2 - 1' in step


def with_knob(source: str) -> str:
    """``source`` with a knob added to its kernel (VEC, the last in the space's order), every table holding it at the
    value that keeps the earlier code: what `agent submit` records for a kernel change with the tables unchanged."""
    knob = '        "VEC": {"values": [1, 8], "reason": {"up": "wider vectors", "down": "narrower vectors"}},\n'
    added = source.replace('"SPLIT": 1, "FALLBACK": False}', '"SPLIT": 1, "VEC": 1, "FALLBACK": False}')
    added = added.replace('"SPLIT": 1,\n     "FALLBACK": False}', '"SPLIT": 1, "VEC": 1,\n     "FALLBACK": False}')
    added = added.replace('    "only_when": {', '    "only_when": {"VEC": [{"FALLBACK": [False]}], ')
    return added.replace('        "FALLBACK": {"values"', knob + '        "FALLBACK": {"values"')


def test_a_kernel_change_with_the_tables_unchanged_goes_on_where_the_search_stopped(tools):  # noqa: F811
    """A version submitted by hand from the best with its tables unchanged but for a new knob at its old value: the
    attempts made from the best count as made from it (their tables read with the knob at the value it came in with),
    each by its gain over the numbers of the version it was made from, applied to the new best's own (its kernel may
    be faster or slower); so a table's win carries over into a merge, a gain under the margin does not, and a move
    tried from the earlier best is not tried again."""
    tools.task = replace(tools.task, **FACTS)
    added = with_knob(SOURCE)
    assert added.count('"VEC": 1') == 4 and '"VEC": {"values"' in added
    start = {"a": 1.0, "b": 0.8, "c": 1.2}
    record(tools, "v1", "v0", SOURCE, "start", "keep", start)
    step, submitted = propose(tools, SOURCE, start)
    assert [e["BLOCK"] for e in entries(step, tools.task)] == [64, 64, 64]
    # TIERS[0]'s case won, TIERS[2]'s gained less than the margin over v1's own numbers
    record(tools, "v2", "v1", step, submitted.summary, "revert (0.990x best)",
           {"a": 2.0, "b": 0.7, "c": 1.2 * (1 + MARGIN / 2)})
    record(tools, "v3", "v1", added, "a new knob, tables unchanged", "revert (no GPU)", gpu=False)
    # from v3, whose kernel the run's start measured slower on c: c's old number (over v3's) is no win, a's is
    measured = {"a": 1.1, "b": 0.8, "c": 0.9}
    merged, submitted = propose(tools, added, measured, label="v3")
    assert submitted.summary == "per-table merge: 1 table(s): TIERS[0] BLOCK 32->64", submitted.summary
    assert [(e["BLOCK"], e["VEC"]) for e in entries(merged, tools.task)] == [(64, 1), (32, 1), (32, 1)]
    # that merge reverted: the next step takes each table past the moves v2 tried (BLOCK 32->64), not those again
    record(tools, "v4", "v3", merged, submitted.summary, "revert (1.004x best, noise 0.010)",
           {"a": 2.2, "b": 0.8, "c": 0.9})
    step2, submitted = propose(tools, added, measured, last="v4", label="v3")
    assert submitted.summary.startswith("per-table step: 3 table(s): TIERS[0] SPLIT 1->2, TIERS[1] BLOCK 32->16, "
                                        "TIERS[2] BLOCK 32->16"), submitted.summary
    # a version whose tables differ (v2, a step) is no part of v3's lineage; v1 and v3 are
    from agent.proposers.per_table import History

    history = History(tools, tools.task, gpu=True, tables=find_tables(added, tools.task))
    assert history.lineage("v3", find_tables(added, tools.task)) == {"v1", "v3"}
    # the knob is read at the value it came in with (v3's general table: 1), whatever the best's general holds now
    later = History(tools, tools.task, gpu=True,
                    tables=find_tables(added.replace('"SPLIT": 1, "VEC": 1, "FALLBACK"', '"SPLIT": 1, "VEC": 8, '
                                                     '"FALLBACK"', 1), tools.task))
    assert [t.entries["VEC"] for t in later.tables("v1")] == [1, 1, 1, 1]


def test_steps_count_toward_a_merge_across_a_version_recorded_by_hand(tools):  # noqa: F811
    """The steps since the last merge attempt go on counting past a row that is neither (a version submitted by hand
    from the best): MERGE_AFTER steps bring the merge once the estimate is over MERGE_FLOOR."""
    from agent.proposers.per_table import MERGE_AFTER

    tools.task = replace(tools.task, **FACTS)
    start = {"a": 1.0, "b": 1.0, "c": 1.0}
    record(tools, "v1", "v0", SOURCE, "start", "keep", start)
    numbers, last = dict(start), None
    for i in range(MERGE_AFTER):
        proposal, submitted = propose(tools, SOURCE, start, last=last)
        assert submitted.summary.startswith("per-table step"), (i, submitted.summary)
        numbers["a"] *= 1 + 3 * MARGIN
        last = f"v{2 * i + 2}"
        record(tools, last, "v1", proposal, submitted.summary, "revert (~0.99x best)", numbers)
        record(tools, f"v{2 * i + 3}", "v1", SOURCE + "\n# a note\n", "by hand", "revert (no GPU)", gpu=False)
    merged, submitted = propose(tools, SOURCE, start, last=last)
    assert submitted.summary.startswith("per-table merge"), submitted.summary


def test_a_knob_is_read_at_the_value_it_came_in_with_on_the_bests_own_line(tools):  # noqa: F811
    """The value an earlier table is read at comes from the best's ancestry (not from a reverted attempt on another
    line), and not at all where the knob came in as an expression; a best recorded by hand from a kept merge follows
    that merge's direction first."""
    from agent.proposers.per_table import History

    tools.task = replace(tools.task, **FACTS)
    added = with_knob(SOURCE)
    start = {"a": 1.0, "b": 1.0, "c": 1.0}
    record(tools, "v1", "v0", SOURCE, "start", "keep", start)
    wide = added.replace('"SPLIT": 1, "VEC": 1, "FALLBACK"', '"SPLIT": 1, "VEC": 8, "FALLBACK"', 1)
    record(tools, "v2", "v1", wide, "another line, VEC 8 in the general table", "revert", start)
    record(tools, "v3", "v1", added, "by hand, VEC 1", "revert (no GPU)", gpu=False)
    history = History(tools, tools.task, gpu=True, tables=find_tables(added, tools.task), best="v3")
    assert history.introduced["VEC"] == 1 and history.lineage("v3", find_tables(added, tools.task)) == {"v1", "v3"}
    computed = added.replace('"SPLIT": 1, "VEC": 1, "FALLBACK"', '"SPLIT": 1, "VEC": 2 - 1, "FALLBACK"', 1)
    record(tools, "v4", "v1", computed, "by hand, VEC as an expression", "revert (no GPU)", gpu=False)
    record(tools, "v5", "v4", added, "by hand, VEC 1", "revert (no GPU)", gpu=False)
    later = History(tools, tools.task, gpu=True, tables=find_tables(added, tools.task), best="v5")
    assert "VEC" not in later.introduced and "VEC" not in later.tables("v1")[1].entries
    # momentum through a hand-recorded best: v6 merged TIERS[0] SPLIT 1->2 and was kept; v7 is v6 with the knob
    split = SOURCE.replace('"K_MAX": 64, "BLOCK": 32, "SPLIT": 1,', '"K_MAX": 64, "BLOCK": 32, "SPLIT": 2,', 1)
    record(tools, "v6", "v1", split, "per-table merge: 1 table(s): TIERS[0] SPLIT 1->2", "keep (1.1x best)", start)
    record(tools, "v7", "v6", with_knob(split), "by hand, the knob", "revert (no GPU)", gpu=False)
    step, submitted = propose(tools, with_knob(split), start, label="v7")
    assert submitted.summary.startswith("per-table step: 3 table(s): TIERS[0] SPLIT 2->4"), submitted.summary
