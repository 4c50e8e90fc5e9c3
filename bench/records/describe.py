"""What a record says, in the words report, project and compare share: its workload, its
speed options, its median step, its epochs summarised, whether input bound it, its GPU clock."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import PurePath
from typing import Any, NamedTuple

from bench.config.run_config import GPU_LOADER_WORKERS
from bench.models.registry import DEFAULT_MODEL, short_name
from bench.records.environment import is_tuning
from bench.tools.terminal import count


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
    return gpu_clock_figures(timed or epochs) | cpu_load_figures(timed or epochs) | {
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


def cpu_load_figures(epochs: list[dict[str, Any]]) -> dict[str, Any]:
    """The cores rank 0's machine kept busy over the timed epochs (those that measured it),
    each epoch weighted by its length: the run's processes' (``run_cores``), other
    processes' (``others_cores``) and the hypervisor's (``steal_cores``); and
    ``waited_cores``, the run's threads' wait for a core, where every epoch measured it."""
    measured = [e for e in epochs if isinstance(e.get("cpu_load"), dict)
                and isinstance(e.get("train_time_s"), (int, float)) and e["train_time_s"] > 0]
    seconds = sum(e["train_time_s"] for e in measured)

    def figure(part: str) -> bool:
        return all(isinstance(e["cpu_load"].get(part), (int, float))
                   and not isinstance(e["cpu_load"][part], bool) for e in measured)

    if not measured or not all(figure(part) for part in ("run", "others", "steal")):
        return {}
    # waited: the run's threads' wait for a core (records from before it, and kernels
    # without schedstat, have none)
    parts = ("run", "others", "steal") + (("waited",) if figure("waited") else ())
    return {f"{part}_cores": round(sum(e["cpu_load"][part] * e["train_time_s"]
                                       for e in measured) / seconds, 3)
            for part in parts}


# Cores other processes (and a hypervisor) took from a run before its times count as
# measured on a shared machine: below it, a machine's own daemons; and the cores must have
# been full (the run's and the others' together), else the others took nothing from it;
# and, where the record measured it, the run's threads must have waited as long for a core
# (a run using fewer cores than it may, the others busy on the rest, lost nothing: a
# one-thread run beside a busy loop on 2 cores waited 0.00 cores, a 2-thread one 0.73).
SHARED_MIN_CORES = 0.25
SHARED_MIN_SHARE = 0.05  # ... nor below this share of the cores (a 64-core machine's daemons)
FULL_SHARE = 0.9


class SharedCores(NamedTuple):
    """What other work took from a run (means over its timed epochs)."""

    taken: float  # the cores other processes and the hypervisor kept busy
    cores: int  # the cores the run could use
    waited: float  # the run's threads' wait for a core, in cores (NaN: not measured)

    def said(self) -> str:
        """The finding in words, for the run's end, the report and the projection."""
        waited = ("" if math.isnan(self.waited) else
                  f", and its threads waited {self.waited:.1f} thread-seconds a second for "
                  "a core")
        return (f"other processes kept {self.taken:.1f} of the "
                f"{count(self.cores, 'core')} it could use busy while it trained, leaving "
                f"none idle{waited}")


def shared_cores(rec: dict[str, Any]) -> SharedCores | None:
    """What other processes and the hypervisor took from a run whose cores were full (its
    own processes' and theirs together) and whose threads waited for them (where the record
    measured it): its times are slower than the machine alone gives, by a share the figures
    alone cannot say. None where the run had its cores (or the record did not measure
    them). Worked out from the epochs, as the report works out every figure."""
    sampled, epochs = rec.get("cpu_load_sampled"), rec.get("per_epoch")
    cores = sampled.get("cores") if isinstance(sampled, dict) else None
    epochs = [e for e in epochs if isinstance(e, dict)] if isinstance(epochs, list) else []
    summary = cpu_load_figures(epochs[1:] or epochs)
    figures = [summary.get(k) for k in ("run_cores", "others_cores", "steal_cores")]
    if not isinstance(cores, int) or cores < 1 or not all(
            isinstance(f, (int, float)) and not isinstance(f, bool) for f in figures):
        return None
    run, others, steal = figures
    taken, least = others + steal, max(SHARED_MIN_CORES, SHARED_MIN_SHARE * cores)
    waited = summary.get("waited_cores", math.nan)  # unmeasured: the cores alone judge
    if taken >= least and run + taken >= FULL_SHARE * cores and not waited < least:
        return SharedCores(taken, cores, waited)
    return None


