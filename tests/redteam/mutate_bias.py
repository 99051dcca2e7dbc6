"""Cheat (input_immutability): doubles the bias in place at build and halves it per call (exact values, still a write)."""  # noqa: E501
from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    bias.mul_(2)

    def fn(x, residual):
        return epilogue(matmul_by_group(x, qweight, scales), bias / 2, residual, activation)

    return fn
