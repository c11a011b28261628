"""The peer probe as a source: the responder (run/responder.py) answering this node's
peers, and a prober thread probing them, each rail's peers one after another, every
`peers.interval` (stretched so a rail sends at most MAX_RATE probes a second). Rounds are
handed to the loop at once when an outcome changed or failed, else batched for
QUIET_DELIVERY seconds.

Both follow the rails the loop hands over after each pass (`retarget`, the transport
probe's): a rail whose GID is off its pin, or whose device is not known, is neither probed
nor served, and is delivered as skipped with the reason. Each rail keeps its device
context open between rounds; a probe's QP lives for the probe only. The peers are the
config's static ones, then (with `peers.discover`) those run/discovery.py found on the
rail's network; each round hands the listing over with its probes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Network

from nodeagent.checks.facts import PeersSeen
from nodeagent.checks.peers import QUIET_DELIVERY, static_peers
from nodeagent.config import MAX_PEERS, Config, Peers
from nodeagent.io.periodic import Periodic
from nodeagent.model.peers import (
    Class,
    PeerOutcome,
    PeerProbe,
    PeerRef,
    RailEndpoint,
    Targets,
)
from nodeagent.probes.peer import RailEnd, probe_peer
from nodeagent.probes.transport import ProbeFailed
from nodeagent.run.discovery import Discovered, PeerDiscovery
from nodeagent.run.own_rdma import OwnRDMA
from nodeagent.run.responder import Responder, Served
from nodeagent.run.work import Deliver

MAX_RATE = 10.0  # probes a second per rail (R-Pingmesh's budget per RNIC)


Listing = Mapping[str, tuple[PeerRef, ...]]  # rail -> the peers it probes


def round_period(peers: Peers, listing: Listing) -> float:
    """Seconds between a rail's rounds: `interval`, or longer when its peers (each probed
    in every class) are many."""
    most = max((len(p) for p in listing.values()), default=0) * len(peers.probed_classes)
    return max(peers.interval, most / MAX_RATE)


def merged_listing(peers: Peers, found: Discovered | None) -> dict[str, tuple[PeerRef, ...]]:
    """The static peers, then the discovered ones not listed already (MAX_PEERS at most)."""
    out = static_peers(peers)
    for rail, more in (found.peers if found is not None else {}).items():
        have = out.get(rail, ())
        seen = {p.address for p in have}
        out[rail] = (*have, *(p for p in more if p.address not in seen))[:MAX_PEERS]
    return {rail: listed for rail, listed in out.items() if listed}


def served_rails(cfg: Config, listing: Listing, targets: Targets) -> dict[str, Served]:
    """What the responder answers on: each ready rail that has peers, for those peers;
    with discovery every ready rail, for any address on the rail's own network (who probes
    this node is each prober's choice, from cards this agent never lists)."""
    peers = cfg.peers
    discover = peers is not None and peers.discover
    networks = {r.name: r.network for r in cfg.rails}
    out = {}
    for rail, target in targets.ready.items():
        if not (listing.get(rail) or discover):
            continue
        nets = frozenset({IPv4Network(networks[rail])}) if discover and rail in networks \
            else frozenset()
        out[rail] = Served(target, frozenset(p.address for p in listing.get(rail, ())), nets)
    return out


@dataclass
class _Track:
    """One listed peer on one rail in one traffic class, as the prober follows it."""

    last: PeerOutcome | None = None  # the last probe's outcome
    failing: int = 0  # failed probes in a row
    probed: int = -1  # probes so far, less one (every bandwidth_every-th reads bandwidth)


