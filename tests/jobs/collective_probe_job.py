"""A minimal collective job: join the process group, meet at a barrier, leave.

Prints ``rank R of W`` (after the barrier). With ``--fail_rank R`` rank R exits 3
right after joining, while the others wait at the barrier (the launcher must stop
them and report rank R as the root cause).
"""

from __future__ import annotations

import argparse
import sys

from psfleet import fleet


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail_rank", type=int, default=-1)
    args = parser.parse_args()
    fleet.init(is_collective=True)
    if fleet.worker_index() == args.fail_rank:
        print(f"rank {args.fail_rank} fails on purpose", file=sys.stderr, flush=True)
        return 3
    fleet.barrier_worker()
    print(f"rank {fleet.worker_index()} of {fleet.worker_num()}", flush=True)
    fleet.stop_worker()
    return 0


if __name__ == "__main__":
    sys.exit(main())
