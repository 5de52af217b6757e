"""Dense parameters cut into blocks and placed on servers (DenseLayout, slice_var_up).

The oracle is Paddle's ``slice_variable`` (fluid/transpiler/distribute_transpiler.py),
transcribed below: a parameter of n elements gets ``split = min(S, max(1, n //
min_block_size))`` blocks of ``ceil(n / split)`` elements rounded up to whole rows
(``prod(shape[1:])``); the count is recomputed after the rounding and the last block
takes the remainder. Blocks go to servers round-robin over all blocks of all
parameters (RoundRobin) or to ``crc32(block name) % S`` (HashName).
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Iterator, Sequence
from functools import reduce

import numpy as np
import pytest

from psfleet.ps import LocalClient, RemoteClient, RuleConfig, TableService, start_server
from psfleet.ps.routing import DenseLayout
from psfleet.ps.types import SlicingConfig
from psfleet.rpc import RpcConfig, RunningServer

pytestmark = pytest.mark.service

HOST = "127.0.0.1"
CONFIG = RpcConfig(deadline_s=20.0, max_retries=2, backoff_initial_s=0.05, server_threads=8)


def paddle_slice_variable(shape: tuple[int, ...], slice_count: int,
                          min_block_size: int) -> list[int]:
    """Block sizes of one variable as Paddle's ``slice_variable`` computes them."""
    var_numel = reduce(lambda x, y: x * y, shape, 1)
    split_count = slice_count
    max_pserver_count = int(math.floor(var_numel / float(min_block_size)))
    if max_pserver_count == 0:
        max_pserver_count = 1
    if max_pserver_count < slice_count:
        split_count = max_pserver_count
    block_size = int(math.ceil(var_numel / float(split_count)))
    if len(shape) >= 2:  # align by dim1 (width)
        dim1 = reduce(lambda x, y: x * y, shape[1:], 1)
        remains = block_size % dim1
        if remains != 0:
            block_size += dim1 - remains
    split_count = int(math.ceil(var_numel / float(block_size)))
    return [min(block_size, var_numel - block_id * block_size)
            for block_id in range(split_count)]


def _sizes(layout: DenseLayout, param: int) -> list[int]:
    return [b.size for b in layout.blocks if b.name.split(".")[1] == str(param)]


def test_large_parameter_is_cut_into_blocks_of_whole_rows() -> None:
    slicing = SlicingConfig(min_block_size=8192)
    layout = DenseLayout([(300, 100)], 4, slicing)
    # 30,000 elements hold 3 blocks of >= 8,192 (not 4); 10,000 is 100 whole rows each.
    assert [b.size for b in layout.blocks] == [10000, 10000, 10000]
    assert [b.offset for b in layout.blocks] == [0, 10000, 20000]
    assert [b.server for b in layout.blocks] == [0, 1, 2]
    assert [b.name for b in layout.blocks] == ["dense.0.block0", "dense.0.block1",
                                               "dense.0.block2"]
    assert [layout.server_size(s) for s in range(4)] == [10000, 10000, 10000, 0]
    # One row more: 3 blocks of 101 rows do not fit evenly; the last is the remainder.
    assert [b.size for b in DenseLayout([(301, 100)], 4, slicing).blocks] == [
        10100, 10100, 9900]


@pytest.mark.parametrize("shape", [(16, 117), (117,), (8192,), (1,), (3, 4, 5)])
def test_parameters_up_to_min_block_size_stay_one_block(shape: tuple[int, ...]) -> None:
    layout = DenseLayout([shape], 4, SlicingConfig(min_block_size=8192))
    assert [b.size for b in layout.blocks] == [int(np.prod(shape))]


SHAPES: list[tuple[int, ...]] = [
    (300, 100), (301, 100), (10, 5000), (50000,), (20000,), (117, 16), (16,), (1000, 9),
    (7, 3, 1000), (65536, 2), (8191,), (8193,), (2, 8192), (40000, 1),
]


