"""What the Node should look like, computed from findings. Pure: no API calls here.

- Conditions merge by type: other writers' conditions are never part of what we send, and
  lastTransitionTime moves only when a condition's status changes (a restart re-reads the
  Node and keeps it, unlike node-problem-detector).
- The taint is present exactly while FabricReady is not True, after hysteresis: a failure
  taints at once, a recovery lifts it only after `clear_after` of continuous health.
- Taint lists are rebuilt whole (spec.taints has no merge key): every taint we do not own
  stays, in its place.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodeagent.kube.nodeview import NodeCondition, NodeView
from nodeagent.model.conditions import FABRIC_READY, ConditionType, Finding
from nodeagent.model.kube import FINGERPRINT_LABELS, SWITCH_LABEL_PREFIX
from nodeagent.model.status import rfc3339

CORDON_ANNOTATION = "nodeagent.io/cordoned"  # value: why the agent cordoned the node
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]")


class Changed(enum.Enum):
    LABELS = "labels"
    TAINT = "taint"
    CORDON = "cordon"


@dataclass(frozen=True)
class NodeChange:
    """One change a write made to the Node: what it was, and its line for the Event."""

    what: Changed
    text: str


def taint_value(reason: str) -> str:
    """A label-value-safe form of a reason: <= 63 chars, alphanumeric at both ends."""
    value = _LABEL_VALUE_BAD.sub("-", reason)[:63]
    return value.strip("._-") or "FabricNotReady"


def label_patch(current: Mapping[str, str], ours: Iterable[str],
                desired: Mapping[str, str]) -> dict[str, str | None]:
    """The merge-patch labels that make our labels (`ours`) match `desired`; {} if they do.
    None deletes a label we set that no longer applies; other labels are never touched."""
    patch: dict[str, str | None] = {}
    for key in ours:
        want = desired.get(key)
        if current.get(key) != want:
            patch[key] = want
    return patch


_OURS = frozenset(ConditionType)


def condition_updates(
    existing: Sequence[NodeCondition], findings: Iterable[Finding], now: float,
    since: Mapping[str, float] | None = None, every: bool = False,
) -> list[dict[str, Any]]:
    """The findings' conditions that differ from the Node's; [] when nothing changed (with
    `every`, all of them: a heartbeat refreshes each one's lastHeartbeatTime). Every finding
    of our types is published (the registry, checks/conditions.py, registers each member
    of ConditionType, and the admission policy allows exactly those); another writer's
    type (the kubelet's Ready) is never written.

    Only changed conditions are returned, so steady state writes nothing. A status the
    Node does not show yet takes its transition time from `since` (when the agent saw the
    status begin: the status file and the metrics say the same), else `now`.
    """
    current = {c.type: c for c in existing}
    out: list[dict[str, Any]] = []
    for f in findings:
        if f.type not in _OURS:
            continue
        old = current.get(f.type)
        if not every and old is not None and (old.status, old.reason, old.message) == (
                f.status, f.reason, f.message):
            continue
        kept = None if old is None or old.status != f.status else old.last_transition
        transition = kept or rfc3339((since or {}).get(f.type, now))
        out.append(
            {
                "type": f.type,
                "status": f.status,
                "reason": f.reason,
                "message": f.message[:32768],
                "lastHeartbeatTime": rfc3339(now),
                "lastTransitionTime": transition,
            }
        )
    return out


def _as_dict(taint: Any) -> dict[str, Any]:
    if isinstance(taint, Mapping):
        return {k: v for k, v in taint.items() if v is not None}
    raise TypeError(f"taint must be a mapping, got {type(taint).__name__}")


STARTING = "AgentStarting"  # the taint's value before the agent has seen any failure


def desired_taints(
    existing: Sequence[Mapping[str, Any]], key: str, effect: str, value: str | None
) -> list[dict[str, Any]] | None:
    """The whole new taint list, or None when it is already right.

    `value` None means our taint must be absent. Taints of other keys (and our key with
    another effect) are kept exactly, in order. `STARTING` accepts our taint with whatever
    value it was registered with (a kubelet's or an autoscaler's boot taint, often without
    one): a boot taint is then removed in one write, never rewritten first.
    """
    taints = [_as_dict(t) for t in existing]
    ours = [i for i, t in enumerate(taints) if t.get("key") == key and t.get("effect") == effect]
    if value is None:
        if not ours:
            return None
        return [t for i, t in enumerate(taints) if i not in ours]
    want = {"key": key, "value": value, "effect": effect}
    if ours:
        first = taints[ours[0]]
        if (first.get("value") == value or value == STARTING) and len(ours) == 1:
            return None
        keep = first.get("timeAdded")
        if keep:
            want["timeAdded"] = keep
        out = [t for i, t in enumerate(taints) if i not in ours[1:]]
        out[ours[0]] = want
        return out
    return [*taints, want]


@dataclass
class TaintGate:
    """Hysteresis: taint at once on failure; lift after `clear_after` of continuous health.

    Starts tainted (fail closed): nothing is lifted before a full healthy pass plus dwell.
    """

    clear_after: float
    _healthy_since: float | None = None
    tainted: bool = True
    reason: str = STARTING

    def feed(self, now: float, fabric: Finding) -> bool:
        if fabric.type != FABRIC_READY:
            raise ValueError(f"TaintGate takes the FabricReady finding, not {fabric.type}")
        if fabric.ok:
            if self._healthy_since is None:
                self._healthy_since = now
            if self.tainted and now - self._healthy_since >= self.clear_after:
                self.tainted = False
        else:
            self._healthy_since = None
            self.tainted = True
            self.reason = fabric.reason
        return self.tainted

    def lifts_at(self) -> float | None:
        """When the taint may be lifted if health holds: the publisher wakes up then."""
        if self.tainted and self._healthy_since is not None:
            return self._healthy_since + self.clear_after
        return None


def cordon_patch(
    unschedulable: bool, annotations: Mapping[str, str], want_cordon: bool, reason: str
) -> dict[str, Any] | None:
    """spec/metadata changes for the cordon, or None. Never lifts a cordon we did not set."""
    ours = CORDON_ANNOTATION in annotations
    if want_cordon:
        if unschedulable and not ours:
            return None  # cordoned by a person or another tool: leave it theirs
        if unschedulable and annotations.get(CORDON_ANNOTATION) == reason:
            return None
        return {
            "spec": {"unschedulable": True},
            "metadata": {"annotations": {CORDON_ANNOTATION: reason}},
        }
    if not ours:
        return None
    patch: dict[str, Any] = {"metadata": {"annotations": {CORDON_ANNOTATION: None}}}
    if unschedulable:
        patch["spec"] = {"unschedulable": False}
    return patch


@dataclass(frozen=True)
class SpecChanges:
    """What the agent must change on a Node's object (not its status): None/{} when right."""

    taints: list[dict[str, Any]] | None
    cordon: dict[str, Any] | None
    labels: dict[str, str | None]

    def __bool__(self) -> bool:
        return self.taints is not None or self.cordon is not None or bool(self.labels)


def spec_changes(node: NodeView, taint: tuple[str, str] | None,
                 taint_value: str | None,
                 manage_cordon: bool, want_cordon: bool, reason: str,
                 labels: Mapping[str, str] | None) -> SpecChanges:
    """Our taint, cordon and fingerprint labels against the Node as read. Pure; shared by
    the writer (what to patch) and the watch (whether someone moved the Node off them)."""
    cordon = None
    if manage_cordon or CORDON_ANNOTATION in node.annotations:
        cordon = cordon_patch(node.unschedulable, node.annotations,
                              manage_cordon and want_cordon, reason)
    # Ours: the fingerprint's, and each rail's switch label (rails come and go: any key
    # under the switch prefix, on the Node or wanted).
    ours = [*FINGERPRINT_LABELS, *sorted(
        {k for k in (*node.labels, *(labels or {})) if k.startswith(SWITCH_LABEL_PREFIX)})]
    relabel = label_patch(node.labels, ours, labels) if labels is not None else {}
    taints = (desired_taints(node.taints, *taint, taint_value)
              if taint is not None else None)  # conditions only: no taint is ours
    return SpecChanges(taints, cordon, relabel)
