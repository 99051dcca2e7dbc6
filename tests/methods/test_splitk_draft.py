"""The split-K draft (methods/drafts/splitk): the oracle on the smoke panel and odd shapes, every tuning switch (both
orientations, the three word layouts), forced and clamped split-K, fresh outputs, untouched inputs, odd layouts and
clear errors; the interpreter on CPU."""
import ast
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evals import kernel_harness as kh
from evals.loader import load_solution
from tests.conftest import ROOT

DRAFT = ROOT / "methods" / "drafts" / "splitk"
S = load_solution(DRAFT)
DEVICE = kh.select_device().device  # CUDA where present, else CPU tensors under the interpreter (tests/conftest.py)

def _check(case, mode="normal", config=None):
    t = kh.generate(case, mode, DEVICE)
    fn = S.build(t.qweight, t.scales, t.bias, case.epilogue, config=config)
    out = fn(t.x, t.residual)
    ref = kh.reference(t.x, t.qweight, t.scales, t.bias, t.residual, case.epilogue)
    result = kh.check_output(out, ref, (case.m, case.n))
    assert result.ok, f"{case.name} {mode} {config}: {result}"
    return fn, t, out


SMOKE = kh.load_panel("smoke")


@pytest.mark.parametrize("mode", kh.MODES)
@pytest.mark.parametrize("case", SMOKE, ids=lambda c: c.name)
def test_smoke_panel(case, mode):
    _check(case, mode)


EXTRA = [(m, k, n, ep) for m in (1, 5, 18, 32, 40)
         for (k, n, ep) in ((384, 256, "silu"), (640, 512, "gelu_tanh"), (128, 768, "silu"))]


@pytest.mark.parametrize("mode", kh.MODES)
@pytest.mark.parametrize("m,k,n,ep", EXTRA)
def test_extra_shapes(m, k, n, ep, mode):
    _check(kh.Case("extra", m, k, n, ep, 900 + m), mode)


# K = 640 is 5 groups: SPLIT_K 2 gives 2 + 3 groups, 3 gives 1 + 2 + 2; K = 384 (3 groups) with SPLIT_K 2 gives 1 + 2.
@pytest.mark.parametrize("split_k", [1, 2, 3])
@pytest.mark.parametrize("m,k,n,ep", [(5, 640, 256, "gelu_tanh"), (18, 384, 512, "silu"), (40, 640, 256, "silu"),
                                      (32, 1024, 256, "gelu_tanh")])
@pytest.mark.parametrize("mode", kh.MODES)
def test_forced_split_k(m, k, n, ep, split_k, mode):
    assert S.plan(m, k, n, {"SPLIT_K": split_k})["SPLIT_K"] == split_k
    _check(kh.Case("split", m, k, n, ep, 77), mode, {"SPLIT_K": split_k})


SWAP = {"SWAP_AB": 1, "BLOCK_SIZE_N": 128}
NOSWAP = {"SWAP_AB": 0, "BLOCK_SIZE_N": 64}


