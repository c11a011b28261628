"""The Kubernetes side of the daemon, on its own thread.

The local loop hands over each pass's Status and never waits: a slow or dead API server
cannot delay a repair. The publisher keeps only the newest Status (so it never writes a
stale state over a newer one), writes what changed, and retries with backoff while the API
is unreachable; once it answers, the newest desired state is written, nothing lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nodeagent.config import DeviceTaints, Kubernetes
from nodeagent.io.alarm import Alarm
from nodeagent.kube.backoff import Backoff
from nodeagent.kube.nodeview import read_node
from nodeagent.kube.peercard import lease_metadata
from nodeagent.model.conditions import FABRIC_READY, Finding
from nodeagent.model.kube import RailsAside
from nodeagent.model.status import PublisherState, Status
from nodeagent.publish.device_taints import RailGate, RailTaints
from nodeagent.publish.node import (
    STARTING,
    Changed,
    TaintGate,
    condition_updates,
    spec_changes,
    taint_value,
)

if TYPE_CHECKING:  # the kubernetes client is imported only when a kubernetes section exists
    from nodeagent.kube.watch import WatchedCollection
    from nodeagent.publish.kube import NodeWriter

log = logging.getLogger(__name__)

# A changed peer card or mesh verdict is written with an early Lease renewal, at most this
# often (seconds); otherwise it waits for the next renewal (lease_period).
MESH_GAP = 10.0
RULES_RETRY = 10.0  # seconds before device taint rules that failed to sync are tried again


@dataclass
class PublishState:
    """What the status file says about the Kubernetes side."""

    synced: bool = False
    last_error: str | None = None
    tainted: bool = True
    taint_reason: str = STARTING


@dataclass
class _Due:
    """When the publisher's timed writes are next due (monotonic seconds)."""

    lease: float = 0.0  # the Lease renewed
    card: float = 0.0  # a changed peer card or mesh may be written early (MESH_GAP apart)
    reconcile: float = 0.0  # the Node re-read while no watch serves it
    heartbeat: float = 0.0  # the conditions' lastHeartbeatTime refreshed
    rules: float = 0.0  # the device taint rules listed again (or retried after a failure)


@dataclass
class _Written:
    """What the publisher last wrote to the Node."""

    key: tuple[Any, ...] | None = None  # findings, taint and labels
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)  # type -> status, reason
    lease_meta: tuple[dict[str, str], dict[str, str]] = ({}, {})  # labels, annotations


class _NodeLink:
    """The API side, made at the first round: the Node writer, and one watch of the
    agent's own Node (list, then watch from its resourceVersion, bookmarks, a new list on
    410): every change by anyone is compared with the verdict at once, and steady state
    costs no request beyond the watch itself."""

    def __init__(self, factory: Callable[[], NodeWriter], wake: Callable[[], None]) -> None:
        self._factory = factory
        self._wake = wake
        self.writer: NodeWriter | None = None
        self.watch: WatchedCollection | None = None
        self.dirty = False  # the watch saw a change not yet compared

    def connect(self) -> NodeWriter:
        if self.writer is None:
            from nodeagent.kube.watch import WatchedCollection

            self.writer = writer = self._factory()
            self.watch = WatchedCollection(
                writer.api, writer.counters, "/api/v1/nodes",
                [("fieldSelector", f"metadata.name={writer.node}")], self._changed)
            self.watch.start()
        return self.writer

    def _changed(self) -> None:
        self.dirty = True
        self._wake()

    def take_dirty(self) -> bool:
        """Cleared before the snapshot is taken: a change the watch brings in meanwhile
        sets it again and wakes the next round, never lost."""
        dirty, self.dirty = self.dirty, False
        return dirty

    def watched(self) -> dict[str, Any] | None:
        """The Node as the watch has it now; None while the watch is not synced or
        failing (then the publisher reads the Node itself)."""
        watch = self.watch
        if watch is None or not watch.synced.is_set():
            return None
        items, error = watch.snapshot()
        return items[0] if items and not error else None

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()


