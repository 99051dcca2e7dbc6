"""Plain-torch W4A16 pieces shared by the red-team solutions (copied beside each one as a helper module).

Honest on its own: per call it dequantizes one 128-row group at a time and accumulates in fp32, so it keeps
nothing and is correct everywhere; each red-team solution changes exactly one thing.
"""
import math

import torch

GROUP_SIZE = 128


def unpack_codes(qweight):
    shifts = torch.arange(8, device=qweight.device, dtype=torch.int32).view(1, 8, 1) * 4
    return ((qweight.unsqueeze(1) >> shifts) & 0xF).reshape(qweight.shape[0] * 8, qweight.shape[1])


def dequantize(qweight, scales, dtype=torch.float32):
    codes = unpack_codes(qweight).to(dtype) - 8
    return codes * scales.to(dtype).repeat_interleave(GROUP_SIZE, dim=0)


def matmul_by_group(x, qweight, scales):
    acc = torch.zeros((x.shape[0], qweight.shape[1]), dtype=torch.float32, device=x.device)
    for g in range(scales.shape[0]):
        w = dequantize(qweight[g * 16 : (g + 1) * 16], scales[g : g + 1])
        acc += x[:, g * GROUP_SIZE : (g + 1) * GROUP_SIZE].float() @ w
    return acc


def epilogue(z, bias, residual, activation):
    z = z + bias.float()
    if activation == "silu":
        act = z * torch.sigmoid(z)
    else:
        act = 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    return (act + residual.float()).half()
