"""The metrics endpoint under slow and crowding clients, on loopback: a client that sends
its request a byte every few seconds resets a read timeout, never the whole-connection
deadline, and one address cannot hold every slot (before: 16 such connections held the
endpoint, and every scrape failed)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from nodeagent.publish import metrics
from nodeagent.publish.metrics import MAX_CONNECTIONS, AgentMetrics, serve
from tests.kit.helpers import free_port, wait_for


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int, object]]:
    monkeypatch.setattr(metrics, "REQUEST_DEADLINE", 1.5, raising=False)  # not 10 s
    port = free_port()
    server = serve(AgentMetrics(), f"127.0.0.1:{port}")
    try:
        yield "127.0.0.1", port, server
    finally:
        server.shutdown()
        server.server_close()


def trickle(host: str, port: int, stop: threading.Event, source: str) -> None:
    """A request line a byte every 0.4 s, re-made whenever the server ends it."""
    while not stop.is_set():
        try:
            with socket.create_connection((host, port), timeout=5,
                                          source_address=(source, 0)) as s:
                for byte in b"GET /metrics HTTP/1.1\r\n" * 100:
                    if stop.wait(0.4):
                        return
                    s.sendall(bytes([byte]))
        except OSError:
            stop.wait(0.05)


def test_tricklers_from_one_address_leave_room_for_a_scrape(
        endpoint: tuple[str, int, object]) -> None:
    host, port, server = endpoint
    stop = threading.Event()
    threads = [threading.Thread(target=trickle, args=(host, port, stop, "127.0.0.1"),
                                daemon=True) for _ in range(MAX_CONNECTIONS)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: server.refused > 0, 10, "tricklers over the per-address limit")
        # A scraper from another address is answered while the tricklers keep at it.
        for _ in range(3):
            with socket.create_connection((host, port), timeout=5,
                                          source_address=("127.0.0.2", 0)) as s:
                s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                reply = b""
                while chunk := s.recv(65536):
                    reply += chunk
            assert reply.startswith(b"HTTP/1.0 200"), reply[:200]
        # And a trickler's connection ends at the deadline, whatever it sends.
        wait_for(lambda: server.cut > 0, 10, "a trickler cut at the whole-request deadline")
    finally:
        stop.set()
        for t in threads:
            t.join(5)


def test_a_slow_but_whole_scrape_is_answered(endpoint: tuple[str, int, object]) -> None:
    host, port, _ = endpoint
    with socket.create_connection((host, port), timeout=5) as s:
        for part in (b"GET /metrics ", b"HTTP/1.0\r\n", b"\r\n"):
            s.sendall(part)
            time.sleep(0.2)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.0 200") and b"nodeagent_" in reply
