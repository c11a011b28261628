"""The DRA thread, every `dra.interval`: this node's ResourceSlices of the configured driver
(one request, filtered by the API server on spec.nodeName and spec.driver, served from its
watch cache), and who holds which device: this node's pods (one request, filtered on
spec.nodeName, from the watch cache) and the ResourceClaims they name, each read once (an
allocation does not change while a pod holds it). Both handed to the loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nodeagent.checks.facts import ClaimsSeen, SlicesSeen
from nodeagent.config import Config
from nodeagent.io.files import printable
from nodeagent.io.periodic import Periodic
from nodeagent.kube.claims import allocated, node_pods
from nodeagent.kube.slices import node_devices
from nodeagent.model.kube import ClaimsObservation, DeviceRef, Lending, SlicesObservation
from nodeagent.run.work import Deliver

PATH = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}"

ListSlices = Callable[[str, str], list[Any]]
Get = Callable[[str, list[tuple[str, str]]], dict[str, Any]]  # path, query -> object


def _getter(api: Any, counters: Any) -> Get:
    from nodeagent.kube.api import call

    return lambda path, query: call(api, counters, "GET", path, query=query)


def slice_lister(api: Any, counters: Any) -> ListSlices:
    return slice_lister_from(_getter(api, counters))


def _error(exc: Exception) -> str:
    from nodeagent.kube.api import api_error_text

    return printable(api_error_text(exc))[:300]


def read_slices(cfg: Config, lister: ListSlices) -> SlicesObservation:
    assert cfg.dra is not None
    node, driver = cfg.resolved_node_name(), cfg.dra.driver
    try:
        return node_devices(lister(node, driver), node, driver)
    except Exception as exc:  # ApiException, the API down: the condition says it
        return SlicesObservation(error=_error(exc))


class ClaimReader:
    """Who holds which device on a node. A claim is read when a pod first names it and
    kept while that pod does (an allocation cannot change while a pod holds the claim;
    a claim deleted and made again under its name, for a new pod, is read again); one
    not allocated yet is asked again at the next read."""

    def __init__(self, get: Get) -> None:
        self._get = get
        # (pod uid, claim namespace/name) -> its devices
        self._claims: dict[tuple[str, str], tuple[DeviceRef, ...]] = {}

    def read(self, node: str) -> ClaimsObservation:
        try:
            got = self._get("/api/v1/pods", [("fieldSelector", f"spec.nodeName={node}"),
                                             ("resourceVersion", "0")])
            live, held = node_pods(got.get("items") or [])
            lendings: list[Lending] = []
            for pod in held:
                for claim in pod.claims:
                    lendings.extend(Lending(d, pod.pod, claim)
                                    for d in self._devices(pod.uid, claim))
        except Exception as exc:  # the API down, 403: the lent rails' holders unknown
            return ClaimsObservation(error=_error(exc))
        named = {(pod.uid, c) for pod in held for c in pod.claims}
        self._claims = {k: d for k, d in self._claims.items() if k in named}
        return ClaimsObservation(tuple(lendings), live)

    def _devices(self, pod_uid: str, claim: str) -> tuple[DeviceRef, ...]:
        key = (pod_uid, claim)
        if key in self._claims:
            return self._claims[key]
        from nodeagent.kube.api import is_not_found

        namespace, name = claim.split("/", 1)
        try:
            devices = allocated(self._get(CLAIMS.format(namespace, name), []))
        except Exception as exc:
            if is_not_found(exc):  # named by the pod, not made yet
                return ()
            raise
        if devices:
            self._claims[key] = devices
        return devices


class DraReader:
    """What the DRA thread reads, through one API client made on first use."""

    def __init__(self, cfg: Config) -> None:
        from nodeagent.kube.api import Counters, api_client

        kcfg = cfg.kubernetes
        assert kcfg is not None
        get = _getter(api_client(kcfg, kcfg.request_timeout), Counters())
        self.slices = slice_lister_from(get)
        self.claims = ClaimReader(get)


def slice_lister_from(get: Get) -> ListSlices:
    def list_slices(node: str, driver: str) -> list[Any]:
        page = get(PATH, [("fieldSelector", f"spec.nodeName={node},spec.driver={driver}"),
                          ("resourceVersion", "0")]).get("items")
        return page if isinstance(page, list) else []

    return list_slices


class SlicesMonitor(Periodic):
    def __init__(self, cfg: Config, deliver: Deliver,
                 reader: Callable[[Config], DraReader] | None = None) -> None:
        super().__init__("dra-slices")
        self.cfg = cfg
        self.deliver = deliver
        self._reader_for = reader or DraReader
        self._reader: DraReader | None = None

    def turn(self) -> float:
        dra = self.cfg.dra
        if dra is None or self.cfg.kubernetes is None:
            return 5.0
        if self._reader is None:
            self._reader = self._reader_for(self.cfg)
        seen = read_slices(self.cfg, self._reader.slices)
        claims = self._reader.claims.read(self.cfg.resolved_node_name())
        if not self.halted:
            self.deliver(SlicesSeen(seen))
            self.deliver(ClaimsSeen(claims))
        return dra.interval

    def reconfigure(self, cfg: Config) -> None:
        self.cfg = cfg
        self.wake()


def api_lister(cfg: Config) -> ListSlices:
    return DraReader(cfg).slices
