"""Cheat (input_immutability): rewrites qweight in place with its own words (same values, a write all the same)."""
from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    def fn(x, residual):
        qweight.bitwise_xor_(0)
        return epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)

    return fn
