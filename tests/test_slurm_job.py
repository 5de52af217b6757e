"""The sbatch script of ``psfleet slurm render``, run by a real Slurm.

Each test starts a Slurm cluster of its own (Debian's ``slurm-wlm``: ``apt-get install
slurm-wlm``): a ``slurm.conf`` in a temp folder (``auth/none``, so no munge;
``proctrack/linuxproc`` and ``task/none``, so no cgroups; free ports for slurmctld and
slurmd; more CPUs than the machine's 2 through ``SlurmdParameters=config_overrides``),
``slurmctld -D`` and ``slurmd -D`` as its children, with ``SLURM_CONF`` naming that file
for them and for ``sinfo`` / ``sbatch`` / ``scontrol``. Once ``sinfo`` shows every node
idle it renders the script of ``examples/criteo_dnn``'s job (1 epoch of the shared
Criteo sample, ``--workdir`` a temp folder), submits it with ``sbatch``, waits for its
end and checks the exit code, the task layout, the logs and the test AUC in the run
folder's metrics.json. Every daemon and job process it started is stopped (by PID)
also when it fails.

- one node (``localhost``): 1 server x 2 workers, the example's job;
- two nodes, each a network namespace with its own address and host name
  (``netns_hosts``; slurmctld in a third): 2 servers x 2 workers, the servers on one
  node and the workers on the other;
- one node, workers whose data file is missing: the step and the job fail with their
  exit code, and no process of the job outlives it.

Where the binaries are missing, or a daemon cannot start here, the test skips with
the reason (the daemon's own error lines; namespaces: ``netns_hosts``).

Three more run the script's own shell against stand-ins for ``scontrol`` and ``srun``
that play a three-node allocation: the layout of tasks on nodes and the variables each
task gets, the step ending when srun placed a task elsewhere, and a failed step run
again (``cluster.max_restarts``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from conftest import REPO_ROOT, clean_env, kill_processes
from netns_hosts import bridged_hosts

from psfleet.cli import slurm as slurm_cli

pytestmark = [pytest.mark.job, pytest.mark.slow]

CONFIG = REPO_ROOT / "examples" / "criteo_dnn" / "config.yaml"
DAEMONS = ("slurmctld", "slurmd", "sinfo", "sbatch", "scontrol", "scancel")
START_TIMEOUT_S = 30.0
JOB_TIMEOUT_S = 240.0
MIN_AUC = 0.6
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE")


def _render(argv: Sequence[str]) -> str:
    """``psfleet slurm render ARGV``'s script, through the command's own parser."""
    parser = argparse.ArgumentParser(prog="psfleet")
    slurm_cli.register(parser.add_subparsers(dest="command", required=True))
    return slurm_cli.render(parser.parse_args(["slurm", "render", *argv]))


def _free_ports(count: int) -> list[int]:
    # Slurm's daemons take their ports from slurm.conf, and the job's servers theirs
    # from the script, so they are picked here and bound a moment later (the OS does
    # not hand out a port it just gave to a closed socket right away).
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass(frozen=True)
class Node:
    """A Slurm host: its name, address and network namespace (None: this machine's)."""

    name: str
    address: str
    ns: str | None = None
    cpus: int = 4


def _slurm_conf(folder: Path, controller: Node, nodes: Sequence[Node],
                ports: Sequence[int]) -> str:
    node_lines = "\n".join(
        f"NodeName={n.name} NodeHostname={n.name} NodeAddr={n.address} CPUs={n.cpus} "
        "State=UNKNOWN" for n in nodes)
    return f"""\
ClusterName=psfleettest
SlurmctldHost={controller.name}({controller.address})
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
{node_lines}
PartitionName=debug Nodes={",".join(n.name for n in nodes)} Default=YES MaxTime=INFINITE \
State=UP
"""


def _ours(conf: Path) -> list[psutil.Process]:
    """Live processes whose environment names ``conf`` as SLURM_CONF: the daemons, the
    slurmstepd they forked (not children of this process) and the job's tasks."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and proc.environ().get("SLURM_CONF") == str(conf) \
                    and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} was not written)"


def _in(node: Node, argv: Sequence[str]) -> list[str]:
    """``argv`` run as on ``node``: in its network namespace (``nsenter``, which keeps
    this machine's /sys and its cgroups, unlike ``ip netns exec``), under its name (a
    UTS namespace of its own: slurmd finds its node by the host name)."""
    if node.ns is None:
        return list(argv)
    return ["nsenter", f"--net=/run/netns/{node.ns}", "unshare", "--uts", "sh", "-c",
            'hostname "$0" && exec "$@"', node.name, *argv]


class SlurmCluster:
    """slurmctld on ``controller`` and a slurmd per node, configured in ``folder`` (see
    the module doc)."""

    def __init__(self, folder: Path, controller: Node, nodes: Sequence[Node]) -> None:
        self.folder = folder
        self.controller = controller
        self.nodes = list(nodes)
        self.conf = folder / "slurm.conf"
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        self.env = clean_env({"SLURM_CONF": str(self.conf), "PATH": path})
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}
        self.jobs: list[str] = []

    def start(self) -> None:
        (self.folder / "state").mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (self.folder / f"spool-{node.name}").mkdir(exist_ok=True)
        self.conf.write_text(_slurm_conf(self.folder, self.controller, self.nodes,
                                         _free_ports(2)))
        daemons = [("slurmctld", self.controller),
                   *((f"slurmd-{n.name}", n) for n in self.nodes)]
        for name, node in daemons:
            with (self.folder / f"{name}.out").open("wb") as out:
                self.daemons[name] = subprocess.Popen(
                    _in(node, [name.split("-")[0], "-D", "-f", str(self.conf)]),
                    env=self.env, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        states: list[str] = []
        while time.monotonic() < deadline:
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    pytest.skip(f"{name} cannot run here (exit {proc.returncode}):\n"
                                f"{_tail(self.folder / f'{name}.out')}\n"
                                f"{_tail(self.folder / f'{name}.log')}")
            states = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.split()
            if states == ["idle"] * len(self.nodes):
                return
            time.sleep(0.2)
        logs = "\n".join(_tail(self.folder / f"{name}.log") for name in self.daemons)
        pytest.skip(f"the Slurm nodes did not become idle in {START_TIMEOUT_S:.0f} s "
                    f"(sinfo: {states}):\n{logs}")

    def run(self, argv: Sequence[str], check: bool = True, timeout: float = 30.0,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """A Slurm command, from the controller's host."""
        argv = list(argv)
        if self.controller.ns is not None:
            argv = ["nsenter", f"--net=/run/netns/{self.controller.ns}", *argv]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=check, cwd=cwd)

    def submit_and_wait(self, script: Path, cwd: Path) -> tuple[str, int, str]:
        """``sbatch SCRIPT``, then wait for the job's end: (job id, exit code, its
        final ``scontrol show job`` line).

        ``scontrol`` is asked every 0.3 s: ``sbatch --wait`` polls 2, 4, 8, 16, 32 s
        apart, which adds up to 30 s to an 8 s job.
        """
        job_id = self.run(["sbatch", "--parsable", str(script)], cwd=cwd).stdout.strip()
        job_id = job_id.split(";")[0]
        self.jobs.append(job_id)
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.run(["scontrol", "show", "job", "-o", job_id]).stdout.strip()
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if "launch_failed" in fields.get("Reason", ""):
                pytest.fail(f"Slurm could not launch job {job_id}: {line}\n"
                            f"{self.report(cwd)}", pytrace=False)
            if fields.get("JobState") in FINAL_STATES:
                code, _, signal = fields["ExitCode"].partition(":")
                return job_id, int(code) or (128 + int(signal) if int(signal) else 0), line
            time.sleep(0.3)
        pytest.fail(f"job {job_id} did not end within {JOB_TIMEOUT_S} s\n{self.report(cwd)}",
                    pytrace=False)

    def report(self, cwd: Path) -> str:
        """What Slurm says about its jobs and nodes, and the tails of every log: for a
        test that failed."""
        asked = []
        for argv in (["scontrol", "show", "job"], ["sinfo", "-N", "-l"],
                     ["squeue", "-s"]):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                done = self.run(argv, check=False, timeout=10)
                asked.append(f"--- {' '.join(argv)}\n{done.stdout}{done.stderr}")
        logs = [*sorted(self.folder.glob("*.log")), *sorted(self.folder.glob("*.out")),
                *sorted(cwd.glob("*.out"))]
        return "\n".join([*asked, *(f"--- {p}\n{_tail(p, 25)}" for p in logs)])

    def stop(self) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if self.jobs:
                self.run(["scancel", *self.jobs], check=False, timeout=10)
        for proc in self.daemons.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.daemons.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        kill_processes(_ours(self.conf))


