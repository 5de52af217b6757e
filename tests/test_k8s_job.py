"""The processes ``psfleet k8s render``'s manifests describe, run as a kubelet would.

No Kubernetes cluster runs here, so the test plays the cluster's part for the objects
the manifests hold, and nothing else:

- every pod (server ``i`` of the StatefulSet, completion ``j`` of the Indexed Job) is a
  network namespace on one bridge (``netns_hosts``) with its own address;
- the headless Service's DNS names ``NAME-server-<i>.NAME-server`` resolve to the
  server pods' addresses: ``/etc/netns/<ns>/hosts``, which ``ip netns exec`` mounts
  over ``/etc/hosts`` in that namespace;
- each container runs its manifest's ``command`` with its manifest's ``env``,
  resolving ``fieldRef`` (``status.podIP``, the pod-index label, the completion-index
  annotation) and ``secretKeyRef`` (the rendered Secret) as the kubelet does;
- volumes: the ConfigMap's ``config.yaml`` is written to the ``workingDir`` (the
  rendered ``--workdir``, a temp folder); the PersistentVolumeClaim is a shared temp
  folder at its mount path; the ``emptyDir`` of each pod is a folder bind-mounted at
  its mount path inside that pod's mount namespace (``ip netns exec`` makes one);
- ``restartPolicy``: a server container that exits is started again (``Always``), a
  worker container that fails is started again up to the Job's ``backoffLimit``.

The job is the shared Criteo sample on ``examples/criteo_dnn/config.yaml``, 2 servers x
2 workers. One test runs it undisturbed; one SIGKILLs a server mid-training and lets
the restart policy bring it back, which must recover its tables from the newest
checkpoint (``PSFLEET_RESTART_NUM`` from the emptyDir) for the job to finish.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from netns_hosts import Host, bridged_hosts

from psfleet.cluster.job import DEFAULT_PORT
from psfleet.cluster.k8s import COMPLETION_INDEX, POD_INDEX_LABEL, STATE_DIR

pytestmark = [pytest.mark.job, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "criteo_kaggle_sample"
CONFIG = REPO / "examples" / "criteo_dnn" / "config.yaml"
NAME = "ctr"
JOB_TIMEOUT_S = 240.0
PORT = DEFAULT_PORT  # every pod has its own address: the default port is free in each


@dataclass
class Container:
    """One pod's container as the kubelet runs it."""

    pod: str
    host: Host
    script: str
    env: dict[str, str]
    restart_policy: str
    state: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    exits: list[int] = field(default_factory=list)

    def start(self) -> None:
        # The emptyDir is mounted inside the pod's own mount namespace only.
        mount = 'mount --bind "$1" "$2" && exec /bin/sh -c "$3"'
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.host.ns, "/bin/sh", "-c", mount, "sh",
                 str(self.state), STATE_DIR, self.script],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)


def _value(item: dict[str, Any], pod_index: int, address: str,
           secrets_: dict[str, dict[str, str]]) -> str:
    """An env entry's value as the kubelet resolves it."""
    if "value" in item:
        return str(item["value"])
    source = item["valueFrom"]
    if "secretKeyRef" in source:
        ref = source["secretKeyRef"]
        return secrets_[ref["name"]][ref["key"]]
    path = source["fieldRef"]["fieldPath"]
    known = {"status.podIP": address,
             f"metadata.labels['{POD_INDEX_LABEL}']": str(pod_index),
             f"metadata.annotations['{COMPLETION_INDEX}']": str(pod_index)}
    return known[path]


