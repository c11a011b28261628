"""A total deadline for one HTTP request, headers and body alike.

urllib3's read timeout bounds each recv, not a reply: a server sending a byte every two
seconds would hold a request forever. Every connection a tracked pool hands out says which
request it serves (the public HTTPConnection.request), so a timer can shut its socket down
when the request's deadline passes. Used by the Kubernetes client and the registry client,
which read bodies the same way too (read_body: bounded, and never a half-read connection
back in the pool).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
import urllib3.connection


class DeadlineExceeded(TimeoutError):
    pass


class BodyTooLarge(ValueError):
    """A reply over its reader's limit, announced or sent; its connection was closed."""


READ_CHUNK = 64 << 10


def read_body(resp: Any, limit: int, what: str,
              before_read: Callable[[], object] | None = None) -> bytes:
    """A reply's body (a urllib3 response not preloaded), refused past `limit` bytes
    (announced by Content-Length, or sent): the connection is then closed, never returned
    to the pool half-read. Reads what has arrived (read1), so a trickle cannot stall a
    chunk; `before_read` runs before each read (a caller's deadline check)."""
    length = str(resp.headers.get("Content-Length") or "")
    if length.isdigit() and int(length) > limit:
        resp.close()
        raise BodyTooLarge(f"{what}: reply of {int(length)} bytes, over the {limit} allowed")
    parts: list[bytes] = []
    size = 0
    while True:
        if before_read is not None:
            before_read()
        chunk = resp.read1(READ_CHUNK)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > limit:
            resp.close()
            raise BodyTooLarge(f"{what}: reply over the {limit} bytes allowed")
        parts.append(chunk)


_serving = threading.local()


class _Holder:
    __slots__ = ("conn",)

    def __init__(self) -> None:
        self.conn: Any = None


class _Tracked:
    def request(self, *args: Any, **kwargs: Any) -> None:
        holder = getattr(_serving, "holder", None)
        if holder is not None:
            holder.conn = self
        super().request(*args, **kwargs)  # type: ignore[misc]


class _TrackedHTTP(_Tracked, urllib3.connection.HTTPConnection):
    pass


class _TrackedHTTPS(_Tracked, urllib3.connection.HTTPSConnection):
    pass


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _TrackedHTTP


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _TrackedHTTPS


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Bounds every request made by this thread inside the block to `seconds` in all:
    past it the connection's socket is shut down and DeadlineExceeded raised."""
    holder = _Holder()
    fired = threading.Event()

    def expire() -> None:
        fired.set()
        sock = getattr(holder.conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    _serving.holder = holder
    timer.start()
    try:
        yield
    except Exception as exc:
        if fired.is_set():
            raise DeadlineExceeded(f"no complete reply within {seconds:g}s") from exc
        raise
    finally:
        timer.cancel()
        _serving.holder = None
    if fired.is_set():  # the reply completed just as the timer fired: still too late
        raise DeadlineExceeded(f"no complete reply within {seconds:g}s")



# For a PoolManager's pool_classes_by_scheme: its connections can be held to a deadline.
TRACKED_POOLS: dict[str, type[urllib3.HTTPConnectionPool]] = {
    "http": _HTTPPool, "https": _HTTPSPool}