class PeerProber(Periodic):
    """One round: every ready rail's peers probed in turn, delivered together."""

    def __init__(self, cfg: Config, deliver: Deliver, own_rdma: OwnRDMA | None = None,
                 not_listening: Callable[[], Mapping[str, str]] = dict) -> None:
        super().__init__("peer-probe")
        self.cfg = cfg
        self.deliver = deliver
        self.own_rdma = own_rdma or OwnRDMA()
        self.not_listening = not_listening  # the responder's rails it cannot listen on
        self.targets: Targets | None = None
        self._ends: dict[str, RailEnd] = {}
        # Rounds not handed over yet (quiet ones are batched), and the last outcomes.
        self._pending: dict[str, list[PeerProbe]] = {}
        self._tracks: dict[tuple[str, str, int], _Track] = {}  # (rail, address, class)
        self._delivered_at = 0.0
        # Each rail's peers (static, then discovered), set by the service; None until
        # discovery has run once (static peers alone: from the start).
        self.listing: Listing | None = None
        self.short: dict[str, str] = {}  # rail -> why discovery found fewer than asked
        # What the last hand-over said besides the probes (skipped rails, the listing, the
        # rails discovery found short, the responder's): a change of any is news.
        self._handed: tuple[Mapping[str, str], Listing, Mapping[str, str],
                            Mapping[str, str]] = ({}, {}, {}, {})

    def turn(self) -> float:
        peers, targets, listing = self.cfg.peers, self.targets, self.listing
        if peers is None or targets is None or listing is None:
            return 0.5
        self._close_ends(keep={r: t for r, t in targets.ready.items() if listing.get(r)})
        listed = {(rail, p.address, tc) for rail, refs in listing.items() for p in refs
                  for tc in peers.probed_classes}
        self._tracks = {k: t for k, t in self._tracks.items() if k in listed}
        probes: dict[str, tuple[PeerProbe, ...]] = {}
        for rail, target in targets.ready.items():
            if self.halted or not listing.get(rail):
                continue
            probes[rail] = tuple(self._probe_rail(rail, target, listing[rail], peers,
                                                  lambda: self.halted))
        if not self.halted:
            skipped = {r: why for r, why in targets.skipped.items() if listing.get(r)}
            self._hand_over(probes, skipped, peers.window, listing)
        return round_period(peers, listing)

    def _hand_over(self, probes: dict[str, tuple[PeerProbe, ...]], skipped: dict[str, str],
                   window: int, listing: Listing) -> None:
        """Deliver this round (with the quiet rounds before it) when an outcome changed or
        a failure counts towards a verdict (up to peers.failures in a row), else
        QUIET_DELIVERY after the last: a mesh that stays as it is costs the loop one pass
        every 10 s, not one a round, and a failure is still judged the round it happens."""
        for rail in [r for r in self._pending if r not in probes]:
            del self._pending[rail]  # skipped or gone: its batch with it
        unheard = self.not_listening()
        handed = (dict(skipped), dict(listing), dict(self.short), dict(unheard))
        news = handed != self._handed
        failures = self.cfg.peers.failures if self.cfg.peers is not None else 1
        for rail, got in probes.items():
            self._pending.setdefault(rail, []).extend(got)
            for p in got:
                track = self._tracks.setdefault((rail, p.address, p.traffic_class), _Track())
                run = track.failing + 1 if p.outcome != PeerOutcome.OK else 0
                # Each failure until the verdict counts; a verdict that stands is quiet.
                news |= p.outcome != track.last or 0 < run <= failures
                track.last, track.failing = p.outcome, run
        now = time.monotonic()
        if not news and now - self._delivered_at < QUIET_DELIVERY:
            return
        batch = {rail: tuple(got) for rail, got in self._pending.items()}
        self.deliver(PeersSeen(batch, handed[0], window, handed[1], handed[2], handed[3]))
        self._pending.clear()
        self._handed = handed
        self._delivered_at = now

    def _probe_rail(self, rail: str, target: RailEndpoint, listed: tuple[PeerRef, ...],
                    peers: Peers, halted: Callable[[], bool]) -> list[PeerProbe]:
        end = self._ends.get(rail)
        if end is None:
            end = RailEnd(target)
            try:
                end.open(remote_read=False)
            except Exception as exc:  # ProbeFailed names its step; pyverbs' errors do not
                why = f"this node's {exc}" if isinstance(exc, ProbeFailed) else \
                    f"this node's RDMA device: {exc}"
                now = time.monotonic()
                return [PeerProbe(rail, p.address, p.node, PeerOutcome.LOCAL, why, at=now)
                        for p in listed]
            self._ends[rail] = end
        out: list[PeerProbe] = []
        for p in listed:
            for tc in peers.probed_classes:
                if halted():
                    return out
                track = self._tracks.setdefault((rail, p.address, tc), _Track())
                track.probed += 1
                every = peers.bandwidth_every
                got = probe_peer(end, rail, p.address, p.node, peers.port, peers.reads,
                                 peers.timeout,
                                 bandwidth=bool(every) and track.probed % every == 0,
                                 klass=Class(tc, peers.service_level))
                self.own_rdma.charge(rail, got.moved)
                out.append(got)
        return out

    def _close_ends(self, keep: dict[str, RailEndpoint]) -> None:
        for rail in list(self._ends):
            end = self._ends[rail]
            t = keep.get(rail)
            if t is None or (t.device, t.port, t.gid_index, t.address) != (
                    end.at.device, end.at.port, end.at.gid_index, end.at.address):
                end.close()
                del self._ends[rail]

    def run(self) -> None:
        try:
            super().run()
        finally:
            self._close_ends(keep={})


