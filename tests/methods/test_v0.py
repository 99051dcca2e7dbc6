"""The inherited baseline: correct on both epilogues, odd M and M = 1, in both input regimes."""
import pytest
import torch

from evals.loader import load_solution, unload_solution
from evals.task import load
from tests.conftest import ROOT

TASK = load("w4a16")
W4 = TASK.adapter


@pytest.fixture(scope="module")
def v0():
    module = load_solution(ROOT / "methods" / "versions" / "v0")
    yield module
    unload_solution(module)


@pytest.mark.parametrize("m, k, n, epilogue", [(1, 256, 256, "silu"), (19, 512, 256, "gelu_tanh"),
                                               (33, 384, 512, "silu"), (7, 128, 256, "gelu_tanh")])
@pytest.mark.parametrize("mode", W4.MODES)
def test_v0_matches_the_oracle(v0, device, m, k, n, epilogue, mode):
    case = W4.Case("balanced", m, k, n, epilogue, seed=m * 7 + k)
    t = W4.tensors(case, mode, device)
    out = v0.build(t.qweight, t.scales, t.bias, epilogue)(t.x, t.residual)
    result = W4.check(out, W4.oracle(t.x, t.qweight, t.scales, t.bias, t.residual, epilogue), (m, n))
    assert result.ok, result.message


def test_v0_returns_a_fresh_output_and_leaves_inputs_alone(v0, device):
    case = TASK.cases("smoke")[0]
    t = W4.tensors(case, "normal", device)
    before = [v.clone() for v in (t.qweight, t.scales, t.bias, t.x, t.residual)]
    fn = v0.build(t.qweight, t.scales, t.bias, case.epilogue)
    first, second = fn(t.x, t.residual), fn(t.x, t.residual)
    assert first.data_ptr() != second.data_ptr() and torch.equal(first, second)
    for old, new in zip(before, (t.qweight, t.scales, t.bias, t.x, t.residual)):
        assert torch.equal(old, new)


@pytest.mark.parametrize("bad, message", [
    (lambda t: (t.qweight.long(), t.scales, t.bias, "silu"), "qweight must be"),
    (lambda t: (t.qweight, t.scales.float(), t.bias, "silu"), "scales must be"),
    (lambda t: (t.qweight, t.scales, t.bias[:-1], "silu"), "bias must be"),
    (lambda t: (t.qweight, t.scales, t.bias, "relu"), "epilogue must be"),
])
def test_v0_build_rejects_bad_weights_with_a_clear_message(v0, device, bad, message):
    t = W4.tensors(TASK.cases("smoke")[0], "normal", device)
    with pytest.raises(ValueError, match=message):
        v0.build(*bad(t))

