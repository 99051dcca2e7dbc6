"""Stability qualification (evals/qualify.py) and the host/GPU rule (evals/stability.py).

On CPU the pipeline runs for real (a child process per schedule, the family's kernels under the interpreter, the
verifier's schedule shrunk to its smoke size) but nothing is qualified: interpreter wall times are not GPU timings,
and the report says so. The GPU tests time the real schedule."""
import json
import subprocess
import sys

import pytest
import torch

from evals import qualify, stability
from evals.task import load
from tests.conftest import ROOT, W4A16_FAMILY

FAMILY = str(W4A16_FAMILY)
TASK = load("w4a16")


def run_cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "evals.qualify", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_the_rule_names_host_bound_near_host_bound_and_device_bound():
    assert stability.verdict(None, None) == (None, "not measured: no CUDA (interpreter)")
    stable, why = stability.verdict(10.0, 8.0)
    assert stable is False and why.startswith("host-bound: the GPU time is below the host cost")
    stable, why = stability.verdict(10.0, 11.0, ratio_min=1.3)
    assert stable is False and why.startswith("near host-bound") and "1.10x" in why
    assert stability.verdict(10.0, 13.0, ratio_min=1.3)[0] is True


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: the interpreter, nothing qualified")
def test_qualify_times_the_verifier_schedule_in_a_child_per_schedule_and_qualifies_nothing_on_cpu(tmp_path,
                                                                                                  panel_file):
    panel = panel_file(("expert-batch", 18, 256, 256, "gelu_tanh", 3))
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps([{}, {"SPLIT_K": 2}]))
    out = tmp_path / "q.json"
    run = run_cli("--solution", FAMILY, "--panel", str(panel), "--grid", str(grid), "--schedules", "smoke",
                  "--repeats", "2", "--json", str(out))
    assert run.returncode == 1, run.stderr[-2000:]  # nothing measured is nothing qualified
    report = json.loads(out.read_text())
    assert report["measured"] is False and report["passed"] is False and "nothing qualified" in report["note"]
    assert report["task"] == "w4a16"
    assert not report["failures"]
    assert [row["overrides"] for row in report["rows"]] == [{}, {"SPLIT_K": 2}]
    for row in report["rows"]:
        assert row["host_us"] is None and row["rule_stable"] is None and not row["errors"]
        assert [v["repeat"] for v in row["vectors"]] == [0, 1] and {v["schedule"] for v in row["vectors"]} == {"smoke"}
        assert all(len(v["times_us"]) == 11 and v["max_min"] >= 1.0 for v in row["vectors"])
    assert "NOT passed" in run.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path: the interpreter, nothing qualified")
def test_another_task_is_qualified_from_its_own_adapter(tmp_path):
    """The toy task (colscale, one call input): its panel, its weights and inputs, its group draws refilled in place,
    timed under the verifier's schedule; nothing qualified on CPU."""
    toy = load(ROOT / "tests" / "toy_task")
    out = tmp_path / "q.json"
    run = run_cli("--task", "tests/toy_task", "--solution", str(toy.main_dir), "--panel", "smoke", "--schedules",
                  "smoke", "--repeats", "1", "--json", str(out))
    assert run.returncode == 1, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["task"] == "colscale" and not report["failures"] and report["measured"] is False
    assert [row["case"] for row in report["rows"]] == [c.name for c in toy.cases("smoke")]
    for row in report["rows"]:
        assert not row["errors"] and [len(v["times_us"]) for v in row["vectors"]] == [11]


def test_a_broken_plan_is_a_row_with_its_error_and_fails(tmp_path, panel_file):
    panel = panel_file(("balanced", 18, 256, 256, "silu", 3))
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps([{"GRID": 7}]))
    out = tmp_path / "q.json"
    run = run_cli("--solution", FAMILY, "--panel", str(panel), "--grid", str(grid), "--schedules", "smoke",
                  "--repeats", "1", "--json", str(out))
    assert run.returncode == 1
    row = json.loads(out.read_text())["rows"][0]
    assert not row["passed"] and "GRID must be one of" in row["errors"][0] and not row["vectors"]


