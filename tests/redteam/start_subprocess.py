"""Cheat (isolation): starts a process at build (one that could outlive the timed region or read the evaluator)."""
import subprocess
import sys

from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    subprocess.run([sys.executable, "-c", "pass"], check=False)

    def fn(x, residual):
        return epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)

    return fn
