"""The benchmark's CPU-checkable parts: its allowed peer is correct, and without CUDA it says what it needs."""
import subprocess
import sys

import pytest
import torch

from evals import kernel_harness as kh
from evals.bench import build_dequant_addmm, build_dense_fp16
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
