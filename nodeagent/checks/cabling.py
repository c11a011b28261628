"""RailCablingVerified: the switch port at each rail's far end, heard over LLDP. Pure.

A rail-optimised fabric fails by cabling too: rail 1 plugged into rail 0's leaf reaches
some peers and not others. With `lldp.switch_name`, each rail's switch must match its
pattern; without, the switches are reported. A rail whose switch sends no LLDP (or whose
NIC's firmware keeps the frames) is Unknown and never holds FabricReady.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

from nodeagent.config import Config
from nodeagent.model.conditions import RAIL_CABLING_VERIFIED, Finding, Problems
from nodeagent.model.network import Neighbour

NO_LLDP = "NoLLDPSeen"
NOT_LISTENING = "LLDPNotReadable"
MISCABLED = "RailMiscabled"


def heard_now(heard: Mapping[str, tuple[Neighbour, float]], now: float) -> dict[str, Neighbour]:
    """What still holds: a neighbour past its TTL (0: the switch withdrew it) is gone."""
    return {r: n for r, (n, at) in heard.items() if now - at <= n.ttl}


def cabling_finding(cfg: Config, heard: Mapping[str, tuple[Neighbour, float]],
                    now: float, unopened: Mapping[str, str] | None = None) -> Finding:
    problems = Problems(RAIL_CABLING_VERIFIED)
    section = cfg.lldp
    if section is None:
        return problems.finding("NotConfigured", "no lldp section configured")
    if not cfg.rails:
        return problems.finding("NotConfigured", "no rails configured")
    current = heard_now(heard, now)
    seen = []
    for n, rail in enumerate(cfg.rails):
        with problems.about(rail.name):
            neighbour = current.get(rail.name)
            if neighbour is None and rail.name in (unopened or {}):
                problems.unknown(NOT_LISTENING, f"{rail.label}: {(unopened or {})[rail.name]}")
                continue
            if neighbour is None:
                problems.unknown(NO_LLDP, f"{rail.label}: no LLDP seen (the switch sends none, "
                                          "or the NIC's firmware keeps the frames)")
                continue
            where = f"{rail.label}: {neighbour.switch} port {neighbour.port}"
            want = section.expected(rail.name, n)
            if want is not None and not fnmatch.fnmatchcase(neighbour.switch, want):
                problems.fail(MISCABLED, f"{where}, expected a switch matching {want}")
            else:
                seen.append(where)
    reason = "CablingAsExpected" if section.switch_name is not None else "SwitchesSeen"
    return problems.finding(reason, "; ".join(seen))
