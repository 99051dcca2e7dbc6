"""The profiler summary: its bottleneck labels, and what it says without a GPU."""
import json
import subprocess
import sys

import pytest
import torch

from evals import kernel_harness as kh
from evals import power
from evals.profile import CaseProfile, KernelLaunch, case_flop, format_ncu, label, ncu_kernel_filter, parse_ncu_raw
from evals.task import Task, load
from tests.conftest import ROOT, W4A16_FAMILY
from tests.evals.test_power import CAPPED

TASK = load("w4a16")
W4 = TASK.adapter

# `ncu --csv --page raw` with the summary's sections, as Nsight Compute 2025.3 printed it on an H200 (one kernel: a
# torch elementwise kernel that a target's set-up launched; the parser reads any kernel the same way)
NCU_RAW = ROOT / "tests" / "evals" / "data" / "ncu-raw-h200.csv"


def profile(grid, **numbers):
    case = W4.Case("balanced", 18, 8192, 8192, "silu", 1)
    p = CaseProfile(case=kh.case_dict(case), bytes=W4.bytes_moved(case), flop=2 * 18 * 8192 * 8192, **numbers)
    p.kernels = [KernelLaunch("w4a16_gemm_kernel", 1, p.gpu_us_per_call, grid, [128, 1, 1])]
    return p


