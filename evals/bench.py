"""Benchmark: v0, main and the peers on the visible panel against the floors measured in the same process.

    .venv/bin/python -m evals.bench [--panel visible|FILE] [--solutions methods/versions/v0 methods/main] [--no-peers]
                                    [--json OUT]

Per case: the HBM roofline (the case's bytes at the measured copy bandwidth), the GPU floor (4 us of fixed kernel
cost + that roofline) and two host floors (torch.empty + one launch through Triton's JIT dispatch; the same through
the already-compiled kernel's launcher). Then per implementation: eager latency under the verifier's protocol
(8,192 untimed calls, 11 groups of 512 timed with CUDA events; the peers, which are slow, get 512 untimed calls and
11 groups of 64), GPU time by CUDA-graph replay with the L2 hot and with the L2 flushed before every replay (seed
002's dual qualification), the host cost per call with the GPU kept busy (``host_us``, evals/stability.py: eager time
near it means host-bound), eager over the larger of the case's floors (``x_floor``: the compiled-launch host floor or
the GPU floor, whichever binds; 1.0 would be at that bound), the board's power, SM clock and energy per call over a
second of back-to-back calls (evals/power.py: a row whose note says power-capped ran at the board's power limit with
its SM clock lowered, so its eager time is near the power bound, not the bandwidth bound), and correctness on normal
inputs. Peers: torch dequantize +
addmm (allowed), a dense fp16 torch reference (NOT allowed by the residency contract: it keeps the dequantized
weight), torch._weight_int4pack_mm (tinygemm; bf16 activations, so labelled) and gemlite when installed. Needs CUDA.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from evals import kernel_harness as kh
from evals import power, stability
from evals.loader import load_solution, resolve_solution_dir
from evals.selfcheck import error_line

FIXED_KERNEL_US = 4.0
FLUSH_BYTES = 256 << 20  # four times the L2
# ~100 us of spinning (H200 SMs clock at most 1.98 GHz): enough for the host to enqueue start event, replay and end
# event while the GPU is busy, so that host launch cost never lands between the two events
SPIN_CYCLES = 200_000


@dataclass
class Row:
    case: str
    impl: str
    note: str
    correct: bool | None = None
    eager_us: float | None = None
    graph_hot_us: float | None = None
    graph_flushed_us: float | None = None
    flushed_copy_fraction: float | None = None
    host_us: float | None = None  # host cost per call with the GPU kept busy (evals/stability.py)
    gpu_us: float | None = None  # the same pass's back-to-back GPU time per call
    floor_ratio: float | None = None  # eager / max(compiled-launch host floor, GPU floor): floor_ratio()
    power: dict | None = None  # board power, SM clock and energy per call, back to back (evals/power.py)
    error: str | None = None


# ------------------------------------------------------------------------------------------------ peers
def torch_act(z: torch.Tensor, epilogue: str) -> torch.Tensor:
    return F.silu(z) if epilogue == "silu" else F.gelu(z, approximate="tanh")


def build_dequant_addmm(qweight, scales, bias, epilogue):
    def fn(x, residual):
        w = kh.dequantize(qweight, scales, torch.float16)  # transient: allowed, but a full pass per call
        return torch_act(torch.addmm(bias, x, w), epilogue) + residual

    return fn


def build_dense_fp16(qweight, scales, bias, epilogue):
    w = kh.dequantize(qweight, scales, torch.float16)  # kept: breaks the residency contract, a reference only

    def fn(x, residual):
        return torch_act(torch.addmm(bias, x, w), epilogue) + residual

    return fn


def build_tinygemm(qweight, scales, bias, epilogue):
    codes = kh.unpack_int4(qweight).t().contiguous().int()  # (N, K), 0..15
    packed = (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)
    weight = torch._convert_weight_to_int4pack(packed, 8)
    # tinygemm dequantizes (q - 8) * scale + zero
    scale_zero = torch.stack([scales.bfloat16(), torch.zeros_like(scales, dtype=torch.bfloat16)], dim=2).contiguous()
    bias_f32 = bias.float()  # bias in fp32: the row's error is tinygemm's bf16 alone, none added here

    def fn(x, residual):
        z = torch._weight_int4pack_mm(x.bfloat16(), weight, kh.GROUP_SIZE, scale_zero).float() + bias_f32
        return (torch_act(z, epilogue) + residual.float()).half()

    return fn


def gemlite_builder():
    # found, not imported: an import would run gemlite's module-level setup for a peer that is not wired yet
    if importlib.util.find_spec("gemlite") is None:
        return None
    return None  # gemlite's API varies across releases; wire it here when a pinned version is available


PEERS = {
    "torch dequant+addmm": (build_dequant_addmm, "allowed peer"),
    "dense fp16 torch": (build_dense_fp16, "NOT allowed: keeps a dense fp16 weight"),
    "torch _weight_int4pack_mm": (build_tinygemm,
                                  "tinygemm, bf16 activations and weights (the fp32 bound is not expected)"),
}


# ------------------------------------------------------------------------------------------------ timing
def eager_us(fn, inputs, untimed: int, groups: int, per_group: int) -> float:
    times = kh.time_groups(fn, inputs, groups, per_group, warmup=untimed)
    return kh.median(times)


def graph_us(fn, x, residual, flush: torch.Tensor | None, replays: int = 50) -> float:
    """Median GPU time of one call replayed from a CUDA graph; with ``flush``, the L2 is evicted before each.

    The events bracket the replay alone (the flush and a spin kernel run before the start event), and the spin keeps
    the GPU busy while the host enqueues, so that the time is the graph's GPU time, not the host's launch latency."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(x, residual)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(x, residual)
    times = []
    for _ in range(replays):
        if flush is not None:
            # a read, not a write: the L2 is left holding clean lines, so the timed replay pays no write-back of them
            flush.view(torch.float32).sum()
        torch.cuda._sleep(SPIN_CYCLES)  # the GPU is busy while the host enqueues the events and the replay
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return kh.median(times)


