"""The residency guard on CPU (accounting by enumeration), as a real subprocess over real solutions."""
import gc
import json
import os
import subprocess
import sys

import pytest
import torch

from evals import residency
from evals.residency import MIB, Checkpoint, Storage, live_storages, quiet_heap, run_shard, settle
from evals.task import load
from tests.conftest import ROOT

CASE = ("balanced", 19, 512, 256, "silu", 3)
w4 = load("w4a16").adapter


def guard(solution, panel, tmp_path, calls=8, task=None, jobs=1):
    out = tmp_path / f"residency-{jobs}.json"
    run = subprocess.run([sys.executable, "-m", "evals.residency", "--solution", str(solution), "--panel", str(panel),
                          "--calls", str(calls), "--json", str(out), "--jobs", str(jobs)]
                         + (["--task", str(task)] if task else []),
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    return run, (json.loads(out.read_text()) if out.exists() else None)


def test_allowance_follows_the_spec_formula():
    a = w4.residency(w4.Case("balanced", 24, 8192, 28672, "silu", 1))
    assert a.total == 8192 * 28672 // 2 + 64 * 28672 * 2 + max(8 * MIB, 4 * 24 * 8192 + 8 * 24 * 28672)
    assert a.floating == 2 * 24 * 8192 + 4 * 24 * 28672 + MIB
    assert (a.byte_codes, a.half_floats) == (8192 * 28672, 2 * 8192 * 28672)


def test_the_w4a16_audit_exempts_one_scale_copy_and_one_repack_and_records_its_figures():
    """The task's allowance keeps its rules: one (K/128, N) fp16 scale copy is no floating storage, the largest
    integer storage of at most K*N/2 bytes no workspace; a checkpoint's record keeps the report's fields."""
    a = w4.residency(w4.Case("balanced", 24, 8192, 28672, "silu", 1))
    new = [Storage(64 * 28672 * 2, "float16", (64, 28672)), Storage(8192 * 28672 // 2, "int32", (1024, 28672)),
           Storage(4096, "float32", (1024,))]
    point = Checkpoint("build", sum(s.nbytes for s in new) + 512, {}, 512, [])
    point.figures = a.account(point, new)
    assert point.figures == {"floating_bytes": 4096 + 512, "workspace_bytes": 4096 + 512,
                             "scale_copy_exempt": [64, 28672]}
    assert a.audit(point, new) == []
    record = point.to_dict()
    assert list(record) == ["name", "total_bytes", "floating_bytes", "workspace_bytes", "scale_copy_exempt",
                            "by_dtype", "unattributed_bytes", "largest", "violations"]
    assert point.quoted(a) == {"floating_bytes": 4096 + 512}
    big = new + [Storage(a.floating, "int16", (a.floating // 2,))]  # a second integer buffer is workspace
    point.figures = a.account(point, big)
    fired = {v["rule"]: v for v in a.audit(point, big)}
    assert set(fired) == {"workspace"} and fired["workspace"]["over"] == 4096 + 512
    assert fired["workspace"]["message"].endswith("over) after build")


@pytest.mark.parametrize("solution", ["v0", "honest_torch"])
def test_honest_solutions_pass(solution, tmp_path, panel_file, redteam_solution):
    directory = ROOT / "methods" / "versions" / "v0" if solution == "v0" else redteam_solution(solution)
    run, report = guard(directory, panel_file(CASE), tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert [p["name"] for p in report["cases"][0]["checkpoints"]] == ["build", "first call", "8 calls"]


@pytest.mark.parametrize("solution, rule, checkpoint", [
    ("keep_dense_fp16", "unpacked-dense", "build"),
    ("keep_int8_codes", "unpacked-int8", "build"),
    ("oversized_fp32_buffer", "floating", "build"),
    ("lazy_dense_weight", "unpacked-dense", "8 calls"),
    ("int8_codes_as_int32", "unpacked-int8", "build"),
    ("outputs_cached_as_int16", "workspace", "build"),
])
def test_cheats_break_the_rule_meant_for_them(solution, rule, checkpoint, tmp_path, panel_file, redteam_solution):
    run, report = guard(redteam_solution(solution), panel_file(CASE), tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    points = {p["name"]: p for p in report["cases"][0]["checkpoints"]}
    fired = {v["rule"] for v in points[checkpoint]["violations"]}
    assert rule in fired, points[checkpoint]
    assert f"violated {rule}" in run.stdout and "over)" in run.stdout
    if solution == "lazy_dense_weight":
        assert not points["build"]["violations"] and not points["first call"]["violations"]


def test_a_storage_seen_through_any_float_view_counts_as_floating():
    floats = torch.zeros(1024)
    ints = floats.view(torch.int32)  # noqa: F841 (alive: the storage has an int view and a float view)
    bare = torch.zeros(16).untyped_storage()
    found = live_storages(torch.device("cpu"))
    assert found[floats.data_ptr()].dtype == "float32" and found[floats.data_ptr()].nbytes == 4096
    assert found[bare.data_ptr()].dtype == "untyped"


def test_the_guards_default_calls_follow_the_tasks_protocol():
    """A graph-paired role calls a solution eagerly a few hundred times at most (its replays allocate nothing): its
    guard needs no eager-groups schedule of 30,000 calls per case."""
    from evals import residency
    from evals import task as tasks

    eager = residency.default_calls(tasks.load("w4a16"), interpreted=False)
    assert eager == residency.CALLS_CUDA == 16384 + 8192 + 11 * 512
    assert residency.default_calls(tasks.load("llgemm"), interpreted=False) == residency.CALLS_GRAPH
    assert residency.default_calls(tasks.load("llgemm"), interpreted=True) == residency.CALLS_INTERPRETED


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a split guard needs 2 cores (one process a core)")
@pytest.mark.parametrize("solution", ["keep_dense_fp16", "honest_torch"])
def test_the_guard_split_over_processes_records_what_one_process_records(solution, tmp_path, panel_file,
                                                                         redteam_solution):
    """Each process guards its own cases, each against what its process held before it: on CPU tensors (no
    allocator, no library's one-time buffers) the split changes no figure, no verdict and no order."""
    panel = panel_file(CASE, ("expert-batch", 5, 128, 256, "gelu_tanh", 4), ("balanced", 3, 256, 256, "silu", 5))
    directory = redteam_solution(solution)
    (one, alone), (two, split) = (guard(directory, panel, tmp_path, jobs=jobs) for jobs in (1, 2))
    assert one.returncode == two.returncode == (1 if solution.startswith("keep") else 0), two.stdout + two.stderr
    assert (alone["jobs"], split["jobs"]) == (1, 2)
    assert split["cases"] == alone["cases"] and split["ok"] == alone["ok"]
    header = "3 cases over 2 processes, each a guard of its own (its own allocator count)\n"
    assert header in two.stdout and two.stdout.replace(header, "") == one.stdout


def test_a_guard_process_that_ends_without_a_report_fails_its_cases(tmp_path):
    task = load("w4a16")
    cases = [task.adapter.Case(*CASE)]
    records = run_shard(task, tmp_path / "no-such-solution", cases, 8, tmp_path / "shard-0")
    assert [r["ok"] for r in records] == [False] and records[0]["checkpoints"] == []
    assert records[0]["error"]["name"] == "GuardProcessFailed"
    assert "exit status 2 without a report; stderr's last line: residency: " in records[0]["error"]["message"]
    assert "no-such-solution" in records[0]["error"]["message"], records[0]["error"]


def test_a_quiet_heap_still_sees_every_storage_and_collects_what_is_made_in_it():
    """Objects alive on entry leave the collector's view, not the guard's: a tensor made before and grown inside
    counts at its new size; a cycle made inside and dropped is collected by settle."""
    before = torch.zeros(16)
    cpu = torch.device("cpu")
    with quiet_heap():
        assert gc.get_freeze_count() > 0 and len(gc.get_objects()) < 10_000
        before.resize_(1 << 16)  # a new storage under an object that was frozen
        made = torch.ones(8)
        cycle = [torch.ones(1 << 12)]
        cycle.append(cycle)
        dropped = cycle[0].data_ptr()
        del cycle
        settle(cpu)
        found = live_storages(cpu)
        assert found[before.data_ptr()].nbytes == 4 << 16 and found[made.data_ptr()].nbytes == 32
        assert dropped not in found or found[dropped].nbytes != 4 << 12
    assert gc.get_freeze_count() == 0 and residency._frozen == []


def test_a_quiet_heap_nests_and_sees_what_another_freeze_would_hide():
    """A second freeze inside (not the guard's) could hide what was made since: the scan first makes every object
    visible again. Entered again inside, it leaves the outer one as it was."""
    cpu, before = torch.device("cpu"), torch.ones(8)
    with quiet_heap():
        frozen, remembered = gc.get_freeze_count(), list(residency._frozen)
        with quiet_heap():
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen and residency._frozen == remembered
        assert any(ref() is before for ref in remembered)
        hidden = torch.ones(64)
        gc.freeze()
        assert live_storages(cpu)[hidden.data_ptr()].nbytes == 256
        assert gc.get_freeze_count() == 0
    assert gc.get_freeze_count() == 0 and residency._frozen == []
