"""Cheat (residency): keeps the whole dequantized weight in fp16 from build on."""
from core import dequantize, epilogue

import torch


def build(qweight, scales, bias, activation):
    weight = dequantize(qweight, scales, torch.float16)

    def fn(x, residual):
        return epilogue(x.float() @ weight.float(), bias, residual, activation)

    return fn
