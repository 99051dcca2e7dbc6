"""Cheat (isolation): opens the evaluator's visible panel at build (here to learn the scored shapes)."""
from core import epilogue, matmul_by_group

PANEL = "tasks/w4a16/panels/visible.json"


def build(qweight, scales, bias, activation):
    for prefix in ("", "../", "../../"):
        try:
            with open(prefix + PANEL) as handle:
                handle.read()
        except OSError:
            pass

    def fn(x, residual):
        return epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)

    return fn
