"""The GPU clocks a run's times were measured at. A thread of each rank polls NVML (the
driver's own library, through ctypes: nothing to install) every 100 ms for the GPUs of its
process: SM clock and its maximum, temperature, power, the clock-event reasons and the
utilization (the share of time a kernel ran: low when the input pipeline starves it). Each
epoch's timed window is summarised and reduced over ranks (the lowest clock, the hottest GPU),
so a record shows whether its GPUs ran at full clock and, if not, what held them down: two
rows measured at different clocks are not a fair comparison.

No torch import at module level: the report reads the summaries without torch."""

from __future__ import annotations

import contextlib
import ctypes
import math
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

INTERVAL_S = 0.1

# NVML's clock-event reason bits that lower the clocks (nvmlClocksEventReason*). A GPU under
# full load at its power limit runs capped: normal, but it costs clock. The others are not.
SLOWDOWNS = {0x4: "power cap", 0x8: "hw slowdown", 0x20: "sw thermal", 0x40: "hw thermal",
             0x80: "power brake"}
SLOWDOWN_MASK = sum(SLOWDOWNS)

_NVML_CLOCK_SM = 1
_NVML_TEMPERATURE_GPU = 0


@dataclass(frozen=True)
class Sample:
    """One GPU's state at one instant (``t``: time.perf_counter)."""

    t: float
    gpu: int
    sm_mhz: float
    max_sm_mhz: float
    temperature_c: float
    power_w: float
    reasons: int
    util_pct: float = math.nan
    energy_mj: float = math.nan  # the GPU's energy counter (mJ since the driver loaded)


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class NvmlError(RuntimeError):
    pass


class Nvml:
    """The few NVML calls a clock sample needs (libnvidia-ml.so.1 comes with the driver)."""

    def __init__(self, library: str = "libnvidia-ml.so.1") -> None:
        try:
            self.lib = ctypes.CDLL(library)
        except OSError as e:
            raise NvmlError(f"NVML not found ({e})") from None
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        # Drivers before R535 have only the older name of the reasons call.
        self._reasons = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            self.lib.nvmlDeviceGetCurrentClocksThrottleReasons

    @staticmethod
    def _check(rc: int, call: str) -> None:
        if rc != 0:
            raise NvmlError(f"{call} returned NVML error {rc}")

    def handle(self, uuid: str) -> ctypes.c_void_p:
        """The device of a CUDA UUID as torch prints it (NVML prefixes plain GPUs with
        'GPU-')."""
        name = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        device = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByUUID(name.encode(), ctypes.byref(device)),
                    f"nvmlDeviceGetHandleByUUID({name})")
        return device

    def _read(self, name: str, value: ctypes._SimpleCData | ctypes.Structure, *args) -> bool:
        """Call NVML's ``name``(*args, &value); False when it failed or this driver lacks it
        (a figure it cannot give is NaN, never the end of sampling)."""
        call = getattr(self.lib, name, None)
        return call is not None and call(*args, ctypes.byref(value)) == 0

    def _uint(self, name: str, *args) -> float:
        value = ctypes.c_uint()
        return float(value.value) if self._read(name, value, *args) else math.nan

    def _ulonglong(self, name: str, *args) -> float:
        value = ctypes.c_ulonglong()
        return float(value.value) if self._read(name, value, *args) else math.nan

    def read(self, device: ctypes.c_void_p, gpu: int) -> Sample:
        reasons, busy = ctypes.c_ulonglong(), _Utilization()
        known = self._reasons(device, ctypes.byref(reasons)) == 0
        return Sample(
            t=time.perf_counter(), gpu=gpu,
            sm_mhz=self._uint("nvmlDeviceGetClockInfo", device, _NVML_CLOCK_SM),
            max_sm_mhz=self._uint("nvmlDeviceGetMaxClockInfo", device, _NVML_CLOCK_SM),
            temperature_c=self._uint("nvmlDeviceGetTemperature", device, _NVML_TEMPERATURE_GPU),
            power_w=self._uint("nvmlDeviceGetPowerUsage", device) / 1000,
            reasons=int(reasons.value) if known else 0,
            util_pct=(float(busy.gpu) if self._read("nvmlDeviceGetUtilizationRates", busy, device)
                      else math.nan),
            energy_mj=self._ulonglong("nvmlDeviceGetTotalEnergyConsumption", device),
        )

    def power_limits(self, device: ctypes.c_void_p) -> list[float]:
        """[the power limit in force, the GPU's default limit] in W (NaN where unknown): a
        lowered limit lowers the clocks a run gets under load."""
        return [self._uint("nvmlDeviceGetEnforcedPowerLimit", device) / 1000,
                self._uint("nvmlDeviceGetPowerManagementDefaultLimit", device) / 1000]

    def close(self) -> None:
        self.lib.nvmlShutdown()


