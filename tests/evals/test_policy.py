"""The static source policy rejects each way a solution could escape the evaluator, and accepts real solutions."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from evals.policy import RULES, Violation, check_files, check_source

REPO = Path(__file__).resolve().parents[2]
V0 = REPO / "methods/versions/v0/solution.py"

FORBIDDEN = [
    ("import subprocess", "process"),
    ("import subprocess as sp\nsp.run(['ls'])", "process"),
    ("import os\nos.system('x')", "process"),
    ("from os import path", "process"),
    ("import multiprocessing", "process"),
    ("import torch\ntorch.compile(lambda x: x)", "process"),
    ("import torch\n@torch.compile\ndef f(x):\n    return x", "process"),
    ("import torch._dynamo", "process"),
    ("import threading", "thread"),
    ("import asyncio", "thread"),
    ("from concurrent.futures import ThreadPoolExecutor", "thread"),
    ("import socket", "network"),
    ("import urllib.request", "network"),
    ("import time\ntime.perf_counter()", "timer"),
    ("import torch\ntorch.cuda.Event(enable_timing=True)", "timer"),
    ("from torch.cuda import Event\nEvent()", "timer"),
    ("import torch\ntorch.cuda.synchronize()", "timer"),
    ("import torch\ntorch.cuda._sleep(1000)", "timer"),
    ("import triton.testing", "timer"),
    ("import triton\ntriton.testing.do_bench(lambda: None)", "timer"),
    ("import torch\nwith torch.profiler.profile():\n    pass", "timer"),
    ("PTX = 'mov.u64 %0, %globaltimer;'", "timer"),
    ("import torch\ns = torch.cuda.Stream()\nwith torch.cuda.stream(s):\n    pass", "stream"),
    ("from torch.cuda import Stream as S\nS()", "stream"),
    ("import torch\nc = torch.cuda\nc.Stream()", "stream"),
    ("import torch\ndef f():\n    return c.Stream()\nc = t\nt = torch.cuda", "stream"),
    ("import torch\ndef f(c=torch.cuda):\n    return c.Stream()", "stream"),
    ("import torch\nfor c in [torch.cuda]:\n    c.Stream()", "stream"),
    ("import torch\nif (c := torch.cuda):\n    c.set_stream(None)", "stream"),
    ("import torch\nclass K:\n    m = torch.cuda\nK.m.synchronize()", "timer"),
    ("import torch\nmodules = [torch.cuda]\nmodules[0].Stream()", "stream"),
    ("import torch\ntorch.get_device_module().Stream()", "stream"),
    ("import torch\ngetattr(torch.cuda, 'Stream')()", "stream"),
    ("import torch\ngetattr(torch.cuda, 'Stream')()", "indirection"),
    ("import torch\ng = torch.cuda.CUDAGraph()", "stream"),
    ("import torch\nwith torch.cuda.graph(g):\n    pass", "stream"),
    ("import torch\ntorch.cuda.set_stream(torch.cuda.current_stream())", "stream"),
    ("def f(x, s):\n    x.record_stream(s)", "stream"),
    ("import torch\ntorch.cuda.synchronize = lambda: None", "patch"),
    ("import torch\ntorch.Tensor.__add__ = lambda a, b: a", "patch"),
    ("import triton.language as tl\ntl.dot = None", "patch"),
    ("import torch\ndel torch.cuda.synchronize", "patch"),
    ("import torch\ntorch.backends.cuda.matmul.allow_tf32 += 1", "patch"),
    ("import torch\nsetattr(torch, 'x', 1)", "patch"),
    ("import torch\ndelattr(torch, 'x')", "patch"),
    ("__builtins__ = {}", "patch"),
    ("__import__('subpro' + 'cess')", "indirection"),
    ("import torch\ngetattr(torch.cuda, 'Str' + 'eam')", "indirection"),
    ("import functools, torch\nfunctools.reduce(getattr, ['cuda'], torch)", "indirection"),
    ("g = getattr", "indirection"),
    ("(1).__class__.__bases__[0].__subclasses__()", "indirection"),
    ("def f():\n    pass\nf.__globals__['x']", "indirection"),
    ("try:\n    1 / 0\nexcept Exception as e:\n    e.__traceback__.tb_frame.f_globals", "indirection"),
    ("import torch\ntorch.cuda.__dict__", "indirection"),
    ("builtins.open", "indirection"),
    ("import builtins", "indirection"),
    ("import importlib\nimportlib.import_module('os')", "indirection"),
    ("eval('1')", "indirection"),
    ("exec('x = 1')", "indirection"),
    ("run = eval", "indirection"),
    ("code = compile('1', 'f', 'eval')", "indirection"),
    ("vars()", "indirection"),
    ("globals()['x'] = 1", "indirection"),
    ("locals()", "indirection"),
    ("import operator\noperator.attrgetter('cuda')", "indirection"),
    ("name = 'perf_counter'", "indirection"),
    ("name = 'os.system'", "indirection"),
    ("'{0.__globals__}'.format(len)", "indirection"),
    ("open('evals/kernel_harness.py')", "file"),
    ("import pathlib", "file"),
    ("import torch\ntorch.load('w.pt')", "file"),
    ("import torch\ntorch.utils.cpp_extension.load_inline('m', '')", "file"),
    ("from torch.utils.cpp_extension import load_inline", "file"),
    ("import torch\ntorch.ops.load_library('x.so')", "file"),
    ("import torch\ntorch.UntypedStorage.from_file('x', True, 8)", "file"),
    ("import torch\ntorch.cuda.caching_allocator_alloc(10)", "allocator"),
    ("import torch\ntorch._C._cuda_getCurrentRawStream(0)", "allocator"),
    ("from torch import _C", "allocator"),
    ("import torch\ntorch.cuda.memory._record_memory_history()", "allocator"),
    ("import torch\nwith torch.cuda.use_mem_pool(torch.cuda.MemPool()):\n    pass", "allocator"),
    ("import torch\ntorch.os.system('x')", "process"),
    ("import typing\ntyping.sys.modules", "import"),
    ("import torch\ntorch.utils.collect_env.run('ls')", "import"),
    ("import triton\ntriton.runtime.build._build", "process"),
    ("import torch\nlib = torch.library.Library('aten', 'IMPL')", "patch"),
    ("import torch\ntorch.set_float32_matmul_precision('medium')", "patch"),
    ("class T:\n    @classmethod\n    def __torch_function__(cls, *a):\n        pass", "patch"),
    ("match len:\n    case object(__globals__=g):\n        pass", "indirection"),
    ("import torch\ntorch.ops.import_module('os')", "indirection"),
    ("x = 'visible_cases.json'", "evaluator"),
    ("x = f'{1}/../evals/problems/' ", "evaluator"),
    ("x = '/proc/self/maps'", "evaluator"),
    ("x = 'tasks/w4a16/adapter.py'", "evaluator"),
    ("x = '../../TASKS/w4a16/spec.md'", "evaluator"),
    ("x = 'w4a16/panels/smoke'", "evaluator"),
    ("x = f'{1}/panels/'", "evaluator"),
    ("import sys\nsys.modules['torch']", "import"),
    ("import ctypes", "import"),
    ("import gc", "import"),
    ("import numpy", "import"),
    ("import evals.kernel_harness", "import"),
    ("from torch.cuda import *", "import"),
    # triton.tools compiles and disassembles through files and processes; only its tensor descriptor is allowed
    ("from triton.tools import compile", "file"),
    ("import triton.tools.disasm", "file"),
    ("from triton.tools.tensor_descriptor_x import T", "file"),
    ("from triton.tools.tensor_descriptor import validate_block_shape", "file"),
    ("from .. import evals", "import"),
    ("from . import tiles", "import"),
    # found in review: a tensor subclass fools the numeric checks; a call result may be torch itself
    ("import torch\nclass Out(torch.Tensor):\n    pass", "patch"),
    ("import torch as t\nT = t.Tensor\nclass Out(T):\n    pass", "patch"),
    ("y = x.as_subclass(Out)", "patch"),
    ("import torch\ndef shared():\n    return torch\nshared().isfinite = None", "patch"),
    ("import torch\n[torch][0].isfinite = None", "patch"),
    ("import torch\nt = [torch][0]\nt.isfinite = None", "patch"),
    ("class A:\n    def f(self):\n        self.__class__ = None", "patch"),
    ("raise SystemExit(0)", "process"),
    ("exit(0)", "process"),
    ("class Stop(BaseException):\n    pass", "process"),
    ("def f(:", "syntax"),
    ("x = " + "a." * 100000 + "b", "syntax"),
    ("x = '\0'\0", "syntax"),
]


@pytest.mark.parametrize("source, rule", FORBIDDEN, ids=[s.splitlines()[-1][:40] for s, _ in FORBIDDEN])
def test_forbidden_snippet_fires_its_rule(source, rule):
    violations = check_source(source)
    assert rule in {v.rule for v in violations}, violations
    assert all(v.rule in RULES and v.line >= 0 and v.rationale for v in violations)


ALLOWED = '''
"""A fast-solution shape: tables, cached plans, inline PTX, autotuning."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

