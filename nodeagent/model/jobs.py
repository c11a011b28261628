"""What a job's container sees (devices, ports, GID slots) and what the preflight says
of it."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

from nodeagent.model.kube import DeviceRef


@dataclass(frozen=True)
class VerbsDevice:
    """An RDMA device as a container sees it: its uverbs node, and whether it opens."""

    uverbs: str  # uverbs0
    ibdev: str | None  # mlx5_0, rxe0; None when sysfs does not say
    usable: bool  # a character device that opened read-write
    why: str = ""  # when not usable


@dataclass(frozen=True)
class GidSlot:
    """One slot of a port's GID table as a process sees it: what NCCL's selection reads.
    `version` 1 or 2 from gid_attrs/types, None when the read fails with EINVAL (an empty
    slot, or one whose netdev is in another namespace) or says something else; `missing`
    when the types file cannot be opened at all (NCCL fails on that)."""

    index: int
    gid: ipaddress.IPv6Address  # :: for an empty slot
    version: int | None
    missing: bool = False

    @property
    def ipv4(self) -> str | None:
        mapped = self.gid.ipv4_mapped
        return str(mapped) if mapped is not None else None


@dataclass(frozen=True)
class PortView:
    """An RDMA port as a process sees it: state, link layer and every GID slot (the table's
    length is the kernel's gid_tbl_len: NCCL walks all of it)."""

    device: str
    port: int
    active: bool
    ethernet: bool
    slots: tuple[GidSlot, ...]
    state: str = ""  # the kernel's word, for messages: ACTIVE, DOWN, ...


@dataclass(frozen=True)
class NodeRail:
    """A rail as the node's agent reports it: where its GID is pinned."""

    name: str
    address: str | None = None
    device: str | None = None
    port: int | None = None
    gid_index: int | None = None  # the pinned index of its IPv4 RoCE v2 GID
    # With the agent's peer probes: traffic class -> (peers failing over RoCE in it, peers)
    classes: Mapping[int, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeVerdict:
    """What the node's agent says (its status file, or its Node): FabricReady, the rails,
    the Lustre mounts; `problem` when it could not be read (the preflight fails closed)."""

    node: str = ""
    ready: bool = False
    reason: str = ""
    message: str = ""
    rails: tuple[NodeRail, ...] = ()
    lustre: tuple[str, ...] = ()
    problem: str | None = None


@dataclass(frozen=True)
class AllocatedDevice:
    """A device one of the pod's ResourceClaims was allocated, with its attributes from this
    node's ResourceSlices (qualified names: `dra.net/ifName`,
    `resource.kubernetes.io/pcieRoot`); none when the slices do not list it."""

    claim: str  # namespace/name
    device: DeviceRef
    attributes: Mapping[str, str | int | bool] = field(default_factory=dict)

    def get(self, name: str) -> str | int | bool | None:
        """An attribute by name, qualified with the device's driver unless it has a domain."""
        return self.attributes.get(name if "/" in name else f"{self.device.driver}/{name}")


@dataclass(frozen=True)
class PodAllocation:
    """The devices the pod's claims hold, or why they could not be read."""

    devices: tuple[AllocatedDevice, ...] = ()
    problem: str | None = None


@dataclass(frozen=True)
class Unfit:
    """One reason a training pod must not start: the check and a line that says what to
    change."""

    check: str  # devices, node, storage, env, gang
    message: str

    def line(self) -> str:
        return f"{self.check}: {self.message}"
