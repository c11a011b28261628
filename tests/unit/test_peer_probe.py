"""The peer probe's pure parts: the handshake's wire format (and what garbage does to it),
the GID text pyverbs takes, the config section, each peer's history, and every reason of
RDMAPeersReachable. The probe itself, over soft-RoCE between two guests, is in the lab
(tests/lab/test_peers.py); the responder's defences are in tests/netns/test_responder.py."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyverbs.addr import GID

from nodeagent.checks.conditions import judge_all
from nodeagent.checks.facts import Facts, PeersSeen
from nodeagent.checks.peers import (
    PeerHistory,
    peer_stats,
    peers_finding,
    rail_peer_stats,
    static_peers,
)
from nodeagent.config import ConfigError, parse_config
from nodeagent.io.files import one_line
from nodeagent.model.conditions import FABRIC_READY, RDMA_PEERS_REACHABLE
from nodeagent.model.peers import PeerOutcome, PeerProbe, RailEndpoint, Targets
from nodeagent.model.rdma import RDMAVolume
from nodeagent.probes.peer import RailEnd, gid_raw, gid_text, ibv_mtu, mtu_bytes, probe_peer
from nodeagent.probes.peerwire import (
    HELLO_SIZE,
    REPLY_SIZE,
    Accept,
    Hello,
    Refusal,
    Refuse,
    WireError,
    ipv4_gid,
    pack_hello,
    pack_reply,
    parse_hello,
    parse_reply,
)
from nodeagent.run.peers import round_period, served_rails

RAILS = [{"name": "rail0", "interface": "r0", "address": "10.10.0.5/24"},
         {"name": "rail1", "interface": "r1", "address": "10.11.0.5/24"}]
PEERS = {"rail0": [{"address": "10.10.0.6", "node": "gpu-06"},
                   {"address": "10.10.0.7", "node": "gpu-07"}],
         "rail1": [{"address": "10.11.0.6", "node": "gpu-06"}]}
CFG = parse_config({"rails": RAILS, "peers": {"static": PEERS, "max_rtt": "2ms"}})
GATED = parse_config({"rails": RAILS, "peers": {"static": PEERS, "gate": True}})

qpn = st.integers(0, 0xFFFFFF)
gid = st.binary(min_size=16, max_size=16)
mtu = st.sampled_from([256, 512, 1024, 2048, 4096])


@given(qpn, qpn, gid, mtu)
def test_a_hello_survives_the_wire(q: int, psn: int, g: bytes, m: int) -> None:
    data = pack_hello(Hello(q, psn, g, m))
    assert len(data) == HELLO_SIZE
    assert parse_hello(data) == Hello(q, psn, g, m)


@given(qpn, qpn, gid, mtu, st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1),
       st.integers(0, 2**32 - 1))
def test_an_accept_survives_the_wire(q: int, psn: int, g: bytes, m: int, addr: int, rkey: int,
                                     length: int) -> None:
    reply = Accept(q, psn, g, m, addr, rkey, length)
    data = pack_reply(reply)
    assert len(data) == REPLY_SIZE
    assert parse_reply(data) == reply


@pytest.mark.parametrize("code", list(Refusal))
def test_every_refusal_survives_the_wire_with_its_words(code: Refusal) -> None:
    assert parse_reply(pack_reply(Refuse(code))) == Refuse(code)
    assert code.words


@given(st.binary(max_size=64))
def test_garbage_is_a_wire_error_never_anything_else(data: bytes) -> None:
    for parse in (parse_hello, parse_reply):
        with contextlib.suppress(WireError):
            parse(data)


def test_what_is_wrong_with_a_message_is_named() -> None:
    good = bytearray(pack_hello(Hello(1, 2, bytes(16), 1024)))
    cases = {
        b"x" * 31: "31 bytes, not 32",
        b"HTTP" + bytes(good[4:]): "bad magic",
        bytes(good[:4]) + b"\x09" + bytes(good[5:]): "version 9",
        bytes(good[:6]) + (1500).to_bytes(2, "big") + bytes(good[8:]): "1500 is not an IB MTU",
        bytes(good[:8]) + (1 << 24).to_bytes(4, "big") + bytes(good[12:]): "over 24 bits",
        pack_reply(Refuse(Refusal.BUSY))[:HELLO_SIZE]: "not a Hello",
    }
    for data, words in cases.items():
        with pytest.raises(WireError, match=words):
            parse_hello(bytes(data))
    with pytest.raises(WireError, match="not a reply"):
        parse_reply(pack_hello(Hello(1, 2, bytes(16), 1024)) + bytes(16))
    unknown = bytearray(pack_reply(Refuse(Refusal.BUSY)))
    unknown[6:8] = (99).to_bytes(2, "big")
    with pytest.raises(WireError, match="refusal code 99"):
        parse_reply(bytes(unknown))


def test_gids_go_to_and_from_the_text_pyverbs_takes() -> None:
    raw = ipv4_gid("10.10.0.5")
    assert gid_text(raw) == "0000:0000:0000:0000:0000:ffff:0a0a:0005"
    assert gid_raw(GID(gid_text(raw))) == raw  # a real pyverbs GID, parsed and printed
    assert [mtu_bytes(n) for n in range(1, 6)] == [256, 512, 1024, 2048, 4096]
    assert [ibv_mtu(mtu_bytes(n)) for n in range(1, 6)] == [1, 2, 3, 4, 5]


# ------------------------------------------------------------------ config


def test_the_peers_section_is_checked_against_the_rails() -> None:
    with pytest.raises(ConfigError) as got:
        parse_config({"rails": RAILS, "peers": {"static": {
            "rail9": [{"address": "10.10.0.6"}],
            "rail0": [{"address": "10.10.0.5"}]}}})
    assert got.value.problems == [
        "peers.static.rail9: no rail of that name (rails: rail0, rail1)",
        "peers.static.rail0[0].address: 10.10.0.5 is this node's own rail address"]


@pytest.mark.parametrize("peer,words", [
    ({"address": "10.10.0.300"}, "is not an IPv4 address"),
    ({"address": "127.0.0.1"}, "is not a host's address"),
    ({"address": "224.0.0.1"}, "is not a host's address"),
    ({"address": "10.10.0.6", "node": "GPU_06"}, "is not a Node name"),
    ({"address": "10.10.0.6", "extra": 1}, "unknown key"),
])
def test_a_bad_peer_is_one_line_naming_it(peer: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError) as got:
        parse_config({"rails": RAILS, "peers": {"static": {"rail0": [peer]}}})
    assert len(got.value.problems) == 1
    assert got.value.problems[0].startswith("peers.static.rail0.0.") or \
        got.value.problems[0].startswith("peers.static.rail0[0]")
    assert words in got.value.problems[0]


def test_a_peer_twice_or_too_many_peers_are_refused() -> None:
    for peers, words in (([{"address": "10.10.0.6"}] * 2, "10.10.0.6 listed twice"),
                         ([{"address": f"10.10.1.{i}"} for i in range(65)],
                          "65 peers, at most 64")):
        with pytest.raises(ConfigError) as got:
            parse_config({"rails": RAILS, "peers": {"static": {"rail0": peers}}})
        assert words in got.value.problems[0]


def test_a_rail_with_many_peers_stretches_its_round_to_ten_probes_a_second() -> None:
    assert round_period(CFG.peers, static_peers(CFG.peers)) == 1.0  # type: ignore[arg-type]
    many = parse_config({"rails": RAILS, "peers": {"static": {
        "rail0": [{"address": f"10.10.1.{i}"} for i in range(1, 41)]}}})
    assert round_period(many.peers, static_peers(many.peers)) == 4.0  # type: ignore[arg-type]


def test_the_responder_serves_ready_rails_with_peers_for_those_peers_only() -> None:
    t = RailEndpoint("rxe0", 1, 1, "10.10.0.5")
    got = served_rails(CFG, static_peers(CFG.peers), Targets(
        {"rail0": t}, {"rail1": "its GID is off its pinned index"}))
    assert got.keys() == {"rail0"}
    assert got["rail0"].peers == {"10.10.0.6", "10.10.0.7"}


# ------------------------------------------------------------------ history and verdicts


def probe(address: str, outcome: PeerOutcome, at: float = 100.0, rail: str = "rail0",
          error: str = "", rtt: tuple[float, ...] = (20.0, 22.0)) -> PeerProbe:
    node = {"10.10.0.6": "gpu-06", "10.10.0.7": "gpu-07", "10.11.0.6": "gpu-06"}.get(address)
    return PeerProbe(rail, address, node, outcome, error,
                     rtt if outcome == PeerOutcome.OK else (), 4096, at)


def history(*rounds: dict[str, PeerOutcome], errors: dict[str, str] | None = None,
            rtt: tuple[float, ...] = (20.0, 22.0)) -> PeerHistory:
    h = PeerHistory()
    for n, outcomes in enumerate(rounds):
        by_rail: dict[str, list[PeerProbe]] = {}
        for address, outcome in outcomes.items():
            rail = "rail1" if address.startswith("10.11.") else "rail0"
            by_rail.setdefault(rail, []).append(
                probe(address, outcome, at=100.0 + n, rail=rail,
                      error=(errors or {}).get(address, ""), rtt=rtt))
        h.observe_round(by_rail, (), window=60)
    return h


OK, ROCE, MTU, GONE = (PeerOutcome.OK, PeerOutcome.ROCE_FAILED, PeerOutcome.MTU_FAILED,
                       PeerOutcome.NO_RESPONDER)
HEALTHY = {"10.10.0.6": OK, "10.10.0.7": OK, "10.11.0.6": OK}


def judged(h: PeerHistory, now: float = 103.0, skipped: dict[str, str] | None = None,
           cfg=CFG):  # type: ignore[no-untyped-def]
    return peers_finding(cfg, rail_peer_stats(cfg.peers, static_peers(cfg.peers), h),
                         skipped or {}, now)


def test_every_peer_reached_is_true_with_the_rtt() -> None:
    f = judged(history(HEALTHY, HEALTHY))
    assert (f.status, f.reason) == ("True", "PeersReachable")
    assert "rail0: 2 of 2 peers reached over RoCE (RTT p99 up to 22 us)" in f.message


def test_a_peer_never_reached_yet_is_not_reached() -> None:
    f = judged(history({**HEALTHY, "10.10.0.7": GONE}))  # one probe, below peers.failures
    assert (f.status, f.reason) == ("Unknown", "PeersNotProbed")
    assert "rail0: not reached yet (gpu-07 10.10.0.7: " in f.message


def test_one_lost_probe_is_not_a_verdict_two_in_a_row_are() -> None:
    one = judged(history(HEALTHY, {**HEALTHY, "10.10.0.7": ROCE}))
    assert one.status == "True"
    two = judged(history(HEALTHY, {**HEALTHY, "10.10.0.7": ROCE}, {**HEALTHY, "10.10.0.7": ROCE},
                         errors={"10.10.0.7": "retry exceeded error"}))
    assert (two.status, two.reason) == ("False", "PeerUnreachable")
    assert two.message == ("rail0: 1 of 2 peers fail over RoCE (gpu-07 10.10.0.7: retry "
                           "exceeded error); TCP reaches them")


def test_every_peer_failing_over_roce_points_at_this_node() -> None:
    bad = {"10.10.0.6": ROCE, "10.10.0.7": ROCE, "10.11.0.6": OK}
    f = judged(history(bad, bad))
    assert (f.status, f.reason) == ("False", "AllPeersUnreachable")
    assert "rail0: all 2 peers fail over RoCE" in f.message
    assert "TCP reaches them: this node's link, switch port or VLAN" in f.message


def test_one_peer_failing_cannot_say_which_end_it_is() -> None:
    bad = {"10.10.0.6": OK, "10.10.0.7": OK, "10.11.0.6": ROCE}
    f = judged(history(bad, bad))
    assert (f.status, f.reason) == ("False", "PeerUnreachable")
    assert "rail1: 1 of 1 peers fail over RoCE" in f.message


def test_small_reads_passing_and_mtu_reads_failing_is_the_path_mtu() -> None:
    bad = {**HEALTHY, "10.10.0.6": MTU}
    f = judged(history(bad, bad, errors={"10.10.0.6": "reads of 64 bytes pass, a read of 4096 "
                                         "bytes (the path MTU) fails: retry exceeded error"}))
    assert (f.status, f.reason) == ("False", "PathMTUTooSmall")
    assert "fail at the path MTU over RoCE" in f.message and "TCP reaches them" in f.message


def probed(cfg, h: PeerHistory) -> Facts:  # type: ignore[no-untyped-def]
    """A pass's facts after the prober's rounds of `h` over the config's peers."""
    return Facts(now=103.0, seen={PeersSeen: PeersSeen({}, {}, listed=static_peers(cfg.peers),
                                                       history=h)})


