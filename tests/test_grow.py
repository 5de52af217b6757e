"""A server added to a running replicated job takes its part of the shares while a
worker keeps pushing, with nothing lost (psfleet.ps.replica.grow, issue 20).

Two in-process servers, replication 2, six shares: each server holds all six and
serves three. A third server joins: moves bring it four copies, two of which it serves,
and release the giver's copy each time, so every server ends holding four and serving
two. Every row and the dense state end equal to an undisturbed run's.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import run_command
from test_replication import (
    CONFIG,
    DENSE,
    HOST,
    KEYS,
    SPARSE,
    _assert_copies_equal,
    _client,
    _train,
    _wait_for,
    servers,
)

from psfleet.errors import ConfigError, FatalError
from psfleet.launch.cluster import plan_job
from psfleet.launch.grow import (
    CONTROL_DIR,
    Growth,
    clean_control_dir,
    reply_path,
    request_servers,
    take_requests,
)
from psfleet.launch.types import LaunchConfig
from psfleet.ps import RemoteClient, TableService, start_server
from psfleet.ps.replica.host import Layout, ReplicaHost
from psfleet.ps.types import PushMode
from psfleet.replication import ShareMap, check_shares, shares_from_env
from psfleet.rpc import RunningServer
from psfleet.rpc import messages as msg

pytestmark = pytest.mark.service

SHARES = 6


def _job(started: list[tuple[TableService, RunningServer]]) -> RemoteClient:
    return _client(started, 0, SHARES)


def _added(endpoints: list[str], index: int, port: int = 0,
           incarnation: int = 0) -> tuple[RunningServer, ReplicaHost]:
    """A new server for index ``index`` of the job (process ``incarnation`` of it, on
    ``port``), holding nothing."""
    _, running = start_server(HOST, port, CONFIG, layout=Layout(tuple(endpoints), index, 2,
                                                                SHARES),
                              incarnation=incarnation)
    assert isinstance(running.handler, ReplicaHost)
    return running, running.handler


def _assert_a_push_lands_once(client: RemoteClient, rows: np.ndarray) -> None:
    """A delta push of ones to every key of ``KEYS`` (whose rows are ``rows`` now)
    moves each row by exactly one, wherever its share is served."""
    client.push_sparse(SPARSE, KEYS, np.ones((KEYS.size, 8), np.float32), mode=PushMode.DELTA)
    np.testing.assert_allclose(client.pull_sparse(SPARSE, KEYS, create=False), rows + 1.0,
                               rtol=0, atol=1e-6)


def _counts(hosts: list[ReplicaHost]) -> list[tuple[int, int]]:
    """(shares held, shares served) per host, as each one holds them."""
    counts = []
    for host in hosts:
        assert host._map is not None
        counts.append((len(host._shares), len(host._map.served_by(host._me))))
    return counts


def test_an_added_server_takes_a_third_of_the_shares_with_nothing_lost() -> None:
    with servers(2) as started:
        reference = _job(started)
        _train(reference, KEYS, 10, 0)
        _train(reference, KEYS, 20, 1)
        rows, dense = reference.pull_sparse(SPARSE, KEYS, create=False), reference.pull_dense(DENSE)
        reference.close()

    with servers(2) as started:
        endpoints = [r.endpoint for _, r in started]
        client = _job(started)
        hosts = [r.handler for _, r in started]
        assert all(isinstance(h, ReplicaHost) for h in hosts)
        assert _counts(hosts) == [(6, 3), (6, 3)]  # type: ignore[arg-type]
        _train(client, KEYS, 10, 0)
        running, added = _added(endpoints, 2)
        try:
            training = threading.Thread(target=_train, args=(client, KEYS, 20, 1))
            training.start()
            added.join(running.endpoint)
            every = [*hosts, added]
            _wait_for(lambda: _counts(every) == [(4, 2)] * 3,  # type: ignore[arg-type]
                      "the moves to the added server")
            training.join()
            share_map = added._map
            assert share_map is not None
            assert share_map.endpoints(endpoints) == [*endpoints, running.endpoint]
            for share in range(SHARES):  # two copies each, the same bytes
                first, second = share_map.holders(share)
                copies = [every[first[0]]._shares[share], every[second[0]]._shares[share]]
                _assert_copies_equal(*copies)  # type: ignore[arg-type]
            for host in every:  # psfleet status and /metrics: every share a server holds
                view = host.Stats(msg.StatsRequest(host_view=True))
                held = {t.table_id: t.rows for t in view.tables}
                assert held[SPARSE] == sum(len(s.tables[SPARSE]) for s in host._shares.values())
                assert list(view.shares_held) == sorted(host._shares)
                assert len(view.shares_served) == 2
                assert (view.share_num, view.replication) == (SHARES, 2)
            np.testing.assert_array_equal(client.pull_sparse(SPARSE, KEYS, create=False), rows)
            np.testing.assert_array_equal(client.pull_dense(DENSE), dense)
            assert client._directory is not None
            assert client._directory.endpoints == [*endpoints, running.endpoint]
            _assert_a_push_lands_once(client, rows)
        finally:
            client.close()
            running.handler.close()
            running.stop(grace_s=0.1)


def _grown(started: list[tuple[TableService, RunningServer]], steps: int
           ) -> tuple[list[str], RemoteClient, list[ReplicaHost], RunningServer, ReplicaHost]:
    """A worker of the two servers ``started`` that pushed ``steps`` steps, and a third
    server added to them once the moves have evened the shares out (each holds 4 and
    serves 2). Returns (the first endpoints, the worker, the first two hosts, the added
    server and its host)."""
    endpoints = [r.endpoint for _, r in started]
    client = _job(started)
    hosts = [r.handler for _, r in started]
    assert all(isinstance(h, ReplicaHost) for h in hosts)
    _train(client, KEYS, steps, 0)
    running, added = _added(endpoints, 2)
    added.join(running.endpoint)
    _wait_for(lambda: _counts([*hosts, added]) == [(4, 2)] * 3,  # type: ignore[list-item]
              "the moves to the added server")
    return endpoints, client, hosts, running, added  # type: ignore[return-value]


def test_an_added_server_that_died_is_refilled_then_restarted_and_joins_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The added server dies: its shares fail over and are refilled on the first two
    (each holds all six again). fleetrun restarts it on its port (incarnation 1): it
    joins again and moves bring it its third back, nothing lost."""
    monkeypatch.setenv("PSFLEET_REFILL_DELAY_S", "0")
    with servers(2) as started:
        endpoints, client, hosts, running, _ = _grown(started, 5)
        port = int(running.endpoint.rpartition(":")[2])
        running.handler.close()
        running.stop(grace_s=0.1)
        _train(client, KEYS, 3, 1)  # fails its shares over
        _wait_for(lambda: _counts(hosts) == [(6, 3), (6, 3)],  # type: ignore[arg-type]
                  "the refill of the dead server's shares")
        rows = client.pull_sparse(SPARSE, KEYS, create=False)
        restarted, again = _added(endpoints, 2, port, incarnation=1)
        try:
            again.join(restarted.endpoint)
            _wait_for(lambda: _counts([*hosts, again]) == [(4, 2)] * 3,  # type: ignore[list-item]
                      "the moves to the restarted server")
            assert again._map is not None and again._map.latest(2) == (2, 1)
            np.testing.assert_array_equal(client.pull_sparse(SPARSE, KEYS, create=False), rows)
        finally:
            client.close()
            restarted.handler.close()
            restarted.stop(grace_s=0.1)


