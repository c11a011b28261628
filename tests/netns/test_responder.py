"""The peer responder is a network-facing service on every GPU node: here it runs for real
in a namespace of its own (rail r0, 10.10.0.5/24), and the peers are sockets in a second
namespace across a veth pair. What it must refuse, and what a hostile peer may cost it:
strangers get a refusal and no QP, garbage and oversized handshakes are closed, a trickle
is cut at the handshake deadline, a connect flood is bounded per peer while another peer
is still answered, and taking a rail away (or stopping) closes every socket.

No RDMA device exists in these namespaces, so a valid Hello gets the refusal "its RDMA
device failed": the fault path of a responder whose device is gone. The QP set-up itself
is proven between two guests on soft-RoCE (tests/lab/test_peers.py)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from nodeagent.model.peers import RailEndpoint
from nodeagent.model.rdma import RDMAVolume
from nodeagent.probes.peerwire import (
    HELLO_SIZE,
    Hello,
    Refusal,
    Refuse,
    ipv4_gid,
    pack_hello,
    pack_reply,
    parse_reply,
)
from nodeagent.run.responder import HANDSHAKE, MAX_PER_PEER, Responder, Served
from tests.kit.helpers import Netns, entered, new_netns

PORT = 18600
RAIL = "10.10.0.5"
KNOWN, OTHER, STRANGER = "10.10.0.6", "10.10.0.7", "10.10.0.8"
SERVED = {"rail0": Served(RailEndpoint("rxe-none", 1, 1, RAIL), frozenset({KNOWN, OTHER}))}


@pytest.fixture
def wire() -> Iterator[tuple[Netns, Netns]]:
    """(the node's namespace, the peers' namespace), one veth between them."""
    node, peers = new_netns(), new_netns()
    try:
        node.veth("r0", "p0", up_peer=False)
        node.ip("link", "set", "p0", "netns", peers.name)
        node.ip("addr", "add", f"{RAIL}/24", "dev", "r0")
        node.ip("link", "set", "r0", "up")
        for a in (KNOWN, OTHER, STRANGER):
            peers.ip("addr", "add", f"{a}/24", "dev", "p0")
        peers.ip("link", "set", "p0", "up")
        yield node, peers
    finally:
        peers.delete()
        node.delete()


@pytest.fixture
def responder(wire: tuple[Netns, Netns]) -> Iterator[Responder]:
    node, _ = wire
    with entered(node):  # its thread is born in the node's namespace
        r = Responder(PORT, hold=3.0)
        r.start()
    r.serve(SERVED)
    _until(lambda: "rail0" in r.listening, "the responder listens")
    try:
        yield r
    finally:
        r.stop()
        r.join(timeout=5)


def _until(ok, what: str, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def connect(peers: Netns, source: str, timeout: float = 5.0) -> socket.socket:
    with entered(peers):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    s.settimeout(timeout)
    s.connect((RAIL, PORT))
    return s


def read_all(s: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = s.recv(4096)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def hello_from(address: str) -> bytes:
    return pack_hello(Hello(0x1234, 0x42, ipv4_gid(address), 4096))


def test_it_listens_on_the_rail_address_only(wire: tuple[Netns, Netns],
                                             responder: Responder) -> None:
    node, _ = wire
    listening = node.exec("ss", "-Hltn").stdout
    assert f"{RAIL}:{PORT}" in listening
    assert f"0.0.0.0:{PORT}" not in listening and f"*:{PORT}" not in listening


def test_a_stranger_is_refused_at_once_and_gets_no_qp(wire: tuple[Netns, Netns],
                                                       responder: Responder) -> None:
    s = connect(wire[1], STRANGER)
    s.sendall(hello_from(STRANGER))
    got = read_all(s)
    s.close()
    assert parse_reply(got) == Refuse(Refusal.UNKNOWN_PEER)
    assert responder.counts.refused["UNKNOWN_PEER"] == 1 and responder.counts.accepted == 0


def test_a_hello_for_another_address_is_refused(wire: tuple[Netns, Netns],
                                                responder: Responder) -> None:
    s = connect(wire[1], KNOWN)
    s.sendall(hello_from(OTHER))  # a GID that is not the connection's source
    assert parse_reply(read_all(s)) == Refuse(Refusal.BAD_HELLO)
    s.close()


def test_a_valid_hello_without_a_device_is_told_so(wire: tuple[Netns, Netns],
                                                   responder: Responder) -> None:
    s = connect(wire[1], KNOWN)
    s.sendall(hello_from(KNOWN))
    reply = parse_reply(read_all(s))
    s.close()
    assert reply == Refuse(Refusal.DEVICE)
    assert reply.code.words == "its RDMA device failed"
    # No QP, no reads: nothing charged to the rail's own RDMA (FabricTrafficOnRDMA).
    assert responder.own_rdma.so_far("rail0") == (RDMAVolume(), RDMAVolume())


def test_a_classed_hello_is_read_whole_in_pieces_and_answered(wire: tuple[Netns, Netns],
                                                               responder: Responder) -> None:
    # Version 2 (a traffic class): 36 bytes, sent as its first 32 (a version 1 length)
    # and the rest; the responder waits for all of it, then answers as for any Hello.
    hello = pack_hello(Hello(0x1234, 0x42, ipv4_gid(KNOWN), 4096, 104, 3))
    s = connect(wire[1], KNOWN)
    s.sendall(hello[:HELLO_SIZE])
    time.sleep(0.2)
    s.sendall(hello[HELLO_SIZE:])
    assert parse_reply(read_all(s)) == Refuse(Refusal.DEVICE)
    s.close()
    assert not responder.counts.dropped


@pytest.mark.parametrize("payload,kind", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".ljust(HELLO_SIZE, b"\0"), "garbage"),
    (b"\0" * (HELLO_SIZE + 8), "oversized"),
    (pack_hello(Hello(1, 2, ipv4_gid(KNOWN), 4096, 104)) + b"\0", "oversized"),
])
def test_garbage_or_oversized_handshakes_are_closed_without_a_reply(
        wire: tuple[Netns, Netns], responder: Responder, payload: bytes, kind: str) -> None:
    s = connect(wire[1], KNOWN)
    s.sendall(payload)
    assert read_all(s) == b""
    s.close()
    _until(lambda: responder.counts.dropped[kind] == 1, f"counted as {kind}")
    assert responder.open_connections == 0


def test_a_trickle_is_cut_at_the_handshake_deadline(wire: tuple[Netns, Netns],
                                                    responder: Responder) -> None:
    s = connect(wire[1], KNOWN)
    hello = hello_from(KNOWN)
    started = time.monotonic()
    sent = 0
    try:
        for byte in hello[:-1]:  # one byte every 0.1 s: 3.1 s for a whole Hello
            s.send(bytes([byte]))
            sent += 1
            time.sleep(0.1)
    except (BrokenPipeError, ConnectionResetError):
        pass
    closed_after = time.monotonic() - started
    s.settimeout(5)
    assert read_all(s) == b""
    s.close()
    assert responder.counts.dropped["handshake-timeout"] == 1
    assert sent < HELLO_SIZE - 1 or closed_after < 3 * HANDSHAKE, \
        "the connection outlived its handshake deadline"
    assert responder.open_connections == 0


def test_hellos_that_cannot_be_answered_are_one_warning_not_one_each(
        wire: tuple[Netns, Netns], responder: Responder,
        caplog: pytest.LogCaptureFixture) -> None:
    """Before, each valid Hello the device could not answer was a warning line: 3,000
    lines in 0.9 s from one peer. Now one a minute per rail, with the count held back."""
    caplog.set_level(logging.WARNING, logger="nodeagent.run.responder")
    for _ in range(50):
        s = connect(wire[1], KNOWN)
        s.sendall(hello_from(KNOWN))
        assert parse_reply(read_all(s)) == Refuse(Refusal.DEVICE)
        s.close()
    said = [r.getMessage() for r in caplog.records if "cannot answer" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("peer responder, rail0: cannot answer "
                                                 f"{KNOWN}: "), said
    assert responder.counts.refused["DEVICE"] == 50


def test_a_connect_flood_costs_its_own_connections_only(wire: tuple[Netns, Netns],
                                                        responder: Responder) -> None:
    _, peers = wire
    before = fds()
    flood, most = [], 0
    for _ in range(200):
        flood.append(connect(peers, KNOWN))
        most = max(most, responder.open_connections)
    # Another peer in the middle of the flood is still answered.
    other = connect(peers, OTHER)
    other.sendall(hello_from(OTHER))
    assert parse_reply(read_all(other)) == Refuse(Refusal.DEVICE)
    other.close()
    busy = 0
    for s in flood:
        s.settimeout(HANDSHAKE + 2)
        busy += read_all(s) == pack_reply(Refuse(Refusal.BUSY))
        s.close()
    assert most <= MAX_PER_PEER
    counts = responder.counts
    _until(lambda: counts.refused["BUSY"] + counts.dropped["handshake-timeout"] == 200,
           "every flood connection refused as busy or cut at its handshake deadline")
    assert busy == counts.refused["BUSY"] >= 100
    _until(lambda: responder.open_connections == 0, "the held ones expired")
    _until(lambda: fds() <= before, "every descriptor of the flood closed")


def test_a_rail_taken_away_closes_its_listener_and_connections(
        wire: tuple[Netns, Netns], responder: Responder) -> None:
    before = fds()
    held = connect(wire[1], KNOWN)
    _until(lambda: responder.open_connections == 1, "the connection held")
    responder.serve({})
    _until(lambda: not responder.listening, "the listener closed")
    held.settimeout(5)
    assert read_all(held) == b""
    held.close()
    assert responder.open_connections == 0
    with pytest.raises(ConnectionRefusedError):
        connect(wire[1], KNOWN)
    _until(lambda: fds() <= before - 1, "the listener's descriptor closed")


def test_stopping_closes_every_socket(wire: tuple[Netns, Netns]) -> None:
    node, peers = wire
    before = fds()
    with entered(node):
        r = Responder(PORT, hold=3.0)
        r.start()
    r.serve(SERVED)
    _until(lambda: "rail0" in r.listening, "the responder listens")
    held = connect(peers, KNOWN)
    r.stop()
    r.join(timeout=5)
    assert not r.is_alive()
    held.settimeout(5)
    assert read_all(held) == b""
    held.close()
    assert fds() <= before


def test_a_reload_moves_the_responder_to_the_new_port_and_peers(
        wire: tuple[Netns, Netns]) -> None:
    """The source as the daemon runs it (responder and prober): a reload with another port
    listens there and not on the old one; new peers are answered at once. (The prober's
    rounds fail here at this node's device, delivered as such.)"""
    from nodeagent.checks.facts import PeersSeen
    from nodeagent.config import parse_config
    from nodeagent.model.peers import PeerOutcome, Targets
    from nodeagent.run.peers import PeerService

    node, peers = wire
    rails = [{"name": "rail0", "interface": "r0", "address": f"{RAIL}/24"}]

    def config(port: int, peer: str):  # type: ignore[no-untyped-def]
        return parse_config({"rails": rails, "peers": {"port": port, "static": {
            "rail0": [{"address": peer}]}}})

    seen: list[PeersSeen] = []
    with entered(node):
        service = PeerService(config(PORT, KNOWN), seen.append)  # type: ignore[arg-type]
        service.start()
    try:
        service.retarget(Targets({"rail0": SERVED["rail0"].target}))
        _until(lambda: service.responder.listening.get("rail0") == (RAIL, PORT), "listening")
        _until(lambda: bool(seen), "a round delivered")
        probe = seen[-1].probes["rail0"][0]
        assert probe.outcome == PeerOutcome.LOCAL and "this node's" in probe.error
        with entered(node):  # a new responder's thread is born where the old one was
            service.reconfigure(config(PORT + 1, OTHER))
        _until(lambda: service.responder.listening.get("rail0") == (RAIL, PORT + 1),
               "listening on the new port")
        with pytest.raises(ConnectionRefusedError):
            connect(peers, KNOWN)
        with entered(peers):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((OTHER, 0))
        s.settimeout(5)
        s.connect((RAIL, PORT + 1))
        s.sendall(hello_from(OTHER))
        assert parse_reply(read_all(s)) == Refuse(Refusal.DEVICE)  # answered: a known peer
        s.close()
    finally:
        service.stop()


def test_with_discovery_any_address_on_the_rails_network_is_answered_and_no_other(
        wire: tuple[Netns, Netns], responder: Responder) -> None:
    """peers.discover: who probes this node is each prober's choice, so the rail's own
    network is the allow-list. An address on it that no list names is answered (here the
    device refusal: past the allow-list); one off the network is a stranger."""
    from ipaddress import IPv4Network

    node, peers = wire
    peers.ip("addr", "add", "10.10.1.9/16", "dev", "p0")  # reaches 10.10.0.5, off its /24
    node.ip("route", "add", "10.10.1.0/24", "dev", "r0")
    responder.serve({"rail0": Served(SERVED["rail0"].target, frozenset(),
                                     frozenset({IPv4Network("10.10.0.0/24")}))})

    def reply_to(source: str, hello: bool = True) -> object:
        s = connect(peers, source)
        if hello:  # a stranger is refused at accept: nothing sent, no reset raced
            s.sendall(hello_from(source))
        try:
            return parse_reply(read_all(s))
        finally:
            s.close()

    # Answered, on the network (the allow-list is taken at the responder's next turn):
    _until(lambda: reply_to(STRANGER) == Refuse(Refusal.DEVICE), "the network answered")
    assert reply_to("10.10.1.9", hello=False) == Refuse(Refusal.UNKNOWN_PEER)


def test_with_discovery_unlisted_addresses_cannot_crowd_out_a_listed_peer(
        wire: tuple[Netns, Netns], responder: Responder) -> None:
    """peers.discover answers any address on the rail's network. Before, 40 such addresses
    (2 connections each, their handshakes held open) took all 64 slots and the peer this
    agent had listed was refused as busy 36 of 46 times; now those no list names share
    half the slots and the listed peer is answered."""
    from ipaddress import IPv4Network

    from nodeagent.run.responder import MAX_UNLISTED

    _, peers = wire
    crowd = [f"10.10.0.{100 + i}" for i in range(40)]
    for address in crowd:
        peers.ip("addr", "add", f"{address}/24", "dev", "p0")
    responder.serve({"rail0": Served(SERVED["rail0"].target, frozenset({KNOWN}),
                                     frozenset({IPv4Network("10.10.0.0/24")}))})

    def answered(source: str) -> bool:
        s = connect(peers, source)
        s.sendall(hello_from(source))
        try:
            return parse_reply(read_all(s)) == Refuse(Refusal.DEVICE)
        finally:
            s.close()

    _until(lambda: answered(crowd[0]), "the network answered (taken at the next turn)")
    _until(lambda: responder.open_connections == 0, "that one closed")
    # The crowd: 2 silent connections from each address, re-made as the responder cuts
    # them at their handshake deadline (1 s), for as long as the case runs.
    stop = threading.Event()

    def crowd_of(address: str) -> None:
        while not stop.is_set():
            socks = []
            for _ in range(2):
                with contextlib.suppress(OSError):  # turned away, or cut: made again
                    socks.append(connect(peers, address, timeout=1.0))
            stop.wait(HANDSHAKE)
            for one in socks:
                one.close()

    threads = [threading.Thread(target=crowd_of, args=(a,), daemon=True) for a in crowd]
    for t in threads:
        t.start()
    try:
        _until(lambda: responder.open_connections >= MAX_UNLISTED,
               "the unlisted crowd holding its half of the slots")
        assert all(answered(KNOWN) for _ in range(10))  # never BUSY
        assert responder.open_connections <= MAX_UNLISTED + MAX_PER_PEER
        assert responder.counts.refused["BUSY"] > 0
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_a_port_it_cannot_listen_on_is_told_not_only_logged(
        wire: tuple[Netns, Netns]) -> None:
    """Another process holds the rail's address and port: before, only the log said so;
    now the responder tells it (the prober hands it on with its round, and the status
    file's errors carry it: tests/unit/test_peer_probe.py)."""
    node, _ = wire
    with entered(node):
        squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        r = Responder(PORT, hold=3.0)
        r.start()
    squatter.bind((RAIL, PORT))
    squatter.listen(1)
    try:
        r.serve(SERVED)
        _until(lambda: r.not_listening().get("rail0"), "the failure told")
        assert r.not_listening() == {
            "rail0": f"cannot listen on {RAIL}:{PORT}: Address already in use"}
        squatter.close()
        r.serve(SERVED)  # the loop hands the rails over after every pass: tried again
        _until(lambda: "rail0" in r.listening, "listening once the port is free")
        assert r.not_listening() == {}
    finally:
        squatter.close()
        r.stop()
        r.join(timeout=5)
