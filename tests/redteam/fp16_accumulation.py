"""Wrong (numerics_adversarial): keeps the running sum over K groups in fp16, which overflows on adversarial inputs."""
from core import GROUP_SIZE, dequantize, epilogue

import torch


def build(qweight, scales, bias, activation):
    def fn(x, residual):
        acc = torch.zeros((x.shape[0], qweight.shape[1]), dtype=torch.float16, device=x.device)
        for g in range(scales.shape[0]):
            w = dequantize(qweight[g * 16:(g + 1) * 16], scales[g:g + 1])
            acc = (acc.float() + x[:, g * GROUP_SIZE:(g + 1) * GROUP_SIZE].float() @ w).half()
        return epilogue(acc.float(), bias, residual, activation)

    return fn
