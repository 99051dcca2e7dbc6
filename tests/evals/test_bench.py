"""The benchmark's CPU-checkable parts: its allowed peer is correct, and without CUDA it says what it needs."""
import subprocess
import sys

import pytest
import torch

from evals import kernel_harness as kh
from evals.bench import build_dequant_addmm, build_dense_fp16, floor_ratio, format_case
from tests.conftest import ROOT


@pytest.mark.parametrize("build", [build_dequant_addmm, build_dense_fp16], ids=lambda f: f.__name__)
def test_torch_peers_are_correct(build):
    for case in kh.load_panel("smoke"):
        t = kh.generate(case, "normal")
        out = build(t.qweight, t.scales, t.bias, case.epilogue)(t.x, t.residual)
        ref = kh.reference(t.x, t.qweight, t.scales, t.bias, t.residual, case.epilogue)
        assert kh.check_output(out, ref, (case.m, case.n)).ok


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_without_cuda_the_bench_says_it_needs_a_gpu():
    run = subprocess.run([sys.executable, "-m", "evals.bench"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr


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
