"""The graph-paired timer (evals/graph_timing.py): its statistics, its pairs' order, refills and checks, and its
record, eagerly on CPU; graph capture, the two regimes' ranking and a capture failure on a GPU."""
import math

import pytest
import torch

from evals import graph_timing as gt
from evals import kernel_harness as kh


def test_spread_is_the_interquartile_ratio_and_halves_leave_the_middle_out():
    assert gt.quantile([4.0, 1.0, 3.0, 2.0, 5.0], 0.25) == 2.0 and gt.quantile([1.0, 2.0], 0.5) == 1.5
    assert gt.spread([1.0, 2.0, 3.0, 4.0, 5.0]) == 2.0  # p75 4 / p25 2
    assert gt.spread([10.0] * 20 + [100.0]) == 1.0  # one stalled replay does not move the quartiles
    assert gt.spread([]) is None and gt.spread(None) is None and gt.spread([0.0, 0.0, 1.0]) is None
    assert gt.halves([1.0, 2.0, 9.0, 4.0, 5.0]) == [gt.center([1.0, 2.0]), gt.center([4.0, 5.0])]  # 9.0: the middle
    assert gt.halves([3.0]) is None and gt.halves(None) is None


def test_a_series_is_taken_by_place_so_that_the_pairs_order_effect_weighs_alike_on_both_callables():
    """21 pairs in which whichever callable runs first takes 7.1 us and the second 6.1 us: A (first in the even
    pairs) has 11 slow replays, B 10. The whole series' medians would make the same code 0.86x itself and its
    spreads fail the verifier's 1.15; by place both centers are sqrt(7.1 * 6.1) and both spreads 1.0."""
    first, second = 7.1, 6.1
    a = [first if i % 2 == 0 else second for i in range(21)]
    b = [second if i % 2 == 0 else first for i in range(21)]
    assert kh.median(b) / kh.median(a) == pytest.approx(second / first) and gt.spread(a) > 1.15
    record = gt.summary({"a": a, "b": b}, ("a", "b"), 8, 21, 0)
    assert record["a_us"] == pytest.approx(math.sqrt(first * second)) == record["b_us"]
    assert record["ratio"] == pytest.approx(1.0) and record["a_spread"] == 1.0 == record["b_spread"]
    assert record["b_halves_us"] == [pytest.approx(math.sqrt(first * second))] * 2
    # a callable slow in one place only is not cleared: its center carries the slow place, its spread a place's own
    noisy = [10.0, 10.0, 13.0, 10.0, 10.0, 10.0, 13.0, 10.0, 13.0]  # the even place: 10, 13, 10, 13, 13
    assert gt.place_spread(noisy) == pytest.approx(13.0 / 10.0) and gt.center(noisy) > 10.0
    assert gt.center([]) is None and gt.place_spread(None) is None and gt.center([4.0]) == 4.0


def regime(name: str, values: dict) -> dict:
    return gt.summary(values, ("cand", "base"), 1, len(values["cand"]), 0) | {"name": name}


def test_a_regime_record_names_both_callables_and_the_ratio_is_the_yardsticks_over_the_candidates():
    found = regime("hot", {"cand": [10.0, 11.0, 12.0], "base": [20.0, 21.0, 22.0, 23.0]})
    # by place: the even-indexed replays' median and the odd-indexed', their geometric mean
    assert found["cand_us"] == pytest.approx(11.0) and found["base_us"] == pytest.approx(math.sqrt(21.0 * 22.0))
    assert found["ratio"] == pytest.approx(found["base_us"] / 11.0)  # the speedup of the candidate over the base
    assert found["cand_spread"] == pytest.approx(11.5 / 10.5)  # the even place's (10, 12); the odd place is 11 alone
    assert found["base_halves_us"] == [pytest.approx(math.sqrt(20.0 * 21.0)), pytest.approx(math.sqrt(22.0 * 23.0))]
    assert found["cand_times_us"] == [10.0, 11.0, 12.0]
    assert regime("flushed", {"cand": [], "base": [1.0]})["ratio"] is None  # a missing series: no ratio


