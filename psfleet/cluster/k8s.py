"""Kubernetes manifests for a parameter-server job (``psfleet k8s render``).

One multi-document YAML with, for a job named ``NAME``:

- ``ConfigMap NAME-config``: the YAML config, mounted at ``<workdir>/config.yaml``
  (``subPath``), so its relative paths resolve inside the image as beside the file;
- ``Secret NAME-auth``: a random ``PSFLEET_AUTH_TOKEN`` (servers bind the pod's
  address, which needs a token; ``--auth-secret`` names an existing Secret instead);
- ``Service NAME-server``: headless, so server ``i`` is the stable DNS name
  ``NAME-server-<i>.NAME-server``; ``publishNotReadyAddresses`` lets the names resolve
  while the servers start (the workers wait for their health service themselves);
- ``StatefulSet NAME-server``: ``cluster.server_num`` pods, started in parallel. Server
  ``i`` gets ``PSFLEET_SERVER_INDEX`` from the pod-index label (Kubernetes >= 1.28)
  and binds ``POD_IP:PORT``. Readiness and liveness are gRPC probes of psfleet's
  standard health service;
- ``Job NAME-worker``: an Indexed Job of ``cluster.worker_num`` completions; the
  completion index is ``PADDLE_TRAINER_ID``.

Every process runs ``psfleet train -m <workdir>/config.yaml`` with the seeds' role
variables, exactly what ``fleetrun`` gives it (:mod:`psfleet.launch.specs`), plus
``PADDLE_PSERVERS_IP_PORT_LIST`` of the DNS names.

Restarts are wired to psfleet's recovery: a container counts its starts in an
``emptyDir`` (which survives container restarts) and runs with
``PSFLEET_RESTART_NUM`` = the starts before it, as ``fleetrun --max_restarts`` does. A
restarted server (a crash, an OOM kill, a failed liveness probe) therefore re-creates
its tables from the newest checkpoint in ``runner.checkpoint.checkpoint_dir`` and a
restarted worker rejoins from its cursor (docs/checkpoints.md). That directory must be
a volume every pod mounts (``--volume CLAIM:PATH``) or an fsspec URL. Workers restart
in place (``restartPolicy: OnFailure``) up to ``cluster.max_restarts`` times per
worker (the Job's ``backoffLimit`` is that times the worker count). A server whose
process ended cleanly (the workers finished) runs
:mod:`psfleet.rpc.health_only` until the job is deleted, since a StatefulSet restarts
every container that exits.
"""

from __future__ import annotations

import posixpath
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import yaml

from psfleet.cluster.job import CONFIG_NAME, ClusterJob
from psfleet.errors import ConfigError
from psfleet.rec.cluster_config import PodResources
from psfleet.types import Role

__all__ = ["K8sOptions", "Volume", "parse_volume", "render_manifests", "manifests_yaml"]

#: The image's working directory (the Dockerfile's WORKDIR): ``--workdir``'s default.
IMAGE_WORKDIR = "/workspace"
#: Where a container keeps its start count (an emptyDir).
STATE_DIR = "/var/run/psfleet"
#: The pod-index label of StatefulSet pods (Kubernetes >= 1.28).
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
#: The completion-index annotation of Indexed Job pods.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
_TOKEN_KEY = "token"
#: Each role's name in object names, labels and container names.
_COMPONENT = {Role.SERVER: "server", Role.WORKER: "worker"}


@dataclass(frozen=True)
class Volume:
    """An existing PersistentVolumeClaim mounted into every pod.

    Attributes:
        claim: the claim's name.
        mount_path: where it appears in the containers (absolute).
    """

    claim: str
    mount_path: str

    @property
    def name(self) -> str:
        """The volume's name in the pod spec."""
        return f"vol-{self.claim}"[:63].rstrip("-")


def parse_volume(text: str) -> Volume:
    """``CLAIM:/mount/path`` -> :class:`Volume`.

    Raises:
        ConfigError: not of that form (names ``--volume`` and the value).
    """
    claim, sep, path = text.partition(":")
    if not sep or not claim or not PurePosixPath(path).is_absolute():
        raise ConfigError(f"--volume: {text!r} is not CLAIM:/absolute/mount/path (an "
                          "existing PersistentVolumeClaim and where to mount it)")
    return Volume(claim, path.rstrip("/") or "/")


@dataclass(frozen=True)
class K8sOptions:
    """How the job runs on Kubernetes.

    Attributes:
        image: the container image holding psfleet and the job's data or code
            (required; see the project's Dockerfile).
        namespace: the objects' namespace (None: kubectl's current one).
        volumes: claims mounted into every pod; the checkpoint folder must be on one.
        auth_secret: an existing Secret whose ``token`` key is the job's auth token;
            None: the manifests carry a new random one.
    """

    image: str
    namespace: str | None = None
    volumes: tuple[Volume, ...] = field(default=())
    auth_secret: str | None = None


