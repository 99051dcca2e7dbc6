"""Cheat (input_immutability): scales x in place by 1.0, so its values survive and only x._version shows the write."""
from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    def fn(x, residual):
        x.mul_(1.0)
        return epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)

    return fn
