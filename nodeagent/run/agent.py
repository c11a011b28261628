"""The daemon loop: netlink events and timers -> passes -> repairs -> status.

A reader thread turns rtnetlink events into work items; the main thread runs one pass at a
time, so probes, repairs and publishing never race each other. An event that touches a rail
re-probes and repairs that rail at once; a periodic resync covers everything else, and a
netlink overflow (ENOBUFS: events were lost) forces one.
"""

from __future__ import annotations

import gc
import logging
import queue
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING, Any

from pyroute2 import IPRoute

from nodeagent.checks.history import FlapTracker, RepairGuard
from nodeagent.config import Config, ConfigError
from nodeagent.io.files import descriptor_faults
from nodeagent.io.signals import take_hup
from nodeagent.io.systemd import CONDITION, REASON, Notifier
from nodeagent.model import (
    FABRIC_READY,
    DaemonState,
    LustreProbeStatus,
    RailObservation,
    Report,
    Status,
)
from nodeagent.probes.netlink import deletion_from_msg, link_from_msg
from nodeagent.publish.publisher import Publisher
from nodeagent.publish.status import AlreadyRunning, DaemonLock, write_status
from nodeagent.run.custom import CustomChecksMonitor
from nodeagent.run.evaluate import Evaluator, PassPolicy, Repairs, fabric_pass
from nodeagent.run.gidwatch import GidSlotWatcher
from nodeagent.run.lustre import LustreMonitor
from nodeagent.run.netlink import NetlinkMonitor
from nodeagent.run.transport import TransportMonitor
from nodeagent.run.work import (
    CustomChecksSeen,
    EventsLost,
    GidSlotsMoved,
    LustreSeen,
    NetlinkEvent,
    NodeChanged,
    PluginSeen,
    ReloadAsked,
    Reloaded,
    Source,
    StopAsked,
    TransportSeen,
    Work,
)

if TYPE_CHECKING:  # imported when configured: a local-only agent loads no client library
    from nodeagent.publish.metrics import AgentMetrics
    from nodeagent.run.deviceplugin import DevicePluginMonitor

log = logging.getLogger(__name__)

SWITCH_INTERVAL = 0.0005  # seconds
RELOAD_SLOW = 5.0  # a SIGHUP reload still reading the config after this is reported


def summary(report: Report) -> str:
    """One line for `systemctl status` (STATUS=)."""
    fabric = next((f for f in report.findings if f.type == FABRIC_READY), None)
    rails = len(report.rails)
    if fabric is None or fabric.ok:
        return f"fabric ready: {rails} rail(s), every condition True"
    return f"FABRIC NOT READY ({fabric.reason}): {fabric.message}"[:200]


