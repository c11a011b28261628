"""The fleet's peer mesh, from what the agents publish on their Leases (kube/peercard.py):
each prober's verdict per peer, mapped to node names by the peers' cards. Never from
condition messages.

`kubectl fabric` shows per node and rail how many of its peers pass, and flags a node as
`peer-suspect` on a rail when most nodes that probe it fail over RoCE while they pass with
their other peers (Pingmesh's localisation: the fault is at the probed node, not at its
probers). With each rail's switch known (the agents' LLDP labels), a switch whose nodes
fail to and from the other switches' nodes is named once with its nodes, and they are not
peer-suspect for it (R-Pingmesh's ToR-mesh against inter-ToR probes). `kubectl fabric
mesh` draws the prober x target matrix of one rail or all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nodeagent.io.files import printable
from nodeagent.kube.peercard import lease_node, parse_card, parse_mesh
from nodeagent.model.peers import MeshVerdict

FAULTS = (MeshVerdict.ROCE, MeshVerdict.MTU)
# One letter a verdict (readable without colour), and its colour on a terminal.
CELL = {MeshVerdict.OK: ("o", "32"), MeshVerdict.ROCE: ("X", "1;31"),
        MeshVerdict.MTU: ("M", "1;31"), MeshVerdict.SILENT: ("?", "33"),
        MeshVerdict.REFUSED: ("R", "33"), MeshVerdict.LOCAL: ("L", "35"),
        MeshVerdict.PENDING: (".", "2")}
LEGEND = ("o ok, X RoCE fails while TCP reaches the peer, M fails at the path MTU,\n"
          "? no responder (agent down), R refused, L prober cannot probe, . not reached yet,"
          " blank: not probed")


@dataclass(frozen=True)
class MeshCell:
    rail: str  # the prober's rail
    prober: str  # node
    target: str  # node, or the address when no card names it
    verdict: MeshVerdict


def mesh_cells(leases: Iterable[Any]) -> list[MeshCell]:
    """Every prober's verdict on every peer it published, targets named by their cards."""
    leases = list(leases)
    owner: dict[str, str] = {}  # rail address -> node
    for lease in leases:
        card = parse_card(lease)
        if card is None:
            continue
        for end in card.rails:
            owner.setdefault(end.address, card.node)
    cells: list[MeshCell] = []
    for lease in leases:
        prober = lease_node(lease)
        if prober is None:
            continue
        for rail, peers in parse_mesh(lease).items():
            cells.extend(MeshCell(rail, prober, owner.get(address, address), verdict)
                         for address, verdict in peers.items())
    return cells


@dataclass(frozen=True)
class PeerCount:
    passing: int
    probed: int

    def __str__(self) -> str:
        return f"{self.passing}/{self.probed}"


def peer_counts(cells: Iterable[MeshCell]) -> dict[str, dict[str, PeerCount]]:
    """node -> rail -> its peers passing and probed, from the node's own probes."""
    out: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for c in cells:
        got = out[c.prober][c.rail]
        got[0] += c.verdict == MeshVerdict.OK
        got[1] += 1
    return {n: {r: PeerCount(v[0], v[1]) for r, v in sorted(rails.items())}
            for n, rails in out.items()}


def suspects(cells: Iterable[MeshCell]) -> dict[str, list[str]]:
    """node -> the rails on which it is suspect: two or more nodes probe it there, most of
    them fail over RoCE, and those that fail pass with most of their other peers; and
    either every one of three or more probers fails, or the node's own probes there
    mostly fail too. A read is a round trip, so a fault at a node fails its own probes as
    surely as its probers': two flaky pairs that happen to meet at a healthy node (one in
    a few hundred thousand pairs, 10,000 nodes x 8 rails: about once a view,
    bench/localisation.py) do not name it."""
    cells = list(cells)
    elsewhere: dict[tuple[str, str], list[MeshVerdict]] = defaultdict(list)
    for c in cells:
        elsewhere[(c.prober, c.rail)].append(c.verdict)
    by_target: dict[tuple[str, str], list[MeshCell]] = defaultdict(list)
    for c in cells:
        by_target[(c.target, c.rail)].append(c)
    out: dict[str, list[str]] = defaultdict(list)
    for (target, rail), probes in sorted(by_target.items()):
        failing = [c for c in probes if c.verdict in FAULTS]
        if len(probes) < 2 or 2 * len(failing) <= len(probes):
            continue
        healthy = 0
        for c in failing:
            others = list(elsewhere[(c.prober, rail)])
            others.remove(c.verdict)
            if others and 2 * sum(v == MeshVerdict.OK for v in others) >= len(others):
                healthy += 1
        own = elsewhere.get((target, rail), [])
        own_failing = sum(v in FAULTS for v in own)
        if 2 * healthy > len(failing) and (len(failing) == len(probes) >= 3
                                           or 2 * own_failing > len(own)):
            out[target].append(rail)
    return dict(out)


