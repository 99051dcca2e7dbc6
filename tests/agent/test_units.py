"""The pieces without a run: the offline search, the ledger's append-only record, prompts, conversation trimming."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from agent.config import RunConfig, Task, from_dict
from agent.evaluate import Evaluator
from agent.exceptions import LimitsExceeded, Submitted
from agent.ledger import columns, format_row, identity, record, rows, unified_patch
from agent.loop import gpu_timing_note, last_iteration
from agent.prompts import render
from agent.proposers import IterationContext
from agent.proposers.offline import OfflineProposer, find_table
from agent.proposers.openai_chat import OpenAIConfig, OpenAIProposer, trim
from agent.tools import Tools
from tests.agent.test_tools import tools  # noqa: F401 (the fixture)
from tests.conftest import ROOT, W4A16_FAMILY

W4A16 = Task.load(ROOT)  # the task the offline tests' tables belong to (tiers key on n and k)


def propose(tools, profile=None, gpu=None) -> tuple[str, Submitted]:  # noqa: F811
    with pytest.raises(Submitted) as submitted:
        OfflineProposer().iterate(IterationContext(1, {}, profile, gpu=gpu), tools)
    return (tools.candidate / "solution.py").read_text(), submitted.value


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def mark_tried(tools, source: str) -> None:  # noqa: F811
    ledger = tools.task.ledger_path
    ledger.write_text(ledger.read_text() + format_row({"version": "v9", "sha256": _sha(source)}, tools.task) + "\n")


def changes(before: list, after: list) -> set[tuple[str, str, object]]:
    """(table, knob, value) of every entry ``after`` holds differently (a new tier: all its knobs)."""
    from agent.proposers.space import range_keys

    old = {t.name: t.entries for t in before}
    return {(t.name, k, v) for t in after for k, v in t.entries.items()
            if k not in range_keys(W4A16.tier_dims) and (k not in old.get(t.name, {}) or old[t.name][k] != v)}


# v0 with a tier per stratum (v0 itself reads no TIERS; the search only edits the tables)
V0_TIERS = """