@contextlib.contextmanager
def slurm_cluster(controller: Node, nodes: Sequence[Node]) -> Iterator[SlurmCluster]:
    """A running cluster; every process it started is stopped on exit (see the module
    doc). Skips, saying why, where the binaries are missing or a daemon cannot start.

    Its configuration, state and spool live in a short folder under /tmp, removed on
    exit: slurmstepd's Unix sockets are made in the spool folder and a socket path may
    not pass 108 bytes, which a pytest-xdist ``tmp_path`` with a test's name can."""
    needed = [*DAEMONS, *(("nsenter", "unshare") if controller.ns else ())]
    missing = [name for name in needed if shutil.which(name) is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)} on the PATH: apt-get install slurm-wlm "
                    "(nsenter and unshare: util-linux)")
    folder = Path(tempfile.mkdtemp(prefix="psfslurm-", dir="/tmp"))
    cluster = SlurmCluster(folder, controller, nodes)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _run_job(cluster: SlurmCluster, criteo_dir: Path, tmp_path: Path,
             args: Sequence[str]) -> tuple[str, Path, str]:
    """Render and run job ``ctr`` of 1 epoch on the Criteo sample with ``args``; checks
    it succeeded, its logs and its test AUC; returns (job id, run folder, the batch
    output)."""
    workdir = tmp_path / "work"
    script = tmp_path / "job.sbatch"
    script.write_text(_render([
        "-m", str(CONFIG), "--name", "ctr", "--workdir", str(workdir), "--time", "0:10:00",
        "-o", f"runner.train_data_dir={criteo_dir / 'train.csv'}",
        "-o", f"runner.test_data_dir={criteo_dir / 'test.csv'}",
        "-o", "runner.epochs=1", *args]))
    started = time.monotonic()
    job_id, code, state = cluster.submit_and_wait(script, cwd=tmp_path)
    run_dir = workdir / "output" / f"ctr-{job_id}"
    batch_log = tmp_path / f"ctr-{job_id}.out"
    logs = "\n".join(f"--- {p.name}\n{_tail(p, 30)}" for p in
                     [batch_log, *sorted((run_dir / "log").glob("*log.*"))])
    assert code == 0, f"the job exited {code}: {state}\n{logs}"
    assert (workdir / "config.yaml").read_text() == CONFIG.read_text()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["test"]["auc"] > MIN_AUC, metrics["test"]
    batch = batch_log.read_text()
    assert "psfleet: test auc" in batch, batch  # worker 0's final line, copied by tee
    print(f"job {job_id} ran in {time.monotonic() - started:.1f} s; test auc "
          f"{metrics['test']['auc']:.4f}")
    return job_id, run_dir, batch


