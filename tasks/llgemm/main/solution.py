"""llgemm: y = x @ W.T for decode (M 1..16), one Triton program per BLOCK_N output columns and K slice.

Contract (tasks/llgemm/spec.md):
    build(weight, config=None) -> fn;  fn(x) -> y      (config: knob overrides over every shape's plan, for sweeps)
    weight bf16 (N, K), as nn.Linear holds it;  x bf16 (M, K);  y bf16 (M, N), a fresh tensor on every call
Any M >= 1 and K % 8 == 0 is computed; M over 16 goes to torch.nn.functional.linear.

How: y^T = W x^T. With MMA a program's BLOCK_N weight rows are a tensor-core dot's first operand and the M rows of
x, padded to 16, its second: a thin M wastes no weight bytes. Without MMA a program is a GEMV on the CUDA cores: each
thread multiplies its slice of the BLOCK_N rows' K step by every row of x (both read as int32 pairs of bf16, each
bf16 made fp32 by one shift or one mask) and keeps the products in fp32 registers, a pair's two or VEC neighbours of
K summed into one, and the sums across threads come once, after the K loop (BLOCK_N outputs per
program; BLOCK_K / (32 * num_warps) elements of K per thread and step: the seed's outputs per CTA, and its vector
width times K unroll); with PREFETCH each step's loads go out one step ahead; with WEIGHT_CG the weight's loads are
ld.global.cg (cached in L2, not L1), which leaves L1 to the rows of x. Each program walks its share of the K
range (SPLIT_K shares per column block); with SPLIT_K > 1 the shares add their fp32 partial sums into a workspace
kept by build and count themselves in per column block, and the last one writes y and leaves workspace and counter
at zero, so a call is one launch.
Per shape the plan comes from the first tier of TIERS holding (M, N, K); a shape no tier holds takes the tier of its M
range nearest in N and K (within a factor of 4 in each), else get_config(). A tier's FALLBACK sends its shapes to
torch.nn.functional.linear.
Kept after build: a reference to the weight, the fp32 workspace (16 * N * 4 bytes) and the counters (N int32: one
per column block of at least one column).
"""
import torch
import triton
import triton.language as tl

MAX_M = 16  # rows of x one launch takes (the dot's padded operand); more go to torch.nn.functional.linear
MAX_TILE = 32768  # weight elements of an MMA program's K step: BLOCK_K is halved until BLOCK_N * BLOCK_K fits
SUM_ELEMENTS_PER_WARP = 2048  # fp32 partial sums a CUDA-core program keeps per warp (64 registers a thread)
SMEM_BYTES = 200 * 1024  # shared memory the pipeline may take: num_stages is lowered until its buffers fit
NEAREST_RATIO = 4.0  # a shape no tier holds takes a tier of its M whose N and K ranges are within this factor


