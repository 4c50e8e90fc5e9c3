"""What a record says of the machine: CPU, driver, library versions (read without importing
the libraries where that is slow)."""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.tools.cores import cpu_quota, usable_cores


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_id() -> str | None:
    """The CPU's vendor, family, model and stepping ('AuthenticAMD family 25 model 17
    stepping 1'), from /proc/cpuinfo; None where it does not say. A virtual machine may hide
    the model number from the name ('AMD EPYC'), and two hosts of one name then train at
    55 and 94 img/s: this tells their generations apart."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the first processor's block is enough
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return None
    if not all(fields.get(k) for k in ("cpu family", "model")):
        return None
    return " ".join(filter(None, [
        fields.get("vendor_id"), f"family {fields['cpu family']}", f"model {fields['model']}",
        f"stepping {fields['stepping']}" if fields.get("stepping") else None]))


def torchvision_version() -> str | None:
    """torchvision's ``__version__`` (with its local label, e.g. ``+cu132``), read from its
    version.py: importing torchvision costs a second (it imports torch's compiler), which
    every run would pay for one string. None where it is not installed."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("torchvision")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        text = ""
    found = re.search(r"^__version__ = ['\"]([^'\"]+)['\"]", text, re.M)
    if found:
        return found.group(1)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchvision")
    except PackageNotFoundError:
        return None


# Environment variables that change how fast the same code trains, by prefix: the OpenMP
# runtimes' (OMP_WAIT_POLICY=PASSIVE puts a process's threads to sleep between operations),
# MKL's, the collectives' (NCCL_ALGO, NCCL_P2P_DISABLE, GLOO_SOCKET_IFNAME), CUDA's
# (CUDA_LAUNCH_BLOCKING=1 serialises every kernel) and PyTorch's own (the allocator's,
# Inductor's). A shell that keeps one set slows every run it starts, and no figure shows why.
# A cache's folder (TORCHINDUCTOR_CACHE_DIR, which torch itself sets on first use) says
# where, not how fast: left out.
TUNING_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MKL_", "NCCL_", "TORCH_NCCL_", "GLOO_", "CUDA_",
                   "CUBLAS_", "CUDNN_", "PYTORCH_", "TORCH_", "TORCHINDUCTOR_")
_TUNING_VALUE_CHARS = 200  # a path list is kept to this much


def is_tuning(name: str) -> bool:
    """Whether the variable ``name`` changes how fast a run trains (TUNING_PREFIXES)."""
    return name.startswith(TUNING_PREFIXES) and not name.endswith("_CACHE_DIR")


def tuning_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The TUNING_PREFIXES variables set in ``environ`` (this process's), sorted by name."""
    environ = os.environ if environ is None else environ
    return {k: v[:_TUNING_VALUE_CHARS] for k, v in sorted(environ.items()) if is_tuning(k)}


def cpu_capability() -> str | None:
    """The widest vector instructions torch's CPU kernels use here ('AVX512', 'AVX2',
    'DEFAULT'; None where torch does not say)."""
    import torch

    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # a torch before the call
        return None


@functools.cache  # the machine's: the plan and the record's environment both ask
def cpu_bf16_instructions() -> bool | None:
    """Whether this CPU has bf16 arithmetic: AVX512-BF16 or AMX on x86 (torch's own query of
    cpuinfo), Arm's BF16 elsewhere (oneDNN's); None where torch does not say. Without it
    autocast's bf16 is emulated: on an AMD EPYC with AVX2 alone, ResNet-18 trained 1.5 img/s
    in bf16 against 36 in fp32, where a CPU with AVX512-BF16 trains bf16 1.7x faster than
    fp32 (the README's CPU table). oneDNN's bf16 kernels for AVX-512 without it emulate
    too, slower than fp32."""
    import platform

    import torch

    try:
        if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
            return bool(torch.cpu._is_avx512_bf16_supported()
                        or torch.cpu._is_amx_tile_supported())
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # a torch without the queries
        return None


def emulated_bf16_note(capability: str | None = None, here: bool = True) -> str:
    """What a bf16 run on a CPU without bf16 arithmetic (cpu_bf16_instructions) measures, in
    one note: the run and `bench list` say it of this machine, the report of a row's
    (``here`` False, ``capability`` its record's)."""
    capability = capability or (cpu_capability() if here else None)
    cpu, there = ("this CPU", "here") if here else ("its CPU", "there")
    return (f"{cpu} has no bf16 arithmetic (AVX512-BF16, AMX or Arm's BF16; torch's CPU "
            f"capability {there}: {capability or 'not said'}): autocast emulates bf16, many "
            "times slower than fp32 (ResNet-18 24x on an AVX2 AMD EPYC), so a bf16 run times "
            "the emulation, not what mixed precision gains on a CPU that has it")


def capture_env(device_type: str) -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "torchvision": torchvision_version(),  # only the CIFAR download needs torchvision
        "python": sys.version.split()[0],
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_id": _cpu_id(),
        "cpu_count": os.cpu_count(),
        # the cores' worth of time this process's cgroups allow (a container's --cpus), or None
        "cpu_quota_cores": cpu_quota(),
        # the cores it may use: its affinity (taskset, a Slurm task's cpuset), the quota and a
        # Slurm job's CPUs on the node; what its ranks' threads were sized to
        "usable_cores": usable_cores(),
        # torch's CPU kernels' instructions, and whether bf16 is the CPU's (else emulated)
        "cpu_capability": cpu_capability(),
        "cpu_bf16": cpu_bf16_instructions(),
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
        "gpus": [],
        "driver": None,
        # what the shell and bench's launcher set for this rank (its OMP_NUM_THREADS)
        "tuning": tuning_env(),
    }
    if device_type == "cuda":
        env["cudnn"] = torch.backends.cudnn.version()
        try:
            env["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # NCCL missing from this build
            env["nccl"] = None
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["driver"] = _nvidia_driver()
    return env
