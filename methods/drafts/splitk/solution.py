"""W4A16 GEMM with a fused bias + activation + residual epilogue: per-shape tiles, split-K, minimal host path.

Contract (SPEC.md):
    build(qweight, scales, bias, epilogue) -> fn;  fn(x, residual) -> out
    qweight  int32 (K // 8, N)   word [k // 8, n] holds the codes of rows 8(k // 8) .. +7, row 8j + i in bits 4i..4i+3
    scales   fp16  (K // 128, N) one scale per 128-row group and column
    bias     fp16  (N,)
    x        fp16  (M, K);  residual fp16 (M, N);  out fp16 (M, N), a fresh tensor on every call
    W[k, n] = (code[k, n] - 8) * scales[k // 128, n];   out = act(x @ W + bias) + residual,  act in {silu, gelu_tanh}

A hand-written draft. Its plans come from the H200 sweeps of session 5 (2026-11-30): swap-AB wgmma tiles of 64 output
columns over words repacked in program order with each nibble where the wgmma register operand holds it (LAYOUT 3),
dequantized by a short inline-PTX sequence, with one-launch split-K.
Submit a change with `python -m agent submit methods/drafts/splitk --from vN --summary ...` on a GPU; sweep its knobs
with `make sweep SOLUTION=methods/drafts/splitk` (evals/sweep.py; the plans in evals/sweep_grid.json).

Design:
- One K step is one 128-row quantization group. SWAP_AB 1 computes out^T = W^T x^T: the N tile is the MMA's M
  dimension (a wgmma instruction on Hopper, with the dequantized tile as its register operand) and the M rows of x its
  N dimension. The words come as a [BLOCK_N, 16] tile, from the caller's (K // 8, N) tensor (LAYOUT 0), a (N, K // 8)
  copy (LAYOUT 1) or a copy in program order (LAYOUT 2: one contiguous block per program and K step; LAYOUT 3: the
  same blocks with each word's nibbles in the operand's register order), made at build.
  SWAP_AB 0 computes x @ W with [BLOCK_K, BLOCK_N] weight tiles: UNPACK 0 loads each word once and expands it by a
  broadcast shift and a reshape (row 8j + i is nibble i of word j); UNPACK 1 loads the word of every row, as v0 does.
  MAGIC 1 turns codes into fp16 through the 0x6400 exponent trick. DEQUANT 2 does that for two codes per 32-bit
  operation in inline PTX (lop3, then one f16x2 subtraction): 2.7x fewer instructions in the sm90 loop than the
  per-weight shifts of DEQUANT 0, and no scalar shared-memory traffic for the words. SCALE_AFTER_DOT 1 feeds the
  integer-valued codes minus 8 (exact in fp16) to tl.dot and multiplies the fp32 partial by the group's scale; 0
  scales the fp16 tile first.
- Split-K, REDUCE_MODE 0 (no atomics): with SPLIT_K > 1 the main kernel writes fp32 partials to a per-call workspace
  (SPLIT_K, M, N) and a second kernel sums them and applies bias, activation and residual. With SPLIT_K == 1 the main
  kernel applies the epilogue itself (one launch). Split s covers groups [s*G // S, (s+1)*G // S).
- Split-K, REDUCE_MODE 1 (one launch): each program adds its partial atomically into a kept fp32 (M, N) accumulator,
  passes a barrier and counts itself in on a per-tile counter (acquire-release); the program that counts last applies
  the epilogue and leaves accumulator and counter at zero for the next call. Ledger v39 (and 19 of the 188 swept
  one-launch split-K pairs) gave wrong sums on the H200: the compiled kernel zeroed the accumulator in a thread
  layout other than the one it read it in, with no barrier between (seen in the sm90 PTX; the interpreter runs one
  thread). A barrier now separates them: in the next sweep all 203 one-launch split-K pairs were right before
  and after timing. The adds land in any order, so a repeated call may differ in the last bits of fp32 rounding.
- Host path: per M, the plan, the grid and a compiled-kernel launcher (CUDA, not interpreted) are built once; a call
  is a few checks, torch.empty for the output (and the workspace when split) and one or two launches, each straight
  through the compiled kernel's launcher on the current stream. LAUNCH 2 (not yet measured on a GPU) passes integer
  addresses to the launcher's C entry instead of tensors, which costs a data_ptr() call and a driver pointer query
  per tensor argument in triton 3.6: eight per call on the one-launch path.
- Stream-K, GRID 1 (SWAP_AB): a fixed grid of MIN_PROGRAMS programs (0: as many as the GPU holds at once, from the
  compiled kernel's registers and shared memory) shares the tiles x groups steps evenly, tile-major, so no partial
  last wave leaves SMs idle (the 448 tiles of a 117 MB case in 2 splits are 896 programs: 1.7 waves of the 528 that
  fit at once). A tile a program covers alone gets the epilogue at once; a shared one goes through REDUCE_MODE 1's
  accumulator, its counter counting group steps up to the tile's total. Not yet measured on a GPU.
Build keeps references to the caller's tensors and, with SWAP_AB and LAYOUT 1, 2 or 3, a repacked copy of the words
(K*N/2 bytes, the contract's int4 allowance); REDUCE_MODE 1 and GRID 1 keep the accumulator and counters
(4*M*N + 4*tiles bytes) for the latest M only.
"""
import torch
import triton
import triton.language as tl
from triton.runtime import driver
from triton.runtime.jit import JITFunction

GROUP_SIZE = 128
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


