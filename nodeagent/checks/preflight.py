"""Whether a training pod may start on this node: its own view of the fabric against what
the node's agent knows. Pure: facts in, one Unfit per problem out, each saying what to
change. (The gang's RoCE probe is cli/gang.py; its problems join these.)

The environment checks follow NCCL's own reading of its variables (src/transport/net_ib
and src/misc/param): `NCCL_IB_DISABLE` an integer, non-zero disables the IB/RoCE
transport; `NCCL_NET` forces one network by name and never falls back (`Socket` forces
sockets); `NCCL_IB_HCA` a comma-separated list of `device[:port]`, prefix-matched unless it
starts with `=`, excluded when it starts with `^`; `NCCL_IB_GID_INDEX` the GID index used
on every device; `NCCL_IB_ROCE_VERSION_NUM` the RoCE version of an automatically chosen
GID.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from nodeagent.model import NodeRail, NodeVerdict, Unfit, VerbsDevice


@dataclass(frozen=True)
class PreflightFacts:
    verdict: NodeVerdict
    devices: Sequence[VerbsDevice] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    lustre: Mapping[str, str | None] = field(default_factory=dict)  # mountpoint -> why not
    resource: str = "rdma/rdma_shared_device_a"


def judge_preflight(facts: PreflightFacts) -> list[Unfit]:
    return [*device_problems(facts.devices, facts.verdict.rails, facts.resource),
            *verdict_problems(facts.verdict),
            *storage_problems(facts.lustre),
            *env_problems(facts.env, facts.verdict.rails)]


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


def _int(value: str) -> int | None:
    try:
        return int(value.strip(), 0)
    except ValueError:
        return None


def hca_selects(spec: str, device: str) -> bool:
    """Whether NCCL_IB_HCA selects the device (NCCL's matchIfList over `dev[:port]`)."""
    text = spec.strip()
    exclude = text.startswith("^")
    text = text.lstrip("^")
    exact = text.startswith("=")
    text = text.lstrip("=")
    names = [item.split(":", 1)[0].strip() for item in text.split(",") if item.strip()]
    hit = any(device == n if exact else device.startswith(n) for n in names)
    return not hit if exclude else hit


def env_problems(env: Mapping[str, str], rails: Iterable[NodeRail]) -> list[Unfit]:
    rails = list(rails)
    out: list[Unfit] = []
    disable = env.get("NCCL_IB_DISABLE")
    if disable is not None and (_int(disable) or 0) != 0:
        out.append(Unfit("env", f"NCCL_IB_DISABLE={disable} turns RDMA off (NCCL uses "
                         "sockets): remove it"))
    net = env.get("NCCL_NET")
    if net is not None and net.strip().lower() == "socket":
        out.append(Unfit("env", f"NCCL_NET={net} forces sockets: remove it, or set "
                         "NCCL_NET=IB"))
    devices = [r for r in rails if r.device]
    hca = env.get("NCCL_IB_HCA")
    if hca is not None and devices and not any(hca_selects(hca, r.device or "")
                                               for r in devices):
        names = ", ".join(sorted({r.device or "" for r in devices}))
        out.append(Unfit("env", f"NCCL_IB_HCA={hca} selects none of this node's rail devices "
                         f"({names}): NCCL would fall back to sockets; name them, or leave "
                         "it unset"))
    gid = env.get("NCCL_IB_GID_INDEX")
    if gid is not None:
        index = _int(gid)
        pinned = [r for r in rails if r.gid_index is not None]
        if index is None:
            out.append(Unfit("env", f"NCCL_IB_GID_INDEX={gid} is not a number"))
        else:
            off = [r for r in pinned if r.gid_index != index]
            if off:
                at = sorted({r.gid_index for r in pinned if r.gid_index is not None})
                what = ", ".join(f"{r.name} at {r.gid_index}" for r in off)
                fix = (f"set NCCL_IB_GID_INDEX={at[0]}" if len(at) == 1
                       else "leave it unset (the rails' pins differ)")
                out.append(Unfit("env", f"NCCL_IB_GID_INDEX={gid}, but the rails' IPv4 RoCE "
                                 f"v2 GIDs are pinned elsewhere ({what}): {fix}"))
    version = env.get("NCCL_IB_ROCE_VERSION_NUM")
    if version is not None and _int(version) == 1:
        out.append(Unfit("env", "NCCL_IB_ROCE_VERSION_NUM=1 selects RoCE v1 GIDs; the rails "
                         "are pinned on RoCE v2: remove it"))
    return out