def test_a_peer_that_tcp_does_not_reach_is_unknown_and_never_taints() -> None:
    bad = {**HEALTHY, "10.10.0.7": GONE}
    h = history(bad, bad, errors={"10.10.0.7": "TCP to 10.10.0.7:18600: connection refused"})
    f = judged(h)
    assert (f.status, f.reason) == ("Unknown", "PeerNotResponding")
    assert "do not answer on TCP either" in f.message
    out = {x.type: x for x in judge_all(GATED, probed(GATED, h))}
    assert out[RDMA_PEERS_REACHABLE].reason == "PeerNotResponding"
    assert "RDMAPeersReachable" not in out[FABRIC_READY].message  # gated, yet no taint


def test_a_roce_failure_gated_holds_fabric_ready() -> None:
    bad = {**HEALTHY, "10.10.0.7": ROCE}
    h = history(bad, bad)
    out = {x.type: x for x in judge_all(GATED, probed(GATED, h))}
    assert "RDMAPeersReachable=False (PeerUnreachable)" in out[FABRIC_READY].message


def test_high_rtt_is_peer_latency_high() -> None:
    f = judged(history(HEALTHY, HEALTHY, rtt=(2500.0, 3000.0)))
    assert (f.status, f.reason) == ("False", "PeerLatencyHigh")
    assert "RTT p99 over 2 ms to gpu-06 10.10.0.6 (3000 us)" in f.message


