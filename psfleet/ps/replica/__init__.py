"""Replicated shares with fail-over (docs/fault-tolerance.md).

A *share* is one server index's part of every table: the buckets the bucket map sends
to that index and its dense blocks. With ``replication`` R > 1 each share lives on R
hosts (server processes): the first live one is its primary, which serves pulls and
forwards every write to the others before answering. When a host dies the next one
of each of its shares becomes primary and training goes on. Hosts are a function of
the set of dead hosts, so agreeing on that set is agreeing on the map.

- ``psfleet.replication``: which hosts hold a share; the ``PSFLEET_REPLICATION``
  setting.
- ``host``: :class:`~psfleet.ps.replica.host.ReplicaHost`, a server's shares behind
  one endpoint, forwarding writes and deciding fail-overs.
- ``directory``: the worker's side: which host serves a share, and calls that move
  to the next host when theirs dies.
"""
