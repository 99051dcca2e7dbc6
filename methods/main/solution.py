"""W4A16 GEMM with a fused bias + activation + residual epilogue: swap-AB wgmma tiles, one-launch split-K.

Contract (SPEC.md):
    build(qweight, scales, bias, epilogue) -> fn;  fn(x, residual) -> out
    qweight  int32 (K // 8, N)   word [k // 8, n] holds the codes of rows 8(k // 8) .. +7, row 8j + i in bits 4i..4i+3
    scales   fp16  (K // 128, N) one scale per 128-row group and column
    bias     fp16  (N,)
    x        fp16  (M, K);  residual fp16 (M, N);  out fp16 (M, N), a fresh tensor on every call
    W[k, n] = (code[k, n] - 8) * scales[k // 128, n];   out = act(x @ W + bias) + residual,  act in {silu, gelu_tanh}
Any M >= 1, K % 128 == 0 and N % 256 == 0 is computed; the tiers below only tune.

How (kernels.py, pack.py, launch.py):
- out^T = W^T x^T: a slice of output columns is the MMA's M dimension (64-row wgmma instructions on Hopper) and the
  few rows of x its N dimension, so thin M wastes nothing. One K step is one 128-row quantization group.
- Build repacks the words once: one contiguous block per (N tile, group), each word's nibbles where the wgmma register
  operand holds them, so the dequantized tile stays in registers. An inline-PTX sequence dequantizes two codes per
  32-bit operation (DEQUANT 2); the CPU interpreter runs the pure-Triton equivalent (DEQUANT 1).
- The K loop is not bound by DRAM bandwidth, nor, beyond DEQUANT 3, by its instruction count (Nsight Compute on the
  H200: half of the issue slots busy with about 3.5 warps per scheduler, half of the DRAM bandwidth, no dominant
  stall; taking x's stream or the dequant's arithmetic out of a step moved it under 10% either way, dropping the
  per-step scale load 5-12%: reports/examples/h200-weight-stream). The leaner loop (DEQUANT 3 under MAXNREG 96,
  five programs per SM instead of four; plans predicted at LEAN_MIN_US or more run it) sped it up; earlier scale
  loads, the copy engine for the words or for x, two groups a step, wider tiles and a register cap alone did not.
- Plans predicted at WS_MIN_US (30) or more run the warp-specialized loop of ws.py on Hopper (a
  producer warp copies each step's words, x tile and row of scales into a shared-memory ring with the copy engine;
  consumer warps dequantize, multiply and scale, no global load in their loop), their splits kept to one wave of
  programs where that wave stays full enough (WS_MAX_PROGRAMS); the shapes whose WS plans stay in one wave of
  128-column tiles take them at the same split, two consumer warpgroups sharing each x tile (WIDE_TILE), and so do
  two tiers with split rules of their own (TIERS). Elsewhere (the interpreter, other GPUs) the split-K kernel runs
  those plans, with the same split.
- Split-K for small N: the splits add their fp32 partials into a kept (M, N) accumulator and count themselves in per
  tile; the last one applies the epilogue and leaves accumulator and counter at zero. One launch per call.
- The host path: per M the plan and a launcher of the compiled kernel are made once; a call checks its arguments with
  a few attribute reads (the full checks only where those fail), allocates the output and launches with bare
  addresses (LAUNCH 2).
Kept after build: the repacked words (K*N/2 bytes), references to scales (a copy where the caller's base is off 16-byte
alignment) and bias, and for split or stream-K plans the accumulator and counters (4*M*N + 4*tiles bytes) of the
latest such M only.
Tune with `make sweep SOLUTION=methods/drafts/w4a16` on a GPU; the evidence behind the tables is in
reports/examples/h200-splitk-sweeps.
"""
import torch
import triton

from . import launch, pack

GROUP_SIZE = 128
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


# ------------------------------------------------------------------------------------------------ tuning (plain data)
# Measurable speed: the verifier's timed groups are steady only when a call's GPU time clears its host cost (about
# 1.3x, evals/stability.py). A plan that the model below predicts faster than DEVICE_BOUND_US (get_config) takes
# fewer split-K programs until it is not (or one split). The model: a fixed cost, then the bytes at the lesser of the
# device's rate and the programs'. It is fitted to the GPU times of this kernel under the verifier's schedule on an
# H200 (reports/examples/h200-verifier-regime): there the calls cycle 512 distinct inputs (rewritten before each
# group), and a program moves about 11 GB/s; with 16 inputs cycled back to back, all of them staying in the L2, about
# 15. A test holds the model to predict at most 5% over, and at median not far under, each of those times of a plan
# with a fixed split (1 to 4 splits, either loop).
MODEL_FIXED_US = 4.0
MODEL_DEVICE_GBPS = 2400.0
MODEL_PROGRAM_GBPS = 11.0


