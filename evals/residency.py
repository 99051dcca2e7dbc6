"""The residency guard: what a solution keeps alive, checked at SPEC.md's three checkpoints.

    .venv/bin/python -m evals.residency --solution DIR [--panel visible|smoke|FILE] [--calls N] [--json OUT]

For a case (M, K, N), measured after synchronize, ``gc.collect()`` and ``torch.cuda.empty_cache()`` as growth over
the guard's own tensors, after build, after the first call and after the whole call schedule:
- total       everything the solution added <= K*N/2 + (K/128)*N*2 + max(8 MiB, 4*M*K + 8*M*N)
- floating    fp16/bf16/fp32/fp64 storage, except one fp16 tensor of exact shape (K/128, N) or (N, K/128),
              <= 2*M*K + 4*M*N + 1 MiB; the two limits are separate, so unused int4 bytes cannot pay for floats
- unpacked    no int8/uint8 tensor of K*N bytes or more (nor any integer tensor: a label must not hide the codes),
              no fp16/bf16 tensor of 2*K*N bytes or more
- workspace   everything but one int4 repack (the largest integer storage of at most K*N/2 bytes) and the scale
              copy <= the floating limit, whatever its dtype (stricter than the letter of SPEC.md, so that a buffer
              cannot escape the floating limit by its label: outputs cached as int16, floats viewed as int32)

Storage is found two ways: every tensor and storage object reachable by the garbage collector (grouped by dtype),
and on CUDA the allocator's own count. Allocator bytes that no object explains (a raw allocation, a tensor held
only inside C++) cannot be shown not to be floating point, so they count as floating ("unattributed").
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from evals import kernel_harness as kh
from evals.loader import load_solution, resolve_solution_dir, unload_solution
from evals.selfcheck import CANDIDATE_ERRORS, error_record

MIB = 1 << 20
FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FLOATING_NAMES = frozenset(str(d).removeprefix("torch.") for d in FLOATING)
INTEGER_NAMES = frozenset(("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "bool"))
HALF_FLOAT_NAMES = frozenset(("float16", "bfloat16"))
ALLOCATOR_BLOCK = 512  # the CUDA caching allocator rounds every block up to this
CALLS_CUDA = 16384 + 8192 + 11 * 512  # the verifier's calls per role
CALLS_INTERPRETED = 24


@dataclass(frozen=True)
class Allowance:
    total: int
    floating: int
    byte_codes: int  # an int8/uint8 tensor this large is a full unpacked code tensor
    half_floats: int  # an fp16/bf16 tensor this large is a full dequantized weight

    @classmethod
    def for_case(cls, m: int, k: int, n: int) -> "Allowance":
        groups = k // kh.GROUP_SIZE
        return cls(k * n // 2 + groups * n * 2 + max(8 * MIB, 4 * m * k + 8 * m * n), 2 * m * k + 4 * m * n + MIB,
                   k * n, 2 * k * n)


@dataclass
class Storage:
    nbytes: int
    dtype: str  # "untyped" when only a bare storage object holds it
    shape: tuple


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def live_storages(device: torch.device) -> dict[int, Storage]:
    """Every storage on ``device`` that a Python object reaches, keyed by address. A storage seen through a tensor
    takes that tensor's dtype; a floating view wins, so an integer view cannot hide a float buffer."""
    found: dict[int, Storage] = {}
    for obj in gc.get_objects():
        kind = type(obj)
        try:
            if issubclass(kind, torch.Tensor):
                storage, dtype, shape = obj.untyped_storage(), _dtype_name(obj.dtype), tuple(obj.shape)
            elif issubclass(kind, torch.TypedStorage):
                storage, dtype, shape = obj.untyped(), _dtype_name(obj.dtype), (obj.size(),)
            elif issubclass(kind, torch.UntypedStorage):
                storage, dtype, shape = obj, "untyped", (obj.nbytes(),)
            else:
                continue
        except (RuntimeError, NotImplementedError):  # sparse, meta or other storage-less tensors
            continue
        if storage.device.type != device.type or storage.nbytes() == 0:
            continue
        key = storage.data_ptr()
        seen = found.get(key)
        if seen is None or seen.dtype == "untyped" or (dtype in FLOATING_NAMES and seen.dtype not in FLOATING_NAMES):
            found[key] = Storage(storage.nbytes(), dtype, shape)
    return found