ABNORMAL = ("hw slowdown", "sw thermal", "hw thermal", "power brake")


def clock_share(entry: dict[str, Any] | None) -> float:
    """An epoch's median SM clock as a share of the maximum (NaN when not sampled)."""
    if not entry or not entry.get("sm_mhz_median") or not entry.get("sm_mhz_max"):
        return math.nan
    return entry["sm_mhz_median"] / entry["sm_mhz_max"]


# Loader workers per replica that a row's options do not name: bench run's defaults where the
# machine has the cores (bench.launch.preflight.default_workers). Any other count is another row.
USUAL_WORKERS = {"cuda": GPU_LOADER_WORKERS, "cpu": 0}


def median_of(values: list[float]) -> float:
    """Median of the values that exist (NaN when none do)."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def median_step_s(rec: dict[str, Any]) -> float:
    """The run's step time: the median of its epochs' median steps, the warm-up epoch left
    out when there are others (NaN when no epoch measured one)."""
    epochs = rec.get("per_epoch") or []
    return median_of([as_number(e.get("step_time_p50_s")) for e in epochs[1:] or epochs])


def gpu_model(rec: dict[str, Any]) -> str | None:
    """The GPU model a CUDA run was measured on ('H200', 'H100 80GB HBM3'; 'GPU' for a
    record that does not say), from its record's env; None on CPU."""
    if rec.get("device") != "cuda":
        return None
    names = dict.fromkeys((rec.get("env") or {}).get("gpus") or [])
    return " + ".join(name.removeprefix("NVIDIA ") for name in names) or "GPU"


def cpu_model(rec: dict[str, Any]) -> str | None:
    """The CPU a CPU run was measured on, as its record's env names it, trade marks and
    boilerplate left out, with the machine's core count ('AMD EPYC 7B13 (2 cores)'); None on
    CUDA. CPU rows of two machines are no more repeats of each other than two GPU models'
    (this machine kind trains at 47 img/s on one CPU model and 94 on another). A name with
    no model number in it ('AMD EPYC', as a virtual machine may show it) gets the CPU's
    family and model where the record has them ('AMD EPYC family 25 model 17 (2 cores)').
    A run whose cgroups allowed it fewer cores' time than the machine has (a container's
    --cpus) ran on another machine than one without: '(2 cores, 1 allowed)'."""
    if rec.get("device") == "cuda":
        return None
    env = rec.get("env") or {}
    name = re.sub(r"\((R|TM|tm|r)\)|\b\d+-Core\b|\bProcessor\b|\bCPU\b|@.*$", " ",
                  str(env.get("cpu") or "CPU"))
    name = " ".join(name.split()) or "CPU"
    found = re.search(r"family (\d+) model (\d+)", str(env.get("cpu_id") or ""))
    if found and not re.search(r"\d", name):  # a name with no model number: the generation
        name += f" family {found[1]} model {found[2]}"
    cores, quota = env.get("cpu_count"), env.get("cpu_quota_cores")
    if not isinstance(cores, int):
        return name
    allowed = (f", {quota:g} allowed" if isinstance(quota, (int, float)) and not isinstance(
        quota, bool) and quota < cores else "")
    return f"{name} ({cores} cores{allowed})"


def tuning(rec: dict[str, Any]) -> tuple[tuple[str, str], ...] | None:
    """The speed-changing environment variables rank 0 ran under (env.tuning), as sorted
    (name, value) pairs, less OMP_NUM_THREADS, which bench's launcher sets from the cores
    (threads_per_process says it): what two runs of one command in two shells can differ by.
    None where the record does not say (one from before 2026-11-30), which is not 'none'."""
    said = (rec.get("env") or {}).get("tuning")
    if not isinstance(said, dict):
        return None
    # a name a shell could read as more than a name is none (the report's command lines
    # put these before the command, where ';' would start another)
    return tuple((k, v) for k, v in sorted(said.items())
                 if k != "OMP_NUM_THREADS" and re.fullmatch(r"[A-Za-z_]\w*", k, re.ASCII)
                 and is_tuning(k) and isinstance(v, str))