@pytest.mark.skipif(torch.cuda.is_available(), reason="the eager fallback runs where there is no CUDA")
def test_without_cuda_the_pairs_run_eagerly_in_alternation_with_refills_and_checks():
    """The record has the protocol's structure; pair i calls the candidate first when i is even; every pair is
    refilled first with its own index (running on across the regimes); the checks see the candidate's outputs of the
    refilled inputs after every pair, and the yardstick's after the first ``checked_pairs`` pairs of each regime and
    after its last. A callable 200 times slower ranks slower in both regimes."""
    plan = gt.Plan(hot_calls=3, hot_pairs=5, flushed_pairs=4, warm_replays=1, checked_pairs=2)
    weight = torch.randn(256, 256)
    inputs = [(torch.zeros(64, 256),) for _ in range(4)]
    events = []

    def slow(x):
        events.append(("slow", int(x[0, 0])))
        for _ in range(8):
            out = x @ weight
        return out

    def fast(x):
        events.append(("fast", int(x[0, 0])))
        return x * 2.0

    refills = []

    def refill(pair: int) -> None:
        refills.append(pair)
        for i, (x,) in enumerate(inputs):
            x.fill_(100 * pair + i)

    checks = []

    def check(name, regime, pair, outputs):
        marks = [100 * pair + j % len(inputs) for j in range(len(outputs))]
        want = [(x @ weight if name == "slow" else x * 2.0) for x in (torch.full((64, 256), float(m)) for m in marks)]
        checks.append((name, regime, pair, len(outputs), all(torch.allclose(o, w) for o, w in zip(outputs, want))))

    found = gt.paired(slow, fast, inputs, refill, check, names=("slow", "fast"), plan=plan)
    assert found["protocol"] == "graph-paired" and not found["graphs"] and "not GPU timing" in found["note"]
    assert found["names"] == ["slow", "fast"] and found["plan"]["hot_pairs"] == 5
    assert refills == list(range(9))
    # which callable a pair called first, told by the refilled values (pair 0's are the warm-up's zeros too)
    order = [next(name for name, mark in events if mark == 100 * pair) for pair in range(1, 9)]
    assert order == ["fast", "slow", "fast", "slow", "slow", "fast", "slow", "fast"]  # flushed pairs restart at even
    every = {"hot": range(0, 5), "flushed": range(5, 9)}
    assert [(n, r, p, count) for n, r, p, count, _ in checks] == [
        (name, regime, p, 3 if regime == "hot" else 1) for regime in ("hot", "flushed") for p in every[regime]
        for name in ("slow", "fast") if name == "slow" or p in ((0, 1, 4) if regime == "hot" else (5, 6, 8))]
    assert all(ok for *_, ok in checks)
    for name, pairs in (("hot", 5), ("flushed", 4)):
        record = found[name]
        assert len(record["slow_times_us"]) == len(record["fast_times_us"]) == pairs
        assert record["ratio"] == record["fast_us"] / record["slow_us"] < 0.5, record
        assert record["slow_spread"] >= 1.0 and len(record["fast_halves_us"]) == 2
    assert found["hot"]["calls_per_replay"] == 3 and found["flushed"]["calls_per_replay"] == 1
    assert found["speedup"] == min(found["hot"]["ratio"], found["flushed"]["ratio"])
    assert found["calls"] == {"slow": (5 + 1) * 3 + 4 + 1, "fast": (5 + 1) * 3 + 4 + 1}


def test_subjects_must_be_prepared_on_the_inputs_the_pairs_rewrite():
    inputs, others = [(torch.zeros(2, 2),)], [(torch.zeros(2, 2),)]
    prepared = gt.prepare(lambda x: x + 1, others, "baseline", gt.SMOKE)
    with pytest.raises(ValueError, match="same static inputs"):
        gt.paired(lambda x: x * 2, prepared, inputs, plan=gt.SMOKE)


