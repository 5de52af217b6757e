"""Hypothesis strategies of psfleet requests for the server fuzz test.

Every strategy draws a :class:`FuzzRequest`: the method, the request's wire bytes, the
auth token sent (the job's on most requests, none or a wrong one on some) and a label.
Messages are valid protobuf encodings whose fields are mutated: huge, zero and
wrapping counts, dims and bucket counts, buffers whose length disagrees with the
table's dim, NaN/Inf values, duplicate and reserved keys, unknown enum values,
unknown fields appended, empty and oversized payloads. :func:`raw_bodies` draws
undecodable bodies: random bytes and valid messages with bytes flipped, cut or added.

The tables the server holds when the fuzz starts (``tests/test_fuzz_server.py``):
sparse :data:`KNOWN_SPARSE` (dim 4) and dense :data:`KNOWN_DENSE` (16 floats) hold
known values and receive only pushes that carry a defect (so none may change them);
sparse :data:`FUZZ_SPARSE` (dim 8) and dense :data:`FUZZ_DENSE` (64 floats, DC-ASGD)
take valid pushes too. CreateTable with a valid config only names those ids or
:data:`POOL` (so the fuzz creates a bounded number of tables); Save writes only under
the test's ``tmp_path`` (or ``memory://fuzz``); Load reads missing, empty or damaged
saves (``tests/_fuzz_saves.py``), never a folder Save wrote (a valid save loaded with
a permuted dense index would legitimately permute the known dense values), so it
cannot restore other values into the known tables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _fuzz_server import TOKEN, WRONG_TOKEN
from hypothesis import strategies as st

from psfleet.rpc import psfleet_pb2 as pb

__all__ = ["FuzzRequest", "Paths", "requests_for", "raw_bodies", "KNOWN_SPARSE",
           "KNOWN_DENSE", "FUZZ_SPARSE", "FUZZ_DENSE", "POOL", "DIMS", "SIZES"]

KNOWN_SPARSE, KNOWN_DENSE, FUZZ_SPARSE, FUZZ_DENSE = 0, 1, 2, 3
POOL = tuple(range(100, 108))
DIMS = {KNOWN_SPARSE: 4, FUZZ_SPARSE: 8}
SIZES = {KNOWN_DENSE: 16, FUZZ_DENSE: 64}
RESERVED = 2**64 - 1
U32_EDGES = (0, 1, 2, 3, 7, 255, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1)
U64_EDGES = (0, 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1)


@dataclass(frozen=True)
class FuzzRequest:
    """One request: ``payload`` is sent as is to ``method`` with ``token`` (None: none)."""

    method: str
    payload: bytes
    token: str | None
    label: str


@dataclass(frozen=True)
class Paths:
    """Folders of the test: ``saves`` (Save writes there), ``loads`` (damaged saves)."""

    saves: Path
    loads: Path


u32 = st.one_of(st.sampled_from(U32_EDGES), st.integers(0, 2**32 - 1))
u64 = st.one_of(st.sampled_from(U64_EDGES), st.integers(0, 2**64 - 1))
# An enum field is an int32 on the wire (proto3 enums are open: any value decodes).
enums = st.one_of(st.sampled_from([-1, 3, 2**31 - 1, -2**31]), st.integers(-2**31, 2**31 - 1))
tokens = st.sampled_from([TOKEN] * 8 + [None, WRONG_TOKEN])
# Row counts: mostly small, sometimes 4096 or 65536, rarely 500,000 (4 MB of keys, a
# 16 MB pull response).
counts = st.integers(0, 99).flatmap(
    lambda p: st.integers(0, 8) if p < 45 else st.integers(0, 600) if p < 90
    else st.sampled_from([4096, 65536]) if p < 98 else st.just(500_000))
VALUE_KINDS = ("normal", "zeros", "huge", "tiny", "nan", "inf", "-inf")


def _values(kind: str, size: int, seed: int) -> np.ndarray:
    """float32[size] of ``kind``; a NaN/Inf kind puts the bad value at one place."""
    rng = np.random.default_rng(seed)
    out = rng.normal(size=size).astype(np.float32)
    if kind == "zeros":
        out[:] = 0
    elif kind == "huge":
        out = np.clip(out, -1, 1) * np.float32(3e38)
    elif kind == "tiny":
        out *= np.float32(1e-44)
    elif kind in ("nan", "inf", "-inf") and size:
        out[rng.integers(size)] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[kind]
    return out


@st.composite
def _floats(draw: st.DrawFn, size: int) -> tuple[bytes, str]:
    kind = draw(st.sampled_from(VALUE_KINDS))
    return _values(kind, size, draw(st.integers(0, 2**16))).tobytes(), kind


@st.composite
def _keys(draw: st.DrawFn, n: int) -> np.ndarray:
    """uint64[n]: small (known keys among them), wide, repeated, or with 2^64-1."""
    kind = draw(st.sampled_from(["small", "small", "wide", "dups", "reserved", "arange"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    if kind == "arange" or n > 10_000:  # big requests reuse the same 16,384 rows
        return np.arange(n, dtype=np.uint64) % np.uint64(16_384)
    if kind == "wide" and n <= 64:
        keys = rng.integers(0, 2**63, size=n, dtype=np.uint64) * np.uint64(2)
    else:
        keys = rng.integers(0, 10_000, size=n).astype(np.uint64)
    if kind == "dups" and n:
        keys[rng.integers(n, size=max(1, n // 2))] = keys[0]
    if kind == "reserved" and n:
        keys[rng.integers(n)] = np.uint64(RESERVED)
    return keys


def _append_unknown(draw: st.DrawFn, payload: bytes) -> bytes:
    """Sometimes append a valid unknown field (number 1000+) to a message's bytes."""
    if not draw(st.booleans()):
        return payload
    number = draw(st.integers(1000, 5000))
    data = draw(st.binary(max_size=32))
    return payload + bytes(_varint(number << 3 | 2)) + bytes(_varint(len(data))) + data


