"""Cheat (no_tampering): replaces time.perf_counter with a clock that runs at a tenth of the speed."""
import time

from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    real = time.perf_counter
    time.perf_counter = lambda: real() / 10

    def fn(x, residual):
        return epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)

    return fn