def oversubscribed(rec: dict[str, Any]) -> bool:
    """Whether the run's ranks outnumbered the cores (`make parity`'s 8 ranks on 2 cores):
    its times measure the crowding, so its workload's speed is not compared (the report's
    accuracy blocks) nor projected."""
    return isinstance(rec.get("oversubscribed"), dict)


def machine(rec: dict[str, Any]) -> str:
    """What a run's speed is a figure of: its GPU model on CUDA, its CPU model elsewhere."""
    return gpu_model(rec) or cpu_model(rec) or "?"


def model_width(rec: dict[str, Any]) -> float:
    """The ResNet-18 channel multiplier a run trained (1.0 where its record does not say)."""
    return (rec.get("model") or rec.get("config") or {}).get("width") or 1.0


def workload(rec: dict[str, Any], on: bool = True, link: bool = True) -> str:
    """What was trained, (``on``) on which machine (GPU model, or CPU model and cores) and
    (``link``) over which network: only runs of the same workload are compared with each
    other (an H100's epoch is neither a repeat of an H200's nor its baseline)."""
    width = model_width(rec)
    model = short_name((rec.get("model") or {}).get("name") or DEFAULT_MODEL)
    model = model if width == 1.0 else f"{model} x{width:g}"
    config = rec.get("config") or {}
    size = rec.get("train_size") or config.get("train_limit") or 50_000
    data = rec.get("dataset") or config.get("data") or "?"
    if data == "synthetic" and config.get("synthetic_difficulty") is not None:
        # d=0 too: the easy set beside the default d=1 ('synthetic 1536 img' read as the
        # default's); a record without the field leaves it unsaid
        data += f" d={config['synthetic_difficulty']:g}"
    if data.startswith("synthetic") and config.get("synthetic_classes") not in (None, 100):
        data += f" {config['synthetic_classes']} classes"
    if data == "imagefolder" and isinstance(rec.get("data_dir"), str):
        # whose images: two folders of as many images are two workloads, not repeats
        data += f" {PurePath(rec['data_dir']).name}"
    pixels = (rec.get("model") or {}).get("image_size") or 32
    pixels = "" if pixels == 32 else f" {pixels}px"
    where = machine(rec) if on else None
    crossed = network_crossed(rec) if link else None
    fits = config.get("batch_fits_in")  # bench sweep --batch-size max: each row its own
    batch = (f"batch: largest that fits {fits}" if fits
             else f"batch {rec.get('global_batch') or '?'}")  # null: not recorded
    return (f"{data} {size} img{pixels}, {batch}, {model}"
            + (f" on {where}" if where else "") + (f", over {crossed}" if crossed else ""))


def network_crossed(rec: dict[str, Any]) -> str | None:
    """The network a multi-node run crossed, as its ``--tag`` names it (the name ``bench
    probe --tag`` gives the probe of that network): runs over a 100 Mbit/s and a 10 Gbit/s
    link are different workloads, never repeats of one row. None on one node, or where the
    tag is a sweep's own (``sweep:KEY:rN``) or absent."""
    tag = rec.get("tag")
    if (rec.get("nodes") or 1) > 1 and isinstance(tag, str) and tag and not tag.startswith(
            "sweep:"):
        return tag
    return None


# DDP's options that change how it communicates (bucket sizes set how much overlaps with the
# backward pass): (record key, DistributedDataParallel's default, how a row names it).
DDP_SPEED_OPTIONS = (("bucket_cap_mb", 25.0, "bucket {:g} MB"),
                     ("gradient_as_bucket_view", False, "bucket view"),
                     ("static_graph", False, "static graph"),
                     ("find_unused_parameters", False, "find unused"),
                     ("broadcast_buffers", True, "no buffer broadcast"))


