"""psfleet: distributed training of PyTorch models on parameter servers or all-reduce."""

__version__ = "0.1.0"

__all__ = ["__version__"]

# A process fleetrun started dies with it, also when fleetrun is SIGKILLed.
from psfleet.launcher_guard import watch_launcher_from_env as _watch_launcher  # noqa: E402

_watch_launcher()