def _hold(peers: Peers) -> float:
    return 2 * peers.timeout + 1.0  # a prober's whole probe, and then some


def _responder(peers: Peers, own_rdma: OwnRDMA) -> Responder:
    return Responder(peers.port, hold=_hold(peers), own_rdma=own_rdma,
                     plan=(peers.reads, peers.bandwidth_every))


def _discovers(cfg: Config) -> bool:
    return cfg.peers is not None and cfg.peers.discover and cfg.kubernetes is not None


class PeerService:
    """The source: a responder, a prober and (with `peers.discover`) the discovery thread,
    started and stopped together."""

    def __init__(self, cfg: Config, deliver: Deliver, own_rdma: OwnRDMA | None = None,
                 discovery: Callable[[Config, Callable[[Discovered], None]],
                                     PeerDiscovery] = PeerDiscovery) -> None:
        peers = cfg.peers
        assert peers is not None
        self.cfg = cfg
        self.own_rdma = own_rdma or OwnRDMA()
        self.responder = _responder(peers, self.own_rdma)
        self.prober = PeerProber(cfg, deliver, self.own_rdma,
                                 not_listening=lambda: self.responder.not_listening())
        self._new_discovery = discovery
        self.discovery: PeerDiscovery | None = None
        self.found: Discovered | None = None
        self._started = False
        self._relist()

    def retarget(self, targets: Targets) -> None:
        """The rails the loop found ready after a pass: probed, and served."""
        first = self.prober.targets is None
        self.prober.targets = targets
        self._serve()
        if first:
            self.prober.wake()
        if self.discovery is not None and self.discovery.switches != targets.switches:
            # A switch first heard (or moved): its share of same-switch peers, at once.
            self.discovery.switches = dict(targets.switches)
            self.discovery.wake()

    def _serve(self) -> None:
        targets, listing = self.prober.targets, self.prober.listing
        if targets is not None:
            self.responder.serve(served_rails(self.cfg, listing or {}, targets))

    def _relist(self) -> None:
        """The prober's peers: the static ones from the start, the discovered ones added
        once discovery has answered (an API that is down at start delays those, never the
        static peers)."""
        peers = self.cfg.peers
        if peers is None:
            return
        found = self.found if _discovers(self.cfg) else None
        self.prober.listing = merged_listing(peers, found)
        self.prober.short = dict(found.short) if found is not None else {}

    def _discovered(self, found: Discovered) -> None:
        """From the discovery thread: the new peers reach the prober and the responder."""
        first = self.found is None
        self.found = found
        self._relist()
        self._serve()
        if first:
            self.prober.wake()

    def reconfigure(self, cfg: Config) -> None:
        """A reload: the prober takes the new config at its next round; a new port or
        timeout gets a new responder (its listeners cannot move); discovery starts, stops
        or runs again at once with the new settings."""
        old = self.cfg
        self.cfg = cfg
        self.prober.cfg = cfg
        peers = cfg.peers
        if peers is not None and (peers.port, _hold(peers)) != (self.responder.port,
                                                                self.responder.hold):
            self.responder.stop()
            self.responder.join(timeout=5)
            self.responder = _responder(peers, self.own_rdma)
            self.responder.start()
        elif peers is not None:
            self.responder.plan = (peers.reads, peers.bandwidth_every)
        self._sync_discovery(old)
        self._relist()
        self._serve()

    def _sync_discovery(self, old: Config | None) -> None:
        want = _discovers(self.cfg)
        if want and self.discovery is None:
            self.discovery = self._new_discovery(self.cfg, self._discovered)
            if self._started:
                self.discovery.start()
        elif not want and self.discovery is not None:
            self.discovery.stop()
            self.discovery = None
            self.found = None
        elif self.discovery is not None:
            self.discovery.cfg = self.cfg
            if old is not None and (old.peers, old.rails) != (self.cfg.peers, self.cfg.rails):
                self.discovery.wake()

    def start(self) -> None:
        self._started = True
        self._sync_discovery(None)
        self.responder.start()
        self.prober.start()

    def stop(self) -> None:
        self.prober.stop()
        self.responder.stop()
        if self.discovery is not None:
            self.discovery.stop()
