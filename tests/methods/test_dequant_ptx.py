"""The W4A16 family's inline-PTX dequant sequences, executed by a small model of the PTX instructions they use.

The interpreter never runs inline PTX (DEQUANT 2 and 3 run as DEQUANT 1 on CPU), and the GPU tests run it only where
a GPU is. This model reads the very text the kernel inlines and checks, for words covering every code at every nibble,
that output $i is the fp16 value code_i - 8 of nibble i: wrong constants, masks, shifts or output order show here.
"""
import random
import re
import sys

import numpy as np
import pytest

from evals.loader import load_solution
from tests.conftest import W4A16_FAMILY

_FAMILY = load_solution(W4A16_FAMILY)
KERNELS = sys.modules[_FAMILY.__name__.rpartition(".")[0] + ".kernels"]

MASK32 = 0xFFFFFFFF


def _f16(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


def _bits(value: float) -> int:
    return int(np.array([value], dtype=np.float16).view(np.uint16)[0])


def _halves(op, *regs: int) -> int:
    """Apply ``op`` to the low and high fp16 halves of 32-bit registers, rounding once to fp16 (float64 in between)."""
    lo = _bits(op(*(_f16(r & 0xFFFF) for r in regs)))
    hi = _bits(op(*(_f16(r >> 16) for r in regs)))
    return lo | hi << 16


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for i in range(8):  # LUT bit i holds F for a = bit 2 of i, b = bit 1, c = bit 0 (a = 0xF0, b = 0xCC, c = 0xAA)
        if lut >> i & 1:
            out |= (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c)
    return out & MASK32


def run_ptx(asm: str, word: int) -> list[int]:
    """The 16-bit outputs $0..$7 of ``asm`` for input register $8 = ``word``."""
    regs = {"$8": word & MASK32}

    def val(token: str) -> int:
        token = token.strip()
        return int(token, 16) if token.startswith("0x") else regs[token]

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):
            lo, hi, src = re.match(r"\{(\S+),\s*(\S+)\},\s*(\S+)", rest).groups()
            regs[lo], regs[hi] = val(src) & 0xFFFF, val(src) >> 16
            continue
        dst, *args = [t.strip() for t in rest.split(",")]
        if op == "mov.b32":
            regs[dst] = val(args[0])
        elif op == "shr.u32":
            regs[dst] = val(args[0]) >> int(args[1])
        elif op == "lop3.b32":
            regs[dst] = _lop3(*(val(t) for t in args))
        elif op == "sub.f16x2":
            regs[dst] = _halves(lambda a, b: a - b, val(args[0]), val(args[1]))
        elif op == "fma.rn.f16x2":
            regs[dst] = _halves(lambda a, b, c: a * b + c, *(val(t) for t in args))
        else:
            raise AssertionError(f"the model does not know {op!r}: extend it before trusting a new sequence")
    return [regs[f"${i}"] for i in range(8)]


def _words() -> list[int]:
    words = [sum(code << 4 * i for i in range(8)) for code in range(16)]  # every code in every nibble
    words += [sum(((code + i) % 16) << 4 * i for i in range(8)) for code in range(16)]  # all codes in one word
    rng = random.Random(7)
    return words + [rng.getrandbits(32) for _ in range(300)]


@pytest.mark.parametrize("name", ["DEQUANT_PTX", "DEQUANT_PTX_ONE_SHIFT"])
def test_each_output_is_its_nibble_minus_eight_in_fp16(name):
    asm = getattr(KERNELS, name).value
    for word in _words():
        got = run_ptx(asm, word)
        want = [_bits(((word >> 4 * i) & 0xF) - 8) for i in range(8)]
        assert got == want, (name, hex(word), [hex(g) for g in got], [hex(w) for w in want])


def test_the_model_catches_a_wrong_sequence():
    broken = KERNELS.DEQUANT_PTX.value.replace("0x64086408", "0x64076407")  # subtracts 1031: every value off by one
    assert run_ptx(broken, 0x76543210) != [_bits(i - 8) for i in range(8)]
    swapped = KERNELS.DEQUANT_PTX_ONE_SHIFT.value.replace("mov.b32 {$1, $5}, t1", "mov.b32 {$5, $1}, t1")
    assert run_ptx(swapped, 0x76543210) != [_bits(i - 8) for i in range(8)]
