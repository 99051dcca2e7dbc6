"""Cheat (fresh_outputs): writes every result into one preallocated buffer and returns that same tensor each call."""
from core import epilogue, matmul_by_group

import torch


def build(qweight, scales, bias, activation):
    buffers = {}

    def fn(x, residual):
        shape = (x.shape[0], qweight.shape[1])
        if shape not in buffers:
            buffers[shape] = torch.empty(shape, dtype=torch.float16, device=x.device)
        buffers[shape].copy_(epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation))
        return buffers[shape]

    return fn
