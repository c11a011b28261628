"""FabricReady, the aggregate of the other conditions. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from nodeagent.model.conditions import FABRIC_READY, Finding, Problems


def fabric_finding(parts: Sequence[Finding]) -> Finding:
    """False when a gated condition is False (with its reason), Unknown when the rest are
    Unknown; the message names every condition that is not True. The rails it is owed to
    are those of the conditions that set its status."""
    problems = Problems(FABRIC_READY)
    for f in parts:
        if not f.ok:
            text = f"{f.type}={f.status} ({f.reason})"
            if f.status == "False":
                problems.fail(f.reason, text)
            else:
                problems.unknown(f.reason, text)
    found = problems.finding("AllConditionsPassed", "all fabric conditions are True")
    if found.ok:
        return found
    owed = [f for f in parts if f.status == found.status]
    rails: dict[str, str] = {}
    for f in owed:
        for rail, reason in f.rails.items():
            rails.setdefault(rail, reason)
    return replace(found, rails=rails,
                   whole_node=any(f.whole_node or not f.rails for f in owed))
