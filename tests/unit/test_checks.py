"""Pure checks, remedy planning and the time-based trackers, without a kernel."""

from __future__ import annotations

import socket

from nodeagent.checks.deviceplugin import device_plugin_finding
from nodeagent.checks.fabric import fabric_finding
from nodeagent.checks.history import FlapTracker, RepairGuard
from nodeagent.checks.lustre import lustre_finding
from nodeagent.checks.network import network_finding, rail_drift
from nodeagent.config import Config, parse_config
from nodeagent.model.conditions import Finding
from nodeagent.model.network import (
    AddressInfo,
    DriftKind,
    LinkState,
    RailObservation,
    RouteInfo,
    RuleInfo,
)
from nodeagent.remedies.network import plan_rail

RAIL = {"name": "rail0", "interface": "ens1f0", "address": "10.10.0.5/24", "mtu": 4200,
        "table": 100, "rule_priority": 1000, "gateway": "10.10.0.1"}
SYSCTLS = {"arp_ignore": "1", "arp_announce": "2", "rp_filter": "2", "accept_ra": "0"}


def config(**patch: object) -> Config:
    return parse_config({"rails": [{**RAIL, **patch}]})


def link(**patch: object) -> LinkState:
    base = {"ifname": "ens1f0", "index": 7, "mtu": 4200, "admin_up": True, "carrier": True,
            "operstate": "UP"}
    return LinkState(**{**base, **patch})  # type: ignore[arg-type]


def healthy(**patch: object) -> RailObservation:
    base: dict[str, object] = {
        "rail": "rail0",
        "link": link(),
        "addresses": (AddressInfo("10.10.0.5", 24, socket.AF_INET),
                      AddressInfo("fe80::1", 64, socket.AF_INET6)),
        "routes": (RouteInfo(100, "10.10.0.0/24", None, 7, "10.10.0.5"),
                   RouteInfo(100, "0.0.0.0/0", "10.10.0.1", 7)),
        "rules": (RuleInfo(1000, "10.10.0.5/32", 100),),
        "sysctls": dict(SYSCTLS),
    }
    return RailObservation(**{**base, **patch})  # type: ignore[arg-type]


def kinds(cfg: Config, obs: RailObservation) -> list[DriftKind]:
    return [d.kind for d in rail_drift(cfg, cfg.rails[0], obs)]


def test_healthy_rail_has_no_drift() -> None:
    cfg = config()
    assert kinds(cfg, healthy()) == []
    finding = network_finding(cfg, {"rail0": []})
    assert (finding.status, finding.reason) == ("True", "RailsConfigured")


def test_each_drift_kind_and_its_message() -> None:
    cfg = config()
    obs = healthy(
        link=link(mtu=1500, admin_up=False),
        addresses=(AddressInfo("10.10.0.5", 16, socket.AF_INET),),
        routes=(),
        rules=(RuleInfo(999, "10.10.0.5/32", 100),),
        sysctls={**SYSCTLS, "rp_filter": "1", "accept_ra": None},
    )
    drift = rail_drift(cfg, cfg.rails[0], obs)
    assert [d.message for d in drift] == [
        "rail0 ens1f0: link is administratively down",
        "rail0 ens1f0: address 10.10.0.5/24 missing",
        "rail0 ens1f0: address 10.10.0.5/16 has the wrong prefix, want 10.10.0.5/24",
        "rail0 ens1f0: MTU 1500, want 4200",
        "rail0 ens1f0: route 10.10.0.0/24 missing in table 100",
        "rail0 ens1f0: route default via 10.10.0.1 missing in table 100",
        "rail0 ens1f0: rule 'from 10.10.0.5 lookup 100' priority 1000 missing",
        "rail0 ens1f0: rule 'from 10.10.0.5 lookup 100' at priority 999, want 1000",
        "rail0 ens1f0: sysctl accept_ra unreadable",
        "rail0 ens1f0: sysctl rp_filter=1, want 2",
    ]
    finding = network_finding(cfg, {"rail0": drift})
    assert (finding.status, finding.reason) == ("False", "LinkDown")


