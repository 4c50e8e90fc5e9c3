"""Run records: one JSON file per run, written atomically (temp file + rename)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import platform
import secrets
import socket
import stat
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.errors import CannotWrite
from bench.gpu_clocks import clock_share

RECORD_VERSION = 1

# Fields every record carries (a finished run fills them all; see docs/records.md).
RECORD_FIELDS = (
    "record_version", "run_id", "started_at", "finished_at", "status", "error", "strategy",
    "launcher", "device", "gpus_requested", "world_size", "processes", "nodes", "precision",
    "norm", "bn_batch_size", "global_batch", "per_rank_batch", "per_process_batch", "lr",
    "base_lr", "lr_schedule", "warmup_epochs", "optimizer", "epochs", "dataset", "train_size",
    "test_size", "seed", "workers_per_replica", "workers_per_process", "threads_per_process",
    "steps_per_epoch", "model", "command", "config", "env", "notes", "per_epoch", "summary",
    "replicas_identical", "param_fingerprint", "grad_accum", "loader", "channels_last",
    "compile", "compile_mode", "compile_time_s", "cudagraphs", "optimizer_impl",
    "cudnn_benchmark",
    "initial_param_fingerprint", "initial_reference_fingerprint", "initial_replicas_identical",
    "allow_tf32", "owner",
    "target_top1", "reached_target", "time_to_target_s", "train_time_to_target_s",
    "epochs_to_target", "backend", "gpu_shared", "comm_probe_steps", "compute_step_s",
    "exposed_comm_fraction", "comm_probe_note", "gradient_timeline",
    "loader_probe_steps", "loader_alone_images_per_s",
    "gradient_buckets", "compressed_gradient_elements",
    "train_flops_per_image", "peak_tflops_per_gpu",
    "profile_steps", "profile_trace",
)
EPOCH_FIELDS = (
    "epoch", "warmup", "train_time_s", "eval_time_s", "images_per_s", "train_images",
    "train_loss", "test_loss", "top1", "top5", "test_images", "peak_mem_bytes", "lr_last",
    "data_order_sha1", "step_time_p50_s", "step_time_p90_s", "input_wait_s", "achieved_tflops",
    "mfu",
)
ENV_FIELDS = (
    "torch", "torchvision", "python", "hostname", "platform", "cpu", "cpu_count", "cuda",
    "cudnn", "nccl", "gpus", "driver",
)


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id(strategy: str, world_size: int, device_type: str) -> str:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{strategy}-{world_size}{device_type}-{secrets.token_hex(3)}"


def runs_dir(output: str | Path) -> Path:
    return Path(output) / "runs"


def write_atomic(path: Path, record: dict[str, Any]) -> None:
    """Write JSON so that a reader sees the old file or the new one, never half of one."""
    write_text_atomic(path, json.dumps(record, indent=2, sort_keys=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write text so that a reader sees the old file or the new one, never half of one (a
    full disk leaves the old file, not an empty one)."""
    with atomic_file(path) as tmp, open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """The one way bench writes a file: a temporary file beside PATH, yielded to be filled
    (``fig.savefig(tmp)``, ``write_text``), then renamed over PATH and the folder fsynced. A
    reader, a second writer or a ``kill -9`` meanwhile sees the old file or the new one,
    never half of one; a failure leaves the old file and no temporary one, and is one
    ``CannotWrite`` line naming the file, why (read-only, full, quota) and the fix."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Hidden, and not ending in the file's own suffix: a reader globbing `*.json` (which
        # in pathlib matches hidden names too) must never take a half-written record.
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp",
                                    dir=path.parent)
        tmp = Path(name)
        # mkstemp makes the file 0600; a record is an ordinary file, readable as the umask
        # allows (a group sharing --output across nodes must read it).
        os.fchmod(fd, _FILE_MODE & ~_umask())
        os.close(fd)
        yield tmp
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise CannotWrite.of(exc, path) from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    _fsync_folder(path.parent)  # the rename itself survives a crash right after


def remove_dead_temporaries(folder: Path) -> None:
    """Remove the temporary files of writers that died mid-write (``kill -9``) under
    ``folder``: atomic_file names each with its writer's pid (a live one is left alone: it
    may be a second report of the same folder, still drawing)."""
    for tmp in folder.rglob(".*.tmp") if folder.is_dir() else []:
        pid = tmp.name.split(".")[-3]  # .NAME.PID.RANDOM.tmp
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        pid = int(pid)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                tmp.unlink()
        except PermissionError:  # another user's live process
            continue


_FILE_MODE = 0o666


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a folder
    finally:
        os.close(fd)


# Room kept aside while a run lasts, so that a disk that fills meanwhile can still take the
# record's closing (a record is kilobytes).
RESERVE_BYTES = 2**20


def reserve_space(runs: Path, run_id: str) -> Path | None:
    """A hidden file of RESERVE_BYTES beside the run's record, made as the run starts and
    removed (``release_space``) just before the record is closed: a disk that filled during
    the run (the record then could not be written, and stayed ``running``) has that room
    again. None where even the reserve does not fit (the run goes on without one)."""
    path = runs / f".{run_id}.reserve"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        finally:
            os.close(fd)
    except (OSError, AttributeError):  # no room, or no fallocate on this system
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return None
    return path


def release_space(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


MAX_RECORD_BYTES = 64 * 2**20  # a record is kilobytes; anything far larger is not one


def read_record(path: Path) -> dict[str, Any]:
    """The JSON in a regular file of sane size (a FIFO would block, a huge file is not a
    record); ValueError for anything else, including absurdly nested JSON."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError("not a regular file")
    if info.st_size > MAX_RECORD_BYTES:
        raise ValueError(f"{info.st_size} bytes, more than a record ever holds")
    with open(path) as fh:
        try:
            return json.load(fh)
        except RecursionError:
            raise ValueError("nested too deeply") from None


