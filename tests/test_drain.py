"""``psfleet drain`` against real servers on 127.0.0.1 (issue 20: removing a server).

Three in-process servers with replication 2. ``psfleet drain ENDPOINTS --server 1``
(the real command, a child process) while a worker keeps pushing: server 1's shares
are copied to the other two at once (no ``PSFLEET_REFILL_DELAY_S`` wait), server 1
leaves and is told to stop, and the job's rows are all on servers 0 and 2, their copies
equal (``psfleet status`` shows which server holds and serves which share). A drain
that cannot be done is refused with the reason, and nothing changes.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
from conftest import run_command
from test_replication import (
    KEYS,
    SPARSE,
    _assert_copies_equal,
    _client,
    _hosts,
    _train,
    servers,
)

from psfleet.ps.types import PushMode

pytestmark = pytest.mark.service


def _drain(endpoints: list[str], server: int, *extra: str) -> tuple[int, str, str]:
    r = run_command([sys.executable, "-m", "psfleet.cli.main", "drain", ",".join(endpoints),
                     "--server", str(server), *extra], timeout=120)
    return r.returncode, r.stdout, r.stderr


def test_a_drained_server_leaves_after_its_shares_are_copied_nothing_lost() -> None:
    with servers() as started:
        endpoints = [r.endpoint for _, r in started]
        client = _client(started, 0)
        _train(client, KEYS, 10, 0)
        host_0, host_1, host_2 = _hosts(started)
        training = threading.Thread(target=_train, args=(client, KEYS, 30, 1))
        training.start()
        code, out, err = _drain(endpoints, 1)
        training.join()
        assert code == 0, err
        assert "server 1 left the job" in out
        assert host_1.stop_requested.is_set()
        assert host_0._map is not None and host_0._map.dead == {1: 0}
        assert sorted(host_0._shares) == sorted(host_2._shares) == [0, 1, 2]
        for share in range(3):
            _assert_copies_equal(host_0._shares[share], host_2._shares[share])
        rows = client.pull_sparse(SPARSE, KEYS, create=False)
        started[1][1].stop(grace_s=0.1)  # its process exits once it left
        # psfleet status names the server that left and shows where each share is now.
        r = run_command([sys.executable, "-m", "psfleet.cli.main", "status",
                         ",".join(endpoints), "--interval_s", "0"], timeout=60)
        assert r.returncode == 0, r.stderr
        *shares, departed = r.stdout.strip().split("\n\n")[1].splitlines()
        assert [line.split() for line in shares[1:]] == [
            ["0", endpoints[0], "0,1,2", "0"], ["2", endpoints[2], "0,1,2", "1,2"]], r.stdout
        assert departed == f"server 1 at {endpoints[1]} is no longer in the job (drained, or " \
            "dead and not restarted): the others serve its shares", r.stdout
        np.testing.assert_array_equal(client.pull_sparse(SPARSE, KEYS, create=False), rows)
        client.push_sparse(SPARSE, KEYS, np.ones((KEYS.size, 8), np.float32),
                           mode=PushMode.DELTA)
        np.testing.assert_allclose(client.pull_sparse(SPARSE, KEYS, create=False),
                                   rows + 1.0, rtol=0, atol=1e-6)
        assert client._directory is not None
        assert [client._directory.primary(s) for s in range(3)] == [0, 2, 2]
        client.close()


def test_a_drain_that_cannot_be_done_is_refused_and_changes_nothing() -> None:
    with servers(2) as started:
        endpoints = [r.endpoint for _, r in started]
        code, _, err = _drain(endpoints, 1)  # no worker has set the layout: replication 1
        assert code == 1 and "not part of a replicated job" in err, err
        client = _client(started, 0)
        code, _, err = _drain(endpoints, 1)
        assert code == 1, err
        assert "server 1 cannot leave: 1 server(s) would stay for 2 copies" in err
        code, _, err = _drain(endpoints, 5)
        assert code == 2 and "--server: 5 is not a server of" in err, err
        host_1 = _hosts(started)[1]
        assert not host_1.stop_requested.is_set()
        assert host_1._map is not None and host_1._map.leaving == frozenset()
        client.close()
    with servers() as started:
        endpoints = [r.endpoint for _, r in started]
        client = _client(started, 0)
        client.push_sparse(SPARSE, KEYS, np.ones((KEYS.size, 8), np.float32),
                           mode=PushMode.SYNC, worker_num=1)  # every share: a sync round
        code, _, err = _drain(endpoints, 0)
        assert code == 1 and "sync-mode job" in err, err
        client.close()
