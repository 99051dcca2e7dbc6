"""The family's Triton kernels: swap-AB tiles over LAYOUT 3 words, an inline-PTX dequant, one-launch split-K.

Every kernel computes out^T = W^T x^T: a BLOCK_SIZE_N slice of output columns is the MMA's M dimension (64-row wgmma
instructions on Hopper, with the dequantized weight tile as the register operand) and the few rows of x its N
dimension. One K step is one 128-row quantization group, so each step loads one row of scales.

The words arrive repacked by ``pack.operand_blocks``: one contiguous [BLOCK_SIZE_N, 16] block per (N tile, group),
each word's nibbles already in the order the wgmma register operand holds them, so the dequantized tile never goes
through shared memory.
"""
import triton
import triton.language as tl


@triton.jit
def _epilogue(z, r_ptr, out_ptr, io, mask, ACTIVATION: tl.constexpr):
    """out[io] = act(z) + residual[io] in fp16, z the fp32 sum with the bias added."""
    if ACTIVATION == 0:  # silu
        y = z * tl.sigmoid(z)
    elif ACTIVATION == 1:  # gelu_tanh: 0.5 z (1 + tanh(a)) == z * sigmoid(2a)
        inner = 0.7978845608028654 * (z + 0.044715 * z * z * z)
        y = z * tl.sigmoid(2.0 * inner)
    else:  # identity: a plain linear layer (outside the scored contract; evals/e2e.py serves models with it)
        y = z
    residual = tl.load(r_ptr + io, mask=mask, other=0.0)
    tl.store(out_ptr + io, (y + residual.to(tl.float32)).to(tl.float16), mask=mask)


