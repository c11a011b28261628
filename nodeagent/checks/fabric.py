"""FabricReady, the aggregate of the other conditions. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from nodeagent.model import (
    FABRIC_READY,
    ConditionStatus,
    Finding,
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
