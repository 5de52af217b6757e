"""The YAML runner's configuration, PaddleRec style, validated on load.

Sections: ``runner`` (data, epochs, batch size, mode, output), ``hyper_parameters``
(model shape and optimizer) and ``cluster`` (servers and workers). Unknown keys and
bad values are errors naming the field path and the allowed values, e.g.
``runner.sync_mode: 'asyc' is not one of 'sync', 'async', 'geo'``. Relative paths are relative to
the directory of the YAML file, so an example runs from any working directory.

Every rule between fields is a validator of these models (so it holds for any
``TrainConfig``, however made): ``runner.use_gpu``, the parser's ``slots`` /
``columns``, ``global_shuffle``, the reader that sync mode needs, servers versus
``collective``. What needs the file system (data files) or the model registry is
checked by :func:`psfleet.rec.preflight.check_before_start`. ``psfleet train`` runs
both before it starts any process. The names allowed (modes, optimizers,
initializers) are declared once, in ``psfleet.types`` and ``psfleet.ps.types``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from psfleet.checkpoint import CheckpointConfig
from psfleet.data.columnar import ColumnsConfig
from psfleet.data.libsvm import LibsvmConfig
from psfleet.data.parsers import make_parser
from psfleet.data.slot_format import SlotFormatConfig
from psfleet.data.types import FeatureSchema
from psfleet.errors import ConfigError
from psfleet.fleet.lr_scaling import LrScaling, check_lr_scaling
from psfleet.fleet.strategy import DistributedStrategy
from psfleet.job.modes import mode_spec
from psfleet.nn.table_checks import Pooling, check_table_features
from psfleet.ps.communicator.types import (
    GEO_STEP,
    AsyncConfig,
    PassConfig,
    check_async_only,
)
from psfleet.ps.types import AccessorConfig, Initializer, OptimizerClass
from psfleet.rec.cluster_config import ClusterConfig
from psfleet.rec.dropout import check_dropout
from psfleet.rec.online_config import AfterPassConfig, check_online_keys, table_accessors
from psfleet.types import Mode

__all__ = ["EarlyStoppingConfig", "RunnerConfig", "OptimizerConfig", "TableConfig",
           "HyperParameters", "ClusterConfig", "TrainConfig", "check_equal_steps_reader",
           "check_tables", "parser_kind", "parser_options", "parser_schema", "strategy_of"]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EarlyStoppingConfig(_Section):
    """``runner.early_stopping``: stop training when validation stops improving.

    After each validation (every ``runner.valid_interval`` epochs) worker 0 compares
    ``metric`` with the best so far; after ``patience`` validations in a row without an
    improvement of at least ``min_delta``, every worker stops at that epoch's end and
    the run finishes as usual (test evaluation, export). The rule of Keras'
    ``EarlyStopping`` callback (``monitor``, ``patience``, ``min_delta``); the model
    kept is the last one, not the best.

    Attributes:
        metric: ``auc`` (higher is better) or ``logloss`` (lower is better).
        patience: validations without improvement before stopping (>= 1).
        min_delta: the smallest change that counts as an improvement (>= 0).
    """

    metric: Literal["auc", "logloss"] = "auc"
    patience: int = Field(2, ge=1)
    min_delta: float = Field(0.0, ge=0)


class RunnerConfig(_Section):
    """``runner``: what to train on and how.

    Attributes:
        train_data_dir: a file, a directory of files, or a list of them (one data
            set). With ``train_passes`` it may be left out (it is then every pass).
        train_passes: online training: an ordered list of passes (a file or folder
            each, e.g. day folders), trained one after the other, each ``epochs``
            times; ``after_pass`` acts at each pass's end
            (:mod:`psfleet.rec.online_config`, docs/online-training.md).
        after_pass: what the job does after each pass: ``{shrink, set_date, save,
            validate}`` (``AfterPassConfig``; needs ``train_passes``).
        test_data_dir: the same, for the test AUC at the end (optional).
        valid_data_dir: the same, evaluated by worker 0 during training (AUC, log
            loss, COPC) every ``valid_interval`` epochs and after the last one
            (optional; read like the test data).
        valid_interval: epochs between validations (>= 1).
        epochs: passes over the training data (with ``train_passes``: over each pass).
        batch_size: examples per worker per step (global batch = batch_size x
            worker_num).
        sync_mode: the parameter-server mode: ``sync``, ``async``, ``geo`` or
            ``gpubox`` (pass mode: each pass's rows cached on the worker); or
            ``collective``: no servers, ``cluster.worker_num`` ranks all-reduce
            gradients (torch.distributed); ``cluster.server_num`` must be 0.
        use_gpu: collective mode: train each rank on a GPU (nccl); an error when
            there is no GPU.
        geo_step, lr_scaling, a_sync_configs, pass_configs: the fleet strategy's
            fields of the same names, described there once
            (``psfleet.fleet.strategy.DistributedStrategy``; :func:`strategy_of`).
        thread_num: CPU threads of each worker's torch ops.
        print_interval: steps between progress-bar refreshes.
        model_save_path: the folder of the run folders: each run writes
            ``<model_save_path>/<run_name>/`` (config.yaml, metrics.json, logs,
            ``tensorboard/``, ``curves.png``, ``model/``) and points
            ``<model_save_path>/latest`` at it (:mod:`psfleet.rec.run_folder`).
        run_name: the run folder's name (default: the start time, YYYYmmdd-HHMMSS);
            naming an existing, unfinished run continues it.
        reader_type: ``DataLoader`` (torch DataLoader over the in-memory reader),
            ``QueueDataset`` (streamed, not shuffled) or ``InMemoryDataset``
            (in memory, shuffled, optional global shuffle); see psfleet.data.
        parser: input format: ``criteo`` (raw TSV), ``slot`` (PaddleRec slot text,
            ``slots``), ``csv`` / ``parquet`` (``columns``), ``libsvm`` (libSVM or,
            with ``libsvm.fields``, libFFM lines).
        slots: the slot parser's slots (psfleet.data.SlotFormatConfig).
        columns: the csv / parquet parser's columns (psfleet.data.ColumnsConfig).
        libsvm: the libsvm parser's options (psfleet.data.LibsvmConfig).
        pipe_command: shell command each text file is piped through (its stdout is
            parsed), as PaddleRec's ``cat FILE | pipe_command``.
        pipe_cwd: working directory of pipe_command (default: the YAML file's folder).
        reader_thread_num: parse threads of each worker's reader (PaddleRec's dataset
            ``thread_num``; here ``thread_num`` stays the torch CPU threads).
        split_file_list: False: each worker reads whole files (needs >= worker_num
            files); True: every worker reads its 1/worker_num of each file's lines.
        global_shuffle: InMemoryDataset: exchange examples among workers after loading
            (through ``exchange_dir``).
        exchange_dir: directory shared by all workers for global_shuffle and sync-mode
            counts (default ``<run folder>/exchange``; on several machines a
            shared file system).
        dataset_debug: log reader timing (parse time, queue wait, lines/s) per pass.
        strict: stop at the first malformed line instead of skipping it.
        max_malformed_fraction: the job fails (naming the counts and the first bad
            line) when more than this fraction of a worker's lines in a pass were
            malformed; below it they are skipped with warnings.
        model: registered model name: ``dnn``, ``wide_deep``, ``deepfm``, ``dcn_v2``.
        seed: seed of dense initialisation and shuffling.
        shuffle: shuffle each worker's examples every epoch.
        checkpoint: ``{checkpoint_dir, max_num_checkpoints, epoch_interval,
            step_interval}`` (``CheckpointConfig``; optional). With it, a run resumes
            from the newest complete checkpoint in ``checkpoint_dir`` (a relative path
            is relative to the YAML file) and writes checkpoints as configured.
        export_model: worker 0 exports the trained model for serving after the test
            evaluation (``fleet.save_inference_model``; score it with ``psfleet
            predict``), to ``inference_model_path``.
        inference_model_path: where the export goes (default ``<run folder>/model``).
        early_stopping: stop training when the validation metric stops improving
            (``EarlyStoppingConfig``; needs ``valid_data_dir``).
    """

    train_data_dir: Path | list[Path]
    train_passes: list[Path] | None = Field(None, min_length=1)
    after_pass: AfterPassConfig | None = None
    test_data_dir: Path | list[Path] | None = None
    valid_data_dir: Path | list[Path] | None = None
    valid_interval: int = Field(1, ge=1)
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(512, ge=1)
    sync_mode: Mode = "async"
    geo_step: int = Field(GEO_STEP, ge=1)
    lr_scaling: LrScaling = "auto"
    a_sync_configs: AsyncConfig = AsyncConfig()
    pass_configs: PassConfig = PassConfig()
    use_gpu: bool = False
    thread_num: int = Field(1, ge=1)
    print_interval: int = Field(10, ge=1)
    model_save_path: Path = Path("output")
    reader_type: Literal["DataLoader", "QueueDataset", "InMemoryDataset"] = "DataLoader"
    parser: Literal["criteo", "slot", "csv", "parquet", "libsvm"] = "criteo"
    slots: SlotFormatConfig | None = None
    columns: ColumnsConfig | None = None
    libsvm: LibsvmConfig | None = None
    pipe_command: str | None = None
    pipe_cwd: Path | None = None
    reader_thread_num: int = Field(1, ge=1, le=64)
    split_file_list: bool = True
    global_shuffle: bool = False
    exchange_dir: Path | None = None
    dataset_debug: bool = False
    strict: bool = False
    max_malformed_fraction: float = Field(0.01, ge=0, le=1)
    model: str = "dnn"
    seed: int = Field(0, ge=0)
    shuffle: bool = True
    checkpoint: CheckpointConfig | None = None
    export_model: bool = True
    inference_model_path: Path | None = None
    run_name: str | None = None
    early_stopping: EarlyStoppingConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _passes_are_the_data(cls, raw: object) -> object:
        """Without ``train_data_dir``, ``train_passes`` is the training data (every
        pass, in order); with both, they must name the same paths."""
        if not isinstance(raw, dict) or raw.get("train_passes") is None:
            return raw
        passes = raw["train_passes"]
        if "train_data_dir" not in raw:
            return {**raw, "train_data_dir": passes}
        given = raw["train_data_dir"]
        if [str(p) for p in (given if isinstance(given, list) else [given])] != [
                str(p) for p in (passes if isinstance(passes, list) else [passes])]:
            raise ConfigError("runner.train_data_dir: give either train_data_dir (one data "
                              "set) or train_passes (the passes, in order), not both")
        return raw

    @field_validator("run_name")
    @classmethod
    def _one_folder_name(cls, name: str | None) -> str | None:
        if name is not None and (name in ("", ".", "..", "latest") or "/" in name
                                 or "\\" in name or name.startswith(".")):
            raise ValueError("not a folder name: use letters, digits, '-', "
                             "'_' (no '/', not 'latest', not starting with '.')")
        return name

    @property
    def run_dir(self) -> Path:
        """This run's folder, ``<model_save_path>/<run_name>`` (``run`` when unnamed:
        :mod:`psfleet.rec.run_folder`)."""
        return self.model_save_path / (self.run_name or "run")

    @property
    def model_dir(self) -> Path:
        """Where the exported model goes: ``inference_model_path``, else
        ``<run folder>/model``."""
        return self.inference_model_path or self.run_dir / "model"

    @property
    def needs_equal_steps(self) -> bool:
        """Whether every worker must run the same number of steps per epoch: in sync
        mode, and with checkpoints inside epochs (every worker takes part in each)."""
        mode = mode_spec(self.sync_mode)
        rounds = mode_spec(self.pass_configs.dense_mode).rounds if mode.passes else mode.rounds
        return rounds or bool(
            self.checkpoint is not None and self.checkpoint.step_interval)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> RunnerConfig:
        if self.use_gpu:
            # The runner's tables and dense-gradient path are host (numpy) code; GPU
            # training through it is not built yet (fleetrun --devices and nccl are).
            # One message whatever the mode: pointing at collective mode would send the
            # user to a second error.
            raise ConfigError("runner.use_gpu: True: the YAML runner trains on CPU in this "
                              "release; set use_gpu: false (a fleet-API script can use the "
                              "GPUs that fleetrun --mode collective --devices hands out)")
        if self.parser in ("csv", "parquet") and self.columns is None:
            raise ConfigError(f"runner.columns: required with runner.parser: {self.parser} "
                              "(label, dense and sparse columns)")
        if self.columns is not None and self.columns.label is None:
            raise ConfigError("runner.columns.label: required (the column holding the 0/1 "
                              "label); psfleet predict scores a file without that column by "
                              "itself, with the label named here")
        used = {"slot": "slots", "csv": "columns", "parquet": "columns",
                "libsvm": "libsvm"}.get(self.parser)
        for field in ("slots", "columns", "libsvm"):
            if field != used and getattr(self, field) is not None:
                raise ConfigError(f"runner.{field}: not used by runner.parser: {self.parser}; "
                                  f"remove it (or set the parser that reads it)")
        if self.early_stopping is not None and self.valid_data_dir is None:
            raise ConfigError("runner.early_stopping: needs runner.valid_data_dir (the "
                              "validation data whose metric it watches)")
        if mode_spec(self.sync_mode).passes and self.reader_type != "InMemoryDataset":
            raise ConfigError(f"runner.reader_type: sync_mode gpubox (pass mode) loads each "
                              f"pass into memory to collect its ids; set reader_type: "
                              f"InMemoryDataset (got {self.reader_type})")
        if (mode_spec(self.sync_mode).passes and self.checkpoint is not None
                and self.checkpoint.step_interval):
            raise ConfigError("runner.checkpoint.step_interval: sync_mode gpubox checkpoints "
                              "at pass boundaries only (a pass's rows are on the workers "
                              "until it ends); use runner.checkpoint.epoch_interval")
        try:
            check_async_only(self.sync_mode, self.a_sync_configs)
            check_lr_scaling(self.lr_scaling, self.sync_mode,
                             self.a_sync_configs.global_batch_aggregation)
        except ValueError as exc:
            raise ConfigError(f"runner.{exc}") from None
        if self.global_shuffle and self.reader_type != "InMemoryDataset":
            raise ConfigError(f"runner.global_shuffle: needs runner.reader_type: "
                              f"InMemoryDataset (got {self.reader_type})")
        return self


def check_equal_steps_reader(runner: RunnerConfig, worker_num: int, equal_steps: bool) -> None:
    """The reader can give every worker the same number of steps when the job needs it.

    Checked on load with ``cluster.worker_num`` and again by the reader with the job's
    real worker count (a job started by fleetrun or torchrun sets its own).

    Raises:
        ConfigError: QueueDataset over ``pipe_command`` or Parquet (example count
            unknown before reading) with several workers that need equal steps.
    """
    within = "" if mode_spec(runner.sync_mode).rounds else " with runner.checkpoint.step_interval"
    if (equal_steps and runner.reader_type == "QueueDataset"
            and worker_num > 1 and (runner.pipe_command or runner.parser == "parquet")):
        raise ConfigError(
            "runner.reader_type: QueueDataset with "
            f"{'runner.pipe_command' if runner.pipe_command else 'runner.parser: parquet'} "
            "cannot guarantee the same number of steps on every worker, which "
            f"runner.sync_mode: {runner.sync_mode}{within} "
            "needs (the example count is unknown before reading); use reader_type "
            "InMemoryDataset or DataLoader, or sync_mode async / geo without step "
            "checkpoints")


class OptimizerConfig(_Section):
    """``hyper_parameters.optimizer``: ``class`` (Adam, SGD, Adagrad), ``learning_rate``."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    class_: OptimizerClass = Field("Adam", alias="class")
    learning_rate: float = Field(0.001, gt=0)


