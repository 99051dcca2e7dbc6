"""Cheat (isolation, and policy on the indirection): reaches open() through a name computed at run time."""
from core import epilogue, matmul_by_group

PANEL = "tasks/w4a16/panels/visible.json"


def build(qweight, scales, bias, activation):
    opener = getattr(__import__("built" + "ins"), "op" + "en")
    try:
        opener(PANEL).close()
    except OSError:
        pass

    def fn(x, residual):
        return epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)

    return fn
