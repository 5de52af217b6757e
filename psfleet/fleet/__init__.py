"""The fleet API: one process-wide Fleet and its methods as module functions."""

from psfleet.checkpoint import CheckpointConfig
from psfleet.fleet.fleet import Fleet
from psfleet.fleet.optimizer import DistributedOptimizer, rule_from_optimizer, rule_of_class
from psfleet.fleet.role_maker import (
    MPIRoleMaker,
    PaddleCloudRoleMaker,
    Role,
    RoleInfo,
    RoleMaker,
    SlurmRoleMaker,
    UserDefinedRoleMaker,
)
from psfleet.fleet.strategy import AsyncSettings, DistributedStrategy, StrategyFactory
from psfleet.fleet.transpiler import (
    DistributeTranspiler,
    Executor,
    PServerProgram,
    PServerStartupProgram,
    TrainerProgram,
)
from psfleet.fleet.transpiler_config import DistributeTranspilerConfig

_fleet = Fleet()

init = _fleet.init
is_server = _fleet.is_server
is_worker = _fleet.is_worker
is_first_worker = _fleet.is_first_worker
worker_index = _fleet.worker_index
worker_num = _fleet.worker_num
server_num = _fleet.server_num
server_endpoints = _fleet.server_endpoints
init_server = _fleet.init_server
run_server = _fleet.run_server
init_worker = _fleet.init_worker
stop_worker = _fleet.stop_worker
reset = _fleet.reset
barrier_worker = _fleet.barrier_worker
server_stats = _fleet.server_stats
distributed_optimizer = _fleet.distributed_optimizer
distributed_model = _fleet.distributed_model
join = _fleet.join
is_collective = _fleet.is_collective
flush = _fleet.flush
begin_pass = _fleet.begin_pass
end_pass = _fleet.end_pass
sub_passes = _fleet.sub_passes
save_persistables = _fleet.save_persistables
load_model = _fleet.load_model
save_checkpoint = _fleet.save_checkpoint
load_checkpoint = _fleet.load_checkpoint
save_inference_model = _fleet.save_inference_model
shrink = _fleet.shrink
set_date = _fleet.set_date

__all__ = [
    "AsyncSettings",
    "CheckpointConfig",
    "DistributedOptimizer",
    "DistributedStrategy",
    "DistributeTranspiler",
    "DistributeTranspilerConfig",
    "Executor",
    "Fleet",
    "MPIRoleMaker",
    "PServerProgram",
    "PServerStartupProgram",
    "PaddleCloudRoleMaker",
    "Role",
    "StrategyFactory",
    "RoleInfo",
    "RoleMaker",
    "SlurmRoleMaker",
    "TrainerProgram",
    "UserDefinedRoleMaker",
    "barrier_worker",
    "begin_pass",
    "end_pass",
    "sub_passes",
    "server_stats",
    "distributed_model",
    "distributed_optimizer",
    "flush",
    "init",
    "init_server",
    "init_worker",
    "is_collective",
    "is_first_worker",
    "is_server",
    "is_worker",
    "join",
    "load_checkpoint",
    "load_model",
    "reset",
    "rule_from_optimizer",
    "rule_of_class",
    "run_server",
    "save_inference_model",
    "save_checkpoint",
    "save_persistables",
    "server_endpoints",
    "server_num",
    "set_date",
    "shrink",
    "stop_worker",
    "worker_index",
    "worker_num",
]
