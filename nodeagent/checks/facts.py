"""What one pass judges: every fact the conditions read, frozen for the pass.

The run layer gathers it (its store holds the latest of each source); every condition
reads from it and from the config only, so judging the same Facts twice gives the same
Findings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nodeagent.checks.gid import GidVerdict
from nodeagent.checks.port_health import ErrorRates
from nodeagent.checks.traffic import TrafficTracker
from nodeagent.model import (
    CustomCheckResult,
    DevicePluginObservation,
    Drift,
    LustreObservation,
    PeerRef,
    PeerStats,
    Pin,
    PortHealth,
    RailCounters,
    RailObservation,
    TransportResult,
)


@dataclass(frozen=True)
class Facts:
    now: float  # monotonic: the age of time-based facts (transport results, traffic)
    gid: GidVerdict  # the GID table read against the pins (checks/gid.py)
    gid_source: str = "none"
    observations: Mapping[str, RailObservation] = field(default_factory=dict)
    drift: Mapping[str, Sequence[Drift]] = field(default_factory=dict)  # after repairs
    # The daemon's time-based verdicts per rail (LinkFlapping, ManagedElsewhere).
    overrides: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    pins: Mapping[str, Pin] = field(default_factory=dict)  # learned (config pins aside)
    device_plugin: DevicePluginObservation | None = None
    plugin_seen_ready: frozenset[str] = frozenset()  # plugin pod UIDs once seen Ready
    lustre: LustreObservation | None = None
    counters: Mapping[str, RailCounters] = field(default_factory=dict)
    traffic: TrafficTracker = field(default_factory=TrafficTracker)
    ports: Mapping[str, PortHealth] = field(default_factory=dict)
    error_rates: ErrorRates = field(default_factory=ErrorRates)
    custom_results: Mapping[str, CustomCheckResult] = field(default_factory=dict)
    transport_results: Mapping[str, TransportResult] = field(default_factory=dict)
    transport_skipped: Mapping[str, str] = field(default_factory=dict)
    peer_stats: Mapping[str, tuple[PeerStats, ...]] = field(default_factory=dict)  # by rail
    peers_skipped: Mapping[str, str] = field(default_factory=dict)  # rail -> why not probed
    # by rail, what the prober probes (static, then discovered); None: the config's own
    peers_listed: Mapping[str, tuple[PeerRef, ...]] | None = None
    peers_short: Mapping[str, str] = field(default_factory=dict)  # rail -> too few found
    labels: Mapping[str, str] = field(default_factory=dict)  # the hardware fingerprint
