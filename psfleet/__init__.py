"""psfleet: distributed training of PyTorch models on parameter servers or all-reduce."""

__version__ = "0.1.0"

__all__ = ["__version__", "train", "predict"]


def __getattr__(name: str) -> object:
    """``psfleet.train`` and ``psfleet.predict`` (:mod:`psfleet.api`), imported on first
    use so that ``import psfleet`` stays light (a launched child imports it first)."""
    if name in ("train", "predict"):
        from psfleet import api

        return getattr(api, name)
    raise AttributeError(f"module 'psfleet' has no attribute {name!r}")

# A process fleetrun started dies with it, also when fleetrun is SIGKILLed.
from psfleet.launcher_guard import watch_launcher_from_env as _watch_launcher  # noqa: E402

_watch_launcher()

# The process ends about a second sooner (the collector skips its objects at exit).
from psfleet.quick_exit import install as _install_quick_exit  # noqa: E402

_install_quick_exit()
