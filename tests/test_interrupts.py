"""A stop signal whose KeyboardInterrupt Python swallowed is still seen
(psfleet.interrupts): the training loop raises it at its next step."""

from __future__ import annotations

import gc
import os
import signal
import sys

import pytest

from psfleet import interrupts
from psfleet.cli.console import Terminated, received_signal, signals_interrupt

pytestmark = pytest.mark.unit


class _SignalledInFinalizer:
    """Sends SIGTERM to this process from ``__del__``: the handler's exception is raised
    inside the finalizer, where Python prints "Exception ignored" and drops it."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handler runs between bytecodes, here
            pass


def test_sigterm_swallowed_in_a_finalizer_is_raised_at_the_next_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    dropped: list[type[BaseException] | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: dropped.append(info.exc_type))
    with signals_interrupt():
        obj = _SignalledInFinalizer()
        del obj  # the interrupt is raised in __del__ and dropped by Python
        gc.collect()
        assert dropped == [Terminated]
        assert received_signal() == signal.SIGTERM
        with pytest.raises(Terminated):
            interrupts.raise_pending()  # what the training loop calls at every step
    interrupts.clear()
    interrupts.raise_pending()  # nothing recorded: nothing raised


def test_sigint_is_recorded_as_a_keyboard_interrupt() -> None:
    with signals_interrupt(), pytest.raises(KeyboardInterrupt) as raised:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
    assert not isinstance(raised.value, Terminated)
    assert received_signal() == signal.SIGINT
    with pytest.raises(KeyboardInterrupt) as again:
        interrupts.raise_pending()
    assert not isinstance(again.value, Terminated)
    interrupts.clear()
    assert interrupts.first() is None
