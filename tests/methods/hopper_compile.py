"""Compile the W4A16 family's kernels for sm90 (no GPU needed) for every plan the visible panel gets, the inline-PTX
dequants on one case, and the stream-K kernel (GRID 1) for each visible case; print one JSON record per kernel.
With --ws: the warp-specialized kernel (ws.py) for the visible plans that run it (WS_MIN_US 30), then on the first
of them 128 columns a program and one row of x (16-row x tiles, M = 1).

Usage: python tests/methods/hopper_compile.py SOLUTION_DIR [--ws]   (without TRITON_INTERPRET: the interpreter never
compiles)
"""
import importlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from evals.loader import load_solution  # noqa: E402
from evals.task import load  # noqa: E402

TASK = load("w4a16")
W4 = TASK.adapter
POINTERS = {"x_ptr": "*fp16", "q_ptr": "*i32", "s_ptr": "*fp16", "b_ptr": "*fp16", "r_ptr": "*fp16",
            "out_ptr": "*fp16", "acc_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def _cubin_tool(tool: str, args: list[str], cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        return subprocess.run([str(TOOLS / tool), *args, file.name], capture_output=True, text=True, check=True).stdout


def registers(cubin: bytes) -> int:
    """Registers per thread of the kernel in ``cubin``, as ptxas allocated them (cuobjdump's resource usage)."""
    return int(re.search(r"REG:(\d+)", _cubin_tool("cuobjdump", ["--dump-resource-usage"], cubin)).group(1))


def sass_loop_instructions(cubin: bytes) -> int:
    """Machine instructions of the K loop: from the label that the branch after the last HGMMA jumps back to, to
    that branch (0 without an HGMMA)."""
    sass = _cubin_tool("nvdisasm", ["-c"], cubin)
    first, last = sass.find("HGMMA"), sass.rfind("HGMMA")
    if first < 0:
        return 0
    branch = re.compile(r"BRA `\((\.L_x_\d+)\)")
    for found in branch.finditer(sass, last):
        label = sass.rfind(f"\n{found.group(1)}:", 0, first)
        if label >= 0:
            body = sass[label:found.end()]
            return len(re.findall(r"^\s+/\*[0-9a-f]+\*/\s+\S", body, re.MULTILINE))
    return 0


def loop_body(ptx: str) -> str:
    """The K loop: from the block label that opens the loop of the first MMA to the branch after the last MMA."""
    mma = [found.start() for found in re.finditer(r"wgmma\.mma_async", ptx)]
    if not mma:
        return ""
    labels = [found.start() for found in re.finditer(r"^\$L__BB\d+_\d+:", ptx[:mma[0]], re.MULTILINE)]
    return ptx[labels[-1] if labels else 0:ptx.find("bra", mma[-1])]


def instructions(ptx: str) -> int:
    """PTX instructions (inline-assembly ones included) in ``ptx``: statements, not declarations or labels."""
    lines = (line.strip() for line in ptx.splitlines())
    return sum(1 for line in lines if line.endswith(";") and not line.startswith((".", "//")))


def compile_sm90(kernel_fn, pointers: dict, constants: dict, options: dict) -> dict:
    # what the launches specialize on: 16-byte aligned pointers, N and K divisible by 16 (M too at M = 32, which this
    # leaves out: the loop is the same, the epilogue's masks differ)
    source = ASTSource(fn=kernel_fn, constexprs=constants, signature=pointers | dict.fromkeys(constants, "constexpr"),
                       attrs={(i,): [["tt.divisibility", 16]] for i, name in enumerate(pointers) if name != "M"})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    ptx = kernel.asm["ptx"]
    # one launch: the last program reads the sums, then zeroes them, maybe in another thread layout; a barrier must
    # lie between the last read and the first zeroing store after it (one register repeated: the zeros)
    reads = ptx.rfind("ld.volatile.global")
    zeroing = re.search(r"st\.global(?:\.v\d)?\.b32 \[[^\]]*\], \{ (%r\d+)(?:, \1)* \}", ptx[reads:]) \
        if reads >= 0 else None
    body = loop_body(ptx)
    return {"shared": kernel.metadata.shared, "registers": registers(kernel.asm["cubin"]),
            "loop_ptx": instructions(body), "loop_sass": sass_loop_instructions(kernel.asm["cubin"]),
            "f16x2_dequant": "sub.f16x2" in ptx,
            "barrier_after_reads": bool(zeroing) and "bar.sync" in ptx[reads:reads + zeroing.start()],
            "wgmma": "wgmma.mma_async" in ptx,
            # the words through the copy engine: a bulk tensor copy in the machine code
            "tma": "cp.async.bulk.tensor" in ptx,
            # the dequantized tile through shared memory: an ldmatrix in the loop body (an epilogue may use one)
            "ldmatrix_in_loop": "ldmatrix" in body, **options}


def consumer_loop(sass: str) -> tuple[float, float]:
    """(SASS instructions, wgmma waits) per K step of the loop holding whole steps (8 HGMMAs each) that issues the
    fewest instructions per step: a warp-specialized kernel's consumer."""
    code, labels, pending = [], {}, []
    for line in sass.splitlines():
        label = re.match(r"^(\.L_x_\d+):", line)
        instruction = re.match(r"^\s+/\*([0-9a-f]+)\*/\s+(\S.*)", line)
        if label:
            pending.append(label.group(1))
        elif instruction:
            code.append((int(instruction.group(1), 16), instruction.group(2)))
            labels.update(dict.fromkeys(pending, code[-1][0]))
            pending = []
    best = None
    for address, text in code:
        branch = re.search(r"BRA\s+`\((\.L_x_\d+)\)", text)
        if branch and labels.get(branch.group(1), address) < address:
            body = [t for a, t in code if labels[branch.group(1)] <= a <= address]
            steps = sum("HGMMA" in t for t in body) // 8
            if steps and (best is None or len(body) / steps < len(best[0]) / best[1]):
                best = (body, steps)
    if best is None:
        return 0.0, 0.0
    body, steps = best
    return len(body) / steps, sum("WARPGROUP.DEPBAR" in t for t in body) / steps


def compile_ws(module, case, overrides) -> dict:
    """The warp-specialized kernel of one plan, compiled for sm90 as the family's host path would launch it."""
    from triton.backends.nvidia.driver import make_launcher
    from triton.experimental.gluon._runtime import GluonASTSource
    ws = importlib.import_module(module.__name__.rpartition(".")[0] + ".ws")
    launch = importlib.import_module(module.__name__.rpartition(".")[0] + ".launch")
    cfg = module.plan(case.m, case.k, case.n, overrides)
    assert cfg["WS"], (case.name, overrides)
    bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    q_layout, x_layout, s_layout = ws.shared_layouts(bm, bn, bk)
    signature = {"q_desc": f"tensordesc<i32[{bn}, {bk // 8}],{q_layout!r}>",
                 "x_desc": f"tensordesc<fp16[{bm}, {bk}],{x_layout!r}>",
                 "s_desc": f"tensordesc<fp16[1, {bn}],{s_layout!r}>", "b_ptr": "*fp16", "r_ptr": "*fp16",
                 "out_ptr": "*fp16", "acc_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
    constants = {"ACTIVATION": 0, "SPLIT_K": cfg["SPLIT_K"], "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                 "STAGES": cfg["WS_STAGES"], "WORDS_LAYOUT": ws.words_layout(bn)}
    signature.update(dict.fromkeys(constants, "constexpr"))
    # the pointers, N and K; M = 1 is specialized as a constant, as the launches do
    aligned = {(i,): [["tt.divisibility", 16]] for i in (3, 4, 5, 6, 7, 9, 10)}
    if case.m == 1:
        constants["M"] = 1
        signature["M"] = "constexpr"
    options = {"num_warps": bn // 16}
    if cfg["WS_MAXNREG"]:
        options["maxnreg"] = cfg["WS_MAXNREG"]
    kernel = triton.compile(GluonASTSource(ws.w4a16_ws_kernel, signature, constants, aligned),
                            target=GPUTarget("cuda", 90, 32), options=options)
    sass = _cubin_tool("nvdisasm", ["-c"], kernel.asm["cubin"])
    per_step, waits = consumer_loop(sass)
    # the encoded launcher (launch.encoded_launcher): the kernel's own signature and descriptors' metadata, spelled
    # encoded, must give the C source triton writes for the kernel
    metas = kernel.metadata.tensordesc_meta
    encoded = launch.encoded_signature(list(kernel.src.signature.values()), metas)
    same_launcher = encoded is not None and \
        make_launcher({}, dict(enumerate(encoded)), None) == make_launcher({}, kernel.src.signature, metas)
    ptx = kernel.asm["ptx"]
    reads = ptx.rfind("ld.volatile.global")  # the last split's reads of the sums, then their zeroing (compile_sm90)
    zeroing = re.search(r"st\.global(?:\.v\d)?\.b32 \[[^\]]*\], \{ (%r\d+)(?:, \1)* \}", ptx[reads:]) \
        if reads >= 0 else None
    return {"case": case.name, "kernel": "w4a16_ws_kernel", "split_k": cfg["SPLIT_K"], "block_n": bn,
            "stages": cfg["WS_STAGES"], "maxnreg": cfg["WS_MAXNREG"], "shared": kernel.metadata.shared,
            "registers": registers(kernel.asm["cubin"]), "loop_sass": per_step, "wgmma_waits": waits,
            "local_memory": len(re.findall(r"\b(?:LDL|STL)\b", sass)), "tma": "cp.async.bulk.tensor" in ptx,
            "f16x2_dequant": "fma.rn.f16x2" in ptx,
            "barrier_after_reads": bool(zeroing) and "bar.sync" in ptx[reads:reads + zeroing.start()],
            "encoded_descriptors": len(metas or ()), "encoded_launcher_same": same_launcher}


def kernel_plan(module, case, overrides=None) -> tuple[str, dict, dict, dict]:
    """(kernel name, constexpr values, compile options, the plan) of one case, as the family's host path launches it."""
    cfg = module.plan(case.m, case.k, case.n, overrides)
    blocks = {"BLOCK_SIZE_M": cfg["BLOCK_SIZE_M"], "BLOCK_SIZE_N": cfg["BLOCK_SIZE_N"],
              "BLOCK_SIZE_K": cfg["BLOCK_SIZE_K"]}
    tuning = {"SCALE_AFTER_DOT": cfg["SCALE_AFTER_DOT"], "DEQUANT": cfg["DEQUANT"]}
    if cfg["GRID"] == 1:
        name, constants = "w4a16_stream_kernel", {"ACTIVATION": 0, **tuning, **blocks}
    else:
        name, constants = "w4a16_splitk_kernel", {"ACTIVATION": 0, "SPLIT_K": cfg["SPLIT_K"], **tuning, **blocks}
    options = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    if cfg["MAXNREG"]:
        options["maxnreg"] = cfg["MAXNREG"]
    return name, constants, options, cfg


def main(solution: str) -> None:
    module = load_solution(Path(solution))
    kernels = importlib.import_module(module.__name__.rpartition(".")[0] + ".kernels")
    cases = TASK.cases("visible")
    # every visible plan, the unsplit path, each inline-PTX dequant and the scale before the dot on the first case
    # (ptxas assembles the inline sequences here, so one it rejects shows on CPU), and the stream-K kernel (GRID 1)
    # for each case
    jobs = [(case, None) for case in cases] + [(cases[0], {"SPLIT_K": 1})]
    # the default loop where the visible plans run the leaner one: unsplit, and on the widest deep tier (128 columns
    # on 8 warps, 3 stages)
    jobs += [(cases[0], {"SPLIT_K": 1, "LEAN_MIN_US": 0})]
    jobs += [(case, {"LEAN_MIN_US": 0}) for case in cases if module.plan(case.m, case.k, case.n)["BLOCK_SIZE_N"] == 128]
    # the other widest outputs (64 columns, 3 stages), which no visible case reaches: both loops
    wide = W4.Case("balanced", 24, 8192, 20480, "gelu_tanh", 0)
    jobs += [(wide, None), (wide, {"LEAN_MIN_US": 0})]
    # the split-K plans of the warp-specialized shapes before their one-wave cap (what non-Hopper GPUs would run
    # with WS_MAX_PROGRAMS 0), both loops
    jobs += [(case, {"WS_MAX_PROGRAMS": 0, **lean}) for case in cases for lean in ({}, {"LEAN_MIN_US": 0})
             if module.plan(case.m, case.k, case.n)["WS"]]
    jobs += [(cases[0], {"DEQUANT": d}) for d in (2, 3)] + [(cases[0], {"SCALE_AFTER_DOT": 0})]
    jobs += [(cases[0], {"DEQUANT": 3, "MAXNREG": 96})]
    jobs += [(case, {"GRID": 1}) for case in cases]
    seen, records = set(), []
    for case, overrides in jobs:
        name, constants, options, cfg = kernel_plan(module, case, overrides)
        key = (name, tuple(sorted(constants.items())), tuple(sorted(options.items())))
        if key in seen:
            continue
        seen.add(key)
        records.append({"case": case.name, "kernel": name, "split_k": constants.get("SPLIT_K", 0),
                        "dequant": cfg["DEQUANT"], "scale_after_dot": cfg["SCALE_AFTER_DOT"], "maxnreg": cfg["MAXNREG"],
                        "block_n": cfg["BLOCK_SIZE_N"],
                        **compile_sm90(getattr(kernels, name), dict(POINTERS), constants, options)})
    print(json.dumps(records))


def main_ws(solution: str) -> None:
    module = load_solution(Path(solution))
    cases = [case for case in TASK.cases("visible") if module.plan(case.m, case.k, case.n)["WS"]]
    jobs = [(case, {"WS_MIN_US": 30}) for case in cases]
    # one consumer warpgroup where the plan has two, and two where it has one
    jobs += [(case, {"WS_MIN_US": 30, "BLOCK_SIZE_N": 64, "WS_MAXNREG": 64, "WS_STAGES": 3, "WS_MAX_PROGRAMS": 528}
              if module.plan(case.m, case.k, case.n)["BLOCK_SIZE_N"] == 128
              else {"WS_MIN_US": 30, "BLOCK_SIZE_N": 128, "WS_MAXNREG": 72, "WS_MAX_PROGRAMS": 264})
             for case in cases]
    one_row = W4.Case(cases[0].stratum, 1, cases[0].k, cases[0].n, cases[0].epilogue, 0)
    jobs += [(one_row, {"WS_MIN_US": 30}), (one_row, {"WS_MIN_US": 30, "WS_MAX_PROGRAMS": 0})]  # one wave; split
    print(json.dumps([compile_ws(module, case, overrides) for case, overrides in jobs]))


if __name__ == "__main__":
    if sys.argv[2:] == ["--ws"]:
        main_ws(sys.argv[1])
    else:
        main(sys.argv[1])
