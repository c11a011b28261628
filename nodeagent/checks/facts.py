"""What one pass judges: every fact the conditions read, frozen for the pass.

Two kinds of fact. What the repairs work from (netlink, the GID table, the queue pairs) is
read by the pass itself and has a field each. Everything else is a `Delivered` observation,
whether a source hands it over on its own cadence or the pass reads it (counters, ports,
the fingerprint): the store keeps the latest of each kind (`seen`, keyed by its class)
through one generic `deliver`, and a judge asks for the kind it reads
(`facts.get(TransportSeen)`). A new source is a new Delivered class; nothing in the store,
the pass or this view changes for it.

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
from nodeagent.model.kube import (
    ClaimsObservation,
    DevicePluginObservation,
    SlicesObservation,
)
from nodeagent.model.lustre import LustreObservation
from nodeagent.model.network import Neighbour, RailObservation
from nodeagent.model.peers import PeerProbe, PeerRef, TransportResult
from nodeagent.model.rdma import (
    CongestionSample,
    GidTable,
    Pin,
    PortHealth,
    QueuePairs,
    RailCounters,
)
from nodeagent.model.status import CustomCheckResult, RailTimeline

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
class CountersSeen(Delivered):
    """Each rail's byte counters as this pass read them (a rail whose read did not answer
    is absent: its traffic verdict waits), folded into the traffic history."""

    counters: Mapping[str, RailCounters]
    at: float = 0.0  # monotonic
    window: float | None = None  # fabric_traffic.window; None: no traffic history kept
    traffic: TrafficTracker = field(default_factory=TrafficTracker, compare=False, repr=False)

    def after(self, previous: CountersSeen | None) -> CountersSeen:
        traffic = previous.traffic if previous is not None else TrafficTracker()
        if self.window is not None:
            traffic.observe(self.at, self.window, self.counters)
        return replace(self, traffic=traffic)

    def without_rails(self, rails: Set[str]) -> CountersSeen:
        return replace(self, counters={r: c for r, c in self.counters.items()
                                       if r not in rails})


@dataclass(frozen=True)
class PortsSeen(Delivered):
    """Each rail's RDMA port, PCIe link and error counters as this pass read them (a port
    that did not answer is absent), folded into the error counters' history."""

    ports: Mapping[str, PortHealth]
    at: float = 0.0  # monotonic
    window: float = 300.0  # hardware.error_window
    rates: ErrorRates = field(default_factory=ErrorRates, compare=False, repr=False)

    def after(self, previous: PortsSeen | None) -> PortsSeen:
        rates = previous.rates if previous is not None else ErrorRates()
        rates.observe(self.at, self.window, self.ports)
        return replace(self, rates=rates)

    def without_rails(self, rails: Set[str]) -> PortsSeen:
        return replace(self, ports={r: p for r, p in self.ports.items() if r not in rails})


@dataclass(frozen=True)
class CongestionSeen(Delivered):
    """Each ready rail's congestion counters as the source last read them, folded into
    their history over congestion.window (the same windows as the error counters')."""

    samples: Mapping[str, CongestionSample]
    skipped: Mapping[str, str] = field(default_factory=dict)  # rail -> why it was not read
    at: float = 0.0  # monotonic
    window: float = 60.0
    rates: ErrorRates = field(default_factory=ErrorRates, compare=False, repr=False)

    def after(self, previous: CongestionSeen | None) -> CongestionSeen:
        rates = previous.rates if previous is not None else ErrorRates()
        rates.observe(self.at, self.window, self.samples)
        return replace(self, rates=rates)

    def without_rails(self, rails: Set[str]) -> CongestionSeen:
        return replace(self, samples={r: v for r, v in self.samples.items() if r not in rails},
                       skipped={r: v for r, v in self.skipped.items() if r not in rails})


@dataclass(frozen=True)
class LLDPSeen(Delivered):
    """The switch port last heard on each rail, and when (monotonic)."""

    heard: Mapping[str, tuple[Neighbour, float]]
    unopened: Mapping[str, str] = field(default_factory=dict)  # rail -> why not listened on

    def without_rails(self, rails: Set[str]) -> LLDPSeen:
        return LLDPSeen({r: v for r, v in self.heard.items() if r not in rails},
                        {r: v for r, v in self.unopened.items() if r not in rails})


@dataclass(frozen=True)
class FingerprintSeen(Delivered):
    labels: Mapping[str, str]  # the hardware fingerprint, as node labels


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
class ClaimsSeen(Delivered):
    observation: ClaimsObservation


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