def settle(device: torch.device) -> None:
    kh.synchronize(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def allocated(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


@dataclass
class Checkpoint:
    name: str
    total_bytes: int
    floating_bytes: int
    workspace_bytes: int  # everything but the scale copy and the one int4 repack (the largest integer storage <= K*N/2)
    by_dtype: dict[str, int]
    unattributed_bytes: int
    scale_copy_exempt: list | None
    largest: list[dict]
    violations: list[dict] = field(default_factory=list)


def measure(name: str, before: dict[int, Storage], before_allocated: int | None, device: torch.device,
            case: kh.Case) -> Checkpoint:
    settle(device)
    now = live_storages(device)
    new = [s for key, s in now.items() if key not in before]
    by_dtype: dict[str, int] = {}
    for s in new:
        by_dtype[s.dtype] = by_dtype.get(s.dtype, 0) + s.nbytes
    enumerated = sum(s.nbytes for s in new)
    unattributed = 0
    current = allocated(device)
    if current is not None:
        rounded = sum(-(-s.nbytes // ALLOCATOR_BLOCK) * ALLOCATOR_BLOCK for s in new)
        unattributed = max(0, current - before_allocated - rounded)
    groups = case.k // kh.GROUP_SIZE
    scale_shapes = {(groups, case.n), (case.n, groups)}
    exempt = next((s for s in new if s.dtype == "float16" and s.shape in scale_shapes
                   and s.nbytes == groups * case.n * 2), None)
    floating = sum(s.nbytes for s in new if s.dtype in FLOATING_NAMES | {"untyped"} and s is not exempt) + unattributed
    repack = max((s for s in new if s.dtype in INTEGER_NAMES and s.nbytes <= case.k * case.n // 2),
                 key=lambda s: s.nbytes, default=None)
    workspace = sum(s.nbytes for s in new if s is not exempt and s is not repack) + unattributed
    largest = sorted(new, key=lambda s: -s.nbytes)[:5]
    point = Checkpoint(name, enumerated + unattributed, floating, workspace, by_dtype, unattributed,
                       None if exempt is None else list(exempt.shape), [asdict(s) for s in largest])
    point.violations = audit(point, new, Allowance.for_case(case.m, case.k, case.n))
    return point


def audit(point: Checkpoint, new: list[Storage], allowance: Allowance) -> list[dict]:
    """The rules broken at one checkpoint, each with the bytes over its limit."""
    broken = []

    def rule(name: str, used: int, limit: int, what: str) -> None:
        if used > limit:
            broken.append({"rule": name, "checkpoint": point.name, "bytes": used, "limit": limit, "over": used - limit,
                           "message": f"{what}: {used:,} bytes > {limit:,} allowed ({used - limit:,} over) "
                                      f"after {point.name}"})

    rule("total", point.total_bytes, allowance.total, "retained device memory")
    rule("floating", point.floating_bytes, allowance.floating,
         "retained floating-point storage (besides one (K/128, N) fp16 scale copy"
         + (f"; {point.unattributed_bytes:,} bytes unattributed" if point.unattributed_bytes else "") + ")")
    # Stricter than the letter of the floating rule, so that a label cannot hide a buffer: outputs cached as int16
    # or float scratch viewed as int32 count here whatever their dtype.
    rule("workspace", point.workspace_bytes, allowance.floating,
         "retained storage besides the one int4 repack and the scale copy, whatever its dtype")
    for s in new:
        if s.dtype in INTEGER_NAMES:  # the int4 repack is K*N/2 bytes; K*N is a code a byte, however it is labelled
            rule("unpacked-int8", s.nbytes, allowance.byte_codes - 1,
                 f"a full unpacked code tensor ({s.dtype} {s.shape})")
        if s.dtype in HALF_FLOAT_NAMES:
            rule("unpacked-dense", s.nbytes, allowance.half_floats - 1,
                 f"a full dequantized weight ({s.dtype} {s.shape})")
    return broken


@dataclass
class CaseResidency:
    case: dict
    ok: bool = False
    checkpoints: list[Checkpoint] = field(default_factory=list)
    error: dict | None = None
    calls: int = 0


def guard_case(solution: Path, case: kh.Case, device: torch.device, calls: int) -> CaseResidency:
    result = CaseResidency(case=kh.case_dict(case), calls=calls)
    tensors = kh.generate(case, "normal", device)
    inputs = kh.make_inputs(case, 64 if device.type == "cuda" else 2, seed=2, device=device)
    settle(device)
    before, before_allocated = live_storages(device), allocated(device)
    stage, module = "load", None
    try:
        module = load_solution(solution)
        stage = "build"
        fn = module.build(tensors.qweight, tensors.scales, tensors.bias, case.epilogue)
        result.checkpoints.append(measure("build", before, before_allocated, device, case))
        stage = "first call"
        out = fn(*inputs[0])
        del out
        result.checkpoints.append(measure("first call", before, before_allocated, device, case))
        stage = "call schedule"
        for i in range(1, calls):
            fn(*inputs[i % len(inputs)])
        result.checkpoints.append(measure(f"{calls} calls", before, before_allocated, device, case))
        result.ok = not any(point.violations for point in result.checkpoints)
    except CANDIDATE_ERRORS as exc:
        result.error = error_record(stage, exc)
    finally:
        if module is not None:
            unload_solution(module)
    return result


def warm_libraries(device: torch.device) -> None:
    """cuBLAS takes its workspace at the first fp16 and fp32 matmul: take it before any baseline is measured."""
    for dtype in (torch.float16, torch.float32):
        a = torch.ones((64, 64), dtype=dtype, device=device)
        (a @ a).sum().item()


def run(solution: Path, panel: str, calls: int | None = None, log=print) -> dict:
    info = kh.select_device()
    log(info.message)
    if info.device.type != "cuda":
        log("residency on CPU: storage is counted from the tensors and storages Python can reach "
            "(no allocator count to cross-check, so memory held only inside C++ is not seen)")
    calls = calls or (CALLS_INTERPRETED if info.interpreted else CALLS_CUDA)
    warm_libraries(info.device)
    cases = []
    for case in kh.load_panel(panel):
        result = guard_case(solution, case, info.device, calls)
        cases.append(result)
        log(format_case(result))
    return {"solution": str(solution), "panel": str(panel), "device": info.name, "calls": calls,
            "ok": all(c.ok for c in cases), "cases": [asdict(c) for c in cases]}


def format_case(result: CaseResidency) -> str:
    head = f"{result.case['name']:<26} {'ok' if result.ok else 'FAIL'}"
    lines = [head]
    for point in result.checkpoints:
        dtypes = (", ".join(f"{name} {nbytes / MIB:.2f}" for name, nbytes in sorted(point.by_dtype.items()))
                  or "nothing new")
        lines.append(f"    after {point.name:<14} total {point.total_bytes / MIB:9.2f} MiB, "
                     f"floating {point.floating_bytes / MIB:8.2f} MiB [{dtypes}{' MiB' if point.by_dtype else ''}]"
                     + (f", unattributed {point.unattributed_bytes / MIB:.2f} MiB" if point.unattributed_bytes
                        else ""))
        lines += [f"      violated {v['rule']}: {v['message']}" for v in point.violations]
    if result.error:
        lines.append(f"    error in {result.error['stage']}: {result.error['name']}: {result.error['message']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m evals.residency", description=__doc__.split("\n")[0])
    parser.add_argument("--solution", required=True, help="solution directory, e.g. methods/main")
    parser.add_argument("--panel", help="visible, smoke or a panel JSON file (default: visible with CUDA, else smoke)")
    parser.add_argument("--calls", type=int, help=f"calls before the last checkpoint (default {CALLS_CUDA} on CUDA, "
                                                  f"{CALLS_INTERPRETED} under the interpreter)")
    parser.add_argument("--json", help="write the full report here")
    args = parser.parse_args(argv)
    if args.calls is not None and args.calls < 1:
        parser.error("--calls must be at least 1")
    try:
        solution = resolve_solution_dir(args.solution)
        report = run(solution, args.panel or kh.default_panel(), args.calls, log=lambda line: print(line, flush=True))
    except (FileNotFoundError, ValueError, kh.SetupError) as exc:
        print(f"residency: {exc}", file=sys.stderr)
        return 2
    print("residency guard: " + ("every case within the contract" if report["ok"] else "FAILED"))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
