"""An informational sweep of one llgemm family's CUDA-core GEMV plans against F.linear (it feeds no table: the loop
makes the tables). Per panel point, F.linear and each plan are timed hot (a graph of 8 calls on 8 inputs, median of
21 replays) and flushed (a graph of one call after a 256 MiB read, median of 41), as evals/graph_timing.py times the
pairs, and each plan's output is checked against the oracle once. One JSON line per (point, plan) on stdout.

    python3 reports/examples/llgemm-seed002/sweep_gemv.py > sweep.jsonl     (repository root, on a GPU)
    SET=gemv (default): v35's family, unsplit and split GEMV plans at 12 panel points (sweep_gemv_v35.jsonl, 230 s)
    SET=vec: v60's family, 8 GEMV tiles each with VEC 1/8 and PREFETCH off/on, and 4 more, at the 14 points where
        v41 fell short of the seed or came close (sweep_vec_v60.jsonl, 96 s)
    SET=cg: v71's family, the best tiles of SET=vec and three with more programs an SM, each with WEIGHT_CG off and
        on, at the points still short of the seed and five it qualified (about 45 s, estimated from SET=vec's rate)
    SET=pairs: the tiles of SET=cg (WEIGHT_CG off) under v66's GEMV and v71's (W and x read as int32 pairs of bf16,
        rows unmasked, x's tile in W's shape at one row of x where a step is shallow: what the leaner loop gains), at
        the same points (about 45 s)
    SET=split: split plans (tensor-core and GEMV, 2-16 K shares) under three split epilogues: v62's (a fence.sc.gpu
        in every thread), v65's (CUTLASS's semaphore, an acq_rel counter in every share) and v66's (only the last
        share acquires), at eight points (about 60 s; where plan() leaves one share, no row)
    FAMILY=tasks/llgemm/versions/vN/solution.py overrides the set's family; BUDGET=seconds (default 200; it stops
    between points past it)
"""
import importlib.util
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
from evals import graph_timing as gt  # noqa: E402
from evals import task as tasks  # noqa: E402

A = tasks.load("llgemm").adapter
SET = os.environ.get("SET", "gemv")
# SET=cg's and SET=pairs's: the points still short of the seed and five it qualified; the best tiles of SET=vec and
# three with more programs an SM, as (outputs, warps, BLOCK_K, VEC, PREFETCH)
CG_POINTS = [(8, 320, 10240), (8, 336, 10240), (2, 4096, 2560), (2, 3584, 2560), (4, 2560, 1536), (2, 62080, 2560),
             (1, 4096, 2560), (4, 320, 10240), (16, 320, 2560), (1, 62080, 2560)]
CG_TILES = [(1, 8, 2048, 8, False), (1, 8, 4096, 8, False), (2, 8, 2048, 1, False), (4, 4, 1024, 8, False),
            (8, 4, 1024, 8, False), (4, 4, 512, 1, True), (2, 8, 512, 1, False), (1, 4, 2048, 8, False),
            (1, 4, 1024, 8, False), (2, 4, 1024, 8, False)]
BUDGET = float(os.environ.get("BUDGET", "200"))
if SET == "gemv":
    FAMILY = os.environ.get("FAMILY", "tasks/llgemm/versions/v35/solution.py")
    POINTS = [(1, 640, 2560), (1, 336, 10240), (1, 4096, 2560), (1, 24, 2560), (4, 640, 2560), (1, 2560, 1536),
              (4, 4096, 2560), (16, 3584, 2560), (8, 320, 2560), (1, 320, 2560), (2, 640, 2560), (1, 62080, 2560)]
    PLANS = [dict(MMA=False, BLOCK_N=n, num_warps=w, BLOCK_K=k, SPLIT_K=1)
             for n in (1, 2, 4, 8) for w in (4, 8, 16, 32) for k in (2048, 4096)]
    PLANS += [dict(MMA=False, BLOCK_N=n, num_warps=w, BLOCK_K=2048, SPLIT_K=s)
              for s in (2, 4) for n in (2, 4) for w in (8, 16)]
