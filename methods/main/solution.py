"""W4A16 GEMM with a fused bias + activation + residual epilogue: the inherited direct-W4 baseline (v0).

Contract (SPEC.md):
    build(qweight, scales, bias, epilogue) -> fn;  fn(x, residual) -> out
    qweight  int32 (K // 8, N)   word [k // 8, n] holds the codes of rows 8(k // 8) .. +7, row 8j + i in bits 4i..4i+3
    scales   fp16  (K // 128, N) one scale per 128-row group and column
    bias     fp16  (N,)
    x        fp16  (M, K);  residual fp16 (M, N);  out fp16 (M, N), a fresh tensor on every call
    W[k, n] = (code[k, n] - 8) * scales[k // 128, n];   out = act(x @ W + bias) + residual,  act in {silu, gelu_tanh}

One kernel reads the packed int32 words directly (no unpacked weight is ever kept), dequantizes a BLOCK_SIZE_K x
BLOCK_SIZE_N tile to fp16 in registers, accumulates x @ W in fp32 and applies bias, activation and residual before the
single store. One fixed configuration; no split-K, no autotuning.
"""
import torch
import triton
import triton.language as tl

GROUP_SIZE = 128
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


def get_config():
    # BLOCK_SIZE_K equals the quantization group, so each K step uses one row of scales.
    return {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": GROUP_SIZE, "num_warps": 4, "num_stages": 3}


@triton.jit
def w4a16_gemm_kernel(
    # Pointers
    x_ptr, qweight_ptr, scales_ptr, bias_ptr, residual_ptr, out_ptr,
    # Sizes
    M, N, K,
    # Strides
    stride_xm, stride_xk,
    stride_qk, stride_qn,
    stride_sg, stride_sn,
    stride_rm, stride_rn,
    stride_om, stride_on,
    # Meta-parameters
    ACTIVATION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):
    # Map the program id to the output tile it computes.
    pid = tl.program_id(axis=0)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n

    # Pointers to the first x tile and to the int32 word holding each (k, n) code of the first weight tile.
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    q_ptrs = qweight_ptr + (offs_k[:, None] // 8) * stride_qk + offs_n[None, :] * stride_qn
    shifts = (offs_k % 8) * 4
    mask_m = offs_m[:, None] < M

    # K loop: dequantize one group's tile to fp16 and accumulate in fp32.
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        x = tl.load(x_ptrs, mask=mask_m, other=0.0)
        words = tl.load(q_ptrs)
        codes = (words >> shifts[:, None]) & 0xF
        scale = tl.load(scales_ptr + k * stride_sg + offs_n * stride_sn)
        w = (codes - 8).to(tl.float16) * scale[None, :]
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_SIZE_K * stride_xk
        q_ptrs += (BLOCK_SIZE_K // 8) * stride_qk

    # Epilogue: bias, activation, residual, then one masked fp16 store.
    acc += tl.load(bias_ptr + offs_n).to(tl.float32)[None, :]
    if ACTIVATION == 0:  # silu
        acc = acc * tl.sigmoid(acc)
    else:  # gelu_tanh: 0.5 z (1 + tanh(a)) == z * sigmoid(2a)
        inner = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = acc * tl.sigmoid(2.0 * inner)
    residual = tl.load(residual_ptr + offs_m[:, None] * stride_rm + offs_n[None, :] * stride_rn, mask=mask_m, other=0.0)
    acc += residual.to(tl.float32)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(tl.float16), mask=mask_m)


def build(qweight, scales, bias, epilogue):
    """Check the weights once and return ``fn(x, residual) -> out``."""
    if epilogue not in ACTIVATIONS:
        raise ValueError(f"epilogue must be one of {sorted(ACTIVATIONS)}; got {epilogue!r}")
    if qweight.dtype != torch.int32 or qweight.dim() != 2 or not qweight.is_contiguous():
        raise ValueError(f"qweight must be a contiguous int32 (K // 8, N) tensor; got {qweight.dtype} {tuple(qweight.shape)}")
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    if K % GROUP_SIZE or N % 256:
        raise ValueError(f"K must be a multiple of 128 and N of 256; got K={K}, N={N}")
    if scales.dtype != torch.float16 or tuple(scales.shape) != (K // GROUP_SIZE, N):
        raise ValueError(f"scales must be fp16 {(K // GROUP_SIZE, N)}; got {scales.dtype} {tuple(scales.shape)}")
    if bias.dtype != torch.float16 or tuple(bias.shape) != (N,):
        raise ValueError(f"bias must be fp16 ({N},); got {bias.dtype} {tuple(bias.shape)}")
    config = get_config()
    block_m, block_n = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    activation = ACTIVATIONS[epilogue]

    def fn(x, residual):
        if x.dtype != torch.float16 or x.dim() != 2 or x.shape[1] != K:
            raise ValueError(f"x must be fp16 (M, {K}); got {x.dtype} {tuple(x.shape)}")
        M = x.shape[0]
        out = torch.empty((M, N), dtype=torch.float16, device=x.device)
        grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
        w4a16_gemm_kernel[grid](
            x, qweight, scales, bias, residual, out,
            M, N, K,
            x.stride(0), x.stride(1),
            qweight.stride(0), qweight.stride(1),
            scales.stride(0), scales.stride(1),
            residual.stride(0), residual.stride(1),
            out.stride(0), out.stride(1),
            ACTIVATION=activation,
            BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=config["BLOCK_SIZE_K"],
            num_warps=config["num_warps"], num_stages=config["num_stages"],
        )
        return out

    return fn