# ------------------------------------------------------------------------------------------------ tuning (plain data)
def get_config():
    # General configuration: used for every shape that no tier below claims. BLOCK_SIZE_K must equal GROUP_SIZE.
    # BLOCK_SIZE_M is the largest M tile; smaller M uses max(16, next power of two of M).
    # SPLIT_K 0 means automatic: the fewest splits giving at least MIN_PROGRAMS programs.
    # SWAP_AB 1: compute out^T = W^T x^T, the N tile as the MMA's M dimension (wgmma on Hopper); 0: x @ W.
    # LAYOUT (with SWAP_AB) 0: the caller's words; 1: a (N, K // 8) copy; 2: a copy in program order (build repacks);
    # 3: as 2, with each word's nibbles in the order the wgmma register operand holds them (needs DEQUANT 1 or 2).
    # UNPACK (without SWAP_AB) 0: load each word once and reshape; 1: load the word of every row (v0 style).
    # MAGIC 1: int -> fp16 through the 0x6400 exponent trick; 0: plain conversion.
    # DEQUANT (with UNPACK 0) 0: one shift per weight over a broadcast word tile; 1: eight shift-and-mask passes over
    # the words, joined; 2: one inline-PTX sequence per word, two weights per 32-bit operation (compiled CUDA only: the
    # interpreter and other devices run DEQUANT 1, which computes the same values); 3: as 2 with one shift per word
    # instead of three (9 instructions per 8 weights instead of 11; not yet measured on a GPU).
    # SCALE_AFTER_DOT 1: the group's scale multiplies the fp32 partial product; 0: it multiplies the fp16 weight tile
    # before the dot (as v0 does).
    # REDUCE_MODE (with SPLIT_K > 1) 0: partials to a per-call workspace and a second kernel for the sum and the
    # epilogue; 1: one launch, partials added atomically into a kept fp32 accumulator, the last program of a tile
    # applies the epilogue.
    # LAUNCH (compiled CUDA, one-launch paths) 1: tensors through the compiled kernel's launcher, which asks each
    # tensor for data_ptr() and the driver for its pointer attributes; 2: integer addresses (the weights' taken once at
    # build) straight to the launcher's C entry: less host time per call. The interpreter ignores it.
    # GRID (with SWAP_AB) 0: a program per (tile, split), split-K as above; 1: stream-K, a fixed grid of MIN_PROGRAMS
    # programs (0: as many as the GPU holds at once, from the compiled kernel's registers and shared memory) sharing
    # the tiles * groups steps evenly; a tile shared by programs goes through the kept accumulator (REDUCE_MODE 1's).
    # The tables' MIN_PROGRAMS were tuned for split-K: for GRID 1, 0 is the count that matches what fits at once.
    return {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": GROUP_SIZE, "SPLIT_K": 0, "MIN_PROGRAMS": 396,
            "SWAP_AB": 1, "LAYOUT": 3, "UNPACK": 0, "MAGIC": 1, "DEQUANT": 2, "SCALE_AFTER_DOT": 1, "REDUCE_MODE": 1,
            "REDUCE_BLOCK": 1024, "REDUCE_WARPS": 4, "LAUNCH": 1, "GRID": 0, "num_warps": 4, "num_stages": 4}


# Per-shape overrides: the first tier whose N and K ranges hold the shape updates the general configuration.
# H200 sweep of 16 plans (2026-11-30, LAYOUT 3 against LAYOUT 2: reports/examples/h200-splitk-sweeps), eager us of
# the plan (LAYOUT 3, N tile 64, 4 stages, 396 programs) against the LAYOUT 2 plan it replaces: 18x8192x8192 21.2 vs
# 28.3, 32x28672x8192 57.3 vs 84.6, 20x14336x4096 18.6 vs 28.4, 28x8192x10240 26.9 vs 37.4; expert-batch 14.4,
# 14.8, 15.5, 15.2, 13.4 vs 14.2, 16.6, 14.8, 15.1, 16.8 (host-bound: eager above the 10-15 us of GPU time).
TIERS = [
    # the widest outputs: 448 N tiles at N = 28672; two splits each beat one (59.1 vs 62.3 us with LAYOUT 3).
    {"N_MIN": 16384, "N_MAX": 1 << 40, "K_MIN": 128, "K_MAX": 1 << 40, "MIN_PROGRAMS": 528, "num_stages": 3},
]

_TIER_RANGE_KEYS = ("N_MIN", "N_MAX", "K_MIN", "K_MAX")


def _next_pow2(value):
    return 1 << max(0, int(value) - 1).bit_length()