class Kubelet:
    """Runs the pods of rendered manifests in network namespaces (see module doc)."""

    def __init__(self, docs: list[dict[str, Any]], hosts: list[Host], root: Path) -> None:
        by_kind = {d["kind"]: d for d in docs}
        config_map, statefulset, job = (by_kind["ConfigMap"], by_kind["StatefulSet"],
                                        by_kind["Job"])
        secrets_ = {d["metadata"]["name"]: d["stringData"] for d in docs
                    if d["kind"] == "Secret"}
        self.backoff_limit = job["spec"]["backoffLimit"]
        servers = statefulset["spec"]["replicas"]
        workers = job["spec"]["completions"]
        assert len(hosts) == servers + workers
        self.servers: list[Container] = []
        self.workers: list[Container] = []
        self.etc = [Path("/etc/netns") / h.ns for h in hosts]
        service = statefulset["spec"]["serviceName"]
        names = "".join(f"{hosts[i].address} {statefulset['metadata']['name']}-{i}.{service}\n"
                        for i in range(servers))
        for folder in self.etc:
            folder.mkdir(parents=True)
            (folder / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
        base = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                "HOME": str(root), "LANG": "C.UTF-8"}
        for spec, count, out, offset in ((statefulset, servers, self.servers, 0),
                                         (job, workers, self.workers, servers)):
            pod_spec = spec["spec"]["template"]["spec"]
            (container,) = pod_spec["containers"]
            for index in range(count):
                host = hosts[offset + index]
                mounts = {m["name"]: m for m in container["volumeMounts"]}
                workdir = Path(container["workingDir"])
                workdir.mkdir(parents=True, exist_ok=True)
                key = mounts["config"]["subPath"]
                (workdir / key).write_text(config_map["data"][key])
                for volume in pod_spec["volumes"]:
                    if "persistentVolumeClaim" in volume:
                        Path(mounts[volume["name"]]["mountPath"]).mkdir(exist_ok=True)
                pod = f"{spec['metadata']['name']}-{index}"
                state = root / pod / "emptydir"
                state.mkdir(parents=True)
                env = {**base, **{e["name"]: _value(e, index, host.address, secrets_)
                                  for e in container["env"]}}
                script = f"cd {workdir}\n{container['command'][2]}"
                assert container["command"][:2] == ["/bin/sh", "-c"]
                out.append(Container(pod, host, script, env, pod_spec["restartPolicy"],
                                     state, root / f"{pod}.log"))

    @property
    def containers(self) -> list[Container]:
        return [*self.servers, *self.workers]

    def logs(self) -> str:
        return "\n".join(f"--- {c.pod} (starts {c.starts}, exits {c.exits})\n"
                         f"{c.log.read_text(errors='replace')[-2500:]}"
                         for c in self.containers if c.log.exists())

    def sync(self) -> None:
        """One pass of the kubelet's loop: restart what the restart policy says."""
        restarts = sum(c.starts - 1 for c in self.workers)
        for c in self.containers:
            if c.proc is None or c.proc.poll() is None:
                continue
            if len(c.exits) < c.starts:
                c.exits.append(c.proc.returncode)
            code = c.exits[-1]
            if c.restart_policy == "Always" or (code != 0 and restarts < self.backoff_limit):
                if c.restart_policy != "Always":
                    restarts += 1
                time.sleep(0.5)  # the kubelet's back-off
                c.start()

    def job_state(self) -> str:
        """``Complete`` when every worker exited 0, ``Failed`` past the back-off limit,
        else ``Running`` (the Job controller's view)."""
        done = [c.proc is not None and c.proc.poll() == 0 for c in self.workers]
        failed = sum(1 for c in self.workers for code in c.exits if code != 0)
        if all(done):
            return "Complete"
        return "Failed" if failed > self.backoff_limit else "Running"

    def stop(self) -> None:
        for c in self.containers:
            c.kill(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for c in self.containers:
            if c.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                c.kill()
                c.proc.wait()
        for folder in self.etc:
            shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def state_mount_point() -> Iterator[None]:
    """The emptyDir's mount path must exist to be mounted over (removed if made here)."""
    path = Path(STATE_DIR)
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield
    finally:
        if made:
            with contextlib.suppress(OSError):
                path.rmdir()


def _render(tmp_path: Path, *overrides: str) -> list[dict[str, Any]]:
    claim = tmp_path / "claim"
    argv = [sys.executable, "-m", "psfleet.cli.main", "k8s", "render", "-m", str(CONFIG),
            "--image", "psfleet:test", "--name", NAME, "--workdir", str(tmp_path / "workspace"),
            "--volume", f"data:{claim}",
            "-o", f"runner.train_data_dir={DATA / 'train.csv'}",
            "-o", f"runner.test_data_dir={DATA / 'test.csv'}",
            "-o", f"runner.model_save_path={claim / 'runs'}",
            "-o", "cluster.server_num=2", "-o", "cluster.worker_num=2",
            "-o", "runner.print_interval=1000", *overrides]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return list(yaml.safe_load_all(done.stdout))


def _healthy(address: str, ns: str, within_s: float = 15.0) -> bool:
    """Whether the server pod answers gRPC health checks SERVING within ``within_s``,
    asked from inside its namespace (as the kubelet's gRPC probe does)."""
    probe = ("import sys, time; from psfleet.rpc.client import RpcClient; "
             "from psfleet.rpc.types import RpcConfig; "
             f"c = RpcClient({address!r}, RpcConfig()); end = time.monotonic() + {within_s}\n"
             "while time.monotonic() < end:\n"
             "    if c.is_serving(1.0): sys.exit(0)\n"
             "    time.sleep(0.2)\n"
             "sys.exit(1)")
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", probe],
                          timeout=within_s + 30, capture_output=True).returncode == 0


