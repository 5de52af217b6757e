"""Pass mode (``mode: gpubox``, the seeds' GPU parameter server): a pass's rows on the
worker, no RPC per step for sparse tables.

The seeds' GPUBox trains in passes: ``InMemoryDataset`` loads a pass, ``begin_pass``
copies the rows the pass needs from the parameter server to the device, the steps
look rows up and update them there, ``end_pass`` writes them back (Paddle's
``PSGPUWrapper::BeginPass`` / ``EndPass``). Here:

- :meth:`PassCommunicator.begin_pass` takes each sparse table's ids of the pass,
  pulls their rows *with their rule state* from the servers in large batches
  (``PullSparse`` with ``with_state``) into a :class:`~psfleet.ps.pass_cache.PassRows`
  per table, on the configured torch device;
- a step's sparse pull reads the cache; its push applies the table's own rule there
  (``psfleet.ps.table.rules``, the servers' formulas), so one worker with SGD computes what
  one process does;
- :meth:`PassCommunicator.end_pass` pushes every touched row's change of values and
  rule state (``PushMode.ROW_DELTA``), divided by the number of workers as GEO does
  (Paddle's GeoCommunicator scales deltas by 1/trainers: the servers hold the
  average of the workers' rows), with the pass's show/click counts;
- dense parameters take the async or sync path every step, or GEO's (a local copy,
  its change averaged on the servers every ``geo_step`` steps and at each
  ``end_pass``), as ``PassConfig.dense_mode`` says, through that mode's communicator.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from psfleet import env
from psfleet.errors import ConfigError, FatalError
from psfleet.ps.client import PullHandle, PushHandle, TableClient
from psfleet.ps.communicator.types import Communicator, PassConfig
from psfleet.ps.pass_cache import PassRows, split_pass
from psfleet.ps.routing import RoutedKeys, keys_of
from psfleet.ps.table.rules import make_rule
from psfleet.ps.types import PushMode, RuleConfig, SparseTableConfig

__all__ = ["PassCommunicator", "pass_device", "selected_gpu"]

logger = logging.getLogger(__name__)

#: Bytes of rows per pull or push call at a pass boundary (below gRPC's and the
#: servers' message limits, large enough that per-call costs vanish).
CALL_BYTES = 16 << 20


def pass_device(device: str, environ: Mapping[str, str] | None = None) -> torch.device:
    """The torch device of ``PassConfig.device``: ``cuda`` without an index is the first
    GPU of the seeds' ``FLAGS_selected_gpus`` when set (:func:`selected_gpu`), else
    GPU 0.

    Raises:
        ConfigError: ``cuda`` is asked for and this process sees no GPU, or
            FLAGS_selected_gpus is not a list of GPU indexes.
    """
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"pass_configs.device: {device!r} but this process sees no GPU "
                          "(torch.cuda.is_available() is False); use device: cpu")
    index = selected_gpu(environ) if device == "cuda" else None
    return torch.device(device if index is None else f"cuda:{index}")


def selected_gpu(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's index of the first GPU in FLAGS_selected_gpus (None: unset).

    The seeds name physical GPUs there; with CUDA_VISIBLE_DEVICES set (fleetrun sets
    both to the rank's GPU) torch numbers the visible ones from 0, so a selected GPU
    that is visible is its position in CUDA_VISIBLE_DEVICES.

    Raises:
        ConfigError: FLAGS_selected_gpus is not a comma list of GPU indexes.
    """
    selected = env.list_var(environ, "FLAGS_selected_gpus")
    if not selected:
        return None
    if not all(gpu.isdigit() for gpu in selected):
        raise ConfigError(f"FLAGS_selected_gpus: {','.join(selected)!r} is not a comma "
                          "list of GPU indexes")
    visible = env.list_var(environ, "CUDA_VISIBLE_DEVICES") or ()
    return visible.index(selected[0]) if selected[0] in visible else int(selected[0])


