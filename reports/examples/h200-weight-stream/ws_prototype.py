"""Prototype: a warp-specialized W4A16 split-K kernel in Gluon, the family's main loop and, with EPILOGUE 1, its
epilogue.

A producer warp copies each step's block of repacked words (pack.operand_blocks) and x tile into a ring of shared
memory stages with the copy engine (TMA, completion on an mbarrier); the consumer warps (CONSUMER_WARPS 4, one
warpgroup, for 64 columns a program; 8, two warpgroups sharing each x tile, for 128) load the words into the wgmma
register operand's layout (words_layout: no shuffle on the way), dequantize them with the family's one-shift inline
PTX, run the wgmma against x in shared memory, release the stage and scale the fp32 partial. ASYNC 0 waits
for each step's wgmma before the next step's dequant; ASYNC 1 takes two steps per iteration and keeps the first
step's wgmma in flight while it dequantizes the second (ptxas keeps the pair asynchronous from 80 registers up; under
that, or with the wgmma in flight across the loop's back edge, it serializes every wgmma: its notes C7512 and C7514).
The consumer is the default partition: after the join its warps hold the partial. EPILOGUE 0 adds it into an fp32
(M, N) buffer with relaxed atomics; EPILOGUE 1 is the family's: bias, activation and residual into an fp16 output,
the splits meeting in the kept fp32 accumulator and a counter per tile that the last split leaves at zero.
SCALES 0 has the consumer load each step's row of scales itself, a plain load at the step; SCALES 1 (with ASYNC 0)
has the producer copy the row into the ring with the step's words and x tile, so no load waits in the consumer.

    python ws_prototype.py sm90 [STAGES MAXNREG SPLIT_K ASYNC EPILOGUE CONSUMER_WARPS SCALES]
                                          compile for sm90 on any machine: registers, shared, the consumer
                                          loop's instructions per step
    python ws_prototype.py gpu CASE_JSON [VARIANTS_JSON]
                                          on a CUDA GPU: the partials against fp32 x @ W, or the output as the
                                          harness checks it; time against the family's whole call (do_bench medians)
Run from the repository root (it loads methods/drafts/w4a16 and evals).
"""
import os
import sys
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

# the family's warp-specialized kernel holds the dequant, the epilogue and the layouts this prototype shares with it
sys.path.insert(0, os.getcwd())
from methods.drafts.w4a16.ws import _dequant_tile, _finish, shared_layouts, words_layout  # noqa: E402


def layouts(BN, BM, BK):
    """The shared layouts of a stage's words and x tile."""
    return shared_layouts(BM, BN, BK)[:2]


def scales_layout(BN):
    """The shared layout of a [1, BN] row of scales (SCALES 1)."""
    return shared_layouts(32, BN, 128)[2]


@gluon.jit
def _producer(q_desc, x_desc, s_desc, w_bufs, x_bufs, s_bufs, ready, empty, q_row0, x_row0, k0, g0, n0, n_steps,
              BN: gl.constexpr, BK: gl.constexpr, SCALES: gl.constexpr):
    STAGES: gl.constexpr = w_bufs.type.shape[0]
    for i in range(n_steps):
        s = i % STAGES
        phase = (i // STAGES) & 1
        mbarrier.wait(empty.index(s), phase ^ 1)
        fence_async_shared()
        if SCALES:  # the step's row of scales rides the ring with its words and x tile
            mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + x_desc.block_type.nbytes
                            + s_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(s_desc, [g0 + i, n0], ready.index(s), s_bufs.index(s))
        else:
            mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row0 + i * BN, 0], ready.index(s), w_bufs.index(s))
        tma.async_copy_global_to_shared(x_desc, [x_row0, k0 + i * BK], ready.index(s), x_bufs.index(s))