def predicted_us(M, K, N, programs):
    """Predicted GPU time per call of ``programs`` split-K programs on an (M, K, N) case, its inputs new to caches."""
    bytes_moved = K * N // 2 + (K // GROUP_SIZE) * N * 2 + M * K * 2 + M * N * 4
    return MODEL_FIXED_US + bytes_moved / min(MODEL_DEVICE_GBPS, programs * MODEL_PROGRAM_GBPS) / 1e3


def device_bound_split(M, K, N, tiles, split_k, target_us):
    """The largest split count up to ``split_k`` whose predicted GPU time is at least ``target_us`` (1 if none)."""
    while split_k > 1 and predicted_us(M, K, N, tiles * split_k) < target_us:
        split_k -= 1
    return split_k


# One wave of warp-specialized programs (WS_MAX_PROGRAMS in get_config): on the H200 a grid past one wave lost more
# than an under-filled wave did. 24x8192x28672 unsplit (448 programs, 0.85 of a wave) ran 1.07-1.10x faster than at
# 2 splits (896); 32x28672x8192 at 3 splits (384, 0.73) 0.96x and at 6 (768) 0.79x its 4 (512, 0.97)
# (reports/examples/h200-weight-stream). A smaller wave than WS_WAVE_FILL is unmeasured, and keeps its split.
WS_WAVE_FILL = 0.7

# The leaner K loop: DEQUANT 3 under a 96-register cap issues 189 instructions per step instead of 209 and fits 5
# programs on an SM instead of 4, 1.03-1.28x faster than the default loop on the visible panel (H200, 16 distinct
# inputs; under the verifier's schedule, on one-split expert-batch plans, 0.91-0.95x). A plan that already takes at
# least LEAN_MIN_US of predicted GPU time per call runs it (LEAN_DEQUANT and LEAN_MAXNREG in get_config); a shorter
# one keeps DEQUANT and MAXNREG, the default loop, whose longer GPU time per call keeps it further from its host cost
# (the verifier's schedule spread a 17 us leaner plan past its 1.15 gate where the 19 us default one held). The split
# count is chosen first and stays.

# Host margins for the expert-batch widths (N under 4096; reports/examples/h200-host-margin). A call whose GPU time
# does not clear its host cost lets the host's stalls into the verifier's group times. On the H200 the lean host path
# (LAUNCH 2) cost 9-18 us a call in the verifier's runs; the WS loop's cost 15-37 us where its launcher encodes three
# tensor descriptors on every call (WS_LAUNCH 0) and 14-23 us where it encodes x's alone (1). These widths' plans,
# 32-96 programs, ran 17-20 us a call at the general floor of 16, and three failed the 1.15 gate in verifier runs
# (1.158, 1.164, 1.550, at 1.0-1.25x their host cost). Their tier (TIERS) asks a floor of 22 (the same cases ran
# 23.9-28.1 us) and runs the WS loop only from 45 us predicted: the WS loop takes 0.73-0.89x the model's time, and at
# 30 us predicted its 22-23 us plans cost 24-30 us of host a call with WS_LAUNCH 0 (one group vector spread 1.445)
# and 15-21 us with 1 (1.09-1.50x; in that run one of the tier's own plans spread 1.236 at 1.46x). Under the verifier
# the visible panel's expert-batch cases then ran 25.3-41.1 us (spreads 1.003-1.032) and those of the sealed panel of
# seed 7717 24.0-29.0 us (1.009-1.033); 18x8192x1024 and 32x8192x2048 take one split on the split-K kernel (32.9 and
# 41.1 us), where the WS loop ran them in 22-23 us. The balanced widths keep 16: their 19 us plans have hundreds of
# programs, so the next fewer split the model predicts slower is one split (18x8192x8192: 33 us against 19), and
# their vectors held (one spread 1.159 at 1.6x its host cost).