@dataclass(frozen=True)
class SwitchFault:
    """A switch named once for its nodes on a rail: most probes between its nodes and
    nodes under other switches fail over RoCE, touching most of its nodes (a leaf, or its
    uplinks, not one node under it)."""

    rail: str
    switch: str
    nodes: tuple[str, ...]  # every node the switch serves on the rail, failing or not
    outward: PeerCount  # probes to and from nodes under other switches: passing/probed
    among: PeerCount  # probes among its own nodes

    @property
    def words(self) -> str:
        failing = self.outward.probed - self.outward.passing
        where = (f"{self.among.passing} of {self.among.probed} among its nodes pass: its "
                 "uplinks or its routes out" if self.among.probed
                 and 2 * self.among.passing >= self.among.probed else
                 f"{self.among.probed - self.among.passing} of {self.among.probed} among its "
                 "nodes fail too: the switch itself" if self.among.probed else
                 "none probed among its nodes")
        return (f"switch {printable(self.switch)} on {printable(self.rail)}: {failing} of "
                f"{self.outward.probed} probes to and from other switches fail over RoCE; "
                f"{where} ({len(self.nodes)} nodes: "
                f"{', '.join(printable(n) for n in self.nodes)})")


def switch_faults(cells: Iterable[MeshCell], switch_of: Mapping[tuple[str, str], str]
                  ) -> list[SwitchFault]:
    """Each (rail, switch) whose nodes fail outward or fail outright, from the nodes'
    published verdicts and each node's switch per rail (its LLDP label). Linear in the
    cells: each is looked at from its prober's switch and its target's."""
    members: dict[tuple[str, str], set[str]] = defaultdict(set)
    for (node, rail), switch in switch_of.items():
        members[(rail, switch)].add(node)
    touching: dict[tuple[str, str], list[MeshCell]] = defaultdict(list)
    for c in cells:
        ends = {switch_of.get((c.prober, c.rail)), switch_of.get((c.target, c.rail))}
        for end in ends:
            if end is not None:
                touching[(c.rail, end)].append(c)
    out = []
    for (rail, switch), nodes in sorted(members.items()):
        if len(nodes) < 2:
            continue  # one node under a switch is that node: peer-suspect says it
        seen = touching.get((rail, switch), [])
        outward = [c for c in seen if (c.prober in nodes) != (c.target in nodes)]
        among = [c for c in seen if c.prober in nodes and c.target in nodes]
        failing = [c for c in outward if c.verdict in FAULTS]
        hit = {c.prober if c.prober in nodes else c.target for c in failing}
        if len(outward) < 2 or 2 * len(failing) <= len(outward) or 2 * len(hit) <= len(nodes):
            continue
        out.append(SwitchFault(rail, switch, tuple(sorted(nodes)),
                               PeerCount(len(outward) - len(failing), len(outward)),
                               PeerCount(sum(c.verdict == MeshVerdict.OK for c in among),
                                         len(among))))
    return out


def _order(cells: list[MeshCell]) -> list[str]:
    return sorted({c.prober for c in cells} | {c.target for c in cells})


def render_grid(cells: list[MeshCell], rail: str | None, color: bool) -> str:
    """The matrix of one rail (or each rail in turn): rows are probers, columns targets
    (numbered as the rows), a letter a cell (LEGEND)."""
    rails = sorted({c.rail for c in cells}) if rail is None else [rail]
    if not cells or (rail is not None and not any(c.rail == rail for c in cells)):
        return f"no peer results published{f' for rail {printable(rail)}' if rail else ''}\n"
    blocks = []
    for r in rails:
        mine = [c for c in cells if c.rail == r]
        nodes = _order(mine)
        index = {n: i for i, n in enumerate(nodes)}
        grid: dict[tuple[int, int], MeshVerdict] = {
            (index[c.prober], index[c.target]): c.verdict for c in mine}
        width = max(len(str(len(nodes) - 1)), 1)
        name_w = max(len(printable(n)) for n in nodes)
        head = " " * (width + name_w + 2) + " ".join(
            str(i).rjust(width) for i in range(len(nodes)))
        lines = [f"rail {printable(r)} (rows probe columns)", head]
        for i, node in enumerate(nodes):
            row = []
            for j in range(len(nodes)):
                verdict = grid.get((i, j))
                letter, code = CELL[verdict] if verdict is not None else (" ", "")
                cell = letter.rjust(width)
                row.append(f"\033[{code}m{cell}\033[0m" if color and code else cell)
            lines.append(f"{str(i).rjust(width)} {printable(node).ljust(name_w)} "
                         + " ".join(row))
        blocks.append("\n".join(line.rstrip() for line in lines))
    return "\n\n".join(blocks) + "\n\n" + LEGEND + "\n"


