"""The checks of the embedding tables a config or a model declares: poolings, accessors
and which table holds which feature. No torch here, so reading and checking a config
(``psfleet k8s render``, the launcher's preflight) does not import it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, get_args

from pydantic import ValidationError

from psfleet.data.types import FeatureSchema
from psfleet.errors import ConfigError
from psfleet.ps.types import AccessorConfig

__all__ = ["POOLINGS", "AccessorSpec", "NamedFeatures", "Pooling", "check_accessor",
           "check_pooling", "check_table_features"]

#: An embedding's accessor as given: the config, its fields as a dict (YAML), or None
#: (the table without statistics, ``AccessorConfig()``).
AccessorSpec = AccessorConfig | Mapping[str, Any] | None

#: How a bag of ids (one feature of one example) becomes one vector, with ``w`` the ids'
#: weights (1 without weights) and ``e`` their rows: ``sum`` = sum(w*e); ``mean`` =
#: sum(w*e) / sum(w); ``sqrtn`` = sum(w*e) / sqrt(sum(w^2)). An empty bag (or a zero
#: denominator) pools to zeros. torch.nn.EmbeddingBag's ``sum`` / ``mean``, Paddle's
#: ``sequence_pool`` SUM / AVERAGE / SQRT, TensorFlow's
#: ``safe_embedding_lookup_sparse`` combiners ``sum`` / ``mean`` / ``sqrtn``.
Pooling = Literal["sum", "mean", "sqrtn"]
POOLINGS: tuple[Pooling, ...] = get_args(Pooling)


def check_pooling(pooling: str, where: str) -> Pooling:
    """``pooling`` if it is one of :data:`POOLINGS`.

    Raises:
        ConfigError: it is not (names ``where`` and the allowed values).
    """
    if pooling not in POOLINGS:
        raise ConfigError(f"{where}: pooling {pooling!r} is not one of "
                          f"{', '.join(POOLINGS)}")
    return pooling  # type: ignore[return-value]


def check_accessor(accessor: AccessorSpec, where: str) -> AccessorConfig:
    """``accessor`` as an :class:`~psfleet.ps.types.AccessorConfig` (None: the default,
    no statistics; a mapping is validated field by field).

    Raises:
        ConfigError: a field is unknown or out of range, or ``accessor`` is neither a
            config, a mapping nor None (names ``where`` and ``accessor.<field>``).
    """
    if accessor is None:
        return AccessorConfig()
    if isinstance(accessor, AccessorConfig):
        return accessor
    if not isinstance(accessor, Mapping):
        raise ConfigError(f"{where}: accessor must be an AccessorConfig, a dict of its "
                          f"fields or None, got {type(accessor).__name__}")
    try:
        return AccessorConfig.model_validate(dict(accessor))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        if not field:  # a rule over several fields: its message names them
            raise ConfigError(f"{where}: {first['msg'].removeprefix('Value error, ')}"
                              ) from None
        if first["type"] == "extra_forbidden":
            raise ConfigError(f"{where}: accessor.{field}: unknown field; the fields are "
                              f"{', '.join(AccessorConfig.model_fields)}") from None
        raise ConfigError(f"{where}: accessor.{field}: {first['msg']} (got "
                          f"{first.get('input')!r})") from None


class NamedFeatures(Protocol):
    """A table as the check below reads it: a name and the features it holds."""

    @property
    def name(self) -> str: ...

    @property
    def features(self) -> Sequence[str]: ...


def check_table_features(schema: FeatureSchema, tables: Sequence[NamedFeatures]) -> None:
    """Every feature of ``schema`` is in exactly one of ``tables``, every feature a table
    names exists, and table names are distinct (the rule of FeatureEmbeddings and of
    the runner's ``hyper_parameters.tables``).

    Raises:
        ConfigError: the first problem, naming the table and the feature (with the
            closest feature name for a misspelt one).
    """
    if not tables:
        raise ConfigError("no tables; give at least one")
    names = [t.name for t in tables]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"table names {repeated} are used more than once; give each table "
                          "a distinct name")
    known = schema.features
    owner: dict[str, str] = {}
    for table in tables:
        unknown = [f for f in table.features if f not in known]
        if unknown:
            close = difflib.get_close_matches(unknown[0], known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"table {table.name!r} names features {unknown} that are not in "
                              f"the schema{hint}; its features are {_listing(known)}")
        for feature in table.features:
            if feature in owner:
                raise ConfigError(f"feature {feature!r} is in tables {owner[feature]!r} and "
                                  f"{table.name!r}; put it in one")
            owner[feature] = table.name
    unread = [f for f in known if f not in owner]
    if unread:
        raise ConfigError(f"features {_listing(unread)} of the schema are in no table; add "
                          "them to a table's features (every sparse feature needs one)")


def _listing(names: Sequence[str], most: int = 30) -> str:
    """``names`` as a list, the first ``most`` of them when there are more."""
    if len(names) <= most:
        return repr(list(names))
    return f"{list(names[:most])!r} and {len(names) - most} more"
