"""Cheat (residency): honest at first, then materializes the dense fp16 weight after a few calls and keeps it."""
from core import dequantize, epilogue, matmul_by_group

import torch

CALLS_BEFORE_CHEATING = 4


def build(qweight, scales, bias, activation):
    state = {"calls": 0, "weight": None}

    def fn(x, residual):
        state["calls"] += 1
        if state["weight"] is None and state["calls"] > CALLS_BEFORE_CHEATING:
            state["weight"] = dequantize(qweight, scales, torch.float16)
        if state["weight"] is None:
            return epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)
        return epilogue(x.float() @ state["weight"].float(), bias, residual, activation)

    return fn