def _varint(value: int) -> list[int]:
    out = []
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return out


def _done(draw: st.DrawFn, method: str, message: object, label: str,
          token: str | None = None) -> FuzzRequest:
    payload = _append_unknown(draw, message.SerializeToString())  # type: ignore[attr-defined]
    return FuzzRequest(method, payload, draw(tokens) if token is None else token, label)


_ids = st.sampled_from([0, 1, 2, 2, 3, 3, 4, 100])
table_ids = st.one_of(_ids, _ids, _ids, u32)

# -- CreateTable --------------------------------------------------------------------------
# Names up to 100,000 characters: a CreateTable refused for another config quotes them,
# and the status message must still reach the client (finding F4: messages are capped).
names = st.one_of(st.text(max_size=12), st.sampled_from(["", "x" * 3000, "x" * 100_000,
                                                         "emb\x00"]))
rules = st.fixed_dictionaries({"name": st.sampled_from(["sgd", "adagrad", "adam", "bogus"])},
                              optional={"learning_rate": st.sampled_from([0.1, 0, -1, 1e308]),
                                        "beta1": st.sampled_from([0.9, 1.0, -0.1]),
                                        "epsilon": st.sampled_from([1e-8, 0])})
big_ints = st.sampled_from([0, -1, 1, 2, 7, 4096, 4097, 65536, 65537, 2**20 + 1, 2**31,
                            2**40, 2**63, 10**30])


