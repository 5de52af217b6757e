"""Saving and loading a job's state through the fleet API: tables, checkpoints (with
each worker's data cursor, for exact resume) and the model for serving.

Checkpoints are the :mod:`psfleet.checkpoint` layer's (fsspec storage, manifest with
checksums, atomic publish); the servers write their own tables
(:mod:`psfleet.ps.persist`); the inference model is :mod:`psfleet.export`'s.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from psfleet.checkpoint import (
    CheckpointConfig,
    CheckpointError,
    CheckpointStore,
    Cursor,
    FileDigest,
    Manifest,
    Storage,
)
from psfleet.checkpoint.compat import check_compatible
from psfleet.checkpoint.cursors import (
    clear_cursors,
    clear_resume_name,
    read_cursors,
    read_resume_name,
    write_cursor,
    write_resume_name,
)
from psfleet.checkpoint.storage import sha256_of
from psfleet.errors import ConfigError, PsfleetError
from psfleet.export import InferenceManifest
from psfleet.export import save_inference_model as _save_inference_model
from psfleet.fleet.runtime import WorkerRuntime
from psfleet.ps.persist import FORMAT_VERSION
from psfleet.ps.persist_delta import check_save_mode
from psfleet.ps.types import SaveMode

__all__ = ["Persistence"]

logger = logging.getLogger(__name__)


def _warn_if_none_usable(store: CheckpointStore, none_usable: bool) -> None:
    """Warn when ``checkpoint_dir`` holds checkpoints but none verified (all damaged)."""
    found = store.names() if none_usable else []
    if found:
        logger.warning("no usable checkpoint in %s: all %d are damaged (see the warnings "
                       "above); training starts from scratch", store.storage.url, len(found))


def _record_resume_name(store: CheckpointStore, name: str | None) -> None:
    """Worker 0 records the checkpoint resumed from; a failed write is logged and the
    other workers then pick the newest good checkpoint themselves."""
    clear_resume_name(store.storage)  # a stale record must not outlive a failed write
    try:
        write_resume_name(store.storage, name)
    except OSError as exc:
        logger.error("cannot record the checkpoint resumed from in %s (%s); the other "
                     "workers verify the checkpoints themselves", store.storage.url, exc)


def _resume_name(store: CheckpointStore) -> str | None:
    """The checkpoint worker 0 resumed from, or the newest good one when it could not
    record it."""
    try:
        return read_resume_name(store.storage)
    except CheckpointError as exc:
        logger.warning("%s; using the newest good checkpoint, as worker 0 did", exc)
    latest = store.latest()
    return latest.name if latest is not None else None


def _digests(storage: Storage) -> list[FileDigest]:
    """Checksums of every file under ``storage`` (tables written in this process)."""
    root = storage.root.rstrip("/") + "/"
    out = []
    for path in storage.fs.find(storage.root):
        rel = path[len(root):] if path.startswith(root) else path
        size, digest = sha256_of(storage, rel)
        out.append(FileDigest(rel, size, digest))
    return out


class Persistence:
    """Saving and loading one worker's job state: tables (save_persistables,
    load_model), checkpoints with exact resume (save_checkpoint, load_checkpoint) and
    the inference model (save_inference_model). ``fleet``'s methods of those names
    call it.

    Args:
        runtime: the worker runtime (``fleet.init_worker``): its role, strategy,
            tables, optimizer and barriers.
    """

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime

    def save_persistables(self, dirname: str, mode: SaveMode = "full") -> None:
        """Save every table to ``dirname``: all of it (``full``), or for serving and
        online learning a ``base`` or a ``delta`` (``psfleet.ps.persist_delta``: rows
        passing the accessor's thresholds; a delta also carries the tombstones of rows
        deleted or evicted since the last base/delta save).

        Call on one worker (``is_first_worker()``), after ``barrier_worker()`` when
        every worker's updates must be in it. This worker's pushes are flushed first.
        Each server writes its share; this worker writes ``manifest.json``
        (``save_mode`` records ``mode``; ``mode`` there is the job's training mode).
        ``load_model`` of a base replaces the tables, of a delta applies it on top.

        Raises:
            FatalError: init_worker() was not called.
            ConfigError: ``mode`` is not ``full``, ``base`` or ``delta``, or a delta
                names a sparse table without the ctr accessor.
            OSError: ``dirname`` cannot be written.
        """
        check_save_mode(mode, f"save_persistables({dirname!r})")
        rt = self.runtime
        rt.flush()
        rt.client.save(dirname, mode)
        manifest = {
            "format_version": FORMAT_VERSION, "server_num": rt.client.share_num,
            "save_mode": mode,
            "worker_num": rt.role.worker_num, "mode": rt.strategy.mode,
            "sparse_tables": rt.tables.sparse_ids(),
            "dense_shapes": [list(p.shape) for p in rt.optimizer.params],
        }
        (Path(dirname) / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        logger.info("saved tables to %s", dirname)

    def load_model(self, dirname: str) -> None:
        """Load a save into the servers' tables; every worker calls it after init_worker.

        Worker 0 asks every server to load its share (the save may come from another
        server count); then every worker takes the loaded dense values. A full or
        base save replaces the tables; a delta save is applied on top of them (load
        the base, then its deltas in order).

        Raises:
            ConfigError: ``dirname`` has no manifest.json.
            DataError, RemoteError: a table is missing from the save or does not fit
                (names the table and both values).
        """
        if not (Path(dirname) / "manifest.json").is_file():
            raise ConfigError(f"load_model({dirname!r}): no manifest.json there; pass a "
                              "folder written by fleet.save_persistables()")
        rt = self.runtime
        if rt.role.worker_index == 0 or rt.hooks.every_rank_loads:
            rt.client.load(dirname)
        rt.barrier("load_model")
        rt.reload_dense()

    def save_inference_model(self, dirname: str, model: torch.nn.Module,
                             example_inputs: tuple[torch.Tensor, torch.Tensor] | None = None,
                             metadata: dict[str, object] | None = None) -> InferenceManifest:
        """Export ``model`` for serving: dense tower (torch.export) and sparse rows (.npy).

        Call on one worker (``is_first_worker()``) after ``flush()`` and
        ``barrier_worker()`` when every worker's updates must be in it; this worker's
        pushes are flushed and its dense parameters refreshed first. Works with
        servers (they write their rows to a staging folder in ``dirname``, so they
        must be able to write there) and with in-process tables. Layout and loading:
        :mod:`psfleet.export` (``load_inference_model``, ``psfleet predict``).

        Args:
            dirname: the model directory (local path or fsspec URL).
            model: ``(sparse_ids int64[B, S], dense float32[B, F]) -> logits[B]``
                through its SparseEmbeddings.
            example_inputs: one batch (only shapes past the batch dimension matter);
                None: from ``model.num_slots`` / ``model.num_dense``.
            metadata: JSON-serialisable, stored in ``manifest.json``.

        Returns:
            The manifest written.

        Raises:
            FatalError: init_worker() was not called, or torch.export failed.
            ConfigError: the model cannot be exported (see ``export_dense_tower``).
            OSError: ``dirname`` cannot be written.
        """
        rt = self.runtime
        rt.flush()
        return _save_inference_model(dirname, model, rt.client, rt.tables.named_configs(),
                                     example_inputs, metadata)

    # -- checkpoints ------------------------------------------------------------------
    def _table_configs(self) -> dict[str, dict[str, object]]:
        return {name: config.model_dump(mode="json")
                for name, (_, config) in self.runtime.tables.named_configs().items()}

    def save_checkpoint(self, config: CheckpointConfig, cursor: Cursor,
                        extra: dict[str, object] | None = None) -> str | None:
        """Take a checkpoint; every worker calls it at the same point of training.

        Each worker flushes its pushes and publishes its cursor; once all did, worker 0
        has every server copy its tables at one moment (pushes held back) and write
        them, writes the manifest (step, cursors, table configs, strategy, checksums)
        and publishes the checkpoint atomically, keeping the last
        ``max_num_checkpoints``. The workers continue when it is published. In sync
        mode every worker is at the same step, so the checkpoint is globally
        consistent; in async mode each server's copy is consistent.

        A failed write (full or read-only storage), a worker's cursor file included, is
        logged as an error naming the cause, the checkpoint's temporary folder is
        removed and training continues: the previous checkpoints stay intact and
        loadable. A worker whose cursor could not be written makes that checkpoint fail
        (worker 0 finds the cursor missing; cursors are cleared after each checkpoint,
        so none is stale).

        Args:
            config: where and how many to keep.
            cursor: this worker's position: epoch, batches done in it, steps done.
            extra: free-form values stored in the manifest (worker 0's).

        Returns:
            On worker 0, the published checkpoint's URL (None if it failed); None on
            other workers.

        Raises:
            FatalError: init_worker() was not called.
        """
        rt = self.runtime
        store = CheckpointStore(config.checkpoint_dir, config.max_num_checkpoints)
        rt.flush()
        try:
            write_cursor(store.storage, rt.role.worker_index, cursor)
        except OSError as exc:
            logger.error("checkpoint at step %d: worker %d cannot write its cursor to %s, "
                         "so this checkpoint FAILS; training goes on and the previous "
                         "checkpoints stay intact: %s", cursor.step, rt.role.worker_index,
                         store.storage.url, exc)
        rt.barrier("checkpoint.begin")
        url = None
        if rt.role.worker_index == 0:
            try:
                url = self._write_checkpoint(store, cursor, extra or {})
            finally:
                clear_cursors(store.storage, rt.role.worker_num)
        rt.barrier("checkpoint.end")
        return url

    def _write_checkpoint(self, store: CheckpointStore, cursor: Cursor,
                          extra: dict[str, object]) -> str | None:
        rt = self.runtime
        role, optimizer, ids = rt.role, rt.optimizer, rt.tables.sparse_ids()
        pending = None
        try:
            cursors = read_cursors(store.storage, role.worker_num)
            pending = store.begin(cursor.step)
            digests = rt.client.save(pending.storage.url)
            pending.add(digests if digests is not None else _digests(pending.storage))
            manifest = Manifest(
                step=cursor.step, epoch=cursor.epoch, batch=cursor.batch,
                server_num=rt.client.share_num, worker_num=role.worker_num,
                mode=rt.strategy.mode if rt.server_num() else "local",
                strategy=rt.strategy.model_dump(mode="json"),
                sparse_tables={name: {**c, "table_id": ids[name]}
                               for name, c in self._table_configs().items()},
                dense={"table_id": rt.tables.dense_table_id,
                       "shapes": [list(p.shape) for p in optimizer.params],
                       "rule": optimizer.dense_rule.model_dump(mode="json")},
                cursors=cursors, extra=extra)
            url = store.commit(pending, manifest)
        except (OSError, PsfleetError) as exc:
            if pending is not None:
                store.abort(pending)
            logger.error("checkpoint at step %d FAILED, training goes on and the previous "
                         "checkpoints in %s stay intact: %s", cursor.step, store.storage.url,
                         exc)
            return None
        logger.info("checkpoint at epoch %d batch %d (step %d) written to %s", cursor.epoch,
                    cursor.batch, cursor.step, url)
        return url

    def load_checkpoint(self, config: CheckpointConfig | str) -> Cursor | None:
        """Resume from the newest complete checkpoint; every worker calls it after
        init_worker (the servers may be more or fewer than when it was written).

        Worker 0 picks the newest checkpoint whose files all verify (a damaged one is
        skipped with a warning naming the file), checks that it fits the model, and
        has every server load its buckets and dense blocks; then every worker takes
        the loaded dense values and its cursor. A worker the launcher restarted
        (``PSFLEET_RESTART_NUM`` > 0) rejoins a running job instead: it loads nothing
        into the servers and only takes its cursor.

        Returns:
            This worker's cursor in the checkpoint (None when there is none yet).
            Also sets the optimizer's step count.

        Raises:
            CheckpointError: the checkpoint does not fit the model (names the table and
                both values), or the worker count changed in the middle of an epoch.
        """
        url = config if isinstance(config, str) else config.checkpoint_dir
        store = CheckpointStore(url)
        rt = self.runtime
        role, optimizer = rt.role, rt.optimizer
        if rt.config.restart_num > 0:
            latest = store.latest()
            if latest is None:
                return None
            logger.info("restarted worker %d rejoins from checkpoint %s", role.worker_index,
                        latest.storage.url)
            return self._cursor_of(latest.manifest, latest.storage.url)
        # Collective: every rank holds all tables in process, so every rank loads them.
        chosen: tuple[str | None] | None = None  # the folder this worker picked itself
        if role.worker_index == 0 or rt.hooks.every_rank_loads:
            latest = store.latest()
            if latest is not None:
                check_compatible(latest.manifest, latest.storage.url, self._table_configs(),
                                 [list(p.shape) for p in optimizer.params],
                                 optimizer.dense_rule.model_dump(mode="json"))
                rt.client.load(latest.storage.url)
                logger.info("resumed tables from checkpoint %s (step %d, %d share(s) then, "
                            "%d now)", latest.storage.url, latest.manifest.step,
                            latest.manifest.server_num, rt.client.share_num)
            chosen = (latest.name if latest else None,)
            if role.worker_index == 0:
                _warn_if_none_usable(store, latest is None)
                _record_resume_name(store, chosen[0])
        rt.barrier("load_checkpoint")
        name = chosen[0] if chosen is not None else _resume_name(store)
        if name is None:
            return None
        rt.reload_dense()
        storage = store.storage.child(name)
        manifest = Manifest.model_validate_json(storage.read_bytes("manifest.json"))
        return self._cursor_of(manifest, storage.url)

    def _cursor_of(self, manifest: Manifest, where: str) -> Cursor:
        role = self.runtime.role
        if manifest.worker_num == role.worker_num and role.worker_index < len(manifest.cursors):
            cursor = manifest.cursors[role.worker_index]
        elif manifest.batch == 0:  # an epoch boundary: any worker count may go on
            cursor = Cursor(epoch=manifest.epoch, batch=0, step=manifest.step)
        else:
            raise CheckpointError(
                f"checkpoint {where} was taken in the middle of epoch {manifest.epoch} with "
                f"worker_num {manifest.worker_num}; this job has worker_num "
                f"{role.worker_num}. Resume with {manifest.worker_num} workers, or from a "
                "checkpoint taken at an epoch end")
        self.runtime.optimizer.steps = cursor.step
        return cursor
