"""ResNet-18, CIFAR variant: 3x3 stride-1 stem, no max-pool, 100 classes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    pass


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (projection when the shape changes)."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNetCifar(nn.Module):
    """ResNet with the CIFAR stem; ``width`` scales every stage's channels (1.0 = real model)."""

    def __init__(
        self, blocks: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 100, width: float = 1.0
    ) -> None:
        super().__init__()
        planes = [max(1, round(64 * width * 2**i)) for i in range(len(blocks))]
        self.stem = nn.Sequential(
            nn.Conv2d(3, planes[0], 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(planes[0]),
            nn.ReLU(inplace=True),
        )
        stages = []
        in_planes = planes[0]
        for i, (n_blocks, out_planes) in enumerate(zip(blocks, planes)):
            stride = 1 if i == 0 else 2
            layers = []
            for b in range(n_blocks):
                layers.append(BasicBlock(in_planes, out_planes, stride if b == 0 else 1))
                in_planes = out_planes
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def resnet18_cifar(num_classes: int = 100, width: float = 1.0) -> ResNetCifar:
    return ResNetCifar((2, 2, 2, 2), num_classes=num_classes, width=width)


