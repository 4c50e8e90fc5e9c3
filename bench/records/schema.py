"""A run record's fields and their types: what every record holds, what some may, and the
one-line problem that makes a file not a record."""

from __future__ import annotations

import math
from typing import Any

from bench.config.run_config import MAX_BUCKET_CAP_MB

RECORD_VERSION = 1

# How a run's training order is drawn (strategies.base.order_seed; each record names it as
# ``data_order_rule``). A record without one drew ``seed + epoch``: torch's DistributedSampler
# as it comes, under which seed s's epoch e repeated seed s+1's epoch e-1.
DATA_ORDER_RULE = "sha256(seed, epoch)"


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
    "profile_steps", "profile_trace", "data_order_rule", "memory_parts", "cpu_load_sampled",
    "restarts", "restart_lost_s", "restart_cause",
)


EPOCH_FIELDS = (
    "epoch", "warmup", "train_time_s", "eval_time_s", "images_per_s", "train_images",
    "train_loss", "test_loss", "top1", "top5", "test_images", "peak_mem_bytes", "lr_last",
    "data_order_sha1", "step_time_p50_s", "step_time_p90_s", "input_wait_s", "achieved_tflops",
    "mfu",
)


ENV_FIELDS = (
    "torch", "torchvision", "python", "hostname", "platform", "cpu", "cpu_id", "cpu_count", "cuda",
    "cudnn", "nccl", "gpus", "driver", "cpu_quota_cores", "usable_cores",
    "tuning", "cpu_capability", "cpu_bf16",
)


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
         "per_rank_batch": int, "lr": NUMBER, "backend": str, "data_order_rule": str,
         "memory_parts": dict, "base_lr": NUMBER, "lr_reference_batch": NUMBER,
         "warmup_epochs": NUMBER, "profile_trace": str, "cpu_load_sampled": dict,
         "restarts": int, "restart_lost_s": NUMBER,
         "restart_cause": str, "threads_per_process": int, "workers_per_process": int},
    # what a row's options name (records.describe.speed_options) and projections read
    ("ddp_options",): {"bucket_cap_mb": NUMBER, "gradient_as_bucket_view": bool,
                       "static_graph": bool, "find_unused_parameters": bool,
                       "broadcast_buffers": bool, "comm_hook": str, "powersgd_rank": int,
                       "cpu_syncbn": bool, "reshard_after_forward": bool},
    ("model",): {"name": str, "width": NUMBER, "parameters": int, "num_classes": int,
                 "image_size": int},
    ("config",): {"width": NUMBER, "epochs": int, "synthetic_difficulty": NUMBER,
                  "hvd_compression": str, "ghost_bn": int, "synthetic_classes": int},
    ("env",): {"gpus": list, "cpu": str, "torch": str, "cpu_count": int,
               "cpu_quota_cores": NUMBER, "usable_cores": int, "tuning": dict,
               "cpu_capability": str, "cpu_bf16": bool},
    ("cpu_load_sampled",): {"cores": int},
    ("memory_parts",): {"parameters": int, "gradients": int, "optimizer_state": int,
                        "peak": int, "activations_and_workspace": int},
}


_EPOCH_OPTIONAL = {"eval_time_s": NUMBER, "top5": NUMBER, "train_loss": NUMBER,
                   "test_loss": NUMBER, "input_wait_s": NUMBER, "mfu": NUMBER,
                   "achieved_tflops": NUMBER, "gpu_clocks": dict, "warmup": bool,
                   "step_time_p50_s": NUMBER, "step_time_p90_s": NUMBER,
                   "data_order_sha1": str, "test_images": int, "train_images": int,
                   "cpu_load": dict}


def _kind_name(kind) -> str:
    return "a number" if kind is NUMBER else ("a list" if kind is list else kind.__name__)


# Every whole number a record holds is a count, a size, a seed or bytes: none is negative,
# and none reaches 2^53 (past it a JSON number is no longer exact in a float, and past 2^63
# numpy holds it as a Python object, which the plots' log scale cannot take: a record
# saying world_size 10^30 was a traceback).
_MAX_COUNT = 2**53


