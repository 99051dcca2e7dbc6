"""The LL-GEMM adapter: cases, panels, input regimes, the fp32 bound (accepted fp32 kernels, rejected bf16
accumulation, low-precision operands and wrong variants), sealed panels and the residency allowance."""
import dataclasses
import json

import pytest
import torch

from agent.config import Task as LoopTask
from evals.residency import Checkpoint, Storage, guard_case
from evals.task import load
from tests.conftest import ROOT

TASK = load("llgemm")
ll = TASK.adapter
SMOKE = TASK.cases("smoke")
VISIBLE = TASK.cases("visible")
SEED_SHAPES = [(4096, 2560), (2560, 1536), (24, 2560), (3584, 2560), (640, 2560), (320, 2560), (62080, 2560),
               (336, 10240), (10240, 320), (320, 10240)]


def stratum_of(m: int) -> str:
    """The manifest's stratum holding M (the strata split M alone)."""
    return next(name for name, ranges in TASK.strata.items() if ranges["m"][0] <= m <= ranges["m"][1])


# ---------------------------------------------------------------------------------------------- cases and panels
@pytest.mark.parametrize("m, n, k", [(0, 64, 64), (1, 0, 64), (1, 64, 0), (1, 64, 4), (1, 64, 12), (2, 8, 2564)])
def test_case_refuses_shapes_outside_the_contract(m, n, k):
    with pytest.raises(ValueError, match=r"M >= 1, N >= 1, K >= 8 and K % 8 == 0"):
        ll.Case("m1", m, n, k, 1)


def test_case_names_and_dims():
    case = ll.Case("m4", 3, 320, 10240, 5)
    assert case.name == "3x320x10240" and case.dims == {"m": 3, "n": 320, "k": 10240}
    assert list(case.dims) == list(TASK.manifest["tier_dims"])
    assert ll.output_shape(case) == (3, 320)
    assert ll.bytes_moved(case) == 2 * (320 * 10240 + 3 * 10240 + 3 * 320)
    assert ll.flop(case) == 2 * 3 * 320 * 10240


def test_visible_panel_is_the_seed_table_at_five_m():
    assert len(VISIBLE) == 50 and len({c.seed for c in VISIBLE}) == 50
    shapes = list(dict.fromkeys((c.n, c.k) for c in VISIBLE))
    assert shapes == SEED_SHAPES  # the seed's table order
    for n, k in SEED_SHAPES:
        assert sorted(c.m for c in VISIBLE if (c.n, c.k) == (n, k)) == [1, 2, 4, 8, 16]
    assert all(c.stratum == stratum_of(c.m) for c in VISIBLE)
    assert {c.stratum for c in VISIBLE} == set(TASK.strata) == {"m1", "m2", "m4", "m8", "m16"}


def test_smoke_panel_is_tiny_and_covers_every_stratum_and_odd_shapes():
    assert {c.stratum for c in SMOKE} == set(TASK.strata)
    assert all(c.stratum == stratum_of(c.m) for c in SMOKE)
    assert all(24 <= c.n <= 96 and 64 <= c.k <= 512 for c in SMOKE)
    assert any(c.n % 16 for c in SMOKE) and any(c.k % 64 for c in SMOKE)
    assert "never scored" in json.loads((ROOT / "tasks/llgemm/panels/smoke.json").read_text())["note"]
    assert not {c.seed for c in SMOKE} & {c.seed for c in VISIBLE}


def test_the_loop_accepts_the_manifest():
    task = LoopTask.load(ROOT, "llgemm")
    assert task.checks == ("residency", "gates")
    assert task.command("gates") == ("-m", "evals.verifier", "--gates-only", "--jobs", "16")
    assert task.columns == ("residency", "m1", "m2", "m4", "m8", "m16")
    assert [task.stratum_of(c) for c in task.sample_cases] == [stratum_of(c["m"]) for c in task.sample_cases]
    assert TASK.manifest["timing"] == "graph-paired" and TASK.manifest["baseline"] == {
        "callable": "torch.nn.functional.linear"}


# ---------------------------------------------------------------------------------------------- input regimes
@pytest.mark.parametrize("mode", ll.MODES)
def test_generate_is_deterministic_and_follows_the_contract(mode):
    case = SMOKE[3]
    first, again = ll.generate(case, mode), ll.generate(case, mode)
    w, x = first.weights["weight"], first.inputs[0]
    assert torch.equal(w, again.weights["weight"]) and torch.equal(x, again.inputs[0])
    assert w.dtype == x.dtype == torch.bfloat16 and w.is_contiguous() and x.is_contiguous()
    assert w.shape == (case.n, case.k) and x.shape == (case.m, case.k)
    assert torch.isfinite(w).all() and torch.isfinite(x).all()
    other = ll.generate(dataclasses.replace(case, seed=case.seed + 1), mode)
    assert not torch.equal(w, other.weights["weight"])