GRID_MAX = 64  # nodes a grid shows; a larger mesh is summarised by switch
SUMMARY_LEGEND = ("o every probe passes, x some fail (at most half), X most fail,"
                  " blank: not probed; rows probe columns; --switch S draws S's nodes")


def switch_pairs(cells: Iterable[MeshCell], switch_of: Mapping[tuple[str, str], str]
                 ) -> dict[tuple[str, str, str], PeerCount]:
    """(rail, prober's switch, target's switch) -> probes passing and probed; a node
    whose switch is not known counts under '?'."""
    out: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    for c in cells:
        key = (c.rail, switch_of.get((c.prober, c.rail), "?"),
               switch_of.get((c.target, c.rail), "?"))
        got = out[key]
        got[0] += c.verdict == MeshVerdict.OK
        got[1] += 1
    return {k: PeerCount(v[0], v[1]) for k, v in out.items()}


def _summary_cell(count: PeerCount | None) -> tuple[str, str]:
    if count is None or not count.probed:
        return " ", ""
    failing = count.probed - count.passing
    if not failing:
        return "o", "32"
    return ("X", "1;31") if 2 * failing > count.probed else ("x", "33")


def render_switches(cells: list[MeshCell], switch_of: Mapping[tuple[str, str], str],
                    rail: str | None, color: bool) -> str:
    """The mesh of a large fleet, switch x switch per rail: one letter a pair of switches
    (SUMMARY_LEGEND), then the pairs that fail, with their figures."""
    pairs = switch_pairs(cells, switch_of)
    rails = sorted({k[0] for k in pairs}) if rail is None else [rail]
    if not pairs or (rail is not None and not any(k[0] == rail for k in pairs)):
        return f"no peer results published{f' for rail {printable(rail)}' if rail else ''}\n"
    blocks = []
    for r in rails:
        switches = sorted({k[1] for k in pairs if k[0] == r} | {k[2] for k in pairs
                                                                   if k[0] == r})
        if len(switches) > GRID_MAX:  # no matrix a terminal holds: the failing pairs alone
            failing = [f"  {printable(a)} -> {printable(b)}: {c.probed - c.passing} of "
                       f"{c.probed} fail" for (rr, a, b), c in sorted(pairs.items())
                       if rr == r and c.passing < c.probed]
            probed = sum(c.probed for (rr, _, _), c in pairs.items() if rr == r)
            blocks.append("\n".join([f"rail {printable(r)}: {len(switches)} switches, "
                                      f"{probed} probes, {len(failing)} pairs of switches "
                                      "with failures", *failing]))
            continue
        width = max(len(str(len(switches) - 1)), 1)
        name_w = max(len(printable(sw)) for sw in switches)
        lines = [f"rail {printable(r)} by switch (rows probe columns)",
                 " " * (width + name_w + 2) + " ".join(
                     str(i).rjust(width) for i in range(len(switches)))]
        failing = []
        for i, a in enumerate(switches):
            row = []
            for b in switches:
                count = pairs.get((r, a, b))
                letter, code = _summary_cell(count)
                cell = letter.rjust(width)
                row.append(f"\033[{code}m{cell}\033[0m" if color and code else cell)
                if count is not None and count.passing < count.probed:
                    failing.append(f"  {printable(a)} -> {printable(b)}: "
                                   f"{count.probed - count.passing} of {count.probed} fail")
            lines.append(f"{str(i).rjust(width)} {printable(a).ljust(name_w)} " + " ".join(row))
        blocks.append("\n".join(line.rstrip() for line in [*lines, *failing]))
    return "\n\n".join(blocks) + "\n\n" + SUMMARY_LEGEND + "\n"


def under_switch(cells: Iterable[MeshCell], switch_of: Mapping[tuple[str, str], str],
                 switch: str) -> list[MeshCell]:
    """The probes from or to the nodes under one switch: the drill-down's grid."""
    return [c for c in cells if switch in (switch_of.get((c.prober, c.rail)),
                                           switch_of.get((c.target, c.rail)))]


def mesh_document(cells: list[MeshCell], rail: str | None) -> dict[str, Any]:
    """The same matrix as data: a v1 List of prober/target/rail/verdict items."""
    return {"apiVersion": "v1", "kind": "List", "metadata": {},
            "items": [{"rail": c.rail, "prober": c.prober, "target": c.target,
                       "verdict": str(c.verdict)}
                      for c in sorted(cells, key=lambda c: (c.rail, c.prober, c.target))
                      if rail is None or c.rail == rail]}


def peers_text(counts: Mapping[str, PeerCount], per_rail: bool = False) -> str:
    """A node's peers column: passing/probed over all its rails (or each rail's), '-'
    when it publishes none."""
    if not counts:
        return "-"
    if per_rail:
        return " ".join(f"{printable(r)}:{c}" for r, c in counts.items())
    return str(PeerCount(sum(c.passing for c in counts.values()),
                         sum(c.probed for c in counts.values())))
