"""Cheat (timing_sanity, CUDA only): honest through the gates, then copies remembered outputs faster than any kernel."""
from core import epilogue, matmul_by_group

import torch

HONEST_CALLS = 64  # past the gates pass, well before the timed groups


def build(qweight, scales, bias, activation):
    state = {"calls": 0, "cache": {}}

    def fn(x, residual):
        state["calls"] += 1
        key = (x.data_ptr(), residual.data_ptr())
        if state["calls"] > HONEST_CALLS and key in state["cache"]:
            return torch.empty_like(state["cache"][key]).copy_(state["cache"][key])
        out = epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)
        if state["calls"] > HONEST_CALLS // 2:
            state["cache"][key] = out.clone()
        return out

    return fn
