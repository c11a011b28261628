"""The gang barrier under hostile input (issue: the new surfaces under hostile input). Each
case here ran away or failed a fit gang before: a trickling peer kept a 3 s barrier past
60 s, 30 silent peers took 64 s against 2 s, a few idle connections a second failed a fit
2-pod gang, any client could claim any rank, `--size 99999999999999` grew to 1.7 GB, and
ports out of range raised OverflowError. Pods and peers are sockets on loopback addresses.
A case that would hang runs on a thread joined with a bound: a hang fails, it never stalls
the suite."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from nodeagent.cli.gang import (
    MAX_GANG,
    CardServer,
    GangCard,
    barrier,
    fetch_card,
    run_gang,
)
from tests.kit.helpers import free_port


def bounded(work: Callable[[], Any], within: float) -> Any:
    """work() on a thread; its result, or a failure when it has not ended `within` s (a
    hang guard, not a figure)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    thread.start()
    thread.join(within)
    assert not thread.is_alive(), f"still running after {within} s"
    return out[0]


@contextmanager
def trickling(host: str, port: int, every: float) -> Iterator[None]:
    """A peer that answers the rank line with a card one byte at a time, for ever."""
    stop = threading.Event()
    server = socket.create_server((host, port))
    server.settimeout(0.1)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed: the case is over
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    def drip(conn: socket.socket) -> None:
        with conn:
            while not stop.wait(every):
                try:
                    conn.sendall(b" ")
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield
    finally:
        stop.set()
        server.close()


def test_a_trickling_peer_cannot_hold_the_barrier_past_its_deadline() -> None:
    port = free_port()
    with trickling("127.0.0.3", port, every=0.3):  # 2 s per recv never runs out
        started = time.monotonic()
        _, problems = bounded(lambda: barrier(["127.0.0.1", "127.0.0.3"], 0, port,
                                              time.monotonic() + 1.5), within=15)
        took = time.monotonic() - started
    assert "127.0.0.3 (timed out)" in problems[0].message, problems
    print(f"barrier of 1.5 s with a trickling peer: {took:.1f} s")


def test_silent_peers_cost_the_deadline_not_two_seconds_each() -> None:
    """30 peers that accept (the kernel's backlog) and never answer."""
    port = free_port()
    silent = [socket.create_server((f"127.0.1.{i}", port)) for i in range(1, 31)]
    try:
        peers = ["127.0.0.1"] + [f"127.0.1.{i}" for i in range(1, 31)]
        started = time.monotonic()
        _, problems = bounded(lambda: barrier(peers, 0, port, time.monotonic() + 2.0),
                              within=15)
        took = time.monotonic() - started
    finally:
        for s in silent:
            s.close()
    assert problems[0].message.startswith("barrier: 30 of 30 other pods not ready"), problems
    print(f"barrier of 2 s with 30 silent peers: {took:.1f} s")


def test_idle_connections_do_not_fail_a_fit_gang() -> None:
    """An attacker holds 40 idle connections to pod 1's card server (one second each
    before: the real pod's fetches queued behind them) before pod 0 arrives: each idle one
    holds only its own slot, those over the per-address limit are turned away, and the
    gang passes."""
    port, probe_port = free_port(), free_port()
    peers = ["127.0.0.1", "127.0.0.2"]
    results: dict[int, list[str]] = {}

    def pod(i: int) -> None:
        _, problems = run_gang(GangCard(i, f"gpu-{i}", ()), peers, port, probe_port,
                               time.monotonic() + 8, 1.0, bind=peers[i])
        results[i] = [u.line() for u in problems]

    pods = [threading.Thread(target=pod, args=(i,), daemon=True) for i in range(2)]
    pods[1].start()
    held: list[socket.socket] = []
    deadline = time.monotonic() + 10
    while len(held) < 40 and time.monotonic() < deadline:
        try:
            held.append(socket.create_connection(("127.0.0.2", port), timeout=0.5,
                                                 source_address=("127.0.0.7", 0)))
        except OSError:
            time.sleep(0.01)  # not serving yet
    try:
        assert len(held) == 40, "the attack did not run"
        pods[0].start()
        for t in pods:
            t.join(30)
    finally:
        for s in held:
            s.close()
    assert results == {0: [], 1: []}