TIERS = [
    {"N_MIN": 1, "N_MAX": 2048, "K_MIN": 128, "K_MAX": 1 << 40, "BLOCK_SIZE_N": 64},
    {"N_MIN": 4096, "N_MAX": 1 << 40, "K_MIN": 128, "K_MAX": 1 << 40, "BLOCK_SIZE_N": 64},
]
"""


def test_offline_search_follows_the_profile_and_never_repeats_the_ledger(tools):  # noqa: F811
    v0 = (tools.candidate / "solution.py").read_text()
    source, submitted = propose(tools, {"strata": {"balanced": 1.0, "expert-batch": 0.8}})
    assert submitted.summary == "BLOCK_SIZE_M 32->64"  # one table: get_config's order, toward later values first
    assert find_table(source, W4A16).entries["BLOCK_SIZE_K"] == "GROUP_SIZE"  # computed values are kept as written
    assert "TIERS" not in source  # v0 names no TIERS: a tier would change nothing
    start = v0.replace("\n\n\n@triton.jit", V0_TIERS + "\n\n@triton.jit", 1)
    assert start != v0
    (tools.candidate / "solution.py").write_text(start)
    _, submitted = propose(tools, {"strata": {"balanced": 1.0, "expert-batch": 0.8}})
    assert submitted.summary == "TIERS[0] BLOCK_SIZE_N 64->128"  # the weaker expert-batch stratum's tier first
    (tools.candidate / "solution.py").write_text(start)
    source, submitted = propose(tools, {"strata": {"balanced": 0.8, "expert-batch": 1.0}})
    assert submitted.summary == "TIERS[1] BLOCK_SIZE_N 64->128" and "BLOCK_SIZE_N tile" in submitted.hypothesis
    # once that solution is in the ledger, the next proposal is another one
    ledger = tools.task.ledger_path
    ledger.write_text(ledger.read_text() + format_row({"version": "v1", "sha256": _sha(source)}, tools.task) + "\n")
    (tools.candidate / "solution.py").write_text(start)
    _, submitted = propose(tools, {"strata": {"balanced": 0.8, "expert-batch": 1.0}})
    assert submitted.summary == "TIERS[1] BLOCK_SIZE_N 64->32"


@pytest.mark.parametrize("verdict,again", [({"correct": True, "gpu_timing": False}, True),
                                           ({"correct": True, "gpu_timing": True}, False),
                                           ({"correct": False, "gpu_timing": False}, False), (None, False)],
                         ids=["interpreter-only", "gpu-timed", "wrong", "no-verdict"])
def test_a_gpu_run_proposes_again_only_what_the_interpreter_alone_ran_right(tools, verdict, again):  # noqa: F811
    """A solution only the interpreter ran, correctly, was never timed: a GPU run may propose it again (the run says
    where it evaluates, with or without a profile). One timed on a GPU, one wrong anywhere and one whose verdict is
    missing stay tried, and an interpreter run never proposes a recorded solution again."""
    v0 = (tools.candidate / "solution.py").read_text()
    strata = {"strata": {"balanced": 1.0, "expert-batch": 0.8}}
    source, submitted = propose(tools, strata)
    first = submitted.summary
    ledger = tools.task.ledger_path
    ledger.write_text(ledger.read_text() + format_row({"version": "v1", "sha256": _sha(source)}, tools.task) + "\n")
    if verdict is not None:
        folder = tools.task.root / tools.task.versions_dir / "v1"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "verdict.json").write_text(json.dumps(verdict))
    for gpu, profile in ((True, strata), (True, None), (False, strata)):
        (tools.candidate / "solution.py").write_text(v0)
        _, submitted = propose(tools, profile, gpu=gpu)
        assert (submitted.summary == first) is (again and gpu), (gpu, profile, submitted.summary)


def test_a_proposal_whose_files_a_row_identifies_is_never_made_again(tools):  # noqa: F811
    """A row's sha256 is the identity of every file of its version: the proposal with the candidate's helper files
    as they are; the same solution.py beside another helper is another version, and is proposed."""
    (tools.candidate / "helper.py").write_text("X = 1\n")
    source, submitted = propose(tools, {"strata": {"balanced": 1.0, "expert-batch": 0.8}})
    assert submitted.summary == "BLOCK_SIZE_M 32->64"
    v0 = (tools.task.root / tools.task.versions_dir / "v0" / "solution.py").read_text()
    ledger = tools.task.ledger_path
    other = identity({"solution.py": source.encode(), "helper.py": b"X = 2\n"})
    ledger.write_text(ledger.read_text() + format_row({"version": "v1", "sha256": other}, tools.task) + "\n")
    (tools.candidate / "solution.py").write_text(v0)
    assert propose(tools, {"strata": {"balanced": 1.0, "expert-batch": 0.8}})[1].summary == "BLOCK_SIZE_M 32->64"
    same = identity({"solution.py": source.encode(), "helper.py": b"X = 1\n"})
    ledger.write_text(ledger.read_text() + format_row({"version": "v2", "sha256": same}, tools.task) + "\n")
    (tools.candidate / "solution.py").write_text(v0)
    assert propose(tools, {"strata": {"balanced": 1.0, "expert-batch": 0.8}})[1].summary != "BLOCK_SIZE_M 32->64"


def test_offline_search_searches_only_declared_knobs_and_their_values(tools):  # noqa: F811
    v0 = (tools.candidate / "solution.py").read_text()
    source = v0.replace('"num_stages": 3}', '"num_stages": 3, "SPLIT_K": 1}')
    assert source != v0
    seen = set()
    for _ in range(12):  # without a SEARCH_SPACE, a knob of the solution's own is never moved
        (tools.candidate / "solution.py").write_text(source)
        proposal, submitted = propose(tools)
        assert "SPLIT_K" not in submitted.summary and find_table(proposal, W4A16).entries["SPLIT_K"] == 1
        mark_tried(tools, proposal)
    space = ('\n\nSEARCH_SPACE = {"knobs": {"SPLIT_K": {"values": [1, 2, 4], "reason": "more programs along K"},\n'
             '                            "BLOCK_SIZE_M": {"values": [16, 32], "reason": "tl.dot needs 16 rows"}}}\n')
    source = source.replace("\n\n\n@triton.jit", space + "\n\n@triton.jit", 1)
    (tools.candidate / "solution.py").write_text(source)
    _, submitted = propose(tools, {"strata": {"balanced": 1.0, "expert-batch": 0.5}})
    assert submitted.summary == "SPLIT_K 1->2" and submitted.hypothesis.startswith("more programs along K (config:")
    for _ in range(12):
        (tools.candidate / "solution.py").write_text(source)
        try:
            proposal, submitted = propose(tools)
        except LimitsExceeded:
            break
        entries = find_table(proposal, W4A16).entries
        assert entries["BLOCK_SIZE_K"] == "GROUP_SIZE" and entries["BLOCK_SIZE_M"] in (16, 32)  # declared values only
        assert entries["BLOCK_SIZE_N"] == 64 and entries["num_warps"] == 4  # declared knobs only
        assert submitted.summary not in seen
        seen.add(submitted.summary)
        mark_tried(tools, proposal)
    assert seen == {"SPLIT_K 1->2", "SPLIT_K 1->4", "BLOCK_SIZE_M 32->16", "SPLIT_K 1->2 + BLOCK_SIZE_M 32->16",
                    "BLOCK_SIZE_M 32->16 + SPLIT_K 1->4"}


def test_record_appends_rows_and_never_rewrites_earlier_ones(project: Path, tmp_path: Path):
    task = Task.load(project)
    candidate = tmp_path / "candidate"
    candidate.mkdir()
    before = task.ledger_path.read_text()
    versions = []
    for number in range(3):
        (candidate / "solution.py").write_text(f"VALUE = {number}\n")
        text_before = task.ledger_path.read_text()
        recorded = record(task, candidate, task.versions / "v0", "v0", {"summary / hypothesis": "a | b\nc"}, {}, {})
        assert task.ledger_path.read_text().startswith(text_before)
        versions.append(recorded.version)
    assert versions == ["v1", "v2", "v3"] and task.ledger_path.read_text().startswith(before)
    # a cell can never break the table
    assert rows(task)[-1].count(" | ") == len(columns(task)) - 1 and "a / b c" in rows(task)[-1]


def test_prompts_fail_on_a_missing_variable_and_config_on_an_unknown_key():
    with pytest.raises(KeyError):
        render("format_error", error="x")
    assert "unknown tool" in render("format_error", error="unknown tool", tools="read_file")
    with pytest.raises(KeyError):
        render("trimmed")
    assert render("timing_interpreter").endswith("not GPU timings") and "\n" not in render("timing_gpu")
    assert "\n" not in render("timing_graph") and "L2-flushed" in render("timing_graph")
    # the task's manifest says which (the prompt's timing note and the run report's timing row)
    assert gpu_timing_note(Task.load(ROOT, "llgemm")) == render("timing_graph")
    assert gpu_timing_note(Task.load(ROOT, "w4a16")) == render("timing_gpu")
    with pytest.raises(ValueError, match="unknown key"):
        from_dict(RunConfig, {"iters": 3, "iterations": 4})


def test_trim_keeps_tool_replies_with_their_calls():
    head = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    turns = []
    for number in range(20):
        turns += [{"role": "assistant", "content": "", "tool_calls": [{"id": f"c{number}"}]},
                  {"role": "tool", "tool_call_id": f"c{number}", "content": "x" * 400}]
    trimmed = trim(head + turns, 1000)
    dropped = (len(head + turns) - len(trimmed) + 1) // 2
    assert trimmed[:2] == head and trimmed[2]["content"] == render("trimmed", dropped=dropped)
    assert f"[{dropped} earlier tool exchanges were trimmed" in trimmed[2]["content"]
    assert trimmed[3]["role"] == "assistant"
    assert len(str(trimmed)) // 4 <= 1100 and trimmed[-1] == turns[-1]


def test_record_never_follows_a_symlink_in_the_candidate(project: Path, tmp_path: Path):
    task = Task.load(project)
    candidate = tmp_path / "candidate"
    candidate.mkdir()
    (candidate / "solution.py").write_text("VALUE = 1\n")
    (candidate / "leak.py").symlink_to(project / "evals" / "verifier.py")
    recorded = record(task, candidate, task.versions / "v0", "v0", {}, {}, {})
    assert sorted(p.name for p in recorded.directory.iterdir()) == ["parent.patch", "solution.py", "verdict.json"]
    assert "leak.py" not in (recorded.directory / "parent.patch").read_text()
    assert "leak.py" not in unified_patch(None, candidate, "start")


def test_offline_search_edits_the_tasks_candidate_dir(project: Path, tmp_path: Path):
    task = dataclasses.replace(Task.load(project), candidate_dir="methods/alt")
    worktree = tmp_path / "worktree"
    (worktree / "methods" / "alt").mkdir(parents=True)
    start = (project / "methods" / "main" / "solution.py").read_text()
    (worktree / "methods" / "alt" / "solution.py").write_text(start)
    subprocess.run(["git", "init", "-q"], cwd=worktree, check=True)
    alt = Tools(task, worktree, Evaluator(task, "smoke", False, tmp_path / "eval"))
    source, submitted = propose(alt, {"strata": {"balanced": 0.8, "expert-batch": 1.0}})
    assert submitted.summary == "BLOCK_SIZE_M 32->64" and source != start
    assert not (worktree / "methods" / "main").exists()


def test_a_malformed_price_override_fails_at_construction_and_names_the_variable(monkeypatch: pytest.MonkeyPatch):
    for bad in ("2.5", "a,b", "1,2,3", "-1,2", "nan,1"):
        monkeypatch.setenv("KLOOP_PRICE_PER_MTOK", bad)
        with pytest.raises(ValueError, match=r"KLOOP_PRICE_PER_MTOK=.*expected 'in,out'"):
            OpenAIProposer(OpenAIConfig(model="test-model"))
    monkeypatch.setenv("KLOOP_PRICE_PER_MTOK", " 0.5, 4 ")
    assert OpenAIProposer(OpenAIConfig(model="test-model")).prices == (0.5, 4.0)


def test_offline_search_combines_two_knobs_once_every_single_neighbour_is_in_the_ledger(tools):  # noqa: F811
    start = (tools.candidate / "solution.py").read_text()
    singles = set()
    while True:
        (tools.candidate / "solution.py").write_text(start)
        proposal, submitted = propose(tools)
        if " + " in submitted.summary:
            break
        assert submitted.summary not in singles
        singles.add(submitted.summary)
        mark_tried(tools, proposal)
    assert len(singles) >= 10  # v0's four launch knobs, each with its neighbours
    first, second = submitted.summary.split(" + ")
    assert first in singles and second in singles and first.split()[0] != second.split()[0]
    assert "combine two" in submitted.hypothesis
    entries, base = find_table(proposal, W4A16).entries, find_table(start, W4A16).entries
    assert sum(entries[k] != base[k] for k in base) == 2


TIERED = '''GROUP_SIZE = 128


def get_config():
    return {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": GROUP_SIZE, "SPLIT_K": 0, "num_warps": 4}


TIERS = [
    {"N_MIN": 256, "N_MAX": 2048, "K_MIN": 128, "K_MAX": 1 << 40, "BLOCK_SIZE_N": 64, "SPLIT_K": 0, "num_warps": 4},
    {"N_MIN": 4096, "N_MAX": 1 << 40, "K_MIN": 128, "K_MAX": 1 << 40, "BLOCK_SIZE_N": 32, "SPLIT_K": 1},
]

SEARCH_SPACE = {"knobs": {
    "SPLIT_K": {"values": [0, 1, 2, 4], "reason": "more programs along K fill the SMs"},
    "BLOCK_SIZE_N": {"values": [32, 64, 128], "reason": "wider N tiles stream more weight per program"},
    "BLOCK_SIZE_M": {"values": [16, 32], "reason": "one M tile covers every scored M"},
    "num_warps": {"values": [2, 4, 8], "reason": "more warps hide the load latency"},
}}
'''


def test_offline_search_edits_the_tier_of_the_weaker_stratum_and_skips_shadowed_general_knobs(tools):  # noqa: F811
    (tools.candidate / "solution.py").write_text(TIERED)
    proposal, submitted = propose(tools, {"strata": {"balanced": 1.0, "expert-batch": 0.5}})
    assert submitted.summary == "TIERS[0] SPLIT_K 0->1"  # the expert-batch tier, its first knob
    assert proposal.replace('"SPLIT_K": 1, "num_warps": 4}', '"SPLIT_K": 0, "num_warps": 4}', 1) == TIERED
    proposal, submitted = propose(tools, {"strata": {"balanced": 0.5, "expert-batch": 1.0}})
    assert submitted.summary == "TIERS[1] SPLIT_K 1->2" and submitted.hypothesis.startswith("more programs along K")
    # BLOCK_SIZE_N and SPLIT_K of the general table are overridden by a tier for both strata: never proposed
    seen = []
    for _ in range(30):
        (tools.candidate / "solution.py").write_text(TIERED)
        try:
            proposal, submitted = propose(tools)
        except LimitsExceeded:
            break
        seen.append(submitted.summary)
        mark_tried(tools, proposal)
        compile(proposal, "solution.py", "exec")  # every rendering is valid Python
    singles = [s for s in seen if " + " not in s]
    assert not any(s.startswith(("BLOCK_SIZE_N", "SPLIT_K")) for s in singles)
    assert any(s.startswith("num_warps") for s in singles)  # the general num_warps still decides the balanced tier
    assert not any("K_MIN" in s or "N_MAX" in s for s in seen)  # a tier's range is not a knob


# A general table and two tiers, one per orientation, in the shape of an older split-K plan table.
TWO_TIERS = '''GROUP_SIZE = 128


def get_config():
    return {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": GROUP_SIZE, "SPLIT_K": 0, "MIN_PROGRAMS": 264,
            "SWAP_AB": 1, "LAYOUT": 0, "UNPACK": 0, "MAGIC": 1, "SCALE_AFTER_DOT": 1, "REDUCE_MODE": 0,
            "REDUCE_BLOCK": 1024, "REDUCE_WARPS": 4, "num_warps": 4, "num_stages": 3}


TIERS = [
    {"N_MIN": 256, "N_MAX": 2048, "K_MIN": 128, "K_MAX": 1 << 40,
     "BLOCK_SIZE_N": 64, "SPLIT_K": 0, "MIN_PROGRAMS": 264, "SWAP_AB": 0, "LAYOUT": 0, "REDUCE_MODE": 0,
     "num_warps": 4, "num_stages": 3},
    {"N_MIN": 4096, "N_MAX": 1 << 40, "K_MIN": 128, "K_MAX": 1 << 40,
     "BLOCK_SIZE_N": 128, "SPLIT_K": 0, "MIN_PROGRAMS": 264, "SWAP_AB": 1, "LAYOUT": 2, "REDUCE_MODE": 0,
     "num_warps": 4, "num_stages": 3},
]

SEARCH_SPACE = {
    "knobs": {
        "BLOCK_SIZE_N": {"values": [64, 128, 256], "reason": "wider N tiles"},
        "SPLIT_K": {"values": [0, 1, 2, 4, 8], "reason": "more programs along K"},
        "MIN_PROGRAMS": {"values": [132, 264, 396, 528], "reason": "more split-K programs per SM"},
        "SWAP_AB": {"values": [0, 1], "reason": "the N tile as the MMA's M dimension"},
        "LAYOUT": {"values": [0, 1, 2, 3], "reason": "words repacked in the order the kernel reads them"},
        "UNPACK": {"values": [0, 1], "reason": "load the word of every row"},
        "REDUCE_MODE": {"values": [0, 1], "reason": "one launch, atomic split-K sums"},
        "num_warps": {"values": [2, 4, 8], "reason": "more warps"},
        "num_stages": {"values": [2, 3, 4, 5], "reason": "a deeper pipeline"},
    },
    # SPLIT_K 0: the solution's own split count, which MIN_PROGRAMS sets; 1: no split, so nothing to reduce
    "only_when": {"MIN_PROGRAMS": [{"SPLIT_K": [0]}], "REDUCE_MODE": [{"SPLIT_K": [0, 2, 4, 8]}],
                  "LAYOUT": [{"SWAP_AB": [1]}], "UNPACK": [{"SWAP_AB": [0]}]},
}
'''


def test_offline_search_leaves_out_knobs_that_decide_nothing():
    from agent.proposers.offline import find_tables, single_moves
    from agent.proposers.space import range_keys, read_space

    tables, space = find_tables(TWO_TIERS, W4A16), read_space(TWO_TIERS, range_keys(W4A16.tier_dims))
    assert [t.name for t in tables] == ["config", "TIERS[0]", "TIERS[1]"]
    moves = {(m.table, m.knob) for m in single_moves(tables, None, space, W4A16)}
    # both tiers choose their split count (SPLIT_K 0), and with it the reduction
    assert {("TIERS[0]", "MIN_PROGRAMS"), ("TIERS[1]", "MIN_PROGRAMS"), ("TIERS[0]", "REDUCE_MODE")} <= moves
    for knob in ("BLOCK_SIZE_N", "num_stages", "SWAP_AB", "REDUCE_MODE"):
        assert ("config", knob) not in moves  # every tier sets it
    assert ("config", "UNPACK") in moves  # the expert-batch tier (x @ W) takes the general value
    assert ("TIERS[1]", "LAYOUT") in moves and ("TIERS[0]", "LAYOUT") not in moves  # LAYOUT is swap-AB's alone
    assert ("config", "LAYOUT") not in moves  # the only swap-AB tier sets it
    unsplit = TWO_TIERS.replace('"SPLIT_K": 0, "MIN_PROGRAMS": 264, "SWAP_AB"',
                                '"SPLIT_K": 1, "MIN_PROGRAMS": 264, "SWAP_AB"')
    assert unsplit.count('"SPLIT_K": 1, "MIN_PROGRAMS": 264, "SWAP_AB"') == 2  # no tier splits K any more
    moves = {(m.table, m.knob) for m in single_moves(find_tables(unsplit, W4A16), None, space, W4A16)}
    assert not {("TIERS[0]", "REDUCE_MODE"), ("TIERS[0]", "MIN_PROGRAMS"), ("TIERS[1]", "MIN_PROGRAMS")} & moves


def test_offline_search_reads_the_familys_space_and_never_proposes_a_combination_it_refuses(tools):  # noqa: F811
    from agent.proposers.offline import NOT_MEASURED, find_tables, refused
    from agent.proposers.space import range_keys, read_space

    draft = (W4A16_FAMILY / "solution.py").read_text()
    space, tables = read_space(draft, range_keys(W4A16.tier_dims)), find_tables(draft, W4A16)
    assert refused(tables, space) is None  # the draft holds no combination it refuses (if it declares any)
    launch = {k for k in space.knobs if k.startswith("BLOCK_SIZE_") or k in ("num_warps", "num_stages")}
    held = {k for t in tables for k in t.entries}
    moved, marked = set(), 0
    for _ in range(250):  # every single move, then pairs
        (tools.candidate / "solution.py").write_text(draft)
        try:
            proposal, submitted = propose(tools)
        except LimitsExceeded:
            break
        mark_tried(tools, proposal)
        after = find_tables(proposal, W4A16)
        assert refused(after, space) is None, submitted.summary
        for table in after:  # the same, without refused(): no table's effective values hold a refused combination
            seen = {**after[0].entries, **table.entries}
            for when, reason in space.refused:
                assert not all(seen.get(k) in allowed for k, allowed in when.items()), (submitted.summary, reason)
        moves = changes(tables, after)
        assert moves and all(value in space.knobs[knob].values for _, knob, value in moves), submitted.summary
        moved |= {knob for _, knob, _ in moves}
        unmeasured = any(value in space.knobs[knob].unmeasured for _, knob, value in moves)
        assert (NOT_MEASURED in submitted.hypothesis.split(" (config: ")[0]) == unmeasured, submitted.summary
        marked += unmeasured
    assert moved <= set(space.knobs) & held and moved - launch  # the draft's own switches: the space was read
    if any(space.knobs[k].unmeasured for k in space.knobs if k in held):
        assert marked, "no proposal tried a value the draft marks as not yet measured"


def test_offline_search_never_combines_a_move_that_failed_on_its_own(tools):  # noqa: F811
    start = (tools.candidate / "solution.py").read_text()
    ledger = tools.task.ledger_path
    failed = None
    while True:
        (tools.candidate / "solution.py").write_text(start)
        proposal, submitted = propose(tools)
        if " + " in submitted.summary:
            break
        row = {"version": "v9", "sha256": _sha(proposal), "correct": "yes",
               "residency": "not run (not kept)", "summary / hypothesis": f"{submitted.summary}; hypothesis: h"}
        if failed is None and submitted.summary.startswith("num_stages"):
            failed = submitted.summary  # as if it did not compile (OutOfResources)
            row |= {"correct": "no", "residency": "-"}
        ledger.write_text(ledger.read_text() + format_row(row, tools.task) + "\n")
    assert failed is not None
    seen = []
    for _ in range(25):
        seen.append(submitted.summary)
        mark_tried(tools, proposal)
        (tools.candidate / "solution.py").write_text(start)
        try:
            proposal, submitted = propose(tools)
        except LimitsExceeded:
            break
    assert seen and all(" + " in s for s in seen) and not any(failed in s for s in seen)


def test_the_correct_cell_tells_a_raise_from_a_wrong_result():
    from agent.evaluate import correct_cell

    assert correct_cell({"correct": True, "raised": False}) == "yes"
    assert correct_cell({"correct": False, "raised": False}) == "no"
    assert correct_cell({"correct": False, "raised": True}) == "error"  # e.g. OutOfResources: it never computed
    assert correct_cell({"correct": None, "raised": False}) == "-"


def test_the_decision_keeps_the_whole_reason_and_names_interpreter_timings():
    from agent.loop import decision

    oom = ("incorrect: 18x8192x8192-silu: correctness (normal): OutOfResources: out of resource: shared memory, "
           "Required: 2621440, Hardware limit: 232448. Reducing block sizes or `num_stages` may help.")
    failed = {"keep": False, "valid": False, "gpu_timing": False,
              "stages": [{"name": "policy", "ok": True, "note": "ok"}, {"name": "selfcheck", "ok": False, "note": oom}]}
    assert decision(failed) == "revert: selfcheck " + oom  # the whole reason, its memory part included
    policy = dict(failed, stages=[{"name": "policy", "ok": False, "note": "policy violations: solution.py:3 [syntax] "
                                                                         "invalid syntax (line 3, col 8)"}])
    assert decision(policy) == "revert: policy violations: solution.py:3 [syntax] invalid syntax (line 3, col 8)"
    timed = {"keep": True, "valid": True, "speedup_over_best": 1.78, "noise": 0.01}
    # without a GPU nothing is kept, however fast: interpreter wall times rank nothing, and the cell says so
    assert decision(dict(timed, keep=False, gpu_timing=False)) == (
        "revert (no GPU: nothing is kept on interpreter timings, which rank nothing; 1.780x best, noise 0.010)")
    assert decision(dict(timed, gpu_timing=True)) == "keep (1.780x best, noise 0.010)"
    slower = {"keep": False, "valid": True, "speedup_over_best": 0.9, "noise": None, "gpu_timing": False,
              "compare_note": "estimated from both scores against the baseline; not timed against the best"}
    assert decision(slower) == ("revert (no GPU: nothing is kept on interpreter timings, which rank nothing; "
                                "~0.900x best from both scores against the baseline)")
    unmeasured = dict(slower, speedup_over_best=None)
    assert decision(unmeasured) == "revert (no GPU: nothing is kept on interpreter timings, which rank nothing)"


def test_the_evaluation_limit_follows_the_panel_within_the_floor_and_the_tasks_limit(project: Path):
    from agent.evaluate import LIMIT_FLOOR_S, LIMIT_PER_START, panel_limit

    task = dataclasses.replace(Task.load(project), eval_timeout_s=900)
    assert panel_limit(task, 1.0) == LIMIT_FLOOR_S
    assert panel_limit(task, 20.0) == 20.0 * LIMIT_PER_START < 900
    assert panel_limit(task, 600.0) == 900
    assert panel_limit(dataclasses.replace(task, eval_timeout_s=12), 20.0) == 12  # KLOOP_EVAL_TIMEOUT stays a cap


def test_an_iteration_is_the_last_at_the_iteration_limit_or_when_the_clock_leaves_no_room_for_another():
    assert last_iteration(20, 20, None, 0.0, []) and not last_iteration(19, 20, None, 1e9, [30.0])
    # 7.5 minutes: at 420 s, 30 s are left and a typical attempt (the median of the last five) takes 31 s
    walls = [900.0, 900.0, 900.0, 25.0, 60.0, 31.0, 28.0, 33.0]  # the 900 s attempts are past the last five
    assert last_iteration(9, 40, 7.5, 420.0, walls)
    assert not last_iteration(9, 40, 7.5, 410.0, walls)  # 40 s left: another attempt starts after this one
    assert not last_iteration(1, 40, 7.5, 449.0, [])  # no attempt timed yet: nothing to judge by
    assert last_iteration(40, 40, 7.5, 0.0, [25.0])
