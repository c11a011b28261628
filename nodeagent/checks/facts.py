"""What one pass judges: every fact the conditions read, frozen for the pass.

Two kinds of fact. The rails' own state (netlink, the GID table, counters, ports, the
fingerprint) is read by the pass itself and has a field each. Everything a source hands
the loop on its own cadence is a `Delivered` observation: the store keeps the latest of
each kind (`seen`, keyed by its class) through one generic `deliver`, and a judge asks for
the kind it reads (`facts.get(TransportSeen)`). A new source is a new Delivered class;
nothing in the store, the pass or this view changes for it.

Verdicts several readers need (the GID verdict: its judge, the re-pin and the probes'
targets; drift and peer statistics: their judges and the rails' status) are derived from
the facts once per pass (`derive`), not gathered with them.

The run layer fills it; every condition reads from it and from the config only, so judging
the same Facts twice gives the same Findings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from nodeagent.checks.peers import PeerHistory
from nodeagent.checks.port_health import ErrorRates
from nodeagent.checks.traffic import TrafficTracker
from nodeagent.model import (
    CustomCheckResult,
    DevicePluginObservation,
    GidTable,
    LustreObservation,
    PeerProbe,
    PeerRef,
    Pin,
    PortHealth,
    QueuePairs,
    RailCounters,
    RailObservation,
    RailTimeline,
    SlicesObservation,
    TransportResult,
)

D = TypeVar("D", bound="Delivered")
T = TypeVar("T")


class Delivered:
    """An observation a source hands the loop; the store keeps the latest of each kind. A
    kind that accumulates over rounds folds itself onto the one before (`after`); a reload
    forgets what belonged to rails whose config changed (`without_rails`)."""

    def after(self: D, previous: D | None) -> D:
        return self

    def without_rails(self: D, rails: Set[str]) -> D:
        return self


def latest(seen: Mapping[type[Delivered], Delivered], kind: type[D]) -> D | None:
    """The latest observation of a kind in `seen`, None before its source's first."""
    got = seen.get(kind)
    return got if isinstance(got, kind) else None


@dataclass(frozen=True)
class LustreSeen(Delivered):
    observation: LustreObservation
    remounted: tuple[str, ...] = ()


@dataclass(frozen=True)
class PluginSeen(Delivered):
    observation: DevicePluginObservation
    seen_ready: frozenset[str] = frozenset()  # plugin pod UIDs ever seen Ready


@dataclass(frozen=True)
class SlicesSeen(Delivered):
    observation: SlicesObservation


@dataclass(frozen=True)
class CustomChecksSeen(Delivered):
    results: Mapping[str, CustomCheckResult]  # by check name, the latest run of each


@dataclass(frozen=True)
class TransportSeen(Delivered):
    results: Mapping[str, TransportResult]  # by rail: this round's, then the latest kept
    skipped: Mapping[str, str]  # rail -> why it was not probed

    def after(self, previous: TransportSeen | None) -> TransportSeen:
        """A rail keeps its last result until probed again; a skipped rail forgets it."""
        kept = {**(previous.results if previous else {}), **self.results}
        return replace(self, results={r: v for r, v in kept.items() if r not in self.skipped})

    def without_rails(self, rails: Set[str]) -> TransportSeen:
        return TransportSeen({r: v for r, v in self.results.items() if r not in rails},
                             {r: v for r, v in self.skipped.items() if r not in rails})


@dataclass(frozen=True)
class PeersSeen(Delivered):
    probes: Mapping[str, tuple[PeerProbe, ...]]  # by rail, this round's probes of its peers
    skipped: Mapping[str, str]  # rail -> why it was not probed
    window: int = 60  # how many of each peer's probes are judged (peers.window)
    listed: Mapping[str, tuple[PeerRef, ...]] = field(default_factory=dict)  # rail -> peers
    short: Mapping[str, str] = field(default_factory=dict)  # rail -> why fewer were found
    # rail -> why this node's responder does not listen there (its peers cannot probe it)
    not_listening: Mapping[str, str] = field(default_factory=dict)
    # Each peer's probes over the rounds so far (the fold keeps one, owned by the loop).
    history: PeerHistory = field(default_factory=PeerHistory, compare=False, repr=False)

    def after(self, previous: PeersSeen | None) -> PeersSeen:
        history = previous.history if previous is not None else PeerHistory()
        history.observe_round(self.probes, self.skipped, self.window)
        return replace(self, history=history)

    def without_rails(self, rails: Set[str]) -> PeersSeen:
        return replace(self, skipped={r: v for r, v in self.skipped.items() if r not in rails})


@dataclass(frozen=True)
class Facts:
    now: float  # monotonic: the age of time-based facts (transport results, traffic)
    gid_table: GidTable = field(default_factory=lambda: GidTable(source="none"))
    qps: QueuePairs | None = None  # every QP on the host, read only while a GID is shifted
    # rail -> the RDMA device and port its GIDs were last seen on (still there or not)
    rail_seen: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    observations: Mapping[str, RailObservation] = field(default_factory=dict)
    # What only time shows of each rail (the daemon's; a one-shot command has none).
    timelines: Mapping[str, RailTimeline] = field(default_factory=dict)
    pins: Mapping[str, Pin] = field(default_factory=dict)  # learned (config pins aside)
    counters: Mapping[str, RailCounters] = field(default_factory=dict)
    traffic: TrafficTracker = field(default_factory=TrafficTracker)
    ports: Mapping[str, PortHealth] = field(default_factory=dict)
    error_rates: ErrorRates = field(default_factory=ErrorRates)
    labels: Mapping[str, str] = field(default_factory=dict)  # the hardware fingerprint
    seen: Mapping[type[Delivered], Delivered] = field(default_factory=dict)  # by kind
    # What `derive` computed from these facts, once each (not part of the facts).
    _derived: dict[Callable[..., Any], Any] = field(default_factory=dict, compare=False,
                                                    repr=False)

    @property
    def overrides(self) -> dict[str, tuple[str, str]]:
        """The time-based verdicts per rail (LinkFlapping, ManagedElsewhere)."""
        return {r: t.verdict for r, t in self.timelines.items() if t.verdict is not None}

    @property
    def gid_source(self) -> str:
        return self.gid_table.source

    def get(self, kind: type[D]) -> D | None:
        return latest(self.seen, kind)

    def derive(self, how: Callable[..., T], *args: Any) -> T:
        """`how(*args, self)`, computed once for these facts (the args, the config, are the
        same for every reader of one pass)."""
        if how not in self._derived:
            self._derived[how] = how(*args, self)
        result: T = self._derived[how]
        return result