def _on_volume(path: str, volumes: Sequence[Volume]) -> bool:
    return any(PurePosixPath(path).is_relative_to(v.mount_path) for v in volumes)


def check_storage(job: ClusterJob, options: K8sOptions) -> list[str]:
    """Check where the job keeps state across pods; returns notes for the user.

    Raises:
        ConfigError: ``runner.checkpoint.checkpoint_dir`` is a local path on no
            ``--volume`` (a restarted server could not read it).
    """
    notes = []
    checkpoint = job.checkpoint_dir
    if checkpoint is None:
        notes.append("runner.checkpoint is not set: a restarted server starts with no "
                     "tables and the job fails; set it to recover (docs/cluster.md)")
    elif "://" not in checkpoint and not _on_volume(checkpoint, options.volumes):
        raise ConfigError(
            f"runner.checkpoint.checkpoint_dir: {checkpoint} (in the container) is on no "
            "shared volume, so a restarted server could not read it: mount one there "
            f"(--volume CLAIM:{checkpoint}) or use an fsspec URL (s3://...)")
    runner = job.config.runner
    run_dir = str(runner.model_save_path)
    if "://" not in run_dir and not _on_volume(run_dir, options.volumes):
        notes.append(f"runner.model_save_path {run_dir} is on no --volume: the run folder "
                     "(metrics.json, the exported model) is lost with worker 0's pod")
    for key in ("train_data_dir", "test_data_dir", "valid_data_dir"):
        value = getattr(runner, key)
        paths = [posixpath.normpath(str(p)) for p in
                 (value if isinstance(value, list) else [value]) if p is not None]
        local = [p for p in paths if "://" not in p and not _on_volume(p, options.volumes)]
        if local:
            notes.append(f"runner.{key} {', '.join(local)} is on no --volume: it must be in "
                         "the image (build one FROM psfleet's, see the Dockerfile)")
    return notes


def _labels(job: ClusterJob, role: Role | None = None) -> dict[str, str]:
    labels = {"app.kubernetes.io/name": "psfleet", "app.kubernetes.io/instance": job.name}
    if role is not None:
        labels["app.kubernetes.io/component"] = _COMPONENT[role]
    return labels