def test_a_first_server_restarted_in_a_grown_job_takes_back_only_what_it_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Server 1 of the grown job (placed on all six shares, holding four after the
    moves) dies while a worker pushes and its next process rejoins before any refill:
    it takes back the four shares it held, not its placement's six, so no copy is
    made only to be released; its copies equal their primaries and a later push lands
    once."""
    monkeypatch.setenv("PSFLEET_REFILL_DELAY_S", "600")  # the restart comes first
    with servers(2) as started:
        endpoints, client, hosts, running, added = _grown(started, 15)
        restarted = None
        try:
            assert added._map is not None
            held, released = added._map.held_by((1, 0)), added._map.released
            started[1][1].handler.close()
            started[1][1].stop(grace_s=0.1)
            _train(client, KEYS, 3, 1)  # fails server 1's shares over
            rows = client.pull_sparse(SPARSE, KEYS, create=False)
            _, restarted = start_server(HOST, int(endpoints[1].rpartition(":")[2]), CONFIG,
                                        layout=Layout(tuple(endpoints), 1, 2, SHARES),
                                        incarnation=1)
            again = restarted.handler
            assert isinstance(again, ReplicaHost)
            training = threading.Thread(target=_train, args=(client, KEYS, 10, 2))
            training.start()
            again.rejoin()
            training.join()
            assert sorted(again._shares) == held and len(held) == 4
            every = [hosts[0], again, added]
            assert [len(h._shares) for h in every] == [4, 4, 4]  # type: ignore[attr-defined]
            assert again._map is not None and again._map.released == released
            for share in held:
                primary = again._map.primary(share)
                assert primary is not None
                if primary[0] != 1:
                    _assert_copies_equal(every[primary[0]]._shares[share],  # type: ignore[attr-defined]
                                         again._shares[share])
            before = client.pull_sparse(SPARSE, KEYS, create=False)
            assert not np.array_equal(before, rows)  # the 10 steps during the rejoin landed
            _assert_a_push_lands_once(client, before)
        finally:
            client.close()
            for server in (running, restarted):
                if server is not None:
                    server.handler.close()
                    server.stop(grace_s=0.1)


def test_a_server_added_with_a_taken_index_or_to_a_sync_job_is_refused() -> None:
    with servers(2) as started:
        endpoints = [r.endpoint for _, r in started]
        client = _job(started)
        running, added = _added(endpoints, 3)  # the next index is 2
        try:
            with pytest.raises(FatalError, match="the next server of this job is 2"):
                added.join(running.endpoint)
            _train(client, KEYS, 1, 0, PushMode.SYNC)  # a sync-mode job from now on
            running_2, added_2 = _added(endpoints, 2)
            try:
                with pytest.raises(FatalError, match="sync-mode job"):
                    added_2.join(running_2.endpoint)
            finally:
                running_2.handler.close()
                running_2.stop(grace_s=0.1)
        finally:
            client.close()
            running.handler.close()
            running.stop(grace_s=0.1)


def test_moves_even_out_the_shares() -> None:
    grown = ShareMap(2, 2, share_num=6).with_added(2, "h:3")
    assert grown.endpoints(["h:1", "h:2"]) == ["h:1", "h:2", "h:3"]
    back = grown.with_dead([(2, 0)]).with_added(2, "h:4", 1)  # restarted, another port
    assert back.latest(2) == (2, 1) and back.live_hosts() == [0, 1, 2]
    assert back.endpoints(["h:1", "h:2"])[2] == "h:4"
    moves = []
    while (move := grown.rebalance_move()) is not None:
        moves.append(move)
        grown = grown.with_joined(move.share, (move.host, 0), move.promote).with_released(
            move.share, [move.replaced])
    assert [(m.share, m.replaced[0], m.promote) for m in moves] == [
        (0, 0, True), (1, 1, True), (3, 0, False), (2, 1, False)]
    assert [len(grown.held_by((h, 0))) for h in range(3)] == [4, 4, 4]
    assert [len(grown.served_by((h, 0))) for h in range(3)] == [2, 2, 2]
    assert grown.holders(0) == [(2, 0), (1, 0)]  # the promoted copy serves
    # No move while a share has a copy fewer (the refill comes first), nor when even.
    assert grown.with_dead([(1, 0)]).rebalance_move() is None
    assert ShareMap(3, 2, share_num=6).rebalance_move() is None
    # What a restarted server takes back: what its last process that held any held.
    dead = grown.with_dead([(0, 0)])
    assert dead.held_when_dead(0) == [1, 2, 4, 5]  # not its placement's six
    assert dead.with_dead([(0, 1)]).held_when_dead(0) == [1, 2, 4, 5]  # 1 died unfilled
    filled = dead.with_joined(4, (0, 1)).with_dead([(0, 1)])
    assert filled.held_when_dead(0) == [4]
    assert ShareMap(3, 2).with_dead([(1, 0)]).held_when_dead(1) == [0, 1]  # never grown
    assert ShareMap(3, 2).held_when_dead(1) == []  # never dead


def test_the_share_setting() -> None:
    assert shares_from_env(2, 2, {}) == 2
    assert shares_from_env(2, 2, {"PSFLEET_SHARES": "6"}) == 6
    assert check_shares(None, 3, 1, "cluster.shares") == 3
    with pytest.raises(ConfigError, match="PSFLEET_SHARES: 1 shares for 2 servers"):
        shares_from_env(2, 2, {"PSFLEET_SHARES": "1"})
    with pytest.raises(ConfigError, match="needs replication >= 2"):
        check_shares(6, 2, 1, "cluster.shares")
    with pytest.raises(ConfigError, match="PSFLEET_SHARES: 'six'"):
        shares_from_env(2, 2, {"PSFLEET_SHARES": "six"})


def _write_endpoints(folder: Path, endpoints: list[str]) -> None:
    """The endpoint files fleetrun's servers write (``.endpoints/server.N``)."""
    (folder / ".endpoints").mkdir(parents=True)
    for i, endpoint in enumerate(endpoints):
        (folder / ".endpoints" / f"server.{i}").write_text(endpoint + "\n")