class TableConfig(_Section):
    """One entry of ``hyper_parameters.tables``: a sparse table and the features whose
    ids it holds.

    Attributes:
        name: the table's name (distinct; its checkpoint and export files carry it).
        features: feature names of the parser's schema (``runner.columns`` /
            ``runner.slots`` names; Criteo: ``C1`` .. ``C26``). Every feature must be
            in exactly one table.
        dim: floats per row (default ``hyper_parameters.sparse_feature_dim``).
        pooling: how a multi-valued feature's rows become one: ``sum``, ``mean`` or
            ``sqrtn`` (``torch.nn.EmbeddingBag`` semantics; single-valued features are
            unaffected).
        optimizer: the rule the servers apply to this table's rows (default
            ``hyper_parameters.optimizer``).
        initializer, init_range: initial rows (default the
            ``embedding_initializer`` / ``embedding_init_range`` keys).
        shared_ids: the same id in two of the table's features is one row (e.g. a
            target item and the items of a history); by default each feature's ids
            are its own.
        accessor: this table's row lifecycle (``AccessorConfig``: name ``none`` /
            ``ctr``, admission, ``max_rows``, shrink thresholds...), replacing
            ``hyper_parameters.sparse_accessor`` for this table.
    """

    name: str = Field(min_length=1)
    features: list[str] = Field(min_length=1)
    dim: int | None = Field(None, ge=1)
    pooling: Pooling = "sum"
    optimizer: OptimizerConfig | None = None
    initializer: Initializer | None = None
    init_range: float | None = Field(None, ge=0)
    shared_ids: bool = False
    accessor: AccessorConfig | None = None


