"""Hypothesis strategies of replication control-plane requests (``SetReplicas``,
``MergeMap``, ``Failover``, ``Rejoin``, ``CopyShare``, ``ReceiveShare``, ``Join``,
``Drain``) for ``tests/test_fuzz_control_plane.py``.

Every strategy draws a :class:`~_fuzz_requests.FuzzRequest` carrying the job's token:
valid protobuf encodings whose fields are mutated. Counts and indices come from edges
(0, 1, the uint32 extremes) and small values; share maps have lists that go in pairs
(``dead_hosts`` / ``dead_incarnations``, ...) of equal or unequal lengths, up to 70,000
entries; layouts name up to 5,000 endpoints of up to 5,000 characters and up to
2^32-1 shares (issue 44, finding 1: 30,000 shares wedged a server). Requests that would
legitimately change who serves the host's own share on the replicated server (a map
declaring host 0 dead, a Join, a Drain) are drawn only for the unreplicated one, which
must refuse them all.
"""

from __future__ import annotations

from _fuzz_requests import FuzzRequest
from _fuzz_server import TOKEN
from hypothesis import strategies as st

from psfleet.rpc import psfleet_pb2 as pb

__all__ = ["CONTROL_METHODS", "REPLICATED_METHODS", "control_requests"]

CONTROL_METHODS = ("SetReplicas", "MergeMap", "Failover", "Rejoin", "CopyShare",
                   "ReceiveShare", "Join", "Drain")
#: The methods fuzzed on the replicated server (no Join or Drain: see the module doc).
REPLICATED_METHODS = CONTROL_METHODS[:6]

_U32 = (0, 1, 2, 3, 7, 255, 65535, 65536, 2**20 + 1, 2**31 - 1, 2**31, 2**32 - 1)
small = st.integers(0, 3)
u32 = st.one_of(small, small, st.sampled_from(_U32))
#: Hosts other than 0 (the replicated server itself).
hosts = st.sampled_from([1, 1, 2, 5, 7, 255, 65536, 2**31, 2**32 - 1])
endpoints_text = st.one_of(st.sampled_from(["127.0.0.1:9", "127.0.0.1:1", "", "x",
                                            "h" * 5000]), st.text(max_size=20))


@st.composite
def _copies(draw: st.DrawFn, avoid_host0: bool) -> list[pb.ShareCopy]:
    count = draw(st.sampled_from([0, 0, 1, 2, 3, 70_000]))
    one = pb.ShareCopy(share=draw(u32), host=draw(hosts if avoid_host0 else u32),
                       incarnation=draw(u32), copy=draw(u32))
    return [one] * count


@st.composite
def share_maps(draw: st.DrawFn, avoid_host0: bool = False) -> pb.ShareMapMessage:
    """A map whose lists are drawn one by one (pairs of unequal length included);
    ``avoid_host0``: no entry names host 0 (the replicated server itself)."""
    host = hosts if avoid_host0 else u32

    def pair(n: int) -> tuple[list[int], list[int]]:
        extra = draw(st.sampled_from([0, 0, 0, 1, -1]))
        first = [draw(host)] * n
        return first, [draw(u32)] * max(n + extra, 0)

    n = draw(st.sampled_from([0, 0, 1, 2, 70_000]))
    dead_hosts, dead_incarnations = pair(n)
    leaving_hosts, leaving_incarnations = pair(draw(st.sampled_from([0, 0, 1])))
    added = draw(st.sampled_from([0, 0, 1, 3]))
    return pb.ShareMapMessage(
        dead_hosts=dead_hosts, dead_incarnations=dead_incarnations,
        leaving_hosts=leaving_hosts, leaving_incarnations=leaving_incarnations,
        joined=draw(_copies(avoid_host0)), released=draw(_copies(avoid_host0)),
        promoted=draw(_copies(avoid_host0)),
        added_hosts=[draw(host)] * added, added_incarnations=[draw(u32)] * added,
        added_endpoints=[draw(endpoints_text)] * (added + draw(st.sampled_from([0, 0, 1]))))


def _request(method: str, message: object, label: str) -> FuzzRequest:
    return FuzzRequest(method, message.SerializeToString(),  # type: ignore[attr-defined]
                       TOKEN, label)


