"""Other programs' replies: a trickling server, malformed API objects, escape sequences.

The servers here are plain sockets on loopback playing a broken or hostile API server (the
real apiserver's behaviour is tested in tests/kube); what is tested is that nodeagent's own
reading of a reply is bounded in time and shape.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.cli.fleet import fleet_rows, render_table
from tests.kit.helpers import wait_for


def kubeconfig(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


@contextlib.contextmanager
def trickling_server(head: bool) -> Iterator[int]:
    """Answers every connection one byte every 0.5 s, forever: in the headers (head=True)
    or in the body after complete headers."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()
    reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" if head else
             b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000"
             b"\r\n\r\n")

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            if not head:
                conn.sendall(reply)
            i = 0
            while not stop.is_set():
                conn.sendall(reply[i % len(reply):][:1] if head else b" ")
                i += 1
                time.sleep(0.5)

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = srv.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        srv.close()


@pytest.mark.parametrize("head", [True, False], ids=["headers", "body"])
def test_a_trickling_server_cannot_hold_a_request(tmp_path: Path, head: bool) -> None:
    from nodeagent.config import Kubernetes
    from nodeagent.kube.api import ApiUnreachable, Counters, api_client, call

    with trickling_server(head) as port:
        api = api_client(Kubernetes(kubeconfig=kubeconfig(tmp_path, port)), 1.5)
        started = time.monotonic()
        with pytest.raises(ApiUnreachable,
                           match=rf"^no complete reply within 1.5s \(127.0.0.1:{port}\)$"):
            call(api, Counters(), "GET", "/api/v1/nodes/n")  # what the publisher does
        assert time.monotonic() - started < 10  # a hang guard, not a performance figure


def test_fleet_gives_up_on_a_trickling_server_in_one_line(tmp_path: Path) -> None:
    with trickling_server(head=False) as port:
        proc = subprocess.run(
            [sys.executable, "-m", "nodeagent", "fleet", "--kubeconfig",
             str(kubeconfig(tmp_path, port)), "--request-timeout", "1s"],
            capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"fleet: cannot list nodes and leases: no complete reply within 1s (127.0.0.1:{port})"
    ], proc.stderr


class _Canned(BaseHTTPRequestHandler):
    bodies: ClassVar[dict[str, bytes]] = {}

    def do_GET(self) -> None:
        body = next((b for k, b in self.bodies.items() if self.path.startswith(k)), b"{}")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("nodes, expect_code", [
    (b'{"items": "abc"}', 1),
    (b'{"items": [{"metadata": null, "status": {"conditions": "x"}}]}', 0),
    (b'{"items": [{"metadata": {"name": 5}, "spec": {"taints": [null, 3]}}]}', 0),
    (b"[" * 100_000 + b"]" * 100_000, 1),
    (b"\xff\xfe not json", 1),
    (b"[1, 2]", 1),
], ids=["items-string", "metadata-null", "wrong-types", "deep", "binary", "not-object"])
def test_fleet_on_malformed_objects(tmp_path: Path, nodes: bytes, expect_code: int) -> None:
    handler = type("H", (_Canned,), {"bodies": {
        "/api/v1/nodes": nodes,
        "/apis/coordination.k8s.io": b'{"items": [{"metadata": {"name": "nodeagent-x"},'
                                     b' "spec": {"renewTime": 12}}]}'}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "nodeagent", "fleet", "--kubeconfig",
             str(kubeconfig(tmp_path, server.server_address[1]))],
            capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert proc.returncode == expect_code, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) <= 1, proc.stderr


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()
    | st.text(max_size=12) | st.just("\x1b[2J\x1b]0;owned\x07"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["metadata", "name", "status", "conditions", "type", "reason",
                         "spec", "taints", "key", "value", "capacity", "allocatable",
                         "renewTime", "lastTransitionTime", "FabricReady", "x"]),
        inner, max_size=5),
    max_leaves=25)