def test_modes_draw_different_problems_and_inputs_differ_by_seed():
    case = SMOKE[0]
    weights = [ll.generate(case, mode).weights["weight"] for mode in ll.MODES]
    assert all(not torch.equal(a, b) for i, a in enumerate(weights) for b in weights[i + 1:])
    a, b = ll.make_inputs(case, 2, seed=1), ll.make_inputs(case, 2, seed=1)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, b))
    assert not torch.equal(a[0][0], a[1][0]) and not torch.equal(a[0][0], ll.make_inputs(case, 1, seed=2)[0][0])
    with pytest.raises(ValueError, match="mode must be one of"):
        ll.generate(case, "gentle")


def products(case, mode):
    p = ll.generate(case, mode)
    w, x = p.weights["weight"].double(), p.inputs[0].double()
    return x[:, None, :] * w[None, :, :]  # (M, N, K), exact


def test_cancel_partial_sums_climb_far_above_the_result():
    case = SMOKE[4]
    prod = products(case, "cancel")
    y, a = prod.sum(-1), prod.abs().sum(-1)
    peak = prod.cumsum(-1).abs().amax(-1)  # in K order
    assert (peak >= 0.45 * a).all()  # the climb reaches about A/2 for every output
    assert (a > 100 * y.abs()).float().mean() > 0.9


def test_extreme_spans_many_binades_beyond_fp16_and_stays_finite():
    case = SMOKE[5]
    p = ll.generate(case, "extreme")
    x, w = p.inputs[0].double().abs(), p.weights["weight"].double().abs()
    assert x.max() > 2**30 and x.min() < 2**-30 and w.max() > 2**30 and w.min() < 2**-30
    y = ll.reference(p.weights, p.inputs, case).out
    assert torch.isfinite(y.bfloat16()).all() and y.abs().max() / y.abs().min() > 2**40


def test_outlier_outputs_are_nearly_one_product():
    case = SMOKE[2]
    prod = products(case, "outlier")
    y, a = prod.sum(-1), prod.abs().sum(-1)
    assert (a < 1.1 * y.abs()).float().mean() > 0.9
    assert ll.generate(case, "outlier").inputs[0].abs().max() >= 2**20


# ---------------------------------------------------------------------------------------------- kernels vs the bound
def linear_bf16(w, x):
    """torch's own CPU bf16 GEMM (fp32 accumulation, one rounding to bf16)."""
    return torch.nn.functional.linear(x, w)


def fp32_dense(w, x):
    return (x.float() @ w.float().T).bfloat16()


def fp32_split_k_atomics(w, x):
    """Split-K: 64-wide K slices summed in fp32 each, their partial sums added in a scrambled order (as atomics)."""
    parts = [x[:, k0:k0 + 64].float() @ w[:, k0:k0 + 64].float().T for k0 in range(0, x.shape[1], 64)]
    acc = torch.zeros_like(parts[0])
    for i in torch.randperm(len(parts), generator=torch.Generator().manual_seed(x.shape[1])).tolist():
        acc += parts[i]
    return acc.bfloat16()


def fp32_truncating_sequential(w, x):
    """The least accurate fp32 accumulator: one product at a time, every addition truncated toward zero."""
    acc = torch.zeros((x.shape[0], w.shape[0]), dtype=torch.float32)
    for k in range(x.shape[1]):
        exact = acc.double() + x[:, k:k + 1].double() * w[:, k].double()
        rounded = exact.float()
        away = rounded.double().abs() > exact.abs()
        acc = torch.where(away, torch.nextafter(rounded, torch.zeros_like(rounded)), rounded)
    return acc.bfloat16()


def bf16_sequential(w, x):
    acc = torch.zeros((x.shape[0], w.shape[0]), dtype=torch.bfloat16)
    for k in range(x.shape[1]):
        acc = (acc.float() + x[:, k:k + 1].float() * w[:, k].float()).bfloat16()
    return acc


