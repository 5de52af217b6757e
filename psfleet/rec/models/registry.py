"""Registry of CTR models by string name (``dnn``, later ``wide_deep``, ``deepfm``).

A model class (or factory) registers itself with :func:`register_model`; the YAML
runner builds it with :func:`build_model` from the config's ``model`` name and
keyword arguments::

    @register_model("dnn")
    class DNN(nn.Module): ...

    model = build_model("dnn", embedding=embedding, fc_sizes=(512, 256, 128, 32))
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from psfleet.errors import ConfigError

__all__ = ["register_model", "build_model", "list_models"]

_FactoryT = TypeVar("_FactoryT", bound=Callable[..., nn.Module])

_lock = threading.Lock()
_models: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str) -> Callable[[_FactoryT], _FactoryT]:
    """Decorator registering a model class or factory under ``name``.

    Thread safe. Returns the decorated object unchanged.

    Raises:
        ConfigError: if ``name`` is empty or already registered to another object.
    """
    if not name:
        raise ConfigError("register_model: name must be a non-empty string")

    def decorator(factory: _FactoryT) -> _FactoryT:
        with _lock:
            existing = _models.get(name)
            if existing is not None and existing is not factory:
                raise ConfigError(
                    f"model name {name!r} is already registered to {existing!r}; "
                    "choose another name"
                )
            _models[name] = factory
        return factory

    return decorator


def list_models() -> list[str]:
    """The registered model names, sorted."""
    with _lock:
        return sorted(_models)


def build_model(name: str, **kwargs: Any) -> nn.Module:
    """Build the model registered as ``name`` with ``kwargs``.

    Raises:
        ConfigError: if no model is registered as ``name`` (lists the known names).
    """
    with _lock:
        factory = _models.get(name)
    if factory is None:
        raise ConfigError(f"model: {name!r} is not one of {', '.join(list_models()) or '(none)'}")
    return factory(**kwargs)
