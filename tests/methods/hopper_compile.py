"""Compile a split-K draft's main kernel for sm90 (no GPU needed) for every plan the visible panel gets (and the
inline-PTX dequants on one case), and its stream-K kernel (GRID 1) for each visible case; print JSON.

Usage: python tests/methods/hopper_compile.py SOLUTION_DIR   (without TRITON_INTERPRET: the interpreter never compiles)
"""
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from evals import kernel_harness as kh  # noqa: E402
from evals.loader import load_solution  # noqa: E402

POINTERS = {"x_ptr": "*fp16", "q_ptr": "*i32", "s_ptr": "*fp16", "b_ptr": "*fp16", "r_ptr": "*fp16", "out_ptr": "*fp16",
            "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}


def compile_sm90(kernel_fn, constants: dict, options: dict) -> dict:
    # the launches' own specialization: 16-byte aligned pointers, N and K divisible by 16
    source = ASTSource(fn=kernel_fn, constexprs=constants, signature=POINTERS | dict.fromkeys(constants, "constexpr"),
                       attrs={(i,): [["tt.divisibility", 16]] for i, name in enumerate(POINTERS) if name != "M"})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    ptx = kernel.asm["ptx"]
    # one launch: the last program reads the sums, then zeroes them, maybe in another thread layout; a barrier must
    # lie between the last read and the first zeroing store after it (one register repeated: the zeros)
    reads = ptx.rfind("ld.volatile.global")
    zeroing = re.search(r"st\.global(?:\.v\d)?\.b32 \[[^\]]*\], \{ (%r\d+)(?:, \1)* \}", ptx[reads:]) if reads >= 0 else None
    # the loop body: from the label that opens the block of the first MMA to the branch after the last one
    mma = [found.start() for found in re.finditer(r"wgmma\.mma_async", ptx)]
    body = ptx[ptx.rfind("$L__", 0, mma[0]):ptx.find("bra", mma[-1])] if mma else ""
    return {"shared": kernel.metadata.shared, "f16x2_dequant": "sub.f16x2" in ptx,
            "barrier_after_reads": bool(zeroing) and "bar.sync" in ptx[reads:reads + zeroing.start()],
            "wgmma": bool(mma),
            # the dequantized tile through shared memory: an ldmatrix in the loop body (an epilogue may use one)
            "ldmatrix_in_loop": "ldmatrix" in body, **options}


def main(solution: str) -> None:
    module = load_solution(Path(solution))
    done, compiled = set(), []
    cases = kh.load_panel("visible")
    # every visible plan, and the first case's with each dequant the tables do not use yet (inline PTX is assembled
    # by ptxas here, so a sequence it rejects shows on CPU)
    plans = [(case, None) for case in cases] + [(cases[0], {"DEQUANT": d}) for d in (2, 3)]
    for case, overrides in plans:
        cfg = module.plan(case.m, case.k, case.n, overrides)
        for mode in ((0, 1) if cfg["SPLIT_K"] > 1 else (0,)):
            constants = {"ACTIVATION": 0, "SPLIT_K": cfg["SPLIT_K"], "SWAP_AB": cfg["SWAP_AB"],
                         "LAYOUT": cfg["LAYOUT"] if cfg["SWAP_AB"] else 0, "UNPACK": cfg["UNPACK"],
                         "MAGIC": cfg["MAGIC"], "DEQUANT": cfg["DEQUANT"], "SCALE_AFTER_DOT": cfg["SCALE_AFTER_DOT"],
                         "REDUCE_MODE": mode,
                         "BLOCK_SIZE_M": cfg["BLOCK_SIZE_M"], "BLOCK_SIZE_N": cfg["BLOCK_SIZE_N"],
                         "BLOCK_SIZE_K": cfg["BLOCK_SIZE_K"]}
            options = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
            key = (tuple(sorted(constants.items())), tuple(sorted(options.items())))
            if key in done:
                continue
            done.add(key)
            compiled.append({"case": case.name, "kernel": "main", "reduce_mode": mode, "dequant": cfg["DEQUANT"],
                             "layout": constants["LAYOUT"], **compile_sm90(module.w4a16_main_kernel, constants, options)})
    for case in cases:  # GRID 1: one kernel whatever the split; its shared tiles always go through the accumulator
        cfg = module.plan(case.m, case.k, case.n, {"GRID": 1})
        constants = {"ACTIVATION": 0, "LAYOUT": cfg["LAYOUT"], "MAGIC": cfg["MAGIC"], "DEQUANT": cfg["DEQUANT"],
                     "SCALE_AFTER_DOT": cfg["SCALE_AFTER_DOT"], "BLOCK_SIZE_M": cfg["BLOCK_SIZE_M"],
                     "BLOCK_SIZE_N": cfg["BLOCK_SIZE_N"], "BLOCK_SIZE_K": cfg["BLOCK_SIZE_K"]}
        options = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
        key = ("stream", tuple(sorted(constants.items())), tuple(sorted(options.items())))
        if key in done:
            continue
        done.add(key)
        compiled.append({"case": case.name, "kernel": "stream", "reduce_mode": 1, "dequant": cfg["DEQUANT"],
                         "layout": cfg["LAYOUT"], **compile_sm90(module.w4a16_stream_kernel, constants, options)})
    print(json.dumps(compiled))


if __name__ == "__main__":
    main(sys.argv[1])