def test_one_node_job_learns(criteo_dir: Path, tmp_path: Path) -> None:
    """1 server x 2 workers on one node: the example's job as it is."""
    node = Node("localhost", "127.0.0.1")
    port = _free_ports(1)[0]  # this machine's: 6170 may be taken
    with slurm_cluster(node, [node]) as cluster:
        job_id, run_dir, batch = _run_job(cluster, criteo_dir, tmp_path,
                                          ["--port", str(port)])
    assert f"psfleet: job ctr ({job_id}): servers 127.0.0.1:{port}; tasks on localhost " \
        "localhost localhost;" in batch, batch
    assert sorted(p.name for p in (run_dir / "log").iterdir()) == [
        ".endpoints", "serverlog.0", "workerlog.0", "workerlog.1"]


def test_failed_task_ends_the_step_and_the_job_fails(tmp_path: Path) -> None:
    """Workers whose data file is missing exit 2: srun kills the server (which would
    otherwise wait for them forever) and the job fails with that exit code and a line
    naming the log folder. srun's exit code is its tasks' highest: 2, or 143 when the
    stopped server's SIGTERM is counted after the workers' exits (a race)."""
    missing = tmp_path / "missing.csv"
    workdir = tmp_path / "work"
    script = tmp_path / "job.sbatch"
    script.write_text(_render([
        "-m", str(CONFIG), "--name", "ctr", "--workdir", str(workdir),
        "-o", f"runner.train_data_dir={missing}", "-o", f"runner.test_data_dir={missing}",
        "--port", str(_free_ports(1)[0])]))
    node = Node("localhost", "127.0.0.1")
    with slurm_cluster(node, [node]) as cluster:
        job_id, code, state = cluster.submit_and_wait(script, cwd=tmp_path)
        left = [p for p in _ours(cluster.conf) if "psfleet" in " ".join(p.cmdline())]
    batch = (tmp_path / f"ctr-{job_id}.out").read_text()
    log_dir = workdir / "output" / f"ctr-{job_id}" / "log"
    assert code in (2, 143), f"{state}\n{batch}"
    assert not left, f"job processes still running after the job ended: {left}"
    # Whichever worker fails first is named (under load either may).
    assert re.search(r"srun: error: localhost: tasks? [12](-2)?: Exited with exit code 2",
                     batch), batch
    assert f"psfleet: job ctr failed: srun exited {code} (the failed task is named above); " \
        f"logs in {log_dir}" in batch, batch
    assert str(missing) in (log_dir / "workerlog.0").read_text()
    # The server was started (and stopped by Slurm: nothing of the job is left, above);
    # under load it may be stopped before it logs that it listens.
    assert (log_dir / "serverlog.0").is_file()