def test_a_rank_claimed_from_another_address_does_not_count() -> None:
    """A stranger saying "0" gets the card (it is no secret) but is not pod 0: only a claim
    from an address pod 0's name resolves to lets this pod leave the barrier."""
    port = free_port()
    server = CardServer(GangCard(1, "gpu-1", ()), port, "127.0.0.2")
    server.start()
    try:
        for source in ("127.0.0.9", "127.0.0.1"):
            with socket.create_connection(("127.0.0.2", port),
                                          source_address=(source, 0)) as s:
                s.sendall(b"0\n")
                assert s.recv(4096).startswith(b'{"index": 1')
            if source == "127.0.0.9":
                deadline = time.monotonic() + 5
                while (0, "127.0.0.9") not in server.claims and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert server.verified({0: frozenset({"127.0.0.1"})}) == set()
        deadline = time.monotonic() + 5
        while (0, "127.0.0.1") not in server.claims and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.verified({0: frozenset({"127.0.0.1"})}) == {0}
    finally:
        server.stop()


def test_done_said_by_a_stranger_or_in_other_words_does_not_count() -> None:
    """"0 done" from an address pod 0's name does not resolve to, or a rank line with any
    other word after the rank, is no pod 0 done with this one: it would leave while pod
    0's second probe is on its way. Only the rank's own address saying done counts."""
    port = free_port()
    server = CardServer(GangCard(1, "gpu-1", ()), port, "127.0.0.2")
    server.start()
    pod0 = {0: frozenset({"127.0.0.1"})}
    try:
        for source, line in (("127.0.0.9", b"0 done\n"), ("127.0.0.1", b"0 done later\n"),
                             ("127.0.0.1", b"0 DONE\n"), ("127.0.0.1", b"0\n")):
            with socket.create_connection(("127.0.0.2", port),
                                          source_address=(source, 0)) as s:
                s.sendall(line)
                assert s.recv(4096).startswith(b'{"index": 1')
        deadline = time.monotonic() + 5
        while (0, "127.0.0.1") not in server.claims and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.verified(pod0) == {0} and server.verified(pod0, done=True) == set()
        assert (0, "127.0.0.9") in server.done_claims  # heard, not trusted
        fetch_card("127.0.0.2", port, 0, source="127.0.0.1", done=True)
        assert server.verified(pod0, done=True) == {0}
    finally:
        server.stop()


def preflight(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nodeagent", "preflight", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("args", "words"), [
    (["--peers", "p-{index}", "--size", "99999999999999"],
     f"preflight: --size 99999999999999 is not a gang size (1 to {MAX_GANG})"),
    (["--peers", ",".join(f"p{i}" for i in range(10_000)), "--index", "0"],
     f"preflight: --peers names more than {MAX_GANG} pods"),
    (["--peers", "a,b", "--index", "0", "--gang-port", "70000"],
     "argument --gang-port: invalid port value: '70000'"),
    (["--peers", "a,b", "--index", "0", "--probe-port", "-1"],
     "argument --probe-port: invalid port value: '-1'"),
    (["--peers", "a,b", "--index", "0", "--gang-bind", "10.0.0.300"],
     "argument --gang-bind: invalid IPv4 address value: '10.0.0.300'"),
])
def test_gang_arguments_out_of_range_are_one_line(args: list[str], words: str) -> None:
    res = preflight(*args)
    assert res.returncode == 2, res
    assert res.stderr.strip().splitlines()[-1].endswith(words), res.stderr
    assert "Traceback" not in res.stderr