# ----------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_on_a_gpu_the_slower_matmul_is_slower_in_both_regimes_and_the_checks_see_the_graphs_outputs():
    """A 16x4096 @ 4096x8192 bf16 product (a 64 MiB weight, over the L2) against a 4096x1024 one (8 MiB): the larger
    is slower hot and flushed, by more when flushed; every series is steady; the graphs' outputs follow the refills."""
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    big = torch.randn(4096, 8192, device=device, generator=gen).bfloat16()
    small = torch.randn(4096, 1024, device=device, generator=gen).bfloat16()
    inputs = [(torch.empty(16, 4096, device=device, dtype=torch.bfloat16),) for _ in range(gt.HOT_CALLS)]
    draws = {}

    def refill(pair):
        g = torch.Generator(device=device).manual_seed(1000 + pair)
        draws[pair] = [torch.randn(16, 4096, device=device, generator=g).bfloat16() for _ in inputs]
        for (x,), value in zip(inputs, draws[pair]):
            x.copy_(value)

    wrong = []
    checked = []

    def check(name, regime, pair, outputs):
        weight = big if name == "big" else small
        for j, out in enumerate(outputs):
            want = draws[pair][j % len(inputs)] @ weight
            checked.append((name, regime, pair))
            if not torch.allclose(out.float(), want.float(), rtol=2e-2, atol=2e-1):
                wrong.append((name, regime, pair, j))

    found = gt.paired(lambda x: x @ big, lambda x: x @ small, inputs, refill, check, names=("big", "small"))
    assert found["graphs"] and found["note"] == gt.GRAPH_NOTE and not wrong
    assert {(n, r) for n, r, _ in checked} == {(n, r) for n in ("big", "small") for r in ("hot", "flushed")}
    for name, pairs in (("hot", gt.HOT_PAIRS), ("flushed", gt.FLUSHED_PAIRS)):
        record = found[name]
        assert len(record["big_times_us"]) == pairs and record["ratio"] < 0.8, (name, record["ratio"])
        for who in ("big", "small"):
            assert 1.0 <= record[f"{who}_spread"] <= 1.15, (name, who, record[f"{who}_spread"])
    assert found["flushed"]["big_us"] > found["hot"]["big_us"]  # from HBM, not the L2
    assert found["speedup"] == min(found["hot"]["ratio"], found["flushed"]["ratio"])


@pytest.mark.gpu
def test_a_callable_that_cannot_be_captured_is_named_and_the_device_stays_usable():
    device = torch.device("cuda")
    inputs = [(torch.randn(8, 64, device=device),) for _ in range(gt.HOT_CALLS)]

    def syncs(x):  # .item() waits on the GPU: not allowed under capture
        return x * float(x.sum().item())

    with pytest.raises(gt.GraphCaptureError, match="the candidate could not be captured in a CUDA graph") as raised:
        gt.paired(syncs, lambda x: x * 2.0, inputs, names=("candidate", "baseline"), plan=gt.SMOKE)
    assert raised.value.name == "candidate" and ".item()" in str(raised.value)
    with pytest.raises(gt.GraphCaptureError) as raised:
        gt.paired(lambda x: x * 2.0, syncs, inputs, names=("candidate", "baseline"), plan=gt.SMOKE)
    assert raised.value.name == "baseline"
    found = gt.paired(lambda x: x * 3.0, lambda x: x * 2.0, inputs, plan=gt.SMOKE)  # the context survived
    assert found["graphs"] and found["speedup"] > 0


