"""RDMADevicePluginReady from Kubernetes objects. Pure.

Facts, each its own reason: the plugin DaemonSet exists and tolerates the fabric taint; its
pod on this node is Ready (and if not: never Ready, crash-looping, or the image cannot run
on this platform); its image, as the registry describes it, offers this node's platform;
the node advertises the RDMA resource.
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from nodeagent.config import Config
from nodeagent.kube.fields import quantity, timestamp
from nodeagent.model.conditions import RDMA_DEVICE_PLUGIN_READY, Finding, Problems
from nodeagent.model.kube import (
    DaemonSetFacts,
    DevicePluginObservation,
    ImagePlatforms,
    NodeFacts,
    Platform,
    PodFacts,
    Toleration,
)

# A pod whose Ready condition last changed this soon after it was created never was Ready:
# had it been, the condition would have flipped again later.
NEVER_READY_WINDOW = 60.0


def tolerates_taint(tolerations: Iterable[Toleration], key: str, effect: str) -> bool:
    """Whether a pod with these tolerations may run on a node carrying our taint.

    Only `operator: Exists` counts: the taint's value is the failing reason and changes, so
    an `Equal` toleration would match one reason and be evicted or kept out by the next.
    """
    return any(t.effect in ("", effect) and t.operator == "Exists" and t.key in ("", key)
               for t in tolerations)


def toleration_problem(ds: DaemonSetFacts, key: str, effect: str) -> str | None:
    """A message when the DaemonSet's pods cannot run on a node with our taint, else None."""
    if tolerates_taint(ds.tolerations, key, effect):
        return None
    return (f"daemonset {ds.namespace}/{ds.name} does not tolerate the fabric "
            f"taint {key}:{effect} (needs operator: Exists): while the node is tainted the "
            "plugin cannot run, so the node can never recover")


# uname machine -> OCI architecture and variant
_MACHINES = {
    "x86_64": ("amd64", ""), "amd64": ("amd64", ""),
    "aarch64": ("arm64", "v8"), "arm64": ("arm64", "v8"),
    "armv7l": ("arm", "v7"), "armv6l": ("arm", "v6"),
    "ppc64le": ("ppc64le", ""), "s390x": ("s390x", ""), "riscv64": ("riscv64", ""),
}


def node_platform(node: NodeFacts | None, machine: str) -> Platform:
    """The node's platform: os and architecture as the kubelet reports them
    (`status.nodeInfo`), the variant from this machine (the kubelet does not report it)."""
    local_arch, variant = _MACHINES.get(machine, (machine, ""))
    arch = (node.architecture if node else "") or local_arch
    return Platform((node.os if node else "") or "linux", arch,
                    variant if arch == local_arch else "")


def newest_pod(obs: DevicePluginObservation) -> PodFacts | None:
    """The plugin's newest pod on this node: the one the DaemonSet keeps (an older one is
    leaving)."""
    return max(obs.pods, key=lambda p: p.created) if obs.pods else None


def plugin_images(obs: DevicePluginObservation) -> list[str]:
    """The images to look up: what the newest plugin pod here runs (the digest it ran, else
    its spec image), else what the DaemonSet would run."""
    pod = newest_pod(obs)
    if pod is None:
        return list(obs.daemonset.images) if obs.daemonset else []
    # imageID is repo@digest on containerd and CRI-O; a bare config digest (sha256:...)
    # names no repository, so the spec image it is.
    images = (c.image_id if "@sha256:" in c.image_id else c.spec_image
              for c in pod.containers if c.spec_image)
    return [i for i in dict.fromkeys(images) if i]


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
    problems: list[tuple[str, str]] = []
    notes: list[str] = []
    for c in pod.containers:
        if not c.reported:
            continue
        stored = obs.runtime_images.get(c.name)
        said = ""
        if stored is not None and stored.platforms:
            said = f", built for {', '.join(str(p) for p in stored.platforms)}"
        image = f"image {c.image} ({c.image_id or 'digest unknown'}{said})"
        failed = next((line for line in obs.log_lines.get(c.name, [])
                       if "exec format error" in line), None)
        if failed is not None:
            problems.append(("ImageArchMismatch",
                             f"{pod} container {c.name} logged {failed.strip()!r}: {image} "
                             f"does not run on this node ({node})"))
        elif stored is not None and stored.platforms and not any(
                node.runs(p) for p in stored.platforms):
            problems.append(("ImageArchMismatch",
                             f"{pod} container {c.name}: the runtime pulled {image}; this "
                             f"node is {node}: it cannot run here"))
        elif stored is not None and stored.platforms:
            notes.append(f"pulled image {node} verified by the runtime")
        elif stored is not None and stored.error:
            notes.append(f"pulled image platform not verified ({stored.image}): {stored.error}")
    return problems, notes


def pod_problem(pod: PodFacts, seen_ready: Set[str]) -> tuple[str, str] | None:
    reported = [c for c in pod.containers if c.reported]
    for c in reported:
        for term in (c.terminated, c.last_terminated):
            if term is not None and "exec format error" in term.message:
                return ("ImageArchMismatch",
                        f"{pod} container {c.name}: exec format error: image "
                        f"{c.image} ({c.image_id or 'digest unknown'}) does not "
                        "run on this node's platform")
    if pod.ready:
        return None
    restarts = sum(c.restarts for c in reported)
    last = ""
    for c in reported:
        if c.last_terminated is not None:
            t = c.last_terminated
            last = f"; last termination: {t.reason} exit {t.exit_code} at {t.finished_at}"
    created = timestamp(pod.created)
    changed = timestamp(pod.ready_changed)
    if pod.uid not in seen_ready and (
        created is None or changed is None or changed - created <= NEVER_READY_WINDOW
    ):
        return ("PluginNeverReady",
                f"{pod} has never been Ready since it was created at "
                f"{pod.created or None} ({restarts} restarts{last})")
    if any(c.waiting == "CrashLoopBackOff" for c in reported):
        return ("PluginCrashLooping", f"{pod} is crash-looping ({restarts} restarts{last})")
    return ("PluginNotReady", f"{pod} is not Ready ({restarts} restarts{last})")


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
    allocatable = quantity(obs.node.allocatable.get(dp.resource) if obs.node else None)
    capacity = quantity(obs.node.capacity.get(dp.resource) if obs.node else None)
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