class ClockMonitor:
    """Samples the given GPUs every ``interval_s`` on a daemon thread until ``close``."""

    def __init__(self, nvml: Nvml, devices: list[ctypes.c_void_p],
                 interval_s: float = INTERVAL_S) -> None:
        self.nvml, self.devices, self.interval_s = nvml, devices, interval_s
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._take()  # one now: a failing call shows here, not in a thread
        self._thread = threading.Thread(target=self._loop, name="bench-gpu-clocks",
                                        daemon=True)
        self._thread.start()

    def _take(self) -> None:
        taken = [self.nvml.read(d, i) for i, d in enumerate(self.devices)]
        with self._lock:
            self._samples.extend(taken)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._take()
            except Exception:  # a sampler must never take the run down: stop sampling
                return

    def window(self, start: float, end: float) -> dict[str, Any] | None:
        """The summary of the samples taken within [start, end] (perf_counter); older ones
        are dropped (windows come in order). A window shorter than the interval gets one
        sample taken now, as the GPU ends it."""
        duration = end - start
        with self._lock:
            empty = not any(start <= s.t <= end for s in self._samples)
        if empty:
            with contextlib.suppress(Exception):  # never fail a run for a clock
                self._take()
            end = math.inf
        with self._lock:
            inside = [s for s in self._samples if start <= s.t <= end]
            self._samples = [s for s in self._samples if s.t > end]
        return summarise(inside, duration)

    def power_limits(self) -> list[list[float | None]]:
        """Each GPU's [enforced, default] power limit in W (None where unknown)."""
        try:
            limits = [self.nvml.power_limits(d) for d in self.devices]
        except Exception:
            return []
        return [[None if math.isnan(w) else w for w in pair] for pair in limits]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.interval_s + 1)
        with contextlib.suppress(Exception):
            self.nvml.close()


def start_monitor(uuids: list[str], library: str = "libnvidia-ml.so.1",
                  interval_s: float = INTERVAL_S) -> tuple[ClockMonitor | None, str]:
    """A monitor of these CUDA devices, or None and why not."""
    try:
        nvml = Nvml(library)
    except Exception as e:  # no driver library, or one without these calls: say so, run on
        return None, f"not sampled: {e}"
    try:
        return ClockMonitor(nvml, [nvml.handle(u) for u in uuids], interval_s), "nvml"
    except Exception as e:
        with contextlib.suppress(Exception):
            nvml.close()
        return None, f"not sampled: {e}"


def _median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def _energy_j(per_gpu: list[list[Sample]], duration_s: float) -> float:
    """The energy a window of ``duration_s`` took on every GPU sampled (``per_gpu``: each
    GPU's samples in time order): each GPU's energy counter's rate between its first and
    last sample in the window, times the window (NaN where a GPU has no counter, or fewer
    than two samples)."""
    total = 0.0
    for samples in per_gpu:
        read = [s for s in samples if not math.isnan(s.energy_mj)]
        if len(read) < 2 or read[-1].t <= read[0].t:
            return math.nan
        rate_w = (read[-1].energy_mj - read[0].energy_mj) / 1000 / (read[-1].t - read[0].t)
        total += rate_w * duration_s
    return total


