"""DDP through the project's strategy, in real gloo process groups: losses differ per rank,
gradients agree and equal the mean of the per-rank gradients, parameters stay identical."""

import json

import torch.multiprocessing as mp
from ddp_grad_check import rank_main

from bench.tools.ports import free_port


def test_ddp_averages_gradients_and_keeps_ranks_identical(tmp_path):
    world = 2
    mp.spawn(rank_main, args=(world, free_port(), str(tmp_path)), nprocs=world, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for res in results:
        losses = res["losses"]
        assert abs(losses[0] - losses[1]) > 1e-4, "ranks should see different data"
        assert res["grad_vs_mean_max_abs"] <= 1e-5 * max(1.0, res["grad_scale"])
        assert res["grad_vs_own_max_abs"] > 1e-4, "DDP gradient must differ from the local one"
        assert res["param_spread_max_abs"] == 0.0, "parameters differ across ranks"
        assert res["params_moved"] > 0, "the optimizer step must have changed the weights"