def get_config():
    return {"MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2,
            "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False}


SEARCH_SPACE = {
    "strategy": "per-table",
    "knobs": {
        "BLOCK_N": {"values": [256, 128, 64, 32, 16, 8, 4, 2, 1],
                    "reason": {"up": "fewer output columns per program: more programs for the SMs",
                               "down": "more output columns per program: fewer programs and partial sums"}},
        "SPLIT_K": {"values": [1, 2, 4, 8, 16, 32],
                    "reason": {"up": "more K shares per column block: more programs for the SMs and more of the "
                                     "weight stream in flight where N is narrow",
                               "down": "fewer K shares: less atomic traffic and a shorter reduction by the last one"}},
        "MMA": {"values": [True, False],
                "reason": {"up": "a GEMV on the CUDA cores, its sums across threads once after the K loop: no "
                                 "padding of M to 16 and any number of output columns per program",
                           "down": "tensor-core dot again: x's rows padded to 16, at least 16 columns per program"}},
        "BLOCK_K": {"values": [32, 64, 128, 256, 512, 1024, 2048, 4096],
                    "reason": {"up": "a longer K step: more bytes per load and fewer loop trips; a GEMV issues a "
                                     "step's loads at once, so a step as deep as K keeps a row's whole weight in flight",
                               "down": "a shorter K step: smaller buffers, so a deeper pipeline fits"}},
        "num_warps": {"values": [1, 2, 4, 8, 16, 32],
                      "reason": {"up": "more warps per program issue more loads at once",
                                 "down": "fewer warps per program: more programs resident per SM"}},
        "num_stages": {"values": [1, 2, 3, 4, 5, 6],
                       "reason": {"up": "a deeper pipeline keeps more weight loads in flight",
                                  "down": "a shallower pipeline leaves shared memory for more programs per SM"}},
        "VEC": {"values": [1, 8],
                "reason": {"up": "a GEMV thread sums its 8 neighbouring products of K at once: a quarter of the "
                                 "partial sums in registers, so more programs fit an SM (and, at 2 or more outputs "
                                 "per program, deeper K steps at M over 2)",
                           "down": "only a pair's two products summed; the other sums kept apart until the loop "
                                   "ends"}},
        "PREFETCH": {"values": [False, True],
                     "reason": {"up": "a GEMV step issues the next step's loads before its multiply-adds: one wait "
                                      "on memory a program, not one a step",
                                "down": "one step's tiles in registers at a time: fewer registers a thread"}},
        "WEIGHT_CG": {"values": [False, True],
                      "reason": {"up": "the weight's loads skip L1 (ld.global.cg), which the weight stream passes "
                                       "through once: L1 holds only x's rows, which every program of an SM reads",
                                 "down": "the weight's loads allocate in L1 again"}},
        "FALLBACK": {"values": [False, True],
                     "reason": {"up": "torch.nn.functional.linear (cuBLAS) beats this kernel on these shapes",
                                "down": "this kernel again on these shapes"}},
    },
    "only_when": {"BLOCK_N": [{"FALLBACK": [False]}], "SPLIT_K": [{"FALLBACK": [False]}],
                  "MMA": [{"FALLBACK": [False]}], "BLOCK_K": [{"FALLBACK": [False]}],
                  "num_warps": [{"FALLBACK": [False]}],
                  "VEC": [{"FALLBACK": [False], "MMA": [False]}], "PREFETCH": [{"FALLBACK": [False], "MMA": [False]}],
                  "WEIGHT_CG": [{"FALLBACK": [False], "MMA": [False]}],
                  # only the dot's loads are pipelined: a GEMV plan compiles to the same sm90 code at any num_stages
                  "num_stages": [{"FALLBACK": [False], "MMA": [True]}]},
    "refused": [{"when": {"MMA": [True], "BLOCK_N": [8, 4, 2, 1]},
                 "reason": "a tensor-core dot takes at least 16 output columns (plan() would run 16)"}],
    # the GEMV's good tiles (a few columns, a long K step) are the dot's refused or worst ones: one-knob moves from
    # one path never reach the other's; the unsplit ones sit several moves, each needing a win, from a split plan
    # (one informational sweep: reports/examples/llgemm-seed002/README.md, "Unsplit GEMV plans")
    "jumps": [{"to": {"FALLBACK": False, "MMA": False, "BLOCK_N": 4, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 4,
                      "VEC": 1, "PREFETCH": True},
               "reason": "the unsplit GEMV at 4 outputs per program with the next step's loads issued early: for wide "
                         "N, x read once for four rows and no program waits on memory once a step"},
              {"to": {"FALLBACK": False, "MMA": False, "BLOCK_N": 2, "BLOCK_K": 2048, "SPLIT_K": 1, "num_warps": 8,
                      "VEC": 1, "PREFETCH": False},
               "reason": "the unsplit GEMV at 2 outputs per program and 8 warps: x's rows read once for two weight "
                         "rows, for M 3-4 over deep K"},
              {"to": {"FALLBACK": False, "MMA": False, "BLOCK_N": 1, "BLOCK_K": 4096, "SPLIT_K": 1, "num_warps": 8,
                      "VEC": 8, "PREFETCH": False},
               "reason": "the unsplit GEMV with a thread's 8 products summed at once: about half the registers a "
                         "thread at M 3-8, so twice the programs fit an SM"},
              {"to": {"FALLBACK": False, "MMA": False, "BLOCK_N": 4, "BLOCK_K": 1024, "SPLIT_K": 1, "num_warps": 4,
                      "VEC": 8, "PREFETCH": False},
               "reason": "the unsplit GEMV at 4 outputs per program with a thread's 8 products summed at once: for "
                         "wide N at M 2, x read once for four rows in a quarter of VEC 1's registers"},
              {"to": {"FALLBACK": False, "MMA": False, "BLOCK_N": 8, "BLOCK_K": 1024, "SPLIT_K": 1, "num_warps": 4,
                      "VEC": 8, "PREFETCH": False},
               "reason": "the unsplit GEMV at 8 outputs per program with VEC 8: the widest N, x read once for eight "
                         "rows"},
              {"to": {"FALLBACK": False, "MMA": False, "BLOCK_N": 2, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 4,
                      "VEC": 1, "PREFETCH": False},
               "reason": "the unsplit GEMV at 2 outputs per program and a 512-deep step: few enough sums for M 5-16"},
              {"to": {"FALLBACK": False, "MMA": False, "BLOCK_N": 16, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 4,
                      "VEC": 1, "PREFETCH": True},
               "reason": "the unsplit GEMV at 16 outputs per program, 8 threads a row and a 64-deep step, for short K "
                         "at M 1-4 (10240 x 320: a row is 640 bytes, 5 steps of one 16-byte load a thread): every "
                         "thread loads from the first step, where a step as deep as a 512-wide tile leaves most of "
                         "them masked (at M 5-16 plan() cuts the step to 16-32: a loser there)"},
              {"to": {"FALLBACK": False, "MMA": False, "BLOCK_N": 1, "BLOCK_K": 4096, "SPLIT_K": 1, "num_warps": 8},
               "reason": "the unsplit CUDA-core GEMV, 1 output per program, a K step as deep as a 2560-deep row: no "
                         "reduction across programs, whose atomics, fences and counter cost more than they save"},
              {"to": {"FALLBACK": False, "MMA": False, "BLOCK_N": 1, "BLOCK_K": 2048, "SPLIT_K": 1, "num_warps": 16},
               "reason": "the unsplit GEMV with 16 warps: twice the loads in flight per program, for deep K"},
              {"to": {"FALLBACK": False, "MMA": False, "BLOCK_N": 2, "BLOCK_K": 1024, "SPLIT_K": 1, "num_warps": 4},
               "reason": "the unsplit GEMV at 2 outputs per program: x's rows reused across two weight rows"},
              {"to": {"MMA": False, "BLOCK_N": 4, "BLOCK_K": 1024, "num_warps": 4},
               "reason": "the CUDA-core GEMV at 4 outputs per program, one 16-byte load per row and thread a step"},
              {"to": {"MMA": False, "BLOCK_N": 1, "BLOCK_K": 2048, "num_warps": 8},
               "reason": "the CUDA-core GEMV at 1 output per program and 8 warps: the most programs for narrow N"},
              # tensor-core split plans for M 5-16 at narrow N: one sweep of them beat F.linear 1.06-1.30x in both
              # regimes at four points v71 sends to it (reports/examples/llgemm-seed002/README.md, "v71 on the H200")
              {"to": {"FALLBACK": False, "MMA": True, "BLOCK_N": 16, "BLOCK_K": 128, "SPLIT_K": 16, "num_warps": 4,
                      "num_stages": 4},
               "reason": "the tensor-core dot at 16 columns a program, K in up to 16 shares, 4 stages: at M 5-16 a "
                         "program converts its x tile once per step where a GEMV thread converts every element, "
                         "and narrow N still fills the SMs"},
              {"to": {"FALLBACK": False, "MMA": True, "BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 8, "num_warps": 4,
                      "num_stages": 3},
               "reason": "the tensor-core dot at 32 columns a program, a 256-deep step in up to 8 shares, 3 stages: "
                         "half the programs and partial sums of 16 columns and 16 shares"}],
}

# Per shape: M in the scored strata's ranges (1, 2, 3-4, 5-8, 9-16), N and K exact; every tier starts at the
# general configuration, and the loop moves them.
TIERS = [
    {"M_MIN": 1, "M_MAX": 1, "N_MIN": 4096, "N_MAX": 4096, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 4, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2,
     "VEC": 1, "PREFETCH": True, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 2, "M_MAX": 2, "N_MIN": 4096, "N_MAX": 4096, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 4, "BLOCK_K": 1024, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2,
     "VEC": 8, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 3, "M_MAX": 4, "N_MIN": 4096, "N_MAX": 4096, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 8, "num_warps": 4, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": True},
    {"M_MIN": 5, "M_MAX": 8, "N_MIN": 4096, "N_MAX": 4096, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 8, "num_warps": 4, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": True},
    {"M_MIN": 9, "M_MAX": 16, "N_MIN": 4096, "N_MAX": 4096, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": 4, "num_warps": 4, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": True},
    {"M_MIN": 1, "M_MAX": 1, "N_MIN": 2560, "N_MAX": 2560, "K_MIN": 1536, "K_MAX": 1536,
     "MMA": False, "BLOCK_N": 2, "BLOCK_K": 2048, "SPLIT_K": 4, "num_warps": 8, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 2, "M_MAX": 2, "N_MIN": 2560, "N_MAX": 2560, "K_MIN": 1536, "K_MAX": 1536,
     "MMA": False, "BLOCK_N": 4, "BLOCK_K": 2048, "SPLIT_K": 4, "num_warps": 8, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 3, "M_MAX": 4, "N_MIN": 2560, "N_MAX": 2560, "K_MIN": 1536, "K_MAX": 1536,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 8, "num_warps": 4, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": True},
    {"M_MIN": 5, "M_MAX": 8, "N_MIN": 2560, "N_MAX": 2560, "K_MIN": 1536, "K_MAX": 1536,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 8, "num_warps": 4, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": True},
    {"M_MIN": 9, "M_MAX": 16, "N_MIN": 2560, "N_MAX": 2560, "K_MIN": 1536, "K_MAX": 1536,
     "MMA": True, "BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": 4, "num_warps": 4, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": True},
    {"M_MIN": 1, "M_MAX": 1, "N_MIN": 24, "N_MAX": 24, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 4096, "SPLIT_K": 1, "num_warps": 8, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 2, "M_MAX": 2, "N_MIN": 24, "N_MAX": 24, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 4096, "SPLIT_K": 1, "num_warps": 16, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 3, "M_MAX": 4, "N_MIN": 24, "N_MAX": 24, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 4096, "SPLIT_K": 1, "num_warps": 16, "num_stages": 3,
     "VEC": 8, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 5, "M_MAX": 8, "N_MIN": 24, "N_MAX": 24, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 4096, "SPLIT_K": 1, "num_warps": 16, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 9, "M_MAX": 16, "N_MIN": 24, "N_MAX": 24, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 16, "BLOCK_K": 128, "SPLIT_K": 32, "num_warps": 4, "num_stages": 4,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 1, "M_MAX": 1, "N_MIN": 3584, "N_MAX": 3584, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 4, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2,
     "VEC": 1, "PREFETCH": True, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 2, "M_MAX": 2, "N_MIN": 3584, "N_MAX": 3584, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 4, "BLOCK_K": 1024, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2,
     "VEC": 8, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 3, "M_MAX": 4, "N_MIN": 3584, "N_MAX": 3584, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 8, "num_warps": 4, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": True},
    {"M_MIN": 5, "M_MAX": 8, "N_MIN": 3584, "N_MAX": 3584, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 8, "num_warps": 4, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": True},
    {"M_MIN": 9, "M_MAX": 16, "N_MIN": 3584, "N_MAX": 3584, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 8, "num_warps": 4, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": True},
    {"M_MIN": 1, "M_MAX": 1, "N_MIN": 640, "N_MAX": 640, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 4096, "SPLIT_K": 1, "num_warps": 8, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 2, "M_MAX": 2, "N_MIN": 640, "N_MAX": 640, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 4096, "SPLIT_K": 1, "num_warps": 8, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 3, "M_MAX": 4, "N_MIN": 640, "N_MAX": 640, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 4096, "SPLIT_K": 1, "num_warps": 8, "num_stages": 2,
     "VEC": 8, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 5, "M_MAX": 8, "N_MIN": 640, "N_MAX": 640, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 32, "num_warps": 4, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 9, "M_MAX": 16, "N_MIN": 640, "N_MAX": 640, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": 32, "num_warps": 4, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 1, "M_MAX": 1, "N_MIN": 320, "N_MAX": 320, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 4096, "SPLIT_K": 1, "num_warps": 8, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 2, "M_MAX": 2, "N_MIN": 320, "N_MAX": 320, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 2, "BLOCK_K": 4096, "SPLIT_K": 1, "num_warps": 8, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 3, "M_MAX": 4, "N_MIN": 320, "N_MAX": 320, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 4096, "SPLIT_K": 8, "num_warps": 8, "num_stages": 2,
     "VEC": 8, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 5, "M_MAX": 8, "N_MIN": 320, "N_MAX": 320, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": False, "BLOCK_N": 2, "BLOCK_K": 2048, "SPLIT_K": 1, "num_warps": 8, "num_stages": 2,
     "VEC": 1, "PREFETCH": True, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 9, "M_MAX": 16, "N_MIN": 320, "N_MAX": 320, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": 16, "num_warps": 4, "num_stages": 4,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 1, "M_MAX": 1, "N_MIN": 62080, "N_MAX": 62080, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 5,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 2, "M_MAX": 2, "N_MIN": 62080, "N_MAX": 62080, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 3, "M_MAX": 4, "N_MIN": 62080, "N_MAX": 62080, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 5, "M_MAX": 8, "N_MIN": 62080, "N_MAX": 62080, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 9, "M_MAX": 16, "N_MIN": 62080, "N_MAX": 62080, "K_MIN": 2560, "K_MAX": 2560,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 1, "M_MAX": 1, "N_MIN": 336, "N_MAX": 336, "K_MIN": 10240, "K_MAX": 10240,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 2048, "SPLIT_K": 1, "num_warps": 16, "num_stages": 2,
     "VEC": 1, "PREFETCH": True, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 2, "M_MAX": 2, "N_MIN": 336, "N_MAX": 336, "K_MIN": 10240, "K_MAX": 10240,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 4096, "SPLIT_K": 1, "num_warps": 16, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 3, "M_MAX": 4, "N_MIN": 336, "N_MAX": 336, "K_MIN": 10240, "K_MAX": 10240,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 2048, "SPLIT_K": 1, "num_warps": 8, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 5, "M_MAX": 8, "N_MIN": 336, "N_MAX": 336, "K_MIN": 10240, "K_MAX": 10240,
     "MMA": True, "BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": 16, "num_warps": 4, "num_stages": 4,
     "VEC": 8, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 9, "M_MAX": 16, "N_MIN": 336, "N_MAX": 336, "K_MIN": 10240, "K_MAX": 10240,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 16, "num_warps": 4, "num_stages": 4,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 1, "M_MAX": 1, "N_MIN": 10240, "N_MAX": 10240, "K_MIN": 320, "K_MAX": 320,
     "MMA": False, "BLOCK_N": 4, "BLOCK_K": 512, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3,
     "VEC": 1, "PREFETCH": True, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 2, "M_MAX": 2, "N_MIN": 10240, "N_MAX": 10240, "K_MIN": 320, "K_MAX": 320,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 3, "M_MAX": 4, "N_MIN": 10240, "N_MAX": 10240, "K_MIN": 320, "K_MAX": 320,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 5, "M_MAX": 8, "N_MIN": 10240, "N_MAX": 10240, "K_MIN": 320, "K_MAX": 320,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 4, "num_stages": 4,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 9, "M_MAX": 16, "N_MIN": 10240, "N_MAX": 10240, "K_MIN": 320, "K_MAX": 320,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 1, "M_MAX": 1, "N_MIN": 320, "N_MAX": 320, "K_MIN": 10240, "K_MAX": 10240,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 2048, "SPLIT_K": 1, "num_warps": 16, "num_stages": 2,
     "VEC": 1, "PREFETCH": True, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 2, "M_MAX": 2, "N_MIN": 320, "N_MAX": 320, "K_MIN": 10240, "K_MAX": 10240,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 4096, "SPLIT_K": 1, "num_warps": 16, "num_stages": 2,
     "VEC": 8, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 3, "M_MAX": 4, "N_MIN": 320, "N_MAX": 320, "K_MIN": 10240, "K_MAX": 10240,
     "MMA": False, "BLOCK_N": 1, "BLOCK_K": 2048, "SPLIT_K": 1, "num_warps": 8, "num_stages": 2,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 5, "M_MAX": 8, "N_MIN": 320, "N_MAX": 320, "K_MIN": 10240, "K_MAX": 10240,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 16, "num_warps": 4, "num_stages": 5,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
    {"M_MIN": 9, "M_MAX": 16, "N_MIN": 320, "N_MAX": 320, "K_MIN": 10240, "K_MAX": 10240,
     "MMA": True, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 16, "num_warps": 4, "num_stages": 4,
     "VEC": 1, "PREFETCH": False, "WEIGHT_CG": False, "FALLBACK": False},
]


def nearest_tier(M, N, K):
    """The tier holding (M, N, K); else, among the tiers whose M range holds M, the one nearest in log2 N and log2 K
    within NEAREST_RATIO in each (a shape nobody tuned runs the plan of the most alike tuned one); else None."""
    near, best = None, None
    for tier in TIERS:
        if not tier["M_MIN"] <= M <= tier["M_MAX"]:
            continue
        if tier["N_MIN"] <= N <= tier["N_MAX"] and tier["K_MIN"] <= K <= tier["K_MAX"]:
            return tier
        n = max(tier["N_MIN"] / N, N / tier["N_MAX"], 1.0)  # how far outside the tier's ranges, as a ratio
        k = max(tier["K_MIN"] / K, K / tier["K_MAX"], 1.0)
        if n <= NEAREST_RATIO and k <= NEAREST_RATIO and (best is None or n * k < best):
            near, best = tier, n * k
    return near


def check_overrides(overrides):
    """``overrides`` (a dict of knobs of get_config, or None) as a dict; an unknown knob or a value of the wrong kind
    raises ValueError naming what is allowed."""
    overrides = dict(overrides or {})
    general = get_config()
    unknown = sorted(set(overrides) - set(general))
    if unknown:
        raise ValueError(f"unknown knob(s) {', '.join(unknown)}; the plan's knobs are {', '.join(general)}")
    for knob, value in overrides.items():
        if isinstance(general[knob], bool) != isinstance(value, bool) or not isinstance(value, int) or (
                not isinstance(value, bool) and value < 1):
            kind = "True or False" if isinstance(general[knob], bool) else "a positive int"
            raise ValueError(f"knob {knob} must be {kind}; got {value!r}")
    return overrides


def plan(M, N, K, overrides=None):
    """The launch plan of an (M, N, K) call: the nearest tier (``nearest_tier``), else the general table, then
    ``overrides`` (check_overrides), with the tile, the split and the pipeline brought within what the shape and the
    hardware allow: BLOCK_K halves (down to 16) until a program's registers hold its tile, then, for a CUDA-core
    program, BLOCK_N halves; VEC is at most the elements of K a thread loads a step."""
    config = get_config()
    config.update(nearest_tier(M, N, K) or {})
    config.update(check_overrides(overrides))
    mma = config["MMA"]
    block_m = MAX_M if mma else triton.next_power_of_2(M)
    block_n = max(config["BLOCK_N"], 16) if mma else config["BLOCK_N"]  # tl.dot needs 16 along each dimension
    block_k = min(config["BLOCK_K"], max(16, triton.next_power_of_2(K)))
    threads = 32 * config["num_warps"]
    prefetch = not mma and config["PREFETCH"]
    weight_cg = not mma and config["WEIGHT_CG"]  # the dot's loads are the pipeline's copies into shared memory

    def vec_of(block_k):
        """VEC as a step of BLOCK_K allows: a thread's VEC elements are its own, of the BLOCK_K / threads it loads."""
        return 1 if mma else max(1, min(config["VEC"], block_k // threads))

    def held(block_n, block_k):
        """Elements a program holds through its K loop. An MMA program: its (BLOCK_N, BLOCK_K) tile. A CUDA-core
        one: its (BLOCK_N, BLOCK_M, BLOCK_K) partial sums, the measure that keeps VEC 1 plans unspilled (past it
        ptxas spills: 255 registers and 69 spilled stores at BLOCK_N 128, M 16, BLOCK_K 16, 4 warps); with VEC or
        PREFETCH its BLOCK_K / VEC sums and its loaded tiles as bf16 pairs (twice with PREFETCH), and without
        PREFETCH never more than at VEC 1: fewer sums in the same tile never take a step shallower."""
        if mma:
            return block_n * block_k
        every = block_n * block_m * block_k
        vec = vec_of(block_k)
        if vec == 1 and not prefetch:
            return every
        fewer = block_n * block_m * block_k // vec + (block_n + block_m) * block_k // 2 * (2 if prefetch else 1)
        return fewer if prefetch else min(every, fewer)

    limit = MAX_TILE if mma else SUM_ELEMENTS_PER_WARP * config["num_warps"]
    while block_k > 16 and held(block_n, block_k) > limit:
        block_k //= 2
    while not mma and block_n > 1 and held(block_n, block_k) > limit:
        block_n //= 2
    vec = vec_of(block_k)
    k_tiles = triton.cdiv(K, block_k)
    per_split = triton.cdiv(k_tiles, min(config["SPLIT_K"], k_tiles))
    stages = config["num_stages"]
    while stages > 1 and stages * 2 * block_k * (block_n + block_m) > SMEM_BYTES:
        stages -= 1
    return {"fallback": config["FALLBACK"], "MMA": mma, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k,
            "SPLIT_K": triton.cdiv(k_tiles, per_split), "TILES_PER_SPLIT": per_split, "VEC": vec,
            "PREFETCH": prefetch, "WEIGHT_CG": weight_cg,
            "X_LIKE_W": x_like_w(mma, block_n, block_m, block_k, config["num_warps"]),
            "num_warps": config["num_warps"], "num_stages": stages}


def x_like_w(mma, block_n, block_m, block_k, num_warps):
    """Whether a GEMV program loads x's tile in W's shape: at one row of x and 2 or more outputs, where a thread's
    share of a K step is under 16 bytes a row. There x's (1, 1, BLOCK_K) tile took another layout than W's, and the
    product moved W's tile through shared memory every step; elsewhere the same shape only repeats x's loads across
    the warps that hold W's rows and takes registers (tests/methods/test_llgemm.py reads both in the sm90 code)."""
    return not mma and block_n > 1 and block_m == 1 and block_k < 8 * 32 * num_warps


@triton.jit
def dot_share(x_ptr, w_ptr, M, K, stride_xm, stride_wn, offs_n, offs_m, rows_ok, k_start, k_stop,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_K: tl.constexpr,
              F32_DOT: tl.constexpr):
    """(BLOCK_N, BLOCK_M) fp32 sums over [k_start, k_stop) on the tensor cores: (BLOCK_N, BLOCK_K) @ (BLOCK_K, BLOCK_M),
    x's rows padded to BLOCK_M = 16."""
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_start, k_stop, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w_mask = rows_ok[:, None]
        x_mask = offs_m[None, :] < M
        if not EVEN_K:
            w_mask = w_mask & (offs_k[None, :] < K)
            x_mask = x_mask & (offs_k[:, None] < K)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
        x = tl.load(x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None], mask=x_mask, other=0.0)
        if F32_DOT:  # the interpreter multiplies bf16 bit patterns in tl.dot (Triton issue 11584): fp32 there
            acc = tl.dot(w.to(tl.float32), x.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, x, acc)
    return acc


@triton.jit
def gemv_load(w_ptrs, x_ptrs, offs_k, stop, MASK_K: tl.constexpr, WEIGHT_CG: tl.constexpr):
    """One K step of a GEMV program as int32 pairs of bf16: the (BLOCK_N, 1, BLOCK_K / 2) weight tile and the
    (1, BLOCK_M, BLOCK_K / 2) x tile; with MASK_K zero from the pair ``stop`` on (a K tail, or the step a prefetch
    reads past its share); with WEIGHT_CG the weight's loads are cached in L2 only. Rows are never masked: the
    caller points rows past the end at the last one, whose sums are never stored."""
    if MASK_K:
        if WEIGHT_CG:  # no L1 eviction hint instead: Triton's also marks the lines evict-first in L2 (the hot copy)
            w = tl.load(w_ptrs, mask=offs_k < stop, other=0, cache_modifier=".cg")
        else:
            w = tl.load(w_ptrs, mask=offs_k < stop, other=0)
        x = tl.load(x_ptrs, mask=offs_k < stop, other=0)
    else:
        if WEIGHT_CG:
            w = tl.load(w_ptrs, cache_modifier=".cg")
        else:
            w = tl.load(w_ptrs)
        x = tl.load(x_ptrs)
    return w, x


@triton.jit
def bf16_pair(v):
    """An int32 holding two bf16 (the lower address in its low half) as two fp32: a bf16 is the top half of its fp32,
    so one shift or one mask each (Triton's bf16 conversion spends a byte permute and a shift on the top one)."""
    return (v << 16).to(tl.float32, bitcast=True), (v & -65536).to(tl.float32, bitcast=True)


@triton.jit
def gemv_share(x_ptr, w_ptr, M, N, stride_xm, stride_wn, offs_n, offs_m, k_start, k_stop,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_K: tl.constexpr,
               VEC: tl.constexpr, PREFETCH: tl.constexpr, WEIGHT_CG: tl.constexpr, X_LIKE_W: tl.constexpr):
    """(BLOCK_N, BLOCK_M) fp32 sums over [k_start, k_stop) on the CUDA cores. W and x load as int32 pairs of bf16 in
    3-D tiles in the product's layout, (BLOCK_N, 1, BLOCK_K / 2) and (1, BLOCK_M, BLOCK_K / 2) (with X_LIKE_W x's in
    W's shape), unmasked along their rows (rows past the end read the last one). A thread's products are summed only over its own elements of K: each
    pair's two (an FMA each into the pair's sum) at VEC 1 or 2, its VEC neighbours at once at VEC 4 or 8 (one sum for
    8 products at VEC 8, which leaves registers for deeper steps at M over 2). Those sums stay in the thread's registers
    until the loop ends and are summed across threads once: a sum per step across threads put a shuffle tree, a
    cross-warp exchange through shared memory and layout conversions into every step (tests/methods/test_llgemm.py
    reads the sm90 loop). With PREFETCH a step issues the next step's loads before its own multiply-adds, so a
    program waits on memory once rather than once a step."""
    HALF: tl.constexpr = BLOCK_K // 2
    PAIRS: tl.constexpr = VEC // 2 if VEC > 2 else 1  # pairs summed at once
    acc = tl.zeros((BLOCK_N, BLOCK_M, HALF // PAIRS), dtype=tl.float32)
    offs_k = k_start // 2 + tl.arange(0, HALF)[None, None, :]
    stop = k_stop // 2  # K is even (K % 8 == 0), and so is every share's start
    rows_w = tl.minimum(offs_n, N - 1)[:, None, None]
    rows_x = tl.minimum(offs_m, M - 1)[None, :, None]
    w_ptrs = w_ptr.to(tl.pointer_type(tl.int32)) + rows_w * (stride_wn // 2) + offs_k
    if X_LIKE_W:  # x's tile in W's shape (x_like_w): both load in one layout, no exchange through shared memory
        x_ptrs = x_ptr.to(tl.pointer_type(tl.int32)) + (rows_x * (stride_xm // 2) + offs_k + 0 * rows_w)
    else:
        x_ptrs = x_ptr.to(tl.pointer_type(tl.int32)) + rows_x * (stride_xm // 2) + offs_k
    if PREFETCH:
        w, x = gemv_load(w_ptrs, x_ptrs, offs_k, stop, True, WEIGHT_CG)
    for _ in range(k_start, k_stop, BLOCK_K):
        if PREFETCH:  # the next step's tiles (zeros past k_stop) are in flight while this step multiplies
            offs_k += HALF
            w_ptrs += HALF
            x_ptrs += HALF
            w_next, x_next = gemv_load(w_ptrs, x_ptrs, offs_k, stop, True, WEIGHT_CG)
        else:
            w, x = gemv_load(w_ptrs, x_ptrs, offs_k, stop, not EVEN_K, WEIGHT_CG)
            offs_k += HALF
            w_ptrs += HALF
            x_ptrs += HALF
        w_lo, w_hi = bf16_pair(w)
        x_lo, x_hi = bf16_pair(x)
        if PAIRS == 1:
            acc += w_lo * x_lo
            acc += w_hi * x_hi
        else:  # the reshape keeps each thread's elements: its VEC neighbours of K are one thread's
            products = tl.join(w_lo * x_lo, w_hi * x_hi)
            acc += tl.sum(tl.reshape(products, (BLOCK_N, BLOCK_M, HALF // PAIRS, 2 * PAIRS)), axis=3)
        if PREFETCH:
            w = w_next
            x = x_next
    return tl.sum(acc, axis=2)


@triton.jit
def skinny_gemm_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, count_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                       tiles_per_split, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
                       SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, MMA: tl.constexpr, F32_DOT: tl.constexpr,
                       VEC: tl.constexpr, PREFETCH: tl.constexpr, WEIGHT_CG: tl.constexpr,
                       X_LIKE_W: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    rows_ok = offs_n < N
    k_start = pid_k * tiles_per_split * BLOCK_K
    k_stop = tl.minimum(k_start + tiles_per_split * BLOCK_K, K)
    if MMA:
        acc = dot_share(x_ptr, w_ptr, M, K, stride_xm, stride_wn, offs_n, offs_m, rows_ok, k_start, k_stop,
                        BLOCK_N, BLOCK_K, BLOCK_M, EVEN_K, F32_DOT)
    else:
        acc = gemv_share(x_ptr, w_ptr, M, N, stride_xm, stride_wn, offs_n, offs_m, k_start, k_stop,
                         BLOCK_N, BLOCK_K, BLOCK_M, EVEN_K, VEC, PREFETCH, WEIGHT_CG, X_LIKE_W)
    out_mask = rows_ok[:, None] & (offs_m[None, :] < M)
    y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(tl.bfloat16), mask=out_mask)
    else:
        ws_ptrs = ws_ptr + offs_m[None, :] * N + offs_n[:, None]
        # CUTLASS's split-K semaphore: every thread's adds (relaxed) before the barrier, the barrier before one
        # thread's release add to the counter (cumulative at GPU scope: it carries the whole program's adds). Only
        # the last share acquires: its one thread resets the counter with an acquire exchange (every share has
        # counted; the next launch is ordered after this one), and a barrier passes the acquire on before its reads,
        # which skip L1 (.cg). An acquire invalidates the SM's whole L1 (CCTL.IVALL), where the other programs keep
        # the rows of x they read, so the shares that are not last skip it; no fence in every thread either.
        tl.atomic_add(ws_ptrs, acc, mask=out_mask, sem="relaxed")
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="release", scope="gpu")
        if arrived == SPLIT_K - 1:  # the last share of this column block: write y, leave the workspace at zero
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="acquire", scope="gpu")
            tl.debug_barrier()
            total = tl.load(ws_ptrs, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptrs, total.to(tl.bfloat16), mask=out_mask)
            # The zeros are stored in the store's own layout, not by the thread that read each element: without a
            # barrier a thread could zero an element another thread had yet to read (y then held 0 there).
            tl.debug_barrier()
            tl.store(ws_ptrs, tl.zeros_like(total), mask=out_mask)


def build(weight, config=None):
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.bfloat16 or weight.dim() != 2:
        raise ValueError(f"weight must be a bf16 (N, K) tensor; got {getattr(weight, 'dtype', type(weight))} "
                         f"{tuple(getattr(weight, 'shape', ()))}")
    N, K = weight.shape
    if K % 8 or not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous with K % 8 == 0; got shape {(N, K)}")
    overrides = check_overrides(config)  # before anything is allocated: a bad knob fails the build, not a call
    workspace = torch.zeros((MAX_M, N), dtype=torch.float32, device=weight.device)
    counters = torch.zeros(N, dtype=torch.int32, device=weight.device)  # one per column block, at least one column
    plans = {}
    weight_odd = weight.data_ptr() % 4  # the GEMV reads W and x as int32 pairs: 4-byte aligned bases only

    def fn(x):
        if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != K or x.device != weight.device:
            raise ValueError(f"x must be bf16 (M, {K}) on {weight.device}; got {x.dtype} {tuple(x.shape)} on "
                             f"{x.device}")
        M = x.shape[0]
        if M > MAX_M:
            return torch.nn.functional.linear(x, weight)
        p = plans.get(M)
        if p is None:
            p = plans[M] = plan(M, N, K, overrides)
        if p["fallback"]:
            return torch.nn.functional.linear(x, weight)
        x = x.contiguous()
        if not p["MMA"] and (weight_odd or x.data_ptr() % 4):  # a view 2 bytes off (outside the contract's rows)
            return torch.nn.functional.linear(x, weight)
        y = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
        grid = (triton.cdiv(N, p["BLOCK_N"]), p["SPLIT_K"])
        skinny_gemm_kernel[grid](x, weight, y, workspace, counters, M, N, K, x.stride(0), weight.stride(0),
                                 y.stride(0), p["TILES_PER_SPLIT"], BLOCK_N=p["BLOCK_N"], BLOCK_K=p["BLOCK_K"],
                                 BLOCK_M=p["BLOCK_M"], SPLIT_K=p["SPLIT_K"], MMA=p["MMA"],
                                 EVEN_K=K % p["BLOCK_K"] == 0, F32_DOT=x.device.type != "cuda",
                                 VEC=p["VEC"], PREFETCH=p["PREFETCH"], WEIGHT_CG=p["WEIGHT_CG"],
                                 X_LIKE_W=p["X_LIKE_W"],
                                 num_warps=p["num_warps"],
                                 num_stages=p["num_stages"])
        return y

    return fn