def get_config():
    # The general plan: every shape that no tier claims. BLOCK_SIZE_K is the quantization group. BLOCK_SIZE_M is the
    # largest M tile (smaller M uses max(16, next power of two of M)). SPLIT_K 0 takes the fewest splits that give
    # MIN_PROGRAMS programs. DEQUANT 2 (11 instructions a word) and 3 (9) are inline PTX (1 is the pure-Triton
    # equivalent). SCALE_AFTER_DOT 1 scales the fp32 partial; 0 scales the fp16 tile before the dot. SCALE_LOAD 0
    # loads a step's scales at that step, 1 one step early, 2 as fp16 pairs that the compiler's pipeline streams ahead
    # with the words when SCALE_AFTER_DOT is 0 (kernels._tile_partial). WEIGHT_TMA 1 reads the words through a tensor
    # descriptor (the copy engine; the launcher encodes it on every call). LAUNCH 2 passes integer addresses to the
    # compiled launcher (the lean host path); 1 tensors. GRID 0 is one program per (tile, split); 1 is stream-K:
    # MIN_PROGRAMS programs (0: as many as the GPU holds at once) share the tiles x groups steps evenly.
    # MAXNREG (0: the compiler's choice) caps registers per thread, so that more programs fit on an SM at once.
    # DEVICE_BOUND_US (0: off) is the least GPU time per call the split-K count may predict (device_bound_split).
    # LEAN_MIN_US (0: never) is the least predicted GPU time per call of a GRID 0 plan (any split count; stream-K
    # never) that runs the leaner loop, LEAN_DEQUANT under LEAN_MAXNREG, in place of DEQUANT and MAXNREG; a tier or a
    # call that sets DEQUANT or MAXNREG sets the loop of every plan it covers.
    # WS_MIN_US (0: never) is the least predicted GPU time per call of a GRID 0 plan that runs the warp-specialized
    # loop (ws.py: a producer warp feeding the words, x and scales through the copy engine, BLOCK_SIZE_N // 16
    # consumer warps) on compiled CUDA on Hopper, WS_STAGES ring stages under a WS_MAXNREG register cap, with the
    # plan's split; it replaces the plan's loop (DEQUANT, MAXNREG, num_warps, num_stages, the SCALE_* knobs and
    # WEIGHT_TMA do not apply) and always takes LAUNCH 2's lean host path, whatever LAUNCH says. BLOCK_SIZE_N 64
    # (one consumer warpgroup) fits a cap of 64, 128 (two) needs 72; 0 (the compiler's choice) is unmeasured.
    # WS_MAX_PROGRAMS (0: no cap) is one wave of a WS plan's programs (tiles x splits). Where SPLIT_K is 0 and the
    # split-K plan's grid is larger, the split drops (never rises) to the most that fit, down to one, provided the
    # smaller grid still fills WS_WAVE_FILL of the wave; otherwise the split-K plan's split stays. 528 is what an
    # H200 holds at once with BLOCK_SIZE_N 64 under a cap of 64 (4 programs of 8 warps, the producer's padded to a
    # warpgroup, on each of 132 SMs); 128-column tiles fit 2 (264).
    # WS_WIDE 1 gives WIDE_TILE (128-column tiles) to the shapes whose WS plans it keeps in one wave (plan()); 0 never.
    # WS_LAUNCH 0 passes the WS loop's three tensor descriptors to triton's launcher, which encodes each on every call;
    # 1 encodes the words' and the scales' once, at build, and only x's per call (launch.encoded_launcher; the normal
    # path where triton's launcher cannot be made so). In one qualification on the H200, six large cases' WS plans cost
    # 13.8-23.4 us of host a call with 1 (median 19.5) and 17.8-36.9 with 0 (median 26.4), at the same GPU time
    # (reports/examples/h200-host-margin).
    return {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": GROUP_SIZE, "SPLIT_K": 0, "MIN_PROGRAMS": 396,
            "DEQUANT": 2, "SCALE_AFTER_DOT": 1, "SCALE_LOAD": 0, "WEIGHT_TMA": 0, "LAUNCH": 2, "GRID": 0,
            "num_warps": 4, "num_stages": 4, "MAXNREG": 0, "DEVICE_BOUND_US": 16, "LEAN_MIN_US": 22,
            "LEAN_DEQUANT": 3, "LEAN_MAXNREG": 96, "WS_MIN_US": 30, "WS_STAGES": 3, "WS_MAXNREG": 64,
            "WS_MAX_PROGRAMS": 528, "WS_WIDE": 1, "WS_LAUNCH": 1}