def test_not_probed_skipped_or_stale_rails_are_unknown() -> None:
    assert judged(PeerHistory()).reason == "PeersNotProbed"
    skipped = judged(history(HEALTHY), skipped={"rail1": "its GID is off its pinned index"})
    assert (skipped.status, skipped.reason) == ("Unknown", "PeersNotProbed")
    assert "rail1: not probed: its GID is off its pinned index" in skipped.message
    stale = judged(history(HEALTHY), now=1000.0)
    assert "last probe" in stale.message and "stuck?" in stale.message


def test_a_round_forgets_peers_no_longer_probed_and_skipped_rails() -> None:
    h = history(HEALTHY)
    h.observe_round({"rail0": [probe("10.10.0.6", OK)]}, ["rail1"], window=60)
    assert set(h.probes) == {("rail0", "10.10.0.6", 0)}


def test_the_window_keeps_the_latest_probes_and_counts_loss() -> None:
    h = PeerHistory()
    for n in range(10):
        h.observe_round({"rail0": [probe("10.10.0.6", ROCE if n % 2 else OK, at=n)]}, (),
                        window=4)
    s = h.stats("rail0", "10.10.0.6")
    assert s is not None and (s.probes, s.failed, s.failing_for) == (4, 2, 1)
    assert s.loss == 0.5
    assert peer_stats([probe("10.10.0.6", OK, rtt=tuple(float(i) for i in range(100)))]) \
        .rtt_p99_us == 99.0


