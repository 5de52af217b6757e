"""Whether a checkpoint fits the model being trained: same tables, dims, shapes, rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psfleet.checkpoint.manifest import CheckpointError, Manifest

__all__ = ["check_compatible"]

_SPARSE_FIELDS = ("dim", "num_buckets")


def check_compatible(manifest: Manifest, where: str, sparse: Mapping[str, Mapping[str, Any]],
                     dense_shapes: Sequence[Sequence[int]], rule: Mapping[str, Any]) -> None:
    """Raise when the checkpoint at ``where`` was written by another model.

    Args:
        manifest: the checkpoint's manifest.
        where: its location, for messages.
        sparse: this model's sparse tables: name -> SparseTableConfig as a dict.
        dense_shapes: this model's dense parameter shapes, in order.
        rule: this model's dense optimizer rule (RuleConfig as a dict).

    Raises:
        CheckpointError: names the table (or parameter) and both values.
    """
    def fail(what: str, saved: object, now: object) -> None:
        raise CheckpointError(f"checkpoint {where} does not fit this model: {what} is "
                              f"{saved} in the checkpoint, {now} in this model. Use another "
                              "checkpoint_dir, or the model the checkpoint was written with")

    for name, config in sparse.items():
        saved = manifest.sparse_tables.get(name)
        if saved is None:
            fail(f"sparse table {name!r}", "absent", "present")
            continue
        for field in _SPARSE_FIELDS:
            if saved.get(field) != config.get(field):
                fail(f"sparse table {name!r} {field}", saved.get(field), config.get(field))
        saved_rule = saved.get("rule", {}).get("name")
        if saved_rule != config["rule"]["name"]:
            fail(f"sparse table {name!r} optimizer rule", repr(saved_rule),
                 repr(config["rule"]["name"]))
    for name in manifest.sparse_tables:
        if name not in sparse:
            fail(f"sparse table {name!r}", "present", "absent")
    saved_shapes = [list(s) for s in manifest.dense.get("shapes", [])]
    now_shapes = [list(s) for s in dense_shapes]
    if saved_shapes != now_shapes:
        if len(saved_shapes) != len(now_shapes):
            fail("the number of dense parameters", len(saved_shapes), len(now_shapes))
        for i, (a, b) in enumerate(zip(saved_shapes, now_shapes, strict=True)):
            if a != b:
                fail(f"dense parameter {i} shape", tuple(a), tuple(b))
    saved_rule = manifest.dense.get("rule", {}).get("name")
    if saved_rule is not None and saved_rule != rule.get("name"):
        fail("the dense table's optimizer rule", repr(saved_rule), repr(rule.get("name")))
