"""What the loop is handed: typed observations from the sources, and its own requests.

The sources (run/netlink.py, run/gidwatch.py, run/lustre.py, run/deviceplugin.py,
run/custom.py, run/transport.py, run/peers.py, the publisher's watch of the agent's own
Node) share one contract, node-problem-detector's monitor shape: made with a `deliver`
callable, `start()` begins observing on the source's own trigger (events or a cadence) on
its own thread, `stop()` ends it, and each observation is handed over with
`deliver(observation)`, which never blocks. The loop never waits on a source's read: it
only judges, repairs and publishes.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from nodeagent.checks.facts import Delivered

if TYPE_CHECKING:
    from nodeagent.config import Config
    from nodeagent.model.network import KernelEvent
    from nodeagent.model.peers import Targets
    from nodeagent.remedies.repairs import Repairs


@dataclass(frozen=True)
class Aim:
    """What the loop hands the sources after each pass, in one call (Sources.aim): each
    rail's endpoint for the probes (or why not), and the GID slots worth watching."""

    rails: Targets
    gid_slots: frozenset[tuple[str, int, int]]  # (device, port, index)


class Source(Protocol):
    """start -> a stream of observations through `deliver` -> stop."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


# ------------------------------------------------------------------ observations


@dataclass(frozen=True)
class NetlinkEvent:
    """One rtnetlink message about links, addresses, routes or rules, typed; with what the
    fast lane repaired of a deletion (None: not examined, or a rail it had no room for:
    the loop decides, at once; empty: examined, nothing of the planned rails)."""

    event: KernelEvent
    repaired: Repairs | None = None


@dataclass(frozen=True)
class EventsLost:
    """The kernel dropped netlink events (ENOBUFS) or the socket was reopened: nothing is
    known of what changed, so everything is looked at again."""


@dataclass(frozen=True)
class GidSlotsMoved:
    """A watched GID slot changed with no netlink event: the table is read again."""


@dataclass(frozen=True)
class NodeChanged:
    """The Kubernetes side changed (the agent's Node, its writes): the status file says so
    without a pass."""


# ------------------------------------------------------------------ the loop's own


@dataclass(frozen=True)
class StopAsked:
    """SIGTERM/SIGINT: finish the current step, then exit."""


@dataclass(frozen=True)
class ReloadAsked:
    """SIGHUP: read the config again (on a thread of its own)."""


@dataclass(frozen=True)
class Reloaded:
    """The config read that a SIGHUP started: a config, or why there is none."""

    cfg: Config | None
    error: BaseException | None = None


def _batchable(item: Work) -> bool:
    """A netlink event the loop only counts and verifies: one the fast lane repaired, or
    one that deleted nothing. Everything else wakes the loop at once."""
    return isinstance(item, NetlinkEvent) and (item.repaired is not None
                                                or item.event.deletion is None)


# A source's observation is any Delivered kind (checks/facts.py): the store keeps the
# latest of each, so a new source adds nothing here.
Work = (NetlinkEvent | EventsLost | GidSlotsMoved | Delivered | NodeChanged | StopAsked
        | ReloadAsked | Reloaded)
Deliver = Callable[[Work], None]


class Inbox:
    """The loop's queue. What the loop takes off it during a pass (take_all, to repair a
    deletion at once) is handed back (put_back) and comes out first, in arrival order, with
    whether its repair ran already."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Work] = queue.SimpleQueue()
        self._taken: deque[tuple[Work, bool]] = deque()
        self._urgent = threading.Event()  # set by what must not wait for a burst's batch

    def put(self, item: Work) -> None:
        self._queue.put(item)
        if not _batchable(item):
            self._urgent.set()

    def empty(self) -> bool:
        return self._queue.empty()

    def take_all(self) -> Iterator[Work]:
        while True:
            try:
                yield self._queue.get_nowait()
            except queue.Empty:
                return

    def put_back(self, item: Work, repaired: bool) -> None:
        self._taken.append((item, repaired))

    def next_in_batch(self, wait: float) -> tuple[Work, bool] | None:
        """Within a burst: the next work after up to `wait` (what arrives meanwhile is
        taken in one batch, not one wake-up each), or at once when something urgent came:
        a deletion the fast lane did not repair, a stop, a reload, a source's facts."""
        if self._taken:
            return self._taken.popleft()
        if self._queue.empty():
            self._urgent.clear()  # a wake for what was taken already is no news
            if self._queue.empty():  # (put queues, then sets: nothing is missed between)
                self._urgent.wait(wait)
        return self.next(0.0)

    def next(self, timeout: float) -> tuple[Work, bool] | None:
        """The next work (waiting at most `timeout`), with whether its repair ran already."""
        if self._taken:
            return self._taken.popleft()
        try:
            item = self._queue.get(block=timeout > 0, timeout=timeout or None)
        except queue.Empty:
            return None
        return item, False
