"""One pass: probes -> checks -> remedies -> (re-probe) -> findings.

Shared by `check`, `apply` and the daemon. The Evaluator keeps what must survive between
passes (the latest observation of every rail, the learned pins) so the daemon can re-probe
just the rail an event touched and still report on all of them.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from nodeagent.checks.cabling import heard_now
from nodeagent.checks.conditions import judge_pass
from nodeagent.checks.dra import rail_devices
from nodeagent.checks.facts import (
    ClaimsSeen,
    CountersSeen,
    Facts,
    FingerprintSeen,
    LLDPSeen,
    PeersSeen,
    PortsSeen,
    SlicesSeen,
)
from nodeagent.checks.gid import (
    GidVerdict,
    gid_finding,
    gid_verdict,
    ipv4_v2_entries,
    pin_for,
    rail_entries,
)
from nodeagent.checks.hardware import fingerprint_labels
from nodeagent.checks.network import deletion_drift, rail_drift
from nodeagent.config import Config, Rail
from nodeagent.io.bounded import BoundedReads, Stuck
from nodeagent.io.files import descriptor_faults
from nodeagent.model.conditions import ROCE_NETWORK_READY
from nodeagent.model.kube import Lending, label_value
from nodeagent.model.network import GID_AFFECTING, Deletion
from nodeagent.model.peers import RailEndpoint, Targets
from nodeagent.model.rdma import GidTable, Pin, PortHealth
from nodeagent.model.status import RailLent, RailStatus, RailTimeline, Report
from nodeagent.probes.counters import read_rail_counters
from nodeagent.probes.gid import read_gid_table
from nodeagent.probes.hardware import read_fingerprint
from nodeagent.probes.netlink import observe_rails
from nodeagent.probes.port import read_port_health
from nodeagent.probes.qp import read_qps
from nodeagent.remedies.gid import plan_repin, repin
from nodeagent.remedies.network import execute, plan_rail
from nodeagent.remedies.repairs import Repairs
from nodeagent.run.rails import RailIndex
from nodeagent.run.store import FactStore, PinKeeper, RepinSchedule
from nodeagent.run.work import Aim

log = logging.getLogger(__name__)

COUNTERS_EVERY = 1.0  # seconds: event-driven passes in a burst share one counter sample
# A GID table that changed with no event is read again (SETTLE_GAP apart, at most
# SETTLE_READS more times) until two reads agree: a driver rewriting its table in place is
# never judged half-way (a transient verdict published for a state that never was).
SETTLE_READS = 5
SETTLE_GAP = 0.02
WATCH_WHILE_GONE = 16  # at most this many low slots watched for a rail whose GIDs are gone


Hook = Callable[[], None]


def _nothing() -> None:
    pass


def fabric_pass(
    evaluator: Evaluator,
    rails: Iterable[str] | None = None,
    *,
    repair: bool,
    dry_run: bool = False,
    early: Repairs | None = None,
    interrupt: Hook | None = None,
) -> tuple[Report, Repairs]:
    """The one pass `check`, `apply` and the daemon all run: probe the rails (default all;
    an empty set probes none) -> repair their drift (a rail the repair guard paused
    excepted) -> re-probe what was repaired -> refresh the facts that are stale (GID table,
    counters, fingerprint) -> judge (pure) -> keep learned pins -> re-pin a shifted GID
    that nothing uses -> re-observe -> judge again.

    `early` holds what was repaired before the pass (from events, remounts): it is reported
    with the rest. `interrupt` is the pass's one call out: between its stages, and while it
    waits on a read, the daemon repairs deletions that arrived meanwhile. The report is
    complete when it returns (a pass that ran out of descriptors keeps the last complete
    pass's conditions). Returns the report and every repair it reports."""
    faults = descriptor_faults()
    evaluator.reads.while_waiting = interrupt  # reads off-thread: the wait is idle
    try:
        with _collector_after():
            report, repairs = _fabric_pass(evaluator, rails, repair, dry_run, early,
                                           interrupt or _nothing)
    finally:
        evaluator.reads.while_waiting = None
    evaluator.keep_verdict(report, faulted=descriptor_faults() != faults)
    return report, repairs


@contextlib.contextmanager
def _collector_after() -> Iterator[None]:
    """The cyclic collector held off until the pass is over. A pass makes a few thousand
    short-lived containers (netlink messages, typed values) that reference counting frees
    when it ends; a collection in the middle found them all alive, scanned them and
    promoted them, so the next older generation's collections scanned them again (up to
    5-10 ms inside a 20 ms pass: bench/check_pass.py). After the pass the young
    generation holds only what lives on, and collections go on as before."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _fabric_pass(evaluator: Evaluator, rails: Iterable[str] | None, repair: bool,
                 dry_run: bool, early: Repairs | None,
                 interrupt: Hook) -> tuple[Report, Repairs]:
    paused = evaluator.paused()
    probed = evaluator.probe_and_repair(rails, repair=repair, dry_run=dry_run,
                                        skip_repair=paused, between=interrupt)
    if not dry_run:
        evaluator.count(probed)
    evaluator.observed()
    interrupt()
    repairs = early if early is not None else Repairs()
    repairs.merge(probed)
    full = rails is None
    unreadable = evaluator.observe_facts(full=full)
    interrupt()
    report = evaluator.judge(repairs, unreadable)
    evaluator.keep_learned_pins(report)
    if repair:
        repinned = evaluator.repin(dry_run=dry_run, skip_repair=paused)
        if repinned.done or repinned.errors:
            if not dry_run:  # a re-pin undoes the agent's own doing: not a fight
                evaluator.count(repinned, guard=False)
            repairs.merge(repinned)
            unreadable = evaluator.observe_facts(full=full)
            report = evaluator.judge(repairs, unreadable)
            evaluator.keep_learned_pins(report)
    return report, repairs


@dataclass
class Due:
    """When each fact besides the rails' netlink state is to be read again. The rails' GID
    tables are read only when they may have changed: at first, at resync and after an
    overflow, after an address or link event or a repair on a rail, or when a watched slot
    changed."""

    gid_rails: bool = True
    gid_unsettled: bool = False  # changed with no event: read until two reads agree
    counters_at: float | None = None  # when the byte counters were last sampled
    labels_key: tuple[str, ...] | None = None  # the devices the fingerprint was read for
    labels_at: float = 0.0  # the fingerprint's next read
    hardware_at: float = 0.0  # the ports' next read


class Evaluator:
    """One config's passes over the facts in `store` (which outlives it: a reload makes a
    new Evaluator on the same store)."""

    def __init__(self, cfg: Config, ipr: Any, persist_pins: bool = True,
                 store: FactStore | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.ipr = ipr
        self.rails = {r.name: r for r in cfg.rails}
        self.index = RailIndex(cfg)  # which rail a kernel message is about
        self.store = store or FactStore()
        self.keeper = PinKeeper(cfg, persist_pins)
        self.repins = RepinSchedule()
        self.due = Due()
        self.clock = clock
        self.timings: dict[str, float] = {}  # probe -> seconds, in the latest pass
        self.gid_verdict: GidVerdict | None = None  # the latest, for re-pinning

    @property
    def reads(self) -> BoundedReads:
        return self.store.reads

    @property
    def pins(self) -> dict[str, Pin]:
        return self.keeper.pins

    def _observe(self, rails: Iterable[Rail]) -> None:
        rails = list(rails)
        if not rails:
            return
        keys = {r.name: sorted(self.cfg.sysctls_for(r)) for r in rails}
        store = self.store
        had = {r.name for r in rails
               if (seen := store.observations.get(r.name)) is not None and seen.link is not None}
        started = time.perf_counter()
        store.observations.update(observe_rails(self.ipr, rails, self.cfg.paths.procfs,
                                                keys, self.reads))
        self.timings["netlink"] = time.perf_counter() - started
        now = self.clock()
        for rail in rails:
            if store.observations[rail.name].link is not None:
                # here again (its return's event may have been missed): not lent
                store.lent.pop(rail.name, None)
                store.leaving.seen(rail.name)
            elif rail.name in had and rail.name not in store.lent:
                store.leaving.vanished(rail.name, now)

    def mark_gid_stale(self, moved: bool = False) -> None:
        """The rails' GID tables may have changed: read them again in the next pass.
        `moved`: a slot changed with no event (a driver rewriting its table): read until two
        reads agree, never judge a half-written one."""
        self.due.gid_rails = True
        self.due.gid_unsettled = self.due.gid_unsettled or moved

    def _read_gid_table(self, devices: list[str] | None) -> GidTable:
        cfg = self.cfg
        if not cfg.rails:
            return GidTable(source="none")
        table = read_gid_table(cfg.gid_source, cfg.paths.sysfs, devices, reads=self.reads)
        if self.due.gid_unsettled:
            self.due.gid_unsettled = False
            for _ in range(SETTLE_READS):
                time.sleep(SETTLE_GAP)
                again = read_gid_table(cfg.gid_source, cfg.paths.sysfs, devices,
                                       reads=self.reads)
                if again.entries == table.entries:
                    break
                table = again
        return table

    def ifindex(self, rail: str) -> int | None:
        obs = self.store.observations.get(rail)
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
            if (skip_repair and name in skip_repair) or not self.cfg.manages(self.rails[name]) \
                    or name in self.store.lent:
                continue
            drift = rail_drift(self.cfg, self.rails[name], self.store.observations[name])
            actions = plan_rail(self.cfg, self.rails[name], self.ifindex(name), drift)
            if not actions:
                continue
            if dry_run:
                out.done[name] = actions
                continue
            out.record(name, *execute(self.ipr, self.cfg.paths.procfs, self.rails, actions))
        if out.done and not dry_run:
            self._observe(self.rails[n] for n in out.done)
            self.after_repairs(out)
        return out

    def after_repairs(self, repairs: Repairs) -> None:
        if any(a.kind in GID_AFFECTING for acts in repairs.done.values() for a in acts):
            self.mark_gid_stale()  # the kernel follows a changed address with its GIDs

    def repair_deletion(self, gone: Deletion, rails: Iterable[str]) -> Repairs:
        """Repair what one deletion event removed from the given rails, from the event alone
        (no probe first): the rail's address, a route of its table, its rule; a rail the
        repair guard paused excepted. Counted like any repair. The pass that follows probes
        and verifies the rail as usual."""
        out = Repairs()
        paused = self.paused()
        for name in rails:
            rail = self.rails.get(name)
            if rail is None or name in paused or not self.cfg.manages(rail) \
                    or name in self.store.lent:
                continue
            ifindex = self.ifindex(name)
            drift = deletion_drift(rail, ifindex, gone)
            actions = plan_rail(self.cfg, rail, ifindex, drift) if drift else []
            if actions:
                out.record(name, *execute(self.ipr, self.cfg.paths.procfs, self.rails, actions))
        self.after_repairs(out)
        self.count(out)
        return out

    # ------------------------------------------------------------ what only time shows
    # The daemon's rail history (flap trackers, repair guard, repair counts) lives in the
    # store; a one-shot command has none, so these do nothing there.

    def paused(self) -> dict[str, str]:
        """Rails whose repairs the guard paused (ManagedElsewhere), with why."""
        history = self.store.history
        return history.overrides(self.clock())[0] if history is not None else {}

    def count(self, repairs: Repairs, guard: bool = True) -> None:
        """Repairs that ran, counted (and, unless they undo the agent's own doing, fed to
        the repair guard)."""
        history = self.store.history
        if history is None:
            return
        now = self.clock()
        for name, actions in repairs.done.items():
            rail = self.rails.get(name)
            history.count(now, name, rail.label if rail else name,
                          [a.kind for a in actions], guard=guard)

    def observed(self) -> None:
        """The rails as just probed, to the flap trackers."""
        if self.store.history is not None:
            self.store.history.observed(self.clock(), self.store.observations)

    def keep_verdict(self, report: Report, faulted: bool) -> None:
        """Out of descriptors during the pass: reads failed for the agent's sake, not the
        fabric's. Its repairs stand; its verdict does not replace the last complete one."""
        last = self.store.last_findings
        if faulted and last is not None:
            log.error("out of file descriptors during a pass: keeping the last verdict")
            report.findings = list(last)
            report.errors.append("agent fault: out of file descriptors (EMFILE); the "
                                 "conditions are those of the last complete pass")
        self.store.last_findings = tuple(report.findings)

    def repin(
        self, dry_run: bool = False, skip_repair: Mapping[str, str] | None = None,
    ) -> Repairs:
        """Re-pin the shifted rails the latest judgement allows (no QP on the port, pinned
        slot free), when their schedule allows, then repair those rails (the kernel dropped
        their routes with the address). Returns what ran (or, with dry_run, would run);
        the caller judges again."""
        out = Repairs()
        verdict = self.gid_verdict
        if verdict is None:
            return out
        now = self.clock()
        for name in verdict.repin:
            rail = self.rails[name]
            actions = plan_repin(rail, self.ifindex(name), verdict.shifts[name])
            if not actions or (not dry_run and not self.repins.due(name, now)):
                continue
            if dry_run:
                out.done[name] = actions
                continue
            self.repins.attempted(name, now, self.cfg.gid_repin_poll)
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
        mark_gid_stale; only the devices the rails were last seen on, so a device no rail
        uses (a VF, a storage HCA) costs no pass anything, not even a stuck read; every
        device while a rail's GIDs are not found), the QPs while a GID is shifted, the byte
        counters (every pass that is full, else at most once a second) and the hardware
        fingerprint. Returns the problems met (unreadable facts), for the judgement."""
        cfg, store, due = self.cfg, self.store, self.due
        errors: list[str] = []
        if due.gid_rails:
            # Cleared before the read: a repair made while it waits (the daemon's deletions)
            # marks the table stale again for the next pass.
            due.gid_rails = False
            started = time.perf_counter()
            devices = self._rail_devices()
            store.gid_table = self._read_gid_table(devices)
            if devices is not None and self._rail_devices() is None:
                # A rail's GIDs left its device: look for them on every device now, not
                # at the next resync.
                store.gid_table = self._read_gid_table(None)
            self.timings["gid"] = time.perf_counter() - started
            for rail in cfg.rails:
                entries = rail_entries(rail, store.gid_table)
                if entries:
                    store.rail_seen[rail.name] = (entries[0].device, entries[0].port)
        errors.extend(map(str, store.gid_table.errors))
        store.qps = None
        if cfg.gid_repin == "auto" and gid_finding(cfg, store.gid_table, self.pins,
                                                  seen=store.rail_seen).shifts:
            started = time.perf_counter()
            # The agent's own transport probe is counted out: it never holds up a re-pin.
            store.qps = read_qps(cfg.paths.rdma).excluding(os.getpid())
            self.timings["qps"] = time.perf_counter() - started
        now = self.clock()
        if full or due.counters_at is None or now - due.counters_at >= COUNTERS_EVERY:
            self._sample_counters(errors)
            due.counters_at = now
        self._fingerprint(errors)
        if cfg.hardware is not None and (full or now >= due.hardware_at):
            self._read_ports(errors)
            due.hardware_at = now + cfg.hardware.interval
        peers = store.get(PeersSeen)
        if peers is not None and cfg.peers is not None:
            errors.extend(f"peer responder, {rail}: {why} (its peers cannot probe this node)"
                          for rail, why in sorted(peers.not_listening.items()))
        return errors

    def transport_targets(self) -> Targets:
        """What the transport probe may probe, per rail: (device, port, pinned GID index,
        address), or why not (its GID is shifted: a probe's QPs would hold the entry the
        re-pin must free; its pin or device not known yet)."""
        ready: dict[str, RailEndpoint] = {}
        skipped: dict[str, str] = {}
        shifts = self.gid_verdict.shifts if self.gid_verdict is not None else {}
        for rail in self.cfg.rails:
            if rail.name in self.store.lent:
                continue  # not here to probe (nor to answer on)
            pin = pin_for(rail, self.pins)
            device, port = self._rail_port(rail)
            if rail.name in shifts:
                skipped[rail.name] = "its GID is off its pinned index: waiting for the re-pin"
            elif pin is None:
                skipped[rail.name] = "no GID pin yet"
            elif (pin.device or device) is None:
                skipped[rail.name] = "its RDMA device is not known yet"
            else:
                ready[rail.name] = RailEndpoint(pin.device or device or "", pin.port or port,
                                          pin.index, rail.ip)
        lldp = self.store.get(LLDPSeen)
        heard = heard_now(lldp.heard, self.clock()) if lldp is not None else {}
        switches = {r: name for r, n in heard.items() if (name := label_value(n.switch))}
        return Targets(ready, skipped, switches)

    def aim(self) -> Aim:
        """What the sources are to look at after this pass."""
        return Aim(self.transport_targets(), frozenset(self.watched_slots()))

    def hardware_due(self) -> float | None:
        """When the ports are to be read again (None: no hardware section)."""
        return self.due.hardware_at if self.cfg.hardware is not None else None

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
        self.store.deliver(PortsSeen(ports, self.clock(), hw.error_window))
        self.timings["ports"] = time.perf_counter() - started

    def facts(self, overdue: Mapping[str, str] | None = None) -> Facts:
        """This pass's facts, frozen for the judgement (the rails' time-based verdicts and
        figures as the history has them now: after this pass's repairs). `overdue`: the
        lent rails not back in time, as judge() found them for this pass."""
        store = self.store
        now = self.clock()
        timelines = store.history.timelines(now) if store.history is not None else {}
        for rail, why in (overdue or {}).items():  # outranks what else it shows
            timelines[rail] = replace(timelines.get(rail, RailTimeline()),
                                      verdict=("LentRailNotReturned", f"{self.rails[rail].label}"
                                               f" lent to a pod: {why}"))
        return Facts(
            timelines=timelines,
            now=now, gid_table=store.gid_table, qps=store.qps,
            rail_seen=dict(store.rail_seen),
            observations={n: o for n, o in store.observations.items() if n in self.rails},
            pins=dict(self.pins),
            seen=dict(store.seen))

    def judge(self, repairs: Repairs | None = None, unreadable: Iterable[str] = ()) -> Report:
        """The report from the latest observations, reading nothing; the GID verdict is
        kept for the re-pin and the transport probe. `unreadable`: the problems
        observe_facts met."""
        repairs = repairs or Repairs()
        self._account_lent()
        # Read once: a rail crossing its bound between three reads was judged without its
        # verdict (InterfaceMissing for a pass) or left out of both the judgement and the
        # lent rows.
        now = self.clock()
        overdue = self._lent_overdue(now)
        judged = self.facts(overdue)
        leaving = self.store.leaving.waiting(now)
        cfg = self.judged_config(overdue, leaving)
        report = judge_pass(cfg, judged, [*repairs.errors, *unreadable, *self.keeper.problems],
                            repairs.texts())
        self._say_lent(report, overdue)
        self._say_leaving(report, leaving)
        self.gid_verdict = judged.derive(gid_verdict, cfg)  # the judge's, not again
        self.repins.settled(self.gid_verdict.shifts)
        return report

    def _account_lent(self) -> None:
        """Who holds each lent rail (with a dra section: the claims on this node)."""
        lent = self.store.lent
        if lent or lent.holders:
            slices, claims = self.store.get(SlicesSeen), self.store.get(ClaimsSeen)
            lent.account(rail_devices(self.cfg, slices.observation if slices else None),
                         claims.observation if claims else None, self.clock())

    def _lent_overdue(self, now: float) -> dict[str, str]:
        """The lent rails not back within dra.return_within of their pod's end: judged
        again, and failed."""
        dra = self.cfg.dra
        return self.store.lent.overdue(now, dra.return_within) if dra is not None else {}

    def judged_config(self, overdue: Mapping[str, str], leaving: Iterable[str]) -> Config:
        """The config a pass judges: without the rails lent to another network namespace
        (a pod's), which are not missing: no drift, no GID verdict, no probe, no repair.
        One not back in time after its pod ended (`overdue`) is judged (and fails).
        `leaving`: rails whose netdev just vanished, where to not yet said (LeavingRails)."""
        excused = (set(self.store.lent) - set(overdue)) | set(leaving)
        if not excused:
            return self.cfg
        return self.cfg.model_copy(update={"rails": [
            r for r in self.cfg.rails if r.name not in excused]})

    def _say_lent(self, report: Report, overdue: Mapping[str, str]) -> None:
        """Each lent rail in the status (its own row) and in RoCENetworkReady's message,
        with its holder where the claims name it (an overdue one is judged instead)."""
        now, store = self.clock(), self.store.lent
        lent = [(r, now - store[r.name], store.holders.get(r.name)) for r in self.cfg.rails
                if r.name in store and r.name not in overdue]
        if not lent:
            return
        report.rails.extend(RailStatus(r.name, r.interface,
                                       lent=RailLent(age, str(held) if held else None))
                            for r, age, held in lent)
        words = "; ".join(self._lent_words(r, age, held, now) for r, age, held in lent)
        report.findings = [replace(f, message=f"{f.message}; {words}" if f.message else words)
                           if f.type == ROCE_NETWORK_READY else f for f in report.findings]

    def _say_leaving(self, report: Report, leaving: Iterable[str]) -> None:
        """A rail whose netdev just vanished keeps its row (its name and interface, nothing
        judged) while the kernel's word is awaited: a reader of the status file (preflight,
        `status`) never finds a configured rail gone from it for those milliseconds."""
        shown = {r.name for r in report.rails}
        report.rails.extend(RailStatus(r.name, r.interface) for r in self.cfg.rails
                            if r.name in leaving and r.name not in shown)

    def _lent_words(self, rail: Rail, age: float, held: Lending | None, now: float) -> str:
        if held is None:
            return (f"{rail.label} lent to another network namespace {age:.0f} s ago (a "
                    "pod's: not checked or repaired until it returns)")
        ended = self.store.lent.ended.get(rail.name)
        after = "" if ended is None else f"; its pod ended {now - ended:.0f} s ago"
        return (f"{rail.label} lent to {held} {age:.0f} s ago (not checked or repaired "
                f"until it returns{after})")

    def keep_learned_pins(self, report: Report) -> None:
        """Pins the latest judgement learned are kept, and saved unless this is a check.
        Retried every pass until the save lands."""
        failed = self.keeper.keep(self.gid_verdict)
        if failed:
            report.errors.append(failed)

    def _rail_port(self, rail: Rail) -> tuple[str | None, int]:
        """The RDMA device and port a rail uses: configured, else where its GIDs were last
        seen, even if they are gone now (None while they have never been seen)."""
        if rail.rdma_device:
            return rail.rdma_device, rail.rdma_port
        return self.store.rail_seen.get(rail.name, (None, 1))

    def watched_slots(self) -> set[tuple[str, int, int]]:
        """The GID slots worth watching between passes: each rail's pinned index and the
        index its IPv4 RoCE v2 GID was last seen at, on its device."""
        slots = set()
        for rail in self.cfg.rails:
            found = ipv4_v2_entries(rail, self.store.gid_table)
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
            entries = rail_entries(rail, self.store.gid_table)
            if not rail.rdma_device and not entries:
                return None
            devices.add(rail.rdma_device or entries[0].device)
        return sorted(devices)

    def _fingerprint(self, errors: list[str]) -> None:
        """The hardware labels. Hardware does not change between an event and its repair:
        read at most once per resync interval, or when the rails' devices change. A read
        that does not return keeps the labels already known."""
        counted = self.store.get(CountersSeen)
        devices = tuple(sorted({c.rdma_device for c in (counted.counters.values() if counted
                                                        else ()) if c.rdma_device}))
        now = self.clock()
        if devices != self.due.labels_key or now >= self.due.labels_at:
            netdevs = [r.interface for r in self.cfg.rails]
            seen = self.reads.one("hardware fingerprint", functools.partial(
                read_fingerprint, self.cfg.paths.sysfs, list(devices), netdevs))
            if isinstance(seen, Stuck):
                errors.append(seen.describe())
                return
            self.store.deliver(FingerprintSeen(fingerprint_labels(seen)))
            self.due.labels_key, self.due.labels_at = devices, now + self.cfg.resync_interval

    def _sample_counters(self, errors: list[str]) -> None:
        """Every rail's byte counters, into the traffic history. A rail whose counters do
        not answer keeps no sample (its verdict waits)."""
        cfg, store = self.cfg, self.store
        started = time.perf_counter()
        calls = {}
        for rail in cfg.rails:
            device, port = self._rail_port(rail)
            calls[f"counters:{rail.name}"] = functools.partial(
                read_rail_counters, cfg.paths.sysfs, rail.interface, device, port)
        counters = {}
        for rail, got in zip(cfg.rails, self.reads.run(calls).values(), strict=True):
            if isinstance(got, Stuck):
                errors.append(f"{rail.label}: counters {got.describe()}")
            else:
                total, largest = store.own_rdma.so_far(rail.name)
                counters[rail.name] = replace(got, own_rdma=total, own_rdma_largest=largest)
        self.timings["counters"] = time.perf_counter() - started
        window = cfg.fabric_traffic.window if cfg.fabric_traffic is not None else None
        store.deliver(CountersSeen(counters, self.clock(), window))
