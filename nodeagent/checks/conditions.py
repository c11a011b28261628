"""The registry of conditions: each is registered once, here, and everything that lists
condition types reads it (the Node writer publishes what the pass judged; `nodeagent
deploy` renders the admission policy's allowed types; `fleet -o wide` shows one column
each; tests check the README's table and run the contract test on a real API server).

A condition is its type, the config section that configures it, whether it is reported
without that section, whether it is part of FabricReady always or only with its section's
`gate: true`, and a pure `judge(cfg, facts)`. Adding one is an enum member, a config
section, a check module and a line here. FabricReady is judged last, over the gated
ones, and listed where it stands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from nodeagent.checks.cabling import NO_LLDP, cabling_finding, heard_now
from nodeagent.checks.congestion import congestion_finding
from nodeagent.checks.custom import custom_finding
from nodeagent.checks.deviceplugin import device_plugin_finding
from nodeagent.checks.dra import rail_devices, slices_finding
from nodeagent.checks.fabric import fabric_finding
from nodeagent.checks.facts import (
    CongestionSeen,
    CountersSeen,
    CustomChecksSeen,
    Facts,
    FingerprintSeen,
    LLDPSeen,
    LustreSeen,
    PeersSeen,
    PluginSeen,
    PortsSeen,
    SlicesSeen,
    TransportSeen,
)
from nodeagent.checks.gid import gid_verdict
from nodeagent.checks.lustre import lustre_finding
from nodeagent.checks.nccl_default import nccl_default_finding, nccl_defaults
from nodeagent.checks.network import drift_by_rail, network_finding
from nodeagent.checks.peers import (
    NO_PEERS,
    NOT_RESPONDING,
    PeerHistory,
    peers_finding,
    rail_peer_stats,
    static_peers,
)
from nodeagent.checks.port_health import ErrorRates, hardware_finding
from nodeagent.checks.traffic import TrafficTracker, traffic_expectation, traffic_finding
from nodeagent.checks.transport import transport_finding
from nodeagent.config import Config
from nodeagent.model.conditions import (
    CUSTOM_CHECKS_PASSED,
    FABRIC_NOT_CONGESTED,
    FABRIC_READY,
    FABRIC_TRAFFIC_ON_RDMA,
    LUSTRE_READY,
    NCCL_DEFAULT_GID_PINNED,
    RAIL_CABLING_VERIFIED,
    RDMA_DEVICE_PLUGIN_READY,
    RDMA_HARDWARE_HEALTHY,
    RDMA_PEERS_REACHABLE,
    RDMA_RESOURCE_SLICES_READY,
    RDMA_TRANSPORT_VERIFIED,
    ROCE_GID_STABLE,
    ROCE_NETWORK_READY,
    ConditionType,
    Finding,
)
from nodeagent.model.kube import label_value, switch_label
from nodeagent.model.peers import PeerRef, PeerStats
from nodeagent.model.status import RailLink, RailRoce, RailStatus, Report

Judge = Callable[[Config, Facts], Finding]


def _counts(finding: Finding) -> bool:
    return True


@dataclass(frozen=True)
class Condition:
    type: ConditionType
    judge: Judge
    column: str  # its heading in `fleet -o wide` (unique, and not one of the fixed ones)
    section: str | None = None  # the Config field that configures it (None: the rails)
    # Reported only with its section: an agent upgraded before the admission policy that
    # allows a new type still publishes everything else.
    needs_section: bool = False
    # Part of FabricReady always, or only when its section is there with `gate: true`.
    gate: Literal["always", "section"] = "always"
    # The smallest section that configures it (what the contract test turns on; None:
    # the rails configure it).
    example: Any = None
    # Whether a gated finding holds FabricReady: a verdict that is about another node (its
    # agent is down) never taints this one.
    counts: Callable[[Finding], bool] = _counts

    def configured(self, cfg: Config) -> bool:
        return self.section is not None and getattr(cfg, self.section) is not None

    def enabled(self, cfg: Config) -> bool:
        """Whether this config reports it at all."""
        return not self.needs_section or self.configured(cfg)

    def gates(self, cfg: Config) -> bool:
        """Whether its finding is part of FabricReady under this config."""
        if self.gate == "always":
            return True
        return self.configured(cfg) and bool(getattr(cfg, self.section or "").gate)


def _plugin(cfg: Config, facts: Facts) -> Finding:
    seen = facts.get(PluginSeen)
    return device_plugin_finding(cfg, seen.observation if seen else None,
                                 seen.seen_ready if seen else frozenset())


def _traffic(cfg: Config, facts: Facts) -> Finding:
    seen = facts.get(PluginSeen)
    expected, why = traffic_expectation(cfg, seen.observation if seen else None)
    counted = facts.get(CountersSeen)
    return traffic_finding(cfg, counted.traffic if counted else TrafficTracker(), facts.now,
                           counted.counters if counted else {}, expected, why)


def _hardware(cfg: Config, facts: Facts) -> Finding:
    seen = facts.get(PortsSeen)
    return hardware_finding(cfg, seen.ports if seen else {}, seen.rates if seen else ErrorRates())


def _lustre(cfg: Config, facts: Facts) -> Finding:
    seen = facts.get(LustreSeen)
    return lustre_finding(cfg, seen.observation if seen else None)


def _custom(cfg: Config, facts: Facts) -> Finding:
    seen = facts.get(CustomChecksSeen)
    return custom_finding(cfg, seen.results if seen else {})


def _transport(cfg: Config, facts: Facts) -> Finding:
    seen = facts.get(TransportSeen)
    return transport_finding(cfg, seen.results if seen else {}, seen.skipped if seen else {},
                             facts.now)


def peers_listed(cfg: Config, facts: Facts) -> Mapping[str, tuple[PeerRef, ...]]:
    """Each rail's peers as the prober last listed them; before its first round, the
    config's own (not probed yet)."""
    seen = facts.get(PeersSeen)
    return seen.listed if seen is not None else static_peers(cfg.peers)


