"""Cheat (no_output_caching): memoizes on the input addresses and returns a copy of the remembered output."""
from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    cache = {}

    def fn(x, residual):
        key = (x.data_ptr(), residual.data_ptr())
        if key not in cache:
            cache[key] = epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)
        return cache[key].clone()

    return fn