def speed_options(rec: dict[str, Any]) -> str:
    """The run's options that change how it computes or communicates (speed options, and
    the strategies' own: compression, FSDP's resharding), and where its recipe leaves the
    default learning-rate rule (0.1 x batch / 128, one warm-up epoch): a row of its own,
    never a repeat of the default's. "—" for none."""
    chosen = []
    lr, base = rec.get("lr"), rec.get("base_lr")
    batch, reference = rec.get("global_batch"), rec.get("lr_reference_batch")
    if all(isinstance(v, (int, float)) and v > 0 for v in (lr, base, batch, reference)) and abs(
            lr / (base * batch / reference) - 1) > 1e-6:
        chosen.append(f"lr {lr:g}")
    warmup = rec.get("warmup_epochs")
    if isinstance(warmup, (int, float)) and warmup != 1:
        chosen.append("no warm-up" if warmup == 0 else f"warm-up {warmup:g}")
    strategy_options = rec.get("ddp_options") or {}
    for key, default, text in DDP_SPEED_OPTIONS:
        value = strategy_options.get(key)
        if value is not None and value != default:  # None: not recorded, the default's
            chosen.append(text.format(value))
    hook = strategy_options.get("comm_hook") or "none"
    if hook != "none":
        rank = strategy_options.get("powersgd_rank") or 1
        chosen.append(f"{hook} hook" + (f" r={rank}" if hook == "powersgd" else ""))
    if (rec.get("config") or {}).get("hvd_compression") not in (None, "none") and rec.get(
            "strategy") == "horovod":
        chosen.append(f"{rec['config']['hvd_compression']} compression")
    if strategy_options.get("reshard_after_forward") is False:
        chosen.append("no reshard")
    if strategy_options.get("cpu_syncbn") and rec.get("norm") == "syncbn":
        chosen.append("cpu syncbn")  # other math and more collectives than per replica
    ghost = (rec.get("config") or {}).get("ghost_bn")
    if ghost:
        chosen.append(f"ghost BN {ghost}")  # BatchNorm over groups of G: other math
    if rec.get("loader") == "gpu":
        chosen.append("gpu loader")
    elif rec.get("workers_per_replica") not in (None, USUAL_WORKERS.get(rec.get("device"))):
        chosen.append(count(rec["workers_per_replica"], "worker"))  # not '1 workers'
    if rec.get("channels_last"):
        chosen.append("channels_last")
    if rec.get("compile"):
        mode = rec.get("compile_mode") or "default"
        graphs = rec.get("cudagraphs")
        # a mode whose CUDA graphs were skipped ran as plain compiled code: not the same row
        chosen.append("compile" + ("" if mode == "default" else f" {mode}")
                      + (" (no CUDA graphs)" if graphs not in (None, "used") else ""))
    if rec.get("optimizer_impl") not in (None, "default"):
        chosen.append(f"{rec['optimizer_impl']} SGD")
    return ", ".join(chosen) or "—"


_SHORT_OPTIONS = {"gpu loader": "gpu-data", "channels_last": "NHWC", " SGD": "", ", ": ",",
                  "compile reduce-overhead": "compile:ro",
                  " max-autotune-no-cudagraphs": ":max-nocg", "compile max-autotune": "compile:max",
                  " (no CUDA graphs)": "-nograph"}


def short_options(text: str) -> str:
    """A row's speed options in few characters (terminal rows, plot labels)."""
    for long, short in _SHORT_OPTIONS.items():
        text = text.replace(long, short)
    return text


INPUT_BOUND_SHARE = 0.85  # training at this share of what the input pipeline feeds alone


def input_bound(images_per_s: float | None, loader_alone: float | None) -> bool:
    """Whether a run trained at INPUT_BOUND_SHARE or more of the img/s its input pipeline
    feeds alone: then the pipeline, not the strategy, set its pace. False where either
    figure is missing (None, NaN)."""
    return (isinstance(images_per_s, (int, float)) and isinstance(loader_alone, (int, float))
            and loader_alone > 0 and images_per_s >= INPUT_BOUND_SHARE * loader_alone)


def as_number(value: float | None) -> float:
    return math.nan if value is None else value
