"""Kubernetes objects as the agent reads them (pods, nodes, slices), and the labels it
writes."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SliceDevice:
    """One device of a ResourceSlice (resource.k8s.io/v1), its attributes by qualified name
    (a name without a domain is in the driver's, as the API defines it)."""

    slice: str  # the ResourceSlice's name
    name: str
    attributes: Mapping[str, str | int | bool]
    pool: str = ""  # its pool's name (node-local drivers name it after the node)


@dataclass(frozen=True)
class DeviceRef:
    """A device as DRA names it: what a DeviceTaintRule's selector takes."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class Lending:
    """A device a ResourceClaim allocated to a pod on this node: who holds it."""

    device: DeviceRef
    pod: str  # namespace/name
    claim: str  # namespace/name

    def __str__(self) -> str:
        return f"pod {self.pod} (claim {self.claim})"


@dataclass(frozen=True)
class ClaimsObservation:
    """The devices this node's pods hold through ResourceClaims, and which pods are here
    and not ended (a lent rail's holder missing from them is gone)."""

    lendings: tuple[Lending, ...] = ()
    pods: frozenset[str] = frozenset()  # namespace/name
    error: str | None = None  # why they could not be read

    def holder(self, device: DeviceRef) -> Lending | None:
        return next((x for x in self.lendings if x.device == device), None)


@dataclass(frozen=True)
class RailsAside:
    """The rails a node's agent has set aside, as its Lease tells the fleet: lent to a pod
    (rail -> its holder, where the claims name it) and under its DeviceTaintRule (rail ->
    the rule's reason)."""

    lent: Mapping[str, str] = field(default_factory=dict)
    tainted: Mapping[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.lent or self.tainted)


@dataclass(frozen=True)
class SlicesObservation:
    """This node's ResourceSlices of one driver, the current generation of each pool."""

    devices: tuple[SliceDevice, ...] = ()
    error: str | None = None  # why they could not be read
    incomplete: tuple[str, ...] = ()  # pools with fewer slices than they say they have


# The hardware fingerprint labels the agent puts on its Node.
LABEL_PREFIX = "nodeagent.io/"
HCA_TYPE, FW_VERSION, BOARD_ID, DRIVER = (f"{LABEL_PREFIX}rdma-{k}" for k in (
    "hca-type", "fw-version", "board-id", "driver"))
FINGERPRINT_LABELS = (HCA_TYPE, FW_VERSION, BOARD_ID, DRIVER)
# Each rail's switch, from LLDP: nodeagent.io/switch-<rail> = the switch's name.
SWITCH_LABEL_PREFIX = f"{LABEL_PREFIX}switch-"
_LABEL_TEXT = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(text: str) -> str | None:
    """Text as a label value (63 characters of [A-Za-z0-9._-], alphanumeric at both ends;
    other runs become '-'); None when nothing is left."""
    value = _LABEL_TEXT.sub("-", text)[:63].strip("-._")
    return value or None


def switch_label(rail: str) -> str | None:
    """The label key for a rail's switch; None for a rail name a key cannot carry."""
    name = f"switch-{rail}"
    return SWITCH_LABEL_PREFIX + rail if label_value(name) == name else None


def switches_of(labels: Mapping[str, str]) -> dict[str, str]:
    """Rail -> switch, from a Node's labels."""
    return {k[len(SWITCH_LABEL_PREFIX):]: v for k, v in labels.items()
            if k.startswith(SWITCH_LABEL_PREFIX)}


@dataclass(frozen=True)
class Toleration:
    key: str = ""  # "" matches every key (only with Exists)
    operator: str = "Equal"
    effect: str = ""  # "" matches every effect


@dataclass(frozen=True)
class Termination:
    """A container's terminated state: its current one, or its last."""

    reason: str = "?"
    exit_code: str = "?"
    finished_at: str = "?"
    message: str = ""


@dataclass(frozen=True)
class ContainerFacts:
    """One container of a pod: its spec image and, once the kubelet reported it, its
    status (what image ran, restarts, waiting reason, terminations)."""

    name: str
    spec_image: str = ""
    reported: bool = False  # the pod's status lists this container
    image: str = ""  # what the kubelet says ran
    image_id: str = ""  # repo@digest on containerd and CRI-O; may be a bare config digest
    restarts: int = 0
    waiting: str = ""  # state.waiting.reason (CrashLoopBackOff, ...)
    terminated: Termination | None = None
    last_terminated: Termination | None = None
    resources: frozenset[str] = frozenset()  # resource names in its limits and requests


@dataclass(frozen=True)
class PodFacts:
    """What the agent reads of a pod, parsed once from the API object."""

    namespace: str
    name: str
    uid: str = ""
    created: str = ""  # creationTimestamp as written (RFC 3339)
    phase: str = ""
    ready: bool = False
    ready_changed: str = ""  # the Ready condition's lastTransitionTime
    deleting: bool = False
    owners: tuple[tuple[str, str], ...] = ()  # (kind, name) of each ownerReference
    containers: tuple[ContainerFacts, ...] = ()
    init_resources: frozenset[str] = frozenset()  # what its init containers request

    def __str__(self) -> str:
        return f"pod {self.namespace}/{self.name}"

    def requests_any(self, resources: Iterable[str]) -> bool:
        asked = self.init_resources.union(*(c.resources for c in self.containers))
        return any(r in asked for r in resources)


@dataclass(frozen=True)
class DaemonSetFacts:
    namespace: str
    name: str
    tolerations: tuple[Toleration, ...] = ()
    images: tuple[str, ...] = ()  # its pod template's container images


@dataclass(frozen=True)
class NodeFacts:
    name: str = ""
    os: str = ""  # status.nodeInfo as the kubelet reports it
    architecture: str = ""
    allocatable: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DevicePluginObservation:
    """This node, the plugin DaemonSet and its pods on this node, parsed once from the API
    (nodeagent.kube.objects): checks read fields, never JSON."""

    node: NodeFacts | None = None
    daemonset: DaemonSetFacts | None = None
    pods: tuple[PodFacts, ...] = ()  # the plugin's, on this node
    node_pods: tuple[PodFacts, ...] = ()  # every pod on this node
    error: str | None = None  # the API could not be read: every fact is Unknown
    images: tuple[ImagePlatforms, ...] = ()  # what the registry says the plugin's images offer
    machine: str = ""  # this host's uname machine (x86_64, aarch64): the platform variant
    # From this node's container runtime, for the newest plugin pod: the platform of each
    # container's pulled image (by container name) and its newest log lines.
    runtime_images: dict[str, ImagePlatforms] = field(default_factory=dict)
    log_lines: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Platform:
    """An OCI platform: os/architecture[/variant]."""

    os: str
    architecture: str
    variant: str = ""

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)

    def runs(self, image: Platform) -> bool:
        """Whether a node of this platform runs an image built for `image`.

        arm64 images rarely name their variant: an empty variant there means v8.
        """
        if (self.os, self.architecture) != (image.os, image.architecture):
            return False
        if not self.variant or not image.variant:
            return True
        return self.variant == image.variant


@dataclass(frozen=True)
class ImagePlatforms:
    """One container image as its registry describes it; `error` when it could not be read
    (the platform fact is then Unknown, never a false alarm)."""

    image: str  # the reference that was resolved
    digest: str = ""
    platforms: tuple[Platform, ...] = ()
    error: str | None = None
