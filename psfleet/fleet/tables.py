"""The tables of one worker: which embedding is which sparse table, and the dense one.

Table ids are assigned here, explicitly and the same way on every worker: the sparse
tables are the model's embeddings sorted by name (ids ``0 .. T-1``), the dense table
is ``T``. So workers that build the same model agree whatever the order they created
the embeddings in, and a checkpoint or export names each table by its embedding's
name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from psfleet.fleet.lr_scaling import scaled_rule
from psfleet.nn import SparseEmbedding, check_distinct_names
from psfleet.ps.types import RuleConfig, SparseTableConfig

__all__ = ["TableRegistry"]


@dataclass(frozen=True)
class TableRegistry:
    """Sparse table ids by embedding name, and the dense table id.

    Build it with :meth:`of`. Attributes:
        embeddings: the embeddings in table-id order (sorted by name).
        rule: the optimizer's rule (an embedding's own ``rule`` takes precedence).
        lr_factor: every sparse table's learning rate is its rule's times this
            (``strategy.lr_scaling``; 1.0: as configured).
    """

    embeddings: tuple[SparseEmbedding, ...]
    rule: RuleConfig
    lr_factor: float = 1.0

    @classmethod
    def of(cls, embeddings: Iterable[SparseEmbedding], rule: RuleConfig,
           lr_factor: float = 1.0) -> TableRegistry:
        """The registry of ``embeddings`` (each object once, shared modules counted once).

        Raises:
            ConfigError: two embeddings share a name, or an argument of one is out of
                range (names it).
        """
        distinct = sorted({id(e): e for e in embeddings}.values(), key=lambda e: e.name)
        check_distinct_names(distinct)
        for embedding in distinct:
            embedding.table_config(rule)  # validates now, naming the embedding
        return cls(tuple(distinct), rule, lr_factor)

    @property
    def dense_table_id(self) -> int:
        """The dense table's id (after the sparse ones)."""
        return len(self.embeddings)

    def sparse_ids(self) -> dict[str, int]:
        """Table id of each embedding, by name."""
        return {e.name: i for i, e in enumerate(self.embeddings)}

    def sparse_configs(self) -> dict[int, SparseTableConfig]:
        """Each sparse table's config, by table id."""
        return {i: self._config(e) for i, e in enumerate(self.embeddings)}

    def named_configs(self) -> dict[str, tuple[int, SparseTableConfig]]:
        """Each embedding's (table id, config), by name."""
        return {e.name: (i, self._config(e)) for i, e in enumerate(self.embeddings)}

    def _config(self, embedding: SparseEmbedding) -> SparseTableConfig:
        config = embedding.table_config(self.rule)
        if self.lr_factor == 1.0:
            return config
        return config.model_copy(update={"rule": scaled_rule(config.rule, self.lr_factor)})
