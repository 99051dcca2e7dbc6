"""W4A16 GEMM with a fused bias + activation + residual epilogue: swap-AB wgmma tiles, one-launch split-K.

Contract (SPEC.md):
    build(qweight, scales, bias, epilogue) -> fn;  fn(x, residual) -> out
    qweight  int32 (K // 8, N)   word [k // 8, n] holds the codes of rows 8(k // 8) .. +7, row 8j + i in bits 4i..4i+3
    scales   fp16  (K // 128, N) one scale per 128-row group and column
    bias     fp16  (N,)
    x        fp16  (M, K);  residual fp16 (M, N);  out fp16 (M, N), a fresh tensor on every call
    W[k, n] = (code[k, n] - 8) * scales[k // 128, n];   out = act(x @ W + bias) + residual,  act in {silu, gelu_tanh}
Any M >= 1, K % 128 == 0 and N % 256 == 0 is computed; the tiers below only tune.

How (kernels.py, ws.py, pack.py, launch.py):
- out^T = W^T x^T: a slice of output columns is the MMA's M dimension (64-row wgmma on Hopper) and the few rows of x
  its N dimension, so thin M wastes nothing. One K step is one 128-row quantization group.
- Build repacks the words once (pack.py) into one contiguous block per (N tile, group), each word's nibbles where the
  wgmma register operand holds them; an inline-PTX sequence dequantizes two codes per 32-bit operation (DEQUANT 2 or
  3; the CPU interpreter runs the pure-Triton DEQUANT 1).
- Split-K: the splits add fp32 partials into a kept (M, N) accumulator and count themselves in per tile; the last
  applies the epilogue and leaves accumulator and counter at zero. One launch per call.
- Plans predicted at WS_MIN_US or more run the warp-specialized loop (ws.py) on Hopper, the split-K kernel elsewhere.
- A plan the device-bound floor holds back (a call faster than its host could issue it) runs a stream-K grid sized
  so that its predicted GPU time lands on the floor (FLOOR_GRID), on the default loop.
- The host path (launch.py): per M the plan and a launcher of the compiled kernel are made once; a call checks its
  arguments with a few attribute reads (the full checks only where those fail), allocates the output and calls the
  launcher's C entry with bare addresses.
Kept after build: the repacked words (K*N/2 bytes), references to scales (a 16-byte aligned copy where the caller's
is not: the copy engine reads them) and bias, and for split or stream-K plans the accumulator and counters
(4*M*N + 4*tiles bytes) of the latest such M only.
Tune with `make sweep SOLUTION=methods/drafts/w4a16` on a GPU; reports/examples/index.md lists the evidence.
"""
import torch
import triton

from . import launch, pack

GROUP_SIZE = 128
# identity serves plain linear layers (a model's projections); the scored contract names silu and gelu_tanh
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1, "identity": 2}


# ------------------------------------------------------------------------------------------------ tuning (plain data)
# The verifier's timed groups hold steady only where a call's GPU time clears its host cost (about 1.3x,
# evals/stability.py): a plan predicted under DEVICE_BOUND_US takes fewer split-K programs until it is not. The model
# (a fixed cost, then the bytes at the lesser of the device's rate and the programs') is fitted to this kernel's GPU
# times under the verifier's schedule on an H200 (reports/examples/h200-verifier-regime).
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


