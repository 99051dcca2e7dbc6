"""A task timed by the graph-paired protocol, end to end: the toy task (tests/toy_task, out = x * gain against the
callable torch.mul) copied with "timing": "graph-paired", through the selfcheck, the verifier (one role per case, its
paired timing pass, the protocol's judge), the modules that refuse it or serve it, and the loop's noise rule. On CPU
the pairs run eagerly under the interpreter with the protocol's record; on a GPU (mark gpu) by CUDA-graph replay."""
import dataclasses
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from evals import bench, gate_spies, gates, graph_timing, selfcheck, verifier
from evals import task as tasks
from evals.stability import DISPERSION_LIMIT
from tests.conftest import ROOT, TOY, TOY_SHIPPED



def copy_toy(root: Path, **changes) -> Path:
    """The toy task copied into ``root``/task with its manifest's paths pointing into the copy, and ``changes``."""
    folder = root / "task"
    shutil.copytree(TOY, folder, ignore=TOY_SHIPPED)
    manifest = json.loads((TOY / "task.json").read_text().replace("tests/toy_task", str(folder)))
    (folder / "task.json").write_text(json.dumps(manifest | changes, indent=1))
    return folder


@pytest.fixture(scope="module")
def graph_task(tmp_path_factory) -> Path:
    return copy_toy(tmp_path_factory.mktemp("graph"), name="colscale-graph", timing="graph-paired")


