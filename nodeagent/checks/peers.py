"""RDMAPeersReachable: each rail's recent probes of its peers, judged. Pure.

A peer is failing once its latest `peers.failures` probes in a row did not end OK (one
lost probe is not a verdict). What failed says where the fault is:
- RoCE failed while TCP reached the same responder: the fabric drops what jobs use while
  their TCP bootstrap still works, the silent fallback, and the message always says so;
  all of a rail's peers failing (two or more, each answering on TCP) points at this
  node's side;
- small reads passed and a read at the path MTU failed: the path MTU is smaller than the
  hosts' (a switch port at 1500 behind hosts at 4200);
- nothing answered on TCP either: the peer or its agent is down, which is not a fabric
  verdict (Unknown);
- with more than one traffic class probed (`peers.classes`), a peer that fails over RoCE
  in one class while it passes in another: the path drops that class (PFC off for its
  priority, a DSCP trust or remap, an ACL on DSCP), which class 0 alone never shows.
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nodeagent.config import Config, Peers
from nodeagent.model.conditions import RDMA_PEERS_REACHABLE, Finding, Problems
from nodeagent.model.peers import Class, PeerOutcome, PeerProbe, PeerRef, PeerStats

FABRIC_FAULTS = (PeerOutcome.ROCE_FAILED, PeerOutcome.MTU_FAILED)
NOT_RESPONDING = "PeerNotResponding"  # about the peer, not this node: never a taint
NO_PEERS = "NoPeersFound"  # discovery found no other agent on the rail's network: no taint
CLASS_DROPPED = "TrafficClassDropped"
# While every probe passes as before, the prober hands its rounds over this often (each
# hand-over is a pass): a change of outcome, or any failure, goes at once.
QUIET_DELIVERY = 10.0


@dataclass
class PeerHistory:
    """The latest probes of each (rail, peer address, traffic class), as many as
    `peers.window`."""

    probes: dict[tuple[str, str, int], deque[PeerProbe]] = field(default_factory=dict)
    totals: dict[tuple[str, str, int], Counter[str]] = field(default_factory=dict)  # by outcome

    def observe_round(self, probes: Mapping[str, Iterable[PeerProbe]], skipped: Iterable[str],
                      window: int) -> None:
        """One round: each probed rail's peers (a peer or class no longer probed is
        forgotten, so a reload never judges one it dropped), and skipped rails forgotten
        whole."""
        gone = set(skipped)
        kept: set[tuple[str, str, int]] = set()
        for rail_probes in probes.values():
            for p in rail_probes:
                key = (p.rail, p.address, p.traffic_class)
                kept.add(key)
                have = self.probes.get(key)
                if have is None or have.maxlen != window:
                    have = self.probes[key] = deque(have or (), maxlen=window)
                have.append(p)
                self.totals.setdefault(key, Counter())[str(p.outcome)] += 1
        for key in [k for k in self.probes if k[0] in gone or (k[0] in probes
                                                               and k not in kept)]:
            del self.probes[key]
            self.totals.pop(key, None)

    def stats(self, rail: str, address: str, failures: int = 1,
              traffic_class: int = 0) -> PeerStats | None:
        key = (rail, address, traffic_class)
        kept = self.probes.get(key)
        if not kept:
            return None
        return peer_stats(list(kept), failures, dict(self.totals.get(key, {})))


def peer_stats(probes: list[PeerProbe], failures: int = 1,
               totals: Mapping[str, int] | None = None) -> PeerStats:
    """The figures of one peer's probes, oldest first (there must be some); failing once
    `failures` in a row did not end OK."""
    last = probes[-1]
    failing = 0
    for p in reversed(probes):
        if p.outcome == PeerOutcome.OK:
            break
        failing += 1
    rtts = sorted(r for p in probes if p.outcome == PeerOutcome.OK for r in p.rtt_us)
    p50 = statistics.median(rtts) if rtts else None
    p99 = rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))] if rtts else None
    sampled = next((p.bandwidth_gbps for p in reversed(probes)
                    if p.bandwidth_gbps is not None), None)
    return PeerStats(last.address, last.node, last, failing, len(probes),
                     sum(1 for p in probes if p.outcome != PeerOutcome.OK), p50, p99,
                     dict(totals or {}), failing >= failures, sampled)


def static_peers(peers: Peers | None) -> dict[str, tuple[PeerRef, ...]]:
    """The config's own peers per rail (discovery adds to them)."""
    if peers is None:
        return {}
    return {rail: tuple(PeerRef(p.address, p.node) for p in listed)
            for rail, listed in peers.static.items() if listed}


