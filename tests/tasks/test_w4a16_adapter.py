"""The W4A16 adapter: the encoding, the oracle and the tolerance: accepted fp32 kernels, rejected wrong variants."""
import dataclasses
import math

import pytest
import torch

from evals.task import load

TASK = load("w4a16")
kh = TASK.adapter

SMOKE = TASK.cases("smoke")


def test_pack_layout_puts_row_8j_plus_i_in_bits_4i():
    codes = torch.zeros((16, 256), dtype=torch.int32)
    codes[8 * 1 + 3, 5] = 0xA  # row 11 -> word row 1, nibble 3
    codes[7, 0] = 0xF  # row 7 -> word 0, top nibble: the word goes negative as int32
    q = kh.pack_int4(codes)
    assert q.dtype == torch.int32 and q.shape == (2, 256)
    assert int(q[1, 5]) == 0xA << 12
    assert int(q[0, 0]) == (0xF << 28) - 2**32
    assert int(q.count_nonzero()) == 2


def test_pack_unpack_round_trip():
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (1024, 512), generator=gen)
    assert torch.equal(kh.unpack_int4(kh.pack_int4(codes)).long(), codes)


def test_pack_rejects_out_of_range_codes():
    with pytest.raises(ValueError, match="0..15"):
        kh.pack_int4(torch.full((8, 256), 16))