class HyperParameters(_Section):
    """``hyper_parameters``: model shape and optimizer (PaddleRec's rank/dnn names).

    ``tables`` (optional) splits the sparse features over several tables; without it
    one table named ``embedding`` holds every feature. ``cross_layers`` is dcn_v2's
    number of cross layers. ``sparse_accessor`` is every table's row lifecycle
    (``AccessorConfig``, Paddle's CtrCommonAccessor settings: ``name: ctr``,
    ``show_click_decay_rate``, ``delete_threshold``, ``max_rows``...; None: rows live
    forever), unless a table of ``tables`` sets its own ``accessor``. ``dropout`` is
    the dense tower's dropout while training (every built-in model): one rate in
    [0, 1) for every hidden layer, or one per ``fc_sizes`` entry; evaluation, the test
    figures and the export never drop (``model.eval()``).
    """

    optimizer: OptimizerConfig = OptimizerConfig()
    sparse_feature_dim: int = Field(9, ge=1)
    fc_sizes: list[int] = [512, 256, 128, 32]
    embedding_initializer: Initializer = "uniform"
    embedding_init_range: float = Field(0.01, ge=0)
    tables: list[TableConfig] | None = None
    cross_layers: int = Field(3, ge=1, le=16)
    sparse_accessor: AccessorConfig | None = None
    dropout: float | list[float] = 0.0

    @property
    def accessors(self) -> list[AccessorConfig | None]:
        """Every table's accessor, in table order (one table without ``tables``)."""
        own = [t.accessor for t in self.tables] if self.tables is not None else [None]
        return table_accessors(self.sparse_accessor, own)

    @field_validator("fc_sizes")
    @classmethod
    def _positive(cls, sizes: list[int]) -> list[int]:
        if not sizes or any(s < 1 for s in sizes):
            raise ValueError("must be a non-empty list of positive layer widths")
        return sizes

    @model_validator(mode="after")
    def _dropout_fits(self) -> HyperParameters:
        check_dropout(self.dropout, len(self.fc_sizes))
        return self


