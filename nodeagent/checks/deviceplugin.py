"""RDMADevicePluginReady from Kubernetes objects. Pure.

Facts, each its own reason: the plugin DaemonSet exists and tolerates the fabric taint; its
pod on this node is Ready (and if not: never Ready, crash-looping, or the image cannot run
on this platform); its image, as the registry describes it, offers this node's platform;
the node advertises the RDMA resource.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import Any

from nodeagent.config import Config
from nodeagent.kube.fields import quantity, timestamp
from nodeagent.model import (
    RDMA_DEVICE_PLUGIN_READY,
    DevicePluginObservation,
    Finding,
    ImagePlatforms,
    Platform,
    Problems,
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


# uname machine -> OCI architecture and variant
_MACHINES = {
    "x86_64": ("amd64", ""), "amd64": ("amd64", ""),
    "aarch64": ("arm64", "v8"), "arm64": ("arm64", "v8"),
    "armv7l": ("arm", "v7"), "armv6l": ("arm", "v6"),
    "ppc64le": ("ppc64le", ""), "s390x": ("s390x", ""), "riscv64": ("riscv64", ""),
}


def node_platform(node: Mapping[str, Any] | None, machine: str) -> Platform:
    """The node's platform: os and architecture as the kubelet reports them
    (`status.nodeInfo`), the variant from this machine (the kubelet does not report it)."""
    info = (node or {}).get("status", {}).get("nodeInfo") or {}
    local_arch, variant = _MACHINES.get(machine, (machine, ""))
    arch = info.get("architecture") or local_arch
    return Platform(info.get("operatingSystem") or "linux", arch,
                    variant if arch == local_arch else "")


def newest_pod(obs: DevicePluginObservation) -> dict[str, Any] | None:
    """The plugin's newest pod on this node: the one the DaemonSet keeps (an older one is
    leaving)."""
    if not obs.pods:
        return None
    return max(obs.pods, key=lambda p: p.get("metadata", {}).get("creationTimestamp", ""))


def plugin_images(obs: DevicePluginObservation) -> list[str]:
    """The images to look up: what the newest plugin pod here runs (the digest it ran, else
    its spec image), else what the DaemonSet would run."""
    pod = newest_pod(obs)
    if pod is not None:
        statuses = {cs.get("name"): cs for cs in pod.get("status", {}).get("containerStatuses")
                    or []}
        images = []
        for c in pod.get("spec", {}).get("containers") or []:
            image_id = str(statuses.get(c.get("name"), {}).get("imageID") or "")
            # imageID is repo@digest on containerd and CRI-O; a bare config digest
            # (sha256:...) names no repository, so the spec image it is.
            ok = "@sha256:" in image_id
            images.append(image_id if ok else str(c.get("image") or ""))
        return [i for i in dict.fromkeys(images) if i]
    spec = (obs.daemonset or {}).get("spec", {}).get("template", {}).get("spec", {})
    return [i for i in dict.fromkeys(str(c.get("image") or "")
                                     for c in spec.get("containers") or []) if i]


def image_facts(images: Iterable[ImagePlatforms],
                node: Platform) -> tuple[list[tuple[str, str]], list[str]]:
    """(problems, notes): a mismatch is a problem; an image the registry could not describe
    is only a note (the fact is Unknown, never a false alarm)."""
    problems: list[tuple[str, str]] = []
    notes: list[str] = []
    for img in images:
        if img.error:
            notes.append(f"image platform not verified ({img.image}): {img.error}")
        elif not img.platforms:
            notes.append(f"image platform not verified ({img.image}): the registry lists "
                         "no platform")
        elif not any(node.runs(p) for p in img.platforms):
            offered = ", ".join(str(p) for p in img.platforms)
            problems.append(("ImageArchMismatch",
                             f"image {img.image} ({img.digest}) is built for {offered}; this "
                             f"node is {node}: it cannot run here"))
        else:
            notes.append(f"image {node} verified ({img.digest[:19]})")
    return problems, notes


def runtime_facts(obs: DevicePluginObservation,
                  node: Platform) -> tuple[list[tuple[str, str]], list[str]]:
    """(problems, notes) from this node's runtime: a pulled image of another platform, or a
    container whose newest log lines say `exec format error` (the binary inside does not
    run here, whatever the image's config claims). Both are ImageArchMismatch, registry or
    not; one problem per container, the log first (it is what actually happened)."""
    pod = newest_pod(obs)
    if pod is None:
        return [], []
    name = f"pod {pod.get('metadata', {}).get('namespace')}/{pod.get('metadata', {}).get('name')}"
    problems: list[tuple[str, str]] = []
    notes: list[str] = []
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        container = str(cs.get("name") or "")
        stored = obs.runtime_images.get(container)
        said = ""
        if stored is not None and stored.platforms:
            said = f", built for {', '.join(str(p) for p in stored.platforms)}"
        image = f"image {cs.get('image')} ({cs.get('imageID') or 'digest unknown'}{said})"
        failed = next((line for line in obs.log_lines.get(container, [])
                       if "exec format error" in line), None)
        if failed is not None:
            problems.append(("ImageArchMismatch",
                             f"{name} container {container} logged {failed.strip()!r}: {image} "
                             f"does not run on this node ({node})"))
        elif stored is not None and stored.platforms and not any(
                node.runs(p) for p in stored.platforms):
            problems.append(("ImageArchMismatch",
                             f"{name} container {container}: the runtime pulled {image}; this "
                             f"node is {node}: it cannot run here"))
        elif stored is not None and stored.platforms:
            notes.append(f"pulled image {node} verified by the runtime")
        elif stored is not None and stored.error:
            notes.append(f"pulled image platform not verified ({stored.image}): {stored.error}")
    return problems, notes


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
    created = timestamp(meta.get("creationTimestamp"))
    changed = timestamp((ready_cond or {}).get("lastTransitionTime"))
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
    problems = Problems(RDMA_DEVICE_PLUGIN_READY)
    dp = cfg.device_plugin
    if dp is None:
        return problems.finding("NotConfigured", "no device_plugin configured")
    if cfg.kubernetes is None:
        problems.unknown("KubernetesNotConfigured",
                         "device_plugin is configured but the kubernetes section is not")
    elif obs is None:
        problems.unknown("NotYetChecked", "device plugin not checked yet")
    elif obs.error:
        problems.unknown("APIUnreachable", f"cannot read the device plugin's objects: {obs.error}")
    if problems or obs is None or cfg.kubernetes is None:
        return problems.folded()
    if obs.daemonset is None:
        problems.fail("DaemonSetMissing", f"daemonset {dp.namespace}/{dp.daemonset} not found")
    elif cfg.kubernetes.taint is not None:  # conditions only: the taint is not the agent's
        taint = cfg.kubernetes.taint
        problem = toleration_problem(obs.daemonset, taint.key, taint.effect)
        if problem:
            problems.fail("PluginDoesNotTolerateFabricTaint", problem)
    if not obs.pods:
        problems.fail("PluginPodMissing",
                      f"no pod of daemonset {dp.namespace}/{dp.daemonset} on this node")
    node = node_platform(obs.node, obs.machine)
    newest = newest_pod(obs)
    runtime_problems, runtime_notes = runtime_facts(obs, node)
    for reason, message in runtime_problems:  # what the pod ran into before how it is doing
        problems.fail(reason, message)
    if newest is not None:
        found = pod_problem(newest, seen_ready)
        if found and not (runtime_problems and found[0] == "ImageArchMismatch"):
            problems.fail(*found)
    image_problems, notes = image_facts(obs.images, node)
    for reason, message in image_problems if not runtime_problems else ():
        problems.fail(reason, message)
    notes = runtime_notes + notes
    node_status = (obs.node or {}).get("status", {})
    allocatable = quantity((node_status.get("allocatable") or {}).get(dp.resource))
    capacity = quantity((node_status.get("capacity") or {}).get(dp.resource))
    if min(allocatable, capacity) < dp.min_allocatable or allocatable == 0:
        problems.fail("ResourceNotAdvertised",
                      f"{dp.resource}: allocatable {allocatable}, capacity {capacity}, "
                      f"want at least {max(1, dp.min_allocatable)}")
    if problems:
        return problems.folded()
    if not dp.registry.verify_platform:
        notes.append("image platform not checked (registry.verify_platform is off)")
    return Finding(RDMA_DEVICE_PLUGIN_READY, "True", "PluginReady",
                   f"{dp.namespace}/{dp.daemonset} Ready here, {dp.resource} allocatable "
                   f"{allocatable}; " + "; ".join(notes or ["no image to verify"]))
