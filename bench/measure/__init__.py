"""Measurements taken around the training loop: step timing, GPU clocks, FLOPs, the gradient
timeline, reductions across ranks, and the probe steps after the epochs. Handed the trainer,
never importing it."""
