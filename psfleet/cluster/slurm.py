"""An sbatch script for a parameter-server job (``psfleet slurm render``).

The script runs the job as **one job step of ``server_num + worker_num`` tasks**, one
``psfleet train`` process per task, started by ``srun --distribution=block
--kill-on-bad-exit=1``. Submit it with ``sbatch FILE``; it works on any number of
nodes (``--nodes``, or as Slurm chooses).

The rule (:class:`psfleet.fleet.role_maker.SlurmRoleMaker`'s): task ``r``
(``SLURM_PROCID``) with ``r < server_num`` is server ``r``; task ``r >= server_num`` is
worker ``r - server_num``.

What the batch script does, on the allocation's first node, before any task starts:

1. Writes the config to ``<workdir>/config.yaml`` from a heredoc (the text of the
   rendered file; ``-o`` overrides are passed to every process, not written in), so
   its relative paths mean what they meant when it was rendered. A different
   ``config.yaml`` already there is kept as ``config.yaml.before-<job id>``.
   ``<workdir>``, the data and the run folder (``runner.model_save_path``) must be on
   a file system every node of the allocation sees.
2. Exports ``PSFLEET_AUTH_TOKEN``: the submitter's, else a random one for this job
   (``/dev/urandom``), never on a command line; a generated one is also in
   ``<run folder>/log/.auth_token`` (mode 0600) until the script ends, as fleetrun
   keeps it, for ``psfleet status``. Servers bind an address other nodes reach, which
   needs a token (docs/security.md).
3. Works out the node of every task: the nodes of ``scontrol show hostnames
   "$SLURM_JOB_NODELIST"`` in order, each holding its count of
   ``SLURM_TASKS_PER_NODE`` (``2(x3),1`` = 2, 2, 2, 1) consecutive tasks: the
   ``block`` distribution ``srun`` is told to use. Server ``i`` listens on its node's
   ``NodeAddr`` (``scontrol show node``: the address Slurm itself reaches the node by;
   the node's name when scontrol does not say) at port ``PORT + i``, so two servers on
   one node never collide. The endpoints are also written to ``<run
   folder>/log/.endpoints/server.<i>``, so ``psfleet status RUN_FOLDER`` shows the
   running job's servers (docs/monitoring.md).
4. Runs the step. Every task checks that it runs on the node worked out for it
   (``SLURMD_NODENAME``; exit 2 naming both otherwise, e.g. when an ``srun`` option
   changed the layout) and runs ``psfleet train`` with the variables ``fleetrun``
   gives its children (:mod:`psfleet.launch.specs`).

Variables of every task (inherited job variables such as ``TRAINING_ROLE`` or
``RANK`` from the submitting shell are unset first)::

    PADDLE_PSERVERS_IP_PORT_LIST=ADDR0:PORT,ADDR1:PORT+1,...  (server-index order)
    PADDLE_TRAINERS_NUM=worker_num    PSFLEET_AUTH_TOKEN=...    PYTHONUNBUFFERED=1
    PSFLEET_RESTART_NUM=k             (the step's k-th restart, see below)

Server ``i`` (task ``i``)::

    TRAINING_ROLE=PSERVER  PADDLE_TRAINING_ROLE=PSERVER  PSFLEET_SERVER_INDEX=i
    POD_IP=0.0.0.0         PADDLE_CURRENT_IP=0.0.0.0     PADDLE_PORT=PORT+i

It binds every interface of its node (``0.0.0.0``, IPv4; the token guards it), so it
is reachable at its ``NodeAddr`` whatever the node's own name resolves to there.
Worker ``k`` (task ``server_num + k``)::

    TRAINING_ROLE=TRAINER  PADDLE_TRAINING_ROLE=TRAINER  PADDLE_TRAINER_ID=k

The end of the job: worker 0's ``fleet.stop_worker()`` stops the servers once every
worker is done; they exit 0 and the step ends. A task that fails (a server whose port
is taken, a worker's error) ends the step at once (``--kill-on-bad-exit=1``: Slurm
kills the other tasks) and ``srun`` names it (``srun: error: NODE: task R: Exited with
exit code C``). At the time limit Slurm sends SIGTERM to every task: the workers stop
as on Ctrl-C (the run folder says where they got to).

Restarts: with ``cluster.max_restarts: N`` a failed step is run again, whole (every
server and worker, as ``fleetrun --restart_policy gang``), up to N times with
``PSFLEET_RESTART_NUM`` = the restart's number: the servers re-create their tables from
the newest checkpoint in ``runner.checkpoint.checkpoint_dir`` and the workers resume
from their cursor in it (docs/checkpoints.md); without a checkpoint the job starts
over. The logs of a failed attempt ``a`` are moved to ``log/attempt<a>/``.

Logs: the batch output (``--output``, default ``NAME-<job id>.out`` in the folder
``sbatch`` was run from) has the script's own lines, ``srun``'s errors and a copy of
worker 0's output. Each process writes ``<run folder>/log/serverlog.<i>`` or
``workerlog.<k>``, as ``fleetrun`` does; the run folder is
``<runner.model_save_path>/NAME-<job id>`` (so each submission gets its own), or
``runner.run_name`` when the config or an ``-o`` names one.

Exit code of the script (the job's): 0 when the step succeeded; else ``srun``'s, after
a line naming the log folder: the highest exit code of the tasks, so the failed task's
(2 for a bad config or data file, 1 for a crash) or 143 when a task that Slurm stopped
because of it ended later; ``srun``'s own lines above name the task that failed first.

Resources (``cluster.resources``): every task of the one step gets the larger of the
server's and the worker's (:mod:`psfleet.cluster.sbatch_options`; servers then get GPUs
too: give GPUs to workers only with a heterogeneous job by hand).

Failure modes before the step: not run by ``sbatch`` (no ``SLURM_JOB_ID``), or a
``SLURM_TASKS_PER_NODE`` that does not add up to the job's tasks: exit 2 naming it.
"""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

