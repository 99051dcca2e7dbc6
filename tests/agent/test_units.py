"""The pieces without a run: the offline search, the ledger's append-only record, prompts, conversation trimming."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from agent.config import RunConfig, Task, from_dict
from agent.evaluate import Evaluator
from agent.exceptions import LimitsExceeded, Submitted
from agent.ledger import format_row, record, rows, unified_patch
from agent.prompts import render
from agent.proposers import IterationContext
from agent.proposers.offline import OfflineProposer, find_table
from agent.proposers.openai_chat import OpenAIConfig, OpenAIProposer, trim
from agent.tools import Tools
from tests.agent.test_tools import tools  # noqa: F401 (the fixture)
from tests.conftest import ROOT


def propose(tools, profile=None) -> tuple[str, Submitted]:  # noqa: F811
    with pytest.raises(Submitted) as submitted:
        OfflineProposer().iterate(IterationContext(1, {}, profile), tools)
    return (tools.candidate / "solution.py").read_text(), submitted.value


def test_offline_search_follows_the_profile_and_never_repeats_the_ledger(tools):  # noqa: F811
    start = (tools.candidate / "solution.py").read_text()
    source, submitted = propose(tools, {"strata": {"balanced": 1.0, "expert-batch": 0.8}})
    assert submitted.summary == "BLOCK_SIZE_N 64->32"  # the weaker expert-batch stratum wants more programs
    assert find_table(source).entries["BLOCK_SIZE_K"] == "GROUP_SIZE"  # computed values are kept as written
    (tools.candidate / "solution.py").write_text(start)
    source, submitted = propose(tools, {"strata": {"balanced": 0.8, "expert-batch": 1.0}})
    assert submitted.summary == "BLOCK_SIZE_N 64->128" and "expect balanced cases faster" in submitted.hypothesis
    # once that solution is in the ledger, the next proposal is another one
    ledger = tools.task.ledger_path
    ledger.write_text(ledger.read_text() + format_row({"version": "v1", "sha256": hashlib.sha256(source.encode()).hexdigest()}) + "\n")
    (tools.candidate / "solution.py").write_text(start)
    _, submitted = propose(tools, {"strata": {"balanced": 0.8, "expert-batch": 1.0}})
    assert submitted.summary != "BLOCK_SIZE_N 64->128"


def test_offline_search_picks_up_new_knobs_and_keeps_hard_limits(tools):  # noqa: F811
    source = (tools.candidate / "solution.py").read_text().replace('"num_stages": 3}', '"num_stages": 3, "SPLIT_K": 1}')
    (tools.candidate / "solution.py").write_text(source)
    _, submitted = propose(tools, {"strata": {"balanced": 1.0, "expert-batch": 0.5}})
    assert submitted.summary == "SPLIT_K 1->2"
    seen = set()
    for _ in range(12):
        (tools.candidate / "solution.py").write_text(source)
        proposal, submitted = propose(tools)
        entries = find_table(proposal).entries
        assert entries["BLOCK_SIZE_K"] == "GROUP_SIZE" and entries["BLOCK_SIZE_M"] >= 16
        assert submitted.summary not in seen
        seen.add(submitted.summary)
        ledger = tools.task.ledger_path
        ledger.write_text(ledger.read_text() + format_row({"version": "v9", "sha256": hashlib.sha256(proposal.encode()).hexdigest()}) + "\n")


def test_record_appends_rows_and_never_rewrites_earlier_ones(project: Path, tmp_path: Path):
    task = Task(root=project)
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
    assert rows(task)[-1].count(" | ") == 12 and "a / b c" in rows(task)[-1]  # a cell can never break the table


def test_prompts_fail_on_a_missing_variable_and_config_on_an_unknown_key():
    with pytest.raises(KeyError):
        render("format_error", error="x")
    assert "unknown tool" in render("format_error", error="unknown tool", tools="read_file")
    with pytest.raises(KeyError):
        render("trimmed")
    assert render("timing_interpreter").endswith("not GPU timings") and "\n" not in render("timing_gpu")
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
    assert f"[{dropped} earlier tool exchanges were trimmed" in trimmed[2]["content"] and trimmed[3]["role"] == "assistant"
    assert len(str(trimmed)) // 4 <= 1100 and trimmed[-1] == turns[-1]


def test_record_never_follows_a_symlink_in_the_candidate(project: Path, tmp_path: Path):
    task = Task(root=project)
    candidate = tmp_path / "candidate"
    candidate.mkdir()
    (candidate / "solution.py").write_text("VALUE = 1\n")
    (candidate / "leak.py").symlink_to(project / "evals" / "verifier.py")
    recorded = record(task, candidate, task.versions / "v0", "v0", {}, {}, {})
    assert sorted(p.name for p in recorded.directory.iterdir()) == ["parent.patch", "solution.py", "verdict.json"]
    assert "leak.py" not in (recorded.directory / "parent.patch").read_text()
    assert "leak.py" not in unified_patch(None, candidate, "start")


def test_offline_search_edits_the_tasks_candidate_dir(project: Path, tmp_path: Path):
    task = Task(root=project, candidate_dir="methods/alt")
    worktree = tmp_path / "worktree"
    (worktree / "methods" / "alt").mkdir(parents=True)
    start = (project / "methods" / "main" / "solution.py").read_text()
    (worktree / "methods" / "alt" / "solution.py").write_text(start)
    subprocess.run(["git", "init", "-q"], cwd=worktree, check=True)
    alt = Tools(task, worktree, Evaluator(task, "smoke", False, tmp_path / "eval"))
    source, submitted = propose(alt, {"strata": {"balanced": 0.8, "expert-batch": 1.0}})
    assert submitted.summary == "BLOCK_SIZE_N 64->128" and source != start
    assert not (worktree / "methods" / "main").exists()


def test_a_malformed_price_override_fails_at_construction_and_names_the_variable(monkeypatch: pytest.MonkeyPatch):
    for bad in ("2.5", "a,b", "1,2,3", "-1,2", "nan,1"):
        monkeypatch.setenv("KLOOP_PRICE_PER_MTOK", bad)
        with pytest.raises(ValueError, match=r"KLOOP_PRICE_PER_MTOK=.*expected 'in,out'"):
            OpenAIProposer(OpenAIConfig(model="test-model"))
    monkeypatch.setenv("KLOOP_PRICE_PER_MTOK", " 0.5, 4 ")
    assert OpenAIProposer(OpenAIConfig(model="test-model")).prices == (0.5, 4.0)


def mark_tried(tools, source: str) -> None:  # noqa: F811
    ledger = tools.task.ledger_path
    ledger.write_text(ledger.read_text() + format_row({"version": "v9", "sha256": hashlib.sha256(source.encode()).hexdigest()}) + "\n")


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
    assert len(singles) >= 10  # v0's five knobs, each with its neighbours
    first, second = submitted.summary.split(" + ")
    assert first in singles and second in singles and first.split()[0] != second.split()[0]
    assert "combine two" in submitted.hypothesis
    entries, base = find_table(proposal).entries, find_table(start).entries
    assert sum(entries[k] != base[k] for k in base) == 2


TIERED = '''GROUP_SIZE = 128


def get_config():
    return {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": GROUP_SIZE, "SPLIT_K": 0, "num_warps": 4}


TIERS = [
    {"N_MIN": 256, "N_MAX": 2048, "K_MIN": 128, "K_MAX": 1 << 40, "BLOCK_SIZE_N": 64, "SPLIT_K": 0, "num_warps": 4},
    {"N_MIN": 4096, "N_MAX": 1 << 40, "K_MIN": 128, "K_MAX": 1 << 40, "BLOCK_SIZE_N": 32, "SPLIT_K": 1},
]
'''


def test_offline_search_edits_the_tier_of_the_weaker_stratum_and_skips_shadowed_general_knobs(tools):  # noqa: F811
    (tools.candidate / "solution.py").write_text(TIERED)
    proposal, submitted = propose(tools, {"strata": {"balanced": 1.0, "expert-batch": 0.5}})
    assert submitted.summary == "TIERS[0] SPLIT_K 0->1"  # the expert-batch tier, its first knob
    assert proposal.replace('"SPLIT_K": 1, "num_warps": 4}', '"SPLIT_K": 0, "num_warps": 4}', 1) == TIERED
    proposal, submitted = propose(tools, {"strata": {"balanced": 0.5, "expert-batch": 1.0}})
    assert submitted.summary.startswith("TIERS[1] BLOCK_SIZE_N 32->64")
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


# The split-K draft's tables as ledger v40 had them: a general table and two tiers, one per orientation.
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
'''


def test_offline_search_leaves_out_knobs_that_decide_nothing():
    from agent.proposers.offline import find_tables, single_moves

    tables = find_tables(TWO_TIERS)
    assert [t.name for t in tables] == ["config", "TIERS[0]", "TIERS[1]"]
    moves = {(m.table, m.knob) for m in single_moves(tables, None)}
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
    moves = {(m.table, m.knob) for m in single_moves(find_tables(unsplit), None)}
    assert not {("TIERS[0]", "REDUCE_MODE"), ("TIERS[0]", "MIN_PROGRAMS"), ("TIERS[1]", "MIN_PROGRAMS")} & moves


def test_offline_search_reads_the_drafts_tables_and_never_proposes_a_combination_it_refuses(tools):  # noqa: F811
    from agent.proposers.offline import find_tables, refused

    draft = (ROOT / "methods" / "drafts" / "splitk" / "solution.py").read_text()
    tables = find_tables(draft)
    assert tables[0].name == "config" and tables[0].entries["LAYOUT"] == 3 and tables[0].entries["DEQUANT"] == 2
    assert refused(tables) is None
    assert refused(find_tables(draft.replace('"DEQUANT": 2,', '"DEQUANT": 0,', 1))) == "LAYOUT 3 needs DEQUANT 1 or 2"
    stream_no_swap = draft.replace('"GRID": 0,', '"GRID": 1,', 1).replace('"SWAP_AB": 1,', '"SWAP_AB": 0,', 1)
    assert refused(find_tables(stream_no_swap.replace('"LAYOUT": 3,', '"LAYOUT": 0,', 1))) == "GRID 1 (stream-K) needs SWAP_AB 1"
    (tools.candidate / "solution.py").write_text(draft)
    for _ in range(12):
        proposal, submitted = propose(tools)
        assert refused(find_tables(proposal)) is None, submitted.summary
        assert "DEQUANT 2->0" not in submitted.summary  # with LAYOUT 3 in every table
        mark_tried(tools, proposal)
        (tools.candidate / "solution.py").write_text(draft)


def test_offline_search_never_combines_a_move_that_failed_on_its_own(tools):  # noqa: F811
    start = (tools.candidate / "solution.py").read_text()
    ledger = tools.task.ledger_path
    failed = None
    while True:
        (tools.candidate / "solution.py").write_text(start)
        proposal, submitted = propose(tools)
        if " + " in submitted.summary:
            break
        row = {"version": "v9", "sha256": hashlib.sha256(proposal.encode()).hexdigest(), "correct": "yes",
               "residency": "not run (slower)", "summary / hypothesis": f"{submitted.summary}; hypothesis: h"}
        if failed is None and submitted.summary.startswith("num_stages"):
            failed = submitted.summary  # as if it did not compile (OutOfResources)
            row |= {"correct": "no", "residency": "-"}
        ledger.write_text(ledger.read_text() + format_row(row) + "\n")
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