def test_each_peer_is_in_the_status_and_the_metrics() -> None:
    from prometheus_client import generate_latest

    from nodeagent.model.status import RailStatus, Report, Status
    from nodeagent.publish.metrics import AgentMetrics

    h = history(HEALTHY, {**HEALTHY, "10.10.0.7": ROCE}, {**HEALTHY, "10.10.0.7": ROCE},
                errors={"10.10.0.7": "retry exceeded error"})
    stats = rail_peer_stats(CFG.peers, static_peers(CFG.peers), h)  # type: ignore[arg-type]
    report = Report(node="n", findings=[], rails=[
        RailStatus("rail0", "r0", peers=stats["rail0"]),
        RailStatus("rail1", "r1", peers=stats["rail1"])])
    metrics = AgentMetrics()
    metrics.update(Status(report=report))
    text = generate_latest(metrics.registry).decode()
    who = 'node="gpu-07",peer="10.10.0.7",rail="rail0"'
    tc = 'traffic_class="0"'
    assert f"nodeagent_rdma_peer_reachable{{{who},{tc}}} 0.0" in text
    assert f'nodeagent_rdma_peer_probes_total{{{who},result="RoCE failed",{tc}}} 2.0' in text
    assert f'nodeagent_rdma_peer_probes_total{{{who},result="ok",{tc}}} 1.0' in text
    assert f"nodeagent_rdma_peer_loss_ratio{{{who},{tc}}} 0.6666666666666666" in text
    assert ('nodeagent_rdma_peer_rtt_seconds{node="gpu-06",peer="10.10.0.6",quantile="0.5",'
            'rail="rail0",traffic_class="0"} 2.1e-05') in text
    peers = report.as_dict()["rails"][0]["peers"]
    assert peers[1] | {"loss": 0} == {
        "address": "10.10.0.7", "node": "gpu-07", "outcome": "RoCE failed",
        "error": "retry exceeded error", "failing_for": 2, "failing": True, "probes": 3,
        "loss": 0, "mtu": 4096, "rtt_p50_us": 21.0, "rtt_p99_us": 22.0,
        "bandwidth_gbps": None, "traffic_class": 0}


