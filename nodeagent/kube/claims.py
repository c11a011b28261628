"""Which pod on this node holds which DRA device: its pods (core/v1) and the ResourceClaims
they name (resource.k8s.io/v1), parsed. Another program's data: a field of the wrong shape
reads as absent, never as a crash.

Shapes from k8s.io/api v0.34 (core/v1 and resource/v1 types.go):
- PodSpec.resourceClaims[] {name, resourceClaimName}: a claim named outright;
- PodStatus.resourceClaimStatuses[] {name, resourceClaimName}: the claim the resourceclaim
  controller made from a template for this pod;
- ResourceClaimStatus.allocation.devices.results[] {request, driver, pool, device}.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nodeagent.kube.fields import items, obj, text
from nodeagent.model.kube import DeviceRef

ENDED = ("Succeeded", "Failed")  # a pod in these phases holds no device any longer
MAX_PODS = 2000  # a node's pods read, at most (the kubelet's default limit is 110)
MAX_CLAIMS = 32  # per pod
MAX_RESULTS = 64  # devices per claim


@dataclass(frozen=True)
class PodClaims:
    pod: str  # namespace/name
    claims: tuple[str, ...]  # namespace/name of each claim it names
    uid: str = ""  # metadata.uid: a pod made again under the same name is another pod


def node_pods(pods: Iterable[Any]) -> tuple[frozenset[str], list[PodClaims]]:
    """The pods here and not ended (namespace/name), and the claims of those with any."""
    live: set[str] = set()
    held = []
    for pod in list(pods)[:MAX_PODS]:
        meta, spec, status = (obj(obj(pod).get(k)) for k in ("metadata", "spec", "status"))
        namespace, name = text(meta.get("namespace")), text(meta.get("name"))
        if not namespace or not name or text(status.get("phase")) in ENDED:
            continue
        key = f"{namespace}/{name}"
        live.add(key)
        names = [text(obj(c).get("resourceClaimName")) for c in
                 items(spec.get("resourceClaims")) + items(status.get("resourceClaimStatuses"))]
        claims = tuple(dict.fromkeys(f"{namespace}/{n}" for n in names if n))[:MAX_CLAIMS]
        if claims:
            held.append(PodClaims(key, claims, text(meta.get("uid"))))
    return frozenset(live), held


def allocated(claim: Any) -> tuple[DeviceRef, ...]:
    """The devices a claim was allocated (none before the scheduler allocated it)."""
    allocation = obj(obj(obj(claim).get("status")).get("allocation"))
    out = []
    for r in items(obj(allocation.get("devices")).get("results"))[:MAX_RESULTS]:
        ref = DeviceRef(*(text(obj(r).get(k)) for k in ("driver", "pool", "device")))
        if ref.driver and ref.pool and ref.device:
            out.append(ref)
    return tuple(out)