def test_two_node_job_learns(criteo_dir: Path, tmp_path: Path) -> None:
    """2 servers x 2 workers on two nodes of 2 CPUs, each a network namespace with its
    own address and host name (slurmctld on a third): both servers on node n1 (ports
    6170 and 6171 of its NodeAddr), both workers on n2, so every pull and push crosses
    from one host to another."""
    with bridged_hosts(3) as hosts:
        controller = Node("ctl", hosts[0].address, hosts[0].ns)
        nodes = [Node(f"n{i}", host.address, host.ns, cpus=2)
                 for i, host in enumerate(hosts[1:], start=1)]
        with slurm_cluster(controller, nodes) as cluster:
            job_id, run_dir, batch = _run_job(
                cluster, criteo_dir, tmp_path,
                ["--nodes", "2", "-o", "cluster.server_num=2", "-o", "cluster.worker_num=2"])
    n1 = nodes[0].address
    assert f"psfleet: job ctr ({job_id}): servers {n1}:6170,{n1}:6171; tasks on n1 n1 " \
        "n2 n2;" in batch, batch
    assert sorted(p.name for p in (run_dir / "log").iterdir()) == [
        ".endpoints", "serverlog.0", "serverlog.1", "workerlog.0", "workerlog.1"]
    for index in (0, 1):
        assert f"Server listening on 0.0.0.0:{6170 + index}" in (
            run_dir / "log" / f"serverlog.{index}").read_text()


# -- the script's shell on a simulated three-node allocation ----------------------------

