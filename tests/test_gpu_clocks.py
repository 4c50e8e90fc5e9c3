"""GPU clocks in the record: the sampler against a stand-in for the driver's NVML library
(compiled here, the same C calls), the summaries and their reduction over ranks against
hand-computed values, and the report's flags. A real GPU's clocks: test_gpu.py."""

from __future__ import annotations

import csv
import math
import shutil
import subprocess
import threading
import time

import pytest
from conftest import run_bench
from report_records import write_runs

from bench.measure.gpu_clocks import (
    Sample,
    energy_slots,
    from_vector,
    start_monitor,
    summarise,
    to_vector,
    total_energy,
)

# The NVML calls bench makes, with their C signatures (nvml.h); the clock and the reasons
# are what the test sets. Built with -DOLD_DRIVER it lacks the reasons call's R535 name,
# the utilization call and the energy counter: a figure the driver cannot give is NaN,
# sampling goes on.
FAKE_NVML = r"""
#include <time.h>
static unsigned int clock_mhz = 1980; static unsigned long long reasons = 0;
static int device = 7;
void fake_set(unsigned int mhz, unsigned long long why) { clock_mhz = mhz; reasons = why; }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetHandleByUUID(const char *uuid, void **out) {
  if (uuid[0] != 'G' || uuid[1] != 'P' || uuid[2] != 'U' || uuid[3] != '-') return 13;
  *out = &device; return 0; }
int nvmlDeviceGetClockInfo(void *d, int type, unsigned int *v) {
  if (type != 1) return 2; *v = clock_mhz; return 0; }
int nvmlDeviceGetMaxClockInfo(void *d, int type, unsigned int *v) {
  if (type != 1) return 2; *v = 1980; return 0; }
int nvmlDeviceGetTemperature(void *d, int sensor, unsigned int *v) {
  if (sensor != 0) return 2; *v = clock_mhz > 1500 ? 55 : 87; return 0; }
int nvmlDeviceGetPowerUsage(void *d, unsigned int *mw) { *mw = 650500; return 0; }
typedef struct { unsigned int gpu, memory; } utilization;
int nvmlDeviceGetEnforcedPowerLimit(void *d, unsigned int *mw) { *mw = 500000; return 0; }
int nvmlDeviceGetPowerManagementDefaultLimit(void *d, unsigned int *mw) { *mw = 700000; return 0; }
#ifndef OLD_DRIVER
int nvmlDeviceGetTotalEnergyConsumption(void *d, unsigned long long *mj) {
  struct timespec now; clock_gettime(CLOCK_MONOTONIC, &now);
  *mj = (unsigned long long)((now.tv_sec + now.tv_nsec * 1e-9) * 650500.0); return 0; }
int nvmlDeviceGetUtilizationRates(void *d, utilization *u) {
  u->gpu = clock_mhz > 1500 ? 97 : 60; u->memory = 40; return 0; }
int nvmlDeviceGetCurrentClocksEventReasons(void *d, unsigned long long *v) {
  *v = reasons; return 0; }
#endif
int nvmlDeviceGetCurrentClocksThrottleReasons(void *d, unsigned long long *v) {
  *v = reasons; return 0; }
"""


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler to build the stand-in NVML library")
    out = tmp_path_factory.mktemp("nvml")
    (out / "fake_nvml.c").write_text(FAKE_NVML)
    built = {}
    for name, flags in (("new", []), ("old", ["-DOLD_DRIVER"])):
        lib = out / f"libfake-nvml-{name}.so"
        subprocess.run(["cc", "-shared", "-fPIC", *flags, "-o", str(lib),
                        str(out / "fake_nvml.c")], check=True)
        built[name] = str(lib)
    return built


def _full_clock(library: str):
    """The stand-in library's controls (the same loaded library as the sampler's, so one
    state, kept between tests), set to full clock."""
    import ctypes

    control = ctypes.CDLL(library)
    control.fake_set(1980, 0)
    return control


