"""Where a W4A16 call's host time goes, piece by piece, for several solutions on the same host (needs CUDA).

Each piece is timed as ``evals.stability.probe`` times a whole call: a spin kernel keeps the GPU busy while the host
issues the calls, so no piece waits on the GPU. The pieces of the lean host path (launch.address_call) are:
    fits     the guard's attribute reads (dtype, shape, contiguity, device, alignment of x and residual)
             (``fits``, or ``fit_pointers``, which also returns the two addresses)
    alloc    torch.empty_like(residual): the fresh output (beside it torch.empty and residual.new_empty)
    stream   the current stream's handle (triton's driver)
    entry    the launch with the call's arguments prepared once, the stream read per launch as a call reads it
             (argument parsing and cuLaunchKernelEx, behind the solution's own launch closure where it has one)
    encode   x's tensor descriptor encoded (the warp-specialized plans' calls only)
    call     the whole call, as the verifier's host probe sees it
beside two floors: ``entry`` of a one-store kernel with a single pointer (the driver's launch and the entry's fixed
cost), ``floor``: the least a call can cost under the contract and the source policy (a fresh output, then that
entry: no guard, only the two Python frames that reach it), and bench's compiled-launch floor (torch.empty + a
launch through CompiledKernel[grid]).

Usage: python3 reports/examples/h200-host-path/host_breakdown.py [--solutions methods/main methods/versions/v99]
           [--cases 18x8192x1024 ...] [--json OUT]
"""
import argparse
import inspect
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from evals import bench, stability  # noqa: E402
from evals.loader import load_solution  # noqa: E402
from evals.task import load  # noqa: E402

TASK = load("w4a16")
W4 = TASK.adapter


def closure(fn) -> dict:
    return inspect.getclosurevars(fn).nonlocals


def pieces(module, case, device, small_run) -> dict:
    """The callables of one built case's host path, each taking (x, residual)."""
    from triton.runtime import driver

    launch = sys.modules[module.__name__.rpartition(".")[0] + ".launch"]
    t = W4.tensors(case, "normal", device)
    fn = module.build(t.qweight, t.scales, t.bias, case.epilogue)
    fn(t.x, t.residual)  # compiles and makes the call of this M
    call = closure(fn)["calls"][(case.m, case.k)]
    held = closure(call)
    guard = getattr(launch, "fit_pointers", None) or launch.fits  # the guard's name since v103, and before it
    result = {"call": fn, "fits": lambda x, r: guard(x, r, (case.m, case.k), (case.m, case.n), device.index),
              "alloc": lambda x, r: torch.empty_like(r),
              "alloc_empty": lambda x, r: torch.empty((case.m, case.n), dtype=torch.float16, device=device),
              "alloc_new_empty": lambda x, r: r.new_empty((case.m, case.n)),
              "stream": lambda x, r: driver.active.get_current_stream(device.index),
              "floor": lambda x, r: small_run(torch.empty_like(r).data_ptr())}
    if "w_ptr" in held or "w_arg" in held:  # the split-K or stream-K kernel on bare addresses
        out = torch.empty_like(t.residual)
        o_ptr = out.data_ptr()
        words = held.get("w_ptr", held.get("w_arg"))
        kept = held["kept"]
        a_ptr, c_ptr = (held["a_ptr"], held["c_ptr"]) if kept else (o_ptr, o_ptr)
        args = (t.x.data_ptr(), words, held["s_ptr"], held["b_ptr"], t.residual.data_ptr(), o_ptr, a_ptr, c_ptr,
                *held["tail"])
        if "run" in held:  # a launch(*args) closure over the C entry
            run = held["run"]
            result["entry"] = lambda x, r: run(*args)
        else:  # the C entry itself, called as entry(g0, g1, g2, stream(), *rest, *args)
            entry, grid, rest = held["entry"], (held["g0"], held["g1"], held["g2"]), held["rest"]
            index = device.index
            stream = held.get("stream") or (lambda: driver.active.get_current_stream(index))
            result["entry"] = lambda x, r: entry(*grid, stream(), *rest, *args)
        result["_keep"] = (out, t)
    if "encode" in held and "x_meta" in held:  # the warp-specialized call on pre-encoded descriptors
        based = launch.Based(t.x, held["x_dims"], held["x_strides"], held["padding"])
        encode, meta = held["encode"], held["x_meta"]
        result["encode"] = lambda x, r: encode(based, meta)
    return result, [(t.x, t.residual)]


def one_store_entry(device) -> dict:
    """The launcher's entry for a one-store kernel with one pointer argument, reached as main's calls reach theirs
    (its ``launch.compiled_launcher``): the entry's and the driver's fixed cost."""
    import triton
    import triton.language as tl

    @triton.jit
    def one_store(out_ptr):
        tl.store(out_ptr, 0.0)

    probe = torch.empty(1, dtype=torch.float16, device=device)
    compiled = one_store.warmup(probe, grid=(1,))
    main = load_solution(ROOT / "methods" / "main")
    launch = sys.modules[main.__name__.rpartition(".")[0] + ".launch"]
    entry, rest, stream = launch.compiled_launcher(compiled, (1, 1, 1), device.index)

    def bare(ptr):
        entry(1, 1, 1, stream(), *rest, ptr)
    ptr = probe.data_ptr()
    return {"entry": lambda x, r: bare(ptr), "_run": bare, "_keep": probe}


def measure(callables: dict, inputs, device) -> dict:
    return {name: stability.probe(piece, inputs, device)["host_us"] for name, piece in callables.items()
            if not name.startswith("_")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solutions", nargs="+", default=["methods/main", "methods/versions/v99"])
    parser.add_argument("--cases", nargs="+", default=None, help="MxKxN (default: the visible panel)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_breakdown: no CUDA GPU; run it on the H200", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    cases = [c for c in TASK.cases("visible") if not args.cases or f"{c.m}x{c.k}x{c.n}" in args.cases]
    floors = bench.host_floors(device, (32, 8192), torch.float16)
    small = one_store_entry(device)
    inputs = [(torch.empty(1, device=device), torch.empty(1, device=device))]
    floors["one_store_entry_us"] = measure(small, inputs, device)["entry"]
    print(f"floors: {json.dumps({k: round(v, 2) for k, v in floors.items()})}")
    rows = []
    for solution in args.solutions:
        module = load_solution(ROOT / solution)
        for case in cases:
            row = {"solution": solution, "case": f"{case.m}x{case.k}x{case.n}",
                   "plan": {k: v for k, v in module.plan(case.m, case.k, case.n).items()
                            if k in ("GRID", "SPLIT_K", "PROGRAMS", "WS", "PREDICTED_US")}}
            try:
                callables, inputs = pieces(module, case, device, small["_run"])
                row.update({f"{k}_us": v for k, v in measure(callables, inputs, device).items()})
            except Exception as error:  # noqa: BLE001 - one solution's failure must not cost the others' rows
                row["error"] = f"{type(error).__name__}: {error}"
            rows.append(row)
            print(json.dumps(row))
            torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps({"floors": floors, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