PLANS = {(18, 8192): {"BLOCK_SIZE_N": 64, "SPLIT_K": 4}}
FENCE = "fence.acq_rel.sys;"
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@dataclass(frozen=True)
class Plan:
    block_n: int
    split_k: int


class Launcher:
    def __init__(self, kernel):
        self.kernel = kernel
        self.compiled = {}

    def __call__(self, key, *args):
        self.compiled[key] = self.compiled.get(key) or self.kernel
        return self.compiled[key]


@functools.lru_cache(maxsize=None)
def sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@triton.autotune(configs=[triton.Config({"BLOCK_SIZE_N": 64}, num_warps=4)], key=["N"])
@triton.heuristics({"EVEN_N": lambda args: args["N"] % args["BLOCK_SIZE_N"] == 0})
@triton.jit
def kernel(x_ptr, out_ptr, N, BLOCK_SIZE_N: tl.constexpr, EVEN_N: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    x = tl.load(x_ptr + offs_n)
    y = tl.inline_asm_elementwise(
        "{ .reg .b32 t; prmt.b32 t, $1, 0, 0x4440; cvt.rn.f16x2.f32 $0, t, t; }",
        "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(out_ptr + offs_n, y)


def build(qweight, scales, bias, epilogue):
    device = torch.cuda.current_device()
    stream = torch.cuda.current_stream(device)
    handle = stream.cuda_stream
    cuda_version = torch.version.cuda
    plan = Plan(**{"block_n": 64, "split_k": max(1, sm_count(device) // 132)})
    compiled = kernel.warmup(qweight, scales, bias.numel(), grid=(1,))

    def fn(x, residual):
        out = torch.empty_like(residual)
        first_row = x.select(0, 0)
        grid = (triton.cdiv(x.shape[0], plan.block_n),)
        kernel[grid](x, out, out.shape[1])
        return out

    return fn
'''


def test_allowed_constructs_are_clean():
    assert check_source(ALLOWED) == []


def test_the_host_tensor_descriptor_is_allowed():
    for source in ("from triton.tools.tensor_descriptor import TensorDescriptor",
                   "import triton.tools.tensor_descriptor as td\nd = td.TensorDescriptor"):
        assert check_source(source) == [], source


def test_attributes_may_be_set_on_self():
    source = ("class Plan:\n    def __init__(self, n):\n        self.n = n\n        self.cache = {}\n"
              "        self.cache[n] = 1\n")
    assert check_source(source) == []


def test_v0_solution_is_clean():
    assert check_files([V0]) == {str(V0): []}


def test_syntax_error_is_a_violation_not_an_exception():
    [violation] = check_source("def build(:\n", "bad.py")
    assert (violation.rule, violation.line) == ("syntax", 1)
    assert "bad.py" in violation.message


def test_violation_carries_rule_rationale_and_line():
    [violation] = check_source("x = 1\nimport socket\n")
    assert violation.to_dict() == {"rule": "network", "line": 2, "message": violation.message,
                                   "rationale": RULES["network"]}
    assert "import of 'socket' is not allowed" in violation.message and "torch, triton" in violation.message


def test_solution_directory_may_import_its_own_helpers(tmp_path):
    (tmp_path / "tiles.py").write_text("TILES = {(18, 8192): 64}\n")
    (tmp_path / "solution.py").write_text("import tiles\nfrom . import tiles as t\nfrom .tiles import TILES\n"
                                          "tiles.TILES[(1, 2)] = 3\n")
    assert check_files([tmp_path]) == {str(tmp_path / "tiles.py"): [], str(tmp_path / "solution.py"): []}


def test_helpers_are_local_only_when_checked_together(tmp_path):
    (tmp_path / "tiles.py").write_text("import os\n")
    (tmp_path / "solution.py").write_text("import tiles\n")
    # Checked alone, the solution names a module nobody checked; checked as a directory, the helper is caught.
    assert [v.rule for v in check_files([tmp_path / "solution.py"])[str(tmp_path / "solution.py")]] == ["import"]
    results = check_files([tmp_path])
    assert results[str(tmp_path / "solution.py")] == []
    assert [v.rule for v in results[str(tmp_path / "tiles.py")]] == ["process"]


def test_sibling_named_like_an_installed_module_does_not_make_it_local(tmp_path):
    (tmp_path / "subprocess.py").write_text("")
    (tmp_path / "solution.py").write_text("import subprocess\nfrom . import subprocess as mine\n")
    [violation] = check_files([tmp_path])[str(tmp_path / "solution.py")]
    assert (violation.rule, violation.line) == ("process", 1)
    assert "installed module" in violation.message


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "evals.policy", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_accepts_v0():
    result = run_cli(V0)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 file(s) clean" in result.stdout


def test_cli_rejects_a_bad_file_with_rule_line_and_rationale(tmp_path):
    bad = tmp_path / "solution.py"
    bad.write_text("import torch\n\n\ntorch.cuda.synchronize()\n")
    out = tmp_path / "policy.json"
    result = run_cli(bad, V0, "--json", out)
    assert result.returncode == 1
    assert f"{bad}:4: [timer] use of 'torch.cuda.synchronize' is not allowed" in result.stdout
    assert RULES["timer"] in result.stdout
    assert "1 violation(s) in 1 of 2 file(s)" in result.stdout
    report = json.loads(out.read_text())
    assert report["clean"] is False
    assert report["files"][str(V0)] == []
    assert [(v["rule"], v["line"]) for v in report["files"][str(bad)]] == [("timer", 4)]


def test_cli_missing_path_is_a_usage_error(tmp_path):
    result = run_cli(tmp_path / "nope.py")
    assert result.returncode == 2
    assert "nope.py" in result.stderr and "pass solution .py files" in result.stderr


def test_violation_is_frozen():
    violation = Violation("import", 1, "m")
    with pytest.raises(AttributeError):
        violation.rule = "patch"