from psfleet import __version__
from psfleet.cluster.job import CONFIG_NAME, ClusterJob
from psfleet.cluster.sbatch_options import SlurmOptions, sbatch_directives, task_resources
from psfleet.launch.console import plural
from psfleet.launch.security import TOKEN_FILE_NAME
from psfleet.launch.specs import JOB_VARIABLES

__all__ = ["render_script", "workdir_conflict"]

#: What servers bind: every IPv4 interface of their node.
BIND_ALL = "0.0.0.0"
def _tasks(first: int, end: int) -> str:
    """``task 0`` or ``tasks 1..2``."""
    return f"task {first}" if end - first == 1 else f"tasks {first}..{end - 1}"


def _delimiter(text: str, base: str) -> str:
    """A heredoc delimiter that is no line of ``text``."""
    lines = set(text.splitlines())
    delimiter = base
    while delimiter in lines:
        delimiter += "_"
    return delimiter


def _task_snippet(job: ClusterJob) -> str:
    """The shell each task runs (``bash -c``): its role's variables from
    ``SLURM_PROCID``, then the command in its place (``exec``), its output to its log;
    worker 0's shell stays, as ``tee`` also copies the output to the batch output.
    Arguments: the node of every task (space-separated), the log folder, the command."""
    s = job.server_num
    return f"""\
set -euo pipefail
rank=$SLURM_PROCID
read -r -a task_nodes <<< "$1"
log_dir=$2
shift 2
if [[ "${{task_nodes[rank]:-}}" != "$SLURMD_NODENAME" ]]; then
  echo "psfleet: task $rank runs on $SLURMD_NODENAME but the server list assumed" \\
    "${{task_nodes[rank]:-no node}} (block distribution of SLURM_TASKS_PER_NODE):" \\
    "keep srun --distribution=block and the job's task layout" >&2
  exit 2
fi
if (( rank < {s} )); then
  export TRAINING_ROLE=PSERVER PADDLE_TRAINING_ROLE=PSERVER PSFLEET_SERVER_INDEX=$rank \\
    POD_IP={BIND_ALL} PADDLE_CURRENT_IP={BIND_ALL} PADDLE_PORT=$(( {job.port} + rank ))
  exec "$@" > "$log_dir/serverlog.$rank" 2>&1
fi
worker=$(( rank - {s} ))
export TRAINING_ROLE=TRAINER PADDLE_TRAINING_ROLE=TRAINER PADDLE_TRAINER_ID=$worker
if (( worker == 0 )); then  # its output also goes to the batch output
  trap : INT TERM  # the worker stops by itself on them; tee ignores them
  set +e
  "$@" 2>&1 | (trap '' INT TERM; exec tee "$log_dir/workerlog.0")
  exit "${{PIPESTATUS[0]}}"
fi
exec "$@" > "$log_dir/workerlog.$worker" 2>&1
"""