@st.composite
def _config(draw: st.DrawFn) -> tuple[str, bool, int]:
    """(config JSON, well formed, dense size) for CreateTable."""
    kind = draw(st.sampled_from(["sparse", "sparse", "dense", "dense", "garbage", "extra",
                                 "valid"]))
    if kind == "valid":  # one of the few configs a server accepts
        name = draw(st.sampled_from(["t", "emb", "x" * 3000]))
        config = draw(st.sampled_from([
            {"kind": "sparse", "name": name, "dim": 4, "rule": {"name": "sgd"}},
            {"kind": "sparse", "name": name, "dim": 9, "num_buckets": 7, "num_shards": 3},
            {"kind": "dense", "name": name, "size": 16, "rule": {"name": "adam"}}]))
        size = config.get("size", 0)
        return json.dumps(config), True, size if isinstance(size, int) else 0
    if kind == "garbage":
        text = draw(st.one_of(st.text(max_size=40), st.sampled_from([
            "", "{", "null", "[]", '{"kind": "sparse"', "[" * 100_000, '{"kind": "other"}',
            '{"kind": "sparse", "name": "a", "dim": NaN}'])))
        return text, False, 0
    if kind in ("sparse", "extra"):
        config = {"kind": "sparse", "name": draw(names),
                  "dim": draw(st.one_of(st.integers(1, 64), big_ints)),
                  "rule": draw(rules),
                  "initializer": draw(st.sampled_from(["uniform", "normal", "zeros", "x"])),
                  "initial_range": draw(st.sampled_from([0.01, 0, -1, 1e38])),
                  "seed": draw(st.one_of(st.integers(0, 9), big_ints)),
                  "num_buckets": draw(st.one_of(st.sampled_from([1, 7, 4096, 65536]),
                                                big_ints.filter(lambda v: v != 2**20))),
                  "num_shards": draw(st.one_of(st.integers(1, 16), big_ints))}
        if kind == "extra":
            config["unknown_field"] = 1
        return json.dumps(config), True, 0
    size = draw(st.one_of(st.integers(0, 100), big_ints))
    config = {"kind": "dense", "name": draw(names), "size": size, "rule": draw(rules),
              "dc_asgd_lambda": draw(st.sampled_from([0.0, 0.5, -1.0]))}
    return json.dumps(config), True, size


@st.composite
def create_table(draw: st.DrawFn) -> FuzzRequest:
    text, well_formed, size = draw(_config())
    table_id = draw(st.sampled_from([0, 1, 2, 3, *POOL]) if well_formed else table_ids)
    n = size if 0 <= size <= 10_000 and draw(st.booleans()) else draw(counts)
    init, kind = draw(_floats(min(n, 100_000)))
    index = draw(st.one_of(st.binary(max_size=24), st.integers(0, 100).map(
        lambda k: np.arange(k, dtype="<i8").tobytes())))
    message = pb.CreateTableRequest(table_id=table_id, config_json=text, init_values=init,
                                    server_index=draw(u32), server_num=draw(u32),
                                    dense_index=index)
    return _done(draw, "CreateTable", message, f"table {table_id} {kind} {text[:60]!r}")


# -- PullSparse / PullDense -------------------------------------------------------------
@st.composite
def pull_sparse(draw: st.DrawFn) -> FuzzRequest:
    n = draw(counts)
    keys = draw(_keys(n)).tobytes() + b"\x00" * draw(st.sampled_from([0] * 6 + [1, 7]))
    table_id = draw(table_ids)
    create = draw(st.booleans()) and n <= 10_000
    message = pb.PullSparseRequest(table_id=table_id, keys=keys, create=create)
    return _done(draw, "PullSparse", message, f"table {table_id} {len(keys)} key bytes")


@st.composite
def pull_dense(draw: st.DrawFn) -> FuzzRequest:
    message = pb.PullDenseRequest(table_id=draw(table_ids), worker_index=draw(u32))
    return _done(draw, "PullDense", message, f"table {message.table_id}")


# -- PushSparse / PushDense -------------------------------------------------------------
DEFECTS = ("nan", "shape", "worker_index", "mode", "sync_worker_num")


@st.composite
def _push_fields(draw: st.DrawFn, known: bool) -> dict[str, object]:
    mode = draw(st.one_of(st.sampled_from([0, 0, 1, 2]), enums))
    fields: dict[str, object] = {
        "mode": mode, "worker_index": draw(st.sampled_from([0, 0, 0, 1]) | u32),
        "worker_num": draw(st.sampled_from([1, 1, 0, 2]) | u32), "step": draw(u64),
        "push_id": pb.PushId(client_id=draw(u64), seq=draw(u64))}
    if not known and draw(st.booleans()):  # a valid push, but for the payload's values
        fields.update(mode=draw(st.sampled_from([0, 1, 2])), worker_index=0, worker_num=1,
                      defect="none")
    if known:  # a push to a known table carries a defect: it must change nothing
        fields["defect"] = draw(st.sampled_from(DEFECTS))
        if fields["defect"] == "worker_index":
            fields["worker_index"] = draw(st.integers(1, 2**32 - 1))
            fields["worker_num"] = 1
        elif fields["defect"] == "mode":
            fields["mode"] = draw(enums.filter(lambda v: v not in (0, 1, 2)))
        elif fields["defect"] == "sync_worker_num":
            fields["mode"] = 1
            fields["worker_num"] = draw(st.sampled_from([0, 2]) | u32.filter(lambda v: v != 1))
    return fields