@pytest.mark.parametrize("driver", ["new", "old"])
def test_the_sampler_summarises_each_window_and_stops(fake_nvml, driver):
    """0.3 s at full clock, then 0.3 s at 1,410 MHz held down by the power cap and a hardware
    thermal slowdown: each window says its own, from about 15 samples at 20 ms."""
    control = _full_clock(fake_nvml[driver])
    monitor, how = start_monitor(["0b2c7d3e-aaaa-bbbb-cccc-123456789abc"], fake_nvml[driver],
                                 interval_s=0.02)
    assert monitor is not None and how == "nvml", how
    try:
        start = time.perf_counter()
        time.sleep(0.3)
        middle = time.perf_counter()
        control.fake_set(1410, 0x4 | 0x40)
        time.sleep(0.3)
        end = time.perf_counter()
        cool, hot = monitor.window(start, middle), monitor.window(middle, end)
        assert monitor.power_limits() == [[500.0, 700.0]]  # enforced, default
    finally:
        monitor.close()
    assert not any(t.name == "bench-gpu-clocks" for t in threading.enumerate())
    assert 8 <= cool["samples"] <= 16 and 8 <= hot["samples"] <= 16, (cool, hot)
    assert cool["sm_mhz_median"] == 1980 and cool["sm_mhz_max"] == 1980
    assert cool["slowdowns"] == [] and cool["slowdown_share"] == 0
    assert cool["temperature_c_max"] == 55 and cool["power_w_median"] == 650.5
    assert hot["sm_mhz_median"] == 1410 and hot["temperature_c_max"] == 87
    if driver == "new":
        assert cool["util_pct_median"] == 97 and hot["util_pct_median"] == 60
        # the energy counter runs at 650.5 W (CLOCK_MONOTONIC, perf_counter's clock)
        assert cool["energy_j"] == pytest.approx(650.5 * (middle - start), rel=0.01)
        assert hot["energy_j"] == pytest.approx(650.5 * (end - middle), rel=0.01)
    else:  # no utilization or energy call: NaN, and the other figures are there
        assert math.isnan(cool["util_pct_median"]) and math.isnan(hot["util_pct_median"])
        assert math.isnan(cool["energy_j"])
    # the sample at the switch may have read either clock; the reasons are read with it
    assert hot["slowdowns"] == ["power cap", "hw thermal"] and hot["slowdown_share"] > 0.85


def test_a_window_shorter_than_the_interval_gets_a_sample(fake_nvml):
    _full_clock(fake_nvml["new"])
    monitor, _ = start_monitor(["0b2c7d3e"], fake_nvml["new"], interval_s=10)
    try:
        time.sleep(0.05)  # the sample taken at start is outside the window
        now = time.perf_counter()
        window = monitor.window(now - 0.01, now)
    finally:
        monitor.close()
    assert window["samples"] == 1 and window["sm_mhz_median"] == 1980


def test_why_clocks_were_not_sampled_is_said(fake_nvml, tmp_path):
    monitor, how = start_monitor(["MIG-0b2c"], fake_nvml["new"])
    assert monitor is None and how == ("not sampled: nvmlDeviceGetHandleByUUID(MIG-0b2c) "
                                       "returned NVML error 13")
    monitor, how = start_monitor(["0b2c"], str(tmp_path / "libnone.so"))
    assert monitor is None and how.startswith("not sampled: NVML not found (")


