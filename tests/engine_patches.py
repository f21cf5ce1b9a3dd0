"""`--engine-patch` functions as a user's fork would write them that change nothing the properties judge."""
from __future__ import annotations

import functools
from typing import Any

__all__ = ["counting_fork", "CALLS"]

#: Scheduler-side lookups the counting fork saw (in this process).
CALLS = [0]


def counting_fork() -> None:
    """A fork that counts the scheduler's lookups and leaves every answer as it is (idempotent)."""
    from lmcache.v1.rpc.zmq_transport import ZmqReqRepClientTransport

    send_and_recv_all = ZmqReqRepClientTransport.send_and_recv_all
    if getattr(send_and_recv_all, "_counted", False):
        return

    @functools.wraps(send_and_recv_all)
    def counted(self: Any, msg: Any) -> list:
        CALLS[0] += 1
        return send_and_recv_all(self, msg)

    counted._counted = True  # type: ignore[attr-defined]
    ZmqReqRepClientTransport.send_and_recv_all = counted
