"""The runner's model, sized from the data's schema and the declared tables.

The parser's :class:`~psfleet.data.types.FeatureSchema` names the features (dense,
single-valued and multi-valued sparse); ``hyper_parameters.tables`` puts each sparse
feature into a table (without it, one table ``embedding`` holds them all); the model
named by ``runner.model`` is built over those tables with as many dense inputs as the
schema has. Nothing here assumes Criteo's 26 + 13 columns.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import nn

from psfleet.data.batch import Batch
from psfleet.data.types import FeatureSchema
from psfleet.nn import EmbeddingTableSpec, FeatureEmbeddings, SparseEmbedding
from psfleet.ps.types import RuleConfig
from psfleet.rec.config import HyperParameters, OptimizerConfig, TrainConfig, parser_schema
from psfleet.rec.dropout import check_dropout, dropout_seed
from psfleet.rec.models import build_model

__all__ = ["DEFAULT_TABLE", "build_runner_model", "model_inputs", "prefetchers",
           "table_specs"]

#: The table of every feature when ``hyper_parameters.tables`` is not set.
DEFAULT_TABLE = "embedding"

#: Keys of ``hyper_parameters`` that only one model reads, by model name.
_MODEL_OPTIONS: dict[str, tuple[str, ...]] = {"dcn_v2": ("cross_layers",)}


def _rule(optimizer: OptimizerConfig | None) -> RuleConfig | None:
    """The table rule of a table's own optimizer (None: the job's optimizer's rule)."""
    if optimizer is None:
        return None
    return RuleConfig(name=optimizer.class_.lower(),  # type: ignore[arg-type]
                      learning_rate=optimizer.learning_rate)


def table_specs(hp: HyperParameters, schema: FeatureSchema) -> list[EmbeddingTableSpec]:
    """The sparse tables of the runner's model (``hyper_parameters.tables``, or one
    table :data:`DEFAULT_TABLE` over every feature); defaults filled from the
    ``sparse_feature_dim`` / ``embedding_initializer`` / ``embedding_init_range`` keys,
    each table's accessor from its ``accessor`` or ``hyper_parameters.sparse_accessor``.
    The config was checked against ``schema`` when loaded."""
    if hp.tables is None:
        return [EmbeddingTableSpec(name=DEFAULT_TABLE, dim=hp.sparse_feature_dim,
                                   features=schema.features,
                                   initializer=hp.embedding_initializer,
                                   initial_range=hp.embedding_init_range,
                                   accessor=hp.sparse_accessor)]
    return [EmbeddingTableSpec(
        name=t.name, dim=t.dim or hp.sparse_feature_dim, features=tuple(t.features),
        pooling=t.pooling, rule=_rule(t.optimizer),
        initializer=t.initializer or hp.embedding_initializer,
        initial_range=hp.embedding_init_range if t.init_range is None else t.init_range,
        shared_ids=t.shared_ids, accessor=accessor)
        for t, accessor in zip(hp.tables, hp.accessors, strict=True)]


def build_runner_model(config: TrainConfig, worker_index: int = 0) -> nn.Module:
    """The model of ``config``: ``runner.model`` over the schema's features and the
    declared tables (dense parameters seeded by torch's global generator). With
    ``hyper_parameters.dropout``, the masks come from a generator of worker
    ``worker_index``'s own (:func:`psfleet.rec.dropout.dropout_seed`).

    Raises:
        ConfigError: an unknown model name, or a model that rejects the tables (e.g.
            deepfm over tables of different dims); the message names the key.
    """
    hp, runner = config.hyper_parameters, config.runner
    schema = parser_schema(runner)
    embeddings = FeatureEmbeddings(schema, table_specs(hp, schema))
    options: dict[str, Any] = {key: getattr(hp, key)
                               for key in _MODEL_OPTIONS.get(runner.model, ())}
    if any(check_dropout(hp.dropout, len(hp.fc_sizes))):  # a model of the user's: only if set
        options.update(dropout=hp.dropout, dropout_seed=dropout_seed(runner.seed, worker_index))
    return build_model(runner.model, embeddings=embeddings, num_dense=len(schema.dense),
                       fc_sizes=hp.fc_sizes, **options)


def model_inputs(batch: Batch) -> tuple[Any, ...]:
    """The positional inputs of a runner model for ``batch``: ``(sparse, dense)``, and
    ``jagged`` when the data has multi-valued features (so a model written for
    single-valued data keeps its two-argument forward)."""
    if batch.jagged is None:
        return batch.sparse, batch.dense
    return batch.sparse, batch.dense, batch.jagged


def prefetchers(model: nn.Module) -> Iterator[FeatureEmbeddings | SparseEmbedding]:
    """The modules that pull a batch's rows: each FeatureEmbeddings of ``model``, and
    each SparseEmbedding outside them (a model built on SparseEmbedding directly)."""
    inside: set[int] = set()
    for module in model.modules():
        if isinstance(module, FeatureEmbeddings):
            inside.update(id(m) for m in module.modules())
            yield module
    for module in model.modules():
        if isinstance(module, SparseEmbedding) and id(module) not in inside:
            yield module