@given(st.lists(_json, max_size=4), st.lists(_json, max_size=3))
def test_generated_api_objects_render_without_escapes(nodes: list[Any],
                                                      leases: list[Any]) -> None:
    rows = fleet_rows(nodes, leases, "rdma/x", "nodeagent.io/fabric-unready", time.time(),
                      120.0, 1800.0)
    for wide in (False, True):
        text = render_table(rows, time.time(), wide=wide)
        assert "\x1b" not in text and "\x07" not in text


def test_escape_sequences_in_a_node_name_are_shown_not_sent() -> None:
    node = {"metadata": {"name": "evil\x1b[2Jnode"}, "status": {"conditions": [
        {"type": "FabricReady", "status": "False", "reason": "X\x1b]0;t\x07"}]}}
    text = render_table(fleet_rows([node], [], "r", "k", 0.0, 1.0, 1.0), 0.0)
    assert "evil\\x1b[2Jnode" in text and "X\\x1b]0;t\\x07" in text


class _Gone(BaseHTTPRequestHandler):
    """Lists fine, then ends every watch at once with an ERROR event, code 410 (what an API
    server says of a resourceVersion too old to resume from)."""

    requests: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.requests.append(self.path)
        if "watch=" in self.path:
            body = json.dumps({"type": "ERROR", "object": {
                "kind": "Status", "code": 410, "message": "too old resource version"}}) + "\n"
        else:
            body = json.dumps({"metadata": {"resourceVersion": "7"}, "items": []})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


def test_a_watch_that_always_ends_in_410_is_not_relisted_in_a_tight_loop(
        tmp_path: Path) -> None:
    """Before: the backoff was reset as soon as a watch connected, so list + watch ran back
    to back (26.9 requests/s against a healthy 0.2). Now a 410 waits the growing backoff."""
    from nodeagent.config import Kubernetes
    from nodeagent.kube.api import Counters, api_client
    from nodeagent.kube.watch import WatchedCollection

    _Gone.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gone)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = api_client(Kubernetes(kubeconfig=kubeconfig(tmp_path, server.server_address[1])))
    watcher = WatchedCollection(api, Counters(), "/api/v1/nodes", [], lambda: None)
    watcher.start()
    try:
        time.sleep(4)
    finally:
        watcher.stop()
        server.shutdown()
    watches = [r for r in _Gone.requests if "watch=" in r]
    assert watches, _Gone.requests  # it did watch, and was told 410 each time
    # The backoff doubles from 0.5 s (random below the bound): a handful in 4 s, not 100.
    assert len(_Gone.requests) <= 20, len(_Gone.requests)


