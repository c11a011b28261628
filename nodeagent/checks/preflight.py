"""Whether a training pod may start on this node: its own view of the fabric against what
the node's agent knows. Pure: facts in, one Unfit per problem out, each saying what to
change. (The gang's RoCE probe is cli/gang.py; its problems join these.)

NCCL's environment is judged by predicting what NCCL will do with it (checks/nccl.py,
from NCCL's source): the ports it opens and the GID it picks on each, against the rails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nodeagent.checks.nccl import NcclEnv, NcclPlan, nccl_problems, predict
from nodeagent.model.jobs import (
    AllocatedDevice,
    NodeRail,
    NodeVerdict,
    PodAllocation,
    PortView,
    Unfit,
    VerbsDevice,
)


@dataclass(frozen=True)
class PreflightFacts:
    verdict: NodeVerdict
    devices: Sequence[VerbsDevice] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # with NCCL's conf files merged
    lustre: Mapping[str, str | None] = field(default_factory=dict)  # mountpoint -> why not
    resource: str = "rdma/rdma_shared_device_a"
    ports: Sequence[PortView] = ()  # the RDMA ports this container's sysfs shows
    interfaces: Sequence[str] | None = None  # running, with an address (None: unknown)
    addresses: Sequence[str] = ()  # this container's IPv4 addresses
    allow_partial: bool = False  # a job that means to use only some rails
    # With --claims: what the pod's ResourceClaims hold. The rails judged are then those
    # whose NIC it was allocated (a pod gets some NICs, not the node's every rail).
    allocation: PodAllocation | None = None
    nic_driver: str = "dra.net"
    allow_unaligned: bool = False

    def plan(self) -> NcclPlan:
        return predict(NcclEnv.read(self.env), self.ports, self.interfaces)

    def rails(self) -> tuple[NodeRail, ...]:
        if self.allocation is None:
            return self.verdict.rails
        mine = {n.get(NIC_RDMA_DEVICE) for n in nics(self.allocation, self.nic_driver)}
        return tuple(r for r in self.verdict.rails if r.device in mine)


def judge_preflight(facts: PreflightFacts) -> list[Unfit]:
    rails = facts.rails()
    return [*device_problems(facts.devices, rails, facts.resource),
            *verdict_problems(facts.verdict),
            *storage_problems(facts.lustre),
            *(claim_problems(facts) if facts.allocation is not None else []),
            *class_problems(facts.plan(), rails),
            *nccl_problems(facts.plan(), rails, facts.ports, facts.addresses,
                           allow_partial=facts.allow_partial)]


def _classed(plan: NcclPlan, rails: Sequence[NodeRail]) -> list[NodeRail]:
    """The rails NCCL would use whose peers the node's agent probes (peers section)."""
    used = {(c.device, c.port) for c in plan.ports}
    return [r for r in rails if r.classes and (r.device, r.port or 1) in used] \
        if plan.network == "IB" else []


def class_problems(plan: NcclPlan, rails: Sequence[NodeRail]) -> list[Unfit]:
    """The job's traffic class (NCCL_IB_TC), where the node's agent probes it: a rail whose
    peers fail over RoCE in that class (while TCP reaches them) would carry the job's
    traffic into the same drop, whatever class 0 says."""
    tc, out = plan.env.tc, []
    for rail in _classed(plan, rails):
        failing, total = rail.classes.get(tc, (0, 0))
        if failing:
            word = plan.env.traffic.words
            out.append(Unfit("peers", f"{rail.name}: {failing} of {total} peers fail over RoCE "
                             f"in {word}, this job's (NCCL_IB_TC={tc}), while TCP reaches them:"
                             " the path drops the job's class; see the node's "
                             "RDMAPeersReachable, or run where it passes"))
    return out


def class_notes(facts: PreflightFacts) -> list[str]:
    """For a fit pod: the rails whose peers the agent does not probe in the job's class
    (its path in that class unproven; the agent's peers.classes can add it)."""
    plan = facts.plan()
    tc = plan.env.tc
    unproven = [r.name for r in _classed(plan, facts.rails()) if tc not in r.classes]
    if not unproven:
        return []
    probed = sorted({c for r in facts.rails() for c in r.classes})
    return [f"class {tc} not probed on {', '.join(unproven)} (the agent probes "
            f"{', '.join(map(str, probed))}: add {tc} to peers.classes)"]


# dranet's attribute names (pkg/driver; its published slices), and the standard ones
# (kubernetes.io/docs/reference/node/dra-standard-device-attributes: pcieRoot
# "pci<domain>:<bus>"; numaNode, a scalar integer) that matchAttribute aligns devices by;
# a driver's own numaNode (dranet's dra.net/numaNode) where the standard one is missing.
NIC_INTERFACE, NIC_RDMA, NIC_RDMA_DEVICE = "ifName", "rdma", "rdmaDevice"
PCIE_ROOT, NUMA = "resource.kubernetes.io/pcieRoot", "resource.kubernetes.io/numaNode"


def _where(device: AllocatedDevice, key: str) -> str | int | bool | None:
    got = device.get(key)
    return device.get("numaNode") if got is None and key == NUMA else got


