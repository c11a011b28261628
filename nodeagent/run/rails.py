"""The daemon's view of its rails over time: which rail a kernel message is about, and what
only time shows (carrier flaps, a fight with another writer, the repairs made)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nodeagent.checks.history import FlapTracker, RepairGuard
from nodeagent.config import Config
from nodeagent.model.network import EventKind, KernelEvent, LinkState, RailObservation
from nodeagent.model.status import RailTimeline


class RailIndex:
    """A rail by interface name, policy table or source address (pure maps of the config)."""

    def __init__(self, cfg: Config) -> None:
        self.by_name = {r.interface: r.name for r in cfg.rails}
        self.by_table = {r.table: r.name for r in cfg.rails if r.table is not None}
        self.by_ip = {r.ip: r.name for r in cfg.rails}

    def rails_for(self, event: KernelEvent,
                  observations: Mapping[str, RailObservation]) -> set[str]:
        """Which rails a kernel event touches (by ifindex, interface name, table or source
        address)."""
        hit: set[str] = set()
        if event.index is not None:
            hit.update(name for name, obs in observations.items()
                       if obs.link is not None and obs.link.index == event.index)
        if event.kind is EventKind.LINK and event.ifname in self.by_name:
            hit.add(self.by_name[event.ifname])
        if event.kind in (EventKind.ROUTE, EventKind.RULE):
            if event.table in self.by_table:
                hit.add(self.by_table[event.table])
            if event.src in self.by_ip:
                hit.add(self.by_ip[event.src])
        return hit


class RailHistory:
    """Flap trackers, the repair guard and the repair counts: they survive a reload, so a
    SIGHUP never hides a flapping link or restarts a fight the agent had backed out of."""

    def __init__(self, cfg: Config) -> None:
        guard = cfg.repair_guard
        self.guard = RepairGuard(guard.max_repairs, guard.window, guard.backoff)
        self.flaps: dict[str, FlapTracker] = {}
        self.repair_counts: dict[str, dict[str, int]] = {}  # rail -> action kind -> count
        self.cfg = cfg
        self.retune(cfg)

    def retune(self, cfg: Config) -> None:
        self.cfg = cfg
        flap = (cfg.link_flap.window, cfg.link_flap.max_flaps, cfg.link_flap.dwell)
        self.flaps = {r.name: self.flaps.get(r.name) or FlapTracker(*flap) for r in cfg.rails}
        for tracker in self.flaps.values():
            tracker.retune(*flap)
        guard = cfg.repair_guard
        self.guard.max_repairs, self.guard.window = guard.max_repairs, guard.window
        self.guard.backoff = guard.backoff

    def link_event(self, now: float, rail: str, link: LinkState) -> None:
        """Count carrier changes from a RTM_NEWLINK itself, not a later probe."""
        if rail in self.flaps:
            self.flaps[rail].observe(now, link)

    def observed(self, now: float, observations: Mapping[str, RailObservation]) -> None:
        for name, obs in observations.items():
            if obs.link is not None and name in self.flaps:
                self.flaps[name].observe(now, obs.link)

    def overrides(self, now: float) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
        """The rails whose repairs are paused (with why), and every time-based verdict
        per rail (ManagedElsewhere outranks LinkFlapping)."""
        cfg = self.cfg
        paused: dict[str, str] = {}
        out: dict[str, tuple[str, str]] = {}
        for rail in cfg.rails:
            why = self.guard.paused(now, rail.name)
            if why:
                paused[rail.name] = why
                out[rail.name] = ("ManagedElsewhere", why)
            tracker = self.flaps.get(rail.name)
            if tracker is not None and tracker.flapping(now) and rail.name not in out:
                out[rail.name] = (
                    "LinkFlapping",
                    f"{rail.label}: {tracker.in_window(now)} carrier losses in "
                    f"{cfg.link_flap.window:g}s (more than {cfg.link_flap.max_flaps});"
                    f" clears after {cfg.link_flap.dwell:g}s stable",
                )
        return paused, out

    def timelines(self, now: float) -> dict[str, RailTimeline]:
        """Each rail's time-based verdict and figures, as the pass judges them."""
        _, verdicts = self.overrides(now)
        out = {}
        for rail in self.cfg.rails:
            tracker = self.flaps.get(rail.name)
            out[rail.name] = RailTimeline(
                verdicts.get(rail.name), dict(self.repair_counts.get(rail.name, {})),
                tracker.total if tracker else None,
                tracker.in_window(now) if tracker else None)
        return out

    def next_change(self) -> float | None:
        """When a flap dwell or a repair pause runs out."""
        times = [t.clears_at() for t in self.flaps.values()]
        times.append(self.guard.resumes_at())
        return min((t for t in times if t is not None), default=None)

    def count(self, now: float, rail: str, label: str, kinds: list[Any],
              guard: bool = True) -> None:
        """Repairs made on a rail: counted, and (unless they undo the agent's own doing)
        fed to the guard."""
        if guard:
            self.guard.record(now, rail, label, set(kinds))
        counts = self.repair_counts.setdefault(rail, {})
        for kind in kinds:
            counts[kind.value] = counts.get(kind.value, 0) + 1
