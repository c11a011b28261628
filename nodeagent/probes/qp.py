"""Which QPs exist: `rdma -j res show qp` (iproute2), the kernel's resource tracking.

Read before a shifted GID is re-pinned: re-adding a rail's address while a QP still uses
the port would break that QP, and while any QP holds the old GID entry its slot stays taken,
so the GID would land elsewhere again. The tool rather than the RDMA netlink family: no
maintained Python binding speaks it, and iproute2 is on every host the agent runs on.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from nodeagent.model.rdma import QueuePair, QueuePairs


def parse_qps(text: str) -> QueuePairs:
    """`rdma -j res show qp` output: a JSON list, one object per QP. Kernel-owned QPs have
    no "pid"; a QP not yet bound to a port has no "port"."""
    try:
        data = json.loads(text or "[]")
    except ValueError as exc:
        return QueuePairs(error=f"rdma res show qp: unreadable output ({exc})")
    if not isinstance(data, list):
        return QueuePairs(error="rdma res show qp: unexpected output (not a list)")
    qps: list[QueuePair] = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("ifname"), str):
            return QueuePairs(error=f"rdma res show qp: unexpected entry {str(item)[:80]}")
        qps.append(QueuePair(
            device=item["ifname"], port=_int(item.get("port")), lqpn=_int(item.get("lqpn")) or 0,
            type=str(item.get("type", "?")), state=str(item.get("state", "?")),
            pid=_int(item.get("pid")), comm=str(item.get("comm", "?"))))
    return QueuePairs(tuple(qps))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_qps(rdma_tool: str = "rdma", timeout: float = 5.0) -> QueuePairs:
    """Every QP on the host. Any failure is an error, never an empty list: "no QP" is what
    allows a re-pin, so it must be positively seen."""
    try:
        res = subprocess.run([rdma_tool, "-j", "res", "show", "qp"], capture_output=True,
                             text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return QueuePairs(error=f"rdma res show qp: {exc}")
    if res.returncode != 0:
        why = (res.stderr.strip() or f"exit {res.returncode}").splitlines()[0]
        return QueuePairs(error=f"rdma res show qp: {why}")
    return parse_qps(res.stdout)
