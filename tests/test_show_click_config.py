"""The accessor of each table-backed module: SparseEmbedding, SparseEmbeddingBag and
EmbeddingTableSpec take ``accessor=`` (an AccessorConfig, a dict of its fields or None)
and hand it to their table's config; a bad field is a ConfigError naming the embedding
and the field."""

from __future__ import annotations

import pytest

from psfleet.errors import ConfigError
from psfleet.nn import EmbeddingTableSpec, SparseEmbedding, SparseEmbeddingBag
from psfleet.ps.types import AccessorConfig, RuleConfig

pytestmark = pytest.mark.unit


def test_default_accessor_is_the_table_without_statistics() -> None:
    embedding = SparseEmbedding(4, name="plain_default")
    config = embedding.table_config(RuleConfig())
    assert config.accessor == AccessorConfig()
    assert config.accessor.name == "none" and not config.accessor.active


@pytest.mark.parametrize("module", [SparseEmbedding, SparseEmbeddingBag])
def test_a_dict_accessor_reaches_the_table_config(module: type[SparseEmbedding]) -> None:
    embedding = module(4, name=f"ctr_{module.__name__}",
                       accessor={"name": "ctr", "nonclk_coeff": 0.25, "max_rows": 1000})
    accessor = embedding.table_config(RuleConfig()).accessor
    assert (accessor.name, accessor.nonclk_coeff, accessor.max_rows) == ("ctr", 0.25, 1000)
    assert accessor.click_coeff == 1.0  # the fields not given keep their defaults


def test_an_accessor_config_is_taken_as_it_is() -> None:
    given = AccessorConfig(name="ctr", delete_threshold=0.5)
    embedding = SparseEmbedding(4, name="ctr_given", accessor=given)
    assert embedding.table_config(RuleConfig()).accessor is given


@pytest.mark.parametrize(("accessor", "field"), [
    ({"name": "ctr", "nonclk_coeff": "x"}, "accessor.nonclk_coeff"),
    ({"name": "ctx"}, "accessor.name"),
    ({"name": "ctr", "delete_threshold": -1}, "accessor.delete_threshold"),
    ({"name": "ctr", "decay": 0.9}, "accessor.decay: unknown field"),
    ({"eviction": "lowest_score", "max_rows": 10}, "accessor.eviction"),
])
def test_a_bad_field_names_the_embedding_and_the_field(accessor: dict[str, object],
                                                       field: str) -> None:
    with pytest.raises(ConfigError, match=rf"SparseEmbedding 'bad_ctr': {field}"):
        SparseEmbedding(4, name="bad_ctr", accessor=accessor)


def test_an_accessor_of_another_type_is_rejected() -> None:
    with pytest.raises(ConfigError, match="'odd': accessor must be an AccessorConfig, a "
                                          "dict of its fields or None, got str"):
        SparseEmbedding(4, name="odd", accessor="ctr")  # type: ignore[arg-type]


def test_table_spec_validates_its_accessor_and_stays_hashable() -> None:
    spec = EmbeddingTableSpec("wide", 1, ("C1",), accessor={"name": "ctr"})
    assert isinstance(spec.accessor, AccessorConfig) and spec.accessor.name == "ctr"
    assert spec == EmbeddingTableSpec("wide", 1, ("C1",), accessor=AccessorConfig(name="ctr"))
    assert hash(spec) == hash(EmbeddingTableSpec("wide", 1, ("C1",),
                                                 accessor=AccessorConfig(name="ctr")))
    with pytest.raises(ConfigError, match=r"EmbeddingTableSpec 'wide': accessor.click_coeff"):
        EmbeddingTableSpec("wide", 1, ("C1",), accessor={"click_coeff": float("nan")})
