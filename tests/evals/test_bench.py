"""The benchmark's CPU-checkable parts: the task's peers are correct, the rows and floors come from the task, and
without CUDA it says what it needs."""
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from evals import task as tasks
from evals.bench import floor_output, floor_ratio, format_case, implementations
from tests.conftest import ROOT

TASK = tasks.load("w4a16")
W4 = TASK.adapter
TOY = tasks.load(ROOT / "tests" / "toy_task")  # colscale: a callable baseline, no peers, no FLOOR_OUTPUT_SHAPE


@pytest.mark.parametrize("name", ["torch dequant+addmm", "dense fp16 torch"])
def test_torch_peers_are_correct(name):
    build, note = W4.PEERS[name]
    assert note
    for case in TASK.cases("smoke"):
        problem = W4.generate(case, "normal")
        out = build(problem.weights, case)(*problem.inputs)
        ref = W4.reference(problem.weights, problem.inputs, case)
        assert W4.check_output(out, ref, case).ok


def test_the_rows_are_the_tasks_solutions_then_its_peers():
    logged = []
    solutions = [TASK.baseline_dir, TASK.main_dir]
    impls = implementations(TASK, solutions, peers=True, log=logged.append)
    assert [(name, note, full) for name, note, _, full in impls[:2]] == [("v0", "ours", True), ("main", "ours", True)]
    assert [(name, note, full) for name, note, _, full in impls[2:]] == [
        (name, note, False) for name, (_, note) in W4.PEERS.items()]
    assert logged == W4.skipped_peers()
    case = TASK.cases("smoke")[0]
    problem = W4.generate(case, "normal")
    fn = impls[0][2](problem.weights, case)  # v0 through the task's entry point
    assert W4.check_output(fn(*problem.inputs), W4.reference(problem.weights, problem.inputs, case), case).ok
    logged.clear()
    assert len(implementations(TASK, [], peers=False, log=logged.append)) == 0
    assert logged == ["peers: not run (--no-peers)"]


def test_a_callable_baseline_is_a_row_of_its_own_and_peers_are_optional():
    """The toy task's baseline is a callable and its adapter has no PEERS: its main, then the callable as a row of its
    own (note "baseline", the full schedule); no peer is run or logged. Each row's callable is right."""
    logged = []
    impls = implementations(TOY, [TOY.main_dir], peers=True, log=logged.append)
    assert [(name, note, full) for name, note, _, full in impls] == [("main", "ours", True),
                                                                     ("torch.mul", "baseline", True)]
    assert not logged
    for case in TOY.cases("smoke"):
        problem = TOY.adapter.generate(case, "normal")
        ref = TOY.adapter.reference(problem.weights, problem.inputs, case)
        for _, _, build, _ in impls:
            assert TOY.adapter.check_output(build(problem.weights, case)(*problem.inputs), ref, case).ok


def test_the_host_floors_allocate_the_tasks_output():
    assert floor_output(TASK, TASK.cases("visible")) == ((32, 8192), torch.float16)
    assert floor_output(TOY, TOY.cases("visible")) == ((16, 4096), torch.float32)  # the toy's largest output
    # an adapter without FLOOR_OUTPUT_SHAPE: the largest output among the cases
    adapter = SimpleNamespace(OUTPUT_DTYPE=torch.bfloat16, output_shape=lambda case: case)
    task = tasks.Task("toy", ROOT, {}, adapter)
    assert floor_output(task, [(4, 8), (2, 200), (16, 16)]) == ((2, 200), torch.bfloat16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_without_cuda_the_bench_says_it_needs_a_gpu():
    run = subprocess.run([sys.executable, "-m", "evals.bench"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr


def test_an_unknown_task_is_a_usage_error():
    run = subprocess.run([sys.executable, "-m", "evals.bench", "--task", "no-such-task"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "no task 'no-such-task'" in run.stderr and "w4a16" in run.stderr, run.stderr


def test_each_row_says_how_far_eager_is_from_the_binding_floor():
    assert floor_ratio(30.0, 12.5, 10.0) == 30.0 / 12.5  # the GPU floor binds
    assert floor_ratio(30.0, 8.0, 15.0) == 2.0  # the host floor binds
    assert floor_ratio(None, 8.0, 15.0) is None  # a row that did not run
    row = {"impl": "ours", "note": "ours", "correct": True, "eager_us": 30.0, "graph_hot_us": 25.0,
           "graph_flushed_us": 28.0, "flushed_copy_fraction": 0.5, "host_us": 9.0,
           "floor_ratio": floor_ratio(30.0, 12.5, 10.0), "error": None}
    peer = dict(row, impl="peer", eager_us=None, floor_ratio=None, error="did not run")
    entry = {"case": {"name": "18x8192x8192-silu", "stratum": "balanced"}, "roofline_us": 8.5, "gpu_floor_us": 12.5,
             "target_us": 18.75, "rows": [row, peer]}
    lines = format_case(entry).splitlines()
    header = lines[1].split()
    assert "x_floor" in header
    assert lines[2].split()[header.index("x_floor")] == "2.40"
    assert lines[3].split()[header.index("x_floor")] == "-"