def _meta(job: ClusterJob, options: K8sOptions, name: str,
          role: Role | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": _labels(job, role)}
    if options.namespace is not None:
        meta["namespace"] = options.namespace
    return meta


def server_endpoints(job: ClusterJob) -> list[str]:
    """Every server's stable ``host:port``: ``NAME-server-<i>.NAME-server:PORT``."""
    return [f"{job.name}-server-{i}.{job.name}-server:{job.port}"
            for i in range(job.server_num)]


def _field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def _env(job: ClusterJob, options: K8sOptions, role: Role) -> list[dict[str, Any]]:
    paddle = Role.SERVER.paddle_name if role is Role.SERVER else Role.WORKER.paddle_name
    secret = options.auth_secret or f"{job.name}-auth"
    env: list[dict[str, Any]] = [
        {"name": "TRAINING_ROLE", "value": paddle},
        {"name": "PADDLE_TRAINING_ROLE", "value": paddle},
        {"name": "PADDLE_PSERVERS_IP_PORT_LIST", "value": ",".join(server_endpoints(job))},
        {"name": "PADDLE_TRAINERS_NUM", "value": str(job.worker_num)},
        {"name": "POD_IP", **_field("status.podIP")},
        {"name": "PADDLE_CURRENT_IP", **_field("status.podIP")},
        {"name": "PSFLEET_AUTH_TOKEN",
         "valueFrom": {"secretKeyRef": {"name": secret, "key": _TOKEN_KEY}}},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if role is Role.SERVER:
        env += [{"name": "PADDLE_PORT", "value": str(job.port)},
                {"name": "PSFLEET_SERVER_INDEX",
                 **_field(f"metadata.labels['{POD_INDEX_LABEL}']")}]
    else:
        env.append({"name": "PADDLE_TRAINER_ID",
                    **_field(f"metadata.annotations['{COMPLETION_INDEX}']")})
    if job.config.cluster.max_restarts > 0:  # as fleetrun: keep retrying a restarting server
        env.append({"name": "PSFLEET_RPC_MAX_RETRIES", "value": "1000"})
    return env


def entry_script(job: ClusterJob, role: Role) -> str:
    """The container's shell command: count starts, run the role, and for a server
    that ended cleanly, answer health checks (see the module doc)."""
    train = shlex.join(job.train_argv())
    finished = f"{STATE_DIR}/finished"
    health = f"python -m psfleet.rpc.health_only --port {job.port}"
    lines = [
        "set -e",
        *([f'if [ -f {finished} ]; then exec {health}; fi'] if role is Role.SERVER else []),
        f"starts=$(cat {STATE_DIR}/starts 2>/dev/null || echo 0)",
        f'echo $((starts + 1)) > {STATE_DIR}/starts',
        'export PSFLEET_RESTART_NUM="$starts"',
    ]
    if role is Role.SERVER:
        lines += [train, f"touch {finished}", f"exec {health}"]
    else:
        lines.append(f"exec {train}")
    return "\n".join(lines) + "\n"


def _resources(resources: PodResources) -> dict[str, Any]:
    amounts = {k: v for k, v in (("cpu", resources.cpu), ("memory", resources.memory))
               if v is not None}
    limits: dict[str, str | int] = dict(amounts)
    if resources.gpu:
        limits["nvidia.com/gpu"] = resources.gpu
    out: dict[str, Any] = {}
    if amounts:
        out["requests"] = amounts
    if limits:
        out["limits"] = limits
    return out


def _pod_spec(job: ClusterJob, options: K8sOptions, role: Role) -> dict[str, Any]:
    resources = job.config.cluster.resources
    container: dict[str, Any] = {
        "name": _COMPONENT[role],
        "image": options.image,
        "workingDir": job.workdir,
        "command": ["/bin/sh", "-c", entry_script(job, role)],
        "env": _env(job, options, role),
        "volumeMounts": [
            {"name": "config", "mountPath": str(PurePosixPath(job.workdir) / CONFIG_NAME),
             "subPath": CONFIG_NAME, "readOnly": True},
            {"name": "state", "mountPath": STATE_DIR},
            *({"name": v.name, "mountPath": v.mount_path} for v in options.volumes),
        ],
        "resources": _resources(resources.server if role is Role.SERVER else resources.worker),
    }
    if role is Role.SERVER:
        container["ports"] = [{"name": "grpc", "containerPort": job.port}]
        probe = {"grpc": {"port": job.port}, "periodSeconds": 10, "timeoutSeconds": 5}
        container["readinessProbe"] = {**probe, "failureThreshold": 3}
        # Loading a large checkpoint takes a while: a startup probe guards it.
        container["startupProbe"] = {**probe, "failureThreshold": 60}
        container["livenessProbe"] = {**probe, "failureThreshold": 6}
    return {
        "restartPolicy": "Always" if role is Role.SERVER else "OnFailure",
        "containers": [container],
        "volumes": [
            {"name": "config", "configMap": {"name": f"{job.name}-config"}},
            {"name": "state", "emptyDir": {}},
            *({"name": v.name, "persistentVolumeClaim": {"claimName": v.claim}}
              for v in options.volumes),
        ],
    }


def render_manifests(job: ClusterJob, options: K8sOptions) -> list[dict[str, Any]]:
    """The job's objects, in the order ``kubectl apply`` should create them.

    Raises:
        ConfigError: see :func:`check_storage`; a volume mounted twice or over the
            config file.
    """
    paths = [v.mount_path for v in options.volumes]
    if len(set(paths)) != len(paths) or len({v.claim for v in options.volumes}) != len(paths):
        raise ConfigError(f"--volume: each claim and mount path once, got {paths}")
    check_storage(job, options)
    server_labels = _labels(job, Role.SERVER)
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": _meta(job, options, f"{job.name}-config"),
         "data": {CONFIG_NAME: job.config_text}},
    ]
    if options.auth_secret is None:
        docs.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                     "metadata": _meta(job, options, f"{job.name}-auth"),
                     "stringData": {_TOKEN_KEY: secrets.token_hex(32)}})
    docs += [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": _meta(job, options, f"{job.name}-server", Role.SERVER),
         "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                  "selector": server_labels,
                  "ports": [{"name": "grpc", "port": job.port, "targetPort": job.port}]}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet",
         "metadata": _meta(job, options, f"{job.name}-server", Role.SERVER),
         "spec": {"serviceName": f"{job.name}-server", "replicas": job.server_num,
                  "podManagementPolicy": "Parallel",
                  "selector": {"matchLabels": server_labels},
                  "template": {"metadata": {"labels": server_labels},
                               "spec": _pod_spec(job, options, Role.SERVER)}}},
        {"apiVersion": "batch/v1", "kind": "Job",
         "metadata": _meta(job, options, f"{job.name}-worker", Role.WORKER),
         "spec": {"completionMode": "Indexed", "completions": job.worker_num,
                  "parallelism": job.worker_num,
                  "backoffLimit": job.config.cluster.max_restarts * job.worker_num,
                  "template": {"metadata": {"labels": _labels(job, Role.WORKER)},
                               "spec": _pod_spec(job, options, Role.WORKER)}}},
    ]
    return docs


class _Dumper(yaml.SafeDumper):
    """No anchors (a reader sees every probe whole); multi-line strings as ``|``."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def manifests_yaml(docs: Sequence[dict[str, Any]]) -> str:
    """The objects as one multi-document YAML (``kubectl apply -f``)."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                         width=100)
