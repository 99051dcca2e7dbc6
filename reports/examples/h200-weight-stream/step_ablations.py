"""Where the family's K step spends its time: the lean loop (DEQUANT 3, the family's split-K kernel) rewritten with
knobs that take parts of a step away, timed against the family's own plan in one process.

Variants, as JSON lists [STEP, CAP, STAGES, BLOCK_N, WARPS, SPLIT, ABLATION, DEQUANT, SCALES_AHEAD] (SPLIT 0: the
family's; SCALES_AHEAD may be left out, 0):
- STEP 2 takes two quantization groups per loop iteration (half the loop's bookkeeping per weight byte), an odd
  last group after the loop. Correct output.
- ABLATION 0: the step as the family runs it. 1: x's tile loaded once, before the loop (no x stream; wrong output).
  2: the words alone, folded by xor (no x, no dequant, no MMA; wrong output). 3: x through a tensor descriptor,
  one bulk copy a step instead of four 16-byte copies per thread (correct output).
- DEQUANT 3 is the family's one-shift dequant; 9 its four lop3 and one shift without the subtraction and the fma
  (5 instructions a word, not 9; wrong output); 1 the pure-Triton unpack (what the CPU interpreter runs).
- SCALES_AHEAD (with STEP 1 and ABLATION 0): 0 loads each step's row of scales at that step, as the family does;
  d in 1..4 loads it d steps ahead into registers (correct output); -1 uses the first group's row for every step
  (no scale load in the loop; wrong output).
- CAP is the register cap (0: the compiler's choice), WARPS the warps a program (8 with BLOCK_N 128: two warpgroups
  sharing each x tile).

    python step_ablations.py sm90 VARIANTS_JSON [OVERRIDES_JSON]
                                                        compile for sm90 on any machine (24x8192x28672's shapes):
                                                        registers, shared, SASS instructions per K step of the
                                                        loop; of each variant, then of the family's kernel under
                                                        each plan override
    python step_ablations.py cpu                        the correct variants against the harness's reference, on
                                                        a small case under Triton's interpreter (DEQUANT 1; the
                                                        mode sets TRITON_INTERPRET=1 itself)
    python step_ablations.py gpu CASE_JSON VARIANTS_JSON [OVERRIDES_JSON]
                                                        on a CUDA GPU: each variant (and each family plan override)
                                                        checked where its output is meant to be right, and timed
                                                        against the family's own plan (do_bench medians, the L2
                                                        flushed between calls)
Run from the repository root (it loads methods/drafts/w4a16 and evals).
"""
import json
import os
import re
import sys

if sys.argv[1:2] == ["cpu"]:
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported
sys.path.insert(0, os.getcwd())

from pathlib import Path  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from methods.drafts.w4a16.kernels import _add_and_finish, _join8, _unpack_words  # noqa: E402

# ABLATION only: the one-shift unpack's four lop3 and its shift, without the subtraction and the fma that make the
# values right: the fewest instructions that still move every nibble into an fp16 register
LOP_ONLY = tl.constexpr("""
{
.reg .b32 t0, t1, t2, t3, s;
shr.u32 s, $8, 8;
lop3.b32 t0, $8, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 t1, $8, 0x00F000F0, 0x64006400, 0xEA;
lop3.b32 t2, s, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 t3, s, 0x00F000F0, 0x64006400, 0xEA;
mov.b32 {$0, $4}, t0;
mov.b32 {$1, $5}, t1;
mov.b32 {$2, $6}, t2;
mov.b32 {$3, $7}, t3;
}
""")