def host_floors(device: torch.device) -> dict:
    """torch.empty + one launch of a one-store Triton kernel: through the JIT dispatch, then the compiled launcher."""
    import triton
    import triton.language as tl

    @triton.jit
    def one_store(out_ptr):
        tl.store(out_ptr, 0.0)

    probe = torch.empty(1, dtype=torch.float16, device=device)
    compiled = one_store.warmup(probe, grid=(1,))
    launch = compiled[(1, 1, 1)]  # CompiledKernel.__getitem__ binds the grid once; a hot path keeps the runner
    inputs = [(probe,)]

    def jit_call(_):
        out = torch.empty((32, 8192), dtype=torch.float16, device=device)
        one_store[(1,)](out)

    def compiled_call(_):
        out = torch.empty((32, 8192), dtype=torch.float16, device=device)
        launch(out)

    return {"jit_launch_us": eager_us(jit_call, inputs, 2048, 11, 512),
            "compiled_launch_us": eager_us(compiled_call, inputs, 2048, 11, 512)}


# ------------------------------------------------------------------------------------------------ the bench
def floor_ratio(eager_us: float | None, gpu_floor_us: float, host_floor_us: float) -> float | None:
    """Eager time over the floor that binds, the larger of the GPU floor and the compiled-launch host floor."""
    return None if eager_us is None else eager_us / max(gpu_floor_us, host_floor_us)


def bench_impl(name: str, note: str, build, case: kh.Case, weights, inputs, copy_gbps: float, flush, full: bool) -> Row:
    row = Row(case.name, name, note)
    try:
        fn = build(weights.qweight, weights.scales, weights.bias, case.epilogue)
        ref = kh.reference(weights.x, weights.qweight, weights.scales, weights.bias, weights.residual, case.epilogue)
        row.correct = kh.check_output(fn(weights.x, weights.residual), ref, (case.m, case.n)).ok
        row.eager_us = eager_us(fn, inputs, *((8192, 11, 512) if full else (512, 11, 64)))
        row.graph_hot_us = graph_us(fn, *inputs[0], None)
        row.graph_flushed_us = graph_us(fn, *inputs[0], flush)
        row.flushed_copy_fraction = case.bytes_moved() / row.graph_flushed_us / 1e3 / copy_gbps
        found = stability.probe(fn, inputs, weights.x.device)
        row.host_us, row.gpu_us = found["host_us"], found["gpu_us"]
        # last: its second of back-to-back calls would leave the columns above timed on a board at its power limit
        row.power = power.probe(fn, inputs, weights.x.device, row.eager_us)
    except Exception as exc:  # a peer that does not run on this torch is a row with its error, not a failed bench
        row.error = error_line(exc, 160)
    return row


