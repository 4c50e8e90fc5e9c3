"""``RunRecord``: the layout of one run's JSON record, in one place.

The launching process opens it (``skeleton``: what the plan knows) and closes it (``fail``,
``unavailable``); global rank 0 alone fills it in between (``start``, ``add_epoch``,
``finish``), writing it atomically after every change so a killed run keeps what it did."""

from __future__ import annotations

import datetime as _dt
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import __version__
from bench.config.run_config import REFERENCE_BATCH, RunConfig
from bench.models.registry import ModelSpec
from bench.records.describe import summarise_epochs
from bench.records.environment import capture_env
from bench.records.files import read_record, utc_now, write_atomic
from bench.records.peaks import peak_tflops
from bench.records.provenance import source_commit, this_process
from bench.records.schema import DATA_ORDER_RULE, RECORD_VERSION

LR_SCHEDULE = "linear warm-up for warmup_epochs, then cosine to 0; updated every step"


@dataclass(frozen=True)
class TrainStats:
    """One epoch's training, reduced over ranks (times: the slowest rank's once reduced)."""

    train_time_s: float
    train_loss: float
    train_images: int
    lr_last: float
    step_time_p50_s: float
    step_time_p90_s: float
    data_order_sha1: str  # of the samples every rank's loader served, in order
    input_wait_s: float = 0.0  # the loop's host time waiting for batches (InputWait)
    # Set when the epoch's loss was not finite: the first such step (global index, on this
    # rank; None if only another rank saw it) and the mean loss of the step before it.
    diverged: bool = False
    diverged_step: int | None = None
    last_finite_loss: float | None = None


@dataclass(frozen=True)
class EvalStats:
    """One exact evaluation over the whole test set."""

    eval_time_s: float
    top1: float
    top5: float
    test_loss: float
    test_images: int


