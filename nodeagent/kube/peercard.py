"""What an agent publishes on its own Lease for its peers and for the fleet's mesh view, and
how it is read back: labels to find peers by, a card (rails and responder port) and the
prober's verdict per peer. Read from other agents' Leases, so every parser takes any shape
and returns None or skips what it cannot read, never raises.

Labels (selectable by the API server, so a peer sample costs a bounded list):
- `ring.nodeagent.io/p1`, `p2`, `p3`: the first 1, 2 and 3 hex digits of sha256(node name),
  groups of about 1/16, 1/256 and 1/4096 of the fleet (run/discovery.py lists the finest
  group that holds enough peers);
- `net.nodeagent.io/<network>` (e.g. `10.10.1.0-24`), one per rail: the fallback list of
  every agent on one rail network, for a network too small for any group;
- `switch.nodeagent.io/<rail>` = the switch the rail hears over LLDP (label-safe), with an
  lldp section: the list of the agents under one switch (a leaf's 32 or so), from which
  discovery takes its share of same-switch peers.
Annotations:
- `nodeagent.io/peer-card`: `{"port": 18600, "rails": {"rail0": "10.10.0.5/24", ...},
  "switches": {"rail0": "leaf-07-r0", ...}}` (switches only where heard);
- `nodeagent.io/peer-mesh`: `{"rail0": {"10.10.0.6": "ok", "10.10.0.7": "roce"}, ...}`;
- `nodeagent.io/rails-aside` (peers section or not, while any is):
  `{"lent": {"rail1": "pod ml/train-0 (claim ml/train-0-nic)"}, "tainted": {"rail2":
  "PortDown"}}`: rails lent to a pod, and rails under the agent's DeviceTaintRule.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from nodeagent.io.files import parse_json_state, printable
from nodeagent.kube.fields import obj, text, timestamp
from nodeagent.model.kube import RailsAside, label_value
from nodeagent.model.peers import CardRail, MeshVerdict, PeerCard, PeerOutcome, PeerStats
from nodeagent.model.status import RailStatus

RING = "ring.nodeagent.io/p"
NET = "net.nodeagent.io/"
SWITCH = "switch.nodeagent.io/"
CARD = "nodeagent.io/peer-card"
MESH = "nodeagent.io/peer-mesh"
ASIDE = "nodeagent.io/rails-aside"
RING_LEVELS = (3, 2, 1)  # hex digits of the group label, finest first
LEASE_PREFIX = "nodeagent-"
MAX_ANNOTATION = 64 << 10  # a card or mesh larger than this is someone else's mischief
MAX_RAILS = 64
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_RAIL = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,62}")


def ring_hash(node: str) -> str:
    return hashlib.sha256(node.encode()).hexdigest()


def ring_label(level: int) -> str:
    return f"{RING}{level}"


def net_label(network: str) -> str:
    """`10.10.1.0/24` -> `net.nodeagent.io/10.10.1.0-24` (a label name has no '/')."""
    return NET + network.replace("/", "-")


def card_labels(card: PeerCard) -> dict[str, str]:
    h = ring_hash(card.node)
    labels = {ring_label(level): h[:level] for level in RING_LEVELS}
    labels.update({net_label(r.network): "" for r in card.rails})
    labels.update({switch_key(r.name): r.switch for r in card.rails if r.switch})
    return labels


def switch_key(rail: str) -> str:
    return SWITCH + rail


def card_annotation(card: PeerCard) -> str:
    doc: dict[str, Any] = {"port": card.port,
                           "rails": {r.name: f"{r.address}/{_prefix(r.network)}"
                                     for r in card.rails}}
    switches = {r.name: r.switch for r in card.rails if r.switch}
    if switches:
        doc["switches"] = switches
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _prefix(network: str) -> int:
    return ipaddress.IPv4Network(network).prefixlen


def mesh_verdict(stats: PeerStats) -> MeshVerdict:
    """One peer's verdict, as the condition sees it: failing by its latest outcome, else
    ok once reached, else pending."""
    if stats.failing:
        return {PeerOutcome.ROCE_FAILED: MeshVerdict.ROCE,
                PeerOutcome.MTU_FAILED: MeshVerdict.MTU,
                PeerOutcome.NO_RESPONDER: MeshVerdict.SILENT,
                PeerOutcome.REFUSED: MeshVerdict.REFUSED,
                PeerOutcome.LOCAL: MeshVerdict.LOCAL}.get(stats.last.outcome, MeshVerdict.ROCE)
    if stats.failing_for == stats.probes:
        return MeshVerdict.PENDING
    return MeshVerdict.OK


def mesh_annotation(rails: Iterable[RailStatus]) -> str:
    return json.dumps({r.name: _worst_by_peer(r.peers) for r in rails if r.peers},
                      sort_keys=True, separators=(",", ":"))


def _worst_by_peer(stats: Iterable[PeerStats]) -> dict[str, str]:
    """A verdict a peer: probed in several traffic classes, the first that is not ok (a
    class dropped on the path is a fault of the pair, as the mesh shows faults)."""
    out: dict[str, MeshVerdict] = {}
    for p in stats:
        if out.get(p.address, MeshVerdict.OK) == MeshVerdict.OK:
            out[p.address] = mesh_verdict(p)
    return {address: str(v) for address, v in out.items()}


def lease_metadata(card: PeerCard | None, rails: Iterable[RailStatus],
                   aside: RailsAside | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations of the agent's Lease: the card and mesh with a card (each
    rail's switch, where it hears one, goes on the card from the rails' status), the rails
    set aside when there are any."""
    rails = list(rails)
    labels: dict[str, str] = {}
    notes = {ASIDE: json.dumps({"lent": dict(aside.lent), "tainted": dict(aside.tainted)},
                               sort_keys=True, separators=(",", ":"))} if aside else {}
    if card is None:
        return labels, notes
    heard = {r.name: name for r in rails if r.switch is not None
             and (name := label_value(r.switch.switch))}
    card = replace(card, rails=tuple(replace(r, switch=heard.get(r.name)) for r in card.rails))
    return card_labels(card), {CARD: card_annotation(card), MESH: mesh_annotation(rails),
                               **notes}


