# ruff: noqa  -- the probe as it ran on the H200 (kept as it ran, this line aside)
"""GPU probe 1: ceilings (copy bandwidth, read-only pass, empty graph node), F.linear hot/flushed on the visible
points, v0 kernel correctness over configs, and an informational mini-sweep (not used for any table)."""
import importlib.util, json, sys, time, itertools
import torch, triton, triton.language as tl
import torch.nn.functional as F

out_dir = sys.argv[1]
log = open(f"{out_dir}/probe1.log", "w")
def p(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()

spec = importlib.util.spec_from_file_location("sol", "tasks/llgemm/versions/v0/solution.py")
sol = importlib.util.module_from_spec(spec); spec.loader.exec_module(sol)
dev = torch.device("cuda")
props = torch.cuda.get_device_properties(0)
p("device", props.name, "L2", props.L2_cache_size, "SMs", props.multi_processor_count)
FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
SPIN = 200_000

def capture(fn, args_list):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for a in args_list: fn(*a)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for a in args_list: fn(*a)
    return g

def replay_times(g, n, flush, calls):
    ts = []
    for _ in range(n):
        if flush: FLUSH.view(torch.float32).sum()
        torch.cuda._sleep(SPIN)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / calls)
    return ts

def med(v): return sorted(v)[len(v)//2]

def paired(fa, fb, xs):
    ga, gb = capture(fa, [(x,) for x in xs[:8]]), capture(fb, [(x,) for x in xs[:8]])
    ca, cb = capture(fa, [(xs[0],)]), capture(fb, [(xs[0],)])
    for g in (ga, gb, ca, cb): g.replay()
    torch.cuda.synchronize()
    ha, hb, fa_, fb_ = [], [], [], []
    for i in range(21):
        ha += replay_times(ga, 1, False, 8); hb += replay_times(gb, 1, False, 8)
    for i in range(101):
        fa_ += replay_times(ca, 1, True, 1); fb_ += replay_times(cb, 1, True, 1)
    return med(ha), med(hb), med(fa_), med(fb_), sorted(set(round(t, 4) for t in fa_))[:6]

# 1. copy bandwidth
src = torch.empty(1 << 29, dtype=torch.uint8, device=dev); dst = torch.empty_like(src)
for _ in range(3): dst.copy_(src)
ts = []
for _ in range(10):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); dst.copy_(src); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) / 1000)
p("copy GB/s (read+write)", round(2 * src.numel() / med(ts) / 1e9))
del src, dst

# 2. empty triton kernel as a graph node
@triton.jit
def empty_kernel(x_ptr):
    pass
z = torch.zeros(1, device=dev)
g = capture(lambda: empty_kernel[(1,)](z), [()] * 8)
p("empty triton kernel per graph node us:", round(med(replay_times(g, 51, False, 8)), 3))

@triton.jit
def read_kernel(w_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(w_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), acc)

shapes = [(4096, 2560), (2560, 1536), (24, 2560), (3584, 2560), (640, 2560), (320, 2560), (62080, 2560),
          (336, 10240), (10240, 320), (320, 10240)]
Ms = [1, 4, 16]
DEADLINE = time.time() + 320
results = {}
# 3. F.linear and a read-only pass per shape; correctness over configs on GPU
for (N, K) in shapes:
    W = (torch.randn(N, K, device=dev) * K ** -0.5).bfloat16()
    nprog = 132 * 4
    rbuf = torch.empty(nprog * 1024, device=dev)
    rd = lambda x: read_kernel[(nprog,)](W, rbuf, W.numel(), BLOCK=1024, num_warps=4)
    xs = [torch.randn(1, K, device=dev).bfloat16() for _ in range(8)]
    r = paired(rd, rd, xs)
    p(f"read-only pass {N}x{K} ({2*N*K/1e6:.1f} MB): hot {r[0]:.2f} us flushed {r[2]:.2f} us "
      f"({2*N*K/r[2]/1e3:.0f} GB/s flushed)")
    for M in Ms:
        xs = [torch.randn(M, K, device=dev).bfloat16() for _ in range(8)]
        lin = lambda x: F.linear(x, W)
        best = None
        # informational mini-sweep: a few plans whose grid is 128..1024 programs
        tried = []
        for bn in (32, 64, 128):
            cols = triton.cdiv(N, bn)
            for split in (1, 2, 4, 8, 16, 32):
                if not (128 <= cols * split <= 1100) and not (split == 1 and cols * split > 1100):
                    continue
                for bk, st, nw in ((128, 4, 4), (256, 3, 4), (512, 2, 4)):
                    tried.append(dict(BLOCK_N=bn, SPLIT_K=split, BLOCK_K=bk, num_stages=st, num_warps=nw))
        tried = (tried[:10] if time.time() < DEADLINE else []) or [dict(BLOCK_N=64, SPLIT_K=1, BLOCK_K=128, num_stages=2, num_warps=4)]
        rows = []
        for cfg in tried:
            full = dict(sol.get_config(), **cfg)
            sol_plan = sol.plan
            orig = sol.get_config
            sol.get_config = lambda full=full: dict(full)
            sol.TIERS_SAVE = sol.TIERS; sol.TIERS = []
            try:
                fn = sol.build(W)
                y = fn(xs[0]); ref = F.linear(xs[0].float(), W.float())
                err = (y.float() - ref).abs().max().item()
                ok = err <= 2 ** -7 * ref.abs().max().item() + 1e-2
                t = paired(fn, lin, xs)
                rows.append((min(t[1] / t[0], t[3] / t[2]), t, cfg, ok, err))
            except Exception as e:
                p("  ERROR", N, K, M, cfg, type(e).__name__, str(e)[:200])
            finally:
                sol.get_config = orig; sol.TIERS = sol.TIERS_SAVE
        rows.sort(key=lambda r: -r[0])
        bad = [r for r in rows if not r[3]]
        b = rows[0]
        p(f"{N:>6}x{K:<6} M={M:<2} F.linear hot {b[1][1]:.2f} flushed {b[1][3]:.2f} | best of {len(rows)}: "
          f"hot {b[1][0]:.2f} flushed {b[1][2]:.2f} min-ratio {b[0]:.3f} {b[2]} | incorrect {len(bad)} "
          f"| flushed quanta {b[1][4][:4]}")
        results[f"{M}x{N}x{K}"] = [(r[0], r[1][:4], r[2], r[3]) for r in rows]
    del W
    torch.cuda.empty_cache()
json.dump(results, open(f"{out_dir}/probe1.json", "w"))
p("done")
