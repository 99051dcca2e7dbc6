"""The patched family's warp-specialized kernel (variants/stream-ablations.diff) compiled for sm90 on any machine, as
its host path would launch it for one (M, K, N) and plan overrides: registers, shared memory, the consumer's SASS
instructions and wgmma waits per K step, local-memory instructions (spills), copy-engine copies and shared loads in the
kernel. One JSON line per overrides.

    python reports/examples/h200-stream-ceiling/sm90_counts.py DIR '[M, K, N]' '[OVERRIDES, ...]'

DIR: a copy of methods/drafts/w4a16 with the diff applied. Without TRITON_INTERPRET (the interpreter never compiles).
"""
import importlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "methods"))
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

import hopper_compile as hc  # noqa: E402
from evals.loader import load_solution  # noqa: E402


def compile_var(module, m, k, n, overrides):
    ws = importlib.import_module(module.__name__.rpartition(".")[0] + ".ws")
    cfg = module.plan(m, k, n, overrides)
    assert cfg["WS"], overrides
    bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    q_layout, x_layout, s_layout = ws.shared_layouts(bm, bn, bk)
    if cfg["WS_WIDE_BOX"]:
        q_sig = f"tensordesc<i32[{bn * (bk // 8) // 128}, 128],{ws.wide_box_layout()!r}>"
    else:
        q_sig = f"tensordesc<i32[{bn}, {bk // 8}],{q_layout!r}>"
    signature = {"q_desc": q_sig,
                 "x_desc": f"tensordesc<fp16[{bm}, {bk}],{x_layout!r}>",
                 "s_desc": f"tensordesc<fp16[1, {bn}],{s_layout!r}>", "b_ptr": "*fp16", "r_ptr": "*fp16",
                 "out_ptr": "*fp16", "acc_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
    constants = {"ACTIVATION": 0, "SPLIT_K": cfg["SPLIT_K"], "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
                 "STAGES": cfg["WS_STAGES"], "WORDS_LAYOUT": ws.words_layout(bn), "GROUPS": cfg["WS_GROUPS"],
                 "ABLATE": cfg["WS_ABLATE"], "WORDS_ONLY": cfg["WS_WORDS_ONLY"],
                 "WIDE_BOX": cfg["WS_WIDE_BOX"]}
    signature.update(dict.fromkeys(constants, "constexpr"))
    aligned = {(i,): [["tt.divisibility", 16]] for i in (3, 4, 5, 6, 7, 9, 10)}
    options = {"num_warps": bn // 16}
    if cfg["WS_MAXNREG"]:
        options["maxnreg"] = cfg["WS_MAXNREG"]
    kernel = triton.compile(GluonASTSource(ws.w4a16_ws_kernel, signature, constants, aligned),
                            target=GPUTarget("cuda", 90, 32), options=options)
    sass = hc._cubin_tool("nvdisasm", ["-c"], kernel.asm["cubin"])
    per_step, waits = hc.consumer_loop(sass)
    return {"overrides": overrides, "split": cfg["SPLIT_K"], "bn": bn, "shared": kernel.metadata.shared,
            "registers": hc.registers(kernel.asm["cubin"]), "loop_sass": per_step, "wgmma_waits": waits,
            "local": len(re.findall(r"\b(?:LDL|STL)\b", sass)), "tma": kernel.asm["ptx"].count("cp.async.bulk.tensor"),
            "lds": len(re.findall(r"LDS", sass))}


if __name__ == "__main__":
    module = load_solution(ROOT / sys.argv[1])
    m, k, n = json.loads(sys.argv[2])
    for overrides in json.loads(sys.argv[3]):
        try:
            print(json.dumps(compile_var(module, m, k, n, overrides)), flush=True)
        except Exception as exc:
            print(json.dumps({"overrides": overrides, "error": f"{type(exc).__name__}: {str(exc)[-800:]}"}), flush=True)