@st.composite
def push_sparse(draw: st.DrawFn) -> FuzzRequest:
    table_id = draw(table_ids)
    known = table_id == KNOWN_SPARSE
    fields = draw(_push_fields(known))
    defect = fields.pop("defect", None)
    n = draw(st.integers(1, 600) if defect == "nan" else counts.filter(lambda k: k <= 65536))
    keys = draw(_keys(n))
    dim = DIMS.get(table_id, draw(st.integers(1, 9)))
    rows = draw(st.one_of(st.just(n), st.just(n), st.integers(0, n + 2)))
    width = draw(st.one_of(st.just(dim), st.just(dim), st.integers(1, 9)))
    if defect == "none":
        rows, width, extra = n, dim, 0
    elif defect == "shape":
        rows, width = n, dim
        extra = draw(st.integers(1, dim))  # one float to one whole row too many
    else:
        extra = draw(st.sampled_from([0] * 8 + [1, 3]))
    grads, kind = draw(_floats(rows * width + extra))
    if defect == "nan":
        rows, width = n, dim
        grads, kind = _values("nan", n * dim, draw(st.integers(0, 99))).tobytes(), "nan"
    message = pb.PushSparseRequest(table_id=table_id, keys=keys.tobytes(), grads=grads,
                                   **fields)  # type: ignore[arg-type]
    return _done(draw, "PushSparse", message,
                 f"table {table_id} n {n} {rows}x{width}+{extra} {kind} mode {fields['mode']} "
                 f"worker {fields['worker_index']}/{fields['worker_num']} defect {defect}")


@st.composite
def push_dense(draw: st.DrawFn) -> FuzzRequest:
    table_id = draw(table_ids)
    known = table_id == KNOWN_DENSE
    fields = draw(_push_fields(known))
    defect = fields.pop("defect", None)
    size = SIZES.get(table_id, 16)
    n = draw(st.one_of(st.just(size), st.just(size), counts.filter(lambda k: k <= 65536)))
    if defect == "none":
        n = size
    elif defect == "shape":
        n = draw(st.integers(0, 3 * size).filter(lambda k: k != size))
    grads, kind = draw(_floats(size if defect == "nan" else n))
    if defect == "nan":
        grads, kind = _values("nan", size, draw(st.integers(0, 99))).tobytes(), "nan"
    if defect != "none":
        grads += b"\x00" * draw(st.sampled_from([0] * 8 + [1, 2]))
    message = pb.PushDenseRequest(table_id=table_id, grads=grads,
                                  **fields)  # type: ignore[arg-type]
    return _done(draw, "PushDense", message,
                 f"table {table_id} {len(grads)} bytes {kind} mode {fields['mode']} "
                 f"worker {fields['worker_index']}/{fields['worker_num']} defect {defect}")


# -- Barrier, Clock, Stats, Stop ---------------------------------------------------------------
@st.composite
def barrier(draw: st.DrawFn) -> FuzzRequest:
    message = pb.BarrierRequest(
        name=draw(st.one_of(st.text(max_size=20), st.just("b" * 100_000))),
        worker_index=draw(st.sampled_from([0, 0, 1]) | u32),
        worker_num=draw(st.sampled_from([1, 1, 0, 2]) | u32))
    return _done(draw, "Barrier", message,
                 f"worker {message.worker_index}/{message.worker_num}")


@st.composite
def clock(draw: st.DrawFn) -> FuzzRequest:
    # A need above every clock waits for the others (a long poll of up to 0.5 s): rare,
    # so 1,000 requests stay quick; any steps and incarnation, the parking any int.
    message = pb.ClockRequest(
        worker_index=draw(st.sampled_from([0, 0, 1]) | u32),
        worker_num=draw(st.sampled_from([1, 1, 0, 2]) | u32),
        incarnation=draw(st.sampled_from([0, 0, 1]) | u32), steps=draw(u64),
        need=draw(st.sampled_from([0] * 40 + [1, 2**64 - 1])),
        parking=draw(st.sampled_from([0, 1, 2]) | enums))
    return _done(draw, "Clock", message,
                 f"worker {message.worker_index}/{message.worker_num} incarnation "
                 f"{message.incarnation} steps {message.steps} need {message.need}")


