"""Cheat (fresh_outputs): writes into the previous call's output after returning it, like a stale workspace address."""
from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    previous = []

    def fn(x, residual):
        out = epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)
        if previous:
            previous.pop()[0, 0] = 0.0
        previous.append(out)
        return out

    return fn
