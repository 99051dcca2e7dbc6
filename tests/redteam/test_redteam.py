"""The red team: every solution in this folder through the real verifier (a subprocess per solution), each cheat
rejected by the gate meant for it, each honest solution passing.

On CPU the solutions run under --gates-only (and the smoke schedule where a cheat waits for the timed groups), all
at once in a thread pool so that the table costs about a minute on two cores. CUDA-only cheats are marked gpu.
"""
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import REDTEAM, ROOT

CASE = {"stratum": "balanced", "m": 18, "k": 256, "n": 256, "epilogue": "silu", "seed": 5}
LARGE_CASE = {"stratum": "balanced", "m": 24, "k": 8192, "n": 28672, "epilogue": "gelu_tanh", "seed": 7102}
GATES_ONLY = ("--gates-only",)
FULL_SMOKE = ("--schedule", "smoke")

# solution -> (gate that must fail, verifier arguments, whether the policy scan must also reject the source)
CHEATS = {
    "wrong_api": ("api", GATES_ONLY, False),
    "noncontiguous_output": ("output_structure", GATES_ONLY, False),
    "fp32_output": ("output_structure", GATES_ONLY, False),
    "tensor_subclass_output": ("output_structure", GATES_ONLY, False),
    "twos_complement": ("numerics_normal", GATES_ONLY, False),
    "reversed_nibbles": ("numerics_normal", GATES_ONLY, False),
    "fp16_accumulation": ("numerics_adversarial", GATES_ONLY, False),
    "mutate_x_version": ("input_immutability", GATES_ONLY, False),
    "mutate_residual_data": ("input_immutability", GATES_ONLY, False),
    "mutate_bias": ("input_immutability", GATES_ONLY, False),
    "mutate_qweight": ("input_immutability", GATES_ONLY, False),
    "mutate_scales": ("input_immutability", GATES_ONLY, False),
    "reused_output_buffer": ("fresh_outputs", GATES_ONLY, False),
    "output_aliases_residual": ("fresh_outputs", GATES_ONLY, False),
    "overwrite_earlier_output": ("fresh_outputs", GATES_ONLY, False),
    "unwritten_tail_rows": ("fresh_outputs", GATES_ONLY, False),
    "cached_by_pointer": ("no_output_caching", GATES_ONLY, False),
    "cached_by_sample": ("no_output_caching", GATES_ONLY, False),
    "cached_by_pointer_and_version": ("no_output_caching", GATES_ONLY, False),
    "patched_timer": ("no_tampering", GATES_ONLY, True),
    "patched_synchronize": ("no_tampering", GATES_ONLY, True),
    "read_evaluator_file": ("isolation", GATES_ONLY, True),
    "read_evaluator_file_hidden": ("isolation", GATES_ONLY, True),
    "start_subprocess": ("isolation", GATES_ONLY, True),
    "start_thread": ("isolation", GATES_ONLY, True),
    "keep_dense_fp16": ("residency", GATES_ONLY, False),
    "keep_int8_codes": ("residency", GATES_ONLY, False),
    "oversized_fp32_buffer": ("residency", GATES_ONLY, False),
    "lazy_dense_weight": ("residency", GATES_ONLY, False),
    "int8_codes_as_int32": ("residency", GATES_ONLY, False),
    "outputs_cached_as_int16": ("residency", GATES_ONLY, False),
    "degrades_after_warmup": ("schedule_outputs", FULL_SMOKE, False),
}
GPU_CHEATS = {
    "side_stream": ("streams", GATES_ONLY, True),
    "cache_after_warmup": ("timing_sanity", (), False),
}
HONEST = ("honest_torch", "v0")


def materialize(name, root):
    """tests/redteam/<name>.py as a solution directory beside core.py (v0 is the shipped baseline itself)."""
    if name == "v0":
        return ROOT / "methods" / "versions" / "v0"
    directory = root / name
    directory.mkdir()
    shutil.copy(REDTEAM / f"{name}.py", directory / "solution.py")
    shutil.copy(REDTEAM / "core.py", directory / "core.py")
    return directory


def verify(solution, panel, out, args):
    run = subprocess.run([sys.executable, "-m", "evals.verifier", "--solution", str(solution), "--panel", str(panel),
                          "--json", str(out), *args], cwd=ROOT, capture_output=True, text=True, timeout=900)
    return run, (json.loads(out.read_text()) if out.exists() else None)


