"""The model registry, beside the strategy registry: which network a run trains.

- ``resnet18-cifar`` (the default): ResNet-18 with the CIFAR stem
  (bench.models.resnet_cifar); ``--width`` scales its channels.
- ``torchvision:NAME``: any torchvision classification model (``torchvision:resnet50``,
  ``torchvision:convnext_tiny``, ...), built with random weights — never downloaded.
- ``package.module:function``: the user's own; called with the number of classes, it returns
  an ``nn.Module`` mapping a batch of images to logits.

Every builder draws its weights from torch's global generator, so the run's seed fixes them
(the same-start fingerprint holds for every model)."""

from __future__ import annotations

import importlib
import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.tools.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

DEFAULT_MODEL = "resnet18-cifar"
_TORCHVISION = "torchvision:"
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
CIFAR_SIZE = 32  # resnet18-cifar's and a user model's default image size
TORCHVISION_SIZE = 224  # torchvision models' (ImageNet's)
# torchvision builders whose model is made for one image size, which they take as an argument
_SIZED = ("vit_",)
# torchvision builders with auxiliary classifiers, returned beside the logits in training: a
# run trains the network's own classifier (auxiliary heads are a recipe's extra loss; left
# in, their parameters get no gradient). inception_v3's also cannot take 224 px, the default.
_AUXILIARY = ("googlenet", "inception_v3")


def _torchvision_arch(name: str) -> str | None:
    """``resnet50`` for ``torchvision:resnet50``; None for any other model."""
    return name[len(_TORCHVISION):] if name.startswith(_TORCHVISION) else None


def default_image_size(name: str) -> int:
    """32 for the CIFAR ResNet-18 and a user's model, 224 for torchvision's."""
    return TORCHVISION_SIZE if _torchvision_arch(name) is not None else CIFAR_SIZE


@dataclass(frozen=True)
class ModelSpec:
    """Which network, exactly: what its weights (the same-start fingerprint), its FLOPs and
    its gradient bytes depend on."""

    name: str = DEFAULT_MODEL
    width: float = 1.0  # resnet18-cifar's channel multiplier
    num_classes: int = 100
    image_size: int = CIFAR_SIZE

    def build(self) -> nn.Module:
        """The untrained model (weights from torch's global generator)."""
        return build_model(self.name, self.num_classes, self.width, self.image_size)

    def key(self) -> str:
        """One line naming it, for caches."""
        return (f"{self.name} width={self.width:g} classes={self.num_classes} "
                f"size={self.image_size}")

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> ModelSpec:
        """The model a record trained (older records lack classes and size: CIFAR's)."""
        model = rec.get("model") or {}
        return cls(name=model.get("name") or DEFAULT_MODEL,
                   width=model.get("width", (rec.get("config") or {}).get("width", 1.0)),
                   num_classes=model.get("num_classes") or 100,
                   image_size=model.get("image_size") or CIFAR_SIZE)


def check_model(name: str, width: float) -> None:
    """Refuse, in one line naming the fix, a model that cannot be built (imports what it
    names: torchvision's list of classification models, or the user's module)."""
    if name == DEFAULT_MODEL:
        return
    if width != 1.0:
        raise ConfigError(f"--width scales {DEFAULT_MODEL} only; drop it for --model {name}")
    arch = _torchvision_arch(name)
    if arch is not None:
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


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


