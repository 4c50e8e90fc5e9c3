import torch
from torch import nn

from bench.models.parameters import count_parameters
from bench.models.resnet_cifar import resnet18_cifar


def test_real_resnet18_cifar_shape_and_size():
    model = resnet18_cifar()
    # The CIFAR ResNet-18 with 100 classes has 11,220,132 parameters.
    assert count_parameters(model) == 11_220_132
    stem = model.stem[0]
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 100)


def test_width_scales_channels():
    narrow = resnet18_cifar(width=0.125)
    assert narrow.stem[0].out_channels == 8
    assert narrow.fc.in_features == 64
    assert narrow(torch.randn(1, 3, 32, 32)).shape == (1, 100)