# DEQUANT 2. Eight nibbles of one int32 word -> eight fp16 values code - 8, two per 32-bit operation: lop3 keeps
# nibbles i and i + 4 under the fp16 exponent 0x6400 (1024 + code, exact), one f16x2 subtraction of 1032 gives
# code - 8.
DEQUANT_PTX = tl.constexpr("""
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
DEQUANT_PTX_ONE_SHIFT = tl.constexpr("""
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
def _unpack_words(words, DEQUANT: tl.constexpr):
    """int32 words [R, W] -> fp16 [R, W, 8] of code - 8: element [r, w, i] from bits 4i..4i+3 of words[r, w].

    DEQUANT 1: eight shift-and-mask passes over the words, joined, then the 0x6400 exponent trick (pure Triton: what
    the interpreter runs). DEQUANT 2 and 3: the same values from one inline-PTX sequence per word (compiled CUDA only).
    """
    if DEQUANT >= 2:
        if DEQUANT == 2:
            asm: tl.constexpr = DEQUANT_PTX
        else:
            asm: tl.constexpr = DEQUANT_PTX_ONE_SHIFT
        n0, n1, n2, n3, n4, n5, n6, n7 = tl.inline_asm_elementwise(
            asm, "=h,=h,=h,=h,=h,=h,=h,=h,r", [words], dtype=(tl.int16,) * 8, is_pure=True, pack=1)
        codes = _join8(n0, n1, n2, n3, n4, n5, n6, n7)
        return codes.to(tl.float16, bitcast=True)
    else:
        codes = _join8(words & 0xF, (words >> 4) & 0xF, (words >> 8) & 0xF, (words >> 12) & 0xF,
                       (words >> 16) & 0xF, (words >> 20) & 0xF, (words >> 24) & 0xF, (words >> 28) & 0xF)
        # 0x6400 | c is the fp16 1024 + c (ulp 1 at 1024): exact; minus 1032 gives c - 8 exactly.
        return (codes | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - 1032.0


@triton.jit
def _operand_tile(words, DEQUANT: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    """A step's [BLOCK_SIZE_N, 16] words -> the [BLOCK_SIZE_N, BLOCK_SIZE_K] fp16 tile of code - 8, columns in k order.

    Word 4t + q, nibble 4 e0 + 2 e1 + c1 holds the group's k = 32q + 16 c1 + 8 e1 + 2t + e0 (pack.py). In the wgmma
    operand layout lane t of each quad holds columns 2t + e0 + 8 e1 + 16 c of its two rows, so the unpacked words
    already sit there, each f16x2 pair of the dequant one operand register: no trip through shared memory.
    """
    w = _unpack_words(words, DEQUANT)  # [BLOCK_SIZE_N, 16, 8]
    w = tl.permute(tl.reshape(w, (BLOCK_SIZE_N, 4, 4, 2, 2, 2)), (0, 2, 5, 4, 1, 3))
    return tl.reshape(w, (BLOCK_SIZE_N, BLOCK_SIZE_K))


@triton.jit
def _tile_partial(x_ptr, q_ptr, s_ptr, rows, mask_m, offs_n, pid_n, g_start, g_end, N, K,
                  SCALE_AFTER_DOT: tl.constexpr, DEQUANT: tl.constexpr, BLOCK_SIZE_M: tl.constexpr,
                  BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    """acc[n, m] = sum over groups [g_start, g_end) of W[k, n] x[m, k] in fp32: one tile's share of the product.

    The compiler's pipeline streams the words and x ``num_stages`` steps ahead; a row of scales (2 bytes a thread) is
    too narrow for its asynchronous copies, so each step loads its own (loading it a step early was no faster on the
    H200: reports/examples/h200-weight-stream).
    """
    WORDS: tl.constexpr = BLOCK_SIZE_K // 8
    groups = K // BLOCK_SIZE_K
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    s_ptrs = s_ptr + g_start * N + offs_n
    xt_ptrs = x_ptr + rows[None, :] * K + (g_start * BLOCK_SIZE_K + offs_k)[:, None]
    # the (N tile, group) blocks are contiguous, in that order: one block per step
    block = (pid_n.to(tl.int64) * groups + g_start) * (BLOCK_SIZE_N * WORDS)
    q_ptrs = q_ptr + block + tl.arange(0, BLOCK_SIZE_N)[:, None] * WORDS + tl.arange(0, WORDS)[None, :]
    acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
    for g in range(g_start, g_end):
        xt = tl.load(xt_ptrs, mask=mask_m[None, :], other=0.0)
        words = tl.load(q_ptrs)
        q_ptrs += BLOCK_SIZE_N * WORDS
        w = _operand_tile(words, DEQUANT, BLOCK_SIZE_N, BLOCK_SIZE_K)
        scale = tl.load(s_ptrs)
        s_ptrs += N
        if SCALE_AFTER_DOT:  # exact products of integer-valued weights, scaled in fp32
            acc += tl.dot(w, xt) * scale.to(tl.float32)[:, None]
        else:  # a scaled fp16 tile (exact for 7-bit scales), one fused dot
            acc = tl.dot(w * scale[:, None], xt, acc)
        xt_ptrs += BLOCK_SIZE_K
    return acc


@triton.jit
def _add_and_finish(acc, bias, io, mask, r_ptr, out_ptr, acc_ptr, count_ptr, part, whole, ACTIVATION: tl.constexpr):
    """Add this program's partial into the kept fp32 accumulator (zero between calls) and count ``part`` in on the
    tile's counter; the program whose count completes ``whole`` applies the epilogue, then zeroes the tile and its
    counter for the next call.

    Every thread's adds come before the barrier, the barrier before the counter's release (cumulative at GPU scope),
    and the last program's acquire before its reads: the split-K serial pattern of CUTLASS's semaphore.
    """
    tl.atomic_add(acc_ptr + io, acc, mask=mask, sem="relaxed")
    tl.debug_barrier()
    count = tl.atomic_add(count_ptr, part, sem="acq_rel")
    if count + part == whole:
        z = tl.load(acc_ptr + io, mask=mask, other=0.0, volatile=True)
        _epilogue(z + bias, r_ptr, out_ptr, io, mask, ACTIVATION)
        # The compiler may give the reads above and the zeroing below different thread layouts: without this barrier
        # one thread can zero sums that another has not read yet.
        tl.debug_barrier()
        tl.store(acc_ptr + io, tl.zeros_like(z), mask=mask)
        tl.store(count_ptr, 0)


@triton.jit
def w4a16_splitk_kernel(
    # pointers: activations, packed words, scales, bias, residual, output, kept accumulator and tile counters
    x_ptr, q_ptr, s_ptr, b_ptr, r_ptr, out_ptr, acc_ptr, cnt_ptr,
    # sizes: runtime values (one compiled kernel serves every shape of a plan); Triton specializes them on
    # divisibility by 16, which K % 128 == 0 and N % 256 == 0 always give
    M, N, K,
    # meta-parameters
    ACTIVATION: tl.constexpr, SPLIT_K: tl.constexpr, SCALE_AFTER_DOT: tl.constexpr, DEQUANT: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):
    """GRID 0: one program per (tile, split). Split s covers groups [s*G // S, (s+1)*G // S); with SPLIT_K 1 the
    program applies the epilogue itself, else the splits meet in the kept accumulator (``_add_and_finish``)."""
    # map the program to its tile (M tiles vary fastest, so programs that share a weight tile run side by side) and
    # its groups
    groups = K // BLOCK_SIZE_K
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
    # the K loop
    acc = _tile_partial(x_ptr, q_ptr, s_ptr, rows, mask_m, offs_n, pid_n, g_start, g_end, N, K, SCALE_AFTER_DOT,
                        DEQUANT, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
    # epilogue: the output's element (m, n) is acc[n, m]
    io = rows[None, :] * N + offs_n[:, None]
    mask = mask_m[None, :]
    bias = tl.load(b_ptr + offs_n).to(tl.float32)[:, None]
    if SPLIT_K == 1:
        _epilogue(acc + bias, r_ptr, out_ptr, io, mask, ACTIVATION)
    else:
        _add_and_finish(acc, bias, io, mask, r_ptr, out_ptr, acc_ptr, cnt_ptr + pid, 1, SPLIT_K, ACTIVATION)


@triton.jit
def w4a16_stream_kernel(
    x_ptr, q_ptr, s_ptr, b_ptr, r_ptr, out_ptr, acc_ptr, cnt_ptr,
    M, N, K,
    ACTIVATION: tl.constexpr, SCALE_AFTER_DOT: tl.constexpr, DEQUANT: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):
    """GRID 1 (stream-K): the (tile, group) steps in tile-major order, split evenly over a fixed grid, so every
    program does the same number of group steps whatever the tile count (no partial last wave). A program walks its
    range tile by tile: a tile it covers alone gets the epilogue at once; a tile shared with its neighbours goes
    through the kept accumulator, its counter counting group steps up to the tile's total."""
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
        acc = _tile_partial(x_ptr, q_ptr, s_ptr, rows, mask_m, offs_n, pid_n, g_start, g_end, N, K, SCALE_AFTER_DOT,
                            DEQUANT, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
        io = rows[None, :] * N + offs_n[:, None]  # the output's element (m, n) is acc[n, m]
        mask = mask_m[None, :]
        bias = tl.load(b_ptr + offs_n).to(tl.float32)[:, None]
        if g_end - g_start == groups:
            _epilogue(acc + bias, r_ptr, out_ptr, io, mask, ACTIVATION)
        else:
            _add_and_finish(acc, bias, io, mask, r_ptr, out_ptr, acc_ptr, cnt_ptr + tile, g_end - g_start, groups,
                            ACTIVATION)
        step += g_end - g_start