def check_model_builds(spec: ModelSpec) -> nn.Module:
    """Build the model once, before anything is written, and pass one image of the run's
    size through it on the CPU in evaluation mode and two in training mode (under no_grad):
    a factory returning no module, or a model that cannot take the image size or does not
    give one logit per class in either mode, is refused in one line rather than in every
    rank. (The build makes the weights anyway; three images cost milliseconds to a few
    tenths of a second, where the meta device would cost a second of torch's decomposition
    imports in every run.) Returns the model on the meta device (its parameter shapes, for
    callers that need no weights)."""
    import torch

    built = False
    try:
        with torch.random.fork_rng(devices=[]):
            model = spec.build().eval()
        built = True
        _check_parameters(spec.name, model)
        outputs = []
        # training mode: BatchNorm wants two values a channel; some models (torchvision's
        # googlenet and inception_v3) return auxiliary outputs there and logits only in eval
        for training, count in ((False, 1), (True, 2)):
            model.train(training)
            images = torch.zeros(count, 3, spec.image_size, spec.image_size)
            with torch.no_grad():
                outputs.append((training, count, model(images)))
        model = model.to("meta")
    except ConfigError:
        raise
    except Exception as exc:
        if not built and not stable(spec.name):  # the user's factory, given the class count
            raise ConfigError(f"--model {spec.name}: building it with {spec.num_classes} "
                              f"classes failed ({_first_line(exc)}); it must be a function of "
                              "the number of classes that returns an nn.Module") from None
        # a torchvision model made for the image size (ViT) fails as it is built
        raise ConfigError(f"--model {spec.name} cannot take {spec.image_size}x"
                          f"{spec.image_size} images ({_first_line(exc)}); choose another "
                          "--image-size") from None
    for training, count, logits in outputs:
        shape = tuple(getattr(logits, "shape", ()))
        if shape != (count, spec.num_classes):
            images = "1 image" if count == 1 else f"a batch of {count} images"
            auxiliary = hasattr(logits, "aux_logits") or hasattr(logits, "aux_logits2")
            extra = (" (auxiliary outputs: build it with aux_logits=False in your own "
                     "factory, package.module:function)") if auxiliary else ""
            raise ConfigError(f"--model {spec.name} maps {images}"
                              f"{' in training' if training else ''} to "
                              f"{shape or type(logits).__name__}, not logits of shape "
                              f"({count}, {spec.num_classes}); it must return one logit per "
                              f"class{extra}")
    return model


def _check_parameters(name: str, model: nn.Module) -> None:
    """A model must have something to train, made on the CPU with values: bench moves it to
    each rank's device and draws the same start for every strategy."""
    params = list(model.parameters())
    if not params:
        raise ConfigError(f"--model {name} has no parameters: there is nothing to train; "
                          "return a model with trainable layers")
    devices = sorted({p.device.type for p in params})
    if devices != ["cpu"]:
        where = "on the meta device (shapes without values)" if "meta" in devices else (
            f"on {', '.join(devices)}")
        raise ConfigError(f"--model {name} makes its parameters {where}; build them on the "
                          "CPU (bench moves the model to each rank's device)")


def build_model(name: str, num_classes: int, width: float = 1.0,
                image_size: int | None = None) -> nn.Module:
    """The untrained model (weights from torch's global generator). A torchvision model
    made for one image size (ViT) is made for ``image_size``; one with auxiliary
    classifiers (googlenet, inception_v3) is made without them."""
    if name == DEFAULT_MODEL:
        from bench.models.resnet_cifar import resnet18_cifar

        return resnet18_cifar(num_classes=num_classes, width=width)
    arch = _torchvision_arch(name)
    if arch is not None:
        from torchvision import models

        sized = image_size is not None and arch.startswith(_SIZED)
        extra = {"image_size": image_size} if sized else {}
        if arch in _AUXILIARY:
            extra["aux_logits"] = False
        with warnings.catch_warnings():
            # googlenet and inception_v3 warn, as each rank builds them, that their
            # default initialisation will change one day: nothing a user of bench can act on
            warnings.filterwarnings("ignore", category=FutureWarning,
                                    message="The default weight initialization")
            return models.get_model(arch, weights=None, num_classes=num_classes, **extra)
    from torch import nn

    model = _factory(name)(num_classes)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"--model {name} returned {type(model).__name__}, not an nn.Module")
    return model


def short_name(name: str) -> str:
    """The model in workload labels: resnet18 (x width), resnet50, my.models:tiny."""
    if name == DEFAULT_MODEL:
        return "resnet18"
    return _torchvision_arch(name) or name


def mlperf_model_name(name: str) -> str:
    """The model in an MLPerf log's benchmark name: resnet18-cifar, resnet50, custom (a
    user's module path says nothing to a reader of the log)."""
    if name == DEFAULT_MODEL:
        return name
    return _torchvision_arch(name) or "custom"


def stable(name: str) -> bool:
    """Whether the model is fixed by its name and the installed packages (cacheable)."""
    return name == DEFAULT_MODEL or _torchvision_arch(name) is not None
