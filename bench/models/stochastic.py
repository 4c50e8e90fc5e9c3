"""Layers that draw random numbers as they train (dropout, stochastic depth), found and
switched off for ``bench verify``.

Each rank draws its own masks, and verify's one-process reference draws others: a model with
one ``nn.Dropout(0.5)`` differed from the reference by 9e-3 (loss) and 1e-4 (parameters)
after 10 steps under ddp and dp alike, so verify failed every correct strategy. verify
checks the data-parallel machinery, not the model; like augmentation, these layers are off
on both sides (their probability set to 0: the identity). Dropout called as a function
inside a forward (``F.dropout``) cannot be found, and such a model still differs."""

from __future__ import annotations

from torch import nn


def random_layers(model: nn.Module) -> list[nn.Module]:
    """The model's dropout (any ``nn.Dropout*``, alpha dropout included) and stochastic
    depth (torchvision's ``StochasticDepth``) layers that drop something (p > 0)."""
    return [layer for layer in model.modules()
            if (isinstance(layer, nn.modules.dropout._DropoutNd)
                or type(layer).__name__ == "StochasticDepth")
            and float(getattr(layer, "p", 0.0)) > 0]


def switch_off_random_layers(model: nn.Module) -> int:
    """Sets every ``random_layers`` layer's probability to 0; returns how many there were."""
    layers = random_layers(model)
    for layer in layers:
        layer.p = 0.0
    return len(layers)
