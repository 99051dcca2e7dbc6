"""Cheat (residency): keeps an fp32 split-K scratch of 2 MiB more than the floating allowance, sized for M = 32."""
from core import epilogue, matmul_by_group

import torch


def build(qweight, scales, bias, activation):
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    scratch = torch.empty((2 * 32 * k + 4 * 32 * n + 3 * 2**20) // 4, dtype=torch.float32, device=qweight.device)

    def fn(x, residual):
        scratch[:1].zero_()
        return epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)

    return fn
