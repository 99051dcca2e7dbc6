"""The "graph-paired" timing protocol: a candidate and its yardstick, each replayed from a CUDA graph, in pairs.

It measures as vLLM's LL-GEMM tuning did. Each callable is captured in CUDA graphs of its own on the same static call
inputs, and the two are timed in one process, in alternation, in two regimes:

    hot       a graph of HOT_CALLS calls on HOT_CALLS distinct call inputs, replayed HOT_PAIRS times per callable;
              the time per call is the replay's time / HOT_CALLS (weights and inputs may sit in the L2)
    flushed   a graph of one call, replayed FLUSHED_PAIRS times per callable, each replay after a read of a 256 MiB
              buffer that evicts the L2 (every byte comes from HBM)

Pair i of a regime replays A then B for even i, B then A for odd i, so that a drift hits both alike; and since the first
replay of a pair may run slower than the second (after the refill and the checks:
reports/examples/llgemm-seed002/README.md, "The verifier on the H100"), each series is summed up by place: its center is
the geometric mean of the medians of its even- and odd-indexed replays (the pairs it ran first, those it ran second),
its spread the larger of the two places' spreads, so that the order effect weighs alike on both callables whatever the
count of pairs and is not taken for a callable's dispersion. Every replay is bracketed by CUDA events after a
``torch.cuda._sleep`` spin that keeps the GPU busy while the host enqueues the events and the replay, so the host's
launch cost never lands inside the timed region (``replay_us`` times one callable alone so).
Before every pair, outside the timed region, ``refill(pair)`` rewrites the static call inputs in place with a fresh
seeded draw, so that no cache of outputs can pay, and the candidate's static outputs are set to NaN; after every pair
``check(name, regime, pair, outputs)`` sees the candidate's static outputs (and the yardstick's after the first
``Plan.checked_pairs`` pairs of each regime and its last): a callable that captures another kernel under graph
capture than it runs eagerly, or whose replays skip work, is caught there. Pair indices run on across the regimes
(hot first), so every pair's draw is distinct.

Names: A is the candidate, B the yardstick. ``ratio`` = B's center / A's center, the speedup of A over B; the
result's ``speedup`` = min(hot ratio, flushed ratio): a speedup counts only where it holds in both regimes. A place's
spread is its interquartile ratio p75/p25.

Without CUDA there are no graphs: the same pairs, refills and checks run eagerly (the "flushed" regime without a
flush), timed with the host's clock: interpreter wall times with the record's structure, never GPU timing.
"""
from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from evals import kernel_harness as kh
from evals.task import GRAPH_PAIRED

HOT_CALLS = 8  # calls per hot graph, on as many distinct call inputs
HOT_PAIRS = 21  # timed pairs of hot replays
FLUSHED_PAIRS = 101  # timed pairs of flushed replays
WARM_REPLAYS = 3  # untimed replays of every graph before the pairs
CHECKED_PAIRS = 3  # the first pairs of each regime whose yardstick outputs ``check`` sees (and the regime's last)
WARMUP_CALLS = 3  # eager calls on a side stream before a capture: compilation, autotuning, library handles
FLUSH_BYTES = 256 << 20  # four times an H200's L2
# ~100 us of spinning (H200 SMs clock at most 1.98 GHz): enough for the host to enqueue start event, replay and end
# event while the GPU is busy, so that host launch cost never lands between the two events
SPIN_CYCLES = 200_000
PROTOCOL = GRAPH_PAIRED
GRAPH_NOTE = "graph replay: the host's cost is outside the timed region"
EAGER_NOTE = ("no CUDA: no graphs exist, so the graph-paired pairs ran eagerly (the flushed regime without a flush); "
              "interpreter wall times, not GPU timing")
# the protocol's own handles, taken before any candidate code runs, so that a patched one cannot reach them
_perf_counter, _Event, _sleep, _Stream = time.perf_counter, torch.cuda.Event, torch.cuda._sleep, torch.cuda.Stream
_CUDAGraph, _replay, _capture = torch.cuda.CUDAGraph, torch.cuda.CUDAGraph.replay, torch.cuda.graph


