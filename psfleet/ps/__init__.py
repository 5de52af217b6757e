"""The parameter server: tables, rules, routing, server, client and communicator."""

from psfleet.ps.client import PullHandle, TableClient
from psfleet.ps.clients import LocalClient, RemoteClient
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.lifecycle import LifecycleCounts
from psfleet.ps.routing import BucketRouter, DenseLayout, bucket_of
from psfleet.ps.rules import make_rule
from psfleet.ps.server import run_server, start_server
from psfleet.ps.service import TableService
from psfleet.ps.sparse_table import SparseTable
from psfleet.ps.types import AccessorConfig, DenseTableConfig, RuleConfig, SparseTableConfig

__all__ = [
    "AccessorConfig",
    "BucketRouter",
    "DenseLayout",
    "DenseTable",
    "DenseTableConfig",
    "LifecycleCounts",
    "LocalClient",
    "PullHandle",
    "RemoteClient",
    "RuleConfig",
    "SparseTable",
    "SparseTableConfig",
    "TableClient",
    "TableService",
    "bucket_of",
    "make_rule",
    "run_server",
    "start_server",
]
