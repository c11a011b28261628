"""One pass: probes -> checks -> remedies -> (re-probe) -> findings.

Shared by `check`, `apply` and the daemon. The Evaluator keeps what must survive between
passes (the latest observation of every rail, the learned pins) so the daemon can re-probe
just the rail an event touched and still report on all of them.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent.checks.custom import custom_finding
from nodeagent.checks.deviceplugin import device_plugin_finding
from nodeagent.checks.fabric import fabric_finding
from nodeagent.checks.gid import (
    GidVerdict,
    gid_finding,
    ipv4_v2_entries,
    pin_for,
    rail_entries,
)
from nodeagent.checks.hardware import fingerprint_labels
from nodeagent.checks.lustre import lustre_finding
from nodeagent.checks.network import deletion_drift, network_finding, rail_drift
from nodeagent.checks.port_health import ErrorRates, hardware_finding
from nodeagent.checks.traffic import TrafficTracker, fabric_consumers, traffic_finding
from nodeagent.checks.transport import transport_finding
from nodeagent.config import Config, Rail
from nodeagent.io.bounded import BoundedReads, Stuck
from nodeagent.io.files import describe_error
from nodeagent.io.systemd import RAIL
from nodeagent.model import (
    GID_AFFECTING,
    CustomCheckResult,
    Deletion,
    DevicePluginObservation,
    Drift,
    Finding,
    GidTable,
    LustreObservation,
    PortHealth,
    QueuePairs,
    RailCounters,
    RailObservation,
    RailStatus,
    Report,
    TransportResult,
)
from nodeagent.probes.counters import read_rail_counters
from nodeagent.probes.gid import read_gid_table
from nodeagent.probes.hardware import read_fingerprint
from nodeagent.probes.netlink import observe_rails
from nodeagent.probes.port import read_port_health
from nodeagent.probes.qp import read_qps
from nodeagent.remedies.gid import plan_repin, repin
from nodeagent.remedies.network import Action, execute, plan_rail
from nodeagent.run.transport import Target
from nodeagent.run.work import TransportSeen
from nodeagent.state import load_pins, save_pins

log = logging.getLogger(__name__)

COUNTERS_EVERY = 1.0  # seconds: event-driven passes in a burst share one counter sample
# A GID table that changed with no event is read again (SETTLE_GAP apart, at most
# SETTLE_READS more times) until two reads agree: a driver rewriting its table in place is
# never judged half-way (a transient verdict published for a state that never was).
SETTLE_READS = 5
SETTLE_GAP = 0.02
WATCH_WHILE_GONE = 16  # at most this many low slots watched for a rail whose GIDs are gone


@dataclass
class Repairs:
    done: dict[str, list[Action]] = field(default_factory=dict)  # rail -> ran (or planned)
    errors: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # repairs outside the rails (remounts)

    def texts(self) -> list[str]:
        return [a.text for acts in self.done.values() for a in acts] + self.other

    def record(self, rail: str, done: list[Action], errors: list[str]) -> None:
        """What ran on a rail (logged as repaired) and what failed (logged as errors)."""
        self.errors.extend(errors)
        for line in errors:
            log.error("%s", line)
        if done:
            self.done[rail] = done
            for a in done:
                log.info("repaired %s", a.text, extra={RAIL: rail})

    def merge(self, other: Repairs) -> None:
        for name, actions in other.done.items():
            self.done.setdefault(name, []).extend(actions)
        self.errors.extend(other.errors)
        self.other.extend(other.other)


class PassPolicy:
    """What a caller adds to the one pass. A one-shot command adds nothing; the daemon
    pauses rails it is fighting over (ManagedElsewhere), feeds its repair guard and flap
    trackers, and carries their verdicts into RoCENetworkReady."""

    def paused(self) -> Mapping[str, str]:
        """Rails whose repairs are paused, with why."""
        return {}

    def repaired(self, repairs: Repairs, ours: bool) -> None:
        """Repairs that ran; `ours` when they undo the agent's own doing (a re-pin)."""

    def observed(self, observations: Mapping[str, RailObservation]) -> None:
        """The rails as just probed (after this pass's repairs)."""

    def overrides(self) -> Mapping[str, tuple[str, str]]:
        """Time-based verdicts per rail: (reason, message)."""
        return {}

    def interrupt(self) -> None:
        """Between the pass's stages: the daemon repairs what was deleted meanwhile."""


