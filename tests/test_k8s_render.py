"""``psfleet k8s render``: the manifests of a 2x2 job, their schema, and bad input.

The manifests are validated offline against the Kubernetes 1.37 schema
(``kubernetes-validate``, strict: unknown fields are errors). What the processes they
describe do is tested in ``test_k8s_job.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from psfleet.cli.main import main
from psfleet.cluster.k8s import COMPLETION_INDEX, POD_INDEX_LABEL

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "criteo_dnn" / "config.yaml"
KUBERNETES_VERSION = "1.37.0"


def _render(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["k8s", "render", "-m", str(CONFIG), *args])
    out, err = capsys.readouterr()
    return code, out, err


def _docs(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, dict[str, Any]]:
    code, out, err = _render(capsys, "--image", "registry.example/psfleet:1.0", "--name",
                             "ctr", "-o", "cluster.server_num=2", "-o", "cluster.worker_num=2",
                             *args)
    assert code == 0, err
    return {d["kind"]: d for d in yaml.safe_load_all(out)}


def _env(doc: dict[str, Any]) -> dict[str, Any]:
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_2x2_manifests_pass_the_kubernetes_schema(capsys: pytest.CaptureFixture[str]) -> None:
    docs = _docs(capsys, "--namespace", "ads", "--volume", "ckpt:/mnt/ckpt",
                 "-o", "runner.checkpoint.checkpoint_dir=/mnt/ckpt/ctr",
                 "-o", "cluster.resources.server.cpu=2",
                 "-o", "cluster.resources.server.memory=8Gi",
                 "-o", "cluster.resources.worker.gpu=1")
    assert sorted(docs) == ["ConfigMap", "Job", "Secret", "Service", "StatefulSet"]
    for doc in docs.values():
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert doc["metadata"]["namespace"] == "ads"


def test_servers_and_workers_get_the_seeds_variables(capsys: pytest.CaptureFixture[str]) -> None:
    docs = _docs(capsys)
    endpoints = "ctr-server-0.ctr-server:6170,ctr-server-1.ctr-server:6170"
    server, worker = _env(docs["StatefulSet"]), _env(docs["Job"])
    token = {"secretKeyRef": {"name": "ctr-auth", "key": "token"}}
    assert server["TRAINING_ROLE"] == "PSERVER" and worker["TRAINING_ROLE"] == "TRAINER"
    for env in (server, worker):
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == endpoints
        assert env["PADDLE_TRAINERS_NUM"] == "2"
        assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env["PSFLEET_AUTH_TOKEN"] == token
    assert server["PADDLE_PORT"] == "6170"
    assert server["PSFLEET_SERVER_INDEX"] == {
        "fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}}
    assert worker["PADDLE_TRAINER_ID"] == {
        "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
    assert len(docs["Secret"]["stringData"]["token"]) == 64
    service, statefulset, job = docs["Service"], docs["StatefulSet"], docs["Job"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == statefulset["spec"]["selector"]["matchLabels"]
    assert statefulset["spec"]["serviceName"] == "ctr-server"
    assert statefulset["spec"]["replicas"] == 2
    assert (job["spec"]["completionMode"], job["spec"]["completions"],
            job["spec"]["parallelism"], job["spec"]["backoffLimit"]) == ("Indexed", 2, 2, 0)
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["grpc"] == {"port": 6170}
    assert container["livenessProbe"]["grpc"] == {"port": 6170}
    script = container["command"][2]
    assert ("psfleet train -m /workspace/config.yaml -o cluster.server_num=2 "
            "-o cluster.worker_num=2 -o runner.run_name=ctr") in script
    assert 'export PSFLEET_RESTART_NUM="$starts"' in script
    assert docs["ConfigMap"]["data"]["config.yaml"] == CONFIG.read_text()


def test_resources_and_restarts_come_from_the_config(
        capsys: pytest.CaptureFixture[str]) -> None:
    docs = _docs(capsys, "-o", "cluster.resources.server.cpu=4",
                 "-o", "cluster.resources.server.memory=16Gi",
                 "-o", "cluster.resources.worker.cpu=500m", "-o", "cluster.resources.worker.gpu=1",
                 "-o", "cluster.max_restarts=3")
    (server,) = docs["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    (worker,) = docs["Job"]["spec"]["template"]["spec"]["containers"]
    assert server["resources"] == {"requests": {"cpu": "4", "memory": "16Gi"},
                                   "limits": {"cpu": "4", "memory": "16Gi"}}
    assert worker["resources"] == {"requests": {"cpu": "500m"},
                                   "limits": {"cpu": "500m", "nvidia.com/gpu": 1}}
    assert docs["Job"]["spec"]["backoffLimit"] == 6  # 3 per worker
    assert _env(docs["Job"])["PSFLEET_RPC_MAX_RETRIES"] == "1000"


def test_checkpoint_and_run_folders_on_volumes(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _render(capsys, "--image", "x", "-o", "runner.checkpoint.checkpoint_dir=ckpt")
    assert code == 2
    assert "runner.checkpoint.checkpoint_dir: /workspace/ckpt" in err
    assert "--volume CLAIM:/workspace/ckpt" in err
    docs = _docs(capsys, "--volume", "state:/workspace", "-o",
                 "runner.checkpoint.checkpoint_dir=ckpt")
    (container,) = docs["Job"]["spec"]["template"]["spec"]["containers"]
    assert {"name": "vol-state", "mountPath": "/workspace"} in container["volumeMounts"]
    code, _, err = _render(capsys, "--image", "x", "-o",
                           "runner.checkpoint.checkpoint_dir=s3://bucket/ckpt")
    assert code == 0 and "runner.model_save_path /workspace/output is on no --volume" in err


@pytest.mark.parametrize(("args", "named"), [
    (["-o", "cluster.server_num=0", "-o", "cluster.worker_num=1"], "cluster.server_num: 0"),
    (["-o", "runner.bogus=1"], "runner.bogus: unknown key"),
    (["-o", "runner.model=dnnx"], "runner.model: 'dnnx' is not one of dcn_v2, deepfm, dnn"),
    (["-o", "runner.sync_mode=collective", "-o", "cluster.server_num=0"],
     "runner.sync_mode: collective"),
    (["-o", "cluster.tls=self-signed"], "cluster.tls"),
    (["-o", "cluster.server_num=2", "-o", "cluster.replication=2"],
     "cluster.replication: 2: psfleet k8s render jobs keep one copy"),
    (["--name", "Bad_Name"], "--name: 'Bad_Name'"),
    (["--port", "70000"], "--port: 70000"),
    (["--volume", "nopath"], "--volume: 'nopath'"),
    (["--workdir", "rel"], "--workdir: 'rel'"),
    (["-o", "cluster.resources.server.memory=lots"], "cluster.resources.server.memory"),
])
def test_bad_input_exits_2_naming_it(capsys: pytest.CaptureFixture[str], args: list[str],
                                     named: str) -> None:
    code, out, err = _render(capsys, "--image", "x", *args)
    assert code == 2 and out == ""
    assert named in err, err


def test_a_missing_image_or_config_is_refused(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["k8s", "render", "-m", str(CONFIG)])
    assert exit_.value.code == 2 and "--image" in capsys.readouterr().err
    code = main(["k8s", "render", "-m", str(tmp_path / "none.yaml"), "--image", "x"])
    assert code == 2 and "none.yaml" in capsys.readouterr().err


def test_submit_without_kubectl_exits_2(capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    code = main(["k8s", "submit", "-m", str(CONFIG), "--image", "x", "--out",
                 str(tmp_path / "m.yaml"), "--kubectl", str(tmp_path / "no-kubectl")])
    assert code == 2 and "no-kubectl" in capsys.readouterr().err
    assert not (tmp_path / "m.yaml").exists()


def test_default_name_and_notes_on_what_the_image_must_hold(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "ads_ctr" / "config.yaml"  # a plain config.yaml: its folder names it
    config.parent.mkdir()
    config.write_text(CONFIG.read_text())
    code = main(["k8s", "render", "-m", str(config), "--image", "x", "--volume",
                 "data:/data", "-o", "runner.test_data_dir=/data/test.csv"])
    out, err = capsys.readouterr()
    assert code == 0, err
    names = {d["kind"]: d["metadata"]["name"] for d in yaml.safe_load_all(out)}
    assert names["StatefulSet"] == "ads-ctr-server" and names["Job"] == "ads-ctr-worker"
    # The config's relative path, from /workspace in the pod: on no volume.
    assert ("runner.train_data_dir /shared/data/criteo_kaggle_sample/train.csv is on no "
            "--volume: it must be in the image") in err
    assert "runner.test_data_dir" not in err  # on the data volume
