"""The launcher's pure decisions: what a failure restarts (``--restart_policy``), the
whole-job restart line, and when a child counts as hung (``PSFLEET_HEALTH_TIMEOUT_S``).
Issue 15, findings 6 and 10; the jobs themselves are in test_launch_gang_jobs.py."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from psfleet.errors import ConfigError
from psfleet.launch.gang import job_restart_message, newest_checkpoint
from psfleet.launch.health import (
    HealthMonitor,
    HealthTracker,
    check_interval_s,
    health_timeout_s,
    process_stopped,
)
from psfleet.launch.main import build_parser
from psfleet.launch.restarts import Action, RestartPolicy, check_restart_policy
from psfleet.launch.types import ProcessSpec, Role

pytestmark = pytest.mark.unit


def _spec(role: Role, index: int, port: str = "0") -> ProcessSpec:
    env = {"PADDLE_PORT": port} if role is Role.SERVER else {"PADDLE_TRAINER_ID": str(index)}
    return ProcessSpec(role, index, ("python", "train.py"), env, Path(f"log.{index}"))


# -- restart policy ---------------------------------------------------------------------


def test_process_policy_restarts_each_child_up_to_n_times() -> None:
    policy = RestartPolicy(2, "process")
    worker, server = _spec(Role.WORKER, 1), _spec(Role.SERVER, 0)
    assert policy.decide(worker) is Action.RESTART_CHILD
    policy._counts[(Role.WORKER, 1)] = 2  # two restarts of worker 1 done
    assert policy.decide(worker) is Action.FAIL
    assert policy.decide(server) is Action.RESTART_CHILD  # its own count
    assert policy.decide(_spec(Role.WORKER, 0)) is Action.RESTART_CHILD


def test_gang_policy_counts_restarts_of_the_job() -> None:
    policy = RestartPolicy(2, "gang")
    worker, server = _spec(Role.WORKER, 1), _spec(Role.SERVER, 0)
    assert policy.decide(worker) is Action.RESTART_JOB
    assert policy.begin_job_restart() == 1
    assert policy.decide(server) is Action.RESTART_JOB  # any child: the job's count
    assert policy.begin_job_restart() == 2
    assert policy.decide(worker) is Action.FAIL
    assert policy.decide(server) is Action.FAIL
    assert policy.restarts(worker) == policy.restarts(server) == 2


def test_gang_policy_does_not_restart_once_a_worker_finished() -> None:
    # In sync mode a worker that exited 0 passed the job's last barrier: training is over.
    assert RestartPolicy(1, "gang").decide(_spec(Role.SERVER, 0),
                                           a_worker_done=True) is Action.FAIL
    assert RestartPolicy(1, "process").decide(_spec(Role.WORKER, 1),
                                              a_worker_done=True) is Action.RESTART_CHILD


@pytest.mark.parametrize("policy", ["process", "gang"])
def test_no_restart_without_max_restarts_or_once_the_workers_are_done(policy: str) -> None:
    assert RestartPolicy(0, policy).decide(_spec(Role.WORKER, 0)) is Action.FAIL
    assert RestartPolicy(3, policy).decide(_spec(Role.SERVER, 0),
                                           workers_done=True) is Action.FAIL


def test_restart_policy_names_are_checked() -> None:
    assert check_restart_policy("gang") == "gang"
    with pytest.raises(ConfigError, match=r"--restart_policy: 'elastic' is not one of "
                                          r"process, gang; use gang for sync-mode jobs"):
        RestartPolicy(1, "elastic")
    args = build_parser().parse_args(["train.py"])
    assert args.restart_policy == "process"
    assert build_parser().parse_args(["--restart_policy", "gang", "t.py"]).restart_policy == \
        "gang"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--restart_policy", "all", "t.py"])


def test_respec_numbers_the_restart_and_keeps_a_free_ports_server_on_its_port() -> None:
    endpoints = {0: "127.0.0.1:41295", 1: "127.0.0.1:41296"}
    server = RestartPolicy.respec(_spec(Role.SERVER, 1), 3, endpoints, 2)
    assert server.env["PSFLEET_RESTART_NUM"] == "3"
    assert server.env["PADDLE_PORT"] == "41296"
    fixed = RestartPolicy.respec(_spec(Role.SERVER, 0, port="6170"), 1, endpoints, 2)
    assert fixed.env["PADDLE_PORT"] == "6170"
    worker = RestartPolicy.respec(_spec(Role.WORKER, 1), 1, endpoints, 2)
    assert dict(worker.env) == {"PADDLE_TRAINER_ID": "1", "PSFLEET_RESTART_NUM": "1"}


def test_a_restarted_server_of_a_grown_job_gets_the_first_servers_list() -> None:
    """Server 0 of a replicated job that psfleet grow added server 2 to is restarted
    with the list every worker has (the job's first two servers), not with the added
    server in it: with it, it took itself for host 0 of 3 and refused the workers."""
    endpoints = {0: "127.0.0.1:41295", 1: "127.0.0.1:41296", 2: "127.0.0.1:41297"}
    spec = _spec(Role.SERVER, 0)
    spec = dataclasses.replace(spec, env={**spec.env, "PSFLEET_REPLICATION": "2"})
    server = RestartPolicy.respec(spec, 1, endpoints, 2)
    assert server.env["PADDLE_PSERVERS_IP_PORT_LIST"] == "127.0.0.1:41295,127.0.0.1:41296"
    assert server.env["PADDLE_PORT"] == "41295"


# -- the whole-job restart line ---------------------------------------------------------


def test_job_restart_message_names_child_origin_and_count() -> None:
    line = job_restart_message("worker 1 (pid 42)", "failed with signal SIGKILL (9)",
                               checkpoint_dir="/ck", checkpoint="/ck/ckpt-000002-step20",
                               restart=1, max_restarts=2)
    assert line == ("fleetrun: worker 1 (pid 42) failed with signal SIGKILL (9); restarting "
                    "the whole job (--restart_policy gang): every server and worker stops and "
                    "starts again from checkpoint /ck/ckpt-000002-step20 (restart 1 of "
                    "--max_restarts 2)")
    scratch = job_restart_message("server 0 (pid 7)", "failed with exit code 1",
                                  checkpoint_dir="/ck", checkpoint=None, restart=2,
                                  max_restarts=2)
    assert "starts again from scratch (no complete checkpoint in /ck yet) (restart 2 of" \
        in scratch
    unknown = job_restart_message("server 0 (pid 7)", "failed with exit code 1",
                                  checkpoint_dir=None, checkpoint=None, restart=1,
                                  max_restarts=1)
    assert "fleetrun was not told the checkpoint folder: PSFLEET_CHECKPOINT_DIR" in unknown


def test_newest_checkpoint_is_the_newest_complete_one(tmp_path: Path) -> None:
    assert newest_checkpoint(None) is None
    assert newest_checkpoint(str(tmp_path / "missing")) is None
    assert newest_checkpoint(str(tmp_path)) is None
    (tmp_path / "ckpt-000003-step30").mkdir()  # no manifest: incomplete, skipped
    for name, step in (("ckpt-000001-step10", 10), ("ckpt-000002-step20", 20)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(json.dumps({
            "step": step, "epoch": 0, "batch": step, "server_num": 1, "worker_num": 2,
            "mode": "sync", "files": {}}))
    found = newest_checkpoint(str(tmp_path))
    assert found is not None and found.endswith("ckpt-000002-step20")


# -- hang detection ---------------------------------------------------------------------


def test_health_timeout_defaults_to_30_and_is_bounded() -> None:
    assert health_timeout_s({}) == 30.0
    assert health_timeout_s({"PSFLEET_HEALTH_TIMEOUT_S": "2.5"}) == 2.5
    # Beyond 30 s (a starved host), and off (issue 44, finding 2: capped at 30, no off).
    assert health_timeout_s({"PSFLEET_HEALTH_TIMEOUT_S": "300"}) == 300.0
    assert health_timeout_s({"PSFLEET_HEALTH_TIMEOUT_S": "off"}) is None
    for bad in ("0", "-1", "3601", "nan", "inf", "soon"):
        with pytest.raises(ConfigError, match="PSFLEET_HEALTH_TIMEOUT_S: .*allowed: off, or "
                                              "> 0 and <= 3600"):
            health_timeout_s({"PSFLEET_HEALTH_TIMEOUT_S": bad})
    # A check may wait a third of the timeout (at most 10 s) for its answer: with a 2 s
    # cap a starved server answering in 3 s was declared dead whatever the timeout.
    assert HealthMonitor(3.0, {}).call_timeout_s == 1.0
    assert HealthMonitor(30.0, {}).call_timeout_s == 10.0
    assert HealthMonitor(300.0, {}).call_timeout_s == 10.0
    off = HealthMonitor(None, {})  # watches nothing, starts no probe
    off.watch(os.getpid(), "127.0.0.1:9")
    off.watch_process(os.getpid())
    assert off.overdue() == [] and off.timeout_s is None
    off.close()
    assert check_interval_s(30.0) == 5.0
    assert check_interval_s(3.0) == 1.0


def test_a_server_is_overdue_only_after_it_answered_and_then_went_silent() -> None:
    tracker = HealthTracker(3.0)
    assert tracker.overdue(100.0) == []  # never answered: starting, not judged
    tracker.answered(7, 100.0)
    assert tracker.overdue(102.9) == []
    tracker.answered(7, 102.0)
    assert tracker.overdue(104.9) == []
    (late,) = tracker.overdue(105.0)
    assert (late.key, late.silent_s) == (7, 3.0)
    assert late.reason == "did not answer health checks for 3 s"
    tracker.forget(7)
    assert tracker.overdue(200.0) == []


def test_a_stopped_process_is_overdue_after_the_timeout_without_a_break() -> None:
    tracker = HealthTracker(3.0)
    tracker.stopped(9, True, 10.0)
    tracker.stopped(9, True, 12.0)
    assert tracker.overdue(12.9) == []
    tracker.stopped(9, False, 12.95)  # continued: the clock starts again
    tracker.stopped(9, True, 13.0)
    assert tracker.overdue(15.9) == []
    (late,) = tracker.overdue(16.0)
    assert late.key == 9 and late.reason == ("was stopped (process state T, e.g. SIGSTOP) "
                                             "for 3 s")


def test_a_silent_stopped_server_is_named_once_with_both_facts() -> None:
    tracker = HealthTracker(3.0)
    tracker.answered(5, 0.0)
    tracker.stopped(5, True, 1.0)
    tracker.answered(6, 0.0)
    found = tracker.overdue(4.0)
    assert [(u.key, u.reason) for u in found] == [
        (5, "did not answer health checks for 4 s (its process is stopped: state T, e.g. "
            "SIGSTOP)"),
        (6, "did not answer health checks for 4 s")]
    with pytest.raises(ConfigError):
        HealthTracker(0.0)


def test_process_stopped_reads_the_process_state() -> None:
    assert process_stopped(os.getpid()) is False  # running (this test)
    assert process_stopped(2**22 + 12345) is False  # no such process
