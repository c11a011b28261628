"""A Node as the API returned it, parsed once into typed fields. Pure.

The publisher, `fleet` and `preflight --verdict api` read the same Node fields; each used
to walk the JSON itself. A field of the wrong shape reads as absent (the Node is every
writer's data, not only ours), never as a crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent.kube.fields import items, obj, quantity, text


@dataclass(frozen=True)
class NodeCondition:
    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition: str = ""  # RFC 3339, as the API wrote it
    last_heartbeat: str = ""


@dataclass(frozen=True)
class NodeView:
    name: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    # The taints exactly as written, every writer's: a rebuilt list keeps the others' whole
    # and in place (spec.taints has no merge key).
    taints: tuple[Mapping[str, Any], ...] = ()
    conditions: tuple[NodeCondition, ...] = ()
    capacity: Mapping[str, int] = field(default_factory=dict)  # extended resources, counts
    allocatable: Mapping[str, int] = field(default_factory=dict)

    def condition(self, ctype: str) -> NodeCondition | None:
        return next((c for c in self.conditions if c.type == ctype), None)

    def taint(self, key: str) -> Mapping[str, Any] | None:
        return next((t for t in self.taints if t.get("key") == key), None)


def read_node(raw: Any) -> NodeView:
    node = obj(raw)
    meta, spec, status = (obj(node.get(k)) for k in ("metadata", "spec", "status"))
    conditions = []
    for c in map(obj, items(status.get("conditions"))):
        if text(c.get("type")):
            conditions.append(NodeCondition(
                text(c.get("type")), text(c.get("status")), text(c.get("reason")),
                text(c.get("message")), text(c.get("lastTransitionTime")),
                text(c.get("lastHeartbeatTime"))))
    return NodeView(
        name=text(meta.get("name")), uid=text(meta.get("uid")),
        resource_version=text(meta.get("resourceVersion")),
        labels=_strings(meta.get("labels")), annotations=_strings(meta.get("annotations")),
        unschedulable=spec.get("unschedulable") is True,
        taints=tuple(t for t in items(spec.get("taints")) if isinstance(t, dict)),
        conditions=tuple(conditions),
        capacity={str(k): quantity(v) for k, v in obj(status.get("capacity")).items()},
        allocatable={str(k): quantity(v) for k, v in obj(status.get("allocatable")).items()})


def _strings(value: Any) -> dict[str, str]:
    return {str(k): v for k, v in obj(value).items() if isinstance(v, str)}