def read_aside(lease: Any) -> RailsAside:
    """The rails an agent's Lease says are set aside (none when it says nothing readable)."""
    doc = _json(obj(obj(obj(lease).get("metadata")).get("annotations")).get(ASIDE))

    def rails(value: Any) -> dict[str, str]:
        return {printable(k)[:63]: printable(v)[:200] for k, v in list(obj(value).items())
                [:MAX_RAILS] if isinstance(k, str) and isinstance(v, str)}

    return RailsAside(rails(doc.get("lent")), rails(doc.get("tainted")))


# ---------------------------------------------------------------- reading them back


def _json(text: Any) -> Mapping[str, Any]:
    if not isinstance(text, str) or len(text) > MAX_ANNOTATION:
        return {}
    try:  # the strict reader: a nested annotation is bad content, not a RecursionError
        return obj(parse_json_state(text))
    except ValueError:
        return {}


def lease_node(lease: Any) -> str | None:
    """The node an agent's Lease is for (`nodeagent-<node>`), or None."""
    name = obj(obj(lease).get("metadata")).get("name")
    if not isinstance(name, str) or not name.startswith(LEASE_PREFIX):
        return None
    node = name[len(LEASE_PREFIX):]
    return node if _NAME.fullmatch(node) else None


CLOCK_SKEW = 300.0  # seconds a Lease's renewal may be ahead of this clock and still count


@dataclass(frozen=True)
class AgentLease:
    """An agent's Lease, typed: whose it is, when it was renewed and for how long (what
    `fleet` shows as the heartbeat, and discovery needs to skip a gone agent)."""

    node: str
    renewed: float | None  # Unix seconds; None when absent or not a time
    duration: float | None  # seconds it promised; None when absent or not positive

    def live(self, now: float) -> bool:
        """Renewed within its duration; a renewal dated more than CLOCK_SKEW ahead of this
        clock (a forged Lease, a node whose clock is years off) is not taken as live: it
        would never go stale."""
        return (self.renewed is not None and self.duration is not None
                and self.renewed - CLOCK_SKEW <= now <= self.renewed + self.duration)


def lease_name(node: str) -> str:
    return f"{LEASE_PREFIX}{node}"


def read_lease(lease: Any) -> AgentLease | None:
    """An agent's Lease, or None for any other Lease."""
    node = lease_node(lease)
    if node is None:
        return None
    spec = obj(obj(lease).get("spec"))
    hold = spec.get("leaseDurationSeconds")
    duration = float(hold) if isinstance(hold, int) and not isinstance(hold, bool) else 0.0
    return AgentLease(node, timestamp(text(spec.get("renewTime"))),
                      duration if duration > 0 else None)


def lease_live(lease: Any, now: float) -> bool:
    """Whether the agent renewed its Lease within the duration it promised (a gone agent's
    card stays behind: probing it would only say PeerNotResponding)."""
    agent = read_lease(lease)
    return agent is not None and agent.live(now)


def parse_card(lease: Any) -> PeerCard | None:
    """The card on another agent's Lease; None when it has none or it does not parse.
    Rails with an address that is not a host's IPv4 address are left out."""
    node = lease_node(lease)
    doc = _json(obj(obj(obj(lease).get("metadata")).get("annotations")).get(CARD))
    port = doc.get("port")
    if node is None or not isinstance(port, int) or isinstance(port, bool) \
            or not 0 < port < 65536:
        return None
    rails = []
    switches = obj(doc.get("switches"))
    for name, value in list(obj(doc.get("rails")).items())[:MAX_RAILS]:
        if not isinstance(value, str) or not _RAIL.fullmatch(name):
            continue
        try:
            iface = ipaddress.IPv4Interface(value)
        except ValueError:
            continue
        ip, net = iface.ip, iface.network
        if ip.is_unspecified or ip.is_loopback or ip.is_multicast or ip.is_reserved:
            continue
        if net.prefixlen < 31 and ip in (net.network_address, net.broadcast_address):
            continue  # the subnet's own or broadcast address: no host's
        switch = switches.get(name)
        rails.append(CardRail(name, str(ip), str(iface.network),
                              switch if isinstance(switch, str) and switch
                              and label_value(switch) == switch else None))
    return PeerCard(node, port, tuple(rails)) if rails else None


def parse_mesh(lease: Any) -> dict[str, dict[str, MeshVerdict]]:
    """The prober's verdicts on another agent's Lease: rail -> peer address -> verdict;
    what does not parse is left out."""
    doc = _json(obj(obj(obj(lease).get("metadata")).get("annotations")).get(MESH))
    words = {str(v): v for v in MeshVerdict}
    out: dict[str, dict[str, MeshVerdict]] = {}
    for rail, peers in list(doc.items())[:MAX_RAILS]:
        if not _RAIL.fullmatch(rail):
            continue
        got = {}
        for address, verdict in list(obj(peers).items())[:256]:
            if _is_ipv4(address) and isinstance(verdict, str) and verdict in words:
                got[address] = words[verdict]
        out[rail] = got
    return out


@functools.lru_cache(maxsize=1 << 16)
def _is_ipv4(text: str) -> bool:
    """Cached: in a fleet view every peer address is in several probers' meshes (parsing
    them was a third of a 10,000-node view)."""
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True
