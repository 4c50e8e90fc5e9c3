"""What the harness costs: its training epoch against a minimal hand-written loop.

Both loops train the same model on the same synthetic data with the same batch, threads and
process count, drawing batches from the same on-device pipeline (``--loader gpu``'s
DeviceLoader), with cuDNN's autotuner on where the harness turns it on, so the ratio isolates
the harness's own per-step work (strategy indirection, lr schedule, heartbeat, step marks,
loss accumulation). The figure is an epoch's training time, the device synchronised only at
its ends (a loop that waited for the GPU after every step would be the slower one on a
launch-bound GPU); the first epoch is warm-up, the median of the others counts. Pairs (raw,
harness) run interleaved, ``--repeats`` times; the spread is min..max of the per-pair
ratios. The harness runs ``--strategy ddp`` (DDP even for 1 process); the raw loop wraps
DDP only with several processes, so the 1-process ratio includes DDP's own cost.

    python benchmarks/overhead.py                 # 1 process and 2-rank DDP, on CPU
    python benchmarks/overhead.py --gpu           # the same on CUDA (1 and 2 GPUs)
    python benchmarks/overhead.py --gpu --worlds 1 --width 1 --batch 256 --steps 48
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.data.device_loader import DeviceLoader  # noqa: E402
from bench.data.image_sets import synthetic_split  # noqa: E402
from bench.models.resnet_cifar import resnet18_cifar  # noqa: E402
from bench.tools.ports import free_port  # noqa: E402
from strategies.base import cpu_threads_per_process  # noqa: E402


def raw_rank(rank: int, world: int, port: int, args: dict, out: str) -> None:
    """The minimal loop: no harness, plain (DDP-wrapped when world > 1) model."""
    torch.set_num_threads(cpu_threads_per_process(world))
    device = torch.device("cuda", rank) if args["gpu"] else torch.device("cpu")
    if args["gpu"]:
        torch.cuda.set_device(rank)
        torch.backends.cudnn.benchmark = True  # as the harness does on GPU
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl" if args["gpu"] else "gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = resnet18_cifar(width=args["width"]).to(device)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[rank] if args["gpu"] else None
        )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                                weight_decay=5e-4)
    images = synthetic_split("train", args["steps"] * args["batch"], seed=0)
    loader = DeviceLoader(images, device, args["batch"] // world, train=True, seed=0,
                          world_size=world, rank=rank, aug_seed=rank)
    epoch_times = []
    for epoch in range(args["epochs"]):
        loader.sampler.set_epoch(epoch)
        if world > 1:
            dist.barrier()
        if args["gpu"]:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for x, y, _ in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        if args["gpu"]:
            torch.cuda.synchronize()
        if epoch > 0:
            epoch_times.append(time.perf_counter() - start)
    if rank == 0:
        Path(out).write_text(json.dumps(epoch_times))
    if world > 1:
        del model
        dist.destroy_process_group()


def raw(world: int, args: dict) -> float:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    mp.spawn(raw_rank, args=(world, free_port(), args, out), nprocs=world, join=True)
    times = json.loads(Path(out).read_text())
    Path(out).unlink()
    return statistics.median(times)


def harness(world: int, args: dict) -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "bench", "run", "--strategy", "ddp", "--gpus",
               str(world), "--data", "synthetic", "--loader", "gpu", "--width",
               str(args["width"]), "--batch-size", str(args["batch"]), "--train-limit",
               str(args["steps"] * args["batch"]), "--test-limit", "10", "--epochs",
               str(args["epochs"]), "--no-progress", "--output", out]
        if not args["gpu"]:
            cmd.append("--cpu")
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        record = json.loads(next(Path(out, "runs").glob("*.json")).read_text())
    # an epoch's train_time_s is timed between device syncs at its ends, as the raw loop's
    return statistics.median(e["train_time_s"] for e in record["per_epoch"][1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="run on CUDA")
    parser.add_argument("--width", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=24, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="the first is warm-up")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worlds", default="1,2")
    opts = parser.parse_args()
    args = vars(opts)
    print(f"overhead: ResNet-18 x{opts.width}, batch {opts.batch}, {opts.steps} steps/epoch, "
          f"{opts.epochs - 1} timed epochs, {opts.repeats} repeats, "
          f"{'CUDA' if opts.gpu else 'CPU'}")
    print(f"{'setup':<14} {'raw epoch (s)':>13} {'harness (s)':>12} {'ratio':>7}  spread")
    for world in (int(w) for w in opts.worlds.split(",")):
        pairs = []
        for _ in range(opts.repeats):
            pairs.append((raw(world, args), harness(world, args)))
        ratios = [h / r for r, h in pairs]
        label = "1 process" if world == 1 else f"{world}-rank DDP"
        print(f"{label:<14} {statistics.median(r for r, _ in pairs):>13.4f} "
              f"{statistics.median(h for _, h in pairs):>12.4f} "
              f"{statistics.median(ratios):>7.3f}  {min(ratios):.3f}..{max(ratios):.3f}",
              flush=True)


if __name__ == "__main__":
    main()