class DaemonPolicy(PassPolicy):
    """The daemon's part in the one pass: its repair guard, pauses and flap trackers."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def paused(self) -> dict[str, str]:
        return self.agent.overrides()[0]

    def repaired(self, repairs: Repairs, ours: bool) -> None:
        # A re-pin undoes the agent's own doing, not a fight with another manager: it is
        # kept out of the repair guard.
        self.agent._count_repairs(self.agent.clock(), repairs, guard=not ours)

    def observed(self, observations: Mapping[str, RailObservation]) -> None:
        now, flaps = self.agent.clock(), self.agent.flaps
        for name, obs in observations.items():
            if obs.link is not None and name in flaps:
                flaps[name].observe(now, obs.link)

    def overrides(self) -> dict[str, tuple[str, str]]:
        return self.agent.overrides()[1]

    def interrupt(self) -> None:
        self.agent.take_urgent()


class Agent:
    def __init__(
        self,
        cfg: Config,
        reload: Callable[[], Config],
        clock: Callable[[], float] = time.monotonic,
        lock: DaemonLock | None = None,
    ) -> None:
        self.cfg = cfg
        self.lock = lock  # re-checked every pass: a deleted lock file must not admit a twin
        self._lock_problem: str | None = None
        self._reload = reload
        self.clock = clock
        self.work: queue.SimpleQueue[Work] = queue.SimpleQueue()
        self._taken: deque[tuple[Work, bool]] = deque()  # see take_urgent
        self._early = Repairs()  # repairs take_urgent made, for the next pass to report
        self.sources: list[Source] = []  # started, stopped in that order at the end
        self.passes = 0
        self.probe_seconds: dict[str, float] = {}  # probe -> seconds, the latest of each
        self.last_pass_seconds = 0.0
        self._stopping = False
        self._ipr: Any = None
        self.last_report: Report | None = None
        self.publisher: Publisher | None = None
        self.lustre_monitor: LustreMonitor | None = None
        self.plugin_monitor: DevicePluginMonitor | None = None
        self.custom_monitor: CustomChecksMonitor | None = None
        self.transport_monitor: TransportMonitor | None = None
        self.metrics: AgentMetrics | None = None
        self.notifier = Notifier()
        self._metrics_server: Any = None
        self.since: dict[str, tuple[str, float]] = {}  # condition -> (status, since: wall clock)
        self.repair_counts: dict[str, dict[str, int]] = {}  # rail -> action kind -> count
        self.evaluator: Evaluator  # made in run(), once the netlink socket is open
        self.reload_error: str | None = None  # why the last SIGHUP kept the old config
        self.gid_watcher: GidSlotWatcher | None = None
        self._loader: threading.Thread | None = None  # a SIGHUP reload reading the config
        self._loader_started = 0.0
        self._configure(cfg)

    # ------------------------------------------------------------ configuration

    def _configure(self, cfg: Config) -> None:
        self.cfg = cfg
        # Counters and pauses survive a reload: a SIGHUP must not hide a flapping link or
        # restart a fight the agent had backed out of.
        flap = (cfg.link_flap.window, cfg.link_flap.max_flaps, cfg.link_flap.dwell)
        old: dict[str, FlapTracker] = getattr(self, "flaps", {})
        self.flaps = {r.name: old.get(r.name) or FlapTracker(*flap) for r in cfg.rails}
        for tracker in self.flaps.values():
            tracker.retune(*flap)
        guard = cfg.repair_guard
        if not hasattr(self, "guard"):
            self.guard = RepairGuard(guard.max_repairs, guard.window, guard.backoff)
        self.guard.max_repairs, self.guard.window = guard.max_repairs, guard.window
        self.guard.backoff = guard.backoff
        self.by_name = {r.interface: r.name for r in cfg.rails}
        self.by_table = {r.table: r.name for r in cfg.rails if r.table is not None}
        self.by_ip = {r.ip: r.name for r in cfg.rails}
        if self._ipr is not None:
            # One store for the daemon's life: what every source saw and the read workers
            # (a new set per reload leaked its threads) survive; a changed rail's facts go.
            store = self.evaluator.store
            store.keep_rails(cfg.rails, self.evaluator.cfg.rails)
            self.evaluator = Evaluator(cfg, self._ipr, store=store, clock=self.clock)
        if self.lustre_monitor is not None:
            self.lustre_monitor.cfg = cfg
        if self.plugin_monitor is not None:
            self.plugin_monitor.cfg = cfg
            self.plugin_monitor.wake()  # new settings take effect now, not next interval
        if self.custom_monitor is not None:
            self.custom_monitor.cfg = cfg
            self.custom_monitor.wake()
        if self.transport_monitor is not None:
            self.transport_monitor.cfg = cfg

    def start_reload(self) -> None:
        """SIGHUP: the config is read and validated on a thread of its own (a config on a
        filesystem that does not answer must not stop the repairs); the loop applies the
        result when it comes (`reloaded`)."""
        loader = self._loader
        if loader is not None and loader.is_alive():
            self.reload_error = (f"a reload has been reading the config for "
                                 f"{time.monotonic() - self._loader_started:.0f}s")
            log.error("reload ignored: %s", self.reload_error)
            return

        def load() -> None:
            try:
                self.work.put(Reloaded(self._reload()))
            except Exception as exc:  # handed to the loop: a failed reload is never a crash
                self.work.put(Reloaded(None, exc))

        self._loader_started = time.monotonic()
        self._loader = threading.Thread(target=load, name="config-reload", daemon=True)
        self._loader.start()
        # Still reading then: the status file says so without waiting for a pass.
        check = threading.Timer(RELOAD_SLOW + 0.1, lambda: self.work.put(NodeChanged()))
        check.daemon = True
        check.start()

    def apply_reload(self, cfg: Config | None, exc: BaseException | None) -> None:
        """A config that cannot be loaded, validated or applied never stops the daemon; it
        keeps the running config, logs why and says so in the status file."""
        previous = self.cfg
        if isinstance(exc, ConfigError):
            for line in exc.problems:
                log.error("reload rejected, keeping the last good config: %s", line)
            self.reload_error = "; ".join(exc.problems)[:1000]
            return
        if exc is not None or cfg is None:  # anything else the loader met: still no crash
            log.error("reload rejected, keeping the last good config: %s: %s",
                      type(exc).__name__, exc)
            self.reload_error = f"{type(exc).__name__}: {exc}"[:1000]
            return
        try:
            self._configure(cfg)
        except Exception as err:
            log.error("reload could not be applied, keeping the last good config: %s: %s",
                      type(err).__name__, err)
            self.reload_error = f"cannot apply: {type(err).__name__}: {err}"[:1000]
            self._configure(previous)
            return
        self.reload_error = None
        log.info("config reloaded: %d rail(s)", len(cfg.rails))
        if self.lustre_monitor is None:
            self._start_lustre()  # mounts configured for the first time
        if self.plugin_monitor is None:
            self._start_plugin_monitor()  # likewise the device plugin
        if self.custom_monitor is None:
            self._start_custom_checks()  # and the custom checks
        if self.transport_monitor is None:
            self._start_transport()  # and the transport probe

    # ------------------------------------------------------------ events

    def rails_for(self, msg: Any) -> set[str]:
        """Which rails an rtnetlink message touches."""
        event = str(msg.get("event", ""))
        hit: set[str] = set()
        index = msg.get("index") if "LINK" in event or "ADDR" in event else msg.get("oif")
        for name, obs in self.evaluator.store.observations.items():
            if obs.link is not None and index is not None and obs.link.index == index:
                hit.add(name)
        if "LINK" in event:
            rail = self.by_name.get(str(msg.get("ifname")))
            if rail:
                hit.add(rail)
                if event == "RTM_NEWLINK" and rail in self.flaps:
                    # Count carrier changes from the event itself, not a later probe.
                    self.flaps[rail].observe(self.clock(), link_from_msg(msg))
        if "ROUTE" in event or "RULE" in event:
            table = msg.get("table")
            if table in self.by_table:
                hit.add(self.by_table[table])
            src = msg.get("src")
            if src in self.by_ip:
                hit.add(self.by_ip[src])
        if ("ADDR" in event or "LINK" in event) and hit:
            self.evaluator.mark_gid_stale()  # the kernel's GID work follows these
        if "ADDR" in event and hit and self.gid_watcher is not None:
            # The kernel's GID work follows an address change asynchronously: look at the
            # slots closely until the table has settled.
            self.gid_watcher.settle()
        return hit

    # ------------------------------------------------------------ passes

    def overrides(self) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
        now = self.clock()
        paused: dict[str, str] = {}
        out: dict[str, tuple[str, str]] = {}
        for rail in self.cfg.rails:
            why = self.guard.paused(now, rail.name)
            if why:
                paused[rail.name] = why
                out[rail.name] = ("ManagedElsewhere", why)
            tracker = self.flaps.get(rail.name)
            if tracker is not None and tracker.flapping(now) and rail.name not in out:
                out[rail.name] = (
                    "LinkFlapping",
                    f"{rail.label}: {tracker.in_window(now)} carrier losses in "
                    f"{self.cfg.link_flap.window:g}s (more than {self.cfg.link_flap.max_flaps});"
                    f" clears after {self.cfg.link_flap.dwell:g}s stable",
                )
        return paused, out

    def next_verdict_change(self) -> float | None:
        """The next time a time-based verdict may change with no event at all (a shifted
        GID waiting for its QPs to end is looked at every gid_repin_poll), or the ports are
        to be read again (hardware.interval)."""
        evaluator: Evaluator | None = getattr(self, "evaluator", None)  # None before run()
        due = self._rail_verdicts_due()
        ports = evaluator.hardware_due() if evaluator is not None else None
        times = [t for t in (due, ports) if t is not None]
        return min(times) + 0.01 if times else None

    def _rail_verdicts_due(self) -> float | None:
        """The next time a rail's verdict may change by time alone (a flap dwell, a paused
        repair, a shifted GID to look at again)."""
        times = [t.clears_at() for t in self.flaps.values()]
        times.append(self.guard.resumes_at())
        evaluator: Evaluator | None = getattr(self, "evaluator", None)
        verdict = evaluator.gid_verdict if evaluator is not None else None
        if verdict is not None and verdict.shifts and self.cfg.gid_repin == "auto":
            times.append(self.clock() + self.cfg.gid_repin_poll)
        due = [t for t in times if t is not None]
        return min(due) if due else None

    def repair_from_event(self, msg: Any, rails: set[str], early: Repairs) -> None:
        """A deletion of something a rail owns is repaired from the event itself, before
        the rail is probed (the pass that follows verifies it)."""
        gone = deletion_from_msg(msg)
        if gone is None:
            return
        paused, _ = self.overrides()
        done = self.evaluator.repair_deletion(gone, rails, skip_repair=paused)
        if done.done or done.errors:
            self._count_repairs(self.clock(), done)
            early.merge(done)

    def _next(self, timeout: float) -> tuple[Work, bool] | None:
        """The next work, with whether its repair ran already: what take_urgent took off
        the queue during a pass comes first, in order; then the queue (waiting at most
        `timeout`)."""
        if self._taken:
            return self._taken.popleft()
        try:
            item: Work = self.work.get(block=timeout > 0, timeout=timeout or None)
        except queue.Empty:
            return None
        return item, False

    def take_urgent(self) -> None:
        """Between the stages of a pass: a deletion of something a rail owns that arrived
        meanwhile is repaired now, not after the pass (the pass after it verifies the rail).
        Whatever is taken off the queue goes to the loop next, in order."""
        while True:
            try:
                item = self.work.get_nowait()
            except queue.Empty:
                return
            repaired = False
            if isinstance(item, NetlinkEvent) and deletion_from_msg(item.msg) is not None:
                hit = self.rails_for(item.msg)
                if hit:
                    self.repair_from_event(item.msg, hit, self._early)
                    repaired = True
            self._taken.append((item, repaired))

    def run_pass(self, rails: set[str] | None, early: Repairs | None = None) -> Report:
        faults = descriptor_faults()
        report = self._pass(rails, early or Repairs())
        if descriptor_faults() != faults and self.last_report is not None:
            # Out of descriptors: reads failed for the agent's sake, not the fabric's. The
            # repairs of this pass stand; its verdict does not replace the last one.
            log.error("out of file descriptors during a pass: keeping the last verdict")
            report.findings = list(self.last_report.findings)
            report.errors.append("agent fault: out of file descriptors (EMFILE); the "
                                 "conditions are those of the last complete pass")
        self.last_report = report
        if self.gid_watcher is not None:
            self.gid_watcher.watch(self.evaluator.watched_slots())
        if self.transport_monitor is not None:
            self.transport_monitor.targets = self.evaluator.transport_targets()
        self.take_urgent()
        self._publish(report, submit=True)
        return report

    def _pass(self, rails: set[str] | None, early: Repairs) -> Report:
        started = time.perf_counter()
        self.evaluator.timings.clear()
        report, repairs = fabric_pass(self.evaluator, rails, repair=True, early=early,
                                      policy=DaemonPolicy(self))
        self.passes += 1
        self.last_pass_seconds = time.perf_counter() - started
        # A fact that was fresh needs no read: the status shows each probe's latest time.
        self.probe_seconds.update(self.evaluator.timings)
        if self.metrics is not None:
            self.metrics.observe_pass(
                {**self.evaluator.timings, "pass": self.last_pass_seconds},
                [(n, a.kind.value) for n, acts in repairs.done.items() for a in acts])
        return report

    def _count_repairs(self, now: float, repairs: Repairs, guard: bool = True) -> None:
        for name, actions in repairs.done.items():
            if guard:
                self.guard.record(now, name, self.evaluator.rails[name].label,
                                  {a.kind for a in actions})
            counts = self.repair_counts.setdefault(name, {})
            for a in actions:
                counts[a.kind.value] = counts.get(a.kind.value, 0) + 1

    def snapshot(self, report: Report, state: str = "running") -> Status:
        """The pass as everything downstream sees it: condition transition times, the
        rails' history, probe times, the Lustre probes and the publisher's own view."""
        wall = time.time()
        for f in report.findings:
            status, _ = self.since.get(f.type, ("", wall))
            if status != f.status:
                self.since[f.type] = (f.status, wall)
                log.log(logging.INFO if f.status == "True" else logging.WARNING,
                        "%s=%s (%s): %s", f.type, f.status, f.reason, f.message,
                        extra={CONDITION: f.type, REASON: f.reason})
        now = self.clock()
        rails = []
        for rail in report.rails:
            tracker = self.flaps.get(rail.name)
            rails.append(replace(
                rail, repairs_total=dict(self.repair_counts.get(rail.name, {})),
                carrier_losses_total=tracker.total if tracker else None,
                carrier_losses_in_window=tracker.in_window(now) if tracker else None))
        lustre = self.evaluator.store.lustre
        reading = self._loader is not None and self._loader.is_alive()
        if reading and time.monotonic() - self._loader_started > RELOAD_SLOW:
            self.reload_error = (f"a reload has been reading the config for "
                                 f"{time.monotonic() - self._loader_started:.0f}s")
        return Status(
            report=replace(report, rails=rails),
            since={t: at for t, (_, at) in self.since.items()},
            probe_seconds=dict(self.probe_seconds),
            lustre=None if lustre is None else tuple(
                LustreProbeStatus(mp, r.seconds, not r.done) for mp, r in lustre.statfs.items()),
            kubernetes=self.publisher.status() if self.publisher is not None else None,
            daemon=DaemonState(state=state, passes=self.passes,
                               resync_interval=self.cfg.resync_interval,
                               last_pass_seconds=self.last_pass_seconds,
                               reload_error=self.reload_error),
        )

    def _publish(self, report: Report, state: str = "running", submit: bool = False) -> Status:
        """One snapshot to the metrics, systemd and the status file, and with `submit` (a
        new pass) to the Node writer. A rewrite of the status because the Kubernetes side
        changed is never submitted: the publisher's own change would come back as another
        rewrite, and again, forever."""
        status = self.snapshot(report, state)
        if self.publisher is not None and submit:
            self.publisher.submit(status)  # never waits for the API server
        if self.metrics is not None:
            self.metrics.update(status)
        if state == "running":
            self.notifier.status(summary(report))
        assert status.daemon is not None
        self._check_lock()
        try:
            write_status(self.cfg.runtime_dir, status.document(), status.daemon.as_dict())
        except OSError as exc:
            log.error("cannot write status file in %s: %s", self.cfg.runtime_dir, exc)
        return status

    def _check_lock(self) -> None:
        if self.lock is None:
            return
        try:
            self.lock.reassert()
        except AlreadyRunning as exc:  # the lock file was replaced and another daemon took it
            log.error("stopping: %s", exc)
            self.stop()
            return
        except OSError as exc:  # not a file to write through: the old lock is still held
            problem = f"cannot lock {self.lock.path} again: {exc.strerror or exc}"
            if problem != self._lock_problem:
                log.error("%s (the lock already held is kept)", problem)
            self._lock_problem = problem
            return
        self._lock_problem = None

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

    def _start(self, source: Source) -> None:
        self.sources.append(source)
        source.start()

    def _start_publisher(self) -> None:
        kcfg = self.cfg.kubernetes
        if kcfg is None:
            return
        from nodeagent.kube.api import api_client
        from nodeagent.publish.kube import NodeWriter

        node = self.cfg.resolved_node_name()
        self.publisher = Publisher(
            kcfg,
            lambda: NodeWriter(api_client(kcfg, kcfg.request_timeout), node, kcfg),
            on_change=lambda: self.work.put(NodeChanged()),
        )
        self._start(self.publisher)

    def _start_lustre(self) -> None:
        if not self.cfg.lustre:
            return

        self.lustre_monitor = LustreMonitor(self.cfg, self.work.put)
        self._start(self.lustre_monitor)

    def _start_transport(self) -> None:
        if self.cfg.transport is None:
            return
        self.transport_monitor = TransportMonitor(self.cfg, self.work.put)
        self._start(self.transport_monitor)

    def _start_custom_checks(self) -> None:
        if self.cfg.custom_checks is None:
            return
        self.custom_monitor = CustomChecksMonitor(self.cfg, self.work.put)
        self._start(self.custom_monitor)

    def _start_plugin_monitor(self) -> None:
        if self.cfg.kubernetes is None or self.cfg.device_plugin is None:
            return

        cfg = self.cfg
        from nodeagent.run.deviceplugin import DevicePluginMonitor, plugin_reader

        self.plugin_monitor = DevicePluginMonitor(
            cfg, lambda wake: plugin_reader(cfg, on_change=wake), self.work.put)
        self._start(self.plugin_monitor)

    def _start_metrics(self) -> None:
        if self.cfg.metrics is None:
            return
        from nodeagent.publish.metrics import AgentMetrics, serve

        self.metrics = AgentMetrics()
        try:
            self._metrics_server = serve(self.metrics, self.cfg.metrics.listen)
        except OSError as exc:  # port taken: the agent's real work goes on without it
            log.error("metrics endpoint %s: %s", self.cfg.metrics.listen, exc)
        else:
            log.info("metrics on http://%s/metrics", self.cfg.metrics.listen)

    def run(self) -> int:
        self._start_metrics()
        self._start_publisher()
        monitor = NetlinkMonitor(self.work.put, self.cfg.netlink_rcvbuf)
        self._start(monitor)
        monitor.ready.wait(timeout=5.0)
        with IPRoute() as ipr:
            self._ipr = ipr
            self.evaluator = Evaluator(self.cfg, ipr, clock=self.clock)
            self._start_lustre()  # after the evaluator exists: they deliver to it
            self._start_plugin_monitor()
            self._start_custom_checks()
            self._start_transport()
            if self.cfg.rails:
                self.gid_watcher = GidSlotWatcher(
                    self.cfg.paths.sysfs, self.work.put)
                self._start(self.gid_watcher)
            first = self.run_pass(None)
            # What startup made (modules, config, clients) lives as long as the daemon: out
            # of the collector's sight, a full collection no longer walks it (a pause in
            # the middle of a repair otherwise).
            gc.collect()
            gc.freeze()
            # A deletion event waits for the GIL while a worker thread reads a GID table:
            # switch threads every 0.5 ms rather than 5 ms.
            sys.setswitchinterval(SWITCH_INTERVAL)
            log.info("first pass done: %s", "fabric ok" if first.ok else "fabric NOT ok")
            # Ordering on this unit means the fabric has been checked once.
            self.notifier.ready(summary(first))
            next_resync = self.clock() + self.cfg.resync_interval
            while not self._stopping:
                self.notifier.ping()  # the loop came round: it is not wedged
                wake = self.next_verdict_change()
                deadline = next_resync if wake is None else min(next_resync, wake)
                timeout = max(0.0, deadline - self.clock())
                if self.notifier.ping_every is not None:
                    timeout = min(timeout, self.notifier.ping_every)
                got = self._next(timeout)
                item, repaired = got if got is not None else (None, False)
                if item is None and self.clock() < deadline:
                    continue  # woke only to ping the watchdog
                full = item is None and self.clock() >= next_resync
                rails: set[str] = set()
                early, self._early = self._early, Repairs()  # repaired from events already
                status_only = judge_only = False
                if item is None and not full:
                    now = self.clock()
                    ports, due = self.evaluator.hardware_due(), self._rail_verdicts_due()
                    if ports is not None and ports <= now and (due is None or due > now):
                        judge_only = True  # the ports' turn alone: read them, probe no rail
                    else:
                        rails = set(self.evaluator.rails)  # a flap dwell or a pause ran out
                # Drain what else is queued: one pass serves a burst of events.
                while item is not None:
                    if isinstance(item, StopAsked):
                        self._stopping = True
                    elif isinstance(item, ReloadAsked):
                        self.start_reload()
                        status_only = True  # a second SIGHUP while one reads says so
                    elif isinstance(item, Reloaded):
                        self.apply_reload(item.cfg, item.error)
                        full = True
                    elif isinstance(item, EventsLost):
                        full = True
                        monitor.resync_pending.clear()  # later overflows queue a new one
                    elif isinstance(item, NetlinkEvent):
                        hit = self.rails_for(item.msg)
                        if hit and not repaired:
                            self.repair_from_event(item.msg, hit, early)
                        rails |= hit
                    elif isinstance(item, NodeChanged):
                        status_only = True
                    elif isinstance(item, PluginSeen):
                        self.evaluator.store.device_plugin = item.observation
                        self.evaluator.store.plugin_seen_ready = item.seen_ready
                        judge_only = True
                    elif isinstance(item, GidSlotsMoved):  # no netlink event said so
                        self.evaluator.mark_gid_stale(moved=True)
                        judge_only = True
                    elif isinstance(item, TransportSeen):
                        self.evaluator.store.observe_transport(item)
                        judge_only = True
                    elif isinstance(item, CustomChecksSeen):
                        self.evaluator.store.custom_results = item.results
                        judge_only = True
                    elif isinstance(item, LustreSeen):
                        self.evaluator.store.lustre = item.observation
                        for line in item.remounted:
                            log.info("repaired %s", line)
                        judge_only = True
                    got = self._next(0.0)
                    item, repaired = got if got is not None else (None, False)
                if self._stopping:
                    break
                if full:
                    self.evaluator.mark_gid_stale(everywhere=True)  # resync: read it all
                    self.run_pass(None, early)
                    next_resync = self.clock() + self.cfg.resync_interval
                elif rails:
                    self.run_pass(rails, early)
                elif judge_only:
                    self.run_pass(set())  # new Lustre facts: judge again, probe no rail
                elif status_only and self.last_report is not None:
                    self._publish(self.last_report)  # the Kubernetes side changed
            # SIGTERM: the current step is done; leave a status that says we stopped.
            self.notifier.stopping()
            if self.last_report is not None:
                self._publish(self.last_report, state="stopped")
        for source in self.sources:
            source.stop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        log.info("stopped after %d passes", self.passes)
        return 0
