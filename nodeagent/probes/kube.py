"""Read the Kubernetes objects the device-plugin check needs. Read-only.

`KubeReader` reads them once (three GETs: the CLI's one-shot check); the daemon's
`WatchingReader` keeps them current with watches, so its steady state costs no list.

Runs on the device-plugin thread, never on the netlink loop: an API server that is slow or
down only makes the RDMADevicePluginReady facts Unknown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from nodeagent.config import DevicePlugin
from nodeagent.kube.api import Counters, call
from nodeagent.kube.objects import plugin_observation
from nodeagent.kube.watch import WatchedCollection, describe
from nodeagent.model.kube import DevicePluginObservation


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
            # Every pod on this node: the plugin's, and those that would use the fabric.
            pods = call(self.api, self.counters, "GET", "/api/v1/pods",
                        query=[("fieldSelector", f"spec.nodeName={self.node}")])
        except Exception as exc:  # ApiException, timeouts, refused connections
            return DevicePluginObservation(error=describe(exc))
        return plugin_observation(node, ds, pods.get("items", []), dp.namespace, dp.daemonset)


class WatchingReader:
    """The device plugin's objects from three watched collections: after the first lists,
    an observation costs no API request at all. `node_watch` gives the daemon's own watch
    of this Node (the publisher's), when there is one: then the reader opens two watches,
    not three, and follows that one (None from it: not made yet, no answer yet)."""

    def __init__(self, api: k8s.ApiClient, node: str, dp: DevicePlugin,
                 on_change: Callable[[], None], renew: float = 300.0,
                 node_watch: Callable[[], WatchedCollection | None] | None = None) -> None:
        self.counters = Counters()
        self.dp = dp
        self.on_change = on_change
        ns = dp.namespace
        self._shared = node_watch
        self._following: WatchedCollection | None = None  # the shared watch, listened to
        self.own_nodes = None if node_watch else WatchedCollection(
            api, self.counters, "/api/v1/nodes", [("fieldSelector", f"metadata.name={node}")],
            on_change, renew)
        self.daemonsets = WatchedCollection(
            api, self.counters, f"/apis/apps/v1/namespaces/{ns}/daemonsets",
            [("fieldSelector", f"metadata.name={dp.daemonset}")], on_change, renew)
        self.pods = WatchedCollection(api, self.counters, "/api/v1/pods",
                                      [("fieldSelector", f"spec.nodeName={node}")],
                                      on_change, renew)
        self.collections = tuple(c for c in (self.own_nodes, self.daemonsets, self.pods)
                                 if c is not None)  # the ones this reader runs
        for c in self.collections:
            c.start()

    def _nodes(self) -> WatchedCollection | None:
        if self._shared is None:
            return self.own_nodes
        watch = self._shared()
        if watch is not None and watch is not self._following:
            if self._following is not None:
                self._following.unlisten(self.on_change)
            watch.listen(self.on_change)
            self._following = watch
        return watch

    def device_plugin(self, dp: DevicePlugin, wait: float = 10.0) -> DevicePluginObservation:
        if dp != self.dp:
            raise ValueError("device_plugin settings changed: make a new WatchingReader")
        nodes_watch = self._nodes()
        if nodes_watch is None:
            return DevicePluginObservation(error="no answer from the API server yet")
        watches = (nodes_watch, self.daemonsets, self.pods)
        for c in watches:
            if not c.synced.wait(wait):
                return DevicePluginObservation(error="no answer from the API server yet")
        (nodes, node_err), (dss, ds_err), (pods, pod_err) = (c.snapshot() for c in watches)
        error = node_err or ds_err or pod_err
        if error:
            return DevicePluginObservation(error=error)
        return plugin_observation(nodes[0] if nodes else None, dss[0] if dss else None, pods,
                                  dp.namespace, dp.daemonset)

    def stop(self) -> None:
        for c in self.collections:
            c.stop()
        if self._following is not None:
            self._following.unlisten(self.on_change)
