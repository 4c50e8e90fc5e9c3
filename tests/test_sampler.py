"""Data order: the same seed gives the same global batches for every strategy and world
size; set_epoch changes the order between epochs; the record's digest hashes what the
loaders really served, and sees a wrong order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_ok, only_record, records, run_bench
from torch.utils.data import DataLoader

import strategies
from bench.data.device_loader import DeviceLoader
from bench.data.image_sets import CifarTensorDataset, ImageSet
from bench.data.loaders import EvalShard
from bench.tools.faults import DEFECT_ENV
from strategies.base import epoch_sampler
from strategies.horovod import HorovodStrategy

HOROVOD = HorovodStrategy("horovod").requires("cpu")

N = 100


def _order(seed: int, epoch: int, world: int, rank: int) -> list[int]:
    sampler = epoch_sampler(range(N), seed, world, rank)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_set_epoch_changes_order_and_seed_repeats_it():
    assert _order(0, 0, 1, 0) != _order(0, 1, 1, 0)
    assert _order(0, 1, 1, 0) == _order(0, 1, 1, 0)
    assert _order(0, 0, 1, 0) != _order(1, 0, 1, 0)
    assert sorted(_order(0, 3, 1, 0)) == list(range(N))


@pytest.mark.parametrize("world", [2, 4])
def test_global_batches_are_the_same_for_every_world_size(world):
    global_batch = 20
    per_rank = global_batch // world
    single = _order(5, 2, 1, 0)
    shards = [_order(5, 2, world, r) for r in range(world)]
    # No overlap between ranks.
    flat = [i for shard in shards for i in shard]
    assert len(flat) == len(set(flat))
    for step in range(N // global_batch):
        together = {i for s in shards for i in s[step * per_rank : (step + 1) * per_rank]}
        assert together == set(single[step * global_batch : (step + 1) * global_batch])


def test_repeats_of_a_sweep_train_on_independent_orders(tmp_path):
    """A sweep's repeats train seeds S, S+1, ...: every (seed, epoch) must draw an order of
    its own. Under torch's rule (seed + epoch) seed S's epoch 2 was seed S+1's epoch 1, and
    5 repeats were shifted copies of one sequence of orders (two repeats show it)."""
    proc = run_bench("sweep", "--strategies", "ddp", "--gpus", "1", "--repeats", "2", "--cpu",
                     "--epochs", "3", "--data", "synthetic", "--train-limit", "64",
                     "--test-limit", "8", "--image-size", "16", "--width", "0.125",
                     "--batch-size", "32", "--no-progress", "--comm-probe-steps", "0",
                     "--output", str(tmp_path), timeout=600)
    assert_ok(proc)
    recs = records(tmp_path)
    assert sorted(r["seed"] for r in recs) == [0, 1], [r["seed"] for r in recs]
    digests = [e["data_order_sha1"] for r in recs for e in r["per_epoch"]]
    assert len(digests) == 6 and len(set(digests)) == 6, digests
    assert {r["data_order_rule"] for r in recs} == {"sha256(seed, epoch)"}


def _digests(out, strategy: str = "ddp", defect: str | None = None, gpus: int = 2):
    args = ["run", "--strategy", strategy, "--gpus", str(gpus), "--cpu", "--epochs", "2",
            "--data", "synthetic", "--train-limit", "128", "--test-limit", "8", "--width",
            "0.125", "--batch-size", "32", "--no-progress", "--comm-probe-steps", "0",
            "--output", str(out)]
    proc = run_bench(*args, env={DEFECT_ENV: defect} if defect else None)
    assert_ok(proc)
    rec = only_record(out)
    if defect:
        assert any("DEFECT INJECTED" in n for n in rec["notes"])
    return [e["data_order_sha1"] for e in rec["per_epoch"]]


# session scope: kept for the whole worker, so that its runs are made once even when
# xdist hands this worker tests of other modules between the ones that use them
@pytest.fixture(scope="session")
def honest_ddp(tmp_path_factory):
    """One plain 2-rank ddp run, its per-epoch order digests and its record: what the
    tests below compare others with."""
    out = tmp_path_factory.mktemp("honest-ddp")
    return _digests(out), only_record(out)


@pytest.mark.xdist_group("honest_ddp")
def test_order_digest_hashes_what_the_loaders_served(honest_ddp, tmp_path):
    honest = honest_ddp[0]
    assert honest[0] != honest[1]  # set_epoch took effect in the loop
    assert _digests(tmp_path / "dp", "dp", gpus=1) == honest  # 1 process, same sequence
    same_every_epoch = _digests(tmp_path / "no-set-epoch", defect="no-set-epoch")
    assert same_every_epoch[0] == same_every_epoch[1] == honest[0]
    swapped = _digests(tmp_path / "swap", defect="swap-shards")
    assert swapped[0] != honest[0] and swapped[1] != honest[1]


@pytest.mark.skipif(HOROVOD is not None, reason=f"horovod unavailable: {HOROVOD}")
@pytest.mark.xdist_group("honest_ddp")
def test_horovod_serves_the_same_sequence_from_the_same_start(honest_ddp, tmp_path):
    assert _digests(tmp_path / "hvd", "horovod") == honest_ddp[0]
    hvd, ddp = only_record(tmp_path / "hvd"), honest_ddp[1]
    # Horovod's broadcast_optimizer_state on a fresh optimizer used to move every weight
    # before step 1 (a zero-gradient step with weight decay and momentum).
    assert hvd["initial_param_fingerprint"] == ddp["initial_param_fingerprint"]
    assert hvd["initial_replicas_identical"] is True


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])  # fsdp pads short shards (lockstep)
@pytest.mark.parametrize("loader", ["torch", "gpu"])
def test_eval_serves_each_test_index_exactly_once(world, strategy, loader):
    size = 10
    images = ImageSet(np.zeros((size, 32, 32, 3), np.uint8), np.arange(size, dtype=np.int64))
    counted = []  # the label of image i is i: which images were evaluated, and as valid
    batches = []
    for rank in range(world):
        ranked = strategies.get(strategy)
        ranked.rank, ranked.world_size = rank, world  # what setup() finds in the group
        share = ranked.eval_indices(size)
        if loader == "gpu":
            it = DeviceLoader(images, torch.device("cpu"), 3, train=False, indices=share)
        else:
            it = DataLoader(EvalShard(CifarTensorDataset(images, augment=False), share),
                            batch_size=3)
        served = list(it)
        batches.append(len(served))
        for _, labels, valid in served:
            counted += [int(x) for x, v in zip(labels, valid) if v]
    assert sorted(counted) == list(range(size))  # each index once: no overlap, no omission
    if strategy == "fsdp":
        assert len(set(batches)) == 1  # every rank runs the same number of forwards