class TrainConfig(_Section):
    """The whole YAML file."""

    runner: RunnerConfig
    hyper_parameters: HyperParameters = HyperParameters()
    cluster: ClusterConfig = ClusterConfig()

    @model_validator(mode="after")
    def _cross_section_rules(self) -> TrainConfig:
        cluster, servers = self.cluster, mode_spec(self.runner.sync_mode).servers
        if not servers and cluster.server_num != 0:
            raise ConfigError(f"cluster.server_num: {cluster.server_num}, but runner.sync_mode:"
                              " collective has no servers; set cluster.server_num: 0 (ranks "
                              "are cluster.worker_num)")
        if not servers and cluster.tls is not None:
            raise ConfigError("cluster.tls: runner.sync_mode: collective has no gRPC channels "
                              "to protect (torch.distributed's gloo traffic is not "
                              "encrypted); remove cluster.tls, or run on a trusted network")
        if servers and cluster.server_num == 0 and cluster.worker_num > 1:
            raise ConfigError(f"cluster.worker_num: {cluster.worker_num} workers need servers; "
                              "set cluster.server_num >= 1 (or worker_num: 1 to train alone, "
                              "or runner.sync_mode: collective)")
        check_equal_steps_reader(self.runner, cluster.worker_num, self.runner.needs_equal_steps)
        check_tables(self.hyper_parameters.tables, parser_schema(self.runner))
        runner = self.runner
        check_online_keys(passes=runner.train_passes, after=runner.after_pass,
                          early_stopping=runner.early_stopping is not None,
                          valid_data=runner.valid_data_dir is not None, mode=runner.sync_mode,
                          accessors=self.hyper_parameters.accessors)
        return self


