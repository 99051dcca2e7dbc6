"""Informational (feeds no table): per shape, F.linear and a set of plans of a family, hot (graph of 8 calls) and
flushed (graph of one call after a 256 MiB read), medians; one JSON line per (shape, plan). Time-bounded."""
import importlib.util, json, os, sys, time, torch
sys.path.insert(0, ".")
from evals import graph_timing as gt
from evals import task as tasks
A = tasks.load("llgemm").adapter
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BUDGET = float(os.environ.get("BUDGET", "200"))
T0 = time.time()
FLUSH = torch.zeros(gt.FLUSH_BYTES, dtype=torch.uint8, device=DEV) if DEV.type == "cuda" else None


def family(path, config, tag):
    spec = importlib.util.spec_from_file_location(f"fam_{tag}", path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    g = mod.get_config(); mod.get_config = lambda: {**g, **config}; mod.TIERS = []
    return mod


def med(xs):
    xs = sorted(xs); return xs[len(xs) // 2]


def timeit(fn, calls):
    if DEV.type != "cuda":
        [fn(*c) for c in calls]; return 1.0, 1.0
    hot = gt.Graph(fn, calls, "c")
    one = gt.Graph(fn, calls[:1], "c1")
    for _ in range(3):
        hot.run(); one.run()
    h = med([hot.timed(None) for _ in range(21)])
    f = med([one.timed(FLUSH) for _ in range(41)])
    return h, f


SHAPES = [(1, 640, 2560), (1, 336, 10240), (1, 4096, 2560), (1, 24, 2560), (4, 640, 2560), (1, 2560, 1536),
          (4, 4096, 2560), (16, 3584, 2560), (8, 320, 2560), (1, 320, 2560), (2, 640, 2560), (1, 62080, 2560)]
if DEV.type != "cuda":
    SHAPES = [(1, 24, 256), (3, 40, 72)]
GEMV = []
for sk in (1,):
    for bn in (1, 2, 4, 8):
        for nw in (4, 8, 16, 32):
            for bk in (2048, 4096):
                GEMV.append(dict(MMA=False, BLOCK_N=bn, num_warps=nw, BLOCK_K=bk, SPLIT_K=sk))
for sk in (2, 4):
    for bn in (2, 4):
        for nw in (8, 16):
            GEMV.append(dict(MMA=False, BLOCK_N=bn, num_warps=nw, BLOCK_K=2048, SPLIT_K=sk))
FAMILY = os.environ.get("FAMILY", "tasks/llgemm/versions/v35/solution.py")
ONLY = os.environ.get("ONLY")
for (m, n, k) in SHAPES:
    if time.time() - T0 > BUDGET:
        print(json.dumps({"stopped": "budget", "at": [m, n, k]}), flush=True); break
    case = A.Case("m1", m, n, k, seed=11)
    prob = A.generate(case, "normal", DEV)
    w = prob.weights["weight"]
    calls = [prob.inputs] + A.make_inputs(case, 7, seed=5, device=DEV)
    ref = A.reference(prob.weights, prob.inputs, case)
    base = timeit(lambda x: torch.nn.functional.linear(x, w), calls)
    seen = set()
    for i, cfg in enumerate(GEMV):
        if time.time() - T0 > BUDGET:
            break
        mod = family(FAMILY, cfg, f"{m}_{n}_{k}_{i}")
        p = mod.plan(m, n, k)
        key = tuple(sorted((a, b) for a, b in p.items()))
        if key in seen:
            continue
        seen.add(key)
        rec = {"shape": [m, n, k], "cfg": cfg, "plan": {a: p[a] for a in ("BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps")},
               "programs": -(-n // p["BLOCK_N"]) * p["SPLIT_K"], "base_hot": base[0], "base_fl": base[1]}
        try:
            fn = mod.build(w)
            y = fn(*prob.inputs)
            if DEV.type == "cuda": torch.cuda.synchronize()
            rec["ok"] = A.check_output(y, ref, case).ok
            h, f = timeit(fn, calls)
            rec.update(hot=h, fl=f, r_hot=base[0] / h, r_fl=base[1] / f, r=min(base[0] / h, base[1] / f))
        except Exception as exc:  # noqa
            rec["error"] = repr(exc)[:300]
        print(json.dumps(rec), flush=True)
    base2 = timeit(lambda x: torch.nn.functional.linear(x, w), calls)
    print(json.dumps({"shape": [m, n, k], "base_again": base2}), flush=True)
print(json.dumps({"wall": time.time() - T0}), flush=True)
