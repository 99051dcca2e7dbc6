"""Wrong (output_structure): returns the right values in fp32 instead of fp16."""
from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    def fn(x, residual):
        return epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation).float()

    return fn
