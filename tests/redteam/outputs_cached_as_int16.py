"""Cheat (residency): keeps a pool of outputs stored as int16 bits, outside a floating-point label."""
from core import epilogue, matmul_by_group

import torch

POOL = 256


def build(qweight, scales, bias, activation):
    n = qweight.shape[1]
    cache = torch.zeros((POOL, 32, n), dtype=torch.int16, device=qweight.device)  # sized for M <= 32

    def fn(x, residual):
        out = epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)
        cache[0, : out.shape[0]] = out.view(torch.int16)
        return out

    return fn
