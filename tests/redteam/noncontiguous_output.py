"""Wrong (output_structure): returns the right values as a transposed, non-contiguous view."""
from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    def fn(x, residual):
        return epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation).t().contiguous().t()

    return fn
