"""The daemon loop: netlink events and timers -> passes -> repairs -> status.

A reader thread turns rtnetlink events into work items; the main thread runs one pass at a
time, so probes, repairs and publishing never race each other. An event that touches a rail
re-probes and repairs that rail at once; a periodic resync covers everything else, and a
netlink overflow (ENOBUFS: events were lost) forces one.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import FrameType

from pyroute2.iproute import IPRoute

from nodeagent.checks.facts import LustreSeen
from nodeagent.config import Config
from nodeagent.io.signals import take_hup
from nodeagent.io.systemd import CONDITION, REASON, Notifier
from nodeagent.model.conditions import FABRIC_READY
from nodeagent.model.lustre import LustreProbeStatus
from nodeagent.model.network import EventKind, KernelEvent
from nodeagent.model.status import DaemonRun, DaemonState, Report, Status
from nodeagent.publish.status import DaemonLock, write_status
from nodeagent.remedies.repairs import Repairs
from nodeagent.run.discovery import own_card
from nodeagent.run.evaluate import Evaluator, fabric_pass
from nodeagent.run.rails import RailHistory
from nodeagent.run.reload import ConfigReloader
from nodeagent.run.sources import Sources
from nodeagent.run.store import FactStore
from nodeagent.run.work import (
    EventsLost,
    GidSlotsMoved,
    Inbox,
    NetlinkEvent,
    NodeChanged,
    ReloadAsked,
    Reloaded,
    StopAsked,
    Work,
)

log = logging.getLogger(__name__)

SWITCH_INTERVAL = 0.0005  # seconds
# A pass after events waits until they have been quiet this long (at most SETTLE_MAX after
# the first): well under the second a taint may take, long enough for a burst to be one.
SETTLE = 0.02
SETTLE_MAX = 0.2


def summary(report: Report) -> str:
    """One line for `systemctl status` (STATUS=)."""
    fabric = next((f for f in report.findings if f.type == FABRIC_READY), None)
    rails = len(report.rails)
    if fabric is None or fabric.ok:
        return f"fabric ready: {rails} rail(s), every condition True"
    return f"FABRIC NOT READY ({fabric.reason}): {fabric.message}"[:200]


@dataclass
class PassRecord:
    """The passes so far, as the status file shows them."""

    passes: int = 0
    last_seconds: float = 0.0
    probe_seconds: dict[str, float] = field(default_factory=dict)  # the latest of each
    last_report: Report | None = None
    since: dict[str, tuple[str, float]] = field(default_factory=dict)  # type -> status, wall

    def transitions(self, report: Report) -> None:
        """When each condition took its current status; a change is logged."""
        wall = time.time()
        for f in report.findings:
            status, _ = self.since.get(f.type, ("", wall))
            if status != f.status:
                self.since[f.type] = (f.status, wall)
                log.log(logging.INFO if f.status == "True" else logging.WARNING,
                        "%s=%s (%s): %s", f.type, f.status, f.reason, f.message,
                        extra={CONDITION: f.type, REASON: f.reason})


@dataclass
class Plan:
    """What one turn of the loop does once the queue is drained."""

    full: bool = False  # a resync: every rail, every fact
    rails: set[str] = field(default_factory=set)  # the rails events touched
    judge_only: bool = False  # new facts from a source: judge again, probe no rail
    status_only: bool = False  # the Kubernetes side changed: the status file says so


class Agent:
    def __init__(
        self,
        cfg: Config,
        reload: Callable[[], Config],
        clock: Callable[[], float] = time.monotonic,
        lock: DaemonLock | None = None,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.lock = lock  # re-checked every pass: a deleted lock file must not admit a twin
        self.work = Inbox()
        self._early = Repairs()  # repairs take_urgent made, for the next pass to report
        self._stopping = False
        # One for the daemon's life, across reloads: the facts, and the rails' history.
        self.store = FactStore(history=RailHistory(cfg))
        self.evaluator: Evaluator | None = None  # made in run(), once netlink is open
        self.notifier = Notifier()
        self.reloader = ConfigReloader(reload, self.work.put)
        self.sources = Sources(self.work.put, self.store.own_rdma)
        self.record = PassRecord()

    # ------------------------------------------------------------ configuration

    def _configure(self, cfg: Config) -> None:
        if self.evaluator is not None:
            evaluator = Evaluator(cfg, self.evaluator.ipr, store=self.store, clock=self.clock)
            # A changed rail's facts go; what every source saw and the read workers stay.
            self.store.keep_rails(cfg.rails, self.evaluator.cfg.rails)
            self.evaluator = evaluator
        self.cfg = cfg
        self.history.retune(cfg)  # a reload never hides a flap or restarts a fight
        self.sources.reconfigure(cfg)

    def apply_reload(self, got: Reloaded) -> None:
        """A config that cannot be loaded, validated or applied never stops the daemon; it
        keeps the running config, logs why and says so in the status file."""
        cfg = self.reloader.accepted(got, self.cfg)
        if cfg is None:
            return
        self.sources.fast.aim(None, {}, {})  # no repair by the old plan: the next pass aims
        previous = self.cfg
        try:
            self._configure(cfg)
        except Exception as err:
            self.reloader.not_applied(err)
            self._configure(previous)
            return
        self.reloader.applied(cfg, previous)
        self.sources.start_missing(cfg)  # sections configured for the first time

    # ------------------------------------------------------------ events

    def rails_for(self, event: KernelEvent) -> set[str]:
        """Which rails a kernel event touches; what the kernel does next follows from it
        (carrier changes counted from the event, the GID table read again)."""
        assert self.evaluator is not None  # events are taken once the loop runs
        index = self.evaluator.index
        hit = index.rails_for(event, self.store.observations)
        if event.link is not None:
            rail = index.by_name.get(event.link.ifname)
            if rail:
                self.history.link_event(self.clock(), rail, event.link)
        lent = index.by_name.get(event.ifname or "") if event.kind is EventKind.LINK else None
        if lent is not None:
            self.store.lent.follow(lent, event.moved_away, event.link is not None,
                                   self.clock())
            if event.link is None:
                self.store.leaving.said(lent, deleted=not event.moved_away)
        gid_work = event.kind in (EventKind.ADDRESS, EventKind.LINK)
        if gid_work and hit:
            self.evaluator.mark_gid_stale()  # the kernel's GID work follows these
        if event.kind is EventKind.ADDRESS and hit and self.sources.gid_watcher is not None:
            # The kernel's GID work follows an address change asynchronously: look at the
            # slots closely until the table has settled.
            self.sources.gid_watcher.settle()
        return hit

    # ------------------------------------------------------------ passes

    @property
    def history(self) -> RailHistory:
        assert self.store.history is not None
        return self.store.history

    def next_verdict_change(self) -> float | None:
        """The next time a time-based verdict may change with no event at all (a shifted
        GID waiting for its QPs to end is looked at every gid_repin_poll), or the ports are
        to be read again (hardware.interval)."""
        due = self._rail_verdicts_due()
        ports = self.evaluator.hardware_due() if self.evaluator is not None else None
        times = [t for t in (due, ports) if t is not None]
        return min(times) + 0.01 if times else None

    def _rail_verdicts_due(self) -> float | None:
        """The next time a rail's verdict may change by time alone (a flap dwell, a paused
        repair, a shifted GID to look at again, a vanished netdev with no word from the
        kernel)."""
        times = [self.history.next_change(), self.store.leaving.due(self.clock())]
        verdict = self.evaluator.gid_verdict if self.evaluator is not None else None
        if verdict is not None and verdict.shifts and self.cfg.gid_repin == "auto":
            times.append(self.clock() + self.cfg.gid_repin_poll)
        return min((t for t in times if t is not None), default=None)

    def repair_from_event(self, event: KernelEvent, rails: set[str], early: Repairs) -> None:
        """A deletion of something a rail owns is repaired from the event itself, before
        the rail is probed (the pass that follows verifies it)."""
        gone = event.deletion
        if gone is None or self.evaluator is None:
            return
        done = self.evaluator.repair_deletion(gone, rails)
        if done.done or done.errors:
            early.merge(done)

    def take_urgent(self) -> None:
        """Between the stages of a pass: a deletion of something a rail owns that arrived
        meanwhile is repaired now, not after the pass (the pass after it verifies the rail).
        Whatever is taken off the queue goes to the loop next, in order."""
        for item in self.work.take_all():
            repaired = False
            if isinstance(item, NetlinkEvent) and item.event.deletion is not None \
                    and item.repaired is None:
                hit = self.rails_for(item.event)
                if hit:
                    self.repair_from_event(item.event, hit, self._early)
                    repaired = True
            self.work.put_back(item, repaired)

    def run_pass(self, rails: set[str] | None, early: Repairs | None = None) -> Report:
        assert self.evaluator is not None
        report = self._pass(self.evaluator, rails, early or Repairs())
        self.record.last_report = report
        self.store.lent.keep(self.cfg, self.clock)  # a rail seen here again is not lent
        self.sources.aim(self.evaluator.aim())
        self._aim_fast_lane()
        self.take_urgent()
        self._publish(report, submit=True)
        return report

    def _aim_fast_lane(self) -> None:
        """What the netlink thread may repair until the next pass: the rails the agent
        manages and may repair now (not paused, not lent), on their links as just seen,
        within the guard's room."""
        assert self.evaluator is not None
        now, paused = self.clock(), self.evaluator.paused()
        links = {name: index for name, rail in self.evaluator.rails.items()
                 if self.cfg.manages(rail) and name not in paused
                 and name not in self.store.lent
                 and (index := self.evaluator.ifindex(name)) is not None}
        room = {n: self.history.guard.room(now, n) for n in links}
        self.sources.fast.aim(self.cfg, links, room)

    def _fast_repaired(self, repaired: Repairs, early: Repairs) -> None:
        """A fast-lane repair, taken by the loop: counted (and fed to the guard), reported
        by the next pass, whose probe verifies it."""
        assert self.evaluator is not None
        self.sources.fast.taken.update(repaired.done.keys())
        self.evaluator.after_repairs(repaired)
        self.evaluator.count(repaired)
        early.merge(repaired)

    def _pass(self, evaluator: Evaluator, rails: set[str] | None, early: Repairs) -> Report:
        started = time.perf_counter()
        evaluator.timings.clear()
        report, repairs = fabric_pass(evaluator, rails, repair=True, early=early,
                                      interrupt=self.take_urgent)
        record = self.record
        record.passes += 1
        record.last_seconds = time.perf_counter() - started
        # A fact that was fresh needs no read: the status shows each probe's latest time.
        record.probe_seconds.update(evaluator.timings)
        if self.sources.metrics is not None:
            self.sources.metrics.observe_pass(
                {**evaluator.timings, "pass": record.last_seconds},
                [(n, a.kind.value) for n, acts in repairs.done.items() for a in acts])
        return report

    def snapshot(self, report: Report, state: DaemonRun = DaemonRun.RUNNING) -> Status:
        """The pass (its report complete, the rails' history in it) as everything downstream
        sees it, with the daemon's own state: condition transition times, probe times, the
        Lustre probes, the publisher's view and the lock."""
        record = self.record
        record.transitions(report)
        errors = report.errors
        if self.lock is not None and self.lock.problem:
            errors = [*errors, self.lock.problem]
        seen = self.store.get(LustreSeen)
        lustre = seen.observation if seen is not None else None
        publisher = self.sources.publisher
        return Status(
            report=replace(report, errors=errors),
            since={t: at for t, (_, at) in record.since.items()},
            probe_seconds=dict(record.probe_seconds),
            lustre=None if lustre is None else tuple(
                LustreProbeStatus(mp, r.seconds, not r.done) for mp, r in lustre.statfs.items()),
            kubernetes=publisher.status() if publisher is not None else None,
            daemon=DaemonState(state=state, passes=record.passes,
                               resync_interval=self.cfg.resync_interval,
                               last_pass_seconds=record.last_seconds,
                               reload_error=self.reloader.status_error()),
            peer_card=own_card(self.cfg),
        )

    def _publish(self, report: Report, state: DaemonRun = DaemonRun.RUNNING,
                 submit: bool = False) -> Status:
        """One snapshot to the metrics, systemd and the status file, and with `submit` (a
        new pass) to the Node writer. A rewrite of the status because the Kubernetes side
        changed is never submitted: the publisher's own change would come back as another
        rewrite, and again, forever."""
        if self.lock is not None and not self.lock.keep():
            self.stop()  # the lock file was replaced and another daemon took it
        status = self.snapshot(report, state)
        if self.sources.publisher is not None and submit:
            self.sources.publisher.submit(status)  # never waits for the API server
        if self.sources.metrics is not None:
            self.sources.metrics.update(status)
        if state is DaemonRun.RUNNING:
            self.notifier.status(summary(report))
        assert status.daemon is not None
        try:
            write_status(self.cfg.runtime_dir, status.document(), status.daemon.as_dict())
        except OSError as exc:
            log.error("cannot write status file in %s: %s", self.cfg.runtime_dir, exc)
        return status

    # ------------------------------------------------------------ the loop

    def stop(self) -> None:
        self._stopping = True
        self.work.put(StopAsked())

    def install_signals(self) -> None:
        def on_stop(signum: int, _frame: FrameType | None) -> None:
            log.info("signal %s: finishing the current step, then exiting", signum)
            self.stop()

        def on_hup(_signum: int, _frame: FrameType | None) -> None:
            self.work.put(ReloadAsked())

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)
        if take_hup():  # a SIGHUP during the start-up, caught by the early handler
            self.work.put(ReloadAsked())

    def run(self) -> int:
        self.sources.start_outputs(self.cfg)
        self.sources.start_netlink(self.cfg)
        with IPRoute() as ipr:
            self.evaluator = Evaluator(self.cfg, ipr, store=self.store, clock=self.clock)
            self.store.lent.load(self.cfg, self.clock)
            self.sources.start_missing(self.cfg)  # after the evaluator: they deliver to it
            self._first_pass()
            self._loop()
            # SIGTERM: the current step is done; leave a status that says we stopped.
            self.notifier.stopping()
            if self.record.last_report is not None:
                self._publish(self.record.last_report, state=DaemonRun.STOPPED)
        self.sources.stop()
        log.info("stopped after %d passes", self.record.passes)
        return 0

    def _first_pass(self) -> None:
        first = self.run_pass(None)
        # What startup made (modules, config, clients) lives as long as the daemon: out of
        # the collector's sight, a full collection no longer walks it (a pause in the
        # middle of a repair otherwise).
        gc.collect()
        gc.freeze()
        # A deletion event waits for the GIL while a worker thread reads a GID table:
        # switch threads every 0.5 ms rather than 5 ms.
        sys.setswitchinterval(SWITCH_INTERVAL)
        log.info("first pass done: %s", "fabric ok" if first.ok else "fabric NOT ok")
        # Ordering on this unit means the fabric has been checked once.
        self.notifier.ready(summary(first))

    def _loop(self) -> None:
        next_resync = self.clock() + self.cfg.resync_interval
        while not self._stopping:
            self.notifier.ping()  # the loop came round: it is not wedged
            wake = self.next_verdict_change()
            deadline = next_resync if wake is None else min(next_resync, wake)
            timeout = max(0.0, deadline - self.clock())
            if self.notifier.ping_every is not None:
                timeout = min(timeout, self.notifier.ping_every)
            got = self.work.next(timeout)
            if got is None and self.clock() < deadline:
                continue  # woke only to ping the watchdog
            plan = self._timer_plan(next_resync) if got is None else Plan()
            early, self._early = self._early, Repairs()  # repaired from events already
            self._gather(got, plan, early)
            if self._stopping:
                break
            if self._act(plan, early):
                next_resync = self.clock() + self.cfg.resync_interval

    def _gather(self, got: tuple[Work, bool] | None, plan: Plan, early: Repairs) -> None:
        """What is queued, into the plan; when events touched rails, what follows them
        until they settle too: one pass verifies a burst (a deletion, the kernel's own
        follow-ups and the echoes of its repair; a fight's many), not one pass each. The
        repairs themselves never wait: the fast lane and _take made them already."""
        last = time.monotonic() + SETTLE_MAX
        while got is not None:
            self._take(*got, plan, early)
            got = self.work.next(0.0)
            if got is None and plan.rails and not plan.full and not self._stopping:
                got = self.work.next_in_batch(max(0.0, min(SETTLE, last - time.monotonic())))

    def _timer_plan(self, next_resync: float) -> Plan:
        """Woken by time alone: the resync, the ports' turn, or a flap dwell or repair
        pause that ran out."""
        now = self.clock()
        if now >= next_resync:
            return Plan(full=True)
        assert self.evaluator is not None
        ports, due = self.evaluator.hardware_due(), self._rail_verdicts_due()
        if ports is not None and ports <= now and (due is None or due > now):
            return Plan(judge_only=True)  # the ports' turn alone: read them, probe no rail
        return Plan(rails=set(self.evaluator.rails))

    def _take(self, item: Work, repaired: bool, plan: Plan, early: Repairs) -> None:
        """One work item into the plan of this turn."""
        assert self.evaluator is not None
        match item:
            case StopAsked():
                self._stopping = True
            case ReloadAsked():
                self.reloader.start()
                plan.status_only = True  # a second SIGHUP while one reads says so
            case Reloaded():
                self.apply_reload(item)
                plan.full = True
            case EventsLost():
                plan.full = True
                if self.sources.netlink is not None:
                    self.sources.netlink.resync_pending.clear()  # later overflows: a new one
            case NetlinkEvent():
                hit = self.rails_for(item.event)
                if item.repaired is not None:
                    self._fast_repaired(item.repaired, early)
                elif hit and not repaired:
                    self.repair_from_event(item.event, hit, early)
                plan.rails |= hit
            case NodeChanged():
                plan.status_only = True
            case GidSlotsMoved():  # no netlink event said so
                self.evaluator.mark_gid_stale(moved=True)
                plan.judge_only = True
            case _:  # a source's facts
                if isinstance(item, LustreSeen):
                    for line in item.remounted:
                        log.info("repaired %s", line)
                self.store.deliver(item)
                plan.judge_only = True

    def _act(self, plan: Plan, early: Repairs) -> bool:
        """Run what the plan asks; True when it was the resync."""
        assert self.evaluator is not None
        if plan.full:
            self.evaluator.mark_gid_stale()  # resync: the rails' tables again
            self.run_pass(None, early)
            return True
        if plan.rails:
            self.run_pass(plan.rails, early)
        elif plan.judge_only:
            self.run_pass(set(), early)  # new facts: judge again, probe no rail
        elif plan.status_only and self.record.last_report is not None:
            self._publish(self.record.last_report)  # the Kubernetes side changed
        return False