def fabric_pass(
    evaluator: Evaluator,
    rails: Iterable[str] | None = None,
    *,
    repair: bool,
    dry_run: bool = False,
    early: Repairs | None = None,
    policy: PassPolicy | None = None,
) -> tuple[Report, Repairs]:
    """The one pass `check`, `apply` and the daemon all run: probe the rails (default all;
    an empty set probes none) -> repair their drift -> re-probe what was repaired -> refresh
    the facts that are stale (GID table, counters, fingerprint) -> judge (pure) -> keep
    learned pins -> re-pin a shifted GID that nothing uses -> re-observe -> judge again.

    `early` holds what was repaired before the pass (from events, remounts): it is reported
    with the rest. Returns the report and every repair it reports."""
    policy = policy or PassPolicy()
    evaluator.reads.while_waiting = policy.interrupt  # reads off-thread: the wait is idle
    try:
        return _fabric_pass(evaluator, rails, repair, dry_run, early, policy)
    finally:
        evaluator.reads.while_waiting = None


def _fabric_pass(evaluator: Evaluator, rails: Iterable[str] | None, repair: bool,
                 dry_run: bool, early: Repairs | None,
                 policy: PassPolicy) -> tuple[Report, Repairs]:
    paused = policy.paused()
    probed = evaluator.probe_and_repair(rails, repair=repair, dry_run=dry_run,
                                        skip_repair=paused, between=policy.interrupt)
    if not dry_run:
        policy.repaired(probed, ours=False)
    policy.observed(evaluator.observations)
    policy.interrupt()
    repairs = early if early is not None else Repairs()
    repairs.merge(probed)
    overrides = policy.overrides()  # the guard and flap verdicts after this pass's repairs
    full = rails is None
    facts = evaluator.observe_facts(full=full)
    policy.interrupt()
    report = evaluator.judge(repairs, overrides, facts)
    evaluator.keep_learned_pins(report)
    if repair:
        repinned = evaluator.repin(dry_run=dry_run, skip_repair=paused)
        if repinned.done or repinned.errors:
            if not dry_run:
                policy.repaired(repinned, ours=True)
            repairs.merge(repinned)
            facts = evaluator.observe_facts(full=full)
            report = evaluator.judge(repairs, overrides, facts)
            evaluator.keep_learned_pins(report)
    return report, repairs


