"""End to end: decode tokens/s of a Llama-3-8B-shaped model whose linear layers each backend serves.

    python -m evals.e2e [--task w4a16|llgemm] [--backends bf16,tinygemm,w4a16,llgemm] [--w4a16 DIR ...]
                        [--llgemm DIR] [--config llama3-8b|tiny] [--layers N] [--batches 1,8,16,24,32]
                        [--prompt 16] [--steps 200] [--glue compiled|eager] [--w4a16-config JSON]
                        [--profile BATCH] [--json FILE] [--out DIR]

The model (evals/e2e_model.py) has random weights, quantized once into the W4A16 encoding; every backend serves the
same weight values. Its projections (qkv, o, gate_up, down; lm_head is dense F.linear in every backend) are served by:

    bf16       torch.nn.functional.linear on the dense bf16 weights
    tinygemm   torch._weight_int4pack_mm, int4 group 128, bf16 (gpt-fast's int4 path; the bench's peer)
    w4a16      each W4A16 solution folder (default: the task's v0 and main) through build(..., "identity"), fp16;
               a folder whose ACTIVATIONS lacks "identity" takes only the contract's epilogues, which cannot serve a
               plain linear layer: its row says it is not servable. ``--w4a16-config JSON`` serves each folder a
               second time, built with those tuning overrides (build's ``config``), under its name and the overrides
    llgemm     the LL-GEMM task's main (default) on the bf16 weights (its M > 16 is F.linear)

``--task w4a16`` serves bf16, tinygemm and the W4A16 folders; ``--task llgemm`` bf16, tinygemm and LL-GEMM; neither
(or ``--backends``) as asked. Per backend and batch size:

- correctness: the prompt (``--prompt`` fixed random tokens a sequence) is fed one token a step through the very
  decode step that is timed (the CUDA graph on a GPU), and the logits of its last positions (DEFAULTS' ``checked``)
  are compared with a dense model of the same weights in the backend's dtype (F.linear, eager, at the largest batch:
  rows never interact). The bound is BOUND_FACTOR times that reference's own distance from the same model in fp32: a
  backend that computes the same function with fp32 accumulation differs from the reference only where the two
  round, by about as much as the reference differs from exact; a wrong layer (codes, scales, residual, layout) is off
  by about the logits' own size. Greedy tokens are counted too: within the bound they agree wherever the
  reference's top-2 margin exceeds twice it.
- on CUDA only, the timing. Prefill is those same prompt steps, one token a step (decode steps, not a batched
  prefill); then WARMUP replays, then ``--steps`` replays of the step's CUDA graph back to back between two CUDA
  events, each feeding the greedy token of the one before (gpt-fast: 200 new tokens). tokens/s = batch * steps /
  elapsed; TPOT = elapsed / steps. The linear layers' share: a CUDA graph of the served projections alone, one
  step's worth on static inputs of the step's shapes, replayed LINEAR_REPLAYS times and timed the same way, over
  TPOT (lm_head, dense in every backend, is outside it). Weight bytes: the projections as the backend stores them,
  plus lm_head; the implied bandwidth is those bytes once per step / TPOT (KV-cache reads excluded). The weights'
  bandwidth limit: those bytes read once at the device's measured read-only bandwidth (``read_gbps``: a sum over
  READ_PASS_BYTES, kernel_harness.read_bandwidth_gbps), ``floor_ms``; ``x_floor`` = TPOT / floor_ms, the gap to it.
  ``kv_gb``: the KV cache one step reads (every layer's whole static cache: the attention masks, never slices).
  ``resident_gb``: device memory the backend's model took when built.
- the glue (``--glue``): what lies between the projections (RMSNorm, RoPE, attention, SwiGLU) runs either as
  torch.compile'd functions (``compiled``, the default on CUDA: a few fused kernels a layer, as gpt-fast's compiled
  step) or eagerly (``eager``, a kernel per torch op; the default without CUDA). Every backend runs the same glue;
  the references are always eager.
- ``--profile BATCH`` (CUDA): where that batch's step goes, per backend: each projection's graph alone (every layer's
  calls) against its weights' bandwidth limit, and the step's kernels by time (torch.profiler over PROFILE_STEPS
  graph replays); written into the rows and ``profile.txt``.

Without CUDA the same code runs the tiny config eagerly, kernels under the Triton interpreter, correctness only.
Exit status: 0 when every servable backend is correct at every batch, 1 otherwise, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from evals import graph_timing
from evals import kernel_harness as kh
from evals import task as tasks
from evals.e2e_model import (CONFIGS, GLUES, Config, Dense, Model, State, Stepper, Unservable, Weights, build_model,
                             linear_calls, linear_maker, make_glue, new_state, projection_bytes, random_weights,
                             stored_bytes, teacher_forced)
from evals.e2e_report import HEADER, add_ratios, format_row, profile_lines, summary, write
from evals.loader import load_solution, resolve_solution_dir, unload_solution
from evals.selfcheck import error_line
from evals.verifier import provenance

KINDS = ("bf16", "tinygemm", "w4a16", "llgemm")
BY_TASK = {"w4a16": ("bf16", "tinygemm", "w4a16"), "llgemm": ("bf16", "tinygemm", "llgemm")}
DEFAULTS = {  # per config: batches, prompt tokens, checked positions
    "llama3-8b": {"batches": (1, 8, 16, 24, 32), "prompt": 16, "checked": 4},
    "tiny": {"batches": (1, 2), "prompt": 4, "checked": 2},
}
# A correct backend's error over the reference's own (its distance from the fp32 model) was at most 2.05 on small
# configs on CPU (LL-GEMM under the interpreter, which truncates to bf16; the W4A16 draft 1.46); a dropped residual,
# reversed nibbles or shifted scale rows exceed 4x it more than five times over (tests/evals/test_e2e.py).
BOUND_FACTOR = 4.0
WARMUP = 10
LINEAR_REPLAYS = 50
READ_PASS_BYTES = 4 << 30  # the read-only pass that sets the weights' bandwidth limit: larger than any L2 by far
PROFILE_STEPS = 5
PROFILE_KERNELS = 15  # the kernels a profile lists, by time


@dataclass
class Backend:
    kind: str
    name: str
    dtype: torch.dtype
    folder: Path | None = None
    config: dict | None = None  # a W4A16 build's tuning overrides


@dataclass
class Row:
    backend: str
    batch: int | None
    dtype: str
    note: str = ""
    error: str | None = None
    correct: bool | None = None
    max_abs_err: float | None = None  # max |logit - reference logit| over the checked positions and rows
    bound: float | None = None
    reference_err: float | None = None  # the reference's own max distance from the fp32 model
    tokens_agree: int | None = None
    tokens_checked: int | None = None
    tokens_per_s: float | None = None
    tpot_ms: float | None = None
    linear_ms: float | None = None
    linear_share: float | None = None
    weight_gb: float | None = None
    resident_gb: float | None = None
    gbps: float | None = None
    kv_gb: float | None = None
    floor_ms: float | None = None  # weight bytes at the measured read-only bandwidth
    x_floor: float | None = None  # TPOT / floor_ms
    vs_bf16: float | None = None
    vs_tinygemm: float | None = None
    profile: dict | None = None  # --profile's batch only: "projections" and "kernels"


@dataclass
class Options:
    config: Config
    config_name: str
    backends: list[Backend]
    batches: list[int]
    prompt: int
    checked: int
    steps: int
    glue: str = "eager"
    profile: int | None = None  # the batch whose step is profiled
    json: Path | None = None
    out: Path | None = None
    seed: int = 0


# ------------------------------------------------------------------------------------------------ the backends
def load_linear(backend: Backend, modules: list) -> Callable:
    """``make_linear`` of the backend; a solution module it loads goes into ``modules`` (unloaded after)."""
    module = load_solution(backend.folder) if backend.folder else None
    if module is not None:
        modules.append(module)
    return linear_maker(backend.kind, module, backend.config)


def select_backends(kinds: list[str] | None, task: str | None, w4a16: list[str] | None,
                    llgemm: str | None, w4a16_config: dict | None = None) -> list[Backend]:
    """The backends to run, in KINDS order (each W4A16 folder as built, then with ``w4a16_config`` where given);
    ValueError / FileNotFoundError for bad input (exit 2)."""
    if task is not None and task not in BY_TASK:
        raise ValueError(f"--task must be one of {', '.join(BY_TASK)} (or left out for every backend); got {task!r}")
    chosen = kinds or list(BY_TASK.get(task, KINDS))
    unknown = [k for k in chosen if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown backend {', '.join(map(repr, unknown))}: give --backends from {', '.join(KINDS)}")
    w4_task, ll_task = tasks.load("w4a16"), tasks.load("llgemm")
    w4_folders = [resolve_solution_dir(p) for p in w4a16] if w4a16 else [w4_task.baseline_dir, w4_task.main_dir]
    ll_folder = resolve_solution_dir(llgemm) if llgemm else ll_task.main_dir
    backends = []
    for kind in KINDS:
        if kind not in chosen:
            continue
        if kind == "w4a16":
            for f in w4_folders:
                backends.append(Backend(kind, "w4a16 " + label(f, w4_task), torch.float16, f))
                if w4a16_config is not None:
                    tuned = ",".join(f"{key}={value}" for key, value in w4a16_config.items())
                    backends.append(Backend(kind, f"w4a16 {label(f, w4_task)} {tuned}", torch.float16, f,
                                            w4a16_config))
        elif kind == "llgemm":
            backends.append(Backend(kind, "llgemm " + label(ll_folder, ll_task), torch.bfloat16, ll_folder))
        else:
            backends.append(Backend(kind, kind, torch.bfloat16))
    return backends


def label(folder: Path, task: tasks.Task) -> str:
    """"main", "v0" (the task's baseline version) or the folder's path from the repository root."""
    folder = folder.resolve()
    if folder == task.main_dir.resolve():
        return "main"
    if task.baseline_dir is not None and folder == task.baseline_dir.resolve():
        return task.baseline_version
    return str(folder.relative_to(tasks.ROOT)) if folder.is_relative_to(tasks.ROOT) else str(folder)


# ------------------------------------------------------------------------------------------------ steps
def reference_logits(weights: Weights, dtype: torch.dtype, tokens: torch.Tensor, checked: int) -> torch.Tensor:
    """The dense model (F.linear on the store's exact weights) in ``dtype``, eager, on every row of ``tokens``."""
    model = build_model(weights, lambda p: Dense(p.dense(dtype)), dtype)
    state = new_state(model, tokens.shape[0], tokens.shape[1])
    logits = teacher_forced(Stepper(model, state, graphs=False), state, tokens, checked)
    del model, state
    release()
    return logits


def compare(got: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor) -> dict:
    """``got`` against the reference in its dtype, bounded by BOUND_FACTOR times that reference's distance from
    ``exact`` (the fp32 model); greedy tokens where the reference's top-2 margin exceeds twice the bound."""
    reference_err = float((ref - exact).abs().max())
    bound = BOUND_FACTOR * reference_err
    finite = bool(torch.isfinite(got).all())
    err = float((got - ref).abs().max()) if finite else float("inf")
    top = ref.topk(2, dim=-1).values
    decided = (top[..., 0] - top[..., 1]) > 2 * bound
    agree = got.argmax(dim=-1) == ref.argmax(dim=-1)
    note = "" if finite else "logits not finite"
    if bool((decided & ~agree).any()):
        note = f"{int((decided & ~agree).sum())} greedy tokens differ where the reference's margin decides them"
    return {"correct": finite and err <= bound, "max_abs_err": err, "bound": bound, "reference_err": reference_err,
            "tokens_agree": int(agree.sum()), "tokens_checked": agree.numel(), "note": note}


def release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def allocated() -> int:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def elapsed_ms(run: Callable[[], None], replays: int) -> float:
    """Milliseconds per replay of ``replays`` back-to-back calls of ``run``, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def graph_ms(calls: Callable[[], None], name: str) -> float:
    """Milliseconds per replay of a CUDA graph of ``calls`` (after three untimed replays), LINEAR_REPLAYS replays."""
    graph = graph_timing.Graph(calls, [()], name)
    for _ in range(3):
        graph.run()
    return elapsed_ms(graph.run, LINEAR_REPLAYS)


def timed(row: Row, model: Model, stepper: Stepper, batch: int, steps: int, read_gbps: float) -> None:
    """The timing columns of ``row`` (CUDA only): tokens/s and TPOT over ``steps`` replays, the gap to the weights'
    bandwidth limit, the linear layers' share."""
    for _ in range(WARMUP):
        stepper.run()
    row.tpot_ms = elapsed_ms(stepper.run, steps)
    row.tokens_per_s = batch * 1e3 / row.tpot_ms
    row.gbps = row.weight_gb / (row.tpot_ms / 1e3)
    row.floor_ms = row.weight_gb / read_gbps * 1e3
    row.x_floor = row.tpot_ms / row.floor_ms
    row.linear_ms = graph_ms(linear_calls(model, batch), "linear layers")
    row.linear_share = row.linear_ms / row.tpot_ms


def profiled(model: Model, state: State, stepper: Stepper, backend: Backend, batch: int, read_gbps: float) -> dict:
    """Where one step's time goes (CUDA only). ``projections``: per projection, a graph of its calls in every layer
    alone, ms per step and us per call, against its weights' bandwidth limit. ``kernels``: the step's kernels by time,
    from torch.profiler over PROFILE_STEPS replays of the step's graph, or eager steps where it sees no kernel in a
    replay (``source``; the PROFILE_KERNELS longest; ``total_us`` sums them all). The state is reset before each:
    the cache has fewer positions left than PROFILE_STEPS, and a step costs the same at every position (attention reads
    the whole cache, masked)."""
    from torch.profiler import ProfilerActivity, profile

    layers = model.config.layers
    projections = {}
    for name, (k, n) in model.config.shapes().items():
        ms = graph_ms(linear_calls(model, batch, (name,)), name)
        floor_ms = projection_bytes(backend.kind, k, n) * layers / read_gbps / 1e6
        projections[name] = {"k": k, "n": n, "ms": ms, "us_per_call": ms * 1e3 / layers, "floor_ms": floor_ms,
                             "x_floor": ms / floor_ms}
    for source, run in (("graph replays", stepper.run), ("eager steps", stepper.step)):
        state.reset()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(PROFILE_STEPS):
                run()
            torch.cuda.synchronize()
        kernels = sorted(((e.key, e.count / PROFILE_STEPS, e.self_device_time_total / PROFILE_STEPS)
                          for e in prof.key_averages() if e.self_device_time_total > 0), key=lambda t: -t[2])
        if kernels:  # a profiler that sees no kernel inside a graph replay: the same step's kernels, eager
            break
    return {"batch": batch, "projections": projections, "source": source, "total_us": sum(t[2] for t in kernels),
            "kernels": [{"name": name, "calls": calls, "us": us} for name, calls, us in kernels[:PROFILE_KERNELS]]}


# ------------------------------------------------------------------------------------------------ the run
def run_batch(model: Model, backend: Backend, batch: int, tokens: torch.Tensor, refs: dict, options: Options,
              read_gbps: float | None, weight_gb: float, resident_gb: float | None) -> Row:
    row = Row(backend.name, batch, str(backend.dtype).removeprefix("torch."), weight_gb=weight_gb,
              resident_gb=resident_gb)
    try:
        state = new_state(model, batch, options.prompt + graph_timing.WARMUP_CALLS + WARMUP + options.steps)
        row.kv_gb = sum(c.numel() * c.element_size() for pair in state.caches for c in pair) / 1e9
        graphs = read_gbps is not None
        stepper = Stepper(model, state, graphs)
        got = teacher_forced(stepper, state, tokens[:batch], options.checked)
        found = compare(got, refs[backend.dtype][:, :batch], refs[torch.float32][:, :batch])
        for name, value in found.items():
            setattr(row, name, value)
        if graphs:
            timed(row, model, stepper, batch, options.steps, read_gbps)
            if batch == options.profile:
                row.profile = profiled(model, state, stepper, backend, batch, read_gbps)
    except Exception as exc:  # a backend that fails at one batch is a row with its error, not a failed run
        row.error = error_line(exc, 240)
    return row


def run_backend(backend: Backend, weights: Weights, tokens: torch.Tensor, refs: dict, options: Options,
                read_gbps: float | None) -> list[Row]:
    """One row per batch size, or one row saying why the backend cannot serve the model. ``read_gbps`` (None off
    CUDA: nothing timed) sets the weights' bandwidth limit."""
    dtype = str(backend.dtype).removeprefix("torch.")
    modules = []
    try:
        before = allocated()
        model = build_model(weights, load_linear(backend, modules), backend.dtype, make_glue(options.glue))
        resident = (allocated() - before) / 1e9 if read_gbps is not None else None
        weight_gb = stored_bytes(backend.kind, options.config) / 1e9
        rows = []
        for batch in options.batches:
            rows.append(run_batch(model, backend, batch, tokens, refs, options, read_gbps, weight_gb, resident))
            release()
        del model
        return rows
    except Unservable as exc:
        return [Row(backend.name, None, dtype, note=str(exc))]
    except Exception as exc:
        return [Row(backend.name, None, dtype, error=error_line(exc, 240))]
    finally:
        for module in modules:
            unload_solution(module)
        release()


def run(options: Options, log=print) -> dict:
    """Every backend at every batch size; the report (``rows``: one dict per Row)."""
    info = kh.select_device()
    graphs = info.device.type == "cuda"
    log(info.message if graphs else "no CUDA device: the model runs eagerly on CPU tensors, kernels under the Triton "
        "interpreter (TRITON_INTERPRET=1); correctness only (tokens/s needs CUDA graphs on a GPU)")
    config = options.config
    weights = random_weights(config, info.device, options.seed)
    gen = torch.Generator(device=info.device).manual_seed(options.seed + 1)
    tokens = torch.randint(0, config.vocab, (max(options.batches), options.prompt), generator=gen,
                           device=info.device)
    refs = {dtype: reference_logits(weights, dtype, tokens, options.checked)
            for dtype in {torch.float32, *(b.dtype for b in options.backends)}}
    read_gbps = kh.read_bandwidth_gbps(info.device, READ_PASS_BYTES)
    if graphs:
        log(f"read-only pass over {READ_PASS_BYTES / 1e9:.2f} GB: {read_gbps:.0f} GB/s (the weights' bandwidth limit)")
    report = {"device": info.name, "config": options.config_name, "model": asdict(config),
              "batches": options.batches, "prompt": options.prompt, "checked": options.checked,
              "steps": options.steps, "warmup": WARMUP, "bound_factor": BOUND_FACTOR, "timed": graphs,
              "glue": options.glue, "read_gbps": read_gbps, "provenance": provenance(), "rows": []}
    log(HEADER)
    for backend in options.backends:
        rows = [asdict(r) for r in run_backend(backend, weights, tokens, refs, options, read_gbps)]
        report["rows"] += rows
        add_ratios(report["rows"])
        for row in rows:
            log(format_row(row))
        write(report, options.json, options.out)  # after every backend: a run cut short keeps what it measured
    return report


# ------------------------------------------------------------------------------------------------ the command
def batch_list(text: str) -> list[int]:
    try:
        batches = [int(part) for part in text.split(",")]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1 or len(set(batches)) != len(batches):
        raise ValueError(f"--batches takes distinct positive integers separated by commas, such as 1,8,16,24,32; "
                         f"got {text!r}")
    return batches


def options_from(args: argparse.Namespace, cuda: bool) -> Options:
    """The run's options; ValueError or FileNotFoundError (exit 2) for bad input."""
    name = args.config or ("llama3-8b" if cuda else "tiny")
    if not cuda and name != "tiny":
        raise ValueError(f"config {name} needs CUDA (under the Triton interpreter one step of it would take hours); "
                         "without a GPU give --config tiny, which checks correctness only")
    defaults = DEFAULTS[name]
    config = CONFIGS[name]
    if args.layers is not None:
        if args.layers < 1:
            raise ValueError(f"--layers must be at least 1; got {args.layers}")
        config = replace(config, layers=args.layers)
    prompt = args.prompt if args.prompt is not None else defaults["prompt"]
    if prompt < 1 or args.steps < 1:
        raise ValueError(f"--prompt and --steps must be at least 1; got {prompt} and {args.steps}")
    glue = args.glue or ("compiled" if cuda else "eager")
    if glue not in GLUES:
        raise ValueError(f"--glue must be one of {', '.join(GLUES)}; got {glue!r}")
    batches = batch_list(args.batches) if args.batches else list(defaults["batches"])
    if args.profile is not None and (args.profile not in batches or not cuda):
        raise ValueError(f"--profile takes one of the run's batches ({','.join(map(str, batches))}) and needs CUDA "
                         f"(the profile is of the step's CUDA graph); got {args.profile}")
    kinds = [k.strip() for k in args.backends.split(",")] if args.backends else None
    backends = select_backends(kinds, args.task, args.w4a16, args.llgemm, overrides(args.w4a16_config))
    if args.w4a16_config is not None and not any(b.kind == "w4a16" for b in backends):
        raise ValueError("--w4a16-config tunes the W4A16 folders, and this run serves none: add w4a16 to --backends "
                         "(or use --task w4a16)")
    return Options(config, name, backends,
                   batches, prompt, min(defaults["checked"], prompt), args.steps, glue, args.profile,
                   Path(args.json) if args.json else None, Path(args.out) if args.out else None)


def overrides(text: str | None) -> dict | None:
    """--w4a16-config: a JSON object of tuning overrides, such as '{"DEVICE_BOUND_US": 0}'."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--w4a16-config takes a JSON object such as '{{\"DEVICE_BOUND_US\": 0}}'; {exc}") from None
    if not isinstance(value, dict) or not value:
        raise ValueError(f"--w4a16-config takes a non-empty JSON object such as '{{\"DEVICE_BOUND_US\": 0}}'; "
                         f"got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m evals.e2e", description=__doc__.split("\n")[0])
    p.add_argument("--task", help="w4a16: bf16, tinygemm and the W4A16 folders; llgemm: bf16, tinygemm and the "
                                  "LL-GEMM main (default: every backend)")
    p.add_argument("--backends", help=f"comma-separated, from {','.join(KINDS)} (overrides --task)")
    p.add_argument("--w4a16", nargs="+", metavar="DIR",
                   help="W4A16 solution folders (default: the task's v0 and main), e.g. methods/drafts/w4a16")
    p.add_argument("--llgemm", metavar="DIR", help="the LL-GEMM solution folder (default: tasks/llgemm/main)")
    p.add_argument("--config", choices=sorted(CONFIGS), help="default: llama3-8b with CUDA, else tiny")
    p.add_argument("--layers", type=int, help="decoder layers (default: the config's; 2 for a quick run)")
    p.add_argument("--batches", help="comma-separated batch sizes (default: 1,8,16,24,32; tiny: 1,2)")
    p.add_argument("--prompt", type=int, help="prompt tokens a sequence (default: 16; tiny: 4)")
    p.add_argument("--steps", type=int, default=200, help="timed decode steps (default: 200)")
    p.add_argument("--w4a16-config", metavar="JSON",
                   help="serve each W4A16 folder also built with these tuning overrides (its build's config), such "
                        "as '{\"DEVICE_BOUND_US\": 0}'")
    p.add_argument("--profile", type=int, metavar="BATCH",
                   help="CUDA: where this batch's step goes, per backend (projections alone, kernels by time)")
    p.add_argument("--glue", help="the work between the projections: compiled (torch.compile; the default with CUDA) "
                                  "or eager (the default without)")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--out", help="write e2e.json, table.txt, tokens_per_s.png (and profile.txt with --profile) into "
                                 "this folder")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        options = options_from(args, torch.cuda.is_available())
    except (ValueError, FileNotFoundError, tasks.TaskError) as exc:
        print(f"e2e: {exc}", file=sys.stderr)
        return 2
    report = run(options, log=lambda line: print(line, flush=True))
    for line in summary(report) + profile_lines(report):
        print(line)
    servable = [r for r in report["rows"] if r["batch"] is not None or r["error"]]
    return 0 if servable and all(r["correct"] and not r["error"] for r in servable) else 1


if __name__ == "__main__":
    sys.exit(main())
