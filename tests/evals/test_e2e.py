"""End to end (evals/e2e.py): the tiny Llama-shaped decoder served by every backend, kernels under the interpreter on
CPU (on a GPU through the decode step's CUDA graph, timed too); the bound catches a wrong layer; a W4A16 folder
without the identity epilogue is one row that says so; bad input is refused with exit 2. The GPU test runs the
8B-shaped model at two layers on CUDA."""
import json
import math
import subprocess
import sys
import types

import pytest
import torch

from evals import e2e
from evals import e2e_model as em
from evals import e2e_report
from evals import kernel_harness as kh
from evals.task import load
from tests.conftest import ROOT, W4A16_FAMILY

TINY = em.CONFIGS["tiny"]
DEVICE = kh.select_device().device
FAMILY = "w4a16 " + e2e.label(W4A16_FAMILY, load("w4a16"))  # "w4a16 main", or the draft's path while one differs
V0 = ROOT / "methods" / "versions" / "v0"


TUNED = {"DEVICE_BOUND_US": 0}  # a tuning override main's build takes (its config)


@pytest.fixture(scope="module")
def report():
    """Every backend on the tiny config at batches 1 and 2 (v0 is the unservable W4A16 folder), the W4A16 folders a
    second time built with TUNED."""
    backends = e2e.select_backends(None, None, [str(V0), str(W4A16_FAMILY)], None, TUNED)
    options = e2e.Options(TINY, "tiny", backends, [1, 2], prompt=4, checked=2, steps=8)
    lines = []
    return e2e.run(options, log=lines.append) | {"log": lines}


def rows_of(report, backend):
    return [r for r in report["rows"] if r["backend"] == backend]


@pytest.mark.parametrize("backend", ["bf16", "tinygemm", FAMILY, FAMILY + " DEVICE_BOUND_US=0", "llgemm main"])
def test_every_servable_backend_computes_the_model(report, backend):
    """One step's logits at the last two prompt positions, per batch, within the bound of the dense model in the
    backend's dtype; the bound is above zero (the reference's own rounding) and far below the logits' size."""
    if backend == "tinygemm" and DEVICE.type == "cpu" and not hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        pytest.skip("tinygemm is not checked on CPU: this torch has no _weight_int4pack_mm_for_cpu (its CPU kernel)")
    rows = rows_of(report, backend)
    assert [r["batch"] for r in rows] == [1, 2]
    for r in rows:
        assert r["error"] is None and r["correct"], r
        assert 0 < r["bound"] < 0.2, r
        assert r["tokens_checked"] == 2 * r["batch"]
        assert r["dtype"] == ("float16" if backend.startswith("w4a16") else "bfloat16")
        timing = [r[k] for k in ("tokens_per_s", "tpot_ms", "linear_ms", "linear_share", "gbps")]
        if DEVICE.type == "cuda":
            assert all(math.isfinite(v) and v > 0 for v in timing), r
        else:  # no CUDA graphs: correctness only, and the row has no timing
            assert timing == [None] * 5


def test_a_folder_without_the_identity_epilogue_is_one_row_saying_so(report):
    for name in ("w4a16 v0", "w4a16 v0 DEVICE_BOUND_US=0"):
        rows = rows_of(report, name)
        assert len(rows) == 1 and rows[0]["batch"] is None and rows[0]["error"] is None
        assert rows[0]["note"].startswith("not servable: its build takes only the contract's epilogues (gelu_tanh, "
                                          "silu)")
        assert any(line.startswith(name + " ") and "not servable" in line for line in report["log"])


def test_a_build_without_config_is_not_served_with_overrides():
    """--w4a16-config reaches a build only through its ``config`` parameter; a build without one says so."""
    def build(qweight, scales, bias, epilogue):
        raise AssertionError("never built")

    module = types.SimpleNamespace(ACTIVATIONS={"identity": 2}, build=build)
    with pytest.raises(em.Unservable, match="not servable with --w4a16-config: its build.* takes no config"):
        em.linear_maker("w4a16", module, TUNED)
    assert callable(em.linear_maker("w4a16", module))  # without overrides it serves
    assert em.takes_config(lambda qweight, scales, bias, epilogue, *, config=None: None)
    assert em.takes_config(lambda qweight, scales, bias, epilogue, **tuning: None)
    assert not em.takes_config(lambda qweight, scales, bias, epilogue, tuning=None: None)


def test_weight_bytes_follow_each_format(report):
    """bf16 holds 2 bytes a weight; the int4 formats half a byte plus their scales; each adds the dense lm_head."""
    weights = sum(k * n for k, n in TINY.shapes().values()) * TINY.layers
    head = 2 * TINY.vocab * TINY.hidden
    by_backend = {r["backend"]: r["weight_gb"] * 1e9 for r in report["rows"] if r["weight_gb"]}
    assert by_backend["bf16"] == by_backend["llgemm main"] == 2 * weights + head
    assert weights / 2 + head < by_backend[FAMILY] < by_backend["tinygemm"] < weights + head


