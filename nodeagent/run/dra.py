"""The DRA thread: this node's ResourceSlices of the configured driver, listed every
`dra.interval` (one request, filtered by the API server on spec.nodeName and spec.driver,
served from its watch cache) and handed to the loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nodeagent.checks.facts import SlicesSeen
from nodeagent.config import Config
from nodeagent.io.files import printable
from nodeagent.io.periodic import Periodic
from nodeagent.kube.slices import node_devices
from nodeagent.model.kube import SlicesObservation
from nodeagent.run.work import Deliver

PATH = "/apis/resource.k8s.io/v1/resourceslices"

ListSlices = Callable[[str, str], list[Any]]


def slice_lister(api: Any, counters: Any) -> ListSlices:
    from nodeagent.kube.api import call

    def list_slices(node: str, driver: str) -> list[Any]:
        got = call(api, counters, "GET", PATH, query=[
            ("fieldSelector", f"spec.nodeName={node},spec.driver={driver}"),
            ("resourceVersion", "0")])
        page = got.get("items")
        return page if isinstance(page, list) else []

    return list_slices


def read_slices(cfg: Config, lister: ListSlices) -> SlicesObservation:
    assert cfg.dra is not None
    node, driver = cfg.resolved_node_name(), cfg.dra.driver
    try:
        return node_devices(lister(node, driver), node, driver)
    except Exception as exc:  # ApiException, the API down: the condition says it
        from nodeagent.kube.api import api_error_text

        return SlicesObservation(error=printable(api_error_text(exc))[:300])


class SlicesMonitor(Periodic):
    def __init__(self, cfg: Config, deliver: Deliver,
                 lister: Callable[[Config], ListSlices] | None = None) -> None:
        super().__init__("dra-slices")
        self.cfg = cfg
        self.deliver = deliver
        self._lister_for = lister or api_lister
        self._lister: ListSlices | None = None

    def turn(self) -> float:
        dra = self.cfg.dra
        if dra is None or self.cfg.kubernetes is None:
            return 5.0
        if self._lister is None:
            self._lister = self._lister_for(self.cfg)
        seen = read_slices(self.cfg, self._lister)
        if not self.halted:
            self.deliver(SlicesSeen(seen))
        return dra.interval

    def reconfigure(self, cfg: Config) -> None:
        self.cfg = cfg
        self.wake()


def api_lister(cfg: Config) -> ListSlices:
    from nodeagent.kube.api import Counters, api_client

    kcfg = cfg.kubernetes
    assert kcfg is not None
    return slice_lister(api_client(kcfg, kcfg.request_timeout), Counters())
