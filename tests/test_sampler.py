"""Data order: the same seed gives the same global batches for every strategy and world
size; set_epoch changes the order between epochs."""

import pytest

from bench.loaders import global_order_digest
from strategies.base import epoch_sampler

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


def test_order_digest_agrees_across_world_sizes():
    d1 = global_order_digest(range(N), 3, 1, world_size=1, per_rank=20)
    d2 = global_order_digest(range(N), 3, 1, world_size=2, per_rank=10)
    d4 = global_order_digest(range(N), 3, 1, world_size=4, per_rank=5)
    assert d1 == d2 == d4
    assert d1 != global_order_digest(range(N), 3, 2, world_size=1, per_rank=20)