def test_missing_interface_and_no_carrier() -> None:
    cfg = config()
    assert kinds(cfg, RailObservation(rail="rail0", link=None)) == [DriftKind.INTERFACE_MISSING]
    drift = rail_drift(cfg, cfg.rails[0], healthy(link=link(carrier=False)))
    assert [(d.kind, d.repairable) for d in drift] == [(DriftKind.NO_CARRIER, False)]


def test_wrong_gateway_or_device_is_a_missing_route() -> None:
    cfg = config()
    obs = healthy(routes=(RouteInfo(100, "10.10.0.0/24", None, 8),
                          RouteInfo(100, "0.0.0.0/0", "10.10.0.9", 7)))
    assert kinds(cfg, obs) == [DriftKind.ROUTE_MISSING, DriftKind.ROUTE_MISSING]


def test_foreign_addresses_only_matter_on_exclusive_rails() -> None:
    extra = (AddressInfo("10.10.0.5", 24, socket.AF_INET), AddressInfo("10.99.0.1", 24, 2),
             AddressInfo("2001:db8::5", 64, socket.AF_INET6),
             AddressInfo("fe80::1", 64, socket.AF_INET6))
    assert kinds(config(), healthy(addresses=extra)) == []
    drift = rail_drift(config(exclusive=True), config().rails[0], healthy(addresses=extra))
    assert drift == []  # exclusive is read from the rail passed in
    cfg = config(exclusive=True)
    drift = rail_drift(cfg, cfg.rails[0], healthy(addresses=extra))
    assert [(d.kind, d.detail) for d in drift] == [
        (DriftKind.FOREIGN_ADDRESS, "10.99.0.1/24"),
        (DriftKind.FOREIGN_ADDRESS, "2001:db8::5/64"),
    ]


def test_rule_without_priority_accepts_any_priority() -> None:
    cfg = config(rule_priority=None)
    assert kinds(cfg, healthy(rules=(RuleInfo(31000, "10.10.0.5/32", 100),))) == []


def test_plan_orders_repairs_and_skips_what_cannot_be_repaired() -> None:
    cfg = config()
    obs = healthy(link=link(mtu=1500, admin_up=False), addresses=(), routes=(), rules=(),
                  sysctls={**SYSCTLS, "arp_ignore": "0"})
    drift = rail_drift(cfg, cfg.rails[0], obs)
    actions = plan_rail(cfg, cfg.rails[0], 7, drift)
    assert [a.text for a in actions] == [
        "rail0 ens1f0: set link up",
        "rail0 ens1f0: set mtu 4200",
        "rail0 ens1f0: set sysctl arp_ignore=1",
        "rail0 ens1f0: add address 10.10.0.5/24",
        "rail0 ens1f0: route 10.10.0.0/24 dev ens1f0 table 100",
        "rail0 ens1f0: route default via 10.10.0.1 dev ens1f0 table 100",
        "rail0 ens1f0: add rule from 10.10.0.5 lookup 100 priority 1000",
    ]
    no_carrier = rail_drift(cfg, cfg.rails[0], healthy(link=link(carrier=False)))
    assert plan_rail(cfg, cfg.rails[0], 7, no_carrier) == []
    assert plan_rail(cfg, cfg.rails[0], None, drift) == []


def test_overrides_outrank_drift() -> None:
    cfg = config()
    finding = network_finding(cfg, {"rail0": []}, {"rail0": ("LinkFlapping", "rail0: flapping")})
    assert (finding.status, finding.reason, finding.message) == (
        "False", "LinkFlapping", "rail0: flapping")


def test_fabric_aggregate() -> None:
    good = [Finding("A", "True", "Ok", ""), Finding("B", "True", "Ok", "")]
    assert fabric_finding(good).status == "True"
    mixed = [Finding("A", "Unknown", "Later", ""), Finding("B", "False", "Broken", "")]
    f = fabric_finding(mixed)
    assert (f.status, f.reason) == ("False", "Broken")
    assert f.message == "B=False (Broken); A=Unknown (Later)"  # failures first
    assert fabric_finding([Finding("A", "Unknown", "Later", "")]).status == "Unknown"