elif SET == "vec":
    FAMILY = os.environ.get("FAMILY", "tasks/llgemm/versions/v60/solution.py")
    POINTS = [(4, 320, 10240), (1, 4096, 2560), (8, 320, 10240), (4, 2560, 1536), (2, 4096, 2560), (16, 320, 2560),
              (1, 3584, 2560), (2, 62080, 2560), (8, 640, 2560), (4, 336, 10240), (2, 3584, 2560), (4, 640, 2560),
              (1, 62080, 2560), (8, 336, 10240)]
    TILES = [(1, 8, 4096), (1, 16, 2048), (2, 4, 2048), (2, 8, 4096), (4, 4, 1024), (4, 8, 2048), (8, 4, 1024),
             (8, 8, 2048)]
    PLANS = [dict(MMA=False, BLOCK_N=n, num_warps=w, BLOCK_K=k, SPLIT_K=1, VEC=v, PREFETCH=p)
             for (n, w, k) in TILES for (v, p) in ((1, False), (8, False), (8, True), (1, True))]
    PLANS += [dict(MMA=False, BLOCK_N=n, num_warps=w, BLOCK_K=k, SPLIT_K=s, VEC=8, PREFETCH=True)
              for (n, w, k, s) in ((4, 8, 2048, 2), (8, 8, 1024, 4), (2, 8, 2048, 4), (16, 8, 1024, 1))]
elif SET == "cg":
    FAMILY = os.environ.get("FAMILY", "tasks/llgemm/versions/v71/solution.py")
    POINTS = CG_POINTS
    PLANS = [dict(MMA=False, BLOCK_N=n, num_warps=w, BLOCK_K=k, SPLIT_K=1, VEC=v, PREFETCH=p, WEIGHT_CG=cg)
             for (n, w, k, v, p) in CG_TILES for cg in (False, True)]
elif SET == "pairs":
    FAMILY = os.environ.get("FAMILY", "tasks/llgemm/versions/v71/solution.py")
    POINTS = CG_POINTS
    PLANS = [dict(MMA=False, BLOCK_N=n, num_warps=w, BLOCK_K=k, SPLIT_K=1, VEC=v, PREFETCH=p, FAMILY=family)
             for (n, w, k, v, p) in CG_TILES for family in ("tasks/llgemm/versions/v66/solution.py", FAMILY)]
elif SET == "split":  # v66, not v71: the three families differ in their split epilogue alone
    FAMILY = os.environ.get("FAMILY", "tasks/llgemm/versions/v66/solution.py")
    POINTS = [(8, 320, 10240), (8, 336, 10240), (16, 320, 2560), (16, 320, 10240), (4, 2560, 1536),
              (16, 4096, 2560), (1, 2560, 1536), (1, 4096, 2560)]
    SPLITS = [dict(MMA=False, BLOCK_N=8, BLOCK_K=1024, num_warps=4, SPLIT_K=4, VEC=8),
              dict(MMA=False, BLOCK_N=4, BLOCK_K=2048, num_warps=8, SPLIT_K=2, VEC=8, PREFETCH=True),
              dict(MMA=False, BLOCK_N=4, BLOCK_K=1024, num_warps=4, SPLIT_K=4),
              dict(MMA=False, BLOCK_N=4, BLOCK_K=2048, num_warps=8, SPLIT_K=4),
              dict(MMA=False, BLOCK_N=8, BLOCK_K=512, num_warps=8, SPLIT_K=8, VEC=8, WEIGHT_CG=True),
              dict(MMA=True, BLOCK_N=32, BLOCK_K=128, num_warps=4, SPLIT_K=4),
              # the best unsplit tile at M 5-8 over K 10240 (sweep_vec_v60.jsonl), split in 2 and 4
              dict(MMA=False, BLOCK_N=1, BLOCK_K=2048, num_warps=8, SPLIT_K=2, VEC=8),
              dict(MMA=False, BLOCK_N=1, BLOCK_K=2048, num_warps=8, SPLIT_K=4, VEC=8),
              # tensor-core plans for M 5-16, where a CUDA-core GEMV converts and multiplies every element of x in
              # every program: 16 columns a program and enough K shares to fill the SMs at narrow N
              dict(MMA=True, BLOCK_N=16, BLOCK_K=256, num_warps=4, SPLIT_K=8, num_stages=3),
              dict(MMA=True, BLOCK_N=16, BLOCK_K=128, num_warps=4, SPLIT_K=16, num_stages=4),
              dict(MMA=True, BLOCK_N=32, BLOCK_K=256, num_warps=4, SPLIT_K=8, num_stages=3)]
    # each plan under v62's split epilogue (acq_rel adds, a fence.sc.gpu in every thread), v65's and the set's
    # family's (v66's); the three kernels differ in nothing else
    PLANS = [dict(plan, FAMILY=family) for plan in SPLITS
             for family in ("tasks/llgemm/versions/v62/solution.py", "tasks/llgemm/versions/v65/solution.py", FAMILY)]
