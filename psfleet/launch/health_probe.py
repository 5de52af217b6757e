"""The launcher's health-check helper process: asks servers' gRPC health service.

The launcher forks its children (``subprocess`` with a ``preexec_fn``); a process
that forks while gRPC threads are inside a call can crash the new child in gRPC's
fork handlers (seen: ``Check failed: next_worker->state == KICKED``, SIGABRT). So
the launcher itself never calls gRPC: :class:`~psfleet.launch.health.HealthMonitor`
starts this helper once (``python -m psfleet.launch.health_probe``) and talks to it
over pipes, one line per message:

- stdin, from the launcher: ``watch PID HOST:PORT`` (check that server every
  interval until told otherwise) and ``forget PID``; end of input: exit.
- stdout, to the launcher: ``skip PID`` when the server does not speak gRPC (it
  sends no HTTP/2 SETTINGS frame on a new connection, three connections in a row;
  :func:`speaks_http2`): it is then never sent a request. ``ok PID`` after each
  check that shows the server is not hung: a SERVING answer, or a quick NOT_SERVING
  or refused connection (a server shutting down or not listening yet). Only a check
  that gets nothing within its timeout (the server accepted the connection but does
  not answer: SIGSTOP, every handler thread stuck) is silence.

Each watched server is checked from its own thread, so a hung server does not delay
the checks of the others. The helper gets the children's environment, so it speaks
TLS exactly as the job's clients do (``PSFLEET_TLS_*``); health checks need no token.
It dies with the launcher (parent-death signal, and the end of its stdin).

Usage: ``python -m psfleet.launch.health_probe --interval_s I --call_timeout_s C``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

from psfleet import env
from psfleet.rpc.client import RpcClient
from psfleet.rpc.tls import TLS_VARIABLES, TlsConfig
from psfleet.rpc.types import RpcConfig

__all__ = ["client_config", "main", "speaks_http2"]

_QUICK_FRACTION = 0.5
_PREFACE_WAIT_S = 1.0
#: Times in a row a server must send no HTTP/2 greeting before it is taken for one that
#: does not speak gRPC: a starved gRPC server can miss one wait (seen on a loaded CI
#: machine), and a server taken for silent is never health-checked.
_SILENT_VERDICTS = 3
_FRAME_HEADER_BYTES = 9
_SETTINGS_FRAME = 4


def client_config(environ: Mapping[str, str] | None, call_timeout_s: float) -> RpcConfig:
    """The RpcConfig of a health client that speaks the job's protocol (TLS or not).

    Raises:
        ConfigError: the TLS variables do not go together (names them).
    """
    values = [env.read(name, environ) for name in TLS_VARIABLES]
    tls = None if all(v is None for v in values) else TlsConfig(*values)
    return RpcConfig(deadline_s=call_timeout_s, max_retries=0, tls=tls)


def speaks_http2(endpoint: str, wait_s: float) -> bool | None:
    """Whether the server at ``endpoint`` speaks HTTP/2 (gRPC), asked without sending
    it a byte: an HTTP/2 server sends its SETTINGS frame (type 4) as soon as a
    connection is accepted (RFC 9113, 3.4), gRPC's at once. None when nothing listens
    there (yet); False when it accepts but sends no SETTINGS within ``wait_s`` (not a
    gRPC server, e.g. a test's stand-in, which must not be sent HTTP/2 bytes; or a
    stopped one, which the process-state check finds).
    """
    host, _, port = endpoint.rpartition(":")
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=wait_s)
    except OSError:
        return None
    with conn:
        conn.settimeout(wait_s)
        try:
            header = conn.recv(_FRAME_HEADER_BYTES)
        except OSError:
            return False
    return len(header) >= 4 and header[3] == _SETTINGS_FRAME


class _Prober:
    """The watched servers' check threads and the shared, locked output."""

    def __init__(self, out: TextIO, interval_s: float, call_timeout_s: float) -> None:
        self._out = out
        self._out_lock = threading.Lock()
        self._interval_s = interval_s
        self._call_timeout_s = call_timeout_s
        self._config = client_config(None, call_timeout_s)
        self._stops: dict[int, threading.Event] = {}
        self._threads: list[threading.Thread] = []

    def watch(self, pid: int, endpoint: str) -> None:
        self.forget(pid)
        stop = threading.Event()
        self._stops[pid] = stop
        thread = threading.Thread(target=self._loop, args=(pid, endpoint, stop), daemon=True)
        self._threads.append(thread)
        thread.start()

    def forget(self, pid: int) -> None:
        stop = self._stops.pop(pid, None)
        if stop is not None:
            stop.set()

    def close(self) -> None:
        for stop in self._stops.values():
            stop.set()
        for thread in self._threads:
            thread.join(self._call_timeout_s + 1.0)

    def _say(self, line: str) -> bool:
        """Write one line to the launcher; False when it is gone."""
        with self._out_lock:
            try:
                self._out.write(line + "\n")
                self._out.flush()
            except (OSError, ValueError):
                return False
        return True

    def _loop(self, pid: int, endpoint: str, stop: threading.Event) -> None:
        tls = self._config.tls is not None and self._config.tls.dials_tls
        silent = 0
        while not tls and not stop.is_set():  # (TLS: a real psfleet server)
            speaks = speaks_http2(endpoint, min(self._call_timeout_s, _PREFACE_WAIT_S))
            if speaks:
                break
            silent = silent + 1 if speaks is False else 0
            if silent == _SILENT_VERDICTS:
                self._say(f"skip {pid}")
                return
            stop.wait(self._interval_s)  # not listening yet, or silent so far
        client = RpcClient(endpoint, self._config)
        try:
            while not stop.is_set():
                started = time.monotonic()
                serving = client.is_serving(self._call_timeout_s)
                # A quick "no" is an answer (NOT_SERVING while it shuts down) or a
                # refused connection (not listening: starting, or exiting): not a hang.
                # A hang is a call that gets nothing until its timeout (SIGSTOP, all
                # handler threads stuck).
                quick = time.monotonic() - started < _QUICK_FRACTION * self._call_timeout_s
                if (serving or quick) and not stop.is_set() and not self._say(f"ok {pid}"):
                    return
                stop.wait(self._interval_s)
        finally:
            client.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the launcher's watch/forget lines until stdin ends; 0 then, 2 on bad
    arguments or TLS variables (the message on stderr)."""
    parser = argparse.ArgumentParser(prog="python -m psfleet.launch.health_probe")
    parser.add_argument("--interval_s", type=float, required=True)
    parser.add_argument("--call_timeout_s", type=float, required=True)
    args = parser.parse_args(argv)
    try:
        prober = _Prober(sys.stdout, args.interval_s, args.call_timeout_s)
    except Exception as exc:  # noqa: BLE001 - said on stderr, the launcher logs it
        print(f"health probe: {exc}", file=sys.stderr)
        return 2
    for line in sys.stdin:
        words = line.split()
        if len(words) == 3 and words[0] == "watch" and words[1].isdigit():
            prober.watch(int(words[1]), words[2])
        elif len(words) == 2 and words[0] == "forget" and words[1].isdigit():
            prober.forget(int(words[1]))
    prober.close()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no wait for gRPC's own threads
