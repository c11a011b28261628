"""Probes in NCCL's traffic class: the config keys, the classed Hello on the wire, the
round's budget, the verdict that names a class the path drops, and the mesh's one word a
peer. The probe itself in two classes, with DSCP 26 dropped between two soft-RoCE guests,
is tests/lab/test_peers.py test_4j."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.checks.nccl import NcclEnv
from nodeagent.checks.peers import PeerHistory, peers_finding, rail_peer_stats, static_peers
from nodeagent.config import Config, ConfigError, parse_config
from nodeagent.kube.peercard import mesh_annotation
from nodeagent.model.conditions import Finding
from nodeagent.model.peers import Class, PeerOutcome, PeerProbe
from nodeagent.model.status import RailStatus
from nodeagent.probes.peerwire import (
    HELLO_SIZE,
    MAX_HELLO_SIZE,
    Hello,
    WireError,
    hello_size,
    pack_hello,
    parse_hello,
)
from nodeagent.run.peers import round_period

RAILS = [{"name": "rail0", "interface": "r0", "address": "10.10.0.5/24"}]
PEERS = {"rail0": [{"address": "10.10.0.6", "node": "gpu-06"},
                   {"address": "10.10.0.7", "node": "gpu-07"}]}
OK, ROCE, GONE = PeerOutcome.OK, PeerOutcome.ROCE_FAILED, PeerOutcome.NO_RESPONDER


def config(**peers: object) -> Config:
    return parse_config({"rails": RAILS, "peers": {"static": PEERS, **peers}})


TWO = config(traffic_class=104, classes=[0, 104])

# ------------------------------------------------------------------ config


def test_the_jobs_class_is_nccls_default_and_the_one_probed_unless_told() -> None:
    plain = config()
    assert (plain.peers.traffic_class, plain.peers.service_level) == (0, 0)  # type: ignore
    assert plain.peers.probed_classes == (0,)  # type: ignore[union-attr]
    assert config(traffic_class=104).peers.probed_classes == (104,)  # type: ignore
    assert TWO.peers.probed_classes == (0, 104)  # type: ignore[union-attr]


@pytest.mark.parametrize("peers,words", [
    ({"traffic_class": 256}, "peers.traffic_class: Input should be less than or equal to 255"),
    ({"service_level": 16}, "peers.service_level: Input should be less than or equal to 15"),
    ({"classes": [0, 104, 0]}, "class 0 listed twice"),
    ({"classes": []}, "0 classes; 1 to 4"),
    ({"classes": [0, 8, 16, 24, 32]}, "5 classes; 1 to 4"),
    ({"classes": [0, 300]},
     "peers.classes[1]: Input should be less than or equal to 255 (got 300)"),
])
def test_a_bad_class_is_one_line_naming_it(peers: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError) as got:
        config(**peers)
    assert len(got.value.problems) == 1, got.value.problems
    assert words in got.value.problems[0], got.value.problems


def test_each_class_is_another_probe_of_every_peer_within_the_rate() -> None:
    many = {"rail0": [{"address": f"10.10.1.{i}"} for i in range(1, 41)]}
    one = parse_config({"rails": RAILS, "peers": {"static": many}}).peers
    two = parse_config({"rails": RAILS, "peers": {"static": many, "classes": [0, 104]}}).peers
    assert round_period(one, static_peers(one)) == 4.0  # type: ignore[arg-type]
    assert round_period(two, static_peers(two)) == 8.0  # type: ignore[arg-type]


# ------------------------------------------------------------------ the wire


@given(st.integers(0, 0xFFFFFF), st.integers(0, 0xFFFFFF), st.binary(min_size=16, max_size=16),
       st.sampled_from([256, 1024, 4096]), st.integers(0, 255), st.integers(0, 15))
def test_a_classed_hello_survives_the_wire(q: int, psn: int, g: bytes, m: int, tc: int,
                                           sl: int) -> None:
    hello = Hello(q, psn, g, m, tc, sl)
    data = pack_hello(hello)
    # Class 0 stays version 1, the Hello an agent before classes answers.
    assert len(data) == (HELLO_SIZE if tc == sl == 0 else MAX_HELLO_SIZE)
    assert hello_size(data) == len(data)
    assert parse_hello(data) == hello


def test_a_classed_hello_is_read_whole_and_its_faults_named() -> None:
    data = pack_hello(Hello(1, 2, bytes(16), 1024, 104, 3))
    assert hello_size(data[:4]) == HELLO_SIZE  # too short to say: a version 1 length
    assert hello_size(data[:5]) == MAX_HELLO_SIZE
    with pytest.raises(WireError, match="32 bytes, not 36"):
        parse_hello(data[:HELLO_SIZE])
    with pytest.raises(WireError, match="service level 16 over 15"):
        parse_hello(data[:33] + b"\x10" + data[34:])
    with pytest.raises(WireError, match="reserved bytes set"):
        parse_hello(data[:34] + b"\x00\x01")


# ------------------------------------------------------------------ the verdict


def rounds(*outcomes: dict[tuple[str, int], PeerOutcome]) -> PeerHistory:
    """Each round's outcome per (peer address, class)."""
    h = PeerHistory()
    for n, got in enumerate(outcomes):
        probes = [PeerProbe("rail0", address, {"10.10.0.6": "gpu-06"}.get(address, "gpu-07"),
                            outcome, "" if outcome == OK else "retry exceeded error",
                            (20.0,) if outcome == OK else (), 4096, 100.0 + n,
                            traffic_class=tc)
                  for (address, tc), outcome in got.items()]
        h.observe_round({"rail0": probes}, (), window=60)
    return h