def device_bound_programs(M, K, N, most, target_us):
    """The most programs, up to ``most``, whose predicted GPU time is at least ``target_us`` (1 if none): the
    continuous count that whole splits approximate from above (a split fewer can double the time)."""
    one_program_us = predicted_us(M, K, N, 1) - MODEL_FIXED_US  # the bytes at one program's rate
    programs = int(one_program_us // (target_us - MODEL_FIXED_US)) if target_us > MODEL_FIXED_US else most
    programs = max(1, min(most, programs))
    while programs > 1 and predicted_us(M, K, N, programs) < target_us:  # rounding at the boundary
        programs -= 1
    while programs < most and predicted_us(M, K, N, programs + 1) >= target_us:
        programs += 1
    return programs


# A WS grid past one wave lost more than an under-filled wave did; a wave under 70% full is unmeasured and keeps its
# split (reports/examples/h200-weight-stream).
WS_WAVE_FILL = 0.7


def get_config():
    # The general plan (every shape no tier claims); evidence for each value: reports/examples/index.md.
    # BLOCK_SIZE_K: the quantization group. BLOCK_SIZE_M: the largest M tile (smaller M: max(16, next power of two)).
    # SPLIT_K 0: the fewest splits that give MIN_PROGRAMS programs. GRID 0: a program per (tile, split); 1: stream-K,
    # MIN_PROGRAMS programs (0: as many as fit at once) share the tiles x groups steps evenly.
    # DEQUANT 2 (11 instructions a word) or 3 (9): inline PTX; 1: pure Triton. SCALE_AFTER_DOT 1 scales the fp32
    # partial, 0 the fp16 tile before the dot. MAXNREG (0: the compiler's) caps registers per thread.
    # DEVICE_BOUND_US (0: off): the least GPU time per call a free split may predict (device_bound_split).
    # FLOOR_GRID 1: where that floor cuts a free split, a stream-K grid of the most programs it allows
    # (device_bound_programs) lands the plan on the floor, not up to twice over it at the next whole split; 0: the
    # whole split. Such a plan keeps DEQUANT and MAXNREG: the leaner loop ran one-split expert-batch plans 0.91-0.95x
    # as fast as the default one under the verifier's schedule (h200-verifier-regime).
    # LEAN_MIN_US (0: never): the least predicted time of a GRID 0 plan that runs LEAN_DEQUANT under LEAN_MAXNREG
    # (h200-lean-loop); a tier or call that sets DEQUANT or MAXNREG keeps its own loop.
    # WS_MIN_US (0: never): the least predicted time of a GRID 0 plan that runs the warp-specialized loop of ws.py on
    # Hopper, WS_STAGES ring stages under WS_MAXNREG, at the plan's split (h200-weight-stream).
    # WS_MAX_PROGRAMS (0: no cap): one wave of WS programs; a free split past it drops to the most that fit when that
    # fills WS_WAVE_FILL of the wave. 528 is an H200's wave of 64-column programs under a cap of 64.
    # WS_WIDE 1: WIDE_TILE for the shapes whose WS plans it keeps in one wave (plan()).
    return {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": GROUP_SIZE, "SPLIT_K": 0, "MIN_PROGRAMS": 396,
            "DEQUANT": 2, "SCALE_AFTER_DOT": 1, "GRID": 0, "num_warps": 4, "num_stages": 4, "MAXNREG": 0,
            "DEVICE_BOUND_US": 16, "FLOOR_GRID": 1, "LEAN_MIN_US": 22, "LEAN_DEQUANT": 3, "LEAN_MAXNREG": 96,
            "WS_MIN_US": 30, "WS_STAGES": 3, "WS_MAXNREG": 64, "WS_MAX_PROGRAMS": 528, "WS_WIDE": 1}


# 128-column WS tiles: two consumer warpgroups share each x tile (half the x bytes per weight byte, less energy under
# the board's power cap), 2 programs an SM (a wave of 264); 1.02-1.17x on the H200 (h200-weight-stream, h200-power).
WIDE_TILE = {"BLOCK_SIZE_N": 128, "num_warps": 8, "num_stages": 3, "WS_STAGES": 4, "WS_MAXNREG": 72,
             "WS_MAX_PROGRAMS": 264}

# Per-shape overrides: the first tier whose N and K ranges hold the shape updates the general plan (and WIDE_TILE,
# where it applies; a tier that sets BLOCK_SIZE_N keeps its own width and split rule). A tier's num_warps and
# num_stages serve the split-K kernel of GPUs without the WS loop.
TIERS = [
    # the widest deep weights: 128-column WS tiles for every M, unsplit from 186 tiles (70% of the wave); 1.10-1.11x
    # over 64 columns at 24x8192x28672 (h200-weight-stream)
    {"N_MIN": 23808, "N_MAX": 1 << 40, "K_MIN": 8192, "K_MAX": 1 << 40, "MIN_PROGRAMS": 528, "num_stages": 3,
     "num_warps": 8, "BLOCK_SIZE_N": 128, "WS_STAGES": 4, "WS_MAXNREG": 72, "WS_MAX_PROGRAMS": 264},
    # the deepest weights of 64-66 128-column tiles: 4 splits fill the 264-program wave; 1.05x sustained at
    # 32x28672x8192, where the board's 700 W cap lowers the clock (h200-power)
    {"N_MIN": 8192, "N_MAX": 8448, "K_MIN": 16384, "K_MAX": 1 << 40, "BLOCK_SIZE_N": 128, "num_warps": 8,
     "num_stages": 3, "WS_STAGES": 4, "WS_MAXNREG": 72, "WS_MAX_PROGRAMS": 264},
    # the other widest outputs: two splits ran faster than one at 64 columns (h200-splitk-sweeps)
    {"N_MIN": 16384, "N_MAX": 1 << 40, "K_MIN": 128, "K_MAX": 1 << 40, "MIN_PROGRAMS": 528, "num_stages": 3},
    # the expert-batch widths: a floor of 25 us and the WS loop only from 45 us, a margin over their host cost (at
    # 16 three plans spread past the 1.15 gate, h200-host-margin; the floor's stream-K grids at 22 ran 19-22 us
    # against host costs up to 16-18 us and spread up to 1.197, at 25 21-24 us and up to 1.119, h200-host-path)
    {"N_MIN": 1, "N_MAX": 4095, "K_MIN": 128, "K_MAX": 1 << 40, "DEVICE_BOUND_US": 25, "WS_MIN_US": 45},
]

# What the loop may change, as data (agent/proposers/offline.py reads it without importing this file). "unmeasured"
# values have not run on a GPU with this kernel.
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
        "FLOOR_GRID": {"values": [1, 0],
                       "reason": "a stream-K grid sized to the device-bound floor: a host-bound plan lands on the "
                                 "floor instead of a whole split over it (up to twice its GPU time)"},
        "DEVICE_BOUND_US": {"values": [0, 14, 16, 18, 20, 24],
                            "reason": "a higher floor takes fewer split-K programs where a call would be faster than "
                                      "its host can issue it: slower, but steady group times"},
    },
    # GRID 1 (stream-K: 0.96-1.04x the split-K grid, h200-w4a16-family) is not searched: FLOOR_GRID plans take it
    "only_when": {"MIN_PROGRAMS": [{"SPLIT_K": [0]}], "DEVICE_BOUND_US": [{"SPLIT_K": [0]}],
                  "FLOOR_GRID": [{"SPLIT_K": [0]}],
                  "WS_MAX_PROGRAMS": [{"SPLIT_K": [0]}],
                  "LEAN_DEQUANT": [{"LEAN_MIN_US": [18, 20, 22, 24, 30]}],
                  "LEAN_MAXNREG": [{"LEAN_MIN_US": [18, 20, 22, 24, 30]}]},
    # the knob that moves a plan toward device-bound (more GPU time per call), for a host-bound verdict
    "device_bound": {"DEVICE_BOUND_US": "up"},
}