def test_two_gpus_are_summarised_by_the_slower_and_reduced_over_ranks():
    """Rank 0 drives 2 GPUs (dp): the slower GPU's median clock and the less busy GPU's
    median utilization speak for the window. Rank 1's GPU ran hotter and capped; rank 2 had
    no sample. Reduced as the all-reduce (max) does. Energy over a 0.5 s window from each
    GPU's counter: rank 0's GPUs drew 400 W (40 J in 0.1 s) and 500 W (100 J in 0.2 s), 450
    J; rank 1's 700 W, 350 J; the run's is their sum, or None while a rank has none."""
    import torch

    rank0 = summarise([Sample(0.1, 0, 1980, 1980, 60, 400, 0, 90, 1000.0),
                       Sample(0.2, 0, 1980, 1980, 61, 420, 0, 94, 41000.0),
                       Sample(0.1, 1, 1800, 1980, 58, 500, 0x4, 99, 5000.0),
                       Sample(0.2, 1, 1900, 1980, 59, 520, 0, 97, 55000.0),
                       Sample(0.3, 1, 1600, 1980, 59, 510, 0x4, 98, 105000.0)], 0.5)
    assert rank0.pop("energy_j") == pytest.approx(200 + 250)
    assert rank0 == {"samples": 2, "sm_mhz_median": 1800, "sm_mhz_low": 1600,
                     "sm_mhz_max": 1980, "temperature_c_max": 61, "power_w_median": 510,
                     "slowdown_share": 2 / 3, "slowdowns": ["power cap"],
                     "util_pct_median": 92}
    rank1 = summarise([Sample(0.1, 0, 1755, 1980, 83, 690, 0x20, 100, 0.0),
                       Sample(0.2, 0, 1755, 1980, 84, 700, 0x20, 100, 70000.0),
                       Sample(0.3, 0, math.nan, 1980, 84, 700, 0x20, 99, 140000.0)], 0.5)
    assert rank1["sm_mhz_median"] == 1755 and rank1["slowdown_share"] == 1.0
    assert rank1["energy_j"] == pytest.approx(350)
    vectors = torch.tensor([to_vector(rank0), to_vector(rank1), to_vector(None)],
                           dtype=torch.float64)
    reduced = from_vector(vectors.max(dim=0).values.tolist())
    assert reduced == {"samples": 2, "sm_mhz_median": 1755, "sm_mhz_low": 1600,
                       "sm_mhz_max": 1980, "temperature_c_max": 84, "power_w_median": 700,
                       "slowdown_share": 1.0, "slowdowns": ["power cap", "sw thermal"],
                       "util_pct_median": 92}  # the least busy GPU's
    assert from_vector(to_vector(None)) is None
    rank0["energy_j"] = 450.0
    slots = torch.tensor([energy_slots(s, rank, 3) for rank, s in
                          enumerate((rank0, rank1, None))], dtype=torch.float64)
    assert total_energy(slots.max(dim=0).values.tolist()) is None  # rank 2 measured none
    two = torch.tensor([energy_slots(rank0, 0, 2), energy_slots(rank1, 1, 2)])
    assert total_energy(two.max(dim=0).values.tolist()) == pytest.approx(800)
    # one sample of a GPU gives no rate: no energy for the window
    assert math.isnan(summarise([Sample(0.1, 0, 1980, 1980, 60, 400, 0, 90, 1000.0)],
                                0.5)["energy_j"])


def _gpu_record(run_id: str, strategy: str, precision: str, clocks: list[tuple],
                limit_w: float = 700.0) -> dict:
    """A finished N=1 CUDA record whose epochs ran at these (median MHz, reasons) clocks, on
    a GPU whose default power limit of 700 W was set to ``limit_w``; each 2 s epoch took
    1,200 J."""
    epochs = [{"epoch": i + 1, "train_time_s": 2.0, "images_per_s": 25000.0, "top1": 0.5,
               "top5": 0.8, "peak_mem_bytes": 2**30, "train_loss": 1.0, "eval_time_s": 0.1,
               "gpu_clocks": {"samples": 20, "sm_mhz_median": mhz, "sm_mhz_low": mhz,
                              "sm_mhz_max": 1980.0, "temperature_c_max": 70.0,
                              "power_w_median": 600.0, "slowdown_share": 1.0 if why else 0,
                              "slowdowns": why, "util_pct_median": 90.0 + i,
                              "energy_j": 1200.0}}
              for i, (mhz, why) in enumerate(clocks)]
    return {"run_id": run_id, "started_at": run_id, "status": "ok", "strategy": strategy,
            "device": "cuda", "world_size": 1, "processes": 1, "precision": precision,
            "norm": "per-replica-bn", "dataset": "synthetic", "train_size": 50000,
            "global_batch": 512, "model": {"width": 1.0}, "per_epoch": epochs,
            "gpu_clocks": "nvml every 100 ms, each rank's GPUs, reduced per epoch",
            "gpu_power_limits_w": [[limit_w, 700.0]],
            "env": {"cpu": "Test CPU", "cpu_count": 16, "torch": "x", "python": "3"}}


