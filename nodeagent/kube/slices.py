"""ResourceSlices (resource.k8s.io/v1) parsed once into this node's devices of one driver.

The shape is the API's (ResourceSliceSpec: driver, nodeName, pool {name, generation,
resourceSliceCount}, devices[] {name, attributes {<name>: {string|int|bool|version}}});
the attribute names are the driver's (dranet publishes `dra.net/ifName`, `dra.net/rdma`,
`dra.net/rdmaDevice`, `dra.net/mtu`: its published slices, e.g.
examples/aws_eks_examples/gpu-efa/resourceslice-dranet.yaml). Only the newest generation of
each pool counts (the API's rule: older slices of a pool are being replaced); a pool with
fewer slices than it says it has is named, its devices still read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nodeagent.kube.fields import items, obj, text
from nodeagent.model.kube import SliceDevice, SlicesObservation

MAX_DEVICES = 4096  # a node's devices read, at most


def _value(attribute: Any) -> str | int | bool | None:
    got = obj(attribute)
    for kind in ("bool", "int", "string", "version"):
        value = got.get(kind)
        if kind == "bool" and isinstance(value, bool):
            return value
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind in ("string", "version") and isinstance(value, str):
            return value[:256]
    return None


def _qualified(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def node_devices(slices: Iterable[Any], node: str, driver: str) -> SlicesObservation:
    """The devices `driver` publishes for `node` in `slices` (a list's items)."""
    current: dict[str, int] = {}
    mine = []
    for s in slices:
        spec = obj(obj(s).get("spec"))
        if text(spec.get("driver")) != driver or text(spec.get("nodeName")) != node:
            continue
        pool = obj(spec.get("pool"))
        raw = pool.get("generation")
        generation = raw if isinstance(raw, int) and not isinstance(raw, bool) else 0
        name = text(pool.get("name"))
        current[name] = max(current.get(name, generation), generation)
        mine.append((s, name, generation, pool.get("resourceSliceCount")))
    devices: list[SliceDevice] = []
    counted: dict[str, tuple[int, int]] = {}  # pool -> (slices seen, slices it says)
    for s, pool_name, generation, count in mine:
        if generation != current[pool_name]:
            continue  # an older generation: being replaced
        seen, says = counted.get(pool_name, (0, count if isinstance(count, int) else 1))
        counted[pool_name] = (seen + 1, says)
        slice_name = text(obj(obj(s).get("metadata")).get("name"))
        for d in items(obj(obj(s).get("spec")).get("devices")):
            if len(devices) >= MAX_DEVICES:
                break
            attributes = {}
            for key, attribute in list(obj(obj(d).get("attributes")).items())[:64]:
                value = _value(attribute)
                if isinstance(key, str) and value is not None:
                    attributes[_qualified(key, driver)] = value
            devices.append(SliceDevice(slice_name, text(obj(d).get("name")), attributes,
                                       pool_name))
    incomplete = tuple(sorted(p for p, (seen, says) in counted.items() if seen < says))
    return SlicesObservation(tuple(devices), incomplete=incomplete)
