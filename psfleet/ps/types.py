"""Vocabulary of the parameter server: table and optimizer-rule configurations.

A table is created from a :data:`TableConfig` sent by the workers as JSON
(``CreateTable``); two workers sending different configs for one table id is an
error. Field names follow Paddle's table/accessor protos where they exist.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from psfleet.errors import ConfigError
from psfleet.replication import MAX_SHARES

__all__ = [
    "RuleConfig",
    "AccessorConfig",
    "AccessorName",
    "AdmissionPolicy",
    "EvictionPolicy",
    "SaveMode",
    "SAVE_MODES",
    "SparseTableConfig",
    "DenseTableConfig",
    "TableConfig",
    "table_config_from_json",
    "RESERVED_KEY",
    "PushMode",
    "PushMeta",
    "SlicingConfig",
    "RuleName",
    "RULE_NAMES",
    "OptimizerClass",
    "OPTIMIZER_CLASSES",
    "Initializer",
    "INITIALIZERS",
    "SplitMethod",
    "ServerLimits",
]

#: uint64 key that cannot be stored (it marks free rows and empty pending slots).
RESERVED_KEY = 0xFFFF_FFFF_FFFF_FFFF

#: Optimizer rules the servers apply (one ``psfleet.ps.table.rules.Rule`` class per name).
RuleName = Literal["sgd", "adagrad", "adam"]
RULE_NAMES: tuple[str, ...] = get_args(RuleName)

#: The torch.optim classes (by class name, as the YAML's ``optimizer.class``) whose
#: update a rule reproduces: ``Adam`` -> ``adam``, ``SGD`` -> ``sgd``, ``Adagrad`` ->
#: ``adagrad`` (``psfleet.fleet.rule_from_optimizer``).
OptimizerClass = Literal["Adam", "SGD", "Adagrad"]
OPTIMIZER_CLASSES: tuple[str, ...] = get_args(OptimizerClass)

#: Initializers of new sparse rows (``psfleet.ps.hashing.init_rows``).
Initializer = Literal["uniform", "normal", "zeros"]
INITIALIZERS: tuple[str, ...] = get_args(Initializer)

#: Per-row statistics a sparse table keeps (``psfleet.ps.table.accessor``).
AccessorName = Literal["none", "ctr"]
#: Which new ids get a row (``psfleet.ps.table.admission``).
AdmissionPolicy = Literal["none", "probability", "count_filter", "show_click_score"]
#: Which rows go when a table reaches ``max_rows`` (``psfleet.ps.table.eviction``).
EvictionPolicy = Literal["lowest_score", "lru"]

#: What a save writes (Paddle's CtrCommonAccessor save params 0, 2, 1):
#: ``full`` every row with rule state and statistics (checkpoints); ``base`` the rows
#: passing ``base_threshold``; ``delta`` the rows whose delta_score passed
#: ``delta_threshold`` since the last base/delta save, plus tombstones
#: (``psfleet.ps.persist_delta``).
SaveMode = Literal["full", "base", "delta"]
SAVE_MODES: tuple[str, ...] = get_args(SaveMode)

#: How dense blocks are placed on servers (:class:`SlicingConfig`).
SplitMethod = Literal["RoundRobin", "HashName"]


class PushMode(enum.IntEnum):
    """How the tables apply a push (the wire's ``PushMode``, same values).

    APPLY: the rule steps with the gradient now (async). SYNC: the servers wait for
    every worker's push of the step and apply their mean once. DELTA: the values are
    added, no rule (a GEO worker's parameter delta). ROW_DELTA: the values and the
    rule state are added, no rule (a pass-mode worker's row delta over a pass;
    sparse tables only). AGGREGATE: gradients from any workers are gathered until
    they hold ``worker_num`` batches (a global batch), whose mean the rule applies
    once (GBA; ``psfleet.ps.global_batch``).
    """

    APPLY = 0
    SYNC = 1
    DELTA = 2
    ROW_DELTA = 3
    AGGREGATE = 4


@dataclass(frozen=True)
class PushMeta:
    """What a push says besides its payload (a ``PushSparse`` / ``PushDense`` without
    keys and values).

    Attributes:
        table_id: the table pushed to.
        mode: how the table applies it (:class:`PushMode`).
        worker_index: the pushing worker (DC-ASGD; a SYNC round's contributor).
        step: SYNC: the step every worker's push of a round carries.
        worker_num: SYNC: pushes that make a round; AGGREGATE: batches that make a
            global batch.
        push_id: ``(client id, sequence)``: applied once per id (client id 0: always).
        batches: AGGREGATE: the worker batches whose gradients the push sums (a
            merged send holds several); 0: no payload, apply the partial global
            batch gathered so far (a worker's flush).
        max_staleness: AGGREGATE: global batches applied since the pushing worker's
            last dense pull beyond which its gradient is decayed (0: never).
    """

    table_id: int
    mode: PushMode = PushMode.APPLY
    worker_index: int = 0
    step: int = 0
    worker_num: int = 1
    push_id: tuple[int, int] = (0, 0)
    batches: int = 1
    max_staleness: int = 0


@dataclass(frozen=True)
class ServerLimits:
    """What one server accepts; every request is checked against these before the
    server allocates anything for it (``TableService``).

    The defaults fit the built-in CTR models with room to spare. A model that needs
    more (a wider embedding, say) raises the limit where the server is built:
    ``TableService(limits=ServerLimits(max_dim=8192))``.

    Attributes:
        max_dim: floats per sparse row (a row of dim 4096 with Adam state is 48 KiB).
        max_num_buckets: virtual buckets of a sparse table (2^20; a save writes
            per bucket).
        max_num_shards: internal shards of a sparse table on one server.
        max_worker_num: workers a job may have (barriers, sync rounds).
        max_dense_size: floats of a dense table on one server (2^28: 1 GiB).
        max_pull_bytes: bytes of one PullSparse response (rows x dim x 4); a larger
            pull is rejected before its rows are gathered.
        max_request_bytes: bytes of one request on the wire: gRPC refuses a larger
            one (RESOURCE_EXHAUSTED) from its declared length, before decoding it.
        max_name_chars: characters of a table's name and a barrier's name.
        max_hosts: servers of a replicated job (``SetReplicas`` endpoints, host
            indices of the share map's entries).
        max_shares: shares of the tables (``SetReplicas``; the same bound as
            ``fleetrun --shares``, ``PSFLEET_SHARES`` and ``cluster.shares``:
            :data:`psfleet.replication.MAX_SHARES`); a layout's work is per share
            and runs under the server's lock.
        max_endpoint_chars: characters of one endpoint (``host:port``).
        max_incarnation: a member's restart number (``PSFLEET_RESTART_NUM``).
        max_map_entries: entries of each list of a share map on the wire (dead
            hosts, copies joined, released, promoted, hosts leaving or added).
    """

    max_dim: int = 4096
    max_num_buckets: int = 1 << 20
    max_num_shards: int = 1024
    max_worker_num: int = 4096
    max_dense_size: int = 1 << 28
    max_pull_bytes: int = 1 << 30
    max_request_bytes: int = 1 << 30
    max_name_chars: int = 1024
    max_hosts: int = 1024
    max_shares: int = MAX_SHARES
    max_endpoint_chars: int = 1024
    max_incarnation: int = 1 << 20
    max_map_entries: int = 1 << 16

    @classmethod
    def parse(cls, text: str, source: str = "PSFLEET_SERVER_LIMITS") -> ServerLimits:
        """Limits from ``NAME=INTEGER,...`` (the defaults for names not given).

        Raises:
            ConfigError: an unknown name, or a value that is not an integer >= 1
                (names ``source``, the entry and the allowed names).
        """
        values: dict[str, int] = {}
        names = [f.name for f in fields(cls)]
        for entry in filter(None, (part.strip() for part in text.split(","))):
            name, _, raw = entry.partition("=")
            name = name.strip()
            if name not in names:
                raise ConfigError(f"{source}: {entry!r}: unknown limit {name!r}; the limits "
                                  f"are {', '.join(names)}")
            try:
                values[name] = int(raw)
            except ValueError:
                values[name] = 0
            if values[name] < 1:
                raise ConfigError(f"{source}: {entry!r}: the value must be an integer >= 1 "
                                  f"(e.g. {name}={getattr(cls, name)})")
        return cls(**values)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RuleConfig(_Frozen):
    """An optimizer rule applied by the server, per row (sparse) or per element (dense).

    Attributes:
        name: ``sgd``, ``adagrad`` or ``adam`` (see ``psfleet.ps.table.rules``).
        learning_rate: step size (> 0).
        beta1, beta2, epsilon: Adam's constants (Kingma & Ba 2015).
        initial_accumulator: Adagrad's initial sum of squared gradients
            (torch.optim.Adagrad's ``initial_accumulator_value``).
    """

    name: RuleName = "adam"
    learning_rate: float = Field(0.001, gt=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.999, ge=0, lt=1)
    epsilon: float = Field(1e-8, gt=0)
    initial_accumulator: float = Field(0.0, ge=0)


class AccessorConfig(_Frozen):
    """A sparse table's row lifecycle: statistics, admission, shrink and a row cap.

    The default (``name="none"``, no admission, no cap) is the table without a
    lifecycle: every pulled or pushed id gets a row forever, at today's speed.

    Attributes:
        name: ``none`` (no statistics) or ``ctr`` (show, click, unseen_days and
            delta_score per row, as Paddle's CtrCommonAccessor).
        nonclk_coeff, click_coeff: a row's score is
            ``(show - click) * nonclk_coeff + click * click_coeff`` (Paddle's
            ``ShowClickScore``); finite.
        show_click_decay_rate: ``shrink`` multiplies show and click by it, in [0, 1].
        delete_threshold: ``shrink`` deletes rows whose decayed score is below it.
        delete_after_unseen_days: ``shrink`` deletes rows not pushed for more days.
        admission: ``none`` (every new id), ``probability`` (an id is admitted when a
            hash of (id, admission_seed) falls below ``admit_probability``; Paddle's
            ProbabilityEntry) or ``count_filter`` (after ``admit_count`` sightings;
            Paddle's CountFilterEntry) or ``show_click_score`` (once the score of the
            shows and clicks pushed for it reaches ``admit_score``; needs
            ``name="ctr"``).
        admit_probability: in [0, 1].
        admit_count: sightings before admission, >= 1.
        admission_seed: seed of the probability hash, >= 0.
        admit_score: show_click_score's threshold, finite and >= 0 (0: every id).
        pending_slots: the table of pending ids of count_filter and show_click_score,
            per server (split over the shards); an id whose slot another id takes
            starts counting again.
        max_rows: rows per table per server (split over the shards: shard i holds
            ``max_rows // num_shards`` rows, one more for the first
            ``max_rows % num_shards``); None: no cap.
        eviction: ``lowest_score`` (needs ``name="ctr"``) or ``lru`` (least recently
            pulled or pushed).
        evict_batch_fraction: a full shard evicts this fraction of its cap beyond
            what the insert needs, so eviction (one scan of the shard) runs once per
            that many inserts; in [0, 0.5]. The default 0.05 keeps a full table
            between 95% and 100% of ``max_rows``; at 0.01 the scans cost a capped
            stream of new ids about 40% of its pull rate
            (``benchmarks/table_lifecycle.py``).
        base_threshold: a ``base`` or ``delta`` save writes only rows scoring at least
            this (Paddle's default 1.5); >= 0, finite.
        delta_threshold: a ``delta`` save writes only rows whose delta_score reached
            this since the last base/delta save (Paddle's default 0.25); >= 0, finite.
        delta_keep_days: ``base`` and ``delta`` saves skip rows unseen for more days
            (Paddle's default 16); >= 0, finite.
        memory_rows: rows per table per server kept in memory (split over the shards
            as ``max_rows``); a full shard *spills* rows by ``eviction`` to the disk
            tier instead of dropping them, and a spilled row read again comes back
            (``psfleet.ps.table.disk_tier``). None: every row in memory. A shard must hold
            one request's keys in it (a request with more is refused, naming this).
        memory_budget_bytes: the same as a memory budget per table per server: the
            memory rows are the budget over the bytes a row takes in memory (its
            floats, statistics and index entry; ``SparseTable.row_memory_bytes``).
            At most one of ``memory_rows`` and ``memory_budget_bytes``.
        disk_dir: where the disk tier's folder is created (a path on each server;
            None: the system's temporary folder). The tier is not durable: a
            restarted server reloads from the newest checkpoint.
    """

    name: AccessorName = "none"
    nonclk_coeff: float = Field(0.1, allow_inf_nan=False)
    click_coeff: float = Field(1.0, allow_inf_nan=False)
    show_click_decay_rate: float = Field(0.98, ge=0, le=1)
    delete_threshold: float = Field(0.8, ge=0, allow_inf_nan=False)
    delete_after_unseen_days: float = Field(30.0, ge=0, allow_inf_nan=False)
    admission: AdmissionPolicy = "none"
    admit_probability: float = Field(1.0, ge=0, le=1)
    admit_count: int = Field(1, ge=1)
    admission_seed: int = Field(0, ge=0)
    pending_slots: int = Field(1 << 20, ge=1, le=1 << 30)
    max_rows: int | None = Field(None, ge=1)
    eviction: EvictionPolicy = "lru"
    evict_batch_fraction: float = Field(0.05, ge=0, le=0.5)
    admit_score: float = Field(1.0, ge=0, allow_inf_nan=False)
    base_threshold: float = Field(1.5, ge=0, allow_inf_nan=False)
    delta_threshold: float = Field(0.25, ge=0, allow_inf_nan=False)
    delta_keep_days: float = Field(16.0, ge=0, allow_inf_nan=False)
    memory_rows: int | None = Field(None, ge=1)
    memory_budget_bytes: int | None = Field(None, ge=1)
    disk_dir: str | None = None

    @model_validator(mode="after")
    def _check_policies(self) -> AccessorConfig:
        if self.memory_rows is not None and self.memory_budget_bytes is not None:
            raise ValueError("accessor.memory_rows and accessor.memory_budget_bytes: set "
                             "one of them (both size the memory tier)")
        if self.tiered and self.max_rows is not None:
            raise ValueError("accessor.max_rows drops rows beyond the cap, "
                             "accessor.memory_rows / memory_budget_bytes spill them to disk: "
                             "set one of them")
        if self.disk_dir is not None and not self.tiered:
            raise ValueError("accessor.disk_dir: only used with accessor.memory_rows or "
                             "memory_budget_bytes (the disk tier); set one or drop disk_dir")
        if self.admission == "show_click_score" and self.name != "ctr":
            raise ValueError("accessor.admission: 'show_click_score' needs accessor.name "
                             "'ctr' (the score is the ctr accessor's); set name: ctr")
        if self.eviction == "lowest_score" and (self.max_rows is not None or self.tiered) \
                and self.name != "ctr":
            raise ValueError("accessor.eviction: 'lowest_score' needs accessor.name "
                             "'ctr' (rows have no score otherwise); use 'lru'")
        return self

    @property
    def active(self) -> bool:
        """Whether rows have a lifecycle (statistics, admission or a cap)."""
        return (self.name != "none" or self.admission != "none" or self.max_rows is not None
                or self.tiered)

    @property
    def tiered(self) -> bool:
        """Whether rows beyond a memory budget spill to a disk tier."""
        return self.memory_rows is not None or self.memory_budget_bytes is not None


class SparseTableConfig(_Frozen):
    """A sparse table: uint64 feature key -> row of ``dim`` float32 plus rule state.

    Attributes:
        name: the table's name (the SparseEmbedding's).
        dim: floats per row.
        rule: the optimizer rule applied to pushed gradients, per row.
        initializer: ``uniform`` in [-initial_range, initial_range], ``normal`` with
            std initial_range, or ``zeros``; drawn from a generator seeded by the key
            (and ``seed``), so a row's first value does not depend on arrival order
            or on the number of servers.
        num_buckets: virtual buckets keys are hashed into (DESIGN.md "Routing");
            fixed at creation.
        num_shards: internal shards per server, each with its own lock.
        accessor: row statistics, admission, shrink and a row cap
            (:class:`AccessorConfig`); the default has none of them.
    """

    kind: Literal["sparse"] = "sparse"
    name: str = Field(min_length=1)
    dim: int = Field(gt=0, le=65536)
    rule: RuleConfig = RuleConfig()
    initializer: Initializer = "uniform"
    initial_range: float = Field(0.01, ge=0)
    seed: int = Field(0, ge=0)
    num_buckets: int = Field(4096, gt=0)
    num_shards: int = Field(8, gt=0, le=1024)
    accessor: AccessorConfig = AccessorConfig()


class DenseTableConfig(_Frozen):
    """A dense table: the flat float32 vector of a model's dense parameters.

    Each server holds some blocks of it; ``size`` is the number of floats this
    server holds (the worker-side ``DenseLayout`` decides which). ``dc_asgd_lambda``
    > 0 turns on DC-ASGD's delay compensation of async pushes (``dense_table``).
    """

    kind: Literal["dense"] = "dense"
    name: str = Field(min_length=1)
    size: int = Field(ge=0)
    rule: RuleConfig = RuleConfig()
    dc_asgd_lambda: float = Field(0.0, ge=0)


class SlicingConfig(_Frozen):
    """How dense parameters are cut into blocks and placed on servers.

    As Paddle's ``slice_var_up`` / ``split_method`` / ``min_block_size``: with
    slicing, a parameter of n elements is cut into at most ``server_num`` blocks of
    at least ``min_block_size`` elements, aligned to whole rows; blocks go to
    servers round-robin (``RoundRobin``) or by a stable hash of the block's name
    (``HashName``). Without slicing each parameter is one block.
    """

    slice_var_up: bool = True
    split_method: SplitMethod = "RoundRobin"
    min_block_size: int = Field(8192, ge=1)


TableConfig = Annotated[SparseTableConfig | DenseTableConfig, Field(discriminator="kind")]

_ADAPTER: TypeAdapter[SparseTableConfig | DenseTableConfig] = TypeAdapter(TableConfig)


def table_config_from_json(text: str) -> SparseTableConfig | DenseTableConfig:
    """Parse a table config sent over the wire.

    Raises:
        pydantic.ValidationError: a field is missing, unknown or out of range.
    """
    return _ADAPTER.validate_json(text)