def test_the_latest_bandwidth_sample_in_the_window_is_reported() -> None:

    from prometheus_client import generate_latest

    from nodeagent.model.status import RailStatus, Report, Status
    from nodeagent.publish.metrics import AgentMetrics

    sampled = [replace(probe("10.10.0.6", OK, at=1), bandwidth_gbps=3.5),
               probe("10.10.0.6", OK, at=2),
               replace(probe("10.10.0.6", OK, at=3), bandwidth_gbps=2.0),
               probe("10.10.0.6", ROCE, at=4)]
    stats = peer_stats(sampled)
    assert stats.bandwidth_gbps == 2.0 and stats.as_dict()["bandwidth_gbps"] == 2.0
    assert peer_stats(sampled[1:2]).bandwidth_gbps is None
    metrics = AgentMetrics()
    metrics.update(Status(report=Report(node="n", findings=[], rails=[
        RailStatus("rail0", "r0", peers=(stats,))])))
    assert ('nodeagent_rdma_peer_bandwidth_bits_per_second{node="gpu-06",peer="10.10.0.6",'
            'rail="rail0",traffic_class="0"} 2e+09') in generate_latest(metrics.registry).decode()


def test_quiet_rounds_are_batched_and_any_failure_or_change_goes_at_once() -> None:
    from nodeagent.run.peers import PeerProber

    got: list[PeersSeen] = []
    prober = PeerProber(CFG, got.append)  # type: ignore[arg-type]
    listing = static_peers(CFG.peers)

    def round_of(outcome: PeerOutcome, n: float) -> None:
        prober._hand_over({"rail0": (probe("10.10.0.6", outcome, at=n),)}, {}, 60, listing)

    round_of(OK, 0)  # the first round: news
    round_of(OK, 1)  # quiet: kept
    round_of(OK, 2)
    assert len(got) == 1
    round_of(ROCE, 3)  # a failure goes at once, with the quiet rounds before it
    assert [p.at for p in got[-1].probes["rail0"]] == [1.0, 2.0, 3.0]
    round_of(ROCE, 4)  # still failing: at once (the second failure makes the verdict)
    assert len(got) == 3
    round_of(ROCE, 4.5)  # the verdict stands: quiet again
    assert len(got) == 3
    round_of(OK, 5)  # recovered: a change
    round_of(OK, 6)
    assert len(got) == 4
    prober._delivered_at -= 11  # QUIET_DELIVERY has passed since the last hand-over
    round_of(OK, 7)
    assert len(got) == 5 and [p.at for p in got[-1].probes["rail0"]] == [6.0, 7.0]
    prober._hand_over({}, {"rail0": "its GID is off its pinned index"}, 60,
                      listing)  # skipped: news
    assert got[-1].skipped == {"rail0": "its GID is off its pinned index"}