class Evaluator:
    def __init__(self, cfg: Config, ipr: Any, persist_pins: bool = True) -> None:
        self.cfg = cfg
        self.ipr = ipr
        self.persist_pins = persist_pins
        self.rails = {r.name: r for r in cfg.rails}
        self.observations: dict[str, RailObservation] = {}
        loaded = load_pins(cfg, set_aside=persist_pins)
        self.pins = loaded.pins
        self.state_problems = loaded.problems  # reported until the pins are saved anew
        self._pins_unsaved = False  # a learned pin that did not reach the disk yet
        self.gid_table = GidTable(source="none")
        # The whole table is read only when it may have changed: at first, at resync and
        # after an overflow (everywhere), after an address or link event or a repair on a
        # rail, or when a watched slot changed (the rails' devices).
        self._gid_stale_everywhere = True
        self._gid_stale_rails = True
        self._gid_unsettled = False
        self._counters_at: float | None = None  # when the byte counters were last sampled
        self.gid_verdict: GidVerdict | None = None  # the latest, for re-pinning
        self.qps: QueuePairs | None = None  # looked at only while a GID is shifted
        self._repin_next: dict[str, float] = {}  # rail -> earliest next re-pin attempt
        self._repin_attempts: dict[str, int] = {}  # rail -> attempts while still shifted
        self.lustre: LustreObservation | None = None  # set by whoever probes the mounts
        self.device_plugin: DevicePluginObservation | None = None  # likewise, the plugin
        self.plugin_seen_ready: frozenset[str] = frozenset()  # pod UIDs once seen Ready
        self.counters: dict[str, RailCounters] = {}
        self.traffic = TrafficTracker()  # kernel vs RDMA bytes over time, per rail
        self.clock = time.monotonic
        self.timings: dict[str, float] = {}  # probe -> seconds, in the latest pass
        self._labels: dict[str, str] = {}
        self._labels_key: tuple[str, ...] | None = None
        self._labels_next = 0.0
        self.ports: dict[str, PortHealth] = {}  # with a hardware section: each rail's port
        self.error_rates = ErrorRates()
        self.custom_results: dict[str, CustomCheckResult] = {}  # by check, the latest run
        self.transport_results: dict[str, TransportResult] = {}  # by rail, the latest probe
        self.transport_skipped: dict[str, str] = {}  # rail -> why it was not probed
        self._hardware_next = 0.0
        self.reads = BoundedReads()  # driver reads off this thread, a deadline each pass
        # rail -> the RDMA device and port its GIDs were last seen on: while they are gone (a
        # table rewritten, an address away) the rail's slots stay watched and its device read.
        self.rail_seen: dict[str, tuple[str, int]] = {}

    def _observe(self, rails: Iterable[Rail]) -> None:
        rails = list(rails)
        if not rails:
            return
        keys = {r.name: sorted(self.cfg.sysctls_for(r)) for r in rails}
        started = time.perf_counter()
        self.observations.update(observe_rails(self.ipr, rails, self.cfg.paths.procfs, keys,
                                               self.reads))
        self.timings["netlink"] = time.perf_counter() - started

    def mark_gid_stale(self, everywhere: bool = False, moved: bool = False) -> None:
        """The GID table may have changed: read it again in the next pass (the rails'
        devices, or every device). `moved`: a slot changed with no event (a driver
        rewriting its table): read until two reads agree, never judge a half-written one."""
        self._gid_stale_rails = True
        self._gid_stale_everywhere = self._gid_stale_everywhere or everywhere
        self._gid_unsettled = self._gid_unsettled or moved

    def _read_gid_table(self, devices: list[str] | None) -> GidTable:
        cfg = self.cfg
        if not cfg.rails:
            return GidTable(source="none")
        table = read_gid_table(cfg.gid_source, cfg.paths.sysfs, devices, reads=self.reads)
        if self._gid_unsettled:
            self._gid_unsettled = False
            for _ in range(SETTLE_READS):
                time.sleep(SETTLE_GAP)
                again = read_gid_table(cfg.gid_source, cfg.paths.sysfs, devices,
                                       reads=self.reads)
                if again.entries == table.entries:
                    break
                table = again
        return table

    def ifindex(self, rail: str) -> int | None:
        obs = self.observations.get(rail)
        return obs.link.index if obs is not None and obs.link is not None else None

    def probe_and_repair(
        self,
        rails: Iterable[str] | None = None,
        repair: bool = False,
        dry_run: bool = False,
        skip_repair: Mapping[str, str] | None = None,
        between: Callable[[], None] | None = None,
    ) -> Repairs:
        """Probe the given rails (default all) and, when asked, repair their drift.

        `skip_repair` maps rails whose repairs are paused (ManagedElsewhere) to why.
        With `dry_run` the planned actions are returned and nothing is changed. `between`
        is called after the probe (the daemon repairs deletions that came meanwhile).
        """
        names = list(self.rails) if rails is None else [n for n in rails if n in self.rails]
        self._observe(self.rails[n] for n in names)
        out = Repairs()
        if not repair:
            return out
        if between is not None:
            between()
        for name in names:
            if (skip_repair and name in skip_repair) or not self.cfg.manages(self.rails[name]):
                continue
            drift = rail_drift(self.cfg, self.rails[name], self.observations[name])
            actions = plan_rail(self.cfg, self.rails[name], self.ifindex(name), drift)
            if not actions:
                continue
            if dry_run:
                out.done[name] = actions
                continue
            out.record(name, *execute(self.ipr, self.cfg.paths.procfs, self.rails, actions))
        if out.done and not dry_run:
            self._observe(self.rails[n] for n in out.done)
            self._after_repairs(out)
        return out

    def _after_repairs(self, repairs: Repairs) -> None:
        if any(a.kind in GID_AFFECTING for acts in repairs.done.values() for a in acts):
            self.mark_gid_stale()  # the kernel follows a changed address with its GIDs

    def repair_deletion(self, gone: Deletion, rails: Iterable[str],
                        skip_repair: Mapping[str, str] | None = None) -> Repairs:
        """Repair what one deletion event removed from the given rails, from the event alone
        (no probe first): the rail's address, a route of its table, its rule. The pass that
        follows probes and verifies the rail as usual."""
        out = Repairs()
        for name in rails:
            rail = self.rails.get(name)
            if rail is None or (skip_repair and name in skip_repair) or not self.cfg.manages(rail):
                continue
            ifindex = self.ifindex(name)
            drift = deletion_drift(rail, ifindex, gone)
            actions = plan_rail(self.cfg, rail, ifindex, drift) if drift else []
            if actions:
                out.record(name, *execute(self.ipr, self.cfg.paths.procfs, self.rails, actions))
        self._after_repairs(out)
        return out

    def repin(
        self, dry_run: bool = False, skip_repair: Mapping[str, str] | None = None,
    ) -> Repairs:
        """Re-pin the shifted rails the latest judgement allows (no QP on the port, pinned
        slot free), then repair those rails (the kernel dropped their routes with the
        address). A rail still shifted after a re-pin waits twice as long before the next
        (gid_repin_poll, doubling up to 128x): something the QP list does not show holds
        the slot, and the rail's address must not blink every few seconds. Returns what
        ran (or, with dry_run, would run); the caller judges again."""
        out = Repairs()
        verdict = self.gid_verdict
        if verdict is None:
            return out
        now = self.clock()
        for name in verdict.repin:
            rail = self.rails[name]
            actions = plan_repin(rail, self.ifindex(name), verdict.shifts[name])
            if not actions or (not dry_run and now < self._repin_next.get(name, 0.0)):
                continue
            if dry_run:
                out.done[name] = actions
                continue
            attempts = self._repin_attempts.get(name, 0)
            self._repin_attempts[name] = attempts + 1
            self._repin_next[name] = now + self.cfg.gid_repin_poll * 2 ** min(attempts, 7)
            out.record(name, *repin(self.ipr, self.cfg.paths.procfs, rail, actions,
                                    functools.partial(self._ipv4_gid_index, rail)))
        if out.done and not dry_run:
            out.merge(self.probe_and_repair(list(out.done), repair=True,
                                            skip_repair=skip_repair))
        return out

    def _ipv4_gid_index(self, rail: Rail) -> int | None:
        found = ipv4_v2_entries(rail, read_gid_table(self.cfg.gid_source, self.cfg.paths.sysfs,
                                                     reads=self.reads))
        return found[0].index if found else None

    def observe_facts(self, full: bool = True) -> list[str]:
        """Refresh what is stale besides the rails' netlink state: the GID table (see
        mark_gid_stale; unless `full`, only the devices the rails were last seen on, so a
        device no rail uses cannot cost an event-driven pass anything, not even a stuck
        read), the QPs while a GID is shifted, the byte counters (every pass that is full,
        else at most once a second) and the hardware fingerprint. Returns the problems met
        (unreadable facts), for the judgement."""
        cfg = self.cfg
        errors: list[str] = []
        everywhere = full and self._gid_stale_everywhere
        if everywhere or self._gid_stale_rails:
            devices = None if everywhere else self._rail_devices()
            # Cleared before the read: a repair made while it waits (the daemon's deletions)
            # marks the table stale again for the next pass.
            self._gid_stale_rails = False
            if devices is None:
                self._gid_stale_everywhere = False
            started = time.perf_counter()
            self.gid_table = self._read_gid_table(devices)
            self.timings["gid"] = time.perf_counter() - started
            for rail in cfg.rails:
                entries = rail_entries(rail, self.gid_table)
                if entries:
                    self.rail_seen[rail.name] = (entries[0].device, entries[0].port)
        errors.extend(map(str, self.gid_table.errors))
        self.qps = None
        if cfg.gid_repin == "auto" and gid_finding(cfg, self.gid_table, self.pins,
                                                  seen=self.rail_seen).shifts:
            started = time.perf_counter()
            # The agent's own transport probe is counted out: it never holds up a re-pin.
            self.qps = read_qps(cfg.paths.rdma).excluding(os.getpid())
            self.timings["qps"] = time.perf_counter() - started
        now = self.clock()
        if full or self._counters_at is None or now - self._counters_at >= COUNTERS_EVERY:
            self._sample_counters(errors)
            self._counters_at = now
        self._fingerprint(errors)
        if cfg.hardware is not None and (full or now >= self._hardware_next):
            self._read_ports(errors)
            self._hardware_next = now + cfg.hardware.interval
        return errors

    def transport_targets(self) -> dict[str, Target | str]:
        """What the transport probe may probe, per rail: (device, port, pinned GID index,
        address), or why not (its GID is shifted: a probe's QPs would hold the entry the
        re-pin must free; its pin or device not known yet)."""
        out: dict[str, Target | str] = {}
        shifts = self.gid_verdict.shifts if self.gid_verdict is not None else {}
        for rail in self.cfg.rails:
            pin = pin_for(rail, self.pins)
            device, port = self._rail_port(rail)
            if rail.name in shifts:
                out[rail.name] = "its GID is off its pinned index: waiting for the re-pin"
            elif pin is None:
                out[rail.name] = "no GID pin yet"
            elif (pin.device or device) is None:
                out[rail.name] = "its RDMA device is not known yet"
            else:
                out[rail.name] = Target(pin.device or device or "", pin.port or port,
                                        pin.index, rail.ip)
        return out

    def observe_transport(self, seen: TransportSeen) -> None:
        """A round of transport probes: a skipped rail forgets its last result."""
        self.transport_results.update(seen.results)
        self.transport_skipped = dict(seen.skipped)
        for rail in seen.skipped:
            self.transport_results.pop(rail, None)

    def hardware_due(self) -> float | None:
        """When the ports are to be read again (None: no hardware section)."""
        return self._hardware_next if self.cfg.hardware is not None else None

    def _read_ports(self, errors: list[str]) -> None:
        """Each rail's RDMA port, PCIe link and error counters, into the error history. A
        port that does not answer drops out (its rail's facts read Unknown)."""
        hw = self.cfg.hardware
        assert hw is not None
        started = time.perf_counter()
        calls = {}
        for rail in self.cfg.rails:
            device, port = self._rail_port(rail)
            if device is not None:
                calls[rail.name] = functools.partial(
                    read_port_health, self.cfg.paths.sysfs, device, port, list(hw.error_limits))
        ports: dict[str, PortHealth] = {}
        for name, got in zip(calls, self.reads.run(calls).values(), strict=True):
            if isinstance(got, Stuck):
                errors.append(f"{self.rails[name].label}: port {got.describe()}")
            else:
                ports[name] = got
        self.ports = ports
        self.error_rates.observe(self.clock(), hw.error_window, ports)
        self.timings["ports"] = time.perf_counter() - started

    def judge(
        self,
        repairs: Repairs | None = None,
        overrides: Mapping[str, tuple[str, str]] | None = None,
        facts: Iterable[str] = (),
    ) -> Report:
        """Findings for every rail from the latest observations, reading nothing.

        `overrides` carries the daemon's time-based verdicts (LinkFlapping,
        ManagedElsewhere) into RoCENetworkReady; `facts` the problems observe_facts met.
        """
        repairs = repairs or Repairs()
        drift = {
            n: rail_drift(self.cfg, self.rails[n], obs)
            for n, obs in self.observations.items()
            if n in self.rails
        }
        report = self._report(drift, overrides, [*repairs.errors, *facts])
        report.actions = repairs.texts()
        return report

    def keep_learned_pins(self, report: Report) -> None:
        """Pins the latest judgement learned are kept, and saved unless this is a check.
        Retried every pass until the save lands: a pin lost to a full disk would let a
        restart learn a shifted GID as the new pin."""
        verdict = self.gid_verdict
        if verdict is not None and verdict.learned:
            self.pins.update(verdict.learned)
            self._pins_unsaved = True
        if self._pins_unsaved and self.persist_pins:
            try:
                save_pins(self.cfg, self.pins)
            except OSError as exc:
                report.errors.append(f"cannot save learned GID pins in {self.cfg.state_dir} "
                                     f"(retried every pass): {describe_error(exc)}")
            else:
                self._pins_unsaved = False
                self.state_problems = []

    def _rail_port(self, rail: Rail) -> tuple[str | None, int]:
        """The RDMA device and port a rail uses: configured, else where its GIDs were last
        seen, even if they are gone now (None while they have never been seen)."""
        if rail.rdma_device:
            return rail.rdma_device, rail.rdma_port
        return self.rail_seen.get(rail.name, (None, 1))

    def watched_slots(self) -> set[tuple[str, int, int]]:
        """The GID slots worth watching between passes: each rail's pinned index and the
        index its IPv4 RoCE v2 GID was last seen at, on its device."""
        slots = set()
        for rail in self.cfg.rails:
            found = ipv4_v2_entries(rail, self.gid_table)
            if found:
                slots.add((found[0].device, found[0].port, found[0].index))
            pin = pin_for(rail, self.pins)
            device, port = self._rail_port(rail)
            if pin is not None and (pin.device or device):
                slots.add((pin.device or device or "", pin.port or port, pin.index))
            if not found and device is not None:
                # Gone: a rewritten table fills its default GID (slot 0) first, and a GID
                # that comes back lands low (the first free slot): watched until it is back.
                top = min((pin.index if pin is not None else 2) + 2, WATCH_WHILE_GONE)
                slots.update((device, port, i) for i in range(top))
        return slots

    def _rail_devices(self) -> list[str] | None:
        """The RDMA devices the rails use; None while a rail's GIDs are not in the table
        (not seen yet, or gone from where they were): then every device is read."""
        devices = set()
        for rail in self.cfg.rails:
            entries = rail_entries(rail, self.gid_table)
            if not rail.rdma_device and not entries:
                return None
            devices.add(rail.rdma_device or entries[0].device)
        return sorted(devices)

    def _report(
        self,
        drift: Mapping[str, list[Drift]],
        overrides: Mapping[str, tuple[str, str]] | None,
        errors: list[str],
    ) -> Report:
        cfg = self.cfg
        net = network_finding(cfg, drift, overrides)
        verdict = gid_finding(cfg, self.gid_table, self.pins, self.qps, self.rail_seen)
        self.gid_verdict = verdict
        for name in list(self._repin_attempts):
            if name not in verdict.shifts:
                del self._repin_attempts[name]  # back on its pin: start afresh next time
        errors.extend(self.state_problems)
        plugin = device_plugin_finding(cfg, self.device_plugin, self.plugin_seen_ready)
        parts = [net, verdict.finding, plugin, lustre_finding(cfg, self.lustre)]
        # Reported only when configured: an agent upgraded before the admission policy that
        # allows the new types still publishes everything else.
        extra, gated = [], list(parts)
        if cfg.hardware is not None:
            extra.append(hardware_finding(cfg, self.ports, self.error_rates))
            if cfg.hardware.gate:
                gated.append(extra[-1])
        if cfg.custom_checks is not None:
            extra.append(custom_finding(cfg, self.custom_results))
            if cfg.custom_checks.gate:
                gated.append(extra[-1])
        if cfg.transport is not None:
            extra.append(transport_finding(cfg, self.transport_results,
                                           self.transport_skipped, self.clock()))
            if cfg.transport.gate:
                gated.append(extra[-1])
        traffic = self._traffic()
        if cfg.fabric_traffic and cfg.fabric_traffic.gate:
            gated.append(traffic)
        findings = [*parts, fabric_finding(gated), traffic, *extra]
        rails = []
        for rail in cfg.rails:
            obs = self.observations.get(rail.name)
            pin = (
                rail.gid_index
                if rail.gid_index is not None
                else (self.pins[rail.name].index if rail.name in self.pins else None)
            )
            link = obs.link if obs else None
            rails.append(RailStatus(
                name=rail.name, interface=rail.interface,
                carrier=link.carrier if link else None, mtu=link.mtu if link else None,
                drift=tuple(d.message for d in drift.get(rail.name, [])),
                gid_index=verdict.observed.get(rail.name), gid_index_pinned=pin,
                counters=self.counters.get(rail.name), port=self.ports.get(rail.name),
                transport=self.transport_results.get(rail.name)))
        return Report(
            node=cfg.resolved_node_name(),
            findings=findings,
            errors=errors,
            gid_source=self.gid_table.source,
            rails=rails,
            labels=dict(self._labels),
        )

    def _fingerprint(self, errors: list[str]) -> None:
        """The hardware labels. Hardware does not change between an event and its repair:
        read at most once per resync interval, or when the rails' devices change. A read
        that does not return keeps the labels already known."""
        devices = tuple(sorted({c.rdma_device for c in self.counters.values()
                                if c.rdma_device}))
        now = self.clock()
        if devices != self._labels_key or now >= self._labels_next:
            netdevs = [r.interface for r in self.cfg.rails]
            seen = self.reads.one("hardware fingerprint", functools.partial(
                read_fingerprint, self.cfg.paths.sysfs, list(devices), netdevs))
            if isinstance(seen, Stuck):
                errors.append(seen.describe())
                return
            self._labels = fingerprint_labels(seen)
            self._labels_key, self._labels_next = devices, now + self.cfg.resync_interval

    def _sample_counters(self, errors: list[str]) -> None:
        """Every rail's byte counters, into the traffic history. A rail whose counters do
        not answer keeps no sample (its verdict waits)."""
        cfg = self.cfg
        started = time.perf_counter()
        calls = {}
        for rail in cfg.rails:
            device, port = self._rail_port(rail)
            calls[f"counters:{rail.name}"] = functools.partial(
                read_rail_counters, cfg.paths.sysfs, rail.interface, device, port)
        for rail, got in zip(cfg.rails, self.reads.run(calls).values(), strict=True):
            if isinstance(got, Stuck):
                errors.append(f"{rail.label}: counters {got.describe()}")
                self.counters.pop(rail.name, None)
            else:
                self.counters[rail.name] = got
        self.timings["counters"] = time.perf_counter() - started
        if cfg.fabric_traffic is not None:
            self.traffic.observe(self.clock(), cfg.fabric_traffic.window, self.counters)

    def _traffic(self) -> Finding:
        """FabricTrafficOnRDMA from the traffic history and the node's pods."""
        cfg = self.cfg
        now = self.clock()
        ft = cfg.fabric_traffic
        if ft is None:
            return traffic_finding(cfg, self.traffic, now, self.counters, None, "")
        expected: bool | None
        if ft.expect != "pods":
            expected, why = ft.expect == "always", f"fabric_traffic.expect is {ft.expect}"
        elif self.device_plugin is None or self.device_plugin.error:
            expected, why = None, ("the node's pods are not known (expect: pods needs the "
                                   "kubernetes and device_plugin sections)")
        else:
            resources = {*ft.pod_resources,
                         *([cfg.device_plugin.resource] if cfg.device_plugin else [])}
            users = fabric_consumers(self.device_plugin.node_pods, resources)
            expected = bool(users)
            why = (f"pods here request {', '.join(sorted(resources))}: "
                   f"{', '.join(users[:5])}{' ...' if len(users) > 5 else ''}" if users
                   else "no pod here requests " + ", ".join(sorted(resources)))
        return traffic_finding(cfg, self.traffic, now, self.counters, expected, why)

