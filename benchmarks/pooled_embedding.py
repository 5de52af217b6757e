"""Pooled multi-hot embeddings in process: ids pooled per second, and the single-valued
fast path against SparseEmbedding's gather.

One training step = forward of the embeddings, ``backward`` of a fixed linear loss over
their output, and ``optimizer.step()`` (the step's one merged push per table, applied
with Adam, the DNN's rule, by the in-process tables of a local worker runtime). One
torch thread. Each figure is the median over ``--repeats`` windows of ``--steps`` steps
(after ``--warmup`` steps that create the rows), cycling over ``--batches`` batches;
``cpu_ms_per_step`` (this process's CPU time) is the steadier figure on a shared machine.

- ``pooled_mixed``: one FeatureEmbeddings table (``mean`` pooling) of
  ``--single`` single-valued features and ``--multi`` multi-valued ones whose lengths
  are Poisson(``--mean_length``) (empty bags included); ids Zipf-distributed (s=1.1)
  over 10^6 per feature. ``ids_per_s`` counts every id pooled (single-valued ones too).
- ``pooled_multi_only``: the same, without the single-valued features.
- single-valued only, on real Criteo rows (the shared Kaggle sample, 26 slots, 14
  batches): ``single_fast_path`` (FeatureEmbeddings, one table of the 26 features),
  ``single_sparse_embedding`` (a plain SparseEmbedding on the same ids: the reference
  the fast path must match) and ``single_as_bags`` (the same ids as bags of one
  through a SparseEmbeddingBag: what the fast path saves). ``examples_per_s``.

Prints one JSON line per configuration (see ``common.py``)::

    python benchmarks/pooled_embedding.py --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from common import REPO_ROOT, base_parser, emit, log, machine_info, summarise

from psfleet.data import NUM_SLOTS, parse_lines
from psfleet.data.jagged import KeyedJagged
from psfleet.data.jagged_rows import JaggedRows
from psfleet.data.types import FeatureSchema
from psfleet.fleet import DistributedOptimizer, DistributedStrategy, Role, RoleInfo
from psfleet.fleet.runtime import ParameterServerHooks, RuntimeConfig, WorkerRuntime
from psfleet.nn import EmbeddingTableSpec, FeatureEmbeddings, SparseEmbedding
from psfleet.nn.embedding_bag import SparseEmbeddingBag
from psfleet.rpc import RpcConfig

CRITEO_TRAIN = REPO_ROOT.parent / "shared" / "data" / "criteo_kaggle_sample" / "train.csv"
VOCAB = 1_000_000

Batch = tuple[torch.Tensor, KeyedJagged | None]


def multi_hot_batches(batches: int, batch: int, single: int, multi: int, mean_length: float,
                      seed: int) -> tuple[FeatureSchema, list[Batch]]:
    """Random batches with parser-style keys ``((slot + 1) << 33) | id``."""
    rng = np.random.default_rng(seed)
    schema = FeatureSchema(dense=(), sparse=tuple(f"s{i}" for i in range(single)),
                           multi=tuple(f"m{i}" for i in range(multi)))
    prefixes = (np.arange(1, single + multi + 1, dtype=np.uint64) << np.uint64(33))

    def ids(size: int | tuple[int, ...]) -> np.ndarray:
        return (rng.zipf(1.1, size=size) % VOCAB).astype(np.uint64)

    out: list[Batch] = []
    for _ in range(batches):
        sparse = ids((batch, single)) | prefixes[:single]
        lengths = rng.poisson(mean_length, size=(batch, multi)).astype(np.int32)
        values = ids(int(lengths.sum())) | np.repeat(np.tile(prefixes[single:], batch),
                                                     lengths.reshape(-1))
        jagged = KeyedJagged.from_rows(schema.multi, JaggedRows(values, lengths))
        out.append((torch.from_numpy(sparse.view(np.int64)), jagged))
    return schema, out


def criteo_batches(batch: int) -> list[Batch]:
    """The shared Criteo sample's rows as batches of single-valued keys."""
    if not CRITEO_TRAIN.is_file():
        raise SystemExit(f"{CRITEO_TRAIN} is missing: put ../shared beside the repository")
    chunk = parse_lines(CRITEO_TRAIN.read_text(encoding="utf-8").splitlines(), "train.csv")
    sparse = torch.from_numpy(chunk.sparse.view(np.int64))
    return [(sparse[i:i + batch], None) for i in range(0, len(sparse) - batch + 1, batch)]