def run(panel: str, solutions: list[Path], log=print, peers: bool = True) -> dict:
    info = kh.select_device()
    if info.device.type != "cuda":
        raise RuntimeError("the benchmark needs a CUDA GPU (" + info.message + ")")
    log(info.message)
    copy_gbps = kh.copy_bandwidth_gbps(info.device)
    floors = host_floors(info.device)
    log(f"copy bandwidth {copy_gbps:.0f} GB/s; host floors: JIT launch {floors['jit_launch_us']:.2f} us, "
        f"compiled launch {floors['compiled_launch_us']:.2f} us")
    try:
        board = power.meter(info.device)
        board_info = {"limit_w": board.limit_w, "max_sm_mhz": board.max_sm_mhz}
        log(f"power limit {board.limit_w:.0f} W, SM clock up to {board.max_sm_mhz} MHz")
    except power.PowerUnavailable as exc:
        board_info = {"note": f"not measured: {exc}"}
        log(f"power: not measured ({exc})")
    impls = [(p.name, "ours", load_solution(p).build, True) for p in solutions]
    if peers:
        impls += [(name, note, build, False) for name, (build, note) in PEERS.items()]
        if gemlite_builder() is None:
            log("gemlite: not installed (or not wired for this version); skipped")
    else:
        log("peers: not run (--no-peers)")
    flush = torch.zeros(FLUSH_BYTES, dtype=torch.uint8, device=info.device)
    cases = []
    for case in kh.load_panel(panel):
        weights = kh.generate(case, "normal", info.device)
        inputs = kh.make_inputs(case, 16, seed=5, device=info.device)
        roofline_us = case.bytes_moved() / copy_gbps / 1e3
        gpu_floor = FIXED_KERNEL_US + roofline_us
        target = 1.5 * max(gpu_floor, floors["compiled_launch_us"])  # the larger floor binds
        rows = [bench_impl(name, note, build, case, weights, inputs, copy_gbps, flush, full)
                for name, note, build, full in impls]
        for row in rows:
            row.floor_ratio = floor_ratio(row.eager_us, gpu_floor, floors["compiled_launch_us"])
        cases.append({"case": kh.case_dict(case), "roofline_us": roofline_us, "gpu_floor_us": gpu_floor,
                      "target_us": target, "rows": [asdict(r) for r in rows]})
        log(format_case(cases[-1]))
    return {"device": info.name, "copy_gbps": copy_gbps, "host_floors": floors, "power": board_info,
            "panel": str(panel), "cases": cases}


def format_case(entry: dict) -> str:
    def num(v, fmt=".2f"):
        return "-" if v is None else format(v, fmt)

    c = entry["case"]
    lines = [f"{c['name']} ({c['stratum']}): roofline {entry['roofline_us']:.2f} us, "
             f"GPU floor {entry['gpu_floor_us']:.2f} us, target (1.5x the larger floor) {entry['target_us']:.2f} us"]
    lines.append(f"  {'implementation':<28} {'eager_us':>9} {'graph_hot':>9} {'flushed':>9} {'host_us':>8} "
                 f"{'%copy':>6} {'x_floor':>7} {'watts':>6} {'sm_mhz':>6} {'mJ':>6} {'correct':>7}  note")
    for r in entry["rows"]:
        p = r.get("power") or {}
        capped = power.describe(p)
        lines.append(f"  {r['impl']:<28} {num(r['eager_us']):>9} {num(r['graph_hot_us']):>9} "
                     f"{num(r['graph_flushed_us']):>9} {num(r.get('host_us')):>8} "
                     f"{num(r['flushed_copy_fraction'] and 100 * r['flushed_copy_fraction'], '.1f'):>6} "
                     f"{num(r.get('floor_ratio')):>7} {num(p.get('power_w'), '.0f'):>6} "
                     f"{num(p.get('sm_mhz'), '.0f'):>6} {num(p.get('energy_mj')):>6} "
                     f"{'-' if r['correct'] is None else ('yes' if r['correct'] else 'NO'):>7}  {r['note']}"
                     + (f"; {capped.split(':')[0]}" if capped else "")
                     + (f"; error {r['error']}" if r['error'] else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m evals.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--panel", help="visible, smoke or a panel JSON file (default: visible with CUDA, else "
                                        "smoke); bench needs CUDA")
    parser.add_argument("--solutions", nargs="+", default=["methods/versions/v0", "methods/main"],
                        help="our solutions to time")
    parser.add_argument("--no-peers", action="store_true",
                        help="time our solutions only (the peers take minutes: a dequantizing peer is ~1 ms a call)")
    parser.add_argument("--json", help="write the full report here")
    args = parser.parse_args(argv)
    try:
        report = run(args.panel or kh.default_panel(), [resolve_solution_dir(s) for s in args.solutions],
                     log=lambda line: print(line, flush=True), peers=not args.no_peers)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if all(r["correct"] for c in report["cases"] for r in c["rows"] if r["note"] == "ours") else 1


if __name__ == "__main__":
    sys.exit(main())
