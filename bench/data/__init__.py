"""Data: image sets (CIFAR-100 files, synthetic, ImageFolder), the data set a run trains
on, its loaders (torch's or the GPU loader)."""
