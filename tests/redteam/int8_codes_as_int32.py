"""Cheat (residency): keeps every code unpacked as int8, labelled int32 by a view so that a dtype rule misses it."""
from core import GROUP_SIZE, epilogue, unpack_codes

import torch


def build(qweight, scales, bias, activation):
    codes = (unpack_codes(qweight) - 8).to(torch.int8).view(torch.int32)

    def fn(x, residual):
        weight = codes.view(torch.int8).float() * scales.float().repeat_interleave(GROUP_SIZE, dim=0)
        return epilogue(x.float() @ weight, bias, residual, activation)

    return fn