FAKE_SCONTROL = """\
#!/bin/bash
# scontrol show hostnames LIST | scontrol show node -o NAME, for nodes n1..n3
case "$2" in
  hostnames) printf '%s\\n' n1 n2 n3 ;;
  node) echo "NodeName=$4 Arch=x86_64 NodeAddr=10.0.0.${4#n} NodeHostName=$4 State=IDLE" ;;
esac
"""
# Runs each task of the step in turn on the node block distribution puts it on, with
# the variables slurmstepd sets; records the arguments srun got.
FAKE_SRUN = """\
#!/bin/bash
printf '%s\\n' "$@" > "$FAKE_DIR/srun.args"
while [[ "$1" == --* ]]; do shift; done
nodes=(n1 n1 n2 n2 n3)
for rank in 0 1 2 3 4; do
  SLURM_PROCID=$rank SLURM_NTASKS=5 SLURMD_NODENAME=${nodes[rank]} "$@" || exit $?
done
if [[ -n "${FAKE_FAIL_ONCE:-}" && ! -e "$FAKE_DIR/failed" ]]; then
  touch "$FAKE_DIR/failed"
  exit 3
fi
"""
FAKE_PSFLEET = """\
#!/bin/bash
env | grep -E '^(TRAINING_ROLE|PADDLE_|POD_IP|PSFLEET_|PYTHONUNBUFFERED)' | sort \\
  > "$FAKE_DIR/task.$SLURM_PROCID"
echo "args: $*" >> "$FAKE_DIR/task.$SLURM_PROCID"
echo "token file: $(find "$FAKE_DIR" -name .auth_token -printf '%m')" \\
  >> "$FAKE_DIR/task.$SLURM_PROCID"
echo "task $SLURM_PROCID says hello"
"""


def _fake_tools(folder: Path) -> Path:
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN),
                       ("psfleet", FAKE_PSFLEET)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def _task_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines()
                if "=" in line and not line.startswith(("args: ", "token file: ")))


def test_script_lays_out_tasks_on_three_nodes(tmp_path: Path) -> None:
    """2 servers x 3 workers on nodes n1 (2 tasks), n2 (2), n3 (1), as Slurm writes it in
    SLURM_TASKS_PER_NODE=2(x2),1: servers 0 and 1 on n1 at 10.0.0.1:7000 and :7001."""
    workdir = tmp_path / "work"
    script = tmp_path / "job.sbatch"
    script.write_text(_render([
        "-m", str(CONFIG), "--name", "ctr", "--workdir", str(workdir), "--port", "7000",
        "-o", "cluster.server_num=2", "-o", "cluster.worker_num=3", "--nodes", "3"]))
    bin_dir = _fake_tools(tmp_path)
    env = clean_env({
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_DIR": str(tmp_path),
        "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_TASKS_PER_NODE": "2(x2),1", "TRAINING_ROLE": "PSERVER", "RANK": "3",
        "PSFLEET_AUTH_TOKEN": "secret"})
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "servers 10.0.0.1:7000,10.0.0.1:7001; tasks on n1 n1 n2 n2 n3" in done.stdout
    srun = (tmp_path / "srun.args").read_text().splitlines()
    assert srun[:4] == ["--ntasks=5", "--distribution=block", "--kill-on-bad-exit=1",
                        "--export=ALL"]
    log_dir = workdir / "output" / "ctr-42" / "log"
    common = {"PADDLE_PSERVERS_IP_PORT_LIST": "10.0.0.1:7000,10.0.0.1:7001",
              "PADDLE_TRAINERS_NUM": "3", "PSFLEET_AUTH_TOKEN": "secret",
              "PSFLEET_RESTART_NUM": "0", "PYTHONUNBUFFERED": "1"}
    for rank in range(5):
        env_of = _task_env(tmp_path / f"task.{rank}")
        if rank < 2:
            role = {"TRAINING_ROLE": "PSERVER", "PADDLE_TRAINING_ROLE": "PSERVER",
                    "PSFLEET_SERVER_INDEX": str(rank), "POD_IP": "0.0.0.0",
                    "PADDLE_CURRENT_IP": "0.0.0.0", "PADDLE_PORT": str(7000 + rank)}
            log = log_dir / f"serverlog.{rank}"
        else:
            role = {"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINING_ROLE": "TRAINER",
                    "PADDLE_TRAINER_ID": str(rank - 2)}
            log = log_dir / f"workerlog.{rank - 2}"
        assert env_of == {**common, **role}, rank
        assert log.read_text() == f"task {rank} says hello\n"
    args = (tmp_path / "task.0").read_text().splitlines()[-2]
    assert (tmp_path / "task.0").read_text().splitlines()[-1] == "token file: "  # given
    assert [(log_dir / ".endpoints" / f"server.{i}").read_text() for i in (0, 1)] == [
        "10.0.0.1:7000\n", "10.0.0.1:7001\n"]
    assert args == (f"args: train -m {workdir}/config.yaml -o cluster.server_num=2 -o "
                    "cluster.worker_num=3 -o runner.run_name=ctr-42")
    assert "task 2 says hello" in done.stdout  # worker 0's copy in the batch output
    assert (workdir / "config.yaml").read_text() == CONFIG.read_text()