@dataclass(frozen=True)
class Plan:
    """The protocol's counts: ``FULL`` is the protocol of record; ``SMOKE`` only makes CPU tests short."""

    hot_calls: int = HOT_CALLS
    hot_pairs: int = HOT_PAIRS
    flushed_pairs: int = FLUSHED_PAIRS
    warm_replays: int = WARM_REPLAYS
    checked_pairs: int = CHECKED_PAIRS


FULL = Plan()
SMOKE = Plan(hot_calls=2, hot_pairs=3, flushed_pairs=3, warm_replays=1, checked_pairs=1)


class GraphCaptureError(RuntimeError):
    """A callable whose calls could not be captured in a CUDA graph; ``name`` says which (the candidate or the
    yardstick)."""

    def __init__(self, name: str, exc: BaseException) -> None:
        causes = [exc, *([exc.__context__] if exc.__context__ is not None and exc.__context__ is not exc else [])]
        said = "; ".join(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}" for e in causes)
        super().__init__(f"the {name} could not be captured in a CUDA graph ({said}); the graph-paired protocol "
                         "times every callable by graph replay, so its calls must be capturable: no host "
                         "synchronization (.item(), .cpu(), .tolist(), torch.cuda.synchronize) and no work outside "
                         "the current stream within a call")
        self.name = name


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile by linear interpolation between order statistics (numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(values: list[float] | None) -> float | None:
    """A series' interquartile spread p75/p25; None for a missing or empty series or a non-positive p25."""
    if not values:
        return None
    low = quantile(values, 0.25)
    return quantile(values, 0.75) / low if low > 0 else None


def places(values: list[float]) -> list[list[float]]:
    """A series' replays by their place in the pairs: the even-indexed and the odd-indexed (one callable ran first in
    the one, second in the other), each non-empty one."""
    return [place for place in (values[0::2], values[1::2]) if place]


def center(values: list[float] | None) -> float | None:
    """The geometric mean of the medians of a series' two places (``places``); None for a missing or empty series."""
    found = [statistics.median(place) for place in places(values or [])]
    return math.prod(found) ** (1 / len(found)) if found else None


def place_spread(values: list[float] | None) -> float | None:
    """The larger of the two places' interquartile spreads (``spread``); None where a series or a spread is missing."""
    found = [spread(place) for place in places(values or [])]
    return None if not found or None in found else max(found)


def halves(values: list[float] | None) -> list[float] | None:
    """Centers of a series' first and second half (the middle value of an odd count in neither); None for fewer than
    two values."""
    if not values or len(values) < 2:
        return None
    half = len(values) // 2
    return [center(values[:half]), center(values[-half:])]


def summary(series: dict[str, list[float]], names: tuple[str, str], calls: int, pairs: int, first: int) -> dict:
    """One regime's record: each callable's per-replay us per call (``<name>_times_us``), its center (``<name>_us``)
    and spread by place (``<name>_spread``), ``ratio`` = B's center / A's center, and B's half centers
    (``<B>_halves_us``)."""
    a, b = names
    record = {"calls_per_replay": calls, "pairs": pairs, "first_pair": first}
    for name in names:
        record[f"{name}_times_us"] = series[name]
        record[f"{name}_us"] = center(series[name])
        record[f"{name}_spread"] = place_spread(series[name])
    record["ratio"] = (record[f"{b}_us"] / record[f"{a}_us"]) if record[f"{a}_us"] and record[f"{b}_us"] else None
    record[f"{b}_halves_us"] = halves(series[b])
    return record


# ----------------------------------------------------------------------------------------------------- subjects
class _Eager:
    """Off CUDA: a regime's calls, made and timed with the host's clock."""

    graphs = False

    def __init__(self, fn: Callable, calls: list[tuple]) -> None:
        self.fn, self.calls, self.outputs = fn, calls, []

    def run(self) -> float:
        began = _perf_counter()
        self.outputs = [self.fn(*args) for args in self.calls]
        return (_perf_counter() - began) * 1e6 / len(self.calls)

    def timed(self, flush) -> float:
        return self.run()


_side: list = []  # this process's side stream, made at the first graph


def side_stream() -> torch.cuda.Stream:
    """The one stream of every graph's warm-up and capture in this process. A library that keeps state per stream
    (cuBLAS, a workspace) takes it once, at the first callable captured (a verifier's yardstick, before its residency
    baseline), not again for each graph: a new stream per graph charged a candidate that falls back to F.linear with
    64 MiB no tensor held (reports/examples/llgemm-seed002/README.md, "The verifier on the H100")."""
    if not _side:
        _side.append(_Stream())
    return _side[0]


class Graph:
    """A regime's calls captured in one CUDA graph; its static outputs are the captured calls' outputs."""

    graphs = True

    def __init__(self, fn: Callable, calls: list[tuple], name: str) -> None:
        self.calls = calls
        side = side_stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: a call that raises here is the callable's failure, not a capture's
            for i in range(WARMUP_CALLS):
                fn(*calls[i % len(calls)])
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = _CUDAGraph()
        try:
            with _capture(self.graph, stream=side):
                self.outputs = [fn(*args) for args in calls]
        except Exception as exc:  # torch's capture error, or the call's own under capture
            raise GraphCaptureError(name, exc) from exc

    def run(self) -> None:
        _replay(self.graph)

    def timed(self, flush: torch.Tensor | None) -> float:
        if flush is not None:
            # a read, not a write: the L2 is left holding clean lines, so the timed replay pays no write-back of them
            flush.view(torch.float32).sum()
        _sleep(SPIN_CYCLES)  # the GPU is busy while the host enqueues the events and the replay
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        start.record()
        _replay(self.graph)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000 / len(self.calls)


def replay_us(fn: Callable, inputs: tuple, flush: torch.Tensor | None, replays: int = 50) -> float:
    """Median GPU time of one call on ``inputs`` replayed from a CUDA graph, timed as the pairs are (the spin keeps
    the host's launch out of the timed region); with ``flush`` (FLUSH_BYTES), the L2 is evicted before each replay.
    The bench, profile and sweep time a callable alone this way."""
    runner = Graph(fn, [inputs], "callable")
    return kh.median([runner.timed(flush) for _ in range(replays)])


class Subject:
    """One callable's two regimes on static call ``inputs``: on CUDA captured in graphs (the hot graph's calls on
    ``inputs`` cycled, the flushed graph's one call on ``inputs[0]``), else eager. Made by ``prepare`` before the
    pairs, possibly long before: a verifier captures its yardstick before any candidate code exists in its process."""

    def __init__(self, fn: Callable, inputs: list[tuple], name: str, plan: Plan) -> None:
        self.name, self.inputs, self.plan = name, inputs, plan
        hot = [inputs[i % len(inputs)] for i in range(plan.hot_calls)]
        self.graphs = _on_cuda(inputs)
        kind = (lambda calls: Graph(fn, calls, name)) if self.graphs else (lambda calls: _Eager(fn, calls))
        self.regimes = {"hot": kind(hot), "flushed": kind([inputs[0]])}
        self.calls = WARMUP_CALLS * 2 if self.graphs else 0  # calls made so far (a capture runs none)

    def warm(self) -> None:
        for runner in self.regimes.values():
            for _ in range(self.plan.warm_replays):
                runner.run()
                self.calls += len(runner.calls)


def prepare(fn: Callable, inputs: list[tuple], name: str, plan: Plan = FULL) -> Subject:
    """``fn`` captured (on CUDA) on the static call ``inputs`` for ``paired``; a GraphCaptureError names ``name``."""
    return Subject(fn, inputs, name, plan)


def _on_cuda(inputs: list[tuple]) -> bool:
    first = next((t for t in inputs[0] if isinstance(t, torch.Tensor)), None)
    return first is not None and first.device.type == "cuda"


# ----------------------------------------------------------------------------------------------------- the pairs
def poison(runner) -> None:
    """A graph's static floating outputs set to NaN before a pair, outside the timed region: a replay that skips its
    work leaves them so, and the check after the pair sees it (an eager call makes fresh outputs: nothing to do)."""
    if getattr(runner, "graphs", False):
        for out in runner.outputs:
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                out.fill_(float("nan"))


def paired(fn_a, fn_b, inputs: list[tuple], refill: Callable[[int], None] | None = None,
           check: Callable[[str, str, int, list], None] | None = None, names: tuple[str, str] = ("a", "b"),
           plan: Plan = FULL) -> dict:
    """A (the candidate) against B (the yardstick) under the graph-paired protocol, on the static call ``inputs``
    (at least ``plan.hot_calls`` of them for distinct hot calls; the graphs read these very tensors, so ``refill``
    rewrites them in place). ``fn_a`` and ``fn_b`` are callables, or Subjects that ``prepare`` made on ``inputs``.

    ``refill(pair)`` runs before every pair, outside the timed region, and A's static graph outputs are then set to
    NaN (``poison``); ``check(name, regime, pair, outputs)`` runs after every pair for A, and for B after the first
    ``plan.checked_pairs`` pairs of each regime and after its last (``name`` from ``names``; ``outputs[j]`` was
    computed from ``inputs[j % len(inputs)]``). So every timed replay of the candidate must compute every output:
    one that skips work on replays it cannot tell from the checked ones leaves NaN or a stale value behind.

    Returns ``{"protocol", "graphs", "note", "names", "plan", "hot": {...}, "flushed": {...}, "speedup", "calls"}``:
    per regime ``summary``'s record; ``speedup`` = min(hot ratio, flushed ratio); ``calls`` the calls each callable
    made. Raises GraphCaptureError for a callable that cannot be captured, and whatever a callable raises."""
    a, b = names
    subjects = {a: fn_a if isinstance(fn_a, Subject) else prepare(fn_a, inputs, a, plan),
                b: fn_b if isinstance(fn_b, Subject) else prepare(fn_b, inputs, b, plan)}
    graphs = subjects[a].graphs
    if subjects[b].graphs != graphs or any(s.inputs is not inputs for s in subjects.values()):
        raise ValueError("paired: both subjects must be prepared on the same static inputs given here")
    flush = torch.zeros(FLUSH_BYTES, dtype=torch.uint8, device="cuda") if graphs else None
    for subject in subjects.values():
        subject.warm()
    if graphs:
        torch.cuda.synchronize()
    regimes, pair = {}, 0
    collecting = gc.isenabled()
    gc.disable()  # a collection inside the pairs is the evaluator's noise
    try:
        for regime, pairs in (("hot", plan.hot_pairs), ("flushed", plan.flushed_pairs)):
            series = {a: [], b: []}
            first = pair
            for i in range(pairs):
                if refill is not None:
                    refill(pair)
                poison(subjects[a].regimes[regime])
                for name in ((a, b) if i % 2 == 0 else (b, a)):
                    runner = subjects[name].regimes[regime]
                    series[name].append(runner.timed(flush if regime == "flushed" else None))
                    subjects[name].calls += len(runner.calls)
                if check is not None:  # A's outputs after every pair; B's, the task's own, after the first and last
                    for name in names:
                        if name == a or i < plan.checked_pairs or i == pairs - 1:
                            check(name, regime, pair, subjects[name].regimes[regime].outputs)
                pair += 1
            regimes[regime] = summary(series, names, plan.hot_calls if regime == "hot" else 1, pairs, first)
    finally:
        if collecting:
            gc.enable()
    del flush
    ratios = [regimes[r]["ratio"] for r in regimes]
    return {"protocol": PROTOCOL, "graphs": graphs, "note": GRAPH_NOTE if graphs else EAGER_NOTE,
            "names": list(names), "plan": asdict(plan), **regimes,
            "speedup": min(ratios) if None not in ratios else None,
            "calls": {name: subject.calls for name, subject in subjects.items()}}
