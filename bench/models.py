"""The model registry, beside the strategy registry: which network a run trains.

- ``resnet18-cifar`` (the default): ResNet-18 with the CIFAR stem (bench.model); ``--width``
  scales its channels.
- ``torchvision:NAME``: any torchvision classification model (``torchvision:resnet50``,
  ``torchvision:convnext_tiny``, ...), built with random weights — never downloaded.
- ``package.module:function``: the user's own; called with the number of classes, it returns
  an ``nn.Module`` mapping a batch of images to logits.

Every builder draws its weights from torch's global generator, so the run's seed fixes them
(the same-start fingerprint holds for every model)."""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING

from bench.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

DEFAULT_MODEL = "resnet18-cifar"
_TORCHVISION = "torchvision:"
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def check_model(name: str, width: float) -> None:
    """Refuse, in one line naming the fix, a model that cannot be built (imports what it
    names: torchvision's list of classification models, or the user's module)."""
    if name == DEFAULT_MODEL:
        return
    if width != 1.0:
        raise ConfigError(f"--width scales {DEFAULT_MODEL} only; drop it for --model {name}")
    if name.startswith(_TORCHVISION):
        arch = name[len(_TORCHVISION):]
        from torchvision import models

        known = models.list_models(module=models)
        if arch not in known:
            close = [k for k in known if arch and (arch in k or k in arch)][:5]
            raise ConfigError(f"--model {name}: torchvision has no classification model "
                              f"{arch!r}" + (f" (did you mean {', '.join(close)}?)" if close
                                              else "; see torchvision.models.list_models()"))
        return
    if not _FACTORY.match(name):
        raise ConfigError(f"--model {name!r}: use {DEFAULT_MODEL}, torchvision:NAME or "
                          "package.module:function")
    _factory(name)


def _factory(name: str):
    module_name, function = name.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--model {name}: cannot import {module_name} ({exc}); put its "
                          "folder on PYTHONPATH") from None
    factory = getattr(module, function, None)
    if not callable(factory):
        raise ConfigError(f"--model {name}: {module_name} has no function {function}")
    return factory


def check_model_builds(name: str) -> None:
    """A user's factory is called once before anything is written, so that one returning no
    module is refused in one line rather than in every rank (the registry's are known)."""
    if not stable(name):
        from bench.data import NUM_CLASSES

        build_model(name, NUM_CLASSES)


def build_model(name: str, num_classes: int, width: float = 1.0) -> nn.Module:
    """The untrained model (weights from torch's global generator)."""
    if name == DEFAULT_MODEL:
        from bench.model import resnet18_cifar

        return resnet18_cifar(num_classes=num_classes, width=width)
    if name.startswith(_TORCHVISION):
        from torchvision import models

        return models.get_model(name[len(_TORCHVISION):], weights=None,
                                num_classes=num_classes)
    from torch import nn

    model = _factory(name)(num_classes)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"--model {name} returned {type(model).__name__}, not an nn.Module")
    return model


def short_name(name: str) -> str:
    """The model in workload labels: resnet18 (x width), resnet50, my.models:tiny."""
    if name == DEFAULT_MODEL:
        return "resnet18"
    return name[len(_TORCHVISION):] if name.startswith(_TORCHVISION) else name


def stable(name: str) -> bool:
    """Whether the model is fixed by its name and the installed packages (cacheable)."""
    return name == DEFAULT_MODEL or name.startswith(_TORCHVISION)