def test_usage_errors_exit_2_with_what_to_do(tmp_path):
    run = run_cli("--solution", FAMILY, "--panel", "smoke", "--schedules", "spec,fast")
    assert run.returncode == 2 and "unknown ['fast']" in run.stderr
    run = run_cli("--solution", tmp_path / "missing", "--panel", "smoke")
    assert run.returncode == 2 and "no solution.py" in run.stderr
    bad = tmp_path / "grid.json"
    bad.write_text("{}")
    run = run_cli("--solution", FAMILY, "--panel", "smoke", "--grid", str(bad))
    assert run.returncode == 2 and "JSON list of override objects" in run.stderr
    run = run_cli("--synthetic", "0,10")
    assert run.returncode == 2 and "positive spin times" in run.stderr
    run = run_cli("--curve", str(bad))
    assert run.returncode == 2 and "qualification JSONs" in run.stderr
    run = run_cli("--task", "no-such-task", "--solution", FAMILY, "--panel", "smoke")
    assert run.returncode == 2 and "no task 'no-such-task'" in run.stderr
    if not torch.cuda.is_available():
        run = run_cli("--synthetic", "10")
        assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr


def _entry(ratio, *spreads):
    return {"case": f"r{ratio}", "ratio": ratio, "vectors": [{"schedule": "spec", "max_min": s} for s in spreads]}


def test_the_threshold_is_the_least_ratio_above_which_every_vector_held_the_margin():
    entries = [_entry(0.5, 1.4), _entry(0.9, 1.02, 1.12), _entry(1.05, 1.03), _entry(1.2, 1.01, 1.09),
               _entry(2.0, 1.01)]
    found = qualify.curve(entries)
    assert found["threshold"] == 1.05 and found["points"] == 7
    assert found["worst_above_threshold"] == 1.09
    bins = {(b["ratio_from"], b["ratio_to"]): b for b in found["bins"]}
    assert bins[(0.8, 1.0)]["over_margin"] == 1 and bins[(0.8, 1.0)]["over_limit"] == 0
    assert bins[(0.0, 0.8)]["over_limit"] == 1
    assert "threshold: 1.05 (all points" in qualify.format_curve(found) and not found["outliers"]
    assert qualify.curve([_entry(3.0, 1.2)])["threshold"] is None  # nothing above the data is known to be stable
    # synthetic points (a spin: host noise alone) set the threshold; a real plan's stall above it is an outlier
    spins = [_entry(0.9, 1.3) | {"stratum": "synthetic"}, _entry(1.1, 1.02) | {"stratum": "synthetic"}]
    found = qualify.curve(spins + [_entry(4.0, 1.01, 1.18)])
    assert found["threshold"] == 1.1 and found["calibrated_on"] == "synthetic"
    assert found["outliers"] == [{"case": "r4.0", "schedule": "spec", "ratio": 4.0, "max_min": 1.18}]
    assert "over 1.1 above the threshold: r4.0 spec max/min 1.180" in qualify.format_curve(found)
    assert "| over 1.10 | over 1.15 |" in qualify.format_curve(found).splitlines()[0]


def test_the_limit_is_the_verifiers():
    from evals import verifier

    assert qualify.LIMIT == verifier.DISPERSION_LIMIT == stability.DISPERSION_LIMIT == 1.15