class _Flood(BaseHTTPRequestHandler):
    """Lists fine; a watch is one line that never ends (200 MB, no newline), a GET of
    `/big` announces 100 MB, and a GET of `/chunked` sends 200 MB with no length."""

    sent: ClassVar[dict[str, int]] = {}
    protocol_version = "HTTP/1.1"

    def _stream(self, total: int, chunked: bool) -> None:
        block = b"x" * (1 << 20)
        sent = 0
        try:
            while sent < total:
                if chunked:
                    self.wfile.write(f"{len(block):x}\r\n".encode() + block + b"\r\n")
                else:
                    self.wfile.write(block)
                sent += len(block)
        except OSError:
            pass  # the client hung up: what was sent by then is the figure
        self.sent[self.path.split("?")[0]] = sent
        self.close_connection = True

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if "watch=" in self.path:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._stream(200 << 20, chunked=True)
        elif self.path.startswith("/big"):
            self.send_header("Content-Length", str(100 << 20))
            self.end_headers()
            self._stream(100 << 20, chunked=False)
        elif self.path.startswith("/chunked"):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._stream(200 << 20, chunked=True)
        else:
            body = json.dumps({"metadata": {"resourceVersion": "7"}, "items": []}).encode()
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_replies_and_watch_lines_past_the_cap_are_refused_not_buffered(
        tmp_path: Path) -> None:
    """Before: a 200 MB watch line was buffered whole (161 MB resident, 30 s of CPU: the
    buffer re-split at every chunk), and a reply of any size was read. Now each is refused
    past the client's cap (1 MiB here, 64 MiB by default), in one line."""
    from nodeagent.config import Kubernetes
    from nodeagent.kube.api import Counters, ReplyTooLarge, api_client, call
    from nodeagent.kube.watch import WatchedCollection

    _Flood.sent = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flood)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # The cap as configured: kubernetes.max_reply (1 MiB, its smallest).
    api = api_client(Kubernetes(kubeconfig=kubeconfig(tmp_path, server.server_address[1]),
                                max_reply=1 << 20))
    assert api.max_reply == 1 << 20
    try:
        with pytest.raises(ReplyTooLarge, match=r"GET /big: reply of 104857600 bytes, over"):
            call(api, Counters(), "GET", "/big")
        with pytest.raises(ReplyTooLarge, match=r"GET /chunked: reply over the 1048576 bytes"):
            call(api, Counters(), "GET", "/chunked")
        errors: list[str] = []
        watcher = WatchedCollection(api, Counters(), "/api/v1/nodes", [],
                                    lambda: errors.append(watcher.error or ""))
        watcher.start()
        try:
            wait_for(lambda: any("watch event over the 1048576 bytes" in e for e in errors),
                     what="the watch refused")
        finally:
            watcher.stop()
        wait_for(lambda: "/api/v1/nodes" in _Flood.sent and "/chunked" in _Flood.sent,
                 what="the server told the client hung up")
    finally:
        server.shutdown()
    # What the server got out before the client hung up: the cap and the socket buffers,
    # not the 200 MB it had to send.
    assert _Flood.sent["/api/v1/nodes"] < 64 << 20, _Flood.sent
    assert _Flood.sent["/chunked"] < 64 << 20, _Flood.sent


def test_fleet_without_any_kubeconfig_says_what_it_looked_for(tmp_path: Path) -> None:
    """Before: `fleet: Service host/port is not set.` (the in-cluster loader's words)."""
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    proc = subprocess.run([sys.executable, "-m", "nodeagent", "fleet"], capture_output=True,
                          text=True, timeout=60, env={**env, "HOME": str(tmp_path)})
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "fleet: no kubeconfig: none given (--kubeconfig), none in $KUBECONFIG, no "
        "~/.kube/config, and not in a pod (KUBERNETES_SERVICE_HOST is not set)"], proc.stderr


class _Raw:
    """A watch response's body as urllib3 hands it over (`stream(n)` yields chunks), cut
    where the test says: a parser test, the real server's flood is the test above."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.closed = False

    def stream(self, n: int) -> Iterator[bytes]:
        yield from self.chunks

    def close(self) -> None:
        self.closed = True


@given(st.lists(st.dictionaries(st.text(max_size=6), st.integers() | st.text(max_size=30),
                                max_size=4), max_size=8),
       st.lists(st.integers(1, 64), max_size=30), st.integers(2, 300))
def test_a_watch_yields_the_same_events_however_its_bytes_are_cut(
        events: list[dict[str, Any]], cuts: list[int], limit: int) -> None:
    """Reply sizes as a property: every event up to the first line over the cap, in order,
    whatever the chunking; then ReplyTooLarge, never a partial or merged event; and the
    response is closed either way."""
    from nodeagent.kube.api import ReplyTooLarge, WatchStream

    lines = [json.dumps(e).encode() for e in events]
    data = b"".join(line + b"\n" for line in lines)
    chunks, at = [], 0
    for n in cuts:
        if at >= len(data):
            break
        chunks.append(data[at:at + n])
        at += n
    chunks.append(data[at:])
    fits = next((i for i, line in enumerate(lines) if len(line) > limit), len(lines))
    raw = _Raw([c for c in chunks if c])
    got: list[dict[str, Any]] = []
    if fits < len(lines):
        with pytest.raises(ReplyTooLarge):
            got.extend(WatchStream(raw, limit))
    else:
        got.extend(WatchStream(raw, limit))
    assert got == events[:fits]
    assert raw.closed
