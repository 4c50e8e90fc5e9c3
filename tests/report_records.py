"""Small hand-written run and probe records for the report's tests: each figure in them is
chosen so that the tests can compute the expected table by hand."""

from __future__ import annotations

import json
from pathlib import Path


def record(run_id, strategy, world, times, top1, status="ok", error=None, started="1"):
    """A CPU fp32 run on 1,000 synthetic images at global batch 100: epoch i took times[i]
    seconds (1,000 / t img/s) and reached top1[i] (a fraction, as records keep it)."""
    epochs = [
        {"epoch": i + 1, "train_time_s": t, "images_per_s": 1000.0 / t, "top1": a, "top5": a,
         "peak_mem_bytes": 2**20 * (i + 1), "train_loss": 1.0, "eval_time_s": 0.1}
        for i, (t, a) in enumerate(zip(times, top1))
    ]
    return {
        "run_id": run_id, "started_at": started, "status": status, "error": error,
        "strategy": strategy, "device": "cpu", "world_size": world, "processes": world,
        "precision": "fp32", "norm": "per-replica-bn", "dataset": "synthetic",
        "train_size": 1000, "global_batch": 100, "model": {"width": 1.0},
        "per_epoch": epochs, "env": {"cpu": "Test CPU", "cpu_count": 2, "torch": "x",
                                     "python": "3"},
    }


def timed(run_id, seconds, reached=True, strategy="ddp"):
    """An N=2 run with a 60 % target, reached after SECONDS or (reached=False) missed."""
    rec = record(run_id, strategy, 2, [5.0, 1.0], [0.5, 0.7])
    rec.update(target_top1=60.0, reached_target=reached,
               time_to_target_s=seconds if reached else None)
    return rec


def repeat(run_id, strategy, world, final, ttt):
    """One repeat of a row: final top-1 FINAL %, a 45 % target reached after TTT seconds
    (None: missed)."""
    rec = record(run_id, strategy, world, [2.0, 1.0], [0.1, final / 100])
    return {**rec, "target_top1": 45.0, "reached_target": ttt is not None,
            "time_to_target_s": ttt}


def probe(probe_id, device, busbw):
    """A 2-rank all-reduce probe measuring BUSBW GB/s at 1 KiB, 1 MiB and 64 MiB: each
    message's time is what that bandwidth takes (2 ranks: busbw = bytes / time)."""
    return {"kind": "allreduce-probe", "probe_id": probe_id, "device": device,
            "backend": "gloo" if device == "cpu" else "nccl", "world_size": 2, "nodes": 1,
            "model": "resnet18-cifar", "gradient_bytes": 44880528,
            "results": [{"bytes": 2**k, "busbw_GBps": busbw, "time_s": 2**k / busbw / 1e9}
                        for k in (10, 20, 26)]}


def write_runs(results: Path, records) -> Path:
    """Write RECORDS as RESULTS/runs/<run_id>.json, as runs do; returns RESULTS."""
    runs = results / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for rec in records:
        (runs / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    return results