def test_the_refill_writes_the_verifiers_group_draw_into_every_input_in_place():
    """qualify's pool is rewritten before each group with the draw the verifier's roles use (gates.group_inputs):
    every tensor of every call's inputs, in place (the same storage, the group's values)."""
    from evals import gates

    case = TASK.cases("smoke")[0]
    device = torch.device("cpu")
    pool = TASK.adapter.make_inputs(case, 3, seed=gates.POOL_SEED, device=device)
    storage = [[t.data_ptr() for t in inputs] for inputs in pool]
    qualify.refiller(TASK, case, pool, device)(2)
    want = gates.group_inputs(TASK, case, 3, 2, device)
    assert [[t.data_ptr() for t in inputs] for inputs in pool] == storage
    assert all(torch.equal(a, b) for inputs, fresh in zip(pool, want) for a, b in zip(inputs, fresh, strict=True))
    assert not torch.equal(pool[0][0], TASK.adapter.make_inputs(case, 1, seed=gates.POOL_SEED, device=device)[0][0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the spin kernel and CUDA events need a GPU")
def test_a_device_bound_synthetic_callable_qualifies_and_the_probe_sees_its_gpu_time(tmp_path):
    device = torch.device("cuda")
    dummy = torch.empty(1, device=device)

    def fn(*inputs):
        out = torch.empty((32, 8192), dtype=torch.float16, device=device)
        stability.spin(device, 60.0)
        return out

    found = stability.probe(fn, [(dummy,)], device)
    assert found["gpu_us"] == pytest.approx(60.0, rel=0.25) and found["host_us"] < found["gpu_us"]
    out = tmp_path / "q.json"
    run = run_cli("--synthetic", "60", "--repeats", "1", "--schedules", "spec", "--json", str(out))
    report = json.loads(out.read_text())
    assert run.returncode == 0 and report["passed"] and report["measured"], run.stdout + run.stderr[-2000:]
    row = report["rows"][0]
    assert row["rule_stable"] and row["ratio"] > stability.STABLE_RATIO and row["worst_max_min"] <= qualify.LIMIT


def test_the_selfcheck_probes_with_the_verifiers_input_pool():
    """The selfcheck's host/GPU probe must see the GPU time the verifier's groups see: as many distinct inputs as the
    verifier's pool, which the probe takes in turn (a few inputs cycled stay in the L2 and run shorter)."""
    from evals import gates

    spec = gates.SCHEDULES["spec"]
    assert stability.PROBE_POOL == max(spec.input_pool, spec.calls_per_group)
    # the probe's rounds (after its 3 warm-up calls) go on where the last stopped: the whole pool, no input twice in
    # any PROBE_POOL calls in a row
    pool = list(range(stability.PROBE_POOL))
    calls, position, taken = stability.PROBE_CALLS, 3, []
    for _ in range(stability.PROBE_ROUNDS):
        taken += stability.round_inputs(pool, position, calls)
        position += calls
    assert len(taken) == calls * stability.PROBE_ROUNDS >= len(pool) and set(taken) == set(pool)
    assert all(len(set(taken[i:i + len(pool)])) == len(pool) for i in range(len(taken) - len(pool) + 1))
    assert stability.round_inputs(pool[:2], 5, 3) == [1, 0, 1]  # a pool smaller than a round cycles


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the selfcheck probes only on CUDA")
def test_on_cuda_the_selfcheck_probe_calls_the_whole_pool_of_distinct_inputs(monkeypatch):
    from evals import selfcheck
    from evals.loader import load_solution

    seen = []  # per probe: the x of every call it made
    real_probe = stability.probe

    def probe(fn, inputs, device, *args, **kwargs):
        called = []
        seen.append(called)

        def counted(*call):
            called.append(call[0].data_ptr())
            return fn(*call)
        return real_probe(counted, inputs, device, *args, **kwargs)

    monkeypatch.setattr(stability, "probe", probe)
    device = torch.device("cuda")
    module = load_solution(ROOT / "methods" / "versions" / "v0")
    case = TASK.cases("smoke")[0]
    plan = selfcheck.TimingPlan(1, 4, 1, 2)
    result = selfcheck.evaluate_case(TASK, module, lambda weights, case: TASK.build(module, weights), case, device,
                                     plan, None)
    assert result.correct and result.gpu_us and result.host_us, result
    # the probe's rounds take the pool in turn: every input of it is called (as many calls as it has, or more)
    assert len(seen) == 1 and len(seen[0]) >= stability.PROBE_POOL
    assert len(set(seen[0])) == stability.PROBE_POOL, len(set(seen[0]))