def test_the_responders_rails_it_cannot_listen_on_go_with_the_round() -> None:
    """The responder's bind failure was only logged: now each round carries it (news when
    it changes), and the pass puts it in the status file's errors (run/evaluate.py)."""
    from nodeagent.run.peers import PeerProber

    got: list[PeersSeen] = []
    unheard: dict[str, str] = {}
    prober = PeerProber(CFG, got.append,  # type: ignore[arg-type]
                        not_listening=lambda: dict(unheard))
    listing = static_peers(CFG.peers)
    prober._hand_over({"rail0": (probe("10.10.0.6", OK, at=0),)}, {}, 60, listing)
    prober._hand_over({"rail0": (probe("10.10.0.6", OK, at=1),)}, {}, 60, listing)
    assert len(got) == 1 and got[-1].not_listening == {}  # quiet: batched
    unheard["rail0"] = "cannot listen on 10.10.0.5:18600: Address already in use"
    prober._hand_over({"rail0": (probe("10.10.0.6", OK, at=2),)}, {}, 60, listing)
    assert len(got) == 2 and got[-1].not_listening == unheard


@pytest.mark.parametrize("reply,words", [
    (Accept(7, 1, ipv4_gid("10.99.0.1"), 1024, 0, 0, 4096), "not the peer's ::ffff:127.0.0.1"),
    (Accept(7, 1, ipv4_gid("127.0.0.1"), 4096, 0, 0, 4096), "at most 1024"),
    (Refuse(Refusal.UNKNOWN_PEER), "refused: this node is not one of its peers"),
])
def test_a_hostile_reply_never_sets_the_qp_up(reply: Accept | Refuse, words: str) -> None:
    """A real TCP responder on loopback that answers a Hello with a reply pointing the QP
    at another host, asking for a larger MTU than the rail's, or refusing: the handshake
    ends there (no QP is moved), with the reason."""
    import socket
    import threading
    import time
    from types import SimpleNamespace

    from nodeagent.probes.peer import CLASS_0, RailEnd, _Failed, _handshake

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        conn.recv(HELLO_SIZE)
        conn.sendall(pack_reply(reply))
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    end = RailEnd(RailEndpoint("rxe0", 1, 1, "127.0.0.1"),  # mtu: the port's, IBV_MTU_1024
                  gid="0000:0000:0000:0000:0000:ffff:7f00:0001", mtu=3)
    with pytest.raises(_Failed) as got:
        # Only the QP's number goes into the Hello: a namespace stands in for pyverbs' QP.
        _handshake(end, SimpleNamespace(qp_num=5), "127.0.0.1", server.getsockname()[1],
                   time.monotonic() + 5, 1, CLASS_0)
    server.close()
    assert got.value.outcome == PeerOutcome.REFUSED and words in got.value.error