def _trained_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` holds a complete checkpoint written after step 0."""
    return any(re.fullmatch(r"ckpt-\d+-step([1-9]\d*)", p.name) for p in folder.iterdir())


def _run(kubelet: Kubelet, kill_server_when: Path | None = None) -> float:
    """Start every pod, run the kubelet loop until the Job completes; returns seconds.
    With ``kill_server_when``, SIGKILL server 1 once that checkpoint folder holds a
    checkpoint of trained rows."""
    started = time.monotonic()
    for c in kubelet.containers:
        c.start()
    killed = False
    while (state := kubelet.job_state()) == "Running":
        if time.monotonic() - started > JOB_TIMEOUT_S:
            pytest.fail(f"the job did not finish in {JOB_TIMEOUT_S} s\n{kubelet.logs()}")
        if kill_server_when is not None and not killed and _trained_checkpoint(kill_server_when):
            kubelet.servers[1].kill()
            killed = True
        kubelet.sync()
        time.sleep(0.2)
    assert state == "Complete", kubelet.logs()
    return time.monotonic() - started


def _metrics(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "claim" / "runs" / NAME / "metrics.json").read_text())


def test_rendered_2x2_job_trains_to_the_end(tmp_path: Path) -> None:
    docs = _render(tmp_path, "-o", "runner.epochs=1")
    with state_mount_point(), bridged_hosts(4) as hosts:
        kubelet = Kubelet(docs, hosts, tmp_path)
        try:
            elapsed = _run(kubelet)
            # The workers finished and stopped the servers: each server container ran
            # its role once, ended cleanly, and now answers health checks (SERVING), so
            # neither probe restarts it into a server reloading its tables.
            for c in kubelet.servers:
                assert (c.state / "finished").is_file(), kubelet.logs()
                assert c.starts == 1 and c.proc is not None and c.proc.poll() is None
                assert _healthy(f"{c.host.address}:{PORT}", c.host.ns)
            logs = kubelet.logs()
        finally:
            kubelet.stop()
    assert [c.starts for c in kubelet.workers] == [1, 1], logs
    metrics = _metrics(tmp_path)
    assert metrics["test"]["auc"] > 0.6, metrics
    assert (metrics["server_num"], metrics["worker_num"]) == (2, 2), metrics
    assert metrics["epochs"][0]["examples"] == 3600, metrics  # worker 0's half of 7,200
    # Each server bound its pod's own address (the workers found it by its DNS name).
    for c in kubelet.servers:
        assert f"Server listening on {c.host.address}:{PORT}" in c.log.read_text(), logs
    print(f"the rendered 2x2 job took {elapsed:.1f} s")


def test_a_killed_server_is_restarted_and_recovers_from_the_checkpoint(
        tmp_path: Path) -> None:
    checkpoints = tmp_path / "claim" / "ckpt"
    checkpoints.mkdir(parents=True)
    docs = _render(tmp_path, "-o", "runner.epochs=2",
                   "-o", f"runner.checkpoint.checkpoint_dir={checkpoints}",
                   "-o", "runner.checkpoint.step_interval=10",
                   "-o", "cluster.max_restarts=2")
    with state_mount_point(), bridged_hosts(4) as hosts:
        kubelet = Kubelet(docs, hosts, tmp_path)
        try:
            _run(kubelet, kill_server_when=checkpoints)
            logs = kubelet.logs()
        finally:
            kubelet.stop()
    killed = kubelet.servers[1]
    assert killed.exits[0] == -signal.SIGKILL, logs
    assert killed.starts == 2, logs  # restarted once, by the restart policy
    recovered = re.search(r"restart: server 1 of 2 recovered 2 tables from checkpoint "
                          r"\S+ckpt-\d+-step(\d+)", killed.log.read_text())
    assert recovered is not None and int(recovered.group(1)) > 0, logs
    metrics = _metrics(tmp_path)
    assert metrics["test"]["auc"] > 0.6, metrics


def test_submit_runs_kubectl_apply_and_reports_its_failure(tmp_path: Path) -> None:
    """``submit`` hands the rendered file to the real kubectl; with no cluster (the
    kubeconfig names a closed loopback port) kubectl fails, and so does submit, with
    kubectl's message and the manifests kept."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl on the PATH")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "none",
        "clusters": [{"name": "none", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
        "users": [{"name": "none", "user": {}}]}))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    done = subprocess.run([sys.executable, "-m", "psfleet.cli.main", "k8s", "submit", "-m",
                           str(CONFIG), "--image", "x", "--name", NAME, "--kubectl", kubectl,
                           "-o", "cluster.server_num=2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert f"127.0.0.1:{port}" in done.stderr  # kubectl's own message
    assert f"kubectl apply exited 1 (its message is above); the manifests are in {NAME}.k8s.yaml" \
        in done.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all((tmp_path / f"{NAME}.k8s.yaml").read_text())]
    assert kinds == ["ConfigMap", "Secret", "Service", "StatefulSet", "Job"]
