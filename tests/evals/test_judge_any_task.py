"""The judge's path (gates, verifier, residency, make-panel) on a task that is not W4A16: a throwaway task written
into a temporary folder, out = x * weight + shift in fp32, one call input, two input regimes, a callable baseline and
no residency stage. Everything it is judged by comes from its manifest and adapter."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from evals import gates, verifier
from evals.task import load
from tests.conftest import ROOT

ADAPTER = '''"""A throwaway task for the judge's tests: out = x * weight + shift, fp32."""
import random
from dataclasses import asdict, dataclass

import torch

from evals.kernel_harness import CheckResult
from evals.task import Problem

MODES = ("normal", "wide")
OUTPUT_DTYPE = torch.float32


@dataclass(frozen=True)
class Case:
    stratum: str
    rows: int
    cols: int
    seed: int

    @property
    def name(self):
        return f"{self.rows}x{self.cols}"

    @property
    def dims(self):
        return {"rows": self.rows, "cols": self.cols}


@dataclass
class Reference:
    out: torch.Tensor
    tolerance: torch.Tensor


def generate(case, mode="normal", device="cpu"):
    gen = torch.Generator().manual_seed(case.seed * 31 + MODES.index(mode))
    scale = 1.0 if mode == "normal" else 3e4  # "wide": products far past fp16's range
    weight = (torch.randn(case.cols, generator=gen) * scale).to(device)
    x = (torch.randn((case.rows, case.cols), generator=gen) * scale).to(device)
    return Problem({"weight": weight, "shift": 0.5 if mode == "normal" else -3.0}, (x,))


def make_inputs(case, count, seed, device="cpu"):
    gen = torch.Generator().manual_seed(case.seed * 7919 + seed)
    return [(torch.randn((case.rows, case.cols), generator=gen).to(device),) for _ in range(count)]


def reference(weights, inputs, case):
    out = inputs[0].double() * weights["weight"].double() + weights["shift"]
    return Reference(out, 1e-6 * out.abs() + 1e-6)


def check_output(out, ref, case):
    if type(out) is not torch.Tensor:
        return CheckResult(False, "output must be a plain torch.Tensor")
    if tuple(out.shape) != output_shape(case) or out.dtype != OUTPUT_DTYPE or not out.is_contiguous():
        return CheckResult(False, f"output must be contiguous fp32 {output_shape(case)}; got {out.dtype} "
                                  f"{tuple(out.shape)}")
    excess = (out.double() - ref.out).abs() / ref.tolerance
    bad = int((~(excess <= 1)).sum())  # NaN counts
    return CheckResult(not bad, "ok" if not bad else f"{bad} elements outside the bound", bad, float(excess.max()))


def output_shape(case):
    return (case.rows, case.cols)


def bytes_moved(case):
    return 4 * (2 * case.rows * case.cols + case.cols)


def make_panel(seed, per_stratum, strata, visible):
    rng = random.Random(seed)
    taken = {(c.rows, c.cols) for c in visible}
    cases = []
    for stratum, ranges in strata.items():
        low, high = ranges["rows"]
        for _ in range(per_stratum):
            rows, cols = rng.randint(low, high or 64), 8 * rng.randint(1, 8)
            while (rows, cols) in taken:
                rows, cols = rng.randint(low, high or 64), 8 * rng.randint(1, 8)
            taken.add((rows, cols))
            cases.append(asdict(Case(stratum, rows, cols, rng.randrange(1000, 2**31))))
    return {"note": f"sealed panel drawn with seed {seed}", "cases": cases}


def baseline(weights, case):
    weight, shift = weights["weight"], weights["shift"]

    def fn(x):
        return x * weight + shift

    return fn
'''

SOLUTIONS = {
    "honest": '''"""Honest."""
import torch


def build(weight, shift):
    def fn(x):
        return torch.addcmul(torch.full_like(x, shift), x, weight)

    return fn
''',
    "half_precision": '''"""Wrong (numerics_wide): computes in fp16, which overflows on the wide regime."""
import torch


def build(weight, shift):
    half = weight.half()

    def fn(x):
        return (x.half() * half + shift).float()

    return fn
''',
    "cached_by_pointer": '''"""Cheat (no_output_caching): one result per input address."""


def build(weight, shift):
    cache = {}

    def fn(x):
        if x.data_ptr() not in cache:
            cache[x.data_ptr()] = x * weight + shift
        return cache[x.data_ptr()].clone()

    return fn
''',
    "unwritten_last_row": '''"""Cheat (fresh_outputs): leaves the output's last row unwritten."""
import torch


