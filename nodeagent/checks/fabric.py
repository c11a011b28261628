"""FabricReady, the aggregate of the other conditions. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from nodeagent.model.conditions import FABRIC_READY, Finding, Problems


def fabric_finding(parts: Sequence[Finding]) -> Finding:
    """False when a gated condition is False (with its reason), Unknown when the rest are
    Unknown; the message names every condition that is not True."""
    problems = Problems(FABRIC_READY)
    for f in parts:
        if not f.ok:
            text = f"{f.type}={f.status} ({f.reason})"
            if f.status == "False":
                problems.fail(f.reason, text)
            else:
                problems.unknown(f.reason, text)
    return problems.finding("AllConditionsPassed", "all fabric conditions are True")
