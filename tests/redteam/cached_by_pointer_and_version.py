"""Cheat (no_output_caching): memoizes on the inputs' addresses and _version counters, which a write in place bumps."""
from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    cache = {}

    def fn(x, residual):
        key = (x.data_ptr(), x._version, residual.data_ptr(), residual._version)
        if key not in cache:
            cache[key] = epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)
        return cache[key].clone()

    return fn