def summarise(samples: list[Sample], duration_s: float = math.nan) -> dict[str, Any] | None:
    """One window's figures over the GPUs sampled: the lowest GPU's median and lowest SM
    clock, the highest maximum clock, temperature and median power, the largest share of a
    GPU's samples with a clock-lowering reason, every such reason seen, the least busy
    GPU's median utilization, and the energy all of them took (``duration_s``: the window's
    length). None without samples."""
    if not samples:
        return None
    per_gpu: dict[int, list[Sample]] = {}
    for s in samples:
        per_gpu.setdefault(s.gpu, []).append(s)

    def worst(values: list[float], pick) -> float:
        values = [v for v in values if not math.isnan(v)]
        return pick(values) if values else math.nan

    seen = 0
    for s in samples:
        seen |= s.reasons
    return {
        "samples": min(len(g) for g in per_gpu.values()),
        "sm_mhz_median": worst([_median([s.sm_mhz for s in g]) for g in per_gpu.values()], min),
        "sm_mhz_low": worst([s.sm_mhz for s in samples], min),
        "sm_mhz_max": worst([s.max_sm_mhz for s in samples], max),
        "temperature_c_max": worst([s.temperature_c for s in samples], max),
        "power_w_median": worst([_median([s.power_w for s in g]) for g in per_gpu.values()],
                                max),
        "slowdown_share": max(sum(bool(s.reasons & SLOWDOWN_MASK) for s in g) / len(g)
                              for g in per_gpu.values()),
        "slowdowns": [name for bit, name in SLOWDOWNS.items() if seen & bit],
        "util_pct_median": worst([_median([s.util_pct for s in g]) for g in per_gpu.values()],
                                 min),
        "energy_j": _energy_j(list(per_gpu.values()), duration_s),
    }


# Reducing summaries over ranks with one all-reduce (max): a minimum travels negated, an
# absent figure (NaN, or a rank without samples) as ABSENT, which loses to any value.
_REDUCED = (("samples", min), ("sm_mhz_median", min), ("sm_mhz_low", min),
            ("sm_mhz_max", max), ("temperature_c_max", max), ("power_w_median", max),
            ("slowdown_share", max), ("util_pct_median", min))
ABSENT = -1e300
VECTOR_LENGTH = len(_REDUCED) + len(SLOWDOWNS)


def to_vector(summary: dict[str, Any] | None) -> list[float]:
    """A summary as VECTOR_LENGTH floats for an all-reduce with max."""
    if summary is None:
        return [ABSENT] * VECTOR_LENGTH
    out = []
    for key, pick in _REDUCED:
        value = float(summary[key])
        out.append(ABSENT if math.isnan(value) else (-value if pick is min else value))
    out += [1.0 if name in summary["slowdowns"] else 0.0 for name in SLOWDOWNS.values()]
    return out


def from_vector(vector: list[float]) -> dict[str, Any] | None:
    """The reduced summary (None when no rank had samples)."""
    if vector[0] <= ABSENT:
        return None
    out: dict[str, Any] = {}
    for (key, pick), value in zip(_REDUCED, vector):
        out[key] = None if value <= ABSENT else (-value if pick is min else value)
    out["samples"] = int(out["samples"])
    flags = vector[len(_REDUCED):]
    out["slowdowns"] = [name for name, f in zip(SLOWDOWNS.values(), flags) if f > 0]
    return out


def energy_slots(summary: dict[str, Any] | None, rank: int, world_size: int) -> list[float]:
    """This rank's energy in its own of ``world_size`` slots, ABSENT in the others: after an
    all-reduce with max, every rank's (the run's energy is their sum)."""
    slots = [ABSENT] * world_size
    energy = summary.get("energy_j", math.nan) if summary else math.nan
    if not math.isnan(energy):
        slots[rank] = energy
    return slots


def total_energy(slots: list[float]) -> float | None:
    """The sum of every rank's energy; None when a rank could not measure its own."""
    return None if any(v <= ABSENT for v in slots) else sum(slots)


def epoch_suffix(entry: dict[str, Any] | None) -> str:
    """What an epoch's line adds: '  SM 1980/1980 MHz 61°C util 97% 950 J' (and the reasons,
    if any)."""
    if not entry or entry.get("sm_mhz_median") is None:
        return ""
    text = f"  SM {entry['sm_mhz_median']:.0f}/{entry['sm_mhz_max']:.0f} MHz"
    if entry.get("temperature_c_max") is not None:
        text += f" {entry['temperature_c_max']:.0f}°C"
    if entry.get("util_pct_median") is not None:
        text += f" util {entry['util_pct_median']:.0f}%"
    if entry.get("energy_j") is not None:
        text += f" {entry['energy_j']:.0f} J"
    if entry["slowdowns"]:
        text += f" ({', '.join(entry['slowdowns'])} {100 * entry['slowdown_share']:.0f} %)"
    return text