def wrong_type(value: Any, kind) -> bool:
    """Whether VALUE is not of KIND (NUMBER: a finite int or float; a bool is no number)."""
    if kind is bool:
        return not isinstance(value, bool)
    return not isinstance(value, kind) or isinstance(value, bool) or (
        isinstance(value, float) and not math.isfinite(value))


# Times and rates: a step takes time (the projection's validation divided by a step of
# 0 s), and a wait or a time lost is never negative
_POSITIVE = {"compute_step_s", "loader_alone_images_per_s", "step_time_p50_s",
             "step_time_p90_s"}
_NOT_NEGATIVE = {"time_to_target_s", "restart_lost_s", "eval_time_s", "input_wait_s"}


def optional_problem(name: str, key: str, value: Any, kind) -> str | None:
    """What is wrong with the optional field ``key`` of a run record or a probe (``name``
    where the record holds it; None: absent, or right)."""
    if value is None:
        return None
    if wrong_type(value, kind):
        return f"{name} is {type(value).__name__}, not {_kind_name(kind)}"
    if kind is int and not 0 <= value < _MAX_COUNT:
        return f"{name} is {value}, not a count"
    if (key in _POSITIVE and value <= 0) or (key in _NOT_NEGATIVE and value < 0):
        return f"{name} is {value!r}, not a time or rate a run can have"
    return None


def record_problem(rec: Any) -> str | None:
    """What makes this JSON unusable as a run record for the report, or None. The types of
    every field the report reads are checked here, once, so it never tracebacks on one."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    for key, kind in (("run_id", str), ("status", str), ("strategy", str),
                      ("world_size", int), ("per_epoch", list)):
        if not isinstance(rec.get(key), kind) or isinstance(rec.get(key), bool):
            return f"{key} missing or not {_kind_name(kind)}"
    if not 1 <= rec["world_size"] < _MAX_COUNT:
        return f"world_size is {rec['world_size']}, not a count of processes"
    version = rec.get("record_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > RECORD_VERSION:
        # a newer bench may mean something else by a field this one reads: never guess
        return (f"record_version {version}, from a newer parallel-bench than this one "
                f"(which reads {RECORD_VERSION}); update it (git pull, make install)")
    for where, fields in _OPTIONAL.items():
        holder = rec.get(where[0]) if where else rec
        if not isinstance(holder, dict):
            continue  # absent (the type of the holder itself is checked at the top level)
        for key, kind in fields.items():
            problem = optional_problem(".".join((*where, key)), key, holder.get(key), kind)
            if problem:
                return problem
    bucket = (rec.get("ddp_options") or {}).get("bucket_cap_mb")
    if bucket is not None and not 0 < bucket <= MAX_BUCKET_CAP_MB:  # as `bench run` checks
        return f"ddp_options.bucket_cap_mb is {bucket}, not a bucket size in MB"
    if rec["status"] == "ok" and not rec["per_epoch"]:  # a finished run trained an epoch
        return "status ok without an epoch"
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
            problem = optional_problem(f"per_epoch[{i}].{key}", key, epoch.get(key), kind)
            if problem:
                return problem
        if not 0 <= epoch["top1"] <= 1:
            return f"per_epoch[{i}].top1 is {epoch['top1']!r}, not a fraction"
        if epoch["train_time_s"] <= 0 or epoch["images_per_s"] <= 0:  # an epoch trains
            return f"per_epoch[{i}] has a time or speed of {epoch['train_time_s']!r} s"
        # the speed is its images over its time (RunRecord.add_epoch): a record whose speed
        # says otherwise was edited, and every figure read from it (img/s, speed-up,
        # verdict) would be the edit's
        images = epoch.get("train_images")
        if images is not None and not math.isclose(
                epoch["images_per_s"], images / epoch["train_time_s"], rel_tol=1e-9):
            return (f"per_epoch[{i}].images_per_s is {epoch['images_per_s']:g}, not its "
                    f"{images} images over its {epoch['train_time_s']:g} s")
    return None
