"""Replicated shares with fail-over (docs/fault-tolerance.md).

A *share* is one server index's part of every table: the buckets the bucket map sends
to that index and its dense blocks. With ``replication`` R > 1 each share lives on R
hosts (server processes): the first live one is its primary, which serves pulls and
forwards every write to the others before answering. When a host dies the next one
of each of its shares becomes primary and training goes on; a restarted server is
filled with copies of its shares while training goes on, and serves its own again;
when none comes back, live servers take new copies of its shares (refill).

- ``psfleet.replication``: where shares are placed, the share map (which members are
  dead, filled with a copy, released from one, or leaving), the ``PSFLEET_REPLICATION``
  setting.
- ``members``: a server's layout, map and fail-over decisions.
- ``rejoin`` and ``copy``: filling a restarted server with copies of its shares;
  ``refill``: a live server taking a copy of a share a dead one held; ``drain``: a
  server leaving the job once its shares are copied to the others.
- ``host``: :class:`~psfleet.ps.replica.host.ReplicaHost`, what a server serves:
  its shares behind one endpoint, forwarding writes.
- ``directory``: the worker's side: which host serves a share, and calls that follow
  the share to its next host.
- ``wire``: the share map as a message; ``peers``: connections per member and share.
"""