def nics(allocation: PodAllocation, driver: str) -> list[AllocatedDevice]:
    return [d for d in allocation.devices if d.device.driver == driver]


def claim_problems(facts: PreflightFacts) -> list[Unfit]:
    """The NICs the pod's claims hold: each in this container with its RDMA device, used by
    NCCL; and each GPU beside one of them (same PCIe root, else same NUMA node)."""
    allocation = facts.allocation
    assert allocation is not None
    if allocation.problem is not None:
        return [Unfit("claims", f"cannot read this pod's ResourceClaims: {allocation.problem}")]
    mine = nics(allocation, facts.nic_driver)
    gpus = [d for d in allocation.devices if d.device.driver != facts.nic_driver]
    if not mine:
        held = ", ".join(sorted({d.device.driver for d in gpus})) or "nothing"
        return [Unfit("claims", f"this pod's claims hold no NIC of {facts.nic_driver} (they "
                      f"hold: {held}): its traffic would leave the fabric; add a request "
                      f"for an RDMA NIC to the claim")]
    out = []
    usable = {d.ibdev for d in facts.devices if d.usable}
    plan = facts.plan()
    opened = {c.device for c in plan.ports}
    for nic in mine:
        name = f"NIC {nic.device.device} of claim {nic.claim}"
        interface, rdma = nic.get(NIC_INTERFACE), nic.get(NIC_RDMA_DEVICE)
        if not nic.attributes:
            out.append(Unfit("claims", f"{name} is not in this node's ResourceSlices"))
            continue
        if nic.get(NIC_RDMA) is not True or not isinstance(rdma, str):
            out.append(Unfit("claims", f"{name} is published without RDMA: the job would "
                             "train over sockets; request a NIC whose rdma is true"))
            continue
        if facts.interfaces is not None and interface not in facts.interfaces:
            out.append(Unfit("claims", f"{name} ({interface}) is not in this container: the "
                             "driver did not move it into the pod (is the driver running "
                             "on this node?)"))
        if rdma not in usable:
            out.append(Unfit("claims", f"{name}'s RDMA device {rdma} is not in this container:"
                             " the driver's RDMA mode must give the pod its device (dranet:"
                             " rdma exclusive mode, or the host's RDMA devices shared)"))
        elif plan.network == "IB" and rdma not in opened:
            why = "; ".join(x for x in plan.skipped if x.startswith(f"{rdma}:"))
            out.append(Unfit("claims", f"NCCL would not use {name} ({rdma}"
                             f"{f': {why}' if why else ''}): set NCCL_IB_HCA to include it"))
    if not facts.allow_unaligned:
        out += alignment_problems(gpus, mine)
    return out


def alignment_problems(gpus: Sequence[AllocatedDevice],
                       mine: Sequence[AllocatedDevice]) -> list[Unfit]:
    """A GPU with no allocated NIC on its PCIe root (or, where the slices say no roots,
    its NUMA node) crosses the CPU's interconnect for every transfer: measured 25 against
    56 GB/s all-reduce for a cross-NUMA pair against an aligned one. Unknown (neither
    attribute on both sides) is not judged."""
    out = []
    for gpu in gpus:
        for key in (PCIE_ROOT, NUMA):
            where = _where(gpu, key)
            near = [got for n in mine if (got := _where(n, key)) is not None]
            if where is None or not near:
                continue
            if where not in near:
                shown = "PCIe root" if key == PCIE_ROOT else "NUMA node"
                out.append(Unfit("alignment", f"GPU {gpu.device.device} of claim {gpu.claim} "
                                 f"is on {shown} {where}, its NICs on {', '.join(map(str, near))}"
                                 ": every transfer crosses the CPU interconnect (about half "
                                 "the all-reduce bandwidth); constrain the claim with "
                                 f"matchAttribute {PCIE_ROOT}, or pass --allow-unaligned"))
            break
    return out


def device_problems(devices: Sequence[VerbsDevice], rails: Sequence[NodeRail],
                    resource: str) -> list[Unfit]:
    usable = {d.ibdev for d in devices if d.usable}
    if not usable:
        why = "; ".join(d.why for d in devices if d.why)
        return [Unfit("devices", f"no RDMA device in this container: request {resource} in "
                      f"resources.limits{f' ({why})' if why else ''}")]
    missing = [r for r in rails if r.device and r.device not in usable]
    if not missing:
        return []
    names = ", ".join(f"{r.device} ({r.name})" for r in missing)
    return [Unfit("devices", f"the rails' RDMA devices not in this container: {names}; "
                  f"request {resource} in resources.limits, or check the device plugin's "
                  "selectors")]


def verdict_problems(verdict: NodeVerdict) -> list[Unfit]:
    if verdict.problem is not None:
        return [Unfit("node", f"cannot tell whether this node's fabric is ready: "
                      f"{verdict.problem}")]
    if verdict.ready:
        return []
    return [Unfit("node", f"node {verdict.node} is not fabric-ready: FabricReady "
                  f"({verdict.reason}): {verdict.message}")]


def storage_problems(lustre: Mapping[str, str | None]) -> list[Unfit]:
    return [Unfit("storage", f"{mountpoint}: {why}") for mountpoint, why in lustre.items()
            if why is not None]
