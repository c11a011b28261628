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
from nodeagent.model.jobs import NodeRail, NodeVerdict, PortView, Unfit, VerbsDevice


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

    def plan(self) -> NcclPlan:
        return predict(NcclEnv.read(self.env), self.ports, self.interfaces)


def judge_preflight(facts: PreflightFacts) -> list[Unfit]:
    return [*device_problems(facts.devices, facts.verdict.rails, facts.resource),
            *verdict_problems(facts.verdict),
            *storage_problems(facts.lustre),
            *nccl_problems(facts.plan(), facts.verdict.rails, facts.ports, facts.addresses,
                           allow_partial=facts.allow_partial)]


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
