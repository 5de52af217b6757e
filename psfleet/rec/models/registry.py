"""Registry of CTR models by string name (``dnn``, ``wide_deep``, ``deepfm``, ``dcn_v2``).

A model class (or factory) registers itself with :func:`register_model`; the YAML
runner builds it with :func:`build_model` from the config's ``model`` name and
keyword arguments::

    @register_model("dnn")
    class DNN(nn.Module): ...

    model = build_model("dnn", embedding=embedding, fc_sizes=(512, 256, 128, 32))

The runner's models all take ``build_model(name, embeddings=FeatureEmbeddings,
num_dense=int, fc_sizes=[...], generator=None, **extra)`` (``extra``: the model's own
keys, such as dcn_v2's ``cross_layers``) and compute
``forward(sparse, dense, jagged=None) -> Tensor[B]`` logits.
"""

from __future__ import annotations

import inspect
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
        ConfigError: if no model is registered as ``name`` (lists the known names), a
            keyword is not one the model takes (names it and lists the known ones), or
            the model rejects a value.
    """
    with _lock:
        factory = _models.get(name)
    if factory is None:
        raise ConfigError(f"model: {name!r} is not one of {', '.join(list_models()) or '(none)'}")
    known = _keywords(factory)
    if known is not None:
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"model {name!r}: unknown argument(s) {', '.join(unknown)}; it "
                              f"takes {', '.join(sorted(known))}")
    return factory(**kwargs)


def _keywords(factory: Callable[..., nn.Module]) -> set[str] | None:
    """The keyword arguments ``factory`` takes, or None when it takes any (``**kwargs``)
    or has no signature to read."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