# 128-column tiles for the warp-specialized loop (WS_WIDE in get_config): two consumer warpgroups share each x tile,
# so a program reads half the x bytes per weight byte through L2 and shared memory, under a 72-register cap (2 programs
# an SM: one wave is 264) with 4 ring stages. The tile width is the shape's, whatever M a call brings (build repacks
# the words once for it): a (K, N) takes these tiles where its one-row plan runs the WS loop at 64 columns and, at
# the same split, would run it at 128 within one wave of 264; every M keeps the split and the loops its 64-column
# plan chooses (an M over 32 has more M tiles, so up to twice the programs: unmeasured). On the H200, against 64
# columns in 3 stages under a cap of 64, with the same split:
# - 24x8192x28672 (unsplit) ran 1.10-1.11x faster (do_bench, the L2 flushed), and 32x28672x8192 (4 splits)
#   0.99-1.01x (reports/examples/h200-weight-stream), 1.05x under a sustained eager loop (h200-power);
# - eight shapes of the sealed panels' kinds, 64-117 MB of words in 2-5 splits (192-264 programs), ran 0.998-1.165x
#   as fast in a burst from a cool board and 1.02-1.12x faster under a sustained eager loop
#   (reports/examples/h200-power). There the board's power cap held on every 64-column pass, even at 30 us a call;
#   a call's work that takes less energy keeps the SM clock higher (by 0-105 MHz; the largest gain, 1.17x, came with
#   0-30 MHz, so not from the clock alone).
# The rule takes 6-split and smaller grids too, unmeasured. A shape whose 64-column WS plan runs past one wave (its
# split kept where one wave would fill under WS_WAVE_FILL) keeps 64 columns: such grids are unmeasured at 128
# (128-column grids of 2-3 waves, at the split-K plan's own larger split, lost 0.85-0.87x). num_warps and num_stages
# serve only the split-K kernel of GPUs without the WS loop (and the interpreter), which runs these plans with the
# same split.
WIDE_TILE = {"BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 3, "WS_STAGES": 4, "WS_MAXNREG": 72,
             "WS_MAX_PROGRAMS": 264}

# Per-shape overrides: the first tier whose N and K ranges hold the shape updates the general plan (and WIDE_TILE,
# where it applies; a tier that sets BLOCK_SIZE_N keeps its own width and split rule).
TIERS = [
    # the widest deep weights: 128-column tiles read each x tile once for two consumer warpgroups (half the x bytes
    # per weight byte), under a 72-register cap (2 programs an SM: one wave is 264) with 4 ring stages. On the H200
    # 24x8192x28672 (unsplit either way) ran 1.10-1.11x faster than with 64-column tiles in 3 stages (do_bench, the L2
    # flushed); 32x28672x8192's plan, not in this tier, ran 0.99-1.01x so, inside the 0.99-1.02x of its own repeats
    # (reports/examples/h200-weight-stream; the next tier takes it, for the power limit of a sustained loop).
    # K >= 8192 here is at least 93 MiB of words: every M plans the WS loop (WS_MIN_US), so num_warps 8 (the split-K
    # kernel's 128-column tile on 8 warps, not 4) serves only GPUs without it. N >= 23808 is 186 or more 128-column
    # tiles, enough to fill 70% of the wave unsplit (WS_WAVE_FILL); N 17152 to 23552 would keep 3-4 splits, 2-3 waves
    # of these programs, which lost 0.85-0.87x on the H200. Unlike WIDE_TILE this tier keeps 128 columns past one wave
    # (N over 33792).
    {"N_MIN": 23808, "N_MAX": 1 << 40, "K_MIN": 8192, "K_MAX": 1 << 40, "MIN_PROGRAMS": 528, "num_stages": 3,
     "num_warps": 8, "BLOCK_SIZE_N": 128, "WS_STAGES": 4, "WS_MAXNREG": 72, "WS_MAX_PROGRAMS": 264},
    # the deepest weights of 64-66 128-column tiles: at M <= 32, 4 splits of them fill 97-100% of the 264-program
    # wave (M 33-64 takes 2 splits and a larger M 1: unmeasured). On the H200 the two 117 MB cases draw the board's
    # 700 W limit under a sustained eager loop, which lowers the SM clock (evals/power.py); 128-column tiles move half
    # the x bytes through L2 and shared memory per weight byte, so a call's work takes less energy and the clock stays
    # higher: 32x28672x8192 ran 1.05x faster sustained (48.4-48.5 against 51.0 us; SM clock 1695 against 1560 MHz)
    # and 1.01x in a burst from a cool board (reports/examples/h200-power). Here the tier's split rule (the 264-program
    # wave) gives 4 splits; WIDE_TILE's (the 64-column plan's split) would give N 8448 3.
    # Its num_warps and num_stages, as the tier above, serve only the split-K kernel of GPUs without the WS loop.
    {"N_MIN": 8192, "N_MAX": 8448, "K_MIN": 16384, "K_MAX": 1 << 40, "BLOCK_SIZE_N": 128, "num_warps": 8,
     "num_stages": 3, "WS_STAGES": 4, "WS_MAXNREG": 72, "WS_MAX_PROGRAMS": 264},
    # the other widest outputs: at 64 columns 24x8192x28672 ran two splits faster than one (59.1 vs 62.3 us eager
    # on the H200, the split-K kernel)
    {"N_MIN": 16384, "N_MAX": 1 << 40, "K_MIN": 128, "K_MAX": 1 << 40, "MIN_PROGRAMS": 528, "num_stages": 3},
    # the expert-batch widths: a higher device-bound floor, for a margin over the host cost (Host margins, above)
    {"N_MIN": 1, "N_MAX": 4095, "K_MIN": 128, "K_MAX": 1 << 40, "DEVICE_BOUND_US": 22, "WS_MIN_US": 45},
]