def test_script_stops_when_a_task_is_not_where_it_was_placed(tmp_path: Path) -> None:
    """SLURM_TASKS_PER_NODE says 1(x2),3 but srun put tasks as 2,2,1: task 1 finds
    itself on n1, not n2, and ends the step (exit 2) naming both."""
    workdir = tmp_path / "work"
    script = tmp_path / "job.sbatch"
    script.write_text(_render([
        "-m", str(CONFIG), "--name", "ctr", "--workdir", str(workdir),
        "-o", "cluster.server_num=2", "-o", "cluster.worker_num=3"]))
    bin_dir = _fake_tools(tmp_path)
    env = clean_env({
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_DIR": str(tmp_path),
        "SLURM_JOB_ID": "43", "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_TASKS_PER_NODE": "1(x2),3"})
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "task 1 runs on n1 but the server list assumed n2" in done.stderr
    assert "psfleet: job ctr failed: srun exited 2" in done.stderr


def test_a_failed_step_runs_again_up_to_max_restarts(tmp_path: Path) -> None:
    """cluster.max_restarts 1: the step that failed (srun exit 3) runs once more with
    PSFLEET_RESTART_NUM=1, the first attempt's logs moved to log/attempt0."""
    workdir = tmp_path / "work"
    script = tmp_path / "job.sbatch"
    script.write_text(_render([
        "-m", str(CONFIG), "--name", "ctr", "--workdir", str(workdir),
        "-o", "cluster.server_num=2", "-o", "cluster.worker_num=3",
        "-o", "cluster.max_restarts=1"]))
    bin_dir = _fake_tools(tmp_path)
    env = clean_env({
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_DIR": str(tmp_path),
        "FAKE_FAIL_ONCE": "1", "SLURM_JOB_ID": "44", "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_TASKS_PER_NODE": "2(x2),1"})
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "psfleet: the step failed (srun exit 3); running every server and worker again " \
        "(restart 1 of cluster.max_restarts 1)" in done.stderr
    log_dir = workdir / "output" / "ctr-44" / "log"
    names = ["serverlog.0", "serverlog.1", "workerlog.0", "workerlog.1", "workerlog.2"]
    assert sorted(p.name for p in (log_dir / "attempt0").iterdir()) == names
    assert sorted(p.name for p in log_dir.iterdir()) == [".endpoints", "attempt0", *names]
    assert all(_task_env(tmp_path / f"task.{r}")["PSFLEET_RESTART_NUM"] == "1"
               for r in range(5))
    # No token was given: one was made, kept in the log folder (0600) while the job ran.
    token = _task_env(tmp_path / "task.0")["PSFLEET_AUTH_TOKEN"]
    assert re.fullmatch("[0-9a-f]{64}", token), token
    assert (tmp_path / "task.0").read_text().splitlines()[-1] == "token file: 600"
    assert not (log_dir / ".auth_token").exists()
