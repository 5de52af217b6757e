"""Stop signals recorded where the training loop can see them.

The CLI's handler (``psfleet.cli.console.signals_interrupt``) turns SIGINT and SIGTERM
into a ``KeyboardInterrupt`` raised wherever the main thread is. Python drops an
exception raised inside a finalizer (a generator being closed, a ``__del__``, a weakref
callback: "Exception ignored in ..."), so one signal in a thousand could be lost and the
run train on to its end. The handler also records the signal here, and the training
loop calls :func:`raise_pending` at every step: a swallowed interrupt is raised again
there, one step later. Standard library only (this module sits below every layer).
"""

from __future__ import annotations

import signal

__all__ = ["Terminated", "record", "clear", "first", "raise_pending"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like SIGINT's KeyboardInterrupt so training stops the same way."""


#: The stop signals received since :func:`clear`, in order.
_RECEIVED: list[int] = []


def record(signum: int) -> KeyboardInterrupt:
    """Note ``signum`` (SIGINT or SIGTERM) and return the exception it raises:
    :class:`Terminated` for SIGTERM, else a KeyboardInterrupt."""
    _RECEIVED.append(signum)
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def clear() -> None:
    """Forget the signals recorded so far (a new run starts)."""
    _RECEIVED.clear()


def first() -> int | None:
    """The first signal recorded since :func:`clear` (None: none)."""
    return _RECEIVED[0] if _RECEIVED else None


def raise_pending() -> None:
    """Raise the interrupt of the first recorded signal, if any; called at every
    training step. Cheap: a list's truth test when nothing was received.

    Raises:
        Terminated: SIGTERM was recorded.
        KeyboardInterrupt: SIGINT was recorded.
    """
    if _RECEIVED:
        raise Terminated() if _RECEIVED[0] == signal.SIGTERM else KeyboardInterrupt()
