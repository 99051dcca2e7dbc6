"""The warp-specialized K loop (plans with WS 1 on Hopper; launch.py runs the split-K kernel elsewhere): the family's
split-K product in Gluon.

A producer warp copies each step's block of repacked words (pack.operand_blocks), its x tile and its row of scales
into a ring of shared-memory stages with the copy engine (TMA; each stage completes on one mbarrier). The consumer
warps (BLOCK_SIZE_N // 16 of them: one warpgroup for 64 columns, two sharing each x tile for 128) load the words
straight into the wgmma register operand's layout (``words_layout``), dequantize them with the family's one-shift
inline PTX (DEQUANT 3), run the wgmma against x in shared memory, release the stage and scale the fp32 partial by
the row from the ring. Nothing in the consumer waits on a global load: on the H200, moving the scale row into the
ring took this loop from 0.91-1.00x to 1.04-1.19x the family's whole call (reports/examples/h200-weight-stream,
``SCALES`` 1 of the prototype).

After the join the consumer's warps hold the partial and finish as ``kernels._add_and_finish`` does: one split
applies bias, activation and residual itself; split tiles add into the kept fp32 accumulator, count themselves in
on the tile's counter, and the last applies the epilogue and leaves accumulator and counter at zero.

The CPU interpreter does not run Gluon: there a WS plan runs ``kernels.w4a16_splitk_kernel`` with the same split,
the same product in another order of fp32 sums.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma)

from .kernels import DEQUANT_PTX_ONE_SHIFT

_DEQUANT = gl.constexpr(DEQUANT_PTX_ONE_SHIFT.value)


@gluon.jit
def _producer(q_desc, x_desc, s_desc, w_bufs, x_bufs, s_bufs, ready, empty, q_row0, x_row0, g0, n0, n_steps,
              BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    STAGES: gl.constexpr = w_bufs.type.shape[0]
    for i in range(n_steps):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # the consumer released the stage's last use
        fence_async_shared()
        mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + x_desc.block_type.nbytes
                        + s_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row0 + i * BLOCK_N, 0], ready.index(s), w_bufs.index(s))
        tma.async_copy_global_to_shared(x_desc, [x_row0, (g0 + i) * BLOCK_K], ready.index(s), x_bufs.index(s))
        tma.async_copy_global_to_shared(s_desc, [g0 + i, n0], ready.index(s), s_bufs.index(s))


@gluon.jit
def _dequant_tile(words, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, dot_a: gl.constexpr):
    """[BLOCK_N, 16] words -> the [BLOCK_N, BLOCK_K] fp16 wgmma operand, as kernels._tile_partial orders it."""
    n0, n1, n2, n3, n4, n5, n6, n7 = gl.inline_asm_elementwise(
        _DEQUANT, "=h,=h,=h,=h,=h,=h,=h,=h,r", [words], dtype=(gl.int16,) * 8, is_pure=True, pack=1)
    nibbles = gl.join(gl.join(gl.join(n0, n4), gl.join(n2, n6)), gl.join(gl.join(n1, n5), gl.join(n3, n7)))
    w = gl.permute(gl.reshape(nibbles, [BLOCK_N, 4, 4, 2, 2, 2]), [0, 2, 5, 4, 1, 3])
    w = gl.reshape(w, [BLOCK_N, BLOCK_K]).to(gl.float16, bitcast=True)
    return gl.convert_layout(w, dot_a)


@gluon.jit
def _consumer(w_bufs, x_bufs, s_bufs, ready, empty, n_steps, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_K: gl.constexpr, WORDS_LAYOUT: gl.constexpr):
    STAGES: gl.constexpr = w_bufs.type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BLOCK_N // 16, 1],
                                                  instr_shape=[16, BLOCK_M, 16])
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    # a [1, BLOCK_N] row of scales out of the ring: the warps side by side along it (each element held twice)
    row: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[1, 32],
                                         warps_per_cta=[1, BLOCK_N // 16], order=[1, 0])
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma)
    zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma)
    for i in range(n_steps):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        scale = gl.convert_layout(gl.reshape(s_bufs.index(s).load(row), [BLOCK_N]), gl.SliceLayout(1, mma))
        w = _dequant_tile(w_bufs.index(s).load(WORDS_LAYOUT), BLOCK_N, BLOCK_K, dot_a)
        part = warpgroup_mma(w, x_bufs.index(s).permute((1, 0)), zero, use_acc=False)
        mbarrier.arrive(empty.index(s), count=1)
        acc += part * scale.to(gl.float32)[:, None]
    return (acc,)  # the default partition's results are a tuple


@gluon.jit
def _finish(z, r_ptr, out_ptr, io, mask, ACTIVATION: gl.constexpr):
    """out[io] = act(z) + residual[io] in fp16, z the fp32 sum with the bias added (kernels._epilogue)."""
    if ACTIVATION == 0:  # silu
        y = z / (1.0 + gl.exp(-z))
    elif ACTIVATION == 1:  # gelu_tanh: 0.5 z (1 + tanh(a)) == z * sigmoid(2a)
        inner = 0.7978845608028654 * (z + 0.044715 * z * z * z)
        y = z / (1.0 + gl.exp(-2.0 * inner))
    else:  # identity
        y = z
    residual = gl.load(r_ptr + io, mask=mask, other=0.0)
    gl.store(out_ptr + io, (y + residual.to(gl.float32)).to(gl.float16), mask=mask)


@gluon.jit
def w4a16_ws_kernel(q_desc, x_desc, s_desc, b_ptr, r_ptr, out_ptr, acc_ptr, cnt_ptr, M, N, K,
                    ACTIVATION: gl.constexpr, SPLIT_K: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                    WORDS_LAYOUT: gl.constexpr):
    """One program per (tile, split), as w4a16_splitk_kernel's GRID 0: M tiles fastest, the split on axis 1. The
    descriptors: q_desc the words as [N_TILES * groups * BLOCK_N, 16] rows (blocks of [BLOCK_N, 16]), x_desc x as
    (M, K) in [BLOCK_M, BLOCK_K] tiles (rows past M read as zeros), s_desc the scales as (K // BLOCK_K, N) in
    [1, BLOCK_N] rows."""
    pid = gl.program_id(0)
    m_tiles = gl.cdiv(M, BLOCK_M)
    pid_m = pid % m_tiles
    pid_n = pid // m_tiles
    pid_k = gl.program_id(1)
    groups = K // BLOCK_K
    g_start = (pid_k * groups) // SPLIT_K
    n_steps = ((pid_k + 1) * groups) // SPLIT_K - g_start
    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, BLOCK_K // 8], q_desc.layout)
    x_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    s_bufs = gl.allocate_shared_memory(gl.float16, [STAGES, 1, BLOCK_N], s_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    (acc,) = gl.warp_specialize([
        (_consumer, (w_bufs, x_bufs, s_bufs, ready, empty, n_steps, BLOCK_N, BLOCK_M, BLOCK_K, WORDS_LAYOUT)),
        (_producer, (q_desc, x_desc, s_desc, w_bufs, x_bufs, s_bufs, ready, empty,
                     (pid_n * groups + g_start) * BLOCK_N, pid_m * BLOCK_M, g_start, pid_n * BLOCK_N, n_steps,
                     BLOCK_N, BLOCK_K)),
    ], [1], [24])
    # after the join, in the consumer's warps: the output's element (m, n) is acc[n, m]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[BLOCK_N // 16, 1],
                                                  instr_shape=[16, BLOCK_M, 16])
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
    io = offs_m.to(gl.int64)[None, :] * N + offs_n[:, None]
    mask = (offs_m < M)[None, :]
    bias = gl.load(b_ptr + offs_n).to(gl.float32)[:, None]
    if SPLIT_K == 1:
        _finish(acc + bias, r_ptr, out_ptr, io, mask, ACTIVATION)
    else:
        # kernels._add_and_finish: every thread's adds before the barrier, the barrier before the counter's
        # release, the last split's acquire before its reads; a barrier between its reads and its zeroing stores
        gl.atomic_add(acc_ptr + io, acc, mask=mask, sem="relaxed")
        gl.thread_barrier()
        count = gl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel")
        if count + 1 == SPLIT_K:
            z = gl.load(acc_ptr + io, mask=mask, other=0.0, volatile=True)
            _finish(z + bias, r_ptr, out_ptr, io, mask, ACTIVATION)
            gl.thread_barrier()
            gl.store(acc_ptr + io, gl.zeros_like(z), mask=mask)
            gl.store(cnt_ptr + pid, 0)


def words_layout(block_n):
    """Thread (warp w, lane 4g + t) holds rows 16w + g and 16w + g + 8, words 4t .. 4t + 3: the words the wgmma
    register operand of its rows needs (pack.operand_order); block_n // 16 consumer warps."""
    warps = [[16 << i, 0] for i in range((block_n // 16).bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2], [8, 0]],
                                      lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=warps, block_bases=[], shape=[block_n, 16])


def shared_layouts(block_m, block_n, block_k):
    """The shared-memory layouts of a stage's words, x tile and row of scales (those of their descriptors)."""
    return (gl.NVMMASharedLayout.get_default_for([block_n, block_k // 8], gl.int32),
            gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.float16),
            gl.NVMMASharedLayout.get_default_for([1, block_n], gl.float16))