@st.composite
def set_replicas(draw: st.DrawFn, avoid_host0: bool) -> FuzzRequest:
    count = draw(st.sampled_from([0, 1, 2, 2, 3, 5000]))
    endpoints = [draw(endpoints_text) for _ in range(min(count, 3))] * (
        count // 3 if count > 3 else 1)
    message = pb.ReplicasRequest(
        endpoints=endpoints[:count], host_index=draw(u32), replication=draw(u32),
        shares=draw(st.one_of(u32, st.sampled_from([1024, 1025, 4096, 30_000]))),
        map=draw(share_maps(avoid_host0)))
    return _request("SetReplicas", message, f"{count} endpoints, shares {message.shares}, "
                    f"replication {message.replication}, host {message.host_index}")


@st.composite
def merge_map(draw: st.DrawFn, avoid_host0: bool) -> FuzzRequest:
    message = draw(share_maps(avoid_host0))
    return _request("MergeMap", message, f"{len(message.dead_hosts)} dead hosts, "
                    f"{len(message.dead_incarnations)} incarnations")


@st.composite
def failover(draw: st.DrawFn, avoid_host0: bool) -> FuzzRequest:
    message = pb.FailoverRequest(host=draw(hosts if avoid_host0 else u32),
                                 map=draw(share_maps(avoid_host0)))
    return _request("Failover", message, f"host {message.host}")


@st.composite
def rejoin(draw: st.DrawFn, avoid_host0: bool) -> FuzzRequest:
    message = pb.RejoinRequest(host=draw(hosts if avoid_host0 else u32),
                               incarnation=draw(u32))
    return _request("Rejoin", message, f"member ({message.host}, {message.incarnation})")


@st.composite
def copy_share(draw: st.DrawFn, avoid_host0: bool) -> FuzzRequest:
    message = pb.CopyShareRequest(
        share=draw(u32), host=draw(u32), incarnation=draw(u32), move=draw(st.booleans()),
        replaced_host=draw(hosts if avoid_host0 else u32), replaced_incarnation=draw(u32),
        promote=draw(st.booleans()))
    return _request("CopyShare", message, f"share {message.share} to ({message.host}, "
                    f"{message.incarnation}) move {message.move}")


@st.composite
def receive_share(draw: st.DrawFn, avoid_host0: bool) -> FuzzRequest:
    files = [pb.SharedFile(path=draw(st.sampled_from(["server-0/x", "", "../../etc"])),
                           data=b"\x00" * draw(st.sampled_from([0, 10, 4096])))
             for _ in range(draw(st.integers(0, 3)))]
    message = pb.ReceiveShareRequest(
        share=draw(u32), incarnation=draw(u32), files=files, more=draw(st.booleans()),
        part=draw(u32), copy=draw(u32), coordination=draw(st.sampled_from(["", "{}", "[",
                                                                          "x" * 1000])))
    return _request("ReceiveShare", message, f"share {message.share} part {message.part}")


@st.composite
def join(draw: st.DrawFn, avoid_host0: bool) -> FuzzRequest:
    message = pb.JoinRequest(host=draw(u32), endpoint=draw(endpoints_text),
                             incarnation=draw(u32))
    return _request("Join", message, f"host {message.host}")


@st.composite
def drain(draw: st.DrawFn, avoid_host0: bool) -> FuzzRequest:
    message = pb.DrainRequest(timeout_s=draw(st.sampled_from(
        [0.0, -1.0, 0.5, 1e308, float("inf"), float("nan")])))
    return _request("Drain", message, f"timeout_s {message.timeout_s}")


def control_requests(method: str, avoid_host0: bool = False
                     ) -> st.SearchStrategy[FuzzRequest]:
    """Mutated requests to control-plane ``method``; ``avoid_host0``: none names host 0
    as dead, leaving or replaced (for the replicated server, host 0)."""
    strategies = {"SetReplicas": set_replicas, "MergeMap": merge_map, "Failover": failover,
                  "Rejoin": rejoin, "CopyShare": copy_share, "ReceiveShare": receive_share,
                  "Join": join, "Drain": drain}
    return strategies[method](avoid_host0)
