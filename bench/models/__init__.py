"""Models: the registry of what a run can train (registry), the CIFAR ResNet-18
(resnet_cifar), parameters counted and fingerprinted (parameters), BatchNorm layers
swapped (batchnorm) and ghost BatchNorm (ghost_batchnorm)."""