def test_unconfigured_domains_are_true_and_configured_ones_fail_closed() -> None:
    cfg = parse_config({})
    assert device_plugin_finding(cfg, None).reason == "NotConfigured"
    assert lustre_finding(cfg, None).status == "True"
    cfg = parse_config({"device_plugin": {}, "lustre": [{"mountpoint": "/l", "source": "s"}]})
    assert device_plugin_finding(cfg, None).reason == "KubernetesNotConfigured"
    assert lustre_finding(cfg, None).reason == "NotYetChecked"


# ---------------------------------------------------------------- trackers


def carrier(down: int, changes: int, up: bool) -> LinkState:
    return link(carrier=up, carrier_down_count=down, carrier_changes=changes)


def test_flap_tracker_counts_kernel_counters_and_clears_after_dwell() -> None:
    t = FlapTracker(window=10, max_flaps=3, dwell=5)
    t.observe(0.0, carrier(0, 1, True))
    assert not t.flapping(0.0) and t.total == 0
    t.observe(1.0, carrier(3, 7, True))  # three losses between two reads
    assert t.total == 3 and not t.flapping(1.0)
    t.observe(2.0, carrier(4, 9, True))
    assert t.flapping(2.0) and t.in_window(2.0) == 4
    assert t.flapping(6.9)  # not yet stable for the dwell
    assert not t.flapping(7.0)
    assert t.total == 4


def test_flap_tracker_stays_flapping_while_changes_continue() -> None:
    t = FlapTracker(window=2, max_flaps=1, dwell=5)
    t.observe(0.0, carrier(0, 0, True))
    t.observe(0.5, carrier(2, 4, True))
    assert t.flapping(0.5)
    t.observe(4.0, carrier(2, 5, False))  # carrier change, window already empty
    assert t.flapping(8.9)
    assert not t.flapping(9.0)


def test_flap_tracker_skips_an_event_older_than_a_probe_it_has_seen() -> None:
    """Found by the lab soak (200 flaps): a queued event's counters, read after a newer
    probe, moved the base back and the next look counted one loss twice."""
    t = FlapTracker(window=10, max_flaps=5, dwell=1)
    t.observe(0.0, carrier(10, 20, True))
    t.observe(1.0, carrier(11, 22, True))  # the probe: one loss since
    t.observe(1.1, carrier(11, 21, False))  # the queued event of that loss, read late
    t.observe(2.0, carrier(11, 22, True))  # the next probe: nothing new
    assert t.total == 1
    t.observe(3.0, link(index=99, carrier=True, carrier_down_count=0, carrier_changes=0))
    t.observe(4.0, link(index=99, carrier=True, carrier_down_count=1, carrier_changes=2))
    assert t.total == 2, "a re-created device's counters start again"


def test_flap_tracker_without_kernel_counters_counts_transitions() -> None:
    t = FlapTracker(window=10, max_flaps=1, dwell=1)
    for i, up in enumerate([True, False, True, False]):
        t.observe(float(i), link(carrier=up))
    assert t.total == 2 and t.flapping(3.0)


def test_repair_guard_pauses_and_resumes() -> None:
    g = RepairGuard(max_repairs=2, window=10, backoff=30)
    for now in (0.0, 1.0):
        g.record(now, "rail0", "rail0 ens1f0", {DriftKind.ADDRESS_MISSING})
        assert g.paused(now, "rail0") is None
    g.record(2.0, "rail0", "rail0 ens1f0", {DriftKind.ADDRESS_MISSING})
    why = g.paused(2.0, "rail0")
    assert why == ("rail0 ens1f0: AddressMissing repaired 3 times in 10s, something else "
                   "keeps undoing it; repairs paused for 30s")
    assert g.paused(2.0, "rail1") is None
    assert g.paused(32.0, "rail0") is None
    g.record(33.0, "rail0", "rail0 ens1f0", {DriftKind.ADDRESS_MISSING})
    assert g.paused(33.0, "rail0") is None  # history was reset with the pause


