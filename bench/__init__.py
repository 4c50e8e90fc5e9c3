"""parallel-bench: compare PyTorch data-parallel strategies on your own hardware."""

__version__ = "0.1.0"
