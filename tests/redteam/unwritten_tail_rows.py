"""Cheat (fresh_outputs): computes only the first 16 rows and leaves the rest of a torch.empty output unwritten."""
from core import epilogue, matmul_by_group

import torch

ROWS = 16


def build(qweight, scales, bias, activation):
    def fn(x, residual):
        out = torch.empty((x.shape[0], qweight.shape[1]), dtype=torch.float16, device=x.device)
        rows = min(ROWS, x.shape[0])
        out[:rows] = epilogue(matmul_by_group(x[:rows], qweight, scales), bias, residual[:rows], activation)
        return out

    return fn