def bf16_between_tiles(w, x):
    """fp32 within 16-wide K tiles (as one MMA), the running sum kept in bf16 between tiles."""
    acc = torch.zeros((x.shape[0], w.shape[0]), dtype=torch.bfloat16)
    for k0 in range(0, x.shape[1], 16):
        acc = (acc.float() + x[:, k0:k0 + 16].float() @ w[:, k0:k0 + 16].float().T).bfloat16()
    return acc


def fp8_weight(w, x):
    return (x.float() @ w.to(torch.float8_e4m3fn).float().T).bfloat16()


def fp32_truncated_output(w, x):  # fp32 sum, then bf16 by dropping the low 16 bits, as the Triton interpreter does
    bits = (x.float() @ w.float().T).view(torch.int32) & ~0xFFFF
    return bits.view(torch.float32).bfloat16()


def two_ulps_high(w, x):  # the fp32 result scaled by 1 + 2**-6 before rounding: beyond the one ulp allowed
    return ((x.float() @ w.float().T) * (1 + 2**-6)).bfloat16()


def missing_last_slice(w, x):
    return (x[:, :-8].float() @ w[:, :-8].float().T).bfloat16()


def check(kernel, case, mode):
    p = ll.generate(case, mode)
    ref = ll.reference(p.weights, p.inputs, case)
    return ll.check_output(kernel(p.weights["weight"], p.inputs[0]), ref, case)


FP32_KERNELS = [linear_bf16, fp32_dense, fp32_split_k_atomics, fp32_truncating_sequential, fp32_truncated_output]


@pytest.mark.parametrize("kernel", FP32_KERNELS, ids=lambda f: f.__name__)
def test_bound_accepts_fp32_kernels_on_every_case_mode_and_seed(kernel):
    for case in SMOKE:
        for seed in (case.seed, case.seed + 1000):
            for mode in ll.MODES:
                result = check(kernel, dataclasses.replace(case, seed=seed), mode)
                assert result.ok, f"{kernel.__name__} on {case.name} seed {seed} {mode}: {result.message}"


@pytest.mark.parametrize("kernel", [bf16_sequential, bf16_between_tiles], ids=lambda f: f.__name__)
@pytest.mark.parametrize("mode", ["cancel", "extreme"])
def test_bound_rejects_bf16_accumulation_on_the_adversarial_modes(kernel, mode):
    for case in SMOKE:
        result = check(kernel, case, mode)
        assert not result.ok and result.worst_excess > 10, f"{kernel.__name__} on {case.name}: {result.message}"


@pytest.mark.parametrize("kernel", [fp8_weight, two_ulps_high, missing_last_slice], ids=lambda f: f.__name__)
def test_bound_rejects_low_precision_and_wrong_variants(kernel):
    mode = "outlier" if kernel is fp8_weight else "normal"  # outliers make W's precision show at any K
    for case in SMOKE:
        result = check(kernel, case, mode)
        assert not result.ok, f"{kernel.__name__} passed on {case.name} {mode}"


class OutputSubclass(torch.Tensor):
    """A subclass could override the operations the check itself uses; it is refused whatever it does."""


@pytest.mark.parametrize("bad, message", [
    (lambda out: out.float(), "dtype"),
    (lambda out: out.half(), "dtype"),
    (lambda out: out[:, :-1], "shape"),
    (lambda out: out.t().contiguous().t(), "contiguous"),
    (lambda out: out.clone().fill_(float("inf")), "not finite"),
    (lambda out: [out], "torch.Tensor"),
    (lambda out: out.as_subclass(OutputSubclass), "plain torch.Tensor"),
])
def test_check_output_names_the_structural_fault(bad, message):
    case = SMOKE[6]  # M 16, N 48: the transpose of the output is not contiguous
    p = ll.generate(case, "normal")
    ref = ll.reference(p.weights, p.inputs, case)
    good = fp32_dense(p.weights["weight"], p.inputs[0])
    assert ll.check_output(good, ref, case).ok
    result = ll.check_output(bad(good), ref, case)
    assert not result.ok and message in result.message


def test_batched_oracle_agrees_with_the_single_one():
    case = SMOKE[4]
    weights = ll.generate(case, "normal").weights
    inputs = ll.make_inputs(case, 3, seed=5)
    refs = ll.references(weights, inputs, case)
    for (x,), ref in zip(inputs, refs):
        single = ll.reference(weights, (x,), case)
        assert torch.equal(ref.out, single.out) and torch.equal(ref.tolerance, single.tolerance)
    outs = [fp32_dense(weights["weight"], inputs[0][0]), bf16_sequential(weights["weight"], inputs[0][0]),
            torch.full((case.m, case.n), float("nan"), dtype=torch.bfloat16)]
    assert ll.outside_bound(outs, refs[0], case) == sum(not ll.check_output(o, refs[0], case).ok for o in outs) == 2


