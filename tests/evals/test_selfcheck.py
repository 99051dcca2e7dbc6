"""The visible evaluator as a user runs it: a real subprocess, its table, its JSON and its exit status."""
import json
import subprocess
import sys

from tests.conftest import ROOT


def selfcheck(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "evals.selfcheck", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_v0_on_the_smoke_panel_is_correct_and_timed(tmp_path):
    out = tmp_path / "report.json"
    run = selfcheck("--solution", "methods/versions/v0", "--panel", "smoke", "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Triton interpreter" in run.stdout and "not GPU timing" in run.stdout
    report = json.loads(out.read_text())
    assert report["all_correct"] and len(report["cases"]) == 4
    for case in report["cases"]:
        assert case["checks"]["normal"]["ok"] and case["checks"]["adversarial"]["ok"]
        assert case["median_us"] > 0 and case["baseline_median_us"] > 0 and case["speedup"] > 0
        assert case["gbps"] > 0 and case["error"] is None
    assert set(report["strata"]) == {"balanced", "expert-batch"} and report["score"] > 0
    # the interpreter cannot tell a host-bound plan: said, never guessed
    assert report["stability"]["measured"] is False and report["stability"]["stable"] is None
    assert report["stability"]["note"] == "not measured: no CUDA (interpreter)"
    assert all(c["stable"] is None and c["host_us"] is None for c in report["cases"])


def test_a_candidate_that_raises_becomes_error_fields(tmp_path, panel_file):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "solution.py").write_text("def build(qweight, scales, bias, epilogue):\n"
                                     "    raise KeyError('no tile for this shape')\n")
    out = tmp_path / "report.json"
    run = selfcheck("--solution", str(bad), "--panel", str(panel_file(("balanced", 18, 256, 256, "silu", 1))),
                    "--json", str(out))
    assert run.returncode == 1
    assert "KeyError" in run.stdout and "Traceback" not in run.stderr
    case = json.loads(out.read_text())["cases"][0]
    assert case["correct"] is False
    assert case["error"]["name"] == "KeyError" and "no tile" in case["error"]["message"]
    assert case["error"]["stage"].startswith("correctness")


def test_a_wrong_answer_fails_with_the_worst_element(tmp_path, panel_file, redteam_solution):
    solution = redteam_solution("honest_torch")
    text = (solution / "solution.py").read_text().replace("bias, residual, activation)",
                                                          "bias * 0, residual, activation)")
    (solution / "solution.py").write_text(text)
    run = selfcheck("--solution", str(solution), "--panel", str(panel_file(("balanced", 18, 256, 256, "silu", 1))))
    assert run.returncode == 1
    assert "FAIL" in run.stdout and "outside the fp32 bound" in run.stdout


def test_a_solution_that_degrades_after_its_first_calls_fails_after_timing(tmp_path, panel_file, redteam_solution):
    solution = redteam_solution("degrades_after_warmup")
    text = (solution / "solution.py").read_text().replace("HONEST_CALLS = 34", "HONEST_CALLS = 3")
    (solution / "solution.py").write_text(text)
    out = tmp_path / "report.json"
    run = selfcheck("--solution", str(solution), "--panel", str(panel_file(("balanced", 18, 256, 256, "silu", 1))),
                    "--json", str(out))
    assert run.returncode == 1, run.stdout
    case = json.loads(out.read_text())["cases"][0]
    assert case["checks"]["normal"]["ok"] and not case["checks"]["after_timing"]["ok"] and not case["correct"]


def test_a_policy_violation_runs_no_candidate_code_and_exit_zero_is_a_failure(tmp_path, panel_file):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "solution.py").write_text("raise SystemExit(0)\n")
    out = tmp_path / "report.json"
    run = selfcheck("--solution", str(bad), "--panel", str(panel_file(("balanced", 18, 256, 256, "silu", 1))),
                    "--json", str(out))
    assert run.returncode == 1
    error = json.loads(out.read_text())["cases"][0]["error"]
    assert error["name"] == "PolicyViolation" and "[process]" in error["message"]


def test_bad_paths_are_usage_errors(tmp_path):
    run = selfcheck("--solution", str(tmp_path / "missing"), "--panel", "smoke")
    assert run.returncode == 2 and "no solution.py" in run.stderr
    run = selfcheck("--solution", "methods/versions/v0", "--panel", str(tmp_path / "nope.json"))
    assert run.returncode == 2 and "no panel file" in run.stderr
