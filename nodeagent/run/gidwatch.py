"""Watches the rails' GID slots without any event: the kernel can change a GID table with no
netlink message at all (an update of the table in place, or the asynchronous GID work after
an address change that lands after the pass the address event triggered).

The slots that matter are few: for each rail, its pinned index and the index its GID was
last seen at, on its own device. Each is one small sysfs file (`gids/<i>`), read every
`interval` (500 ms: a few dozen reads a second for 8 rails, far below 0.1 % of a core).
When one differs from the last look, GidSlotsMoved is delivered and the daemon judges at
once;
the whole table is read only then (or at a resync). After an address event the daemon calls
`settle()`: the slots are then looked at every 50 ms for 2 s, so a table the kernel
updates a moment after the event is seen as soon as it settles.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from pathlib import Path

from nodeagent.io.bounded import BoundedReads, Stuck, Where
from nodeagent.io.files import read_attribute
from nodeagent.io.periodic import Periodic
from nodeagent.run.work import Deliver, GidSlotsMoved

Slot = tuple[str, int, int]  # device, port, index

INTERVAL = 0.5
SETTLE_INTERVAL = 0.05
SETTLE_FOR = 2.0


def read_slots(sysfs: Path, slots: Iterable[Slot], where: Where) -> dict[Slot, str | None]:
    out: dict[Slot, str | None] = {}
    for device, port, index in slots:
        path = sysfs / "class" / "infiniband" / device / "ports" / str(port) / "gids" / str(index)
        where.path = str(path)
        try:
            out[(device, port, index)] = read_attribute(path)
        except OSError:
            out[(device, port, index)] = None
    return out


class GidSlotWatcher(Periodic):
    """The GID-slot source: delivers GidSlotsMoved when a watched slot changes."""

    def __init__(self, sysfs: Path, deliver: Deliver, interval: float = INTERVAL) -> None:
        super().__init__("gid-slot-watcher")
        self.sysfs = sysfs
        self.deliver = deliver
        self.interval = interval
        self.reads = BoundedReads()
        self._slots: frozenset[Slot] = frozenset()
        self._last: dict[Slot, str | None] = {}
        self._settle_until = 0.0

    def retarget(self, slots: Iterable[Slot]) -> None:
        """The slots to watch from now on (the loop's, after each pass)."""
        new = frozenset(slots)
        if new != self._slots:
            self._slots = new
            self.wake()

    def settle(self) -> None:
        self._settle_until = time.monotonic() + SETTLE_FOR
        self.wake()

    def turn(self) -> float:
        got = self.reads.one("gid slots", functools.partial(read_slots, self.sysfs, self._slots))
        if not isinstance(got, Stuck):
            known = {s: v for s, v in got.items() if s in self._last}
            if any(self._last[s] != v for s, v in known.items()):
                self.deliver(GidSlotsMoved())
            self._last = got
        fast = time.monotonic() < self._settle_until
        return SETTLE_INTERVAL if fast else self.interval