# What the loop may change, as data (agent/proposers/offline.py reads it without importing this file). "unmeasured"
# values have not run on a GPU with this kernel (reports/examples/h200-splitk-sweeps, h200-w4a16-family and
# h200-weight-stream hold what has).
SEARCH_SPACE = {
    "knobs": {
        "BLOCK_SIZE_N": {"values": [64, 128, 256],
                         "reason": "wider N tiles read x less per weight byte but leave fewer programs for 132 SMs"},
        "MIN_PROGRAMS": {"values": [132, 264, 396, 528, 660], "unmeasured": [132],
                         "reason": "more split-K programs hide memory latency; fewer cut the accumulator's atomics"},
        "SPLIT_K": {"values": [0, 1, 2, 4, 8],
                    "reason": "a fixed split count instead of the one MIN_PROGRAMS implies (0)"},
        "num_stages": {"values": [2, 3, 4, 5], "unmeasured": [2, 5],
                       "reason": "more stages keep more weight loads in flight; fewer free shared memory"},
        "num_warps": {"values": [4, 8], "reason": "more warps hide the dequant's and the loads' latency"},
        "DEQUANT": {"values": [2, 3],
                    "reason": "3 dequantizes a word with one shift, not three (9 instructions per 8 codes, not 11); "
                              "plans under LEAN_MIN_US, or every plan with LEAN_MIN_US 0 (LEAN_DEQUANT above it)"},
        "SCALE_AFTER_DOT": {"values": [1, 0],
                            "reason": "0 scales the fp16 tile before the dot: one fused MMA, no fp32 multiply a step"},
        "MAXNREG": {"values": [0, 96, 88],
                    "reason": "a register cap fits 5 programs on an SM instead of 4 (96 and 88 without spills; 88 "
                              "lengthens the loop): more warps to hide the loop's latencies; plans under "
                              "LEAN_MIN_US, or every plan with LEAN_MIN_US 0 (LEAN_MAXNREG above it)"},
        "LEAN_DEQUANT": {"values": [3, 2], "reason": "the dequant of the plans at LEAN_MIN_US and more"},
        "LEAN_MAXNREG": {"values": [96, 0, 88], "reason": "the register cap of the plans at LEAN_MIN_US and more"},
        "WS_MAX_PROGRAMS": {"values": [528, 0, 264], "unmeasured": [264],
                            "reason": "the warp-specialized plans' splits kept to one wave of programs (528 on an "
                                      "H200 with 64-column tiles, 264 with 128): no partial second wave, fewer "
                                      "accumulator atomics"},
        "WS_WIDE": {"values": [1, 0],
                    "reason": "128-column tiles (WIDE_TILE) for the WS plans that stay in one wave: half the x bytes "
                              "per weight byte, less energy per call under the board's power limit"},
        "LEAN_MIN_US": {"values": [0, 18, 20, 22, 24, 30],
                        "reason": "a lower threshold runs the leaner loop (LEAN_DEQUANT, LEAN_MAXNREG) on more "
                                  "plans: faster, but a plan near its host cost loses its steady group times (a "
                                  "17 us one spread 1.198)"},
        "DEVICE_BOUND_US": {"values": [0, 14, 16, 18, 20, 24],
                            "reason": "a higher floor takes fewer split-K programs where a call would be faster than "
                                      "its host can issue it: slower, but steady group times"},
    },
    # LAUNCH 1 (no faster on the GPU, 4.5-6 us more host time per call: reports/examples/h200-stability), GRID 1
    # (stream-K: 0.96-1.04x the split-K grid: h200-w4a16-family), SCALE_LOAD 1 (0.96-1.00x), SCALE_LOAD 2 with
    # SCALE_AFTER_DOT 0 (0.85-0.91x) and WEIGHT_TMA 1 (0.87-0.98x: h200-weight-stream) lost on the H200: plan() still
    # takes them, the search does not.
    "only_when": {"MIN_PROGRAMS": [{"SPLIT_K": [0]}], "DEVICE_BOUND_US": [{"SPLIT_K": [0]}],
                  "WS_MAX_PROGRAMS": [{"SPLIT_K": [0]}],
                  "LEAN_DEQUANT": [{"LEAN_MIN_US": [18, 20, 22, 24, 30]}],
                  "LEAN_MAXNREG": [{"LEAN_MIN_US": [18, 20, 22, 24, 30]}]},
    # the knob that moves a plan toward device-bound (more GPU time per call), for a host-bound verdict
    "device_bound": {"DEVICE_BOUND_US": "up"},
}

