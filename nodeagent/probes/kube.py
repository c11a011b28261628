"""Read the Kubernetes objects the device-plugin check needs. Read-only.

`KubeReader` reads them once (three GETs: the CLI's one-shot check); the daemon's
`WatchingReader` keeps them current with watches, so its steady state costs no list.

Runs on the device-plugin thread, never on the netlink loop: an API server that is slow or
down only makes the RDMADevicePluginReady facts Unknown.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from nodeagent.config import DevicePlugin
from nodeagent.kubeapi import Counters, WatchStream, call, watch
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
            # Every pod on this node: the plugin's, and those that would use the fabric.
            pods = call(self.api, self.counters, "GET", "/api/v1/pods",
                        query=[("fieldSelector", f"spec.nodeName={self.node}")])
        except Exception as exc:  # ApiException, timeouts, refused connections
            return DevicePluginObservation(error=describe(exc))
        items = pods.get("items", [])
        return DevicePluginObservation(node=node, daemonset=ds, pods=plugin_pods(items, dp),
                                       node_pods=items)


def plugin_pods(pods: list[dict[str, Any]], dp: DevicePlugin) -> list[dict[str, Any]]:
    """The plugin DaemonSet's pods among a node's pods (a pod being deleted is leaving)."""
    return [p for p in pods
            if p.get("metadata", {}).get("namespace") == dp.namespace
            and not p.get("metadata", {}).get("deletionTimestamp")
            and any(o.get("kind") == "DaemonSet" and o.get("name") == dp.daemonset
                    for o in p.get("metadata", {}).get("ownerReferences", []))]


class WatchedCollection(threading.Thread):
    """One collection (the pods on this node, one DaemonSet, this Node, Leases) kept
    current by a list and then watches that resume from the last resourceVersion: in steady
    state no list at all, one watch request per `renew` seconds. `on_change` is called after
    every change and every connectivity change, from this thread."""

    def __init__(self, api: k8s.ApiClient, counters: Counters, path: str,
                 query: list[tuple[str, str]], on_change: Callable[[], None],
                 renew: float = 300.0) -> None:
        super().__init__(name=f"watch {path}", daemon=True)
        self.api, self.counters, self.path = api, counters, path
        self.query = query  # selectors
        self.on_change = on_change
        self.renew = renew
        self.items: dict[str, dict[str, Any]] = {}  # by namespace/name
        self.error: str | None = None
        self.synced = threading.Event()  # the first list has arrived (or failed)
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._stream: WatchStream | None = None

    def snapshot(self) -> tuple[list[dict[str, Any]], str | None]:
        with self._lock:
            return list(self.items.values()), self.error

    def stop(self) -> None:
        self._halt.set()
        stream = self._stream
        if stream is not None:
            stream.close()  # else the open watch holds its connection until it times out

    def _set(self, items: dict[str, dict[str, Any]] | None = None,
             error: str | None = None) -> None:
        with self._lock:
            if items is not None:
                self.items = items
            changed = items is not None or error != self.error
            self.error = error
        self.synced.set()
        if changed:
            self.on_change()

    def run(self) -> None:
        rv: str | None = None
        backoff = 0.5
        query = self.query
        while not self._halt.is_set():
            try:
                if rv is None:
                    listed = call(self.api, self.counters, "GET", self.path, query=query)
                    rv = listed["metadata"]["resourceVersion"]
                    self._set({_key(i): i for i in listed.get("items", [])})
                resume = [("resourceVersion", str(rv)), ("allowWatchBookmarks", "true"),
                          ("timeoutSeconds", str(int(self.renew)))]
                events = self._stream = watch(self.api, self.counters, self.path,
                                              [*query, *resume], timeout=self.renew + 30)
                if self.error:
                    self._set(error=None)  # connected again
                backoff = 0.5
                for event in events:
                    if self._halt.is_set():
                        return
                    rv = self._apply(event, rv)
                    if rv is None:
                        break  # 410 Gone: too old to resume, list again
            except Exception as exc:  # ApiException, refused, timeouts, a broken stream
                if isinstance(exc, ApiException) and exc.status == 410:
                    rv = None
                self._set(error=describe(exc))
                self._halt.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _apply(self, event: dict[str, Any], rv: str) -> str | None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                return None
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        new_rv: str = obj.get("metadata", {}).get("resourceVersion") or rv
        if kind == "BOOKMARK":
            return new_rv
        name = _key(obj)
        with self._lock:
            items = dict(self.items)
        if kind == "DELETED":
            items.pop(name, None)
        else:  # ADDED, MODIFIED
            items[name] = obj
        self._set(items)
        return new_rv


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta['name']}"  # names repeat across namespaces


class WatchingReader:
    """The device plugin's objects from three watched collections: after the first lists,
    an observation costs no API request at all."""

    def __init__(self, api: k8s.ApiClient, node: str, dp: DevicePlugin,
                 on_change: Callable[[], None], renew: float = 300.0) -> None:
        self.counters = Counters()
        self.dp = dp
        ns = dp.namespace
        self.nodes = WatchedCollection(api, self.counters, "/api/v1/nodes",
                                       [("fieldSelector", f"metadata.name={node}")],
                                       on_change, renew)
        self.daemonsets = WatchedCollection(
            api, self.counters, f"/apis/apps/v1/namespaces/{ns}/daemonsets",
            [("fieldSelector", f"metadata.name={dp.daemonset}")], on_change, renew)
        self.pods = WatchedCollection(api, self.counters, "/api/v1/pods",
                                      [("fieldSelector", f"spec.nodeName={node}")],
                                      on_change, renew)
        self.collections = (self.nodes, self.daemonsets, self.pods)
        for c in self.collections:
            c.start()

    def device_plugin(self, dp: DevicePlugin, wait: float = 10.0) -> DevicePluginObservation:
        if dp != self.dp:
            raise ValueError("device_plugin settings changed: make a new WatchingReader")
        for c in self.collections:
            if not c.synced.wait(wait):
                return DevicePluginObservation(error="no answer from the API server yet")
        (nodes, node_err), (dss, ds_err), (pods, pod_err) = (c.snapshot()
                                                             for c in self.collections)
        error = node_err or ds_err or pod_err
        if error:
            return DevicePluginObservation(error=error)
        return DevicePluginObservation(node=nodes[0] if nodes else None,
                                       daemonset=dss[0] if dss else None,
                                       pods=plugin_pods(pods, dp), node_pods=pods)

    def stop(self) -> None:
        for c in self.collections:
            c.stop()