def runtime_for(module: torch.nn.Module) -> WorkerRuntime:
    """A local worker runtime (in-process tables, Adam) bound to ``module``'s tables."""
    bias = torch.nn.Parameter(torch.zeros(1))
    optimizer = DistributedOptimizer(torch.optim.Adam([bias], lr=1e-3))
    config = RuntimeConfig(RoleInfo(Role.WORKER, 0, 1), DistributedStrategy(), RpcConfig(),
                           10.0)
    embeddings = [m for m in module.modules() if isinstance(m, SparseEmbedding)]
    runtime = WorkerRuntime.connect(config, ParameterServerHooks(), optimizer, embeddings)
    return runtime


def measure(name: str, forward: Callable[[Batch], torch.Tensor], module: torch.nn.Module,
            batches: list[Batch], ids_per_batch: float, args: argparse.Namespace) -> None:
    runtime = runtime_for(module)
    bias = runtime.optimizer.params[0]
    try:
        weights: dict[tuple[int, ...], torch.Tensor] = {}

        def step(i: int) -> None:
            out = forward(batches[i % len(batches)])
            w = weights.setdefault(tuple(out.shape), torch.randn(out.shape))
            loss = (out * w).sum() + bias.sum()
            runtime.optimizer.zero_grad()
            loss.backward()
            runtime.optimizer.step()

        for i in range(args.warmup):
            step(i)
        seconds, cpu_seconds = [], []
        steps = args.steps
        for _ in range(args.repeats):
            start, cpu_start = time.perf_counter(), time.process_time()
            for i in range(steps):
                step(i)
            seconds.append((time.perf_counter() - start) / steps)
            cpu_seconds.append((time.process_time() - cpu_start) / steps)
        examples = int(batches[0][0].shape[0])
        emit({"bench": "pooled_embedding", "config": name, "batch": examples,
              "ids_per_batch": ids_per_batch, "ms_per_step": summarise(
                  [s * 1e3 for s in seconds]),
              "examples_per_s": summarise([examples / s for s in seconds]),
              "ids_per_s": summarise([ids_per_batch / s for s in seconds]),
              "cpu_ms_per_step": summarise([s * 1e3 for s in cpu_seconds])})
        wall, cpu = statistics.median(seconds), statistics.median(cpu_seconds)
        log(f"{name}: {examples / wall:,.0f} examples/s, {ids_per_batch / wall:,.0f} ids/s "
            f"({wall * 1e3:.1f} ms/step, {cpu * 1e3:.1f} ms CPU)")
    finally:
        runtime.stop()


def mean_ids(batches: list[Batch]) -> float:
    return float(np.mean([s.numel() + (0 if j is None else j.values.numel())
                          for s, j in batches]))


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--single", type=int, default=8, help="single-valued features")
    parser.add_argument("--multi", type=int, default=3, help="multi-valued features")
    parser.add_argument("--mean_length", type=float, default=20.0)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=50, help="steps per timed window")
    parser.add_argument("--warmup", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    emit({"bench": "machine", **machine_info()})

    schema, batches = multi_hot_batches(args.batches, args.batch, args.single, args.multi,
                                        args.mean_length, seed=1)
    mixed = FeatureEmbeddings(schema, [EmbeddingTableSpec(
        "pooled_mixed", args.dim, schema.features, pooling="mean")])
    measure("pooled_mixed", lambda b: mixed.flatten(mixed(*b)), mixed, batches,
            mean_ids(batches), args)
    multi_schema = FeatureSchema(dense=(), sparse=(), multi=schema.multi)
    multi_only = FeatureEmbeddings(multi_schema, [EmbeddingTableSpec(
        "pooled_multi", args.dim, multi_schema.features, pooling="mean")])
    empty = [(b[0][:, :0], b[1]) for b in batches]
    measure("pooled_multi_only", lambda b: multi_only.flatten(multi_only(*b)), multi_only,
            empty, mean_ids(empty), args)

    criteo = criteo_batches(args.batch)
    slots = tuple(f"C{i + 1}" for i in range(NUM_SLOTS))
    fast = FeatureEmbeddings(FeatureSchema(dense=(), sparse=slots), [EmbeddingTableSpec(
        "single_fast", args.dim, slots)])
    measure("single_fast_path", lambda b: fast(b[0])[0], fast, criteo, mean_ids(criteo),
            args)
    plain = SparseEmbedding(args.dim, name="single_plain")
    measure("single_sparse_embedding", lambda b: plain(b[0]), plain, criteo,
            mean_ids(criteo), args)
    bags = SparseEmbeddingBag(args.dim, name="single_bags", pooling="sum")
    offsets = torch.arange(0, args.batch * NUM_SLOTS + 1, dtype=torch.int64)
    measure("single_as_bags", lambda b: bags(b[0].reshape(-1), offsets), bags, criteo,
            mean_ids(criteo), args)


if __name__ == "__main__":
    main()
