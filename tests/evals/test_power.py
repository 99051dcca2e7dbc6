"""The power probe: what it says without NVML or CUDA, how it reads a pass, and (on a GPU) what it measures."""
import ctypes
import json

import pytest
import torch

from evals import kernel_harness as kh
from evals import power
from evals.bench import format_case
from tests.conftest import ROOT

# make bench on an H200 with main v97 beside v0 (reports/examples/h200-power): each row's power probe
BENCH = ROOT / "tests" / "evals" / "data" / "power-probes-h200.json"
PROBES = {(p["case"], p["impl"]): p["power"] for p in json.loads(BENCH.read_text())["probes"]}
CAPPED = PROBES[("32x28672x8192-silu", "main")]


def nvml_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


def test_off_cuda_the_probe_measures_nothing_and_says_why():
    called = []
    p = power.probe(lambda: called.append(1), [()], torch.device("cpu"), 10.0)
    assert p == {"note": "not measured: no CUDA device"} and not called
    assert power.describe(p) is None and power.numbers(p) == "not measured: no CUDA device"


@pytest.mark.skipif(nvml_loadable(), reason="checks a machine without the NVIDIA driver's NVML")
def test_without_nvml_the_meter_says_what_is_missing():
    with pytest.raises(power.PowerUnavailable, match="libnvidia-ml.so.1"):
        power.meter(torch.device("cuda", 0))


@pytest.mark.parametrize("change, want", [
    ({}, "power-capped (power cap or brake active in 100% of samples): 643 W of a 700 W limit, SM clock 1665 of "
         "1980 MHz, 33.66 mJ a call"),
    ({"capped": 0.5}, "power-capped (power cap or brake active in 50% of samples)"),
    ({"capped": 0.2}, None),  # the cap touched now and then: the clock mostly at its maximum
    ({"capped": 0.0, "thermal": 0.8, "reasons": ["SW thermal slowdown"]}, "thermally slowed (80% of samples)"),
    ({"note": "not measured: NVML nvmlDeviceGetTotalEnergyConsumption returned 3"}, None),
])
def test_a_pass_is_power_capped_when_the_cap_held_in_most_samples(change, want):
    said = power.describe(dict(CAPPED, **change))
    assert said == want if want is None else said.startswith(want)


def test_on_the_h200_only_mains_two_117_mb_rows_ran_power_capped():
    """The cap is read from the clock-event reasons, not from the watts: v0's 24x8192x28672 row drew over 90% of the
    limit with the SM clock at its maximum, and main's capped 32x28672x8192 row read 643 W."""
    capped = {key for key, probe in PROBES.items() if power.describe(probe)}
    assert capped == {("24x8192x28672-gelu_tanh", "main"), ("32x28672x8192-silu", "main")}
    v0 = PROBES[("24x8192x28672-gelu_tanh", "v0")]
    assert v0["power_w"] > 0.9 * v0["limit_w"] and v0["sm_mhz"] == v0["max_sm_mhz"] and v0["capped"] == 0
    assert all(PROBES[key]["sm_mhz"] < 0.9 * PROBES[key]["max_sm_mhz"] for key in capped)


def test_the_bench_table_shows_power_clock_and_energy_and_flags_a_capped_row():
    row = {"impl": "main", "note": "ours", "correct": True, "eager_us": 53.5, "graph_hot_us": 52.0,
           "graph_flushed_us": 52.1, "flushed_copy_fraction": 0.58, "host_us": 15.6, "floor_ratio": 1.54,
           "power": CAPPED, "error": None}
    cool = dict(row, impl="v0", power=PROBES[("32x28672x8192-silu", "v0")])
    unmeasured = dict(row, impl="peer", power={"note": "not measured: no CUDA device"})
    entry = {"case": {"name": "32x28672x8192-silu", "stratum": "balanced"}, "roofline_us": 30.0,
             "gpu_floor_us": 34.0, "target_us": 51.0, "rows": [row, cool, unmeasured]}
    lines = format_case(entry).splitlines()
    header = lines[1].split()
    capped, plain, blank = (line.split() for line in lines[2:5])
    assert [capped[header.index(k)] for k in ("watts", "sm_mhz", "mJ")] == ["643", "1665", "33.66"]
    assert lines[2].endswith("ours; power-capped (power cap or brake active in 100% of samples)")
    assert plain[header.index("watts")] == "589" and "power-capped" not in lines[3]
    assert [blank[header.index(k)] for k in ("watts", "sm_mhz", "mJ")] == ["-", "-", "-"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_probe_reads_more_power_from_the_whole_chip_than_from_one_spinning_sm():
    """A spin kernel keeps one SM busy; a 256 MiB copy keeps every SM and the HBM busy. The board's energy counter,
    read over a second of each, gives the copy the higher power, each under the limit's reach, and the SM clock and
    the reasons read while the GPU was busy."""
    from evals import stability

    device = torch.device("cuda")
    try:
        power.meter(device)
    except power.PowerUnavailable as exc:
        pytest.skip(f"this GPU's driver gives no power readings: {exc}")
    src = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_us = kh.median(kh.time_groups(lambda s: dst.copy_(s), [(src,)], 5, 20, warmup=5))
    spin = power.probe(lambda: stability.spin(device, copy_us), [()], device, copy_us)
    copy = power.probe(lambda: dst.copy_(src), [()], device, copy_us)
    for p in (spin, copy):
        assert p["note"] == "measured", p
        assert p["calls"] >= 64 and 0 < p["energy_mj"] and 0 < p["power_w"] < 1.5 * p["limit_w"], p
        assert 0 < p["sm_mhz"] <= p["max_sm_mhz"], p
    assert copy["power_w"] > spin["power_w"] + 20, (spin, copy)