def test_checking_outputs_at_once_gives_each_outputs_own_result():
    case = SMOKE[6]
    weights = ll.generate(case, "cancel").weights
    w = weights["weight"]
    inputs = ll.make_inputs(case, 4, seed=11)
    refs = ll.references(weights, inputs, case)
    nan = fp32_dense(w, inputs[2][0])
    nan[3, 5] = float("nan")
    outs = [fp32_dense(w, inputs[0][0]), bf16_sequential(w, inputs[1][0]), nan, fp32_dense(w, inputs[3][0]).float(),
            fp32_split_k_atomics(w, inputs[0][0])]
    refs.append(refs[0])
    at_once = ll.check_outputs(outs, refs, case)
    one_by_one = [ll.check_output(out, ref, case) for out, ref in zip(outs, refs)]
    assert [r.ok for r in at_once] == [True, False, False, False, True]
    assert [r.to_dict() for r in at_once] == [r.to_dict() for r in one_by_one]
    assert TASK.check_outputs(outs, refs, case) == at_once


def test_the_chunked_oracle_is_the_whole_fp64_product_and_leaves_w_alone(monkeypatch):
    case = SMOKE[3]  # N = 33: chunks of 4 rows leave a short last one
    monkeypatch.setattr(ll, "ORACLE_CHUNK", 4 * case.k)
    weights = ll.generate(case, "cancel").weights
    w, (x,) = weights["weight"], ll.make_inputs(case, 1, seed=3)[0]
    y, a = ll._dots_f64(x, w)
    w64 = w.double()  # an fp64 weight: its chunks need no conversion, and the absolute values must not land in it
    assert torch.equal(ll._dots_f64(x, w64)[1], a) and torch.equal(w64, w.double())
    close = dict(rtol=1e-12, atol=1e-300)
    assert torch.allclose(y, x.double() @ w.double().T, **close)
    assert torch.allclose(a, x.double().abs() @ w.double().abs().T, **close)
    assert (a > 100 * y.abs()).any()  # the cancel regime: the absolute sums stand far above the result


def test_baseline_is_torch_linear_on_the_weight():
    case = SMOKE[1]
    p = ll.generate(case, "normal")
    fn = ll.baseline(p.weights, case)
    assert torch.equal(fn(p.inputs[0]), torch.nn.functional.linear(p.inputs[0], p.weights["weight"]))


# ---------------------------------------------------------------------------------------------- sealed panels
def test_sealed_panel_is_deterministic_disjoint_and_in_range():
    panel = ll.make_panel(7, 5, TASK.strata, VISIBLE)
    assert panel == ll.make_panel(7, 5, TASK.strata, VISIBLE)
    assert panel["cases"] != ll.make_panel(8, 5, TASK.strata, VISIBLE)["cases"]
    assert "never give it to the agent" in panel["note"]
    cases = [ll.Case(**row) for row in panel["cases"]]
    assert len(cases) == 25 and len(panel["sources"]) == 25
    assert [c.stratum for c in cases] == [s for s in TASK.strata for _ in range(5)]
    assert all(c.stratum == stratum_of(c.m) for c in cases)
    visible_shapes, visible_seeds = {(c.n, c.k) for c in VISIBLE}, {c.seed for c in VISIBLE}
    assert not {(c.n, c.k) for c in cases} & visible_shapes and not {c.seed for c in cases} & visible_seeds
    assert len({c.seed for c in cases}) == 25 and len({(c.n, c.k) for c in cases}) == 25
    assert all(c.k % 8 == 0 and 2 * c.n * c.k <= ll.WEIGHT_CAP for c in cases)
    assert all("TP=" in s or "router" in s for s in panel["sources"])


def test_sealed_shapes_are_tp_splits_of_the_model_table():
    shapes = ll.local_shapes(VISIBLE)
    found = {(n, k): source for n, k, source in shapes}
    assert found[(14336, 4096)] == "Llama-3-8B gate_up_proj TP=2"  # column-parallel: N / TP
    assert found[(4096, 3584)] == "Llama-3-8B down_proj TP=4"  # row-parallel: K / TP
    assert found[(8, 4096)] == "Mixtral-8x7B router"  # replicated
    assert (128256, 4096) not in found  # Llama-3-8B's lm_head at TP=1: over the weight cap
    assert (576, 3584) not in found  # Qwen2.5-7B's qkv at TP=8: its 4 KV heads do not split 8 ways
    assert len(found) == len(shapes) > 100