@st.composite
def stats(draw: st.DrawFn) -> FuzzRequest:
    return _done(draw, "Stats", pb.StatsRequest(), "stats")


@st.composite
def stop(draw: st.DrawFn) -> FuzzRequest:
    """A Stop never carries the job's token (the test stops the server last)."""
    token = draw(st.sampled_from([None, WRONG_TOKEN, TOKEN + " ", TOKEN[:-1], ""]))
    message = pb.StopRequest(worker_index=draw(u32))
    payload = _append_unknown(draw, message.SerializeToString())
    return FuzzRequest("Stop", payload, token or None, f"stop token {token!r}")


# -- Save, Load ---------------------------------------------------------------------------
def _dense_entries(draw: st.DrawFn) -> list[pb.DenseIndex]:
    out = []
    for table_id in draw(st.lists(st.sampled_from([1, 3, 0, 2, 4, *POOL[:2]]) | u32,
                                  max_size=4)):
        length = draw(st.one_of(st.sampled_from([SIZES.get(table_id, 0)]),
                                st.integers(0, 100)))
        raw = draw(st.sampled_from(["arange", "reversed", "huge", "negative"]))
        index = np.arange(length, dtype="<i8")
        if raw == "reversed":
            index = index[::-1].copy()
        elif raw == "huge" and length:
            index[-1] = 2**62
        elif raw == "negative" and length:
            index[0] = -5
        tail = b"\x01" * draw(st.sampled_from([0] * 6 + [3]))
        out.append(pb.DenseIndex(table_id=table_id, index=index.tobytes() + tail))
    return out


@st.composite
def save(draw: st.DrawFn, paths: Paths) -> FuzzRequest:
    name = draw(st.text(alphabet="abcdefgh-_.", min_size=1, max_size=8).filter(
        lambda s: s not in (".", "..")))
    dirname = draw(st.sampled_from([
        str(paths.saves / name), f"file://{paths.saves / name}", f"relative/{name}",
        "memory://fuzz/save", "", "nosuchproto://x", str(paths.saves / ("n" * 300)),
        str(paths.saves / "a" / ".." / "b")]))
    message = pb.SaveRequest(dirname=dirname, server_index=draw(u32),
                             dense=_dense_entries(draw))
    return _done(draw, "Save", message, f"dirname {dirname!r} server {message.server_index}")


@st.composite
def load(draw: st.DrawFn, paths: Paths) -> FuzzRequest:
    dirname = draw(st.sampled_from([
        str(paths.loads / "missing"), str(paths.loads / "empty"),
        *(str(p) for p in sorted(paths.loads.glob("damaged-*"))), f"file://{paths.loads}",
        "memory://fuzz/never-saved", "relative/missing", "nosuchproto://x",
        "http://127.0.0.1:9/save",
        str(paths.loads / ("n" * 300))]))
    message = pb.LoadRequest(dirname=dirname, server_index=draw(u32),
                             server_num=draw(st.sampled_from([0, 1, 2]) | u32),
                             dense=_dense_entries(draw))
    return _done(draw, "Load", message,
                 f"dirname {dirname!r} server {message.server_index}/{message.server_num}")


def requests_for(method: str, paths: Paths) -> st.SearchStrategy[FuzzRequest]:
    """The strategy of mutated, decodable requests to ``method``."""
    table = {"CreateTable": create_table(), "PullSparse": pull_sparse(),
             "PushSparse": push_sparse(), "PullDense": pull_dense(),
             "PushDense": push_dense(), "Barrier": barrier(), "Clock": clock(), "Save": save(paths),
             "Load": load(paths), "Stats": stats(), "Stop": stop()}
    return table[method]


@st.composite
def raw_bodies(draw: st.DrawFn, method: str, paths: Paths) -> bytes:
    """Undecodable-looking bodies for ``method``: random bytes, or a valid request to
    ``method`` with bytes flipped, cut off or inserted."""
    if draw(st.booleans()):
        return draw(st.binary(min_size=1, max_size=300))
    body = bytearray(draw(requests_for(method, paths)).payload[:4096])
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        at = draw(st.integers(0, max(len(body) - 1, 0)))
        if op == "flip" and body:
            body[at] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del body[at:]
        else:
            body[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(body) or b"\xff"
