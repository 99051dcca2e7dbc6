"""Wrong (numerics_normal): reads the eight codes of a word most-significant nibble first."""
from core import GROUP_SIZE, epilogue

import torch


def unpack_reversed(qweight):
    shifts = (7 - torch.arange(8, device=qweight.device, dtype=torch.int32)).view(1, 8, 1) * 4
    return ((qweight.unsqueeze(1) >> shifts) & 0xF).reshape(qweight.shape[0] * 8, qweight.shape[1])


def build(qweight, scales, bias, activation):
    def fn(x, residual):
        w = (unpack_reversed(qweight).float() - 8) * scales.float().repeat_interleave(GROUP_SIZE, dim=0)
        return epilogue(x.float() @ w, bias, residual, activation)

    return fn
