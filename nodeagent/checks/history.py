"""States only visible over time: link flapping and repairs that keep being undone.

Pure state machines: the caller passes `now` (monotonic seconds), so tests drive time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from nodeagent.model.network import DriftKind, LinkState


def _older(value: int | None, seen: int | None) -> bool:
    return value is not None and seen is not None and value < seen


@dataclass
class FlapTracker:
    """Counts carrier losses from the kernel's own counters in a sliding window.

    Flapping starts when more than `max_flaps` losses fall in `window` and ends once the
    carrier has not changed for `dwell` seconds.
    """

    window: float
    max_flaps: int
    dwell: float
    total: int = 0  # carrier losses seen since the agent started
    _losses: deque[float] = field(default_factory=deque)
    _index: int | None = None
    _down_count: int | None = None
    _changes: int | None = None
    _carrier: bool | None = None
    _last_change: float | None = None
    _flapping: bool = False

    def observe(self, now: float, link: LinkState) -> None:
        """One look at the link: a netlink event or a probe. Events are read when the main
        loop drains its queue, so one can be older than a probe already observed: a sample
        whose kernel counters went backwards is that, and is skipped (taking its counter as
        the new base would count the losses in between twice). A new ifindex is a new
        device, whose counters start again."""
        if self._index is not None and link.index != self._index:
            self._down_count = self._changes = None
        self._index = link.index
        if (_older(link.carrier_changes, self._changes)
                or _older(link.carrier_down_count, self._down_count)):
            return
        losses = 0
        changed = False
        if link.carrier_down_count is not None:
            if self._down_count is not None and link.carrier_down_count >= self._down_count:
                losses = link.carrier_down_count - self._down_count
            self._down_count = link.carrier_down_count
        elif self._carrier is True and not link.carrier:
            losses = 1  # no kernel counter: count the transitions we see
        if link.carrier_changes is not None:
            changed = self._changes is not None and link.carrier_changes != self._changes
            self._changes = link.carrier_changes
        else:
            changed = self._carrier is not None and self._carrier != link.carrier
        self._carrier = link.carrier
        if losses or changed:
            self._last_change = now
        self.total += losses
        for _ in range(min(losses, 10_000)):
            self._losses.append(now)

    def flapping(self, now: float) -> bool:
        while self._losses and self._losses[0] <= now - self.window:
            self._losses.popleft()
        if self._flapping and (self._last_change is None or now - self._last_change >= self.dwell):
            # Stable for the dwell: the storm is over, and its losses no longer count.
            self._flapping = False
            self._losses.clear()
        if len(self._losses) > self.max_flaps:
            self._flapping = True
        return self._flapping

    def clears_at(self) -> float | None:
        """When flapping may end if nothing changes: the agent wakes up then to say so."""
        if not self._flapping or self._last_change is None:
            return None
        return self._last_change + self.dwell

    def retune(self, window: float, max_flaps: int, dwell: float) -> None:
        """New thresholds from a reloaded config; counts and history are kept."""
        self.window, self.max_flaps, self.dwell = window, max_flaps, dwell

    def in_window(self, now: float) -> int:
        self.flapping(now)
        return len(self._losses)


@dataclass
class RepairGuard:
    """Stops fighting another writer: the same drift repaired more than `max_repairs`
    times within `window` pauses repairs of that rail for `backoff` seconds."""

    max_repairs: int
    window: float
    backoff: float
    _repairs: dict[tuple[str, DriftKind], deque[float]] = field(default_factory=dict)
    _paused: dict[str, tuple[float, str]] = field(default_factory=dict)  # rail -> (until, why)

    def record(self, now: float, rail: str, label: str, kinds: set[DriftKind]) -> None:
        for kind in kinds:
            times = self._repairs.setdefault((rail, kind), deque())
            times.append(now)
            while times and times[0] <= now - self.window:
                times.popleft()
            if len(times) > self.max_repairs and rail not in self._paused:
                why = (
                    f"{label}: {kind.reason} repaired {len(times)} times in "
                    f"{self.window:g}s, something else keeps undoing it; repairs paused "
                    f"for {self.backoff:g}s"
                )
                self._paused[rail] = (now + self.backoff, why)

    def room(self, now: float, rail: str) -> int:
        """How many more repairs of any one kind the rail may have within the window
        before the guard pauses it (0 while paused): what may be repaired without asking."""
        if self.paused(now, rail) is not None:
            return 0
        counts = [sum(1 for t in times if t > now - self.window)
                  for (name, _), times in self._repairs.items() if name == rail]
        return max(0, self.max_repairs - max(counts, default=0))

    def resumes_at(self) -> float | None:
        return min((until for until, _ in self._paused.values()), default=None)

    def paused(self, now: float, rail: str) -> str | None:
        """Why the rail's repairs are paused, or None when the agent may repair it."""
        entry = self._paused.get(rail)
        if entry is None:
            return None
        until, why = entry
        if now >= until:
            del self._paused[rail]
            for key in [k for k in self._repairs if k[0] == rail]:
                del self._repairs[key]
            return None
        return why
