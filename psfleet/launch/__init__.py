"""The launcher: ``fleetrun`` and :func:`launch_local` (manual: :mod:`psfleet.launch.main`)."""

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
