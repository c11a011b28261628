"""One bad rail gated alone: a DRA DeviceTaintRule on the failing rail's device instead of
the node's taint (with `dra.device_taints`).

Which faults are one rail's comes from the judges (Finding.rails, Finding.whole_node): a
rail's link, address, GID, port, peers or slices are its own; the GID table unreadable, a
node-wide check or every rail failing at once keep the node's taint, as does a failing
rail whose device is not in the slices (there is nothing to taint it by). A rail's rule
goes on at once and comes off `clear_after` after the rail passes again, the node taint's
hysteresis; the agent deletes only rules it made (its name prefix and label).

The rule's shape is the API's (k8s.io/api resource/v1alpha3 DeviceTaintRule, 1.33+ behind
the DRADeviceTaints gate; the same spec in v1beta2 and v1): a selector of driver, pool and
device (the three fields every version keeps) and one taint {key, value, effect}.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nodeagent.config import DeviceTaints
from nodeagent.kube.fields import items, obj, text
from nodeagent.model.conditions import FABRIC_READY, Finding
from nodeagent.model.kube import LABEL_PREFIX, DeviceRef, label_value
from nodeagent.model.status import RailStatus

log = logging.getLogger(__name__)

GROUP = "resource.k8s.io"
# Newest first: the first the API server serves DeviceTaintRules in is used.
VERSIONS = ("v1", "v1beta2", "v1alpha3")
NODE_LABEL = f"{LABEL_PREFIX}node"
RAIL_LABEL = f"{LABEL_PREFIX}rail"
MANAGED_BY = "app.kubernetes.io/managed-by"
ALONE = "RailsTaintedAlone"  # the node's gate reason while rails are gated by themselves


@dataclass(frozen=True)
class RailTaint:
    """A rule the agent wants: this rail's device tainted, for this reason."""

    rail: str
    device: DeviceRef
    reason: str


@dataclass
class _Rail:
    reason: str
    device: DeviceRef
    healthy_since: float | None = None


@dataclass
class RailGate:
    """Per rail, the node taint's hysteresis: a rail at fault is gated at once, and lifted
    `clear_after` after it stops being at fault. Fed every pass, like the node's gate."""

    clear_after: float
    _rails: dict[str, _Rail] = field(default_factory=dict)

    def feed(self, now: float, fabric: Finding, rails: Sequence[RailStatus]) -> Finding:
        """The finding the node's own gate takes: FabricReady as it is when the fault is
        the node's, else True with the rails named (each gated by its device's rule)."""
        devices = {r.name: r.dra_device for r in rails}
        at_fault = {} if fabric.ok else dict(fabric.rails)
        for name, reason in at_fault.items():
            device = devices.get(name)
            if device is not None:
                self._rails[name] = _Rail(reason, device)
        for name, state in list(self._rails.items()):
            if name in at_fault:
                continue
            if name not in devices:  # the rail left the config
                del self._rails[name]
                continue
            if state.healthy_since is None:
                state.healthy_since = now
            if now - state.healthy_since >= self.clear_after:
                del self._rails[name]
        alone = (not fabric.ok and not fabric.whole_node and bool(at_fault)
                 and len(at_fault) < len(devices)
                 and all(devices.get(name) is not None for name in at_fault))
        if not alone:
            return fabric
        named = ", ".join(f"{name} ({reason})" for name, reason in at_fault.items())
        return Finding(FABRIC_READY, "True", ALONE,
                       f"gated by device taints, the node schedulable: {named}")

    def wanted(self) -> tuple[RailTaint, ...]:
        return tuple(RailTaint(name, s.device, s.reason)
                     for name, s in sorted(self._rails.items()))

    def lifts_at(self) -> float | None:
        """The next time a rule may come off if health holds (the publisher wakes then)."""
        times = [s.healthy_since + self.clear_after for s in self._rails.values()
                 if s.healthy_since is not None]
        return min(times, default=None)


_NOT_NAME = re.compile(r"[^a-z0-9.-]+")


def rule_name(node: str, rail: str) -> str:
    """nodeagent-<node>-<rail>, a valid object name: a rail name the API would not take as
    is (or too long to fit) is made safe and suffixed with a short hash, which a cut never
    removes, so two rails never share a rule. (A node name over ~240 characters leaves no
    room: the API refuses the rule, and the status file says so.)"""
    head = f"nodeagent-{node}-"
    safe = _NOT_NAME.sub("-", rail.lower()).strip("-.") or "rail"
    if safe == rail and len(head) + len(safe) <= NAME_MAX:
        return head + safe
    tag = "-" + hashlib.sha256(rail.encode()).hexdigest()[:6]
    cut = safe[:max(1, NAME_MAX - len(head) - len(tag))].rstrip("-.") or "rail"
    return head + cut + tag


NAME_MAX = 253  # an object name: a DNS subdomain


@dataclass(frozen=True)
class RuleChange:
    """One change a sync made to the rules: its line for the log and the Event, and
    whether a rule came off (a Normal Event) or went on or changed (a Warning)."""

    text: str
    lifted: bool = False

    def __str__(self) -> str:
        return self.text