@pytest.mark.parametrize("numbers, want", [
    ({"host_us_per_call": 20, "gpu_us_per_call": 5, "median_us": 20, "launch_overhead_share": 0.75}, "launch-bound"),
    # measured on the H200 (split-K draft, 32x8192x2048): the latency is the host's though the GPU is busy 55% of it
    ({"host_us_per_call": 56.7, "gpu_us_per_call": 18.2, "median_us": 33.3, "launch_overhead_share": 0.45,
      "copy_fraction": 0.069, "matmul_fraction": 0.04}, "launch-bound"),
    # the GPU keeps up with the host: not launch-bound
    ({"host_us_per_call": 30, "gpu_us_per_call": 29, "median_us": 30, "launch_overhead_share": 0.03,
      "copy_fraction": 0.5, "matmul_fraction": 0.01}, "memory-bound"),
    ({"host_us_per_call": 8, "gpu_us_per_call": 60, "median_us": 60, "launch_overhead_share": 0.0, "copy_fraction": 0.1,
      "grid": [16, 1, 1]}, "under-filled grid"),
    ({"host_us_per_call": 8, "gpu_us_per_call": 60, "median_us": 60, "launch_overhead_share": 0.0, "copy_fraction": 0.4,
      "matmul_fraction": 0.01}, "memory-bound"),
    ({"host_us_per_call": 8, "gpu_us_per_call": 60, "median_us": 60, "launch_overhead_share": 0.0, "copy_fraction": 0.1,
      "matmul_fraction": 0.6}, "compute-bound"),
    # the board at its power limit with the SM clock lowered: the clock, not the copy engine, sets the time
    ({"host_us_per_call": 16, "gpu_us_per_call": 53, "median_us": 53, "launch_overhead_share": 0.0,
      "copy_fraction": 0.58, "matmul_fraction": 0.3, "power": CAPPED}, "power-capped"),
    # the cap touched in a few samples only: the label the rest of the evidence gives
    ({"host_us_per_call": 16, "gpu_us_per_call": 53, "median_us": 53, "launch_overhead_share": 0.0,
      "copy_fraction": 0.58, "matmul_fraction": 0.3, "power": dict(CAPPED, capped=0.2)}, "memory-bound"),
])
def test_bottleneck_labels_follow_the_evidence(numbers, want):
    p = profile(numbers.pop("grid", [1024, 1, 1]), **numbers)
    name, evidence = label(p, sm_count=132)
    assert name == want and evidence


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_a_gpu_it_says_so_and_reports_bytes_and_flop(tmp_path, panel_file):
    out = tmp_path / "profile.json"
    run = subprocess.run([sys.executable, "-m", "evals.profile", "--solution", "methods/versions/v0", "--panel",
                          str(panel_file(("balanced", 18, 256, 256, "silu", 1))), "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "no GPU" in run.stdout
    report = json.loads(out.read_text())
    case = report["cases"][0]
    assert (case["bytes"] == W4.bytes_moved(W4.Case("balanced", 18, 256, 256, "silu", 1))
            and case["flop"] == 2 * 18 * 256 * 256)
    assert case["median_us"] is None and case["bottleneck"] == "unknown"
    assert report["task"] == "w4a16" and f"{case['flop']:,} FLOP per call" in case["evidence"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_another_task_is_profiled_from_its_own_adapter(tmp_path):
    """The toy task (colscale): its main by default, its panel, its bytes; it counts no FLOP, and the evidence says
    bytes alone."""
    toy = load(ROOT / "tests" / "toy_task")
    out = tmp_path / "profile.json"
    run = subprocess.run([sys.executable, "-m", "evals.profile", "--task", "tests/toy_task", "--panel", "smoke",
                          "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert report["task"] == "colscale" and report["solution"] == str(toy.main_dir)
    cases = toy.cases("smoke")
    assert [c["case"]["name"] for c in report["cases"]] == [c.name for c in cases]
    for row, case in zip(report["cases"], cases):
        assert row["bytes"] == toy.adapter.bytes_moved(case) and row["flop"] is None
        assert row["evidence"].startswith(f"no GPU: {row['bytes']:,} bytes per call;")


def test_the_flop_are_the_adapters_and_optional():
    case = W4.Case("balanced", 18, 256, 512, "silu", 1)
    assert case_flop(TASK, case) == W4.flop(case) == 2 * 18 * 256 * 512
    assert case_flop(Task("toy", ROOT, {}, object()), case) is None  # an adapter without flop(case)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_v0_profile_on_the_gpu(tmp_path, panel_file):
    out = tmp_path / "profile.json"
    run = subprocess.run([sys.executable, "-m", "evals.profile", "--solution", "methods/versions/v0", "--panel",
                          str(panel_file(("expert-batch", 18, 8192, 1024, "gelu_tanh", 1))), "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(out.read_text())
    case = report["cases"][0]
    assert report["rates"]["copy_gbps"] > 1000 and report["rates"]["matmul_tflops"] > 100
    assert case["median_us"] > 0 and 0 < case["copy_fraction"] < 1
    assert case["kernels"] and case["kernels"][0]["calls_per_call"] == 1 and case["kernels"][0]["grid"]
    assert case["triton_kernels"] and case["triton_kernels"][0]["registers"] > 0
    assert case["bottleneck"] in {"launch-bound", "under-filled grid", "memory-bound", "compute-bound", "power-capped"}
    try:
        power.meter(torch.device("cuda"))
    except power.PowerUnavailable as exc:  # no NVML here: the profile says so in place of the numbers
        assert case["power"]["note"] == f"not measured: {exc}"
    else:
        assert case["power"]["note"] == "measured" and case["power"]["energy_mj"] > 0, case["power"]


def test_the_ncu_summary_reads_nsight_computes_raw_page():
    summary = parse_ncu_raw(NCU_RAW.read_text())
    assert summary["kernel"].startswith("void vectorized_elementwise_kernel")
    assert summary["duration_us"] == pytest.approx(3.2)  # "3,200" ns
    assert (summary["dram_throughput_pct"], summary["l2_throughput_pct"]) == (13.87, 31.93)
    assert (summary["achieved_occupancy_pct"], summary["theoretical_occupancy_pct"]) == (18.26, 100.0)
    assert summary["issue_active_pct"] == 4.45
    assert (summary["registers_per_thread"], summary["shared_bytes_dynamic"], summary["grid_size"]) == (32, 0, 512)
    # stall reasons, largest first, named without the metric's prefix and suffix; the issuing warp is no stall
    assert summary["stalls"][:2] == [["long_scoreboard", 45.91], ["no_instruction", 7.35]]
    assert all(a[1] >= b[1] for a, b in zip(summary["stalls"], summary["stalls"][1:]))
    assert "selected" not in {reason for reason, _ in summary["stalls"]} and len(summary["stalls"]) > 10
    line = format_ncu({"available": True, **summary})
    assert "DRAM 13.9%" in line and "32 registers" in line and "long_scoreboard 45.91" in line


@pytest.mark.parametrize("text", ["", "==ERROR== the profiler could not start\n", '"ID","Process ID"\n"1","2"\n'])
def test_ncu_output_without_a_kernel_row_gives_no_summary(text):
    assert parse_ncu_raw(text) is None
    assert format_ncu({"available": False, "reason": "ncu is not on PATH"}) == "not available: ncu is not on PATH"


@pytest.mark.parametrize("name, want", [
    ("w4a16_splitk_kernel", "regex:^w4a16_splitk_kernel$"),  # Triton: the bare name already
    # torch.profiler's name of the fixture's kernel, which ncu calls vectorized_elementwise_kernel
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float, "
     "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul> >(int, "
     "at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, "
     "std::array<char*, 2ul>)", "regex:^vectorized_elementwise_kernel$"),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn", "regex:^ampere_fp16_s16816gemm_fp16_128x128_ldg8_"
                                                                   "f2f_stages_32x5_tn$"),
])
def test_the_ncu_kernel_filter_is_the_bare_function_name(name, want):
    assert ncu_kernel_filter(name) == want


@pytest.mark.parametrize("overrides, message", [("{DEQUANT: 3}", "is not JSON"), ("[3]", "must be a JSON object")])
def test_bad_overrides_are_a_usage_error_that_shows_the_form(overrides, message):
    run = subprocess.run([sys.executable, "-m", "evals.profile", "--solution", str(W4A16_FAMILY), "--panel",
                          "smoke", "--overrides", overrides], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and message in run.stderr and '{"num_warps": 8}' in run.stderr, run.stderr
