"""What the launcher adds to every child's environment so the job's servers are protected.

:func:`prepare_security` runs before any child starts and returns a
:class:`JobSecurity`:

- **Token.** ``PSFLEET_AUTH_TOKEN`` from fleetrun's environment, or, when unset, a new
  random one (``secrets.token_urlsafe(32)``) for this job. It reaches the children in
  their environment only (never on a command line, never in a log line) and, while the
  job runs, ``<log_dir>/.auth_token`` (mode 0600) for tools of the same user such as
  ``psfleet status``. A job that is not wholly on this node (``--servers`` /
  ``--workers`` naming processes of other nodes) cannot share a token made here: without
  ``PSFLEET_AUTH_TOKEN`` it is a ConfigError before anything starts, saying to export
  the same value on every node.
- **Storage roots.** ``PSFLEET_STORAGE_ROOTS``: when unset, fleetrun's working folder
  and ``--log_dir``; when set, as given. The caller's own folders (``psfleet train``: its
  model and checkpoint folders) are added either way.
- **TLS.** ``tls="self-signed"`` (``fleetrun --tls self-signed``) writes a key (mode
  0600) and a certificate for 127.0.0.1 / localhost to ``<log_dir>/tls/`` and sets
  ``PSFLEET_TLS_CERT``, ``PSFLEET_TLS_KEY`` and ``PSFLEET_TLS_CA``; one-host jobs only.
  Without it the children inherit any ``PSFLEET_TLS_*`` of fleetrun's environment.

docs/security.md gives the threat model.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from psfleet import env
from psfleet.errors import ConfigError
from psfleet.launch.cluster import JobLayout
from psfleet.launch.tls import write_self_signed_pair
from psfleet.launch.types import LaunchConfig
from psfleet.rpc.tls import TLS_VARIABLES, TlsConfig
from psfleet.rpc.types import RpcConfig

__all__ = ["JobSecurity", "prepare_security", "job_client_config", "TLS_MODES",
           "TOKEN_FILE_NAME", "TLS_DIR_NAME"]

logger = logging.getLogger(__name__)

#: Values of ``fleetrun --tls``.
TLS_MODES = ("self-signed",)
TOKEN_FILE_NAME = ".auth_token"
TLS_DIR_NAME = "tls"


@dataclass(frozen=True)
class JobSecurity:
    """The variables a job's children get on top of fleetrun's environment.

    Attributes:
        env: variables to set in every child (the token among them: not in the repr).
        token_file: ``<log_dir>/.auth_token`` when the token was generated here
            (removed by :meth:`cleanup`), else None.
    """

    env: Mapping[str, str] = field(repr=False)
    token_file: Path | None = None

    def child_environ(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """``environ`` (``os.environ`` when None) with :attr:`env` set over it."""
        return {**(os.environ if environ is None else environ), **self.env}

    def cleanup(self) -> None:
        """Remove the token file (the job is over: nothing accepts the token any more)."""
        if self.token_file is not None:
            self.token_file.unlink(missing_ok=True)


def _whole_job_here(layout: JobLayout) -> bool:
    return (len(layout.local_servers) == len(layout.servers)
            and len(layout.local_workers) == len(layout.workers))


def _write_token_file(path: Path, token: str) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")


def _storage_roots(config: LaunchConfig, extra: Sequence[str | Path],
                   environ: Mapping[str, str]) -> str:
    given = env.list_var(environ, "PSFLEET_STORAGE_ROOTS")
    roots = list(given) if given else [os.getcwd(), str(config.log_dir)]
    for root in map(str, extra):
        if root not in roots:
            roots.append(root)
    bad = [r for r in roots if "," in r]
    if bad:
        raise ConfigError(f"PSFLEET_STORAGE_ROOTS: {bad[0]!r} holds a comma, which separates "
                          "roots; use a folder whose path has none")
    return ",".join(roots)


def prepare_security(config: LaunchConfig, layout: JobLayout, *, tls: str | None = None,
                     storage_roots: Sequence[str | Path] = (),
                     environ: Mapping[str, str] | None = None) -> JobSecurity:
    """Decide the job's token, storage roots and TLS files; write the files it needs.

    Call after ``config.log_dir`` exists and before any child starts.

    Args:
        config: the job (its ``log_dir`` receives the token file and TLS files).
        layout: the job's layout (is all of it on this node?).
        tls: None (inherit ``PSFLEET_TLS_*``) or ``"self-signed"``.
        storage_roots: folders Save/Load must reach besides the defaults (paths or
            fsspec URL prefixes), e.g. the job's model and checkpoint folders.
        environ: fleetrun's environment; ``os.environ`` when None.

    Raises:
        ConfigError: a job spanning nodes without ``PSFLEET_AUTH_TOKEN``; ``tls``
            unknown, or self-signed for a job spanning nodes or with ``PSFLEET_TLS_*``
            also set; a storage root holding a comma.
        OSError: a file cannot be written to ``log_dir``.
    """
    source = os.environ if environ is None else environ
    whole = _whole_job_here(layout)
    if tls is not None and tls not in TLS_MODES:
        raise ConfigError(f"--tls: {tls!r} is not one of {list(TLS_MODES)}; without --tls "
                          "the PSFLEET_TLS_* variables of the environment apply")
    added: dict[str, str] = {"PSFLEET_STORAGE_ROOTS": _storage_roots(config, storage_roots,
                                                                     source)}
    token_file: Path | None = None
    if env.read("PSFLEET_AUTH_TOKEN", source) is None:
        if not whole:
            raise ConfigError(
                "PSFLEET_AUTH_TOKEN is not set, and this job has processes on other nodes, "
                "which must all use the same token. Make one and export it on every node "
                "before fleetrun: export PSFLEET_AUTH_TOKEN=$(python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))') (docs/security.md). Nothing was started.")
        token = secrets.token_urlsafe(32)
        added["PSFLEET_AUTH_TOKEN"] = token
        token_file = config.log_dir / TOKEN_FILE_NAME
        _write_token_file(token_file, token)
        logger.info("generated this job's auth token (in the children's environment, and "
                    "in %s while the job runs)", token_file)
    if tls == "self-signed":
        inherited = [v for v in TLS_VARIABLES if env.read(v, source) is not None]
        if inherited:
            raise ConfigError(f"--tls self-signed: {inherited[0]} is also set; give "
                              "either your own TLS files (PSFLEET_TLS_*) or --tls self-signed")
        if not whole:
            raise ConfigError("--tls self-signed: only for a job wholly on this host (its "
                              "certificate names 127.0.0.1 and localhost); across nodes give "
                              "every node the same PSFLEET_TLS_CERT/KEY/CA (docs/security.md)")
        pair = write_self_signed_pair(config.log_dir / TLS_DIR_NAME)
        added.update(PSFLEET_TLS_CERT=str(pair.cert), PSFLEET_TLS_KEY=str(pair.key),
                     PSFLEET_TLS_CA=str(pair.cert))
        logger.info("TLS: self-signed certificate %s (key %s, mode 0600)", pair.cert, pair.key)
    return JobSecurity(added, token_file)


def job_client_config(log_dir: Path, config: RpcConfig) -> RpcConfig:
    """``config`` completed from a running job's log folder, for a client of the same
    user (``psfleet status LOG_DIR``): the generated token (``.auth_token``) when
    ``config`` has none, and the self-signed certificate as the CA (``tls/cert.pem``)
    when ``config`` has no TLS. Missing files leave ``config`` as it is.

    Raises:
        OSError: a file exists but cannot be read (e.g. another user's job).
    """
    token_file = log_dir / TOKEN_FILE_NAME
    if config.auth_token is None and token_file.is_file():
        config = dataclasses.replace(config, auth_token=token_file.read_text().strip())
    cert = log_dir / TLS_DIR_NAME / "cert.pem"
    if config.tls is None and cert.is_file():
        config = dataclasses.replace(config, tls=TlsConfig(ca=str(cert)))
    return config
