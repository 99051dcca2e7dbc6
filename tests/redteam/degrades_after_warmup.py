"""Cheat (schedule_outputs): correct through the gates and the priming, then returns residual + bias while timed."""
from core import epilogue, matmul_by_group

HONEST_CALLS = 34  # smoke schedule: 14 gate calls + 16 primed + 4 untimed, then the timed groups


def build(qweight, scales, bias, activation):
    state = {"calls": 0}

    def fn(x, residual):
        state["calls"] += 1
        if state["calls"] > HONEST_CALLS:
            return (residual + bias).contiguous()
        return epilogue(matmul_by_group(x, qweight, scales), bias, residual, activation)

    return fn