_TIER_RANGE_KEYS = ("N_MIN", "N_MAX", "K_MIN", "K_MAX")
_ALLOWED = {"DEQUANT": (1, 2, 3), "LEAN_DEQUANT": (1, 2, 3), "SCALE_AFTER_DOT": (0, 1), "GRID": (0, 1),
            "WS_WIDE": (0, 1), "FLOOR_GRID": (0, 1)}


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
    _validate(config)
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
    pinned = {"DEQUANT", "MAXNREG"} & (set(overrides or {}) | set(tier))  # a tier's or a call's loop holds
    return _split_plan(config, groups, pinned)


def _validate(config):
    """Raise where a plan's value would reach the kernels as something else (exact ints: True or 3.0 would be other
    constexprs) or mean nothing."""
    if config["BLOCK_SIZE_K"] != GROUP_SIZE:
        raise ValueError(f"BLOCK_SIZE_K must equal the quantization group {GROUP_SIZE}; got {config['BLOCK_SIZE_K']}")
    for key, allowed in _ALLOWED.items():
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


def _split_plan(config, groups, pinned):
    """GRID 0: the split (fixed, or the fewest that give MIN_PROGRAMS, then the device-bound floor), the loop its
    predicted time chooses (leaner, warp-specialized) and, for the WS loop, one wave of programs. Where the floor cuts
    a free split and FLOOR_GRID is 1, a stream-K grid of the floor's program count instead (GRID 1, PROGRAMS)."""
    M, K, N, tiles = config["M"], config["K"], config["N"], config["M_TILES"] * config["N_TILES"]
    fixed_split = bool(config["SPLIT_K"])
    split_k = int(config["SPLIT_K"]) or triton.cdiv(int(config["MIN_PROGRAMS"]), tiles)
    # every split owns at least one whole group; the remainder groups spread one each over some splits
    split_k = max(1, min(split_k, groups))
    if not fixed_split and config["DEVICE_BOUND_US"] > 0:  # a fixed SPLIT_K is taken as given
        free, split_k = split_k, device_bound_split(M, K, N, tiles, split_k, config["DEVICE_BOUND_US"])
        programs = device_bound_programs(M, K, N, tiles * free, config["DEVICE_BOUND_US"])
        if config["FLOOR_GRID"] and programs > tiles * split_k:  # the floor cut the split: land on it
            config.update({"GRID": 1, "SPLIT_K": 1, "PROGRAMS": programs, "WS": 0,
                           "PREDICTED_US": predicted_us(M, K, N, programs)})
            return config
    config["SPLIT_K"] = split_k
    config["PREDICTED_US"] = predicted_us(M, K, N, tiles * split_k)
    if config["LEAN_MIN_US"] and config["PREDICTED_US"] >= config["LEAN_MIN_US"] and not pinned:
        config["DEQUANT"], config["MAXNREG"] = config["LEAN_DEQUANT"], config["LEAN_MAXNREG"]
    # the warp-specialized loop: one consumer warp per 16 columns, a warpgroup or two, and x tiles of at most 32
    # rows (the fp32 partial of a wider tile would not fit the consumer's registers)
    config["WS"] = int(bool(config["WS_MIN_US"]) and config["PREDICTED_US"] >= config["WS_MIN_US"]
                       and config["BLOCK_SIZE_N"] in (64, 128) and config["BLOCK_SIZE_M"] <= 32)
    # one wave of WS programs (fewer programs only raise the prediction: the loops chosen above stay right)
    wave = config["WS_MAX_PROGRAMS"]
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
    # BLOCK_SIZE_N comes from (K, N) alone, whatever M a call brings: repack once, here. The WS loop's copy engine
    # reads the scales: a base off 16-byte alignment gets an aligned copy, kept instead of a reference (the residency
    # contract allows one copy of the scales)
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