class Publisher(threading.Thread):
    mesh_gap = MESH_GAP  # seconds between early Lease writes of a changed card or mesh

    def __init__(
        self,
        cfg: Kubernetes,
        writer_factory: Callable[[], NodeWriter],
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] | None = None,
        device_taints: DeviceTaints | None = None,
    ) -> None:
        super().__init__(name="kube-publisher", daemon=True)
        self.cfg = cfg
        self._on_change = on_change  # the status file shows the Kubernetes side too
        self._alarm = Alarm()  # new findings, a changed Node, stop
        self._link = _NodeLink(writer_factory, self._alarm.wake)
        self.clock = clock
        self.gate = TaintGate(cfg.clear_after)
        # With dra.device_taints: one bad rail gated by its device's rule, not the node.
        self.rail_taints = (RailTaints(device_taints, RailGate(cfg.clear_after))
                            if device_taints is not None else None)
        self.state = PublishState(tainted=cfg.taint is not None)  # conditions only: never
        self._lock = threading.Lock()
        self._latest: Status | None = None
        self._written = _Written()
        self._due = _Due()

    @property
    def writer(self) -> NodeWriter | None:
        return self._link.writer

    @property
    def node_watch(self) -> WatchedCollection | None:
        """The agent's own Node, watched (the device plugin's reader uses it too)."""
        return self._link.watch

    # ------------------------------------------------------------ API for the local loop

    def submit(self, report: Status) -> None:
        with self._lock:
            self._latest = report
            # The gate sees every pass, even ones the writer never gets to (API slow or
            # down): a failure between two writes still restarts the clear_after dwell.
            now = self.clock()
            self.gate.feed(now, self._node_finding(now, report))
        self._alarm.wake()

    def _node_finding(self, now: float, report: Status) -> Finding:
        """What the node's taint follows: FabricReady, unless its fault is one rail's and
        that rail's device is gated instead."""
        fabric = _fabric(report)
        if self.rail_taints is None:
            return fabric
        return self.rail_taints.gate.feed(now, fabric, report.report.rails)

    def stop(self, timeout: float = 5.0) -> None:
        self._alarm.halt()
        self.join(timeout)
        self._link.stop()

    # ------------------------------------------------------------ the thread

    def run(self) -> None:
        backoff = Backoff()
        retry_in: float | None = None  # after a failed round: the jittered wait
        while not self._alarm.halted:
            now = self.clock()
            deadlines = [self._due.lease]
            if self._written.key is not None:
                deadlines.append(self._due.heartbeat)
            if self._link.watched() is None:  # only then is the Node re-read on a timer
                deadlines.append(self._due.reconcile)
            lift = self.gate.lifts_at()
            if lift is not None:
                deadlines.append(lift)
            if self.rail_taints is not None:
                deadlines.append(self._due.rules)
                lift = self.rail_taints.gate.lifts_at()
                if lift is not None:
                    deadlines.append(lift)
            if self._lease_meta() != self._written.lease_meta:
                deadlines.append(self._due.card)
            wait = retry_in if retry_in is not None else max(0.0, min(deadlines) - now)
            self._alarm.wait(wait)
            self._alarm.clear()
            if self._alarm.halted:
                break
            try:
                self.sync_once()
            except Exception as exc:  # API down, timeouts, 403: keep the newest state, retry
                self.state.synced = False
                self.state.last_error = describe_error(exc)
                retry_in = backoff.next()
                log.warning("kubernetes publish failed (retry in %.1fs): %s", retry_in,
                            self.state.last_error)
                if self.writer is not None:
                    self.writer.counters.errors += 1
            else:
                backoff.reset()
                retry_in = None

    def sync_once(self) -> None:
        """One round: newest findings -> conditions, taint/cordon, Events, Lease."""
        before = self.status()
        try:
            self._sync_once()
        finally:
            if self._on_change is not None and self.status_key() != _key(before):
                self._on_change()

    def status_key(self) -> tuple[Any, ...]:
        return _key(self.status())

    def _sync_once(self) -> None:
        now = self.clock()
        with self._lock:
            report = self._latest
        writer = self._link.connect()
        if report is not None:
            with self._lock:  # the newest report still holds now: the dwell may be over
                before = self.gate.tainted
                tainted = self.gate.feed(now, self._node_finding(now, report))
                want = (tainted, self.gate.reason)
            dirty = self._link.take_dirty()
            watched = self._link.watched()
            # Without a working watch, the Node is re-read every reconcile_interval.
            reconcile = watched is None and now >= self._due.reconcile
            # The local loop resubmits an unchanged report every resync: that costs nothing
            # here. A change, the periodic reconcile, or anyone's edit of the Node that
            # leaves it off the verdict (seen by the watch) writes the Node.
            key = (tuple((f.type, f.status, f.reason, f.message) for f in report.findings),
                   want, tuple(sorted(report.labels.items())))
            # Before the agent's first write the Node lacks its verdict by no one's doing.
            foreign = (dirty and watched is not None and self._written.key is not None
                       and self._drifted(watched, report, tainted))
            beat = self._written.key is not None and now >= self._due.heartbeat
            if reconcile or foreign or beat or key != self._written.key or tainted != before:
                if foreign:
                    log.info("node %s: changed by another writer; putting back the agent's "
                             "taint, cordon, conditions and labels", writer.node)
                self._sync_node(report, tainted, watched)
                self._written.key = key
                if reconcile:
                    self._due.reconcile = now + self.cfg.reconcile_interval
            if self.rail_taints is not None:
                self._sync_rules(writer, now)
        meta = self._lease_meta()
        early = meta != self._written.lease_meta and now >= self._due.card
        if now >= self._due.lease or early:
            writer.renew_lease(*meta)
            self._written.lease_meta = meta
            self._due.lease = now + self.cfg.lease_period
            self._due.card = now + self.mesh_gap
        self.state.synced = True
        self.state.last_error = None

    def _sync_rules(self, writer: NodeWriter, now: float) -> None:
        """The device taint rules, when what is wanted changed or at the reconcile period
        (someone may have deleted one). A failure here is said in the status file and
        retried; it never holds up the Node's own conditions and taint."""
        rules = self.rail_taints
        assert rules is not None
        if not rules.due(now, self._due.rules):
            return
        try:
            changes = rules.sync(writer.api, writer.counters, writer.node)
        except Exception as exc:  # API down, 403, the API not served: retried
            rules.error = describe_error(exc)
            self._due.rules = now + RULES_RETRY
            log.warning("device taints: %s (retry in %.0fs)", rules.error, RULES_RETRY)
            return
        self._due.rules = now + self.cfg.reconcile_interval
        for change in changes:
            log.info("node %s: %s", writer.node, change)
            writer.event(None, "DeviceTaint", change.text, not change.lifted)

    def _lease_meta(self) -> tuple[dict[str, str], dict[str, str]]:
        """The Lease's labels and annotations for the newest report: the peer card, the
        probes' verdicts and the rails set aside, written when they change (MESH_GAP apart
        at most)."""
        with self._lock:
            report = self._latest
        if report is None:
            return self._written.lease_meta
        rails = report.report.rails
        taints = self.rail_taints
        aside = RailsAside(
            lent={r.name: r.lent.to or "another network namespace" for r in rails
                  if r.lent is not None},
            tainted={t.rail: t.reason for t in (taints.writer.written or ())}
            if taints is not None and taints.writer is not None else {})
        return lease_metadata(report.peer_card, rails, aside)

    def _drifted(self, node: dict[str, Any], report: Status, tainted: bool) -> bool:
        """Whether the Node says something other than the agent's verdict: its taint,
        cordon, conditions or labels (never the echo of the agent's own write)."""
        writer = self.writer
        assert writer is not None
        view = read_node(node)
        if view.resource_version in writer.own_versions:
            return False
        value = taint_value(self.gate.reason) if tainted else None
        taint = self.cfg.taint
        if spec_changes(view, (taint.key, taint.effect) if taint else None, value,
                        self.cfg.cordon, tainted, self.gate.reason, report.labels):
            return True
        return bool(condition_updates(view.conditions, report.findings, time.time(),
                                      report.since))

    def _sync_node(self, report: Status, tainted: bool,
                   node: dict[str, Any] | None = None) -> None:
        writer = self.writer
        assert writer is not None
        node = node if node is not None else writer.read_node()
        view = read_node(node)
        uid, existing = view.uid or None, view.conditions
        if not self._written.conditions:  # a restart: what the Node already says is not news
            self._written.conditions = {c.type: (c.status, c.reason) for c in existing}
        # The taint first: it is what keeps pods off, and the Node just read is still
        # current for its resourceVersion precondition (a status patch first would make it
        # stale: a 409, a backoff and a GET on every change). Then conditions, then Events.
        value = taint_value(self.gate.reason) if tainted else None
        changes = writer.sync_taint_and_cordon(value, tainted, self.gate.reason, node,
                                               report.labels)
        now = time.time()
        updates = condition_updates(existing, report.findings, now, report.since)
        if updates or self.clock() >= self._due.heartbeat:
            # One status patch carries any change and every condition's heartbeat: the
            # heartbeat costs a write of its own only when nothing changed for a while.
            writer.patch_conditions(condition_updates(existing, report.findings, now,
                                                      report.since, every=True))
            self._due.heartbeat = self.clock() + self.cfg.heartbeat_interval
        for f in report.findings:
            was = self._written.conditions.get(f.type)
            if was != (f.status, f.reason):
                writer.event(uid, f"{f.type}{'' if f.ok else 'Failed'}",
                             f"{f.type}={f.status} ({f.reason}): {f.message}", not f.ok)
                self._written.conditions[f.type] = (f.status, f.reason)
        for change in changes:
            if change.what is Changed.LABELS:
                writer.event(uid, "HardwareFingerprint", change.text, False)
            else:
                writer.event(uid, "FabricTaint", f"{change.text} ({self.gate.reason})",
                             tainted)
            log.info("node %s: %s", writer.node, change.text)
        self.state.tainted = tainted and self.cfg.taint is not None  # conditions only: never
        self.state.taint_reason = self.gate.reason

    def status(self) -> PublisherState:
        state, counters = self.state, self.writer.counters if self.writer else None
        return PublisherState(
            synced=state.synced, last_error=state.last_error, tainted=state.tainted,
            taint_reason=state.taint_reason,
            requests=counters.requests if counters else 0,
            writes=counters.writes if counters else 0,
            conflicts=counters.conflicts if counters else 0,
            errors=counters.errors if counters else 0,
            events_dropped=counters.events_dropped if counters else 0,
            device_taints=self.rail_taints.rails if self.rail_taints else None,
            device_taints_error=self.rail_taints.error if self.rail_taints else None)


def _key(status: PublisherState) -> tuple[Any, ...]:
    return (status.synced, status.last_error, status.tainted, status.taint_reason,
            status.device_taints, status.device_taints_error)


def describe_error(exc: BaseException) -> str:
    """One line: the API's own status message when there is one (403s name the rule), or
    the TLS or connection error with its server."""
    from nodeagent.kube.api import api_error_text  # the client library only when configured

    return api_error_text(exc)


def _fabric(report: Status) -> Finding:
    for f in report.findings:
        if f.type == FABRIC_READY:
            return f
    raise ValueError("report has no FabricReady finding")