@pytest.mark.gpu
def test_a_callable_that_captures_another_kernel_than_it_runs_is_caught_by_the_check():
    """Eager calls compute; under capture it records a kernel that writes nothing: the check of its graph outputs
    after a refill finds them wrong."""
    device = torch.device("cuda")
    inputs = [(torch.randn(8, 64, device=device),) for _ in range(gt.HOT_CALLS)]

    def cheat(x):
        return torch.empty_like(x).zero_() if torch.cuda.is_current_stream_capturing() else x * 2.0

    def refill(pair):
        for (x,) in inputs:
            x.normal_()

    seen = []

    def check(name, regime, pair, outputs):
        ok = all(torch.allclose(out, inputs[j % len(inputs)][0] * 2.0) for j, out in enumerate(outputs))
        seen.append((name, ok))

    gt.paired(cheat, lambda x: x * 2.0, inputs, refill, check, names=("cheat", "honest"), plan=gt.SMOKE)
    assert {ok for name, ok in seen if name == "cheat"} == {False}
    assert {ok for name, ok in seen if name == "honest"} == {True}


@pytest.mark.gpu
def test_a_graph_whose_replays_skip_work_leaves_nan_that_the_check_after_every_pair_sees():
    """A kernel that computes on one replay in ten (a counter kept across calls tells which): every pair's outputs
    are set to NaN first and checked after, so the skipped replays show, wherever they fall."""
    import triton
    import triton.language as tl

    @triton.jit
    def every_tenth(x_ptr, y_ptr, count_ptr, n, BLOCK: tl.constexpr):
        seen = tl.atomic_add(count_ptr, 1)
        offs = tl.arange(0, BLOCK)
        if seen % 10 == 0:
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)

    device = torch.device("cuda")
    count = torch.zeros(1, dtype=torch.int32, device=device)
    inputs = [(torch.randn(64, device=device),) for _ in range(gt.HOT_CALLS)]

    def cheat(x):
        y = torch.empty_like(x)
        every_tenth[(1,)](x, y, count, x.numel(), BLOCK=64)
        return y

    def refill(pair):
        for (x,) in inputs:
            x.normal_()

    verdicts = []

    def check(name, regime, pair, outputs):
        if name == "cheat":
            verdicts.append(all(torch.allclose(out, inputs[j % len(inputs)][0] * 2.0) for j, out in enumerate(outputs)))

    gt.paired(cheat, lambda x: x * 2.0, inputs, refill, check, names=("cheat", "honest"))
    assert len(verdicts) == gt.HOT_PAIRS + gt.FLUSHED_PAIRS and verdicts.count(False) > len(verdicts) // 2


@pytest.mark.gpu
def test_on_a_gpu_graphs_after_the_first_take_no_library_state_of_their_own():
    """Every graph is warmed and captured on the process's one side stream: cuBLAS's per-stream workspace is taken
    for the first subject (a verifier's yardstick, before its residency baseline), and a second subject calling
    F.linear (a candidate falling back to it) adds its graphs' static outputs only, not a workspace."""
    device = torch.device("cuda")
    weight = torch.randn(512, 1024, device=device).bfloat16()
    inputs = [(torch.randn(4, 1024, device=device).bfloat16(),) for _ in range(2)]
    plan = gt.Plan(hot_calls=2, hot_pairs=1, flushed_pairs=1, warm_replays=1, checked_pairs=1)
    first = gt.prepare(lambda x: torch.nn.functional.linear(x, weight), inputs, "baseline", plan)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    second = gt.prepare(lambda x: torch.nn.functional.linear(x, weight), inputs, "candidate", plan)
    torch.cuda.synchronize()
    outputs = sum(out.untyped_storage().nbytes() for runner in second.regimes.values() for out in runner.outputs)
    assert torch.cuda.memory_allocated() - before <= outputs + (1 << 20), (torch.cuda.memory_allocated() - before)
    assert gt.side_stream() is gt.side_stream()
    found = gt.paired(second, first, inputs, plan=plan)
    assert found["graphs"] and found["speedup"] > 0