@gluon.jit
def _consumer(w_bufs, x_bufs, s_bufs, ready, empty, s_ptr, N, g0, n_steps, pid_n,
              BN: gl.constexpr, BM: gl.constexpr, BK: gl.constexpr, WORDS_LAYOUT: gl.constexpr,
              ASYNC: gl.constexpr, SCALES: gl.constexpr):
    STAGES: gl.constexpr = w_bufs.type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BN // 16, 1], instr_shape=[16, BM, 16])
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    offs_n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    acc = gl.zeros([BN, BM], gl.float32, mma)
    zero = gl.zeros([BN, BM], gl.float32, mma)
    if SCALES == 0:
        s_ptrs = s_ptr + g0 * N + offs_n
    # a [1, BN] row of scales out of the ring: one element a thread, the rows' warps side by side
    row: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[1, 32],
                                         warps_per_cta=[1, BN // 16], order=[1, 0])
    if ASYNC:
        # two steps per iteration: step 2j's MMA runs while step 2j + 1 is dequantized; an odd last step follows
        for j in range(n_steps // 2):
            i = 2 * j
            s0 = i % STAGES
            s1 = (i + 1) % STAGES
            scale0 = gl.load(s_ptrs)
            scale1 = gl.load(s_ptrs + N)
            s_ptrs += 2 * N
            mbarrier.wait(ready.index(s0), (i // STAGES) & 1)
            w0 = _dequant_tile(w_bufs.index(s0).load(WORDS_LAYOUT), BN, BK, dot_a)
            t0 = warpgroup_mma(w0, x_bufs.index(s0).permute((1, 0)), zero, use_acc=False, is_async=True)
            mbarrier.wait(ready.index(s1), ((i + 1) // STAGES) & 1)
            w1 = _dequant_tile(w_bufs.index(s1).load(WORDS_LAYOUT), BN, BK, dot_a)
            t1 = warpgroup_mma(w1, x_bufs.index(s1).permute((1, 0)), zero, use_acc=False, is_async=True)
            p0, _ = warpgroup_mma_wait(num_outstanding=1, deps=[t0, w0])
            mbarrier.arrive(empty.index(s0), count=1)
            acc += p0 * scale0.to(gl.float32)[:, None]
            p1, _ = warpgroup_mma_wait(num_outstanding=0, deps=[t1, w1])
            mbarrier.arrive(empty.index(s1), count=1)
            acc += p1 * scale1.to(gl.float32)[:, None]
        if n_steps % 2:  # the odd step left over, synchronously
            i = n_steps - 1
            s = i % STAGES
            scale = gl.load(s_ptrs)
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            w = _dequant_tile(w_bufs.index(s).load(WORDS_LAYOUT), BN, BK, dot_a)
            part = warpgroup_mma(w, x_bufs.index(s).permute((1, 0)), zero, use_acc=False)
            mbarrier.arrive(empty.index(s), count=1)
            acc += part * scale.to(gl.float32)[:, None]
    else:
        for i in range(n_steps):
            s = i % STAGES
            phase = (i // STAGES) & 1
            if SCALES == 0:
                scale = gl.load(s_ptrs)
                s_ptrs += N
            mbarrier.wait(ready.index(s), phase)
            if SCALES:
                scale = gl.convert_layout(gl.reshape(s_bufs.index(s).load(row), [BN]), gl.SliceLayout(1, mma))
            w = _dequant_tile(w_bufs.index(s).load(WORDS_LAYOUT), BN, BK, dot_a)
            part = warpgroup_mma(w, x_bufs.index(s).permute((1, 0)), zero, use_acc=False)
            mbarrier.arrive(empty.index(s), count=1)
            acc += part * scale.to(gl.float32)[:, None]
    return (acc,)  # the default partition's results are a tuple


@gluon.jit
def w4a16_ws_kernel(q_desc, x_desc, s_ptr, b_ptr, r_ptr, out_ptr, acc_ptr, cnt_ptr, M, N, K,
                    ACTIVATION: gl.constexpr, SPLIT_K: gl.constexpr,
                    BN: gl.constexpr, BM: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                    WORDS_LAYOUT: gl.constexpr, ASYNC: gl.constexpr = 0, EPILOGUE: gl.constexpr = 0,
                    SCALES: gl.constexpr = 0):
    """SCALES 0: the consumer loads each step's row of scales from s_ptr itself, at the step; 1: s_ptr is the scales'
    tensor descriptor ([1, BN] blocks) and the producer copies the row into the ring with the step's words."""
    # ASYNC holds two stages at once: with one the consumer would wait for a stage it has not released
    gl.static_assert(ASYNC == 0 or STAGES >= 2, "ASYNC 1 needs STAGES >= 2")
    gl.static_assert(ASYNC == 0 or SCALES == 0, "SCALES 1 is written for the synchronous loop")
    pid = gl.program_id(0)
    m_tiles = gl.cdiv(M, BM)
    pid_m = pid % m_tiles
    pid_n = pid // m_tiles
    pid_k = gl.program_id(1)
    groups = K // BK
    g_start = (pid_k * groups) // SPLIT_K
    g_end = ((pid_k + 1) * groups) // SPLIT_K
    n_steps = g_end - g_start
    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES, BN, BK // 8], q_desc.layout)
    x_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, BM, BK], x_desc.layout)
    if SCALES:
        s_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, 1, BN], s_ptr.layout)
    else:
        s_bufs = x_bufs  # not read
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    q_row0 = (pid_n * groups + g_start) * BN
    (acc,) = gl.warp_specialize([
        (_consumer, (w_bufs, x_bufs, s_bufs, ready, empty, s_ptr, N, g_start, n_steps, pid_n, BN, BM, BK,
                     WORDS_LAYOUT, ASYNC, SCALES)),
        (_producer, (q_desc, x_desc, s_ptr, w_bufs, x_bufs, s_bufs, ready, empty, q_row0, pid_m * BM, g_start * BK,
                     g_start, pid_n * BN, n_steps, BN, BK, SCALES)),
    ], [1], [24])
    # after the join, in the consumer's warps (the default partition; the producer's warps idle): the output's
    # element (m, n) is acc[n, m]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BN // 16, 1], instr_shape=[16, BM, 16])
    offs_n = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    offs_m = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
    io = offs_m.to(gl.int64)[None, :] * N + offs_n[:, None]
    mask = (offs_m < M)[None, :]
    if EPILOGUE == 0:  # fp32 partials only, into acc_ptr
        gl.atomic_add(acc_ptr + io, acc, mask=mask, sem="relaxed")
    else:
        bias = gl.load(b_ptr + offs_n).to(gl.float32)[:, None]
        if SPLIT_K == 1:
            _finish(acc + bias, r_ptr, out_ptr, io, mask, ACTIVATION)
        else:  # the family's kept accumulator and tile counter: the last split applies the epilogue and re-zeroes
            gl.atomic_add(acc_ptr + io, acc, mask=mask, sem="relaxed")
            gl.thread_barrier()
            count = gl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel")
            if count + 1 == SPLIT_K:
                z = gl.load(acc_ptr + io, mask=mask, other=0.0, volatile=True)
                _finish(z + bias, r_ptr, out_ptr, io, mask, ACTIVATION)
                gl.thread_barrier()
                gl.store(acc_ptr + io, gl.zeros_like(z), mask=mask)
                gl.store(cnt_ptr + pid, 0)


def compile_sm90(stages=3, maxnreg=64, split=2, use_async=0, epilogue=0, consumer_warps=4, scales=0):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    BN, BM, BK = 16 * consumer_warps, 32, 128
    q_layout, x_layout = layouts(BN, BM, BK)
    sig = {"q_desc": f"tensordesc<i32[{BN}, {BK // 8}],{q_layout!r}>",
           "x_desc": f"tensordesc<fp16[{BM}, {BK}],{x_layout!r}>",
           "s_ptr": f"tensordesc<fp16[1, {BN}],{scales_layout(BN)!r}>" if scales else "*fp16",
           "b_ptr": "*fp16", "r_ptr": "*fp16", "out_ptr": "*fp16", "acc_ptr": "*fp32",
           "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
    const = {"ACTIVATION": 1, "SPLIT_K": split, "BN": BN, "BM": BM, "BK": BK, "STAGES": stages,
             "WORDS_LAYOUT": words_layout(BN), "ASYNC": use_async, "EPILOGUE": epilogue, "SCALES": scales}
    sig.update(dict.fromkeys(const, "constexpr"))
    # the pointers, N, K
    aligned = {(i,): [["tt.divisibility", 16]] for i in (3, 4, 5, 6, 7, 9, 10) + (() if scales else (2,))}
    src = GluonASTSource(w4a16_ws_kernel, sig, const, aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": consumer_warps, "maxnreg": maxnreg})


def gpu_case(case_json, variants):
    import json
    import torch
    sys.path.insert(0, os.getcwd())
    from evals import kernel_harness as kh
    from evals.loader import load_solution
    from pathlib import Path
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    fam = load_solution(Path("methods/drafts/w4a16"))
    pack = sys.modules[fam.__name__.rpartition(".")[0] + ".pack"]
    c = json.loads(case_json)
    case = kh.Case(c["stratum"], c["m"], c["k"], c["n"], c["epilogue"], c["seed"])
    M, K, N = case.m, case.k, case.n
    t = kh.generate(case, "normal", "cuda")
    ks = torch.arange(K, device="cuda")
    codes = (t.qweight[ks // 8, :] >> (4 * (ks % 8))[:, None].to(torch.int32)) & 0xF
    W = (codes.float() - 8) * t.scales.float().repeat_interleave(128, 0)
    ref = t.x.float() @ W
    del codes, W
    BM, BK = 32, 128
    descriptors = {}  # BN -> (the words repacked in blocks of BN columns, their descriptor, x's descriptor)

    def descriptors_for(BN):
        if BN not in descriptors:
            words = pack.operand_blocks(t.qweight, BN).view(-1, BK // 8)
            q_layout, x_layout = layouts(BN, BM, BK)
            descriptors[BN] = (words, TensorDescriptor.from_tensor(words, [BN, BK // 8], q_layout),
                               TensorDescriptor.from_tensor(t.x, [BM, BK], x_layout))
        return descriptors[BN][1:]
    fn = fam.build(t.qweight, t.scales, t.bias, case.epilogue)
    base = triton.testing.do_bench(lambda: fn(t.x, t.residual), warmup=50, rep=300, return_mode="median")
    plan = fam.plan(M, K, N)
    print(f"{case.name}: family plan split {plan['SPLIT_K']}: {1e3 * base:.2f} us (do_bench median)", flush=True)
    full_ref = kh.reference(t.x, t.qweight, t.scales, t.bias, t.residual, case.epilogue)
    activation = {"silu": 0, "gelu_tanh": 1}[case.epilogue]
    for stages, maxnreg, split_mult, use_async, epilogue, consumer_warps, *scales in variants:
        scales = scales[0] if scales else 0
        BN = 16 * consumer_warps
        q_desc, x_desc = descriptors_for(BN)
        s_arg = TensorDescriptor.from_tensor(t.scales, [1, BN], scales_layout(BN)) if scales else t.scales
        layout = words_layout(BN)
        split = max(1, min(K // BK, plan["SPLIT_K"] * split_mult))
        grid = (triton.cdiv(M, BM) * (N // BN), split)
        acc = torch.zeros((M, N), dtype=torch.float32, device="cuda")
        counters = torch.zeros(grid[0], dtype=torch.int32, device="cuda")
        out = torch.empty((M, N), dtype=torch.float16, device="cuda")

        def launch():
            w4a16_ws_kernel[grid](q_desc, x_desc, s_arg, t.bias, t.residual, out, acc, counters, M, N, K,
                                  ACTIVATION=activation, SPLIT_K=split, BN=BN, BM=BM, BK=BK, STAGES=stages,
                                  WORDS_LAYOUT=layout, ASYNC=use_async, EPILOGUE=epilogue, SCALES=scales,
                                  num_warps=consumer_warps, maxnreg=maxnreg)
        def check():
            torch.cuda.synchronize()
            if not epilogue:
                return f"rel err {((acc - ref).abs().max() / ref.abs().max()).item():.2e}"
            # the family's output, within the harness's bound (normal inputs), and the kept state back at zero
            result = kh.check_output(out, full_ref, (M, N))
            assert result.ok and not acc.any().item() and not counters.any().item(), (result, "kept state")
            return f"output {result}"
        launch()
        first = check()
        if not epilogue:
            acc.zero_()
        ms = triton.testing.do_bench(launch, warmup=50, rep=300, return_mode="median")
        first += ", again after the timed calls: " + (check() if epilogue else "-")
        print(f"  ws stages {stages} maxnreg {maxnreg} split {split} async {use_async} epilogue {epilogue} "
              f"consumer warps {consumer_warps} scales {scales}: "
              f"{first}; {1e3 * ms:.2f} us ({base / ms:.2f}x the family's whole call)", flush=True)


def consumer_loop(cubin):
    """(SASS instructions, wgmma waits) per K step of the consumer's steady state (hopper_compile.consumer_loop)."""
    from hopper_compile import _cubin_tool, consumer_loop as loop
    per_step, waits = loop(_cubin_tool("nvdisasm", ["-c"], cubin))
    if not per_step:
        raise RuntimeError("no loop in the machine code holds a whole step's 8 HGMMAs")
    return per_step, waits


def main():
    if sys.argv[1] == "sm90":
        sys.path.insert(0, os.path.join(os.getcwd(), "tests", "methods"))
        from hopper_compile import registers
        kernel = compile_sm90(*(int(a) for a in sys.argv[2:]))
        cubin = kernel.asm["cubin"]
        per_step, waits = consumer_loop(cubin)
        print(f"registers {registers(cubin)} (the kernel's cap; the partitions reallocate), shared "
              f"{kernel.metadata.shared} B, consumer loop {per_step:g} SASS instructions and {waits:g} wgmma waits "
              "per K step")
    else:  # gpu: (stages, maxnreg, split-K multiple of the family's plan, ASYNC, EPILOGUE, consumer warps[,
        # SCALES]); the ws-prototype-N.txt files list the variants of their runs; a JSON list of such tuples
        # replaces them
        import json
        variants = [(3, 64, 1, 0, 1, 4), (3, 72, 1, 0, 1, 8), (4, 72, 1, 0, 1, 8), (3, 72, 2, 0, 1, 8),
                    (4, 72, 2, 0, 1, 8), (3, 56, 1, 0, 1, 8)]
        gpu_case(sys.argv[2], [tuple(v) for v in json.loads(sys.argv[3])] if len(sys.argv) > 3 else variants)


if __name__ == "__main__":
    main()
