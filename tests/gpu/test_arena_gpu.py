"""The arena on a CUDA GPU: v0 on the visible panel, and the residency guard against its cheats."""
import json
import subprocess
import sys

import pytest
import torch

from evals.loader import load_solution, unload_solution
from evals.task import load
from tests.conftest import ROOT

TASK = load("w4a16")
W4 = TASK.adapter

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
GUARD_CASE = ("expert-batch", 18, 8192, 1024, "gelu_tanh", 7106)


@pytest.fixture(scope="module")
def v0():
    module = load_solution(ROOT / "methods" / "versions" / "v0")
    yield module
    unload_solution(module)


@pytest.mark.parametrize("case", TASK.cases("visible"), ids=lambda c: c.name)
@pytest.mark.parametrize("mode", W4.MODES)
def test_v0_is_correct_on_the_visible_panel(v0, case, mode):
    t = W4.tensors(case, mode, "cuda")
    out = v0.build(t.qweight, t.scales, t.bias, case.epilogue)(t.x, t.residual)
    result = W4.check(out, W4.oracle(t.x, t.qweight, t.scales, t.bias, t.residual, case.epilogue), (case.m, case.n))
    assert result.ok, result.message


def guard(solution, panel_file, tmp_path, calls=None):
    out = tmp_path / "residency.json"
    args = [sys.executable, "-m", "evals.residency", "--solution", str(solution),
            "--panel", str(panel_file(GUARD_CASE)), "--json", str(out)]
    run = subprocess.run(args + (["--calls", str(calls)] if calls else []), cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    return run, json.loads(out.read_text())


def test_guard_passes_v0_over_the_whole_call_schedule(tmp_path, panel_file):
    run, report = guard(ROOT / "methods" / "versions" / "v0", panel_file, tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    points = report["cases"][0]["checkpoints"]
    assert points[-1]["name"] == "30208 calls"
    assert all(p["unattributed_bytes"] < 2**20 for p in points), points


@pytest.mark.parametrize("solution, rule, checkpoint", [
    ("keep_dense_fp16", "unpacked-dense", 0),
    ("keep_int8_codes", "unpacked-int8", 0),
    ("oversized_fp32_buffer", "floating", 0),
    ("lazy_dense_weight", "unpacked-dense", 2),
])
def test_guard_rejects_each_cheat_by_its_rule(solution, rule, checkpoint, tmp_path, panel_file, redteam_solution):
    run, report = guard(redteam_solution(solution), panel_file, tmp_path, calls=512)
    assert run.returncode == 1, run.stdout + run.stderr
    point = report["cases"][0]["checkpoints"][checkpoint]
    assert rule in {v["rule"] for v in point["violations"]}, point