# ---------------------------------------------------------------------------------------------- residency
CASE = ll.Case("m4", 4, 4096, 2560, 1)


def point(new, unattributed=0):
    p = Checkpoint("build", sum(s.nbytes for s in new) + unattributed, {}, unattributed, [])
    allowance = ll.residency(CASE)
    p.figures = allowance.account(p, new)
    return p, allowance


def test_allowance_follows_the_spec_formula():
    a = ll.residency(CASE)
    assert (a.copy, a.workspace) == (2 * 4096 * 2560, 64 * 4096 + 65536)
    assert a.quoted == ("workspace_bytes",)


def test_one_copy_of_w_and_a_workspace_pass():
    new = [Storage(2 * 4096 * 2560, "bfloat16", (2560, 4096)), Storage(16 * 4096 * 4, "float32", (16, 4096)),
           Storage(256 * 4, "int32", (256,))]
    p, a = point(new)
    assert p.figures == {"exempt_bytes": 2 * 4096 * 2560, "workspace_bytes": 16 * 4096 * 4 + 1024,
                         "exempt_shape": [2560, 4096]}
    assert a.audit(p, new) == []
    assert p.quoted(a) == {"workspace_bytes": 16 * 4096 * 4 + 1024}


def test_a_second_copy_an_fp32_copy_or_unexplained_bytes_break_the_contract():
    copy = Storage(2 * 4096 * 2560, "bfloat16", (4096, 2560))
    second = [copy, Storage(2 * 4096 * 2560, "int16", (4096, 2560))]  # a label does not hide it
    p, a = point(second)
    assert {v["rule"] for v in a.audit(p, second)} == {"total", "workspace", "copies"}
    fp32 = [Storage(4 * 4096 * 2560, "float32", (4096, 2560))]
    p, a = point(fp32)
    fired = {v["rule"]: v for v in a.audit(p, fp32)}
    assert set(fired) == {"total", "workspace"}  # one storage of W's size or more: not a second copy
    assert fired["workspace"]["bytes"] == 4 * 4096 * 2560
    p, a = point([copy], unattributed=a.workspace + 512)
    fired = {v["rule"]: v for v in a.audit(p, [copy])}
    assert set(fired) == {"total", "workspace"} and fired["workspace"]["over"] == 512


def write_solution(tmp_path, name, body):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "solution.py").write_text("import torch\n\n\n" + body)
    return directory


KEEPS_ONE_COPY = """def build(weight):
    w = weight.t().contiguous()  # the re-laid copy: (K, N)
    partials = torch.zeros((16, weight.shape[0]), dtype=torch.float32)  # the workspace

    def fn(x):
        return (x.float() @ w.float() + partials[: x.shape[0]]).bfloat16()

    return fn
"""
KEEPS_TWO_COPIES = """def build(weight):
    kept = [weight.clone(), weight.t().contiguous()]

    def fn(x):
        return torch.nn.functional.linear(x, kept[0])

    return fn
"""
KEEPS_FP32_COPY = """def build(weight):
    w = weight.float()

    def fn(x):
        return (x.float() @ w.T).bfloat16()

    return fn
"""


@pytest.mark.parametrize("body, case, rules", [
    (KEEPS_ONE_COPY, ll.Case("m4", 3, 256, 1024, 3), set()),
    (KEEPS_TWO_COPIES, ll.Case("m8", 6, 64, 512, 3), {"copies"}),  # small: the second copy fits the workspace
    (KEEPS_TWO_COPIES, ll.Case("m4", 3, 256, 1024, 3), {"total", "workspace", "copies"}),
    (KEEPS_FP32_COPY, ll.Case("m4", 3, 256, 1024, 3), {"total", "workspace"}),
], ids=["one-copy", "two-small-copies", "two-copies", "fp32-copy"])
def test_the_guard_measures_real_solutions(body, case, rules, tmp_path):
    solution = write_solution(tmp_path, "candidate", body)
    result = guard_case(TASK, solution, case, torch.device("cpu"), calls=3)
    assert result.error is None, result.error
    fired = {v["rule"] for p in result.checkpoints for v in p.violations}
    assert fired == rules and result.ok == (not rules)
    assert [p.name for p in result.checkpoints] == ["build", "first call", "3 calls"]
