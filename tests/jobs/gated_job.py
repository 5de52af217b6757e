"""``fleet_job.py`` whose workers wait for a file first: a test talks to the job's live
servers (as an outsider would) before the job trains.

Usage: ``gated_job.py --go_file PATH [fleet_job.py's arguments]``. A worker waits (up
to 120 s) until PATH exists, then runs ``fleet_job.main()``; a server starts at once.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleet_job  # noqa: E402  (beside this file)

from psfleet import fleet  # noqa: E402

GO_TIMEOUT_S = 120.0


def main() -> int:
    args = sys.argv[1:]
    where = args.index("--go_file")
    go_file = Path(args[where + 1])
    sys.argv[1:] = args[:where] + args[where + 2:]
    if fleet.PaddleCloudRoleMaker().generate_role().role is fleet.Role.WORKER:
        deadline = time.monotonic() + GO_TIMEOUT_S
        while not go_file.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{go_file} did not appear within {GO_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
    return fleet_job.main()


if __name__ == "__main__":
    sys.exit(main())
