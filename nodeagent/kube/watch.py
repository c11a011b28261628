"""One collection of Kubernetes objects kept current: a list, then watches that resume
from the last resourceVersion (bookmarks on; a 410 lists again)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from nodeagent.kube.api import Counters, WatchStream, api_error_text, call, watch
from nodeagent.kube.backoff import Backoff


def describe(exc: BaseException) -> str:
    return api_error_text(exc)


class WatchedCollection(threading.Thread):
    """One collection (the pods on this node, one DaemonSet, this Node, Leases) kept
    current by a list and then watches that resume from the last resourceVersion: in steady
    state no list at all, one watch request per `renew` seconds. `on_change`, and every
    callback given to `listen` (one watch serves several readers), is called after every
    change and every connectivity change, from this thread."""

    def __init__(self, api: k8s.ApiClient, counters: Counters, path: str,
                 query: list[tuple[str, str]], on_change: Callable[[], None],
                 renew: float = 300.0) -> None:
        super().__init__(name=f"watch {path}", daemon=True)
        self.api, self.counters, self.path = api, counters, path
        self.query = query  # selectors
        self._listeners = [on_change]
        self.renew = renew
        self.items: dict[str, dict[str, Any]] = {}  # by namespace/name
        self.error: str | None = None
        self.synced = threading.Event()  # the first list has arrived (or failed)
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._stream: WatchStream | None = None

    def listen(self, on_change: Callable[[], None]) -> None:
        with self._lock:
            self._listeners = [*self._listeners, on_change]

    def unlisten(self, on_change: Callable[[], None]) -> None:
        with self._lock:
            self._listeners = [c for c in self._listeners if c is not on_change]

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
            listeners = self._listeners
        self.synced.set()
        if changed:
            for on_change in listeners:
                on_change()

    def run(self) -> None:
        rv: str | None = None
        backoff = Backoff()
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
                for event in events:
                    if self._halt.is_set():
                        return
                    rv = self._apply(event, rv)
                    if rv is None:
                        break  # 410 Gone: too old to resume, list again
                    # Reset only once a watch delivers: a server that connects and ends
                    # every watch with an ERROR 410 would else be listed in a tight loop.
                    backoff.reset()
                if rv is None:
                    self._halt.wait(backoff.next())
            except Exception as exc:  # ApiException, refused, timeouts, a broken stream
                if isinstance(exc, ApiException) and exc.status == 410:
                    rv = None
                self._set(error=describe(exc))
                self._halt.wait(backoff.next())

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
