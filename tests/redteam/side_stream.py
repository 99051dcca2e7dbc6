"""Cheat (streams, CUDA only): runs the work on a side stream, away from the stream the verifier times."""
from core import epilogue, matmul_by_group

import torch


def build(qweight, scales, bias, activation):
    side = torch.cuda.Stream()

    def fn(x, residual):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)
        torch.cuda.current_stream().wait_stream(side)
        return out

    return fn