NUMBER = (int, float)
_EPOCHNUMBERS = ("train_time_s", "images_per_s", "top1", "peak_mem_bytes")
# Optional fields the readers use, by where they are, with the type each must have when it
# is there (None is "not recorded"). Checked once, on loading, so that no reader meets a
# string where it does arithmetic (each used to be a traceback).
_OPTIONAL = {
    (): {"started_at": str, "device": str, "precision": str, "gpus_requested": int,
         "processes": int, "grad_accum": int, "global_batch": int, "train_size": int,
         "seed": int, "epochs": int, "nodes": int, "config": dict, "model": dict, "env": dict,
         "target_top1": NUMBER, "time_to_target_s": NUMBER, "reached_target": bool,
         "dataset": str, "norm": str, "loader": str, "workers_per_replica": int,
         "channels_last": bool, "compile": bool, "compile_mode": str, "cudagraphs": str,
         "optimizer_impl": str, "gpu_shared": bool, "ddp_options": dict, "owner": dict,
         "compute_step_s": NUMBER, "exposed_comm_fraction": NUMBER,
         "loader_alone_images_per_s": NUMBER, "gradient_timeline": dict,
         "gradient_buckets": list, "train_flops_per_image": NUMBER,
         "peak_tflops_per_gpu": NUMBER, "notes": list, "tag": str, "error": str,
         "initial_param_fingerprint": str, "initial_reference_fingerprint": str,
         "initial_replicas_identical": bool, "replicas_identical": bool,
         "per_rank_batch": int, "lr": NUMBER, "backend": str},
    ("model",): {"name": str, "width": NUMBER, "parameters": int, "num_classes": int,
                 "image_size": int},
    ("config",): {"width": NUMBER, "epochs": int, "synthetic_difficulty": NUMBER},
    ("env",): {"gpus": list, "cpu": str, "torch": str, "cpu_count": int},
}
_EPOCH_OPTIONAL = {"eval_time_s": NUMBER, "top5": NUMBER, "train_loss": NUMBER,
                   "test_loss": NUMBER, "input_wait_s": NUMBER, "mfu": NUMBER,
                   "achieved_tflops": NUMBER, "gpu_clocks": dict, "warmup": bool,
                   "step_time_p50_s": NUMBER, "step_time_p90_s": NUMBER,
                   "data_order_sha1": str, "test_images": int, "train_images": int}


def _kind_name(kind) -> str:
    return "a number" if kind is NUMBER else ("a list" if kind is list else kind.__name__)


def wrong_type(value: Any, kind) -> bool:
    """Whether VALUE is not of KIND (NUMBER: a finite int or float; a bool is no number)."""
    if kind is bool:
        return not isinstance(value, bool)
    return not isinstance(value, kind) or isinstance(value, bool) or (
        isinstance(value, float) and not math.isfinite(value))