def _train_command(job: ClusterJob) -> str:
    """``psfleet train ...`` as shell words; the run name is ``NAME-$SLURM_JOB_ID``
    unless the config (or an override) names the run."""
    argv = job.train_argv()
    if job.config.runner.run_name is not None:
        return shlex.join(argv)
    # train_argv() ends with "-o runner.run_name=NAME": one run folder per submission.
    return f'{shlex.join(argv[:-1])} "runner.run_name={job.name}-${{SLURM_JOB_ID}}"'


def render_script(job: ClusterJob, options: SlurmOptions, source: str = "") -> str:
    """The sbatch script of ``job`` (see the module doc).

    Args:
        job: the job (:func:`psfleet.cluster.job.load_cluster_job`).
        options: the ``#SBATCH`` settings.
        source: how the header names the config (its path as given).

    Raises:
        ConfigError: see :func:`sbatch_directives`.
    """
    directives = sbatch_directives(job, options)
    s, w = job.server_num, job.worker_num
    runner = job.config.runner
    run_name = (shlex.quote(runner.run_name) if runner.run_name is not None
                else f'"{job.name}-$SLURM_JOB_ID"')
    config_text = job.config_text if job.config_text.endswith("\n") else job.config_text + "\n"
    config_end = _delimiter(config_text, "PSFLEET_CONFIG")
    task = _task_snippet(job)
    task_end = _delimiter(task, "PSFLEET_TASK")
    max_restarts = job.config.cluster.max_restarts
    unset = " \\\n  ".join(textwrap.wrap(" ".join(sorted(JOB_VARIABLES)), 80))
    cpus = [o for o in task_resources(job.config.cluster.resources.server,
                                      job.config.cluster.resources.worker)
            if o.startswith("--cpus-per-task=")]  # srun 22.05+ does not inherit it
    header = [
        "#!/bin/bash",
        f"# psfleet job {job.name}: {plural(s, 'server')} ({_tasks(0, s)}) and "
        f"{plural(w, 'worker')} ({_tasks(s, s + w)}), one Slurm task each.",
        f"# Rendered by psfleet slurm render (psfleet {__version__})"
        + (f" from {source}" if source else "") + ". Submit: sbatch THIS_FILE",
        "# How it works: pydoc psfleet.cluster.slurm (docs/cluster.md).",
        *(f"#SBATCH {d}" for d in directives),
    ]
    setup = [*options.setup] or ["# (no --setup lines: psfleet must be on the PATH)"]
    body = f"""\
set -euo pipefail
: "${{SLURM_JOB_ID:?run this script with sbatch (no SLURM_JOB_ID)}}"

workdir={shlex.quote(job.workdir)}
run_dir={shlex.quote(str(runner.model_save_path))}/{run_name}
log_dir="$run_dir/log"
max_restarts={max_restarts}

{chr(10).join(setup)}

# 1. The config, at <workdir>/{CONFIG_NAME} (a folder every node sees).
mkdir -p "$workdir" "$log_dir"
config="$workdir/{CONFIG_NAME}"
cat > "$config.$SLURM_JOB_ID" <<'{config_end}'
{config_text}{config_end}
if [[ -f "$config" ]] && ! cmp -s "$config" "$config.$SLURM_JOB_ID"; then
  mv "$config" "$config.before-$SLURM_JOB_ID"
  echo "psfleet: kept the previous $config as $config.before-$SLURM_JOB_ID"
fi
mv "$config.$SLURM_JOB_ID" "$config"
cd "$workdir"

# 2. The job's auth token (servers bind an address other nodes reach); a generated one
#    is also in $log_dir/{TOKEN_FILE_NAME} (mode 0600) while the job runs, for psfleet status.
if [[ -z "${{PSFLEET_AUTH_TOKEN:-}}" ]]; then
  PSFLEET_AUTH_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')
  (umask 077 && echo "$PSFLEET_AUTH_TOKEN" > "$log_dir/{TOKEN_FILE_NAME}")
  trap 'rm -f "$log_dir/{TOKEN_FILE_NAME}"' EXIT
fi
export PSFLEET_AUTH_TOKEN

# 3. The node of every task (srun --distribution=block over SLURM_TASKS_PER_NODE) and
#    the servers' endpoints: server i listens on its node's NodeAddr, port {job.port}+i.
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
if (( ${{#nodes[@]}} == 0 )); then
  echo "psfleet: scontrol show hostnames $SLURM_JOB_NODELIST named no node" >&2
  exit 2
fi
task_nodes=()
n=0
for group in ${{SLURM_TASKS_PER_NODE//,/ }}; do  # e.g. 2(x3),1
  count=${{group%%(*}}
  repeat=1
  if [[ "$group" == *"(x"* ]]; then repeat=${{group#*(x}}; repeat=${{repeat%)}}; fi
  for (( r = 0; r < repeat; r++, n++ )); do
    for (( c = 0; c < count; c++ )); do task_nodes+=("${{nodes[n]}}"); done
  done
done
if (( ${{#task_nodes[@]}} != {s + w} )); then
  echo "psfleet: SLURM_TASKS_PER_NODE=$SLURM_TASKS_PER_NODE on $SLURM_JOB_NODELIST gives" \\
    "${{#task_nodes[@]}} tasks, not the job's {s + w}" >&2
  exit 2
fi
endpoints=()
for (( i = 0; i < {s}; i++ )); do
  node=${{task_nodes[i]}}
  addr=$(scontrol show node -o "$node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2 || true)
  endpoints+=("${{addr:-$node}}:$(( {job.port} + i ))")
done
mkdir -p "$log_dir/.endpoints"  # psfleet status RUN_FOLDER reads them
for (( i = 0; i < {s}; i++ )); do echo "${{endpoints[i]}}" > "$log_dir/.endpoints/server.$i"; done

# 4. The step: one task per process; a failed task ends it (--kill-on-bad-exit).
unset {unset}
export PADDLE_PSERVERS_IP_PORT_LIST
PADDLE_PSERVERS_IP_PORT_LIST=$(IFS=,; echo "${{endpoints[*]}}")
export PADDLE_TRAINERS_NUM={w}
export PYTHONUNBUFFERED=${{PYTHONUNBUFFERED:-1}}
IFS= read -r -d '' task <<'{task_end}' || true
{task}{task_end}
echo "psfleet: job {job.name} ($SLURM_JOB_ID): servers $PADDLE_PSERVERS_IP_PORT_LIST;" \\
  "tasks on ${{task_nodes[*]}}; logs in $log_dir"
restart=0
while true; do
  status=0
  PSFLEET_RESTART_NUM=$restart srun --ntasks={s + w} --distribution=block \\
    --kill-on-bad-exit=1 --export=ALL{"".join(" " + o for o in cpus)} \\
    bash -c "$task" psfleet-task "${{task_nodes[*]}}" "$log_dir" \\
    {_train_command(job)} || status=$?
  if (( status == 0 || restart >= max_restarts )); then break; fi
  mkdir -p "$log_dir/attempt$restart"
  mv "$log_dir"/serverlog.* "$log_dir"/workerlog.* "$log_dir/attempt$restart/" 2>/dev/null \\
    || true
  restart=$(( restart + 1 ))
  echo "psfleet: the step failed (srun exit $status); running every server and worker" \\
    "again (restart $restart of cluster.max_restarts $max_restarts)" >&2
done
if (( status != 0 )); then
  echo "psfleet: job {job.name} failed: srun exited $status (the failed task is named" \\
    "above); logs in $log_dir" >&2
fi
exit "$status"
"""
    return "\n".join(header) + "\n\n" + body


def workdir_conflict(job: ClusterJob, config_file: Path) -> Path | None:
    """A different config already at ``<workdir>/config.yaml`` on this machine, which
    the script would move aside; None when there is none, it holds the job's text, or
    it is ``config_file`` itself (the default ``--workdir`` is the config's folder)."""
    target = Path(job.config_path)
    try:
        if not target.is_file() or target.resolve() == config_file.resolve():
            return None
        return None if target.read_text() == job.config_text else target
    except OSError:
        return None
