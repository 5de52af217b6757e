"""Measurement (not run in CI): test AUC of the 1M-row synthetic job, undisturbed vs a
server SIGKILLed mid-epoch vs a worker SIGKILLed mid-epoch, with --max_restarts 1; and
with ``cluster.replication: 2`` (3 servers x 2 workers), undisturbed vs a server
SIGKILLed mid-epoch and not restarted, against replication 1.

Usage (data from ``psfleet datagen criteo --rows 1000000 --seed 7 --out TRAIN
--test_rows 200000 --test_out TEST``)::

    python benchmarks/restart_recovery.py --train TRAIN --test TEST --work DIR \
        [--runs undisturbed,server_killed,worker_killed,rep1,rep2,rep2_server_killed,...]

Each run: ``psfleet train``, async, 1 epoch, batch 512, ``runner.checkpoint`` every 200
batches. The first three: 2 servers x 2 workers, ``cluster.max_restarts: 1``. ``rep1``,
``rep2`` and ``rep2_server_killed``: 3 servers x 2 workers, replication 1 / 2 / 2, no
restarts; ``rep2_server_restarted``: the same kill with ``max_restarts: 1`` (the server
is restarted and rejoins: filled with copies of its shares while training goes on);
``rep2_two_servers_killed``: the same kill without restarts, then server 2 killed as
soon as the live servers hold new copies of server 1's shares (refill);
``rep2_server_drained``: server 1 removed by ``psfleet drain`` instead of killed.
``rep2_2x2``, ``rep2_2x2_shares6``: 2 servers x 2 workers, replication 2, with 2 and 6
shares (``cluster.shares``); ``rep2_2x2_grown``: 6 shares, and ``psfleet grow`` adds a
third server instead of the kill.
The kill comes when the checkpoint after ``--kill_after`` batches is published. Prints
one line per run (test AUC, examples/s; for a replicated kill, the seconds from the
kill to the workers' first call on another server, the pause, and for a rejoin the
seconds from the kill until the restarted server serves its share again, or until its
shares are refilled), then the AUC and examples/s against the baseline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import job_parser, job_process

ROOT = Path(__file__).resolve().parents[1]


#: run name -> (servers, replication, max_restarts, process to kill as (variable, value))
RUNS: dict[str, tuple[int, int, int, tuple[str, str] | None]] = {
    "undisturbed": (2, 1, 1, None),
    "server_killed": (2, 1, 1, ("PSFLEET_SERVER_INDEX", "1")),
    "worker_killed": (2, 1, 1, ("PADDLE_TRAINER_ID", "1")),
    "rep1": (3, 1, 0, None),
    "rep2": (3, 2, 0, None),
    "rep2_server_killed": (3, 2, 0, ("PSFLEET_SERVER_INDEX", "1")),
    "rep2_server_restarted": (3, 2, 1, ("PSFLEET_SERVER_INDEX", "1")),
    "rep2_two_servers_killed": (3, 2, 0, ("PSFLEET_SERVER_INDEX", "1")),
    "rep2_server_drained": (3, 2, 0, ("PSFLEET_SERVER_INDEX", "1")),
    "rep2_2x2": (2, 2, 0, None),
    "rep2_2x2_shares6": (2, 2, 0, None),
    "rep2_2x2_grown": (2, 2, 0, ("PSFLEET_SERVER_INDEX", "1")),
}
#: run name -> cluster.shares (unset: one per server)
SHARES = {"rep2_2x2_shares6": 6, "rep2_2x2_grown": 6}
#: runs whose "kill" is ``psfleet grow`` (one server more) instead of a SIGKILL
GROWS = {"rep2_2x2_grown"}
#: runs whose "kill" is ``psfleet drain --server N`` instead of a SIGKILL
DRAINS = {"rep2_server_drained"}
#: run name -> the process killed once the first kill's shares are refilled
SECOND_KILLS = {"rep2_two_servers_killed": ("PSFLEET_SERVER_INDEX", "2")}
BASELINES = {"server_killed": "undisturbed", "worker_killed": "undisturbed",
             "rep2": "rep1", "rep2_server_killed": "rep2", "rep2_server_restarted": "rep2",
             "rep2_two_servers_killed": "rep2", "rep2_server_drained": "rep2",
             "rep2_2x2_shares6": "rep2_2x2", "rep2_2x2_grown": "rep2_2x2_shares6"}
#: how many shares a dead server of a replication-2 job leaves with one copy
_SHARES_PER_SERVER = 2


def _config(work: Path, name: str, train: Path, test: Path) -> Path:
    servers, replication, max_restarts, _ = RUNS[name]
    path = work / f"{name}.yaml"
    path.write_text(json.dumps({
        "runner": {"train_data_dir": str(train), "test_data_dir": str(test), "epochs": 1,
                   "batch_size": 512, "sync_mode": "async", "seed": 7,
                   "model_save_path": str(work / f"out-{name}"),
                   "checkpoint": {"checkpoint_dir": str(work / f"ck-{name}"),
                                  "step_interval": 200, "max_num_checkpoints": 2}},
        "cluster": {"server_num": servers, "worker_num": 2, "max_restarts": max_restarts,
                    "replication": replication, "shares": SHARES.get(name)},
    }))
    return path


def _published_batches(folder: Path) -> list[int]:
    out = []
    for p in folder.glob("ckpt-*/manifest.json"):
        out.append(int(json.loads(p.read_text())["batch"]))
    return out


def _pause_s(run_dir: Path, killed_wall: float) -> int | None:
    """Seconds (whole: the logs stamp HH:MM:SS) from the kill to the first worker log
    line saying a call moved to another server; None when there is none."""
    kill = time.localtime(killed_wall)
    kill_s = kill.tm_hour * 3600 + kill.tm_min * 60 + kill.tm_sec
    firsts = []
    for log in run_dir.glob("log/workerlog.*"):
        for line in log.read_text(errors="replace").splitlines():
            if "is dead" in line and "calling server" in line:
                firsts.append(_log_seconds(line, kill_s))
                break
    return min(firsts) if firsts else None


def _rejoined_s(run_dir: Path, killed_wall: float) -> int | None:
    """Seconds (whole) from the kill until the restarted server 1 serves its own share
    again; None when it did not."""
    kill = time.localtime(killed_wall)
    kill_s = kill.tm_hour * 3600 + kill.tm_min * 60 + kill.tm_sec
    log = run_dir / "log" / "serverlog.1"
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if "now serves share 1" in line:
            return _log_seconds(line, kill_s)
    return None


def _log_seconds(line: str, kill_s: int) -> int:
    h, m, sec = (int(x) for x in line[:8].split(":"))
    return (h * 3600 + m * 60 + sec - kill_s) % 86400


def _refilled_s(run_dir: Path, killed_wall: float) -> int | None:
    """Seconds (whole) from the kill until both shares the dead server 1 held have a
    second copy again on the live servers (refill); None while they do not."""
    kill = time.localtime(killed_wall)
    kill_s = kill.tm_hour * 3600 + kill.tm_min * 60 + kill.tm_sec
    copied = [_log_seconds(line, kill_s) for log in run_dir.glob("log/serverlog.[02]")
              for line in log.read_text(errors="replace").splitlines()
              if "copied share" in line]
    return max(copied) if len(copied) >= _SHARES_PER_SERVER else None


def run(work: Path, name: str, train: Path, test: Path, kill_after: int) -> dict[str, object]:
    kill = RUNS[name][3]
    config = _config(work, name, train, test)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    job = subprocess.Popen([sys.executable, "-m", "psfleet.cli.main", "train", "-m",
                            str(config)], env=env, stdout=subprocess.DEVNULL,
                           stderr=(work / f"{name}.stderr").open("w"))
    killed_at = killed_wall = None
    if kill is not None:
        while job.poll() is None and kill_after not in _published_batches(work / f"ck-{name}"):
            time.sleep(0.2)
        # The job's processes run the run folder's config.yaml (under model_save_path).
        victim = job_process(work / f"out-{name}", *kill)
        if victim is not None:
            killed_at, killed_wall = time.monotonic() - started, time.time()
            if name in DRAINS or name in GROWS:
                command = (["drain", str(work / f"out-{name}"), "--server", kill[1]]
                           if name in DRAINS else ["grow", str(work / f"out-{name}")])
                done = subprocess.run([sys.executable, "-m", "psfleet.cli.main", *command],
                                      env=env, capture_output=True, text=True)
                took_s = round(time.monotonic() - started - killed_at, 1)
                print(f"{name}: psfleet {command[0]} exited {done.returncode} after {took_s} "
                      f"s: {(done.stdout + done.stderr).strip()}", flush=True)
            else:
                victim.kill()
    # The run folder psfleet train wrote under model_save_path (psfleet.rec.run_folder).
    run_dir = (work / f"out-{name}" / "latest").resolve()
    refilled_after = second_killed_at = None
    if name in SECOND_KILLS and killed_wall is not None:
        while job.poll() is None and refilled_after is None:
            time.sleep(0.2)
            refilled_after = _refilled_s(run_dir, killed_wall)
        victim = job_process(work / f"out-{name}", *SECOND_KILLS[name])
        if victim is not None:
            victim.kill()
            second_killed_at = time.monotonic() - started
    code = job.wait()
    metrics = json.loads((run_dir / "metrics.json").read_text()) if code == 0 else {}
    stderr = (work / f"{name}.stderr").read_text()
    event = "drain" if name in DRAINS else "grow" if name in GROWS else "kill"
    return {"run": name, "exit": code,
            event: (f"{kill[0]}={kill[1]}" if event != "grow" else "one server") if kill else None,
            f"{event}_at_s": killed_at, "restarts": stderr.count("restarting it"),
            "refilled_after_s": refilled_after, "second_killed_at_s": second_killed_at,
            "failover_pause_s": (_pause_s(run_dir, killed_wall)
                                 if killed_wall is not None and RUNS[name][1] > 1 else None),
            "rejoined_after_s": (_rejoined_s(run_dir, killed_wall)
                                 if killed_wall is not None and RUNS[name][1] > 1
                                 and RUNS[name][2] > 0 else None),
            "test_auc": (metrics.get("test") or {}).get("auc"),
            "examples_per_s": round(metrics["examples_per_s"]) if metrics else None,
            "wall_s": round(time.monotonic() - started, 1)}


def main() -> int:
    parser = job_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--kill_after", type=int, default=400)
    parser.add_argument("--runs", default="undisturbed,server_killed,worker_killed",
                        help=f"comma-separated runs to do, of {', '.join(RUNS)} (default: "
                        "the first three)")
    args = parser.parse_args()
    unknown = set(args.runs.split(",")) - set(RUNS)
    if unknown:
        parser.error(f"--runs: unknown {sorted(unknown)}; choose from {', '.join(RUNS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in RUNS:
        if name in args.runs.split(","):
            results[name] = run(args.work, name, args.train, args.test, args.kill_after)
            print(json.dumps(results[name]), flush=True)
    for name, base_name in BASELINES.items():
        r, base = results.get(name), results.get(base_name)
        if r is None or base is None:
            continue
        if isinstance(r["test_auc"], float) and isinstance(base["test_auc"], float):
            print(f"{name}: test auc {r['test_auc']:.4f} vs {base_name} "
                  f"{base['test_auc']:.4f}: difference {r['test_auc'] - base['test_auc']:+.4f}",
                  flush=True)
        if isinstance(r["examples_per_s"], int) and isinstance(base["examples_per_s"], int):
            print(f"{name}: {r['examples_per_s']} examples/s vs {base_name} "
                  f"{base['examples_per_s']}: {r['examples_per_s'] / base['examples_per_s']:.2f}x",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
