"""A package's public names, imported from their modules on first use (PEP 562).

A launched child (server, worker, the launcher's health probe) pays for every module
its packages' ``__init__`` imports: about 3 CPU-seconds a process before it does
anything, most of it torch. A package that re-exports its modules' names through
:func:`lazy_exports` costs nothing until a name is read, so a process that needs one
module of a package (``python -m psfleet.launch.health_probe``) imports that module
only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package`` that imports ``exports[name]`` (a module
    path) on first access of ``name`` and returns that module's attribute.

    Args:
        package: the package's ``__name__`` (names it in the error).
        exports: public name -> the module that defines it.

    Raises (from the returned function):
        AttributeError: ``name`` is not one of ``exports``, as for any module.
    """

    def module_getattr(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return module_getattr