def peer_stats_by_rail(cfg: Config, facts: Facts) -> dict[str, tuple[PeerStats, ...]]:
    """Each rail's probed peers' figures (through facts.derive: once, for the judge and
    the rails' status)."""
    if cfg.peers is None:
        return {}
    seen = facts.get(PeersSeen)
    return rail_peer_stats(cfg.peers, peers_listed(cfg, facts),
                           seen.history if seen is not None else PeerHistory())


def _peers(cfg: Config, facts: Facts) -> Finding:
    seen = facts.get(PeersSeen)
    transport = facts.get(TransportSeen)
    return peers_finding(cfg, facts.derive(peer_stats_by_rail, cfg),
                         seen.skipped if seen else {}, facts.now,
                         {r: t.ok for r, t in (transport.results if transport else {}).items()},
                         peers_listed(cfg, facts), seen.short if seen else {})


def _slices(cfg: Config, facts: Facts) -> Finding:
    seen = facts.get(SlicesSeen)
    return slices_finding(cfg, seen.observation if seen else None)


def _congestion(cfg: Config, facts: Facts) -> Finding:
    seen = facts.get(CongestionSeen)
    return congestion_finding(cfg, seen.samples if seen else None, seen.skipped if seen else {},
                              seen.rates if seen else ErrorRates(),
                              facts.now - seen.at if seen else 0.0)


def _cabling(cfg: Config, facts: Facts) -> Finding:
    seen = facts.get(LLDPSeen)
    return cabling_finding(cfg, seen.heard if seen else {}, facts.now,
                           seen.unopened if seen else {})


def _fabric_placeholder(cfg: Config, facts: Facts) -> Finding:
    raise AssertionError("FabricReady is judged over the others (judge_all)")


FABRIC = Condition(FABRIC_READY, _fabric_placeholder, column="FABRIC")

CONDITIONS: Sequence[Condition] = (
    Condition(ROCE_NETWORK_READY,
              lambda cfg, f: network_finding(cfg, f.derive(drift_by_rail, cfg), f.overrides),
              column="NET"),
    Condition(ROCE_GID_STABLE, lambda cfg, f: f.derive(gid_verdict, cfg).finding, column="GID"),
    Condition(RDMA_DEVICE_PLUGIN_READY, _plugin, column="PLUGIN", section="device_plugin",
              example={}),
    Condition(LUSTRE_READY, _lustre, column="LUSTRE", section="lustre",
              example=[{"mountpoint": "/lustre/scratch", "source": "10.0.0.1@o2ib:/scratch"}]),
    FABRIC,
    Condition(FABRIC_TRAFFIC_ON_RDMA, _traffic, column="TRAFFIC", section="fabric_traffic",
              gate="section", example={}),
    Condition(RDMA_HARDWARE_HEALTHY, _hardware,
              column="HW", section="hardware", needs_section=True, gate="section",
              example={}),
    Condition(CUSTOM_CHECKS_PASSED, _custom, column="CUSTOM", section="custom_checks",
              needs_section=True, gate="section",
              example={"checks": [{"name": "true", "command": ["true"]}]}),
    Condition(RDMA_TRANSPORT_VERIFIED, _transport, column="TRANSPORT", section="transport",
              needs_section=True, gate="section", example={}),
    Condition(RDMA_PEERS_REACHABLE, _peers, column="REACH", section="peers",
              needs_section=True, gate="section", example={},
              counts=lambda finding: finding.reason not in (NOT_RESPONDING, NO_PEERS)),
    Condition(NCCL_DEFAULT_GID_PINNED, nccl_default_finding, column="NCCL", section="nccl",
              needs_section=True, gate="section", example={}),
    Condition(RDMA_RESOURCE_SLICES_READY, _slices, column="DRA", section="dra",
              needs_section=True, gate="section", example={}),
    Condition(FABRIC_NOT_CONGESTED, _congestion, column="CONGESTION", section="congestion",
              needs_section=True, gate="section", example={}),
    Condition(RAIL_CABLING_VERIFIED, _cabling, column="CABLING", section="lldp",
              needs_section=True, gate="section", example={},
              counts=lambda finding: finding.reason != NO_LLDP),
)
# Every type the agent may publish, in the registry's order (the admission policy allows
# exactly these; the Node writer publishes what a pass judged, always a subset).
CONDITION_TYPES: tuple[ConditionType, ...] = tuple(c.type for c in CONDITIONS)


