"""Re-pin a shifted RoCE GID: delete the rail's address and add it again.

The kernel gives a new IPv4 RoCE v2 GID the lowest free slot of the port's table. A GID
that moved did so because its old slot was still held (a live QP referenced it) when the
address came back; once nothing holds it the slot is free again, and a delete/add puts the
GID back there. The check (checks/gid.py) allows this only when no QP uses the port and the
pinned slot is empty, so no running job loses its connection to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nodeagent.config import Rail
from nodeagent.model.network import DriftKind
from nodeagent.model.rdma import GidShift
from nodeagent.remedies.network import Action, AddAddress, Addr, RemoveAddress, execute


def plan_repin(rail: Rail, ifindex: int | None, shift: GidShift) -> list[Action]:
    if ifindex is None:
        return []
    addr = Addr.of(ifindex, rail.address)
    why = f"GID index {shift.index} back to {shift.pinned} on {shift.device} port {shift.port}"
    return [
        RemoveAddress(rail.name, DriftKind.GID_SHIFTED,
                      f"{rail.label}: re-pin: remove address {rail.address} ({why})", addr),
        AddAddress(rail.name, DriftKind.GID_SHIFTED,
                   f"{rail.label}: re-pin: add address {rail.address}", addr),
    ]


def repin(
    ipr: Any, procfs_root: Path, rail: Rail, actions: Sequence[Action],
    gid_index: Callable[[], int | None], settle: float = 2.0,
) -> tuple[list[Action], list[str]]:
    """Run the re-pin and wait (at most `settle` seconds) for the GID to reappear: the kernel
    adds it from a workqueue, and a pass judging in between would see no GID at all."""
    done, errors = execute(ipr, procfs_root, {rail.name: rail}, actions)
    if errors:
        return done, errors
    deadline = time.monotonic() + settle
    while gid_index() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return done, errors