def judge_all(solutions: dict, case: dict, root) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    panel = root / "panel.json"
    panel.write_text(json.dumps({"cases": [case]}))
    jobs = {name: (materialize(name, root), root / f"{name}.json", args) for name, args in solutions.items()}
    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        futures = {name: pool.submit(verify, solution, panel, out, args)
                   for name, (solution, out, args) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    solutions = {name: args for name, (_, args, _) in CHEATS.items()} | dict.fromkeys(HONEST, GATES_ONLY)
    verdicts = judge_all(solutions, CASE, tmp_path_factory.mktemp("redteam"))
    write_table(verdicts, {"cpu": CHEATS}, "redteam_cpu")
    return verdicts


def fired(report) -> list[str]:
    return report["cases"][0]["failed"]


def write_table(verdicts: dict, tables: dict, name: str) -> None:
    """The red-team table (solution, gate expected, gates that fired) into $KLOOP_EVIDENCE/<name>.md when that
    folder is set: the evidence a closing note quotes."""
    folder = os.environ.get("KLOOP_EVIDENCE")
    if not folder:
        return
    rows = ["| solution | gate expected | gates that fired | exit |", "|---|---|---|---|"]
    for solution, (run, report) in sorted(verdicts.items()):
        expected = next((t[solution][0] for t in tables.values() if solution in t), "none (honest)")
        got = ", ".join(fired(report)) if report else "no report"
        rows.append(f"| {solution} | {expected} | {got or 'none'} | {run.returncode} |")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{name}.md"), "w") as f:
        f.write("\n".join(rows) + "\n")


def assert_rejected(name, verdict, table=CHEATS):
    gate, _, policy_too = table[name]
    run, report = verdict
    assert run.returncode == 1, run.stdout + run.stderr
    assert gate in fired(report), f"{name}: expected {gate}, fired {fired(report)}\n{run.stdout}"
    assert report["gates"][gate] == "fail" and not report["valid"]
    assert report["cases"][0]["gates"][gate]["evidence"] and f"{gate}:" in run.stdout  # named, with evidence
    if policy_too:
        assert "policy" in fired(report)


def assert_passed(verdict):
    run, report = verdict
    assert run.returncode == 0, run.stdout + run.stderr
    assert report["valid"] and fired(report) == []
    passed = {gate for gate, status in report["gates"].items() if status == "pass"}
    assert {"api", "numerics_adversarial", "fresh_outputs", "no_output_caching", "residency", "policy"} <= passed


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_each_cheat_is_rejected_by_its_gate(name, verdicts):
    assert_rejected(name, verdicts[name])


@pytest.mark.parametrize("name", HONEST)
def test_honest_solutions_pass_every_gate(name, verdicts):
    assert_passed(verdicts[name])


def test_the_red_team_is_big_enough_and_documented():
    names = [p.stem for p in REDTEAM.glob("*.py") if p.stem not in ("core", "test_redteam")]
    assert set(names) == set(CHEATS) | set(GPU_CHEATS) | {"honest_torch"}
    assert len(CHEATS) + len(GPU_CHEATS) >= 20
    for name in names:
        doc = (REDTEAM / f"{name}.py").read_text().split('"""')[1]
        assert "\n" not in doc.strip() and doc.split()[0] in ("Cheat", "Wrong", "Honest:"), name


@pytest.mark.gpu
def test_the_whole_red_team_on_cuda(tmp_path):
    """The same table on the GPU, plus the cheats that only CUDA can show (a side stream; a cache only timing
    exposes)."""
    solutions = {name: args for name, (_, args, _) in CHEATS.items()} | dict.fromkeys(HONEST, GATES_ONLY)
    verdicts = judge_all(solutions | {"side_stream": GATES_ONLY}, CASE, tmp_path / "small")
    verdicts |= judge_all({"cache_after_warmup": ()}, LARGE_CASE, tmp_path / "large")
    write_table(verdicts, {"cpu": CHEATS, "gpu": GPU_CHEATS}, "redteam_cuda")
    for name in CHEATS:
        assert_rejected(name, verdicts[name])
    for name in GPU_CHEATS:
        assert_rejected(name, verdicts[name], GPU_CHEATS)
    for name in HONEST:
        assert_passed(verdicts[name])