def test_rows_measured_at_lower_clocks_or_in_thermal_slowdown_are_flagged(tmp_path):
    """ddp ran at full clock (its power limit 680 of 700 W: within 5 %); fsdp's timed epochs
    at 1,700 MHz (86 % of 1,980: 14 points below ddp; its warm-up at full clock does not
    count) under a power limit lowered to 500 W; ddp-amp at 1,930 MHz (97 %: 3 points, within
    the 5 allowed) but in a hardware thermal slowdown."""
    write_runs(tmp_path, [
        _gpu_record("a", "ddp", "tf32", [(1980.0, [])] * 3, limit_w=680.0),
        _gpu_record("b", "fsdp", "tf32", [(1980.0, [])] + [(1700.0, ["power cap"])] * 2,
                    limit_w=500.0),
        _gpu_record("c", "ddp-amp", "bf16", [(1930.0, ["hw thermal"])] * 3)])
    proc = run_bench("report", "--results", str(tmp_path), "--no-write")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()
            if line.split()[:1] in (["ddp"], ["fsdp"], ["ddp-amp"])}
    assert rows["ddp"].endswith("100%   ok"), rows  # the clock column, then the status
    # 50,000 images per 1,200 J in every row: said once, in the block's heading
    assert "img/J 41.7" in proc.stdout.splitlines()[0], proc.stdout
    assert rows["fsdp"].endswith("86%    ok ⚠ GPU clock -14 %, GPU power limit lowered"), rows
    assert rows["ddp-amp"].endswith("97%    ok ⚠ GPU hw thermal"), rows
    said = " ".join(proc.stderr.split())  # warnings are wrapped at 120 columns
    assert ("fsdp N=1 (synthetic 50000 img, batch 512, resnet18 on GPU): its GPUs ran at 86 % of "
            "their maximum SM clock, 14 points below the best row") in said
    assert "ddp-amp N=1 (synthetic 50000 img, batch 512, resnet18 on GPU): the GPU lowered its " \
           "clocks for hw thermal during timed epochs" in said
    assert ("fsdp N=1 (synthetic 50000 img, batch 512, resnet18 on GPU): a GPU ran under a power "
            "limit of 500 W, below its default 700 W") in said
    assert said.count("power limit") == 1
    table = run_bench("report", "--results", str(tmp_path), "--no-write", "--format", "csv")
    rows = {r["strategy"]: r for r in csv.DictReader(table.stdout.splitlines())}
    # utilization of the timed epochs (91, 92): median 91.5; the clock share 1700 / 1980
    assert float(rows["fsdp"]["gpu_util"]) == 91.5
    assert float(rows["fsdp"]["clock_share"]) == 1700 / 1980
    assert float(rows["fsdp"]["images_per_joule"]) == pytest.approx(50000 / 1200)


def test_an_epochs_line_keeps_to_120_columns_with_its_gpu_figures():
    """The longest strategy name, a 4-digit energy and a slowdown reason: the GPUs' figures
    go on their own line; a short line keeps them beside it."""
    from bench.train.progress import epoch_line

    clocks = {"sm_mhz_median": 1700.0, "sm_mhz_max": 1980.0, "temperature_c_max": 61.0,
              "util_pct_median": 97.0, "energy_j": 1820.0, "slowdowns": ["power cap"],
              "slowdown_share": 0.4}
    entry = {"epoch": 4, "train_time_s": 2.63, "images_per_s": 18901.0, "input_wait_s": 0.3,
             "train_loss": 3.123, "top1": 0.6898, "gpu_clocks": clocks}
    long = epoch_line("ddp-launch", 30, entry).splitlines()
    assert len(long) == 2 and max(map(len, long)) <= 120, long
    assert "input wait 11%" in long[0] and long[1].strip().startswith("SM 1700/1980 MHz")
    short = epoch_line("ddp", 4, {**entry, "gpu_clocks": {**clocks, "slowdowns": []}})
    assert "\n" not in short and len(short) <= 120 and short.endswith("util 97% 1820 J"), short