def run(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


# ----------------------------------------------------------------------------------------------------- the manifest
def test_the_manifest_takes_graph_paired_without_a_qualify_stage(tmp_path, graph_task):
    assert tasks.load(graph_task).manifest["timing"] == "graph-paired"
    unknown = copy_toy(tmp_path / "unknown", name="colscale-unknown", timing="graph")
    with pytest.raises(tasks.TaskError) as raised:
        tasks.read_manifest(unknown)
    assert "eager-groups: " in str(raised.value) and "graph-paired: " in str(raised.value)
    qualified = copy_toy(tmp_path / "qualified", name="colscale-q", timing="graph-paired",
                         stages=["policy", "selfcheck", "qualify", "gates"])
    with pytest.raises(tasks.TaskError, match="a graph-paired task has no qualify stage"):
        tasks.read_manifest(qualified)


# ----------------------------------------------------------------------------------------------------- selfcheck
def check_paired_case(case: dict, plan: graph_timing.Plan) -> None:
    """A selfcheck case of a graph-paired task: the hot regime's numbers at the top, the speedup the smaller ratio,
    the spread the candidate's larger one minus 1, the graph outputs checked."""
    hot, flushed = case["hot"], case["flushed"]
    assert case["correct"] and case["checks"]["graph_outputs"]["ok"], case
    for record, pairs in ((hot, plan.hot_pairs), (flushed, plan.flushed_pairs)):
        assert len(record["candidate_times_us"]) == len(record["baseline_times_us"]) == pairs
        assert record["ratio"] == pytest.approx(record["baseline_us"] / record["candidate_us"])
        assert record["candidate_spread"] >= 1.0 and record["baseline_spread"] >= 1.0
        assert len(record["baseline_halves_us"]) == 2
    assert case["times_us"] == hot["candidate_times_us"] and case["median_us"] == hot["candidate_us"]
    assert case["baseline_median_us"] == hot["baseline_us"]
    assert case["speedup"] == min(hot["ratio"], flushed["ratio"])
    assert case["spread"] == pytest.approx(max(hot["candidate_spread"], flushed["candidate_spread"]) - 1)
    assert case["gbps"] == pytest.approx(case["bytes"] / flushed["candidate_us"] / 1e3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the interpreter's eager pairs")
def test_the_selfcheck_times_pairs_eagerly_on_cpu_with_the_protocols_record(graph_task, tmp_path):
    out = tmp_path / "report.json"
    done = run("evals.selfcheck", "--task", graph_task, "--panel", "smoke", "--json", out)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["timing"] == {"protocol": "graph-paired", "graphs": False, **dataclasses.asdict(graph_timing.SMOKE)}
    assert report["timing_note"] == graph_timing.EAGER_NOTE and "not GPU timing" in done.stdout
    assert len(report["cases"]) == 2 and report["score"] > 0
    for case in report["cases"]:
        check_paired_case(case, graph_timing.SMOKE)
        assert case["stable"] is None and case["host_us"] is None  # no graphs: nothing said of the host
        # where the evaluation's time went: each phase, and of the timing the refills and the outputs' checks
        spent = case["phase_s"]
        assert set(spent) == {"correctness", "timing", "timing_refills", "timing_output_checks", "after_timing"}
        assert all(spent[k] > 0 for k in ("correctness", "timing", "after_timing")), spent
        assert 0 <= spent["timing_refills"] + spent["timing_output_checks"] < spent["timing"], spent
    phases = sum(sum(c["phase_s"][k] for k in ("correctness", "timing", "after_timing")) for c in report["cases"])
    assert 0 < phases <= report["cases_s"] + 1e-5  # each figure rounded to the microsecond
    assert report["setup_s"] > 0
    header = next(line for line in done.stdout.splitlines() if line.startswith("case"))
    assert "hot_x" in header and "flush_x" in header and "host_us" not in header

    # --baseline DIR: the same pairs against that solution instead of the callable
    out = tmp_path / "versus.json"
    done = run("evals.selfcheck", "--task", graph_task, "--panel", "smoke", "--baseline",
               graph_task / "versions" / "v0", "--json", out)
    report = json.loads(out.read_text())
    assert done.returncode == 0 and report["baseline"] == str(graph_task / "versions" / "v0"), done.stderr
    for case in report["cases"]:
        check_paired_case(case, graph_timing.SMOKE)


@pytest.mark.parametrize("batch", [64, 4])
def test_every_graph_output_is_kept_and_checked_before_the_timing_returns(monkeypatch, batch):
    """time_paired keeps a copy of the candidate's outputs of each pair and checks them in batches, never inside the hot
    regime: all of them, the last partial batch too; a wrong output is named by its regime and pair, a non-contiguous
    one by its structural fault, and a callable that reuses its output buffers (as a graph does) passes."""
    monkeypatch.setattr(selfcheck, "CHECK_BATCH", batch)
    task = tasks.load("llgemm")
    case = task.cases("smoke")[2]
    cpu = torch.device("cpu")
    weights = task.adapter.generate(case, "normal", cpu).weights
    plan = selfcheck.graph_plan(cpu)

    def linear(x):
        return torch.nn.functional.linear(x.float(), weights["weight"].float()).bfloat16()

    calls = []

    def counted(x):
        calls.append(1)
        return linear(x)

    settled_at = []  # the candidate's calls so far at each batch's check
    check_outputs = task.check_outputs
    monkeypatch.setattr(task, "check_outputs", lambda *args: settled_at.append(len(calls)) or check_outputs(*args))
    _, verdict = selfcheck.time_paired(task, counted, linear, case, weights, cpu)
    outputs = plan.hot_pairs * plan.hot_calls + plan.flushed_pairs
    assert verdict["ok"] and verdict["message"].startswith(f"{outputs} graph outputs"), verdict
    last = len(calls)
    first_flushed = last - plan.flushed_pairs + 1  # the calls made once the first flushed pair has run
    assert settled_at[0] == (first_flushed if batch <= outputs else last) and settled_at[-1] == last, settled_at
    monkeypatch.setattr(task, "check_outputs", check_outputs)

    ring = [torch.empty((case.m, case.n), dtype=torch.bfloat16) for _ in range(plan.hot_calls)]

    def reused(x):  # writes its buffers in turn, as a graph's static outputs are rewritten by its next replay
        calls.append(1)
        return ring[len(calls) % len(ring)].copy_(linear(x))

    _, verdict = selfcheck.time_paired(task, reused, linear, case, weights, cpu)
    assert verdict["ok"] and verdict["message"].startswith(f"{outputs} graph outputs"), verdict

    calls.clear()

    def wrong_last(x):  # right but for its very last call: the last flushed pair's, in the last (partial) batch
        calls.append(1)
        return linear(x) if len(calls) < last else torch.zeros((case.m, case.n), dtype=torch.bfloat16)

    _, verdict = selfcheck.time_paired(task, wrong_last, linear, case, weights, cpu)
    last_pair = plan.hot_pairs + plan.flushed_pairs - 1
    assert not verdict["ok"], verdict
    assert verdict["message"].startswith(f"flushed graph output 0 after pair {last_pair}: "), verdict

    def transposed(x):
        return linear(x).t().contiguous().t()

    _, verdict = selfcheck.time_paired(task, transposed, linear, case, weights, cpu)
    assert not verdict["ok"] and "hot graph output 0 after pair 0: output must be contiguous" in verdict["message"]


def test_an_eager_groups_report_keeps_its_fields(tmp_path):
    """The W4A16 task's protocol: no graph-paired field in a case, the groups' plan as its timing."""
    out = tmp_path / "toy.json"
    done = run("evals.selfcheck", "--task", TOY, "--panel", "smoke", "--json", out)
    report = json.loads(out.read_text())
    assert done.returncode == 0 and set(report["timing"]) == {"groups", "calls_per_group", "warmup", "distinct_inputs"}
    assert not {"hot", "flushed", "spread"} & set(report["cases"][0])
    assert set(report["cases"][0]["phase_s"]) == {"correctness", "timing", "after_timing", "host_probe"}
    assert "host_us" in next(line for line in done.stdout.splitlines() if line.startswith("case"))


# ----------------------------------------------------------------------------------------------------- the verifier
def test_the_verifier_times_one_paired_role_per_case_and_judges_it_by_the_protocol(graph_task, tmp_path):
    out = tmp_path / "verdict.json"
    done = run("evals.verifier", "--task", graph_task, "--panel", "smoke", "--schedule", "smoke", "--json", out)
    report = json.loads(out.read_text())
    assert report["timing"] == "graph-paired" and report["baseline"] == "torch.mul"
    assert "cand_hot" in done.stdout and "before_us" not in done.stdout and "timing: graph-paired" in done.stdout
    plan = gates.graph_plan("smoke")
    for case in report["cases"]:
        assert list(case["roles"]) == ["candidate"]
        record = case["roles"]["candidate"]
        assert record["yardstick"] == "torch.mul" and record["error"] is None
        paired = record["paired"]
        assert len(paired["hot"]["candidate_times_us"]) == plan.hot_pairs
        assert len(paired["flushed"]["baseline_times_us"]) == plan.flushed_pairs
        assert record["times_us"] == paired["hot"]["candidate_times_us"]
        outputs = case["gates"]["schedule_outputs"]
        assert outputs["status"] == "pass" and any("hot graph outputs after pair 0" in e for e in outputs["evidence"])
        assert any("flushed graph outputs after pair" in e for e in case["gates"]["fresh_outputs"]["evidence"])
        spread = case["gates"]["dispersion"]["evidence"][0]
        for series in ("hot candidate", "hot baseline", "flushed candidate", "flushed baseline"):
            assert f"{series} p75/p25 " in spread
        agreement = case["gates"]["baseline_agreement"]["evidence"][0]
        assert "hot baseline halves" in agreement and "flushed baseline halves" in agreement
        m = case["medians_us"]
        assert case["ratio"] == pytest.approx(min(m["baseline_hot"] / m["candidate_hot"],
                                                  m["baseline_flushed"] / m["candidate_flushed"]))
        assert all(case["gates"][name]["status"] == "pass" for name in ("api", "numerics_normal", "numerics_extreme",
                                                                       "no_output_caching", "no_tampering"))
    if not torch.cuda.is_available():  # interpreter timings are never a valid submission, as for eager-groups
        assert done.returncode == 1 and not report["valid"] and "timing_sanity" in report["skipped"]


def test_a_solution_as_the_yardstick_is_loaded_in_the_candidates_process(graph_task, tmp_path):
    panel = tmp_path / "one.json"
    panel.write_text(json.dumps({"cases": [{"stratum": "narrow", "m": 3, "n": 32, "seed": 11}]}))
    out = tmp_path / "verdict.json"
    v0 = graph_task / "versions" / "v0"
    run("evals.verifier", "--task", graph_task, "--panel", panel, "--schedule", "smoke", "--baseline", v0,
        "--json", out)
    report = json.loads(out.read_text())
    record = report["cases"][0]["roles"]["candidate"]
    assert report["baseline"] == str(v0) and record["yardstick"] == str(v0) and list(report["cases"][0]["roles"]) == [
        "candidate"]
    assert len(record["paired"]["hot"]["baseline_times_us"]) == gates.graph_plan("smoke").hot_pairs


def test_gates_only_runs_every_gate_but_the_timing_ones(graph_task, tmp_path):
    out = tmp_path / "gates.json"
    done = run("evals.verifier", "--task", graph_task, "--panel", "smoke", "--gates-only", "--json", out)
    report = json.loads(out.read_text())
    assert done.returncode == 0 and report["valid"] and report["timing"] == "graph-paired", done.stdout
    assert {"dispersion", "baseline_agreement", "schedule_outputs", "timing_sanity"} <= set(report["skipped"])
    assert all(list(c["roles"]) == ["candidate"] and "paired" not in c["roles"]["candidate"] for c in report["cases"])


# ----------------------------------------------------------------------------------------------------- the judge
def series(steady: float, pairs: int) -> list[float]:
    return [steady * (1 + 0.001 * (i % 3)) for i in range(pairs)]


def paired_record(task: tasks.Task, hot: tuple[float, float], flushed: tuple[float, float], **override) -> dict:
    """A candidate role's record whose gates all passed, with steady series at the given (candidate, baseline)
    medians; ``override`` replaces series by "<regime>_<who>" (None removes it)."""
    record = {"case": {}, "gates": {name: {"status": "pass", "evidence": ["ok"]} for name in gates.role_gates(task)},
              "error": None, "paired": {}}
    for regime, (cand, base), pairs in (("hot", hot, 21), ("flushed", flushed, 101)):
        record["paired"][regime] = {"candidate_times_us": series(cand, pairs), "baseline_times_us": series(base, pairs)}
    for key, values in override.items():
        regime, who = key.split("_")
        if values is None:
            del record["paired"][regime][f"{who}_times_us"]
        else:
            record["paired"][regime][f"{who}_times_us"] = values
    record["median_us"] = hot[0]
    return record


def judged(graph_task, record, gates_only=False) -> dict:
    task = tasks.load(graph_task)
    case = task.adapter.Case("narrow", 3, 32, 11)
    return verifier.judge_case(task, case, {"candidate": record}, {"status": "pass", "evidence": ["clean"]},
                               gates_only=gates_only)


def test_the_case_ratio_is_the_smaller_of_the_two_regimes(graph_task):
    task = tasks.load(graph_task)
    found = judged(graph_task, paired_record(task, hot=(10.0, 20.0), flushed=(20.0, 30.0)))
    assert found["failed"] == [] and found["gates"]["dispersion"]["status"] == "pass"
    assert found["gates"]["baseline_agreement"]["status"] == "pass"
    assert found["ratio"] == pytest.approx(1.5) and found["score"] == found["ratio"]  # hot 2.0, flushed 1.5
    assert found["medians_us"]["candidate_hot"] == pytest.approx(10.01) and "2.000" in verifier.format_row(found)
    assert verifier.summarize([found], gates_only=False, task=task)["score"] == pytest.approx(1.5)


def test_one_series_spread_over_the_limit_fails_the_case_and_is_listed(graph_task):
    task = tasks.load(graph_task)
    wide = [10.0] * 10 + [12.0] * 11  # p75/p25 1.2
    found = judged(graph_task, paired_record(task, (10.0, 20.0), (20.0, 30.0), hot_candidate=wide))
    assert found["failed"] == ["dispersion"] and found["score"] is None and found["ratio"] is not None
    evidence = found["gates"]["dispersion"]["evidence"]
    assert "hot candidate p75/p25 1.200" in evidence[0] and f"over {DISPERSION_LIMIT} or missing: hot candidate" in \
        evidence[0]
    assert evidence[1].startswith("hot candidate replays (us per call): 10.00 ") and len(evidence) == 2
    assert "hot candidate replays" in verifier.format_row(found)


def test_a_missing_series_fails_closed(graph_task):
    task = tasks.load(graph_task)
    found = judged(graph_task, paired_record(task, (10.0, 20.0), (20.0, 30.0), flushed_baseline=None))
    assert set(found["failed"]) == {"dispersion", "baseline_agreement"} and found["ratio"] is None
    assert "over 1.15 or missing: flushed baseline" in found["gates"]["dispersion"]["evidence"][0]
    assert "flushed baseline halves missing" in found["gates"]["baseline_agreement"]["evidence"][0]
    untimed = judged(graph_task, {"case": {}, "gates": {}, "error": None})  # no paired record at all: never timed
    assert untimed["gates"]["dispersion"]["status"] == "skip" and untimed["score"] is None


def test_baseline_halves_that_disagree_fail_though_every_spread_holds(graph_task):
    """A baseline that drifted 16% over its last six hot pairs: each place's quartiles stay within the limit (the
    drift is in their top quarters), its halves' centers do not."""
    task = tasks.load(graph_task)
    drifted = [10.0] * 15 + [11.6] * 6
    found = judged(graph_task, paired_record(task, (10.0, 20.0), (20.0, 30.0), hot_baseline=drifted))
    assert found["failed"] == ["baseline_agreement"], found["gates"]
    evidence = found["gates"]["baseline_agreement"]["evidence"][0]
    assert "hot baseline halves 10.00 us and 11.60 us (disagree)" in evidence and "not within 1.15x" in evidence


def test_the_pairs_order_effect_passes_and_a_baseline_slowed_after_the_candidate_fails(graph_task):
    """Whichever callable runs first in its pair 1.16x slower (the candidate first in the even pairs, the baseline in
    the odd): every gate passes and the same speed scores 1.0. A baseline 1.3x slower right after the candidate's
    replay (the even pairs) alone: each place stays steady and the halves agree, so only the check of that place
    against the baseline's first replays finds it."""
    task = tasks.load(graph_task)
    first, second = 7.1, 6.1

    def by_place(even, odd, pairs):
        return [even if i % 2 == 0 else odd for i in range(pairs)]

    honest = {f"{regime}_{who}": by_place(*((first, second) if who == "candidate" else (second, first)), pairs)
              for regime, pairs in (("hot", 21), ("flushed", 101)) for who in ("candidate", "baseline")}
    found = judged(graph_task, paired_record(task, (1.0, 1.0), (1.0, 1.0), **honest))
    assert found["failed"] == [] and found["score"] == pytest.approx(1.0), found["gates"]
    slowed = paired_record(task, (10.0, 20.0), (20.0, 30.0), hot_baseline=by_place(26.0, 20.0, 21))
    found = judged(graph_task, slowed)
    assert found["failed"] == ["baseline_agreement"], found["gates"]
    assert "(slowed after the candidate)" in found["gates"]["baseline_agreement"]["evidence"][0]


def test_timing_sanity_holds_a_median_to_a_read_pass_and_the_copy_with_slack_and_fails_a_missing_one(graph_task):
    """1 MB at a read pass of 1000 GB/s and a copy of 900 GB/s: the floor is 1 us (the read pass beats 1.07x the
    copy); a median of 0.95 us is faster than possible, 1.0 us is not. With a read pass of 900 GB/s, or none, the
    floor is 1.07x the copy's rate, 1.038 us. A missing median fails; no copy rate (off CUDA) leaves the gate to its
    skip."""
    task = tasks.load(graph_task)
    role = types.SimpleNamespace(record={"copy_gbps": 900.0, "read_gbps": 1000.0}, case=None,
                                 adapter=types.SimpleNamespace(bytes_moved=lambda case: 1_000_000))

    def verdict(median, **rates):
        role.record.update(rates)
        role.book = gate_spies.GateBook(gates.role_gates(task))
        gates.Role.sanity(role, median, "flushed center", "")
        return role.book.gates["timing_sanity"]

    assert verdict(1.0)["status"] == "pass" and role.record["roofline_us"] == pytest.approx(1.0)
    failed = verdict(0.95)
    assert failed["status"] == "fail" and "faster than possible" in failed["evidence"][0]
    for read in (900.0, None):
        assert verdict(1.0, read_gbps=read)["status"] == "fail" and verdict(1.05)["status"] == "pass"
    assert verdict(None)["status"] == "fail" and "no time measured" in role.book.gates["timing_sanity"]["evidence"][0]
    assert verdict(0.5, copy_gbps=None)["status"] == "not_run"


def test_gates_only_skips_the_timing_gates(graph_task):
    task = tasks.load(graph_task)
    found = judged(graph_task, paired_record(task, (10.0, 20.0), (20.0, 30.0)), gates_only=True)
    assert {found["gates"][n]["status"] for n in ("dispersion", "baseline_agreement")} == {"skip"}


# ----------------------------------------------------------------------------------------------------- other modules
def test_qualify_refuses_a_graph_paired_task_and_says_why(graph_task):
    done = run("evals.qualify", "--task", graph_task, "--panel", "smoke")
    assert done.returncode == 2 and "declares no qualify stage" in done.stderr, done.stdout + done.stderr
    assert "graph-paired protocol" in done.stderr


def test_the_profile_serves_a_graph_paired_task(graph_task, tmp_path):
    out = tmp_path / "profile.json"
    done = run("evals.profile", "--task", graph_task, "--panel", "smoke", "--json", out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [c["case"]["name"] for c in json.loads(out.read_text())["cases"]] == ["3x32", "2x256"]


def test_the_bench_defaults_to_v0_and_main_beside_a_callable_baseline(graph_task, tmp_path):
    task = tasks.load(graph_task)
    assert bench.default_solutions(task) == [graph_task / "versions" / "v0", task.main_dir]
    bare = copy_toy(tmp_path / "bare", name="colscale-bare")
    shutil.rmtree(bare / "versions" / "v0")
    assert bench.default_solutions(tasks.load(bare)) == [tasks.load(bare).main_dir]
    w4a16 = tasks.load("w4a16")
    assert bench.default_solutions(w4a16) == [w4a16.baseline_dir, w4a16.main_dir]


def test_graph_capture_and_replay_are_tamper_checked_for_a_graph_paired_task_only(graph_task):
    graph = gate_spies.tamper_snapshot(tasks.load(graph_task))
    assert graph["torch.cuda.CUDAGraph.replay"] is torch.cuda.CUDAGraph.replay and "torch.cuda._sleep" in graph
    assert not any("Graph" in name or "_sleep" in name for name in gate_spies.tamper_snapshot(tasks.load("w4a16")))


# ----------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_on_a_gpu_the_selfcheck_replays_graphs_and_reports_both_regimes(graph_task, tmp_path):
    out = tmp_path / "report.json"
    done = run("evals.selfcheck", "--task", graph_task, "--panel", "visible", "--json", out)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["timing"]["graphs"] is True and report["timing"]["hot_pairs"] == graph_timing.HOT_PAIRS
    assert report["stability"]["stable"] is True and report["stability"]["note"] == graph_timing.GRAPH_NOTE
    assert graph_timing.GRAPH_NOTE in done.stdout
    for case in report["cases"]:
        check_paired_case(case, graph_timing.FULL)
        assert case["stable"] is True and case["stable_note"] == graph_timing.GRAPH_NOTE
        assert case["hot"]["candidate_us"] > 0 and case["flushed"]["candidate_us"] > 0
        assert 0 < case["roofline_fraction"] < 1.5


@pytest.mark.gpu
def test_on_a_gpu_the_verifier_finds_the_toy_main_valid_against_torch_mul(graph_task, tmp_path):
    """The protocol of record on the toy task's visible panel: every gate passes, timing_sanity on the flushed
    center, one role per case."""
    out = tmp_path / "verdict.json"
    done = run("evals.verifier", "--task", graph_task, "--panel", "visible", "--json", out)
    print(done.stdout, done.stderr[-3000:])
    report = json.loads(out.read_text())
    assert done.returncode == 0 and report["valid"], done.stdout
    assert not report["skipped"] or set(report["skipped"]) == {"residency"}
    for case in report["cases"]:
        assert list(case["roles"]) == ["candidate"] and case["score"] > 0
        assert case["gates"]["timing_sanity"]["status"] == "pass"
        assert "flushed center" in case["gates"]["timing_sanity"]["evidence"][-1]
        assert "not held to it" in case["gates"]["timing_sanity"]["evidence"][-1]


@pytest.mark.gpu
def test_on_a_gpu_a_candidate_that_captures_a_kernel_that_writes_nothing_fails_schedule_outputs(graph_task, tmp_path):
    """Honest when called eagerly (every gate of the gates pass holds); under graph capture it records a kernel
    that computes nothing. The role's checks of its graph outputs after refills catch it."""
    cheat = tmp_path / "cheat"
    cheat.mkdir()
    (cheat / "solution.py").write_text(
        '"""Cheat: honest eagerly, a zero-filled output under graph capture."""\nimport torch\n\n\n'
        "def build(gain):\n    def fn(x):\n        if torch.cuda.is_current_stream_capturing():\n"
        "            return torch.zeros_like(x)\n        return x * gain\n\n    return fn\n")
    out = tmp_path / "role.json"
    case = {"stratum": "wide", "m": 8, "n": 1024, "seed": 23}
    done = run("evals.verifier", "role", "--task", graph_task, "--solution", cheat, "--case", json.dumps(case),
               "--schedule", "spec", "--timing", "--out", out)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["gates"]["numerics_normal"]["status"] == "pass"
    assert record["gates"]["schedule_outputs"]["status"] == "fail", record["gates"]["schedule_outputs"]
    assert "graph outputs after pair 0" in record["gates"]["schedule_outputs"]["evidence"][0]
