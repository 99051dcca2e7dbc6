"""Cheat (fresh_outputs): writes the result into the residual tensor and returns it (an output aliasing an input)."""
from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    def fn(x, residual):
        residual.copy_(epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation))
        return residual

    return fn
