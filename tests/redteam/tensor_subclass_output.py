"""Cheat (output_structure): returns zeros as a torch.Tensor subclass whose double() and subtraction give the true result."""  # noqa: E501
from core import epilogue, matmul_by_group

import torch


class Out(torch.Tensor):
    def double(self):
        return self.truth.double()

    def __sub__(self, other):
        return self.truth.double() - other


def build(qweight, scales, bias, activation):
    def fn(x, residual):
        truth = epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)
        out = torch.zeros_like(truth).as_subclass(Out)
        out.truth = truth
        return out

    return fn
