"""psfleet: distributed training of PyTorch models on parameter servers or all-reduce."""

__version__ = "0.1.0"

__all__ = ["__version__"]
