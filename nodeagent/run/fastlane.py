"""The fast lane: a deletion of what a rail owns is repaired on the netlink thread, the
moment its event is read.

Through the loop, a repair waited for a second thread to wake and take the event: on a
node whose cores are all busy, that wake-up was the largest part of the agent's latency
over a bare pyroute2 loop (2.1x at p50 with two spinners per core). The netlink thread
repairs from the plan the loop hands it after each pass (which rails it may touch, on
which link, and how many repairs the repair guard still allows), with a socket of its
own, then hands the event on with what it did: the loop counts it, reports it and
verifies the rail in its next pass, as for a repair of its own.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyroute2.iproute import IPRoute

from nodeagent.checks.network import deletion_drift
from nodeagent.config import Config, Rail
from nodeagent.model.network import Deletion
from nodeagent.remedies.network import execute, plan_rail
from nodeagent.remedies.repairs import Repairs


@dataclass(frozen=True)
class Repairable:
    """A rail the fast lane may repair: its link (as the last pass saw it) and the count
    of fast repairs at which it must stop and leave the rest to the loop (the guard's room
    when the plan was made, less the repairs still on their way to the loop)."""

    rail: Rail
    ifindex: int
    stop_at: int


@dataclass(frozen=True)
class RepairPlan:
    """What the loop allows the fast lane until its next pass: only rails the agent
    manages, not paused by the guard, not lent to a pod, with a link."""

    cfg: Config
    rails: tuple[Repairable, ...]
    by_name: Mapping[str, Rail]


class FastLane:
    """Owned by the loop, run by the netlink thread. The loop sets the plan (`aim`) and
    counts what it took (`taken`); the netlink thread alone repairs (`repair`) and counts
    what it made (`made`). A rail's repairs in flight are made - taken: the plan's room is
    room - (made - taken), so the guard pauses a fight after exactly as many repairs as
    when the loop made them all."""

    def __init__(self) -> None:
        self._plan: RepairPlan | None = None
        self.made: Counter[str] = Counter()  # written by the netlink thread only
        self.taken: Counter[str] = Counter()  # written by the loop only
        self._ipr: Any = None  # the netlink thread's own request socket

    def aim(self, cfg: Config | None, links: Mapping[str, int],
            room: Mapping[str, int]) -> None:
        """The loop's plan after a pass (`cfg` None: stop until the next one, as during a
        reload). `links` is each repairable rail's ifindex, `room` the guard's room."""
        if cfg is None:
            self._plan = None
            return
        rails = tuple(
            Repairable(rail, links[rail.name], self.taken[rail.name] + room[rail.name])
            for rail in cfg.rails if rail.name in links and room.get(rail.name, 0) > 0)
        # One reference set: the netlink thread sees the old plan or the new one.
        self._plan = RepairPlan(cfg, rails, {r.rail.name: r.rail for r in rails})

    def open(self) -> None:
        """On the netlink thread, before its first event (pyroute2's socket belongs to the
        thread that made it; made now, the first repair does not pay for it)."""
        if self._ipr is None:
            self._ipr = IPRoute()

    def repair(self, gone: Deletion) -> Repairs | None:
        """On the netlink thread: repair what the deletion took from a planned rail.

        None (the loop decides, at once) without a plan, or when the deletion touched a
        planned rail with no room left. Otherwise what was done, empty when it touched no
        planned rail (the kernel's own follow-ups: the local table's routes that go with an
        address): the loop, which would repair nothing there either (the rails outside the
        plan are paused, observe-only, lent or without a link), takes it with its burst
        instead of being woken for it."""
        plan = self._plan
        if plan is None:
            return None
        out = Repairs()
        deferred = False
        for entry in plan.rails:
            drift = deletion_drift(entry.rail, entry.ifindex, gone)
            if not drift:
                continue
            if self.made[entry.rail.name] >= entry.stop_at:
                deferred = True
                continue
            actions = plan_rail(plan.cfg, entry.rail, entry.ifindex, drift)
            if not actions:
                continue
            self.open()
            done, errors = execute(self._ipr, plan.cfg.paths.procfs, plan.by_name, actions)
            out.record(entry.rail.name, done, errors)
            if done:
                self.made[entry.rail.name] += 1
        if deferred and not (out.done or out.errors):
            return None
        return out

    def close(self) -> None:
        """The request socket, on the thread that made it (when the monitor ends)."""
        if self._ipr is not None:
            ipr, self._ipr = self._ipr, None
            with contextlib.suppress(Exception):  # closing what failed: nothing more to do
                ipr.close()