_TIER_RANGE_KEYS = ("N_MIN", "N_MAX", "K_MIN", "K_MAX")
_ALLOWED = {"DEQUANT": (1, 2, 3), "LEAN_DEQUANT": (1, 2, 3), "SCALE_AFTER_DOT": (0, 1), "SCALE_LOAD": (0, 1, 2),
            "WEIGHT_TMA": (0, 1), "LAUNCH": (1, 2), "GRID": (0, 1), "WS_WIDE": (0, 1),
            "WS_LAUNCH": (0, 1)}


def _next_pow2(value):
    return 1 << max(0, int(value) - 1).bit_length()


def plan(M, K, N, overrides=None):
    """The launch plan of one (M, K, N): the general config, updated by WIDE_TILE where the shape takes it, the
    matching tier and ``overrides``, with the tile sizes, the tile counts and the split (or the stream-K program count,
    PROGRAMS) resolved. A shape that takes WIDE_TILE keeps the split and the loops (WS, DEQUANT, MAXNREG) its
    64-column plan chooses."""
    narrow = _plan(M, K, N, overrides, wide=False)
    if not _takes_wide_tiles(K, N, overrides, narrow):
        return narrow
    fixed = (overrides or {}).get("SPLIT_K")  # 0, like no SPLIT_K, leaves the split to the plan
    same_split = {} if narrow["GRID"] == 1 or fixed else {"SPLIT_K": narrow["SPLIT_K"]}
    config = _plan(M, K, N, {**(overrides or {}), **same_split}, wide=True)
    # the model's rate per program is the 64-column tile's, so for the wider tile's fewer programs it predicts more
    # time than the H200 took (20x11392x12288: 38.9 us predicted, 35.5 measured): the loops stay the narrow plan's
    config.update({key: narrow[key] for key in ("WS", "DEQUANT", "MAXNREG")})
    return config


def _tier(K, N):
    return next((t for t in TIERS if t["N_MIN"] <= N <= t["N_MAX"] and t["K_MIN"] <= K <= t["K_MAX"]), {})


def _takes_wide_tiles(K, N, overrides, narrow):
    """Whether a (K, N) takes WIDE_TILE: WS_WIDE on (the tables' or ``overrides``'), no width set by its tier or
    ``overrides``, and by the tables alone (other overrides never change a shape's width, as they never change its
    tier) its one-row plan runs the WS loop at the general width and, at the same split with WIDE_TILE, in one
    wave of WIDE_TILE's programs (a tier's WS_MAX_PROGRAMS does not move it)."""
    if not narrow["WS_WIDE"] or "BLOCK_SIZE_N" in _tier(K, N) or "BLOCK_SIZE_N" in (overrides or {}):
        return False
    one = _plan(1, K, N, None, wide=False)
    if not one["WS"]:
        return False
    wide = _plan(1, K, N, {"SPLIT_K": one["SPLIT_K"]}, wide=True)
    programs = wide["M_TILES"] * wide["N_TILES"] * wide["SPLIT_K"]
    return bool(wide["WS"] and wide["BLOCK_SIZE_N"] > one["BLOCK_SIZE_N"] and programs <= WIDE_TILE["WS_MAX_PROGRAMS"])


