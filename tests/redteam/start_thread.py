"""Cheat (isolation): starts a background thread at build (work that would run outside the timed calls)."""
import threading

from core import epilogue, matmul_by_group


def build(qweight, scales, bias, activation):
    threading.Thread(target=lambda: None, name="prefetch", daemon=True).start()

    def fn(x, residual):
        return epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)

    return fn
