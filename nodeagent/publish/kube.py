"""Kubernetes writes for one Node: conditions, taint, cordon, Events, Lease.

The only module that writes to the API server (requests go through nodeagent.kube.api:
plain JSON, a timeout on every call). 409 conflicts on the taint/cordon
read-modify-write are retried (tenacity: jittered exponential backoff, bounded).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from nodeagent.config import Kubernetes
from nodeagent.kube.api import Counters, call, is_conflict
from nodeagent.kube.nodeview import read_node
from nodeagent.kube.peercard import lease_name
from nodeagent.publish.node import Changed, NodeChange, spec_changes

log = logging.getLogger(__name__)

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


@dataclass
class NodeWriter:
    api: k8s.ApiClient
    node: str
    cfg: Kubernetes
    counters: Counters = field(default_factory=Counters)
    # resourceVersions our own Node writes produced: a watch event carrying one is our echo
    own_versions: deque[str] = field(default_factory=lambda: deque(maxlen=16))
    _lease_rv: str | None = None
    _tokens: float = 0.0
    _tokens_at: float = 0.0

    def __post_init__(self) -> None:
        self._tokens = float(self.cfg.event_burst)
        self._tokens_at = time.monotonic()

    def _call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> dict[str, Any]:
        return call(self.api, self.counters, method, path, body, content_type)

    # ------------------------------------------------------------ reads

    def read_node(self) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/nodes/{self.node}")

    # ------------------------------------------------------------ writes

    def _remember(self, node: dict[str, Any]) -> None:
        rv = node.get("metadata", {}).get("resourceVersion")
        if isinstance(rv, str):
            self.own_versions.append(rv)

    def patch_conditions(self, conditions: list[dict[str, Any]]) -> None:
        """Strategic merge on nodes/status: conditions merge by type, others untouched."""
        self._remember(self._call("PATCH", f"/api/v1/nodes/{self.node}/status",
                                  {"status": {"conditions": conditions}}, STRATEGIC))

    def sync_taint_and_cordon(
        self, taint_value: str | None, cordon: bool, reason: str,
        node: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
    ) -> list[NodeChange]:
        """Make our taint (and cordon) match; returns what changed, for Events.

        Read-modify-write with a resourceVersion precondition: a concurrent writer's change
        makes ours fail with 409, and we retry on the fresh object, so no taint we do not
        own is ever dropped or reordered. `node`, when given, is a fresh read that saves
        the first GET.
        """
        fresh = [node] if node is not None else []

        @retry(retry=retry_if_exception(is_conflict), reraise=True,
               wait=wait_random_exponential(multiplier=0.02, max=1.0),
               stop=stop_after_attempt(12))
        def attempt() -> list[NodeChange]:
            node = read_node(fresh.pop() if fresh else self.read_node())
            taint = self.cfg.taint
            want = spec_changes(node, (taint.key, taint.effect) if taint else None,
                                taint_value, self.cfg.cordon, cordon, reason, labels)
            if not want:
                return []
            taints, cordon_change, relabel = want.taints, want.cordon, want.labels
            body: dict[str, Any] = {"metadata": {"resourceVersion": node.resource_version}}
            changed: list[NodeChange] = []
            if relabel:
                body["metadata"]["labels"] = relabel
                changed.append(NodeChange(Changed.LABELS, "labels " + ", ".join(
                    f"{k}={v}" if v is not None else f"{k} removed"
                    for k, v in sorted(relabel.items()))))
            if taints is not None and taint is not None:
                body["spec"] = {"taints": taints}
                changed.append(NodeChange(Changed.TAINT,
                                          f"taint {taint.key}={taint_value}:{taint.effect}"
                                          if taint_value else f"taint {taint.key} removed"))
            if cordon_change is not None:
                body.setdefault("spec", {}).update(cordon_change.get("spec", {}))
                body["metadata"].update(cordon_change["metadata"])
                cordoned = cordon_change.get("spec", {}).get("unschedulable")
                changed.append(NodeChange(Changed.CORDON,
                                          "cordoned" if cordoned else "uncordoned"))
            self._remember(self._call("PATCH", f"/api/v1/nodes/{self.node}", body, MERGE))
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
        involved: dict[str, Any] = {"kind": "Node", "name": self.node, "apiVersion": "v1"}
        if node_uid:
            involved["uid"] = node_uid
        self._call("POST", "/api/v1/namespaces/default/events", {
            "metadata": {"generateName": f"{self.node}.nodeagent."},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "nodeagent", "host": self.node},
            "reportingComponent": "nodeagent",
            "reportingInstance": self.node,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        })
        return True

    def renew_lease(self, labels: dict[str, str] | None = None,
                    annotations: dict[str, str] | None = None) -> None:
        """The heartbeat: one write per period (a read only after a conflict or at start).
        With a peers section the Lease also carries the agent's peer card and its probes'
        verdicts (kube/peercard.py)."""
        name = lease_name(self.node)
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.cfg.lease_namespace}/leases"
        now = time.time()
        spec = {
            "holderIdentity": self.node,
            "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
            + f".{int(now % 1 * 1e6):06d}Z",
            "leaseDurationSeconds": max(1, int(self.cfg.lease_seconds())),
        }

        def body(rv: str | None) -> dict[str, Any]:
            meta: dict[str, Any] = {"name": name}
            if labels:
                meta["labels"] = labels
            if annotations:
                meta["annotations"] = annotations
            if rv:
                meta["resourceVersion"] = rv
            return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": meta, "spec": spec}

        try:
            if self._lease_rv is None:
                raise ApiException(status=409)  # version unknown (start, or after an error)
            got = self._call("PUT", f"{path}/{name}", body(self._lease_rv))
        except ApiException as exc:
            if exc.status != 409:
                self._lease_rv = None
                raise
            try:
                current = self._call("GET", f"{path}/{name}")
            except ApiException as missing:
                if missing.status != 404:
                    raise
                got = self._call("POST", path, body(None))
            else:
                got = self._call("PUT", f"{path}/{name}",
                                 body(current["metadata"]["resourceVersion"]))
        self._lease_rv = got["metadata"]["resourceVersion"]
