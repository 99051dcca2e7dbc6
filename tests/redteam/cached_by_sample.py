"""Cheat (no_output_caching): memoizes on a sample of the input values (the first row) instead of the whole input."""
from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    cache = {}

    def fn(x, residual):
        key = (tuple(x[0].tolist()), tuple(residual[0].tolist()))
        if key not in cache:
            cache[key] = epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)
        return cache[key].clone()

    return fn
