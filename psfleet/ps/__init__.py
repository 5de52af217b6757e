"""The parameter server: tables, rules, routing, server, client and communicator.

The names below are imported on first use (:mod:`psfleet._lazy`): a config check that
reads one module's types (``psfleet.ps.types``) does not import the tables and torch.
"""

from typing import TYPE_CHECKING

from psfleet._lazy import lazy_exports

if TYPE_CHECKING:
    from psfleet.ps.client import PullHandle, TableClient
    from psfleet.ps.clients import LocalClient, RemoteClient
    from psfleet.ps.dense_table import DenseTable
    from psfleet.ps.routing import BucketRouter, DenseLayout, bucket_of
    from psfleet.ps.server import run_server, start_server
    from psfleet.ps.service import TableService
    from psfleet.ps.table.lifecycle import LifecycleCounts
    from psfleet.ps.table.rules import make_rule
    from psfleet.ps.table.sparse_table import SparseTable
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

__getattr__ = lazy_exports(__name__, {
    "AccessorConfig": "psfleet.ps.types",
    "BucketRouter": "psfleet.ps.routing",
    "DenseLayout": "psfleet.ps.routing",
    "DenseTable": "psfleet.ps.dense_table",
    "DenseTableConfig": "psfleet.ps.types",
    "LifecycleCounts": "psfleet.ps.table.lifecycle",
    "LocalClient": "psfleet.ps.clients",
    "PullHandle": "psfleet.ps.client",
    "RemoteClient": "psfleet.ps.clients",
    "RuleConfig": "psfleet.ps.types",
    "SparseTable": "psfleet.ps.table.sparse_table",
    "SparseTableConfig": "psfleet.ps.types",
    "TableClient": "psfleet.ps.client",
    "TableService": "psfleet.ps.service",
    "bucket_of": "psfleet.ps.routing",
    "make_rule": "psfleet.ps.table.rules",
    "run_server": "psfleet.ps.server",
    "start_server": "psfleet.ps.server",
})
