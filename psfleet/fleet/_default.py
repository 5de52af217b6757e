"""The process-wide :class:`~psfleet.fleet.fleet.Fleet` behind ``psfleet.fleet``'s
module functions (``fleet.init``, ``fleet.distributed_optimizer``, ...)."""

from psfleet.fleet.fleet import Fleet

__all__ = [
    "_fleet",
    "init",
    "is_server",
    "is_worker",
    "is_first_worker",
    "worker_index",
    "worker_num",
    "server_num",
    "server_endpoints",
    "init_server",
    "run_server",
    "init_worker",
    "stop_worker",
    "reset",
    "barrier_worker",
    "server_stats",
    "distributed_optimizer",
    "distributed_model",
    "join",
    "is_collective",
    "flush",
    "begin_pass",
    "end_pass",
    "sub_passes",
    "save_persistables",
    "load_model",
    "save_checkpoint",
    "load_checkpoint",
    "save_inference_model",
    "shrink",
    "set_date",
]

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
