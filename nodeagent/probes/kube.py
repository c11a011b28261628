"""Read the Kubernetes objects the device-plugin check needs. Read-only.

Runs on the device-plugin thread, never on the netlink loop: an API server that is slow or
down only makes the RDMADevicePluginReady facts Unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from nodeagent.config import DevicePlugin
from nodeagent.kubeapi import Counters, call
from nodeagent.model import DevicePluginObservation


def describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    return f"HTTP {status}" if status else (str(exc).splitlines() or [type(exc).__name__])[0]


@dataclass
class KubeReader:
    api: k8s.ApiClient
    node: str
    counters: Counters = field(default_factory=Counters)

    def device_plugin(self, dp: DevicePlugin) -> DevicePluginObservation:
        """This node, the plugin DaemonSet, and its pods here: three GETs."""
        try:
            node = call(self.api, self.counters, "GET", f"/api/v1/nodes/{self.node}")
            try:
                ds: dict[str, Any] | None = call(
                    self.api, self.counters, "GET",
                    f"/apis/apps/v1/namespaces/{dp.namespace}/daemonsets/{dp.daemonset}")
            except ApiException as exc:
                if exc.status != 404:
                    raise
                ds = None
            pods = call(self.api, self.counters, "GET", f"/api/v1/namespaces/{dp.namespace}/pods",
                        query=[("fieldSelector", f"spec.nodeName={self.node}")])
        except Exception as exc:  # ApiException, timeouts, refused connections
            return DevicePluginObservation(error=describe(exc))
        ours = [p for p in pods.get("items", [])
                if not p.get("metadata", {}).get("deletionTimestamp")  # leaving: not the plugin
                and any(o.get("kind") == "DaemonSet" and o.get("name") == dp.daemonset
                       for o in p.get("metadata", {}).get("ownerReferences", []))]
        return DevicePluginObservation(node=node, daemonset=ds, pods=ours)