def _plan(M, K, N, overrides, wide):
    config = dict(get_config())
    if wide:
        config.update(WIDE_TILE)
    tier = _tier(K, N)
    config.update({key: value for key, value in tier.items() if key not in _TIER_RANGE_KEYS})
    unknown = sorted(set(overrides or {}) - set(config))
    if unknown:
        raise ValueError(f"unknown plan keys {unknown}; the keys are those of get_config(): {sorted(config)}")
    config.update(overrides or {})
    if config["BLOCK_SIZE_K"] != GROUP_SIZE:
        raise ValueError(f"BLOCK_SIZE_K must equal the quantization group {GROUP_SIZE}; got {config['BLOCK_SIZE_K']}")
    for key, allowed in _ALLOWED.items():  # exact ints: True or 3.0 would reach the kernel as other constexprs
        if type(config[key]) is not int or config[key] not in allowed:
            raise ValueError(f"{key} must be one of {allowed}; got {config[key]!r}")
    for key in ("MAXNREG", "LEAN_MAXNREG", "WS_MAXNREG"):
        if type(config[key]) is not int or not (config[key] == 0 or 24 <= config[key] <= 255):
            raise ValueError(f"{key} must be 0 (the compiler's choice) or registers per thread in 24..255; got "
                             f"{config[key]!r}")
    for key, what in (("LEAN_MIN_US", "the leaner loop"), ("WS_MIN_US", "the warp-specialized loop")):
        if type(config[key]) not in (int, float) or not 0 <= config[key] < float("inf"):
            raise ValueError(f"{key} must be 0 (never) or the least predicted GPU time in us of a plan that runs "
                             f"{what}; got {config[key]!r}")
    if type(config["WS_MAX_PROGRAMS"]) is not int or config["WS_MAX_PROGRAMS"] < 0:
        raise ValueError(f"WS_MAX_PROGRAMS must be 0 (no cap) or the most programs of a warp-specialized plan, an int; "
                         f"got {config['WS_MAX_PROGRAMS']!r}")
    if type(config["WS_STAGES"]) is not int or not 2 <= config["WS_STAGES"] <= 4:
        raise ValueError(f"WS_STAGES must be 2, 3 or 4 (stages of the warp-specialized loop's ring); got "
                         f"{config['WS_STAGES']!r}")
    if config["GRID"] == 1 and config["SPLIT_K"] != 0:
        raise ValueError(f"GRID 1 (stream-K) shares the group steps itself: SPLIT_K must be 0; got {config['SPLIT_K']}")
    block_m = max(16, min(_next_pow2(config["BLOCK_SIZE_M"]), _next_pow2(M)))
    block_n = max(16, min(_next_pow2(config["BLOCK_SIZE_N"]), 256))
    while N % block_n:
        block_n //= 2
    groups = K // GROUP_SIZE
    m_tiles, n_tiles = triton.cdiv(M, block_m), N // block_n
    config.update({"M": M, "K": K, "N": N, "BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": block_n, "M_TILES": m_tiles,
                   "N_TILES": n_tiles})
    if config["GRID"] == 1:  # MIN_PROGRAMS programs share the steps (0: as many as fit at once, set at launch)
        config.update({"SPLIT_K": 1, "PROGRAMS": max(0, min(int(config["MIN_PROGRAMS"]), m_tiles * n_tiles * groups)),
                       "WS": 0})
        return config
    fixed_split = bool(config["SPLIT_K"])
    split_k = int(config["SPLIT_K"]) or triton.cdiv(int(config["MIN_PROGRAMS"]), m_tiles * n_tiles)
    # every split owns at least one whole group; the remainder groups spread one each over some splits
    split_k = max(1, min(split_k, groups))
    if not fixed_split and config["DEVICE_BOUND_US"] > 0:  # a fixed SPLIT_K is taken as given
        split_k = device_bound_split(M, K, N, m_tiles * n_tiles, split_k, config["DEVICE_BOUND_US"])
    config["SPLIT_K"] = split_k
    config["PREDICTED_US"] = predicted_us(M, K, N, m_tiles * n_tiles * split_k)
    pinned = {"DEQUANT", "MAXNREG"} & (set(overrides or {}) | set(tier))  # a tier's or a call's loop holds
    if config["LEAN_MIN_US"] and config["PREDICTED_US"] >= config["LEAN_MIN_US"] and not pinned:
        config["DEQUANT"], config["MAXNREG"] = config["LEAN_DEQUANT"], config["LEAN_MAXNREG"]
    # the warp-specialized loop: one consumer warp per 16 columns, a warpgroup or two, and x tiles of at most 32
    # rows (the fp32 partial of a wider tile would not fit the consumer's registers)
    config["WS"] = int(bool(config["WS_MIN_US"]) and config["PREDICTED_US"] >= config["WS_MIN_US"]
                       and block_n in (64, 128) and block_m <= 32)
    # one wave of WS programs (fewer programs only raise the prediction: the loops chosen above stay right)
    wave, tiles = config["WS_MAX_PROGRAMS"], m_tiles * n_tiles
    if config["WS"] and wave and not fixed_split and tiles * split_k > wave:
        fitting = max(1, min(split_k, wave // tiles))
        if tiles * fitting >= WS_WAVE_FILL * wave:
            config["SPLIT_K"] = fitting
            config["PREDICTED_US"] = predicted_us(M, K, N, tiles * fitting)
    return config


# ------------------------------------------------------------------------------------------------ host
def _check_weights(qweight, scales, bias, epilogue):
    if epilogue not in ACTIVATIONS:
        raise ValueError(f"epilogue must be one of {sorted(ACTIVATIONS)}; got {epilogue!r}")
    if qweight.dtype != torch.int32 or qweight.dim() != 2 or not qweight.is_contiguous():
        raise ValueError(f"qweight must be a contiguous int32 (K // 8, N) tensor; got {qweight.dtype} "
                         f"{tuple(qweight.shape)}")
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    if K <= 0 or N <= 0 or K % GROUP_SIZE or N % 256:
        raise ValueError(f"K must be a positive multiple of 128 and N of 256; got K={K}, N={N}")
    if scales.dtype != torch.float16 or tuple(scales.shape) != (K // GROUP_SIZE, N) or not scales.is_contiguous():
        raise ValueError(f"scales must be contiguous fp16 {(K // GROUP_SIZE, N)}; got {scales.dtype} "
                         f"{tuple(scales.shape)}")
    if bias.dtype != torch.float16 or tuple(bias.shape) != (N,) or not bias.is_contiguous():
        raise ValueError(f"bias must be contiguous fp16 ({N},); got {bias.dtype} {tuple(bias.shape)}")
    for name, tensor in (("scales", scales), ("bias", bias)):
        if tensor.device != qweight.device:
            raise ValueError(f"{name} must be on {qweight.device}; got {tensor.device}")
    return K, N


def _check_inputs(x, residual, K, N, device):
    """The arguments of one call, contiguous with 16-byte aligned bases (what the kernels are compiled for)."""
    if not isinstance(x, torch.Tensor) or not isinstance(residual, torch.Tensor):
        raise ValueError(f"x and residual must be tensors; got {type(x).__name__} and {type(residual).__name__}")
    if x.device != device or residual.device != device:
        raise ValueError(f"x and residual must be on {device}; got {x.device} and {residual.device}")
    if x.dtype != torch.float16 or x.dim() != 2 or x.shape[1] != K:
        raise ValueError(f"x must be fp16 (M, {K}); got {x.dtype} {tuple(x.shape)}")
    M = x.shape[0]
    if residual.dtype != torch.float16 or residual.dim() != 2 or residual.shape[0] != M or residual.shape[1] != N:
        raise ValueError(f"residual must be fp16 ({M}, {N}); got {residual.dtype} {tuple(residual.shape)}")
    if M == 0:
        raise ValueError("x must have at least one row")
    if not x.is_contiguous() or x.data_ptr() & 15:
        x = x.clone(memory_format=torch.contiguous_format)
    if not residual.is_contiguous() or residual.data_ptr() & 15:
        residual = residual.clone(memory_format=torch.contiguous_format)
    return x, residual


def build(qweight, scales, bias, epilogue, config=None):
    """Check the weights once and return ``fn(x, residual) -> out``.

    ``config`` (optional, for tests and tuning) is a dict of overrides applied on top of the plan's tier.
    """
    K, N = _check_weights(qweight, scales, bias, epilogue)
    activation = ACTIVATIONS[epilogue]
    device = qweight.device
    overrides = dict(config) if config else None
    # BLOCK_SIZE_N comes from (K, N) alone, whatever M a call brings: repack once, here. The kernels read the scales
    # in 32-bit pairs where SCALE_LOAD is 2: a base off 16-byte alignment gets an aligned copy, kept instead of a
    # reference (the residency contract allows one copy of the scales)
    if scales.data_ptr() % 16:
        scales = scales.clone()
    weights = (pack.operand_blocks(qweight, plan(1, K, N, overrides)["BLOCK_SIZE_N"]), scales, bias)
    calls = {}  # x's shape (M, K) -> call(x, residual) -> out
    keeping = []  # the M whose call keeps an accumulator: one at a time, within the contract's allowance

    def check(x, residual):
        return _check_inputs(x, residual, K, N, device)

    def first_call(x, residual):
        x, residual = check(x, residual)
        M = x.shape[0]
        cfg = plan(M, K, N, overrides)
        if launch.keeps_accumulator(cfg):
            for other in keeping:
                calls.pop((other, K), None)
            keeping[:] = [M]
        call = calls[(M, K)] = launch.make_call(cfg, M, K, N, activation, weights, x, residual, check)
        return call(x, residual)

    def fn(x, residual):
        # the call of x's shape checks its arguments itself (cheaply, then in full where the cheap test fails)
        call = calls.get(getattr(x, "shape", None))
        return first_call(x, residual) if call is None else call(x, residual)

    return fn
