"""Cheat (input_immutability): zeroes the residual through .data after use, which leaves residual._version alone."""
from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    def fn(x, residual):
        out = epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)
        residual.data.zero_()
        return out

    return fn