def rule_body(version: str, node: str, want: RailTaint, taint: DeviceTaints) -> dict[str, Any]:
    d = want.device
    return {
        "apiVersion": f"{GROUP}/{version}", "kind": "DeviceTaintRule",
        "metadata": {"name": rule_name(node, want.rail), "labels": _labels(node, want.rail)},
        "spec": {
            "deviceSelector": {"driver": d.driver, "pool": d.pool, "device": d.device},
            "taint": {"key": taint.key, "value": label_value(want.reason) or "Failed",
                      "effect": taint.effect}}}


def _labels(node: str, rail: str) -> dict[str, str]:
    labels = {MANAGED_BY: "nodeagent"}
    for key, value in ((NODE_LABEL, node), (RAIL_LABEL, rail)):
        safe = label_value(value)
        if safe is not None:
            labels[key] = safe
    return labels


def _same(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    spec, wspec = obj(have.get("spec")), want["spec"]
    taint = dict(obj(spec.get("taint")))
    taint.pop("timeAdded", None)  # set by the API server
    return bool(spec.get("deviceSelector") == wspec["deviceSelector"]
                and taint == wspec["taint"])


class DeviceTaintsUnavailable(RuntimeError):
    """The API server serves no DeviceTaintRule."""


@dataclass
class DeviceTaintWriter:
    """The rules of one node, made to match what the RailGate wants: one list (by the
    agent's labels), then a create, update or delete per rule that differs."""

    api: Any
    counters: Any
    node: str
    taint: DeviceTaints
    version: str | None = None  # found once
    written: tuple[RailTaint, ...] | None = None  # what the last sync left in place

    def _path(self, name: str | None = None) -> str:
        if self.version is None:
            self.version = self._discover()
        base = f"/apis/{GROUP}/{self.version}/devicetaintrules"
        return f"{base}/{name}" if name else base

    def _discover(self) -> str:
        from kubernetes.client.exceptions import ApiException

        from nodeagent.kube.api import call

        for version in VERSIONS:
            try:
                got = call(self.api, self.counters, "GET", f"/apis/{GROUP}/{version}")
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            names = {r.get("name") for r in got.get("resources") or []
                     if isinstance(r, dict)}
            if "devicetaintrules" in names:
                return version
        raise DeviceTaintsUnavailable(
            f"the API server serves no DeviceTaintRule ({GROUP} {', '.join(VERSIONS)}): "
            "Kubernetes 1.33+ with the DRADeviceTaints feature gate and the API version on")

    def sync(self, wanted: Sequence[RailTaint]) -> list[RuleChange]:
        """Make this node's rules `wanted`; what changed, one line each."""
        from kubernetes.client.exceptions import ApiException

        from nodeagent.kube.api import call

        path = self._path()
        listed = call(self.api, self.counters, "GET", path, query=[
            ("labelSelector", f"{MANAGED_BY}=nodeagent")])
        prefix = f"nodeagent-{self.node}-"
        have: dict[str, Mapping[str, Any]] = {}
        for item in items(listed.get("items")):
            meta = obj(obj(item).get("metadata"))
            name = text(meta.get("name"))
            if name.startswith(prefix) and obj(meta.get("labels")).get(NODE_LABEL) == \
                    label_value(self.node):
                have[name] = obj(item)
        changes: list[RuleChange] = []
        want_names = set()
        for want in wanted:
            body = rule_body(self.version or "", self.node, want, self.taint)
            name = body["metadata"]["name"]
            want_names.add(name)
            if name not in have:
                call(self.api, self.counters, "POST", path, body)
                changes.append(RuleChange(
                    f"device taint on {want.rail} ({want.device}): {want.reason}"))
            elif not _same(have[name], body):
                body["metadata"]["resourceVersion"] = text(
                    obj(have[name].get("metadata")).get("resourceVersion"))
                call(self.api, self.counters, "PUT", self._path(name), body)
                changes.append(RuleChange(f"device taint on {want.rail} ({want.device}) "
                                          f"now: {want.reason}"))
        for name in sorted(set(have) - want_names):
            try:
                call(self.api, self.counters, "DELETE", self._path(name))
            except ApiException as exc:
                if exc.status != 404:  # gone already: what was wanted
                    raise
            changes.append(RuleChange(f"device taint {name} lifted", lifted=True))
        self.written = tuple(wanted)
        return changes


@dataclass
class RailTaints:
    """The publisher's device-taint side in one place: the per-rail gate, the writer (made
    at the first sync, on the Node writer's client), what it left in place and its error."""

    taint: DeviceTaints
    gate: RailGate
    writer: DeviceTaintWriter | None = None
    rails: tuple[str, ...] = ()  # rails whose device carries the agent's rule
    error: str | None = None  # why the last sync failed

    def due(self, now: float, reconcile_at: float) -> bool:
        """Whether the rules are to be synced: what is wanted changed, or a re-list is due
        (someone may have deleted one; or a failed sync's retry)."""
        return self.writer is None or self.gate.wanted() != self.writer.written \
            or now >= reconcile_at

    def sync(self, api: Any, counters: Any, node: str) -> list[RuleChange]:
        if self.writer is None:
            self.writer = DeviceTaintWriter(api, counters, node, self.taint)
        wanted = self.gate.wanted()
        changes = self.writer.sync(wanted)
        self.rails, self.error = tuple(w.rail for w in wanted), None
        return changes