def parser_options(runner: RunnerConfig) -> object:
    """The options of the configured parser (``slots``, ``columns``), or None."""
    if runner.parser == "slot":
        return runner.slots  # None: PaddleRec's rank/dnn Criteo slots
    if runner.parser in ("csv", "parquet"):
        return runner.columns
    if runner.parser == "libsvm":
        return runner.libsvm  # None: libSVM lines (no fields)
    return None


def parser_schema(runner: RunnerConfig) -> FeatureSchema:
    """The features the configured parser yields, by name (no file is read).

    Raises:
        ConfigError: the parser rejects its options (names the key).
    """
    return make_parser(runner.parser, parser_options(runner)).schema


def parser_kind(runner: RunnerConfig) -> Literal["text", "parquet"]:
    """What the configured parser reads (``Parser.kind``): ``text`` or ``parquet``;
    it decides which files of a data folder are data (:mod:`psfleet.data.files`)."""
    return make_parser(runner.parser, parser_options(runner)).kind


def check_tables(tables: Sequence[TableConfig] | None, schema: FeatureSchema) -> None:
    """``hyper_parameters.tables`` against the data's features
    (:func:`psfleet.nn.features.check_table_features`: every feature in exactly one
    table, every named feature exists).

    Raises:
        ConfigError: names the key, the table and the feature at fault.
    """
    if tables is None:
        return
    try:
        check_table_features(schema, tables)
    except ConfigError as exc:
        raise ConfigError(f"hyper_parameters.tables: {exc}") from None


def strategy_of(config: TrainConfig) -> DistributedStrategy:
    """The fleet strategy a runner config describes: ``runner.sync_mode``,
    ``geo_step``, ``lr_scaling``, ``a_sync_configs``, ``pass_configs`` and
    ``cluster.server_wait_timeout_s`` (None: the environment's); collective mode on
    the CPU (gloo)."""
    runner = config.runner
    return DistributedStrategy(
        mode=runner.sync_mode, geo_step=runner.geo_step, lr_scaling=runner.lr_scaling,
        a_sync_configs=runner.a_sync_configs, pass_configs=runner.pass_configs,
        server_wait_timeout_s=config.cluster.server_wait_timeout_s,
        collective_backend="auto" if mode_spec(runner.sync_mode).servers else "gloo")
