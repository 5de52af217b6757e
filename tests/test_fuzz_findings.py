"""The defects the server fuzz test (tests/test_fuzz_server.py) found in psfleet/ps, fixed.

- F4 (in part): a request's long name (a barrier's, a table's) was quoted whole in the
  error message; above 16 KiB the client got RESOURCE_EXHAUSTED "Stream removed"
  instead of the reason. Names are now quoted at most ``MAX_ECHO_CHARS`` characters
  (``psfleet.errors.clip_text``), by the worker checks, the table-size checks and the
  sparse and dense tables.
- F5: a dense save's flat index was trusted: a negative position wrapped around on
  load (``values[-5]``: the last element silently overwritten), a repeated or huge one
  loaded garbage or allocated without bound. Save refuses negative positions; Load
  requires the saved positions to cover 0..n-1 once each and integer arrays of
  matching shapes (DataError), and refuses a negative position of the loading server.
- F6: a ``.sparse`` file whose header gives a huge bucket or row count made Load read
  (allocate) that many bytes: RESOURCE_EXHAUSTED under a memory limit. The header's
  sizes must now add up to the file's size, and the offsets rise from 0 to n.
- F7: Save or Load of ``nosuchproto://x`` or ``http://...`` (no aiohttp) raised
  fsspec's ValueError / ImportError: INTERNAL. Now ConfigError (INVALID_ARGUMENT).
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import fsspec
import numpy as np
import pytest

from psfleet.errors import (
    MAX_ECHO_CHARS,
    ConfigError,
    DataError,
    InvalidRequestError,
    RemoteError,
    clip_text,
)
from psfleet.ps import TableService
from psfleet.ps.dense_table import DenseTable
from psfleet.ps.persist import load_server, save_server
from psfleet.ps.request_checks import check_table_config, config_difference
from psfleet.ps.table.sparse_table import SparseTable
from psfleet.ps.types import DenseTableConfig, RuleConfig, ServerLimits, SparseTableConfig
from psfleet.rpc import messages as msg

pytestmark = pytest.mark.unit

SGD = RuleConfig(name="sgd", learning_rate=0.1)
LONG = "n" * 100_000


def test_clip_text_keeps_short_text_and_names_the_length_of_long_text() -> None:
    assert clip_text("emb") == "emb"
    clipped = clip_text(LONG)
    assert clipped == "n" * MAX_ECHO_CHARS + "... (100000 characters)"


def test_a_barrier_with_a_long_name_is_refused_with_a_short_message() -> None:
    service = TableService(barrier_timeout_s=0.1, job_worker_num=1)
    with pytest.raises(InvalidRequestError) as err:
        service.Barrier(msg.BarrierRequest(name=LONG, worker_index=0, worker_num=2))
    text = str(err.value)
    assert "worker_num 2 differs from this job's worker_num 1" in text
    assert "(100010 characters)" in text and len(text) < 1000  # "barrier " + repr
    config = DenseTableConfig(name=LONG[:1024], size=2, rule=SGD)  # the longest allowed
    service.CreateTable(msg.CreateTableRequest(table_id=0, config_json=config.model_dump_json(),
                                               init_values=np.zeros(2, "<f4").tobytes(),
                                               server_num=1))
    with pytest.raises(InvalidRequestError) as err:
        service.PushDense(msg.PushDenseRequest(table_id=0, grads=np.zeros(3, "<f4").tobytes()))
    assert "3 gradients pushed, expected 2" in str(err.value)
    assert len(str(err.value)) < 1000


def test_tables_with_long_names_quote_them_clipped() -> None:
    sparse = SparseTable(SparseTableConfig(name=LONG, dim=4, rule=SGD))
    with pytest.raises(InvalidRequestError) as err:
        sparse.push(np.arange(3, dtype=np.uint64), np.zeros((2, 4), np.float32))
    assert "expected (3, 4)" in str(err.value) and len(str(err.value)) < 1000
    with pytest.raises(InvalidRequestError) as err:
        DenseTable(DenseTableConfig(name=LONG, size=4, rule=SGD), np.zeros(3, np.float32))
    assert "3 initial values sent, expected 4" in str(err.value)
    assert len(str(err.value)) < 1000
    with pytest.raises(InvalidRequestError) as err:
        check_table_config(7, SparseTableConfig(name=LONG, dim=5000), ServerLimits())
    assert "dim 5000 is above 4096" in str(err.value) and len(str(err.value)) < 1000


def _dense(values: np.ndarray) -> DenseTable:
    return DenseTable(DenseTableConfig(name="d", size=values.size, rule=SGD), values)


def test_save_refuses_a_negative_dense_position(tmp_path: Path) -> None:
    table = _dense(np.arange(4, dtype=np.float32))
    with pytest.raises(RemoteError, match="holds -1; positions are >= 0"):
        save_server({3: table}, tmp_path, 0, {3: np.array([0, 1, 2, -1], np.int64)})
    assert not (tmp_path / "server-0" / "table-3.dense").exists()


def _write_dense(folder: Path, server: int, index: np.ndarray, values: np.ndarray,
                 state: np.ndarray) -> None:
    path = folder / f"server-{server}" / "table-3.dense"
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, index=index, values=values, state=state)
    path.write_bytes(buffer.getvalue())


@pytest.mark.parametrize("index", [
    np.array([0, 1, 2, -1]),  # was: the last element overwritten through values[-1]
    np.array([0, 1, 1, 3]),  # position 2 never saved, 1 twice
    np.array([0, 1, 2, 2**62]),  # was: np.zeros(2^62 + 1)
    np.array([0.0, 1.0, 2.0, 3.0]),  # was: IndexError (INTERNAL)
])
def test_load_refuses_dense_positions_that_do_not_cover_each_once(
        tmp_path: Path, index: np.ndarray) -> None:
    _write_dense(tmp_path, 0, index, np.full(4, 9, np.float32), np.zeros(0, np.float32))
    table = _dense(np.arange(4, dtype=np.float32))
    with pytest.raises(DataError, match="table-3.dense"):
        load_server({3: table}, tmp_path, 0, 1, {3: np.arange(4)})
    assert table.pull().tolist() == [0, 1, 2, 3]


def test_load_of_two_servers_dense_parts_still_restores_them(tmp_path: Path) -> None:
    _write_dense(tmp_path, 0, np.array([3, 0]), np.array([30, 0], np.float32),
                 np.zeros(0, np.float32))
    _write_dense(tmp_path, 1, np.array([1, 2]), np.array([10, 20], np.float32),
                 np.zeros(0, np.float32))
    table = _dense(np.zeros(3, dtype=np.float32))
    assert load_server({3: table}, tmp_path, 0, 1, {3: np.array([2, 3, 1])}) == {3: 3}
    assert table.pull().tolist() == [20, 30, 10]


def test_load_refuses_a_values_array_of_another_length(tmp_path: Path) -> None:
    _write_dense(tmp_path, 0, np.arange(4), np.zeros(3, np.float32), np.zeros(0, np.float32))
    with pytest.raises(DataError, match="damaged dense table file"):
        load_server({3: _dense(np.zeros(4, np.float32))}, tmp_path, 0, 1, {3: np.arange(4)})


def test_load_refuses_a_negative_position_of_the_loading_server(tmp_path: Path) -> None:
    table = _dense(np.arange(4, dtype=np.float32))
    save_server({3: table}, tmp_path, 0, {3: np.arange(4)})
    with pytest.raises(RemoteError, match="holds -1"):
        load_server({3: table}, tmp_path, 0, 1, {3: np.array([0, 1, 2, -1])})


_HEADER = struct.Struct("<8sIIIIQ")


@pytest.mark.parametrize(("buckets", "n", "offsets"), [
    (2**32 - 1, 0, None),  # was: a 32 GiB read (RESOURCE_EXHAUSTED under a limit)
    (4, 2**40, None),  # rows the file does not hold
    (4, 2, [0, 2, 1, 0, 2]),  # offsets that fall
    (4, 2, [1, 1, 1, 1, 2]),  # offsets that do not start at 0
])
def test_load_refuses_a_sparse_header_that_does_not_fit_the_file(
        tmp_path: Path, buckets: int, n: int, offsets: list[int] | None) -> None:
    table = SparseTable(SparseTableConfig(name="emb", dim=2, rule=SGD, num_buckets=4))
    body = _HEADER.pack(b"PSFLSPRS", 2, 2, 2, buckets, n)
    if offsets is not None:
        body += np.array(offsets, "<i8").tobytes() + np.arange(n, dtype="<u8").tobytes()
        body += np.zeros(n * 2, "<f4").tobytes()
    path = tmp_path / "server-0" / "table-0.sparse"
    path.parent.mkdir(parents=True)
    path.write_bytes(body)
    with pytest.raises(DataError, match="table-0.sparse"):
        load_server({0: table}, tmp_path, 0, 1, {})
    assert len(table) == 0


@pytest.mark.parametrize("missing_package", [False, True])
def test_save_and_load_of_an_unusable_url_are_config_errors(
        monkeypatch: pytest.MonkeyPatch, missing_package: bool) -> None:
    """F7: fsspec's ValueError (unknown protocol) or ImportError (a filesystem whose
    package is not installed: http:// without aiohttp) reached the server's catch-all:
    INTERNAL. Now a ConfigError (INVALID_ARGUMENT)."""
    if missing_package:
        def no_package(url: str, **options: object) -> None:
            raise ImportError("HTTPFileSystem requires 'requests' and 'aiohttp'")
        monkeypatch.setattr(fsspec.core, "url_to_fs", no_package)
    table = _dense(np.zeros(2, np.float32))
    for call in (lambda: save_server({3: table}, "nosuchproto://x", 0, {3: np.arange(2)}),
                 lambda: load_server({3: table}, "nosuchproto://x", 0, 1, {3: np.arange(2)})):
        with pytest.raises(ConfigError, match="is not a folder this process can use"):
            call()


def test_a_config_conflict_names_only_the_fields_that_differ() -> None:
    here = SparseTableConfig(name="emb", dim=8, rule=RuleConfig(name="adam", learning_rate=0.001))
    sent = here.model_copy(update={"dim": 16, "rule": RuleConfig(name="adam", learning_rate=0.5)})
    assert config_difference(here, sent) == ("dim: 8 here, 16 sent; rule.learning_rate: "
                                             "0.001 here, 0.5 sent")
    assert config_difference(here, DenseTableConfig(name="emb", size=4)) == (
        "a SparseTableConfig here, a DenseTableConfig sent")