class RunRecord:
    """One run's record and its file."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = Path(path)
        self.data = data

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        return cls(path, read_record(path))

    @property
    def status(self) -> str | None:
        return self.data.get("status")

    @property
    def summary(self) -> dict[str, Any]:
        return self.data.get("summary") or {}

    def write(self) -> None:
        write_atomic(self.path, self.data)

    # ---- the launching process ----------------------------------------------------------
    @classmethod
    def skeleton(cls, path: Path, *, cfg: RunConfig, run_id: str, launcher: str,
                 device_type: str, replicas: int, processes: int, per_replica_batch: int,
                 workers_per_replica: int, workers_per_process: int, precision: str,
                 strategy_options: dict | None, command: list[str],
                 backend: str | None = None, gpu_shared: bool = False,
                 train_flops_per_image: int | None = None,
                 notes: list[str] | None = None) -> RunRecord:
        """What is known before any rank starts; the ranks fill in the rest (``notes``:
        what the launcher already said of the run)."""
        return cls(path, {
            "record_version": RECORD_VERSION,
            "bench_version": __version__,
            "git_commit": source_commit(),
            "run_id": run_id,
            "started_at": utc_now(),
            "finished_at": None,
            "status": "running",
            "error": None,
            "owner": this_process(),
            "strategy": cfg.strategy,
            "launcher": launcher,
            "device": device_type,
            "gpus_requested": cfg.gpus,
            "world_size": replicas,
            "processes": processes,
            "nodes": cfg.nodes,
            "backend": backend,  # process-group backend (null: no process group)
            "gpu_shared": gpu_shared,  # ranks shared GPUs (gloo): timings not comparable
            "precision": precision,
            "norm": None,
            "global_batch": cfg.batch_size,
            "per_rank_batch": per_replica_batch,
            "lr": cfg.peak_lr,
            "base_lr": cfg.base_lr,
            "lr_reference_batch": REFERENCE_BATCH,
            "lr_schedule": LR_SCHEDULE,
            "warmup_epochs": cfg.warmup_epochs,
            "optimizer": {
                "name": "SGD",
                "momentum": cfg.momentum,
                "nesterov": cfg.nesterov,
                "weight_decay": cfg.weight_decay,
            },
            "epochs": cfg.epochs,
            "dataset": None,
            "train_size": None,
            "test_size": None,
            "seed": cfg.seed,
            "data_order_rule": DATA_ORDER_RULE,
            "memory_parts": None,  # after the first epoch (bench.measure.memory_parts)
            "workers_per_replica": workers_per_replica,
            "workers_per_process": workers_per_process,
            "syncbn_requested": cfg.syncbn,
            "grad_accum": cfg.grad_accum,
            "loader": cfg.loader,
            "channels_last": cfg.channels_last,
            "compile": cfg.compile,
            "compile_mode": cfg.compile_mode if cfg.compile else None,
            "compile_time_s": None,
            "cudagraphs": None,  # --compile reduce-overhead / max-autotune: used, or why not
            "loss_scale": None,  # fp16: the GradScaler's final scale
            "scaler_skipped_steps": None,  # fp16: optimizer steps it skipped (inf/nan grads)
            "optimizer_impl": cfg.optimizer_impl,
            "cudnn_benchmark": cfg.cudnn_benchmark if device_type == "cuda" else None,
            "ddp_options": strategy_options,
            "tag": cfg.tag,
            # time to accuracy (null without --target-top1)
            "target_top1": cfg.target_top1,
            "reached_target": None if cfg.target_top1 is None else False,
            "time_to_target_s": None,
            "train_time_to_target_s": None,
            "epochs_to_target": None,
            # where the time goes: compute-only steps after the epochs (multi-rank runs)
            "comm_probe_steps": 0,
            "compute_step_s": None,
            "exposed_comm_fraction": None,
            "comm_probe_note": None,
            "hook_work_s": None,  # a DDP comm hook's own work per step (rank alone)
            "gradient_timeline": None,  # when each gradient is ready (bench project)
            "gradient_buckets": None,  # DDP: bytes of each bucket as its reducer built them
            # the input pipeline alone after the epochs: the img/s it can feed at most
            "loader_probe_steps": 0,
            "loader_alone_images_per_s": None,
            # model FLOPs utilisation: per-image training FLOPs (FlopCounterMode) against
            # the GPU's dense peak for the run's precision (null: CPU, unknown GPU, shared)
            "train_flops_per_image": train_flops_per_image,
            "peak_tflops_per_gpu": None,
            "profile_steps": cfg.profile_steps,  # --profile-steps: torch.profiler trace
            "profile_trace": None,
            "command": command,
            "config": cfg.to_dict(),
            "env": capture_env(device_type),
            "notes": list(notes or []),
            "restarts": 0,  # torchrun's, --max-restarts: the epochs are the last attempt's
            "restart_lost_s": None,  # launch to the last attempt's start: what restarts cost
            "restart_cause": None,  # what ended the attempt before, as a rank of it said it
            "per_epoch": [],
            "summary": {},
        })

    def set_data(self, dataset: str, train_size: int, test_size: int,
                 data_dir: str | None) -> None:
        self.data.update(dataset=dataset, train_size=train_size, test_size=test_size)
        if data_dir is not None:
            self.data["data_dir"] = data_dir

    def set_rendezvous(self, rendezvous: dict[str, Any]) -> None:
        self.data["rendezvous"] = rendezvous

    @classmethod
    def restarted(cls, path: Path, launched: dict[str, Any], count: int, limit: int,
                  cause: str | None) -> RunRecord:
        """The record of an attempt torchrun started after a rank failed (restart ``count``
        of ``limit``, --max-restarts; ``cause``: that rank's line, where known): the
        launcher's skeleton again (the attempt before left its epochs and notes in the
        file, and each attempt's notes piled up), with the restarts counted and said. The
        epochs to come are this attempt's, which trains from the start. The time the
        attempts before took stays in the record's wall time (``started_at`` is the
        launch's)."""
        lost = (_dt.datetime.now(_dt.timezone.utc)
                - _dt.datetime.fromisoformat(launched["started_at"])).total_seconds()
        record = cls(path, launched)
        record.data["restarts"] = count
        record.data["restart_lost_s"] = round(lost, 1)
        record.data["restart_cause"] = cause
        record.data["notes"] = [
            *launched.get("notes", []),
            f"torchrun restarted the ranks {'once' if count == 1 else f'{count} times'} "
            f"(--max-restarts {limit}) after {cause or 'a rank failed'}, {lost:.0f} s into "
            "the run: its epochs, times and top-1 are the last attempt's, which trained from "
            "the start again (time to target counts from that attempt's first step)"]
        record.write()
        return record

    def unavailable(self, reason: str) -> None:
        self.data.update(status="unavailable", error=reason, finished_at=utc_now())
        self.write()

    def diverged(self, epoch: int, train: TrainStats) -> str:
        """The loss became NaN or infinite: the run is not ok. Returns the one-line reason."""
        where = (f"step {train.diverged_step}" if train.diverged_step is not None
                 else "a step of another rank")
        last = (f"{train.last_finite_loss:.4g}" if train.last_finite_loss is not None
                else "none")
        error = (f"training loss became non-finite in epoch {epoch + 1}, {where} (last finite "
                 f"loss {last}); lower --lr, or check --weight-decay")
        self.data.update(status="diverged", error=error, finished_at=utc_now(),
                         diverged_at={"epoch": epoch + 1, "step": train.diverged_step,
                                      "last_finite_loss": train.last_finite_loss})
        self.write()
        return error

    def fail(self, status: str, error: str | None, traceback: str | None = None) -> None:
        """Close a run that did not finish: ``failed`` or ``interrupted``, and why (with the
        failing rank's traceback when it raised)."""
        self.data.update(status=status, error=error, finished_at=utc_now())
        if traceback:
            self.data["error_traceback"] = traceback
        self.write()

    # ---- global rank 0 ------------------------------------------------------------------
    def start(self, *, world_size: int, processes: int, norm: str, precision: str,
              per_replica_batch: int, per_process_batch: int, grad_accum: int,
              workers_per_process: int, threads_per_process: int, train_size: int,
              test_size: int, steps_per_epoch: int, warmup_steps: int,
              parameters: int, notes: list[str], compile_time_s: float | None,
              model: ModelSpec, batchnorm_layers: int | None = None,
              initial_param_fingerprint: str, initial_reference_fingerprint: str,
              initial_replicas_identical: bool | None, allow_tf32: bool | None,
              cpu_load: dict[str, int] | None = None) -> None:
        """What the ranks found out while building the run; the epochs follow."""
        micro_batch = per_replica_batch // grad_accum
        self.data["compile_time_s"] = compile_time_s
        self.data.update({
            "status": "running",
            "world_size": world_size,
            "processes": processes,
            "norm": norm,
            "precision": precision,
            # images behind each BatchNorm statistic (one micro-batch per replica, or all)
            "bn_batch_size": micro_batch * (world_size if norm == "syncbn" else 1),
            "per_rank_batch": per_replica_batch,
            "per_process_batch": per_process_batch,
            "grad_accum": grad_accum,
            "micro_batch_per_replica": micro_batch,
            "workers_per_process": workers_per_process,
            "threads_per_process": threads_per_process,
            "train_size": train_size,
            "test_size": test_size,
            "steps_per_epoch": steps_per_epoch,
            "warmup_steps": warmup_steps,
            "model": {"name": model.name, "width": model.width, "parameters": parameters,
                      "batchnorm_layers": batchnorm_layers, "num_classes": model.num_classes,
                      "image_size": model.image_size},
            "notes": self.data.get("notes", []) + notes,
            # SHA-1 of the parameters before step 1: same seed and width, same value
            "initial_param_fingerprint": initial_param_fingerprint,
            # the plain model's for this seed and width, drawn here (the torch that ran)
            "initial_reference_fingerprint": initial_reference_fingerprint,
            "initial_replicas_identical": initial_replicas_identical,
            "allow_tf32": allow_tf32,  # cuDNN's TF32 switch on GPU; null on CPU
            # rank 0's machine: the cores whose load each epoch's cpu_load measures (null:
            # not measured, no /proc)
            "cpu_load_sampled": cpu_load,
            "per_epoch": [],
        })
        gpus = (self.data.get("env") or {}).get("gpus") or []
        if self.data.get("device") == "cuda" and gpus and not self.data.get("gpu_shared"):
            self.data["peak_tflops_per_gpu"] = peak_tflops(gpus[0], precision)
        self.write()

    def add_epoch(self, epoch: int, train: TrainStats, evaluation: EvalStats,
                  peak_mem_bytes: int, gpu_clocks: dict[str, Any] | None = None,
                  cpu_load: dict[str, float] | None = None) -> dict[str, Any]:
        """Append epoch ``epoch`` (from 0; the first is the warm-up) and refresh the summary.
        ``gpu_clocks``: the epoch's timed window as the GPUs' clocks saw it (CUDA runs);
        ``cpu_load``: the cores rank 0's machine kept busy then, the run's and others'."""
        entry = {
            "epoch": epoch + 1,
            "warmup": epoch == 0,
            "train_time_s": train.train_time_s,
            "eval_time_s": evaluation.eval_time_s,
            "images_per_s": train.train_images / train.train_time_s,
            "train_images": train.train_images,
            "train_loss": train.train_loss,
            "test_loss": evaluation.test_loss,
            "top1": evaluation.top1,
            "top5": evaluation.top5,
            "test_images": evaluation.test_images,
            "peak_mem_bytes": peak_mem_bytes,
            "step_time_p50_s": train.step_time_p50_s,
            "step_time_p90_s": train.step_time_p90_s,
            "input_wait_s": train.input_wait_s,
            "lr_last": train.lr_last,
            "data_order_sha1": train.data_order_sha1,
        }
        if cpu_load is not None:
            entry["cpu_load"] = cpu_load
        if "gpu_clocks" in self.data:  # CUDA runs: sampled, or said why not
            if gpu_clocks and self.data.get("gpu_shared"):  # each rank counted the one GPU
                gpu_clocks = {**gpu_clocks, "energy_j": None}
            entry["gpu_clocks"] = gpu_clocks
        flops, peak = self.data.get("train_flops_per_image"), self.data.get("peak_tflops_per_gpu")
        entry["achieved_tflops"] = flops * entry["images_per_s"] / 1e12 if flops else None
        entry["mfu"] = (entry["achieved_tflops"] / (peak * self.data["world_size"])
                        if peak and flops else None)
        self.data["per_epoch"] = [*self.data.get("per_epoch", []), entry]
        self.data["summary"] = summarise_epochs(self.data["per_epoch"])
        self.write()
        return entry

    def reached_target(self, epochs: int, wall_s: float) -> None:
        """The first evaluation at or above the target: epochs done, wall time from the first
        step to the end of that evaluation, and the training time (slowest rank) within it."""
        train_s = sum(e["train_time_s"] for e in self.data["per_epoch"][:epochs])
        self.data.update(reached_target=True, epochs_to_target=epochs, time_to_target_s=wall_s,
                         train_time_to_target_s=train_s)
        self.write()

    def trace_path(self) -> Path:
        """Where --profile-steps puts rank 0's trace: ``OUTPUT/traces/<run_id>.trace.json``
        (beside runs/, whose JSON files are all records)."""
        path = self.path.parent.parent / "traces" / f"{self.data['run_id']}.trace.json"
        self.data["profile_trace"] = str(path)
        return path

    def cuda_graphs(self, verdict: str) -> None:
        """Whether the compiled graphs ran as CUDA graphs (modes that replay them)."""
        self.data["cudagraphs"] = verdict
        self.write()

    def gpu_sampling(self, how: str, power_limits_w: list | None) -> None:
        """How the GPUs' clocks are sampled (or why not), and rank 0's GPUs' [enforced,
        default] power limits (None when not sampled); each epoch then keeps its clocks."""
        self.data["gpu_clocks"] = how
        if power_limits_w is not None:
            self.data["gpu_power_limits_w"] = power_limits_w

    def comm_probe(self, steps: int, compute_step_s: float | None, note: str | None,
                   timeline: dict | None = None, hook_work_s: float | None = None) -> None:
        """The compute-only steps: their median against the timed steps' median (epochs 2..,
        or the only one), i.e. the share of a step that communication left exposed; when
        each gradient became ready in them; and what a comm hook computes per step."""
        timed = self.data["per_epoch"][1:] or self.data["per_epoch"]
        step = statistics.median(e["step_time_p50_s"] for e in timed) if timed else None
        exposed = (1.0 - compute_step_s / step) if compute_step_s and step else None
        self.data.update(comm_probe_steps=steps, compute_step_s=compute_step_s,
                         exposed_comm_fraction=exposed, comm_probe_note=note,
                         gradient_timeline=timeline, hook_work_s=hook_work_s)

    def loader_probe(self, steps: int, images_per_s: float | None) -> None:
        """The input pipeline drawn alone (no model): the most img/s it can feed."""
        self.data.update(loader_probe_steps=steps, loader_alone_images_per_s=images_per_s)

    def finish(self, replicas_identical: bool | None, param_fingerprint: list[float],
               scaler_state: dict | None = None, gradient_buckets: list[int] | None = None,
               compressed_gradient_elements: int | None = None) -> None:
        self.data.update(scaler_state or {})
        self.data["gradient_buckets"] = gradient_buckets
        self.data["compressed_gradient_elements"] = compressed_gradient_elements
        self.data.update(replicas_identical=replicas_identical,
                         param_fingerprint=param_fingerprint, status="ok",
                         finished_at=utc_now())
        self.write()

    def finish_verify(self, norm: str, notes: list[str]) -> None:
        """A ``bench verify`` run: no epochs recorded, only that it ran."""
        self.data.update(status="ok", finished_at=utc_now(), norm=norm,
                         notes=["bench verify run", *notes])
        self.write()