def _grow(target: Path, *extra: str) -> tuple[int, str, str]:
    r = run_command([sys.executable, "-m", "psfleet.cli.main", "grow", str(target), *extra],
                    timeout=120)
    return r.returncode, r.stdout, r.stderr


@pytest.mark.slow  # waits 15 s for a fleetrun that is not there
def test_psfleet_grow_refuses_a_job_it_cannot_grow(tmp_path: Path) -> None:
    """No fleetrun takes the request (servers run outside one): the request is
    withdrawn and the command says why; an unreplicated job and bad arguments are
    refused before any request is made."""
    with servers(2) as started:
        endpoints = [r.endpoint for _, r in started]
        _job(started).close()  # the servers now know the replicated layout
        _write_endpoints(tmp_path / "log", endpoints)
        code, _, err = _grow(tmp_path)
        assert code == 1
        assert "no fleetrun took the request within 15 s" in err
        assert not list((tmp_path / "log" / CONTROL_DIR).glob("*.request"))
    with servers(1) as started:
        _write_endpoints(tmp_path / "plain", [started[0][1].endpoint])
        code, _, err = _grow(tmp_path / "plain")
        assert code == 1 and "the job is not replicated" in err
        assert not (tmp_path / "plain" / CONTROL_DIR).exists()
    assert _grow(tmp_path, "--servers", "0")[0] == 2
    code, _, err = _grow(Path("127.0.0.1:1,127.0.0.1:2"))
    assert code == 2 and "needs the job's run folder or log folder" in err


