"""RDMAResourceSlicesReady: where the fabric is handed out by Dynamic Resource Allocation,
the DRA driver's ResourceSlices for this node must list each rail's NIC with RDMA, or a
claim that asks for an RDMA NIC gets none (or another), and the job trains over sockets.
The counterpart of RDMADevicePluginReady; clusters run either, so both are kept.

A rail's device is the one whose interface attribute names the rail's interface, else
whose RDMA-device attribute names the rail's `rdma_device`. Reasons: the driver publishes
nothing for this node (`NoSlices`), a rail missing from them (`RailNotInSlices`), its
device published without RDMA (`RDMANotPublished`, reported upstream after a driver
install) or with another MTU (`MTUMismatch`); Unknown while they cannot be read or a pool
is incomplete.
"""

from __future__ import annotations

from nodeagent.config import Config, Dra, Rail
from nodeagent.model.conditions import RDMA_RESOURCE_SLICES_READY, Finding, Problems
from nodeagent.model.kube import DeviceRef, SliceDevice, SlicesObservation


def rail_device(rail: Rail, dra: Dra, devices: tuple[SliceDevice, ...]) -> SliceDevice | None:
    names = dra.attributes
    interface, rdma_device = _key(dra, names.interface), _key(dra, names.rdma_device)
    found = next((d for d in devices if d.attributes.get(interface) == rail.interface), None)
    if found is None and rail.rdma_device:
        found = next((d for d in devices if d.attributes.get(rdma_device) == rail.rdma_device),
                     None)
    return found


def rail_devices(cfg: Config, seen: SlicesObservation | None) -> dict[str, DeviceRef]:
    """Rail -> its device in the slices (what a DeviceTaintRule for it selects)."""
    dra = cfg.dra
    if dra is None or seen is None:
        return {}
    out = {}
    for rail in cfg.rails:
        found = rail_device(rail, dra, seen.devices)
        if found is not None and found.pool:
            out[rail.name] = DeviceRef(dra.driver, found.pool, found.name)
    return out


def _key(dra: Dra, name: str) -> str:
    return name if "/" in name else f"{dra.driver}/{name}"


def slices_finding(cfg: Config, seen: SlicesObservation | None) -> Finding:
    problems = Problems(RDMA_RESOURCE_SLICES_READY)
    dra = cfg.dra
    if dra is None:
        return problems.finding("NotConfigured", "no dra section")
    if cfg.kubernetes is None:
        problems.unknown("SlicesUnreadable", "the dra section reads this node's ResourceSlices:"
                                             " it needs the kubernetes section")
        return problems.folded()
    if seen is None:
        problems.unknown("SlicesUnreadable", "not read yet")
        return problems.folded()
    if seen.error is not None:
        problems.unknown("SlicesUnreadable", f"ResourceSlices: {seen.error}")
        return problems.folded()
    node = cfg.resolved_node_name()
    if not seen.devices:
        problems.fail("NoSlices", f"driver {dra.driver} publishes no ResourceSlice for node "
                                  f"{node}: is it running here?")
        return problems.folded()
    fine = []
    for rail in cfg.rails:
        with problems.about(rail.name):
            device = rail_device(rail, dra, seen.devices)
            if device is None:
                problems.fail("RailNotInSlices",
                              f"{rail.label}: no device of {dra.driver} on {node} names "
                              f"{rail.interface}" + (f" or {rail.rdma_device}"
                                                     if rail.rdma_device else ""))
                continue
            rdma = device.attributes.get(_key(dra, dra.attributes.rdma))
            mtu = device.attributes.get(_key(dra, dra.attributes.mtu))
            where = f"{rail.label}: {dra.driver} device {device.name} (slice {device.slice})"
            if rdma is not True:
                problems.fail("RDMANotPublished",
                              f"{where} is published with {dra.attributes.rdma} {rdma!r}: a claim "
                              "for an RDMA NIC will not get it")
            elif isinstance(mtu, int) and rail.mtu and mtu != rail.mtu:
                problems.fail("MTUMismatch", f"{where} is published with MTU {mtu}, the rail's "
                                             f"is {rail.mtu}")
            else:
                fine.append(f"{rail.name}: {device.name}")
    if seen.incomplete:
        problems.unknown("SlicesUnreadable", "pools with slices missing (being published?): "
                         + ", ".join(seen.incomplete[:5]))
    return problems.finding("RailsPublished", f"{dra.driver}: " + "; ".join(fine))
