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


class _Shortcut(nn.Module):
    """A residual stage's downsampling: 3x3 and 1x1 stride-2 convolutions, each with
    BatchNorm, added."""

    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(32))
        self.shortcut = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2, bias=False),
                                      nn.BatchNorm2d(32))

    def forward(self, x):
        return (self.main(x) + self.shortcut(x)).relu()


def shortcut_cnn(num_classes: int) -> nn.Module:
    """ResNet's 1x1 shortcut convolution in a model that compiles in seconds on CPU."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), _Shortcut(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))


def not_a_module(num_classes: int) -> str:
    return f"{num_classes} classes"


def ten_logits(num_classes: int) -> nn.Module:
    """Ignores the class count: ten logits whatever the data has."""
    return tiny_cnn(10)


def with_auxiliary_heads(num_classes: int) -> nn.Module:
    """torchvision's GoogLeNet as its builder makes it by default: in training it returns
    its two auxiliary classifiers' logits beside the main one's."""
    from torchvision import models

    return models.googlenet(weights=None, num_classes=num_classes, aux_logits=True,
                            init_weights=False)


def takes_a_config(config: dict) -> nn.Module:
    """A factory written for another harness: it wants a dict, not the number of classes."""
    return nn.Linear(config["features"], config["classes"])


class _Constant(nn.Module):
    """Logits computed from the image without a single parameter."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes

    def forward(self, images):
        return images.mean((1, 2, 3))[:, None].expand(-1, self.num_classes)


def no_parameters(num_classes: int) -> nn.Module:
    """Nothing to train: every strategy's optimizer would refuse it."""
    return _Constant(num_classes)


def on_meta(num_classes: int) -> nn.Module:
    """Parameters on the meta device (shapes only, no values): nothing to train from."""
    import torch

    with torch.device("meta"):
        return tiny_cnn(num_classes)


def hangs_in_rank_1(num_classes: int) -> nn.Module:
    """Builds at once in bench's own check and in rank 0, never in rank 1 (a factory that
    waits for a file, a lock or a download that never comes)."""
    import os
    import time

    while os.environ.get("RANK") == "1":
        time.sleep(1)
    return tiny_cnn(num_classes)


def hangs_in_every_rank(num_classes: int) -> nn.Module:
    """Builds at once in bench's own check, never in a rank (none reaches a collective that
    could time out)."""
    import os
    import time

    while "RANK" in os.environ:
        time.sleep(1)
    return tiny_cnn(num_classes)


class _StateHeavy(nn.Module):
    """Much training state and much activation memory per image, little compute: a stand-in
    for a large model in `bench sweep --batch-size max`'s test. ``bank`` is 32 M parameters
    in 16 tensors (ZeRO-1 shards whole tensors) that every step touches, so each has a
    gradient and momentum: DDP holds parameters, gradients, momentum and its buckets whole
    on every rank, ZeRO-1 half the momentum. Each image is stretched 8 x per side: ~2.4 MiB
    of activations an image at 32 px."""

    def __init__(self, num_classes: int) -> None:
        import torch

        super().__init__()
        self.bank = nn.ParameterList(nn.Parameter(torch.zeros(2 * 2**20)) for _ in range(16))
        self.gain = nn.Parameter(torch.ones(1))
        self.head = nn.Linear(3, num_classes)

    def forward(self, images):
        big = nn.functional.interpolate(images, scale_factor=8.0, mode="nearest")
        big = nn.functional.relu(big * self.gain)
        return self.head(big.mean((2, 3))) + sum(p.mean() for p in self.bank)


def state_heavy(num_classes: int) -> nn.Module:
    return _StateHeavy(num_classes)


class _Held(nn.Module):
    """tiny_cnn whose forward pass waits HELD_S first while the file named by $HOLD_FILE
    exists: a test holds a run in its epochs (to cancel, kill or claim it while it runs)
    without spending CPU on them, and lets what follows finish at once by removing the file.
    Every step still completes, so heartbeats and progress go on as in any run."""

    HELD_S = 0.1

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.net = tiny_cnn(num_classes)

    def forward(self, images):
        import os
        import time

        hold = os.environ.get("HOLD_FILE")
        if hold and os.path.exists(hold):
            time.sleep(self.HELD_S)
        return self.net(images)


def held(num_classes: int) -> nn.Module:
    return _Held(num_classes)


class _CollectorWatch(nn.Module):
    """tiny_cnn that says, in the file named by $COLLECTOR_LOG, whether Python's cyclic
    collector ran while a rank built it and while it trains (bench.tools.collector)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.net = tiny_cnn(num_classes)
        self._said_training = False
        self._say("build")

    @staticmethod
    def _say(phase: str) -> None:
        import gc
        import os

        if os.environ.get("RANK") is None:  # bench's own check of the factory, not a rank
            return
        with open(os.environ["COLLECTOR_LOG"], "a") as log:
            log.write(f"{phase} rank={os.environ['RANK']} enabled={gc.isenabled()} "
                      f"frozen={gc.get_freeze_count()}\n")

    def forward(self, images):
        if self.training and not self._said_training:
            self._said_training = True
            self._say("train")
        return self.net(images)


def collector_watch(num_classes: int) -> nn.Module:
    return _CollectorWatch(num_classes)


class _SpareLayer(nn.Module):
    """A classifier with a layer its forward pass never calls (left over from an
    experiment): DDP waits for that layer's gradients, which never come."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.body = tiny_cnn(num_classes)
        self.spare = nn.Linear(4, 4)

    def forward(self, images):
        return self.body(images)


def spare_layer(num_classes: int) -> nn.Module:
    return _SpareLayer(num_classes)


def with_dropout(num_classes: int) -> nn.Module:
    """tiny_cnn with dropout before its classifier, as many classification heads have."""
    body = tiny_cnn(num_classes)
    return nn.Sequential(*body[:-1], nn.Dropout(0.5), body[-1])


def transposed_cnn(num_classes: int) -> nn.Module:
    """A transposed convolution between BatchNorms (a decoder's layer in a classifier)."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.ConvTranspose2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))


def plain_batchnorm(num_classes: int) -> nn.Module:
    """BatchNorm without its weight and bias (affine=False): normalisation alone."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16, affine=False),
        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))
