"""The device-plugin placeholder (issue 5) and FabricReady, the aggregate. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from nodeagent.config import Config
from nodeagent.model import (
    FABRIC_READY,
    RDMA_DEVICE_PLUGIN_READY,
    ConditionStatus,
    Finding,
)


def device_plugin_finding(cfg: Config) -> Finding:
    if cfg.device_plugin is None:
        return Finding(
            RDMA_DEVICE_PLUGIN_READY, "True", "NotConfigured", "no device_plugin configured"
        )
    if cfg.kubernetes is None:
        return Finding(
            RDMA_DEVICE_PLUGIN_READY,
            "Unknown",
            "KubernetesNotConfigured",
            "device_plugin is configured but the kubernetes section is not",
        )
    # Fail closed: a configured check this version cannot run must not read as healthy.
    return Finding(
        RDMA_DEVICE_PLUGIN_READY,
        "Unknown",
        "CheckUnavailable",
        "device plugin checks are not available in this version",
    )


def fabric_finding(parts: Sequence[Finding]) -> Finding:
    failing = [f for f in parts if not f.ok]
    if not failing:
        return Finding(
            FABRIC_READY, "True", "AllConditionsPassed", "all fabric conditions are True"
        )
    status: ConditionStatus = "False" if any(f.status == "False" for f in failing) else "Unknown"
    first = next(f for f in failing if f.status == status)
    message = "; ".join(f"{f.type}={f.status} ({f.reason})" for f in failing)
    return Finding(FABRIC_READY, status, first.reason, message)
