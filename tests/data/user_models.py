"""Model factories as a user writes them, for `bench run --model user_models:NAME` with
tests/data on PYTHONPATH."""

from torch import nn


def tiny_cnn(num_classes: int) -> nn.Module:
    """Two convolutions and a classifier, no BatchNorm."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, num_classes),
    )


def not_a_module(num_classes: int) -> str:
    return f"{num_classes} classes"


def ten_logits(num_classes: int) -> nn.Module:
    """Ignores the class count: ten logits whatever the data has."""
    return tiny_cnn(10)


def takes_a_config(config: dict) -> nn.Module:
    """A factory written for another harness: it wants a dict, not the number of classes."""
    return nn.Linear(config["features"], config["classes"])