def build(weight, shift):
    def fn(x):
        out = torch.empty_like(x)
        out[:-1] = x[:-1] * weight + shift
        return out

    return fn
''',
    "mutate_weight": '''"""Cheat (input_immutability): scales the weight in place once built."""


def build(weight, shift):
    weight.mul_(1.0)

    def fn(x):
        return x * weight + shift

    return fn
''',
}
CASES = [{"stratum": "small", "rows": 3, "cols": 16, "seed": 5}, {"stratum": "large", "rows": 9, "cols": 24, "seed": 6}]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The task's folder (manifest, adapter, panels) and its solutions' folders."""
    root = tmp_path_factory.mktemp("toy")
    folder = root / "task"
    (folder / "panels").mkdir(parents=True)
    (folder / "adapter.py").write_text(ADAPTER)
    (folder / "panels" / "visible.json").write_text(json.dumps({"cases": CASES}))
    (folder / "panels" / "smoke.json").write_text(json.dumps({"cases": CASES[:1]}))
    manifest = {
        "name": "tmp-scale-shift", "description": "out = x * weight + shift", "spec": str(folder / "spec.md"),
        "adapter": str(folder / "adapter.py"),
        "contract": {"entry": "build", "build_args": ["weight", "shift"], "call_args": ["x"]},
        "main": str(root / "main"), "versions": str(root / "versions"), "ledger": str(root / "log.md"),
        "panels": {"visible": str(folder / "panels" / "visible.json"), "smoke": str(folder / "panels" / "smoke.json")},
        "tier_dims": {"rows": [1, None]}, "strata": {"small": {"rows": [1, 7]}, "large": {"rows": [8, None]}},
        "baseline": {"callable": "adapter.baseline"}, "stages": ["policy", "selfcheck", "gates"],
        "timing": "eager-groups"}
    (folder / "task.json").write_text(json.dumps(manifest))
    for name, source in SOLUTIONS.items():
        (root / name).mkdir()
        (root / name / "solution.py").write_text(source)
    return root


def run(*args):
    return subprocess.run([sys.executable, "-m", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def verdicts(toy):
    """Each solution through the real verifier, --gates-only on the task's visible panel."""
    found = {}
    for name in SOLUTIONS:
        out = toy / f"{name}.json"
        done = run("evals.verifier", "--task", toy / "task", "--solution", toy / name, "--panel", "visible",
                   "--gates-only", "--json", out)
        found[name] = (done, json.loads(out.read_text()) if out.exists() else None)
    return found


def test_the_tasks_own_regimes_name_its_numerics_gates(toy):
    task = load(toy / "task")
    names = gates.role_gates(task)
    assert "numerics_wide" in names and "numerics_normal" in names and "numerics_adversarial" not in names
    assert set(gates.undeclared_gates(task)) == {"residency"} and gates.undeclared_gates(load("w4a16")) == {}
    assert "declares no residency stage" in gates.undeclared_gates(task)["residency"]


def test_an_honest_solution_passes_every_gate_the_task_has(verdicts):
    done, report = verdicts["honest"]
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["valid"] and report["task"] == "tmp-scale-shift" and len(report["cases"]) == 2
    for case in report["cases"]:
        assert case["failed"] == []
        for name in ("api", "output_structure", "numerics_normal", "numerics_wide", "input_immutability",
                     "fresh_outputs", "no_output_caching", "no_tampering", "isolation", "policy", "coverage"):
            assert case["gates"][name]["status"] == "pass", (name, case["gates"][name])
        assert case["gates"]["residency"]["status"] == "skip"
        evidence = case["gates"]["no_output_caching"]["evidence"]
        assert any("x changed in one element in place, _version unchanged" in line for line in evidence)
        structure = case["gates"]["output_structure"]["evidence"]
        assert any("fp32, contiguous, finite" in line for line in structure)
        guarded = case["gates"]["input_immutability"]["evidence"][0]
        assert guarded == "7 inputs: values and _version unchanged"  # weight, wide weight, wide x, x[0..3]
    assert "declares no residency stage" in report["skipped"]["residency"]


@pytest.mark.parametrize("name, gate", [("half_precision", "numerics_wide"), ("cached_by_pointer", "no_output_caching"),
                                        ("unwritten_last_row", "fresh_outputs"),
                                        ("mutate_weight", "input_immutability")])
def test_each_cheat_is_rejected_by_its_gate(verdicts, name, gate):
    done, report = verdicts[name]
    assert done.returncode == 1, done.stdout + done.stderr
    assert gate in report["cases"][0]["failed"] and not report["valid"], report["cases"][0]["failed"]
    if name == "unwritten_last_row":
        evidence = " ".join(report["cases"][0]["gates"]["fresh_outputs"]["evidence"])
        assert "still hold the allocator poison" in evidence  # a 4-byte poison in an fp32 output


def test_the_full_pipeline_times_the_callable_baseline_in_its_roles(toy):
    out = toy / "full.json"
    done = run("evals.verifier", "--task", toy / "task", "--solution", toy / "honest", "--panel", "smoke",
               "--schedule", "smoke", "--json", out)
    report = json.loads(out.read_text())
    assert report["baseline"] == "adapter.baseline"
    case = report["cases"][0]
    for role in verifier.ROLES:
        record = case["roles"][role]
        assert len(record["times_us"]) == gates.SCHEDULES["smoke"].groups and record["median_us"] > 0, record["error"]
        assert record["gates"]["schedule_outputs"]["status"] == "pass"
        if role == "candidate":
            assert Path(record["solution"]).resolve() == (toy / "honest").resolve()
        else:
            assert record["solution"] == "adapter.baseline"
    assert case["ratio"] is not None and "residency" in report["skipped"]
    assert done.returncode in (0, 1) and "verdict:" in done.stdout


def test_a_skip_the_task_declares_away_does_not_block_a_valid_verdict(toy):
    """Full mode: a skipped gate makes a report NOT valid, but the residency gate of a task without that stage is no
    gate it has (W4A16's residency skipped would still block)."""
    def judged(task):
        passing = {name: {"status": "pass", "evidence": ["ok"]} for name in gates.role_gates(task)}
        passing["residency"] = {"status": "skip", "evidence": ["no residency stage"]}
        return {"case": {"stratum": "small"}, "gates": passing, "score": 1.0}

    toy_task, w4a16 = load(toy / "task"), load("w4a16")
    assert verifier.summarize([judged(toy_task)], gates_only=False, task=toy_task)["valid"]
    assert not verifier.summarize([judged(w4a16)], gates_only=False, task=w4a16)["valid"]


def test_the_residency_guard_refuses_a_task_without_that_stage(toy):
    done = run("evals.residency", "--task", toy / "task", "--solution", toy / "honest", "--panel", "smoke")
    assert done.returncode == 2 and "declares no residency stage" in done.stderr, done.stdout + done.stderr


def test_make_panel_draws_the_tasks_strata_and_refuses_its_folders(toy, tmp_path):
    out = tmp_path / "sealed.json"
    done = run("evals.verifier", "make-panel", "--task", toy / "task", "--seed", 3, "--per-stratum", 2, "--out", out)
    assert done.returncode == 0, done.stderr
    cases = load(toy / "task").cases(out)
    assert [c.stratum for c in cases] == ["small", "small", "large", "large"]
    assert json.loads(out.read_text()) == verifier.make_panel(3, 2, load(toy / "task"))
    inside = toy / "versions" / "sealed.json"  # the task's own versions folder, outside the repository
    done = run("evals.verifier", "make-panel", "--task", toy / "task", "--seed", 3, "--out", inside)
    assert done.returncode == 2 and "refusing" in done.stderr and not inside.exists()


def test_the_toy_task_of_the_tests_passes_the_gates_with_its_own_regimes(tmp_path):
    """tests/toy_task (a callable baseline from torch, its own regimes, no residency stage) through the gates."""
    task = load(ROOT / "tests" / "toy_task")
    out = tmp_path / "gates.json"
    done = run("evals.verifier", "--task", "tests/toy_task", "--solution", task.main_dir, "--panel", "smoke",
               "--gates-only", "--json", out)
    report = json.loads(out.read_text())
    assert done.returncode == 0 and report["valid"], done.stdout + done.stderr
    regimes = {f"numerics_{mode}" for mode in task.adapter.MODES}
    for case in report["cases"]:
        assert all(case["gates"][name]["status"] == "pass" for name in regimes)
        assert case["gates"]["residency"]["status"] == "skip"


def test_a_check_stage_of_the_tasks_own_is_accepted_and_a_manifest_without_policy_first_is_not(toy, tmp_path):
    manifest = json.loads((toy / "task" / "task.json").read_text())
    for name, stages, code in (("own", ["policy", "selfcheck", "gates", "lint"], 0),
                               ("unordered", ["selfcheck", "policy"], 2)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "task.json").write_text(json.dumps(manifest | {"name": name, "stages": stages,
                                                                 "commands": {"lint": ["-m", "evals.policy"]}}))
        done = run("evals.selfcheck", "--task", folder, "--list-cases", "--panel", "smoke")
        assert done.returncode == code, done.stdout + done.stderr
    assert "stages must start with policy, selfcheck" in done.stderr
