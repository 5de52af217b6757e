"""This process's part of a ``psfleet train`` job (run by fleetrun), with a fault injected.

Usage::

    faulty_train_job.py [--kill_worker K --at_step S] [--step_sleep_s T [--sleep_worker W]]
                        [--finish_sleep_s F] [--fail_after_stop K] CONFIG

- ``--kill_worker K --at_step S``: on its first start (``PSFLEET_RESTART_NUM`` unset or
  0), worker K SIGKILLs itself right after its S-th optimizer step returned (in sync
  mode: once round S is applied), so a test knows exactly where the job was cut.
- ``--step_sleep_s T``: every worker (``--sleep_worker W``: worker W only) sleeps T
  seconds after each step, so a test can act on a job that is still training, or make
  one worker finish far behind the others.
- ``--finish_sleep_s F``: worker 0 sleeps F seconds before its evaluation and export
  (``psfleet.rec.reporting.finish_run``), as a slow export on a starved host does.
- ``--fail_after_stop K``: worker K exits with code 3 right after its
  ``fleet.stop_worker()`` returned (past the job's stop barrier; first start only).

Everything else is ``psfleet train -m CONFIG`` (the run folder's config.yaml).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

from psfleet.cli.main import main as cli_main
from psfleet.fleet.optimizer import DistributedOptimizer
from psfleet.fleet.runtime import WorkerRuntime
from psfleet.rec import trainer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill_worker", type=int, default=None)
    parser.add_argument("--at_step", type=int, default=0)
    parser.add_argument("--step_sleep_s", type=float, default=0.0)
    parser.add_argument("--sleep_worker", type=int, default=None)
    parser.add_argument("--finish_sleep_s", type=float, default=0.0)
    parser.add_argument("--fail_after_stop", type=int, default=None)
    parser.add_argument("config")
    args = parser.parse_args()
    me = os.environ.get("PADDLE_TRAINER_ID")
    first_start = os.environ.get("PSFLEET_RESTART_NUM", "0") == "0"
    kill = (args.kill_worker is not None and first_start and me is not None
            and int(me) == args.kill_worker)
    original = DistributedOptimizer.step

    def step(self: DistributedOptimizer, labels: Any = None) -> None:
        original(self, labels)
        if kill and self.steps == args.at_step:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if args.step_sleep_s and (args.sleep_worker is None or (
                me is not None and int(me) == args.sleep_worker)):
            time.sleep(args.step_sleep_s)

    DistributedOptimizer.step = step  # type: ignore[method-assign]
    finish_run, finish_sleep_s = trainer.finish_run, args.finish_sleep_s

    def slow_finish_run(*run_args: Any, **run_kwargs: Any) -> Any:
        time.sleep(finish_sleep_s)
        return finish_run(*run_args, **run_kwargs)

    if finish_sleep_s:
        trainer.finish_run = slow_finish_run  # type: ignore[assignment]
    stop = WorkerRuntime.stop

    def stop_then_fail(self: WorkerRuntime, finish: Any = None) -> None:
        stop(self, finish)
        print(f"injected exit 3 of worker {me} after the stop barrier", flush=True)
        os._exit(3)

    if (args.fail_after_stop is not None and first_start and me is not None
            and int(me) == args.fail_after_stop):
        WorkerRuntime.stop = stop_then_fail  # type: ignore[method-assign]
    return cli_main(["train", "-m", args.config])


if __name__ == "__main__":
    sys.exit(main())
