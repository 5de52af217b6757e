"""A tiny parameter-server job for the launcher tests (stdlib only; real sockets).

Run by fleetrun as every child; the role comes from TRAINING_ROLE.

- server i: records its pid (and a grandchild's, to check fleetrun stops whole process
  groups), binds 127.0.0.1 port PADDLE_PORT (0), writes its endpoint to
  PSFLEET_ENDPOINT_FILE atomically, answers "hello k" lines with "ok server i", and
  exits once it received "stop" and served PADDLE_TRAINERS_NUM workers, or on SIGTERM.
- worker k: records its pid, checks its environment, says hello to every server,
  writes ``<out_dir>/worker.<k>.json``; worker 0 then sends "stop" to every server.

Failure injection by flags (every child gets the same flags):
    --fail_worker K --fail_code C   worker K prints a traceback-like line and exits C.
    --crash_server I                server I exits 5 before writing its endpoint.
    --silent_server I               server I never writes its endpoint (sleeps).
    --kill_worker K                 worker K kills itself with SIGKILL.
    --no_stop                       worker 0 does not stop the servers.
    --hang                          workers sleep after their work (for signal tests),
                                    after writing ``<out_dir>/ready.<k>``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _record_pid(out_dir: Path, name: str, pid: int) -> None:
    (out_dir / f"pid.{name}.{pid}").write_text(str(pid))


def _spawn_grandchild(out_dir: Path, name: str) -> None:
    """A sleeping grandchild in the same process group; fleetrun must stop it too."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    _record_pid(out_dir, f"{name}.grandchild", child.pid)


def run_server(args: argparse.Namespace, out_dir: Path) -> int:
    index = int(os.environ["PSFLEET_SERVER_INDEX"])
    trainers = int(os.environ["PADDLE_TRAINERS_NUM"])
    _record_pid(out_dir, f"server.{index}", os.getpid())
    _spawn_grandchild(out_dir, f"server.{index}")
    print(f"server {index} starting", flush=True)
    if args.crash_server == index:
        print(f"server {index}: simulated crash before listening", file=sys.stderr, flush=True)
        return 5
    assert os.environ["TRAINING_ROLE"] == "PSERVER"
    assert os.environ["PADDLE_TRAINING_ROLE"] == "PSERVER"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((os.environ["POD_IP"], int(os.environ["PADDLE_PORT"])))
    sock.listen(16)
    host, port = sock.getsockname()
    if args.silent_server == index:
        print(f"server {index}: listening on {port} but never reporting it", flush=True)
        time.sleep(600)
        return 0
    path = Path(os.environ["PSFLEET_ENDPOINT_FILE"])
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(f"{host}:{port}\n")
    os.replace(tmp, path)
    print(f"server {index} listening on {host}:{port}", flush=True)
    served, stopping = 0, False
    while not (stopping and served >= trainers):
        conn, _ = sock.accept()
        with conn, conn.makefile("rw") as f:
            line = f.readline().strip()
            if line == "stop":
                stopping = True
                f.write("bye\n")
            elif line.startswith("hello "):
                served += 1
                f.write(f"ok server {index}\n")
            f.flush()
    print(f"server {index} served {served} worker(s); stopping", flush=True)
    return 0


def _call(endpoint: str, message: str) -> str:
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        f = conn.makefile("rw")
        f.write(message + "\n")
        f.flush()
        return f.readline().strip()


def _wait_for_pids(out_dir: Path, pattern: str, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    def started() -> int:
        return sum(".grandchild." not in p.name for p in out_dir.glob(f"pid.{pattern}"))

    while started() < count and time.monotonic() < deadline:
        time.sleep(0.05)


def run_worker(args: argparse.Namespace, out_dir: Path) -> int:
    index = int(os.environ["PADDLE_TRAINER_ID"])
    _record_pid(out_dir, f"worker.{index}", os.getpid())
    print(f"worker {index} marker-stdout", flush=True)
    print(f"worker {index} marker-stderr", file=sys.stderr, flush=True)
    if args.fail_worker == index:
        # Fail once every worker has started (recorded its pid), so that a test can
        # check that the launcher stopped them all, however slowly they start.
        _wait_for_pids(out_dir, "worker.*", int(os.environ["PADDLE_TRAINERS_NUM"]))
        print("Traceback (most recent call last):", file=sys.stderr)
        print(f"RuntimeError: simulated failure of worker {index}", file=sys.stderr, flush=True)
        return args.fail_code
    if args.kill_worker == index:
        os.kill(os.getpid(), signal.SIGKILL)
    endpoint_list = os.environ.get("PADDLE_PSERVERS_IP_PORT_LIST", "")
    endpoints = [e for e in endpoint_list.split(",") if e]
    replies = [_call(e, f"hello {index}") for e in endpoints]
    result = {
        "trainer_id": os.environ["PADDLE_TRAINER_ID"],
        "trainers_num": os.environ["PADDLE_TRAINERS_NUM"],
        "training_role": os.environ["TRAINING_ROLE"],
        "paddle_training_role": os.environ["PADDLE_TRAINING_ROLE"],
        "pod_ip": os.environ["POD_IP"],
        "current_ip": os.environ["PADDLE_CURRENT_IP"],
        "endpoints": endpoints,
        "has_endpoint_list": "PADDLE_PSERVERS_IP_PORT_LIST" in os.environ,
        "replies": replies,
        "args": args.rest,
    }
    tmp = out_dir / f".worker.{index}.json.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out_dir / f"worker.{index}.json")
    if args.hang:
        _spawn_grandchild(out_dir, f"worker.{index}")
        (out_dir / f"ready.{index}").write_text("")
        time.sleep(600)
    if index == 0 and not args.no_stop:
        for e in endpoints:
            _call(e, "stop")
    print(f"worker {index} done", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out_dir", type=Path, required=True)
    parser.add_argument("--fail_worker", type=int, default=-1)
    parser.add_argument("--fail_code", type=int, default=3)
    parser.add_argument("--crash_server", type=int, default=-1)
    parser.add_argument("--silent_server", type=int, default=-1)
    parser.add_argument("--kill_worker", type=int, default=-1)
    parser.add_argument("--no_stop", action="store_true")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("rest", nargs="*")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if os.environ["TRAINING_ROLE"] == "PSERVER":
        return run_server(args, args.out_dir)
    return run_worker(args, args.out_dir)


if __name__ == "__main__":
    sys.exit(main())
