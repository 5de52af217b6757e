"""The parameter server: tables, rules, routing, server, client and communicator."""

from psfleet.ps.client import RemoteClient, TableClient
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.local_client import LocalClient
from psfleet.ps.routing import BucketRouter, DenseLayout, bucket_of
from psfleet.ps.rules import make_rule
from psfleet.ps.server import PsHandler, run_server, start_server
from psfleet.ps.sparse_table import SparseTable
from psfleet.ps.types import DenseTableConfig, RuleConfig, SparseTableConfig

__all__ = [
    "BucketRouter",
    "DenseLayout",
    "DenseTable",
    "DenseTableConfig",
    "LocalClient",
    "PsHandler",
    "RemoteClient",
    "RuleConfig",
    "SparseTable",
    "SparseTableConfig",
    "TableClient",
    "bucket_of",
    "make_rule",
    "run_server",
    "start_server",
]