@pytest.mark.parametrize("num_servers", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("min_block_size", [1, 100, 1024, 8192])
def test_block_sizes_follow_paddles_slice_variable(num_servers: int,
                                                   min_block_size: int) -> None:
    layout = DenseLayout(SHAPES, num_servers, SlicingConfig(min_block_size=min_block_size))
    for i, shape in enumerate(SHAPES):
        sizes = _sizes(layout, i)
        assert sizes == paddle_slice_variable(shape, num_servers, min_block_size), shape
        numel = int(np.prod(shape))
        row = int(np.prod(shape[1:])) if len(shape) >= 2 else 1
        assert sum(sizes) == numel
        assert len(sizes) <= num_servers
        # Whole rows in every block but the remainder; at least min_block_size unless
        # the parameter itself is smaller or the block is the remainder.
        assert all(size % row == 0 for size in sizes[:-1])
        assert all(size >= min_block_size for size in sizes[:-1])
        if numel >= min_block_size and len(sizes) == 1:
            assert sizes[0] >= min_block_size
    assert layout.total == sum(int(np.prod(s)) for s in SHAPES)
    offsets = [b.offset for b in layout.blocks]
    assert offsets == list(np.cumsum([0] + [b.size for b in layout.blocks])[:-1])


def test_without_slicing_each_parameter_is_one_block() -> None:
    layout = DenseLayout([(300, 100), (5,), (3, 3)], 4, SlicingConfig(slice_var_up=False))
    assert [b.size for b in layout.blocks] == [30000, 5, 9]
    assert [b.server for b in layout.blocks] == [0, 1, 2]


def test_round_robin_places_blocks_in_turn_across_parameters() -> None:
    layout = DenseLayout([(300, 100), (5,), (20000,)], 3, SlicingConfig(min_block_size=8192))
    assert [b.size for b in layout.blocks] == [10000, 10000, 10000, 5, 10000, 10000]
    assert [b.server for b in layout.blocks] == [0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize("num_servers", [2, 3, 5])
def test_hash_name_places_each_block_by_crc32_of_its_name(num_servers: int) -> None:
    slicing = SlicingConfig(split_method="HashName", min_block_size=1024)
    layout = DenseLayout(SHAPES, num_servers, slicing, name="mlp")
    for block in layout.blocks:
        assert block.name.startswith("mlp.")
        assert block.server == zlib.crc32(block.name.encode()) % num_servers
    again = DenseLayout(SHAPES, num_servers, slicing, name="mlp")
    assert again.blocks == layout.blocks  # deterministic: no per-process hash seed
    assert len({b.server for b in layout.blocks}) == num_servers  # spread over all
    round_robin = DenseLayout(SHAPES, num_servers, SlicingConfig(min_block_size=1024),
                              name="mlp")
    assert [b.size for b in round_robin.blocks] == [b.size for b in layout.blocks]
    assert [b.server for b in round_robin.blocks] != [b.server for b in layout.blocks]


@pytest.mark.parametrize("split_method", ["RoundRobin", "HashName"])
@pytest.mark.parametrize("num_servers", [1, 2, 3, 4])
def test_scatter_gather_round_trip(split_method: str, num_servers: int) -> None:
    layout = DenseLayout(SHAPES, num_servers,
                         SlicingConfig(split_method=split_method,  # type: ignore[arg-type]
                                       min_block_size=2048))
    flat = np.random.default_rng(0).normal(size=layout.total).astype(np.float32)
    parts = layout.scatter(flat)
    assert [p.size for p in parts] == [layout.server_size(s) for s in range(num_servers)]
    assert sum(p.size for p in parts) == layout.total
    for server, part in enumerate(parts):  # each part is its blocks, in block order
        mine = [flat[b.offset:b.offset + b.size] for b in layout.blocks if b.server == server]
        np.testing.assert_array_equal(part, np.concatenate(mine) if mine else [])
    np.testing.assert_array_equal(layout.gather(parts), flat)
    out = np.zeros(layout.total, np.float32)
    assert layout.gather(parts, out=out) is out
    np.testing.assert_array_equal(out, flat)


@contextlib.contextmanager
def remote_client(num_servers: int) -> Iterator[RemoteClient]:
    started: list[RunningServer] = []
    client = None
    try:
        for _ in range(num_servers):
            _, server = start_server(HOST, 0, CONFIG, TableService(barrier_timeout_s=20.0))
            started.append(server)
        client = RemoteClient([s.endpoint for s in started], CONFIG)
        yield client
    finally:
        if client is not None:
            client.close()
        for server in started:
            server.stop(grace_s=0.5)


def _train_dense(client: RemoteClient | LocalClient, shapes: Sequence[tuple[int, ...]],
                 slicing: SlicingConfig, rule: RuleConfig) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    total = sum(int(np.prod(s)) for s in shapes)
    client.create_dense_table(0, "dense", shapes, rule,
                              rng.normal(size=total).astype(np.float32), slicing)
    seen = [client.pull_dense(0)]
    for _ in range(5):
        client.push_dense(0, rng.normal(size=total).astype(np.float32))
        seen.append(client.pull_dense(0))
    return seen


@pytest.mark.parametrize("split_method", ["RoundRobin", "HashName"])
@pytest.mark.parametrize("rule_name", ["sgd", "adam"])
def test_sliced_dense_table_on_two_servers_equals_local(split_method: str,
                                                        rule_name: str) -> None:
    shapes = [(300, 100), (100,), (100, 50), (50,)]
    slicing = SlicingConfig(split_method=split_method,  # type: ignore[arg-type]
                            min_block_size=4096)
    rule = RuleConfig(name=rule_name, learning_rate=0.05)  # type: ignore[arg-type]
    layout = DenseLayout(shapes, 2, slicing)
    assert len(layout.blocks) > len(shapes)  # the large parameters are sliced
    assert min(layout.server_size(s) for s in range(2)) > 4096  # both servers hold blocks
    local = _train_dense(LocalClient(), shapes, slicing, rule)
    with remote_client(2) as client:
        remote = _train_dense(client, shapes, slicing, rule)
    for a, b in zip(local, remote, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(local[0], local[-1])