def rail_peer_stats(peers: Peers, listed: Mapping[str, tuple[PeerRef, ...]],
                    history: PeerHistory) -> dict[str, tuple[PeerStats, ...]]:
    """Each rail's listed peers that have been probed, in listed order, in each class
    probed."""
    out: dict[str, tuple[PeerStats, ...]] = {}
    classes = peers.probed_classes
    for rail, refs in listed.items():
        got = [history.stats(rail, p.address, peers.failures, tc) for p in refs
               for tc in classes]
        out[rail] = tuple(s for s in got if s is not None)
    return out


def _named(stats: Iterable[PeerStats]) -> str:
    return "; ".join(f"{s.last.label}: {s.last.error}" for s in stats)


def _who(s: PeerStats) -> str:
    return f"{s.node} {s.address}" if s.node else s.address


def peers_finding(cfg: Config, stats: Mapping[str, tuple[PeerStats, ...]],
                  skipped: Mapping[str, str], now: float,
                  transport_ok: Mapping[str, bool] | None = None,
                  listing: Mapping[str, tuple[PeerRef, ...]] | None = None,
                  short: Mapping[str, str] | None = None) -> Finding:
    """The condition over every rail with peers. `transport_ok`: which rails' local
    transport probe passed (an all-peers failure there is not this node's HCA);
    `listing`: each rail's peers (default: the config's); `short`: rails for which
    discovery found fewer peers than asked, and why."""
    problems = Problems(RDMA_PEERS_REACHABLE)
    peers = cfg.peers
    if peers is None:
        return problems.finding("NotConfigured", "no peers section configured")
    listing = static_peers(peers) if listing is None else listing
    short = short or {}
    fine: list[str] = []
    stale_after = 3 * (peers.interval + peers.timeout * max(
        (len(v) for v in listing.values()), default=1)) + QUIET_DELIVERY + 5.0
    for rail in cfg.rails:
        with problems.about(rail.name):
            listed = listing.get(rail.name)
            if not listed:
                if rail.name in short:
                    problems.unknown(NO_PEERS, f"{rail.name}: no peer to probe: {short[rail.name]}")
                elif peers.discover and cfg.manages(rail):
                    problems.unknown("PeersNotProbed", f"{rail.name}: discovering peers")
                continue
            got = stats.get(rail.name, ())
            if rail.name in skipped:
                problems.unknown("PeersNotProbed", f"{rail.name}: not probed: {skipped[rail.name]}")
                continue
            want = len(listed) * len(peers.probed_classes)
            if len(got) < want:
                problems.unknown("PeersNotProbed", f"{rail.name}: {len(listed) - len(got)} of "
                                 f"{len(listed)} peers not probed yet" if want == len(listed)
                                 else f"{rail.name}: {want - len(got)} of {want} peers and "
                                 "classes not probed yet")
                continue
            newest = max(s.last.at for s in got)
            if now - newest > stale_after:
                problems.unknown("PeersNotProbed",
                                 f"{rail.name}: last probe {now - newest:.0f} s ago (stuck?)")
                continue
            _judge_classes(rail.name, got, peers, problems, fine,
                           (transport_ok or {}).get(rail.name))
    if not fine and not problems:
        return problems.finding("NotConfigured", "no rail has peers configured")
    return problems.finding("PeersReachable", "; ".join(fine))


def _judge_classes(rail: str, got: tuple[PeerStats, ...], peers: Peers, problems: Problems,
                   fine: list[str], transport_ok: bool | None) -> None:
    """A rail probed in class 0 alone is judged as ever; in other or more classes, a
    class the path drops is named first, and each class is judged on what is left."""
    classes = sorted({s.traffic_class for s in got})
    if classes in ([], [0]):
        _judge_rail(rail, got, peers, problems, fine, transport_ok)
        return
    dropped = _dropped_classes(rail, got, peers, problems)
    for tc in classes:
        rest = tuple(s for s in got if s.traffic_class == tc and s not in dropped)
        if rest:
            _judge_rail(f"{rail} class {tc}", rest, peers, problems, fine, transport_ok)