@triton.jit
def _tile(words, DEQUANT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_N, 16] words -> the [BLOCK_N, BLOCK_K] fp16 operand tile, as kernels._tile_partial builds it."""
    if DEQUANT == 9:
        n0, n1, n2, n3, n4, n5, n6, n7 = tl.inline_asm_elementwise(
            LOP_ONLY, "=h,=h,=h,=h,=h,=h,=h,=h,r", [words], dtype=(tl.int16,) * 8, is_pure=True, pack=1)
        w = _join8(n0, n1, n2, n3, n4, n5, n6, n7).to(tl.float16, bitcast=True)
    else:
        w = _unpack_words(words, DEQUANT)
    w = tl.permute(tl.reshape(w, (BLOCK_N, 4, 4, 2, 2, 2)), (0, 2, 5, 4, 1, 3))
    return tl.reshape(w, (BLOCK_N, BLOCK_K))


@triton.jit
def _partial(x_ptr, q_ptr, s_ptr, rows, mask_m, offs_n, pid_n, row0, g_start, g_end, N, K,
             DEQUANT: tl.constexpr, STEP: tl.constexpr, ABLATION: tl.constexpr, SCALES_AHEAD: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc[n, m] over groups [g_start, g_end), one of the step shapes above."""
    WORDS: tl.constexpr = BLOCK_K // 8
    BLOCK: tl.constexpr = BLOCK_N * WORDS
    groups = K // BLOCK_K
    s_ptrs = s_ptr + g_start * N + offs_n
    q_ptrs = q_ptr + (pid_n.to(tl.int64) * groups + g_start) * BLOCK \
        + tl.arange(0, BLOCK_N)[:, None] * WORDS + tl.arange(0, WORDS)[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if ABLATION == 3:  # x_ptr is x's tensor descriptor: the copy engine fills the [BLOCK_M, BLOCK_K] tile
        for g in range(g_start, g_end):
            xt = tl.trans(x_ptr.load([row0, g * BLOCK_K]))
            w = _tile(tl.load(q_ptrs), DEQUANT, BLOCK_N, BLOCK_K)
            q_ptrs += BLOCK
            scale = tl.load(s_ptrs)
            s_ptrs += N
            acc += tl.dot(w, xt) * scale.to(tl.float32)[:, None]
    elif ABLATION == 2:
        fold = tl.zeros((BLOCK_N, WORDS), dtype=tl.int32)
        for g in range(g_start, g_end):
            fold ^= tl.load(q_ptrs)
            q_ptrs += BLOCK
        acc += tl.sum(fold, axis=1).to(tl.float32)[:, None]
    elif ABLATION == 1:
        xt = tl.load(x_ptr + rows[None, :] * K + (g_start * BLOCK_K + tl.arange(0, BLOCK_K))[:, None],
                     mask=mask_m[None, :], other=0.0)
        for g in range(g_start, g_end):
            w = _tile(tl.load(q_ptrs), DEQUANT, BLOCK_N, BLOCK_K)
            q_ptrs += BLOCK
            scale = tl.load(s_ptrs)
            s_ptrs += N
            acc += tl.dot(w, xt) * scale.to(tl.float32)[:, None]
    elif STEP == 1:
        xt_ptrs = x_ptr + rows[None, :] * K + (g_start * BLOCK_K + tl.arange(0, BLOCK_K))[:, None]
        last = g_end - 1
        # SCALES_AHEAD d > 0: each step's scale row loaded d steps before the step that uses it, held in registers
        # (the last group's row stands in past the range); -1: the first group's row for every step (ablation)
        if SCALES_AHEAD != 0:
            s0 = tl.load(s_ptr + g_start * N + offs_n)
        if SCALES_AHEAD >= 2:
            s1 = tl.load(s_ptr + tl.minimum(g_start + 1, last) * N + offs_n)
        if SCALES_AHEAD >= 3:
            s2 = tl.load(s_ptr + tl.minimum(g_start + 2, last) * N + offs_n)
        if SCALES_AHEAD >= 4:
            s3 = tl.load(s_ptr + tl.minimum(g_start + 3, last) * N + offs_n)
        for g in range(g_start, g_end):
            xt = tl.load(xt_ptrs, mask=mask_m[None, :], other=0.0)
            xt_ptrs += BLOCK_K
            w = _tile(tl.load(q_ptrs), DEQUANT, BLOCK_N, BLOCK_K)
            q_ptrs += BLOCK
            if SCALES_AHEAD == 0:
                scale = tl.load(s_ptrs)
                s_ptrs += N
            elif SCALES_AHEAD == -1:
                scale = s0
            elif SCALES_AHEAD == 1:
                scale = s0
                s0 = tl.load(s_ptr + tl.minimum(g + 1, last) * N + offs_n)
            elif SCALES_AHEAD == 2:
                scale = s0
                s0 = s1
                s1 = tl.load(s_ptr + tl.minimum(g + 2, last) * N + offs_n)
            elif SCALES_AHEAD == 3:
                scale = s0
                s0 = s1
                s1 = s2
                s2 = tl.load(s_ptr + tl.minimum(g + 3, last) * N + offs_n)
            else:
                scale = s0
                s0 = s1
                s1 = s2
                s2 = s3
                s3 = tl.load(s_ptr + tl.minimum(g + 4, last) * N + offs_n)
            acc += tl.dot(w, xt) * scale.to(tl.float32)[:, None]
    else:  # two groups an iteration, then the odd last one
        xt_ptrs = x_ptr + rows[None, :] * K + (g_start * BLOCK_K + tl.arange(0, BLOCK_K))[:, None]
        pairs_end = g_start + ((g_end - g_start) // 2) * 2
        for g in range(g_start, pairs_end, 2):
            xt0 = tl.load(xt_ptrs, mask=mask_m[None, :], other=0.0)
            xt1 = tl.load(xt_ptrs + BLOCK_K, mask=mask_m[None, :], other=0.0)
            xt_ptrs += 2 * BLOCK_K
            words0 = tl.load(q_ptrs)
            words1 = tl.load(q_ptrs + BLOCK)
            q_ptrs += 2 * BLOCK
            scale0 = tl.load(s_ptrs)
            scale1 = tl.load(s_ptrs + N)
            s_ptrs += 2 * N
            acc += tl.dot(_tile(words0, DEQUANT, BLOCK_N, BLOCK_K), xt0) * scale0.to(tl.float32)[:, None]
            acc += tl.dot(_tile(words1, DEQUANT, BLOCK_N, BLOCK_K), xt1) * scale1.to(tl.float32)[:, None]
        if pairs_end < g_end:
            xt = tl.load(xt_ptrs, mask=mask_m[None, :], other=0.0)
            w = _tile(tl.load(q_ptrs), DEQUANT, BLOCK_N, BLOCK_K)
            acc += tl.dot(w, xt) * tl.load(s_ptrs).to(tl.float32)[:, None]
    return acc


@triton.jit
def step_kernel(x_ptr, q_ptr, s_ptr, b_ptr, r_ptr, out_ptr, acc_ptr, cnt_ptr, M, N, K,
                ACTIVATION: tl.constexpr, SPLIT_K: tl.constexpr, DEQUANT: tl.constexpr, STEP: tl.constexpr,
                ABLATION: tl.constexpr, SCALES_AHEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """The family's split-K grid (M tiles fastest, then N tiles; the split on axis 1) and its way of meeting: every
    split adds into the kept accumulator and the last applies the epilogue (kernels._add_and_finish)."""
    groups = K // BLOCK_K
    m_tiles = tl.cdiv(M, BLOCK_M)
    pid = tl.program_id(0)
    pid_m = pid % m_tiles
    pid_n = pid // m_tiles
    pid_k = tl.program_id(1)
    g_start = (pid_k * groups) // SPLIT_K
    g_end = ((pid_k + 1) * groups) // SPLIT_K
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    rows = offs_m.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _partial(x_ptr, q_ptr, s_ptr, rows, mask_m, offs_n, pid_n, pid_m * BLOCK_M, g_start, g_end, N, K,
                   DEQUANT, STEP, ABLATION, SCALES_AHEAD, BLOCK_M, BLOCK_N, BLOCK_K)
    io = rows[None, :] * N + offs_n[:, None]
    bias = tl.load(b_ptr + offs_n).to(tl.float32)[:, None]
    _add_and_finish(acc, bias, io, mask_m[None, :], r_ptr, out_ptr, acc_ptr, cnt_ptr + pid, 1, SPLIT_K, ACTIVATION)


def _variant(values):
    """A variant's list as a dict, refusing combinations the kernel would run as some other variant."""
    if len(values) not in (8, 9):
        raise SystemExit(f"{values}: a variant is [STEP, CAP, STAGES, BLOCK_N, WARPS, SPLIT, ABLATION, DEQUANT] and "
                         "an optional SCALES_AHEAD")
    step, cap, stages, block_n, warps, split, ablation, dequant, *ahead = values
    v = {"step": step, "cap": cap, "stages": stages, "block_n": block_n, "warps": warps, "split": split,
         "ablation": ablation, "dequant": dequant, "scales_ahead": ahead[0] if ahead else 0}
    if step not in (1, 2) or ablation not in (0, 1, 2, 3) or dequant not in (1, 2, 3, 9) \
            or v["scales_ahead"] not in (-1, 0, 1, 2, 3, 4):
        raise SystemExit(f"{values}: STEP is 1 or 2, ABLATION 0-3, DEQUANT 1, 2, 3 or 9, SCALES_AHEAD -1 to 4")
    if step == 2 and ablation:
        raise SystemExit(f"{values}: the ablations take one group a step (STEP 1)")
    if v["scales_ahead"] and (step != 1 or ablation):
        raise SystemExit(f"{values}: SCALES_AHEAD applies to STEP 1 without an ablation")
    return v


def _correct(v):
    """Whether a variant's output is meant to be right (the others take part of the work away)."""
    return v["ablation"] in (0, 3) and v["dequant"] in (1, 2, 3) and v["scales_ahead"] >= 0


def _options(v):
    options = {"num_warps": v["warps"], "num_stages": v["stages"]}
    if v["cap"]:
        options["maxnreg"] = v["cap"]
    return options


def _per_step(cubin):
    """(fewest SASS instructions per K step over the loops that hold whole steps (8 HGMMAs each), or None;
    local-memory instructions in the kernel)."""
    sys.path.insert(0, os.path.join(os.getcwd(), "tests", "methods"))
    from hopper_compile import _cubin_tool, consumer_loop
    sass = _cubin_tool("nvdisasm", ["-c"], cubin)
    per_step, _ = consumer_loop(sass)
    return (per_step or None), len(re.findall(r"\b(?:LDL|STL)\b", sass))


def sm90(variants, overrides=()):
    """Compile each variant (2 splits where SPLIT is 0), then the family's kernel under each plan override, for sm90
    on 24x8192x28672's shapes: registers, shared, loop SASS per K step."""
    sys.path.insert(0, os.path.join(os.getcwd(), "tests", "methods"))
    from hopper_compile import POINTERS, kernel_plan, registers
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from evals import kernel_harness as kh
    from evals.loader import load_solution

    def compile_sm90(fn, pointers, constants, options):
        source = ASTSource(fn=fn, constexprs=constants, signature=pointers | dict.fromkeys(constants, "constexpr"),
                           attrs={(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(pointers.items())
                                  if name != "M" and not kind.startswith("tensordesc")})
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
        per_step, local = _per_step(kernel.asm["cubin"])
        return (f"registers {registers(kernel.asm['cubin'])}, shared {kernel.metadata.shared} B, SASS per K step "
                f"{per_step if per_step is not None else '-'}, local-memory instructions {local}")
    for values in variants:
        v = _variant(values)
        pointers = dict(POINTERS)
        if v["ablation"] == 3:
            pointers["x_ptr"] = "tensordesc<fp16[32, 128]>"
        constants = {"ACTIVATION": 0, "SPLIT_K": v["split"] or 2, "DEQUANT": v["dequant"], "STEP": v["step"],
                     "ABLATION": v["ablation"], "SCALES_AHEAD": v["scales_ahead"], "BLOCK_M": 32,
                     "BLOCK_N": v["block_n"], "BLOCK_K": 128}
        print(f"{json.dumps(values)}: {compile_sm90(step_kernel, pointers, constants, _options(v))}", flush=True)
    if overrides:
        family = load_solution(Path("methods/drafts/w4a16"))
        kernels = sys.modules[family.__name__.rpartition(".")[0] + ".kernels"]
        case = kh.Case("balanced", 24, 8192, 28672, "gelu_tanh", 0)
    for override in overrides:
        name, constants, options, _ = kernel_plan(family, case, override)
        print(f"family {json.dumps(override)} ({name}): "
              f"{compile_sm90(getattr(kernels, name), dict(POINTERS), constants, options)}", flush=True)


def run_case(case, variants, overrides, device):
    """Check and time each variant and override on one case (on the CPU: check only, DEQUANT 1)."""
    import torch
    from evals import kernel_harness as kh
    from evals.loader import load_solution
    family = load_solution(Path("methods/drafts/w4a16"))
    pack = sys.modules[family.__name__.rpartition(".")[0] + ".pack"]
    M, K, N = case.m, case.k, case.n
    t = kh.generate(case, "normal", device)
    ref = kh.reference(t.x, t.qweight, t.scales, t.bias, t.residual, case.epilogue)
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def bench(fn):  # us; on the CPU one more call, untimed
        if not cuda:
            fn()
            return None
        return 1e3 * triton.testing.do_bench(fn, warmup=50, rep=400, return_mode="median")

    def timing(us):
        return "untimed (CPU)" if us is None else f"{us:.2f} us ({base / us:.3f}x)"
    own = family.build(t.qweight, t.scales, t.bias, case.epilogue)
    plan = family.plan(M, K, N)
    base = bench(lambda: own(t.x, t.residual))
    print(f"{case.name}: the family's plan, split {plan['SPLIT_K']}: "
          f"{'untimed (CPU)' if base is None else f'{base:.2f} us'}", flush=True)
    for override in overrides:
        fn = family.build(t.qweight, t.scales, t.bias, case.epilogue, config=override)
        first = kh.check_output(fn(t.x, t.residual), ref, (M, N))
        us = bench(lambda: fn(t.x, t.residual))
        again = kh.check_output(fn(t.x, t.residual), ref, (M, N))
        print(f"  family {json.dumps(override)} (split {family.plan(M, K, N, override)['SPLIT_K']}): "
              f"output ok {first.ok and again.ok}, {timing(us)}", flush=True)
    block_m = max(16, min(32, triton.next_power_of_2(M)))
    words = {}
    activation = {"silu": 0, "gelu_tanh": 1}[case.epilogue]
    for values in variants:
        v = _variant(values)
        if not cuda:
            v["dequant"] = 1  # inline PTX needs a compiled kernel
        block_n = v["block_n"]
        if block_n not in words:
            words[block_n] = pack.operand_blocks(t.qweight, block_n).contiguous()
        split = v["split"] or plan["SPLIT_K"]
        if split > K // 128:
            raise SystemExit(f"{values}: {split} splits of {K // 128} groups leave a split without a group")
        grid = (triton.cdiv(M, block_m) * (N // block_n), split)
        acc = torch.zeros((M, N), dtype=torch.float32, device=device)
        counters = torch.zeros(grid[0], dtype=torch.int32, device=device)
        out = torch.empty((M, N), dtype=torch.float16, device=device)
        x_arg = t.x
        if v["ablation"] == 3:
            from triton.tools.tensor_descriptor import TensorDescriptor
            x_arg = TensorDescriptor(t.x, [M, K], [K, 1], [block_m, 128])

        def launch():
            step_kernel[grid](x_arg, words[block_n], t.scales, t.bias, t.residual, out, acc, counters, M, N, K,
                              ACTIVATION=activation, SPLIT_K=split, DEQUANT=v["dequant"], STEP=v["step"],
                              ABLATION=v["ablation"], SCALES_AHEAD=v["scales_ahead"], BLOCK_M=block_m,
                              BLOCK_N=block_n, BLOCK_K=128, **_options(v))
        launch()
        sync()
        first = kh.check_output(out, ref, (M, N))
        us = bench(launch)
        launch()
        sync()
        again = kh.check_output(out, ref, (M, N))
        kept_zero = not acc.any().item() and not counters.any().item()
        verdict = f"output ok {first.ok and again.ok and kept_zero}" if _correct(v) else "ablation (output not checked)"
        print(f"  {json.dumps(values)} split {split}: {verdict}, {timing(us)}", flush=True)
        if _correct(v) and not (first.ok and again.ok and kept_zero):
            raise SystemExit(f"{values}: wrong output ({first}, {again}) or kept state not zero")


def main():
    mode = sys.argv[1]
    if mode == "sm90":
        sm90(json.loads(sys.argv[2]), json.loads(sys.argv[3]) if len(sys.argv) > 3 else [])
        return
    from evals import kernel_harness as kh
    if mode == "cpu":  # 5 groups over 2 and 3 splits: odd group counts, so STEP 2's last single group runs
        case = kh.Case("balanced", 5, 640, 256, "gelu_tanh", 3)
        variants = [[1, 0, 3, 64, 4, 2, 0, 1], [2, 0, 2, 64, 4, 2, 0, 1], [2, 0, 2, 64, 4, 3, 0, 1],
                    [1, 0, 3, 64, 4, 3, 3, 1], [1, 0, 3, 128, 8, 2, 0, 1]] \
            + [[1, 0, 3, 64, 4, split, 0, 1, ahead] for split in (1, 2) for ahead in (1, 2, 3, 4)]
        run_case(case, variants, [], "cpu")
        return
    c = json.loads(sys.argv[2])
    case = kh.Case(c["stratum"], c["m"], c["k"], c["n"], c["epilogue"], c["seed"])
    run_case(case, json.loads(sys.argv[3]), json.loads(sys.argv[4]) if len(sys.argv) > 4 else [], "cuda")


if __name__ == "__main__":
    main()