def reference_and_exact(weights, tokens, dtype=torch.bfloat16):
    return (e2e.reference_logits(weights, dtype, tokens, 2), e2e.reference_logits(weights, torch.float32, tokens, 2))


def served(weights, make_linear, tokens, dtype=torch.bfloat16):
    model = em.build_model(weights, make_linear, dtype)
    state = em.new_state(model, tokens.shape[0], tokens.shape[1])
    return em.teacher_forced(em.Stepper(model, state, graphs=False), state, tokens, 2)


class DropsResidual(em.Dense):
    """o and down take the residual stream to fuse and forget it: out = x @ W only."""

    fuses_residual = True

    def __call__(self, x, residual=None):
        return super().__call__(x)


def reversed_nibbles(projection):
    """The codes read with the nibble order of each word reversed (row 8j + i taken from bits 4(7 - i))."""
    w4 = em.w4a16_adapter()
    codes = w4.unpack_int4(projection.qweight)
    k, n = codes.shape
    flipped = codes.reshape(k // 8, 8, n).flip(1).reshape(k, n)
    return em.Projection(w4.pack_int4(flipped.int()), projection.scales)


def test_the_compiled_glue_computes_the_same_model(tmp_path):
    """torch.compile'd RMSNorm, add + RMSNorm, RoPE, attention and SwiGLU (the default on CUDA) against the eager
    reference: within the bound, as the eager glue is (in a subprocess, as make e2e runs it: Inductor's compile
    workers stay out of the test process); both glues hold the same functions."""
    out = tmp_path / "e2e.json"
    run = subprocess.run([sys.executable, "-m", "evals.e2e", "--config", "tiny", "--backends", "bf16", "--batches", "2",
                          "--glue", "compiled", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    [row] = report["rows"]
    assert report["glue"] == "compiled" and row["error"] is None and row["correct"], row
    compiled, eager = em.make_glue("compiled"), em.make_glue("eager")
    assert compiled is em.make_glue("compiled") and compiled.norm is not em.rms_norm
    assert (eager.norm, eager.add_norm, eager.rotate, eager.attend, eager.swiglu) == (
        em.rms_norm, em.add_norm, em.rotate, em.attend, em.swiglu)


@pytest.mark.parametrize("bug", ["drops the residual", "reads the nibbles reversed", "reads the next group's scales"])
def test_a_wrong_layer_fails_the_bound(bug):
    weights = em.random_weights(TINY, DEVICE, seed=3)
    tokens = torch.randint(0, TINY.vocab, (2, 4), generator=torch.Generator(device=DEVICE).manual_seed(4),
                           device=DEVICE)
    ref, exact = reference_and_exact(weights, tokens)
    right = e2e.compare(served(weights, lambda p: em.Dense(p.dense(torch.bfloat16)), tokens), ref, exact)
    assert right["correct"], right
    if bug == "drops the residual":
        make = lambda p: DropsResidual(p.dense(torch.bfloat16))  # noqa: E731
    elif bug == "reads the nibbles reversed":
        make = lambda p: em.Dense(reversed_nibbles(p).dense(torch.bfloat16))  # noqa: E731
    else:
        make = lambda p: em.Dense(em.Projection(p.qweight, p.scales.roll(-1, dims=0)).dense(torch.bfloat16))  # noqa
    wrong = e2e.compare(served(weights, make, tokens), ref, exact)
    assert not wrong["correct"] and wrong["max_abs_err"] > 5 * wrong["bound"], wrong


def test_the_stores_weights_are_exact_in_fp16_and_bf16_and_near_the_drawn_ones():
    gen = torch.Generator().manual_seed(5)
    drawn = torch.randn((512, 256), generator=gen) / math.sqrt(512)
    projection = em.quantize(drawn)
    exact = projection.dense(torch.float64)
    for dtype in (torch.float16, torch.bfloat16):
        assert torch.equal(projection.dense(dtype).double(), exact)
    step = projection.scales.double().repeat_interleave(em.GROUP_SIZE, dim=0).t()
    assert ((exact - drawn.double().t()).abs() <= step / 2 + 1e-12).all()  # round to nearest within the group's range


def test_ratios_are_per_batch_against_bf16_and_tinygemm():
    rows = [{"backend": b, "batch": m, "tokens_per_s": s, "vs_bf16": None, "vs_tinygemm": None}
            for b, m, s in [("bf16", 8, 100.0), ("tinygemm", 8, 160.0), ("w4a16 main", 8, 240.0),
                            ("bf16", 24, 300.0), ("w4a16 main", 24, 600.0)]]
    e2e_report.add_ratios(rows)
    main8, main24 = rows[2], rows[4]
    assert (main8["vs_bf16"], main8["vs_tinygemm"]) == (2.4, 1.5)
    assert (main24["vs_bf16"], main24["vs_tinygemm"]) == (2.0, None)
    report = {"rows": rows}
    assert "w4a16 main, batches 18-32 (24): 2.00x bf16" in e2e_report.summary(report)


def test_the_plot_and_table_are_written_where_asked(tmp_path):
    rows = [dict(vars(e2e.Row(b, m, "bfloat16", tokens_per_s=s, correct=True))) for b, m, s in
            [("bf16", 1, 50.0), ("bf16", 8, 380.0), ("tinygemm", 1, 90.0), ("tinygemm", 8, 600.0)]]
    report = {"rows": rows, "batches": [1, 8], "config": "tiny", "device": "cpu", "model": {"layers": 2}}
    e2e_report.write(report, tmp_path / "r.json", tmp_path / "out")
    assert json.loads((tmp_path / "r.json").read_text())["rows"] == rows
    assert (tmp_path / "out" / "tokens_per_s.png").read_bytes()[:4] == b"\x89PNG"
    table = (tmp_path / "out" / "table.txt").read_text().splitlines()
    assert table[0] == e2e_report.HEADER and len(table) == 1 + len(rows)


@pytest.mark.parametrize("args, said", [
    (["--backends", "bf16,fp8"], "unknown backend 'fp8': give --backends from bf16, tinygemm, w4a16, llgemm"),
    (["--batches", "1,8,x"], "--batches takes distinct positive integers"),
    (["--batches", "8,8"], "--batches takes distinct positive integers"),
    (["--w4a16", "methods/drafts/no-such-folder"], "no solution.py in methods/drafts/no-such-folder"),
    (["--task", "rowgain"], "--task must be one of w4a16, llgemm"),
    (["--layers", "0"], "--layers must be at least 1"),
    (["--glue", "fused"], "--glue must be one of eager, compiled"),
    (["--w4a16-config", "[1]"], "--w4a16-config takes a non-empty JSON object"),
    (["--w4a16-config", "{"], "--w4a16-config takes a JSON object"),
    (["--profile", "4", "--config", "tiny"], "--profile takes one of the run's batches (1,2) and needs CUDA"),
    (["--backends", "bf16", "--w4a16-config", '{"SPLIT_K": 2}'], "--w4a16-config tunes the W4A16 folders, and this"),
])
def test_bad_input_is_refused_with_what_to_do(args, said, capsys):
    assert e2e.main(args) == 2
    assert said in capsys.readouterr().err


def test_the_8b_config_is_refused_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the 8B config runs (the GPU test covers it)")
    assert e2e.main(["--config", "llama3-8b"]) == 2
    assert "needs CUDA" in capsys.readouterr().err


@pytest.mark.gpu
def test_the_8b_shape_at_two_layers_on_cuda(tmp_path):
    """Every backend, batches 8 (LL-GEMM's own kernel) and 24 (the W4A16 task's scored range): correct, timed."""
    out = tmp_path / "e2e.json"
    run = subprocess.run([sys.executable, "-m", "evals.e2e", "--layers", "2", "--batches", "8,24", "--steps", "20",
                          "--w4a16", *dict.fromkeys(map(str, (V0, ROOT / "methods" / "main", W4A16_FAMILY))),
                          "--profile", "24", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads(out.read_text())["rows"]
    timed = [r for r in rows if r["batch"] is not None]
    assert {r["backend"] for r in timed} >= {"bf16", "tinygemm", FAMILY, "llgemm main"}
    for r in timed:
        assert r["correct"] and r["error"] is None, r
        for key in ("tokens_per_s", "tpot_ms", "linear_ms", "linear_share", "gbps", "resident_gb", "kv_gb", "floor_ms",
                    "x_floor"):
            assert math.isfinite(r[key]) and r[key] > 0, (key, r)
        assert r["linear_share"] < 1.5, r  # the linear layers alone cannot take much longer than the whole step
        assert r["x_floor"] > 0.8, r  # no step reads its weights much faster than a read-only pass does
        if r["batch"] == 24:  # the profile: every projection alone, and the step's kernels
            p = r["profile"]
            assert list(p["projections"]) == list(em.PROJECTIONS), p
            alone = sum(q["ms"] for q in p["projections"].values())  # two layers of one projection may sit in the L2
            assert 0.7 < alone / r["linear_ms"] < 1.3 and all(q["floor_ms"] > 0 for q in p["projections"].values()), p
            assert p["kernels"] and 0.5 < p["total_us"] / 1e3 / r["tpot_ms"] < 1.5, p
        else:
            assert r["profile"] is None
    assert all(r["vs_bf16"] for r in timed)