def test_repair_guard_window_slides() -> None:
    g = RepairGuard(max_repairs=2, window=10, backoff=30)
    for now in (0.0, 6.0, 12.0, 18.0):
        g.record(now, "rail0", "r", {DriftKind.MTU})
    assert g.paused(18.0, "rail0") is None


def test_repair_guard_room_is_what_may_be_repaired_before_the_pause() -> None:
    """The fast lane's budget: the most-repaired kind in the window decides; none while
    paused; the window's old repairs give room back."""
    g = RepairGuard(max_repairs=3, window=10, backoff=30)
    assert g.room(0.0, "rail0") == 3
    g.record(0.0, "rail0", "r", {DriftKind.ADDRESS_MISSING, DriftKind.ROUTE_MISSING})
    g.record(1.0, "rail0", "r", {DriftKind.ROUTE_MISSING})
    assert g.room(1.0, "rail0") == 1 and g.room(1.0, "rail1") == 3
    assert g.room(10.5, "rail0") == 2  # the repair at 0.0 left the window
    for now in (11.0, 11.5, 12.0):
        g.record(now, "rail0", "r", {DriftKind.ROUTE_MISSING})
    # No room, not yet paused: the next repair is the loop's, and it trips the guard.
    assert g.room(12.0, "rail0") == 0 and g.paused(12.0, "rail0") is None
    g.record(12.5, "rail0", "r", {DriftKind.ROUTE_MISSING})
    assert g.paused(12.5, "rail0") is not None and g.room(12.5, "rail0") == 0


def test_deletion_drift_names_only_what_the_rail_owns() -> None:
    """The event-targeted repair's input: a deletion of the rail's own address, table route
    or rule is drift; anything else (another address, another table) is not."""
    from nodeagent.checks.network import deletion_drift
    from nodeagent.config import parse_config
    from nodeagent.model.network import AddressInfo, Deletion, DriftKind, RouteInfo, RuleInfo

    cfg = parse_config({"rails": [{"name": "rail0", "interface": "r0",
                                   "address": "10.10.0.5/24", "table": 100,
                                   "rule_priority": 1000, "gateway": "10.10.0.1"}]})
    rail = cfg.rails[0]

    def kinds(gone: Deletion) -> list[tuple[DriftKind, str]]:
        return [(d.kind, d.detail) for d in deletion_drift(rail, 7, gone)]

    # The kernel drops the table's routes with the address: they are planned with it.
    assert kinds(Deletion("address", 7, AddressInfo("10.10.0.5", 24, socket.AF_INET))) == [
        (DriftKind.ADDRESS_MISSING, ""), (DriftKind.ROUTE_MISSING, "10.10.0.0/24"),
        (DriftKind.ROUTE_MISSING, "0.0.0.0/0")]
    assert kinds(Deletion("address", 8, AddressInfo("10.10.0.5", 24, socket.AF_INET))) == []
    assert kinds(Deletion("address", 7, AddressInfo("10.10.0.6", 24, socket.AF_INET))) == []
    assert kinds(Deletion("address", 7, AddressInfo("10.10.0.5", 16, socket.AF_INET))) == []
    assert kinds(Deletion("route", route=RouteInfo(100, "0.0.0.0/0", "10.10.0.1", 7))) == [
        (DriftKind.ROUTE_MISSING, "0.0.0.0/0")]
    assert kinds(Deletion("route", route=RouteInfo(100, "10.10.0.0/24", None, 7))) == [
        (DriftKind.ROUTE_MISSING, "10.10.0.0/24")]
    assert kinds(Deletion("route", route=RouteInfo(254, "0.0.0.0/0", "10.10.0.1", 7))) == []
    assert kinds(Deletion("rule", rule=RuleInfo(1000, "10.10.0.5/32", 100))) == [
        (DriftKind.RULE_MISSING, "")]
    assert kinds(Deletion("rule", rule=RuleInfo(999, "10.10.0.5/32", 100))) == []
