"""Watches the rails' GID slots without any event: the kernel can change a GID table with no
netlink message at all (an update of the table in place, or the asynchronous GID work after
an address change that lands after the pass the address event triggered).

The slots that matter are few: for each rail, its pinned index and the index its GID was
last seen at, on its own device. Each is one small sysfs file (`gids/<i>`), read every
`interval` (500 ms: a few dozen reads a second for 8 rails, far below 0.1 % of a core).
When one differs from the last look, GidSlotsMoved is delivered and the daemon judges at
once; the whole table is read only then (or at a resync). After an address event the daemon calls
`settle()`: the slots are then looked at every 50 ms for 2 s, so a table the kernel
updates a moment after the event is seen as soon as it settles.

The slots are read on this source's own thread, each kept open between turns
(io.files.KeptAttribute): a turn is a pread and an fstat a slot, up to 16 descriptors for 8
rails, closed by this thread when a slot leaves the watch or the source stops. A slot
whose read hangs (a wedged driver) stops this source only, as a bounded read would
(nothing is delivered either way), and costs no thread hop on every healthy turn.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from nodeagent.io.files import KeptAttribute
from nodeagent.io.periodic import Periodic
from nodeagent.run.work import Deliver, GidSlotsMoved

Slot = tuple[str, int, int]  # device, port, index

INTERVAL = 0.5
SETTLE_INTERVAL = 0.05
SETTLE_FOR = 2.0


def slot_path(sysfs: Path, slot: Slot) -> str:
    device, port, index = slot
    return str(sysfs / "class" / "infiniband" / device / "ports" / str(port) / "gids" / str(index))


def read_slots(readers: dict[Slot, KeptAttribute]) -> dict[Slot, str | None]:
    out: dict[Slot, str | None] = {}
    for slot, reader in readers.items():
        try:
            out[slot] = reader.read()
        except OSError:
            out[slot] = None
    return out


class GidSlotWatcher(Periodic):
    """The GID-slot source: delivers GidSlotsMoved when a watched slot changes."""

    def __init__(self, sysfs: Path, deliver: Deliver, interval: float = INTERVAL) -> None:
        super().__init__("gid-slot-watcher")
        self.sysfs = sysfs
        self.deliver = deliver
        self.interval = interval
        self._slots: frozenset[Slot] = frozenset()  # set by retarget (the loop's thread)
        self._readers: dict[Slot, KeptAttribute] = {}  # this thread's own
        self._followed: frozenset[Slot] = frozenset()
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

    def run(self) -> None:
        try:
            super().run()
        finally:
            self._follow(frozenset())

    def _follow(self, slots: frozenset[Slot]) -> None:
        """The readers made to match the watched slots; those left are closed."""
        if slots is self._followed:
            return
        self._followed = slots
        for slot in [s for s in self._readers if s not in slots]:
            self._readers.pop(slot).close()
        for slot in sorted(slots - self._readers.keys()):
            self._readers[slot] = KeptAttribute(slot_path(self.sysfs, slot))

    def turn(self) -> float:
        self._follow(self._slots)
        got = read_slots(self._readers)
        if any(self._last.get(s, v) != v for s, v in got.items()):
            self.deliver(GidSlotsMoved())
        self._last = got
        fast = time.monotonic() < self._settle_until
        return SETTLE_INTERVAL if fast else self.interval