@pytest.mark.parametrize("variant", [
    SWAP | {"LAYOUT": 0}, SWAP | {"LAYOUT": 1, "SPLIT_K": 2}, SWAP | {"LAYOUT": 2, "SPLIT_K": 3},
    SWAP | {"LAYOUT": 2, "BLOCK_SIZE_N": 256, "MAGIC": 0, "SCALE_AFTER_DOT": 0},
    SWAP | {"LAYOUT": 1, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_M": 16, "SPLIT_K": 2, "REDUCE_MODE": 1},
    SWAP | {"LAYOUT": 2, "DEQUANT": 1, "SPLIT_K": 2, "REDUCE_MODE": 1}, SWAP | {"DEQUANT": 1, "MAGIC": 0},
    SWAP | {"LAYOUT": 2, "DEQUANT": 2, "BLOCK_SIZE_N": 64}, NOSWAP | {"DEQUANT": 1},
    NOSWAP | {"DEQUANT": 2, "MAGIC": 0},
    SWAP | {"LAYOUT": 3, "DEQUANT": 1, "SPLIT_K": 2, "REDUCE_MODE": 1}, SWAP | {"LAYOUT": 3, "DEQUANT": 2, "MAGIC": 0},
    SWAP | {"LAYOUT": 3, "DEQUANT": 2, "BLOCK_SIZE_N": 64, "SPLIT_K": 1}, SWAP | {"LAYOUT": 3, "BLOCK_SIZE_N": 256},
    # LAUNCH 2 (bare addresses) changes only the compiled CUDA path; the interpreter runs these like LAUNCH 1
    {"LAUNCH": 2, "SPLIT_K": 3, "REDUCE_MODE": 1}, {"LAUNCH": 2, "SPLIT_K": 1},
    {"LAUNCH": 2, "SPLIT_K": 2, "REDUCE_MODE": 0}, {"DEQUANT": 3}, NOSWAP | {"DEQUANT": 3},
    NOSWAP | {"UNPACK": 1}, NOSWAP | {"MAGIC": 0}, NOSWAP | {"UNPACK": 1, "MAGIC": 0, "SPLIT_K": 2},
    NOSWAP | {"SCALE_AFTER_DOT": 0}, NOSWAP | {"SCALE_AFTER_DOT": 0, "UNPACK": 1, "MAGIC": 0},
    NOSWAP | {"BLOCK_SIZE_N": 128, "SPLIT_K": 2}, NOSWAP | {"BLOCK_SIZE_N": 256}, NOSWAP | {"BLOCK_SIZE_M": 16},
    {"REDUCE_BLOCK": 256, "SPLIT_K": 3},
    # GRID 1 (stream-K) on 8 tiles x 5 groups = 40 steps: 7 programs share tiles (5 or 6 steps each), 8 own one tile
    # each (the direct epilogue), 3 cross several tiles, 1 does everything; 16-row tiles give two M tiles
    {"GRID": 1, "MIN_PROGRAMS": 7}, {"GRID": 1, "MIN_PROGRAMS": 8}, {"GRID": 1, "MIN_PROGRAMS": 3, "LAUNCH": 2},
    {"GRID": 1, "MIN_PROGRAMS": 1}, {"GRID": 1, "MIN_PROGRAMS": 0}, {"GRID": 1, "MIN_PROGRAMS": 6, "BLOCK_SIZE_M": 16},
    {"GRID": 1, "MIN_PROGRAMS": 5, "LAYOUT": 2, "DEQUANT": 1}, {"GRID": 1, "MIN_PROGRAMS": 9, "SCALE_AFTER_DOT": 0},
    SWAP | {"GRID": 1, "MIN_PROGRAMS": 11, "LAYOUT": 1}])
@pytest.mark.parametrize("mode", kh.MODES)
def test_variants(variant, mode):
    _check(kh.Case("variant", 19, 640, 512, "gelu_tanh", 5), mode, variant)


@pytest.mark.parametrize("layout", [1, 2])
def test_repacked_words_hold_the_same_codes(layout):
    """LAYOUT 1 and 2 are permutations of the caller's words: same bytes, each word where the kernel reads it."""
    case = kh.Case("repack", 3, 512, 512, "silu", 6)
    t = kh.generate(case, "normal", DEVICE)
    words = S.repack(t.qweight, layout, 128)
    assert words.dtype == torch.int32 and words.numel() == t.qweight.numel() and words.is_contiguous()
    j, n = 9, 300  # word row 9 (group 0, word 9) of column 300 (tile 2, column 44)
    expected = t.qweight[j, n]
    got = words[n, j] if layout == 1 else words[n // 128, j // 16, n % 128, j % 16]
    assert int(got) == int(expected)
    assert S.repack(t.qweight, 0, 128) is t.qweight  # LAYOUT 0 keeps the caller's tensor, no copy
    with pytest.raises(ValueError):
        S.repack(t.qweight, 4, 128)


def _code(words, k, n):
    return (int(words[k // 8, n]) >> (4 * (k % 8))) & 0xF


def test_operand_order_words_hold_every_code_where_the_kernel_unpacks_it():
    """LAYOUT 3: word 4t + q, nibble 4 e0 + 2 e1 + c1 of a group holds its row 32q + 16 c1 + 8 e1 + 2t + e0; every
    code of the caller's words appears exactly once, and the program-order blocks are LAYOUT 2's."""
    case = kh.Case("repack", 3, 512, 256, "silu", 7)
    t = kh.generate(case, "normal", DEVICE)
    ordered = S._operand_order(t.qweight)
    assert ordered.dtype == torch.int32 and ordered.shape == t.qweight.shape
    for k in (0, 1, 2, 7, 8, 9, 16, 31, 33, 100, 127, 128, 255, 300, 511):
        for n in (0, 5, 255):
            g, row = divmod(k, 128)
            q, rest = divmod(row, 32)
            c1, rest = divmod(rest, 16)
            e1, rest = divmod(rest, 8)
            t_, e0 = divmod(rest, 2)
            word, nibble = 16 * g + 4 * t_ + q, 4 * e0 + 2 * e1 + c1
            assert _code(ordered, 8 * word + nibble, n) == _code(t.qweight, k, n), (k, n)
    # a permutation of each group's codes: the same multiset of nibbles per column and group
    src = torch.stack([(t.qweight >> (4 * i)) & 0xF for i in range(8)], 1).view(4, 128, 256)
    dst = torch.stack([(ordered >> (4 * i)) & 0xF for i in range(8)], 1).view(4, 128, 256)
    assert torch.equal(src.sort(1).values, dst.sort(1).values)
    assert torch.equal(S.repack(t.qweight, 3, 128), S.repack(ordered, 2, 128))
    assert torch.equal(S._operand_order(t.qweight, chunk_bytes=1), ordered)  # one group at a time, same words


def test_split_clamped_to_groups():
    cfg = S.plan(18, 256, 256, {"SPLIT_K": 9})
    assert cfg["SPLIT_K"] == 2  # 2 groups: each split keeps at least one
    _check(kh.Case("clamp", 18, 256, 256, "silu", 3), "normal", {"SPLIT_K": 9})


def test_plan_tiers_on_visible_shapes():
    expert = [(18, 8192, 1024), (24, 16384, 1536), (20, 14336, 768), (32, 8192, 2048), (30, 12288, 2048)]
    balanced = [(18, 8192, 8192), (24, 8192, 28672), (32, 28672, 8192), (20, 14336, 4096), (28, 8192, 10240)]
    for m, k, n in expert + balanced:
        cfg = S.plan(m, k, n)
        # the fewest splits that give MIN_PROGRAMS programs (132 SMs: 2 to 4 per SM), never past one group per split
        tiles, target = cfg["M_TILES"] * cfg["N_TILES"], cfg["MIN_PROGRAMS"]
        assert 132 <= target <= 4 * 132
        assert tiles * cfg["SPLIT_K"] >= target or cfg["SPLIT_K"] == k // 128
        assert tiles * (cfg["SPLIT_K"] - 1) < target
        # each visible shape is one launch: split-K sums in the kept accumulator, or no split at all
        assert cfg["SPLIT_K"] == 1 or cfg["REDUCE_MODE"] == 1
    for m in (1, 5, 16, 17, 32, 33, 100):
        cfg = S.plan(m, 8192, 3072)
        assert cfg["BLOCK_SIZE_M"] == (16 if m <= 16 else 32)
        assert cfg["BLOCK_SIZE_K"] == S.GROUP_SIZE


def test_get_config_is_one_literal():
    tree = ast.parse((DRAFT / "solution.py").read_text())
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_config")
    assert len(func.body) == 1 and isinstance(func.body[0], ast.Return) and isinstance(func.body[0].value, ast.Dict)
    for key in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "SPLIT_K", "num_warps", "num_stages"):
        assert key in S.get_config()


@pytest.mark.parametrize("split_k", [1, 3])
def test_fresh_outputs_do_not_alias(split_k):
    case = kh.Case("alias", 18, 384, 256, "silu", 11)
    fn, t, first = _check(case, "normal", {"SPLIT_K": split_k})
    first_copy = first.clone()
    (x2, r2), = kh.make_inputs(case, 1, seed=99, device=DEVICE)
    second = fn(x2, r2)
    assert second is not first and second.data_ptr() != first.data_ptr()
    assert torch.equal(first, first_copy), "an earlier output was overwritten"
    ref2 = kh.reference(x2, t.qweight, t.scales, t.bias, r2, case.epilogue)
    assert kh.check_output(second, ref2, (case.m, case.n)).ok
    third = fn(t.x, t.residual)  # same inputs again: equal values, a new tensor
    assert third.data_ptr() not in (first.data_ptr(), second.data_ptr()) and torch.equal(third, first)
    for out in (first, second, third):
        for tensor in (t.x, t.residual, x2, r2, t.qweight, t.scales, t.bias):
            assert out.untyped_storage().data_ptr() != tensor.untyped_storage().data_ptr()


def test_inputs_unchanged():
    case = kh.Case("unchanged", 21, 640, 256, "gelu_tanh", 4)
    t = kh.generate(case, "adversarial", DEVICE)
    copies = [v.clone() for v in (t.qweight, t.scales, t.bias, t.x, t.residual)]
    fn = S.build(t.qweight, t.scales, t.bias, case.epilogue, config={"SPLIT_K": 3})
    fn(t.x, t.residual)
    for a, b in zip(copies, (t.qweight, t.scales, t.bias, t.x, t.residual)):
        assert torch.equal(a, b)


def test_non_contiguous_and_misaligned_inputs():
    case = kh.Case("layout", 18, 384, 256, "silu", 8)
    t = kh.generate(case, "normal", DEVICE)
    fn = S.build(t.qweight, t.scales, t.bias, case.epilogue)
    ref = kh.reference(t.x, t.qweight, t.scales, t.bias, t.residual, case.epilogue)
    x_t = t.x.t().contiguous().t()  # same values, column-major
    flat = torch.empty(t.residual.numel() + 1, dtype=torch.float16, device=DEVICE)
    r_off = flat[1:].view(case.m, case.n)  # contiguous but 2 bytes past an aligned base
    r_off.copy_(t.residual)
    assert kh.check_output(fn(x_t, r_off), ref, (case.m, case.n)).ok


def test_validation_errors():
    case = kh.Case("errors", 18, 256, 256, "silu", 1)
    t = kh.generate(case, "normal", DEVICE)
    with pytest.raises(ValueError):
        S.build(t.qweight, t.scales, t.bias, "relu")
    with pytest.raises(ValueError):
        S.build(t.qweight, t.scales.float(), t.bias, "silu")
    fn = S.build(t.qweight, t.scales, t.bias, "silu")
    with pytest.raises(ValueError):
        fn(t.x.float(), t.residual)
    with pytest.raises(ValueError):
        fn(t.x[:, :128], t.residual)
    with pytest.raises(ValueError):
        fn(t.x, t.residual[:5])
    with pytest.raises(ValueError):
        fn(t.x, t.residual.float())
    if DEVICE.type == "cuda":  # LAUNCH 2's launch exists: later calls still check where x lives (bare addresses,
        raw = S.build(t.qweight, t.scales, t.bias, "silu", config={"LAUNCH": 2})  # which the launcher cannot check)
        raw(t.x, t.residual)
        with pytest.raises(ValueError, match="must be on"):
            raw(t.x.cpu(), t.residual)
    else:  # the interpreter reads tensors, never addresses: the first call of an M checks the devices
        with pytest.raises(ValueError, match="must be on"):
            S.build(t.qweight, t.scales, t.bias, "silu")(t.x.to("meta"), t.residual.to("meta"))
    for bad in ({"DEQUANT": 7}, {"LAUNCH": 3}, {"LAYOUT": 5}, {"GRID": 2}):  # a typo in a table is an error, not a silent default
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be one of"):
            S.plan(18, 256, 256, bad)
    with pytest.raises(ValueError, match="GRID 1 .* needs SWAP_AB 1"):
        S.plan(18, 256, 256, {"GRID": 1, "SWAP_AB": 0})
    with pytest.raises(ValueError, match="LAYOUT 3 needs DEQUANT"):  # its nibbles are not in row order
        S.build(t.qweight, t.scales, t.bias, "silu", config={"SWAP_AB": 1, "LAYOUT": 3, "DEQUANT": 0})


@pytest.mark.parametrize("split_k", [2, 3])
@pytest.mark.parametrize("m,k,n,ep", [(5, 640, 256, "gelu_tanh"), (40, 640, 256, "silu"), (1, 384, 512, "silu")])
@pytest.mark.parametrize("mode", kh.MODES)
def test_one_launch_reduction_matches_the_oracle(m, k, n, ep, split_k, mode):
    _check(kh.Case("one-launch", m, k, n, ep, 31), mode, {"SPLIT_K": split_k, "REDUCE_MODE": 1})


def _same_call_again(again, first, ref, case):
    """A repeated call agrees with the oracle; on one thread (the interpreter) also bit for bit with the first. On a
    GPU the splits' atomic adds land in any order, so fp32 rounding may differ in the last bits (H200, 2026-11-30)."""
    assert kh.check_output(again, ref, (case.m, case.n)).ok
    if DEVICE.type != "cuda":
        assert torch.equal(again, first)


@pytest.mark.parametrize("config", [{"SPLIT_K": 3, "REDUCE_MODE": 1}, {"GRID": 1, "MIN_PROGRAMS": 7}])
def test_one_launch_reduction_cleans_up_after_every_call_and_keeps_one_accumulator(config):
    case = kh.Case("one-launch", 18, 640, 512, "gelu_tanh", 12)
    fn, t, first = _check(case, "adversarial", config)
    for seed in (1, 2):  # fresh inputs: a leftover partial sum or counter would show in the next result
        (x, r), = kh.make_inputs(case, 1, seed=seed, device=DEVICE)
        out = fn(x, r)
        assert kh.check_output(out, kh.reference(x, t.qweight, t.scales, t.bias, r, case.epilogue), (case.m, case.n)).ok
    ref = kh.reference(t.x, t.qweight, t.scales, t.bias, t.residual, case.epilogue)
    _same_call_again(fn(t.x, t.residual), first, ref, case)
    other = kh.Case("one-launch", 7, 640, 512, "gelu_tanh", 12)  # another M takes over the accumulator, and back
    (x7, r7), = kh.make_inputs(other, 1, seed=3, device=DEVICE)
    out7 = fn(x7, r7)
    assert kh.check_output(out7, kh.reference(x7, t.qweight, t.scales, t.bias, r7, case.epilogue), (7, case.n)).ok
    _same_call_again(fn(t.x, t.residual), first, ref, case)
    gc.collect()
    accumulators = [o for o in gc.get_objects() if type(o) is torch.Tensor and o.dtype == torch.float32
                    and tuple(o.shape) in ((7, case.n), (18, case.n))]
    assert [tuple(a.shape) for a in accumulators] == [(18, case.n)], "one M keeps an accumulator at a time"
    assert not accumulators[0].any(), "the accumulator is zero between calls"


HOPPER_SHARED_BYTES = 232448  # the most shared memory one program may use on an H100/H200 (227 KiB)


def test_stream_k_plan_and_the_programs_a_gpu_holds_at_once():
    cfg = S.plan(24, 8192, 28672, {"GRID": 1})  # 448 tiles x 64 groups: the tier's 528 programs, no split
    assert cfg["PROGRAMS"] == 528 and cfg["SPLIT_K"] == 1
    assert S.plan(19, 640, 512, {"GRID": 1, "MIN_PROGRAMS": 396})["PROGRAMS"] == 40  # never more than the steps
    # registers allocated per warp in 256s; 1 KiB of shared memory reserved per block; at most 64 warps per SM
    assert S.programs_per_sm(104, 45056, 4, HOPPER_SHARED_BYTES) == 4  # 3328 registers a warp: 4 x 13312 fit 65536
    assert S.programs_per_sm(127, 32768, 4, HOPPER_SHARED_BYTES) == 4  # 4096 a warp: exactly 4 blocks of 16384
    assert S.programs_per_sm(128, 32768, 4, HOPPER_SHARED_BYTES) == 4
    assert S.programs_per_sm(129, 32768, 4, HOPPER_SHARED_BYTES) == 3  # 4352 a warp: 65536 // 17408 = 3
    assert S.programs_per_sm(40, 100_000, 4, HOPPER_SHARED_BYTES) == 2  # shared memory decides
    assert S.programs_per_sm(16, 0, 8, HOPPER_SHARED_BYTES) == 8  # the 64-warp limit
    assert S.programs_per_sm(255, 200_000, 8, HOPPER_SHARED_BYTES) == 1  # never fewer than one


def test_every_visible_plan_compiles_for_hopper_within_shared_memory():
    """The plans the visible panel gets, with REDUCE_MODE 1 too, and the stream-K kernel (GRID 1), compiled to sm90 machine code on this machine (the
    interpreter never compiles, so a child process without TRITON_INTERPRET does): a layout the GPU backend rejects
    or a tile over the shared memory shows here, not on the GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("hopper_compile.py")), str(DRAFT)],
                         capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    compiled = json.loads(run.stdout)
    assert len(compiled) >= 3 and {c["reduce_mode"] for c in compiled} == {0, 1}
    for kernel in compiled:
        assert kernel["shared"] <= HOPPER_SHARED_BYTES, kernel
        if kernel["reduce_mode"] == 1:  # the race ledger v39 ran into: zeroing sums another thread has not read
            assert kernel["barrier_after_reads"], kernel
        # DEQUANT 2's inline PTX reaches the machine code (ptxas assembled it); the interpreter runs DEQUANT 1 instead
        assert kernel["f16x2_dequant"] == (kernel["dequant"] >= 2), kernel
        if kernel["layout"] == 3:  # the unpacked words are the wgmma operand: no shared-memory round trip
            assert kernel["wgmma"] and not kernel["ldmatrix_in_loop"], kernel
    assert any(kernel["dequant"] >= 2 for kernel in compiled)
    assert {kernel["kernel"] for kernel in compiled} == {"main", "stream"}