def _dropped_classes(rail: str, got: tuple[PeerStats, ...], peers: Peers,
                     problems: Problems) -> list[PeerStats]:
    """Peers failing over RoCE in one class that pass in another: the class is dropped on
    the path between them, not the path itself. Each such class is one failure."""
    passes = {(s.address, s.traffic_class) for s in got
              if not s.failing and s.last.outcome == PeerOutcome.OK}
    out: list[PeerStats] = []
    for tc in sorted({s.traffic_class for s in got}):
        in_class = [s for s in got if s.traffic_class == tc]
        dropped = [s for s in in_class if s.failing and s.last.outcome in FABRIC_FAULTS
                   and any(a == s.address and o != tc for a, o in passes)]
        if not dropped:
            continue
        others = sorted({o for s in dropped for a, o in passes if a == s.address and o != tc})
        out.extend(dropped)
        jobs = " (the jobs' class, NCCL_IB_TC)" if tc == peers.traffic_class else ""
        problems.fail(CLASS_DROPPED,
                      f"{rail}: {Class(tc).words}{jobs} fails to {len(dropped)} of "
                      f"{len(in_class)} peers over RoCE while class "
                      f"{', '.join(map(str, others))} passes ({_named(dropped)}): the path "
                      "drops this class (PFC for its priority, DSCP trust or remap, an ACL); "
                      "TCP reaches them")
    return out


def _judge_rail(rail: str, got: tuple[PeerStats, ...], peers: Peers, problems: Problems,
                fine: list[str], transport_ok: bool | None) -> None:
    failing = [s for s in got if s.failing]
    roce = [s for s in failing if s.last.outcome in FABRIC_FAULTS]
    mtu = [s for s in roce if s.last.outcome == PeerOutcome.MTU_FAILED]
    silent = [s for s in failing if s.last.outcome in (PeerOutcome.NO_RESPONDER,
                                                       PeerOutcome.REFUSED)]
    local = [s for s in failing if s.last.outcome == PeerOutcome.LOCAL]
    answering = len(got) - len(silent)  # peers whose responder TCP reaches
    if local:
        problems.unknown("PeerProbeFailed", f"{rail}: cannot probe: {local[0].last.error}")
        return
    if mtu:
        problems.fail("PathMTUTooSmall",
                      f"{rail}: {len(mtu)} of {len(got)} peers fail at the path MTU over "
                      f"RoCE ({_named(mtu)}); TCP reaches them")
    rest = [s for s in roce if s not in mtu]
    # One peer cannot localise (Pingmesh: a fault either end fails the one pair); two or
    # more all failing, while each answers on TCP, point at this node's side.
    if rest and len(roce) == answering >= 2:
        where = (" while this node's own transport probe passes" if transport_ok else "")
        problems.fail("AllPeersUnreachable",
                      f"{rail}: all {len(roce)} peers fail over RoCE ({_named(rest)}); TCP "
                      f"reaches them: this node's link, switch port or VLAN{where}")
    elif rest:
        problems.fail("PeerUnreachable",
                      f"{rail}: {len(rest)} of {len(got)} peers fail over RoCE "
                      f"({_named(rest)}); TCP reaches them")
    if silent:
        problems.unknown(NOT_RESPONDING,
                         f"{rail}: {len(silent)} of {len(got)} peers do not answer on TCP "
                         f"either, so their agent is down or the node gone ({_named(silent)})")
    # Fewer failures than peers.failures is no verdict, but a peer never reached in the
    # window is not reached either: not yet known.
    unproven = [s for s in got if not s.failing and s.failing_for == s.probes]
    if unproven:
        problems.unknown("PeersNotProbed", f"{rail}: not reached yet ({_named(unproven)})")
    passing = [s for s in got if not s.failing and s not in unproven]
    slow = [s for s in passing if s.rtt_p99_us is not None
            and s.rtt_p99_us > peers.max_rtt * 1e6]
    if slow:
        problems.fail("PeerLatencyHigh", f"{rail}: RTT p99 over {peers.max_rtt * 1e3:g} ms to "
                      + ", ".join(f"{_who(s)} ({s.rtt_p99_us or 0:.0f} us)" for s in slow))
    if passing and len(passing) == len(got) and not slow:
        worst = max((s.rtt_p99_us or 0.0) for s in got)
        fine.append(f"{rail}: {len(got)} of {len(got)} peers reached over RoCE "
                    f"(RTT p99 up to {worst:.0f} us)")