def test_a_peers_first_probe_and_every_nth_after_take_the_bandwidth_sample(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import nodeagent.run.peers as run_peers
    from nodeagent.model.peers import PeerRef

    asked: list[bool] = []

    classes: list[int] = []

    def fake_probe(end, rail, address, node, port, reads, timeout,  # type: ignore[no-untyped-def]
                   bandwidth=False, klass=None):
        asked.append(bandwidth)
        classes.append(klass.traffic_class)
        return replace(probe(address, OK), moved=RDMAVolume(40, 4000) if bandwidth
                       else RDMAVolume(4, 400))

    monkeypatch.setattr(run_peers, "probe_peer", fake_probe)
    cfg = parse_config({"rails": RAILS, "peers": {"static": PEERS, "bandwidth_every": 3}})
    prober = run_peers.PeerProber(cfg, lambda item: None)
    prober._ends["rail0"] = object()  # type: ignore[assignment]  # an opened end
    target = RailEndpoint("rxe0", 1, 1, "10.10.0.5")
    for _ in range(7):
        prober._probe_rail("rail0", target, (PeerRef("10.10.0.6"),), cfg.peers,
                           lambda: False)
    assert asked == [True, False, False, True, False, False, True]
    # Each probe's RDMA charged to its rail, for FabricTrafficOnRDMA to count out.
    assert prober.own_rdma.so_far("rail0") == (RDMAVolume(3 * 40 + 4 * 4, 3 * 4000 + 4 * 400),
                                               RDMAVolume(40, 4000))
    never = parse_config({"rails": RAILS, "peers": {"static": PEERS, "bandwidth_every": 0}})
    asked.clear()
    prober._probe_rail("rail0", target, (PeerRef("10.10.0.7"),), never.peers, lambda: False)
    assert asked == [False]
    # In two classes: each peer probed in each, its samples counted per class.
    two = parse_config({"rails": RAILS, "peers": {"static": PEERS, "bandwidth_every": 2,
                                                  "classes": [0, 104]}})
    asked.clear()
    classes.clear()
    for _ in range(2):
        prober._probe_rail("rail0", target, (PeerRef("10.10.0.8"), PeerRef("10.10.0.9")),
                           two.peers, lambda: False)
    assert classes == [0, 104, 0, 104] * 2
    assert asked == [True] * 4 + [False] * 4


@pytest.mark.parametrize(("late", "outcome"), [(True, PeerOutcome.ROCE_FAILED),
                                                (False, PeerOutcome.MTU_FAILED)])
def test_a_path_mtu_read_that_runs_out_of_time_is_not_the_path_mtu(
        monkeypatch: pytest.MonkeyPatch, late: bool, outcome: PeerOutcome) -> None:
    """The small reads pass and the path-MTU read does not complete: when the probe's
    deadline ran out first (a slow path: the lab's peer with its frames 100 ms late), that
    is no verdict on the MTU; when the read completed in error, it is. The QP and the wire
    are stood in for (no RDMA device here); the reads' results are what _read gives."""
    from nodeagent.probes import peer as probe

    class End:
        at = RailEndpoint("rxe0", 1, 3, "10.20.0.1")

        def new_qp(self) -> object:
            return object()

        def drop_qp(self, qp: object) -> None:
            pass

    accept = Accept(qpn=7, psn=1, gid=bytes(10) + b"\xff\xff" + bytes([10, 20, 0, 2]),
                    mtu=4096, addr=0, rkey=1, length=4096)

    def read(end: object, qp: object, got: Accept, size: int, wr_id: int,
             deadline: float) -> float:
        if size <= probe.SMALL:
            return 120.0
        raise probe._Failed(PeerOutcome.ROCE_FAILED, "no completion by the deadline"
                            if late else "retry exceeded error", late=late)
    monkeypatch.setattr(probe, "_handshake", lambda *a: (None, accept))
    monkeypatch.setattr(probe, "connect_rc", lambda *a, **k: None)
    monkeypatch.setattr(probe, "_read", read)
    got = probe.probe_peer(End(), "fab0", "10.20.0.2", "lab-b", 18602, 5, 1.0)  # type: ignore[arg-type]
    assert got.outcome == outcome, got
    assert got.rtt_us == (120.0,) * 5


class _BareFailure(RailEnd):
    """A rail end whose QP cannot be made, failing as an allocation does: an exception
    with no message at all (MemoryError() carries none)."""

    def new_qp(self) -> Any:
        raise MemoryError()


def test_a_probe_that_fails_with_no_message_still_returns_a_verdict() -> None:
    """probe_peer takes the first line of an error's text: for an exception without text
    that was an IndexError, reported here as 'list index out of range' (and raised out of
    probe_peer, which promises never to raise, from any later step)."""
    end = _BareFailure(RailEndpoint("rxe0", 1, 3, "10.10.0.5"))
    got = probe_peer(end, "rail0", "10.10.0.7", "gpu-07", port=1, reads=1, timeout=1.0)
    assert (got.outcome, got.error) == (PeerOutcome.LOCAL, "QP: MemoryError")


@pytest.mark.parametrize(("exc", "line"), [
    (RuntimeError(), "RuntimeError"),
    (RuntimeError("\n\n  \n"), "RuntimeError"),
    (OSError("first\nsecond"), "first"),
    (ValueError("\n  indented first\nsecond"), "indented first"),
    (ValueError("x" * 500), "x" * 200),
])
def test_an_exception_in_one_line_is_never_empty_and_never_raises(exc: BaseException,
                                                                  line: str) -> None:
    assert one_line(exc) == line


def test_an_exception_whose_text_cannot_be_made_is_named_by_its_type() -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise TypeError("no text")

    assert one_line(Broken()) == "Broken"