else:
    sys.exit(f"SET must be gemv, vec, cg, pairs or split, not {SET!r}")
KEYS = ("BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps") + {
    "gemv": (), "vec": ("VEC", "PREFETCH"), "cg": ("VEC", "PREFETCH", "WEIGHT_CG"), "pairs": ("VEC", "PREFETCH"),
    "split": ("MMA", "VEC", "PREFETCH", "WEIGHT_CG", "num_stages")}[SET]

def family(config: dict, tag: str):
    """The family's module (``config``'s FAMILY, else the set's) with every shape on the rest of ``config`` (no
    tiers): plan() still fits it to the shape."""
    config = dict(config)
    spec = importlib.util.spec_from_file_location(f"family_{tag}", config.pop("FAMILY", FAMILY))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    general = module.get_config()
    module.get_config = lambda: {**general, **config}
    module.TIERS = []
    return module


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def hot_and_flushed(fn, calls: list[tuple], flush: torch.Tensor) -> tuple[float, float]:
    hot, one = gt.Graph(fn, calls, "hot"), gt.Graph(fn, calls[:1], "flushed")
    for _ in range(gt.WARM_REPLAYS):
        hot.run()
        one.run()
    return median([hot.timed(None) for _ in range(21)]), median([one.timed(flush) for _ in range(41)])


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("sweep_gemv.py times CUDA graphs: run it on a GPU")
    began, device = time.time(), torch.device("cuda")
    flush = torch.zeros(gt.FLUSH_BYTES, dtype=torch.uint8, device=device)
    for m, n, k in POINTS:
        if time.time() - began > BUDGET:
            print(json.dumps({"stopped": "budget", "at": [m, n, k]}), flush=True)
            break
        case = A.Case(f"m{m}", m, n, k, seed=11)
        problem = A.generate(case, "normal", device)
        weight = problem.weights["weight"]
        calls = [problem.inputs] + A.make_inputs(case, 7, seed=5, device=device)
        ref = A.reference(problem.weights, problem.inputs, case)
        base = hot_and_flushed(lambda x: torch.nn.functional.linear(x, weight), calls, flush)
        seen = set()
        for i, config in enumerate(PLANS):
            module = family(config, f"{m}_{n}_{k}_{i}")
            plan = module.plan(m, n, k)
            key = (config.get("FAMILY", FAMILY), tuple(sorted(plan.items())))
            if key in seen or SET == "split" and plan["SPLIT_K"] == 1:  # a plan already timed, or no split to time
                continue
            seen.add(key)
            record = {"shape": [m, n, k], "cfg": config, "family": config.get("FAMILY", FAMILY),
                      "plan": {key: plan[key] for key in KEYS},
                      "programs": -(-n // plan["BLOCK_N"]) * plan["SPLIT_K"], "base_hot": base[0], "base_fl": base[1]}
            try:
                fn = module.build(weight)
                y = fn(*problem.inputs)
                torch.cuda.synchronize()
                record["ok"] = A.check_output(y, ref, case).ok
                hot, flushed = hot_and_flushed(fn, calls, flush)
                record.update(hot=hot, fl=flushed, r_hot=base[0] / hot, r_fl=base[1] / flushed,
                              r=min(base[0] / hot, base[1] / flushed))
            except Exception as exc:  # a plan that fails to compile or run is a row, not the sweep's end
                record["error"] = repr(exc)[:300]
            print(json.dumps(record), flush=True)
        again = hot_and_flushed(lambda x: torch.nn.functional.linear(x, weight), calls, flush)
        print(json.dumps({"shape": [m, n, k], "base_again": again}), flush=True)
    print(json.dumps({"wall": time.time() - began}), flush=True)


if __name__ == "__main__":
    main()