def independent_output(x, qweight, scales, bias, residual, epilogue):
    """Element by element from the word layout, in Python floats: no shared code with the harness."""
    m, k = x.shape
    n = qweight.shape[1]
    out = torch.empty((m, n), dtype=torch.float64)
    q = qweight.tolist()
    s = scales.double().tolist()
    xs = x.double().tolist()
    for col in range(n):
        w = [(((q[row // 8][col] & 0xFFFFFFFF) >> (4 * (row % 8))) & 0xF) - 8 for row in range(k)]
        w = [w[row] * s[row // 128][col] for row in range(k)]
        for r in range(m):
            z = math.fsum(xs[r][i] * w[i] for i in range(k)) + float(bias[col])
            if epilogue == "silu":  # z * sigmoid(z), written so that exp never overflows
                act = z / (1 + math.exp(-z)) if z >= 0 else z * math.exp(z) / (1 + math.exp(z))
            else:
                act = 0.5 * z * (1 + math.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
            out[r, col] = act + float(residual[r, col])
    return out


@pytest.mark.parametrize("epilogue", kh.EPILOGUES)
@pytest.mark.parametrize("mode", kh.MODES)
def test_oracle_matches_independent_computation(epilogue, mode):
    case = kh.Case("balanced", 3, 256, 256, epilogue, 11)
    t = kh.tensors(case, mode)
    ref = kh.oracle(t.x, t.qweight, t.scales, t.bias, t.residual, epilogue)
    want = independent_output(t.x, t.qweight, t.scales, t.bias, t.residual, epilogue)
    assert torch.allclose(ref.out, want, rtol=1e-9, atol=1e-9 * float(want.abs().max()))


def test_adversarial_inputs_have_the_promised_shape():
    case = kh.Case("balanced", 20, 1024, 256, "silu", 5)
    t = kh.tensors(case, "adversarial")
    codes = kh.unpack_int4(t.qweight)
    assert ((codes == 0) | (codes == 15)).float().mean() > 0.7
    assert t.x.abs().max() >= 512 and (t.x < 0).any()
    partial = t.x[:, :512].double() @ kh.dequantize(t.qweight, t.scales, torch.float64)[:512]
    assert partial.abs().max() > 10 * kh.FP16_MAX  # far beyond fp16 ...
    ref = kh.oracle(t.x, t.qweight, t.scales, t.bias, t.residual, "silu")
    assert ref.out.abs().max() > 0.3 * kh.FP16_MAX  # ... cancelling to outputs near the top of fp16
    assert ref.out.abs().max() < kh.FP16_MAX


def test_scales_make_fp16_dequantization_exact():
    t = kh.tensors(SMOKE[0], "normal")
    assert torch.equal(kh.dequantize(t.qweight, t.scales, torch.float16).double(),
                       kh.dequantize(t.qweight, t.scales, torch.float64))


# ---------------------------------------------------------------- kernels the tolerance must accept or reject
def act(z, epilogue):
    return (z * torch.sigmoid(z) if epilogue == "silu"
            else 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3))))


def finish(z, t, epilogue, bias=True, residual=True, activation=None):
    z = z + (t.bias.float() if bias else 0)
    out = act(z, activation or epilogue) + (t.residual.float() if residual else 0)
    return out.half()


def codes_of(t):
    return kh.unpack_int4(t.qweight).float()


def fp32_dense(t, e):
    return finish(t.x.float() @ kh.dequantize(t.qweight, t.scales), t, e)


def fp32_fp16_dequant(t, e):  # dequantize to fp16 first, as v0 and Marlin do
    return finish(t.x.float() @ kh.dequantize(t.qweight, t.scales, torch.float16).float(), t, e)


def fp32_reversed_sequential(t, e):  # a different summation order: last group first, chunks of 16
    w = kh.dequantize(t.qweight, t.scales)
    acc = torch.zeros((t.x.shape[0], w.shape[1]))
    for k0 in reversed(range(0, w.shape[0], 16)):
        acc += t.x[:, k0 : k0 + 16].float() @ w[k0 : k0 + 16]
    return finish(acc, t, e)


def fp32_scale_after_dot(t, e):  # per-group integer dot, then the group scale on the fp32 partial
    codes = codes_of(t) - 8
    acc = torch.zeros((t.x.shape[0], codes.shape[1]))
    for g in range(t.scales.shape[0]):
        rows = slice(g * 128, (g + 1) * 128)
        acc += (t.x[:, rows].float() @ codes[rows]) * t.scales[g].float()
    return finish(acc, t, e)


def fp32_truncating_sequential(t, e):
    """The least accurate fp32 accumulator: one product at a time, every addition truncated toward zero."""
    w = kh.dequantize(t.qweight, t.scales, torch.float64)
    x = t.x.double()
    acc = torch.zeros((x.shape[0], w.shape[1]), dtype=torch.float32)
    for k in range(w.shape[0]):
        exact = acc.double() + x[:, k : k + 1] * w[k]
        rounded = exact.float()
        away = rounded.double().abs() > exact.abs()
        acc = torch.where(away, torch.nextafter(rounded, torch.zeros_like(rounded)), rounded)
    return finish(acc, t, e)


def fp16_epilogue(t, e):  # z rounded to fp16 and the epilogue done in fp16 arithmetic
    z = (t.x.float() @ kh.dequantize(t.qweight, t.scales) + t.bias.float()).half()
    return (act(z.float(), e).half() + t.residual).half()


def twos_complement(t, e):
    codes = codes_of(t)
    signed = torch.where(codes >= 8, codes - 16, codes)
    return finish(t.x.float() @ (signed * t.scales.float().repeat_interleave(128, 0)), t, e)


def reversed_nibbles(t, e):
    codes = codes_of(t).reshape(-1, 8, codes_of(t).shape[1]).flip(1).reshape(codes_of(t).shape)
    return finish(t.x.float() @ ((codes - 8) * t.scales.float().repeat_interleave(128, 0)), t, e)


def one_scale_row(t, e):
    return finish(t.x.float() @ ((codes_of(t) - 8) * t.scales[0].float()), t, e)


def fp16_accumulation(t, e):
    w = kh.dequantize(t.qweight, t.scales, torch.float16)
    acc = torch.zeros((t.x.shape[0], w.shape[1]), dtype=torch.float16)
    for k0 in range(0, w.shape[0], 16):
        acc = (acc.float() + (t.x[:, k0 : k0 + 16].float() @ w[k0 : k0 + 16].float()).half().float()).half()
    return finish(acc.float(), t, e)


def missing_bias(t, e):
    return finish(t.x.float() @ kh.dequantize(t.qweight, t.scales), t, e, bias=False)


def missing_residual(t, e):
    return finish(t.x.float() @ kh.dequantize(t.qweight, t.scales), t, e, residual=False)


def wrong_activation(t, e):
    return finish(t.x.float() @ kh.dequantize(t.qweight, t.scales), t, e,
                  activation="gelu_tanh" if e == "silu" else "silu")


FP32_KERNELS = [fp32_dense, fp32_fp16_dequant, fp32_reversed_sequential, fp32_scale_after_dot,
                fp32_truncating_sequential, fp16_epilogue]
WRONG_ON_NORMAL = [twos_complement, reversed_nibbles, one_scale_row, missing_bias, missing_residual, wrong_activation]


def check(kernel, case, mode):
    t = kh.tensors(case, mode)
    ref = kh.oracle(t.x, t.qweight, t.scales, t.bias, t.residual, case.epilogue)
    return kh.check(kernel(t, case.epilogue), ref, (case.m, case.n))


@pytest.mark.parametrize("kernel", FP32_KERNELS, ids=lambda f: f.__name__)
def test_tolerance_accepts_fp32_kernels_on_every_case_mode_and_seed(kernel):
    for case in SMOKE:
        for seed in (case.seed, case.seed + 1000, case.seed + 2000):
            for mode in kh.MODES:
                result = check(kernel, dataclasses.replace(case, seed=seed), mode)
                assert result.ok, f"{kernel.__name__} on {case.name} seed {seed} {mode}: {result.message}"


@pytest.mark.parametrize("kernel", WRONG_ON_NORMAL, ids=lambda f: f.__name__)
def test_tolerance_rejects_wrong_variants(kernel):
    for case in SMOKE:
        result = check(kernel, case, "normal")
        assert not result.ok, f"{kernel.__name__} passed on {case.name}"


def test_tolerance_rejects_fp16_accumulation_on_adversarial_inputs():
    for case in SMOKE:
        result = check(fp16_accumulation, case, "adversarial")
        assert not result.ok and "not finite" in result.message, result.message


class OutputSubclass(torch.Tensor):
    """A subclass could override the operations the check itself uses; it is refused whatever it does."""


@pytest.mark.parametrize("bad, message", [
    (lambda out: out.float(), "dtype"),
    (lambda out: out[:, :-1], "shape"),
    (lambda out: out.t().contiguous().t(), "contiguous"),
    (lambda out: out.clone().fill_(float("nan")), "not finite"),
    (lambda out: [out], "torch.Tensor"),
    (lambda out: out.as_subclass(OutputSubclass), "plain torch.Tensor"),
])
def test_check_output_names_the_structural_fault(bad, message):
    case = SMOKE[0]
    t = kh.tensors(case, "normal")
    ref = kh.oracle(t.x, t.qweight, t.scales, t.bias, t.residual, case.epilogue)
    good = fp32_dense(t, case.epilogue)
    assert kh.check(good, ref, (case.m, case.n)).ok
    result = kh.check(bad(good), ref, (case.m, case.n))
    assert not result.ok and message in result.message


def test_panels_hold_the_spec_cases():
    visible = TASK.cases("visible")
    assert len(visible) == 10 and len({c.seed for c in visible}) == 10
    assert {(c.m, c.k, c.n, c.epilogue) for c in visible if c.stratum == "balanced"} == {
        (18, 8192, 8192, "silu"), (24, 8192, 28672, "gelu_tanh"), (32, 28672, 8192, "silu"),
        (20, 14336, 4096, "gelu_tanh"), (28, 8192, 10240, "silu")}
    assert {(c.m, c.k, c.n, c.epilogue) for c in visible if c.stratum == "expert-batch"} == {
        (18, 8192, 1024, "gelu_tanh"), (24, 16384, 1536, "silu"), (32, 8192, 2048, "silu"),
        (20, 14336, 768, "gelu_tanh"), (30, 12288, 2048, "gelu_tanh")}
    assert {c.epilogue for c in SMOKE} == set(kh.EPILOGUES) and any(c.m % 2 for c in SMOKE)
    assert all(18 <= c.m <= 32 and 256 <= c.k <= 1024 and 256 <= c.n <= 512 for c in SMOKE)


def test_load_panel_explains_a_bad_path_or_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="visible"):
        TASK.cases(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text('{"rows": []}')
    with pytest.raises(ValueError, match="a panel of task w4a16 is JSON"):
        TASK.cases(tmp_path / "bad.json")
