"""The launcher: ``fleetrun`` and :func:`launch_local` (manual: :mod:`psfleet.launch.main`).

The names below are imported on first use (:mod:`psfleet._lazy`): the launcher's health
probe, ``python -m psfleet.launch.health_probe``, needs none of them.
"""

from typing import TYPE_CHECKING

from psfleet._lazy import lazy_exports

if TYPE_CHECKING:
    from psfleet.launch.cluster import JobLayout, plan_job
    from psfleet.launch.collective import CollectiveOptions, launch_collective, run_collective
    from psfleet.launch.endpoints import read_endpoint
    from psfleet.launch.local import EXIT_FAILURE, launch_local, run_job
    from psfleet.launch.process import ChildProcess, describe_exit
    from psfleet.launch.security import job_client_config
    from psfleet.launch.types import LOCAL_HOST, LaunchConfig, ProcessSpec, Role

__all__ = [
    "EXIT_FAILURE",
    "LOCAL_HOST",
    "ChildProcess",
    "CollectiveOptions",
    "JobLayout",
    "LaunchConfig",
    "ProcessSpec",
    "Role",
    "describe_exit",
    "job_client_config",
    "launch_collective",
    "launch_local",
    "plan_job",
    "read_endpoint",
    "run_collective",
    "run_job",
]

__getattr__ = lazy_exports(__name__, {
    "ChildProcess": "psfleet.launch.process",
    "CollectiveOptions": "psfleet.launch.collective",
    "EXIT_FAILURE": "psfleet.launch.local",
    "JobLayout": "psfleet.launch.cluster",
    "LOCAL_HOST": "psfleet.launch.types",
    "LaunchConfig": "psfleet.launch.types",
    "ProcessSpec": "psfleet.launch.types",
    "Role": "psfleet.launch.types",
    "describe_exit": "psfleet.launch.process",
    "job_client_config": "psfleet.launch.security",
    "launch_collective": "psfleet.launch.collective",
    "launch_local": "psfleet.launch.local",
    "plan_job": "psfleet.launch.cluster",
    "read_endpoint": "psfleet.launch.endpoints",
    "run_collective": "psfleet.launch.collective",
    "run_job": "psfleet.launch.local",
})
