"""Cheat (input_immutability): doubles the scales in place for the call and halves them after (exact, but a write)."""
from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    def fn(x, residual):
        scales.mul_(2)
        z = matmul_by_group(x, qweight, scales) / 2
        scales.div_(2)
        return epilogue(z, bias, residual, activation)

    return fn
