"""A selector that another thread can wake or halt: the self-pipe trick, in one object.

The thread that selects owns it and loops until `halted`; any thread may `poke()` or
`halt()`. A poke while the pipe is full is dropped (a wake is pending anyway).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from typing import Any


class WakeableSelector:
    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._halt = threading.Event()

    @property
    def halted(self) -> bool:
        return self._halt.is_set()

    def halt(self) -> None:
        self._halt.set()
        self.poke()

    def register(self, sock: socket.socket, data: Any) -> None:
        self._sel.register(sock, selectors.EVENT_READ, data)

    def unregister(self, sock: socket.socket) -> None:
        self._sel.unregister(sock)

    def poke(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def ready(self, timeout: float) -> list[Any]:
        """The data of each registered socket readable within `timeout` (a poke ends the
        wait early and is consumed here)."""
        out = []
        for key, _mask in self._sel.select(max(0.0, timeout)):
            if key.fileobj is self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    while self._wake_r.recv(4096):
                        pass
            else:
                out.append(key.data)
        return out

    def close(self) -> None:
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()