def plan(M, K, N, overrides=None):
    """The launch configuration for one (M, K, N): general config, updated by the matching tier and ``overrides``."""
    config = dict(get_config())
    for tier in TIERS:
        if tier["N_MIN"] <= N <= tier["N_MAX"] and tier["K_MIN"] <= K <= tier["K_MAX"]:
            config.update({key: value for key, value in tier.items() if key not in _TIER_RANGE_KEYS})
            break
    if overrides:
        config.update(overrides)
    if config["BLOCK_SIZE_K"] != GROUP_SIZE:
        raise ValueError(f"BLOCK_SIZE_K must equal the quantization group {GROUP_SIZE}; got {config['BLOCK_SIZE_K']}")
    for key, allowed in (("DEQUANT", (0, 1, 2, 3)), ("GRID", (0, 1)), ("LAUNCH", (1, 2)), ("LAYOUT", (0, 1, 2, 3))):
        if config[key] not in allowed:
            raise ValueError(f"{key} must be one of {allowed}; got {config[key]!r}")
    if config["SWAP_AB"] and config["LAYOUT"] == 3 and config["DEQUANT"] == 0:
        raise ValueError("LAYOUT 3 needs DEQUANT 1 or 2 (its nibbles are in the operand's order, not row order)")
    if config["GRID"] == 1 and not config["SWAP_AB"]:
        raise ValueError("GRID 1 (stream-K) needs SWAP_AB 1")
    block_m = max(16, min(_next_pow2(config["BLOCK_SIZE_M"]), _next_pow2(M)))
    block_n = max(16, min(_next_pow2(config["BLOCK_SIZE_N"]), 256))
    while N % block_n:
        block_n //= 2
    groups = K // GROUP_SIZE
    tiles = triton.cdiv(M, block_m) * (N // block_n)
    if config["GRID"] == 1:  # stream-K: MIN_PROGRAMS programs share the tiles * groups steps (0: fill the GPU)
        programs = min(int(config["MIN_PROGRAMS"]), tiles * groups)
        config.update({"BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": block_n, "SPLIT_K": 1, "PROGRAMS": max(0, programs),
                       "M_TILES": triton.cdiv(M, block_m), "N_TILES": N // block_n})
        return config
    split_k = int(config["SPLIT_K"])
    if split_k <= 0:
        split_k = triton.cdiv(int(config["MIN_PROGRAMS"]), tiles)
    # every split owns at least one whole group; the remainder groups spread one each over some splits
    split_k = max(1, min(split_k, groups))
    config.update({"BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": block_n, "SPLIT_K": split_k,
                   "M_TILES": triton.cdiv(M, block_m), "N_TILES": N // block_n})
    return config


# ------------------------------------------------------------------------------------------------ kernels
@triton.jit
def _epilogue(z, r_ptr, out_ptr, io, mask, ACTIVATION: tl.constexpr):
    """out[io] = act(z) + residual[io] in fp16, z the fp32 sum with the bias added."""
    if ACTIVATION == 0:  # silu
        y = z * tl.sigmoid(z)
    else:  # gelu_tanh: 0.5 z (1 + tanh(a)) == z * sigmoid(2a)
        inner = 0.7978845608028654 * (z + 0.044715 * z * z * z)
        y = z * tl.sigmoid(2.0 * inner)
    residual = tl.load(r_ptr + io, mask=mask, other=0.0)
    tl.store(out_ptr + io, (y + residual.to(tl.float32)).to(tl.float16), mask=mask)


@triton.jit
def _weights_fp16(codes, MAGIC: tl.constexpr):
    """Codes 0..15 -> the fp16 values code - 8 (exact)."""
    if MAGIC:
        # 0x6400 | c is the fp16 1024 + c (ulp 1 at 1024): exact; minus 1032 gives c - 8 exactly.
        return (codes | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1032.0
    else:
        return (codes - 8).to(tl.float16)


# Eight nibbles of one int32 word -> eight fp16 values code - 8, two per 32-bit operation: lop3 keeps nibbles i and
# i + 4 under the fp16 exponent 0x6400 (1024 + code, exact), one f16x2 subtraction of 1032 gives code - 8.
_DEQUANT_PTX = tl.constexpr("""
{
.reg .b32 t0, t1, t2, t3, m;
mov.b32 m, 0x64086408;
shr.u32 t1, $8, 4;
shr.u32 t2, $8, 8;
shr.u32 t3, $8, 12;
lop3.b32 t0, $8, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 t1, t1, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 t2, t2, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 t3, t3, 0x000F000F, 0x64006400, 0xEA;
sub.f16x2 t0, t0, m;
sub.f16x2 t1, t1, m;
sub.f16x2 t2, t2, m;
sub.f16x2 t3, t3, m;
mov.b32 {$0, $4}, t0;
mov.b32 {$1, $5}, t1;
mov.b32 {$2, $6}, t2;
mov.b32 {$3, $7}, t3;
}
""")


# DEQUANT 3: the same eight values with one shift instead of three. Nibbles 1, 3, 5 and 7 are masked where they lie
# (bits 4..7 of each half), which reads as 1024 + 16 code under the exponent; one f16x2 fma by 1/16 (0x2C00) minus 72
# (0xD480) gives code - 8, exact (the operands and the result are small integers or powers of two).
_DEQUANT_PTX_ONE_SHIFT = tl.constexpr("""
{
.reg .b32 t0, t1, t2, t3, s, m, f, b;
mov.b32 m, 0x64086408;
mov.b32 f, 0x2C002C00;
mov.b32 b, 0xD480D480;
shr.u32 s, $8, 8;
lop3.b32 t0, $8, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 t1, $8, 0x00F000F0, 0x64006400, 0xEA;
lop3.b32 t2, s, 0x000F000F, 0x64006400, 0xEA;
lop3.b32 t3, s, 0x00F000F0, 0x64006400, 0xEA;
sub.f16x2 t0, t0, m;
fma.rn.f16x2 t1, t1, f, b;
sub.f16x2 t2, t2, m;
fma.rn.f16x2 t3, t3, f, b;
mov.b32 {$0, $4}, t0;
mov.b32 {$1, $5}, t1;
mov.b32 {$2, $6}, t2;
mov.b32 {$3, $7}, t3;
}
""")


@triton.jit
def _join8(n0, n1, n2, n3, n4, n5, n6, n7):
    """Eight [R, W] tensors -> [R, W, 8], element [r, w, i] from n_i.

    join(a, b) adds a last axis of 2 (a at 0, b at 1), so the last join picks bit 0 of i and the first joins bit 2.
    """
    nibbles = tl.join(tl.join(tl.join(n0, n4), tl.join(n2, n6)), tl.join(tl.join(n1, n5), tl.join(n3, n7)))
    return tl.reshape(nibbles, (n0.shape[0], n0.shape[1], 8))


@triton.jit
def _unpack_words(words, MAGIC: tl.constexpr, DEQUANT: tl.constexpr):
    """int32 words [R, W] -> fp16 [R, W, 8] of code - 8: element [r, w, i] from bits 4i..4i+3 of words[r, w].

    DEQUANT 1: eight shift-and-mask passes over the words, joined (pure Triton: what the interpreter runs).
    DEQUANT 2, 3: the same values from one inline-PTX sequence per word (compiled CUDA only; build passes 1
    elsewhere); 3 shifts once instead of three times.
    """
    if DEQUANT >= 2:
        if DEQUANT == 2:
            asm: tl.constexpr = _DEQUANT_PTX
        else:
            asm: tl.constexpr = _DEQUANT_PTX_ONE_SHIFT
        n0, n1, n2, n3, n4, n5, n6, n7 = tl.inline_asm_elementwise(
            asm, "=h,=h,=h,=h,=h,=h,=h,=h,r", [words], dtype=(tl.int16,) * 8, is_pure=True, pack=1)
        codes = _join8(n0, n1, n2, n3, n4, n5, n6, n7)
        return codes.to(tl.float16, bitcast=True)
    else:
        codes = _join8(words & 0xF, (words >> 4) & 0xF, (words >> 8) & 0xF, (words >> 12) & 0xF,
                       (words >> 16) & 0xF, (words >> 20) & 0xF, (words >> 24) & 0xF, (words >> 28) & 0xF)
        return _weights_fp16(codes, MAGIC)


@triton.jit
def _swap_ab_partial(x_ptr, q_ptr, s_ptr, rows, mask_m, offs_n, pid_n, g_start, g_end, N, K,
                     LAYOUT: tl.constexpr, MAGIC: tl.constexpr, SCALE_AFTER_DOT: tl.constexpr, DEQUANT: tl.constexpr,
                     BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    """acc[n, m] = sum over groups [g_start, g_end) of W[k, n] x[m, k], fp32: the SWAP_AB product of one tile."""
    WORDS: tl.constexpr = BLOCK_SIZE_K // 8
    groups = K // BLOCK_SIZE_K
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    offs_w = tl.arange(0, WORDS)
    s_ptrs = s_ptr + g_start * N + offs_n
    xt_ptrs = x_ptr + rows[None, :] * K + (g_start * BLOCK_SIZE_K + offs_k)[:, None]
    if LAYOUT == 0:
        q_ptrs = q_ptr + (g_start * WORDS + offs_w)[None, :] * N + offs_n[:, None]
        q_step = WORDS * N
    elif LAYOUT == 1:
        row_words = tl.multiple_of(K // 8, 16)  # K % 128 == 0: 16-byte rows, so 16-byte loads
        q_ptrs = q_ptr + offs_n.to(tl.int64)[:, None] * row_words + (g_start * WORDS + offs_w)[None, :]
        q_step = WORDS
    else:  # LAYOUT 2 and 3: the same program-order blocks (3 with the nibbles in the operand's order)
        tile = (pid_n.to(tl.int64) * groups + g_start) * (BLOCK_SIZE_N * WORDS)
        q_ptrs = q_ptr + tile + tl.arange(0, BLOCK_SIZE_N)[:, None] * WORDS + offs_w[None, :]
        q_step = BLOCK_SIZE_N * WORDS
    shifts = tl.arange(0, 8) * 4
    acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
    for _ in range(g_start, g_end):
        xt = tl.load(xt_ptrs, mask=mask_m[None, :], other=0.0)
        words = tl.load(q_ptrs)
        if DEQUANT == 0:
            codes = (words[:, :, None] >> shifts[None, None, :]) & 0xF
            codes = tl.reshape(codes, (BLOCK_SIZE_N, BLOCK_SIZE_K))  # column 8j + i is nibble i of word j
            w = _weights_fp16(codes, MAGIC)
        else:
            w = _unpack_words(words, MAGIC, DEQUANT)  # [BLOCK_SIZE_N, 16, 8]
            if LAYOUT == 3:
                # word 4t + q, nibble 4 e0 + 2 e1 + c1 holds the group's k = 32q + 16 c1 + 8 e1 + 2t + e0
                # (repack): put the nibbles in k order, the tile's columns. In the wgmma operand layout lane t of
                # each quad holds columns 2t + e0 + 8 e1 + 16 c of its two rows, so the unpacked words already
                # sit there, each f16x2 pair of the dequant one operand register: no trip through shared memory.
                w = tl.permute(tl.reshape(w, (BLOCK_SIZE_N, 4, 4, 2, 2, 2)), (0, 2, 5, 4, 1, 3))
            w = tl.reshape(w, (BLOCK_SIZE_N, BLOCK_SIZE_K))
        scale = tl.load(s_ptrs)
        if SCALE_AFTER_DOT:
            acc += tl.dot(w, xt) * scale.to(tl.float32)[:, None]
        else:
            acc = tl.dot(w * scale[:, None], xt, acc)
        xt_ptrs += BLOCK_SIZE_K
        q_ptrs += q_step
        s_ptrs += N
    return acc


@triton.jit
def w4a16_main_kernel(
    x_ptr, q_ptr, s_ptr, b_ptr, r_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K,
    ACTIVATION: tl.constexpr, SPLIT_K: tl.constexpr, SWAP_AB: tl.constexpr, LAYOUT: tl.constexpr,
    UNPACK: tl.constexpr, MAGIC: tl.constexpr, SCALE_AFTER_DOT: tl.constexpr, REDUCE_MODE: tl.constexpr,
    DEQUANT: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):
    # M, N and K are runtime values (one compiled kernel serves every shape of a plan); Triton specializes them on
    # divisibility by 16, which K % 128 == 0 and N % 256 == 0 always give.
    WORDS: tl.constexpr = BLOCK_SIZE_K // 8
    groups = K // BLOCK_SIZE_K
    # M tiles vary fastest, so programs that share a weight tile run side by side.
    m_tiles = tl.cdiv(M, BLOCK_SIZE_M)
    pid = tl.program_id(0)
    pid_m = pid % m_tiles
    pid_n = pid // m_tiles
    if SPLIT_K == 1:
        g_start = 0
        g_end = groups
    else:
        pid_k = tl.program_id(1)
        g_start = (pid_k * groups) // SPLIT_K
        g_end = ((pid_k + 1) * groups) // SPLIT_K

    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    mask_m = offs_m < M
    rows = offs_m.to(tl.int64)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    offs_w = tl.arange(0, WORDS)
    s_ptrs = s_ptr + g_start * N + offs_n

    if SWAP_AB:
        # out^T = W^T x^T: the N tile is the MMA's M dimension (64-row wgmma instructions on Hopper) and the few
        # rows of x its N dimension. Words are loaded as [BLOCK_SIZE_N, WORDS]: LAYOUT 0 reads the caller's
        # (K // 8, N) words, LAYOUT 1 a (N, K // 8) copy made at build (each column's words K-contiguous), LAYOUT 2 a
        # copy in program order (N // BLOCK_SIZE_N, K // 128, BLOCK_SIZE_N, 16): one contiguous block per step.
        acc = _swap_ab_partial(x_ptr, q_ptr, s_ptr, rows, mask_m, offs_n, pid_n, g_start, g_end, N, K, LAYOUT, MAGIC,
                               SCALE_AFTER_DOT, DEQUANT, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
        # the output's element (m, n) is acc[n, m]
        io = rows[None, :] * N + offs_n[:, None]
        mask = mask_m[None, :]
        bias = tl.load(b_ptr + offs_n).to(tl.float32)[:, None]
    else:
        x_ptrs = x_ptr + rows[:, None] * K + (g_start * BLOCK_SIZE_K + offs_k)[None, :]
        if UNPACK == 0:
            q_ptrs = q_ptr + (g_start * WORDS + offs_w)[:, None] * N + offs_n[None, :]
            shifts = tl.arange(0, 8) * 4
        else:
            q_ptrs = q_ptr + (g_start * WORDS + offs_k // 8)[:, None] * N + offs_n[None, :]
            shifts = (offs_k % 8) * 4
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for _ in range(g_start, g_end):
            x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
            words = tl.load(q_ptrs)
            if UNPACK == 1:
                w = _weights_fp16((words >> shifts[:, None]) & 0xF, MAGIC)
            elif DEQUANT == 0:
                codes = (words[:, None, :] >> shifts[None, :, None]) & 0xF
                w = _weights_fp16(tl.reshape(codes, (BLOCK_SIZE_K, BLOCK_SIZE_N)), MAGIC)
            else:  # [WORDS, BLOCK_SIZE_N, 8] -> [WORDS, 8, BLOCK_SIZE_N]: row 8j + i is nibble i of word j
                w = tl.permute(_unpack_words(words, MAGIC, DEQUANT), (0, 2, 1))
                w = tl.reshape(w, (BLOCK_SIZE_K, BLOCK_SIZE_N))
            scale = tl.load(s_ptrs)
            if SCALE_AFTER_DOT:
                part = tl.dot(x, w)  # exact products of integer-valued weights, fp32 accumulation
                acc += part * scale.to(tl.float32)[None, :]
            else:  # v0's order: a scaled fp16 weight tile (exact for the task's 7-bit scales), one fused dot
                acc = tl.dot(x, w * scale[None, :], acc)
            x_ptrs += BLOCK_SIZE_K
            q_ptrs += WORDS * N
            s_ptrs += N
        io = rows[:, None] * N + offs_n[None, :]
        mask = mask_m[:, None]
        bias = tl.load(b_ptr + offs_n).to(tl.float32)[None, :]

    if SPLIT_K == 1:
        _epilogue(acc + bias, r_ptr, out_ptr, io, mask, ACTIVATION)
    elif REDUCE_MODE == 0:
        tl.store(ws_ptr + pid_k.to(tl.int64) * M * N + io, acc, mask=mask)
    else:
        _one_launch_fixup(acc, bias, io, mask, r_ptr, out_ptr, ws_ptr, cnt_ptr + pid, 1, SPLIT_K, ACTIVATION)


@triton.jit
def _one_launch_fixup(acc, bias, io, mask, r_ptr, out_ptr, ws_ptr, count_ptr, part, whole, ACTIVATION: tl.constexpr):
    """Add this program's partial into the kept fp32 accumulator (zero between calls) and count ``part`` in on the
    tile's counter; the program whose count completes ``whole`` applies the epilogue, then zeroes the tile and its
    counter for the next call.

    Every thread's adds come before the barrier, the barrier before the counter's release (cumulative at GPU scope),
    and the last program's acquire before its reads: the split-K serial pattern of CUTLASS's semaphore.
    """
    tl.atomic_add(ws_ptr + io, acc, mask=mask, sem="relaxed")
    tl.debug_barrier()
    count = tl.atomic_add(count_ptr, part, sem="acq_rel")
    if count + part == whole:
        z = tl.load(ws_ptr + io, mask=mask, other=0.0, volatile=True)
        _epilogue(z + bias, r_ptr, out_ptr, io, mask, ACTIVATION)
        # The compiler may give the reads above and the zeroing below different thread layouts: without this
        # barrier one thread can zero sums another has not read yet (ledger v39's wrong elements on the H200).
        tl.debug_barrier()
        tl.store(ws_ptr + io, tl.zeros_like(z), mask=mask)
        tl.store(count_ptr, 0)


@triton.jit
def w4a16_stream_kernel(
    x_ptr, q_ptr, s_ptr, b_ptr, r_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K,
    ACTIVATION: tl.constexpr, LAYOUT: tl.constexpr, MAGIC: tl.constexpr, SCALE_AFTER_DOT: tl.constexpr,
    DEQUANT: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):
    # GRID 1 (stream-K, SWAP_AB): the steps (tile, group) in tile-major order, split evenly over a fixed grid, so
    # every program does the same number of group steps whatever the tile count (no partial last wave). A program
    # walks its range tile by tile: a tile it covers alone gets the epilogue at once; a tile shared with its
    # neighbours goes through the kept accumulator, its counter counting group steps up to the tile's total.
    groups = K // BLOCK_SIZE_K
    m_tiles = tl.cdiv(M, BLOCK_SIZE_M)
    total = (m_tiles * (N // BLOCK_SIZE_N)).to(tl.int64) * groups
    programs = tl.num_programs(0)
    pid = tl.program_id(0)
    step = (pid * total) // programs
    end = ((pid + 1) * total) // programs
    while step < end:
        tile = (step // groups).to(tl.int32)
        g_start = (step - tile.to(tl.int64) * groups).to(tl.int32)
        g_end = tl.minimum(groups, g_start + (end - step).to(tl.int32))
        pid_m = tile % m_tiles
        pid_n = tile // m_tiles
        offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        mask_m = offs_m < M
        rows = offs_m.to(tl.int64)
        offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        acc = _swap_ab_partial(x_ptr, q_ptr, s_ptr, rows, mask_m, offs_n, pid_n, g_start, g_end, N, K, LAYOUT, MAGIC,
                               SCALE_AFTER_DOT, DEQUANT, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
        io = rows[None, :] * N + offs_n[:, None]  # the output's element (m, n) is acc[n, m]
        mask = mask_m[None, :]
        bias = tl.load(b_ptr + offs_n).to(tl.float32)[:, None]
        if g_end - g_start == groups:
            _epilogue(acc + bias, r_ptr, out_ptr, io, mask, ACTIVATION)
        else:
            _one_launch_fixup(acc, bias, io, mask, r_ptr, out_ptr, ws_ptr, cnt_ptr + tile, g_end - g_start, groups,
                              ACTIVATION)
        step += g_end - g_start


@triton.jit
def w4a16_reduce_kernel(
    ws_ptr, b_ptr, r_ptr, out_ptr, TOTAL, N,
    ACTIVATION: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
):
    # The (M, N) output flattened: TOTAL = M * N elements; the workspace is SPLIT_K such planes.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < TOTAL
    ws_ptrs = ws_ptr + offs
    z = tl.load(ws_ptrs, mask=mask, other=0.0)
    for _ in tl.static_range(1, SPLIT_K):
        ws_ptrs += TOTAL
        z += tl.load(ws_ptrs, mask=mask, other=0.0)
    z += tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    _epilogue(z, r_ptr, out_ptr, offs, mask, ACTIVATION)


# ------------------------------------------------------------------------------------------------ host
def _launcher(kernel, grid, device_index, bare=False):
    """``launch(*args)`` for a compiled kernel: its launcher called directly on the device's current stream.

    This is what ``CompiledKernel.__getitem__(grid)(*args)`` does in triton 3.6 without the per-call device query and
    launch-hook lookups (so launch hooks, such as a profiler's, do not see these launches). With ``bare``, and when the
    kernel needs no global or profile scratch, the launcher's C entry is called without its Python wrapper. Other
    versions take the public path.
    """
    if hasattr(kernel, "result"):
        kernel = kernel.result()
    init = getattr(kernel, "_init_handles", None)
    if init is None:
        return kernel[grid]
    init()  # loads the module and sets function and run
    run = getattr(kernel, "run", None)
    function = getattr(kernel, "function", None)
    packed = getattr(kernel, "packed_metadata", None)
    if run is None or function is None or packed is None:
        return kernel[grid]
    current_stream = driver.active.get_current_stream
    g0, g1, g2 = grid
    entry = getattr(run, "launch", None)
    if bare and entry is not None and getattr(run, "global_scratch_size", None) == 0 \
            and getattr(run, "profile_scratch_size", None) == 0:
        cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl

        def launch(*args):  # the arguments CudaLauncher.__call__ passes when there is no scratch to allocate
            entry(g0, g1, g2, current_stream(device_index), function, cooperative, pdl, None, None, packed, None, None,
                  None, *args)
        return launch

    def launch(*args):
        run(g0, g1, g2, current_stream(device_index), function, packed, None, None, None, *args)
    return launch


def resident_programs(kernel, num_warps, device_index):
    """How many programs of a compiled kernel the whole GPU holds at once: SMs times the per-SM limit set by
    registers (allocated per warp in units of 256), shared memory (1 KiB reserved per block) and 64 warps."""
    if hasattr(kernel, "result"):
        kernel = kernel.result()
    kernel._init_handles()
    props = driver.active.utils.get_device_properties(device_index)
    return props["multiprocessor_count"] * programs_per_sm(kernel.n_regs, kernel.metadata.shared, num_warps,
                                                           props["max_shared_mem"])


def programs_per_sm(regs_per_thread, shared_bytes, num_warps, max_shared, regs_per_sm=65536, max_warps=64):
    regs_per_warp = -(-max(1, regs_per_thread) * 32 // 256) * 256
    by_regs = regs_per_sm // (regs_per_warp * num_warps)
    by_shared = (max_shared + 1024) // (shared_bytes + 1024)
    return max(1, min(by_regs, by_shared, max_warps // num_warps))


def repack(qweight, layout, block_n):
    """The int32 words in the order LAYOUT reads them (same bytes as the caller's tensor; 0 keeps the caller's)."""
    if layout == 0:
        return qweight
    words_k, n = qweight.shape
    if layout == 1:  # (N, K // 8): each column's words contiguous along K
        return qweight.t().contiguous()
    if layout == 3:
        qweight = _operand_order(qweight)
    if layout in (2, 3):  # (N // block_n, K // 128, block_n, 16): one contiguous block per program and K step
        return qweight.view(words_k // 16, 16, n // block_n, block_n).permute(2, 0, 3, 1).contiguous()
    raise ValueError(f"LAYOUT must be 0, 1, 2 or 3; got {layout!r}")


# LAYOUT 3: word 4t + q of a group, nibble 4 e0 + 2 e1 + c1, holds the group's row 32q + 16 c1 + 8 e1 + 2t + e0,
# which is row 8 j + i of the caller's words with j = 4q + 2 c1 + e1 and i = 2t + e0.
def _operand_source(word, nibble):
    t, q = divmod(word, 4)
    e0, rest = divmod(nibble, 4)
    e1, c1 = divmod(rest, 2)
    return 4 * q + 2 * c1 + e1, 2 * t + e0  # (source word in the group, source nibble)


def _operand_order(qweight, chunk_bytes=1 << 28):
    """The caller's (K // 8, N) words with each group's 128 codes per column permuted into LAYOUT 3's order.

    Works on int64 copies of about ``chunk_bytes`` at a time (groups in chunks), so a build's scratch stays bounded.
    """
    words_k, n = qweight.shape
    groups = qweight.view(words_k // 16, 16, n)
    ordered = torch.empty_like(groups)
    rows, shifts = [], []
    for nibble in range(8):
        sources = [_operand_source(word, nibble) for word in range(16)]
        rows.append(torch.tensor([j for j, _ in sources], device=qweight.device))
        shifts.append(torch.tensor([4 * i for _, i in sources], device=qweight.device).view(1, 16, 1))
    step = max(1, chunk_bytes // (16 * n * 8))
    for start in range(0, groups.shape[0], step):
        src = groups[start:start + step].to(torch.int64)
        out = torch.zeros_like(src)
        for nibble in range(8):
            out |= ((src[:, rows[nibble], :] >> shifts[nibble]) & 0xF) << (4 * nibble)
        # back to int32 two's complement (nibble 7 sets bit 31)
        ordered[start:start + step] = (out - ((out >> 31) << 32)).to(torch.int32)
    return ordered.view(words_k, n)


def _check_weights(qweight, scales, bias, epilogue):
    if epilogue not in ACTIVATIONS:
        raise ValueError(f"epilogue must be one of {sorted(ACTIVATIONS)}; got {epilogue!r}")
    if qweight.dtype != torch.int32 or qweight.dim() != 2 or not qweight.is_contiguous():
        raise ValueError(f"qweight must be a contiguous int32 (K // 8, N) tensor; got {qweight.dtype} {tuple(qweight.shape)}")
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    if K <= 0 or N <= 0 or K % GROUP_SIZE or N % 256:
        raise ValueError(f"K must be a positive multiple of 128 and N of 256; got K={K}, N={N}")
    if scales.dtype != torch.float16 or tuple(scales.shape) != (K // GROUP_SIZE, N) or not scales.is_contiguous():
        raise ValueError(f"scales must be contiguous fp16 {(K // GROUP_SIZE, N)}; got {scales.dtype} {tuple(scales.shape)}")
    if bias.dtype != torch.float16 or tuple(bias.shape) != (N,) or not bias.is_contiguous():
        raise ValueError(f"bias must be contiguous fp16 ({N},); got {bias.dtype} {tuple(bias.shape)}")
    for name, tensor in (("scales", scales), ("bias", bias)):
        if tensor.device != qweight.device:
            raise ValueError(f"{name} must be on {qweight.device}; got {tensor.device}")
    return K, N


def build(qweight, scales, bias, epilogue, config=None):
    """Check the weights once and return ``fn(x, residual) -> out``.

    ``config`` (optional, for tests and tuning) is a dict of overrides applied on top of the plan's tier.
    """
    K, N = _check_weights(qweight, scales, bias, epilogue)
    activation = ACTIVATIONS[epilogue]
    device = qweight.device
    overrides = dict(config) if config else None
    # SWAP_AB, LAYOUT and BLOCK_SIZE_N come from (K, N) alone, whatever M the plan is asked for: repack once, here
    shape_plan = plan(1, K, N, overrides)
    layout = shape_plan["LAYOUT"] if shape_plan["SWAP_AB"] else 0
    words = repack(qweight, layout, shape_plan["BLOCK_SIZE_N"])
    compiled_path = device.type == "cuda" and isinstance(w4a16_main_kernel, JITFunction)
    device_index = qweight.get_device()
    launches = {}  # M -> call(x, residual) -> out
    keeping = set()  # the M whose launch keeps an accumulator (REDUCE_MODE 1): one at a time, within the contract

    def make_launch(M, x, residual):
        cfg = plan(M, K, N, overrides)
        split_k = cfg["SPLIT_K"]
        stream = cfg["GRID"] == 1
        one_launch = stream or (split_k > 1 and cfg["REDUCE_MODE"] == 1)
        dequant = cfg["DEQUANT"] if compiled_path else min(cfg["DEQUANT"], 1)  # inline PTX needs a compiled kernel
        if stream:
            kernel = w4a16_stream_kernel
            main_tail = (M, N, K, activation, layout, cfg["MAGIC"], cfg["SCALE_AFTER_DOT"], dequant,
                         cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], GROUP_SIZE)
            # the grid is set below once the compiled kernel says how many programs fit at once (PROGRAMS 0)
            grid = (max(1, cfg["PROGRAMS"]), 1, 1)
        else:
            kernel = w4a16_main_kernel
            main_tail = (M, N, K, activation, split_k, cfg["SWAP_AB"], layout, cfg["UNPACK"], cfg["MAGIC"],
                         cfg["SCALE_AFTER_DOT"], cfg["REDUCE_MODE"], dequant, cfg["BLOCK_SIZE_M"],
                         cfg["BLOCK_SIZE_N"], GROUP_SIZE)
            grid = (cfg["M_TILES"] * cfg["N_TILES"], split_k, 1)
        main_opts = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
        total = M * N
        reduce_block = cfg["REDUCE_BLOCK"]
        reduce_grid = (triton.cdiv(total, reduce_block), 1, 1)
        reduce_tail = (total, N, activation, split_k, reduce_block)
        reduce_opts = {"num_warps": cfg["REDUCE_WARPS"]}
        ws_shape = (split_k, M, N)
        out_shape = (M, N)
        f16, f32 = torch.float16, torch.float32
        if one_launch:
            # kept between calls: 4*M*N bytes of fp32 (the contract's floating allowance is 2*M*K + 4*M*N + 1 MiB)
            # and one int32 counter per output tile; the last program of each tile leaves both at zero
            for other in keeping - {M}:
                launches.pop(other, None)
            keeping.clear()
            keeping.add(M)
            accumulator = torch.zeros(out_shape, dtype=f32, device=device)
            counters = torch.zeros(cfg["M_TILES"] * cfg["N_TILES"], dtype=torch.int32, device=device)

        if not compiled_path:
            # The interpreter (CPU tensors) or any non-CUDA device: the normal JIT dispatch.
            def call(x, residual):
                out = torch.empty(out_shape, dtype=f16, device=x.device)
                if one_launch:
                    kernel[grid](x, words, scales, bias, residual, out, accumulator, counters, *main_tail, **main_opts)
                elif split_k == 1:
                    kernel[grid](x, words, scales, bias, residual, out, out, out, *main_tail, **main_opts)
                else:
                    ws = torch.empty(ws_shape, dtype=f32, device=x.device)
                    kernel[grid](x, words, scales, bias, residual, out, ws, out, *main_tail, **main_opts)
                    w4a16_reduce_kernel[reduce_grid](ws, bias, residual, out, *reduce_tail, **reduce_opts)
                return out
            return call

        # CUDA: compile once for this M (the warmup specializes on the actual argument properties: 16-byte aligned
        # pointers, M's divisibility by 16 or M == 1), then launch through the CompiledKernel's launcher. The
        # launcher of triton 3.6 takes every kernel parameter in declaration order, constexpr ones included (their
        # values are parsed and ignored), exactly like JITFunction.run passes *bound_args.values().
        out = torch.empty(out_shape, dtype=f16, device=device)
        if one_launch:
            ws, cnt = accumulator, counters
        else:
            ws, cnt = (torch.empty(ws_shape, dtype=f32, device=device) if split_k > 1 else out), out
        # warmup compiles without launching: the accumulator and the counters stay at zero
        main = kernel.warmup(x, words, scales, bias, residual, out, ws, cnt, *main_tail, grid=grid, **main_opts)
        if stream and cfg["PROGRAMS"] <= 0:
            steps = cfg["M_TILES"] * cfg["N_TILES"] * (K // GROUP_SIZE)
            grid = (min(steps, resident_programs(main, cfg["num_warps"], device_index)), 1, 1)
        raw = cfg["LAUNCH"] == 2 and (split_k == 1 or one_launch)
        run_main = _launcher(main, grid, device_index, bare=raw)
        if raw:
            # integer addresses: build holds words, scales and bias, this closure the accumulator and counters
            w_ptr, s_ptr, b_ptr = words.data_ptr(), scales.data_ptr(), bias.data_ptr()
            a_ptr, c_ptr = (accumulator.data_ptr(), counters.data_ptr()) if one_launch else (0, 0)

            def call(x, residual):
                # every call, not only this M's first: the launcher cannot check a bare address's device
                if x.get_device() != device_index or residual.get_device() != device_index:
                    raise ValueError(f"x and residual must be on {device}; got {x.device} and {residual.device}")
                out = torch.empty(out_shape, dtype=f16, device=device)
                o_ptr = out.data_ptr()
                run_main(x.data_ptr(), w_ptr, s_ptr, b_ptr, residual.data_ptr(), o_ptr,
                         a_ptr if one_launch else o_ptr, c_ptr if one_launch else o_ptr, *main_tail)
                return out
            return call
        if one_launch:
            def call(x, residual):
                out = torch.empty(out_shape, dtype=f16, device=device)
                run_main(x, words, scales, bias, residual, out, accumulator, counters, *main_tail)
                return out
            return call
        if split_k == 1:
            def call(x, residual):
                out = torch.empty(out_shape, dtype=f16, device=device)
                run_main(x, words, scales, bias, residual, out, out, out, *main_tail)
                return out
            return call

        reduce = w4a16_reduce_kernel.warmup(ws, bias, residual, out, *reduce_tail, grid=reduce_grid, **reduce_opts)
        run_reduce = _launcher(reduce, reduce_grid, device_index)

        def call(x, residual):
            out = torch.empty(out_shape, dtype=f16, device=device)
            ws = torch.empty(ws_shape, dtype=f32, device=device)
            run_main(x, words, scales, bias, residual, out, ws, out, *main_tail)
            run_reduce(ws, bias, residual, out, *reduce_tail)
            return out
        return call

    def fn(x, residual):
        if x.dtype != torch.float16 or x.dim() != 2 or x.shape[1] != K:
            raise ValueError(f"x must be fp16 (M, {K}); got {x.dtype} {tuple(x.shape)}")
        M = x.shape[0]
        if residual.dtype != torch.float16 or residual.dim() != 2 or residual.shape[0] != M or residual.shape[1] != N:
            raise ValueError(f"residual must be fp16 ({M}, {N}); got {residual.dtype} {tuple(residual.shape)}")
        if M == 0:
            raise ValueError("x must have at least one row")
        # The kernels assume contiguous rows and 16-byte aligned bases (compiled that way); copy anything else.
        if not x.is_contiguous() or x.data_ptr() & 15:
            x = x.clone(memory_format=torch.contiguous_format)
        if not residual.is_contiguous() or residual.data_ptr() & 15:
            residual = residual.clone(memory_format=torch.contiguous_format)
        call = launches.get(M)
        if call is None:
            if x.device != device or residual.device != device:
                raise ValueError(f"x and residual must be on {device}; got {x.device} and {residual.device}")
            call = make_launch(M, x, residual)
            launches[M] = call
        return call(x, residual)

    return fn