def judged(cfg: Config, h: PeerHistory) -> Finding:
    assert cfg.peers is not None
    return peers_finding(cfg, rail_peer_stats(cfg.peers, static_peers(cfg.peers), h), {},
                         103.0)


HEALTHY = {("10.10.0.6", 0): OK, ("10.10.0.7", 0): OK,
           ("10.10.0.6", 104): OK, ("10.10.0.7", 104): OK}


def test_a_class_dropped_while_class_0_passes_is_named_with_its_dscp() -> None:
    dropped = {**HEALTHY, ("10.10.0.6", 104): ROCE, ("10.10.0.7", 104): ROCE}
    f = judged(TWO, rounds(HEALTHY, dropped, dropped))
    assert (f.status, f.reason) == ("False", "TrafficClassDropped")
    assert f.message.startswith(
        "rail0: class 104 (DSCP 26) (the jobs' class, NCCL_IB_TC) fails to 2 of 2 peers over "
        "RoCE while class 0 passes (gpu-06 10.10.0.6: retry exceeded error; gpu-07 "
        "10.10.0.7: retry exceeded error): the path drops this class"), f.message
    # Not this node's link: every peer failing in one class is not AllPeersUnreachable.
    assert "AllPeersUnreachable" not in f.reason


def test_the_same_drop_probed_in_class_0_alone_passes_the_gap_side_by_side() -> None:
    only_0 = config()
    dropped = {("10.10.0.6", 0): OK, ("10.10.0.7", 0): OK}  # what class 0 alone sees
    assert judged(only_0, rounds(dropped, dropped)).reason == "PeersReachable"


def test_both_classes_failing_is_the_path_each_class_named() -> None:
    dead = {k: ROCE for k in HEALTHY}
    f = judged(TWO, rounds(HEALTHY, dead, dead))
    assert (f.status, f.reason) == ("False", "AllPeersUnreachable")
    assert "rail0 class 0: all 2 peers fail over RoCE" in f.message
    assert "rail0 class 104: all 2 peers fail over RoCE" in f.message
    assert "TrafficClassDropped" not in f.message


def test_every_class_passing_is_true_class_by_class() -> None:
    f = judged(TWO, rounds(HEALTHY, HEALTHY))
    assert (f.status, f.reason) == ("True", "PeersReachable")
    assert "rail0 class 0: 2 of 2 peers reached" in f.message
    assert "rail0 class 104: 2 of 2 peers reached" in f.message


def test_a_class_not_probed_yet_is_not_judged() -> None:
    f = judged(TWO, rounds({("10.10.0.6", 0): OK, ("10.10.0.7", 0): OK}))
    assert (f.status, f.reason) == ("Unknown", "PeersNotProbed")
    assert "rail0: 2 of 4 peers and classes not probed yet" in f.message


def test_a_peer_silent_in_one_class_is_no_class_verdict() -> None:
    # TCP did not reach it for the class-104 probe: its agent, not the class.
    gone = {**HEALTHY, ("10.10.0.7", 104): GONE}
    f = judged(TWO, rounds(gone, gone))
    assert f.reason == "PeerNotResponding", f


def test_the_mesh_shows_a_peer_by_its_worst_class() -> None:
    h = rounds(HEALTHY, {**HEALTHY, ("10.10.0.7", 104): ROCE},
               {**HEALTHY, ("10.10.0.7", 104): ROCE})
    assert TWO.peers is not None
    stats = rail_peer_stats(TWO.peers, static_peers(TWO.peers), h)["rail0"]
    assert [(s.address, s.traffic_class) for s in stats] == [
        ("10.10.0.6", 0), ("10.10.0.6", 104), ("10.10.0.7", 0), ("10.10.0.7", 104)]
    assert stats[3].as_dict()["traffic_class"] == 104
    annotation = mesh_annotation([RailStatus("rail0", "r0", peers=stats)])
    assert annotation == '{"rail0":{"10.10.0.6":"ok","10.10.0.7":"roce"}}'


def test_a_class_says_its_dscp() -> None:
    assert Class(104).words == "class 104 (DSCP 26)"
    assert Class(0).words == "class 0 (DSCP 0)"


@pytest.mark.parametrize("env,want", [
    ({}, Class(0, 0)),  # NCCL's -1: 0 unless a plugin sets a class
    ({"NCCL_IB_TC": "104", "NCCL_IB_SL": "3"}, Class(104, 3)),
    ({"NCCL_IB_TC": "0x68"}, Class(104, 0)),  # strtoll base 0
    ({"NCCL_IB_TC": "360"}, Class(104, 0)),  # meta.tc is a uint8_t: 360 mod 256
])
def test_a_gangs_ring_is_probed_in_the_class_the_jobs_nccl_sets(env: dict[str, str],
                                                                 want: Class) -> None:
    assert NcclEnv.read(env).traffic == want