def test_fleetrun_answers_a_grow_request_or_refuses_it(tmp_path: Path) -> None:
    """The control files between ``psfleet grow`` and fleetrun (psfleet.launch.grow)."""
    request = request_servers(tmp_path, 2)
    assert request.parent == tmp_path / CONTROL_DIR
    (taken,) = take_requests(tmp_path)
    assert taken.count == 2 and not request.exists()
    taken.answer([2, 3])
    assert json.loads(reply_path(request).read_text()) == {"started": [2, 3], "refused": None}
    assert take_requests(tmp_path) == []
    unreplicated = Growth(LaunchConfig(("x.py",), server_num=2, replication=1),
                          plan_job(LaunchConfig(("x.py",), server_num=2)), {})
    assert "not replicated" in (unreplicated.refusal(1) or "")
    fixed = LaunchConfig(("x.py",), server_num=2, replication=2, start_port=41000)
    assert "fixed endpoints" in (Growth(fixed, plan_job(fixed), {}).refusal(1) or "")
    clean_control_dir(tmp_path)
    assert not list((tmp_path / CONTROL_DIR).iterdir())


def test_psfleet_grow_waits_until_no_move_is_half_told() -> None:
    """A new copy is in but the giver has not heard of its release yet: share 2 has
    three copies, so the moves are not done, though the counts are within one."""
    from psfleet.cli.grow import _even

    def view(held: list[int]) -> msg.StatsResponse:
        return msg.StatsResponse(shares_held=held, share_num=6, replication=2)

    settled = {0: view([1, 2, 4, 5]), 1: view([0, 3, 4, 5]), 2: view([0, 1, 2, 3])}
    assert _even(settled, [2])
    assert not _even({**settled, 1: view([0, 2, 3, 4, 5])}, [2])
    assert not _even({0: settled[0], 1: settled[1]}, [2])  # server 2 did not answer


def test_a_crossing_a_worker_was_not_told_of_moves_with_its_share() -> None:
    """Worker 1's arrival completes a barrier crossing on share 0's primary; worker 0's
    poll has not been answered yet when share 0 moves to the added server. Worker 0's
    next poll goes there, and is told of the crossing: the copy carries the barriers
    (and the bounded staleness clocks), so nobody waits for a worker that went on."""
    with servers(2) as started:
        endpoints = [r.endpoint for _, r in started]
        workers = [_job(started), _client(started, 1, SHARES)]
        arrival = msg.BarrierRequest(name="b", worker_index=0, worker_num=2, seq=1)
        assert not workers[0]._servers[0].start("Barrier", arrival).result().done
        workers[1].barrier("b", 1, 2)  # the crossing; worker 0 is not told yet
        workers[1].clock(2, 7)  # worker 1's bounded staleness clock
        running, added = _added(endpoints, 2)
        try:
            added.join(running.endpoint)
            hosts = [r.handler for _, r in started]
            _wait_for(lambda: _counts([*hosts, added]) == [(4, 2)] * 3,  # type: ignore[list-item]
                      "the moves to the added server")
            assert added._map is not None and added._map.primary(0) == (2, 0)
            assert workers[0]._servers[0].start("Barrier", arrival).result().done
            assert added._shares[0]._clocks.state() == [[1, 0, 0, 7, 0]]
        finally:
            for worker in workers:
                worker.close()
            running.handler.close()
            running.stop(grace_s=0.1)