class PassCommunicator(Communicator):
    """Sparse rows from a per-pass cache; dense through ``dense`` (see the module doc).

    Not thread safe: one training loop per worker.

    Args:
        client: the tables.
        dense: the communicator of the dense path (async or sync), on ``client``.
        config: the cache's device and budget, the dense path.
        worker_num: workers whose row deltas the servers add; each is scaled by
            1/worker_num.
    """

    #: The step hands gradients over as tensors on the cache's device (no host copy).
    takes_tensors = True

    def __init__(self, client: TableClient, dense: Communicator, config: PassConfig,
                 worker_num: int = 1) -> None:
        super().__init__(client)
        self.dense = dense
        self.config = config
        self.device = pass_device(config.device)
        self._scale = np.float32(1.0 / worker_num)
        self._tables: dict[int, SparseTableConfig] = {}
        self._cache: dict[int, PassRows] = {}
        self.passes = 0
        self.local_dense_update = dense.local_dense_update

    # -- tables and the dense path (the dense communicator's) ---------------------------
    def start(self) -> None:
        self.dense.start()

    def on_sparse_table(self, table_id: int, config: SparseTableConfig) -> None:
        self._tables[table_id] = config

    def on_dense_table(self, table_id: int, rule: RuleConfig, values: np.ndarray) -> None:
        self.dense.on_dense_table(table_id, rule, values)

    def push_dense(self, table_id: int, grads: np.ndarray) -> None:
        self.dense.push_dense(table_id, grads)

    def end_step(self) -> None:
        self.dense.end_step()

    def fresh_dense(self, table_id: int) -> np.ndarray | None:
        values = self.dense.fresh_dense(table_id)
        self.fresh_dense_lag = self.dense.fresh_dense_lag
        return values

    def flush(self) -> None:
        """Flush the dense path; rows of an open pass stay cached until :meth:`end_pass`."""
        self.dense.flush()

    def stop(self) -> None:
        """End an open pass (its rows go to the servers), then stop the dense path."""
        try:
            if self._cache:
                self.end_pass()
        finally:
            self.dense.stop()

    # -- passes -------------------------------------------------------------------------
    @property
    def in_pass(self) -> bool:
        return bool(self._cache)

    def row_bytes(self, table_id: int) -> int:
        """Bytes one cached row of sparse table ``table_id`` takes (values and state)."""
        return 4 * self.client.row_width(table_id)

    def sub_passes(self, batch_keys: Sequence[Mapping[int, np.ndarray]]) -> list[range]:
        """The batches of a pass (per batch, per table id, its keys uint64[N]) cut into
        sub-passes whose rows fit ``cache_budget_bytes`` (:func:`split_pass`)."""
        return split_pass(batch_keys, {t: self.row_bytes(t) for t in self._tables},
                          self.config.cache_budget_bytes)

    def begin_pass(self, keys: Mapping[int, np.ndarray]) -> int:
        """Pull the rows of a pass into the cache. Blocks.

        Args:
            keys: per sparse table id, the ids (uint64[N], repeats allowed) the pass's
                batches read; a table not given has no rows cached (its reads fail).

        Returns:
            Bytes cached on the device (all tables).

        Raises:
            FatalError: a pass is already open (call end_pass first), or a table id
                is not one of this worker's tables.
            ConfigError: the rows need more than ``cache_budget_bytes`` (split the
                pass: :meth:`sub_passes`).
            RpcError, RemoteError: a pull failed.
        """
        if self._cache:
            raise FatalError("begin_pass: a pass is open; call end_pass() first")
        unknown = sorted(set(keys) - set(self._tables))
        if unknown:
            raise FatalError(f"begin_pass: tables {unknown} are not this worker's "
                             f"{sorted(self._tables)}")
        uniques = {t: np.unique(np.asarray(k, dtype=np.uint64)) for t, k in keys.items()}
        need = sum(u.size * self.row_bytes(t) for t, u in uniques.items())
        if need > self.config.cache_budget_bytes:
            raise ConfigError(f"begin_pass: the pass's rows take {need} bytes, above "
                              f"pass_configs.cache_budget_bytes "
                              f"({self.config.cache_budget_bytes}); split the pass into "
                              "sub-passes or raise the budget")
        for table_id, unique in uniques.items():
            config = self._tables[table_id]
            rows = self._pull_rows(table_id, unique)
            self._cache[table_id] = PassRows(unique, rows, config.dim, make_rule(config.rule),
                                             self.device, repr(config.name))
        self.passes += 1
        cached = sum(c.nbytes for c in self._cache.values())
        logger.info("pass %d: %d rows (%d bytes) cached on %s", self.passes,
                    sum(len(c) for c in self._cache.values()), cached, self.device)
        return cached

    def _pull_rows(self, table_id: int, keys: np.ndarray) -> np.ndarray:
        """float32[N, row width] of ``keys``, pulled in calls of about CALL_BYTES
        per server, two in flight."""
        out = np.empty((keys.size, self.client.row_width(table_id)), dtype=np.float32)
        step = max(1, CALL_BYTES // self.row_bytes(table_id)) * len(self.client.endpoints)
        pending: list[tuple[int, PullHandle]] = []
        for start in range(0, keys.size, step):
            pending.append((start, self.client.start_pull_sparse(
                table_id, keys[start:start + step], create=True, with_state=True)))
            if len(pending) == 2 or start + step >= keys.size:
                for begin, handle in pending:
                    rows = handle.result()
                    out[begin:begin + rows.shape[0]] = rows
                pending.clear()
        return out

    def end_pass(self) -> int:
        """Push every touched row's change (values and rule state, scaled by
        1/worker_num) and the pass's counts to the servers; empty the cache. Blocks
        until the servers applied them (the dense path is flushed too).

        Returns:
            Rows pushed (all tables).

        Raises:
            FatalError: no pass is open.
            RpcError, RemoteError: a push failed; the rows not yet applied stay
                cached (call end_pass again: what was applied is not sent twice).
        """
        if not self._cache:
            raise FatalError("end_pass: no pass is open; call begin_pass() first")
        pushed = 0
        for table_id, cache in sorted(self._cache.items()):
            keys, deltas, shows, clicks = cache.deltas()
            deltas *= self._scale
            counts = self._tables[table_id].accessor.name == "ctr"
            step = max(1, CALL_BYTES // self.row_bytes(table_id)) * len(self.client.endpoints)
            handles: list[tuple[np.ndarray, PushHandle]] = []
            for start in range(0, keys.size, step):
                part = slice(start, start + step)
                handles.append((keys[part], self.client.start_push_sparse(
                    table_id, keys[part], deltas[part], PushMode.ROW_DELTA,
                    shows=shows[part] if counts else None,
                    clicks=clicks[part] if counts else None)))
                if len(handles) == 2:
                    self._confirm(cache, *handles.pop(0))
            for sent, handle in handles:
                self._confirm(cache, sent, handle)
            pushed += int(keys.size)
            del self._cache[table_id]  # all of it applied: a retry skips this table
        self.dense.flush()
        logger.info("pass %d ended: %d rows pushed", self.passes, pushed)
        return pushed

    @staticmethod
    def _confirm(cache: PassRows, keys: np.ndarray, handle: PushHandle) -> None:
        """Wait for one push of ``keys``' row deltas; once applied they are not sent
        again by a retried end_pass."""
        handle.result()
        cache.sent(keys)

    # -- the step's sparse pulls and pushes ---------------------------------------------
    def _rows(self, table_id: int) -> PassRows:
        cache = self._cache.get(table_id)
        if cache is None:
            config = self._tables.get(table_id)
            name = repr(config.name) if config is not None else str(table_id)
            raise FatalError(f"pass mode: table {name} is read in training outside a pass "
                             "(or begin_pass was not given its ids); call "
                             "fleet.begin_pass(...) before the pass's steps")
        return cache

    def pull_sparse(self, table_id: int, keys: np.ndarray, create: bool = True) -> np.ndarray:
        """Training (``create``): the cached values, on the host; otherwise (evaluation)
        the servers' values."""
        if not create:
            return self.client.pull_sparse(table_id, keys, create=False)
        return self._rows(table_id).values(keys).cpu().numpy()

    def start_pull_sparse(self, table_id: int, keys: np.ndarray,
                          create: bool = True) -> PullHandle:
        """Training: a ready handle of the cached values (Tensor[N, dim] on the cache's
        device); evaluation: the servers' values."""
        if not create:
            return self.client.start_pull_sparse(table_id, keys, create=False)
        return PullHandle.ready(keys, self._rows(table_id).values(keys))

    def push_sparse(self, table_id: int, keys: np.ndarray | RoutedKeys,
                    grads: np.ndarray | torch.Tensor, shows: np.ndarray | None = None,
                    clicks: np.ndarray | None = None) -> None:
        """Apply the table's rule to the cached rows (repeated keys summed)."""
        if grads.shape[0]:
            self._rows(table_id).push(keys_of(keys), grads, shows, clicks)
