"""Kubernetes API objects (plain JSON) parsed once into the small typed facts the checks
read (model.PodFacts, DaemonSetFacts, NodeFacts). Pure. A field of the wrong type reads as
absent: an object the API server accepted is well formed, but a proxy or a fake may not be.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nodeagent.model.kube import (
    ContainerFacts,
    DaemonSetFacts,
    DevicePluginObservation,
    NodeFacts,
    PodFacts,
    Termination,
    Toleration,
)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _text(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else (str(value) if isinstance(value, int)
                                                 else default)


def _count(value: Any) -> int:
    try:
        return max(0, int(value)) if not isinstance(value, bool) else 0
    except (TypeError, ValueError, OverflowError):  # OverflowError: a float inf
        return 0


def _termination(state: Any) -> Termination | None:
    term = _map(state).get("terminated")
    if not isinstance(term, Mapping):
        return None
    return Termination(_text(term.get("reason"), "?"), _text(term.get("exitCode"), "?"),
                       _text(term.get("finishedAt"), "?"), _text(term.get("message")))


def _resources(container: Mapping[str, Any]) -> frozenset[str]:
    res = _map(container.get("resources"))
    return frozenset(str(k) for part in ("limits", "requests") for k in _map(res.get(part)))


def parse_tolerations(items: Any) -> tuple[Toleration, ...]:
    return tuple(Toleration(_text(t.get("key")), _text(t.get("operator"), "Equal") or "Equal",
                            _text(t.get("effect"))) for t in _list(items))


def parse_pod(obj: Mapping[str, Any]) -> PodFacts:
    meta, spec, status = (_map(obj.get(k)) for k in ("metadata", "spec", "status"))
    statuses = {_text(cs.get("name")): cs for cs in _list(status.get("containerStatuses"))}
    specs = {_text(c.get("name")): c for c in _list(spec.get("containers"))}
    containers = []
    for name in dict.fromkeys([*specs, *statuses]):  # spec order; a status-only one last
        c, cs = specs.get(name, {}), statuses.get(name)
        reported = cs is not None
        cs = cs or {}
        containers.append(ContainerFacts(
            name=name, spec_image=_text(c.get("image")), reported=reported,
            image=_text(cs.get("image")), image_id=_text(cs.get("imageID")),
            restarts=_count(cs.get("restartCount")),
            waiting=_text(_map(_map(cs.get("state")).get("waiting")).get("reason")),
            terminated=_termination(cs.get("state")),
            last_terminated=_termination(cs.get("lastState")),
            resources=_resources(c)))
    ready = next((c for c in _list(status.get("conditions")) if c.get("type") == "Ready"), {})
    return PodFacts(
        namespace=_text(meta.get("namespace")), name=_text(meta.get("name")),
        uid=_text(meta.get("uid")), created=_text(meta.get("creationTimestamp")),
        phase=_text(status.get("phase")), ready=ready.get("status") == "True",
        ready_changed=_text(ready.get("lastTransitionTime")),
        deleting=bool(meta.get("deletionTimestamp")),
        owners=tuple((_text(o.get("kind")), _text(o.get("name")))
                     for o in _list(meta.get("ownerReferences"))),
        containers=tuple(containers),
        init_resources=frozenset().union(*(_resources(c)
                                           for c in _list(spec.get("initContainers")))))


def parse_daemonset(obj: Mapping[str, Any]) -> DaemonSetFacts:
    meta = _map(obj.get("metadata"))
    template = _map(_map(_map(obj.get("spec")).get("template")).get("spec"))
    images = (_text(c.get("image")) for c in _list(template.get("containers")))
    return DaemonSetFacts(_text(meta.get("namespace")), _text(meta.get("name")),
                          parse_tolerations(template.get("tolerations")),
                          tuple(i for i in dict.fromkeys(images) if i))


def parse_node(obj: Mapping[str, Any]) -> NodeFacts:
    status = _map(obj.get("status"))
    info = _map(status.get("nodeInfo"))
    return NodeFacts(_text(_map(obj.get("metadata")).get("name")),
                     _text(info.get("operatingSystem")), _text(info.get("architecture")),
                     {str(k): _text(v) for k, v in _map(status.get("allocatable")).items()},
                     {str(k): _text(v) for k, v in _map(status.get("capacity")).items()})


def plugin_pods(pods: Iterable[PodFacts], namespace: str, daemonset: str) -> tuple[PodFacts, ...]:
    """The plugin DaemonSet's pods among a node's pods (a pod being deleted is leaving)."""
    return tuple(p for p in pods if p.namespace == namespace and not p.deleting
                 and ("DaemonSet", daemonset) in p.owners)


def plugin_observation(node: Mapping[str, Any] | None = None,
                       daemonset: Mapping[str, Any] | None = None,
                       pods: Iterable[Mapping[str, Any]] = (),
                       namespace: str = "", name: str = "",
                       **rest: Any) -> DevicePluginObservation:
    """The observation from the API objects as read: this node, the plugin's DaemonSet
    (None: not found), every pod on this node. With `namespace` and `name` (the
    DaemonSet's) the plugin's pods are picked out of them; without, every pod given is."""
    node_pods = tuple(parse_pod(p) for p in pods if isinstance(p, Mapping))
    mine = plugin_pods(node_pods, namespace, name) if name else node_pods
    return DevicePluginObservation(
        node=parse_node(node) if node is not None else None,
        daemonset=parse_daemonset(daemonset) if daemonset is not None else None,
        pods=mine, node_pods=node_pods, **rest)
