"""The conditions the agent publishes, one entry each, and the judgement of one pass.

A condition is its type, when it is reported (`enabled`), whether it is part of
FabricReady (`gates`) and a pure `judge(cfg, facts)`. Adding one is a check module and a
line here. FabricReady is judged last, over the gated ones, and listed where it stands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nodeagent.checks.custom import custom_finding
from nodeagent.checks.deviceplugin import device_plugin_finding
from nodeagent.checks.fabric import fabric_finding
from nodeagent.checks.facts import Facts
from nodeagent.checks.lustre import lustre_finding
from nodeagent.checks.network import network_finding
from nodeagent.checks.peers import NO_PEERS, NOT_RESPONDING, peers_finding
from nodeagent.checks.port_health import hardware_finding
from nodeagent.checks.traffic import traffic_expectation, traffic_finding
from nodeagent.checks.transport import transport_finding
from nodeagent.config import Config
from nodeagent.model import (
    CUSTOM_CHECKS_PASSED,
    FABRIC_READY,
    FABRIC_TRAFFIC_ON_RDMA,
    LUSTRE_READY,
    RDMA_DEVICE_PLUGIN_READY,
    RDMA_HARDWARE_HEALTHY,
    RDMA_PEERS_REACHABLE,
    RDMA_TRANSPORT_VERIFIED,
    ROCE_GID_STABLE,
    ROCE_NETWORK_READY,
    Finding,
    RailStatus,
    Report,
)


def _always(cfg: Config) -> bool:
    return True


def _counts(finding: Finding) -> bool:
    return True


@dataclass(frozen=True)
class Condition:
    type: str
    judge: Callable[[Config, Facts], Finding]
    # Reported only when configured: an agent upgraded before the admission policy that
    # allows a new type still publishes everything else.
    enabled: Callable[[Config], bool] = _always
    gates: Callable[[Config], bool] = _always
    # Whether a gated finding holds FabricReady: a verdict that is about another node (its
    # agent is down) never taints this one.
    counts: Callable[[Finding], bool] = _counts


def _traffic(cfg: Config, facts: Facts) -> Finding:
    expected, why = traffic_expectation(cfg, facts.device_plugin)
    return traffic_finding(cfg, facts.traffic, facts.now, facts.counters, expected, why)


def _fabric_placeholder(cfg: Config, facts: Facts) -> Finding:
    raise AssertionError("FabricReady is judged over the others (judge_all)")


FABRIC = Condition(FABRIC_READY, _fabric_placeholder)

CONDITIONS: Sequence[Condition] = (
    Condition(ROCE_NETWORK_READY,
              lambda cfg, f: network_finding(cfg, f.drift, f.overrides)),
    Condition(ROCE_GID_STABLE, lambda cfg, f: f.gid.finding),
    Condition(RDMA_DEVICE_PLUGIN_READY,
              lambda cfg, f: device_plugin_finding(cfg, f.device_plugin, f.plugin_seen_ready)),
    Condition(LUSTRE_READY, lambda cfg, f: lustre_finding(cfg, f.lustre)),
    FABRIC,
    Condition(FABRIC_TRAFFIC_ON_RDMA, _traffic,
              gates=lambda cfg: bool(cfg.fabric_traffic and cfg.fabric_traffic.gate)),
    Condition(RDMA_HARDWARE_HEALTHY,
              lambda cfg, f: hardware_finding(cfg, f.ports, f.error_rates),
              enabled=lambda cfg: cfg.hardware is not None,
              gates=lambda cfg: bool(cfg.hardware and cfg.hardware.gate)),
    Condition(CUSTOM_CHECKS_PASSED,
              lambda cfg, f: custom_finding(cfg, f.custom_results),
              enabled=lambda cfg: cfg.custom_checks is not None,
              gates=lambda cfg: bool(cfg.custom_checks and cfg.custom_checks.gate)),
    Condition(RDMA_TRANSPORT_VERIFIED,
              lambda cfg, f: transport_finding(cfg, f.transport_results, f.transport_skipped,
                                               f.now),
              enabled=lambda cfg: cfg.transport is not None,
              gates=lambda cfg: bool(cfg.transport and cfg.transport.gate)),
    Condition(RDMA_PEERS_REACHABLE,
              lambda cfg, f: peers_finding(cfg, f.peer_stats, f.peers_skipped, f.now,
                                           {r: t.ok for r, t in f.transport_results.items()},
                                           f.peers_listed, f.peers_short),
              enabled=lambda cfg: cfg.peers is not None,
              gates=lambda cfg: bool(cfg.peers and cfg.peers.gate),
              counts=lambda finding: finding.reason not in (NOT_RESPONDING, NO_PEERS)),
)


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
    rails = []
    for rail in cfg.rails:
        obs = facts.observations.get(rail.name)
        learned = facts.pins.get(rail.name)
        pin = rail.gid_index if rail.gid_index is not None else (
            learned.index if learned is not None else None)
        link = obs.link if obs else None
        rails.append(RailStatus(
            name=rail.name, interface=rail.interface,
            carrier=link.carrier if link else None, mtu=link.mtu if link else None,
            drift=tuple(d.message for d in facts.drift.get(rail.name, ())),
            gid_index=facts.gid.observed.get(rail.name), gid_index_pinned=pin,
            address=rail.ip,
            rdma_device=rail.rdma_device or (learned.device if learned else None),
            rdma_port=rail.rdma_port if rail.rdma_device else (
                learned.port if learned else None),
            counters=facts.counters.get(rail.name), port=facts.ports.get(rail.name),
            transport=facts.transport_results.get(rail.name),
            peers=facts.peer_stats.get(rail.name) if cfg.peers is not None else None))
    return rails


def judge_pass(cfg: Config, facts: Facts, errors: Sequence[str] = (),
               actions: Sequence[str] = ()) -> Report:
    """The report of one pass, from its facts alone (pure: judged twice, the same)."""
    return Report(node=cfg.resolved_node_name(), findings=judge_all(cfg, facts),
                  actions=list(actions), errors=list(errors), gid_source=facts.gid_source,
                  rails=rail_statuses(cfg, facts), labels=dict(facts.labels))
