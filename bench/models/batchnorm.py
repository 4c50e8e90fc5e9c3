"""BatchNorm layers swapped for another kind (bench's SyncBatchNorm for CPU ranks, ghost
BatchNorm), as ``nn.SyncBatchNorm.convert_sync_batchnorm`` swaps them: the same parameters
and running statistics, held by the new layer."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

BatchNorm = nn.modules.batchnorm._BatchNorm


def replace_batchnorm(module: nn.Module, make: Callable[[BatchNorm], BatchNorm],
                      kind: type[BatchNorm]) -> nn.Module:
    """``module`` with every BatchNorm layer that is not a ``kind`` already replaced by
    ``make(layer)``, which takes over the layer's parameters, running statistics and mode."""
    converted = module
    if isinstance(module, BatchNorm) and not isinstance(module, kind):
        converted = make(module)
        if module.affine:
            converted.weight = module.weight
            converted.bias = module.bias
        converted.running_mean = module.running_mean
        converted.running_var = module.running_var
        converted.num_batches_tracked = module.num_batches_tracked
        converted.training = module.training
    for name, child in module.named_children():
        converted.add_module(name, replace_batchnorm(child, make, kind))
    return converted
