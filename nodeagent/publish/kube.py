"""Kubernetes writes for one Node: conditions, taint, cordon, Events, Lease.

The only module that talks to the API server. Every call has a timeout; 409 conflicts on
the taint/cordon read-modify-write are retried (tenacity: jittered exponential backoff,
bounded). Bodies are plain dicts and responses are read as JSON, without the client's
model classes: less memory, and what is sent is exactly what is written here.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from nodeagent.config import Kubernetes
from nodeagent.publish.node import CORDON_ANNOTATION, cordon_patch, desired_taints

log = logging.getLogger(__name__)

TIMEOUT = (3.0, 10.0)  # connect, read (seconds): a dead API server must not hang the writer
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def api_client(cfg: Kubernetes) -> k8s.ApiClient:
    """An ApiClient from the configured kubeconfig, else in-cluster, else $KUBECONFIG."""
    conf = k8s.Configuration()
    if cfg.kubeconfig:
        k8s_config.load_kube_config(config_file=cfg.kubeconfig, client_configuration=conf)
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=conf)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(client_configuration=conf)
    conf.retries = False  # the publisher retries itself, with the newest state
    return k8s.ApiClient(conf)


def is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status == 409


def _json(resp: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(resp.data or b"{}")
    return data


@dataclass
class Counters:
    requests: int = 0
    writes: int = 0
    conflicts: int = 0
    errors: int = 0
    events_dropped: int = 0


@dataclass
class NodeWriter:
    api: k8s.ApiClient
    node: str
    cfg: Kubernetes
    counters: Counters = field(default_factory=Counters)
    _lease_rv: str | None = None
    _tokens: float = 0.0
    _tokens_at: float = 0.0

    def __post_init__(self) -> None:
        self.core = k8s.CoreV1Api(self.api)
        self.coord = k8s.CoordinationV1Api(self.api)
        self._tokens = float(self.cfg.event_burst)
        self._tokens_at = time.monotonic()

    # ------------------------------------------------------------ reads

    def read_node(self) -> dict[str, Any]:
        self.counters.requests += 1
        return _json(self.core.read_node(self.node, _preload_content=False,
                                         _request_timeout=TIMEOUT))

    # ------------------------------------------------------------ writes

    def patch_conditions(self, conditions: list[dict[str, Any]]) -> None:
        """Strategic merge on nodes/status: conditions merge by type, others untouched."""
        self.counters.requests += 1
        self.counters.writes += 1
        self.core.patch_node_status(self.node, {"status": {"conditions": conditions}},
                                    _content_type=STRATEGIC, _preload_content=False,
                                    _request_timeout=TIMEOUT)

    def sync_taint_and_cordon(
        self, taint_value: str | None, cordon: bool, reason: str
    ) -> list[str]:
        """Make our taint (and cordon) match; returns what changed, for Events.

        Read-modify-write with a resourceVersion precondition: a concurrent writer's change
        makes ours fail with 409, and we retry on the fresh object, so no taint we do not
        own is ever dropped or reordered.
        """

        @retry(retry=retry_if_exception(is_conflict), reraise=True,
               wait=wait_random_exponential(multiplier=0.02, max=1.0),
               stop=stop_after_attempt(12))
        def attempt() -> list[str]:
            node = self.read_node()
            spec = node.get("spec", {})
            meta = node.get("metadata", {})
            taints = desired_taints(spec.get("taints") or [], self.cfg.taint.key,
                                    self.cfg.taint.effect, taint_value)
            cordon_change = None
            if self.cfg.cordon or CORDON_ANNOTATION in (meta.get("annotations") or {}):
                cordon_change = cordon_patch(bool(spec.get("unschedulable")),
                                             meta.get("annotations") or {},
                                             self.cfg.cordon and cordon, reason)
            if taints is None and cordon_change is None:
                return []
            body: dict[str, Any] = {"metadata": {"resourceVersion": meta["resourceVersion"]}}
            changed: list[str] = []
            if taints is not None:
                body["spec"] = {"taints": taints}
                changed.append(f"taint {self.cfg.taint.key}="
                               f"{taint_value}:{self.cfg.taint.effect}" if taint_value
                               else f"taint {self.cfg.taint.key} removed")
            if cordon_change is not None:
                body.setdefault("spec", {}).update(cordon_change.get("spec", {}))
                body["metadata"].update(cordon_change["metadata"])
                changed.append("cordoned" if cordon_change.get("spec", {}).get("unschedulable")
                               else "uncordoned")
            self.counters.requests += 1
            self.counters.writes += 1
            try:
                self.core.patch_node(self.node, body, _content_type=MERGE,
                                     _preload_content=False, _request_timeout=TIMEOUT)
            except ApiException as exc:
                if exc.status == 409:
                    self.counters.conflicts += 1
                raise
            return changed

        return attempt()

    def event(self, node_uid: str | None, reason: str, message: str, warning: bool) -> bool:
        """Record an Event on the Node, unless the rate limit says the API has had enough."""
        now = time.monotonic()
        self._tokens = min(float(self.cfg.event_burst),
                           self._tokens + (now - self._tokens_at) * self.cfg.event_rate)
        self._tokens_at = now
        if self._tokens < 1.0:
            self.counters.events_dropped += 1
            return False
        self._tokens -= 1.0
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "metadata": {"generateName": f"{self.node}.nodeagent."},
            "involvedObject": {"kind": "Node", "name": self.node, "apiVersion": "v1",
                               **({"uid": node_uid} if node_uid else {})},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "nodeagent", "host": self.node},
            "reportingComponent": "nodeagent",
            "reportingInstance": self.node,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self.counters.requests += 1
        self.counters.writes += 1
        # Plain dicts: the client coerces them into its models (its stubs say models only).
        self.core.create_namespaced_event("default", body, _preload_content=False,  # type: ignore[arg-type]
                                          _request_timeout=TIMEOUT)
        return True

    def renew_lease(self) -> None:
        """The heartbeat: one write per period (a read only after a conflict or at start)."""
        name = f"nodeagent-{self.node}"
        ns = self.cfg.lease_namespace
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        spec = {"holderIdentity": self.node, "renewTime": now,
                "leaseDurationSeconds": max(1, int(3 * self.cfg.lease_period))}
        self.counters.requests += 1
        self.counters.writes += 1
        try:
            if self._lease_rv is None:
                raise ApiException(status=409)  # unknown version: read first
            resp = self.coord.replace_namespaced_lease(
                name, ns, {"metadata": {"name": name, "resourceVersion": self._lease_rv},  # type: ignore[arg-type]
                           "spec": spec},
                _preload_content=False, _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status != 409:
                self._lease_rv = None
                raise
            self.counters.requests += 1
            try:
                current = _json(self.coord.read_namespaced_lease(
                    name, ns, _preload_content=False, _request_timeout=TIMEOUT))
            except ApiException as missing:
                if missing.status != 404:
                    raise
                resp = self.coord.create_namespaced_lease(
                    ns, {"metadata": {"name": name}, "spec": spec},  # type: ignore[arg-type]
                    _preload_content=False, _request_timeout=TIMEOUT)
            else:
                rv = current["metadata"]["resourceVersion"]
                resp = self.coord.replace_namespaced_lease(
                    name, ns, {"metadata": {"name": name, "resourceVersion": rv}, "spec": spec},  # type: ignore[arg-type]
                    _preload_content=False, _request_timeout=TIMEOUT)
        self._lease_rv = _json(resp)["metadata"]["resourceVersion"]