def judge_all(cfg: Config, facts: Facts,
              conditions: Sequence[Condition] = CONDITIONS) -> list[Finding]:
    """Every enabled condition's Finding, in the registry's order, FabricReady over the
    gated ones."""
    judged = [(c, c.judge(cfg, facts)) for c in conditions
              if c is not FABRIC and c.enabled(cfg)]
    fabric = fabric_finding([f for c, f in judged if c.gates(cfg) and c.counts(f)])
    out = {c.type: f for c, f in judged}
    out[FABRIC_READY] = fabric
    return [out[c.type] for c in conditions if c.type in out]


def rail_statuses(cfg: Config, facts: Facts) -> list[RailStatus]:
    """Each rail as the status file, the metrics and `status --json` show it."""
    drift, gid = facts.derive(drift_by_rail, cfg), facts.derive(gid_verdict, cfg)
    transport, counted, ports = facts.get(TransportSeen), facts.get(CountersSeen), \
        facts.get(PortsSeen)
    lldp = facts.get(LLDPSeen)
    switches = heard_now(lldp.heard, facts.now) if lldp is not None else {}
    slices = facts.get(SlicesSeen)
    devices = rail_devices(cfg, slices.observation if slices is not None else None)
    peers = facts.derive(peer_stats_by_rail, cfg)
    nccl = facts.derive(nccl_defaults, cfg)
    rails = []
    for rail in cfg.rails:
        obs = facts.observations.get(rail.name)
        learned = facts.pins.get(rail.name)
        timeline = facts.timelines.get(rail.name)
        pin = rail.gid_index if rail.gid_index is not None else (
            learned.index if learned is not None else None)
        link = obs.link if obs else None
        rails.append(RailStatus(
            name=rail.name, interface=rail.interface,
            link=RailLink(carrier=link.carrier if link else None,
                          mtu=link.mtu if link else None,
                          drift=tuple(d.message for d in drift.get(rail.name, ()))),
            roce=RailRoce(
                address=rail.ip,
                rdma_device=rail.rdma_device or (learned.device if learned else None),
                rdma_port=rail.rdma_port if rail.rdma_device else (
                    learned.port if learned else None),
                gid_index=gid.observed.get(rail.name), gid_index_pinned=pin,
                nccl_default_gid_index=(nccl[rail.name].index if rail.name in nccl
                                        else None)),
            counters=counted.counters.get(rail.name) if counted else None,
            port=ports.ports.get(rail.name) if ports else None,
            history=timeline,
            transport=transport.results.get(rail.name) if transport else None,
            peers=peers.get(rail.name) if cfg.peers is not None else None,
            switch=switches.get(rail.name), dra_device=devices.get(rail.name)))
    return rails


def judge_pass(cfg: Config, facts: Facts, errors: Sequence[str] = (),
               actions: Sequence[str] = ()) -> Report:
    """The report of one pass, from its facts alone (pure: judged twice, the same)."""
    fingerprint = facts.get(FingerprintSeen)
    rails = rail_statuses(cfg, facts)
    labels = dict(fingerprint.labels) if fingerprint else {}
    for rail in rails:  # each rail's switch, while its LLDP holds
        key = switch_label(rail.name)
        value = label_value(rail.switch.switch) if rail.switch is not None else None
        if key is not None and value is not None:
            labels[key] = value
    return Report(node=cfg.resolved_node_name(), findings=judge_all(cfg, facts),
                  actions=list(actions), errors=list(errors), gid_source=facts.gid_source,
                  rails=rails, labels=labels)