def record_problem(rec: Any) -> str | None:
    """What makes this JSON unusable as a run record for the report, or None. The types of
    every field the report reads are checked here, once, so it never tracebacks on one."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    for key, kind in (("run_id", str), ("status", str), ("strategy", str),
                      ("world_size", int), ("per_epoch", list)):
        if not isinstance(rec.get(key), kind) or isinstance(rec.get(key), bool):
            return f"{key} missing or not {_kind_name(kind)}"
    if rec["world_size"] < 1:
        return f"world_size is {rec['world_size']}, not a count of processes"
    for where, fields in _OPTIONAL.items():
        holder = rec.get(where[0]) if where else rec
        if not isinstance(holder, dict):
            continue  # absent (the type of the holder itself is checked at the top level)
        for key, kind in fields.items():
            value = holder.get(key)
            if value is not None and wrong_type(value, kind):
                name = ".".join((*where, key))
                return f"{name} is {type(value).__name__}, not {_kind_name(kind)}"
    if rec.get("reached_target") and rec.get("time_to_target_s") is None:
        return "reached_target without time_to_target_s"
    for i, epoch in enumerate(rec["per_epoch"]):
        if not isinstance(epoch, dict):
            return f"per_epoch[{i}] is not an object"
        for key in _EPOCHNUMBERS:
            value = epoch.get(key)
            if value is None or wrong_type(value, NUMBER):
                return f"per_epoch[{i}].{key} missing or not a number"
        for key, kind in _EPOCH_OPTIONAL.items():
            value = epoch.get(key)
            if value is not None and wrong_type(value, kind):
                return f"per_epoch[{i}].{key} is {type(value).__name__}, not {_kind_name(kind)}"
        if not 0 <= epoch["top1"] <= 1:
            return f"per_epoch[{i}].top1 is {epoch['top1']!r}, not a fraction"
        if epoch["train_time_s"] <= 0 or epoch["images_per_s"] < 0:
            return f"per_epoch[{i}] has a time or speed of {epoch['train_time_s']!r} s"
    return None


def load_records(results: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """All records under ``results/runs`` (or ``results`` itself), oldest first, and one
    warning per file that is not a readable record, and per record whose run id another
    file already holds (a copy: counting it would count one run twice)."""
    root = Path(results)
    folder = runs_dir(root) if runs_dir(root).is_dir() else root
    records, warnings = [], []
    seen: dict[str, Path] = {}
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith("."):  # a writer's temporary file, a reserve: not a record
            continue
        try:
            record = read_record(path)
        except (OSError, ValueError) as exc:
            warnings.append(f"skipped {path}: not a readable JSON record ({exc})")
            continue
        problem = record_problem(record)
        if problem:
            warnings.append(f"skipped {path}: not a parallel-bench run record ({problem})")
            continue
        first = seen.setdefault(record["run_id"], path)
        if first != path:
            warnings.append(f"skipped {path}: run {record['run_id']} is already {first.name}'s "
                            "(one run, counted once)")
            continue
        records.append(record)
    records.sort(key=lambda r: r.get("started_at", ""))
    return records, warnings


def load_record_file(path: str | Path) -> dict[str, Any]:
    """One record file given by name (``bench compare A B``, ``bench project FILE``): a
    ValueError saying why it is not a usable run record."""
    record = read_record(Path(path))
    problem = record_problem(record)
    if problem:
        raise ValueError(f"not a parallel-bench run record: {problem}")
    return record


def summarise_epochs(epochs: list[dict[str, Any]]) -> dict[str, Any]:
    """Run-level figures. Epoch time is the median excluding the first (warm-up) epoch; a
    one-epoch run has none (None), rather than passing its warm-up off as the median. Memory
    has two peaks: over every epoch, and over the timed ones (the warm-up's cuDNN autotuning
    can allocate GiBs that training never needs again: 7.7 vs 2.5 GiB for ResNet-18 on an
    H100); a one-epoch run's steady peak is its only epoch's."""
    if not epochs:
        return {}
    timed = epochs[1:]
    top1 = [e["top1"] for e in epochs]
    return gpu_clock_figures(timed or epochs) | {
        "median_epoch_time_s": statistics.median(e["train_time_s"] for e in timed) if timed
        else None,
        "median_images_per_s": statistics.median(e["images_per_s"] for e in timed) if timed
        else None,
        "timed_epochs": len(timed),
        # the share of a timed epoch the loop waited for batches (records since it was kept)
        "input_wait_share": statistics.median(
            e["input_wait_s"] / e["train_time_s"] for e in timed) if timed and all(
            e.get("input_wait_s") is not None for e in timed) else None,
        "final_top1": top1[-1],
        "best_top1": max(top1),
        "final_top5": epochs[-1].get("top5"),
        "total_train_time_s": sum(e["train_time_s"] for e in epochs),
        "peak_mem_bytes": max(e["peak_mem_bytes"] for e in epochs),
        "steady_peak_mem_bytes": max(e["peak_mem_bytes"] for e in timed or epochs),
    }


def gpu_clock_figures(epochs: list[dict[str, Any]]) -> dict[str, Any]:
    """The timed epochs' GPU clocks (CUDA records that sampled them): the median epoch's
    SM clock as a share of the maximum, every clock-lowering reason seen, the median
    epoch's GPU utilization (%), and its energy (J, all GPUs) and training images per
    joule."""
    sampled = [e["gpu_clocks"] for e in epochs if e.get("gpu_clocks")]
    shares = [s for s in map(clock_share, sampled) if not math.isnan(s)]
    busy = [c["util_pct_median"] for c in sampled if c.get("util_pct_median") is not None]
    measured = [e for e in epochs if (e.get("gpu_clocks") or {}).get("energy_j")]
    if not sampled:
        return {}
    return {"gpu_clock_share": statistics.median(shares) if shares else None,
            "gpu_slowdowns": sorted({r for c in sampled for r in c.get("slowdowns", [])}),
            "gpu_util_median": statistics.median(busy) if busy else None,
            "energy_j_per_epoch": statistics.median(e["gpu_clocks"]["energy_j"]
                                                    for e in measured) if measured else None,
            "images_per_joule": statistics.median(
                e["images_per_s"] * e["train_time_s"] / e["gpu_clocks"]["energy_j"]
                for e in measured) if measured else None}


# --------------------------------------------------------------------------- environment


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
        "cpu_count": os.cpu_count(),
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
        "gpus": [],
        "driver": None,
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
