"""RDMADevicePluginReady from Kubernetes objects. Pure.

Facts, each its own reason: the plugin DaemonSet exists and tolerates the fabric taint; its
pod on this node is Ready (and if not: never Ready, crash-looping, or the image cannot run
on this platform); the node advertises the RDMA resource.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from datetime import datetime
from typing import Any

from nodeagent.config import Config
from nodeagent.model import (
    RDMA_DEVICE_PLUGIN_READY,
    ConditionStatus,
    DevicePluginObservation,
    Finding,
)

# A pod whose Ready condition last changed this soon after it was created never was Ready:
# had it been, the condition would have flipped again later.
NEVER_READY_WINDOW = 60.0


def tolerates_taint(tolerations: Iterable[Mapping[str, Any]], key: str, effect: str) -> bool:
    """Whether a pod with these tolerations may run on a node carrying our taint.

    Only `operator: Exists` counts: the taint's value is the failing reason and changes, so
    an `Equal` toleration would match one reason and be evicted or kept out by the next.
    """
    for t in tolerations:
        if t.get("effect") not in (None, "", effect):
            continue
        if t.get("operator", "Equal") == "Exists" and t.get("key") in (None, "", key):
            return True
    return False


def toleration_problem(daemonset: Mapping[str, Any], key: str, effect: str) -> str | None:
    """A message when the DaemonSet's pods cannot run on a node with our taint, else None."""
    spec = daemonset.get("spec", {}).get("template", {}).get("spec", {})
    if tolerates_taint(spec.get("tolerations") or [], key, effect):
        return None
    meta = daemonset.get("metadata", {})
    return (f"daemonset {meta.get('namespace')}/{meta.get('name')} does not tolerate the fabric "
            f"taint {key}:{effect} (needs operator: Exists): while the node is tainted the "
            "plugin cannot run, so the node can never recover")


def _time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _quantity(value: Any) -> int:
    """Extended resources are plain integers ('8'); anything else counts as 0."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def is_ready(pod: Mapping[str, Any]) -> bool:
    conds = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def pod_problem(pod: Mapping[str, Any], seen_ready: Set[str]) -> tuple[str, str] | None:
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    name = f"pod {meta.get('namespace')}/{meta.get('name')}"
    statuses = status.get("containerStatuses") or []
    for cs in statuses:
        for state in (cs.get("state", {}), cs.get("lastState", {})):
            message = (state.get("terminated") or {}).get("message") or ""
            if "exec format error" in message:
                return ("ImageArchMismatch",
                        f"{name} container {cs.get('name')}: exec format error: image "
                        f"{cs.get('image')} ({cs.get('imageID') or 'digest unknown'}) does not "
                        "run on this node's platform")
    if is_ready(pod):
        return None
    restarts = sum(int(cs.get("restartCount") or 0) for cs in statuses)
    last = ""
    for cs in statuses:
        term = (cs.get("lastState") or {}).get("terminated")
        if term:
            last = (f"; last termination: {term.get('reason', '?')} exit "
                    f"{term.get('exitCode', '?')} at {term.get('finishedAt', '?')}")
    ready_cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"),
                      None)
    created = _time(meta.get("creationTimestamp"))
    changed = _time((ready_cond or {}).get("lastTransitionTime"))
    if meta.get("uid") not in seen_ready and (
        created is None or changed is None or changed - created <= NEVER_READY_WINDOW
    ):
        return ("PluginNeverReady",
                f"{name} has never been Ready since it was created at "
                f"{meta.get('creationTimestamp')} ({restarts} restarts{last})")
    crashing = any((cs.get("state", {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
                   for cs in statuses)
    if crashing:
        return ("PluginCrashLooping", f"{name} is crash-looping ({restarts} restarts{last})")
    return ("PluginNotReady", f"{name} is not Ready ({restarts} restarts{last})")


def device_plugin_finding(
    cfg: Config, obs: DevicePluginObservation | None, seen_ready: Set[str] = frozenset()
) -> Finding:
    dp = cfg.device_plugin
    if dp is None:
        return Finding(RDMA_DEVICE_PLUGIN_READY, "True", "NotConfigured",
                       "no device_plugin configured")
    if cfg.kubernetes is None:
        return Finding(RDMA_DEVICE_PLUGIN_READY, "Unknown", "KubernetesNotConfigured",
                       "device_plugin is configured but the kubernetes section is not")
    if obs is None:
        return Finding(RDMA_DEVICE_PLUGIN_READY, "Unknown", "NotYetChecked",
                       "device plugin not checked yet")
    if obs.error:
        return Finding(RDMA_DEVICE_PLUGIN_READY, "Unknown", "APIUnreachable",
                       f"cannot read the device plugin's objects: {obs.error}")
    problems: list[tuple[str, str]] = []
    if obs.daemonset is None:
        problems.append(("DaemonSetMissing", f"daemonset {dp.namespace}/{dp.daemonset} not found"))
    else:
        taint = cfg.kubernetes.taint
        problem = toleration_problem(obs.daemonset, taint.key, taint.effect)
        if problem:
            problems.append(("PluginDoesNotTolerateFabricTaint", problem))
    if not obs.pods:
        problems.append(("PluginPodMissing",
                         f"no pod of daemonset {dp.namespace}/{dp.daemonset} on this node"))
    else:
        newest = max(obs.pods, key=lambda p: p.get("metadata", {}).get("creationTimestamp", ""))
        found = pod_problem(newest, seen_ready)
        if found:
            problems.append(found)
    node_status = (obs.node or {}).get("status", {})
    allocatable = _quantity((node_status.get("allocatable") or {}).get(dp.resource))
    capacity = _quantity((node_status.get("capacity") or {}).get(dp.resource))
    if min(allocatable, capacity) < dp.min_allocatable or allocatable == 0:
        problems.append(("ResourceNotAdvertised",
                         f"{dp.resource}: allocatable {allocatable}, capacity {capacity}, "
                         f"want at least {max(1, dp.min_allocatable)}"))
    if problems:
        status: ConditionStatus = "False"
        return Finding(RDMA_DEVICE_PLUGIN_READY, status, problems[0][0],
                       "; ".join(p[1] for p in problems))
    return Finding(RDMA_DEVICE_PLUGIN_READY, "True", "PluginReady",
                   f"{dp.namespace}/{dp.daemonset} Ready here, {dp.resource} allocatable "
                   f"{allocatable} (image platform not verified: registry check not built yet)")
