"""The daemon's sources and outputs, each made from its config section by one factory.

Every source follows the contract in run/work.py (`start`, `stop`, `deliver`). A section
added by a reload starts its source then; a reload hands the new config to the running
ones; at the end they stop in the order they started. `look_once` reads the same sections
once, into the same observations, for the CLI's check and apply.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from nodeagent.checks.facts import (
    CustomChecksSeen,
    Delivered,
    LustreSeen,
    PluginSeen,
    SlicesSeen,
)
from nodeagent.config import Config
from nodeagent.run.custom import CustomChecksMonitor
from nodeagent.run.fastlane import FastLane
from nodeagent.run.gidwatch import GidSlotWatcher
from nodeagent.run.lustre import LustreMonitor
from nodeagent.run.netlink import NetlinkMonitor
from nodeagent.run.own_rdma import OwnRDMA
from nodeagent.run.transport import TransportMonitor
from nodeagent.run.work import (
    Aim,
    Deliver,
    NodeChanged,
    Source,
)

if TYPE_CHECKING:  # imported when configured: a local-only agent loads no client library
    from nodeagent.kube.watch import WatchedCollection
    from nodeagent.model.peers import Targets
    from nodeagent.publish.metrics import AgentMetrics
    from nodeagent.publish.publisher import Publisher

log = logging.getLogger(__name__)


def look_once(cfg: Config, repair: bool) -> tuple[list[Delivered], list[str]]:
    """What the configured sources deliver, each read once the way its thread reads it
    (the transport probe, which needs a pass's targets, excepted); and the errors met. With
    `repair`, a mount that is due is remounted, as its source does."""
    seen: list[Delivered] = []
    errors: list[str] = []
    if cfg.lustre:
        from nodeagent.io.commands import BoundedRunner
        from nodeagent.run.lustre import look_and_repair

        obs, done, errors = look_and_repair(cfg, BoundedRunner(), repair=repair)
        seen.append(LustreSeen(obs, tuple(done)))
    if cfg.kubernetes is not None and cfg.device_plugin is not None:
        from nodeagent.run.deviceplugin import load_seen_ready, plugin_reader

        seen.append(PluginSeen(plugin_reader(cfg)(cfg.device_plugin),
                               frozenset(load_seen_ready(cfg))))
    if cfg.custom_checks is not None:
        from nodeagent.run.custom import run_all

        seen.append(CustomChecksSeen(run_all(cfg)))
    if cfg.kubernetes is not None and cfg.dra is not None:
        from nodeagent.run.dra import api_lister, read_slices

        seen.append(SlicesSeen(read_slices(cfg, api_lister(cfg))))
    return seen, errors


class SectionSource(Source, Protocol):
    """A source that runs while its config section is there; a reload hands it the new
    config (new settings take effect now, not at the next interval)."""

    def reconfigure(self, cfg: Config) -> None: ...


@runtime_checkable
class TakesAim(Protocol):
    """A source that probes the rails' endpoints the last pass found."""

    def retarget(self, targets: Targets) -> None: ...


def _lustre(sources: Sources, cfg: Config) -> SectionSource:
    return LustreMonitor(cfg, sources.deliver)


def _plugin(sources: Sources, cfg: Config) -> SectionSource:
    from nodeagent.run.deviceplugin import DevicePluginMonitor, plugin_reader

    # The publisher's watch of this Node serves the plugin's reader too.
    return DevicePluginMonitor(
        cfg, lambda wake: plugin_reader(cfg, on_change=wake, node_watch=sources.node_watch),
        sources.deliver)


def _custom(sources: Sources, cfg: Config) -> SectionSource:
    return CustomChecksMonitor(cfg, sources.deliver)


def _transport(sources: Sources, cfg: Config) -> SectionSource:
    return TransportMonitor(cfg, sources.deliver, sources.own_rdma)


def _dra(sources: Sources, cfg: Config) -> SectionSource:
    from nodeagent.run.dra import SlicesMonitor

    return SlicesMonitor(cfg, sources.deliver)


def _congestion(sources: Sources, cfg: Config) -> SectionSource:
    from nodeagent.run.congestion import CongestionMonitor

    return CongestionMonitor(cfg, sources.deliver)


def _lldp(sources: Sources, cfg: Config) -> SectionSource:
    from nodeagent.run.lldp import LLDPListener

    return LLDPListener(cfg, sources.deliver)


def _peers(sources: Sources, cfg: Config) -> SectionSource:
    from nodeagent.run.peers import PeerService

    return PeerService(cfg, sources.deliver, sources.own_rdma)


@dataclass(frozen=True)
class Section:
    wanted: Callable[[Config], bool]
    make: Callable[[Sources, Config], SectionSource]


# In the order they start (and stop). A section here is all a new source needs.
SECTIONS: dict[str, Section] = {
    "lustre": Section(lambda c: bool(c.lustre), _lustre),
    "device_plugin": Section(
        lambda c: c.kubernetes is not None and c.device_plugin is not None, _plugin),
    "custom_checks": Section(lambda c: c.custom_checks is not None, _custom),
    "transport": Section(lambda c: c.transport is not None, _transport),
    "dra": Section(lambda c: c.dra is not None and c.kubernetes is not None, _dra),
    "peers": Section(lambda c: c.peers is not None, _peers),
    "congestion": Section(lambda c: c.congestion is not None, _congestion),
    "lldp": Section(lambda c: c.lldp is not None, _lldp),
}

S = TypeVar("S")


class Sources:
    def __init__(self, deliver: Deliver, own_rdma: OwnRDMA | None = None) -> None:
        self.deliver = deliver
        self.own_rdma = own_rdma or OwnRDMA()  # what the probes move, charged by them
        self.started: list[Source] = []  # stopped in this order at the end
        self.netlink: NetlinkMonitor | None = None
        self.fast = FastLane()  # deletions repaired on the netlink thread, from the loop's plan
        self.gid_watcher: GidSlotWatcher | None = None
        self.publisher: Publisher | None = None
        self.metrics: AgentMetrics | None = None
        self._metrics_server: Any = None
        self._sections: dict[str, SectionSource] = {}  # running, by section name

    def get(self, kind: type[S]) -> S | None:
        """The running source of this type, if its section is configured."""
        return next((s for s in self._sections.values() if isinstance(s, kind)), None)

    def aim(self, aim: Aim) -> None:
        """After each pass: each running source gets what it is to look at next."""
        if self.gid_watcher is not None:
            self.gid_watcher.retarget(aim.gid_slots)
        for source in self._sections.values():
            if isinstance(source, TakesAim):
                source.retarget(aim.rails)

    def _start(self, source: Source) -> None:
        self.started.append(source)
        source.start()

    def start_outputs(self, cfg: Config) -> None:
        """The metrics endpoint and the Node writer, before the first pass."""
        self._start_metrics(cfg)
        kcfg = cfg.kubernetes
        if kcfg is not None:
            from nodeagent.kube.api import api_client
            from nodeagent.publish.kube import NodeWriter
            from nodeagent.publish.publisher import Publisher

            node = cfg.resolved_node_name()
            self.publisher = Publisher(
                kcfg, lambda: NodeWriter(api_client(kcfg, kcfg.request_timeout), node, kcfg),
                on_change=lambda: self.deliver(NodeChanged()),
                device_taints=cfg.dra.device_taints if cfg.dra is not None else None)
            self._start(self.publisher)

    def start_netlink(self, cfg: Config) -> NetlinkMonitor:
        self.netlink = NetlinkMonitor(self.deliver, cfg.netlink_rcvbuf, self.fast)
        self._start(self.netlink)
        self.netlink.ready.wait(timeout=5.0)
        return self.netlink

    def start_missing(self, cfg: Config) -> None:
        """Each source whose section is configured and that does not run yet."""
        for name, section in SECTIONS.items():
            if section.wanted(cfg) and name not in self._sections:
                self._sections[name] = source = section.make(self, cfg)
                self._start(source)
        if cfg.rails and self.gid_watcher is None:
            self.gid_watcher = GidSlotWatcher(cfg.paths.sysfs, self.deliver)
            self._start(self.gid_watcher)

    def node_watch(self) -> WatchedCollection | None:
        return self.publisher.node_watch if self.publisher is not None else None

    def reconfigure(self, cfg: Config) -> None:
        """A reload's config to the running sources; a source whose section the reload
        removed is stopped (before, a reload without `peers` left the responder answering
        the old peers)."""
        for name, source in list(self._sections.items()):
            if SECTIONS[name].wanted(cfg):
                source.reconfigure(cfg)
                continue
            source.stop()
            self.started.remove(source)
            del self._sections[name]
            log.info("reload: %s stopped (its section is gone)", name)

    def _start_metrics(self, cfg: Config) -> None:
        if cfg.metrics is None:
            return
        from nodeagent.publish.metrics import AgentMetrics, serve

        self.metrics = AgentMetrics()
        try:
            self._metrics_server = serve(self.metrics, cfg.metrics.listen)
        except OSError as exc:  # port taken: the agent's real work goes on without it
            log.error("metrics endpoint %s: %s", cfg.metrics.listen, exc)
        else:
            log.info("metrics on http://%s/metrics", cfg.metrics.listen)

    def stop(self) -> None:
        for source in self.started:
            source.stop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
