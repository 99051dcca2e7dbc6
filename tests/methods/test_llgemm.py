"""The llgemm kernel family (tasks/llgemm, as v71 has it: v0's kernel with its split-K reduction ordered as CUTLASS's
semaphore, only the last share acquiring, the nearest-tier plan and the CUDA-core GEMV that sums across threads once,
its products summed VEC at a time in each thread, its next step's loads issued early with PREFETCH and its weight
loads kept out of L1 with WEIGHT_CG) under every plan shape its search space reaches: tensor-core and CUDA-core
reductions, one share or several, odd N and K, M from 1 to 16 and past it. On CPU the interpreter runs it; the
compile tests check the sm90 code without a GPU; the stress test (mark gpu) calls split plans many times on shapes
where a misordered split reduction returned zeros."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evals import task as tasks

ROOT = Path(__file__).resolve().parents[2]  # not tests.conftest's: it sets TRITON_INTERPRET, which split_order avoids
FAMILY = ROOT / "tasks" / "llgemm" / "versions" / "v71" / "solution.py"
TASK = tasks.load("llgemm")
ADAPTER = TASK.adapter


def family(**config):
    """A fresh copy of the family's module whose every shape takes ``config`` over its general table."""
    spec = importlib.util.spec_from_file_location(f"llgemm_family_{len(config)}", FAMILY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    general = module.get_config()
    module.get_config = lambda: {**general, **config}
    module.TIERS = []
    return module


def check(module, m: int, n: int, k: int, device, calls: int = 2) -> None:
    case = ADAPTER.Case("m1", m, n, k, seed=7)
    for mode in ADAPTER.MODES:
        problem = ADAPTER.generate(case, mode, device)
        fn = module.build(problem.weights["weight"])
        for inputs in [problem.inputs] + ADAPTER.make_inputs(case, calls - 1, seed=3, device=device):
            ref = ADAPTER.reference(problem.weights, inputs, case)
            result = ADAPTER.check_output(fn(*inputs), ref, case)
            assert result.ok, (mode, m, n, k, result.message)


PLANS = [dict(MMA=True, BLOCK_N=16, BLOCK_K=64, SPLIT_K=1), dict(MMA=True, BLOCK_N=32, BLOCK_K=64, SPLIT_K=4),
         dict(MMA=False, BLOCK_N=1, BLOCK_K=64, SPLIT_K=1), dict(MMA=False, BLOCK_N=4, BLOCK_K=32, SPLIT_K=8),
         dict(MMA=False, BLOCK_N=128, BLOCK_K=64, SPLIT_K=2),  # at M 16 plan() halves BLOCK_N to 32
         # VEC 8 needs 8 elements of K a thread and step: one warp and a 256-deep step
         dict(MMA=False, BLOCK_N=2, BLOCK_K=256, SPLIT_K=1, VEC=8, PREFETCH=True, num_warps=1),
         dict(MMA=False, BLOCK_N=4, BLOCK_K=256, SPLIT_K=2, VEC=8, num_warps=1),
         dict(MMA=False, BLOCK_N=1, BLOCK_K=32, SPLIT_K=4, PREFETCH=True),
         dict(MMA=False, BLOCK_N=2, BLOCK_K=64, SPLIT_K=2, PREFETCH=True, WEIGHT_CG=True)]


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
@pytest.mark.parametrize("m,n,k", [(1, 33, 200), (3, 40, 72), (16, 24, 136)])
def test_every_plan_shape_is_correct_on_every_input_regime(plan, m, n, k):
    if torch.cuda.is_available():
        pytest.skip("the interpreter's run of the family (the GPU stress test covers CUDA)")
    check(family(**plan), m, n, k, torch.device("cpu"))


@pytest.mark.parametrize("m,n,k", [(1, 33, 600), (5, 17, 520)])
def test_vec_and_prefetch_plans_are_correct_over_several_k_steps_and_shares(m, n, k):
    """VEC 2 to 8 (plan() halves the step for registers at M 5 and with two shares) and PREFETCH over two to five K
    steps, a partial last step (520) and two shares."""
    if torch.cuda.is_available():
        pytest.skip("the interpreter's run of the family (the GPU stress test covers CUDA)")
    for plan in (dict(MMA=False, BLOCK_N=2, BLOCK_K=256, SPLIT_K=1, VEC=8, PREFETCH=True, num_warps=1),
                 dict(MMA=False, BLOCK_N=4, BLOCK_K=256, SPLIT_K=2, VEC=8, PREFETCH=True, WEIGHT_CG=True,
                      num_warps=1)):
        module = family(**plan)
        p = module.plan(m, n, k)
        assert p["VEC"] >= 2 and p["TILES_PER_SPLIT"] >= 2, p
        check(module, m, n, k, torch.device("cpu"))


def test_more_than_sixteen_rows_go_to_the_baseline_and_a_split_leaves_no_state_between_calls():
    module = family(MMA=True, BLOCK_N=16, BLOCK_K=64, SPLIT_K=4)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check(module, 20, 24, 128, device)
    check(module, 2, 24, 512, device, calls=4)  # each call finds the workspace and counters left at zero


def test_plan_keeps_tiles_within_registers_and_the_pipeline_within_shared_memory():
    module = family()
    for config in ({"MMA": True, "BLOCK_N": 256, "BLOCK_K": 2048, "num_stages": 6},
                   {"MMA": False, "BLOCK_N": 64, "BLOCK_K": 2048, "num_warps": 4}):
        module.get_config = lambda config=config: {**family().get_config(), **config}
        for m in (1, 16):
            p = module.plan(m, 4096, 10240)
            elements = p["BLOCK_N"] * p["BLOCK_K"] * (1 if p["MMA"] else p["BLOCK_M"])
            limit = module.MAX_TILE if p["MMA"] else module.SUM_ELEMENTS_PER_WARP * p["num_warps"]
            # BLOCK_K halves down to 16 at the least; then a CUDA-core program's BLOCK_N halves
            assert elements <= limit or (p["MMA"] and p["BLOCK_K"] == 16), (m, p)
            assert p["num_stages"] * 2 * p["BLOCK_K"] * (p["BLOCK_N"] + p["BLOCK_M"]) <= module.SMEM_BYTES \
                or p["num_stages"] == 1
    # VEC 8 with PREFETCH: its sums and both steps' loaded tiles within the limit
    p = family(MMA=False, BLOCK_N=2, BLOCK_K=4096, num_warps=8, VEC=8, PREFETCH=True).plan(4, 320, 10240)
    assert p["VEC"] == 8 and p["PREFETCH"], p
    assert (p["BLOCK_N"] * p["BLOCK_M"] * p["BLOCK_K"] // 8 + (p["BLOCK_N"] + p["BLOCK_M"]) * p["BLOCK_K"]
            <= module.SUM_ELEMENTS_PER_WARP * 8), p
    # without PREFETCH, fewer sums in the same tile never take a step shallower than VEC 1, and at 2 or more outputs
    # a program (more sums than loaded elements) VEC 8 takes it deeper
    for block_n, warps, m in ((1, 1, 1), (1, 2, 2), (2, 8, 4), (8, 4, 2), (4, 4, 2)):
        vec1, vec8 = [family(MMA=False, BLOCK_N=block_n, BLOCK_K=4096, num_warps=warps, VEC=vec).plan(m, 320, 10240)
                      for vec in (1, 8)]
        assert vec8["VEC"] == 8 and vec8["BLOCK_K"] >= vec1["BLOCK_K"], (vec1, vec8)
        assert block_n == 1 or vec8["BLOCK_K"] > vec1["BLOCK_K"], (vec1, vec8)
    # a thread's VEC elements are its own: a 512-deep step over 4 warps gives each thread 4
    assert family(MMA=False, BLOCK_N=1, BLOCK_K=512, num_warps=4, VEC=8).plan(1, 64, 4096)["VEC"] == 4
    assert family(MMA=True, VEC=8, PREFETCH=True).plan(1, 64, 4096)["VEC"] == 1  # the dot has neither
    assert not family(MMA=True, VEC=8, PREFETCH=True).plan(1, 64, 4096)["PREFETCH"]
    assert not family(MMA=True, WEIGHT_CG=True).plan(1, 64, 4096)["WEIGHT_CG"]  # the dot's copies are the pipeline's
    assert family(MMA=False, WEIGHT_CG=True).plan(1, 64, 4096)["WEIGHT_CG"]
    assert family(MMA=True, BLOCK_N=4).plan(1, 64, 64)["BLOCK_N"] == 16  # a dot takes 16 columns at least
    assert family(SPLIT_K=32).plan(1, 64, 200)["SPLIT_K"] == 2  # no more shares than K steps (BLOCK_K 128)


def test_a_shape_no_tier_holds_takes_the_nearest_tier_of_its_m_within_the_ratio():
    spec = importlib.util.spec_from_file_location("llgemm_tiers", FAMILY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.TIERS = [{"M_MIN": 1, "M_MAX": 1, "N_MIN": 4096, "N_MAX": 4096, "K_MIN": 2560, "K_MAX": 2560, "SPLIT_K": 2},
                    {"M_MIN": 1, "M_MAX": 1, "N_MIN": 320, "N_MAX": 320, "K_MIN": 2560, "K_MAX": 2560, "SPLIT_K": 8},
                    {"M_MIN": 2, "M_MAX": 2, "N_MIN": 4000, "N_MAX": 4200, "K_MIN": 2560, "K_MAX": 2560, "SPLIT_K": 4}]
    tier = module.nearest_tier
    assert tier(1, 4096, 2560)["SPLIT_K"] == 2 and tier(2, 4100, 2560)["SPLIT_K"] == 4  # held
    assert tier(1, 4608, 3584)["SPLIT_K"] == 2 and tier(1, 512, 2048)["SPLIT_K"] == 8  # nearest in log N and log K
    assert tier(2, 1024, 2560)["SPLIT_K"] == 4  # only the tiers of its M
    assert tier(3, 4096, 2560) is None  # no tier of that M
    ratio = module.NEAREST_RATIO
    assert tier(1, int(4096 * ratio), 2560) is not None and tier(1, int(4096 * ratio) + 1, 2560) is None
    assert tier(1, 320, int(2560 * ratio) + 8) is None


SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "ws_ptr": "*fp32", "count_ptr": "*i32", "M": "i32",
             "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_ym": "i32",
             "tiles_per_split": "i32"}


def compile_sm90(constants: dict, num_warps: int = 4):
    """The family's kernel compiled for sm90 as a launch specializes it: pointers, N, K and the strides divisible by
    16 (else no 16-byte loads). Run without TRITON_INTERPRET: the interpreter never compiles."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(SIGNATURE)
               if name not in ("M", "tiles_per_split")}
    source = ASTSource(fn=family().skinny_gemm_kernel, signature=SIGNATURE | dict.fromkeys(constants, "constexpr"),
                       constexprs=constants, attrs=aligned)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def gemv_loops() -> list[dict]:
    """For GEMV plans (the CUDA-core path), the sm90 machine code of the K loop, the loop holding the 16-byte
    loads of W: its instruction count and its barriers, shuffles and shared-memory accesses."""
    from tests.methods.hopper_compile import _cubin_tool

    found = []
    for block_n, block_m, block_k, warps, vec, prefetch, cg in (
            (4, 1, 1024, 4, 1, False, False), (1, 2, 2048, 8, 1, False, False), (2, 2, 1024, 4, 1, False, False),
            (1, 4, 4096, 8, 8, True, False), (8, 1, 1024, 4, 8, False, False), (2, 8, 2048, 8, 8, True, False),
            (1, 8, 2048, 8, 8, False, True), (4, 2, 1024, 4, 8, True, True), (4, 1, 512, 4, 1, True, False)):
        constants = {"BLOCK_N": block_n, "BLOCK_K": block_k, "BLOCK_M": block_m, "SPLIT_K": 1, "EVEN_K": True,
                     "MMA": False, "F32_DOT": False, "VEC": vec, "PREFETCH": prefetch, "WEIGHT_CG": cg,
                     "X_LIKE_W": family().x_like_w(False, block_n, block_m, block_k, warps)}
        lines = _cubin_tool("nvdisasm", ["-c"], compile_sm90(constants, warps).asm["cubin"]).splitlines()
        labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", line))}
        loops = [lines[labels[m.group(1)]:i + 1] for i, line in enumerate(lines)
                 if (m := re.search(r"BRA `\((\.L_x_\d+)\)", line)) and labels.get(m.group(1), i) < i]
        body = next((loop for loop in loops if any("LDG.E.128" in line for line in loop)), [])
        code = [line for line in body if re.match(r"^\s+/\*[0-9a-f]+\*/\s+\S", line)]
        found.append({"plan": [block_n, block_m, block_k, warps, vec, prefetch, cg], "instructions": len(code),
                      "loads": sum("LDG.E.128" in line for line in code),
                      # ld.global.cg: a GPU-scope load, which L1 does not keep
                      "l2_only": sum("LDG.E.128.STRONG.GPU" in line for line in code),
                      "exchanges": sum(bool(re.search(r"\b(BAR|SHFL|STS|LDS|LDSM|STSM)\b", line)) for line in code)})
    return found


def in_compiler(expression: str):
    """``expression`` (over this module's names) evaluated in a process without the interpreter, as JSON."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", "import json; from tests.methods.test_llgemm import *; "
                          f"print(json.dumps({expression}))"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_gemv_loop_keeps_its_sums_in_registers_in_the_sm90_code():
    """The CUDA-core path's K loop: 16-byte loads of W and x and fp32 multiply-adds, and no exchange between threads
    (no barrier, shuffle or shared memory): the sums across threads come once, after the loop. VEC 8 sums a thread's
    own 16-byte load in registers, so it adds no exchange either; nor, at one row of x, does a K step shallower than
    16 bytes a thread (the first jump's tile, 4 outputs and BLOCK_K 512 on 4 warps), where x's tile loads in W's shape
    (x_like_w; at M over 1 such steps may still exchange, and no tile here has one).
    With WEIGHT_CG the weight's loads, and only they, skip L1: x's rows stay cached. Where a thread makes at least 32
    products a step, a product costs its multiply-add, the conversions of its x and W elements (each shared over the
    other's rows, one instruction an element as int32 pairs) and a share of the loads' addressing: at most 3.75
    instructions (the bf16 conversion's two for the top half of each pair and the masked loads' zero-fills made
    4.0-4.6 at most of these plans)."""
    for loop in in_compiler("gemv_loops()"):
        block_n, block_m, block_k, warps, vec, prefetch, cg = loop["plan"]
        assert loop["loads"] >= 2 and loop["exchanges"] == 0, loop
        weight_loads = block_n * block_k // (8 * 32 * warps)  # 16-byte loads a step (8 elements each)
        per_step = max(1, weight_loads + block_m * block_k // (8 * 32 * warps))
        # the compiler may unroll the loop; this counts steps by 16-byte loads, each element of x once a thread
        steps = max(1, loop["loads"] // per_step)
        assert loop["l2_only"] == (weight_loads * steps if cg else 0), loop
        assert loop["loads"] - loop["l2_only"] >= block_m, loop  # x's loads, a row at least, stay in L1
        products = block_n * block_m * block_k // (32 * warps)  # a thread's, a step
        if products >= 32:
            assert loop["instructions"] <= 3.75 * products * steps, loop


def split_order() -> list[dict]:
    """Compile the family's split plans for sm90 (run without TRITON_INTERPRET: the interpreter never compiles) and
    say how a share's epilogue orders its memory operations in the PTX: its workspace adds (relaxed), a barrier, the
    counter's add (a release of the whole program's adds), the barrier that passes the counter's value on, the last
    share's reset of the counter (its acquire), a barrier, its reads (L2, not L1), a barrier and the zeroing; whether
    any fence.sc.gpu is left; and, in the machine code, which atomics an L1 invalidation (CCTL.IVALL) follows."""
    from tests.methods.hopper_compile import _cubin_tool

    found = []
    for mma, block_m, block_n in ((True, 16, 64), (False, 1, 4)):
        constants = {"BLOCK_N": block_n, "BLOCK_K": 128, "BLOCK_M": block_m, "SPLIT_K": 4, "EVEN_K": True,
                     "MMA": mma, "F32_DOT": False, "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False,
                     "X_LIKE_W": family().x_like_w(mma, block_n, block_m, 128, 4)}
        compiled = compile_sm90(constants)
        lines = compiled.asm["ptx"].splitlines()
        adds = [i for i, line in enumerate(lines) if re.search(r"atom\.global\S*\.add(\.v\d)?\.f32", line)]
        counters = [i for i, line in enumerate(lines) if "atom.global" in line and ".add.u32" in line]
        reads = [i for i, line in enumerate(lines) if "ld.global.cg" in line]
        # the workspace's zeroing: the stores of the register the counter's reset writes (zero)
        resets = [(i, m.group(1)) for i, line in enumerate(lines)
                  if (m := re.search(r"atom\.global\S*\.exch\.b32 .*, (%r\d+);", line))]
        zeroing = [i for i, line in enumerate(lines) if reads and resets and i > min(reads)
                   and re.search(r"st\.global\S* \[.*\], \{ " + resets[0][1] + r"\b", line)]
        barriers = [i for i, line in enumerate(lines) if "bar.sync" in line]

        def barrier_between(first: list[int], then: list[int]) -> bool:
            return bool(first and then) and any(max(first) < b < min(then) for b in barriers)

        sass = [line for line in _cubin_tool("nvdisasm", ["-c"], compiled.asm["cubin"]).splitlines()
                if re.match(r"^\s+/\*[0-9a-f]+\*/\s+\S", line)]
        atomics = [i for i, line in enumerate(sass) if re.search(r"\bATOMG?\.", line)]
        found.append({
            "mma": mma, "complete": bool(adds and len(counters) == 1 and len(resets) == 1 and reads and zeroing),
            "relaxed_adds": bool(adds) and all(".relaxed." in lines[i] for i in adds),
            "release_counter": len(counters) == 1
            and all(f".{word}." in lines[counters[0]] for word in ("release", "gpu")),
            "acquire_reset": len(resets) == 1
            and all(f".{word}." in lines[resets[0][0]] for word in ("acquire", "gpu")),
            "adds_barrier_counter": barrier_between(adds, counters),
            "counter_barrier_reset": barrier_between(counters, [i for i, _ in resets]),
            # only the last share resets: a compare of the counter's value with SPLIT_K - 1 (3 here), then a branch,
            # between the counter's add and the reset
            "reset_in_last_share": bool(counters and resets) and any(
                counters[0] < i < j < resets[0][0] and re.search(r"setp\.\w+\.[bsu]32\s+%p\d+, %r\d+, 3;", line)
                and re.search(r"@!?%p\d+\s+bra", lines[j])
                for i, line in enumerate(lines) for j in range(i + 1, i + 3)),
            "reset_barrier_reads": barrier_between([i for i, _ in resets], reads),
            "reads_barrier_zeroing": barrier_between(reads, zeroing),
            "sc_fences": sum("fence.sc" in line for line in lines),
            # each L1 invalidation, as the last atomic before it: only the reset's exchange should have one
            "invalidated_after": [re.search(r"ATOMG?\.\S+", sass[max(a for a in atomics if a < i)]).group(0)
                                  for i, line in enumerate(sass) if "CCTL.IVALL" in line
                                  and any(a < i for a in atomics)]})
    return found


def test_the_split_reduction_orders_its_adds_as_a_semaphore_in_the_sm90_code():
    """Compiled for sm90 (no GPU needed), in a process without the interpreter: CUTLASS's split-K semaphore, as the
    W4A16 task's kernels have it. Every thread's adds come before the barrier and the barrier before the counter's
    add by one thread, a release cumulative at GPU scope. Only the last share acquires, by resetting the counter
    (every share has counted), before a barrier and its reads: an acquire invalidates the SM's whole L1, where the
    SM's other programs keep the rows of x, so the other shares must not. The last share zeroes the workspace only
    after a barrier: the zeros go out in the store's layout, by threads other than the ones that read. No
    fence.sc.gpu in every thread (a GPU-wide membar and an invalidation of the SM's L1 each)."""
    found = in_compiler("split_order()")
    assert len(found) == 2, found
    for f in found:
        assert f["complete"] and f["relaxed_adds"] and f["release_counter"] and f["acquire_reset"], f
        assert f["adds_barrier_counter"] and f["counter_barrier_reset"] and f["reset_barrier_reads"], f
        assert f["reset_in_last_share"], f
        assert f["reads_barrier_zeroing"] and f["sc_fences"] == 0, f
        assert f["invalidated_after"] and all(op.startswith("ATOMG.E.EXCH") for op in f["invalidated_after"]), f


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(4, 62080, 2560), (8, 62080, 2560), (4, 10240, 320), (1, 24, 2560),
                                   (5, 1001, 2560)])  # the last: rows of W and x past the end read the last one
def test_split_plans_stay_correct_over_many_calls_on_the_gpu(m, n, k):
    for plan in (dict(MMA=True, BLOCK_N=64, SPLIT_K=2), dict(MMA=True, BLOCK_N=32, SPLIT_K=32, BLOCK_K=64),
                 dict(MMA=False, BLOCK_N=2, SPLIT_K=8, BLOCK_K=256),
                 # the jumps' GEMV plans, and one whose K step is narrower than its threads (K slices repeated)
                 dict(MMA=False, BLOCK_N=4, BLOCK_K=1024, num_warps=4, SPLIT_K=4),
                 dict(MMA=False, BLOCK_N=1, BLOCK_K=2048, num_warps=8, SPLIT_K=2),
                 dict(MMA=False, BLOCK_N=2, BLOCK_K=64, num_warps=4, SPLIT_K=8),
                 dict(MMA=False, BLOCK_N=4, BLOCK_K=2048, num_warps=8, SPLIT_K=4, VEC=8, PREFETCH=True),
                 dict(MMA=False, BLOCK_N=1, BLOCK_K=2048, num_warps=8, SPLIT_K=2, VEC=8, WEIGHT_CG=True),
                 # the first jump, unsplit: x's tile loads in W's shape
                 dict(MMA=False, BLOCK_N=4, BLOCK_K=512, num_warps=4, SPLIT_K=1, PREFETCH=True)):
        check(family(**plan), m, n, k, torch.device("cuda"), calls=64)


class Launched(RuntimeError):
    pass


class NoLaunch:
    """Stands in for the kernel where a launch must not happen."""

    def __getitem__(self, grid):
        raise Launched(f"the kernel was launched (grid {grid})")


def misaligned(values: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``values`` whose base is 2 bytes off 4-byte alignment."""
    buffer = torch.empty(values.numel() + 1, dtype=values.dtype, device=values.device)
    view = buffer[1:].view(values.shape)
    view.copy_(values)
    assert view.is_contiguous() and view.data_ptr() % 4 == 2
    return view


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_an_x_or_weight_two_bytes_off_alignment_goes_to_the_baseline(device):
    """The GEMV reads x and W as int32 pairs, so a base 2 bytes off 4-byte alignment (a view outside the contract's
    aligned rows) must not reach it: such a call goes to F.linear. On CPU the kernel is replaced by one that refuses
    to launch (the interpreter would read the odd address without complaint); on the GPU the real kernel would fault,
    and the answers are checked."""
    m, n, k = 3, 40, 72
    case = ADAPTER.Case("m4", m, n, k, seed=7)
    problem = ADAPTER.generate(case, "normal", torch.device(device))
    weight, x = problem.weights["weight"], problem.inputs[0]
    module = family(MMA=False, BLOCK_N=4, BLOCK_K=64, SPLIT_K=1)
    if device == "cpu":
        module.skinny_gemm_kernel = NoLaunch()
        with pytest.raises(Launched):  # aligned, the GEMV runs
            module.build(weight)(x)
    ref = ADAPTER.reference(problem.weights, (x,), case)
    for fn, inputs in ((module.build(weight), misaligned(x)), (module.build(misaligned(weight)), x)):
        result = ADAPTER.check_output(fn(inputs), ref, case)
        assert result.ok, result.message
