"""The psfleet error hierarchy, grouped by what the caller should do.

- :class:`ConfigError`: the input is wrong (a config key, an environment variable,
  a data file); fix it and run again. Retrying does not help.
- :class:`RetryableError`: a transient failure (a server not reachable yet, a
  deadline); the same call may succeed later. Callers retry with backoff.
- :class:`FatalError`: the job cannot continue (a server never came up, a child
  process died); give up and report.

Every exception here pickles (it may cross a process boundary) because each keeps
its whole message in ``args``. A message quotes a request's text (a name, a config)
through :func:`clip_text`, so one long value cannot make it unbounded.
"""

from __future__ import annotations

__all__ = [
    "PsfleetError",
    "ConfigError",
    "ParserConfigError",
    "DataError",
    "RetryableError",
    "RpcError",
    "ServerUnavailableError",
    "MovedError",
    "ServerNotReadyError",
    "FatalError",
    "RemoteError",
    "LaunchError",
    "InvalidRequestError",
    "ResourceExhaustedError",
    "clip_text",
    "MAX_ECHO_CHARS",
]

#: Characters of a request's text (a name) an error message quotes at most.
MAX_ECHO_CHARS = 200


class PsfleetError(Exception):
    """Base class of every error psfleet raises on purpose."""


class ConfigError(PsfleetError, ValueError):
    """A configuration value, environment variable or argument is invalid.

    The message names the field path (``runner.sync_mode``), the offending value
    and the allowed values.
    """


class ParserConfigError(ConfigError):
    """A parser's own config key does not fit a data file (a column the file lacks).

    The message starts with the key's path within the parser's config section
    (``columns.sparse[1]: 'devise' is not a column of ...``): the caller knows the
    section and names it whole (``runner.columns.sparse[1]``).
    """


class DataError(PsfleetError, ValueError):
    """A data file or directory is missing, empty or unreadable (names the file)."""


class RetryableError(PsfleetError):
    """A transient failure: the same call may succeed later."""


class RpcError(RetryableError):
    """A remote call failed after its retries (names the endpoint and method)."""


class ServerUnavailableError(RpcError):
    """A server could not be reached through every retry (not up, connection refused or
    reset): it may be dead (``psfleet.ps.replica`` then fails it over)."""


class MovedError(RetryableError):
    """The server called no longer serves the share the call is for (a fail-over, or a
    restarted server took its share back); the caller learns the share map again and
    calls the share's primary (``psfleet.ps.replica``)."""


class FatalError(PsfleetError):
    """The job cannot continue; the message says which part failed."""


class ServerNotReadyError(FatalError):
    """Servers did not become ready within the wait timeout (lists the endpoints)."""


class RemoteError(FatalError):
    """A server rejected a request (bad table id, shape mismatch); not retried."""


class LaunchError(FatalError):
    """A process started by the launcher failed (names the role, index and log)."""


class InvalidRequestError(ConfigError, RemoteError):
    """A server rejected a request as malformed or outside its limits (a buffer of the
    wrong length, an unknown push mode, a dim above the server's cap, non-finite
    gradients). Sent as gRPC INVALID_ARGUMENT; fix the caller, do not retry.

    Both a :class:`ConfigError` (the input is wrong) and a :class:`RemoteError` (the
    server said no), so callers catching either see it.
    """


class ResourceExhaustedError(FatalError):
    """A server ran out of memory on a request, or a message exceeded the size limit
    (gRPC RESOURCE_EXHAUSTED). The message names the table and its size; its rows and
    index stay whole. Give the server more memory, or send smaller requests."""


def clip_text(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` when at most ``limit`` characters, else its first ``limit`` characters,
    ``...`` and its length, for quoting a request's text in an error message.

    Example: ``clip_text("x" * 300, 4) == "xxxx... (300 characters)"``.
    """
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
