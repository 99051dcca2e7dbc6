"""Cheat (no_tampering): replaces torch.cuda.synchronize with a no-op, so a timer would stop before the work ends."""
from core import epilogue, matmul_by_group

import torch


def build(qweight, scales, bias, activation):
    torch.cuda.synchronize = lambda device=None: None

    def fn(x, residual):
        return epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)

    return fn
