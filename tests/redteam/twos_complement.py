"""Wrong (numerics_normal): decodes each nibble as a two's-complement int4 instead of code - 8."""
from core import GROUP_SIZE, epilogue, unpack_codes

import torch


def build(qweight, scales, bias, activation):
    codes = unpack_codes(qweight)

    def fn(x, residual):
        acc = torch.zeros((x.shape[0], qweight.shape[1]), dtype=torch.float32, device=x.device)
        for g in range(scales.shape[0]):
            group = codes[g * GROUP_SIZE:(g + 1) * GROUP_SIZE].float()
            w = torch.where(group >= 8, group - 16, group) * scales[g].float()
            acc += x[:, g * GROUP_SIZE:(g + 1) * GROUP_SIZE].float() @ w
        return epilogue(acc, bias, residual, activation)

    return fn
